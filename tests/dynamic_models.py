"""The models exported with dynamic axes (tests/data/dynamic) and inputs for them at any size."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autofusion.graph.graph import Graph

DYNAMIC = sorted((Path(__file__).parent / "data" / "dynamic").glob("*.onnx"))


def dynamic_feeds(graph: Graph, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Token ids, token types and an attention mask with padding in its last row."""
    feeds = {}
    for name in graph.inputs:
        if name == "attention_mask":
            mask = np.ones((batch, seq), np.int64)
            mask[-1, seq // 2 + 1:] = 0  # padding in the last row
            feeds[name] = mask
        else:
            feeds[name] = rng.integers(0, 100 if name == "input_ids" else 2, (batch, seq)).astype(np.int64)
    return feeds
