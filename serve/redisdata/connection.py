"""Redis URLs and connections with bounded retries (every store and the update log use these).

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
``max_connections``, ``health_check_interval``, ...) and override the caller's defaults. Passwords
come only from the URL and are never logged: logs, ``repr`` and error messages use
:func:`mask_url` and scrub the password out of any text that passes through them
(:meth:`RedisTarget.scrub`, :func:`serve.redisdata.errors.redis_errors`).

Failure handling: transient errors (connection refused or reset, timeouts, a server still
loading, cluster failover) are retried by redis-py's ``Retry`` with ``ExponentialBackoff`` a
bounded number of times, with short socket timeouts, then raised as the caller's ``unavailable``
error (:mod:`serve.redisdata.errors`). The connection pool reconnects by itself once Redis is
back: a store never needs to be recreated. Corrupt data is never retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
import redis.exceptions as rex
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .errors import FEATURE_ERRORS, ErrorFamily

__all__ = ["RedisTarget", "TransientRetry", "connect", "mask_url", "parse_redis_url"]

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_TRUE = {"1", "true", "yes", "on"}


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
    errors: ErrorFamily = FEATURE_ERRORS,
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
    arguments. No command is sent here (a cluster client does fetch the slot map: a cluster that
    cannot be reached raises ``errors.unavailable``).
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
            raise errors.unavailable(target.scrub(f"cannot reach Redis Cluster at {target.masked}: {exc}")) from None
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

