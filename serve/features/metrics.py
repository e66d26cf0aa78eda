"""Prometheus metrics of the feature stores, registered once per registry.

Every store that is given a registry records on the same metric families, told apart by the
``store`` label (the store's ``name``), so a server with several models (or several stores) exports
one consistent set:

* ``gnnserve_feature_fetch_seconds{store}`` (histogram): time of one ``get`` of a batch, as seen
  by that store. For a Redis store this is the Redis latency (pipelined ``MGET`` round trips plus
  decoding and checks); for a tiered store it is the whole lookup including its misses.
* ``gnnserve_feature_backend_seconds{store}`` (histogram): for a tiered store, the time of the
  fetch of its misses from the backend (only observed when something missed).
* ``gnnserve_feature_rows_total{store}``: rows asked for (duplicates included).
* ``gnnserve_feature_errors_total{store, error}``: errors by class (``FeatureUnavailable``, ...).
* ``gnnserve_feature_cache_hits_total{store, tier}``: rows served by the ``hot`` (static) or ``lru``
  tier of a tiered store; ``gnnserve_feature_cache_misses_total{store}``: distinct rows fetched from
  its backend. Hit ratio = hits / (hits + misses), over distinct rows per batch.
* ``gnnserve_feature_cache_bytes{store, tier}`` (gauge): bytes held by each tier.

Two stores sharing a name on one registry share their series (that is allowed, their counts add).
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["FeatureMetrics", "metrics_for"]

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5, 10.0)


class FeatureMetrics:
    """The metric families of the feature stores on one registry (use :func:`metrics_for`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.fetch_seconds = Histogram(
            "gnnserve_feature_fetch_seconds", "Time of one feature-store get (a batch)", ["store"],
            buckets=_BUCKETS, registry=r,
        )
        self.backend_seconds = Histogram(
            "gnnserve_feature_backend_seconds", "Time a tiered store spent fetching its misses from the backend",
            ["store"], buckets=_BUCKETS, registry=r,
        )
        self.rows = Counter("gnnserve_feature_rows", "Feature rows asked for (duplicates included)", ["store"],
                            registry=r)
        self.errors = Counter("gnnserve_feature_errors", "Feature-store errors by class", ["store", "error"],
                              registry=r)
        self.cache_hits = Counter("gnnserve_feature_cache_hits", "Distinct rows served from a cache tier",
                                  ["store", "tier"], registry=r)
        self.cache_misses = Counter("gnnserve_feature_cache_misses", "Distinct rows fetched from the backend",
                                    ["store"], registry=r)
        self.cache_bytes = Gauge("gnnserve_feature_cache_bytes", "Bytes held by a cache tier", ["store", "tier"],
                                 registry=r)


_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, FeatureMetrics] = weakref.WeakKeyDictionary()


def metrics_for(registry: CollectorRegistry | None = REGISTRY) -> FeatureMetrics | None:
    """The :class:`FeatureMetrics` of ``registry`` (created on first use); ``None`` disables metrics."""
    if registry is None:
        return None
    with _lock:
        m = _by_registry.get(registry)
        if m is None:
            m = FeatureMetrics(registry)
            _by_registry[registry] = m
        return m
