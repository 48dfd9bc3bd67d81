"""The fusion report: one self-contained HTML page (inline CSS and script, inline SVG pictures).

Sections: the plan summary (kernels, bytes, modelled cost before/after, timings), the modelled cost
of every kernel (sortable), the explain tables (rules that fired with file:line, fused kernels,
unfused pairs by reason) and the before/after pictures. Every name from the model or the rules is
escaped with :func:`html.escape`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autofusion import __version__
from autofusion.decide.plan import Plan
from autofusion.kinds import KindRegistry
from autofusion.viz.dot import legend_templates, template_colour
from autofusion.viz.render import inline_svg
from autofusion.viz.style import CSS, SORT_SCRIPT

SECTIONS = (("summary", "Summary"), ("kernels", "Cost per kernel"), ("explain", "Explain"),
            ("pictures", "Graphs"))
UNFUSED_ROWS = 300  # longer lists are cut (the counts per reason stay complete)


@dataclass(frozen=True)
class Picture:
    """One picture for the report: its title, the DOT file written, and the SVG when rendered."""

    title: str
    dot_file: str
    svg: str | None = None
    problem: str = ""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def human_bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def human_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} µs"


def human_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:,.0f}"


def _change(before: float, after: float) -> str:
    """The relative change, green when it went down (everything in this report is a cost)."""
    if before == 0:
        return '<span class="muted">—</span>'
    delta = (after - before) / before
    if abs(delta) < 5e-4:  # shows as +0.0%: neither better nor worse
        return '<span class="muted">±0.0%</span>'
    cls = "good" if delta < 0 else "bad"
    return f'<span class="{cls}">{delta:+.1%}</span>'


def _card(title: str, before: str, after: str, change: str) -> str:
    return (f'<div class="card"><div class="k">{esc(title)}</div><div class="v">{esc(before)}'
            f'<span class="arrow">→</span>{esc(after)}</div><div class="d">{change}</div></div>')


def _summary(s: Mapping[str, Any]) -> str:
    cb, ca = s["cost_breakdown_before"], s["cost_breakdown_after"]
    speedup = s["cost_before"] / s["cost_after"] if s["cost_after"] else 0.0
    cards = [
        _card("kernels", str(s["kernels_before"]), str(s["kernels_after"]),
              _change(s["kernels_before"], s["kernels_after"])),
        _card("modelled time", human_seconds(s["cost_before"]), human_seconds(s["cost_after"]),
              _change(s["cost_before"], s["cost_after"]) + (f' <span class="muted">({speedup:.2f}× faster)</span>'
                                                            if speedup else "")),
        _card("intermediates materialised", human_bytes(s["intermediate_bytes_before"]),
              human_bytes(s["intermediate_bytes_after"]),
              _change(s["intermediate_bytes_before"], s["intermediate_bytes_after"])),
        _card("bytes moved (model)", human_bytes(cb["bytes"]), human_bytes(ca["bytes"]),
              _change(cb["bytes"], ca["bytes"])),
        _card("kernel launches (model)", str(cb["launches"]), str(ca["launches"]),
              _change(cb["launches"], ca["launches"])),
        _card("flops (model)", human_count(cb["flops"]), human_count(ca["flops"]), _change(cb["flops"], ca["flops"])),
    ]
    t = s["seconds"]
    timings = ", ".join(f"{esc(k)} <b>{t[k]:.3f} s</b>" for k in ("import", "saturate", "extract", "total") if k in t)
    rewrites = ", ".join(f'<span class="pill">{esc(k)} ×{esc(v)}</span>' for k, v in s["rewrites_fired"].items())
    return (f'<section id="summary"><h2>Summary</h2><div class="cards">{"".join(cards)}</div>'
            f'<div class="timings">Optimisation time: {timings}. Saturation stopped: '
            f'<b>{esc(s["saturation_stop"] or "n/a")}</b>.</div>'
            f'<div class="timings">Rewrites fired: {rewrites or "none"}</div></section>')


def _th(label: str, numeric: bool = False) -> str:
    return f'<th class="sortable{" num" if numeric else ""}">{esc(label)}</th>'


def _num(value: float, text: str) -> str:
    return f'<td class="num" data-v="{value!r}">{esc(text)}</td>'


def _swatch(template: str, kinds: KindRegistry | None = None) -> str:
    return f'<span class="swatch" style="background:{template_colour(template, kinds)}"></span>{esc(template)}'


def _ops_text(ops: Sequence[str], limit: int = 12) -> str:
    shown = " ".join(ops[:limit])
    return shown + (f" … (+{len(ops) - limit})" if len(ops) > limit else "")


def _kernels(plan: Plan) -> str:
    """Every kernel's modelled cost, most expensive first; a bar shows its share of the total."""
    graph = plan.graph
    total = sum(g.cost.seconds for g in plan.groups) or 1.0
    largest = max((g.cost.seconds for g in plan.groups), default=0.0) or 1.0
    rows = []
    order = sorted(range(len(plan.groups)), key=lambda i: -plan.groups[i].cost.seconds)
    for i in order:
        g = plan.groups[i]
        share = g.cost.seconds / total
        ops = [graph.node_by_name[n].op for n in g.nodes]
        rows.append(
            f"<tr>{_num(i, str(i))}<td class=\"mono\">{esc(g.name)}</td><td>{_swatch(g.template, plan.kinds)}</td>"
            f"<td>{esc(g.kind)}</td><td class=\"ops\" title=\"{esc(' '.join(ops))}\">{esc(_ops_text(ops))}</td>"
            f"{_num(len(g.nodes), str(len(g.nodes)))}{_num(g.cost.bytes, human_bytes(g.cost.bytes))}"
            f"{_num(g.cost.flops, human_count(g.cost.flops))}{_num(g.cost.launches, str(g.cost.launches))}"
            f"{_num(g.cost.seconds, human_seconds(g.cost.seconds))}"
            f'<td class="bar" data-v="{share!r}"><i style="width:{g.cost.seconds / largest * 100:.1f}%"></i>'
            f"<span>{share:.1%}</span></td></tr>")
    head = "".join([_th("#", True), _th("kernel"), _th("template"), _th("kind"), _th("ops"), _th("nodes", True),
                    _th("bytes", True), _th("flops", True), _th("launches", True), _th("modelled time", True),
                    _th("share")])
    after = plan.cost_after
    return (f'<section id="kernels"><h2>Cost per kernel <span class="muted">({len(plan.groups)} groups, '
            f"{plan.kernels} kernels launched; modelled total {esc(human_seconds(after.seconds))}, "
            f"{esc(human_bytes(after.bytes))}; click a header to sort)</span></h2>"
            f'<div class="scroll"><table class="sort"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div></section>")


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = (),
           cls: str = "") -> str:
    """A plain table; cells are HTML already (callers escape)."""
    head = "".join(f'<th class="num">{esc(c)}</th>' if i in numeric else f"<th>{esc(c)}</th>"
                   for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _explain(report: Mapping[str, Any]) -> str:
    rules = [(f'<span class="mono">{esc(r["rule"])}</span>', esc(r["kind"]),
              f'<span class="mono">{esc(r["where"]) or "—"}</span>', esc(r["times"])) for r in report["rules"]]
    kernels = [(f'<span class="mono">{esc(k["name"])}</span>', _swatch(k["template"]), esc(k["kind"]),
                f'<span class="ops">{esc(_ops_text(k["ops"]))}</span>',
                "<br>".join(f'<span class="mono">{esc(r)}</span>' for r in k["rules"]) or "—")
               for k in report["kernels"]]
    counts = sorted(report["reasons"].items(), key=lambda kv: -kv[1])
    most = max((n for _, n in counts), default=1)
    reasons = [(f'<span class="pill">{esc(reason)}</span>', esc(n),
                f'<div class="meter"><i style="width:{n / most * 100:.0f}%"></i></div>') for reason, n in counts]
    unfused = report["unfused"]
    pairs = [(f'<span class="name">{esc(u["producer"])}</span>', f'<span class="name">{esc(u["consumer"])}</span>',
              f'<span class="ops">{esc(" → ".join(u["ops"]))}</span>', f'<span class="pill">{esc(u["reason"])}</span>',
              _detail(u)) for u in unfused[:UNFUSED_ROWS]]
    cut = (f'<p class="muted">… and {len(unfused) - UNFUSED_ROWS} more pairs (counts above are complete).</p>'
           if len(unfused) > UNFUSED_ROWS else "")
    skipped = "".join(f"<li><span class=\"mono\">{esc(k)}</span>: {esc(v)}</li>"
                      for k, v in report.get("skipped_rules", {}).items())
    parts = [
        '<section id="explain"><h2>Explain</h2>',
        f"<h3>Rules that fired ({len(rules)})</h3>",
        _table(("rule", "kind", "where (file:line)", "times"), rules, numeric=(3,)) if rules
        else '<p class="muted">No rule fired.</p>',
        f"<h3>Fused kernels ({len(kernels)})</h3>",
        f'<div class="scroll">{_table(("kernel", "template", "kind", "ops", "rules"), kernels)}</div>' if kernels
        else '<p class="muted">Nothing was fused.</p>',
        f"<h3>Why pairs were not fused ({len(unfused)} pairs)</h3>",
        _table(("reason", "pairs", ""), reasons, numeric=(1,), cls="reasons") if reasons else '<p class="muted">Every pair fused.</p>',
    ]
    if pairs:
        parts.append("<h3>Unfused pairs</h3>")
        parts.append(f'<div class="scroll">{_table(("producer", "consumer", "ops", "reason", "detail"), pairs)}'
                     f"</div>{cut}")
    if skipped:
        parts.append(f"<h3>Rules not used</h3><ul>{skipped}</ul>")
    parts.append("</section>")
    return "".join(parts)


def _detail(pair: Mapping[str, Any]) -> str:
    """The pair's detail, unless it only repeats the two ops (``Gather -> Add``)."""
    detail = str(pair["detail"])
    return "" if detail == " -> ".join(pair["ops"]) else esc(detail)


def _pictures(plan: Plan, pictures: Sequence[Picture]) -> str:
    """The rendered pictures inline; for those without SVG, a note naming the DOT files and why."""
    if not pictures:
        return ""
    missing = [p for p in pictures if p.svg is None]
    notes = "".join(
        f'<p class="note">{esc(problem)}: see the DOT files '
        f'{", ".join(f"<code>{esc(p.dot_file)}</code>" for p in missing if p.problem == problem)} '
        "next to this report (render them with <code>dot -Tsvg</code>).</p>"
        for problem in dict.fromkeys(p.problem or "no picture" for p in missing))
    shown = [p for p in pictures if p.svg is not None]
    legend = ""
    if shown:
        swatches = "".join(f"<span>{_swatch(t, plan.kinds)}</span>" for t in legend_templates(plan.groups))
        legend = (f'<div class="legend">Fused kernels are drawn as boxes coloured by template: {swatches or "none"}'
                  "</div><div class=\"legend\">Dashed edges are tensors that stay inside a kernel; solid ones are "
                  "written to memory.</div>")
    boxes = "".join(f'<div class="picture"><h3>{esc(p.title)}</h3>{inline_svg(p.svg or "")}</div>' for p in shown)
    return (f'<section id="pictures"><h2>Graphs before and after fusion</h2>{notes}{legend}'
            f'<div class="pictures">{boxes}</div></section>')


def _nav(with_pictures: bool) -> str:
    return "".join(f'<a href="#{anchor}">{title}</a>' for anchor, title in SECTIONS
                   if anchor != "pictures" or with_pictures)


def html_report(plan: Plan, summary: Mapping[str, Any], explain: Mapping[str, Any],
                pictures: Sequence[Picture] = (), source: str = "") -> str:
    """The whole report page. ``summary`` is :func:`autofusion.decide.summary.plan_summary`,
    ``explain`` is :func:`autofusion.decide.explain.explain_report` of the same plan."""
    files = sorted({r.file for g in plan.groups for r in g.rules if r.file})
    meta = [f"model <b>{esc(source or summary['graph'])}</b>", f"strategy <b>{esc(summary['strategy'])}</b>",
            f"cost model <b>{esc(summary['cost_model'] or 'n/a')}</b>",
            f"rules {esc(', '.join(files)) if files else 'none fired'}"]
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in summary.get("notes", []))
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>autofusion report: {esc(summary['graph'])}</title><style>{CSS}</style></head><body>",
        f"<header><h1>Fusion report: {esc(summary['graph'])}</h1>",
        f'<div class="meta">{"".join(f"<span>{m}</span>" for m in meta)}</div>',
        f"<nav>{_nav(bool(pictures))}</nav>",
        "</header><main>",
        notes, _summary(summary), _kernels(plan), _explain(explain), _pictures(plan, pictures),
        f"</main><footer>Generated by autofusion {esc(__version__)}. Modelled times come from the cost model, "
        "not from measurements.</footer>",
        f"<script>{SORT_SCRIPT}</script></body></html>\n",
    ])
