"""Compiled CPU ES-SpMM for inference: one fused pass that samples while it multiplies.

:func:`kernels.spmm.sampled_spmm_torch` is the specification. It builds the sampled matrix as a
torch sparse CSR tensor (a dozen tensor operations: positions, values, rescaling, normalisation)
and then multiplies. This kernel computes the same formulas (module docstring of
:mod:`kernels.spmm`) row by row, sampling each row's positions as it goes, parallel over rows:

``out_i = c_i * sum_{t < k_i} w_{i p_i(t)} g_{j} x_j  (+ x_i / D_i for gcn)``, ``j = col(i, p_i(t))``

with ``c_i = d_i / k_i`` (sum), ``1 / k_i`` (mean), ``(d_i / k_i) D_i^{-1/2}`` (gcn) and
``g_j = D_j^{-1/2}`` for gcn (1 otherwise). It has no autograd: :func:`kernels.spmm.sampled_spmm`
sends it CPU tensors that need no gradient, and everything else to the torch path.

How it is fast (each measured against the previous version on Amazon Computers, see
``docs/BENCHMARKS.md``):

* **no integer division per edge.** The fastrand positions ``((t * 577) mod d + t // m) mod d``
  are walked incrementally: ``(t * 577) mod d`` grows by ``577 mod d`` and wraps with one
  subtraction, ``t // m`` is a counter that steps every ``m`` edges. Same positions, same order
  (:func:`fastrand_position` stays the closed form the other compiled paths share). Each row
  walks the simplest way its kind allows (:func:`walk_step`): a row at or below the width reads its
  edges in order, a sampled row whose degree is not a multiple of 577 (nearly all) needs no
  counter; 1.11x-1.33x on one thread against the general walk on every row (2026-11-26).
* **arithmetic in the dtype of** ``x``: edge coefficients and row scales are cast to it, so a
  float32 product never widens to float64 in the inner loop, which LLVM vectorises over features.
* **four kept edges per step**: four gathered rows are combined before the output row is
  touched, which halves the loads and stores of the accumulator and keeps four independent
  gathers in flight; the first kept edge writes the row (no zeroing pass) and a row whose scale
  is 1 (a ``sum`` row that keeps all its edges) is not rescaled. A float32 group of 8 to 127
  features is summed in explicit 32-byte vectors (:func:`kernels.lanes.add4_rows`, the same bits):
  LLVM's own vector loop needs 64 elements, so rows of 10 to 64 features ran scalar code. numba's
  cache follows this file only: the line ``# numba cache key`` above the imports names the digest of
  ``kernels/lanes.py`` (:mod:`kernels.cache_key`), so an edit there recompiles this kernel once the line
  is rewritten.
* **rows narrower than one vector run a kernel compiled for their width** (:func:`serial_kernel`, F = 1 to 7:
  a class count): with the width a constant, LLVM unrolls the loops over a row's features instead of setting up a
  loop of unknown count for each kept edge; 1.05x-1.45x per call (most 1.15x-1.37x), the same bits (2026-11-26).
* **parallel over rows** in ranges dealt out round-robin (:func:`_kernel_parallel`: thread ``t`` takes
  ranges ``t``, ``t + T``, ...), so a degree-skewed stretch of the graph falls on every thread, on
  ``min(torch's, numba's)`` thread count (:func:`kernel_threads`); each range is the serial kernel
  called on views of its rows. numba's OpenMP layer splits a ``prange`` into one contiguous block
  per thread whatever ``numba.parallel_chunksize`` says (checked: 32 chunks of chunk size 1 on two
  threads, the first 16 on thread 0), so the deal is written out here.

Accumulation is in the dtype of ``x`` (float32 or float64), in edge order within a row except that
after the first kept edge each group of four is summed pairwise before it is added, so results equal the torch
path up to rounding (tests compare them on random graphs). The result does not depend on the
thread count: a row is always one thread's work.
"""

# numba cache key: lanes 4d5e0af8c182

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch
from numba import prange

from .graph import CSRGraph
from .lanes import add4_rows
from .spmm import FASTRAND_PRIME
from .threads import kernel_threads, numba_threads_set

__all__ = [
    "fastrand_period", "fastrand_position", "kernel_threads", "runs_parallel", "sampled_spmm_cpu", "serial_kernel",
    "walk_start", "walk_step",
]

_AGG_CODE = {"sum": 0, "mean": 1, "gcn": 2}
_NO_W = np.zeros(0, dtype=np.float32)
#: the kernel's ``dinv`` argument for a pass without one, by the itemsize of ``x``'s dtype (float32, float64)
_NO_D = {4: np.zeros(0, dtype=np.float32), 8: np.zeros(0, dtype=np.float64)}
#: the kernel runs on :func:`kernel_threads` threads from this many output rows, or from
#: :data:`PARALLEL_WORK` edge-features on fewer rows; below both, on one. Alone, back to back, two threads
#: beat one from about 256 rows; inside a model's forward they do not below about 4,000 rows
#: (docs/BENCHMARKS.md, "small graphs"). Not for numba's OpenMP runtime beside torch's: a prototype that ran the
#: ranges on torch's own team did no better (0.62x-1.03x from 256 rows on Cora and CiteSeer; "the small-graph
#: gap is the kernel's cost per row").
PARALLEL_ROWS = 4096
#: edges x features from which a graph of fewer than :data:`PARALLEL_ROWS` rows runs in parallel too
PARALLEL_WORK = 1 << 22
#: the parallel kernel deals out rows in this many ranges per thread (round-robin)
CHUNKS_PER_THREAD = 16


@numba.njit(cache=True, nogil=True, inline="always")
def fastrand_period(d):  # pragma: no cover - compiled
    """``m`` of the fastrand formula for a row of ``d > 0`` edges (``d / gcd(577, d)``)."""
    return d // FASTRAND_PRIME if d % FASTRAND_PRIME == 0 else d


@numba.njit(cache=True, nogil=True, inline="always")
def fastrand_position(t, d, m):  # pragma: no cover - compiled
    """Position of the ``t``-th kept edge of a sampled row of ``d`` edges with period ``m``: the
    formula of :func:`kernels.spmm.sample_positions`, shared by the compiled CPU paths."""
    return ((t * FASTRAND_PRIME) % d + t // m) % d


@numba.njit(cache=True, nogil=True, inline="always")
def _next_position(b, off, tm, step, d, m):  # pragma: no cover - compiled
    """One step of the incremental fastrand walk: the current position ``(b + off) mod d`` and the
    state after it (``b = (t * 577) mod d``, ``off = t // m``, ``tm = t mod m``, ``step = 577 mod d``).
    With ``step = 1`` and ``m`` above the row length it yields ``0, 1, 2, ...``."""
    pos = b + off  # b < d and off <= t < d: one subtraction reduces it
    if pos >= d:
        pos -= d
    b += step
    if b >= d:
        b -= d
    tm += 1
    if tm == m:
        tm = 0
        off += 1
    return pos, b, off, tm


@numba.njit(cache=True, nogil=True, inline="always")
def walk_start(fastrand, width, d, k):  # pragma: no cover - compiled
    """The walk over the kept positions of a row of ``d`` edges that keeps ``k`` at ``width``: the state
    :func:`walk_step` takes, ``(kind, step, d, m, b, off, tm)``. Kind 0 = its first ``k`` edges in order
    (exact rows, ``bucket``), 1 = a sampled row whose period ``m`` is at least ``k`` (``t // m`` is 0 for
    every kept edge: nearly every row), 2 = the general walk (a degree that is a multiple of 577, keeping
    more than ``m`` edges)."""
    if fastrand and width > 0 and d > width:
        m = fastrand_period(d)
        return (1 if m >= k else 2), FASTRAND_PRIME % d, d, m, 0, 0, 0
    return 0, 1, d, d + 1, 0, 0, 0


@numba.njit(cache=True, nogil=True, inline="always")
def walk_step(w):  # pragma: no cover - compiled
    """``(position, next state)`` of a walk (:func:`walk_start`): :func:`_next_position` for a row of a
    known kind; kind 0 counts, kind 1 adds ``577 mod d`` and wraps with one subtraction, kind 2 walks both
    terms. The kind is fixed per row, so the branch on it is predicted; the positions are those of
    :func:`fastrand_position`, in order, without an integer division."""
    kind, step, d, m, b, off, tm = w
    if kind == 0:
        return b, (kind, step, d, m, b + 1, off, tm)
    if kind == 1:
        nb = b + step
        return b, (kind, step, d, m, nb - d if nb >= d else nb, off, tm)
    p, b, off, tm = _next_position(b, off, tm, step, d, m)
    return p, (kind, step, d, m, b, off, tm)


@numba.njit(cache=True, nogil=True, inline="always")
def _rows(indptr, indices, weights, x, width, fastrand, agg, dinv, out, r0, fc):  # pragma: no cover - compiled
    """The rows of ``out``, rows ``r0 ..`` of the graph whose ``indptr`` is given from row ``r0`` on: the serial
    kernel (``r0 = 0``, whole arrays), and each range the parallel one hands out (views of ``indptr`` and
    ``out``). The loop over local rows starts at 0, so LLVM knows the index is not negative and drops the
    wrap-around of every ``indptr[i]`` and ``out[i]``; a loop from a variable start ran Cora 0.94x.

    Inlined (numba's IR) into each kernel with ``fc`` a constant: 0 in :func:`_kernel`, which reads the width from
    ``out``, or the width itself in a narrow kernel of :func:`serial_kernel`. Passed at run time instead, the width
    ran Cora and CiteSeer at 0.74x-0.88x at F = 8 and 16 (LLVM no longer knew it was the rows' length), and a
    narrow kernel that called a compiled ``_kernel`` taking ``fc`` made the generic one 0.89x-0.96x (2026-11-26)."""
    n, f = out.shape
    if fc > 0:
        f = fc
    has_w = weights.shape[0] > 0
    one = x.dtype.type(1.0)
    for i in range(n):
        s0 = indptr[i]
        d = indptr[i + 1] - s0
        k = d if width <= 0 or d <= width else width
        row = out[i]
        if k == 0:
            for c in range(f):
                row[c] = 0.0
        w = walk_start(fastrand, width, d, k)
        t = 0
        if k > 0:  # the first kept edge initialises the row (no separate zeroing pass)
            p0, w = walk_step(w)
            e0 = s0 + p0
            j0 = indices[e0]
            c0 = x.dtype.type(weights[e0]) if has_w else one
            if agg == 2:
                c0 *= dinv[j0]
            x0 = x[j0]
            for c in range(f):
                row[c] = c0 * x0[c]
            t = 1
        while t + 4 <= k:
            p0, w = walk_step(w)
            p1, w = walk_step(w)
            p2, w = walk_step(w)
            p3, w = walk_step(w)
            e0 = s0 + p0
            e1 = s0 + p1
            e2 = s0 + p2
            e3 = s0 + p3
            j0 = indices[e0]
            j1 = indices[e1]
            j2 = indices[e2]
            j3 = indices[e3]
            if has_w:
                c0 = x.dtype.type(weights[e0])
                c1 = x.dtype.type(weights[e1])
                c2 = x.dtype.type(weights[e2])
                c3 = x.dtype.type(weights[e3])
            else:
                c0 = one
                c1 = one
                c2 = one
                c3 = one
            if agg == 2:
                c0 *= dinv[j0]
                c1 *= dinv[j1]
                c2 *= dinv[j2]
                c3 *= dinv[j3]
            add4_rows(row, x[j0], x[j1], x[j2], x[j3], c0, c1, c2, c3, f)
            t += 4
        while t < k:
            p0, w = walk_step(w)
            e0 = s0 + p0
            j0 = indices[e0]
            c0 = x.dtype.type(weights[e0]) if has_w else one
            if agg == 2:
                c0 *= dinv[j0]
            x0 = x[j0]
            for c in range(f):
                row[c] += c0 * x0[c]
            t += 1
        sc = one
        if k > 0:
            scale = 1.0 / k if agg == 1 else d / k
            if agg == 2:
                scale *= dinv[r0 + i]
            sc = x.dtype.type(scale)
        if agg == 2:  # the scale and GCN's self term in one pass (each product rounded, then the sum)
            self_w = dinv[r0 + i] * dinv[r0 + i]
            xi = x[r0 + i]
            for c in range(f):
                row[c] = row[c] * sc + self_w * xi[c]
        elif sc != one:  # an unsampled sum row keeps its sum as it is
            for c in range(f):
                row[c] *= sc


@numba.njit(cache=True, nogil=True)
def _kernel(indptr, indices, weights, x, width, fastrand, agg, dinv, out, r0):  # pragma: no cover - compiled
    """:func:`_rows` reading the row width from ``out``: the serial kernel from :data:`NARROW_FEATURES` features,
    and every range of the parallel driver."""
    _rows(indptr, indices, weights, x, width, fastrand, agg, dinv, out, r0, 0)


#: rows narrower than this run a kernel compiled for their width (:func:`serial_kernel`)
NARROW_FEATURES = 8
_SERIAL: dict[int, Any] = {}


def serial_kernel(f: int) -> Any:
    """The serial kernel for rows of ``f`` features: compiled for exactly that width when ``0 < f <``
    :data:`NARROW_FEATURES`, else :func:`_kernel`, which reads it from the output. A narrow one is built on first
    use and cached on disk like the other kernels, under a name of its own (``serial_kernel_f3``, ...).

    Below one 32-byte vector of float32 every loop over a row's features runs a few iterations whose count LLVM
    does not know, and setting it up for each kept edge cost more than its work: on Cora, one thread, ns per output
    row, the generic kernel took 19.6 at F = 1 and 35.0 at F = 7 against MKL's 10.5 and 14.5 (2026-11-26). With
    the width a constant LLVM unrolls those loops: 1.05x-1.45x per call at F = 1 to 7 (most 1.15x-1.37x), the same
    bits (docs/BENCHMARKS.md, "a kernel per narrow width"). A narrow width costs one more compilation, about 4 s
    per width and signature the first time on a machine, so only the serial kernel has them; the parallel one,
    from :data:`PARALLEL_ROWS` rows, reads the width at run time."""
    if not 0 < f < NARROW_FEATURES:
        return _kernel
    k = _SERIAL.get(f)
    if k is None:
        fc = int(f)

        def serial(indptr, indices, weights, x, width, fastrand, agg, dinv, out, r0):  # pragma: no cover - compiled
            _rows(indptr, indices, weights, x, width, fastrand, agg, dinv, out, r0, fc)

        # a name per width, read by numba when it decorates: its cache index file and the compiled symbol's name
        # follow it. With one name for every width, the symbols differed only by a per-process counter, so two
        # processes that each compiled another width first could write the same symbol for two bodies, and a
        # process loading both would run one width's code for the other (numba/numba#10486); and the widths
        # shared one index file, written by concurrent compiles (--processes) without a lock
        serial.__name__ = serial.__qualname__ = f"serial_kernel_f{fc}"
        k = _SERIAL.setdefault(f, numba.njit(cache=True, nogil=True)(serial))
    return k


@numba.njit(cache=True, nogil=True, parallel=True)
def _kernel_parallel(indptr, indices, weights, x, width, fastrand, agg, dinv, out, chunk, threads):  # pragma: no cover
    """:func:`_kernel` over ranges of ``chunk`` rows, dealt out round-robin to ``threads`` threads (numba's
    OpenMP layer gives each ``prange`` iteration, here one per thread, to its own thread). Each range is
    the generic serial kernel :func:`_kernel`, the same function, on views of its rows (rows under
    :data:`NARROW_FEATURES` wide run another serial kernel, :func:`serial_kernel`, built from the same inlined
    :func:`_rows`); until 2026-11-26 the row loop was the
    ``prange`` body itself, and its speed moved with changes that the serial copy did not feel."""
    n = out.shape[0]
    ranges = (n + chunk - 1) // chunk
    for t in prange(threads):
        for c in range(t, ranges, threads):
            r0 = c * chunk
            r1 = min(n, r0 + chunk)
            _kernel(indptr[r0:r1 + 1], indices, weights, x, width, fastrand, agg, dinv, out[r0:r1], r0)


_parallel = _kernel_parallel


def runs_parallel(rows: int, edges: int, features: int) -> bool:
    """Whether a pass over ``rows`` output rows, ``edges`` edges (at most ``rows x S`` for a sampled pass) and
    ``features`` columns is worth a parallel region (:data:`PARALLEL_ROWS`, :data:`PARALLEL_WORK`)."""
    return rows >= PARALLEL_ROWS or edges * features >= PARALLEL_WORK


def sampled_spmm_cpu(
    graph: CSRGraph,
    x: torch.Tensor,
    width: int,
    strategy: str,
    aggregator: str,
    dinv: torch.Tensor | np.ndarray | None = None,
) -> torch.Tensor:
    """``A_S x`` for a CPU float32/float64 ``x`` ``[N, F]`` without autograd (arguments checked by the
    caller, :func:`kernels.spmm.sampled_spmm`; ``dinv`` = ``D^{-1/2}`` ``[N]`` for ``gcn``, a tensor or a
    NumPy array, used as it is when it has ``x``'s dtype)."""
    xn = (x if not x.requires_grad else x.detach()).contiguous().numpy()
    out = np.empty_like(xn)
    w = graph.weights if graph.weights is not None else _NO_W
    if dinv is None:
        d = _NO_D[xn.dtype.itemsize]
    elif isinstance(dinv, np.ndarray) and dinv.dtype == xn.dtype:
        d = dinv
    else:
        d = torch.as_tensor(dinv).detach().to(x.dtype).numpy()
    args = (graph.indptr, graph.indices, w, xn, int(width), strategy == "fastrand", _AGG_CODE[aggregator], d, out)
    n = graph.num_nodes
    edges = graph.num_edges if width <= 0 else min(graph.num_edges, n * int(width))  # a sampled pass keeps <= S a row
    if runs_parallel(n, edges, xn.shape[1]) and (threads := kernel_threads()) > 1:
        with numba_threads_set(threads):
            _parallel(*args, max(1, -(-n // (threads * CHUNKS_PER_THREAD))), threads)
    else:
        serial_kernel(xn.shape[1])(*args, 0)
    return torch.from_numpy(out)
