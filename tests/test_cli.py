"""The ``autofusion`` command line, run in-process: info, run, errors, JSON and table output."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autofusion import __version__
from autofusion.cli.common import Output, run_guarded
from autofusion.cli.main import SUBCOMMANDS, main
from autofusion.models import build, parameter_count

DATA = Path(__file__).parent / "data" / "models"
BERT_ONNX = str(DATA / "bert_tiny_script.onnx")
BERT_NPZ = str(DATA / "bert_tiny_script.npz")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.strip() == f"autofusion {__version__}"
    code, _, err = cli(capsys)
    assert code == 2 and "info" in err and "run" in err


def test_every_subcommand_module_has_add_parser_and_run() -> None:
    for name in SUBCOMMANDS:
        module = importlib.import_module(name)
        assert callable(module.add_parser) and callable(module.run)


def test_info_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "info", "bert-tiny")
    assert code == 0 and err == ""
    assert "last_hidden_state" in out and "int64[1, 16]" in out and "LayerNormalization" in out
    assert f"{parameter_count(build('bert-tiny')):,}" in out
    assert "\x1b[" not in out  # no terminal codes when stdout is not a terminal


def test_info_json_matches_the_graph(capsys: pytest.CaptureFixture[str]) -> None:
    report = cli_json(capsys, "info", "gpt2-tiny", "--seq", "8", "--batch", "2")
    graph = build("gpt2-tiny", seq=8, batch=2)
    assert report["nodes"] == len(graph.nodes) and report["builtin"] is True
    assert report["ops"]["Gemm"] == 8 and sum(report["ops"].values()) == len(graph.nodes)
    assert sum(report["op_classes"].values()) == len(graph.nodes) and report["op_classes"]["opaque"] == 12
    assert report["parameters"] == {"count": parameter_count(graph), "bytes": 4 * parameter_count(graph)}
    assert report["inputs"] == [{"name": "input_ids", "shape": [2, 8], "dtype": "int64"},
                                {"name": "attention_mask", "shape": [2, 8], "dtype": "int64"}]
    assert report["outputs"] == [{"name": "last_hidden_state", "shape": [2, 8, 64], "dtype": "float32"}]
    assert report["activation_bytes"] > 2 * 8 * 64 * 4 * 20


def test_info_of_an_onnx_file(capsys: pytest.CaptureFixture[str]) -> None:
    report = cli_json(capsys, "info", BERT_ONNX)
    assert report["builtin"] is False and report["ops"]["MatMul"] == 16 and report["ops"]["Softmax"] == 2
    assert [i["name"] for i in report["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]


def test_info_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "info", "--list")
    assert code == 0 and "bert-base" in out and "lstm-tiny" in out
    listed = cli_json(capsys, "info", "--list")["models"]
    assert {m["name"] for m in listed} >= {"bert-base", "gpt2", "resnet18", "lstm", "bert-tiny"}


def test_run_summarises_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "run", "resnet-tiny")
    assert code == 0 and err == ""
    assert "logits" in out and "1x10" in out and "wall time" in out and "random (seed 0)" in out
    report = cli_json(capsys, "run", "lstm-tiny", "--batch", "3")
    (y,) = report["outputs"]
    assert y["name"] == "y" and y["shape"] == [3, 8] and y["dtype"] == "float32" and y["nonfinite"] == 0
    assert y["min"] <= y["mean"] <= y["max"] and y["std"] > 0 and len(y["head"]) == 5
    assert report["backend"] == "reference" and report["wall_s"] > 0


def test_run_is_seeded(capsys: pytest.CaptureFixture[str]) -> None:
    first = cli_json(capsys, "run", "gpt2-tiny", "--seed", "3")["outputs"][0]
    again = cli_json(capsys, "run", "gpt2-tiny", "--seed", "3")["outputs"][0]
    other = cli_json(capsys, "run", "gpt2-tiny", "--seed", "4")["outputs"][0]
    assert first == again and first["head"] != other["head"]


def test_run_onnx_with_inputs_and_save_matches_onnxruntime(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    saved = tmp_path / "out.npz"
    code, out, err = cli(capsys, "run", BERT_ONNX, "--inputs", BERT_NPZ, "--save", str(saved))
    assert code == 0 and err == "" and str(saved) in out
    expected, got = np.load(BERT_NPZ), np.load(saved)
    assert sorted(got.files) == sorted(expected.files)
    for key in expected.files:
        if key.startswith("output:"):
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(got[key], expected[key])


def test_run_binds_a_dynamic_onnx_model_from_its_inputs_file(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """A model exported with dynamic axes runs at whatever sizes the inputs file holds (no --dim),
    on the SuperKernel too; a --dim that contradicts the file, and inputs whose symbols disagree,
    are errors that name the dimension."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    bias = helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", 1, 3])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["s"]),
                               helper.make_node("Relu", ["s"], ["y"])], "dyn", [x, bias],
                              [helper.make_empty_tensor_value_info("y")], initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "dyn.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(3)
    for batch, seq in ((2, 5), (1, 9)):
        feeds = {"input:x": rng.standard_normal((batch, seq, 4)).astype(np.float32),
                 "input:bias": rng.standard_normal((batch, 1, 3)).astype(np.float32)}
        inputs, saved = tmp_path / f"in{seq}.npz", tmp_path / f"out{seq}.npz"
        np.savez(inputs, **feeds)
        code, _, err = cli(capsys, "run", str(path), "--backend", "c", "--inputs", str(inputs), "--save", str(saved))
        assert code == 0, err
        want = np.maximum(feeds["input:x"] @ w + feeds["input:bias"], 0)
        np.testing.assert_allclose(np.load(saved)["output:y"], want, rtol=1e-5, atol=1e-6)
    code, _, err = cli(capsys, "run", str(path), "--inputs", str(inputs), "--dim", "seq=4")
    assert code == 2 and "dimension 'seq' is bound to 4, but input 'x' (axis 1) has 9" in err
    np.savez(inputs, **{**feeds, "input:bias": np.zeros((3, 1, 3), np.float32)})
    code, _, err = cli(capsys, "run", str(path), "--inputs", str(inputs))
    assert code == 2 and "'batch' is 1 in input 'x' (axis 0) but 3 in input 'bias'" in err and "Traceback" not in err


def test_fuse_and_explain_plan_a_dynamic_model_for_every_size(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """No --dim: one plan over the symbolic sizes, priced at the bound (seq <= 64) and 128 for batch;
    the kernels of such a plan are compiled per binding, so --emit asks for the sizes."""
    model = str(Path(__file__).parent / "data" / "dynamic" / "bert_tiny_dyn_script.onnx")
    report = cli_json(capsys, "fuse", model, "--json")
    assert report["priced_at"] == {"batch": 128, "seq": 64} and report["kernels_after"] < report["kernels_before"]
    code, out, _ = cli(capsys, "fuse", model)
    assert code == 0 and "one plan for every binding; bytes at batch=128, seq=64" in out
    assert "and at batch=1, seq=1" in out
    explained = cli_json(capsys, "explain", model, "--json")
    assert explained["undecided_guards"] == {"huge_softmax": 2} and explained["reasons"]["guard-undecided"] == 2
    code, _, err = cli(capsys, "fuse", model, "--emit", str(tmp_path / "c"))
    assert code == 2 and "has symbolic sizes (batch, seq)" in err and "--dim batch=N --dim seq=N" in err
    assert cli_json(capsys, "fuse", model, "--dim", "batch=2", "--dim", "seq=8", "--json")["priced_at"] == {}
    assert cli_json(capsys, "fuse", "gpt2-tiny", "--dynamic", "--json")["priced_at"] == {"batch": 128, "seq": 64}
    for argv, message in ((("bench", "bert-tiny", "--dynamic"), "runs or measures at fixed sizes"),
                          (("fuse", model, "--dynamic"), "--dynamic is for built-in models"),
                          (("fuse", "bert-tiny", "--dynamic", "--seq", "8"), "no fixed seq or batch"),
                          (("explain", "lstm", "--dynamic"), "only the transformers and CNNs")):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and message in err, (argv, err)


def test_saved_file_feeds_a_later_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b.npz"
    assert cli(capsys, "run", "bert-tiny", "--seed", "2", "--save", str(first))[0] == 0
    assert cli(capsys, "run", "bert-tiny", "--seed", "2", "--inputs", f"{first}.npz", "--save", str(second))[0] == 0
    a, b = np.load(f"{first}.npz"), np.load(second)
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes((DATA / "bert_tiny_script.onnx").read_bytes()[:3000])
    data = np.load(BERT_NPZ)
    missing = tmp_path / "missing.npz"
    np.savez(missing, **{k: data[k] for k in data.files if k != "input:token_type_ids"})
    wrong_shape = tmp_path / "wrong_shape.npz"
    np.savez(wrong_shape, **{k: np.concatenate([data[k]] * 2) for k in data.files})
    extra = tmp_path / "extra.npz"
    np.savez(extra, **{k: data[k] for k in data.files}, **{"input:bogus": np.zeros(1)})
    not_npz = tmp_path / "not.npz"
    not_npz.write_text("hello")
    return {"truncated": truncated, "missing": missing, "wrong_shape": wrong_shape, "extra": extra,
            "not_npz": not_npz}


@pytest.mark.parametrize(("argv", "message"), [
    (("run", "{tmp}/absent.onnx"), "not found"),
    (("info", "no/such/model"), "no such file"),
    (("run", "bert-giant"), "built-in models: bert-base"),
    (("info", "{truncated}"), "truncated or corrupt"),
    (("run", BERT_ONNX, "--inputs", "{missing}"), "lacks input:token_type_ids"),
    (("run", BERT_ONNX, "--inputs", "{wrong_shape}"), "input 'input_ids' is given as [2, 16], the model declares [1, 16]: axis 0 is fixed at 1"),
    (("run", BERT_ONNX, "--inputs", "{extra}"), "input:bogus, which the model does not take"),
    (("run", BERT_ONNX, "--inputs", "{not_npz}"), "not an .npz archive"),
    (("run", BERT_ONNX, "--inputs", "{tmp}/absent.npz"), "inputs file not found"),
    (("run", BERT_ONNX, "--seq", "8"), "--dim NAME=N"),
    (("run", BERT_ONNX, "--dim", "seq"), "NAME=N"),
    (("run", "bert-tiny", "--dim", "seq=3"), "--seq and --batch"),
    (("run", "bert-tiny", "--seq", "65"), "exceeds the 64 positions"),
    (("info", "resnet-tiny", "--seq", "4"), "no sequence length"),
    (("run", "lstm-tiny", "--save", "{tmp}"), "is a directory"),
    (("info",), "needs a MODEL"),
])
def test_bad_input_exits_2_with_one_message(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            argv: tuple[str, ...], message: str) -> None:
    paths = {k: str(v) for k, v in _bad_inputs(tmp_path).items()}
    code, out, err = cli(capsys, *(a.format(tmp=tmp_path, **paths) for a in argv))
    assert code == 2 and out == ""
    assert err.startswith("autofusion: error: ") and message in err and "Traceback" not in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", [("run",), ("run", "bert-tiny", "--batch", "0"), ("run", "bert-tiny", "--backend",
                                                                                    "tpu"), ("frobnicate",)])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    code, out, err = cli(capsys, *argv)
    assert code == 2 and "usage:" in err and "Traceback" not in err


def test_internal_errors_are_reported_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("boom")

    assert run_guarded(broken, argparse.Namespace(traceback=False)) == 1
    err = capsys.readouterr().err
    assert err.startswith("autofusion: error: internal error: RuntimeError: boom") and "Traceback" not in err
    with pytest.raises(RuntimeError, match="boom"):
        run_guarded(broken, argparse.Namespace(traceback=True))


def test_tables_use_rich_on_a_terminal() -> None:
    plain, fancy = io.StringIO(), io.StringIO()
    rows = [("MatMul", 16), ("Softmax", 2)]
    Output(plain, rich=False).table("ops", ("op", "nodes"), rows)
    Output(fancy, rich=True).table("ops", ("op", "nodes"), rows)
    assert plain.getvalue().splitlines() == ["ops", "  op       nodes", "  MatMul      16", "  Softmax      2", ""]
    assert "MatMul" in fancy.getvalue() and "━" in fancy.getvalue() and "\x1b[" in fancy.getvalue()


def test_console_entry_point_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    bad = subprocess.run([sys.executable, "-m", "autofusion.cli.main", "run", str(tmp_path / "x.onnx")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("autofusion: error:") and "Traceback" not in bad.stderr
    good = subprocess.run([sys.executable, "-m", "autofusion.cli.main", "info", "lstm-tiny", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert good.returncode == 0 and json.loads(good.stdout)["ops"]["Split"] == 8


def test_run_profile_lists_the_superkernels_kernels_by_time(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "run", "bert-tiny", "--backend", "c", "--profile")
    assert code == 0 and "kernels by time" in out and "gemm_epilogue" in out
    from autofusion.decide.default_model import default_cost_model

    model = default_cost_model().name
    assert "predicted ms" in out and f"predicted by {model}:" in out  # the plan's model on the same kernels
    report = cli_json(capsys, "run", "bert-tiny", "--backend", "c", "--profile")
    kernels = report["kernels"]
    assert all(k["predicted_ms"] > 0 and k["cost_model"] == model for k in kernels if k["template"] != "view")
    assert [k["ms"] for k in kernels] == sorted((k["ms"] for k in kernels), reverse=True)
    assert len({k["kernel"] for k in kernels}) == len(kernels) > 10
    assert all(k["ms"] >= 0 for k in kernels) and sum(k["ms"] for k in kernels) > 0
    code, _, err = cli(capsys, "run", "bert-tiny", "--profile")
    assert code == 2 and "--backend c" in err


def test_run_with_the_triton_backend_matches_the_reference(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    """``run --backend triton`` runs the fused plan's Triton kernels (under the interpreter here: no
    CUDA device), says where, and saves the same outputs as the reference."""
    pytest.importorskip("torch", exc_type=ImportError)
    pytest.importorskip("triton", exc_type=ImportError)
    report = cli_json(capsys, "run", "gpt2-tiny", "--backend", "triton", "--save", str(tmp_path / "t.npz"))
    assert report["triton"]["kernels"] > 10 and report["triton"]["host"] == {}
    # no device: the interpreter's timings say nothing, so the defaults run, each kernel's named
    assert report["triton"]["tuned"].startswith("untuned") and len(report["triton"]["configurations"]) > 10
    cli_json(capsys, "run", "gpt2-tiny", "--save", str(tmp_path / "r.npz"))
    with np.load(tmp_path / "t.npz") as got, np.load(tmp_path / "r.npz") as want:
        for key in want.files:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)
    code, out, _ = cli(capsys, "run", "gpt2-tiny", "--backend", "triton", "--no-tune")
    assert code == 0 and "launch configurations untuned" in out


def test_info_describes_a_model_with_dynamic_axes_and_run_asks_for_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(Path(__file__).parent / "data" / "dynamic" / "bert_tiny_dyn_script.onnx")
    report = cli_json(capsys, "info", path, "--json")
    assert report["inputs"][0]["shape"] == ["batch", "seq"]
    assert report["activation_bytes"]["at"] == {"batch": 128, "seq": 64} and report["activation_bytes"]["bytes"] > 0
    code, _, err = cli(capsys, "run", path)
    assert code == 2 and "has dynamic axes (batch, seq)" in err and "--dim batch=N --dim seq=N" in err


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    def closed(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    assert run_guarded(closed, argparse.Namespace()) == 141
    assert capsys.readouterr().err == ""
