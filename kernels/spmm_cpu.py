"""Compiled CPU ES-SpMM for inference: one fused pass that samples while it multiplies.

:func:`kernels.spmm.sampled_spmm_torch` is the specification. It builds the sampled matrix as a
torch sparse CSR tensor (a dozen tensor operations: positions, values, rescaling, normalisation)
and then multiplies; on the small graphs of a serving request (an execution plan's layer graphs,
a batch of PPR subgraphs: hundreds to a few thousand rows) those operations, not the arithmetic,
are most of the cost. This kernel computes the same formulas (module docstring of
:mod:`kernels.spmm`) row by row, sampling each row's positions as it goes, parallel over rows:

``out_i = c_i * sum_{t < k_i} w_{i p_i(t)} g_{j} x_j  (+ x_i / D_i for gcn)``, ``j = col(i, p_i(t))``

with ``c_i = d_i / k_i`` (sum), ``1 / k_i`` (mean), ``(d_i / k_i) D_i^{-1/2}`` (gcn) and
``g_j = D_j^{-1/2}`` for gcn (1 otherwise). It has no autograd: :func:`kernels.spmm.sampled_spmm`
sends it CPU tensors that need no gradient, and everything else to the torch path. Accumulation
is in the dtype of ``x`` (float32 or float64), in edge order within a row, so results equal the
torch path up to rounding (tests compare them on random graphs).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange

from .graph import CSRGraph
from .spmm import FASTRAND_PRIME

__all__ = ["fastrand_period", "fastrand_position", "sampled_spmm_cpu"]

_AGG_CODE = {"sum": 0, "mean": 1, "gcn": 2}
_NO_W = np.zeros(0, dtype=np.float32)
#: below this many output rows the kernel runs on one thread (a parallel region costs more than it saves)
PARALLEL_ROWS = 4096


@numba.njit(cache=True, nogil=True, inline="always")
def fastrand_period(d):  # pragma: no cover - compiled
    """``m`` of the fastrand formula for a row of ``d > 0`` edges (``d / gcd(577, d)``)."""
    return d // FASTRAND_PRIME if d % FASTRAND_PRIME == 0 else d


@numba.njit(cache=True, nogil=True, inline="always")
def fastrand_position(t, d, m):  # pragma: no cover - compiled
    """Position of the ``t``-th kept edge of a sampled row of ``d`` edges with period ``m``: the
    formula of :func:`kernels.spmm.sample_positions`, shared by the compiled CPU paths."""
    return ((t * FASTRAND_PRIME) % d + t // m) % d


def _kernel(indptr, indices, weights, x, width, fastrand, agg, dinv, out):  # pragma: no cover - compiled
    n, f = out.shape
    has_w = weights.shape[0] > 0
    for i in prange(n):
        s0 = indptr[i]
        d = indptr[i + 1] - s0
        k = d if width <= 0 or d <= width else width
        sampled = fastrand and width > 0 and d > width
        m = fastrand_period(d) if sampled else d
        row = out[i]
        for c in range(f):
            row[c] = 0.0
        for t in range(k):
            pos = fastrand_position(t, d, m) if sampled else t
            e = s0 + pos
            j = indices[e]
            coef = weights[e] if has_w else 1.0
            if agg == 2:
                coef *= dinv[j]
            xj = x[j]
            for c in range(f):
                row[c] += coef * xj[c]
        if k > 0:
            if agg == 1:
                scale = 1.0 / k
            else:
                scale = d / k
            if agg == 2:
                scale *= dinv[i]
            for c in range(f):
                row[c] *= scale
        if agg == 2:
            self_w = dinv[i] * dinv[i]
            xi = x[i]
            for c in range(f):
                row[c] += self_w * xi[c]


_serial = numba.njit(cache=True, nogil=True)(_kernel)
_parallel = numba.njit(cache=True, nogil=True, parallel=True)(_kernel)


def sampled_spmm_cpu(
    graph: CSRGraph,
    x: torch.Tensor,
    width: int,
    strategy: str,
    aggregator: str,
    dinv: torch.Tensor | None = None,
) -> torch.Tensor:
    """``A_S x`` for a CPU float32/float64 ``x`` ``[N, F]`` without autograd (arguments checked by the
    caller, :func:`kernels.spmm.sampled_spmm`; ``dinv`` = ``D^{-1/2}`` ``[N]`` for ``gcn``)."""
    xn = x.detach().contiguous().numpy()
    out = np.empty_like(xn)
    w = graph.weights if graph.weights is not None else _NO_W
    d = dinv.detach().to(x.dtype).numpy() if dinv is not None else np.zeros(0, dtype=xn.dtype)
    run = _parallel if graph.num_nodes >= PARALLEL_ROWS else _serial
    run(graph.indptr, graph.indices, w, xn, int(width), strategy == "fastrand", _AGG_CODE[aggregator], d, out)
    return torch.from_numpy(out)
