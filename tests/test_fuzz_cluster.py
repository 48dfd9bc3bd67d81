"""``autofusion fuzz --ray``: a campaign spread over a local Ray with two workers gives the same
outcomes, seed for seed, as the same campaign in one process; without Ray it is a clear error."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest

from autofusion.cli.main import main
from autofusion.fuzz import run_campaign

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")


KEYS = ("cases", "ok", "refused", "refusals", "mismatches", "failures", "by_strategy", "float64_rechecked_seeds")


def test_a_campaign_on_a_local_ray_matches_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="the cluster extra is not installed (pip install 'autofusion[cluster]')",
                        exc_type=ImportError)
    assert main(["fuzz", "--cases", "10", "--seed", "500", "--shapes", "mixed", "--ray", "--json",
                 "--cache", CACHE]) == 0
    spread = json.loads(capsys.readouterr().out)
    one = run_campaign(10, 500, cache=CACHE, shapes="mixed").to_json()
    assert spread["workers"] >= 1 and {k: spread[k] for k in KEYS} == {k: one[k] for k in KEYS}
    assert spread["cases"] == 10 and spread["mismatches"] == [] and spread["failures"] == []


def test_fuzz_ray_without_ray_is_one_clear_line(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    assert main(["fuzz", "--cases", "1", "--ray", "--json", "--cache", CACHE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "autofusion[cluster]" in err and "Traceback" not in err
