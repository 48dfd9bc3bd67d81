"""Cores timed inside the whole model: onnxruntime's nodes matched to our kernels' cores by shape."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from autofusion.bench.in_model import OnnxRuntimeFailed, combine, ort_node_key, ort_node_times, our_cores, spec_key
from autofusion.cli.main import main
from autofusion.codegen.cores import CoreChoice, CoreSpec


@pytest.mark.parametrize(("op", "inputs", "outputs", "key"), [
    # plain NCHW: weight [M, C/g, kh, kw]
    ("Conv", [[1, 64, 56, 56], [128, 64, 3, 3], [128]], [[1, 128, 28, 28]], ("conv", 784, 128, 576)),
    # channel-blocked: input [N, C/16, H, W, 16], weight [M/16, C/16, kh, kw, 16, 16], a residual input
    ("Conv", [[1, 4, 56, 56, 16], [4, 4, 3, 3, 16, 16], [64], [1, 4, 56, 56, 16]], [[1, 4, 56, 56, 16]],
     ("conv", 3136, 64, 576)),
    # an NCHW input into a blocked output (the stem): weight [M/16, C, kh, kw, 16]
    ("Conv", [[1, 3, 224, 224], [4, 3, 7, 7, 16], [64]], [[1, 4, 112, 112, 16]], ("conv", 12544, 64, 147)),
    # two images, a 1x1 kernel
    ("Conv", [[2, 8, 5, 5], [6, 8, 1, 1]], [[2, 6, 5, 5]], ("conv", 50, 6, 8)),
    # a depthwise convolution: one input channel per group
    ("Conv", [[1, 32, 10, 10], [32, 1, 3, 3]], [[1, 32, 10, 10]], ("conv", 100, 32, 9)),
    ("Gemm", [[128, 768], [768, 3072], [3072]], [[128, 3072]], ("gemm", 128, 3072, 768)),
    ("Gemm", [[1, 512], [1000, 512], [1000]], [[1, 1000]], ("gemm", 1, 1000, 512)),  # transB
    ("MatMul", [[1, 8, 768], [768, 768]], [[1, 8, 768]], ("gemm", 8, 768, 768)),
    ("MatMul", [[1, 12, 8, 64], [1, 12, 64, 8]], [[1, 12, 8, 8]], ("gemm", 96, 8, 64)),
    ("FusedMatMul", [[1, 12, 8, 64], [1, 12, 8, 64]], [[1, 12, 8, 8]], ("gemm", 96, 8, 64)),  # B transposed
    # a weight packed ahead is not listed: A, the bias, the output
    ("FusedGemm", [[1, 768], [768]], [[1, 768]], ("gemm", 1, 768, 768)),
    ("Conv", [[1, 64, 8, 8], [64]], [[1, 64, 8, 8]], None),
    ("Relu", [[1, 4]], [[1, 4]], None),
    ("Conv", [], [[1, 4, 4, 4]], None),
])
def test_an_onnxruntime_node_is_keyed_by_the_product_it_computes(op: str, inputs: list[list[int]],
                                                                 outputs: list[list[int]], key: tuple | None) -> None:
    assert ort_node_key(op, inputs, outputs) == key


def test_our_cores_are_keyed_like_onnxruntime_nodes() -> None:
    # a convolution's calls are images x groups, its n the channels of one group
    geometry = ((2, 32, 10, 10), (32, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (32,))
    assert spec_key(CoreSpec("conv", 100, 1, 9, calls=64, geometry=geometry)) == ("conv", 200, 32, 9)
    assert spec_key(CoreSpec("gemm", 8, 8, 64, calls=12)) == ("gemm", 96, 8, 64)


def _kernel(name: str, *specs: CoreSpec) -> SimpleNamespace:
    return SimpleNamespace(group=SimpleNamespace(name=name), cores=[(s, CoreChoice("packed", 256)) for s in specs])


def test_a_kernel_shares_its_time_among_its_cores_by_flops() -> None:
    big, small = CoreSpec("gemm", 8, 96, 64), CoreSpec("gemm", 8, 32, 64)  # 3 : 1
    kernels = [_kernel("k0", big, small), _kernel("k1", big), _kernel("k2")]
    cores, rest = our_cores(kernels, {"k0": 4.0, "k1": 2.0, "k2": 0.5, "k3": 0.25}, lambda c, s: c.impl)
    assert cores[("gemm", 8, 96, 64)].ours_ms == [3.0, 2.0] and cores[("gemm", 8, 32, 64)].ours_ms == [1.0]
    assert rest == 0.75  # kernels without a core, and a step no kernel renders (a view)
    ort = {"a": ("MatMul", ("gemm", 8, 96, 64), 1.0), "b": ("MatMul", ("gemm", 8, 96, 64), 3.0),
           "c": ("MatMul", ("gemm", 4, 4, 4), 0.5), "d": ("Softmax", None, 0.1)}
    result = combine(cores, rest, ort)
    first = result.cores[0]
    assert first.key == ("gemm", 8, 96, 64) and first.ratio() == pytest.approx(2.5 / 2.0)
    assert result.unmatched == {"c": 0.5} and result.ort_rest_ms == pytest.approx(0.1)
    assert result.ours_total_ms == pytest.approx(6.75) and result.ort_total_ms == pytest.approx(4.6)
    assert result.to_json()["cores"][1]["ratio_vs_onnxruntime"] is None  # no node of onnxruntime computes it


def test_onnxruntime_runs_not_timed_are_left_out() -> None:
    def run(ts: float) -> dict:
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 50}

    def node(ts: float, dur: float) -> dict:
        return {"cat": "Node", "name": "mm_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": "MatMul", "input_type_shape": [{"float": [8, 64]}, {"float": [64, 32]}],
                         "output_type_shape": [{"float": [8, 32]}]}}

    # onnxruntime writes a run's event when it ends: after its nodes' events
    events = [node(1, 1000), run(0), node(101, 10), node(111, 20), run(100), node(201, 30), run(200)]
    assert ort_node_times(events) == {"mm": ("MatMul", ("gemm", 8, 32, 64), pytest.approx(0.025))}
    assert ort_node_times(events, [False, True, True])["mm"] == ("MatMul", ("gemm", 8, 32, 64), pytest.approx(0.02))
    assert ort_node_times(events, [False, False, True])["mm"][2] == pytest.approx(0.03)
    with pytest.raises(OnnxRuntimeFailed, match="holds 3 runs of the 4 made"):  # runs it did not record
        ort_node_times(events, [False, True, True, True])


def test_bench_cores_in_model_matches_every_core_of_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    code = main(["bench-cores", "resnet-tiny", "--in-model", "--json", "--repeat", "2", "--rounds", "2", "--no-tune"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    cores = data["cores"]
    assert {c["kind"] for c in cores} == {"conv", "gemm"}
    # every convolution and the classifier of ours is found in onnxruntime's run, as often
    assert all(c["instances"] == c["onnxruntime_nodes"] > 0 for c in cores), cores
    assert data["unmatched_onnxruntime_nodes_ms"] == {}
    for c in cores:
        ours, theirs = c["ms_per_instance"]["autofusion"], c["ms_per_instance"]["onnxruntime"]
        assert ours > 0 and theirs > 0 and c["ratio_vs_onnxruntime"] == pytest.approx(ours / theirs)
    assert data["totals_ms"]["autofusion"] >= sum(c["ms_per_instance"]["autofusion"] * c["instances"] for c in cores) * 0.999
    # each runtime's whole run, wall clock, holds its kernels: the yardstick for the node sums
    run = data["whole_run_ms"]
    assert run["autofusion"] >= 0.8 * data["totals_ms"]["autofusion"] and run["onnxruntime"] > 0
    code = main(["bench-cores", "resnet-tiny", "--in-model", "--repeat", "1", "--rounds", "1", "--no-tune", "--top", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "inside the whole model" in out and "ours/ort" in out
    assert "whole runs while profiled (wall clock): ours" in out


def test_a_product_onnxruntime_runs_in_parts_is_matched_to_them() -> None:
    qkv, out = CoreSpec("gemm", 8, 192, 64), CoreSpec("gemm", 8, 64, 64)  # Q, K and V in one product
    cores, rest = our_cores([_kernel("k0", qkv), _kernel("k1", out), _kernel("k2", qkv), _kernel("k3", out)],
                            {"k0": 3.0, "k1": 1.5, "k2": 3.0, "k3": 1.5}, lambda c, s: c.impl)
    ort = {f"mm{i}": ("MatMul", ("gemm", 8, 64, 64), 1.0 + (i % 2) * 0.5) for i in range(8)}
    result = combine(cores, rest, ort)
    wide, narrow = cores[("gemm", 8, 192, 64)], cores[("gemm", 8, 64, 64)]
    assert wide.ort_ms == [pytest.approx(3 * 1.25)] * 2 and wide.ratio() == pytest.approx(3.0 / 3.75)
    assert len(narrow.ort_ms) == 2 and narrow.ratio() == pytest.approx(1.5 / 1.25)
    assert wide.ort_parts == "3 x gemm [8 x 64] @ [64 x 64]" and narrow.ort_parts == ""
    assert result.unmatched == {}
    # too few nodes of the shape to be the parts: the wide core has no time of onnxruntime's
    few = {f"mm{i}": ("MatMul", ("gemm", 8, 64, 64), 1.0) for i in range(5)}
    cores, rest = our_cores([_kernel("k0", qkv), _kernel("k1", out), _kernel("k2", qkv), _kernel("k3", out)],
                            {"k0": 3.0, "k1": 1.5, "k2": 3.0, "k3": 1.5}, lambda c, s: c.impl)
    assert combine(cores, rest, few).cores[0].ratio() is None


def test_a_model_onnxruntime_cannot_run_is_a_clear_error(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ort = pytest.importorskip("onnxruntime")

    class Refusing:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : no kernel for op X")

    monkeypatch.setattr(ort, "InferenceSession", Refusing)
    code = main(["bench-cores", "resnet-tiny", "--in-model", "--repeat", "1", "--rounds", "1", "--no-tune"])
    err = capsys.readouterr().err
    assert code == 2 and "onnxruntime could not run the model" in err and "NOT_IMPLEMENTED" in err
    assert "Traceback" not in err and "internal error" not in err


def test_a_kernel_that_pools_is_compared_with_onnxruntimes_convolution_and_its_pooling_node() -> None:
    """The stem's kernel pools in its epilogue; onnxruntime runs the MaxPool as a node of its own,
    which joins the convolution's time (an unrelated pooling node stays outside the cores)."""
    stem = CoreSpec("conv", 12544, 64, 147, geometry=((1, 3, 224, 224), (64, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1),
                                                      (1,)))
    cores, rest = our_cores([_kernel("k0", stem)], {"k0": 1.5}, lambda c, s: c.impl, {"k0": 64 * 56 * 56})
    ort = {"conv": ("FusedConv", ("conv", 12544, 64, 147), 1.0), "pool": ("MaxPool", ("pool", 64 * 56 * 56, 0, 0), 0.2),
           "other": ("AveragePool", ("pool", 10, 0, 0), 0.05)}
    result = combine(cores, rest, ort)
    (core,) = result.cores
    assert core.ratio() == pytest.approx(1.5 / 1.2) and "MaxPool node included" in core.ort_parts
    assert result.ort_rest_ms == pytest.approx(0.05) and result.unmatched == {}
    assert ort_node_key("MaxPool", [[1, 64, 112, 112]], [[1, 64, 56, 56]]) == ("pool", 64 * 56 * 56, 0, 0)
    # a channel-blocked pool counts the same elements
    assert ort_node_key("MaxPool", [[1, 4, 112, 112, 16]], [[1, 4, 56, 56, 16]]) == ("pool", 64 * 56 * 56, 0, 0)
