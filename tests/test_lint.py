"""The package stays ruff-clean and type-checks under mypy (both are in the ``test`` extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "autofusion", "tests", "benchmarks", "scripts"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "autofusion"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
