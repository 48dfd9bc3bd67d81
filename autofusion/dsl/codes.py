"""Every diagnostic code of the rule checker: severity, what it means, why it matters, an example.

Codes are stable: tools and tests match on them, never on message wording. ``autofusion-rules
check --explain F003`` prints an entry; ``docs/diagnostics.md`` is generated from this table by
:func:`markdown` (a test keeps them in step).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"


E, W = Severity.ERROR, Severity.WARNING


@dataclass(frozen=True)
class Code:
    code: str
    name: str
    severity: Severity
    summary: str
    why: str
    example: str
    fix: str

    def explain(self) -> str:
        """The text ``--explain`` prints."""
        return (
            f"{self.code} {self.name} ({self.severity})\n\n{self.summary}\n\n"
            f"Why it matters: {self.why}\n\nExample:\n\n"
            + "\n".join("    " + line for line in self.example.strip().splitlines())
            + f"\n\nFix: {self.fix}\n"
        )


_TABLE = [
    Code("F001", "syntax-error", E,
         "The text is not a statement of the .fuse language. The message says what was expected "
         "where; the caret points at the first token that does not fit.",
         "A statement that does not parse is skipped: none of its rules exist. The checker parses "
         "each top-level statement on its own, so one mistake does not hide the next.",
         'rewrite double_neg Neg(Neg(x)) => x      # the rule name needs a ":" after it',
         'Write `rewrite NAME: LHS => RHS`; see docs/rules-tutorial.md for every statement.'),
    Code("F002", "unknown-name", E,
         "An op, class or pattern name that is neither in the op registry nor defined by a "
         "`class` or `pattern` statement (of this file or an imported one).",
         "A rule that names an op the registry lacks can never match any graph.",
         "fuse act_chain: MatMul -> Relux -> template \"gemm_epilogue\"",
         "Use an ONNX op name from the registry (`autofusion-rules list --ops`), a built-in class "
         "(pointwise, broadcast, reduction, reorganize, opaque, any) or a defined name."),
    Code("F003", "wrong-arity", E,
         "An op is given more or fewer inputs than the registry allows, a pattern is used with a "
         "different number of arguments than it declares, or no op of a class takes that many.",
         "The engine matches inputs by position: a term with the wrong count matches nothing.",
         "rewrite r: Add(x) => x        # Add takes exactly 2 inputs",
         "Give every input, or end the argument list with `...` to leave the rest unconstrained."),
    Code("F004", "unknown-attribute", E,
         "An attribute match `name=value` for an attribute the op (or no op of the class) has.",
         "The attribute is never present, so the pattern can never match.",
         "pattern s = Softmax(x, axes=-1)      # Softmax's attribute is `axis`",
         "Use the ONNX attribute name; the message lists the op's attributes."),
    Code("F005", "attribute-type", E,
         "An attribute is matched against a value of the wrong type (a string where the op's "
         "attribute is a number, a number where it is a string, ...).",
         "An attribute value of the wrong type never compares equal: the pattern is dead.",
         'pattern g = Gelu(x, approximate=1)   # approximate is "none" or "tanh"',
         "Write the value with the type of the attribute's default."),
    Code("F006", "unbound-name", E,
         "A name is used where it has no value: a variable on the right side of a rewrite that the "
         "left side does not bind, or a guard that reads a name the pattern does not bind.",
         "A rewrite cannot build a tensor it never matched; a guard cannot test a missing name.",
         "rewrite r: Relu(x) => Add(x, y)     # y is not bound by Relu(x)",
         "Bind the name on the left side (or in the pattern) or remove its use."),
    Code("F007", "unused-binding", W,
         "A capture (`... as n`), a pattern parameter or an attribute variable is bound but never "
         "used.",
         "Usually a typo in a guard or a leftover; names starting with `_` are exempt.",
         "fuse f: Softmax(x) as s -> template \"reduction\"    # s is never used",
         "Use the name in a guard, remove it, or start it with `_`."),
    Code("F008", "duplicate-name", E,
         "Two classes, patterns or rules share a name (across all loaded files), or a class or "
         "pattern takes the name of an op or built-in class.",
         "Plans and reports name rules; a repeated name makes `fused by rule X` ambiguous.",
         "fuse f: Relu -> template \"pointwise\"\nfuse f: Tanh -> template \"pointwise\"",
         "Rename one of them."),
    Code("F009", "shadowed-rule", W,
         "A rule matches nothing an earlier rule of higher or equal priority does not already "
         "match with the same outcome (same pattern up to renaming, or a more general one).",
         "The later rule never decides anything: it is dead code or a priority mistake.",
         "fuse a: pointwise(x) -> template \"pointwise\"\nfuse b: Relu(y) -> template \"pointwise\"",
         "Delete the later rule, or give it a higher priority or a different guard."),
    Code("F010", "never-matches", E,
         "A guard is false for every possible match: constant folding and interval reasoning show "
         "it (`rank(x) < 0`, `1 > 2`, `rank(x) > 3 and rank(x) < 2`, `dtype(x) == \"float42\"`).",
         "The rule can never fire; it is almost always a mistaken comparison.",
         "fuse f: Relu(x) -> template \"pointwise\" where rank(x) > 4 and rank(x) < 3",
         "Fix the comparison."),
    Code("F011", "guard-always-true", W,
         "A guard (or a part of it joined by `and`) holds for every match, e.g. `rank(x) >= 0`.",
         "It does nothing; it was probably meant to say something else.",
         "fuse f: Relu(x) -> template \"pointwise\" where numel(x) >= 0",
         "Remove it or fix the comparison."),
    Code("F012", "missing-template", E,
         "A fusion rule names a template the code generator does not provide, or gives none "
         "(only class rules may omit it and keep the host kernel's template).",
         "The fused group could not be rendered into a kernel.",
         "fuse f: MatMul -> Relu -> template \"gemm_epilog\"",
         "Use one of the known templates listed in the message."),
    Code("F013", "import-not-found", E,
         "`import \"file.fuse\"` names a file that exists neither next to the importing file nor "
         "in the shipped rule library.",
         "Rules of the missing file (classes, patterns) are unknown in this file.",
         'import "cor.fuse"',
         "Fix the path; it is relative to the importing file."),
    Code("F014", "import-cycle", E,
         "Files import each other in a cycle.",
         "The load order is undefined; the cycle is broken at the reported import.",
         '# a.fuse\nimport "b.fuse"\n# b.fuse\nimport "a.fuse"',
         "Move the shared definitions into a third file both import."),
    Code("F015", "unbounded-growth", W,
         "Rewrites that can grow the e-graph without bound: a right side that contains an instance "
         "of its own left side (applied to a new term), commutativity together with "
         "associativity of one op, or a two-way rewrite that introduces ops the other side lacks.",
         "Saturation then only stops at its node or time limit, and its result depends on the "
         "limit rather than on the rules.",
         "rewrite grow: Exp(x) => Mul(Exp(Div(x, 2.0)), Exp(Div(x, 2.0)))",
         "Make the rewrite one-way, drop one of the pair, or restrict it with a guard."),
    Code("F016", "unknown-guard-function", E,
         "A guard calls a function the guard language does not have.",
         "The guard cannot be evaluated.",
         "fuse f: Relu(x) -> template \"pointwise\" where ndim(x) == 2",
         "Use rank, shape, dim, numel, size_bytes, dtype, is_float, const, attr, len, min, max "
         "or abs."),
    Code("F017", "guard-type-error", E,
         "A guard mixes types: a tensor used as a number, a string compared with a number, "
         "arithmetic on a condition, a guard that is not a condition, or a function given the "
         "wrong number or kind of arguments.",
         "Such a guard is an error at every match and would make the rule silently never fire.",
         "fuse f: Relu(x) -> template \"pointwise\" where rank(x) + dtype(x) > 2",
         "Compare numbers with numbers and strings with strings; pass tensors to rank(), shape()."),
    Code("F018", "invalid-rewrite", E,
         "A rewrite side that cannot be built or matched: a left side that is only a variable or "
         "a literal, or a right side with `...`, a class name, a wildcard `_` or a capture.",
         "The engine must build the right side as concrete ops from what the left side matched.",
         "rewrite r: Relu(x) => act(x)       # which op of class act?",
         "Name concrete ops on the right side and bind every input on the left."),
    Code("F019", "invalid-composition", E,
         "A pattern uses itself (directly or through others), a branch or loop pattern is used "
         "inside a term, a class contains itself, or a literal is passed for a parameter that the "
         "pattern's guard inspects.",
         "Such a composition has no finite expansion or no meaning.",
         "pattern p = Relu(p)",
         "Compose patterns as a tree; use branch and loop patterns only as a whole fusion body."),
    Code("F020", "invalid-branch", E,
         "A branch has fewer than two members, or a member does not consume the shared tensor.",
         "A branch fuses several consumers of one tensor; a member that does not read it is not "
         "part of the branch.",
         "fuse f: branch x { MatMul(x, w1), MatMul(y, w2) } -> template \"horizontal_gemm\"",
         "Make every member read the shared tensor."),
    Code("F021", "invalid-loop", E,
         "A loop is malformed: a carried value without an update or updated twice, an update of "
         "a name that is not carried, a carried value the body never reads, or a per-step input "
         "`x[t]` outside a loop.",
         "The kernel carries exactly the listed values from one step to the next.",
         "fuse f: loop (h) { c = Tanh(h) } -> template \"lstm_scan\"",
         "Write one `name = term` update per carried value."),
    Code("F022", "rewrite-mismatch", E,
         "Numerical verification: both sides of a rewrite were built as graphs and run by the "
         "reference interpreter on random inputs, and they disagree (values, shapes or dtypes), "
         "or the right side does not type-check where the left side does. Each passing case is "
         "checked again with its sizes symbolic, as in a model with dynamic axes: where the guard "
         "holds for every size, the sides must type-check alike and agree at drawn sizes too. The "
         "notes give the counterexample: input shapes (symbolic ones and the sizes tried) and the "
         "largest error.",
         "A wrong rewrite silently changes what a model computes.",
         "rewrite swap: Sub(a, b) => Sub(b, a)",
         "Fix the rewrite, or restrict it with a guard to the inputs where it is exact."),
    Code("F023", "not-verified", W,
         "No input shapes were found (among a few candidate ranks and sizes per variable) for "
         "which the pattern type-checks and its guard holds, so the rewrite or fusion pattern "
         "could not be checked by running it; or a loop body's updates never had their carried "
         "values' types.",
         "The rule may be fine, but nothing tested it.",
         "rewrite r: Reshape(x, s) => x where const(s) and rank(x) == 9",
         "Relax the guard or use shapes the sampler can find (ranks up to 4)."),
    Code("F024", "internal-error", E,
         "The checker failed on this input. This is a bug in autofusion, reported as a diagnostic "
         "so that no user input ends in a traceback.",
         "The rest of the file may not have been checked.",
         "(any input that triggers a bug)",
         "Report it with the file."),
    Code("F025", "bad-output-index", E,
         "An output index (`Split(x, ...)[3]`) that the op does not have, or an index on an op "
         "with a single output.",
         "The matched node has no such output.",
         "pattern p = Relu(x)[1]",
         "Index only multi-output ops, below their output count."),
    Code("F026", "bad-kernel-param", E,
         "A template param (`-> template \"gemm_epilogue\" (tile_m=64)`) that the kernel kind does not "
         "take, or a value of the wrong type or out of range.",
         "The kind could not render the group with it; the param would be ignored or the kernel refused.",
         "fuse f: Relu -> Tanh -> template \"pointwise\" (tile_m=64)",
         "Use a param the message lists for the kind, with a value of its type."),
]

CODES: Mapping[str, Code] = {c.code: c for c in _TABLE}


def markdown() -> str:
    """docs/diagnostics.md: every code with its explanation."""
    lines = [
        "# Diagnostics of `autofusion-rules check`",
        "",
        "Generated from `autofusion/dsl/codes.py` (`autofusion-rules check --explain CODE` prints one"
        " entry). Errors make `check` exit with status 1; warnings are printed but leave it at 0.",
        "",
        "| code | name | severity | summary |",
        "| --- | --- | --- | --- |",
    ]
    for c in _TABLE:
        lines.append(f"| {c.code} | {c.name} | {c.severity} | {c.summary.split('. ')[0].rstrip('.')}. |")
    for c in _TABLE:
        lines += ["", f"## {c.code} {c.name} ({c.severity})", "", c.summary, "", f"Why it matters: {c.why}",
                  "", "```", c.example.strip(), "```", "", f"Fix: {c.fix}"]
    return "\n".join(lines) + "\n"
