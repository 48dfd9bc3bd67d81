"""Frontends: turn models from other formats into the autofusion graph IR."""

from autofusion.frontends.onnx_import import OnnxImportError, load_onnx

__all__ = ["OnnxImportError", "load_onnx"]
