"""The live graph (serve.live): updates through UpdateGraph, answers as fresh as the last write.

Real servers on loopback over a copy of the tiny repository (a plain GCN, a plain GraphSAGE and a
shaDow-SAGE model on one graph), updated through the public SDK; references computed without server
code from the graph and features the test edits itself (``_Mirror``): the full-graph forward of a
plain model is its definition, and a shaDow model's answer is its forward on the induced subgraph of
its (live) PPR list over the edited graph.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import clients
from clients import GnnClient, NewNode

from .serving import ServerProcess, ServerThread, deferred_while_held, make_repo, skip_without_cuda_kernel

MODELS = ("gcn", "sage", "shadow")


@pytest.fixture(scope="module")
def base_repo(tmp_path_factory, tiny_repo, tiny_dataset):
    """The tiny repository's models plus a plain GraphSAGE, trained once for this module."""
    root = tmp_path_factory.mktemp("live-base")
    for name in ("gcn", "shadow", "_data"):
        shutil.copytree(tiny_repo / name, root / name, symlinks=True)
    make_repo(root, tiny_dataset, {"sage": "sage"})
    return root


def fresh_repo(base: Path, dest: Path) -> Path:
    """A repository of its own (its own update log under REPO/_live) over the same checkpoints."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*MODELS, "_data"):
        (dest / name).symlink_to(base / name)
    ppr = base / "_ppr"
    if ppr.exists():
        shutil.copytree(ppr, dest / "_ppr")
    return dest


class _Mirror:
    """The test's own copy of the graph and features, edited by the same updates as the server."""

    def __init__(self, ds):
        g = ds.graph
        src = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
        self.edges = set(zip(src.tolist(), g.indices.astype(np.int64).tolist(), strict=True))
        self.x = np.array(ds.x, dtype=np.float32)

    @property
    def n(self) -> int:
        return len(self.x)

    def update(self, features=None, new_nodes=(), add=(), remove=()):
        for v, row in (features or {}).items():
            self.x[v] = row
        for nn in new_nodes:
            v = self.n
            self.x = np.vstack([self.x, np.asarray(nn.features, np.float32)[None]])
            for u in nn.neighbors:
                self.edges |= {(v, int(u)), (int(u), v)}
        for u, v in remove:
            self.edges -= {(u, v), (v, u)}
        for u, v in add:
            self.edges |= {(u, v), (v, u)}

    def graph(self):
        from kernels.graph import CSRGraph

        ei = np.array(sorted(self.edges), dtype=np.int64).T.reshape(2, -1)
        return CSRGraph.from_edge_index(ei, num_nodes=self.n)


def _reference(repo: Path, model: str, graph, x, nodes, width, lists=None) -> np.ndarray:
    """Softmax of the offline model on (graph, x): plain models on the whole graph; PPR models on the
    induced subgraphs of ``lists`` (ptr, nodes)."""
    from kernels.subgraph import induced_batch
    from models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(repo / model / "1")
    m = ckpt.model.eval()
    with torch.no_grad():
        if lists is None:
            logits = m(graph, torch.from_numpy(x), width or None, ckpt.strategy)[torch.as_tensor(nodes)]
        else:
            batch = induced_batch(graph, *lists)
            logits, _ = m.forward_batch(batch, torch.from_numpy(x[batch.node_ids]), width or None, ckpt.strategy)
    return torch.softmax(logits, 1).numpy()


def _non_neighbours(ds, rng):
    g = ds.graph
    while True:
        u, v = (int(a) for a in rng.integers(0, g.num_nodes, 2))
        if u != v and v not in set(g.neighbors(u).tolist()) and g.degrees[u] >= 2 and g.degrees[v] >= 1:
            return u, v


@pytest.fixture
def server(base_repo, tmp_path):
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "repo")).start()
    yield srv
    srv.stop()


def test_a_server_taking_updates_saves_and_reads_the_lists_inverse(server, tiny_dataset, monkeypatch):
    """At load the shaDow model's PPR index gets its lists' inverse saved beside it (REPO/_ppr); the first
    update reads that memory-mapped copy instead of building one."""
    import kernels.ppr_live as pl

    live = server.server.registry.get("shadow").ppr_index
    base = live.base
    assert base.inverse is not None and (base.path / "inverse_ptr.npy").exists()
    assert not base.inverse[1].flags.writeable  # memory-mapped from the file
    built = []
    monkeypatch.setattr(pl, "inverse_lists", lambda *a: built.append(a) or pytest.fail("built an inverse"))
    u, v = _non_neighbours(tiny_dataset, np.random.default_rng(4))
    with GnnClient(server.address) as c:
        assert c.update_graph("shadow", add_edges=[(u, v)]).graph_version == 1
    assert built == [] and live.last_recomputed.size > 0


def test_a_clone_answers_like_its_original_and_undo_restores(server, tiny_dataset):
    """v := a clone of u (features and edges) through UpdateGraph: GCN answers v as u at the exact width;
    the reverse update brings v's original answer back."""
    ds = tiny_dataset
    u, v = _non_neighbours(ds, np.random.default_rng(1))
    nu, nv = ds.graph.neighbors(u).tolist(), ds.graph.neighbors(v).tolist()
    with GnnClient(server.address) as c:
        before = c.predict("gcn", [v], sampling_width=0)
        assert before.graph_version == 0
        up = c.update_graph("gcn", features={v: ds.x[u]}, remove_edges=[(v, w) for w in nv],
                            add_edges=[(v, w) for w in nu])
        assert up.graph_version == 1 and up.invalidated.get("activation", 0) + up.invalidated.get("projection", 0)
        both = c.predict("gcn", [u, v], sampling_width=0, min_graph_version=1)
        assert both.graph_version == 1
        assert both.labels[0] == both.labels[1]
        np.testing.assert_allclose(both.probabilities[1], both.probabilities[0], atol=1e-5)
        undo = c.update_graph("gcn", features={v: ds.x[v]}, remove_edges=[(v, w) for w in nu],
                              add_edges=[(v, w) for w in nv], expect_graph_version=1)
        assert undo.graph_version == 2
        after = c.predict("gcn", [v], sampling_width=0)
        assert after.graph_version == 2 and after.labels[0] == before.labels[0]
        np.testing.assert_allclose(after.probabilities, before.probabilities, atol=1e-5)


def _random_updates(ds, mirror: _Mirror, rng, count: int):
    """Random updates (features, new nodes, edge additions and removals), applied to ``mirror`` too."""
    out = []
    for _ in range(count):
        n = mirror.n
        kind = rng.integers(0, 4)
        upd: dict = {}
        if kind == 0:
            ids = rng.choice(n, 3, replace=False)
            upd["features"] = {int(v): rng.normal(size=ds.num_features).astype(np.float32) for v in ids}
        elif kind == 1:
            upd["new_nodes"] = [NewNode(features=rng.normal(size=ds.num_features).astype(np.float32),
                                        neighbors=sorted(set(rng.choice(n, 4).tolist())))]
        elif kind == 2:
            add = set()
            while len(add) < 4:
                a, b = (int(x) for x in rng.integers(0, n, 2))
                if a != b and (a, b) not in mirror.edges and (b, a) not in add:
                    add.add((a, b))
            upd["add_edges"] = sorted(add)
        else:
            edges = sorted(e for e in mirror.edges if e[0] < e[1])
            pick = rng.choice(len(edges), 4, replace=False)
            upd["remove_edges"] = [edges[i] for i in pick]
        mirror.update(upd.get("features"), upd.get("new_nodes", ()), upd.get("add_edges", ()),
                      upd.get("remove_edges", ()))
        out.append(upd)
    return out


def test_random_updates_answer_like_the_updated_graph(server, base_repo, tiny_dataset):
    """After a random sequence of updates, every model's answers for a sample of nodes (old and new) equal
    the offline model's on the graph and features the test edited itself, at exact and sampled widths,
    through every cache (warm rows before the updates must not survive them)."""
    _random_updates_answer_like_the_updated_graph(server, base_repo, tiny_dataset, np.random.default_rng(7))


def test_random_updates_on_the_resident_path(base_repo, tiny_dataset, tmp_path):
    """The same on the plain-resident path (kernels.resident): its device CSR is uploaded again and its
    first-layer tables (exact and S = 3, filled for every node before the updates) recompute exactly the
    rows each update changed."""
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "repo"), {"runtime_kw": {"resident": True}}).start()
    try:
        plain = [srv.server.registry.get(m) for m in ("gcn", "sage")]
        assert all(rt.paths[0].name == "plain-resident" for rt in plain)
        for rt in plain:  # S = 3 is no knob-table width: a batch asks for it, a background build makes it
            assert not rt._resident.holds(3) and not rt._resident.request(3)
            assert rt._resident.wait_for_builds(60) and rt._resident.holds(3)
        before = [rt._resident.batches for rt in plain]
        _random_updates_answer_like_the_updated_graph(srv, base_repo, tiny_dataset, np.random.default_rng(7))
        assert all(rt._resident.batches >= b + 4 for rt, b in zip(plain, before, strict=True))
        assert all(set(rt._resident.widths()) >= {0, 3} for rt in plain)
        # shaDow: its lists and induced table stay resident; targets an update marked dirty took the other paths
        shadow = srv.server.registry.get("shadow")
        assert shadow.paths[0].name == "shadow-resident" and shadow._resident_shadow.batches >= 2
    finally:
        srv.stop()


def test_random_updates_with_every_edit_in_recycled_arrays(base_repo, tiny_dataset, tmp_path, monkeypatch):
    """The same with every array an edit writes recycled (``kernels.graph_edit.RecycledBuffers``; the server's own
    pool takes arrays from 64 MiB): old versions of the graph that batches, caches and the writer let go are
    written again, and no answer may show it."""
    import kernels.graph_edit as ge

    pool = ge.RecycledBuffers(min_bytes=1)
    monkeypatch.setattr(ge, "BUFFERS", pool)
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "repo")).start()
    try:
        _random_updates_answer_like_the_updated_graph(srv, base_repo, tiny_dataset, np.random.default_rng(7))
    finally:
        srv.stop()
    assert pool.reused >= 10  # the server lets old versions go: their arrays came round again


#: GPU servers: on their defaults (resident: a plain model's tables and a shaDow model's lists, induced table and
#: projections on the device, the fused kernels; batches the device declines and new nodes on the CPU copy) and
#: with every batch on the device's torch path
GPU_CONFIGS = {"defaults": {"device": "cuda"},
               "device-torch": {"device": "cuda", "resident": False, "gpu_min_targets": 0}}


@pytest.mark.gpu
@pytest.mark.parametrize("config", list(GPU_CONFIGS))
def test_random_updates_on_a_gpu_server(base_repo, tiny_dataset, tmp_path, config):
    """test_random_updates_answer_like_the_updated_graph on a GPU server: after the updates (the device's tables
    rebased, its CSR uploaded again, the CPU copy's caches dropped) every model answers as the offline CPU model on
    the edited graph (to 1e-4: the device sums in other orders)."""
    skip_without_cuda_kernel()
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "repo"), {"runtime_kw": GPU_CONFIGS[config]}).start()
    try:
        assert all(srv.server.registry.get(m).device.type == "cuda" for m in MODELS)
        _random_updates_answer_like_the_updated_graph(srv, base_repo, tiny_dataset, np.random.default_rng(7),
                                                      atol=1e-4)
    finally:
        srv.stop()


@pytest.mark.gpu
@pytest.mark.parametrize("config", list(GPU_CONFIGS))
def test_a_gpu_servers_new_nodes_answer_like_the_cpu_server(base_repo, tiny_dataset, tmp_path, config, monkeypatch):
    """A Predict's own new nodes (beside existing targets, at the exact and a sampled width) on a GPU server: the
    CPU server's answers and edge counts. On the defaults they take the compiled paths on the CPU copy (a new node
    counts as a target in ``fused_max_targets``), with the device's torch path only the device."""
    skip_without_cuda_kernel()
    import serve.paths as paths_mod

    rng = np.random.default_rng(5)
    n, f = tiny_dataset.num_nodes, tiny_dataset.num_features
    new = [NewNode(rng.normal(size=f).astype(np.float32), sorted(set(rng.choice(n, 4).tolist()))),
           NewNode(rng.normal(size=f).astype(np.float32), [3, 17], [0.5, 2.0]),
           NewNode(rng.normal(size=f).astype(np.float32), [int(rng.integers(n))])]
    forwards: list[str] = []  # the compiled CPU forwards called
    for name in ("plan_forward_cpu", "shadow_forward_cpu"):
        real = getattr(paths_mod, name)
        monkeypatch.setattr(paths_mod, name, lambda *a, real=real, name=name, **k: forwards.append(name) or real(*a, **k))
    gpu = ServerThread(fresh_repo(base_repo, tmp_path / "gpu"), {"runtime_kw": GPU_CONFIGS[config]}).start()
    cpu = ServerThread(fresh_repo(base_repo, tmp_path / "cpu")).start()
    try:
        with GnnClient(gpu.address) as cg, GnnClient(cpu.address) as cc:
            for model in MODELS:
                for width in (0, 3):
                    before = len(forwards)
                    got = cg.predict(model, [0, 9], sampling_width=width, new_nodes=new, return_embeddings=True)
                    on_cpu_copy = len(forwards) > before
                    want = cc.predict(model, [0, 9], sampling_width=width, new_nodes=new, return_embeddings=True)
                    np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-4, atol=1e-5,
                                               err_msg=f"{model} S={width}")
                    np.testing.assert_allclose(got.embeddings, want.embeddings, rtol=1e-3, atol=1e-4)
                    top2 = np.sort(want.probabilities, axis=1)[:, -2:]
                    clear = top2[:, 1] - top2[:, 0] > 1e-4  # a near-tie may break either way
                    assert np.array_equal(got.labels[clear], want.labels[clear]), (model, width)
                    assert (got.settings.edges_kept, got.settings.edges_total) == (
                        want.settings.edges_kept, want.settings.edges_total), (model, width)
                    assert on_cpu_copy == (config == "defaults"), (model, width, forwards[before:])
    finally:
        gpu.stop()
        cpu.stop()


def test_stale_ppr_lists_answer_fresh_and_are_stored_in_the_background(base_repo, tiny_dataset, tmp_path):
    """With ``--ppr-eager-lists 0`` an update pushes no existing PPR list itself: each list it flags is stale,
    a Predict pushes it on the current graph, and the writer thread stores it once no update waits. Answers
    equal the offline model's on the edited graph before the lists are stored, and do not move after."""
    from kernels.ppr import ppr_topk

    srv = ServerThread(fresh_repo(base_repo, tmp_path / "repo"), {"runtime_kw": {"ppr_eager_lists": 0}}).start()
    try:
        rt = srv.server.registry.get("shadow")
        live = rt.data.live
        live._refresh_off = "held by the test"  # no background refresh until the answers are checked
        rng = np.random.default_rng(11)
        mirror = _Mirror(tiny_dataset)
        deferred = 0
        with GnnClient(srv.address) as c:
            for upd in _random_updates(tiny_dataset, mirror, rng, 12):
                deferred += c.update_graph("shadow", **upd).invalidated.get("ppr_deferred", 0)
            assert deferred > 0 and live.stale_lists() > 0
            idx = rt.ppr_index
            budget = rt.limits.default_ppr_budget
            stale = np.flatnonzero(idx.is_stale(np.arange(idx.num_nodes)))
            nodes = np.unique(np.concatenate([stale[:30], rng.choice(mirror.n, 20, replace=False)]))
            # the reference lists: a push now on the edited graph for the stale ones, the stored ones else
            now = nodes[idx.is_stale(nodes)]
            fp, fn, _ = ppr_topk(mirror.graph(), now, idx.config, k=budget)
            rows = {int(v): fn[fp[b]:fp[b + 1]] for b, v in enumerate(now)}
            sptr, snodes = idx._stored(nodes, budget, False)
            rows = [rows.get(int(v), snodes[sptr[i]:sptr[i + 1]]) for i, v in enumerate(nodes)]
            lists = (np.concatenate([[0], np.cumsum([len(r) for r in rows])]), np.concatenate(rows))
            got = idx.lookup(nodes, budget)
            np.testing.assert_array_equal(got[0], lists[0])
            np.testing.assert_array_equal(got[1], lists[1])
            graph = mirror.graph()
            first = {}
            for width in (0, 3):
                got = c.predict("shadow", nodes, sampling_width=width, ppr_budget=budget)
                want = _reference(base_repo, "shadow", graph, mirror.x, nodes, width, lists=lists)
                np.testing.assert_allclose(got.probabilities, want, atol=2e-5, err_msg=f"shadow S={width}")
                first[width] = got.probabilities
            # the writer thread stores them: the same answers
            n_stale = live.stale_lists()
            live._refresh_off = None
            live._ring_refresh()
            deadline = time.monotonic() + 60
            while live.stale_lists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert live.stale_lists() == 0
            assert live.metrics.ppr_stale_lists.labels(live.label)._value.get() == 0
            counted = {o: live.metrics.ppr_refreshed_lists.labels(live.label, o)._value.get()
                       for o in ("stored", "voided")}
            assert counted == {"stored": n_stale, "voided": 0}  # no update came in between
            assert not idx.is_stale(nodes).any() and idx.is_dirty(stale).all()
            for width in (0, 3):
                got = c.predict("shadow", nodes, sampling_width=width, ppr_budget=budget)
                np.testing.assert_array_equal(got.probabilities, first[width])
    finally:
        srv.stop()


def _random_updates_answer_like_the_updated_graph(server, base_repo, ds, rng, atol=2e-5):
    mirror = _Mirror(ds)
    sample = rng.choice(ds.num_nodes, 40, replace=False)
    with GnnClient(server.address) as c:
        for model in MODELS:  # fill the caches (projections, activations at S = 0 and 3) before updating
            for width in (0, 3):
                c.predict(model, sample, sampling_width=width)
        for upd in _random_updates(ds, mirror, rng, 16):
            res = c.update_graph("gcn", **upd)
            if "new_nodes" in upd:
                assert res.new_node_ids.tolist() == [mirror.n - 1]
        assert res.num_nodes == mirror.n and res.num_edges == len(mirror.edges)
        graph = mirror.graph()
        nodes = np.concatenate([sample, np.arange(ds.num_nodes, mirror.n)])
        from kernels.plan import exact_path_edges

        exact_edges = int(exact_path_edges(graph, np.unique(nodes), 2).sum())
        for model in ("gcn", "sage"):
            for width in (0, 3):
                got = c.predict(model, np.unique(nodes), sampling_width=width)
                assert got.graph_version == 16
                want = _reference(base_repo, model, graph, mirror.x, np.unique(nodes), width)
                np.testing.assert_allclose(got.probabilities, want, atol=atol, err_msg=f"{model} S={width}")
                assert got.settings.edges_total == exact_edges  # the exact-edge counts followed the graph
                assert (got.settings.edges_kept == exact_edges) == (width == 0)
        rt = server.server.registry.get("shadow")
        budget = rt.limits.default_ppr_budget
        # the reference lists under the graph's read lock, as a batch reads them: the refresh thread stores stale
        # lists meanwhile, and a lookup beside its store may read a list's stored entries as stale (the old list)
        # and its stale flag as cleared
        rt.data.live.begin_read()
        try:
            lists = rt.ppr_index.lookup(nodes, budget)
        finally:
            rt.data.live.end_read()
        for width in (0, 3):
            got = c.predict("shadow", nodes, sampling_width=width, ppr_budget=budget)
            want = _reference(base_repo, "shadow", graph, mirror.x, nodes, width, lists=lists)
            np.testing.assert_allclose(got.probabilities, want, atol=atol, err_msg=f"shadow S={width}")


def test_predictions_never_mix_versions_under_concurrent_updates(server, tiny_dataset):
    """Updates toggle node t between two states (features and an edge together) while other threads
    predict t: each answer is the one of the state its graph_version names, and none fails."""
    ds = tiny_dataset
    t, w = _non_neighbours(ds, np.random.default_rng(3))
    xa = np.zeros(ds.num_features, np.float32)
    xb = np.asarray(ds.x[t], np.float32) * 3 + 1
    states = [dict(features={t: xa}, add_edges=[(t, w)]), dict(features={t: xb}, remove_edges=[(t, w)])]
    with GnnClient(server.address) as c:
        ref = {}
        for i, st in enumerate(states):  # version 1: state A, version 2: state B
            c.update_graph("gcn", **st)
            ref[i] = {m: c.predict(m, [t, w], sampling_width=0).probabilities for m in ("gcn", "sage")}
        errors: list[BaseException] = []
        seen: set[int] = set()
        stop = threading.Event()

        def reader(model: str) -> None:
            with GnnClient(server.address) as rc:
                while not stop.is_set():
                    try:
                        r = rc.predict(model, [t, w], sampling_width=0)
                        want = ref[(r.graph_version - 1) % 2][model]
                        np.testing.assert_allclose(r.probabilities, want, atol=1e-5)
                        seen.add(r.graph_version)
                    except BaseException as exc:
                        errors.append(exc)
                        return

        threads = [threading.Thread(target=reader, args=(m,)) for m in ("gcn", "sage", "gcn")]
        for th in threads:
            th.start()
        for k in range(30):
            c.update_graph("gcn", **states[k % 2])
        time.sleep(0.05)
        stop.set()
        for th in threads:
            th.join(30)
    assert not errors, errors[0]
    assert len(seen) > 2, seen  # the readers saw several versions


def test_read_your_writes_and_refusals(server, tiny_dataset):
    ds = tiny_dataset
    with GnnClient(server.address) as c:
        # a version the log does not hold: refused at once (no client can know of it), naming the log's end
        with pytest.raises(clients.FailedPreconditionError, match=r"version 5 has not been written.*ends at version 0"):
            c.predict("gcn", [0], min_graph_version=5, timeout=10)
        g = ds.graph
        missing = next(v for v in range(1, g.num_nodes) if v not in set(g.neighbors(0).tolist()))
        bad = [
            (dict(remove_edges=[(0, missing)]), "remove_edges[0]"),
            (dict(add_edges=[(0, int(g.neighbors(0)[0]))]), "add_edges[0]"),
            (dict(add_edges=[(0, 0)]), "self"),
            (dict(add_edges=[(0, g.num_nodes + 5)]), "add_edges[0]"),
            (dict(features={g.num_nodes: np.zeros(ds.num_features)}), "features[0]"),
            (dict(features={1: np.zeros(ds.num_features + 1)}), "features[0]"),
            (dict(features={1: np.full(ds.num_features, np.nan)}), "finite"),
            (dict(new_nodes=[NewNode(features=np.zeros(ds.num_features), neighbors=[1, 1])]), "new_nodes"),
            (dict(add_edges=[(0, missing, -1.0)]), "weight"),
            (dict(request_id="r" * 257), "request_id has 257 characters, more than the limit of 256"),
        ]
        for upd, words in bad:
            # a valid feature row rides along: nothing of a refused update may land
            with pytest.raises(clients.InvalidArgumentError, match=re.escape(words)):
                c.update_graph("gcn", features={2: np.ones(ds.num_features)}, **upd) if "features" not in upd \
                    else c.update_graph("gcn", **upd)
        assert c.get_model("gcn").graph_version == 0
        with pytest.raises(clients.InvalidArgumentError, match="request_id has 300 characters"):
            c.predict("gcn", [0], request_id="r" * 300)
        assert c.predict("gcn", [0], request_id="r" * 256).request_id == "r" * 256
        with pytest.raises(clients.AbortedError, match="version 0"):
            c.update_graph("gcn", add_edges=[(0, missing)], expect_graph_version=3)
        with pytest.raises(clients.InvalidArgumentError, match="max-update-size"):
            c.update_graph("gcn", add_edges=[(0, v) for v in range(1, 100_002)])
        with pytest.raises(clients.NotFoundError):
            c.update_graph("nope", add_edges=[(0, missing)])
        assert c.predict("gcn", [0]).graph_version == 0


def test_an_update_that_fails_half_way_answers_failed_precondition(server, tiny_dataset, monkeypatch):
    """A fault while an update is applied (here a model's rebase raises) takes the graph out of service
    loudly: the update's caller gets FAILED_PRECONDITION at once (it used to wait forever, then got UNAVAILABLE,
    which clients retry, for a state that lasts until a restart), so do later updates and predictions, each
    saying to restart (the update log replays it), and health turns NOT_SERVING (it stayed SERVING)."""
    rt = server.server.registry.get("gcn")

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(rt, "prepare_rebase", broken)
    u, v = _non_neighbours(tiny_dataset, np.random.default_rng(3))
    with GnnClient(server.address, timeout=30) as c:
        assert c.health() == "SERVING"
        with pytest.raises(clients.FailedPreconditionError, match=r"failed half-way.*restart"):
            c.update_graph("gcn", add_edges=[(u, v)])
        with pytest.raises(clients.FailedPreconditionError, match="restart"):
            c.update_graph("gcn", add_edges=[(v, u)])
        with pytest.raises(clients.FailedPreconditionError, match="restart"):
            c.predict("gcn", [u])
        _wait_for_health(c, "NOT_SERVING")


def _wait_for_health(client, want: str, services=("",), timeout: float = 60) -> None:
    """Poll the health of each of ``services`` until it is ``want`` (a health update is scheduled on the
    server's loop from the thread that changed the state)."""
    t_end = time.monotonic() + timeout
    for svc in services:
        while (got := client.health(svc, timeout=10)) != want:
            assert time.monotonic() < t_end, f"health of {svc!r} is {got}, not {want}"
            time.sleep(0.02)


def test_derived_bounds_after_updates_equal_those_derived_from_scratch(server, tiny_dataset):
    """An update patches the per-node request prices (walk sums, walk bounds, neighbour-scope bounds) at
    the nodes whose sums changed and carries the graph's largest degree over: after new nodes, added edges
    and the removal of every edge of the largest row, each equals what the runtime derives from the new
    graph from nothing, bit for bit, and the limits' widest width follows the largest degree down."""
    from kernels.plan import walk_sums

    ds = tiny_dataset
    rt = server.server.registry.get("gcn")
    g = ds.graph
    hub = int(np.argmax(g.degrees))
    rng = np.random.default_rng(7)
    with GnnClient(server.address) as c:
        c.update_graph("gcn", new_nodes=[NewNode(features=ds.x[1], neighbors=[hub, 2]),
                                         NewNode(features=ds.x[3], neighbors=[4])])
        c.update_graph("gcn", add_edges=[_non_neighbours(ds, rng) for _ in range(3)])
        up = c.update_graph("gcn", remove_edges=[(hub, int(w)) for w in rt.graph.neighbors(hub)])
        assert up.graph_version == 3
    cur = rt.graph
    assert cur.degrees[hub] == 0
    assert cur.max_degree == int(np.diff(cur.indptr).max()) < g.max_degree
    fresh = rt._graph_derived(cur, walk_sums(cur, rt._walk_sums.shape[0] - 1))
    np.testing.assert_array_equal(rt._walk_sums, fresh["_walk_sums"])
    for name in ("_walk_bound", "_nbr_scope_bound"):
        assert getattr(rt, name).dtype == fresh[name].dtype and len(getattr(rt, name)) == cur.num_nodes
        np.testing.assert_array_equal(getattr(rt, name), fresh[name])
    assert rt.limits == fresh["limits"]


def test_the_serving_path_is_chosen_under_the_read_lock(server, monkeypatch):
    """A path's accepts() may allocate per-graph state (the activation cache's table of a width asked for
    the first time, sized by the graph's node count): the batch chooses its path inside its read section,
    so no update can grow the graph between that allocation and the batch."""
    rt = server.server.registry.get("gcn")
    lock = rt.data.live.lock
    seen: list[int] = []
    real = rt._path_for

    def spy(*args):
        seen.append(lock._readers)
        return real(*args)

    monkeypatch.setattr(rt, "_path_for", spy)
    with GnnClient(server.address) as c:
        c.predict("gcn", [1, 2, 3], sampling_width=5)  # a width no table holds: the estimate asks no path
    assert seen and all(r >= 1 for r in seen), seen


def test_read_only_server_refuses_updates(base_repo, tmp_path):
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "ro"), {"runtime_kw": {"read_only": True}}).start()
    try:
        with GnnClient(srv.address) as c:
            with pytest.raises(clients.FailedPreconditionError, match="read-only"):
                c.update_graph("gcn", features={1: np.zeros(16)})
            info = c.get_model("gcn")
            assert info.read_only and info.graph_version == 0
    finally:
        srv.stop()


def test_a_second_server_follows_the_first_ones_updates(base_repo, tmp_path, tiny_dataset):
    """A second server on a repository whose file update log another server writes (it once answered
    from the graph as loaded, without the acknowledged updates, with a warning) replays and follows that
    log: it answers every update the first one takes (min_graph_version: read-your-writes across the two)
    and refuses updates itself, saying where they go. So does a --read-only server."""
    repo = fresh_repo(base_repo, tmp_path / "two")
    ds = tiny_dataset
    row = np.linspace(-1, 1, ds.num_features)
    with ServerProcess(repo, "--poll-s", "0") as a, GnnClient(a.address) as ca:
        assert ca.update_graph("gcn", features={1: row}).graph_version == 1
        with pytest.raises(clients.AbortedError, match="has not reached that version"):
            ca.update_graph("gcn", features={1: row}, expect_graph_version=7)
        with ServerProcess(repo, "--poll-s", "0") as b, ServerProcess(repo, "--poll-s", "0", "--read-only") as r, \
                GnnClient(b.address) as cb, GnnClient(r.address) as cr:
            for c in (cb, cr):
                assert c.predict("gcn", [1, 2], sampling_width=0).graph_version == 1
            up = ca.update_graph("gcn", features={2: -row}, add_edges=[(1, ds.num_nodes - 1)])
            want = ca.predict("gcn", [1, 2], sampling_width=0)
            for c in (cb, cr):
                got = c.predict("gcn", [1, 2], sampling_width=0, min_graph_version=up.graph_version, timeout=30)
                assert got.graph_version == up.graph_version
                np.testing.assert_allclose(got.probabilities, want.probabilities, atol=1e-6)
            with pytest.raises(clients.FailedPreconditionError, match="send updates there"):
                cb.update_graph("gcn", features={3: row})
            with pytest.raises(clients.FailedPreconditionError, match="--read-only"):
                cr.update_graph("gcn", features={3: row})
            assert cb.get_model("gcn").read_only and not ca.get_model("gcn").read_only


def test_a_follower_takes_the_log_over_when_its_writer_stops(base_repo, tmp_path, tiny_dataset):
    """A rolling restart: server B starts while A writes the repository's file log, so B follows it. Once A
    has stopped, B's next update takes the log over (it applied every record of A first), and a server
    started after answers as B does. While A runs, B still refuses updates."""
    repo = fresh_repo(base_repo, tmp_path / "roll")
    ds = tiny_dataset
    row = np.linspace(-1, 1, ds.num_features)
    with ServerProcess(repo, "--poll-s", "0") as a, GnnClient(a.address) as ca:
        assert ca.update_graph("gcn", features={1: row}).graph_version == 1
        with ServerProcess(repo, "--poll-s", "0") as b, GnnClient(b.address) as cb:
            with pytest.raises(clients.FailedPreconditionError, match="send updates there"):
                cb.update_graph("gcn", features={3: row})  # the writer runs: no take-over
            assert ca.update_graph("gcn", features={2: -row}).graph_version == 2
            assert a.terminate() == 0
            up = cb.update_graph("gcn", add_edges=[(1, ds.num_nodes - 1)])  # takes the log over
            assert up.graph_version == 3 and not cb.get_model("gcn").read_only
            assert cb.update_graph("gcn", features={3: row}).graph_version == 4
            want = cb.predict("gcn", [1, 2, 3], sampling_width=0)
            with ServerProcess(repo, "--poll-s", "0", "--read-only") as c, GnnClient(c.address) as cc:
                got = cc.predict("gcn", [1, 2, 3], sampling_width=0, min_graph_version=4, timeout=30)
                np.testing.assert_allclose(got.probabilities, want.probabilities, atol=1e-6)
                with pytest.raises(clients.FailedPreconditionError, match="--read-only"):
                    cc.update_graph("gcn", features={3: row})  # a read-only server never takes over


def test_updates_survive_sigkill(base_repo, tmp_path, tiny_dataset):
    """Acknowledged updates are in the log: a server killed with SIGKILL and started again answers from
    the updated graph at the same version."""
    repo = fresh_repo(base_repo, tmp_path / "kill")
    ds, rng = tiny_dataset, np.random.default_rng(11)
    mirror = _Mirror(ds)
    updates = _random_updates(ds, mirror, rng, 6)
    nodes = np.concatenate([rng.choice(ds.num_nodes, 12, replace=False), np.arange(ds.num_nodes, mirror.n)])
    with ServerProcess(repo) as srv, GnnClient(srv.address) as c:
        for upd in updates:
            c.update_graph("shadow", **upd)
        before = {m: c.predict(m, nodes, sampling_width=3) for m in MODELS}
        srv.kill()  # SIGKILL: no shutdown path runs
    with ServerProcess(repo) as srv, GnnClient(srv.address) as c:
        for m in MODELS:
            after = c.predict(m, nodes, sampling_width=3)
            assert after.graph_version == len(updates)
            np.testing.assert_allclose(after.probabilities, before[m].probabilities, atol=1e-5, err_msg=m)
        want = _reference(base_repo, "gcn", mirror.graph(), mirror.x, nodes, 3)
        np.testing.assert_allclose(before["gcn"].probabilities, want, atol=2e-5)


def test_compaction_folds_the_log_into_a_snapshot(base_repo, tmp_path, tiny_dataset):
    """A start with a log over --compact-log-bytes writes a snapshot; later starts load the snapshot (same
    answers, same version) and go on numbering from it. The log drops the records up to the previous snapshot
    (a follower one compaction behind still reads what it lacks): none at the first compaction, those up to the
    first snapshot at the second."""
    repo = fresh_repo(base_repo, tmp_path / "compact")
    ds, rng = tiny_dataset, np.random.default_rng(12)
    mirror = _Mirror(ds)
    updates = _random_updates(ds, mirror, rng, 5)
    nodes = np.concatenate([rng.choice(ds.num_nodes, 12, replace=False), np.arange(ds.num_nodes, mirror.n)])
    fp = next((repo / "_data").iterdir()).name
    logfile = repo / "_live" / f"{fp}.log"
    with ServerProcess(repo) as srv, GnnClient(srv.address) as c:
        for upd in updates:
            c.update_graph("gcn", **upd)
    size = logfile.stat().st_size
    with ServerProcess(repo, "--compact-log-bytes", "1") as srv, GnnClient(srv.address) as c:
        first = {m: c.predict(m, nodes, sampling_width=0) for m in ("gcn", "sage")}
        assert first["gcn"].graph_version == 5
    assert (repo / "_live" / f"{fp}.snapshot" / "snapshot.json").exists()
    assert logfile.stat().st_size >= size
    with ServerProcess(repo) as srv, GnnClient(srv.address) as c:
        for m in ("gcn", "sage"):
            again = c.predict(m, nodes, sampling_width=0)
            assert again.graph_version == 5
            np.testing.assert_allclose(again.probabilities, first[m].probabilities, atol=1e-5, err_msg=m)
        assert c.update_graph("gcn", features={0: np.zeros(ds.num_features)}).graph_version == 6
    with ServerProcess(repo, "--compact-log-bytes", "1") as srv, GnnClient(srv.address) as c:
        assert c.predict("gcn", nodes[:2], sampling_width=0).graph_version == 6
    assert logfile.stat().st_size < size  # the records up to the first snapshot's version 5 dropped
    assert json.loads((repo / "_live" / f"{fp}.snapshot" / "snapshot.json").read_text())["version"] == 6
    want = _reference(base_repo, "gcn", mirror.graph(), mirror.x, nodes, 0)
    np.testing.assert_allclose(first["gcn"].probabilities, want, atol=2e-5)


def test_a_shadow_model_never_rebuilds_its_ppr_index_after_updates_or_compaction(base_repo, tmp_path, tiny_dataset):
    """A QA report: a shaDow model loaded after the update log's replay (a GCN on the same graph loaded first),
    and every start after a compaction, built its PPR index from every node (15 minutes at 1 M nodes). Saved
    indexes of the graph are opened before the replay, and a compaction saves the live lists as the index
    of the snapshot's graph: no start here pushes the whole graph, and the answers stay the same."""
    import re as _re

    repo = fresh_repo(base_repo, tmp_path / "repo")
    ds, rng = tiny_dataset, np.random.default_rng(31)
    mirror = _Mirror(ds)
    updates = _random_updates(ds, mirror, rng, 6)
    nodes = np.concatenate([rng.choice(ds.num_nodes, 16, replace=False), np.arange(ds.num_nodes, mirror.n)])

    def builds(srv) -> list[str]:  # full index builds of the served graph (the update warm-up's is 6 nodes)
        text = srv.log_path.read_text(errors="replace")
        return [m for m in _re.findall(r"PPR index for (\d+) nodes", text) if int(m) > 100]

    with ServerProcess(repo) as srv, GnnClient(srv.address) as c:
        for upd in updates:
            c.update_graph("gcn", **upd)
        want = c.predict("shadow", nodes, sampling_width=0)
    for args in ((), ("--compact-log-bytes", "1"), ()):  # replay; compaction; the snapshot
        with ServerProcess(repo, *args) as srv, GnnClient(srv.address) as c:
            got = c.predict("shadow", nodes, sampling_width=0)
            assert got.graph_version == 6
            np.testing.assert_allclose(got.probabilities, want.probabilities, atol=1e-5)
            assert builds(srv) == [], srv.log()
            if args:
                assert "saved as the snapshot graph's index" in srv.log_path.read_text(errors="replace")
    assert len(list((repo / "_ppr").glob("ppr-*"))) == 2  # the dataset's index and the snapshot's


pytest_plugins = ("tests.redis_server",)


@pytest.mark.parametrize("graph_in_redis", [False, True], ids=["features-in-redis", "stateless"])
def test_two_replicas_over_one_redis_see_each_others_updates(redis_factory, base_repo, tiny_dataset, tmp_path,
                                                             graph_in_redis):
    """Two servers over one (private) Redis: features there, the graph in each one's memory or (stateless
    replicas) in Redis too. An update through one is visible through the other: at once with
    min_graph_version, and by itself within a bounded delay; both answer as the offline model on the
    edited graph."""
    from serve.features import load_features
    from serve.graph_store import load_graph

    ds, rng = tiny_dataset, np.random.default_rng(21)
    redis = redis_factory()
    url = redis.url
    load_features(ds, url, progress=False)
    kw: dict = {}
    models = ("gcn", "sage")
    if graph_in_redis:
        load_graph(ds, url, progress=False)
        kw["graph_url"] = url
    servers = []
    for name in ("a", "b"):
        repo = tmp_path / name
        repo.mkdir()
        for m in models:
            (repo / m).symlink_to(base_repo / m)
        if not graph_in_redis:
            (repo / "_data").symlink_to(base_repo / "_data")
        servers.append(ServerThread(repo, {"feature_url": url, "runtime_kw": kw}).start())
    try:
        a, b = (GnnClient(s.address) for s in servers)
        mirror = _Mirror(ds)
        updates = _random_updates(ds, mirror, rng, 8)
        assert any("new_nodes" in u for u in updates)  # stateless replicas place them too
        for i, upd in enumerate(updates):
            res = (a if i % 2 == 0 else b).update_graph("gcn", **upd)
        version = res.graph_version
        assert version == len(updates)
        nodes = rng.choice(ds.num_nodes, 30, replace=False)
        graph = mirror.graph()
        for client in (a, b):
            for m in models:
                got = client.predict(m, nodes, sampling_width=3, min_graph_version=version)
                assert got.graph_version == version
                want = _reference(base_repo, m, graph, mirror.x, nodes, 3)
                np.testing.assert_allclose(got.probabilities, want, atol=2e-5, err_msg=m)
        up = a.update_graph("gcn", features={int(nodes[0]): np.zeros(ds.num_features)})
        t_end = time.monotonic() + 10
        while b.get_model("gcn").graph_version < up.graph_version:  # the follower, without being asked
            assert time.monotonic() < t_end, "replica b did not follow the update within 10 s"
            time.sleep(0.01)
        if not graph_in_redis:  # the shared log down: not applied, and the client reads no driver text
            redis.kill(forget=False)
            with pytest.raises(clients.UnavailableError) as info:
                a.update_graph("gcn", features={int(nodes[1]): np.ones(ds.num_features)}, timeout=60)
            msg = str(info.value)
            assert "update log" in msg and "incident" in msg, msg
            assert "Error" not in msg and str(redis.port) not in msg and "localhost" not in msg, msg
    finally:
        for s in servers:
            s.stop()


def test_an_update_after_redis_lost_the_log_is_answered_at_once(redis_factory, base_repo, tiny_dataset, tmp_path):
    """Redis loses the update log while a server runs (a FLUSHDB, a restart without persistence) and the next
    UpdateGraph comes before anything else noticed: it is answered FAILED_PRECONDITION at once (the graph has forked
    from its log: the server takes it out of service, as its follower would), not left waiting for its deadline."""
    from serve.features import load_features

    redis = redis_factory()
    load_features(tiny_dataset, redis.url, progress=False)
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "r"), {"feature_url": redis.url}).start()
    try:
        with GnnClient(srv.address) as c:
            f = tiny_dataset.num_features
            assert c.update_graph("gcn", features={1: np.zeros(f)}).graph_version == 1
            r = redis.client()
            r.flushdb()
            r.close()
            for node in (2, 3):  # the first one met the lost log itself; the second finds the graph out of service
                t0 = time.monotonic()
                with pytest.raises(clients.FailedPreconditionError) as info:  # lasts until a restart: not retried
                    c.update_graph("gcn", features={node: np.zeros(f)}, timeout=60)
                assert time.monotonic() - t0 < 20, "the update waited for its deadline"
                assert "update log" in str(info.value), str(info.value)
    finally:
        srv.stop()


def test_a_graph_out_of_service_turns_health_not_serving(redis_factory, base_repo, tiny_dataset, tmp_path, caplog):
    """Redis loses the update log (FLUSHDB) under a server that took an update: its follower finds the log behind
    the graph's version and takes the graph out of service. Health ("" and both services) then says NOT_SERVING,
    logged once at CRITICAL (it stayed SERVING while every request failed: an operations report), and the
    models on that graph answer FAILED_PRECONDITION saying to restart, Predict and UpdateGraph alike; a
    read-your-writes wait for a later version too, at once. KServe's ServerReady and ModelReady say not ready."""
    import grpc

    from serve.features import load_features
    from serve.server import GNN_SERVICE, TRITON_SERVICE

    redis = redis_factory()
    load_features(tiny_dataset, redis.url, progress=False)
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "r"), {"feature_url": redis.url, "poll_s": 0}).start()
    try:
        with GnnClient(srv.address, timeout=60) as c:
            f = tiny_dataset.num_features
            assert c.update_graph("gcn", features={1: np.zeros(f)}).graph_version == 1
            assert c.health() == "SERVING"
            r = redis.client()
            r.flushdb()
            r.close()
            with caplog.at_level("CRITICAL", logger="serve.server"):
                # nothing is sent: the follower notices by itself
                _wait_for_health(c, "NOT_SERVING", ("", GNN_SERVICE, TRITON_SERVICE))
                for m in ("gcn", "sage"):
                    with pytest.raises(clients.FailedPreconditionError, match=r"no longer answers.*restart") as info:
                        c.predict(m, [1, 2])
                    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
                with pytest.raises(clients.FailedPreconditionError, match="restart"):
                    c.update_graph("gcn", features={2: np.zeros(f)})
                with pytest.raises(clients.FailedPreconditionError, match="restart"):
                    c.predict("gcn", [1], min_graph_version=5)
                assert c.health() == "NOT_SERVING"
                # the KServe readiness calls say so too (they said ready)
                from clients._gen import inference_pb2 as ipb
                from clients._gen import inference_pb2_grpc as ipbg

                with grpc.insecure_channel(srv.address) as ch:
                    kserve = ipbg.GRPCInferenceServiceStub(ch)
                    assert not kserve.ServerReady(ipb.ServerReadyRequest(), timeout=30).ready
                    for m in ("gcn", "sage"):
                        assert not kserve.ModelReady(ipb.ModelReadyRequest(name=m), timeout=30).ready
                    assert kserve.ServerLive(ipb.ServerLiveRequest(), timeout=30).live
            said = [rec for rec in caplog.records if rec.name == "serve.server" and rec.levelname == "CRITICAL"]
            assert len(said) == 1 and "health NOT_SERVING" in said[0].getMessage(), said
            assert srv.server.registry.get("gcn").data.live.label in said[0].getMessage()
    finally:
        srv.stop()


def test_read_your_writes_with_the_redis_log_down_is_unavailable(redis_factory, base_repo, tiny_dataset, tmp_path,
                                                                 caplog):
    """A Predict with min_graph_version ahead of the server while the Redis update log is down (redis-server
    stopped: connection refused) answers UNAVAILABLE saying the update log cannot be read and to retry, logged as
    one WARNING with its incident id and no traceback; it was INTERNAL with an ERROR traceback (the log client's
    UpdateLogUnavailable escaped LiveGraph.wait_for). Health stays SERVING (a cause that may pass), and once
    Redis is back the wait answers again."""
    import grpc

    from serve.features import load_features

    redis = redis_factory(extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    load_features(tiny_dataset, redis.url, progress=False)
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "r"), {"feature_url": redis.url, "poll_s": 0}).start()
    try:
        with GnnClient(srv.address, timeout=60, max_retries=0) as c:
            f = tiny_dataset.num_features
            assert c.update_graph("gcn", features={1: np.zeros(f)}).graph_version == 1
            redis.stop()
            with caplog.at_level("WARNING"):
                for version in (2, 1000):
                    with pytest.raises(clients.UnavailableError) as info:
                        c.predict("gcn", [1], min_graph_version=version)
                    msg = str(info.value)
                    assert info.value.code == grpc.StatusCode.UNAVAILABLE
                    assert "update log" in msg and "retry" in msg and "incident" in msg, msg
                    assert str(redis.port) not in msg and "Error" not in msg, msg
            loud = [(rec.name, rec.getMessage()) for rec in caplog.records
                    if rec.exc_info or (rec.name == "serve.interceptors" and rec.levelno >= 40)]
            assert not loud, loud  # no traceback, no "Predict failed unexpectedly"
            assert any(rec.name == "serve.live" and "update log" in rec.getMessage() for rec in caplog.records)
            assert c.health() == "SERVING"
            redis.start()
            assert c.update_graph("gcn", features={2: np.zeros(f)}).graph_version == 2
            assert c.predict("gcn", [1], min_graph_version=2).graph_version == 2
    finally:
        srv.stop()


def test_a_missing_induced_table_is_built_beside_serving(base_repo, tmp_path, tiny_dataset, monkeypatch):
    """A shaDow model whose PPR index has no saved induced table is served at once on the CPU: the table is built on a
    thread (minutes at millions of nodes) and batches are induced from the graph meanwhile. An update before the
    table is attached marks its targets dirty against the lists the table is built from: the answers before, with
    and after the table are the same. A server closing stops a build (nothing saved)."""
    from kernels.subgraph import InducedTable

    real, gate, entered = InducedTable.build.__func__, threading.Event(), threading.Event()

    def gated(cls, *a, **kw):
        entered.set()
        assert gate.wait(60), "the test never opened the gate"
        return real(cls, *a, **kw)

    monkeypatch.setattr(InducedTable, "build", classmethod(gated))
    nodes = np.arange(0, tiny_dataset.num_nodes, 5)
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "a")).start()  # returns once the models are served
    try:
        assert entered.wait(30)
        rt = srv.server.registry.get("shadow")
        assert rt.ppr_index.induced is None
        with GnnClient(srv.address) as c:
            first = c.predict("shadow", nodes, sampling_width=2, ppr_budget=16)
            u, v = _non_neighbours(tiny_dataset, np.random.default_rng(3))
            up = c.update_graph("shadow", add_edges=[(u, v)])
            before = c.predict("shadow", nodes, sampling_width=2, ppr_budget=16, min_graph_version=up.graph_version)
            gate.set()
            assert srv.server.registry.wait_for_induced_tables(60)
            assert rt.ppr_index.induced is not None and rt.ppr_index.base.meta.get("induced")
            after = c.predict("shadow", nodes, sampling_width=2, ppr_budget=16)
        assert first.graph_version == 0 and before.graph_version == after.graph_version == up.graph_version
        np.testing.assert_array_equal(before.probabilities, after.probabilities)
        assert not np.array_equal(first.probabilities, before.probabilities)  # the update moved some answer
    finally:
        gate.set()
        srv.stop()

    gate.clear()
    entered.clear()
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "b")).start()
    try:
        assert entered.wait(30)
        base = srv.server.registry.get("shadow").ppr_index.base
    finally:
        threading.Timer(1.0, gate.set).start()  # the build goes on only after the server began to close
        srv.stop()
    assert base.induced is None and not base.meta.get("induced")
    assert not list(base.path.glob("induced_*"))


def test_update_metrics(base_repo, tmp_path, tiny_dataset):
    """Updates applied, rows invalidated per cache, update-to-visible time and the log size are exported."""
    from .serving import free_port, metric_samples

    port = free_port()
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "m"), {"metrics_port": port}).start()
    try:
        with GnnClient(srv.address) as c:
            c.predict("gcn", np.arange(50), sampling_width=0)  # rows to invalidate
            for v in range(3):
                c.update_graph("gcn", features={v: np.zeros(tiny_dataset.num_features)})
        [(labels, value)] = metric_samples(port, "gnnserve_graph_updates_total")
        assert value == 3 and labels["graph"]
        assert metric_samples(port, "gnnserve_graph_version") == [(labels, 3.0)]
        caches = {lab["cache"]: v for lab, v in metric_samples(port, "gnnserve_graph_rows_invalidated_total")}
        assert caches.get("projection", 0) >= 3 and caches.get("activation", 0) > 0, caches
        assert metric_samples(port, "gnnserve_graph_update_log_bytes")[0][1] > 0
        counts = [v for lab, v in metric_samples(port, "gnnserve_graph_update_seconds_count")]
        assert counts == [3]
    finally:
        srv.stop()


def test_concurrent_updates_are_grouped_and_each_validated(server, base_repo, tiny_dataset):
    """Many clients update at once: the server applies waiting updates together (fewer versions than
    updates), an invalid one among them fails alone with its own message, and the result equals the
    updates applied one by one."""
    from concurrent.futures import ThreadPoolExecutor

    ds, rng = tiny_dataset, np.random.default_rng(5)
    mirror = _Mirror(ds)
    g = ds.graph
    pairs = []
    while len(pairs) < 40:  # distinct absent edges, so any order of the additions gives the same graph
        a, b = sorted(int(x) for x in rng.integers(0, g.num_nodes, 2))
        if a != b and (a, b) not in mirror.edges and (a, b) not in pairs:
            pairs.append((a, b))
    present = sorted(e for e in mirror.edges if e[0] < e[1])[:10]
    rows = {int(v): rng.normal(size=ds.num_features).astype(np.float32) for v in rng.choice(g.num_nodes, 10, False)}
    jobs = ([dict(add_edges=[p]) for p in pairs] + [dict(remove_edges=[e]) for e in present]
            + [dict(features={v: r}) for v, r in rows.items()]
            + [dict(remove_edges=[pairs[0][::-1], pairs[0]])] * 3)  # the same edge twice: always invalid
    order = rng.permutation(len(jobs))

    def send(i):
        with GnnClient(server.address) as c:
            try:
                return c.update_graph("gcn", **jobs[i]).graph_version
            except clients.InvalidArgumentError as exc:
                return exc

    with ThreadPoolExecutor(12) as pool:
        out = list(pool.map(send, order))
    errors = [x for x in out if isinstance(x, Exception)]
    assert len(errors) == 3 and all("remove_edges[1]" in e.details for e in errors), errors
    versions = [x for x in out if not isinstance(x, Exception)]
    assert len(versions) == len(jobs) - 3 and max(versions) <= len(jobs) - 3
    mirror.update(rows, (), pairs, present)
    nodes = np.unique(np.concatenate([np.array(pairs).ravel(), np.array(present).ravel(), list(rows)]))
    with GnnClient(server.address) as c:
        got = c.predict("gcn", nodes, sampling_width=0)
        assert got.graph_version == max(versions)
        info = c.get_model("gcn")
    want = _reference(base_repo, "gcn", mirror.graph(), mirror.x, nodes, 0)
    np.testing.assert_allclose(got.probabilities, want, atol=2e-5)
    assert info.num_nodes == ds.num_nodes


def test_an_update_holding_the_lock_never_holds_the_event_loop(server):
    """A small batch runs on the event loop; while an update holds the live graph's lock, it goes to the
    worker instead of waiting on the loop: health checks and model listings still answer, and the request
    is answered once the update is done."""
    rt = server.server.registry.get("gcn")
    live, batcher = rt.data.live, rt.batcher
    with GnnClient(server.address) as c, GnnClient(server.address) as waiting:
        inline = batcher.batches_inline
        first = c.predict("gcn", [1, 2])
        assert batcher.batches_inline == inline + 1  # the lock free: this batch ran inline
        deferred = batcher.batches_deferred
        with live.lock.write():  # an update being applied
            th, out = deferred_while_held(batcher, c, lambda: waiting.predict("gcn", [1, 2], timeout=60), set(MODELS))
        th.join(30)
    assert out["r"].graph_version == first.graph_version
    np.testing.assert_array_equal(out["r"].labels, first.labels)
    assert batcher.batches_deferred == deferred + 1 and batcher.batches_inline == inline + 1
    from prometheus_client import generate_latest

    scraped = generate_latest(server.server.metrics.registry).decode()
    assert f'gnnserve_batches_total{{model="gcn",version="1",where="deferred"}} {deferred + 1}.0' in scraped
    assert f'gnnserve_batches_total{{model="gcn",version="1",where="inline"}} {inline + 1}.0' in scraped


def queue_behind_the_writer(live, calls, timeout: float = 30.0) -> None:
    """Start each of ``calls`` in a thread while ``live``'s writer is held, release the writer once all of them wait
    behind it (one group), and join them."""
    with live._writer:
        threads = [threading.Thread(target=call) for call in calls]
        for th in threads:
            th.start()
        t_end = time.monotonic() + timeout
        while len(live._pending) < len(calls):
            assert time.monotonic() < t_end
            time.sleep(0.005)
    for th in threads:
        th.join(2 * timeout)


def test_updates_waiting_for_the_writer_share_one_version(server, tiny_dataset):
    """Updates that arrive while the writer is busy are applied together: one version, one log record."""
    from clients._gen import gnnserve_pb2 as pb

    live = server.server.registry.get("gcn").data.live
    results: list = []

    def send(v: int) -> None:
        req = pb.UpdateGraphRequest(model="gcn")
        req.features.add(node=v, features=[float(v)] * tiny_dataset.num_features)
        results.append(live.update(req))

    queue_behind_the_writer(live, [lambda v=v: send(v) for v in range(5)])  # five updates wait for the writer
    assert sorted(r.version for r in results) == [1] * 5 and all(r.group_size == 5 for r in results)
    assert live.log.head() == 1
    np.testing.assert_array_equal(live.features.get(np.arange(5))[:, 0], np.arange(5, dtype=np.float32))


def test_async_client_and_auth(base_repo, tmp_path, tiny_dataset):
    """The asyncio SDK updates and reads its write; updates need the same token as Predict."""
    import asyncio

    from clients import AsyncGnnClient

    srv = ServerThread(fresh_repo(base_repo, tmp_path / "auth"), {"token": "s3cret-token"}).start()
    try:
        with GnnClient(srv.address) as anonymous, pytest.raises(clients.UnauthenticatedError):
            anonymous.update_graph("gcn", features={1: np.zeros(tiny_dataset.num_features)})

        async def main():
            async with AsyncGnnClient(srv.address, token="s3cret-token") as c:
                up = await c.update_graph("gcn", new_nodes=[NewNode(features=np.ones(tiny_dataset.num_features),
                                                                    neighbors=[1, 2])])
                res = await c.predict("gcn", up.new_node_ids, min_graph_version=up.graph_version)
                return up, res

        up, res = asyncio.run(main())
        assert up.graph_version == 1 and up.new_node_ids.tolist() == [tiny_dataset.num_nodes]
        assert res.graph_version == 1 and len(res.labels) == 1
    finally:
        srv.stop()


def test_kserve_infer_reads_its_write(server, tiny_dataset):
    """ModelInfer takes min_graph_version as a request parameter and echoes graph_version."""
    import grpc

    from clients._gen import inference_pb2 as ipb
    from clients._gen import inference_pb2_grpc as ipbg

    def infer(**params):
        req = ipb.ModelInferRequest(
            model_name="gcn", raw_input_contents=[np.arange(3, dtype=np.int64).tobytes()],
            inputs=[ipb.ModelInferRequest.InferInputTensor(name="NODE_IDS", datatype="INT64", shape=[3])])
        for k, v in params.items():
            req.parameters[k].int64_param = v
        with grpc.insecure_channel(server.address) as ch:
            return ipbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)

    assert infer().parameters["graph_version"].int64_param == 0
    with GnnClient(server.address) as c:
        up = c.update_graph("gcn", features={1: np.zeros(tiny_dataset.num_features)})
    assert infer(min_graph_version=up.graph_version).parameters["graph_version"].int64_param == up.graph_version
    with pytest.raises(grpc.RpcError) as ei:
        infer(min_graph_version=up.graph_version + 5)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "has not been written" in ei.value.details()


def test_values_that_overflow_float32_are_refused_and_never_answered(base_repo, tmp_path, tiny_dataset):
    """A QA report: a feature row of 3e38 (finite) turned a sixth of a graph's answers NaN with status OK, and
    two edges weighing 3e38 overflowed a degree. Updates and request-time new nodes beyond +-1e15 are refused
    (INVALID_ARGUMENT naming the entry); values up to it answer finite; a value beyond it that came with the
    graph itself (written here behind the validation) gives FAILED_PRECONDITION naming the node, never a NaN."""
    f = tiny_dataset.num_features
    srv = ServerThread(fresh_repo(base_repo, tmp_path / "repo")).start()
    try:
        with GnnClient(srv.address) as c:
            live = srv.server.registry.get("gcn").data.live
            # behind the validation, before any Predict fills a cache: node 4's row near float32's limit
            live.data.features.write(np.array([4]), np.full((1, f), 3e38, dtype=np.float32))
            for model in MODELS:
                with pytest.raises(clients.FailedPreconditionError, match=r"not finite .* node 4\b"):
                    c.predict(model, [4, 5])
            far = int(np.setdiff1d(np.arange(tiny_dataset.num_nodes),
                                   np.concatenate([[4], tiny_dataset.graph.neighbors(4)]))[-1])
            assert np.isfinite(c.predict("shadow", [far]).probabilities).all()
            row = np.ones(f, dtype=np.float32)
            row[3] = 3e38
            with pytest.raises(clients.InvalidArgumentError, match=r"features\[0\]: feature 3e\+38 at position 3"):
                c.update_graph("gcn", features={7: row})
            with pytest.raises(clients.InvalidArgumentError, match=r"new_nodes\[0\]: feature 3e\+38 at position 3"):
                c.predict_new_node("gcn", row, [1, 2])
            with pytest.raises(clients.InvalidArgumentError, match=r"must be at most 1e\+15"):
                c.update_graph("gcn", add_edges=[(10, 11, 3e38)] if 11 not in tiny_dataset.graph.neighbors(10)
                               else [(10, 12, 3e38)])
            assert c.get_model("gcn").graph_version == 0  # nothing applied
            row[3] = 1e15  # the bound itself: accepted, answers finite
            c.update_graph("gcn", features={7: row})
            for model in MODELS:
                assert np.isfinite(c.predict(model, [7]).probabilities).all()
    finally:
        srv.stop()
