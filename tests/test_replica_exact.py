"""A replica's PPR lists kept by reach (serve.graph.store: outdated_lists, _kept_by_reach, refresh_lists(reach=),
the changes log and its floor, the reach cache) and its own update path (serve.live._remote_edit), against the
graph in memory. Written as an adversarial review (2026-11-28); it found updates grouped into one version broken on
a replica, self loops refused there, and weighted degrees summed differently in memory.

The invariant: after any sequence of structural updates, every list a replica serves equals
:func:`kernels.ppr.ppr_topk` on the current graph in memory (ids and order; the scores of a push to the bit on an
unweighted graph), and so does every induced batch built on those lists. The scenarios are adversarial on purpose:
reach entries evicted, a changes log that overflows after every edit, lists looked up only every few versions,
two replicas with different look-up cadences, self loops, new nodes (with and without edges, linked to each
other), a node stripped of every edge, bulk edits, re-weighted edges, rows re-applied unchanged, a graph that
turns weighted, concurrent look-ups between edits; plus the replica's own update path (serve.live) for updates
grouped into one version.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, ppr_topk
from kernels.subgraph import induced_batch

pytest_plugins = ("tests.redis_server",)


# ============================================================================ a mirror of the replica's graph
class Mirror:
    """The graph as an undirected edge dict ``(u, v), u <= v -> weight`` (self loops allowed), applied to one or
    more replica stores the way serve.live applies an update to a replica (the changed rows, the node count)."""

    def __init__(self, n: int, edges: dict, weighted: bool) -> None:
        self.n = n
        self.edges = dict(edges)
        self.weighted = weighted

    def graph(self) -> CSRGraph:
        src, dst, w = [], [], []
        for (u, v), x in self.edges.items():
            src.append(u)
            dst.append(v)
            w.append(x)
            if u != v:
                src.append(v)
                dst.append(u)
                w.append(x)
        s = np.asarray(src, dtype=np.int64)
        d = np.asarray(dst, dtype=np.int64)
        order = np.lexsort((d, s))
        s, d = s[order], d[order]
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(s, minlength=self.n), out=indptr[1:])
        weights = np.asarray(w, dtype=np.float32)[order] if self.weighted else None
        return CSRGraph(indptr=indptr, indices=d.astype(np.int32), weights=weights, num_nodes=self.n)

    def row(self, g: CSRGraph, v: int) -> tuple[np.ndarray, np.ndarray | None]:
        a, b = int(g.indptr[v]), int(g.indptr[v + 1])
        return g.indices[a:b].astype(np.int64), (g.weights[a:b].copy() if g.weights is not None else None)

    def edit(self, stores, *, add=(), remove=(), new=0, touch=(), weight=None) -> tuple[CSRGraph, set]:
        """Apply an edit here and to ``stores``; ``weight(u, v)`` gives an added edge's weight (1 without)."""
        touched = set(int(x) for x in touch)
        for u, v in remove:
            key = (min(u, v), max(u, v))
            if key in self.edges:
                del self.edges[key]
                touched |= {u, v}
        self.n += new
        touched |= set(range(self.n - new, self.n))
        for u, v in add:
            key = (min(u, v), max(u, v))
            self.edges[key] = float(weight(u, v)) if weight is not None else 1.0
            touched |= {u, v}
        g = self.graph()
        rows = {}
        for v in sorted(touched):
            ids, w = self.row(g, v)
            # an unweighted replica row stays unweighted (None) as apply_edit leaves it on an unweighted graph
            rows[v] = (ids, w if (w is not None and bool(np.any(w != 1.0))) or self._snap_weighted else None)
        for st in stores:
            st.apply_rows(rows, self.n)
        return g, touched

    _snap_weighted = False


def _ring_and_random(weighted: bool, seed: int, loops: bool = True) -> tuple[int, dict]:
    """A ring lattice of 150 nodes (neighbours +-1, +-2, +-3: pushes stay local), a random component of 50
    nodes, 6 isolated nodes and, with ``loops``, a few self loops."""
    rng = np.random.default_rng(seed)
    edges: dict = {}

    def w() -> float:
        return float(np.float32(rng.uniform(0.2, 3.0))) if weighted else 1.0

    ring = 150
    for u in range(ring):
        for d in (1, 2, 3):
            v = (u + d) % ring
            edges[(min(u, v), max(u, v))] = w()
    for _ in range(160):
        u, v = (int(x) for x in rng.integers(ring, ring + 50, 2))
        if u != v:
            edges[(min(u, v), max(u, v))] = w()
    if loops:
        for u in (5, 77, ring + 3):
            edges[(u, u)] = w()
    return ring + 50 + 6, edges


def _load(url: str, g: CSRGraph, cfg: PPRConfig, name: str) -> None:
    from serve.graph_store import load_graph

    class DS:
        graph = g

        def __init__(self) -> None:
            self.name = name

        def fingerprint(self) -> str:
            return "ds-" + g.fingerprint()[:8] + name

    load_graph(DS(), url, ppr=[cfg], chunk_size=32, progress=False)


@contextlib.contextmanager
def _store_of(redis_factory, g: CSRGraph, cfg: PPRConfig, name: str, **kw):
    """A replica's store over ``g`` (with ``cfg``'s lists) loaded into a fresh Redis; closed on exit."""
    from serve.graph_store import RedisGraphStore

    srv = redis_factory()
    _load(srv.url, g, cfg, name)
    store = RedisGraphStore(srv.url, g.fingerprint(), **kw)
    try:
        yield store
    finally:
        store.close()


def _check_lists(idx, g: CSRGraph, cfg: PPRConfig, targets: np.ndarray, k: int, what: str) -> None:
    got_ptr, got_nodes = idx.lookup(targets, k)
    ptr, nodes, _ = ppr_topk(g, targets, cfg)
    for i, t in enumerate(targets.tolist()):
        want = nodes[ptr[i]:ptr[i + 1]][:k]
        got = got_nodes[got_ptr[i]:got_ptr[i + 1]]
        assert got.tolist() == want.tolist(), f"{what}: list of {t} (k={k}) is {got.tolist()}, ppr_topk gives " \
                                              f"{want.tolist()}"


def _check_induced(idx, store, g: CSRGraph, cfg: PPRConfig, targets: np.ndarray, k: int, what: str) -> None:
    got = idx.induced_batch(store, targets, k)
    ptr, nodes, _ = ppr_topk(g, targets, cfg, k=k)
    want = induced_batch(g, ptr, nodes)
    np.testing.assert_array_equal(got.ptr, want.ptr, err_msg=what)
    np.testing.assert_array_equal(got.node_ids, want.node_ids, err_msg=what)
    np.testing.assert_array_equal(got.graph.indptr, want.graph.indptr, err_msg=what)
    np.testing.assert_array_equal(got.graph.indices, want.graph.indices, err_msg=what)
    if g.weights is not None:
        np.testing.assert_array_equal(got.graph.weights, want.graph.weights, err_msg=what)
    from models.base import full_gcn_degrees

    # the in-memory server's GCN degrees (bincount over the rows); float64 sums of float32 weights of this size are
    # exact, so any order of summation gives these bits
    np.testing.assert_array_equal(got.gcn_degrees, full_gcn_degrees(g)[want.node_ids], err_msg=what)


def _check_scores(store, g: CSRGraph, cfg: PPRConfig, targets: np.ndarray, what: str) -> None:
    """A replica's push on its current graph gives ppr_topk's list and scores to the bit (unweighted)."""
    from serve.graph.store import pushed_lists

    fresh = pushed_lists(store, targets, cfg)
    ptr, nodes, scores = ppr_topk(g, targets, cfg)
    for t in np.unique(targets).tolist():
        j = int(np.flatnonzero(targets == t)[0])
        assert fresh[t][0].tolist() == nodes[ptr[j]:ptr[j + 1]].tolist(), what
        if g.weights is None:
            np.testing.assert_array_equal(fresh[t][1], scores[ptr[j]:ptr[j + 1]], err_msg=what)


# ============================================================================ randomized edit sequences
SCENARIOS = {
    "plain": dict(weighted=False, cfg=dict(topk=12, eps=4e-3)),
    "weighted": dict(weighted=True, cfg=dict(topk=12, eps=4e-3)),
    "lazy-threshold": dict(weighted=False, cfg=dict(topk=10, eps=3e-3, lazy=True, threshold=0.02)),
    "log-overflows": dict(weighted=False, cfg=dict(topk=12, eps=4e-3), log_ids=5),
    "reach-evicted": dict(weighted=False, cfg=dict(topk=12, eps=4e-3), cache_bytes=6_000),
    "turns-weighted": dict(weighted=False, cfg=dict(topk=12, eps=4e-3), flip=True),
    "weighted-overflow-evict": dict(weighted=True, cfg=dict(topk=12, eps=4e-3), log_ids=9, cache_bytes=8_000),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_random_edit_sequences_keep_every_served_list_exact(redis_factory, monkeypatch, name):
    """Random structural edits (additions, removals, self loops, a node stripped of all its edges, new nodes with
    and without edges and linked to each other, bulk edits, re-weighting, rows re-applied unchanged, the node count
    grown alone), each followed by look-ups of a random subset of targets (often none: lists skip versions), on
    two replicas of one Redis graph with different cadences: every list and induced batch served equals the one
    on the graph in memory."""
    import serve.graph.store as store_mod
    from serve.graph_store import RedisGraphStore

    sc = SCENARIOS[name]
    weighted = sc["weighted"]
    if "log_ids" in sc:
        monkeypatch.setattr(store_mod, "_CHANGE_LOG_IDS", sc["log_ids"])
    cfg = PPRConfig(**sc["cfg"])
    seed = sorted(SCENARIOS).index(name) + 11
    rng = np.random.default_rng(seed)
    n, edges = _ring_and_random(weighted, seed)
    mirror = Mirror(n, edges, weighted)
    mirror._snap_weighted = weighted
    g0 = mirror.graph()
    srv = redis_factory()
    _load(srv.url, g0, cfg, name)
    cache = sc.get("cache_bytes", 1 << 22)
    a = RedisGraphStore(srv.url, g0.fingerprint(), cache_bytes=cache)
    b = RedisGraphStore(srv.url, g0.fingerprint(), cache_bytes=cache)
    try:
        ia, ib = a.ppr_index(cfg), b.ppr_index(cfg)
        k_max = ia.k_max
        g = g0

        def wgt(u, v):
            if weighted:
                return float(np.float32(rng.uniform(0.2, 3.0)))
            if sc.get("flip") and rng.random() < 0.15:
                mirror.weighted = True
                return 2.5
            return 1.0

        def rand_edge():
            keys = list(mirror.edges)
            return keys[int(rng.integers(len(keys)))]

        # every list pushed once with its reach, on both replicas
        g, _ = mirror.edit([a, b], add=[(0, 100)], weight=wgt)
        every = np.arange(mirror.n)
        _check_lists(ia, g, cfg, every, k_max, f"{name}: first")
        _check_lists(ib, g, cfg, every, k_max, f"{name}: first (b)")
        for step in range(36):
            op = rng.choice(["add", "remove", "loop", "strip", "new", "bulk", "reweight", "touch", "grow",
                             "local"])
            kw: dict = {}
            if op == "add":
                u, v = (int(x) for x in rng.choice(mirror.n, 2, replace=False))
                kw = dict(add=[(u, v)])
            elif op == "local":  # an edit on the ring: lists far along it are kept
                u = int(rng.integers(150))
                kw = dict(add=[(u, (u + 5) % 150)]) if rng.random() < 0.5 else dict(remove=[(min(u, (u + 1) % 150),
                                                                                            max(u, (u + 1) % 150))])
            elif op == "remove":
                kw = dict(remove=[rand_edge()])
            elif op == "loop":
                u = int(rng.integers(mirror.n))
                kw = dict(remove=[(u, u)]) if (u, u) in mirror.edges else dict(add=[(u, u)])
            elif op == "strip":  # a node loses every edge (its last one included)
                u = int(rng.integers(mirror.n))
                kw = dict(remove=[e for e in mirror.edges if u in e], touch=[u])
            elif op == "new":
                m = int(rng.integers(1, 4))
                base = mirror.n
                add = []
                for j in range(m):
                    nb = rng.choice(base + j, int(rng.integers(0, 4)), replace=False).tolist() if base + j else []
                    add += [(base + j, int(x)) for x in nb]
                kw = dict(new=m, add=add)
            elif op == "bulk":
                add = [tuple(int(x) for x in rng.choice(mirror.n, 2, replace=False)) for _ in range(8)]
                rem = [rand_edge() for _ in range(6)]
                kw = dict(add=add, remove=rem)
            elif op == "reweight":
                e = rand_edge()
                kw = dict(remove=[e], add=[e])
            elif op == "touch":  # rows given again, unchanged
                kw = dict(touch=rng.choice(mirror.n, 3, replace=False).tolist())
            elif op == "grow":  # the node count alone
                kw = dict(new=1)
            g, touched = mirror.edit([a, b], weight=wgt, **kw)
            cur_n = mirror.n
            assert a.num_nodes == b.num_nodes == cur_n
            # look-ups on a: a random subset (often with the touched nodes), or none (versions skipped)
            r = rng.random()
            if r < 0.3:
                pass
            else:
                size = int(rng.integers(1, 40))
                t = rng.choice(cur_n, min(size, cur_n), replace=False)
                if touched and rng.random() < 0.5:
                    t = np.r_[t, np.fromiter(touched, dtype=np.int64)]
                t = t.astype(np.int64)
                k = int(rng.integers(1, k_max + 1))
                what = f"{name} step {step} ({op}) on a"
                if rng.random() < 0.5:
                    _check_lists(ia, g, cfg, t, k, what)
                else:
                    _check_induced(ia, a, g, cfg, t, k, what)
            if step % 9 == 8:  # replica b looks every list up only now and then
                _check_lists(ib, g, cfg, np.arange(cur_n), k_max, f"{name} step {step} on b")
        every = np.arange(mirror.n)
        _check_lists(ia, g, cfg, every, k_max, f"{name}: last on a")
        _check_induced(ia, a, g, cfg, every, k_max, f"{name}: last induced on a")
        _check_lists(ib, g, cfg, every, k_max, f"{name}: last on b")
        _check_scores(a, g, cfg, every, f"{name}: scores")
        assert a.lists_kept > 0  # the scenario did exercise the keep path
    finally:
        a.close()
        b.close()


# ============================================================================ concurrent look-ups between edits
def test_concurrent_lookups_between_edits_keep_lists_exact(redis_factory):
    """Several threads look lists and induced batches up at once (what concurrent batches do under the graph's
    read lock: refresh_lists, apply_lists and the reach marks race each other), edits in between (the write lock):
    each answer equals the graph in memory's, and so do the lists afterwards."""
    from serve.graph_store import RedisGraphStore

    cfg = PPRConfig(topk=12, eps=4e-3)
    n, edges = _ring_and_random(False, 3)
    mirror = Mirror(n, edges, False)
    g = mirror.graph()
    srv = redis_factory()
    _load(srv.url, g, cfg, "concurrent")
    store = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=1 << 22)
    rng = np.random.default_rng(5)
    errors: list = []
    try:
        idx = store.ppr_index(cfg)
        for rnd in range(8):
            if rnd % 3 == 2:
                g, _ = mirror.edit([store], new=2, add=[(mirror.n, 3), (mirror.n + 1, mirror.n)])
            else:
                u = int(rng.integers(150))
                g, _ = mirror.edit([store], add=[(u, (u + 7) % 150)], remove=[(min(u, (u + 1) % 150),
                                                                                 max(u, (u + 1) % 150))])
            ptr, nodes, _ = ppr_topk(g, np.arange(mirror.n), cfg)
            seeds = rng.integers(0, 1 << 30, 6)

            def work(seed: int, g=g, ptr=ptr, nodes=nodes) -> None:
                r = np.random.default_rng(int(seed))
                try:
                    for _ in range(4):
                        t = r.choice(mirror.n, 25, replace=False).astype(np.int64)
                        if r.random() < 0.5:
                            gp, gn = idx.lookup(t)
                            for i, v in enumerate(t.tolist()):
                                assert gn[gp[i]:gp[i + 1]].tolist() == nodes[ptr[v]:ptr[v + 1]].tolist(), v
                        else:
                            b = idx.induced_batch(store, t, 8)
                            want = induced_batch(g, *ppr_topk(g, t, cfg, k=8)[:2])
                            np.testing.assert_array_equal(b.node_ids, want.node_ids)
                            np.testing.assert_array_equal(b.graph.indices, want.graph.indices)
                except BaseException as exc:  # reported by the main thread
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(s,)) for s in seeds]
            for th in threads:
                th.start()
            for th in threads:
                th.join(60)
            assert not errors, errors[0]
            _check_lists(idx, g, cfg, np.arange(mirror.n), idx.k_max, f"round {rnd}")
        assert store.lists_kept > 0
    finally:
        store.close()


# ============================================================================ targeted cases
def test_a_list_whose_push_only_read_a_changed_nodes_degree_is_pushed_again(redis_factory):
    """A node the push reached but never pushed (its degree read, not its row) changes degree: the list must not
    be kept (it is in the push's reach). Built so that the far end of a path is reached but stays below the
    threshold, then given many edges to nodes the push never saw."""

    cfg = PPRConfig(topk=8, eps=2e-2)
    n = 60
    edges = {(i, i + 1): 1.0 for i in range(9)}  # a path 0 - 1 - ... - 9
    edges.update({(20 + i, 21 + i): 1.0 for i in range(30)})  # elsewhere
    mirror = Mirror(n, edges, False)
    g = mirror.graph()
    with _store_of(redis_factory, g, cfg, "degree-only") as store:
        idx = store.ppr_index(cfg)
        g, _ = mirror.edit([store], add=[(40, 45)])
        _check_lists(idx, g, cfg, np.arange(10), idx.k_max, "first")
        from serve.graph.store import pushed_lists

        reach: dict = {}
        pushed_lists(store, np.array([0]), cfg, reach=reach)
        far = int(reach[0].max())
        assert far < 9  # the push from 0 does not read the whole path
        g, _ = mirror.edit([store], add=[(far, 20 + j) for j in range(0, 30, 2)])
        _check_lists(idx, g, cfg, np.arange(10), idx.k_max, "after the far node's degree grew")
        g, _ = mirror.edit([store], remove=[(far, 20 + j) for j in range(0, 30, 2)] + [(far - 1, far)])
        _check_lists(idx, g, cfg, np.arange(10), idx.k_max, "after the far node lost its last edges")


def test_lists_checked_before_the_log_floor_are_pushed_again(redis_factory, monkeypatch):
    """The changes log drops its oldest generations: a list last found exact before the floor cannot be judged
    by its reach and must be pushed (an edit to its reach in the lost part would otherwise go unseen)."""
    import serve.graph.store as store_mod

    monkeypatch.setattr(store_mod, "_CHANGE_LOG_IDS", 3)
    cfg = PPRConfig(topk=12, eps=4e-3)
    n, edges = _ring_and_random(False, 8, loops=False)
    mirror = Mirror(n, edges, False)
    g = mirror.graph()
    with _store_of(redis_factory, g, cfg, "floor") as store:
        idx = store.ppr_index(cfg)
        g, _ = mirror.edit([store], add=[(160, 170)])
        _check_lists(idx, g, cfg, np.arange(mirror.n), idx.k_max, "first")  # every list pushed with its reach
        g, _ = mirror.edit([store], add=[(10, 14)])  # in the reach of the lists of nodes near 10
        for j in range(4):  # edits far away: the log overflows, the edit at 10 falls below the floor
            g, _ = mirror.edit([store], add=[(160 + j, 180 + j)])
        assert store._changes_floor > 0 and all(gen > store._changes_floor for gen, _ in store._changes)
        _check_lists(idx, g, cfg, np.arange(0, 30), idx.k_max, "near the edit lost from the log")
        _check_lists(idx, g, cfg, np.arange(mirror.n), idx.k_max, "all")


def test_weighted_lists_with_a_heavy_edge_equal_the_graph_in_memory(redis_factory):
    """A weighted graph with one edge of weight 1e15 (the largest an update accepts, kernels.graph_edit): after a
    structural update every snapshot list is pushed again on the replica, and each must still be ppr_topk's on the
    same graph in memory (ids and order). ppr_topk's weighted degrees are differences of one running float64 sum
    over all edges (kernels.ppr_push._weighted_degree), which after 1e15 keeps no bit below 0.125; the replica sums
    each row (degree chunks: bincount; overlay rows: _weight_sum)."""

    rng = np.random.default_rng(0)
    n = 200
    edges: dict = {}
    for u, v in rng.integers(0, n, (800, 2)).tolist():
        if u != v:
            edges[(min(u, v), max(u, v))] = float(np.float32(rng.uniform(0.2, 3.0)))
    edges[(0, 1)] = 1e15
    mirror = Mirror(n, edges, True)
    mirror._snap_weighted = True
    g = mirror.graph()
    cfg = PPRConfig(topk=12, eps=1e-3)
    with _store_of(redis_factory, g, cfg, "heavy") as store:
        idx = store.ppr_index(cfg)
        _check_lists(idx, g, cfg, np.arange(n), idx.k_max, "the snapshot's lists")  # built by ppr_topk: equal
        u, v = next((a, b) for a, b in rng.integers(0, n, (100, 2)).tolist()
                    if a != b and (min(a, b), max(a, b)) not in mirror.edges)
        g, _ = mirror.edit([store], add=[(u, v)], weight=lambda a, b: 1.5)
        _check_lists(idx, g, cfg, np.arange(n), idx.k_max, "pushed again after an update")


# ============================================================================ the replica's own update path
def _group_parsed(edit):
    from serve.live import ParsedUpdate

    return ParsedUpdate(np.zeros(0, np.int64), np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), edit)


def test_a_replica_groups_two_structural_updates_into_one_version(redis_factory):
    """Updates waiting for a replica's writer are applied as one group (serve.live._Group, chain_only on a
    replica), and a log record of several updates (written by any server of the log) is replayed as one group.
    Each update after the first in a group is validated and applied on the group's graph so far; on a replica that
    graph is the previous _remote_edit's local CSR, which holds only the touched rows and has no ``adjacency``:
    the second update must still apply, with full rows."""
    from kernels.graph_edit import GraphEdit
    from serve.live import _Group, _remote_edit

    cfg = PPRConfig(topk=8, eps=1e-2)
    n, edges = _ring_and_random(False, 2, loops=False)
    mirror = Mirror(n, edges, False)
    g = mirror.graph()
    with _store_of(redis_factory, g, cfg, "group") as store:
        group = _Group(store, n, chain_only=True)
        group.add(_group_parsed(GraphEdit.make(add_src=[0], add_dst=[10])), _remote_edit)
        group.add(_group_parsed(GraphEdit.make(add_src=[40], add_dst=[60])), _remote_edit)
        eff = group.effect(_remote_edit)
        want = mirror.edit([], add=[(0, 10), (40, 60)])[0]
        for v in (0, 10, 40, 60):
            assert v in eff.changed_rows.tolist()
            assert eff.graph.rows[v][0].tolist() == want.neighbors(v).tolist(), v


def _edited(g: CSRGraph, pairs: list[tuple[int, int]]) -> CSRGraph:
    """``g`` with the undirected edges ``pairs`` added."""
    mirror = {(int(a), int(b)) for a in range(g.num_nodes) for b in g.neighbors(a).tolist()}
    for u, v in pairs:
        mirror |= {(u, v), (v, u)}
    return CSRGraph.from_edge_index(np.array(sorted(mirror)).T, g.num_nodes)


def test_a_replica_server_takes_updates_that_queue_behind_its_writer(redis_factory, tiny_repo, tiny_dataset,
                                                                      tmp_path):
    """Two structural updates that arrive while a replica's writer is busy (concurrent clients) are applied as
    one version, as on the in-memory server (test_live.test_updates_waiting_for_the_writer_share_one_version),
    and the replica's lists are then ppr_topk's on the edited graph."""
    from clients._gen import gnnserve_pb2 as pb

    from .test_live import queue_behind_the_writer
    from .test_stateless import assert_lists_are_pushes_on, replica_server

    g = tiny_dataset.graph
    with replica_server(redis_factory, tiny_repo, tiny_dataset, tmp_path) as (srv, cfg):
        rt = srv.server.registry.get("shadow")
        live = rt.data.live
        pairs = []
        for u in range(0, 800, 37):
            v = next(x for x in range(u + 1, 800) if x not in set(g.neighbors(u).tolist()))
            pairs.append((u, v))
            if len(pairs) == 2:
                break
        results: list = []
        errors: list = []

        def send(u: int, v: int) -> None:
            req = pb.UpdateGraphRequest(model="shadow")
            req.add_edges.add(src=u, dst=v)
            try:
                results.append(live.update(req))
            except Exception as exc:  # asserted below
                errors.append(exc)

        queue_behind_the_writer(live, [lambda p=p: send(*p) for p in pairs])
        assert not errors, [str(e) for e in errors]
        assert sorted(r.version for r in results) == [1, 1]
        assert_lists_are_pushes_on(rt.ppr_index, _edited(g, pairs), cfg)


def test_a_replica_replays_a_log_record_of_two_structural_updates(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """A log record holding two structural updates (what any server of the shared Redis log writes for a group,
    e.g. an in-memory server with its features in that Redis) is replayed by a following replica as one group:
    the replica must reach the record's version with both edits (not go out of service) and serve ppr_topk's
    lists on the edited graph."""
    from clients._gen import gnnserve_pb2 as pb
    from serve.live import _log_payload

    from .test_stateless import assert_lists_are_pushes_on, replica_server

    g = tiny_dataset.graph
    with replica_server(redis_factory, tiny_repo, tiny_dataset, tmp_path) as (srv, cfg):
        rt = srv.server.registry.get("shadow")
        live = rt.data.live
        pairs = [(3, next(x for x in range(400, 800) if x not in set(g.neighbors(3).tolist()))),
                 (500, next(x for x in range(10, 400) if x not in set(g.neighbors(500).tolist())))]
        reqs = []
        for u, v in pairs:
            r = pb.UpdateGraphRequest()
            r.add_edges.add(src=u, dst=v)
            reqs.append(r)
        assert live.log.append(_log_payload(reqs), expect_version=live.version) == 1
        t_end = time.monotonic() + 30
        while live.version < 1 and live.broken is None:
            assert time.monotonic() < t_end, "the replica never replayed the record"
            time.sleep(0.02)
        assert live.broken is None, live.broken
        assert_lists_are_pushes_on(rt.ppr_index, _edited(g, pairs), cfg)


def test_a_replica_validates_a_self_loop_as_the_graph_in_memory_does(redis_factory):
    """On a graph that holds self loops the in-memory server accepts an added self loop (apply_edit allows one iff
    the graph has one); a replica's edit of the same Redis graph (serve.live._remote_edit) must accept it too, or a
    replica following a log that such a server wrote cannot replay it (and answers differently to the same
    UpdateGraph)."""
    from kernels.graph_edit import GraphEdit, apply_edit
    from serve.live import _remote_edit

    n, edges = _ring_and_random(False, 4, loops=True)
    g = Mirror(n, edges, False).graph()
    cfg = PPRConfig(topk=8, eps=1e-2)
    with _store_of(redis_factory, g, cfg, "loops") as store:
        edit = GraphEdit.make(add_src=[20], add_dst=[20])
        want = apply_edit(g, edit)  # the in-memory server's
        got = _remote_edit(store, edit)
        assert got.changed_rows.tolist() == want.changed_rows.tolist() == [20]
        assert got.graph.neighbors(20).tolist() == want.graph.neighbors(20).tolist()


def test_a_replicas_predictions_follow_a_sequence_of_updates(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """Through the server: one update at a time (edges added and removed, a node stripped of every edge, new nodes
    linked to each other and to a hub, a feature update, a re-added edge), predictions asked only after some of
    them (lists skip versions), each compared with the offline model on ppr_topk's lists of the edited graph."""
    from clients import GnnClient, NewNode

    from .test_live import _Mirror, _reference
    from .test_stateless import replica_server

    ds, g = tiny_dataset, tiny_dataset.graph
    rng = np.random.default_rng(21)
    with replica_server(redis_factory, tiny_repo, ds, tmp_path) as (srv, cfg):
        mirror = _Mirror(ds)
        hub = int(np.argmax(g.degrees))
        strip = int(np.flatnonzero(g.degrees >= 2)[5])
        checked = np.r_[np.arange(0, ds.num_nodes, 23), hub, strip]
        with GnnClient(srv.address) as c:
            c.predict("shadow", checked, sampling_width=0, ppr_budget=16)  # lists and subgraphs cached
            a, b = 10, next(x for x in range(400, 800) if (10, x) not in mirror.edges)
            steps = [
                dict(add=[(a, b)]),
                dict(remove=[(strip, int(x)) for x in g.neighbors(strip)]),
                dict(new_nodes=[NewNode(features=rng.normal(size=ds.num_features).astype(np.float32),
                                        neighbors=[hub, 3])]),
                dict(features={7: rng.normal(size=ds.num_features).astype(np.float32)}),
                dict(remove=[(a, b)]),
                dict(add=[(a, b), (strip, hub)]),
            ]
            version = 0
            for i, step in enumerate(steps):
                names = {"add": "add_edges", "remove": "remove_edges"}
                up = c.update_graph("shadow", **{names.get(k, k): v for k, v in step.items()})
                mirror.update(**step)
                if step.get("new_nodes"):  # the new node gets an edge to the next new one
                    n0 = mirror.n
                    up = c.update_graph("shadow", new_nodes=[NewNode(features=np.ones(ds.num_features),
                                                                      neighbors=[n0 - 1, 5])])
                    mirror.update(new_nodes=[NewNode(features=np.ones(ds.num_features), neighbors=[n0 - 1, 5])])
                version = up.graph_version
                if i % 2 == 0:
                    continue  # versions skipped by the look-ups
                edited = mirror.graph()
                t = np.r_[checked, np.arange(ds.num_nodes, mirror.n)]
                got = c.predict("shadow", t, sampling_width=0, ppr_budget=16, min_graph_version=version)
                lists = ppr_topk(edited, t, cfg, k=16)[:2]
                want = _reference(tiny_repo, "shadow", edited, mirror.x, t, 0, lists=lists)
                np.testing.assert_allclose(got.probabilities, want, atol=2e-5, err_msg=f"after step {i}")


def test_a_replica_counts_self_loops_through_updates_as_the_graph_in_memory(redis_factory):
    """The store's self-loop count (written by the loader, kept by apply_rows) decides as apply_edit does in memory:
    a loop may be added while the graph has one; once every loop is removed one is refused, with the same words."""
    from kernels.graph_edit import GraphEdit, GraphEditError, apply_edit
    from serve.live import _remote_edit

    n, edges = _ring_and_random(False, 5, loops=True)
    g = Mirror(n, edges, False).graph()
    cfg = PPRConfig(topk=8, eps=1e-2)
    with _store_of(redis_factory, g, cfg, "loopcount") as store:
        assert store.self_loops == 3
        mem = g
        steps = [GraphEdit.make(add_src=[30], add_dst=[30]),                      # allowed: the graph has loops
                 GraphEdit.make(rem_src=[5, 77, 153, 30], rem_dst=[5, 77, 153, 30]),  # every loop removed
                 GraphEdit.make(add_src=[31], add_dst=[31])]                      # refused in both
        for edit in steps:
            try:
                want = apply_edit(mem, edit)
            except GraphEditError as exc:
                with pytest.raises(GraphEditError) as got:
                    _remote_edit(store, edit)
                assert str(got.value) == str(exc)
                continue
            eff = _remote_edit(store, edit)
            assert eff.changed_rows.tolist() == want.changed_rows.tolist()
            store.apply_rows({int(v): eff.graph.rows[int(v)] for v in eff.changed_rows}, eff.graph.num_nodes)
            mem = want.graph
            assert store.self_loops == eff.graph.self_loops == int(np.count_nonzero(mem.row_ids() == mem.indices))
        assert store.self_loops == 0
        # a graph loaded before the count existed: a request's loop is refused, a logged one (accepted when it was
        # written) is replayed
        store.self_loops = None
        with pytest.raises(GraphEditError, match="self-loop"):
            _remote_edit(store, GraphEdit.make(add_src=[8], add_dst=[8]))
        eff = _remote_edit(store, GraphEdit.make(add_src=[8], add_dst=[8]), replay=True)
        assert 8 in eff.graph.rows[8][0].tolist()


def test_a_group_of_updates_on_a_replica_sees_the_earlier_ones(redis_factory):
    """The second update of a group reads the first's rows and new nodes: it removes an edge the first added and
    links the first's new node; the group's effect holds every row it changed, equal to apply_edit's in memory."""
    from kernels.graph_edit import GraphEdit, apply_edit
    from serve.live import _Group, _remote_edit

    n, edges = _ring_and_random(False, 6, loops=False)
    g = Mirror(n, edges, False).graph()
    cfg = PPRConfig(topk=8, eps=1e-2)
    with _store_of(redis_factory, g, cfg, "group2") as store:
        e1 = GraphEdit.make(new_count=1, new_ptr=[0, 2], new_nbrs=[3, 160], add_src=[0], add_dst=[100])
        e2 = GraphEdit.make(rem_src=[100], rem_dst=[0], add_src=[n], add_dst=[4])
        group = _Group(store, n, chain_only=True)
        group.add(_group_parsed(e1), _remote_edit)
        group.add(_group_parsed(e2), _remote_edit)
        eff = group.effect(_remote_edit)
        want = apply_edit(apply_edit(g, e1).graph, e2).graph
        assert eff.graph.num_nodes == want.num_nodes == n + 1
        for v in sorted({0, 100, 3, 160, 4, n}):
            assert v in eff.changed_rows.tolist() or want.neighbors(v).tolist() == g.neighbors(v).tolist()
            assert eff.graph.neighbors(v).tolist() == want.neighbors(v).tolist(), v
