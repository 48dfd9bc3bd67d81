"""The C compiler and its flags: ``cc -O3 -march=native -fopenmp -fPIC``, with fallbacks.

Flags the compiler rejects (``-march=native`` on some compilers, ``-fopenmp`` without libgomp)
are dropped after a probe compile, so generated code still builds (single-threaded) anywhere a C
compiler exists.
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


class CompileError(RuntimeError):
    """The C compiler is missing or rejected generated code; the message says which file and why."""


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


@functools.lru_cache(maxsize=8)
def detect_toolchain(cc: str | None = None, opt: str = "-O3") -> Toolchain:
    """The compiler ``cc`` (default ``$CC`` or ``cc``) with the best flags it accepts."""
    name = cc or compiler_name()
    path = shutil.which(name)
    if path is None:
        raise CompileError(f"C compiler {name!r} not found; install gcc or clang, or set CC to a C compiler")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"C compiler {path!r} does not run: {e}") from None
    # no errno and no FP traps: lets libm calls inline and floor/compare-heavy math helpers vectorise
    base = [opt, "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]
    with tempfile.TemporaryDirectory(prefix="autofusion-probe-") as tmp:
        workdir = Path(tmp)
        for extra, omp in ((["-march=native", "-fopenmp"], True), (["-fopenmp"], True),
                           (["-march=native", "-fopenmp-simd"], False), (["-fopenmp-simd"], False), ([], False)):
            if _works(path, base + extra, workdir):
                flags = base + extra
                return Toolchain(path, version.splitlines()[0] if version else "", tuple(flags),
                                 ("-fopenmp",) if omp else (), omp)
    raise CompileError(f"C compiler {path!r} cannot build a shared library with flags {' '.join(base)}")
