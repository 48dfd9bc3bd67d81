"""A JSON file of measured entries that is trusted only when it is intact and was written here.

The tuners (C cores: ``runtime.tuning``; Triton launch configurations: ``runtime.triton_tuning``)
keep their results in such files. A file is trusted only with the expected format and fingerprint
(the machine and code it was measured on), a checksum over its entries that matches, and entries the
owner's ``validate`` accepts; anything else is ignored with the reason, never half-used. Writes go
to a temporary file moved into place, merged with what another process saved since: concurrent
writers lose at most each other's new entries, never see half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Validate = Callable[[str, Any], None]  # raises ValueError, KeyError or TypeError on an invalid entry


class EntryFile:
    """One file of entries at ``path``, for ``fingerprint``, in format ``format_``."""

    def __init__(self, path: Path, fingerprint: str, format_: int, validate: Validate) -> None:
        self.path, self.fingerprint, self.format, self.validate = path, fingerprint, format_, validate

    def read(self) -> tuple[dict[str, Any], str]:
        """The file's entries, or none and why they cannot be trusted (nothing and "" when absent)."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return {}, ""
        except OSError as e:
            return {}, f"cannot be read ({e})"
        try:
            data = json.loads(text)
            entries = data["entries"]
            if data.get("format") != self.format:
                return {}, f"has format {data.get('format')!r}, not {self.format}"
            if data.get("fingerprint") != self.fingerprint:
                return {}, "was written for another machine or compiler"
            if data.get("checksum") != checksum(entries):
                return {}, "fails its checksum (edited or truncated)"
            for key, entry in entries.items():
                if not isinstance(key, str):
                    raise TypeError("key")
                self.validate(key, entry)
            return dict(entries), ""
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            return {}, f"is not a valid tuning file ({type(e).__name__}: {str(e)[:200]})"

    def save(self, entries: Mapping[str, Any], about: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """Write ``entries`` merged over the file's own (read again now), with ``about`` (what the
        machine is, for a reader) beside them: (the merged entries, "" or why the file was not written)."""
        merged = {**self.read()[0], **entries}
        data = {**about, "format": self.format, "fingerprint": self.fingerprint, "entries": merged,
                "checksum": checksum(merged)}
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.chmod(tmp, 0o644)  # a shared cache: readable by every user of it
            os.replace(tmp, self.path)
            tmp = None
        except OSError as e:  # an unwritable cache costs a re-tune next time, not the run
            return merged, str(e)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return merged, ""


def checksum(entries: Any) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()
