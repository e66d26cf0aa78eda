"""Graph topology and PPR top-K lists in Redis (stateless replicas): the names of :mod:`serve.graph`.

Kept so that ``from serve.graph_store import RedisGraphStore, load_graph, ...`` and
``python -m serve.graph_store`` (``gnnserve graph``) keep working; the code lives in
:mod:`serve.graph` (key schema and blobs, store, loader, CLI) on the Redis layer
:mod:`serve.redisdata`.
"""

from __future__ import annotations

from . import graph as _graph
from .graph import *  # noqa: F403  (the public names, listed in serve.graph.__all__)

__all__ = list(_graph.__all__)

if __name__ == "__main__":
    raise SystemExit(_graph.main())
