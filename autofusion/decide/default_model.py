"""Which cost model the engine uses when none is given: the calibration file found (a user's
``autofusion calibrate`` run, or ``$AUTOFUSION_CALIBRATION``), else the analytic model.

It sits above both models (``cost`` and ``learned``), so that neither imports the other's way.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Any

from autofusion.decide.cost import AnalyticCostModel, CostModel
from autofusion.decide.learned import load_calibration
from autofusion.ops.registry import OpRegistry

CALIBRATION_ENV = "AUTOFUSION_CALIBRATION"
CALIBRATION_OFF = ("none", "off", "analytic")


def user_calibration_path() -> Path:
    """Where ``autofusion calibrate`` writes by default: ``$AUTOFUSION_CACHE`` or ``~/.cache/autofusion``."""
    env = os.environ.get("AUTOFUSION_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "autofusion"
    return root / "calibration.json"


def calibration_file() -> Path | None:
    """The calibration the engine uses by default, first found of: ``$AUTOFUSION_CALIBRATION`` (a
    path; ``none`` turns calibration off) and the user's calibration (:func:`user_calibration_path`).
    The calibration shipped in ``profiles/calibrated`` is not a default: it was measured with compiler
    flags the runtime no longer uses (name it in the variable to use it anyway)."""
    env = os.environ.get(CALIBRATION_ENV, "").strip()
    if env.lower() in CALIBRATION_OFF:
        return None
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise ValueError(f"${CALIBRATION_ENV} names {env!r}, which is not a file "
                             f"(run `autofusion calibrate --out {env}` or unset it)")
        return path
    user = user_calibration_path()
    return user if user.is_file() else None


def default_cost_model(registry: OpRegistry | None = None) -> CostModel:
    """The calibrated model of :func:`calibration_file` (the kind its fit chose), else the analytic
    model with the shipped ``cpu-2core`` profile. A broken user calibration falls back with a warning;
    a broken file named by ``$AUTOFUSION_CALIBRATION`` is an error."""
    path = calibration_file()
    if path is None:
        return AnalyticCostModel(registry=registry)
    try:
        stat = path.stat()
        return _cached_calibration(str(path), stat.st_mtime_ns, stat.st_size).cost_model(registry=registry)
    except ValueError as e:
        if os.environ.get(CALIBRATION_ENV, "").strip():
            raise
        warnings.warn(f"{e}; using the uncalibrated analytic model", RuntimeWarning, stacklevel=2)
        return AnalyticCostModel(registry=registry)


@functools.lru_cache(maxsize=4)
def _cached_calibration(path: str, mtime_ns: int, size: int) -> Any:
    """A calibration file read once per version of it (the engine may plan many graphs)."""
    return load_calibration(path)
