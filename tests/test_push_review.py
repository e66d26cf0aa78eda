"""Adversarial checks written by a review of the 2026-11-28 changes: a replica's groups of updates against chained
``apply_edit`` in memory, lockstep new-node pushes on an edited replica against ``ppr_new_node``, the dense new-node
push on a live graph's carried scratch (spare rows) against the sparse push, and a PPR index cached before weighted
degrees were summed per row (refused, built again)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, ppr_topk

from .test_replica_exact import Mirror, _ring_and_random, _store_of

pytest_plugins = ("tests.redis_server",)


def _parsed(edit):
    from serve.live import ParsedUpdate

    m = int(edit.new_count)
    return ParsedUpdate(np.zeros(0, np.int64), np.zeros((0, 4), np.float32), np.zeros((m, 4), np.float32), edit)


def _rand_update(rng, g: CSRGraph, weighted: bool):
    """A random update of ``g`` (which may be invalid): additions, removals, loops, new nodes, re-weighting."""
    from kernels.graph_edit import GraphEdit

    n = g.num_nodes
    src = g.row_ids()
    und = [(int(a), int(b)) for a, b in zip(src.tolist(), g.indices.tolist(), strict=True) if a <= b]
    op = rng.choice(["add", "remove", "loop", "unloop", "new", "reweight", "mixed"])
    w = (lambda k: rng.uniform(0.2, 3.0, k).astype(np.float32)) if weighted else (lambda k: None)
    if op == "add":
        u, v = (int(x) for x in rng.choice(n, 2, replace=False))
        return GraphEdit.make(add_src=[u], add_dst=[v], add_w=w(1))
    if op == "remove" and und:
        e = und[int(rng.integers(len(und)))]
        return GraphEdit.make(rem_src=[e[0]], rem_dst=[e[1]])
    if op == "loop":
        u = int(rng.integers(n))
        return GraphEdit.make(add_src=[u], add_dst=[u], add_w=w(1))
    if op == "unloop":
        loops = [a for a, b in und if a == b]
        if loops:
            u = loops[int(rng.integers(len(loops)))]
            return GraphEdit.make(rem_src=[u], rem_dst=[u])
    if op == "new":
        m = int(rng.integers(1, 3))
        ptr, nbrs = [0], []
        for j in range(m):
            k = int(rng.integers(0, 4))
            nbrs += rng.choice(n + j, k, replace=False).tolist()
            ptr.append(len(nbrs))
        return GraphEdit.make(new_count=m, new_ptr=ptr, new_nbrs=nbrs, new_weights=w(len(nbrs)))
    if op == "reweight" and und:
        e = und[int(rng.integers(len(und)))]
        return GraphEdit.make(rem_src=[e[0]], rem_dst=[e[1]], add_src=[e[0]], add_dst=[e[1]],
                              add_w=rng.uniform(0.2, 3.0, 1).astype(np.float32))
    # mixed: a removal and two additions
    e = und[int(rng.integers(len(und)))] if und else (0, 1)
    a = [tuple(int(x) for x in rng.choice(n, 2, replace=False)) for _ in range(2)]
    return GraphEdit.make(rem_src=[e[0]], rem_dst=[e[1]], add_src=[x for x, _ in a], add_dst=[y for _, y in a],
                          add_w=w(2))


@pytest.mark.parametrize("weighted", [False, True])
def test_replica_update_groups_equal_apply_edit_in_memory(redis_factory, weighted):
    """Random groups of 1-4 updates (each validated on the group so far, as serve.live does on a replica), applied
    to the store's overlay as LiveGraph._apply_locked does: every update accepted/refused as apply_edit in memory
    refuses it (same words), and afterwards every row, the edge and self-loop counts and the push degrees equal the
    graph in memory."""
    from kernels.graph_edit import GraphEditError, _self_loop_count, apply_edit
    from kernels.ppr_push import _weighted_degree
    from serve.live import _Group, _remote_edit

    rng = np.random.default_rng(3 + weighted)
    n, edges = _ring_and_random(weighted, 9 + weighted, loops=True)
    g = Mirror(n, edges, weighted).graph()
    cfg = PPRConfig(topk=8, eps=1e-2)
    with _store_of(redis_factory, g, cfg, f"grp{int(weighted)}") as store:
        for rnd in range(14):
            group = _Group(store, store.num_nodes, chain_only=True)
            mem = g
            for _ in range(int(rng.integers(1, 5))):
                e = _rand_update(rng, mem, weighted)
                try:
                    want = apply_edit(mem, e)
                except GraphEditError as exc:
                    with pytest.raises(GraphEditError) as got:
                        group.add(_parsed(e), _remote_edit)
                    assert str(got.value) == str(exc), f"round {rnd}"
                    continue
                group.add(_parsed(e), _remote_edit)
                mem = want.graph
            eff = group.effect(_remote_edit)
            if eff is None:
                continue
            rg = eff.graph
            store.apply_rows({int(v): rg.rows[int(v)] for v in eff.changed_rows}, rg.num_nodes)
            g = mem
            assert store.num_nodes == g.num_nodes
            every = np.arange(g.num_nodes)
            rows = store.adjacency(every)
            for v in every.tolist():
                ids, w = rows[v]
                assert ids.tolist() == g.neighbors(v).tolist(), f"round {rnd}: row {v}"
                if g.weights is not None:
                    a, b = int(g.indptr[v]), int(g.indptr[v + 1])
                    ww = np.ones(len(ids), np.float32) if w is None else np.asarray(w, np.float32)
                    np.testing.assert_array_equal(ww, g.weights[a:b], err_msg=f"round {rnd}: weights of {v}")
            assert store.num_edges == g.num_edges, f"round {rnd}"
            assert store.self_loops == _self_loop_count(g), f"round {rnd}"
            np.testing.assert_array_equal(store.push_degrees(every), _weighted_degree(g), err_msg=f"round {rnd}")


@pytest.mark.parametrize("weighted", [False, True])
def test_lockstep_new_node_pushes_on_an_edited_replica_equal_memory(redis_factory, weighted):
    """pushed_new_nodes on a store with an overlay (edges added and removed, new nodes): a batch with a node without
    neighbours, duplicate specs, repeated neighbours, a hub, weights other than 1 on an unweighted graph, neighbours
    that exist only in the overlay: each list and score equals ppr_new_node on the graph in memory."""
    from kernels.ppr import ppr_new_node
    from serve.graph.store import pushed_new_node, pushed_new_nodes

    rng = np.random.default_rng(17 + weighted)
    n, edges = _ring_and_random(weighted, 12 + weighted, loops=False)
    mirror = Mirror(n, edges, weighted)
    mirror._snap_weighted = weighted
    g = mirror.graph()
    cfg = PPRConfig(topk=24, eps=2e-3)
    with _store_of(redis_factory, g, cfg, f"lock{int(weighted)}", cache_bytes=0) as store:
        wgt = (lambda a, b: float(np.float32(rng.uniform(0.2, 3.0)))) if weighted else None
        g, _ = mirror.edit([store], add=[(0, 170), (3, 180)], remove=[(1, 2)], weight=wgt)
        g, _ = mirror.edit([store], new=2, add=[(n, 4), (n, 171), (n + 1, n), (n + 1, 60)], weight=wgt)
        hub = int(np.argmax(np.diff(g.indptr)))
        specs = [
            (np.array([5, 171], np.int64), None),
            (np.zeros(0, np.int64), None),
            (np.array([5, 171], np.int64), None),
            (np.array([hub, 7, 7, n + 1], np.int64), np.array([0.5, 2.0, 1.5, 3.0])),
            (np.array([n, 60, 150], np.int64), None),
            (np.array([199, 120], np.int64), np.array([1.0, 0.0])),
        ]
        got = pushed_new_nodes(store, specs, cfg)
        for j, ((nb, w), (gn, gs)) in enumerate(zip(specs, got, strict=True)):
            wn, ws = ppr_new_node(g, nb, w, cfg)
            assert gn.tolist() == wn.tolist(), f"spec {j}"
            np.testing.assert_array_equal(gs, ws, err_msg=f"spec {j}")
            one = pushed_new_node(store, nb, w, cfg)
            assert one[0].tolist() == wn.tolist(), f"spec {j} alone"


def test_an_index_cached_before_the_row_sum_degrees_is_not_reused(tmp_path):
    """605deb4 changed the push's weighted degrees (kernels.ppr_push._weighted_degree: per-row sums instead of a
    difference of one running sum; up to a few % of a degree after a heavy edge). An index of a weighted graph
    cached in REPO/_ppr by the previous release (emulated: built with the running-sum degrees, its meta without the
    ``weighted_degrees`` mark) would be opened as current, its lists differing from ppr_topk's on the same graph:
    open refuses it and open_or_build builds it again."""
    from kernels.ppr import PPRIndex, PPRIndexError

    rng = np.random.default_rng(0)
    n = 300
    ei = rng.integers(0, n, size=(2, 1500))
    w = rng.uniform(0.2, 3.0, 1500).astype(np.float32)
    w[0] = 1e15  # an edit may add weights up to kernels.graph_edit.MAX_WEIGHT = 1e15

    def make() -> CSRGraph:
        return CSRGraph.from_edge_index(ei, num_nodes=n, weights=w, symmetrize=True, remove_self_loops=True)

    cfg = PPRConfig(topk=16, eps=1e-4)
    old = make()
    cs = np.zeros(old.num_edges + 1)
    np.cumsum(old.weights, dtype=np.float64, out=cs[1:])
    old.cache()["_ppr_wdeg"] = cs[old.indptr[1:]] - cs[old.indptr[:-1]]  # the previous release's degrees
    built = PPRIndex.open_or_build(tmp_path, old, cfg, progress=False).path
    meta = json.loads((built / "meta.json").read_text())
    del meta["weighted_degrees"]  # the previous release's file carried no mark of how its degrees were summed
    (built / "meta.json").write_text(json.dumps(meta))
    g = make()
    with pytest.raises(PPRIndexError, match="weighted degrees"):
        PPRIndex.open(built, g)
    idx = PPRIndex.open_or_build(tmp_path, g, cfg, progress=False)  # built again
    ptr, nodes = idx.lookup(np.arange(n))
    wp, wn, _ = ppr_topk(g, np.arange(n), cfg)
    bad = [v for v in range(n) if nodes[ptr[v]:ptr[v + 1]].tolist() != wn[wp[v]:wp[v + 1]].tolist()]
    assert not bad, f"{len(bad)} of {n} lists of the cached index differ from ppr_topk (e.g. node {bad[0]})"


@pytest.mark.parametrize("weighted", [False, True])
def test_new_node_push_on_a_live_graphs_spare_scratch_equals_the_sparse_push(weighted):
    """After live updates that add nodes (the pooled scratches carried with spare rows, their thresholds set by
    LivePPRIndex; ppr_new_node's own one-worker scratch among them once it has pushed), ppr_new_node's lists equal
    the sparse _ppr_virtual's to the bit, and ppr_topk afterwards (on the same pool) equals ppr_topk on a fresh
    copy of the graph."""
    from kernels.graph_edit import GraphEdit, apply_edit
    from kernels.ppr import PPRIndex, ppr_new_node
    from kernels.ppr_live import LivePPRIndex
    from kernels.ppr_push import _NO_F32, _SCRATCH_KEY, _ppr_virtual, _weighted_degree, new_node_edges

    rng = np.random.default_rng(1 + weighted)
    n = 300
    ei = rng.integers(0, n, size=(2, 1500))
    g = CSRGraph.from_edge_index(ei, num_nodes=n, weights=rng.uniform(0.2, 3.0, 1500) if weighted else None,
                                 symmetrize=True, remove_self_loops=True)
    cfg = PPRConfig(topk=16, eps=1e-4, lazy=weighted)
    live = LivePPRIndex(PPRIndex.build(g, cfg, progress=False))
    for step in range(5):
        m = int(rng.integers(1, 3))
        nbrs = np.concatenate([rng.choice(g.num_nodes + j, 3, replace=False) for j in range(m)])
        eff = apply_edit(g, GraphEdit.make(new_count=m, new_ptr=np.arange(0, 3 * m + 1, 3), new_nbrs=nbrs))
        live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
        assert any(sc.capacity > g.num_nodes for sc in g.cache().get(_SCRATCH_KEY, []))
        for _ in range(3):
            nb = rng.choice(g.num_nodes, 4)
            nw = rng.uniform(0.0, 2.0, 4) if weighted else None
            got = ppr_new_node(g, nb, nw, cfg)
            uniq, wsum = new_node_edges(g.num_nodes, nb, nw)
            wd = _weighted_degree(g) if g.is_weighted else np.zeros(0)
            wn, ws, _, _ = _ppr_virtual(g.indptr, g.indices, g.weights if g.weights is not None else _NO_F32, wd,
                                        uniq, wsum, True, cfg.alpha, cfg.eps, cfg.lazy, cfg.topk, cfg.threshold,
                                        200_000)
            assert got[0].tolist() == wn.tolist(), f"step {step}"
            np.testing.assert_array_equal(got[1], ws.astype(np.float32))
        t = np.arange(g.num_nodes)
        fresh = CSRGraph(g.indptr.copy(), g.indices.copy(), None if g.weights is None else g.weights.copy(),
                         num_nodes=g.num_nodes)
        for x, y in zip(ppr_topk(g, t, cfg), ppr_topk(fresh, t, cfg), strict=True):
            np.testing.assert_array_equal(x, y, err_msg=f"step {step}")


def test_a_weighted_graph_loaded_without_the_degree_mark_has_its_lists_pushed_again(redis_factory):
    """The loader marks a weighted graph's PPR configurations with how the pushes summed weighted degrees
    (kernels.ppr_index.DEGREE_SUMS; not an unweighted graph's, whose degrees are counts). A graph loaded before that
    mark existed may hold lists that differ from a push's now: a replica then treats every stored list as outdated
    from the start (each pushed on first use, equal to ppr_topk), while a marked graph's lists are used as stored;
    loading the unmarked live version again is refused (a new --version is what mends it)."""
    import redis

    from serve.graph.schema import GraphKeys
    from serve.graph_store import RedisGraphStore, load_graph
    from serve.redisdata.errors import GraphCorrupt

    from .test_replica_exact import _load

    n, edges = _ring_and_random(True, 7)
    mirror = Mirror(n, edges, True)
    mirror._snap_weighted = True
    g = mirror.graph()
    cfg = PPRConfig(topk=10, eps=1e-3)
    targets = np.arange(n)
    srv = redis_factory()
    _load(srv.url, g, cfg, "marked")
    cl = redis.Redis.from_url(srv.url)
    key = GraphKeys(g.fingerprint(), 1).meta
    ppr = json.loads(cl.hget(key, "ppr"))
    assert all(pm["weighted_degrees"] == "rows" for pm in ppr.values())
    store = RedisGraphStore(srv.url, g.fingerprint())  # marked: the stored lists are current
    assert not store.stale_lists and store.structure_gen == 0
    assert len(store.outdated_lists(cfg.key(), targets)) == 0
    store.close()
    for pm in ppr.values():  # what a loader before the mark wrote
        del pm["weighted_degrees"]
    cl.hset(key, "ppr", json.dumps(ppr, sort_keys=True))
    store = RedisGraphStore(srv.url, g.fingerprint())
    try:
        assert store.stale_lists
        assert store.outdated_lists(cfg.key(), targets).tolist() == targets.tolist()
        idx = store.ppr_index(cfg)
        got_ptr, got = idx.lookup(targets)
        ptr, want, _ = ppr_topk(g, targets, cfg, k=idx.k_max)
        np.testing.assert_array_equal(got_ptr, ptr)
        np.testing.assert_array_equal(got, want)
        assert len(store.outdated_lists(cfg.key(), targets)) == 0  # pushed once, then current
    finally:
        store.close()
    with pytest.raises(GraphCorrupt, match="new --version"):
        load_graph(_DS(g, "marked"), srv.url, ppr=[cfg], chunk_size=32, progress=False)
    # an unweighted graph's configurations carry no mark and its lists stay current
    n2, edges2 = _ring_and_random(False, 8)
    g2 = Mirror(n2, edges2, False).graph()
    srv2 = redis_factory()
    _load(srv2.url, g2, cfg, "plain")
    ppr2 = json.loads(redis.Redis.from_url(srv2.url).hget(GraphKeys(g2.fingerprint(), 1).meta, "ppr"))
    assert all("weighted_degrees" not in pm for pm in ppr2.values())
    store = RedisGraphStore(srv2.url, g2.fingerprint())
    assert not store.stale_lists and len(store.outdated_lists(cfg.key(), np.arange(n2))) == 0
    store.close()


class _DS:
    def __init__(self, g: CSRGraph, name: str) -> None:
        self.graph, self.name = g, name

    def fingerprint(self) -> str:
        return "ds-" + self.graph.fingerprint()[:8] + self.name
