"""Suite-wide settings and fixtures."""

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

# Compiled models take the untuned default core for each matrix product (deterministic, no timing
# in tests); tests/test_tuning.py turns the tuner on explicitly where it is what is tested.
os.environ.setdefault("AUTOFUSION_TUNE", "0")


def _problems_from_threads(call: Callable[[Any], Mapping[str, Any]], feeds: Sequence[Any], threads: int = 8,
                           calls: int = 50, expected: Sequence[Mapping[str, Any]] | None = None,
                           same: Callable[[Any, Any], bool] | None = None) -> list[str]:
    """What went wrong when ``threads`` threads made ``calls`` calls each of ``call`` at once, every
    result compared bit for bit (or by ``same``) with ``expected``, by default a single-threaded call
    on the same feeds."""
    import numpy as np

    same = same or (lambda got, want: bool(np.array_equal(np.asarray(got), np.asarray(want))))
    expected = [dict(call(f)) for f in feeds] if expected is None else list(expected)
    start = threading.Barrier(threads)
    problems: list[str] = []

    def work(t: int) -> None:
        start.wait()  # every thread starts together, so their calls overlap
        for j in range(calls):
            i = (t * 7 + j) % len(feeds)
            try:
                got = call(feeds[i])
            except Exception as e:  # noqa: BLE001 - a failure is a finding, reported with the rest
                problems.append(f"thread {t} call {j}: {type(e).__name__}: {e}")
                continue
            wrong = [k for k, v in expected[i].items() if not same(got[k], v)]
            if wrong:
                problems.append(f"thread {t} call {j}: feeds {i} gave other numbers for {wrong}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return problems


@pytest.fixture
def problems_from_threads() -> Callable[..., list[str]]:
    """``problems_from_threads(call, feeds, threads=8, calls=50, expected=None, same=None)``: see
    :func:`_problems_from_threads`."""
    return _problems_from_threads


@pytest.fixture()
def fresh_dynamo() -> Any:
    """TorchDynamo reset around a test, with the autofusion backend registered (a source checkout
    has no installed entry point). The torch test modules use it for every test."""
    import torch._dynamo

    from autofusion.torch_backend import autofusion_backend

    if "autofusion" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(autofusion_backend, name="autofusion")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
