"""Code generation: fused groups rendered through jinja2 templates into C kernels and SuperKernels."""

from autofusion.codegen.buffers import BufferPlan, Placement, plan_buffers
from autofusion.codegen.errors import CodegenError
from autofusion.codegen.group_renderer import c_kinds, render_group
from autofusion.codegen.kernel_context import KernelSource, Param
from autofusion.codegen.names import NameTable, c_comment, c_ident
from autofusion.codegen.superkernel import LibrarySource, render_plan, render_unfused
from autofusion.codegen.templates import TemplateSet

__all__ = [
    "BufferPlan",
    "CodegenError",
    "KernelSource",
    "LibrarySource",
    "NameTable",
    "Param",
    "Placement",
    "TemplateSet",
    "c_comment",
    "c_ident",
    "c_kinds",
    "plan_buffers",
    "render_group",
    "render_plan",
    "render_unfused",
]
