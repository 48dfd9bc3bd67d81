"""Measured choice of each matrix-product core (autotuning), cached per machine.

For each distinct core of a plan that has a choice (a constant weight the packed kernel can take,
large enough to matter), the tuner compiles the core alone as a one-op model, once per candidate
(``candidates``: the packed kernel with K in passes of a quarter, half, once and twice the default ``kc``,
from the L2 cache; where the instruction set has a wide micro-kernel, a product's weight on each of
the two; for a convolution over one plane its taps read in place and the im2col form; and
OpenBLAS's sgemm on the unpacked weight). It times them round-robin on this machine with the plan's
thread count (each sample a run repeated for SAMPLE_SECONDS; a candidate's time is its fastest
sample, as interference only adds time), and keeps the fastest; the default stays unless another
candidate is at least MARGIN faster, in the sweep over all candidates and again in rounds of the
two alone right after (the machines are noisy: a coin flip should not change the code, nor a slow
minute that happened to fall on the default's samples).

Results live in one JSON file per machine under the compile cache (``tuning/<fingerprint>.json``),
keyed by core and thread count; the fingerprint covers the CPU model and flags, the compiler and
its flags (``Toolchain.key``), the OpenBLAS version and the core its kernels run for
(``$OPENBLAS_CORETYPE`` changes it) and the cores' C source, so a model is tuned once per machine (and
again after the kernels change). A file that does not parse,
fails its checksum, names another machine or holds an invalid entry is ignored with a warning and
rewritten, never trusted. Writes go to a temporary file moved into place: concurrent tuners lose
at most each other's new entries, never see half a file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np

from autofusion.codegen.cores import (
    KC_MAX,
    KC_MIN,
    WIDE_BY_DEFAULT,
    WIDE_KERNELS,
    WIDE_MIN_ROWS,
    WINOGRAD_MIN_CHANNELS,
    WINOGRAD_MIN_POSITIONS,
    CoreChoice,
    CoreChooser,
    CoreSpec,
    DefaultChooser,
    FixedChooser,
    Machine,
    cpu_model,
    k_pass,
    this_machine,
    winograd_pays,
)
from autofusion.codegen.templates import default_templates
from autofusion.decide import one_kernel_plan
from autofusion.decide.plan import Plan
from autofusion.graph.graph import Graph
from autofusion.ir import GraphBuilder
from autofusion.runtime.cache import CompileCache
from autofusion.runtime.entry_file import EntryFile
from autofusion.runtime.toolchain import Toolchain, blas_config

FORMAT = 1
CORE_TEMPLATES = ("af_sgemm.c.j2", "gemm_epilogue.c.j2", "conv_epilogue.c.j2")  # what a tuned core runs
TUNE_MIN_FLOPS = 1 << 24  # smaller products take microseconds: the default is as good as any
MARGIN = 0.03  # a candidate replaces the default only when at least 3 % faster
ROUNDS = 7  # timed samples per candidate, taken round-robin
SAMPLE_SECONDS = 2e-3  # each sample repeats the core until it lasts about this long
NEARBY_ROWS = 2.0  # a product tuned at rows within this factor lends its choice where asked (Tuner.nearby_rows)

# (done, total, what): called before each core is tuned and once at the end
Progress = Callable[[int, int, str], None]


class Runnable(Protocol):
    def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...


# compiles a plan with the given chooser (the runtime's CompiledModel, handed in: no import cycle)
Build = Callable[[Plan, CoreChooser], Runnable]


class TuningCacheWarning(UserWarning):
    """A tuning cache file was damaged or foreign and has been ignored."""


def candidates(spec: CoreSpec, machine: Machine) -> list[CoreChoice]:
    """The default first; for a convolution that can read its taps in place, the im2col form
    too (and a 3x3 one's Winograd transform); for a product the wide micro-kernel can take, the
    other micro-kernel; then the other K
    blockings that differ for this K; then OpenBLAS."""
    base = machine.kc_for(spec)
    impl = "repack" if not spec.packable else "taps" if spec.taps else "packed"
    out = [CoreChoice(impl, base)] + ([CoreChoice("packed", base)] if spec.taps and spec.packable else [])
    default = DefaultChooser(machine).choose(spec)
    if machine.takes_wide(spec):
        wide = CoreChoice("packed", machine.kc_for(spec, wide=True), wide=True)
        out = [wide, *out] if default == wide else [*out, wide]
    if winograd_pays(spec):
        winograd = CoreChoice("winograd", base)
        out = [winograd, *out] if default == winograd else [*out, winograd]
    seen = {k_pass(spec.k, base)}
    # a quarter: with AVX2, taps read in place are 64 bytes a step, as much as the slice of W, and only
    # 128 rows keep both in L1 (Zen 3, 512 KiB L2: the default 512)
    for kc in (base // 4, base // 2, base * 2):
        kc = max(KC_MIN, min(KC_MAX, kc))
        if k_pass(spec.k, kc) not in seen:  # a blocking that passes over K as another does is timed once
            seen.add(k_pass(spec.k, kc))
            out.append(CoreChoice(impl, kc))
    out.append(CoreChoice("blas"))
    return out


def tunable(spec: CoreSpec) -> bool:
    """Large enough to matter, with a choice, and a shape ``core_graph`` rebuilds as it runs (a GEMM
    whose batch is not folded into its rows would be timed as one taller product; a weight given at
    run time, a convolution's or a training graph's, is timed as an input, packed per call or left
    to OpenBLAS)."""
    choice = spec.packable or spec.repackable
    return choice and spec.flops >= TUNE_MIN_FLOPS and (spec.kind == "conv" or spec.calls == 1)


class TuningStore:
    """The tuning results of one machine (toolchain fingerprint), loaded from and saved to disk."""

    def __init__(self, cache: CompileCache, toolchain: Toolchain, machine: Machine) -> None:
        # OpenBLAS is a candidate: another version, or its kernels for another core, times otherwise
        blas = blas_config()
        self.fingerprint = hashlib.sha256(
            f"{FORMAT}|{toolchain.key}|{machine}|{blas}|{_kernels_digest()}".encode()).hexdigest()
        self.path = cache.root / "tuning" / f"{self.fingerprint[:24]}.json"
        self.file = EntryFile(self.path, self.fingerprint, FORMAT, _valid_entry)
        self.machine = machine
        self.entries: dict[str, dict[str, Any]] = {}
        self.problem = ""  # why the file on disk was ignored, if it was
        self._lock = threading.Lock()
        self._load()

    @staticmethod
    def entry_key(spec: CoreSpec, threads: int) -> str:
        return f"{spec.key()}|t{threads}"

    def get(self, spec: CoreSpec, threads: int) -> CoreChoice | None:
        entry = self.entries.get(self.entry_key(spec, threads))
        # a stored choice the core cannot take (a file written by other code) is not forced on it
        if entry is None:
            return None
        return CoreChoice(entry["impl"], entry["kc"], bool(entry.get("wide", False))).fitting(spec, self.machine)

    def nearby(self, spec: CoreSpec, threads: int) -> CoreChoice | None:
        """The choice stored for the same matrix product at the nearest row count within
        NEARBY_ROWS times ``spec``'s, or None (a convolution's rows come with its geometry: none)."""
        if spec.kind != "gemm":
            return None
        best: tuple[float, str] | None = None
        for key in self.entries:
            dims = key.split(":")[1].split("x") if key.count(":") >= 3 else []
            if len(dims) != 4 or not dims[1].isdigit() or int(dims[1]) < 1:
                continue
            rows = int(dims[1])
            ratio = max(rows, spec.m) / min(rows, spec.m)
            if (ratio <= NEARBY_ROWS and (best is None or ratio < best[0])
                    and key == self.entry_key(dataclasses.replace(spec, m=rows), threads)):
                best = (ratio, key)
        if best is None:
            return None
        entry = self.entries[best[1]]
        return CoreChoice(entry["impl"], entry["kc"], bool(entry.get("wide", False))).fitting(spec, self.machine)

    def seconds(self, spec: CoreSpec, threads: int) -> float | None:
        """The fastest time measured for the core alone on ``threads`` (its chosen candidate's), or None."""
        entry = self.entries.get(self.entry_key(spec, threads))
        times = [float(v) for v in (entry or {}).get("times_ms", {}).values() if float(v) > 0]
        return min(times) / 1e3 if times else None

    def put(self, spec: CoreSpec, threads: int, choice: CoreChoice, times_ms: Mapping[str, float]) -> None:
        with self._lock:
            self._put(spec, threads, choice, times_ms)

    def _put(self, spec: CoreSpec, threads: int, choice: CoreChoice, times_ms: Mapping[str, float]) -> None:
        self.entries = {**self.entries}
        self.entries[self.entry_key(spec, threads)] = {
            "impl": choice.impl, "kc": choice.kc, "wide": choice.wide, "core": spec.describe(),
            "times_ms": {k: round(v, 4) for k, v in times_ms.items()}}

    def _load(self) -> None:
        entries, why = self.file.read()
        if why:
            self.problem = f"tuning cache {self.path} {why}: ignored, cores are tuned again"
            warnings.warn(self.problem, TuningCacheWarning, stacklevel=3)
        self.entries = entries

    def save(self) -> None:
        """Write the entries, merged with what another process saved since this one loaded."""
        with self._lock:
            about = {"cpu": cpu_model(), "isa": self.machine.isa, "l2": self.machine.l2}
            self.entries, failed = self.file.save(self.entries, about)  # a bad file was reported at load
        if failed:
            warnings.warn(f"tuning cache {self.path} not written: {failed}", TuningCacheWarning, stacklevel=2)


@functools.lru_cache(maxsize=1)
def _kernels_digest() -> str:
    """The cores' C source (the kernel and the templates around it) and the candidates' rule: results
    measured on other code are not reused."""
    root = default_templates().directory
    text = "".join((root / name).read_text() for name in CORE_TEMPLATES) + f"|{KC_MIN},{KC_MAX}|{MARGIN}|{WIDE_KERNELS},{sorted(WIDE_BY_DEFAULT)},{WIDE_MIN_ROWS},{WINOGRAD_MIN_CHANNELS},{WINOGRAD_MIN_POSITIONS}"
    return hashlib.sha256(text.encode()).hexdigest()


def _valid_entry(key: str, entry: Any) -> None:
    CoreChoice(entry["impl"], entry["kc"], bool(entry.get("wide", False)))  # raises on an invalid choice


class Tuner:
    """A CoreChooser that answers from the store and measures the cores it has not seen.

    ``build`` compiles a candidate (a one-op plan and a FixedChooser) into something to ``run``; a
    core's candidates are built on several threads at once.

    >>> # CompiledModel(plan, tune=True) makes one; CompiledModel(plan, cores=tuner) shares it
    """

    def __init__(self, toolchain: Toolchain, cache: CompileCache, threads: int, build: Build,
                 machine: Machine | None = None, progress: Progress | None = None,
                 clock: Callable[[], float] = time.perf_counter, nearby_rows: bool = False) -> None:
        self.build = build
        # a product not tuned at its rows takes the choice of the same product tuned at the nearest
        # rows (TuningStore.nearby) instead of being measured: one more size of a graph PyTorch traced
        # with symbolic sizes, where measuring each size's products was half its compile
        self.nearby_rows = nearby_rows
        self.clock = clock  # seconds, for the samples
        self.threads = threads
        self.machine = machine or this_machine(toolchain.isa)
        self.store = TuningStore(cache, toolchain, self.machine)
        self.default = DefaultChooser(self.machine)
        self.progress = progress
        self.tuned = 0  # cores measured by this tuner (not answered from the store)

    def cached(self, spec: CoreSpec) -> CoreChoice | None:
        """The stored choice, the default for a core with nothing to tune, else None."""
        if not tunable(spec):
            return self.default.choose(spec)
        hit = self.store.get(spec, self.threads)
        return self.store.nearby(spec, self.threads) if hit is None and self.nearby_rows else hit

    def choose(self, core: CoreSpec) -> CoreChoice:
        hit = self.cached(core)
        if hit is None:
            self.tune([core])
            hit = self.cached(core)
            assert hit is not None
        return hit

    def tune(self, specs: Iterable[CoreSpec]) -> None:
        """Measure every core of ``specs`` not in the store yet, then save the store once."""
        todo: dict[str, CoreSpec] = {}
        for spec in specs:
            if self.cached(spec) is None:
                todo.setdefault(spec.key(), spec)
        for i, spec in enumerate(todo.values()):
            if self.progress is not None:
                self.progress(i, len(todo), spec.describe())
            choice, times = self._measure(spec)
            self.store.put(spec, self.threads, choice, times)
            self.tuned += 1
        if todo:
            if self.progress is not None:
                self.progress(len(todo), len(todo), "done")
            self.store.save()

    def _measure(self, spec: CoreSpec) -> tuple[CoreChoice, dict[str, float]]:
        plan, feeds = core_plan(spec)
        options = candidates(spec, self.machine)
        # built side by side (the C compiles overlap), all before the first is timed
        with ThreadPoolExecutor(max(1, min(len(options), os.cpu_count() or 1))) as pool:
            models = list(pool.map(lambda c: self.build(plan, FixedChooser(c, self.machine)), options))
        runs = []
        for model in models:  # warm up; a sample repeats the core until it lasts SAMPLE_SECONDS
            model.run(feeds)
            t0 = self.clock()
            model.run(feeds)
            runs.append(max(1, math.ceil(SAMPLE_SECONDS / max(self.clock() - t0, 1e-7))))
        fastest = self._fastest(models, runs, feeds)
        best = min(range(len(options)), key=lambda i: fastest[i])
        if best != 0 and fastest[best] <= (1 - MARGIN) * fastest[0]:
            # confirmed in rounds of the default and the challenger alone, or the default stays
            default, challenger = self._fastest([models[0], models[best]], [runs[0], runs[best]], feeds)
            best = best if challenger <= (1 - MARGIN) * default else 0
        else:
            best = 0
        times = {c.label(self.machine, spec): m * 1e3 for c, m in zip(options, fastest)}
        return options[best], times

    def _fastest(self, models: list[Runnable], runs: list[int], feeds: Mapping[str, np.ndarray]) -> list[float]:
        """Seconds per run of each model: its fastest of ROUNDS samples taken round-robin
        (interference on a shared machine only ever adds time)."""
        samples: list[list[float]] = [[] for _ in models]
        for _ in range(ROUNDS):
            for i, model in enumerate(models):
                t0 = self.clock()
                for _ in range(runs[i]):
                    model.run(feeds)
                samples[i].append((self.clock() - t0) / runs[i])
        return [min(s) for s in samples]


def core_plan(spec: CoreSpec) -> tuple[Plan, dict[str, np.ndarray]]:
    """One kernel computing ``spec`` (seeded random data), as a plan, and its feeds."""
    graph, feeds = core_graph(spec)
    return one_kernel_plan(graph), feeds


def core_graph(spec: CoreSpec) -> tuple[Graph, dict[str, np.ndarray]]:
    """A graph computing ``spec`` (seeded random data: one op, with the transposes it reads its
    operands through) and its feeds."""
    rng = np.random.default_rng(0)
    b = GraphBuilder(f"core_{spec.kind}")
    if spec.kind == "conv":
        xs, ws, strides, pads, dilations, (group,) = spec.geometry
        x = b.input("x", xs)
        weight = (rng.standard_normal(ws) * 0.05).astype(np.float32)
        w = b.const(weight) if spec.packable else b.input("w", ws)
        y = b.op("Conv", x, w, strides=strides, pads=pads, dilations=dilations, group=group,
                 kernel_shape=tuple(ws[2:]))
        if not spec.packable:
            return b.build([y]), {"x": rng.standard_normal(xs).astype(np.float32), "w": weight}
        shape = xs
    elif not spec.packable:  # B given at run time: a training graph's weight, attention's K^T or V
        lead = (spec.calls,) if spec.calls > 1 else ()  # a batch of products (attention)
        swap = [*range(len(lead)), len(lead) + 1, len(lead)]
        a_shape = (*lead, *((spec.k, spec.m) if spec.a_transposed else (spec.m, spec.k)))
        b_shape = (*lead, *((spec.n, spec.k) if spec.b_transposed else (spec.k, spec.n)))
        x, w = b.input("x", a_shape), b.input("w", b_shape)
        a = b.op("Transpose", x, perm=swap) if spec.a_transposed else x
        bb = b.op("Transpose", w, perm=swap) if spec.b_transposed else w
        return b.build([b.op("MatMul", a, bb)]), {"x": rng.standard_normal(a_shape).astype(np.float32),
                                                   "w": rng.standard_normal(b_shape).astype(np.float32)}
    else:
        rows = spec.m * spec.calls
        shape = (spec.k, rows) if spec.a_transposed else (rows, spec.k)
        x = b.input("x", shape)
        a = b.op("Transpose", x, perm=[1, 0]) if spec.a_transposed else x
        y = b.op("MatMul", a, b.const((rng.standard_normal((spec.k, spec.n)) * 0.05).astype(np.float32)))
    return b.build([y]), {"x": rng.standard_normal(shape).astype(np.float32)}


def tune_by_default() -> bool:
    """Tuning is on unless ``$AUTOFUSION_TUNE`` is 0, false, no or off."""
    return os.environ.get("AUTOFUSION_TUNE", "1").strip().lower() not in ("0", "false", "no", "off")


class _Pending:
    """Answers from the tuner's store (or the default) and notes the cores still to be measured."""

    def __init__(self, tuner: Tuner) -> None:
        self.tuner = tuner
        self.machine = tuner.machine
        self.missing: list[CoreSpec] = []

    def choose(self, core: CoreSpec) -> CoreChoice:
        hit = self.tuner.cached(core)
        if hit is None:
            self.missing.append(core)
            return self.tuner.default.choose(core)
        return hit


T = TypeVar("T")


def render_tuned(chooser: CoreChooser, render: Callable[[CoreChooser], T]) -> T:
    """``render(chooser)``; with a Tuner, every core tuned first: a first render finds the cores the
    store lacks (so that a progress bar knows how many), they are measured together, then it
    renders again. With every core in the store, the first render is the result."""
    if not isinstance(chooser, Tuner):
        return render(chooser)
    tuner = chooser
    pending = _Pending(tuner)
    first = render(pending)
    if not pending.missing:
        return first
    tuner.tune(pending.missing)
    return render(tuner)
