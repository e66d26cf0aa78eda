"""Training: ``gnnserve train`` / ``python -m models.train`` and the Python API :func:`train`.

What one run does:

1. load the dataset (``.npz`` path, saved dataset directory, ``ogb:NAME`` or
   ``synthetic[:N[:seed]]``; a bad file stops with the loader's message, exit code 2);
2. fit the feature normalisation on the training nodes only (:class:`~models.norm.FeatureNorm`);
   sparse features (< 25 % non-zeros) stay sparse for the first layer;
3. train with Adam and cross-entropy: plain GCN/GraphSAGE full-batch on the whole graph, shaDow
   models on mini-batches of per-target PPR subgraphs (top-``K`` lists from :mod:`kernels.ppr`,
   block-diagonal batches from :func:`kernels.subgraph.induced_batch`); the sampling width used
   while training is ``width_train`` (default exact);
4. early stopping on validation accuracy (ties broken by validation loss), keeping the best
   weights; everything is seeded, so a seed gives the same weights on the same machine;
5. measure the knob table on bounded samples of the validation nodes through the serving path
   (subgraph extraction -> induced batch -> gather cached projections -> ``forward_batch_projected``):
   accuracy on up to ``knob_accuracy_nodes`` (10,000) nodes with a 95 % Wilson interval, latency on
   up to ``knob_latency_nodes`` (256) of them, so the table's cost does not grow with the graph;
   pick the default knobs and write the checkpoint atomically (:mod:`models.checkpoint`).

Plain models are evaluated on the full graph while training (identical to their L-hop serving path
at exact width, which the tests check); shaDow models on PPR batches of at most ``eval_nodes``
(10,000) validation and test nodes, so only those nodes and the training nodes need PPR lists.

Every stage (load, build graph, PPR lists, fit, knob table, write) is logged with its wall time
(logger ``models.train``; ``gnnserve train`` prints these lines on stderr) and recorded in
``metrics.json["stage_times_s"]``; long stages show tqdm bars unless ``--no-progress``.

Full-batch training holds the whole graph's activations and gradients: its memory grows with
N x (F + hidden x layers) plus the graph (:func:`full_batch_bytes`; 10.7 GB measured for a 2-layer
GCN on ``synthetic:2000000``, 3.1 GB on a 500,000-node ``products``-shaped graph). Plain models therefore have a **mini-batch mode**
(``minibatch="on"``, or ``"auto"``: when :func:`full_batch_bytes` exceeds ``minibatch_above_bytes``,
8 GiB): each step takes ``batch_size`` training targets, builds their execution plan
(:mod:`kernels.plan`, the serving path) with every row sampled to ``minibatch_width`` edges by
ES-SpMM (rescaled, deterministic per row), projects only the plan's nodes and back-propagates
through :meth:`forward_plan` with the full graph's GCN degrees. Validation and test accuracy are
then measured on plans of at most ``eval_nodes`` nodes at exact width, and the knob table's accuracy
on plans too, so no step holds a full-graph activation.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.datasets import DatasetError, GraphDataset, load_dataset
from kernels.graph import CSRGraph, gather_ranges
from kernels.plan import ExactPathEdges, edges_on_paths, execution_plan
from kernels.spmm import STRATEGIES, kept_edges

from . import MODEL_KINDS, build_model
from .base import GNNModel
from .checkpoint import CheckpointError, save_checkpoint
from .norm import NORM_MODES, FeatureNorm
from .shadow import POOLS

__all__ = [
    "DEFAULT_KNOB_WIDTHS",
    "LHopExtractor",
    "PPRExtractor",
    "TopKTable",
    "TrainConfig",
    "TrainData",
    "TrainResult",
    "evaluate",
    "evaluate_plans",
    "fit",
    "full_batch_bytes",
    "main",
    "measure_knobs",
    "predict_batched",
    "sample_nodes",
    "step_logits",
    "train",
    "use_minibatch",
    "wilson_interval",
]

log = logging.getLogger("models.train")  # the same name when run as `python -m models.train`

DEFAULT_KNOB_WIDTHS = (0, 4, 8, 16, 32, 64)
DEFAULT_LAYERS = {"gcn": 2, "sage": 2, "shadow-gcn": 3, "shadow-sage": 1}
_SPARSE_DENSITY = 0.25


@contextlib.contextmanager
def stage(name: str, times: dict[str, float] | None = None, what: str = ""):
    """Log the start and the wall time of one stage of a training run; add the time to ``times[name]``."""
    log.info("%s: %s ...", name, what or "started")
    t0 = time.perf_counter()
    try:
        yield
    finally:
        dt = time.perf_counter() - t0
        if times is not None:
            times[name] = round(times.get(name, 0.0) + dt, 3)
        log.info("%s: done in %.1f s", name, dt)


# ============================================================================ configuration
@dataclass
class TrainConfig:
    """Every setting of one training run (stored in the checkpoint's ``config.json["training"]``).

    Attributes:
        model: ``"gcn"``, ``"sage"``, ``"shadow-gcn"`` or ``"shadow-sage"``.
        hidden: hidden width ``H``.
        layers: number of layers (default: 2 for plain models, 1 for shaDow-SAGE, 3 for shaDow-GCN;
            shaDow-SAGE at 1 layer matched or beat plain GraphSAGE on all five datasets of
            docs/BENCHMARKS.md, at 3 it fell 5 points below on CiteSeer and Coauthor CS).
        dropout: dropout probability.
        lr, weight_decay: Adam settings (weight decay on every parameter).
        epochs: maximum epochs; patience: stop after this many epochs without a better validation accuracy.
        seed: seeds torch and the batch order.
        width_train: sampling width during training (``None``/0 = exact).
        strategy: ES-SpMM sampling strategy recorded as the model's default.
        feature_norm: ``"auto"``, ``"none"``, ``"row"``, ``"standard"`` or ``"row+standard"``.
        binarize: map non-zero features to 1 before normalising.
        pool: shaDow readout pooling (``"none"``, ``"mean"``, ``"max"``, ``"mean+max"``).
        batch_size: targets per shaDow training batch.
        eval_batch_size: targets per batch when evaluating batched.
        ppr_k: maximum PPR budget ``K`` (shaDow models).
        ppr: extra :class:`kernels.ppr.PPRConfig` fields (``alpha``, ``eps``, ...); ``None`` = defaults.
        knob_widths: sampling widths of the knob table (0 = exact, always included).
        knob_budgets: PPR budgets of the knob table (``None``: powers of two below ``ppr_k``, and ``ppr_k``).
        knob_batch_size: targets per batch while measuring the knob table.
        knob_repeats: timed passes per knob setting (the fastest is kept).
        knob_latency_nodes: validation nodes timed per knob setting (a seeded sample; 0 = all).
        knob_accuracy_nodes: validation nodes whose accuracy is measured per knob setting (a seeded
            sample, the same for every setting so rows compare paired; 0 = all).
        eval_nodes: shaDow models and plain models in mini-batch mode: validation nodes evaluated
            after each epoch and test nodes evaluated at the end (seeded samples; 0 = all).
            Full-batch plain models use every node (the full-graph pass computes them all anyway).
        minibatch: plain models: ``"on"`` (mini-batches of sampled plans), ``"off"`` (full batch) or
            ``"auto"`` (on when :func:`full_batch_bytes` exceeds ``minibatch_above_bytes``).
        minibatch_width: sampling width of the training plans in mini-batch mode (0 = exact).
        minibatch_above_bytes: the ``"auto"`` threshold.
        knob_tolerance: the default knobs are the cheapest whose validation accuracy is within this
            fraction of the exact setting at ``ppr_k``.
        device: torch device.
    """

    model: str = "gcn"
    hidden: int = 64
    layers: int | None = None
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    epochs: int = 200
    patience: int = 50
    seed: int = 0
    width_train: int | None = None
    strategy: str = "fastrand"
    feature_norm: str = "auto"
    binarize: bool = False
    pool: str = "mean"
    batch_size: int = 64
    eval_batch_size: int = 256
    ppr_k: int = 64
    ppr: dict[str, Any] | None = None
    knob_widths: tuple[int, ...] = DEFAULT_KNOB_WIDTHS
    knob_budgets: tuple[int, ...] | None = None
    knob_batch_size: int = 64
    knob_tolerance: float = 0.005
    knob_repeats: int = 3
    knob_latency_nodes: int = 256
    knob_accuracy_nodes: int = 10_000
    eval_nodes: int = 10_000
    minibatch: str = "auto"
    minibatch_width: int = 16
    minibatch_above_bytes: int = 8 << 30
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.model not in MODEL_KINDS:
            raise ValueError(f"model must be one of {MODEL_KINDS}, got {self.model!r}")
        if self.layers is None:
            self.layers = DEFAULT_LAYERS[self.model]
        if self.feature_norm not in (*NORM_MODES, "auto"):
            raise ValueError(f"feature_norm must be one of {(*NORM_MODES, 'auto')}, got {self.feature_norm!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        for name in ("hidden", "epochs", "batch_size", "eval_batch_size", "ppr_k", "knob_batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.minibatch not in ("auto", "on", "off"):
            raise ValueError(f"minibatch must be 'auto', 'on' or 'off', got {self.minibatch!r}")
        for name in ("knob_latency_nodes", "knob_accuracy_nodes", "eval_nodes", "minibatch_width"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = all), got {getattr(self, name)}")
        if self.patience < 0 or self.lr <= 0 or self.weight_decay < 0:
            raise ValueError("need patience >= 0, lr > 0 and weight_decay >= 0")
        self.width_train = int(self.width_train) if self.width_train else None
        self.knob_widths = tuple(sorted({0, *(int(w) for w in self.knob_widths)}))
        if any(w < 0 for w in self.knob_widths):
            raise ValueError(f"knob widths must be >= 0, got {self.knob_widths}")
        if self.knob_budgets is not None:
            self.knob_budgets = tuple(sorted({int(k) for k in self.knob_budgets if 1 <= int(k) <= self.ppr_k}
                                             | {self.ppr_k}))

    @property
    def is_shadow(self) -> bool:
        return self.model.startswith("shadow-")

    def budgets(self) -> tuple[int, ...]:
        """PPR budgets of the knob table (``(0,)`` for plain models)."""
        if not self.is_shadow:
            return (0,)
        if self.knob_budgets is not None:
            return self.knob_budgets
        ks = {self.ppr_k}
        k = 8
        while k < self.ppr_k:
            ks.add(k)
            k *= 2
        return tuple(sorted(ks))

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["knob_widths"] = list(self.knob_widths)
        d["knob_budgets"] = list(self.budgets())
        return d


# ============================================================================ data and extractors
def _to_torch_coo(m: sp.spmatrix) -> Tensor:
    c = sp.coo_matrix(m)
    idx = torch.from_numpy(np.vstack([c.row, c.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(c.data.astype(np.float32)), size=c.shape,
                                   check_invariants=False).coalesce()  # scipy's indices, in range


class TrainData:
    """A dataset prepared for training: normalised features, labels, splits.

    Attributes:
        ds: the dataset; norm: the fitted normalisation.
        xn: normalised features of all nodes, dense float32 ``[N, F]`` or sparse COO.
        y: int64 ``[N]``; train, val, test: int64 node ids.
    """

    def __init__(self, ds: GraphDataset, norm: FeatureNorm, device: torch.device | str = "cpu") -> None:
        self.ds = ds
        self.norm = norm
        self.device = torch.device(device)
        x = ds.x
        nnz = int(np.count_nonzero(x))
        self._xs: sp.csr_matrix | None = None
        if not norm.standard and nnz < _SPARSE_DENSITY * x.size:
            self._xs = norm.apply_sparse(sp.csr_matrix(np.asarray(x)))
            self.xn = _to_torch_coo(self._xs).to(self.device)
        else:
            with torch.no_grad():
                self.xn = norm(torch.from_numpy(np.ascontiguousarray(x))).to(self.device)
        self.y = torch.from_numpy(ds.y).to(self.device)
        self.train = ds.split("train")
        self.val = ds.split("val")
        self.test = ds.split("test")

    @property
    def sparse(self) -> bool:
        return self._xs is not None

    def rows(self, ids: np.ndarray) -> Tensor:
        """Normalised features of ``ids`` (dense ``[n, F]`` or sparse COO)."""
        if self._xs is not None:
            return _to_torch_coo(self._xs[np.asarray(ids, dtype=np.int64)]).to(self.device)
        return self.xn[torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device)]


class TopKTable:
    """In-memory PPR top-K lists of some targets with the ``lookup`` of :class:`kernels.ppr.PPRIndex`.

    Args:
        num_nodes: ``N``.
        targets: int64 ``[T]`` the targets held; ptr, nodes: their lists (CSR-shaped, target first,
            by decreasing score).
    """

    def __init__(self, num_nodes: int, targets: np.ndarray, ptr: np.ndarray, nodes: np.ndarray) -> None:
        self.pos = np.full(num_nodes, -1, dtype=np.int64)
        self.pos[np.asarray(targets, dtype=np.int64)] = np.arange(len(targets))
        self.ptr = np.asarray(ptr, dtype=np.int64)
        self.nodes = np.asarray(nodes, dtype=np.int64)
        self.k_max = int(np.diff(self.ptr).max()) if len(self.ptr) > 1 else 0

    def lookup(self, targets: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """First ``k`` entries of each target's list: ``(ptr [B + 1], nodes)``."""
        t = np.asarray(targets, dtype=np.int64)
        p = self.pos[t]
        if np.any(p < 0):
            raise KeyError(f"no PPR list for nodes {t[p < 0][:5].tolist()}")
        start = self.ptr[p]
        lens = np.minimum(self.ptr[p + 1] - start, int(k))
        out_ptr, idx = gather_ranges(start, lens)
        return out_ptr, self.nodes[idx]


class LHopExtractor:
    """Exact L-hop subgraphs (plain models): ``batch(targets, k)`` ignores ``k``."""

    kind = "lhop"

    def __init__(self, graph: CSRGraph, hops: int) -> None:
        self.graph = graph
        self.hops = int(hops)

    def batch(self, targets: np.ndarray, k: int = 0):
        from kernels.subgraph import induced_batch, lhop_nodes

        ptr, nodes = lhop_nodes(self.graph, targets, self.hops)
        return induced_batch(self.graph, ptr, nodes)


class PPRExtractor:
    """Top-``k`` PPR subgraphs from anything with ``lookup(targets, k) -> (ptr, nodes)``."""

    kind = "ppr"

    def __init__(self, graph: CSRGraph, table: Any) -> None:
        self.graph = graph
        self.table = table

    def batch(self, targets: np.ndarray, k: int):
        from kernels.subgraph import induced_batch

        t = np.asarray(targets, dtype=np.int64)
        if hasattr(self.table, "induced_batch"):  # a PPRIndex: its precomputed induced table if attached
            return self.table.induced_batch(self.graph, t, int(k))
        ptr, nodes = self.table.lookup(t, int(k))
        return induced_batch(self.graph, ptr, nodes)


def make_ppr_config(ppr: dict[str, Any] | None, k: int) -> Any:
    """A :class:`kernels.ppr.PPRConfig` from extra fields; its top-K size is set to ``k`` when it has one."""
    from kernels.ppr import PPRConfig

    fields = {f.name for f in dataclasses.fields(PPRConfig)}
    kw = dict(ppr or {})
    unknown = set(kw) - fields
    if unknown:
        raise ValueError(f"unknown PPR settings {sorted(unknown)}; PPRConfig has {sorted(fields)}")
    for name in ("k", "k_max", "topk", "top_k"):
        if name in fields:
            kw[name] = int(k)
            break
    return PPRConfig(**kw)


def ppr_table(graph: CSRGraph, targets: np.ndarray, ppr_cfg: Any, k: int, *, progress: bool = False,
              chunk: int = 8192) -> TopKTable:
    """Compute the top-``k`` PPR lists of ``targets`` (push method of :mod:`kernels.ppr`), in chunks
    of ``chunk`` targets (a tqdm bar over them with ``progress``)."""
    from tqdm.auto import tqdm

    from kernels.ppr import ppr_topk

    t = np.unique(np.asarray(targets, dtype=np.int64))
    ptrs: list[np.ndarray] = []
    parts: list[np.ndarray] = []
    with tqdm(total=len(t), desc="PPR lists", unit="node", disable=not progress, leave=False,
              dynamic_ncols=True) as bar:
        for i in range(0, len(t), chunk):
            p, nodes = ppr_topk(graph, t[i : i + chunk], ppr_cfg, k=int(k))[:2]
            ptrs.append(np.diff(p))
            parts.append(nodes)
            bar.update(len(t[i : i + chunk]))
    lens = np.concatenate(ptrs) if ptrs else np.zeros(0, dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    nodes = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return TopKTable(graph.num_nodes, t, ptr, nodes)


# ============================================================================ evaluation
def _batches(nodes: np.ndarray, size: int):
    for i in range(0, len(nodes), size):
        yield nodes[i : i + size]


@torch.no_grad()
def project_all(model: GNNModel, data: TrainData, chunk: int = 65536) -> Tensor:
    """Projections ``[N, P]`` of every node (what the server caches), in eval mode."""
    was = model.training
    model.eval()
    n = data.ds.num_nodes
    if data.sparse:
        out = model.project_normalized(data.xn)
    else:
        out = torch.cat([model.project_normalized(data.xn[i : i + chunk]) for i in range(0, n, chunk)])
    model.train(was)
    return out


@torch.no_grad()
def predict_batched(model: GNNModel, data: TrainData, extractor: Any, nodes: np.ndarray, k: int,
                    width: int | None, strategy: str, batch_size: int, proj: Tensor | None = None) -> Tensor:
    """Logits ``[len(nodes), C]`` through the serving path (extract -> induced batch -> projected forward)."""
    was = model.training
    model.eval()
    proj = project_all(model, data) if proj is None else proj
    out = []
    for chunk in _batches(np.asarray(nodes, dtype=np.int64), batch_size):
        b = extractor.batch(chunk, k)
        p_rows = proj[torch.from_numpy(b.node_ids).to(proj.device)]
        nd = model.norm_degrees_for(data.ds.graph, b.node_ids)
        out.append(model.forward_batch_projected(b, p_rows, width, strategy, nd)[0])
    model.train(was)
    return torch.cat(out) if out else proj.new_zeros(0, model.num_classes)


@torch.no_grad()
def evaluate(model: GNNModel, data: TrainData, nodes: np.ndarray, *, width: int | None = None,
             strategy: str = "fastrand", extractor: Any = None, k: int = 0, batch_size: int = 256,
             proj: Tensor | None = None) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` on ``nodes``: full graph for plain models, batched for shaDow."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if len(nodes) == 0:
        return float("nan"), float("nan")
    was = model.training
    model.eval()
    if model.extractor == "lhop" and extractor is None:
        p = proj if proj is not None else project_all(model, data)
        logits = model.propagate(data.ds.graph, p, width, strategy)[0][torch.from_numpy(nodes).to(p.device)]
    else:
        logits = predict_batched(model, data, extractor, nodes, k, width, strategy, batch_size, proj)
    model.train(was)
    y = data.y[torch.from_numpy(nodes).to(data.y.device)]
    acc = (logits.argmax(1) == y).float().mean().item()
    loss = F.cross_entropy(logits, y).item()
    return acc, loss


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion ``correct / n`` (95 % at ``z = 1.96``); ``(0, 1)`` when ``n = 0``."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    z2 = z * z
    den = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def sample_nodes(nodes: np.ndarray, limit: int, seed: int = 0) -> np.ndarray:
    """At most ``limit`` of ``nodes`` (0 = all): a seeded uniform sample, in random order."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if limit <= 0 or len(nodes) <= limit:
        return nodes
    return np.random.default_rng(seed).choice(nodes, size=int(limit), replace=False)


@torch.no_grad()
def measure_knobs(model: GNNModel, data: TrainData, extractor: Any, nodes: np.ndarray, *,
                  widths: Sequence[int], budgets: Sequence[int], strategy: str, batch_size: int,
                  repeats: int = 3, latency_nodes: int = 0, accuracy_nodes: int = 0, seed: int = 0,
                  progress: bool = False, full_graph: bool = True) -> list[dict[str, Any]]:
    """The knob table on ``nodes``: one row per (K, S) with accuracy, latency and kept edges.

    Samples: accuracy is measured on ``accuracy_nodes`` of ``nodes`` (a seeded uniform sample, the
    same nodes for every setting, so the rows' differences are paired; 0 = all), latency on the
    first ``latency_nodes`` of that sample (0 = the whole accuracy sample). Plain models' accuracy
    comes from one full-graph pass per width when ``full_graph`` (else from plans, batch by batch) (:meth:`propagate`: the same logits as their execution
    plans, since ES-SpMM keeps the same edges of a row wherever the row is aggregated; cheaper than
    a plan per batch once the sample holds thousands of nodes). Each row stores
    ``accuracy_nodes``, ``latency_nodes`` and ``val_accuracy_ci95`` (the 95 % Wilson interval of
    its accuracy on the sample). The cost is bounded by the sample sizes, not by the graph.

    Latency is the wall time of the serving path per node, over batches of ``batch_size`` targets:
    for a plain model its execution plan (:mod:`kernels.plan`), gathering the cached projections,
    GCN degrees and ``forward_plan``; for shaDow the top-K lookup, induced batch, projections and
    ``forward_batch_projected``; then argmax. After one untimed warm-up batch; the table
    keeps the fastest of ``repeats`` passes (the machine is shared: the minimum is the stable
    statistic). Projections are computed once beforehand and not timed (the server caches them per
    node). ``edges_kept_fraction`` = edges aggregated at width S / edges at exact width (shaDow: of
    the accuracy sample's subgraphs; plain models: on the latency sample's own paths, as the server
    reports).
    """
    from tqdm.auto import tqdm

    model.eval()
    proj = project_all(model, data)
    acc_nodes = sample_nodes(nodes, accuracy_nodes, seed)
    lat_nodes = acc_nodes[: latency_nodes] if latency_nodes > 0 else acc_nodes
    y = data.y[torch.from_numpy(acc_nodes).to(data.y.device)]
    rows = []
    graph = data.ds.graph
    plan_path = hasattr(model, "forward_plan")
    exact_edges = ExactPathEdges(graph, model.hops) if plan_path else None  # the same nodes at every setting

    def serve_batch(chunk: np.ndarray, k: int, width: int | None) -> tuple[Tensor, Any]:
        """Logits of one batch through the serving path, and a callable counting its (kept, exact) edges."""
        if plan_path:  # the server's path for plain models: an execution plan per batch
            plan = execution_plan(graph, np.unique(chunk), model.hops, width, strategy)
            p_rows = proj[torch.from_numpy(plan.node_ids).to(proj.device)]
            logits = model.forward_plan(plan, p_rows, model.norm_degrees_for(graph, plan.node_ids))[0]
            logits = logits[torch.from_numpy(np.searchsorted(plan.node_ids[: plan.num_targets], chunk))]
            return logits, lambda: tuple(int(c.sum()) for c in edges_on_paths(plan, graph, width, exact_edges))
        b = extractor.batch(chunk, k)
        p_rows = proj[torch.from_numpy(b.node_ids).to(proj.device)]
        logits = model.forward_batch_projected(b, p_rows, width, strategy, model.norm_degrees_for(graph, b.node_ids))[0]
        return logits, lambda: (kept_edges(b.graph, width), b.graph.num_edges)

    acc_index = torch.from_numpy(acc_nodes).to(proj.device)

    def accuracy_pass(k: int, widths_k: list[int]) -> dict[int, tuple[int, int, int]]:
        """Per width: (correct, kept edges, exact edges) over the accuracy sample (untimed; plain
        models: no edges). shaDow: each batch is extracted once and run at every width."""
        if plan_path and full_graph:  # one full-graph pass: the same logits as the plans (tests/test_knob_table.py)
            out = {}
            for s in widths_k:
                logits = model.propagate(graph, proj, s or None, strategy)[0][acc_index]
                out[s] = (int((logits.argmax(1) == y).sum().item()), 0, 0)
            return out
        acc = {s: [0, 0, 0] for s in widths_k}
        if plan_path:  # plans batch by batch (no full-graph activations)
            for i, chunk in enumerate(_batches(acc_nodes, batch_size)):
                yc = y[i * batch_size : i * batch_size + len(chunk)]
                for s in widths_k:
                    acc[s][0] += int((serve_batch(chunk, k, s or None)[0].argmax(1) == yc).sum().item())
            return {s: (a[0], 0, 0) for s, a in acc.items()}
        for i, chunk in enumerate(_batches(acc_nodes, batch_size)):
            b = extractor.batch(chunk, k)
            p_rows = proj[torch.from_numpy(b.node_ids).to(proj.device)]
            nd = model.norm_degrees_for(graph, b.node_ids)
            yc = y[i * batch_size : i * batch_size + len(chunk)]
            for s in widths_k:
                logits = model.forward_batch_projected(b, p_rows, s or None, strategy, nd)[0]
                a = acc[s]
                a[0] += int((logits.argmax(1) == yc).sum().item())
                a[1] += kept_edges(b.graph, s or None)
                a[2] += b.graph.num_edges
        return {s: (a[0], a[1], a[2]) for s, a in acc.items()}

    def timed_pass(k: int, width: int | None, count: bool) -> tuple[float, int, int]:
        """Serving time of the latency sample; with ``count``, its (kept, exact) edges (counted untimed)."""
        elapsed = 0.0
        kept = total = 0
        for chunk in _batches(lat_nodes, batch_size):
            t0 = time.perf_counter()
            logits, count_edges = serve_batch(chunk, k, width)
            logits.argmax(1)
            elapsed += time.perf_counter() - t0
            if count:
                k_e, t_e = count_edges()
                kept += k_e
                total += t_e
        return elapsed, kept, total

    settings = [(int(k), int(s)) for k in budgets for s in widths]
    bar = tqdm(settings, desc="knob table", unit="setting", disable=not progress, leave=False, dynamic_ncols=True)
    accuracy: dict[int, dict[int, tuple[int, int, int]]] = {}
    for k, s in bar:
        bar.set_postfix(K=k, S=s)
        width = s or None
        if k not in accuracy:
            accuracy[k] = accuracy_pass(k, [int(w) for w in widths])
        correct, kept, total = accuracy[k][s]
        serve_batch(lat_nodes[:batch_size], k, width)  # untimed warm-up
        elapsed, lat_kept, lat_total = timed_pass(k, width, plan_path)
        if plan_path:  # plain models: edges on the latency sample's paths
            kept, total = lat_kept, lat_total
        for _ in range(max(0, repeats - 1)):
            elapsed = min(elapsed, timed_pass(k, width, False)[0])
        n = len(acc_nodes)
        lo, hi = wilson_interval(correct, n)
        rows.append({
            "ppr_budget": k,
            "sampling_width": s,
            "val_accuracy": round(correct / n, 6) if n else float("nan"),
            "latency_ms_per_node": elapsed * 1000.0 / max(len(lat_nodes), 1),
            "edges_kept_fraction": kept / total if total else 1.0,
            "accuracy_nodes": n,
            "latency_nodes": len(lat_nodes),
            "val_accuracy_ci95": [round(lo, 6), round(hi, 6)],
        })
    bar.close()
    return rows


def choose_defaults(rows: list[dict[str, Any]], tolerance: float) -> tuple[int, int]:
    """Default ``(K, S)`` of a knob table (rows as stored in knobs.json):
    :func:`clients.knob_rules.default_knobs`, the rule the SDK and the server share."""
    from clients.knob_rules import default_knobs, rows_of

    return default_knobs(rows_of(rows), tolerance)


# ============================================================================ training
@dataclass
class TrainResult:
    """Outcome of :func:`fit`: the best model (eval mode) and how it got there."""

    model: GNNModel
    config: TrainConfig
    data: TrainData
    extractor: Any
    best_epoch: int
    epochs_run: int
    val_accuracy: float
    val_loss: float
    test_accuracy: float
    train_time_s: float
    ppr_time_s: float = 0.0
    ppr_config: Any = None
    history: list[dict[str, float]] = field(default_factory=list)
    num_val_eval: int = 0  # validation nodes evaluated per epoch (shaDow: a bounded sample)
    num_test_eval: int = 0  # test nodes behind test_accuracy
    knob_nodes: np.ndarray | None = None  # the knob table's accuracy sample of validation nodes
    minibatch: bool = False  # a plain model trained in mini-batch mode


class EarlyStopping:
    """Keeps the best state by (validation accuracy, then lower validation loss); counts patience."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best: tuple[float, float] = (-math.inf, math.inf)
        self.best_epoch = -1
        self.best_state: dict[str, Tensor] | None = None
        self.bad = 0

    def step(self, epoch: int, acc: float, loss: float, model: torch.nn.Module) -> bool:
        """Record an epoch; returns True when training should stop."""
        if acc > self.best[0] or (acc == self.best[0] and loss < self.best[1]):
            self.best = (acc, loss)
            self.best_epoch = epoch
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.bad = 0
        else:
            self.bad += 1
        return self.bad > self.patience


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def step_logits(model: GNNModel, data: TrainData, cfg: TrainConfig, batch: Any = None) -> Tensor:
    """Logits of one training step as :func:`fit` computes them (in the model's current mode).

    shaDow models: the ``batch`` of PPR subgraphs ``[B, C]``, the first layer applied to every
    subgraph row (dropout per subgraph row, as in shaDow-GNN: projecting each distinct node once and
    gathering, as serving does, would share one dropout mask among every subgraph holding a node; on
    Cora that left 1 seed in 6 near 50 % and the mean 6 points lower). Plain models: every node ``[N, C]``.
    """
    if batch is not None:
        p_rows = model.project_normalized(data.rows(batch.node_ids))
        return model.forward_batch_projected(batch, p_rows, cfg.width_train, cfg.strategy)[0]
    return model.propagate(data.ds.graph, model.project_normalized(data.xn), cfg.width_train, cfg.strategy)[0]


def full_batch_bytes(ds: GraphDataset, cfg: TrainConfig) -> int:
    """Rough peak memory of a ``gnnserve train`` run of a plain model in full batch:
    N x F x 8 (features and their normalised copy) + N x hidden x layers x 34 (activations,
    dropout masks, gradients and optimiser state, about 8.5 float32 copies) + E x 16 (graph and
    aggregation buffers) + 1 GiB (the runtime). Fitted to three measured peaks of 2-layer GCNs,
    hidden 64: ``synthetic:2000000`` (F = 32, 23.7 M CSR edges) 10.67 GB measured, 10.67 estimated;
    the ``products`` shape (F = 100, mean degree ~50) at 500,000 nodes 3.09 GB (4.05 estimated) and
    at 200,000 nodes 1.92 GB (2.26 estimated)."""
    n, e = ds.num_nodes, ds.graph.num_edges
    return int(n * ds.num_features * 8 + n * cfg.hidden * int(cfg.layers or 2) * 34 + e * 16) + (1 << 30)


def use_minibatch(ds: GraphDataset, cfg: TrainConfig) -> bool:
    """Whether :func:`fit` trains a plain model in mini-batch mode (see the module docstring)."""
    if cfg.is_shadow or cfg.minibatch == "off":
        return False
    return cfg.minibatch == "on" or full_batch_bytes(ds, cfg) > cfg.minibatch_above_bytes


def plan_logits(model: GNNModel, data: TrainData, targets: np.ndarray, width: int | None, strategy: str) -> Tensor:
    """Logits ``[len(targets), C]`` (in ``targets``' order) through the targets' execution plan at
    ``width``, projecting only the plan's nodes (with autograd when enabled)."""
    graph = data.ds.graph
    t = np.asarray(targets, dtype=np.int64)
    plan = execution_plan(graph, np.unique(t), model.hops, width, strategy)
    p_rows = model.project_normalized(data.rows(plan.node_ids))
    logits = model.forward_plan(plan, p_rows, model.norm_degrees_for(graph, plan.node_ids))[0]
    return logits[torch.from_numpy(np.searchsorted(plan.node_ids[: plan.num_targets], t)).to(logits.device)]


@torch.no_grad()
def evaluate_plans(model: GNNModel, data: TrainData, nodes: np.ndarray, strategy: str, batch_size: int,
                   width: int | None = None) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` of a plain model on ``nodes`` through execution plans."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if len(nodes) == 0:
        return float("nan"), float("nan")
    was = model.training
    model.eval()
    logits = torch.cat([plan_logits(model, data, c, width, strategy) for c in _batches(nodes, batch_size)])
    model.train(was)
    y = data.y[torch.from_numpy(nodes).to(data.y.device)]
    return (logits.argmax(1) == y).float().mean().item(), F.cross_entropy(logits, y).item()


def fit(ds: GraphDataset, cfg: TrainConfig, *, ppr_lookup: Any = None, progress: bool = False,
        stage_times: dict[str, float] | None = None) -> TrainResult:
    """Train one model on ``ds`` (see the module docstring) and return it with its metrics.

    Args:
        ds: the dataset.
        cfg: the settings.
        ppr_lookup: shaDow models: precomputed top-K lists (anything with ``lookup(targets, k)``
            holding at least ``cfg.ppr_k`` entries per node for the train, val and test nodes,
            e.g. a :class:`kernels.ppr.PPRIndex` or :class:`TopKTable`) computed with the
            settings ``cfg.ppr``; ``None`` computes them here.
        progress: show tqdm bars (PPR lists, epochs).
        stage_times: filled with the wall time of ``ppr_lists`` (shaDow, computed here) and ``fit``.
    """
    from tqdm.auto import tqdm

    device = torch.device(cfg.device)
    _seed_all(cfg.seed)
    norm = FeatureNorm(ds.num_features, cfg.feature_norm, cfg.binarize).fit(ds.x, ds.split("train"))
    data = TrainData(ds, norm, device)
    model_cfg: dict[str, Any] = {"arch": cfg.model, "in_dim": ds.num_features, "hidden": cfg.hidden,
                                 "num_classes": ds.num_classes, "layers": cfg.layers, "dropout": cfg.dropout}
    if cfg.is_shadow:
        model_cfg["pool"] = cfg.pool
    model = build_model(model_cfg, norm=norm).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed)

    ppr_time = 0.0
    ppr_cfg = None
    val_nodes, test_nodes = data.val, data.test
    # the knob table's accuracy sample (its first knob_latency_nodes are timed): drawn here so that a
    # shaDow model's PPR lists cover it
    knob_nodes = sample_nodes(data.val, cfg.knob_accuracy_nodes, cfg.seed)
    if cfg.is_shadow:
        # bounded evaluation: the PPR lists and the per-epoch validation cost do not grow with N
        val_nodes = np.sort(sample_nodes(data.val, cfg.eval_nodes, cfg.seed))
        test_nodes = np.sort(sample_nodes(data.test, cfg.eval_nodes, cfg.seed + 1))
        ppr_cfg = make_ppr_config(cfg.ppr, cfg.ppr_k)
        if ppr_lookup is None:
            need = np.concatenate([data.train, val_nodes, test_nodes, knob_nodes])
            with stage("ppr_lists", stage_times, f"PPR top-{cfg.ppr_k} lists of {len(np.unique(need)):,} "
                       f"train/val/test nodes"):
                t0 = time.perf_counter()
                ppr_lookup = ppr_table(ds.graph, need, ppr_cfg, cfg.ppr_k, progress=progress)
                ppr_time = time.perf_counter() - t0
        extractor: Any = PPRExtractor(ds.graph, ppr_lookup)
    else:
        extractor = LHopExtractor(ds.graph, model.layers)
    minibatch = use_minibatch(ds, cfg)
    if minibatch:
        val_nodes = np.sort(sample_nodes(data.val, cfg.eval_nodes, cfg.seed))
        test_nodes = np.sort(sample_nodes(data.test, cfg.eval_nodes, cfg.seed + 1))
        log.info("fit: mini-batch mode (full batch would need about %.1f GiB): %d targets per step, plans "
                 "sampled to width %s", full_batch_bytes(ds, cfg) / 2**30, cfg.batch_size, cfg.minibatch_width or "exact")
    log.info("fit: %s, %d train nodes, up to %d epochs, validation on %d nodes", cfg.model, len(data.train),
             cfg.epochs, len(val_nodes))

    stopper = EarlyStopping(cfg.patience)
    history: list[dict[str, float]] = []
    t_start = time.perf_counter()
    bar = tqdm(range(cfg.epochs), desc=f"train {cfg.model}", unit="epoch", disable=not progress,
               leave=False, dynamic_ncols=True)
    epochs_run = 0
    for epoch in bar:
        model.train()
        if cfg.is_shadow:
            losses = []
            perm = rng.permutation(data.train)
            for chunk in _batches(perm, cfg.batch_size):
                b = extractor.batch(chunk, cfg.ppr_k)
                opt.zero_grad()
                loss = F.cross_entropy(step_logits(model, data, cfg, b), data.y[torch.from_numpy(chunk).to(device)])
                loss.backward()
                opt.step()
                losses.append(loss.item() * len(chunk))
            train_loss = sum(losses) / len(data.train)
            val_acc, val_loss = evaluate(model, data, val_nodes, extractor=extractor, k=cfg.ppr_k,
                                         strategy=cfg.strategy, batch_size=cfg.eval_batch_size)
        elif minibatch:
            losses = []
            for chunk in _batches(rng.permutation(data.train), cfg.batch_size):
                opt.zero_grad()
                logits = plan_logits(model, data, chunk, cfg.minibatch_width or None, cfg.strategy)
                loss = F.cross_entropy(logits, data.y[torch.from_numpy(chunk).to(device)])
                loss.backward()
                opt.step()
                losses.append(loss.item() * len(chunk))
            train_loss = sum(losses) / len(data.train)
            val_acc, val_loss = evaluate_plans(model, data, val_nodes, cfg.strategy, cfg.eval_batch_size)
        else:
            opt.zero_grad()
            logits = step_logits(model, data, cfg)
            tr = torch.from_numpy(data.train).to(device)
            loss = F.cross_entropy(logits[tr], data.y[tr])
            loss.backward()
            opt.step()
            train_loss = loss.item()
            val_acc, val_loss = evaluate(model, data, data.val, strategy=cfg.strategy)
        epochs_run = epoch + 1
        history.append({"epoch": epoch, "train_loss": round(train_loss, 6), "val_accuracy": round(val_acc, 6),
                        "val_loss": round(val_loss, 6)})
        bar.set_postfix(loss=f"{train_loss:.3f}", val=f"{val_acc:.3f}", best=f"{max(stopper.best[0], val_acc):.3f}")
        if stopper.step(epoch, val_acc, val_loss, model):
            break
    bar.close()
    train_time = time.perf_counter() - t_start
    if stage_times is not None:
        stage_times["fit"] = round(stage_times.get("fit", 0.0) + train_time, 3)
    log.info("fit: %d epochs in %.1f s (best epoch %d, val %.4f)", epochs_run, train_time, stopper.best_epoch,
             stopper.best[0])
    assert stopper.best_state is not None
    model.load_state_dict(stopper.best_state)
    model.eval()
    if cfg.is_shadow:
        test_acc = evaluate(model, data, test_nodes, extractor=extractor, k=cfg.ppr_k, strategy=cfg.strategy,
                            batch_size=cfg.eval_batch_size)[0]
    elif minibatch:
        test_acc = evaluate_plans(model, data, test_nodes, cfg.strategy, cfg.eval_batch_size)[0]
    else:
        test_acc = evaluate(model, data, data.test, strategy=cfg.strategy)[0]
    return TrainResult(
        model=model, config=cfg, data=data, extractor=extractor, best_epoch=stopper.best_epoch,
        epochs_run=epochs_run, val_accuracy=stopper.best[0], val_loss=stopper.best[1], test_accuracy=test_acc,
        train_time_s=train_time, ppr_time_s=ppr_time, ppr_config=ppr_cfg, history=history,
        num_val_eval=len(val_nodes), num_test_eval=len(test_nodes), knob_nodes=knob_nodes, minibatch=minibatch,
    )


def _dataset_source(spec: Any, ds: GraphDataset) -> str:
    if isinstance(spec, GraphDataset):
        return ""
    s = str(spec)
    if s.startswith(("synthetic", "ogb:")):
        return s
    return str(Path(s).resolve())


def train(
    dataset: GraphDataset | str | os.PathLike[str],
    model: str = "gcn",
    out_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    ppr_lookup: Any = None,
    source: str | None = None,
    stage_times: dict[str, float] | None = None,
    **settings: Any,
) -> Path:
    """Train a model and write its checkpoint directory; returns the directory.

    Args:
        dataset: a :class:`GraphDataset`, or a spec for :func:`kernels.datasets.load_dataset`
            (``.npz`` path, dataset directory, ``ogb:NAME``, ``synthetic[:N[:seed]]``).
        model: ``"gcn"``, ``"sage"``, ``"shadow-gcn"`` or ``"shadow-sage"``.
        out_dir: the checkpoint directory to create (required).
        overwrite: replace an existing checkpoint at ``out_dir``.
        progress: show a progress bar.
        ppr_lookup: precomputed PPR top-K lists (see :func:`fit`).
        source: dataset source recorded in the checkpoint (default: the resolved spec).
        stage_times: wall times of stages run before (e.g. ``{"load": ...}``), recorded in
            ``metrics.json["stage_times_s"]`` with this run's own (``ppr_lists``, ``fit``,
            ``knob_table``; ``write`` is only logged: the metrics are part of what it writes); a
            dataset loaded by :func:`kernels.datasets.load_dataset` adds its ``load_times``
            (``read`` or ``generate``, and ``build_graph``; both inside ``load``).
        **settings: any :class:`TrainConfig` field (``hidden``, ``layers``, ``dropout``, ``lr``,
            ``weight_decay``, ``epochs``, ``patience``, ``seed``, ``width_train``, ``ppr_k``, ``ppr``, ...).

    Raises:
        kernels.datasets.DatasetError: the dataset cannot be loaded.
        CheckpointError: ``out_dir`` exists (without ``overwrite``).
        ValueError: a bad setting.
    """
    if out_dir is None:
        raise ValueError("out_dir is required")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise CheckpointError(f"{out} already exists; pass overwrite=True (CLI: --overwrite) or choose another --out")
    cfg = TrainConfig(model=model, **settings)
    times: dict[str, float] = dict(stage_times or {})
    if isinstance(dataset, GraphDataset):
        ds = dataset
    else:
        with stage("load", times, f"dataset {dataset}"):
            ds = load_dataset(dataset)
    for name, dt in getattr(ds, "load_times", {}).items():
        times.setdefault(name, round(float(dt), 3))
    log.info("training %s on %r", cfg.model, ds)
    res = fit(ds, cfg, ppr_lookup=ppr_lookup, progress=progress, stage_times=times)

    n_settings = len(cfg.knob_widths) * len(cfg.budgets())
    n_acc = min(len(res.data.val), cfg.knob_accuracy_nodes or len(res.data.val))
    n_lat = min(n_acc, cfg.knob_latency_nodes or n_acc)
    with stage("knob_table", times, f"{n_settings} settings x (accuracy on {n_acc:,} validation nodes, "
               f"latency on {n_lat:,} x {cfg.knob_repeats})"):
        t0 = time.perf_counter()
        knob_nodes = res.knob_nodes if res.knob_nodes is not None else res.data.val
        rows = measure_knobs(res.model, res.data, res.extractor, knob_nodes, widths=cfg.knob_widths,
                             budgets=cfg.budgets(), strategy=cfg.strategy, batch_size=cfg.knob_batch_size,
                             repeats=cfg.knob_repeats, latency_nodes=cfg.knob_latency_nodes,
                             accuracy_nodes=cfg.knob_accuracy_nodes, seed=cfg.seed, progress=progress,
                             full_graph=not res.minibatch)
        knob_time = time.perf_counter() - t0
    default_k, default_s = choose_defaults(rows, cfg.knob_tolerance)
    kmax = cfg.ppr_k if cfg.is_shadow else 0
    exact = next(r for r in rows if r["ppr_budget"] == kmax and r["sampling_width"] == 0)

    config = {
        "extractor": res.model.extractor,
        "hops": 0 if cfg.is_shadow else int(res.model.layers),
        "dataset": {
            "name": ds.name,
            "fingerprint": ds.fingerprint(),
            "graph_fingerprint": ds.graph.fingerprint(),
            "source": source if source is not None else _dataset_source(dataset, ds),
            "num_nodes": ds.num_nodes,
            "num_edges": ds.graph.num_edges,
            "num_features": ds.num_features,
            "num_classes": ds.num_classes,
        },
        "ppr": dataclasses.asdict(res.ppr_config) if res.ppr_config is not None else None,
        "max_ppr_budget": kmax,
        "strategy": cfg.strategy,
        "default_sampling_width": int(default_s),
        "default_ppr_budget": int(default_k),
        "training": cfg.to_json(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
    }
    metrics = {
        "val_accuracy": res.val_accuracy,
        "val_loss": res.val_loss,
        "test_accuracy": res.test_accuracy,
        "val_accuracy_serving_exact": exact["val_accuracy"],
        "best_epoch": res.best_epoch,
        "epochs_run": res.epochs_run,
        "train_time_s": round(res.train_time_s, 3),
        "ppr_time_s": round(res.ppr_time_s, 3),
        "knob_time_s": round(knob_time, 3),
        "num_train": len(res.data.train),
        "num_val": len(res.data.val),
        "num_test": len(res.data.test),
        "num_val_evaluated": res.num_val_eval,
        "num_test_evaluated": res.num_test_eval,
        "minibatch": res.minibatch,
        "stage_times_s": times,
        "history": res.history,
    }
    knobs = {
        "format_version": 1,
        "measured_on": "val",
        "num_nodes": rows[0]["accuracy_nodes"],
        "population_nodes": len(res.data.val),
        "accuracy_nodes": rows[0]["accuracy_nodes"],
        "latency_nodes": rows[0]["latency_nodes"],
        "accuracy_interval": "val_accuracy_ci95: 95 % Wilson score interval on the accuracy sample",
        "batch_size": cfg.knob_batch_size,
        "repeats": cfg.knob_repeats,
        "strategy": cfg.strategy,
        "device": str(cfg.device),
        "torch_threads": torch.get_num_threads(),
        "latency": "wall time per node of extract + induced batch + gather cached projections + forward + argmax",
        "rows": rows,
    }
    with stage("write", times, f"checkpoint {out}"):
        path = save_checkpoint(out, res.model, config, metrics, knobs, overwrite=overwrite)
    log.info("stage times: %s", ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    return path


# ============================================================================ CLI
def _int_list(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in s.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from exc


def build_parser(prog: str = "gnnserve train") -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(prog=prog, description="Train a GNN and write a gnnserve checkpoint directory.")
    p.add_argument("--dataset", required=True,
                   help="PATH.npz, a saved dataset directory, ogb:NAME[@root] or synthetic[:N[:seed]]")
    p.add_argument("--model", required=True, choices=MODEL_KINDS)
    p.add_argument("--out", required=True, help="checkpoint directory to create")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint directory")
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--layers", type=int, default=None,
                   help="default: " + ", ".join(f"{n} for {k}" for k, n in DEFAULT_LAYERS.items()))
    p.add_argument("--dropout", type=float, default=d.dropout)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--patience", type=int, default=d.patience)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--width-train", type=int, default=0, help="sampling width while training (0 = exact)")
    p.add_argument("--strategy", choices=STRATEGIES, default=d.strategy)
    p.add_argument("--feature-norm", choices=(*NORM_MODES, "auto"), default=d.feature_norm)
    p.add_argument("--binarize", action="store_true", help="map non-zero features to 1 (e.g. Coauthor counts)")
    p.add_argument("--pool", choices=POOLS, default=d.pool, help="shaDow readout pooling")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="targets per training batch (shaDow; plain models in mini-batch mode)")
    p.add_argument("--minibatch", choices=("auto", "on", "off"), default=d.minibatch,
                   help="plain models: train on mini-batches of sampled plans; auto = when full-batch training "
                        f"would need more than {d.minibatch_above_bytes >> 30} GiB (models.train.full_batch_bytes)")
    p.add_argument("--minibatch-width", type=int, default=d.minibatch_width,
                   help="sampling width of the mini-batch training plans (0 = exact)")
    p.add_argument("--ppr-k", type=int, default=d.ppr_k, help="shaDow: maximum PPR budget K")
    p.add_argument("--ppr-alpha", type=float, default=None, help="shaDow: PPR teleport setting (see kernels.ppr)")
    p.add_argument("--ppr-eps", type=float, default=None, help="shaDow: PPR push tolerance")
    p.add_argument("--knob-widths", type=_int_list, default=d.knob_widths, help="e.g. 0,4,8,16,32,64")
    p.add_argument("--knob-budgets", type=_int_list, default=None, help="e.g. 8,16,32,64")
    p.add_argument("--knob-batch-size", type=int, default=d.knob_batch_size)
    p.add_argument("--knob-latency-nodes", type=int, default=d.knob_latency_nodes,
                   help="validation nodes timed per knob setting (0 = all)")
    p.add_argument("--knob-accuracy-nodes", type=int, default=d.knob_accuracy_nodes,
                   help="validation nodes whose accuracy each knob setting measures, with a 95%% interval (0 = all)")
    p.add_argument("--eval-nodes", type=int, default=d.eval_nodes,
                   help="shaDow: validation nodes per epoch and test nodes at the end (0 = all)")
    p.add_argument("--device", default=d.device)
    p.add_argument("--no-progress", action="store_true")
    return p


def _stage_logging() -> None:
    """Print the stage lines of ``models.train`` and ``kernels.datasets`` on stderr (INFO), once."""
    fmt = logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S")
    for name in ("models.train", "kernels.datasets"):
        lg = logging.getLogger(name)
        if not any(getattr(h, "_gnnserve_stage", False) for h in lg.handlers):
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(fmt)
            h._gnnserve_stage = True  # type: ignore[attr-defined]
            lg.addHandler(h)
        lg.setLevel(logging.INFO)
        lg.propagate = False


def main(argv: Sequence[str] | None = None, prog: str = "gnnserve train") -> int:
    """CLI entry point; returns the exit code (0 ok, 1 failure, 2 bad dataset/arguments)."""
    from kernels.malloc import tune_malloc

    tune_malloc()
    args = build_parser(prog).parse_args(argv)
    _stage_logging()
    ppr: dict[str, Any] = {}
    if args.ppr_alpha is not None:
        ppr["alpha"] = args.ppr_alpha
    if args.ppr_eps is not None:
        ppr["eps"] = args.ppr_eps
    times: dict[str, float] = {}
    try:
        with stage("load", times, f"dataset {args.dataset}"):
            ds = load_dataset(args.dataset)
    except (DatasetError, OSError, ValueError) as exc:
        print(f"error: cannot load dataset {args.dataset}: {exc}", file=sys.stderr)
        return 2
    try:
        out = train(
            ds, args.model, args.out, overwrite=args.overwrite, progress=not args.no_progress,
            source=_dataset_source(args.dataset, ds), stage_times=times,
            hidden=args.hidden, layers=args.layers, dropout=args.dropout, lr=args.lr,
            weight_decay=args.weight_decay, epochs=args.epochs, patience=args.patience, seed=args.seed,
            width_train=args.width_train or None, strategy=args.strategy, feature_norm=args.feature_norm,
            binarize=args.binarize, pool=args.pool, batch_size=args.batch_size, ppr_k=args.ppr_k,
            ppr=ppr or None, knob_widths=args.knob_widths, knob_budgets=args.knob_budgets,
            knob_batch_size=args.knob_batch_size, knob_latency_nodes=args.knob_latency_nodes,
            knob_accuracy_nodes=args.knob_accuracy_nodes, eval_nodes=args.eval_nodes, minibatch=args.minibatch,
            minibatch_width=args.minibatch_width, device=args.device,
        )
    except (CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .checkpoint import load_checkpoint

    ck = load_checkpoint(out)
    m = ck.metrics
    print(f"wrote {out}")
    print(f"  {ck.arch} on {ck.config['dataset']['name']}: val {m['val_accuracy']:.4f}  test {m['test_accuracy']:.4f}  "
          f"(best epoch {m['best_epoch']}, {m['train_time_s']:.1f} s)")
    print(f"  default knobs: K={ck.default_ppr_budget} S={ck.default_sampling_width} ({ck.strategy})")
    meta = ck.knobs_meta
    print(f"  knob table: accuracy on {meta.get('accuracy_nodes', meta.get('num_nodes'))} of "
          f"{meta.get('population_nodes', meta.get('num_nodes'))} validation nodes, latency on "
          f"{meta.get('latency_nodes', meta.get('num_nodes'))} ({m.get('knob_time_s', 0):.1f} s)")
    print("  | K | S | val acc | 95% interval | ms/node | edges kept |")
    for r in ck.knobs:
        ci = r.get("val_accuracy_ci95")
        ci_s = f"{ci[0]:.4f}-{ci[1]:.4f}" if ci else "-"
        print(f"  | {r['ppr_budget']} | {r['sampling_width']} | {r['val_accuracy']:.4f} | {ci_s} | "
              f"{r['latency_ms_per_node']:.4f} | {r['edges_kept_fraction']:.3f} |")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:], prog="python -m models.train"))
