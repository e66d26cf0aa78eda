"""Bulk reads and writes of node blobs: pipelined ``MGET``/``MSET``, grouped per hash-tag shard on a cluster.

Standalone: ``MGET``/``MSET`` of ``chunk_size`` keys each, all in one pipeline (one round trip).
Cluster: one command per (shard, chunk) through a cluster pipeline, which sends each master its
commands in one round trip. redis-py errors propagate: wrap the calls in
:func:`serve.redisdata.errors.redis_errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis.exceptions as rex

from .versions import DIGEST_UNREACHABLE, NodeKeys, decode_str

__all__ = ["DEFAULT_CHUNK", "fetch_blobs", "fetch_blobs_checked", "write_blobs"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK = 1024


def _group_by_shard(ids: np.ndarray, shards: int, chunk: int) -> list[np.ndarray]:
    """Positions into ``ids`` grouped by hash-tag shard, each group cut into ``chunk``-sized pieces."""
    shard = ids % shards
    order = np.argsort(shard, kind="stable")
    cuts = np.flatnonzero(np.diff(shard[order])) + 1
    groups: list[np.ndarray] = []
    for g in np.split(order, cuts):
        groups.extend(g[i : i + chunk] for i in range(0, len(g), chunk))
    return groups


def fetch_blobs(client: Any, keys: NodeKeys, ids: np.ndarray, *, cluster: bool,
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


def write_blobs(client: Any, keys: NodeKeys, ids: np.ndarray, blobs: Sequence[bytes], *, cluster: bool,
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


def fetch_blobs_checked(client: Any, keys: NodeKeys, ids: np.ndarray, meta_key: str, *, cluster: bool,
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
        return out, (None if ck is None else decode_str(ck))
    values = fetch_blobs(client, keys, ids, cluster=True, chunk_size=chunk_size) if n else []
    try:
        ck = client.hget(meta_key, "checksum")
    except (rex.ConnectionError, rex.TimeoutError, rex.ClusterDownError, rex.TryAgainError,
            rex.RedisClusterException, OSError) as exc:
        log.debug("the metadata master is unreachable (%s): rows served on the last digest check", type(exc).__name__)
        return values, DIGEST_UNREACHABLE
    return values, (None if ck is None else decode_str(ck))

