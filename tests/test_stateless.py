"""Stateless replicas (issue 9): graph topology and PPR top-K lists in a real Redis.

A replica started with only a Redis URL and a copy of the model repository *without* its
``_data`` and ``_ppr`` directories must answer exactly like the in-memory server (``served``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil

import grpc
import numpy as np
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg
from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, PPRIndex
from kernels.subgraph import ExtraEdges, induced_batch, lhop_nodes

from .serving import ServerThread, skip_without_cuda_kernel

pytest_plugins = ("tests.redis_server",)


def repo_ppr_configs(repo):
    out = []
    for p in sorted(repo.glob("*/1/config.json")):
        conf = json.loads(p.read_text())
        if conf.get("ppr"):
            out.append(PPRConfig.from_dict(conf["ppr"]))
    return out


def models_only(repo, dest):
    """A copy of the repository with the checkpoints only: no dataset, no PPR index files."""
    dest.mkdir()
    for name in ("shadow", "gcn"):
        shutil.copytree(repo / name, dest / name)
    return dest


@contextlib.contextmanager
def replica_server(redis_factory, repo, ds, tmp_path):
    """A started replica of ``repo``'s checkpoints, its graph (with the first PPR configuration's lists) and features
    loaded into a fresh Redis: ``(server, PPR config)``; stopped on exit."""
    from serve.features import load_features
    from serve.graph_store import load_graph

    url = redis_factory().url
    load_features(ds, url, progress=False)
    cfg = repo_ppr_configs(repo)[0]
    load_graph(ds, url, ppr=[cfg], ppr_cache_dir=str(repo / "_ppr"), progress=False)
    srv = ServerThread(models_only(repo, tmp_path / "r"), {"feature_url": url, "runtime_kw": {"graph_url": url}})
    srv.start()
    try:
        yield srv, cfg
    finally:
        srv.stop()


def assert_lists_are_pushes_on(index, graph, cfg):
    """Every node's list served by ``index`` is ``ppr_topk``'s on ``graph``."""
    from kernels.ppr import ppr_topk

    every = np.arange(graph.num_nodes)
    want_ptr, want_nodes, _ = ppr_topk(graph, every, cfg)
    got_ptr, got_nodes = index.lookup(every, cfg.topk)
    np.testing.assert_array_equal(got_ptr, want_ptr)
    np.testing.assert_array_equal(got_nodes, want_nodes)
    return got_ptr, got_nodes


@pytest.fixture(scope="module")
def loaded(redis_server, tiny_repo, tiny_dataset):
    """Features + graph (with the shaDow model's PPR lists) loaded into the session Redis."""
    from serve.features import load_features
    from serve.graph_store import load_graph

    url = redis_server.url
    load_features(tiny_dataset, url, progress=False)
    report = load_graph(tiny_dataset, url, ppr=repo_ppr_configs(tiny_repo), ppr_cache_dir=str(tiny_repo / "_ppr"),
                        progress=False)
    # a row and a list per node, and one degree chunk per 2,048 nodes (the load's chunk size)
    assert report.state == "live" and report.keys_written == 800 * (1 + len(report.ppr_configs)) + 1
    return url


@pytest.fixture(scope="module")
def stateless(loaded, tiny_repo, tmp_path_factory):
    repo = models_only(tiny_repo, tmp_path_factory.mktemp("stateless") / "repo")
    srv = ServerThread(repo, {"runtime_kw": {"graph_url": loaded}}).start()
    yield srv
    srv.stop()


def predict(address, model, nodes, **kw):
    with grpc.insecure_channel(address) as ch:
        return pbg.GnnServiceStub(ch).Predict(
            pb.PredictRequest(model=model, nodes=list(map(int, nodes)), return_probabilities=True, **kw), timeout=60)


@pytest.mark.parametrize(("model", "width", "budget"),
                         [("shadow", 0, 16), ("shadow", 4, 32), ("shadow", 2, 8), ("gcn", 0, 0), ("gcn", 4, 0)])
def test_stateless_replica_answers_like_single_process(stateless, served, model, width, budget):
    nodes = np.r_[np.arange(0, 800, 13), [799, 0, 0]]
    kw = {"sampling_width": width} | ({"ppr_budget": budget} if budget else {})
    want = predict(served.address, model, nodes, **kw)
    for _ in range(2):  # second round: rows and lists come from the replica's LRU
        got = predict(stateless.address, model, nodes, **kw)
        assert list(got.labels) == list(want.labels)
        # the same bits: every product row by row in one order (kernels.dense), whatever batch filled a cache
        np.testing.assert_array_equal(np.asarray(got.probabilities), np.asarray(want.probabilities))
        assert (got.settings.edges_kept, got.settings.edges_total) == (want.settings.edges_kept,
                                                                         want.settings.edges_total)
    if model == "gcn":  # a stateless plain model keeps first-layer rows per node too: the second round hit them
        acts = stateless.server.registry.get("gcn")._activations
        assert acts is not None and acts.misses > 0 and acts.hits > 0


@pytest.mark.gpu
def test_a_gpu_replica_answers_like_the_cpu_server(loaded, served, tiny_repo, tmp_path):
    """A stateless replica with ``device="cuda"`` (never run on a GPU before 2026-11-29: a replica's plain model on the
    device's torch path with degrees from Redis, its shaDow model on lists and rows from Redis, a Predict's new nodes)
    answers as the in-memory CPU server (to 1e-4: the device sums in other orders), with the same edge counts."""
    skip_without_cuda_kernel()
    rng = np.random.default_rng(3)
    new = [pb.NewNode(features=rng.normal(size=16).tolist(), neighbors=[1, 2, 40]),
           pb.NewNode(features=rng.normal(size=16).tolist(), neighbors=[7], edge_weights=[0.5])]
    srv = ServerThread(models_only(tiny_repo, tmp_path / "repo"),
                       {"runtime_kw": {"graph_url": loaded, "device": "cuda"}}).start()
    try:
        assert srv.server.registry.get("gcn").device.type == "cuda"
        for model, width, budget in (("gcn", 0, 0), ("gcn", 4, 0), ("shadow", 0, 16), ("shadow", 4, 32)):
            kw = {"sampling_width": width} | ({"ppr_budget": budget} if budget else {})
            for nodes, extra in ((np.r_[np.arange(0, 800, 13), [799, 0]], {}), ([5, 700], {"new_nodes": new})):
                want = predict(served.address, model, nodes, **kw, **extra)
                got = predict(srv.address, model, nodes, **kw, **extra)
                np.testing.assert_allclose(np.asarray(got.probabilities), np.asarray(want.probabilities),
                                           rtol=1e-4, atol=1e-4, err_msg=f"{model} S={width} {extra.keys()}")
                assert (got.settings.edges_kept, got.settings.edges_total) == (want.settings.edges_kept,
                                                                                 want.settings.edges_total)
    finally:
        srv.stop()


def test_warm_gcn_replica_follows_updates_like_a_cold_one(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """A stateless GCN replica whose first-layer rows are cached answers after an edge update and a
    feature update exactly as a replica started after them: the rows they changed (the endpoints,
    the changed node's neighbours, whose GCN degree or inputs moved) are computed again."""
    from clients import GnnClient
    from serve.features import load_features
    from serve.graph_store import load_graph

    g = tiny_dataset.graph
    url = redis_factory().url
    load_features(tiny_dataset, url, progress=False)
    load_graph(tiny_dataset, url, progress=False)
    nodes = np.arange(0, 800, 5)
    v = int(nodes[3])
    u = next(int(x) for x in range(1, 800, 2) if x not in set(g.neighbors(v).tolist()) and x != v)
    w = int(g.neighbors(int(nodes[10]))[0])  # a neighbour of a target: its features change
    rng = np.random.default_rng(4)
    row = rng.normal(size=g_features(tiny_dataset)).astype(np.float32) * 3
    opts = {"feature_url": url, "runtime_kw": {"graph_url": url}}
    warm = ServerThread(models_only(tiny_repo, tmp_path / "a"), opts).start()
    cold = None
    try:
        with GnnClient(warm.address) as c:
            before = [c.predict("gcn", nodes, sampling_width=s) for s in (0, 4)]
            acts = warm.server.registry.get("gcn")._activations
            assert acts is not None and acts.misses > 0
            c.update_graph("gcn", add_edges=[[v, u]])
            up = c.update_graph("gcn", features={w: row})
            after = [c.predict("gcn", nodes, sampling_width=s, min_graph_version=up.graph_version) for s in (0, 4)]
        cold = ServerThread(models_only(tiny_repo, tmp_path / "b"), opts).start()
        with GnnClient(cold.address) as c:
            fresh = [c.predict("gcn", nodes, sampling_width=s, min_graph_version=up.graph_version) for s in (0, 4)]
        for a, f in zip(after, fresh, strict=True):
            assert a.graph_version == f.graph_version == up.graph_version
            np.testing.assert_array_equal(a.labels, f.labels)
            # to the bit: a projection computed alone (the changed row) or inside the cold replica's larger batches
            # has the same bits (kernels.dense); a stale row would differ by far more
            np.testing.assert_array_equal(a.probabilities, f.probabilities)
        # both updates moved answers (so the comparison above could fail)
        assert not np.allclose(before[0].probabilities[3], after[0].probabilities[3], rtol=0, atol=1e-7)
        assert not np.allclose(before[0].probabilities[10], after[0].probabilities[10], rtol=0, atol=1e-7)
    finally:
        warm.stop()
        if cold is not None:
            cold.stop()


def g_features(ds) -> int:
    return int(ds.num_features)


def test_warm_replica_follows_an_update_like_a_cold_one(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """A replica whose per-target subgraph cache is warm answers after an update exactly as a replica
    started after it (cold caches): the cached subgraphs the update changed are induced again."""
    from clients import GnnClient
    from serve.features import load_features
    from serve.graph_store import load_graph

    g = tiny_dataset.graph
    url = redis_factory().url
    load_features(tiny_dataset, url, progress=False)
    load_graph(tiny_dataset, url, ppr=repo_ppr_configs(tiny_repo), ppr_cache_dir=str(tiny_repo / "_ppr"),
               progress=False)
    lists = PPRIndex.open_or_build(tiny_repo / "_ppr", g, repo_ppr_configs(tiny_repo)[0])
    # a target and a member of its top-16 list that is not its neighbour: the edge between them changes
    # the target's own row inside its subgraph, so its exact answer moves
    v, u = next((v, int(u)) for v in range(0, 800, 7) for u in lists.lookup([v], 16)[1][1:]
                if u not in set(g.neighbors(v).tolist()))
    nodes = np.arange(0, 800, 7)
    at = int(np.flatnonzero(nodes == v)[0])
    opts = {"feature_url": url, "runtime_kw": {"graph_url": url}}
    warm = ServerThread(models_only(tiny_repo, tmp_path / "a"), opts).start()
    cold = None
    try:
        with GnnClient(warm.address) as c:
            before = [c.predict("shadow", nodes, sampling_width=w, ppr_budget=16) for w in (0, 2)]
            up = c.update_graph("shadow", add_edges=[[v, u]])
            after = [c.predict("shadow", nodes, sampling_width=w, ppr_budget=16, min_graph_version=up.graph_version)
                     for w in (0, 2)]
        cold = ServerThread(models_only(tiny_repo, tmp_path / "b"), opts).start()
        with GnnClient(cold.address) as c:
            fresh = [c.predict("shadow", nodes, sampling_width=w, ppr_budget=16, min_graph_version=up.graph_version)
                     for w in (0, 2)]
        for a, f in zip(after, fresh, strict=True):
            assert a.graph_version == f.graph_version == up.graph_version
            np.testing.assert_array_equal(a.labels, f.labels)
            np.testing.assert_array_equal(a.probabilities, f.probabilities)
        assert not np.allclose(before[0].probabilities[at], after[0].probabilities[at], rtol=0, atol=1e-7)
    finally:
        warm.stop()
        if cold is not None:
            cold.stop()


@pytest.mark.parametrize(("model", "width", "budget"), [("shadow", 0, 16), ("shadow", 4, 32), ("gcn", 0, 0),
                                                     ("gcn", 2, 0)])
def test_a_replica_answers_predict_new_nodes_like_single_process(stateless, served, model, width, budget):
    """A Predict's own new nodes on a replica (refused before: the push and the scopes read the graph in memory):
    the push from a new node and the L-hop scopes of its neighbours read their rows from Redis, round by round,
    and the answers are the in-memory server's: weighted and unweighted edges, a node without neighbours, a
    neighbour of high degree, existing targets in the same request."""
    rng = np.random.default_rng(11)
    hub = int(np.argmax(np.diff(np.asarray(served.server.registry.get(model).graph.indptr))))
    new = [pb.NewNode(features=rng.normal(size=16).tolist(), neighbors=[1, 2, 40]),
           pb.NewNode(features=rng.normal(size=16).tolist(), neighbors=[hub, 7], edge_weights=[0.5, 2.0]),
           pb.NewNode(features=rng.normal(size=16).tolist(), neighbors=[]),
           pb.NewNode(features=rng.normal(size=16).tolist(), neighbors=[799, 3])]
    kw = {"sampling_width": width, "new_nodes": new} | ({"ppr_budget": budget} if budget else {})
    for nodes in ([], [5, 700, 5]):
        want = predict(served.address, model, nodes, **kw)
        for _ in range(2):  # second round: rows from the replica's LRU
            got = predict(stateless.address, model, nodes, **kw)
            assert list(got.labels) == list(want.labels)
            np.testing.assert_array_equal(np.asarray(got.probabilities), np.asarray(want.probabilities))
            assert (got.settings.edges_kept, got.settings.edges_total) == (want.settings.edges_kept,
                                                                             want.settings.edges_total)


def test_a_replica_pushes_a_new_nodes_list_like_the_graph_in_memory(loaded, tiny_dataset, tiny_repo):
    """serve.graph.store.pushed_new_node against kernels.ppr.ppr_new_node, and the store's induced batch with new
    nodes' edges against kernels.subgraph.induced_batch on the graph in memory: equal to the bit."""
    from kernels.ppr import ppr_new_node
    from kernels.subgraph import ExtraEdges
    from serve.graph.store import pushed_new_node, pushed_new_nodes
    from serve.graph_store import RedisGraphStore

    g = tiny_dataset.graph
    n = g.num_nodes
    store = RedisGraphStore(loaded, g.fingerprint(), cache_bytes=0)
    try:
        cfg = repo_ppr_configs(tiny_repo)[0]
        rng = np.random.default_rng(3)
        specs = [(rng.choice(n, size=d, replace=True), None if d % 2 else rng.uniform(0.1, 3.0, d))
                 for d in (1, 2, 5, 9, 0)]
        lists = []
        for nb, w in specs:
            want_nodes, want_scores = ppr_new_node(g, nb, w, cfg)
            got_nodes, got_scores = pushed_new_node(store, nb, w, cfg)
            np.testing.assert_array_equal(got_nodes, want_nodes)
            np.testing.assert_array_equal(got_scores, want_scores)
            lists.append(want_nodes)
        # all of them in lockstep: the same lists, one fetch round per wave for the whole batch, not per node
        one, each = (RedisGraphStore(loaded, g.fingerprint(), cache_bytes=0) for _ in range(2))
        try:
            together = pushed_new_nodes(one, specs, cfg)
            for nb, w in specs:
                pushed_new_node(each, nb, w, cfg)
            trips, singles = one.round_trips, each.round_trips
        finally:
            one.close()
            each.close()
        for (got_nodes, got_scores), (nb, w) in zip(together, specs, strict=True):
            want_nodes, want_scores = ppr_new_node(g, nb, w, cfg)
            np.testing.assert_array_equal(got_nodes, want_nodes)
            np.testing.assert_array_equal(got_scores, want_scores)
        assert 0 < trips < singles, (trips, singles)
        # every new node's list under its own virtual id, beside two existing targets' lists
        src, dst, ws = [], [], []
        for j, (nb, w) in enumerate(specs):
            src += [np.full(len(nb), n + j), nb]
            dst += [nb, np.full(len(nb), n + j)]
            ws += [w if w is not None else np.ones(len(nb))] * 2
        extra = ExtraEdges.from_edges(n, np.concatenate(src), np.concatenate(dst), np.concatenate(ws),
                                      num_virtual=len(specs))
        parts = [np.array([5, 6, 9]), np.array([700])] + [np.where(x == n, n + j, x) for j, x in enumerate(lists)]
        ptr = np.r_[0, np.cumsum([len(x) for x in parts])]
        nodes = np.concatenate(parts)
        a, b = induced_batch(g, ptr, nodes, extra=extra), store.induced_batch(ptr, nodes, extra=extra)
        for f in ("node_ids", "ptr", "unique_ids", "row_to_unique"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        for f in ("indptr", "indices", "weights"):
            np.testing.assert_array_equal(getattr(a.graph, f), getattr(b.graph, f))
        stored = nodes < n
        np.testing.assert_array_equal(b.gcn_degrees[stored], g.degrees[nodes[stored]] + 1.0)
        assert (b.gcn_degrees[~stored] == 1.0).all()
        with pytest.raises(ValueError, match="node ids must lie in"):
            store.induced_batch(ptr, nodes)  # virtual ids without their edges
    finally:
        store.close()


def test_a_replica_places_new_nodes_and_pushes_their_lists(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """An update's new nodes on a replica that serves a shaDow model (refused before: the node had no PPR list, so
    every shaDow model answered UNAVAILABLE for it and a restarted replica refused the model). Its list, and every
    other the update may have moved, is pushed on the edited graph: the answers are the offline model's there, on
    this replica and on one started after the update (it replays the log)."""
    from clients import GnnClient, NewNode
    from kernels.ppr import ppr_topk
    from serve.features import load_features
    from serve.graph_store import load_graph

    from .test_live import _Mirror, _reference

    ds = tiny_dataset
    url = redis_factory().url
    load_features(ds, url, progress=False)
    cfg = repo_ppr_configs(tiny_repo)[0]
    load_graph(ds, url, ppr=[cfg], ppr_cache_dir=str(tiny_repo / "_ppr"), progress=False)
    opts = {"feature_url": url, "runtime_kw": {"graph_url": url}}
    srv = ServerThread(models_only(tiny_repo, tmp_path / "a"), opts).start()
    later = None
    try:
        mirror = _Mirror(ds)
        rng = np.random.default_rng(5)
        feats = rng.normal(size=(2, ds.num_features)).astype(np.float32)
        nn = [NewNode(features=feats[0], neighbors=[1, 2, 40]), NewNode(features=feats[1], neighbors=[7, ds.num_nodes])]
        with GnnClient(srv.address) as c:
            up = c.update_graph("shadow", new_nodes=nn)
        assert up.graph_version == 1 and list(up.new_node_ids) == [ds.num_nodes, ds.num_nodes + 1]
        mirror.update(new_nodes=nn)
        edited = mirror.graph()
        targets = np.r_[ds.num_nodes, ds.num_nodes + 1, 1, 2, 7, 40, np.arange(0, ds.num_nodes, 40)]
        lists = ppr_topk(edited, targets, cfg, k=16)[:2]
        want = _reference(tiny_repo, "shadow", edited, mirror.x, targets, 0, lists=lists)
        later = ServerThread(models_only(tiny_repo, tmp_path / "b"), opts).start()
        for s in (srv, later):
            with GnnClient(s.address) as c:
                got = c.predict("shadow", targets, sampling_width=0, ppr_budget=16, min_graph_version=1)
            np.testing.assert_allclose(got.probabilities, want, atol=2e-5)
    finally:
        srv.stop()
        if later is not None:
            later.stop()


def test_induced_and_lhop_batches_equal_in_memory(loaded, tiny_dataset, tiny_repo):
    from serve.graph_store import RedisGraphStore

    g = tiny_dataset.graph
    store = RedisGraphStore(loaded, g.fingerprint(), cache_bytes=0)
    try:
        cfg = repo_ppr_configs(tiny_repo)[0]
        local = PPRIndex.open_or_build(tiny_repo / "_ppr", g, cfg)
        remote = store.ppr_index(cfg)
        t = np.array([5, 9, 5, 700, 123])
        for k in (1, 7, cfg.topk):
            p1, n1 = local.lookup(t, k)
            p2, n2 = remote.lookup(t, k)
            np.testing.assert_array_equal(p1, p2)
            np.testing.assert_array_equal(n1, n2)
            a, b = induced_batch(g, p1, n1), store.induced_batch(p2, n2)
            for f in ("node_ids", "ptr", "unique_ids", "row_to_unique"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
            np.testing.assert_array_equal(a.graph.indptr, b.graph.indptr)
            np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
            np.testing.assert_array_equal(b.gcn_degrees, g.degrees[n1] + 1.0)
        arena = RedisGraphStore(loaded, g.fingerprint())  # its L-hop lists from the row arena's arrays
        assert arena._arena is not None and store._arena is None
        for hops in (0, 1, 2):
            lp, ln = lhop_nodes(g, t, hops)
            for s in (store, arena, arena):  # the second time every row is in the arena
                batch, rp, rn = s.lhop_batch(t, hops)
                np.testing.assert_array_equal(lp, rp)
                np.testing.assert_array_equal(ln, rn)
                want = induced_batch(g, lp, ln)
                np.testing.assert_array_equal(want.graph.indptr, batch.graph.indptr)
                np.testing.assert_array_equal(want.graph.indices, batch.graph.indices)
                np.testing.assert_array_equal(batch.gcn_degrees, g.degrees[ln] + 1.0)
        assert arena.stats()["arena_rows"] > 0
        arena.close()
        assert store.round_trips >= 2
    finally:
        store.close()


def test_a_batch_induced_on_the_rows_its_lists_fetched(loaded, tiny_dataset):
    """A plain model's new nodes on a replica: the batch is induced on the local graph the neighbours' balls were
    fetched into (RedisGraphStore.lhop_local, then induced_batch(held=...)) with no fetch and no second local graph,
    and equals the batch built from the rows fetched again, and the in-memory one; a held graph that does not cover
    the batch's nodes is passed over."""
    from serve.graph_store import RedisGraphStore

    g = tiny_dataset.graph
    n = g.num_nodes
    store = RedisGraphStore(loaded, g.fingerprint(), cache_bytes=0)  # no LRU: every row read is a round trip
    try:
        nbs = [np.array([5, 700, 9]), np.array([123])]
        for hops in (0, 1):
            ptr, scope, local = store.lhop_local(np.concatenate(nbs), hops)
            lists = [np.array([n]), np.array([n + 1])]
            ends = np.cumsum([len(x) for x in nbs])
            for j, (nb, end) in enumerate(zip(nbs, ends.tolist(), strict=True)):
                lists[j] = np.concatenate([lists[j], np.unique(scope[ptr[end - len(nb)]:ptr[end]])])
            lp = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
            nodes = np.concatenate(lists).astype(np.int64)
            src = np.concatenate([np.full(len(nb), n + j) for j, nb in enumerate(nbs)])
            dst = np.concatenate(nbs)
            extra = ExtraEdges.from_edges(n, np.concatenate([src, dst]), np.concatenate([dst, src]), None,
                                          num_virtual=len(nbs))
            trips = store.round_trips
            got = store.induced_batch(lp, nodes, extra=extra, held=[local])
            assert store.round_trips == trips  # no row fetched again
            again = store.induced_batch(lp, nodes, extra=extra)
            assert store.round_trips == trips + 1
            small = store.lhop_local(np.array([5]), 0)[2]  # covers node 5 alone: passed over
            other = store.induced_batch(lp, nodes, extra=extra, held=[small])
            want = induced_batch(g, lp, nodes, extra=extra)
            for b in (got, again, other):
                for f in ("node_ids", "ptr", "unique_ids", "row_to_unique", "target_rows"):
                    np.testing.assert_array_equal(getattr(b, f), getattr(want, f))
                np.testing.assert_array_equal(b.graph.indptr, want.graph.indptr)
                np.testing.assert_array_equal(b.graph.indices, want.graph.indices)
                np.testing.assert_array_equal(b.gcn_degrees, got.gcn_degrees)
            stored = nodes < n
            np.testing.assert_array_equal(got.gcn_degrees[stored], g.degrees[nodes[stored]] + 1.0)
            assert np.all(got.gcn_degrees[~stored] == 1.0)
            assert small.covers(np.array([5])) and not small.covers(np.array([5, 9]))
    finally:
        store.close()


def test_a_new_nodes_last_hop_is_read_as_degrees(loaded, tiny_dataset):
    """``lhop_local(..., last_rows=False)`` (a plain model's new nodes, whose last hop gets no edges): the same lists
    and GCN degrees without the last hop's rows (one fetch round fewer without the arena, fewer rows gathered with
    it); the batch induced on it with the new nodes' ``inner`` equals the in-memory one without a fetch, and a batch
    whose every row gets edges passes it over (its rows fetched). An overlay row's degree is the overlay's."""
    from serve.graph_store import RedisGraphStore

    g = tiny_dataset.graph
    n = g.num_nodes
    full_deg = g.degrees.astype(np.float64) + 1.0
    nbs = [np.array([5, 700, 9]), np.array([123])]
    flat = np.concatenate(nbs)
    src = np.concatenate([np.full(len(nb), n + j) for j, nb in enumerate(nbs)])
    extra = ExtraEdges.from_edges(n, np.concatenate([src, flat]), np.concatenate([flat, src]), None, num_virtual=2)
    arena = RedisGraphStore(loaded, g.fingerprint())
    plain = RedisGraphStore(loaded, g.fingerprint(), cache_bytes=0)  # neither an arena nor an LRU
    try:
        assert arena._arena is not None and plain._arena is None
        for store in (arena, plain):
            store.gcn_degrees(np.arange(n))  # the degree chunks read once, before the round trips are counted
            for hops in (0, 1, 2):
                want_ptr, want_scope, whole = store.lhop_local(flat, hops)
                trips = store.round_trips
                ptr, scope, local = store.lhop_local(flat, hops, last_rows=False)
                if store is plain:  # the LRU is off: every round reads Redis, the last one not
                    assert store.round_trips == trips + hops, hops
                np.testing.assert_array_equal(ptr, want_ptr)
                np.testing.assert_array_equal(scope, want_scope)
                np.testing.assert_array_equal(local.ids, whole.ids)
                np.testing.assert_array_equal(local.gcn_degrees, full_deg[local.ids])
                last = np.setdiff1d(local.ids, local.rows)
                assert len(last) and whole.rows is None
                inside = np.unique(lhop_nodes(g, flat, hops - 1)[1]) if hops else np.zeros(0, np.int64)
                np.testing.assert_array_equal(last, np.setdiff1d(local.ids, inside))  # the nodes first met at the last hop
                if hops != 1:
                    continue
                # a plain 2-layer model's new nodes: each list is the new node, its neighbours, then their balls
                lists = [np.concatenate([[n + j], nb, np.setdiff1d(np.unique(scope[ptr[e - len(nb)]:ptr[e]]), nb)])
                         for j, (nb, e) in enumerate(zip(nbs, np.cumsum([len(x) for x in nbs]).tolist(), strict=True))]
                lp = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
                nodes = np.concatenate(lists).astype(np.int64)
                inner = np.array([1 + len(nb) for nb in nbs], dtype=np.int64)
                trips = store.round_trips
                got = store.induced_batch(lp, nodes, extra=extra, held=[local], inner=inner)
                assert store.round_trips == trips  # nothing fetched
                want = induced_batch(g, lp, nodes, extra=extra, inner=inner)
                np.testing.assert_array_equal(got.graph.indptr, want.graph.indptr)
                np.testing.assert_array_equal(got.graph.indices, want.graph.indices)
                stored = nodes < n
                np.testing.assert_array_equal(got.gcn_degrees[stored], full_deg[nodes[stored]])
                every = store.induced_batch(lp, nodes, extra=extra, held=[local])  # every row's edges: fetched
                assert store.round_trips > trips or store is arena  # its LRU may hold them
                want = induced_batch(g, lp, nodes, extra=extra)
                np.testing.assert_array_equal(every.graph.indptr, want.graph.indptr)
                np.testing.assert_array_equal(every.graph.indices, want.graph.indices)
        # an update's overlay row at the last hop: its degree is the overlay row's
        ptr, scope, local = arena.lhop_local(flat, 1, last_rows=False)
        v = int(np.setdiff1d(local.ids, local.rows)[0])
        arena.apply_rows({v: (np.array([5], dtype=np.int64), None)}, n)
        local = arena.lhop_local(flat, 1, last_rows=False)[2]
        assert v in local.ids and local.gcn_degrees[np.searchsorted(local.ids, v)] == 2.0
    finally:
        arena.close()
        plain.close()


def test_push_stored_follows_the_overlay(loaded, tiny_dataset):
    """RedisGraphStore.push_stored (a replica's pushes read its row arena in place): every node's push degree and
    the overlay's row ids, as push_degrees and the overlay give them, through structural changes (read again for
    the changed rows only) and a node added live; the same arrays while nothing changes."""
    from serve.graph_store import RedisGraphStore

    g = tiny_dataset.graph
    n = g.num_nodes
    store = RedisGraphStore(loaded, g.fingerprint())
    try:
        arena, deg, own = store.push_stored()
        assert arena is store._arena and len(own) == 0
        np.testing.assert_array_equal(deg, g.degrees.astype(np.float64))
        assert store.push_stored()[1] is deg  # held while nothing changes
        rng = np.random.default_rng(4)
        for step in range(3):
            v = int(rng.integers(n))
            rows = {v: (np.sort(rng.choice(n, 3 + step, replace=False)).astype(np.int64), None)}
            grow = n + 1 if step == 2 else store.num_nodes
            if step == 2:  # a node added live, with a row
                rows[n] = (np.array([v], dtype=np.int64), None)
            store.apply_rows(rows, grow)
            _, deg, own = store.push_stored()
            np.testing.assert_array_equal(deg, store.push_degrees(np.arange(store.num_nodes)))
            np.testing.assert_array_equal(own, np.array(sorted(store._ov_rows), dtype=np.int64))
        store._stored_push = None  # computed whole: the same
        _, whole, own2 = store.push_stored()
        np.testing.assert_array_equal(whole, deg)
        np.testing.assert_array_equal(own2, own)
    finally:
        store.close()


def _stored_rows(g: CSRGraph, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    lens = (g.indptr[ids + 1] - g.indptr[ids]).astype(np.int64)
    return lens, np.concatenate([g.indices[g.indptr[v]:g.indptr[v + 1]] for v in ids]), None


def test_a_replicas_rows_csr_through_the_arena(loaded, tiny_dataset):
    """RedisGraphStore.rows_csr gives the graph's rows whether the arena holds them or not (a store whose budget
    leaves no arena reads the LRU), rows an update replaced come from the overlay, and a live-added node's row
    is its overlay row."""
    from kernels.row_arena import RowArena
    from serve.graph_store import RedisGraphStore

    g = tiny_dataset.graph
    with_arena = RedisGraphStore(loaded, g.fingerprint())
    without = RedisGraphStore(loaded, g.fingerprint(), cache_bytes=4 * RowArena.INDEX_BYTES * g.num_nodes - 4)
    try:
        assert with_arena._arena is not None and without._arena is None
        rng = np.random.default_rng(0)
        for _ in range(3):
            ids = rng.choice(g.num_nodes, 120, replace=False)
            for store in (with_arena, without):
                ptr, cols, ws = store.rows_csr(ids)
                lens, want, _ = _stored_rows(g, ids)
                np.testing.assert_array_equal(np.diff(ptr), lens)
                np.testing.assert_array_equal(cols, want.astype(np.int64))
                assert ws is None
        assert with_arena.stats()["arena_rows"] >= 120
        trips = with_arena.round_trips
        with_arena.rows_csr(ids[::-1].copy())  # all held: no Redis round trip
        assert with_arena.round_trips == trips
        # an overlay row (an update's) and a live-added node: theirs, not the stored rows
        v = int(ids[0])
        n = g.num_nodes
        new_row = (np.array([1, 2, n], dtype=np.int64), None)
        with_arena.apply_rows({v: new_row, n: (np.array([v], dtype=np.int64), None)}, n + 1)
        for probe in (np.array([v, int(ids[1])]), np.array([int(ids[1]), n])):
            ptr, cols, _ = with_arena.rows_csr(probe)
            want = [new_row[0] if x == v else (np.array([v]) if x == n else g.indices[g.indptr[x]:g.indptr[x + 1]])
                    for x in probe.tolist()]
            np.testing.assert_array_equal(cols, np.concatenate(want).astype(np.int64))
    finally:
        with_arena.close()
        without.close()


def test_weighted_graph_rows_and_corruption_checks(redis_factory):
    from serve.graph_store import GraphCorrupt, GraphNotFound, RedisGraphStore, load_graph, verify_graph

    rng = np.random.default_rng(0)
    ei = rng.integers(0, 300, size=(2, 2000))
    g = CSRGraph.from_edge_index(ei, 300, rng.random(2000).astype(np.float32) + 0.1, symmetrize=True)

    class DS:  # the loader needs .graph, .fingerprint(), .name
        graph, name = g, "weighted"

        def fingerprint(self):
            return "ds-" + g.fingerprint()[:8]

    srv = redis_factory()
    cfg = PPRConfig(topk=12)
    rep = load_graph(DS(), srv.url, ppr=[cfg], scores="float32", chunk_size=64, progress=False)
    assert rep.state == "live"
    assert verify_graph(DS(), srv.url)[0]
    store = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=1 << 20)
    t = np.array([3, 17, 250])
    p, n = store.ppr_index(cfg).lookup(t, 12)
    a, b = induced_batch(g, p, n), store.induced_batch(p, n)
    np.testing.assert_array_equal(a.graph.weights, b.graph.weights)
    np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
    wdeg = np.bincount(g.row_ids(), weights=g.weights, minlength=300) + 1.0
    np.testing.assert_allclose(b.gcn_degrees, wdeg[n])
    # pushes on the weighted rows read from Redis: the lists and scores of the graph in memory, to the bit (each
    # weighted degree summed over its row in order on both sides)
    from kernels.ppr import ppr_new_node, ppr_topk
    from serve.graph.store import pushed_lists, pushed_new_node

    fresh = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=0)  # the tampering below reads Redis itself
    want_p, want_n, want_s = ppr_topk(g, t, cfg)
    got = pushed_lists(fresh, t, cfg)
    for i, v in enumerate(t.tolist()):
        np.testing.assert_array_equal(got[v][0], want_n[want_p[i]:want_p[i + 1]])
        np.testing.assert_array_equal(got[v][1], want_s[want_p[i]:want_p[i + 1]])
    for nb, w in (([3, 250], [0.5, 4.0]), ([17], None)):
        want_nodes, want_scores = ppr_new_node(g, nb, w, cfg)
        got_nodes, got_scores = pushed_new_node(fresh, np.array(nb), None if w is None else np.array(w), cfg)
        np.testing.assert_array_equal(got_nodes, want_nodes)
        np.testing.assert_array_equal(got_scores, want_scores)
    fresh.close()
    # tampering: a blob copied under another node's key, a truncated blob, a deleted key
    c = srv.client()
    k = store.keys.adj.node_keys([40, 41])
    c.set(k[1], c.get(k[0]))
    with pytest.raises(GraphCorrupt, match="belongs to node 40"):
        store.induced_batch(np.array([0, 1]), np.array([41]))
    c.set(k[1], c.get(k[0])[:-3])
    with pytest.raises(GraphCorrupt):
        store.induced_batch(np.array([0, 1]), np.array([41]))
    c.delete(k[1])
    with pytest.raises(GraphNotFound, match="missing"):
        store.induced_batch(np.array([0, 1]), np.array([41]))
    ok, msg = verify_graph(DS(), srv.url)
    assert not ok and "nodes 41" in msg.replace("[", "").replace("]", "")
    with pytest.raises(GraphNotFound, match="no PPR lists"):
        store.ppr_index(PPRConfig(topk=13))
    store.close()
    c.close()


def test_graph_cli_load_and_verify(redis_factory, tiny_repo, tiny_dataset, capsys):
    from serve.cli import main

    srv = redis_factory()
    data = str(tiny_repo / "_data" / tiny_dataset.fingerprint())
    assert main(["graph", "load", "--dataset", data, "--redis", srv.url, "--repo", str(tiny_repo),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "live" in out and "800 nodes" in out
    assert main(["graph", "verify", "--dataset", data, "--redis", srv.url, "--ppr-cache",
                 str(tiny_repo / "_ppr")]) == 0
    c = srv.client()
    meta = {k.decode(): v.decode() for k, v in c.hgetall(f"gnnserve:graph:{tiny_dataset.graph.fingerprint()}:v1:meta").items()}
    assert meta["state"] == "live" and len(json.loads(meta["ppr"])) == 1
    c.close()


def test_a_replica_pushes_the_lists_structural_updates_may_have_changed(redis_factory, tiny_repo, tiny_dataset,
                                                                         tmp_path):
    """A stateless replica kept answering shaDow requests from the PPR lists loaded into Redis after updates had
    changed the graph (QA: a node stripped of its edges still had a 16-node list and answered as before). Every
    list a structural update may have changed is now pushed again on the current graph before it is used: after
    the updates every list equals a push on the edited graph, and the answers are the offline model's on those
    lists' subgraphs (also for targets whose subgraph was cached before the updates)."""
    from clients import GnnClient
    from kernels.ppr import ppr_topk

    from .test_live import _Mirror, _reference

    ds, g = tiny_dataset, tiny_dataset.graph
    with replica_server(redis_factory, tiny_repo, ds, tmp_path) as (srv, cfg):
        mirror = _Mirror(ds)
        t = int(np.flatnonzero(g.degrees >= 3)[0])
        nodes = np.arange(0, ds.num_nodes, 9)
        with GnnClient(srv.address) as c:
            before = c.predict("shadow", np.r_[t, nodes], sampling_width=0, ppr_budget=16)  # caches warm
            rem = [(t, int(b)) for b in g.neighbors(t)]
            c.update_graph("shadow", remove_edges=rem)
            mirror.update(remove=rem)
            u, v = next((int(a), int(b)) for a, b in itertools.pairwise(nodes[1:])
                        if int(b) not in set(g.neighbors(int(a)).tolist()) and t not in (a, b))
            up = c.update_graph("shadow", add_edges=[(u, v)])
            mirror.update(add=[(u, v)])
            edited = mirror.graph()
            checked = np.r_[t, u, v, nodes]
            got = c.predict("shadow", checked, sampling_width=0, ppr_budget=16, min_graph_version=up.graph_version)
        assert got.graph_version == up.graph_version == 2
        lists = ppr_topk(edited, checked, cfg, k=16)[:2]
        want = _reference(tiny_repo, "shadow", edited, mirror.x, checked, 0, lists=lists)
        np.testing.assert_allclose(got.probabilities, want, atol=2e-5)
        assert not np.allclose(before.probabilities[0], got.probabilities[0], atol=1e-4)  # t's answer moved
        got_ptr, got_nodes = assert_lists_are_pushes_on(srv.server.registry.get("shadow").ppr_index, edited, cfg)
        assert got_nodes[got_ptr[t]:got_ptr[t + 1]].tolist() == [t]


def test_a_replica_checks_a_predicts_new_nodes(stateless):
    """A replica validates a Predict's new nodes as the in-memory server does: a neighbour that is no node of the
    graph, or a feature vector of the wrong length, is INVALID_ARGUMENT naming the field."""
    n = stateless.server.registry.get("shadow").graph.num_nodes
    bad = {"new_nodes[0]": pb.NewNode(features=[0.1] * 16, neighbors=[1, n]),
           "features": pb.NewNode(features=[0.1] * 3, neighbors=[1])}
    for what, node in bad.items():
        for model in ("shadow", "gcn"):
            with grpc.insecure_channel(stateless.address) as ch, pytest.raises(grpc.RpcError) as ei:
                pbg.GnnServiceStub(ch).Predict(pb.PredictRequest(model=model, new_nodes=[node]), timeout=60)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, model)
            assert what in ei.value.details(), ei.value.details()


def test_a_replica_with_redis_down_answers_new_nodes_unavailable(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """Redis gone when a replica places a Predict's new node (the rows its push or scope reads are not cached):
    UNAVAILABLE naming Redis and saying to retry, for a shaDow and a plain model; never a crash, a hang or an
    answer from partial rows."""
    from serve.features import load_features
    from serve.graph_store import load_graph

    srv = redis_factory()
    load_features(tiny_dataset, srv.url, progress=False)
    load_graph(tiny_dataset, srv.url, ppr=repo_ppr_configs(tiny_repo), ppr_cache_dir=str(tiny_repo / "_ppr"),
               progress=False)
    server = ServerThread(models_only(tiny_repo, tmp_path / "repo"),
                          {"feature_url": srv.url, "runtime_kw": {"graph_url": srv.url}}).start()
    try:
        node = pb.NewNode(features=[0.1] * 16, neighbors=[300, 301, 302])
        assert len(predict(server.address, "shadow", [], new_nodes=[node]).labels) == 1
        srv.stop()
        fresh = pb.NewNode(features=[0.2] * 16, neighbors=[600, 601])  # rows not in the replica's caches
        for model in ("shadow", "gcn"):
            with grpc.insecure_channel(server.address) as ch, pytest.raises(grpc.RpcError) as ei:
                pbg.GnnServiceStub(ch).Predict(pb.PredictRequest(model=model, new_nodes=[fresh]), timeout=60)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, (model, ei.value.details())
            assert "Redis" in ei.value.details() and "retry" in ei.value.details(), ei.value.details()
    finally:
        server.stop()


def _two_components(n_half: int, m: int, seed: int, weighted: bool = False) -> CSRGraph:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n_half, size=(2, m))
    b = rng.integers(n_half, 2 * n_half, size=(2, m))
    w = rng.uniform(0.2, 3.0, 2 * m).astype(np.float32) if weighted else None
    return CSRGraph.from_edge_index(np.concatenate([a, b], axis=1), 2 * n_half, w, symmetrize=True,
                                    remove_self_loops=True)


@pytest.mark.parametrize("weighted", [False, True])
def test_a_replica_keeps_the_lists_a_structural_update_cannot_reach(redis_factory, weighted):
    """After a structural update a replica pushed every list again before using it. A list it pushed itself now
    carries the nodes its push read; while no row among them changed, the list is exact as held and is not pushed
    again. On a graph of two components, edits in one leave the other's lists kept; through a random sequence of
    edits anywhere every lookup equals a fresh push on the edited graph in memory, to the bit (weighted too)."""
    from kernels.ppr import ppr_topk
    from serve.graph_store import RedisGraphStore, load_graph

    half = 150
    g = _two_components(half, 700, seed=5, weighted=weighted)

    class DS:  # the loader needs .graph, .fingerprint(), .name
        graph, name = g, "two-components"

        def fingerprint(self):
            return "ds-" + g.fingerprint()[:8]

    srv = redis_factory()
    cfg = PPRConfig(topk=16, eps=1e-4)
    load_graph(DS(), srv.url, ppr=[cfg], chunk_size=64, progress=False)
    store = RedisGraphStore(srv.url, g.fingerprint(), cache_bytes=1 << 24)
    try:
        idx = store.ppr_index(cfg)
        edges = {}  # (u, v) with u < v -> weight
        for u in range(g.num_nodes):
            a, b = int(g.indptr[u]), int(g.indptr[u + 1])
            for v, w in zip(g.indices[a:b].tolist(), (g.weights[a:b] if weighted else np.ones(b - a)).tolist(),
                            strict=True):
                if u < v:
                    edges[(u, v)] = w
        rng = np.random.default_rng(1)
        every = np.arange(g.num_nodes)

        def edit(add=(), remove=()) -> CSRGraph:
            touched = set()
            for u, v in remove:
                edges.pop((min(u, v), max(u, v)), None)
                touched |= {u, v}
            for u, v in add:
                edges[(min(u, v), max(u, v))] = float(rng.uniform(0.2, 3.0)) if weighted else 1.0
                touched |= {u, v}
            keys = sorted(edges)
            w = np.array([edges[k] for k in keys], dtype=np.float32) if weighted else None
            cur = CSRGraph.from_edge_index(np.array(keys).T, g.num_nodes, w, symmetrize=True)
            rows = {}
            for x in touched:
                a, b = int(cur.indptr[x]), int(cur.indptr[x + 1])
                rows[x] = (cur.indices[a:b].astype(np.int64), cur.weights[a:b] if weighted else None)
            store.apply_rows(rows, g.num_nodes)
            return cur

        def check(cur: CSRGraph) -> None:
            got_ptr, got_nodes = idx.lookup(every)
            ptr, nodes, _ = ppr_topk(cur, every, cfg)
            np.testing.assert_array_equal(got_ptr, ptr)
            np.testing.assert_array_equal(got_nodes, nodes)

        cur = edit(add=[(3, 77)])  # the snapshot's lists carry no reach: every one is pushed once
        check(cur)
        assert store.lists_kept == 0
        cur = edit(add=[(5, 90)], remove=[next(e for e in sorted(edges) if e[0] < half and e != (3, 77))])
        check(cur)
        assert store.lists_kept >= half  # the other component's lists, whose pushes never read component A
        kept = store.lists_kept
        cur = edit(add=[(half + 4, half + 60)])
        check(cur)
        assert store.lists_kept - kept >= half
        for _ in range(12):  # edits anywhere, additions and removals, each followed by every lookup
            if rng.random() < 0.5:
                u, v = (int(x) for x in rng.choice(g.num_nodes, 2, replace=False))
                cur = edit(add=[(u, v)])
            else:
                u, v = sorted(edges)[int(rng.integers(len(edges)))]
                cur = edit(remove=[(u, v)])
            check(cur)
        assert store.stats()["lists_kept_by_reach"] == store.lists_kept > kept
    finally:
        store.close()


def test_a_replicas_caches_in_the_metrics(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """A replica's row cache and the reach of the PPR lists it pushed are scraped like the per-node caches
    (``cache="graph_rows"``, ``cache="ppr_reach"``): after two structural updates far apart, the lists pushed after
    the first are found with their reach after the second."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from clients import GnnClient
    from serve.features import load_features
    from serve.graph_store import load_graph

    ds = tiny_dataset
    url = redis_factory().url
    load_features(ds, url, progress=False)
    load_graph(ds, url, ppr=repo_ppr_configs(tiny_repo), ppr_cache_dir=str(tiny_repo / "_ppr"), progress=False)
    srv = ServerThread(models_only(tiny_repo, tmp_path / "r"),
                       {"feature_url": url, "metrics_port": 0, "runtime_kw": {"graph_url": url}})
    srv.start()
    try:
        targets = np.arange(0, ds.num_nodes, 37)
        with GnnClient(srv.address) as c:
            c.update_graph("shadow", add_edges=[(1, 2)])
            c.predict("shadow", targets, sampling_width=0, ppr_budget=16)  # every list pushed, with its reach
            up = c.update_graph("shadow", add_edges=[(3, 4)])
            c.predict("shadow", targets, sampling_width=0, ppr_budget=16, min_graph_version=up.graph_version)
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.server.metrics_port}/metrics", timeout=10).read().decode()
    finally:
        srv.stop()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}

    def sample(name, **labels):
        return samples[(name, tuple(sorted({"model": "shadow", "version": "1", **labels}.items())))]

    assert sample("gnnserve_cache_lookups_total", cache="graph_rows", result="hit") > 0
    assert sample("gnnserve_cache_rows", cache="graph_rows") > 0
    assert sample("gnnserve_cache_lookups_total", cache="ppr_reach", result="hit") >= len(targets)
    assert sample("gnnserve_cache_rows", cache="ppr_reach") >= len(targets)
