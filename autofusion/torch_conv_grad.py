"""Who computes a convolution's input and weight gradients in a training graph, chosen by measurement.

torch's ``convolution_backward`` returns the input, weight and bias gradients in one call. Each of
the first two can also be spelled in IR Convs (:mod:`autofusion.frontends.conv_grad`), and which is
faster depends on the layer and the machine. On a Zen 3 with 2 threads, the stride-2 layer of 32 ->
64 channels of benchmarks/torch_training.py (16 x 32 x 32 x 32 in): its input gradient's
stride-phase Convs 1.04-1.06x torch's time (0.42x in an earlier sitting), its weight gradient as a
Conv with batch and channels swapped 0.86-0.89x; the 3 -> 32 stem's weight gradient 1.14-1.34x (three
input channels leave the swapped Conv a batch of three). So for each such node of a backward
graph, each asked-for gradient ours can take is timed round-robin against torch's on the node's
shapes, and ours computes it where it is faster in two such measurements in a row (one compile of
four gave the stem to ours with one), torch otherwise. The bias gradient goes with ours where ours
computes anything. The node is then converted whole, left to torch whole
(:data:`~autofusion.frontends.fx_aten.TORCH_KEEPS`), or split
(:func:`~autofusion.frontends.fx_aten.split_gradients`) into torch's part and ours.
Choices are kept per process, by part, shapes, geometry and thread counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

ROUNDS = 5
MIN_SECONDS = 0.01  # per runner and round: a few calls of a millisecond kernel
MARGIN = 1.05  # ours must be this much faster: a coin flip should not move work out of torch
PARTS = ("input", "weight")  # convolution_backward's outputs 0 and 1

_choices: dict[tuple[Any, ...], bool] = {}
_lock = threading.Lock()  # held while measuring


def measurable(node: Any, part: str) -> bool:
    """A ``convolution_backward`` asking for its ``part`` gradient in a form the converter takes:
    2-D, not transposed, dilation 1, static float32 tensors, positional arguments; the weight
    gradient of one group only."""
    from autofusion.frontends.fx_import import example_value, static_float_tensor, target_key

    if target_key(node) != "convolution_backward" or len(node.args) != 11 or node.kwargs:
        return False
    _, _, _, _, stride, padding, dilation, transposed, _, groups, mask = node.args
    tensors = [example_value(a) for a in node.args[:3]]
    return (bool(mask[PARTS.index(part)]) and not transposed and list(dilation) == [1, 1]
            and len(stride) == 2 and len(padding) == 2 and isinstance(groups, int)
            and (part == "input" or groups == 1)
            and all(static_float_tensor(t) and t.dim() == 4 for t in tensors))


def _key(node: Any, part: str) -> tuple[Any, ...]:
    import torch

    from autofusion.frontends.fx_import import example_value
    from autofusion.runtime.loader import default_threads

    shapes = tuple(tuple(example_value(a).shape) for a in node.args[:3])
    return (part, shapes, tuple(node.args[4]), tuple(node.args[5]), node.args[9], default_threads(),
            torch.get_num_threads())


def ours_faster(node: Any, part: str) -> bool:
    """Whether the IR Convs compute this node's ``part`` gradient faster than torch does, each with
    the threads it would run with (the partitions' and torch's own). Raises what building or running
    either side raises (the caller leaves the part with torch); one measurement at a time, as two
    would slow each other down."""
    from autofusion.bench.timing import round_robin_medians

    key = _key(node, part)
    with _lock:
        if key not in _choices:
            runners = dict(zip(("ours", "torch"), _runners(node, part)))

            def ours_wins() -> bool:
                times = round_robin_medians(runners, rounds=ROUNDS, min_seconds=MIN_SECONDS, pause_seconds=0.0)
                return times["ours"] * MARGIN < times["torch"]

            # ours must win twice: one slow minute on torch's rounds should not move work out of torch
            _choices[key] = ours_wins() and ours_wins()
        return _choices[key]


def _runners(node: Any, part: str) -> tuple[Callable[[], object], Callable[[], object]]:
    """Our compiled ``part`` gradient and torch's, on random tensors of the node's shapes, both warm
    and checked to agree."""
    import numpy as np
    import torch

    from autofusion.api import optimize
    from autofusion.frontends.conv_grad import conv2d_input_grad, conv2d_weight_grad
    from autofusion.frontends.fx_import import example_value
    from autofusion.ir.builder import GraphBuilder
    from autofusion.runtime.model import CompiledModel

    dy_shape, x_shape, w_shape = (tuple(example_value(a).shape) for a in node.args[:3])
    stride, padding, groups = list(node.args[4]), list(node.args[5]), int(node.args[9])
    b = GraphBuilder(f"conv_{part}_grad")
    dy = b.input("dy", dy_shape)
    if part == "input":
        out = conv2d_input_grad(b, dy, b.input("w", w_shape), (x_shape[2], x_shape[3]), (stride[0], stride[1]),
                                (padding[0], padding[1]), groups)
    else:
        out = conv2d_weight_grad(b, dy, b.input("x", x_shape), (w_shape[2], w_shape[3]), (stride[0], stride[1]),
                                 (padding[0], padding[1]))
    model = CompiledModel(optimize(b.build([out])))
    gen = torch.Generator().manual_seed(0)
    dy_t, x_t, w_t = (torch.randn(s, generator=gen) for s in (dy_shape, x_shape, w_shape))
    feeds = {"dy": dy_t.numpy(), "w": w_t.numpy()} if part == "input" else {"dy": dy_t.numpy(), "x": x_t.numpy()}
    target = torch.ops.aten.convolution_backward.default
    index = PARTS.index(part)
    mask = [i == index for i in range(3)]

    def theirs() -> Any:
        return target(dy_t, x_t, w_t, None, stride, padding, [1, 1], False, [0, 0], groups, mask)

    def ours() -> dict[str, Any]:
        return model.run(feeds)

    expected, got = theirs()[index].numpy(), ours()[out]
    if not np.allclose(got, expected, rtol=1e-3, atol=1e-3 * float(np.abs(expected).max())):
        raise ValueError(f"the {part} gradient's Convs differ from torch's on {dy_shape}")
    return ours, theirs
