"""Plugins through Python entry points: ops, rule directories, cost models, strategies, backends.

A package extends autofusion by declaring entry points (``[project.entry-points."GROUP"]`` in its
``pyproject.toml``); each names a callable:

=========================== ======================================================================
group                       the callable
=========================== ======================================================================
``autofusion.ops``          ``() -> Iterable[OpDef]``: ops added to the registry
``autofusion.rules``        ``() -> path``: a directory of ``.fuse`` files, loaded with the library
``autofusion.cost_models``  ``(registry: OpRegistry) -> CostModel``
``autofusion.strategies``   ``() -> Strategy`` (see :mod:`autofusion.decide.strategies`)
``autofusion.backends``     ``() -> Backend``: compiles a plan into something that runs
``autofusion.kernels``      ``() -> Iterable[KernelKind]``: kernel kinds rules may name
=========================== ======================================================================

Nothing is global: :func:`registry_with_plugins` builds a new registry value. A plugin that fails
to load or returns the wrong thing raises :class:`PluginError` naming the plugin and its package.
docs/plugins.md is the guide.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from autofusion.decide.cost import CostModel
from autofusion.decide.plan import Plan
from autofusion.kinds import KernelKind, KindError, KindRegistry, default_kinds
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpDef, OpRegistry

OPS = "autofusion.ops"
RULES = "autofusion.rules"
COST_MODELS = "autofusion.cost_models"
STRATEGIES = "autofusion.strategies"
BACKENDS = "autofusion.backends"
KERNELS = "autofusion.kernels"
GROUPS: tuple[str, ...] = (OPS, RULES, COST_MODELS, STRATEGIES, BACKENDS, KERNELS)
_NOUNS = {OPS: "op plugin", RULES: "rules plugin", COST_MODELS: "cost model", STRATEGIES: "strategy",
          BACKENDS: "backend", KERNELS: "kernel kind"}


class PluginError(ValueError):
    """A plugin could not be loaded or gave something unusable; the message names it."""


@runtime_checkable
class RunnableModel(Protocol):
    """What a backend's ``compile`` returns: runs the plan on named input arrays."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@runtime_checkable
class Backend(Protocol):
    """A code-generation backend: turns a fusion plan into a runnable model."""

    name: str

    def compile(self, plan: Plan) -> RunnableModel: ...


@dataclass(frozen=True)
class Plugin:
    """One declared entry point, not loaded yet."""

    group: str
    name: str
    value: str  # "module:attribute"
    package: str  # "distribution version", or "" when unknown
    entry_point: EntryPoint

    @property
    def label(self) -> str:
        origin = f", from {self.package}" if self.package else ""
        return f"plugin {self.name!r} ({self.group}{origin})"

    def load(self) -> Any:
        """The object the entry point names; any failure becomes PluginError."""
        try:
            return self.entry_point.load()
        except Exception as e:
            raise PluginError(f"{self.label} failed to load {self.value}: {type(e).__name__}: {e}") from None

    def call(self, *args: Any) -> Any:
        """Load the entry point and call it with ``args`` (plugins export factories)."""
        target = self.load()
        if not callable(target):
            raise PluginError(f"{self.label}: {self.value} is not callable")
        try:
            return target(*args)
        except Exception as e:
            raise PluginError(f"{self.label} raised {type(e).__name__}: {e}") from None


def discover(group: str) -> tuple[Plugin, ...]:
    """The plugins declared for ``group`` by installed packages, sorted by name (nothing loaded)."""
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r} (groups: {', '.join(GROUPS)})")
    found = []
    for ep in entry_points(group=group):
        dist = getattr(ep, "dist", None)
        package = f"{dist.metadata['Name']} {dist.version}" if dist is not None else ""
        found.append(Plugin(group, ep.name, ep.value, package, ep))
    return tuple(sorted(found, key=lambda p: (p.name, p.package)))


def _find(group: str, name: str, builtin: Iterable[str]) -> Plugin:
    matches = [p for p in discover(group) if p.name == name]
    if not matches:
        known = sorted({*builtin, *(p.name for p in discover(group))})
        raise PluginError(f"unknown {_NOUNS[group]} {name!r} "
                          f"(available: {', '.join(known) or 'none'})")
    if len(matches) > 1:
        raise PluginError(f"{len(matches)} packages declare {group} plugin {name!r}: "
                          + ", ".join(p.package or p.value for p in matches))
    return matches[0]


# -- ops ----------------------------------------------------------------------------------------------


def _checked(plugin: Plugin, result: Any, cls: type, article: str, noun: str, taken: Container[str]) -> tuple[Any, ...]:
    """What a plugin returned as a tuple of ``cls`` (a ``noun`` each), none of a name in ``taken``."""
    try:
        items = tuple(result)
    except TypeError:
        raise PluginError(f"{plugin.label} returned {type(result).__name__}, not {cls.__name__}s") from None
    for item in items:
        if not isinstance(item, cls):
            raise PluginError(f"{plugin.label} returned {type(item).__name__}, not {article} {cls.__name__}")
        name = getattr(item, "name", "")
        if name in taken:
            raise PluginError(f"{plugin.label} redefines the {noun} {name!r}, which is already defined")
    return items


def _from_every(group: str, load: Callable[[Plugin], tuple[Any, ...]], noun: str) -> list[Any]:
    """Every plugin's items of ``group``; two plugins defining one name is an error (a plugin never
    silently replaces another's)."""
    owner: dict[str, str] = {}
    found: list[Any] = []
    for plugin in discover(group):
        for item in load(plugin):
            if item.name in owner:
                raise PluginError(f"{plugin.label} and {owner[item.name]} both define the {noun} {item.name!r}")
            owner[item.name] = plugin.label
            found.append(item)
    return found


def load_ops(plugin: Plugin, base: OpRegistry | None = None) -> tuple[OpDef, ...]:
    """The OpDefs one ``autofusion.ops`` plugin provides, checked: OpDefs, none already in ``base``."""
    return _checked(plugin, plugin.call(), OpDef, "an", "op", base or default_registry())


def plugin_ops(base: OpRegistry | None = None) -> tuple[OpDef, ...]:
    """The OpDefs of every ``autofusion.ops`` plugin; a name clash with ``base`` or another plugin
    is an error."""
    return tuple(_from_every(OPS, lambda plugin: load_ops(plugin, base), "op"))


def registry_with_plugins(base: OpRegistry | None = None) -> OpRegistry:
    """``base`` (default: the built-in registry) extended with every plugin's ops; ``base`` itself
    when no op plugin is installed."""
    base = base or default_registry()
    ops = plugin_ops(base)
    return base.extended(ops) if ops else base


# -- kernel kinds -------------------------------------------------------------------------------------


def load_kinds(plugin: Plugin, base: KindRegistry | None = None) -> tuple[KernelKind, ...]:
    """The kinds one ``autofusion.kernels`` plugin provides, checked: KernelKinds, none already in ``base``."""
    result = plugin.call()
    kinds = _checked(plugin, (result,) if isinstance(result, KernelKind) else result, KernelKind, "a",
                     "kernel kind", base or default_kinds())
    for k in kinds:
        if not callable(k.accepts) or not k.renderers:
            raise PluginError(f"{plugin.label}: kind {k.name!r} needs accepts(facts) and a renderer")
        try:
            for backend in k.renderers:
                k.renderer(backend)
        except KindError as e:
            raise PluginError(f"{plugin.label}: {e}") from None
    return kinds


def kinds_with_plugins(base: KindRegistry | None = None) -> KindRegistry:
    """``base`` (default: the built-in kinds) with every ``autofusion.kernels`` plugin's kinds after
    them; ``base`` itself when none is installed. Two plugins naming one kind is an error."""
    base = base or default_kinds()
    kinds = _from_every(KERNELS, lambda plugin: load_kinds(plugin, base), "kernel kind")
    return base.extended(kinds) if kinds else base


# -- rules --------------------------------------------------------------------------------------------


def load_rule_dir(plugin: Plugin) -> Path:
    """The rule directory one ``autofusion.rules`` plugin provides, checked to exist."""
    result = plugin.call()
    if not isinstance(result, (str, Path)):
        raise PluginError(f"{plugin.label} returned {type(result).__name__}, not a directory path")
    path = Path(result)
    if not path.is_dir():
        raise PluginError(f"{plugin.label} returned {str(path)!r}, which is not a directory")
    return path


def plugin_rule_dirs() -> tuple[Path, ...]:
    """The rule directories of every ``autofusion.rules`` plugin."""
    return tuple(load_rule_dir(p) for p in discover(RULES))


def rule_paths(paths: Iterable[str | Path] | None = None) -> list[Path] | None:
    """The rule paths to load: ``paths`` as given, or (None) the shipped library with every plugin's
    rule directory; None when that is the shipped library alone (what ``load_rules(None)`` loads)."""
    if paths is not None:
        return [Path(p) for p in paths]
    extra = plugin_rule_dirs()
    if not extra:
        return None
    from autofusion.resources import data_dir

    return [data_dir("rules"), *extra]


# -- cost models, strategies, backends ----------------------------------------------------------------


def _analytic(profile: str) -> Callable[[OpRegistry], CostModel]:
    def make(registry: OpRegistry) -> CostModel:
        from autofusion.decide.cost import AnalyticCostModel, HardwareProfile

        return AnalyticCostModel(HardwareProfile.load(profile), registry)

    return make


BUILTIN_COST_MODELS: Mapping[str, Callable[[OpRegistry], CostModel]] = {
    "analytic": _analytic("cpu-2core"),
    "analytic:cpu-2core": _analytic("cpu-2core"),
    "analytic:nvidia-h200": _analytic("nvidia-h200"),
}


def cost_model(name: str, registry: OpRegistry | None = None) -> CostModel:
    """A cost model by name: built-in (``analytic``, ``analytic:PROFILE``) or an ``autofusion.cost_models``
    plugin, made for ``registry`` (default: the built-in ops plus plugin ops)."""
    registry = registry or registry_with_plugins()
    factory = BUILTIN_COST_MODELS.get(name)
    if factory is not None:
        return factory(registry)
    plugin = _find(COST_MODELS, name, BUILTIN_COST_MODELS)
    model = plugin.call(registry)
    if not isinstance(model, CostModel):
        raise PluginError(f"{plugin.label} returned {type(model).__name__}, which is not a CostModel "
                          "(needs a name and group_cost(graph, nodes))")
    return model


def strategy(name: str) -> Any:
    """A decision strategy by name (built-in or plugin), loaded so that a broken plugin is reported
    as PluginError; :func:`autofusion.decide.strategies.get_strategy` uses the same entry points."""
    from autofusion.decide.strategies import BUILTIN_STRATEGIES

    if name in BUILTIN_STRATEGIES:
        return BUILTIN_STRATEGIES[name]()
    plugin = _find(STRATEGIES, name, BUILTIN_STRATEGIES)
    made = plugin.call()
    if not callable(getattr(made, "solve", None)):
        raise PluginError(f"{plugin.label} returned {type(made).__name__}, which has no solve(region, partition)")
    return made


def backend(name: str) -> Backend:
    """A code-generation backend from an ``autofusion.backends`` plugin."""
    plugin = _find(BACKENDS, name, ())
    made = plugin.call()
    if not isinstance(made, Backend):
        raise PluginError(f"{plugin.label} returned {type(made).__name__}, which is not a Backend "
                          "(needs a name and compile(plan))")
    return made
