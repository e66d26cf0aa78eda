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

Given the graph's node count, :func:`run_partial` runs them instead on dense state indexed by node id (where one
push's state stays within :data:`DENSE_PUSH_BYTES`, graphs to about 168,000 nodes), a group at a time, over one
store of the rows fetched for all of them: no row copied into each push, no hash map, one compiled call per
round for the group, each degree asked once; the same steps and arithmetic. On Amazon Computers (rows cached) a
batch of 100 lists took 75 ms there against 182 ms on the hash-map state (profiled: the per-push row copies with
their hashing were a third of the time, the Python work of the rounds another third).
"""

# numba cache key: ppr_push 9fa4796b3dd5, subgraph 47e999493df1

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np

from .ppr_push import PPRConfig, _find, _select_topk, new_node_edges
from .subgraph import _position

__all__ = ["DENSE_GROUP_BYTES", "DENSE_PUSH_BYTES", "PartialPush", "dense_group", "run_partial"]

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
        # what run_partial's dense engine starts from: the source, its degree, the new node's neighbours' degrees;
        # a push handed rows or run by hand (add_rows, run) keeps its own state to the end
        self._spec: tuple[int, float, np.ndarray] = (source, float(degree), _NO_W)
        self._fresh = True

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
        nbd = np.asarray(neighbor_degrees(nb), dtype=np.float64)
        self._give(np.array([num_nodes], dtype=np.int64), np.zeros(1, dtype=np.int64),
                   np.array([len(nb)], dtype=np.int64), nb, nbw, nbd, np.zeros(1, dtype=np.int64))
        self._spec = (int(num_nodes), w_self, nbd)
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
        self._fresh = False
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
        self._fresh = False
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
                degrees: Callable[[np.ndarray], np.ndarray], *, num_nodes: int | None = None,
                stored: tuple[Any, np.ndarray, np.ndarray] | None = None) -> int:
    """Run ``pushes`` to the end in lockstep: each round runs every push until it pauses, fetches the rows they miss
    that no earlier round fetched with one call ``rows(ids)`` (``ids`` sorted distinct; returns ``(ptr int64
    [len + 1], cols int64, weights float64 or None)`` in that order) and the degrees of their columns with one
    ``degrees(cols)``, and hands each push the rows it asked for (rows fetched for one push are kept for the
    others: each row is fetched once per run). Returns the number of rounds that fetched.

    With ``num_nodes`` (the graph's node count, a new node's virtual id) the pushes run on dense state indexed by
    node id over the rows held for all of them (no per-push copy of a row, no hash map), :func:`dense_group` of
    them at a time in lockstep (a later group pushes over the rows the earlier ones fetched), where the graph is
    small enough (:data:`DENSE_PUSH_BYTES`), no push was handed rows or run by hand and all share one
    configuration: the same steps and arithmetic, so the same lists, and only rows of pushed nodes fetched (a push
    sees at once the rows fetched for the others, so it may ask for its next rows a round earlier).

    ``stored``, for the dense state: ``(arena, degrees, own)``, a :class:`kernels.row_arena.RowArena` of the graph's
    stored rows, every node's weighted degree (float64 ``[num_nodes]``, what ``degrees`` gives) and the sorted ids
    whose row is not the stored one (an update's): the pushes read the arena's rows in place (under its lock),
    pausing only at a node whose row it lacks or that ``own`` names (those are fetched with ``rows`` as above),
    instead of a round per wave of the queue with each wave's rows copied out and their columns' degrees asked
    for."""
    if num_nodes is not None and pushes:
        group = _dense_ok(pushes, int(num_nodes))
        if group:
            return _run_dense(pushes, group, int(num_nodes), rows, degrees, stored)
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


# ============================================================================ the dense engine (run_partial)
#: the most bytes of dense state :func:`run_partial` gives one push: 25 bytes a node of the graph (residue,
#: estimate, queue, touched list, a seen flag), ``num_nodes + 2`` nodes; on a larger graph (past about 168,000
#: nodes) the pushes keep their own hash-map state, whose cost follows the nodes a push reaches, not the graph
DENSE_PUSH_BYTES = 4 << 20
#: the bytes of dense state of the pushes :func:`run_partial` runs at once (at least 8 of them): a group that stays
#: in the caches pushes faster than one lockstep of all (a batch of 100 lists on Amazon Computers, warm rows: 25 at
#: a time 75 ms, all 100 at once 101 ms), at the price of more rounds of fetches (40 against 11)
DENSE_GROUP_BYTES = 8 << 20
_DENSE_MIN_GROUP = 8
_DENSE_BYTES_PER_NODE = 25


def dense_group(count: int, num_nodes: int) -> int:
    """How many of ``count`` pushes on a graph of ``num_nodes`` nodes :func:`run_partial` runs at once on dense
    state (indexed by node id): 0 where one push's state would pass :data:`DENSE_PUSH_BYTES` (the pushes then run
    on their own hash-map state), else as many as fit in :data:`DENSE_GROUP_BYTES`, 8 at least."""
    per = _DENSE_BYTES_PER_NODE * (int(num_nodes) + 2)
    if count < 1 or per > DENSE_PUSH_BYTES:
        return 0
    return int(min(count, max(_DENSE_MIN_GROUP, DENSE_GROUP_BYTES // per)))


@numba.njit(cache=True, nogil=True)
def _dense_init(rp, seen, touched, queue, gm, deg, thrb, known, src, wself, nbo, nb, nbd, eps):  # pragma: no cover
    """The first state of each push of the group: its source (residue 1) queued and touched, and for a virtual
    source (a new node) its neighbours touched, as :meth:`PartialPush.new_node` gives them slots; the shared degrees
    and base thresholds of the sources and of those neighbours (a new node's own threshold and its neighbours',
    which count its edges, are set for its push alone: :func:`_dense_run`)."""
    for i in range(src.shape[0]):
        s = src[i]
        rp[i, s, 0] = 1.0
        seen[i, s] = 1
        touched[i, 0] = s
        nt = 1
        for j in range(nbo[i], nbo[i + 1]):
            v = nb[j]
            d = nbd[j]
            deg[v] = d
            thrb[v] = eps * d if d > 0.0 else eps
            known[v] = 1
            seen[i, v] = 1
            touched[i, nt] = v
            nt += 1
        if nbo[i + 1] == nbo[i]:  # an existing source (or a new node without edges): its degree is the graph's
            w = wself[i]
            deg[s] = w
            thrb[s] = eps * w if w > 0.0 else eps
            known[s] = 1
        queue[i, 0] = s
        gm[i, 0] = 0  # head
        gm[i, 1] = 1  # tail
        gm[i, 2] = 1  # queued
        gm[i, 3] = nt  # touched
        gm[i, 4] = 0  # pushes
        gm[i, 5] = _PAUSED


@numba.njit(cache=True, nogil=True)
def _dense_hold(hs, hl, hcol, hw, used, need, ptr, cols, ws, known):  # pragma: no cover
    """Hold the rows of ``need`` (row ``i`` at ``cols[ptr[i]:ptr[i + 1]]``, weights ``ws`` or 1) at the arena's end
    (``used``: its filled part). Returns the arena's new end, whether a weight other than 1 came in, and the
    columns (sorted distinct) whose degree is not known yet (``known`` set for them)."""
    has_w = ws.shape[0] > 0
    other = False
    fresh = np.empty(cols.shape[0], dtype=np.int64)
    nf = 0
    for i in range(need.shape[0]):
        u = need[i]
        a = ptr[i]
        m = ptr[i + 1] - a
        hs[u] = used
        hl[u] = m
        for e in range(a, a + m):
            v = cols[e]
            hcol[used] = v
            w = ws[e] if has_w else 1.0
            hw[used] = w
            if w != 1.0:
                other = True
            used += 1
            fresh[nf] = v
            nf += known[v] == 0
            known[v] = 1
    return used, other, np.sort(fresh[:nf])


@numba.njit(cache=True, nogil=True)
def _dense_degrees(deg, thrb, ids, d, eps):  # pragma: no cover
    for j in range(ids.shape[0]):
        v = ids[j]
        deg[v] = d[j]
        thrb[v] = eps * d[j] if d[j] > 0.0 else eps


@numba.njit(cache=True, nogil=True, inline="always")
def _dense_edge(rp_i, seen_i, touched_i, queue_i, thrb, v, add, nt, tail, qlen, qcap):  # pragma: no cover
    """One edge of a push onto ``v``: :func:`_run`'s arithmetic, without a data-dependent branch (the touched list
    and the queue written at their ends, which advance by the conditions; a branch on ``seen`` cost 4x)."""
    touched_i[nt] = v
    nt += 1 - seen_i[v]
    seen_i[v] = 1
    old = rp_i[v, 0]
    new = old + add
    rp_i[v, 0] = new
    thr = thrb[v]
    queue_i[tail] = v
    hit = (old < thr) & (new >= thr)
    tail += hit
    qlen += hit
    if tail == qcap:
        tail = 0
    return nt, tail, qlen


@numba.njit(cache=True, nogil=True)
def _dense_run(rp, seen, touched, queue, gm, hs, hl, hcol, hw, weighted, ast, al, acol, aw, aweighted, deg, thrb, src,
               wself, nbo, nb, nbw, vid, alpha, eps, lazy, cap):  # pragma: no cover
    """Each paused push of the group in turn, run as :func:`_run` runs one (the same steps, order and arithmetic)
    on dense state indexed by node id (``rp[i, v]``: residue, estimate) over the rows held for the whole run
    (``hcol[hs[u]:hs[u] + hl[u]]``; ``hs[u] == -1``: not fetched yet, then the stored row ``acol[ast[u]:ast[u] +
    al[u]]`` where ``ast`` has one, ``ast[u] >= 0``; ``hs[u] == -2``: not fetched, no stored row read either),
    thresholds from the shared ``thrb``; a new
    node's push (source ``vid``) walks its edges as :func:`kernels.ppr_push._push_dense` does, with its own and its
    neighbours' thresholds (counting its edges) put in ``thrb`` for its turn and taken out after, as
    :func:`kernels.ppr_push._ppr_virtual_dense` does; push ``i`` stops after ``cap[i]`` pushes (0: no cap). Each
    push's status in ``gm[i, 5]``."""
    qcap = queue.shape[1]
    for i in range(src.shape[0]):
        if gm[i, 5] != _PAUSED:
            continue
        rp_i = rp[i]
        seen_i = seen[i]
        touched_i = touched[i]
        queue_i = queue[i]
        head = gm[i, 0]
        tail = gm[i, 1]
        qlen = gm[i, 2]
        nt = gm[i, 3]
        pushes = gm[i, 4]
        b0 = nbo[i]
        b1 = nbo[i + 1]
        nbi = nb[b0:b1]
        nbwi = nbw[b0:b1]
        virtual = src[i] == vid
        saved = np.empty(b1 - b0 + 1, dtype=np.float64)
        if virtual:
            for j in range(b1 - b0):
                v = nbi[j]
                saved[j] = thrb[v]
                wv = deg[v] + nbwi[j]
                thrb[v] = eps * wv if wv > 0.0 else eps
            saved[b1 - b0] = thrb[vid]
            w = wself[i]
            thrb[vid] = eps * w if w > 0.0 else eps
        status = _DONE
        while qlen > 0:
            u = queue_i[head]
            ru = rp_i[u, 0]
            if ru <= 0.0:
                head += 1
                if head == qcap:
                    head = 0
                qlen -= 1
                continue
            if cap[i] > 0 and pushes >= cap[i]:
                status = _CAPPED
                break
            own = virtual and u == vid
            stored = False
            if not own and hs[u] < 0:
                stored = hs[u] == -1 and u < ast.shape[0] and ast[u] >= 0
                if not stored:
                    status = _PAUSED
                    break
            head += 1
            if head == qcap:
                head = 0
            qlen -= 1
            pushes += 1
            back = -1
            if own:
                wu = wself[i]
            elif virtual:
                back = _position(nbi, u)
                wu = deg[u] + nbwi[back] if back >= 0 else deg[u]
            else:
                wu = deg[u]
            rp_i[u, 1] += ru if wu <= 0.0 else alpha * ru
            rp_i[u, 0] = 0.0
            if wu <= 0.0:
                continue
            spread = (1.0 - alpha) * ru
            if lazy:
                spread *= 0.5
            c = spread / wu
            if own:
                for j in range(nbi.shape[0]):
                    nt, tail, qlen = _dense_edge(rp_i, seen_i, touched_i, queue_i, thrb, nbi[j], c * nbwi[j], nt,
                                                 tail, qlen, qcap)
            else:
                if stored:
                    for e in range(ast[u], ast[u] + al[u]):
                        nt, tail, qlen = _dense_edge(rp_i, seen_i, touched_i, queue_i, thrb, acol[e],
                                                     c * aw[e] if aweighted else c, nt, tail, qlen, qcap)
                else:
                    for e in range(hs[u], hs[u] + hl[u]):
                        nt, tail, qlen = _dense_edge(rp_i, seen_i, touched_i, queue_i, thrb, hcol[e],
                                                     c * hw[e] if weighted else c, nt, tail, qlen, qcap)
                if back >= 0:
                    nt, tail, qlen = _dense_edge(rp_i, seen_i, touched_i, queue_i, thrb, vid, c * nbwi[back], nt,
                                                 tail, qlen, qcap)
            if lazy:
                old = rp_i[u, 0]
                new = old + spread
                rp_i[u, 0] = new
                thr = thrb[u]
                if old < thr and new >= thr:
                    queue_i[tail] = u
                    tail += 1
                    if tail == qcap:
                        tail = 0
                    qlen += 1
        if virtual:
            for j in range(b1 - b0):
                thrb[nbi[j]] = saved[j]
            thrb[vid] = saved[b1 - b0]
        gm[i, 0] = head
        gm[i, 1] = tail
        gm[i, 2] = qlen
        gm[i, 3] = nt
        gm[i, 4] = pushes
        gm[i, 5] = status


@numba.njit(cache=True, nogil=True)
def _dense_missing(rp, queue, gm, hs, ast, src, vid, want):  # pragma: no cover
    """int64, sorted distinct: the nodes queued by the group's paused pushes without a row to read (held, or stored
    where :func:`_dense_run` may read it; ``want``: zeros of the state's width, zeros again on return)."""
    qcap = queue.shape[1]
    m = 0
    for i in range(src.shape[0]):
        if gm[i, 5] == _PAUSED:
            m += gm[i, 2]
    out = np.empty(m, dtype=np.int64)
    m = 0
    for i in range(src.shape[0]):
        if gm[i, 5] != _PAUSED:
            continue
        virtual = src[i] == vid
        j = gm[i, 0]
        for _ in range(gm[i, 2]):
            v = queue[i, j]
            j += 1
            if j == qcap:
                j = 0
            if rp[i, v, 0] > 0.0 and not (virtual and v == vid) and hs[v] < 0 and want[v] == 0:
                if hs[v] == -1 and v < ast.shape[0] and ast[v] >= 0:
                    continue  # its stored row is read
                want[v] = 1
                out[m] = v
                m += 1
    out = np.sort(out[:m])
    for j in range(m):
        want[out[j]] = 0
    return out


@numba.njit(cache=True, nogil=True)
def _dense_collect(rp, touched, i, nt):  # pragma: no cover - compiled
    """Push ``i``'s slots out of the group's dense state: the ``nt`` nodes it touched (the source first), their
    (residue, estimate) and estimates, as :class:`PartialPush` holds them (a NumPy gather ``rp[i, ids]`` cost a
    fifth of the pushes' time)."""
    ids = np.empty(nt, dtype=np.int64)
    rw = np.empty((nt, 2), dtype=np.float64)
    p = np.empty(nt, dtype=np.float64)
    for j in range(nt):
        v = touched[i, j]
        ids[j] = v
        rw[j, 0] = rp[i, v, 0]
        rw[j, 1] = rp[i, v, 1]
        p[j] = rp[i, v, 1]
    return ids, rw, p


#: no stored rows (:func:`_dense_run`'s ``ast, al, acol, aw``): every row is fetched
_NO_STORED = (np.full(0, -1, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32),
              np.zeros(0, dtype=np.float32))


class _DenseHeld:
    """The rows fetched during one dense :func:`run_partial`, shared by all its pushes: node ``u``'s columns at
    ``hcol[hs[u]:hs[u] + hl[u]]`` (``hs[u] < 0``: not fetched; -2: nor its stored row to be read), weights ``hw``;
    every fetched column's degree ``deg`` and base push threshold ``thrb`` (``eps`` times the degree, ``eps``
    without one)."""

    def __init__(self, width: int, eps: float) -> None:
        self.eps = eps
        self.hs = np.full(width, -1, dtype=np.int64)
        self.hl = np.zeros(width, dtype=np.int64)
        self.deg = np.zeros(width, dtype=np.float64)
        self.thrb = np.zeros(width, dtype=np.float64)
        self.want = np.zeros(width, dtype=np.uint8)
        self.known = np.zeros(width, dtype=np.uint8)  # the degree of the node is in deg (and thrb)
        self.hcol = np.empty(1 << 14, dtype=np.int32)
        self.hw = np.empty(1 << 14, dtype=np.float64)
        self.used = 0
        self.weighted = False

    def add(self, need: np.ndarray, rows: Callable[..., Any], degrees: Callable[[np.ndarray], np.ndarray]) -> None:
        """Fetch and hold the rows of ``need`` (sorted distinct, none held), with the degrees of their columns not
        known yet (one ``degrees`` call for those, each once per run)."""
        ptr, cols, ws = rows(need)
        ptr = np.asarray(ptr, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        ws = _NO_W if ws is None else np.asarray(ws, dtype=np.float64)
        end = self.used + len(cols)
        if end > len(self.hcol):
            size = max(end, 2 * len(self.hcol))
            self.hcol = _grown(self.hcol, size)
            self.hw = _grown(self.hw, size)
        self.used, other, fresh = _dense_hold(self.hs, self.hl, self.hcol, self.hw, self.used, need, ptr, cols, ws,
                                              self.known)
        if len(fresh):
            _dense_degrees(self.deg, self.thrb, fresh, np.asarray(degrees(fresh), dtype=np.float64), self.eps)
        self.weighted |= bool(other)


def _dense_ok(pushes: Sequence[PartialPush], num_nodes: int) -> int:
    """The dense engine's group size for ``pushes`` (:func:`dense_group`), 0 where it may not run them."""
    first = pushes[0]
    for ps in pushes:
        src = ps._spec[0]
        if not ps._fresh or ps.cfg != first.cfg or not 0 <= src <= num_nodes or (len(ps.nb) and src != num_nodes):
            return 0
    return dense_group(len(pushes), num_nodes)


def _run_dense(pushes: Sequence[PartialPush], group: int, num_nodes: int, rows: Callable[..., Any],
               degrees: Callable[[np.ndarray], np.ndarray],
               stored: tuple[Any, np.ndarray, np.ndarray] | None = None) -> int:
    """:func:`run_partial` on dense state: ``group`` pushes at a time in lockstep over the rows fetched for all (or
    the rows of ``stored``'s arena, read in place)."""
    cfg = pushes[0].cfg
    width = int(num_nodes) + 2
    held = _DenseHeld(width, cfg.eps)
    arena = None
    if stored is not None and len(stored[1]) == num_nodes and stored[0].num_nodes <= num_nodes:
        arena, d, own = stored  # every degree known up front: no column's degree is asked for
        d = np.asarray(d, dtype=np.float64)
        held.deg[:num_nodes] = d
        held.thrb[:num_nodes] = np.where(d > 0.0, cfg.eps * d, cfg.eps)  # _dense_degrees' thresholds, elementwise
        held.known[:num_nodes] = 1
        held.hs[np.asarray(own, dtype=np.int64)] = -2  # rows not the stored ones (an update's): fetched
    rounds = 0
    for g0 in range(0, len(pushes), group):
        part = pushes[g0 : g0 + group]
        count = len(part)
        src = np.array([ps._spec[0] for ps in part], dtype=np.int64)
        wself = np.array([ps._spec[1] for ps in part], dtype=np.float64)
        cap = np.array([ps.max_pushes for ps in part], dtype=np.int64)
        nbo = np.zeros(count + 1, dtype=np.int64)
        np.cumsum([len(ps.nb) for ps in part], out=nbo[1:])
        nb = np.concatenate([ps.nb for ps in part]) if nbo[-1] else _NO_NB
        nbw = np.concatenate([ps.nbw for ps in part]) if nbo[-1] else _NO_W
        nbd = np.concatenate([ps._spec[2] for ps in part]) if nbo[-1] else _NO_W
        rp = np.zeros((count, width, 2), dtype=np.float64)
        seen = np.zeros((count, width), dtype=np.uint8)
        touched = np.empty((count, width), dtype=np.int32)
        queue = np.empty((count, width), dtype=np.int32)
        gm = np.zeros((count, 6), dtype=np.int64)
        _dense_init(rp, seen, touched, queue, gm, held.deg, held.thrb, held.known, src, wself, nbo, nb, nbd, cfg.eps)
        while True:
            with arena.held() if arena is not None else contextlib.nullcontext(_NO_STORED) as (ast, al, acol, aw):
                _dense_run(rp, seen, touched, queue, gm, held.hs, held.hl, held.hcol, held.hw, held.weighted, ast, al,
                           acol, aw, arena is not None and arena.weighted, held.deg, held.thrb, src, wself, nbo, nb,
                           nbw, int(num_nodes), cfg.alpha, cfg.eps, cfg.lazy, cap)
                need = _dense_missing(rp, queue, gm, held.hs, ast, src, int(num_nodes), held.want)
            if not len(need):
                break
            held.add(need, rows, degrees)  # (rows fetched by a store with an arena join it too, for the next runs)
            rounds += 1
        for i, ps in enumerate(part):  # the push's slots: the nodes it touched, the source first
            nt = int(gm[i, 3])
            ps.ids, ps.rw, ps.p = _dense_collect(rp, touched, i, nt)  # rw: (residue, estimate); result() reads both
            ps.meta[0] = nt
            ps.meta[4] = gm[i, 4]
            ps.status = int(gm[i, 5])
    return rounds
