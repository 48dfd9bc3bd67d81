"""SuperKernel assembly: a whole plan as one shared library with one entry point.

``render_plan(plan)`` renders every group to a kernel function, places every tensor with the
buffer planner, and writes:

* kernel translation units (several, so they compile in parallel), and
* a main unit with ``af_create(consts)`` (keeps the weight pointers in a context),
  ``af_run(ctx, inputs, outputs, workspace, nthreads)`` (calls every kernel in plan order, no
  dispatch through Python) and ``af_destroy``.

``render_unfused(plan)`` renders the same kernels with one exported entry each, for a runner
that calls them one at a time (the baseline without fusion).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from autofusion.codegen.buffers import BufferPlan, plan_buffers
from autofusion.codegen.conv_layout import channels_last_tensors
from autofusion.codegen.cores import CoreChooser, DefaultChooser
from autofusion.codegen.errors import CodegenError
from autofusion.codegen.group_renderer import render_group
from autofusion.codegen.kernel_context import KernelSource, group_comment
from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.sizes import MAX_SIZES, c_names, c_powers, for_c, hinting
from autofusion.codegen.templates import TemplateSet, default_templates
from autofusion.decide.plan import Plan
from autofusion.graph.types import DType
from autofusion.ir.symbolic import is_symbolic, representative_binding, symbols_of
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

UNIT_CHARS = 20_000  # about this much C per translation unit, so plans compile in parallel
MAX_UNITS = 8


@dataclass(frozen=True, eq=False)
class LibrarySource:
    """The C sources of one shared library and what the runtime needs to call it."""

    name: str
    units: tuple[tuple[str, str], ...]  # (file name, text)
    header: str  # af_runtime.h
    kernels: tuple[KernelSource, ...]
    constants: tuple[tuple[str, np.ndarray], ...]  # what af_create receives, in order
    buffers: BufferPlan | None = None
    uses_blas: bool = False
    function: Mapping[str, str] = field(default_factory=dict)  # group -> C function that runs it
    profile: bool = False  # a profiling build: af_profile times every group of ``profiled``
    profiled: tuple[str, ...] = ()  # the groups af_profile times, in its order

    @property
    def text(self) -> str:
        """All units, for hashing and inspection."""
        return "\n".join(f"// ---- {name}\n{text}" for name, text in self.units)


def render_kernels(plan: Plan, templates: TemplateSet, registry: OpRegistry,
                   chooser: CoreChooser | None = None) -> list[KernelSource]:
    out = []
    machine = (chooser or DefaultChooser()).machine
    channels_last = channels_last_tensors(plan.graph, plan.groups, registry, machine)
    for group in plan.groups:
        k = render_group(plan.graph, group, templates, registry, chooser, plan.kinds, channels_last)
        if k is not None:
            out.append(k)
    return out


def canonical_code(k: KernelSource) -> str:
    """The kernel's code without comments and with positional names: equal for kernels that differ
    only in tensor and function names."""
    text = re.sub(r"/\*.*?\*/", "", k.code)
    for i, p in enumerate(k.params):
        text = re.sub(rf"\b{re.escape(p.ident)}\b", f"@p{i}", text)
    return re.sub(rf"\b{re.escape(k.name)}\b", "@kernel", text)


def share_kernels(kernels: list[KernelSource]) -> tuple[list[KernelSource], dict[str, str]]:
    """Kernels with identical canonical code compiled once: (unique kernels, group -> function name).

    The shared function keeps the first group's readable names and says which groups use it.
    """
    first: dict[str, KernelSource] = {}
    users: dict[str, list[str]] = {}
    function: dict[str, str] = {}
    for k in kernels:
        key = canonical_code(k)
        rep = first.setdefault(key, k)
        users.setdefault(rep.name, []).append(k.group.name)
        function[k.group.name] = rep.name
    unique = []
    for k in first.values():
        others = [u for u in users[k.name] if u != k.group.name]
        if others:
            note = c_comment_text("also runs " + ", ".join(others) + " (same code up to tensor names)")
            k = replace(k, code=f"/* {note} */\n{k.code}")
        unique.append(k)
    return unique, function


def _units(title: str, kernels: list[KernelSource], templates: TemplateSet, exported: bool,
           prefix: str) -> list[tuple[str, str]]:
    total = sum(len(k.code) for k in kernels)
    n_units = max(1, min(MAX_UNITS, math.ceil(total / UNIT_CHARS), len(kernels)))
    target = total / n_units
    chunks: list[list[KernelSource]] = [[]]
    size = 0
    for k in kernels:
        if chunks[-1] and size + len(k.code) / 2 > target * len(chunks) and len(chunks) < n_units:
            chunks.append([])
        chunks[-1].append(k)
        size += len(k.code)
    units: list[tuple[str, str]] = []
    for i, chunk in enumerate(chunks):
        if not chunk and (units or not exported):
            continue  # an exported library keeps one (possibly empty) unit so that it always links
        text = templates.render(
            "unit.c.j2", title=c_comment_text(title), first=chunk[0].name if chunk else "none",
            last=chunk[-1].name if chunk else "none",
            blas=any(k.uses_blas for k in chunk), kernels=[k.code for k in chunk],
            wrappers=[{"name": k.name, "params": k.params} for k in chunk] if exported else [])
        units.append((f"{prefix}{i}.c", text))
    return units


def render_plan(plan: Plan, templates: TemplateSet | None = None, registry: OpRegistry | None = None,
                profile: bool = False, chooser: CoreChooser | None = None) -> LibrarySource:
    """The SuperKernel of ``plan``: kernel units plus a main unit with ``af_run``. With ``profile``,
    ``af_run`` also clocks each group's step and ``af_profile`` returns the seconds of the last run.
    ``chooser`` decides how each matrix product runs (codegen/cores.py; default: untuned);
    ``registry`` defaults to the plan's (plugin ops included when the plan was made with them)."""
    if is_symbolic(plan.graph):
        return _render_symbolic(plan, templates, registry, profile, chooser)
    return _assemble(plan, templates or default_templates(), registry or plan.registry, profile, chooser, {})


# kernel kinds that render with sizes known only at run time (the others: one library per binding);
# of the opaque ops, the ones whose renderers do (each tested at several bindings)
RUN_TIME_SIZE_KINDS = frozenset({"pointwise", "reduction", "multi_output", "view", "gemm_epilogue", "horizontal_gemm",
                                 "conv_epilogue", "opaque"})
RUN_TIME_SIZE_OPAQUE_OPS = frozenset({"MatMul", "Gemm", "LSTM", "Conv"})


def _render_symbolic(plan: Plan, templates: TemplateSet | None, registry: OpRegistry | None, profile: bool,
                     chooser: CoreChooser | None) -> LibrarySource:
    """One library for every binding of a plan over symbolic sizes (see codegen/sizes.py)."""
    symbols = symbols_of(plan.graph)
    fixed = sorted({g.template for g in plan.groups if g.template not in RUN_TIME_SIZE_KINDS}
                   | {f"opaque {plan.graph.node_by_name[n].op}" for g in plan.groups if g.template == "opaque"
                      for n in g.nodes if plan.graph.node_by_name[n].op not in RUN_TIME_SIZE_OPAQUE_OPS})
    if fixed:
        raise CodegenError(f"graph {plan.graph.name!r} has symbolic sizes ({', '.join(symbols)}) and kernels of "
                           f"kind {', '.join(fixed)}, which take fixed sizes only so far: bind the plan first "
                           "(bind_plan) or run it with autofusion.runtime.DynamicModel")
    if len(symbols) > MAX_SIZES:
        raise CodegenError(f"graph {plan.graph.name!r} has {len(symbols)} symbolic sizes; a library takes {MAX_SIZES}")
    names = c_names(symbols)
    at = representative_binding(plan.graph, plan.stats.get("priced_at"))  # cores chosen where the plan was priced
    renamed = replace(plan, graph=for_c(plan.graph, names))
    given = not plan.stats.get("priced_also_at")  # optimize(sizes=...): the sizes the user expects
    with hinting({names[s]: at[s] for s in symbols}, given):
        source = _assemble(renamed, templates or default_templates(), registry or plan.registry, profile, chooser,
                           names)
    return replace(source, units=tuple((name, c_powers(text)) for name, text in source.units))


def _assemble(plan: Plan, templates: TemplateSet, registry: OpRegistry, profile: bool,
              chooser: CoreChooser | None, sizes: Mapping[str, str]) -> LibrarySource:
    """The library of ``plan``; ``sizes`` (symbol -> C name) when its sizes are known only at run time."""
    g = plan.graph
    kernels = render_kernels(plan, templates, registry, chooser)
    by_group = {k.group.name: k for k in kernels}
    unique, function = share_kernels(kernels)
    buffers = kernel_buffers(plan, kernels, at_run_time=bool(sizes))
    at = "af_off[{}]" if sizes else "{}"
    names = NameTable("t_", reserved=frozenset({"ctx", "ws", "inputs", "outputs", "nt"}))

    for k in kernels:
        for prm in k.params:
            c = g.constants.get(prm.tensor)
            if c is not None and c.is_symbolic:
                raise CodegenError(f"kernel {k.name} reads {prm.tensor!r}, whose values are symbolic sizes, from "
                                   "memory: such kernels take fixed sizes only so far")
    # symbolic constants (shape vectors) are read while rendering, never from memory: a placeholder
    consts: list[tuple[str, np.ndarray]] = [
        (t, np.zeros(c.array.shape, np.int64) if c.is_symbolic else np.ascontiguousarray(c.array))
        for t, c in g.constants.items()]
    derived_index: dict[tuple[str, str], int] = {}
    alike: dict[tuple[object, ...], list[int]] = {}
    for k in kernels:
        for ident, arr in k.derived:
            derived_index[(k.name, ident)] = _constant_slot(consts, alike, f"{k.name}.{ident}", arr)

    decls = []
    for t, p in buffers.placements.items():
        ct = _ctype(g.types[t].dtype)
        ident = names(t)
        if p.kind == "input":
            decls.append(f"const {ct}* {ident} = (const {ct}*)inputs[{p.index}];")
        elif p.kind == "const":
            decls.append(f"const {ct}* {ident} = (const {ct}*)ctx->consts[{p.index}];")
        elif p.kind == "output":
            decls.append(f"{ct}* {ident} = ({ct}*)outputs[{p.index}];")
        elif p.kind == "workspace":
            decls.append(f"{ct}* {ident} = ({ct}*)(ws + {at.format(p.index)});")
    for t, p in buffers.placements.items():  # aliases after their bases, in plan order
        if p.kind == "alias":
            ct = _ctype(g.types[t].dtype)
            decls.append(f"const {ct}* {names(t)} = (const {ct}*){names(p.base)};")

    steps = []
    for group in plan.groups:
        lines: list[str] = []
        kernel = by_group.get(group.name)
        if kernel is not None:
            args = []
            for prm in kernel.params:
                if prm.role == "derived":
                    args.append(f"(const {prm.ctype}*)ctx->consts[{derived_index[(kernel.name, prm.ident)]}]")
                else:
                    args.append(names(prm.tensor))
            scratch = buffers.scratch.get(group.name)
            args.append(f"ws + {at.format(scratch)}" if scratch is not None else "ws")
            args.append("nt")
            lines.append(f"{function[group.name]}({', '.join(args)});")
        for src, out in buffers.view_copies.get(group.name, ()):
            base = buffers.placements[src].base
            lines.append(f"memcpy(outputs[{out}], {names(base)}, {g.types[src].nbytes});")
        steps.append({"comment": group_comment(g, group), "lines": lines, "group": group.name})
    final = [f"memcpy(outputs[{i}], {names(t)}, {g.types[t].nbytes});" for t, i in buffers.final_copies]

    title = f"autofusion SuperKernel of {g.name!r} ({plan.strategy or 'plan'})"
    units = _units(title, unique, templates, exported=False, prefix="kernels_")
    main = templates.render(
        "superkernel.c.j2", title=c_comment_text(title),
        summary=c_comment_text(f"{len(g.nodes)} nodes in {len(plan.groups)} groups, {len(kernels)} kernels "
                               f"({len(unique)} distinct)"),
        workspace=buffers.workspace_bytes, blas=False, kernels=unique, consts=consts,
        n_inputs=len(g.inputs), n_outputs=len(g.outputs), decls=decls, steps=steps, final=final, profile=profile,
        sizes=list(sizes.values()), blocks=[(str(b.nbytes), b.start, b.end) for b in buffers.blocks])
    return LibrarySource("superkernel", tuple(units) + (_runtime_unit(templates), ("main.c", main)),
                         templates.runtime_header(),
                         tuple(kernels), tuple(consts), buffers, any(k.uses_blas for k in kernels), function,
                         profile, tuple(str(s["group"]) for s in steps) if profile else ())


def kernel_buffers(plan: Plan, kernels: Sequence[KernelSource], at_run_time: bool = False) -> BufferPlan:
    """The buffer plan of ``plan`` given its rendered kernels' scratch and per-thread blocks."""
    return plan_buffers(plan, {k.group.name: k.scratch_bytes for k in kernels},
                        {k.group.name: k.thread_bytes for k in kernels}, at_run_time)


def render_unfused(plan: Plan, templates: TemplateSet | None = None,
                   registry: OpRegistry | None = None, chooser: CoreChooser | None = None) -> LibrarySource:
    """Every kernel of ``plan`` exported as ``af_call_<name>(args, scratch, nthreads)``."""
    templates = templates or default_templates()
    registry = registry or default_registry()
    kernels = render_kernels(plan, templates, registry, chooser)
    unique, function = share_kernels(kernels)
    title = f"autofusion kernels of {plan.graph.name!r}, one entry per distinct kernel"
    units = _units(title, unique, templates, exported=True, prefix="ops_")
    return LibrarySource("kernels", tuple(units) + (_runtime_unit(templates),), templates.runtime_header(),
                         tuple(kernels), (), None, any(k.uses_blas for k in kernels), function)


def _runtime_unit(templates: TemplateSet) -> tuple[str, str]:
    """The translation unit of the runtime's own functions (``af_thread_block``)."""
    return ("af_runtime.c", templates.render("runtime.c.j2"))


def _constant_slot(consts: list[tuple[str, np.ndarray]], alike: dict[tuple[object, ...], list[int]], name: str,
                   array: np.ndarray) -> int:
    """Where ``array`` sits in ``consts``: at an equal derived constant's slot if one is there, so that
    a weight read by several nodes is packed once (an unrolled LSTM's 16 steps each kept a copy of
    its 6 MB of packed weights: 96 MB, read from DRAM at 0.3x the speed of one copy in L3), else
    appended. ``alike`` groups the slots by shape, dtype and a sample of values."""
    key = (array.shape, array.dtype.str, array.ravel()[:: max(1, array.size // 64)].tobytes())
    for slot in alike.get(key, ()):
        if np.array_equal(consts[slot][1], array):
            return slot
    alike.setdefault(key, []).append(len(consts))
    consts.append((name, array))
    return len(consts) - 1


def _ctype(dtype: DType) -> str:
    from autofusion.codegen.ctype import ctype

    return ctype(dtype)
