"""The one Redis layer under the feature store, the graph store and the update log.

Each kind of versioned data (features: :mod:`serve.features.redis_store`; graph topology and PPR
lists: :mod:`serve.graph`) is a :class:`~.versions.DataKind` with its key prefix and error classes; the rest
is written once, here:

* :mod:`.connection`: URL forms (TCP, TLS, unix socket, Cluster), :func:`connect` with bounded
  retries (:class:`TransientRetry`), :func:`mask_url`;
* :mod:`.errors`: :func:`redis_errors` (redis-py exceptions -> the kind's neutral errors, no host
  secrets or passwords), the error families and the graph error classes;
* :mod:`.versions`: the versioned key schema (:class:`VersionKeys`, :class:`NodeKeys`), which
  version to open (:meth:`VersionKeys.resolve_version`), metadata checks, :class:`VersionPin`
  and the stores' :class:`PinnedVersion` properties;
* :mod:`.bulk`: pipelined per-shard ``MGET``/``MSET`` of node blobs;
* :mod:`.load`: the load protocol (start, write -> read back -> digest, go live).

Import order: the error classes come from :mod:`serve.features.base`, and :mod:`serve.features`
imports this layer; ``serve.features`` is therefore imported first (below), and the modules of
the features and graph stores import the submodules (``serve.redisdata.connection``...), which
is also where every name lives: this package re-exports nothing.
"""

from __future__ import annotations

from .. import features as _features  # noqa: F401  (first: see "Import order" above)
