r"""Execution plans: the rows a plain L-layer model must compute for a batch of targets, and nothing more.

A plain GCN/GraphSAGE computes target ``t``'s output at layer ``L`` from layer ``L-1`` at the
nodes its row aggregates, those from layer ``L-2`` at the nodes *their* rows aggregate, and so on.
Cutting an induced L-hop subgraph per target (:func:`kernels.subgraph.lhop_nodes` +
:func:`~kernels.subgraph.induced_batch`) computes every layer on every node of every target's
scope: on Amazon Computers (mean degree 36) that is thousands of rows and tens of thousands of
edges per target per layer, all but a few of them thrown away. The plan computes the needed rows
once for the whole batch:

.. math::

    S_L = T, \qquad S_{l-1} = S_l \cup \{ j : j \in N_S(i),\ i \in S_l \} \quad (l = L, \dots, 1)

where :math:`N_S(i)` is the set of edges row ``i`` keeps at sampling width ``S`` (all of them when
exact; the same positions :mod:`kernels.spmm` samples, see :func:`kernels.spmm.sample_positions`).
Layer ``l`` computes the rows of :math:`S_l` only, from the rows of :math:`S_{l-1}`; sampling
therefore also shrinks the receptive field, not only the arithmetic (at ``S = 8`` a 2-layer model
reads at most ``1 + 8 + 8 \cdot 9`` nodes per target instead of its whole 2-hop scope).

Local ids are nested prefixes: the batch's targets are ``0 .. B-1`` and :math:`S_l` is
``0 .. n_l - 1``. One CSR holds the kept edges of every aggregated row (the rows of
:math:`S_1`, full graph rows, their edges in the graph's order), columns in local ids; layer ``l``
uses its first ``n_l`` rows as a square graph over ``n_{l-1}`` nodes (:meth:`ExecutionPlan.layer_graph`).

The result equals the full-graph forward at the same width (``model(graph, x, width)`` at the
targets' rows, how the training module evaluates a plain model): a row the plan computes is the
full graph row, its edges in the graph's order, so it keeps the same edges. The kept rows are
pre-weighted by ``d_i / k_i`` where the aggregator rescales (``gcn``, ``sum``) and left alone for
``mean``, so an exact (width ``None``) :func:`kernels.spmm.sampled_spmm` on a layer graph gives
the sampled aggregation. Per-target induced L-hop subgraphs (:func:`kernels.subgraph.induced_batch`)
give the same numbers at exact width only: their rows list columns in local (discovery) order, so
a sampled row keeps other edges there, and differently in every subgraph that holds the node.
"""

# numba cache key: lanes 4d5e0af8c182, spmm_cpu c8e7f1d6109d, subgraph 47e999493df1

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numba
import numpy as np

from .graph import CSRGraph
from .spmm_cpu import walk_start, walk_step
from .subgraph import _give_scratch, _grow, _take_scratch

__all__ = [
    "ExactPathEdges",
    "ExecutionPlan",
    "edges_on_paths",
    "edges_on_two_layer_paths",
    "exact_path_edges",
    "execution_plan",
    "local_plan",
    "two_layer_kept",
    "update_walk_sums",
    "walk_bounds",
    "walk_sums",
]

_LOW = (1 << 32) - 1


@dataclass
class ExecutionPlan:
    """Rows to compute per layer for a batch of distinct targets (module docstring).

    Attributes:
        node_ids: int64 ``[n_0]`` global ids by local id (targets first, in the order given).
        sizes: ``(n_0, n_1, ..., n_L)``: :math:`|S_l|`, non-increasing, ``n_L = B``.
        indptr, cols: CSR of the kept edges of rows ``0 .. n_1 - 1`` (columns are local ids; with no
            layers, of no row).
        edge_weights: float32 graph weight per kept edge, or ``None`` for an unweighted graph.
        row_scale: float32 ``[n_1]`` ``d_i / k_i`` (1 where the row keeps every edge).
        width: sampling width the plan was built for (0 = exact).
    """

    node_ids: np.ndarray
    sizes: tuple[int, ...]
    indptr: np.ndarray
    cols: np.ndarray
    edge_weights: np.ndarray | None
    row_scale: np.ndarray
    width: int
    _graphs: dict = field(default_factory=dict, repr=False)

    @property
    def layers(self) -> int:
        return len(self.sizes) - 1

    @property
    def num_targets(self) -> int:
        return self.sizes[-1]

    def layer_graph(self, layer: int, rescaled: bool) -> CSRGraph:
        """The square graph over ``n_{layer-1}`` local nodes whose first ``n_layer`` rows are the
        kept edges of those rows (the rest are empty). ``rescaled``: weights times ``d_i / k_i``
        (for ``gcn`` / ``sum``); otherwise the graph's own weights (for ``mean``)."""
        if not 1 <= layer <= self.layers:
            raise ValueError(f"layer must be in [1, {self.layers}], got {layer}")
        key = (layer, bool(rescaled))
        g = self._graphs.get(key)
        if g is None:
            n_in, n_rows = self.sizes[layer - 1], self.sizes[layer]
            end = int(self.indptr[n_rows])
            indptr = np.empty(n_in + 1, dtype=np.int64)
            indptr[: n_rows + 1] = self.indptr[: n_rows + 1]
            indptr[n_rows + 1:] = end
            w = self.edge_weights
            if rescaled and self.width:
                scale = np.repeat(self.row_scale[:n_rows], np.diff(self.indptr[: n_rows + 1]))
                w = scale if w is None else w[:end] * scale
            g = CSRGraph(indptr, self.cols[:end], None if w is None else w[:end], n_in)
            self._graphs[key] = g
        return g

    def path_sums(self, values: np.ndarray, levels: int | None = None) -> np.ndarray:
        r"""float64 ``[B]``: per target, :math:`\sum_{r < levels} \sum_{u \in F_r(t)} values_u`.

        :math:`F_0(t) = \{t\}` and :math:`F_{r+1} = F_r \cup N_S(F_r)` (the plan's kept edges) are
        the target's own path: the rows layer ``L - r`` computes for it. ``values`` is indexed by
        local id (``[n_0]``). ``levels`` defaults to the number of layers, and may be one more
        (the last level then reaches the plan's outermost nodes).
        """
        levels = self.layers if levels is None else int(levels)
        if not 0 <= levels <= self.layers + 1:
            raise ValueError(f"levels must be in [0, {self.layers + 1}], got {levels}")
        b, n0 = self.num_targets, self.sizes[0]
        n1 = len(self.indptr) - 1
        v = np.asarray(values, dtype=np.float64)
        if v.shape != (n0,):
            raise ValueError(f"values must have shape [{n0}], got {v.shape}")
        total = np.zeros(b, dtype=np.float64)
        if b == 0 or levels == 0:
            return total
        _path_sums(self.indptr, self.cols, n1, v, levels, total)
        return total

    def kept_per_target(self) -> np.ndarray:
        """int64 ``[B]``: edges aggregated on each target's own path, summed over the layers."""
        if self.num_targets == 1:  # the whole plan is the target's path: layer l aggregates rows 0 .. n_l - 1
            return np.array([sum(int(self.indptr[n]) for n in self.sizes[1:])], dtype=np.int64)
        k = np.zeros(self.sizes[0], dtype=np.float64)
        k[: len(self.indptr) - 1] = np.diff(self.indptr)
        return np.rint(self.path_sums(k)).astype(np.int64)


@numba.njit(cache=True, nogil=True)
def _path_sums(indptr, cols, n1, v, levels, out):  # pragma: no cover - compiled
    """``out[t] = sum_{r < levels} sum_{u in F_r(t)} v[u]`` for every target ``t < len(out)``.

    A breadth-first walk per target over the plan's kept edges (rows ``< n1``), ``levels - 1``
    steps, expanding only the nodes new at each step (the others' neighbours are already in); a
    stamp per node marks the target that reached it.
    """
    n0 = v.shape[0]
    stamp = np.full(n0, -1, dtype=np.int64)
    cur = np.empty(n0, dtype=np.int64)
    nxt = np.empty(n0, dtype=np.int64)
    for t in range(out.shape[0]):
        stamp[t] = t
        cur[0] = t
        nc = 1
        level_sum = v[t]
        total = level_sum
        for _ in range(levels - 1):
            nn = 0
            for i in range(nc):
                u = cur[i]
                if u >= n1:
                    continue
                for e in range(indptr[u], indptr[u + 1]):
                    w = cols[e]
                    if stamp[w] != t:
                        stamp[w] = t
                        nxt[nn] = w
                        nn += 1
                        level_sum += v[w]
            total += level_sum
            cur, nxt = nxt, cur
            nc = nn
        out[t] = total


@numba.njit(cache=True, nogil=True)
def _discover(indices, edges, tag, ep, count, new):  # pragma: no cover - compiled
    """Give the next local ids (from ``count``), in order of first appearance along ``edges``, to
    the neighbours not yet tagged in epoch ``ep``; they go to ``new``, whose length is returned."""
    hi = ep << 32
    n = 0
    for i in range(edges.shape[0]):
        v = indices[edges[i]]
        if (tag[v] >> 32) != ep:
            tag[v] = hi | (count + n)
            new[n] = v
            n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _kept_edges(starts, deg, kept, width, fastrand, out):  # pragma: no cover - compiled
    """Edge ids kept by rows ``(starts, deg)`` at ``width``, row after row into ``out``.

    Row ``r`` keeps ``kept[r] = min(deg[r], width)`` edges: ``starts[r] + p_r(t)`` for ``t <
    kept[r]``, ``p_r`` the position formula of :func:`kernels.spmm.sample_positions` (its
    specification, compared in the tests); rows at or below the width, ``bucket``, and width 0
    keep their first edges in order. One pass, no temporaries: a plan's frontiers are small, and
    per-call overhead of tensor operations was most of their cost.
    """
    j = 0
    for r in range(starts.shape[0]):
        d = deg[r]
        k = kept[r]
        s0 = starts[r]
        if fastrand and width > 0 and d > width:
            w = walk_start(fastrand, width, d, k)
            for _ in range(k):
                p, w = walk_step(w)
                out[j] = s0 + p
                j += 1
        else:
            for t in range(k):
                out[j] = s0 + t
                j += 1
    return j


@numba.njit(cache=True, nogil=True)
def _build_plan(indptr, indices, targets, hops, width, fastrand, tag, ep):  # pragma: no cover - compiled
    """The whole expansion of :func:`execution_plan` in one compiled call (the per-hop array
    operations around :func:`_kept_edges` and :func:`_discover` cost more than they do on the
    small batches a server runs).

    Rows are expanded in local-id order (``S_L``, then each hop's new nodes), each keeping the edges
    :func:`_kept_edges` keeps, and every column seen for the first time in epoch ``ep`` gets the
    next local id (first appearance along the kept edges, :func:`_discover`).
    Returns ``(status, node_ids, counts, ptr, edges, cols, row_scale)``; ``status`` is 0, or -1
    for a target out of range, -2 for a repeated target.
    """
    n = indptr.shape[0] - 1
    b = targets.shape[0]
    hi = ep << 32
    node_ids = np.empty(max(b, 16), dtype=np.int64)
    counts = np.zeros(hops + 1, dtype=np.int64)
    for i in range(b):
        v = targets[i]
        if v < 0 or v >= n:
            return -1, node_ids[:0], counts, counts[:0], node_ids[:0], node_ids[:0], np.zeros(0, np.float32)
        if (tag[v] >> 32) == ep:
            return -2, node_ids[:0], counts, counts[:0], node_ids[:0], node_ids[:0], np.zeros(0, np.float32)
        tag[v] = hi | i
        node_ids[i] = v
    count = b
    counts[0] = b
    kept = np.empty(max(b, 16), dtype=np.int64)
    scale = np.empty(max(b, 16), dtype=np.float32)
    edges = np.empty(16, dtype=np.int64)
    ne = 0
    lo = 0
    for h in range(hops):
        stop = count  # this hop expands rows lo .. stop - 1; the nodes it finds get ids from stop on
        kept = _grow(kept, stop)
        scale = _grow(scale, stop)
        starts = np.empty(stop - lo, dtype=np.int64)
        deg = np.empty(stop - lo, dtype=np.int64)
        total = 0
        for r in range(lo, stop):
            v = node_ids[r]
            s0 = indptr[v]
            d = indptr[v + 1] - s0
            k = d if width <= 0 or d <= width else width
            starts[r - lo] = s0
            deg[r - lo] = d
            kept[r] = k
            scale[r] = d / max(k, 1)
            total += k
        edges = _grow(edges, ne + total)
        _kept_edges(starts, deg, kept[lo:stop], width, fastrand, edges[ne:ne + total])
        node_ids = _grow(node_ids, count + total)
        count += _discover(indices, edges[ne:ne + total], tag, ep, count, node_ids[count:count + total])
        ne += total
        counts[h + 1] = count
        lo = stop
    n1 = lo
    ptr = np.zeros(n1 + 1, dtype=np.int64)
    for r in range(n1):
        ptr[r + 1] = ptr[r] + kept[r]
    cols = np.empty(ne, dtype=np.int64)
    for i in range(ne):
        cols[i] = tag[indices[edges[i]]] & _LOW
    return 0, node_ids[:count], counts, ptr, edges[:ne], cols, scale[:n1]


def execution_plan(graph: CSRGraph, targets: np.ndarray, hops: int, width: int | None,
                   strategy: str = "fastrand") -> ExecutionPlan:
    """The :class:`ExecutionPlan` of a plain ``hops``-layer model for distinct ``targets`` at ``width``."""
    t = np.ascontiguousarray(np.asarray(targets, dtype=np.int64).reshape(-1))
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    width = int(width or 0)
    sc = _take_scratch(graph)
    try:
        ep = np.int64(sc.reserve(1))
        status, node_ids, counts, ptr, edges, cols, row_scale = _build_plan(
            graph.indptr, graph.indices, t, int(hops), width, strategy == "fastrand", sc.tag, ep)
    finally:
        _give_scratch(graph, sc)
    if status == -1:
        raise ValueError(f"targets must lie in [0, {graph.num_nodes})")
    if status == -2:
        raise ValueError("targets must be distinct")
    if len(node_ids) < 2**31:
        cols = cols.astype(np.int32)
    weights = graph.weights[edges] if graph.weights is not None else None
    # the rows expanded are S_L, then S_{L-1} \ S_L, ..., S_1 \ S_2: S_1 in local order
    return ExecutionPlan(node_ids, tuple(int(c) for c in counts[::-1]), ptr, cols, weights, row_scale, width)


def exact_path_edges(graph: CSRGraph, targets: np.ndarray, layers: int) -> np.ndarray:
    """int64 ``[B]``: edges an exact ``layers``-layer pass aggregates on each distinct target's own path.

    Only the targets' ``layers - 1``-hop balls are expanded (the rows an exact pass computes for
    them), not their scopes. It depends on the graph and the depth only, not on the width, which is
    what lets :class:`ExactPathEdges` keep it per node.
    """
    t = np.asarray(targets, dtype=np.int64).reshape(-1)
    if layers <= 0 or len(t) == 0:
        return np.zeros(len(t), dtype=np.int64)
    exact = execution_plan(graph, t, layers - 1, 0)
    return np.rint(exact.path_sums(graph.degrees_of(exact.node_ids), layers)).astype(np.int64)


@numba.njit(cache=True, nogil=True)
def _walk_sums(indptr, indices, out):  # pragma: no cover - compiled
    n = len(indptr) - 1
    for i in range(n):
        out[0, i] = indptr[i + 1] - indptr[i]
    for j in range(1, out.shape[0]):
        for i in range(n):
            acc = 0.0
            for e in range(indptr[i], indptr[i + 1]):
                acc += out[j - 1, indices[e]]
            out[j, i] = acc


def walk_sums(graph: CSRGraph, hops: int) -> np.ndarray:
    r"""float64 ``[hops + 1, N]``: :math:`c_j = A^j d` for ``j = 0 .. hops``, in ``O(hops * E)``.

    :math:`c_j[t]` sums the degree of the node each length-``j`` walk from ``t`` ends on. Every node
    within ``k`` hops of ``t`` ends some walk of length at most ``k``, so
    :math:`\sum_{j \le k} c_j[t]` bounds the edges of the rows within ``k`` hops (the edges of an
    induced ``k``-hop scope, the rows a plan expands): a price of a request before it runs, for
    every node at once, where the exact counts cost a ball expansion per node (a hub's exact pass
    can aggregate millions of edges). Equal when the ball has no cycles.
    """
    out = np.zeros((max(0, hops) + 1, graph.num_nodes), dtype=np.float64)
    if graph.num_nodes:
        _walk_sums(graph.indptr, graph.indices, out)
    return out


@numba.njit(cache=True, nogil=True)
def _walk_sums_rows(indptr, indices, out, level, rows):  # pragma: no cover - compiled
    for k in range(rows.shape[0]):
        i = rows[k]
        acc = 0.0
        for e in range(indptr[i], indptr[i + 1]):
            acc += out[level - 1, indices[e]]
        out[level, i] = acc


def update_walk_sums(graph: CSRGraph, sums: np.ndarray, changed_rows: np.ndarray, *,
                     with_columns: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """:func:`walk_sums` of ``graph`` from ``sums``, those of the graph before an edit that changed the
    rows ``changed_rows`` (and may have added nodes at the end, which ``changed_rows`` then holds): ``c_j``
    changes only within ``j`` hops of a changed row, so only those entries are computed again (a
    single-edge edit of a sparse graph touches a few hundred entries instead of ``hops * E`` edges).
    Returns a new array; with ``with_columns`` also the sorted nodes whose sums may differ from ``sums``
    (every other column is a copy), for what is derived from the sums column by column
    (:func:`walk_bounds`' ``columns``)."""
    levels, n_old = sums.shape
    n = graph.num_nodes
    out = np.empty((levels, n), dtype=np.float64)
    out[:, :n_old] = sums
    out[:, n_old:] = 0.0
    rows = np.unique(np.asarray(changed_rows, dtype=np.int64))
    if len(rows):
        out[0, rows] = graph.degrees_of(rows)
        for level in range(1, levels):
            rows = np.union1d(rows, graph.neighbors_of(rows))  # the rows whose level-`level` sum reads a changed entry
            _walk_sums_rows(graph.indptr, graph.indices, out, level, rows)
    return (out, rows) if with_columns else out


def walk_bounds(graph: CSRGraph, layers: int, sums: np.ndarray | None = None,
                columns: np.ndarray | None = None) -> np.ndarray:
    r"""float64 ``[N]``: an upper bound of :func:`exact_path_edges` for every node.

    An exact ``L``-layer pass aggregates, at layer ``l``, the rows within ``L - l`` hops of the
    target, so with :math:`c_j` of :func:`walk_sums`

    .. math:: \text{edges}(t) \le \sum_{j=0}^{L-1} (L - j)\, c_j[t]

    ``sums``: :func:`walk_sums` of the graph to at least ``L - 1`` hops, when the caller has them
    (the server derives other bounds from the same sums); computed here otherwise. ``columns``: only
    those nodes' bounds, in their order (a live graph's update patches the changed ones). The sums are
    whole numbers, so every order of adding gives the same bits.
    """
    if layers <= 0:
        return np.zeros(graph.num_nodes if columns is None else len(columns), dtype=np.float64)
    c = walk_sums(graph, layers - 1) if sums is None else sums[:layers]
    if columns is not None:
        c = c[:, columns]
    weights = np.arange(layers, 0, -1, dtype=np.float64)  # L - j for j = 0 .. L-1
    return weights @ c


class ExactPathEdges:
    """:func:`exact_path_edges` of every node of one graph at one depth, computed once per node.

    The serving path reports the exact count beside the kept one for every sampled request; a node's
    exact count never changes, so a server keeps it (int64 per node, filled on first use) instead of
    expanding every batch's balls a second time.
    """

    def __init__(self, graph: CSRGraph, layers: int) -> None:
        self.graph = graph
        self.layers = int(layers)
        self._memo = np.full(graph.num_nodes, -1, dtype=np.int64)

    def rebase(self, graph: CSRGraph, stale: np.ndarray) -> int:
        """Count on the updated ``graph`` (a live graph's next version, same nodes plus new ones) from now
        on, forgetting ``stale`` (every node whose ``layers - 1``-hop ball holds a changed row); returns
        how many known counts were dropped."""
        if graph.num_nodes > len(self._memo):
            grown = np.full(graph.num_nodes, -1, dtype=np.int64)
            grown[: len(self._memo)] = self._memo
            self._memo = grown
        stale = np.asarray(stale, dtype=np.int64)
        dropped = int(np.count_nonzero(self._memo[stale] >= 0)) if len(stale) else 0
        self._memo[stale] = -1
        self.graph = graph
        return dropped

    def fill(self, chunk: int = 4096) -> None:
        """Compute every node not yet known, ``chunk`` targets at a time (a server's warm-up)."""
        todo = np.flatnonzero(self._memo < 0)
        for lo in range(0, len(todo), chunk):
            part = todo[lo : lo + chunk]
            self._memo[part] = exact_path_edges(self.graph, part, self.layers)

    def __call__(self, targets: np.ndarray) -> np.ndarray:
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        out = self._memo[t]
        missing = out < 0
        if missing.any():
            todo = np.unique(t[missing])
            self._memo[todo] = exact_path_edges(self.graph, todo, self.layers)
            out = self._memo[t]
        return out


def edges_on_paths(
    plan: ExecutionPlan, graph: CSRGraph, width: int | None, exact: ExactPathEdges | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``([B], [B])``: edges aggregated on each target's own path over all layers, kept at the
    plan's width and exact. ``graph`` is the graph the plan was built on; ``exact``, when given, is
    its :class:`ExactPathEdges` at the plan's depth (the exact counts then come from its memo)."""
    return _with_exact(plan.kept_per_target(), plan, graph, width, exact, plan.layers)


def edges_on_two_layer_paths(
    plan: ExecutionPlan, graph: CSRGraph, width: int | None, exact: ExactPathEdges | None = None
) -> tuple[np.ndarray, np.ndarray]:
    r""":func:`edges_on_paths` of a 2-layer model's plan, from the one-layer ``plan`` of its last layer
    alone (the plan a server runs when it keeps the first layer's rows per node,
    ``serve.projection.ActivationCache``): target ``t`` keeps :math:`k_t + \sum_{u \in F_1(t)} k_u`
    edges, :math:`F_1(t) = \{t\} \cup N_S(t)` the rows layer 1 computes for it and
    :math:`k_u = \min(d_u, S)` (``d_u`` exact)."""
    return _with_exact(two_layer_kept(plan, graph.degrees_of(plan.node_ids), width), plan, graph, width, exact, 2)


def two_layer_kept(plan: ExecutionPlan, degrees: np.ndarray, width: int | None) -> np.ndarray:
    """int64 ``[B]``: the kept counts of :func:`edges_on_two_layer_paths`, from the row lengths of
    ``plan.node_ids`` (``degrees``, by local id) wherever they come from."""
    if plan.layers != 1:
        raise ValueError(f"expected the one-layer plan of the last layer, got {plan.layers} layers")
    deg = np.asarray(degrees, dtype=np.int64)
    k = np.minimum(deg, width) if width else deg
    if plan.num_targets == 1:  # F_1 of the one target is the whole plan
        return np.array([int(k[0]) + int(k.sum())], dtype=np.int64)
    return np.rint(plan.path_sums(k, 2)).astype(np.int64)


def local_plan(plan: ExecutionPlan) -> ExecutionPlan:
    """``plan`` with its node ids replaced by ``0 .. n_0 - 1``: the compiled forward then reads row ``j``
    of its tables for the plan's node ``j``, so a caller passes tables gathered at ``plan.node_ids``
    (a stateless replica's plans index a local graph, not the global ids its tables are keyed by)."""
    return replace(plan, node_ids=np.arange(len(plan.node_ids), dtype=np.int64), _graphs={})


def _with_exact(kept: np.ndarray, plan: ExecutionPlan, graph: CSRGraph, width: int | None,
                exact: ExactPathEdges | None, layers: int) -> tuple[np.ndarray, np.ndarray]:
    if not width:
        return kept, kept
    targets = plan.node_ids[: plan.num_targets]
    if exact is not None:
        if exact.graph is not graph or exact.layers != layers:
            raise ValueError("exact was made for another graph or depth than this plan")
        return kept, exact(targets)
    return kept, exact_path_edges(graph, targets, layers)
