"""The on-disk compile cache, keyed by content hash.

Entries are written to a temporary file and moved into place with ``os.replace``, so processes
compiling at the same time never see half a file. Each entry has a ``.sha256`` sidecar holding the
hash of its bytes: a truncated or corrupted entry is detected and rebuilt. An unwritable cache
directory falls back to one under the system temp directory.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def default_cache_dir() -> Path:
    """``$AUTOFUSION_CACHE`` or ``~/.cache/autofusion``."""
    env = os.environ.get("AUTOFUSION_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "autofusion"


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError:
        return False


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CompileCache:
    """Content-addressed files (sources, objects, libraries) under one directory."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        wanted = Path(directory) if directory is not None else default_cache_dir()
        if _writable(wanted):
            self.root = wanted
            self.fallback = False
        else:
            uid = os.getuid() if hasattr(os, "getuid") else 0
            self.root = Path(tempfile.gettempdir()) / f"autofusion-cache-{uid}"
            self.root.mkdir(parents=True, exist_ok=True)
            self.fallback = True
        self.requested = wanted
        self.hits = 0
        self.misses = 0

    def path(self, kind: str, key: str, suffix: str) -> Path:
        return self.root / kind / f"{key}{suffix}"

    def get(self, kind: str, key: str, suffix: str) -> Path | None:
        """The entry's path if present and intact; a damaged entry is removed and None returned."""
        path = self.path(kind, key, suffix)
        sidecar = path.with_name(path.name + ".sha256")
        try:
            expected = sidecar.read_text().strip()
        except OSError:
            self.misses += 1
            return None
        try:
            intact = path.is_file() and file_digest(path) == expected
        except OSError:
            intact = False
        if not intact:
            for p in (path, sidecar):
                try:
                    p.unlink()
                except OSError:
                    pass
            self.misses += 1
            return None
        self.hits += 1
        return path

    def put(self, kind: str, key: str, suffix: str, produced: Path) -> Path:
        """Move ``produced`` into the cache atomically (with its hash sidecar); returns its path."""
        path = self.path(kind, key, suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = file_digest(produced)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(produced)}.tmp")
        _copy(produced, tmp)
        os.replace(tmp, path)
        self.write_text(kind, path.name + ".sha256", digest + "\n")
        return path

    def write_text(self, kind: str, name: str, text: str) -> Path:
        """Write a small file atomically (generated sources are kept for error messages)."""
        path = self.root / kind / name
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return path


def _copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        for chunk in iter(lambda: fi.read(1 << 20), b""):
            fo.write(chunk)
