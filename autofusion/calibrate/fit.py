"""Fitting the analytic profile's constants to measured kernel times, and scoring predictions.

The analytic model predicts ``overhead + max(sum of bytes / bandwidth[level], flops / peak)`` per
kernel, the weights' bytes at the level all the graph's weights fit in, the rest at the level of the
kernel's working set. Weights a matrix-product core streams are read at the speed the memory probe
measured for their level (calibrate/caches.py), where the prior has it, and are not fitted: the
loop nests' traffic fitted at 33 GB/s in L3 on a Xeon whose L3 streams 54, and priced an LSTM's
re-read weights 1.7x too slow.
Its constants (the per-kernel overhead, the bandwidth of every cache level that measured kernels'
working sets fell in, the peak flop rate) are fitted by robust least squares on log time, so a
10 microsecond kernel weighs as much as a 10 millisecond one. A level no kernel fell in keeps the
prior profile's value scaled like the nearest fitted level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import kendalltau

from autofusion.decide.cost import CacheLevel, GroupTerms, HardwareProfile, compute_parts

MIN_PER_LEVEL = 3  # kernels needed in a cache level to fit its bandwidth
BW = 4  # index of the first bandwidth parameter: overhead, peak, matmul peak and math peak come first
PRIOR_WEIGHT = 0.05  # pull of each log-constant towards the prior profile, against one kernel's log error
# a cache level is at most this many times faster than the next (kernels that small are all overhead,
# which leaves the fastest level's bandwidth free to run off)
MAX_LEVEL_STEP = 8.0


@dataclass(frozen=True)
class Accuracy:
    """How well predictions order and size measured times."""

    kendall_tau: float
    median_rel_error: float
    samples: int

    def to_json(self) -> dict[str, float | int]:
        return {"kendall_tau": self.kendall_tau, "median_rel_error": self.median_rel_error, "samples": self.samples}


def accuracy(predicted: Sequence[float], measured: Sequence[float]) -> Accuracy:
    """Kendall tau between predicted and measured times, and the median of ``|pred - meas| / meas``."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    if len(p) != len(m) or len(p) < 2:
        raise ValueError(f"need at least 2 predicted/measured pairs, got {len(p)} and {len(m)}")
    tau = kendalltau(p, m).statistic
    return Accuracy(0.0 if math.isnan(tau) else float(tau), float(np.median(np.abs(p - m) / m)), len(p))


def pair_agreement(predicted: Sequence[Sequence[float]], measured: Sequence[Sequence[float]],
                   min_ratio: float = 1.0) -> tuple[float, int]:
    """Over every pair of alternative plans of the same region whose measured times differ by at
    least ``min_ratio``: the fraction the prediction orders like the measurement, and the number of
    such pairs."""
    agree = total = 0
    for pred, meas in zip(predicted, measured):
        for i in range(len(pred)):
            for j in range(i + 1, len(pred)):
                if max(meas[i], meas[j]) < min_ratio * min(meas[i], meas[j]):
                    continue
                total += 1
                agree += (pred[i] < pred[j]) == (meas[i] < meas[j])
    return (agree / total if total else 0.0), total


def fit_profile(terms: Sequence[GroupTerms], seconds: Sequence[float], prior: HardwareProfile,
                launch_seconds: float, name: str, description: str) -> HardwareProfile:
    """The profile whose analytic predictions best match ``seconds`` (log least squares).

    Parameters are the per-kernel overhead, the plain, matmul and math-routine flop rates and the
    bandwidths, all on a log scale with a weak pull towards ``prior`` (so a constant the data cannot
    see, such as the bandwidth of a level where every kernel was compute-bound, stays near its
    prior). The matmul and math rates are fitted only when enough kernels contain an opaque core or
    a math routine. The per-element costs of ops in ``prior.op_seconds`` (measured separately) are
    kept, as is ``launch_seconds``, the launch part of the fitted per-kernel overhead; the rest of
    that overhead is synchronisation.
    """
    if len(terms) != len(seconds) or len(terms) < 4:
        raise ValueError(f"need at least 4 measured kernels to fit a profile, got {len(terms)}")
    splits = [t.memory_split() for t in terms]  # (bytes, where they live, streamed by a core) per part
    streamed = np.array([stream for *_, stream in splits[0]], dtype=bool)
    nbytes = np.array([[b for b, _, _ in split] for split in splits], dtype=np.float64)
    level = np.array([[prior.level_index(ws) for _, ws, _ in split] for split in splits])
    # read at the probe's measured speed, not fitted (in a cache level, where the prior has them)
    fixed = streamed[None, :] & (level < len(prior.stream_bandwidths))
    speeds = np.ones(len(prior.bandwidths))
    speeds[:len(prior.stream_bandwidths)] = prior.stream_bandwidths
    speeds = speeds[level]
    streamed_seconds = np.where(fixed, nbytes / speeds, 0.0).sum(axis=1)
    nbytes = np.where(fixed, 0.0, nbytes)
    parts = np.array([compute_parts(t, prior.op_seconds) for t in terms], dtype=np.float64)
    measured, plain, math_, matmul = parts.T
    target = np.log(np.asarray(seconds, dtype=np.float64))
    levels = len(prior.bandwidths)
    fitted = [lv for lv in range(levels) if int(((level == lv) & (nbytes > 0)).any(axis=1).sum()) >= MIN_PER_LEVEL]
    if not fitted:
        raise ValueError("no cache level has enough measured kernels to fit its bandwidth")
    fit_matmul = int((matmul > 0).sum()) >= MIN_PER_LEVEL
    fit_math = int((math_ > 0).sum()) >= MIN_PER_LEVEL
    prior_bw = np.array(prior.bandwidths)
    slow = list(reversed(fitted))  # fitted levels, slowest first

    def bandwidths(params: np.ndarray) -> np.ndarray:
        # params[BW] is the slowest fitted level's log bandwidth; each faster one adds a log step >= 0
        bw = prior_bw.copy()
        log_bw = params[BW]
        for k, lv in enumerate(slow):
            log_bw += params[BW + k] if k else 0.0
            bw[lv] = math.exp(log_bw)
        for lv in range(levels):
            if lv not in fitted:
                near = min(fitted, key=lambda f: abs(f - lv))
                bw[lv] = prior_bw[lv] * bw[near] / prior_bw[near]
        return np.minimum.accumulate(bw)  # a slower level never moves data faster than a faster one

    def predict(params: np.ndarray) -> np.ndarray:
        matmul_rate = math.exp(params[2] if fit_matmul else params[1])
        math_rate = math.exp(params[3] if fit_math else params[1])
        compute = measured + plain / math.exp(params[1]) + matmul / matmul_rate + math_ / math_rate
        memory = (nbytes / bandwidths(params)[level]).sum(axis=1) + streamed_seconds
        return math.exp(params[0]) + np.maximum(memory, compute)

    steps = [max(0.0, math.log(prior_bw[a] / prior_bw[b])) for b, a in zip(slow, slow[1:])]
    start = np.array([math.log(max(prior.launch_seconds + prior.sync_seconds, 1e-8)), math.log(prior.peak_flops),
                      math.log(prior.matmul_flops_rate), math.log(prior.math_flops_rate), math.log(prior_bw[slow[0]]),
                      *steps])

    def residual(params: np.ndarray) -> np.ndarray:
        return np.concatenate([np.log(predict(params)) - target, PRIOR_WEIGHT * (params - start)])

    lower = np.full(len(start), -np.inf)
    lower[BW + 1:] = 0.0
    upper = np.full(len(start), np.inf)
    upper[BW + 1:] = np.maximum(math.log(MAX_LEVEL_STEP), np.array(steps) + 1e-9) if steps else upper[BW + 1:]
    start = np.clip(start, lower, upper)
    params = least_squares(residual, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.3, max_nfev=2000).x
    overhead = math.exp(params[0])
    bw = bandwidths(params)
    launch = min(max(0.0, launch_seconds), overhead)
    caches = tuple(CacheLevel(c.level, c.bytes, float(bw[i])) for i, c in enumerate(prior.caches))
    matmul_peak = float(math.exp(params[2])) if fit_matmul else prior.matmul_peak_flops
    math_peak = float(math.exp(params[3])) if fit_math else prior.math_peak_flops
    return HardwareProfile(name, float(math.exp(params[1])), caches, float(bw[-1]), launch, overhead - launch,
                           description, matmul_peak, math_peak, prior.op_seconds,
                           prior.package_watts, prior.joules_per_byte, prior.energy_source,  # energy: not measured
                           prior.stream_bandwidths, prior.fitted_on)
