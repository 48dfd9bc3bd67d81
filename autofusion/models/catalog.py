"""The built-in models as data: name, family, sizes and how to build each one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from autofusion.graph.dims import Dim, bounded, symbol
from autofusion.graph.graph import FrozenMap
from autofusion.ir import Graph
from autofusion.models.bert import BertConfig, build_bert
from autofusion.models.gpt2 import GPT2Config, build_gpt2
from autofusion.models.lstm import LSTMConfig, build_lstm
from autofusion.models.resnet import ResNetConfig, build_resnet

ModelConfig = BertConfig | GPT2Config | ResNetConfig | LSTMConfig


class UnknownModelError(ValueError):
    """A model name that is not built in; the message lists the known names."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown model {name!r}; built-in models: {', '.join(known)}")
        self.name = name
        self.known = known


class ModelSizeError(ValueError):
    """A sequence length or batch size the model cannot take."""


@dataclass(frozen=True)
class ModelSpec:
    """One built-in model. ``seq`` is the sequence length of transformers and the number of time
    steps of the LSTM; CNNs have none (``default_seq`` is None)."""

    name: str
    family: str
    summary: str
    config: ModelConfig
    default_seq: int | None
    default_batch: int = 1

    @property
    def max_seq(self) -> int | None:
        if isinstance(self.config, BertConfig):
            return self.config.max_positions
        if isinstance(self.config, GPT2Config):
            return self.config.n_positions
        return None

    def build(self, seq: int | None = None, batch: int | None = None, seed: int = 0,
              weights: Mapping[str, np.ndarray] | None = None, dynamic: bool = False) -> Graph:
        """The graph for ``seq``/``batch`` (defaults when None) with weights drawn from ``seed``;
        ``weights`` replaces drawn ones by state-dict name. ``dynamic`` (transformers and CNNs) leaves
        ``batch`` symbolic and, in the transformers, ``seq`` too, bounded by the positions the model
        has."""
        if dynamic:
            return self._build_dynamic(seq, batch, seed, weights)
        batch = self.default_batch if batch is None else batch
        if batch < 1:
            raise ModelSizeError(f"{self.name}: batch must be at least 1, got {batch}")
        if self.default_seq is None:
            if seq is not None:
                raise ModelSizeError(f"{self.name}: takes no sequence length (it is a {self.family} model)")
            return _build(self, 0, batch, seed, weights)
        seq = self.default_seq if seq is None else seq
        if seq < 1:
            raise ModelSizeError(f"{self.name}: sequence length must be at least 1, got {seq}")
        if self.max_seq is not None and seq > self.max_seq:
            raise ModelSizeError(f"{self.name}: sequence length {seq} exceeds the {self.max_seq} positions it has")
        return _build(self, seq, batch, seed, weights)


    def _build_dynamic(self, seq: int | None, batch: int | None, seed: int,
                       weights: Mapping[str, np.ndarray] | None) -> Graph:
        if self.family == "lstm":  # unrolled over seq steps, its initial state a constant of the batch's size
            raise ModelSizeError(f"{self.name}: only the transformers and CNNs have dynamic sizes")
        if seq is not None or batch is not None:
            raise ModelSizeError(f"{self.name}: a dynamic model has no fixed seq or batch")
        if self.max_seq is None:  # a CNN: the batch alone is symbolic
            return _build(self, 0, symbol("batch"), seed, weights)
        with bounded({"seq": self.max_seq}):  # position ids and the causal mask are prefixes of max_seq rows
            graph = _build(self, symbol("seq"), symbol("batch"), seed, weights)
        return graph.replace(bounds=FrozenMap({"seq": self.max_seq}))


def _build(spec: ModelSpec, seq: Dim, batch: Dim, seed: int, weights: Mapping[str, np.ndarray] | None) -> Graph:
    cfg = spec.config
    if isinstance(cfg, BertConfig):
        return build_bert(cfg, seq, batch, seed, spec.name, weights)
    if isinstance(cfg, GPT2Config):
        return build_gpt2(cfg, seq, batch, seed, spec.name, weights)
    if isinstance(cfg, ResNetConfig):
        return build_resnet(cfg, batch, seed, spec.name, weights)
    return build_lstm(cfg, seq, batch, seed, spec.name, weights)


_RESNET18 = ResNetConfig(stem_channels=64, stem_kernel=7, stem_stride=2, stage_channels=(64, 128, 256, 512),
                         blocks_per_stage=(2, 2, 2, 2), image_size=224, classes=1000)
# the CNN of tests/data/models/resnet_tiny_*.onnx: 3x3 stem, three stages of one block, 10 classes
_RESNET_TINY = ResNetConfig(stem_channels=16, stem_kernel=3, stem_stride=1, stage_channels=(16, 32, 64),
                            blocks_per_stage=(1, 1, 1), image_size=32, classes=10)

BUILTIN_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("bert-base", "bert", "BERT-base encoder with pooler: 12 layers, hidden 768, 12 heads, FFN 3072, "
              "vocab 30522, 512 positions",
              BertConfig(layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, max_positions=512), 128),
    ModelSpec("bert-large", "bert", "BERT-large encoder with pooler: 24 layers, hidden 1024, 16 heads, FFN 4096, "
              "vocab 30522, 512 positions",
              BertConfig(layers=24, hidden=1024, heads=16, ffn=4096, vocab=30522, max_positions=512), 128),
    ModelSpec("gpt2", "gpt2", "GPT-2 (124M) decoder stack: 12 layers, hidden 768, 12 heads, vocab 50257, "
              "1024 positions",
              GPT2Config(layers=12, hidden=768, heads=12, vocab=50257, n_positions=1024), 128),
    ModelSpec("resnet18", "resnet", "ResNet-18 for 3x224x224 images, 1000 classes, BatchNorm folded into Conv",
              _RESNET18, None),
    ModelSpec("resnet18-bn", "resnet", "ResNet-18 with Conv + BatchNormalization pairs kept",
              replace(_RESNET18, batchnorm=True), None),
    ModelSpec("lstm", "lstm", "LSTMCell unrolled over 16 time steps (seq): input 256, hidden 512, "
              "linear head to 64 outputs", LSTMConfig(input_size=256, hidden=512, outputs=64), 16),
    ModelSpec("bert-tiny", "bert", "BERT for tests: 2 layers, hidden 64, 2 heads, FFN 128, vocab 1000, 64 positions",
              BertConfig(layers=2, hidden=64, heads=2, ffn=128, vocab=1000, max_positions=64), 16),
    ModelSpec("gpt2-tiny", "gpt2", "GPT-2 for tests: 2 layers, hidden 64, 2 heads, vocab 1000, 64 positions",
              GPT2Config(layers=2, hidden=64, heads=2, vocab=1000, n_positions=64), 16),
    ModelSpec("resnet-tiny", "resnet", "ResNet for tests: 3x32x32 images, 3x3 stem of 16 channels, "
              "3 basic blocks (16, 32, 64 channels), 10 classes", _RESNET_TINY, None),
    ModelSpec("resnet-tiny-bn", "resnet", "resnet-tiny with Conv + BatchNormalization pairs kept",
              replace(_RESNET_TINY, batchnorm=True), None),
    ModelSpec("lstm-tiny", "lstm", "LSTMCell for tests unrolled over 8 time steps (seq): input 32, hidden 48, "
              "linear head to 8 outputs", LSTMConfig(input_size=32, hidden=48, outputs=8), 8),
)
