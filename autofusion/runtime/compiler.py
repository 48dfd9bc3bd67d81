"""Compiling generated C: translation units in parallel, cached objects and libraries, clear errors."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autofusion.codegen.superkernel import LibrarySource
from autofusion.runtime.cache import CompileCache
from autofusion.runtime.toolchain import CompileError, Toolchain, blas_flags, detect_toolchain

ERROR_LINES = 12


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def _first_errors(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    picked = (errors or lines)[:ERROR_LINES]
    return "\n".join("    " + line for line in picked)


def _run(cmd: list[str], source: Path, what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        raise CompileError(f"C compiler {cmd[0]!r} not found while {what} {source}") from None
    except subprocess.TimeoutExpired:
        raise CompileError(f"C compiler timed out while {what} {source}") from None
    if r.returncode != 0:
        raise CompileError(f"C compiler failed ({r.returncode}) while {what} {source}\n"
                           f"{_first_errors(r.stderr or r.stdout)}\n(command: {' '.join(cmd)})")


def compile_library(source: LibrarySource, toolchain: Toolchain | None = None,
                    cache: CompileCache | str | os.PathLike[str] | None = None, jobs: int | None = None) -> Path:
    """The shared library built from ``source`` (from the cache when built before).

    ``cache`` is a CompileCache or a directory (default: ``$AUTOFUSION_CACHE`` or
    ``~/.cache/autofusion``). Raises CompileError naming the generated file and the first errors.
    """
    tc = toolchain or detect_toolchain()
    cache = cache if isinstance(cache, CompileCache) else CompileCache(cache)
    blas_c, blas_l = blas_flags() if source.uses_blas else ((), ())
    header_key = _digest(source.header)[:16]
    include = cache.root / "include" / header_key
    if not (include / "af_runtime.h").is_file() or (include / "af_runtime.h").read_text() != source.header:
        cache.write_text(f"include/{header_key}", "af_runtime.h", source.header)
    cflags = [*tc.cflags, *blas_c, f"-I{include}"]

    def build_object(unit: tuple[str, str]) -> Path:
        name, text = unit
        key = _digest(tc.key, source.header, " ".join(blas_c), text)
        hit = cache.get("obj", key, ".o")
        if hit is not None:
            return hit
        src = cache.write_text("src", f"{key[:24]}_{name}", text)
        with tempfile.TemporaryDirectory(prefix="autofusion-cc-") as tmp:
            out = Path(tmp) / "unit.o"
            _run([tc.cc, *cflags, "-c", str(src), "-o", str(out)], src, "compiling")
            return cache.put("obj", key, ".o", out)

    workers = max(1, min(len(source.units), jobs or os.cpu_count() or 1))
    if workers == 1:
        objects = [build_object(u) for u in source.units]
    else:
        with ThreadPoolExecutor(workers) as pool:
            objects = list(pool.map(build_object, source.units))
    link_key = _digest(tc.key, " ".join(blas_l), *(o.name for o in objects))
    hit = cache.get("lib", link_key, ".so")
    if hit is not None:
        return hit
    with tempfile.TemporaryDirectory(prefix="autofusion-ld-") as tmp:
        out = Path(tmp) / "lib.so"
        _run([tc.cc, "-shared", *[str(o) for o in objects], "-o", str(out), *tc.ldflags, *blas_l, "-lm"],
             objects[0], "linking")
        return cache.put("lib", link_key, ".so", out)
