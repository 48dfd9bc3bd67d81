"""The rule engine: equality saturation with egglog (the only package that imports egglog).

Its product, the fusion space (``autofusion.engine.space``), is plain data the decider reads; the
entry points below are loaded on first use, so reading a space does not load egglog.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, typed, for checkers
    from autofusion.engine.fusion import MatchReport, fusion_space
    from autofusion.engine.rewrite import Limits, RewriteResult, SaturationReport, saturate_rewrites

_EXPORTS = {"MatchReport": "fusion", "fusion_space": "fusion", "Limits": "rewrite", "RewriteResult": "rewrite",
            "SaturationReport": "rewrite", "saturate_rewrites": "rewrite"}

__all__ = ["Limits", "MatchReport", "RewriteResult", "SaturationReport", "fusion_space", "saturate_rewrites"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autofusion.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autofusion.engine.{_EXPORTS[name]}"), name)
