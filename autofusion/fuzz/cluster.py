"""Fuzz campaigns spread over a Ray cluster (the ``cluster`` extra: ``pip install autofusion[cluster]``).

The seeds are cut into chunks; each chunk is one Ray task that runs :func:`run_campaign` (or the
sanitized campaign) on its seeds where Ray places it, and the driver merges the chunks' results in
seed order into one report, the same JSON a single-machine campaign gives. Without an address a
local Ray is started for the run (and stopped after it); with one, the campaign joins that cluster,
whose workers need autofusion installed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from autofusion.fuzz.differential import CampaignReport

CHUNKS_PER_CPU = 4  # enough chunks that a slow one does not hold the campaign back


class RayUnavailable(RuntimeError):
    """``--ray`` without Ray installed, or a cluster address Ray cannot reach."""


def _chunk(seed: int, cases: int, shapes: str, max_ops: int, cache: str | None, triton: bool,
           sanitize: bool) -> CampaignReport:
    """One task: the campaign of seeds ``seed .. seed + cases - 1``, where Ray placed it."""
    from autofusion.fuzz.differential import run_campaign
    from autofusion.fuzz.sanitized import run_sanitized_campaign

    campaign = run_sanitized_campaign if sanitize else run_campaign
    return campaign(cases, seed, cache=cache, max_ops=max_ops, triton=triton, shapes=shapes)


def run_ray_campaign(cases: int, seed: int, cache: str | Path | None = None, max_ops: int = 7,
                     shapes: str = "small", triton: bool = False, sanitize: bool = False,
                     address: str | None = None, num_cpus: int | None = None) -> CampaignReport:
    """Cases ``seed .. seed + cases - 1`` over the Ray cluster at ``address`` (None: a local Ray
    with ``num_cpus`` workers, default all of this machine's)."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'autofusion[cluster]'") from None
    started = not ray.is_initialized()
    if started:
        runtime_env = {}
        if address is None:  # a local Ray's workers import a source checkout too; a cluster's have their own
            package_root = str(Path(__file__).resolve().parents[2])
            path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
            runtime_env = {"env_vars": {"PYTHONPATH": path}}
        try:
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                     log_to_driver=False, runtime_env=runtime_env)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayUnavailable(f"cannot reach the Ray cluster at {address}: {e}") from None
    try:
        return _gather(ray, cases, seed, None if cache is None else str(cache), max_ops, shapes, triton, sanitize)
    finally:
        if started:
            ray.shutdown()


def _gather(ray: Any, cases: int, seed: int, cache: str | None, max_ops: int, shapes: str, triton: bool,
            sanitize: bool) -> CampaignReport:
    t0 = time.perf_counter()
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = max(1, -(-cases // (cpus * CHUNKS_PER_CPU)))
    task = ray.remote(num_cpus=1)(_chunk)
    futures = [task.remote(s, min(size, seed + cases - s), shapes, max_ops, cache, triton, sanitize)
               for s in range(seed, seed + cases, size)]
    report = CampaignReport()
    for part in ray.get(futures):  # in seed order, as one machine would list them
        report.merge(part)
    report.workers = cpus
    report.seconds = time.perf_counter() - t0
    return report
