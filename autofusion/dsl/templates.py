"""The kernel templates the code generator provides, by name (what ``-> template "..."`` may say).

This table is data in one place: the checker's F012 compares against it, and the code generator
can replace it by the listing of its template directory.
"""

from __future__ import annotations

from collections.abc import Mapping

KNOWN_TEMPLATES: Mapping[str, str] = {
    "pointwise": "a chain or tree of pointwise ops, one loop over the output",
    "reduction": "a reduction with pointwise prologue and epilogue (softmax, layernorm, mean, ...)",
    "gemm_epilogue": "MatMul or Gemm with a pointwise epilogue applied per tile (bias, activation)",
    "conv_epilogue": "Conv with folded BatchNormalization, bias, residual add and activation",
    "horizontal_gemm": "several MatMuls that share their input, as one GEMM with several outputs",
    "multi_output": "a branch: several pointwise or reduction consumers of one tensor, several outputs",
    "lstm_scan": "a recurrent cell repeated over time steps, the time loop inside the kernel",
    "opaque": "a single opaque op in a kernel of its own",
}


def known_templates() -> frozenset[str]:
    """Names a fusion rule may use as its template."""
    return frozenset(KNOWN_TEMPLATES)
