"""Partitions become ordered groups with the right inputs and outputs."""

from __future__ import annotations

import numpy as np
import pytest

from autofusion.decide import build_groups, unfused_plan
from autofusion.decide.groups import order_groups
from autofusion.ir import DType, GraphBuilder


def _graph():
    b = GraphBuilder("g")
    x = b.input("x", (4, 8), DType.FLOAT32)
    w = b.const(np.ones((8, 8), np.float32), "w")
    m = b.op("MatMul", x, w, name="mm")
    r = b.op("Relu", m, name="relu")
    n = b.op("Neg", m, name="neg")
    s = b.op("Add", r, n, name="add")
    return b.build([s, r])


def test_group_io_materialises_only_tensors_used_outside() -> None:
    g = _graph()
    groups = build_groups(g, [["mm", "relu"], ["neg", "add"]])
    first, second = groups
    assert first.nodes == ("mm", "relu")
    assert first.inputs == ("x", "w")
    assert set(first.outputs) == {"mm_out", "relu_out"}  # mm feeds neg outside; relu is a graph output
    assert second.inputs == ("mm_out", "relu_out")  # in the order the group first reads them
    assert second.outputs == ("add_out",)
    assert first.name.startswith("k0_matmul_relu")


def test_unfused_plan_has_one_group_per_node_and_cycles_are_refused() -> None:
    g = _graph()
    assert unfused_plan(g).kernels == 4
    with pytest.raises(ValueError, match="cycle"):
        order_groups(g, [["mm", "add"], ["relu", "neg"]])
