"""Fitting a model: the settings of a run, the data it trains on, the PPR lists and extractors, the
evaluation passes and the training loops (:func:`fit`). :mod:`models.train` wraps it into a checkpoint.

What :func:`fit` does:

1. fit the feature normalisation on the training nodes only (:class:`~models.norm.FeatureNorm`);
   sparse features (< 25 % non-zeros) stay sparse for the first layer;
2. train with Adam and cross-entropy: plain GCN/GraphSAGE full-batch on the whole graph, shaDow
   models on mini-batches of per-target PPR subgraphs (top-``K`` lists from :mod:`kernels.ppr`,
   block-diagonal batches from :func:`kernels.subgraph.induced_batch`); the sampling width used
   while training is ``width_train`` (default exact);
3. early stopping on validation accuracy (ties broken by validation loss), keeping the best
   weights; everything is seeded, so a seed gives the same weights on the same machine.

Plain models are evaluated on the full graph while training (identical to their L-hop serving path
at exact width, which the tests check); shaDow models on PPR batches of at most ``eval_nodes``
(10,000) validation and test nodes, so only those nodes and the training nodes need PPR lists.

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

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.datasets import GraphDataset
from kernels.graph import CSRGraph, gather_ranges
from kernels.plan import execution_plan
from kernels.spmm import STRATEGIES

from . import MODEL_KINDS, build_model
from .base import GNNModel
from .norm import NORM_MODES, FeatureNorm
from .shadow import POOLS

__all__ = [
    "DEFAULT_KNOB_WIDTHS",
    "DEFAULT_LAYERS",
    "EarlyStopping",
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
    "make_ppr_config",
    "plan_logits",
    "ppr_table",
    "predict_batched",
    "project_all",
    "sample_nodes",
    "stage",
    "step_logits",
    "use_minibatch",
]

# one logger for every stage line of a training run (models.fit, models.knobs, models.train), the name
# `gnnserve train` and `python -m models.train` print on stderr
log = logging.getLogger("models.train")

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
        knob_agreement_nodes: nodes of the whole graph (a seeded sample; no labels needed) on which each
            knob setting's predicted labels are compared with the exact reference's: the rows'
            ``agreement``, the loss the knob rules bound (:mod:`clients.knob_rules`); 0 = none (the rules
            then compare validation accuracies).
        eval_nodes: shaDow models and plain models in mini-batch mode: validation nodes evaluated
            after each epoch and test nodes evaluated at the end (seeded samples; 0 = all).
            Full-batch plain models use every node (the full-graph pass computes them all anyway).
        minibatch: plain models: ``"on"`` (mini-batches of sampled plans), ``"off"`` (full batch) or
            ``"auto"`` (on when :func:`full_batch_bytes` exceeds ``minibatch_above_bytes``).
        minibatch_width: sampling width of the training plans in mini-batch mode (0 = exact).
        minibatch_above_bytes: the ``"auto"`` threshold.
        knob_tolerance: the default knobs are the cheapest whose loss (1 - agreement; without an agreement
            sample: the validation accuracy given up) is within this
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
    knob_agreement_nodes: int = 10_000
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
        for name in ("knob_latency_nodes", "knob_accuracy_nodes", "knob_agreement_nodes", "eval_nodes",
                     "minibatch_width"):
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


def _node_bar(total: int, desc: str | None):
    """A tqdm bar over ``total`` nodes named ``desc`` (``None``: none, a disabled bar)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="node", disable=desc is None, leave=False, dynamic_ncols=True)


@torch.no_grad()
def predict_batched(model: GNNModel, data: TrainData, extractor: Any, nodes: np.ndarray, k: int,
                    width: int | None, strategy: str, batch_size: int, proj: Tensor | None = None,
                    progress: str | None = None) -> Tensor:
    """Logits ``[len(nodes), C]`` through the serving path (extract -> induced batch -> projected forward);
    ``progress``: the name of a tqdm bar over the nodes (None: no bar)."""
    was = model.training
    model.eval()
    proj = project_all(model, data) if proj is None else proj
    out = []
    nodes = np.asarray(nodes, dtype=np.int64)
    with _node_bar(len(nodes), progress) as bar:
        for chunk in _batches(nodes, batch_size):
            b = extractor.batch(chunk, k)
            p_rows = proj[torch.from_numpy(b.node_ids).to(proj.device)]
            nd = model.norm_degrees_for(data.ds.graph, b.node_ids)
            out.append(model.forward_batch_projected(b, p_rows, width, strategy, nd)[0])
            bar.update(len(chunk))
    model.train(was)
    return torch.cat(out) if out else proj.new_zeros(0, model.num_classes)


@torch.no_grad()
def evaluate(model: GNNModel, data: TrainData, nodes: np.ndarray, *, width: int | None = None,
             strategy: str = "fastrand", extractor: Any = None, k: int = 0, batch_size: int = 256,
             proj: Tensor | None = None, progress: str | None = None) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` on ``nodes``: full graph for plain models, batched for shaDow
    (``progress``: the name of a tqdm bar over the batched nodes; None: no bar)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if len(nodes) == 0:
        return float("nan"), float("nan")
    was = model.training
    model.eval()
    if model.extractor == "lhop" and extractor is None:
        p = proj if proj is not None else project_all(model, data)
        logits = model.propagate(data.ds.graph, p, width, strategy)[0][torch.from_numpy(nodes).to(p.device)]
    else:
        logits = predict_batched(model, data, extractor, nodes, k, width, strategy, batch_size, proj, progress)
    model.train(was)
    y = data.y[torch.from_numpy(nodes).to(data.y.device)]
    acc = (logits.argmax(1) == y).float().mean().item()
    loss = F.cross_entropy(logits, y).item()
    return acc, loss



def sample_nodes(nodes: np.ndarray, limit: int, seed: int = 0) -> np.ndarray:
    """At most ``limit`` of ``nodes`` (0 = all): a seeded uniform sample, in random order."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if limit <= 0 or len(nodes) <= limit:
        return nodes
    return np.random.default_rng(seed).choice(nodes, size=int(limit), replace=False)



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
    agreement_nodes: np.ndarray | None = None  # the knob table's agreement sample of the graph's nodes
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
                   width: int | None = None, progress: str | None = None) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` of a plain model on ``nodes`` through execution plans
    (``progress``: the name of a tqdm bar over the nodes; None: no bar)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if len(nodes) == 0:
        return float("nan"), float("nan")
    was = model.training
    model.eval()
    parts = []
    with _node_bar(len(nodes), progress) as bar:
        for c in _batches(nodes, batch_size):
            parts.append(plan_logits(model, data, c, width, strategy))
            bar.update(len(c))
    logits = torch.cat(parts)
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
        stage_times: filled with the wall time of ``ppr_lists`` (shaDow, computed here), ``fit`` and ``test``
            (the test accuracy of the kept weights; with ``progress`` a bar over the test nodes).
    """
    from tqdm.auto import tqdm

    for part, what in (("train", "training nodes (train_mask)"),
                       ("val", "validation nodes (val_mask): the checkpoint kept is the epoch of best validation "
                        "accuracy"),
                       ("test", "test nodes (test_mask): the checkpoint records its test accuracy")):
        if not len(ds.split(part)):
            raise ValueError(f"dataset {getattr(ds, 'name', '') or '?'} has no {what}; give it a non-empty "
                             f"{part}_mask (a synthetic:N graph has all three splits from N = 150)")
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
    agreement_nodes = (sample_nodes(np.arange(ds.num_nodes, dtype=np.int64), cfg.knob_agreement_nodes, cfg.seed + 2)
                       if cfg.knob_agreement_nodes > 0 else np.zeros(0, dtype=np.int64))
    if cfg.is_shadow:
        # bounded evaluation: the PPR lists and the per-epoch validation cost do not grow with N
        val_nodes = np.sort(sample_nodes(data.val, cfg.eval_nodes, cfg.seed))
        test_nodes = np.sort(sample_nodes(data.test, cfg.eval_nodes, cfg.seed + 1))
        ppr_cfg = make_ppr_config(cfg.ppr, cfg.ppr_k)
        if ppr_lookup is None:
            need = np.concatenate([data.train, val_nodes, test_nodes, knob_nodes, agreement_nodes])
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
    # the test accuracy of the kept weights: on a large graph a stage of its own (2 M nodes, a mini-batch GCN's
    # 10,000 exact plans: about 45 s, which passed without a line between "fit" and "knob_table")
    bar = "test accuracy" if progress else None
    if cfg.is_shadow:
        what = f"accuracy of the best epoch on {len(test_nodes):,} test nodes (PPR subgraphs, K={cfg.ppr_k}, exact)"
    elif minibatch:
        what = f"accuracy of the best epoch on {len(test_nodes):,} test nodes (execution plans, exact)"
    else:
        what = f"accuracy of the best epoch on {len(data.test):,} test nodes (one full-graph pass)"
    with stage("test", stage_times, what):
        if cfg.is_shadow:
            test_acc = evaluate(model, data, test_nodes, extractor=extractor, k=cfg.ppr_k, strategy=cfg.strategy,
                                batch_size=cfg.eval_batch_size, progress=bar)[0]
        elif minibatch:
            test_acc = evaluate_plans(model, data, test_nodes, cfg.strategy, cfg.eval_batch_size, progress=bar)[0]
        else:
            test_acc = evaluate(model, data, data.test, strategy=cfg.strategy)[0]
    return TrainResult(
        model=model, config=cfg, data=data, extractor=extractor, best_epoch=stopper.best_epoch,
        epochs_run=epochs_run, val_accuracy=stopper.best[0], val_loss=stopper.best[1], test_accuracy=test_acc,
        train_time_s=train_time, ppr_time_s=ppr_time, ppr_config=ppr_cfg, history=history,
        num_val_eval=len(val_nodes), num_test_eval=len(test_nodes), knob_nodes=knob_nodes, agreement_nodes=agreement_nodes,
        minibatch=minibatch,
    )

