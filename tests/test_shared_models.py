"""Every exported model in tests/data/models imports, verifies and matches onnxruntime's outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autofusion.frontends import load_onnx
from autofusion.ir import run_graph, verify

MODELS = sorted((Path(__file__).parent / "data" / "models").glob("*.onnx"))


def test_the_shared_models_are_there() -> None:
    assert len(MODELS) >= 10, "tests/data/models lost its exported models"


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_model_matches_onnxruntime(path: Path) -> None:
    graph = verify(load_onnx(path))
    data = np.load(path.with_suffix(".npz"))
    feeds = {k.removeprefix("input:"): data[k] for k in data.files if k.startswith("input:")}
    expected = {k.removeprefix("output:"): data[k] for k in data.files if k.startswith("output:")}
    assert set(graph.inputs) == set(feeds)
    assert list(graph.outputs) == [k for k in expected]
    got = run_graph(graph, feeds)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{path.stem}: {name}")


@pytest.mark.parametrize("stem", ["bert_tiny_script", "gpt2_tiny_script", "lstm_op_script"])
def test_shape_subgraphs_fold_away(stem: str) -> None:
    """Exporters compute shapes with Shape/Gather/Concat chains; import folds them to constants."""
    graph = load_onnx(MODELS[0].parent / f"{stem}.onnx")
    ops = {n.op for n in graph.nodes}
    assert not ops & {"Shape", "Constant", "Identity", "ConstantOfShape", "Unsqueeze", "Concat"}, ops
    for node in graph.nodes:
        if node.op in ("Reshape", "Expand"):
            assert graph.is_const(node.inputs[1]), f"{node.name}: shape input should be constant"
