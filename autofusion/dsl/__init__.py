"""The ``.fuse`` rule language: parser, rule IR, checker, numerical verification.

>>> from autofusion.dsl import load_rules
>>> rules = load_rules()                     # the shipped library in rules/
>>> sorted(rules.ops_of("act")) == sorted(rules.classes["act"].ops)
True

This package never imports egglog; :mod:`autofusion.engine` translates the rule IR.
"""

from autofusion.dsl.codes import CODES, Code
from autofusion.dsl.diagnostics import Diagnostic, RuleError, Severity
from autofusion.dsl.ir import (
    AttrMatch,
    Branch,
    ClassDef,
    FusionRule,
    Literal,
    Loop,
    NoFuse,
    OpTerm,
    PatternDef,
    PatternRef,
    Rewrite,
    RuleSet,
    Term,
    Var,
)
from autofusion.dsl.loader import Analysis, analyze, analyze_text, check_paths, load_rules
from autofusion.dsl.span import Span

__all__ = [
    "CODES",
    "Analysis",
    "AttrMatch",
    "Branch",
    "ClassDef",
    "Code",
    "Diagnostic",
    "FusionRule",
    "Literal",
    "Loop",
    "NoFuse",
    "OpTerm",
    "PatternDef",
    "PatternRef",
    "Rewrite",
    "RuleError",
    "RuleSet",
    "Severity",
    "Span",
    "Term",
    "Var",
    "analyze",
    "analyze_text",
    "check_paths",
    "load_rules",
]
