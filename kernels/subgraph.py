r"""Batched node-induced subgraphs and the L-hop scope.

Node lists travel CSR-shaped (see ``docs/ARCHITECTURE.md``): ``ptr`` int64 ``[B + 1]`` and ``nodes``
int64 ``[ptr[-1]]``; list ``b`` is ``nodes[ptr[b]:ptr[b + 1]]`` and its first entry is target ``b``.
Lists come from the PPR top-K index (:mod:`kernels.ppr`) or from :func:`lhop_nodes`.

:func:`induced_batch` turns B lists into one block-diagonal CSR (a :class:`SubgraphBatch`): with
``V_b`` the node list of subgraph ``b`` (``n_b = |V_b|`` rows, local ids ``0 .. n_b - 1`` in list
order) and ``A`` the adjacency of the stored graph,

.. math::

    A^{batch} = \operatorname{diag}(A[V_0, V_0], A[V_1, V_1], \dots, A[V_{B-1}, V_{B-1}]),

rows ``ptr[b] .. ptr[b+1]-1`` belong to subgraph ``b``; row ``r`` keeps the out-edges of global
node ``node_ids[r]`` whose destination is also in ``V_b`` (with their weights), columns sorted
inside every row. The same global node may appear in several subgraphs (once per subgraph); the
batch also carries the sorted distinct ids ``unique_ids`` and ``row_to_unique`` so that features
are fetched once per batch: ``x_rows = x_unique[row_to_unique]``.

Virtual nodes. A node that is not in the stored graph (a node added after the graph and its PPR
index were built) gets a *virtual id* ``N, N + 1, ...`` (``N = graph.num_nodes``); its edges are
given as an :class:`ExtraEdges` and passed as ``induced_batch(..., extra=...)``. The stored graph
is neither copied nor modified: the kernel reads the extra edges next to the CSR rows. Every
extra edge must touch a virtual node (edges between stored nodes belong in the stored graph).
:func:`kernels.ppr.ppr_new_node` returns the PPR list of such a node with virtual id ``N`` first.

Algorithms (numba, compiled once and cached on disk; ``nogil`` so server threads run in parallel):

* induced rows: a row scans its neighbour list, O(deg), looking each neighbour up among the list's
  members; a row whose degree exceeds ``32 n_b`` binary-searches each of the ``n_b`` members in its
  (sorted) neighbour list instead, O(n_b log deg), so hubs stay cheap. The lookup: on graphs under
  ``_HASHED_MIN_NODES`` nodes a per-graph tagged scratch ``tag[N]`` (int64) maps a global id to its
  local id in the current subgraph: ``tag[v] = (epoch << 32) | k`` is current only while ``epoch``
  is the subgraph's own number, so the scratch is never cleared (a fresh epoch per subgraph) and the
  hot loop is one load and no branch per edge. On larger graphs those random reads of an ``[N]``
  array miss the cache (80 MB at 10 M nodes): each list gets an open-addressing map of its members
  and a bit filter of ``64 x`` its map's slots, both in L1; a neighbour outside the list (most of
  them) costs one filter load and a branch almost never taken.
* a new node's (virtual) edges: a stored row's extra edges all lead to virtual nodes, and the list's
  own virtual members (usually one) are searched in them; a row shared by many new nodes' lists is
  never scanned whole in each.
* dedupe: a fresh epoch numbers the distinct ids in first-seen order (O(R)); NumPy then sorts
  the ``U`` distinct ids and maps rows through the inverse permutation (O(U log U)).
* precomputed lists (:class:`InducedTable`): the rows above scan every member's neighbour list,
  and PPR lists are full of hubs (on Amazon Computers the rows of 64 top-64 lists have a mean
  degree of about 195 against the graph's 36), so a batch costs far more than the edges it keeps.
  When the lists come from a fixed index, the induced subgraph of every node's list is computed
  once offline; a batch then copies each target's stored edges, dropping those outside a shorter
  prefix, and only the dedupe remains.
* L-hop: breadth-first search per target, one epoch per target as its visited set.

Scratch arrays are kept in a small pool on the graph's cache (one per concurrent caller), so no
call allocates O(N) memory after the first.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from .graph import CSRGraph

__all__ = ["BuildStopped", "ExtraEdges", "InducedTable", "SubgraphBatch", "in_global_order", "induced_batch", "lhop_nodes",
           "local_csr", "new_node_scopes"]

_SCRATCH_KEY = "_subgraph_scratch_pool"
_SCRATCH_LOCK = threading.Lock()
_SCRATCH_KEEP = 8  # scratch arrays kept per graph (one is used per concurrent call)
_HUB_FACTOR = 32  # a row with degree > _HUB_FACTOR * n_b searches members in it instead
_EPOCH_LIMIT = (1 << 31) - 1
_LOW = (1 << 32) - 1
#: from this many nodes a list's members are looked up in a map and filter of the list's own (:func:`_members`),
#: below in the tagged ``[N]`` scratch: the scratch's random reads stay in cache on small graphs (one load, no branch:
#: 1.1x-1.4x faster than the map on Coauthor Physics, Amazon Computers, Cora) and miss it on large ones (the map
#: 1.04x-1.06x at 100,000 synthetic product-graph nodes, 1.2x-1.3x at 250,000, 2.4x-2.5x at 1 M, 2.5x-2.8x at
#: 2 M and 10 M; docs/BENCHMARKS.md, "Induced subgraphs on large graphs")
_HASHED_MIN_NODES = 1 << 17


# ============================================================================ data types
@dataclass(eq=False)
class SubgraphBatch:
    """Block-diagonal union of per-target induced subgraphs (field table in docs/ARCHITECTURE.md).

    Attributes:
        graph: :class:`CSRGraph` with ``R`` rows and local ids; rows of subgraph ``b`` are
            ``ptr[b]:ptr[b+1]`` and its edges never leave that block.
        node_ids: int64 ``[R]``, global id of each row (virtual ids ``>= N`` for nodes given
            through :class:`ExtraEdges`).
        ptr: int64 ``[B + 1]``, row range of each subgraph.
        target_rows: int64 ``[B]``, row of each target (``== ptr[:-1]``).
        unique_ids: int64 ``[U]``, sorted distinct ``node_ids``.
        row_to_unique: int64 ``[R]``, ``node_ids == unique_ids[row_to_unique]``.
    """

    graph: CSRGraph
    node_ids: np.ndarray
    ptr: np.ndarray
    target_rows: np.ndarray
    unique_ids: np.ndarray
    row_to_unique: np.ndarray

    @property
    def num_subgraphs(self) -> int:
        """``B``."""
        return len(self.ptr) - 1

    @property
    def num_rows(self) -> int:
        """``R`` (sum of the subgraph sizes)."""
        return len(self.node_ids)

    def sizes(self) -> np.ndarray:
        """Rows per subgraph, int64 ``[B]``."""
        return np.diff(self.ptr)

    def edge_counts(self, width: int | None) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``([B], [B])``: per subgraph, the edges its rows keep at sampling ``width`` (a row of
        degree ``d`` keeps ``min(d, width)``; all with ``width`` 0 / ``None``) and all its edges."""
        return _edge_counts(self.graph.indptr, np.asarray(self.ptr, dtype=np.int64), int(width or 0))

    def subgraph(self, b: int) -> CSRGraph:
        """Subgraph ``b`` alone as a :class:`CSRGraph` with local ids ``0 .. n_b - 1`` (a copy)."""
        lo, hi = int(self.ptr[b]), int(self.ptr[b + 1])
        ip = self.graph.indptr[lo : hi + 1]
        e0, e1 = int(ip[0]), int(ip[-1])
        w = None if self.graph.weights is None else self.graph.weights[e0:e1].copy()
        return CSRGraph(
            indptr=(ip - e0).astype(np.int64),
            indices=(self.graph.indices[e0:e1].astype(np.int64) - lo),
            weights=w,
            num_nodes=hi - lo,
        )


@numba.njit(cache=True, nogil=True)
def _edge_counts(indptr, ptr, width):  # pragma: no cover - compiled
    b = ptr.shape[0] - 1
    kept = np.zeros(b, dtype=np.int64)
    total = np.zeros(b, dtype=np.int64)
    for s in range(b):
        for r in range(ptr[s], ptr[s + 1]):
            d = indptr[r + 1] - indptr[r]
            total[s] += d
            kept[s] += d if width <= 0 or d <= width else width
    return kept, total


@dataclass(eq=False)
class ExtraEdges:
    """Directed edges of virtual nodes (ids ``N .. N + num_virtual - 1``) that the stored graph lacks.

    Build with :meth:`for_new_node` or :meth:`from_edges`; the constructor-level arrays are
    canonical: sorted by (src, dst), duplicates merged (weights summed), every edge touching a
    virtual node.

    Attributes:
        num_nodes: ``N`` of the stored graph these edges extend.
        num_virtual: number of virtual ids.
        src, dst: int64 ``[M]``.
        weights: float32 ``[M]`` or ``None`` (all 1).
    """

    num_nodes: int
    num_virtual: int
    src: np.ndarray
    dst: np.ndarray
    weights: np.ndarray | None = None

    @classmethod
    def from_edges(
        cls,
        num_nodes: int,
        src: np.ndarray,
        dst: np.ndarray,
        weights: np.ndarray | None = None,
        *,
        num_virtual: int | None = None,
    ) -> ExtraEdges:
        """Validate and canonicalise an edge list; ``num_virtual`` defaults to the largest id used."""
        src = np.asarray(src, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst, dtype=np.int64).reshape(-1)
        if src.shape != dst.shape:
            raise ValueError(f"src and dst must have one length, got {src.shape} and {dst.shape}")
        w = None if weights is None else np.asarray(weights, dtype=np.float32).reshape(-1)
        if w is not None and w.shape != src.shape:
            raise ValueError(f"weights must have the length of src ({len(src)}), got {w.shape}")
        if w is not None and not np.all(np.isfinite(w)):
            raise ValueError("extra edge weights must be finite")
        n = int(num_nodes)
        top = int(max(src.max(initial=n - 1), dst.max(initial=n - 1)))
        nv = top - n + 1 if num_virtual is None else int(num_virtual)
        if nv < 0:
            raise ValueError(f"num_virtual must be >= 0, got {nv}")
        if len(src) and (min(int(src.min()), int(dst.min())) < 0 or top >= n + nv):
            raise ValueError(f"extra edge ids must lie in [0, {n + nv}) (N = {n}, {nv} virtual ids)")
        if np.any((src < n) & (dst < n)):
            raise ValueError("every extra edge must touch a virtual node (id >= num_nodes)")
        order = np.lexsort((dst, src))
        src, dst = src[order], dst[order]
        if w is not None:
            w = w[order]
        if len(src) > 1:
            new = np.ones(len(src), dtype=bool)
            new[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
            if not new.all():
                grp = np.cumsum(new) - 1
                if w is not None:
                    w = np.bincount(grp, weights=w).astype(np.float32)
                src, dst = src[new], dst[new]
        return cls(num_nodes=n, num_virtual=nv, src=src, dst=dst, weights=w)

    @classmethod
    def for_new_node(
        cls,
        num_nodes: int,
        neighbors: np.ndarray | Sequence[int],
        weights: np.ndarray | Sequence[float] | None = None,
        *,
        virtual_id: int | None = None,
        bidirectional: bool = True,
    ) -> ExtraEdges:
        """Edges of one new node ``virtual_id`` (default ``N``) to existing ``neighbors``.

        ``bidirectional=True`` (the right choice for a symmetric graph) also adds each reverse
        edge ``neighbor -> virtual_id``; this is the graph :func:`kernels.ppr.ppr_new_node` walks on.
        """
        nb = np.asarray(neighbors, dtype=np.int64).reshape(-1)
        if len(nb) and (int(nb.min()) < 0 or int(nb.max()) >= num_nodes):
            raise ValueError(f"neighbors of a new node must be existing ids in [0, {num_nodes})")
        vid = int(num_nodes) if virtual_id is None else int(virtual_id)
        if vid < num_nodes:
            raise ValueError(f"virtual_id must be >= num_nodes = {num_nodes}, got {vid}")
        w = None if weights is None else np.asarray(weights, dtype=np.float32).reshape(-1)
        me = np.full(len(nb), vid, dtype=np.int64)
        if bidirectional:
            src, dst = np.concatenate([me, nb]), np.concatenate([nb, me])
            w = None if w is None else np.concatenate([w, w])
        else:
            src, dst = me, nb
        return cls.from_edges(num_nodes, src, dst, w, num_virtual=vid - num_nodes + 1)

    def relabelled(self, uniq: np.ndarray) -> ExtraEdges:
        """These edges on the graph of the sorted distinct stored ids ``uniq`` (local id = rank; every stored end
        of an edge must be one of them), the virtual ids following as ``len(uniq) ..``: a monotone map, so the
        canonical order stays."""
        n, u = self.num_nodes, len(uniq)

        def move(ids: np.ndarray) -> np.ndarray:
            out = ids - n + u
            stored = ids < n
            pos = np.searchsorted(uniq, ids[stored])
            if len(pos) and (int(pos.max()) >= u or not np.array_equal(uniq[pos], ids[stored])):
                raise ValueError("every stored end of an extra edge must be one of the given ids")
            out[stored] = pos
            return out

        return ExtraEdges(num_nodes=u, num_virtual=self.num_virtual, src=move(self.src), dst=move(self.dst),
                          weights=self.weights)

    def kernel_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys int64 [S] sorted distinct sources, kptr int64 [S+1], dst int64 [M], w float32 [M])."""
        keys, starts = np.unique(self.src, return_index=True)
        kptr = np.append(starts, len(self.src)).astype(np.int64)
        w = self.weights if self.weights is not None else np.ones(len(self.src), dtype=np.float32)
        return keys.astype(np.int64), kptr, self.dst, w


_NO_I64 = np.zeros(0, dtype=np.int64)
_NO_F32 = np.zeros(0, dtype=np.float32)
_EMPTY_KPTR = np.zeros(1, dtype=np.int64)


# ============================================================================ scratch pool
class _Scratch:
    """Tagged int64 ``[N]`` array: ``tag[v] = (epoch << 32) | local`` is current iff its epoch is."""

    __slots__ = ("epoch", "tag")

    def __init__(self, n: int) -> None:
        # room for the nodes a live graph's updates add (carry_scratch hands it to the edited graph)
        self.tag = np.zeros(max(n, 1) + n // 64 + 1024, dtype=np.int64)
        self.epoch = 0

    def reserve(self, count: int) -> int:
        """First of ``count`` fresh epochs (the array is cleared when epochs would run out)."""
        if self.epoch + count + 1 >= _EPOCH_LIMIT:
            self.tag[:] = 0
            self.epoch = 0
        first = self.epoch + 1
        self.epoch += count
        return first


def _take_scratch(graph: CSRGraph) -> _Scratch:
    with _SCRATCH_LOCK:
        pool = graph.cache().setdefault(_SCRATCH_KEY, [])
        if pool:
            return pool.pop()
    return _Scratch(graph.num_nodes)


def carry_scratch(old: CSRGraph, new: CSRGraph) -> None:
    """Hand ``old``'s idle scratch arrays to ``new``, an edit of it (the same node ids, maybe more): a live
    graph's first batch after each update would otherwise allocate and zero an ``[N]`` array (on a 2 M-node
    graph, 16 MB and a few ms of that batch). Only arrays with room for ``new``'s nodes move; they leave
    ``old``'s pool (a batch still running on ``old`` takes a fresh one or gives its own back there)."""
    with _SCRATCH_LOCK:
        pool = old.cache().get(_SCRATCH_KEY)
        if not pool:
            return
        fits = [sc for sc in pool if len(sc.tag) >= new.num_nodes]
        if fits:
            pool[:] = [sc for sc in pool if len(sc.tag) < new.num_nodes]
            dst = new.cache().setdefault(_SCRATCH_KEY, [])
            dst.extend(fits[: max(0, _SCRATCH_KEEP - len(dst))])


def _give_scratch(graph: CSRGraph, sc: _Scratch) -> None:
    with _SCRATCH_LOCK:
        pool = graph.cache().setdefault(_SCRATCH_KEY, [])
        if len(pool) < _SCRATCH_KEEP:
            pool.append(sc)


# ============================================================================ compiled kernels
@numba.njit(cache=True, nogil=True)
def copy_run(dst, o, src, a, n):  # pragma: no cover - compiled
    """``dst[o:o + n] = src[a:a + n]`` as a loop. The compiled kernels copy arrays with this rather than a
    slice assignment: numba compiles an assignment's shape check with its error message (string
    formatting of both shapes), about 3 s of a first start on the 2-vCPU VM (2026-11-27: one slice
    assignment compiled in 3.8 s against 0.8 s as a loop, in a fresh process); a loop has no check to
    compile. ``tests/test_fused_compiles.py`` holds the start path to that.

    The loop runs over views (slicing has no check to compile) from 0, so LLVM knows no index is negative,
    drops numba's wrap-around of each ``dst[o + i]`` and vectorizes: 2026-11-27, 40 M int32 on the 2-vCPU VM,
    16-19 ms (NumPy's ``b[:] = a`` 15-18 ms) against 44-71 ms indexing ``dst[o + i] = src[a + i]``, and
    0.2 s against 0.8 s to compile. The copy goes forward, element by element, as before, so an overlapping
    copy to a lower offset (the PPR queue's compaction) stays right."""
    d = dst[o:o + n]
    s = src[a:a + n]
    for i in range(n):
        d[i] = s[i]


@numba.njit(cache=True, nogil=True, inline="always")
def _lower_bound(a, lo, hi, v):  # pragma: no cover - compiled
    """The first index of sorted ``a[lo:hi]`` whose value is not below ``v`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True)
def _position(keys, v):  # pragma: no cover - compiled
    """Index of ``v`` in the sorted ``keys``, or -1."""
    a = _lower_bound(keys, 0, keys.shape[0], v)
    return a if a < keys.shape[0] and keys[a] == v else -1


@numba.njit(cache=True, nogil=True)
def _grow(a, need):  # pragma: no cover - compiled
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    copy_run(b, np.int64(0), a, np.int64(0), a.shape[0])  # typed: a literal 0 is a signature of its own
    return b


@numba.njit(cache=True, nogil=True)
def _sort_row(cols, ws, lo, hi, weighted):  # pragma: no cover - compiled
    """Sort cols[lo:hi] ascending (Shell sort, a plain insertion sort for short rows), permuting ws."""
    n = hi - lo
    gap = 1
    while gap < n // 3:
        gap = 3 * gap + 1
    while gap >= 1:
        for i in range(lo + gap, hi):
            c = cols[i]
            w = ws[i] if weighted else np.float32(0)
            j = i - gap
            while j >= lo and cols[j] > c:
                cols[j + gap] = cols[j]
                if weighted:
                    ws[j + gap] = ws[j]
                j -= gap
            cols[j + gap] = c
            if weighted:
                ws[j + gap] = w
        gap //= 3


@numba.njit(cache=True, nogil=True, inline="always")
def _mix(key):  # pragma: no cover - compiled
    """Fibonacci hashing's product: its high bits are the hash."""
    return np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True)
def _hash_slot(key, mask):  # pragma: no cover - compiled
    return np.int64((_mix(key) >> np.uint64(29)) & np.uint64(mask))


@numba.njit(cache=True, nogil=True)
def _find(keys, v):  # pragma: no cover - compiled
    """The position of ``v`` in the open-addressing map ``keys`` (-1 = free): where it is, or the free position it
    would take."""
    mask = keys.shape[0] - 1
    h = _hash_slot(v, mask)
    while keys[h] != -1 and keys[h] != v:
        h = (h + 1) & mask
    return h


@numba.njit(cache=True, nogil=True, inline="always")
def _slots_for(m):  # pragma: no cover - compiled
    """The map size of a list of ``m`` ids: a power of two from ``2 m`` (at most half full), at least 16."""
    c = 16
    while c < 2 * m:
        c *= 2
    return c


@numba.njit(cache=True, nogil=True)
def _longest(ptr):  # pragma: no cover - compiled
    """The length of the longest list of ``ptr``."""
    m = 0
    for b in range(ptr.shape[0] - 1):
        m = max(m, ptr[b + 1] - ptr[b])
    return m


@numba.njit(cache=True, nogil=True)
def _virtual_members(nodes, off, m, n, vkeys, vpos):  # pragma: no cover - compiled
    """The virtual ids of list ``nodes[off:off + m]`` ascending into ``vkeys``, each with its last position in the
    list (as stored ids: :func:`_members`) in ``vpos``; returns how many."""
    c = 0
    for z in range(m):
        if nodes[off + z] >= n:
            vkeys[c] = nodes[off + z]
            vpos[c] = z
            c += 1
    if c > 1:
        order = np.argsort(vkeys[:c], kind="mergesort")  # stable: a repeated id's last position last
        k = vkeys[:c][order]
        p = vpos[:c][order]
        d = 0
        for i in range(c):
            if i == c - 1 or k[i] != k[i + 1]:
                vkeys[d] = k[i]
                vpos[d] = p[i]
                d += 1
        c = d
    return c


@numba.njit(cache=True, nogil=True, inline="always")
def _filter_bit(x, words):  # pragma: no cover - compiled
    """``(word, bit)`` of hash product ``x`` in a filter of ``words`` 64-bit words (a power of two)."""
    return np.int64((x >> np.uint64(40)) & np.uint64(words - 1)), (x >> np.uint64(34)) & np.uint64(63)


@numba.njit(cache=True, nogil=True, inline="always")
def _members(nodes, off, m, n, hashed, tag, ep, keys, vals, bits):  # pragma: no cover - compiled
    """Record list ``nodes[off:off + m]``'s stored ids for :func:`_local` (a repeated id: its last position).

    ``hashed``: in a map of :func:`_slots_for` ``m`` slots at the front of ``keys``/``vals`` and a filter of as many
    64-bit words at the front of ``bits``, returned; else in the tagged scratch ``tag`` under epoch ``ep`` (and
    empty views returned)."""
    if not hashed:
        hi_tag = ep << 32
        for k in range(m):
            v = nodes[off + k]
            if v < n:
                tag[v] = hi_tag | k
        return keys[:0], vals[:0], bits[:0]
    c = _slots_for(m)
    hk = keys[:c]
    hv = vals[:c]
    fl = bits[:c]
    for i in range(c):
        hk[i] = -1
        fl[i] = 0
    for k in range(m):
        v = nodes[off + k]
        if v < n:
            h = _find(hk, v)
            hk[h] = v
            hv[h] = k
            w, bit = _filter_bit(_mix(v), c)
            fl[w] |= np.uint64(1) << bit
    return hk, hv, fl


@numba.njit(cache=True, nogil=True, inline="always")
def _local(v, hashed, tag, ep, hk, hv, fl):  # pragma: no cover - compiled
    """The position of stored id ``v`` in the list :func:`_members` recorded, or -1. Hashed, the filter answers most
    ids that are not in the list with one load from a small array and a branch rarely taken; the map's probe loop
    runs only for the rest."""
    if not hashed:
        t = tag[v]
        return (t & np.int64(_LOW)) if (t >> 32) == ep else np.int64(-1)
    w, bit = _filter_bit(_mix(v), fl.shape[0])
    if ((fl[w] >> bit) & np.uint64(1)) == 0:
        return np.int64(-1)
    h = _find(hk, v)
    return hv[h] if hk[h] == v else np.int64(-1)


@numba.njit(cache=True, nogil=True)
def _induced_kernel(
    indptr, indices, weights, n, ptr, nodes, tag, epoch0, ex_keys, ex_ptr, ex_dst, ex_w, nvirt, weighted, inner,
    hashed,
):  # pragma: no cover - compiled
    """Block-diagonal induced CSR plus the batch dedupe (see the module docstring).

    ``tag`` is the tagged scratch: list ``b``'s members are recorded there under epoch ``epoch0 + b`` unless
    ``hashed`` (then in a map and filter of its own, :func:`_members`), the dedupe numbers ids under ``epoch0 + B``.
    ``inner`` (``[B]``, or empty for every row): list ``b``'s rows from ``inner[b]`` on get
    no edges. Returns (row_ptr int64 [R+1], cols int32 [nnz], ws float32 [nnz or 0],
    first_seen int64 [U] distinct ids in first-seen order, row_to_first int64 [R] with
    ``nodes == first_seen[row_to_first]``); the caller sorts the ``U`` ids.
    """
    R = nodes.shape[0]
    B = ptr.shape[0] - 1
    has_w = weights.shape[0] > 0
    has_extra = ex_keys.shape[0] > 0
    has_inner = inner.shape[0] > 0
    low = np.int64(_LOW)
    one = np.float32(1.0)
    row_ptr = np.zeros(R + 1, dtype=np.int64)
    cols = np.empty(max(16, 8 * R), dtype=np.int32)
    ws = np.empty(cols.shape[0] if weighted else 0, dtype=np.float32)
    longest = _longest(ptr)
    slots = _slots_for(longest) if hashed else 0
    keys = np.empty(slots, dtype=np.int64)
    vals = np.empty(slots, dtype=np.int64)
    bits = np.empty(slots, dtype=np.uint64)
    vkeys = np.empty(longest if has_extra else 0, dtype=np.int64)  # a list's virtual ids, ascending
    vpos = np.empty(vkeys.shape[0], dtype=np.int64)  # and their positions in it
    nnz = 0
    for b in range(B):
        off = ptr[b]
        m = ptr[b + 1] - off
        ep = np.int64(epoch0 + b)
        hk, hv, fl = _members(nodes, off, m, n, hashed, tag, ep, keys, vals, bits)
        nvb = _virtual_members(nodes, off, m, n, vkeys, vpos) if has_extra else 0
        lim = inner[b] if has_inner else m
        for k in range(m):
            u = nodes[off + k]
            row = off + k
            start = nnz
            if k >= lim:  # a row read as an input only
                row_ptr[row + 1] = nnz
                continue
            if u < n:
                lo = indptr[u]
                hi = indptr[u + 1]
                deg = hi - lo
                cap = nnz + min(deg, m) + 1
                if cap > cols.shape[0]:
                    cols = _grow(cols, cap)
                    if weighted:
                        ws = _grow(ws, cols.shape[0])
                if deg > _HUB_FACTOR * m:
                    # hub row: look every member up in the sorted neighbour list (columns come sorted)
                    for q in range(m):
                        v = nodes[off + q]
                        if v >= n or _local(v, hashed, tag, ep, hk, hv, fl) != q:  # a repeated id: its last position only
                            continue
                        a = _lower_bound(indices, lo, hi, v)
                        if a < hi and indices[a] == v:
                            cols[nnz] = off + q
                            if weighted:
                                ws[nnz] = weights[a] if has_w else one
                            nnz += 1
                elif hashed:  # few neighbours are members: a branch rarely taken beats a store per edge
                    for e in range(lo, hi):
                        q = _local(indices[e], hashed, tag, ep, hk, hv, fl)
                        if q >= 0:
                            cols[nnz] = off + q
                            if weighted:
                                ws[nnz] = weights[e] if has_w else one
                            nnz += 1
                elif weighted:  # branch-free: on a graph whose tags stay in cache many neighbours are members
                    for e in range(lo, hi):
                        t = tag[indices[e]]
                        cols[nnz] = off + (t & low)
                        ws[nnz] = weights[e] if has_w else one
                        nnz += (t >> 32) == ep
                else:
                    for e in range(lo, hi):
                        t = tag[indices[e]]
                        cols[nnz] = off + (t & low)
                        nnz += (t >> 32) == ep
            if has_extra:
                s = _position(ex_keys, u)
                if s >= 0:
                    e0 = ex_ptr[s]
                    e1 = ex_ptr[s + 1]
                    if nnz + (e1 - e0) > cols.shape[0]:
                        cols = _grow(cols, nnz + (e1 - e0))
                        if weighted:
                            ws = _grow(ws, cols.shape[0])
                    if u < n:
                        # a stored row's extra edges all lead to virtual nodes: look the list's up in them (a
                        # neighbour that many new nodes share has an extra edge per new node; scanning them all
                        # in each new node's list cost a batch time quadratic in its new nodes)
                        for i in range(nvb):
                            e = _lower_bound(ex_dst, e0, e1, vkeys[i])
                            if e < e1 and ex_dst[e] == vkeys[i]:
                                cols[nnz] = off + vpos[i]
                                if weighted:
                                    ws[nnz] = ex_w[e]
                                nnz += 1
                    else:
                        for e in range(e0, e1):
                            v = ex_dst[e]
                            if v < n:
                                q = _local(v, hashed, tag, ep, hk, hv, fl)
                            else:
                                i = _lower_bound(vkeys, 0, nvb, v)
                                q = vpos[i] if i < nvb and vkeys[i] == v else -1
                            if q >= 0:
                                cols[nnz] = off + q
                                if weighted:
                                    ws[nnz] = ex_w[e]
                                nnz += 1
            _sort_row(cols, ws, start, nnz, weighted)
            row_ptr[row + 1] = nnz

    uniq, r2u = _dedupe_kernel(nodes, n, tag, np.int64(epoch0 + B), nvirt)
    return row_ptr, cols[:nnz], ws[:nnz], uniq, r2u


@numba.njit(cache=True, nogil=True)
def _dedupe_kernel(nodes, n, tag, ep, nvirt):  # pragma: no cover - compiled
    """Number the global ids of a batch in first-seen order with epoch ``ep`` of the scratch.

    Returns (first_seen int64 [U], row_to_first int64 [R]); the caller sorts the ``U`` ids.
    """
    R = nodes.shape[0]
    low = np.int64(_LOW)
    hi_tag = ep << 32
    uniq = np.empty(R, dtype=np.int64)
    vseen = np.empty(nvirt, dtype=np.int64)
    for i in range(nvirt):
        vseen[i] = -1
    cnt = 0
    for r in range(R):
        v = nodes[r]
        if v < n:
            if (tag[v] >> 32) == ep:
                continue
            tag[v] = hi_tag | cnt
        else:
            if vseen[v - n] >= 0:
                continue
            vseen[v - n] = cnt
        uniq[cnt] = v
        cnt += 1
    r2u = np.empty(R, dtype=np.int64)
    for r in range(R):
        v = nodes[r]
        r2u[r] = (tag[v] & low) if v < n else vseen[v - n]
    return uniq[:cnt], r2u


@numba.njit(cache=True, nogil=True)
def _table_kernel(
    eptr, esrc, edst, ew, weighted, targets, ptr, nodes, n, tag, ep
):  # pragma: no cover - compiled
    """Block-diagonal batch from precomputed per-target induced edges (see :class:`InducedTable`).

    Target ``b``'s list is ``nodes[ptr[b]:ptr[b+1]]`` (``m_b`` entries, a prefix of the list the
    table was built from); its stored local edges ``(i, j)`` are in row-major order, so keeping
    those with ``i < m_b`` and ``j < m_b`` yields the rows of the prefix's induced subgraph in
    order. Returns what :func:`_induced_kernel` returns.
    """
    R = nodes.shape[0]
    B = ptr.shape[0] - 1
    total = 0
    for b in range(B):
        t = targets[b]
        total += eptr[t + 1] - eptr[t]
    row_ptr = np.zeros(R + 1, dtype=np.int64)
    cols = np.empty(total, dtype=np.int32)
    ws = np.empty(total if weighted else 0, dtype=np.float32)
    nnz = 0
    for b in range(B):
        t = targets[b]
        off = ptr[b]
        m = ptr[b + 1] - off
        for e in range(eptr[t], eptr[t + 1]):
            i = np.int64(esrc[e])
            j = np.int64(edst[e])
            if i < m and j < m:
                cols[nnz] = off + j
                if weighted:
                    ws[nnz] = ew[e]
                nnz += 1
                row_ptr[off + i + 1] += 1
    for r in range(R):
        row_ptr[r + 1] += row_ptr[r]
    uniq, r2u = _dedupe_kernel(nodes, n, tag, ep, 0)
    return row_ptr, cols[:nnz], ws[:nnz], uniq, r2u


@numba.njit(cache=True, nogil=True)
def _splitmix64(x):  # pragma: no cover - compiled
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _lhop_kernel(indptr, indices, targets, hops, fanouts, seed, tag, epoch0):  # pragma: no cover - compiled
    """Per-target BFS up to ``hops`` hops; ``fanouts[h] > 0`` caps the neighbours expanded per node.

    Target ``b`` uses epoch ``epoch0 + b`` of the tagged scratch as its visited set.
    Returns (ptr int64 [B+1], nodes int64 [total]); each list is in BFS discovery order, target first.
    """
    B = targets.shape[0]
    out_ptr = np.zeros(B + 1, dtype=np.int64)
    out = np.empty(max(16, 16 * B), dtype=np.int64)
    fmax = 1
    for h in range(hops):
        fmax = max(fmax, fanouts[h])
    chosen = np.empty(fmax, dtype=np.int64)
    pos = 0
    for b in range(B):
        t = targets[b]
        ep = np.int64(epoch0 + b)
        if pos + 1 > out.shape[0]:
            out = _grow(out, pos + 1)
        out[pos] = t
        tag[t] = ep << 32
        pos += 1
        fstart = pos - 1
        fend = pos
        for h in range(hops):
            f = fanouts[h]
            for i in range(fstart, fend):
                u = out[i]
                lo = indptr[u]
                d = indptr[u + 1] - lo
                take = d if (f <= 0 or d <= f) else f
                if pos + take > out.shape[0]:
                    out = _grow(out, pos + take)
                if take == d:
                    for e in range(lo, lo + d):
                        v = indices[e]
                        if (tag[v] >> 32) != ep:
                            tag[v] = ep << 32
                            out[pos] = v
                            pos += 1
                else:
                    # Floyd's sampling of `take` distinct positions out of d, seeded by (seed, t, u)
                    state = _splitmix64(
                        np.uint64(seed) ^ (np.uint64(t) * np.uint64(0x9E3779B97F4A7C15))
                    ) ^ np.uint64(u)
                    c = 0
                    for j in range(d - take, d):
                        state = _splitmix64(state)
                        r = np.int64(state % np.uint64(j + 1))
                        dup = False
                        for z in range(c):
                            if chosen[z] == r:
                                dup = True
                                break
                        chosen[c] = j if dup else r
                        c += 1
                    for z in range(c):
                        v = indices[lo + chosen[z]]
                        if (tag[v] >> 32) != ep:
                            tag[v] = ep << 32
                            out[pos] = v
                            pos += 1
            fstart = fend
            fend = pos
            if fstart == fend:
                break
        out_ptr[b + 1] = pos
    return out_ptr, out[:pos]


# ============================================================================ public API
#: :func:`local_csr` maps a global id to its rank through a dense ``int32`` table of ``uniq[-1] + 1`` entries
#: when that is at most this many, or ``_LOCAL_DENSE_PER_NODE`` per node of ``uniq`` (a few MiB at the most),
#: else through an open-addressing hash table of about 2-4 entries per node. On the 2-vCPU VM
#: (2026-11-28, 400k columns over 10k nodes) the dense table took 1.1 ms, the hash table 1.4 ms and
#: ``np.searchsorted`` with its mask and bincount, what the replica did before, 37 ms.
_LOCAL_DENSE_MIN = 1 << 20
_LOCAL_DENSE_PER_NODE = 32
_FIB = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True)
def _local_csr_kernel(uniq, lens, cols, ws, weighted, dense):  # pragma: no cover - compiled
    """Rows ``cols`` (row ``r`` holds ``lens[r]`` global ids, rows in ``uniq``'s order) restricted to the sorted
    distinct ``uniq`` and relabelled by rank: ``(indptr, indices, kept weights, weight sums)``; each row's
    weight sum is float64, added in the row's order (every column, kept or not)."""
    u = uniq.shape[0]
    top = uniq[u - 1] + 1 if u else 0
    if dense:
        table = np.full(top, -1, dtype=np.int32)
        for i in range(u):
            table[uniq[i]] = i
        keys = np.zeros(0, dtype=np.int64)
        shift = np.uint64(0)
        mask = 0
    else:
        bits = 4
        while (1 << bits) < 2 * u:
            bits += 1
        mask = (1 << bits) - 1
        shift = np.uint64(64 - bits)
        keys = np.full(mask + 1, -1, dtype=np.int64)
        table = np.empty(mask + 1, dtype=np.int32)
        for i in range(u):
            k = uniq[i]
            h = np.int64((np.uint64(k) * _FIB) >> shift)
            while keys[h] != -1:
                h = (h + 1) & mask
            keys[h] = k
            table[h] = i
    m = cols.shape[0]
    indptr = np.zeros(u + 1, dtype=np.int64)
    indices = np.empty(m, dtype=np.int32)
    kept_w = np.empty(m if weighted else 0, dtype=np.float32)
    wsum = np.empty(u, dtype=np.float64)
    e = 0
    o = 0
    for r in range(u):
        s = 0.0
        for j in range(e, e + lens[r]):
            k = cols[j]
            if weighted:
                s += np.float64(ws[j])
            at = -1
            if k >= 0 and k < top:
                if dense:
                    at = table[k]
                else:
                    h = np.int64((np.uint64(k) * _FIB) >> shift)
                    while True:
                        kk = keys[h]
                        if kk == k:
                            at = table[h]
                            break
                        if kk == -1:
                            break
                        h = (h + 1) & mask
            if at >= 0:
                indices[o] = at
                if weighted:
                    kept_w[o] = ws[j]
                o += 1
        wsum[r] = s if weighted else np.float64(lens[r])
        e += lens[r]
        indptr[r + 1] = o
    return indptr, indices[:o], kept_w[:o], wsum


def local_csr(uniq: np.ndarray, lens: np.ndarray, cols: np.ndarray,
              weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """The graph of the rows of ``uniq`` (sorted distinct global ids; row ``r`` is ``cols[sum(lens[:r]):]
    [:lens[r]]``, with ``weights`` alongside when given) restricted to ``uniq`` and relabelled by rank.

    Returns ``(indptr int64 [U + 1], indices int32, kept weights float32 or None, sums float64 [U])``:
    rank order is monotone, so a row that was sorted stays sorted; ``sums`` is each row's weight sum over
    all its columns, kept or not (its length without ``weights``), added in the row's order as
    :func:`kernels.ppr_push._row_sums` and ``models.base.full_gcn_degrees`` add it. One pass over the
    columns, each looked up in a table of ``uniq`` (dense, or hashed for ids spread far beyond ``U``)
    instead of a binary search."""
    uniq = np.ascontiguousarray(uniq, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    if int(lens.sum()) != len(cols) or len(lens) != len(uniq):
        raise ValueError(f"{len(uniq)} rows with lengths adding up to {int(lens.sum())}, and {len(cols)} columns")
    weighted = weights is not None
    ws = np.ascontiguousarray(weights, dtype=np.float32) if weighted else _NO_F32
    if weighted and len(ws) != len(cols):
        raise ValueError(f"{len(ws)} weights for {len(cols)} columns")
    top = int(uniq[-1]) + 1 if len(uniq) else 0
    dense = top <= max(_LOCAL_DENSE_MIN, _LOCAL_DENSE_PER_NODE * len(uniq))
    indptr, indices, kept, sums = _local_csr_kernel(uniq, lens, cols, ws, weighted, dense)
    return indptr, indices, (kept if weighted else None), sums


def _check_lists(ptr: np.ndarray, nodes: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.ascontiguousarray(ptr, dtype=np.int64)
    nodes = np.ascontiguousarray(nodes, dtype=np.int64)
    if ptr.ndim != 1 or len(ptr) < 1 or nodes.ndim != 1:
        raise ValueError(f"ptr must be int64 [B + 1] and nodes int64 [R], got {ptr.shape} and {nodes.shape}")
    if int(ptr[0]) != 0 or int(ptr[-1]) != len(nodes):
        raise ValueError(
            f"ptr must run from 0 to len(nodes) = {len(nodes)}, got {int(ptr[0])}..{int(ptr[-1])}"
        )
    if len(ptr) > 1 and int(np.diff(ptr).min()) < 1:
        raise ValueError("every node list needs at least its target (ptr must be strictly increasing)")
    if len(nodes) and (int(nodes.min()) < 0 or int(nodes.max()) >= limit):
        raise ValueError(f"node ids must lie in [0, {limit}), found {int(nodes.min())} .. {int(nodes.max())}")
    return ptr, nodes


def induced_batch(
    graph: CSRGraph, ptr: np.ndarray, nodes: np.ndarray, *, extra: ExtraEdges | None = None,
    inner: np.ndarray | None = None,
) -> SubgraphBatch:
    """Block-diagonal batch of the subgraphs induced by B node lists (math in the module docstring).

    Args:
        graph: the stored graph (``N`` nodes); never modified.
        ptr: int64 ``[B + 1]``, list boundaries (every list non-empty).
        nodes: int64 ``[R]``; list ``b`` is ``nodes[ptr[b]:ptr[b+1]]``, target first, ids distinct
            within a list (a repeated id gets edges only into its last occurrence).
        extra: edges of virtual nodes ``N ..`` (see :class:`ExtraEdges`); lists may then contain
            those ids. Their rows carry the extra edges; stored rows gain their extra edges too.
        inner: int64 ``[B]``, optional: only the first ``inner[b]`` rows of list ``b`` (1 to its length) get
            their edges; the rest are rows without edges, read as inputs. An L-layer plain model reads the
            aggregated rows of a target's nodes within ``L - 1`` hops only: listed first, the ``L``-th hop's rows
            need no edges, which are most of an L-hop ball's (the target's output is the same, bit for bit).

    Returns:
        A :class:`SubgraphBatch` with ``R`` rows. Edge weights are carried over when the graph or
        ``extra`` is weighted (unweighted edges then weigh 1), otherwise the batch is unweighted.

    Cost: O(sum over rows of min(deg, n_b log deg)) plus O(R + U log U) for the dedupe; no
    Python work per target or edge.
    """
    n = graph.num_nodes
    if extra is not None and extra.num_nodes != n:
        raise ValueError(f"extra edges were built for a graph of {extra.num_nodes} nodes, this one has {n}")
    nvirt = 0 if extra is None else extra.num_virtual
    ptr, nodes = _check_lists(ptr, nodes, n + nvirt)
    if inner is None:
        inner = _NO_I64
    else:
        inner = np.ascontiguousarray(inner, dtype=np.int64)
        if inner.shape != (len(ptr) - 1,) or (len(inner) and (inner.min() < 1 or (inner > np.diff(ptr)).any())):
            raise ValueError("inner: one count per list, from 1 to the list's length")
    if extra is not None and len(extra.src):
        keys, kptr, kdst, kw = extra.kernel_arrays()
        weighted = graph.is_weighted or extra.weights is not None
    else:
        keys, kptr, kdst, kw = _NO_I64, _EMPTY_KPTR, _NO_I64, _NO_F32
        weighted = graph.is_weighted
    w = graph.weights if graph.weights is not None else _NO_F32
    scratch = _take_scratch(graph)
    try:
        epoch0 = scratch.reserve(len(ptr))  # B subgraphs + the dedupe
        args = (graph.indptr, graph.indices, w, n, ptr, nodes, scratch.tag, epoch0)
        row_ptr, cols, ws, first, r2f = _induced_kernel(*args, keys, kptr, kdst, kw, nvirt, weighted, inner,
                                                        n >= _HASHED_MIN_NODES)
    finally:
        _give_scratch(graph, scratch)
    return _assemble(ptr, nodes, row_ptr, cols, ws if weighted else None, first, r2f)


def new_node_scopes(n: int, ends: np.ndarray, ptr: np.ndarray, scope: np.ndarray, iptr: np.ndarray,
                    iscope: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The L-hop node lists of ``J`` new nodes (virtual ids ``n + j``) for :func:`induced_batch`, with the rows
    an L-layer model aggregates first: ``(ptr [J + 1], nodes, inner [J])``, list ``j`` = ``n + j``, then the
    distinct ids of its inner scope (ascending), then the rest of its scope (ascending); ``inner[j]``: 1 + the
    inner scope's size (``induced_batch(..., inner=)``).

    ``ends`` (int64 ``[J]``) counts the neighbours cumulatively: new node ``j``'s are lists ``ends[j - 1]`` (0 for
    the first) to ``ends[j] - 1`` of two CSR-shaped list sets over stored ids, ``(ptr, scope)``, each neighbour's
    nodes within ``L - 1`` hops (the new node's ``L``-hop ball without it), and ``(iptr, iscope)``, within
    ``L - 2`` hops (its inner scope). One sort per new node, no Python loop."""
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    if len(ptr) != len(iptr) or (len(ends) and (ends[0] < 0 or (np.diff(ends) < 0).any() or ends[-1] > len(ptr) - 1)):
        raise ValueError("new_node_scopes: one list of each kind per neighbour, ends cumulative within them")
    return _new_node_scopes_kernel(np.int64(n), ends, np.ascontiguousarray(ptr, dtype=np.int64),
                                   np.ascontiguousarray(scope, dtype=np.int64), np.ascontiguousarray(iptr, dtype=np.int64),
                                   np.ascontiguousarray(iscope, dtype=np.int64))


@numba.njit(cache=True, nogil=True)
def _new_node_scopes_kernel(n, ends, ptr, scope, iptr, iscope):  # pragma: no cover - compiled
    """:func:`new_node_scopes`: each id keyed ``2 id`` in the inner scope, ``2 id + 1`` outside it; after one sort
    an id's first key says which part it belongs to."""
    nj = ends.shape[0]
    out = np.empty(nj + scope.shape[0] + iscope.shape[0], dtype=np.int64)
    optr = np.zeros(nj + 1, dtype=np.int64)
    inner = np.empty(nj, dtype=np.int64)
    pos = 0
    first = 0
    for j in range(nj):
        last = ends[j]
        out[pos] = n + j
        pos += 1
        cnt = (ptr[last] - ptr[first]) + (iptr[last] - iptr[first])
        keys = np.empty(cnt, dtype=np.int64)
        c = 0
        for q in range(iptr[first], iptr[last]):
            keys[c] = 2 * iscope[q]
            c += 1
        for q in range(ptr[first], ptr[last]):
            keys[c] = 2 * scope[q] + 1
            c += 1
        keys.sort()
        for part in range(2):
            prev = -1
            for q in range(cnt):
                v = keys[q] >> 1
                if v != prev:
                    prev = v
                    if (keys[q] & 1) == part:
                        out[pos] = v
                        pos += 1
            if part == 0:
                inner[j] = pos - optr[j]
        optr[j + 1] = pos
        first = last
    return optr, out[:pos], inner


def in_global_order(batch: SubgraphBatch) -> SubgraphBatch:
    """``batch`` with each row's columns in the order of their global ids instead of their local ones:
    the order of the graph's own rows (virtual ids ``N ..`` last, as the ids an update would give those
    nodes). A sampled aggregation picks slots by position in a row, so an L-hop batch in this order
    samples, at every row the target's output reads (a complete row), the neighbours the whole graph's
    forward samples: a plain model's answer at a sampled width is then the full graph's. (A shaDow model
    is defined on its subgraph in list order: not for its batches.)"""
    g = batch.graph
    if g.num_edges == 0:
        return batch
    weighted = g.weights is not None
    cols, ws = _global_order_kernel(g.indptr, np.ascontiguousarray(g.indices, dtype=np.int32),
                                    g.weights if weighted else _NO_F32, weighted,
                                    np.ascontiguousarray(batch.node_ids, dtype=np.int64),
                                    np.ascontiguousarray(batch.ptr, dtype=np.int64))
    sub = CSRGraph(indptr=g.indptr, indices=cols, weights=ws if weighted else None, num_nodes=g.num_nodes)
    return SubgraphBatch(graph=sub, node_ids=batch.node_ids, ptr=batch.ptr, target_rows=batch.target_rows,
                         unique_ids=batch.unique_ids, row_to_unique=batch.row_to_unique)


@numba.njit(cache=True, nogil=True)
def _global_order_kernel(indptr, indices, weights, weighted, node_ids, ptr):  # pragma: no cover - compiled
    """A batch's columns (and weights) with each row in ascending ``node_ids[col]``, in O(R log m + E) without a
    comparison per edge: each list's rows are ranked by global id once (a row's columns lie in its own list, their
    ids distinct), the edges are bucketed by their column's rank, then dealt back to their rows in that order
    (two counting passes). Returns ``(cols, ws)`` (``ws`` empty when not ``weighted``)."""
    R = indptr.shape[0] - 1
    E = indices.shape[0]
    rank = np.empty(R, dtype=np.int64)  # row r's position in its list's global order, as a batch row
    row_at = np.empty(R, dtype=np.int64)  # its inverse
    for b in range(ptr.shape[0] - 1):
        off = ptr[b]
        order = np.argsort(node_ids[off : ptr[b + 1]])
        for i in range(order.shape[0]):
            rank[off + order[i]] = off + i
            row_at[off + i] = off + order[i]
    start = np.zeros(R + 1, dtype=np.int64)
    for e in range(E):
        start[rank[indices[e]] + 1] += 1
    for r in range(R):
        start[r + 1] += start[r]
    src = np.empty(E, dtype=np.int64)  # the edges' rows, bucketed by their column's rank
    src_w = np.empty(E if weighted else 0, dtype=np.float32)
    for r in range(R):
        for e in range(indptr[r], indptr[r + 1]):
            k = rank[indices[e]]
            src[start[k]] = r
            if weighted:
                src_w[start[k]] = weights[e]
            start[k] += 1
    cols = np.empty(E, dtype=indices.dtype)
    ws = np.empty(E if weighted else 0, dtype=np.float32)
    cursor = indptr[:-1].copy()
    s = 0
    for k in range(R):  # ranks ascending: each row's columns arrive in global order
        c = row_at[k]
        while s < start[k]:  # start[k] is now the end of rank k's bucket
            r = src[s]
            cols[cursor[r]] = c
            if weighted:
                ws[cursor[r]] = src_w[s]
            cursor[r] += 1
            s += 1
    return cols, ws


def _assemble(ptr, nodes, row_ptr, cols, ws, first, r2f) -> SubgraphBatch:
    """A :class:`SubgraphBatch` from a kernel's output (sorts the distinct ids, remaps rows)."""
    order = np.argsort(first)
    uniq = first[order]
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    sub = CSRGraph(indptr=row_ptr, indices=cols, weights=ws, num_nodes=len(nodes))
    return SubgraphBatch(
        graph=sub,
        node_ids=nodes,
        ptr=ptr,
        target_rows=ptr[:-1].copy(),
        unique_ids=uniq,
        row_to_unique=rank[r2f],
    )


class BuildStopped(Exception):
    """:meth:`InducedTable.build` was stopped (its ``stop`` event set) before it finished."""


class InducedTable:
    r"""Precomputed induced subgraph of every node's top-K list: batches without touching the graph.

    For node ``v`` with list ``L_v`` (``|L_v| <= k``, from a PPR index), the table stores the
    edges of ``A[L_v, L_v]`` as local pairs ``(i, j)`` (positions in ``L_v``) in row-major order,
    ``j`` ascending within a row, plus their weights on a weighted graph. Because a smaller
    budget ``k' <= k`` takes a *prefix* of ``L_v``, the induced subgraph of the prefix is exactly
    the stored pairs with ``i < k'`` and ``j < k'``, still in row-major order. A batch of ``B``
    targets is then a filtered concatenation of ``B`` stored edge runs plus the dedupe: work
    O(sum of stored edges + R), no neighbour list of the graph is read (see
    :func:`induced_batch` for what scanning them costs on hub-heavy lists).

    Output is identical to :func:`induced_batch` on the same lists (tests compare them).

    Attributes:
        k: list length the table was built for (a batch may use any prefix length ``<= k``).
        num_nodes: ``N``.
        eptr: int64 ``[N + 1]``; node ``v``'s pairs are ``[eptr[v]:eptr[v + 1]]``.
        src, dst: uint16 ``[M]`` local row and column.
        weights: float32 ``[M]`` or ``None`` (unweighted graph).

    Memory: ``4 M`` bytes (``8 M`` weighted) plus ``8 (N + 1)``; ``M`` is roughly ``N`` times the
    mean number of edges inside one list (about 1,300 at K = 64 on Amazon Computers).
    """

    MAX_K = 1 << 16  # local ids are stored as uint16

    def __init__(
        self, k: int, eptr: np.ndarray, src: np.ndarray, dst: np.ndarray, weights: np.ndarray | None
    ) -> None:
        if not 1 <= int(k) <= self.MAX_K:
            raise ValueError(f"an induced table supports 1 <= k <= {self.MAX_K}, got {k}")
        if (
            len(src) != int(eptr[-1])
            or len(dst) != len(src)
            or (weights is not None and len(weights) != len(src))
        ):
            raise ValueError(
                f"induced table arrays disagree: eptr ends at {int(eptr[-1])}, {len(src)} src, {len(dst)} dst"
            )
        self.k = int(k)
        self.eptr, self.src, self.dst, self.weights = eptr, src, dst, weights
        self.num_nodes = len(eptr) - 1

    @property
    def nbytes(self) -> int:
        w = 0 if self.weights is None else self.weights.nbytes
        return int(self.eptr.nbytes + self.src.nbytes + self.dst.nbytes + w)

    @classmethod
    def build(
        cls,
        graph: CSRGraph,
        lookup: Any,
        k: int,
        *,
        chunk: int = 4096,
        progress: bool = False,
        workers: int | None = None,
        stop: threading.Event | None = None,
    ) -> InducedTable:
        """Induce every node's list ``lookup(targets, k) -> (ptr, nodes)`` with :func:`induced_batch`.

        Runs chunk by chunk on ``workers`` threads (default: the machine's cores, at most 8; the numba
        kernel releases the GIL, each thread takes its own scratch), the chunks' pairs concatenated
        in node order, so the table is the same whatever the thread count. Memory: the result plus
        O(chunk) per thread and chunks finished ahead of the one being appended. Once ``stop`` is set
        the chunks not started are skipped and :class:`BuildStopped` is raised.
        """
        import os
        from concurrent.futures import ThreadPoolExecutor

        from tqdm.auto import tqdm

        n = graph.num_nodes
        eptr = np.zeros(n + 1, dtype=np.int64)
        srcs: list[np.ndarray] = []
        dsts: list[np.ndarray] = []
        wss: list[np.ndarray] = []

        def one(lo: int) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None:
            if stop is not None and stop.is_set():
                return None
            hi = min(n, lo + chunk)
            ptr, nodes = lookup(np.arange(lo, hi, dtype=np.int64), k)
            b = induced_batch(graph, ptr, nodes)
            ip = b.graph.indptr
            row = np.repeat(np.arange(len(nodes), dtype=np.int64), np.diff(ip))
            base = np.repeat(ptr[:-1], np.diff(ptr))[row]
            w = np.asarray(b.graph.weights, dtype=np.float32) if b.graph.weights is not None else None
            return (lo, hi, ip[ptr[1:]] - ip[ptr[:-1]], (row - base).astype(np.uint16),
                    (b.graph.indices.astype(np.int64) - base).astype(np.uint16), w)

        workers = max(1, min(os.cpu_count() or 1, 8) if workers is None else int(workers))
        with tqdm(total=n, desc="induced table", unit="node", disable=not progress) as bar, \
                ThreadPoolExecutor(workers, thread_name_prefix="induced-table") as pool:
            for got in pool.map(one, range(0, n, chunk)):  # in node order
                if got is None:
                    raise BuildStopped("the induced table's build was stopped")
                lo, hi, per_sub, src, dst, w = got
                eptr[lo + 1 : hi + 1] = eptr[lo] + np.cumsum(per_sub)
                srcs.append(src)
                dsts.append(dst)
                if w is not None:
                    wss.append(w)
                bar.update(hi - lo)
        cat = lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dtype=dt)  # noqa: E731
        weights = cat(wss, np.float32) if graph.is_weighted else None
        return cls(k, eptr, cat(srcs, np.uint16), cat(dsts, np.uint16), weights)

    def batch(
        self, graph: CSRGraph, targets: np.ndarray, ptr: np.ndarray, nodes: np.ndarray, *, checked: bool = False
    ) -> SubgraphBatch:
        """The :func:`induced_batch` of ``(ptr, nodes)``, where list ``b`` is a prefix (length ``<= k``)
        of the list of ``targets[b]`` this table was built from (the caller guarantees it: both come
        from the same :class:`kernels.ppr.PPRIndex`). ``checked=True``: the caller also vouches for the
        arrays' shapes, ranges and dtypes (int64), which are then not checked again."""
        targets = np.ascontiguousarray(targets, dtype=np.int64)
        if checked and graph.num_nodes == self.num_nodes:
            return self._batch(graph, targets, ptr, nodes)
        ptr, nodes = _check_lists(ptr, nodes, graph.num_nodes)
        if len(targets) != len(ptr) - 1:
            raise ValueError(f"{len(targets)} targets for {len(ptr) - 1} lists")
        if len(targets) and int(np.diff(ptr).max()) > self.k:
            raise ValueError(f"lists longer than the table's k = {self.k}")
        if len(targets) and not np.array_equal(nodes[ptr[:-1]], targets):
            raise ValueError("every list must start with its own target")
        if graph.num_nodes != self.num_nodes:
            raise ValueError(f"table built for {self.num_nodes} nodes, graph has {graph.num_nodes}")
        return self._batch(graph, targets, ptr, nodes)

    def _batch(self, graph: CSRGraph, targets: np.ndarray, ptr: np.ndarray, nodes: np.ndarray) -> SubgraphBatch:
        weighted = self.weights is not None
        ew = self.weights if weighted else _NO_F32
        scratch = _take_scratch(graph)
        try:
            ep = scratch.reserve(1)
            row_ptr, cols, ws, first, r2f = _table_kernel(
                self.eptr,
                self.src,
                self.dst,
                ew,
                weighted,
                targets,
                ptr,
                nodes,
                graph.num_nodes,
                scratch.tag,
                np.int64(ep),
            )
        finally:
            _give_scratch(graph, scratch)
        return _assemble(ptr, nodes, row_ptr, cols, ws if weighted else None, first, r2f)


def lhop_nodes(
    graph: CSRGraph,
    targets: np.ndarray | Sequence[int],
    hops: int,
    fanout: int | Sequence[int] | None = None,
    *,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Node lists of the L-hop scope of each target (following out-edges), CSR-shaped.

    Without ``fanout`` list ``b`` is exactly ``{v : dist(targets[b], v) <= hops}``, the receptive
    field of an L-layer GCN/GraphSAGE at the target: with ``induced_batch`` on these lists (and
    full-graph degrees for GCN normalisation) a plain model computes the target's output exactly.
    Lists are in breadth-first discovery order (target first, then hop 1, hop 2, ...).

    Args:
        graph: the graph.
        targets: int ``[B]`` node ids.
        hops: ``L >= 0``.
        fanout: ``None`` (no cap), an int (cap for every hop) or one int per hop (0 = no cap): a
            node with more neighbours expands only ``fanout`` of them, chosen without replacement
            by a hash of ``(seed, target, node)`` (deterministic, independent of the batch).
            Neighbours already in the list count toward the cap.
        seed: seed of that choice.

    Returns:
        ``(ptr int64 [B + 1], nodes int64 [total])``.
    """
    t = np.ascontiguousarray(np.asarray(targets, dtype=np.int64).reshape(-1))
    n = graph.num_nodes
    if len(t) and (int(t.min()) < 0 or int(t.max()) >= n):
        raise ValueError(f"targets must lie in [0, {n})")
    hops = int(hops)
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    if fanout is None:
        fan = np.zeros(hops, dtype=np.int64)
    elif isinstance(fanout, (int, np.integer)):
        fan = np.full(hops, int(fanout), dtype=np.int64)
    else:
        fan = np.asarray(list(fanout), dtype=np.int64)
        if fan.shape != (hops,):
            raise ValueError(f"fanout needs one entry per hop ({hops}), got {len(fan)}")
    if np.any(fan < 0):
        raise ValueError("fanout entries must be >= 0 (0 = no cap)")
    if len(t) == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    scratch = _take_scratch(graph)
    try:
        epoch0 = scratch.reserve(len(t))
        ptr, nodes = _lhop_kernel(
            graph.indptr, graph.indices, t, hops, fan, np.uint64(int(seed) & (2**64 - 1)), scratch.tag, epoch0
        )
    finally:
        _give_scratch(graph, scratch)
    return ptr, nodes
