"""The launch configurations a Triton kernel can run with: its block sizes and warps per program.

Every kernel renders with its meta-parameters as ``tl.constexpr`` arguments and its grid as
expressions of them, so one rendered module runs with any configuration of its list; the first is
the default (the sizes the backend always used), the rest the candidates the runtime's tuner times
on a device (``autofusion.runtime.triton_tuning``). A configuration is a tuple of (name, value)
pairs, the meta-parameters in the kernel's order and then ``num_warps``.

The spaces are small on purpose (at most eight): each candidate costs a compile and a timing the
first time a model runs on a device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Config = tuple[tuple[str, int], ...]

DEFAULT_WARPS = 4  # Triton's own default
POINTWISE_BLOCKS = (128, 256, 512, 1024)
LOOP_BLOCKS = (4096, 1024, 2048)  # a long row's blocks; the default first
# (BM, BN, BK) caps of a product's tile, the default first; each is cut to the problem's size
TILE_CAPS = ((64, 64, 32), (32, 32, 32), (64, 32, 32), (32, 64, 32), (128, 64, 32), (64, 128, 32),
             (128, 128, 32), (64, 64, 64))
REDUCTION_WARPS = (4, 1, 2, 8)


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tile(n: int, cap: int) -> int:
    """A tile side for a dimension of ``n``: a power of two up to ``cap``, 16 or more (``tl.dot``'s least)."""
    return min(cap, max(16, pow2_at_least(n)))


def config(meta: Sequence[tuple[str, int]], warps: int = DEFAULT_WARPS) -> Config:
    return (*((k, int(v)) for k, v in meta), ("num_warps", int(warps)))


def _unique(configs: Iterable[Config]) -> tuple[Config, ...]:
    return tuple(dict.fromkeys(configs))


def pointwise_configs(numel: int) -> tuple[Config, ...]:
    """Blocks of the flattened output: no block larger than the output needs; 8 warps for the large."""
    cap = max(POINTWISE_BLOCKS[0], pow2_at_least(numel))
    out = [config([("BLOCK", b)], w) for b in POINTWISE_BLOCKS if b <= cap
           for w in ((DEFAULT_WARPS,) if b <= 256 else (DEFAULT_WARPS, 8))]
    return _unique(out)


def row_configs(block: int) -> tuple[Config, ...]:
    """A row in one block: the block is the row's length rounded up, only the warps vary."""
    return _unique(config([("BLOCK", block)], w) for w in REDUCTION_WARPS)


def loop_configs() -> tuple[Config, ...]:
    """A row walked in blocks: the block and the warps vary."""
    return _unique(config([("BLOCK", b)], w) for b in LOOP_BLOCKS for w in (DEFAULT_WARPS, 8))


def tile_configs(m: int, n: int, k: int, fixed_bn: int | None = None) -> tuple[Config, ...]:
    """(BM, BN, BK) tiles of a product [m x k] @ [k x n], cut to its size; ``fixed_bn`` holds BN
    (a horizontal GEMM's products are laid out in tiles of BN along one grid axis)."""
    out = []
    for cm, cn, ck in TILE_CAPS:
        bm, bn, bk = tile(m, cm), fixed_bn or tile(n, cn), tile(k, ck)
        out.append(config([("BM", bm), ("BN", bn), ("BK", bk)], 8 if bm * bn >= 128 * 128 else DEFAULT_WARPS))
    return _unique(out)


def warps_configs(meta: Sequence[tuple[str, int]]) -> tuple[Config, ...]:
    """Block sizes fixed by the problem (an LSTM's whole state in one program): the warps vary."""
    return _unique(config(meta, w) for w in (DEFAULT_WARPS, 8))


def label(cfg: Config) -> str:
    """``BM=64 BN=64 BK=32 warps=4``: how reports name a configuration."""
    return " ".join(f"warps={v}" if k == "num_warps" else f"{k}={v}" for k, v in cfg)
