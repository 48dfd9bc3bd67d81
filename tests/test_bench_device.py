"""``autofusion bench --device cuda``: the device runners (Triton SuperKernel, torch on the device,
onnxruntime's CUDA provider), checked here on the CPU under Triton's interpreter, and the refusal
where no CUDA device exists."""

from __future__ import annotations

import os

import numpy as np
import pytest

from autofusion.cli.main import main
from autofusion.ir.builder import GraphBuilder

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU


def _graph() -> object:
    b = GraphBuilder("small")
    x = b.input("x", (4, 24))
    w = b.const(np.linspace(-1, 1, 24 * 16, dtype=np.float32).reshape(24, 16))
    return b.build([b.op("Softmax", b.op("Relu", b.op("MatMul", x, w)), axis=-1)])


def test_device_runners_check_their_outputs_and_keep_them_on_the_device() -> None:
    torch = pytest.importorskip("torch", exc_type=ImportError)
    pytest.importorskip("triton", exc_type=ImportError)
    from autofusion.api import optimize
    from autofusion.bench import BenchSetup, run_bench
    from autofusion.bench.device_runners import DeviceOutputs
    from autofusion.bench.runners import prepare
    from autofusion.models import random_inputs

    graph = _graph()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: under Triton's interpreter
    setup = BenchSetup(graph, optimize(graph), random_inputs(graph), 2, device=device)  # type: ignore[arg-type]
    result = run_bench(setup, ["reference", "triton", "torch_eager", "ort_cuda"], repeat=2, warmup=1)
    assert not result.failed, result.failed
    by_name = {r.name: r for r in result.runners}
    assert by_name["triton"].outputs_ok and by_name["torch_eager"].outputs_ok
    triton = by_name["triton"].extra
    assert triton["launches"].startswith("one CUDA graph" if device == "cuda" else "bound once")
    assert triton["host"] == {}
    assert "ort_cuda" in result.skipped and "CUDA provider" in result.skipped["ort_cuda"]
    outputs = prepare("triton", setup).call()
    assert isinstance(outputs, DeviceOutputs)  # copied to the host only when read, not in timed runs
    assert set(outputs) == set(graph.outputs) and outputs[graph.outputs[0]].shape == (4, 16)  # type: ignore[attr-defined]


def test_bench_on_cuda_without_a_device_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch", exc_type=ImportError)
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal cannot happen")
    assert main(["bench", "bert-tiny", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert main(["bench", "bert-tiny", "--device", "cuda", "--runners", "fused"]) == 2
    assert "unknown runner fused on --device cuda" in capsys.readouterr().err
