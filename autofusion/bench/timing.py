"""Timing several runners side by side on a shared machine: round-robin rounds, medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


# between runners: long enough for the last runner's spinning pools to stop (numpy's OpenBLAS spun
# for under 10 ms here, and made the next runner's first calls 3x slower), short enough that the
# vCPUs stay awake
RUNNER_PAUSE_SECONDS = 0.05


def round_robin_medians(runners: Mapping[K, Callable[[], object]], rounds: int,
                        min_seconds: float, pause_seconds: float = RUNNER_PAUSE_SECONDS) -> dict[K, float]:
    """Seconds per call of each runner: every round runs each one for at least ``min_seconds``, in
    turn, so that drift on a shared machine touches all alike; the median of the rounds. Before its
    timed calls, each runner waits ``pause_seconds`` and makes one untimed call (its threads wake
    up). Runners are expected warm (compiled, first-touched)."""
    samples: dict[K, list[float]] = {key: [] for key in runners}
    for _ in range(rounds):
        for key, run in runners.items():
            if pause_seconds > 0:
                time.sleep(pause_seconds)
            run()
            calls, spent = 0, 0.0
            while spent < min_seconds or calls == 0:
                started = time.perf_counter()
                run()
                spent += time.perf_counter() - started
                calls += 1
            samples[key].append(spent / calls)
    return {key: statistics.median(v) for key, v in samples.items()}
