"""torch.compile(model, backend="autofusion"): FX -> IR -> optimize -> C backend, eager fallback."""

from __future__ import annotations

import copy
import importlib
import os
import subprocess
import sys
import textwrap
import tomllib
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from autofusion.torch_backend import AutofusionFallbackWarning, PerSizeGraph, autofusion_backend  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-4, 1e-5


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Recorder:
    """A backend that delegates to autofusion and keeps what it returned."""

    def __init__(self) -> None:
        self.results: list[object] = []

    def __call__(self, gm, example_inputs):
        out = autofusion_backend(gm, example_inputs)
        self.results.append(out)
        return out

    def compiled_partitions(self) -> int:
        return sum(1 for r in self.results if isinstance(r, torch.fx.GraphModule)
                   for _, m in r.named_children() if type(m).__name__ == "AutofusionPartition")


class TransformerBlock(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        att = torch.softmax(q @ k.transpose(-2, -1) * (1.0 / (d // self.heads) ** 0.5), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def _randomize_batchnorm(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)


def _check(model: nn.Module, *inputs, backend="autofusion", fallback_expected=False):
    model.eval()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = model(*inputs)
        got = torch.compile(model, backend=backend)(*inputs)
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    fallbacks = [w for w in caught if issubclass(w.category, AutofusionFallbackWarning)]
    assert bool(fallbacks) == fallback_expected, [str(w.message) for w in fallbacks]
    return got


def test_transformer_block_matches_eager():
    torch.manual_seed(0)
    recorder = Recorder()
    _check(TransformerBlock(), torch.randn(2, 8, 16), backend=recorder)
    assert recorder.compiled_partitions() >= 1


def test_cnn_matches_eager_also_after_a_shape_change():
    torch.manual_seed(1)
    model = SmallCNN()
    _randomize_batchnorm(model)
    model.eval()
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder)
    with torch.no_grad():
        for batch in (2, 3):  # the second shape recompiles with symbolic sizes: compiled per size
            x = torch.randn(batch, 3, 16, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
    assert recorder.compiled_partitions() >= 1
    assert any(isinstance(r, PerSizeGraph) for r in recorder.results)


class CountingRuns:
    """Counts the compiled partitions' runs and compiles (monkeypatched into the backend)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import autofusion.torch_backend as backend

        self.runs = self.compiles = 0
        call, compile_partition = backend.AutofusionSubmodule.__call__, backend._compile_partition

        def counted_call(runner, *args):
            self.runs += 1
            return call(runner, *args)

        def counted_compile(*args, **kwargs):
            self.compiles += 1
            return compile_partition(*args, **kwargs)

        monkeypatch.setattr(backend.AutofusionSubmodule, "__call__", counted_call)
        monkeypatch.setattr(backend, "_compile_partition", counted_compile)


def test_every_new_size_is_fused_and_a_size_seen_before_is_not_compiled_again(monkeypatch):
    """Once a shape changes, Dynamo traces with symbolic sizes; the graph is compiled for each call's
    sizes (PerSizeGraph), so every call runs SuperKernels, and a size seen before reuses its build."""
    torch.manual_seed(4)
    model = TransformerBlock().eval()
    counter = CountingRuns(monkeypatch)
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionFallbackWarning)
        # 8 compiles the static graph; 12 makes Dynamo trace a symbolic one, compiled for 12, then
        # for 5; 12 again reuses its build; 8 is new to the symbolic graph
        for i, (seq, compiles) in enumerate(((8, True), (12, True), (5, True), (12, False), (8, True))):
            x = torch.randn(2, seq, 16)
            runs, before = counter.runs, counter.compiles
            torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
            assert counter.runs > runs, f"call {i} (seq {seq}) ran no SuperKernel"
            assert (counter.compiles > before) == compiles, f"call {i} (seq {seq})"
    per_size = [r for r in recorder.results if isinstance(r, PerSizeGraph)]
    assert len(per_size) == 1
    inputs = [next(k[0] for k in key if isinstance(k, tuple) and len(k[0]) == 3) for key in per_size[0]._compiled]
    assert sorted(inputs) == [(2, 5, 16), (2, 8, 16), (2, 12, 16)]


def test_sizes_first_called_from_several_threads_at_once_compile_once_each(monkeypatch, problems_from_threads):
    """Eight threads call a graph traced with symbolic sizes at four sizes it has not seen, all at
    once: each size compiles once (the others wait for it), and every result is eager's."""
    import numpy as np

    torch.manual_seed(7)
    model = TransformerBlock().eval()
    counter = CountingRuns(monkeypatch)
    compiled = torch.compile(model, backend="autofusion")
    with torch.no_grad():
        compiled(torch.randn(2, 8, 16))  # the static graph
        before = counter.compiles
        compiled(torch.randn(2, 9, 16))  # the symbolic one, compiled for 9
        per_size = counter.compiles - before  # partitions compiled for one size
        inputs = [torch.randn(2, seq, 16) for seq in (3, 5, 6, 7)]
        expected = [{"y": model(x).numpy()} for x in inputs]
    before = counter.compiles

    def call(x):
        with torch.no_grad():
            return {"y": compiled(x).numpy()}

    assert problems_from_threads(call, inputs, threads=8, calls=6, expected=expected,
                                 same=lambda got, want: np.allclose(got, want, rtol=RTOL, atol=ATOL)) == []
    assert per_size >= 1 and counter.compiles - before == 4 * per_size


def test_dynamic_true_fuses_from_the_first_call_and_a_build_follows_numbers_read_from_inputs(monkeypatch):
    """With ``dynamic=True`` the first graph is symbolic, and Dynamo passes a LayerNorm's eps as a
    0-d tensor it reads with ``.item()``: a build holds the number as a constant, so the same sizes
    with another eps are another build (called directly here: Dynamo itself also guards the value)."""
    from autofusion.frontends.fx_shapes import scalar_inputs

    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16)).eval()
    counter = CountingRuns(monkeypatch)
    calls = []
    call = PerSizeGraph.__call__
    monkeypatch.setattr(PerSizeGraph, "__call__", lambda graph, *args: calls.append((graph, args)) or call(graph, *args))
    compiled = torch.compile(model, backend="autofusion", dynamic=True)
    x = torch.randn(5, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionFallbackWarning)
        torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
        assert counter.runs == 1 and len(calls) == 1  # the symbolic graph, fused at the first call
        graph, args = calls[0]
        (position,) = scalar_inputs(graph.gm)
        again = list(args)
        again[position] = torch.full_like(args[position], 0.5)  # (same shape and dtype)
        model[2].eps = 0.5
        (out,) = graph(*again)
        torch.testing.assert_close(out, model(x), rtol=RTOL, atol=ATOL)
        assert counter.runs == 2 and len(graph._compiled) == 2


def test_a_per_size_build_takes_the_choices_tuned_at_nearby_sizes(monkeypatch):
    """The first graph's products are tuned at its sizes; a build for another size of the symbolic
    graph asks the tuner for choices at nearby rows instead of measuring each size again."""
    import autofusion.runtime as runtime

    asked = []
    init = runtime.CompiledModel.__init__

    def recording_init(model, plan, *args, **kwargs):
        asked.append(kwargs.get("tune_nearby", False))
        init(model, plan, *args, **kwargs)

    monkeypatch.setattr(runtime.CompiledModel, "__init__", recording_init)
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).eval()
    compiled = torch.compile(model, backend="autofusion")
    with torch.no_grad():
        for rows in (4, 6):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
    assert asked[0] is False and asked[-1] is True


def test_per_size_graphs_keep_the_latest_sizes_and_fall_back_to_eager_where_sizes_stay_symbolic(monkeypatch):
    import autofusion.torch_backend as backend

    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).eval()
    recorder = Recorder()
    monkeypatch.setattr(PerSizeGraph, "MAX_SIZES", 2)
    compiled = torch.compile(model, backend=recorder)
    with torch.no_grad():
        for rows in (2, 3, 4, 5):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
        per_size = next(r for r in recorder.results if isinstance(r, PerSizeGraph))
        assert len(per_size._compiled) == 2  # the two latest sizes
        monkeypatch.setattr(backend, "specialized", lambda gm, args: (_ for _ in ()).throw(RuntimeError("no")))
        with pytest.warns(AutofusionFallbackWarning, match="runs eagerly at these sizes: it could not be compiled "
                                                           "for them .RuntimeError: no"):
            x = torch.randn(6, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)


class WithUnsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.cumprod(y * 0.5 + 0.75, dim=-1)  # no IR equivalent: stays in eager PyTorch
        return torch.tanh(self.b(y))


def test_unsupported_op_runs_eagerly_between_compiled_parts():
    torch.manual_seed(2)
    recorder = Recorder()
    _check(WithUnsupported(), torch.randn(4, 8), backend=recorder)
    assert recorder.compiled_partitions() == 2


def test_partition_that_fails_to_compile_warns_and_runs_eagerly(monkeypatch):
    def failing_optimize(graph, *args, **kwargs):
        raise ValueError("no plan for this graph")

    import autofusion.api

    monkeypatch.setattr(autofusion.api, "optimize", failing_optimize)
    recorder = Recorder()
    _check(WithUnsupported(), torch.randn(4, 8), backend=recorder, fallback_expected=True)
    assert recorder.compiled_partitions() == 0


def test_graph_needing_gradients_compiles_forward_and_backward():
    """A graph that needs gradients goes through aot_autograd (tests/test_torch_training.py has the
    training runs): the output and the gradients match eager's."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    twin = copy.deepcopy(model)
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionFallbackWarning)
        out = torch.compile(model, backend="autofusion")(x)
    expected = twin(x)
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)
    out.sum().backward()
    expected.sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL)


def test_a_tensor_made_in_forward_is_frozen_in_a_graph_needing_gradients():
    """A constant tensor the forward makes (transformers' GPT-2 and BERT have some) is a real tensor
    attribute of the graph, which aot_autograd hands to the compiler under its fake-tensor mode:
    the compile failed as a whole (``aten.detach`` of a real tensor under fake mode)."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return (self.lin(x) * torch.tensor([1.0, 2.0, 3.0])).sum()

    torch.manual_seed(4)
    model, x = Scaled(), torch.randn(4, 3)
    twin = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionFallbackWarning)
        loss = torch.compile(model, backend="autofusion")(x)
    expected = twin(x)
    torch.testing.assert_close(loss, expected, rtol=RTOL, atol=ATOL)
    loss.backward()
    expected.backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL)


def test_outputs_kept_from_earlier_calls_are_never_overwritten():
    """A call's outputs take memory that earlier calls' outputs gave back (runtime/output_pool.py):
    outputs still held, whole or through a view, keep theirs."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU())
    compiled = torch.compile(copy.deepcopy(model), backend="autofusion")
    xs = [torch.randn(32, 64) for _ in range(12)]
    with torch.no_grad():
        kept = [compiled(x) for x in xs[:3]]
        view = compiled(xs[3])[5:9]  # only a view of this output is left
        for x in xs[4:]:
            compiled(x)  # results dropped: their memory goes back to the pool
        addresses = {t.data_ptr() for t in kept} | {view.data_ptr()}
        later = compiled(xs[0])
        assert later.data_ptr() not in addresses
        for x, out in zip(xs, kept):
            torch.testing.assert_close(out, model(x), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(view, model(xs[3])[5:9], rtol=RTOL, atol=ATOL)


def test_graph_with_nothing_supported_is_left_to_eager():
    class OnlyUnsupported(nn.Module):
        def forward(self, x):
            return torch.cumprod(x, dim=0)

    recorder = Recorder()
    _check(OnlyUnsupported(), torch.rand(5, 3), backend=recorder)
    assert recorder.compiled_partitions() == 0
    assert not any(isinstance(r, torch.fx.GraphModule) for r in recorder.results)


def test_entry_point_is_declared_and_resolves():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["torch_dynamo_backends"]["autofusion"]
    module, _, attr = target.partition(":")
    assert getattr(importlib.import_module(module), attr) is autofusion_backend


def test_torch_discovers_the_backend_through_package_metadata(tmp_path):
    # a minimal installed-distribution record, as pip would write it, pointing at this checkout
    dist = tmp_path / "autofusion-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: autofusion\nVersion: 0.1.0\n")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = project["project"]["entry-points"]["torch_dynamo_backends"]
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    script = textwrap.dedent("""
        import torch, torch._dynamo
        assert "autofusion" in torch._dynamo.list_backends(), torch._dynamo.list_backends()
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Sigmoid()).eval()
        x = torch.randn(2, 4)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(m, backend="autofusion")(x), m(x), rtol=1e-4, atol=1e-5)
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_importing_autofusion_does_not_import_torch():
    script = ("import sys, autofusion, autofusion.frontends, autofusion.torch_backend; "
              "assert 'torch' not in sys.modules, 'torch imported'")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_compiled_module_is_correct_from_eight_threads_at_once(problems_from_threads):
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    compiled = torch.compile(model, backend="autofusion")
    inputs = [torch.randn(2, 8, 16) for _ in range(4)]

    def call(x):
        with torch.no_grad():
            return {"y": compiled(x).numpy()}

    assert problems_from_threads(call, inputs, threads=8, calls=200) == []


class BasicBlock(nn.Module):
    """ResNet's basic block as torchvision writes it: ReLU(inplace=True) after each norm."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


def test_inplace_relu_of_a_cnn_fuses_into_one_partition():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), BasicBlock())
    _randomize_batchnorm(model)
    recorder = Recorder()
    _check(model, torch.randn(2, 3, 12, 12), backend=recorder)
    assert recorder.compiled_partitions() == 1  # no ReLU left to eager between the convolutions
    graph = next(r for r in recorder.results if isinstance(r, torch.fx.GraphModule)).graph
    assert not [n for n in graph.nodes if n.op == "call_function" and "relu" in str(n.target)]


class SeenUpdate(nn.Module):
    """In-place updates someone sees: of a caller's tensor, and of a value read again afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        r = torch.nn.functional.relu(h, inplace=True)
        return r * 2 + h  # h is read after its update: eager sees relu(h) here


def test_an_inplace_update_someone_sees_stays_correct():
    torch.manual_seed(0)
    _check(SeenUpdate(), torch.randn(4, 8))
    x = torch.randn(4, 8)
    expected = x.clone().relu_() + 1
    got_input = x.clone()
    out = torch.compile(lambda t: t.relu_() + 1, backend="autofusion")(got_input)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(got_input, expected - 1)  # the caller's tensor was updated, as in eager


class Gpt2Style(nn.Module):
    """What GPT-2 and BERT blocks emit beyond linear layers: addmm (Conv1D), a split of the fused
    QKV read by getitem, torch.pow, a key cache started from torch.tensor([]) and concatenated, and
    scaled_dot_product_attention, causal or with a float mask."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.w = nn.Parameter(torch.randn(dim, 3 * dim) * 0.2)
        self.b = nn.Parameter(torch.randn(3 * dim) * 0.1)

    def forward(self, x, mask):
        b, t, d = x.shape
        qkv = torch.addmm(self.b, x.view(-1, d), self.w).view(b, t, 3 * d)
        q, k, v = qkv.split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        k = torch.cat([torch.tensor([], dtype=torch.float32), k], dim=-2)  # an empty cache's start
        causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        y = (causal + masked).transpose(1, 2).reshape(b, t, d)
        return 0.5 * y * (1.0 + torch.tanh(0.79788456 * (y + 0.044715 * torch.pow(y, 3.0))))


def test_transformer_ops_of_real_models_convert_into_one_partition():
    torch.manual_seed(0)
    recorder = Recorder()
    x, mask = torch.randn(2, 5, 16), torch.randn(2, 1, 5, 5)
    _check(Gpt2Style(), x, mask, backend=recorder)
    assert recorder.compiled_partitions() == 1
    graph = next(r for r in recorder.results if isinstance(r, torch.fx.GraphModule)).graph
    eager = [str(n.target) for n in graph.nodes if n.op in ("call_function", "call_method")]
    assert not eager, eager  # everything runs in the SuperKernel


def test_a_boolean_attention_mask_stays_eager_and_correct():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 4, 8)
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))

    def attend(q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask) * 2

    expected = attend(q)
    with torch.no_grad():
        got = torch.compile(attend, backend="autofusion")(q)
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)


def test_each_compile_says_what_it_fused_and_what_stayed_eager(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AUTOFUSION_LOG", "1")
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def f(x):
        return model(x).cumsum(0)  # cumsum is not converted

    with torch.no_grad():
        torch.compile(f, backend="autofusion")(torch.randn(3, 8))
    err = capsys.readouterr().err
    assert "autofusion: 3 ops, 2 fused in 1 partition(s); left to eager: cumsum (op not supported) x1" in err


def test_weights_updated_after_the_compile_are_not_served_stale():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    recorder = Recorder()
    fast = torch.compile(model, backend=recorder)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=RTOL, atol=ATOL)
        model[0].weight.mul_(-2.0)  # in place, after the weights were frozen into the kernels
        model[2].bias.add_(1.0)
        torch.testing.assert_close(fast(x), model(x), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(fast(x), model(x), rtol=RTOL, atol=ATOL)
    runners = [m.runner for r in recorder.results if isinstance(r, torch.fx.GraphModule)
               for _, m in r.named_children() if type(m).__name__ == "AutofusionPartition"]
    assert runners and all(r.rebuilds == 1 for r in runners)  # compiled again once, then reused


@pytest.mark.parametrize("source", [6, 2])
def test_causal_attention_with_more_or_fewer_keys_than_queries(source: int):
    torch.manual_seed(0)
    q, kv = torch.randn(1, 2, 4, 8), torch.randn(1, 2, source, 8)

    def attend(q, kv):
        return torch.nn.functional.scaled_dot_product_attention(q * 1.0, kv * 1.0, kv * 1.0, is_causal=True)

    with torch.no_grad():
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(attend, backend="autofusion")(q, kv), attend(q, kv),
                                   rtol=RTOL, atol=ATOL)


def _inplace_on_a_view_of_the_input(x):
    y = x.view(-1)
    torch.nn.functional.relu(y, inplace=True)
    return x * 2


def _inplace_with_a_view_read_later(x):
    a = x * 3
    v = a.view(-1)
    torch.nn.functional.relu(a, inplace=True)
    return v * 2


def _inplace_with_another_reader(x):
    a = x * 3
    s = a.cumsum(0)
    torch.nn.functional.relu(a, inplace=True)
    return s + a


@pytest.mark.parametrize("fn", [_inplace_on_a_view_of_the_input, _inplace_with_a_view_read_later,
                                _inplace_with_another_reader])
def test_inplace_updates_seen_through_views_or_other_readers_stay_eager(fn):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    expected_x = x.clone()
    expected = fn(expected_x)
    got_x = x.clone()
    with torch.no_grad():
        torch._dynamo.reset()
        got = torch.compile(fn, backend="autofusion")(got_x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_x, expected_x)  # the caller's tensor changed exactly as in eager


class SelfUpdating(nn.Module):
    """A buffer the model updates itself on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x):
        y = self.lin(x) + self.b
        self.b.add_(1.0)
        return y


def test_a_graph_with_updates_the_converter_cannot_follow_runs_eagerly(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("AUTOFUSION_LOG", "1")
    torch.manual_seed(0)
    torch._dynamo.reset()
    eager_model, model = SelfUpdating().eval(), SelfUpdating().eval()
    model.load_state_dict(eager_model.state_dict())
    fast = torch.compile(model, backend="autofusion")
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(x), eager_model(x), rtol=RTOL, atol=ATOL)
    assert "updates tensors in place where others may read them (add_); it runs eagerly" in capsys.readouterr().err


def test_weights_that_keep_changing_send_the_partition_to_eager():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    fast = torch.compile(model, backend="autofusion")
    x = torch.randn(2, 4)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):  # an update between every two calls: two rebuilds, then eager
            torch.testing.assert_close(fast(x), model(x), rtol=RTOL, atol=ATOL)
            model[0].bias.add_(0.5)
    messages = [str(w.message) for w in caught if issubclass(w.category, AutofusionFallbackWarning)]
    assert len(messages) == 1 and "keep changing" in messages[0]


def test_a_model_made_under_inference_mode_still_fuses():
    torch.manual_seed(0)
    torch._dynamo.reset()
    with torch.inference_mode():
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
        recorder = Recorder()
        x = torch.randn(3, 8)
        torch.testing.assert_close(torch.compile(model, backend=recorder)(x), model(x), rtol=RTOL, atol=ATOL)
    assert recorder.compiled_partitions() == 1


def test_a_model_fuses_alike_from_torch_and_from_its_onnx_export():
    """The same transformer block through torch.compile and through its ONNX export (the exporter
    torch ships): the same kernel count, the same kernel kinds, the same rules firing. Transposes
    of transposes are composed at conversion, as the exporter does, so that the attention product
    reads K in place."""
    import io
    from collections import Counter

    from autofusion.api import optimize
    from autofusion.bench.torch_models import transformer_encoder
    from autofusion.frontends.onnx_import import load_onnx

    torch.manual_seed(0)
    block = transformer_encoder(d=32, heads=4, layers=1).eval().blocks
    x = torch.randn(2, 8, 32)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(block, (x,), buffer, dynamo=False, opset_version=17)
    from_onnx = optimize(load_onnx(buffer.getvalue()))
    compiled = []

    def recording(gm, example_inputs):
        compiled.append(autofusion_backend(gm, example_inputs))
        return compiled[-1]

    with torch.inference_mode():
        out = torch.compile(block, backend=recording)(x)
    plans = [m.runner.model.plan for gm in compiled for m in gm.modules() if hasattr(m, "runner")]
    torch.testing.assert_close(out, block(x), rtol=RTOL, atol=1e-4)
    (from_fx,) = plans

    def kinds(plan):
        return Counter(g.template for g in plan.groups if g.template != "view")

    def rules(plan):
        return {r.name for g in plan.groups for r in g.rules}

    assert from_fx.kernels == from_onnx.kernels
    assert kinds(from_fx) == kinds(from_onnx)
    assert rules(from_fx) == rules(from_onnx)


class Embedder(nn.Module):
    """Token and position embeddings as transformers write them: int64 ids, a position buffer sliced
    to the sequence, a token-type buffer expanded."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions, self.types = nn.Embedding(50, 16), nn.Embedding(32, 16), nn.Embedding(2, 16)
        self.register_buffer("position_ids", torch.arange(32).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros((1, 32), dtype=torch.long), persistent=False)
        self.norm = nn.LayerNorm(16)

    def forward(self, ids):
        seq = ids.shape[1]
        types = self.token_type_ids[:, :seq].expand(ids.shape[0], seq)
        h = self.tokens(ids) + self.types(types) + self.positions(self.position_ids[:, :seq])
        h = self.norm(h)
        return h[:, 0], h[..., 1:5], h[None, :, 2], h[:, 1:-1:2]


def test_embeddings_from_int64_ids_and_buffers_compile_as_one_partition(caplog):
    """The ids pass as int64; what the model computes from its buffers alone (position ids, token
    types and their embeddings) is folded into constants once; indexing by slices, ints, None and
    ``...`` converts. Updating a buffer in place recompiles with its new values."""
    torch.manual_seed(0)
    model = Embedder().eval()
    ids = torch.randint(0, 50, (3, 9))
    recorder = Recorder()
    with caplog.at_level("INFO", logger="autofusion.torch"):
        outs = _check(model, ids, backend=recorder)
    assert recorder.compiled_partitions() == 1
    assert any("left to eager: none" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    fast = torch.compile(model, backend="autofusion")
    with torch.no_grad():
        fast(ids)
        model.position_ids.copy_(torch.arange(31, -1, -1).expand((1, -1)))  # an in-place update of a buffer
        for got, want in zip(fast(ids), model(ids)):
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert len(outs) == 4


def test_random_ops_on_buffers_are_never_folded():
    from autofusion.frontends.fx_import import foldable

    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x):
            return x * torch.rand_like(self.scale) + x * self.scale.exp()

    seen = []

    def backend(gm, example_inputs):
        for node, value in zip([n for n in gm.graph.nodes if n.op == "placeholder"], example_inputs):
            node.meta["_autofusion_real"] = value
        seen.extend((str(n.target), foldable(n)) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        return gm.forward

    with torch.no_grad():
        torch.compile(Noisy(), backend=backend)(torch.ones(4))
    assert [ok for target, ok in seen if "rand_like" in target] == [False], seen
    assert [ok for target, ok in seen if target == "exp"] == [True], seen


class MaskedAttention(nn.Module):
    """Attention with a padding mask built as transformers build it: index tensors from arange,
    the mask indexed by them, and-ed with a causal test, a boolean mask for SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x, mask):
        batch, seq = mask.shape
        b_idx = torch.arange(batch)[:, None, None]
        q_idx = torch.arange(seq)[None, :, None]
        k_idx = torch.arange(seq)[None, None, :]
        allowed = mask.bool()[b_idx, k_idx] & (k_idx <= q_idx)
        q, k, v = (t.view(batch, seq, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, dim=-1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])


def test_a_padding_mask_built_from_index_tensors_compiles_and_matches(caplog):
    """The mask is built inside the partition: ``mask.bool()`` a Cast, the mask indexed by the
    arange index tensors a Gather, ``&`` an And (operator.and_ is not an in-place update), a boolean
    SDPA mask a Where. torch's partitioner, which pulls getitems into their source's partition, is
    never handed a getitem it would move back and forth (it looped forever on this graph)."""
    import operator

    from autofusion.frontends.fx_import import mutates

    torch.manual_seed(0)
    model = MaskedAttention().eval()
    x = torch.randn(2, 6, 16)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(copy.deepcopy(gm.graph))
        return Recorder()(gm, example_inputs)

    with caplog.at_level("INFO", logger="autofusion.torch"):
        _check(model, x, mask, backend=backend)
    assert any("23 fused in 1 partition(s); left to eager: none" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    ands = [n for n in graphs[0].nodes if n.op == "call_function" and n.target is operator.and_]
    assert ands and not any(mutates(n) for n in ands)


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


MASK_OPS = {
    # BERT's additive mask from int64 ids: a cast, a scalar compare, arithmetic in float
    "bert_additive": (lambda x, ids: x + (1.0 - (ids != 0).float())[:, None, :] * -10000.0,
                      lambda: (torch.randn(2, 3, 5), torch.tensor([[3, 1, 0, 0, 7], [0, 2, 2, 0, 1]]))),
    "casts": (lambda x, ids: (ids.to(torch.bool), ids.long() == ids.to(torch.float32).to("cpu").long(),
                              x.to(torch.int64), (x > 0).to(x.dtype) * x),
              lambda: (torch.randn(3, 4) * 3, torch.tensor([[0, 1, -2, 5]]))),
    "logic": (lambda a, b: ((a > 0) & (b < 0), (a > 0) | ~(b >= 0), (a <= b) ^ (a == 0.5), torch.logical_not(a < b)),
              lambda: (torch.randn(4, 6), torch.randn(4, 6))),
    "int_compare": (lambda ids, other: (ids > 2, ids < -1, ids <= other, ids == 3, ids != other),
                    lambda: (torch.arange(-4, 8).view(3, 4), torch.tensor([[0, 1, 7, -3]]))),
    "views_of_ids": (lambda ids: ids.view(-1).unsqueeze(0).expand(2, -1).permute(1, 0).reshape(4, 6) == 3,
                     lambda: (torch.arange(12).view(3, 4) % 5,)),
    # indexing by index tensors over the leading axes: broadcast aranges, negative entries, a kept axis
    "index_tensors": (lambda x, mask: (x[torch.arange(4)[:, None], torch.tensor([[-1, 0, 2]])],
                                       mask.bool()[torch.arange(2)[:, None, None], torch.arange(5)[None, None, :]]),
                      lambda: (torch.randn(4, 5, 3), torch.tensor([[1, 1, 0, 0, 1], [1, 0, 1, 1, 1]]))),
}


@pytest.mark.parametrize("case", sorted(MASK_OPS))
def test_mask_building_ops_compile_in_the_partition(case, caplog):
    fn, inputs = MASK_OPS[case]
    with caplog.at_level("INFO", logger="autofusion.torch"):
        _check(_Fn(fn), *inputs())
    lines = [r.getMessage() for r in caplog.records if "partition(s)" in r.getMessage()]
    assert lines and all("in 1 partition(s); left to eager: none" in line for line in lines), lines


def test_an_index_tensor_out_of_range_stays_eager_with_torch_s_error():
    """torch's own error ("out of bounds"), never the converter's ("out of range") nor a wrong answer."""
    model = _Fn(lambda x: x[torch.tensor([0, 5])] * 2.0)
    with torch.no_grad(), pytest.raises(Exception, match="out of bounds"):
        torch.compile(model, backend="autofusion")(torch.randn(3, 2))


def test_mask_ops_torch_would_promote_or_cannot_place_stay_eager(caplog):
    """A bool tensor beside an int number is promoted by torch (mask == 2 is all False, mask & 1 an
    int64 tensor): those stay eager; so do casts spelled as a tensor type name and views as another
    dtype. Results match eager."""
    mask = torch.tensor([[True, False, True]])
    ids = torch.tensor([[3, 0, 7]])
    with caplog.at_level("INFO", logger="autofusion.torch"):
        _check(_Fn(lambda m, i: ((m == 2), (m < 2), (m & 1), i.type(torch.LongTensor) + 0, i.type(torch.float32),
                                 i.view(torch.float32) * 1.0)), mask, ids)
    lines = " ".join(r.getMessage() for r in caplog.records if "partition(s)" in r.getMessage())
    assert "eq (" in lines and "lt (" in lines and "and_ (" in lines and "view (" in lines, lines
    from autofusion.frontends.fx_import import mutates

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return Recorder()(gm, example_inputs)

    def update(m):
        view = m[:, None]
        view &= torch.tensor([[True, True, False]])
        return m.float()

    _check(_Fn(update), mask.clone(), backend=backend)
    assert any(mutates(n) for n in graphs[0].graph.nodes)  # &= on a view: an in-place update, seen as one


class LlamaBlock(nn.Module):
    """A Llama-style block as transformers writes it: RMSNorm (pow, mean, rsqrt), rotary position
    embeddings (cos and sin of the positions, halves rotated by slicing, neg and cat), grouped-query
    attention (SDPA with enable_gqa: 4 query heads read 2 key/value heads, causal) and a SiLU-gated
    MLP."""

    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate, self.up, self.down = nn.Linear(dim, 64, bias=False), nn.Linear(dim, 64, bias=False), nn.Linear(64, dim)
        self.norm = nn.Parameter(torch.rand(dim) + 0.5)

    def rms(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm

    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(self, x, positions):
        b, s, _ = x.shape
        angles = positions[:, :, None] * (1.0 / 10000 ** (torch.arange(0, self.head_dim, 2) / self.head_dim))
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        cos, sin = angles.cos(), angles.sin()
        h = self.rms(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
        h = self.rms(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def test_a_llama_block_compiles_whole_and_matches(caplog):
    torch.manual_seed(0)
    x, positions = torch.randn(2, 6, 32), torch.arange(6, dtype=torch.float32).expand(2, 6)
    with caplog.at_level("INFO", logger="autofusion.torch"):
        _check(LlamaBlock(), x, positions)
    lines = [r.getMessage() for r in caplog.records if "partition(s)" in r.getMessage()]
    assert lines and all("in 1 partition(s); left to eager: none" in line for line in lines), lines


def test_grouped_query_attention_repeats_each_key_value_head_in_a_row():
    """SDPA with enable_gqa over 4 query heads and 2 key/value heads: each key/value head serves two
    query heads in a row, as repeat_interleave gives them."""
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    model = _Fn(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    _check(model, q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="autofusion")(q, k, v), expected, rtol=RTOL, atol=ATOL)
