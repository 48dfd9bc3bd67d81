"""Numerical verification of rewrites, and building fusion patterns as graphs."""

from __future__ import annotations

import numpy as np

from autofusion.dsl import analyze_text
from autofusion.dsl.instantiate import Env, GraphMaker, Trial
from autofusion.dsl.ir import Var
from autofusion.ir import run_graph
from autofusion.ops import default_registry


def _diags(text: str) -> list:
    return analyze_text(text, "v.fuse", verify=True).diagnostics


def test_a_wrong_rewrite_is_rejected_with_a_counterexample() -> None:
    (d,) = _diags("rewrite swap: Sub(a, b) => Sub(b, a)\n")
    assert d.code == "F022" and d.span.line == 1
    assert d.data["max_error"] > 0.1
    assert set(d.data["inputs"]) == {"a", "b"} and all(s.startswith("float32[") for s in d.data["inputs"].values())
    assert any(n.startswith("counterexample inputs: a: float32[") for n in d.notes)
    assert any("left" in n and "right" in n for n in d.notes)


def test_correct_rewrites_pass() -> None:
    text = '''
rewrite sub: Sub(a, b) => Add(a, Neg(b))
rewrite gelu: Mul(x, Mul(0.5, Add(Erf(Div(x, 1.4142135623730951)), 1.0))) => Gelu(x)
rewrite softmax: Div(Exp(Sub(x, ReduceMax(x, axes=[-1]))), ReduceSum(Exp(Sub(x, ReduceMax(x, axes=[-1]))), axes=[-1]))
    => Softmax(x, axis=-1)
rewrite leaky: LeakyRelu(x, alpha=a) => Max(x, Mul(x, a)) where a >= 0 and a <= 1
rewrite mm_assoc: MatMul(MatMul(a, b), c) => MatMul(a, MatMul(b, c))
'''
    assert _diags(text) == []


def test_rules_that_only_hold_for_positive_inputs_fail() -> None:
    codes = [(d.code, d.span.line) for d in _diags("rewrite r: Relu(x) => x\nrewrite s: Sqrt(Mul(x, x)) => x\n")]
    assert codes == [("F022", 1), ("F022", 2)]


def test_shape_changes_and_ill_typed_right_sides_are_mismatches() -> None:
    text = ("rewrite keep: ReduceSum(x, axes=[-1]) => ReduceSum(x, axes=[-1], keepdims=0)\n"
            "rewrite typed: Relu(x) => MatMul(x, x) where rank(x) == 1\n"
            "rewrite out_of_range: Relu(x) => LeakyRelu(x, alpha=a)\n")
    diags = [d for d in _diags(text) if d.code == "F022"]
    assert [d.span.line for d in diags] == [1, 2]
    assert "right side gives" in diags[0].message or "float32[" in diags[0].message


def test_attribute_guards_select_the_values_tried() -> None:
    ok = "rewrite leaky: LeakyRelu(x, alpha=a) => Max(x, Mul(x, a)) where a >= 0 and a <= 1\n"
    wrong = "rewrite leaky: LeakyRelu(x, alpha=a) => Max(x, Mul(x, a)) where a > 1\n"
    assert _diags(ok) == []
    (d,) = _diags(wrong)
    assert d.code == "F022" and d.data["attributes"]["a"] > 1


def test_constness_guards_make_constants_and_bn_folding_verifies() -> None:
    text = '''
pattern k(s, v, e) = Div(s, Sqrt(Add(v, e)))
rewrite fold: BatchNormalization(Conv(x, w), s, beta, m, v, epsilon=e)
    => Conv(x, Mul(w, Reshape(k(s, v, e), [-1, 1, 1, 1])), Sub(beta, Mul(m, k(s, v, e))))
    where const(w) and const(s) and const(beta) and const(m) and const(v) and rank(w) == 4
rewrite wrong_fold: BatchNormalization(Conv(x, w), s, beta, m, v, epsilon=_)
    => Conv(x, Mul(w, Reshape(s, [-1, 1, 1, 1])), Sub(beta, m))
    where const(w) and const(s) and const(beta) and const(m) and const(v) and rank(w) == 4
'''
    diags = _diags(text)
    assert [(d.code, d.span.line) for d in diags] == [("F022", 6)]
    assert "w: float32[" in diags[0].notes[0] and "const" in diags[0].notes[0]


def test_unreachable_guards_leave_a_rewrite_unverified() -> None:
    (d,) = _diags("rewrite r: Relu(x) => Relu(Relu(x)) where numel(x) == 1000003\n")[-1:]
    assert d.code == "F023"


def test_verification_is_deterministic() -> None:
    text = "rewrite swap: Sub(a, b) => Sub(b, a)\nrewrite r: Relu(x) => x\n"
    first = [(d.code, d.message, d.notes) for d in _diags(text)]
    assert first == [(d.code, d.message, d.notes) for d in _diags(text)]


def test_fusion_patterns_are_built_and_loops_keep_their_types() -> None:
    good = '''
fuse lin: MatMul(x, w) -> Add(b) -> Gelu -> template "gemm_epilogue"
fuse br: branch s = Add(x, y) { LayerNormalization(s, g, b, ...), Relu(s), s } -> template "multi_output"
fuse rnn: loop (h) { h = Tanh(Add(MatMul(x[t], w), MatMul(h, u))) } -> template "lstm_scan"
'''
    assert _diags(good) == []
    shrinking = 'fuse bad: loop (h) { h = ReduceSum(h, axes=[-1], keepdims=0) } -> template "lstm_scan"\n'
    (d,) = _diags(shrinking)
    assert d.code == "F023" and "carried" in d.message


def test_graph_maker_builds_runnable_graphs_with_shared_bindings() -> None:
    registry = default_registry()
    rules = analyze_text("rewrite r: Add(MatMul(x, w), b) => Add(b, MatMul(x, w)) where const(w)\n", "m.fuse",
                         verify=False).program.ruleset
    (rw,) = rules.rewrites
    trial = Trial(np.random.default_rng(0), base=3, const_vars=frozenset({"w"}))
    env = Env()
    left = GraphMaker(registry, rules.ops_of, trial, env)
    out = left.build(rw.lhs)
    graph = left.graph([out])
    assert "v_w" in graph.constants and "v_x" in graph.inputs  # const(w) makes w a constant
    right = GraphMaker(registry, rules.ops_of, trial, env, allow_fresh=False)
    r_out = right.build(rw.rhs)
    feeds = left.feeds()
    np.testing.assert_allclose(run_graph(graph, feeds)[out], run_graph(right.graph([r_out]), feeds)[r_out],
                               rtol=1e-6)
    assert env.vars["x"].type.shape[-1] == env.vars["w"].type.shape[0]
    assert isinstance(rw.lhs.args[0].args[0], Var)


def _registry_with(op: str, infer: object, reference: object) -> object:
    from autofusion.ops.registry import OpClass, OpDef

    return default_registry().extended([OpDef(op, OpClass.POINTWISE, ("X",), infer, reference)])  # type: ignore[arg-type]


def test_a_rewrite_whose_right_side_needs_fixed_sizes_fails_with_symbolic_ones() -> None:
    """The engine rewrites models with dynamic axes too: an op that infers its type from fixed sizes
    only (int() of each) type-checks at every trial's sizes but not over symbols."""
    from autofusion.graph.types import TensorType

    registry = _registry_with("Twice", lambda ctx: (TensorType(tuple(int(d) for d in ctx.type(0).shape),
                                                               ctx.type(0).dtype),),
                              lambda xs, a: (xs[0] * 2,))
    (d,) = analyze_text("rewrite twice: Add(x, x) => Twice(x)\n", "v.fuse", registry=registry).diagnostics  # type: ignore[arg-type]
    assert d.code == "F022" and "does not hold when sizes are symbolic" in d.message
    assert "does not type-check with symbolic sizes" in d.message
    assert any(n.startswith("symbolic inputs: x: float32[s") for n in d.notes)


def test_symbolic_sizes_are_drawn_beyond_the_trials_sizes() -> None:
    """A right side that is only right for short rows holds at every trial's sizes; the sizes drawn
    for the symbols find where it does not."""
    registry = _registry_with("ShortTwice", lambda ctx: (ctx.type(0),),
                              lambda xs, a: (xs[0] * (2 if xs[0].shape[-1] <= 8 else 3),))
    text = "rewrite twice: Add(x, x) => ShortTwice(x)\n"
    (d,) = analyze_text(text, "v.fuse", registry=registry).diagnostics  # type: ignore[arg-type]
    assert d.code == "F022" and "when sizes are symbolic: the sides differ" in d.message
    sizes = d.data["sizes"]
    assert max(sizes.values()) > 8 and any(n.startswith("at sizes s") for n in d.notes)
    fixed = _registry_with("ShortTwice", lambda ctx: (ctx.type(0),), lambda xs, a: (xs[0] * 2,))
    assert analyze_text(text, "v.fuse", registry=fixed).diagnostics == []  # type: ignore[arg-type]


def test_a_right_side_that_fails_to_run_at_drawn_sizes_says_so() -> None:
    def short_only(xs: list, a: object) -> tuple:
        if xs[0].shape[-1] > 8:
            raise ValueError("rows longer than 8 are not supported")
        return (xs[0] * 2,)

    registry = _registry_with("ShortOnly", lambda ctx: (ctx.type(0),), short_only)
    (d,) = analyze_text("rewrite twice: Add(x, x) => ShortOnly(x)\n", "v.fuse", registry=registry).diagnostics  # type: ignore[arg-type]
    assert d.code == "F022" and "when sizes are symbolic: the right side fails to run" in d.message
    assert "rows longer than 8" in d.message and max(d.data["sizes"].values()) > 8


def test_a_reshape_s_shape_is_drawn_from_real_reshapes_of_its_input() -> None:
    # the target shape is an int64 constant that reshapes the input (merged, split, reversed axes),
    # not random floats that only a one-element input could take
    text = ("rewrite wrong_order: Reshape(Transpose(x, perm=[1, 0]), s) => Reshape(x, s) where const(s)\n"
            "rewrite pointwise: Relu(Reshape(x, s)) => Reshape(Relu(x), s) where const(s)\n"
            "rewrite same_shape: Expand(x, s) as e => x where const(s) and shape(e) == shape(x)\n")
    (d,) = _diags(text)
    assert d.code == "F022" and d.span.line == 1
    assert d.data["inputs"]["x"].startswith("float32[") and d.data["inputs"]["s"].startswith("int64[")
    assert any("s: int64[" in n and "const = [" in n for n in d.notes)


def test_a_guard_on_a_chain_of_reshapes_is_met_and_each_target_is_tried() -> None:
    # sum(x.reshape(-1, n), axis 0) flattened is x's sum over its two leading axes only where the
    # Reshape merges those (dim(r, 1) == dim(x, 2)); without that guard, merging the last two is a
    # counterexample. The ranks the guard asks of r and e are met, and a wrong rule is caught under
    # any name (each name draws its own trials)
    rule = ("rewrite {name}:\n    Reshape(ReduceSum(Reshape(x, s) as r, [0], keepdims=1), t) as e\n"
            "    => ReduceSum(x, [0, 1], keepdims=0)\n    where rank(x) == 3 and rank(r) == 2{extra} and rank(e) == 1\n")
    for name in ("bias_sum", "merged_rows", "wrong_one", "third_try", "seventh"):
        assert _diags(rule.format(name=name, extra=" and dim(r, 1) == dim(x, 2)")) == []
        (d,) = _diags(rule.format(name=name, extra=""))
        assert d.code == "F022", d


def test_a_float_shape_input_is_no_shape() -> None:
    from autofusion.graph.graph import Const, Node
    from autofusion.graph.types import DType, TensorType
    from autofusion.ir.infer import infer_node
    from autofusion.ops.registry import ShapeError

    registry = default_registry()
    x = {"x": TensorType((2, 6), DType.FLOAT32)}
    for op in ("Reshape", "Expand", "Tile"):
        node = Node(op, ("x", "s"), ("y",), name="n")
        for bad in (np.array([3.0, 4.0], np.float32), np.array(12, np.int64)):
            try:
                infer_node(node, {**x, "s": TensorType.of(bad)}, {"s": Const(bad)}, registry)
            except ShapeError as e:
                assert "1-D integer tensor" in str(e)
            else:
                raise AssertionError(f"{op} took {bad!r} as a shape")


def test_every_example_value_of_an_op_type_checks() -> None:
    from autofusion.graph.graph import Const, Node
    from autofusion.graph.types import DType, TensorType
    from autofusion.ir.infer import infer_node

    registry = default_registry()
    ops = [d for d in registry if d.example_values is not None]
    assert {d.name for d in ops} >= {"Reshape", "Expand", "Tile"}
    for opdef in ops:
        for shape in ((), (5,), (4, 6), (3, 1, 8), (2, 3, 4, 5)):
            data = TensorType(shape, DType.FLOAT32)
            values = opdef.example_values(1, [data, None])
            assert len(values) >= (2 if shape else 1) and all(v.dtype == np.int64 for v in values)
            for v in values:
                node = Node(opdef.name, ("x", "s"), ("y",), name="n")
                infer_node(node, {"x": data, "s": TensorType.of(v)}, {"s": Const(v)}, registry)
