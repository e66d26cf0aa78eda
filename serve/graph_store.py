"""Graph topology and PPR top-K lists in Redis (stateless replicas): the names of :mod:`serve.graph`.

Kept so that ``from serve.graph_store import RedisGraphStore, load_graph, ...`` and
``python -m serve.graph_store`` (``gnnserve graph``) keep working; the code lives in
:mod:`serve.graph` (key schema and blobs, store, loader, CLI) on the Redis layer
:mod:`serve.redisdata`.
"""

from __future__ import annotations

from .graph import (
    DEFAULT_GRAPH_CACHE,
    GRAPH_FORMAT,
    GRAPH_PREFIX,
    GraphCorrupt,
    GraphKeys,
    GraphLoadReport,
    GraphNotFound,
    GraphUnavailable,
    RedisGraphStore,
    RedisPPRIndex,
    load_graph,
    main,
    verify_graph,
)

__all__ = [
    "DEFAULT_GRAPH_CACHE",
    "GRAPH_FORMAT",
    "GRAPH_PREFIX",
    "GraphCorrupt",
    "GraphKeys",
    "GraphLoadReport",
    "GraphNotFound",
    "GraphUnavailable",
    "RedisGraphStore",
    "RedisPPRIndex",
    "load_graph",
    "main",
    "verify_graph",
]

if __name__ == "__main__":
    raise SystemExit(main())
