"""A cache in front of any feature store: a static hot tier plus an LRU tier, sized in bytes.

* **Hot tier**: the rows of the nodes that appear most often inside the PPR top-K lists (every
  request for a nearby target needs them). The set is computed once from the index
  (:func:`hot_set_from_index`), its rows are fetched at start (:meth:`TieredFeatureStore.warm`) and
  never evicted. A hot row that could not be fetched yet (backend down at start) is fetched on first
  use and then stays.
* **LRU tier**: every other row fetched from the backend, evicted least-recently-used first. The
  recency clock ticks once per ``get`` (per batch); eviction is done in bulk (at least 1/16 of the
  tier at a time, the rows with the oldest ticks, never rows touched by the current batch), which
  keeps the bookkeeping vectorized: one ``argpartition`` per eviction instead of a linked list
  walked per row.

Byte budget: ``budget_bytes`` covers the cached rows (``F x itemsize`` each, in the backend's
storage dtype: float16 rows are cached as float16, losslessly). ``hot_fraction`` of it (default
3/4) goes to the hot tier when a hot set is given, capped at the size of that set; the LRU tier gets
the rest. Bookkeeping adds 4 bytes per graph node (a node -> slot map) and 17 bytes per cached row.

Device: ``device=None`` keeps the rows in a NumPy array. A torch device string (``"cuda"``,
``"cuda:1"``, or ``"cpu"`` for a torch tensor on the host) keeps them in a torch tensor on that
device, and :meth:`TieredFeatureStore.get_tensor` returns batches there without a host round trip
for hits; torch is imported only in that case.

Never wrong numbers: rows are copied out under the lock that guards eviction; rows from the
backend are copied in only after the backend checked them (corrupt rows raise and are never
cached). With the backend down, :meth:`get` answers batches whose rows are all cached and raises
:class:`~serve.features.base.FeatureUnavailable` for any other; :meth:`get_partial` returns the
cached rows with a mask.

Metrics (:mod:`serve.features.metrics`, label ``store`` = this store's name): hits per tier,
misses, backend fetch latency, bytes per tier; :meth:`stats` gives the same numbers as a dict.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry

from .base import (
    FeatureCorrupt,
    FeatureStore,
    FeatureStoreError,
    FeatureUnavailable,
    LatencyWindow,
    check_node_ids,
    dedupe_ids,
)

__all__ = ["TieredFeatureStore", "hot_set_from_index"]

log = logging.getLogger(__name__)


def hot_set_from_index(ptr: np.ndarray, nodes: np.ndarray, num_nodes: int | None = None, *,
                       min_count: int = 1) -> np.ndarray:
    """Node ids ranked by how many PPR top-K lists contain them (most frequent first).

    Args:
        ptr: int64 ``[B + 1]`` list boundaries (CSR, see ``docs/ARCHITECTURE.md``).
        nodes: int ``[ptr[-1]]`` the lists' node ids (list ``b`` is ``nodes[ptr[b]:ptr[b + 1]]``).
        num_nodes: N (default ``max(nodes) + 1``).
        min_count: drop nodes in fewer lists than this (default: keep every node that appears).

    Returns:
        int64 ids, sorted by descending frequency (``np.bincount(nodes)``), ties by ascending id.
    """
    ptr = np.asarray(ptr)
    nodes = np.asarray(nodes)
    if ptr.ndim != 1 or len(ptr) < 1 or int(ptr[0]) != 0 or int(ptr[-1]) > len(nodes):
        raise ValueError(f"ptr must be a CSR pointer array starting at 0 and ending at <= len(nodes) = {len(nodes)}")
    used = nodes[: int(ptr[-1])]
    if used.size == 0:
        return np.zeros(0, dtype=np.int64)
    if used.dtype.kind not in "iu" or int(used.min()) < 0:
        raise ValueError("nodes must hold non-negative integer ids")
    n = int(num_nodes) if num_nodes is not None else int(used.max()) + 1
    if int(used.max()) >= n:
        raise ValueError(f"nodes refer to id {int(used.max())} >= num_nodes = {n}")
    counts = np.bincount(used, minlength=n)
    order = np.argsort(-counts, kind="stable")  # stable: ties keep ascending id order
    return order[counts[order] >= max(1, min_count)].astype(np.int64)


class _Rows:
    """Row storage of the cache: a NumPy array or a torch tensor on some device."""

    def __init__(self, capacity: int, width: int, dtype: np.dtype, device: str | None) -> None:
        self.device = device
        if device is None:
            self.torch = None
            self.data: Any = np.zeros((capacity, width), dtype=dtype)
        else:
            import torch  # only on this branch: the stores stay torch-free otherwise

            self.torch = torch
            tdt = torch.float16 if dtype == np.float16 else torch.float32
            self.data = torch.zeros((capacity, width), dtype=tdt, device=torch.device(device))

    def gather_numpy(self, slots: np.ndarray) -> np.ndarray:
        """Rows at ``slots`` as a new float32 NumPy array."""
        if self.torch is None:
            rows = self.data[slots]
            return rows if rows.dtype == np.float32 else rows.astype(np.float32)
        idx = self.torch.from_numpy(slots.astype(np.int64)).to(self.data.device)
        return self.data.index_select(0, idx).float().cpu().numpy()

    def gather_tensor(self, slots: np.ndarray) -> Any:
        """Rows at ``slots`` as a float32 torch tensor on the cache's device."""
        torch = self.torch
        assert torch is not None
        idx = torch.from_numpy(slots.astype(np.int64)).to(self.data.device)
        return self.data.index_select(0, idx).float()

    def scatter(self, slots: np.ndarray, rows: np.ndarray) -> None:
        if self.torch is None:
            self.data[slots] = rows
            return
        idx = self.torch.from_numpy(slots.astype(np.int64)).to(self.data.device)
        self.data.index_copy_(0, idx, self.torch.from_numpy(np.ascontiguousarray(rows)).to(
            device=self.data.device, dtype=self.data.dtype))


class TieredFeatureStore(FeatureStore):
    """Hot static tier + LRU tier in front of ``backend`` (any :class:`FeatureStore`).

    Args:
        backend: where misses are fetched (Redis, memory, ...). Not closed by :meth:`close`
            unless ``close_backend``.
        hot_ids: node ids ranked by priority (e.g. :func:`hot_set_from_index`); the first ones that
            fit the hot share of the budget form the static tier. ``None``: LRU only.
        budget_bytes: bytes for cached rows (both tiers).
        hot_fraction: share of the budget for the hot tier (when ``hot_ids`` is given).
        device: ``None`` for NumPy, or a torch device string (``"cuda"``, ``"cuda:0"``, ``"cpu"``).
        warm: fetch the hot rows now (a backend that is down only logs a warning: the rows are
            fetched on first use).
        name, registry: label and Prometheus registry (default: the global one).
        close_backend: close the backend together with this store.
    """

    name = "tiered"

    def __init__(
        self,
        backend: FeatureStore,
        *,
        hot_ids: np.ndarray | None = None,
        budget_bytes: int = 256 << 20,
        hot_fraction: float = 0.75,
        device: str | None = None,
        warm: bool = True,
        name: str | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        close_backend: bool = False,
    ) -> None:
        super().__init__(name=name, registry=registry)
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        if not 0.0 <= hot_fraction <= 1.0:
            raise ValueError(f"hot_fraction must lie in [0, 1], got {hot_fraction}")
        self.backend = backend
        self._close_backend = close_backend
        self._dtype = np.dtype(backend.dtype)
        self._row_bytes = backend.num_features * self._dtype.itemsize
        self._capacity = int(budget_bytes // self._row_bytes)
        self._hot_fraction = float(hot_fraction)
        self._budget = int(budget_bytes)
        self._device = device
        self._lock = threading.Lock()
        self._layout(self._rank_hot(hot_ids))
        #: set by ``open_store(hot="ppr")``: the hot tier waits for ``install_hot_from_index``
        self.hot_from_ppr_pending = False
        self._hits_hot = self._hits_lru = self._misses = self._evictions = 0
        self._backend_latency = LatencyWindow()
        self._backend_errors: dict[str, int] = {}
        if self._metrics is not None:
            for tier in ("hot", "lru"):
                self._metrics.cache_hits.labels(self.name, tier)
            self._metrics.cache_misses.labels(self.name)
        self._update_bytes()
        log.info("tiered feature store %s: hot %d rows, LRU %d rows (%.1f MiB budget, %s) in front of %s",
                 self.name, self._h, self._c, budget_bytes / 2**20, device or "numpy", backend.name)
        if warm and self._h:
            self.warm()

    def _rank_hot(self, hot_ids: np.ndarray | None) -> np.ndarray:
        """The static tier's ids: ``hot_ids`` without repeats, cut to the hot share of the budget."""
        if hot_ids is None or not self._capacity:
            return np.zeros(0, dtype=np.int64)
        hot_ids = check_node_ids(hot_ids, self.backend.num_nodes)
        _, first = np.unique(hot_ids, return_index=True)  # drop repeats, keep priority order
        return hot_ids[np.sort(first)][: int(self._capacity * self._hot_fraction)]

    def _layout(self, hot: np.ndarray) -> None:
        """(Re)build both tiers empty, ``hot`` reserving the first slots."""
        n, f = self.backend.num_nodes, self.backend.num_features
        self._h = len(hot)
        self._c = self._capacity - self._h  # LRU rows
        total = self._h + self._c
        self._rows = _Rows(total, f, self._dtype, self._device)
        self._slot = np.full(n, -1, dtype=np.int32 if total < 2**31 - 1 else np.int64)
        self._node = np.full(total, -1, dtype=np.int64)
        self._filled = np.zeros(total, dtype=bool)
        self._last = np.zeros(total, dtype=np.int64)
        self._slot[hot] = np.arange(self._h, dtype=self._slot.dtype)
        self._node[: self._h] = hot
        self._free = np.arange(total - 1, self._h - 1, -1, dtype=np.int64)  # a stack: pops slot H first
        self._nfree = self._c
        self._tick = 0

    def set_hot(self, hot_ids: np.ndarray, *, warm: bool = True) -> int:
        """Install a static hot tier after construction (e.g. once the PPR index exists).

        The budget is split again (``hot_fraction`` of it for the first of ``hot_ids``); rows
        cached so far are dropped, then the hot rows are fetched (``warm``). Returns the number
        of hot rows.
        """
        hot = self._rank_hot(np.asarray(hot_ids))
        with self._lock:
            self._layout(hot)
        self._update_bytes()
        log.info("tiered feature store %s: static hot tier of %d rows installed, LRU %d rows", self.name,
                 self._h, self._c)
        if warm and self._h:
            self.warm()
        return self._h

    @property
    def data_version(self) -> str:
        """The backend's data version (see ``RedisFeatureStore.data_version``), ``""`` if it has none."""
        return str(getattr(self.backend, "data_version", "") or "")

    # ---------------------------------------------------------------- shape
    @property
    def num_nodes(self) -> int:
        return self.backend.num_nodes

    @property
    def num_features(self) -> int:
        return self.backend.num_features

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def hot_ids(self) -> np.ndarray:
        """The static tier's node ids, in priority order."""
        return self._node[: self._h].copy()

    # ---------------------------------------------------------------- warm-up
    def warm(self, chunk: int = 8192) -> int:
        """Fetch hot rows not cached yet; returns how many are cached afterwards.

        A backend that is unavailable stops the warm-up with a warning (the rest are fetched on
        first use). Corrupt rows are logged and left out (requests that need them will raise).
        """
        with self._lock:
            todo = self._node[: self._h][~self._filled[: self._h]]
        for a in range(0, len(todo), chunk):
            ids = np.sort(todo[a : a + chunk])
            try:
                rows = self._backend_get(ids)
            except FeatureUnavailable as exc:
                log.warning("warming the hot tier of %s stopped: %s", self.name, exc)
                break
            except FeatureCorrupt as exc:
                log.error("hot tier of %s: %s", self.name, exc)
                good = np.setdiff1d(ids, exc.node_ids)
                if exc.num_bad != len(exc.node_ids) or len(good) == 0:
                    continue
                try:
                    rows, ids = self._backend_get(good), good
                except FeatureStoreError:
                    continue
            except FeatureStoreError as exc:
                log.error("hot tier of %s: %s", self.name, exc)
                continue
            with self._lock:
                self._insert(ids, rows)
        with self._lock:
            filled = int(self._filled[: self._h].sum())
        self._update_bytes()
        return filled

    # ---------------------------------------------------------------- reads
    def _backend_get(self, ids: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            rows = self.backend.get(ids)
        except FeatureStoreError as exc:
            key = type(exc).__name__
            with self._lock:
                self._backend_errors[key] = self._backend_errors.get(key, 0) + 1
            raise
        dt = time.perf_counter() - t0
        self._backend_latency.add(dt)
        if self._metrics is not None:
            self._metrics.backend_seconds.labels(self.name).observe(dt)
        return rows

    def _lookup(self, unique: np.ndarray, *, as_tensor: bool = False) -> tuple[Any, np.ndarray]:
        """Cached rows of sorted distinct ``unique``: ``(rows float32 [U, F] (misses zero), hit mask)``."""
        with self._lock:
            self._tick += 1
            slots = self._slot[unique].astype(np.int64)
            hit = slots >= 0
            hit[hit] = self._filled[slots[hit]]
            hs = slots[hit]
            lru = hs >= self._h
            self._last[hs[lru]] = self._tick
            n_lru = int(lru.sum())
            self._hits_lru += n_lru
            self._hits_hot += len(hs) - n_lru
            self._misses += len(unique) - len(hs)
            if as_tensor:
                torch = self._torch()
                out = torch.zeros((len(unique), self.num_features), dtype=torch.float32,
                                  device=self._rows.data.device if self._rows.torch else "cpu")
                if len(hs):
                    pos = torch.from_numpy(np.flatnonzero(hit)).to(out.device)
                    out[pos] = (self._rows.gather_tensor(hs) if self._rows.torch else
                                torch.from_numpy(self._rows.gather_numpy(hs)))
            else:
                out = np.zeros((len(unique), self.num_features), dtype=np.float32)
                if len(hs):
                    out[hit] = self._rows.gather_numpy(hs)
        if self._metrics is not None:
            m = self._metrics
            if len(hs) - n_lru:
                m.cache_hits.labels(self.name, "hot").inc(len(hs) - n_lru)
            if n_lru:
                m.cache_hits.labels(self.name, "lru").inc(n_lru)
            if len(unique) - len(hs):
                m.cache_misses.labels(self.name).inc(len(unique) - len(hs))
        return out, hit

    def _insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Put backend rows of distinct ``ids`` into the cache (caller holds the lock)."""
        slots = self._slot[ids].astype(np.int64)
        known = slots >= 0
        # Rows with a reserved slot (hot, or inserted by another thread meanwhile): fill if empty.
        refill = known.copy()
        refill[known] = ~self._filled[slots[known]]
        if refill.any():
            self._rows.scatter(slots[refill], rows[refill])
            self._filled[slots[refill]] = True
        new = np.flatnonzero(~known)
        if len(new) == 0 or self._c == 0:
            return
        if len(new) > self._c:
            new = new[: self._c]
        if self._nfree < len(new):
            self._evict(max(len(new) - self._nfree, self._c // 16))
        k = min(len(new), self._nfree)
        if k == 0:
            return
        new = new[:k]
        take = self._free[self._nfree - k : self._nfree][::-1].copy()
        self._nfree -= k
        self._rows.scatter(take, rows[new])
        self._slot[ids[new]] = take
        self._node[take] = ids[new]
        self._filled[take] = True
        self._last[take] = self._tick

    def _evict(self, want: int) -> None:
        """Free up to ``want`` LRU slots: the least recently used, never ones used by this tick."""
        lo = self._h
        used = np.flatnonzero(self._filled[lo:] & (self._last[lo:] < self._tick)) + lo
        want = min(want, len(used))
        if want <= 0:
            return
        if want < len(used):
            victims = used[np.argpartition(self._last[used], want - 1)[:want]]
        else:
            victims = used
        self._slot[self._node[victims]] = -1
        self._node[victims] = -1
        self._filled[victims] = False
        self._free[self._nfree : self._nfree + len(victims)] = victims
        self._nfree += len(victims)
        self._evictions += len(victims)

    def _fetch_unique(self, ids: np.ndarray) -> np.ndarray:
        out, hit = self._lookup(ids)
        if hit.all():
            return out
        miss = ids[~hit]
        try:
            rows = self._backend_get(miss)
        except FeatureUnavailable as exc:
            raise FeatureUnavailable(
                f"{len(miss)} of {len(ids)} rows are not cached by {self.name!r} and its backend is unavailable: {exc}"
            ) from None
        out[~hit] = rows
        with self._lock:
            self._insert(miss, rows)
        self._update_bytes()
        return out

    def get_partial(self, node_ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Cached rows plus whatever the backend can give; rows it cannot are NaN, mask False."""
        self._check_open()
        ids = check_node_ids(node_ids, self.num_nodes)
        if ids.size == 0:
            return np.zeros((0, self.num_features), dtype=np.float32), np.zeros(0, dtype=bool)
        t0 = time.perf_counter()
        unique, inverse = dedupe_ids(ids)
        out, hit = self._lookup(unique)
        present = hit.copy()
        if not hit.all():
            miss = unique[~hit]
            try:
                rows = self._backend_get(miss)
                out[~hit] = rows
                present[:] = True
                with self._lock:
                    self._insert(miss, rows)
                self._update_bytes()
            except FeatureUnavailable as exc:
                self._count_error(exc)
                out[~hit] = np.nan
        self._account(len(ids), len(unique), time.perf_counter() - t0)
        if inverse is None:
            return out, present
        return out[inverse], present[inverse]

    def get_tensor(self, node_ids: Any) -> Any:
        """Like :meth:`get` but a float32 torch tensor on the cache's device (CPU for NumPy caches).

        Hits are gathered on the device; only misses travel from the backend (host) to the device.
        """
        self._check_open()
        torch = self._torch()
        ids = check_node_ids(node_ids, self.num_nodes)
        t0 = time.perf_counter()
        try:
            unique, inverse = dedupe_ids(ids)
            out, hit = self._lookup(unique, as_tensor=True)
            if not hit.all():
                miss = unique[~hit]
                try:
                    rows = self._backend_get(miss)
                except FeatureUnavailable as exc:
                    raise FeatureUnavailable(f"{len(miss)} of {len(unique)} rows are not cached by {self.name!r} "
                                             f"and its backend is unavailable: {exc}") from None
                pos = torch.from_numpy(np.flatnonzero(~hit)).to(out.device)
                out[pos] = torch.from_numpy(rows).to(out.device)
                with self._lock:
                    self._insert(miss, rows)
                self._update_bytes()
        except FeatureStoreError as exc:
            self._count_error(exc)
            raise
        self._account(len(ids), len(unique), time.perf_counter() - t0)
        if inverse is None:
            return out
        return out.index_select(0, torch.from_numpy(inverse).to(out.device))

    @staticmethod
    def _torch() -> Any:
        import torch

        return torch

    # ---------------------------------------------------------------- lifecycle and stats
    def ping(self) -> bool:
        return not self._closed and self.backend.ping()

    def close(self) -> None:
        if self._close_backend and not self._closed:
            self.backend.close()
        super().close()

    def clear_lru(self) -> None:
        """Drop every LRU row (the hot tier stays)."""
        with self._lock:
            lru = np.arange(self._h, self._h + self._c)
            held = lru[self._filled[lru]]
            self._slot[self._node[held]] = -1
            self._node[lru] = -1
            self._filled[lru] = False
            self._free[: self._c] = lru[::-1]
            self._nfree = self._c
        self._update_bytes()

    def _update_bytes(self) -> None:
        if self._metrics is None:
            return
        hot = int(self._filled[: self._h].sum()) * self._row_bytes
        lru = (self._c - self._nfree) * self._row_bytes
        self._metrics.cache_bytes.labels(self.name, "hot").set(hot)
        self._metrics.cache_bytes.labels(self.name, "lru").set(lru)

    def stats(self) -> dict[str, Any]:
        """Base counters plus per-tier hits, misses, hit ratios (over distinct rows per batch),
        tier sizes, evictions and the backend's fetch latency."""
        s = super().stats()
        with self._lock:
            hh, hl, m = self._hits_hot, self._hits_lru, self._misses
            hot_filled = int(self._filled[: self._h].sum())
            lru_used = self._c - self._nfree
            ev = self._evictions
            errs = dict(self._backend_errors)
        lookups = hh + hl + m
        s.update({
            "backend": self.backend.name,
            "device": self._device or "numpy",
            "budget_bytes": self._budget,
            "row_bytes": self._row_bytes,
            "hot_rows": self._h,
            "hot_filled": hot_filled,
            "lru_rows": self._c,
            "lru_used": lru_used,
            "hits_hot": hh,
            "hits_lru": hl,
            "misses": m,
            "hit_ratio": (hh + hl) / lookups if lookups else float("nan"),
            "hot_hit_ratio": hh / lookups if lookups else float("nan"),
            "evictions": ev,
            "backend_errors": errs,
            "backend_latency": self._backend_latency.summary(),
        })
        return s

    def __repr__(self) -> str:
        return (f"TieredFeatureStore(name={self.name!r}, hot={self._h}, lru={self._c}, "
                f"device={self._device or 'numpy'}, backend={self.backend!r})")
