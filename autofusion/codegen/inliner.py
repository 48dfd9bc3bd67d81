"""Producer inlining: the C expression of any tensor of a group at a symbolic index.

``Inliner.value(t, idx, block)`` returns a C expression (a local variable or a literal) for element
``idx`` of tensor ``t``. Tensors read from memory are loaded; tensors produced inside the group are
computed by their op's handler from their inputs' values at mapped indices, recursively, as in
Halide/TVM inlining. Every computed value is bound to a ``const`` local, and a value already
computed at the same index in an enclosing block is reused (common subexpressions once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autofusion.codegen import index as ix
from autofusion.codegen.index import Index
from autofusion.codegen.kernel_context import KernelContext
from autofusion.graph.graph import Node


class Misaligned(Exception):
    """An aligned fast path (row-wise reduction, GEMM tile) does not apply to this index."""


class Block:
    """Statements of one C block and the values they computed (visible to nested blocks)."""

    def __init__(self, parent: Block | None = None) -> None:
        self.parent = parent
        self.lines: list[str] = []
        self.memo: dict[tuple[str, Index], str] = {}

    def lookup(self, key: tuple[str, Index]) -> str | None:
        block: Block | None = self
        while block is not None:
            hit = block.memo.get(key)
            if hit is not None:
                return hit
            block = block.parent
        return None

    def child(self) -> Block:
        return Block(self)

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def nest(self, header: str, inner: Block, footer: str | None = "}") -> None:
        """Append ``header``, the inner block's statements indented, and ``footer`` (if any)."""
        self.lines.append(header)
        self.lines.extend("    " + line if line else line for line in inner.lines)
        if footer is not None:
            self.lines.append(footer)


# A handler computes output ``pos`` of ``node`` at ``idx``: returns a C expression.
Handler = Callable[["Inliner", Node, int, Index, Block], str]
# An override replaces a tensor's value (row buffer, GEMM tile, materialised scratch).
Override = Callable[[Index, Block], str]


@dataclass
class Inliner:
    """Computes tensors of one group at symbolic indices; see the module docstring."""

    k: KernelContext
    members: frozenset[str]  # node names whose outputs are computed here rather than loaded
    handlers: Mapping[str, Handler]
    overrides: dict[str, Override] = field(default_factory=dict)
    node_handlers: dict[str, Handler] = field(default_factory=dict)  # per node (reductions in a stage)

    def computed_here(self, tensor: str) -> bool:
        node = self.k.producer(tensor)
        return node is not None and node.name in self.members

    def value(self, tensor: str, idx: Index, block: Block) -> str:
        key = (tensor, tuple(idx))
        hit = block.lookup(key)
        if hit is not None:
            return hit
        override = self.overrides.get(tensor)
        if override is not None:
            expr = override(idx, block)
        else:
            lit = self.k.uniform_literal(tensor)
            if lit is not None:
                return lit
            expr = self.compute_default(tensor, idx, block)
        hit = block.lookup(key)  # a handler may have bound it already (multi-output ops)
        if hit is not None:
            return hit
        return self.bind(tensor, expr, block, key)

    def bind(self, tensor: str, expr: str, block: Block, key: tuple[str, Index] | None = None) -> str:
        """``expr`` as a ``const`` local of ``tensor``'s type (or itself when already atomic)."""
        if ix.paren(expr) == expr and not expr.startswith("("):
            var = expr
        else:
            var = self.k.fresh()
            block.emit(f"const {self.k.ctype_of(tensor)} {var} = {expr};")
        if key is not None:
            block.memo[key] = var
        return var

    def compute_default(self, tensor: str, idx: Index, block: Block) -> str:
        """``tensor`` at ``idx`` ignoring overrides: computed by its producer here, or loaded."""
        if self.computed_here(tensor):
            node = self.k.producer(tensor)
            assert node is not None
            return self._compute(node, node.outputs.index(tensor), idx, block)
        return self.load(tensor, idx)

    def load(self, tensor: str, idx: Index) -> str:
        ptr = self.k.pointer(tensor)
        return f"{ptr}[{ix.linear(idx, self.k.type(tensor).shape)}]"

    def _compute(self, node: Node, pos: int, idx: Index, block: Block) -> str:
        handler = self.node_handlers.get(node.name) or self.handlers.get(node.op)
        if handler is None:
            raise self.k.error("the C backend cannot compute this op inside a fused loop nest", node)
        return handler(self, node, pos, idx, block)

    # -- helpers for handlers ---------------------------------------------------------------------

    def input_value(self, node: Node, i: int, out_idx: Index, block: Block, out_pos: int = 0) -> str:
        """Input ``i`` of ``node`` at the index broadcast from output ``out_pos``'s ``out_idx``."""
        t = node.inputs[i]
        out_shape = self.k.type(node.outputs[out_pos]).shape
        return self.value(t, ix.broadcast(out_idx, out_shape, self.k.type(t).shape), block)

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.k.type(tensor).shape
