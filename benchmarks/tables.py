"""Markdown tables from the result files, so the numbers in docs/benchmarks.md are copied by a program.

    python benchmarks/tables.py > /tmp/tables.md
    python benchmarks/tables.py --results benchmarks/results/zen3     # another machine's run
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ORDER = ("reference", "unfused", "fused", "ort_disable", "ort_all", "torch_eager", "torch_compile")


def mib(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 1024:.0f} KiB" if n < (1 << 20) else f"{n / (1 << 20):.1f} MiB"


def bench_table(data: dict[str, Any]) -> str:
    runners = data["runners"]
    fused = runners.get("fused", {})
    lines = ["| runner | median ms | runner / fused (median) | min ms | runner / fused (min) | round medians ms "
             "| peak memory | measured by | kernels | max abs error | setup s |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: |"]
    for name in ORDER:
        r = runners.get(name)
        if r is None:
            continue
        ratio = f"{r['median_ms'] / fused['median_ms']:.2f}x" if fused else ""
        best = f"{r['min_ms'] / fused['min_ms']:.2f}x" if fused else ""
        rounds = " / ".join(f"{m:.1f}" for m in r.get("round_medians_ms", []))
        lines.append(f"| {name} | {r['median_ms']:.2f} | {ratio} | {r['min_ms']:.2f} | {best} | {rounds} | "
                     f"{mib(r['peak_bytes'])} | "
                     f"{r['peak_method'].split(':')[0]} | {'n/a' if r['kernels'] is None else r['kernels']} | "
                     f"{r['max_abs_error']:.1e} | {r['setup_s']:.1f} |")
    for name, why in data["skipped"].items():
        lines.append(f"| {name} | skipped: {why} | | | | | | | | | |")
    for name, why in data["failed"].items():
        lines.append(f"| {name} | FAILED: {why} | | | | | | | | | |")
    return "\n".join(lines)


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def outside_row(case: str, data: dict[str, Any]) -> str:
    r = data["runners"]
    u, f = r["unfused"], r["fused"]
    ratios = data["ratios"]
    how = str(f.get("outside_opaque_method", "")).split(":")[0]
    estimate = f.get("outside_opaque_estimate_ms")
    return (f"| {case} | {u['outside_opaque_ms']:.2f} | {f['outside_opaque_ms']:.2f} | "
            f"{_x(ratios.get('outside_opaque_unfused_over_fused'))} | {u['outside_opaque_best_ms']:.2f} | "
            f"{f['outside_opaque_best_ms']:.2f} | {_x(ratios.get('outside_opaque_best_unfused_over_fused'))} | "
            f"{how} | {'n/a' if estimate is None else f'{estimate:.2f}'} | "
            f"{u['opaque_core_best_ms']:.2f} | {f['opaque_core_best_ms']:.2f} |")


def memory_row(case: str, data: dict[str, Any]) -> str:
    u, f = data["runners"]["unfused"], data["runners"]["fused"]

    def ratio(a: int | None, b: int | None) -> str:
        return "n/a" if not a or b is None else f"{b / a:.2f}"

    return (f"| {case} | {mib(u['peak_bytes'])} | {mib(f['peak_bytes'])} | {ratio(u['peak_bytes'], f['peak_bytes'])} | "
            f"{mib(u.get('footprint_bytes'))} | {mib(f.get('footprint_bytes'))} | "
            f"{ratio(u.get('footprint_bytes'), f.get('footprint_bytes'))} |")


def cores_table(data: dict[str, Any]) -> str:
    """One bench-cores result: every distinct core, ours / onnxruntime / OpenBLAS medians and ratios."""
    lines = ["| core | in model | variant | ours ms | onnxruntime ms | OpenBLAS ms | ours / ort | ours / OpenBLAS "
             "| ours GFLOP/s |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in data["cores"]:
        t = c["median_ms"]
        lines.append(f"| {c['core']} | {c['count_in_model']} | {c['variant']} | {t.get('autofusion', 0):.3f} | "
                     f"{t.get('onnxruntime', 0):.3f} | {t.get('openblas', 0):.3f} | {_x(c['ratio_vs_onnxruntime'])} | "
                     f"{_x(c['ratio_vs_openblas'])} | {c['gflops'].get('autofusion', 0):.0f} |")
    floor = data["floor"]
    if "floor_ms" in floor:
        lines.append(f"\nGEMM floor {floor['floor_ms']:.2f} ms ({floor['gflop']:.2f} GFLOP at the run's best "
                     f"{floor['best_gflops']:.0f} GFLOP/s, {floor['best_by']}); our cores alone x their count "
                     f"{floor['cores_alone_ms']:.2f} ms.")
    return "\n".join(lines)


def in_model_table(data: dict[str, Any]) -> str:
    """One bench-cores --in-model result: each distinct core's time per instance inside the model."""
    lines = ["| core | in model | variant | ours ms | onnxruntime ms | ours / ort | ours GFLOP/s | ort GFLOP/s |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in data["cores"]:
        t, g = c["ms_per_instance"], c["gflops"]
        count = c["instances"] if c["instances"] == c["onnxruntime_nodes"] else f"{c['instances']} / {c['onnxruntime_nodes']}"
        lines.append(f"| {c['core']} | {count} | {', '.join(c['variants'])} | {t['autofusion'] or 0:.3f} | "
                     f"{t['onnxruntime'] or 0:.3f} | {_x(c['ratio_vs_onnxruntime'])} | {g.get('autofusion', 0):.0f} | "
                     f"{g.get('onnxruntime', 0):.0f} |")
    tot, rest = data["totals_ms"], data["outside_cores_ms"]
    lines.append(f"\nAll kernels: ours {tot['autofusion']:.2f} ms, onnxruntime's nodes {tot['onnxruntime']:.2f} ms; "
                 f"outside the cores: ours {rest['autofusion']:.2f} ms, onnxruntime {rest['onnxruntime']:.2f} ms.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of result files (default: %(default)s)")
    results = p.parse_args(argv).results
    for path in sorted(results.glob("cores_*.json")):
        data = json.loads(path.read_text())
        env = data.get("environment") or {}
        print(f"### {path.stem}\n")
        print(f"{data['machine']['cpu']}, kernels built for {data['isa']}"
              + (f", {', '.join(f'{k}={v}' for k, v in env.items())}" if env else "")
              + f"; {data['rounds']} rounds x {data['repeat']} runs, {data['threads']} threads; load average "
              f"{data['load_average_before']} / {data['load_average_after']}\n")
        print(cores_table(data) + "\n")
    for path in sorted(results.glob("in_model_*.json")):
        data = json.loads(path.read_text())
        print(f"### {path.stem}\n")
        print(f"{data['machine']['cpu']}; {data['rounds']} rounds x {data['repeat']} runs of the whole model in each "
              f"runtime, {data['threads']} threads; load average {data['load_average_before']} / "
              f"{data['load_average_after']}\n")
        print(in_model_table(data) + "\n")
    files = sorted(results.glob("bench_*.json"))
    memory = ["| case | unfused activations | fused activations | fused / unfused | unfused with per-thread blocks "
              "| fused with per-thread blocks | fused / unfused |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    outside = ["| case | unfused outside ms (medians) | fused outside ms (medians) | unfused / fused "
               "| unfused outside ms (minima) | fused outside ms (minima) | unfused / fused | fused: how "
               "| fused whole-run estimate ms (median) "
               "| opaque cores ms, unfused graph (minima) | opaque cores ms, plan graph (minima) |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for path in files:
        data = json.loads(path.read_text())
        case = path.stem.removeprefix("bench_")
        print(f"### {case}\n")
        print(f"`{data.get('command', '')}`; inputs {data['inputs']}; load average before/after "
              f"{data['load_average_before']} / {data['load_average_after']}; exit status {data.get('exit_status')}\n")
        print(bench_table(data) + "\n")
        if "unfused" in data["runners"] and "fused" in data["runners"]:
            outside.append(outside_row(case, data))
            memory.append(memory_row(case, data))
    print("### time outside opaque cores\n")
    print("\n".join(outside) + "\n")
    print("### peak memory\n")
    print("\n".join(memory) + "\n")
    opt = results / "optimize.json"
    if opt.exists():
        optimize_tables(json.loads(opt.read_text()))
    return 0


def optimize_tables(d: dict[str, Any]) -> None:
    if "speed" in d:
        print("### optimize() speed\n")
        print("| case | nodes | wall s (first run) | wall s (median) | CPU s | rules s | saturate s | extract s "
              "| saturation stop | kernels before -> after | peak RSS | target | met |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | --- |")
        for case, r in d["speed"].items():
            if "error" in r:
                print(f"| {case} | error: {r['error']} | | | | | | | | | | | |")
                continue
            run = min(r["runs"], key=lambda x: abs(x["total_s"] - r["median_total_s"]))
            cpu = f"{r['median_cpu_s']:.2f}" if "median_cpu_s" in r else "n/a"
            target = f"<= {r['target_s']:g} s" + (f", <= {r['target_rss_bytes'] / (1 << 30):g} GiB"
                                                  if "target_rss_bytes" in r else "")
            met = "yes" if r["met_time"] and r.get("met_rss", True) else "no"
            first = f"{r['first_total_s']:.2f}" if "first_total_s" in r else "n/a"
            print(f"| {case} | {r['nodes']} | {first} | {r['median_total_s']:.2f} | {cpu} | {run['rules_s']:.2f} | "
                  f"{run['saturate_s']:.2f} | {run['extract_s']:.2f} | {run['saturation_stop']} | "
                  f"{r['kernels_before']} -> {r['kernels_after']} | {r['peak_rss_bytes'] / (1 << 30):.2f} GiB | "
                  f"{target} | {met} |")
        print()
    if "quality" in d:
        q = d["quality"]
        print("### strategy quality (gap to exact, %)\n")
        print("| graph | nodes | regions (distinct) | without exact | largest region | greedy max / mean "
              "| dp max / mean | beam max / mean |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, g in q["graphs"].items():
            gaps = " | ".join(f"{g['gaps'][s]['max_percent']:.2f} / {g['gaps'][s]['mean_percent']:.3f}"
                              for s in ("greedy", "dp", "beam"))
            print(f"| {name} | {g['nodes']} | {g['regions']} ({g['distinct_regions']}) | {g['regions_without_exact']} "
                  f"| {g['largest_region']} | {gaps} |")
        gaps = " | ".join(f"{q['all'][s]['max_percent']:.2f} / {q['all'][s]['mean_percent']:.3f}"
                          for s in ("greedy", "dp", "beam"))
        print(f"| all | | {q['all']['greedy']['regions']} with an exact cost | | | {gaps} |\n")
    if "kernels" in d:
        k = d["kernels"]
        print("### kernels and intermediates on the BERT-base export\n")
        print(f"source: {k.get('source')}\n")
        if "error" in k:
            print(f"error: {k['error']}\n")
            return
        print("| | value |\n| --- | ---: |")
        for key in ("onnx_nodes", "ours_kernels_unfused", "ours_kernels", "ort_all_nodes", "ort_all_kernels",
                    "intermediate_bytes_before", "intermediate_bytes_after"):
            print(f"| {key} | {k[key]:,} |")
        print(f"| intermediate_reduction | {k['intermediate_reduction'] * 100:.1f}% |\n")
        print(f"onnxruntime ORT_ENABLE_ALL ops: {k['ort_all_ops']}\n")


if __name__ == "__main__":
    sys.exit(main())
