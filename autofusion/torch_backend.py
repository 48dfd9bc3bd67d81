"""A TorchDynamo backend: ``torch.compile(model, backend="autofusion")``.

The FX graph Dynamo captures is split into maximal runs of supported nodes
(:func:`autofusion.frontends.fx_import.is_convertible`); each run is converted to the IR, fused with
:func:`autofusion.api.optimize` and compiled by the C backend (:class:`autofusion.runtime.CompiledModel`).
Everything else, and any run whose conversion or compilation fails, stays in eager PyTorch.

Parameters and buffers are frozen: their values are copied into the compiled kernels when the
graph is compiled. Every call checks them (storage and version counter), and a partition whose
frozen values changed since is compiled again with the current ones (updates through ``.data`` bump
no version counter and are not seen). A graph with in-place updates the converter cannot follow
runs eagerly: a partition computes views as copies.
A graph that needs gradients (training) goes through ``aot_autograd``: its forward and backward
graphs, in aten ops with the parameters as inputs, are partitioned and compiled the same way
(frontends/fx_aten.py spells the backward ops), and autograd runs the compiled backward.

A graph Dynamo traced with symbolic sizes (it does so once an input's shape changes) is compiled
for each call's sizes at the first call with them (:class:`PerSizeGraph`, frontends/fx_shapes.py).

Each compile logs one line (logger ``autofusion.torch``, INFO; on stderr with ``AUTOFUSION_LOG=1``):
how many ops went to autofusion in how many partitions, and which ops stayed eager and why.

Registered through the ``torch_dynamo_backends`` entry point; torch is imported only when called.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from autofusion.frontends.fx_import import (
    FxConversionError,
    convert_fx,
    example_value,
    foldable,
    folded_value,
    hidden_updates,
    is_convertible,
    is_module_state,
    module_attribute,
    real_value,
    target_key,
    why_not_convertible,
)
from autofusion.frontends.fx_nodes import MODULE_STATE, stored_order
from autofusion.frontends.fx_shapes import has_symbolic_sizes, record_module_state, scalar_inputs, specialized
from autofusion.runtime.loader import RunError
from autofusion.runtime.output_pool import OutputPool

_LOG = logging.getLogger("autofusion.torch")
# what converting or compiling a partition may raise: the partition then runs eagerly
_CONVERSION_ERRORS = (FxConversionError, ValueError, KeyError, IndexError, TypeError, ArithmeticError, RuntimeError,
                      OSError)


class AutofusionFallbackWarning(UserWarning):
    """A supported-looking partition could not be compiled and runs in eager PyTorch instead."""


class AutofusionSubmodule:
    """Runs one compiled partition: torch tensors in, float32 numpy through the C library, torch tensors out.

    The frozen parameters are checked on every call (the tensor and its version counter): a
    parameter replaced or updated in place since the compile makes ``rebuild`` compile the partition
    again with the current values. A partition whose frozen tensors keep changing (a buffer the model
    updates itself) runs its ``eager`` graph from the third change on, with a warning. Updates
    through ``.data`` bump no version counter and are not seen."""

    MAX_REBUILDS = 2

    def __init__(self, model: Any, input_names: Sequence[str], runtime_positions: Sequence[int],
                 output_names: Sequence[str], single_output: bool, state_positions: Sequence[int] = (),
                 state: tuple[tuple[int, int], ...] = (),
                 rebuild: Callable[[Sequence[Any]], AutofusionSubmodule] | None = None,
                 input_orders: Sequence[tuple[int, ...] | None] = ()) -> None:
        self.input_names = tuple(input_names)
        self.runtime_positions = tuple(runtime_positions)
        # per input: the order its dimensions are stored in, where the graph takes it so (stored_order)
        self.input_orders = tuple(input_orders) or (None,) * len(self.input_names)
        self.output_names = tuple(output_names)
        self.single_output = single_output
        self.state_positions = tuple(state_positions)
        self.state = state
        self.rebuild = rebuild
        self.rebuilds = 0
        self.eager: Callable[..., Any] | None = None  # the partition's torch graph, set when installed
        self._lock = threading.Lock()
        self.model = model  # (after the names: setting it reads them)

    @property
    def model(self) -> Any:
        return self._model

    @model.setter
    def model(self, model: Any) -> None:
        """The compiled partition (None: its eager graph runs), with what each call needs of its graph."""
        self._model = model
        if model is None:
            return
        from autofusion.runtime.torch_ops import torch_dtype

        graph = model.plan.graph
        if tuple(graph.inputs) != self.input_names:
            raise ValueError(f"the partition's inputs {self.input_names} are not its graph's {tuple(graph.inputs)}")
        self._input_dtypes = tuple(torch_dtype(graph.types[name].dtype) for name in graph.inputs)
        self._output_dtypes = tuple(np.dtype(graph.types[name].dtype.numpy) for name in graph.outputs)
        self._outputs = OutputPool(len(graph.outputs))
        # the first of the graph's outputs by each name (a name listed twice is one tensor)
        self._output_index = {name: j for j, name in reversed(list(enumerate(graph.outputs)))}

    def __call__(self, *args: Any) -> Any:
        import torch

        if self.state_positions and state_signature(args[i] for i in self.state_positions) != self.state:
            with self._lock:  # concurrent callers after a change rebuild once
                if state_signature(args[i] for i in self.state_positions) != self.state:
                    self._refreeze(args)
        if self.model is None:
            assert self.eager is not None
            return self.eager(*args)
        inputs = [_as_input(args[pos] if order is None else args[pos].permute(order), name, dtype)
                  for name, pos, order, dtype in zip(self.input_names, self.runtime_positions, self.input_orders,
                                                      self._input_dtypes)]
        shapes = [tuple(t.shape) for t in inputs]
        # memory that earlier calls' outputs freed, already faulted in (runtime/output_pool.py)
        results = [torch.from_numpy(a) for a in self._outputs.arrays(self.model.output_shapes(shapes),
                                                                     self._output_dtypes)]
        # the tensors' own memory, no numpy array per call (0.17-0.22 ms a call for 29-51 inputs)
        self.model.run_addresses(shapes, [t.data_ptr() for t in inputs], [t.data_ptr() for t in results])
        outs = tuple(results[self._output_index[name]] for name in self.output_names)
        return outs[0] if self.single_output else outs

    def _refreeze(self, args: Sequence[Any]) -> None:
        """Compile again with the current frozen values, or give the partition to eager for good."""
        why = ""
        if self.rebuild is None or self.rebuilds >= self.MAX_REBUILDS:
            why = "its frozen parameters keep changing (a buffer the model updates?)"
        else:
            _LOG.info("autofusion: a frozen parameter changed since the compile; compiling its partition again")
            try:
                fresh = self.rebuild(args)
            except _CONVERSION_ERRORS as e:
                why = f"compiling it again failed ({type(e).__name__}: {e})"
            else:
                self.model, self.state = fresh.model, fresh.state
                self.rebuilds += 1
                return
        if self.eager is None:
            raise RuntimeError(f"autofusion: a partition cannot run: {why}")
        warnings.warn(f"autofusion: a partition runs eagerly from now on: {why}", AutofusionFallbackWarning,
                      stacklevel=3)
        self.model, self.state_positions = None, ()


def _as_input(tensor: Any, name: str, dtype: Any) -> Any:
    """A tensor as the library takes graph input ``name``: on the CPU, C-contiguous, of ``dtype``; the
    tensor itself when it is so, else a copy (a 0-d tensor, such as a scalar loss's gradient, stays
    0-d). Types other than float32, int64 and bool are read as float32; RunError for any other
    mismatch."""
    if tensor.dtype == dtype and tensor.is_cpu and tensor.is_contiguous():
        return tensor  # (the usual case, first: a call passes dozens of tensors)
    import torch

    tensor = tensor.cpu()
    if tensor.dtype not in (torch.float32, torch.int64, torch.bool):
        tensor = tensor.to(torch.float32)
    if tensor.dtype != dtype:
        raise RunError(f"input {name!r}: dtype {tensor.dtype}, graph expects {dtype}")
    return tensor.contiguous()


def state_signature(tensors: Iterable[Any]) -> tuple[tuple[int, int], ...]:
    """What identifies the values of frozen tensors: storage and version counter (bumped by every
    in-place update; an inference-mode tensor has none, and is identified by its storage)."""
    return tuple((int(t.data_ptr()), -1 if t.is_inference() else int(t._version)) for t in tensors)


def _compile_partition(sub_gm: Any, args: Sequence[Any], parent: Any, name: str,
                       current: Sequence[Any] | None = None, per_size: bool = False) -> AutofusionSubmodule:
    """Convert, optimize and compile one fused partition; raises on anything unsupported.
    ``current``: the partition's call arguments, whose frozen ones replace the compile-time values;
    ``per_size``: a build for one size of a symbolic graph, whose products take the choices tuned at
    nearby sizes where there are some (CompiledModel's ``tune_nearby``)."""
    from autofusion.api import optimize
    from autofusion.runtime import CompiledModel

    values: list[Any] = []
    frozen: list[bool] = []
    orders: list[tuple[int, ...] | None] = []  # how each run-time input is stored, if permuted
    for arg in args:
        if arg.op == "get_attr":
            values.append(module_attribute(parent, arg.target))
            frozen.append(True)
        elif arg.op == "placeholder" and is_module_state(arg):
            real = real_value(arg)
            values.append(real if real is not None else example_value(arg))
            frozen.append(real is not None)
        elif foldable(arg):  # computed from frozen state outside the partition (a buffer's slice)
            values.append(folded_value(arg))
            frozen.append(True)
        else:
            values.append(example_value(arg))
            frozen.append(False)
        orders.append(None if frozen[-1] else stored_order(values[-1]))
    if current is not None:
        values = [current[i] if f else v for i, (v, f) in enumerate(zip(values, frozen))]
    graph, results = convert_fx(sub_gm, values, frozen, name=name, orders=orders)
    placeholders = [n.name for n in sub_gm.graph.nodes if n.op == "placeholder"]
    runtime = [(f"t_{p}", i) for i, p in enumerate(placeholders) if not frozen[i]]
    out_node = next(n for n in sub_gm.graph.nodes if n.op == "output")
    model = CompiledModel(optimize(graph), tune_nearby=per_size)
    state_positions = [i for i, f in enumerate(frozen) if f]
    return AutofusionSubmodule(model, [r[0] for r in runtime], [r[1] for r in runtime], results,
                               single_output=not isinstance(out_node.args[0], (tuple, list)),
                               input_orders=[orders[r[1]] for r in runtime],
                               state_positions=state_positions,
                               state=state_signature(values[i] for i in state_positions),
                               rebuild=lambda now: _compile_partition(sub_gm, args, parent, name, now, per_size))


def autofusion_backend(gm: Any, example_inputs: Sequence[Any]) -> Any:
    """TorchDynamo backend: compile supported parts of ``gm`` with autofusion, run the rest eagerly.
    A graph that needs gradients goes through ``aot_autograd``: its forward and backward graphs
    are compiled alike."""
    import torch

    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in example_inputs):
        return _training_backend(gm, example_inputs)
    return compile_graph(gm, example_inputs)


def _training_backend(gm: Any, example_inputs: Sequence[Any]) -> Any:
    """Forward and backward graphs (aten ops, parameters and saved tensors as inputs) from
    ``aot_autograd``, each partitioned and compiled; autograd runs the backward one."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    _log("autofusion: the graph needs gradients: its forward and backward passes are compiled with the "
         "parameters as inputs (for inference, call under torch.no_grad() or torch.inference_mode(): the "
         "weights are then frozen and packed once)")

    def compiler(label: str) -> Callable[[Any, Sequence[Any]], Any]:
        return lambda graph, inputs: make_boxed_func(compile_graph(graph, inputs, label=label))

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))(gm, example_inputs)


def compile_graph(gm: Any, example_inputs: Sequence[Any], label: str = "", per_size: bool = False) -> Any:
    """``gm`` with its maximal runs of convertible nodes compiled as SuperKernels, or its own
    ``forward`` when none can be; a graph traced with symbolic sizes is compiled per call's sizes
    (:class:`PerSizeGraph`, which passes ``per_size``: see :func:`_compile_partition`)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    if has_symbolic_sizes(gm, example_inputs):
        return PerSizeGraph(gm, label)

    class _Support(OperatorSupportBase):
        def is_node_supported(self, submodules: Any, node: Any) -> bool:
            return _supported(node)

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        node.meta["_autofusion_real"] = value  # real tensors when Dynamo passes them (it does by default)
    hidden = hidden_updates(gm.graph)
    if hidden:  # views are copies and outputs fresh tensors in a partition: the update could be missed
        _log(f"autofusion: the graph updates tensors in place where others may read them "
             f"({', '.join(sorted({str(target_key(n) or n.target) for n in hidden}))}); it runs eagerly")
        return gm.forward
    _assign_conv_gradients(gm)
    _leave_input_views(gm)
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    _log(compile_summary(gm, partitions, label))
    if not partitions:
        return gm.forward
    fused = partitioner.fuse_partitions(partitions)
    compiled_any = False
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith("fused_"):
            continue
        sub_gm = module_attribute(fused, node.target)
        try:
            # aot_autograd compiles under its fake-tensor mode: the frozen values are real tensors
            with unset_fake_temporarily():
                runner = _compile_partition(sub_gm, node.args, fused, name=str(node.target), per_size=per_size)
        except _CONVERSION_ERRORS as exc:
            warnings.warn(f"autofusion: partition {node.target} runs eagerly ({type(exc).__name__}: {exc})",
                          AutofusionFallbackWarning, stacklevel=2)
            continue  # this part stays eager: the fused submodule runs its original torch ops
        runner.eager = sub_gm  # the partition's own torch ops, should its weights keep changing
        _install(fused, node, runner)
        compiled_any = True
    return fused if compiled_any else gm.forward


class PerSizeGraph:
    """A graph Dynamo traced with symbolic sizes (it does so once an input's shape changes), compiled
    for each call's sizes at the first call with them: the SuperKernels take static shapes. The
    graphs of the last MAX_SIZES sizes are kept; a graph that cannot be made static or compiled for
    a call's sizes runs eagerly at them, with a warning. One compile at a time: concurrent first
    calls wait for it."""

    MAX_SIZES = 8  # as many as Dynamo recompiles a frame by default: each holds its own packed weights

    def __init__(self, gm: Any, label: str = "") -> None:
        record_module_state(gm)
        self.gm = gm
        self.label = label
        # the arguments a call's sizes show in: not module state, whose shapes Dynamo guards itself
        self._sized = tuple(i for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")
                            if not node.meta[MODULE_STATE])
        self._scalars = scalar_inputs(gm)  # inputs whose numbers a build holds as constants
        self._compiled: OrderedDict[tuple[Any, ...], Callable[..., Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        key = sizes_key([args[i] for i in self._sized]) + tuple(args[i].item() for i in self._scalars)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compile(args)
                self._compiled[key] = compiled
                while len(self._compiled) > self.MAX_SIZES:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(key)
        return compiled(*args)

    def _compile(self, args: Sequence[Any]) -> Callable[..., Any]:
        import torch

        sizes = [str(a) for a in args if type(a) is int]  # the symbolic sizes' values, where Dynamo passes them
        sizes = sizes or [str(list(a.shape)) for a in args if isinstance(a, torch.Tensor)
                          and not isinstance(a, torch.nn.Parameter)]
        _log(f"autofusion: the {self.label + ' ' if self.label else ''}graph has symbolic sizes: "
             f"compiling it for this call's ({', '.join(sizes)})")
        try:
            return compile_graph(specialized(self.gm, args), args, self.label,  # type: ignore[no-any-return]
                                 per_size=True)
        except Exception as exc:  # noqa: BLE001 (torch's shape propagation may raise anything)
            warnings.warn(f"autofusion: the graph runs eagerly at these sizes: it could not be compiled for "
                          f"them ({type(exc).__name__}: {exc})", AutofusionFallbackWarning, stacklevel=3)
            return self.gm.forward  # type: ignore[no-any-return]


def sizes_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a static graph for ``args`` depends on: each tensor's shape, strides and dtype, each
    other argument (an integer size) itself."""
    import torch

    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _assign_conv_gradients(gm: Any) -> None:
    """Each convolution_backward's input and weight gradients go to whichever of the SuperKernels and
    torch computes them faster (measured, :mod:`autofusion.torch_conv_grad`): a node whose asked-for
    gradients are all torch's stays with torch whole, one with some of each is split in two."""
    from autofusion.frontends.fx_aten import TORCH_KEEPS, split_gradients
    from autofusion.torch_conv_grad import PARTS, measurable

    changed = False
    for node in [n for n in gm.graph.nodes if target_key(n) == "convolution_backward"]:
        mask = list(node.args[10]) if len(node.args) == 11 else []
        if not (mask and (mask[0] or mask[1])):
            continue
        torch_mask, unsupported = [False, False, False], []
        for index, part in enumerate(PARTS):
            if mask[index] and not measurable(node, part):
                torch_mask[index] = True
                unsupported.append(part)
            elif mask[index]:
                torch_mask[index] = not _measured_faster(node, part)
        if len(unsupported) == sum(mask[:len(PARTS)]):
            continue  # nothing ours could take: the converter says why
        reason = (f"torch's; the Convs do not spell its {' and '.join(unsupported)} gradient" if unsupported
                  else "torch's, measured faster")
        if not any(mask[i] and not torch_mask[i] for i in range(len(PARTS))):
            node.meta[TORCH_KEEPS] = reason  # the bias gradient too: the call computes it anyway
        elif any(torch_mask):
            split_gradients(node, torch_mask, reason)
            changed = True
    if changed:
        gm.recompile()


# ops whose result shares its input's memory in torch, never a copy (reshape and flatten may copy)
VIEW_OPS = frozenset({"t", "permute", "transpose", "view", "_unsafe_view", "unsqueeze", "squeeze", "alias"})
INPUT_VIEW = "a view of an input: free in torch"


def _leave_input_views(gm: Any) -> None:
    """Views of the graph's run-time inputs stay with torch: in a partition a view it returns (the
    transposed weight a training forward saves for backward) is a copy the kernel writes, where
    torch's costs nothing; a partition reading one takes it as an input, a transposed one in place."""
    from autofusion.frontends.fx_aten import TORCH_KEEPS

    for node in gm.graph.nodes:
        if node.op != "call_function" or target_key(node) not in VIEW_OPS or not node.args:
            continue
        source = node.args[0]
        of_input = getattr(source, "op", None) == "placeholder" and not is_module_state(source)
        if of_input or getattr(source, "meta", {}).get(TORCH_KEEPS) == INPUT_VIEW:  # an input, or a view of one
            node.meta[TORCH_KEEPS] = INPUT_VIEW


def _measured_faster(node: Any, part: str) -> bool:
    """Whether ours computes the node's ``part`` gradient faster; False, with a warning, where measuring fails."""
    from autofusion.torch_conv_grad import ours_faster

    try:
        return ours_faster(node, part)
    except Exception as exc:  # noqa: BLE001 - whatever fails in measuring, torch computes the part
        warnings.warn(f"autofusion: {node.name}'s {part} gradient stays with torch ({type(exc).__name__}: {exc})",
                      AutofusionFallbackWarning, stacklevel=3)
        return False


def _is_getitem(node: Any) -> bool:
    return node.op == "call_function" and target_key(node) == "getitem"


def _supported(node: Any) -> bool:
    """Convertible, and safe for torch's partitioner, which moves every getitem user of a node
    whose users are all getitems into that node's partition (and loops forever when two such
    nodes pull one getitem, as a mask indexed by several index tensors has): such a node is
    supported only if its getitems are, and a getitem only if its source is a supported op."""
    cached = node.meta.get("_autofusion_supported")
    if cached is not None:
        return bool(cached)
    ok = is_convertible(node)
    users = list(node.users)
    if ok and users and all(_is_getitem(u) for u in users):
        ok = all(_supported(u) for u in users)
    if ok and _is_getitem(node):
        source = node.args[0]
        if all(_is_getitem(u) for u in source.users):
            ok = source.op in ("call_function", "call_method") and is_convertible(source)
    node.meta["_autofusion_supported"] = ok
    return ok


def compile_summary(gm: Any, partitions: Sequence[Any], label: str = "") -> str:
    """One line on what a compile does with a graph (``label``: forward or backward of a training
    graph): its ops, how many go to autofusion in how many partitions, and each op left to eager
    with the reason."""
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    fused = sum(len(p.nodes) for p in partitions)
    eager: Counter[str] = Counter()
    for node in ops:
        reason = why_not_convertible(node)
        if reason:
            eager[f"{target_key(node) or node.target} ({reason})"] += 1
    left = ", ".join(f"{what} x{n}" for what, n in eager.most_common()) or "none"
    graph = f" {label} graph:" if label else ""
    return (f"autofusion:{graph} {len(ops)} ops, {fused} fused in {len(partitions)} partition(s); "
            f"left to eager: {left}")


def _log(text: str) -> None:
    """A compile's line at INFO on the ``autofusion.torch`` logger, and on stderr with AUTOFUSION_LOG=1."""
    _LOG.info(text)
    if os.environ.get("AUTOFUSION_LOG", "").strip() not in ("", "0"):
        print(text, file=sys.stderr)


def _install(fused: Any, node: Any, runner: AutofusionSubmodule) -> None:
    """Replace the fused partition's eager submodule by a module that calls its compiled runner."""
    import torch

    class AutofusionPartition(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.runner = runner

        def forward(self, *args: Any) -> Any:
            return self.runner(*args)

    setattr(fused, str(node.target), AutofusionPartition())
