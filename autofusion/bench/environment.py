"""The conditions of a measurement: thread limits for every library, memory probes, machine facts.

Benchmarks compare runtimes that each bring a thread pool (OpenMP in the generated kernels,
OpenBLAS in numpy, onnxruntime's own, torch's), so every one of them is held to the same count.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# symbols OpenBLAS builds export for setting their thread count (plain, scipy-openblas, 64-bit ints)
_OPENBLAS_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads",
                     "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_")
MMAP_THRESHOLD = 128 * 1024  # glibc's default, fixed so freed large buffers go back to the system


def limit_threads(threads: int) -> list[str]:
    """Hold every thread pool in this process to ``threads``; returns what was set.

    The environment variables reach libraries loaded from now on (torch, onnxruntime, OpenMP);
    OpenBLAS copies already loaded (numpy's, the runtime's) are set through their own API.
    """
    for var in THREAD_VARIABLES:
        os.environ[var] = str(threads)
    done = [f"{var}={threads}" for var in THREAD_VARIABLES]
    for path in _loaded_libraries("openblas"):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in _OPENBLAS_SETTERS:
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter(ctypes.c_int(threads))
                done.append(f"{Path(path).name}:{symbol}({threads})")
                break
    return done


def _loaded_libraries(fragment: str) -> list[str]:
    """Paths of shared libraries mapped into this process whose file name contains ``fragment``."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = {line.split(None, 5)[5].strip() for line in text.splitlines() if len(line.split(None, 5)) == 6}
    return sorted(p for p in paths if fragment in Path(p).name and ".so" in Path(p).name)


# where glibc's own threshold rises in a long-running process (its dynamic maximum on 64-bit); its
# trim threshold rises with it, to twice as much, so freed heap is kept for the next call
STEADY_MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 128 * 1024  # glibc's default
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def fix_malloc_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (and its trim threshold with it): by default at 128 KiB, so large
    buffers are returned to the system when freed; :func:`steady_allocator` holds it high.

    Without it glibc raises the threshold after the first large free and keeps later buffers in
    its heap, and a runner measured after another would show no RSS growth. False off glibc, or
    where glibc refused a setting.
    """
    libc = _libc()
    if libc is None:
        return False
    trim = 2 * threshold if threshold > MMAP_THRESHOLD else TRIM_THRESHOLD  # as glibc moves them together
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, trim))


@contextmanager
def steady_allocator() -> Iterator[bool]:
    """Timed runs with large buffers kept in the heap, as a long-running process keeps them once
    glibc has raised its threshold, fixed so that no runner's time depends on how far that has
    gone (a fresh mmap per call faults in every page: torch's convolution backward took 4.9-5.3 ms
    in processes where it had not, 1.6-1.8 ms where it had). Afterwards the probes' threshold
    comes back and free heap memory is returned, so the next runner's memory is its own. Yields
    False off glibc."""
    ok = fix_malloc_threshold(STEADY_MMAP_THRESHOLD)
    try:
        yield ok
    finally:
        libc = _libc()
        if libc is not None:  # also after a partial failure: the probes' thresholds, whatever was set
            fix_malloc_threshold()
            libc.malloc_trim(0)


def status_kib(field: str) -> int | None:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM), None where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size (VmHWM)
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class MemoryProbe:
    """Peak memory of one call and how it was measured."""

    peak_bytes: int | None
    method: str


RSS_METHOD = "rss: peak resident set during the first run minus resident set before it"
TRACEMALLOC_METHOD = "tracemalloc: peak of Python/numpy allocations during one run"


def peak_rss_delta(call: Callable[[], Any]) -> MemoryProbe:
    """Run ``call`` once; how far the resident set peaked above where it started."""
    if not _reset_peak_rss():
        call()
        return MemoryProbe(None, "rss unavailable: cannot reset the peak resident set on this system")
    before = status_kib("VmRSS")
    result = call()  # held while the peak is read: freeing it first can leave VmHWM behind on some kernels
    peak, now = status_kib("VmHWM"), status_kib("VmRSS")
    del result
    if before is None or peak is None or now is None:
        return MemoryProbe(None, "rss unavailable: /proc/self/status has no VmRSS/VmHWM")
    return MemoryProbe(max(0, max(peak, now) - before) * 1024, RSS_METHOD)


def peak_traced(call: Callable[[], Any]) -> MemoryProbe:
    """Run ``call`` once under tracemalloc; the peak of what it allocated (numpy arrays included)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    return MemoryProbe(max(0, peak - base), TRACEMALLOC_METHOD)


def peak_rss_kib() -> int | None:
    """This process's peak resident set so far (KiB)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
    except (ImportError, OSError):
        return status_kib("VmHWM")


def cpu_count() -> int:
    """CPUs this process may run on (affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """The facts a reader needs to weigh the numbers: CPU, cores, versions."""
    import numpy as np

    from autofusion.codegen.cores import cache_sizes, cpu_model, native_isa
    from autofusion.runtime.toolchain import blas_config

    l1d, l2 = cache_sizes()
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "isa": native_isa(),
        "l1d_bytes": l1d,
        "l2_bytes": l2,
        "kernels_built_for": _kernels_isa(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "openblas": blas_config(),  # the version and the core its kernels run for
        "cpus_usable": cpu_count(),
        "cpus_total": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
    }
    for module in ("onnxruntime", "torch"):
        mod = sys.modules.get(module)
        if mod is not None:
            info[module] = getattr(mod, "__version__", "?")
    return info


def _kernels_isa() -> str:
    from autofusion.runtime.toolchain import CompileError, detect_toolchain

    try:
        return detect_toolchain().isa
    except CompileError as e:
        return f"none ({e})"


@contextmanager
def quiet_stderr_fd() -> Iterator[None]:
    """Silence native libraries writing straight to file descriptor 2 (e.g. compiler warnings)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
