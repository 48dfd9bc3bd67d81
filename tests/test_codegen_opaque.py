"""Single ops in the opaque template: pools, LRN, CumSum, Einsum, ConvTranspose, LSTM; and window
ops fused with their neighbours."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from autofusion.decide import build_groups, unfused_plan
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import DType, Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RNG = np.random.default_rng(9)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def check(plan: Plan, feeds: dict[str, np.ndarray]) -> None:
    model = CompiledModel(plan, cache=CACHE)
    report = compare_outputs(run_graph(plan.graph, feeds), model.run(feeds))
    assert report.ok, report.summary()


def test_window_and_contraction_ops_each_alone() -> None:
    b = GraphBuilder("window")
    x, y = b.input("x", (2, 3, 9, 8)), b.input("y", (2, 8, 5))
    outs = [
        *b.op_multi("MaxPool", [x], 2, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
        *b.op_multi("MaxPool", [x], 2, kernel_shape=(2, 3), dilations=(2, 1), ceil_mode=1, storage_order=1),
        b.op("AveragePool", x, kernel_shape=(3, 2), strides=(2, 1), pads=(1, 0, 1, 1), count_include_pad=1,
             ceil_mode=1),
        b.op("AveragePool", x, kernel_shape=(2, 2), pads=(1, 1, 0, 0)),
        b.op("LRN", x, size=3, alpha=0.01, beta=0.7, bias=1.5),
        b.op("CumSum", x, b.const(np.array(2, np.int64)), exclusive=1, reverse=1),
        b.op("CumSum", x, b.const(np.array(-1, np.int64))),
        b.op("Einsum", x, y, equation="ncij,njk->nick"),
        b.op("Einsum", y, equation="nij->jn"),
        b.op("Einsum", b.op("Slice", x, b.const(np.array([0], np.int64)), b.const(np.array([8], np.int64)),
                            b.const(np.array([2], np.int64))), equation="ncii->nc"),
        b.op("ConvTranspose", x, b.const(f32(3, 2, 3, 3)), b.const(f32(2)), strides=(2, 2), pads=(1, 1, 0, 0),
             output_padding=(1, 0)),
    ]
    g = b.build(outs)
    plan = unfused_plan(g)
    # CumSum is a reduction-class op; the Slice under the last Einsum a reorganizing one, a loop nest
    assert {grp.template for grp in plan.groups} <= {"opaque", "reduction", "pointwise"}
    check(plan, {"x": f32(2, 3, 9, 8), "y": f32(2, 8, 5)})


def test_maxpool_fused_with_relu_before_and_add_after() -> None:
    b = GraphBuilder("pool")
    x, z = b.input("x", (1, 4, 8, 8)), b.input("z", (1, 4, 4, 4))
    p = b.op("MaxPool", b.op("Relu", x), kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    g = b.build([b.op("Add", p, z)])
    plan = Plan(g, build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: "pointwise"), ZERO_COST,
                ZERO_COST)
    check(plan, {"x": f32(1, 4, 8, 8), "z": f32(1, 4, 4, 4)})


LSTM_CASES = [
    ({}, ()),
    ({"direction": "bidirectional"}, ("B", "h0", "c0", "lens")),
    ({"direction": "reverse", "layout": 1, "clip": 0.8, "input_forget": 1}, ("B", "P", "h0")),
    ({"activations": ["HardSigmoid", "LeakyRelu", "Softsign"], "activation_alpha": [0.3, 0.2, 0.0],
      "activation_beta": [0.4]}, ("P",)),
    ({"activations": ["Sigmoid", "Relu", "Elu", "Affine", "ScaledTanh", "Softplus"], "direction": "bidirectional",
      "activation_alpha": [0.0, 0.0, 0.7, 0.5, 0.8], "activation_beta": [0.0, 0.0, 0.0, 0.1, 1.2]}, ()),
]


@pytest.mark.parametrize("attrs,extra", LSTM_CASES)
def test_lstm_variants(attrs: dict, extra: tuple[str, ...]) -> None:
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    hidden, size, steps, batch = 5, 3, 4, 2
    layout = attrs.get("layout", 0)
    b = GraphBuilder("lstm")
    xs = (batch, steps, size) if layout else (steps, batch, size)
    feeds = {"x": f32(*xs, scale=0.5)}
    ins = [b.input("x", xs), b.const(f32(dirs, 4 * hidden, size, scale=0.5)),
           b.const(f32(dirs, 4 * hidden, hidden, scale=0.5))]
    ins.append(b.const(f32(dirs, 8 * hidden, scale=0.5)) if "B" in extra else "")
    if "lens" in extra:
        ins.append(b.input("lens", (batch,), DType.INT32))
        feeds["lens"] = np.array([steps, 2], np.int32)
    else:
        ins.append("")
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    for name in ("h0", "c0"):
        if name in extra:
            ins.append(b.input(name, state))
            feeds[name] = f32(*state, scale=0.5)
        else:
            ins.append("")
    ins.append(b.const(f32(dirs, 3 * hidden, scale=0.5)) if "P" in extra else "")
    while ins[-1] == "":
        ins.pop()
    g = b.build(b.op_multi("LSTM", ins, 3, hidden_size=hidden, **attrs))
    check(unfused_plan(g), feeds)


@pytest.mark.parametrize("cell_kernel", [True, False])
def test_lstm_cell_unrolled_over_time_as_one_scan_kernel(cell_kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recurrent cell kernel (gates interleaved per panel, never stored) and, when it declines, the
    generic multi-core renderer."""
    from autofusion.models import build, random_inputs

    if not cell_kernel:
        monkeypatch.setattr("autofusion.codegen.lstm_cells.render_lstm_cells", lambda k, nodes: None)
    g = build("lstm-tiny")
    head = g.nodes[-1]  # the linear head after the last step
    cells = [n.name for n in g.nodes if n.op != "Gather" and n is not head]
    rest = [[n.name] for n in g.nodes if n.op == "Gather" or n is head]
    template = {frozenset(cells): "lstm_scan"}
    groups = build_groups(g, [cells, *rest], template_of=lambda ns: template.get(frozenset(ns), "opaque"))
    plan = Plan(g, groups, ZERO_COST, ZERO_COST)
    scan = next(grp for grp in plan.groups if grp.template == "lstm_scan")
    assert sum(g.node_by_name[n].op == "Gemm" for n in scan.nodes) == 16  # 8 steps, 2 projections each
    check(plan, random_inputs(g, seed=3))
    from autofusion.codegen import render_plan

    kernel = next(k for k in render_plan(plan).kernels if k.group.template == "lstm_scan")
    assert ("gates interleaved" in kernel.code) == cell_kernel
    step_bytes = sum(g.types[t].nbytes for n in scan.nodes if g.node_by_name[n].op == "Gemm"
                     for t in g.node_by_name[n].outputs) // 8
    if cell_kernel:  # h twice (double buffer) and c: 2 x 48 + 48 floats (x_t W_ih^T: each thread's own)
        assert kernel.scratch_bytes == (2 * 48 + 48) * 4
    else:
        # each step's projections run at that step and its values' scratch is reused once read: a few
        # steps' worth of scratch, not eight (2,304 bytes here; 7,488 when all projections ran up front)
        assert kernel.scratch_bytes <= 3 * step_bytes


def _time_major(g: Graph) -> Graph:
    """The same unrolled cell over an input laid out [T, B, D]."""
    import dataclasses

    from autofusion.graph.graph import FrozenMap
    from autofusion.graph.types import TensorType

    b_, t_, d_ = g.types["x"].shape
    nodes = tuple(dataclasses.replace(n, attrs=FrozenMap({**dict(n.attrs), "axis": 0})) if n.op == "Gather" else n
                  for n in g.nodes)
    return dataclasses.replace(g, nodes=nodes, types=FrozenMap({**dict(g.types), "x": TensorType((t_, b_, d_), DType.FLOAT32)}))


@pytest.mark.parametrize("threads", [1, 2, 4, 7])
@pytest.mark.parametrize("seq,batch,time_major", [(8, 1, False), (6, 3, False), (6, 3, True)])
def test_lstm_cell_kernel_projects_several_steps_ahead_when_w_ih_leaves_l2(seq: int, batch: int, time_major: bool,
                                                                           threads: int) -> None:
    """On a machine whose L2 cannot hold W_ih (here told 16 KiB, W_ih 24 KiB) each thread computes its
    panels' input projections four steps ahead into its own block: the same numbers for any thread
    count (7 threads over 6 panels: one has none), a step count that is no multiple of four, a batch.
    Where the steps' input rows follow each other (batch 1, or a time-major input) the projections
    of the four steps are one product of their rows; else one product per step."""
    import dataclasses

    from autofusion.codegen.cores import CoreChoice, FixedChooser, this_machine
    from autofusion.models import build, random_inputs

    g = build("lstm-tiny", seq=seq, batch=batch)
    g = _time_major(g) if time_major else g
    head = g.nodes[-1]
    cells = [n.name for n in g.nodes if n is not head]  # the Gathers of x[:, t] too: offsets into x
    groups = build_groups(g, [cells, [head.name]], template_of=lambda ns: "lstm_scan" if len(ns) > 1 else "opaque")
    plan = Plan(g, groups, ZERO_COST, ZERO_COST)
    small_l2 = FixedChooser(CoreChoice("packed", 128), dataclasses.replace(this_machine(), l2=16 * 1024))
    model = CompiledModel(plan, cache=CACHE, cores=small_l2, threads=threads)
    kernel = next(k for k in model.source.kernels if k.group.template == "lstm_scan")
    assert "the next 4 steps" in kernel.code and kernel.thread_bytes == 4 * batch * 4 * 48 * 4
    assert ("one product of ahead" in kernel.code) == (batch == 1 or time_major)
    feeds = random_inputs(g, seed=7)
    report = compare_outputs(run_graph(g, feeds), model.run(feeds))
    assert report.ok, report.summary()
    plain = CompiledModel(plan, cache=CACHE, threads=threads)  # this machine's L2 holds W_ih: step by step
    assert "the next 4 steps" not in next(k.code for k in plain.source.kernels if k.group.template == "lstm_scan")


@pytest.mark.parametrize("batch", [1, 3])
def test_lstm_cell_kernel_writes_states_read_outside(batch: int) -> None:
    """With a middle step's hidden and cell state also graph outputs, the cell kernel writes them as
    it goes (batch 1 and 3); optimize() puts the unrolled cell in one lstm_scan group, at batch 1 with
    those outputs too (the whole-group cost estimate charged recomputation across steps)."""
    import dataclasses

    from autofusion.api import optimize
    from autofusion.codegen import render_plan
    from autofusion.models import build, random_inputs

    g = build("lstm-tiny", batch=batch)
    assert optimize(g).kernels == 2  # the loop and the linear head
    split = [n for n in g.nodes if n.op == "Split"][3]
    forget = g.consumers[split.outputs[1]][0]  # Sigmoid
    c_state = g.consumers[g.consumers[forget.outputs[0]][0].outputs[0]][0].outputs[0]  # f * c + i * g
    tanh_c = next(u for u in g.consumers[c_state] if u.op == "Tanh")
    h_state = g.consumers[tanh_c.outputs[0]][0].outputs[0]  # o * tanh(c)
    g = dataclasses.replace(g, outputs=(*g.outputs, h_state, c_state))
    if batch == 1:  # the loop is costed step by step (each step storing its carried values): still chosen
        assert optimize(g).kernels == 2
    head = g.nodes[-1]
    cells = [n.name for n in g.nodes if n.op != "Gather" and n is not head]
    rest = [[n.name] for n in g.nodes if n.op == "Gather" or n is head]
    groups = build_groups(g, [cells, *rest], template_of=lambda ns: "lstm_scan" if len(ns) > 1 else "opaque")
    plan = Plan(g, groups, ZERO_COST, ZERO_COST)
    scan = next(grp for grp in plan.groups if grp.template == "lstm_scan")
    assert {h_state, c_state} <= set(scan.outputs)
    check(plan, random_inputs(g, seed=4))
    kernel = next(k for k in render_plan(plan).kernels if k.group.template == "lstm_scan")
    assert "gates interleaved" in kernel.code


@pytest.mark.parametrize("time_major", [False, True])
def test_lstm_loop_reads_each_steps_slice_of_the_input_in_place(time_major: bool) -> None:
    """The Gathers that pick x[:, t] (or x[t] of a time-major input) join the loop kernel and become
    offsets into the input: two kernels in all, and the peak activation memory is the recurrent
    state alone, under half the unfused plan's."""
    from autofusion.api import optimize
    from autofusion.codegen import render_plan
    from autofusion.models import build

    g = build("lstm-tiny", batch=2)
    g = _time_major(g) if time_major else g
    plan = optimize(g)
    scan = next(grp for grp in plan.groups if grp.template == "lstm_scan")
    assert sum(plan.graph.node_by_name[n].op == "Gather" for n in scan.nodes) == 8 and plan.kernels == 2
    rng = np.random.default_rng(6)
    check(plan, {"x": rng.standard_normal(g.types["x"].shape).astype(np.float32)})
    kernel = next(k for k in render_plan(plan).kernels if k.group.template == "lstm_scan")
    assert "gates interleaved" in kernel.code
    fused, unfused = render_plan(plan).buffers, render_plan(unfused_plan(g)).buffers
    assert fused is not None and unfused is not None and fused.peak_bytes <= unfused.peak_bytes / 2


def test_lstm_cell_kernel_declines_a_step_input_it_cannot_offset() -> None:
    """A step's input computed inside the loop group by something else than a Gather of a model input
    (here a Relu of it): the cell kernel declines and the generic renderer runs the group."""
    import dataclasses

    from autofusion.codegen import render_plan
    from autofusion.models import build, random_inputs

    g = build("lstm-tiny")
    gathers = [n for n in g.nodes if n.op == "Gather"]
    first = gathers[0]
    relu_out = first.outputs[0] + "_relu"
    nodes = []
    for n in g.nodes:
        if n.name != first.name and first.outputs[0] in n.inputs:
            n = dataclasses.replace(n, inputs=tuple(relu_out if i == first.outputs[0] else i for i in n.inputs))
        nodes.append(n)
        if n.name == first.name:
            nodes.append(dataclasses.replace(n, name=n.name + "_relu", op="Relu", inputs=(n.outputs[0],),
                                             outputs=(relu_out,), attrs=type(n.attrs)()))
    g = dataclasses.replace(g, nodes=tuple(nodes), types=type(g.types)({**dict(g.types), relu_out: g.types[first.outputs[0]]}))
    head = g.nodes[-1]
    cells = [n.name for n in g.nodes if n is not head and (n.op != "Gather" or n.name == first.name)]
    rest = [[n.name] for n in g.nodes if n.name not in cells]
    groups = build_groups(g, [cells, *rest], template_of=lambda ns: "lstm_scan" if len(ns) > 1 else "opaque")
    plan = Plan(g, groups, ZERO_COST, ZERO_COST)
    check(plan, random_inputs(g, seed=5))
    kernel = next(k for k in render_plan(plan).kernels if k.group.template == "lstm_scan")
    assert "gates interleaved" not in kernel.code
