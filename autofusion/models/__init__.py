"""Built-in models, built with the graph builder in the structure real exporters give them.

>>> from autofusion.models import build, builtin_names, random_inputs
>>> "bert-tiny" in builtin_names()
True
>>> g = build("lstm-tiny", batch=2)
>>> g.types["y"].shape
(2, 8)
>>> sorted(random_inputs(g))
['x']
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autofusion.ir import Graph
from autofusion.models.catalog import BUILTIN_MODELS, ModelSizeError, ModelSpec, UnknownModelError
from autofusion.models.export_builder import WeightError
from autofusion.models.inputs import random_inputs
from autofusion.models.stats import GraphStats, graph_stats, op_histogram, parameter_count


def builtin_names() -> tuple[str, ...]:
    """Names of the built-in models, full-size ones first."""
    return tuple(spec.name for spec in BUILTIN_MODELS)


def spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a built-in model; UnknownModelError lists the known names."""
    for s in BUILTIN_MODELS:
        if s.name == name:
            return s
    raise UnknownModelError(name, builtin_names())


def build(name: str, seq: int | None = None, batch: int | None = None, seed: int = 0,
          weights: Mapping[str, np.ndarray] | None = None, dynamic: bool = False) -> Graph:
    """The graph of built-in model ``name`` with seeded random weights.

    ``seq`` is the sequence length of transformers (default 128; 16 for the tiny ones) and the
    number of time steps of the LSTMs; CNNs take none. ``batch`` defaults to 1. ``weights`` maps
    state-dict names (``encoder.layer.0.attention.self.query.weight``) to arrays that replace the
    drawn ones, e.g. trained weights; linear weights used by MatMul/Gemm without transB are stored
    ``[in, out]`` as the exporter stores them. Raises UnknownModelError, ModelSizeError or
    WeightError (all ValueError) with a message for the user. ``dynamic`` (transformers and CNNs)
    leaves ``batch`` and the transformers' ``seq`` symbolic: one graph for every size (see
    autofusion.ir.symbolic).
    """
    return spec(name).build(seq, batch, seed, weights, dynamic)


def describe(name: str) -> str:
    """One paragraph on a built-in model: what it is, its sizes, its defaults."""
    s = spec(name)
    sizes = ", ".join(f"{k}={v}" for k, v in s.config.__dict__.items())
    seq = "" if s.default_seq is None else f", seq {s.default_seq}" + (
        f" (at most {s.max_seq})" if s.max_seq is not None else "")
    return f"{s.name} ({s.family}): {s.summary}. Defaults: batch {s.default_batch}{seq}. Config: {sizes}."


__all__ = [
    "BUILTIN_MODELS",
    "GraphStats",
    "ModelSizeError",
    "ModelSpec",
    "UnknownModelError",
    "WeightError",
    "build",
    "builtin_names",
    "describe",
    "graph_stats",
    "op_histogram",
    "parameter_count",
    "random_inputs",
    "spec",
]
