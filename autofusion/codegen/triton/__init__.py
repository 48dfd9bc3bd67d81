"""The Triton backend: fused groups rendered through jinja2 templates (``templates/triton``) into Triton kernels."""

from autofusion.codegen.triton.render import TRITON_TEMPLATES, TritonKernel, render_triton_group
from autofusion.codegen.triton.text import py_ident

__all__ = ["TRITON_TEMPLATES", "TritonKernel", "py_ident", "render_triton_group"]
