"""Writing a graph version to Redis (``gnnserve graph load``) and comparing one with a dataset.

:func:`load_graph` follows the Redis layer's load protocol (:mod:`serve.redisdata.load`): the
metadata first (state ``loading``, empty checksum), then per chunk of consecutive nodes and per
part (adjacency, each PPR configuration) write -> read back -> digest, then live and ``current``.
A live version is never written to: a re-run compares (:func:`verify_graph` does the same
comparison on demand).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.graph_edit import _self_loop_count

from ..features.base import summarize_ids
from ..redisdata.connection import RedisTarget, connect, parse_redis_url
from ..redisdata.errors import GRAPH_ERRORS, GraphCorrupt
from ..redisdata.load import go_live, now, read_back, start_version, version_checksum, write_verified
from ..redisdata.versions import DEFAULT_SHARDS, read_meta
from .schema import GRAPH_FORMAT, INT32_MAX, SCORE_CODES, GraphKeys, chunk_blobs
from .store import RedisGraphStore

__all__ = ["GraphLoadReport", "load_graph", "verify_graph"]

log = logging.getLogger(__name__)

#: the BLAKE2b personalisation of a graph version's checksum
_PERSON = b"gnnserve.graph"


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
    from kernels.ppr_index import DEGREE_SUMS

    if scores not in SCORE_CODES:
        raise ValueError(f"scores must be one of {sorted(SCORE_CODES)}, got {scores!r}")
    t0 = time.perf_counter()
    graph = dataset.graph
    fp = graph.fingerprint()
    target = parse_redis_url(redis_url)
    cl = client if client is not None else _connect(target)
    keys = GraphKeys(fp, version, shards)
    n = graph.num_nodes
    idt = np.dtype("<i4") if n <= INT32_MAX else np.dtype("<i8")
    indexes: dict[str, tuple[Any, str]] = {}
    ppr_meta: dict[str, dict[str, Any]] = {}
    for cfg in ppr:
        idx = (PPRIndex.open_or_build(ppr_cache_dir, graph, cfg, progress=progress) if ppr_cache_dir
               else PPRIndex.build(graph, cfg, progress=progress))
        indexes[cfg.key()] = (idx, scores)
        ppr_meta[cfg.key()] = {"config": cfg.to_dict(), "k_max": int(idx.k_max), "nnz": len(idx.nodes),
                               "scores": scores}
        if graph.weights is not None:  # how the pushes summed weighted degrees (RedisGraphStore checks it)
            ppr_meta[cfg.key()]["weighted_degrees"] = DEGREE_SUMS
    try:
        old = read_meta(cl, target, keys)
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
            return _compare_live(cl, target, keys, graph, indexes, idt, old, chunk_size, t0, ppr_meta)
        start_version(cl, target, keys, {
            "format": GRAPH_FORMAT, "fingerprint": fp, "version": version,
            "num_nodes": n, "num_edges": graph.num_edges,
            "max_degree": int(graph.degrees.max()) if n else 0, "weighted": int(graph.weights is not None),
            "self_loops": _self_loop_count(graph),
            "index_dtype": idt.str, "shards": shards, "chunk_size": chunk_size, "degree_chunk": chunk_size,
            "ppr": json.dumps(ppr_meta, sort_keys=True),
            "dataset_fingerprint": dataset.fingerprint(), "dataset_name": getattr(dataset, "name", "") or "",
            "created_at": old.get("created_at") or now(), "key_format": keys.key_format,
        })
        digests: list[bytes] = []
        written = nbytes = 0
        with tqdm(total=n, desc="graph load", unit="node", disable=not progress) as bar:
            for a in range(0, n, chunk_size):
                b = min(n, a + chunk_size)
                for part, ids, blobs in chunk_blobs(graph, indexes, a, b, idt, chunk_size):
                    digests.append(write_verified(cl, target, keys, keys.part(part), ids, blobs,
                                                  what=f"graph chunk {a}..{b} ({part})"))
                    written += len(blobs)
                    nbytes += sum(map(len, blobs))
                bar.update(b - a)
        checksum = version_checksum(digests, person=_PERSON)
        go_live(cl, target, keys, {"count": n, "checksum": checksum})
    finally:
        if client is None:
            cl.close()
    return GraphLoadReport(target.masked, fp, version, n, graph.num_edges, ppr_meta, written, nbytes,
                           time.perf_counter() - t0, checksum, "live")


def _connect(target: RedisTarget) -> Any:
    """A client for a load or a verification: longer socket timeouts than a server's reads."""
    return connect(target, socket_timeout=10.0, connect_timeout=2.0, retries=3, errors=GRAPH_ERRORS)


def _stored_chunking(meta: dict[str, str], default: int) -> tuple[int, int]:
    """``(chunk_size, degree_chunk)`` a stored version was written with (its digests, and so its
    checksum, follow its chunks; ``degree_chunk`` 0: a version written before degree chunks)."""
    chunk = int(meta.get("chunk_size") or default)
    return chunk, int(meta.get("degree_chunk") or 0)


def _compare_stored(cl: Any, target: RedisTarget, keys: GraphKeys, graph: Any, indexes: dict[str, tuple[Any, str]],
                    idt: np.dtype, chunk_size: int, degree_chunk: int) -> tuple[list[bytes], list[str]]:
    """Read every stored chunk of every part back and compare it with the dataset's: ``(digests of
    what Redis returned, one line per part and chunk that differs)``."""
    digests: list[bytes] = []
    bad: list[str] = []
    n = graph.num_nodes
    for a in range(0, n, chunk_size):
        b = min(n, a + chunk_size)
        for part, ids, blobs in chunk_blobs(graph, indexes, a, b, idt, degree_chunk):
            digest, diff = read_back(cl, target, keys, keys.part(part), ids, blobs,
                                     what=f"graph chunk {a}..{b} ({part})")
            if len(diff):
                bad.append(f"{part}: nodes {summarize_ids(diff)}")
            digests.append(digest)
    return digests, bad


def _compare_live(cl: Any, target: RedisTarget, keys: GraphKeys, graph: Any, indexes: dict[str, tuple[Any, str]],
                  idt: np.dtype, old: dict[str, str], chunk_size: int, t0: float,
                  ppr_meta: dict[str, dict[str, Any]]) -> GraphLoadReport:
    """A re-run of ``load_graph`` on a live version: read back, compare, write nothing."""
    digests, bad = _compare_stored(cl, target, keys, graph, indexes, idt, *_stored_chunking(old, chunk_size))
    checksum = version_checksum(digests, person=_PERSON)
    where = keys.where(target)
    if bad:
        raise GraphCorrupt(f"{where} is live and differs from this dataset ({'; '.join(bad[:5])}): nothing was "
                           "written and the version stays live; load a new --version (replicas pin versions by "
                           "checksum and refuse a changed one)")
    if checksum != old.get("checksum"):
        raise GraphCorrupt(f"{where} is live but its checksum {old.get('checksum')!r} does not match its rows "
                           f"({checksum}): nothing was written; load a new --version")
    return GraphLoadReport(target.masked, keys.fingerprint, keys.version, graph.num_nodes, graph.num_edges, ppr_meta,
                           0, 0, time.perf_counter() - t0, checksum, "live", already_live=True)


def verify_graph(dataset: Any, redis_url: str, *, version: int | None = None, ppr_cache_dir: str | None = None,
                 chunk_size: int = 2048, client: Any = None) -> tuple[bool, str]:
    """Compare a stored version with the dataset (and its PPR indexes) blob for blob: ``(ok, message)``."""
    from kernels.ppr import PPRConfig, PPRIndex

    graph = dataset.graph
    target = parse_redis_url(redis_url)
    cl = client if client is not None else _connect(target)
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
        stored_chunk, degree_chunk = _stored_chunking(store.meta, chunk_size)
        _, bad = _compare_stored(cl, target, store.keys, graph, indexes, store.index_dtype, stored_chunk, degree_chunk)
        if bad:
            return False, f"graph {store.fingerprint} v{store.version}: differs from the dataset: " + "; ".join(bad)
        return True, f"graph {store.fingerprint} v{store.version}: every row and list matches the dataset"
    finally:
        if client is None:
            cl.close()
