"""The reference interpreter: runs a graph op by op with the registry's numpy implementations.

It defines what every op means; every later stage is checked against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from autofusion.graph.graph import Graph
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry


class InterpreterError(RuntimeError):
    """A feed is missing or mistyped, or an op failed on the given values."""


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray],
                shapes: Sequence[tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """Feeds as arrays of exactly the declared shapes (or ``shapes``, one per input, for a graph whose
    sizes are symbolic) and dtypes, or InterpreterError."""
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(graph.inputs):
        if name not in feeds:
            raise InterpreterError(f"missing input {name!r}")
        t = graph.types[name]
        arr = np.asarray(feeds[name])
        shape = t.shape if shapes is None else shapes[i]
        if tuple(arr.shape) != shape:
            raise InterpreterError(f"input {name!r}: shape {tuple(arr.shape)}, graph expects {shape}")
        if arr.dtype != t.dtype.numpy:
            raise InterpreterError(f"input {name!r}: dtype {arr.dtype}, graph expects {t.dtype}")
        out[name] = arr
    return out


def run_graph(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    registry: OpRegistry | None = None,
    keep_all: bool = False,
) -> dict[str, np.ndarray]:
    """Outputs of ``graph`` (all tensors when ``keep_all``) for ``feeds``, by name."""
    registry = registry or default_registry()
    env: dict[str, np.ndarray] = {k: c.array for k, c in graph.constants.items()}
    env.update(check_feeds(graph, feeds))
    last_use: dict[str, int] = {}
    if not keep_all:
        for idx, node in enumerate(graph.nodes):
            for i in node.inputs:
                last_use[i] = idx
    keep = set(graph.outputs) | set(graph.constants) | set(graph.inputs)
    for idx, node in enumerate(graph.nodes):
        opdef = registry[node.op]
        args = [env[i] if i else None for i in node.inputs]
        try:
            with np.errstate(all="ignore"):
                results = opdef.reference(args, node.attrs)
        except Exception as e:  # an op's numpy code failing is reported with the node it ran
            raise InterpreterError(f"node {node.name!r} ({node.op}) failed: {type(e).__name__}: {e}") from e
        for name, value, t in zip(node.outputs, results, (graph.types.get(o) for o in node.outputs)):
            if not name:
                continue
            value = np.asarray(value)
            if t is not None and (value.shape != t.shape or value.dtype != t.dtype.numpy):
                raise InterpreterError(
                    f"node {node.name!r} ({node.op}): reference gave {value.dtype}{list(value.shape)}, "
                    f"inference says {t}")
            env[name] = value
        if not keep_all:
            for i in set(node.inputs):
                if i and last_use.get(i) == idx and i not in keep:
                    del env[i]
    if keep_all:
        return env
    return {o: env[o] for o in graph.outputs}
