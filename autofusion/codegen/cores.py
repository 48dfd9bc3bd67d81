"""Matrix-product cores: what each kernel multiplies, and how (which implementation, which blocking).

Every MatMul/Gemm and Conv kernel computes its products through one *core*: ``af_sgemm_packed``
(the weight packed at build time, one micro-kernel per instruction set, K in passes of ``kc`` rows;
for a 3x3 convolution possibly over Winograd-transformed tiles) or OpenBLAS's sgemm. A :class:`CoreSpec` describes one distinct core (its shape and where the weight
comes from); a :class:`CoreChooser` decides a :class:`CoreChoice` for it. Codegen asks the chooser
while it renders and records the answer in the kernel (``KernelSource.cores``), so a profile can
name the variant each kernel ran.

The default chooser decides from what the machine reports (instruction set, L2 cache): the packed
kernel wherever the weight can be packed (reading a convolution's taps in place), ``kc``
so that one pass's slice of a panel takes an eighth of L2. The runtime's tuner
(autofusion/runtime/tuning.py) times candidates instead.

>>> machine = Machine("avx2", l2=512 * 1024)
>>> DefaultChooser(machine).choose(CoreSpec("gemm", 128, 3072, 768, packable=True)).label(machine)
'packed avx2 6x16 kc512'
>>> machine = Machine("avx512", l2=2048 * 1024)
>>> DefaultChooser(machine).choose(CoreSpec("gemm", 128, 3072, 768, packable=True)).label(machine)
'packed avx512 8x48 kc1024'
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# micro-kernel shape (rows, columns) of af_sgemm_packed per instruction set: templates/c/af_sgemm.c.j2
MICRO_KERNELS = {"avx512": (12, 32), "avx2": (6, 16), "avx": (6, 16), "portable": (6, 8)}
# the wide micro-kernel (af_sgemm_packed_wide), where the instruction set has one, over panels of
# its own width, for products with constant weights. AVX-512's: 0.91-0.95x the 12 x 32 kernel's
# time on BERT's and GPT-2's products at 128 rows, level at 8; the default where the width is a
# multiple of 48 (768, 2,304, 3,072). AVX2 has none: a 4 x 24 kernel took 0.93-1.03x the 6 x 16
# kernel's time built for Haswell on a Xeon, and 1.35-1.58x on BERT's products on a Zen 3 (tuner,
# fastest of 7 rounds each), where it only cost tuning time.
WIDE_KERNELS = {"avx512": (8, 48)}
# a convolution's taps block kept within one output row (AF_TAPS_MR, AF_TAPS_ROW_MIN): up to 14 positions
# on AVX-512 where rows are at least 7 wide; otherwise, and on other instruction sets, blocks of the
# micro-kernel's rows across row ends
TAPS_ROW_KERNELS = {"avx512": (14, 32)}
TAPS_ROW_MIN = {"avx512": 7}
WIDE_BY_DEFAULT = frozenset({"avx512"})
WIDE_MIN_ROWS = 16  # at 8 rows the wide kernel was no faster (1.03x; C harness, Xeon, 2 threads)
# the untuned choice of the Winograd core: input and output channels both at least this many. 3x3,
# with Add and Relu, taps' time (Xeon, 2 threads): 64-512 channels 0.63-0.86x built for AVX-512, 0.53-0.66x
# for AVX2; 32 channels 0.90x; 16 1.65x, 3 in 1.22x (the transforms outweigh products of so few channels)
WINOGRAD_MIN_CHANNELS = 32
# ... and at least this many output positions an image: each task reads the whole transformed weight
# (16/9 the weight), which in a model comes from memory, for its tiles alone. ResNet-18's layer 4 (7 x 7,
# 16 tiles, a 16.8 MB transformed weight) took 1.40x onnxruntime's time in the model against 0.98x with
# the taps, although 0.86x the taps' time alone, where the weight stays in cache (so the tuner, which
# times a core alone, is not offered it either); layer 3 (14 x 14) 0.84x
WINOGRAD_MIN_POSITIONS = 128
ISAS = tuple(MICRO_KERNELS)
GEMM_TILE_ROWS = 128  # rows of a GEMM's tile (codegen/gemm.py), up to 1.5x that where it covers M
KC_MIN, KC_MAX, KC_STEP = 128, 1024, 64  # the tuner's and the default's range for K per pass
PANEL_COLUMNS = 32  # columns of a packed panel (PACK_NR, codegen/gemm.py); the wide kernel's are its own
# "taps": packed weights, a convolution's taps read in place; "winograd": a 3x3 convolution's
# Winograd F(2x2, 3x3) transform (16 packed products of 4/9 the multiplications, conv.py);
# "depthwise": one input channel per output channel, its taps accumulated straight from the input
# (no product to hand a GEMM); "repack": B is computed at run time (attention), packed per call into
# the same panels
IMPLS = ("packed", "taps", "winograd", "depthwise", "repack", "blas")


def k_pass(k: int, kc: int) -> int:
    """Rows of K per pass for a kernel called with ``kc`` (af_k_pass in af_sgemm.c.j2): K / kc passes
    rounded to nearest, of nearly equal length, so that 576 at kc 512 is one pass, not 512 + 64."""
    if kc < 1 or kc >= k:
        return k
    passes = (2 * k + kc) // (2 * kc)
    return -(-k // passes)


@dataclass(frozen=True)
class Machine:
    """What the cores' shape and blocking depend on: the instruction set the code is built for and
    the L2 cache size of the CPU it runs on."""

    isa: str
    l2: int = 1024 * 1024

    def __post_init__(self) -> None:
        if self.isa not in MICRO_KERNELS:
            raise ValueError(f"unknown instruction set {self.isa!r}; one of {', '.join(ISAS)}")

    @property
    def micro_kernel(self) -> tuple[int, int]:
        return MICRO_KERNELS[self.isa]

    @property
    def wide_kernel(self) -> tuple[int, int] | None:
        """(rows, columns) of the wide micro-kernel, or None where this instruction set has none."""
        return WIDE_KERNELS.get(self.isa)

    def kernel_shape(self, choice: CoreChoice, core: CoreSpec | None = None) -> tuple[int, int]:
        """(rows, columns) of the micro-kernel ``choice`` runs (on ``core``: a convolution's taps
        blocks within its output rows where they are wide enough)."""
        wide = self.wide_kernel
        if choice.taps and core is not None and self.isa in TAPS_ROW_KERNELS:
            width = core.row_width
            if width is not None and width >= TAPS_ROW_MIN[self.isa]:
                return TAPS_ROW_KERNELS[self.isa]
        return wide if choice.wide and wide else self.micro_kernel

    def takes_wide(self, core: CoreSpec) -> bool:
        """Whether ``core`` can run the wide micro-kernel here: a product with a constant weight (not
        a convolution, whose panels the packed convolution lays out itself)."""
        return self.wide_kernel is not None and core.kind == "gemm" and core.packable

    def default_kc(self, wide: bool = False) -> int:
        """K per pass: one pass's slice of a panel (32 columns, or the wide kernel's) takes an
        eighth of L2, where it stays while every row block of the call reads it. Fewer passes read
        and write C fewer times: on a 1 MiB L2 (Zen 4) 1,024 rows beat 512 and 256 for both
        micro-kernels, in a C harness."""
        cols = self.wide_kernel[1] if wide and self.wide_kernel else PANEL_COLUMNS
        kc = self.l2 // 8 // (4 * cols) // KC_STEP * KC_STEP
        return max(KC_MIN, min(KC_MAX, kc))

    def kc_for(self, core: CoreSpec, wide: bool = False) -> int:
        """K per pass for ``core``: the default, less where A is read transposed (stored K x M, a
        weight gradient's activations): a tile's first slice reads the pass's kc rows of its M floats
        in place, pages apart, and keeps them in panels the later slices read, which should take at
        most a quarter of L2. Fewer passes read fewer first slices in place: [1024 x 512]^T @ [512 x
        256] took 1.01-1.04x torch's (MKL's) time in one pass, 1.11-1.14x in four (Xeon with
        AVX-512, 2 MiB L2, 2 threads)."""
        kc = self.default_kc(wide)
        if core.a_transposed:
            rows = min(max(1, core.m), GEMM_TILE_ROWS * 3 // 2)  # a tile's (codegen/gemm.py)
            fit = self.l2 // 4 // (4 * rows) // KC_STEP * KC_STEP
            kc = max(KC_MIN, min(kc, fit))
        return kc


@dataclass(frozen=True)
class CoreSpec:
    """One distinct matrix product of a kernel: ``calls`` x [m x k] @ [k x n].

    ``packable``: B is a constant weight the packed kernel can take. ``geometry`` holds what a
    benchmark needs to rebuild the op (for a convolution: input and weight shapes, strides, pads,
    dilations, group), so that a tuner times the real kernel, tiles and threads included.
    """

    kind: str  # "gemm" or "conv"
    m: int
    n: int
    k: int
    packable: bool = False
    calls: int = 1
    geometry: tuple[tuple[int, ...], ...] = ()
    taps: bool = False  # a convolution that can read its taps in place from a padded, phase-split input
    depthwise: bool = False  # a convolution with one input and one output channel per group
    winograd: bool = False  # a dense 3x3 convolution, stride and dilation 1, that the Winograd transform takes
    repackable: bool = False  # B is computed at run time and can be packed into panels per call
    a_transposed: bool = False  # A is read column-wise (stored K x M, e.g. X^T of a weight gradient)
    b_transposed: bool = False  # B is read row-wise (stored N x K, e.g. W^T of a Linear layer)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.calls

    @property
    def row_width(self) -> int | None:
        """A convolution's output positions per row (its last spatial axis), from ``geometry``;
        None for a product or where the geometry is not given."""
        if self.kind != "conv" or len(self.geometry) < 5:
            return None
        xs, ws, strides, pads, dilations = self.geometry[:5]
        spatial = len(strides)
        if not spatial or len(xs) != spatial + 2 or len(pads) != 2 * spatial:
            return None
        reach = dilations[-1] * (ws[-1] - 1) + 1
        return (xs[-1] + pads[spatial - 1] + pads[-1] - reach) // strides[-1] + 1

    def key(self) -> str:
        """A stable text key: equal for cores that run the same code on the same sizes."""
        geo = ";".join(",".join(str(v) for v in part) for part in self.geometry)
        flags = "".join(str(int(f)) for f in (self.packable, self.taps, self.depthwise))
        layout = ("r" if self.repackable else "") + ("a" if self.a_transposed else "") + ("b" if self.b_transposed else "")
        layout += "w" if self.winograd else ""
        return f"{self.kind}:{self.calls}x{self.m}x{self.k}x{self.n}:{flags}{layout}:{geo}"

    def describe(self) -> str:
        a = f"[{self.k} x {self.m}]^T" if self.a_transposed else f"[{self.m} x {self.k}]"
        b = f"[{self.n} x {self.k}]^T" if self.b_transposed else f"[{self.k} x {self.n}]"
        shape = f"{a} @ {b}"
        return f"{self.kind} {self.calls} x {shape}" if self.calls > 1 else f"{self.kind} {shape}"


@dataclass(frozen=True)
class CoreChoice:
    """How a core is computed: ``packed`` with ``kc`` rows of K per pass, ``taps`` (packed, and a
    convolution's taps read in place from its zero-padded input instead of an im2col copy),
    ``winograd`` (packed, a 3x3 convolution as 16 products over Winograd-transformed tiles),
    ``depthwise`` (a depthwise convolution's taps summed straight from the input), ``repack`` (a B
    computed at run time packed per call, then the packed kernel), or OpenBLAS's ``blas``.
    ``wide``: ``packed`` on the wide micro-kernel (WIDE_KERNELS), over panels of its own width."""

    impl: str
    kc: int = 0
    wide: bool = False

    def __post_init__(self) -> None:
        if self.impl not in IMPLS:
            raise ValueError(f"unknown core implementation {self.impl!r}; one of {', '.join(IMPLS)}")
        if self.panels and not KC_MIN // 2 <= self.kc <= 4 * KC_MAX:
            raise ValueError(f"kc {self.kc} out of range for the packed kernel")
        if self.wide and self.impl != "packed":
            raise ValueError(f"the wide micro-kernel runs packed weights only, not {self.impl!r}")

    @property
    def packed(self) -> bool:
        """Whether the weight is packed (the runtime's GEMM kernel computes the product)."""
        return self.impl in ("packed", "taps", "winograd")

    @property
    def panels(self) -> bool:
        """Whether the product runs the packed micro-kernel (over a build-time or per-call packing)."""
        return self.packed or self.impl == "repack"

    @property
    def taps(self) -> bool:
        return self.impl == "taps"

    def label(self, machine: Machine, core: CoreSpec | None = None) -> str:
        """The variant as reports name it; with ``core``, a convolution's taps blocks as it runs them."""
        if self.impl == "depthwise":
            return "depthwise direct"
        if not self.panels:
            return "openblas sgemm"
        rows, cols = machine.kernel_shape(self, core)
        return f"{self.impl} {machine.isa} {rows}x{cols} kc{self.kc}"

    def fitting(self, core: CoreSpec, machine: Machine | None = None) -> CoreChoice:
        """This choice where ``core`` can take it (on ``machine``, for the wide micro-kernel), else
        the nearest one it can."""
        if self.wide and not (machine is not None and machine.takes_wide(core)):
            return CoreChoice(self.impl, self.kc).fitting(core)
        if self.impl == "repack":
            if core.packable:
                return CoreChoice("packed", self.kc)
            return self if core.repackable else CoreChoice("blas")
        if self.packed and not core.packable:
            return CoreChoice("blas")
        if self.taps and not core.taps:
            return CoreChoice("packed", self.kc)
        if self.impl == "winograd" and not core.winograd:
            return CoreChoice("taps", self.kc).fitting(core)
        if self.impl == "depthwise" and not core.depthwise:
            return CoreChoice("blas")
        return self


class CoreChooser(Protocol):
    """Decides the implementation of each core codegen renders; ``machine`` is what it targets."""

    machine: Machine

    def choose(self, core: CoreSpec) -> CoreChoice: ...


class DefaultChooser:
    """The untuned, deterministic choice: packed wherever the weight can be packed (taps where they
    can be read in place), a run-time B packed per call, default kc; a depthwise convolution's own
    loop."""

    def __init__(self, machine: Machine | None = None) -> None:
        self.machine = machine or this_machine()

    def choose(self, core: CoreSpec) -> CoreChoice:
        if core.depthwise:
            return CoreChoice("depthwise")
        if core.repackable:
            return CoreChoice("repack", self.machine.kc_for(core))
        if winograd_by_default(core):
            return CoreChoice("winograd", self.machine.kc_for(core))
        if self.machine.takes_wide(core) and wide_by_default(core, self.machine):
            return CoreChoice("packed", self.machine.kc_for(core, wide=True), wide=True)
        return CoreChoice("taps", self.machine.kc_for(core)).fitting(core)


def wide_by_default(core: CoreSpec, machine: Machine) -> bool:
    """The untuned choice of the wide micro-kernel, where it is measured to pay: its panels need no
    padding and the rows fill its row blocks."""
    wide = machine.wide_kernel
    return (wide is not None and machine.isa in WIDE_BY_DEFAULT and core.n % wide[1] == 0
            and core.m >= WIDE_MIN_ROWS)


def winograd_pays(core: CoreSpec) -> bool:
    """Whether a convolution the Winograd core can take has the positions to read its transformed
    weight for (the tuner offers it only then)."""
    return core.winograd and core.m >= WINOGRAD_MIN_POSITIONS


def winograd_by_default(core: CoreSpec) -> bool:
    """The untuned choice of the Winograd core: where it pays, with enough channels in (K = 9 x
    them) and out for the products to outweigh the transforms."""
    return winograd_pays(core) and core.k // 9 >= WINOGRAD_MIN_CHANNELS and core.n >= WINOGRAD_MIN_CHANNELS


class FixedChooser:
    """One choice for every core that can take it (the tuner's candidates, tests of each variant)."""

    def __init__(self, choice: CoreChoice, machine: Machine | None = None) -> None:
        self.machine = machine or this_machine()
        self.choice = choice

    def choose(self, core: CoreSpec) -> CoreChoice:
        return self.choice.fitting(core, self.machine)


def native_isa(flags: frozenset[str] | None = None) -> str:
    """The best micro-kernel this CPU can run (what ``-march=native`` lets the compiler target)."""
    if flags is None:
        flags = cpu_flags()
    if "avx512f" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "avx" if "avx" in flags else "portable"


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo); empty off Linux or x86."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _cache_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
    return int(text.rstrip("KMB") or 0) * scale


@functools.lru_cache(maxsize=1)
def cache_levels() -> tuple[tuple[str, int], ...]:
    """(level name, bytes) of CPU 0's data caches as Linux reports them, smallest first (L1 data,
    L2, L3 where there is one); (L1 32 KiB, L2 1 MiB) where it reports none."""
    sizes: dict[int, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(root.glob("index*")):
            level = int((index / "level").read_text().strip())
            kind = (index / "type").read_text().strip()
            size = _cache_size((index / "size").read_text())
            if size and kind in ("Data", "Unified"):
                sizes[level] = size
    except (OSError, ValueError):
        sizes = {}
    sizes = {1: sizes.get(1, 32 * 1024), 2: sizes.get(2, 1024 * 1024), **{k: v for k, v in sizes.items() if k > 2}}
    return tuple((f"L{k}", v) for k, v in sorted(sizes.items()))


def cache_sizes() -> tuple[int, int]:
    """(L1 data, L2) bytes of CPU 0 as Linux reports them; (32 KiB, 1 MiB) where it does not."""
    levels = dict(cache_levels())
    return levels["L1"], levels["L2"]


class UnknownIsaError(ValueError):
    """An instruction set name (``isa=`` or ``$AUTOFUSION_ISA``) that is none of ISAS."""


def requested_isa(isa: str | None = None) -> str:
    """``isa``, else ``$AUTOFUSION_ISA``, else the best instruction set this CPU runs."""
    wanted = (isa or os.environ.get("AUTOFUSION_ISA") or "").strip().lower() or native_isa()
    if wanted not in ISAS:
        raise UnknownIsaError(f"unknown instruction set {wanted!r} (AUTOFUSION_ISA or isa=); one of {', '.join(ISAS)}")
    return wanted


def this_machine(isa: str | None = None) -> Machine:
    """This CPU's L2 size, with the instruction set ``isa`` (default: ``requested_isa()``)."""
    return Machine(requested_isa(isa), cache_sizes()[1])


def cpu_model() -> str:
    """The CPU's model name, for tuning records and benchmark reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
