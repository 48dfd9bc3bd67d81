"""Export the dynamic-axes test models of tests/data/dynamic (needs torch, transformers, onnxscript).

    python scripts/export_dynamic_models.py [OUT_DIR]

transformers' BertModel and GPT2Model (2 layers, hidden 64, 2 heads, vocabulary 100, 64 positions,
eager attention, random weights from seed 0), each exported twice with batch and sequence length
as dynamic axes: by the TorchScript exporter (opset 17, ``dynamic_axes``) and by the dynamo one
(opset 18, ``dynamic_shapes``). Beside them, the other architectures of the shared models: a small
ResNet-style CNN (batch dynamic; both exporters) and an ``nn.LSTM`` with a linear head (time steps
and batch dynamic; TorchScript exporter, the ONNX LSTM op). The tests run them at several sizes
against onnxruntime.
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


def _cnn() -> Any:
    """Three basic residual blocks (16, 32, 64 channels, the last two with stride 2) on 3x32x32."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.skip = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                        Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    for m in net.modules():  # statistics that are not the identity, so BatchNorm is really tested
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def _lstm() -> Any:
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.head = nn.LSTM(32, 48), nn.Linear(48, 10)

        def forward(self, x: Any) -> Any:
            return self.head(self.lstm(x)[0])

    torch.manual_seed(0)
    return Tagger().eval()


def _export_others(out: Path) -> None:
    import torch

    cnn, image = _cnn(), torch.randn(2, 3, 32, 32)
    torch.onnx.export(cnn, (image,), str(out / "resnet_tiny_dyn_script.onnx"), input_names=["image"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    dynamo = out / "resnet_tiny_dyn_dynamo.onnx"
    torch.onnx.export(cnn, (image,), str(dynamo), input_names=["image"], output_names=["logits"], opset_version=18,
                      dynamo=True, optimize=True, dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    _inline_weights(dynamo)
    torch.onnx.export(_lstm(), (torch.randn(8, 2, 32),), str(out / "lstm_op_dyn_script.onnx"), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False,
                      dynamic_axes={"x": {0: "seq", 1: "batch"}, "y": {0: "seq", 1: "batch"}})
    print(f"wrote the CNN and the LSTM to {out}")


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
    _export_others(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests" / "data" / "dynamic")
