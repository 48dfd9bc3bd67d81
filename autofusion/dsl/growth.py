"""Rewrites that can make saturation grow without bound (F015 warnings).

Three shapes are flagged: a right side containing an instance of its own left side (each
application creates a new match), commutativity together with associativity of one op (the
e-graph then holds every bracketing and order of a sum: exponentially many), and a two-way rewrite
whose sides use different ops (each direction feeds the other's matches).
"""

from __future__ import annotations

from autofusion.dsl.diagnostics import Sink
from autofusion.dsl.ir import OpTerm, Rewrite, Term, Var, ops_used, unparse
from autofusion.dsl.match import instance, proper_subterms


def _ops_of(name: str) -> frozenset[str]:
    return frozenset({name})


def _self_feeding(lhs: Term, rhs: Term) -> Term | None:
    for sub in proper_subterms(rhs):
        if isinstance(sub, OpTerm) and instance(lhs, sub, _ops_of) is not None:
            return sub
    return None


def _commutes(rw: Rewrite) -> str | None:
    lhs, rhs = rw.lhs, rw.rhs
    if (isinstance(lhs, OpTerm) and isinstance(rhs, OpTerm) and lhs.op == rhs.op and len(lhs.args) == 2
            and len(rhs.args) == 2 and all(isinstance(a, Var) for a in (*lhs.args, *rhs.args))
            and lhs.args[0] != lhs.args[1] and lhs.args == rhs.args[::-1]):
        return lhs.op
    return None


def _associates(rw: Rewrite) -> str | None:
    def shape(t: Term) -> tuple[str, str] | None:
        if not isinstance(t, OpTerm) or len(t.args) != 2:
            return None
        a, b = t.args
        if isinstance(a, OpTerm) and a.op == t.op and isinstance(b, Var) and len(a.args) == 2:
            return (t.op, "left")
        if isinstance(b, OpTerm) and b.op == t.op and isinstance(a, Var) and len(b.args) == 2:
            return (t.op, "right")
        return None

    left, right = shape(rw.lhs), shape(rw.rhs)
    if left and right and left[0] == right[0] and left[1] != right[1]:
        return left[0]
    return None


def check_growth(rewrites: list[Rewrite], sink: Sink) -> None:
    commutative: dict[str, Rewrite] = {}
    associative: dict[str, Rewrite] = {}
    for rw in rewrites:
        directions = [(rw.lhs, rw.rhs)] + ([(rw.rhs, rw.lhs)] if rw.bidirectional else [])
        for lhs, rhs in directions:
            fed = _self_feeding(lhs, rhs)
            if fed is not None:
                sink.add("F015", f"rewrite {rw.name}: the built side contains {unparse(fed)}, an instance of "
                         f"the matched side {unparse(lhs)}; every application creates a new match", rw.span)
                break
        if rw.bidirectional:
            introduced = ops_used(rw.lhs) ^ ops_used(rw.rhs)
            if introduced:
                sink.add("F015", f"two-way rewrite {rw.name} introduces {', '.join(sorted(introduced))} in one "
                         "direction; each direction feeds the other (make it one-way with '=>')", rw.span)
        op = _commutes(rw)
        if op is not None:
            commutative.setdefault(op, rw)
            if op in associative:
                _ac(sink, op, associative[op], rw)
        op = _associates(rw)
        if op is not None:
            associative.setdefault(op, rw)
            if op in commutative:
                _ac(sink, op, commutative[op], rw)


def _ac(sink: Sink, op: str, first: Rewrite, second: Rewrite) -> None:
    sink.add("F015", f"rewrites {first.name} and {second.name} make {op} commutative and associative; saturation "
             f"then enumerates every order and bracketing of a {op} chain (keep one of them)", second.span)
