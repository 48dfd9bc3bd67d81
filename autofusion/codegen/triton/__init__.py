"""The Triton backend: fused groups rendered through jinja2 templates (``templates/triton``) into Triton kernels."""

from autofusion.codegen.triton.render import TritonKernel, render_triton_group, triton_kinds
from autofusion.codegen.triton.text import py_ident

__all__ = ["TritonKernel", "py_ident", "render_triton_group", "triton_kinds"]
