"""Measured choice of each Triton kernel's launch configuration (block sizes, warps), cached per device.

A kernel renders with a short list of configurations (``codegen/triton/configs.py``, the default
first). The first time a model runs on a device, each kernel with more than one is launched with
every configuration on the call's own tensors (one the device cannot run, a block too large for its
shared memory, is left out) (kernels only write their outputs, so launching one
again changes nothing), timed round-robin, and the fastest kept; the default stays unless another is
at least MARGIN faster (a coin flip on a noisy device should not change the code).

Results live in one file per device under the compile cache (``triton-tuning/<fingerprint>.json``),
keyed by the kernel's source (its shapes and code); the fingerprint covers the device's name and
the Triton and torch versions. A file that is damaged, edited or foreign is ignored with a warning
and rewritten, never trusted (``runtime.entry_file``). Timing the interpreter says nothing about a
device: on the CPU the runner does not tune unless asked to.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from autofusion.codegen.triton import TritonKernel
from autofusion.codegen.triton.configs import Config, label
from autofusion.runtime.cache import CompileCache
from autofusion.runtime.entry_file import EntryFile

FORMAT = 1
MARGIN = 0.03  # another configuration replaces the default only when at least 3 % faster
ROUNDS = 5  # timed samples per configuration, round-robin
REPEATS = 10  # launches per sample on a device

Timer = Callable[[Callable[[], object]], float]  # seconds one call of the argument takes
Launch = Callable[[Config], object]  # the kernel launched on the call's tensors with a configuration


class TritonTuningWarning(UserWarning):
    """A Triton tuning file was damaged or foreign and has been ignored."""


def device_key(device: str) -> str:
    """What the tuning of ``device`` is valid for: the device's name, Triton's and torch's versions."""
    import torch
    import triton

    name = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else "cpu (Triton's interpreter)"
    return f"{name}|triton {triton.__version__}|torch {torch.__version__}"


def cuda_timer(device: str) -> Timer:
    """Seconds of one launch on a CUDA device: the median of REPEATS launches timed by events."""
    import torch

    def timed(call: Callable[[], object]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(REPEATS):
            call()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3 / REPEATS

    return timed


def wall_timer(call: Callable[[], object]) -> float:
    """Seconds of one call by the wall clock (on the CPU, where the launch runs before it returns)."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _config_of(entry: Any) -> Config:
    return tuple((str(k), int(v)) for k, v in entry["config"])


def _valid_entry(key: str, entry: Any) -> None:
    if not _config_of(entry):
        raise ValueError(f"entry {key}: an empty configuration")


class TritonTuningStore:
    """The tuned configurations of one device, loaded from and saved to disk."""

    def __init__(self, cache: CompileCache, device: str) -> None:
        self.device = device_key(device)
        self.fingerprint = hashlib.sha256(f"{FORMAT}|{self.device}".encode()).hexdigest()
        self.path = cache.root / "triton-tuning" / f"{self.fingerprint[:24]}.json"
        self.file = EntryFile(self.path, self.fingerprint, FORMAT, _valid_entry)
        self.problem = ""  # why the file on disk was ignored, if it was
        self._lock = threading.Lock()
        self.entries, why = self.file.read()
        if why:
            self.problem = f"Triton tuning cache {self.path} {why}: ignored, kernels are tuned again"
            warnings.warn(self.problem, TritonTuningWarning, stacklevel=3)

    @staticmethod
    def key(kernel: TritonKernel) -> str:
        return hashlib.sha256(kernel.source.encode()).hexdigest()[:32]

    def get(self, kernel: TritonKernel) -> Config | None:
        """The stored configuration, if it is one of the kernel's (a file written by other code is not forced on it)."""
        entry = self.entries.get(self.key(kernel))
        if entry is None:
            return None
        cfg = _config_of(entry)
        return cfg if cfg in kernel.configs else None

    def put(self, kernel: TritonKernel, cfg: Config, times: Mapping[Config, float]) -> None:
        with self._lock:
            self.entries = {**self.entries, self.key(kernel): {
                "kernel": kernel.name, "config": [list(p) for p in cfg],
                "times_us": {label(c): round(t * 1e6, 3) for c, t in times.items()}}}

    def save(self) -> None:
        """Write the entries, merged with what another process saved since this one loaded."""
        with self._lock:
            self.entries, failed = self.file.save(self.entries, {"device": self.device})
        if failed:
            warnings.warn(f"Triton tuning cache {self.path} not written: {failed}", TritonTuningWarning, stacklevel=2)


class TritonTuner:
    """Answers from the store; times the kernels it has not seen, with ``timer``."""

    def __init__(self, store: TritonTuningStore, timer: Timer) -> None:
        self.store, self.timer = store, timer
        self.tuned = 0  # kernels measured by this tuner (not answered from the store)

    def cached(self, kernel: TritonKernel) -> Config | None:
        """The stored configuration, the default for a kernel with one, else None."""
        return kernel.default if len(kernel.configs) == 1 else self.store.get(kernel)

    def choose(self, kernel: TritonKernel, launch: Launch) -> Config:
        """The kernel's configuration: from the store, or measured now with ``launch`` (then stored;
        the caller saves the store once its run is over)."""
        hit = self.cached(kernel)
        if hit is not None:
            return hit
        usable: list[Config] = []
        for cfg in kernel.configs:  # the first launch of each compiles it: not timed
            try:
                launch(cfg)
            except Exception:  # noqa: BLE001 - a block too large for this device (shared memory, registers)
                if cfg == kernel.default:
                    raise  # what the backend always runs: its own error, not a tuning problem
                continue
            usable.append(cfg)
        samples: dict[Config, list[float]] = {cfg: [] for cfg in usable}
        for r in range(ROUNDS):
            for cfg in usable[r % len(usable):] + usable[:r % len(usable)]:
                samples[cfg].append(self.timer(lambda cfg=cfg: launch(cfg)))  # type: ignore[misc]
        times = {cfg: statistics.median(s) for cfg, s in samples.items()}
        best = min(times, key=times.__getitem__)
        chosen = best if times[best] <= times[kernel.default] * (1 - MARGIN) else kernel.default
        self.store.put(kernel, chosen, times)
        self.tuned += 1
        return chosen
