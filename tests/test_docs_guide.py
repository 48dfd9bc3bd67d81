"""Every command and Python block of docs/guide.md runs as written."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from autofusion.cli.main import main as autofusion_main
from autofusion.cli.rules import main as rules_main

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "guide.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE, flags=re.S)


@pytest.fixture()
def workdir(tmp_path: Path):
    (tmp_path / "my_rules.fuse").write_text(_blocks("fuse")[0])
    (tmp_path / "rules").symlink_to(ROOT / "rules")
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


def test_guide_commands_succeed(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands = [line[2:] for block in _blocks("console") for line in block.splitlines() if line.startswith("$ ")]
    assert len(commands) >= 7
    for command in commands:
        argv = shlex.split(command)
        entry = {"autofusion": autofusion_main, "autofusion-rules": rules_main}[argv[0]]
        assert entry(argv[1:]) == 0, (command, capsys.readouterr())
    out = capsys.readouterr().out
    assert "matmul_bias_relu" in out  # the guide's own rule is listed and used


def test_guide_python_runs(workdir: Path) -> None:
    blocks = _blocks("python")
    assert len(blocks) == 5
    for block in blocks:
        if "import torch" in block:
            pytest.importorskip("torch", reason="the PyTorch section needs torch")
        if "TritonModel" in block:
            pytest.importorskip("triton", reason="the Triton section needs triton")
        exec(compile(block, "docs/guide.md", "exec"), {})  # noqa: S102 - our own documentation
