"""Sanitized builds: the SuperKernel compiled with AddressSanitizer and UndefinedBehaviorSanitizer.

``AUTOFUSION_SANITIZE=1`` (or ``detect_toolchain(sanitize=True)``) builds every library with
``-fsanitize=address,undefined`` at ``-O1`` (no ``-O3`` transformations that could hide or fake a
finding), and a finding aborts the process with the sanitizer's report. Such a library loads only
into a process that the sanitizer's runtime was preloaded into: :func:`sanitizer_env` gives the
environment for one (``autofusion fuzz --sanitize`` runs its cases in such a child process), and
a process without it is refused with the command line to use, never crashed.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

SANITIZE_ENV = "AUTOFUSION_SANITIZE"
SANITIZE_FLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                  "-fno-sanitize-recover=all")
SANITIZE_LDFLAGS = ("-fsanitize=address,undefined",)
# leaks: Python's own allocations are never freed at exit; halt at the first finding of either kind
ASAN_OPTIONS = "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86"
UBSAN_OPTIONS = "halt_on_error=1:print_stacktrace=1:exitcode=87"
FINDING_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer", "UndefinedBehaviorSanitizer")


class SanitizerUnavailable(RuntimeError):
    """The C compiler has no AddressSanitizer runtime, or this process was not started under it."""


def sanitize_by_default() -> bool:
    """Whether ``$AUTOFUSION_SANITIZE`` asks for sanitized builds."""
    return os.environ.get(SANITIZE_ENV, "0").strip().lower() not in ("", "0", "no", "false", "off")


@functools.lru_cache(maxsize=4)
def sanitizer_runtime(cc: str) -> Path:
    """The AddressSanitizer runtime library that ``cc`` links sanitized code against."""
    try:
        out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        raise SanitizerUnavailable(f"C compiler {cc!r} does not run: {e}") from None
    path = Path(out).resolve() if out else Path()
    if not out or not path.is_file():
        raise SanitizerUnavailable(f"C compiler {cc!r} has no AddressSanitizer runtime (libasan); install "
                                   "it (Debian: libasan8) or use a compiler that ships one")
    return path


def sanitizer_loaded() -> bool:
    """Whether the AddressSanitizer runtime is mapped into this process (it must come first)."""
    try:
        return "libasan" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def sanitizer_env(cc: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for a child that runs sanitized libraries."""
    env = dict(os.environ if base is None else base)
    preload = [str(sanitizer_runtime(cc))] + [p for p in env.get("LD_PRELOAD", "").split() if p]
    env.update({"LD_PRELOAD": " ".join(preload), "ASAN_OPTIONS": ASAN_OPTIONS, "UBSAN_OPTIONS": UBSAN_OPTIONS,
                SANITIZE_ENV: "1"})
    return env


def refusal(cc: str) -> str:
    """Why this process cannot load a sanitized library, and how to start one that can."""
    try:
        runtime = str(sanitizer_runtime(cc))
    except SanitizerUnavailable as e:
        return str(e)
    return (f"a sanitized build ({SANITIZE_ENV}=1) runs only in a process started under the sanitizer's "
            f"runtime: LD_PRELOAD={runtime} ASAN_OPTIONS={ASAN_OPTIONS} <command>, or use "
            "autofusion fuzz --sanitize, which starts one")


def findings(stderr: str) -> list[str]:
    """The sanitizer's report lines in a child's standard error (empty: nothing found)."""
    return [line.strip() for line in stderr.splitlines() if any(m in line for m in FINDING_MARKERS)]
