"""The models exported with dynamic axes (tests/data/dynamic) and inputs for them at any size."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autofusion.graph.graph import Graph

HERE = Path(__file__).parent / "data" / "dynamic"
DYNAMIC = sorted([*HERE.glob("bert_*.onnx"), *HERE.glob("gpt2_*.onnx")])  # transformers: batch and seq
CNN_AND_LSTM = sorted([*HERE.glob("resnet_*.onnx"), *HERE.glob("lstm_*.onnx")])  # batch (and the LSTM's seq)


def other_feeds(path: Path, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Images [batch, 3, 32, 32] for the CNNs, time steps [seq, batch, 32] for the LSTM."""
    shape = (seq, batch, 32) if path.stem.startswith("lstm") else (batch, 3, 32, 32)
    return {"x" if path.stem.startswith("lstm") else "image": rng.standard_normal(shape).astype(np.float32)}


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
