"""Winograd F(2x2, 3x3) for dense 3x3 convolutions with stride and dilation 1 (the ``winograd`` core).

Each 2x2 block of output positions (a *tile*) is computed from the 4x4 input patch under it as
Y = A^T [U (.) V] A, with V = B^T d B the patch transformed and U = G g G^T the weight transformed
(at build time). Summed over input channels, the 16 element-wise products of each tile become 16
matrix products [tiles x C] @ [C x M], one per element of the 4x4 transform, which the packed
micro-kernel runs: 16 multiplications per tile and channel pair where the taps take 36 (4/9 of
them), for transforms of the input and of the output that cost additions only. The transformed
weight is 16/9 the size of the weight, so the core pays where the weight is small beside the
positions (a ResNet's early stages); the tuner measures it against the taps.

The matrices (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016):
B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]], A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
The template (conv_epilogue.c.j2, ``winograd``) writes B^T and A^T out as additions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
TRANSFORMED = 16  # elements of a tile's transform: one matrix product each
# the widest output row the core takes: each thread keeps a tile row's transformed input rows on its
# stack (4 x (width + 2) floats, 64 KiB here), which must stay far below a thread's stack
MAX_WIDTH = 4096
# a task's transformed input and products together take at most this share of L2, where the 16
# products read them back
L2_SHARE = 4


def winograd_weights(w: np.ndarray) -> np.ndarray:
    """U = G g G^T for every (output, input) channel pair of a [M, C, 3, 3] weight: [4, 4, M, C]
    float32 (computed in float64, so that the transform adds one rounding)."""
    if w.ndim != 4 or w.shape[2:] != (3, 3):
        raise ValueError(f"the Winograd transform takes [M, C, 3, 3] weights, not {list(w.shape)}")
    return np.einsum("ir,mcrs,js->ijmc", G, w.astype(np.float64), G).astype(np.float32)


@dataclass(frozen=True)
class WinogradBlocks:
    """How a convolution's output is cut for the template: tiles of 2x2 positions, ``tile_cols``
    to a row of them; tasks of ``task_rows`` output rows (an even number: whole tiles)."""

    tile_cols: int
    task_rows: int
    span: int  # input columns a row of tiles reads, padding included: 2 * tile_cols + 2
    lo: int  # the first of them inside the image (the left padding)
    hi: int  # one past the last inside it

    @property
    def tiles(self) -> int:
        """Tiles of a full task."""
        return self.task_rows // 2 * self.tile_cols


def winograd_blocks(out_rows: int, out_cols: int, in_cols: int, pad_left: int, channels: int, block_channels: int,
                    l2: int) -> WinogradBlocks:
    """Tasks as tall as L2 allows: a task's transformed input (16 x channels x tiles) and products
    (16 x tiles x block_channels) take at most 1/L2_SHARE of it, in nearly equal blocks of whole tile
    rows."""
    tile_cols, tile_rows = -(-out_cols // 2), -(-out_rows // 2)
    per_tile = TRANSFORMED * 4 * (channels + block_channels)
    rows = max(1, l2 // L2_SHARE // per_tile // tile_cols)
    rows = -(-tile_rows // -(-tile_rows // rows))  # equal blocks
    span = 2 * tile_cols + 2
    return WinogradBlocks(tile_cols, 2 * rows, span, min(pad_left, span), min(span, in_cols + pad_left))
