"""Accuracy of the vectorisable math helpers of af_runtime.h against numpy/scipy in float64."""

from __future__ import annotations

import ctypes
import os
import tempfile

import numpy as np
import pytest
from scipy.special import erf

from autofusion.codegen import TemplateSet
from autofusion.codegen.superkernel import LibrarySource
from autofusion.runtime import compile_library

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")

UNIT = """
#include "af_runtime.h"
#define MAP(NAME, F) AF_API void NAME(const float* x, float* y, int64_t n) { \\
    for (int64_t i = 0; i < n; ++i) y[i] = F(x[i]); }
MAP(t_exp, af_expf)
MAP(t_tanh, af_tanhf)
MAP(t_erf, af_erff)
MAP(t_sigmoid, af_sigmoidf)
MAP(t_softplus, af_softplusf)
"""


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    source = LibrarySource("mathtest", (("math.c", UNIT),), TemplateSet().runtime_header(), (), ())
    dll = ctypes.CDLL(str(compile_library(source, cache=CACHE)))
    for name in ("t_exp", "t_tanh", "t_erf", "t_sigmoid", "t_softplus"):
        getattr(dll, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return dll


def apply(lib: ctypes.CDLL, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    getattr(lib, name)(x.ctypes.data, y.ctypes.data, x.size)
    return y


GRID = np.concatenate([np.linspace(-12, 12, 200_001), np.geomspace(1e-30, 1.0, 2_000),
                       -np.geomspace(1e-30, 1.0, 2_000)]).astype(np.float32)


def ulp_error(got: np.ndarray, want: np.ndarray) -> float:
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(spacing, np.finfo(np.float32).tiny)))


def test_exp(lib: ctypes.CDLL) -> None:
    x = np.concatenate([GRID, np.linspace(-103, 88.7, 100_001).astype(np.float32)])
    assert ulp_error(apply(lib, "t_exp", x), np.exp(x.astype(np.float64))) <= 2.0
    special = np.array([np.inf, -np.inf, np.nan, 89.0, -110.0, 0.0], np.float32)
    got = apply(lib, "t_exp", special)
    assert got[0] == np.inf and got[1] == 0.0 and np.isnan(got[2]) and got[3] == np.inf
    assert got[4] == 0.0 and got[5] == 1.0


def test_tanh_and_sigmoid(lib: ctypes.CDLL) -> None:
    x64 = GRID.astype(np.float64)
    assert ulp_error(apply(lib, "t_tanh", GRID), np.tanh(x64)) <= 4.0
    sig = 0.5 * (np.tanh(0.5 * x64) + 1.0)
    assert np.max(np.abs(apply(lib, "t_sigmoid", GRID) - sig)) <= 2e-7
    got = apply(lib, "t_tanh", np.array([np.inf, -np.inf, np.nan, -0.0], np.float32))
    assert got[0] == 1.0 and got[1] == -1.0 and np.isnan(got[2]) and got[3] == 0.0


def test_erf(lib: ctypes.CDLL) -> None:
    got = apply(lib, "t_erf", GRID)
    want = erf(GRID.astype(np.float64))
    assert np.max(np.abs(got - want)) <= 5e-7
    small = np.abs(want) > 1e-20
    assert np.max(np.abs(got[small] - want[small]) / np.abs(want[small])) <= 1e-6
    assert np.isnan(apply(lib, "t_erf", np.array([np.nan], np.float32))[0])


def test_softplus(lib: ctypes.CDLL) -> None:
    want = np.logaddexp(0.0, GRID.astype(np.float64))
    got = apply(lib, "t_softplus", GRID)
    assert np.max(np.abs(got - want) / np.maximum(want, 1e-30)) <= 1e-6
