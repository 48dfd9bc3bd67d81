"""The fusion decider: cost models, strategies and the plan they produce."""

from autofusion.decide.baseline import one_kernel_plan, unfused_plan
from autofusion.decide.groups import build_groups, group_io
from autofusion.decide.plan import CostBreakdown, FusedGroup, Plan, RuleRef, UnfusedPair, UnfusedReason

__all__ = [
    "CostBreakdown",
    "FusedGroup",
    "Plan",
    "RuleRef",
    "UnfusedPair",
    "UnfusedReason",
    "build_groups",
    "group_io",
    "one_kernel_plan",
    "unfused_plan",
]
