"""PPR push, top-K index and online push, checked against exact PPR (SciPy power iteration).

The reference is always the exact PPR vector: two correct push implementations do not return the
same top-K sets, so no test compares with another approximation (except the index against the
very push it stores, and the online push against the same push on the graph with the node added).
"""

from __future__ import annotations

import json
import mmap
import os
import time

import numpy as np
import pytest

from kernels.datasets import load_npz, synthetic_sbm
from kernels.graph import CSRGraph
from kernels.ppr import (
    PPRConfig,
    PPRIndex,
    PPRIndexError,
    _weighted_degree,
    ppr_exact,
    ppr_new_node,
    ppr_topk,
)
from kernels.ppr_push import _DenseScratch, _push_dense
from kernels.subgraph import ExtraEdges, induced_batch

from .conftest import dataset_path

F32_SLACK = 1e-6  # scores are stored as float32; exact values are float64


@pytest.fixture(scope="module")
def sbm():
    return synthetic_sbm(600, num_classes=4, avg_degree=10, num_features=4, seed=7).graph


@pytest.fixture(scope="module")
def weighted_sym():
    rng = np.random.default_rng(3)
    n = 400
    ei = rng.integers(0, n, size=(2, 2500))
    w = rng.uniform(0.2, 3.0, size=2500)
    return CSRGraph.from_edge_index(ei, num_nodes=n, weights=w, symmetrize=True, remove_self_loops=True)


def dense_estimate(ptr, nodes, scores, b, n):
    est = np.zeros(n)
    est[nodes[ptr[b] : ptr[b + 1]]] = scores[ptr[b] : ptr[b + 1]]
    return est


def check_bound(graph, cfg, targets, exact=None):
    """Every node: 0 <= exact - estimate <= eps * w(v) (full lists: k = N, threshold 0)."""
    n = graph.num_nodes
    ptr, nodes, scores = ppr_topk(graph, targets, cfg, k=n)
    exact = ppr_exact(graph, targets, cfg) if exact is None else exact
    wd = _weighted_degree(graph)
    bound = cfg.eps * np.where(wd > 0, wd, 1.0)
    worst = 0.0
    for b in range(len(targets)):
        est = dense_estimate(ptr, nodes, scores, b, n)
        gap = exact[b] - est
        assert np.all(gap >= -F32_SLACK * np.maximum(exact[b], 1e-3)), "estimate above the exact score"
        assert np.all(gap <= bound + F32_SLACK * exact[b] + 1e-9), "estimate below exact - eps * w(v)"
        worst = max(worst, float((gap / bound).max()))
    return worst


# ----------------------------------------------------------------------------- config
def test_config_validation_and_key():
    cfg = PPRConfig()
    assert (cfg.alpha, cfg.eps, cfg.topk, cfg.threshold, cfg.lazy) == (0.15, 1e-5, 200, 0.0, False)
    assert cfg.teleport == 0.15
    assert PPRConfig(lazy=True).teleport == pytest.approx(0.3 / 1.15)
    assert cfg.key() == PPRConfig().key() and cfg.key() != PPRConfig(topk=100).key()
    assert PPRConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ({"alpha": 0.0}, {"alpha": 1.0}, {"eps": 0}, {"topk": 0}, {"topk": 2.5}, {"threshold": 1.5}):
        with pytest.raises(ValueError):
            PPRConfig(**bad)


# ----------------------------------------------------------------------------- push vs exact
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("eps", [1e-3, 1e-4, 1e-5])
def test_push_within_eps_degree_of_exact(sbm, eps, lazy):
    cfg = PPRConfig(alpha=0.15, eps=eps, lazy=lazy)
    targets = np.array([0, 1, 42, 311, 599])
    worst = check_bound(sbm, cfg, targets)
    assert worst > 0.05  # the bound is not vacuous: the error reaches a fair part of it


def test_push_weighted_graph_uses_weighted_degree(weighted_sym):
    cfg = PPRConfig(alpha=0.2, eps=2e-4)
    check_bound(weighted_sym, cfg, np.array([0, 7, 99, 250]))


def test_push_isolated_and_dangling_nodes():
    # node 3 isolated; in the directed part, node 5 has no out-edges (the walk stays there)
    ei = np.array([[0, 1, 1, 2, 4], [1, 0, 2, 1, 5]])
    g = CSRGraph.from_edge_index(ei, num_nodes=6)
    cfg = PPRConfig(eps=1e-6)
    ptr, nodes, scores = ppr_topk(g, [3, 5, 4], cfg)
    assert nodes[ptr[0] : ptr[1]].tolist() == [3] and scores[0] == pytest.approx(1.0)
    assert nodes[ptr[1] : ptr[2]].tolist() == [5] and scores[ptr[1]] == pytest.approx(1.0)
    # from 4 every walk ends in 5: exact = (0.15, 0.85)
    np.testing.assert_allclose(scores[ptr[2] : ptr[3]], [0.15, 0.85], rtol=1e-6)
    ex = ppr_exact(g, [4], cfg)[0]
    np.testing.assert_allclose(ex[[4, 5]], [0.15, 0.85], rtol=1e-9)


@pytest.mark.parametrize("lazy", [False, True])
def test_edges_of_weight_zero(lazy):
    """An edge of weight 0 is an edge no walk takes (a QA report: a node whose edges were re-weighted to 0
    made every push that reached it list it again at each reach, past the end of the touched list, and the
    process aborted on a corrupted heap). A path 0 - 1 - 2 - 3 - 4 - 5 whose edges at 2 weigh 0, and a hub
    with one edge of weight 0: every list holds each node once, only nodes a walk can reach, within the
    push's bound of exact PPR."""
    src = np.array([0, 1, 2, 3, 4, 6, 6, 6, 6])
    dst = np.array([1, 2, 3, 4, 5, 0, 4, 5, 7])
    w = np.array([1, 0, 0, 1, 1, 2, 1, 1, 0], dtype=np.float32)
    s, d, w = np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([w, w])
    order = np.lexsort((d, s))  # the CSR by hand: from_edge_index drops the edges of weight 0
    g = CSRGraph(indptr=np.searchsorted(s[order], np.arange(9)).astype(np.int64), indices=d[order].astype(np.int32),
                 weights=w[order], num_nodes=8)
    assert np.count_nonzero(g.weights == 0) == 6
    cfg = PPRConfig(eps=1e-7, lazy=lazy)
    targets = np.arange(8)
    ptr, nodes, _ = ppr_topk(g, targets, cfg, k=8)
    exact = ppr_exact(g, targets, cfg)
    for b in targets:
        row = nodes[ptr[b] : ptr[b + 1]]
        assert len(np.unique(row)) == len(row), f"node {b}: {row}"
        assert set(row.tolist()) == set(np.flatnonzero(exact[b] > 0).tolist()), f"node {b}: {row}"
    assert nodes[ptr[2] : ptr[3]].tolist() == [2] and nodes[ptr[7] : ptr[8]].tolist() == [7]
    check_bound(g, cfg, targets, exact)
    # the push itself, on a scratch with room to spare (an overrun stays inside it): it counts each node once
    wd = _weighted_degree(g)
    sc = _DenseScratch(wd, 1, cfg.eps, capacity=10_000)
    for src in (1, 6):
        nt, _ = _push_dense(g.indptr, g.indices, g.weights, wd, src, cfg.alpha, lazy, 0, sc.rw[0], sc.p[0],
                            sc.queue[0], sc.touched[0], np.zeros(0, np.int64), np.zeros(0), 0.0)
        reached = np.flatnonzero((sc.rw[0, :, 0] > 0) | (sc.p[0] > 0))
        assert nt == len(reached) and sorted(sc.touched[0, :nt].tolist()) == reached.tolist()
        sc.rw[0, :, 0] = 0.0
        sc.p[0] = 0.0


def test_every_node_touched_and_scratch_reused_across_eps():
    # a complete graph: every push touches every node, so the touched list fills up to N (the
    # dense push writes one slot past its count) in every worker row; the per-graph scratch pool
    # then serves calls with another eps, which must not reuse thresholds built for the first
    n = 9
    ii, jj = np.nonzero(~np.eye(n, dtype=bool))
    g = CSRGraph.from_edge_index(np.stack([ii, jj]), num_nodes=n)
    targets = np.arange(n)
    first = None
    for eps in (1e-7, 1e-2, 1e-7, 1e-2):
        cfg = PPRConfig(eps=eps)
        batch = ppr_topk(g, targets, cfg, k=n)
        one = [ppr_topk(g, [t], cfg, k=n) for t in targets]
        for b, (_ptr, nodes, scores) in enumerate(one):
            assert batch[1][batch[0][b] : batch[0][b + 1]].tolist() == nodes.tolist()
            np.testing.assert_array_equal(batch[2][batch[0][b] : batch[0][b + 1]], scores)
        if eps == 1e-7:
            assert np.all(np.diff(batch[0]) == n), "every node reaches every list"
            check_bound(g, cfg, targets)
            if first is not None:
                np.testing.assert_array_equal(batch[2], first)
            first = batch[2]
        else:  # coarse eps: far fewer pushes, lower estimates
            assert batch[2][1] < first[1]


def test_push_is_a_lower_bound_on_a_directed_graph():
    rng = np.random.default_rng(1)
    n = 300
    g = CSRGraph.from_edge_index(rng.integers(0, n, size=(2, 1500)), num_nodes=n, remove_self_loops=True)
    cfg = PPRConfig(eps=1e-4)
    targets = np.array([0, 10, 20])
    ptr, nodes, scores = ppr_topk(g, targets, cfg, k=n)
    ex = ppr_exact(g, targets, cfg)
    for b in range(3):
        est = dense_estimate(ptr, nodes, scores, b, n)
        assert np.all(est <= ex[b] + 1e-6)
        assert (ex[b] - est).sum() < 0.2  # the missing mass is the leftover residue


@pytest.mark.parametrize("k", [5, 20, 60])
def test_topk_contains_every_node_clearing_the_kth_score(sbm, k):
    cfg = PPRConfig(eps=1e-4, topk=k)
    targets = np.arange(0, 600, 29)
    ptr, nodes, scores = ppr_topk(sbm, targets, cfg)
    ex = ppr_exact(sbm, targets, cfg)
    bound = cfg.eps * _weighted_degree(sbm)
    for b, t in enumerate(targets):
        lst = nodes[ptr[b] : ptr[b + 1]]
        sc = scores[ptr[b] : ptr[b + 1]]
        assert lst[0] == t and len(lst) <= k and len(np.unique(lst)) == len(lst)
        assert np.all(np.diff(sc[1:]) <= 0)  # decreasing after the target
        others = np.delete(np.arange(sbm.num_nodes), t)
        ranked = np.sort(ex[b, others])[::-1]
        kth = ranked[k - 2] if k >= 2 else np.inf  # (K-1)-th best non-target exact score
        must = others[ex[b, others] - bound[others] > kth]
        assert set(must.tolist()) <= set(lst.tolist())
        # and the list is good: what it holds is close to the exact top
        if k > 1:
            assert (ex[b, lst[1:]] + bound[lst[1:]]).min() >= ranked[min(len(ranked) - 1, 3 * k)]


def test_relative_threshold(sbm):
    base = PPRConfig(eps=1e-4, topk=100)
    cut = PPRConfig(eps=1e-4, topk=100, threshold=0.05)
    targets = np.array([3, 30, 300])
    p0, n0, s0 = ppr_topk(sbm, targets, base)
    p1, n1, _ = ppr_topk(sbm, targets, cut)
    for b in range(3):
        full_n, full_s = n0[p0[b] : p0[b + 1]], s0[p0[b] : p0[b + 1]]
        keep = full_s >= 0.05 * full_s[0]
        np.testing.assert_array_equal(n1[p1[b] : p1[b + 1]], full_n[keep])
        assert keep.sum() < len(full_n)  # the threshold dropped something


# ----------------------------------------------------------------------------- index
def test_index_equals_per_target_push_and_slices(sbm):
    cfg = PPRConfig(eps=1e-4, topk=40)
    idx = PPRIndex.build(sbm, cfg, progress=False, chunk_size=128)  # several chunks
    ptr, nodes, scores = ppr_topk(sbm, np.arange(sbm.num_nodes), cfg)
    np.testing.assert_array_equal(idx.ptr, ptr)
    np.testing.assert_array_equal(idx.nodes, nodes)
    np.testing.assert_array_equal(idx.scores, scores)
    assert idx.k_max == 40 and idx.config == cfg and idx.fingerprint == sbm.fingerprint()
    targets = np.array([5, 0, 5, 599, 123])
    for k in (1, 7, 40):
        lp, ln, ls = idx.lookup(targets, k, return_scores=True)
        rp, rn, rs = ppr_topk(sbm, targets, cfg, k=k)  # a fresh push at the smaller k
        np.testing.assert_array_equal(lp, rp)
        np.testing.assert_array_equal(ln, rn)
        np.testing.assert_array_equal(ls, rs)
        assert ln.dtype == np.int64 and lp.dtype == np.int64
        np.testing.assert_array_equal(ln[lp[:-1]], targets)
        for i, t in enumerate(targets):  # one target at a time: the single-slice path
            one_p, one_n = idx.lookup([t], k)
            assert one_p.tolist() == [0, lp[i + 1] - lp[i]] and one_n.dtype == np.int64
            np.testing.assert_array_equal(one_n, ln[lp[i] : lp[i + 1]])
    with pytest.raises(ValueError, match="k must lie"):
        idx.lookup([0], 41)
    with pytest.raises(ValueError, match="ppr_new_node"):
        idx.lookup([sbm.num_nodes], 3)


def _mapped(a) -> bool:
    """Whether ``a`` views a memory map (plain ndarray views of np.memmap objects included)."""
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


def test_index_file_round_trip_mmap_and_fingerprint(sbm, tmp_path, monkeypatch):
    cfg = PPRConfig(eps=1e-4, topk=25)
    idx = PPRIndex.open_or_build(tmp_path, sbm, cfg, progress=False)
    d = PPRIndex.path_for(tmp_path, sbm, cfg)
    assert idx.path == d and (d / "meta.json").exists()
    assert sbm.fingerprint() in d.name and cfg.key() in d.name
    assert all(_mapped(a) for a in (idx.ptr, idx.nodes, idx.scores))  # read from the files' pages, not copied
    assert not list(tmp_path.glob("*.tmp-*"))  # the build directory was renamed into place
    mem = PPRIndex.build(sbm, cfg, progress=False)
    np.testing.assert_array_equal(np.asarray(idx.nodes), mem.nodes)
    np.testing.assert_array_equal(np.asarray(idx.scores), mem.scores)
    np.testing.assert_array_equal(np.asarray(idx.ptr), mem.ptr)

    # a second open_or_build opens the file and does not rebuild
    def no_build(*a, **k):
        raise AssertionError("rebuilt an index that exists")

    monkeypatch.setattr(PPRIndex, "build", classmethod(no_build))
    again = PPRIndex.open_or_build(tmp_path, sbm, cfg, progress=False)
    np.testing.assert_array_equal(again.lookup([1, 2], 10)[1], mem.lookup([1, 2], 10)[1])
    monkeypatch.undo()

    # a different graph is refused with a clear error
    other = synthetic_sbm(600, num_classes=4, avg_degree=10, num_features=4, seed=8).graph
    with pytest.raises(PPRIndexError, match="built for graph"):
        PPRIndex.open(d, other)
    with pytest.raises(PPRIndexError, match="built for graph"):
        idx.check_graph(other)
    PPRIndex.open(d, sbm.fingerprint())  # a fingerprint string works too

    # save/open of an in-memory index, without mmap
    saved = mem.save(tmp_path / "copy")
    loaded = PPRIndex.open(saved, sbm, mmap=False)
    np.testing.assert_array_equal(loaded.nodes, mem.nodes)
    assert loaded.config == cfg

    # damaged files are refused
    (d / "nodes.bin").write_bytes((d / "nodes.bin").read_bytes()[:-4])
    with pytest.raises(PPRIndexError, match="bytes, expected"):
        PPRIndex.open(d)
    meta = json.loads((saved / "meta.json").read_text())
    meta["algorithm_version"] = 0
    (saved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PPRIndexError, match="algorithm version"):
        PPRIndex.open(saved)
    with pytest.raises(PPRIndexError, match="not a PPR index"):
        PPRIndex.open(tmp_path / "nowhere")


# ----------------------------------------------------------------------------- new nodes
def graph_with_node(graph: CSRGraph, nbrs, w=None, bidirectional=True) -> CSRGraph:
    n = graph.num_nodes
    src, dst = graph.edge_index()
    gw = graph.edge_weights().astype(np.float64)
    nbrs = np.asarray(nbrs, dtype=np.int64)
    w = np.ones(len(nbrs)) if w is None else np.asarray(w, dtype=np.float64)
    es, ed, ew = [src, np.full(len(nbrs), n)], [dst, nbrs], [gw, w]
    if bidirectional:
        es.append(nbrs)
        ed.append(np.full(len(nbrs), n))
        ew.append(w)
    weighted = graph.is_weighted or not np.all(w == 1)
    return CSRGraph.from_edge_index(
        np.stack([np.concatenate(es), np.concatenate(ed)]),
        num_nodes=n + 1,
        weights=np.concatenate(ew) if weighted else None,
    )


@pytest.mark.parametrize("lazy", [False, True])
def test_new_node_matches_push_on_graph_with_node_added(sbm, lazy):
    cfg = PPRConfig(eps=1e-5, topk=80, lazy=lazy)
    n = sbm.num_nodes
    nbrs = np.array([4, 77, 250, 251, 598])
    nodes, scores = ppr_new_node(sbm, nbrs, None, cfg, k=n + 1)
    assert nodes[0] == n and nodes.dtype == np.int64 and scores.dtype == np.float32
    g2 = graph_with_node(sbm, nbrs)
    ex = ppr_exact(g2, [n], cfg)[0]
    bound = cfg.eps * _weighted_degree(g2)
    est = np.zeros(n + 1)
    est[nodes] = scores
    gap = ex - est
    assert gap.min() >= -F32_SLACK and np.all(gap <= bound + F32_SLACK * ex + 1e-9)
    # the same push on the materialised graph gives the same estimates (within the bound, and in
    # fact up to float32 rounding, since both follow one FIFO order)
    _, n2, s2 = ppr_topk(g2, [n], cfg, k=n + 1)
    est2 = np.zeros(n + 1)
    est2[n2] = s2
    assert np.all(np.abs(est - est2) <= bound)
    np.testing.assert_allclose(est, est2, rtol=1e-5, atol=1e-9)
    # top-K with the default k: every node clearing the (K-1)-th exact score by the bound is in
    top, _ = ppr_new_node(sbm, nbrs, None, cfg)
    ranked = np.sort(ex[:n])[::-1]
    must = np.flatnonzero(ex[:n] - bound[:n] > ranked[cfg.topk - 2])
    assert set(must.tolist()) <= set(top.tolist()) and len(top) == cfg.topk


def test_new_node_weighted_one_directional_and_capped(weighted_sym):
    cfg = PPRConfig(alpha=0.2, eps=1e-5, topk=50)
    n = weighted_sym.num_nodes
    nbrs, w = np.array([1, 2, 2, 300]), np.array([0.5, 1.0, 2.0, 4.0])  # 2 appears twice: weights add
    nodes, scores = ppr_new_node(weighted_sym, nbrs, w, cfg, k=n + 1, bidirectional=False)
    g2 = graph_with_node(weighted_sym, nbrs, w, bidirectional=False)
    ex = ppr_exact(g2, [n], cfg)[0]
    est = np.zeros(n + 1)
    est[nodes] = scores
    assert np.all(est <= ex + 1e-6)
    assert est[n] == pytest.approx(cfg.alpha, rel=1e-6)  # nothing walks back to a one-way node
    # the edge weights steer the walk: neighbour 300 (weight 4) beats neighbour 1 (weight 0.5)
    assert est[300] > est[1]
    # a push cap bounds the work: fewer nodes reached, still lower bounds
    few, few_s = ppr_new_node(weighted_sym, nbrs, w, cfg, k=n + 1, bidirectional=False, max_pushes=3)
    assert len(few) < len(nodes)
    est3 = np.zeros(n + 1)
    est3[few] = few_s
    assert np.all(est3 <= ex + 1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_new_node_dense_push_equals_the_sparse_one_to_the_bit(weighted):
    """ppr_new_node pushes on the graph's dense scratch (kernels.ppr_push._ppr_virtual_dense, 3.5x-4x faster); the
    sparse push (_ppr_virtual) is its specification: the same list and scores to the bit on random graphs, weighted
    (edges of weight 0 too) and not, lazy walks, a relative threshold, repeated and high-degree neighbours, a
    neighbour without edges, the push cap; and the pooled scratch is left clean for ppr_topk."""
    from kernels.graph import CSRGraph
    from kernels.ppr_push import _NO_F32, _ppr_virtual, new_node_edges

    rng = np.random.default_rng(7 + weighted)
    for trial in range(12):
        n = int(rng.integers(50, 400))
        m = int(rng.integers(n, 6 * n))
        src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
        keep = src != dst
        w = rng.choice([0.0, 0.5, 1.0, 2.5], size=int(keep.sum())).astype(np.float32) if weighted else None
        g = CSRGraph.from_edge_index(np.stack([src[keep], dst[keep]]), n, w, symmetrize=True)
        cfg = PPRConfig(alpha=float(rng.choice([0.1, 0.15, 0.25])), eps=float(rng.choice([1e-3, 1e-4, 1e-5])),
                        topk=int(rng.choice([8, 32, n + 1])), lazy=bool(trial % 3 == 1),
                        threshold=0.01 if trial % 4 == 2 else 0.0)
        deg = np.diff(g.indptr)
        nb = rng.choice(n, int(rng.integers(0, 7)), replace=True)
        if trial % 2:
            nb = np.r_[nb, np.argmax(deg)]  # a hub
        if (deg == 0).any() and trial % 3 == 0:
            nb = np.r_[nb, np.flatnonzero(deg == 0)[0]]  # a neighbour without edges
        nw = rng.uniform(0.0, 3.0, len(nb)) if weighted and trial % 2 else None
        cap = 5 if trial == 11 else 200_000
        got_nodes, got_scores = ppr_new_node(g, nb, nw, cfg, max_pushes=cap)
        uniq, wsum = new_node_edges(n, nb, nw)
        wdeg = _weighted_degree(g) if g.is_weighted else np.zeros(0)
        want_nodes, want_scores, _, _ = _ppr_virtual(g.indptr, g.indices, g.weights if weighted else _NO_F32, wdeg,
                                                     uniq, wsum, True, cfg.alpha, cfg.eps, cfg.lazy, cfg.topk,
                                                     cfg.threshold, cap)
        np.testing.assert_array_equal(got_nodes, want_nodes, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(got_scores, want_scores.astype(np.float32), err_msg=f"trial {trial}")
        # the scratch went back clean: a batch of existing targets on it equals one on fresh state
        t = rng.choice(n, 5, replace=False)
        a = ppr_topk(g, t, cfg)
        g.cache().clear()
        b = ppr_topk(g, t, cfg)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("weighted", [False, True])
def test_new_nodes_on_parallel_threads_equal_one_call_each(weighted):
    """ppr_new_nodes deals a batch of new nodes over worker threads, each on a one-worker dense scratch of the
    graph's pool: every list and score equals ppr_new_node's for that node alone, in the order given, on 1 to 5
    workers (more workers than nodes too), with nodes without edges, repeated neighbours, hubs, weights and the
    push cap; several callers at once agree; the pool keeps a scratch per worker, and they come back clean."""
    import threading

    from kernels.ppr import ppr_new_nodes
    from kernels.ppr_push import _SCRATCH_KEY, _DenseScratch, _give_dense, new_node_workers

    rng = np.random.default_rng(11 + weighted)
    n = 500
    src, dst = rng.integers(0, n, 4000), rng.integers(0, n, 4000)
    keep = src != dst
    w = rng.choice([0.0, 0.5, 1.0, 2.5], size=int(keep.sum())).astype(np.float32) if weighted else None
    g = CSRGraph.from_edge_index(np.stack([src[keep], dst[keep]]), n, w, symmetrize=True)
    hub = int(np.argmax(np.diff(g.indptr)))
    nbs = [np.r_[rng.choice(n, int(rng.integers(0, 6))), [hub] * (i % 3 == 0)].astype(np.int64) for i in range(13)]
    nbs[4] = np.array([3, 9, 3, hub], dtype=np.int64)  # a repeated neighbour (its weights add up)
    nodes = [(nb, rng.uniform(0.0, 3.0, len(nb)) if weighted else None) for nb in nbs]
    assert any(len(nb) == 0 for nb in nbs) and any(len(np.unique(nb)) < len(nb) for nb in nbs if len(nb))
    cfg = PPRConfig(eps=1e-4, topk=32, lazy=weighted)
    for cap in (200_000, 7):
        want = [ppr_new_node(g, nb, nw, cfg, max_pushes=cap) for nb, nw in nodes]
        for threads in (1, 2, 3, 5, 40):
            got = ppr_new_nodes(g, nodes, cfg, max_pushes=cap, threads=threads)
            assert len(got) == len(want)
            for i, ((a, sa), (b, sb)) in enumerate(zip(got, want, strict=True)):
                np.testing.assert_array_equal(a, b, err_msg=f"node {i}, {threads} threads, cap {cap}")
                np.testing.assert_array_equal(sa, sb, err_msg=f"node {i}, {threads} threads, cap {cap}")
            assert len(g.cache()[_SCRATCH_KEY]) <= new_node_workers(n, len(nodes), threads) + 1
    assert new_node_workers(n, len(nodes), 40) == len(nodes)  # one node per worker at most
    assert new_node_workers(n, 1, 8) == 1 and new_node_workers(n, 5, 1) == 1
    # callers at once (model workers of one server): each gets its own scratches
    results: list = [None] * 4

    def call(i: int) -> None:
        results[i] = ppr_new_nodes(g, nodes[i:] + nodes[:i], cfg, threads=3)

    threads_ = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads_:
        t.start()
    for t in threads_:
        t.join()
    for i, res in enumerate(results):
        ref = [ppr_new_node(g, nb, nw, cfg) for nb, nw in nodes[i:] + nodes[:i]]
        for (a, sa), (b, sb) in zip(res, ref, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(sa, sb)
    # the pooled scratches came back clean: a batch of existing targets on them equals one on fresh state
    t = rng.choice(n, 7, replace=False)
    a = ppr_topk(g, t, cfg)
    g.cache().clear()
    for x, y in zip(a, ppr_topk(g, t, cfg), strict=True):
        np.testing.assert_array_equal(x, y)
    # a bad node is refused before any push
    with pytest.raises(ValueError, match="existing ids"):
        ppr_new_nodes(g, [*nodes[:3], ([n], None)], cfg, threads=2)
    # the new nodes' one-worker scratches do not crowd a batch push's (several workers) out of the pool: it stays
    g.cache().clear()
    for _ in range(4):  # what 4 workers of ppr_new_nodes leave in the pool
        _give_dense(g, _DenseScratch(_weighted_degree(g), 1, cfg.eps, capacity=n + 1), keep=5)
    batch = _DenseScratch(_weighted_degree(g), 4, cfg.eps)
    _give_dense(g, batch)
    assert any(sc is batch for sc in g.cache()[_SCRATCH_KEY])
    assert sum(sc.threads == 1 for sc in g.cache()[_SCRATCH_KEY]) == 4
    ppr_new_nodes(g, nodes, cfg, threads=5)
    assert any(sc is batch for sc in g.cache()[_SCRATCH_KEY])
    assert sum(sc.threads == 1 for sc in g.cache()[_SCRATCH_KEY]) <= new_node_workers(n, len(nodes), 5) + 1


def test_new_node_without_edges_and_validation(sbm):
    nodes, scores = ppr_new_node(sbm, [], None, PPRConfig())
    assert nodes.tolist() == [sbm.num_nodes] and scores[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="existing ids"):
        ppr_new_node(sbm, [sbm.num_nodes])
    with pytest.raises(ValueError, match="match neighbors"):
        ppr_new_node(sbm, [1, 2], [1.0])
    with pytest.raises(ValueError, match=">= 0"):
        ppr_new_node(sbm, [1, 2], [1.0, -1.0])


def test_new_node_subgraph_with_virtual_node(sbm):
    cfg = PPRConfig(eps=1e-4, topk=30)
    n = sbm.num_nodes
    nbrs = np.array([10, 11, 12])
    nodes, _ = ppr_new_node(sbm, nbrs, None, cfg)
    batch = induced_batch(sbm, np.array([0, len(nodes)]), nodes, extra=ExtraEdges.for_new_node(n, nbrs))
    g2 = graph_with_node(sbm, nbrs)
    want = g2.to_scipy()[nodes][:, nodes].toarray()
    np.testing.assert_array_equal(batch.graph.to_scipy().toarray(), want)
    assert batch.node_ids[0] == n


# ----------------------------------------------------------------------------- real data
@pytest.mark.data
def test_real_graph_bound_topk_and_index():
    g = load_npz(dataset_path("cora")).graph
    cfg = PPRConfig(eps=1e-5, topk=50)
    rng = np.random.default_rng(0)
    targets = rng.choice(g.num_nodes, 12, replace=False)
    ex = ppr_exact(g, targets, cfg)
    check_bound(g, cfg, targets, exact=ex)
    idx = PPRIndex.build(g, cfg, progress=False)
    ptr, nodes = idx.lookup(targets, 50)
    bound = cfg.eps * _weighted_degree(g)
    overlap = []
    for b, t in enumerate(targets):
        lst = nodes[ptr[b] : ptr[b + 1]]
        others = np.delete(np.arange(g.num_nodes), t)
        ranked = np.sort(ex[b, others])[::-1]
        must = others[ex[b, others] - bound[others] > ranked[48]]
        assert set(must.tolist()) <= set(lst.tolist())
        best = others[np.argsort(-ex[b, others], kind="stable")[:49]]
        top = set(best[ex[b, best] > 0].tolist()) | {int(t)}  # small components: fewer than K reachable
        overlap.append(len(top & set(lst.tolist())) / len(top))
    assert np.mean(overlap) > 0.9


# ----------------------------------------------------------------------------- induced table
def assert_same_batch(a, b):
    """Two SubgraphBatch objects are identical (structure, weights, dedupe maps)."""
    np.testing.assert_array_equal(a.graph.indptr, b.graph.indptr)
    np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
    assert (a.graph.weights is None) == (b.graph.weights is None)
    if a.graph.weights is not None:
        np.testing.assert_array_equal(a.graph.weights, b.graph.weights)
    for name in ("node_ids", "ptr", "target_rows", "unique_ids", "row_to_unique"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("graph_name", ["sbm", "weighted_sym"])
def test_induced_table_equals_induced_batch_at_every_prefix(graph_name, request):
    g = request.getfixturevalue(graph_name)
    idx = PPRIndex.build(g, PPRConfig(eps=1e-4, topk=40), progress=False)
    assert idx.induced is None
    assert idx.ensure_induced(g)
    table = idx.induced
    assert table.k == 40 and (table.weights is not None) == g.is_weighted
    rng = np.random.default_rng(0)
    for k in (1, 2, 7, 39, 40):
        for b in (1, 5, 64):
            targets = rng.choice(g.num_nodes, size=b, replace=b > g.num_nodes)
            targets[0] = targets[-1]  # a repeated target in the batch
            ptr, nodes = idx.lookup(targets, k)
            want = induced_batch(g, ptr, nodes)
            got = idx.induced_batch(g, targets, k)
            assert_same_batch(got, want)
            assert got.graph.num_edges == want.graph.num_edges
    # the per-node runs are the nodes' own subgraphs: edges of node 3's list, local ids
    ptr, nodes = idx.lookup([3])
    sub = induced_batch(g, ptr, nodes).graph
    lo, hi = int(table.eptr[3]), int(table.eptr[4])
    np.testing.assert_array_equal(table.dst[lo:hi], sub.indices)
    np.testing.assert_array_equal(np.bincount(table.src[lo:hi], minlength=len(nodes)), np.diff(sub.indptr))


@pytest.mark.parametrize("graph_name", ["sbm", "weighted_sym"])
def test_induced_table_is_the_same_on_any_number_of_threads(graph_name, request):
    """Chunks built on several threads (small chunks, so the threads interleave) concatenate in node
    order: the same table, array for array, as on one thread."""
    from kernels.subgraph import InducedTable

    g = request.getfixturevalue(graph_name)
    idx = PPRIndex.build(g, PPRConfig(eps=1e-4, topk=24), progress=False)
    one = InducedTable.build(g, idx.lookup, 24, chunk=37, workers=1)
    many = InducedTable.build(g, idx.lookup, 24, chunk=37, workers=4)
    assert len(one.src) > 0
    for name in ("eptr", "src", "dst"):
        np.testing.assert_array_equal(getattr(many, name), getattr(one, name))
    if g.is_weighted:
        np.testing.assert_array_equal(many.weights, one.weights)
    else:
        assert many.weights is None and one.weights is None


def test_prefetch_advises_the_mapped_files(sbm, tmp_path):
    """prefetch() reads every memory-mapped file of an opened index (lists, scores,
    induced table) and of nothing for an index in memory; answers are unchanged."""
    from kernels.ppr_live import LivePPRIndex

    cfg = PPRConfig(eps=1e-4, topk=16)
    built = PPRIndex.build(sbm, cfg, progress=False)
    assert built.prefetch() == 0  # in memory: nothing mapped
    PPRIndex.open_or_build(tmp_path, sbm, cfg, progress=False)
    idx = PPRIndex.open(next(p for p in tmp_path.iterdir() if p.is_dir()), sbm)
    assert idx.ensure_induced(sbm)
    idx = PPRIndex.open(idx.path, sbm)
    assert idx.ensure_induced(sbm)  # reopened from its files, mapped
    files = sum(f.stat().st_size for f in idx.path.iterdir() if f.suffix in (".bin",))
    got = idx.prefetch()
    assert got >= files > 0, (got, files)
    np.testing.assert_array_equal(idx.lookup([0, 5], 16)[1], built.lookup([0, 5], 16)[1])
    assert LivePPRIndex(idx).prefetch() == got


def test_induced_table_is_saved_reopened_and_refused_when_too_big(sbm, tmp_path, monkeypatch, caplog):
    from kernels.subgraph import InducedTable

    cfg = PPRConfig(eps=1e-4, topk=30)
    idx = PPRIndex.open_or_build(tmp_path, sbm, cfg, progress=False)
    with caplog.at_level("INFO", logger="kernels.ppr_index"):
        assert not idx.ensure_induced(sbm, max_bytes=1000, limit_name="--induced-table-bytes")  # above the limit
    assert idx.induced is None
    # the line names the flag that would build it (a new user saw "> limit 1024 MiB" and no flag)
    assert any("skipped" in r.getMessage() and "--induced-table-bytes" in r.getMessage() for r in caplog.records)
    assert idx.ensure_induced(sbm)
    meta = json.loads((idx.path / "meta.json").read_text())
    assert meta["induced"]["k"] == 30 and meta["induced"]["edges"] == len(idx.induced.src)

    def no_build(*a, **k):
        raise AssertionError("rebuilt an induced table that is saved")

    monkeypatch.setattr(InducedTable, "build", classmethod(no_build))
    again = PPRIndex.open(idx.path, sbm)
    assert again.ensure_induced(sbm)
    assert _mapped(again.induced.src) and _mapped(again.induced.eptr)
    targets = np.arange(0, 600, 7)
    assert_same_batch(again.induced_batch(sbm, targets, 12), idx.induced_batch(sbm, targets, 12))
    monkeypatch.undo()

    # a damaged table file is ignored (logged) and rebuilt, never used
    (idx.path / "induced_dst.bin").write_bytes(b"\0\0")
    third = PPRIndex.open(idx.path, sbm)
    assert third.ensure_induced(sbm)
    assert_same_batch(third.induced_batch(sbm, targets, 30), induced_batch(sbm, *idx.lookup(targets, 30)))

    # a list that is not the table's own list is refused
    ptr, nodes = idx.lookup([5, 6], 10)
    with pytest.raises(ValueError, match="start with its own target"):
        idx.induced.batch(sbm, np.array([6, 5]), ptr, nodes)
    with pytest.raises(ValueError, match="longer than"):
        idx.induced.batch(sbm, np.array([5]), np.array([0, 31]), np.arange(31) + 5)


def test_a_build_killed_mid_write_leaves_nothing_the_next_build_keeps(sbm, tmp_path, caplog):
    """A build killed with SIGKILL cannot remove its temporary directory; the next ``open_or_build`` of
    that cache directory removes it (its process is gone, nothing in it changed for STALE_AFTER_S) and
    leaves alone a live writer's, one written to recently (a writer on another host of a shared volume)
    and names whose pid is not one."""
    import subprocess
    import sys

    cfg = PPRConfig(eps=1e-4, topk=25)
    d = PPRIndex.path_for(tmp_path, sbm, cfg)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    stale = tmp_path / f"{d.name}.tmp-{dead}-140000"
    stale.mkdir()
    (stale / "nodes.bin").write_bytes(b"\0" * 4096)
    live = tmp_path / f"{d.name}.tmp-{os.getpid()}-1"  # this process: alive, so someone's build in progress
    live.mkdir()
    other = tmp_path / "ppr-otherfingerprint-x.tmp-1-1"  # another index's: not this build's business
    other.mkdir()
    recent = tmp_path / f"{d.name}.tmp-{dead}-7"  # a dead pid here, but written to just now: another host's?
    recent.mkdir()
    odd = [tmp_path / f"{d.name}.tmp-keep-me", tmp_path / f"{d.name}.tmp-99999999999999999999"]  # no pid of ours
    for p in odd:
        p.mkdir()
    old = time.time() - 3600
    for p in (stale, stale / "nodes.bin", *odd):
        os.utime(p, (old, old))
    with caplog.at_level("WARNING", logger="kernels.datasets"):
        PPRIndex.open_or_build(tmp_path, sbm, cfg, progress=False)
    assert not stale.exists() and live.exists() and other.exists() and recent.exists()
    assert all(p.exists() for p in odd)
    assert any("interrupted PPR index build" in r.getMessage() for r in caplog.records)


def test_new_nodes_in_a_forked_child_start_their_own_threads():
    """A process forked after ppr_new_nodes ran (a user's multiprocessing pool): the parent's worker threads do not
    exist in the child, whose call must start its own instead of waiting for them for ever."""
    import multiprocessing as mp

    from kernels.ppr import ppr_new_nodes

    g = synthetic_sbm(300, num_classes=3, avg_degree=8, num_features=2, seed=1).graph
    nodes = [(np.array([1, 2, 3]), None), (np.array([7, 9]), None), (np.array([11]), None)]
    want = ppr_new_nodes(g, nodes, PPRConfig(), threads=3)  # the parent's pool exists now
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(ppr_new_nodes, (g, nodes, PPRConfig()), {"threads": 3}).get(timeout=60)
    for (a, sa), (b, sb) in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sa, sb)
