"""Loading compiled libraries with ctypes and passing numpy buffers to them."""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from autofusion.codegen.buffers import aligned_empty
from autofusion.graph.graph import Graph
from autofusion.ir.interpreter import InterpreterError, check_feeds


class RunError(ValueError):
    """Feeds that do not match the graph (missing, wrong shape or dtype), or a failed kernel call."""


def default_threads(threads: int | None = None) -> int:
    """``threads``, else ``$OMP_NUM_THREADS``, else 2."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        return threads
    env = os.environ.get("OMP_NUM_THREADS", "")
    try:
        return max(1, int(env.split(",")[0]))
    except ValueError:
        return 2


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


def pointer_array(arrays: Sequence[np.ndarray | None]) -> ctypes.Array[ctypes.c_void_p]:
    """A C array of the arrays' data pointers (kept alive by the caller)."""
    return (ctypes.c_void_p * max(1, len(arrays)))(*[None if a is None else data_address(a) for a in arrays])


def data_address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's data. Through the buffer protocol where the array is
    writable and not empty: a third of ``array.ctypes.data``'s time, which a small kernel's call feels."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):  # read-only, empty or strided: numpy's own way
        return int(array.ctypes.data)


class LibraryContext:
    """A loaded SuperKernel's context: its constants handed over once (``af_create``), kept alive
    here, and the context destroyed with its owner."""

    def __init__(self, owner: object, lib: ctypes.CDLL, constants: Sequence[tuple[str, np.ndarray]]) -> None:
        lib.af_create.restype = ctypes.c_void_p
        lib.af_create.argtypes = [ctypes.c_void_p]
        lib.af_destroy.argtypes = [ctypes.c_void_p]
        self.arrays = [np.ascontiguousarray(a) for _, a in constants]
        self._pointers = pointer_array(self.arrays)
        ctx = lib.af_create(ctypes.cast(self._pointers, ctypes.c_void_p))
        if not ctx:
            raise MemoryError("af_create could not allocate its context")
        self.ctx: int = ctx
        self._finalizer = weakref.finalize(owner, lib.af_destroy, ctx)


class WorkspacePool:
    """Workspaces for concurrent runs of one library: a call leases a free one, or a new one when
    every workspace is in use, so threads never share one and never wait for one.

    The pool holds as many workspaces as there were calls running at once at its peak; with
    ``limit``, at most that many, and a call beyond them waits for one to be returned. A call may
    ask for more than ``nbytes`` (a library over symbolic sizes needs what its binding needs): it
    gets the smallest free workspace that fits, else the largest free one is replaced by one that does.
    """

    def __init__(self, nbytes: int, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"a workspace pool needs a limit of at least 1, got {limit}")
        self.nbytes = max(64, nbytes)
        self.limit = limit
        self._free = [aligned_empty(self.nbytes)]
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(limit) if limit is not None else None
        self.allocated = 1

    @contextmanager
    def lease(self, nbytes: int | None = None) -> Iterator[np.ndarray]:
        workspace = self.acquire(nbytes)
        try:
            yield workspace
        finally:
            self.release(workspace)

    def acquire(self, nbytes: int | None = None) -> np.ndarray:
        """A workspace of ``nbytes`` (the pool's size by default) for one call; the caller hands it
        back with ``release`` (``lease`` does both around a block; a small kernel's call does them
        itself, sparing the context manager's microsecond)."""
        need = self.nbytes if nbytes is None else max(64, nbytes)
        if self._slots is not None:
            self._slots.acquire()
        try:
            with self._lock:
                workspace = self._take(need)
            return aligned_empty(need) if workspace is None else workspace  # allocated outside the lock
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    def release(self, workspace: np.ndarray) -> None:
        with self._lock:
            self._free.append(workspace)
        if self._slots is not None:
            self._slots.release()

    def _take(self, need: int) -> np.ndarray | None:
        """The smallest free workspace of ``need`` bytes or more; None when a new one must be made."""
        if len(self._free) == 1 and self._free[0].nbytes >= need:  # the common case, one call at a time
            return self._free.pop()
        fits = [i for i, w in enumerate(self._free) if w.nbytes >= need]
        if fits:
            return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
        if self._free:  # none is large enough: the largest gives way to one that is
            self._free.pop(max(range(len(self._free)), key=lambda i: self._free[i].nbytes))
        else:
            self.allocated += 1
        return None


def ready_feeds(names: Sequence[str], feeds: Mapping[str, np.ndarray], shapes: Sequence[tuple[int, ...]],
                dtypes: Sequence[np.dtype]) -> list[np.ndarray] | None:
    """The feeds in ``names``' order where each is already a C-contiguous array of its shape and
    dtype, as most calls give them; None sends the call through ``checked_feeds``, which converts
    what it can and names what it cannot."""
    out = []
    for name, shape, dtype in zip(names, shapes, dtypes):
        array = feeds.get(name)
        if (type(array) is not np.ndarray or array.shape != shape or array.dtype != dtype
                or not array.flags.c_contiguous):
            return None
        out.append(array)
    return out


def checked_feeds(graph: Graph, feeds: Mapping[str, np.ndarray],
                  shapes: Sequence[tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """Feeds as contiguous arrays of the declared shapes (or ``shapes``: see check_feeds) and dtypes,
    or RunError."""
    try:
        arrays = check_feeds(graph, feeds, shapes)
    except InterpreterError as e:
        raise RunError(str(e)) from None
    return {k: np.ascontiguousarray(v) for k, v in arrays.items()}
