"""Who computes a convolution's input gradient in a training graph, chosen by measurement.

torch's ``convolution_backward`` returns the input, weight and bias gradients in one call. Its
weight gradient is faster than any spelling in IR ops measured (im2col slices with a product, a
Conv with batch and channels swapped: 3-5x slower); its input gradient is 2.4x slower than the
stride-phase Convs of :mod:`autofusion.frontends.conv_grad` on a stride-2 layer of 32 -> 64
channels, and faster on others (a stride-1 3x3 layer of 32 channels: 1.6x). So for each such node
of a backward graph, both are timed once, round-robin on the node's shapes, and the faster one
computes it. When it is ours, the node is split (:func:`~autofusion.frontends.fx_aten.split_weight_gradient`):
the weight gradient stays with torch, the input and bias gradients join the SuperKernel partition.
When it is torch's, the node is marked to stay eager (:data:`~autofusion.frontends.fx_aten.TORCH_INPUT_GRAD`),
also when it asks for no weight gradient.
Choices are kept per process, by shapes, geometry and thread counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

ROUNDS = 5
MIN_SECONDS = 0.01  # per runner and round: a few calls of a millisecond kernel
MARGIN = 1.05  # ours must be this much faster: a coin flip should not move work out of torch

_choices: dict[tuple[Any, ...], bool] = {}
_lock = threading.Lock()  # held while measuring


def measurable(node: Any) -> bool:
    """A ``convolution_backward`` asking for its input gradient in a form the converter takes: 2-D,
    not transposed, dilation 1, static float32 tensors, positional arguments."""
    from autofusion.frontends.fx_import import example_value, static_float_tensor, target_key

    if target_key(node) != "convolution_backward" or len(node.args) != 11 or node.kwargs:
        return False
    _, _, _, _, stride, padding, dilation, transposed, _, groups, mask = node.args
    tensors = [example_value(a) for a in node.args[:3]]
    return (bool(mask[0]) and not transposed and list(dilation) == [1, 1]
            and len(stride) == 2 and len(padding) == 2 and isinstance(groups, int)
            and all(static_float_tensor(t) and t.dim() == 4 for t in tensors))


def _key(node: Any) -> tuple[Any, ...]:
    import torch

    from autofusion.frontends.fx_import import example_value
    from autofusion.runtime.loader import default_threads

    shapes = tuple(tuple(example_value(a).shape) for a in node.args[:3])
    return (shapes, tuple(node.args[4]), tuple(node.args[5]), node.args[9], default_threads(),
            torch.get_num_threads())


def ours_faster(node: Any) -> bool:
    """Whether the stride-phase Convs compute this node's input gradient faster than torch does, each
    with the threads it would run with (the partitions' and torch's own). Raises what building or
    running either side raises (the caller leaves the node with torch); one measurement at a time,
    as two would slow each other down."""
    from autofusion.bench.timing import round_robin_medians

    key = _key(node)
    with _lock:
        if key not in _choices:
            ours, theirs = _runners(node)
            times = round_robin_medians({"ours": ours, "torch": theirs}, rounds=ROUNDS, min_seconds=MIN_SECONDS,
                                        pause_seconds=0.0)
            _choices[key] = times["ours"] * MARGIN < times["torch"]
        return _choices[key]


def _runners(node: Any) -> tuple[Callable[[], object], Callable[[], object]]:
    """Our compiled input gradient and torch's, on random tensors of the node's shapes, both warm."""
    import numpy as np
    import torch

    from autofusion.api import optimize
    from autofusion.frontends.conv_grad import conv2d_input_grad
    from autofusion.frontends.fx_import import example_value
    from autofusion.ir.builder import GraphBuilder
    from autofusion.runtime.model import CompiledModel

    dy_shape, x_shape, w_shape = (tuple(example_value(a).shape) for a in node.args[:3])
    stride, padding, groups = list(node.args[4]), list(node.args[5]), int(node.args[9])
    b = GraphBuilder("conv_input_grad")
    dy, w = b.input("dy", dy_shape), b.input("w", w_shape)
    dx = conv2d_input_grad(b, dy, w, (x_shape[2], x_shape[3]), (stride[0], stride[1]), (padding[0], padding[1]),
                           groups)
    model = CompiledModel(optimize(b.build([dx])))
    gen = torch.Generator().manual_seed(0)
    dy_t, x_t, w_t = (torch.randn(s, generator=gen) for s in (dy_shape, x_shape, w_shape))
    feeds = {"dy": dy_t.numpy(), "w": w_t.numpy()}
    target = torch.ops.aten.convolution_backward.default

    def theirs() -> Any:
        return target(dy_t, x_t, w_t, None, stride, padding, [1, 1], False, [0, 0], groups, [True, False, False])

    def ours() -> dict[str, Any]:
        return model.run(feeds)

    expected, got = theirs()[0].numpy(), ours()[dx]
    if not np.allclose(got, expected, rtol=1e-3, atol=1e-3 * float(np.abs(expected).max())):
        raise ValueError(f"the input gradient's Convs differ from torch's on {dy_shape}")
    return ours, theirs
