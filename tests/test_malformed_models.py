"""A corpus of broken ONNX files (made by scripts/make_malformed_models.py): each loads to one clear
OnnxImportError, and ``autofusion info`` / ``autofusion run`` exit with status 2 and one line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from autofusion.cli.main import main
from autofusion.frontends import OnnxImportError, load_onnx

ROOT = Path(__file__).parent.parent
CORPUS = Path(__file__).parent / "data" / "malformed"

EXPECTED = {  # file -> words the message must contain
    "empty.onnx": "not an ONNX model",
    "truncated.onnx": "truncated or corrupt",
    "garbage.onnx": "truncated or corrupt",
    "text_file.onnx": "truncated or corrupt",
    "dangling_input.onnx": "'missing'",
    "cycle.onnx": "cycle",
    "undefined_output.onnx": "'nowhere'",
    "unknown_opset.onnx": "opset 999",
    "unknown_domain.onnx": "com.evil.Frobnicate",
    "unknown_op.onnx": "Frobnicate",
    "wrong_types.onnx": "STRING",
    "wrong_matmul_shapes.onnx": "MatMul",
    "short_initializer.onnx": "initializer 'w'",
    "huge_dims.onnx": "beyond any machine's memory",
    "huge_expand.onnx": "Expand",
    "huge_constant_of_shape.onnx": "ConstantOfShape",
    "negative_dim.onnx": "x[0]",
    "no_outputs.onnx": "no graph with outputs",
}


def _script_corpus() -> dict[str, bytes]:
    spec = importlib.util.spec_from_file_location("make_malformed_models", ROOT / "scripts" / "make_malformed_models.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.corpus()  # type: ignore[no-any-return]


def test_corpus_on_disk_is_what_the_script_makes_and_every_file_is_expected() -> None:
    made = _script_corpus()
    assert sorted(made) == sorted(EXPECTED) == sorted(p.name for p in CORPUS.glob("*.onnx"))
    assert all((CORPUS / name).read_bytes() == data for name, data in made.items())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_broken_model_is_one_clear_import_error(name: str) -> None:
    with pytest.raises(OnnxImportError) as info:
        load_onnx(CORPUS / name, symbolic=False)  # an unknown size is an error only where sizes must be fixed
    message = str(info.value)
    assert EXPECTED[name] in message and "\n" not in message and "Traceback" not in message


def test_a_negative_size_is_an_unknown_one_kept_symbolic() -> None:
    graph = load_onnx(CORPUS / "negative_dim.onnx")  # as some exporters write a dynamic axis: -1
    assert [str(d) for d in graph.types["x"].shape] == ["x[0]", "4"]


@pytest.mark.parametrize("command", ["info", "run"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_exits_2_with_one_line(name: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    if (name, command) == ("negative_dim.onnx", "info"):  # a dynamic axis: info describes it as it is
        assert main([command, str(CORPUS / name)]) == 0 and "float32[x[0], 4]" in capsys.readouterr().out
        return
    assert main([command, str(CORPUS / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autofusion: error: ") and EXPECTED[name] in err


def test_cli_in_a_fresh_process_has_no_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "autofusion.cli.main", "run", str(CORPUS / "cycle.onnx")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
