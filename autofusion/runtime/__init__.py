"""Runtime: compile generated C (cached), load it with ctypes, run fused and unfused plans."""

from autofusion.runtime.cache import CompileCache, default_cache_dir
from autofusion.runtime.compare import CompareReport, compare_outputs, verify_plan
from autofusion.runtime.compiler import compile_library
from autofusion.runtime.dynamic import DynamicModel
from autofusion.runtime.loader import RunError, default_threads
from autofusion.runtime.model import CompiledModel
from autofusion.runtime.toolchain import CompileError, Toolchain, detect_toolchain
from autofusion.runtime.unfused import UnfusedRunner

__all__ = [
    "CompareReport",
    "CompileCache",
    "CompileError",
    "CompiledModel",
    "DynamicModel",
    "RunError",
    "Toolchain",
    "UnfusedRunner",
    "compare_outputs",
    "compile_library",
    "default_cache_dir",
    "default_threads",
    "detect_toolchain",
    "verify_plan",
]
