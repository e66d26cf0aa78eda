r"""GraphSAGE (Hamilton, Ying and Leskovec, 2017) with the mean aggregator and a root weight.

Layer (:class:`SAGEConv`), mean over the kept neighbours of :mod:`kernels.spmm` (aggregator
``"mean"``: the mean over the ``k_i = min(d_i, S)`` kept edges is an estimate of the full mean):

.. math::

    h'_i = W_r h_i + \frac{1}{k_i} \sum_{j \in N_S(i)} w_{ij}\, W_n h_j + b

with ``h`` ``[n, F_in]``, :math:`W_r, W_n` ``[F_out, F_in]``, ``b`` ``[F_out]``; a node without
neighbours gets :math:`W_r h_i + b`. Because the mean is linear,
:math:`\mathrm{mean}_j(W_n h_j) = W_n\, \mathrm{mean}_j(h_j)`: the layer first maps every row to
``[W_r h_i | W_n h_i]`` ``[n, 2 F_out]`` (:meth:`SAGEConv.transform`) and then aggregates the
second half (:meth:`SAGEConv.aggregate`). For the first layer that map is the model's projection,
so the server caches it per node.

Model (:class:`GraphSAGE`), ``L`` layers, ReLU between them, dropout ``p`` before every layer:

.. math::

    P = [\mathrm{norm}(X) W_{r,1}^T \,|\, \mathrm{norm}(X) W_{n,1}^T] \;\; [n, 2H] \quad (\texttt{project}),
    \qquad H_l = \mathrm{ReLU}(\mathrm{SAGE}_l(H_{l-1})), \qquad Z = \mathrm{SAGE}_L(H_{L-1}) \;\; [n, C].

The embedding of a node is its row of :math:`H_{L-1}`. Receptive field: the ``L``-hop
neighbourhood (``extractor = "lhop"``); the mean needs no global degrees, so an induced L-hop
subgraph reproduces the full-graph logits of its target without ``norm_degrees``.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from kernels.dense import recording
from kernels.fused_forward import AGG_SAGE
from kernels.graph import CSRGraph
from kernels.spmm import sampled_spmm

from .base import PlainGNN, linear_any
from .norm import FeatureNorm

__all__ = ["GraphSAGE", "SAGEConv"]


class SAGEConv(nn.Module):
    r"""One GraphSAGE-mean layer :math:`h'_i = W_r h_i + \mathrm{mean}_S(W_n h_j) + b` (module docstring).

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
        self.weight_root = nn.Parameter(torch.empty(self.out_channels, self.in_channels))
        self.weight_neigh = nn.Parameter(torch.empty(self.out_channels, self.in_channels))
        self.bias = nn.Parameter(torch.empty(self.out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # U(-1/sqrt(F_in), 1/sqrt(F_in)) for weights and bias: the usual fully-connected initialisation.
        bound = 1.0 / math.sqrt(self.in_channels)
        nn.init.uniform_(self.weight_root, -bound, bound)
        nn.init.uniform_(self.weight_neigh, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def transform_matrix(self) -> Tensor:
        """``[W_r; W_n]`` ``[2 F_out, F_in]``: :meth:`transform` is ``x @ transform_matrix().T``.

        Under autograd a new concatenation each call (its gradient flows to both weights); otherwise one kept
        until either weight changes (their version counters and storage), made outside inference mode so that
        :func:`kernels.dense.transposed` can keep its transpose too: a torch-path batch then copies neither
        (2 x 2 F_out x F_in floats a call before). Read only: it is shared by every call."""
        wr, wn = self.weight_root, self.weight_neigh
        if (torch.is_grad_enabled() and (wr.requires_grad or wn.requires_grad)) or recording(wr, wn):
            return torch.cat([wr, wn], dim=0)  # (an export records the concatenation, never a kept value)
        key = (wr._version, wn._version, wr.data_ptr(), wn.data_ptr(), wr.device, wr.dtype, wn.dtype)
        kept = self.__dict__.get("_stacked")
        if kept is None or kept[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                kept = (key, torch.cat([wr.detach(), wn.detach()], dim=0))
            self.__dict__["_stacked"] = kept
        return kept[1]

    def transform(self, x: Tensor) -> Tensor:
        """``[x W_r^T | x W_n^T]``: ``[n, F_in]`` (dense or sparse CSR) -> ``[n, 2 F_out]``."""
        return linear_any(x, self.transform_matrix())

    def aggregate(self, graph: CSRGraph, t: Tensor, width: int | None = None, strategy: str = "fastrand") -> Tensor:
        """``t[:, :F_out] + mean_S(t[:, F_out:]) + b`` for transformed rows ``t`` ``[n, 2 F_out]``."""
        o = self.out_channels
        agg = sampled_spmm(graph, t[:, o:].contiguous(), width, strategy, "mean")
        if not torch.is_grad_enabled():  # ``agg`` is fresh: accumulate in place (no output-sized copies)
            agg.add_(t[:, :o])
            return agg.add_(self.bias) if self.bias is not None else agg
        out = t[:, :o] + agg
        return out + self.bias if self.bias is not None else out

    def forward(self, graph: CSRGraph, x: Tensor, width: int | None = None, strategy: str = "fastrand") -> Tensor:
        return self.aggregate(graph, self.transform(x), width, strategy)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, bias={self.bias is not None}"


class GraphSAGE(PlainGNN):
    """Plain ``L``-layer GraphSAGE-mean for node classification (module docstring).

    Args:
        in_dim: ``F``; hidden: ``H``; num_classes: ``C``; layers: ``L >= 2``; dropout: ``p``.
        norm: fitted feature normalisation (default: none).
    """

    arch = "sage"
    rescales_samples = False  # mean aggregation: a sampled row is the mean of its kept edges
    plan_aggregator = AGG_SAGE

    def __init__(self, in_dim: int, hidden: int, num_classes: int, layers: int = 2, dropout: float = 0.5,
                 norm: FeatureNorm | None = None) -> None:
        super().__init__(in_dim, hidden, num_classes, layers, dropout, norm)
        if layers < 2:
            raise ValueError(f"GraphSAGE needs at least 2 layers (the embedding is the last hidden layer), got {layers}")
        dims = [in_dim] + [hidden] * (layers - 1) + [num_classes]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in itertools.pairwise(dims))

    @property
    def projection_dim(self) -> int:
        return 2 * self.hidden
