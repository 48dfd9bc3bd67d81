"""``autofusion info MODEL``: what a model is made of (ops, op classes, parameters, memory, I/O)."""

from __future__ import annotations

import argparse
from typing import Any

from autofusion.cli.common import (
    CliError,
    Output,
    add_model_arguments,
    human_bytes,
    load_model,
    tensor_json,
    type_text,
)
from autofusion.graph.dims import Dim
from autofusion.ir import Graph


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "info", help="show a model's op histogram, op classes, parameters and inputs/outputs",
        description="Show what a model is made of: node count, op histogram, op classes, parameter "
                    "count and bytes, activation bytes, inputs and outputs.")
    add_model_arguments(p, required=False)
    p.add_argument("--list", action="store_true", help="list the built-in models instead")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Output()
    if args.list:
        return _list_models(out, args.json)
    if args.model is None:
        raise CliError("info needs a MODEL (a built-in name or an .onnx file), or --list")
    from autofusion.models import graph_stats

    loaded = load_model(args, symbolic=True)  # a model with dynamic axes is described as it is
    stats = graph_stats(loaded.graph)
    activations, activations_text = _activations(loaded.graph, stats.activation_bytes)
    report: dict[str, Any] = {
        "model": loaded.source,
        "graph": loaded.graph.name,
        "builtin": loaded.builtin,
        "nodes": stats.nodes,
        "ops": dict(stats.op_histogram),
        "op_classes": dict(stats.op_classes),
        "parameters": {"count": stats.parameter_count, "bytes": stats.parameter_bytes},
        "other_constants": {"count": stats.other_constant_count, "bytes": stats.other_constant_bytes},
        "activation_bytes": activations,
        "inputs": [tensor_json(n, t) for n, t in stats.inputs],
        "outputs": [tensor_json(n, t) for n, t in stats.outputs],
    }
    if args.json:
        out.json(report)
        return 0
    out.fields(f"{loaded.source}", [
        ("graph", loaded.graph.name),
        ("nodes", stats.nodes),
        ("parameters", f"{stats.parameter_count:,} ({human_bytes(stats.parameter_bytes)})"),
        ("other constants", f"{stats.other_constant_count:,} ({human_bytes(stats.other_constant_bytes)})"),
        ("activations", activations_text),
    ])
    out.table("inputs", ("name", "type"), [(n, type_text(t)) for n, t in stats.inputs])
    out.table("outputs", ("name", "type"), [(n, type_text(t)) for n, t in stats.outputs])
    out.table("op classes", ("class", "nodes"), list(stats.op_classes))
    out.table("ops", ("op", "nodes"), list(stats.op_histogram))
    return 0


def _activations(graph: Graph, total: Dim) -> tuple[Any, str]:
    """Activation bytes as JSON and text: a number, or for symbolic sizes the expression and its
    value at the representative binding."""
    if isinstance(total, int):
        return total, human_bytes(total)
    from autofusion.graph.dims import evaluate
    from autofusion.ir.symbolic import representative_binding

    at = representative_binding(graph)
    value = evaluate(total, at)
    where = ", ".join(f"{k}={v}" for k, v in at.items())
    return {"expression": str(total), "at": at, "bytes": value}, f"{total} ({human_bytes(value)} at {where})"


def _list_models(out: Output, as_json: bool) -> int:
    from autofusion.models import BUILTIN_MODELS, describe

    if as_json:
        out.json({"models": [{"name": s.name, "family": s.family, "summary": s.summary, "default_seq": s.default_seq,
                              "default_batch": s.default_batch, "description": describe(s.name)}
                             for s in BUILTIN_MODELS]})
        return 0
    out.table("built-in models", ("name", "family", "seq", "what it is"),
              [(s.name, s.family, "-" if s.default_seq is None else str(s.default_seq), s.summary)
               for s in BUILTIN_MODELS])
    return 0
