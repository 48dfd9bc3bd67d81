"""Timing several runners side by side on a shared machine: round-robin rounds, medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


# between runners: long enough for the last runner's idle pools to stop spinning. Measured on a
# 2-vCPU Zen 3: after numpy's OpenBLAS (2 threads) the next 2-thread kernel ran 4x slower for about
# 100 ms, after onnxruntime's pool 1.8x for about 50 ms; with 50 ms of pause the runner after numpy
# was timed 25-50 % slow in every round
RUNNER_PAUSE_SECONDS = 0.2
# after the pause, untimed calls for this long: idle vCPUs come back slowly (after 0.25 s asleep the
# next five calls of a 2 ms kernel took 1.9x as long)
WAKE_SECONDS = 0.02


def wake(run: Callable[[], object], seconds: float = WAKE_SECONDS) -> None:
    """Call ``run`` untimed for at least ``seconds`` (at least once)."""
    started = time.perf_counter()
    run()
    while time.perf_counter() - started < seconds:
        run()


def round_robin_medians(runners: Mapping[K, Callable[[], object]], rounds: int,
                        min_seconds: float, pause_seconds: float = RUNNER_PAUSE_SECONDS,
                        wake_seconds: float = WAKE_SECONDS) -> dict[K, float]:
    """Seconds per call of each runner: every round runs each one for at least ``min_seconds``, in
    turn, so that drift on a shared machine touches all alike; the median of the rounds. Before its
    timed calls, each runner waits ``pause_seconds`` and is called untimed for ``wake_seconds`` (at
    least once: its threads wake up). Runners are expected warm (compiled, first-touched)."""
    samples: dict[K, list[float]] = {key: [] for key in runners}
    for _ in range(rounds):
        for key, run in runners.items():
            if pause_seconds > 0:
                time.sleep(pause_seconds)
            wake(run, wake_seconds)
            calls, spent = 0, 0.0
            while spent < min_seconds or calls == 0:
                started = time.perf_counter()
                run()
                spent += time.perf_counter() - started
                calls += 1
            samples[key].append(spent / calls)
    return {key: statistics.median(v) for key, v in samples.items()}
