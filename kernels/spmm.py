r"""ES-SpMM: sparse-dense aggregation with deterministic per-row edge sampling.

This module is the specification of the operation (the torch path, used on CPU and for autograd)
and the single dispatch point: :func:`sampled_spmm` runs the CUDA kernel of
:mod:`kernels.spmm_cuda` when ``x`` lives on a GPU, CuPy works and no gradient is needed, the
compiled CPU kernel of :mod:`kernels.spmm_cpu` (or, for some exact passes, ``torch.sparse.mm``)
when ``x`` is on the CPU and no gradient is needed, and the torch path otherwise. Tests hold both
kernels to this file.

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
import warnings
from typing import Any, Literal

import numpy as np
import torch

from ._lazy import imported
from .graph import CSRGraph

# torch warns once per process that sparse CSR is "beta"; it is the documented path here
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state", category=UserWarning)

__all__ = [
    "AGGREGATORS",
    "EXACT_BACKEND",
    "FASTRAND_PRIME",
    "STRATEGIES",
    "exact_csr_view",
    "forget_samples",
    "kept_edges",
    "sample_positions",
    "sampled_csr",
    "sampled_spmm",
    "sampled_spmm_torch",
]

log = logging.getLogger(__name__)

FASTRAND_PRIME = 577
#: 16-bit value types: every path computes them in float32 and rounds the result once
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: the dtypes the compiled CPU kernel computes in
_KERNEL_DTYPES = (torch.float32, torch.float64)
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
_INT32_LIMIT = 2**31 - 1
SAMPLED_CACHE_SIZE = 4  # sampled matrices memoized per graph (the oldest is dropped first)


def device_key(device: torch.device) -> str:
    """``device`` as the graph cache keys name it, with a GPU's index filled in: ``torch.device("cuda")``
    (a server's ``--device cuda``) and ``torch.device("cuda", 0)`` (a tensor's ``.device``) are one
    device, so they must find one memoized entry, not upload the graph twice."""
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _graph_tensors(graph: CSRGraph, device: torch.device) -> dict[str, torch.Tensor]:
    """Tensors of ``graph`` on ``device``, memoized: ``indptr`` int64 ``[N + 1]``, ``deg`` int64 ``[N]``,
    ``crow`` ``[N + 1]`` and ``indices`` ``[E]`` in the CSR index dtype (int32 while ``E`` and ``N``
    fit, which halves the index traffic of the multiply and is what MKL takes without a copy),
    ``weights`` float32 ``[E]`` when weighted."""
    key = f"torch:{device_key(device)}"
    cache = graph.cache()
    t = cache.get(key)
    if t is None:
        small = graph.num_edges <= _INT32_LIMIT and graph.num_nodes <= _INT32_LIMIT
        idt = np.int32 if small else np.int64
        indptr = torch.from_numpy(np.ascontiguousarray(graph.indptr, dtype=np.int64)).to(device)
        t = {
            "indptr": indptr,
            "deg": indptr[1:] - indptr[:-1],
            "crow": indptr.to(torch.int32) if small else indptr,
            "indices": torch.from_numpy(np.ascontiguousarray(graph.indices, dtype=idt)).to(device),
        }
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
    key = f"gcn_dinv:{device_key(device)}:{dtype}"
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


def _gcn_dinv_numpy(graph: CSRGraph, dtype: torch.dtype, norm_degrees: np.ndarray | torch.Tensor | None) -> np.ndarray:
    """:func:`_gcn_dinv` on the CPU as a NumPy array of ``dtype`` (memoized beside it when it comes from the
    graph's own degrees)."""
    if norm_degrees is not None:  # a tensor of degrees may require grad; the kernel's pass takes none
        return _gcn_dinv(graph, torch.device("cpu"), dtype, norm_degrees).detach().numpy()
    key = f"gcn_dinv_numpy:{dtype}"
    cache = graph.cache()
    v = cache.get(key)
    if v is None:
        v = _gcn_dinv(graph, torch.device("cpu"), dtype).numpy()
        cache[key] = v
    return v


def _mod_grid(a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``a[None, :] mod d[:, None]`` for non-negative int64 ``a`` ``[S]`` and positive ``d`` ``[R, 1]``.

    Integer division does not vectorize on CPUs, so when ``max(a) + max(d)`` stays below the
    float32 (or float64) integer range this computes ``a - floor(a / d) * d`` in floating point,
    which is then exact: every operand and product is an integer below 2**24 (2**53), and the
    rounded quotient cannot reach the next integer, since that would need ``(q + 1) * d`` beyond
    the same bound.
    """
    bound = int(a.max()) + int(d.max()) if a.numel() and d.numel() else 0
    ftype = torch.float32 if bound < 2**24 else torch.float64 if bound < 2**53 else None
    if ftype is None:
        return a % d
    af, df = a.to(ftype), d.to(ftype)
    return torch.addcmul(af, torch.floor(af / df), df, value=-1).to(torch.int64)


def _sampled_edges(
    t: dict[str, torch.Tensor], width: int, strategy: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(kept [N], crow [N + 1], row [T], edge [T])`` for width ``S > 0``, all int64: kept count and
    CSR row pointers of the sample, and the row and the edge id of each of its ``T = sum_r min(d_r,
    S)`` slots, in CSR order.

    Slot ``j = crow_r + t`` of row ``r`` holds edge ``indptr_r + p_r(t)``. First every slot gets
    ``j + (indptr_r - crow_r) = indptr_r + t``, which is final for rows at or below the width and
    for ``bucket``; for ``fastrand`` the rows above the width (exactly ``S`` slots each) are then
    overwritten from an ``[R, S]`` grid of ``(t * 577) mod d_r`` (plus the ``t // m_r`` term of the
    module docstring on the rare rows whose ``d_r`` is a multiple of 577). Work: a few passes over
    the ``T`` slots and the ``[R, S]`` grid, none over all ``E`` edges.
    """
    indptr, deg = t["indptr"], t["deg"]
    device = deg.device
    kept = deg.clamp(max=width)
    crow = torch.zeros(len(deg) + 1, dtype=torch.int64, device=device)
    torch.cumsum(kept, 0, out=crow[1:])
    total = int(crow[-1])
    row = torch.repeat_interleave(kept, output_size=total)
    edge = (indptr[:-1] - crow[:-1]).index_select(0, row)
    edge += torch.arange(total, device=device)
    if strategy == "fastrand":
        rows = torch.nonzero(deg > width).squeeze(1)
        if rows.numel():
            d = deg.index_select(0, rows).unsqueeze(1)
            ts = torch.arange(width, device=device)
            pos = _mod_grid(ts * FASTRAND_PRIME, d)  # [R, S]
            mult = torch.nonzero(d.squeeze(1) % FASTRAND_PRIME == 0).squeeze(1)
            if mult.numel():  # the general formula, on the few rows where it differs
                dm = d.index_select(0, mult).expand(-1, width)
                pos[mult] = sample_positions(dm, ts.expand_as(dm), width, "fastrand")
            pos += indptr.index_select(0, rows).unsqueeze(1)
            slots = crow.index_select(0, rows).unsqueeze(1) + ts
            edge.scatter_(0, slots.view(-1), pos.view(-1))
    return kept, crow, row, edge


def _csr_key(graph: CSRGraph, width: int, strategy: str, aggregator: str, device: torch.device,
             dtype: torch.dtype) -> tuple[bool, tuple]:
    """(whether the pass is exact, the key of its matrix in the graph's memo)."""
    exact = width <= 0 or graph.num_edges == 0 or graph.max_degree <= width
    return exact, (("exact", aggregator, str(device), dtype) if exact else (width, strategy, aggregator, str(device), dtype))


# ----------------------------------------------------------------------------- exact pass through MKL
#: how :func:`sampled_spmm` runs an exact pass on the CPU without gradient: ``"auto"`` (the rule of
#: :func:`_exact_through_torch`), ``"kernel"`` (always the compiled kernel) or ``"torch"`` (always
#: ``torch.sparse.mm``); the benchmark and the tests pin it to time and check both
EXACT_BACKEND = "auto"


#: an exact pass over at least this many features runs the compiled kernel on every graph (``auto``)
EXACT_KERNEL_MIN_FEATURES = 48
#: an exact pass over fewer features goes to MKL on a graph of at least this many rows (``auto``), except ...
EXACT_MKL_MIN_ROWS = 4096
#: ... a ``gcn`` or ``mean`` pass over at least this many features on a graph of short rows (a mean degree
#: of at most :data:`EXACT_SHORT_ROWS_DEGREE`): MKL's route then pays passes over ``[N, F]`` for the
#: aggregator's scales that cost as much as its product, while the kernel applies them in its own pass
EXACT_SHORT_ROWS_MIN_FEATURES = 32
EXACT_SHORT_ROWS_DEGREE = 10


def _exact_through_torch(graph: CSRGraph, features: int, aggregator: str) -> bool:
    """Whether an exact CPU pass goes to ``torch.sparse.mm`` rather than the compiled kernel.

    ``"auto"``: MKL for a graph of at least :data:`EXACT_MKL_MIN_ROWS` rows and fewer than
    :data:`EXACT_KERNEL_MIN_FEATURES` features, except ``gcn`` and ``mean`` passes over
    :data:`EXACT_SHORT_ROWS_MIN_FEATURES` features or more on graphs of short rows; the kernel on smaller
    graphs (a request-sized graph, where building the CSR view and entering MKL cost more than the product)
    and at wider features. Measured on the 2-vCPU VM, 2026-11-26 evening (docs/BENCHMARKS.md, "small graphs
    and exact passes"), the kernel's exact pass against this route, two threads each, both as calls back to
    back and inside a 2-layer model's forward (torch's operations between the calls):

    * 48 features: 1.22x-1.93x back to back (Amazon Computers, mean degree 36; arxiv-like, 14; pubmed-like,
      5; every aggregator), 1.20x-1.73x in the forward (Amazon Computers, Coauthor CS, pubmed-like);
    * 32 features, mean degree at most 10: ``gcn`` and ``mean`` 1.21x-1.92x back to back (pubmed-like,
      Coauthor CS, two SBM graphs of degree 3 and 6), 1.20x-1.65x in the forward: MKL's route multiplies
      ``x`` and the output by the scales in passes of their own, which on short rows cost as much as the
      product; at 16 features 0.89x-1.28x in the forward, so not there;
    * below that on long rows (Amazon Computers, arxiv-like) and for ``sum``: 0.50x-1.17x, MKL keeps those.

    (The rule of 2026-11-25, MKL on every large graph, was measured while the "parallel" kernel ran the
    serial code: numba's cache had served one build to both.)
    """
    if EXACT_BACKEND == "torch":
        return True
    if EXACT_BACKEND == "kernel" or graph.num_edges == 0:
        return False
    if graph.num_nodes < EXACT_MKL_MIN_ROWS or features >= EXACT_KERNEL_MIN_FEATURES:
        return False
    short_rows = graph.num_edges <= EXACT_SHORT_ROWS_DEGREE * graph.num_nodes
    return not (short_rows and aggregator != "sum" and features >= EXACT_SHORT_ROWS_MIN_FEATURES)


def exact_csr_view(graph: CSRGraph, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The graph's adjacency (its weights, or ones) as a CPU torch sparse CSR tensor, built per call
    over the graph's own arrays, so that it can never be stale.

    * ``col_indices`` is the graph's ``indices`` array itself (no copy): an in-place edit of it is
      what the next product reads;
    * ``crow_indices`` is ``indptr`` itself when ``indices`` is int64, else an int32 copy made on
      this call (O(N); torch wants both index arrays in one dtype, and MKL takes int32 without a
      copy of the O(E) side);
    * ``values`` is the graph's ``weights`` array itself when the dtypes agree (a float64 pass
      converts it on this call), or, unweighted, ones. The ones are the only thing kept between
      calls, in ``graph.cache()`` under ``("spmm_ones", E, dtype)``: they depend on the edge count
      and dtype alone, which are in the key, never on the arrays' contents, so a mutated or
      replaced array cannot make them stale.
    """
    with warnings.catch_warnings():
        # a memory-mapped graph is read-only; torch.sparse.mm only reads these views
        warnings.filterwarnings("ignore", message=".*not writable.*")
        indices = torch.from_numpy(np.ascontiguousarray(graph.indices))
        if indices.dtype == torch.int32:
            crow = torch.from_numpy(graph.indptr.astype(np.int32))
        else:
            crow = torch.from_numpy(np.ascontiguousarray(graph.indptr, dtype=np.int64))
        if graph.weights is None:
            key = ("spmm_ones", graph.num_edges, dtype)
            values = graph.cache().get(key)
            if values is None:
                values = torch.ones(graph.num_edges, dtype=dtype)
                graph.cache()[key] = values
        else:
            values = torch.from_numpy(np.ascontiguousarray(graph.weights)).to(dtype)
    n = graph.num_nodes
    return torch.sparse_csr_tensor(crow, indices, values, size=(n, n), check_invariants=False)


def _exact_spmm_mkl(graph: CSRGraph, x: torch.Tensor, aggregator: str, dinv: torch.Tensor | None) -> torch.Tensor:
    """An exact pass without gradient as one ``torch.sparse.mm`` over :func:`exact_csr_view`, the
    aggregator's scales applied to the dense operands (``mean``: ``1 / d_i`` on the output rows;
    ``gcn``: ``D^{-1/2}`` on the rows of ``x`` and of the output, then the self term)."""
    x = x.detach().contiguous()
    mat = exact_csr_view(graph, x.dtype)
    if aggregator == "gcn":
        assert dinv is not None
        col = dinv.to(x.dtype).unsqueeze(1)
        out = torch.sparse.mm(mat, x * col)
        out.mul_(col)
        return out.addcmul_(x, col * col)
    out = torch.sparse.mm(mat, x)
    if aggregator == "mean":
        deg = torch.from_numpy(np.diff(graph.indptr)).clamp_(min=1)  # rows without edges are zero anyway
        out.div_(deg.to(x.dtype).unsqueeze(1))
    return out


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
    term ``x_i / D_i`` comes on top. Values are ``w_ij * scale_i`` (times ``dinv_i * dinv_j`` for
    ``gcn``) with the ``scale`` of the module docstring. Indices are int32 while they fit.

    Memoized on the graph unless ``norm_degrees`` is given: the exact matrix per (aggregator,
    device, dtype), and the latest :data:`SAMPLED_CACHE_SIZE` sampled ones per (width, strategy,
    aggregator, device, dtype), so the layers of one forward pass (and repeated passes over one
    graph) sample once. A fresh sample costs O(sum_i min(d_i, S)) vectorized work.
    """
    device = torch.device(device)
    width = int(width or 0)
    n = graph.num_nodes
    exact, key = _csr_key(graph, width, strategy, aggregator, device, dtype)
    memo = graph.cache().setdefault("spmm_csr", {}) if norm_degrees is None else None
    if memo is not None:
        mat = memo.get(key)
        if mat is not None:
            return mat
    t = _graph_tensors(graph, device)
    deg = t["deg"]
    if exact:
        kept, crow, col, row = deg, t["crow"], t["indices"], None
        w = t.get("weights")
    else:
        kept, crow64, row, edge = _sampled_edges(t, width, strategy)
        crow = crow64.to(t["crow"].dtype)
        col = t["indices"].index_select(0, edge)
        w = t["weights"].index_select(0, edge) if "weights" in t else None
    kept_f = kept.to(dtype).clamp(min=1)
    scale = 1.0 / kept_f if aggregator == "mean" else deg.to(dtype) / kept_f  # rows without edges: unused
    if aggregator == "gcn":
        dinv = _gcn_dinv(graph, device, dtype, norm_degrees)
        scale = scale * dinv
    if row is None:
        val = torch.repeat_interleave(scale, kept, output_size=len(col))
    else:
        val = scale.index_select(0, row)
    if w is not None:
        val *= w.to(dtype)
    if aggregator == "gcn":
        val *= dinv.index_select(0, col)
    # built from valid CSR arrays: skipping torch's invariant check is deliberate (and says so)
    mat = torch.sparse_csr_tensor(crow, col, val, size=(n, n), device=device, check_invariants=False)
    if memo is not None:
        memo[key] = mat
        sampled = [k for k in list(memo) if k[0] != "exact"]
        for k in sampled[: max(0, len(sampled) - SAMPLED_CACHE_SIZE)]:
            memo.pop(k, None)  # oldest first
    return mat


def forget_samples(graph: CSRGraph) -> int:
    """Drop the sampled matrices memoized on ``graph`` (exact ones stay); returns how many went."""
    memo = graph.cache().get("spmm_csr", {})
    gone = [k for k in list(memo) if k[0] != "exact"]
    for k in gone:
        memo.pop(k, None)
    return len(gone)


def _transposed(mat: torch.Tensor) -> torch.Tensor:
    """``mat.T`` as CSR, computed once per matrix (memoized matrices are reused across steps)."""
    t = getattr(mat, "_gnnserve_transposed", None)
    if t is None:
        t = mat.t().to_sparse_csr()
        try:
            mat._gnnserve_transposed = t  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # pragma: no cover - tensors normally take attributes
            pass
    return t


class _CSRMatmul(torch.autograd.Function):
    """``mat @ x`` differentiable in ``x`` only, with ``mat.T`` built once per (memoized) matrix.

    ``torch.sparse.mm``'s own backward transposes (and sorts) the CSR matrix on every backward
    pass; training reuses the same memoized matrix for every epoch, so keeping its transpose makes
    the backward pass one plain CSR product.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, mat: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.mat = mat
        return torch.sparse.mm(mat, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return torch.sparse.mm(_transposed(ctx.mat), grad.contiguous()), None


def sampled_spmm_torch(
    graph: CSRGraph,
    x: torch.Tensor,
    width: int | None = None,
    strategy: str = "fastrand",
    aggregator: str = "sum",
    *,
    norm_degrees: np.ndarray | torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch path (the specification): differentiable in ``x``; runs on any torch device.

    float16 and bfloat16 ``x`` are computed in float32 and the result rounded once to ``x``'s dtype
    (what the CUDA kernel does natively; torch's CPU sparse products take neither type)."""
    width = _check_args(graph, x, width, strategy, aggregator)
    if x.dtype in HALF_DTYPES:
        wide = sampled_spmm_torch(graph, x.float(), width, strategy, aggregator, norm_degrees=norm_degrees)
        return wide.to(x.dtype)
    if graph.num_nodes == 0:
        return x.new_zeros(x.shape)
    mat = sampled_csr(graph, width, strategy, aggregator, device=x.device, dtype=x.dtype, norm_degrees=norm_degrees)
    if not graph.num_edges:
        out = x.new_zeros(x.shape)
    elif x.requires_grad and torch.is_grad_enabled():
        out = _CSRMatmul.apply(x, mat)
    else:
        out = torch.sparse.mm(mat, x)
    if aggregator == "gcn":
        dinv = _gcn_dinv(graph, x.device, x.dtype, norm_degrees)
        out = torch.addcmul(out, x, (dinv * dinv).unsqueeze(1))
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

    The CUDA kernel runs when ``x`` is on a GPU, CuPy is usable and ``x`` needs no gradient
    (float16 and bfloat16 natively, with float32 arithmetic). On the CPU, a pass that needs no
    gradient runs the fused compiled kernel of :mod:`kernels.spmm_cpu`, parallel over rows on large
    graphs (float16 and bfloat16 in float32, rounded back), except an exact pass over few features on a
    large graph, which :func:`_exact_through_torch` sends to ``torch.sparse.mm`` over
    :func:`exact_csr_view` (nothing sampled, nothing memoized). Any other case takes the torch path,
    which is the specification both kernels are tested against (and memoizes its sparse matrices on the
    graph, for training's repeated passes).
    """
    no_grad = not (torch.is_grad_enabled() and x.requires_grad)
    if no_grad and x.is_cpu:
        if x.dtype in _KERNEL_DTYPES:
            width = _check_args(graph, x, width, strategy, aggregator)
            exact = width <= 0 or graph.num_edges == 0 or graph.max_degree <= width
            if exact and graph.num_nodes and _exact_through_torch(graph, x.shape[1], aggregator):
                dinv = _gcn_dinv(graph, x.device, x.dtype, norm_degrees) if aggregator == "gcn" else None
                return _exact_spmm_mkl(graph, x, aggregator, dinv)
            # the kernel takes D^{-1/2} as a NumPy array: memoized as one (a tensor's .numpy() is 1.6 us)
            dinv = _gcn_dinv_numpy(graph, x.dtype, norm_degrees) if aggregator == "gcn" else None
            return imported(f"{__package__}.spmm_cpu").sampled_spmm_cpu(graph, x, width, strategy, aggregator, dinv)
        if x.dtype in HALF_DTYPES:
            # the compiled kernel computes in float32; one rounding back, as the specification does
            return sampled_spmm(graph, x.detach().float(), width, strategy, aggregator,
                                norm_degrees=norm_degrees).to(x.dtype)
    if x.is_cuda and no_grad:
        spmm_cuda = _spmm_cuda()
        if spmm_cuda.available():
            width = _check_args(graph, x, width, strategy, aggregator)
            dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
            dinv = _gcn_dinv(graph, x.device, dtype, norm_degrees) if aggregator == "gcn" else None
            try:  # checked here: the launcher without its own checks
                return spmm_cuda._sampled_spmm_cuda(graph, x, width, strategy, aggregator, dinv)
            except spmm_cuda.KernelBuildError as exc:  # that instance: this pass on the torch path, said once
                _say_once(str(exc), "; the torch path computes these passes")
    return sampled_spmm_torch(graph, x, width, strategy, aggregator, norm_degrees=norm_degrees)


def _spmm_cuda() -> Any:
    """:mod:`kernels.spmm_cuda`, imported on a GPU pass's first call (it imports this module)."""
    return imported(f"{__package__}.spmm_cuda")


_said: set[str] = set()


def _say_once(message: str, consequence: str) -> None:
    if message not in _said:
        _said.add(message)
        log.error("%s%s", message, consequence)
