"""Memory for outputs that outlive the call (the torch backend's tensors), reused once released.

A fresh buffer of a few hundred KiB comes from the system as pages that fault in when the kernel
first writes them: the training encoder's steps took 800-1,500 such faults each, nearly all inside
our kernels, where two threads faulting at once also wait on each other. The pool keeps buffers per
output of a library and hands out arrays over them; a buffer is free again once no array over it
is left (the caller's tensors hold the array, numpy views of it hold the buffer's owner), so memory
the caller still reaches is never handed out twice.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence

import numpy as np

from autofusion.codegen.buffers import ALIGN

MAX_BLOCKS_PER_OUTPUT = 8  # outputs of more calls than this alive at once are not pooled


class _Block:
    """One buffer. Every array made from it (and every view of those) refers to ``owner``, the
    array that owns the memory, so it is free when nothing but the block refers to ``owner``."""

    __slots__ = ("owner", "start", "nbytes", "idle")

    def __init__(self, nbytes: int) -> None:
        self.owner = np.empty(nbytes + ALIGN, dtype=np.uint8)
        self.start = (-self.owner.ctypes.data) % ALIGN
        self.nbytes = nbytes
        self.idle = sys.getrefcount(self.owner)  # measured as free() measures: no array over it yet

    def free(self) -> bool:
        return sys.getrefcount(self.owner) <= self.idle

    def array(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        return self.owner[self.start:self.start + self.nbytes].view(dtype).reshape(shape)


class OutputPool:
    """Buffers for each output of one library: ``arrays`` gives one array per output, over a
    buffer no earlier array still uses (a new one when every buffer of that output is in use)."""

    def __init__(self, outputs: int) -> None:
        self._blocks: list[list[_Block]] = [[] for _ in range(outputs)]
        self._lock = threading.Lock()

    def arrays(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[np.dtype]) -> list[np.ndarray]:
        """C-contiguous arrays of ``shapes`` and ``dtypes``, one per output, on 64-byte boundaries."""
        out = []
        with self._lock:  # concurrent calls never get one buffer
            for blocks, shape, dtype in zip(self._blocks, shapes, dtypes):
                nbytes = math.prod(shape) * dtype.itemsize
                block = next((b for b in blocks if b.nbytes == nbytes and b.free()), None)
                if block is None:
                    if len(blocks) >= MAX_BLOCKS_PER_OUTPUT:  # (the caller keeps many calls' outputs)
                        blocks.remove(next((b for b in blocks if b.free()), blocks[0]))
                    block = _Block(nbytes)
                    blocks.append(block)
                out.append(block.array(shape, dtype))
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers the pool holds, in use or free."""
        return sum(b.nbytes for blocks in self._blocks for b in blocks)
