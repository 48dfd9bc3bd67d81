"""``autofusion-rules list``: every class, pattern and rule of loaded files, with its doc comment."""

from __future__ import annotations

import json
from typing import Any

from autofusion.dsl import guards as g
from autofusion.dsl.ir import Branch, ClassDef, FusionRule, Loop, NoFuse, PatternDef, Rewrite, unparse
from autofusion.dsl.loader import Analysis
from autofusion.ops.registry import OpClass, OpRegistry


def _guard(guard: g.Guard | None) -> str:
    return f" where {g.unparse(guard)}" if guard is not None else ""


def describe(node: Any) -> str:
    """A one-line statement of what a rule says."""
    if isinstance(node, ClassDef):
        return f"class {node.name} = {' | '.join(node.members)}  ({len(node.ops)} ops)"
    if isinstance(node, PatternDef):
        params = f"({', '.join(node.params)})" if node.params is not None else ""
        body = node.body
        if isinstance(body, Branch):
            text = f"branch {body.shared} {{ {', '.join(unparse(m) for m in body.members)} }}"
        elif isinstance(body, Loop):
            text = f"loop ({', '.join(body.carried)}) {{ ... }}"
        else:
            text = unparse(body)
        return f"pattern {node.name}{params} = {text}{_guard(node.guard)}"
    if isinstance(node, Rewrite):
        arrow = "<=>" if node.bidirectional else "=>"
        return f"rewrite {node.name}: {unparse(node.lhs)} {arrow} {unparse(node.rhs)}{_guard(node.guard)}"
    if isinstance(node, NoFuse):
        return f"nofuse {node.name}: {unparse(node.target)}{_guard(node.guard)}"
    if isinstance(node, FusionRule):
        return f"fuse {node.name} [{node.kind}]: {_fusion_body(node)}{_template(node)}{_guard(node.guard)}" + (
            f" priority {node.priority}" if node.priority else "")
    return str(node)


def _fusion_body(rule: FusionRule) -> str:
    if rule.kind == "linear" and rule.pattern is not None:
        return unparse(rule.pattern)
    if rule.kind == "class":
        return f"{rule.consumer} into {rule.host} {rule.producer}"
    if rule.kind == "branch":
        shared = rule.shared or ""
        if rule.shared_term is not None:
            shared += f" = {unparse(rule.shared_term)}"
        members = [unparse(m) for m in rule.members] + ([rule.shared or ""] if rule.shared_output else [])
        return f"branch {shared} {{ {', '.join(members)} }}"
    updates = ", ".join(f"{c} = {unparse(b)}" for c, b in zip(rule.carried, rule.body))
    return f"loop ({', '.join(rule.carried)}) {{ {updates} }}"


def _template(rule: FusionRule) -> str:
    if not rule.template:
        return ""
    params = ", ".join(f"{k}={v!r}" for k, v in rule.params.items())
    return f' -> template "{rule.template}"' + (f" ({params})" if params else "")


def entries(analysis: Analysis) -> list[dict[str, Any]]:
    """One record per class, pattern and rule, in file order."""
    out: list[dict[str, Any]] = []
    classes = analysis.program.ruleset.classes
    for c in analysis.program.compiled:
        st = c.statement
        out.append({"kind": st.kind, "name": st.name, "file": st.span.file, "line": st.span.line,
                    "doc": st.doc, "text": describe(c.rule), "ok": c.ok})
    for cls in classes.values():
        if not cls.builtin:
            out.append({"kind": "class", "name": cls.name, "file": cls.span.file, "line": cls.span.line,
                        "doc": cls.doc, "text": describe(cls), "ok": True})
    return sorted(out, key=lambda e: (analysis.program.ruleset.files.index(e["file"])
                                      if e["file"] in analysis.program.ruleset.files else 0, e["line"]))


def format_list(analysis: Analysis, as_json: bool = False) -> str:
    items = entries(analysis)
    if as_json:
        return json.dumps({"rules": items}, indent=2)
    out: list[str] = []
    current = None
    for e in items:
        if e["file"] != current:
            current = e["file"]
            out.append(("" if not out else "\n") + current)
        out.append(f"  {e['text']}    ({e['file']}:{e['line']})")
        for line in e["doc"].splitlines():
            out.append(f"      {line}")
    return "\n".join(out) + "\n"


def format_ops(registry: OpRegistry) -> str:
    """The ops of the registry by class: the names rules may use."""
    out = []
    for cls in OpClass:
        names = registry.of_class(cls)
        out.append(f"{cls.value} ({len(names)}): {', '.join(names)}")
    return "\n".join(out) + "\n"
