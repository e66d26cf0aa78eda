"""Graph topology and PPR top-K lists in Redis: stateless replicas (``gnnserve serve --graph URL``).

In the default (single-process) mode every replica holds the CSR graph and the PPR index in its
own memory (memory-mapped files). With ``--graph redis://...`` (or ``redis+cluster://...``) a
replica holds only its models, the projection cache and small hot tiers: the adjacency rows and
the top-K lists live in Redis next to the features, under a versioned key schema like theirs,
written by ``gnnserve graph load``.

Key schema
----------
``<gfp>`` is the graph fingerprint (:meth:`kernels.graph.CSRGraph.fingerprint`, the same one the
features are keyed by), ``V`` the graph version, ``S`` the hash-tag shard count (default 256,
recorded in the metadata), ``<ck>`` the :meth:`kernels.ppr.PPRConfig.key` of a PPR configuration::

    gnnserve:graph:<gfp>:v<V>:{<node mod S>}:a:<node>       adjacency row of <node> (blob, below)
    gnnserve:graph:<gfp>:v<V>:{<node mod S>}:p:<ck>:<node>  top-K PPR list of <node> under config <ck>
    gnnserve:graph:<gfp>:v<V>:meta                           hash: metadata (state loading -> live)
    gnnserve:graph:<gfp>:current                             string: the newest live version
    gnnserve:graph:<gfp>:versions                            set: every version ever started

The hash tag ``{<node mod S>}`` is the features' own (``gnnserve:feat:<gfp>:v<F>:{<node mod S>}:<node>``),
so on a Redis Cluster the feature blob, the adjacency row and the PPR lists of one node live in
the same slot, on the same master. One batch's fetch of a node set is, per kind of data, one
``MGET`` per (shard, chunk), grouped by the cluster pipeline into one round trip per master.

Blobs (little-endian), a 16-byte header then the payload::

    adjacency: b"ga" | 1 | flags | count (uint32) | node (uint64) | ids [count] | weights float32 [count]?
    PPR list:  b"gp" | 1 | flags | count (uint32) | node (uint64) | ids [count] | scores [count]?

``flags`` bit 0: ids are int64 (else int32); adjacency bit 1: weighted; PPR bits 1-2: scores
(0 = not stored, 1 = float16, 2 = float32). Every read checks the magic, version and flags
against the metadata, the node id in the header against the key asked for (a blob stored under
the wrong key is caught), the length, that ids lie in ``[0, N)`` and that a PPR list starts with
its own node. A failed check is :class:`GraphCorrupt` (DATA_LOSS), a missing key
:class:`GraphNotFound`, an unreachable Redis :class:`GraphUnavailable` (UNAVAILABLE): these
subclass the feature-store errors so the server maps them the same way, and a batch is refused,
never answered with partial data.

Metadata fields: ``format`` (``gnnserve.graph/1``), ``fingerprint``, ``version``, ``state``,
``num_nodes``, ``num_edges``, ``max_degree``, ``weighted``, ``index_dtype``, ``shards``,
``chunk_size``, ``count`` (adjacency rows verified), ``checksum`` (BLAKE2b over the chunk digests
of everything written, recomputed from what Redis returned), ``ppr`` (JSON: config key ->
``{"config", "k_max", "nnz", "scores"}``), ``dataset_fingerprint``, ``dataset_name``,
``created_at``, ``live_at``, ``key_format``.

How a replica uses it (per batch, :class:`RedisGraphStore`)
-----------------------------------------------------------
* PPR models: one ``MGET`` round of the targets' top-K lists (sliced to the request's budget K),
  then one round of the adjacency rows of the distinct nodes of those lists; L-hop models: one
  round per hop plus one (the rows of the last hop's nodes).
* Those rows, restricted to the fetched node set and relabelled by rank (a monotone map, so
  every row stays sorted), form a small local CSR on which :func:`kernels.subgraph.induced_batch`
  / :func:`kernels.subgraph.lhop_nodes` run unchanged; the batch's ids are then mapped back.
  Edges leaving the fetched set can never be part of an induced subgraph, so the result equals
  the in-memory one row for row and column for column (tested against the in-memory server).
* Decoded rows and lists go through a byte-bounded LRU (``--graph-cache-bytes``, default 64 MiB):
  hot nodes are not fetched again. Graph versions are immutable, so cached rows never go stale.
* New nodes (``new_nodes`` in a request) need the push or BFS over the whole graph: a replica
  in this mode refuses them with INVALID_ARGUMENT (run a single-process server for those).

Live updates: the overlay
-------------------------
A stored version is an immutable snapshot. Updates accepted since (:mod:`serve.live`, through the
update log) are applied on top of it in each replica's memory: :meth:`RedisGraphStore.apply_rows`
replaces whole adjacency rows (and adds nodes ``N_base .. num_nodes - 1``, which exist only in the
overlay: such a node without a row given has no edges), :meth:`RedisGraphStore.apply_lists` whole
PPR top-K lists. Every read (``adjacency``, ``ppr_lists``, ``local_graph``, the induced and L-hop
batches and their GCN degrees, :class:`RedisPPRIndex`) takes an overlay row before the LRU or
Redis; decoded snapshot rows in the LRU stay valid, as the snapshot never changes.
``num_nodes`` and ``num_edges`` follow the overlay exactly; ``max_degree`` is
``max(stored max degree, longest overlay row)``, an upper bound once the stored maximum's row
shrank. A weighted row on an unweighted snapshot makes the graph weighted (``is_weighted``): every
row without weights then weighs 1 per edge, in the batches' weights and the GCN degrees alike.
The overlay is changed only under the caller's write lock: no read of the store may run while
``apply_*`` does (reads need no lock of their own); :meth:`RedisGraphStore.overlay_stats` is safe
from any thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .features.base import FeatureCorrupt, FeatureNotFound, FeatureUnavailable, summarize_ids
from .features.redis_store import (
    DEFAULT_SHARDS,
    RedisTarget,
    VersionPin,
    connect,
    fetch_blobs,
    fetch_blobs_checked,
    parse_redis_url,
    redis_errors,
    write_blobs,
)

__all__ = [
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

log = logging.getLogger(__name__)

GRAPH_PREFIX = "gnnserve:graph"
GRAPH_FORMAT = "gnnserve.graph/1"
DEFAULT_GRAPH_CACHE = 64 << 20
_HDR = struct.Struct("<2sBBIQ")
_VER = 1
_SCORE_CODES = {"none": 0, "float16": 1, "float32": 2}
_SCORE_DTYPES = {1: np.dtype("<f2"), 2: np.dtype("<f4")}
_INT32_MAX = np.iinfo(np.int32).max
_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_IDS.setflags(write=False)
_SET_CURRENT = """
local cur = tonumber(redis.call('GET', KEYS[1]))
local v = tonumber(ARGV[1])
if (not cur) or cur < v then redis.call('SET', KEYS[1], ARGV[1]) return v end
return cur
"""


class GraphUnavailable(FeatureUnavailable):
    """Redis holding the graph cannot be reached or is not ready (gRPC UNAVAILABLE)."""


class GraphNotFound(FeatureNotFound):
    """No live graph version, no PPR lists for a configuration, or keys missing (UNAVAILABLE)."""


class GraphCorrupt(FeatureCorrupt):
    """A graph blob failed its checks (DATA_LOSS); it is never used."""


def _retag(exc: Exception) -> Exception:
    """The same message under the graph error class of the same kind."""
    msg = str(exc).replace("feature", "graph") if "graph" not in str(exc) else str(exc)
    if isinstance(exc, FeatureCorrupt):
        return GraphCorrupt(msg)
    if isinstance(exc, FeatureNotFound):
        return GraphNotFound(msg)
    return GraphUnavailable(msg)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# =========================================================================== key schema
class _PartKeys:
    """Node keys of one kind of data (the shape :func:`fetch_blobs` / :func:`write_blobs` expect)."""

    def __init__(self, base: str, shards: int, part: str) -> None:
        self.shards = shards
        self._prefix = [f"{base}:{{{s}}}:{part}:".encode() for s in range(shards)]

    def node_keys(self, ids: np.ndarray | Sequence[int]) -> list[bytes]:
        pf, s = self._prefix, self.shards
        lst = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        return [pf[i % s] + b"%d" % i for i in lst]


class GraphKeys:
    """Key names of one graph version (schema in the module docstring)."""

    def __init__(self, fingerprint: str, version: int, shards: int = DEFAULT_SHARDS) -> None:
        if not fingerprint or any(c in fingerprint for c in "{}: \n"):
            raise ValueError(f"bad graph fingerprint {fingerprint!r}")
        if int(version) < 1:
            raise ValueError(f"graph versions are positive integers, got {version}")
        if not 1 <= int(shards) <= 16384:
            raise ValueError(f"shards must lie in [1, 16384], got {shards}")
        self.fingerprint = fingerprint
        self.version = int(version)
        self.shards = int(shards)
        self.graph_prefix = f"{GRAPH_PREFIX}:{fingerprint}"
        self.base = f"{self.graph_prefix}:v{self.version}"
        self.meta = f"{self.base}:meta"
        self.current = f"{self.graph_prefix}:current"
        self.versions = f"{self.graph_prefix}:versions"
        self.adj = _PartKeys(self.base, self.shards, "a")
        self._ppr: dict[str, _PartKeys] = {}

    def ppr(self, config_key: str) -> _PartKeys:
        k = self._ppr.get(config_key)
        if k is None:
            k = self._ppr[config_key] = _PartKeys(self.base, self.shards, f"p:{config_key}")
        return k

    @property
    def key_format(self) -> str:
        return f"{self.base}:{{<node mod {self.shards}>}}:a:<node> | :p:<config key>:<node>"


# =========================================================================== blobs
def _encode_rows(magic: bytes, flags: int, start: int, ptr: np.ndarray, ids: np.ndarray,
                 extra: np.ndarray | None) -> list[bytes]:
    """Blobs of rows ``start .. start + len(ptr) - 2`` (``ptr`` local to ``ids``/``extra``)."""
    out = []
    ib = ids.tobytes()
    isz = ids.dtype.itemsize
    eb = extra.tobytes() if extra is not None else b""
    esz = extra.dtype.itemsize if extra is not None else 0
    for r in range(len(ptr) - 1):
        a, b = int(ptr[r]), int(ptr[r + 1])
        out.append(_HDR.pack(magic, _VER, flags, b - a, start + r) + ib[a * isz : b * isz]
                   + (eb[a * esz : b * esz] if esz else b""))
    return out


class _Decoder:
    """Checks and decodes blobs of one kind (adjacency or PPR list) of one graph version."""

    def __init__(self, magic: bytes, flags: int, id_dtype: np.dtype, extra: np.dtype | None,
                 num_nodes: int, first_is_self: bool, what: str) -> None:
        self.magic, self.flags, self.id_dtype, self.extra = magic, flags, np.dtype(id_dtype), extra
        self.n, self.first_is_self, self.what = num_nodes, first_is_self, what
        self.per = self.id_dtype.itemsize + (extra.itemsize if extra is not None else 0)

    def decode(self, node: int, blob: bytes) -> tuple[np.ndarray, np.ndarray | None]:
        if len(blob) < _HDR.size:
            raise GraphCorrupt(f"{self.what} of node {node} is {len(blob)} bytes, shorter than its header")
        magic, ver, flags, count, who = _HDR.unpack_from(blob)
        if magic != self.magic or ver != _VER or flags != self.flags:
            raise GraphCorrupt(f"{self.what} of node {node} has header {magic!r}/v{ver}/flags {flags}, "
                               f"expected {self.magic!r}/v{_VER}/flags {self.flags}")
        if who != node:
            raise GraphCorrupt(f"{self.what} stored under node {node} belongs to node {who} (misplaced key)")
        if len(blob) != _HDR.size + count * self.per:
            raise GraphCorrupt(f"{self.what} of node {node} is {len(blob)} bytes, expected "
                               f"{_HDR.size + count * self.per} for {count} entries")
        end = _HDR.size + count * self.id_dtype.itemsize
        ids = np.frombuffer(blob, dtype=self.id_dtype, count=count, offset=_HDR.size)
        if count and (int(ids.min()) < 0 or int(ids.max()) >= self.n):
            raise GraphCorrupt(f"{self.what} of node {node} holds ids outside [0, {self.n})")
        if self.first_is_self and (count == 0 or int(ids[0]) != node):
            raise GraphCorrupt(f"{self.what} of node {node} does not start with the node itself")
        ex = np.frombuffer(blob, dtype=self.extra, count=count, offset=end) if self.extra is not None else None
        if ex is not None and not bool(np.isfinite(ex).all()):
            raise GraphCorrupt(f"{self.what} of node {node} holds NaN or infinite values")
        return ids, ex


# =========================================================================== hot rows
class _RowCache:
    """Byte-bounded LRU of decoded rows: ``(kind, node) -> (ids, extra)``; thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = max(0, int(budget_bytes))
        self._d: OrderedDict[tuple[str, int], tuple[np.ndarray, np.ndarray | None]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _size(v: tuple[np.ndarray, np.ndarray | None]) -> int:
        return 64 + v[0].nbytes + (v[1].nbytes if v[1] is not None else 0)

    def get_many(self, kind: str, ids: list[int]) -> tuple[dict[int, Any], list[int]]:
        found: dict[int, Any] = {}
        missing: list[int] = []
        if not self.budget:
            return found, list(ids)
        with self._lock:
            for i in ids:
                v = self._d.get((kind, i))
                if v is None:
                    missing.append(i)
                else:
                    self._d.move_to_end((kind, i))
                    found[i] = v
            self.hits += len(found)
            self.misses += len(missing)
        return found, missing

    def put_many(self, kind: str, rows: dict[int, Any]) -> None:
        if not self.budget:
            return
        with self._lock:
            for i, v in rows.items():
                key = (kind, i)
                if key in self._d:
                    continue
                self._d[key] = v
                self._bytes += self._size(v)
            while self._bytes > self.budget and self._d:
                _, old = self._d.popitem(last=False)
                self._bytes -= self._size(old)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._d)


# =========================================================================== the store
def _resolve_version(client: Any, target: RedisTarget, fingerprint: str, dataset_fingerprint: str | None = None) -> int:
    """The ``current`` version, or with ``dataset_fingerprint`` the newest live version loaded from
    that dataset (a warning names ``current`` when it holds another dataset's graph)."""
    keys = GraphKeys(fingerprint, 1)
    try:
        with redis_errors(target, "resolving the graph version"):
            cur = client.get(keys.current)
            if dataset_fingerprint:
                for v in sorted((int(x) for x in client.smembers(keys.versions)), reverse=True):
                    m = {_s(k): _s(x) for k, x in client.hgetall(GraphKeys(fingerprint, v).meta).items()}
                    if m.get("state") == "live" and m.get("dataset_fingerprint") == dataset_fingerprint:
                        if cur is not None and int(cur) != v:
                            log.warning("graph %s: the current version v%s was not loaded from dataset %s (the "
                                        "model's); using v%d, the newest live version that was", fingerprint,
                                        _s(cur), dataset_fingerprint, v)
                        return v
                raise GraphNotFound(f"no live version of graph {fingerprint} at {target.masked} was loaded from "
                                    f"dataset {dataset_fingerprint} (the model's): load it with `gnnserve graph load`")
    except (FeatureUnavailable, FeatureCorrupt) as exc:
        raise _retag(exc) from None
    if cur is None:
        raise GraphNotFound(f"no live graph version for graph {fingerprint} at {target.masked}: "
                            "load one with `gnnserve graph load`")
    return int(cur)


def _read_meta(client: Any, target: RedisTarget, keys: GraphKeys) -> dict[str, str]:
    try:
        with redis_errors(target, "reading graph metadata"):
            raw = client.hgetall(keys.meta)
    except (FeatureUnavailable, FeatureCorrupt) as exc:
        raise _retag(exc) from None
    return {_s(k): _s(v) for k, v in raw.items()}


class RedisGraphStore:
    """Read access to one live graph version in Redis (see the module docstring).

    Duck-types the parts of :class:`~kernels.graph.CSRGraph` the server's limits need
    (``num_nodes``, ``num_edges``, ``max_degree``, ``is_weighted``) and builds batches with
    :meth:`induced_batch` / :meth:`lhop_batch`.

    Args:
        url: Redis URL (any form :mod:`serve.features.redis_store` accepts; cluster included).
        fingerprint: the graph fingerprint (a checkpoint's ``graph_fingerprint``).
        version: graph version; ``None`` = the ``current`` pointer (with
            ``expect_dataset_fingerprint``: the newest live version loaded from that dataset).
        expect_dataset_fingerprint: refuse a version loaded from another dataset.
        watch_interval: seconds between background checks of the pinned version's digest (0 = only
            on fetches). The version is pinned by number and ``checksum`` like the features'
            (:class:`serve.features.redis_store.VersionPin`): a version deleted or re-loaded with
            other content raises :class:`~serve.features.base.DataVersionChanged`, never mixes.
        cache_bytes: LRU budget for decoded rows and lists (0 = off).
        chunk_size: keys per ``MGET``.
        client: an existing redis-py client (not closed by :meth:`close`).

    Raises (constructor): :class:`GraphUnavailable`, :class:`GraphNotFound`, :class:`GraphCorrupt`.
    """

    is_remote = True

    def __init__(self, url: str, fingerprint: str, version: int | None = None, *,
                 expect_dataset_fingerprint: str | None = None, cache_bytes: int = DEFAULT_GRAPH_CACHE,
                 chunk_size: int = 1024, socket_timeout: float = 1.0, connect_timeout: float = 0.5,
                 retries: int = 2, client: Any = None, watch_interval: float = 5.0) -> None:
        self._pin: VersionPin | None = None
        self._target = parse_redis_url(url)
        self._owns = client is None
        try:
            self._client = client if client is not None else connect(
                self._target, socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries)
        except FeatureUnavailable as exc:
            raise _retag(exc) from None
        self._chunk = int(chunk_size)
        self.fingerprint = fingerprint
        if version is None:
            version = _resolve_version(self._client, self._target, fingerprint, expect_dataset_fingerprint)
        keys = GraphKeys(fingerprint, version)
        meta = _read_meta(self._client, self._target, keys)
        where = f"graph {fingerprint} v{version} at {self._target.masked}"
        if not meta:
            raise GraphNotFound(f"no graph metadata for {where}: load it with `gnnserve graph load`")
        if meta.get("format") != GRAPH_FORMAT:
            raise GraphCorrupt(f"graph metadata of {where} has format {meta.get('format')!r}, expected {GRAPH_FORMAT}")
        if meta.get("state") != "live":
            raise GraphNotFound(f"{where} is not live (state {meta.get('state')!r}): rerun `gnnserve graph load`")
        if expect_dataset_fingerprint and meta.get("dataset_fingerprint") != expect_dataset_fingerprint:
            raise GraphNotFound(f"{where} was loaded from dataset {meta.get('dataset_fingerprint')}, the model "
                                f"was trained on {expect_dataset_fingerprint}")
        try:
            self.num_nodes = int(meta["num_nodes"])
            self.num_edges = int(meta["num_edges"])
            self.max_degree = int(meta["max_degree"])
            self.is_weighted = meta["weighted"] == "1"
            self.index_dtype = np.dtype(meta["index_dtype"]).newbyteorder("<")
            self.ppr_meta: dict[str, dict[str, Any]] = json.loads(meta.get("ppr") or "{}")
            self.keys = GraphKeys(fingerprint, version, int(meta["shards"]))
        except (KeyError, ValueError, TypeError) as exc:
            raise GraphCorrupt(f"graph metadata of {where} is incomplete ({exc})") from None
        self.version = int(version)
        self.meta = meta
        if not meta.get("checksum"):
            raise GraphCorrupt(f"{where} is live but carries no checksum: rerun `gnnserve graph load`")
        self._pin = VersionPin(self._client, self._target, self.keys.meta, kind="graph", version=self.version,
                               digest=meta["checksum"], interval=watch_interval if self._owns else 0.0)
        big = int(self.index_dtype.itemsize == 8)
        self._adj = _Decoder(b"ga", big | (2 * self.is_weighted), self.index_dtype,
                             np.dtype("<f4") if self.is_weighted else None, self.num_nodes, False, "adjacency row")
        self._ppr_dec: dict[str, _Decoder] = {}
        for ck, pm in self.ppr_meta.items():
            code = _SCORE_CODES[pm.get("scores", "none")]
            self._ppr_dec[ck] = _Decoder(b"gp", big | (code << 1), self.index_dtype, _SCORE_DTYPES.get(code),
                                         self.num_nodes, True, f"PPR list ({ck})")
        self.cache = _RowCache(cache_bytes)
        self.round_trips = 0
        # the overlay of live updates (module docstring): changed only by apply_*, under the caller's lock
        self.base_num_nodes = self.num_nodes
        self._base_num_edges = self.num_edges
        self._base_max_degree = self.max_degree
        self._ov_rows: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self._ov_lists: dict[str, dict[int, tuple[np.ndarray, np.ndarray | None]]] = {}
        self._ov_degrees: dict[int, int] = {}  # length -> how many overlay rows have it (for max_degree)
        self._ov_lock = threading.Lock()  # guards the counters below for overlay_stats()
        self._ov_row_bytes = 0
        self._ov_list_bytes = 0
        self._ov_list_count = 0
        log.info("graph store: %s (N=%d, E=%d, PPR configs %s)", where, self.num_nodes, self.num_edges,
                 sorted(self.ppr_meta) or "none")

    # ---------------------------------------------------------------- raw rows
    def _rows(self, kind: str, ids: np.ndarray, keys: _PartKeys, dec: _Decoder,
              overlay: dict[int, tuple[np.ndarray, np.ndarray | None]] | None) -> dict[int, Any]:
        """Rows of ``ids`` (distinct): overlay rows first, then the snapshot's (LRU or Redis).

        A node added live (``>= base_num_nodes``) without an overlay row has an empty adjacency
        row; without an overlay PPR list it is :class:`GraphNotFound`.
        """
        lst = [int(i) for i in ids]
        if not overlay and self.num_nodes == self.base_num_nodes:
            return self._snapshot_rows(kind, lst, keys, dec)
        found: dict[int, Any] = {}
        rest: list[int] = []
        fresh: list[int] = []
        base_n = self.base_num_nodes
        for i in lst:
            v = overlay.get(i) if overlay else None
            if v is not None:
                found[i] = v
            elif i >= base_n:
                fresh.append(i)
            else:
                rest.append(i)
        if fresh:
            if kind != "a":
                raise GraphNotFound(f"no {dec.what} for nodes {summarize_ids(np.asarray(fresh))}: they were added "
                                    f"after graph {self.fingerprint} v{self.version} was stored and no list was "
                                    "applied for them (apply_lists)")
            for i in fresh:
                found[i] = (_EMPTY_IDS, None)
        if rest:
            found.update(self._snapshot_rows(kind, rest, keys, dec))
        return found

    def _snapshot_rows(self, kind: str, lst: list[int], keys: _PartKeys, dec: _Decoder) -> dict[int, Any]:
        """Decoded stored rows of the distinct ``lst``, from the LRU or one pipelined fetch."""
        found, missing = self.cache.get_many(kind, lst)
        if missing:
            arr = np.asarray(missing, dtype=np.int64)
            try:
                with redis_errors(self._target, f"fetching {len(missing)} graph rows ({dec.what})"):
                    values, digest = fetch_blobs_checked(self._client, keys, arr, self.keys.meta,
                                                         cluster=self._target.cluster, chunk_size=self._chunk)
            except (FeatureUnavailable, FeatureCorrupt) as exc:
                raise _retag(exc) from None
            self.round_trips += 1
            assert self._pin is not None
            self._pin.check(digest)  # rows of a re-loaded version never meet cached rows of the old one
            gone = [i for i, v in zip(missing, values, strict=True) if v is None]
            if gone:
                raise GraphNotFound(
                    f"{len(gone)} of {len(missing)} {dec.what} keys of graph {self.fingerprint} v{self.version} "
                    f"are missing at {self._target.masked}: nodes {summarize_ids(np.asarray(gone))} (Redis lost "
                    "data: a restart without persistence, eviction or a flush; rerun `gnnserve graph load`)")
            new = {i: dec.decode(i, v) for i, v in zip(missing, values, strict=True)}
            self.cache.put_many(kind, new)
            found.update(new)
        return found

    def adjacency(self, ids: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        """``{node: (neighbour ids, weights or None)}`` for distinct ``ids``."""
        return self._rows("a", ids, self.keys.adj, self._adj, self._ov_rows)

    def ppr_lists(self, config_key: str, ids: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        dec = self._ppr_dec.get(config_key)
        if dec is None:
            raise GraphNotFound(self._no_ppr(config_key))
        return self._rows("p" + config_key, ids, self.keys.ppr(config_key), dec, self._ov_lists.get(config_key))

    def _no_ppr(self, config_key: str) -> str:
        return (f"graph {self.fingerprint} v{self.version} at {self._target.masked} has no PPR lists for config "
                f"{config_key} (it has {sorted(self.ppr_meta) or 'none'}): load them with "
                "`gnnserve graph load --repo REPO` (or --ppr-k/--ppr-alpha/--ppr-eps matching the model)")

    # ---------------------------------------------------------------- the overlay
    def apply_rows(self, rows: dict[int, tuple[np.ndarray, np.ndarray | None]], num_nodes: int) -> None:
        """From now on the adjacency row of each node in ``rows`` is the one given.

        Args:
            rows: ``{node: (neighbour ids, weights or None)}``: ids sorted, distinct, in
                ``[0, num_nodes)`` (any integer dtype, stored as int64); weights float
                ``[len(ids)]``, finite. A weighted row makes the whole graph weighted (rows without
                weights weigh 1 per edge).
            num_nodes: the node count from now on (``>=`` the current one): nodes
                ``base_num_nodes .. num_nodes - 1`` exist only in the overlay.

        Raises:
            ValueError: a malformed row or a shrinking ``num_nodes``; nothing changes.
            GraphUnavailable / GraphCorrupt / GraphNotFound: fetching the stored rows being
                replaced (their lengths give ``num_edges``) failed; nothing changes.

        Call it under the caller's write lock: no read of this store may run meanwhile.
        """
        n = int(num_nodes)
        if n < self.num_nodes:
            raise ValueError(f"num_nodes cannot shrink: the graph has {self.num_nodes} nodes, got {n}")
        clean: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        for node, (ids, w) in rows.items():
            v = int(node)
            if not 0 <= v < n:
                raise ValueError(f"adjacency row for node {v} outside [0, {n})")
            clean[v] = _clean_row(v, ids, w, n, sorted_ids=True, what="adjacency row")
        if not clean and n == self.num_nodes:
            return
        replaced = [v for v in clean if v < self.base_num_nodes and v not in self._ov_rows]
        stored = self._snapshot_rows("a", replaced, self.keys.adj, self._adj) if replaced else {}
        delta = 0
        for v, row in clean.items():
            old = self._ov_rows.get(v)
            old_len = len(old[0]) if old is not None else len(stored[v][0]) if v in stored else 0
            delta += len(row[0]) - old_len
        with self._ov_lock:
            for v, row in clean.items():
                old = self._ov_rows.get(v)
                if old is not None:
                    self._ov_row_bytes -= _RowCache._size(old)
                    _count_degree(self._ov_degrees, len(old[0]), -1)
                self._ov_rows[v] = row
                self._ov_row_bytes += _RowCache._size(row)
                _count_degree(self._ov_degrees, len(row[0]), +1)
            self.num_nodes = n
            self.num_edges += delta
            self.max_degree = max(self._base_max_degree, max(self._ov_degrees, default=0))
            if any(row[1] is not None for row in clean.values()):
                self.is_weighted = True

    def apply_lists(self, config_key: str, lists: dict[int, tuple[np.ndarray, np.ndarray | None]]) -> None:
        """From now on the top-K PPR list of each node in ``lists`` (under configuration
        ``config_key``) is the one given: ``{node: (ids, scores or None)}``, the node itself first,
        ids distinct and in ``[0, num_nodes)``, at most ``k_max`` of them. Nodes added by
        :meth:`apply_rows` need one before a lookup. Same locking and errors as :meth:`apply_rows`.
        """
        if config_key not in self._ppr_dec:
            raise GraphNotFound(self._no_ppr(config_key))
        k_max = int(self.ppr_meta[config_key]["k_max"])
        n = self.num_nodes
        clean: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        for node, (ids, scores) in lists.items():
            v = int(node)
            if not 0 <= v < n:
                raise ValueError(f"PPR list for node {v} outside [0, {n})")
            row = _clean_row(v, ids, scores, n, sorted_ids=False, what=f"PPR list ({config_key})")
            if len(row[0]) > k_max:
                raise ValueError(f"PPR list ({config_key}) of node {v} has {len(row[0])} entries, more than "
                                 f"k_max = {k_max}")
            clean[v] = row
        with self._ov_lock:
            lay = self._ov_lists.setdefault(config_key, {})
            for v, row in clean.items():
                old = lay.get(v)
                if old is not None:
                    self._ov_list_bytes -= _RowCache._size(old)
                else:
                    self._ov_list_count += 1
                lay[v] = row
                self._ov_list_bytes += _RowCache._size(row)

    def overlay_stats(self) -> dict[str, int]:
        """What the overlay holds: ``rows``/``row_bytes`` (adjacency), ``lists``/``list_bytes``
        (PPR, all configurations), ``bytes`` (both), ``new_nodes``. Safe from any thread."""
        with self._ov_lock:
            return {"rows": len(self._ov_rows), "row_bytes": self._ov_row_bytes, "lists": self._ov_list_count,
                    "list_bytes": self._ov_list_bytes, "bytes": self._ov_row_bytes + self._ov_list_bytes,
                    "new_nodes": self.num_nodes - self.base_num_nodes}

    def ppr_index(self, cfg: Any) -> RedisPPRIndex:
        """A :class:`RedisPPRIndex` view for a :class:`kernels.ppr.PPRConfig`."""
        key = cfg.key()
        if key not in self.ppr_meta:
            raise GraphNotFound(self._no_ppr(key))
        return RedisPPRIndex(self, cfg, int(self.ppr_meta[key]["k_max"]))

    # ---------------------------------------------------------------- local graphs
    def local_graph(self, uniq: np.ndarray, rows: dict[int, Any]) -> tuple[Any, np.ndarray]:
        """CSR over the sorted distinct ``uniq`` (local id = rank) keeping edges inside ``uniq``,
        and the full-graph GCN degree ``1 + sum_j w_ij`` of each node (float64 ``[U]``)."""
        from kernels.graph import CSRGraph

        u = len(uniq)
        parts = [rows[int(i)] for i in uniq]
        deg = np.fromiter((len(p[0]) for p in parts), dtype=np.int64, count=u)
        cols = np.concatenate([p[0] for p in parts]).astype(np.int64) if u else np.zeros(0, np.int64)
        if self.is_weighted:  # rows without weights (unweighted snapshot or overlay row) weigh 1 per edge
            ws = [p[1] if p[1] is not None else np.ones(len(p[0]), np.float32) for p in parts]
            w = np.concatenate(ws).astype(np.float32) if u else np.zeros(0, np.float32)
            wsum = np.fromiter((float(x.sum(dtype=np.float64)) for x in ws), dtype=np.float64, count=u)
        else:
            w = None
            wsum = deg.astype(np.float64)
        pos = np.searchsorted(uniq, cols)
        np.minimum(pos, max(u - 1, 0), out=pos)
        keep = uniq[pos] == cols if u else np.zeros(0, bool)
        row = np.repeat(np.arange(u, dtype=np.int64), deg)
        indptr = np.zeros(u + 1, dtype=np.int64)
        np.cumsum(np.bincount(row[keep], minlength=u), out=indptr[1:])
        g = CSRGraph(indptr=indptr, indices=pos[keep].astype(np.int32),
                     weights=w[keep] if w is not None else None, num_nodes=u)
        return g, wsum + 1.0

    def induced_batch(self, ptr: np.ndarray, nodes: np.ndarray) -> Any:
        """:func:`kernels.subgraph.induced_batch` over the stored graph, rows fetched from Redis.

        The returned batch carries ``gcn_degrees`` (float64 ``[R]``): full-graph GCN degrees of
        its rows, what ``GCN.norm_degrees_for`` gives on the in-memory graph.
        """
        nodes = np.asarray(nodes, dtype=np.int64)
        if len(nodes) and (int(nodes.min()) < 0 or int(nodes.max()) >= self.num_nodes):
            raise ValueError(f"node ids must lie in [0, {self.num_nodes})")
        uniq = np.unique(nodes)
        return self._batch_from(uniq, self.adjacency(uniq), ptr, nodes)

    def _batch_from(self, uniq: np.ndarray, rows: dict[int, Any], ptr: np.ndarray, nodes: np.ndarray) -> Any:
        from kernels.subgraph import induced_batch

        g, gdeg = self.local_graph(uniq, rows)
        local = np.searchsorted(uniq, nodes)
        b = induced_batch(g, ptr, local)
        out = replace(b, node_ids=nodes, unique_ids=uniq[b.unique_ids])
        out.gcn_degrees = gdeg[local]  # type: ignore[attr-defined]
        return out

    def _lhop_rows(self, targets: np.ndarray, hops: int) -> tuple[np.ndarray, np.ndarray, dict[int, Any]]:
        """``(targets, uniq, rows)``: the adjacency rows of every node within ``hops`` of a target
        (``hops + 1`` fetch rounds, fewer with the LRU) and their sorted ids."""
        t = np.asarray(targets, dtype=np.int64)
        if len(t) and (int(t.min()) < 0 or int(t.max()) >= self.num_nodes):
            raise ValueError(f"targets must lie in [0, {self.num_nodes})")
        rows: dict[int, Any] = {}
        frontier = np.unique(t)
        for h in range(hops + 1):
            rows.update(self.adjacency(frontier))
            if h == hops:
                break
            nxt = np.unique(np.concatenate([rows[int(i)][0] for i in frontier] or [np.zeros(0, np.int64)]))
            nxt = nxt.astype(np.int64)
            seen = np.fromiter(rows.keys(), dtype=np.int64, count=len(rows))
            frontier = np.setdiff1d(nxt, seen, assume_unique=True)
            if not len(frontier):
                break
        uniq = np.fromiter(sorted(rows), dtype=np.int64, count=len(rows))
        return t, uniq, rows

    def lhop_local(self, targets: np.ndarray, hops: int) -> tuple[Any, np.ndarray, np.ndarray]:
        """``(graph, uniq, gcn_degrees)``: :meth:`local_graph` over the ``hops``-hop scope of
        ``targets`` (local id = rank in the sorted ``uniq``). Rows of nodes within ``hops - 1`` of a
        target are complete and in the stored order, which is what an execution plan
        (:mod:`kernels.plan`) of a ``hops``-layer model reads."""
        _, uniq, rows = self._lhop_rows(targets, hops)
        g, gdeg = self.local_graph(uniq, rows)
        return g, uniq, gdeg

    def lhop_batch(self, targets: np.ndarray, hops: int) -> tuple[Any, np.ndarray, np.ndarray]:
        """``(batch, ptr, nodes)``: the exact L-hop lists (as :func:`kernels.subgraph.lhop_nodes`)
        and their induced batch; ``hops + 1`` fetch rounds, fewer with the LRU."""
        from kernels.subgraph import lhop_nodes

        t, uniq, rows = self._lhop_rows(targets, hops)
        g, _ = self.local_graph(uniq, rows)
        lptr, lnodes = lhop_nodes(g, np.searchsorted(uniq, t), hops)
        nodes = uniq[lnodes]
        return self._batch_from(uniq, rows, lptr, nodes), lptr, nodes

    # ---------------------------------------------------------------- data version
    @property
    def digest(self) -> str:
        """The content digest (the load's ``checksum``) pinned at open time."""
        return self._pin.digest if self._pin is not None else ""

    @property
    def data_version(self) -> str:
        """``graph:v<version>:<checksum>``; raises :class:`DataVersionChanged` once a check saw the
        pinned version deleted or replaced."""
        assert self._pin is not None
        self._pin.raise_if_changed()
        return self._pin.label

    def check_version(self) -> None:
        """Read the stored digest now; raises :class:`DataVersionChanged` if it is not the pinned one."""
        assert self._pin is not None
        try:
            self._pin.poll()
        except FeatureUnavailable as exc:
            raise _retag(exc) from None

    # ---------------------------------------------------------------- misc
    def ping(self) -> bool:
        try:
            with redis_errors(self._target, "ping"):
                return bool(self._client.ping())
        except FeatureUnavailable:
            return False

    def stats(self) -> dict[str, Any]:
        return {"url": self._target.masked, "fingerprint": self.fingerprint, "version": self.version,
                "digest": self.digest, "cluster": self._target.cluster, "cache_rows": len(self.cache), "cache_bytes": self.cache.nbytes,
                "cache_hits": self.cache.hits, "cache_misses": self.cache.misses, "round_trips": self.round_trips,
                "overlay": self.overlay_stats()}

    def close(self) -> None:
        if self._pin is not None:
            self._pin.stop()
        if self._owns and self._client is not None:
            try:
                self._client.close()
            except Exception:
                log.debug("closing the graph store's Redis client failed")
            self._client = None

    def __repr__(self) -> str:
        return (f"RedisGraphStore(url={self._target.masked!r}, fingerprint={self.fingerprint!r}, "
                f"version={self.version}, N={self.num_nodes})")


@dataclass
class RedisPPRIndex:
    """The :class:`kernels.ppr.PPRIndex` lookup API over lists stored in Redis."""

    store: RedisGraphStore
    config: Any
    k_max: int
    path: Any = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return self.store.num_nodes

    def apply_lists(self, config_key: str, lists: dict[int, tuple[np.ndarray, np.ndarray | None]]) -> None:
        """:meth:`RedisGraphStore.apply_lists` for this index's configuration (``config_key`` must be
        ``config.key()``)."""
        if config_key != self.config.key():
            raise ValueError(f"this index holds PPR lists of config {self.config.key()}, not {config_key}")
        self.store.apply_lists(config_key, lists)

    def lookup(self, targets: Any, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """First ``k`` entries of each target's list: ``(ptr int64 [B + 1], nodes int64)``."""
        k = self.k_max if k is None else int(k)
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k must lie in [1, k_max={self.k_max}], got {k}")
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        if len(t) and (int(t.min()) < 0 or int(t.max()) >= self.num_nodes):
            raise ValueError(f"targets must lie in [0, {self.num_nodes})")
        lists = self.store.ppr_lists(self.config.key(), np.unique(t))
        parts = [lists[int(i)][0][:k] for i in t]
        ptr = np.zeros(len(t) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=ptr[1:])
        nodes = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return ptr, nodes


def _clean_row(node: int, ids: Any, extra: Any, n: int, *, sorted_ids: bool,
               what: str) -> tuple[np.ndarray, np.ndarray | None]:
    """A checked, private, read-only copy of an overlay row (``ValueError`` names what is wrong)."""
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{what} of node {node}: ids must be a 1-D integer array, got {a.dtype} {a.shape}")
    a = np.array(a, dtype=np.int64)
    if len(a) and (int(a.min()) < 0 or int(a.max()) >= n):
        raise ValueError(f"{what} of node {node}: ids must lie in [0, {n}), found {int(a.min())} .. {int(a.max())}")
    if sorted_ids:
        if len(a) > 1 and not bool((a[1:] > a[:-1]).all()):
            raise ValueError(f"{what} of node {node}: ids must be sorted and distinct")
    else:
        if not len(a) or int(a[0]) != node:
            raise ValueError(f"{what} of node {node} must start with the node itself")
        if len(np.unique(a)) != len(a):
            raise ValueError(f"{what} of node {node}: ids must be distinct")
    a.setflags(write=False)
    if extra is None:
        return a, None
    e = np.array(extra, dtype=np.float32)
    if e.shape != a.shape:
        raise ValueError(f"{what} of node {node}: {e.shape[0] if e.ndim == 1 else e.shape} values for {len(a)} ids")
    if not bool(np.isfinite(e).all()):
        raise ValueError(f"{what} of node {node} holds NaN or infinite values")
    e.setflags(write=False)
    return a, e


def _count_degree(hist: dict[int, int], degree: int, step: int) -> None:
    c = hist.get(degree, 0) + step
    if c:
        hist[degree] = c
    else:
        hist.pop(degree, None)


# =========================================================================== loading
@dataclass
class GraphLoadReport:
    url: str
    fingerprint: str
    version: int
    num_nodes: int
    num_edges: int
    ppr_configs: dict[str, dict[str, Any]]
    keys_written: int
    bytes_written: int
    seconds: float
    checksum: str
    state: str
    already_live: bool = False  # a re-run on a live version: compared, nothing written

    def summary(self) -> str:
        mib = self.bytes_written / 2**20
        if self.already_live:
            return (f"graph {self.fingerprint} v{self.version} at {self.url}: already live and identical to the "
                    f"dataset (checksum {self.checksum}); nothing written ({self.seconds:.1f} s)")
        return (f"graph {self.fingerprint} v{self.version} at {self.url}: {self.state}; {self.num_nodes} nodes, "
                f"{self.num_edges} edges, PPR configs {sorted(self.ppr_configs) or 'none'}; {self.keys_written} "
                f"keys, {mib:.1f} MiB of blobs in {self.seconds:.1f} s; checksum {self.checksum}")


def _chunk_blobs(graph: Any, ppr: dict[str, tuple[Any, str]], a: int, b: int,
                 idt: np.dtype) -> list[tuple[str, list[bytes]]]:
    """``[(part, blobs)]`` of nodes ``a .. b-1``: adjacency, then each PPR config."""
    big = int(idt.itemsize == 8)
    lo, hi = int(graph.indptr[a]), int(graph.indptr[b])
    ptr = np.asarray(graph.indptr[a : b + 1], dtype=np.int64) - lo
    ids = np.ascontiguousarray(graph.indices[lo:hi], dtype=idt)
    w = np.ascontiguousarray(graph.weights[lo:hi], dtype="<f4") if graph.weights is not None else None
    out = [("a", _encode_rows(b"ga", big | (2 * (w is not None)), a, ptr, ids, w))]
    for ck, (idx, scores) in ppr.items():
        plo, phi = int(idx.ptr[a]), int(idx.ptr[b])
        pp = np.asarray(idx.ptr[a : b + 1], dtype=np.int64) - plo
        pn = np.ascontiguousarray(idx.nodes[plo:phi], dtype=idt)
        code = _SCORE_CODES[scores]
        ps = np.ascontiguousarray(idx.scores[plo:phi], dtype=_SCORE_DTYPES[code]) if code else None
        out.append((f"p:{ck}", _encode_rows(b"gp", big | (code << 1), a, pp, pn, ps)))
    return out


def _part_keys(keys: GraphKeys, part: str) -> _PartKeys:
    return keys.adj if part == "a" else keys.ppr(part[2:])


def load_graph(dataset: Any, redis_url: str, *, version: int = 1, ppr: Sequence[Any] = (),
               ppr_cache_dir: str | None = None, scores: str = "float16", shards: int = DEFAULT_SHARDS,
               chunk_size: int = 2048, progress: bool = True, client: Any = None) -> GraphLoadReport:
    """Write the adjacency rows and the PPR top-K lists of ``dataset``'s graph to Redis, verify, go live.

    Chunks of ``chunk_size`` consecutive nodes are written with pipelined ``MSET`` (per hash-tag
    shard on a cluster) and read back; the BLAKE2b digest of each chunk of each part is computed
    from what Redis returned and compared with what was written. Only when every chunk of every
    part matches does the version turn ``live`` (with ``count`` and ``checksum``) and the
    ``current`` pointer move to it (never backwards). Running it again on a version still
    ``loading`` (an interrupted load) rewrites it. A ``live`` version is never written to nor taken
    offline: a re-run with the same content only reads every chunk back and compares (the report
    says ``already_live``); one with other content, or whose stored chunks differ from the
    dataset, is refused with :class:`GraphCorrupt` and the version stays live and untouched:
    load a new ``version`` instead (replicas pick the newest live one of their dataset).

    Args:
        ppr: :class:`kernels.ppr.PPRConfig` objects; each index is opened from / built into
            ``ppr_cache_dir`` (the server's ``REPO/_ppr`` reuses what a server built) or in memory.
        scores: ``none``, ``float16`` or ``float32``: store the PPR scores too (not needed for serving).
    """
    from tqdm.auto import tqdm

    from kernels.ppr import PPRIndex

    if scores not in _SCORE_CODES:
        raise ValueError(f"scores must be one of {sorted(_SCORE_CODES)}, got {scores!r}")
    t0 = time.perf_counter()
    graph = dataset.graph
    fp = graph.fingerprint()
    target = parse_redis_url(redis_url)
    cl = client if client is not None else connect(target, socket_timeout=10.0, connect_timeout=2.0, retries=3)
    keys = GraphKeys(fp, version, shards)
    n = graph.num_nodes
    idt = np.dtype("<i4") if n <= _INT32_MAX else np.dtype("<i8")
    indexes: dict[str, tuple[Any, str]] = {}
    ppr_meta: dict[str, dict[str, Any]] = {}
    for cfg in ppr:
        idx = (PPRIndex.open_or_build(ppr_cache_dir, graph, cfg, progress=progress) if ppr_cache_dir
               else PPRIndex.build(graph, cfg, progress=progress))
        indexes[cfg.key()] = (idx, scores)
        ppr_meta[cfg.key()] = {"config": cfg.to_dict(), "k_max": int(idx.k_max), "nnz": len(idx.nodes),
                               "scores": scores}
    try:
        with redis_errors(target, "starting the graph load"):
            old = {_s(k): _s(v) for k, v in cl.hgetall(keys.meta).items()}
            live = old.get("state") == "live"
            if live and (old.get("ppr") != json.dumps(ppr_meta, sort_keys=True)
                         or old.get("num_edges") != str(graph.num_edges)
                         or old.get("dataset_fingerprint") != dataset.fingerprint()
                         or old.get("shards") != str(shards) or old.get("index_dtype") != idt.str):
                raise GraphCorrupt(f"graph {fp} v{version} at {target.masked} is live with other content: "
                                   "live versions are never rewritten; load a new --version")
            if live:
                keys = GraphKeys(fp, version, int(old["shards"]))
                log.info("graph %s v%d is live: comparing it with the dataset, writing nothing", fp, version)
        if live:
            return _compare_live(cl, target, keys, graph, indexes, idt, old, chunk_size, t0, ppr_meta)
        with redis_errors(target, "starting the graph load"):
            cl.sadd(keys.versions, version)
            cl.hset(keys.meta, mapping={
                "format": GRAPH_FORMAT, "fingerprint": fp, "version": version, "state": "loading",
                "checksum": "",  # before any row: a replica pinned to an older load of this number refuses
                "num_nodes": n, "num_edges": graph.num_edges,
                "max_degree": int(graph.degrees.max()) if n else 0, "weighted": int(graph.weights is not None),
                "index_dtype": idt.str, "shards": shards, "chunk_size": chunk_size,
                "ppr": json.dumps(ppr_meta, sort_keys=True),
                "dataset_fingerprint": dataset.fingerprint(), "dataset_name": getattr(dataset, "name", "") or "",
                "created_at": old.get("created_at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "key_format": keys.key_format,
            })
        digests: list[bytes] = []
        written = nbytes = 0
        with tqdm(total=n, desc="graph load", unit="node", disable=not progress) as bar:
            for a in range(0, n, chunk_size):
                b = min(n, a + chunk_size)
                ids = np.arange(a, b, dtype=np.int64)
                for part, blobs in _chunk_blobs(graph, indexes, a, b, idt):
                    pk = _part_keys(keys, part)
                    with redis_errors(target, f"writing graph chunk {a}..{b} ({part})"):
                        write_blobs(cl, pk, ids, blobs, cluster=target.cluster, chunk_size=1024)
                        back = fetch_blobs(cl, pk, ids, cluster=target.cluster, chunk_size=1024)
                    if back != blobs:
                        bad = [a + i for i, (x, y) in enumerate(zip(back, blobs, strict=True)) if x != y]
                        raise GraphCorrupt(f"graph chunk {a}..{b} ({part}) read back differently at "
                                           f"{target.masked}: nodes {summarize_ids(np.asarray(bad))}")
                    h = hashlib.blake2b(digest_size=16)
                    for x in back:
                        h.update(x)
                    digests.append(h.digest())
                    written += len(blobs)
                    nbytes += sum(map(len, blobs))
                bar.update(b - a)
        checksum = hashlib.blake2b(b"".join(digests), digest_size=16, person=b"gnnserve.graph").hexdigest()
        with redis_errors(target, "marking the graph version live"):
            cl.hset(keys.meta, mapping={"state": "live", "count": n, "checksum": checksum,
                                        "live_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            cl.eval(_SET_CURRENT, 1, keys.current, version)
    except (FeatureUnavailable, FeatureCorrupt) as exc:
        raise _retag(exc) from None
    finally:
        if client is None:
            cl.close()
    return GraphLoadReport(target.masked, fp, version, n, graph.num_edges, ppr_meta, written, nbytes,
                           time.perf_counter() - t0, checksum, "live")


def _compare_live(cl: Any, target: RedisTarget, keys: GraphKeys, graph: Any, indexes: dict[str, tuple[Any, str]],
                  idt: np.dtype, old: dict[str, str], chunk_size: int, t0: float,
                  ppr_meta: dict[str, dict[str, Any]]) -> GraphLoadReport:
    """A re-run of ``load_graph`` on a live version: read back, compare, write nothing."""
    digests: list[bytes] = []
    bad: list[str] = []
    n = graph.num_nodes
    for a in range(0, n, chunk_size):
        b = min(n, a + chunk_size)
        ids = np.arange(a, b, dtype=np.int64)
        for part, blobs in _chunk_blobs(graph, indexes, a, b, idt):
            with redis_errors(target, f"comparing graph chunk {a}..{b} ({part})"):
                back = fetch_blobs(cl, _part_keys(keys, part), ids, cluster=target.cluster, chunk_size=1024)
            diff = [a + i for i, (x, y) in enumerate(zip(back, blobs, strict=True)) if x != y]
            if diff:
                bad.append(f"{part}: nodes {summarize_ids(np.asarray(diff))}")
            h = hashlib.blake2b(digest_size=16)
            for x in back:
                if x is not None:
                    h.update(x)
            digests.append(h.digest())
    checksum = hashlib.blake2b(b"".join(digests), digest_size=16, person=b"gnnserve.graph").hexdigest()
    where = f"graph {keys.fingerprint} v{keys.version} at {target.masked}"
    if bad:
        raise GraphCorrupt(f"{where} is live and differs from this dataset ({'; '.join(bad[:5])}): nothing was "
                           "written and the version stays live; load a new --version (replicas pin versions by "
                           "checksum and refuse a changed one)")
    if checksum != old.get("checksum"):
        raise GraphCorrupt(f"{where} is live but its checksum {old.get('checksum')!r} does not match its rows "
                           f"({checksum}): nothing was written; load a new --version")
    return GraphLoadReport(target.masked, keys.fingerprint, keys.version, n, graph.num_edges, ppr_meta, 0, 0,
                           time.perf_counter() - t0, checksum, "live", already_live=True)


def verify_graph(dataset: Any, redis_url: str, *, version: int | None = None, ppr_cache_dir: str | None = None,
                 chunk_size: int = 2048, client: Any = None) -> tuple[bool, str]:
    """Compare a stored version with the dataset (and its PPR indexes) blob for blob: ``(ok, message)``."""
    from kernels.ppr import PPRConfig, PPRIndex

    graph = dataset.graph
    target = parse_redis_url(redis_url)
    cl = client if client is not None else connect(target, socket_timeout=10.0, connect_timeout=2.0, retries=3)
    try:
        store = RedisGraphStore(redis_url, graph.fingerprint(), version, cache_bytes=0, client=cl)
        n = graph.num_nodes
        if n != store.num_nodes or graph.num_edges != store.num_edges:
            return False, f"stored graph has N={store.num_nodes}, E={store.num_edges}; dataset N={n}, E={graph.num_edges}"
        indexes = {}
        for ck, pm in store.ppr_meta.items():
            cfg = PPRConfig.from_dict(pm["config"])
            idx = (PPRIndex.open_or_build(ppr_cache_dir, graph, cfg, progress=False) if ppr_cache_dir
                   else PPRIndex.build(graph, cfg, progress=False))
            indexes[ck] = (idx, pm.get("scores", "none"))
        bad: list[str] = []
        for a in range(0, n, chunk_size):
            b = min(n, a + chunk_size)
            ids = np.arange(a, b, dtype=np.int64)
            for part, blobs in _chunk_blobs(graph, indexes, a, b, store.index_dtype):
                with redis_errors(target, "verifying the graph"):
                    back = fetch_blobs(cl, _part_keys(store.keys, part), ids, cluster=target.cluster)
                diff = [a + i for i, (x, y) in enumerate(zip(back, blobs, strict=True)) if x != y]
                if diff:
                    bad.append(f"{part}: nodes {summarize_ids(np.asarray(diff))}")
        if bad:
            return False, f"graph {store.fingerprint} v{store.version}: differs from the dataset: " + "; ".join(bad)
        return True, f"graph {store.fingerprint} v{store.version}: every row and list matches the dataset"
    finally:
        if client is None:
            cl.close()


# =========================================================================== CLI
def _repo_ppr_configs(repo: str, dataset_fp: str) -> list[Any]:
    """PPR configurations of the repository's checkpoints trained on this dataset (config.json only)."""
    from pathlib import Path

    from kernels.ppr import PPRConfig

    out: dict[str, Any] = {}
    for cfg_path in sorted(Path(repo).glob("*/*/config.json")):
        if cfg_path.parent.parent.name.startswith(("_", ".")):
            continue
        try:
            conf = json.loads(cfg_path.read_text())
        except (OSError, ValueError):
            continue
        if conf.get("ppr") and conf.get("dataset", {}).get("fingerprint") == dataset_fp:
            c = PPRConfig.from_dict(conf["ppr"])
            out[c.key()] = c
    return list(out.values())


def main(argv: Sequence[str] | None = None) -> int:
    """``gnnserve graph load|verify``."""
    ap = argparse.ArgumentParser(prog="gnnserve graph",
                                 description="Store a graph's adjacency and PPR top-K lists in Redis (stateless replicas).")
    sub = ap.add_subparsers(dest="action", required=True)
    for name in ("load", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--dataset", required=True, help="dataset (.npz, dataset directory, synthetic:N:seed)")
        p.add_argument("--redis", required=True, help="redis://, rediss://, unix:// or redis+cluster:// URL")
        p.add_argument("--ppr-cache", default=None, help="PPR index directory (default REPO/_ppr with --repo)")
        if name == "load":
            p.add_argument("--version", type=int, default=1)
            p.add_argument("--repo", default=None, help="load PPR lists for every PPR model of this repository")
            p.add_argument("--ppr-k", type=int, default=None, help="also load lists for PPRConfig(topk=K, ...)")
            p.add_argument("--ppr-alpha", type=float, default=None)
            p.add_argument("--ppr-eps", type=float, default=None)
            p.add_argument("--scores", choices=sorted(_SCORE_CODES), default="float16")
            p.add_argument("--chunk-size", type=int, default=2048)
            p.add_argument("--no-progress", action="store_true")
        else:
            p.add_argument("--version", type=int, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from kernels.datasets import load_dataset
    from kernels.ppr import PPRConfig

    try:
        ds = load_dataset(args.dataset)
    except (OSError, ValueError) as exc:
        print(f"error: cannot load dataset {args.dataset}: {exc}", file=sys.stderr)
        return 2
    cache = args.ppr_cache or (f"{args.repo}/_ppr" if getattr(args, "repo", None) else None)
    try:
        if args.action == "verify":
            ok, msg = verify_graph(ds, args.redis, version=args.version, ppr_cache_dir=cache)
            print(msg)
            return 0 if ok else 1
        cfgs = _repo_ppr_configs(args.repo, ds.fingerprint()) if args.repo else []
        if args.ppr_k is not None:
            kw: dict[str, Any] = {"topk": args.ppr_k}
            if args.ppr_alpha is not None:
                kw["alpha"] = args.ppr_alpha
            if args.ppr_eps is not None:
                kw["eps"] = args.ppr_eps
            cfgs.append(PPRConfig(**kw))
        report = load_graph(ds, args.redis, version=args.version, ppr=cfgs, ppr_cache_dir=cache,
                            scores=args.scores, chunk_size=args.chunk_size, progress=not args.no_progress)
    except (FeatureUnavailable, FeatureCorrupt, FeatureNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
