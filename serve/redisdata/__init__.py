"""The one Redis layer under the feature store, the graph store and the update log.

Each kind of versioned data (features: :mod:`serve.features.redis_store`; graph topology and PPR
lists: :mod:`serve.graph`) is a :class:`DataKind` with its key prefix and error classes; the rest
is written once, here:

* :mod:`.connection`: URL forms (TCP, TLS, unix socket, Cluster), :func:`connect` with bounded
  retries (:class:`TransientRetry`), :func:`mask_url`;
* :mod:`.errors`: :func:`redis_errors` (redis-py exceptions -> the kind's neutral errors, no host
  secrets or passwords), the error families and the graph error classes;
* :mod:`.versions`: the versioned key schema (:class:`VersionKeys`, :class:`NodeKeys`), which
  version to open (:meth:`VersionKeys.resolve_version`), metadata checks, :class:`VersionPin`;
* :mod:`.bulk`: pipelined per-shard ``MGET``/``MSET`` of node blobs;
* :mod:`.load`: the load protocol (start, write -> read back -> digest, go live).

Import order: the error classes come from :mod:`serve.features.base`, and :mod:`serve.features`
imports this layer; ``serve.features`` is therefore imported first (below), and the modules of
the features and graph stores import the submodules (``serve.redisdata.connection``...), not
this package's names.
"""

from __future__ import annotations

from .. import features as _features  # noqa: F401  (first: see "Import order" above)
from .bulk import DEFAULT_CHUNK, fetch_blobs, fetch_blobs_checked, write_blobs
from .connection import RedisTarget, TransientRetry, connect, mask_url, parse_redis_url
from .errors import (
    FEATURE_ERRORS,
    GRAPH_ERRORS,
    ErrorFamily,
    GraphCorrupt,
    GraphNotFound,
    GraphUnavailable,
    redis_errors,
)
from .load import chunk_digest, go_live, read_back, start_version, version_checksum, write_verified
from .versions import (
    DEFAULT_SHARDS,
    DIGEST_UNREACHABLE,
    DataKind,
    NodeKeys,
    VersionKeys,
    VersionPin,
    check_live,
    read_meta,
)

__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_SHARDS",
    "DIGEST_UNREACHABLE",
    "FEATURE_ERRORS",
    "GRAPH_ERRORS",
    "DataKind",
    "ErrorFamily",
    "GraphCorrupt",
    "GraphNotFound",
    "GraphUnavailable",
    "NodeKeys",
    "RedisTarget",
    "TransientRetry",
    "VersionKeys",
    "VersionPin",
    "check_live",
    "chunk_digest",
    "connect",
    "fetch_blobs",
    "fetch_blobs_checked",
    "go_live",
    "mask_url",
    "parse_redis_url",
    "read_back",
    "read_meta",
    "redis_errors",
    "start_version",
    "version_checksum",
    "write_blobs",
    "write_verified",
]
