"""Random elementwise / layout / reduction graphs, fused into random groups, against the reference."""

from __future__ import annotations

import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.runtime import CompiledModel, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
UNARY = ["Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Erf", "Floor"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Graph, dict[str, np.ndarray], list[int]]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(2, 5), min_size=rank, max_size=rank)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = GraphBuilder("random")
    feeds: dict[str, np.ndarray] = {}
    values: list[str] = []
    for i in range(draw(st.integers(1, 3))):
        keep = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        in_shape = tuple(n if k else 1 for n, k in zip(shape, keep))[draw(st.integers(0, rank - 1)):]
        name = b.input(f"in{i}", in_shape)
        feeds[name] = rng.standard_normal(in_shape).astype(np.float32)
        values.append(name)
    full = [v for v in values if b.type_of(v).shape == shape]
    for _ in range(draw(st.integers(2, 7))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "where", "div", "layout", "reduce", "softmax"]))
        a = draw(st.sampled_from(values))
        if kind == "unary":
            out = b.op(draw(st.sampled_from(UNARY)), a)
        elif kind == "binary":
            out = b.op(draw(st.sampled_from(BINARY)), a, draw(st.sampled_from(values)))
        elif kind == "div":
            out = b.op("Div", a, b.op("Add", b.op("Abs", draw(st.sampled_from(values))), b.const(np.float32(1.0))))
        elif kind == "where":
            c = draw(st.sampled_from(values))
            out = b.op("Where", b.op("Greater", a, c), a, c)
        elif kind == "layout" and b.type_of(a).rank > 1:
            perm = draw(st.permutations(range(b.type_of(a).rank)))
            t = b.op("Transpose", a, perm=tuple(perm))
            out = b.op("Reshape", t, b.const(np.array(b.type_of(a).shape, np.int64)))  # same shape, new order
        elif kind == "reduce" and a in full:
            axis = draw(st.integers(0, rank - 1))
            out = b.op("ReduceSum", a, b.const(np.array([axis], np.int64)), keepdims=1)
        elif kind == "softmax":
            out = b.op("Softmax", b.op("Tanh", a), axis=draw(st.integers(-1, b.type_of(a).rank - 1)) if
                       b.type_of(a).rank else -1)
        else:
            out = b.op("Exp", b.op("Tanh", a))
        values.append(out)
        if b.type_of(out).shape == shape:
            full.append(out)
    made = values[len(feeds):]
    outputs = list(dict.fromkeys([made[-1], *draw(st.lists(st.sampled_from(made), max_size=2))]))
    g = b.build(outputs)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(g.nodes) - 1)), max_size=2))))
    return g, feeds, cuts


@given(graphs())
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
def test_random_groups_match_the_reference(case: tuple[Graph, dict[str, np.ndarray], list[int]]) -> None:
    g, feeds, cuts = case
    names = [n.name for n in g.nodes]
    bounds = [0, *[c for c in cuts if 0 < c < len(names)], len(names)]
    partition = [names[lo:hi] for lo, hi in zip(bounds, bounds[1:]) if hi > lo]

    def template(nodes: list[str] | tuple[str, ...]) -> str:
        ops = {g.node_by_name[n].op for n in nodes}
        return "reduction" if ops & {"ReduceSum", "Softmax"} else "pointwise"

    plan = Plan(g, build_groups(g, partition, template_of=template), ZERO_COST, ZERO_COST)
    report = compare_outputs(run_graph(g, feeds), CompiledModel(plan, cache=CACHE).run(feeds))
    assert report.ok, report.summary()
