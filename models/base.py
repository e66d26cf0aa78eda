r"""What every gnnserve model shares: the serving interface and small tensor helpers.

A model maps raw node features to class logits in two stages, so that the server can cache the
first per node:

* ``project(x_raw)`` ``[n, F] -> [n, P]``: feature normalisation (:class:`~models.norm.FeatureNorm`)
  followed by the first layer's linear map(s) that touch only a node's own features. Row-wise, so
  projecting a subset of nodes gives the matching rows of projecting all of them.
* ``forward_batch_projected(batch, p_rows, width, strategy, norm_degrees)``: everything after the
  projection on a :class:`kernels.subgraph.SubgraphBatch` (block-diagonal union of per-target
  subgraphs), returning ``(logits [B, C], embedding [B, H])`` for the ``B`` targets.

``forward_batch(batch, x_rows, ...) == forward_batch_projected(batch, project(x_rows), ...)``.
Every aggregation goes through :func:`kernels.sampled_spmm` with the sampling width given to the
forward call (``None``/0 = exact), so one trained model runs at any width.

A "batch" here is anything with the :class:`SubgraphBatch` fields ``graph`` (a
:class:`~kernels.graph.CSRGraph` over the ``R`` rows), ``ptr`` (int64 ``[B + 1]``) and
``target_rows`` (int64 ``[B]``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels.dense import linear
from kernels.fused_forward import StackParams
from kernels.graph import CSRGraph
from kernels.plan import ExecutionPlan

from .norm import FeatureNorm

__all__ = [
    "BatchLike",
    "GNNModel",
    "as_index_tensor",
    "conv_stack_arrays",
    "dinv32",
    "dropout_any",
    "full_gcn_degrees",
    "gcn_dinv32",
    "glorot_",
    "linear_any",
    "numpy32",
    "segment_ids",
]


class BatchLike(Protocol):
    graph: CSRGraph
    ptr: np.ndarray
    target_rows: np.ndarray


def glorot_(w: Tensor) -> Tensor:
    """Glorot/Xavier uniform initialisation in place: U(-a, a), ``a = sqrt(6 / (fan_in + fan_out))``."""
    a = math.sqrt(6.0 / (w.shape[-2] + w.shape[-1]))
    with torch.no_grad():
        return w.uniform_(-a, a)


def linear_any(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight.T`` for a dense or a sparse ``x`` ``[n, in]``; ``weight`` ``[out, in]``.

    Sparse inputs should be COO: PyTorch's CSR backward (``x^T @ grad``) is two orders of
    magnitude slower on CPU (measured: 0.88 s against 3 ms for Cora's features).

    A dense product on the CPU outside autograd (serving, evaluation) is :func:`kernels.dense.rows_matmul`:
    each row's bits independent of the rows beside it, so a node gets the same answer alone and in any
    batch; the same product in training (autograd) stays torch's.
    """
    if x.layout != torch.strided:
        return torch.sparse.mm(x, weight.t())
    return linear(x, weight)


def dropout_any(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout on a dense tensor, or on the stored values of a sparse (coalesced COO or CSR) tensor."""
    if not training or p <= 0:
        return x
    if x.layout == torch.sparse_coo:
        x = x.coalesce()
        return torch.sparse_coo_tensor(x.indices(), F.dropout(x.values(), p, True), size=x.shape,
                                       is_coalesced=True, check_invariants=False)  # x's own indices
    if x.layout == torch.sparse_csr:
        vals = F.dropout(x.values(), p, True)
        return torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), vals, size=x.shape, check_invariants=False)
    if x.layout != torch.strided:
        raise TypeError(f"dropout on layout {x.layout} is not supported; use a dense, COO or CSR tensor")
    return F.dropout(x, p, True)


def as_index_tensor(a: np.ndarray | Tensor, device: torch.device) -> Tensor:
    return torch.as_tensor(np.asarray(a) if not isinstance(a, Tensor) else a, dtype=torch.int64, device=device)


def segment_ids(ptr: Tensor, total: int | None = None) -> Tensor:
    """Subgraph id of every row: ``ptr`` int64 ``[B + 1]`` -> int64 ``[ptr[-1]]``. ``total`` (= ``ptr[-1]``,
    when the caller knows it) spares a GPU the read-back of the output size."""
    counts = ptr[1:] - ptr[:-1]
    return torch.repeat_interleave(torch.arange(len(counts), device=ptr.device), counts, output_size=total)


def dinv32(degrees: np.ndarray) -> np.ndarray:
    """float32 :math:`D^{-1/2}` of float64 GCN degrees: the one formula behind every CPU path's GCN normalisation
    (:func:`gcn_dinv32`, a replica's, a new node's scope), so that they agree to the bit."""
    return (np.maximum(degrees, 1e-12) ** -0.5).astype(np.float32)


def full_gcn_degrees(graph: CSRGraph) -> np.ndarray:
    r"""GCN degrees ``D_i = 1 + sum_j w_ij`` of every node of ``graph`` (float64 ``[N]``, memoized).

    Pass ``full_gcn_degrees(g)[batch.node_ids]`` as ``norm_degrees`` so that a GCN on L-hop
    subgraphs of ``g`` normalises exactly as on ``g`` itself.
    """
    cache = graph.cache()
    d = cache.get("models:gcn_degrees")
    if d is None:
        if graph.weights is None:
            d = graph.degrees.astype(np.float64) + 1.0
        else:
            d = np.bincount(graph.row_ids(), weights=graph.weights, minlength=graph.num_nodes) + 1.0
        cache["models:gcn_degrees"] = d
    return d


def carry_gcn_degrees(old: CSRGraph, new: CSRGraph, changed_rows: np.ndarray) -> None:
    """Memoize on ``new`` (an edit of ``old`` that changed ``changed_rows`` and may have added nodes at
    the end) the GCN degrees ``old`` has memoized, recomputing only the changed rows: a live graph's
    update then costs O(N) copies instead of a pass over every edge."""
    src, dst = old.cache(), new.cache()
    d_old = src.get("models:gcn_degrees")
    if d_old is None or "models:gcn_degrees" in dst:
        return
    rows = np.asarray(changed_rows, dtype=np.int64)
    d = np.empty(new.num_nodes, dtype=np.float64)
    d[: len(d_old)] = d_old
    starts, ends = new.indptr[rows], new.indptr[rows + 1]
    if new.weights is None:
        d[rows] = (ends - starts) + 1.0
    else:
        cs = np.concatenate([[0.0], np.cumsum(new.weights[np.concatenate([np.arange(a, b) for a, b in
                                                                          zip(starts, ends, strict=True)])
                                                       if len(rows) else np.zeros(0, np.int64)],
                                              dtype=np.float64)])
        lens = ends - starts
        bounds = np.concatenate([[0], np.cumsum(lens)])
        d[rows] = cs[bounds[1:]] - cs[bounds[:-1]] + 1.0
    dst["models:gcn_degrees"] = d
    v_old = src.get("models:gcn_dinv32")
    if v_old is not None:
        v = np.empty(new.num_nodes, dtype=np.float32)
        v[: len(v_old)] = v_old
        v[rows] = dinv32(d[rows])
        dst["models:gcn_dinv32"] = v


def numpy32(t: Tensor | None) -> np.ndarray | None:
    """A parameter as a float32 NumPy array on the host (``None`` stays ``None``)."""
    return None if t is None else t.detach().float().cpu().numpy()


def conv_stack_arrays(convs: nn.ModuleList) -> tuple[list[np.ndarray], list[np.ndarray | None], list[int]]:
    """Per conv layer: transform matrix, bias (or ``None``) and output width, as float32 NumPy
    arrays (what :meth:`kernels.fused_forward.StackParams.pack` takes)."""
    mats = [numpy32(c.transform_matrix()) for c in convs]
    return mats, [numpy32(c.bias) for c in convs], [int(c.out_channels) for c in convs]


def gcn_dinv32(graph: CSRGraph) -> np.ndarray:
    """float32 ``[N]`` :math:`D^{-1/2}` of :func:`full_gcn_degrees` (memoized), what
    :func:`kernels.fused_forward.plan_forward_cpu` takes for a GCN."""
    cache = graph.cache()
    v = cache.get("models:gcn_dinv32")
    if v is None:
        v = dinv32(full_gcn_degrees(graph))
        cache["models:gcn_dinv32"] = v
    return v


class GNNModel(nn.Module):
    """Base class of GCN, GraphSAGE and the shaDow wrapper (see the module docstring).

    Subclasses set ``arch`` and ``extractor`` and implement :meth:`project_normalized`,
    :meth:`forward_batch_projected`, :meth:`reset_parameters` and :meth:`config`.

    Attributes:
        arch: ``"gcn"``, ``"sage"``, ``"shadow-gcn"`` or ``"shadow-sage"``.
        extractor: ``"lhop"`` (exact L-hop receptive field) or ``"ppr"`` (top-K PPR subgraph).
        norm: the fitted :class:`FeatureNorm` applied by :meth:`project`.
    """

    arch: ClassVar[str] = ""
    extractor: ClassVar[str] = ""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, layers: int, dropout: float,
                 norm: FeatureNorm | None = None) -> None:
        super().__init__()
        if in_dim < 1 or hidden < 1 or num_classes < 2:
            raise ValueError(f"need in_dim >= 1, hidden >= 1, num_classes >= 2; got {in_dim}, {hidden}, {num_classes}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        self.in_dim = int(in_dim)
        self.hidden = int(hidden)
        self.num_classes = int(num_classes)
        self.layers = int(layers)
        self.dropout = float(dropout)
        self.norm = norm if norm is not None else FeatureNorm(in_dim, "none")
        if self.norm.num_features != in_dim:
            raise ValueError(f"FeatureNorm has {self.norm.num_features} features, model expects {in_dim}")

    # ---------------------------------------------------------------- interface
    @property
    def projection_dim(self) -> int:
        """``P``: width of :meth:`project`'s output."""
        raise NotImplementedError

    @property
    def embedding_dim(self) -> int:
        """``H``: width of the embedding returned beside the logits."""
        raise NotImplementedError

    def project_normalized(self, xn: Tensor) -> Tensor:
        """First-layer linear map(s) of already normalised features ``xn`` ``[n, F]`` (dense or sparse CSR)."""
        raise NotImplementedError

    def project(self, x_raw: Tensor) -> Tensor:
        """Normalise raw features and apply the first layer's own-feature map(s): ``[n, F] -> [n, P]``."""
        return self.project_normalized(self.norm(x_raw))

    def forward_batch_projected(
        self,
        batch: BatchLike,
        p_rows: Tensor,
        width: int | None = None,
        strategy: str = "fastrand",
        norm_degrees: np.ndarray | Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def forward_batch(
        self,
        batch: BatchLike,
        x_rows: Tensor,
        width: int | None = None,
        strategy: str = "fastrand",
        norm_degrees: np.ndarray | Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Logits ``[B, C]`` and embeddings ``[B, H]`` of the batch's targets from raw row features ``[R, F]``."""
        return self.forward_batch_projected(batch, self.project(x_rows), width, strategy, norm_degrees)

    def norm_degrees_for(self, graph: CSRGraph, node_ids: np.ndarray) -> np.ndarray | None:
        """The ``norm_degrees`` the server passes for a batch cut from ``graph`` (``None``: use the batch's own)."""
        return None

    def config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-able) that :func:`models.build_model` turns back into this model."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        raise NotImplementedError

    def _check_rows(self, batch: BatchLike, rows: Tensor, what: str, dim: int) -> None:
        if rows.dim() != 2 or rows.shape[0] != batch.graph.num_nodes or rows.shape[1] != dim:
            raise ValueError(f"{what} must have shape [R={batch.graph.num_nodes}, {dim}], got {tuple(rows.shape)}")


class PlainGNN(GNNModel):
    """Shared body of the plain ``L``-layer stacks (GCN, GraphSAGE): one conv per layer, ReLU between.

    Subclasses build ``self.convs`` (each with ``transform`` and ``aggregate``), set
    ``projection_dim`` and, when the aggregation takes degrees, :attr:`takes_norm_degrees`.
    """

    extractor = "lhop"
    takes_norm_degrees: ClassVar[bool] = False
    #: whether the aggregation rescales a sampled row by ``d_i / k_i`` (``gcn``, ``sum``; not ``mean``)
    rescales_samples: ClassVar[bool] = True
    #: the layer formula of :mod:`kernels.fused_forward` (``AGG_GCN`` / ``AGG_SAGE``)
    plan_aggregator: ClassVar[int] = -1
    convs: nn.ModuleList

    @property
    def hops(self) -> int:
        """Receptive field in hops (= layers)."""
        return self.layers

    @property
    def embedding_dim(self) -> int:
        return self.hidden

    def reset_parameters(self) -> None:
        for conv in self.convs:
            conv.reset_parameters()

    def project_normalized(self, xn: Tensor) -> Tensor:
        """The first layer's ``transform`` of dropped-out normalised rows: ``[n, F]`` -> ``[n, P]``."""
        return self.convs[0].transform(dropout_any(xn, self.dropout, self.training))

    def propagate(self, graph: CSRGraph, p: Tensor, width: int | None = None, strategy: str = "fastrand",
                  norm_degrees: np.ndarray | Tensor | None = None) -> tuple[Tensor, Tensor]:
        """From projected rows ``p`` ``[n, P]`` to logits ``[n, C]`` and embeddings ``[n, H]`` of every node.

        ``norm_degrees`` reaches the aggregation only where :attr:`takes_norm_degrees` (GCN).
        """
        extra = (norm_degrees,) if self.takes_norm_degrees else ()
        t = p
        h = p
        emb = p
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            if i > 0:
                t = conv.transform(F.dropout(h, self.dropout, self.training))
            h = conv.aggregate(graph, t, width, strategy, *extra)
            if i < last:
                h = F.relu(h)
                emb = h
        return h, emb

    def forward_plan(self, plan: ExecutionPlan, p_rows: Tensor,
                     norm_degrees: np.ndarray | Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits ``[B, C]`` and embeddings ``[B, H]`` of a plan's targets (:mod:`kernels.plan`).

        ``p_rows`` ``[n_0, P]``: projections of ``plan.node_ids``; ``norm_degrees`` (GCN): the full
        graph's degrees of those nodes. Layer ``l`` computes only the plan's ``n_l`` rows; the
        sampling width is the plan's (its layer graphs hold the kept edges only).
        """
        if plan.layers != self.layers:
            raise ValueError(f"the plan has {plan.layers} layers, the model {self.layers}")
        if p_rows.dim() != 2 or p_rows.shape != (plan.sizes[0], self.projection_dim):
            raise ValueError(f"p_rows must have shape [{plan.sizes[0]}, {self.projection_dim}], "
                             f"got {tuple(p_rows.shape)}")
        h = p_rows
        emb = p_rows
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            graph = plan.layer_graph(i + 1, self.rescales_samples)
            n_in = graph.num_nodes
            t = p_rows if i == 0 else conv.transform(F.dropout(h[:n_in], self.dropout, self.training))
            extra = (None if norm_degrees is None else norm_degrees[:n_in],) if self.takes_norm_degrees else ()
            h = conv.aggregate(graph, t, None, "fastrand", *extra)[: plan.sizes[i + 1]]
            if i < last:
                h = F.relu(h)
                emb = h
        b = plan.num_targets
        return h[:b], emb[:b]

    def fused_params(self) -> StackParams:
        """The weights after the projection, packed for :func:`kernels.fused_forward.plan_forward_cpu`
        (the compiled twin of :meth:`forward_plan`; a snapshot: pack again after changing weights)."""
        return StackParams.pack(self.plan_aggregator, *conv_stack_arrays(self.convs))

    def forward(self, graph: CSRGraph, x: Tensor, width: int | None = None, strategy: str = "fastrand",
                norm_degrees: np.ndarray | Tensor | None = None) -> Tensor:
        """Full-graph logits ``[N, C]`` from raw features ``x`` ``[N, F]``."""
        return self.propagate(graph, self.project(x), width, strategy, norm_degrees)[0]

    def forward_batch_projected(self, batch: BatchLike, p_rows: Tensor, width: int | None = None,
                                strategy: str = "fastrand",
                                norm_degrees: np.ndarray | Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits ``[B, C]`` and embeddings ``[B, H]`` of the targets from projected rows ``[R, P]``."""
        self._check_rows(batch, p_rows, "p_rows", self.projection_dim)
        logits, emb = self.propagate(batch.graph, p_rows, width, strategy, norm_degrees)
        t = torch.as_tensor(np.asarray(batch.target_rows), dtype=torch.int64, device=p_rows.device)
        return logits[t], emb[t]

    def config(self) -> dict[str, Any]:
        return {"arch": self.arch, "in_dim": self.in_dim, "hidden": self.hidden, "num_classes": self.num_classes,
                "layers": self.layers, "dropout": self.dropout}
