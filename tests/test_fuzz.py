"""Differential fuzzing: random valid graphs through every strategy and the C backend agree with the
reference interpreter; the ``autofusion fuzz`` command reports cases, mismatches and their seeds."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.api import load_ruleset
from autofusion.cli.main import main
from autofusion.fuzz import FuzzCase, random_case, run_campaign, run_case
from autofusion.fuzz.generator import STRATEGIES
from autofusion.ir import verify

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU
CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
RULES = load_ruleset(None)


@st.composite
def fuzz_cases(draw: st.DrawFn) -> FuzzCase:
    """A generated case; hypothesis shrinks towards small seeds, few ops and the first strategy."""
    return random_case(draw(st.integers(0, 2**31)), max_ops=draw(st.integers(1, 6)),
                       strategy=draw(st.sampled_from(STRATEGIES)))


@given(seed=st.integers(0, 2**31), max_ops=st.integers(1, 12))
@settings(max_examples=150, deadline=None)
def test_generated_graphs_are_valid_and_deterministic(seed: int, max_ops: int) -> None:
    case = random_case(seed, max_ops)
    verify(case.graph)
    again = random_case(seed, max_ops)
    assert again.graph == case.graph and again.strategy == case.strategy
    assert all(np.array_equal(case.feeds[k], again.feeds[k]) for k in case.feeds)
    assert set(case.feeds) == set(case.graph.inputs)


@given(case=fuzz_cases())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_optimized_compiled_graphs_match_the_reference(case: FuzzCase) -> None:
    result = run_case(case, CACHE, RULES)
    assert result.outcome in ("ok", "refused"), (case.seed, result)


def test_campaign_counts_outcomes_and_the_cli_reports_json(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_campaign(4, 7, cache=CACHE)
    assert report.cases == 4 and report.ok + report.refused == 4 and not report.mismatches
    assert sorted(report.by_strategy) == sorted(STRATEGIES)
    assert main(["fuzz", "--cases", "3", "--seed", "11", "--json", "--cache", CACHE]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cases"] == 3 and data["mismatches"] == [] and data["failures"] == []


def test_a_wrong_answer_is_a_mismatch_with_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.fuzz import differential

    real = differential._compare
    monkeypatch.setattr(differential, "_compare", lambda ref, got: real(ref, {k: v + 1 for k, v in got.items()}))
    report = run_campaign(2, 40, cache=CACHE)
    assert [m.seed for m in report.mismatches] == [40, 41]
    assert all("max abs error" in m.detail for m in report.mismatches)


def test_an_unexpected_exception_is_a_failure_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    import autofusion.api

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(autofusion.api, "optimize", broken)
    result = run_case(random_case(3), CACHE, RULES)
    assert result.outcome == "failure" and result.seed == 3 and "KeyError" in result.detail


def test_triton_backend_agrees_on_a_few_cases() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    report = run_campaign(3, 500, cache=CACHE, triton=True)
    assert report.cases == 3 and not report.mismatches and not report.failures, report.to_json()
    assert sum(report.triton_steps.values()) > 3 and "triton_steps" in report.to_json()


def test_the_triton_fuzz_reaches_every_kernel_kind() -> None:
    """Realistic cases, scanned until every kind the Triton backend renders appears in a Triton
    model of one (seeds 0-12 today); the recurrent case's model runs twice, step by step and then
    replayed, and agrees with the reference (--triton campaigns run every case so; each kind's
    kernels are checked on their own in tests/test_triton*.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from autofusion.api import optimize
    from autofusion.codegen.triton import triton_kinds
    from autofusion.fuzz.differential import triton_steps
    from autofusion.fuzz.realistic import realistic_case
    from autofusion.ir import run_graph
    from autofusion.runtime.compare import ATOL, RTOL
    from autofusion.runtime.triton_runner import TritonModel

    wanted, seen = set(triton_kinds()), set()
    for seed in range(60):
        case = realistic_case(seed)
        model = TritonModel(optimize(case.graph, strategy=case.strategy))
        kinds = set(triton_steps(model))
        if "lstm_scan" in kinds - seen:
            want = run_graph(case.graph, case.feeds)
            for call in ("step by step", "replayed"):
                got = model(case.feeds)
                for name, ref in want.items():
                    np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL, err_msg=f"seed {seed} {call}")
        seen |= kinds
        if wanted <= seen:
            break
    assert wanted <= seen, f"60 realistic cases never reach {sorted(wanted - seen)}"


def test_a_documented_refusal_is_counted_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    import autofusion.runtime
    from autofusion.codegen.errors import CodegenError

    def refuse(*args: object, **kwargs: object) -> None:
        raise CodegenError("group k0: no template renders this dtype")

    monkeypatch.setattr(autofusion.runtime, "CompiledModel", refuse)
    report = run_campaign(2, 60, cache=CACHE)
    assert report.refused == 2 and report.refusals == {"CodegenError": 2}
    assert not report.failures and not report.mismatches and report.to_json()["refused"] == 2
