"""The memory probe: the cache levels' sizes and read speeds as a stream of reads sees them."""

from __future__ import annotations

import pytest

from autofusion.calibrate.caches import ReadSample, _beyond_caches, measured_levels, probe_reads
from autofusion.calibrate.run import machine_prior
from autofusion.codegen.cores import cache_levels
from autofusion.decide.cost import HardwareProfile

KiB, MiB = 1 << 10, 1 << 20
REPORTED = (("L1", 48 * KiB), ("L2", 2 * MiB), ("L3", 480 * MiB))


def curve(points: dict[int, float]) -> list[ReadSample]:
    return [ReadSample(size, gbs * 1e9) for size, gbs in points.items()]


# read on 2 threads of a VM that reports its host's 480 MiB of L3 (measured on one: 2026-12-04)
VM = curve({64 * KiB: 422, 128 * KiB: 278, 256 * KiB: 280, 512 * KiB: 281, 1 * MiB: 273, 2 * MiB: 260,
            4 * MiB: 109, 8 * MiB: 54, 16 * MiB: 54, 32 * MiB: 54, 64 * MiB: 53, 128 * MiB: 30,
            256 * MiB: 25, 512 * MiB: 22, 1024 * MiB: 27})


def test_the_last_level_shrinks_to_what_reads_at_cache_speed() -> None:
    levels, dram = measured_levels(REPORTED, VM, threads=2)
    assert [(c.level, c.bytes) for c in levels] == [("L1", 48 * KiB), ("L2", 2 * MiB), ("L3", 64 * MiB)]
    assert dram == pytest.approx(27e9)
    # each level's speed: the fastest buffer it holds (private levels: one share per thread)
    assert [round(c.bandwidth / 1e9) for c in levels] == [422, 281, 54]


def test_a_last_level_read_fast_to_its_reported_size_keeps_it() -> None:
    honest = curve({64 * KiB: 400, 256 * KiB: 200, 1 * MiB: 190, 4 * MiB: 80, 8 * MiB: 80, 16 * MiB: 78,
                    32 * MiB: 75, 64 * MiB: 30, 128 * MiB: 21, 256 * MiB: 20})
    levels, dram = measured_levels((("L1", 32 * KiB), ("L2", 512 * KiB), ("L3", 32 * MiB)), honest, threads=2)
    assert levels[-1].bytes == 32 * MiB
    assert round(levels[-1].bandwidth / 1e9) == 80
    assert dram == pytest.approx(20e9)


def test_without_a_drop_the_reported_size_stays() -> None:
    # the probe stopped at its largest buffer still in L3: nothing says where DRAM starts
    flat = curve({64 * KiB: 400, 1 * MiB: 200, 8 * MiB: 60, 64 * MiB: 58, 256 * MiB: 55})
    levels, _ = measured_levels(REPORTED, flat, threads=2)
    assert levels[-1].bytes == 480 * MiB


def test_private_levels_keep_their_reported_sizes() -> None:
    levels, _ = measured_levels(REPORTED[:2], VM, threads=2)
    assert [c.bytes for c in levels] == [48 * KiB, 2 * MiB]


def test_too_few_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        measured_levels(REPORTED, VM[:1], threads=2)


def test_the_probe_stops_once_two_sizes_read_alike_after_a_drop() -> None:
    assert not _beyond_caches(VM[:13], 480 * MiB)  # through 256 MiB: 30 then 25 GB/s, not yet alike
    assert not _beyond_caches(VM, 480 * MiB)  # 22 then 27: the probe's largest buffer ends it
    assert _beyond_caches(curve({1 * MiB: 200, 64 * MiB: 60, 128 * MiB: 25, 256 * MiB: 24}), 480 * MiB)
    # 4 times the reported last level read: beyond it whatever the speeds
    assert _beyond_caches(curve({1 * MiB: 200, 64 * MiB: 60, 128 * MiB: 60}), 32 * MiB)
    assert not _beyond_caches(curve({1 * MiB: 200, 64 * MiB: 60}), 32 * MiB)


def test_the_probe_reads_on_this_machine() -> None:
    samples = probe_reads(threads=2, largest=4 * MiB)
    assert [s.bytes for s in samples] == [64 * KiB << i for i in range(len(samples))]
    assert samples[-1].bytes <= 4 * MiB and len(samples) >= 3
    # every size timed, the fastest at more than 100 MB/s (a machine busy with other processes
    # slows the small sizes most: each call waits for both threads)
    assert all(s.bandwidth > 0 for s in samples) and max(s.bandwidth for s in samples) > 1e8


def test_the_calibration_prior_takes_the_probe() -> None:
    prior = HardwareProfile.load("cpu-2core")
    reported = machine_prior(prior)
    assert [(c.level, c.bytes) for c in reported.caches] == list(cache_levels())
    probed = machine_prior(prior, VM, threads=2)
    levels, dram = measured_levels(cache_levels(), VM, 2)
    assert probed.caches == levels and probed.dram_bandwidth == dram


def test_a_probe_slowed_by_other_work_is_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.calibrate import run

    busy = curve({64 * KiB: 0.013, 256 * KiB: 0.034, 1 * MiB: 0.13, 4 * MiB: 0.54})
    assert run.contended(busy) and not run.contended(VM)
    calls: list[int] = []

    def probe(threads: int, last_level: int) -> list[ReadSample]:
        calls.append(threads)
        return busy

    monkeypatch.setattr(run, "probe_reads", probe)
    with pytest.warns(RuntimeWarning, match="slowed by other work"):
        assert run._probe(run.CalibrationOptions(), 2, lambda what: None) == ()
    assert calls == [2, 2]  # tried twice
    monkeypatch.setattr(run, "probe_reads", lambda threads, last_level: VM)
    assert run._probe(run.CalibrationOptions(), 2, lambda what: None) == VM
