"""From a fused group to a kernel: the group's kind (its template) names the renderer."""

from __future__ import annotations

from autofusion.codegen.cores import CoreChooser
from autofusion.codegen.errors import CodegenError
from autofusion.codegen.kernel_context import KernelContext, KernelSource, group_comment, group_error
from autofusion.codegen.names import c_ident
from autofusion.codegen.op_layout import SELECT_SOURCE
from autofusion.codegen.sizes import declared
from autofusion.codegen.templates import TemplateSet
from autofusion.decide.plan import FusedGroup
from autofusion.graph.graph import Graph
from autofusion.kinds import KernelKind, KindError, KindRegistry, default_kinds
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpRegistry

BACKEND = "c"


def kernel_name(group: FusedGroup) -> str:
    """The C function name of a group (the plan's name, made safe)."""
    return c_ident(group.name, "")


def c_kinds(kinds: KindRegistry | None = None) -> tuple[str, ...]:
    """The kinds the C backend renders."""
    return tuple(k.name for k in kinds or default_kinds() if k.renderers.get(BACKEND) is not None)


def group_kind(group: FusedGroup, kinds: KindRegistry, backend: str, available: tuple[str, ...]) -> KernelKind:
    """The kind of ``group``, checked to render on ``backend`` with the group's params."""
    kind = kinds.get(group.template)
    if kind is None or kind.renderers.get(backend) is None:
        raise group_error(group, f"unknown template {group.template!r}; the {backend} backend has "
                          + ", ".join(sorted(available)))
    problems = kind.param_problems(group.params)
    if problems:
        raise group_error(group, "; ".join(why for _, why in problems))
    return kind


# loop nests run 512-bit vectors on AVX-512 CPUs (af_runtime.h, AF_WIDE_VECTORS); GEMM epilogues were no faster
WIDE_VECTOR_TEMPLATES = frozenset({"pointwise", "reduction"})


def render_group(graph: Graph, group: FusedGroup, templates: TemplateSet,
                 registry: OpRegistry | None = None, chooser: CoreChooser | None = None,
                 kinds: KindRegistry | None = None, channels_last: frozenset[str] = frozenset()) -> KernelSource | None:
    """The kernel of ``group``, rendered by its kind's C renderer; None for a view group (it only
    aliases a buffer). ``chooser`` decides how its matrix products run (default: untuned, from what
    this machine reports); ``channels_last``: the plan's tensors convolution kernels hand over
    [N, H, W, C] (codegen/conv_layout.py)."""
    registry = registry or default_registry()
    kinds = kinds or default_kinds()
    kind = group_kind(group, kinds, BACKEND, c_kinds(kinds))
    nodes = [graph.node_by_name[n] for n in group.nodes]
    for node in nodes:
        if node.op not in registry:
            raise group_error(group, "op is not in the op registry", node)
    k = KernelContext(graph, registry, group, templates, channels_last=channels_last)
    if chooser is not None:
        k.chooser = chooser
    renderer = kind.renderer(BACKEND)
    assert renderer is not None
    try:
        body = renderer(k, nodes)
    except (CodegenError, KindError):
        raise
    except Exception as e:  # a plugin's renderer: say whose
        raise KindError(f"kernel kind {kind.name!r} failed to render group {group.name}: "
                        f"{type(e).__name__}: {e}") from None
    if body is None:
        if kind.name != "view":
            raise KindError(f"kernel kind {kind.name!r} rendered no kernel for group {group.name}")
        return None
    name = kernel_name(group)
    params = k.params()
    lines = body.splitlines()
    code = templates.render("kernel.c.j2", comment=group_comment(graph, group), name=name, params=params,
                            body=lines, sizes=declared(), no_if_convert=any(SELECT_SOURCE in line for line in lines),
                            wide_vectors=group.template in WIDE_VECTOR_TEMPLATES)
    return KernelSource(name, group, code, params, k.scratch_bytes,
                        tuple((ident, arr) for _, ident, arr in k.derived), k.uses_blas, k.thread_bytes,
                        tuple(k.cores))
