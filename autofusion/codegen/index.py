"""Index arithmetic as C expressions, folded where the operands are known integers.

An index is a tuple of C expressions, one per dimension, each an ``int64_t`` value. Producers are
inlined by mapping the consumer's index to the producer's (broadcast, permutation, offset, reshape).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

Index = tuple[str, ...]

_ATOM = re.compile(r"^(-?\d+|[A-Za-z_][A-Za-z0-9_]*)$")


def is_int(e: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", e))


def paren(e: str) -> str:
    """``e`` wrapped in parentheses unless it is a name or a number."""
    return e if _ATOM.match(e) or (e.startswith("(") and _balanced_outer(e)) else f"({e})"


def _balanced_outer(e: str) -> bool:
    depth = 0
    for i, ch in enumerate(e):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(e) - 1:
            return False
    return e.endswith(")")


def add(a: str, b: str | int) -> str:
    b = str(b)
    if is_int(a) and is_int(b):
        return str(int(a) + int(b))
    if b == "0":
        return a
    if a == "0":
        return b
    if is_int(b) and int(b) < 0:
        return f"{a} - {-int(b)}"
    return f"{a} + {b}"


def sub(a: str, b: str | int) -> str:
    b = str(b)
    if is_int(b):
        return add(a, str(-int(b)))
    return f"{a} - {paren(b)}"


def mul(a: str, k: str | int) -> str:
    k = str(k)
    if is_int(a) and is_int(k):
        return str(int(a) * int(k))
    if k == "0" or a == "0":
        return "0"
    if k == "1":
        return a
    if a == "1":
        return k
    return f"{paren(a)} * {paren(k)}"


def div(a: str, k: int) -> str:
    """``a / k`` in C (``k`` may be a symbolic size: it prints as an expression)."""
    if k == 1:
        return a
    if is_int(a) and isinstance(k, int):
        return str(int(a) // k)
    return f"{paren(a)} / {paren(str(k))}"


def mod(a: str, k: int) -> str:
    if k == 1:
        return "0"
    if is_int(a) and isinstance(k, int):
        return str(int(a) % k)
    return f"{paren(a)} % {paren(str(k))}"


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides."""
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return tuple(out)


def linear(idx: Index, shape: Sequence[int]) -> str:
    """The row-major offset of ``idx`` in a contiguous tensor of ``shape``."""
    terms = "0"
    for e, s, n in zip(idx, strides(shape), shape):
        if n != 1:
            terms = add(terms, mul(e, s))
    return terms


def delinear(flat: str, shape: Sequence[int]) -> Index:
    """The index whose row-major offset in ``shape`` is ``flat`` (0 <= flat < numel)."""
    st = strides(shape)
    first = next((d for d, n in enumerate(shape) if n != 1), len(shape))
    out = []
    for d, n in enumerate(shape):
        if n == 1:
            out.append("0")
        elif d == first:
            out.append(div(flat, st[d]))
        else:
            out.append(mod(div(flat, st[d]), n))
    return tuple(out)


def broadcast(idx: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """The index into an input of ``in_shape`` broadcast (numpy rules) to ``out_shape``."""
    lead = len(out_shape) - len(in_shape)
    return tuple("0" if n == 1 else idx[lead + d] for d, n in enumerate(in_shape))


def reshape(idx: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """The index into ``in_shape`` of element ``idx`` of its reshape to ``out_shape``.

    Dimensions are matched in blocks of equal element count so that merging or splitting axes
    costs a multiply or a div/mod on the block only, not on the whole index.
    """
    if math.prod(out_shape) != math.prod(in_shape):
        raise ValueError(f"cannot reshape {tuple(in_shape)} to {tuple(out_shape)}")
    if math.prod(in_shape) == 0:
        return ("0",) * len(in_shape)
    result: list[str] = ["0"] * len(in_shape)
    o, i = 0, 0
    no, ni = len(out_shape), len(in_shape)
    while o < no or i < ni:
        o0, i0 = o, i
        po = out_shape[o] if o < no else 1
        pi = in_shape[i] if i < ni else 1
        o += o < no
        i += i < ni
        while po != pi:
            if po < pi:
                po *= out_shape[o]
                o += 1
            else:
                pi *= in_shape[i]
                i += 1
        o_dims, i_dims = list(range(o0, o)), list(range(i0, i))
        block_out = [out_shape[d] for d in o_dims]
        block_in = [in_shape[d] for d in i_dims]
        flat = linear(tuple(idx[d] for d in o_dims), block_out)
        for d, e in zip(i_dims, delinear(flat, block_in)):
            result[d] = e
    return tuple(result)
