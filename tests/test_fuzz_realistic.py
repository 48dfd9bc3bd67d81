"""Realistic fuzz cases (fuzz/realistic.py): they reach every block size, convolution geometry,
layer shape, thread count and core variant, are deterministic, and match the reference."""

from __future__ import annotations

import os
import tempfile
from collections import Counter

import numpy as np
import pytest

from autofusion.fuzz import run_campaign
from autofusion.fuzz.cases import case_for
from autofusion.fuzz.realistic import CORE_CHOICES, KINDS, realistic_case
from autofusion.ir import verify

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")
SEEDS = range(400)


def _features() -> dict[str, Counter]:
    seen: dict[str, Counter] = {k: Counter() for k in ("kind", "ops", "dims", "threads", "cores", "conv")}
    for seed in SEEDS:
        case = realistic_case(seed)
        g = case.graph
        seen["kind"][g.name.rsplit("_", 1)[1]] += 1
        seen["threads"][case.threads] += 1
        seen["cores"][case.cores] += 1
        for node in g.nodes:
            seen["ops"][node.op] += 1
            if node.op in ("MatMul", "Gemm"):
                for t in node.inputs[:2]:
                    seen["dims"].update(g.types[t].shape[-2:])
            if node.op == "Conv":
                w = g.types[node.inputs[1]].shape
                seen["conv"].update([f"stride{(node.attr('strides') or (1,))[0]}", f"dilation{(node.attr('dilations') or (1,))[0]}",
                                     f"kernel{w[2]}"])
                if (node.attr("group") or 1) == g.types[node.inputs[0]].shape[1] > 1:
                    seen["conv"]["depthwise"] += 1
                elif (node.attr("group") or 1) > 1:
                    seen["conv"]["grouped"] += 1
                if max(g.types[node.inputs[0]].shape[2:]) >= 56:
                    seen["conv"]["56 positions"] += 1
    return seen


def test_realistic_cases_reach_every_block_geometry_layer_and_variant() -> None:
    seen = _features()
    assert set(seen["kind"]) == set(KINDS)
    assert set(seen["threads"]) == {1, 2}
    assert set(seen["cores"]) == set(CORE_CHOICES)  # each forced core, and the default
    assert {"MatMul", "Gemm", "Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool",
            "Softmax", "LayerNormalization", "Transpose", "Reshape", "Gelu", "Add", "LSTM", "Split"} <= set(seen["ops"])
    # 1, the 12-row and 6-row blocks, the 32-column panels and 1,024-row K passes, each +/- 1
    assert {1, 5, 6, 7, 11, 12, 13, 31, 32, 33, 511, 512, 513} <= set(seen["dims"])
    assert max(seen["dims"]) > 1000
    assert {"stride1", "stride2", "dilation2", "kernel1", "kernel3", "kernel5", "kernel7", "depthwise",
            "grouped", "56 positions"} <= set(seen["conv"])


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_a_realistic_case_is_valid_and_the_same_for_its_seed(seed: int) -> None:
    case, again = realistic_case(seed), realistic_case(seed)
    verify(case.graph)
    assert again.graph == case.graph and (again.threads, again.cores) == (case.threads, case.cores)
    assert all(np.array_equal(case.feeds[k], again.feeds[k]) for k in case.feeds)
    assert set(case.feeds) == set(case.graph.inputs)


def test_mixed_draws_realistic_cases_for_odd_seeds() -> None:
    assert case_for(3, "mixed").shapes == "realistic" and case_for(4, "mixed").shapes == "small"
    with pytest.raises(ValueError, match="unknown shapes"):
        case_for(1, "huge")


def test_realistic_cases_match_the_reference() -> None:
    report = run_campaign(10, 1000, cache=CACHE, shapes="realistic")
    assert report.cases == 10 and not report.mismatches and not report.failures, report.to_json()
    assert report.ok >= 9
