"""The jinja2 templates of the C backend (``templates/c``), loaded once per TemplateSet."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jinja2

from autofusion.graph.dims import is_symbolic
from autofusion.resources import data_dir


def _c_value(value: Any) -> Any:
    """What ``{{ value }}`` prints: a size expression known at run time in parentheses, so that it
    keeps its meaning beside any operator of the template (``t / (3*AF_CEIL_DIV(S_seq, 128))``)."""
    if is_symbolic(value) and not value.is_Symbol:
        return f"({value})"
    return value


def _indent_lines(lines: Iterable[str], width: int = 4) -> str:
    pad = " " * width
    return "\n".join(pad + line if line else line for line in lines)


class TemplateSet:
    """Renders the C templates; ``StrictUndefined`` so a missing variable is an error, not blank code."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or data_dir("templates") / "c"
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(self.directory)),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            finalize=_c_value,
        )
        self.env.filters["lines"] = _indent_lines

    def render(self, template: str, /, **context: Any) -> str:
        return self.env.get_template(template).render(**context)

    def runtime_header(self) -> str:
        """The text of ``af_runtime.h`` (generated sources include it; its bytes key the cache)."""
        return (self.directory / "af_runtime.h").read_text()


@functools.lru_cache(maxsize=1)
def default_templates() -> TemplateSet:
    """The shipped templates, loaded and compiled by jinja2 once per process (rendering is
    thread-safe; a fresh set per plan recompiled every template for each model)."""
    return TemplateSet()
