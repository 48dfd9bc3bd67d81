"""LSTMs as one Triton kernel each: the ONNX LSTM op, and an LSTM cell unrolled over time steps
(``lstm_scan``, the cell rules/rnn.fuse finds; see codegen/lstm_cells.py).

The LSTM op: one program per direction and batch row, looping over time.

A row's recurrence needs nothing from other rows, so each program keeps its hidden and cell state in
registers across the steps and its direction's weights loaded once; each step loads the step's input
and computes the four gates (ONNX order i, o, f, c) as row-times-matrix sums over the input and
recurrent weights, then the cell. Rendered:
forward, reverse and bidirectional, optional biases and initial states, the default activations
(sigmoid, tanh, tanh), every output. Anything else (sequence lengths, peepholes, coupled
input and forget gates, other activations, batch-first layout, a hidden or input size over
MAX_SIZE) is a CodegenError and runs the reference way.
"""

from __future__ import annotations

from autofusion.codegen.lstm_cells import cell_steps, step_input
from autofusion.codegen.names import NameTable, c_comment_text
from autofusion.codegen.triton.configs import warps_configs
from autofusion.codegen.triton.exprs import Exprs
from autofusion.graph.graph import Node
from autofusion.graph.types import DType

MAX_SIZE = 256  # one program holds a gate's [hidden x input] block of weights
DEFAULT_ACTIVATIONS = ("sigmoid", "tanh", "tanh")


def _block(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _unsupported(node: Node) -> str | None:
    """Why the kernel cannot render ``node``, or None."""
    extra = {i: node.inputs[i] for i in (4, 7) if len(node.inputs) > i and node.inputs[i]}
    if 4 in extra:
        return "sequence lengths"
    if 7 in extra:
        return "peepholes"
    if int(node.attr("input_forget", 0)):
        return "coupled input and forget gates"
    if int(node.attr("layout", 0)):
        return "the batch-first layout"
    acts = node.attr("activations")
    if acts is not None:
        names = tuple(str(a).lower() for a in acts)
        if any(names[i:i + 3] != DEFAULT_ACTIVATIONS for i in range(0, len(names), 3)):
            return f"activations {list(names)}"
    return None


def render_lstm(ex: Exprs, names: NameTable) -> dict[str, object]:
    node = ex.graph.node_by_name[ex.group.nodes[0]]
    why = _unsupported(node)
    if why is not None:
        raise ex.error(f"the Triton LSTM kernel does not render {why}", node)
    g = ex.graph

    def inp(i: int) -> str:
        return node.inputs[i] if len(node.inputs) > i and node.inputs[i] else ""

    if any(inp(i) and g.type_of(inp(i)).dtype != DType.FLOAT32 for i in (0, 1, 2, 3, 5, 6)):
        raise ex.error("the Triton LSTM kernel takes float32 only", node)
    steps, batch, size = g.type_of(inp(0)).shape
    dirs, gates4, hidden_r = g.type_of(inp(2)).shape
    hidden = gates4 // 4
    if max(hidden, size) > MAX_SIZE:
        raise ex.error(f"hidden size {hidden} or input size {size} over {MAX_SIZE}", node)
    outputs = [o if o and o in ex.group.outputs else "" for o in node.outputs] + [""] * (3 - len(node.outputs))
    direction = str(node.attr("direction", "forward"))
    # the step a program takes at iteration s: direction 1 of a bidirectional LSTM runs backwards
    if direction == "reverse":
        step = f"{steps - 1} - s"
    elif direction == "bidirectional":
        step = f"s + d * ({steps - 1} - 2 * s)"
    else:
        step = "s"
    summary = (f"LSTM {node.name}: {steps} steps, batch {batch}, input {size}, hidden {hidden}, {direction}")
    return dict(template="lstm.py.j2", summary=c_comment_text(summary), grid=[dirs * batch], steps=steps,
                batch=batch, size=size, hidden=hidden, dirs=dirs, step=step,
                x=names(inp(0)), w=names(inp(1)), r=names(inp(2)), b=names(inp(3)) if inp(3) else "",
                h0=names(inp(5)) if inp(5) else "", c0=names(inp(6)) if inp(6) else "",
                y=names(outputs[0]) if outputs[0] else "", y_h=names(outputs[1]) if outputs[1] else "",
                y_c=names(outputs[2]) if outputs[2] else "",
                clip=None if node.attr("clip") is None else float(node.attr("clip")),
                configs=warps_configs([("BH", _block(hidden)), ("BD", _block(size))]))


def render_lstm_scan(ex: Exprs, names: NameTable) -> dict[str, object]:
    """An LSTM cell unrolled over time steps (``lstm_scan``) as one kernel: a program per batch row,
    its hidden and cell state in registers from step to step, the steps unrolled (each reads its own
    input and stores its own states where the group outputs them)."""
    g = ex.graph
    nodes = [g.node_by_name[n] for n in ex.group.nodes]
    steps = cell_steps(g, nodes)
    if steps is None:
        raise ex.error("the group is not an unrolled LSTM cell with one pair of weights")
    first = steps[0]
    batch, size = g.type_of(first.x).shape
    hidden = g.type_of(first.h_in).shape[1]
    w_x, w_h = first.gemm_x.inputs[1], first.gemm_h.inputs[1]
    if g.type_of(w_x).shape != (4 * hidden, size) or g.type_of(w_h).shape != (4 * hidden, hidden):
        raise ex.error("the cell's weights are not [4 x hidden, input] and [4 x hidden, hidden]")
    if max(hidden, size) > MAX_SIZE:
        raise ex.error(f"hidden size {hidden} or input size {size} over {MAX_SIZE}")
    tensors = [t for s in steps for t in (s.x, s.h_in, s.c_in, s.h_out, s.c_out)] + [w_x, w_h]
    if any(g.type_of(t).dtype != DType.FLOAT32 for t in tensors):
        raise ex.error("the Triton LSTM kernel takes float32 only")
    if not set(ex.group.outputs) <= {s.h_out for s in steps} | {s.c_out for s in steps}:
        raise ex.error("a gate or an intermediate value of the cell is read outside the kernel")
    members = set(ex.group.nodes)
    sources = [step_input(g, s, members) for s in steps]
    if any(src is None for src in sources):
        raise ex.error("a step reads its input other than as a row of a tensor or a Gather of one")
    biases = []
    for gemm in (first.gemm_x, first.gemm_h):
        bias = gemm.inputs[2] if len(gemm.inputs) > 2 else ""
        if bias and g.type_of(bias).shape != (4 * hidden,):
            raise ex.error(f"bias {bias!r} is not one value per gate row")
        if bias:
            biases.append(names(bias))
    outputs = set(ex.group.outputs)
    step_ctx = [dict(x=names(src[0]), offset=src[1], stride=src[2],
                     h=names(s.h_out) if s.h_out in outputs else "", c=names(s.c_out) if s.c_out in outputs else "")
                for s, src in zip(steps, sources) if src is not None]
    summary = f"LSTM cell over {len(steps)} steps: batch {batch}, input {size}, hidden {hidden}"
    return dict(template="lstm_cell.py.j2", summary=c_comment_text(summary), grid=[batch], hidden=hidden,
                size=size, steps=step_ctx, w_x=names(w_x), w_h=names(w_h), biases=biases,
                h0=names(first.h_in), c0=names(first.c_in),
                configs=warps_configs([("BH", _block(hidden)), ("BD", _block(size))]))
