"""Index arithmetic as Python/Triton expressions (``//`` and ``%`` on non-negative integers).

An index is a tuple of expressions, one per dimension; ``"0"`` marks a size-1 or broadcast axis.
"""

from __future__ import annotations

from collections.abc import Sequence

from autofusion.codegen import index as cix

Index = tuple[str, ...]
broadcast = cix.broadcast  # picks dimensions only: backend-neutral
strides = cix.strides
paren = cix.paren
add = cix.add
mul = cix.mul
linear = cix.linear  # only + and *: the same text in C and Python


def div(a: str, k: int) -> str:
    if k == 1:
        return a
    if cix.is_int(a):
        return str(int(a) // k)
    return f"{paren(a)} // {k}"


def mod(a: str, k: int) -> str:
    if k == 1:
        return "0"
    if cix.is_int(a):
        return str(int(a) % k)
    return f"{paren(a)} % {k}"


def delinear(flat: str, shape: Sequence[int]) -> Index:
    """The index whose row-major offset in ``shape`` is ``flat``."""
    st = strides(shape)
    first = next((d for d, n in enumerate(shape) if n != 1), len(shape))
    return tuple("0" if n == 1 else div(flat, st[d]) if d == first else mod(div(flat, st[d]), n)
                 for d, n in enumerate(shape))


def reshape(idx: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """The index into ``in_shape`` of element ``idx`` of its reshape to ``out_shape``."""
    return delinear(linear(idx, out_shape), in_shape)


def transpose(idx: Index, perm: Sequence[int]) -> Index:
    """The input index of output element ``idx`` of a transpose by ``perm``."""
    out = ["0"] * len(perm)
    for o, p in enumerate(perm):
        out[p] = idx[o]
    return tuple(out)
