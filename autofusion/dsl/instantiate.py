"""Building rule terms as IR graphs, with input shapes found by a small search.

Variables become graph inputs (or constants, where a guard asks for ``const``), literals become
constants, ops become nodes. Shapes are not written in rules, so :class:`GraphMaker` picks them
while it builds, bottom-up: the first time a variable appears as an input of an op, candidate
ranks (all dimensions equal to the trial's base size, or, in a perturbed trial, sizes mixed with
other values and 1s for broadcasting) are tried until the registry's shape inference accepts the
op. A trial that cannot place an op fails with :class:`NoInstance`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autofusion.dsl import guards as g
from autofusion.dsl.ir import Literal, OpTerm, Term, Var, walk
from autofusion.graph.graph import Const, Graph, Node, freeze_attrs
from autofusion.graph.types import DType, TensorType
from autofusion.ir.infer import infer_node
from autofusion.ops.registry import OpDef, OpRegistry, ShapeError

MAX_RANK = 4
CANDIDATES_PER_OP = 48
MAX_ELEMENTS = 1 << 20  # a rule whose instance would be huge (ConstantOfShape([10**6, 10**6])) is not run


class NoInstance(Exception):
    """This trial could not build the terms (no accepted shapes, or an unbound name)."""


@dataclass
class Trial:
    """The choices of one attempt: base size, mode, dtype, which variables are constants."""

    rng: np.random.Generator
    base: int = 4
    perturbed: bool = False
    dtype: DType = DType.FLOAT32
    const_vars: frozenset[str] = frozenset()
    rank_hints: Mapping[str, int] = field(default_factory=dict)
    positive: bool = True  # values in [0.5, 2] (safe for Sqrt, Log, Div) or standard normal
    shuffle: bool = False


@dataclass
class Binding:
    """What a variable is bound to, shared by the two sides of a rewrite."""

    tensor: str
    type: TensorType
    value: np.ndarray
    const: bool


@dataclass
class Env:
    """Variables, attribute variables and captures bound so far."""

    vars: dict[str, Binding] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    captures: dict[str, tuple[str, Node]] = field(default_factory=dict)

    def bindings(self, types: Mapping[str, TensorType], registry: OpRegistry) -> g.Bindings:
        """What a guard sees: types of variables and captures, constness, attributes."""
        t = {n: types.get(b.tensor, b.type) for n, b in self.vars.items()}  # symbolic sizes where given
        node_attrs: dict[str, dict[str, Any]] = {}
        for name, (tensor, node) in self.captures.items():
            t[name] = types[tensor]
            opdef = registry.get(node.op)
            defaults = dict(opdef.attrs) if opdef is not None else {}
            node_attrs[name] = {**defaults, **dict(node.attrs)}
        consts = frozenset(n for n, b in self.vars.items() if b.const)
        return g.Bindings(types=t, consts=consts, attrs=node_attrs, values=dict(self.attrs))


def _valued_slots(opdef: OpDef, slots: list[Any], fresh: list[Var]) -> dict[str, int]:
    """The fresh variables that fill an input the op must know the value of and has example values
    for (Reshape's shape): they get those values, not random ones. By name, with the slot."""
    if opdef.example_values is None:
        return {}
    names = {v.name for v in fresh}
    return {s.name: i for i, s in enumerate(slots) if isinstance(s, Var) and s.name in names
            and i in opdef.const_inputs}


def _key(t: OpTerm) -> OpTerm:
    return replace(t, capture=None, output=0)


def max_outputs(terms: list[Term]) -> dict[OpTerm, int]:
    """For each node term, how many outputs the terms use (the highest index + 1)."""
    out: dict[OpTerm, int] = {}
    for root in terms:
        for s in walk(root):
            if isinstance(s, OpTerm):
                k = _key(s)
                out[k] = max(out.get(k, 1), s.output + 1)
    return out


class GraphMaker:
    """Builds terms into one graph for one trial; ``env`` may be shared with another side."""

    def __init__(self, registry: OpRegistry, ops_of: Callable[[str], frozenset[str]], trial: Trial,
                 env: Env, allow_fresh: bool = True, outputs: dict[OpTerm, int] | None = None) -> None:
        self.registry = registry
        self.ops_of = ops_of
        self.trial = trial
        self.env = env
        self.allow_fresh = allow_fresh
        self.outputs = outputs or {}
        self.types: dict[str, TensorType] = {}
        self.consts: dict[str, Const] = {}
        self.inputs: list[str] = []
        self.nodes: list[Node] = []
        self.memo: dict[OpTerm, tuple[str, ...]] = {}
        self.chosen_ops: dict[OpTerm, str] = {}
        self._pending: dict[str, Const] = {}
        self.counter = 0
        for b in env.vars.values():  # variables bound by the other side
            self._declare(b)

    # -- public ---------------------------------------------------------------------------------

    def build(self, term: Term) -> str:
        """The tensor holding ``term``'s value."""
        if isinstance(term, OpTerm):
            return self.op(term)
        if isinstance(term, Var):
            b = self.env.vars.get(term.name)
            if b is None:
                if term.name in self.env.attrs:
                    return self._scalar(self.env.attrs[term.name], self.trial.dtype)
                raise NoInstance(f"{term.name} is unbound")
            return b.tensor
        if isinstance(term, Literal):
            return self._literal(term, self.trial.dtype)
        raise NoInstance(f"cannot build {term!r}")

    def bind(self, name: str, tensor: str) -> None:
        """Make variable ``name`` stand for an already built tensor (a branch's shared value)."""
        arr = np.zeros(self.types[tensor].shape, self.types[tensor].dtype.numpy)
        self.env.vars[name] = Binding(tensor, self.types[tensor], arr, tensor in self.consts)

    def graph(self, outputs: list[str]) -> Graph:
        from autofusion.graph.graph import FrozenMap

        used = {i for n in self.nodes for i in n.inputs} | set(outputs)
        inputs = tuple(i for i in self.inputs if i in used)
        consts = {k: v for k, v in self.consts.items() if k in used}
        types = {k: v for k, v in self.types.items() if k in used or k in inputs
                 or any(k in n.outputs for n in self.nodes)}
        return Graph("verify", inputs, tuple(outputs), tuple(self.nodes), FrozenMap(types), FrozenMap(consts))

    def feeds(self) -> dict[str, np.ndarray]:
        return {b.tensor: b.value for b in self.env.vars.values() if not b.const}

    # -- ops ------------------------------------------------------------------------------------

    def op(self, t: OpTerm) -> str:
        key = _key(t)
        if key not in self.memo:
            self.memo[key] = self._make_node(t, key)
        outs = self.memo[key]
        if t.output >= len(outs):
            raise NoInstance(f"{t.op} has no output {t.output}")
        if t.capture:
            node = next(n for n in self.nodes if outs[0] in n.outputs)
            self.env.captures[t.capture] = (outs[t.output], node)
        return outs[t.output]

    def _concrete(self, t: OpTerm, key: OpTerm) -> str:
        if t.op in self.registry:
            return t.op
        if key in self.chosen_ops:
            return self.chosen_ops[key]
        n = len(t.args)
        fits = sorted(o for o in self.ops_of(t.op) if o in self.registry
                      and (self.registry[o].max_inputs is None or n <= self.registry[o].max_inputs)  # type: ignore[operator]
                      and (t.open or n >= self.registry[o].min_inputs)
                      and all(m.name in self.registry[o].attrs for m in t.attrs))
        if not fits:
            raise NoInstance(f"no op of {t.op} fits")
        op = fits[int(self.trial.rng.integers(len(fits)))]
        self.chosen_ops[key] = op
        return op

    def _make_node(self, t: OpTerm, key: OpTerm) -> tuple[str, ...]:
        op = self._concrete(t, key)
        opdef = self.registry[op]
        slots: list[Any] = []  # a tensor name, or a pending Var/Literal
        for a in t.args:
            if isinstance(a, OpTerm):
                slots.append(self.op(a))
            elif isinstance(a, Var) and a.name in self.env.vars:
                slots.append(self.env.vars[a.name].tensor)
            elif isinstance(a, Var) and a.name in self.env.attrs:  # an attribute's value as an input
                value = self.env.attrs[a.name]
                if isinstance(value, (str, tuple, list)) or value is None:
                    raise NoInstance(f"attribute {a.name}={value!r} cannot be an input")
                slots.append(Literal(value))
            else:
                slots.append(a)
        if t.open:
            for _ in range(max(0, opdef.min_inputs - len(slots))):
                self.counter += 1
                slots.append(Var(f"_open{self.counter}"))
        attrs = {m.name: self._attr(m.name, m.value, opdef.attrs.get(m.name)) for m in t.attrs}
        attrs = {k: v for k, v in attrs.items() if v is not None}  # None: the attribute is absent
        n_out = opdef.num_outputs or self.outputs.get(key, 1)
        if opdef.num_outputs is None and "num_outputs" in opdef.attrs and "num_outputs" not in attrs:
            attrs["num_outputs"] = n_out  # ONNX's convention for ops whose output count is an attribute
        self.counter += 1
        name = f"n{self.counter}_{op.lower()}"
        outs = tuple(f"{name}_out{i}" for i in range(n_out))
        fresh = [s for s in dict.fromkeys(s for s in slots if isinstance(s, Var))]
        if fresh and not self.allow_fresh:
            raise NoInstance(f"{fresh[0].name} is unbound")
        valued = _valued_slots(opdef, slots, fresh)
        shaped = [v for v in fresh if v.name not in valued]
        # the rank a guard asks of this node (rank(r) == 2), met where example values can (a
        # Reshape's target): else a guard on a chain of Reshapes held in no trial of 32
        wanted = self.trial.rank_hints.get(t.capture) if t.capture and valued else None
        fallback = None
        for assignment, values in ((a, v) for a in self._assignments(shaped, slots)
                                   for v in self._example_values(opdef, slots, a, valued)):
            inputs, new_consts, new_types = self._materialize(slots, assignment, values)
            node = Node(op, tuple(inputs), outs, freeze_attrs(attrs), name)
            try:
                types = infer_node(node, {**self.types, **new_types},
                                   {**self.consts, **new_consts}, self.registry)
            except ShapeError:
                continue
            except Exception:  # an op's inference rejecting odd inputs in its own way: not an instance either
                continue
            if any(t.numel > MAX_ELEMENTS for t in types):
                raise NoInstance(f"{op} would produce more than {MAX_ELEMENTS} elements")
            chosen = ({**assignment, **{n: v.shape for n, v in values.items()}}, new_consts, new_types, node, types)
            if wanted is not None and types and types[0].rank != wanted:
                fallback = fallback or chosen
                continue
            return self._add_node(outs, *chosen)
        if fallback is not None:
            return self._add_node(outs, *fallback)
        raise NoInstance(f"no input shapes make {op} type-check")

    def _add_node(self, outs: tuple[str, ...], shapes: dict[str, tuple[int, ...]], consts: dict[str, Const],
                  types: dict[str, TensorType], node: Node, out_types: Sequence[TensorType]) -> tuple[str, ...]:
        self._commit(shapes, consts, types)
        for o, ty in zip(outs, out_types):
            self.types[o] = ty
        self.nodes.append(node)
        return outs

    def _attr(self, name: str, value: Any, default: Any) -> Any:
        if not isinstance(value, Var):
            return value
        if value.name in self.env.attrs:
            return self.env.attrs[value.name]
        b = self.env.vars.get(value.name)
        if b is not None:  # an attribute taking a constant scalar tensor's value
            if b.value.size != 1:
                raise NoInstance(f"{value.name} is not a scalar")
            v = b.value.reshape(-1)[0].item()
            return float(v) if isinstance(default, float) or isinstance(v, float) else v
        if not self.allow_fresh:
            raise NoInstance(f"{value.name} is unbound")
        chosen = self._pick_attr(default)
        self.env.attrs[value.name] = chosen
        return chosen

    def _pick_attr(self, default: Any) -> Any:
        options: list[Any] = [default]
        if isinstance(default, int):
            options += [0, 1, -1]
        elif isinstance(default, float):
            options += [0.5, 2.0]
        if not self.trial.shuffle:
            return options[0]
        return options[int(self.trial.rng.integers(len(options)))]

    # -- shapes ---------------------------------------------------------------------------------

    def _assignments(self, fresh: list[Var], slots: list[Any]) -> Iterator[dict[str, tuple[int, ...]]]:
        if not fresh:
            yield {}
            return
        known = [self.types[s] for s in slots if isinstance(s, str) and s in self.types and s not in self.consts]
        r0 = max((t.rank for t in known), default=2)
        if self.trial.perturbed:
            yield from self._perturbed(fresh, r0, [d for t in known for d in t.shape])
            return
        limit = CANDIDATES_PER_OP if len(fresh) > 3 else 200
        for count, ranks in enumerate(self._rank_tuples(fresh, r0)):
            if count >= limit:
                return
            yield {v.name: (self.trial.base,) * r for v, r in zip(fresh, ranks)}

    def _perturbed(self, fresh: list[Var], r0: int, seen: list[int]) -> Iterator[dict[str, tuple[int, ...]]]:
        """Mixed sizes: drawn from the sizes the op's other inputs have, the base size, and 1."""
        rng = self.trial.rng
        n = self.trial.base
        pool = [*seen, n, n + 1, 1] if seen else [n, n, n + 1, 1, 2 * n]
        ranks = [self.trial.rank_hints.get(v.name, r0) for v in fresh]

        def draw(rank: int) -> tuple[int, ...]:
            return tuple(int(pool[int(rng.integers(len(pool)))]) for _ in range(rank))

        for attempt in range(CANDIDATES_PER_OP):
            if attempt % 2:  # one shape for all fresh inputs of a rank (per-channel parameters)
                shared = {r: draw(r) for r in set(ranks)}
                yield {v.name: shared[r] for v, r in zip(fresh, ranks)}
            else:
                yield {v.name: draw(r) for v, r in zip(fresh, ranks)}

    def _rank_tuples(self, fresh: list[Var], r0: int) -> Iterator[tuple[int, ...]]:
        k = len(fresh)
        hinted = [self.trial.rank_hints.get(v.name) for v in fresh]
        if any(h is not None for h in hinted):
            yield tuple(h if h is not None else r0 for h in hinted)
        order = [r0, *[r for r in (2, 1, 3, 4, 0) if r != r0]]
        heads = [(r,) * k for r in order]
        if self.trial.shuffle:
            self.trial.rng.shuffle(heads)  # type: ignore[arg-type]
        yield from heads
        if k <= 3:  # every combination: at most 125, and a failed inference is cheap
            rest = list(itertools.product(range(MAX_RANK + 1), repeat=k))
            if self.trial.shuffle:
                self.trial.rng.shuffle(rest)  # type: ignore[arg-type]
            yield from rest
        else:
            for _ in range(CANDIDATES_PER_OP):
                yield tuple(int(r) for r in self.trial.rng.integers(0, MAX_RANK + 1, size=k))

    def _example_values(self, opdef: OpDef, slots: list[Any], shapes: Mapping[str, tuple[int, ...]],
                        valued: Mapping[str, int]) -> Iterator[dict[str, np.ndarray]]:
        """Values for the variables in ``valued`` (slot by name) from the op's example values for
        the other inputs' types (in a shuffled trial, in a drawn order); one empty choice if none."""
        if not valued:
            yield {}
            return
        assert opdef.example_values is not None
        types: list[TensorType | None] = []
        for slot in slots:
            if isinstance(slot, str):
                types.append(self.types.get(slot))
            elif isinstance(slot, Var) and slot.name in shapes:
                types.append(TensorType(shapes[slot.name], self.trial.dtype))
            else:
                types.append(None)
        options = [[(name, v) for v in opdef.example_values(index, types)] for name, index in valued.items()]
        choices = list(itertools.product(*options))
        if self.trial.shuffle:
            order = self.trial.rng.permutation(len(choices))
            choices = [choices[i] for i in order]
        for choice in choices:
            yield dict(choice)

    def _materialize(self, slots: list[Any], shapes: Mapping[str, tuple[int, ...]],
                     values: Mapping[str, np.ndarray] | None = None) -> tuple[
            list[str], dict[str, Const], dict[str, TensorType]]:
        ref_dtype = self._reference_dtype(slots)
        inputs: list[str] = []
        consts: dict[str, Const] = {}
        types: dict[str, TensorType] = {}
        for s in slots:
            if isinstance(s, str):
                inputs.append(s)
            elif isinstance(s, Var) and values and s.name in values:  # an input the op needs the value of
                tensor = "v_" + s.name
                consts[tensor] = Const(values[s.name])
                types[tensor] = TensorType.of(values[s.name])
                inputs.append(tensor)
            elif isinstance(s, Var):
                tensor = "v_" + s.name
                if tensor not in types:
                    t = TensorType(shapes[s.name], self.trial.dtype)
                    types[tensor] = t
                    if s.name in self.trial.const_vars:
                        consts[tensor] = Const(self._values(t))
                inputs.append(tensor)
            else:
                name = self._literal(s, ref_dtype, commit=False)
                consts[name] = self._pending.pop(name)
                types[name] = consts[name].type
                inputs.append(name)
        return inputs, consts, types

    def _reference_dtype(self, slots: list[Any]) -> DType:
        for s in slots:
            if isinstance(s, str) and s in self.types:
                return self.types[s].dtype
            if isinstance(s, Var):
                return self.trial.dtype
        return self.trial.dtype

    def _commit(self, shapes: dict[str, tuple[int, ...]], consts: dict[str, Const],
                types: dict[str, TensorType]) -> None:
        for name, c in consts.items():
            self.consts[name] = c
        for name, t in types.items():
            self.types[name] = t
        for var, _shape in shapes.items():
            tensor = "v_" + var
            t = types[tensor]
            if tensor in consts:
                b = Binding(tensor, t, consts[tensor].array, True)
            else:
                b = Binding(tensor, t, self._values(t), False)
                self.inputs.append(tensor)
            self.env.vars[var] = b

    def _declare(self, b: Binding) -> None:
        self.types[b.tensor] = b.type
        if b.const:
            self.consts[b.tensor] = Const(b.value)
        else:
            self.inputs.append(b.tensor)

    # -- values ---------------------------------------------------------------------------------

    def _literal(self, lit: Literal, dtype: DType, commit: bool = True) -> str:
        value = lit.value
        if isinstance(value, tuple):
            ints = all(isinstance(v, int) for v in value)
            arr = np.array(value, dtype=np.int64 if ints else dtype.numpy)
        else:
            arr = np.array(value, dtype=dtype.numpy if dtype.is_float or isinstance(value, int) else np.float32)
        self.counter += 1
        name = f"lit{self.counter}"
        if commit:
            self.consts[name] = Const(arr)
            self.types[name] = self.consts[name].type
        else:
            self._pending[name] = Const(arr)
        return name

    def _scalar(self, value: Any, dtype: DType) -> str:
        if isinstance(value, (list, tuple)):
            raise NoInstance("a list attribute cannot be an input")
        if isinstance(value, str):
            raise NoInstance("a string attribute cannot be an input")
        return self._literal(Literal(value), dtype)

    def _values(self, t: TensorType) -> np.ndarray:
        rng = self.trial.rng
        if t.dtype == DType.BOOL:
            return rng.random(t.shape) < 0.5
        if not t.dtype.is_float:
            return rng.integers(1, 5, size=t.shape).astype(t.dtype.numpy)
        if self.trial.positive:
            return rng.uniform(0.5, 2.0, size=t.shape).astype(t.dtype.numpy)
        return rng.standard_normal(t.shape).astype(t.dtype.numpy)
