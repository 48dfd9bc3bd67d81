"""Sliding-window and scan ops as per-element loops (placeholder table, filled below)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from autofusion.codegen.inliner import Handler


def handlers() -> Mapping[str, Handler]:
    return MappingProxyType({})
