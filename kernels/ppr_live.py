r"""A PPR top-K index that follows a live graph: the offline lists plus recomputed ones.

:class:`LivePPRIndex` wraps an offline :class:`kernels.ppr.PPRIndex` (memory-mapped, never
written) and serves the same interface (``config``, ``k_max``, ``num_nodes``, ``fingerprint``,
``lookup``, ``induced_batch``, ``induced``, ``ensure_induced``). After every structural edit
(:func:`kernels.graph_edit.apply_edit`) the server calls :meth:`LivePPRIndex.apply`, which

(a) gives the new nodes their lists: a fresh push on the new graph (:func:`kernels.ppr.ppr_topk`);
(b) recomputes, with the same fresh push, the sources whose lists the edit may have moved by
    more than the push's own tolerance (the rule below);
(c) marks *dirty* every target whose induced subgraph may have changed, so that
    :meth:`~LivePPRIndex.induced_batch` no longer serves it from the precomputed
    :class:`kernels.subgraph.InducedTable`.

Recomputed and new lists live in an overlay (an append-only arena plus per-node offsets); the
overlay is merged into in-memory copies of the lists when it grows past a fraction of them.

How far an edit moves a PPR vector
----------------------------------
Notation as in :mod:`kernels.ppr`: ``P = D^{-1} A`` row-stochastic (a node without out-weight
keeps the walk: ``P_u = e_u``), teleport ``a`` (``config.teleport``: the lazy walk with teleport
``alpha`` *is* the plain walk with teleport ``a = 2 alpha / (1 + alpha)``), and
``pi_s = a e_s + (1 - a) pi_s P`` the row vector of source ``s``. An edit changes ``P`` into
``P' = P + Delta`` where only the rows ``u`` of changed rows are non-zero (both endpoints of an
added or removed edge change rows: an edge is stored in both). Subtracting the two fixed points,

.. math::

    \pi'_s - \pi_s = (1 - a)(\pi'_s - \pi_s) P' + (1 - a)\, \pi_s \Delta
    \;\Rightarrow\;
    \pi'_s - \pi_s = \tfrac{1 - a}{a} \sum_u \pi_s(u) \sum_x \Delta_u(x)\, \pi'_x

because ``(I - (1 - a) P')^{-1} = \Pi' / a`` whose row ``x`` is the new PPR vector ``pi'_x``.
Every ``pi'_x`` has L1 norm 1, so (**L1 bound**, rule ``"l1"``)

.. math::  \|\pi'_s - \pi_s\|_1 \le \tfrac{1 - a}{a} \sum_u \pi_s(u)\, \|\Delta_u\|_1 .

Per node, on the symmetric graphs served here the new walk is reversible,
``pi'_x(y) = w'(y) pi'_y(x) / w'(x)``, and ``pi'_y`` is a probability vector, so the inner sum is
an average of ``Delta_u(x) / w'(x)`` under ``pi'_y`` (**node bound**, rule ``"node"``, the default):

.. math::

    |\pi'_s(y) - \pi_s(y)| \le w'(y)\, \tfrac{1 - a}{a} \sum_u \pi_s(u)\, m_u,
    \qquad m_u = \max_x \frac{|\Delta_u(x)|}{\hat w'(x)}

(``hat w' = w'`` where positive, 1 for a node left without edges: its walk stays put, its row of
``Pi'`` is ``e_x``, and the bound holds with weight 1). Both bounds are checked against exact PPR
in ``tests/test_ppr_live.py``. The node bound has the form of the push guarantee of the offline
lists (``0 <= pi_s(y) - score(y) < eps w(y)``, :mod:`kernels.ppr`): a list whose bound stays below
``eps`` holds scores within ``2 eps w(y)`` of the new exact vector instead of ``eps w(y)``, as good
as a fresh push with twice the threshold. The L1 rule compares an L1 mass with the per-unit-degree
tolerance ``eps`` and is far stricter: on Amazon Computers (mean degree 36, ``eps = 1e-5``) the
uniform level ``1 / N = 7e-5`` already exceeds the threshold it puts on ``pi_s(u)``, and a single
edge recomputes a median of about 7,000 of the 13,752 sources (1.6 s on 2 cores), against about
300 with the node rule.

The edit's own pushes
---------------------
``m_u`` bounds ``|(Delta_u Pi')(y)| / w'(y)`` by the largest entry of ``Delta_u / hat w'``, as if the
whole walk from ``y`` sat on that entry. It does not: ``(Delta_u Pi')(y) / w'(y)`` is the average of
``Delta_u / hat w'`` under ``pi'_y``, and ``pi'_y`` keeps about ``a`` of its mass at ``y``. The vector
``Delta_u Pi'`` itself costs a few pushes on the new graph: with ``W_u`` the weighted row (``d_u P_u``),
``C_u = W'_u - W_u`` the edit's change of it (non-zero at the edited neighbours only) and
``P'_u Pi' = (pi'_u - a e_u) / (1 - a)`` (row ``u`` of ``Pi' (I - (1 - a) P') = a I``),

.. math::

    \Delta_u \Pi' = (1 - d'_u / d_u)\, P'_u \Pi' + C_u \Pi' / d_u
    \qquad (d_u > 0;\ P'_u \Pi' = e_u \text{ when } d'_u = 0;\ P'_u \Pi' - \pi'_u \text{ when } d_u = 0),

a combination of ``pi'_u`` and of ``pi'_x`` for the edited neighbours ``x`` (changed rows themselves
on a symmetric graph). :func:`row_change_peaks` pushes each of them once on the new graph at
``eps`` and keeps two maxima per push (``max |est - a e_u| / hat w'`` and ``max est / hat w'``);
the triangle inequality over the terms, plus ``eps`` per unit of coefficient for the push's own
error (its estimates lie below the vector by less than ``eps hat w'(y)``), bounds
``max_y |(Delta_u Pi')(y)| / hat w'(y)``. That bound needs neither reversibility nor the old lists,
and replaces ``m_u`` where smaller (``peaks=True``, the default). On Amazon Computers it is
about 0.15 ``m_u`` for a single edge (``a = 0.15``: the mass ``pi'_y`` keeps at ``y``); combining the
pushed vectors entry by entry instead of term by term would be tighter still (27 lists
recomputed at the median instead of 33, measured once with a prototype), at the memory of
every vector at once. Cost: ``2 |edited pairs|`` pushes, about 0.2 ms each there, in parallel.

The rule
--------
``B_s = (1 - a) / a * sum_u est_s(u) c_u`` with ``c_u = ||Delta_u||_1`` (``"l1"``) or ``m_u``
(``"node"``); the bounds of successive edits add up (triangle inequality), so each source carries
the sum ``D_s`` of the bounds of the edits since its list was computed, and ``s`` is recomputed
(``D_s = 0`` again) when ``D_s > tol = tol_factor * eps``. ``est_s(u)`` is the best estimate of
the *old* ``pi_s(u)`` at hand:

* ``u`` in ``s``'s current list: its stored score (a lower bound, error ``< eps w(u)``). Found
  through an **inverse index** (node -> positions of the lists holding it; ``N K`` entries, int32
  below ``2^31`` of them, CSR, built once by a counting sort on the first :meth:`apply`, rebuilt
  at each merge of the overlay), plus a vectorized scan of the overlay's live entries.
* otherwise ``min(last score of s's list, w(u) / w(s) * hat pi_u(s))``: the list bounds an absent
  node's estimate by its last score, and reversibility ``w(s) pi_s(u) = w(u) pi_u(s)`` turns a
  **reverse push from u** on the old graph into estimates for every ``s`` at once (the inverse
  map of the sources lacking ``u`` is the one that cannot be stored). That push runs with
  threshold ``eps_u = tol / (2 n_U w(u) c_u)`` (``n_U`` changed rows), so every ``s`` whose term
  reaches ``tol / n_U`` (and a bound above ``tol`` needs one such term) is touched and its estimate
  is off by less than half of that; it stops after ``reverse_max_pushes`` pushes (the work cap;
  then distant sources may be missed), and all of an edit's reverse pushes together after
  ``reverse_total_pushes`` (a bulk edit of thousands of rows shares that budget, so each of its rows
  reaches only its near sources: an approximation its ``reverse_capped`` count reports).

Estimates are lower bounds, so the rule is the bound evaluated at the best estimates, not a
guarantee. Sources created by this edit are handled by (a).

Cost of one :meth:`apply`: the coefficients ``c_u`` (O(degree of the changed rows), plus with the
peaks one push per node of the edited pairs, skipped past ``N / 8`` of them); the holder
lookup (O(holders) plus a scan of the overlay, bounded by the merge fraction); one reverse push
per changed row (at most ``1 / (a eps_u)`` edge updates, capped); the recomputation, one push per
flagged source (``<= 1 / (alpha eps)`` edge updates each, parallel on the numba threads), which
dominates: everything else is about 2 ms per single-edge update on Amazon Computers.

Memory of one :meth:`apply`: ``O(T N)`` scratch for ``T`` numba workers (the reverse pushes' dense
state, which is the graph's pooled push scratch, and the per-source sums of ``B_s``), the holders, the
changed rows' entries, one chunk of ``push_chunk`` padded ``[B, K]`` push results, the recomputed lists
themselves (kept in the overlay) and, at a merge, the new copy of every list (filled chunk by chunk).
Nothing is proportional to (changed rows) x (sources a reverse push touches): each reverse push's terms
are added into its worker's per-source sums as the push ends (:func:`_reverse_accumulate`). The sums
count whole quanta of ``tol / 2^32``, each term rounded up (a bound stays a bound; a source touched by
every push of a 2,000-row edit gains at most ``5e-7 tol``): integer sums do not depend on the order of
the terms, so the pushes run on every worker and the result is the same on any number of them, to the
last bit (``tests/test_ppr_live_memory.py``). That product is what
a bulk edit makes large: the 2,000 added edges of a QA report (4,000 changed rows, 500 pushes each
under ``reverse_total_pushes``) touch 1.1e8 (push, source) pairs on a 200,000-node products-shaped
graph, which were materialised (24 bytes each in the kernel) and then run through a dozen NumPy
temporaries and sorts of that length: past 4 GB within seconds (1.7e8 pairs and an out-of-memory
kill at 2 M nodes). The same update now peaks 0.33 GB above the process's earlier peak: the
108,000 lists it recomputes and the merge they trigger (``tests/test_ppr_live_memory.py``).

Measured with :func:`benchmark` (Amazon Computers, 13,752 nodes, 491,722 edges, default
:class:`PPRConfig`, 40 single-edge updates: additions of random pairs alternating with removals
of uniformly drawn edges; the 2-vCPU VM, 2026-11-27 15:05 UTC, each row one call, the two
settings of ``peaks`` one after the other; the milliseconds are noisy, the recomputed counts are not):

====  ==========  =====  ===========================  ===============  =========
K     tol_factor  peaks  ms median / mean / max       recomputed       push (ms)
                                                      median / max
====  ==========  =====  ===========================  ===============  =========
64    1           no     58.5 / 123.4 / 599.6         263 / 4072       0.17
64    1           yes    11.3 / 21.8 / 155.3          33 / 545         0.16
64    16          no     2.8 / 5.8 / 40.1             5 / 178          0.19
64    16          yes    2.0 / 2.3 / 6.8              2 / 27           0.17
200   1           no     94.2 / 171.7 / 902.0         262 / 4106       0.25
200   1           yes    16.8 / 29.2 / 179.7          35 / 547         0.23
200   16          no     4.7 / 8.8 / 61.2             5 / 183          0.25
200   16          yes    3.6 / 4.2 / 12.5             2 / 28           0.26
====  ==========  =====  ===========================  ===============  =========

The ``l1`` rule (no peaks) recomputed 9,695 lists at the median, 7.4 s per update (10 updates, an
earlier day). A bulk edit of 1,000 random added edges recomputes 13,453 of the 13,752 lists with
the peaks or without (about 4.4 s either way); the edit itself (:func:`kernels.graph_edit.apply_edit`)
0.4 to 0.7 ms.

The expensive updates touch low-degree nodes (a degree-1 node gaining an edge halves its row).
On 40 added edges (half at a node of degree <= 5) and 200 targets next to them (2026-11-27, K = 64,
recall of the exact top 64 of the final graph, largest score error over the listed nodes in units of
``eps w(y)``): a fresh push 0.8742 and 0.40; the untouched offline lists 0.8560; the live lists at
``tol_factor`` 1 0.8742 and 0.40 with the peaks (4,885 lists recomputed over the 40 edits) and without
(34,173); at ``tol_factor`` 16 0.8741 and 1.61 with the peaks (212 recomputed), 0.8741 and 0.86
without (856).

Stale lists
-----------
The pushes of (b) are most of an update's cost, and an edge at a low-degree node flags hundreds to
thousands of sources (a degree-1 node gaining an edge halves its row). With ``eager_lists`` an edit
pushes at most that many of its flagged sources itself, those whose accumulated bound is largest,
and marks the rest **stale**. A stale list is never answered as stored: :meth:`LivePPRIndex.lookup`
pushes it on the current graph (:meth:`~LivePPRIndex._push`, the call (b) makes), and
:meth:`~LivePPRIndex.prepare_refresh` / :meth:`~LivePPRIndex.install_refresh` store those very
lists later (a server's refresh thread, a chunk at a time, beside the requests and updates; no edit may come
between the two halves, and an edit that does voids the refresh; ``refresh_stats`` counts the lists stored
and voided). The lists a lookup pushed are
handed over too (:meth:`~LivePPRIndex.install_handed` stores those pushed at the current version on
the current graph, without pushing again). So a lookup answers the same list whether a refresh has
stored it yet or not, and a list is never older than the rule allows: a stale one is as fresh as the
graph. Its bound restarts at 0 when stored. A stale source stays dirty (d), so the induced table never
serves it, and stays stale through later edits (it is not among their choice of ``eager_lists``:
otherwise a backlog of stale lists, whose bounds only grow, would take every edit's pushes). The cost
moves to the lookups of a stale target before its refresh: one push each (about 0.2 ms on Amazon
Computers). New nodes always get their lists in the edit. ``None`` (the class's default) keeps every
push in the edit; a server defaults to 128 (``--ppr-eager-lists``).

Dirty targets (c): a target's induced subgraph changes only if its list changes (recomputed) or
an edge between two members changes, which needs a changed row in the list: dirty = recomputed
sources + holders of any changed row + new nodes. A dirty target stays dirty (the table is
never patched); :meth:`ensure_induced` after edits rebuilds the table from the current lists.
"""

# numba cache key: datasets dd10b366f7b3, graph_edit 8790b7a7fe60, ppr_index d19fab9256cf, ppr_push 9fa4796b3dd5, subgraph 47e999493df1

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from .graph import CSRGraph, gather_ranges, index_dtype_for
from .ppr import _SCRATCH_KEY, _SCRATCH_LOCK, PPRConfig, PPRIndex, PPRIndexError, _weighted_degree, ppr_topk
from .ppr_index import inverse_lists
from .ppr_push import _DenseScratch, _give_dense, _push_dense, _take_dense
from .subgraph import InducedTable, SubgraphBatch, induced_batch
from .threads import numba_threads

__all__ = ["LivePPRIndex", "benchmark", "row_change_bounds", "row_change_peaks"]

log = logging.getLogger(__name__)

_TINY = 1e-300  # a pushed node keeps this residue: r == 0 means "never touched"
_RULES = ("node", "l1")
_LOOKUP_CHUNK = 1 << 20  # list entries gathered at a time when all lists are copied (a merge)
_HANDED_MAX = 1 << 22  # list entries lookups' pushes may hold for install_handed (about 50 MB)
# An edit's per-source bound is an integer count of quanta, tol / 2**_QUANTUM_BITS each, every term rounded up
# (never below its value): integer sums are the same in any order, so the reverse pushes run on every worker
# and the result does not depend on how many there are. A term counts at most _UNIT_MAX quanta and a sum
# stops at _SUM_MAX (2**30 tol, far past any tolerance): every addition checks before it adds (_add_units; two
# workers' sums at the cap would wrap).
_QUANTUM_BITS = 32
# the reverse pushes read every list's last score from one gathered array when their work cap allows them this
# many times the node count in pushes (the gather costs one pass over the lists; the same scores either way)
_GATHER_LAST = 0.25
_UNIT_MAX = 1 << 53
_SUM_MAX = 1 << 62


def _spare(cap: int, n: int) -> int:
    """The size to allocate for ``n`` nodes when ``cap`` is too small: an eighth more (and 64), so that a stream
    of new nodes copies a per-node array once per eighth of growth, not once per node."""
    return max(n, cap + cap // 8 + 64)


def _room(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    """``a`` itself when it has ``n`` entries, else a copy with spare room (:func:`_spare`), the rest ``fill``."""
    if n <= len(a):
        return a
    out = np.full(_spare(len(a), n), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


# ============================================================================ compiled kernels
@numba.njit(cache=True, nogil=True)
def _units(term, quantum):  # pragma: no cover - compiled
    """``term`` (> 0) in whole ``quantum``, rounded up, at most ``_UNIT_MAX``: the integer a sum counts."""
    u = np.ceil(term / quantum)  # a float: inf (an infinite coefficient) or past 2**63 is never converted
    return _UNIT_MAX if u >= _UNIT_MAX else np.int64(u)


@numba.njit(cache=True, nogil=True, inline="always")
def _add_units(acc, v, units, seen_list, n):  # pragma: no cover - compiled
    """``acc[v] += units`` (both in ``[0, _SUM_MAX]``), saturating at ``_SUM_MAX`` (checked before adding: two
    sums at the cap would wrap); ``v`` appended to ``seen_list`` at ``n`` when its sum leaves 0. Returns the new
    count. The one rule of every per-source sum: a term, the holders' terms, a worker's sum merged."""
    a0 = acc[v]
    if a0 == 0:
        seen_list[n] = v
        n += 1
    acc[v] = _SUM_MAX if units > _SUM_MAX - a0 else a0 + units
    return n


@numba.njit(cache=True, nogil=True, parallel=True)
def _reverse_accumulate(
    indptr, indices, weights, wdeg, srcs, eps_rs, alpha, lazy, max_pushes, rw, p, queue, touched,
    w_src, coef_src, hptr, hsrc, lp, ls, ostart, olen, a_scores, last, quantum, mark, acc, seen_list, counts, capped,
):  # pragma: no cover - compiled
    """ACL push from each ``srcs[i]`` with threshold ``eps_rs[i] * w(v)`` (``eps_rs[i]`` where
    ``w(v) = 0``), the walk of :func:`kernels.ppr._push_dense`, each push's terms added up at once:
    memory ``O(T N)`` (``T`` workers) however many sources and however far their pushes reach.

    Worker ``t`` runs pushes ``t, t + T, ...`` on its rows of the dense scratch (``rw[t, :, 0]`` the
    residues, ``p[t]``, ``queue[t]``, ``touched[t]``; :class:`kernels.ppr_push._DenseScratch`). For every
    node ``s`` a push touched whose list does not hold ``srcs[i]`` (``hsrc[hptr[i]:hptr[i + 1]]`` are the
    sources whose list does, marked in ``mark[t]`` meanwhile): ``est`` = ``p + alpha r`` (a lower bound of
    ``pi_{srcs[i]}(s)``), the term ``min(est * w_src[i] / hat w(s), last score of s's list) * coef_src[i]``
    (``hat w(s) = w(s)``, 1 where ``w(s) = 0``; the last score from the merged lists ``lp``, ``ls`` or,
    where ``ostart[s] >= 0``, the overlay ``a_scores``) and, when it is positive, ``acc[t, s] +=``
    :func:`_units` of it (saturating at ``_SUM_MAX``). Integer sums: the result is the same whatever the
    number of workers and the order of the pushes. Every ``s`` whose ``acc[t, s]`` leaves 0 is appended to
    ``seen_list[t]`` at ``counts[t]`` (advanced); ``capped[t]`` counts worker ``t``'s pushes stopped by
    ``max_pushes``. ``rw[:, :, 0]``, ``p`` and ``mark`` are zero on entry and on return.
    """
    has_w = weights.shape[0] > 0
    has_last = last.shape[0] > 0
    nthreads = acc.shape[0]
    nb = srcs.shape[0]
    for t in prange(nthreads):
        rw_t = rw[t]
        p_t = p[t]
        q_t = queue[t]
        tt = touched[t]
        mark_t = mark[t]
        acc_t = acc[t]
        sl_t = seen_list[t]
        qcap = q_t.shape[0]
        ns = counts[t]
        nc = 0
        for i in range(t, nb, nthreads):
            src = srcs[i]
            eps = eps_rs[i]
            rw_t[src, 0] = 1.0
            tt[0] = src
            nt = 1
            q_t[0] = src
            head = 0
            tail = 1
            qlen = 1
            pushes = 0
            while qlen > 0:
                u = q_t[head]
                head += 1
                if head == qcap:
                    head = 0
                qlen -= 1
                ru = rw_t[u, 0]
                pushes += 1
                wu = wdeg[u]
                if wu <= 0.0:
                    p_t[u] += ru
                    rw_t[u, 0] = _TINY
                else:
                    p_t[u] += alpha * ru
                    rw_t[u, 0] = _TINY
                    spread = (1.0 - alpha) * ru
                    if lazy:
                        spread *= 0.5
                    c = spread / wu
                    for e in range(indptr[u], indptr[u + 1]):
                        v = indices[e]
                        old = rw_t[v, 0]
                        new = old + (c * weights[e] if has_w else c)
                        rw_t[v, 0] = new
                        if old == 0.0 and new != 0.0:  # weight 0: still untouched (listed once at most)
                            tt[nt] = v
                            nt += 1
                        wv = wdeg[v]
                        thr = eps * wv if wv > 0.0 else eps
                        if old < thr and new >= thr:
                            q_t[tail] = v
                            tail += 1
                            if tail == qcap:
                                tail = 0
                            qlen += 1
                    if lazy:
                        old = rw_t[u, 0]
                        new = old + spread
                        rw_t[u, 0] = new
                        thr = eps * wu
                        if old < thr and new >= thr:
                            q_t[tail] = u
                            tail += 1
                            if tail == qcap:
                                tail = 0
                            qlen += 1
                if max_pushes > 0 and pushes >= max_pushes and qlen > 0:
                    nc += 1
                    break
            for h in range(hptr[i], hptr[i + 1]):
                mark_t[hsrc[h]] = True
            wsrc = w_src[i]
            cf = coef_src[i]
            for j in range(nt):
                v = tt[j]
                est = p_t[v] + alpha * rw_t[v, 0]
                rw_t[v, 0] = 0.0
                p_t[v] = 0.0
                if mark_t[v]:
                    continue
                wv = wdeg[v]
                term = est * wsrc
                term = term / (wv if wv > 0.0 else 1.0)
                if has_last:
                    lv = last[v]
                else:
                    o = ostart[v]
                    if o < 0:
                        lv = np.float64(ls[max(lp[v + 1] - 1, lp[v])])
                    else:
                        lv = np.float64(a_scores[o + max(olen[v] - 1, 0)])
                if lv < term:
                    term = lv
                term = term * cf
                if term > 0.0:
                    ns = _add_units(acc_t, v, _units(term, quantum), sl_t, ns)
            for h in range(hptr[i], hptr[i + 1]):
                mark_t[hsrc[h]] = False
        counts[t] = ns
        capped[t] = nc


@numba.njit(cache=True, nogil=True)
def _accumulate(acc, s, w, quantum, seen_list, counts):  # pragma: no cover - compiled
    """``acc[s[j]] +=`` :func:`_units` of ``w[j]`` (> 0; saturating at ``_SUM_MAX``), appending each ``s[j]``
    whose ``acc`` leaves 0 to ``seen_list`` at ``counts[0]`` (advanced)."""
    for j in range(s.shape[0]):
        if w[j] > 0.0:
            counts[0] = _add_units(acc, s[j], _units(w[j], quantum), seen_list, counts[0])


@numba.njit(cache=True, nogil=True)
def _merge_sums(acc, seen_list, counts):  # pragma: no cover - compiled
    """Add every worker's sums into worker 0's (``acc[0]``, ``seen_list[0]``, ``counts[0]``), saturating at
    ``_SUM_MAX``; the other workers' sums and counts back to 0."""
    sl0 = seen_list[0]
    acc0 = acc[0]
    n0 = counts[0]
    for t in range(1, acc.shape[0]):
        acc_t = acc[t]
        sl_t = seen_list[t]
        for j in range(counts[t]):
            v = sl_t[j]
            n0 = _add_units(acc0, v, acc_t[v], sl0, n0)
            acc_t[v] = 0
        counts[t] = 0
    counts[0] = n0


@numba.njit(cache=True, parallel=True)
def _push_peaks(
    indptr, indices, weights, wdeg, srcs, alpha, lazy, teleport, rw, p, queue, touched, own, plain
):  # pragma: no cover - compiled
    """For each ``srcs[i]``, the push of :func:`kernels.ppr_push._push_dense` on worker ``w``'s dense
    scratch (targets ``w, w + T, ...``, as :func:`kernels.ppr_push._ppr_batch`) and over the nodes it
    touched, with ``est = p + alpha r`` (the lists' estimate) and ``hat w = w`` where positive, else 1:
    ``plain[i] = max_y est(y) / hat w(y)``, ``own[i] = max_y |est(y) - teleport [y == src]| / hat w(y)``.
    The scratch is zero on entry and on return (the push thresholds in ``rw[:, :, 1]`` untouched)."""
    nthreads = rw.shape[0]
    nb = srcs.shape[0]
    no_nb = np.zeros(0, dtype=np.int64)
    no_w = np.zeros(0, dtype=np.float64)
    for w in prange(nthreads):
        rw_w = rw[w]
        p_w = p[w]
        t_w = touched[w]
        for i in range(w, nb, nthreads):
            src = srcs[i]
            nt, _ = _push_dense(indptr, indices, weights, wdeg, src, alpha, lazy, 0, rw_w, p_w, queue[w], t_w, no_nb,
                                no_w, 0.0)
            mp = 0.0
            mo = 0.0
            for j in range(nt):
                v = t_w[j]
                est = p_w[v] + alpha * rw_w[v, 0]
                hw = wdeg[v] if wdeg[v] > 0.0 else 1.0
                q = est / hw
                if q > mp:
                    mp = q
                if v == src:
                    est -= teleport
                q = abs(est) / hw
                if q > mo:
                    mo = q
                rw_w[v, 0] = 0.0
                p_w[v] = 0.0
            plain[i] = mp
            own[i] = mo


# ============================================================================ the perturbation bound
def _row_entries(graph: CSRGraph, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(row index into rows, column, raw weight)`` of the rows' entries (weight 1 where unweighted), float64."""
    deg = graph.degrees_of(rows)
    _, pos = gather_ranges(graph.indptr[rows], deg)
    ri = np.repeat(np.arange(len(rows), dtype=np.int64), deg)
    col = np.asarray(graph.indices[pos], dtype=np.int64)
    w = np.asarray(graph.weights[pos], dtype=np.float64) if graph.weights is not None else np.ones(len(pos))
    return ri, col, w


def _row_distribution(graph: CSRGraph, rows: np.ndarray, wdeg: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(row index into rows, column, P value)`` of the transition rows ``P_u`` (``e_u`` when ``w(u) = 0``)."""
    ri, col, w = _row_entries(graph, rows)
    wd = wdeg[rows]
    val = w / np.where(wd > 0, wd, 1.0)[ri]
    stay = np.flatnonzero(wd <= 0)  # the walk stays at a node without out-weight
    if len(stay):
        keep = wd[ri] > 0
        ri = np.concatenate([ri[keep], stay])
        col = np.concatenate([col[keep], rows[stay]])
        val = np.concatenate([val[keep], np.ones(len(stay))])
    return ri, col, val


def _row_difference(new: tuple[np.ndarray, ...], old: tuple[np.ndarray, ...], n2: int) -> tuple[np.ndarray, ...]:
    """``new - old`` of two ``(row index, column, value)`` entry sets over ``n2`` columns: ``(row index, column,
    difference)`` for every (row, column) in either, sorted; each difference summed in the order new, old."""
    (ri1, c1, v1), (ri0, c0, v0) = new, old
    key = np.concatenate([ri1 * n2 + c1, ri0 * n2 + c0])
    val = np.concatenate([v1, -v0])
    order = np.argsort(key, kind="stable")
    key, val = key[order], val[order]
    if not len(key):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    diff = np.add.reduceat(val, starts)
    ukey = key[starts]
    return ukey // n2, ukey % n2, diff


def row_change_bounds(old_graph: CSRGraph, new_graph: CSRGraph, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per changed row ``u`` (ids of ``old_graph``): ``(||Delta_u||_1, m_u = max_x |Delta_u(x)| / hat w'(x))``.

    ``Delta_u = P'_u - P_u`` (module docstring), float64 each. Vectorized over the rows' entries.
    """
    rows = np.asarray(rows, dtype=np.int64)
    n2 = new_graph.num_nodes
    wd_new = _weighted_degree(new_graph)
    ri, x, delta = _row_difference(
        _row_distribution(new_graph, rows, wd_new), _row_distribution(old_graph, rows, _weighted_degree(old_graph)), n2
    )
    what = wd_new[x]
    what = np.where(what > 0, what, 1.0)
    k = len(rows)
    l1 = np.bincount(ri, weights=np.abs(delta), minlength=k)
    mx = np.zeros(k)
    np.maximum.at(mx, ri, np.abs(delta) / what)
    return l1, mx


def _row_change_weights(old_graph: CSRGraph, new_graph: CSRGraph, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(row index into rows, column, C value)`` of ``C_u = W'_u - W_u``, the change of each row's raw
    weights (new minus old, 1 per edge where unweighted), its non-zero entries only, float64."""
    ri, col, c = _row_difference(_row_entries(new_graph, rows), _row_entries(old_graph, rows), new_graph.num_nodes)
    nz = c != 0.0  # an unchanged weight cancels exactly (the same float32, cast)
    return ri[nz], col[nz], c[nz]


def row_change_peaks(
    old_graph: CSRGraph, new_graph: CSRGraph, rows: np.ndarray, cfg: PPRConfig, *, max_pushes: int | None = None
) -> np.ndarray:
    """Per changed row ``u`` (ids of ``old_graph``): an upper bound of ``max_y |(Delta_u Pi')(y)| / hat w'(y)``,
    which replaces ``m_u`` in the node bound (module docstring, "The edit's own pushes"), float64.

    One push per node in the changed rows and their changed entries, on ``new_graph`` at ``cfg.eps``
    (in parallel on the numba threads, on the graph's pooled dense scratch); each push only yields two
    maxima, so memory is the scratch's however many rows change. With more than ``max_pushes`` such
    nodes nothing is pushed and every bound is ``inf``.
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(len(rows))
    if not len(rows):
        return out
    a, eps = cfg.teleport, cfg.eps
    d_old = _weighted_degree(old_graph)[rows]
    d_new = _weighted_degree(new_graph)[rows]
    ci, cx, cv = _row_change_weights(old_graph, new_graph, rows)
    was = d_old > 0
    srcs = np.unique(np.concatenate([rows, cx[was[ci]]]))  # rows: own (d' > 0) or plain (d = 0) vectors
    if max_pushes is not None and len(srcs) > max_pushes:
        return np.full(len(rows), np.inf)
    own = np.zeros(len(srcs))
    plain = np.zeros(len(srcs))
    threads = numba_threads()
    sc = _take_dense(new_graph, threads, eps)
    try:
        w = new_graph.weights if new_graph.weights is not None else np.zeros(0, dtype=np.float32)
        _push_peaks(new_graph.indptr, new_graph.indices, w, _weighted_degree(new_graph), srcs, cfg.alpha,
                    cfg.lazy, a, sc.rw, sc.p, sc.queue, sc.touched, own, plain)  # fmt: skip
    finally:
        _give_dense(new_graph, sc)
    # each estimate is within eps hat w'(y) below its vector: + eps per unit of coefficient
    own_u = own[np.searchsorted(srcs, rows)] + eps
    plain_u = plain[np.searchsorted(srcs, rows)] + eps
    d_safe = np.where(was, d_old, 1.0)
    # Delta_u Pi' = (1 - d'/d) P'_u Pi' + C_u Pi' / d  (d > 0), P'_u Pi' = (pi'_u - a e_u) / (1 - a) (d' > 0, else e_u)
    # Delta_u Pi' = P'_u Pi' - pi'_u                                       (d = 0: the walk stayed at u)
    first = np.where(d_new > 0, np.abs(1.0 - d_new / d_safe) * own_u / (1.0 - a), 1.0)
    out[:] = np.where(was, first, own_u / (1.0 - a) + plain_u)
    sel = was[ci]
    terms = np.abs(cv[sel]) / d_safe[ci[sel]] * (plain[np.searchsorted(srcs, cx[sel])] + eps)
    out += np.bincount(ci[sel], weights=terms, minlength=len(rows))
    return out


class _Sums:
    """The per-source sums of one :meth:`LivePPRIndex.prepare`, for ``n`` nodes and ``threads`` workers, kept
    between edits: ``acc`` (int64 ``[threads, n]``, quanta: :func:`_reverse_accumulate`, zero), ``mark`` (bool,
    False), ``seen_list`` (``[threads, n]``, the sources each worker's sum left 0 at, ``counts`` of each).
    The reverse pushes' dense state is the graph's pooled push scratch (:func:`kernels.ppr_push._take_dense`)."""

    def __init__(self, n: int, threads: int) -> None:
        self.n = n
        self.threads = threads
        self.acc = np.zeros((threads, n), dtype=np.int64)
        self.mark = np.zeros((threads, n), dtype=np.bool_)
        self.seen_list = np.empty((threads, n), dtype=index_dtype_for(n))
        self.counts = np.zeros(threads, dtype=np.int64)

    def reset(self, seen: np.ndarray) -> None:
        """Back to the state above, given the merged sums' entries (``seen_list[0]``, what the caller read)."""
        self.acc[0, seen] = 0
        self.counts[:] = 0


# ============================================================================ the live index
class LivePPRIndex:
    """The offline top-K lists of ``base`` plus the lists recomputed after graph edits.

    Serves the :class:`kernels.ppr.PPRIndex` interface the server uses; call :meth:`apply` after
    every structural edit (module docstring: the recompute rule, its cost, the dirty targets).

    Args:
        base: the offline index (never written; may be memory-mapped).
        tol_factor: recompute a source when its accumulated bound exceeds ``tol_factor * config.eps``.
            1 (the default) keeps every list as good as a push at ``2 eps``; it recomputes a few
            hundred sources per edge on Amazon Computers (100s of ms on 2 cores, seconds at the
            tail). 16 keeps updates at tens of ms there with the same measured recall (module
            docstring).
        rule: ``"node"`` (per-node bound, default) or ``"l1"`` (L1 bound); module docstring.
        reverse_max_pushes: work cap of each reverse push (0: none).
        reverse_total_pushes: work cap of all reverse pushes of one :meth:`apply`, shared among its
            changed rows (0: none): a bulk edit then estimates only near sources.
        merge_fraction: merge the overlay into the lists when it holds more than this fraction of
            the lists' entries (plus a floor of ``64 k_max`` entries).
        push_chunk: targets per :func:`kernels.ppr.ppr_topk` call when recomputing lists (its padded
            result arrays take ``16 K`` bytes per target; the results do not depend on it).
        peaks: with the node rule, bound each changed row's effect with pushes from the changed rows
            on the new graph (:func:`row_change_peaks`; module docstring, "The edit's own pushes"):
            about 6x tighter on Amazon Computers, where a single edge then recomputes 33 lists at the
            median instead of 263. ``False`` keeps the bound of the rows alone.
        eager_lists: how many existing sources one edit may push again itself (those whose bound moved
            most); the rest of the sources it flags are marked *stale* (module docstring, "Stale
            lists"): :meth:`lookup` pushes a stale list on the current graph itself, and
            :meth:`prepare_refresh` / :meth:`install_refresh` store them later (a server's refresh
            thread). ``None`` (the default here): every flagged source in the
            edit. New nodes always get their lists in the edit.

    Attributes:
        last_recomputed: int64, the existing sources the last :meth:`apply` recomputed.
        last_new: int64, the new nodes it gave lists.
        last_dirty: int64, the targets it marked dirty.
        last_deferred: int64, the sources it flagged and left stale (beyond ``eager_lists``).
    """

    def __init__(
        self,
        base: PPRIndex,
        *,
        tol_factor: float = 1.0,
        rule: str = "node",
        reverse_max_pushes: int = 200_000,
        reverse_total_pushes: int = 2_000_000,
        merge_fraction: float = 0.25,
        push_chunk: int = 8192,
        peaks: bool = True,
        eager_lists: int | None = None,
    ) -> None:
        if rule not in _RULES:
            raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")
        if not float(tol_factor) > 0:
            raise ValueError(f"tol_factor must be > 0, got {tol_factor}")
        self.base = base
        self.config: PPRConfig = base.config
        self.tol_factor = float(tol_factor)
        self.rule = rule
        self.reverse_max_pushes = int(reverse_max_pushes)
        self.reverse_total_pushes = int(reverse_total_pushes)
        self.merge_fraction = float(merge_fraction)
        if int(push_chunk) < 1:
            raise ValueError(f"push_chunk must be >= 1, got {push_chunk}")
        self.push_chunk = int(push_chunk)
        self.peaks = bool(peaks)
        if eager_lists is not None and int(eager_lists) < 0:
            raise ValueError(f"eager_lists must be >= 0 or None, got {eager_lists}")
        self.eager_lists = None if eager_lists is None else int(eager_lists)
        self.num_nodes = base.num_nodes
        self.path = base.path
        self.meta = base.meta
        self._graph: CSRGraph | None = None  # the graph after the last apply (None: base's graph)
        self._fingerprint: str | None = base.fingerprint
        # merged lists (the base's arrays until the first merge)
        # (ptr, nodes, scores), swapped as one tuple so a reader never mixes two generations
        self._lists: tuple[np.ndarray, np.ndarray, np.ndarray] = (
            np.asarray(base.ptr), np.asarray(base.nodes), np.asarray(base.scores))
        self._base_nodes = self._lists[1]  # the lists are the base's until the first merge
        self._version = 0  # bumped by every apply
        self._mat: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        # overlay: node v's list is arena[ostart[v] : ostart[v] + olen[v]] when ostart[v] >= 0
        n = base.num_nodes
        self._ostart = np.full(n, -1, dtype=np.int64)
        self._olen = np.zeros(n, dtype=np.int64)
        self._a_nodes = np.zeros(0, dtype=np.int64)
        self._a_scores = np.zeros(0, dtype=np.float32)
        self._a_owner = np.zeros(0, dtype=np.int64)
        self._a_fill = 0
        self._inv: tuple[np.ndarray, np.ndarray] | None = None
        self._dirty = np.zeros(n, dtype=bool)
        # bound accumulated since a list was computed; a compaction's lists carry the writer's (as_index), so that a
        # start from its snapshot recomputes after later edits the very lists the writer does (not the drift of 0
        # of lists just pushed: another set, answers apart within the tolerance)
        base_drift = getattr(base, "drift", None)
        self._drift = np.zeros(n, dtype=np.float64) if base_drift is None else np.array(base_drift, dtype=np.float64)
        #: sources whose stored list an edit flagged but did not push again (eager_lists): never served as
        #: stored (lookup pushes them on the current graph), always dirty; _n_stale counts them
        self._stale = np.zeros(n, dtype=bool)
        self._n_stale = 0
        #: lists refreshed or handed over: stored, or voided by an edit that came between push and store
        self.refresh_stats = {"stored": 0, "voided": 0}
        #: lookups' pushes of stale lists, (version, graph, ids, ptr, nodes, scores), for install_handed
        self._handed: list[tuple[Any, ...]] = []
        self._handed_entries = 0
        self._handed_lock = threading.Lock()
        #: called after a lookup handed lists over (a server rings its refresh thread)
        self.on_handed: Callable[[], None] | None = None
        self._table: InducedTable | None = None  # a table built after edits (else base.induced)
        self._sums: _Sums | None = None  # prepare's scratch: the per-source sums, the reverse push's state
        self.last_recomputed = np.zeros(0, dtype=np.int64)
        self.last_new = np.zeros(0, dtype=np.int64)
        self.last_dirty = np.zeros(0, dtype=np.int64)
        self.last_deferred = np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ PPRIndex interface
    @property
    def k_max(self) -> int:
        return self.config.topk

    def __len__(self) -> int:
        return self.num_nodes

    def __repr__(self) -> str:
        return (f"LivePPRIndex(N={self.num_nodes}, k_max={self.k_max}, overlay={int(np.count_nonzero(self._ostart >= 0))}, "
                f"dirty={int(self._dirty.sum())}, stale={self._n_stale}, rule={self.rule}, tol_factor={self.tol_factor}, base={self.base!r})")  # fmt: skip

    @property
    def fingerprint(self) -> str:
        """Fingerprint of the graph the lists now belong to (the base's until the first edit;
        computed on first access after an edit, O(E))."""
        if self._fingerprint is None:
            assert self._graph is not None
            self._fingerprint = self._graph.fingerprint()
        return self._fingerprint

    def as_index(self) -> PPRIndex:
        """The current lists, stale ones pushed now, as an offline :class:`PPRIndex` of the current graph (in
        memory: :meth:`PPRIndex.save` writes it). A server compacting its update log saves it beside the
        graph's snapshot, so that its next start opens these lists instead of pushing from every node of the
        snapshot's graph (a QA report: 15 minutes at 1 M nodes). No edit may run meanwhile (the writer)."""
        ptr, nodes, scores = self._all_lists(stored=False)
        meta = {"from_live": {"base": self.base.fingerprint, "edits": self._version}}
        drift = np.zeros(self.num_nodes, dtype=np.float64)
        m = min(self.num_nodes, len(self._drift))
        drift[:m] = self._drift[:m]
        if self._n_stale:  # pushed now, as stored ones: their move restarts at 0 (what a refresh stores)
            drift[self._stale[: self.num_nodes]] = 0.0
        return PPRIndex(self.config, self.fingerprint, ptr, nodes, scores, meta=meta, drift=drift)

    def check_graph(self, graph: CSRGraph | str) -> None:
        """Raise :class:`kernels.ppr.PPRIndexError` unless the lists belong to ``graph``."""
        if self._graph is not None and graph is self._graph:
            return
        fp = graph.fingerprint() if isinstance(graph, CSRGraph) else str(graph)
        if fp != self.fingerprint:
            raise PPRIndexError(f"live PPR index follows graph {self.fingerprint}, used with graph {fp}")

    @property
    def induced(self) -> InducedTable | None:
        """The precomputed induced table in use (the base's, or one rebuilt by :meth:`ensure_induced`)."""
        return self._table if self._table is not None else self.base.induced

    def _materialised(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mat = self._mat
        if mat is None or mat[0] != self._version:
            arrays = self._lists
            if self._n_stale or np.any(self._ostart >= 0):
                arrays = self._all_lists(stored=False)  # a stale list pushed now (what a refresh stores)
            mat = (self._version, arrays)
            self._mat = mat
        return mat[1]

    @property
    def ptr(self) -> np.ndarray:
        """All current lists as CSR (``nodes/scores[ptr[v]:ptr[v + 1]]``), like :attr:`PPRIndex.ptr`:
        the base's arrays until an edit, then a copy built on first access after each edit (O(N K))."""
        return self._materialised()[0]

    @property
    def nodes(self) -> np.ndarray:
        return self._materialised()[1]

    @property
    def scores(self) -> np.ndarray:
        return self._materialised()[2]

    def lookup(
        self, targets: np.ndarray | Sequence[int] | int, k: int | None = None, *, return_scores: bool = False
    ) -> tuple[np.ndarray, ...]:
        """The first ``k`` entries of each target's current list; the contract of :meth:`PPRIndex.lookup`.

        One target is one slice (of the merged lists or of the overlay); a batch is two gathers. A stale
        target's list (``eager_lists``) is pushed now on the current graph: the list a refresh stores. Not safe
        beside :meth:`install`, :meth:`install_refresh` or :meth:`install_handed` (a server runs those under its
        graph's write lock, a batch's lookups under the read lock): a lookup beside a refresh's store may read a
        list's old entries and its cleared stale flag.
        """
        k = self.k_max if k is None else int(k)
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k must lie in [1, k_max={self.k_max}], got {k}")
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        out = self._stored(t, k, return_scores)
        if self._n_stale:
            stale = self._stale[t]
            if stale.any():
                return self._with_fresh(t, k, stale, out, return_scores)
        return out

    def _with_fresh(
        self, t: np.ndarray, k: int, stale: np.ndarray, out: tuple[np.ndarray, ...], return_scores: bool,
        fresh: tuple[np.ndarray, ...] | None = None,
    ) -> tuple[np.ndarray, ...]:
        """``out`` (the stored lists of ``t``) with the lists of the ``stale`` targets pushed on the current
        graph instead: :meth:`_push`, the same call a refresh makes, so the same lists. ``fresh``: those
        pushes made already, ``(sorted ids, ptr, nodes, scores)`` covering the stale targets."""
        if fresh is None:
            version, graph = self._version, self._graph  # one state: no install runs beside a lookup
            assert graph is not None  # stale lists exist only after an edit
            ft, inv = np.unique(t[stale], return_inverse=True)
            fp, fn, fs = self._push(graph, ft)
            self._hand(version, graph, ft, fp, fn, fs)
        else:
            ft, fp, fn, fs = fresh
            inv = np.searchsorted(ft, t[stale])
        optr = out[0]
        cnt = np.diff(optr)
        starts = optr[:-1].copy()
        pos = np.flatnonzero(stale)
        cnt[pos] = np.minimum(np.diff(fp), k)[inv]
        starts[pos] = len(out[1]) + fp[:-1][inv]
        nptr, idx = gather_ranges(starts, cnt)
        nodes = np.concatenate([out[1], fn.astype(np.int64, copy=False)])[idx]
        if return_scores:
            return nptr, nodes, np.concatenate([out[2], fs.astype(np.float32, copy=False)])[idx]
        return nptr, nodes

    def _stored(self, t: np.ndarray, k: int, return_scores: bool) -> tuple[np.ndarray, ...]:
        """:meth:`lookup` of the stored lists (a stale one as it was stored)."""
        n = self.num_nodes
        lp, ln, ls = self._lists
        if len(t) == 1:
            v = int(t[0])
            if not 0 <= v < n:
                raise ValueError(f"targets must lie in [0, {n})")
            o = int(self._ostart[v])
            if o < 0:
                lo = int(lp[v])
                cnt = min(int(lp[v + 1]) - lo, k)
                nodes, src_s, lo_s = ln[lo : lo + cnt].astype(np.int64), ls, lo
            else:
                cnt = min(int(self._olen[v]), k)
                nodes, src_s, lo_s = self._a_nodes[o : o + cnt].copy(), self._a_scores, o
            optr = np.array([0, cnt], dtype=np.int64)
            if return_scores:
                return optr, nodes, np.asarray(src_s[lo_s : lo_s + cnt], dtype=np.float32)
            return optr, nodes
        if len(t) and (int(t.min()) < 0 or int(t.max()) >= n):
            raise ValueError(f"targets must lie in [0, {n})")
        o = self._ostart[t]
        over = o >= 0
        if not over.any():
            start = lp[t]
            cnt = np.minimum(lp[t + 1] - start, k)
            optr, idx = gather_ranges(start, cnt)
            nodes = ln[idx].astype(np.int64)
            if return_scores:
                return optr, nodes, np.asarray(ls[idx], dtype=np.float32)
            return optr, nodes
        tb = np.where(over, 0, t)
        start = np.where(over, o, lp[tb])
        length = np.where(over, self._olen[t], lp[tb + 1] - lp[tb])
        cnt = np.minimum(length, k)
        optr, idx = gather_ranges(start, cnt)
        fa = np.repeat(over, cnt)
        nodes = np.empty(len(idx), dtype=np.int64)
        nodes[~fa] = ln[idx[~fa]]
        nodes[fa] = self._a_nodes[idx[fa]]
        if return_scores:
            scores = np.empty(len(idx), dtype=np.float32)
            scores[~fa] = ls[idx[~fa]]
            scores[fa] = self._a_scores[idx[fa]]
            return optr, nodes, scores
        return optr, nodes

    def induced_batch(
        self, graph: CSRGraph, targets: np.ndarray | Sequence[int], k: int | None = None
    ) -> SubgraphBatch:
        """The block-diagonal batch of the targets' top-``k`` subgraphs on ``graph`` (the current graph).

        From the induced table when it covers ``k`` and no target is dirty; otherwise (any dirty
        target, a new node, no table) the whole batch is induced from the graph. Same result.
        """
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        ptr, nodes = self.lookup(t, k)
        table = self._table if self._table is not None else self.base.induced
        if table is not None and (self.k_max if k is None else int(k)) <= table.k and len(t):
            if len(t) == 1:  # a one-node request: scalar checks (an array check costs microseconds each)
                v = int(t[0])
                clean = v < table.num_nodes and not self._dirty[v]
            else:
                clean = int(t.max()) < table.num_nodes and not self._dirty[t].any()
            if clean:
                if graph.num_nodes == table.num_nodes:
                    return table.batch(graph, t, ptr, nodes, checked=True)
                return table._batch(graph, t, ptr, nodes)  # clean lists only hold nodes the table knows
        return induced_batch(graph, ptr, nodes)

    def prefetch(self) -> int:
        """:meth:`kernels.ppr_index.PPRIndex.prefetch` of the offline index under the live one."""
        return int(self.base.prefetch()) if hasattr(self.base, "prefetch") else 0

    def ensure_induced(
        self, graph: CSRGraph, *, max_bytes: int = 1 << 30, k: int | None = None, progress: bool = False
    ) -> bool:
        """Before any edit: :meth:`PPRIndex.ensure_induced` of the base. After edits: build a table of
        the current lists on the current ``graph`` (in memory; refused above ``max_bytes`` by the
        same 256-node estimate) and clear the dirty marks. Returns whether a table is attached."""
        if self._graph is None:
            return self.base.ensure_induced(graph, max_bytes=max_bytes, k=k, progress=progress)
        self.check_graph(graph)
        k = self.k_max if k is None else int(k)
        if not 1 <= k <= min(self.k_max, InducedTable.MAX_K):
            raise ValueError(f"k must lie in [1, {min(self.k_max, InducedTable.MAX_K)}], got {k}")
        n = self.num_nodes
        if n == 0:
            return False
        sample = np.random.default_rng(0).choice(n, size=min(n, 256), replace=False)
        per_edge = 8 if graph.is_weighted else 4
        est = induced_batch(graph, *self.lookup(sample, k)).graph.num_edges / len(sample) * n * per_edge
        if est + 8 * (n + 1) > max_bytes:
            log.info("live induced table for k=%d skipped: about %.0f MiB", k, est / 2**20)
            return False
        self._table = InducedTable.build(graph, self.lookup, k, progress=progress)
        self._dirty[:] = False
        self._dirty[: len(self._stale)] |= self._stale  # a stale list is pushed at each lookup: never the table's
        return True

    def is_stale(self, targets: np.ndarray | Sequence[int] | int) -> np.ndarray:
        """Whether each target's list is stale (``eager_lists``: pushed at each lookup until refreshed)."""
        return self._stale[np.asarray(targets, dtype=np.int64).reshape(-1)]

    def is_dirty(self, targets: np.ndarray | Sequence[int] | int) -> np.ndarray:
        """Whether each target's induced subgraph may differ from the table's (bool array)."""
        return self._dirty[np.asarray(targets, dtype=np.int64).reshape(-1)]

    # ------------------------------------------------------------------ the update
    def apply(
        self, old_graph: CSRGraph, new_graph: CSRGraph, changed_rows: np.ndarray, new_ids: np.ndarray
    ) -> dict[str, int]:
        """Bring the lists up to date after an edit ``old_graph -> new_graph``: :meth:`prepare` then
        :meth:`install` (``prepare``'s arguments and ``install``'s result)."""
        return self.install(self.prepare(old_graph, new_graph, changed_rows, new_ids))

    def prepare(
        self, old_graph: CSRGraph, new_graph: CSRGraph, changed_rows: np.ndarray, new_ids: np.ndarray
    ) -> dict[str, Any]:
        """The expensive half of :meth:`apply`, which lookups may run beside (a server keeps answering
        from the old lists meanwhile): which sources to push again (module docstring) and their fresh
        lists on ``new_graph``. Call :meth:`install` with the result before the next ``prepare``.

        Args:
            old_graph: the graph the lists followed so far (``num_nodes`` = this index's).
            new_graph: the edited graph.
            changed_rows: rows whose neighbour list or weights changed (``EditEffect.changed_rows``).
            new_ids: the new nodes' ids (``EditEffect.new_ids``), ``N .. N + m - 1``.

        Returns what :meth:`install` takes.
        """
        t0 = time.perf_counter()
        cfg = self.config
        n_old = self.num_nodes
        new_ids = np.asarray(new_ids, dtype=np.int64).reshape(-1)
        if old_graph.num_nodes != n_old:
            raise ValueError(f"old_graph has {old_graph.num_nodes} nodes, the live index {n_old}")
        if new_graph.num_nodes != n_old + len(new_ids) or (
            len(new_ids) and not np.array_equal(new_ids, np.arange(n_old, new_graph.num_nodes))
        ):
            raise ValueError(f"new_ids must be {n_old} .. {new_graph.num_nodes - 1} (new_graph's added nodes)")
        changed = np.unique(np.asarray(changed_rows, dtype=np.int64).reshape(-1))
        if len(changed) and (int(changed[0]) < 0 or int(changed[-1]) >= new_graph.num_nodes):
            raise ValueError("changed_rows must be node ids of new_graph")
        self._carry_scratch(old_graph, new_graph, changed)
        rows = changed[changed < n_old]
        recompute = deferred = np.zeros(0, dtype=np.int64)
        holders = np.zeros(0, dtype=np.int64)
        candidates = capped = 0
        drift_at: tuple[np.ndarray, np.ndarray] | None = None
        if len(rows):
            coef = self._coefficients(old_graph, new_graph, rows)
            hs, hx, hsc = self._holders(rows)
            holders = hs
            # B_s summed per source in dense accumulators, one per worker, in whole quanta (the holders' terms,
            # then the reverse pushes' on every worker, then the workers' sums added): O(T N) memory however many
            # terms, and integer sums, the same whatever the order and the number of workers. The accumulators
            # are kept from edit to edit (_Sums): only their touched entries are reset, no O(N) array is
            # allocated or scanned per edit.
            threads = numba_threads()
            sc = self._sums_for(n_old, threads)
            self._sums = None  # held by this edit; given back once reset (an exception drops it)
            quantum = math.ldexp(self.tol_factor * cfg.eps, -_QUANTUM_BITS)
            _accumulate(sc.acc[0], hs, hsc.astype(np.float64) * coef[hx], quantum, sc.seen_list[0], sc.counts)
            capped = self._reverse_terms(old_graph, new_graph, rows, coef, hs, hx, sc, quantum)
            _merge_sums(sc.acc, sc.seen_list, sc.counts)
            uniq = np.sort(sc.seen_list[0, : sc.counts[0]]).astype(np.int64)
            if len(uniq):
                # the bound of this edit on top of what earlier edits already moved the list
                drift = self._drift[uniq] + sc.acc[0, uniq].astype(np.float64) * quantum
                drift_at = (uniq, drift)  # stored by install: a prepare thrown away changes nothing
                candidates = len(uniq)
                # an already stale list stays so (lookups push it; the refresh stores it), outside the choice
                over = (drift > self.tol_factor * cfg.eps) & ~self._stale[uniq]
                recompute = uniq[over]
                eager = self.eager_lists
                if eager is not None and len(recompute) > eager:  # the most moved now, the rest stale
                    order = np.argsort(-drift[over], kind="stable")
                    deferred = np.sort(recompute[order[eager:]])
                    recompute = np.sort(recompute[order[:eager]])
            sc.reset(uniq)
            self._sums = sc
        targets = np.concatenate([recompute, new_ids])
        lists = self._push(new_graph, targets) if len(targets) else None
        return {"new_graph": new_graph, "recompute": recompute, "new_ids": new_ids, "holders": holders,
                "targets": targets, "deferred": deferred, "lists": lists, "candidates": candidates,
                "capped": capped, "t0": t0, "drift_at": drift_at}

    def install(self, prep: dict[str, Any]) -> dict[str, int]:
        """Make :meth:`prepare`'s lists the ones lookups see (no lookup may run meanwhile: the server's
        write lock). Returns ``{"recomputed", "new", "deferred", "stale", "dirty", "candidates",
        "reverse_capped", "microseconds"}``: existing sources recomputed, new nodes given lists, sources
        flagged and left stale (``eager_lists``), stale sources now, targets newly marked dirty, sources
        whose bound was evaluated, reverse pushes stopped by the work cap, the time taken by both
        halves."""
        new_graph, recompute, new_ids = prep["new_graph"], prep["recompute"], prep["new_ids"]
        holders, targets, deferred, t0 = prep["holders"], prep["targets"], prep["deferred"], prep["t0"]
        candidates, capped = prep["candidates"], prep["capped"]
        self._grow_to(new_graph.num_nodes)
        self._drift_grow(new_graph.num_nodes)
        if prep["drift_at"] is not None:  # the bounds this edit added, then 0 for the lists pushed again
            ids, drift = prep["drift_at"]
            self._drift[ids] = drift
        self._drift[targets] = 0.0
        if prep["lists"] is not None:
            ptr, nodes, scores = prep["lists"]
            self._store(targets, ptr, nodes, scores)
        self._set_stale(targets, False)
        self._set_stale(deferred, True)
        marked = np.unique(np.concatenate([holders, targets, deferred]))
        fresh = marked[~self._dirty[marked]]
        self._dirty[marked] = True
        self._graph = new_graph
        self._fingerprint = None
        self.num_nodes = new_graph.num_nodes
        self.last_recomputed, self.last_new, self.last_dirty = recompute, new_ids, fresh
        self.last_deferred = deferred
        self._version += 1
        self._merge_if_large()
        return {
            "recomputed": len(recompute),
            "new": len(new_ids),
            "deferred": len(deferred),
            "stale": self._n_stale,
            "dirty": len(fresh),
            "candidates": int(candidates),
            "reverse_capped": int(capped),
            "microseconds": int((time.perf_counter() - t0) * 1e6),
        }

    # ------------------------------------------------------------------ stale lists
    @property
    def stale_count(self) -> int:
        """Sources whose list an edit left stale (``eager_lists``): pushed at each lookup until refreshed."""
        return self._n_stale

    def prepare_refresh(self, max_lists: int, *, threads: int | None = None) -> dict[str, Any] | None:
        """Fresh lists, on the current graph, for up to ``max_lists`` stale sources (the lowest ids): the
        pushes, which lookups may run beside, on ``threads`` numba threads (None: all; a server's background
        refresh leaves half the cores to the requests). ``None`` when none is stale. Store them with
        :meth:`install_refresh`, which stores nothing when an edit came between the two (this half takes no
        lock: the version and the graph it read are checked there)."""
        if not self._n_stale or max_lists < 1:
            return None
        src = np.flatnonzero(self._stale)[: int(max_lists)].astype(np.int64)
        graph = self._graph
        assert graph is not None  # stale lists exist only after an edit
        before = numba.get_num_threads()  # thread-local in numba: only this thread's pushes
        if threads is not None:
            numba.set_num_threads(max(1, min(int(threads), before)))
        try:
            lists = self._push(graph, src)
        finally:
            numba.set_num_threads(before)
        return {"graph": graph, "version": self._version, "targets": src, "lists": lists}

    def install_refresh(self, prep: dict[str, Any] | None) -> int:
        """Store :meth:`prepare_refresh`'s lists (under the server's write lock, like :meth:`install`): those
        sources are no longer stale, their accumulated bound is 0 again, they stay dirty. Returns how many
        were stored (0 when an edit came between the two halves: nothing is stored then; lists a hand-over
        stored meanwhile are not stored twice)."""
        if prep is None:
            return 0
        if prep["version"] != self._version or prep["graph"] is not self._graph:
            self.refresh_stats["voided"] += int(np.count_nonzero(self._stale[prep["targets"]]))
            return 0
        return self._store_fresh(prep["targets"], *prep["lists"])

    def _hand(self, version: int, graph: CSRGraph, ids: np.ndarray, ptr: np.ndarray, nodes: np.ndarray,
              scores: np.ndarray) -> None:
        """Keep a lookup's pushes of stale lists for :meth:`install_handed` (at most ``_HANDED_MAX`` entries
        wait; more are dropped, a refresh pushes those again), then call ``on_handed`` (the server's refresh
        thread's doorbell)."""
        with self._handed_lock:
            if self._handed_entries + len(nodes) > _HANDED_MAX:
                return
            self._handed.append((version, graph, ids, ptr, nodes, scores))
            self._handed_entries += len(nodes)
        if self.on_handed is not None:
            self.on_handed()

    def has_handed(self) -> bool:
        """Whether lookups have pushed stale lists that :meth:`install_handed` would store."""
        return bool(self._handed)

    def install_handed(self) -> int:
        """Store the stale lists lookups pushed (under the server's write lock, like :meth:`install_refresh`):
        those pushed at the current version on the current graph, the very lists a refresh would push; the
        others are dropped. Returns how many lists were stored."""
        with self._handed_lock:
            handed, self._handed, self._handed_entries = self._handed, [], 0
        stored = 0
        for version, graph, ids, ptr, nodes, scores in handed:
            if version == self._version and graph is self._graph:
                stored += self._store_fresh(ids, ptr, nodes, scores)
            else:
                self.refresh_stats["voided"] += int(np.count_nonzero(self._stale[ids]))
        return stored

    def _store_fresh(self, ids: np.ndarray, ptr: np.ndarray, nodes: np.ndarray, scores: np.ndarray) -> int:
        """Store the lists of ``ids`` pushed on the current graph (CSR ``ptr``), those still stale only (a
        hand-over or a refresh may have stored some meanwhile): no longer stale, bound 0 again, still dirty.
        Returns how many were stored."""
        keep = np.flatnonzero(self._stale[ids])
        if not len(keep):
            return 0
        if len(keep) < len(ids):
            sub, idx = gather_ranges(ptr[keep], np.diff(ptr)[keep])
            ids, ptr, nodes, scores = ids[keep], sub, nodes[idx], scores[idx]
        self._store(ids, ptr, nodes, scores)
        self._set_stale(ids, False)
        self._drift[ids] = 0.0
        self.refresh_stats["stored"] += len(ids)
        self._merge_if_large()
        return len(ids)

    def _set_stale(self, ids: np.ndarray, stale: bool) -> None:
        if not len(ids) or (not stale and not self._n_stale):
            return
        was = int(np.count_nonzero(self._stale[ids]))
        self._stale[ids] = stale
        self._n_stale += len(ids) - was if stale else -was

    # ------------------------------------------------------------------ internals
    def _merge_if_large(self) -> None:
        if self._a_fill > max(64 * self.k_max, self.merge_fraction * len(self._lists[1])):
            self._merge()

    def _sums_for(self, n: int, threads: int) -> _Sums:
        sc = self._sums
        if sc is None or sc.n < n or sc.threads != threads:  # spare room once nodes come: not O(N) per new node
            sc = _Sums(n if sc is None else _spare(sc.n, n), threads)
        return sc

    def _coefficients(self, old_graph: CSRGraph, new_graph: CSRGraph, rows: np.ndarray) -> np.ndarray:
        """``(1 - a) / a * c_u`` per changed row (``rows``, ids of ``old_graph``): the rule's ``c_u``, the node
        rule's ``m_u`` lowered to :func:`row_change_peaks` where ``peaks`` (module docstring)."""
        a = self.config.teleport
        l1, mnode = row_change_bounds(old_graph, new_graph, rows)
        if self.rule == "l1":
            return (1.0 - a) / a * l1
        if self.peaks:
            # pushes for an edit touching more than N / 8 nodes cost as much as recomputing an eighth of the
            # lists, and such an edit moves most lists past the tolerance anyway (1,000 random edges on Amazon
            # Computers: 13,450 of 13,752 lists with the peaks or without; the 2,000 pushes cost 8% more)
            cap = max(64, self.num_nodes // 8)
            mnode = np.minimum(mnode, row_change_peaks(old_graph, new_graph, rows, self.config, max_pushes=cap))
        return (1.0 - a) / a * mnode

    def _grow_to(self, n: int) -> None:
        """Entries for nodes ``num_nodes .. n - 1``: no list in the overlay, dirty, not stale. The per-node
        arrays keep spare room (:func:`_room`); only ``[:num_nodes]`` of them is meaningful."""
        old = self.num_nodes
        if n <= old:
            return
        self._ostart = _room(self._ostart, n, -1)
        self._olen = _room(self._olen, n, 0)
        self._dirty = _room(self._dirty, n, False)
        self._stale = _room(self._stale, n, False)
        self._ostart[old:n] = -1
        self._olen[old:n] = 0
        self._dirty[old:n] = True
        self._stale[old:n] = False
        self._drift_grow(n)

    def _drift_grow(self, n: int) -> None:
        self._drift = _room(self._drift, n, 0.0)

    def _store(self, targets: np.ndarray, ptr: np.ndarray, nodes: np.ndarray, scores: np.ndarray) -> None:
        """Append fresh lists to the arena and point the targets at them."""
        need = self._a_fill + len(nodes)
        if need > len(self._a_nodes):
            cap = max(need, 2 * len(self._a_nodes), 1024)
            for name, dt in (("_a_nodes", np.int64), ("_a_scores", np.float32), ("_a_owner", np.int64)):
                old = getattr(self, name)
                new = np.empty(cap, dtype=dt)
                new[: self._a_fill] = old[: self._a_fill]
                setattr(self, name, new)
        f = self._a_fill
        self._a_nodes[f:need] = nodes
        self._a_scores[f:need] = scores
        self._a_owner[f:need] = np.repeat(targets, np.diff(ptr))
        self._ostart[targets] = f + ptr[:-1]
        self._olen[targets] = np.diff(ptr)
        self._a_fill = need

    def _merge(self) -> None:
        """Fold the overlay into fresh in-memory lists (the base's files are never written)."""
        if not np.any(self._ostart >= 0):
            return
        self._lists = self._all_lists(stored=True)  # one swap; then the overlay goes (stale lists as stored)
        self._mat = None
        self._ostart[:] = -1
        self._olen[:] = 0
        self._a_fill = 0
        self._inv = None  # rebuilt on the next apply

    def _all_lists(self, *, stored: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every current list as CSR ``(ptr int64, nodes int32/int64, scores float32)``: what
        ``lookup(arange(N))`` returns (nodes cast to the index dtype), gathered in chunks of about
        ``_LOOKUP_CHUNK`` entries into the final arrays (no ``O(N K)`` int64 temporaries). ``stored``:
        a stale list as stored (a merge), else pushed now (what lookups answer)."""
        n, k = self.num_nodes, self.k_max
        lp = self._lists[0]
        nb = len(lp) - 1
        cnt = np.zeros(n, dtype=np.int64)
        cnt[:nb] = np.diff(lp)
        o = self._ostart[:n]
        over = np.flatnonzero(o >= 0)
        cnt[over] = self._olen[over]
        fresh = None
        if not stored and self._n_stale:  # every stale list pushed once, spliced in chunk by chunk below
            assert self._graph is not None
            ft = np.flatnonzero(self._stale[:n]).astype(np.int64)
            fresh = (ft, *self._push(self._graph, ft))
            cnt[ft] = np.diff(fresh[1])
        np.minimum(cnt, k, out=cnt)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(cnt, out=ptr[1:])
        del cnt, over
        nodes = np.empty(int(ptr[-1]), dtype=index_dtype_for(n))
        scores = np.empty(int(ptr[-1]), dtype=np.float32)
        step = max(2, _LOOKUP_CHUNK // max(k, 1))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            t = np.arange(lo, hi, dtype=np.int64)
            out = self._stored(t, k, True)
            if fresh is not None and self._stale[lo:hi].any():
                out = self._with_fresh(t, k, self._stale[lo:hi], out, True, fresh)
            _, nd, sc = out
            nodes[ptr[lo] : ptr[hi]] = nd
            scores[ptr[lo] : ptr[hi]] = sc
        return ptr, nodes, scores

    def _inverse(self) -> tuple[np.ndarray, np.ndarray]:
        """Node -> positions in the merged lists holding it: the base's saved inverse while the lists are
        still the base's (:meth:`kernels.ppr.PPRIndex.ensure_inverse`, which a server taking updates calls
        at load), else built here (``N K`` int32 entries below ``2^31``) and rebuilt after each merge."""
        if self._inv is None:
            base = getattr(self.base, "inverse", None)
            if base is not None and self._lists[1] is self._base_nodes:
                self._inv = base
            else:
                self._inv = inverse_lists(self._lists[1], len(self._lists[0]) - 1)
        return self._inv

    def _holders(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Current lists holding the sorted ids ``xs``: ``(source, index into xs, stored score)``."""
        inv_ptr, inv_pos = self._inverse()
        lp, _, ls = self._lists
        xi_m = np.flatnonzero(xs < len(lp) - 1)
        xm = xs[xi_m]
        cnt = inv_ptr[xm + 1] - inv_ptr[xm]
        _, q = gather_ranges(inv_ptr[xm], cnt)
        pos = inv_pos[q]
        src = np.searchsorted(lp, pos, side="right") - 1
        keep = self._ostart[src] < 0  # an overlaid source's merged list is stale
        hs, hx, hsc = src[keep], np.repeat(xi_m, cnt)[keep], np.asarray(ls[pos[keep]])
        if self._a_fill:
            an = self._a_nodes[: self._a_fill]
            idx = np.flatnonzero(np.isin(an, xs))
            own = self._a_owner[idx]
            st = self._ostart[own]
            live = (idx >= st) & (idx < st + self._olen[own])
            idx, own = idx[live], own[live]
            hs = np.concatenate([hs, own])
            hx = np.concatenate([hx, np.searchsorted(xs, an[idx])])
            hsc = np.concatenate([hsc, self._a_scores[idx]])
        return hs, hx, hsc

    def _last_scores(self, s: np.ndarray) -> np.ndarray:
        o = self._ostart[s]
        over = o >= 0
        out = np.empty(len(s), dtype=np.float64)
        sb = s[~over]
        lp, _, ls = self._lists
        out[~over] = ls[np.maximum(lp[sb + 1] - 1, lp[sb])]
        out[over] = self._a_scores[o[over] + np.maximum(self._olen[s[over]] - 1, 0)]
        return out

    def _reverse_terms(
        self, old_graph: CSRGraph, new_graph: CSRGraph, rows: np.ndarray, coef: np.ndarray, hs: np.ndarray,
        hx: np.ndarray, sc: _Sums, quantum: float,
    ) -> int:
        """Sources whose list lacks a changed row ``u``, with the term ``coef_u * est_s(u)`` from a
        reverse push from ``u`` on the old graph (module docstring), added to ``sc.acc[t, s]`` in quanta
        (:func:`_reverse_accumulate`, on every numba worker ``t``). Returns the number of capped pushes.

        The terms (one per source touched per push: changed rows x reverse reach, 10^8 on a bulk
        edit of a large graph) are consumed as each push ends, never held: the memory is the workers'
        ``O(T N)`` scratch (the dense one pooled on ``new_graph``, which has room for the old graph's
        nodes) plus ``O(holders)``, whatever the size of the edit."""
        cfg = self.config
        wd = _weighted_degree(old_graph)
        tol = self.tol_factor * cfg.eps
        act = np.flatnonzero((coef > 0) & (wd[rows] > 0))  # w(u) = 0: no other source reaches u
        if not len(act):
            return 0
        u = rows[act]
        eps_r = tol / (2.0 * len(act) * wd[u] * coef[act])
        w = old_graph.weights if old_graph.weights is not None else np.zeros(0, dtype=np.float32)
        # the work of all reverse pushes of one edit is bounded too: a bulk edit (thousands of changed rows)
        # shares reverse_total_pushes among them, so each reaches only its near sources (counted as capped)
        cap = self.reverse_max_pushes
        if self.reverse_total_pushes > 0:
            share = max(1, self.reverse_total_pushes // len(act))
            cap = share if cap <= 0 else min(cap, share)
        # a listed pair keeps its stored score (counted by the caller): the holders of each pushed row, as CSR
        push_of = np.full(len(rows), -1, dtype=np.int64)
        push_of[act] = np.arange(len(act), dtype=np.int64)
        hi = push_of[hx]
        sel = np.flatnonzero(hi >= 0)
        hsrc = hs[sel[np.argsort(hi[sel], kind="stable")]].astype(np.int64)
        hptr = np.zeros(len(act) + 1, dtype=np.int64)
        np.cumsum(np.bincount(hi[sel], minlength=len(act)), out=hptr[1:])
        del push_of, hi, sel
        lp, _, ls = self._lists
        # every list's last score, gathered at once, where the pushes may touch a good part of the graph: one
        # read per term instead of three scattered ones (the kernel reads the lists itself otherwise)
        n_old = old_graph.num_nodes
        reach = len(act) * (cap if cap > 0 else n_old)
        gather = reach >= _GATHER_LAST * n_old
        last = self._last_scores(np.arange(n_old, dtype=np.int64)) if gather else np.zeros(0)
        capped = np.zeros(sc.threads, dtype=np.int64)
        dense = _take_dense(new_graph, sc.threads, cfg.eps)
        try:
            _reverse_accumulate(
                old_graph.indptr, old_graph.indices, w, wd, u, eps_r, cfg.alpha, cfg.lazy, cap, dense.rw, dense.p,
                dense.queue, dense.touched, wd[u], coef[act], hptr, hsrc, lp, ls, self._ostart, self._olen,
                self._a_scores, last, quantum, sc.mark, sc.acc, sc.seen_list, sc.counts, capped,
            )  # fmt: skip
        finally:
            _give_dense(new_graph, dense)
        return int(capped.sum())

    def _push(self, graph: CSRGraph, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`kernels.ppr.ppr_topk` of ``targets`` in chunks of ``push_chunk`` targets (its padded
        ``[B, K]`` result arrays stay small; each list is the same push whatever its chunk)."""
        cfg = self.config
        c = max(1, int(self.push_chunk))
        if len(targets) <= c:
            return ppr_topk(graph, targets, cfg)
        ptrs, nodes, scores = [], [], []
        for lo in range(0, len(targets), c):
            pt, nd, sc = ppr_topk(graph, targets[lo : lo + c], cfg)
            ptrs.append(np.diff(pt))
            nodes.append(nd)
            scores.append(sc)
        ptr = np.zeros(len(targets) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(ptrs), out=ptr[1:])
        return ptr, np.concatenate(nodes), np.concatenate(scores)

    def _carry_scratch(self, old_graph: CSRGraph, new_graph: CSRGraph, changed: np.ndarray) -> None:
        """Hand the old graph's dense push scratch (kernels.ppr) to the new graph, fixing the push thresholds
        of the changed rows and the new nodes: no O(threads * N) allocation per edit. A scratch without room
        for the new nodes is replaced by one with spare room (:func:`_spare`), so a stream of new nodes
        allocates it again only once per eighth of growth."""
        n_old, n = old_graph.num_nodes, new_graph.num_nodes
        with _SCRATCH_LOCK:
            pool = old_graph.cache().pop(_SCRATCH_KEY, None)
        if not pool:
            return
        wd = _weighted_degree(new_graph)
        fix = changed if n == n_old else np.union1d(changed, np.arange(n_old, n))
        for i, sc in enumerate(pool):
            if sc.capacity < n:
                pool[i] = _DenseScratch(wd, sc.threads, sc.eps, capacity=_spare(sc.capacity, n))
            elif new_graph.is_weighted or old_graph.is_weighted:
                sc.rw[:, :n, 1] = np.where(wd > 0, sc.eps * wd, sc.eps)
            elif len(fix):
                wc = wd[fix]
                sc.rw[:, fix, 1] = np.where(wc > 0, sc.eps * wc, sc.eps)
        with _SCRATCH_LOCK:
            new_graph.cache().setdefault(_SCRATCH_KEY, []).extend(pool)


# ============================================================================ benchmark
def benchmark(
    dataset: str = "amazon_computers",
    *,
    data_dir: str | None = None,
    topk: int = 64,
    updates: int = 40,
    tol_factor: float = 1.0,
    rule: str = "node",
    peaks: bool = True,
    eager_lists: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Cost of :meth:`LivePPRIndex.apply` per single-edge update on a real dataset with the default
    :class:`PPRConfig` and ``topk``: additions of random absent pairs alternate with removals of
    edges drawn uniformly. Run: ``python -c "from kernels.ppr_live import benchmark; print(benchmark())"``.

    Returns the index build time, the median / mean / max milliseconds and recomputed counts
    (the edit itself, :func:`kernels.graph_edit.apply_edit`, timed apart) and the cost of one
    push (``ppr_topk`` of 256 random targets, divided by 256) for scale.
    """
    import os
    from pathlib import Path

    from .datasets import load_npz
    from .graph_edit import apply_edit, edit_from_pairs

    root = Path(data_dir or os.environ.get("GNNSERVE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    g = load_npz(root / f"{dataset}.npz").graph
    cfg = PPRConfig(topk=topk)
    t0 = time.perf_counter()
    base = PPRIndex.build(g, cfg, progress=False)
    build_s = time.perf_counter() - t0
    live = LivePPRIndex(base, tol_factor=tol_factor, rule=rule, peaks=peaks, eager_lists=eager_lists)
    rng = np.random.default_rng(seed)
    # warm-up: compile, build the inverse index
    t0 = time.perf_counter()
    u, v = _absent_pair(rng, g)
    eff = apply_edit(g, edit_from_pairs(add=[(u, v)]))
    live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
    first_s = time.perf_counter() - t0
    g = eff.graph
    ms, edit_ms, rec, deferred, refresh_ms = [], [], [], [], []
    for i in range(updates):
        if i % 2 == 1:  # remove an edge drawn uniformly among the edges
            pos = int(rng.integers(g.num_edges))
            u = int(np.searchsorted(g.indptr, pos, side="right")) - 1
            e = edit_from_pairs(remove=[(u, int(g.indices[pos]))])
        else:
            e = edit_from_pairs(add=[_absent_pair(rng, g)])
        t0 = time.perf_counter()
        eff = apply_edit(g, e)
        t1 = time.perf_counter()
        st = live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        t2 = time.perf_counter()
        g = eff.graph
        edit_ms.append((t1 - t0) * 1e3)
        ms.append((t2 - t1) * 1e3)
        rec.append(st["recomputed"])
        deferred.append(st["deferred"])
        if live.stale_count:  # what a server's refresh thread does beside the updates, timed apart
            t0 = time.perf_counter()
            live.install_refresh(live.prepare_refresh(live.stale_count))
            refresh_ms.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    ppr_topk(g, rng.choice(g.num_nodes, size=256, replace=False), cfg)
    push_s = time.perf_counter() - t0
    return {
        "dataset": dataset, "nodes": g.num_nodes, "edges": g.num_edges, "topk": topk, "rule": rule, "peaks": peaks,
        "tol_factor": tol_factor, "threads": numba_threads(), "build_s": round(build_s, 2),
        "first_apply_s": round(first_s, 2), "apply_ms_median": round(float(np.median(ms)), 2),
        "apply_ms_mean": round(float(np.mean(ms)), 2), "apply_ms_max": round(float(np.max(ms)), 2),
        "recomputed_median": float(np.median(rec)), "recomputed_max": int(np.max(rec)),
        "eager_lists": eager_lists, "deferred_max": int(np.max(deferred)),
        "refresh_ms_total": round(float(np.sum(refresh_ms)), 1),
        "edit_ms_median": round(float(np.median(edit_ms)), 3), "push_ms": round(push_s * 1e3 / 256, 3),
    }  # fmt: skip


def _absent_pair(rng: np.random.Generator, g: CSRGraph) -> tuple[int, int]:
    while True:
        u, v = (int(x) for x in rng.integers(g.num_nodes, size=2))
        if u != v and v not in g.neighbors(u):
            return u, v
