"""Batched induced subgraphs and L-hop scope, checked against SciPy slicing and a plain BFS."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import pytest
import scipy.sparse as sp

import kernels.subgraph as subgraph_mod
from kernels.datasets import load_npz, synthetic_sbm
from kernels.graph import CSRGraph
from kernels.subgraph import (
    _EPOCH_LIMIT,
    ExtraEdges,
    SubgraphBatch,
    _take_scratch,
    in_global_order,
    induced_batch,
    lhop_nodes,
    local_csr,
    new_node_scopes,
)

from .conftest import dataset_path


# ----------------------------------------------------------------------------- helpers
def random_lists(n: int, sizes, rng, targets=None):
    """CSR-shaped lists of distinct ids, target first."""
    lists = []
    for b, m in enumerate(sizes):
        t = int(targets[b]) if targets is not None else int(rng.integers(n))
        others = rng.choice(np.setdiff1d(np.arange(n), [t]), size=m - 1, replace=False)
        lists.append(np.concatenate([[t], others]))
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    return ptr, np.concatenate(lists).astype(np.int64)


def check_batch_against_scipy(mat: sp.csr_matrix, batch: SubgraphBatch, ptr, nodes, weighted: bool):
    """Every block equals mat[V_b][:, V_b]; no edge leaves its block; dedupe maps are consistent."""
    batch.graph.validate()  # sorted rows, ids in range
    np.testing.assert_array_equal(batch.ptr, ptr)
    np.testing.assert_array_equal(batch.node_ids, nodes)
    np.testing.assert_array_equal(batch.target_rows, ptr[:-1])
    assert batch.graph.num_nodes == len(nodes)
    assert batch.graph.is_weighted == weighted
    dense_batch = batch.graph.to_scipy().toarray()
    for b in range(len(ptr) - 1):
        lo, hi = ptr[b], ptr[b + 1]
        v = nodes[lo:hi]
        want = mat[v][:, v].toarray()
        if not weighted:
            want = (want != 0).astype(np.float32)
        np.testing.assert_allclose(dense_batch[lo:hi, lo:hi], want, rtol=0, atol=0)
        np.testing.assert_allclose(batch.subgraph(b).to_scipy().toarray(), want)
        # nothing outside the diagonal block
        assert not dense_batch[lo:hi, :lo].any() and not dense_batch[lo:hi, hi:].any()
    np.testing.assert_array_equal(batch.unique_ids, np.unique(nodes))
    np.testing.assert_array_equal(batch.unique_ids[batch.row_to_unique], nodes)
    assert batch.unique_ids.dtype == np.int64 and batch.row_to_unique.dtype == np.int64


def bfs_sets(mat: sp.csr_matrix, target: int, hops: int) -> dict[int, int]:
    """Hop distance of every node within ``hops`` of ``target`` (reference BFS)."""
    dist = {target: 0}
    q = deque([target])
    while q:
        u = q.popleft()
        if dist[u] == hops:
            continue
        for v in mat.indices[mat.indptr[u] : mat.indptr[u + 1]]:
            if int(v) not in dist:
                dist[int(v)] = dist[u] + 1
                q.append(int(v))
    return dist


@pytest.fixture(scope="module")
def sbm_graph():
    return synthetic_sbm(800, num_classes=4, avg_degree=12, num_features=4, seed=3).graph


@pytest.fixture(params=["tagged", "hashed"])
def lookup(request, monkeypatch):
    """Both ways ``induced_batch`` looks a list's members up: the tagged ``[N]`` scratch (small graphs) and the
    per-list map and filter (graphs from ``_HASHED_MIN_NODES`` nodes), chosen here whatever the graph's size."""
    monkeypatch.setattr(subgraph_mod, "_HASHED_MIN_NODES", 1 << 62 if request.param == "tagged" else 0)
    return request.param


# ----------------------------------------------------------------------------- induced_batch
@pytest.mark.parametrize("sizes", [[1], [5, 1, 17], [64] * 8, [200, 3, 120, 1, 77]])
def test_induced_matches_scipy_unweighted(sbm_graph, sizes, lookup):
    rng = np.random.default_rng(len(sizes))
    ptr, nodes = random_lists(sbm_graph.num_nodes, sizes, rng)
    batch = induced_batch(sbm_graph, ptr, nodes)
    check_batch_against_scipy(sbm_graph.to_scipy(), batch, ptr, nodes, weighted=False)


@pytest.mark.parametrize("width", [None, 0, 1, 3, 10_000])
def test_edge_counts_per_subgraph(sbm_graph, width):
    rng = np.random.default_rng(5)
    for sizes in ([1], [40], [5, 1, 17, 64]):
        ptr, nodes = random_lists(sbm_graph.num_nodes, sizes, rng)
        batch = induced_batch(sbm_graph, ptr, nodes)
        kept, total = batch.edge_counts(width)
        assert kept.dtype == total.dtype == np.int64
        for b in range(len(sizes)):
            deg = batch.subgraph(b).degrees
            assert total[b] == deg.sum()
            assert kept[b] == (np.minimum(deg, width).sum() if width else deg.sum())


def test_induced_uses_neighbourhood_lists_with_many_edges(sbm_graph, lookup):
    # L-hop lists are dense in edges (unlike random lists): a stronger check of the row scan
    targets = np.arange(0, 800, 37)
    ptr, nodes = lhop_nodes(sbm_graph, targets, 2)
    batch = induced_batch(sbm_graph, ptr, nodes)
    assert batch.graph.num_edges > 10 * len(targets)
    check_batch_against_scipy(sbm_graph.to_scipy(), batch, ptr, nodes, weighted=False)


def test_induced_weighted_directed_graph(lookup):
    rng = np.random.default_rng(11)
    n, e = 300, 4000
    ei = rng.integers(0, n, size=(2, e))
    w = rng.uniform(0.1, 3.0, size=e)
    g = CSRGraph.from_edge_index(ei, num_nodes=n, weights=w)  # directed, duplicates summed
    ptr, nodes = random_lists(n, [40, 2, 90, 300], rng)
    batch = induced_batch(g, ptr, nodes)
    check_batch_against_scipy(g.to_scipy(), batch, ptr, nodes, weighted=True)


def test_induced_hub_rows_use_binary_search_path(lookup):
    # node 0 is linked to every other node: its degree (n - 1) exceeds 32 * n_b for small lists
    rng = np.random.default_rng(5)
    n = 3000
    star = np.stack([np.zeros(n - 1, dtype=np.int64), np.arange(1, n)])
    extra = rng.integers(1, n, size=(2, 6000))
    g = CSRGraph.from_edge_index(np.concatenate([star, extra], axis=1), num_nodes=n, symmetrize=True)
    sizes = [3, 10, 25, 60]
    targets = [0, 0, 5, 0]
    ptr, nodes = random_lists(n, sizes, rng, targets=targets)
    nodes[ptr[2] + 1] = 0  # hub inside a list whose target is another node
    assert g.degrees[0] > 32 * max(sizes)
    batch = induced_batch(g, ptr, nodes)
    check_batch_against_scipy(g.to_scipy(), batch, ptr, nodes, weighted=False)


def test_repeated_nodes_across_subgraphs_are_deduplicated(sbm_graph, lookup):
    nodes = np.array([4, 9, 11, 9, 4, 2, 11, 4], dtype=np.int64)
    ptr = np.array([0, 3, 6, 8], dtype=np.int64)
    batch = induced_batch(sbm_graph, ptr, nodes)
    np.testing.assert_array_equal(batch.unique_ids, [2, 4, 9, 11])
    np.testing.assert_array_equal(batch.unique_ids[batch.row_to_unique], nodes)
    check_batch_against_scipy(sbm_graph.to_scipy(), batch, ptr, nodes, weighted=False)


def test_scratch_epochs_wrap_around(sbm_graph):
    rng = np.random.default_rng(2)
    ptr, nodes = random_lists(sbm_graph.num_nodes, [30, 40, 50], rng)
    ref = induced_batch(sbm_graph, ptr, nodes)
    # push every pooled scratch to the end of its epoch range: the next call must clear and restart
    pool = sbm_graph.cache()["_subgraph_scratch_pool"]
    for sc in pool:
        sc.epoch = _EPOCH_LIMIT - 2
    again = induced_batch(sbm_graph, ptr, nodes)
    np.testing.assert_array_equal(again.graph.indptr, ref.graph.indptr)
    np.testing.assert_array_equal(again.graph.indices, ref.graph.indices)
    assert all(sc.epoch < 10 for sc in pool)


def test_concurrent_calls_agree(sbm_graph):
    rng = np.random.default_rng(9)
    jobs = [random_lists(sbm_graph.num_nodes, [50] * 20, rng) for _ in range(6)]
    want = [induced_batch(sbm_graph, p, n) for p, n in jobs]
    got: list = [None] * len(jobs)

    def work(i):
        for _ in range(20):
            got[i] = induced_batch(sbm_graph, *jobs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w.graph.indptr, g.graph.indptr)
        np.testing.assert_array_equal(w.graph.indices, g.graph.indices)


def test_induced_rejects_bad_lists(sbm_graph):
    with pytest.raises(ValueError, match="ptr must run"):
        induced_batch(sbm_graph, np.array([0, 5]), np.arange(4))
    with pytest.raises(ValueError, match="at least its target"):
        induced_batch(sbm_graph, np.array([0, 2, 2]), np.arange(2))
    with pytest.raises(ValueError, match="must lie in"):
        induced_batch(sbm_graph, np.array([0, 2]), np.array([1, sbm_graph.num_nodes]))


def test_both_lookups_give_the_same_batches_and_a_repeated_id_its_last_position(monkeypatch):
    """Random weighted graphs with hubs, lists with repeated ids (inside a list too), new nodes' extra edges and
    ``inner``: the tagged scratch and the per-list map give the same arrays, bit for bit; a repeated id gets edges
    only at its last position in its list, in hub rows (searched member by member) as in the others."""
    rng = np.random.default_rng(21)
    n = 2500
    ei = rng.integers(0, n, size=(2, 20_000))
    hubs = np.stack([np.repeat([0, 1], n - 2), np.concatenate([np.arange(2, n)] * 2)])
    g = CSRGraph.from_edge_index(np.concatenate([ei, hubs], axis=1), num_nodes=n, symmetrize=True,
                                 weights=rng.uniform(0.5, 2.0, size=ei.shape[1] + hubs.shape[1]))
    assert g.degrees[0] > 32 * 60
    extra = ExtraEdges.from_edges(n, [n, n, 0, 7, n + 1, n + 1], [0, 7, n, n, 3, n], [1.5, 2.0, 1.5, 2.0, 0.5, 3.0])
    for trial in range(20):
        sizes = rng.integers(1, 60, size=6)
        ptr, nodes = random_lists(n, sizes, rng)
        nodes = nodes.copy()
        for b in range(len(sizes)):  # a hub or a new node in each list, ids repeated inside lists
            if sizes[b] > 3:
                nodes[ptr[b] + 1] = rng.choice([0, 1, n, n + 1])
                i, j = rng.choice(np.arange(ptr[b], ptr[b + 1]), size=2, replace=False)
                nodes[max(i, j)] = nodes[min(i, j)]
        inner = np.array([int(rng.integers(1, m + 1)) for m in sizes]) if trial % 2 else None
        out = {}
        for mode, limit in (("tagged", 1 << 62), ("hashed", 0)):
            monkeypatch.setattr(subgraph_mod, "_HASHED_MIN_NODES", limit)
            out[mode] = induced_batch(g, ptr, nodes, extra=extra, inner=inner)
        a, h = out["tagged"], out["hashed"]
        for x, y in ((a.graph.indptr, h.graph.indptr), (a.graph.indices, h.graph.indices),
                     (a.graph.weights, h.graph.weights), (a.unique_ids, h.unique_ids),
                     (a.row_to_unique, h.row_to_unique)):
            np.testing.assert_array_equal(x, y)
        for b in range(len(sizes)):  # no column points at an earlier copy of an id in its list
            lst = nodes[ptr[b]:ptr[b + 1]]
            cols = h.graph.indices[h.graph.indptr[ptr[b]]:h.graph.indptr[ptr[b + 1]]] - ptr[b]
            last = {int(v): k for k, v in enumerate(lst)}
            assert all(last[int(lst[c])] == c for c in cols), (trial, b)


@pytest.mark.parametrize("weighted", [False, True])
def test_new_nodes_sharing_neighbours_match_the_graph_with_them_added(sbm_graph, lookup, weighted):
    """Many new nodes linked to the same few stored nodes (each shared row holds an extra edge per new node: the
    rows the kernel now looks the list's own new nodes up in rather than scanning), lists holding several new
    nodes, some listed twice (edges at an id's last position only, as for stored ids): the batch is the graph
    with the new nodes added."""
    rng = np.random.default_rng(5 + weighted)
    n = sbm_graph.num_nodes
    shared = np.array([3, 17, 250, 799])
    m = 300
    src = np.repeat(n + np.arange(m), len(shared))
    dst = np.tile(shared, m)
    w = rng.uniform(0.5, 2.0, size=len(src)) if weighted else None
    extra = ExtraEdges.from_edges(n, np.concatenate([src, dst]), np.concatenate([dst, src]),
                                  None if w is None else np.concatenate([w, w]), num_virtual=m)
    added = sp.lil_matrix((n + m, n + m))
    base = sbm_graph.to_scipy().tocoo()
    added[base.row, base.col] = 1.0
    for s_, d_, x in zip(src, dst, w if weighted else np.ones(len(src)), strict=True):
        added[s_, d_] = x
        added[d_, s_] = x
    added = added.tocsr()
    lists = [np.concatenate([[n + j], shared, rng.choice(n, 8, replace=False)]) for j in range(0, m, 7)]
    lists.append(np.concatenate([[n + 1, n + 2, n + 250], shared, [n + 2]]))  # several new nodes, one twice
    lists = [np.array(list(dict.fromkeys(x.tolist()))) if i % 2 else x for i, x in enumerate(lists)]
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    nodes = np.concatenate(lists)
    batch = induced_batch(sbm_graph, ptr, nodes, extra=extra)
    dense = batch.graph.to_scipy().toarray()
    for b, lst in enumerate(lists):
        lo = ptr[b]
        last = {int(v): k for k, v in enumerate(lst)}
        keep = [k for k, v in enumerate(lst) if last[int(v)] == k]  # a repeated id: its last copy
        want = added[lst[keep]][:, lst[keep]].toarray()
        if not weighted:
            want = (want != 0).astype(np.float32)
        got = dense[lo:lo + len(lst), lo:lo + len(lst)][np.ix_(keep, keep)]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 if weighted else 0)


# ----------------------------------------------------------------------------- virtual nodes
def test_extra_edges_for_new_node_match_graph_with_node_added(sbm_graph, lookup):
    n = sbm_graph.num_nodes
    nbrs = np.array([3, 17, 17, 250, 799])  # a repeated neighbour merges
    extra = ExtraEdges.for_new_node(n, nbrs)
    assert extra.num_virtual == 1 and len(extra.src) == 8  # 4 distinct neighbours, both directions
    added = sp.bmat(
        [[sbm_graph.to_scipy(), None], [sp.csr_matrix((1, n)), sp.csr_matrix((1, 1))]], format="lil"
    )
    for v in np.unique(nbrs):
        added[n, v] = 1.0
        added[v, n] = 1.0
    added = added.tocsr()
    rng = np.random.default_rng(4)
    _, others = random_lists(n, [30], rng)
    lists = [np.concatenate([[n], [3, 17, 250], others[1:10]]), others, np.array([17, n, 3])]
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    nodes = np.concatenate(lists)
    batch = induced_batch(sbm_graph, ptr, nodes, extra=extra)
    check_batch_against_scipy(added, batch, ptr, nodes, weighted=False)
    assert batch.unique_ids[-1] == n  # the virtual id is fetched like any other (features from the request)
    # the stored graph is untouched
    assert sbm_graph.num_nodes == n and not (sbm_graph.indices >= n).any()


@pytest.mark.parametrize("hub", [False, True])
def test_rows_past_inner_get_no_edges_and_the_rest_theirs(sbm_graph, hub, lookup):
    """``induced_batch(..., inner=)``: a list's rows from ``inner[b]`` on have no edges; every other row has the
    edges it has without ``inner`` (extra edges of new nodes included; hub rows take the binary-search path)."""
    rng = np.random.default_rng(8)
    n = sbm_graph.num_nodes
    graph = sbm_graph
    if hub:  # node 0 linked to every other: its row is searched member by member
        mat = sbm_graph.to_scipy().tolil()
        mat[0, 1:] = 1.0
        mat[1:, 0] = 1.0
        graph = CSRGraph.from_scipy(mat.tocsr())
    ptr, nodes = random_lists(n, [40, 1, 5, 60], rng, targets=[0, 5, 0, 9])  # 0 in a list of 5: a hub
    extra = ExtraEdges.for_new_node(n, np.array([0, 3, 17]))
    ptr = np.concatenate([ptr, [ptr[-1] + 4]])
    nodes = np.concatenate([nodes, [n, 0, 3, 17]])
    inner = np.array([7, 1, 3, 1, 2])
    full = induced_batch(graph, ptr, nodes, extra=extra)
    part = induced_batch(graph, ptr, nodes, extra=extra, inner=inner)
    assert np.array_equal(part.node_ids, full.node_ids) and np.array_equal(part.unique_ids, full.unique_ids)
    for b in range(len(inner)):
        for k in range(ptr[b + 1] - ptr[b]):
            r = ptr[b] + k
            got = part.graph.indices[part.graph.indptr[r]:part.graph.indptr[r + 1]]
            want = full.graph.indices[full.graph.indptr[r]:full.graph.indptr[r + 1]]
            assert np.array_equal(got, want if k < inner[b] else want[:0]), (b, k)
    assert part.graph.num_edges < full.graph.num_edges
    for bad in ([7, 1, 3, 1], [0, 1, 3, 1, 2], [7, 2, 3, 1, 2]):
        with pytest.raises(ValueError, match="inner"):
            induced_batch(graph, ptr, nodes, extra=extra, inner=np.array(bad))


def test_new_node_scopes_put_the_inner_scope_first():
    """new_node_scopes against sets: new node ``j`` first, then its inner scope's distinct ids ascending, then the
    rest of its scope; an id in both counts as inner; a new node without neighbours has its list of one."""
    rng = np.random.default_rng(2)
    n = 50
    per = [3, 0, 1, 4]  # neighbours per new node
    lists, inner_lists = [], []
    for _ in range(sum(per)):
        inner_lists.append(rng.choice(n, rng.integers(0, 4), replace=False))
        lists.append(np.concatenate([inner_lists[-1], rng.choice(n, rng.integers(0, 9))]))

    def csr(ls):
        return np.concatenate([[0], np.cumsum([len(x) for x in ls])]).astype(np.int64), \
            np.concatenate(ls).astype(np.int64)

    ptr, scope = csr(lists)
    iptr, iscope = csr(inner_lists)
    optr, nodes, inner = new_node_scopes(n, np.cumsum(per), ptr, scope, iptr, iscope)
    first = 0
    for j, k in enumerate(per):
        ins = set(np.concatenate([*inner_lists[first:first + k], np.zeros(0, np.int64)]).tolist())
        alls = set(np.concatenate([*lists[first:first + k], np.zeros(0, np.int64)]).tolist()) | ins
        want = [n + j, *sorted(ins), *sorted(alls - ins)]
        assert nodes[optr[j]:optr[j + 1]].tolist() == want, j
        assert inner[j] == 1 + len(ins)
        first += k
    with pytest.raises(ValueError, match="new_node_scopes"):
        new_node_scopes(n, np.array([3, 2]), ptr, scope, iptr, iscope)


def _global_order_spec(batch: SubgraphBatch) -> tuple[np.ndarray, np.ndarray | None]:
    """What in_global_order computes, as one lexsort over (row, global id of the column)."""
    g = batch.graph
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    order = np.lexsort((batch.node_ids[g.indices], rows))
    return g.indices[order], None if g.weights is None else g.weights[order]


@pytest.mark.parametrize("weighted", [False, True])
def test_in_global_order_equals_a_lexsort(weighted):
    """Rows in global-id order on random graphs: L-hop lists (nearly sorted rows), random lists, a hub's binary
    search rows, virtual nodes' extra edges (ids N.. last), weights carried with their columns; nothing else
    of the batch changes."""
    rng = np.random.default_rng(7 + weighted)
    n = 1500
    star = np.stack([np.zeros(n - 1, dtype=np.int64), np.arange(1, n)])  # node 0 a hub of degree n - 1
    ei = np.concatenate([star, rng.integers(0, n, size=(2, 12_000))], axis=1)
    w = rng.uniform(0.1, 3.0, size=ei.shape[1]) if weighted else None
    g = CSRGraph.from_edge_index(ei, num_nodes=n, weights=w, symmetrize=True)
    specs = [rng.choice(n, size=k, replace=False) for k in (1, 5, 40)]
    extra = ExtraEdges.from_edges(
        n, np.concatenate([np.full(len(s), n + j) for j, s in enumerate(specs)] + list(specs)),
        np.concatenate(list(specs) + [np.full(len(s), n + j) for j, s in enumerate(specs)]),
        None if not weighted else rng.uniform(0.1, 2.0, size=2 * sum(len(s) for s in specs)).astype(np.float32),
        num_virtual=len(specs))
    lp, ln = lhop_nodes(g, np.array([0, 3, 700, 1499]), 2)
    rp, rn = random_lists(n, [1, 90, 300, 7], rng, targets=[0, 9, 0, 11])
    lists = [ln[lp[b]:lp[b + 1]] for b in range(4)] + [rn[rp[b]:rp[b + 1]] for b in range(4)]
    lists += [np.concatenate([[n + j], rng.permutation(np.concatenate([s, rng.choice(n, 30)]))]) for j, s in
              enumerate(specs)]
    lists = [np.asarray(list(dict.fromkeys(x.tolist())), dtype=np.int64) for x in lists]  # distinct per list
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    batch = induced_batch(g, ptr, np.concatenate(lists), extra=extra)
    got = in_global_order(batch)
    cols, ws = _global_order_spec(batch)
    assert batch.graph.num_edges > 10_000
    assert not np.array_equal(cols, batch.graph.indices)  # the order did change
    np.testing.assert_array_equal(got.graph.indices, cols)
    np.testing.assert_array_equal(got.graph.indptr, batch.graph.indptr)
    if weighted:
        np.testing.assert_array_equal(got.graph.weights, ws)
    else:
        assert got.graph.weights is None
    for name in ("node_ids", "ptr", "target_rows", "unique_ids", "row_to_unique"):
        np.testing.assert_array_equal(getattr(got, name), getattr(batch, name))


def _local_reference(uniq, lens, cols, weights):
    """What a replica's local graph was before kernels.subgraph.local_csr: a binary search per column."""
    u = len(uniq)
    pos = np.searchsorted(uniq, cols)
    np.minimum(pos, max(u - 1, 0), out=pos)
    keep = uniq[pos] == cols if u else np.zeros(0, bool)
    row = np.repeat(np.arange(u, dtype=np.int64), lens)
    indptr = np.zeros(u + 1, dtype=np.int64)
    np.cumsum(np.bincount(row[keep], minlength=u), out=indptr[1:])
    ends = np.cumsum(lens)
    sums = (np.array([np.cumsum(weights[e - n:e], dtype=np.float64)[-1] if n else 0.0 for e, n in zip(ends, lens, strict=True)])
            if weights is not None else lens.astype(np.float64))
    return indptr, pos[keep].astype(np.int32), (weights[keep] if weights is not None else None), sums


@pytest.mark.parametrize("spread", [1, 5, 10_000])  # ids far beyond U: the hash table instead of the dense one
@pytest.mark.parametrize("weighted", [False, True])
def test_local_csr_equals_a_binary_search(spread, weighted):
    """kernels.subgraph.local_csr (a replica's local graph) against the searchsorted reference: the kept columns
    by rank, their weights, each row's weight sum over all of its columns in the row's order (bits equal),
    rows of length 0, columns outside uniq on both sides of it, and an empty uniq."""
    rng = np.random.default_rng(spread)
    for u in (0, 1, 7, 300, 5_000):
        n = max(u, 1) * spread + 50
        uniq = np.sort(rng.choice(n, u, replace=False)).astype(np.int64)
        lens = rng.integers(0, 40, u) * (rng.random(u) > 0.1)
        cols = rng.integers(0, n + 100, int(lens.sum())).astype(np.int64)
        if u:
            half = rng.random(len(cols)) < 0.5
            cols[half] = uniq[rng.integers(0, u, int(half.sum()))]
        w = (rng.random(len(cols)) * 3).astype(np.float32) if weighted else None
        got = local_csr(uniq, lens, cols, w)
        want = _local_reference(uniq, lens, cols, w)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[1].dtype == np.int32
        if weighted:
            np.testing.assert_array_equal(got[2], want[2])
        else:
            assert got[2] is None
        np.testing.assert_array_equal(got[3], want[3])  # bits: the same order of additions
    with pytest.raises(ValueError, match="lengths adding up"):
        local_csr(np.array([1, 2]), np.array([1, 1]), np.array([1]))
    with pytest.raises(ValueError, match="weights for"):
        local_csr(np.array([1]), np.array([1]), np.array([1]), np.ones(2, np.float32))


def test_extra_edges_weighted_one_directional(lookup):
    rng = np.random.default_rng(8)
    n = 100
    g = CSRGraph.from_edge_index(rng.integers(0, n, size=(2, 600)), num_nodes=n, symmetrize=True)
    extra = ExtraEdges.for_new_node(n, [1, 2, 3], [0.5, 2.0, 4.0], virtual_id=n + 1, bidirectional=False)
    assert extra.num_virtual == 2
    nodes = np.array([n + 1, 1, 2, 3, 9, n], dtype=np.int64)
    batch = induced_batch(g, np.array([0, 6]), nodes, extra=extra)
    dense = batch.graph.to_scipy().toarray()
    np.testing.assert_allclose(dense[0, 1:4], [0.5, 2.0, 4.0])
    assert not dense[1:, 0].any()  # no reverse edges
    assert not dense[5].any() and not dense[:, 5].any()  # virtual id n has no edges
    a = g.to_scipy()[[1, 2, 3, 9]][:, [1, 2, 3, 9]].toarray()
    np.testing.assert_allclose(dense[1:5, 1:5], a)  # stored edges weigh 1 in a weighted batch


def test_extra_edges_validation():
    with pytest.raises(ValueError, match="touch a virtual node"):
        ExtraEdges.from_edges(10, [1], [2])
    with pytest.raises(ValueError, match="existing ids"):
        ExtraEdges.for_new_node(10, [3, 10])
    g = CSRGraph.from_edge_index(np.array([[0, 1], [1, 0]]), num_nodes=4)
    with pytest.raises(ValueError, match="built for a graph of"):
        induced_batch(g, np.array([0, 1]), np.array([0]), extra=ExtraEdges.for_new_node(5, [1]))
    with pytest.raises(ValueError, match="must lie in"):
        induced_batch(g, np.array([0, 1]), np.array([4]))  # virtual id without extra edges


# ----------------------------------------------------------------------------- lhop_nodes
@pytest.mark.parametrize("hops", [0, 1, 2, 3])
def test_lhop_matches_bfs(sbm_graph, hops):
    mat = sbm_graph.to_scipy()
    targets = np.array([0, 5, 5, 123, 799, 400])
    ptr, nodes = lhop_nodes(sbm_graph, targets, hops)
    assert ptr.dtype == np.int64 and nodes.dtype == np.int64
    for b, t in enumerate(targets):
        lst = nodes[ptr[b] : ptr[b + 1]]
        dist = bfs_sets(mat, int(t), hops)
        assert lst[0] == t
        assert len(set(lst.tolist())) == len(lst)
        assert set(lst.tolist()) == set(dist)
        d = np.array([dist[int(v)] for v in lst])
        assert np.all(np.diff(d) >= 0)  # breadth-first order


def test_lhop_directed_follows_out_edges():
    ei = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])  # a directed 4-cycle
    g = CSRGraph.from_edge_index(ei, num_nodes=5)
    ptr, nodes = lhop_nodes(g, [0, 4], 2)
    np.testing.assert_array_equal(nodes[ptr[0] : ptr[1]], [0, 1, 2])
    np.testing.assert_array_equal(nodes[ptr[1] : ptr[2]], [4])  # isolated node: itself only


def test_lhop_fanout_caps_and_is_deterministic(sbm_graph):
    mat = sbm_graph.to_scipy()
    targets = np.array([10, 20, 30, 40])
    fan = [3, 2]
    ptr, nodes = lhop_nodes(sbm_graph, targets, 2, fan, seed=5)
    _, nodes2 = lhop_nodes(sbm_graph, targets, 2, fan, seed=5)
    np.testing.assert_array_equal(nodes, nodes2)
    # a target's list does not depend on the rest of the batch
    _, n1 = lhop_nodes(sbm_graph, targets[2:3], 2, fan, seed=5)
    np.testing.assert_array_equal(n1, nodes[ptr[2] : ptr[3]])
    # another seed draws other neighbours (somewhere in the batch)
    _, n3 = lhop_nodes(sbm_graph, targets, 2, fan, seed=6)
    assert not np.array_equal(n3, nodes)
    for b, t in enumerate(targets):
        lst = nodes[ptr[b] : ptr[b + 1]].tolist()
        full = bfs_sets(mat, int(t), 2)
        assert set(lst) <= set(full)
        assert len(lst) <= 1 + 3 + 3 * 2
        hop1 = [v for v in lst if full[v] == 1]
        assert 1 <= len(hop1) <= 3
    # a cap at least the maximum degree is no cap
    big = int(sbm_graph.degrees.max())
    _, na = lhop_nodes(sbm_graph, targets, 2, big)
    _, nb = lhop_nodes(sbm_graph, targets, 2)
    np.testing.assert_array_equal(na, nb)


def test_lhop_fanout_samples_distinct_neighbours():
    n = 50
    star = np.stack([np.zeros(n - 1, dtype=np.int64), np.arange(1, n)])
    g = CSRGraph.from_edge_index(star, num_nodes=n, symmetrize=True)
    for seed in range(20):
        _, nodes = lhop_nodes(g, [0], 1, 10, seed=seed)
        assert len(nodes) == 11 and len(np.unique(nodes)) == 11 and nodes[0] == 0


def test_lhop_validation(sbm_graph):
    with pytest.raises(ValueError, match="targets"):
        lhop_nodes(sbm_graph, [sbm_graph.num_nodes], 1)
    with pytest.raises(ValueError, match="hops"):
        lhop_nodes(sbm_graph, [0], -1)
    with pytest.raises(ValueError, match="one entry per hop"):
        lhop_nodes(sbm_graph, [0], 2, [3])
    ptr, nodes = lhop_nodes(sbm_graph, [], 2)
    assert ptr.tolist() == [0] and len(nodes) == 0


def test_lhop_then_induced_gives_receptive_field(sbm_graph):
    # one GCN-style propagation step on the batch reproduces the full-graph step at the targets
    rng = np.random.default_rng(0)
    x = rng.standard_normal((sbm_graph.num_nodes, 3))
    a = sbm_graph.to_scipy()
    full = a @ (a @ x)
    targets = np.array([1, 77, 500])
    ptr, nodes = lhop_nodes(sbm_graph, targets, 2)
    batch = induced_batch(sbm_graph, ptr, nodes)
    ab = batch.graph.to_scipy()
    xb = x[batch.unique_ids][batch.row_to_unique]
    out = ab @ (ab @ xb)
    np.testing.assert_allclose(out[batch.target_rows], full[targets], rtol=1e-10, atol=1e-10)


@pytest.mark.data
def test_real_graph_induced_and_lhop():
    ds = load_npz(dataset_path("cora"))
    g = ds.graph
    mat = g.to_scipy()
    targets = np.arange(0, g.num_nodes, 97)
    ptr, nodes = lhop_nodes(g, targets, 2)
    for b, t in enumerate(targets):
        assert set(nodes[ptr[b] : ptr[b + 1]].tolist()) == set(bfs_sets(mat, int(t), 2))
    batch = induced_batch(g, ptr, nodes)
    check_batch_against_scipy(mat, batch, ptr, nodes, weighted=False)
    sc = _take_scratch(g)  # the pool hands out a scratch sized for this graph (room for new nodes: carry_scratch)
    assert g.num_nodes <= sc.tag.shape[0] <= g.num_nodes + g.num_nodes // 64 + 1024
