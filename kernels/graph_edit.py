r"""Structural edits of a live graph: new nodes, edge additions and removals, applied without a rebuild.

A :class:`GraphEdit` describes one update; :func:`apply_edit` returns a **new**
:class:`~kernels.graph.CSRGraph` (the old one, possibly memory-mapped and shared with readers, is
never written) plus the rows whose neighbour lists changed (:class:`EditEffect`), which is what the
caches above the graph (PPR lists, induced tables, activations) invalidate by.

Semantics
---------
* **Symmetric.** Graphs here are symmetric (every dataset loader symmetrizes), so every edge of an
  edit (a new node's edge, an addition, a removal) applies in *both* directions with the same
  weight: adding ``(u, v, w)`` writes ``u -> v`` and ``v -> u``; removing ``(u, v)`` deletes both.
  ``(u, v)`` and ``(v, u)`` name the same edge. A self-loop ``(u, u)`` is one slot.
* **Order inside one edit.** (1) the ``m = new_count`` new nodes get ids ``N .. N + m - 1``
  (``N`` = ``graph.num_nodes`` before the edit) with their edges: new node ``j`` lists neighbours
  that already exist (``< N``) or are earlier new nodes (``< N + j``); (2) removals; (3) additions.
  So "remove ``(u, v)`` + add ``(u, v, w=2)``" in one edit re-weights the edge, and a removal may
  name an edge a new node of the same edit brought.
* **Validation** happens before anything is built, and :func:`apply_edit` is pure, so an invalid
  edit changes nothing. Refused, with a :class:`GraphEditError` naming the list and index of the
  first offending entry (e.g. ``add_edges[2]: node 99 is not in the graph (0 .. 41 after this
  update's 2 new nodes)``): ids out of range; a new node listing the same neighbour twice; removing
  an edge that does not exist (after step 1) or removing one twice; adding an edge that exists
  (after the removals) or adding one twice; self-loops unless ``allow_self_loops`` (default: allowed
  iff the graph already holds one); negative or non-finite weights (0 is allowed, as in
  :meth:`CSRGraph.from_edge_index`).
* **Result.** Exactly what :meth:`CSRGraph.from_edge_index` builds from the edited directed edge
  list (rows sorted by destination, ``indices`` dtype by :func:`~kernels.graph.index_dtype_for`).
  An unweighted graph stays unweighted when every weight of the edit is 1 (``None`` means 1);
  otherwise the result is weighted and the old edges weigh 1.0 (float32).

Cost
----
Let ``R`` be the rows an edit touches (endpoints of its edges and the new nodes) and ``d_R`` their
total degree. Validation and the new contents of those rows are vectorized NumPy over ``O(d_R +
edit size)`` entries (one small sort); the new arrays are then assembled by one compiled loop that
copies the *unchanged runs of rows* between consecutive touched rows as blocks (vectorized, at
``memcpy`` speed), their ``indptr`` entries shifted by a constant, and writes the touched rows in
between. No Python loop and no sort over the graph's edges: one ``O(E)`` copy of ``indices`` (and
``weights``) and one ``O(N)`` pass writing ``indptr``. The copy is unavoidable with immutable CSR
arrays; it is ``~4 E`` bytes (``~8 E`` weighted): on a 2 M-node graph of 40 M directed edges, about
26 ms of a single-edge edit on the 2-vCPU VM (2026-11-27; NumPy's own copy of that array into fresh
memory, 25 ms). The arrays written are recycled from earlier versions nothing reaches any more
(:class:`RecycledBuffers`): fresh memory for them costs more than the copy once they pass glibc's mmap
threshold (a 10 M-node graph's 2 GB ``indices``). The graph's memoized largest degree is carried over
(recomputed on the next read only when a row of that degree lost edges).
"""

# numba cache key: subgraph 47e999493df1

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from .graph import CSRGraph, gather_ranges, index_dtype_for
from .subgraph import carry_scratch, copy_run

__all__ = ["EditEffect", "GraphEdit", "GraphEditError", "RecycledBuffers", "apply_edit", "edit_from_pairs"]

_SELF_LOOPS_KEY = "_graph_edit_self_loops"


class RecycledBuffers:
    """The large arrays :func:`apply_edit` writes (a new graph's ``indices``, ``weights``, ``indptr``), recycled
    from graphs nothing reads any more, so that an edit of a large graph copies into memory already mapped.

    Why: on the 2-vCPU VM (2026-11-29), copying the 2.0 GB ``indices`` of a 10 M-node graph into a fresh array took
    0.33-0.47 s, and 4-5 s whenever the kernel first had to evict page cache for it, against 0.14-0.18 s into an
    array already touched: glibc hands blocks above its mmap threshold (1 GiB here, ``kernels.malloc``) back to the
    kernel on free, so every edit page-faulted and zeroed 2 GB afresh. Below ``min_bytes`` (64 MiB) arrays are left
    to the allocator, which reuses them anyway (``kernels.malloc``).

    Safety: a buffer is handed out again only when the pool holds its *only* reference (``sys.getrefcount``): a
    graph, a view of it (a slice of ``indices``, which NumPy bases on the buffer itself), a tensor from
    ``torch.from_numpy``, a compiled kernel running on it or anything else still holding the old version keeps the
    count up, and the edit then allocates. So a batch still running on the previous version can never see its
    arrays rewritten; only memory no Python object can reach is reused.

    Cost: a server that took updates keeps one idle copy of each array (at 10 M nodes about 2 GB more resident
    memory) until ``release_idle`` drops it, which the live graph's writer calls when no edit came for
    ``idle_s`` seconds. Each buffer has ``1/64`` headroom, so edits that add a few edges fit the same one.
    """

    def __init__(self, min_bytes: int = 64 << 20, headroom: float = 1 / 64, idle_s: float = 60.0,
                 max_idle: int = 2) -> None:
        self.min_bytes = int(min_bytes)
        self.headroom = float(headroom)
        self.idle_s = float(idle_s)
        self.max_idle = int(max_idle)  # idle buffers kept per dtype (one graph needs one; a few graphs share)
        self._bufs: list[np.ndarray] = []  # every buffer handed out, in use or idle
        self._lock = threading.Lock()
        self._last_take = 0.0
        self.reused = 0  # takes served from an idle buffer
        self.allocated = 0  # takes that allocated one

    def _idle(self, i: int) -> bool:
        # the list's reference and getrefcount's argument: nothing else holds the buffer or a view of it
        return sys.getrefcount(self._bufs[i]) <= 2

    def _capacity(self, n: int) -> int:
        """The elements a new buffer for ``n`` gets, and the most an idle one may have to be handed out for ``n``."""
        return n + int(n * self.headroom) + 1024

    def take(self, n: int, dtype: Any) -> np.ndarray:
        """An uninitialised array of ``n`` elements: a view of an idle buffer that fits (``n`` to ``n`` plus its
        headroom), else of a new one; plain ``np.empty`` below ``min_bytes``."""
        dt = np.dtype(dtype)
        n = int(n)
        if n == 0 or n * dt.itemsize < self.min_bytes:
            return np.empty(n, dtype=dt)
        with self._lock:
            self._last_take = time.monotonic()
            idle = [i for i in range(len(self._bufs)) if self._bufs[i].dtype == dt and self._idle(i)]
            for i in idle:
                if n <= len(self._bufs[i]) <= self._capacity(n):
                    self.reused += 1
                    return self._bufs[i][:n]
            # nothing fits: drop idle buffers of this dtype beyond max_idle - 1 (the new one takes a place)
            drop = set(idle[: max(0, len(idle) - self.max_idle + 1)])
            self._bufs = [b for i, b in enumerate(self._bufs) if i not in drop]
            buf = np.empty(self._capacity(n), dtype=dt)
            self._bufs.append(buf)
            self.allocated += 1
            return buf[:n]

    def release_idle(self, force: bool = False) -> int:
        """Drop the idle buffers when no take came for ``idle_s`` seconds (every one with ``force``); the bytes
        dropped."""
        with self._lock:
            if not self._bufs or not (force or time.monotonic() - self._last_take >= self.idle_s):
                return 0
            idle = {i for i in range(len(self._bufs)) if self._idle(i)}
            freed = sum(self._bufs[i].nbytes for i in idle)
            self._bufs = [b for i, b in enumerate(self._bufs) if i not in idle]
            return freed

    def held_bytes(self) -> tuple[int, int]:
        """``(in use, idle)`` bytes of the buffers the pool holds."""
        with self._lock:
            idle = [self._idle(i) for i in range(len(self._bufs))]
            used = sum(b.nbytes for b, z in zip(self._bufs, idle, strict=True) if not z)
            return used, sum(b.nbytes for b, z in zip(self._bufs, idle, strict=True) if z)


#: the process's pool (every live graph's edits)
BUFFERS = RecycledBuffers()


class GraphEditError(ValueError):
    """An edit is malformed or inconsistent with the graph; the message names the offending entry."""


def _i64(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise GraphEditError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            return arr.astype(np.int64)
        raise GraphEditError(f"{name} must hold integer node ids, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _f32(a: Any, name: str) -> np.ndarray | None:
    if a is None:
        return None
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise GraphEditError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iuf":
        raise GraphEditError(f"{name} must hold numbers, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _empty_i64() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _zero_ptr() -> np.ndarray:
    return np.zeros(1, dtype=np.int64)


@dataclass(frozen=True)
class GraphEdit:
    """One structural update (see the module docstring for its semantics); NumPy arrays throughout.

    Attributes:
        new_count: ``m`` new nodes, ids ``N .. N + m - 1``.
        new_ptr: int64 ``[m + 1]``; new node ``j``'s neighbours are ``new_nbrs[new_ptr[j]:new_ptr[j + 1]]``.
        new_nbrs: int64; existing ids (``< N``) or earlier new nodes (``< N + j``).
        new_weights: float32 like ``new_nbrs``, or ``None`` (every weight 1).
        add_src, add_dst: int64 ``[a]`` edge additions (ids may be new nodes of this edit).
        add_w: float32 ``[a]`` or ``None`` (1).
        rem_src, rem_dst: int64 ``[r]`` edge removals.

    Build one with :meth:`make`, which normalises dtypes and checks shapes.
    """

    new_count: int = 0
    new_ptr: np.ndarray = field(default_factory=_zero_ptr)
    new_nbrs: np.ndarray = field(default_factory=_empty_i64)
    new_weights: np.ndarray | None = None
    add_src: np.ndarray = field(default_factory=_empty_i64)
    add_dst: np.ndarray = field(default_factory=_empty_i64)
    add_w: np.ndarray | None = None
    rem_src: np.ndarray = field(default_factory=_empty_i64)
    rem_dst: np.ndarray = field(default_factory=_empty_i64)

    @classmethod
    def make(
        cls,
        *,
        new_count: int = 0,
        new_ptr: Any = None,
        new_nbrs: Any = None,
        new_weights: Any = None,
        add_src: Any = (),
        add_dst: Any = (),
        add_w: Any = None,
        rem_src: Any = (),
        rem_dst: Any = (),
    ) -> GraphEdit:
        """Normalise dtypes (ids int64, weights float32) and check that the arrays fit together.

        ``new_ptr`` may be left out when no new node has edges. Raises :class:`GraphEditError` on
        ragged input (mismatched lengths, a ``new_ptr`` that does not partition ``new_nbrs``).
        """
        if isinstance(new_count, bool) or int(new_count) != new_count or new_count < 0:
            raise GraphEditError(f"new_count must be an integer >= 0, got {new_count!r}")
        m = int(new_count)
        nbrs = _i64(() if new_nbrs is None else new_nbrs, "new_nbrs")
        if new_ptr is None:
            if len(nbrs):
                raise GraphEditError(f"new_nbrs has {len(nbrs)} entries but no new_ptr says whose they are")
            ptr = np.zeros(m + 1, dtype=np.int64)
        else:
            ptr = _i64(new_ptr, "new_ptr")
        nw = _f32(new_weights, "new_weights")
        if nw is not None and nw.shape != nbrs.shape:
            raise GraphEditError(f"new_weights has {len(nw)} entries, new_nbrs {len(nbrs)}")
        a_s, a_d = _i64(add_src, "add_src"), _i64(add_dst, "add_dst")
        if a_s.shape != a_d.shape:
            raise GraphEditError(f"add_src has {len(a_s)} entries, add_dst {len(a_d)}")
        aw = _f32(add_w, "add_w")
        if aw is not None and aw.shape != a_s.shape:
            raise GraphEditError(f"add_w has {len(aw)} entries, add_src {len(a_s)}")
        r_s, r_d = _i64(rem_src, "rem_src"), _i64(rem_dst, "rem_dst")
        if r_s.shape != r_d.shape:
            raise GraphEditError(f"rem_src has {len(r_s)} entries, rem_dst {len(r_d)}")
        edit = cls(m, ptr, nbrs, nw, a_s, a_d, aw, r_s, r_d)
        edit._check_shapes()
        return edit

    def _check_shapes(self) -> None:
        m = int(self.new_count)
        if m < 0:
            raise GraphEditError(f"new_count must be >= 0, got {m}")
        ptr = self.new_ptr
        if ptr.shape != (m + 1,):
            raise GraphEditError(f"new_ptr must have new_count + 1 = {m + 1} entries, got {len(ptr)}")
        if int(ptr[0]) != 0 or int(ptr[-1]) != len(self.new_nbrs):
            raise GraphEditError(
                f"new_ptr must run from 0 to len(new_nbrs) = {len(self.new_nbrs)}, got {int(ptr[0])} .. {int(ptr[-1])}"
            )
        if m and np.any(np.diff(ptr) < 0):
            j = int(np.flatnonzero(np.diff(ptr) < 0)[0])
            raise GraphEditError(f"new_ptr[{j + 1}]: {int(ptr[j + 1])} is below new_ptr[{j}] = {int(ptr[j])}")
        if self.new_weights is not None and len(self.new_weights) != len(self.new_nbrs):
            raise GraphEditError(f"new_weights has {len(self.new_weights)} entries, new_nbrs {len(self.new_nbrs)}")
        if len(self.add_src) != len(self.add_dst):
            raise GraphEditError(f"add_src has {len(self.add_src)} entries, add_dst {len(self.add_dst)}")
        if self.add_w is not None and len(self.add_w) != len(self.add_src):
            raise GraphEditError(f"add_w has {len(self.add_w)} entries, add_src {len(self.add_src)}")
        if len(self.rem_src) != len(self.rem_dst):
            raise GraphEditError(f"rem_src has {len(self.rem_src)} entries, rem_dst {len(self.rem_dst)}")

    @property
    def empty(self) -> bool:
        """No structural change: no new node, no addition, no removal."""
        return int(self.new_count) == 0 and len(self.add_src) == 0 and len(self.rem_src) == 0


@dataclass(frozen=True)
class EditEffect:
    """What :func:`apply_edit` produced.

    Attributes:
        graph: the edited graph (a new object; the input graph is untouched).
        changed_rows: int64 sorted unique: rows whose neighbour list or weights differ from before,
            every new node's row included (an edit that re-adds an edge with its old weight leaves
            its rows out).
        new_ids: int64 ``[m]``: ids of the new nodes, ``N .. N + m - 1``.
    """

    graph: CSRGraph
    changed_rows: np.ndarray
    new_ids: np.ndarray


# ============================================================================ helpers
def _range_text(n: int, m: int) -> str:
    total = n + m
    last = f"0 .. {total - 1}" if total else "empty"
    if m:
        s = "" if m == 1 else "s"
        return f"({last} after this update's {m} new node{s})"
    return f"({last})"


def _self_loop_count(graph: CSRGraph) -> int:
    """Number of self-loop slots (memoized on the graph; one pass over the edges once, no array of them: the
    loader counts a graph of half a billion edges)."""
    c = graph.cache().get(_SELF_LOOPS_KEY)
    if c is None:
        c = int(_count_loops(graph.indptr, graph.indices)) if graph.num_edges else 0
        graph.cache()[_SELF_LOOPS_KEY] = c
    return c


@numba.njit(cache=True, nogil=True)
def _count_loops(indptr, indices):  # pragma: no cover - compiled
    c = 0
    for v in range(indptr.shape[0] - 1):
        for e in range(indptr[v], indptr[v + 1]):
            c += indices[e] == v
    return c


#: the largest edge weight an edit takes: a few weights near float32's limit (3.4e38) sum to infinity in a
#: node's degree, and the answers of every model around it turn NaN (a QA report, 2026-11-27)
MAX_WEIGHT = 1e15


def valid_weights(w: Any) -> Any:
    """Whether each weight (an array, or one number) is one an edge may carry: finite, >= 0 and at most
    :data:`MAX_WEIGHT` (the rule of every edit, of a live graph's updates and of Predict's new nodes)."""
    return np.isfinite(w) & (w >= 0) & (w <= MAX_WEIGHT)


def weight_rule(w: float) -> str:
    """What a weight :func:`valid_weights` refuses breaks, for its error message."""
    return f"must be at most {MAX_WEIGHT:g}" if np.isfinite(w) and w > MAX_WEIGHT else "must be finite and >= 0"


def _check_weights(w: np.ndarray | None, name: str, src: np.ndarray, dst: np.ndarray) -> None:
    """Weights must pass :func:`valid_weights`; ``name`` is the list the error names (the entry's index
    follows)."""
    if w is None or not len(w):
        return
    bad = ~valid_weights(w)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise GraphEditError(f"{name}[{i}]: weight {float(w[i])} of edge ({int(src[i])}, {int(dst[i])}) "
                             f"{weight_rule(w[i])}")


def _first_duplicate(keys: np.ndarray) -> tuple[int, int] | None:
    """``(i, j)`` with ``keys[i] == keys[j]``, ``j < i`` the earlier one and ``i`` the smallest such index."""
    if len(keys) < 2:
        return None
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    same = sk[1:] == sk[:-1]
    if not same.any():
        return None
    later = order[1:][same]  # within a run of equal keys the stable sort keeps index order
    earlier = order[:-1][same]
    q = int(np.argmin(later))
    return int(later[q]), int(earlier[q])


@numba.njit(cache=True, nogil=True)
def _splice(
    old_indptr, old_indices, old_w, has_old_w, n_old, rows, new_indptr, chg_ptr, chg_cols, chg_w, out_idx, out_w,
    write_w,
):  # pragma: no cover - compiled
    """Assemble the edited arrays, ``new_indptr`` included: unchanged runs of rows are block copies (their
    ``indptr`` entries the old ones shifted by one constant), ``rows[i]`` gets its new content
    ``chg_*[chg_ptr[i]:chg_ptr[i + 1]]``. ``rows`` holds every new node (ids from ``n_old``)."""
    prev = 0
    pos = 0  # where the next row starts in the new arrays
    for i in range(rows.shape[0] + 1):
        r = rows[i] if i < rows.shape[0] else n_old
        stop = min(r, n_old)
        if stop > prev:  # rows prev .. stop - 1 are unchanged: one block
            a = old_indptr[prev]
            b = old_indptr[stop]
            sh = pos - a
            ni = new_indptr[prev:stop]  # views from 0: no wrap-around per index (subgraph.copy_run)
            oi = old_indptr[prev:stop]
            for q in range(stop - prev):
                ni[q] = oi[q] + sh
            copy_run(out_idx, pos, old_indices, a, b - a)
            if write_w:
                if has_old_w:
                    copy_run(out_w, pos, old_w, a, b - a)
                else:
                    ow = out_w[pos:pos + (b - a)]
                    for e in range(b - a):
                        ow[e] = 1.0
            pos += b - a
        if i < rows.shape[0]:
            new_indptr[r] = pos
            c0 = chg_ptr[i]
            c1 = chg_ptr[i + 1]
            copy_run(out_idx, pos, chg_cols, c0, c1 - c0)
            if write_w:
                copy_run(out_w, pos, chg_w, c0, c1 - c0)
            pos += c1 - c0
            prev = r + 1
    new_indptr[new_indptr.shape[0] - 1] = pos
    return 0


# ============================================================================ the edit
def apply_edit(graph: CSRGraph, edit: GraphEdit, *, allow_self_loops: bool | None = None) -> EditEffect:
    """Apply ``edit`` to ``graph`` (semantics, validation and cost in the module docstring).

    Args:
        graph: the current graph (symmetric); its arrays are never written. Of its memo, only the subgraph
            kernels' idle scratch arrays change: they move to the new graph (``subgraph.carry_scratch``).
        edit: the update.
        allow_self_loops: whether an added edge may be a self-loop; ``None`` = iff ``graph`` has one.

    Returns:
        An :class:`EditEffect` with the new graph, the changed rows and the new node ids.

    Raises:
        GraphEditError: the edit is invalid (nothing is built).
    """
    edit._check_shapes()
    n = graph.num_nodes
    m = int(edit.new_count)
    n2 = n + m
    new_ids = np.arange(n, n2, dtype=np.int64)

    # ---------------------------------------------------------------- 1. new nodes and their edges
    nbrs = edit.new_nbrs
    owner = np.repeat(np.arange(m, dtype=np.int64), np.diff(edit.new_ptr)) if m else _empty_i64()
    if len(nbrs):
        bad = (nbrs < 0) | (nbrs >= n + owner)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            j = int(owner[i])
            before = f"0 .. {n + j - 1}" if n + j else "none"
            raise GraphEditError(
                f"new_nbrs[{i}]: new node {n + j} (new node {j} of this update) lists node {int(nbrs[i])}, "
                f"which is not in the graph before it ({before}; a new node may link earlier new nodes only)"
            )
        _check_weights(edit.new_weights, "new_weights", n + owner, nbrs)
        dup = _first_duplicate(owner * n2 + nbrs)
        if dup is not None:
            i, e = dup
            raise GraphEditError(
                f"new_nbrs[{i}]: new node {n + int(owner[i])} lists neighbour {int(nbrs[i])} twice "
                f"(also new_nbrs[{e}])"
            )
    nb_src = n + owner  # new node ids of those edges
    nb_w = edit.new_weights

    # ---------------------------------------------------------------- ranges of removals and additions
    rs, rd = edit.rem_src, edit.rem_dst
    as_, ad = edit.add_src, edit.add_dst
    for name, s, d in (("remove_edges", rs, rd), ("add_edges", as_, ad)):
        if len(s):
            bad = (s < 0) | (s >= n2) | (d < 0) | (d >= n2)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                v = int(s[i]) if not 0 <= int(s[i]) < n2 else int(d[i])
                raise GraphEditError(f"{name}[{i}]: node {v} is not in the graph {_range_text(n, m)}")
    _check_weights(edit.add_w, "add_edges", as_, ad)
    if len(as_) and np.any(as_ == ad):
        allowed = allow_self_loops if allow_self_loops is not None else _self_loop_count(graph) > 0
        if not allowed:
            i = int(np.flatnonzero(as_ == ad)[0])
            why = "" if allow_self_loops is not None else " (the graph has none)"
            raise GraphEditError(f"add_edges[{i}]: self-loop ({int(as_[i])}, {int(ad[i])}) is not allowed{why}")
    rkey = np.minimum(rs, rd) * n2 + np.maximum(rs, rd)
    dup = _first_duplicate(rkey)
    if dup is not None:
        i, e = dup
        raise GraphEditError(
            f"remove_edges[{i}]: edge ({int(rs[i])}, {int(rd[i])}) is removed twice (also remove_edges[{e}])"
        )
    akey = np.minimum(as_, ad) * n2 + np.maximum(as_, ad)
    dup = _first_duplicate(akey)
    if dup is not None:
        i, e = dup
        raise GraphEditError(
            f"add_edges[{i}]: edge ({int(as_[i])}, {int(ad[i])}) is added twice (also add_edges[{e}])"
        )

    # ---------------------------------------------------------------- the touched rows, before the edit
    rows = np.unique(np.concatenate([nbrs, new_ids, rs, rd, as_, ad]))
    old_rows = rows[rows < n]
    starts = graph.indptr[old_rows]
    old_deg = graph.indptr[old_rows + 1] - starts  # not graph.degrees: an O(N) pass where none was memoized
    _, gpos = gather_ranges(starts, old_deg)
    g_row = np.repeat(old_rows, old_deg)
    g_col = np.asarray(graph.indices[gpos], dtype=np.int64)
    g_w = (np.asarray(graph.weights[gpos], dtype=np.float32) if graph.weights is not None
           else np.ones(len(gpos), dtype=np.float32))  # fmt: skip
    # stage 1: plus the new nodes' edges, both directions
    nw1 = nb_w if nb_w is not None else np.ones(len(nbrs), dtype=np.float32)
    s1_row = np.concatenate([g_row, nb_src, nbrs])
    s1_col = np.concatenate([g_col, nbrs, nb_src])
    s1_w = np.concatenate([g_w, nw1, nw1])
    s1_key = s1_row * n2 + s1_col
    order = np.argsort(s1_key, kind="stable")
    s1_key, s1_w = s1_key[order], s1_w[order]

    def find(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(s1_key):
            return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=bool)
        pos = np.minimum(np.searchsorted(s1_key, keys), len(s1_key) - 1)
        return pos, s1_key[pos] == keys

    # ---------------------------------------------------------------- 2. removals must exist
    keep = np.ones(len(s1_key), dtype=bool)
    if len(rs):
        p_fw, h_fw = find(rs * n2 + rd)
        p_bw, h_bw = find(rd * n2 + rs)
        bad = ~(h_fw & h_bw)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "does not exist" if not (h_fw[i] or h_bw[i]) else "exists in one direction only (graph not symmetric)"
            raise GraphEditError(f"remove_edges[{i}]: edge ({int(rs[i])}, {int(rd[i])}) {what}")
        keep[p_fw] = False
        keep[p_bw] = False

    # ---------------------------------------------------------------- 3. additions must not exist
    aw = edit.add_w if edit.add_w is not None else np.ones(len(as_), dtype=np.float32)
    if len(as_):
        p_fw, h_fw = find(as_ * n2 + ad)
        p_bw, h_bw = find(ad * n2 + as_)
        kept = keep if len(keep) else np.zeros(1, dtype=bool)
        bad = (h_fw & kept[p_fw]) | (h_bw & kept[p_bw])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise GraphEditError(f"add_edges[{i}]: edge ({int(as_[i])}, {int(ad[i])}) already exists")
    loop = as_ == ad
    f_key = np.concatenate([s1_key[keep], as_ * n2 + ad, (ad * n2 + as_)[~loop]])
    f_w = np.concatenate([s1_w[keep], aw, aw[~loop]])
    order = np.argsort(f_key, kind="stable")
    f_key, f_w = f_key[order], f_w[order]
    f_row, f_col = f_key // n2, f_key % n2

    # ---------------------------------------------------------------- weightedness and new indptr
    weighted = graph.is_weighted or bool(np.any(nw1 != 1.0)) or bool(np.any(aw != 1.0))
    new_cnt = np.bincount(np.searchsorted(rows, f_row), minlength=len(rows)).astype(np.int64)
    old_cnt = np.zeros(len(rows), dtype=np.int64)
    old_cnt[: len(old_rows)] = old_deg  # rows is sorted: the old rows come first
    new_indptr = BUFFERS.take(n2 + 1, np.int64)  # written by _splice, in the same pass as the copies
    e2 = int(graph.indptr[-1]) + int(new_cnt.sum()) - int(old_cnt.sum())
    idt = index_dtype_for(n2)
    out_idx = BUFFERS.take(e2, idt)
    out_w = BUFFERS.take(e2 if weighted else 0, np.float32)
    chg_ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(new_cnt, out=chg_ptr[1:])
    old_w = graph.weights if graph.weights is not None else np.zeros(0, dtype=np.float32)
    _splice(
        graph.indptr, graph.indices, old_w, graph.weights is not None, n, rows, new_indptr, chg_ptr,
        f_col.astype(idt), f_w, out_idx, out_w, weighted,
    )  # fmt: skip
    new_graph = CSRGraph(indptr=new_indptr, indices=out_idx, weights=out_w if weighted else None, num_nodes=n2)
    if _SELF_LOOPS_KEY in graph.cache():
        removed_loops = int(np.count_nonzero(rs == rd))
        new_graph.cache()[_SELF_LOOPS_KEY] = _self_loop_count(graph) - removed_loops + int(np.count_nonzero(loop))
    old_max = graph.cache().get("max_degree")
    # carried unless a row of the largest degree lost edges (then the next read recomputes it)
    if old_max is not None and not np.any((old_cnt == old_max) & (new_cnt < old_max)):
        new_graph.cache()["max_degree"] = max(int(old_max), int(new_cnt.max()) if len(new_cnt) else 0)
    carry_scratch(graph, new_graph)

    # ---------------------------------------------------------------- which touched rows really changed
    k_old = len(old_rows)
    same_deg = new_cnt[:k_old] == old_cnt[:k_old]
    differs = np.ones(len(rows), dtype=bool)
    differs[:k_old] = ~same_deg
    if same_deg.any():
        # old and new contents of the rows with unchanged degree, row by row in the same order
        o_sel = np.repeat(same_deg, old_cnt[:k_old])
        n_sel = np.repeat(same_deg, new_cnt[:k_old])
        n_first = np.zeros(len(f_key), dtype=bool)
        n_first[: int(chg_ptr[k_old])] = n_sel
        neq = (g_col[o_sel] != f_col[n_first]) | (g_w[o_sel] != f_w[n_first])
        owner_row = np.repeat(np.flatnonzero(same_deg), old_cnt[:k_old][same_deg])
        row_neq = np.bincount(owner_row, weights=neq, minlength=k_old) > 0
        differs[:k_old] |= row_neq
    return EditEffect(graph=new_graph, changed_rows=rows[differs], new_ids=new_ids)


def edit_from_pairs(
    *,
    add: Sequence[tuple[int, int]] | np.ndarray = (),
    add_w: Sequence[float] | np.ndarray | None = None,
    remove: Sequence[tuple[int, int]] | np.ndarray = (),
) -> GraphEdit:
    """Shorthand: a :class:`GraphEdit` of edge additions and removals given as ``(u, v)`` pairs."""
    a = np.asarray(add, dtype=np.int64).reshape(-1, 2)
    r = np.asarray(remove, dtype=np.int64).reshape(-1, 2)
    return GraphEdit.make(add_src=a[:, 0], add_dst=a[:, 1], add_w=add_w, rem_src=r[:, 0], rem_dst=r[:, 1])
