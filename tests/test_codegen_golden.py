"""Golden snapshots of rendered kernels (tests/golden/*.c) and determinism of rendering.

Regenerate the snapshots after an intended change with ``AUTOFUSION_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from autofusion.codegen import TemplateSet, render_group, render_plan
from autofusion.codegen.cores import DefaultChooser, Machine
from autofusion.decide import build_groups
from autofusion.decide.plan import ZERO_COST, Plan, RuleRef
from autofusion.ir import Graph, GraphBuilder

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("AUTOFUSION_UPDATE_GOLDEN") == "1"


def _weights(*shape: int) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) / 100


def pointwise_chain() -> tuple[Graph, str]:
    b = GraphBuilder("pointwise")
    x, y = b.input("x", (8, 16, 32)), b.input("bias", (32,))
    a = b.op("Add", x, y)
    t = b.op("Transpose", b.op("Mul", a, b.const(np.float32(0.5))), perm=(1, 0, 2))
    return b.build([b.op("Sigmoid", t), b.op("Relu", t)]), "pointwise"


def layernorm_residual() -> tuple[Graph, str]:
    b = GraphBuilder("layernorm")
    x, r = b.input("x", (1, 128, 768)), b.input("residual", (1, 128, 768))
    h = b.op("Add", x, r)
    ln = b.op("LayerNormalization", h, b.const(_weights(768)), b.const(_weights(768)), axis=-1, epsilon=1e-12)
    return b.build([ln, h]), "reduction"


def softmax_masked() -> tuple[Graph, str]:
    b = GraphBuilder("softmax")
    s, m = b.input("scores", (1, 12, 128, 128)), b.input("mask", (1, 1, 1, 128))
    return b.build([b.op("Softmax", b.op("Add", b.op("Div", s, b.const(np.float32(8.0))), m), axis=-1)]), "reduction"


def gemm_epilogue() -> tuple[Graph, str]:
    b = GraphBuilder("ffn")
    x = b.input("hidden", (1, 128, 768))
    h = b.op("Add", b.op("MatMul", x, b.const(_weights(768, 3072))), b.const(_weights(3072)))
    erf = b.op("Erf", b.op("Div", h, b.const(np.float32(1.4142135))))
    gelu = b.op("Mul", b.op("Mul", h, b.const(np.float32(0.5))), b.op("Add", erf, b.const(np.float32(1.0))))
    return b.build([gelu]), "gemm_epilogue"


def conv_epilogue() -> tuple[Graph, str]:
    b = GraphBuilder("conv")
    x, skip = b.input("x", (1, 64, 56, 56)), b.input("skip", (1, 64, 56, 56))
    c = b.op("Conv", x, b.const(_weights(64, 64, 3, 3)), b.const(_weights(64)), pads=(1, 1, 1, 1))
    return b.build([b.op("Relu", b.op("Add", c, skip))]), "conv_epilogue"


def conv_strided() -> tuple[Graph, str]:
    """A ResNet stage's stride-2 entry: the taps read in place (Winograd takes stride 1 only)."""
    b = GraphBuilder("conv_s2")
    x = b.input("x", (1, 64, 56, 56))
    c = b.op("Conv", x, b.const(_weights(128, 64, 3, 3)), b.const(_weights(128)), pads=(1, 1, 1, 1), strides=(2, 2))
    return b.build([b.op("Relu", c)]), "conv_epilogue"


def maxpool() -> tuple[Graph, str]:
    b = GraphBuilder("pool")
    x = b.input("x", (1, 64, 112, 112))
    return b.build([b.op("MaxPool", x, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))]), "opaque"


CASES: dict[str, Callable[[], tuple[Graph, str]]] = {
    "pointwise_chain.c": pointwise_chain,
    "layernorm_residual.c": layernorm_residual,
    "softmax_masked.c": softmax_masked,
    "gemm_epilogue.c": gemm_epilogue,
    "conv_epilogue.c": conv_epilogue,
    "conv_strided.c": conv_strided,
    "maxpool.c": maxpool,
}


GOLDEN_MACHINE = Machine("avx512", l2=2 * 1024 * 1024)


def one_group(g: Graph, template: str) -> Plan:
    rules = (RuleRef(f"fuse_{template}", "rules/example.fuse", 7),)
    groups = build_groups(g, [[n.name for n in g.nodes]], template_of=lambda ns: template,
                          rules_of=lambda ns: rules)
    return Plan(g, groups, ZERO_COST, ZERO_COST, strategy="golden")


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_kernel_matches_snapshot(name: str) -> None:
    g, template = CASES[name]()
    plan = one_group(g, template)
    # a fixed machine: the default blocking follows the L2 cache, which differs between CPUs
    kernel = render_group(g, plan.groups[0], TemplateSet(), chooser=DefaultChooser(GOLDEN_MACHINE))
    assert kernel is not None
    path = GOLDEN / name
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"missing snapshot {path}; run with AUTOFUSION_UPDATE_GOLDEN=1 to create it")
        path.write_text(kernel.code)
    expected = path.read_text()
    if kernel.code != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), kernel.code.splitlines(True),
                                            str(path), "rendered", n=2))
        pytest.fail(f"{name} differs from its snapshot (AUTOFUSION_UPDATE_GOLDEN=1 to accept):\n{diff[:4000]}")
    assert "rules: fuse_" in kernel.code and "rules/example.fuse:7" in kernel.code


def test_superkernel_snapshot_and_rendering_is_byte_identical() -> None:
    g, _ = layernorm_residual()
    plan = one_group(g, "reduction")
    first = render_plan(plan).text
    assert first == render_plan(plan).text
    path = GOLDEN / "superkernel_layernorm.c"
    main = dict(render_plan(plan).units)["main.c"]
    if UPDATE:
        path.write_text(main)
    assert main == path.read_text()


_RENDER = """
import hashlib, sys
from autofusion.models import build
from class_planner import greedy_plan
from autofusion.codegen import render_plan
print(hashlib.sha256(render_plan(greedy_plan(build("bert-tiny"), horizontal=True)).text.encode()).hexdigest())
"""


def test_same_plan_same_bytes_across_processes() -> None:
    from class_planner import greedy_plan

    from autofusion.models import build

    here = hashlib.sha256(render_plan(greedy_plan(build("bert-tiny"), horizontal=True)).text.encode()).hexdigest()
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), str(Path(__file__).parent)]))
    out = subprocess.run([sys.executable, "-c", _RENDER], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == here
