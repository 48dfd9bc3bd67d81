"""Sanitized builds (runtime/sanitize.py) and ``autofusion fuzz --sanitize``: AddressSanitizer and
UBSan catch a planted overflow, the shipped tiny models and fuzz cases run clean, a finding is a
failure with its seed, and a process without the sanitizer's runtime is refused, not crashed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from autofusion.cli.main import main
from autofusion.fuzz.sanitized import run_sanitized_campaign
from autofusion.runtime.sanitize import SanitizerUnavailable, findings, sanitizer_env, sanitizer_runtime
from autofusion.runtime.toolchain import CompileError, compiler_name, detect_toolchain

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
ROOT = Path(__file__).resolve().parents[1]

try:
    sanitizer_runtime(compiler_name())
    NO_SANITIZER = ""
except SanitizerUnavailable as e:
    NO_SANITIZER = str(e)
needs_sanitizer = pytest.mark.skipif(bool(NO_SANITIZER), reason=NO_SANITIZER or "sanitizer available")


def _child(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = sanitizer_env(compiler_name())
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


@needs_sanitizer
def test_a_sanitized_build_reports_a_heap_overflow(tmp_path: Path) -> None:
    tc = detect_toolchain(sanitize=True)
    assert "-fsanitize=address,undefined" in tc.cflags and "-O3" not in tc.cflags
    (tmp_path / "over.c").write_text('__attribute__((visibility("default"))) void over(float* a, int n) { for (int i = 0; i <= n; ++i) a[i] = 1.0f; }\n')
    subprocess.run([tc.cc, *tc.cflags, "-shared", "over.c", "-o", "over.so", *tc.ldflags], cwd=tmp_path, check=True)
    r = _child("""
        import ctypes, numpy as np
        lib = ctypes.CDLL("./over.so")
        a = np.empty(1000, np.float32)  # 4 KB: numpy takes it from malloc, not its small-block cache
        lib.over(a.ctypes.data_as(ctypes.c_void_p), 1000)
        print("not caught")
        """, tmp_path)
    assert r.returncode != 0 and "not caught" not in r.stdout
    assert any("heap-buffer-overflow" in line for line in findings(r.stderr)), r.stderr[-2000:]


@needs_sanitizer
def test_the_shipped_tiny_models_run_clean_under_the_sanitizers(tmp_path: Path) -> None:
    r = _child(f"""
        from autofusion.api import optimize
        from autofusion.ir import run_graph
        from autofusion.models import build, random_inputs
        from autofusion.runtime import CompiledModel, UnfusedRunner, compare_outputs
        for name in ("bert-tiny", "gpt2-tiny", "resnet-tiny", "lstm-tiny"):
            g = build(name)
            feeds = random_inputs(g)
            model = CompiledModel(optimize(g), cache={CACHE!r}, tune=False)
            assert model.source.kernels and compare_outputs(run_graph(g, feeds), model.run(feeds)).ok, name
            if name == "resnet-tiny":
                unfused = UnfusedRunner(g, cache={CACHE!r}, tune=False)
                assert compare_outputs(run_graph(g, feeds), unfused.run(feeds)).ok
            print(name, "clean", flush=True)
        """, tmp_path)
    assert r.returncode == 0 and not findings(r.stderr), r.stderr[-3000:]
    assert r.stdout.count("clean") == 4


@needs_sanitizer
def test_the_exported_test_models_run_clean_under_the_sanitizers(tmp_path: Path) -> None:
    models = sorted((ROOT / "tests" / "data" / "models").glob("*.onnx"))
    r = _child(f"""
        from pathlib import Path
        import numpy as np
        from autofusion.api import optimize
        from autofusion.frontends import load_onnx
        from autofusion.runtime import CompiledModel
        for path in map(Path, {[str(p) for p in models]!r}):
            data = np.load(path.with_suffix(".npz"))
            feeds = {{k.removeprefix("input:"): data[k] for k in data.files if k.startswith("input:")}}
            got = CompiledModel(optimize(load_onnx(path)), cache={CACHE!r}, tune=False).run(feeds)
            for k in data.files:
                if k.startswith("output:"):
                    np.testing.assert_allclose(got[k.removeprefix("output:")], data[k], rtol=1e-4, atol=1e-5)
            print(path.stem, "clean", flush=True)
        """, tmp_path)
    assert r.returncode == 0 and not findings(r.stderr), r.stderr[-3000:]
    assert r.stdout.count("clean") == len(models) >= 10


@needs_sanitizer
def test_fuzz_sanitize_runs_small_and_realistic_cases_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--cases", "4", "--seed", "20", "--sanitize", "--json", "--cache", CACHE]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cases"] == 4 and data["failures"] == [] and data["mismatches"] == []
    assert data["ok"] + data["refused"] == 4


@needs_sanitizer
def test_a_finding_is_a_failure_with_its_seed_and_the_campaign_goes_on(tmp_path: Path) -> None:
    """A worker that dies on seed 6 with a sanitizer's report: 5 and 7 still counted, 6 the failure."""
    fake = tmp_path / "worker.py"
    fake.write_text(textwrap.dedent("""
        import json, sys
        seed, cases = int(sys.argv[sys.argv.index("--seed") + 1]), int(sys.argv[sys.argv.index("--cases") + 1])
        for s in range(seed, seed + cases):
            print(json.dumps({"start": s}), flush=True)
            if s == 6:
                sys.stderr.write("==1==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x1\\n")
                sys.exit(86)
            print(json.dumps({"result": {"seed": s, "strategy": "dp", "outcome": "ok"}}), flush=True)
        """))
    report = run_sanitized_campaign(3, 5, command=[sys.executable, str(fake)])
    assert (report.cases, report.ok) == (3, 2)
    (failure,) = report.failures
    assert failure.seed == 6 and failure.backend == "sanitized" and "heap-buffer-overflow" in failure.detail


def test_a_sanitized_build_is_refused_in_a_process_without_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.runtime.model import runnable_toolchain

    monkeypatch.setenv("AUTOFUSION_SANITIZE", "1")
    if NO_SANITIZER:
        with pytest.raises((CompileError, SanitizerUnavailable)):
            runnable_toolchain(None)
        return
    with pytest.raises(CompileError, match="LD_PRELOAD=.*libasan"):
        runnable_toolchain(None)
