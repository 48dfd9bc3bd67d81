"""``autofusion plugins``: the installed plugins of every entry-point group, each loaded and checked."""

from __future__ import annotations

import argparse
from typing import Any

from autofusion.cli.common import EXIT_USAGE, Output, error


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plugins", help="list installed plugins (ops, rules, cost models, strategies, backends)",
        description="List the plugins that installed packages declare through entry points, per group. Each is "
                    "loaded to show what it provides; a plugin that fails is reported by name (exit status 2).")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _provides(plugin: Any) -> str:
    """What a loaded plugin contributes, in a few words; PluginError when it is broken."""
    from autofusion import plugins

    if plugin.group == plugins.OPS:
        return "ops: " + ", ".join(d.name for d in plugins.load_ops(plugin))
    if plugin.group == plugins.RULES:
        folder = plugins.load_rule_dir(plugin)
        files = sorted(p.name for p in folder.rglob("*.fuse"))
        return f"rules: {folder} ({', '.join(files) or 'no .fuse files'})"
    if plugin.group == plugins.COST_MODELS:
        from autofusion.ops import default_registry

        return f"cost model {plugins.cost_model(plugin.name, default_registry()).name!r}"
    if plugin.group == plugins.STRATEGIES:
        return f"strategy {getattr(plugins.strategy(plugin.name), 'name', plugin.name)!r}"
    if plugin.group == plugins.KERNELS:
        return "kernel kinds: " + ", ".join(k.name for k in plugins.load_kinds(plugin))
    return f"backend {plugins.backend(plugin.name).name!r}"


def plugin_table() -> list[dict[str, str]]:
    """One row per declared plugin: group, name, package, entry point, what it provides or its error."""
    from autofusion import plugins

    rows = []
    for group in plugins.GROUPS:
        for plugin in plugins.discover(group):
            row = {"group": group, "name": plugin.name, "package": plugin.package, "entry_point": plugin.value}
            try:
                row["provides"], row["error"] = _provides(plugin), ""
            except plugins.PluginError as e:
                row["provides"], row["error"] = "", str(e)
            rows.append(row)
    return rows


def run(args: argparse.Namespace) -> int:
    from autofusion import plugins

    rows = plugin_table()
    broken = [r for r in rows if r["error"]]
    out = Output()
    if args.json:
        out.json({"groups": list(plugins.GROUPS), "plugins": rows})
    elif not rows:
        out.line(f"no plugins installed (groups: {', '.join(plugins.GROUPS)})")
    else:
        for group in plugins.GROUPS:
            members = [r for r in rows if r["group"] == group]
            if members:
                out.table(group, ("name", "package", "entry point", "provides"),
                          [(r["name"], r["package"], r["entry_point"], r["provides"] or "BROKEN") for r in members])
    for r in broken:
        error(r["error"])
    return EXIT_USAGE if broken else 0
