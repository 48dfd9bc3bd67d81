"""Realistic fuzz cases: the sizes and layer shapes real models give the kernels, seeded.

Where the small cases (fuzz/generator.py) draw dimensions 1 to 6, these cross every block of the
cores: GEMM M, N and K from 1 to about 1,100, each block size of the micro-kernels (12 and 6 rows,
16- and 32-column panel slices, K passes of 128-1,024) and that size +/- 1, odd primes;
convolutions with stride 1 and 2, padding, dilation, groups (depthwise included), 1x1 to 7x7
kernels over up to 56 x 56 positions, with BatchNormalization, activations, residual adds and
pooling windows after them; and 10-40-op graphs shaped like transformer and CNN layers (an
attention block, a residual block, an MLP) and recurrent ones (an LSTM cell unrolled over time as
the TorchScript exporter writes it, or the ONNX LSTM op). Each case also draws a batch size (1, 2), a thread
count (1, 2) and the core implementation its products are forced to (the tuner's candidates:
packed with each K pass, taps, im2col, OpenBLAS, depthwise; or the default), so that every kernel
variant and every choice the tuner can make is reached.
"""

from __future__ import annotations

import math

import numpy as np

from autofusion.codegen.cores import CoreChoice
from autofusion.fuzz.generator import STRATEGIES, CaseBuilder, FuzzCase

# GEMM sizes: 1, the micro-kernels' row blocks (6, 12) and panel slices (16, 32), the K passes
# (128-1,024), the conv tiles (64, 256) and the few-row kernel's padded K (512), each +/- 1; primes
GEMM_SIZES = (1, 2, 3, 5, 6, 7, 11, 12, 13, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 97, 127, 128, 129,
              255, 256, 257, 383, 511, 512, 513, 769, 1023, 1024, 1025, 1097)
MAX_GEMM_MACS = 60_000_000  # a case's product stays under ~0.1 GFLOP: the reference runs it in numpy
MAX_CONV_MACS = 40_000_000
SPATIAL = (1, 3, 5, 7, 8, 13, 14, 15, 28, 29, 56)
CHANNELS = (1, 3, 8, 16, 24, 31, 32, 33, 64)
CORE_CHOICES: tuple[CoreChoice | None, ...] = (
    None, None, None,  # the default chooser, as an untuned compile takes it
    CoreChoice("packed", 128), CoreChoice("packed", 256), CoreChoice("packed", 512), CoreChoice("packed", 1024),
    CoreChoice("taps", 128), CoreChoice("taps", 512), CoreChoice("taps", 1024), CoreChoice("repack", 256),
    CoreChoice("winograd", 128), CoreChoice("winograd", 512),  # a 3x3 convolution's Winograd transform
    CoreChoice("packed", 512, wide=True),  # the wide micro-kernel where the CPU has one
    CoreChoice("blas"),
    CoreChoice("depthwise"))
KINDS = ("gemm", "gemm", "conv", "conv", "attention", "residual", "mlp", "recurrent")


class _Realistic(CaseBuilder):
    def weight(self, shape: tuple[int, ...], fan_in: int) -> str:
        """A constant scaled by 1 / sqrt(fan_in): layer after layer keeps values near 1."""
        return self.const(shape, scale=1.0 / math.sqrt(max(1, fan_in)))

    def positive(self, n: int) -> str:
        return self.b.const((np.abs(self.rng.standard_normal(n)) + 0.5).astype(np.float32))

    def size(self, cap: int = 1100) -> int:
        return int(self.rng.choice([s for s in GEMM_SIZES if s <= cap]))

    def batchnorm(self, x: str, c: int) -> str:
        return self.b.op("BatchNormalization", x, self.positive(c), self.const((c,), 0.2), self.const((c,), 0.2),
                         self.positive(c))

    def activation(self, x: str) -> str:
        op = self.pick(["Relu", "Relu", "Gelu", "Tanh", "Sigmoid", "Clip", "none"])
        if op == "none":
            return x
        if op == "Clip":
            return self.b.op("Clip", x, self.b.const(np.array(0.0, np.float32)), self.b.const(np.array(6.0, np.float32)))
        return self.b.op(op, x)

    def gemm(self) -> str:
        m, k, n = self.size(), self.size(), self.size()
        while m * k * n > MAX_GEMM_MACS:  # shrink the largest until the product is affordable
            dims = [m, k, n]
            i = dims.index(max(dims))
            dims[i] = max(1, dims[i] // 2 - int(self.rng.integers(0, 2)))
            m, k, n = dims
        form = self.pick(["matmul", "matmul", "gemm", "batched", "activations"])
        b = self.b
        if form == "gemm":  # transposes, alpha and beta: the attributes Gemm can carry
            ta, tb = int(self.rng.integers(0, 2)), int(self.rng.integers(0, 2))
            a = self.add_input((k, m) if ta else (m, k))
            w = self.weight((n, k) if tb else (k, n), k)
            return b.op("Gemm", a, w, self.const((n,), 0.5), transA=ta, transB=tb,
                        alpha=float(self.rng.choice([1.0, 0.5])), beta=float(self.rng.choice([1.0, 2.0])))
        if form == "activations":  # both operands computed: attention's products
            heads = int(self.rng.choice([1, 2, 3]))
            a, c = self.add_input((heads, m, k)), self.add_input((heads, k, n))
            return self.activation(b.op("MatMul", a, c))
        lead = (int(self.rng.integers(1, 3)),) if form == "batched" else ()
        x = self.add_input(lead + (m, k))
        y = b.op("Add", b.op("MatMul", x, self.weight((k, n), k)), self.const((n,), 0.5))
        y = self.activation(y)
        if self.rng.integers(0, 3) == 0 and k == n:
            y = b.op("Add", y, x)  # a residual over the product's own input
        return y

    def conv(self) -> str:
        rng, b = self.rng, self.b
        n = int(rng.integers(1, 3))
        c = int(rng.choice(CHANNELS))
        h, w = int(rng.choice(SPATIAL)), int(rng.choice(SPATIAL))
        kernel = int(rng.choice([1, 1, 3, 3, 3, 5, 7]))
        stride = int(rng.choice([1, 1, 2]))
        dilation = int(rng.choice([1, 1, 1, 2]))
        groups = 1
        if c > 1 and rng.integers(0, 3) == 0:
            groups = c if rng.integers(0, 2) else next(g for g in (4, 3, 2, 1) if c % g == 0)
        out = groups * int(rng.choice([1, 2])) if groups == c else int(rng.choice([8, 16, 31, 32, 33, 48, 64]))
        out = max(groups, out // groups * groups)
        reach = dilation * (kernel - 1)
        pad = [int(rng.integers(0, reach // 2 + 2)) if reach else int(rng.integers(0, 2)) for _ in range(4)]
        h, w = max(h, reach + 1 - pad[0] - pad[2]), max(w, reach + 1 - pad[1] - pad[3])
        oh, ow = (h + pad[0] + pad[2] - reach - 1) // stride + 1, (w + pad[1] + pad[3] - reach - 1) // stride + 1
        while n * out * oh * ow * (c // groups) * kernel * kernel > MAX_CONV_MACS and (h > 7 or w > 7):
            h, w = max(7, h // 2), max(7, w // 2)
            h, w = max(h, reach + 1 - pad[0] - pad[2]), max(w, reach + 1 - pad[1] - pad[3])
            oh = (h + pad[0] + pad[2] - reach - 1) // stride + 1
            ow = (w + pad[1] + pad[3] - reach - 1) // stride + 1
        x = self.add_input((n, c, h, w))
        y = b.op("Conv", x, self.weight((out, c // groups, kernel, kernel), c // groups * kernel * kernel),
                 *([self.const((out,), 0.3)] if rng.integers(0, 2) else []), kernel_shape=(kernel, kernel),
                 strides=(stride, stride), dilations=(dilation, dilation), pads=tuple(pad), group=groups)
        if rng.integers(0, 2):
            y = self.batchnorm(y, out)
        y = self.activation(y)
        if rng.integers(0, 3) == 0:
            y = b.op("Add", y, self.add_input(self.shape(y)))  # a residual
        if rng.integers(0, 3) == 0 and min(self.shape(y)[2:]) >= 2:
            window = int(rng.choice([2, 3])) if min(self.shape(y)[2:]) >= 3 else 2
            pool_pad = int(rng.integers(0, 2)) if window == 3 else 0
            y = b.op(self.pick(["MaxPool", "AveragePool"]), y, kernel_shape=(window, window), strides=(2, 2),
                     pads=(pool_pad,) * 4)
        return y

    def layernorm(self, x: str, d: int) -> str:
        return self.b.op("LayerNormalization", x, self.positive(d), self.const((d,), 0.1), axis=-1, epsilon=1e-5)

    def attention(self) -> str:
        rng, b = self.rng, self.b
        batch, seq = int(rng.integers(1, 3)), int(rng.choice([1, 7, 8, 13, 32, 64, 128]))
        heads = int(rng.choice([1, 2, 4]))
        head = int(rng.choice([8, 16, 32]))
        d = heads * head
        x = self.add_input((batch, seq, d))
        mask = b.op("Mul", b.op("Sub", b.const(np.array(1.0, np.float32)), self.add_input((batch, 1, 1, seq))),
                    b.const(np.array(-0.5, np.float32)))
        h = self.layernorm(x, d)

        def heads_of(t: str, perm: tuple[int, ...]) -> str:
            split = b.op("Reshape", t, self.ints([batch, seq, heads, head]))
            return b.op("Transpose", split, perm=perm)

        q, k, v = (b.op("Add", b.op("MatMul", h, self.weight((d, d), d)), self.const((d,), 0.1)) for _ in range(3))
        scores = b.op("MatMul", heads_of(q, (0, 2, 1, 3)), heads_of(k, (0, 2, 3, 1)))
        scores = b.op("Add", b.op("Mul", scores, b.const(np.array(1.0 / math.sqrt(head), np.float32))), mask)
        context = b.op("MatMul", b.op("Softmax", scores, axis=-1), heads_of(v, (0, 2, 1, 3)))
        merged = b.op("Reshape", b.op("Transpose", context, perm=(0, 2, 1, 3)), self.ints([batch, seq, d]))
        out = b.op("Add", b.op("Add", b.op("MatMul", merged, self.weight((d, d), d)), self.const((d,), 0.1)), x)
        return self.mlp(out, d) if rng.integers(0, 2) else out

    def mlp(self, x: str | None = None, d: int = 0) -> str:
        b = self.b
        if x is None:
            d = self.size(512)
            x = self.add_input((int(self.rng.integers(1, 3)), self.size(128), d))
        wide = int(self.rng.choice([2, 4])) * d
        h = self.layernorm(x, d)
        h = b.op("Add", b.op("MatMul", h, self.weight((d, wide), d)), self.const((wide,), 0.1))
        h = b.op(self.pick(["Gelu", "Relu", "Tanh"]), h)
        h = b.op("Add", b.op("MatMul", h, self.weight((wide, d), wide)), self.const((d,), 0.1))
        return self.layernorm(b.op("Add", h, x), d)

    def residual(self) -> str:
        rng, b = self.rng, self.b
        n, c = int(rng.integers(1, 3)), int(rng.choice([8, 16, 32]))
        side = int(rng.choice([7, 14, 15, 28, 56 if c <= 16 else 28]))
        x = self.add_input((n, c, side, side))
        if rng.integers(0, 3) == 0:  # a stem first: 7x7 stride 2, then a 3x3 stride-2 MaxPool
            x = b.op("Relu", self.batchnorm(b.op("Conv", x, self.weight((c, c, 7, 7), c * 49), kernel_shape=(7, 7),
                                                 strides=(2, 2), pads=(3, 3, 3, 3)), c))
            x = b.op("MaxPool", x, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
        stride = int(rng.choice([1, 2]))
        out = c * stride

        def conv_bn(t: str, cin: int, kernel: int, s: int) -> str:
            p = kernel // 2
            return self.batchnorm(b.op("Conv", t, self.weight((out, cin, kernel, kernel), cin * kernel * kernel),
                                       kernel_shape=(kernel, kernel), strides=(s, s), pads=(p, p, p, p)), out)

        y = b.op("Relu", conv_bn(x, c, 3, stride))
        y = conv_bn(y, out, 3, 1)
        shortcut = x if stride == 1 else conv_bn(x, c, 1, stride)
        y = b.op("Relu", b.op("Add", y, shortcut))
        if rng.integers(0, 2):  # the head: global pooling and a classifier
            pooled = b.op("Flatten", b.op("GlobalAveragePool", y), axis=1)
            classes = self.size(1000)
            y = b.op("Gemm", pooled, self.weight((classes, out), out), self.const((classes,), 0.1), transB=1)
        return y


    def recurrent(self) -> str:
        """An LSTM cell unrolled over 2-6 steps, as models/lstm.py builds it (what the lstm_scan kind
        fuses), or the ONNX LSTM op over the same sequence; hidden and input sizes up to 300."""
        rng, b = self.rng, self.b
        batch, steps = int(rng.integers(1, 3)), int(rng.integers(2, 7))
        size, hidden = self.size(300), self.size(300)
        x = self.add_input((batch, steps, size))
        w_ih, w_hh = self.weight((4 * hidden, size), size), self.weight((4 * hidden, hidden), hidden)
        if rng.integers(0, 3) == 0:  # the ONNX op reads [steps, batch, size] and stacked weights
            seq = b.op("Transpose", x, perm=(1, 0, 2))
            w, r = b.op("Unsqueeze", w_ih, self.ints([0])), b.op("Unsqueeze", w_hh, self.ints([0]))
            _, y_h, _ = b.op_multi("LSTM", [seq, w, r, self.const((1, 8 * hidden), 0.1)], 3, hidden_size=hidden)
            return b.op("Squeeze", y_h, self.ints([0]))
        b_ih, b_hh = self.const((4 * hidden,), 0.1), self.const((4 * hidden,), 0.1)
        h = c = b.const(np.zeros((batch, hidden), np.float32))
        for t in range(steps):
            x_t = b.op("Gather", x, b.const(np.array(t, np.int64)), axis=1)
            gates = b.op("Add", b.op("Gemm", h, w_hh, b_hh, transB=1), b.op("Gemm", x_t, w_ih, b_ih, transB=1))
            i, f, g, o = b.op_multi("Split", [gates, self.ints([hidden] * 4)], 4, axis=1)
            c = b.op("Add", b.op("Mul", b.op("Sigmoid", f), c), b.op("Mul", b.op("Sigmoid", i), b.op("Tanh", g)))
            h = b.op("Mul", b.op("Sigmoid", o), b.op("Tanh", c))
        return h


def realistic_case(seed: int, strategy: str | None = None) -> FuzzCase:
    """The realistic case of ``seed``: one layer-shaped graph, its inputs, threads and forced core."""
    gen = _Realistic(seed)
    kind = gen.pick(KINDS)
    out = getattr(gen, kind)()
    graph = gen.b.build([out], name=f"fuzz{seed}_{kind}")
    cores = CORE_CHOICES[int(gen.rng.integers(0, len(CORE_CHOICES)))]
    return FuzzCase(seed, graph, gen.feeds, strategy or STRATEGIES[seed % len(STRATEGIES)], seed % 5 == 0,
                    threads=int(gen.rng.integers(1, 3)), cores=cores, shapes="realistic")
