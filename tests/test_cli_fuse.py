"""The fuse, explain and run --backend c commands, in process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autofusion.cli.main import main
from autofusion.codegen.cores import cpu_model

KEYS = {"kernels_before", "kernels_after", "intermediate_bytes_before", "intermediate_bytes_after",
        "cost_before", "cost_after", "seconds"}


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_fuse_json_reports_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, ["fuse", "bert-tiny", "--json"])
    assert KEYS <= set(report)
    assert set(report["seconds"]) == {"import", "saturate", "extract", "total"}
    assert report["kernels_after"] < report["kernels_before"]
    assert report["intermediate_bytes_after"] < report["intermediate_bytes_before"]
    assert report["cost_after"] < report["cost_before"]
    assert report["rewrites_fired"]  # the exporter's GELU is recognised


@pytest.mark.parametrize("strategy", ["greedy", "dp", "beam", "exact"])
def test_every_strategy_from_the_command_line(capsys: pytest.CaptureFixture[str], strategy: str) -> None:
    report = _json(capsys, ["fuse", "resnet-tiny-bn", "--strategy", strategy, "--json"])
    assert report["strategy"] == strategy and report["kernels_after"] < report["kernels_before"]


def test_explain_names_rules_with_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, ["explain", "bert-tiny", "--json"])
    assert any(r["where"].split(":")[0].endswith(".fuse") and int(r["where"].split(":")[1]) > 0
               for r in report["rules"] if r["kind"] != "rewrite")
    assert report["kernels"] and all(k["rules"] for k in report["kernels"])
    assert set(report["reasons"]) <= {"would-form-cycle", "over-size-cap", "cost-says-no", "no-rule-covers",
                                      "guard-rejects", "no-fuse-scope", "no-template-for-group",
                                      "over-memory-bound"}
    assert main(["explain", "bert-tiny", "--limit", "3"]) == 0
    text = capsys.readouterr().out
    assert "why pairs were not fused" in text
    assert ("not this CPU" in text) == (cpu_model() != report["cost_model_fitted_on"] != "")  # the hint to calibrate


def test_fuse_emits_sources_and_run_c_matches_reference(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["fuse", "gpt2-tiny", "--emit", str(tmp_path / "src")]) == 0
    files = sorted(p.name for p in (tmp_path / "src").iterdir())
    assert "af_runtime.h" in files and any(f.endswith(".c") for f in files)
    text = "".join((tmp_path / "src" / f).read_text() for f in files if f.endswith(".c"))
    assert ".fuse:" in text  # each fused kernel names the rule that made it
    capsys.readouterr()
    ref_path, c_path = tmp_path / "ref.npz", tmp_path / "c.npz"
    assert main(["run", "gpt2-tiny", "--save", str(ref_path)]) == 0
    assert main(["run", "gpt2-tiny", "--backend", "c", "--save", str(c_path)]) == 0
    ref, got = np.load(ref_path), np.load(c_path)
    for key in ref.files:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-5)


def test_bad_rules_and_strategy_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.fuse"
    bad.write_text("fuse broken: Relu( ->\n")
    assert main(["fuse", "bert-tiny", "--rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.fuse" in err and "Traceback" not in err
    assert main(["fuse", "bert-tiny", "--strategy", "nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err
