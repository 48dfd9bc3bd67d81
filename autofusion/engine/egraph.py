"""The one place that talks to egglog: run program text, read sizes, reports and the serialized
e-graph. Only the text language is used, which egglog 13 and 14 share."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from egglog.bindings import EggSmolError, EGraph


class EgglogError(RuntimeError):
    """egglog rejected a generated program (a bug in translation, reported with the program line)."""


@dataclass
class Serialized:
    """A snapshot of the e-graph: e-class of every node, and node op/children."""

    nodes: dict[str, dict[str, Any]]
    classes: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Serialized:
        data = json.loads(text)
        nodes = data["nodes"]
        classes: dict[str, list[str]] = {}
        for nid, node in nodes.items():
            classes.setdefault(node["eclass"], []).append(nid)
        return cls(nodes, classes)

    def eclass(self, node_id: str) -> str:
        return str(self.nodes[node_id]["eclass"])

    def op(self, node_id: str) -> str:
        return str(self.nodes[node_id]["op"])

    def children(self, node_id: str) -> list[str]:
        return list(self.nodes[node_id]["children"])

    def rows(self, function: str) -> list[list[str]]:
        """Rows of a relation or function: the node ids of each row's arguments."""
        return [self.nodes[nid]["children"] for nid in self.by_op.get(function, ())]

    @functools.cached_property
    def by_op(self) -> dict[str, list[str]]:
        """Node ids by their op (constructor, function or relation name)."""
        out: dict[str, list[str]] = {}
        for nid, node in self.nodes.items():
            out.setdefault(node["op"], []).append(nid)
        return out

    def primitive(self, node_id: str) -> Any:
        """The Python value of a primitive node (string, i64 or f64)."""
        text = self.op(node_id)
        if text.startswith('"'):
            return json.loads(text)
        try:
            return int(text)
        except ValueError:
            return float(text)


# egglog's parser grows super-linearly with the text it is given: the 40 KB rule library parsed
# at once took 0.44 s and 490 MB of resident memory that stayed with the process; four forms at
# a time, 0.09 s and 20 MB
FORMS_PER_PARSE = 4


def top_level_forms(text: str) -> list[str]:
    """The top-level s-expressions of egglog program text (strings and ``;`` comments respected)."""
    forms: list[str] = []
    depth, start, i, n = 0, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == ";":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "(":
            if depth == 0:
                start = i
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                forms.append(text[start:i + 1])
            elif depth < 0:  # a stray ")": the rest goes to egglog as is, to be reported there
                forms.append(text[i:])
                return forms
        i += 1
    if depth:
        forms.append(text[start:])  # unbalanced: egglog reports the error
    return forms


class EggSession:
    """An egglog e-graph driven by program text."""

    def __init__(self) -> None:
        self._egraph = EGraph()

    def run(self, program: str | Iterable[str]) -> list[Any]:
        text = program if isinstance(program, str) else "\n".join(program)
        forms = top_level_forms(text)
        out: list[Any] = []
        try:
            for i in range(0, len(forms), FORMS_PER_PARSE):
                commands = self._egraph.parse_program("\n".join(forms[i:i + FORMS_PER_PARSE]))
                out.extend(self._egraph.run_program(*commands))
        except EggSmolError as e:
            raise EgglogError(str(e)) from None
        return out

    def size(self) -> int:
        """Total rows over all tables (e-nodes and facts)."""
        out = self.run("(print-size)")
        for item in out:
            sizes = getattr(item, "sizes", None)
            if sizes is not None:
                return int(sum(n for _, n in sizes))
        return 0

    def run_rules(self, ruleset: str, scheduler: str | None = None) -> dict[str, int]:
        """One iteration of ``ruleset``; returns how many times each rule matched."""
        if scheduler:
            out = self.run(f"(run-schedule (let-scheduler bo {scheduler}) (run-with bo {ruleset}))")
        else:
            out = self.run(f"(run {ruleset} 1)")
        matches: dict[str, int] = {}
        for item in out:
            report = getattr(item, "report", None)
            if report is not None:
                for name, n in report.num_matches_per_rule.items():
                    matches[name] = matches.get(name, 0) + int(n)
        return matches

    def serialize(self) -> Serialized:
        s = self._egraph.serialize([], max_functions=None, max_calls_per_function=None)
        return Serialized.parse(s.to_json())


PREPARED_KEEP = 4  # prepared sessions kept per thread (one per rule set in use)
# egglog's EGraph belongs to the thread that made it (using or dropping it elsewhere panics), so
# every thread keeps its own sessions
_local = threading.local()


def _prepared_here() -> OrderedDict[str, EggSession]:
    cache = getattr(_local, "prepared", None)
    if cache is None:
        cache = _local.prepared = OrderedDict()
    return cache


@contextmanager
def prepared_session(prelude: str) -> Iterator[EggSession]:
    """A session that has run ``prelude`` (declarations and rules: egglog takes 0.1-0.2 s to compile
    a rule library, more than a small graph's whole saturation), reused across calls. Each use runs
    between ``(push)`` and ``(pop)``, so it starts from the prelude's state and leaves it so.
    Sessions are kept per thread and lent to one user at a time (a nested caller, or an egglog
    without push/pop, gets a fresh one)."""
    key = hashlib.sha256(prelude.encode()).hexdigest()
    cache = _prepared_here()
    session = cache.pop(key, None)
    if session is None:
        session = EggSession()
        session.run(prelude)
    try:
        session.run("(push)")
    except EgglogError:
        yield session  # not reusable: dropped after this use
        return
    finished = False
    try:
        yield session
        finished = True
    finally:
        try:
            session.run("(pop)")
        except EgglogError:
            finished = False
        if finished:
            cache[key] = session
            while len(cache) > PREPARED_KEEP:
                cache.popitem(last=False)
