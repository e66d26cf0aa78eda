"""Node features in Redis (standalone or Cluster): key schema, blob format, URLs, and the store.

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

URLs
----
* ``redis://[[user]:password@]host[:port][/db][?option=value...]``: TCP.
* ``rediss://...``: TLS (redis-py's ``ssl_*`` query options: ``ssl_ca_certs``, ``ssl_certfile``,
  ``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname``...).
* ``unix://[[user]:password@]/path/to/redis.sock[?db=N]``: a unix socket.
* ``redis+cluster://[[user]:password@]host:port[,host:port...][?option=value...]`` and
  ``rediss+cluster://...`` (TLS): Redis Cluster, any number of seed nodes; ``redis://...?cluster=1``
  (or ``true``/``yes``) is accepted as a synonym.

Options in the query string are redis-py's (``socket_timeout``, ``socket_connect_timeout``,
``max_connections``, ``health_check_interval``, ...) and override the store's defaults. Passwords
come only from the URL and are never logged: logs, ``repr`` and error messages use
:func:`mask_url` and scrub the password out of any text that passes through them.

Failure handling: transient errors (connection refused or reset, timeouts, a server still
loading, cluster failover) are retried by redis-py's ``Retry`` with ``ExponentialBackoff`` a
bounded number of times, with short socket timeouts, then raised as
:class:`~serve.features.base.FeatureUnavailable`. The connection pool reconnects by itself once
Redis is back: the store never needs to be recreated. Corrupt blobs are never retried.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit, urlunsplit

import numpy as np
import redis
import redis.exceptions as rex
from prometheus_client import REGISTRY, CollectorRegistry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .base import (
    DataVersionChanged,
    FeatureCorrupt,
    FeatureNotFound,
    FeatureStore,
    FeatureStoreError,
    FeatureUnavailable,
    summarize_ids,
)

__all__ = [
    "DEFAULT_SHARDS",
    "KEY_PREFIX",
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
DEFAULT_SHARDS = 256
DEFAULT_CHUNK = 1024

_FP_RE = re.compile(r"^[0-9A-Za-z_.-]{1,128}$")
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_TRUE = {"1", "true", "yes", "on"}


# =========================================================================== URLs
@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL. ``masked`` is safe to log; ``url`` and ``password`` are not.

    Attributes:
        url: the URL as given (contains the password: never log it).
        scheme: ``redis``, ``rediss`` or ``unix`` (cluster URLs report the underlying scheme).
        cluster: True for Redis Cluster.
        tls: True for ``rediss``.
        nodes: ``[(host, port)]`` seed nodes (TCP), empty for unix sockets.
        path: socket path for ``unix://``.
        username, password: credentials from the URL (``None`` when absent).
        options: query options left for redis-py (strings), without ``cluster``.
        masked: the URL with the password replaced by ``***``.
    """

    url: str = field(repr=False)
    scheme: str
    cluster: bool
    tls: bool
    nodes: tuple[tuple[str, int], ...]
    path: str | None
    username: str | None
    password: str | None = field(repr=False)
    options: dict[str, str]
    masked: str

    def secrets(self) -> list[str]:
        """Strings that must never appear in logs or errors (password, raw and URL-quoted)."""
        if not self.password:
            return []
        return sorted({self.password, quote(self.password, safe=""), quote(self.password)}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        """``text`` with every occurrence of the password (and the raw URL) replaced."""
        out = text.replace(self.url, self.masked) if self.url else text
        for s in self.secrets():
            if s:
                out = out.replace(s, "***")
        return out


def mask_url(url: str) -> str:
    """The URL with its password (and any ``password``-like query option) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable redis url>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, sep, _pw = userinfo.partition(":")
        # "user:pw@host" keeps the user; a lone "secret@host" is the password for redis-py
        netloc = f"{user}:***@{hosts}" if sep else f"***@{hosts}"
    query = parts.query
    if query:
        q = parse_qs(query, keep_blank_values=True)
        for k in list(q):
            if "pass" in k.lower() or "secret" in k.lower() or "token" in k.lower():
                q[k] = ["***"]
        query = urlencode({k: v[0] for k, v in q.items()}, safe="*/:")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _split_hostport(item: str, default_port: int = 6379) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [ipv6]:port
        host, _, rest = item[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:] else default_port
        return host, port
    host, sep, port_s = item.rpartition(":")
    if not sep:
        return item, default_port
    try:
        return host, int(port_s)
    except ValueError as exc:
        raise ValueError(f"bad port {port_s!r} in redis url") from exc


def parse_redis_url(url: str) -> RedisTarget:
    """Parse any URL form the stores accept (see the module docstring).

    Raises:
        ValueError: unknown scheme or malformed URL (the message holds the masked URL only).
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError("a Redis URL looks like redis://host:port/0, rediss://, unix:///path or redis+cluster://")
    masked = mask_url(url)
    scheme_raw, _, rest = url.partition("://")
    scheme_raw = scheme_raw.lower()
    cluster = scheme_raw in _CLUSTER_SCHEMES
    scheme = _CLUSTER_SCHEMES.get(scheme_raw, scheme_raw)
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"unsupported Redis URL scheme {scheme_raw!r} in {masked}: use redis://, rediss://, "
                         "unix://, redis+cluster:// or rediss+cluster://")
    netloc_path, _, query = rest.partition("?")
    options = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items() if v}
    q_user, q_password = options.pop("username", None), options.pop("password", None)
    flag = options.pop("cluster", None)
    if flag is not None:
        cluster = cluster or flag.lower() in _TRUE
    if scheme == "unix":
        if cluster:
            raise ValueError(f"Redis Cluster needs TCP seed nodes, not a unix socket: {masked}")
        netloc, _, path = netloc_path.partition("/")
        path = "/" + path
        hosts = ""
    else:
        netloc, _, path = netloc_path.partition("/")
        path = "/" + path if path else ""
    userinfo, at, hosts_part = netloc.rpartition("@")
    if not at:
        hosts_part, userinfo = netloc, ""
    username = password = None
    if userinfo:
        user, sep, pw = userinfo.partition(":")
        if sep:
            username = unquote(user) or None
            password = unquote(pw) or None
        else:  # "redis://secret@host": redis-py treats a lone userinfo as the password
            password = unquote(user) or None
    username = username or q_user or None
    password = password or q_password or None
    nodes: tuple[tuple[str, int], ...] = ()
    if scheme == "unix":
        if not path or path == "/":
            raise ValueError(f"unix socket URL without a path: {masked}")
        hosts = hosts_part
        if hosts:
            raise ValueError(f"unix socket URL must look like unix:///path/to/sock: {masked}")
        sock_path: str | None = unquote(path)
    else:
        sock_path = None
        items = [h for h in hosts_part.split(",") if h.strip()] or ["localhost"]
        if len(items) > 1 and not cluster:
            raise ValueError(f"several hosts are only meaningful for Redis Cluster: {masked}")
        nodes = tuple(_split_hostport(unquote(h)) for h in items)
        db = path.strip("/")
        if db:
            if not db.isdigit():
                raise ValueError(f"the path of a Redis URL is the database number, got {db!r}: {masked}")
            if cluster and db != "0":
                raise ValueError(f"Redis Cluster has only database 0: {masked}")
            options.setdefault("db", db)
    return RedisTarget(
        url=url, scheme=scheme, cluster=cluster, tls=scheme == "rediss", nodes=nodes, path=sock_path,
        username=username, password=password, options=options, masked=masked,
    )


def _typed_options(options: dict[str, str]) -> dict[str, Any]:
    """Convert query strings with redis-py's own parsers (``socket_timeout=0.5`` -> 0.5)."""
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    out: dict[str, Any] = {}
    for k, v in options.items():
        parser = URL_QUERY_ARGUMENT_PARSERS.get(k)
        try:
            out[k] = parser(v) if parser else v
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid value for {k!r} in the Redis URL") from exc
    return out


class _NotTransient(Exception):
    """Carries an error that must not be retried through redis-py's retry loop."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(str(inner))
        self.inner = inner


class TransientRetry(Retry):
    """redis-py ``Retry`` that retries connection errors and timeouts but not refused credentials.

    redis-py's ``AuthenticationError``/``AuthorizationError`` subclass ``ConnectionError``, so a
    plain ``Retry`` would retry a wrong password with backoff; they are raised at once here.
    """

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        def guarded() -> Any:
            try:
                return do()
            except (rex.AuthenticationError, rex.AuthorizationError) as exc:
                raise _NotTransient(exc) from exc

        try:
            return super().call_with_retry(guarded, fail, *args, **kwargs)
        except _NotTransient as wrapped:
            raise wrapped.inner from None


def connect(
    url: str | RedisTarget,
    *,
    socket_timeout: float = 1.0,
    connect_timeout: float = 0.5,
    retries: int = 2,
    backoff_base: float = 0.02,
    backoff_cap: float = 0.5,
    max_connections: int = 64,
    health_check_interval: int = 0,
) -> redis.Redis | redis.RedisCluster:
    """A redis-py client (hiredis parser when installed) for any accepted URL.

    Standalone: a :class:`redis.BlockingConnectionPool` of at most ``max_connections`` (a caller
    waits up to ``socket_timeout`` for a free connection). Every connection retries
    ``ConnectionError``/``TimeoutError`` ``retries`` times with exponential backoff
    (``backoff_base * 2**k`` capped at ``backoff_cap``); other errors, refused credentials
    included (:class:`TransientRetry`), are not retried. Cluster: a
    :class:`redis.RedisCluster` with the same timeouts, the same retry policy on its cluster-level
    retry loop (it refreshes the slot map after a failure), and ``require_full_coverage=False`` so
    that one master down fails only the keys it owns. Options in the URL query win over the keyword
    arguments. No command is sent here (a cluster client does fetch the slot map).
    """
    target = url if isinstance(url, RedisTarget) else parse_redis_url(url)
    opts = _typed_options(target.options)
    retry = TransientRetry(ExponentialBackoff(cap=backoff_cap, base=backoff_base), retries)
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "health_check_interval": health_check_interval,
        "retry": retry,
        "username": target.username,
        "password": target.password,
    }
    if target.cluster:
        from redis.cluster import ClusterNode, RedisCluster

        kwargs = {**common, **opts}
        kwargs.pop("db", None)
        kwargs.setdefault("max_connections", max_connections)
        if target.tls:
            kwargs["ssl"] = True
        try:
            return RedisCluster(
                startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
                require_full_coverage=False,
                **kwargs,
            )
        except (rex.RedisError, rex.RedisClusterException, OSError) as exc:
            raise FeatureUnavailable(target.scrub(f"cannot reach Redis Cluster at {target.masked}: {exc}")) from None
    pool_kwargs: dict[str, Any] = {**common, "max_connections": max_connections, "timeout": socket_timeout}
    if target.scheme == "unix":
        pool_kwargs["connection_class"] = redis.UnixDomainSocketConnection
        pool_kwargs["path"] = target.path
    else:
        host, port = target.nodes[0]
        pool_kwargs["host"], pool_kwargs["port"] = host, port
        if target.tls:
            pool_kwargs["connection_class"] = redis.SSLConnection
    pool_kwargs.update(opts)
    if "db" in pool_kwargs:
        pool_kwargs["db"] = int(pool_kwargs["db"])
    pool = redis.BlockingConnectionPool(**pool_kwargs)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # close() of the client closes this private pool
    return client


# =========================================================================== errors
@contextmanager
def redis_errors(target: RedisTarget, what: str) -> Iterator[None]:
    """Translate redis-py exceptions raised inside the block into the store's error classes.

    Connection problems, timeouts, a server still loading its data, cluster failover and
    authentication failures become :class:`FeatureUnavailable`; ``WRONGTYPE`` (a feature key
    holding a non-string) becomes :class:`FeatureCorrupt`. Messages name the masked URL and never
    the password. The original exception is not chained (its text could hold connection details).
    """
    try:
        yield
    except FeatureStoreError:
        raise
    except (rex.AuthenticationError, rex.AuthorizationError, rex.NoPermissionError) as exc:
        raise FeatureUnavailable(target.scrub(f"{what}: Redis at {target.masked} refused the credentials "
                                              f"({type(exc).__name__}: {exc})")) from None
    except rex.ResponseError as exc:
        msg = str(exc)
        if msg.startswith(("NOAUTH", "WRONGPASS")):
            raise FeatureUnavailable(target.scrub(f"{what}: Redis at {target.masked} needs valid credentials "
                                                  f"({msg})")) from None
        if msg.startswith("WRONGTYPE"):
            raise FeatureCorrupt(target.scrub(f"{what}: a key at {target.masked} holds the wrong Redis type "
                                              f"({msg})")) from None
        if isinstance(exc, (rex.ClusterDownError, rex.TryAgainError, rex.ReadOnlyError, rex.BusyLoadingError)) \
                or msg.startswith(("LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY")):
            raise FeatureUnavailable(target.scrub(f"{what}: Redis at {target.masked} is not ready "
                                                  f"({type(exc).__name__}: {msg})")) from None
        raise FeatureUnavailable(target.scrub(f"{what}: Redis at {target.masked} answered an error "
                                              f"({type(exc).__name__}: {msg})")) from None
    except (rex.RedisError, rex.RedisClusterException, OSError) as exc:  # socket.timeout is an OSError
        raise FeatureUnavailable(target.scrub(f"{what}: Redis at {target.masked} unavailable "
                                              f"({type(exc).__name__}: {exc})")) from None


# =========================================================================== key schema
class FeatureKeys:
    """Key names of one feature version (see the module docstring for the schema)."""

    def __init__(self, fingerprint: str, version: int, shards: int = DEFAULT_SHARDS) -> None:
        if not isinstance(fingerprint, str) or not _FP_RE.match(fingerprint):
            raise ValueError(f"fingerprint must be 1-128 characters of [0-9A-Za-z_.-], got {fingerprint!r}")
        version = int(version)
        if version < 1:
            raise ValueError(f"feature versions are positive integers, got {version}")
        if not 1 <= int(shards) <= 16384:
            raise ValueError(f"shards must lie in [1, 16384], got {shards}")
        self.fingerprint = fingerprint
        self.version = version
        self.shards = int(shards)
        self.graph_prefix = f"{KEY_PREFIX}:{fingerprint}"
        self.base = f"{self.graph_prefix}:v{version}"
        self.meta = f"{self.base}:meta"
        self.chunks = f"{self.base}:chunks"
        self.lock = f"{self.base}:lock"
        self.current = f"{self.graph_prefix}:current"
        self.versions = f"{self.graph_prefix}:versions"
        self._shard_prefix = [f"{self.base}:{{{s}}}:".encode() for s in range(self.shards)]

    @property
    def key_format(self) -> str:
        return f"{self.base}:{{<node mod {self.shards}>}}:<node>"

    def node_key(self, node: int) -> bytes:
        node = int(node)
        return self._shard_prefix[node % self.shards] + str(node).encode()

    def node_keys(self, ids: np.ndarray | Sequence[int]) -> list[bytes]:
        """Keys of ``ids`` in order (bytes; built without per-key formatting beyond the id)."""
        pf, s = self._shard_prefix, self.shards
        lst = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        return [pf[i % s] + b"%d" % i for i in lst]

    def node_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for every node key of this version (for maintenance only)."""
        return f"{self.base}:{{*}}:*"


def resolve_version(client: Any, target: RedisTarget, fingerprint: str,
                    dataset_fingerprint: str | None = None) -> int:
    """The version to open when none is given: the ``current`` pointer, or with
    ``dataset_fingerprint`` the newest live version loaded from that dataset.

    Raises:
        FeatureNotFound: no live version (matching) exists.
    """
    keys = FeatureKeys(fingerprint, 1)
    with redis_errors(target, "resolving the feature version"):
        if dataset_fingerprint is None:
            cur = client.get(keys.current)
            if cur is None:
                raise FeatureNotFound(
                    f"no live feature version for graph {fingerprint} at {target.masked}: "
                    "load one with `gnnserve features load`"
                )
            return int(cur)
        versions = sorted((int(v) for v in client.smembers(keys.versions)), reverse=True)
        cur = client.get(keys.current)
        for v in versions:
            meta = client.hgetall(FeatureKeys(fingerprint, v).meta)
            m = {_s(k): _s(val) for k, val in meta.items()}
            if m.get("state") == "live" and m.get("dataset_fingerprint") == dataset_fingerprint:
                if cur is not None and int(cur) != v:
                    log.warning("features of graph %s: the current version v%s was not loaded from dataset %s "
                                "(the model's); using v%d, the newest live version that was", fingerprint,
                                _s(cur), dataset_fingerprint, v)
                return v
    raise FeatureNotFound(
        f"no live feature version of graph {fingerprint} holds dataset {dataset_fingerprint} at {target.masked}"
    )


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def read_meta(client: Any, target: RedisTarget, keys: FeatureKeys) -> dict[str, str]:
    """The metadata hash of a version as ``str -> str`` (empty dict when absent)."""
    with redis_errors(target, "reading feature metadata"):
        raw = client.hgetall(keys.meta)
    return {_s(k): _s(v) for k, v in raw.items()}


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


# =========================================================================== bulk I/O
def _group_by_shard(ids: np.ndarray, shards: int, chunk: int) -> list[np.ndarray]:
    """Positions into ``ids`` grouped by hash-tag shard, each group cut into ``chunk``-sized pieces."""
    shard = ids % shards
    order = np.argsort(shard, kind="stable")
    cuts = np.flatnonzero(np.diff(shard[order])) + 1
    groups: list[np.ndarray] = []
    for g in np.split(order, cuts):
        groups.extend(g[i : i + chunk] for i in range(0, len(g), chunk))
    return groups


def fetch_blobs(client: Any, keys: FeatureKeys, ids: np.ndarray, *, cluster: bool,
                chunk_size: int = DEFAULT_CHUNK) -> list[bytes | None]:
    """Values of the node keys of ``ids`` in order, in as few round trips as possible.

    Standalone: ``MGET`` of ``chunk_size`` keys each, all in one pipeline (one round trip; a single
    chunk skips the pipeline). Cluster: one ``MGET`` per (shard, chunk) through a cluster pipeline,
    which sends each master its commands in one round trip. redis-py errors propagate (wrap the call
    in :func:`redis_errors`).
    """
    n = len(ids)
    if n == 0:
        return []
    key_list = keys.node_keys(ids)
    if not cluster:
        if n <= chunk_size:
            return list(client.mget(key_list))
        pipe = client.pipeline(transaction=False)
        for a in range(0, n, chunk_size):
            pipe.mget(key_list[a : a + chunk_size])
        out: list[bytes | None] = []
        for part in pipe.execute():
            out.extend(part)
        return out
    groups = _group_by_shard(np.asarray(ids), keys.shards, chunk_size)
    pipe = client.pipeline(transaction=False)
    for g in groups:  # ClusterPipeline blocks its mget() method; the raw command is allowed per slot
        pipe.execute_command("MGET", *[key_list[i] for i in g.tolist()])
    replies = pipe.execute()
    values: list[bytes | None] = [None] * n
    for g, part in zip(groups, replies, strict=True):
        for i, v in zip(g.tolist(), part, strict=True):
            values[i] = v
    return values


def write_blobs(client: Any, keys: FeatureKeys, ids: np.ndarray, blobs: Sequence[bytes], *, cluster: bool,
                chunk_size: int = DEFAULT_CHUNK) -> None:
    """``MSET`` the blobs of ``ids`` (pipelined in chunks; per shard on a cluster). Idempotent."""
    if len(ids) != len(blobs):
        raise ValueError(f"{len(ids)} ids but {len(blobs)} blobs")
    if len(ids) == 0:
        return
    key_list = keys.node_keys(ids)
    pipe = client.pipeline(transaction=False)
    if not cluster:
        for a in range(0, len(ids), chunk_size):
            pipe.mset(dict(zip(key_list[a : a + chunk_size], blobs[a : a + chunk_size], strict=True)))
    else:
        for g in _group_by_shard(np.asarray(ids), keys.shards, chunk_size):
            args: list[bytes] = []
            for i in g.tolist():
                args += (key_list[i], blobs[i])
            pipe.execute_command("MSET", *args)
    pipe.execute()



def fetch_blobs_checked(client: Any, keys: Any, ids: np.ndarray, meta_key: str, *, cluster: bool,
                        chunk_size: int = DEFAULT_CHUNK) -> tuple[list[bytes | None], str | None]:
    """:func:`fetch_blobs` plus the version's stored ``checksum`` field, read *after* the blobs in
    the same round trip (standalone: one pipeline; cluster: one more command in the cluster
    pipeline). Returns ``(values, checksum or None when the metadata is gone)``.

    Reading the digest after the rows means: if it still equals the digest pinned at open time,
    the rows were read from that content (a reload under the same number first resets the
    checksum and sets the new one only when it goes live).

    Cluster: the metadata key lives on one master. While that master is unreachable the rows from
    the others are still returned, with :data:`DIGEST_UNREACHABLE` for the digest (no reload can
    start meanwhile: a load writes that key before any row); :meth:`VersionPin.check` then relies
    on the last check.
    """
    n = len(ids)
    key_list = keys.node_keys(ids)
    if not cluster:
        pipe = client.pipeline(transaction=False)
        for a in range(0, n, chunk_size):
            pipe.mget(key_list[a : a + chunk_size])
        pipe.hget(meta_key, "checksum")
        replies = pipe.execute()
        out: list[bytes | None] = []
        for part in replies[:-1]:
            out.extend(part)
        ck = replies[-1]
        return out, (None if ck is None else _s(ck))
    values = fetch_blobs(client, keys, ids, cluster=True, chunk_size=chunk_size) if n else []
    try:
        ck = client.hget(meta_key, "checksum")
    except (rex.ConnectionError, rex.TimeoutError, rex.ClusterDownError, rex.TryAgainError,
            rex.RedisClusterException, OSError) as exc:
        log.debug("the metadata master is unreachable (%s): rows served on the last digest check", type(exc).__name__)
        return values, DIGEST_UNREACHABLE
    return values, (None if ck is None else _s(ck))


#: the digest :func:`fetch_blobs_checked` reports when the metadata's cluster master is unreachable
DIGEST_UNREACHABLE = "\x00unreachable"


class VersionPin:
    """A data version pinned by number *and* content digest (the load's ``checksum``).

    The stores check the digest stored under the pinned number on every fetch from Redis
    (:meth:`check`, on the digest :func:`fetch_blobs_checked` read in the same round trip) and,
    with ``interval > 0``, every ``interval`` seconds from a daemon thread (:meth:`poll`), so a
    version deleted and re-loaded with other content under the same number is noticed even
    when every row a request needs is cached. Once noticed, :attr:`error` holds the
    :class:`DataVersionChanged` to raise (it clears if the pinned content comes back).
    """

    def __init__(self, client: Any, target: RedisTarget, meta_key: str, *, kind: str, version: int,
                 digest: str, interval: float = 0.0) -> None:
        self.client, self.target, self.meta_key = client, target, meta_key
        self.kind, self.version, self.digest = kind, int(version), digest
        self.error: DataVersionChanged | None = None
        self.checks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval > 0:
            self._thread = threading.Thread(target=self._watch, args=(float(interval),),
                                            name=f"gnnserve-pin-{kind}-v{version}", daemon=True)
            self._thread.start()

    @property
    def label(self) -> str:
        """``"<kind>:v<version>:<digest>"``: what a response echoes as its data version."""
        return f"{self.kind}:v{self.version}:{self.digest}"

    def check(self, found: str | None) -> None:
        """Raise :class:`DataVersionChanged` unless ``found`` (the stored digest) is the pinned one.

        ``None`` (no metadata: the version was deleted, or Redis lost its data) passes: a load
        creates the metadata (digest ``""``) before it writes any row, so without metadata no row
        of other content can have been written; missing rows then raise ``FeatureNotFound`` as
        usual, and the same content loaded again (same digest) is served again.
        """
        self.checks += 1
        if found == DIGEST_UNREACHABLE:
            self.raise_if_changed()
            return
        if found is None or found == self.digest:
            self.error = None
            return
        what = "is being re-loaded (state loading)" if found == "" else f"now holds other content (digest {found})"
        err = DataVersionChanged(
            f"{self.kind} version {self.version} pinned at open time with digest {self.digest} {what} at "
            f"{self.target.masked}: refusing to mix data versions; reload the model (or restart the server) to "
            "pick up the data now in Redis", kind=self.kind, version=self.version, pinned=self.digest,
            found=found or "")
        if self.error is None:
            log.error("%s", err)
        self.error = err
        raise err

    def poll(self) -> None:
        """Read the stored digest now and :meth:`check` it (Redis errors propagate as store errors)."""
        with redis_errors(self.target, f"checking the pinned {self.kind} version"):
            ck = self.client.hget(self.meta_key, "checksum")
        self.check(None if ck is None else _s(ck))

    def raise_if_changed(self) -> None:
        """Raise the last :class:`DataVersionChanged` seen, without any I/O."""
        if self.error is not None:
            raise self.error

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.poll()
            except DataVersionChanged:
                continue
            except Exception as exc:  # Redis down: the next fetch reports it; keep watching
                log.debug("pinned %s version check failed: %s", self.kind, exc)

    def stop(self) -> None:
        self._stop.set()


# =========================================================================== the store
class RedisFeatureStore(FeatureStore):
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
            digest = meta.get("checksum", "")
            if not digest:
                raise FeatureCorrupt(f"features of graph {fingerprint} v{self._keys.version} at {self._target.masked} "
                                     "are live but carry no checksum: verify them with `gnnserve features verify`")
            self._pin = VersionPin(self._client, self._target, self._keys.meta, kind="features",
                                   version=self._keys.version, digest=digest,
                                   interval=watch_interval if self._owns_client else 0.0)
        except BaseException:
            self.close()
            raise
        self._roundtrip_bytes = 0
        log.info("feature store %s: %s graph %s v%d (N=%d, F=%d, %s, %s), pinned to digest %s", self.name,
                 self._target.masked, fingerprint, self._keys.version, self._n, self._f, self._codec.dtype.name,
                 "cluster" if self._target.cluster else self._target.scheme, digest)

    def _apply_meta(self, meta: dict[str, str], expect_n: int | None, expect_f: int | None,
                    expect_ds: str | None) -> None:
        keys = self._keys
        where = f"graph {keys.fingerprint} v{keys.version} at {self._target.masked}"
        if not meta:
            raise FeatureNotFound(f"no features for {where}: load them with `gnnserve features load`")
        if meta.get("format") != META_FORMAT:
            raise FeatureCorrupt(f"feature metadata of {where} has format {meta.get('format')!r}, "
                                 f"expected {META_FORMAT!r}")
        if meta.get("state") != "live":
            raise FeatureNotFound(f"features of {where} are not live (state {meta.get('state')!r}): the load "
                                  "was interrupted or has not been verified; rerun `gnnserve features load`")
        try:
            n, f, shards = int(meta["num_nodes"]), int(meta["num_features"]), int(meta["shards"])
            dtype = np.dtype(meta["dtype"])
        except (KeyError, ValueError, TypeError) as exc:
            raise FeatureCorrupt(f"feature metadata of {where} is incomplete ({exc})") from None
        if expect_n is not None and n != expect_n:
            raise FeatureNotFound(f"features of {where} cover {n} nodes, the graph has {expect_n}")
        if expect_f is not None and f != expect_f:
            raise FeatureNotFound(f"features of {where} have width {f}, the model needs {expect_f}")
        if expect_ds is not None and meta.get("dataset_fingerprint") != expect_ds:
            raise FeatureNotFound(f"features of {where} come from dataset {meta.get('dataset_fingerprint')}, "
                                  f"the model was trained on {expect_ds}")
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
    def digest(self) -> str:
        """The content digest (the load's ``checksum``) this store pinned at open time."""
        return self._pin.digest if self._pin is not None else ""

    @property
    def data_version(self) -> str:
        """``features:v<version>:<checksum>``; raises :class:`DataVersionChanged` once a check saw
        the pinned version deleted or replaced."""
        assert self._pin is not None
        self._pin.raise_if_changed()
        return self._pin.label

    def check_version(self) -> None:
        """Read the stored digest now; raises :class:`DataVersionChanged` if it is not the pinned one."""
        assert self._pin is not None
        self._pin.poll()

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
                    kind = _s(self._client.type(key))
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
