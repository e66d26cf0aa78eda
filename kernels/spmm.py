r"""ES-SpMM: sparse-dense aggregation with deterministic per-row edge sampling.

This module is the specification of the operation (the torch path, used on CPU and for autograd)
and the single dispatch point: :func:`sampled_spmm` runs the CUDA kernel of
:mod:`kernels.spmm_cuda` when ``x`` lives on a GPU, CuPy works and no gradient is needed, and the
torch path otherwise. Tests hold the CUDA kernel to this file.

Sampling (Lin, Luo and Ceze, "Accelerating SpMM Kernel with Cache-First Edge Sampling"). Row ``i``
has ``d_i`` edges at positions ``0 .. d_i - 1`` of its CSR slice; with sampling width ``S`` it keeps
``k_i = min(d_i, S)`` of them, at positions ``p_i(t)`` for ``t = 0 .. k_i - 1``:

* rows with ``d_i <= S`` (and every row when ``S`` is ``None`` or 0): ``p(t) = t``, i.e. exact;
* ``bucket``: ``p(t) = t`` (the first ``S`` edges);
* ``fastrand``: ``p(t) = ((t * 577) mod d_i + t // m_i) mod d_i`` with
  ``m_i = d_i / gcd(577, d_i)``. 577 is prime, so for ``d_i`` not a multiple of 577 this is the
  paper's ``(t * 577) mod d_i`` (``t // m_i = 0`` for ``t < d_i``); when ``d_i`` is a multiple of
  577 the plain formula repeats after ``m_i`` steps, and the ``t // m_i`` term moves each further
  round to the next residue class, so the ``k_i`` positions are always distinct.

Aggregation with edge weights ``w`` (1 for an unweighted graph); ``N(i)`` is the kept set and
every sampled row is rescaled so that it estimates the full row:

* ``sum``:  ``out_i = (d_i / k_i) * sum_{j in N(i)} w_ij x_j``
* ``mean``: ``out_i = (1 / k_i) * sum_{j in N(i)} w_ij x_j``
* ``gcn``:  ``out_i = x_i / D_i + (d_i / k_i) * sum_{j in N(i)} w_ij x_j / sqrt(D_i D_j)`` with
  ``D_i = 1 + sum_{all j} w_ij`` (self-loop added, degrees from the full row, never the sample).
  ``norm_degrees`` overrides ``D``: a subgraph cut from a larger graph passes the ``D`` of the
  full graph so that an L-hop subgraph reproduces the full-graph GCN exactly.

Rows without edges give zeros (``gcn``: just the self term). Output dtype and device follow ``x``.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import torch

from .graph import CSRGraph

__all__ = [
    "AGGREGATORS",
    "FASTRAND_PRIME",
    "STRATEGIES",
    "kept_edges",
    "sample_positions",
    "sampled_csr",
    "sampled_spmm",
    "sampled_spmm_torch",
]

log = logging.getLogger(__name__)

FASTRAND_PRIME = 577
STRATEGIES = ("fastrand", "bucket")
AGGREGATORS = ("sum", "mean", "gcn")
Strategy = Literal["fastrand", "bucket"]
Aggregator = Literal["sum", "mean", "gcn"]


def _check_args(graph: CSRGraph, x: torch.Tensor, width: int | None, strategy: str, aggregator: str) -> int:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if aggregator not in AGGREGATORS:
        raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {aggregator!r}")
    if width is None:
        width = 0
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)):
        raise TypeError(f"width must be an int or None, got {type(width).__name__}")
    if width < 0:
        raise ValueError(f"width must be >= 0 (0 or None = exact), got {width}")
    if x.dim() != 2 or x.shape[0] != graph.num_nodes:
        raise ValueError(f"x must have shape [num_nodes={graph.num_nodes}, F], got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point, got {x.dtype}")
    return int(width)


# ----------------------------------------------------------------------------- sampling positions
def sample_positions(deg: torch.Tensor, t: torch.Tensor, width: int, strategy: str) -> torch.Tensor:
    """Position inside its row of the ``t``-th kept edge of a row with ``deg`` edges (elementwise).

    ``deg`` and ``t`` are int64 tensors of one shape with ``0 <= t < min(deg, width)``. This is the
    formula of the module docstring, shared by every path.
    """
    if strategy == "bucket" or width <= 0:
        return t
    sampled = deg > width
    d = torch.where(sampled, deg, torch.ones_like(deg))  # avoid mod 0 on unsampled rows
    g = torch.where(d % FASTRAND_PRIME == 0, FASTRAND_PRIME, 1)
    m = d // g
    pos = ((t * FASTRAND_PRIME) % d + t // m) % d
    return torch.where(sampled, pos, t)


def kept_edges(graph: CSRGraph, width: int | None) -> int:
    """How many edges a pass at this width aggregates (``sum_i min(d_i, S)``)."""
    if not width:
        return graph.num_edges
    return int(np.minimum(graph.degrees, int(width)).sum())


# ----------------------------------------------------------------------------- torch views of a graph
def _graph_tensors(graph: CSRGraph, device: torch.device) -> dict[str, torch.Tensor]:
    """int64 indptr, int64 indices, degrees and (optional) weights of ``graph`` on ``device``; memoized."""
    key = f"torch:{device}"
    cache = graph.cache()
    t = cache.get(key)
    if t is None:
        indptr = torch.from_numpy(np.ascontiguousarray(graph.indptr, dtype=np.int64))
        indices = torch.from_numpy(np.ascontiguousarray(graph.indices, dtype=np.int64))
        t = {"indptr": indptr.to(device), "indices": indices.to(device)}
        t["deg"] = t["indptr"][1:] - t["indptr"][:-1]
        if graph.weights is not None:
            t["weights"] = torch.from_numpy(np.ascontiguousarray(graph.weights)).to(device)
        cache[key] = t
    return t


def _gcn_dinv(
    graph: CSRGraph, device: torch.device, dtype: torch.dtype, norm_degrees: np.ndarray | torch.Tensor | None = None
) -> torch.Tensor:
    """``D^{-1/2}`` with ``D_i = 1 + sum_j w_ij`` (memoized per device and dtype), or of ``norm_degrees``."""
    if norm_degrees is not None:
        d = torch.as_tensor(norm_degrees, device=device, dtype=torch.float64)
        if d.shape != (graph.num_nodes,):
            raise ValueError(f"norm_degrees must have shape [{graph.num_nodes}], got {tuple(d.shape)}")
        return d.clamp(min=1e-12).rsqrt().to(dtype)
    key = f"gcn_dinv:{device}:{dtype}"
    cache = graph.cache()
    v = cache.get(key)
    if v is None:
        if graph.weights is None:
            dhat = graph.degrees.astype(np.float64) + 1.0
        else:
            dhat = np.bincount(graph.row_ids(), weights=graph.weights, minlength=graph.num_nodes) + 1.0
        v = torch.from_numpy(dhat**-0.5).to(device=device, dtype=dtype)
        cache[key] = v
    return v


def sampled_csr(
    graph: CSRGraph,
    width: int | None,
    strategy: str = "fastrand",
    aggregator: str = "sum",
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    norm_degrees: np.ndarray | torch.Tensor | None = None,
) -> torch.Tensor:
    """The sampled, rescaled adjacency as a torch sparse CSR tensor (the neighbour term only).

    ``sampled_csr(...) @ x`` is the neighbour part of :func:`sampled_spmm`; for ``gcn`` the self
    term ``x_i / D_i`` comes on top. Exact matrices (``width`` 0/None or no row above the width) are
    memoized on the graph, sampled ones are built fresh: O(sum_i min(d_i, S)) vectorized work.
    """
    device = torch.device(device)
    width = int(width or 0)
    t = _graph_tensors(graph, device)
    n = graph.num_nodes
    deg = t["deg"]
    exact = width <= 0 or graph.num_edges == 0 or int(graph.degrees.max()) <= width
    memo = exact and norm_degrees is None
    if memo:
        cached = graph.cache().get(f"exact_csr:{aggregator}:{device}:{dtype}")
        if cached is not None:
            return cached
    if exact:
        crow, col = t["indptr"], t["indices"]
        row = torch.repeat_interleave(torch.arange(n, device=device), deg)
        w = t["weights"].to(dtype) if "weights" in t else torch.ones(len(col), device=device, dtype=dtype)
        kept = deg
    else:
        kept = deg.clamp(max=width)
        crow = torch.zeros(n + 1, dtype=torch.int64, device=device)
        torch.cumsum(kept, 0, out=crow[1:])
        total = int(crow[-1])
        row = torch.repeat_interleave(torch.arange(n, device=device), kept, output_size=total)
        slot = torch.arange(total, device=device) - crow[row]
        edge = t["indptr"][row] + sample_positions(deg[row], slot, width, strategy)
        col = t["indices"][edge]
        w = t["weights"][edge].to(dtype) if "weights" in t else torch.ones(total, device=device, dtype=dtype)
    kept_f = kept.to(dtype)
    if aggregator == "mean":
        scale = torch.where(kept > 0, 1.0 / kept_f.clamp(min=1), torch.zeros_like(kept_f))
    else:
        scale = torch.where(kept > 0, deg.to(dtype) / kept_f.clamp(min=1), torch.zeros_like(kept_f))
    val = w * scale[row]
    if aggregator == "gcn":
        dinv = _gcn_dinv(graph, device, dtype, norm_degrees)
        val = val * dinv[row] * dinv[col]
    mat = torch.sparse_csr_tensor(crow, col, val, size=(n, n), device=device)
    if memo:
        graph.cache()[f"exact_csr:{aggregator}:{device}:{dtype}"] = mat
    return mat


def sampled_spmm_torch(
    graph: CSRGraph,
    x: torch.Tensor,
    width: int | None = None,
    strategy: str = "fastrand",
    aggregator: str = "sum",
    *,
    norm_degrees: np.ndarray | torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch path (the specification): differentiable in ``x``; runs on any torch device."""
    width = _check_args(graph, x, width, strategy, aggregator)
    if graph.num_nodes == 0:
        return x.new_zeros(x.shape)
    mat = sampled_csr(graph, width, strategy, aggregator, device=x.device, dtype=x.dtype, norm_degrees=norm_degrees)
    out = torch.sparse.mm(mat, x) if graph.num_edges else x.new_zeros(x.shape)
    if aggregator == "gcn":
        dinv = _gcn_dinv(graph, x.device, x.dtype, norm_degrees)
        out = out + x * (dinv * dinv).unsqueeze(1)
    return out


# ----------------------------------------------------------------------------- dispatch
def sampled_spmm(
    graph: CSRGraph,
    x: torch.Tensor,
    width: int | None = None,
    strategy: str = "fastrand",
    aggregator: str = "sum",
    *,
    norm_degrees: np.ndarray | torch.Tensor | None = None,
) -> torch.Tensor:
    """ES-SpMM aggregation ``out = A_S x`` (see the module docstring for the exact formulas).

    Args:
        graph: the adjacency (rows = outputs, columns = rows of ``x``).
        x: ``[N, F]`` float features on CPU or GPU.
        width: sampling width ``S``; ``None`` or 0 = exact.
        strategy: ``"fastrand"`` (spread over the row) or ``"bucket"`` (first ``S`` edges).
        aggregator: ``"sum"``, ``"mean"`` or ``"gcn"``.
        norm_degrees: ``gcn`` only: the ``D_i`` to normalise with (default: from ``graph``).

    Returns:
        ``[N, F]`` tensor on ``x``'s device.

    The CUDA kernel runs when ``x`` is on a GPU, CuPy is usable and ``x`` needs no gradient; any
    other case takes the torch path, which is the specification the kernel is tested against.
    """
    if x.is_cuda and not (torch.is_grad_enabled() and x.requires_grad):
        from . import spmm_cuda

        if spmm_cuda.available():
            width = _check_args(graph, x, width, strategy, aggregator)
            dinv = _gcn_dinv(graph, x.device, torch.float32, norm_degrees) if aggregator == "gcn" else None
            return spmm_cuda.sampled_spmm_cuda(graph, x, width, strategy, aggregator, gcn_dinv=dinv)
    return sampled_spmm_torch(graph, x, width, strategy, aggregator, norm_degrees=norm_degrees)
