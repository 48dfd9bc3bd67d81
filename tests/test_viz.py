"""Pictures and the HTML report: DOT structure, escaping, report sections and numbers, the viz command."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autofusion import models
from autofusion.api import optimize
from autofusion.cli.main import main
from autofusion.decide.explain import explain_report
from autofusion.decide.summary import plan_summary
from autofusion.ir import GraphBuilder
from autofusion.viz import Picture, cluster_count, graph_dot, html_report, plan_dot, write_viz
from autofusion.viz.dot import quote
from autofusion.viz.report import human_seconds

RULES = """\
class compute = pointwise | reduction | opaque
fuse qkv: branch x { MatMul(x, wq), MatMul(x, wk), MatMul(x, wv) } -> template "horizontal_gemm" where const(wq) and const(wk) and const(wv)
fuse epilogue: pointwise into producer compute
fuse prologue: pointwise into consumer reduction
"""
EVIL = 'x"<script>alert(1)</script>\\n&\nend'  # quote, tag, backslash, ampersand, newline


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "viz.fuse"
    path.write_text(RULES)
    return path


@pytest.fixture(scope="module")
def bert(rules: Path):  # type: ignore[no-untyped-def]
    graph = models.build("bert-tiny")
    return graph, optimize(graph, rules)


@pytest.fixture(scope="module")
def evil(rules: Path):  # type: ignore[no-untyped-def]
    """A model whose input, node and output names try to break DOT and HTML."""
    b = GraphBuilder(f"model {EVIL}")
    x = b.input(f"in {EVIL}", (4, 8))
    m = b.op("MatMul", x, b.const(np.ones((8, 8), np.float32), f"w {EVIL}"), name=f"mm {EVIL}")
    y = b.op("Relu", b.op("Add", m, b.const(np.ones(8, np.float32)), name=f"add {EVIL}"), name=f"relu {EVIL}")
    graph = b.build([y])
    return graph, optimize(graph, rules)


def dot_structure(dot: str) -> tuple[set[str], list[tuple[str, str]]]:
    """Declared node ids and edges of our DOT output, checking quotes and braces balance per line."""
    depth = 0
    declared: set[str] = set()
    edges: list[tuple[str, str]] = []
    for line in dot.splitlines():
        unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)  # strings removed: what is left is structure
        assert unquoted.count('"') % 2 == 0, line
        depth += unquoted.count("{") - unquoted.count("}")
        assert depth >= 0
        edge = re.fullmatch(r"\s*(\w+) -> (\w+)( \[.*\])?;", unquoted)
        if edge:
            edges.append((edge.group(1), edge.group(2)))
            continue
        node = re.fullmatch(r"\s*(\w+) \[.*\];", unquoted)
        if node:
            declared.add(node.group(1))
    assert depth == 0
    return declared, edges


def check_dot(dot: str) -> None:
    declared, edges = dot_structure(dot)
    assert edges and all(a in declared and b in declared for a, b in edges)
    dot_binary = shutil.which("dot")
    if dot_binary:  # Graphviz installed: it must accept the text too
        done = subprocess.run([dot_binary, "-Tsvg"], input=dot.encode(), capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()


def test_plan_dot_has_one_labelled_cluster_per_fused_group(bert) -> None:  # type: ignore[no-untyped-def]
    graph, plan = bert
    before, after = graph_dot(graph), plan_dot(plan)
    check_dot(before)
    check_dot(after)
    assert cluster_count(before) == 0
    fused = [g for g in plan.groups if g.fused]
    assert cluster_count(after) == len(fused) > 0
    for group in fused:
        assert f"{group.name}  [{group.template}, {group.kind}]" in after
        for rule in group.rules:
            assert f"{rule.name} (viz.fuse:{rule.line})" in after
    declared, _ = dot_structure(after)
    assert len([d for d in declared if re.fullmatch(r"n\d+", d)]) == len(plan.graph.nodes)
    assert after.count("style=dashed") > 0  # tensors that stay inside a kernel


def test_dot_escapes_every_name(evil) -> None:  # type: ignore[no-untyped-def]
    graph, plan = evil
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    for dot in (graph_dot(graph), plan_dot(plan)):
        check_dot(dot)
        assert "<script>" in dot  # DOT labels keep the text; only quoting matters there
        assert "\nend" not in dot  # raw newlines from names never reach the DOT text


def report(plan, graph, pictures=()) -> str:  # type: ignore[no-untyped-def]
    return html_report(plan, plan_summary(plan, graph), explain_report(plan), pictures, source="bert-tiny")


def test_report_shows_the_plan_numbers_and_explain_tables(bert) -> None:  # type: ignore[no-untyped-def]
    graph, plan = bert
    page = report(plan, graph)
    for section in ("summary", "kernels", "explain"):
        assert f'<section id="{section}">' in page
    summary = plan_summary(plan, graph)
    assert f"{summary['kernels_before']}<span class=\"arrow\">→</span>{summary['kernels_after']}" in page
    assert human_seconds(plan.cost_before.seconds) in page and human_seconds(plan.cost_after.seconds) in page
    explained = explain_report(plan)
    for rule in explained["rules"]:
        if rule["where"]:
            assert html.escape(rule["where"]) in page
    for reason, count in explained["reasons"].items():
        assert re.search(rf'{re.escape(reason)}</span></td><td class="num">{count}</td>', page)
    # the cost table lists every group, most expensive first
    kernels = page[page.index('<section id="kernels">'):page.index('<section id="explain">')]
    names = re.findall(r'<td class="mono">([^<]+)</td>', kernels)
    by_cost = sorted(plan.groups, key=lambda g: -g.cost.seconds)
    assert names == [g.name for g in by_cost]
    # self-contained: nothing is fetched from anywhere
    assert not re.search(r"https?://|<link|\ssrc=|@import", page)


def test_report_escapes_names_from_the_model(evil) -> None:  # type: ignore[no-untyped-def]
    graph, plan = evil
    page = report(plan, graph)
    assert "<script>alert" not in page
    assert html.escape(graph.name) in page
    assert page.count("<script>") == 1  # only the report's own sorting script


def test_pictures_are_inlined_or_explained(bert) -> None:  # type: ignore[no-untyped-def]
    graph, plan = bert
    svg = '<?xml version="1.0"?>\n<!DOCTYPE svg>\n<svg width="10pt" height="10pt"><g id="graph0"/></svg>'
    page = report(plan, graph, [Picture("before", "before.dot", svg), Picture("after", "after.dot", svg)])
    assert page.count('<svg class="graph" ') == 2 and "<!DOCTYPE svg>" not in page and "<?xml" not in page
    missing = report(plan, graph, [Picture("before", "before.dot", None, "Graphviz `dot` is not installed")])
    assert "Graphviz `dot` is not installed" in missing and "<code>before.dot</code>" in missing
    assert "<svg" not in missing


FAKE_DOT = """\
import sys
text = sys.stdin.read()
if "FAIL" in text:
    sys.stderr.write("syntax error in line 1\\n")
    sys.exit(1)
print('<?xml version="1.0"?><svg width="20pt" height="20pt"><text>%d clusters</text></svg>' % text.count("cluster_"))
"""


def fake_dot(tmp_path: Path) -> str:
    """An executable that acts as `dot -Tsvg` (so rendering is tested without Graphviz)."""
    script = tmp_path / "fake_dot.py"
    script.write_text(FAKE_DOT)
    launcher = tmp_path / "dot"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    launcher.chmod(0o755)
    return str(launcher)


def test_write_viz_renders_with_dot_and_inlines_the_svg(bert, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    graph, plan = bert
    result = write_viz(plan, graph, tmp_path / "out", dot_binary=fake_dot(tmp_path))
    assert result.rendered and not result.problem
    assert sorted(p.name for p in result.files) == ["after.dot", "after.svg", "before.dot", "before.svg",
                                                    "report.html"]
    page = result.report.read_text()
    fused = sum(g.fused for g in plan.groups)
    assert f"<text>{fused} clusters</text>" in page and "<text>0 clusters</text>" in page


def test_write_viz_without_dot_writes_dot_files_and_says_so(bert, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    graph, plan = bert
    monkeypatch.setattr("autofusion.viz.render.shutil.which", lambda name: None)
    result = write_viz(plan, graph, tmp_path)
    assert not result.rendered and "not installed" in result.problem
    assert sorted(p.name for p in result.files) == ["after.dot", "before.dot", "report.html"]
    assert "not installed" in result.report.read_text()
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 1\n")
    failing.chmod(0o755)
    broken = write_viz(plan, graph, tmp_path / "broken", dot_binary=str(failing))
    assert not broken.rendered and "`dot` failed: Error: syntax error in line 1" == broken.problem


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_real_graphviz_renders_the_clusters(evil, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    graph, plan = evil
    result = write_viz(plan, graph, tmp_path)
    assert result.rendered
    svg = (tmp_path / "after.svg").read_text()
    assert svg.count('class="cluster"') == sum(g.fused for g in plan.groups)
    assert "<script>alert" not in svg and "<script>alert" not in result.report.read_text()


def test_cli_viz(rules: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autofusion.viz.render.shutil.which", lambda name: None)
    code = main(["viz", "resnet-tiny", "--rules", str(rules), "--out", str(tmp_path / "viz")])
    out = capsys.readouterr().out
    assert code == 0
    assert f"wrote {tmp_path / 'viz' / 'report.html'}" in out and "note: no SVG pictures" in out
    assert (tmp_path / "viz" / "after.dot").exists()
    code = main(["viz", "resnet-tiny", "--rules", str(rules), "--out", str(tmp_path / "nodot"), "--no-render"])
    out = capsys.readouterr().out
    assert code == 0 and "note:" not in out and not list((tmp_path / "nodot").glob("*.svg"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["viz", "resnet-tiny", "--rules", str(rules), "--out", str(blocker)])
    err = capsys.readouterr().err
    assert code == 2 and "is not a directory" in err and len(err.strip().splitlines()) == 1
