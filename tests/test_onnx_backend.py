"""The onnx package's backend test data (simple, pytorch-operator, pytorch-converted), run end to end.

Every case whose ops are all supported must import, verify and reproduce its expected outputs with
the onnx backend tests' tolerances. Cases that are skipped must use an op from ``UNSUPPORTED``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from autofusion.frontends import OnnxImportError, load_onnx
from autofusion.ir import run_graph, verify
from autofusion.ops import default_registry

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SUITES = ("simple", "pytorch-operator", "pytorch-converted")

# Ops that are outside the IR on purpose, each with the reason.
UNSUPPORTED = {
    # sequences are lists of tensors of varying shapes; the IR has statically shaped tensors only
    **dict.fromkeys(["SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
                     "SequenceLength", "SplitToSequence", "ConcatFromSequence"], "sequence type"),
    "StringNormalizer": "string tensors: no numeric kernel to fuse",
    "Gradient": "training-only (ai.onnx.preview.training): autofusion fuses inference graphs",
}

RTOL, ATOL = 1e-3, 1e-7  # as onnx.backend.test uses


def _tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
    out = []
    for f in files:
        t = onnx.TensorProto()
        t.ParseFromString(f.read_bytes())
        out.append(numpy_helper.to_array(t))
    return out


def _run_case(case: Path) -> str | None:
    """None when the case passes, else what went wrong."""
    model = case / "model.onnx"
    input_names = [i.name for i in onnx.load(model).graph.input]
    for dataset in sorted(case.glob("test_data_set_*")):
        feeds = dict(zip(input_names, _tensors(dataset, "input")))
        expected = _tensors(dataset, "output")
        try:
            graph = load_onnx(model)
        except OnnxImportError as e:
            if "static shapes need it known" not in str(e):
                raise
            # a shape comes from an input's value (Expand's shape fed as input): fix the integer inputs
            fixed = {k: v for k, v in feeds.items() if v.dtype.kind == "i"}
            graph = load_onnx(model, values=fixed)
        verify(graph)
        got = run_graph(graph, {k: v for k, v in feeds.items() if k in graph.inputs})
        for name, want in zip(graph.outputs, expected):
            have = got[name]
            if have.shape != want.shape or have.dtype != want.dtype:
                return f"{name}: got {have.dtype}{list(have.shape)}, expected {want.dtype}{list(want.shape)}"
            try:
                np.testing.assert_allclose(have, want, rtol=RTOL, atol=ATOL)
            except AssertionError as e:
                return f"{name}: {str(e).strip().splitlines()[:4]}"
    return None


def test_backend_cases() -> None:
    supported = set(default_registry().names) | {"Constant"}
    ran, skipped, failed = [], [], []
    for suite in SUITES:
        for case in sorted(p for p in (DATA / suite).iterdir() if (p / "model.onnx").exists()):
            ops = {n.op_type for n in onnx.load(case / "model.onnx", load_external_data=False).graph.node}
            missing = ops - supported
            if missing:
                skipped.append(case.name)
                unjustified = missing - set(UNSUPPORTED)
                assert not unjustified, f"{case.name} skipped for ops that should be supported: {unjustified}"
                continue
            try:
                problem = _run_case(case)
            except Exception as e:  # report every failing case at once, not the first
                problem = f"{type(e).__name__}: {e}"
            if problem:
                failed.append(f"{suite}/{case.name}: {problem}")
            ran.append(case.name)
    print(f"\nonnx backend data: {len(ran)} cases ran, {len(skipped)} skipped as unsupported "
          f"({', '.join(skipped)})")
    assert not failed, "\n".join(failed)
    assert len(ran) >= 100, f"only {len(ran)} backend cases ran"


def test_unsupported_cases_fail_at_import_with_a_clear_message() -> None:
    """The skipped cases really are unsupported: import says so, naming the op."""
    case = DATA / "simple" / "test_sequence_model1" / "model.onnx"
    try:
        load_onnx(case)
    except OnnxImportError as e:
        assert "unsupported ops" in str(e) and "SequenceAt (x" in str(e)
    else:
        raise AssertionError("a sequence model imported")
