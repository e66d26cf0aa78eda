r"""GCN (Kipf and Welling, 2017): the graph convolution layer and the plain L-layer model.

Layer (:class:`GCNConv`), with the sampled symmetric normalisation of :mod:`kernels.spmm`
(aggregator ``"gcn"``, self-loops included):

.. math::

    h'_i = \frac{1}{D_i} h_i \Theta
         + \frac{d_i}{k_i} \sum_{j \in N_S(i)} \frac{w_{ij}}{\sqrt{D_i D_j}} h_j \Theta + b,
    \qquad D_i = 1 + \sum_{j \in N(i)} w_{ij}

with ``h`` ``[n, F_in]``, :math:`\Theta` ``[F_in, F_out]`` (stored transposed as ``weight``
``[F_out, F_in]``), ``b`` ``[F_out]``; :math:`N_S(i)` is the kept set of ``k_i = min(d_i, S)``
edges at sampling width ``S`` (all ``d_i`` edges when exact). At exact width this is
:math:`\hat D^{-1/2} (A + I) \hat D^{-1/2} H \Theta + b`. The linear map runs first (it commutes
with the aggregation), which is what lets the server cache ``x \Theta_1`` per node.

Model (:class:`GCN`), ``L`` layers, ReLU between them, dropout ``p`` before every layer:

.. math::

    P = \mathrm{norm}(X)\, \Theta_1 \;\; [n, H] \quad (\texttt{project}), \qquad
    H_1 = \mathrm{ReLU}(\hat A_S P + b_1), \quad
    H_l = \mathrm{ReLU}(\hat A_S H_{l-1} \Theta_l + b_l), \quad
    Z = \hat A_S H_{L-1} \Theta_L + b_L \;\; [n, C].

The embedding of a node is its row of :math:`H_{L-1}` ``[H]``. The receptive field is the
``L``-hop neighbourhood (``extractor = "lhop"``); on an induced L-hop subgraph, passing the full
graph's degrees as ``norm_degrees`` (:meth:`GCN.norm_degrees_for`) reproduces the full-graph
logits of the targets exactly.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import Tensor, nn

from kernels.fused_forward import AGG_GCN
from kernels.graph import CSRGraph
from kernels.spmm import sampled_spmm

from .base import PlainGNN, full_gcn_degrees, glorot_, linear_any
from .norm import FeatureNorm

__all__ = ["GCN", "GCNConv"]


class GCNConv(nn.Module):
    r"""One graph convolution :math:`h' = \hat A_S (h \Theta) + b` (module docstring).

    Args:
        in_channels: ``F_in``.
        out_channels: ``F_out``.
        bias: add a learnable ``b``.

    Shapes: ``graph`` with ``n`` nodes, ``x`` ``[n, F_in]`` -> ``[n, F_out]``.
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True) -> None:
        super().__init__()
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.weight = nn.Parameter(torch.empty(self.out_channels, self.in_channels))
        self.bias = nn.Parameter(torch.empty(self.out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def transform_matrix(self) -> Tensor:
        """``Θ^T`` ``[F_out, F_in]``: :meth:`transform` is ``x @ transform_matrix().T``."""
        return self.weight

    def transform(self, x: Tensor) -> Tensor:
        """``x Θ``: ``[n, F_in]`` (dense or sparse CSR) -> ``[n, F_out]``."""
        return linear_any(x, self.transform_matrix())

    def aggregate(self, graph: CSRGraph, xw: Tensor, width: int | None = None, strategy: str = "fastrand",
                  norm_degrees: np.ndarray | Tensor | None = None) -> Tensor:
        """``Â_S (xΘ) + b`` for already transformed rows ``xw`` ``[n, F_out]``."""
        out = sampled_spmm(graph, xw, width, strategy, "gcn", norm_degrees=norm_degrees)
        if self.bias is None:
            return out
        # ``out`` is a fresh tensor: without autograd, add in place (a large serving batch saves an
        # allocation the size of the output)
        return out.add_(self.bias) if not torch.is_grad_enabled() else out + self.bias

    def forward(self, graph: CSRGraph, x: Tensor, width: int | None = None, strategy: str = "fastrand",
                norm_degrees: np.ndarray | Tensor | None = None) -> Tensor:
        return self.aggregate(graph, self.transform(x), width, strategy, norm_degrees)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, bias={self.bias is not None}"


class GCN(PlainGNN):
    """Plain ``L``-layer GCN for node classification (module docstring).

    Args:
        in_dim: ``F``; hidden: ``H``; num_classes: ``C``; layers: ``L >= 2``; dropout: ``p``.
        norm: fitted feature normalisation (default: none).
    """

    arch = "gcn"
    takes_norm_degrees = True
    plan_aggregator = AGG_GCN

    def __init__(self, in_dim: int, hidden: int, num_classes: int, layers: int = 2, dropout: float = 0.5,
                 norm: FeatureNorm | None = None) -> None:
        super().__init__(in_dim, hidden, num_classes, layers, dropout, norm)
        if layers < 2:
            raise ValueError(f"GCN needs at least 2 layers (the embedding is the last hidden layer), got {layers}")
        dims = [in_dim] + [hidden] * (layers - 1) + [num_classes]
        self.convs = nn.ModuleList(GCNConv(a, b) for a, b in itertools.pairwise(dims))

    @property
    def projection_dim(self) -> int:
        return self.hidden

    def norm_degrees_for(self, graph: CSRGraph, node_ids: np.ndarray) -> np.ndarray:
        """Full-graph GCN degrees ``D`` of the rows ``node_ids`` (float64 ``[R]``)."""
        return full_gcn_degrees(graph)[np.asarray(node_ids, dtype=np.int64)]
