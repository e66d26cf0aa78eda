r"""Compiled inference of GCN / GraphSAGE stacks for small CPU batches: plain models on execution
plans, shaDow models on subgraph batches.

The torch forwards are the specifications: :meth:`models.base.PlainGNN.forward_plan` and
:meth:`models.shadow.ShadowGNN.forward_batch_projected`. Per layer they transform the input rows
(``T_1`` is the cached projection ``P``, ``T_l = H_{l-1} M_l^T`` after), aggregate with
:func:`kernels.sampled_spmm` and add the bias, with ReLUs between. On a one-node request that
is a dozen tensor operations per layer, each costing more than its arithmetic (a 2-layer GCN at
width 32 touches about a thousand rows of 64 floats; a shaDow subgraph, tens). Here the same
formulas run in one compiled call per batch:

* ``gcn``: :math:`h_i = \Big(\sum_{t < k_i} w_{e_t} g_{j_t} T_{j_t}\Big) s_i g_i + g_i^2 T_i + b`,
  :math:`g = D^{-1/2}` (plain: the full graph's GCN degrees; shaDow: the subgraph's own),
  :math:`s_i = d_i / k_i`;
* ``sage``: :math:`h_i = \frac{1}{k_i} \Big(\sum_{t < k_i} w_{e_t} T_{j_t, o:}\Big) + T_{i, :o} + b`
  (:math:`T = [h W_r^T \,|\, h W_n^T]`, ``o`` the output width; no neighbour term when
  :math:`k_i = 0`);

with the kept edges :math:`e_t` of :func:`kernels.spmm.sample_positions` at the sampling width
(a plan's layer graphs are already sampled: they run exact, their rows' :math:`d_i / k_i` given).
Then, plain: the logits are the last layer's target rows and the embedding is the ReLU of the
layer before; shaDow: ReLU after every layer, the readout (target row, then mean and/or max over
the subgraph's rows) and the classifier. Softmax and arg-max of the probabilities last. Layer 1
reads ``P`` through global ids (no gathered copy).

Results equal the torch forwards up to rounding: the aggregation-first order of a plan's later layers and
the softmax's ``exp`` differ from the torch operators' (tests compare them on random graphs). The dense
products are :func:`kernels.dense.rows_matmul_new`, as on the torch paths: each row's bits independent of the
batch, so a target gets the same answer alone and in any batch (docs/RELIABILITY.md, "Batch-invariant
answers"); until 2026-11-28 they were numba's ``np.dot`` (SciPy's OpenBLAS, whose blocking moved with the
batch). The loops run on the calling thread: meant for the small batches that run on the event loop
(:mod:`serve.batcher`), where the torch path's per-operation cost dominates, and for every other CPU batch
(a shaDow batch in chunks, :data:`serve.runtime.COMPILED_CHUNK_TARGETS`).
"""

# numba cache key: dense acc615418a54, lanes 4d5e0af8c182, plan e950ddb94c27, spmm_cpu c8e7f1d6109d, subgraph 47e999493df1

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from .dense import rows_matmul_new
from .lanes import LANE_BYTES, add4_lanes
from .plan import ExecutionPlan
from .spmm_cpu import walk_start, walk_step

__all__ = ["AGG_GCN", "AGG_SAGE", "POOL_CODES", "StackParams", "plan_forward_cpu", "plan_inner_cpu", "plan_outer_cpu",
           "shadow_forward_cpu"]

AGG_GCN = 0
AGG_SAGE = 1
#: shaDow readout parts after the target row
POOL_CODES = {"mean": 0, "max": 1}
_NO_W = np.zeros(0, dtype=np.float32)
_NO_I = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class StackParams:
    """A model's weights after the projection, packed for the compiled forwards.

    Attributes:
        agg: :data:`AGG_GCN` or :data:`AGG_SAGE`.
        dims: int64 ``[L, 3]``: per layer ``(in, T width, out)``; layer 1's ``in`` is unused.
        mats: float32, the matrices ``M_l^T`` ``[in_l, T width_l]`` of layers ``2 .. L``, flat.
        mat_off: int64 ``[L + 1]``: offset of layer ``l``'s matrix in ``mats`` (layer 1: none).
        bias: float32, the biases of layers ``1 .. L``, flat (zeros where a layer has none).
        bias_off: int64 ``[L + 1]``.
        pools: int64 codes of :data:`POOL_CODES` (shaDow readout; empty for plain models).
        cls_w: float32 ``W_c^T`` ``[(1 + n_pool) H, C]`` (shaDow classifier; empty for plain).
        cls_b: float32 ``[C]``.
    """

    agg: int
    dims: np.ndarray
    mats: np.ndarray
    mat_off: np.ndarray
    bias: np.ndarray
    bias_off: np.ndarray
    pools: np.ndarray = field(default_factory=lambda: _NO_I)
    cls_w: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    cls_b: np.ndarray = field(default_factory=lambda: _NO_W)

    @property
    def layers(self) -> int:
        return int(self.dims.shape[0])

    @classmethod
    def pack(cls, agg: int, transforms: list[np.ndarray], biases: list[np.ndarray | None], outs: list[int],
             pools: tuple[str, ...] | list[str] = (), classifier: tuple[np.ndarray, np.ndarray | None] | None = None) -> StackParams:
        """From per-layer transform matrices ``M_l`` ``[T width, in]`` (layer 1's unused: pass what
        the model has), biases ``[out]`` (or ``None``), output widths, and for shaDow the readout
        pools and the classifier ``(W_c [C, (1 + n_pool) H], b_c)``."""
        layers = len(outs)
        if len(transforms) != layers or len(biases) != layers or layers < 1:
            raise ValueError("one transform, bias and output width per layer")
        dims = np.zeros((layers, 3), dtype=np.int64)
        mats, mat_off = [], np.zeros(layers + 1, dtype=np.int64)
        bias, bias_off = [], np.zeros(layers + 1, dtype=np.int64)
        for i, (m, b, o) in enumerate(zip(transforms, biases, outs, strict=True)):
            tw, fin = m.shape
            if tw != (o if agg == AGG_GCN else 2 * o):
                raise ValueError(f"layer {i + 1}: transform of {tw} rows for output width {o}")
            dims[i] = (fin, tw, o)
            mt = np.ascontiguousarray(m.T, dtype=np.float32) if i > 0 else np.zeros(0, np.float32)
            mats.append(mt.reshape(-1))
            mat_off[i + 1] = mat_off[i] + mt.size
            bias.append(np.zeros(o, np.float32) if b is None else np.asarray(b, np.float32).reshape(o))
            bias_off[i + 1] = bias_off[i] + o
        extra = {}
        if classifier is not None:
            w, b = classifier
            if w.shape[1] != outs[-1] * (1 + len(pools)):
                raise ValueError(f"classifier takes {w.shape[1]} inputs, the readout has {outs[-1] * (1 + len(pools))}")
            extra = {"pools": np.array([POOL_CODES[p] for p in pools], dtype=np.int64),
                     "cls_w": np.ascontiguousarray(w.T, dtype=np.float32),
                     "cls_b": np.zeros(w.shape[0], np.float32) if b is None else np.asarray(b, np.float32)}
        return cls(agg, dims, np.concatenate(mats), mat_off, np.concatenate(bias), bias_off, **extra)


@numba.njit(cache=True, nogil=True, inline="always")
def _add_kept(acc, n, src, rows, c0, a, cols, ew, has_w, dl, gcn, w, k):  # pragma: no cover - compiled
    """``acc[c] += sum_t coef_t src[rows[j_t], c0 + c]`` for ``c < n`` over the ``k`` kept edges of the
    walk ``w`` (:func:`~kernels.spmm_cpu.walk_start`) of the row starting at edge ``a``; ``coef_t`` is the
    edge's weight (1 without weights), times ``dl[j_t]`` for ``gcn``. Four edges per pass over ``acc``,
    as :func:`kernels.spmm_cpu._kernel` sums them: the output row is read and written once per four
    source rows instead of once per row (numba cannot tell that ``acc`` and ``src`` do not overlap,
    so every pass loads and stores it). The source rows are sliced views: indexed ``src[., c0 + c]``
    the loop was not vectorised (the bias loops of :func:`_aggregate` were not, with ``bias[b0 + c]``).
    The four rows sum in :func:`~kernels.lanes.add4_lanes` vectors (the same bits; 2026-11-26 on shaDow-GCN's
    batch: 1.14x-1.31x at 16 features, 1.04x-1.11x at 64 and 128, 1.00x at 256; a loop from a variable
    start, which a row-width rule took for wide rows, ran 0.24x-0.34x at 128 and 256, so every width
    takes the vectors).

    The kernel keeps its own copy of this loop (its group sum :func:`~kernels.lanes.add4_rows`, which leaves
    rows of 128 features or more to LLVM's loop: measured there against the kernel's own plain loop, not
    here), and this one its shape, on measurements (2026-11-26, serial
    kernel in 25 interleaved rounds, where the same code twice gave 0.99x-1.03x): the kernel through a
    function like this one ran 0.96x-0.97x at up to 64 features, 0.47x-0.99x with two calls fixing the
    coefficient rule; here, two calls (GCN, and GraphSAGE on a ``src[:, o:]`` view instead of ``c0``)
    made the aggregation 0.35x-0.98x of this form."""
    one = np.float32(1.0)
    lw = LANE_BYTES // 4  # float32 rows (_check_table); a constant: from src.itemsize, read at run time, 0.34x-0.70x
    t = 0
    while t + 4 <= k:
        p0, w = walk_step(w)
        p1, w = walk_step(w)
        p2, w = walk_step(w)
        p3, w = walk_step(w)
        e0 = a + p0
        e1 = a + p1
        e2 = a + p2
        e3 = a + p3
        j0 = cols[e0]
        j1 = cols[e1]
        j2 = cols[e2]
        j3 = cols[e3]
        k0 = ew[e0] if has_w else one
        k1 = ew[e1] if has_w else one
        k2 = ew[e2] if has_w else one
        k3 = ew[e3] if has_w else one
        if gcn:
            k0 *= dl[j0]
            k1 *= dl[j1]
            k2 *= dl[j2]
            k3 *= dl[j3]
        x0 = src[rows[j0], c0:c0 + n]
        x1 = src[rows[j1], c0:c0 + n]
        x2 = src[rows[j2], c0:c0 + n]
        x3 = src[rows[j3], c0:c0 + n]
        c = 0
        while c + lw <= n:
            add4_lanes(acc, x0, x1, x2, x3, c, k0, k1, k2, k3)
            c += lw
        for cc in range(c, n):  # the last n mod lw columns
            acc[cc] += (k0 * x0[cc] + k1 * x1[cc]) + (k2 * x2[cc] + k3 * x3[cc])
        t += 4
    while t < k:
        p0, w = walk_step(w)
        e0 = a + p0
        j0 = cols[e0]
        k0 = ew[e0] if has_w else one
        if gcn:
            k0 *= dl[j0]
        x0 = src[rows[j0], c0:c0 + n]
        for c in range(n):
            acc[c] += k0 * x0[c]
        t += 1


@numba.njit(cache=True, nogil=True)
def _aggregate(src, rows, n_out, o, ptr, cols, ew, rs, width, fastrand, agg, dl, bias, b0,
               out):  # pragma: no cover - compiled
    """Rows ``0 .. n_out - 1`` of one layer into ``out`` from transformed rows ``src[rows[j]]``;
    ``rs``: each row's ``d_i / k_i`` when the graph is already sampled (``width`` 0), else empty."""
    has_w = ew.shape[0] > 0
    given_scale = rs.shape[0] > 0
    bv = bias[b0:b0 + o]  # a view: with ``bias[b0 + c]`` in the loops below they were not vectorised
    for i in range(n_out):
        acc = out[i]
        for c in range(o):
            acc[c] = 0.0
        a = ptr[i]
        d = ptr[i + 1] - a
        k = d if width <= 0 or d <= width else width
        xi = src[rows[i]]
        w = walk_start(fastrand, width, d, k)
        _add_kept(acc, o, src, rows, 0 if agg == AGG_GCN else o, a, cols, ew, has_w, dl, agg == AGG_GCN, w, k)
        if agg == AGG_GCN:
            di = dl[i]
            scale = (rs[i] if given_scale else np.float32(d / max(k, 1))) * di
            self_w = di * di
            for c in range(o):
                acc[c] = acc[c] * scale + self_w * xi[c] + bv[c]
        else:
            if k > 0:
                inv = np.float32(1.0) / np.float32(k)
                for c in range(o):
                    acc[c] = acc[c] * inv + xi[c] + bv[c]
            else:
                for c in range(o):
                    acc[c] = xi[c] + bv[c]


@numba.njit(cache=True, nogil=True)
def _aggregate_first(src, rows, n_out, ptr, cols, ew, rs, width, fastrand, agg, dl, m, o, bias,
                     b0):  # pragma: no cover - compiled
    """Rows ``0 .. n_out - 1`` of a layer after the first from its input rows ``src[rows[j]]`` (not yet
    transformed): the kept rows are summed ``fin`` wide first, then one product per output row (gcn:
    ``z M``; sage: ``x_i M_r + z M_n``). The same numbers as transforming every input row and then
    :func:`_aggregate` (the layer is linear), with ``n_out x fin x tw`` instead of ``n_in x fin x tw``
    multiplications: an execution plan's layer has ``n_in = n_out (1 + S)`` at most. Returns the output
    rows and the input rows of the outputs themselves (``[n_out, fin]``, gathered)."""
    fin = src.shape[1]
    has_w = ew.shape[0] > 0
    given_scale = rs.shape[0] > 0
    xt = np.empty((n_out, fin), dtype=np.float32)
    z = np.zeros((n_out, fin), dtype=np.float32)  # gcn: the normalised sum with the self term; sage: the mean
    for i in range(n_out):
        xi = src[rows[i]]
        xr = xt[i]
        for c in range(fin):  # not xt[i] = xi: subgraph.copy_run says why
            xr[c] = xi[c]
        acc = z[i]
        a = ptr[i]
        d = ptr[i + 1] - a
        k = d if width <= 0 or d <= width else width
        w = walk_start(fastrand, width, d, k)
        _add_kept(acc, fin, src, rows, 0, a, cols, ew, has_w, dl, agg == AGG_GCN, w, k)
        if agg == AGG_GCN:
            di = dl[i]
            scale = (rs[i] if given_scale else np.float32(d / max(k, 1))) * di
            self_w = di * di
            for c in range(fin):
                acc[c] = acc[c] * scale + self_w * xi[c]
        elif k > 0:
            inv = np.float32(1.0) / np.float32(k)
            for c in range(fin):
                acc[c] *= inv
    if agg == AGG_GCN:
        out = rows_matmul_new(z, m)
    else:  # [x W_r^T | x W_n^T]: the root half of the row itself, the neighbour half of the mean
        out = rows_matmul_new(xt, m[:, :o].copy()) + rows_matmul_new(z, m[:, o:].copy())
    bv = bias[b0:b0 + o]
    for i in range(n_out):
        row = out[i]
        for c in range(o):
            row[c] += bv[c]
    return out, xt


@numba.njit(cache=True, nogil=True)
def _relu(h):  # pragma: no cover - compiled
    for i in range(h.shape[0]):
        for c in range(h.shape[1]):
            if h[i, c] < 0:
                h[i, c] = 0.0


@numba.njit(cache=True, nogil=True)
def _layers(sizes, ptr, cols, ew, rs, width, fastrand, node_ids, table, agg, dl, dims, mats, mat_off, bias,
            bias_off, relu_last, keep):  # pragma: no cover - compiled
    """Every layer; returns the last layer's rows and the ReLU'd rows ``0 .. keep - 1`` of the one
    before (the plain models' embedding). A layer whose output has fewer rows than its input (an
    execution plan's) aggregates before transforming (:func:`_aggregate_first`); a square one (a shaDow
    subgraph batch, where both orders cost the same) transforms first."""
    layers = dims.shape[0]
    ident = np.arange(sizes[0])
    prev = np.zeros((keep, dims[0, 2]), dtype=np.float32)
    h = np.empty((sizes[1], dims[0, 2]), dtype=np.float32)
    _aggregate(table, node_ids, sizes[1], dims[0, 2], ptr, cols, ew, rs, width, fastrand, agg, dl, bias,
               bias_off[0], h)
    for layer in range(1, layers):
        _relu(h)
        prev = h[:keep].copy()
        fin, tw, o = dims[layer, 0], dims[layer, 1], dims[layer, 2]
        m = mats[mat_off[layer]:mat_off[layer] + fin * tw].reshape((fin, tw))
        if sizes[layer + 1] < sizes[layer]:
            h, _ = _aggregate_first(h, ident, sizes[layer + 1], ptr, cols, ew, rs, width, fastrand, agg, dl, m, o,
                                    bias, bias_off[layer])
        else:
            t = rows_matmul_new(h, m)
            h = np.empty((sizes[layer + 1], o), dtype=np.float32)
            _aggregate(t, ident, sizes[layer + 1], o, ptr, cols, ew, rs, width, fastrand, agg, dl, bias,
                       bias_off[layer], h)
    if relu_last:
        _relu(h)
    return h, prev


@numba.njit(cache=True, nogil=True)
def _softmax(logits):  # pragma: no cover - compiled
    """Row-wise softmax and the arg-max of the probabilities (the first of equal ones)."""
    b, c = logits.shape
    probs = np.empty((b, c), dtype=np.float32)
    labels = np.empty(b, dtype=np.int64)
    for i in range(b):
        mx = logits[i, 0]
        for k in range(1, c):
            mx = max(mx, logits[i, k])
        s = np.float32(0.0)
        for k in range(c):
            probs[i, k] = np.exp(logits[i, k] - mx)
            s += probs[i, k]
        best = 0
        for k in range(c):
            probs[i, k] /= s
            if probs[i, k] > probs[i, best]:
                best = k
        labels[i] = best
    return probs, labels


@numba.njit(cache=True, nogil=True, inline="always")
def _exact():  # pragma: no cover - compiled
    """A plan's layers run exact: width 0 and no fastrand walk, typed ``int64`` and ``bool`` rather than as
    the literals ``0`` and ``False``. numba compiles a callee once per argument types and a literal is a
    type of its own: with literals here, :func:`_layers`, :func:`_aggregate` and :func:`_aggregate_first`
    compiled once for the plain models and again for :func:`_shadow` (which passes its width at run time),
    about 20 s of a first start (2026-11-27)."""
    return np.int64(0), np.bool_(False)


@numba.njit(cache=True, nogil=True)
def _plain(sizes, ptr, cols, ew, rs, node_ids, table, agg, dinv_g, dims, mats, mat_off, bias,
           bias_off):  # pragma: no cover - compiled
    n0 = sizes[0]
    dl = np.empty(n0 if agg == AGG_GCN else 0, dtype=np.float32)
    for j in range(dl.shape[0]):
        dl[j] = dinv_g[node_ids[j]]
    b = sizes[sizes.shape[0] - 1]
    exact, no_walk = _exact()
    # relu_last and keep as run-time values, as _inner passes them: the literals False / True and 0 were
    # argument types of their own and compiled _layers a second time (2-3 s of a first start)
    h, emb = _layers(sizes, ptr, cols, ew, rs, exact, no_walk, node_ids, table, agg, dl, dims, mats, mat_off, bias,
                     bias_off, np.bool_(False), b)
    logits = h[:b].copy()
    probs, labels = _softmax(logits)
    return logits, probs, labels, emb


@numba.njit(cache=True, nogil=True)
def _inner(sizes, ptr, cols, ew, rs, node_ids, table, agg, dinv_g, dims, mats, mat_off, bias,
           bias_off):  # pragma: no cover - compiled
    """Layers ``1 .. len(dims)`` of a plain model on a plan of as many layers: the last one's target
    rows, ReLU'd (what the next layer of the model reads)."""
    n0 = sizes[0]
    dl = np.empty(n0 if agg == AGG_GCN else 0, dtype=np.float32)
    for j in range(dl.shape[0]):
        dl[j] = dinv_g[node_ids[j]]
    exact, no_walk = _exact()
    h, _ = _layers(sizes, ptr, cols, ew, rs, exact, no_walk, node_ids, table, agg, dl, dims, mats, mat_off, bias,
                   bias_off, np.bool_(True), np.int64(0))  # ReLU'd last layer, no rows kept (typed: see _plain)
    return h


@numba.njit(cache=True, nogil=True)
def _outer(sizes, ptr, cols, ew, rs, node_ids, acts, agg, dinv_g, fin, tw, o, mat,
           bias):  # pragma: no cover - compiled
    """The last layer of a plain model on a one-layer plan, from the layer before's activations
    ``acts`` (by global id): aggregated first, then transformed once per target
    (:func:`_aggregate_first`; the plan's ``B (1 + S)`` input rows are never transformed one by one),
    softmax."""
    n0 = sizes[0]
    dl = np.empty(n0 if agg == AGG_GCN else 0, dtype=np.float32)
    for j in range(dl.shape[0]):
        dl[j] = dinv_g[node_ids[j]]
    exact, no_walk = _exact()
    # the bias offset typed int64 as _layers passes it (a literal 0 compiled _aggregate_first again, 5-7 s)
    h, xt = _aggregate_first(acts, node_ids, sizes[1], ptr, cols, ew, rs, exact, no_walk, agg, dl, mat.reshape((fin, tw)),
                             o, bias, np.int64(0))
    probs, labels = _softmax(h)
    return h, probs, labels, xt


@numba.njit(cache=True, nogil=True)
def _shadow(indptr, indices, ew, width, fastrand, node_ids, bptr, table, agg, dims, mats, mat_off, bias, bias_off,
            pools, cls_w, cls_b):  # pragma: no cover - compiled
    r = node_ids.shape[0]
    has_w = ew.shape[0] > 0
    dl = np.empty(r if agg == AGG_GCN else 0, dtype=np.float32)
    for i in range(dl.shape[0]):  # GCN degrees inside the subgraphs: 1 + the row's weight sum
        dh = 1.0
        for e in range(indptr[i], indptr[i + 1]):
            dh += ew[e] if has_w else 1.0
        dl[i] = np.float32(max(dh, 1e-12) ** -0.5)
    sizes = np.full(dims.shape[0] + 1, r, dtype=np.int64)
    # no row scales: an empty local array, not the module's _NO_W (numba types a global array as a read-only
    # constant, and _layers and its callees then compiled a second time apart from the plain models' build)
    no_rs = np.empty(0, dtype=np.float32)
    h, _ = _layers(sizes, indptr, indices, ew, no_rs, width, fastrand, node_ids, table, agg, dl, dims, mats,
                   mat_off, bias, bias_off, np.bool_(True), np.int64(0))
    nb = bptr.shape[0] - 1
    hd = h.shape[1]
    emb = np.zeros((nb, hd * (1 + pools.shape[0])), dtype=np.float32)
    for s in range(nb):
        lo, hi = bptr[s], bptr[s + 1]
        target = emb[s, :hd]
        for c in range(hd):
            target[c] = h[lo, c]  # the target is its subgraph's first row
        for p in range(pools.shape[0]):
            if hi == lo:
                continue
            e = emb[s, hd * (1 + p):hd * (2 + p)]  # views, as in _add_kept
            if pools[p] == 0:
                for u in range(lo, hi):
                    hu = h[u]
                    for c in range(hd):
                        e[c] += hu[c]
                inv = np.float32(1.0) / np.float32(hi - lo)
                for c in range(hd):
                    e[c] *= inv
            else:
                for c in range(hd):
                    e[c] = h[lo, c]
                for u in range(lo + 1, hi):
                    hu = h[u]
                    for c in range(hd):
                        if hu[c] > e[c]:
                            e[c] = hu[c]
    logits = rows_matmul_new(emb, cls_w)
    for s in range(nb):
        for c in range(logits.shape[1]):
            logits[s, c] += cls_b[c]
    probs, labels = _softmax(logits)
    return logits, probs, labels, emb


def _check_table(table: np.ndarray, width: int) -> None:
    if table.dtype != np.float32 or table.ndim != 2 or table.shape[1] != width:
        raise ValueError(f"table must be float32 [N, {width}], got {table.dtype} {table.shape}")
    if not table.flags.c_contiguous:  # the rows are summed in vectors (kernels.lanes)
        raise ValueError("table must be C-contiguous (np.ascontiguousarray)")


def plan_forward_cpu(plan: ExecutionPlan, params: StackParams, table: np.ndarray,
                     dinv: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A plain model on a plan: ``(logits [B, C], probabilities [B, C], labels [B], embeddings [B, H])``.

    ``table``: float32 ``[N, P]`` projections indexed by global id, valid at ``plan.node_ids``;
    ``dinv``: float32 ``[N]`` ``D^{-1/2}`` of the full graph's GCN degrees (``gcn`` only).
    """
    args = _plan_args(plan, params, params.layers, table, int(params.dims[0, 1]), dinv)
    return _plain(*args, params.dims, params.mats, params.mat_off, params.bias, params.bias_off)


def _plan_args(plan: ExecutionPlan, params: StackParams, layers: int, table: np.ndarray, width: int,
               dinv: np.ndarray | None) -> tuple:
    if plan.layers != layers:
        raise ValueError(f"the plan has {plan.layers} layers, expected {layers}")
    _check_table(table, width)
    if params.agg == AGG_GCN and (dinv is None or dinv.dtype != np.float32):
        raise ValueError("gcn needs dinv, float32 [N]")
    ew = plan.edge_weights if plan.edge_weights is not None else _NO_W
    return (np.asarray(plan.sizes, dtype=np.int64), plan.indptr, plan.cols, ew.astype(np.float32, copy=False),
            plan.row_scale, plan.node_ids, table, params.agg, dinv if dinv is not None else _NO_W)


def plan_inner_cpu(plan: ExecutionPlan, params: StackParams, table: np.ndarray,
                   dinv: np.ndarray | None) -> np.ndarray:
    """float32 ``[B, H]``: a plain model's ReLU'd layer ``L - 1`` at the targets of ``plan``, an
    ``L - 1``-layer plan (``table`` and ``dinv`` as in :func:`plan_forward_cpu`). Each row depends
    on its node and the width only, which is what lets a server keep it (``serve.projection.ActivationCache``)."""
    if params.layers < 2:
        raise ValueError("a one-layer model has no inner layers")
    args = _plan_args(plan, params, params.layers - 1, table, int(params.dims[0, 1]), dinv)
    return _inner(*args, params.dims[:-1], params.mats, params.mat_off, params.bias, params.bias_off)


def plan_outer_cpu(plan: ExecutionPlan, params: StackParams, acts: np.ndarray,
                   dinv: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A plain model's last layer on a one-layer ``plan`` from ``acts``, float32 ``[N, H]`` by global
    id holding :func:`plan_inner_cpu`'s rows at ``plan.node_ids`` for the plan's width: the same
    ``(logits, probabilities, labels, embeddings)`` as :func:`plan_forward_cpu` on the full plan."""
    if params.layers < 2:
        raise ValueError("a one-layer model has no inner layers")
    last = params.layers - 1
    fin, tw, o = (int(v) for v in params.dims[last])
    args = _plan_args(plan, params, 1, acts, fin, dinv)
    mat = params.mats[params.mat_off[last]:params.mat_off[last + 1]]
    bias = params.bias[params.bias_off[last]:params.bias_off[last + 1]]
    return _outer(*args, fin, tw, o, mat, bias)


def shadow_forward_cpu(batch, params: StackParams, table: np.ndarray, width: int | None,
                       strategy: str = "fastrand", rows: np.ndarray | None = None,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A shaDow model on a :class:`~kernels.subgraph.SubgraphBatch` at sampling ``width``:
    ``(logits [B, C], probabilities [B, C], labels [B], readout embeddings [B, (1 + n_pool) H])``.

    ``table``: float32 ``[N, P]`` projections by global id, valid at ``batch.node_ids`` (no virtual ids); or,
    with ``rows`` (int64, one per batch row), any table whose row ``rows[i]`` is batch row ``i``'s projection
    (a batch with new nodes: the projections of ``batch.unique_ids``, ``rows = batch.row_to_unique``).
    """
    if params.cls_w.shape[0] == 0:
        raise ValueError("these parameters have no readout and classifier (a plain model's)")
    _check_table(table, int(params.dims[0, 1]))
    g = batch.graph
    ew = g.weights if g.weights is not None else _NO_W
    ids = batch.node_ids if rows is None else np.asarray(rows, dtype=np.int64)
    if len(ids) != len(batch.node_ids) or (len(ids) and (ids.min() < 0 or ids.max() >= table.shape[0])):
        raise ValueError(f"rows: one table row per batch row, within the table's {table.shape[0]} rows")
    return _shadow(g.indptr, g.indices, ew.astype(np.float32, copy=False), int(width or 0), strategy == "fastrand",
                   ids, np.asarray(batch.ptr, dtype=np.int64), table, params.agg, params.dims,
                   params.mats, params.mat_off, params.bias, params.bias_off, params.pools, params.cls_w,
                   params.cls_b)
