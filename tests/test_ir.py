"""The graph IR: immutability, hashing, builder inference, verifier, interpreter."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autofusion.ir import Const, DType, FrozenMap, GraphBuilder, Node, TensorType, VerifyError, run_graph, verify
from autofusion.ir.verify import problems


def _mlp() -> tuple[GraphBuilder, str]:
    b = GraphBuilder("mlp")
    x = b.input("x", (4, 8), DType.FLOAT32)
    w = b.const(np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 100, "w")
    bias = b.const(np.ones(16, np.float32), "bias")
    y = b.op("Relu", b.op("Add", b.op("MatMul", x, w), bias))
    return b, y


def test_builder_infers_types_and_interpreter_matches_numpy() -> None:
    b, y = _mlp()
    g = verify(b.build([y]))
    assert g.types[y] == TensorType((4, 16), DType.FLOAT32)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    out = run_graph(g, {"x": x})[y]
    w = g.constants["w"].array
    np.testing.assert_allclose(out, np.maximum(x @ w + 1, 0), rtol=1e-6)


def test_ir_is_immutable_and_hashable() -> None:
    b, y = _mlp()
    g1, g2 = b.build([y]), b.build([y])
    assert g1 == g2 and hash(g1) == hash(g2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g1.name = "other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        g1.constants["w"].array[0, 0] = 5.0
    assert g1.replace(name="mlp") is g1
    node = g1.nodes[0]
    assert node.replace(op=node.op) is node
    assert hash(Const(np.ones(3))) == hash(Const(np.ones(3)))


def test_verifier_reports_every_problem() -> None:
    b, y = _mlp()
    g = b.build([y])
    bad_order = g.replace(nodes=tuple(reversed(g.nodes)))
    with pytest.raises(VerifyError) as err:
        verify(bad_order)
    assert any("before they are defined" in p for p in err.value.problems)
    wrong_type = g.replace(types=g.types.set(y, TensorType((4, 15), DType.FLOAT32)))
    with pytest.raises(VerifyError, match="inference says"):
        verify(wrong_type)
    dangling = g.replace(outputs=("nowhere",))
    with pytest.raises(VerifyError, match="never defined"):
        verify(dangling)
    cyc = g.replace(nodes=g.nodes + (Node("Relu", (y,), ("x",), FrozenMap(), "loop"),))
    assert any("defined twice" in p for p in problems(cyc))


def test_builder_rejects_bad_shapes() -> None:
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    w = b.const(np.ones((7, 2), np.float32))
    with pytest.raises(ValueError, match="MatMul"):
        b.op("MatMul", x, w)


def test_a_const_owns_its_values_and_takes_a_handed_over_array_without_a_copy() -> None:
    from autofusion.graph.graph import handed_over

    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = Const(values)
    values[0, 0] = 99.0  # the caller's array: the constant kept a copy
    assert c.array[0, 0] == 0.0 and not c.array.flags.writeable
    with pytest.raises(ValueError):
        c.array[0, 0] = 1.0
    assert Const(c.array).array is c.array  # another constant's values are shared, not copied
    fresh = handed_over(np.ascontiguousarray(values.T))
    assert Const(fresh).array is fresh
    view = values[:, :2]  # read-only but not owning its data: copied
    view.flags.writeable = False
    assert not np.shares_memory(Const(view).array, values)
