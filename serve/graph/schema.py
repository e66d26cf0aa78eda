"""Graph data in Redis: the key schema, the blob format and their codec (shared by the store and the loader).

Key schema
----------
``<gfp>`` is the graph fingerprint (:meth:`kernels.graph.CSRGraph.fingerprint`, the same one the
features are keyed by), ``V`` the graph version, ``S`` the hash-tag shard count (default 256,
recorded in the metadata), ``<ck>`` the :meth:`kernels.ppr.PPRConfig.key` of a PPR configuration::

    gnnserve:graph:<gfp>:v<V>:{<node mod S>}:a:<node>       adjacency row of <node> (blob, below)
    gnnserve:graph:<gfp>:v<V>:{<node mod S>}:p:<ck>:<node>  top-K PPR list of <node> under config <ck>
    gnnserve:graph:<gfp>:v<V>:{<c mod S>}:d:<c>              degrees of nodes c*D .. (c+1)*D - 1
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
    degrees:   b"gd" | 1 | flags | count (uint32) | first node (uint64) | row lengths uint32 [count]
               | weight sums float64 [count]?

``flags`` bit 0: ids are int64 (else int32); adjacency bit 1: weighted; PPR bits 1-2: scores
(0 = not stored, 1 = float16, 2 = float32); degrees bit 1: weighted (the float64 sums of each row's
weights follow the lengths). A degree chunk ``c`` holds ``D`` consecutive nodes (``D`` is the
metadata's ``degree_chunk``; the last chunk fewer): what an L-hop replica needs of the nodes a
sampled plan reaches but does not expand (their GCN degrees) and of the targets' neighbours (exact
edge counts), without fetching their rows. Versions loaded before it existed have no
``degree_chunk``; readers then take degrees from the rows. Every read checks the magic, version and flags
against the metadata, the node id in the header against the key asked for (a blob stored under
the wrong key is caught), the length, that ids lie in ``[0, N)`` and that a PPR list starts with
its own node. A failed check is :class:`GraphCorrupt` (DATA_LOSS), a missing key
:class:`GraphNotFound`, an unreachable Redis :class:`GraphUnavailable` (UNAVAILABLE): the Redis
layer's graph error family (:mod:`serve.redisdata.errors`, subclasses of the feature-store errors),
raised as such by every layer function the graph code calls; a batch is refused, never answered
with partial data.

Metadata fields: ``format`` (``gnnserve.graph/1``), ``fingerprint``, ``version``, ``state``,
``num_nodes``, ``num_edges``, ``max_degree``, ``weighted``, ``index_dtype``, ``shards``,
``chunk_size``, ``degree_chunk``, ``count`` (adjacency rows verified), ``checksum`` (BLAKE2b over the chunk digests
of everything written, recomputed from what Redis returned), ``ppr`` (JSON: config key ->
``{"config", "k_max", "nnz", "scores"}``), ``dataset_fingerprint``, ``dataset_name``,
``created_at``, ``live_at``, ``key_format``.

The version keys, ``current`` and ``versions``, which version to open and the pin are the Redis
layer's (:mod:`serve.redisdata.versions`), with :data:`GRAPH` as the kind.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..redisdata.errors import GRAPH_ERRORS, GraphCorrupt
from ..redisdata.versions import DEFAULT_SHARDS, DataKind, NodeKeys, VersionKeys

__all__ = ["GRAPH", "GRAPH_FORMAT", "GRAPH_PREFIX", "GraphKeys", "RowDecoder", "chunk_blobs", "decode_degrees",
           "encode_degrees", "encode_rows"]

GRAPH_PREFIX = "gnnserve:graph"
GRAPH_FORMAT = "gnnserve.graph/1"
GRAPH = DataKind(label="graph", noun="graph", data="graph data", prefix=GRAPH_PREFIX, cli="gnnserve graph",
                 errors=GRAPH_ERRORS)
HDR = struct.Struct("<2sBBIQ")
VER = 1
SCORE_CODES = {"none": 0, "float16": 1, "float32": 2}
SCORE_DTYPES = {1: np.dtype("<f2"), 2: np.dtype("<f4")}
INT32_MAX = np.iinfo(np.int32).max


# =========================================================================== key schema
class GraphKeys(VersionKeys):
    """Key names of one graph version (schema in the module docstring): the adjacency rows
    (part ``a``) and the PPR lists of each configuration (part ``p:<config key>``)."""

    kind = GRAPH
    node_format = "a:<node> | :p:<config key>:<node>"

    def __init__(self, fingerprint: str, version: int, shards: int = DEFAULT_SHARDS) -> None:
        super().__init__(fingerprint, version, shards)
        self.adj = self.nodes("a")
        self.deg = self.nodes("d")  # keyed by degree chunk, not by node
        self._ppr: dict[str, NodeKeys] = {}

    def ppr(self, config_key: str) -> NodeKeys:
        k = self._ppr.get(config_key)
        if k is None:
            k = self._ppr[config_key] = self.nodes(f"p:{config_key}")
        return k

    def part(self, part: str) -> NodeKeys:
        """The node keys of a part as :func:`chunk_blobs` names it (``a``, ``d`` or ``p:<config key>``)."""
        return self.adj if part == "a" else self.deg if part == "d" else self.ppr(part[2:])


# =========================================================================== blobs
def encode_rows(magic: bytes, flags: int, start: int, ptr: np.ndarray, ids: np.ndarray,
                 extra: np.ndarray | None) -> list[bytes]:
    """Blobs of rows ``start .. start + len(ptr) - 2`` (``ptr`` local to ``ids``/``extra``)."""
    out = []
    ib = ids.tobytes()
    isz = ids.dtype.itemsize
    eb = extra.tobytes() if extra is not None else b""
    esz = extra.dtype.itemsize if extra is not None else 0
    for r in range(len(ptr) - 1):
        a, b = int(ptr[r]), int(ptr[r + 1])
        out.append(HDR.pack(magic, VER, flags, b - a, start + r) + ib[a * isz : b * isz]
                   + (eb[a * esz : b * esz] if esz else b""))
    return out


class RowDecoder:
    """Checks and decodes blobs of one kind (adjacency or PPR list) of one graph version."""

    def __init__(self, magic: bytes, flags: int, id_dtype: np.dtype, extra: np.dtype | None,
                 num_nodes: int, first_is_self: bool, what: str) -> None:
        self.magic, self.flags, self.id_dtype, self.extra = magic, flags, np.dtype(id_dtype), extra
        self.n, self.first_is_self, self.what = num_nodes, first_is_self, what
        self.per = self.id_dtype.itemsize + (extra.itemsize if extra is not None else 0)

    def decode(self, node: int, blob: bytes) -> tuple[np.ndarray, np.ndarray | None]:
        if len(blob) < HDR.size:
            raise GraphCorrupt(f"{self.what} of node {node} is {len(blob)} bytes, shorter than its header")
        magic, ver, flags, count, who = HDR.unpack_from(blob)
        if magic != self.magic or ver != VER or flags != self.flags:
            raise GraphCorrupt(f"{self.what} of node {node} has header {magic!r}/v{ver}/flags {flags}, "
                               f"expected {self.magic!r}/v{VER}/flags {self.flags}")
        if who != node:
            raise GraphCorrupt(f"{self.what} stored under node {node} belongs to node {who} (misplaced key)")
        if len(blob) != HDR.size + count * self.per:
            raise GraphCorrupt(f"{self.what} of node {node} is {len(blob)} bytes, expected "
                               f"{HDR.size + count * self.per} for {count} entries")
        end = HDR.size + count * self.id_dtype.itemsize
        ids = np.frombuffer(blob, dtype=self.id_dtype, count=count, offset=HDR.size)
        if count and (int(ids.min()) < 0 or int(ids.max()) >= self.n):
            raise GraphCorrupt(f"{self.what} of node {node} holds ids outside [0, {self.n})")
        if self.first_is_self and (count == 0 or int(ids[0]) != node):
            raise GraphCorrupt(f"{self.what} of node {node} does not start with the node itself")
        ex = np.frombuffer(blob, dtype=self.extra, count=count, offset=end) if self.extra is not None else None
        if ex is not None and not bool(np.isfinite(ex).all()):
            raise GraphCorrupt(f"{self.what} of node {node} holds NaN or infinite values")
        return ids, ex



def encode_degrees(first: int, lengths: np.ndarray, wsums: np.ndarray | None) -> bytes:
    """The degree blob of nodes ``first .. first + len(lengths) - 1``."""
    n = len(lengths)
    return (HDR.pack(b"gd", VER, 2 * (wsums is not None), n, first) + np.ascontiguousarray(lengths, dtype="<u4").tobytes()
            + (np.ascontiguousarray(wsums, dtype="<f8").tobytes() if wsums is not None else b""))


def decode_degrees(chunk: int, first: int, count: int, weighted: bool, num_nodes: int,
                   blob: bytes) -> tuple[np.ndarray, np.ndarray | None]:
    """``(row lengths int64 [count], weight sums float64 [count] or None)`` of degree chunk ``chunk``
    (nodes ``first .. first + count - 1``), checked; :class:`GraphCorrupt` on any mismatch."""
    what = f"degree chunk {chunk}"
    if len(blob) < HDR.size:
        raise GraphCorrupt(f"{what} is {len(blob)} bytes, shorter than its header")
    magic, ver, flags, n, who = HDR.unpack_from(blob)
    if magic != b"gd" or ver != VER or flags != 2 * weighted:
        raise GraphCorrupt(f"{what} has header {magic!r}/v{ver}/flags {flags}, expected b'gd'/v{VER}/flags {2 * weighted}")
    if who != first or n != count:
        raise GraphCorrupt(f"{what} holds nodes {who} .. {who + n - 1}, expected {first} .. {first + count - 1} "
                           "(misplaced key)")
    if len(blob) != HDR.size + count * (4 + 8 * weighted):
        raise GraphCorrupt(f"{what} is {len(blob)} bytes, expected {HDR.size + count * (4 + 8 * weighted)}")
    lengths = np.frombuffer(blob, dtype="<u4", count=count, offset=HDR.size).astype(np.int64)
    if count and int(lengths.max()) >= max(num_nodes, 1):
        raise GraphCorrupt(f"{what} holds a row length above the node count {num_nodes}")
    if not weighted:
        return lengths, None
    wsums = np.frombuffer(blob, dtype="<f8", count=count, offset=HDR.size + 4 * count).copy()
    if not bool(np.isfinite(wsums).all()):
        raise GraphCorrupt(f"{what} holds NaN or infinite weight sums")
    return lengths, wsums


def chunk_blobs(graph: Any, ppr: dict[str, tuple[Any, str]], a: int, b: int, idt: np.dtype,
                degree_chunk: int = 0) -> list[tuple[str, np.ndarray, list[bytes]]]:
    """``[(part, ids, blobs)]`` of nodes ``a .. b-1``: adjacency, then each PPR config, then (with
    ``degree_chunk``, which must be ``b - a`` but for the last chunk, and ``a`` a multiple of it) the
    one degree blob of chunk ``a // degree_chunk``."""
    big = int(idt.itemsize == 8)
    nodes = np.arange(a, b, dtype=np.int64)
    lo, hi = int(graph.indptr[a]), int(graph.indptr[b])
    ptr = np.asarray(graph.indptr[a : b + 1], dtype=np.int64) - lo
    ids = np.ascontiguousarray(graph.indices[lo:hi], dtype=idt)
    w = np.ascontiguousarray(graph.weights[lo:hi], dtype="<f4") if graph.weights is not None else None
    out = [("a", nodes, encode_rows(b"ga", big | (2 * (w is not None)), a, ptr, ids, w))]
    for ck, (idx, scores) in ppr.items():
        plo, phi = int(idx.ptr[a]), int(idx.ptr[b])
        pp = np.asarray(idx.ptr[a : b + 1], dtype=np.int64) - plo
        pn = np.ascontiguousarray(idx.nodes[plo:phi], dtype=idt)
        code = SCORE_CODES[scores]
        ps = np.ascontiguousarray(idx.scores[plo:phi], dtype=SCORE_DTYPES[code]) if code else None
        out.append((f"p:{ck}", nodes, encode_rows(b"gp", big | (code << 1), a, pp, pn, ps)))
    if degree_chunk:
        if a % degree_chunk:
            raise ValueError(f"chunk {a}..{b} does not start on a degree chunk of {degree_chunk} nodes")
        # summed as models.base.full_gcn_degrees sums them in memory (bincount, float64), to the bit
        wsums = (np.bincount(np.repeat(np.arange(b - a), np.diff(ptr)), weights=w, minlength=b - a)
                 if w is not None else None)
        out.append(("d", np.array([a // degree_chunk], dtype=np.int64), [encode_degrees(a, np.diff(ptr), wsums)]))
    return out
