"""One runner measured in a process of its own:
``python -m autofusion.bench.worker JOB NAME OUT [--no-per-kernel]``.

The parent (:func:`autofusion.bench.harness.measure_in_worker`) pickles the job once (graph, plan,
feeds, reference outputs, settings); each worker loads it, measures one runner with
:func:`autofusion.bench.harness.measure` and pickles the :class:`~autofusion.bench.harness.Measured`
back. Workers use the built-in ops plus installed
plugins' (the registry the command line uses).
"""

from __future__ import annotations

import pickle
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autofusion.bench.harness import measure
from autofusion.bench.runners import BenchSetup


def main(argv: Sequence[str] | None = None) -> int:
    from dataclasses import replace

    from autofusion.bench.environment import fix_malloc_threshold, limit_threads
    from autofusion.plugins import kinds_with_plugins, registry_with_plugins

    args = list(argv if argv is not None else sys.argv[1:])
    job_path, name, out_path = args[:3]
    per_kernel = "--no-per-kernel" not in args[3:]
    with open(job_path, "rb") as f:
        job: dict[str, Any] = pickle.load(f)
    limit_threads(job["threads"])
    fix_malloc_threshold()
    with tempfile.TemporaryDirectory(prefix="autofusion-bench-") as tmp:
        registry = registry_with_plugins()
        plan = replace(job["plan"], registry=registry, kinds=kinds_with_plugins())
        setup = BenchSetup(job["graph"], plan, job["feeds"], job["threads"], registry, Path(tmp))
        measured = measure(name, setup, job["reference"], job["repeat"], job["warmup"], job["rtol"], job["atol"],
                           per_kernel=per_kernel)
    with open(out_path, "wb") as f:
        pickle.dump(measured, f, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
