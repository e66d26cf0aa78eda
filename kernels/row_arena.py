"""Adjacency rows end to end in arrays, for a stateless replica (:mod:`serve.graph.store`).

A replica's rows arrive one node at a time from Redis and sit in a dictionary LRU of decoded ``(ids, weights)``
tuples. A PPR push that reaches thousands of nodes asks for its rows as arrays (``RedisGraphStore.rows_csr``); taking
them out of the dictionary one by one and laying them end to end was most of a push's time (2026-11-28: 9 ms of a
17 ms push of 8 new nodes on Amazon Computers, docs/BENCHMARKS.md). :class:`RowArena` keeps the stored rows it is
given in two arrays, a node's row at ``start[v] .. start[v] + length[v]``, so the rows of any set of nodes come out
in one compiled pass.

It never evicts: rows of one stored graph version never change (a replica's live edits are an overlay in front of
them), and once its byte budget is full it takes no more rows (callers then read the LRU as before). Its per-node
index costs 12 bytes a node, so a store makes one only where that index is a small part of the budget
(:meth:`RowArena.fits`). Thread-safe: one lock around adding and gathering.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numba
import numpy as np

__all__ = ["RowArena"]

_NO_F32 = np.zeros(0, dtype=np.float32)


@numba.njit(cache=True, nogil=True)
def _missing(start, ids):  # pragma: no cover - compiled
    out = np.empty(ids.shape[0], dtype=np.int64)
    m = 0
    for i in range(ids.shape[0]):
        if start[ids[i]] < 0:
            out[m] = ids[i]
            m += 1
    return out[:m]


@numba.njit(cache=True, nogil=True)
def _add(start, length, acols, aw, used, ids, lens, cols, ws, weighted):  # pragma: no cover - compiled
    """Copy the rows of ``ids`` (``lens`` of ``cols``, end to end) not held yet, while they fit: ``(used size, rows
    added, whether one did not fit)``."""
    cap = acols.shape[0]
    e = 0
    added = 0
    for i in range(ids.shape[0]):
        n = lens[i]
        v = ids[i]
        if start[v] < 0:
            if used + n > cap:
                return used, added, True
            for j in range(n):
                acols[used + j] = cols[e + j]
                if weighted:
                    aw[used + j] = ws[e + j]
            start[v] = used
            length[v] = n
            used += n
            added += 1
        e += n
    return used, added, False


@numba.njit(cache=True, nogil=True)
def _gather(start, length, acols, aw, ids, weighted):  # pragma: no cover - compiled
    """``(ok, ptr, cols, weights)`` of the rows of ``ids`` in order; ``ok`` False when one is not held."""
    b = ids.shape[0]
    ptr = np.zeros(b + 1, dtype=np.int64)
    for i in range(b):
        s = start[ids[i]]
        if s < 0:
            return False, ptr, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        ptr[i + 1] = ptr[i] + length[ids[i]]
    cols = np.empty(ptr[b], dtype=np.int64)
    ws = np.empty(ptr[b] if weighted else 0, dtype=np.float64)
    for i in range(b):
        s = start[ids[i]]
        o = ptr[i]
        for j in range(ptr[i + 1] - o):
            cols[o + j] = acols[s + j]
            if weighted:
                ws[o + j] = aw[s + j]
    return True, ptr, cols, ws


class RowArena:
    """Rows of nodes ``0 .. num_nodes - 1`` end to end, at most ``budget_bytes`` in all (index included).

    ``weighted``: rows carry float32 weights (given with each row, returned as float64). Columns are kept as int32
    (node ids of one graph).
    """

    #: bytes of the per-node index (start int64, length int32)
    INDEX_BYTES = 12

    def __init__(self, num_nodes: int, budget_bytes: int, weighted: bool) -> None:
        self.num_nodes = int(num_nodes)
        self.weighted = bool(weighted)
        self.budget = int(budget_bytes)
        self._per_col = 4 + 4 * self.weighted
        self.max_cols = max(0, (self.budget - self.INDEX_BYTES * self.num_nodes) // self._per_col)
        self._start = np.full(self.num_nodes, -1, dtype=np.int64)
        self._length = np.zeros(self.num_nodes, dtype=np.int32)
        self._cols = np.empty(min(self.max_cols, 1 << 14), dtype=np.int32)
        self._w = np.empty(len(self._cols) if self.weighted else 0, dtype=np.float32)
        self._used = 0
        self.rows = 0
        self.full = False
        self._lock = threading.Lock()

    @classmethod
    def fits(cls, num_nodes: int, budget_bytes: int) -> bool:
        """Whether an arena of ``budget_bytes`` keeps its index within a quarter of them."""
        return num_nodes > 0 and 4 * cls.INDEX_BYTES * num_nodes <= budget_bytes

    @property
    def nbytes(self) -> int:
        return int(self._start.nbytes + self._length.nbytes + self._cols.nbytes + self._w.nbytes)

    def missing(self, ids: np.ndarray) -> np.ndarray:
        """The ids among ``ids`` (each in ``[0, num_nodes)``) whose rows are not held, in order."""
        with self._lock:
            return _missing(self._start, np.ascontiguousarray(ids, dtype=np.int64))

    def add(self, ids: np.ndarray, lens: np.ndarray, cols: np.ndarray, weights: np.ndarray | None = None) -> int:
        """Hold the rows of the distinct ``ids`` (``lens[i]`` columns each, ``cols`` end to end, ``weights`` beside
        them on a weighted arena) that are not held yet, in order, while the budget allows; the rows now held."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        lens = np.ascontiguousarray(lens, dtype=np.int64)
        cols = np.ascontiguousarray(cols, dtype=np.int32)
        if len(ids) != len(lens) or int(lens.sum()) != len(cols):
            raise ValueError(f"{len(ids)} ids, {len(lens)} lengths adding up to {int(lens.sum())}, {len(cols)} columns")
        if self.weighted and (weights is None or len(weights) != len(cols)):
            raise ValueError("a weighted arena needs one weight per column")
        ws = np.ascontiguousarray(weights, dtype=np.float32) if self.weighted else _NO_F32
        with self._lock:
            if self.full:
                return self.rows
            need = self._used + len(cols)
            if need > len(self._cols):
                size = min(self.max_cols, max(need, 2 * len(self._cols)))
                grown = np.empty(size, dtype=np.int32)
                grown[: self._used] = self._cols[: self._used]
                self._cols = grown
                if self.weighted:
                    gw = np.empty(size, dtype=np.float32)
                    gw[: self._used] = self._w[: self._used]
                    self._w = gw
            used, added, stopped = _add(self._start, self._length, self._cols, self._w, self._used, ids, lens, cols,
                                        ws, self.weighted)
            self._used = int(used)
            self.rows += int(added)
            self.full = bool(stopped)  # a row did not fit: the budget is spent, no more rows
            return self.rows

    @contextlib.contextmanager
    def held(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """``(start int64, length int32, columns int32, weights float32)``, the arena's own arrays (node ``v``'s row at
        ``columns[start[v]:start[v] + length[v]]``, ``start[v] < 0`` where it is not held; no weights unweighted), to
        read inside the block, which holds the arena's lock (rows added meanwhile wait), and not to write."""
        with self._lock:
            yield self._start, self._length, self._cols, self._w

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
        """``(ptr int64 [len(ids) + 1], columns int64, weights float64 or None)`` of the rows of ``ids`` in order, or
        None when one of them is not held."""
        with self._lock:
            ok, ptr, cols, ws = _gather(self._start, self._length, self._cols, self._w,
                                        np.ascontiguousarray(ids, dtype=np.int64), self.weighted)
        if not ok:
            return None
        return ptr, cols, (ws if self.weighted else None)
