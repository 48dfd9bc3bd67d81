"""One runner measured in a process of its own:
``python -m autofusion.bench.worker JOB NAME OUT [--no-per-kernel]``.

The parent pickles the job once (graph, plan, feeds, reference outputs, settings); each worker
loads it, measures one runner with :func:`autofusion.bench.harness.measure` and pickles the
:class:`~autofusion.bench.harness.Measured` back. Workers use the built-in ops plus installed
plugins' (the registry the command line uses).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autofusion.bench.harness import Measured, measure
from autofusion.bench.runners import BenchSetup, Outputs

STDERR_LINES = 8


def write_job(path: Path, setup: BenchSetup, reference: Outputs, repeat: int, warmup: int, rtol: float,
              atol: float) -> None:
    job = {"graph": setup.graph, "plan": setup.plan, "feeds": setup.feeds, "threads": setup.threads,
           "reference": dict(reference), "repeat": repeat, "warmup": warmup, "rtol": rtol, "atol": atol}
    with open(path, "wb") as f:
        pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)


def measure_in_worker(job: Path, name: str, per_kernel: bool = True) -> Measured:
    """Run the worker for runner ``name`` on the job file; a crashed worker is a failed runner."""
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    out = job.with_name(f"{name}.result.pkl")
    r = subprocess.run([sys.executable, "-m", "autofusion.bench.worker", str(job), name, str(out),
                        *([] if per_kernel else ["--no-per-kernel"])],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0 or not out.exists():
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-STDERR_LINES:])
        return Measured(name, failed=f"worker process exited with status {r.returncode}: {tail}")
    with open(out, "rb") as f:
        measured: Measured = pickle.load(f)
    return measured


def main(argv: Sequence[str] | None = None) -> int:
    from autofusion.bench.environment import fix_malloc_threshold, limit_threads
    from autofusion.plugins import registry_with_plugins

    args = list(argv if argv is not None else sys.argv[1:])
    job_path, name, out_path = args[:3]
    per_kernel = "--no-per-kernel" not in args[3:]
    with open(job_path, "rb") as f:
        job: dict[str, Any] = pickle.load(f)
    limit_threads(job["threads"])
    fix_malloc_threshold()
    with tempfile.TemporaryDirectory(prefix="autofusion-bench-") as tmp:
        setup = BenchSetup(job["graph"], job["plan"], job["feeds"], job["threads"], registry_with_plugins(), Path(tmp))
        measured = measure(name, setup, job["reference"], job["repeat"], job["warmup"], job["rtol"], job["atol"],
                           per_kernel=per_kernel)
    with open(out_path, "wb") as f:
        pickle.dump(measured, f, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
