"""Conv with a fused epilogue (``conv_epilogue``): im2col + a matrix product per image and group,
epilogue per tile.

For each image and group the input is unfolded into a [C/g * taps, out positions] matrix (skipped
for 1x1 kernels with stride 1 and no padding; for 2-D convolutions with packed weights, each task
copies its input rows once, split by stride phase, and the taps are read in place), then output tiles of [channels x whole output rows]
are computed in parallel and, while each tile is in cache, the epilogue (bias, folded
BatchNormalization, Relu/Clip, residual Add, ...) runs on it. Constant weights with at least
PACKED_MIN_COLUMNS output channels per group are packed at build time and the tile is computed
transposed, [positions x channels] = cols^T @ W^T, by ``af_sgemm_packed``, then turned
channel-major (``af_transpose``) for the epilogue. A weight given at run time (training; a
gradient's Convs) can be packed into the same panels at the start of each call (``repack``, chosen
by the tuner against OpenBLAS); other weights go to OpenBLAS's sgemm. A dense 3x3 convolution with
stride 1 can compute its tile by Winograd F(2x2, 3x3) instead (codegen/winograd.py). 1-D and 3-D convolutions use the same code with unit leading
spatial axes.

A pooling op (MaxPool, AveragePool) after the convolution and its activation can be part of the
group: tasks are then blocks of pooled output rows, each computing the convolution rows its windows
reach (a block's first row repeats the previous block's last when windows overlap), and the pooled
values are the epilogue. The convolution's output, the largest tensor of a ResNet, is never stored. A
max-pool over Relu and Clip pools the raw values and applies them after (both never fall).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autofusion.codegen import index as ix
from autofusion.codegen.cores import CoreChoice, CoreSpec
from autofusion.codegen.gemm import PACK_NR, PACKED_MIN_COLUMNS, pack_weights, packed_for, slice_cols
from autofusion.codegen.index import Index
from autofusion.codegen.inliner import Block, Inliner, Misaligned, Override
from autofusion.codegen.kernel_context import KernelContext
from autofusion.codegen.loopnest import LoopNest, op_handlers
from autofusion.codegen.names import c_comment_text
from autofusion.codegen.sizes import TYPICAL_IMAGES, at_least, hint, typical
from autofusion.codegen.views import strided_view
from autofusion.codegen.winograd import MAX_WIDTH as WINOGRAD_MAX_WIDTH
from autofusion.codegen.winograd import TRANSFORMED, winograd_blocks, winograd_weights
from autofusion.graph.graph import Node
from autofusion.graph.types import DType
from autofusion.ops.common import ints
from autofusion.ops.spatial import Window, window

# Tasks of up to 256 output channels x about 256 output positions (whole output rows), each with its own
# im2col block, so that tasks need no barrier between them; channel blocks shrink to 64 until there are
# enough tasks to share among threads.
TILE_M = 256
TILE_P = 256
MIN_TILE_M = 64
MIN_TASKS = 4
# a depthwise task sums 9 or so products per position: blocks 16x as large, or scheduling them costs
# more than the sums (32 x 112 x 112 in blocks of 224 positions: 1,792 tasks, 0.29 ms)
DEPTHWISE_TILE_P = 4096
PARALLEL_MIN_FLOPS = 1 << 19
# a run-time weight with fewer K rows is left to OpenBLAS, also untuned: packing it per call and the
# packed kernel's passes cost more than they save (tuned, 16 images of 16x16 or 32x32: K = 27 0.73
# vs 0.21 ms, K = 64 0.26 vs 0.19; K = 128 0.29 vs 0.42, K = 256 0.41 vs 0.50)
REPACK_MIN_K = 128
# With a pooling epilogue, tasks of about 512 convolution output positions: rows shared by two
# blocks' windows are computed twice, so blocks are larger than without pooling.
POOL_TILE_P = 512
MAX_POOL_RECOMPUTE = 1.5  # blocks may compute at most this many convolution rows per output row


# taps cut a task's output positions into blocks of the micro-kernel's rows, across row ends
# (af_sgemm_packed_taps); a block of fewer rows has too few accumulators to cover the FMA latency (the
# AVX2 kernel's blocks of 3, 2.0x OpenBLAS at 7 x 7 when each row was cut alone): such tasks take im2col
TAPS_MIN_BLOCK = 4


def taps_block(positions: int, block_rows: int) -> int:
    """The smallest block af_sgemm_packed_taps cuts ``positions`` output positions into."""
    return positions // -(-positions // block_rows)


def taps_fit(width: int, rows: int, block_rows: int) -> bool:
    """Whether the taps kernel takes ``rows`` output rows of ``width`` positions: their blocks, cut
    across row ends, hold at least TAPS_MIN_BLOCK positions (7-wide rows: blocks of 6 over 7 rows
    with AVX2's 6-row kernel, where each row alone made 4 + 3)."""
    return taps_block(rows * width, block_rows) >= TAPS_MIN_BLOCK


# the window's numbers the template reads (see _Conv._geometry)
_TEMPLATE_GEOMETRY = ("groups", "mg", "kc", "im2col", "channels", "cg", "in_size", "taps", "kd", "kh", "kw", "p",
                      "id", "ih", "iw", "od", "oh", "ow", "sd", "sh", "sw", "dd", "dh", "dw", "pd", "ph", "pw")

# the bias of output channel ``ch``: a C expression (from a tensor, or folded at build time)
Bias = Callable[[str, Inliner, Block], str]


def _pad3(values: tuple[int, ...] | list[int], fill: int) -> list[int]:
    return [fill] * (3 - len(values)) + list(values)


class _Conv:
    def __init__(self, k: KernelContext, nodes: list[Node], core: Node,
                 materialized: Mapping[str, str] | None = None) -> None:
        self.k, self.g, self.core = k, k.graph, core
        self.materialized = dict(materialized or {})  # tensors an earlier stage already wrote
        self.loads: dict[str, Override] = {}
        for t, ptr in self.materialized.items():
            shape = self.g.types[t].shape
            self.loads[t] = (lambda p, sh: (lambda idx, block: f"{p}[{ix.linear(idx, sh)}]"))(ptr, shape)
        done = {n.name for n in nodes if n.outputs and all(o in self.materialized for o in n.outputs if o)}
        self.members = frozenset(n.name for n in nodes) - done
        self.non_core = self.members - {core.name}
        self.handlers = op_handlers(k.registry)
        self.y = core.outputs[0]  # the value the tiles compute (a folded BatchNormalization's output)
        self.x_nhwc = core.inputs[0] in k.channels_last  # the input handed over [N, H, W, C] (conv_layout.py)
        self.folded = False  # a BatchNormalization folded into the weights
        self.k_pass = 0  # K rows per pass of the packed kernel (the core choice's)
        self.runtime_pack: dict[str, Any] | None = None  # a weight given at run time, packed per call
        self.packed_check = ""  # the C check that the kernel reads a build-time packed weight's slices
        self.prologue: list[str] = []
        self.epilogue: list[str] = []
        k.uses_blas = True

    def _buffer(self, tensor: str) -> str:
        """A pointer to ``tensor`` laid out contiguously (computed into scratch when needed)."""
        if self.g.types[tensor].dtype != DType.FLOAT32:
            raise self.k.error(f"Conv operands must be float32, {tensor!r} is {self.g.types[tensor].dtype}", self.core)
        view = strided_view(self.g, self.non_core, tensor, lambda t: self.materialized.get(t) or self.k.pointer(t),
                            self.k.registry)
        if view is not None and view.contiguous:
            return view.ptr if view.offset == 0 else f"({view.ptr} + {view.offset})"
        off = self.k.scratch(self.g.types[tensor].nbytes)
        ptr = f"((float*)(scratch + {off}))"
        self.prologue.append(self._nest().render([(tensor, ptr)]))
        return ptr

    def _nest(self, overrides: Mapping[str, Override] | None = None) -> LoopNest:
        return LoopNest(self.k, self.non_core, overrides={**self.loads, **(overrides or {})}, handlers=self.handlers)

    def _depends_on_core(self, tensor: str, seen: dict[str, bool]) -> bool:
        if tensor in seen:
            return seen[tensor]
        node = self.g.producers.get(tensor)
        hit = False
        if node is not None and node.name in self.members:
            hit = node is self.core or node.name == self.core.name or any(
                self._depends_on_core(t, seen) for t in node.inputs if t)
        seen[tensor] = hit
        return hit

    def render(self, only_into: str = "") -> str:
        """The kernel body; with ``only_into``, just the convolution (and bias) into that buffer."""
        geo = self._geometry()
        x_ptr = self._buffer(self.core.inputs[0])
        weight, bias, y = self._weight_and_bias(only_into)
        outputs = [] if only_into else list(self.k.group.outputs)
        pool = None if only_into else self._pooling(y, outputs)
        choice = self._choose(geo, weight, pool)
        if self.x_nhwc and (not geo["im2col"] or choice.impl == "depthwise"):
            raise self.k.error("a channels-last input is read through a slab or im2col only (conv_layout.py hands "
                               "over inputs of strided, dense convolutions)", self.core)
        w_ptr = self._weight_pointer(geo, weight, choice)
        self.y = y
        if pool is not None:
            with contextlib.suppress(Misaligned):  # the pooling op's input is not elementwise in the tile: below
                return self._render_pooled(pool, y, bias, choice, w_ptr, x_ptr, outputs, geo)
        return self._render_tiles(geo, choice, bias, x_ptr, w_ptr, outputs, only_into)

    def _geometry(self) -> dict[str, Any]:
        """The convolution's sizes as 3-D (depth, height, width) numbers, for the template and the tiles."""
        core, g = self.core, self.g
        xs, ws = g.types[core.inputs[0]].shape, g.types[core.inputs[1]].shape
        spatial = len(xs) - 2
        if spatial < 1 or spatial > 3:
            raise self.k.error(f"Conv with {spatial} spatial axes is not supported", core)
        if not all(isinstance(d, int) for d in (*xs[1:], *ws)):  # the batch alone may be known at run time
            raise self.k.error(f"Conv with symbolic channels or image sizes ({list(xs)} * {list(ws)}) takes fixed "
                               "sizes only so far: bind the plan first", core)
        groups = int(core.attr("group", 1))
        win = window(xs[2:], ints(core.attr("kernel_shape") or ws[2:]), core.attrs.get)
        geo: dict[str, Any] = dict(xs=xs, ws=ws, win=win, groups=groups, n_img=xs[0], channels=xs[1], m=ws[0],
                                   cg=xs[1] // groups, mg=ws[0] // groups)
        for names, values, fill in ((("id", "ih", "iw"), xs[2:], 1), (("kd", "kh", "kw"), win.kernel, 1),
                                    (("od", "oh", "ow"), win.out, 1), (("sd", "sh", "sw"), win.strides, 1),
                                    (("dd", "dh", "dw"), win.dilations, 1), (("pd", "ph", "pw"), win.pad_begin, 0)):
            geo.update(zip(names, _pad3(list(values), fill)))
        geo["taps"] = geo["kd"] * geo["kh"] * geo["kw"]
        geo["kc"], geo["p"] = geo["cg"] * geo["taps"], geo["od"] * geo["oh"] * geo["ow"]
        geo["in_size"] = geo["id"] * geo["ih"] * geo["iw"]
        unit = (geo["taps"] == 1 and (geo["sd"], geo["sh"], geo["sw"]) == (1, 1, 1)
                and (geo["pd"], geo["ph"], geo["pw"]) == (0, 0, 0) and tuple(win.pad_end) == (0,) * spatial)
        geo["im2col"] = not unit  # a 1x1 kernel, stride 1, no padding: the input is the matrix
        return geo

    def _weight_and_bias(self, only_into: str) -> tuple[np.ndarray | None, Bias | None, str]:
        """The weight (BatchNormalization folded in where it can be), the bias and the tensor the tiles
        compute (the folded BatchNormalization's output, else the convolution's)."""
        core, g = self.core, self.g
        w_t, bias_t = core.inputs[1], core.inputs[2] if len(core.inputs) > 2 else ""
        bias: Bias | None = None
        if bias_t:
            bias = lambda ch, inl, block: inl.value(bias_t, (ch,), block)  # noqa: E731
        bn = None if only_into else self._foldable_batchnorm(core.outputs[0], bias_t)
        if bn is None:
            return g.const_value(w_t), bias, core.outputs[0]
        weight, bias = self._fold(bn, w_t, bias_t)  # BatchNormalization folded at build time
        self.non_core = self.non_core - {bn.name}
        self.folded = True
        return weight, bias, bn.outputs[0]

    def _choose(self, geo: dict[str, Any], weight: np.ndarray | None, pool: Node | None) -> CoreChoice:
        """The core implementation the chooser picks among those this convolution can take."""
        win, mg = geo["win"], geo["mg"]
        # depthwise and other narrow groups stay on sgemm: their panels would be mostly padding
        packable = weight is not None and weight.dtype == np.float32 and mg >= PACKED_MIN_COLUMNS
        # a weight given at run time (training, a gradient's Convs) packed into the same panels per call
        repackable = (weight is None and pool is None and mg >= PACKED_MIN_COLUMNS and geo["kc"] >= REPACK_MIN_K
                      and self.g.types[self.core.inputs[1]].dtype == DType.FLOAT32)
        xs_at = (typical(geo["xs"][0], TYPICAL_IMAGES), *geo["xs"][1:])  # a symbolic batch at a typical call
        geometry = (xs_at, tuple(geo["ws"]), tuple(win.strides), tuple(win.pad_begin) + tuple(win.pad_end),
                    tuple(win.dilations), (geo["groups"],))
        # one plane (no depth, no depth padding, no negative pads, which crop): split into its stride phases, the padded
        # input makes output positions an affine walk for every tap, so the taps can be read in place
        # rows too short for row blocks of their own take taps with blocks across row ends only with
        # stride 1, where im2col copies the input once per tap (7 x 7, 3x3: 0.81-0.89x im2col's time;
        # stride 2 0.99-1.13x, 1x1 stride 2 1.09-1.26x; Zen 3, in the model, measured when such blocks
        # still computed the padding columns between rows), and without a pooling epilogue
        joined_rows = geo["oh"] if pool is None and (geo["sh"], geo["sw"]) == (1, 1) else 1
        direct_ok = ((packable or repackable) and geo["im2col"] and geo["od"] == 1 and geo["kd"] == 1 and geo["pd"] == 0
                     and taps_fit(geo["ow"], joined_rows, self.k.chooser.machine.micro_kernel[0])
                     and min(win.pad_begin + win.pad_end) >= 0)
        depthwise_ok = mg == 1 and geo["cg"] == 1 and pool is None
        winograd_ok = (packable and pool is None and geo["groups"] == 1 and geo["od"] == 1 and geo["kd"] == 1
                       and geo["pd"] == 0 and (geo["kh"], geo["kw"], geo["sh"], geo["sw"], geo["dh"], geo["dw"])
                       == (3, 3, 1, 1, 1, 1) and min(win.pad_begin + win.pad_end) >= 0
                       and geo["ow"] <= WINOGRAD_MAX_WIDTH and not self.x_nhwc)
        choice = self.k.core(CoreSpec("conv", geo["p"], mg, geo["kc"], packable, calls=xs_at[0] * geo["groups"],
                                      geometry=geometry, taps=direct_ok, depthwise=depthwise_ok,
                                      repackable=repackable, winograd=winograd_ok))
        self.k_pass = choice.kc
        if choice.impl == "repack":  # from here on a packed weight, whose panels the kernel fills first
            self.runtime_pack = {}
            return CoreChoice("taps" if direct_ok else "packed", choice.kc)
        return choice

    def _weight_pointer(self, geo: dict[str, Any], weight: np.ndarray | None, choice: CoreChoice) -> str:
        core, mg, kc = self.core, geo["mg"], geo["kc"]
        if self.runtime_pack is not None:  # each group's W^T into panels in scratch, at the kernel's start
            w_group = -(-mg // PACK_NR) * PACK_NR * kc
            offset = self.k.scratch(geo["groups"] * w_group * 4)
            self.runtime_pack.update(source=self._buffer(core.inputs[1]), offset=offset,
                                     panels=-(-mg // PACK_NR))
            return "wpack"
        if choice.packed:  # each group's W^T [C/g * taps, M/g] packed into column panels: tiles compute out^T
            cols = slice_cols(self.k)
            self.packed_check = packed_for(cols)
            if choice.impl == "winograd":  # U = G W G^T: 16 matrices [C x M], each packed so
                u = winograd_weights(np.asarray(weight, np.float32))
                return self.k.derived_constant(f"{core.name}_winograd", np.concatenate(
                    [pack_weights(u[i, j].T, cols) for i in range(4) for j in range(4)]))
            return self.k.derived_constant(f"{core.name}_packed", np.concatenate(
                [pack_weights(wg.reshape(mg, kc).T, cols) for wg in np.split(np.asarray(weight), geo["groups"])]))
        if self.folded and weight is not None:  # the folded weights, as sgemm reads them
            return self.k.derived_constant(f"{core.name}_folded", np.asarray(weight, np.float32))
        return self._buffer(core.inputs[1])

    def _render_tiles(self, geo: dict[str, Any], choice: CoreChoice, bias: Bias | None, x_ptr: str, w_ptr: str,
                      outputs: list[str], only_into: str) -> str:
        """The kernel without a pooling epilogue: tasks of channel blocks x whole output rows."""
        k, g, y = self.k, self.g, self.y
        packed, depthwise = choice.packed, choice.impl == "depthwise"
        ys = g.types[y].shape
        aligned, late, early, ybuf = self._place_outputs(outputs, only_into, bias is not None or packed)
        if early:
            self.prologue.append(self._nest().render(early))
        p, ow, mg = geo["p"], geo["ow"], geo["mg"]
        # about a MIN_TASKS-th of the image's positions a task, while its tile takes at most an eighth of
        # L2 (it is turned into a second one): fewer slab rows copied twice (ResNet's 56 x 56 layer on a
        # 2 MiB L2: 4 tasks of 14 rows, 16 input rows each, not 14 of 4 reading 6; its convolutions
        # 0.96-0.97x the time in the model, Xeon; Zen 3's 512 KiB keeps tasks of TILE_P)
        tile_floats = self.k.chooser.machine.l2 // 32
        target = (DEPTHWISE_TILE_P if depthwise
                  else max(TILE_P, min(hint(p) // MIN_TASKS, tile_floats // min(hint(mg), TILE_M))))
        rows_per_tile = max(1, target // ow)
        rows_per_tile = -(-(p // ow) // -(-(p // ow) // rows_per_tile))  # equal blocks: 28 rows are 4 x 7, not 9+9+9+1
        wino = None
        if choice.impl == "winograd":  # tasks of whole 2x2 tiles, sized so that their transforms stay in L2
            wino = winograd_blocks(geo["oh"], ow, geo["iw"], geo["pw"], geo["cg"], min(mg, TILE_M),
                                   self.k.chooser.machine.l2)
            rows_per_tile = wino.task_rows
        pb = min(p, ow * rows_per_tile)
        mb = _channel_block(mg, typical(geo["n_img"], TYPICAL_IMAGES) * geo["groups"] * -(-p // pb), packed)
        tiles_m, tiles_p = -(-mg // max(mb, 1)), -(-p // max(pb, 1))
        direct = None
        if choice.taps:  # each task's slab: its input rows, zero-padded and split by stride phase
            direct = tap_slab(geo["cg"], pb // ow, ow, (geo["kh"], geo["kw"]), (geo["sh"], geo["sw"]),
                              (geo["dh"], geo["dw"]), self.x_nhwc)
        lost = [t for t in outputs if t in k.channels_last and t not in dict(aligned)]
        if lost:  # (conv_layout.py hands over only what the tile epilogue writes)
            raise k.error(f"{lost[0]!r} was to be written channels-last by the tile epilogue, which does not compute it",
                          self.core)
        # a tensor handed to the next convolution channels-last is written as the tile holds it, [positions x
        # channels]: no transpose, the epilogue over each position's channels
        positions_outer = packed and any(t in k.channels_last for t, _ in aligned)
        if packed:  # the product's tile is [positions x channels]; the epilogue reads it turned channel-major
            assert tiles_m == 1 or mb % PACK_NR == 0, (mg, mb)
            c_ptr, ldc = ("tile" if positions_outer else "tile_t"), pb  # (read as the product left it: no tile_t)
        elif ybuf:
            c_ptr, ldc = f"{ybuf} + (n * {geo['m']} + gi * {mg} + m0) * {p} + p0", p
        else:
            c_ptr, ldc = "tile", pb
        body = self._tile_body(aligned, ybuf, bias, ldc, packed, mb if positions_outer else 0)
        sp_dims = list(range(2, len(ys)))
        row_lines = [f"const int64_t i{d} = {e};" for d, e in zip(sp_dims[:-1], ix.delinear("srow", list(ys[2:-1])))
                     if ys[d] != 1]
        col_lines = [f"const int64_t i{sp_dims[-1]} = ow;"] if ys[-1] != 1 else ["(void)ow;"]
        if late:
            over: dict[str, Override] = {y: lambda ix_, blk: f"{ybuf}[{ix.linear(ix_, ys)}]"}
            self.epilogue.append(self._nest(over).render(late))
        parallel = at_least(2 * geo["n_img"] * geo["m"] * p * geo["kc"], PARALLEL_MIN_FLOPS)  # per call: batch
        im2col, kc = geo["im2col"], geo["kc"]
        # one image, one group, one block of positions: every channel block needs the same im2col matrix
        # (or taps' slab), computed once by all threads into scratch instead of once per task (ResNet's
        # 14 x 14 stride-2 layer: 4 tasks each copying all 460 KB of its slab, 16 % of the kernel under perf)
        shared_input = (parallel is True and geo["n_img"] == 1 and geo["groups"] == 1 and tiles_p == 1
                        and tiles_m > 1)
        shared_col = (k.scratch(kc * p * 4) if shared_input and im2col and direct is None and not depthwise
                      and wino is None else None)
        shared_slab = k.scratch(direct.slab_bytes) if shared_input and direct is not None else None
        tile_floats = mb * pb if packed or not ybuf else 0
        col_floats = kc * pb if im2col and direct is None and not depthwise and shared_col is None else 0
        if direct is not None:  # the slab and the offset table take the im2col block's place
            col_floats = ((0 if shared_slab is not None else direct.slab_bytes) + kc * 4) // 4
        if wino is not None:  # the task's transformed input and its 16 products take it
            col_floats = TRANSFORMED * wino.tiles * (geo["cg"] + mb)
        col_bytes, tile_bytes = _blocks(k, col_floats, tile_floats, 2 if c_ptr == "tile_t" else 1)  # (and tile_t)
        ops = " -> ".join(g.node_by_name[nm].op for nm in k.group.nodes)
        panel_cols = -(-mg // PACK_NR) * PACK_NR  # a group's packed weight columns (padded to whole panels)
        how = ("Winograd F(2x2, 3x3)" if wino else "taps read in place" if direct
               else "im2col " + ("yes" if im2col else "no"))
        return k.templates.render(
            "conv_epilogue.c.j2", k_pass=self.k_pass, winograd=wino,
            u_size=panel_cols * geo["cg"],
            comment=c_comment_text(f"Conv {self.core.name}: {list(geo['xs'])} * {list(geo['ws'])} -> {list(ys)}, "
                                   f"group {geo['groups']}, {how}; epilogue per tile: {ops}"),
            direct=direct, depthwise=depthwise, prologue=self.prologue, epilogue=self.epilogue,
            parallel=parallel, shared_col=shared_col, shared_slab=shared_slab, tile_floats=tile_floats,
            col_bytes=col_bytes,
            tile_bytes=tile_bytes, packed=packed, packed_check=self.packed_check, w_group=panel_cols * kc, batch=geo["n_img"],
            x_ptr=x_ptr, tiles_m=tiles_m, tiles_p=tiles_p, mb=mb, pb=pb, c_ptr=c_ptr, tile_t=c_ptr == "tile_t", ldc=ldc, w_ptr=w_ptr,
            body=body.lines, row_lines=row_lines, col_lines=col_lines, pool=None, runtime_pack=self.runtime_pack,
            positions_outer=positions_outer, x_nhwc=self.x_nhwc,
            **{key: geo[key] for key in _TEMPLATE_GEOMETRY})

    def _place_outputs(self, outputs: list[str], only_into: str, through_tile: bool
                       ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]], str]:
        """(aligned, late, early, ybuf): outputs written per tile, after the tiles, before them (they
        do not depend on the convolution), and the buffer the convolution's own values go to."""
        k, g, y = self.k, self.g, self.y
        aligned, late, early = [], [], []
        for t in outputs:
            dest = k.pointer(t)
            if not self._depends_on_core(t, {}):
                early.append((t, dest))
            elif self._aligned(t, 1):
                aligned.append((t, dest))
            else:
                late.append((t, dest))
        ybuf = ""
        if only_into:
            ybuf = only_into
            if through_tile:
                aligned.append((y, ybuf))
        elif y in outputs and y not in k.channels_last:  # (a channels-last one is written from the tile)
            ybuf = k.pointer(y)
        elif late:
            ybuf = f"((float*)(scratch + {k.scratch(g.types[y].nbytes)}))"
            if through_tile:
                aligned.insert(0, (y, ybuf))
        return aligned, late, early, ybuf

    def _tile_body(self, aligned: list[tuple[str, str]], ybuf: str, bias: Bias | None, ldc: int,
                   packed: bool, tile_rows: int = 0) -> Block:
        """The epilogue per element of a tile: each aligned output computed from the tile's value (with
        ``tile_rows``, read from the tile as the product left it, [positions x tile_rows channels]);
        a channels-last output written [N, H, W, C]."""
        y, ys = self.y, self.g.types[self.y].shape
        inl = Inliner(self.k, self.non_core, self.handlers, overrides=dict(self.loads))
        inl.overrides[y] = self._tile_override(ldc, ys[-1], bias, inl, tile_rows)
        body = Block()
        idx = self._y_index()
        for t, dest in aligned:
            if t == y and bias is None and dest == ybuf and not packed:
                continue
            v = inl.value(t, idx, body)
            at = (ix.linear((idx[0], *idx[2:], idx[1]), (ys[0], *ys[2:], ys[1])) if t in self.k.channels_last
                  else ix.linear(idx, ys))
            body.emit(f"{dest}[{at}] = {v};")
        return body

    def _pooling(self, y: str, outputs: list[str]) -> Node | None:
        """The pooling op of the group whose windows the tiles can feed: 2-D, over the convolution
        (through pointwise ops only), with every group output computed from its output."""
        g = self.g
        pools = [g.node_by_name[n] for n in self.non_core if self.k.registry[g.node_by_name[n].op].pooling]
        if len(pools) != 1 or len(g.types[y].shape) != 4:
            return None
        pool = pools[0]
        indices = [o for o in pool.outputs[1:] if o and (o in outputs or g.consumers.get(o))]
        if indices or not pool.outputs[0] or not self._depends_on_core(pool.inputs[0], {}):
            return None
        shape = g.types[pool.outputs[0]].shape
        if any(g.types[t].shape != shape or not self._after(t, pool.outputs[0]) for t in outputs):
            return None
        return pool

    def _after(self, tensor: str, source: str) -> bool:
        """Whether ``tensor`` is ``source`` or computed from it inside the group."""
        if tensor == source:
            return True
        node = self.g.producers.get(tensor)
        return node is not None and node.name in self.non_core and any(
            self._after(t, source) for t in node.inputs if t)

    def _render_pooled(self, pool: Node, y: str, bias: Bias | None, choice: CoreChoice, w_ptr: str, x_ptr: str,
                       outputs: list[str], geo: dict[str, Any]) -> str:
        """The kernel when a pooling op follows: tasks are blocks of pooled rows (see the module doc)."""
        k, g, packed = self.k, self.g, choice.packed
        ys, ps = g.types[y].shape, g.types[pool.outputs[0]].shape
        pw_ = window(ys[2:], ints(pool.attr("kernel_shape")), pool.attrs.get, bool(pool.attr("ceil_mode", 0)))
        oh, ow = ys[2], ys[3]
        stride, pad, reach = pw_.strides[0], pw_.pad_begin[0], (pw_.kernel[0] - 1) * pw_.dilations[0] + 1
        poh = ps[2]
        mg, n_img, groups = geo["mg"], typical(geo["n_img"], TYPICAL_IMAGES), geo["groups"]  # for choosing blocks

        def rows_of(blk: int) -> int:  # convolution rows a block of blk pooled rows reaches
            return min(oh, (blk - 1) * stride + reach)

        def recomputed(blk: int) -> float:  # convolution rows computed per row of its output
            return -(-poh // blk) * rows_of(blk) / oh

        prb = max(1, min(poh, POOL_TILE_P // max(1, ow * stride)))
        while prb < poh and recomputed(prb) > MAX_POOL_RECOMPUTE:
            prb += 1  # rows shared by neighbouring blocks' windows are computed twice: fewer, larger blocks
        while prb > 1 and n_img * groups * -(-poh // prb) < MIN_TASKS and recomputed(-(-prb // 2)) <= MAX_POOL_RECOMPUTE:
            prb = -(-prb // 2)  # enough blocks for every thread
        rows = rows_of(prb)
        pb = rows * ow
        mb = _channel_block(mg, n_img * groups * -(-poh // prb), packed)
        tiles_m = -(-mg // mb)
        ldc = pb  # the tile, or with a packed weight tile_t: [channel x position]
        pool_in = pool.inputs[0]
        separable = self._separable_max(pool, pw_, outputs)
        prepass = Block()
        if packed and separable is not None and self._rising_path(y, pool_in):
            # the max of what rises with the convolution's value is what rises with its max: the tile is
            # turned straight into pin, raw, and the activation runs on the pooled values, a quarter of
            # them (ResNet-18's stem: one pass over its 3.2 MB output fewer)
            post_inl = Inliner(k, self.non_core, self.handlers, overrides=dict(self.loads))
            post_inl.overrides[y] = lambda idx, block: "best" + (f" + {bias(idx[1], post_inl, block)}" if bias else "")
            post = Block()
            separable = {**separable, "post": post_inl.value(pool_in, self._y_index(), post), "post_lines": post.lines}
        else:  # pass 1, per tile element: the pooling op's input (bias, activation...) into pin, [channel x position]
            inl = Inliner(k, self.non_core, self.handlers, overrides=dict(self.loads))
            inl.overrides[y] = self._tile_override(ldc, ow, bias, inl)
            prepass.emit(f"pinw[mi * {pb} + q * {ow} + ow] = {inl.value(pool_in, self._y_index(), prepass)};")
        # pass 2, per pooled element: the window over pin (and whatever follows the pooling op)
        expected = self._y_index()[:2]

        def rows_of_pin(idx: Index, block: Block) -> str:
            if tuple(idx[:2]) != expected:
                raise Misaligned(self.core.name)
            return f"pin[mi * {pb} + (({idx[2]}) - crow0) * {ow} + ({idx[3]})]"

        def not_in_pass_2(idx: Index, block: Block) -> str:
            raise Misaligned(self.core.name)  # an output reads the convolution beside the pooling op: not pooled

        inl = Inliner(k, self.non_core, self.handlers,
                      overrides={**self.loads, y: not_in_pass_2, pool_in: rows_of_pin})
        body = Block()
        idx: Index = tuple("0" if n == 1 else f"i{d}" for d, n in enumerate(ps))
        for t in outputs:
            body.emit(f"{k.pointer(t)}[{ix.linear(idx, ps)}] = {inl.value(t, idx, body)};")
        ops = " -> ".join(g.node_by_name[nm].op for nm in k.group.nodes)
        chunks = -(-poh // prb)
        # blocks of pooled rows in stripes, one task each, enough for the threads (a stripe's blocks
        # carry their shared rows over; only a stripe's first block computes them again)
        stripes = min(chunks, -(-MIN_TASKS // (n_img * groups * tiles_m)))  # per image, group and channel block
        per = -(-chunks // stripes)
        xs, ws = geo["xs"], geo["ws"]
        parallel = at_least(2 * geo["n_img"] * geo["m"] * geo["p"] * geo["kc"], PARALLEL_MIN_FLOPS)
        direct = None
        col_floats = geo["kc"] * pb if geo["im2col"] else 0
        if choice.taps:  # the block's input rows, read in place (see _render_tiles)
            direct = tap_slab(geo["cg"], rows, ow, (geo["kh"], geo["kw"]), (geo["sh"], geo["sw"]), (geo["dh"], geo["dw"]),
                              self.x_nhwc)
            col_floats = (direct.slab_bytes + geo["kc"] * 4) // 4
        c_ptr = ("pinw" if separable and "post" in separable else "tile_t") if packed else "tile"
        col_bytes, tile_bytes = _blocks(k, col_floats, mb * pb, 3 if c_ptr == "tile_t" else 2)  # tile, pin (and tile_t)
        how = "taps read in place" if direct else "im2col " + ("yes" if geo["im2col"] else "no")
        return k.templates.render(
            "conv_epilogue.c.j2", k_pass=self.k_pass, direct=direct, depthwise=False, runtime_pack=None, winograd=None,
            comment=c_comment_text(f"Conv {self.core.name}: {list(xs)} * {list(ws)} -> {list(ys)}, group {groups}, "
                                   f"{how}; epilogue per tile: {ops} "
                                   f"-> {list(ps)}, {prb} pooled rows per task"),
            prologue=self.prologue, epilogue=[], parallel=parallel, shared_col=None,
            shared_slab=None,
            tile_floats=mb * pb, col_bytes=col_bytes, tile_bytes=tile_bytes, packed=packed, packed_check=self.packed_check, w_group=-(-mg // PACK_NR) * PACK_NR * geo["kc"],
            batch=geo["n_img"], tiles_m=tiles_m, tiles_p=-(-chunks // per), mb=mb, pb=pb,
            c_ptr=c_ptr, tile_t=c_ptr == "tile_t",
            ldc=ldc, channels_out=geo["m"],
            w_ptr=w_ptr, x_ptr=x_ptr, body=prepass.lines, row_lines=["const int64_t i2 = srow;", "(void)i2;"],
            col_lines=["const int64_t i3 = ow;", "(void)i3;"],
            pool=dict(rows=prb, out_rows=poh, out_cols=ps[3], stride=stride, pad=pad, reach=reach, body=body.lines,
                      chunks=chunks, per=per, separable=separable),
            positions_outer=False, x_nhwc=self.x_nhwc,
            **{key: geo[key] for key in _TEMPLATE_GEOMETRY})

    def _rising_path(self, y: str, tensor: str) -> bool:
        """Whether ``tensor`` is ``y`` through the group's Relu and constant-bounded Clip ops only: each
        never falls as its input rises, so a max taken before them equals one taken after."""
        while tensor != y:
            node = self.g.producers.get(tensor)
            if (node is None or node.name not in self.non_core or node.op not in ("Relu", "Clip")
                    or not all(self.g.is_const(t) for t in node.inputs[1:] if t)):
                return False
            tensor = node.inputs[0]
        return True

    def _separable_max(self, pool: Node, w: Window, outputs: list[str]) -> dict[str, Any] | None:
        """What the template's separable max-pool pass needs, when it computes the group's one output:
        a 2-D MaxPool without indices or dilation whose output is the group's only output."""
        if (pool.op != "MaxPool" or outputs != [pool.outputs[0]] or len(w.kernel) != 2 or any(d != 1 for d in w.dilations)
                or self.g.types[pool.outputs[0]].dtype != DType.FLOAT32):
            return None
        return dict(out=self.k.pointer(pool.outputs[0]), kw=w.kernel[1], sw=w.strides[1], pw=w.pad_begin[1])

    def _foldable_batchnorm(self, y: str, bias_t: str) -> Node | None:
        """The BatchNormalization that alone consumes the convolution, with every parameter constant."""
        g = self.g
        users = g.consumers.get(y, ())
        if len(users) != 1 or users[0].op != "BatchNormalization" or users[0].name not in self.members:
            return None
        bn = users[0]
        params = [g.const_value(t) for t in bn.inputs[1:5]]
        if (y in self.k.group.outputs or bn.inputs[0] != y or any(p is None for p in params)
                or not g.is_const(self.core.inputs[1]) or (bias_t and not g.is_const(bias_t))
                or len([o for o in bn.outputs if o]) != 1):
            return None
        return bn

    def _fold(self, bn: Node, w_t: str, bias_t: str) -> tuple[np.ndarray, Bias]:
        """Weights W * inv (packed by the caller) and bias (b - mean) * inv + beta, a constant, where
        inv = scale / sqrt(var + eps)."""
        g = self.g
        scale, beta, mean, var = (np.asarray(g.const_value(t), np.float32) for t in bn.inputs[1:5])
        with np.errstate(all="ignore"):
            inv = (scale / np.sqrt(var + np.float32(bn.attr("epsilon", 1e-5)))).astype(np.float32)
        w = np.asarray(g.const_value(w_t), np.float32)
        b = np.asarray(g.const_value(bias_t), np.float32) if bias_t else np.zeros(w.shape[0], np.float32)
        w_fold = (w * inv.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        b_fold = ((b - mean) * inv + beta).astype(np.float32)
        b_ptr = self.k.derived_constant(f"{bn.name}_folded_bias", b_fold)
        return w_fold, lambda ch, inl, block: f"{b_ptr}[{ch}]"

    def _y_index(self) -> Index:
        ys = self.g.types[self.y].shape
        return tuple("0" if n == 1 else f"i{d}" for d, n in enumerate(ys))

    def _tile_override(self, ldc: int, ow: int, bias: Bias | None, inl: Inliner, tile_rows: int = 0) -> Override:
        expected = self._y_index()

        def override(idx: Index, block: Block) -> str:
            if tuple(idx) != expected:
                raise Misaligned(self.core.name)
            expr = f"tile[(q * {ow} + ow) * {tile_rows} + mi]" if tile_rows else f"c[mi * {ldc} + q * {ow} + ow]"
            if bias is not None:
                expr += f" + {bias(idx[1], inl, block)}"
            return expr

        return override

    def _aligned(self, tensor: str, ldc: int) -> bool:
        y = self.y
        if self.g.types[tensor].shape != self.g.types[y].shape:
            return False
        if self._nest().reductions_behind(tensor):
            return False
        inl = Inliner(self.k, self.non_core, self.handlers, overrides=dict(self.loads))
        inl.overrides[y] = self._tile_override(ldc, 1, None, inl)
        try:
            inl.value(tensor, self._y_index(), Block())
        except Misaligned:
            return False
        return True


@dataclass(frozen=True)
class TapSlab:
    """A task's input rows laid out so that every tap of a strided convolution is read in place.

    The padded input is split into planes by (row phase, column phase) modulo the strides, keeping
    only the phases some tap reads: plane (a, b) holds rows a, a + sh, ... and columns b, b + sw, ...
    Output position (row r, column c) under tap (i, j) then reads plane ((i*dh) % sh, (j*dw) % sw) at
    row r + (i*dh) // sh, column c + (j*dw) // sw: consecutive positions are consecutive floats at a
    pitch of ``width`` per output row, as af_sgemm_packed_taps walks them. Stride 1 is one plane.
    """

    channels: int
    rows: int  # rows of each plane
    width: int  # floats per row of a plane: the output width plus the taps' reach beyond it
    row_phases: tuple[int, ...]
    col_phases: tuple[int, ...]
    offsets: tuple[tuple[int, int, int], ...]  # per tap (kh, kw): (plane, row, column) it starts at
    pitch: int = 0  # channels innermost (a channels-last input): floats from one position to the next; 0: channel-major

    @property
    def plane(self) -> int:
        return self.rows * self.width

    @property
    def channel(self) -> int:
        """Positions of one channel in the slab (with channels innermost: positions in all)."""
        return len(self.row_phases) * len(self.col_phases) * self.plane

    @property
    def slab_bytes(self) -> int:
        return -(-self.channel * (self.pitch or self.channels) * 4 // 64) * 64


def position_pitch(channels: int) -> int:
    """Floats per position of a channels-last slab: the channels and one cache line more, so that
    positions are not a multiple of 4 KiB apart (at 256 and 512 channels every 4th or 2nd was, and a
    block's positions and rows fell into a few of L1's 64 sets: ResNet's 3x3 convolutions of those
    widths, fed channels-last, 1.13-1.17x the time of channel-major slabs, 1.07x with the padding;
    Xeon with AVX-512). One more float instead of a line: 1.27x."""
    return -(-channels // 16) * 16 + 16


def slab_pitch(ow: int, kw: int, sw: int, dw: int) -> int:
    """Floats per row of a TapSlab plane: the output width plus the taps' reach beyond it."""
    return ow + (kw - 1) * dw // sw


def tap_slab(channels: int, out_rows: int, ow: int, kernel: tuple[int, int], strides: tuple[int, int],
             dilations: tuple[int, int], channels_last: bool = False) -> TapSlab:
    """The slab for blocks of ``out_rows`` output rows of width ``ow`` (see :class:`TapSlab`); with
    ``channels_last``, each position's channels together (a channels-last input)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    row_phases = tuple(sorted({i * dh % sh for i in range(kh)}))
    col_phases = tuple(sorted({j * dw % sw for j in range(kw)}))
    offsets = tuple((row_phases.index(i * dh % sh) * len(col_phases) + col_phases.index(j * dw % sw),
                     i * dh // sh, j * dw // sw) for i in range(kh) for j in range(kw))
    return TapSlab(channels, out_rows + (kh - 1) * dh // sh, slab_pitch(ow, kw, sw, dw), row_phases, col_phases,
                   offsets, position_pitch(channels) if channels_last else 0)


def _channel_block(mg: int, tasks: int, packed: bool) -> int:
    """Output channels per task: up to TILE_M, halved down to MIN_TILE_M until ``tasks`` blocks of
    positions times the channel blocks are enough for every thread (each redoes its im2col block:
    cheap); with packed weights, whole panels."""
    mb = max(1, min(mg, TILE_M))
    while tasks * -(-mg // mb) < MIN_TASKS and mb > MIN_TILE_M:
        mb = max(MIN_TILE_M, mb // 2)
    if packed and mb < mg:  # channel blocks start on panel boundaries
        mb = -(-mb // PACK_NR) * PACK_NR
    return mb


def _blocks(k: KernelContext, col_floats: int, tile_floats: int, tiles: int) -> tuple[int, int]:
    """Bytes of the im2col block and of each tile in the thread's block (af_thread_block), counted."""
    col_bytes, tile_bytes = (-(-4 * col_floats // 64) * 64, -(-4 * tile_floats // 64) * 64)
    k.per_thread(col_bytes + tiles * tile_bytes)
    return col_bytes, tile_bytes


def render_conv(k: KernelContext, nodes: list[Node], core: Node) -> str:
    """Body of a ``conv_epilogue`` group around ``core``."""
    if math.prod(k.graph.types[core.outputs[0]].shape) == 0:
        return "/* empty output */"
    return _Conv(k, nodes, core).render()


def render_conv_core(k: KernelContext, nodes: list[Node], core: Node, ybuf: str,
                     materialized: Mapping[str, str]) -> str:
    """Just the convolution ``core`` (with its bias) into ``ybuf``, inside a multi-core kernel."""
    if math.prod(k.graph.types[core.outputs[0]].shape) == 0:
        return "/* empty output */"
    return _Conv(k, nodes, core, materialized).render(only_into=ybuf)
