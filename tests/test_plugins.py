"""Plugins through entry points: the example package through the API, the CLI and the docs; broken plugins.

Nothing is installed: each test puts the plugin's source and a ``*.dist-info`` with its entry points on
``sys.path`` (monkeypatched, so it is gone after the test), which is where importlib.metadata looks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autofusion import plugins
from autofusion.cli.main import main
from autofusion.kinds import default_kinds
from autofusion.ops import OpClass, default_registry
from autofusion.resources import data_dir

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "autofusion-plugin-example"
EXAMPLE_RULES = EXAMPLE / "src" / "autofusion_plugin_example" / "rules"
DOCS = ROOT / "docs" / "plugins.md"
EPILOGUES = "class compute = pointwise | reduction | opaque\nfuse epilogue: pointwise into producer compute\n"

EntryPoints = Mapping[str, Mapping[str, str]]


def write_dist(site: Path, name: str, version: str, entry_points: EntryPoints) -> None:
    """A minimal installed-distribution record: METADATA and entry_points.txt, as pip writes them."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    sections = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(sections))


def example_entry_points() -> EntryPoints:
    return tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]


def own(plugin: plugins.Plugin) -> bool:
    """Entry points autofusion declares itself (e.g. its own backends) are part of every environment."""
    return plugin.package.split(" ")[0] == "autofusion"


def installed_plugins() -> list[str]:
    """Plugins of other packages installed in this environment (tests that need none skip where there are some)."""
    return [p.label for g in plugins.GROUPS for p in plugins.discover(g) if not own(p)]


needs_clean_environment = pytest.mark.skipif(bool(installed_plugins()), reason="plugins are installed here")


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example plugin package, visible to importlib.metadata for this test only (unless it is
    installed already); returns the site dir."""
    site = tmp_path / "site"
    if any("autofusion-plugin-example" in label for label in installed_plugins()):
        return site
    write_dist(site, "autofusion-plugin-example", "0.1.0", example_entry_points())
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.syspath_prepend(str(site))
    return site


def broken_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str,
                  entry_points: EntryPoints) -> Path:
    """A plugin package ``broken-plugin`` made of one module with ``source``."""
    site = tmp_path / "broken-site"
    site.mkdir()
    (site / f"{module}.py").write_text(source)
    write_dist(site, "broken-plugin", "0.0.1", entry_points)
    monkeypatch.syspath_prepend(str(site))
    return site


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def swish_onnx(path: Path, custom_op: bool) -> Path:
    """x @ w, then x * sigmoid(x) as standard ONNX ops, or as the plugin's Swish op itself."""
    w = numpy_helper.from_array(np.full((8, 8), 0.1, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm")]
    if custom_op:
        nodes.append(helper.make_node("Swish", ["h"], ["y"], name="act"))
    else:
        nodes += [helper.make_node("Sigmoid", ["h"], ["s"], name="sig"), helper.make_node("Mul", ["h", "s"], ["y"])]
    graph = helper.make_graph(nodes, "swish_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


# -- the example through the API --------------------------------------------------------------------


@needs_clean_environment
def test_nothing_installed_means_the_builtins(tmp_path: Path) -> None:
    assert all(own(p) for g in plugins.GROUPS for p in plugins.discover(g))
    assert plugins.registry_with_plugins() is default_registry()
    assert plugins.kinds_with_plugins() is default_kinds()
    assert plugins.rule_paths(None) is None and plugins.rule_paths(["a.fuse"]) == [Path("a.fuse")]
    with pytest.raises(ValueError, match="unknown plugin group"):
        plugins.discover("autofusion.nope")


def test_example_plugins_are_discovered_and_work(example: Path) -> None:
    names = {g: [p.name for p in plugins.discover(g) if not own(p)] for g in plugins.GROUPS}
    assert names == {plugins.OPS: ["swish"], plugins.RULES: ["swish"], plugins.COST_MODELS: ["bytes-only"],
                     plugins.STRATEGIES: ["first-fit"], plugins.BACKENDS: ["kernel-interpreter"],
                     plugins.KERNELS: ["rms_norm"]}
    assert {p.package for g in plugins.GROUPS for p in plugins.discover(g) if not own(p)} == {
        "autofusion-plugin-example 0.1.0"}
    registry = plugins.registry_with_plugins()
    swish = registry["Swish"]
    assert swish.op_class is OpClass.POINTWISE and "Swish" not in default_registry()
    x = np.array([-2.0, 0.0, 3.0], np.float32)
    np.testing.assert_allclose(swish.reference([x], {})[0], x / (1 + np.exp(-x)), rtol=1e-6)
    assert plugins.plugin_rule_dirs() == (EXAMPLE_RULES,)
    assert plugins.rule_paths(None) == [data_dir("rules"), EXAMPLE_RULES]
    assert plugins.cost_model("bytes-only", registry).name == "bytes-only"
    assert plugins.cost_model("analytic:nvidia-h200").name == "analytic:nvidia-h200"
    assert plugins.strategy("first-fit").name == "first-fit" and plugins.strategy("greedy").name == "greedy"
    assert plugins.backend("kernel-interpreter").name == "kernel-interpreter"
    with pytest.raises(plugins.PluginError, match=r"unknown cost model 'nope' \(available: analytic.*bytes-only\)"):
        plugins.cost_model("nope")
    with pytest.raises(plugins.PluginError, match=r"unknown backend 'nope' \(available: .*kernel-interpreter"):
        plugins.backend("nope")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_docs_examples_run_and_match_the_example_package(example: Path) -> None:
    text = DOCS.read_text()
    blocks = python_blocks(text)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"__name__": "plugins_doc"}
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), namespace)  # each block's asserts are the checks
    (toml_block,) = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    assert tomllib.loads(toml_block)["project"]["entry-points"] == example_entry_points()
    fuse_blocks = re.findall(r"```fuse\n(.*?)```", text, flags=re.S)
    assert fuse_blocks == [(EXAMPLE_RULES / name).read_text() for name in ("swish.fuse", "rms_norm.fuse")]
    for group in plugins.GROUPS:
        assert f"`{group}`" in text


# -- the example through the CLI --------------------------------------------------------------------


def test_cli_lists_plugins(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "plugins")
    assert code == 0 and not err
    for line in ("ops: Swish", "swish.fuse", "cost model 'bytes-only'", "strategy 'first-fit'",
                 "backend 'kernel-interpreter'", "autofusion-plugin-example 0.1.0"):
        assert line in out
    code, out, _ = cli(capsys, "plugins", "--json")
    rows = [r for r in json.loads(out)["plugins"] if r["package"] == "autofusion-plugin-example 0.1.0"]
    assert code == 0 and len(rows) == 6 and all(not r["error"] for r in rows)


@pytest.mark.skipif(any(plugins.discover(g) for g in plugins.GROUPS), reason="plugins are installed here")
def test_cli_without_plugins(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "plugins")
    assert code == 0 and out.startswith("no plugins installed")


def test_cli_fuse_with_plugin_rules_op_and_strategy(example: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "epilogues.fuse"
    rules.write_text(EPILOGUES)
    model = swish_onnx(tmp_path / "mlp.onnx", custom_op=False)
    code, out, err = cli(capsys, "fuse", str(model), "--rules", str(EXAMPLE_RULES), "--rules", str(rules),
                         "--strategy", "first-fit", "--groups", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["strategy"] == "first-fit" and result["rewrites_fired"] == {"swish_mul": 1}
    (kernel,) = result["plan"]["groups"]
    assert kernel["ops"] == ["MatMul", "Swish"] and {r["name"] for r in kernel["rules"]} >= {"gemm_swish"}
    # a model that uses the plugin's op directly imports with the plugin's registry
    custom = swish_onnx(tmp_path / "custom.onnx", custom_op=True)
    code, out, err = cli(capsys, "fuse", str(custom), "--rules", str(EXAMPLE_RULES), "--json")
    assert code == 0, err
    code, out, err = cli(capsys, "viz", str(custom), "--rules", str(EXAMPLE_RULES), "--out", str(tmp_path / "viz"),
                         "--no-render")
    assert code == 0, err
    assert "Swish" in (tmp_path / "viz" / "report.html").read_text()
    # ... but has no ONNX form to be written back in
    code, _, err = cli(capsys, "fuse", str(custom), "--rules", str(EXAMPLE_RULES), "--onnx-out",
                       str(tmp_path / "out.onnx"))
    assert code == 2 and "'Swish' has no ONNX opset-18 form" in err and not (tmp_path / "out.onnx").exists()


@needs_clean_environment
def test_cli_needs_the_plugin_for_its_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    custom = swish_onnx(tmp_path / "custom.onnx", custom_op=True)
    code, _, err = cli(capsys, "fuse", str(custom), "--rules", str(EXAMPLE_RULES))
    assert code == 2 and "unsupported ops: Swish" in err


# -- broken plugins -----------------------------------------------------------------------------------

OPDEF = ("from autofusion.ops import OpClass, OpDef\n"
         "def op(name):\n"
         "    return OpDef(name, OpClass.POINTWISE, ('X',), lambda c: (c.type(0),), lambda xs, a: (xs[0],))\n")

BROKEN = [
    ("raise RuntimeError('no GPU here')\ndef ops(): return []\n", plugins.OPS,
     r"plugin 'bad' \(autofusion.ops, from broken-plugin 0.0.1\) failed to load {m}:make: RuntimeError: no GPU here"),
    ("def make(): raise KeyError('config')\n", plugins.OPS, r"plugin 'bad' .* raised KeyError: 'config'"),
    ("make = 3\n", plugins.OPS, r"plugin 'bad' .*: {m}:make is not callable"),
    ("def make(): return [1]\n", plugins.OPS, r"plugin 'bad' .* returned int, not an OpDef"),
    ("def make(): return 7\n", plugins.OPS, r"plugin 'bad' .* returned int, not OpDefs"),
    (OPDEF + "def make(): return [op('Relu')]\n", plugins.OPS, r"redefines the op 'Relu'"),
    ("def make(): return '/nonexistent/rules'\n", plugins.RULES, r"returned '/nonexistent/rules', which is not a dir"),
    ("def make(): return 5\n", plugins.RULES, r"returned int, not a directory path"),
]


@needs_clean_environment
@pytest.mark.parametrize("index", range(len(BROKEN)))
def test_broken_op_and_rule_plugins_are_reported_by_name(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    source, group, message = BROKEN[index]
    module = f"broken_plugin_{index}"
    broken_plugin(tmp_path, monkeypatch, module, source, {group: {"bad": f"{module}:make"}})
    pattern = message.format(m=module)
    with pytest.raises(plugins.PluginError, match=pattern):
        plugins.registry_with_plugins() if group == plugins.OPS else plugins.plugin_rule_dirs()
    code, out, err = cli(capsys, "plugins")
    assert code == 2 and re.search(pattern, err) and len(err.strip().splitlines()) == 1 and "BROKEN" in out
    code, _, err = cli(capsys, "fuse", "resnet-tiny")  # the default rules include every plugin's directory
    assert code == 2 and re.search(pattern, err) and len(err.strip().splitlines()) == 1


def test_duplicate_ops_from_two_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = OPDEF + "def one(): return [op('Twice')]\ndef two(): return [op('Twice')]\n"
    broken_plugin(tmp_path, monkeypatch, "twice_plugin", source,
                  {plugins.OPS: {"a": "twice_plugin:one", "b": "twice_plugin:two"}})
    with pytest.raises(plugins.PluginError, match=r"plugin 'b' .* and plugin 'a' .* both define the op 'Twice'"):
        plugins.registry_with_plugins()


@needs_clean_environment
def test_broken_cost_model_strategy_and_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    source = ("class Nothing:\n    name = 'nothing'\n"
              "def cost(registry): return Nothing()\ndef strategy(): return Nothing()\n"
              "def backend(): return Nothing()\ndef fails(): raise ImportError('libfoo.so missing')\n")
    broken_plugin(tmp_path, monkeypatch, "odd_plugin", source, {
        plugins.COST_MODELS: {"nothing": "odd_plugin:cost"},
        plugins.STRATEGIES: {"nothing": "odd_plugin:strategy", "fails": "odd_plugin:fails"},
        plugins.BACKENDS: {"nothing": "odd_plugin:backend"},
    })
    with pytest.raises(plugins.PluginError, match="returned Nothing, which is not a CostModel"):
        plugins.cost_model("nothing")
    with pytest.raises(plugins.PluginError, match=r"returned Nothing, which has no solve\(region, partition\)"):
        plugins.strategy("nothing")
    with pytest.raises(plugins.PluginError, match="returned Nothing, which is not a Backend"):
        plugins.backend("nothing")
    code, _, err = cli(capsys, "fuse", "resnet-tiny", "--rules", str(EXAMPLE_RULES), "--strategy", "fails")
    assert code == 2 and "plugin 'fails' (autofusion.strategies, from broken-plugin 0.0.1) raised ImportError" in err
    code, _, err = cli(capsys, "fuse", "resnet-tiny", "--rules", str(EXAMPLE_RULES), "--strategy", "nope")
    assert code == 2 and "unknown strategy 'nope' (available: beam, dp, exact, fails, greedy, nothing)" in err
    code, _, err = cli(capsys, "plugins")
    assert code == 2 and len(err.strip().splitlines()) == 4


@needs_clean_environment
def test_broken_plugin_never_shows_a_traceback_from_the_command(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "crashing_plugin.py").write_text("raise SystemError('boom')\n")
    write_dist(site, "crashing-plugin", "1.0", {plugins.OPS: {"crash": "crashing_plugin:ops"}})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "autofusion.cli.main", "plugins"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("autofusion: error: plugin 'crash' (autofusion.ops, from crashing-plugin 1.0) "
                                   "failed to load crashing_plugin:ops: SystemError: boom")


# -- the example's kernel kind: the seed's user SuperKernel -----------------------------------------


def rms_norm_graph(rows: tuple[int, ...] = (3, 7), cols: int = 40) -> Any:
    """RMSNorm as exporters write it, feeding a projection (its output leaves the kernel)."""
    from autofusion.ir import GraphBuilder

    rng = np.random.default_rng(5)
    b = GraphBuilder("rms_mlp")
    x = b.input("x", (*rows, cols))
    eps = b.const(np.float32(1e-5), "eps")
    mean = b.op("ReduceMean", b.op("Mul", x, x), axes=[-1], keepdims=1)
    y = b.op("Mul", b.op("Div", x, b.op("Sqrt", b.op("Add", mean, eps))),
             b.const(rng.uniform(0.5, 1.5, cols).astype(np.float32), "g"))
    return b.build([b.op("MatMul", y, b.const(rng.standard_normal((cols, 16)).astype(np.float32), "w"))])


def test_example_kernel_kind_renders_its_rule_s_groups(example: Path) -> None:
    from autofusion.api import optimize
    from autofusion.codegen import render_plan
    from autofusion.ir import run_graph
    from autofusion.runtime import CompiledModel

    kinds = plugins.kinds_with_plugins()
    assert "rms_norm" in kinds and "rms_norm" not in default_kinds()
    graph = rms_norm_graph()
    plan = optimize(graph, plugins.rule_paths(None), registry=plugins.registry_with_plugins(), kinds=kinds)
    (group,) = [g for g in plan.groups if g.fused]
    assert group.template == "rms_norm" and dict(group.params) == {"rows_per_chunk": 4}
    assert group.decided_by is not None and group.decided_by.name == "rms_norm"
    source = "\n".join(text for _, text in render_plan(plan).units)
    assert "rms_norm kind (autofusion-plugin-example): 21 rows of 40" in source
    assert "schedule(dynamic, 4)" in source  # the rule's param reached the plugin's template
    feeds = {"x": np.random.default_rng(6).standard_normal((3, 7, 40)).astype(np.float32)}
    (out,) = graph.outputs
    got = CompiledModel(plan).run(feeds)[out]
    np.testing.assert_allclose(got, run_graph(graph, feeds)[out], rtol=1e-5, atol=1e-5)
    # without the plugin's kind the same rules are an error, and the shipped rules alone fuse less
    with pytest.raises(Exception, match="unknown template 'rms_norm'"):
        optimize(graph, plugins.rule_paths(None), registry=plugins.registry_with_plugins())
    alone = optimize(graph)
    assert all(g.template != "rms_norm" for g in alone.groups)


def test_example_kind_refuses_what_it_cannot_render(example: Path) -> None:
    from autofusion_plugin_example.kernels import RMS_NORM

    from autofusion.kinds import GroupFacts

    graph = rms_norm_graph()
    defs = plugins.registry_with_plugins()
    names = [n.name for n in graph.nodes if n.op != "MatMul"]
    facts = GroupFacts(graph, frozenset(names), {n: defs[graph.node_by_name[n].op] for n in names})
    assert RMS_NORM.accepts(facts).ok
    fewer = frozenset(names[:-1])
    verdict = RMS_NORM.accepts(GroupFacts(graph, fewer, {n: facts.defs[n] for n in fewer}))
    assert not verdict.ok and "six ops" in verdict.detail


def test_example_kind_refuses_a_group_whose_other_values_leave_it(example: Path) -> None:
    from autofusion.api import optimize
    from autofusion.ir import GraphBuilder, run_graph
    from autofusion.runtime import CompiledModel

    b = GraphBuilder("rms_leak")
    x = b.input("x", (4, 16))
    mean = b.op("ReduceMean", b.op("Mul", x, x), axes=[-1], keepdims=1)
    norm = b.op("Div", x, b.op("Sqrt", b.op("Add", mean, b.const(np.float32(1e-5), "eps"))))
    y = b.op("Mul", norm, b.const(np.linspace(0.5, 1.5, 16, dtype=np.float32), "g"))
    graph = b.build([y, b.op("Neg", norm)])  # the normalised row is also read outside the RMSNorm
    feeds = {"x": np.random.default_rng(8).standard_normal((4, 16)).astype(np.float32)}
    want = run_graph(graph, feeds)
    for strategy in ("greedy", "exact"):
        plan = optimize(graph, plugins.rule_paths(None), strategy=strategy, registry=plugins.registry_with_plugins(),
                        kinds=plugins.kinds_with_plugins())
        assert all(g.template != "rms_norm" for g in plan.groups)
        got = CompiledModel(plan).run(feeds)
        for name in graph.outputs:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_cli_checks_rules_with_the_plugins_kinds(example: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from autofusion.cli.rules import main as rules_main

    assert rules_main(["check", "--no-verify", str(EXAMPLE_RULES)]) == 0
    bad = tmp_path / "bad-params.fuse"
    bad.write_text('fuse r: Relu -> Tanh -> template "rms_norm" (rows_per_chunk="many")\n')
    assert rules_main(["check", "--no-verify", str(bad)]) == 1
    assert "F026" in capsys.readouterr().out


KIND_SOURCE = ("from autofusion.kinds import ACCEPT, KernelKind\n"
               "def kind(name): return KernelKind(name, '', lambda f: ACCEPT, renderers={'c': 'x:y'})\n")


@pytest.mark.parametrize(("source", "message"), [
    ("def make(): return 3\n", r"returned int, not KernelKinds"),
    ("def make(): return [3]\n", r"returned int, not a KernelKind"),
    (KIND_SOURCE + "def make(): return [kind('pointwise')]\n", r"redefines the kernel kind 'pointwise'"),
    (KIND_SOURCE.replace("renderers={'c': 'x:y'}", "renderers={}") + "def make(): return kind('k')\n",
     r"kind 'k' needs accepts\(facts\) and a renderer"),
    (KIND_SOURCE + "def make(): return kind('k')\n", r"kind 'k': its c renderer 'x:y' cannot be loaded"),
])
def test_broken_kernel_plugins_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                            message: str) -> None:
    module = f"badkinds_{abs(hash(source))}"  # one module per case: a loaded module stays in sys.modules
    broken_plugin(tmp_path, monkeypatch, module, source, {plugins.KERNELS: {"bad": f"{module}:make"}})
    with pytest.raises(plugins.PluginError, match=message):
        plugins.kinds_with_plugins()


# -- a plugin op's own spelling reaches the C (and Triton) backend ------------------------------------


def swish_mlp_plan(registry: Any) -> Any:
    from autofusion.api import optimize
    from autofusion.ir import GraphBuilder

    b = GraphBuilder("swish_mlp", registry)
    x = b.input("x", (6, 24))
    h = b.op("Add", b.op("MatMul", x, b.const(np.random.default_rng(3).standard_normal((24, 40)).astype(np.float32),
                                                  "w")), b.const(np.full(40, 0.25, np.float32), "bias"))
    y = b.op("Mul", b.op("Swish", h), b.const(np.float32(2.0), "two"))
    return optimize(b.build([y]), plugins.rule_paths(None), registry=registry, kinds=plugins.kinds_with_plugins())


def test_plugin_op_runs_in_the_superkernel_by_its_c_spelling(example: Path) -> None:
    from autofusion.codegen import render_plan
    from autofusion.ir import run_graph
    from autofusion.runtime import CompiledModel

    registry = plugins.registry_with_plugins()
    plan = swish_mlp_plan(registry)
    (kernel,) = [g for g in plan.groups if g.fused]  # MatMul, Add, Swish and the scaling in one kernel
    assert "Swish" in [plan.graph.node_by_name[n].op for n in kernel.nodes]
    assert "af_expf(-(" in "\n".join(text for _, text in render_plan(plan).units)
    feeds = {"x": np.random.default_rng(4).standard_normal((6, 24)).astype(np.float32)}
    (out,) = plan.graph.outputs
    np.testing.assert_allclose(CompiledModel(plan).run(feeds)[out], run_graph(plan.graph, feeds, registry)[out],
                               rtol=1e-5, atol=1e-5)


def test_an_op_without_a_spelling_is_refused_by_name(example: Path) -> None:
    from dataclasses import replace

    from autofusion.codegen import CodegenError, render_plan

    registry = plugins.registry_with_plugins()
    bare = default_registry().extended([replace(registry["Swish"], spelling={})])
    with pytest.raises(CodegenError, match="Swish"):
        render_plan(replace(swish_mlp_plan(registry), registry=bare))


def test_plugin_op_runs_in_triton_by_its_spelling(example: Path) -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from autofusion.decide.groups import build_groups
    from autofusion.decide.plan import ZERO_COST, Plan
    from autofusion.ir import GraphBuilder, run_graph
    from autofusion.runtime.triton_runner import TritonModel

    registry = plugins.registry_with_plugins()
    b = GraphBuilder("swish", registry)
    x = b.input("x", (5, 33))
    graph = b.build([b.op("Add", b.op("Swish", x), x)])
    groups = build_groups(graph, [[n.name for n in graph.nodes]], registry=registry)
    model = TritonModel(Plan(graph, groups, ZERO_COST, ZERO_COST, registry=registry), fallback=False)
    feeds = {"x": np.random.default_rng(7).standard_normal((5, 33)).astype(np.float32)}
    (out,) = graph.outputs
    np.testing.assert_allclose(model(feeds)[out], run_graph(graph, feeds, registry)[out], rtol=1e-5, atol=1e-6)
