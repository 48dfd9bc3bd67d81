"""``autofusion-rules``: exit codes, text and JSON output, --explain, list; the DSL never imports egglog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autofusion.cli.rules import main
from autofusion.dsl.codes import CODES

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "fuse"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_clean_files_exit_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "ok.fuse"
    path.write_text("rewrite r: Neg(Neg(x)) => x\n")
    code, out, _ = _run(capsys, "check", str(path))
    assert code == 0 and "no problems found" in out


def test_warnings_alone_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "check", "--no-verify", str(CORPUS / "warnings_only.fuse"))
    assert code == 0 and "F009" in out and "0 error(s), 5 warning(s)" in out


def test_errors_exit_1_with_position_source_and_caret(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.fuse"
    path.write_text("rewrite ok: Neg(Neg(x)) => x\nrewrite r: Add(x) => x\n")
    code, out, _ = _run(capsys, "check", str(path))
    assert code == 1
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if ":2:12: F003 " in line)
    assert lines[head + 1].endswith("| rewrite r: Add(x) => x")
    assert lines[head + 2].endswith("|            ^^^^^^")
    assert "1 error(s), 0 warning(s)" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "check", "--format", "json", "--no-verify", str(CORPUS / "syntax_errors.fuse"))
    doc = json.loads(out)
    assert code == 1 and doc["errors"] == 10 and doc["warnings"] == 0
    first = doc["diagnostics"][0]
    assert (first["code"], first["line"], first["col"], first["severity"]) == ("F001", 3, 23, "error")
    assert set(first) >= {"file", "end_line", "end_col", "message", "notes", "data"}
    assert any(f.endswith("syntax_errors.fuse") for f in doc["files"])


def test_json_output_carries_counterexamples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "check", "--format", "json", str(CORPUS / "wrong_rewrite.fuse"))
    doc = json.loads(out)
    swap = next(d for d in doc["diagnostics"] if d["line"] == 2)
    assert code == 1 and swap["code"] == "F022" and swap["data"]["max_error"] > 0
    assert set(swap["data"]["inputs"]) == {"a", "b"}


def test_a_directory_without_rule_files_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "check", str(tmp_path))
    assert code == 2 and "no .fuse files" in err


@pytest.mark.parametrize("argv", [
    ["check"],
    ["check", "does/not/exist.fuse"],
    ["check", "--format", "xml", "x.fuse"],
    ["check", "--explain", "F999"],
    ["frobnicate"],
    [],
    ["list", "nowhere/"],
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "error" in err


@pytest.mark.parametrize("code", sorted(CODES))
def test_explain_every_code(capsys: pytest.CaptureFixture[str], code: str) -> None:
    status, out, _ = _run(capsys, "check", "--explain", code.lower())
    assert status == 0
    assert out.startswith(f"{code} {CODES[code].name}") and "Why it matters:" in out and "Example:" in out


def test_list_prints_rules_with_their_doc_comments(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "list")
    assert code == 0
    assert "rewrite gelu_erf: " in out and "as the TorchScript exporter writes BERT's" in out
    assert "fuse lstm_over_time [loop]" in out and "class act = Relu" in out
    code, out, _ = _run(capsys, "list", "--format", "json", str(ROOT / "rules" / "rnn.fuse"))
    doc = json.loads(out)
    loop = next(r for r in doc["rules"] if r["name"] == "lstm_over_time")
    assert code == 0 and "time loop inside" in loop["doc"]


def test_list_ops_reads_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "list", "--ops")
    assert code == 0 and out.startswith("pointwise (") and "MatMul" in out


def test_list_of_a_broken_file_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "list", str(CORPUS / "semantic_errors.fuse"))
    assert code == 1 and "F002" in err


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_command_runs_as_a_module_with_exit_status(tmp_path: Path) -> None:
    path = tmp_path / "bad.fuse"
    path.write_text("rewrite r: Relu(x) => Add(x, y)\n")
    proc = _python("import sys; from autofusion.cli.rules import main; sys.exit(main(sys.argv[1:]))",
                   "check", str(path))
    assert proc.returncode == 1 and "F006" in proc.stdout and "Traceback" not in proc.stderr


def test_dsl_does_not_import_egglog() -> None:
    probe = (
        "import sys\n"
        "from autofusion.dsl import load_rules, check_paths\n"
        "import autofusion.cli.rules\n"
        "load_rules()\n"
        "check_paths(['rules/rnn.fuse'])\n"
        "print('egglog' in sys.modules or any(m.startswith('egglog.') for m in sys.modules))\n"
    )
    proc = _python(probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
