"""Every rule in docs/rules-tutorial.md is checked: ``fuse`` blocks must pass, ``fuse expect=CODE`` fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autofusion.dsl import check_paths

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "rules-tutorial.md"
_BLOCK = re.compile(r"^```fuse([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    return [(info.strip(), body) for info, body in _BLOCK.findall(TUTORIAL.read_text(encoding="utf-8"))]


def test_tutorial_has_rules_of_every_kind() -> None:
    text = "\n".join(body for _, body in _blocks())
    for construct in ("import ", "class ", "pattern ", "rewrite ", "<=>", "fuse ", "nofuse ", " -> ", "branch ",
                      "loop (", "into producer", "into consumer", "where ", "priority ", "##", "...", " as ",
                      "[t]", "template \"", "(tile_m="):
        assert construct in text, construct


def test_tutorial_rules_pass_check_with_verification(tmp_path: Path) -> None:
    good = [body for info, body in _blocks() if not info]
    path = tmp_path / "tutorial.fuse"
    path.write_text("\n".join(good), encoding="utf-8")
    diags = check_paths([path])
    assert [(d.code, str(d.span), d.message) for d in diags] == []


@pytest.mark.parametrize("index", range(len([b for b in _blocks() if b[0]])))
def test_tutorial_mistakes_are_reported(index: int, tmp_path: Path) -> None:
    info, body = [b for b in _blocks() if b[0]][index]
    expected = info.split("expect=")[1].split()[0]
    path = tmp_path / "example.fuse"
    path.write_text(body, encoding="utf-8")
    codes = [d.code for d in check_paths([path])]
    assert expected in codes
