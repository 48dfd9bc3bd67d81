"""The rule engine: equality saturation with egglog (the only package that imports egglog)."""

from autofusion.engine.fusion import MatchReport, fusion_space
from autofusion.engine.rewrite import Limits, RewriteResult, SaturationReport, saturate_rewrites

__all__ = ["Limits", "MatchReport", "RewriteResult", "SaturationReport", "fusion_space", "saturate_rewrites"]
