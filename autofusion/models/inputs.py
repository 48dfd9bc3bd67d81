"""Valid random inputs for any graph: token ids within the vocabulary, padded attention masks, floats."""

from __future__ import annotations

from collections import deque

import numpy as np

from autofusion.ir import Graph

# ops that pass an index tensor on unchanged in value, so a Gather further down still bounds it
_INDEX_PRESERVING = frozenset({"Reshape", "Cast", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"})


def index_bound(graph: Graph, tensor: str) -> int | None:
    """The size of the table that ``tensor`` indexes through a ``Gather`` (e.g. the vocabulary of
    ``input_ids``), following value-preserving ops; None when it reaches no Gather as indices."""
    bounds: list[int] = []
    seen = {tensor}
    todo = deque([tensor])
    while todo:
        t = todo.popleft()
        for node in graph.consumers.get(t, ()):
            if node.op == "Gather" and len(node.inputs) > 1 and node.inputs[1] == t:
                data = graph.types[node.inputs[0]]
                axis = int(node.attr("axis", 0)) % max(1, data.rank)
                bounds.append(data.shape[axis])
            elif node.op in _INDEX_PRESERVING and node.inputs and node.inputs[0] == t:
                for out in node.outputs:
                    if out and out not in seen:
                        seen.add(out)
                        todo.append(out)
    return min(bounds) if bounds else None


def padding_mask(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Ones with zeros at the end of each row: row ``b`` pads ``(b % 4 + 1) / 8`` of its length,
    keeping at least one position, so batches mix sequence lengths."""
    mask = np.ones(shape, dtype=dtype)
    if len(shape) < 2:
        return mask
    rows = mask.reshape(-1, shape[-1])
    length = shape[-1]
    for b in range(rows.shape[0]):
        pad = min(length - 1, length * (b % 4 + 1) // 8)
        if pad:
            rows[b, length - pad:] = 0
    return mask


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """One valid feed per graph input, from ``numpy.random.default_rng(seed)``.

    Integer inputs that index a table (``input_ids``, ``token_type_ids``) are drawn within the
    table; inputs named like ``*mask*`` are padding masks (:func:`padding_mask`); floats are
    N(0, 1); other integers are 0 or 1; booleans are fair coins.

    >>> from autofusion.ir import GraphBuilder, DType
    >>> b = GraphBuilder("g")
    >>> x = b.input("x", (2, 3), DType.FLOAT32)
    >>> feeds = random_inputs(b.build([b.op("Relu", x)]))
    >>> feeds["x"].shape, feeds["x"].dtype.name
    ((2, 3), 'float32')
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        t = graph.types[name]
        dtype = t.dtype.numpy
        if "mask" in name.lower():
            feeds[name] = padding_mask(t.shape, dtype)
        elif t.dtype.is_float:
            feeds[name] = rng.standard_normal(t.shape, dtype=np.float32).astype(dtype, copy=False)
        elif dtype == np.bool_:
            feeds[name] = rng.random(t.shape) < 0.5
        else:
            high = index_bound(graph, name) or 2
            feeds[name] = rng.integers(0, high, size=t.shape, dtype=dtype)
    return feeds
