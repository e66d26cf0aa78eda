"""Graph topology and PPR top-K lists in Redis: stateless replicas (``gnnserve serve --graph URL``).

In the default (single-process) mode every replica holds the CSR graph and the PPR index in its
own memory (memory-mapped files). With ``--graph redis://...`` (or ``redis+cluster://...``) a
replica holds only its models, the projection cache and small hot tiers: the adjacency rows and
the top-K lists live in Redis next to the features, under the same versioned key schema
(the Redis layer, :mod:`serve.redisdata`), written by ``gnnserve graph load``.

* :mod:`.schema`: the key schema (:class:`GraphKeys`), the blob format and its codec;
* :mod:`.store`: :class:`RedisGraphStore` (reads, the hot-row LRU, the live-update overlay) and
  :class:`RedisPPRIndex`;
* :mod:`.loader`: :func:`load_graph` / :func:`verify_graph`;
* :mod:`.cli`: ``gnnserve graph load|verify``.

Errors (:class:`GraphUnavailable`, :class:`GraphNotFound`, :class:`GraphCorrupt`) are the Redis
layer's graph family (:mod:`serve.redisdata.errors`). ``serve.graph_store`` re-exports these names.
"""

from __future__ import annotations

from ..redisdata.errors import GraphCorrupt, GraphNotFound, GraphUnavailable
from .cli import main
from .loader import GraphLoadReport, load_graph, verify_graph
from .schema import GRAPH_FORMAT, GRAPH_PREFIX, GraphKeys
from .store import DEFAULT_GRAPH_CACHE, RedisGraphStore, RedisPPRIndex

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
