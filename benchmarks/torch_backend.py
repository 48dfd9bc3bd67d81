"""torch.compile(backend="autofusion") against eager and inductor on real PyTorch models, inference.

    python benchmarks/torch_backend.py [--models resnet18,bert,gpt2] [--seq 128] [--rounds 5] [--threads 2]

``llama`` is a small LlamaModel (6 layers of width 768, 12 query and 4 key/value heads).
``bert-masked``, ``gpt2-masked`` and ``llama-masked`` run a padded batch of two: ``attention_mask`` keeps the second
sequence's first half, so the model builds its attention mask from it (the cast, the indexing by
aranges, the causal test for GPT-2).

ResNet-18 is written here in torchvision's layout (BatchNorm, ReLU(inplace=True), 224 x 224 input;
torchvision itself does not install beside this torch); BertModel and GPT2Model come from
``transformers`` (the ``bench`` extra) built from their configs, random weights, no hub. Each model
runs under ``torch.inference_mode()``; the three runners are timed round-robin, medians of the rounds,
every output checked against eager. Prints one table (and ``--json`` one object).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any


def resnet18() -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    torch.manual_seed(0)
    model = ResNet18().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model, {"x": torch.randn(1, 3, 224, 224)}


def transformer(kind: str, seq: int) -> Any:
    """The model and its keyword inputs: ids of one sequence, or for ``*-masked`` a padded batch of two."""
    import torch
    import transformers

    torch.manual_seed(0)
    if kind.startswith("bert"):
        model = transformers.BertModel(transformers.BertConfig())
    elif kind.startswith("llama"):  # a small Llama: grouped-query attention, RMSNorm, rotary, SiLU
        model = transformers.LlamaModel(transformers.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
            num_key_value_heads=4, vocab_size=32000))
    else:
        model = transformers.GPT2Model(transformers.GPT2Config())
    if not kind.endswith("-masked"):
        return model.eval(), {"input_ids": torch.randint(0, 1000, (1, seq))}
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, seq // 2:] = 0
    return model.eval(), {"input_ids": torch.randint(0, 1000, (2, seq)), "attention_mask": mask}


def _first(out: Any) -> Any:
    """The tensor to compare: a model output's first tensor."""
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0] if isinstance(out, (tuple, list)) else out


def measure(model: Any, inputs: dict[str, Any], rounds: int, min_seconds: float) -> dict[str, Any]:
    import torch

    from autofusion.bench.timing import round_robin_medians

    runners: dict[str, Callable[[], Any]] = {"eager": lambda: model(**inputs)}
    for backend in ("inductor", "autofusion"):
        compiled = torch.compile(model, backend=backend)
        runners[backend] = (lambda c: (lambda: c(**inputs)))(compiled)
    with torch.inference_mode():
        want = _first(runners["eager"]())
        for name, run in runners.items():  # compile and check once
            got = _first(run())
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, msg=f"{name} differs from eager")
        return round_robin_medians(runners, rounds, min_seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,bert,gpt2")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=0.5, help="time spent per runner per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    from autofusion.bench.environment import STEADY_MMAP_THRESHOLD, fix_malloc_threshold

    # large buffers stay in the heap, as in a long-running process: no runner's time depends on
    # how far glibc's own threshold has risen (bench/environment.py, steady_allocator)
    fix_malloc_threshold(STEADY_MMAP_THRESHOLD)

    torch.set_num_threads(args.threads)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        model, inputs = resnet18() if name == "resnet18" else transformer(name, args.seq)
        times = measure(model, inputs, args.rounds, args.min_seconds)
        rows.append({"model": name if name == "resnet18" else f"{name} seq {args.seq}",
                     **{k: v * 1e3 for k, v in times.items()}})
        torch._dynamo.reset()
    if args.json:
        print(json.dumps({"threads": args.threads, "rounds": args.rounds, "mmap_threshold": STEADY_MMAP_THRESHOLD,
                          "ms": rows}, indent=2))
        return 0
    print(f"{'model':<20} {'eager ms':>9} {'inductor':>9} {'autofusion':>10} {'eager/autofusion':>17}")
    for r in rows:
        print(f"{r['model']:<20} {r['eager']:9.2f} {r['inductor']:9.2f} {r['autofusion']:10.2f} "
              f"{r['eager'] / r['autofusion']:17.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
