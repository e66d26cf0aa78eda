r"""The PPR push (Andersen, Chung and Lang): :class:`PPRConfig`, the compiled kernels, and the
Python entry points :func:`ppr_topk`, :func:`ppr_new_node` and :func:`ppr_exact`.

The convention (``alpha`` = teleport probability, plain or lazy walk), the push, the score
``p + alpha r`` and its error bound ``eps * w(v)`` are stated in :mod:`kernels.ppr`, the module
users import (it re-exports these names). Here:

* :func:`ppr_topk`: one compiled parallel loop (:func:`_ppr_batch`, numba ``prange`` over worker
  threads) over the targets, each pushed on per-thread dense scratch (:class:`_DenseScratch`,
  pooled per graph and ``eps`` by :func:`_take_dense` / :func:`_give_dense`) by
  :func:`_push_dense`, then an O(T log K) heap selection (:func:`_select_topk`).
* :func:`ppr_new_node`: the push from a virtual node ``N`` with sparse state (:func:`_ppr_virtual`).
* :func:`ppr_exact`: power iteration, the reference of the tests and benchmarks.

The on-disk index of every node's list is :mod:`kernels.ppr_index`.
"""

# numba cache key: subgraph 47e999493df1

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numba
import numpy as np
from numba import prange

from .graph import CSRGraph, index_dtype_for
from .subgraph import _find, _grow, _hash_slot, _position, copy_run
from .threads import numba_threads

__all__ = ["PPRConfig", "ppr_exact", "ppr_new_node", "ppr_new_nodes", "ppr_topk"]

log = logging.getLogger(__name__)

_ALGO_VERSION = 1  # part of the index key: bump when the push or the selection changes
_SCRATCH_KEY = "_ppr_scratch_pool"
_SCRATCH_LOCK = threading.Lock()


# ============================================================================ configuration
@dataclass(frozen=True)
class PPRConfig:
    """Parameters of the push and of the top-K lists (see the :mod:`kernels.ppr` docstring).

    Attributes:
        alpha: teleport probability in (0, 1) (PyG convention; shaDow-GNN's config writes 1 - alpha).
        eps: push threshold: push ``u`` while ``r(u) >= eps * w(u)``.
        topk: K, the list length counting the target (the index stores at most K per node).
        threshold: relative score threshold in [0, 1]: drop ``v`` with
            ``score(v) < threshold * score(target)``.
        lazy: lazy walk (half the residue stays): teleport ``alpha`` then behaves like a plain walk
            with teleport ``2 alpha / (1 + alpha)``.
    """

    alpha: float = 0.15
    eps: float = 1e-5
    topk: int = 200
    threshold: float = 0.0
    lazy: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < float(self.alpha) < 1.0:
            raise ValueError(f"alpha (teleport probability) must lie in (0, 1), got {self.alpha}")
        if not float(self.eps) > 0.0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if isinstance(self.topk, bool) or int(self.topk) != self.topk or self.topk < 1:
            raise ValueError(f"topk must be a positive integer, got {self.topk}")
        if not 0.0 <= float(self.threshold) <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {self.threshold}")
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "eps", float(self.eps))
        object.__setattr__(self, "topk", int(self.topk))
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "lazy", bool(self.lazy))

    @property
    def teleport(self) -> float:
        """Teleport probability of the equivalent non-lazy walk (``alpha``, or ``2a/(1+a)`` if lazy)."""
        return 2 * self.alpha / (1 + self.alpha) if self.lazy else self.alpha

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PPRConfig:
        return cls(**{k: d[k] for k in ("alpha", "eps", "topk", "threshold", "lazy") if k in d})

    def key(self) -> str:
        """Short stable hash of the parameters and the algorithm version (index file names)."""
        canon = json.dumps({**self.to_dict(), "v": _ALGO_VERSION}, sort_keys=True)
        return hashlib.blake2b(canon.encode(), digest_size=6).hexdigest()


# ============================================================================ per-graph helpers
def _weighted_degree(graph: CSRGraph) -> np.ndarray:
    """``w(v) = sum_u w(v, u)``, float64 ``[N]`` (memoized on the graph); checks weights >= 0."""
    wd = graph.cache().get("_ppr_wdeg")
    if wd is None:
        if graph.weights is None:
            wd = graph.degrees.astype(np.float64)
        else:
            if graph.num_edges and float(graph.weights.min()) < 0:
                raise ValueError("PPR needs non-negative edge weights")
            wd = _row_sums(graph.indptr, graph.weights)
        graph.cache()["_ppr_wdeg"] = wd
    return wd


@numba.njit(cache=True, nogil=True)
def _row_sums(indptr, weights):  # pragma: no cover - compiled
    """Each row's weight sum in float64, added in the row's order: the bits of ``np.bincount(rows, weights)`` (the
    graph loader's degree chunks, ``models.base.full_gcn_degrees``) and of a replica's sum of one row
    (``serve.graph.store._weight_sum``). A difference of one running sum over all edges (what this was) loses
    every weight below the running total's last bit: after an edge of weight 1e15, up to 6.6% of a degree."""
    n = indptr.shape[0] - 1
    out = np.zeros(n, dtype=np.float64)
    for v in range(n):
        s = 0.0
        for e in range(indptr[v], indptr[v + 1]):
            s += np.float64(weights[e])
        out[v] = s
    return out


_NO_F32 = np.zeros(0, dtype=np.float32)
_TINY = 1e-300  # the residue a pushed node keeps in the dense push (r == 0 means "never touched")


class _DenseScratch:
    """Per-thread dense state for ``T`` workers on a graph of ``N`` nodes (zero residues between targets).

    ``rw[t, v] = (r(v), eps * w(v))`` interleaved (the push threshold of ``v``: ``eps`` where
    ``w(v) = 0``), so one edge update reads one cache line; ``p[t, v]``, FIFO ring ``queue[t]``
    (N + 1 slots), ``touched[t]`` node list and ``cand[t]`` candidate scores. Built for one ``eps``.
    ``capacity`` (at least N) sizes every array for that many nodes, the spare ones at threshold ``eps``:
    a live graph's new nodes then reuse it (:meth:`kernels.ppr_live.LivePPRIndex.prepare` sets their
    thresholds) instead of allocating all of it again per new node.
    """

    def __init__(self, wdeg: np.ndarray, threads: int, eps: float, capacity: int = 0) -> None:
        n = len(wdeg)
        cap = max(n, int(capacity))
        self.threads = threads
        self.eps = eps
        self.rw = np.zeros((threads, cap, 2), dtype=np.float64)
        self.rw[:, :n, 1] = np.where(wdeg > 0, eps * wdeg, eps)
        self.rw[:, n:, 1] = eps
        self.p = np.zeros((threads, cap), dtype=np.float64)
        idt = index_dtype_for(cap + 1)
        self.queue = np.zeros((threads, cap + 1), dtype=idt)
        self.touched = np.zeros((threads, cap + 1), dtype=idt)  # + 1: the push writes one slot past its count
        self.cand = np.zeros((threads, cap), dtype=np.float64)

    @property
    def capacity(self) -> int:
        return self.rw.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.rw, self.p, self.queue, self.touched, self.cand))


#: the most nodes a new node's push (:func:`ppr_new_node`) gives dense state of its own (40 bytes a node); on a
#: larger graph it pushes on sparse state (unless such a scratch with room is pooled)
DENSE_NEW_NODE_MAX = 1 << 22
#: what the one-worker scratches of :func:`ppr_new_nodes`' parallel workers may hold beyond the first worker's, per
#: graph (40 bytes a node each: on a 2 M-node graph three more workers, on 10 M none)
NEW_NODE_PARALLEL_BYTES = 256 << 20


def _take_dense(graph: CSRGraph, threads: int, eps: float, capacity: int = 0) -> _DenseScratch | None:
    """A scratch of the graph's pool for ``threads`` workers and ``eps`` (with room for ``capacity`` nodes), or a new
    one. With ``capacity`` past :data:`DENSE_NEW_NODE_MAX` and none pooled: None. (A new node's push never takes a
    live index's scratch of several workers: held across an update, it would not move to the new graph.)"""
    with _SCRATCH_LOCK:
        pool = graph.cache().setdefault(_SCRATCH_KEY, [])
        for i, sc in enumerate(pool):
            if sc.eps == eps and sc.threads == threads and sc.capacity >= capacity:
                return pool.pop(i)
    if capacity > DENSE_NEW_NODE_MAX:
        return None
    return _DenseScratch(_weighted_degree(graph), threads, eps, capacity)


def _give_dense(graph: CSRGraph, sc: _DenseScratch, keep: int = 2) -> None:
    """Put ``sc`` back into the graph's pool, which keeps ``keep`` scratches at most of its number of workers (2;
    :func:`ppr_new_nodes` keeps one-worker scratches for each of its workers): the one-worker scratches of new
    nodes never crowd out a batch push's."""
    with _SCRATCH_LOCK:
        pool = graph.cache().setdefault(_SCRATCH_KEY, [])
        if sum(x.threads == sc.threads for x in pool) < keep:
            pool.append(sc)


# ============================================================================ compiled kernels
@numba.njit(cache=True, nogil=True)
def _better(s1, v1, s2, v2):  # pragma: no cover - compiled
    return s1 > s2 or (s1 == s2 and v1 < v2)


@numba.njit(cache=True, nogil=True)
def _select_topk(
    cand_ids, cand_scores, nc, src, src_score, k, cut, out_nodes, out_scores
):  # pragma: no cover
    """``[src] +`` the best ``k - 1`` candidates (score > 0, >= cut, not src), best first.

    The output rows double as a min-heap of the kept candidates (root = worst kept), then a
    heapsort puts them in decreasing order. Returns the list length.
    """
    out_nodes[0] = src
    out_scores[0] = src_score
    m = k - 1
    hs = 0
    hn = out_nodes[1:]
    hv = out_scores[1:]
    for i in range(nc):
        v = cand_ids[i]
        s = cand_scores[i]
        if v == src or s <= 0.0 or s < cut:
            continue
        if hs < m:
            j = hs
            hs += 1
            while j > 0:
                par = (j - 1) >> 1
                if _better(hv[par], hn[par], s, v):
                    hn[j] = hn[par]
                    hv[j] = hv[par]
                    j = par
                else:
                    break
            hn[j] = v
            hv[j] = s
        elif m > 0 and _better(s, v, hv[0], hn[0]):
            j = 0
            while True:
                c = 2 * j + 1
                if c >= hs:
                    break
                if c + 1 < hs and _better(hv[c], hn[c], hv[c + 1], hn[c + 1]):
                    c += 1
                if _better(s, v, hv[c], hn[c]):
                    hn[j] = hn[c]
                    hv[j] = hv[c]
                    j = c
                else:
                    break
            hn[j] = v
            hv[j] = s
    # heapsort: move the worst to the back repeatedly -> best first
    end = hs
    while end > 1:
        end -= 1
        tv = hn[end]
        ts = hv[end]
        hn[end] = hn[0]
        hv[end] = hv[0]
        j = 0
        while True:
            c = 2 * j + 1
            if c >= end:
                break
            if c + 1 < end and _better(hv[c], hn[c], hv[c + 1], hn[c + 1]):
                c += 1
            if _better(ts, tv, hv[c], hn[c]):
                hn[j] = hn[c]
                hv[j] = hv[c]
                j = c
            else:
                break
        hn[j] = tv
        hv[j] = ts
    return 1 + hs


@numba.njit(cache=True, nogil=True, inline="always")
def _spread(rw, touched, queue, v, add, nt, tail, qlen, qcap):  # pragma: no cover - compiled
    """One edge of a push: ``add`` onto ``v``'s residue, ``v`` listed as touched and queued where the residue
    crossed its threshold, without a data-dependent branch (see :func:`_push_dense`); the new counts."""
    old = rw[v, 0]
    new = old + add
    rw[v, 0] = new
    touched[nt] = v
    nt += (old == 0.0) & (new != 0.0)  # an edge of weight 0 leaves v untouched: listed once at most
    thr = rw[v, 1]
    hit = (old < thr) & (new >= thr)
    queue[tail] = v
    tail += hit
    qlen += hit
    if tail == qcap:
        tail = 0
    return nt, tail, qlen


@numba.njit(cache=True, nogil=True)
def _push_dense(
    indptr, indices, weights, wdeg, src, alpha, lazy, max_pushes, rw, p, queue, touched, nb, nbw, w_self
):  # pragma: no cover
    """ACL push from ``src`` on dense per-thread state; returns ``(touched nodes, pushes)``.

    ``rw[v] = (r(v), threshold(v))``, ``p[v]``: all residues and estimates are zero on entry except
    those this call sets; ``touched[:T]`` lists every node with ``r > 0`` or ``p > 0`` on return.

    The edge loop has no data-dependent branch (it was the cost: 1.9x to 2.0x faster, identical
    lists and scores): a pushed node keeps the residue ``_TINY`` instead of 0, so ``r(v) == 0``
    means exactly "never touched" and needs no look at ``p``; the touched list and the queue
    are written unconditionally and their lengths advance by the conditions (a node reached only
    along edges of weight 0 keeps ``r == 0``: not touched, however often reached; counting it at each
    reach overran ``touched``, QA 2026-11-27). ``_TINY`` (1e-300)
    is below every threshold and vanishes in ``p + alpha r``; the caller resets touched residues
    to 0.

    With ``nb`` (sorted distinct existing ids, edge weights ``nbw``) the push runs on the graph plus the virtual
    node ``N = len(indptr) - 1`` linked both ways to ``nb``, of weighted degree ``w_self`` (the steps and
    arithmetic of :func:`_ppr_virtual`): ``src`` is then ``N``, the state has room for it, and the push
    thresholds of ``nb`` and ``N`` count those edges (:func:`_ppr_virtual_dense` sets them).
    """
    qcap = queue.shape[0]
    has_w = weights.shape[0] > 0
    n = indptr.shape[0] - 1
    nnb = nb.shape[0]
    virtual = src == n
    rw[src, 0] = 1.0
    touched[0] = src
    nt = 1
    queue[0] = src
    head = 0
    tail = 1
    qlen = 1
    pushes = 0
    while qlen > 0:
        u = queue[head]
        head += 1
        if head == qcap:
            head = 0
        qlen -= 1
        ru = rw[u, 0]
        pushes += 1
        back = -1
        if not virtual:
            wu = wdeg[u]
        elif u == n:
            wu = w_self
        else:
            back = _position(nb, u)
            wu = wdeg[u] + nbw[back] if back >= 0 else wdeg[u]
        if wu <= 0.0:
            p[u] += ru
            rw[u, 0] = _TINY
        else:
            p[u] += alpha * ru
            rw[u, 0] = _TINY
            spread = (1.0 - alpha) * ru
            if lazy:
                spread *= 0.5
            c = spread / wu
            if u == n:  # the virtual node's edges are all in nb
                e0 = 0
                e1 = 0
            else:
                e0 = indptr[u]
                e1 = indptr[u + 1]
            for e in range(e0, e1):
                nt, tail, qlen = _spread(rw, touched, queue, indices[e], c * weights[e] if has_w else c, nt, tail,
                                         qlen, qcap)
            if virtual:  # the edges to or from the virtual node, after the row's (as _ppr_virtual walks them)
                j0 = 0 if u == n else back
                j1 = nnb if u == n else (back + 1 if back >= 0 else back)
                for j in range(j0, j1):
                    nt, tail, qlen = _spread(rw, touched, queue, nb[j] if u == n else n, c * nbw[j], nt, tail, qlen,
                                             qcap)
            if lazy:
                old = rw[u, 0]
                new = old + spread
                rw[u, 0] = new
                thr = rw[u, 1]
                if old < thr and new >= thr:
                    queue[tail] = u
                    tail += 1
                    if tail == qcap:
                        tail = 0
                    qlen += 1
        if max_pushes > 0 and pushes >= max_pushes:
            break
    return nt, pushes


@numba.njit(cache=True, nogil=True, inline="always")
def _top_and_clear(rw, p, touched, cand, nt, src, alpha, k, threshold, out_nodes, out_scores):  # pragma: no cover
    """After a dense push from ``src``: its top-K list into ``out_*`` (:func:`_select_topk` on ``p + alpha r`` of
    the ``nt`` touched nodes), then the touched residues and estimates back to zero; the list's length."""
    for j in range(nt):
        v = touched[j]
        cand[j] = p[v] + alpha * rw[v, 0]
    c = _select_topk(touched, cand, nt, src, cand[0], k, threshold * cand[0], out_nodes, out_scores)
    for j in range(nt):
        v = touched[j]
        rw[v, 0] = 0.0
        p[v] = 0.0
    return c


@numba.njit(cache=True, parallel=True)
def _ppr_batch(
    indptr,
    indices,
    weights,
    wdeg,
    targets,
    alpha,
    lazy,
    k,
    threshold,
    max_pushes,
    rw,
    p,
    queue,
    touched,
    cand,
    out_nodes,
    out_scores,
    out_count,
):  # pragma: no cover - compiled
    """Top-K lists of ``targets`` (rows of ``out_*``), worker ``w`` taking targets ``w, w + T, ...``."""
    nthreads = rw.shape[0]
    nb = targets.shape[0]
    no_nb = np.zeros(0, dtype=np.int64)
    no_w = np.zeros(0, dtype=np.float64)
    for w in prange(nthreads):
        rw_w = rw[w]
        p_w = p[w]
        t_w = touched[w]
        c_w = cand[w]
        for i in range(w, nb, nthreads):
            src = targets[i]
            nt, _ = _push_dense(
                indptr, indices, weights, wdeg, src, alpha, lazy, max_pushes, rw_w, p_w, queue[w], t_w, no_nb,
                no_w, 0.0,
            )
            out_count[i] = _top_and_clear(rw_w, p_w, t_w, c_w, nt, src, alpha, k, threshold, out_nodes[i],
                                          out_scores[i])


@numba.njit(cache=True, nogil=True)
def _ppr_virtual(
    indptr, indices, weights, wdeg, nb, nbw, bidir, alpha, eps, lazy, k, threshold, max_pushes
):  # pragma: no cover
    """Push from the virtual node ``N`` (edges to ``nb`` with weights ``nbw``) with sparse state.

    ``nb`` sorted distinct existing ids; with ``bidir`` each ``nb[j]`` also links back to ``N``
    with weight ``nbw[j]``. State lives in compact slots (``ids``, ``r``, ``p``, ``wd``) found
    through an open-addressing hash map ``key -> slot``. Returns (nodes int64 [c], scores
    float64 [c], pushes, converged). :mod:`kernels.ppr_partial` makes the same steps on rows that
    arrive on demand.
    """
    n = indptr.shape[0] - 1
    has_w = weights.shape[0] > 0
    cap = 1024
    keys = np.full(cap, -1, dtype=np.int64)
    vals = np.empty(cap, dtype=np.int64)
    ids = np.empty(256, dtype=np.int64)
    r = np.zeros(256, dtype=np.float64)
    p = np.zeros(256, dtype=np.float64)
    wd = np.zeros(256, dtype=np.float64)
    queue = np.empty(256, dtype=np.int64)
    # slot 0: the virtual node
    w_self = 0.0
    for j in range(nb.shape[0]):
        w_self += nbw[j]
    ids[0] = n
    r[0] = 1.0
    wd[0] = w_self
    keys[_hash_slot(n, cap - 1)] = n
    vals[_hash_slot(n, cap - 1)] = 0
    ns = 1
    queue[0] = 0
    head = 0
    tail = 1
    pushes = 0
    converged = True
    while head < tail:
        su = queue[head]
        head += 1
        ru = r[su]
        if ru <= 0.0:
            continue
        if max_pushes > 0 and pushes >= max_pushes:
            converged = False
            break
        pushes += 1
        u = ids[su]
        wu = wd[su]
        p[su] += ru if wu <= 0.0 else alpha * ru
        r[su] = 0.0
        if wu <= 0.0:
            continue
        spread = (1.0 - alpha) * ru
        if lazy:
            spread *= 0.5
        c = spread / wu
        # neighbours of u in the graph with the virtual node added
        if u == n:
            e0 = 0
            e1 = nb.shape[0]
            back = -1
        else:
            e0 = indptr[u]
            e1 = indptr[u + 1]
            back = _position(nb, u) if bidir else -1
        last = e1 + (1 if back >= 0 else 0)
        for e in range(e0, last):
            if u == n:
                v = nb[e]
                we = nbw[e]
            elif e < e1:
                v = np.int64(indices[e])
                we = weights[e] if has_w else 1.0
            else:
                v = n
                we = nbw[back]
            h = _find(keys, v)  # v's slot, or where it goes
            if keys[h] == v:
                sv = vals[h]
            else:
                sv = ns
                if ns == ids.shape[0]:
                    ids = _grow(ids, 2 * ns)
                    r = _grow(r, 2 * ns)
                    p = _grow(p, 2 * ns)
                    wd = _grow(wd, 2 * ns)
                ids[sv] = v
                r[sv] = 0.0
                p[sv] = 0.0
                wv = wdeg[v] if wdeg.shape[0] > 0 else np.float64(indptr[v + 1] - indptr[v])
                if bidir:
                    a = _position(nb, v)
                    if a >= 0:
                        wv += nbw[a]
                wd[sv] = wv
                keys[h] = v
                vals[h] = sv
                ns += 1
                if 2 * ns > keys.shape[0]:  # rehash at half load
                    ncap = 2 * keys.shape[0]
                    nk = np.full(ncap, -1, dtype=np.int64)
                    nv = np.empty(ncap, dtype=np.int64)
                    for q in range(keys.shape[0]):
                        kq = keys[q]
                        if kq != -1:
                            hq = _hash_slot(kq, ncap - 1)
                            while nk[hq] != -1:
                                hq = (hq + 1) & (ncap - 1)
                            nk[hq] = kq
                            nv[hq] = vals[q]
                    keys = nk
                    vals = nv
            old = r[sv]
            new = old + c * we
            r[sv] = new
            wv = wd[sv]
            thr = eps * wv if wv > 0.0 else eps
            if old < thr and new >= thr:
                if tail == queue.shape[0]:
                    if head > 0:  # compact the consumed prefix before growing
                        copy_run(queue, np.int64(0), queue, head, tail - head)  # forward: the source is ahead
                        tail -= head
                        head = 0
                    if tail == queue.shape[0]:
                        queue = _grow(queue, 2 * tail)
                queue[tail] = sv
                tail += 1
        if lazy:
            old = r[su]
            new = old + spread
            r[su] = new
            thr = eps * wu
            if old < thr and new >= thr:
                if tail == queue.shape[0]:
                    queue = _grow(queue, 2 * tail)
                queue[tail] = su
                tail += 1
    scores = np.empty(ns, dtype=np.float64)
    for s in range(ns):
        scores[s] = p[s] + alpha * r[s]
    out_nodes = np.empty(max(k, 1), dtype=np.int64)
    out_scores = np.empty(max(k, 1), dtype=np.float64)
    c = _select_topk(ids, scores, ns, n, scores[0], k, threshold * scores[0], out_nodes, out_scores)
    return out_nodes[:c], out_scores[:c], pushes, converged


@numba.njit(cache=True, nogil=True)
def _ppr_virtual_dense(
    indptr, indices, weights, wdeg, nb, nbw, alpha, eps, lazy, k, threshold, max_pushes, rw, p, queue, touched, cand
):  # pragma: no cover
    """:func:`_ppr_virtual` (bidirectional) on one worker's dense scratch (``rw``, ``p``, ... of one thread, room
    for ``N + 1`` nodes, thresholds for ``eps``): the same steps and arithmetic, so the same list and scores, at
    the dense push's cost per edge instead of a hash map's. The neighbours' and the virtual node's thresholds are
    set for the push and restored, and the touched state zeroed: the scratch is as it was on return."""
    n = indptr.shape[0] - 1
    nnb = nb.shape[0]
    w_self = 0.0
    for j in range(nnb):
        w_self += nbw[j]
    saved = np.empty(nnb + 1, dtype=np.float64)
    for j in range(nnb):
        v = nb[j]
        saved[j] = rw[v, 1]
        wv = wdeg[v] + nbw[j]
        rw[v, 1] = eps * wv if wv > 0.0 else eps
    saved[nnb] = rw[n, 1]
    rw[n, 1] = eps * w_self if w_self > 0.0 else eps
    nt, pushes = _push_dense(indptr, indices, weights, wdeg, n, alpha, lazy, max_pushes, rw, p, queue, touched, nb,
                             nbw, w_self)
    out_nodes = np.empty(max(k, 1), dtype=np.int64)
    out_scores = np.empty(max(k, 1), dtype=np.float64)
    c = _top_and_clear(rw, p, touched, cand, nt, n, alpha, k, threshold, out_nodes, out_scores)
    for j in range(nnb):
        rw[nb[j], 1] = saved[j]
    rw[n, 1] = saved[nnb]
    return out_nodes[:c], out_scores[:c], pushes


# ============================================================================ Python API
def _check_targets(graph: CSRGraph, targets: np.ndarray | Sequence[int] | int) -> np.ndarray:
    t = np.ascontiguousarray(np.asarray(targets, dtype=np.int64).reshape(-1))
    if len(t) and (int(t.min()) < 0 or int(t.max()) >= graph.num_nodes):
        raise ValueError(f"targets must lie in [0, {graph.num_nodes})")
    return t


def _run_batch(
    graph: CSRGraph, targets: np.ndarray, cfg: PPRConfig, k: int, sc: _DenseScratch, max_pushes: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded results: counts int64 [B], nodes int64 [B, k], scores float64 [B, k]."""
    b = len(targets)
    out_nodes = np.empty((b, k), dtype=np.int64)
    out_scores = np.empty((b, k), dtype=np.float64)
    out_count = np.zeros(b, dtype=np.int64)
    w = graph.weights if graph.weights is not None else _NO_F32
    if sc.eps != cfg.eps:
        raise ValueError(f"scratch built for eps {sc.eps}, used with eps {cfg.eps}")
    _ppr_batch(
        graph.indptr, graph.indices, w, _weighted_degree(graph), targets, cfg.alpha, cfg.lazy, k, cfg.threshold,
        max_pushes, sc.rw, sc.p, sc.queue, sc.touched, sc.cand, out_nodes, out_scores, out_count,
    )  # fmt: skip
    return out_count, out_nodes, out_scores


def _compact(counts: np.ndarray, nodes: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, ...]:
    """Padded [B, k] rows -> CSR (ptr int64 [B+1], nodes, scores), vectorized."""
    k = nodes.shape[1]
    mask = np.arange(k)[None, :] < counts[:, None]
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, nodes[mask], scores[mask]


def ppr_topk(
    graph: CSRGraph,
    targets: np.ndarray | Sequence[int] | int,
    cfg: PPRConfig | None = None,
    *,
    k: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Push from every target (in parallel on all numba threads) and return its top-K list.

    Args:
        graph: the graph (symmetric for the per-node error bound).
        targets: int ``[B]`` (or one id).
        cfg: :class:`PPRConfig` (default parameters when ``None``).
        k: list length (default ``cfg.topk``), counting the target.

    Returns:
        ``(ptr int64 [B + 1], nodes int64 [ptr[-1]], scores float32 [ptr[-1]])``: list ``b`` is
        ``nodes[ptr[b]:ptr[b+1]]``, ``targets[b]`` first, then decreasing score.
    """
    cfg = cfg or PPRConfig()
    k = cfg.topk if k is None else int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    t = _check_targets(graph, targets)
    threads = numba_threads()
    sc = _take_dense(graph, threads, cfg.eps)
    try:
        counts, nodes, scores = _run_batch(graph, t, cfg, k, sc)
    finally:
        _give_dense(graph, sc)
    ptr, n, s = _compact(counts, nodes, scores)
    return ptr, n, s.astype(np.float32)


def ppr_new_node(
    graph: CSRGraph,
    neighbors: np.ndarray | Sequence[int],
    weights: np.ndarray | Sequence[float] | None = None,
    cfg: PPRConfig | None = None,
    *,
    k: int | None = None,
    max_pushes: int = 200_000,
    bidirectional: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-K PPR list of a node that is not in ``graph``, given its edges to existing nodes.

    The new node gets the virtual id ``N = graph.num_nodes``; the push runs on the graph with that
    node added (edges ``N -> neighbors`` and, with ``bidirectional``, ``neighbors -> N``, so the
    neighbours' degrees grow by the edge weights) without copying or changing ``graph``. State is
    sparse (hash map, O(touched) memory) and the work is at most ``max_pushes`` pushes
    (``sum deg <= 1 / (alpha eps)`` edge updates in any case); if the cap stops the push early the
    scores are still lower bounds but the ``eps`` bound no longer holds (logged at debug level).

    Build the subgraph of the result with
    ``induced_batch(graph, [0, len(nodes)], nodes, extra=ExtraEdges.for_new_node(N, neighbors, weights))``.

    Returns:
        ``(nodes int64 [c], scores float32 [c])`` with ``nodes[0] == N``, ``c <= k``.
    """
    cfg = cfg or PPRConfig()
    k = cfg.topk if k is None else int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    uniq, wsum = new_node_edges(graph.num_nodes, neighbors, weights)
    gw = graph.weights if graph.weights is not None else _NO_F32
    sc = _take_dense(graph, 1, cfg.eps, capacity=graph.num_nodes + 1) if bidirectional else None
    if sc is not None:  # the dense push (the same steps), on a scratch pooled with the graph's
        try:
            nodes, scores, pushes = _ppr_virtual_dense(
                graph.indptr, graph.indices, gw, _weighted_degree(graph), uniq, wsum, cfg.alpha, cfg.eps, cfg.lazy,
                k, cfg.threshold, int(max_pushes), sc.rw[0], sc.p[0], sc.queue[0], sc.touched[0], sc.cand[0],
            )  # fmt: skip
        finally:
            _give_dense(graph, sc)
        converged = not max_pushes or pushes < max_pushes
    else:
        wdeg = _weighted_degree(graph) if graph.is_weighted else np.zeros(0, dtype=np.float64)
        nodes, scores, _pushes, converged = _ppr_virtual(
            graph.indptr, graph.indices, gw, wdeg, uniq, wsum, bool(bidirectional),
            cfg.alpha, cfg.eps, cfg.lazy, k, cfg.threshold, int(max_pushes),
        )  # fmt: skip
    if not converged:
        log.debug("ppr_new_node stopped at max_pushes=%d before the eps bound was reached", max_pushes)
    return nodes, scores.astype(np.float32)


def new_node_workers(num_nodes: int, count: int, threads: int | None = None) -> int:
    """How many workers :func:`ppr_new_nodes` pushes ``count`` new nodes of a graph of ``num_nodes`` nodes on: one
    per numba thread (``threads``) and node at most, each beyond the first while their scratches stay within
    :data:`NEW_NODE_PARALLEL_BYTES`; 1 where the push is not dense (past :data:`DENSE_NEW_NODE_MAX`)."""
    if num_nodes + 1 > DENSE_NEW_NODE_MAX or count < 2:
        return 1
    per = 40 * (num_nodes + 1)  # _DenseScratch of one worker with room for N + 1 nodes
    return max(1, min(count, numba_threads() if threads is None else int(threads), 1 + NEW_NODE_PARALLEL_BYTES // per))


_NEW_NODE_POOL: list[Any] = [None, 0]  # ppr_new_nodes' extra workers: a ThreadPoolExecutor made on first use, its size
_NEW_NODE_POOL_LOCK = threading.Lock()


def _forget_new_node_pool() -> None:
    """In a forked child: the parent's pool threads do not exist there (a submit would wait for ever)."""
    global _NEW_NODE_POOL_LOCK
    _NEW_NODE_POOL[:] = [None, 0]
    _NEW_NODE_POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_new_node_pool)


def _new_node_pool(workers: int) -> Any:
    """The shared thread pool of :func:`ppr_new_nodes` (at least ``workers`` threads). A larger one replaces it when
    needed; the old one is never shut down (a caller that took it a moment before still submits to it) and its
    threads idle: pools only grow, to the numba thread count at most."""
    from concurrent.futures import ThreadPoolExecutor

    with _NEW_NODE_POOL_LOCK:
        pool, size = _NEW_NODE_POOL
        if pool is None or size < workers:
            _NEW_NODE_POOL[:] = [ThreadPoolExecutor(workers, thread_name_prefix="ppr-new-node"), workers]
        return _NEW_NODE_POOL[0]


def ppr_new_nodes(
    graph: CSRGraph,
    nodes: Sequence[tuple[np.ndarray | Sequence[int], np.ndarray | Sequence[float] | None]],
    cfg: PPRConfig | None = None,
    *,
    k: int | None = None,
    max_pushes: int = 200_000,
    threads: int | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`ppr_new_node` of each ``(neighbors, weights)`` of ``nodes``, each new node alone on ``graph`` (not
    linked to the others), on :func:`new_node_workers` threads at once, each with a dense scratch of its own
    (pooled with the graph): the same lists and scores as one call each, in the order given.

    Returns:
        ``[(nodes int64 [c], scores float32 [c]), ...]``, each list's first node the virtual id ``N``.
    """
    cfg = cfg or PPRConfig()
    k = cfg.topk if k is None else int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = graph.num_nodes
    workers = new_node_workers(n, len(nodes), threads)
    if workers < 2:
        return [ppr_new_node(graph, nb, w, cfg, k=k, max_pushes=max_pushes) for nb, w in nodes]
    edges = [new_node_edges(n, nb, w) for nb, w in nodes]  # checked here: a bad node raises before any push
    gw = graph.weights if graph.weights is not None else _NO_F32
    wdeg = _weighted_degree(graph)
    out: list[Any] = [None] * len(edges)

    def push(part: int) -> None:
        sc = _take_dense(graph, 1, cfg.eps, capacity=n + 1)
        try:
            for i in range(part, len(edges), workers):  # dealt round-robin: neighbouring requests differ in cost
                uniq, wsum = edges[i]
                got, scores, pushes = _ppr_virtual_dense(
                    graph.indptr, graph.indices, gw, wdeg, uniq, wsum, cfg.alpha, cfg.eps, cfg.lazy, k,
                    cfg.threshold, int(max_pushes), sc.rw[0], sc.p[0], sc.queue[0], sc.touched[0], sc.cand[0],
                )  # fmt: skip
                if max_pushes and pushes >= max_pushes:
                    log.debug("ppr_new_nodes: node %d stopped at max_pushes=%d before the eps bound", i, max_pushes)
                out[i] = (got, scores.astype(np.float32))
        finally:
            _give_dense(graph, sc, keep=workers)

    from concurrent.futures import wait

    pool = _new_node_pool(workers - 1)
    futures, mine = [], [0]  # the calling thread is the first worker
    for part in range(1, workers):
        try:
            futures.append(pool.submit(push, part))
        except RuntimeError:  # the interpreter is shutting down (no new threads): the calling thread pushes it
            mine.append(part)
    try:
        for part in mine:
            push(part)
    finally:
        wait(futures)  # every worker done and its scratch back in the pool before this returns or raises
    for f in futures:
        f.result()  # a worker's error
    return out


def new_node_edges(n: int, neighbors: np.ndarray | Sequence[int],
                   weights: np.ndarray | Sequence[float] | None) -> tuple[np.ndarray, np.ndarray]:
    """A new node's edges to the existing nodes ``[0, n)``, checked: ``(sorted distinct neighbours int64,
    their summed weights float64)``, as the pushes from a virtual node take them (ValueError on a bad id or
    weight)."""
    nb = np.asarray(neighbors, dtype=np.int64).reshape(-1)
    if len(nb) and (int(nb.min()) < 0 or int(nb.max()) >= n):
        raise ValueError(f"neighbors of a new node must be existing ids in [0, {n})")
    w = np.ones(len(nb)) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != nb.shape:
        raise ValueError(f"weights must match neighbors ({len(nb)}), got {w.shape}")
    if len(w) and (not np.all(np.isfinite(w)) or float(w.min()) < 0):
        raise ValueError("edge weights of a new node must be finite and >= 0")
    uniq, inv = np.unique(nb, return_inverse=True)
    wsum = np.bincount(inv, weights=w, minlength=len(uniq)) if len(nb) else np.zeros(0)
    return uniq, wsum.astype(np.float64)


def ppr_exact(
    graph: CSRGraph, targets: np.ndarray | Sequence[int], cfg: PPRConfig | None = None, *, tol: float = 1e-12
) -> np.ndarray:
    """Exact PPR rows of ``targets`` by power iteration (SciPy), float64 ``[B, N]``: the reference.

    Iterates ``X <- teleport * E + (1 - teleport) X P`` (``P = D^{-1} A`` with self-loops on
    nodes without out-weight; ``teleport = cfg.teleport``, i.e. the lazy walk through its plain
    equivalent) until the largest change is below ``tol``. O(iterations * E * B) work and
    O(N * B) memory: for tests and benchmarks, not for serving.
    """
    import scipy.sparse as sp

    cfg = cfg or PPRConfig()
    t = _check_targets(graph, targets)
    n = graph.num_nodes
    wd = _weighted_degree(graph)
    a = graph.to_scipy().astype(np.float64)
    dangling = wd <= 0
    inv = np.where(dangling, 0.0, 1.0 / np.where(dangling, 1.0, wd))
    pt = (sp.diags(inv) @ a).T.tocsr() + sp.diags(dangling.astype(np.float64))  # P^T
    tel = cfg.teleport
    e = np.zeros((n, len(t)))
    e[t, np.arange(len(t))] = 1.0
    x = e.copy()
    for _ in range(100_000):
        nx = tel * e + (1 - tel) * (pt @ x)
        if np.abs(nx - x).max() < tol:
            x = nx
            break
        x = nx
    return x.T.copy()
