"""The load protocol every loader follows: start a version, write -> read back -> digest each chunk, go live.

1. :func:`start_version`: the metadata hash is written in state ``loading`` with an empty
   ``checksum`` *before any blob* (a server pinned to an older load under the same number sees the
   digest change and refuses to mix), and the version joins the ``versions`` set.
2. :func:`write_verified`, per chunk of consecutive nodes: pipelined ``MSET`` of the blobs, read
   back with ``MGET``, compared byte for byte (the kind's ``corrupt`` error names the nodes that
   differ), and the chunk's BLAKE2b-128 digest (:func:`chunk_digest`) of what Redis returned.
   :func:`read_back` is the same read and comparison without the write (re-runs, verification).
3. :func:`go_live`: once every chunk matched, the metadata turns ``live`` with the version's
   ``checksum`` (:func:`version_checksum` over the chunk digests, the loader's own prefix or
   personalisation) and ``live_at``, and the ``current`` pointer moves to the version, only forward
   (:data:`SET_CURRENT`).

What a loader adds on top (the features' lock and resumable progress, the graph's comparison of a
live version) stays in :mod:`serve.features.loader` and :mod:`serve.graph.loader`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..features.base import summarize_ids
from .bulk import DEFAULT_CHUNK, fetch_blobs, write_blobs
from .connection import RedisTarget
from .errors import redis_errors
from .versions import NodeKeys, VersionKeys

__all__ = [
    "SET_CURRENT",
    "chunk_digest",
    "go_live",
    "now",
    "read_back",
    "start_version",
    "version_checksum",
    "write_verified",
]

#: Moves the ``current`` pointer forward only (KEYS[1] = pointer, ARGV[1] = version).
SET_CURRENT = """
local cur = tonumber(redis.call('GET', KEYS[1]))
local v = tonumber(ARGV[1])
if (not cur) or cur < v then redis.call('SET', KEYS[1], ARGV[1]) return v end
return cur
"""


def now() -> str:
    """The UTC time as the metadata records it (``created_at``, ``live_at``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def chunk_digest(blobs: Iterable[bytes | None]) -> bytes:
    """BLAKE2b-128 over the blobs of a chunk in order (missing ones, ``None``, are skipped)."""
    h = hashlib.blake2b(digest_size=16)
    for b in blobs:
        if b is not None:
            h.update(b)
    return h.digest()


def version_checksum(digests: Iterable[bytes], *, prefix: bytes = b"", person: bytes = b"") -> str:
    """A version's ``checksum``: BLAKE2b-128 (personalised by ``person``) over ``prefix`` and the
    chunk digests in order, as hex."""
    h = hashlib.blake2b(digest_size=16, person=person)
    h.update(prefix)
    for d in digests:
        h.update(d)
    return h.hexdigest()


def start_version(client: Any, target: RedisTarget, keys: VersionKeys, meta: Mapping[str, Any], *,
                  reset: Sequence[str] = ()) -> dict[str, Any]:
    """Step 1: delete the ``reset`` keys, write ``meta`` in state ``loading`` with an empty
    ``checksum``, add the version to the ``versions`` set (one pipeline). Returns what was written."""
    full = {**meta, "state": "loading", "checksum": ""}
    with redis_errors(target, f"starting the {keys.kind.noun} load", keys.kind.errors):
        pipe = client.pipeline(transaction=False)
        for k in reset:
            pipe.delete(k)
        pipe.hset(keys.meta, mapping=full)
        pipe.sadd(keys.versions, str(keys.version))
        pipe.execute()
    return full


def read_back(client: Any, target: RedisTarget, keys: VersionKeys, nodes: NodeKeys, ids: np.ndarray,
              blobs: Sequence[bytes], *, what: str, chunk_size: int = DEFAULT_CHUNK) -> tuple[bytes, np.ndarray]:
    """Read the blobs of ``ids`` and compare them with ``blobs``: ``(digest of what Redis returned,
    ids whose stored blob differs or is missing)``."""
    with redis_errors(target, f"reading back {what}", keys.kind.errors):
        back = fetch_blobs(client, nodes, ids, cluster=target.cluster, chunk_size=chunk_size)
    return chunk_digest(back), _differing(ids, back, blobs)


def write_verified(client: Any, target: RedisTarget, keys: VersionKeys, nodes: NodeKeys, ids: np.ndarray,
                   blobs: Sequence[bytes], *, what: str, chunk_size: int = DEFAULT_CHUNK) -> bytes:
    """Step 2 for one chunk: write ``blobs`` under the keys of ``ids``, read them back, compare;
    returns the chunk's digest. Raises the kind's ``corrupt`` error (nodes named) on a difference."""
    kind = keys.kind
    with redis_errors(target, f"writing {what}", kind.errors):
        write_blobs(client, nodes, ids, blobs, cluster=target.cluster, chunk_size=chunk_size)
        back = fetch_blobs(client, nodes, ids, cluster=target.cluster, chunk_size=chunk_size)
    if back != list(blobs):
        bad = _differing(ids, back, blobs)
        raise kind.errors.corrupt(
            f"{what} of {keys.where(target)} read back differently from what was written ({len(bad)} nodes: "
            f"{summarize_ids(bad)}): is another writer or an eviction policy at work?",
            node_ids=bad[:256], num_bad=len(bad))
    return chunk_digest(back)


def go_live(client: Any, target: RedisTarget, keys: VersionKeys, fields: Mapping[str, Any], *,
            set_current: bool = True) -> None:
    """Step 3: mark the version live with ``fields`` (``checksum``, ``count``...) and ``live_at``,
    and move the ``current`` pointer to it unless it already names a newer one."""
    with redis_errors(target, f"marking the {keys.kind.noun} version live", keys.kind.errors):
        client.hset(keys.meta, mapping={"state": "live", **fields, "live_at": now()})
        if set_current:
            client.eval(SET_CURRENT, 1, keys.current, str(keys.version))


def _differing(ids: np.ndarray, back: Sequence[bytes | None], blobs: Sequence[bytes]) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    return ids[np.fromiter((x != y for x, y in zip(back, blobs, strict=True)), dtype=bool, count=len(ids))]
