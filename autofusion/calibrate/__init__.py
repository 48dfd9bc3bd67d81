"""Calibration: time generated kernels with the C backend and fit the cost models to them.

``autofusion calibrate`` runs :func:`calibrate` and saves the :class:`~autofusion.decide.learned.Calibration`
it returns where the engine finds it (see :func:`autofusion.decide.default_model.calibration_file`).
"""

from autofusion.calibrate.fit import Accuracy, accuracy, fit_profile, pair_agreement
from autofusion.calibrate.measure import CallOverhead, Timer, TimingOptions, plan_of
from autofusion.calibrate.run import (
    TARGET_TAU,
    CalibrationError,
    CalibrationOptions,
    Measurements,
    calibrate,
    fit,
    measure,
)
from autofusion.calibrate.specs import KINDS, KernelSpec, alternatives, random_feeds, random_kernel

__all__ = [
    "KINDS",
    "TARGET_TAU",
    "Accuracy",
    "CalibrationError",
    "CalibrationOptions",
    "CallOverhead",
    "KernelSpec",
    "Measurements",
    "Timer",
    "TimingOptions",
    "accuracy",
    "alternatives",
    "calibrate",
    "fit",
    "fit_profile",
    "measure",
    "pair_agreement",
    "plan_of",
    "random_feeds",
    "random_kernel",
]
