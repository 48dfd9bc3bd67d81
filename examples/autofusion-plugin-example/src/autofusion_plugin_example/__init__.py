"""An example autofusion plugin package (see docs/plugins.md in the autofusion repository)."""

from pathlib import Path


def rules_dir() -> Path:
    """The ``autofusion.rules`` entry point: the directory of this package's .fuse files."""
    return Path(__file__).parent / "rules"
