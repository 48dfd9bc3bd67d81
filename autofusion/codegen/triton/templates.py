"""The jinja2 templates of the Triton backend (``templates/triton``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from autofusion.resources import data_dir


class TritonTemplates:
    """Renders the Triton templates; ``StrictUndefined`` so a missing variable is an error, not blank code."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or data_dir("templates") / "triton"
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(self.directory)),
                                      undefined=jinja2.StrictUndefined, autoescape=False, trim_blocks=True,
                                      lstrip_blocks=True, keep_trailing_newline=True)

    def render(self, template: str, /, **context: Any) -> str:
        return self.env.get_template(template).render(**context)
