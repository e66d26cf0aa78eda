"""Feature stores: node id -> float32 feature row, from memory, Redis, or a cache in front of either.

Pick one with :func:`open_store`; the pieces are in the submodules:

* :mod:`.base`: the :class:`FeatureStore` interface, the error classes, id helpers;
* :mod:`.memory`: :class:`MemoryFeatureStore` (in-process array or memory map; the default);
* :mod:`.redis_store`: :class:`RedisFeatureStore`, the key schema and blob format (URL forms,
  connections, errors and the load protocol are the Redis layer's, :mod:`serve.redisdata`);
* :mod:`.loader`: :func:`load_features` / :func:`verify_features` (what ``gnnserve features
  load`` runs);
* :mod:`.tiered`: :class:`TieredFeatureStore` (hot static tier + LRU) and :func:`hot_set_from_index`;
* :mod:`.metrics`: the Prometheus metrics they export.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry

from .base import (
    DataVersionChanged,
    FeatureCorrupt,
    FeatureNotFound,
    FeatureStore,
    FeatureStoreError,
    FeatureUnavailable,
    InvalidNodeIds,
    check_node_ids,
    dedupe_ids,
)
from .loader import (
    FeatureLoadError,
    FeatureVerifyError,
    LoadReport,
    VerifyReport,
    delete_features,
    list_versions,
    load_features,
    verify_features,
)
from .memory import MemoryFeatureStore
from .redis_store import RedisFeatureStore, mask_url, parse_redis_url
from .tiered import TieredFeatureStore, hot_set_from_index

__all__ = [
    "HOT_FROM_PPR",
    "REDIS_SCHEMES",
    "DataVersionChanged",
    "FeatureCorrupt",
    "FeatureLoadError",
    "FeatureNotFound",
    "FeatureStore",
    "FeatureStoreError",
    "FeatureUnavailable",
    "FeatureVerifyError",
    "InvalidNodeIds",
    "LoadReport",
    "MemoryFeatureStore",
    "RedisFeatureStore",
    "TieredFeatureStore",
    "VerifyReport",
    "check_node_ids",
    "data_version",
    "dedupe_ids",
    "delete_features",
    "hot_set_from_index",
    "install_hot_from_index",
    "is_redis_url",
    "list_versions",
    "load_features",
    "mask_url",
    "open_store",
    "parse_redis_url",
    "verify_features",
]

#: ``open_store(hot=HOT_FROM_PPR)``: tiered, with the static hot tier installed later from the
#: model's PPR index (:func:`install_hot_from_index`; what ``gnnserve serve --hot-bytes`` asks for)
HOT_FROM_PPR = "ppr"

#: URL schemes that select the Redis store
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")


def is_redis_url(spec: Any) -> bool:
    """True for a string in one of the :data:`REDIS_SCHEMES`."""
    return isinstance(spec, str) and spec.lower().startswith(REDIS_SCHEMES)


def open_store(
    url_or_path: str | os.PathLike[str] | np.ndarray | FeatureStore | None = None,
    *,
    dataset: Any = None,
    fingerprint: str | None = None,
    version: int | None = None,
    expect_dataset_fingerprint: str | None = None,
    hot: np.ndarray | tuple[np.ndarray, np.ndarray] | str | None = None,
    cache_bytes: int = 0,
    hot_fraction: float = 0.75,
    device: str | None = None,
    name: str | None = None,
    registry: CollectorRegistry | None = REGISTRY,
    **redis_options: Any,
) -> FeatureStore:
    """Open the feature store a server flag or URL names.

    Base store, by ``url_or_path``:

    * ``None`` or ``"memory"``: ``dataset.x`` in memory (the embedded default);
    * a Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
      ``rediss+cluster://``, see :mod:`.redis_store`): :class:`RedisFeatureStore` for graph
      ``fingerprint`` (default ``dataset.graph.fingerprint()``) and ``version`` (default: the
      current live one; with ``expect_dataset_fingerprint``, the newest live one from that data);
      its shape is checked against ``dataset`` when given;
    * a path (``.npy``, ``.npz`` dataset, saved dataset directory): memory-mapped where possible;
    * an ``[N, F]`` array, or an existing :class:`FeatureStore` (used as is).

    Tiered: when ``cache_bytes > 0`` or ``hot`` is given, the base store is wrapped in a
    :class:`TieredFeatureStore` with that byte budget (default 256 MiB when only ``hot`` is given).
    ``hot`` is either ranked node ids or a PPR top-K index as ``(ptr, nodes)`` CSR arrays, from
    which :func:`hot_set_from_index` ranks nodes by frequency, or :data:`HOT_FROM_PPR` (``"ppr"``):
    the hot share of the budget stays free until :func:`install_hot_from_index` hands it the
    index of the first PPR model served from this store (the index is built after the store opens). ``device`` puts the cached rows on a
    torch device (``"cuda"`` when the server runs with ``--device cuda``).

    A store passed in stays the caller's to close; one opened here is closed with the tiered store.

    ``name`` labels metrics and stats (a tiered store's backend gets ``<name>-backend``);
    ``redis_options`` go to :class:`RedisFeatureStore` (``chunk_size``, ``socket_timeout``,
    ``retries``, ...).

    Raises:
        ValueError: nothing to open (no dataset for ``"memory"``, unknown path type, ...).
        FeatureUnavailable / FeatureNotFound: from the Redis store (unreachable, no live version).
    """
    tiered = cache_bytes > 0 or hot is not None
    base_name = f"{name}-backend" if (name and tiered) else name
    spec = os.fspath(url_or_path) if isinstance(url_or_path, os.PathLike) else url_or_path
    base: FeatureStore
    if isinstance(spec, FeatureStore):
        base = spec
    elif isinstance(spec, np.ndarray):
        base = MemoryFeatureStore(spec, name=base_name, registry=registry)
    elif spec is None or spec == "memory":
        if dataset is None:
            raise ValueError("the memory feature store needs dataset= (or a path to the features)")
        base = MemoryFeatureStore.from_dataset(dataset, name=base_name, registry=registry)
    elif is_redis_url(spec):
        fp = fingerprint or (dataset.graph.fingerprint() if dataset is not None else None)
        if fp is None:
            raise ValueError("the Redis feature store needs fingerprint= or dataset= (the graph fingerprint)")
        base = RedisFeatureStore(
            spec, fp, version,
            expect_num_nodes=dataset.num_nodes if dataset is not None else None,
            expect_num_features=dataset.num_features if dataset is not None else None,
            expect_dataset_fingerprint=expect_dataset_fingerprint,
            name=base_name, registry=registry, **redis_options,
        )
    elif isinstance(spec, str) and "://" in spec:
        raise ValueError(f"unknown feature store URL scheme in {mask_url(spec)}: use one of {REDIS_SCHEMES}, "
                         "'memory' or a file path")
    elif isinstance(spec, str):
        base = MemoryFeatureStore.open(spec, name=base_name, registry=registry)
    else:
        raise ValueError(f"cannot open a feature store from {type(spec).__name__}")
    if not tiered:
        return base
    hot_ids: np.ndarray | None
    if hot is None or (isinstance(hot, str) and hot == HOT_FROM_PPR):
        hot_ids = None
    elif isinstance(hot, tuple):
        ptr, nodes = hot
        hot_ids = hot_set_from_index(ptr, nodes, base.num_nodes)
    elif isinstance(hot, str):
        base.close()
        raise ValueError(f"hot must be node ids, (ptr, nodes) or {HOT_FROM_PPR!r}, got {hot!r}")
    else:
        hot_ids = np.asarray(hot)
    try:
        store = TieredFeatureStore(
            base, hot_ids=hot_ids, budget_bytes=cache_bytes or (256 << 20), hot_fraction=hot_fraction,
            device=device, name=name, registry=registry, close_backend=not isinstance(spec, FeatureStore),
        )
    except BaseException:
        base.close()
        raise
    store.hot_from_ppr_pending = isinstance(hot, str)
    return store


def install_hot_from_index(store: Any, index: Any) -> int:
    """Give a store opened with ``hot=HOT_FROM_PPR`` its static hot tier from a PPR top-K index.

    ``index`` is a :class:`kernels.ppr.PPRIndex` (``ptr``/``nodes`` CSR arrays): nodes are ranked
    by how many top-K lists hold them (:func:`hot_set_from_index`). Only the first call per
    store installs a tier (models trained on one dataset share its store); any other store, or
    an index without the full lists in memory (a stateless replica's Redis-backed index), is left
    as it is. Returns the number of hot rows installed (0 when nothing was done).
    """
    if not (isinstance(store, TieredFeatureStore) and getattr(store, "hot_from_ppr_pending", False)):
        return 0
    ptr, nodes = getattr(index, "ptr", None), getattr(index, "nodes", None)
    if ptr is None or nodes is None:
        import logging

        logging.getLogger(__name__).info(
            "feature store %s: the PPR index is not in memory (stateless replica): no static hot tier, LRU only",
            store.name)
        return 0
    store.hot_from_ppr_pending = False
    return store.set_hot(hot_set_from_index(np.asarray(ptr), np.asarray(nodes), store.num_nodes))


def data_version(features: Any, graph: Any = None, dataset_fingerprint: str = "") -> str:
    """What a response echoes as the data it was computed from.

    ``features:v<N>:<checksum>`` for Redis features (the version and content digest pinned at
    open time), plus ``;graph:v<M>:<checksum>`` when the graph is in Redis too (stateless
    replica); ``memory:<dataset fingerprint>`` for features held in memory.

    Raises:
        DataVersionChanged: a store noticed its pinned version deleted or replaced.
    """
    parts = []
    fv = getattr(features, "data_version", "")
    parts.append(fv if fv else f"memory:{dataset_fingerprint}")
    gv = getattr(graph, "data_version", "") if graph is not None else ""
    if gv:
        parts.append(gv)
    return ";".join(parts)
