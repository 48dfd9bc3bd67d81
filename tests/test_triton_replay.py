"""A Triton plan bound once to fixed buffers (one allocation laid out by the buffer planner) and
replayed per call: the same numbers as the reference on every call, whatever the feeds before."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from autofusion.ir import run_graph
from autofusion.ir.builder import GraphBuilder

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU
pytest.importorskip("torch", reason="the Triton backend needs torch (pip install autofusion[gpu])",
                    exc_type=ImportError)
pytest.importorskip("triton", reason="the Triton backend needs triton (pip install autofusion[gpu])",
                    exc_type=ImportError)

from triton_cases import feeds_for, one_group_plan  # noqa: E402

from autofusion.api import optimize  # noqa: E402
from autofusion.decide.plan import Plan  # noqa: E402
from autofusion.models import build, random_inputs  # noqa: E402
from autofusion.runtime.triton_runner import TritonModel  # noqa: E402


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


def _pooled_cnn() -> Plan:
    """A ResNet stem and block in small: a convolution split from its max-pool, a residual."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("pooled_cnn")
    x = b.input("x", (1, 3, 12, 12))

    def conv(t: str, cin: int, cout: int) -> str:
        w = b.const((rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32))
        return b.op("Conv", t, w, b.const(rng.standard_normal(cout).astype(np.float32)), pads=(1, 1, 1, 1))

    stem = b.op("MaxPool", b.op("Relu", conv(x, 3, 8)), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    out = b.op("Relu", b.op("Add", conv(b.op("Relu", conv(stem, 8, 8)), 8, 8), stem))
    return optimize(b.build([b.op("Flatten", b.op("GlobalAveragePool", out))]))


@pytest.mark.parametrize("name", ["gpt2-tiny", "pooled_cnn"])
def test_replayed_calls_compute_the_reference_whatever_ran_before(name: str) -> None:
    """gpt2-tiny (views, attention, torch's ops) and a small CNN (a convolution split from its pool,
    a residual): the first call launches step by step and prepares; later calls replay on the fixed
    buffers, and a call after other feeds gives the first call's numbers exactly."""
    plan = _pooled_cnn() if name == "pooled_cnn" else optimize(build(name))
    model = TritonModel(plan)
    first_feeds, other_feeds = random_inputs(plan.graph, seed=0), random_inputs(plan.graph, seed=1)
    first = model(first_feeds)
    assert model.launches.startswith("one CUDA graph" if model.device.startswith("cuda") else "bound once")
    assert name != "pooled_cnn" or model.split  # the stem's conv and pool: two kernels
    _close(model(other_feeds), run_graph(plan.graph, other_feeds))
    again = model(first_feeds)
    for out in plan.graph.outputs:
        np.testing.assert_array_equal(again[out], first[out])
    intermediates = sum(plan.graph.type_of(t).nbytes for s in model.steps if s.group.template != "view"
                        for t in s.group.outputs if t not in plan.graph.outputs)
    assert model.workspace_bytes is not None and 0 < model.workspace_bytes < intermediates  # buffers shared


def test_outputs_are_the_callers_own() -> None:
    b = GraphBuilder("pointwise")
    x = b.input("x", (4, 33))
    y = b.op("Relu", b.op("Add", x, x))
    g = b.build([y])
    model = TritonModel(one_group_plan(g, "pointwise"))
    feeds = feeds_for(g)
    model(feeds)
    kept = model(feeds)[y]
    kept_copy = kept.copy()
    model({"x": -feeds["x"]})  # the next replay writes the fixed output buffer again
    np.testing.assert_array_equal(kept, kept_copy)


def test_ops_on_torch_and_on_the_host_are_copied_into_their_fixed_buffers() -> None:
    """Pow and Concat (torch's ops) and an LSTM with other activations (the host's reference op) make new tensors
    each call: the replay copies them into the planned buffers the next steps read."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("mixed")
    x, e = b.input("x", (3, 5, 4)), b.input("e", (3, 5, 4))
    powed = b.op("Concat", b.op("Pow", b.op("Abs", x), e), x, axis=2)
    w = b.const((rng.standard_normal((1, 24, 8)) * 0.5).astype(np.float32))
    r = b.const((rng.standard_normal((1, 24, 6)) * 0.5).astype(np.float32))
    ys = b.op_multi("LSTM", [powed, w, r], 3, hidden_size=6, activations=["HardSigmoid", "Tanh", "Tanh"])
    g = b.build([b.op("Relu", ys[0])])
    model = TritonModel(optimize(g))
    assert model.on_torch and model.fallbacks
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((3, 5, 4)).astype(np.float32),
                 "e": np.random.default_rng(seed).integers(1, 3, (3, 5, 4)).astype(np.float32)}
        _close(model(feeds), run_graph(g, feeds))


def _small_plan() -> Plan:
    b = GraphBuilder("small")
    x = b.input("x", (6, 20))
    h = b.op("Relu", b.op("MatMul", x, b.const(np.linspace(-1, 1, 20 * 16, dtype=np.float32).reshape(20, 16))))
    return optimize(b.build([b.op("Softmax", b.op("Add", h, b.op("Transpose", b.op("Reshape", h, b.const(
        np.array([16, 6], np.int64))), perm=(1, 0))), axis=-1)]))


def test_calls_from_threads_take_turns_on_the_fixed_buffers() -> None:
    plan = _small_plan()
    model = TritonModel(plan)
    feeds = [random_inputs(plan.graph, seed=s) for s in range(4)]
    want = [run_graph(plan.graph, f) for f in feeds]
    model(feeds[0])  # prepared
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            _close(model(feeds[i]), want[i])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_without_replay_every_call_launches_step_by_step() -> None:
    plan = _small_plan()
    model = TritonModel(plan, replay=False)
    feeds = random_inputs(plan.graph, seed=0)
    model(feeds)
    _close(model(feeds), run_graph(plan.graph, feeds))
    assert model.launches == "launched one by one" and model.workspace_bytes is None


def test_the_prepared_inputs_hold_the_preparing_calls_feeds() -> None:
    """The fixed input tensors start with the feeds of the call that prepared them: a CUDA graph's
    capture runs the steps once first, and uninitialised token ids would send its Gather off the
    table (an illegal address on the device)."""
    plan = optimize(build("bert-tiny"))
    model = TritonModel(plan)
    feeds = random_inputs(plan.graph)
    model(feeds)
    replay = model._replay
    assert replay is not None
    for name, value in feeds.items():
        np.testing.assert_array_equal(replay.tensors[name].cpu().numpy(), value, err_msg=name)
