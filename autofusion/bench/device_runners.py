"""The runners of ``autofusion bench --device cuda``: every runtime on the GPU, outputs left there.

``triton`` is the plan's Triton SuperKernel (``TritonModel.run_device``: after its first run, which
compiles and tunes, one CUDA graph per call on a device), ``torch_eager`` and ``torch_compile`` the
graph as a torch module on the device (``bench.runners`` builds them for the setup's device),
``ort_cuda`` onnxruntime's CUDA provider where it is installed. Each call ends when the device has
finished (``torch.cuda.synchronize``); its outputs stay on the device and are copied to the host only
when the benchmark checks them, so no timed run pays for the copy. Peak memory is the device's
(``torch.cuda.max_memory_allocated`` over the first run).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

DEVICE_RUNNER_NAMES: tuple[str, ...] = ("reference", "triton", "torch_eager", "torch_compile", "ort_cuda")
DEVICE_MEMORY_METHOD = "device: peak of torch's device allocations during the first run, above those before it"


class DeviceOutputs(Mapping[str, np.ndarray]):
    """Outputs that stay on the device until one is read (then copied to the host, once)."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self._tensors = dict(tensors)
        self._host: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._host:
            self._host[name] = self._tensors[name].detach().cpu().numpy()
        return self._host[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def synchronize(device: str) -> None:
    """Wait for the device (nothing to wait for on the CPU)."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def device_feeds(graph: Any, feeds: Mapping[str, np.ndarray], device: str) -> dict[str, Any]:
    import torch

    return {n: torch.from_numpy(np.ascontiguousarray(feeds[n])).to(device) for n in graph.inputs}


def peak_device_bytes(call: Any, device: str) -> tuple[int | None, str]:
    """Run ``call`` once; the device memory torch allocated at most during it, above what it held before."""
    if not str(device).startswith("cuda"):
        call()
        return None, "device memory: not measured off a CUDA device"
    import torch

    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    call()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - before), DEVICE_MEMORY_METHOD
