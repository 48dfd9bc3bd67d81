"""One rendered kernel and the context its renderer fills in while generating it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autofusion.codegen.buffers import cache_line_aligned
from autofusion.codegen.cores import CoreChoice, CoreChooser, CoreSpec, DefaultChooser
from autofusion.codegen.ctype import ctype, literal
from autofusion.codegen.errors import CodegenError
from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.sizes import align_up, hint
from autofusion.codegen.templates import TemplateSet
from autofusion.decide.plan import FusedGroup
from autofusion.graph.graph import Graph, Node
from autofusion.graph.types import TensorType
from autofusion.ops.registry import OpRegistry


@dataclass(frozen=True)
class Param:
    """One pointer argument of a kernel function."""

    tensor: str  # the graph tensor it points to; for derived constants, a descriptive label
    ident: str  # its C name inside the kernel
    ctype: str
    role: str  # "in", "out" or "derived" (a constant computed at build time, e.g. folded weights)


@dataclass(frozen=True, eq=False)
class KernelSource:
    """A group rendered as one C function ``void name(params..., char* scratch, int nt)``."""

    name: str
    group: FusedGroup
    code: str
    params: tuple[Param, ...]
    scratch_bytes: int
    derived: tuple[tuple[str, np.ndarray], ...] = ()  # (param ident, array) of derived constants
    uses_blas: bool = False
    thread_bytes: int = 0  # blocks each thread allocates while the kernel runs (im2col, tiles, rows)
    cores: tuple[tuple[CoreSpec, CoreChoice], ...] = ()  # its matrix products and how each is computed

    def signature_args(self) -> str:
        return ", ".join(p.ident for p in self.params)


@dataclass
class KernelContext:
    """Mutable state of rendering one group: parameters used, scratch, fresh names, derived constants."""

    graph: Graph
    registry: OpRegistry
    group: FusedGroup
    templates: TemplateSet
    names: NameTable = field(default_factory=NameTable)
    used: dict[str, str] = field(default_factory=dict)  # tensor -> ident, for referenced tensors
    derived: list[tuple[str, str, np.ndarray]] = field(default_factory=list)  # (label, ident, array)
    scratch_bytes: int = 0
    thread_bytes: int = 0
    uses_blas: bool = False
    chooser: CoreChooser = field(default_factory=DefaultChooser)
    cores: list[tuple[CoreSpec, CoreChoice]] = field(default_factory=list)
    channels_last: frozenset[str] = frozenset()  # tensors stored [N, H, W, C] (codegen/conv_layout.py)
    _counter: int = 0

    def core(self, spec: CoreSpec) -> CoreChoice:
        """How to compute the product ``spec`` (the chooser's answer), recorded for the kernel."""
        choice = self.chooser.choose(spec)
        if choice.packed and not spec.packable:
            raise self.error(f"core {spec.describe()} cannot run the packed kernel (its weight is not constant)")
        if choice.impl == "repack" and not spec.repackable:
            raise self.error(f"core {spec.describe()} cannot pack its B per call (a constant weight, too narrow "
                             "or a few-row product)")
        self.cores.append((spec, choice))
        return choice

    # -- tensors ----------------------------------------------------------------------------------

    def type(self, tensor: str) -> TensorType:
        return self.graph.types[tensor]

    def ctype_of(self, tensor: str) -> str:
        return ctype(self.type(tensor).dtype, f"group {self.group.name}: tensor {tensor!r}")

    def producer(self, tensor: str) -> Node | None:
        return self.graph.producers.get(tensor)

    def uniform_literal(self, tensor: str) -> str | None:
        """A C literal for a constant whose elements are all equal (scalars, filled tensors)."""
        arr = self.graph.const_value(tensor)
        if arr is None or arr.size == 0 or arr.size > 1 << 20:
            return None
        flat = arr.reshape(-1)
        first = flat[0]
        if arr.size > 1 and not (np.all(flat == first) or (np.all(np.isnan(flat)) if flat.dtype.kind == "f" else False)):
            return None
        return literal(first, self.type(tensor).dtype)

    def pointer(self, tensor: str) -> str:
        """The kernel parameter pointing at ``tensor`` (a group input or output)."""
        if tensor not in self.group.inputs and tensor not in self.group.outputs:
            raise self.error(f"tensor {tensor!r} is read from memory but is neither an input nor an output "
                             "of the group (inconsistent plan)")
        ident = self.used.get(tensor)
        if ident is None:
            ident = self.used[tensor] = self.names(tensor)
        return ident

    def derived_constant(self, label: str, array: np.ndarray) -> str:
        """A parameter for a constant computed at build time (folded or concatenated weights)."""
        for lab, ident, _ in self.derived:
            if lab == label:
                return ident
        ident = self.names(f"d_{label}")
        self.derived.append((label, ident, cache_line_aligned(array)))
        return ident

    # -- scratch and names -------------------------------------------------------------------------

    def fresh(self, prefix: str = "v") -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def scratch(self, nbytes: int) -> int:
        """Reserve ``nbytes`` of the group's scratch memory; returns the byte offset."""
        offset = self.scratch_bytes
        self.scratch_bytes += align_up(nbytes)
        return offset

    def per_thread(self, nbytes: int) -> None:
        """Count a request for the block each thread uses while the kernel runs (af_thread_block):
        requests reuse the one block, so the largest counts, rounded as the runtime rounds it."""
        self.thread_bytes = max(self.thread_bytes, (hint(nbytes) + 63) // 64 * 64)  # the memory it takes there

    # -- errors -----------------------------------------------------------------------------------

    def error(self, message: str, node: Node | None = None) -> CodegenError:
        return group_error(self.group, message, node)

    # -- result -----------------------------------------------------------------------------------

    def params(self) -> tuple[Param, ...]:
        """Referenced tensors in a canonical order: inputs, outputs, then derived constants."""
        out: list[Param] = []
        for t in self.group.inputs:
            if t in self.used and t not in self.group.outputs:
                out.append(Param(t, self.used[t], self.ctype_of(t), "in"))
        for t in self.group.outputs:
            out.append(Param(t, self.pointer(t), self.ctype_of(t), "out"))
        for label, ident, arr in self.derived:
            out.append(Param(label, ident, _array_ctype(arr), "derived"))
        return tuple(out)


def _array_ctype(arr: np.ndarray) -> str:
    from autofusion.graph.types import DType

    return ctype(DType.of(arr))


def group_error(group: FusedGroup, message: str, node: Node | None = None) -> CodegenError:
    """A CodegenError naming the group, the node and op, and the rules that formed the group."""
    where = f"group {group.name!r} (template {group.template!r}"
    if group.rules:
        where += ", rules " + ", ".join(str(r) for r in group.rules)
    where += ")"
    if node is not None:
        where += f", node {node.name!r} ({node.op})"
    return CodegenError(f"{where}: {message}")


def group_comment(graph: Graph, group: FusedGroup) -> list[str]:
    """Comment lines above a kernel: its ops, template, and the rules (file:line) that formed it."""
    ops = " -> ".join(graph.node_by_name[n].op for n in group.nodes)
    params = "".join(f" {k}={v}" for k, v in group.params.items())
    lines = [f"{group.name}: {ops}", f"template {group.template}{params}, kind {group.kind}, {len(group.nodes)} node(s)"]
    if group.decided_by is not None:
        lines.append(f"template from rule {group.decided_by}")
    if group.rules:
        lines.append("rules: " + "; ".join(str(r) for r in group.rules))
    else:
        lines.append("rules: none (single op)" if len(group.nodes) == 1 else "rules: none given")
    return [c_comment_text(line) for line in lines]
