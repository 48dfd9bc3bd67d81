"""Readable syntax errors, classified against a table of typical mistakes (lark's ``match_examples``).

Each label is the message shown; its examples are statements that fail at the same parser state.
When no example matches, the message lists what the parser expected instead.

:class:`Classifier` matches as ``UnexpectedInput.match_examples`` does (same LALR state and
accepted tokens, an exact token match first) but parses the table once per parser instead of at
every error; lark 1.3's own method also fails on some states of the contextual lexer (its debug
message formats the parser state with ``%d``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

BAD_EXAMPLES: Mapping[str, tuple[str, ...]] = {
    "a statement starts with import, class, pattern, rewrite, fuse or nofuse": (
        "rewite r: Relu(x) => x",
        "Relu(x) => x",
        "r: Relu(x) => x",
    ),
    "expected ':' after the rule name": (
        "rewrite r Relu(x) => x",
        "fuse f Relu -> template \"pointwise\"",
        "nofuse n Softmax",
        "rewrite r = Relu(x) => x",
    ),
    "expected a rule name (a lowercase identifier) before ':'": (
        "rewrite : Relu(x) => x",
        "fuse : Relu -> template \"pointwise\"",
        "nofuse : Softmax",
        "rewrite Relu(x) => x",
    ),
    "a rewrite needs '=>' (one way) or '<=>' (both ways) between its two sides": (
        "rewrite r: Relu(x) Relu(x)",
        "rewrite r: Relu(x) = x",
        "rewrite r: Relu(x) -> Relu(x) x",
        "rewrite r: Relu(x)",
        "rewrite r: Neg(Neg(x)) == x",
    ),
    "missing the right side of the rewrite after '=>'": (
        "rewrite r: Relu(x) =>",
        "rewrite r: Relu(x) <=>",
        "rewrite r: Relu(x) => where rank(x) > 1",
    ),
    "unclosed '(' : a ')' is missing": (
        "rewrite r: Relu(Add(x, y) => x",
        "fuse f: Relu(x -> template \"pointwise\"",
        "rewrite r: Relu(x => x",
        "pattern p = Add(x, y",
    ),
    "arguments are separated by ','": (
        "rewrite r: Add(x y) => x",
        "pattern p = Add(Relu(x) y)",
    ),
    "expected a term: an op call like Relu(x), a variable, a number or [list]": (
        "rewrite r: => x",
        "pattern p =",
        "fuse f: -> template \"pointwise\"",
        "pattern p = Relu(x) -> ",
    ),
    "the template name must be a quoted string, e.g. template \"pointwise\"": (
        "fuse f: Relu -> template pointwise",
        "fuse f: Relu -> template",
    ),
    "template parameters are written (name=value, ...)": (
        "fuse f: Relu -> template \"pointwise\" (64)",
        "fuse f: Relu -> template \"pointwise\" (tile 64)",
        "fuse f: Relu -> template \"pointwise\" (tile=)",
    ),
    "the guard after 'where' is incomplete": (
        "fuse f: Relu(x) -> template \"pointwise\" where",
        "fuse f: Relu(x) -> template \"pointwise\" where rank(x) >",
        "fuse f: Relu(x) -> template \"pointwise\" where rank(x) > 1 and",
        "rewrite r: Relu(x) => x where not",
    ),
    "conditions are joined with 'and' / 'or'": (
        "fuse f: Relu(x) -> template \"pointwise\" where rank(x) > 1 rank(x) < 3",
        "fuse f: Relu(x) -> template \"pointwise\" where const(x) const(y)",
        "rewrite r: Relu(x) => x where rank(x) > 1 rank(x) < 3",
        "rewrite r: Relu(x) => x where const(x) const(y)",
        "nofuse n: Relu(x) where rank(x) > 1 rank(x) < 3",
        "pattern p = Relu(x) where rank(x) > 1 rank(x) < 3",
    ),
    "'=' assigns; compare with '=='": (
        "fuse f: Relu(x) -> template \"pointwise\" where rank(x) = 2",
        "rewrite r: Relu(x) => x where dtype(x) = \"float32\"",
        "nofuse n: Relu(x) where rank(x) = 2",
        "pattern p = Relu(x) where rank(x) = 2",
    ),
    "priority takes an integer, e.g. priority 10": (
        "fuse f: Relu -> template \"pointwise\" priority high",
        "fuse f: Relu -> template \"pointwise\" priority 1.5",
        "fuse f: Relu -> template \"pointwise\" priority",
    ),
    "a class lists op or class names separated by '|'": (
        "class act = Relu |",
        "class act = Relu, Gelu",
        "class act =",
        "class act Relu | Gelu",
    ),
    "import takes a quoted file name: import \"core.fuse\"": (
        "import core.fuse",
        "import core",
        "import",
    ),
    "a template clause comes after the pattern and before 'where' and 'priority'": (
        "fuse f: Relu(x) where rank(x) > 1 -> template \"pointwise\"",
        "fuse f: Relu priority 3 -> template \"pointwise\"",
    ),
    "a branch is written branch x { term, term, ... }": (
        "fuse f: branch { MatMul(x, w), MatMul(x, v) } -> template \"horizontal_gemm\"",
        "fuse f: branch x MatMul(x, w), MatMul(x, v) -> template \"horizontal_gemm\"",
        "fuse f: branch x { MatMul(x, w) MatMul(x, v) } -> template \"horizontal_gemm\"",
    ),
    "a loop is written loop (carried, ...) { name = term, ... }": (
        "fuse f: loop h { h = Tanh(h) } -> template \"lstm_scan\"",
        "fuse f: loop (h) { Tanh(h) } -> template \"lstm_scan\"",
        "fuse f: loop (h) h = Tanh(h) -> template \"lstm_scan\"",
        "fuse f: loop (h) { h = Tanh(h) h = Tanh(h) } -> template \"lstm_scan\"",
    ),
    "a class rule is written CLASS into producer CLASS (or into consumer CLASS)": (
        "fuse f: pointwise into opaque",
        "fuse f: pointwise into",
    ),
    "a pattern is written pattern name(params) = term": (
        "pattern p(x) Relu(x)",
        "pattern (x) = Relu(x)",
        "pattern p(x, ) = Relu(x)",
    ),
}

_FRIENDLY = {
    "NAME": "a name",
    "STRING": "a quoted string",
    "INT": "an integer",
    "FLOAT": "a number",
    "ARROW": "'->'",
    "ARROW_TEMPLATE": "'-> template'",
    "REWRITE_ARROW": "'=>'",
    "COMPARE": "a comparison",
    "$END": "the end of the statement",
}


def describe_terminal(parser: Lark, name: str) -> str:
    if name in _FRIENDLY:
        return _FRIENDLY[name]
    try:
        pattern = parser.get_terminal(name).pattern
    except KeyError:
        return name
    if pattern.type == "str":
        return repr(pattern.value)
    return name.lower()


def describe_found(err: UnexpectedInput) -> str:
    if isinstance(err, UnexpectedCharacters):
        return f"unexpected character {err.char!r}"
    if isinstance(err, UnexpectedToken):
        if err.token.type == "$END":
            return "the statement ends here"
        return f"found {str(err.token)!r}"
    return "unexpected input"


@dataclass(frozen=True)
class _Example:
    label: str
    state: object
    accepts: frozenset[str] | None
    token: object


def _example_errors(parse: Callable[[str], object]) -> list[_Example]:
    """Every table example's parse error, computed once per parser (as lark's match_examples does)."""
    out = []
    for label, examples in BAD_EXAMPLES.items():
        for text in examples:
            try:
                parse(text)
            except UnexpectedInput as ut:
                accepts = getattr(ut, "accepts", None)
                out.append(_Example(label, ut.state, frozenset(accepts) if accepts is not None else None,
                                    getattr(ut, "token", None)))
    return out


class Classifier:
    """Maps a parse error to the label of the table example failing the same way."""

    def __init__(self, parser: Lark) -> None:
        self.parser = parser
        self.examples = _example_errors(parser.parse)

    def match(self, err: UnexpectedInput) -> str | None:
        accepts = getattr(err, "accepts", None)
        accepts = frozenset(accepts) if accepts is not None else None
        token = getattr(err, "token", None)
        same_state = [e for e in self.examples
                      if e.state == err.state and (accepts is None or e.accepts is None or e.accepts == accepts)]
        for e in same_state:  # an exact token match first, as lark's match_examples does
            if token is not None and e.token == token:
                return e.label
        return same_state[0].label if same_state else None

    def message(self, err: UnexpectedInput) -> str:
        """The readable message for a parse error of one statement."""
        if isinstance(err, UnexpectedCharacters) and err.char == '"':
            return "unterminated string (a string ends with '\"' on the same line)"
        label = self.match(err) if err.state is not None else None
        found = describe_found(err)
        if label:
            return f"{label}; {found}"
        if isinstance(err, UnexpectedCharacters):
            return f"{found}: not part of the .fuse language"
        expected = sorted(getattr(err, "accepts", None) or getattr(err, "expected", None) or ())
        if expected:
            names = sorted({describe_terminal(self.parser, t) for t in expected})
            if len(names) > 6:
                names = names[:6] + ["..."]
            return f"expected {', '.join(names)}; {found}"
        return found
