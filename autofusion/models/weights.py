"""Seeded random weights, drawn in float32 directly so full-size models build in seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class WeightInit:
    """Draws every weight of one model from one ``numpy.random.default_rng(seed)`` stream.

    Weights are drawn in a fixed order, so the same seed always gives the same model.

    >>> a = WeightInit(0).normal((2, 3), 0.02)
    >>> b = WeightInit(0).normal((2, 3), 0.02)
    >>> bool((a == b).all()), a.dtype.name
    (True, 'float32')
    """

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def normal(self, shape: Sequence[int], std: float, mean: float = 0.0) -> np.ndarray:
        """N(mean, std) in float32."""
        a = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        a *= np.float32(std)
        if mean:
            a += np.float32(mean)
        return a

    def uniform(self, shape: Sequence[int], low: float, high: float) -> np.ndarray:
        """U(low, high) in float32."""
        a = self.rng.random(tuple(shape), dtype=np.float32)
        a *= np.float32(high - low)
        a += np.float32(low)
        return a

    def he(self, shape: Sequence[int]) -> np.ndarray:
        """He-normal for a conv or linear weight ``(out, in, *kernel)``: keeps ReLU activations at unit scale."""
        fan_in = math.prod(shape[1:])
        return self.normal(shape, math.sqrt(2.0 / fan_in))

    def torch_default(self, shape: Sequence[int], fan_in: int) -> np.ndarray:
        """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for Linear and LSTM parameters."""
        bound = 1.0 / math.sqrt(fan_in)
        return self.uniform(shape, -bound, bound)


def ones(n: int) -> np.ndarray:
    return np.ones(n, np.float32)


def zeros(shape: int | Sequence[int]) -> np.ndarray:
    return np.zeros(shape, np.float32)
