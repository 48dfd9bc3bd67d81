"""Which generator draws case ``seed``: ``small`` (fuzz/generator.py), ``realistic``
(fuzz/realistic.py) or ``mixed`` (odd seeds realistic, even seeds small)."""

from __future__ import annotations

from autofusion.fuzz.generator import FuzzCase, random_case
from autofusion.fuzz.realistic import realistic_case

SHAPES = ("small", "realistic", "mixed")


def case_for(seed: int, shapes: str = "small", max_ops: int = 7) -> FuzzCase:
    """The case of ``seed`` under ``shapes``; the same arguments always give the same case."""
    if shapes not in SHAPES:
        raise ValueError(f"unknown shapes {shapes!r}; one of {', '.join(SHAPES)}")
    if shapes == "realistic" or (shapes == "mixed" and seed % 2):
        return realistic_case(seed)
    return random_case(seed, max_ops)
