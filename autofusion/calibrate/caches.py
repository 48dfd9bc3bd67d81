"""The cache levels as a stream of reads sees them: how many bytes each really holds for the threads
kernels run on, and how fast it delivers them.

Linux reports a virtual machine's last-level cache as the host's whole one (a 2-vCPU Xeon: 480 MiB
of L3), shared with every other tenant. Reads of 8-64 MiB stream at 51 GB/s there and reads of 128
MiB or more at 21 GB/s: the LSTM's 6 MB of weights, re-read every step, come from L3, BERT's 440
MB from DRAM, where the reported sizes put both in L3 and one bandwidth fitted between the two
priced the LSTM 2.3x too slow. The probe times a read-only sum over growing buffers on the
calibration's threads; the last level's size becomes the largest buffer still read at cache speed.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.decide.cost import CacheLevel
from autofusion.runtime import CompileError, Toolchain, detect_toolchain

SMALLEST = 64 << 10
LARGEST = 1 << 30  # bytes; less where the machine has less memory free (a quarter of it)
SECONDS_PER_SIZE = 0.005  # reads per round, at least: each size is read for 3 rounds of this
PLATEAU_MARGIN = 4  # the last level's own speed is read from buffers this many times the level before it
MIN_DROP = 1.3  # a last level read at less than this times DRAM's speed is not told apart from it

_PROBE_C = r"""
#include <stdint.h>
/* reps sums of a[0..n) (n a multiple of 128) on `threads` threads, each reading the same share
   every time (as a kernel's threads do) into 128 independent lanes (no chain of dependent adds
   slows the reads); the total goes to *sink, so no read is skipped */
__attribute__((visibility("default"))) void af_read_sums(const float* restrict a, int64_t n, int reps, int threads, float* sink)
{
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+:total)
    {
        float acc[128] = {0};
        for (int r = 0; r < reps; ++r) {
#pragma omp for schedule(static) nowait
            for (int64_t i = 0; i < n; i += 128)
                for (int l = 0; l < 128; ++l) acc[l] += a[i + l];
        }
        for (int l = 0; l < 128; ++l) total += acc[l];
    }
    *sink = total;
}
"""


@dataclass(frozen=True)
class ReadSample:
    """A buffer of ``bytes`` read at ``bandwidth`` bytes per second (the fastest of 3 rounds)."""

    bytes: int
    bandwidth: float


def probe_reads(threads: int, toolchain: Toolchain | None = None, largest: int | None = None,
                smallest: int = SMALLEST, last_level: int = 0) -> tuple[ReadSample, ...]:
    """Time read-only sums over buffers from ``smallest`` bytes, doubling, on ``threads`` threads,
    until two sizes beyond ``last_level`` bytes read alike after a drop (DRAM reached) or at
    ``largest``. CompileError where the probe does not build."""
    tc = toolchain or detect_toolchain()
    largest = largest or _largest_buffer()
    with tempfile.TemporaryDirectory(prefix="autofusion-caches-") as tmp:
        lib = _build(tc, Path(tmp))
        fn = lib.af_read_sums
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        # small pages (numpy asks for huge ones, which this VM faulted in at 5.8 s a GiB, 0.6 s small)
        memory = mmap.mmap(-1, largest)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):  # also where huge pages are the system's default
            memory.madvise(mmap.MADV_NOHUGEPAGE)
        buffer = np.frombuffer(memory, np.float32)
        sink = np.zeros(1, np.float32)
        samples: list[ReadSample] = []
        size, written = smallest, 0
        while size <= largest and not _beyond_caches(samples, last_level):
            buffer[written:size // 4] = 1.0  # pages written before they are read (unwritten ones all read one zero page)
            written = size // 4
            samples.append(ReadSample(size, _bandwidth(fn, buffer, size, threads, sink)))
            size *= 2
        del buffer
        memory.close()
    return tuple(samples)


def contended(samples: Sequence[ReadSample]) -> bool:
    """Whether the probe's reads look slowed by other work: the smallest buffer, in L1, is read at
    less than half the fastest speed (beside a test suite on both cores, each call waited ~5 ms
    for its threads: 13 MB/s at 64 KiB, 540 MB/s at 4 MiB)."""
    return bool(samples) and samples[0].bandwidth < 0.5 * max(s.bandwidth for s in samples)


def _beyond_caches(samples: Sequence[ReadSample], last_level: int) -> bool:
    """Whether the last two samples read alike, below MIN_DROP times a faster read beyond the
    caches' reported bytes' quarter (DRAM reached), or the last is 4 times the reported bytes."""
    if len(samples) < 3:
        return False
    a, b = samples[-2], samples[-1]
    if b.bytes >= 4 * last_level > 0:
        return True
    faster = max(s.bandwidth for s in samples[:-2])
    return abs(a.bandwidth - b.bandwidth) <= 0.1 * b.bandwidth and faster >= MIN_DROP * b.bandwidth \
        and b.bytes > last_level // 4


def _largest_buffer() -> int:
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        free = 4 * LARGEST
    largest = 1 << max(20, int(math.log2(max(free // 4, 1))))
    return min(LARGEST, largest)


def _build(tc: Toolchain, workdir: Path) -> ctypes.CDLL:
    src, lib = workdir / "caches.c", workdir / "caches.so"
    src.write_text(_PROBE_C)
    cmd = [tc.cc, *tc.cflags, "-shared", str(src), "-o", str(lib), *tc.ldflags]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"the memory probe did not build: {e}") from None
    if done.returncode != 0:
        raise CompileError(f"the memory probe did not build: {done.stderr.strip()[:500]}")
    return ctypes.CDLL(str(lib))


def _bandwidth(fn: Any, buffer: np.ndarray, size: int, threads: int, sink: np.ndarray) -> float:
    """Bytes per second of the fastest of 3 rounds of sums over ``buffer[:size]``."""
    n = size // 4
    fn(buffer.ctypes.data, n, 1, threads, sink.ctypes.data)  # warm: the buffer where it will stay
    reps = 1
    while True:  # enough sums that a round takes SECONDS_PER_SIZE
        start = time.perf_counter()
        fn(buffer.ctypes.data, n, reps, threads, sink.ctypes.data)
        took = time.perf_counter() - start
        if took >= SECONDS_PER_SIZE or reps >= 1 << 20:
            break
        reps *= 2
    best = took / reps
    for _ in range(2):
        start = time.perf_counter()
        fn(buffer.ctypes.data, n, reps, threads, sink.ctypes.data)
        best = min(best, (time.perf_counter() - start) / reps)
    return size / best


def measured_levels(reported: Sequence[tuple[str, int]], samples: Sequence[ReadSample],
                    threads: int) -> tuple[tuple[CacheLevel, ...], float]:
    """(cache levels, DRAM bandwidth) from ``reported`` (name, bytes per core or shared, smallest
    first) and the probe's ``samples``: each level keeps its reported size, but the last, where the
    probe read buffers beyond it at DRAM speed (the largest buffer's), shrinks to the largest
    buffer still read faster than the geometric mean of its own speed and DRAM's; each level's
    bandwidth is the fastest read of a buffer it holds (on ``threads`` threads: private levels hold
    ``threads`` times their size), or the level before it's where the probe read none it holds."""
    samples = sorted(samples, key=lambda s: s.bytes)
    if not reported or len(samples) < 2:
        raise ValueError("need the reported cache levels and at least 2 probe samples")
    dram = samples[-1].bandwidth
    sizes = [size for _, size in reported]
    last = len(sizes) - 1
    if last >= 2:  # a shared last level (L3): private ones are what each core has, VM or not
        below = sizes[last - 1] * threads
        own = [s.bandwidth for s in samples if PLATEAU_MARGIN * below <= s.bytes <= sizes[last]]
        own = own or [s.bandwidth for s in samples if below < s.bytes <= sizes[last]]
        if own and max(own) >= MIN_DROP * dram:
            threshold = math.sqrt(max(own) * dram)
            fast = [s.bytes for s in samples if below < s.bytes <= sizes[last] and s.bandwidth >= threshold]
            slow_beyond = all(s.bandwidth < threshold for s in samples if s.bytes > max(fast, default=0))
            if fast and slow_beyond:
                sizes[last] = max(fast)
    levels: list[CacheLevel] = []
    for i, (name, _) in enumerate(reported):
        low = sizes[i - 1] * (threads if i - 1 < last else 1) if i else 0
        high = sizes[i] * (threads if i < last else 1)
        held = [s.bandwidth for s in samples if low < s.bytes <= high]
        bandwidth = max(held) if held else (levels[-1].bandwidth if levels else samples[0].bandwidth)
        levels.append(CacheLevel(name, sizes[i], bandwidth))
    return tuple(levels), dram
