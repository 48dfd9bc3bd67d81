"""runtime/output_pool.py: outputs that outlive the call get memory earlier calls' outputs freed,
never memory an array still alive uses."""

from __future__ import annotations

import gc
import threading

import numpy as np

from autofusion.runtime.output_pool import MAX_BLOCKS_PER_OUTPUT, OutputPool

F32 = np.dtype(np.float32)


def address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def test_a_released_output_s_memory_is_handed_out_again() -> None:
    pool = OutputPool(2)
    first = pool.arrays([(64, 32), (7,)], [F32, np.dtype(np.int64)])
    where = [address(a) for a in first]
    assert all(w % 64 == 0 for w in where) and [a.shape for a in first] == [(64, 32), (7,)]
    assert first[1].dtype == np.int64 and first[0].flags.c_contiguous
    del first
    gc.collect()
    again = pool.arrays([(64, 32), (7,)], [F32, np.dtype(np.int64)])
    assert [address(a) for a in again] == where  # (no fresh pages to fault in)


def test_memory_an_output_still_uses_is_never_handed_out() -> None:
    pool = OutputPool(1)
    kept = [pool.arrays([(16, 16)], [F32])[0] for _ in range(3)]
    view = kept[0][2:4]  # a view of the first keeps its memory in use too
    kept[0] = None  # type: ignore[call-overload]
    fresh = pool.arrays([(16, 16)], [F32])[0]
    addresses = {address(a) for a in (*kept[1:], fresh)}
    assert len(addresses) == 3 and address(view) - 2 * 16 * 4 not in addresses
    fresh[:] = 1.0
    assert not np.any(kept[1] == 1.0) and not np.any(kept[2] == 1.0)


def test_a_size_change_gets_its_own_memory() -> None:
    pool = OutputPool(1)
    small = pool.arrays([(4,)], [F32])[0]
    del small
    big = pool.arrays([(4096,)], [F32])[0]
    assert big.nbytes == 4096 * 4 and big.shape == (4096,)


def test_outputs_kept_beyond_the_cap_are_not_pooled() -> None:
    pool = OutputPool(1)
    kept = [pool.arrays([(8,)], [F32])[0] for _ in range(MAX_BLOCKS_PER_OUTPUT + 5)]
    assert len({address(a) for a in kept}) == len(kept)
    assert pool.nbytes == MAX_BLOCKS_PER_OUTPUT * 8 * 4  # the pool holds at most the cap


def test_concurrent_calls_never_share_memory() -> None:
    pool = OutputPool(1)
    barrier = threading.Barrier(8)
    got: list[np.ndarray] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        for _ in range(50):
            a = pool.arrays([(256,)], [F32])[0]
            with lock:
                got.append(a)  # all kept alive: no two may share memory

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({address(a) for a in got}) == len(got) == 400
