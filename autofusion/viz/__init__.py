"""Pictures of a fusion plan: Graphviz DOT (and SVG when ``dot`` is installed) and an HTML report.

>>> from autofusion.viz import write_viz  # write_viz(plan, source_graph, "out/") writes:
>>> # out/before.dot, out/after.dot, out/before.svg, out/after.svg (with dot), out/report.html
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autofusion.decide.plan import Plan
from autofusion.graph.graph import Graph
from autofusion.ops.registry import OpRegistry
from autofusion.viz.dot import cluster_count, graph_dot, plan_dot, template_colour
from autofusion.viz.render import Rendered, find_dot, render_svg
from autofusion.viz.report import Picture, html_report

__all__ = ["Picture", "VizOutput", "cluster_count", "find_dot", "graph_dot", "html_report", "plan_dot",
           "template_colour", "write_viz"]


@dataclass(frozen=True)
class VizOutput:
    """What :func:`write_viz` wrote; ``problem`` says why there is no SVG (empty when rendered)."""

    files: tuple[Path, ...]
    report: Path
    rendered: bool
    problem: str = ""


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_viz(plan: Plan, source: Graph, out_dir: str | os.PathLike[str], label: str = "",
              render: bool = True, dot_binary: str | None = None, registry: OpRegistry | None = None) -> VizOutput:
    """Write before/after DOT files (SVG too when ``render`` and Graphviz is found) and report.html.

    ``source`` is the graph before rewrites; ``label`` names the model in the report. ``dot_binary``
    overrides the ``dot`` found on PATH; ``registry`` is the op registry the plan was made with.
    """
    from autofusion.decide.explain import explain_report
    from autofusion.decide.summary import plan_summary

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dot = (dot_binary or find_dot()) if render else None
    written: list[Path] = []
    pictures = []
    for stem, title, text in (("before", f"before: {len(source.nodes)} nodes", graph_dot(source)),
                              ("after", f"after: {plan.kernels} kernels", plan_dot(plan))):
        written.append(_write(out / f"{stem}.dot", text))
        rendered = render_svg(text, dot) if render else Rendered(None, "rendering was turned off")
        if rendered.svg is not None:
            written.append(_write(out / f"{stem}.svg", rendered.svg))
        else:
            (out / f"{stem}.svg").unlink(missing_ok=True)  # a picture from an earlier run would mislead
        pictures.append(Picture(title, f"{stem}.dot", rendered.svg, rendered.problem))
    summary = plan_summary(plan, source, registry)
    page = html_report(plan, summary, explain_report(plan), pictures, source=label or source.name)
    report = _write(out / "report.html", page)
    written.append(report)
    problems = list(dict.fromkeys(p.problem for p in pictures if p.problem))
    return VizOutput(tuple(written), report, not problems, "; ".join(problems))
