"""One kernel kind: name, acceptance, params, renderers per backend, colour."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from autofusion.graph.graph import FrozenMap
from autofusion.kinds.facts import GroupFacts

ParamValue = int | float | str | bool


class KindError(ValueError):
    """An unknown kind, two kinds of one name, or a kind (a plugin's) whose code failed."""


@dataclass(frozen=True)
class Acceptance:
    """A kind's answer for one group: ``ok``, or why not (``detail``, shown by explain)."""

    ok: bool
    detail: str = ""


ACCEPT = Acceptance(True)


def refuse(detail: str) -> Acceptance:
    return Acceptance(False, detail)


@dataclass(frozen=True)
class ParamSpec:
    """A param a rule may give a kind: ``(name=value)`` after the template's name."""

    name: str
    type: type
    doc: str
    minimum: int | float | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a valid value of this param, or None."""
        wanted = self.type
        ok = isinstance(value, wanted) and not (wanted is not bool and isinstance(value, bool))
        if wanted is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            return f"{self.name} takes {wanted.__name__}, got {type(value).__name__} {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"{self.name} must be at least {self.minimum}, got {value!r}"
        return None


Renderer = Callable[..., Any]


@dataclass(frozen=True)
class KernelKind:
    """A kind of kernel. ``accepts(facts)`` says whether a group can be one kernel of this kind;
    ``renderers`` maps a backend ("c", "triton") to its renderer, a callable or the import path
    ``"module:function"`` of one; a backend missing from it cannot render the kind.

    ``cost(facts, price)``, when given, is what a group of this kind costs, for kinds whose kernel
    works unlike the generic loop nest the cost model prices: ``price(nodes)`` is the cost model's
    price of any set of nodes as one generic kernel (a CostBreakdown; two add)."""

    name: str
    summary: str
    accepts: Callable[[GroupFacts], Acceptance]
    params: tuple[ParamSpec, ...] = ()
    renderers: FrozenMap[str, Renderer | str] = field(default_factory=FrozenMap)
    colour: str = ""
    cost: Callable[[GroupFacts, Callable[[Collection[str]], Any]], Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.renderers, FrozenMap):
            object.__setattr__(self, "renderers", FrozenMap(self.renderers))

    def renderer(self, backend: str) -> Renderer | None:
        """The renderer for ``backend``, imported on first use; None when the kind has none there."""
        target = self.renderers.get(backend)
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            try:
                target = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise KindError(f"kernel kind {self.name!r}: its {backend} renderer {self.renderers[backend]!r} "
                                f"cannot be loaded: {e}") from None
        if target is not None and not callable(target):
            raise KindError(f"kernel kind {self.name!r}: its {backend} renderer is not callable")
        return target

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)

    def param_problems(self, params: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(param name, problem) for each param this kind does not take or takes another type of."""
        out = []
        for key, value in params.items():
            spec = self.param(key)
            if spec is None:
                takes = ", ".join(p.name for p in self.params) or "no params"
                out.append((key, f"kind {self.name!r} has no param {key!r} (it takes {takes})"))
            elif (why := spec.problem(value)) is not None:
                out.append((key, why))
        return out
