"""Frontends: turn models from other formats into the autofusion graph IR."""

from autofusion.frontends.onnx_import import OnnxImportError, load_onnx
from autofusion.frontends.onnx_proto import OnnxImportWarning

__all__ = ["OnnxImportError", "OnnxImportWarning", "load_onnx"]
