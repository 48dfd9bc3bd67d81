"""Writing fusion plans out: ONNX models with one model-local function per fused kernel."""

from autofusion.export.onnx_nodes import OPSET, OnnxExportError
from autofusion.export.onnx_out import DOMAIN, save_onnx, to_onnx

__all__ = ["DOMAIN", "OPSET", "OnnxExportError", "save_onnx", "to_onnx"]
