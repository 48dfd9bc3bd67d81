"""The C compiler and its flags: ``cc -O3 -march=native -fopenmp -fPIC``, with fallbacks.

Flags the compiler rejects (``-march=native`` on some compilers, ``-fopenmp`` without libgomp)
are dropped after a probe compile, so generated code still builds (single-threaded) anywhere a C
compiler exists.

The instruction set the code targets (and so the GEMM micro-kernel, autofusion/codegen/cores.py)
is the CPU's own by default; ``isa=`` or ``$AUTOFUSION_ISA`` (avx512, avx2, avx, portable) builds
for another class of x86-64 CPU instead, e.g. the AVX2 kernels on an AVX-512 machine. Sources for
an instruction set this CPU lacks can be rendered, but compiling to run them here is refused
(``runnable``, checked by the runtime before it builds anything).

``sanitize=`` (default ``$AUTOFUSION_SANITIZE``) builds with AddressSanitizer and UBSan instead of
``-O3`` (autofusion/runtime/sanitize.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autofusion.codegen import cores
from autofusion.codegen.cores import cpu_flags, native_isa
from autofusion.runtime import sanitize as san


class CompileError(RuntimeError):
    """The C compiler is missing or rejected generated code; the message says which file and why."""


# -march for each instruction set when it is not the CPU's own (a class of CPUs that has it)
ISA_MARCH = {"avx512": "-march=skylake-avx512", "avx2": "-march=haswell", "avx": "-march=sandybridge",
             "portable": "-march=x86-64"}
ISA_NEEDS = {"avx512": frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
             "avx2": frozenset({"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"}),
             "avx": frozenset({"avx", "sse4_2", "popcnt", "aes", "pclmulqdq"}), "portable": frozenset()}


_PROBE = """
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
int af_probe(int n) {
    int s = 0;
#pragma omp parallel for reduction(+:s)
    for (int i = 0; i < n; ++i) s += i;
    return s + (int)sqrtf((float)n);
}
"""


@dataclass(frozen=True)
class Toolchain:
    """A resolved compiler and the flags that work with it."""

    cc: str
    version: str
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    openmp: bool
    isa: str = "portable"  # the instruction set the code is built for
    sanitize: bool = False  # built with AddressSanitizer and UBSan (runtime/sanitize.py)

    @property
    def runnable(self) -> bool:
        """Whether this CPU can run code built for ``isa``."""
        if self.isa == "portable" or (self.isa == native_isa() and "-march=native" in self.cflags):
            return True
        return ISA_NEEDS[self.isa] <= cpu_flags()

    @functools.cached_property
    def key(self) -> str:
        """Everything that changes the produced binaries (compiler, flags, CPU for -march=native)."""
        h = hashlib.sha256()
        for part in (self.cc, self.version, " ".join(self.cflags), " ".join(self.ldflags), _cpu_id()):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


def blas_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile, link) flags for OpenBLAS from the ``scipy-openblas32`` wheel."""
    import scipy_openblas32 as ob

    lib_dir = ob.get_lib_dir()
    return (f"-I{ob.get_include_dir()}",), (f"-L{lib_dir}", f"-l{ob.get_library()}", f"-Wl,-rpath,{lib_dir}")


@functools.lru_cache(maxsize=1)
def blas_config() -> str:
    """The OpenBLAS this process runs: version and the core its kernels were picked for (the CPU's,
    or ``$OPENBLAS_CORETYPE``'s); "" where the library cannot be asked."""
    import ctypes

    try:
        import scipy_openblas32 as ob

        lib_dir = Path(ob.get_lib_dir())
        lib = ctypes.CDLL(str(next(lib_dir.glob(f"lib{ob.get_library()}*.so*"))))
        get_config = lib.scipy_openblas_get_config
    except (ImportError, OSError, StopIteration, AttributeError):
        return ""
    get_config.restype = ctypes.c_char_p
    return bytes(get_config() or b"").decode(errors="replace")


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))][:2]
        return platform.machine() + "|" + "|".join(lines)
    except OSError:
        return platform.machine() + "|" + platform.processor()


def _works(cc: str, flags: list[str], workdir: Path) -> bool:
    src = workdir / "probe.c"
    src.write_text(_PROBE)
    try:
        r = subprocess.run([cc, *flags, "-shared", str(src), "-o", str(workdir / "probe.so")],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def compiler_name() -> str:
    return os.environ.get("CC", "cc")


def requested_isa(isa: str | None = None) -> str:
    """``isa``, else ``$AUTOFUSION_ISA``, else the best instruction set this CPU runs."""
    try:
        return cores.requested_isa(isa)
    except cores.UnknownIsaError as e:
        raise CompileError(str(e)) from None


def _march(isa: str) -> str:
    """-march=native for the CPU's own instruction set (tuned for it), else the class's -march (none
    off x86, where only the CPU's own exists)."""
    if isa == native_isa():
        return "-march=native"
    return ISA_MARCH[isa] if platform.machine() in ("x86_64", "AMD64", "i686", "i386") else ""


def detect_toolchain(cc: str | None = None, opt: str = "-O3", isa: str | None = None,
                     sanitize: bool | None = None) -> Toolchain:
    """The compiler ``cc`` (default ``$CC`` or ``cc``) with the best flags it accepts, building for
    ``isa`` (default: ``$AUTOFUSION_ISA`` or this CPU's); ``sanitize`` (default
    ``$AUTOFUSION_SANITIZE``) with the sanitizers' flags in place of ``opt``."""
    wanted = san.sanitize_by_default() if sanitize is None else sanitize
    return _detect_toolchain(cc or compiler_name(), opt, requested_isa(isa), wanted)


@functools.lru_cache(maxsize=16)
def _detect_toolchain(name: str, opt: str, isa: str, sanitize: bool = False) -> Toolchain:
    path = shutil.which(name)
    if path is None:
        raise CompileError(f"C compiler {name!r} not found; install gcc or clang, or set CC to a C compiler")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"C compiler {path!r} does not run: {e}") from None
    # no errno and no FP traps: lets libm calls inline and floor/compare-heavy math helpers vectorise
    base = [*(san.SANITIZE_FLAGS if sanitize else (opt,)), "-fPIC", "-fvisibility=hidden", "-fno-math-errno",
            "-fno-trapping-math", "-std=gnu11"]
    with tempfile.TemporaryDirectory(prefix="autofusion-probe-") as tmp:
        workdir = Path(tmp)
        march = [m for m in (_march(isa),) if m]
        for extra, omp in (([*march, "-fopenmp"], True), (["-fopenmp"], True),
                           ([*march, "-fopenmp-simd"], False), (["-fopenmp-simd"], False), ([], False)):
            if _works(path, base + extra, workdir):
                flags = base + extra
                # without the -march flag the compiler targets its baseline: the portable kernels
                built_for = isa if march and march[0] in flags else "portable"
                ldflags = (("-fopenmp",) if omp else ()) + (san.SANITIZE_LDFLAGS if sanitize else ())
                return Toolchain(path, version.splitlines()[0] if version else "", tuple(flags), ldflags, omp,
                                 built_for, sanitize)
    if sanitize:
        raise CompileError(f"C compiler {path!r} cannot build with {' '.join(san.SANITIZE_FLAGS)}: "
                           f"{san.refusal(path)}")
    raise CompileError(f"C compiler {path!r} cannot build a shared library with flags {' '.join(base)}")
