"""Differential fuzzing: random valid graphs through every strategy and the C backend, against the
reference interpreter (see docs/reliability.md)."""

from autofusion.fuzz.differential import CampaignReport, CaseResult, run_campaign, run_case
from autofusion.fuzz.generator import FuzzCase, random_case

__all__ = ["CampaignReport", "CaseResult", "FuzzCase", "random_case", "run_campaign", "run_case"]
