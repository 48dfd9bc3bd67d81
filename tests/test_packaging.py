"""The installed wheel (not only a checkout) carries its grammar, rules and templates."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_package_data_and_finds_it_when_installed(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True)
    (wheel,) = (tmp_path / "dist").glob("autofusion-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "autofusion/_data/grammar/fuse.lark" in names
    assert {"autofusion/_data/rules/core.fuse", "autofusion/_data/rules/transformer.fuse"} <= set(names)
    assert any(n.startswith("autofusion/_data/templates/c/") and n.endswith(".j2") for n in names)
    assert "autofusion/decide/profiles/cpu-2core.json" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    code = (
        "import autofusion, autofusion.resources as r\n"
        f"assert autofusion.__file__.startswith({str(target)!r}), autofusion.__file__\n"
        "for kind in ('grammar', 'rules', 'templates'):\n"
        "    assert '_data' in str(r.data_dir(kind)), r.data_dir(kind)\n"
        "from autofusion.dsl import load_rules\n"
        "rules = load_rules()\n"
        "assert rules.fusions and rules.rewrites\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": ""},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
