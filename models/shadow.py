r"""shaDow-GNN (Zeng et al., "Decoupling the depth and scope of graph neural networks").

A GNN of any depth ``L`` runs on a small subgraph :math:`G_{[v]}` chosen per target ``v`` (here:
the node-induced subgraph on the top-``K`` nodes by approximate personalized PageRank from ``v``,
``v`` always included), not on the full ``L``-hop neighbourhood. A batch is the block-diagonal
union of ``B`` such subgraphs (:class:`kernels.subgraph.SubgraphBatch`, ``R`` rows, subgraph ``b``
on rows ``ptr[b]:ptr[b+1]``, its target on row ``ptr[b]``).

Backbone (``"gcn"`` = :class:`~models.gcn.GCNConv`, ``"sage"`` = :class:`~models.sage.SAGEConv`),
all layers ``H`` wide, ReLU after every layer, dropout ``p`` before every layer; the GCN
normalisation uses the degrees *inside the subgraph* (that is the shaDow model; ``norm_degrees``
overrides them if given):

.. math::

    H_0 = \mathrm{norm}(X_{rows}) \;[R, F], \qquad
    H_l = \mathrm{ReLU}(\mathrm{conv}_l(G_{batch}, H_{l-1})) \;[R, H], \quad l = 1..L.

Readout per subgraph ``b`` with row set :math:`V_b` and target row :math:`t_b` (``pool`` =
``"none"``, ``"mean"``, ``"max"`` or ``"mean+max"``):

.. math::

    r_b = H_L[t_b] \,\|\, \frac{1}{|V_b|} \sum_{u \in V_b} H_L[u] \,\|\, \max_{u \in V_b} H_L[u]
    \quad [(1 + n_{pool}) H], \qquad z_b = W_c\, \mathrm{dropout}(r_b) + b_c \quad [C].

The embedding of a target is :math:`r_b`. Subgraphs never share edges, so the batch result is
exactly the per-target results stacked. The first layer's own-feature map(s) form
:meth:`ShadowGNN.project` ``[n, P]`` (``P = H`` for GCN, ``2H`` for SAGE), cached per node by the
server.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels.fused_forward import AGG_GCN, AGG_SAGE, StackParams

from .base import BatchLike, GNNModel, conv_stack_arrays, dropout_any, linear_any, numpy32, segment_ids
from .gcn import GCNConv
from .norm import FeatureNorm
from .sage import SAGEConv

__all__ = ["BACKBONES", "POOLS", "ShadowGNN", "segment_max", "segment_mean"]

BACKBONES = ("gcn", "sage")
POOLS = ("none", "mean", "max", "mean+max")


def segment_mean(h: Tensor, seg: Tensor, num_segments: int) -> Tensor:
    """Mean of the rows of ``h`` ``[R, H]`` per segment id ``seg`` ``[R]`` -> ``[B, H]``."""
    out = h.new_zeros(num_segments, h.shape[1]).index_add_(0, seg, h)
    # counted with index_add_ (bincount reads the largest id back to size its output: a GPU sync)
    cnt = h.new_zeros(num_segments).index_add_(0, seg, h.new_ones(seg.shape[0])).clamp(min=1)
    return out / cnt.unsqueeze(1)


def segment_max(h: Tensor, seg: Tensor, num_segments: int) -> Tensor:
    """Elementwise max of the rows of ``h`` ``[R, H]`` per segment -> ``[B, H]`` (0 for an empty segment)."""
    idx = seg.unsqueeze(1).expand(-1, h.shape[1])
    return h.new_zeros(num_segments, h.shape[1]).scatter_reduce(0, idx, h, "amax", include_self=False)


class ShadowGNN(GNNModel):
    """shaDow-GNN wrapper around a GCN or GraphSAGE backbone (module docstring).

    Args:
        backbone: ``"gcn"`` or ``"sage"``.
        in_dim: ``F``; hidden: ``H``; num_classes: ``C``; layers: ``L >= 1``; dropout: ``p``.
        pool: subgraph pooling concatenated to the target row: ``"none"``, ``"mean"``, ``"max"``,
            ``"mean+max"``.
        norm: fitted feature normalisation (default: none).
    """

    extractor = "ppr"

    def __init__(self, backbone: str, in_dim: int, hidden: int, num_classes: int, layers: int = 3,
                 dropout: float = 0.5, pool: str = "mean", norm: FeatureNorm | None = None) -> None:
        super().__init__(in_dim, hidden, num_classes, layers, dropout, norm)
        if backbone not in BACKBONES:
            raise ValueError(f"backbone must be one of {BACKBONES}, got {backbone!r}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        if layers < 1:
            raise ValueError(f"shaDow-GNN needs at least 1 layer, got {layers}")
        self.backbone = backbone
        self.pool = pool
        self.arch = f"shadow-{backbone}"  # type: ignore[misc]
        conv = GCNConv if backbone == "gcn" else SAGEConv
        dims = [in_dim] + [hidden] * layers
        self.convs = nn.ModuleList(conv(a, b) for a, b in itertools.pairwise(dims))
        self.pools = [] if pool == "none" else pool.split("+")
        self.classifier = nn.Linear(self.embedding_dim, num_classes)
        self.reset_parameters()

    @property
    def projection_dim(self) -> int:
        return self.hidden if self.backbone == "gcn" else 2 * self.hidden

    @property
    def embedding_dim(self) -> int:
        return self.hidden * (1 + len(self.pools))

    def reset_parameters(self) -> None:
        for conv in self.convs:
            conv.reset_parameters()
        self.classifier.reset_parameters()

    def project_normalized(self, xn: Tensor) -> Tensor:
        """First layer's own-feature map(s) of normalised rows: ``[n, F]`` -> ``[n, P]``."""
        return self.convs[0].transform(dropout_any(xn, self.dropout, self.training))

    def _aggregate(self, conv: nn.Module, graph, t: Tensor, width, strategy, norm_degrees) -> Tensor:
        if self.backbone == "gcn":
            return conv.aggregate(graph, t, width, strategy, norm_degrees)
        return conv.aggregate(graph, t, width, strategy)

    def forward_batch_projected(self, batch: BatchLike, p_rows: Tensor, width: int | None = None,
                                strategy: str = "fastrand",
                                norm_degrees: np.ndarray | Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits ``[B, C]`` and readout embeddings ``[B, (1 + n_pool) H]`` from projected rows ``[R, P]``.

        ``norm_degrees`` (GCN backbone only): ``None`` = the degrees inside each subgraph (as trained).
        """
        self._check_rows(batch, p_rows, "p_rows", self.projection_dim)
        graph = batch.graph
        t = p_rows
        h = p_rows
        for i, conv in enumerate(self.convs):
            if i > 0:
                t = conv.transform(F.dropout(h, self.dropout, self.training))
            h = F.relu(self._aggregate(conv, graph, t, width, strategy, norm_degrees), inplace=not torch.is_grad_enabled())
        dev = p_rows.device
        ptr = torch.as_tensor(np.asarray(batch.ptr), dtype=torch.int64, device=dev)
        target_rows = torch.as_tensor(np.asarray(batch.target_rows), dtype=torch.int64, device=dev)
        parts = [h[target_rows]]
        if self.pools:
            seg = segment_ids(ptr, h.shape[0])
            nseg = len(ptr) - 1
            for kind in self.pools:
                parts.append(segment_mean(h, seg, nseg) if kind == "mean" else segment_max(h, seg, nseg))
        r = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        logits = linear_any(F.dropout(r, self.dropout, self.training), self.classifier.weight)  # nn.Linear's product
        return (logits + self.classifier.bias if self.classifier.bias is not None else logits), r

    def fused_params(self) -> StackParams:
        """Weights after the projection, readout and classifier, packed for
        :func:`kernels.fused_forward.shadow_forward_cpu` (the compiled twin of
        :meth:`forward_batch_projected`; a snapshot: pack again after changing weights)."""
        return StackParams.pack(AGG_GCN if self.backbone == "gcn" else AGG_SAGE, *conv_stack_arrays(self.convs),
                                self.pools, (numpy32(self.classifier.weight), numpy32(self.classifier.bias)))

    def forward(self, batch: BatchLike, x_rows: Tensor, width: int | None = None, strategy: str = "fastrand",
                norm_degrees: np.ndarray | Tensor | None = None) -> Tensor:
        """Logits ``[B, C]`` of the batch's targets from raw row features ``x_rows`` ``[R, F]``."""
        return self.forward_batch(batch, x_rows, width, strategy, norm_degrees)[0]

    def config(self) -> dict[str, Any]:
        return {"arch": self.arch, "backbone": self.backbone, "in_dim": self.in_dim, "hidden": self.hidden,
                "num_classes": self.num_classes, "layers": self.layers, "dropout": self.dropout, "pool": self.pool}
