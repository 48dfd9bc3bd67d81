"""The ONNX LSTM op as one kernel (``opaque``): one sgemm for the input projection of all steps,
then per step one sgemm for the recurrent projection and the gate arithmetic.

Every variant the reference implements: forward, reverse and bidirectional, batch-first layout,
sequence lengths, initial states, peepholes, clipping, input-forget coupling, and the recurrent
activation functions with their alpha/beta.
"""

from __future__ import annotations

from autofusion.codegen.ctype import literal
from autofusion.codegen.kernel_context import KernelContext
from autofusion.codegen.names import c_comment_text
from autofusion.graph.graph import Node
from autofusion.graph.types import DType

_DEFAULTS = {"affine": (1.0, 0.0), "leakyrelu": (0.01, 0.0), "thresholdedrelu": (1.0, 0.0),
             "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}


def _f(v: float) -> str:
    return literal(v, DType.FLOAT32)


def activation(name: str, alpha: float | None, beta: float | None, x: str) -> str:
    """C expression of ONNX recurrent activation ``name`` applied to ``x``."""
    key = name.lower()
    da, db = _DEFAULTS.get(key, (0.0, 0.0))
    a, b = _f(da if alpha is None else alpha), _f(db if beta is None else beta)
    table = {
        "sigmoid": f"af_sigmoidf({x})",
        "tanh": f"af_tanhf({x})",
        "relu": f"({x} < 0.0f ? 0.0f : {x})",
        "affine": f"({a} * {x} + {b})",
        "leakyrelu": f"({x} < 0.0f ? {a} * {x} : {x})",
        "thresholdedrelu": f"({x} > {a} ? {x} : 0.0f)",
        "scaledtanh": f"({a} * af_tanhf({b} * {x}))",
        "hardsigmoid": f"af_minf(af_maxf({a} * {x} + {b}, 0.0f), 1.0f)",
        "elu": f"({x} > 0.0f ? {x} : {a} * (af_expf({x}) - 1.0f))",
        "softsign": f"({x} / (1.0f + fabsf({x})))",
        "softplus": f"af_softplusf({x})",
    }
    if key not in table:
        raise ValueError(f"unknown recurrent activation {name!r}")
    return table[key]


def render_lstm(k: KernelContext, node: Node) -> str:
    """Body of the kernel of one LSTM node."""
    g = k.graph

    def inp(i: int) -> str:
        return node.inputs[i] if len(node.inputs) > i and node.inputs[i] else ""

    for i in (0, 1, 2, 3, 5, 6, 7):
        if inp(i) and g.types[inp(i)].dtype != DType.FLOAT32:
            raise k.error("LSTM is supported for float32 only", node)
    xs, rs = g.types[inp(0)].shape, g.types[inp(2)].shape
    layout = int(node.attr("layout", 0))
    steps, batch, size = (xs[1], xs[0], xs[2]) if layout else xs
    dirs, hidden = rs[0], rs[-1]
    direction = node.attr("direction", "forward")
    names = list(node.attr("activations") or ["Sigmoid", "Tanh", "Tanh"] * dirs)
    if len(names) != 3 * dirs:
        raise k.error(f"LSTM needs {3 * dirs} activations, got {len(names)}", node)
    alphas = list(node.attr("activation_alpha") or [])
    betas = list(node.attr("activation_beta") or [])

    def act(i: int, x: str) -> str:
        try:
            return activation(names[i], alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None, x)
        except ValueError as e:
            raise k.error(str(e), node) from None

    def state_index(d: int) -> str:
        return f"(b * {dirs} + {d}) * {hidden} + j" if layout else f"({d} * {batch} + b) * {hidden} + j"

    peep = inp(7)
    directions = []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        p = k.pointer(peep) if peep else ""

        def peephole(gate: int, state: str, d: int = d, p: str = p) -> str:
            return f" + {p}[{d * 3 * hidden + gate * hidden} + j] * {state}" if p else ""

        h0 = f"{k.pointer(inp(5))}[{state_index(d)}]" if inp(5) else "0.0f"
        c0 = f"{k.pointer(inp(6))}[{state_index(d)}]" if inp(6) else "0.0f"
        directions.append({
            "index": d, "reverse": reverse, "h0": h0, "c0": c0,
            "pi": peephole(0, "cprev"), "po": peephole(1, "cnew"), "pf": peephole(2, "cprev"),
            "f_i": act(3 * d, "xi"), "f_f": act(3 * d, "xf"), "f_o": act(3 * d, "xo"),
            "g": act(3 * d + 1, "gc"), "h_of_c": act(3 * d + 2, "cnew"),
            "state_index": state_index(d),
            "y_index": (f"((b * {steps} + t) * {dirs} + {d}) * {hidden} + j" if layout else
                        f"((t * {dirs} + {d}) * {batch} + b) * {hidden} + j"),
        })
    outs = [node.outputs[i] if len(node.outputs) > i and node.outputs[i] in k.group.outputs else "" for i in range(3)]
    rows = steps * batch
    off_gx = k.scratch(rows * 4 * hidden * 4)
    off_gates = k.scratch(batch * 4 * hidden * 4)
    off_h = k.scratch(batch * hidden * 4)
    off_c = k.scratch(batch * hidden * 4)
    k.uses_blas = True
    lens = inp(4)
    live = f"t < (int64_t){k.pointer(lens)}[b]" if lens else "1"
    clip = node.attr("clip")
    return k.templates.render(
        "lstm.c.j2",
        comment=c_comment_text(f"LSTM {node.name}: {steps} steps, batch {batch}, input {size}, hidden {hidden}, "
                               f"{direction}, layout {layout}"),
        off_gx=off_gx, off_gates=off_gates, off_h=off_h, off_c=off_c, directions=directions, rows=rows,
        hidden=hidden, input_size=size, x=k.pointer(inp(0)), w=k.pointer(inp(1)), r=k.pointer(inp(2)),
        bias=k.pointer(inp(3)) if inp(3) else "", batch=batch, steps=steps,
        gx_row=f"b * {steps} + t" if layout else f"t * {batch} + b", live=live,
        clip=None if clip is None else _f(float(clip)), input_forget=bool(node.attr("input_forget", 0)),
        y=k.pointer(outs[0]) if outs[0] else "", y_h=k.pointer(outs[1]) if outs[1] else "",
        y_c=k.pointer(outs[2]) if outs[2] else "",
    )
