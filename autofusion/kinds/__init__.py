"""Kernel kinds: what a fused group can be rendered as, one object per kind.

A :class:`KernelKind` is the one home of a kind: its name (what ``-> template "NAME"`` says), what
groups it accepts and why it refuses others (the decider's legality asks it), the params a rule
may give it (the rule checker validates them), its renderer for each backend (the code generators
dispatch on it) and its colour in pictures. :func:`default_kinds` holds the built-in kinds; a
plugin adds its own through the ``autofusion.kernels`` entry point group (docs/plugins.md).

The kinds sit below the rules and the decider; their renderers live in the code generators and
are named here by import path (``"package.module:function"``), resolved when a backend renders.
"""

from autofusion.kinds.facts import GroupFacts
from autofusion.kinds.kind import ACCEPT, Acceptance, KernelKind, KindError, ParamSpec, refuse
from autofusion.kinds.registry import KindRegistry, default_kinds

__all__ = ["ACCEPT", "Acceptance", "GroupFacts", "KernelKind", "KindError", "KindRegistry", "ParamSpec",
           "default_kinds", "refuse"]
