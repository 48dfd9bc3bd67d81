"""Markdown tables from the result files, so the numbers in docs/benchmarks.md are copied by a program.

    python benchmarks/tables.py > /tmp/tables.md
"""

from __future__ import annotations

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
    fused = runners.get("fused", {}).get("median_ms")
    lines = ["| runner | median ms | runner / fused | peak memory | measured by | kernels | max abs error | setup s |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for name in ORDER:
        r = runners.get(name)
        if r is None:
            continue
        ratio = f"{r['median_ms'] / fused:.2f}x" if fused else ""
        lines.append(f"| {name} | {r['median_ms']:.2f} | {ratio} | {mib(r['peak_bytes'])} | "
                     f"{r['peak_method'].split(':')[0]} | {'n/a' if r['kernels'] is None else r['kernels']} | "
                     f"{r['max_abs_error']:.1e} | {r['setup_s']:.1f} |")
    for name, why in data["skipped"].items():
        lines.append(f"| {name} | skipped: {why} | | | | | | |")
    for name, why in data["failed"].items():
        lines.append(f"| {name} | FAILED: {why} | | | | | | |")
    return "\n".join(lines)


def outside_row(case: str, data: dict[str, Any]) -> str:
    r = data["runners"]
    u, f = r["unfused"], r["fused"]
    ratio = data["ratios"].get("outside_opaque_unfused_over_fused")
    return (f"| {case} | {u['median_ms']:.2f} | {u['opaque_core_ms']:.2f} | {u['outside_opaque_ms']:.2f} | "
            f"{f['median_ms']:.2f} | {f['opaque_core_ms']:.2f} | {f['outside_opaque_ms']:.2f} | "
            f"{'n/a' if ratio is None else f'{ratio:.2f}x'} |")


def main() -> int:
    files = sorted(RESULTS.glob("bench_*.json"))
    outside = ["| case | unfused ms | its opaque cores ms | unfused outside ms | fused ms | fused's opaque cores ms "
               "| fused outside ms (estimate) | unfused / fused outside |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for path in files:
        data = json.loads(path.read_text())
        case = path.stem.removeprefix("bench_")
        print(f"### {case}\n")
        print(f"`{data.get('command', '')}`; inputs {data['inputs']}; load average before/after "
              f"{data['load_average_before']} / {data['load_average_after']}; exit status {data.get('exit_status')}\n")
        print(bench_table(data) + "\n")
        if "unfused" in data["runners"] and "fused" in data["runners"]:
            outside.append(outside_row(case, data))
    print("### time outside opaque cores\n")
    print("\n".join(outside) + "\n")
    opt = RESULTS / "optimize.json"
    if opt.exists():
        print("### optimize.json\n")
        print("```json\n" + json.dumps(json.loads(opt.read_text()), indent=1)[:6000] + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
