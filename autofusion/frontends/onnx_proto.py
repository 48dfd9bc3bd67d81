"""Reading ONNX protobufs: loading a model, upgrading its opset, converting tensors, attributes, types.

Everything that can go wrong with user input is raised as :class:`OnnxImportError` with a message a
user can act on; nothing here lets a protobuf or numpy exception escape.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, ModelProto, TensorProto, numpy_helper

from autofusion.graph.types import DType, TensorType
from autofusion.ops.dtypes import onnx_dtype

MIN_OPSET = 13  # models below are upgraded: the op semantics the registry implements start here
DEFAULT_DOMAINS = ("", "ai.onnx")

ModelSource = str | os.PathLike[str] | bytes | bytearray | memoryview | ModelProto


class OnnxImportError(ValueError):
    """The ONNX model cannot be imported; the message says why and, where possible, what to do."""


class UnboundDimensionError(OnnxImportError):
    """A static import (``symbolic=False``) met dimensions nothing bound; ``names`` lists them."""

    def __init__(self, message: str, names: tuple[str, ...]) -> None:
        super().__init__(message)
        self.names = names


def load_model(source: Any, base_dir: str | os.PathLike[str] | None = None) -> tuple[ModelProto, str]:
    """The model and a short description of where it came from (for messages)."""
    if isinstance(source, ModelProto):
        model, where, base = source, "model", base_dir
    elif isinstance(source, (bytes, bytearray, memoryview)):
        model, where, base = _parse_bytes(bytes(source)), "model bytes", base_dir
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        model, where, base = _read_file(path), str(path), base_dir or path.parent
    else:
        raise OnnxImportError(
            f"cannot load an ONNX model from a {type(source).__name__}: give a file path, bytes or an onnx.ModelProto")
    model = _load_external(model, where, base)
    if not model.HasField("graph") or not model.graph.output:
        raise OnnxImportError(f"{where} is not an ONNX model (no graph with outputs): is the file truncated or not ONNX?")
    return model, where


def _parse_bytes(data: bytes) -> ModelProto:
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError and friends: the bytes are not a model
        raise OnnxImportError(f"not a valid ONNX model (truncated or corrupt protobuf): {e}") from None
    return model


def _read_file(path: Path) -> ModelProto:
    if not path.exists():
        raise OnnxImportError(f"ONNX file not found: {path}")
    if path.is_dir():
        raise OnnxImportError(f"{path} is a directory, not an ONNX file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise OnnxImportError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return _parse_bytes(data)
    except OnnxImportError as e:
        raise OnnxImportError(f"{path}: {e}") from None


def _tensors(model: ModelProto) -> list[TensorProto]:
    graph = model.graph
    attrs = [a.t for n in graph.node for a in n.attribute if a.type == AttributeProto.TENSOR]
    return [*graph.initializer, *attrs]


def _load_external(model: ModelProto, where: str, base: str | os.PathLike[str] | None) -> ModelProto:
    """The model with external tensor data read in (a copy: the caller's proto is left alone)."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if not any(uses_external_data(t) for t in _tensors(model)):
        return model
    copy = ModelProto()
    copy.CopyFrom(model)
    external = [t for t in _tensors(copy) if uses_external_data(t)]
    if base is None:
        raise OnnxImportError(
            f"{where} keeps {len(external)} tensor(s) in external data files; load it from its file path "
            "(or pass base_dir=) so the data can be found")
    for tensor in external:
        try:
            load_external_data_for_tensor(tensor, str(base))
        except Exception as e:  # a missing or short data file
            raise OnnxImportError(f"{where}: cannot load external data of tensor {tensor.name!r} "
                                  f"from {base}: {e}") from None
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]
    return copy


def default_opset(model: ModelProto) -> int:
    """The version of the default (ai.onnx) operator set the model imports."""
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise OnnxImportError("the model imports no ai.onnx operator set (opset_import is empty)")
    version = max(versions)
    newest = onnx.defs.onnx_opset_version()
    if version < 1 or version > newest:
        raise OnnxImportError(
            f"unknown opset {version}: the installed onnx package knows opsets 1..{newest} (upgrade onnx?)")
    return version


class OnnxImportWarning(UserWarning):
    """The import went ahead, with a caveat the user should know about."""


def upgrade_opset(model: ModelProto, where: str) -> tuple[ModelProto, bool]:
    """The model at opset >= 13 (older ones go through onnx's version converter), and whether it is
    still at its old opset because the converter failed.

    A failed upgrade falls back to importing the model as it is, with an :class:`OnnxImportWarning`:
    most ops mean the same at older opsets, attribute forms are understood, and the importer rejects
    the few whose meaning changed (see ``legacy_fixes`` in the importer).
    """
    version = default_opset(model)
    if version >= MIN_OPSET:
        return model, False
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_OPSET), False
    except Exception as e:  # the converter has no adapter for some op at this version
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        warnings.warn(OnnxImportWarning(
            f"{where}: upgrading opset {version} to {MIN_OPSET} failed ({reason}); importing it at opset {version}"),
            stacklevel=3)
        return model, True


def element_type(code: int, what: str) -> DType:
    try:
        return onnx_dtype(code)
    except ValueError:
        name = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else str(code)
        raise OnnxImportError(f"{what} has element type {name}, which autofusion does not support") from None


def tensor_value(tensor: TensorProto, what: str) -> np.ndarray:
    """A TensorProto as a numpy array of a supported element type."""
    element_type(tensor.data_type, what)
    try:
        return np.array(numpy_helper.to_array(tensor))
    except Exception as e:
        raise OnnxImportError(f"{what}: cannot read tensor data: {e}") from None


def attribute_value(attr: AttributeProto, where: str) -> Any:
    """An attribute as a Python value: numbers, strings, tuples, or a numpy array for tensors."""
    kind = attr.type
    if kind == AttributeProto.FLOAT:
        return float(attr.f)
    if kind == AttributeProto.INT:
        return int(attr.i)
    if kind == AttributeProto.STRING:
        return attr.s.decode("utf-8", "replace")
    if kind == AttributeProto.TENSOR:
        return tensor_value(attr.t, f"{where}: attribute {attr.name!r}")
    if kind == AttributeProto.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if kind == AttributeProto.INTS:
        return tuple(int(v) for v in attr.ints)
    if kind == AttributeProto.STRINGS:
        return tuple(s.decode("utf-8", "replace") for s in attr.strings)
    kind_name = AttributeProto.AttributeType.Name(kind) if kind in AttributeProto.AttributeType.values() else kind
    raise OnnxImportError(f"{where}: attribute {attr.name!r} of kind {kind_name} is not supported")


def constant_node_value(attrs: Mapping[str, Any], where: str) -> np.ndarray:
    """The tensor a ``Constant`` node holds, from whichever of its value attributes is set."""
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "value_float" in attrs:
        return np.asarray(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.asarray(attrs["value_floats"], dtype=np.float32).reshape(-1)
    if "value_int" in attrs:
        return np.asarray(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.asarray(attrs["value_ints"], dtype=np.int64).reshape(-1)
    raise OnnxImportError(f"{where}: Constant with {sorted(attrs) or 'no value'} is not supported "
                          "(only numeric value, value_float(s), value_int(s))")


def input_type(value_info: onnx.ValueInfoProto, dims: Mapping[str, int]) -> tuple[TensorType | None, list[str]]:
    """A graph input's static type with symbolic dims bound from ``dims``, and the unbound ones."""
    name = value_info.name
    if not value_info.type.HasField("tensor_type"):
        kind = value_info.type.WhichOneof("value") or "unknown"
        raise OnnxImportError(f"graph input {name!r} is a {kind.replace('_type', '')}, not a tensor: not supported")
    tt = value_info.type.tensor_type
    dtype = element_type(tt.elem_type, f"graph input {name!r}")
    if not tt.HasField("shape"):
        raise OnnxImportError(f"graph input {name!r} has no shape (rank unknown); re-export with static shapes")
    shape: list[Any] = []
    unbound: list[str] = []
    for axis, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            shape.append(int(d.dim_value))
            continue
        key = d.dim_param if d.HasField("dim_param") and d.dim_param else f"{name}[{axis}]"
        value = dims.get(key, dims.get(f"{name}[{axis}]"))
        if value is None:
            unbound.append(key)
        elif not isinstance(value, (int, np.integer)):  # a symbol: the size is known at run time
            shape.append(value)
        else:
            if int(value) < 0:
                raise OnnxImportError(f"dims[{key!r}] = {value} is negative")
            shape.append(int(value))
    return (None if unbound else TensorType(tuple(shape), dtype)), unbound
