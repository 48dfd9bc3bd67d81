"""Campaigns under AddressSanitizer and UBSan: every case's SuperKernel built with the sanitizers
and run in a child process started under their runtime (runtime/sanitize.py).

A finding ends the child: the case it was running is reported as a ``failure`` with its seed and
the sanitizer's report, and a new child goes on from the next seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autofusion.fuzz.cases import case_for
from autofusion.fuzz.differential import CampaignReport, CaseResult
from autofusion.runtime.sanitize import findings, sanitizer_env
from autofusion.runtime.toolchain import compiler_name

REPORT_LINES = 6  # of the sanitizer's report kept in a failure's detail


def worker_command(seed: int, cases: int, shapes: str, max_ops: int, cache: str | Path | None,
                   triton: bool) -> list[str]:
    cmd = [sys.executable, "-m", "autofusion.fuzz.worker", "--seed", str(seed), "--cases", str(cases),
           "--shapes", shapes, "--max-ops", str(max_ops)]
    return cmd + (["--cache", str(cache)] if cache else []) + (["--triton"] if triton else [])


def run_sanitized_campaign(cases: int, seed: int, cache: str | Path | None = None, max_ops: int = 7,
                           shapes: str = "small", triton: bool = False,
                           command: Sequence[str] | None = None) -> CampaignReport:
    """Cases ``seed .. seed + cases - 1`` as :func:`run_campaign` runs them, sanitized. ``command``
    replaces the worker's command line (its seed and count are appended)."""
    env = sanitizer_env(compiler_name())
    package_root = str(Path(__file__).resolve().parents[2])  # a source checkout runs without installing
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    report = CampaignReport()
    t0 = time.perf_counter()
    next_seed, end = seed, seed + cases
    while next_seed < end:
        cmd = ([*command, "--seed", str(next_seed), "--cases", str(end - next_seed)] if command is not None
               else worker_command(next_seed, end - next_seed, shapes, max_ops, cache, triton))
        crashed = _run_worker(cmd, env, report, next_seed)
        if crashed is None:
            break
        strategy = case_for(crashed[0], shapes, max_ops).strategy
        report.add(CaseResult(crashed[0], strategy, "failure", crashed[1], "sanitized"))
        next_seed = crashed[0] + 1
    report.seconds = time.perf_counter() - t0
    return report


def _run_worker(cmd: list[str], env: dict[str, str], report: CampaignReport, first: int
                ) -> tuple[int, str] | None:
    """Run one child from seed ``first``, counting its results; (seed, what happened) when it died
    during a case, None when it ran every case."""
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        running: int | None = None
        for line in proc.stdout:
            event = _event(line)
            if isinstance(event.get("start"), int):
                running = int(event["start"])
            elif isinstance(event.get("result"), dict):
                report.add(CaseResult(**event["result"]))
                running = None
        rc = proc.wait()
        err.seek(0)
        stderr = err.read()
    if running is None and rc == 0:
        return None
    found = findings(stderr)
    detail = ("sanitizer: " + " | ".join(found[:REPORT_LINES]) if found
              else f"worker exited with status {rc}: {stderr.strip()[-400:]}")
    return (first if running is None else running), detail  # died before its first case: that seed


def _event(line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return {}  # something else printed to stdout (a library's warning): not an event
    return event if isinstance(event, dict) else {}
