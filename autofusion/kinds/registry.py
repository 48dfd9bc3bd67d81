"""The kinds a plan may use, by name, in the order they are preferred when rules tie."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

from autofusion.kinds.builtin import BUILTIN_KINDS
from autofusion.kinds.kind import KernelKind, KindError

# extra fill colours for kinds that name none (pastel, readable with black text)
EXTRA_COLOURS = ("#e6d3c1", "#d1d9ff", "#ffd1ec", "#dff5b8", "#c4e3f3", "#f5e0c4")


class KindRegistry:
    """An immutable set of kernel kinds; :meth:`extended` makes a new one with more."""

    def __init__(self, kinds: Iterable[KernelKind]) -> None:
        self._kinds: dict[str, KernelKind] = {}
        for kind in kinds:
            if not isinstance(kind, KernelKind):
                raise KindError(f"{kind!r} is not a KernelKind")
            if kind.name in self._kinds:
                raise KindError(f"two kernel kinds are named {kind.name!r}")
            self._kinds[kind.name] = kind
        self._rank = {name: i for i, name in enumerate(self._kinds)}

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def __getitem__(self, name: str) -> KernelKind:
        kind = self._kinds.get(name)
        if kind is None:
            raise KindError(f"unknown kernel kind {name!r} (known: {', '.join(self.names())})")
        return kind

    def get(self, name: str) -> KernelKind | None:
        return self._kinds.get(name)

    def __iter__(self) -> Iterator[KernelKind]:
        return iter(self._kinds.values())

    def __len__(self) -> int:
        return len(self._kinds)

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def rank(self, name: str) -> int:
        """Position in preference order (lower first); unknown names last."""
        return self._rank.get(name, len(self._rank))

    def extended(self, kinds: Iterable[KernelKind]) -> KindRegistry:
        return KindRegistry([*self, *kinds])

    def colour(self, name: str) -> str:
        """The fill colour pictures use for kernels of kind ``name``."""
        kind = self._kinds.get(name)
        if kind is not None and kind.colour:
            return kind.colour
        return EXTRA_COLOURS[sum(name.encode()) % len(EXTRA_COLOURS)]


@functools.lru_cache(maxsize=1)
def default_kinds() -> KindRegistry:
    """The built-in kinds (plugins' kinds: ``autofusion.plugins.kinds_with_plugins``)."""
    return KindRegistry(BUILTIN_KINDS)
