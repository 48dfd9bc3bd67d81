"""User text in generated C: tensor and op names become safe identifiers, comments cannot break out.

Nothing from a graph or a rule file is pasted into C unescaped. Identifiers keep the readable part
of a name (``encoder.layer.0/attn`` -> ``t_encoder_layer_0_attn``); a name that had to change gets a
short content hash so two different names never collide.
"""

from __future__ import annotations

import hashlib
import re

_C_KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline int long
register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
_Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert _Thread_local
""".split())

_MAX_IDENT = 48


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:6]


def c_ident(text: str, prefix: str = "t_") -> str:
    """A C identifier for ``text``: ``prefix`` + the alphanumeric part, hashed when anything changed.

    >>> c_ident("x")
    't_x'
    >>> c_ident('x*/ system("rm -rf /"); /*').startswith("t_x_system_rm_rf_")
    True
    """
    body = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    body = re.sub(r"_+", "_", body)
    changed = body != text or len(body) > _MAX_IDENT or not body
    body = body[:_MAX_IDENT].rstrip("_")
    ident = f"{prefix}{body}" if body else prefix.rstrip("_") or "t"
    if changed:
        ident = f"{ident}_{_short_hash(text)}"
    if ident[0].isdigit():
        ident = "_" + ident
    if ident in _C_KEYWORDS or ident.startswith("__"):
        ident = "x" + ident
    return ident


class NameTable:
    """Assigns each name one unique identifier, deterministically in the order names are asked for."""

    def __init__(self, prefix: str = "t_", reserved: frozenset[str] = frozenset()) -> None:
        self._prefix = prefix
        self._by_name: dict[str, str] = {}
        self._taken: set[str] = set(reserved)

    def __call__(self, name: str) -> str:
        ident = self._by_name.get(name)
        if ident is None:
            base = ident = c_ident(name, self._prefix)
            n = 2
            while ident in self._taken:
                ident = f"{base}_{n}"
                n += 1
            self._taken.add(ident)
            self._by_name[name] = ident
        return ident


def c_comment_text(text: str, limit: int = 160) -> str:
    """``text`` made safe inside a ``/* ... */`` comment: one line, no comment delimiters, ASCII."""
    text = "".join(ch if " " <= ch <= "~" else "?" for ch in str(text))  # no newlines, controls, non-ASCII
    text = text.replace("\\", "/")  # a backslash could splice lines in the preprocessor
    while "*/" in text or "/*" in text or "??" in text:  # delimiters and trigraphs
        text = text.replace("*/", "* /").replace("/*", "/ *").replace("??", "? ?")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def c_comment(text: str) -> str:
    """A one-line C block comment holding ``text`` safely.

    >>> c_comment("a */ b")
    '/* a * / b */'
    """
    return f"/* {c_comment_text(text)} */"
