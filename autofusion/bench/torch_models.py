"""Small PyTorch models for training through ``torch.compile``: a transformer encoder (attention
written out, post-norm, GELU MLP) and a CNN with batch norm, each returning its MSE loss.
Shared by benchmarks/torch_training.py and the tests; torch is imported when one is built."""

from __future__ import annotations

from typing import Any


def transformer_encoder(d: int = 256, heads: int = 4, layers: int = 2, outputs: int = 8) -> Any:
    """An encoder of ``layers`` blocks of width ``d`` and a linear head; ``model(x, y)`` is the MSE
    loss of the head's output against ``y``."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = (p.view(b, t, heads, d // heads).transpose(1, 2) for p in self.qkv(x).split(d, dim=-1))
            a = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1) @ v
            x = self.norm1(x + self.proj(a.transpose(1, 2).reshape(b, t, d)))
            return self.norm2(x + self.down(F.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
            self.head = nn.Linear(d, outputs)

        def forward(self, x: Any, y: Any) -> Any:
            return ((self.head(self.blocks(x)) - y) ** 2).mean()

    return Encoder()


def small_cnn(width: int = 16, outputs: int = 4) -> Any:
    """Conv -> BatchNorm -> ReLU -> strided Conv -> ReLU -> global pool -> Linear; ``model(x, y)`` is
    the MSE loss against ``y``."""
    import torch.nn.functional as F
    from torch import nn

    class SmallCnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn = nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
            self.fc = nn.Linear(2 * width, outputs)

        def forward(self, x: Any, y: Any) -> Any:
            h = F.relu(self.conv2(F.relu(self.bn(self.conv1(x)))))
            return ((self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1)) - y) ** 2).mean()

    return SmallCnn()


def train(model: Any, data: tuple[Any, ...], backend: str | None, steps: int, lr: float = 0.05,
          optimizer: str = "sgd") -> tuple[list[float], list[float], Any]:
    """``steps`` optimizer steps on a copy of ``model`` (compiled with ``backend``, eager when None):
    each step's loss, its seconds, and the trained copy."""
    import copy
    import time

    import torch

    model = copy.deepcopy(model)
    step = torch.compile(model, backend=backend) if backend else model
    opt = (torch.optim.SGD(model.parameters(), lr=lr) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=lr))
    losses, seconds = [], []
    for _ in range(steps):
        started = time.perf_counter()
        opt.zero_grad()
        loss = step(*data)
        loss.backward()
        opt.step()
        seconds.append(time.perf_counter() - started)
        losses.append(float(loss.item()))
    return losses, seconds, model
