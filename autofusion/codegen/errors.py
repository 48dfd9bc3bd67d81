"""The error code generation raises for a plan it cannot render."""

from __future__ import annotations


class CodegenError(ValueError):
    """A group cannot be rendered: unknown template, unsupported op or dtype, or an inconsistent plan.

    The message names the group, the op and the rule(s) that produced the group, so the rule author
    knows where to look.
    """
