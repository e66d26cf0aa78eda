"""The feature-store interface, its errors, and the id helpers every store shares.

A feature store maps node ids to rows of a float32 feature matrix ``[N, F]``:

* :meth:`FeatureStore.get` takes any 1-D integer array (duplicates allowed, any order) and returns
  a new C-contiguous float32 array ``[n, F]`` with row ``i`` holding the features of
  ``node_ids[i]``. Ids outside ``[0, N)`` raise :class:`InvalidNodeIds`; stores that talk to a
  remote service fetch every distinct id once per call (:func:`dedupe_ids`).
* Errors form one hierarchy rooted at :class:`FeatureStoreError`, free of gRPC; the server maps
  them to status codes in one place (``serve.errors.status_for``):

  =========================  ==================================================  ==============
  class                      meaning                                             gRPC status
  =========================  ==================================================  ==============
  :class:`FeatureUnavailable`  a dependency is down or timed out (retried first)  UNAVAILABLE
  :class:`FeatureCorrupt`      a stored blob failed its checks (length, header,    DATA_LOSS
                               NaN/inf): never used
  :class:`FeatureNotFound`     keys or a feature version are missing / not live    UNAVAILABLE
  :class:`DataVersionChanged`  the pinned version was deleted or reloaded with       DATA_LOSS
                               other content (digest differs)
  :class:`InvalidNodeIds`      ids not 1-D integers or out of range (a caller      INVALID_ARGUMENT
                               bug: the server validates requests before this)
  =========================  ==================================================  ==============

Storage dtype (:attr:`FeatureStore.dtype`) may be float16 (half the memory and bandwidth); values
are always widened to float32 on the way out.
"""

from __future__ import annotations

import abc
import math
import threading
import time
from collections import deque
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry

from .metrics import metrics_for

__all__ = [
    "DataVersionChanged",
    "FeatureCorrupt",
    "FeatureNotFound",
    "FeatureStore",
    "FeatureStoreError",
    "FeatureUnavailable",
    "InvalidNodeIds",
    "LatencyWindow",
    "check_node_ids",
    "dedupe_ids",
    "summarize_ids",
]


# --------------------------------------------------------------------------- errors
class FeatureStoreError(Exception):
    """Base class of every error a feature store raises on purpose."""


class FeatureUnavailable(FeatureStoreError):
    """The backing service is down, unreachable or timed out after the bounded retries.

    Transient by nature: the same call can succeed once the dependency is back, without
    recreating the store (connections are re-established from the pool).
    """


class FeatureCorrupt(FeatureStoreError):
    """Stored data failed its checks: wrong blob length, header (dtype/width), NaN or infinity.

    Attributes:
        node_ids: int64 array of the offending node ids (may be truncated to the first few
            hundred; ``num_bad`` holds the full count).
        num_bad: how many nodes failed.
    """

    def __init__(self, message: str, node_ids: np.ndarray | None = None, num_bad: int | None = None) -> None:
        super().__init__(message)
        self.node_ids = np.zeros(0, dtype=np.int64) if node_ids is None else np.asarray(node_ids, np.int64)
        self.num_bad = int(num_bad if num_bad is not None else len(self.node_ids))


class FeatureNotFound(FeatureStoreError):
    """Keys or a whole feature version are missing (never loaded, not live yet, or lost).

    Attributes:
        node_ids: int64 array of missing node ids (possibly truncated; see ``num_missing``).
        num_missing: how many were missing.
    """

    def __init__(self, message: str, node_ids: np.ndarray | None = None, num_missing: int | None = None) -> None:
        super().__init__(message)
        self.node_ids = np.zeros(0, dtype=np.int64) if node_ids is None else np.asarray(node_ids, np.int64)
        self.num_missing = int(num_missing if num_missing is not None else len(self.node_ids))


class DataVersionChanged(FeatureCorrupt):
    """The data version a server pinned at open time (by number *and* content digest) was deleted
    or replaced under the same number: answering would mix old cached rows with new fetched ones,
    so every request that would touch it is refused (DATA_LOSS) until the model is reloaded.

    Attributes:
        kind: ``"features"`` or ``"graph"``.
        version: the pinned version number.
        pinned: the content digest (the load's checksum) pinned at open time.
        found: the digest stored under that number now (``""``: a load under that number is running).
    """

    def __init__(self, message: str, *, kind: str = "features", version: int = 0, pinned: str = "",
                 found: str = "") -> None:
        super().__init__(message)
        self.kind, self.version, self.pinned, self.found = kind, int(version), pinned, found


class InvalidNodeIds(FeatureStoreError, ValueError):
    """Node ids that are not a 1-D integer array or lie outside ``[0, num_nodes)``."""


# --------------------------------------------------------------------------- id helpers
_MAX_LISTED = 256


def check_node_ids(node_ids: Any, num_nodes: int) -> np.ndarray:
    """Validate ids and return them as a 1-D int64 array (no copy when already int64).

    Accepts any integer array-like (lists, int32/uint arrays, 0-d arrays are refused: pass
    ``[i]``). Raises :class:`InvalidNodeIds` for floats, booleans, other shapes, or ids outside
    ``[0, num_nodes)``.
    """
    ids = np.asarray(node_ids)
    if ids.ndim != 1:
        raise InvalidNodeIds(f"node ids must be a 1-D array, got shape {ids.shape}")
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids.dtype.kind not in "iu":
        raise InvalidNodeIds(f"node ids must be integers, got dtype {ids.dtype}")
    if ids.dtype.kind == "u" and ids.dtype.itemsize >= 8 and int(ids.max()) > np.iinfo(np.int64).max:
        raise InvalidNodeIds(f"node ids must lie in [0, {num_nodes}), found {int(ids.max())}")
    ids = ids.astype(np.int64, copy=False)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= num_nodes:
        bad = ids[(ids < 0) | (ids >= num_nodes)]
        raise InvalidNodeIds(
            f"node ids must lie in [0, {num_nodes}); {len(bad)} do not, e.g. {summarize_ids(bad, 5)}"
        )
    return ids


def dedupe_ids(node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Distinct ids of a batch and how to expand rows fetched for them.

    Returns ``(unique, inverse)`` with ``unique`` sorted and ``node_ids == unique[inverse]``.
    ``inverse`` is ``None`` when the ids are already strictly increasing (no duplicates, no
    reordering needed: rows of ``unique`` are the answer as they are), which saves a gather on the
    common path where the caller already deduplicated (``SubgraphBatch.unique_ids``).
    """
    ids = np.asarray(node_ids, dtype=np.int64)
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return ids, None
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, inverse.reshape(-1)


def summarize_ids(ids: np.ndarray, limit: int = 10) -> str:
    """``"[3, 17, 42, ...] (n=1234)"``: a short, log-safe rendering of an id list."""
    ids = np.asarray(ids).reshape(-1)
    head = ", ".join(str(int(i)) for i in ids[:limit])
    more = ", ..." if len(ids) > limit else ""
    return f"[{head}{more}] (n={len(ids)})"


# --------------------------------------------------------------------------- latency window
class LatencyWindow:
    """Thread-safe ring of the last ``size`` durations (seconds) with count, sum and percentiles."""

    def __init__(self, size: int = 2048) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()
        self.count = 0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._values.append(seconds)
            self.count += 1
            self.total += seconds

    def summary(self) -> dict[str, float]:
        """``count``, ``total_s``, and ``p50_ms`` / ``p99_ms`` / ``max_ms`` over the window (NaN when empty)."""
        with self._lock:
            vals = np.fromiter(self._values, dtype=np.float64, count=len(self._values))
            count, total = self.count, self.total
        if vals.size == 0:
            p50 = p99 = mx = math.nan
        else:
            p50, p99 = (float(v) * 1e3 for v in np.percentile(vals, [50, 99]))
            mx = float(vals.max()) * 1e3
        return {"count": count, "total_s": total, "p50_ms": p50, "p99_ms": p99, "max_ms": mx}


# --------------------------------------------------------------------------- interface
class FeatureStore(abc.ABC):
    """Read access to node features ``[N, F]`` by node id.

    Subclasses implement :meth:`_fetch_unique` (rows for sorted, distinct, validated ids) and the
    three shape properties; :meth:`get` does validation, deduplication, expansion and accounting.
    Stores whose native lookup already handles duplicates cheaply (memory) override :meth:`get`.

    Every store is safe to call from several threads at once. ``close()`` releases connections or
    memory; a closed store raises :class:`FeatureUnavailable`.
    """

    #: short label used in logs, ``stats()`` and the ``store`` label of Prometheus metrics
    name: str = "store"

    def __init__(self, *, name: str | None = None, registry: CollectorRegistry | None = REGISTRY) -> None:
        """``name`` labels logs, stats and metrics; ``registry`` receives the Prometheus metrics of
        :mod:`serve.features.metrics` (default: the global registry; ``None``: no metrics)."""
        if name is not None:
            self.name = name
        self._metrics = metrics_for(registry)
        self._latency = LatencyWindow()
        self._counts_lock = threading.Lock()
        self._n_calls = 0
        self._n_rows = 0
        self._n_unique = 0
        self._errors: dict[str, int] = {}
        self._closed = False

    # ---------------------------------------------------------------- shape
    @property
    @abc.abstractmethod
    def num_nodes(self) -> int:
        """N: valid ids are ``0 .. N-1``."""

    @property
    @abc.abstractmethod
    def num_features(self) -> int:
        """F: the width of every row returned."""

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype:
        """Storage dtype (float32 or float16); :meth:`get` always returns float32."""

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored row (``F * dtype.itemsize``)."""
        return self.num_features * np.dtype(self.dtype).itemsize

    # ---------------------------------------------------------------- reads
    def get(self, node_ids: Any) -> np.ndarray:
        """Features of ``node_ids`` as float32 ``[len(node_ids), F]``, in the order asked.

        Raises:
            InvalidNodeIds: ids not 1-D integers or out of range.
            FeatureUnavailable: the backing service is down (after bounded retries).
            FeatureCorrupt: a stored row failed its checks.
            FeatureNotFound: rows are missing from the backing service.
        """
        self._check_open()
        ids = check_node_ids(node_ids, self.num_nodes)
        t0 = time.perf_counter()
        try:
            if ids.size == 0:
                out = np.zeros((0, self.num_features), dtype=np.float32)
                unique_n = 0
            else:
                unique, inverse = dedupe_ids(ids)
                rows = self._fetch_unique(unique)
                out = rows if inverse is None else rows[inverse]
                unique_n = len(unique)
        except FeatureStoreError as exc:
            self._count_error(exc)
            raise
        self._account(len(ids), unique_n, time.perf_counter() - t0)
        return out

    def get_partial(self, node_ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Whatever rows can be served now: ``(rows float32 [n, F], present bool [n])``.

        Rows that could not be served are NaN (never plausible numbers) and ``present`` is False
        for them. Only :class:`FeatureUnavailable` is absorbed; corrupt data and invalid ids still
        raise. The base store is all-or-nothing; the tiered store serves what its cache holds, so
        a server can answer the requests of a batch whose nodes are all cached while the backend
        is down.
        """
        ids = check_node_ids(node_ids, self.num_nodes)
        try:
            return self.get(ids), np.ones(len(ids), dtype=bool)
        except FeatureUnavailable:
            return (np.full((len(ids), self.num_features), np.nan, dtype=np.float32),
                    np.zeros(len(ids), dtype=bool))

    @abc.abstractmethod
    def _fetch_unique(self, ids: np.ndarray) -> np.ndarray:
        """Rows for sorted, distinct, in-range int64 ``ids`` as a new float32 ``[len(ids), F]``."""

    # ---------------------------------------------------------------- lifecycle and health
    def ping(self) -> bool:
        """True when the store can serve right now (a cheap round trip for remote stores)."""
        return not self._closed

    def close(self) -> None:
        """Release resources; later calls raise :class:`FeatureUnavailable`. Idempotent."""
        self._closed = True

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise FeatureUnavailable(f"feature store {self.name!r} is closed")

    # ---------------------------------------------------------------- accounting
    def _account(self, rows: int, unique: int, seconds: float) -> None:
        with self._counts_lock:
            self._n_calls += 1
            self._n_rows += rows
            self._n_unique += unique
        self._latency.add(seconds)
        if self._metrics is not None:
            self._metrics.fetch_seconds.labels(self.name).observe(seconds)
            self._metrics.rows.labels(self.name).inc(rows)

    def _count_error(self, exc: BaseException) -> None:
        key = type(exc).__name__
        with self._counts_lock:
            self._errors[key] = self._errors.get(key, 0) + 1
        if self._metrics is not None:
            self._metrics.errors.labels(self.name, key).inc()

    def stats(self) -> dict[str, Any]:
        """Counters since creation: calls, rows asked, distinct rows fetched, errors by class,
        and the latency of :meth:`get` (``p50_ms``/``p99_ms`` over the last calls)."""
        with self._counts_lock:
            base: dict[str, Any] = {
                "store": self.name,
                "kind": type(self).__name__,
                "num_nodes": self.num_nodes,
                "num_features": self.num_features,
                "dtype": np.dtype(self.dtype).name,
                "calls": self._n_calls,
                "rows": self._n_rows,
                "unique_rows": self._n_unique,
                "errors": dict(self._errors),
            }
        base["get_latency"] = self._latency.summary()
        return base
