"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        namespace: dict[str, object] = {}
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - our own documentation
        assert namespace["plan"].kernels == 1  # type: ignore[attr-defined]
        assert float(namespace["out"][namespace["y"]].min()) == 17.0  # type: ignore[index]
