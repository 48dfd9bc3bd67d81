"""Conv with an epilogue for Triton: an implicit GEMM per image and group, the epilogue on the tile.

Per image and group: M = output positions, N = output channels of the group, K = C/group * taps.
The A tile is gathered from the input at each tap's coordinates (masked to zero outside it: the
padding), the B tile is the weight [M_out, C/g, kh, kw] read as [K, N]; ``tl.dot`` accumulates the
tile, then the bias and the group's other elementwise ops (a BatchNormalization among them) are
computed on it before the store. 1-D convolutions run as 2-D ones of height 1.
"""

from __future__ import annotations

from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.triton.configs import tile_configs
from autofusion.codegen.triton.exprs import Exprs
from autofusion.codegen.triton.tindex import Index
from autofusion.graph.graph import Node
from autofusion.graph.types import DType
from autofusion.ops.common import ints
from autofusion.ops.spatial import Window, window

# the tile's own index variables (see templates/triton/conv_epilogue.py.j2)
TILE_VECTORS = frozenset({"rm", "rn", "mask", "acc", "co", "ty", "tx"})


def _core(ex: Exprs) -> Node:
    """The group's one Conv; pooling in the group is refused (its windows reach across tiles)."""
    g = ex.graph
    nodes = [g.node_by_name[n] for n in ex.group.nodes]
    cores = [n for n in nodes if ex.registry[n.op].core == "conv"]
    if len(cores) != 1:
        raise ex.error(f"template 'conv_epilogue' needs exactly one Conv node, found {len(cores)}")
    for n in nodes:
        if ex.registry[n.op].pooling:
            raise ex.error("pooling after a convolution needs its own kernel: its windows reach across tiles", n)
    core = cores[0]
    for t in core.inputs[:2]:
        producer = g.producers.get(t)
        if t in ex.group.outputs or (producer is not None and producer.name in ex.group.nodes):
            raise ex.error(f"operand {t!r} is computed inside the group; the Triton Conv reads operands from memory",
                           core)
    for t in core.inputs[:2] + (core.outputs[0],):
        if g.type_of(t).dtype != DType.FLOAT32:
            raise ex.error(f"the Triton Conv needs float32 tensors, {t!r} is {g.type_of(t).dtype}", core)
    return core


def _geometry(ex: Exprs, core: Node) -> tuple[Window, dict[str, int]]:
    """The window and its numbers as 2-D ones (a 1-D convolution has height 1)."""
    xs, ws = ex.graph.type_of(core.inputs[0]).shape, ex.graph.type_of(core.inputs[1]).shape
    if len(xs) not in (3, 4):
        raise ex.error(f"Conv with {len(xs) - 2} spatial axes: the Triton Conv renders 1-D and 2-D ones", core)
    groups = int(core.attr("group", 1))
    win = window(xs[2:], ints(core.attr("kernel_shape") or ws[2:]), core.attrs.get)

    def two(values: tuple[int, ...], fill: int) -> tuple[int, int]:
        return (fill, values[0]) if len(values) == 1 else (values[0], values[1])

    geo = dict(n_img=xs[0], c=xs[1], m=ws[0], groups=groups, cg=xs[1] // groups, mg=ws[0] // groups)
    for keys, values, fill in ((("h", "w"), xs[2:], 1), (("kh", "kw"), win.kernel, 1), (("oh", "ow"), win.out, 1),
                               (("sh", "sw"), win.strides, 1), (("dh", "dw"), win.dilations, 1),
                               (("ph", "pw"), win.pad_begin, 0)):
        geo.update(zip(keys, two(tuple(values), fill)))
    geo["p"], geo["k"] = geo["oh"] * geo["ow"], geo["cg"] * geo["kh"] * geo["kw"]
    return win, geo


def render_conv(ex: Exprs, names: NameTable) -> dict[str, object]:
    g = ex.graph
    core = _core(ex)
    win, geo = _geometry(ex, core)
    y = core.outputs[0]
    ys = g.type_of(y).shape
    ex.mask, ex.vector = "mask", set(TILE_VECTORS)
    tile: Index = ("n_img", "co", "ty", "tx") if len(ys) == 4 else ("n_img", "co", "tx")
    value = "acc"
    if len(core.inputs) > 2 and core.inputs[2]:  # the bias of each output channel
        value = ex.bind(f"acc + {ex.value(core.inputs[2], ('co',))}")

    def override(idx: Index) -> str:
        if not all(s == 1 or a == b for a, b, s in zip(idx, tile, ys)):
            raise ex.error("the convolution's result is read away from its own tile", core)
        return value
    ex.overrides[y] = override
    stores = []
    for t in ex.group.outputs:
        if g.type_of(t).shape != ys:
            raise ex.error(f"output {t!r} {list(g.type_of(t).shape)} is not of the Conv's shape {list(ys)}")
        off = f"n_img * {geo['m'] * geo['p']} + co * {geo['p']} + rm[:, None]"  # every tile row and column
        stores.append(f"tl.store({names(t)} + {off}, {ex.value(t, tile)}, mask=mask)")
    ops = " -> ".join(g.node_by_name[n].op for n in ex.group.nodes)
    summary = (f"Conv {core.name}: {list(g.type_of(core.inputs[0]).shape)} * {list(g.type_of(core.inputs[1]).shape)}"
               f" -> {list(ys)}, group {geo['groups']}, strides {list(win.strides)}, pads {list(win.pad_begin)}"
               f"+{list(win.pad_end)}, dilations {list(win.dilations)}; {ops}")
    return dict(template="conv_epilogue.py.j2", summary=c_comment_text(summary), x_ptr=names(core.inputs[0]),
                w_ptr=names(core.inputs[1]), body=ex.lines, stores=stores,
                grid=[geo["n_img"] * geo["groups"], f"triton.cdiv({geo['p']}, BM)", f"triton.cdiv({geo['mg']}, BN)"],
                configs=tile_configs(geo["p"], geo["mg"], geo["k"]), taps=geo["kh"] * geo["kw"],
                plane=geo["h"] * geo["w"], **geo)

