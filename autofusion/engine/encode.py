"""Graphs as e-graph terms.

A tensor is an ``Expr``. ``(Op op attrs args arity)`` applies an op (attributes as canonical text,
inputs as a ``Cons`` list, and their count, so a pattern checks the count without naming the list's
``Nil``); ops with several outputs are read through ``(Proj op i)``. Leaves: graph
inputs ``(In id)``, named constants ``(Cst id)``, scalar constants ``(Num value dtype shape)`` and
small integer vectors ``(Vec text)`` (shapes, axes). Every term the engine creates has an integer
handle ``(Ref id)`` in its e-class, so a row of the serialized e-graph can be named again later.

Terms are not sent as one command each (egglog's per-command cost grows with the e-graph, so that
is quadratic): rows go into tab-separated tables that egglog reads with ``input``, and one
``build`` ruleset turns the rows into terms in a single linear pass.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autofusion.graph.graph import FrozenMap, Graph, freeze_attrs
from autofusion.ops.registry import OpRegistry

DECLARATIONS = """
(datatype*
  (Expr
    (Op String String Args i64)
    (Proj Expr i64)
    (In i64)
    (Cst i64)
    (Num f64 String String)
    (Vec String)
    (Ref i64))
  (Args (Nil) (Cons Expr Args) (ArgsFrom i64 i64)))
(relation in-class (String String))
(relation t-in (i64))
(relation t-cst (i64))
(relation t-num (i64 f64 String String))
(relation t-vec (i64 String))
(relation t-op (i64 String String i64))
(relation t-arg (i64 i64 i64))
(relation t-proj (i64 i64 i64))
(relation t-union (i64 i64))
(ruleset build)
(rule ((t-in id)) ((union (Ref id) (In id))) :ruleset build)
(rule ((t-cst id)) ((union (Ref id) (Cst id))) :ruleset build)
(rule ((t-num id v d s)) ((union (Ref id) (Num v d s))) :ruleset build)
(rule ((t-vec id s)) ((union (Ref id) (Vec s))) :ruleset build)
(rule ((t-op id op at n)) ((union (Ref id) (Op op at (ArgsFrom id 0) n)) (union (ArgsFrom id n) (Nil))) :ruleset build)
(rule ((t-op id op at n) (t-arg id k c)) ((union (ArgsFrom id k) (Cons (Ref c) (ArgsFrom id (+ k 1))))) :ruleset build)
(rule ((t-proj id op k)) ((union (Ref id) (Proj (Ref op) k))) :ruleset build)
(rule ((t-union a b)) ((union (Ref a) (Ref b))) :ruleset build)
"""

TABLES = ("t-in", "t-cst", "t-num", "t-vec", "t-op", "t-arg", "t-proj", "t-union")

# integer constants up to this many elements become Vec leaves so literal patterns can match them
SMALL_VECTOR = 16


def attrs_text(attrs: Mapping[str, Any]) -> str:
    """Canonical text of attributes: sorted ``name=json`` joined by ``;`` (ASCII, no tabs)."""
    return ";".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(attrs.items()))


def parse_attrs(text: str) -> FrozenMap[str, Any]:
    if not text:
        return FrozenMap()
    out = {}
    for part in text.split(";"):
        name, _, value = part.partition("=")
        out[name] = json.loads(value)
    return freeze_attrs(out)


def quote(text: str) -> str:
    """An egglog string literal (egglog reads UTF-8 but not JSON's \\u escapes)."""
    return json.dumps(text, ensure_ascii=False)


def f64(value: float) -> str:
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"


def uniform_value(array: np.ndarray) -> float | None:
    """The single value of a constant whose elements are all equal (None otherwise)."""
    if array.size == 0 or array.dtype == np.bool_ or array.dtype == object:  # object: symbolic sizes
        return None
    flat = array.reshape(-1)
    first = flat[0]
    sample = flat[:: max(1, flat.size // 64)]
    if not np.all(sample == first) or not np.all(flat == first):  # the sample rejects weights fast
        return None
    v = float(first)
    return v if math.isfinite(v) else None


def multi_output(registry: OpRegistry, op: str) -> bool:
    opdef = registry.get(op)
    return opdef is None or opdef.num_outputs != 1


class Encoder:
    """Collects table rows for new terms and loads them into an e-graph in one pass."""

    def __init__(self, registry: OpRegistry) -> None:
        self.registry = registry
        self.handle_of: dict[str, int] = {}  # tensor name -> handle
        self.leaf_name: dict[int, str] = {}  # In/Cst handle -> tensor name
        self._rows: dict[str, list[str]] = {t: [] for t in TABLES}
        self._nums: set[int] = set()  # handles of scalar constants (Num leaves)
        self._next = 0
        self._batch = 0

    def new_id(self) -> int:
        self._next += 1
        return self._next

    # -- rows -----------------------------------------------------------------------------------

    def add_in(self, name: str) -> int:
        h = self.new_id()
        self._rows["t-in"].append(f"{h}")
        self.leaf_name[h] = name
        return h

    def add_cst(self, name: str, array: np.ndarray) -> int:
        h = self.new_id()
        self._rows["t-cst"].append(f"{h}")
        self.leaf_name[h] = name
        v = uniform_value(array)
        if v is not None:
            shape = json.dumps(list(array.shape), separators=(",", ":"))
            self._rows["t-num"].append(f"{h}\t{f64(v)}\t{array.dtype}\t{shape}")
            self._nums.add(h)
        if array.ndim <= 1 and array.size <= SMALL_VECTOR and np.issubdtype(array.dtype, np.integer):
            self._rows["t-vec"].append(f"{h}\t{vec_text(array)}")
        return h

    def add_num(self, value: float, dtype: str, shape: Sequence[int] = ()) -> int:
        h = self.new_id()
        self._rows["t-num"].append(f"{h}\t{f64(value)}\t{dtype}\t{json.dumps(list(shape), separators=(',', ':'))}")
        self._nums.add(h)
        return h

    def add_vec(self, array: np.ndarray) -> int:
        h = self.new_id()
        self._rows["t-vec"].append(f"{h}\t{vec_text(array)}")
        return h

    def add_op(self, op: str, attrs: Mapping[str, Any], args: Sequence[int]) -> int:
        opdef = self.registry.get(op)
        if (opdef is not None and opdef.commutative and len(args) == 2 and args[0] in self._nums
                and args[1] not in self._nums):
            args = [args[1], args[0]]  # a scalar constant second, where patterns look for it (match.py)
        h = self.new_id()
        self._rows["t-op"].append(f"{h}\t{op}\t{attrs_text(attrs)}\t{len(args)}")
        for k, a in enumerate(args):
            self._rows["t-arg"].append(f"{h}\t{k}\t{a}")
        return h

    def add_proj(self, op_handle: int, index: int) -> int:
        h = self.new_id()
        self._rows["t-proj"].append(f"{h}\t{op_handle}\t{index}")
        return h

    def add_union(self, a: int, b: int) -> None:
        self._rows["t-union"].append(f"{a}\t{b}")

    def pending(self) -> bool:
        return any(self._rows.values())

    def program(self, workdir: str) -> str:
        """Commands that load every pending row (written to ``workdir``) and build the terms
        (``DECLARATIONS`` must have run in the session first)."""
        parts = []
        self._batch += 1
        for table, rows in self._rows.items():
            if not rows:
                continue
            path = os.path.join(workdir, f"{self._batch}-{table}.tsv")
            with open(path, "w", encoding="ascii") as f:
                f.write("\n".join(rows) + "\n")
            parts.append(f"(input {table} {quote(path)})")
            rows.clear()
        parts.append("(run build 1)")
        return "\n".join(parts)

    # -- graphs ---------------------------------------------------------------------------------

    def graph(self, graph: Graph) -> None:
        for name in graph.inputs:
            self.handle_of[name] = self.add_in(name)
        for name, const in graph.constants.items():
            self.handle_of[name] = self.add_cst(name, const.array)
        for node in graph.nodes:
            args = [self.handle_of[i] if i else self._absent() for i in node.inputs]
            op = self.add_op(node.op, node.attrs, args)
            if multi_output(self.registry, node.op):
                for k, out in enumerate(node.outputs):
                    if out:
                        self.handle_of[out] = self.add_proj(op, k)
            else:
                self.handle_of[node.outputs[0]] = op

    def _absent(self) -> int:
        """An omitted optional input: one shared leaf."""
        h = self.handle_of.get("")
        if h is None:
            h = self.add_in("")
            self.handle_of[""] = h
        return h


def vec_text(array: np.ndarray) -> str:
    """``[1,2]`` for a vector, ``1`` for a scalar: equal text, equal shape (a Slice takes ``[0]``, not ``0``)."""
    array = np.asarray(array)
    if array.ndim == 0:
        return json.dumps(int(array))
    return json.dumps([int(x) for x in array.reshape(-1)], separators=(",", ":"))


class Workdir:
    """A private temporary directory for table files, removed when closed."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="autofusion-egraph-")
        self.path = self._tmp.name

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> Workdir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
