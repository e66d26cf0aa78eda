r"""Approximate personalized PageRank (PPR) by push, the offline top-K index, online push for new nodes.

This is the shaDow-GNN extractor: for a target ``s`` keep the K nodes with the highest
(approximate) PPR score, then take the induced subgraph (:func:`kernels.subgraph.induced_batch`).

Convention
----------
``alpha`` is the **teleport probability** (default 0.15), the same convention as PyG's
``torch_geometric.utils.get_ppr`` and APPNP; the shaDow-GNN reference configuration writes
``alpha = 0.85`` for the same walk. With edge weights ``w(u, v)`` (1 on an unweighted graph),
weighted degree ``w(u) = sum_v w(u, v)`` and ``P = D^{-1} A`` (row-stochastic), the PPR vector of
target ``s`` is the row vector

.. math::

    \pi_s = \alpha e_s + (1 - \alpha)\, \pi_s P                         \quad\text{(default, non-lazy)}

    \pi_s = \alpha e_s + (1 - \alpha)\, \pi_s \tfrac{1}{2}(I + P)       \quad\text{(``lazy=True``)}

A node without out-weight (``w(u) = 0``) keeps the walk where it is (a self-loop). The lazy walk
with teleport ``a`` is exactly the non-lazy walk with teleport ``2a / (1 + a)`` (0.15 -> 0.26):
``lazy=True`` reproduces the reference shaDow-GNN code's walk; the default is the plain walk
(half the pushes for the same ``eps``). :meth:`PPRConfig.teleport` gives the equivalent plain
teleport.

Push (Andersen, Chung and Lang 2006)
------------------------------------
State: estimate ``p`` and residue ``r``, initially ``p = 0``, ``r = e_s``. Invariant, for every
state reached: ``\pi_s = p + \sum_u r(u)\, \pi_u``. While some ``u`` has ``r(u) >= eps * w(u)``
(FIFO queue; the target is always pushed once) push it:

* non-lazy: ``p(u) += alpha r(u)``; each out-neighbour ``v`` gets
  ``r(v) += (1 - alpha) r(u) w(u, v) / w(u)``; ``r(u) = 0``.
* lazy: the same with half of ``(1 - alpha) r(u)`` staying at ``u``.
* ``w(u) = 0``: ``p(u) += r(u)``, ``r(u) = 0`` (the self-loop walk, summed in closed form).

Each push moves at least ``alpha * eps * w(u)`` of mass into ``p`` and ``sum p <= 1``, so the work
of one target is at most ``sum_{pushes} deg(u) <= 1 / (alpha * eps)`` edge updates (667k at the
defaults), independent of the graph size.

Score and error bound
---------------------
The reported score is ``\hat\pi(v) = p(v) + alpha r(v)`` (``r(v) \pi_v(v) >= alpha r(v)`` is
part of the invariant's sum, so this is still a lower bound and never worse than ``p``). When the
queue is empty, ``r(u) < eps * w(u)`` everywhere. On a **symmetric** graph (``w(u, v) = w(v, u)``,
the case of every dataset here) the walk is reversible, ``w(u) \pi_u(v) = w(v) \pi_v(u)``, so

.. math::

    0 \le \pi_s(v) - \hat\pi(v) \le \sum_u r(u) \pi_u(v) < \sum_u \varepsilon w(u) \pi_u(v)
      = \varepsilon w(v) \sum_u \pi_v(u) = \varepsilon\, w(v)

for every node ``v`` (both variants; ``w(v)`` is the degree on an unweighted graph). On a
directed graph only the total is bounded: ``sum_v (\pi_s(v) - p(v)) = sum_u r(u)``.

Consequence for the top-K list: a node whose exact score exceeds the (K-1)-th largest exact score
among the non-target nodes by more than ``eps * w(v)`` is in the list (the estimates of the
nodes ranked above it are lower bounds of their own exact scores).

Lists
-----
List of ``s`` = ``[s] + `` the ``K - 1`` other nodes with the highest ``\hat\pi``, in decreasing
score (ties: smaller id first), dropping nodes with ``\hat\pi(v) < threshold * \hat\pi(s)``
(``threshold`` = the *relative score threshold*, 0 keeps all). ``K`` counts the target.

Implementations
---------------
* :func:`ppr_topk` / :meth:`PPRIndex.build`: one compiled parallel loop (numba ``prange`` over
  worker threads, each walking its share of the targets) with per-thread dense scratch of
  ``O(N)`` (residue and push threshold interleaved so that one edge update touches one cache line;
  estimate; FIFO ring; touched list) reset through the touched list, and an O(T log K) heap
  selection of the top K among the T touched nodes.
* :func:`ppr_new_node`: a node that is not in the graph (virtual id ``N``) given its edges; the
  same push on the graph with that node added, with sparse state (an open-addressing hash map
  from node id to a compact slot; no array of length ``N``), at most ``max_pushes`` pushes.

The index file (``PPRIndex``) is a directory ``ppr-<graph fingerprint>-<config key>`` holding
``meta.json``, ``ptr.npy`` (int64 ``[N + 1]``), ``nodes.bin`` (int32 or int64 ``[nnz]``) and
``scores.bin`` (float32 ``[nnz]``), opened memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba import prange

from .graph import CSRGraph, gather_ranges, index_dtype_for
from .subgraph import InducedTable, SubgraphBatch, _grow, induced_batch

__all__ = [
    "PPRConfig",
    "PPRIndex",
    "PPRIndexError",
    "ppr_exact",
    "ppr_new_node",
    "ppr_topk",
]

log = logging.getLogger(__name__)


def _unwrapped(a: np.ndarray) -> np.ndarray:
    """A plain ndarray view of a memory map (the same pages): every index or slice of an
    ``np.memmap`` builds another memmap, a few microseconds each on a one-node lookup."""
    return np.asarray(a)

_FORMAT = "gnnserve.ppr/1"
_ALGO_VERSION = 1  # part of the index key: bump when the push or the selection changes
_SCRATCH_KEY = "_ppr_scratch_pool"
_SCRATCH_LOCK = threading.Lock()


class PPRIndexError(ValueError):
    """A PPR index file is damaged, or it was built for another graph or configuration."""


# ============================================================================ configuration
@dataclass(frozen=True)
class PPRConfig:
    """Parameters of the push and of the top-K lists (see the module docstring).

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
            cs = np.zeros(graph.num_edges + 1, dtype=np.float64)
            np.cumsum(graph.weights, dtype=np.float64, out=cs[1:])
            wd = cs[graph.indptr[1:]] - cs[graph.indptr[:-1]]
        graph.cache()["_ppr_wdeg"] = wd
    return wd


_NO_F32 = np.zeros(0, dtype=np.float32)
_TINY = 1e-300  # the residue a pushed node keeps in the dense push (r == 0 means "never touched")


class _DenseScratch:
    """Per-thread dense state for ``T`` workers on a graph of ``N`` nodes (zero residues between targets).

    ``rw[t, v] = (r(v), eps * w(v))`` interleaved (the push threshold of ``v``: ``eps`` where
    ``w(v) = 0``), so one edge update reads one cache line; ``p[t, v]``, FIFO ring ``queue[t]``
    (N + 1 slots), ``touched[t]`` node list and ``cand[t]`` candidate scores. Built for one ``eps``.
    """

    def __init__(self, wdeg: np.ndarray, threads: int, eps: float) -> None:
        n = len(wdeg)
        self.threads = threads
        self.eps = eps
        self.rw = np.zeros((threads, n, 2), dtype=np.float64)
        self.rw[:, :, 1] = np.where(wdeg > 0, eps * wdeg, eps)
        self.p = np.zeros((threads, n), dtype=np.float64)
        idt = index_dtype_for(n + 1)
        self.queue = np.zeros((threads, n + 1), dtype=idt)
        self.touched = np.zeros((threads, n + 1), dtype=idt)  # + 1: the push writes one slot past its count
        self.cand = np.zeros((threads, n), dtype=np.float64)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.rw, self.p, self.queue, self.touched, self.cand))


def _take_dense(graph: CSRGraph, threads: int, eps: float) -> _DenseScratch:
    with _SCRATCH_LOCK:
        pool = graph.cache().setdefault(_SCRATCH_KEY, [])
        for i, sc in enumerate(pool):
            if sc.threads == threads and sc.eps == eps:
                return pool.pop(i)
    return _DenseScratch(_weighted_degree(graph), threads, eps)


def _give_dense(graph: CSRGraph, sc: _DenseScratch) -> None:
    with _SCRATCH_LOCK:
        pool = graph.cache().setdefault(_SCRATCH_KEY, [])
        if len(pool) < 2:
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


@numba.njit(cache=True, nogil=True)
def _push_dense(
    indptr, indices, weights, wdeg, src, alpha, lazy, max_pushes, rw, p, queue, touched
):  # pragma: no cover
    """ACL push from ``src`` on dense per-thread state; returns the number of touched nodes.

    ``rw[v] = (r(v), threshold(v))``, ``p[v]``: all residues and estimates are zero on entry except
    those this call sets; ``touched[:T]`` lists every node with ``r > 0`` or ``p > 0`` on return.

    The edge loop has no data-dependent branch (it was the cost: 1.9x to 2.0x faster, identical
    lists and scores): a pushed node keeps the residue ``_TINY`` instead of 0, so ``r(v) == 0``
    means exactly "never touched" and needs no look at ``p``; the touched list and the queue
    are written unconditionally and their lengths advance by the conditions. ``_TINY`` (1e-300)
    is below every threshold and vanishes in ``p + alpha r``; the caller resets touched residues
    to 0.
    """
    qcap = queue.shape[0]
    has_w = weights.shape[0] > 0
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
        wu = wdeg[u]
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
            for e in range(indptr[u], indptr[u + 1]):
                v = indices[e]
                old = rw[v, 0]
                new = old + (c * weights[e] if has_w else c)
                rw[v, 0] = new
                touched[nt] = v
                nt += old == 0.0
                thr = rw[v, 1]
                hit = (old < thr) & (new >= thr)
                queue[tail] = v
                tail += hit
                qlen += hit
                if tail == qcap:
                    tail = 0
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
    return nt


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
    for w in prange(nthreads):
        rw_w = rw[w]
        p_w = p[w]
        t_w = touched[w]
        c_w = cand[w]
        for i in range(w, nb, nthreads):
            src = targets[i]
            nt = _push_dense(
                indptr, indices, weights, wdeg, src, alpha, lazy, max_pushes, rw_w, p_w, queue[w], t_w
            )
            for j in range(nt):
                v = t_w[j]
                c_w[j] = p_w[v] + alpha * rw_w[v, 0]
            out_count[i] = _select_topk(
                t_w, c_w, nt, src, c_w[0], k, threshold * c_w[0], out_nodes[i], out_scores[i]
            )
            for j in range(nt):
                v = t_w[j]
                rw_w[v, 0] = 0.0
                p_w[v] = 0.0


@numba.njit(cache=True, nogil=True)
def _hash_slot(key, mask):  # pragma: no cover - compiled
    h = np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((h >> np.uint64(29)) & np.uint64(mask))


@numba.njit(cache=True, nogil=True)
def _ppr_virtual(
    indptr, indices, weights, wdeg, nb, nbw, bidir, alpha, eps, lazy, k, threshold, max_pushes
):  # pragma: no cover
    """Push from the virtual node ``N`` (edges to ``nb`` with weights ``nbw``) with sparse state.

    ``nb`` sorted distinct existing ids; with ``bidir`` each ``nb[j]`` also links back to ``N``
    with weight ``nbw[j]``. State lives in compact slots (``ids``, ``r``, ``p``, ``wd``) found
    through an open-addressing hash map ``key -> slot``. Returns (nodes int64 [c], scores
    float64 [c], pushes, converged).
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
            back = -1
            if bidir:
                a = 0
                z = nb.shape[0]
                while a < z:
                    mid = (a + z) >> 1
                    if nb[mid] < u:
                        a = mid + 1
                    else:
                        z = mid
                if a < nb.shape[0] and nb[a] == u:
                    back = a
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
            # find or insert v's slot
            mask = keys.shape[0] - 1
            h = _hash_slot(v, mask)
            while keys[h] != -1 and keys[h] != v:
                h = (h + 1) & mask
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
                    a = 0
                    z = nb.shape[0]
                    while a < z:
                        mid = (a + z) >> 1
                        if nb[mid] < v:
                            a = mid + 1
                        else:
                            z = mid
                    if a < nb.shape[0] and nb[a] == v:
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
                        queue[: tail - head] = queue[head:tail].copy()
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
    threads = numba.get_num_threads()
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
    n = graph.num_nodes
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
    wdeg = _weighted_degree(graph) if graph.is_weighted else np.zeros(0, dtype=np.float64)
    gw = graph.weights if graph.weights is not None else _NO_F32
    nodes, scores, _pushes, converged = _ppr_virtual(
        graph.indptr, graph.indices, gw, wdeg, uniq, wsum.astype(np.float64), bool(bidirectional),
        cfg.alpha, cfg.eps, cfg.lazy, k, cfg.threshold, int(max_pushes),
    )  # fmt: skip
    if not converged:
        log.debug("ppr_new_node stopped at max_pushes=%d before the eps bound was reached", max_pushes)
    return nodes, scores.astype(np.float32)


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


# ============================================================================ the index
def _fingerprint_of(graph_or_fp: CSRGraph | str) -> str:
    return graph_or_fp.fingerprint() if isinstance(graph_or_fp, CSRGraph) else str(graph_or_fp)


class PPRIndex:
    """Top-K PPR lists of every node of one graph under one :class:`PPRConfig`, CSR-shaped.

    Attributes:
        config: the parameters it was built with (``config.topk`` = ``k_max``).
        fingerprint: :meth:`CSRGraph.fingerprint` of the graph it belongs to.
        num_nodes: ``N``.
        ptr: int64 ``[N + 1]``; nodes/scores of node ``v`` are ``[ptr[v]:ptr[v + 1]]``.
        nodes: int32/int64 ``[nnz]`` (node ``v`` first in its own list, then decreasing score).
        scores: float32 ``[nnz]``.
        path: directory it was loaded from (``None`` for an unsaved index).
    """

    def __init__(
        self,
        config: PPRConfig,
        fingerprint: str,
        ptr: np.ndarray,
        nodes: np.ndarray,
        scores: np.ndarray,
        *,
        path: Path | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.fingerprint = fingerprint
        self.ptr = ptr
        self.nodes = nodes
        self.scores = scores
        self.num_nodes = len(ptr) - 1
        self.path = path
        self.meta = dict(meta or {})
        self.induced: InducedTable | None = None  # see ensure_induced
        if len(nodes) != int(ptr[-1]) or len(scores) != len(nodes):
            raise PPRIndexError(
                f"index arrays disagree: ptr ends at {int(ptr[-1])}, {len(nodes)} nodes, {len(scores)} scores"
            )

    # ------------------------------------------------------------------ properties
    @property
    def k_max(self) -> int:
        """Largest list length stored (= ``config.topk``); any ``k <= k_max`` is served by slicing."""
        return self.config.topk

    def __len__(self) -> int:
        return self.num_nodes

    def __repr__(self) -> str:
        return (
            f"PPRIndex(N={self.num_nodes}, k_max={self.k_max}, nnz={len(self.nodes)}, "
            f"alpha={self.config.alpha}, eps={self.config.eps}, lazy={self.config.lazy}, "
            f"graph={self.fingerprint[:12]}, path={self.path})"
        )

    def check_graph(self, graph: CSRGraph | str) -> None:
        """Raise :class:`PPRIndexError` unless the index was built for this graph (fingerprint)."""
        fp = _fingerprint_of(graph)
        if fp != self.fingerprint:
            raise PPRIndexError(
                f"PPR index was built for graph {self.fingerprint} but is used with graph {fp}; "
                "rebuild it (PPRIndex.open_or_build) for this graph"
            )

    # ------------------------------------------------------------------ lookup
    def lookup(
        self, targets: np.ndarray | Sequence[int] | int, k: int | None = None, *, return_scores: bool = False
    ) -> tuple[np.ndarray, ...]:
        """The first ``k`` entries of each target's list (no recomputation), CSR-shaped.

        Returns ``(ptr int64 [B + 1], nodes int64 [ptr[-1]])`` and, with ``return_scores``, also
        ``scores float32 [ptr[-1]]``. Lists may be shorter than ``k`` (few reachable nodes, or the
        relative threshold). Vectorized: O(B + output).
        """
        k = self.k_max if k is None else int(k)
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k must lie in [1, k_max={self.k_max}], got {k}")
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        one = len(t) == 1
        if len(t) and not (0 <= int(t[0]) < self.num_nodes if one else
                           (int(t.min()) >= 0 and int(t.max()) < self.num_nodes)):
            raise ValueError(f"targets must lie in [0, {self.num_nodes}) (use ppr_new_node for new nodes)")
        if one and not return_scores:  # a one-node request: one slice, no gather
            v = int(t[0])
            lo = int(self.ptr[v])
            cnt = min(int(self.ptr[v + 1]) - lo, k)
            return np.array([0, cnt], dtype=np.int64), self.nodes[lo : lo + cnt].astype(np.int64)
        start = self.ptr[t]
        cnt = np.minimum(self.ptr[t + 1] - start, k)
        optr, idx = gather_ranges(start, cnt)
        nodes = self.nodes[idx].astype(np.int64)
        if return_scores:
            return optr, nodes, np.asarray(self.scores[idx], dtype=np.float32)
        return optr, nodes

    # ------------------------------------------------------------------ induced subgraphs
    def induced_batch(
        self, graph: CSRGraph, targets: np.ndarray | Sequence[int], k: int | None = None
    ) -> SubgraphBatch:
        """The block-diagonal batch of the targets' top-``k`` subgraphs (:func:`kernels.subgraph.induced_batch`).

        Served from the precomputed :class:`kernels.subgraph.InducedTable` when one covers ``k``
        (see :meth:`ensure_induced`), else induced from the graph; the result is the same.
        """
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        ptr, nodes = self.lookup(t, k)
        table = self.induced
        if table is not None and (self.k_max if k is None else int(k)) <= table.k:
            return table.batch(graph, t, ptr, nodes, checked=True)  # our own lists: nothing to check
        return induced_batch(graph, ptr, nodes)

    def ensure_induced(
        self, graph: CSRGraph, *, max_bytes: int = 1 << 30, k: int | None = None, progress: bool = False
    ) -> bool:
        """Attach the induced subgraph of every node's top-``k`` list (default ``k_max``), building it if needed.

        A saved index keeps the table beside its lists (``induced_*`` files, recorded in
        ``meta.json``) and memory-maps it on later calls. Refused (``False``, logged) when the
        estimate from 256 sampled nodes exceeds ``max_bytes``: batches are then induced from the
        graph as before. Returns whether a table is attached.
        """
        self.check_graph(graph)
        k = self.k_max if k is None else int(k)
        if self.induced is not None and self.induced.k >= k:
            return True
        if not 1 <= k <= min(self.k_max, InducedTable.MAX_K):
            raise ValueError(f"k must lie in [1, {min(self.k_max, InducedTable.MAX_K)}], got {k}")
        loaded = self._open_induced()
        if loaded is not None and loaded.k >= k:
            self.induced = loaded
            return True
        n = self.num_nodes
        if n == 0:
            return False
        sample = np.random.default_rng(0).choice(n, size=min(n, 256), replace=False)
        ptr, nodes = self.lookup(sample, k)
        per_edge = 8 if graph.is_weighted else 4
        est = induced_batch(graph, ptr, nodes).graph.num_edges / len(sample) * n * per_edge + 8 * (n + 1)
        if est > max_bytes:
            log.info("induced table for k=%d skipped: about %.0f MiB > limit %.0f MiB", k, est / 2**20,
                     max_bytes / 2**20)  # fmt: skip
            return False
        t0 = time.perf_counter()
        table = InducedTable.build(graph, self.lookup, k, progress=progress)
        log.info("induced table for k=%d: %d edges, %.0f MiB in %.1f s", k, len(table.src), table.nbytes / 2**20,
                 time.perf_counter() - t0)  # fmt: skip
        if self.path is not None:
            try:
                self._save_induced(table)
            except OSError as exc:  # a read-only index directory: keep the table in memory
                log.warning("induced table not saved in %s: %s", self.path, exc)
        self.induced = table
        return True

    _INDUCED_FILES = ("induced_src.bin", "induced_dst.bin", "induced_w.bin")

    def _save_induced(self, table: InducedTable) -> None:
        d = self.path
        assert d is not None
        tag = _writer_tag()
        arrays = {"induced_src.bin": table.src, "induced_dst.bin": table.dst}
        if table.weights is not None:
            arrays["induced_w.bin"] = table.weights
        with open(d / f"induced_eptr.npy{tag}", "wb") as f:
            np.save(f, table.eptr)
        for name, a in arrays.items():
            np.ascontiguousarray(a).tofile(d / f"{name}{tag}")
        for name in ("induced_eptr.npy", *arrays):
            os.replace(d / f"{name}{tag}", d / name)
        meta = json.loads((d / "meta.json").read_text())
        meta["induced"] = {"k": table.k, "edges": len(table.src), "weighted": table.weights is not None}
        _write_meta(d, meta)
        self.meta = meta

    def _open_induced(self) -> InducedTable | None:
        if self.path is None:
            return None
        d = self.path
        try:
            info = json.loads((d / "meta.json").read_text()).get("induced")
            if not info:
                return None
            m = int(info["edges"])
            eptr = _unwrapped(np.load(d / "induced_eptr.npy", mmap_mode="r"))
            if eptr.shape != (self.num_nodes + 1,):
                raise ValueError(f"induced_eptr.npy has shape {eptr.shape}, expected ({self.num_nodes + 1},)")
            names = self._INDUCED_FILES if info["weighted"] else self._INDUCED_FILES[:2]
            dts = (np.uint16, np.uint16, np.float32)[: len(names)]
            for name, dt in zip(names, dts, strict=True):
                if (d / name).stat().st_size != m * np.dtype(dt).itemsize:
                    raise ValueError(f"{name} has the wrong size")
            arr = [_unwrapped(np.memmap(d / name, dtype=dt, mode="r", shape=(m,))) if m else np.zeros(0, dt)
                   for name, dt in zip(names, dts, strict=True)]  # fmt: skip
            return InducedTable(int(info["k"]), eptr, arr[0], arr[1], arr[2] if info["weighted"] else None)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("ignoring the induced table in %s (%s); it will be rebuilt", d, exc)
            return None

    # ------------------------------------------------------------------ build
    @classmethod
    def build(
        cls,
        graph: CSRGraph,
        cfg: PPRConfig | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        progress: bool = True,
        chunk_size: int | None = None,
    ) -> PPRIndex:
        """Push from every node (parallel on all numba threads, a progress bar over chunks).

        With ``directory`` the lists are streamed to files there (memory O(chunk)), the index is
        saved and returned memory-mapped; otherwise it is built in memory.
        """
        from tqdm.auto import tqdm

        cfg = cfg or PPRConfig()
        n = graph.num_nodes
        k = cfg.topk
        threads = numba.get_num_threads()
        chunk = chunk_size or int(min(max(2048, n // 200), 65536))
        idt = index_dtype_for(n)
        ptr = np.zeros(n + 1, dtype=np.int64)
        t0 = time.perf_counter()
        out_dir = Path(directory) if directory is not None else None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            fn = open(out_dir / "nodes.bin", "wb")
            fs = open(out_dir / "scores.bin", "wb")
        parts_n: list[np.ndarray] = []
        parts_s: list[np.ndarray] = []
        sc = _take_dense(graph, threads, cfg.eps)
        try:
            with tqdm(total=n, desc="PPR index", unit="node", disable=not progress, smoothing=0.05) as bar:
                for lo in range(0, n, chunk):
                    hi = min(n, lo + chunk)
                    tg = np.arange(lo, hi, dtype=np.int64)
                    counts, nodes, scores = _run_batch(graph, tg, cfg, k, sc)
                    cptr, cn, cs = _compact(counts, nodes, scores)
                    ptr[lo + 1 : hi + 1] = ptr[lo] + cptr[1:]
                    cn = cn.astype(idt)
                    cs = cs.astype(np.float32)
                    if out_dir is not None:
                        cn.tofile(fn)
                        cs.tofile(fs)
                    else:
                        parts_n.append(cn)
                        parts_s.append(cs)
                    bar.update(hi - lo)
        finally:
            _give_dense(graph, sc)
            if out_dir is not None:
                fn.close()
                fs.close()
        seconds = time.perf_counter() - t0
        meta = {
            "format": _FORMAT,
            "fingerprint": graph.fingerprint(),
            "num_nodes": n,
            "nnz": int(ptr[-1]),
            "config": cfg.to_dict(),
            "config_key": cfg.key(),
            "algorithm_version": _ALGO_VERSION,
            "nodes_dtype": np.dtype(idt).str,
            "scores_dtype": np.dtype(np.float32).str,
            "build_seconds": round(seconds, 3),
            "threads": threads,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        log.info("PPR index for %d nodes (k=%d) built in %.1f s, %d entries", n, k, seconds, int(ptr[-1]))
        if out_dir is not None:
            np.save(out_dir / "ptr.npy", ptr)
            _write_meta(out_dir, meta)
            return cls.open(out_dir, graph)
        nodes_all = np.concatenate(parts_n) if parts_n else np.zeros(0, dtype=idt)
        scores_all = np.concatenate(parts_s) if parts_s else np.zeros(0, dtype=np.float32)
        return cls(cfg, meta["fingerprint"], ptr, nodes_all, scores_all, meta=meta)

    # ------------------------------------------------------------------ storage
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the index files to ``directory`` (``meta.json`` last)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "ptr.npy", np.ascontiguousarray(self.ptr, dtype=np.int64))
        np.ascontiguousarray(self.nodes).tofile(d / "nodes.bin")
        np.ascontiguousarray(self.scores, dtype=np.float32).tofile(d / "scores.bin")
        meta = {
            **self.meta,
            "format": _FORMAT,
            "fingerprint": self.fingerprint,
            "num_nodes": self.num_nodes,
            "nnz": len(self.nodes),
            "config": self.config.to_dict(),
            "config_key": self.config.key(),
            "algorithm_version": _ALGO_VERSION,
            "nodes_dtype": np.dtype(self.nodes.dtype).str,
            "scores_dtype": np.dtype(np.float32).str,
        }
        _write_meta(d, meta)
        return d

    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], graph: CSRGraph | str | None = None, *, mmap: bool = True
    ) -> PPRIndex:
        """Open a saved index (memory-mapped by default); with ``graph`` refuse a mismatched graph."""
        d = Path(directory)
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise PPRIndexError(f"{d}: not a PPR index (no readable meta.json: {exc})") from exc
        if meta.get("format") != _FORMAT:
            raise PPRIndexError(f"{d}: unknown PPR index format {meta.get('format')!r}, expected {_FORMAT!r}")
        if meta.get("algorithm_version") != _ALGO_VERSION:
            raise PPRIndexError(
                f"{d}: built by PPR algorithm version {meta.get('algorithm_version')}, this is {_ALGO_VERSION}"
            )
        n, nnz = int(meta["num_nodes"]), int(meta["nnz"])
        mode = "r" if mmap else None
        try:
            ptr = _unwrapped(np.load(d / "ptr.npy", mmap_mode=mode))
            nd, sd = np.dtype(meta["nodes_dtype"]), np.dtype(meta["scores_dtype"])
            for name, dt in (("nodes.bin", nd), ("scores.bin", sd)):
                size = (d / name).stat().st_size
                if size != nnz * dt.itemsize:
                    raise PPRIndexError(f"{d}/{name}: {size} bytes, expected {nnz} x {dt.itemsize}")
            if nnz == 0:
                nodes, scores = np.zeros(0, dtype=nd), np.zeros(0, dtype=sd)
            elif mmap:
                nodes = _unwrapped(np.memmap(d / "nodes.bin", dtype=nd, mode="r", shape=(nnz,)))
                scores = _unwrapped(np.memmap(d / "scores.bin", dtype=sd, mode="r", shape=(nnz,)))
            else:
                nodes = np.fromfile(d / "nodes.bin", dtype=nd)
                scores = np.fromfile(d / "scores.bin", dtype=sd)
        except OSError as exc:
            raise PPRIndexError(f"{d}: cannot read index arrays: {exc}") from exc
        if ptr.shape != (n + 1,) or int(ptr[-1]) != nnz:
            raise PPRIndexError(f"{d}: ptr.npy does not match meta.json (N = {n}, nnz = {nnz})")
        idx = cls(
            PPRConfig.from_dict(meta["config"]), meta["fingerprint"], ptr, nodes, scores, path=d, meta=meta
        )
        if graph is not None:
            idx.check_graph(graph)
        return idx

    @staticmethod
    def path_for(cache_dir: str | os.PathLike[str], graph: CSRGraph | str, cfg: PPRConfig) -> Path:
        """``cache_dir/ppr-<fingerprint>-<config key>``."""
        return Path(cache_dir) / f"ppr-{_fingerprint_of(graph)}-{cfg.key()}"

    @classmethod
    def open_or_build(
        cls,
        cache_dir: str | os.PathLike[str],
        graph: CSRGraph,
        cfg: PPRConfig | None = None,
        *,
        progress: bool = True,
    ) -> PPRIndex:
        """Open the index for (graph, cfg) from ``cache_dir``, building and saving it first if absent.

        The build writes to a temporary directory renamed into place at the end, so an interrupted
        build leaves nothing that looks like an index, and concurrent builders do not clash.
        """
        cfg = cfg or PPRConfig()
        final = cls.path_for(cache_dir, graph, cfg)
        if (final / "meta.json").exists():
            return cls.open(final, graph)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{final.name}{_writer_tag()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            cls.build(graph, cfg, directory=tmp, progress=progress)
            try:
                os.replace(tmp, final)
            except OSError:
                if not (final / "meta.json").exists():
                    raise
                # another process finished the same index first: keep theirs
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return cls.open(final, graph)


def _writer_tag() -> str:
    """Suffix of a temporary file name unique to this process and thread (renamed into place after)."""
    return f".tmp-{os.getpid()}-{threading.get_ident()}"


def _write_meta(d: Path, meta: dict[str, Any]) -> None:
    # a name per writer: two servers attaching an induced table to one shared index may write at once
    tmp = d / f"meta.json{_writer_tag()}"
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(d / "meta.json")
