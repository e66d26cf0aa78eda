"""PPR pushes over a graph whose rows arrive on demand (a stateless replica's rows in Redis).

A :class:`PartialPush` holds the rows it has been given and the degrees of every node those rows reach. It runs
the push until the next node to push has no row, and pauses there: :meth:`PartialPush.missing` lists every node
in its queue without a row (each of them will be pushed: a queued residue only grows until its node is pushed),
the caller fetches them all in one round trip, hands them over with the degrees of their columns
(:meth:`PartialPush.add_rows`) and resumes. The steps are the whole graph's push's, in the same FIFO order with
the same arithmetic, so the list equals :func:`kernels.ppr.ppr_topk`'s (an existing target) or
:func:`kernels.ppr.ppr_new_node`'s (a virtual node with edges to existing ones) to the bit, given the same
degrees. Only the rows of the nodes the push pushes are read (on Amazon Computers about 400 to 1,400 of the
2,000 to 6,500 nodes it reaches), one round trip per wave of the queue, and the push runs once.

State is keyed by global ids in an open-addressing hash map; a row's columns get their slots (and degrees) when
the row arrives, so the push loop follows slot indices and never hashes. :func:`run_partial` drives several
pushes in lockstep, one fetch per round for all of them.
"""

# numba cache key: ppr_push 769c30e35baf, subgraph 5bdf4173fc3c

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np

from .ppr_push import PPRConfig, _find, _select_topk, new_node_edges
from .subgraph import _position

__all__ = ["PartialPush", "run_partial"]

_DONE, _PAUSED, _QUEUE_FULL, _CAPPED = 0, 1, 2, 3
_NO_NB = np.zeros(0, dtype=np.int64)
_NO_W = np.zeros(0, dtype=np.float64)


@numba.njit(cache=True, nogil=True)
def _rehash(keys, vals, ids, ns):  # pragma: no cover - compiled
    keys[:] = -1
    for s in range(ns):
        h = _find(keys, ids[s])
        keys[h] = ids[s]
        vals[h] = s


@numba.njit(cache=True, nogil=True)
def _add_rows(
    keys, vals, ids, rw, p, wd, rs, rl, aslot, aw, meta, sel, rnodes, rstart, rlen, cols, ws, cdeg, nb, nbw, eps
):  # pragma: no cover - compiled
    """Give the rows ``sel`` of the batch (``rnodes[i]``'s columns ``cols[rstart[i]:rstart[i] + rlen[i]]``, weights
    ``ws`` or 1, the columns' degrees ``cdeg``) to their slots (rows of nodes the push has not reached are left
    out); every column gets a slot (r = p = 0) with its degree,
    plus the new edge's weight where it is one of the virtual node's neighbours ``nb``, whose rows end with the edge
    back to the virtual node (slot 0), as :func:`kernels.ppr_push._ppr_virtual` walks them; and its push threshold
    (``eps`` times its degree, ``eps`` without one). Rows a slot has are kept. Returns how many of ``sel`` it took:
    it stops before a row that might overfill the slots, the hash map (half full at most) or the arena."""
    ns = meta[0]
    used = meta[3]
    has_w = ws.shape[0] > 0
    cap = ids.shape[0]
    hcap = keys.shape[0] // 2
    for j in range(sel.shape[0]):
        i = sel[j]
        u = rnodes[i]
        h = _find(keys, u)
        if keys[h] != u:  # not reached (yet): the push asks for the row again if it ever pushes u
            continue
        su = vals[h]
        if rl[su] >= 0:
            continue
        m = rlen[i]
        if ns + m > cap or ns + m > hcap or used + m + 1 > aslot.shape[0]:
            meta[0] = ns
            meta[3] = used
            return j
        rs[su] = used
        for e in range(rstart[i], rstart[i] + m):
            v = cols[e]
            h = _find(keys, v)
            if keys[h] == v:
                sv = vals[h]
            else:
                sv = ns
                ns += 1
                keys[h] = v
                vals[h] = sv
                ids[sv] = v
                rw[sv, 0] = 0.0
                p[sv] = 0.0
                rs[sv] = -1
                rl[sv] = -1
                wv = cdeg[e]
                if nb.shape[0] > 0:
                    a = _position(nb, v)
                    if a >= 0:
                        wv += nbw[a]
                wd[sv] = wv
                rw[sv, 1] = eps * wv if wv > 0.0 else eps
            aslot[used] = sv
            if has_w:
                aw[used] = ws[e]
                if ws[e] != 1.0:
                    meta[5] = 1
            else:
                aw[used] = 1.0
            used += 1
        a = _position(nb, u)
        if a >= 0:
            aslot[used] = 0
            aw[used] = nbw[a]
            if nbw[a] != 1.0:
                meta[5] = 1
            used += 1
        rl[su] = used - rs[su]
    meta[0] = ns
    meta[3] = used
    return sel.shape[0]


@numba.njit(cache=True, nogil=True)
def _run(rw, p, wd, rs, rl, aslot, aw, queue, meta, alpha, lazy, max_pushes):  # pragma: no cover - compiled
    """Push from the queue ``queue[meta[1]:meta[2]]`` until it is empty (0), the next node to push has no row (1,
    the queue's head left at it), the queue has no room for the next push (2) or ``max_pushes`` pushes were made
    (3). The steps and arithmetic of :func:`kernels.ppr_push._ppr_virtual`; the edge loop without a data-dependent
    branch, as :func:`kernels.ppr_push._push_dense`'s (the queue has room for every edge of the row: a slot is
    written at its tail for each and the tail advances where the residue crossed the threshold)."""
    head = meta[1]
    tail = meta[2]
    pushes = meta[4]
    weighted = meta[5] != 0  # an arena weight other than 1 (else c * 1.0: the same bits without the load)
    status = _DONE
    while head < tail:
        su = queue[head]
        ru = rw[su, 0]
        if ru <= 0.0:
            head += 1
            continue
        if max_pushes > 0 and pushes >= max_pushes:
            status = _CAPPED
            break
        if rl[su] < 0:
            status = _PAUSED
            break
        need = rl[su] + 1
        if tail + need > queue.shape[0]:
            if head > 0:  # move the live part to the front (forward copy: the source is ahead)
                for j in range(tail - head):
                    queue[j] = queue[head + j]
                tail -= head
                head = 0
            if tail + need > queue.shape[0]:
                status = _QUEUE_FULL
                break
        head += 1
        pushes += 1
        wu = wd[su]
        p[su] += ru if wu <= 0.0 else alpha * ru
        rw[su, 0] = 0.0
        if wu <= 0.0:
            continue
        spread = (1.0 - alpha) * ru
        if lazy:
            spread *= 0.5
        c = spread / wu
        for e in range(rs[su], rs[su] + rl[su]):
            sv = aslot[e]
            old = rw[sv, 0]
            new = old + (c * aw[e] if weighted else c)
            rw[sv, 0] = new
            thr = rw[sv, 1]
            queue[tail] = sv
            tail += (old < thr) & (new >= thr)
        if lazy:
            old = rw[su, 0]
            new = old + spread
            rw[su, 0] = new
            thr = rw[su, 1]
            if old < thr and new >= thr:
                queue[tail] = su
                tail += 1
    meta[1] = head
    meta[2] = tail
    meta[4] = pushes
    return status


@numba.njit(cache=True, nogil=True)
def _missing(ids, rw, rl, queue, head, tail):  # pragma: no cover - compiled
    out = np.empty(tail - head, dtype=np.int64)
    m = 0
    for j in range(head, tail):
        s = queue[j]
        if rw[s, 0] > 0.0 and rl[s] < 0:
            out[m] = ids[s]
            m += 1
    return np.unique(out[:m])


@numba.njit(cache=True, nogil=True)
def _top(ids, rw, p, ns, alpha, k, threshold):  # pragma: no cover - compiled
    scores = np.empty(ns, dtype=np.float64)
    for s in range(ns):
        scores[s] = p[s] + alpha * rw[s, 0]
    out_nodes = np.empty(max(k, 1), dtype=np.int64)
    out_scores = np.empty(max(k, 1), dtype=np.float64)
    c = _select_topk(ids, scores, ns, ids[0], scores[0], k, threshold * scores[0], out_nodes, out_scores)
    return out_nodes[:c], out_scores[:c]


class PartialPush:
    """One push from an existing node (:meth:`target`) or a virtual new one (:meth:`new_node`) over rows handed in
    as it needs them (see the module docstring). ``missing()``, ``add_rows(...)``, ``run()`` until ``missing()``
    is empty after a run; then :meth:`result`."""

    def __init__(self, source: int, degree: float, cfg: PPRConfig, nb: np.ndarray = _NO_NB, nbw: np.ndarray = _NO_W,
                 *, max_pushes: int = 0) -> None:
        self.cfg = cfg
        self.max_pushes = int(max_pushes)
        self.nb, self.nbw = nb, nbw
        cap = 1024  # a push on a real graph reaches thousands of nodes: room for the first waves
        self.keys = np.full(4 * cap, -1, dtype=np.int64)
        self.vals = np.zeros(4 * cap, dtype=np.int64)
        # per slot, written when the slot is taken (_add_rows): id, (residue, push threshold) as _push_dense's,
        # estimate, degree, its row's start and length in the arena (-1: no row yet)
        self.ids = np.empty(cap, dtype=np.int64)
        self.rw = np.empty((cap, 2), dtype=np.float64)
        self.p = np.empty(cap, dtype=np.float64)
        self.wd = np.empty(cap, dtype=np.float64)
        self.rs = np.empty(cap, dtype=np.int64)
        self.rl = np.empty(cap, dtype=np.int64)
        self.aslot = np.empty(8 * cap, dtype=np.int32)  # the rows' columns as slots, and their weights
        self.aw = np.empty(8 * cap, dtype=np.float64)
        self.queue = np.empty(cap, dtype=np.int64)
        # slots, head, tail, arena used, pushes, an arena weight other than 1
        self.meta = np.array([1, 0, 1, 0, 0, 0], dtype=np.int64)
        self.status = _PAUSED
        self.ids[0] = source
        self.rw[0] = (1.0, cfg.eps * degree if degree > 0.0 else cfg.eps)
        self.p[0] = 0.0
        self.wd[0] = degree
        self.rs[0] = self.rl[0] = -1
        self.queue[0] = 0
        h = _find(self.keys, source)
        self.keys[h] = source
        self.vals[h] = 0

    @classmethod
    def target(cls, node: int, degree: float, cfg: PPRConfig) -> PartialPush:
        """The push of :func:`kernels.ppr.ppr_topk` from the existing ``node`` (its weighted degree ``degree``)."""
        return cls(int(node), float(degree), cfg)

    @classmethod
    def new_node(cls, num_nodes: int, neighbors: np.ndarray | Sequence[int], weights: Any,
                 neighbor_degrees: Callable[[np.ndarray], np.ndarray], cfg: PPRConfig, *,
                 max_pushes: int = 200_000) -> PartialPush:
        """The push of :func:`kernels.ppr.ppr_new_node` (bidirectional edges) from the virtual node ``num_nodes``
        with edges to ``neighbors``; ``neighbor_degrees(ids)`` gives their weighted degrees in the graph."""
        nb, nbw = new_node_edges(num_nodes, neighbors, weights)
        w_self = 0.0
        for x in nbw.tolist():  # summed in order, as the kernel sums them
            w_self += x
        self = cls(int(num_nodes), w_self, cfg, nb, nbw, max_pushes=max_pushes)
        self.add_rows(np.array([num_nodes], dtype=np.int64), np.array([0, len(nb)], dtype=np.int64), nb, nbw,
                      np.asarray(neighbor_degrees(nb), dtype=np.float64))
        return self

    @property
    def pushes(self) -> int:
        return int(self.meta[4])

    @property
    def done(self) -> bool:
        return self.status != _PAUSED

    def missing(self) -> np.ndarray:
        """int64, sorted distinct: the nodes in the queue without their row (empty once :meth:`run` finished)."""
        if self.done:
            return _NO_NB
        return _missing(self.ids, self.rw, self.rl, self.queue, int(self.meta[1]), int(self.meta[2]))

    def add_rows(self, nodes: np.ndarray, ptr: np.ndarray, cols: np.ndarray, weights: np.ndarray | None,
                 col_degrees: np.ndarray, sel: np.ndarray | None = None) -> None:
        """Give the rows ``sel`` (default: all) of a batch: node ``nodes[i]``'s columns ``cols[ptr[i]:ptr[i + 1]]``
        (int64, in the graph's row order) with ``weights`` (float64, or None: 1 each) and ``col_degrees`` (float64,
        each column's weighted degree in the graph). Rows the push holds already, or of nodes it has not reached,
        are left out."""
        sel = np.arange(len(nodes), dtype=np.int64) if sel is None else np.asarray(sel, dtype=np.int64)
        ptr = np.asarray(ptr, dtype=np.int64)
        self._give(nodes, ptr[:-1], np.diff(ptr), cols, weights, col_degrees, sel)

    def _give(self, nodes: np.ndarray, starts: np.ndarray, lens: np.ndarray, cols: np.ndarray,
              weights: np.ndarray | None, col_degrees: np.ndarray, sel: np.ndarray) -> None:
        """:meth:`add_rows` with row ``i`` at ``cols[starts[i]:starts[i] + lens[i]]``."""
        ws = _NO_W if weights is None else weights
        j = 0
        while j < len(sel):
            j += _add_rows(self.keys, self.vals, self.ids, self.rw, self.p, self.wd, self.rs, self.rl, self.aslot,
                           self.aw, self.meta, sel[j:], nodes, starts, lens, cols, ws, col_degrees, self.nb, self.nbw,
                           self.cfg.eps)
            if j < len(sel):
                self._grow(int(lens[sel[j]]))

    def run(self) -> None:
        """Push until done or paused at a node without its row."""
        c = self.cfg
        while True:
            self.status = _run(self.rw, self.p, self.wd, self.rs, self.rl, self.aslot, self.aw, self.queue, self.meta,
                               c.alpha, c.lazy, self.max_pushes)
            if self.status != _QUEUE_FULL:
                return
            self.queue = _grown(self.queue, 2 * len(self.queue) + int(self.rl[: int(self.meta[0])].max()) + 1)

    def reached(self) -> np.ndarray:
        """int64, sorted: every node whose degree or row the push read (the source, the pushed nodes and every
        column of their rows). A push from the same source on a graph whose rows and degrees differ only at nodes
        outside this set makes the same steps: the same list, to the bit."""
        return np.sort(self.ids[: int(self.meta[0])])

    def result(self, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(nodes int64, scores float32)``: the source first, then the best ``k - 1`` by decreasing score."""
        if not self.done:
            raise RuntimeError("the push still waits for rows (missing())")
        k = self.cfg.topk if k is None else int(k)
        nodes, scores = _top(self.ids, self.rw, self.p, int(self.meta[0]), self.cfg.alpha, k, self.cfg.threshold)
        return nodes, scores.astype(np.float32)

    def _grow(self, m: int) -> None:
        """Room for a row of ``m`` columns: slots, the hash map (half full at most), the arena; each at least
        doubled when it grows."""
        ns, used = int(self.meta[0]), int(self.meta[3])
        if ns + m > len(self.ids):
            cap = max(2 * len(self.ids), ns + m)
            for name in ("ids", "rw", "p", "wd", "rs", "rl"):
                setattr(self, name, _grown(getattr(self, name), cap))
        if ns + m > len(self.keys) // 2:
            size = 2 * len(self.keys)
            while ns + m > size // 2:
                size *= 2
            self.keys = np.full(size, -1, dtype=np.int64)
            self.vals = np.zeros(size, dtype=np.int64)
            _rehash(self.keys, self.vals, self.ids, ns)
        if used + m + 1 > len(self.aslot):
            cap = max(2 * len(self.aslot), used + m + 1)
            self.aslot = _grown(self.aslot, cap)
            self.aw = _grown(self.aw, cap)


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` in a longer array; the new part is not initialised (each slot is written when taken)."""
    out = np.empty((size, *a.shape[1:]), dtype=a.dtype)
    out[: len(a)] = a
    return out


def run_partial(pushes: Sequence[PartialPush],
                rows: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray | None]],
                degrees: Callable[[np.ndarray], np.ndarray]) -> int:
    """Run ``pushes`` to the end in lockstep: each round runs every push until it pauses, fetches the rows they miss
    that no earlier round fetched with one call ``rows(ids)`` (``ids`` sorted distinct; returns ``(ptr int64
    [len + 1], cols int64, weights float64 or None)`` in that order) and the degrees of their columns with one
    ``degrees(cols)``, and hands each push the rows it asked for (rows fetched for one push are kept for the
    others: each row is fetched once per run). Returns the number of rounds that fetched."""
    rounds = 0
    live = list(pushes)
    held = _Held()
    while True:
        for ps in live:
            ps.run()
        live = [ps for ps in live if not ps.done]
        if not live:
            return rounds
        wants = [ps.missing() for ps in live]
        need = np.unique(np.concatenate(wants))
        if held.add(need, rows, degrees):
            rounds += 1
        for ps, want in zip(live, wants, strict=True):
            ps._give(held.nodes, held.starts, held.lens, held.cols, held.ws, held.cdeg, held.rows_of(want))


class _Buf:
    """A growing 1-D array: ``append`` doubles the buffer when full, ``view`` is the filled part."""

    def __init__(self, dtype: Any) -> None:
        self._a = np.empty(0, dtype=dtype)
        self.size = 0

    def append(self, part: np.ndarray) -> None:
        end = self.size + len(part)
        if end > len(self._a):
            grown = np.empty(max(end, 2 * len(self._a)), dtype=self._a.dtype)
            grown[: self.size] = self._a[: self.size]
            self._a = grown
        self._a[self.size : end] = part
        self.size = end

    @property
    def view(self) -> np.ndarray:
        return self._a[: self.size]


class _Held:
    """The rows fetched during one :func:`run_partial`, in fetch order (row ``i`` of node ``nodes[i]`` at
    ``cols[starts[i]:starts[i] + lens[i]]``, its weights ``ws`` and its columns' degrees ``cdeg`` alike), found by
    node id through a sorted copy of the ids."""

    def __init__(self) -> None:
        self._nodes, self._starts, self._lens = _Buf(np.int64), _Buf(np.int64), _Buf(np.int64)
        self._cols, self._cdeg, self._ws = _Buf(np.int64), _Buf(np.float64), _Buf(np.float64)
        self.weighted = False
        self._sorted = _NO_NB
        self._order = _NO_NB

    nodes = property(lambda self: self._nodes.view)
    starts = property(lambda self: self._starts.view)
    lens = property(lambda self: self._lens.view)
    cols = property(lambda self: self._cols.view)
    cdeg = property(lambda self: self._cdeg.view)
    ws = property(lambda self: self._ws.view if self.weighted else None)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Row numbers of the held ``ids``."""
        return self._order[np.searchsorted(self._sorted, ids)]

    def add(self, need: np.ndarray, rows: Callable[..., Any], degrees: Callable[[np.ndarray], np.ndarray]) -> bool:
        """Fetch the rows of ``need`` (sorted distinct) not held yet; whether any was."""
        at = np.searchsorted(self._sorted, need)
        have = at < len(self._sorted)
        have[have] = self._sorted[at[have]] == need[have]
        new = need[~have]
        if not len(new):
            return False
        ptr, cols, ws = rows(new)
        ptr = np.asarray(ptr, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        self._nodes.append(new)
        self._starts.append(self._cols.size + ptr[:-1])
        self._lens.append(np.diff(ptr))
        self._cols.append(cols)
        self._cdeg.append(np.asarray(degrees(cols), dtype=np.float64))
        if ws is not None:
            self.weighted = True
            self._ws.append(np.asarray(ws, dtype=np.float64))
        self._order = np.argsort(self.nodes, kind="stable")
        self._sorted = self.nodes[self._order]
        return True
