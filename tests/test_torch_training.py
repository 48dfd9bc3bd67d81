"""Training through torch.compile(backend="autofusion"): aot_autograd's forward and backward graphs
compiled as SuperKernels, and each aten op of training graphs (frontends/fx_aten.py) against torch."""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from autofusion.bench.torch_models import small_cnn, train, transformer_encoder  # noqa: E402
from autofusion.frontends.fx_import import fx_to_graph, is_convertible  # noqa: E402
from autofusion.ir import run_graph  # noqa: E402
from autofusion.runtime import CompiledModel  # noqa: E402
from autofusion.torch_backend import AutofusionFallbackWarning  # noqa: E402

CACHE = os.environ.get("AUTOFUSION_CACHE")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def aten_graph(fn: Callable[..., Any], *inputs: Any) -> Any:
    """``fn`` traced to aten ops, as aot_autograd hands them to a backend."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn)(*inputs)
    gm.graph.eliminate_dead_code()  # tracing reads every output of a tuple; aot_autograd's graphs don't
    gm.recompile()
    return gm


def check_aten(fn: Callable[..., Any], *inputs: Any, rtol: float = 1e-5, atol: float = 1e-5) -> Any:
    """Every node of ``fn``'s aten graph converts; the reference interpreter and the compiled
    SuperKernel both compute what torch does."""
    gm = aten_graph(fn, *inputs)
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert ops and all(is_convertible(n) for n in ops), [str(n.target) for n in ops if not is_convertible(n)]
    graph = fx_to_graph(gm, inputs, [False] * len(inputs))
    feeds = {name: t.numpy() for name, t in zip(graph.inputs, inputs)}
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    reference = run_graph(graph, feeds)
    compiled = CompiledModel(graph_plan(graph), cache=CACHE).run(feeds)
    for name, want in zip(graph.outputs, expected):
        np.testing.assert_allclose(reference[name], want.numpy(), rtol=rtol, atol=atol, err_msg=f"{name} reference")
        np.testing.assert_allclose(compiled[name], want.numpy(), rtol=rtol, atol=atol, err_msg=f"{name} compiled")
    return gm


def graph_plan(graph: Any) -> Any:
    from autofusion.api import optimize

    return optimize(graph)


def rand(*shape: int) -> Any:
    return torch.randn(*shape, generator=GEN)


GEN = torch.Generator().manual_seed(5)
aten = torch.ops.aten


def test_layer_norm_forward_gives_the_statistics_the_backward_reads() -> None:
    x, w, b = rand(3, 5, 16), rand(16), rand(16)
    check_aten(lambda x, w, b: aten.native_layer_norm(x, [16], w, b, 1e-5), x, w, b)


def test_layer_norm_backward_over_one_and_two_axes() -> None:
    for shape, normalized in (((4, 6, 16), [16]), ((4, 6, 16), [6, 16])):
        x, dy = rand(*shape), rand(*shape)
        w, b = rand(*normalized), rand(*normalized)
        _, mean, rstd = aten.native_layer_norm(x, normalized, w, b, 1e-5)
        check_aten(_layer_norm_backward(normalized), dy, x, mean, rstd, w, b, rtol=1e-4, atol=1e-4)


def _layer_norm_backward(normalized: list[int]) -> Callable[..., Any]:
    def backward(dy: Any, x: Any, mean: Any, rstd: Any, w: Any, b: Any) -> Any:
        return aten.native_layer_norm_backward(dy, x, normalized, mean, rstd, w, b, [True, True, True])

    return backward


def test_batch_norm_in_training_and_its_backward() -> None:
    """Batch statistics, the running statistics' update (unbiased variance, momentum) and the
    three gradients, against torch, for 4-D and 3-D inputs."""
    for shape in ((4, 3, 5, 5), (6, 4, 7)):
        c = shape[1]
        x, dy, w, b = rand(*shape), rand(*shape), rand(c), rand(c)
        rm, rv = rand(c), torch.rand(c, generator=GEN) + 0.5
        check_aten(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5),
                   x, w, b, rm, rv, rtol=1e-4, atol=1e-5)
        _, mean, rstd, _, _ = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        check_aten(lambda dy, x, w, rm, rv, mean, rstd: aten.native_batch_norm_backward(
            dy, x, w, rm, rv, mean, rstd, True, 1e-5, [True, True, True]), dy, x, w, rm, rv, mean, rstd,
            rtol=1e-4, atol=1e-4)


def test_pointwise_backwards() -> None:
    dy, x = rand(5, 33), rand(5, 33)
    check_aten(lambda dy, x: aten.gelu_backward(dy, x), dy, x)
    check_aten(lambda dy, x: aten.threshold_backward(dy, x, 0.0), dy, torch.relu(x))
    check_aten(lambda dy, x: aten.threshold_backward(dy, x, 0.5), dy, x)
    check_aten(lambda dy, y: aten.tanh_backward(dy, y), dy, torch.tanh(x))
    check_aten(lambda dy, y: aten.sigmoid_backward(dy, y), dy, torch.sigmoid(x))


def test_softmax_forward_and_backward() -> None:
    x, dy = rand(2, 3, 7, 9), rand(2, 3, 7, 9)
    y = torch.softmax(x, -1)
    check_aten(lambda x: aten._softmax(x, -1, False), x)
    check_aten(lambda dy, y: aten._softmax_backward_data(dy, y, -1, torch.float32), dy, y)
    check_aten(lambda dy, y: aten._softmax_backward_data(dy, y, 1, torch.float32), dy, y)


def test_reductions_expand_and_views() -> None:
    x = rand(4, 6, 8)
    check_aten(lambda x: aten.sum.dim_IntList(x, [0, 1], False), x)
    check_aten(lambda x: aten.sum.dim_IntList(x, [-1], True), x)
    check_aten(lambda x: aten.sum.default(x), x)
    check_aten(lambda x: aten.mean.dim(x, [1], True), x)
    check_aten(lambda x: aten.mean.default(x), x)
    check_aten(lambda x: aten.expand.default(aten.sum.dim_IntList(x, [1], True), [4, 6, 8]), x)
    check_aten(lambda x: aten._unsafe_view.default(aten.clone.default(aten.detach.default(x)), [24, 8]), x)


def test_convolution_forward() -> None:
    x, w, b = rand(2, 3, 9, 9), rand(8, 3, 3, 3), rand(8)
    check_aten(lambda x, w, b: aten.convolution(x, w, b, [2, 2], [1, 1], [1, 1], False, [0, 0], 1), x, w, b,
               rtol=1e-4, atol=1e-4)
    gm = aten_graph(lambda x, w: aten.convolution(x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1),
                    x, rand(3, 8, 3, 3))
    assert not any(is_convertible(n) for n in gm.graph.nodes if n.op == "call_function")  # transposed: eager


# (N, C, H, W, M, kernel, stride, padding, groups): stride phases with one tap or none (a 1x1 kernel
# at stride 2), padding past a phase's first rows, odd sizes, rectangular kernels, groups
CONV_GRAD_CASES = [
    (2, 4, 8, 8, 6, (3, 3), (1, 1), (1, 1), 1),
    (2, 4, 9, 7, 6, (3, 3), (2, 2), (1, 1), 1),
    (1, 4, 8, 8, 8, (1, 1), (2, 2), (0, 0), 1),
    (2, 3, 11, 10, 5, (5, 3), (3, 2), (2, 1), 1),
    (1, 6, 7, 7, 4, (3, 3), (2, 1), (0, 2), 2),
    (2, 8, 10, 10, 8, (3, 3), (2, 2), (1, 1), 8),
]


@pytest.mark.parametrize("case", CONV_GRAD_CASES, ids=str)
def test_convolution_gradients(case: tuple[Any, ...]) -> None:
    """The input and bias gradients, and the weight gradient where there is one group, compiled."""
    n, c, h, w, m, k, stride, pad, groups = case
    x, weight = rand(n, c, h, w), rand(m, c // groups, *k)
    dy = torch.randn_like(aten.convolution(x, weight, None, list(stride), list(pad), [1, 1], False, [0, 0], groups))

    def grads(dy: Any, x: Any, weight: Any) -> Any:
        grad = aten.convolution_backward(dy, x, weight, [m], list(stride), list(pad), [1, 1], False, [0, 0],
                                         groups, [True, groups == 1, True])
        return (grad[0], grad[1], grad[2]) if groups == 1 else (grad[0], grad[2])

    check_aten(grads, dy, x, weight, rtol=1e-4, atol=1e-4)


def test_a_grouped_weight_gradient_is_left_to_torch() -> None:
    import autofusion.torch_conv_grad as conv_grad

    x, weight, dy = rand(2, 4, 8, 8), rand(6, 2, 3, 3), rand(2, 6, 8, 8)
    gm = aten_graph(lambda dy, x, w: aten.convolution_backward(dy, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0],
                                                               2, [True, True, False]), dy, x, weight)
    node = next(n for n in gm.graph.nodes if "convolution_backward" in str(n.target))
    assert not is_convertible(node)
    assert conv_grad.measurable(node, "input") and not conv_grad.measurable(node, "weight")


def test_a_gradient_the_convs_do_not_spell_goes_to_torch_with_why(monkeypatch: Any) -> None:
    """A grouped convolution's input gradient measured faster in ours joins the partition; its weight
    gradient, which the swapped Conv does not spell, gets a node of its own that says so."""
    import autofusion.torch_conv_grad as conv_grad
    from autofusion.frontends.fx_import import why_not_convertible
    from autofusion.torch_backend import _assign_conv_gradients

    x, weight, dy = rand(2, 4, 8, 8), rand(6, 2, 3, 3), rand(2, 6, 8, 8)

    def grads(dy: Any, x: Any, w: Any) -> Any:
        return aten.convolution_backward(dy, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 2, [True, True, False])

    gm = aten_graph(grads, dy, x, weight)
    monkeypatch.setattr(conv_grad, "ours_faster", lambda node, part: True)
    _assign_conv_gradients(gm)
    nodes = [n for n in gm.graph.nodes if "convolution_backward" in str(n.target)]
    assert [list(n.args[10]) for n in nodes] == [[True, False, False], [False, True, False]]
    assert is_convertible(nodes[0]) and why_not_convertible(nodes[1]) == "torch's; the Convs do not spell its weight gradient"
    for got, want in zip(gm(dy, x, weight), grads(dy, x, weight)):
        torch.testing.assert_close(got, want)


def test_convolution_input_gradient_over_many_geometries() -> None:
    """The stride-phase Convs against torch in the reference interpreter, every combination."""
    from autofusion.frontends.conv_grad import conv2d_input_grad
    from autofusion.ir.builder import GraphBuilder

    checked = 0
    # rows and columns each: size, kernel, stride, padding; the column axis cycles through its own
    columns = itertools.cycle(itertools.product((6, 7), (1, 3, 4), (1, 2, 3), (0, 1, 3)))
    for h, k, stride, pad, groups in itertools.product((5, 8), (1, 2, 3, 5), (1, 2, 3), (0, 1, 2), (1, 2)):
        w, kw, sw, pw = next(columns)
        x, weight = rand(2, 4, h, w), rand(6, 4 // groups, k, kw)
        try:
            y = aten.convolution(x, weight, None, [stride, sw], [pad, pw], [1, 1], False, [0, 0], groups)
        except RuntimeError:  # padding beyond the kernel, or no output
            continue
        dy = torch.randn_like(y)
        want = aten.convolution_backward(dy, x, weight, None, [stride, sw], [pad, pw], [1, 1], False, [0, 0],
                                         groups, [True, False, False])[0]
        b = GraphBuilder("grad")
        out = conv2d_input_grad(b, b.input("dy", tuple(dy.shape)), b.input("w", tuple(weight.shape)),
                                (h, w), (stride, sw), (pad, pw), groups)
        got = run_graph(b.build([out]), {"dy": dy.numpy(), "w": weight.numpy()})[out]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=str((h, k, stride, pad, w, kw, sw, pw, groups)))
        checked += 1
    assert checked > 100


def test_convolution_weight_gradient_over_many_geometries() -> None:
    """The Conv with batch and channels swapped against torch in the reference interpreter, every
    combination (the end padding it needs is negative where the last rows of x are never read)."""
    from autofusion.frontends.conv_grad import conv2d_weight_grad
    from autofusion.ir.builder import GraphBuilder

    checked = 0
    columns = itertools.cycle(itertools.product((6, 7), (1, 3, 4), (1, 2, 3), (0, 1, 3)))
    for h, k, stride, pad in itertools.product((5, 8), (1, 2, 3, 5), (1, 2, 3), (0, 1, 2)):
        w, kw, sw, pw = next(columns)
        x, weight = rand(2, 4, h, w), rand(6, 4, k, kw)
        try:
            y = aten.convolution(x, weight, None, [stride, sw], [pad, pw], [1, 1], False, [0, 0], 1)
        except RuntimeError:  # padding beyond the kernel, or no output
            continue
        dy = torch.randn_like(y)
        want = aten.convolution_backward(dy, x, weight, None, [stride, sw], [pad, pw], [1, 1], False, [0, 0],
                                         1, [False, True, False])[1]
        b = GraphBuilder("grad")
        out = conv2d_weight_grad(b, b.input("dy", tuple(dy.shape)), b.input("x", tuple(x.shape)), (k, kw),
                                 (stride, sw), (pad, pw))
        got = run_graph(b.build([out]), {"dy": dy.numpy(), "x": x.numpy()})[out]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=str((h, k, stride, pad, w, kw, sw, pw)))
        checked += 1
    assert checked > 60


@pytest.mark.parametrize("torch_mask", [[False, True, False], [True, False, False]], ids=["weight", "input"])
def test_a_gradient_torch_computes_gets_a_node_of_its_own(torch_mask: list[bool]) -> None:
    """torch's part (the weight or the input gradient) moves to a node of its own, which stays with
    torch; the first node keeps the rest and converts; each getitem reads the node computing its output."""
    from autofusion.frontends.fx_aten import split_gradients

    x, weight, dy = rand(2, 4, 8, 8), rand(6, 4, 3, 3), rand(2, 6, 4, 4)

    def grads(dy: Any, x: Any, weight: Any) -> Any:
        return aten.convolution_backward(dy, x, weight, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])

    gm = aten_graph(grads, dy, x, weight)
    node = next(n for n in gm.graph.nodes if "convolution_backward" in str(n.target))
    assert is_convertible(node)
    split = split_gradients(node, torch_mask, "torch's, measured faster")
    gm.recompile()
    assert list(node.args[10]) == [not t for t in torch_mask[:2]] + [True] and list(split.args[10]) == torch_mask
    assert is_convertible(node) and not is_convertible(split)
    readers = {u.args[1]: u for u in [*node.users, *split.users]}
    for index, reader in readers.items():
        assert reader.args[0] is (split if torch_mask[index] else node)
        assert is_convertible(reader) == (not torch_mask[index])
    for got, want in zip(gm(dy, x, weight), grads(dy, x, weight)):
        torch.testing.assert_close(got, want)


def test_each_gradient_is_measured_once_per_geometry(monkeypatch: Any) -> None:
    import autofusion.bench.timing as timing
    import autofusion.torch_conv_grad as conv_grad

    x, weight, dy = rand(2, 4, 8, 8), rand(6, 4, 3, 3), rand(2, 6, 4, 4)
    gm = aten_graph(lambda dy, x, w: aten.convolution_backward(dy, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0],
                                                               1, [True, True, True]), dy, x, weight)
    node = next(n for n in gm.graph.nodes if "convolution_backward" in str(n.target))
    assert conv_grad.measurable(node, "input") and conv_grad.measurable(node, "weight")
    wins = {"ours": 1.0, "torch": 2.0}
    script = [wins, wins, wins, {"ours": 2.0, "torch": 1.0}, {"ours": 2.0, "torch": 1.0}]
    timed: list[dict[str, float]] = []

    def fake_medians(runners: Any, **_: Any) -> dict[str, float]:
        for run in runners.values():
            run()  # both compute: ours was checked against torch's before
        timed.append(script[len(timed)])
        return timed[-1]

    monkeypatch.setattr(conv_grad, "_choices", {})
    monkeypatch.setattr(timing, "round_robin_medians", fake_medians)
    assert conv_grad.ours_faster(node, "input") and conv_grad.ours_faster(node, "input")  # won twice; then kept
    assert len(timed) == 2
    assert not conv_grad.ours_faster(node, "weight")  # each part on its own: won, then lost the second
    assert len(timed) == 4
    monkeypatch.setattr(conv_grad, "_choices", {})
    timed[:] = script[:4]
    assert not conv_grad.ours_faster(node, "input") and len(timed) == 5  # lost the first: no second


def test_unsupported_backward_forms_stay_eager() -> None:
    dy, x = rand(5, 33), rand(5, 33)
    gm = aten_graph(lambda dy, x: aten.gelu_backward(dy, x, approximate="tanh"), dy, x)
    assert not any(is_convertible(n) for n in gm.graph.nodes if n.op == "call_function")
    w = rand(33)
    _, mean, rstd = aten.native_layer_norm(x, [33], w, None, 1e-5)
    gm = aten_graph(lambda dy, x, mean, rstd, w: aten.native_layer_norm_backward(
        dy, x, [33], mean, rstd, w, None, [True, True, False]), dy, x, mean, rstd, w)
    assert not any(is_convertible(n) for n in gm.graph.nodes if "native_layer_norm_backward" in str(n.target))


@pytest.mark.parametrize("name", ["encoder", "cnn", "cnn-split", "cnn-ours"])
def test_training_steps_match_eager(name: str, caplog: Any, monkeypatch: Any) -> None:
    """20 SGD steps with backend="autofusion" against eager: every step's loss and the parameters
    after the last within 1e-4 relative. The encoder's forward and backward graphs each compile
    whole, as one partition (views of their inputs stay torch's). The CNN's convolution gradients are computed by torch or by the
    SuperKernels, as measured: ``cnn`` torch's all; ``cnn-split`` the input gradient ours, the weight
    gradients torch's; ``cnn-ours`` all ours (the backward is then one partition with nothing left
    to torch). The rest (its batch norm in training mode and its backward, the ReLU backwards, the
    linear layer's and the loss's gradients) is compiled."""
    import autofusion.torch_conv_grad as conv_grad

    ours = {"cnn-split": ("input",), "cnn-ours": ("input", "weight")}.get(name, ())
    monkeypatch.setattr(conv_grad, "ours_faster", lambda node, part: part in ours)
    torch.manual_seed(0)
    model = transformer_encoder(d=32, heads=4, outputs=4) if name == "encoder" else small_cnn(width=8)
    data = (torch.randn(2, 8, 32), torch.randn(2, 8, 4)) if name == "encoder" else (
        torch.randn(2, 3, 8, 8), torch.randn(2, 4))
    eager_losses, _, eager_model = train(model, data, None, 20)
    with caplog.at_level("INFO", logger="autofusion.torch"), warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionFallbackWarning)  # no partition gave up
        losses, _, trained = train(model, data, "autofusion", 20)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    for (pname, p), q in zip(trained.named_parameters(), eager_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6, err_msg=pname)
    lines = [r.getMessage() for r in caplog.records]
    forward = next(line for line in lines if "forward graph:" in line)
    backward = next(line for line in lines if "backward graph:" in line)
    if name == "encoder":  # one partition each; torch keeps only views of the graph's inputs
        for line in (forward, backward):
            assert "in 1 partition(s); left to eager: " in line, line
            left = line.split("left to eager: ")[1].split(", ")
            assert all("(a view of an input: free in torch)" in item for item in left), line
        return
    # one partition; only the batch norm's int64 step counter (num_batches_tracked + 1) stays eager
    assert "in 1 partition(s); left to eager: add (output not a static float32 tensor) x1" in forward, forward
    assert "threshold_backward" not in backward and "batch_norm" not in backward, backward
    if name == "cnn-ours":  # the linear layer's transposed weight, a view, is torch's
        assert "in 1 partition(s); left to eager: t (a view of an input: free in torch) x1" in backward, backward
        return
    # the two weight gradients alone (cnn-split), or with the input gradient, are torch's, as are the
    # outputs read from them
    assert f"in {1 if name == 'cnn-split' else 2} partition(s)" in backward, backward
    assert "convolution_backward (torch's, measured faster) x2" in backward, backward
    assert f"getitem (an output its op leaves to torch) x{3 if name == 'cnn-split' else 5}" in backward, backward


def test_threshold_backward_passes_the_gradient_of_a_nan() -> None:
    """torch zeroes the gradient where x <= threshold: a NaN input passes it (NaN <= 0 is false)."""
    dy = torch.ones(6)
    x = torch.tensor([float("nan"), -1.0, 0.0, 2.0, 0.5, -0.0])
    check_aten(lambda dy, x: aten.threshold_backward(dy, x, 0.0), dy, x)


def test_zero_dimensional_reductions_stay_eager() -> None:
    gm = aten_graph(lambda x: aten.sum.dim_IntList(x, [0]) + 1.0, torch.tensor(2.0))
    assert not any(is_convertible(n) for n in gm.graph.nodes if "sum" in str(n.target))


def test_a_node_whose_gradients_go_both_ways_is_split(monkeypatch: Any) -> None:
    """torch's input gradient, ours the weight's: torch's part gets a node of its own, the bias
    goes with ours; the graph computes what torch does."""
    import autofusion.torch_conv_grad as conv_grad
    from autofusion.torch_backend import _assign_conv_gradients

    x, weight, dy = rand(2, 4, 8, 8), rand(6, 4, 3, 3), rand(2, 6, 4, 4)

    def grads(dy: Any, x: Any, w: Any) -> Any:
        return aten.convolution_backward(dy, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])

    gm = aten_graph(grads, dy, x, weight)
    monkeypatch.setattr(conv_grad, "ours_faster", lambda node, part: part == "weight")
    _assign_conv_gradients(gm)
    nodes = [n for n in gm.graph.nodes if "convolution_backward" in str(n.target)]
    assert [list(n.args[10]) for n in nodes] == [[False, True, True], [True, False, False]]
    assert [is_convertible(n) for n in nodes] == [True, False]
    for got, want in zip(gm(dy, x, weight), grads(dy, x, weight)):
        torch.testing.assert_close(got, want)


def test_torch_keeps_the_gradients_it_computes_faster_or_that_fail_to_measure(monkeypatch: Any) -> None:
    """A node whose measurements say torch, or fail (with a warning), stays whole and eager; one
    asking for no weight gradient too."""
    import autofusion.torch_conv_grad as conv_grad
    from autofusion.frontends.fx_aten import TORCH_KEEPS
    from autofusion.torch_backend import _assign_conv_gradients

    x, weight, dy = rand(2, 4, 8, 8), rand(6, 4, 3, 3), rand(2, 6, 4, 4)

    def graph(mask: list[bool]) -> Any:
        return aten_graph(lambda dy, x, w: aten.convolution_backward(dy, x, w, [6], [2, 2], [1, 1], [1, 1], False,
                                                                     [0, 0], 1, mask), dy, x, weight)

    def broken(node: Any, part: str) -> Any:
        raise AssertionError("a compiler bug")

    monkeypatch.setattr(conv_grad, "_choices", {})
    monkeypatch.setattr(conv_grad, "_runners", broken)
    for mask in ([True, True, True], [True, False, True]):
        gm = graph(mask)
        with pytest.warns(AutofusionFallbackWarning, match="gradient stays with torch .AssertionError: a compiler bug"):
            _assign_conv_gradients(gm)
        (node,) = [n for n in gm.graph.nodes if "convolution_backward" in str(n.target)]
        assert node.meta[TORCH_KEEPS] and list(node.args[10]) == mask and not is_convertible(node)
    monkeypatch.setattr(conv_grad, "ours_faster", lambda node, part: False)
    gm = graph([True, False, False])
    _assign_conv_gradients(gm)
    (node,) = [n for n in gm.graph.nodes if "convolution_backward" in str(n.target)]
    assert not is_convertible(node)


def test_stored_order_names_permuted_dense_tensors_only() -> None:
    from autofusion.frontends.fx_nodes import stored_order

    w = torch.randn(6, 8)
    assert stored_order(w.t()) == (1, 0)
    assert stored_order(torch.randn(2, 3, 4).permute(2, 0, 1)) == (1, 2, 0)
    assert stored_order(w) is None  # contiguous: read as it is
    assert stored_order(w[:, ::2]) is None and stored_order(torch.randn(6, 1).expand(6, 8)) is None


def test_views_of_inputs_stay_torchs_and_a_transposed_one_is_read_in_place(monkeypatch: Any) -> None:
    """A view of a run-time input is torch's (free there; in a partition the view it returns, the
    transposed weight a training forward saves, was a copy the kernel wrote), and the partition
    reading the transposed weight takes its memory as it is stored, permuted back in the graph."""
    from autofusion.torch_backend import compile_graph

    x, w = torch.randn(5, 8), torch.randn(6, 8)
    gm = aten_graph(lambda x, w: (torch.relu(x @ w.t()), w.t()), x, w)
    addresses_seen: list[list[int]] = []
    run = CompiledModel.run_addresses
    monkeypatch.setattr(CompiledModel, "run_addresses", lambda self, shapes, inputs, outputs, threads=None:
                        addresses_seen.append(list(inputs)) or run(self, shapes, inputs, outputs, threads))
    out, saved = compile_graph(gm, [x, w])(x, w)
    torch.testing.assert_close(out, torch.relu(x @ w.t()))
    assert saved.data_ptr() == w.data_ptr() and saved.stride() == (1, 8)  # torch's view, no copy
    assert len(addresses_seen) == 1 and w.data_ptr() in addresses_seen[0]


@pytest.mark.parametrize("name", ["encoder", "cnn"])
def test_training_with_a_batch_size_that_changes_stays_compiled_and_matches_eager(name: str, monkeypatch: Any) -> None:
    """A batch (and for the CNN an image size) that changes between steps makes Dynamo trace symbolic
    forward and backward graphs; each is compiled per step's sizes, so every step runs SuperKernels,
    and the losses and parameters stay eager's."""
    import copy

    import autofusion.torch_backend as backend

    runs = []
    call = backend.AutofusionSubmodule.__call__
    monkeypatch.setattr(backend.AutofusionSubmodule, "__call__", lambda runner, *a: runs.append(1) or call(runner, *a))
    torch.manual_seed(6)
    model = transformer_encoder(d=32, heads=4, layers=1, outputs=4) if name == "encoder" else small_cnn(width=8)
    ours, twin = copy.deepcopy(model), copy.deepcopy(model)
    step = torch.compile(ours, backend="autofusion")
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ours, twin)]
    sizes = ((2, 8), (3, 8), (2, 12), (3, 8)) if name == "cnn" else ((2, 8), (3, 8), (2, 5), (3, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionFallbackWarning)
        for batch, size in sizes:
            data = ((torch.randn(batch, size, 32), torch.randn(batch, size, 4)) if name == "encoder" else
                    (torch.randn(batch, 3, size, size), torch.randn(batch, 4)))
            before = len(runs)
            losses = []
            for model_, opt in zip((step, twin), opts):
                opt.zero_grad()
                loss = model_(*data)
                loss.backward()
                opt.step()
                losses.append(float(loss.item()))
            assert len(runs) >= before + 2, f"batch {batch}, size {size}: forward and backward ran no SuperKernel"
            np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    for (pname, p), q in zip(ours.named_parameters(), twin.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6, err_msg=pname)
