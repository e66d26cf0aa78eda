"""Node features in Redis (standalone or Cluster): their key schema, blob format, and the store.

Key schema
----------
Everything lives under ``gnnserve:feat:<fp>`` where ``<fp>`` is the graph's fingerprint
(``CSRGraph.fingerprint()``: 32 hex digits, identifies the node id space), and one integer feature
version ``v<version>`` below it, so two graphs or two versions of one graph never mix::

    gnnserve:feat:<fp>:v<version>:{<node mod S>}:<node>  one node's feature blob (a string)
    gnnserve:feat:<fp>:v<version>:meta                   hash: the version's metadata (below)
    gnnserve:feat:<fp>:v<version>:chunks                 hash: chunk index -> digest (loader progress)
    gnnserve:feat:<fp>:v<version>:lock                   string with TTL: a load in progress
    gnnserve:feat:<fp>:current                           string: the newest live version
    gnnserve:feat:<fp>:versions                          set: every version ever started

Redis Cluster: the ``{<node mod S>}`` part is the hash tag, with ``S = shards`` (default 256,
recorded in the metadata). A single tag for the whole graph would put every key in one slot, hence
on one master: simple, one ``MGET`` per batch, but that master holds all the memory and serves all
the load. Per-node keys without a tag spread perfectly but cost one slot lookup and, in the
worst case, one command per key. ``S`` tags in between spread the keys over ``S`` slots (with 3
masters and S = 256, each master owns about 85 of them, +-9 %), and one batch's fetch is at most
``S`` ``MGET`` commands, grouped per master into one pipelined round trip each (all masters are
written first, then read). On a standalone server the tag is just part of the name and a batch is
one pipeline of ``MGET`` chunks of ``chunk_size`` keys.

Blob format
-----------
A blob is an 8-byte header followed by the ``F`` values, little-endian, in the storage dtype::

    b"gf" | format version (1 byte, = 1) | dtype code (1 byte: 1 = float32, 2 = float16) | F (uint32 LE)

Every read checks each blob's length (``8 + F * itemsize``), its header (so a float16 blob read as
float32, or a blob of another width, is caught even when the lengths happen to agree) and that
all values are finite. Anything else is :class:`~serve.features.base.FeatureCorrupt` and the
batch is refused, never answered with those numbers.

Metadata hash fields: ``format``, ``fingerprint``, ``version``, ``state`` (``loading`` until the
loader has verified every row, then ``live``), ``dtype``, ``num_nodes``, ``num_features``,
``shards``, ``chunk_size``, ``chunks_total``, ``next_chunk`` (progress marker), ``count`` (rows
written and verified), ``checksum`` (see :mod:`serve.features.loader`), ``feature_fingerprint``,
``dataset_fingerprint``, ``dataset_name``, ``created_at``, ``live_at``, ``key_format``. The store
only opens a version whose state is ``live``.

Which version a server opens, and pinning: without an explicit version the server opens the
newest live version loaded from the model's dataset (``dataset_fingerprint``), not blindly the
``current`` pointer, which may name another dataset's features. The opened version is pinned by
number *and* content: its ``checksum`` is read at open time and re-read (``HGET``) in the same
round trip as every fetch, and every few seconds in the background (:class:`VersionPin`). A
version deleted and re-loaded under the pinned number (``checksum`` empty while it loads, then
another one) raises :class:`~serve.features.base.DataVersionChanged`: the server never mixes rows
of two contents. Responses echo ``features:v<version>:<checksum>``.

URLs, connections, retries, neutral errors, the versioned key schema, version resolution, the
load protocol and the pin are the Redis layer's (:mod:`serve.redisdata`), shared with the graph
store and the update log: see :mod:`serve.redisdata.connection` for the URL forms. Their names
(``connect``, ``parse_redis_url``, ``redis_errors``, ``VersionPin``...) stay importable from here. Errors are
:class:`~serve.features.base.FeatureUnavailable` (Redis down after the bounded retries; the pool
reconnects by itself), :class:`~serve.features.base.FeatureCorrupt` (never retried) and
:class:`~serve.features.base.FeatureNotFound`.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry

from ..redisdata.bulk import DEFAULT_CHUNK, fetch_blobs, fetch_blobs_checked, write_blobs
from ..redisdata.connection import RedisTarget, TransientRetry, connect, mask_url, parse_redis_url
from ..redisdata.errors import FEATURE_ERRORS, redis_errors
from ..redisdata.versions import (
    DEFAULT_SHARDS,
    DIGEST_UNREACHABLE,
    DataKind,
    NodeKeys,
    PinnedVersion,
    VersionKeys,
    VersionPin,
    check_live,
    decode_str,
    read_meta,
)
from .base import (
    FeatureCorrupt,
    FeatureNotFound,
    FeatureStore,
    FeatureStoreError,
    FeatureUnavailable,
    summarize_ids,
)

# the layer's names (connect, redis_errors, VersionPin...) stay importable from here, as before serve.redisdata
__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_SHARDS",
    "DIGEST_UNREACHABLE",
    "FEATURES",
    "KEY_PREFIX",
    "META_FORMAT",
    "BlobCodec",
    "FeatureKeys",
    "RedisFeatureStore",
    "RedisTarget",
    "TransientRetry",
    "VersionPin",
    "connect",
    "fetch_blobs",
    "fetch_blobs_checked",
    "mask_url",
    "parse_redis_url",
    "read_meta",
    "redis_errors",
    "resolve_version",
    "write_blobs",
]

log = logging.getLogger(__name__)

KEY_PREFIX = "gnnserve:feat"
META_FORMAT = "gnnserve.features/1"
FEATURES = DataKind(label="features", noun="feature", data="features", prefix=KEY_PREFIX, cli="gnnserve features",
                    errors=FEATURE_ERRORS)


# =========================================================================== key schema
class FeatureKeys(VersionKeys, NodeKeys):
    """Key names of one feature version (see the module docstring for the schema): the version's
    keys (:class:`~serve.redisdata.versions.VersionKeys`) plus ``chunks`` and ``lock``, and the node
    keys of its one part, the feature blobs (:class:`~serve.redisdata.versions.NodeKeys`)."""

    kind = FEATURES

    def __init__(self, fingerprint: str, version: int, shards: int = DEFAULT_SHARDS) -> None:
        VersionKeys.__init__(self, fingerprint, version, shards)
        NodeKeys.__init__(self, self.base, self.shards)
        self.chunks = f"{self.base}:chunks"
        self.lock = f"{self.base}:lock"

    def node_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for every node key of this version (for maintenance only)."""
        return f"{self.base}:{{*}}:*"


#: the version to open when none is given (see :meth:`VersionKeys.resolve_version`)
resolve_version = FeatureKeys.resolve_version


# =========================================================================== blob codec
_DTYPE_CODES = {np.dtype(np.float32): 1, np.dtype(np.float16): 2}
_HEADER = struct.Struct("<2sBBI")
_MAGIC = b"gf"
_BLOB_VERSION = 1


class BlobCodec:
    """Encode rows to blobs and decode (with every check) blobs back to float32 rows."""

    def __init__(self, dtype: Any, num_features: int) -> None:
        dt = np.dtype(dtype)
        if dt not in _DTYPE_CODES:
            raise ValueError(f"feature encoding must be float32 or float16, got {dt}")
        if not 1 <= int(num_features) < 2**32:
            raise ValueError(f"num_features must be positive, got {num_features}")
        self.dtype = dt
        self.num_features = int(num_features)
        self.header = _HEADER.pack(_MAGIC, _BLOB_VERSION, _DTYPE_CODES[dt], self.num_features)
        self.header_u64 = np.frombuffer(self.header, dtype="<u8")[0]
        self.blob_size = _HEADER.size + self.num_features * dt.itemsize
        self._record = np.dtype([("h", "<u8"), ("x", dt.newbyteorder("<"), (self.num_features,))])
        assert self._record.itemsize == self.blob_size

    def encode(self, rows: np.ndarray) -> bytes:
        """Rows ``[n, F]`` as one buffer of ``n`` consecutive blobs (see :meth:`split`).

        Raises:
            ValueError: wrong width, NaN/inf, or values that overflow float16.
        """
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.num_features:
            raise ValueError(f"rows must have shape [n, {self.num_features}], got {rows.shape}")
        rec = np.empty(rows.shape[0], dtype=self._record)
        rec["h"] = self.header_u64
        with np.errstate(over="ignore"):  # float16 overflow becomes inf and is refused just below
            rec["x"] = rows
        if not bool(np.isfinite(rec["x"]).all()):
            bad = np.flatnonzero(~np.isfinite(rec["x"]).all(axis=1))
            why = "overflow float16" if self.dtype == np.float16 and np.isfinite(rows[bad]).all() else "are NaN/inf"
            raise ValueError(f"feature values of {len(bad)} rows {why} (first rows: {bad[:5].tolist()})")
        return rec.tobytes()

    def split(self, buf: bytes) -> list[bytes]:
        """Cut a buffer from :meth:`encode` into its blobs."""
        b = self.blob_size
        return [buf[i : i + b] for i in range(0, len(buf), b)]

    def encode_blobs(self, rows: np.ndarray) -> list[bytes]:
        return self.split(self.encode(rows))

    def classify(self, values: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
        """``(missing, corrupt)`` boolean masks over ``values`` without raising (for verification).

        Corrupt = wrong length, wrong header, or any NaN/inf value.
        """
        n = len(values)
        missing = np.fromiter((v is None for v in values), dtype=bool, count=n)
        lens = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=n)
        corrupt = ~missing & (lens != self.blob_size)
        good = ~missing & ~corrupt
        if good.any():
            idx = np.flatnonzero(good)
            rec = np.frombuffer(b"".join(values[i] for i in idx.tolist()), dtype=self._record)  # type: ignore[misc]
            bad = rec["h"] != self.header_u64
            bad |= ~np.isfinite(rec["x"].astype(np.float32)).all(axis=1)
            corrupt[idx[bad]] = True
        return missing, corrupt

    def decode(self, values: Sequence[bytes | None], ids: np.ndarray, *, where: str = "") -> np.ndarray:
        """Check and decode blobs of ``ids`` (in order) to float32 ``[n, F]``.

        Raises:
            FeatureCorrupt: any blob of the wrong length or header, or with NaN/inf.
            FeatureNotFound: some keys were missing (and nothing was corrupt).
        """
        n = len(values)
        missing_idx: np.ndarray | None = None
        vals: Sequence[bytes | None] = values
        if None in values:
            missing_mask = np.fromiter((v is None for v in values), dtype=bool, count=n)
            missing_idx = np.flatnonzero(missing_mask)
            vals = [v for v in values if v is not None]
            present_ids = ids[~missing_mask]
        else:
            present_ids = ids
        size = self.blob_size
        if vals and set(map(len, vals)) != {size}:
            lens = np.fromiter(map(len, vals), dtype=np.int64, count=len(vals))
            bad = present_ids[lens != size]
            got = sorted(set(lens[lens != size].tolist()))[:5]
            raise FeatureCorrupt(
                f"{len(bad)} feature blobs{where} have the wrong length (expected {size} bytes = header + "
                f"{self.num_features} x {self.dtype.name}, got {got}): nodes {summarize_ids(bad)}",
                node_ids=bad[:256], num_bad=len(bad),
            )
        rec = np.frombuffer(b"".join(vals), dtype=self._record) if vals else np.zeros(0, dtype=self._record)
        hdr_bad = rec["h"] != self.header_u64
        if hdr_bad.any():
            bad = present_ids[hdr_bad]
            first = rec["h"][hdr_bad][0].tobytes()
            raise FeatureCorrupt(
                f"{len(bad)} feature blobs{where} have a wrong header ({_describe_header(first)}; expected "
                f"{self.dtype.name} x {self.num_features}): nodes {summarize_ids(bad)}",
                node_ids=bad[:256], num_bad=len(bad),
            )
        x = rec["x"]
        out = x.astype(np.float32) if len(rec) else np.zeros((0, self.num_features), dtype=np.float32)
        if not bool(np.isfinite(out).all()):
            bad = present_ids[~np.isfinite(out).all(axis=1)]
            raise FeatureCorrupt(
                f"{len(bad)} feature blobs{where} hold NaN or infinite values: nodes {summarize_ids(bad)}",
                node_ids=bad[:256], num_bad=len(bad),
            )
        if missing_idx is not None and len(missing_idx):
            miss = ids[missing_idx]
            raise FeatureNotFound(
                f"{len(miss)} of {n} feature keys{where} are missing: nodes {summarize_ids(miss)}",
                node_ids=miss[:256], num_missing=len(miss),
            )
        return out


def _describe_header(h: bytes) -> str:
    try:
        magic, ver, code, f = _HEADER.unpack(h)
    except struct.error:
        return "unreadable"
    if magic != _MAGIC:
        return f"not a gnnserve blob (starts with {h[:2]!r})"
    names = {v: k.name for k, v in _DTYPE_CODES.items()}
    return f"format {ver}, {names.get(code, f'dtype code {code}')} x {f}"


# =========================================================================== the store
class RedisFeatureStore(PinnedVersion, FeatureStore):
    """Features of one live version in Redis (standalone, TLS, unix socket or Cluster).

    Args:
        url: any URL form of the module docstring (the password is taken from it, never logged).
        fingerprint: the graph fingerprint the features were loaded under.
        version: feature version; ``None`` picks the ``current`` pointer (or, with
            ``expect_dataset_fingerprint``, the newest live version loaded from that dataset).
        expect_num_nodes, expect_num_features: refuse to open a version of another shape.
        expect_dataset_fingerprint: refuse a version loaded from other data (the checkpoint's
            dataset fingerprint).
        chunk_size: keys per ``MGET``.
        socket_timeout, connect_timeout, retries, backoff_base, backoff_cap, max_connections:
            see :func:`connect` (the URL query can override them).
        name, registry: label and Prometheus registry (see :class:`FeatureStore`).
        client: an existing redis-py client to use instead of connecting from ``url`` (``url``
            still names it in messages); it is not closed by :meth:`close`.
        watch_interval: seconds between background checks of the pinned version's digest
            (0 = only on fetches); see :class:`VersionPin`.

    The version is pinned by number and content: its ``checksum`` (the load's digest) is read at
    open time, every fetch re-reads it in the same round trip, and a different (or missing)
    digest raises :class:`~serve.features.base.DataVersionChanged` instead of returning rows of
    other content. :attr:`data_version` (``features:v<N>:<checksum>``) is what responses echo.

    Raises (from the constructor):
        FeatureUnavailable: Redis cannot be reached.
        FeatureNotFound: no such version, it is not live, or its shape/dataset does not match.
        FeatureCorrupt: the metadata is unreadable.
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        fingerprint: str,
        version: int | None = None,
        *,
        expect_num_nodes: int | None = None,
        expect_num_features: int | None = None,
        expect_dataset_fingerprint: str | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        socket_timeout: float = 1.0,
        connect_timeout: float = 0.5,
        retries: int = 2,
        backoff_base: float = 0.02,
        backoff_cap: float = 0.5,
        max_connections: int = 64,
        name: str | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        client: Any = None,
        watch_interval: float = 5.0,
    ) -> None:
        super().__init__(name=name, registry=registry)
        self._pin: VersionPin | None = None
        self._target = parse_redis_url(url)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self._chunk = int(chunk_size)
        self._owns_client = client is None
        self._client = client if client is not None else connect(
            self._target, socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries,
            backoff_base=backoff_base, backoff_cap=backoff_cap, max_connections=max_connections,
        )
        self._fingerprint = fingerprint
        FeatureKeys(fingerprint, 1)  # validates the fingerprint before any round trip
        try:
            if version is None:
                version = resolve_version(self._client, self._target, fingerprint, expect_dataset_fingerprint)
            self._keys = FeatureKeys(fingerprint, version)
            meta = read_meta(self._client, self._target, self._keys)
            self._apply_meta(meta, expect_num_nodes, expect_num_features, expect_dataset_fingerprint)
            self._pin = VersionPin.open(self._client, self._target, self._keys, meta,
                                        interval=watch_interval if self._owns_client else 0.0)
        except BaseException:
            self.close()
            raise
        self._roundtrip_bytes = 0
        log.info("feature store %s: %s graph %s v%d (N=%d, F=%d, %s, %s), pinned to digest %s", self.name,
                 self._target.masked, fingerprint, self._keys.version, self._n, self._f, self._codec.dtype.name,
                 "cluster" if self._target.cluster else self._target.scheme, self._pin.digest)

    def _apply_meta(self, meta: dict[str, str], expect_n: int | None, expect_f: int | None,
                    expect_ds: str | None) -> None:
        keys = self._keys
        where = keys.where(self._target)
        check_live(meta, keys, self._target, fmt=META_FORMAT, expect_dataset_fingerprint=expect_ds)
        try:
            n, f, shards = int(meta["num_nodes"]), int(meta["num_features"]), int(meta["shards"])
            dtype = np.dtype(meta["dtype"])
        except (KeyError, ValueError, TypeError) as exc:
            raise FeatureCorrupt(f"feature metadata of {where} is incomplete ({exc})") from None
        if expect_n is not None and n != expect_n:
            raise FeatureNotFound(f"features of {where} cover {n} nodes, the graph has {expect_n}")
        if expect_f is not None and f != expect_f:
            raise FeatureNotFound(f"features of {where} have width {f}, the model needs {expect_f}")
        self._keys = FeatureKeys(keys.fingerprint, keys.version, shards)
        self._codec = BlobCodec(dtype, f)
        self._n, self._f = n, f
        self._meta = meta

    # ---------------------------------------------------------------- shape
    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def num_features(self) -> int:
        return self._f

    @property
    def dtype(self) -> np.dtype:
        return self._codec.dtype

    @property
    def version(self) -> int:
        return self._keys.version

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def url(self) -> str:
        """The masked URL (safe to log)."""
        return self._target.masked

    @property
    def keys(self) -> FeatureKeys:
        return self._keys

    @property
    def metadata(self) -> dict[str, str]:
        """The version's metadata as read when the store was opened (or last :meth:`refresh`)."""
        return dict(self._meta)

    @property
    def client(self) -> Any:
        """The redis-py client (shared connection pool)."""
        return self._client

    # ---------------------------------------------------------------- reads
    def _fetch_unique(self, ids: np.ndarray) -> np.ndarray:
        with redis_errors(self._target, f"fetching {len(ids)} feature rows"):
            values, found = fetch_blobs_checked(self._client, self._keys, ids, self._keys.meta,
                                                cluster=self._target.cluster, chunk_size=self._chunk)
        assert self._pin is not None
        self._pin.check(found)  # before decoding: rows of other content are never returned
        try:
            return self._codec.decode(values, ids)
        except FeatureNotFound as exc:
            self._check_missing_types(exc.node_ids[:3])
            raise FeatureNotFound(f"{exc}{self._explain_missing()}", exc.node_ids, exc.num_missing) from None

    def _check_missing_types(self, ids: np.ndarray) -> None:
        """``MGET`` answers nil for keys of another Redis type: tell those apart from missing keys."""
        try:
            with redis_errors(self._target, "checking missing keys"):
                for node, key in zip(ids.tolist(), self._keys.node_keys(ids), strict=True):
                    kind = decode_str(self._client.type(key))
                    if kind not in ("none", "string"):
                        raise FeatureCorrupt(
                            f"feature key of node {node} at {self._target.masked} holds a Redis {kind}, not a "
                            "string blob (wrong Redis type)", node_ids=np.array([node]), num_bad=1)
        except FeatureUnavailable:
            return

    def _explain_missing(self) -> str:
        """Why keys may be missing: the version's metadata is re-read to tell a lost load apart."""
        try:
            meta = read_meta(self._client, self._target, self._keys)
        except FeatureStoreError:
            return ""
        if not meta:
            return (f" (the metadata of graph {self._fingerprint} v{self.version} is gone too: Redis lost its "
                    "data, e.g. a restart without persistence or a flush; reload with `gnnserve features load`)")
        if meta.get("state") != "live":
            return f" (version {self.version} is now in state {meta.get('state')!r}: a reload is under way)"
        return " (the version is still marked live: keys were evicted or deleted; check maxmemory-policy)"

    def refresh(self) -> dict[str, str]:
        """Re-read the metadata and check it still describes a live version of the same shape."""
        meta = read_meta(self._client, self._target, self._keys)
        self._apply_meta(meta, self._n, self._f, None)
        return dict(meta)

    def ping(self) -> bool:
        """One ``PING`` (on every master for a cluster); False instead of raising."""
        if self._closed:
            return False
        try:
            with redis_errors(self._target, "ping"):
                if self._target.cluster:
                    from redis.cluster import RedisCluster

                    return bool(self._client.ping(target_nodes=RedisCluster.PRIMARIES))
                return bool(self._client.ping())
        except FeatureStoreError:
            return False

    def close(self) -> None:
        if self._pin is not None:
            self._pin.stop()
        if not self._closed and self._owns_client and getattr(self, "_client", None) is not None:
            try:
                self._client.close()
            except Exception:  # closing a broken connection must not raise
                log.debug("closing the Redis client of %s failed", self.name, exc_info=False)
        super().close()

    def stats(self) -> dict[str, Any]:
        from redis.utils import HIREDIS_AVAILABLE

        s = super().stats()
        s.update({
            "url": self._target.masked,
            "fingerprint": self._fingerprint,
            "version": self.version,
            "digest": self.digest,
            "cluster": self._target.cluster,
            "shards": self._keys.shards,
            "chunk_size": self._chunk,
            "blob_bytes": self._codec.blob_size,
            "hiredis": bool(HIREDIS_AVAILABLE),
        })
        return s

    def __repr__(self) -> str:
        return (f"RedisFeatureStore(url={self._target.masked!r}, fingerprint={self._fingerprint!r}, "
                f"version={getattr(self, '_keys', None) and self._keys.version}, "
                f"N={getattr(self, '_n', '?')}, F={getattr(self, '_f', '?')})")
