"""The learned cost model and the calibration file that carries it.

The learned model corrects the calibrated analytic model: it predicts
``log(measured / analytic)`` from features of the fused group (bytes in and out, bytes kept in
registers, flops and recomputation, op counts per class, shape) with a ridge regression plus
gradient-boosted regression trees on its residuals, and multiplies the analytic prediction by
``exp`` of that. The correction is clipped to the range seen in the fit, and a group whose structure
(op counts by class, inputs, outputs, rank) lies outside what was fitted gets none: the calibrated
analytic roofline answers for it instead of an extrapolated tree.

Everything is numpy and the file is plain JSON (no pickle): :class:`Calibration` holds the fitted
:class:`HardwareProfile`, the :class:`LearnedParams`, which of the two models is the default, the
held-out accuracy report and a note of the machine it was measured on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.decide.cost import (
    AnalyticCostModel,
    CostModel,
    GroupTerms,
    HardwareProfile,
    NodeWork,
    analytic_seconds,
    compute_parts,
    evaluations,
    group_terms,
)
from autofusion.decide.groups import group_io
from autofusion.decide.plan import CostBreakdown
from autofusion.graph.graph import Graph
from autofusion.ops.catalog import default_registry
from autofusion.ops.registry import OpClass, OpRegistry

FILE_FORMAT = "autofusion-calibration"
FILE_VERSION = 1
MODEL_KINDS = ("analytic", "learned")

FEATURES: tuple[str, ...] = (
    "log_bytes_in", "log_bytes_out", "log_kept_bytes", "log_flops", "log_matmul_flops", "log_math_flops",
    "log_recompute", "log_hoistable_recompute", "log_analytic", "memory_bound", "level", "nodes", "pointwise",
    "math_ops", "broadcast", "reduction", "reorganize", "opaque", "inputs", "outputs", "rank", "log_inner",
    "log_numel", "log_reduced_inner", "log_op_compute", "min_max_ops", "select_ops",
)
# features that describe a group's structure rather than its size: outside their fitted range the
# learned correction is not trusted (a horizontal GEMM or an LSTM loop is nothing like the kernels timed)
STRUCTURE = tuple(FEATURES.index(f) for f in (
    "nodes", "pointwise", "math_ops", "broadcast", "reduction", "reorganize", "opaque", "inputs", "outputs", "rank",
    "min_max_ops", "select_ops"))
MIN_MAX_OPS = frozenset({"Max", "Min"})
SELECT_OPS = frozenset({"Relu", "Clip", "Where", "LeakyRelu"})  # a select that may defeat vectorisation


def group_features(graph: Graph, nodes: Sequence[str], work: NodeWork, terms: GroupTerms,
                   profile: HardwareProfile, registry: OpRegistry) -> list[float]:
    """The feature vector (in :data:`FEATURES` order) of ``nodes`` run as one kernel.

    ``log_hoistable_recompute`` is the recomputation of values constant along the innermost axis
    (a per-row chain broadcast over columns), which a C compiler moves out of the inner loop.
    """
    counts = dict.fromkeys(OpClass, 0)
    math_ops = min_max = selects = 0
    numel, rank, inner, reduced_inner = 1, 0, 1, 0
    hoistable = 0.0
    demand = evaluations(graph, nodes, work) if terms.flops > terms.flops_once else {}
    by_name = graph.node_by_name
    for n in nodes:
        cost = work[n]
        if cost.view:
            continue
        counts[cost.op_class] += 1
        math_ops += cost.math
        min_max += cost.op in MIN_MAX_OPS
        selects += cost.op in SELECT_OPS
        outs = [graph.types[o] for o in by_name[n].outputs if o]
        shape = outs[0].shape if outs else ()
        if cost.numel >= numel:
            numel, rank, inner = cost.numel, len(shape), (shape[-1] if shape else 1)
        if cost.op_class is OpClass.REDUCTION:
            ins = [graph.types[i] for i in by_name[n].inputs[:1] if i]
            reduced_inner = max(reduced_inner, ins[0].shape[-1] if ins and ins[0].shape else 1)
        extra = demand.get(n, 0.0) - cost.numel
        if extra > 0 and (not shape or shape[-1] == 1):
            hoistable += cost.flops * extra / cost.numel
    seconds = analytic_seconds(terms, profile)
    inputs, outputs = group_io(graph, nodes)
    log2 = math.log2
    return [
        log2(1 + terms.bytes_in), log2(1 + terms.bytes_out), log2(1 + terms.intermediate_bytes),
        log2(1 + terms.flops), log2(1 + terms.matmul_flops), log2(1 + terms.math_flops),
        log2(1 + terms.recompute_flops), log2(1 + hoistable), log2(max(seconds.total, 1e-12)),
        1.0 if seconds.memory >= seconds.compute else 0.0, float(profile.level_index(terms.bytes)),
        float(len(nodes)), float(counts[OpClass.POINTWISE]), float(math_ops), float(counts[OpClass.BROADCAST]),
        float(counts[OpClass.REDUCTION]), float(counts[OpClass.REORGANIZE]), float(counts[OpClass.OPAQUE]),
        float(len(inputs)), float(len(outputs)), float(rank), log2(1 + inner), log2(1 + numel),
        log2(1 + reduced_inner), log2(1 + 1e9 * compute_parts(terms, profile.op_seconds)[0]), float(min_max),
        float(selects),
    ]


# -- gradient-boosted regression trees (numpy) ---------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """A binary regression tree as flat arrays; ``feature[i] < 0`` marks leaf ``i``."""

    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    value: tuple[float, ...]

    def predict_one(self, x: Sequence[float]) -> float:
        i = 0
        while self.feature[i] >= 0:
            i = self.left[i] if x[self.feature[i]] <= self.threshold[i] else self.right[i]
        return self.value[i]

    def to_json(self) -> dict[str, list[Any]]:
        return {k: list(getattr(self, k)) for k in ("feature", "threshold", "left", "right", "value")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tree:
        tree = cls(tuple(int(v) for v in data["feature"]), tuple(float(v) for v in data["threshold"]),
                   tuple(int(v) for v in data["left"]), tuple(int(v) for v in data["right"]),
                   tuple(float(v) for v in data["value"]))
        sizes = {len(tree.feature), len(tree.threshold), len(tree.left), len(tree.right), len(tree.value)}
        if len(sizes) != 1 or not tree.feature:
            raise ValueError("tree arrays differ in length or are empty")
        n = len(tree.feature)
        for i, f in enumerate(tree.feature):
            if f >= 0 and not (i < tree.left[i] < n and i < tree.right[i] < n):
                raise ValueError(f"tree node {i} points outside the tree")
        return tree


def fit_tree(x: np.ndarray, y: np.ndarray, depth: int, min_leaf: int) -> Tree:
    """A least-squares regression tree of at most ``depth`` levels, leaves of at least ``min_leaf``."""
    feature: list[int] = []
    threshold: list[float] = []
    left: list[int] = []
    right: list[int] = []
    value: list[float] = []

    def grow(rows: np.ndarray, level: int) -> int:
        i = len(feature)
        feature.append(-1)
        threshold.append(0.0)
        left.append(-1)
        right.append(-1)
        value.append(float(y[rows].mean()))
        split = _best_split(x[rows], y[rows], min_leaf) if level < depth else None
        if split is None:
            return i
        f, t = split
        feature[i], threshold[i] = f, t
        go_left = x[rows, f] <= t
        left[i] = grow(rows[go_left], level + 1)
        right[i] = grow(rows[~go_left], level + 1)
        return i

    grow(np.arange(len(y)), 0)
    return Tree(tuple(feature), tuple(threshold), tuple(left), tuple(right), tuple(value))


def _best_split(x: np.ndarray, y: np.ndarray, min_leaf: int) -> tuple[int, float] | None:
    n = len(y)
    if n < 2 * min_leaf:
        return None
    best_gain, best = 1e-12, None
    total = float(y.sum())
    k = np.arange(1, n)
    for f in range(x.shape[1]):
        order = np.argsort(x[:, f], kind="stable")
        xs, ys = x[order, f], y[order]
        csum = np.cumsum(ys)[:-1]
        # reduction of the squared error by splitting after the k-th smallest value
        gain = csum ** 2 / k + (total - csum) ** 2 / (n - k) - total * total / n
        valid = (k >= min_leaf) & (n - k >= min_leaf) & (xs[1:] > xs[:-1])
        if not valid.any():
            continue
        j = int(np.argmax(np.where(valid, gain, -np.inf)))
        if gain[j] > best_gain:
            best_gain, best = float(gain[j]), (f, float((xs[j] + xs[j + 1]) / 2))
    return best


# -- the learned model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LearnedParams:
    """A fitted correction ``log(measured / analytic) ~ ridge(x) + rate * sum(trees(x))``."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    intercept: float
    weights: tuple[float, ...]
    trees: tuple[Tree, ...]
    learning_rate: float
    clip: tuple[float, float]
    lower: tuple[float, ...] = ()  # per feature, the least value seen in the fit
    upper: tuple[float, ...] = ()  # and the greatest

    def in_domain(self, x: Sequence[float]) -> bool:
        """Whether the group's structure (op counts, inputs, outputs, rank) is like a fitted one's."""
        if not self.lower:
            return True
        return all(self.lower[i] <= x[i] <= self.upper[i] for i in STRUCTURE)

    def correction(self, x: Sequence[float]) -> float:
        """Predicted ``log(measured / analytic)`` for one feature vector; 0 (the analytic model's
        answer) for a group whose structure lies outside what was fitted."""
        if not self.in_domain(x):
            return 0.0
        z = [(v - m) / s for v, m, s in zip(x, self.mean, self.scale)]
        r = self.intercept + sum(w * v for w, v in zip(self.weights, z))
        r += self.learning_rate * sum(t.predict_one(z) for t in self.trees)
        return min(max(r, self.clip[0]), self.clip[1])

    def to_json(self) -> dict[str, Any]:
        return {"kind": "ridge+boosted-trees on log(measured/analytic)", "features": list(self.features),
                "mean": list(self.mean), "scale": list(self.scale), "intercept": self.intercept,
                "weights": list(self.weights), "learning_rate": self.learning_rate, "clip": list(self.clip),
                "lower": list(self.lower), "upper": list(self.upper), "trees": [t.to_json() for t in self.trees]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LearnedParams:
        features = tuple(str(f) for f in data["features"])
        if features != FEATURES:
            raise ValueError(f"learned model uses features {list(features)}, this version computes {list(FEATURES)}")
        params = cls(features, tuple(float(v) for v in data["mean"]), tuple(float(v) for v in data["scale"]),
                     float(data["intercept"]), tuple(float(v) for v in data["weights"]),
                     tuple(Tree.from_json(t) for t in data["trees"]), float(data["learning_rate"]),
                     (float(data["clip"][0]), float(data["clip"][1])),
                     tuple(float(v) for v in data.get("lower", ())), tuple(float(v) for v in data.get("upper", ())))
        if not len(params.mean) == len(params.scale) == len(params.weights) == len(features):
            raise ValueError("learned model: mean, scale and weights must have one entry per feature")
        if params.lower and not len(params.lower) == len(params.upper) == len(features):
            raise ValueError("learned model: lower and upper must have one entry per feature")
        if any(s <= 0 for s in params.scale):
            raise ValueError("learned model: feature scales must be positive")
        if any(f >= len(features) for t in params.trees for f in t.feature):
            raise ValueError("learned model: a tree splits on a feature that does not exist")
        return params


def fit_learned(x: np.ndarray, target: np.ndarray, rounds: int = 60, depth: int = 3, learning_rate: float = 0.05,
                ridge: float = 1.0, min_leaf: int = 5) -> LearnedParams:
    """Fit :class:`LearnedParams` to feature rows ``x`` and ``target = log(measured / analytic)``."""
    x = np.asarray(x, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(FEATURES) or len(target) != len(x) or len(x) < 2:
        raise ValueError(f"need at least 2 rows of {len(FEATURES)} features, got shape {x.shape}")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = (x - mean) / scale
    intercept = float(target.mean())
    centred = target - intercept
    weights = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ centred)
    residual = centred - z @ weights
    trees = []
    for _ in range(rounds):
        tree = fit_tree(z, residual, depth, min_leaf)
        if tree.feature == (-1,):
            break  # nothing left to split on
        trees.append(tree)
        residual = residual - learning_rate * np.array([tree.predict_one(row) for row in z])
    return LearnedParams(FEATURES, tuple(mean.tolist()), tuple(scale.tolist()), intercept, tuple(weights.tolist()),
                         tuple(trees), learning_rate, (float(target.min()), float(target.max())),
                         tuple(x.min(axis=0).tolist()), tuple(x.max(axis=0).tolist()))


class LearnedCostModel:
    """The calibrated analytic prediction times the learned correction for the group's features."""

    def __init__(self, params: LearnedParams, profile: HardwareProfile, registry: OpRegistry | None = None) -> None:
        self.params = params
        self.analytic = AnalyticCostModel(profile, registry)
        self.registry = self.analytic.registry
        self.name = f"learned:{profile.name}"
        self.source = ""

    def features(self, graph: Graph, nodes: Sequence[str]) -> list[float]:
        work = self.analytic.work(graph)
        return group_features(graph, nodes, work, group_terms(graph, nodes, work), self.analytic.profile,
                              self.registry)

    def group_cost(self, graph: Graph, nodes: Sequence[str]) -> CostBreakdown:
        work = self.analytic.work(graph)
        terms = group_terms(graph, nodes, work)
        if terms.kernels == 0:
            return CostBreakdown(0.0, 0, 0, 0, self.name)
        x = group_features(graph, nodes, work, terms, self.analytic.profile, self.registry)
        base = analytic_seconds(terms, self.analytic.profile).total
        seconds = base * math.exp(self.params.correction(x))
        return CostBreakdown(seconds, terms.traffic, int(terms.flops), 1, self.name)


# -- the calibration file ------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """What ``autofusion calibrate`` measured and fitted; read and written as one JSON file."""

    profile: HardwareProfile
    learned: LearnedParams
    default: str = "learned"
    report: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the file it was read from


    def cost_model(self, kind: str | None = None, registry: OpRegistry | None = None) -> CostModel:
        """The ``analytic`` or ``learned`` model of this calibration (default: the file's choice)."""
        kind = kind or self.default
        model: AnalyticCostModel | LearnedCostModel
        if kind == "analytic":
            model = AnalyticCostModel(self.profile, registry or default_registry())
        elif kind == "learned":
            model = LearnedCostModel(self.learned, self.profile, registry)
        else:
            raise ValueError(f"unknown cost model kind {kind!r} (known: {', '.join(MODEL_KINDS)})")
        model.source = self.source
        return model

    def to_json(self) -> dict[str, Any]:
        return {"format": FILE_FORMAT, "version": FILE_VERSION, "default_model": self.default,
                "profile": self.profile.to_json(), "learned": self.learned.to_json(),
                "report": self.report, "machine": self.machine}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")
        return path

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "") -> Calibration:
        if data.get("format") != FILE_FORMAT:
            raise ValueError(f"not an {FILE_FORMAT} file")
        if data.get("version") != FILE_VERSION:
            raise ValueError(f"calibration file version {data.get('version')!r}, this version reads {FILE_VERSION}")
        default = str(data.get("default_model", "learned"))
        if default not in MODEL_KINDS:
            raise ValueError(f"default_model {default!r} is not one of {', '.join(MODEL_KINDS)}")
        return cls(HardwareProfile.from_json(data["profile"]), LearnedParams.from_json(data["learned"]), default,
                   dict(data.get("report", {})), dict(data.get("machine", {})), source)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file; ValueError naming the file when it is missing or malformed."""
    path = Path(path)
    try:
        return Calibration.from_json(json.loads(path.read_text()), str(path))
    except FileNotFoundError:
        raise ValueError(f"calibration file {path} not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"calibration file {path}: not JSON ({e})") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise ValueError(f"calibration file {path}: malformed ({e})") from None
