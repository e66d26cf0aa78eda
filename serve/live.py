"""The live graph: node, edge and feature updates while serving, with answers as fresh as the last write.

One :class:`LiveGraph` per dataset (every model version trained on it shares it, so every model on
the graph sees an update). It holds the graph's version (a counter, +1 per applied group of updates), the
read/write lock that makes an update atomic, the ordered update log (a file beside the repository's
data, or a Redis stream for replicas: :mod:`serve.update_log`) and the overlay of changed feature rows.

An update (``UpdateGraph``, :func:`parse_update`) is, in order: feature upserts of existing nodes, new
nodes (ids ``N, N+1, ...`` with their edges), edge removals, edge additions; every edge applies in both
directions (the graphs are symmetric). Life of an update (:meth:`LiveGraph.update`):

1. it queues for the writer; whoever holds the writer takes every update waiting, in arrival order,
   as one group (so a stream of small updates costs one graph copy per group, not per update);
2. caught up with the log, each update of the group is validated against the state the ones before
   it leave (:func:`parse_update`; edges by the group's own check, else by
   :func:`kernels.graph_edit.apply_edit`, :class:`_Group`): a bad entry is INVALID_ARGUMENT naming
   it, and nothing of that request is applied (the others go on);
3. the group is appended to the log as one record (durable before anyone is acknowledged; replicas
   see it there): the commit point. Right before it, an update whose deadline has passed (validation and
   the new graph can outlast a short one) is refused, DEADLINE_EXCEEDED "not applied", and the rest of
   the group is validated again without it; after it the update stands, even if its deadline passes
   during step 4 or its answer is lost (:meth:`LiveGraph.update_async`);
4. under the write lock (no batch runs: every batch holds the read lock for its whole run, so it sees
   one version): the new graph (one ``apply_edit`` of the group's net edit), the feature overlay, the
   PPR lists (:class:`kernels.ppr_live.LivePPRIndex`) and every model's caches, dropping exactly the
   cached rows the group changed (:meth:`serve.runtime.ModelRuntime.rebase`); the version is bumped
   and the lock released.

What each change invalidates (the rule :meth:`ModelRuntime.rebase` follows; docs/ARCHITECTURE.md has
the table): a changed feature row, its projection, and the first-layer rows of it and of its
neighbours; a changed adjacency row (an endpoint of an added or removed edge, a new node's
neighbour), its first-layer rows at every width (its sampled positions move with its length), and for
GCN, whose normalisation reads both endpoints' degrees, the first-layer rows of its neighbours too;
the exact-edge counts of every node within ``L - 1`` hops of a changed row; the PPR lists whose
estimate may have moved beyond the push tolerance and the induced subgraphs of every list holding a
changed row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from kernels import graph_edit
from kernels.datasets import fsync_path, pid_alive, remove_stale_tmp
from kernels.graph_edit import valid_weights
from kernels.update_warmup import warm_once

from .errors import (
    READ_ONLY_REFUSAL,
    DeadlineExceeded,
    GnnServeError,
    GraphOutOfService,
    InvalidArgument,
    ReadOnly,
    Unavailable,
    detached,
)
from .update_log import fsync_dir
from .validation import feature_problem
from .wire import update_size_error

if TYPE_CHECKING:
    from kernels.graph_edit import GraphEdit

    from .runtime import DataBundle, ModelRuntime

__all__ = ["LiveFeatures", "LiveGraph", "ParsedUpdate", "RWLock", "ReadOnly", "UpdateConflict", "parse_update"]

log = logging.getLogger(__name__)


#: why a graph whose update log no longer holds what it applied is out of service (``LiveGraph._forked``)
_LOG_FORKED = "its update log no longer holds what this server applied"


class NotWritten(GnnServeError):
    """A read-your-writes version that no server has written (:meth:`LiveGraph.wait_for`): FAILED_PRECONDITION,
    which clients do not retry (it was UNAVAILABLE, and the SDK and CLI tried 4 times for nothing; a QA report):
    an update is acknowledged only once logged, so the version can only be a client's mistake."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class UpdateConflict(GnnServeError):
    """``expect_graph_version`` no longer holds: another update came first."""

    code = grpc.StatusCode.ABORTED


# ============================================================================ the lock
class RWLock:
    """Many readers (batches) or one writer (an update); a waiting writer goes before new readers, so
    an update waits for the batches already running, never for a stream of new ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def try_acquire_read(self) -> bool:
        """Take the read side only if that needs no wait (no writer holds or waits for the lock); the
        event loop's inline batches use it, so that a queued update never holds the loop."""
        with self._cond:
            if self._writer or self._writers_waiting:
                return False
            self._readers += 1
            return True

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers and self._writers_waiting:
                self._cond.notify_all()

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


# ============================================================================ features
class LiveFeatures:
    """A feature store with an overlay of updated and new rows in front of it.

    ``get(ids)`` answers overlay rows from memory and the rest from the base store (memory, Redis,
    tiered), so the base is never written (it may be a read-only memory map, or a Redis version other
    servers share). Other attributes come from the base store. Writes happen only under the live
    graph's write lock; reads under its read lock.
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self._n_base = int(base.num_nodes)
        self._n = self._n_base
        self._f = int(base.num_features)
        self._slot = np.full(self._n_base, -1, dtype=np.int64)  # node -> overlay row, -1 = base
        self._rows = np.zeros((0, self._f), dtype=np.float32)
        self._used = 0

    def __getattr__(self, name: str) -> Any:  # stats, close, ping, name, data-version helpers ...
        return getattr(self.base, name)

    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def num_features(self) -> int:
        return self._f

    def get(self, node_ids: Any) -> np.ndarray:
        ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        if not self._used:
            return self.base.get(ids)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self._n):
            from .features.base import InvalidNodeIds

            raise InvalidNodeIds(f"node ids must lie in [0, {self._n})")
        slot = self._slot[ids]
        over = slot >= 0
        if not over.any():
            return self.base.get(ids)
        out = np.empty((len(ids), self._f), dtype=np.float32)
        if not over.all():
            out[~over] = self.base.get(ids[~over])
        out[over] = self._rows[slot[over]]
        return out

    def write(self, node_ids: np.ndarray, rows: np.ndarray) -> None:
        """Set the rows of ``node_ids`` (existing or the next new ids, distinct)."""
        ids = np.asarray(node_ids, dtype=np.int64)
        if not len(ids):
            return
        top = int(ids.max()) + 1
        if top > len(self._slot):
            grown = np.full(max(top, 2 * len(self._slot)), -1, dtype=np.int64)
            grown[: len(self._slot)] = self._slot
            self._slot = grown
        self._n = max(self._n, top)
        slot = self._slot[ids]
        fresh = slot < 0
        k = int(fresh.sum())
        if self._used + k > len(self._rows):
            grown_rows = np.zeros((max(self._used + k, 2 * len(self._rows), 64), self._f), dtype=np.float32)
            grown_rows[: self._used] = self._rows[: self._used]
            self._rows = grown_rows
        slot[fresh] = np.arange(self._used, self._used + k)
        self._used += k
        self._slot[ids] = slot
        self._rows[slot] = rows


# ============================================================================ parsing
@dataclass
class ParsedUpdate:
    """One validated update in the form the graph and the caches take."""

    feature_ids: np.ndarray  # int64 [a], distinct existing ids
    feature_rows: np.ndarray  # float32 [a, F]
    new_features: np.ndarray  # float32 [m, F]
    edit: GraphEdit
    expect_version: int | None = None

    @property
    def num_new(self) -> int:
        return len(self.new_features)


def _rows_of(entries: Any, num_features: int, what: str) -> np.ndarray:
    out = np.zeros((len(entries), num_features), dtype=np.float32)
    for i, e in enumerate(entries):
        f = e.features
        if len(f) != num_features:
            raise InvalidArgument(f"{what}[{i}]: {len(f)} features, the model's graph has {num_features}")
        row = np.asarray(f, dtype=np.float32)
        problem = feature_problem(row)
        if problem:
            raise InvalidArgument(f"{what}[{i}]: {problem}")
        out[i] = row
    return out


def parse_update(request: Any, num_nodes: int, num_features: int, *, max_size: int) -> ParsedUpdate:
    """An ``UpdateGraphRequest`` as a :class:`ParsedUpdate`; shape and range checks of the entries
    (the graph-dependent ones, existing or missing edges and self-loops, are ``apply_edit``'s).

    Raises :class:`InvalidArgument` naming the first bad entry, or when the update has more than
    ``max_size`` entries.
    """
    from kernels.graph_edit import GraphEdit, GraphEditError

    size = (len(request.features) + len(request.new_nodes) + sum(len(n.neighbors) for n in request.new_nodes)
            + len(request.add_edges) + len(request.remove_edges))
    if size > max_size:  # the same count as serve.wire.check_update's on the request's bytes, before the parse
        raise update_size_error(size, max_size)
    if size == 0:
        raise InvalidArgument("empty update: give features, new_nodes, add_edges or remove_edges")
    fids = np.fromiter((r.node for r in request.features), dtype=np.int64, count=len(request.features))
    for i, v in enumerate(fids):
        if not 0 <= v < num_nodes:
            raise InvalidArgument(f"features[{i}]: node {int(v)} is not in the graph (ids 0 .. {num_nodes - 1}; "
                                  "new nodes take their features in new_nodes)")
    if len(fids) > 1:
        uniq, first = np.unique(fids, return_index=True)
        if len(uniq) < len(fids):
            dup = int(np.setdiff1d(np.arange(len(fids)), first)[0])
            raise InvalidArgument(f"features[{dup}]: node {int(fids[dup])} appears twice in this update")
    frows = _rows_of(request.features, num_features, "features")
    m = len(request.new_nodes)
    nfeat = _rows_of(request.new_nodes, num_features, "new_nodes")
    counts = np.array([len(n.neighbors) for n in request.new_nodes], dtype=np.int64)
    new_ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=new_ptr[1:])
    nbrs = np.fromiter((v for n in request.new_nodes for v in n.neighbors), dtype=np.int64, count=int(new_ptr[-1]))
    weighted = any(len(n.edge_weights) for n in request.new_nodes)
    new_w = None
    if weighted:
        parts = []
        for j, n in enumerate(request.new_nodes):
            if len(n.edge_weights) not in (0, len(n.neighbors)):
                raise InvalidArgument(f"new_nodes[{j}]: {len(n.edge_weights)} edge_weights for {len(n.neighbors)} "
                                      "neighbors (give one per neighbour, or none for 1.0 each)")
            parts.append(np.asarray(n.edge_weights, dtype=np.float32) if len(n.edge_weights)
                         else np.ones(len(n.neighbors), dtype=np.float32))
        new_w = np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def edges(entries: Any, with_weights: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        src = np.fromiter((e.src for e in entries), dtype=np.int64, count=len(entries))
        dst = np.fromiter((e.dst for e in entries), dtype=np.int64, count=len(entries))
        w = None
        if with_weights and any(e.HasField("weight") for e in entries):
            w = np.fromiter((e.weight if e.HasField("weight") else 1.0 for e in entries), dtype=np.float32,
                            count=len(entries))
        return src, dst, w

    rs, rd, _ = edges(request.remove_edges, False)
    for i, e in enumerate(request.remove_edges):
        if e.HasField("weight"):
            raise InvalidArgument(f"remove_edges[{i}]: a removal takes no weight")
    a_s, a_d, a_w = edges(request.add_edges, True)
    try:
        edit = GraphEdit.make(new_count=m, new_ptr=new_ptr, new_nbrs=nbrs, new_weights=new_w,
                              add_src=a_s, add_dst=a_d, add_w=a_w, rem_src=rs, rem_dst=rd)
    except GraphEditError as exc:
        raise InvalidArgument(_api_names(str(exc), None, new_ptr)) from None
    return ParsedUpdate(fids, frows, nfeat, edit, expect_version=int(request.expect_graph_version)
                        if request.HasField("expect_graph_version") else None)


# ============================================================================ the live graph
@dataclass
class UpdateResult:
    version: int
    new_ids: np.ndarray
    num_nodes: int
    num_edges: int
    invalidated: dict[str, int] = field(default_factory=dict)
    apply_ms: float = 0.0
    group_size: int = 1  # updates applied together as this version


class _Ticket:
    """One UpdateGraph call waiting for the writer; settles an asyncio future when it has one."""

    def __init__(self, request: Any, future: asyncio.Future[UpdateResult] | None = None,
                 deadline: float | None = None) -> None:
        self.request = request
        self.t0 = time.perf_counter()
        self.deadline = deadline  # the caller's, on the time.monotonic clock (None: none)
        self.done = False
        self.error: BaseException | None = None
        self.result: UpdateResult | None = None
        self.future = future
        self.settled = threading.Event()  # what a blocking caller (LiveGraph.update) waits on

    def expired(self, now: float | None = None) -> bool:
        """Whether the caller's deadline has passed (at ``now``, ``time.monotonic``; default: now)."""
        return self.deadline is not None and (time.monotonic() if now is None else now) >= self.deadline

    def fail(self, exc: BaseException) -> None:
        self.error, self.done = exc, True
        self._settle()

    def finish(self, result: UpdateResult) -> None:
        self.result, self.done = result, True
        self._settle()

    def _settle(self) -> None:
        fut = self.future
        # settled: nothing reads the request any more, and the caller holds the future; a ticket kept beyond this
        # (by a frame an error's traceback holds) keeps neither
        self.request = self.future = None
        self.settled.set()
        if fut is not None:
            fut.get_loop().call_soon_threadsafe(_settle_future, fut, self.result, self.error)


def _settle_future(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():  # the call was cancelled meanwhile: the update stands, nobody waits for its answer
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class _Group:
    """The net effect of consecutive updates, each validated against the state the earlier ones leave.

    Edges of small updates are checked against the graph plus a dict of the group's changes (``(min,
    max)`` -> weight or ``None`` when removed) until an update is large (more than
    :attr:`ORACLE_MAX_ENTRIES` edges: checked faster by the vectorized ``apply_edit``) or needs more than
    that oracle can vouch for (a self-loop, a weight that is not positive and finite, a bad entry:
    anything :func:`kernels.graph_edit.apply_edit` might refuse); from then on the group materialises
    its graph and validates each further update by ``apply_edit`` itself, which names the bad entry. The net edit of the oracle's part is one
    ``apply_edit`` of the graph, so a group of k single-edge updates copies the graph once.
    """

    #: an update with more edges than this is checked by apply_edit (vectorized) rather than edge by edge
    ORACLE_MAX_ENTRIES = 64

    def __init__(self, graph: Any, num_nodes: int, *, chain_only: bool = False) -> None:
        self.graph0 = graph
        self.n0 = int(num_nodes)
        self.t0 = time.perf_counter()  # its validation, new graph and invalidation: what its replay would cost
        self.num_nodes = self.n0
        self.delta: dict[tuple[int, int], float | None] = {}
        self.features: dict[int, np.ndarray] = {}
        self.new_features: list[np.ndarray] = []
        self.chain: Any = None  # the materialised EditEffect once the oracle gave way
        self.chain_changed: list[np.ndarray] = []
        self.chain_only = chain_only

    def _base_weight(self, u: int, v: int) -> float | None:
        g = self.graph0
        if u >= g.num_nodes or v >= g.num_nodes:
            return None
        lo, hi = int(g.indptr[u]), int(g.indptr[u + 1])
        k = lo + int(np.searchsorted(g.indices[lo:hi], v))
        if k < hi and int(g.indices[k]) == v:
            return 1.0 if g.weights is None else float(g.weights[k])
        return None

    def _weight(self, u: int, v: int, local: dict) -> float | None:
        key = (u, v) if u < v else (v, u)
        if key in local:
            return local[key]
        if key in self.delta:
            return self.delta[key]
        return self._base_weight(u, v)

    def _oracle(self, e: GraphEdit, n: int) -> dict | None:
        """The changes of ``e`` if the oracle can vouch for every entry, else ``None``."""
        local: dict[tuple[int, int], float | None] = {}
        m = int(e.new_count)
        top = n + m

        def ok_w(w: float) -> bool:  # what apply_edit and Predict's new nodes accept
            return bool(valid_weights(w))

        for j in range(m):
            v = n + j
            nb = e.new_nbrs[e.new_ptr[j]:e.new_ptr[j + 1]]
            if len(nb) and (int(nb.min()) < 0 or int(nb.max()) >= v or len(np.unique(nb)) < len(nb)):
                return None
            for k, x in enumerate(nb.tolist()):
                w = 1.0 if e.new_weights is None else float(e.new_weights[e.new_ptr[j] + k])
                if not ok_w(w):
                    return None
                local[(x, v)] = w
        for u, v in zip(e.rem_src.tolist(), e.rem_dst.tolist(), strict=True):
            if u == v or not (0 <= u < top and 0 <= v < top) or self._weight(u, v, local) is None:
                return None
            local[(u, v) if u < v else (v, u)] = None
        for k, (u, v) in enumerate(zip(e.add_src.tolist(), e.add_dst.tolist(), strict=True)):
            w = 1.0 if e.add_w is None else float(e.add_w[k])
            if u == v or not (0 <= u < top and 0 <= v < top) or not ok_w(w) \
                    or self._weight(u, v, local) is not None:
                return None
            local[(u, v) if u < v else (v, u)] = w
        return local

    def add(self, parsed: ParsedUpdate, edit_fn: Any) -> None:
        """Take ``parsed`` into the group, or raise :class:`GraphEditError` (the group is unchanged)."""
        e = parsed.edit
        if not e.empty:
            small = len(e.new_nbrs) + len(e.add_src) + len(e.rem_src) <= self.ORACLE_MAX_ENTRIES
            local = (None if (self.chain is not None or self.chain_only or not small)
                     else self._oracle(e, self.num_nodes))
            if local is not None:
                self.delta.update(local)
            else:
                base = self.materialise(edit_fn)
                eff = edit_fn(base, e)  # raises GraphEditError naming the entry
                self.chain = eff
                self.chain_changed.append(eff.changed_rows)
        for v, row in zip(parsed.feature_ids.tolist(), parsed.feature_rows, strict=True):
            if v >= self.n0:
                self.new_features[v - self.n0] = row
            else:
                self.features[v] = row
        self.new_features.extend(parsed.new_features)
        self.num_nodes += parsed.num_new

    def _net_edit(self) -> GraphEdit:
        """The group's changes so far as one edit of ``graph0`` (new nodes, net removals and additions)."""
        from kernels.graph_edit import GraphEdit

        add, rem = [], []
        for (u, v), w in self.delta.items():
            b = self._base_weight(u, v)
            if b is not None and (w is None or w != b):
                rem.append((u, v))
            if w is not None and w != b:
                add.append((u, v, w))
        a = np.array(add, dtype=np.float64).reshape(-1, 3)
        r = np.array(rem, dtype=np.int64).reshape(-1, 2)
        return GraphEdit.make(new_count=self.num_nodes - self.n0,
                              add_src=a[:, 0].astype(np.int64), add_dst=a[:, 1].astype(np.int64),
                              add_w=a[:, 2].astype(np.float32), rem_src=r[:, 0], rem_dst=r[:, 1])

    def materialise(self, edit_fn: Any) -> Any:
        """The graph after the group's updates so far (the oracle's net edit applied once)."""
        if self.chain is not None:
            return self.chain.graph
        net = self._net_edit()  # new nodes so far come with it (their edges are additions in it)
        if net.empty:
            return self.graph0
        eff = edit_fn(self.graph0, net)
        self.chain = eff
        self.chain_changed.append(eff.changed_rows)
        self.delta = {}
        return eff.graph

    def effect(self, edit_fn: Any) -> Any:
        """The group's :class:`~kernels.graph_edit.EditEffect` (``None``: no structural change)."""
        from kernels.graph_edit import EditEffect

        if self.chain is None:
            net = self._net_edit()
            return None if net.empty else edit_fn(self.graph0, net)
        changed = np.unique(np.concatenate(self.chain_changed)) if self.chain_changed else np.zeros(0, np.int64)
        return EditEffect(self.chain.graph, changed, np.arange(self.n0, self.num_nodes, dtype=np.int64))

    def parsed(self) -> ParsedUpdate:
        """The group as one :class:`ParsedUpdate` for :meth:`LiveGraph._apply` (features and new nodes)."""
        from kernels.graph_edit import GraphEdit

        ids = np.array(sorted(self.features), dtype=np.int64)
        f = len(next(iter(self.features.values()))) if self.features else 0
        rows = (np.stack([self.features[int(v)] for v in ids]) if len(ids)
                else np.zeros((0, f), dtype=np.float32))
        new = np.stack(self.new_features) if self.new_features else np.zeros((0, max(f, 0)), np.float32)
        return ParsedUpdate(ids, rows.astype(np.float32), new.astype(np.float32), GraphEdit.make())


class LiveGraph:
    """The updatable state of one dataset's graph (see the module docstring).

    Args:
        data: the dataset's :class:`~serve.runtime.DataBundle` (its ``graph``, ``features`` and
            ``ppr_indexes`` are replaced by their live versions here).
        update_log: the ordered log of accepted updates (:mod:`serve.update_log`), replayed by
            :meth:`replay`; ``None``: updates are refused (read-only).
        read_only: refuse updates (``--read-only``); the log is still replayed and followed.
        max_update_size: entries per update (``--max-update-size``).
        metrics: :class:`serve.metrics.ServerMetrics` or ``None``.
        version: the version ``data`` is at (a compacted snapshot's).
        ppr_tolerance: :class:`kernels.ppr_live.LivePPRIndex`'s ``tol_factor`` (``--ppr-refresh-tolerance``).
        log_fsync: ``--update-log-fsync``, for a file log this follower takes over (:meth:`take_over`).
        ppr_eager_lists: its ``eager_lists`` (``--ppr-eager-lists``; None: every flagged list in the update):
            the lists an update leaves stale are pushed by the lookups that need them and stored by the
            graph's refresh thread (:meth:`_refresh_stale`).
    """

    #: while updates keep coming, the writer compacts without waiting for an idle period once the updates since
    #: the last snapshot took this many times ``--compact-replay-s`` to apply, and at least COMPACT_FORCE_MIN_S
    #: (:meth:`_compact_if_due`: updates wait for such a snapshot, so not more often than that)
    COMPACT_FORCE_FACTOR = 4.0
    COMPACT_FORCE_MIN_S = 60.0

    def __init__(self, data: DataBundle, update_log: Any | None, *, read_only: bool = False,
                 max_update_size: int = 100_000, metrics: Any | None = None, version: int = 0,
                 ppr_tolerance: float = 1.0, ppr_eager_lists: int | None = None, log_fsync: bool = False) -> None:
        self.data = data
        self.log = update_log
        #: a file log another process writes (serve.update_log.FileUpdateLog follow mode): this graph is
        #: answered as that server updates it, and updates go to that server
        self.follows_writer = bool(getattr(update_log, "follow", False))
        self.read_only = bool(read_only) or update_log is None or self.follows_writer
        self._started_read_only = bool(read_only)
        self.max_update_size = int(max_update_size)
        self.ppr_tolerance = float(ppr_tolerance)
        self.ppr_eager_lists = None if ppr_eager_lists is None else int(ppr_eager_lists)
        self.log_fsync = bool(log_fsync)  # a log this server takes over (take_over) is written as the option says
        self._refresh_chunk = 16  # stale lists stored per write lock (adapted to about 5 ms of pushes)
        self._refresh_wake = threading.Event()  # the refresh thread's doorbell (stale PPR lists to store)
        self._threads: dict[str, threading.Thread] = {}  # the writer and refresh threads, once started
        self._refresh_off: str | None = None  # why the background refresh stopped (lookups still push)
        self.metrics = metrics
        self.lock = RWLock()
        self._writer = threading.RLock()  # one group of updates (or log catch-up) at a time
        self._pending_lock = threading.Lock()
        self._pending: list[_Ticket] = []  # UpdateGraph calls waiting for the writer, in arrival order
        self._wake = threading.Event()  # the writer thread's doorbell (update_async)
        self.version = int(version)  # a snapshot's version (compact), else 0: the dataset as loaded
        #: the version of the newest snapshot of this graph (loaded, or written by :meth:`compact`); 0: none
        self.snapshot_version = int(version)
        self._runtimes: weakref.WeakSet[ModelRuntime] = weakref.WeakSet()
        self._version_cond = threading.Condition()
        self.remote = bool(getattr(data.graph, "is_remote", False))
        if not isinstance(data.features, LiveFeatures):
            data.features = LiveFeatures(data.features)
        self.features: LiveFeatures = data.features
        #: whether an update may ever be applied here: a local graph with a log (written, or followed)
        self._takes_updates = update_log is not None and not self.remote
        for key, idx in list(data.ppr_indexes.items()):
            data.ppr_indexes[key] = self.wrap_index(idx)
        if self._takes_updates:  # the first update's kernels compiled now, before serving (kernels.update_warmup)
            warm_once(data.graph)
        self.label = data.fingerprint[:12]
        self._follower: threading.Thread | None = None
        self._stop = threading.Event()
        #: why the graph can no longer be served: an update failed half-way (a bug), its log lost records or
        #: was replaced; requests then fail with FAILED_PRECONDITION (:class:`GraphOutOfService`) until a
        #: restart replays the log, never answer from a half-applied or forked state
        self.broken: str | None = None
        #: called (from whichever thread took the graph out of service) once :attr:`broken` is set: the
        #: registry's ``on_change``, so that the server's health turns NOT_SERVING (serve.server)
        self.on_out_of_service: Callable[[], None] | None = None
        #: seconds the updates applied since the last snapshot took here (this start's replay included): what
        #: replaying them at the next start costs at most (a replay groups what it can: :meth:`catch_up`)
        self.replay_debt_s = 0.0
        self._last_commit = time.monotonic()
        self._compaction: tuple[Path, Path | None, float, float] | None = None  # compact_when_idle's settings
        self._compact_retry_at = 0.0  # after a failed compaction: not again before this (time.monotonic)

    # ---------------------------------------------------------------- models
    def wrap_index(self, idx: Any) -> Any:
        """The live view of a PPR index opened for this graph's current version (what models use)."""
        if self.remote or idx is None:
            return idx
        from kernels.ppr_live import LivePPRIndex

        if isinstance(idx, LivePPRIndex):
            return idx
        if self._takes_updates:
            warm_once(self.data.graph, idx.config)
            # the inverse of the lists, which every update reads: saved beside the index (built once, 4.4 s at
            # 2 M nodes) and memory-mapped, so the first update does not build it in memory
            ensure = getattr(idx, "ensure_inverse", None)
            if ensure is not None:
                try:
                    ensure()
                except Exception:  # the model still loads; the first update builds the inverse itself
                    log.exception("the PPR lists' inverse could not be prepared at load")
        live = LivePPRIndex(idx, tol_factor=self.ppr_tolerance, eager_lists=self.ppr_eager_lists)
        live.on_handed = self._ring_refresh  # a lookup pushed stale lists: the refresh thread stores them
        return live

    def attach(self, rt: ModelRuntime) -> None:
        """Keep ``rt`` up to date with the graph. Build it and attach it inside :meth:`writing`, so that no
        update lands between the graph it was built on and its attachment."""
        self._runtimes.add(rt)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold off updates (not predictions) for the block: a model being built sees one graph."""
        with self._writer:
            yield

    def begin_read(self, blocking: bool = True) -> int | None:
        """Take the read side for a batch and return the version it will see; pair with :meth:`end_read`.
        ``blocking=False``: None, with nothing taken, when that would wait for an update."""
        if blocking:
            self.lock.acquire_read()
        elif not self.lock.try_acquire_read():
            return None
        if self.broken is not None:
            self.lock.release_read()
            raise GraphOutOfService(self.broken)
        return self.version

    def end_read(self) -> None:
        self.lock.release_read()

    # ---------------------------------------------------------------- updates
    def update(self, request: Any) -> UpdateResult:
        """Validate, log and apply one ``UpdateGraphRequest`` (blocking: call it off the event loop).

        Concurrent calls are grouped: the graph's writer thread applies every update waiting at that
        moment, in arrival order, as one graph version (one log record, one new graph, one round of
        invalidation), so a stream of small updates costs one graph copy per group, not per update.
        Each update is still validated on its own against the state its predecessors leave: a bad one
        fails alone, and an update with ``expect_graph_version`` starts a group of its own.
        """
        if self._may_take_over:
            self.take_over()
        self._check_writable()
        ticket = _Ticket(request)
        self._enqueue(ticket)
        ticket.settled.wait()
        error, result = ticket.error, ticket.result
        if error is not None:
            try:
                raise error
            finally:  # the error's traceback holds this frame: no cycle through it (docs: serve.errors.detached)
                error = ticket = None
        assert result is not None
        return result

    async def update_async(self, request: Any, deadline: float | None = None) -> UpdateResult:
        """:meth:`update` for the event loop: the update waits in the queue without a thread of its own,
        and the graph's writer thread applies the queue (so as many updates as arrive meanwhile join one
        group, however many there are).

        ``deadline`` (``time.monotonic``: the call's gRPC deadline) is checked when the writer takes the update
        and again right before its group's log append, the commit point (after its validation and the group's
        new graph, which can take seconds for a large update): an update past its deadline there is refused
        with DEADLINE_EXCEEDED "not applied", and that holds (its caller was told the call failed; a retry does
        not find it applied), the rest of its group committing as if it had never been sent. From the append
        on, the update is committed: if the deadline passes after it (during the apply: the PPR pushes, the
        models' caches; or while the answer travels), the client's gRPC answers DEADLINE_EXCEEDED by itself
        although the update is applied. No server can close that window (the answer is lost after the commit);
        a client that must not apply an update twice retries it with ``expect_graph_version`` (ABORTED then
        means the first attempt landed; the SDK retries updates only then) or reads ``graph_version`` first."""
        if self._may_take_over:  # file IO and a catch-up: off the event loop
            await asyncio.get_running_loop().run_in_executor(None, self.take_over)
        self._check_writable()
        fut: asyncio.Future[UpdateResult] | None = asyncio.get_running_loop().create_future()
        self._enqueue(_Ticket(request, fut, deadline))
        try:
            return await fut
        finally:  # a refusal's traceback holds this frame, the future holds the refusal: no cycle keeps the request
            fut = None

    def _enqueue(self, ticket: _Ticket) -> None:
        """Queue ``ticket`` for the graph's writer thread (started on first use) and ring it."""
        with self._pending_lock:
            self._pending.append(ticket)
        self._ring()

    def _ring(self) -> None:
        """Wake the graph's writer thread (started on first use): updates wait."""
        self._wake_loop("writer", self._wake, self._write_once)

    def _write_once(self) -> None:
        with self._writer:
            while self._pending:
                self._drain()  # it settles every ticket it takes: an exception here is a bug
        freed = graph_edit.BUFFERS.release_idle()  # the spare copies of the arrays, once edits stopped for a while
        if freed:
            log.info("graph %s: no edit for %.0f s; released %.2f GiB of recycled edit buffers", self.label,
                     graph_edit.BUFFERS.idle_s, freed / 2**30)
        self._compact_if_due()

    def stale_lists(self) -> int:
        """PPR lists updates left stale (``ppr_eager_lists``), over the graph's indexes."""
        return sum(int(getattr(idx, "stale_count", 0)) for idx in list(self.data.ppr_indexes.values()))

    def _ring_refresh(self) -> None:
        """Wake the graph's refresh thread (started on first use): stale PPR lists wait to be stored."""
        if not self.remote:
            self._wake_loop("refresh", self._refresh_wake, self._refresh_stale)

    def _wake_loop(self, kind: str, wake: threading.Event, step: Callable[[], None]) -> None:
        """Set ``wake``, first starting the graph's ``kind`` thread: it runs ``step`` whenever woken (and every
        0.5 s) until the graph closes, logging what ``step`` raises and going on."""
        with self._pending_lock:
            if kind not in self._threads:

                def loop() -> None:
                    while not self._stop.is_set():
                        wake.wait(0.5)
                        wake.clear()
                        try:
                            step()
                        except Exception:
                            log.exception("graph %s: the %s thread failed; it goes on", self.label, kind)

                th = threading.Thread(target=loop, name=f"gnnserve-{kind}-{self.label}", daemon=True)
                self._threads[kind] = th
                th.start()
        wake.set()

    def _refresh_stale(self) -> None:
        """Store the PPR lists updates left stale, a chunk at a time (the refresh thread). A chunk's pushes
        run without any lock, beside the batches and the updates (``LivePPRIndex.prepare_refresh`` on half
        the cores); storing them takes the writer and a short write lock (``install_refresh``), and is void
        when an update came in between (the pushes were on the graph before it; counted in
        ``gnnserve_ppr_refreshed_lists``). The lists lookups pushed are stored first (``install_handed``: no push
        at all). Until stored, a lookup pushes a stale list itself, the same list, so answers never depend on how
        far this got."""
        if self.remote or self._refresh_off is not None:
            return
        threads = max(1, (os.cpu_count() or 2) // 2)
        for idx in list(self.data.ppr_indexes.values()):
            while getattr(idx, "stale_count", 0) and self.broken is None and not self._stop.is_set():
                t0 = time.perf_counter()
                prep = None
                handed = idx.has_handed()
                if not handed:
                    try:
                        prep = idx.prepare_refresh(self._refresh_chunk, threads=threads)
                    except Exception as exc:  # the lookups go on pushing these lists themselves
                        self._refresh_off = f"{type(exc).__name__}: {exc}"
                        log.exception("graph %s: storing stale PPR lists failed; lookups keep pushing them",
                                      self.label)
                        return
                ms = 1e3 * (time.perf_counter() - t0)
                stats = dict(idx.refresh_stats)
                try:
                    with self._writer, self.lock.write():
                        if handed:
                            idx.install_handed()
                        else:
                            idx.install_refresh(prep)
                except BaseException as exc:  # half-stored lists: out of service, as a failed update
                    self._out_of_service(f"storing refreshed PPR lists failed half-way ({type(exc).__name__})")
                    raise
                if not handed:  # chunks of about 5 ms of pushes: the lookups' hand-overs are not kept waiting
                    if ms < 2.5:
                        self._refresh_chunk = min(4096, 2 * self._refresh_chunk)
                    elif ms > 8:
                        self._refresh_chunk = max(2, self._refresh_chunk // 2)
                self._observe_refreshed(stats, idx.refresh_stats)
                self._observe_stale()

    def _forked(self, exc: BaseException, what: str) -> bool:
        """Whether ``exc``, from reading the update log, says the log no longer holds what this graph applied (it
        lost records, a Redis flushed or restarted without persistence, or was compacted past them): answering on
        would be answering from a forked graph, so the graph is then taken out of service, ``what (exc)`` saying
        why. A log that cannot be reached for now (:class:`UpdateLogUnavailable`) is not that."""
        from .update_log import UpdateLogError, UpdateLogUnavailable

        if not isinstance(exc, UpdateLogError) or isinstance(exc, UpdateLogUnavailable):
            return False
        self._out_of_service(f"{what} ({exc})", trace=False)
        return True

    def _out_of_service(self, what: str, *, trace: bool = True) -> None:
        """Take the graph out of service after ``what`` left it half-changed or forked: every later request
        for it is FAILED_PRECONDITION with this message (``broken``; :class:`GraphOutOfService`), logged with
        the traceback being handled, and the server's health turns NOT_SERVING (:attr:`on_out_of_service`).
        The first cause stays the one answered; a later one is logged only."""
        why = (f"graph {self.label}: {what}; this server no longer answers for this graph: restart it "
               "(it replays the update log)")
        first = self.broken is None
        if first:
            self.broken = why
        log.error("%s", why, exc_info=trace)
        if first and self.on_out_of_service is not None:
            try:
                self.on_out_of_service()
            except Exception:  # the graph is out of service whatever the health update does
                log.exception("graph %s: the health update after taking it out of service failed", self.label)

    def _observe_stale(self) -> None:
        m = self.metrics
        if m is not None and hasattr(m, "ppr_stale_lists"):
            m.ppr_stale_lists.labels(self.label).set(self.stale_lists())

    def _observe_refreshed(self, before: dict[str, int], after: dict[str, int]) -> None:
        m = self.metrics
        if m is not None and hasattr(m, "ppr_refreshed_lists"):
            for outcome, n in after.items():
                if n > before.get(outcome, 0):
                    m.ppr_refreshed_lists.labels(self.label, outcome).inc(n - before.get(outcome, 0))

    def _unavailable(self, what: str, exc: BaseException) -> str:
        """A client's message for a store failure: what failed and an incident id; the driver's text and the
        (masked) address go to the server log under that id, never to the client (docs/RELIABILITY.md)."""
        incident = f"incident {uuid.uuid4().hex[:12]}"
        log.warning("graph %s: %s (%s): %s", self.label, what, incident, exc)
        return f"{what} ({incident}: the server log has the details)"

    def take_over(self) -> bool:
        """A server that follows another's file log (not ``--read-only``) and is asked for an update: when that
        writer has stopped (its lock is free), open the log to write, apply the records this server had not
        applied yet, and take updates from now on (a rolling restart: the new server started while the old
        one held the log). Whether this server writes the log now. ``flock`` lets one process win."""
        if not self._may_take_over:
            return not self.read_only
        from .update_log import FileUpdateLog, UpdateLogError, UpdateLogInUse

        path = getattr(self.log, "path", None)
        if path is None:
            return False
        with self._writer:
            if not self.follows_writer:  # another call took over meanwhile
                return True
            try:
                writer = FileUpdateLog(path, fsync=self.log_fsync)
            except UpdateLogInUse:  # the writer still runs
                return False
            except UpdateLogError as exc:
                log.warning("graph %s: cannot take over the update log %s: %s", self.label, path, exc)
                return False
            old, self.log = self.log, writer
            self.follows_writer = False  # the follower thread ends at its next look
            with contextlib.suppress(Exception):
                old.close()
            try:
                self.catch_up()  # what the old writer appended after this server's last look
            finally:
                self.read_only = self.broken is not None
            log.warning("graph %s: the server that wrote the update log %s stopped; this one writes it now (at "
                        "version %d)", self.label, path, self.version)
        return not self.read_only

    @property
    def _may_take_over(self) -> bool:
        """A follower of another server's file log, not ``--read-only``: :meth:`take_over` may make it the writer."""
        return self.follows_writer and not self._started_read_only

    def _check_writable(self) -> None:
        if self.read_only:
            if self._started_read_only or not self.follows_writer:
                raise ReadOnly(READ_ONLY_REFUSAL)
            raise ReadOnly("this server does not take graph updates: another server on this repository writes this "
                           "graph's update log; send updates there (this server follows them, and takes the log over "
                           "once that server has stopped)")

    def _drain(self) -> None:
        """Commit the waiting updates, a group at a time (holding the writer)."""
        with self._pending_lock:
            tickets, self._pending = self._pending, []
        if not tickets:
            return
        if self.broken is not None:
            for t in tickets:
                t.fail(GraphOutOfService(self.broken))
            return
        try:
            try:
                self.catch_up()
            except GnnServeError as exc:
                detached(exc)  # kept by the tickets: without the frames its traceback holds (their requests)
                for t in tickets:
                    t.fail(exc)
                return
            except Exception as exc:
                if not self._forked(exc, _LOG_FORKED):
                    raise
                for t in tickets:
                    t.fail(GraphOutOfService(self.broken or str(exc)))
                return
            rest = self._commit_group(tickets)
        except BaseException as exc:  # whatever went wrong, no caller is left waiting for an answer
            for t in tickets:
                if not t.done:
                    t.fail(exc if isinstance(exc, GnnServeError)
                           else Unavailable(self._unavailable("the update could not be applied", exc)))
            raise
        if rest:
            with self._pending_lock:
                self._pending[:0] = rest

    def _commit_group(self, tickets: list[_Ticket]) -> list[_Ticket]:
        """Validate ``tickets`` in order into one group and commit it; returns those left for the next."""
        from kernels.graph_edit import GraphEditError

        group = _Group(self.data.graph, self.features.num_nodes, chain_only=self.remote)
        accepted: list[tuple[_Ticket, ParsedUpdate]] = []
        # validated, in order, and the refusals among them: answered at the commit point, as an update before one
        # may still be dropped there (its deadline), and the refusal then validated again without it
        taken: list[_Ticket] = []
        refused: dict[_Ticket, BaseException] = {}
        for i, t in enumerate(tickets):
            if t.expired():
                t.fail(detached(DeadlineExceeded(
                    "the update's deadline passed while it waited for the graph's writer (a compaction or a long "
                    "update before it): not applied; retry with a longer deadline")))
                continue
            taken.append(t)
            try:
                parsed = parse_update(t.request, group.num_nodes, self.features.num_features,
                                      max_size=self.max_update_size)
            except GnnServeError as exc:
                # without its traceback: that holds this frame (the group, every ticket) and parse_update's (the
                # request), and the ticket and its future keep the error: a cycle only the cyclic GC would free
                refused[t] = detached(exc)
                continue
            if parsed.expect_version is not None:
                if accepted:  # it names the version before it: it starts the next group
                    taken.pop()
                    return self._commit(accepted, group, taken, refused) + tickets[i:]
                if parsed.expect_version != self.version:
                    why = ("another update came first; read the graph again and retry"
                           if parsed.expect_version < self.version else
                           "the graph has not reached that version: expect_graph_version names the version the "
                           "update applies to, the graph_version of the latest answer or update")
                    t.fail(UpdateConflict(f"the graph is at version {self.version}, not {parsed.expect_version}: "
                                          + why))
                    continue
            try:
                group.add(parsed, self._edit_fn)
            except GraphEditError as exc:
                refused[t] = InvalidArgument(_api_names(str(exc), parsed.edit))
                continue
            accepted.append((t, parsed))
        return self._commit(accepted, group, taken, refused)

    def _edit_fn(self, graph: Any, edit: GraphEdit, replay: bool = False) -> Any:
        from kernels.graph_edit import apply_edit

        return _remote_edit(graph, edit, replay=replay) if self.remote else apply_edit(graph, edit)

    def _replay_fn(self, graph: Any, edit: GraphEdit) -> Any:
        return self._edit_fn(graph, edit, replay=True)

    def _commit(self, accepted: list[tuple[_Ticket, ParsedUpdate]], group: _Group, taken: list[_Ticket],
                refused: dict[_Ticket, BaseException]) -> list[_Ticket]:
        """Log the group as one record and make it visible; settle its tickets (``taken``: every update validated
        for the group, in order; ``refused``: those refused, with their errors). Returns the tickets to validate
        again, in order, before those after them (the caller queues them first).

        The log append is the commit point: an update whose deadline has passed by then (its validation, the
        group's new graph or a Redis log's round trips took that long) is refused with DEADLINE_EXCEEDED and
        is guaranteed not applied; the others of the group, validated with it in front of them, are validated
        again without it, and so are the updates after it that validation refused (they may now fail or pass, or
        get other new-node ids, exactly as if it had never been sent).
        Once appended, an update is committed: a deadline that passes during its apply, or an answer lost on the
        way, leaves it applied while the client sees DEADLINE_EXCEEDED from its own gRPC (the server cannot close
        that window; the module docstring and docs/RELIABILITY.md say how a client retries)."""
        from kernels.graph_edit import GraphEditError

        from .update_log import UpdateLogUnavailable, VersionConflict

        def answer_refused(before: int | None = None) -> None:
            for t in taken[:before]:
                if t in refused:
                    t.fail(refused.pop(t))

        if not accepted:
            answer_refused()
            return []
        try:
            effect = group.effect(self._edit_fn)
        except GraphEditError as exc:  # cannot happen: every update was validated; refuse all, apply none
            log.exception("graph %s: a group of validated updates does not apply", self.label)
            answer_refused()
            for t, _ in accepted:
                t.fail(Unavailable(f"graph update not applied (incident: {exc}); retry"))
            return []
        parsed_group = group.parsed()
        try:  # a shaDow graph's list pushes (most of its update) before the commit point, where a deadline still counts
            lists = self._prepare_lists(parsed_group, effect)
        except Exception as exc:  # nothing is changed by a prepare: refuse the group, apply none
            log.exception("graph %s: preparing the PPR lists of a group of updates failed", self.label)
            answer_refused()
            for t, _ in accepted:
                t.fail(Unavailable(f"graph update not applied (incident: {exc}); retry"))
            return []
        late = self._expire([t for t, _ in accepted])  # the commit point is next: the last look at the deadlines
        if late:  # the refusals before the first dropped one stand; every other update is validated again
            answer_refused(taken.index(late[0]))
            return [t for t in taken if not t.done]
        payload = _log_payload([t.request for t, _ in accepted])
        try:
            version = self.log.append(payload, expect_version=self.version)
        except VersionConflict:  # a replica beside us wrote first: its records, then these again (refusals too)
            return [t for t in taken if not t.done]
        except UpdateLogUnavailable as exc:
            # a Redis log that did not answer may still have stored the record (the answer lost, a timeout): the
            # graph applies it when it next reads the log, so "not applied" would not be the truth here
            why = self._unavailable("graph update not confirmed: the update log did not answer, and the update may "
                                    "or may not have been logged (a logged one is applied when the log is read "
                                    "again); read graph_version before sending it again, or retry with "
                                    "expect_graph_version (ABORTED then means it landed)", exc)
            answer_refused()
            for t, _ in accepted:
                t.fail(Unavailable(why))
            return []
        answer_refused()  # committed: they were refused against what it holds
        n0 = self.features.num_nodes
        try:
            inv = self._apply(parsed_group, effect, version, lists)
        except Exception:  # logged by _apply, which also took the graph out of service: no caller waits forever
            for t, _ in accepted:
                t.fail(GraphOutOfService(self.broken or f"graph update {version} failed; restart the server"))
            return []
        g = self.data.graph
        now = time.perf_counter()
        self.replay_debt_s += now - group.t0
        self._last_commit = time.monotonic()
        # the counters first, so that a caller reading them once answered finds its update counted (a failure
        # there is logged, not raised at the callers); the log's size after the replies (a Redis round trip)
        try:
            self._observe(inv, [1e3 * (now - t.t0) for t, _ in accepted], log_size=False)
        except Exception:
            log.exception("graph %s: the update metrics of version %d were not recorded", self.label, version)
        first = n0
        for t, parsed in accepted:
            ids = np.arange(first, first + parsed.num_new, dtype=np.int64)
            first += parsed.num_new
            t.finish(UpdateResult(version, ids, self.features.num_nodes, int(g.num_edges), inv,
                                  1e3 * (now - t.t0), len(accepted)))
        self._observe_log_size()
        return []

    @staticmethod
    def _expire(tickets: list[_Ticket]) -> list[_Ticket]:
        """Refuse (DEADLINE_EXCEEDED, not applied) each of ``tickets`` whose deadline has passed; returns them, in
        order. Called before the log append only, where "not applied" holds."""
        now, late = time.monotonic(), []
        for t in tickets:
            if t.expired(now):
                late.append(t)
                t.fail(detached(DeadlineExceeded(
                    "the update's deadline passed before it was logged (its validation and the new graph took that "
                    "long, or it waited behind a compaction or a long update): not applied; retry with a longer "
                    "deadline")))
        return late

    def _prepare_lists(self, parsed: ParsedUpdate, effect: Any) -> list:
        """Each PPR index's :meth:`~kernels.ppr_live.LivePPRIndex.prepare` for ``parsed``'s new graph: the pushes
        (the bulk of a shaDow graph's update), computed while batches still run on the old graph and without
        changing anything (an update refused at its commit point after them leaves the lists as they were)."""
        if self.remote or effect is None:  # a replica's overlay changes in place under the lock
            return []
        n_old = self.features.num_nodes
        new_ids = np.arange(n_old, n_old + parsed.num_new, dtype=np.int64)
        old = self.data.graph
        return [(idx, idx.prepare(old, effect.graph, effect.changed_rows, new_ids))
                for idx in self.data.ppr_indexes.values()]

    def _apply(self, parsed: ParsedUpdate, effect: Any, version: int, lists: list | None = None) -> dict[str, int]:
        """Make ``parsed`` (and ``effect``, its new graph) visible as ``version``. What the models derive
        from the new graph is computed first, while batches still run on the old one; the write lock is
        held only to install it and drop the stale rows. ``lists``: :meth:`_prepare_lists` of it, when the caller
        prepared them before its commit point (None: prepared here)."""
        inv: dict[str, int] = {}
        n_old = self.features.num_nodes
        new_ids = np.arange(n_old, n_old + parsed.num_new, dtype=np.int64)
        changed = effect.changed_rows if effect is not None else np.zeros(0, dtype=np.int64)
        old = self.data.graph
        try:
            plans = None
            if lists is None:
                lists = self._prepare_lists(parsed, effect)
            if not self.remote:  # a replica's overlay changes in place: its models prepare under the lock
                graph = effect.graph if effect is not None else old
                plans = [(rt, rt.prepare_rebase(graph, old, changed, parsed.feature_ids, new_ids))
                         for rt in list(self._runtimes)]
            with self.lock.write():
                self._apply_locked(parsed, effect, version, inv, plans, lists, new_ids, changed)
        except BaseException as exc:
            self._out_of_service(f"update {version} failed half-way ({type(exc).__name__})")
            raise
        with self._version_cond:
            self._version_cond.notify_all()
        if inv.get("ppr_deferred"):
            self._observe_stale()
            self._ring_refresh()  # the refresh thread stores them
        return inv

    def _apply_locked(self, parsed: ParsedUpdate, effect: Any, version: int, inv: dict[str, int],
                      plans: list | None, lists: list, new_ids: np.ndarray, changed: np.ndarray) -> None:
        old = self.data.graph
        if len(parsed.feature_ids):
            self.features.write(parsed.feature_ids, parsed.feature_rows)
        if parsed.num_new:
            self.features.write(new_ids, parsed.new_features)
        if effect is not None and self.remote:  # the replica's overlay of the Redis snapshot
            g = effect.graph  # a _ReplicaEdit: every row the group changed
            self.data.graph.apply_rows({int(v): g.rows[int(v)] for v in changed}, g.num_nodes)
        elif effect is not None:
            self.data.graph = effect.graph
            for idx, prep in lists:
                got = idx.install(prep)
                inv["ppr_lists"] = inv.get("ppr_lists", 0) + int(got.get("recomputed", 0)) + int(got.get("new", 0))
                if got.get("deferred"):
                    inv["ppr_deferred"] = inv.get("ppr_deferred", 0) + int(got["deferred"])
                inv["induced"] = inv.get("induced", 0) + int(got.get("dirty", 0))
        if plans is None:
            plans = [(rt, rt.prepare_rebase(self.data.graph, old, changed, parsed.feature_ids, new_ids))
                     for rt in list(self._runtimes)]
        for rt, plan in plans:
            for k, v in rt.commit_rebase(plan).items():
                inv[k] = inv.get(k, 0) + v
        self.version = version

    def _observe(self, inv: dict[str, int], ms: list[float], log_size: bool = True) -> None:
        """Metrics of one applied group: its updates, each one's time from arrival to visible; and, with
        ``log_size``, the log's size (a Redis round trip for a Redis log: :meth:`_observe_log_size`)."""
        m = self.metrics
        if m is None or not hasattr(m, "graph_updates"):
            return
        m.graph_updates.labels(self.label).inc(len(ms))
        m.graph_version.labels(self.label).set(self.version)
        h = m.update_seconds.labels(self.label)
        for x in ms:
            h.observe(x / 1e3)
        for cache, rows in inv.items():
            m.rows_invalidated.labels(self.label, cache).inc(rows)
        if log_size:
            self._observe_log_size()

    def _observe_log_size(self) -> None:
        m = self.metrics
        if self.log is not None and m is not None and hasattr(m, "update_log_bytes"):
            with contextlib.suppress(Exception):
                m.update_log_bytes.labels(self.label).set(self.log.size_bytes())

    # ---------------------------------------------------------------- the log
    def catch_up(self) -> int:
        """Apply every logged update not applied yet (start-up replay, followers); returns how many."""
        if self.log is None:
            return 0
        from .update_log import UpdateLogUnavailable

        done = 0
        t0 = t_log = time.monotonic()
        with self._writer:
            while True:
                try:
                    records = self.log.read(self.version, limit=1024)
                except UpdateLogUnavailable as exc:
                    raise Unavailable(self._unavailable("cannot read the graph's update log; retry with backoff",
                                                        exc)) from None
                if not records:
                    if done:
                        self.replay_debt_s += time.monotonic() - t0
                        if time.monotonic() - t0 > 5:
                            log.info("graph %s: replayed %d logged versions in %.1f s", self.label, done,
                                     time.monotonic() - t0)
                    return done
                # a graph without PPR lists replays its records in groups: one new graph per group instead of one
                # per record (its answers depend on the graph and features alone, the same either way); a PPR
                # graph's lists depend on how its edits were grouped, so its records replay one by one, as written
                step = 1 if self.data.ppr_indexes else len(records)
                for lo in range(0, len(records), step):
                    chunk = records[lo:lo + step]
                    self._replay_records(chunk)
                    done += len(chunk)
                    if time.monotonic() - t_log > 5:  # a long replay says how far it got
                        t_log = time.monotonic()
                        log.info("graph %s: replaying the update log: %d logged versions applied, now at version %d "
                                 "(%.0f s)", self.label, done, self.version, t_log - t0)

    def _replay_failure(self, version: int, exc: BaseException) -> Exception:
        """The error of a logged update that cannot be applied again: where it is and how to repair it
        (``gnnserve log``). An :class:`UpdateLogError`, so that a follower takes the graph out of service
        instead of retrying a record that fails every time."""
        from .update_log import UpdateLogError

        path = getattr(self.log, "path", None)
        head = version
        with contextlib.suppress(Exception):
            head = int(self.log.head())
        what = f"it and the {head - version} after it" if head > version else "it"
        if path is not None:
            where = f"--log-dir {Path(path).parent} --graph {self.label}"
            fix = (f"'gnnserve log show {where}' lists the records; 'gnnserve log truncate {where} --after "
                   f"{version - 1} --yes' (every server of the log stopped) drops {what}; updates dropped were "
                   "acknowledged to their clients: keep them first with 'gnnserve log show ... --json'")
        else:
            fix = "the log is a Redis stream: inspect and trim it with Redis's tools"
        return UpdateLogError(f"graph {self.label}: logged update {version} cannot be applied again "
                              f"({type(exc).__name__}: {exc}); the graph stays at version {self.version}, out of "
                              f"service, and the log is kept as it is. {fix}")

    def _replay_records(self, records: list[tuple[int, bytes]]) -> None:
        """Apply logged ``records`` (consecutive versions after :attr:`version`) as one group: one new graph and
        one round of invalidation, the graph at the last record's version after it (an update the writer
        grouped the same way would give the same graph). A record that does not apply again is raised as
        :meth:`_replay_failure` with the graph at the version before it, as a replay record by record leaves it."""
        from clients._gen import gnnserve_pb2 as pb

        t0 = time.perf_counter()
        group = _Group(self.data.graph, self.features.num_nodes, chain_only=self.remote)
        count = 0
        for i, (version, payload) in enumerate(records):
            try:
                if version != self.version + 1 + i:
                    raise RuntimeError(f"update log of graph {self.label}: record {version} after "
                                       f"{self.version + i}")
                updates = pb.UpdateLogRecord.FromString(payload).updates
                for req in updates:  # accepted when written: valid again on the same state
                    group.add(parse_update(req, group.num_nodes, self.features.num_features, max_size=1 << 62),
                              self._replay_fn)
            except Exception as exc:
                if i:  # the records before it (the group has part of this one): the graph at the version before it
                    self._replay_records(records[:i])
                raise self._replay_failure(version, exc) from exc
            count += len(updates)
        try:
            inv = self._apply(group.parsed(), group.effect(self._replay_fn), records[-1][0])
        except Exception as exc:
            raise self._replay_failure(records[0][0], exc) from exc
        self._observe(inv, [1e3 * (time.perf_counter() - t0) / max(count, 1)] * count)

    def compact(self, directory: str | Path, ppr_cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Fold the applied updates into a snapshot of the graph and features at ``directory`` (what a
        restart then loads instead of the dataset: :func:`load_snapshot`), then drop the log's records up to
        the *previous* snapshot's version: a follower (another server on the repository, a process of
        ``--processes``) up to one compaction behind still reads the records it lacks; a start reads from
        the snapshot's version. Updates wait meanwhile; predictions go on. With ``ppr_cache_dir`` the graph's
        PPR lists are saved there too, as the index of the snapshot's graph
        (:meth:`kernels.ppr_live.LivePPRIndex.as_index`), which the next start opens instead of building one,
        and the lists earlier compactions of this dataset saved there are removed.

        Crash-safe: everything is written to a sibling directory with plain writes (a full disk is an
        ``OSError`` here, never a SIGBUS of a memory map) and fsynced, the partial directory removed on any
        failure; then the previous snapshot is moved aside and the new one renamed in (a process killed
        between the two renames leaves both complete: :func:`load_snapshot` takes the newer); the log's
        records are dropped last."""
        d = Path(directory)
        t0 = time.perf_counter()
        with self._writer:
            version = self.version
            graph = self.data.graph
            n, f = self.features.num_nodes, self.features.num_features
            remove_stale_tmp(d.parent, d.name, "an interrupted snapshot")
            remove_stale_snapshots(d)
            tmp = d.with_name(f"{d.name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                self._write_snapshot(tmp, graph, version, n, f)
                if ppr_cache_dir is not None:
                    self._save_ppr_lists(Path(ppr_cache_dir), graph)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            old = d.with_name(f"{d.name}.old-{os.getpid()}")
            if d.exists():
                os.replace(d, old)
            os.replace(tmp, d)
            fsync_dir(d.parent)
            shutil.rmtree(old, ignore_errors=True)
            before = self.log.size_bytes() if self.log is not None else 0
            keep = self.snapshot_version
            if self.log is not None and keep > self.log.base:
                self.log.truncate_before(keep)
            after = self.log.size_bytes() if self.log is not None else 0
            self.snapshot_version = version
            self.replay_debt_s = 0.0
        self._observe_log_size()
        out = {"version": version, "nodes": n, "edges": int(graph.num_edges), "log_bytes_before": before,
               "log_bytes_after": after, "seconds": time.perf_counter() - t0}
        log.info("graph %s: compacted at version %d into %s (log %d -> %d bytes, kept from version %d) in %.1f s",
                 self.label, version, d, before, after, keep, out["seconds"])
        return out

    def _write_snapshot(self, tmp: Path, graph: Any, version: int, n: int, f: int) -> None:
        """The snapshot's files in ``tmp`` (a new directory), fsynced, its metadata last."""
        from kernels.datasets import npy_header

        tmp.mkdir(parents=True)
        graph.save(tmp / "graph")
        with open(tmp / "x.npy", "wb") as fh:
            fh.write(npy_header((n, f), np.dtype(np.float32)))
            for lo in range(0, n, 65536):
                hi = min(n, lo + 65536)
                with self.lock.read():
                    rows = self.features.get(np.arange(lo, hi, dtype=np.int64))
                fh.write(np.ascontiguousarray(rows, dtype=np.float32).data)
            fh.flush()
            os.fsync(fh.fileno())
        for path in (tmp / "graph").iterdir():
            fsync_path(path)
        fsync_dir(tmp / "graph")
        meta = tmp / SNAPSHOT_META
        meta.write_text(json.dumps({
            "format": SNAPSHOT_FORMAT, "version": version, "dataset_fingerprint": self.data.fingerprint,
            "num_nodes": n, "num_edges": int(graph.num_edges), "created_at": time.time()}))
        fsync_path(meta)
        fsync_dir(tmp)

    def compact_when_idle(self, directory: str | Path, ppr_cache_dir: str | Path | None, *, replay_s: float,
                          idle_s: float = 60.0) -> None:
        """While serving, :meth:`compact` into ``directory`` once the updates applied since the last snapshot
        took more than ``replay_s`` seconds here (:attr:`replay_debt_s`: what the next start would spend
        replaying them, at most) and no update has come for ``idle_s`` seconds (the graph's writer thread
        looks every half second; updates that arrive meanwhile wait for the snapshot, predictions go on).
        Only a server that writes a file log compacts it (not a follower, nor a Redis stream's replicas)."""
        self._compaction = (Path(directory), None if ppr_cache_dir is None else Path(ppr_cache_dir),
                            float(replay_s), float(idle_s))

    def compaction_due(self, replay_s: float, max_log_bytes: int = 0) -> bool:
        """Whether this server may compact the log (it writes a file log, the graph is in service and past its
        snapshot) and should: the updates since the last snapshot would take a start more than ``replay_s``
        seconds to replay (``replay_s`` > 0), or the log holds more than ``max_log_bytes`` (> 0)."""
        from .update_log import FileUpdateLog

        if not (self.broken is None and isinstance(self.log, FileUpdateLog) and not self.log.follow
                and not self.read_only and self.version > self.snapshot_version):
            return False
        return ((replay_s > 0 and self.replay_debt_s > replay_s)
                or (max_log_bytes > 0 and self.log.size_bytes() > max_log_bytes))

    def _compact_if_due(self) -> None:
        """The writer thread's look (:meth:`compact_when_idle`): once no update came for ``idle_s``, or at once
        when the updates since the last snapshot took :attr:`COMPACT_FORCE_FACTOR` times ``replay_s`` and at least
        :attr:`COMPACT_FORCE_MIN_S` seconds to apply (a steady
        stream of updates never leaves the writer idle, and the next start's replay would grow without bound;
        the updates then wait for one snapshot). A failure is logged and retried in 10 minutes."""
        if self._compaction is None:
            return
        directory, ppr_dir, replay_s, idle_s = self._compaction
        now = time.monotonic()
        if now < self._compact_retry_at or not self.compaction_due(replay_s):
            return
        forced = self.replay_debt_s > max(self.COMPACT_FORCE_FACTOR * replay_s, self.COMPACT_FORCE_MIN_S)
        if not forced and (self._pending or now - self._last_commit < idle_s):
            return
        why = (f"no update for {now - self._last_commit:.0f} s" if not forced else
               f"updates kept coming (more than {self.COMPACT_FORCE_FACTOR:g} x --compact-replay-s of them)")
        log.info("graph %s: %s, and the %d logged versions since the last snapshot took %.1f s to apply: "
                 "compacting the update log", self.label, why, self.version - self.snapshot_version,
                 self.replay_debt_s)
        try:
            self.compact(directory, ppr_cache_dir=ppr_dir)
        except Exception:
            self._compact_retry_at = time.monotonic() + 600
            log.exception("graph %s: compacting the update log failed; the log is kept as it was (next try in "
                          "10 minutes)", self.label)

    def _save_ppr_lists(self, cache_dir: Path, graph: Any) -> None:
        """Each PPR index of the graph, as it is now, saved into ``cache_dir`` where ``PPRIndex.open_or_build``
        looks for the index of ``graph`` (written beside and renamed into place; kept if already there)."""
        from kernels.ppr import PPRIndex

        prefix = None
        for idx in list(self.data.ppr_indexes.values()):
            if not hasattr(idx, "as_index"):
                continue
            final = PPRIndex.path_for(cache_dir, graph, idx.config)
            prefix = final.name[: len(final.name) - len(idx.config.key())]  # ppr-<the snapshot graph's fingerprint>-
            if not (final / "meta.json").exists():  # kept (checked first: the lists are not gathered for nothing)
                t0 = time.perf_counter()
                with self.lock.read():  # lookups go on; installs take the writer, held here
                    saved = idx.as_index()
                saved.meta.setdefault("from_live", {})["dataset"] = self.data.fingerprint
                saved.publish(cache_dir)
                log.info("graph %s: PPR lists saved as the snapshot graph's index %s (%d lists) in %.1f s",
                         self.label, final.name, saved.num_nodes, time.perf_counter() - t0)
        self._remove_earlier_lists(cache_dir, prefix)

    def _remove_earlier_lists(self, cache_dir: Path, keep_prefix: str | None) -> None:
        """The PPR lists earlier compactions of this dataset saved (no start loads them: their snapshot was
        replaced; those of the new snapshot's graph, named ``keep_prefix...``, stay; none when it is ``None``),
        and index directories no start can open (no ``meta.json``), unless a live process is writing into them
        (:func:`kernels.ppr_index.remove_orphan_indexes`: an induced table a start builds beside serving is saved
        into the snapshot's lists, which the start's compaction replaces); the dataset's own index, and lists
        of other datasets, stay. A server still reading removed lists keeps its open files."""
        from kernels.ppr_index import remove_orphan_indexes

        for name in remove_orphan_indexes(cache_dir, dataset=self.data.fingerprint if keep_prefix else None,
                                          keep_prefix=keep_prefix):
            log.info("graph %s: removed PPR lists no snapshot uses, %s", self.label, name)

    def wait_for(self, version: int, timeout: float) -> bool:
        """Whether the graph reaches ``version`` within ``timeout`` seconds (reading the log first:
        a missed follower message never leaves a replica answering from an older version). A version the
        log does not hold yet is refused at once (:class:`NotWritten`): an update is acknowledged only once
        logged, so no client can have been told of it, and waiting for it would hold a thread for nothing.
        A log that cannot be read the first time is :class:`Unavailable` (Redis unreachable: a cause that may
        pass; a WARNING line with an incident id, no traceback), one that no longer holds what this graph
        applied takes the graph out of service (:class:`GraphOutOfService`), as is a graph already out of it.
        A log read is bounded by the log's own client (a hung Redis: about ``(retries + 1) * socket_timeout``,
        serve.update_log), not by ``timeout``: the caller bounds its own wait (serve.servicer.reach_version)."""
        from .update_log import UpdateLogUnavailable

        deadline = time.monotonic() + timeout
        first = True  # a failing log read is the caller's error the first time; later the wait goes on
        while self.version < version:
            if self.broken is not None:  # the follower stopped: the version can never come
                raise GraphOutOfService(self.broken)
            if self.log is not None:
                try:
                    head = int(self.log.head())
                    if head >= version:
                        self.catch_up()
                        continue
                    if first:
                        raise NotWritten(f"graph version {version} has not been written: the graph's update log "
                                         f"ends at version {head} (a version comes from an UpdateGraph answer)")
                except NotWritten:
                    raise
                except UpdateLogUnavailable as exc:
                    if first:
                        raise Unavailable(self._unavailable(
                            "cannot read the graph's update log to reach the requested graph version; retry with "
                            "backoff", exc)) from None
                except Exception as exc:
                    if self._forked(exc, _LOG_FORKED):
                        raise GraphOutOfService(self.broken or str(exc)) from None
                    if first:
                        raise
            first = False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._version_cond:
                if self.version < version:
                    self._version_cond.wait(min(left, 0.05))
        return True

    def follow(self, interval: float = 1.0) -> None:
        """Apply other servers' updates as they reach the log (a daemon thread; replicas)."""
        if self.log is None or self._follower is not None:
            return

        file_follower = self.follows_writer

        def run() -> None:
            while not self._stop.is_set():
                if file_follower and not self.follows_writer:  # this server took the log over: it writes it
                    return
                try:
                    if self.log.wait(self.version, interval):
                        self.catch_up()
                except Exception as exc:
                    if file_follower and not self.follows_writer:  # the old log, closed by take_over
                        return
                    if self._forked(exc, "following its update log failed"):
                        return
                    # Redis down: keep trying; requests needing newer versions fail loudly
                    log.warning("graph %s: following the update log failed (%s); retrying", self.label, exc)
                    self._stop.wait(interval)

        self._follower = threading.Thread(target=run, name=f"gnnserve-follow-{self.label}", daemon=True)
        self._follower.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._refresh_wake.set()
        if self.log is not None:
            with contextlib.suppress(Exception):
                self.log.close()


def _api_names(message: str, edit: GraphEdit | None, new_ptr: np.ndarray | None = None) -> str:
    """A :class:`kernels.graph_edit.GraphEditError` message in the API's words: the kernel's flat
    ``new_nbrs[k]`` / ``new_weights[k]`` become ``new_nodes[j].neighbors[i]`` / ``.edge_weights[i]``."""
    import re

    ptr = edit.new_ptr if edit is not None else new_ptr
    if ptr is None or not len(ptr):
        return message

    def name(m: re.Match[str]) -> str:
        k = int(m.group(2))
        j = int(np.searchsorted(ptr, k, side="right")) - 1
        field = "neighbors" if m.group(1) == "new_nbrs" else "edge_weights"
        return f"new_nodes[{j}].{field}[{k - int(ptr[j])}]"

    return re.sub(r"\b(new_nbrs|new_weights)\[(\d+)\]", name, message)


class _ReplicaEdit:
    """A replica's graph while a group of updates is validated: the rows the group changed so far (``rows``:
    ``{node: (ids int64, weights or None)}``) over the store's (Redis and its overlay), the node count and the
    self-loop count after them. The group's next update reads its rows through it (:func:`_remote_edit`), so it
    sees the earlier updates' edges and new nodes; the group's effect carries every row it changed, which
    :meth:`LiveGraph._apply_locked` gives the store's overlay."""

    def __init__(self, store: Any, rows: dict[int, tuple[np.ndarray, np.ndarray | None]], num_nodes: int,
                 self_loops: int | None) -> None:
        self.store = store
        self.rows = rows
        self.num_nodes = int(num_nodes)
        self.self_loops = self_loops

    def adjacency(self, ids: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        out = {int(v): self.rows[int(v)] for v in ids if int(v) in self.rows}
        stored = np.array([v for v in ids if int(v) not in out and v < self.store.num_nodes], dtype=np.int64)
        if len(stored):
            out.update(self.store.adjacency(stored))
        for v in ids:  # a node the group added without edges
            out.setdefault(int(v), (np.zeros(0, np.int64), None))
        return out

    def neighbors(self, v: int) -> np.ndarray:
        return self.adjacency(np.array([v], dtype=np.int64))[int(v)][0]


def _remote_edit(base: Any, edit: GraphEdit, *, replay: bool = False) -> Any:
    """:func:`kernels.graph_edit.apply_edit` on a replica's Redis graph (``base``: the store, or the
    :class:`_ReplicaEdit` of the updates of the group before this one): the rows the edit touches are fetched
    (the group's rows, then the overlay, then Redis) into a graph of the current node count whose other rows are
    empty, so the same validation and the same new rows come out. A self-loop is taken iff the graph has one, as
    in memory (the store's count, ``RedisGraphStore.self_loops``; a graph loaded without that count refuses
    them, except in a logged update being replayed: ``replay``, accepted when it was written). Returns an
    ``EditEffect`` whose graph is a :class:`_ReplicaEdit` holding every row the group changed so far."""
    from kernels.graph import CSRGraph, index_dtype_for
    from kernels.graph_edit import _SELF_LOOPS_KEY, EditEffect, _self_loop_count, apply_edit

    prior = base if isinstance(base, _ReplicaEdit) else _ReplicaEdit(base, {}, base.num_nodes,
                                                                     getattr(base, "self_loops", None))
    n = prior.num_nodes
    touched = np.unique(np.concatenate([edit.new_nbrs, edit.add_src, edit.add_dst, edit.rem_src, edit.rem_dst]))
    touched = touched[(touched >= 0) & (touched < n)]  # out-of-range ids: apply_edit names them
    rows = prior.adjacency(touched) if len(touched) else {}
    counts = np.zeros(n + 1, dtype=np.int64)
    for v in touched:
        counts[v + 1] = len(rows[int(v)][0])
    indptr = np.cumsum(counts)
    weighted = any(w is not None for _, w in rows.values())
    ids = [rows[int(v)][0] for v in touched]
    indices = np.concatenate(ids).astype(index_dtype_for(n)) if ids else np.zeros(0, index_dtype_for(n))
    weights = None
    if weighted:
        weights = np.concatenate([rows[int(v)][1] if rows[int(v)][1] is not None
                                  else np.ones(len(rows[int(v)][0]), np.float32) for v in touched]).astype(np.float32)
    local = CSRGraph(indptr, indices, weights, num_nodes=n)
    loops = prior.self_loops
    if loops is None:
        eff = apply_edit(local, edit, allow_self_loops=replay)
    else:  # the whole graph's count, as apply_edit reads (and carries over) it in memory: the same check and words
        local.cache()[_SELF_LOOPS_KEY] = int(loops)
        eff = apply_edit(local, edit)
    g = eff.graph
    changed = {int(v): (g.indices[g.indptr[v]:g.indptr[v + 1]].astype(np.int64),
                        None if g.weights is None else g.weights[g.indptr[v]:g.indptr[v + 1]].copy())
               for v in eff.changed_rows.tolist()}
    after = _ReplicaEdit(prior.store, {**prior.rows, **changed}, g.num_nodes,
                         None if loops is None else _self_loop_count(g))
    return EditEffect(after, eff.changed_rows, eff.new_ids)


SNAPSHOT_META = "snapshot.json"
SNAPSHOT_FORMAT = "gnnserve.snapshot/1"


def load_snapshot(directory: str | Path, dataset_fingerprint: str) -> tuple[Any, np.ndarray, int] | None:
    """``(graph, features [N, F] memory map, version)`` of a snapshot :meth:`LiveGraph.compact` wrote for
    that dataset, or ``None`` when there is none. A snapshot of another dataset is an error.

    A compaction killed between moving the previous snapshot aside and renaming the new one in left no
    ``directory`` but both complete beside it: the newer is renamed into place. The metadata is read again
    after the arrays: a writer that swapped snapshots meanwhile (a follower starting beside it) makes the
    read start over, so the version and the arrays are always of one snapshot."""
    from kernels.graph import CSRGraph

    d = Path(directory)
    for _ in range(200):
        try:
            meta = json.loads((d / SNAPSHOT_META).read_text())
        except FileNotFoundError:
            if d.exists() or not _restore_swapped(d):
                return None
            continue
        if meta.get("format") != SNAPSHOT_FORMAT or meta.get("dataset_fingerprint") != dataset_fingerprint:
            raise ValueError(f"{d} is not a snapshot of dataset {dataset_fingerprint} (its {SNAPSHOT_META} says "
                             f"{meta.get('format')!r}, {meta.get('dataset_fingerprint')!r})")
        try:
            graph = CSRGraph.load(d / "graph", mmap=True)
            x = np.load(d / "x.npy", mmap_mode="r")
            again = json.loads((d / SNAPSHOT_META).read_text())
        except FileNotFoundError:  # swapped while read
            continue
        if again != meta:
            continue
        if x.shape[0] != graph.num_nodes:
            raise ValueError(f"snapshot {d}: {x.shape[0]} feature rows for {graph.num_nodes} nodes")
        return graph, x, int(meta["version"])
    raise RuntimeError(f"snapshot {d} kept changing while it was read")


def _restore_swapped(d: Path) -> bool:
    """After a compaction killed between its two renames (``d`` missing): rename the newest complete snapshot
    beside it (``d.old-PID``, ``d.tmp-PID``) into place; True if one was, or if the compacting process still
    runs (its swap is under way: read again). False: there is no snapshot."""
    from glob import escape

    found = []
    for p in [*d.parent.glob(f"{escape(d.name)}.old-*"), *d.parent.glob(f"{escape(d.name)}.tmp-*")]:
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            time.sleep(0.05)
            return True
        try:
            found.append((int(json.loads((p / SNAPSHOT_META).read_text())["version"]), p))
        except (OSError, ValueError, KeyError):
            continue  # incomplete: no metadata yet
    if not found:
        return False
    version, best = max(found)
    try:
        os.replace(best, d)
    except OSError:  # another process of this repository restored one first (gone, or d exists now): read again
        time.sleep(0.05)
        return True
    log.warning("snapshot %s was missing (a compaction stopped between its renames): %s, at version %d, renamed "
                "into place", d, best.name, version)
    remove_stale_snapshots(d)
    return True


def remove_stale_snapshots(d: Path) -> None:
    """Remove the complete snapshots a compaction killed between its renames left beside ``d`` (``d.old-PID`` of a
    process no longer running: never read once ``d`` is in place, and as large as the snapshot)."""
    from glob import escape

    if not (d / SNAPSHOT_META).exists():
        return
    for stale in d.parent.glob(f"{escape(d.name)}.old-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            log.warning("removing %s, a snapshot an interrupted compaction left", stale)
            shutil.rmtree(stale, ignore_errors=True)


def _log_payload(requests: list[Any]) -> bytes:
    """The log record of updates applied together: the requests without their routing fields."""
    from clients._gen import gnnserve_pb2 as pb

    rec = pb.UpdateLogRecord()
    for request in requests:
        r = rec.updates.add()
        r.CopyFrom(request)
        r.ClearField("model")
        r.ClearField("version")
        r.ClearField("expect_graph_version")
    return rec.SerializeToString()
