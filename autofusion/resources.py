"""Where the grammar, shipped rules and templates are, in an installed wheel or a source checkout."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def data_dir(kind: str) -> Path:
    """The directory of ``kind`` (``grammar``, ``rules`` or ``templates``).

    A wheel carries them as package data under ``autofusion/_data``; an editable install or a
    checkout reads them from the repository root.
    """
    packaged = resources.files("autofusion").joinpath("_data", kind)
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parent.parent / kind
    if source.is_dir():
        return source
    raise FileNotFoundError(f"autofusion data directory {kind!r} not found (broken install?)")
