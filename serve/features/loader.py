"""Loading features into Redis: chunked, resumable, idempotent, verified before going live.

The CLI (``gnnserve features load --dataset PATH.npz --redis URL [--verify]``) calls
:func:`load_features` and :func:`verify_features`; nothing here parses arguments or prints.

How a load runs (key schema and blob format: :mod:`serve.features.redis_store`; the start,
write -> read back -> digest and go-live steps are the Redis layer's, :mod:`serve.redisdata.load`):

1. A lock key (``SET NX`` with a 30 s TTL and a random token) keeps two loaders of one version
   apart. A loader that dies leaves the lock to expire. Before every chunk it writes (and before
   marking the version live) the loader refreshes the lock with a compare-and-refresh script that
   extends the TTL only while the key still holds *its* token: a loader that stalled past the
   TTL, whose lock was then taken by another loader, stops with :class:`FeatureLoadError`
   instead of writing on (and never extends the other loader's lock).
2. The metadata hash is created in state ``loading`` with the shape, encoding, chunking and the
   fingerprints of the source (``feature_fingerprint``: hash of ``x``; ``dataset_fingerprint``).
   An existing hash for the same features is resumed; one for different features is refused
   (a ``loading`` one can be restarted with ``overwrite=True``; a ``live`` version is never
   rewritten with other numbers: load a new version instead).
3. Nodes are written in chunks of ``chunk_size`` consecutive ids: ``MSET`` (pipelined, per hash-tag
   shard on a cluster), then the chunk is read back and compared byte for byte. Its BLAKE2b digest
   goes into the ``chunks`` hash and the progress marker (``chunks_done``, ``count``) into the
   metadata. A chunk whose stored digest equals the digest of the source chunk is skipped: that is
   how an interrupted load resumes, and why running a finished load again writes nothing.
4. Verification reads every key back: it counts rows present with a valid blob (length, header,
   finite values) and recomputes each chunk's digest from what Redis returned. The checksum of a
   version is ``BLAKE2b-128("gnnserve.features/1|<dtype>|<F>|<N>|<chunk_size>|" + chunk digests in
   order)``. Only when the count is ``N`` and every digest matches the source does the state turn
   ``live`` (with ``checksum`` and ``live_at``), and ``gnnserve:feat:<fp>:current`` moves to this
   version if it is newer than the current one. Chunks that fail are marked for rewriting.

:func:`verify_features` runs step 4 alone on an existing version. Without the dataset it compares
with the digests recorded at load time (detects lost, corrupt or tampered keys, located to the
chunk); with the dataset it compares with the source too and names the exact nodes that differ.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..redisdata.bulk import fetch_blobs
from ..redisdata.connection import RedisTarget, connect, parse_redis_url
from ..redisdata.errors import redis_errors
from ..redisdata.load import chunk_digest, go_live, now, start_version, version_checksum, write_verified
from ..redisdata.versions import DEFAULT_SHARDS, read_meta
from .base import FeatureCorrupt, FeatureNotFound, FeatureStoreError
from .redis_store import META_FORMAT, BlobCodec, FeatureKeys, resolve_version

__all__ = [
    "FeatureLoadError",
    "FeatureVerifyError",
    "LoadReport",
    "VerifyReport",
    "delete_features",
    "list_versions",
    "load_features",
    "verify_features",
]

log = logging.getLogger(__name__)

_LOCK_TTL_MS = 30_000
_IDENTITY = ("format", "dtype", "num_nodes", "num_features", "shards", "feature_fingerprint")
# Extends the lock only if it still holds our token (KEYS[1] = lock, ARGV = token, TTL in ms).
_REFRESH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# Deletes the lock only if it still holds our token.
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class FeatureLoadError(FeatureStoreError):
    """A load cannot proceed (another loader holds the lock, different features already stored)."""


class FeatureVerifyError(FeatureCorrupt):
    """Verification after a load found missing, corrupt or different rows; the version stays
    ``loading`` (or, for a repair of a live version, the report says what is still wrong)."""

    def __init__(self, message: str, report: VerifyReport) -> None:
        super().__init__(message, node_ids=np.asarray(report.sample_bad_nodes, dtype=np.int64),
                         num_bad=report.missing + report.corrupt + report.different)
        self.report = report


# =========================================================================== reports
@dataclass
class VerifyReport:
    """What a verification pass found (all node counts are over the whole version).

    ``ok`` is True when every node has a valid blob and every chunk digest matches the expectation
    (the source when a dataset was given, else the digests recorded at load time) and, for a
    version already live, the recomputed checksum equals the stored one.
    """

    ok: bool
    url: str
    fingerprint: str
    version: int
    state: str
    num_nodes: int
    num_features: int
    dtype: str
    count: int
    expected_count: int
    missing: int
    corrupt: int
    different: int
    checksum: str
    expected_checksum: str
    bad_chunks: list[int] = field(default_factory=list)
    sample_bad_nodes: list[int] = field(default_factory=list)
    compared_with: str = "recorded digests"
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for humans (CLI output, logs): never contains a password."""
        if self.ok:
            return (f"OK: graph {self.fingerprint} v{self.version} ({self.state}) at {self.url}: {self.count}/"
                    f"{self.expected_count} rows of {self.num_features} x {self.dtype}, checksum {self.checksum} "
                    f"(compared with {self.compared_with}, {self.seconds:.1f} s)")
        return (f"FAILED: graph {self.fingerprint} v{self.version} ({self.state}) at {self.url}: {self.count}/"
                f"{self.expected_count} valid rows, {self.missing} missing, {self.corrupt} corrupt, "
                f"{self.different} chunk(s) differing from {self.compared_with}; bad chunks "
                f"{self.bad_chunks[:10]}{'...' if len(self.bad_chunks) > 10 else ''}, e.g. nodes "
                f"{self.sample_bad_nodes[:10]}; checksum {self.checksum} vs expected {self.expected_checksum or '-'}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadReport:
    """What :func:`load_features` did. ``complete`` is False only when ``max_chunks`` stopped it."""

    url: str
    fingerprint: str
    version: int
    num_nodes: int
    num_features: int
    dtype: str
    chunk_size: int
    chunks_total: int
    chunks_written: int
    chunks_skipped: int
    resumed: bool
    already_live: bool
    complete: bool
    state: str
    seconds: float
    verify: VerifyReport | None = None

    def summary(self) -> str:
        head = (f"graph {self.fingerprint} v{self.version} at {self.url}: {self.num_nodes} x {self.num_features} "
                f"{self.dtype}, {self.chunks_written} chunk(s) written, {self.chunks_skipped} skipped "
                f"(chunk {self.chunk_size}), state {self.state}, {self.seconds:.1f} s")
        if self.verify is not None:
            head += "; " + self.verify.summary()
        return head


# =========================================================================== helpers
def _checksum(dtype: str, f: int, n: int, chunk: int, digests: list[bytes]) -> str:
    return version_checksum(digests, prefix=f"{META_FORMAT}|{dtype}|{f}|{n}|{chunk}|".encode())


def _source(dataset: Any, fingerprint: str | None) -> tuple[np.ndarray, str, str, str, str]:
    """``(x, graph fingerprint, feature fingerprint, dataset fingerprint, name)`` of a source."""
    if isinstance(dataset, np.ndarray):
        if fingerprint is None:
            raise ValueError("loading a bare array needs fingerprint= (the graph fingerprint)")
        x = dataset
        h = hashlib.blake2b(digest_size=16)  # the same formula as GraphDataset.feature_fingerprint()
        h.update(f"x|{x.shape}|{np.dtype(np.float32).str}".encode())
        h.update(np.ascontiguousarray(x, dtype=np.float32).tobytes())
        return x, fingerprint, h.hexdigest(), "", "array"
    if isinstance(dataset, (str,)) or hasattr(dataset, "__fspath__"):
        from kernels.datasets import load_dataset

        dataset = load_dataset(dataset)
    x = dataset.x
    fp = fingerprint or dataset.graph.fingerprint()
    return x, fp, dataset.feature_fingerprint(), dataset.fingerprint(), str(getattr(dataset, "name", ""))


def _bar(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="node", unit_scale=True, disable=not enabled, leave=False)


def _client_for(redis_url: str, client: Any) -> tuple[RedisTarget, Any, bool]:
    target = parse_redis_url(redis_url)
    if client is not None:
        return target, client, False
    # Loads move many megabytes per round trip: allow a longer socket timeout than the server's reads.
    return target, connect(target, socket_timeout=30.0, connect_timeout=2.0, retries=3, backoff_cap=1.0), True


# =========================================================================== verification core
def _verify(
    client: Any,
    target: RedisTarget,
    keys: FeatureKeys,
    meta: dict[str, str],
    *,
    x: np.ndarray | None,
    progress: bool,
    on_chunk: Callable[[], None] | None = None,
) -> VerifyReport:
    """Read every key of a version back and compare (see the module docstring, step 4)."""
    t0 = time.perf_counter()
    n, f = int(meta["num_nodes"]), int(meta["num_features"])
    chunk, dtype = int(meta["chunk_size"]), meta["dtype"]
    codec = BlobCodec(dtype, f)
    total = -(-n // chunk)
    with redis_errors(target, "reading the chunk digests"):
        recorded = {int(k): bytes(v) for k, v in client.hgetall(keys.chunks).items()}
    count = missing = corrupt = different = 0
    bad_chunks: list[int] = []
    sample: list[int] = []
    digests: list[bytes] = []
    expected_digests: list[bytes] = []
    bar = _bar(n, f"verify v{keys.version}", progress)
    try:
        for c in range(total):
            a, b = c * chunk, min(n, (c + 1) * chunk)
            ids = np.arange(a, b, dtype=np.int64)
            with redis_errors(target, f"verifying chunk {c}"):
                values = fetch_blobs(client, keys, ids, cluster=target.cluster)
            miss, corr = codec.classify(values)
            got = chunk_digest(values)
            digests.append(got)
            src_blobs = codec.encode_blobs(x[a:b]) if x is not None else None
            want = chunk_digest(src_blobs) if src_blobs is not None else recorded.get(c)
            expected_digests.append(want if want is not None else b"")
            nm, nc = int(miss.sum()), int(corr.sum())
            missing += nm
            corrupt += nc
            count += (b - a) - nm - nc
            diff_nodes = np.zeros(0, dtype=np.int64)
            differs = want is not None and got != want  # no recorded digest: only the checksum can tell
            if differs:
                different += 1
                if src_blobs is not None:
                    diff_nodes = ids[[v != s for v, s in zip(values, src_blobs, strict=True)]]
            if nm or nc or differs:
                bad_chunks.append(c)
                if len(sample) < 20:
                    bad = np.concatenate([ids[miss | corr], diff_nodes])
                    sample.extend(int(i) for i in np.unique(bad)[: 20 - len(sample)])
            bar.update(b - a)
            if on_chunk is not None:
                on_chunk()
    finally:
        bar.close()
    checksum = _checksum(dtype, f, n, chunk, digests)
    if x is not None or len(recorded) == total:
        expected = _checksum(dtype, f, n, chunk, expected_digests)
    else:
        expected = meta.get("checksum", "")
    stored = meta.get("checksum", "")
    ok = (not bad_chunks and count == n and bool(expected) and checksum == expected
          and (not stored or stored == checksum))
    report = VerifyReport(
        ok=ok, url=target.masked, fingerprint=keys.fingerprint, version=keys.version,
        state=meta.get("state", "?"), num_nodes=n, num_features=f, dtype=dtype, count=count, expected_count=n,
        missing=missing, corrupt=corrupt, different=different, checksum=checksum,
        expected_checksum=stored or expected, bad_chunks=bad_chunks, sample_bad_nodes=sample,
        compared_with="the dataset" if x is not None else "recorded digests",
        seconds=time.perf_counter() - t0,
    )
    return report


# =========================================================================== public API
def load_features(
    dataset: Any,
    redis_url: str,
    version: int = 1,
    chunk_size: int = 4096,
    progress: bool = True,
    *,
    dtype: str = "float32",
    fingerprint: str | None = None,
    shards: int = DEFAULT_SHARDS,
    overwrite: bool = False,
    set_current: bool = True,
    max_chunks: int | None = None,
    progress_callback: Callable[[int, int], None] | None = None,
    client: Any = None,
) -> LoadReport:
    """Write all features of ``dataset`` to Redis as ``version``, verify, and mark it live.

    Args:
        dataset: a :class:`kernels.datasets.GraphDataset`, a path/spec ``load_dataset`` accepts
            (``.npz``, dataset directory, ``ogb:...``, ``synthetic:N:seed``), or a float array
            ``[N, F]`` together with ``fingerprint``.
        redis_url: any URL form of :mod:`serve.features.redis_store` (password allowed).
        version: positive feature version number.
        chunk_size: nodes per chunk (one pipelined write + read-back each, and the unit of resume).
            Resuming an existing load keeps the chunk size it was started with.
        progress: show a tqdm bar (stderr).
        dtype: ``"float32"`` or ``"float16"`` (half the memory; values must fit float16).
        fingerprint: graph fingerprint to store under (default ``dataset.graph.fingerprint()``).
        shards: number of Redis Cluster hash tags (see the key schema).
        overwrite: restart an interrupted (``loading``) version that holds different features.
        set_current: move ``gnnserve:feat:<fp>:current`` to this version when it goes live (only
            forward: an older version never replaces a newer current one).
        max_chunks: stop after writing this many chunks (the load stays ``loading``, resumable).
        progress_callback: ``callback(chunks_done, chunks_total)`` after every chunk written; an
            exception raised there aborts the load (it stays resumable).
        client: an existing redis-py client for ``redis_url`` (not closed here).

    Returns:
        A :class:`LoadReport` (its ``verify`` holds the final verification).

    Raises:
        FeatureLoadError: another loader holds the lock, or the version holds other features.
        FeatureVerifyError: the final verification failed (bad chunks are marked for rewriting:
            run the load again).
        FeatureUnavailable: Redis is unreachable (the load can be resumed later).
        ValueError: bad arguments or features (NaN, overflow of float16).
    """
    t0 = time.perf_counter()
    x, fp, feat_fp, ds_fp, ds_name = _source(dataset, fingerprint)
    x = np.asarray(x) if not isinstance(x, np.memmap) else x
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"features must be a non-empty [N, F] array, got shape {x.shape}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    n, f = int(x.shape[0]), int(x.shape[1])
    codec = BlobCodec(dtype, f)
    keys = FeatureKeys(fp, version, shards)
    target, cl, owned = _client_for(redis_url, client)
    token = uuid.uuid4().hex
    try:
        with redis_errors(target, "taking the load lock"):
            if not cl.set(keys.lock, token, nx=True, px=_LOCK_TTL_MS):
                raise FeatureLoadError(
                    f"another load of graph {fp} v{version} is running at {target.masked} (lock key {keys.lock}; "
                    f"it expires {_LOCK_TTL_MS // 1000} s after its loader stops)"
                )
        try:
            return _load_locked(cl, target, keys, codec, x, n, f, feat_fp, ds_fp, ds_name, chunk_size,
                                progress, overwrite, set_current, max_chunks, progress_callback, token, t0)
        finally:
            try:
                with redis_errors(target, "releasing the load lock"):
                    cl.eval(_UNLOCK, 1, keys.lock, token)
            except FeatureStoreError as exc:  # Redis went away: the lock expires on its own
                log.warning("could not release the load lock %s: %s", keys.lock, exc)
    finally:
        if owned:
            cl.close()


def _load_locked(
    cl: Any, target: RedisTarget, keys: FeatureKeys, codec: BlobCodec, x: np.ndarray, n: int, f: int,
    feat_fp: str, ds_fp: str, ds_name: str, chunk_size: int, progress: bool, overwrite: bool,
    set_current: bool, max_chunks: int | None, callback: Callable[[int, int], None] | None, token: str,
    t0: float,
) -> LoadReport:
    fp, version = keys.fingerprint, keys.version
    meta = read_meta(cl, target, keys)
    wanted = {"format": META_FORMAT, "dtype": codec.dtype.name, "num_nodes": str(n), "num_features": str(f),
              "shards": str(keys.shards), "feature_fingerprint": feat_fp}
    resumed = already_live = False
    if meta:
        same = all(meta.get(k) == wanted[k] for k in _IDENTITY)
        if not same:
            diff = {k: (meta.get(k), wanted[k]) for k in _IDENTITY if meta.get(k) != wanted[k]}
            if meta.get("state") == "live":
                raise FeatureLoadError(
                    f"graph {fp} v{version} at {target.masked} is live with other features ({diff}); live versions "
                    "are never rewritten: load under a new version number"
                )
            if not overwrite:
                raise FeatureLoadError(
                    f"an interrupted load of graph {fp} v{version} at {target.masked} holds other features "
                    f"({diff}); pass overwrite=True to restart it, or use another version"
                )
            log.info("restarting the interrupted load of graph %s v%d (overwrite)", fp, version)
            with redis_errors(target, "resetting the interrupted load"):
                cl.delete(keys.chunks, keys.meta)
            meta = {}
        else:
            already_live = meta.get("state") == "live"
            resumed = not already_live
            if int(meta.get("chunk_size", chunk_size)) != chunk_size:
                log.info("graph %s v%d was started with chunk_size %s: keeping it", fp, version, meta["chunk_size"])
            chunk_size = int(meta.get("chunk_size", chunk_size))
    total = -(-n // chunk_size)
    if not meta:
        meta = start_version(cl, target, keys, {
            **wanted, "fingerprint": fp, "version": str(version), "chunk_size": str(chunk_size),
            "chunks_total": str(total), "chunks_done": "0", "count": "0", "dataset_fingerprint": ds_fp,
            "dataset_name": ds_name, "created_at": now(), "key_format": keys.key_format}, reset=(keys.chunks,))
    with redis_errors(target, "reading the load progress"):
        recorded = {int(k): bytes(v) for k, v in cl.hgetall(keys.chunks).items()}

    def rows_of(c: int) -> int:
        return min(n, (c + 1) * chunk_size) - c * chunk_size

    recorded = {c: d for c, d in recorded.items() if 0 <= c < total}
    rows_done = sum(rows_of(c) for c in recorded)
    written = skipped = 0
    complete = True
    verify: VerifyReport | None = None
    for attempt in range(2):  # a live version failing verification is repaired once, then re-verified
        todo: list[int] = []
        bar = _bar(n, f"load v{version}", progress and not already_live)
        try:
            for c in range(total):
                a, b = c * chunk_size, min(n, (c + 1) * chunk_size)
                blobs = codec.encode_blobs(x[a:b])
                if recorded.get(c) == chunk_digest(blobs):
                    skipped += 1
                    bar.update(b - a)
                    continue
                todo.append(c)
                if max_chunks is not None and written >= max_chunks:
                    complete = False
                    continue
                _refresh_lock(cl, target, keys, token)
                recorded[c] = _write_chunk(cl, target, keys, c, a, b, blobs, token)
                written += 1
                rows_done += b - a
                with redis_errors(target, "recording load progress"):
                    cl.hset(keys.meta, mapping={"chunks_done": str(len(recorded)), "count": str(rows_done)})
                bar.update(b - a)
                if callback is not None:
                    callback(len(recorded), total)
        finally:
            bar.close()
        if not complete:
            break
        if already_live and attempt == 0:
            log.info("graph %s v%d is already live: verifying", fp, version)
        verify = _verify(cl, target, keys, {**meta, "chunk_size": str(chunk_size)}, x=x, progress=progress,
                         on_chunk=lambda: _refresh_lock(cl, target, keys, token))
        if verify.ok:
            break
        with redis_errors(target, "marking bad chunks"):
            if verify.bad_chunks:
                cl.hdel(keys.chunks, *[str(c) for c in verify.bad_chunks])
        for c in verify.bad_chunks:
            if recorded.pop(c, None) is not None:
                rows_done -= rows_of(c)
        if not already_live or attempt == 1:
            raise FeatureVerifyError(
                f"verification of graph {fp} v{version} failed after the load: {verify.summary()}; the bad chunks "
                "were marked for rewriting, run the load again",
                verify,
            )
        log.warning("graph %s v%d is live but failed verification (%s): rewriting the bad chunks", fp, version,
                    verify.summary())
        skipped = 0

    state = meta.get("state", "loading")
    if complete and verify is not None and verify.ok and state != "live":
        _refresh_lock(cl, target, keys, token)
        go_live(cl, target, keys, {"checksum": verify.checksum, "count": str(verify.count),
                                   "chunks_done": str(total)}, set_current=set_current)
        state = "live"
        verify.state = "live"
        verify.expected_checksum = verify.checksum
        log.info("graph %s v%d is live at %s (%d rows, checksum %s)", fp, version, target.masked, n, verify.checksum)
    return LoadReport(
        url=target.masked, fingerprint=fp, version=version, num_nodes=n, num_features=f, dtype=codec.dtype.name,
        chunk_size=chunk_size, chunks_total=total, chunks_written=written, chunks_skipped=skipped, resumed=resumed,
        already_live=already_live, complete=complete, state=state, seconds=time.perf_counter() - t0, verify=verify,
    )


def _write_chunk(cl: Any, target: RedisTarget, keys: FeatureKeys, c: int, a: int, b: int, blobs: list[bytes],
                 token: str) -> bytes:
    """Write one chunk, read it back, compare (:func:`serve.redisdata.load.write_verified`), and
    record its digest; refreshes the lock. Returns the digest."""
    digest = write_verified(cl, target, keys, keys, np.arange(a, b, dtype=np.int64), blobs, what=f"chunk {c}")
    _refresh_lock(cl, target, keys, token)
    with redis_errors(target, f"recording chunk {c}"):
        cl.hset(keys.chunks, str(c), digest)
    return digest


def _refresh_lock(cl: Any, target: RedisTarget, keys: FeatureKeys, token: str) -> None:
    """Extend our lock's TTL; :class:`FeatureLoadError` if the lock is no longer ours."""
    with redis_errors(target, "refreshing the load lock"):
        ok = int(cl.eval(_REFRESH, 1, keys.lock, token, str(_LOCK_TTL_MS)))
    if not ok:
        raise FeatureLoadError(
            f"the load of graph {keys.fingerprint} v{keys.version} at {target.masked} lost its lock {keys.lock} (it "
            f"expired after {_LOCK_TTL_MS // 1000} s without a refresh and another loader may hold it now): stopped "
            "without writing more; run the load again once no other loader runs (it resumes)")


def verify_features(
    redis_url: str,
    fingerprint: str | None = None,
    version: int | None = None,
    *,
    dataset: Any = None,
    progress: bool = False,
    client: Any = None,
) -> VerifyReport:
    """Check an existing load: every key present with a valid blob, digests and checksum match.

    Args:
        redis_url: where the features are.
        fingerprint: the graph fingerprint (default: that of ``dataset``).
        version: the version to check (default: the ``current`` one).
        dataset: the source (``GraphDataset``, path or ``[N, F]`` array with ``fingerprint``): when
            given, every chunk is also compared with it and differing nodes are named.
        progress: show a tqdm bar.
        client: an existing redis-py client (not closed here).

    Returns:
        A :class:`VerifyReport`; ``ok`` is False on any missing, corrupt or differing row or a
        checksum mismatch (this function does not raise for those).

    Raises:
        FeatureNotFound: no such version (or no current one).
        FeatureUnavailable: Redis is unreachable.
    """
    x = None
    if dataset is not None:
        x, fp_src, *_ = _source(dataset, fingerprint)
        fingerprint = fingerprint or fp_src
    if fingerprint is None:
        raise ValueError("verify_features needs fingerprint= or dataset=")
    target, cl, owned = _client_for(redis_url, client)
    try:
        if version is None:
            version = resolve_version(cl, target, fingerprint)
        keys = FeatureKeys(fingerprint, version)
        meta = read_meta(cl, target, keys)
        if not meta:
            raise FeatureNotFound(f"no features for graph {fingerprint} v{version} at {target.masked}")
        keys = FeatureKeys(fingerprint, version, int(meta.get("shards", DEFAULT_SHARDS)))
        if x is not None and (x.shape[0] != int(meta["num_nodes"]) or x.shape[1] != int(meta["num_features"])):
            raise FeatureLoadError(f"the dataset has shape {x.shape}, graph {fingerprint} v{version} holds "
                                   f"{meta['num_nodes']} x {meta['num_features']}")
        report = _verify(cl, target, keys, meta, x=x, progress=progress)
        log.info("%s", report.summary())
        return report
    finally:
        if owned:
            cl.close()


def list_versions(redis_url: str, fingerprint: str, *, client: Any = None) -> list[dict[str, str]]:
    """Metadata of every version of a graph at ``redis_url``, oldest first (``current`` marked)."""
    target, cl, owned = _client_for(redis_url, client)
    try:
        keys = FeatureKeys(fingerprint, 1)
        with redis_errors(target, "listing feature versions"):
            versions = sorted(int(v) for v in cl.smembers(keys.versions))
            cur = cl.get(keys.current)
        out = []
        for v in versions:
            meta = read_meta(cl, target, FeatureKeys(fingerprint, v))
            meta["current"] = str(cur is not None and int(cur) == v).lower()
            out.append(meta if meta.get("version") else {"version": str(v), "state": "gone", **meta})
        return out
    finally:
        if owned:
            cl.close()


def delete_features(redis_url: str, fingerprint: str, version: int, *, chunk_size: int = 4096,
                    client: Any = None) -> int:
    """Delete one version (node keys, metadata, progress) and return the number of keys removed.

    If it was ``current``, the pointer moves to the newest remaining live version (or is removed).
    Servers still reading the version will get :class:`FeatureNotFound`.
    """
    target, cl, owned = _client_for(redis_url, client)
    try:
        keys = FeatureKeys(fingerprint, version)
        meta = read_meta(cl, target, keys)
        removed = 0
        if meta:
            keys = FeatureKeys(fingerprint, version, int(meta.get("shards", DEFAULT_SHARDS)))
            n = int(meta.get("num_nodes", 0))
            for a in range(0, n, chunk_size):
                ids = np.arange(a, min(n, a + chunk_size), dtype=np.int64)
                key_list = keys.node_keys(ids)
                with redis_errors(target, "deleting feature keys"):
                    if target.cluster:
                        pipe = cl.pipeline(transaction=False)
                        for k in key_list:
                            pipe.unlink(k)
                        removed += sum(int(r) for r in pipe.execute())
                    else:
                        removed += int(cl.unlink(*key_list))
        with redis_errors(target, "deleting feature metadata"):
            removed += int(cl.delete(keys.meta)) + int(cl.delete(keys.chunks)) + int(cl.delete(keys.lock))
            cl.srem(keys.versions, str(version))
            cur = cl.get(keys.current)
            if cur is not None and int(cur) == version:
                live = [v for v in sorted((int(x) for x in cl.smembers(keys.versions)), reverse=True)
                        if read_meta(cl, target, FeatureKeys(fingerprint, v)).get("state") == "live"]
                if live:
                    cl.set(keys.current, str(live[0]))
                else:
                    cl.delete(keys.current)
        log.info("deleted graph %s v%d at %s (%d keys)", fingerprint, version, target.masked, removed)
        return removed
    finally:
        if owned:
            cl.close()
