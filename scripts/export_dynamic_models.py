"""Export the dynamic-axes test models of tests/data/dynamic (needs torch, transformers, onnxscript).

    python scripts/export_dynamic_models.py [OUT_DIR]

transformers' BertModel and GPT2Model (2 layers, hidden 64, 2 heads, vocabulary 100, 64 positions,
eager attention, random weights from seed 0), each exported twice with batch and sequence length
as dynamic axes: by the TorchScript exporter (opset 17, ``dynamic_axes``) and by the dynamo one
(opset 18, ``dynamic_shapes``). The tests run them at several sizes against onnxruntime.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _models() -> list[tuple[str, Any, tuple[Any, ...], list[str]]]:
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)
    bert = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                vocab_size=100, max_position_embeddings=64, attn_implementation="eager")).eval()
    gpt2 = GPT2Model(GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=100, n_positions=64,
                                attn_implementation="eager")).eval()

    class Bert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    class Gpt2(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = gpt2

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    return [("bert", Bert(), (ids, mask, torch.zeros_like(ids)), ["input_ids", "attention_mask", "token_type_ids"]),
            ("gpt2", Gpt2(), (ids, mask), ["input_ids", "attention_mask"])]


def _inline_weights(path: Path) -> None:
    """The dynamo exporter writes the weights beside the model (NAME.onnx.data): keep one file."""
    import onnx

    onnx.save(onnx.load(str(path)), str(path), save_as_external_data=False)
    path.with_name(path.name + ".data").unlink(missing_ok=True)


def main(out: Path) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    for name, module, args, inputs in _models():
        script = out / f"{name}_tiny_dyn_script.onnx"
        torch.onnx.export(module, args, str(script), input_names=inputs, output_names=["last_hidden_state"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*inputs, "last_hidden_state"]})
        batch, seq = torch.export.Dim("batch", max=16), torch.export.Dim("seq", max=64)
        dynamo = out / f"{name}_tiny_dyn_dynamo.onnx"
        torch.onnx.export(module, args, str(dynamo), input_names=inputs, output_names=["last_hidden_state"],
                          opset_version=18, dynamo=True, optimize=True,
                          dynamic_shapes={n: {0: batch, 1: seq} for n in inputs})
        _inline_weights(dynamo)
        print(f"wrote {name} to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests" / "data" / "dynamic")
