"""ResNet (torchvision's BasicBlock ResNet) as the TorchScript exporter writes it.

The exporter folds each eval-mode ``BatchNormalization`` into the ``Conv`` before it, as in
``tests/data/models/resnet_tiny_script.onnx``: ``Conv`` (with bias) + ``Relu``, ``MaxPool``, stages of
basic blocks (``Conv``, ``Relu``, ``Conv``, the 1x1 stride-2 downsample ``Conv`` where the shape
changes, ``Add``, ``Relu``), ``GlobalAveragePool``, ``Flatten``, ``Gemm`` (transB=1) to ``logits``.
With ``batchnorm=True`` the graph keeps ``Conv`` (no bias) + ``BatchNormalization`` pairs instead,
as ``resnet_tiny_bn_script.onnx`` does.

Both variants draw the same parameters from the same seed (He-normal conv weights, batch-norm
statistics near their trained ranges, with small gammas closing each residual branch so that
activations stay at unit scale through the stages), so they compute the same function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autofusion.ir import DType, Graph
from autofusion.models.export_builder import ExportBuilder
from autofusion.models.weights import WeightInit

BN_EPS = 1e-5


@dataclass(frozen=True)
class ResNetConfig:
    """Sizes of a BasicBlock ResNet."""

    stem_channels: int
    stem_kernel: int
    stem_stride: int
    stage_channels: tuple[int, ...]
    blocks_per_stage: tuple[int, ...]
    image_size: int
    classes: int
    batchnorm: bool = False


@dataclass(frozen=True)
class _BatchNorm:
    gamma: np.ndarray
    beta: np.ndarray
    mean: np.ndarray
    var: np.ndarray


def _draw_bn(w: WeightInit, channels: int, gamma_low: float, gamma_high: float) -> _BatchNorm:
    return _BatchNorm(
        gamma=w.uniform((channels,), gamma_low, gamma_high),
        beta=w.normal((channels,), 0.1),
        mean=w.normal((channels,), 0.1),
        var=w.uniform((channels,), 0.5, 1.5),
    )


def _conv_bn(e: ExportBuilder, w: WeightInit, cfg: ResNetConfig, conv: str, bn: str, x: str,
             c_in: int, c_out: int, kernel: int, stride: int, gamma: tuple[float, float]) -> str:
    """A bias-free Conv and its BatchNorm: two nodes, or one Conv with the BatchNorm folded in.

    ``conv`` and ``bn`` are the modules' state-dict prefixes (``layer1.0.conv1``); the node scopes
    follow from them as the exporter writes them (``/layer1/layer1.0/conv1/Conv``).
    """
    weight = w.he((c_out, c_in, kernel, kernel))
    stats = _draw_bn(w, c_out, *gamma)
    pad = kernel // 2
    attrs: dict[str, Any] = dict(dilations=(1, 1), group=1, kernel_shape=(kernel, kernel), pads=(pad,) * 4,
                                 strides=(stride, stride))
    if cfg.batchnorm:
        y = e.node(_scope(conv), "Conv", x, e.param(f"{conv}.weight", weight), **attrs)
        params = [e.param(f"{bn}.{k}", v) for k, v in (("weight", stats.gamma), ("bias", stats.beta),
                                                        ("running_mean", stats.mean), ("running_var", stats.var))]
        return e.node(_scope(bn), "BatchNormalization", y, *params, epsilon=BN_EPS, momentum=0.9)
    scale = stats.gamma.astype(np.float64) / np.sqrt(stats.var.astype(np.float64) + BN_EPS)
    folded_w = (weight * scale[:, None, None, None]).astype(np.float32)
    folded_b = (stats.beta - stats.mean * scale).astype(np.float32)
    return e.node(_scope(conv), "Conv", x, e.param(f"{conv}.weight", folded_w), e.param(f"{conv}.bias", folded_b),
                  **attrs)


def _scope(module: str) -> str:
    """The exporter's node scope of a module path: ``layer2.0.downsample.0`` -> ``/layer2/layer2.0/downsample/downsample.0``."""
    parts = module.split(".")
    scopes, i = [], 0
    while i < len(parts):
        # a numeric part joins its container's name (``layer1.0``) as nn.Sequential children are named
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            scopes += [parts[i], f"{parts[i]}.{parts[i + 1]}"]
            i += 2
        else:
            scopes.append(parts[i])
            i += 1
    return "/" + "/".join(scopes)


def _basic_block(e: ExportBuilder, w: WeightInit, cfg: ResNetConfig, stage: int, block: int, x: str,
                 c_in: int, c_out: int, stride: int) -> str:
    p = f"layer{stage}.{block}"
    y = _conv_bn(e, w, cfg, f"{p}.conv1", f"{p}.bn1", x, c_in, c_out, 3, stride, (0.5, 1.0))
    y = e.node(_scope(f"{p}.relu"), "Relu", y)
    y = _conv_bn(e, w, cfg, f"{p}.conv2", f"{p}.bn2", y, c_out, c_out, 3, 1, (0.2, 0.4))
    identity = x
    if stride != 1 or c_in != c_out:
        identity = _conv_bn(e, w, cfg, f"{p}.downsample.0", f"{p}.downsample.1", x, c_in, c_out, 1, stride, (0.5, 1.0))
    return e.node(_scope(f"{p}.relu_1"), "Relu", e.node(_scope(p), "Add", y, identity))


def build_resnet(cfg: ResNetConfig, batch: int, seed: int, name: str,
                 weights: Mapping[str, np.ndarray] | None = None) -> Graph:
    """A ResNet graph for ``batch`` RGB images of ``image_size`` squared, weights from ``seed``."""
    e = ExportBuilder(name, weights=weights)
    w = WeightInit(seed)
    x = e.input("pixel_values", (batch, 3, cfg.image_size, cfg.image_size), DType.FLOAT32)
    x = _conv_bn(e, w, cfg, "conv1", "bn1", x, 3, cfg.stem_channels, cfg.stem_kernel, cfg.stem_stride, (0.5, 1.0))
    x = e.node("/relu", "Relu", x)
    x = e.node("/maxpool", "MaxPool", x, ceil_mode=0, dilations=(1, 1), kernel_shape=(3, 3), pads=(1, 1, 1, 1),
               strides=(2, 2))
    c_in = cfg.stem_channels
    for stage, (c_out, blocks) in enumerate(zip(cfg.stage_channels, cfg.blocks_per_stage), start=1):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 1 else 1
            x = _basic_block(e, w, cfg, stage, block, x, c_in, c_out, stride)
            c_in = c_out
    x = e.node("/Flatten", "Flatten", e.node("/avgpool", "GlobalAveragePool", x), axis=1)
    fc_w = e.param("fc.weight", w.torch_default((cfg.classes, c_in), c_in))
    fc_b = e.param("fc.bias", w.torch_default((cfg.classes,), c_in))
    logits = e.node("/fc", "Gemm", x, fc_w, fc_b, alpha=1.0, beta=1.0, transB=1, output="logits")
    return e.build([logits])
