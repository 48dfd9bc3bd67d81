"""Adversarial rule sets: saturation that explodes, rules that loop, guards that raise, templates that
fail. Each run stays within its Limits, says why it stopped, and still yields a correct plan from what
was explored, or refuses clearly."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU

from autofusion.api import optimize
from autofusion.codegen import TemplateSet
from autofusion.decide.plan import Plan
from autofusion.dsl import check_paths
from autofusion.engine import Limits
from autofusion.ir import Graph, GraphBuilder, run_graph
from autofusion.resources import data_dir
from autofusion.runtime import CompiledModel, CompileError, compare_outputs

CACHE = os.environ.get("AUTOFUSION_CACHE") or os.path.join(tempfile.gettempdir(), "autofusion-test-cache")

EXPLODE = """import "core.fuse"
rewrite add_assoc: Add(Add(x, y), z) => Add(x, Add(y, z))
rewrite add_assoc_back: Add(x, Add(y, z)) => Add(Add(x, y), z)
rewrite mul_assoc: Mul(Mul(x, y), z) => Mul(x, Mul(y, z))
rewrite mul_dist: Mul(Add(x, y), z) => Add(Mul(x, z), Mul(y, z))
"""
LOOP = """import "core.fuse"
rewrite grow: Exp(x) => Exp(Add(Mul(x, 2.0), Mul(x, -1.0)))
"""
GUARDS = """import "core.fuse"
rewrite bad_dim: Relu(x) => Relu(Relu(x)) where dim(x, 7) > 1
rewrite bad_mod: Tanh(x) => Tanh(Neg(Neg(x))) where dim(x, -1) % (dim(x, 0) - dim(x, 0)) == 0
fuse bad_attr: Softmax as s -> Relu -> template "reduction" where attr(s, "nonexistent") > 1 priority 50
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "adversarial.fuse"
    path.write_text(text)
    return path


def _chain(n: int) -> Graph:
    b = GraphBuilder("chain")
    t = b.input("x", (4, 8))
    for i in range(n):
        t = b.op(["Add", "Mul"][i % 2], t, b.input(f"y{i}", (4, 8)))
    t = b.op("Relu", b.op("Softmax", b.op("Tanh", b.op("Relu", t)), axis=-1))
    return b.build([b.op("Exp", t)])


def _assert_correct(plan: Plan, graph: Graph) -> None:
    rng = np.random.default_rng(0)
    feeds = {n: rng.uniform(0.5, 1.0, graph.types[n].shape).astype(np.float32) for n in graph.inputs}
    report = compare_outputs(run_graph(graph, feeds), CompiledModel(plan, cache=CACHE).run(feeds))
    assert report.ok, report.summary()


def test_associativity_explosion_stops_at_the_enode_limit_with_a_correct_plan(tmp_path: Path) -> None:
    graph = _chain(8)
    limit = 3000
    plan = optimize(graph, [_write(tmp_path, EXPLODE)], limits=Limits(iterations=50, enodes=limit, seconds=120))
    sat = plan.stats["saturation"]
    assert sat["stop"] == "enodes" and sat["iterations"] < 50
    assert limit <= sat["enodes"] < 10 * limit  # checked between iterations: at most one iteration over
    assert sum(sat["fired"].values()) > 0
    _assert_correct(plan, graph)


def test_explosion_under_a_time_limit_stops_on_seconds(tmp_path: Path) -> None:
    graph = _chain(8)
    plan = optimize(graph, [_write(tmp_path, EXPLODE)], limits=Limits(iterations=50, enodes=10**8, seconds=0.2))
    sat = plan.stats["saturation"]
    assert sat["stop"] == "seconds" and sat["iterations"] < 50
    _assert_correct(plan, graph)


def test_a_rule_that_grows_forever_stops_at_the_iteration_limit(tmp_path: Path) -> None:
    graph = _chain(1)
    path = _write(tmp_path, LOOP)
    plan = optimize(graph, [path], limits=Limits(iterations=6, enodes=10**8, seconds=120))
    sat = plan.stats["saturation"]
    assert sat["stop"] == "iterations" and sat["iterations"] == 6 and sat["fired"].get("grow", 0) >= 6
    _assert_correct(plan, graph)


def test_guards_that_cannot_be_evaluated_reject_matches_not_the_run(tmp_path: Path) -> None:
    graph = _chain(2)
    path = _write(tmp_path, GUARDS)
    assert not [d for d in check_paths([path]) if d.severity.name == "ERROR"]
    plan = optimize(graph, [path])
    assert plan.stats["saturation"]["stop"] == "saturated"
    sat = plan.stats["saturation"]
    assert not sat["fired"].get("bad_dim") and not sat["fired"].get("bad_mod")
    assert sat["rejected"]["bad_dim"] >= 1 and sat["rejected"]["bad_mod"] >= 1  # counted, not raised
    assert plan.stats["fusion_rejected"]["bad_attr"] >= 1 and not plan.stats["fusion_matches"].get("bad_attr")
    _assert_correct(plan, graph)


def test_unknown_template_is_refused_when_the_rules_load(tmp_path: Path) -> None:
    from autofusion.dsl import RuleError

    path = _write(tmp_path, 'import "core.fuse"\nfuse no_such: Relu -> Tanh -> template "no_such_template"\n')
    with pytest.raises(RuleError, match="unknown template 'no_such_template'"):
        optimize(_chain(1), [path])


def test_a_template_that_does_not_compile_is_a_compile_error_naming_the_source(tmp_path: Path) -> None:
    broken = tmp_path / "templates"
    shutil.copytree(data_dir("templates") / "c", broken)
    target = broken / "superkernel.c.j2"  # every library is rendered through it
    target.write_text("#error this template is broken\n" + target.read_text())
    graph = _chain(1)
    plan = optimize(graph, strategy="greedy")
    with pytest.raises(CompileError) as info:
        CompiledModel(plan, cache=tmp_path / "cache", templates=TemplateSet(broken))
    assert "this template is broken" in str(info.value)


# ---- hostile names: text chosen to inject C or Python code ends up only as safe identifiers ----

EVIL_TENSOR = 'x*/ system("rm -rf /"); /*'
EVIL_RULES = """import "core.fuse"

## Doc */ system("rm -rf /"); /* ??= #include <stdio.h> \"\"\" __import__('os').system('x') \"\"\"
fuse evil_rule: Sigmoid -> Neg -> template "pointwise" priority 50
"""


def test_hostile_names_and_rule_files_through_optimize_and_compile(tmp_path: Path) -> None:
    folder = tmp_path / 'rules"dir*/ system("id"); /*\nnext'  # rule file paths reach kernel comments
    folder.mkdir(parents=True)
    path = folder / "evil.fuse"
    path.write_text(EVIL_RULES)
    assert not [d for d in check_paths([path]) if d.severity.name == "ERROR"]
    b = GraphBuilder("evil */ graph")
    x = b.input(EVIL_TENSOR, (3, 4))
    s = b.op("Sigmoid", x, name="n*/ int pwned; /*")
    y = b.op("Neg", s, name="#include <stdio.h>\n\"\"\"; import os #")
    g = b.build([b.op("Add", y, b.input("a\nb'\"", (4,)), name="q??=\\")])
    plan = optimize(g, [path])
    assert any(r.name == "evil_rule" and r.file == str(path) for grp in plan.groups for r in grp.rules)
    model = CompiledModel(plan, cache=CACHE)
    code = re.sub(r"/\*.*?\*/", "", model.source.text, flags=re.S)  # user text only inside comments
    assert "/*" not in code and "*/" not in code
    code = re.sub(r'^#include "af_runtime.h"$', "", code, flags=re.M)
    for fragment in ('system("', "pwned", "#include", "??=", "import os", "rules\"dir"):
        assert fragment not in code, fragment
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(g.types[n].shape).astype(np.float32) for n in g.inputs}
    assert compare_outputs(run_graph(g, feeds), model.run(feeds)).ok


def test_hostile_names_through_the_triton_backend(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from autofusion.runtime.triton_runner import TritonModel

    b = GraphBuilder('evil""" graph')
    x = b.input("x'''; import os; os.system('id') #", (3, 4))
    s = b.op("Sigmoid", x, name='"""\nimport os\n"""')
    y = b.op("Neg", s, name="lambda: __import__('os')")
    g = b.build([b.op("Add", y, b.input("a\nb'\"", (4,)), name="q\\")])
    plan = optimize(g, strategy="greedy")
    model = TritonModel(plan, directory=tmp_path)
    assert model.kernels
    for kernel in model.kernels:
        code = "\n".join(line.split("#", 1)[0] for line in kernel.source.splitlines())  # outside comments
        assert "import os" not in code and "os.system" not in code and "__import__" not in code
        compile(kernel.source, kernel.name, "exec")  # the whole module is still valid Python
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(g.types[n].shape).astype(np.float32) for n in g.inputs}
    assert compare_outputs(run_graph(g, feeds), model(feeds)).ok


# ---- pathological rule files: diagnostics only (no internal error F024), within a generous budget ----

PATHOLOGICAL = {
    "deep_parens": "rewrite r: " + "Neg(" * 3000 + "x" + ")" * 3000 + " => x\n",
    "deep_not": "rewrite r: Relu(x) => Relu(x) where " + "not " * 3000 + "rank(x) == 2\n",
    "huge_int_in_guard": "rewrite r: Relu(x) => Relu(x) where dim(x, " + "9" * 5000 + ") > 1\n",
    "huge_int_priority": 'fuse f: Relu -> Tanh -> template "pointwise" priority ' + "9" * 5000 + "\n",
    "huge_int_attr": "rewrite r: Transpose(x, perm=[" + "9" * 5000 + ", 0]) => x\n",
    "huge_float": "rewrite r: Add(x, " + "9" * 400 + ".5e99999) => x\n",
    "many_rules": "".join(f"rewrite r{i}: Neg(Neg(x)) => x\n" for i in range(300)),
    "long_name": "rewrite " + "a" * 100_000 + ": Neg(Neg(x)) => x\n",
    "open_parens": "(" * 50_000,
    "wide_class": "class c = " + " | ".join(["Relu"] * 5000) + "\n",
    "long_guard_chain": "rewrite r: Relu(x) => Relu(x) where " + " and ".join(["rank(x) == 2"] * 3000) + "\n",
    "nul_byte": "rewrite r: Relu(x)\x00 => x\n",
}
CPU_SECONDS_PER_FILE = 30.0  # generous: the slowest of these takes a small fraction of it


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_rule_files_give_diagnostics_in_bounded_time(name: str) -> None:
    import time

    from autofusion.dsl import analyze_text

    start = time.process_time()
    diags = analyze_text(PATHOLOGICAL[name], "fuzz.fuse", verify=True).diagnostics
    spent = time.process_time() - start
    assert not [d.message for d in diags if d.code == "F024"]
    assert spent < CPU_SECONDS_PER_FILE, spent
