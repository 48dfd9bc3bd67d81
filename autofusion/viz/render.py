"""Rendering DOT to SVG with Graphviz's ``dot`` binary, when it is installed (it is optional)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Rendered:
    """The SVG text, or why there is none (``dot`` missing, failed or too slow)."""

    svg: str | None
    problem: str = ""


def find_dot() -> str | None:
    """The path of Graphviz's ``dot``, or None when it is not installed."""
    return shutil.which("dot")


def render_svg(dot_text: str, dot_binary: str | None, timeout: float = 120.0) -> Rendered:
    """``dot_text`` laid out as SVG by ``dot_binary`` (None: no renderer, no SVG)."""
    if dot_binary is None:
        return Rendered(None, "Graphviz `dot` is not installed")
    try:
        done = subprocess.run([dot_binary, "-Tsvg"], input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Rendered(None, f"`dot` took longer than {timeout:.0f} s")
    except OSError as e:
        return Rendered(None, f"cannot run `dot`: {e}")
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return Rendered(None, f"`dot` failed: {message[0] if message else f'exit status {done.returncode}'}")
    return Rendered(done.stdout.decode("utf-8", "replace"))


def inline_svg(svg: str) -> str:
    """The ``<svg>`` element of a Graphviz SVG document, ready to inline in HTML (no XML prolog
    or DOCTYPE, and a fluid width so it scales to its box)."""
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else svg
    return body.replace("<svg ", '<svg class="graph" ', 1)
