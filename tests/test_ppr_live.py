"""The live PPR index (kernels.ppr_live): recomputed lists, quality against exact PPR, induced batches.

Exact PPR (SciPy power iteration) is the quality reference; recomputed lists must equal the very
push a fresh computation runs (``ppr_topk`` on the edited graph).
"""

from __future__ import annotations

import numpy as np
import pytest

import kernels.ppr_live as pl
from kernels.datasets import load_npz, synthetic_sbm
from kernels.graph import CSRGraph
from kernels.graph_edit import GraphEdit, apply_edit, edit_from_pairs
from kernels.ppr import PPRConfig, PPRIndex, PPRIndexError, _weighted_degree, ppr_exact, ppr_topk
from kernels.ppr_live import LivePPRIndex, row_change_bounds, row_change_peaks
from kernels.subgraph import induced_batch

from .conftest import dataset_path

SBM_CFG = PPRConfig(topk=24, eps=1e-4)


@pytest.fixture(scope="module")
def sbm():
    return synthetic_sbm(500, num_classes=4, avg_degree=8, num_features=4, seed=3).graph


@pytest.fixture(scope="module")
def sbm_base(sbm):
    return PPRIndex.build(sbm, SBM_CFG, progress=False)


CORA_CFG = PPRConfig(topk=32, eps=1e-4)


@pytest.fixture(scope="module")
def cora():
    g = load_npz(dataset_path("cora")).graph
    return g, PPRIndex.build(g, CORA_CFG, progress=False)



def assert_fresh_lists(live: LivePPRIndex, g: CSRGraph, targets: np.ndarray, cfg: PPRConfig) -> tuple:
    """The live index's lists of ``targets`` are a fresh push's on ``g`` (``ppr_topk``), ids and scores
    alike; returns that push's ``(ptr, nodes, scores)``."""
    fptr, fnodes, fscores = ppr_topk(g, targets, cfg)
    lptr, lnodes, lscores = live.lookup(targets, return_scores=True)
    np.testing.assert_array_equal(lptr, fptr)
    np.testing.assert_array_equal(lnodes, fnodes)
    np.testing.assert_array_equal(lscores, fscores)
    return fptr, fnodes, fscores

def make_edit(rng, g, *, new=True, adds=3, rems=3):
    """A valid random edit: some new nodes linked to existing ones, edge removals and additions."""
    n = g.num_nodes
    m = int(rng.integers(0, 3)) if new else 0
    ptr, nbrs = [0], []
    for j in range(m):
        k = int(rng.integers(1, 5))
        nbrs.extend(int(x) for x in rng.choice(n + j, size=k, replace=False))
        ptr.append(len(nbrs))
    src = g.row_ids()
    keep = src < g.indices
    ex_s, ex_d = src[keep].astype(np.int64), g.indices[keep].astype(np.int64)
    pick = rng.choice(len(ex_s), size=min(rems, len(ex_s)), replace=False)
    rem = [(int(ex_s[i]), int(ex_d[i])) for i in pick]
    add: list[tuple[int, int]] = []
    while len(add) < adds:
        u, v = (int(x) for x in rng.integers(n + m, size=2))
        if u == v or (u < n and v < n and v in g.neighbors(u)) or (u, v) in add or (v, u) in add:
            continue
        if u >= n or v >= n:  # a new node: make sure it does not already list the other end
            a, b = max(u, v), min(u, v)
            if b in nbrs[ptr[a - n] : ptr[a - n + 1]]:
                continue
        add.append((u, v))
    return GraphEdit.make(
        new_count=m, new_ptr=ptr, new_nbrs=nbrs,
        add_src=[a for a, _ in add], add_dst=[b for _, b in add],
        rem_src=[a for a, _ in rem], rem_dst=[b for _, b in rem],
    )  # fmt: skip


def run_sequence(live, g, rng, steps, cfg, *, on_step=None, **kw):
    """Apply ``steps`` random edits, checking after each that every list is what the bookkeeping
    says (fresh ``ppr_topk`` for the recomputed and new nodes and, with ``eager_lists``, for every
    stale source on the graph of the moment; unchanged otherwise)."""
    ptr, nodes, scores = live.lookup(np.arange(g.num_nodes), return_scores=True)
    model = {v: (nodes[ptr[v] : ptr[v + 1]], scores[ptr[v] : ptr[v + 1]]) for v in range(g.num_nodes)}
    totals = {"recomputed": 0, "new": 0, "dirty": 0}
    for _ in range(steps):
        eff = apply_edit(g, make_edit(rng, g, **kw))
        st = live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
        for key in totals:
            totals[key] += st[key]
        assert st["recomputed"] == len(live.last_recomputed) and st["new"] == len(eff.new_ids)
        np.testing.assert_array_equal(live.last_new, eff.new_ids)
        assert st["deferred"] == len(live.last_deferred) and st["stale"] == live.stale_count
        stale = np.flatnonzero(live.is_stale(np.arange(g.num_nodes)))
        assert len(stale) == live.stale_count and np.isin(live.last_deferred, stale).all()
        assert live.is_dirty(stale).all()  # never served from the induced table
        targets = np.concatenate([live.last_recomputed, live.last_new])
        assert len(np.unique(targets)) == len(targets) and not np.isin(targets, stale).any()
        targets = np.concatenate([targets, stale])
        if len(targets):
            fptr, fnodes, fscores = assert_fresh_lists(live, g, targets, cfg)
            for b, t in enumerate(targets):
                model[int(t)] = (fnodes[fptr[b] : fptr[b + 1]], fscores[fptr[b] : fptr[b + 1]])
        assert live.num_nodes == g.num_nodes
        ptr, nodes, scores = live.lookup(np.arange(g.num_nodes), return_scores=True)
        for v in range(g.num_nodes):
            np.testing.assert_array_equal(nodes[ptr[v] : ptr[v + 1]], model[v][0])
            np.testing.assert_array_equal(scores[ptr[v] : ptr[v + 1]], model[v][1])
        if on_step is not None:
            on_step(g)
    return g, totals


# ============================================================================ (1) recomputed lists
@pytest.mark.parametrize("merge_fraction", [0.25, 0.0])
def test_recomputed_lists_equal_a_fresh_push(sbm, sbm_base, merge_fraction):
    live = LivePPRIndex(sbm_base, merge_fraction=merge_fraction)
    g, totals = run_sequence(live, sbm, np.random.default_rng(1), 12, SBM_CFG)
    assert 0 < totals["recomputed"] < 12 * sbm.num_nodes  # some, not all
    assert totals["new"] > 0
    np.testing.assert_array_equal(live.ptr[-1], len(live.nodes))  # merged views agree with lookups
    ptr, nodes = live.lookup(np.arange(g.num_nodes))
    np.testing.assert_array_equal(live.ptr, ptr)
    np.testing.assert_array_equal(live.nodes, nodes)
    assert live.fingerprint == g.fingerprint()
    live.check_graph(g)
    with pytest.raises(PPRIndexError):
        live.check_graph(sbm)
    assert sbm_base.num_nodes == sbm.num_nodes  # the base is untouched
    np.testing.assert_array_equal(sbm_base.lookup(np.arange(5))[1], PPRIndex.build(sbm, SBM_CFG, progress=False)
                                  .lookup(np.arange(5))[1])  # fmt: skip


def test_recomputed_lists_equal_a_fresh_push_on_weighted_lazy_graph():
    rng = np.random.default_rng(4)
    ei = rng.integers(0, 300, size=(2, 1500))
    g = CSRGraph.from_edge_index(ei, num_nodes=300, weights=rng.uniform(0.2, 3.0, 1500), symmetrize=True,
                                 remove_self_loops=True)  # fmt: skip
    cfg = PPRConfig(topk=16, eps=1e-4, lazy=True)
    live = LivePPRIndex(PPRIndex.build(g, cfg, progress=False))
    _, totals = run_sequence(live, g, np.random.default_rng(5), 6, cfg)
    assert totals["recomputed"] > 0


def test_edits_to_weight_zero():
    """Re-weighting every edge of a node to 0 (the edit of a QA report that aborted the server: the reverse
    pushes listed a node reached along weight-0 edges at each reach, past the end of their touched list):
    the recomputed lists are a fresh push, each node listed once."""
    rng = np.random.default_rng(8)
    ei = rng.integers(0, 200, size=(2, 900))
    g = CSRGraph.from_edge_index(ei, num_nodes=200, weights=rng.uniform(0.5, 2.0, 900), symmetrize=True,
                                 remove_self_loops=True)  # fmt: skip
    cfg = PPRConfig(topk=16, eps=1e-5)
    live = LivePPRIndex(PPRIndex.build(g, cfg, progress=False))
    for node in (5, 17, 40):
        nb = g.neighbors(node).astype(np.int64)
        e = GraphEdit.make(rem_src=np.full(len(nb), node), rem_dst=nb, add_src=np.full(len(nb), node), add_dst=nb,
                           add_w=np.zeros(len(nb)))
        eff = apply_edit(g, e)
        st = live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
        assert st["recomputed"] > 0 and not np.any(g.weights[g.indptr[node] : g.indptr[node + 1]])
        ptr, nodes = live.lookup(np.arange(g.num_nodes))
        assert all(len(np.unique(nodes[ptr[v] : ptr[v + 1]])) == ptr[v + 1] - ptr[v] for v in range(g.num_nodes))
        assert nodes[ptr[node] : ptr[node + 1]].tolist() == [node]
        assert_fresh_lists(live, g, live.last_recomputed, cfg)


def test_recomputed_lists_on_cora(cora):
    g, base = cora
    live = LivePPRIndex(base)
    _, totals = run_sequence(live, g, np.random.default_rng(2), 5, CORA_CFG)
    assert 0 < totals["recomputed"] < 5 * g.num_nodes


def test_tolerance_controls_the_recomputation(sbm, sbm_base):
    u, v = 3, 7
    assert v not in sbm.neighbors(u)
    eff = apply_edit(sbm, edit_from_pairs(add=[(u, v)]))
    lax = LivePPRIndex(sbm_base, tol_factor=1e9)
    st = lax.apply(sbm, eff.graph, eff.changed_rows, eff.new_ids)
    assert st["recomputed"] == 0 and st["dirty"] > 0  # nothing moved enough, but subgraphs changed
    strict = LivePPRIndex(sbm_base, tol_factor=1e-6)
    st_strict = strict.apply(sbm, eff.graph, eff.changed_rows, eff.new_ids)
    default = LivePPRIndex(sbm_base)
    st_default = default.apply(sbm, eff.graph, eff.changed_rows, eff.new_ids)
    l1 = LivePPRIndex(sbm_base, rule="l1")
    st_l1 = l1.apply(sbm, eff.graph, eff.changed_rows, eff.new_ids)
    assert st_strict["recomputed"] >= st_l1["recomputed"] >= st_default["recomputed"] > 0
    assert {u, v} <= set(default.last_recomputed.tolist())
    # the strict rule recomputes every source that reaches the changed rows within a few hops
    assert st_strict["recomputed"] > sbm.num_nodes // 2
    with pytest.raises(ValueError, match="rule"):
        LivePPRIndex(sbm_base, rule="linf")


def test_apply_checks_its_arguments(sbm, sbm_base):
    live = LivePPRIndex(sbm_base)
    eff = apply_edit(sbm, GraphEdit.make(new_count=1, new_ptr=[0, 1], new_nbrs=[0]))
    with pytest.raises(ValueError, match="new_ids"):
        live.apply(sbm, eff.graph, eff.changed_rows, np.array([7]))
    with pytest.raises(ValueError, match="old_graph"):
        live.apply(eff.graph, eff.graph, eff.changed_rows, np.zeros(0, dtype=np.int64))


# ============================================================================ (2) quality
@pytest.mark.parametrize("eager_lists", [0, 3])
def test_stale_lists_are_pushed_at_lookup_and_refreshed_to_the_same(sbm, sbm_base, eager_lists):
    """With ``eager_lists`` an edit pushes at most that many flagged sources again and leaves the rest
    stale: a lookup pushes a stale list on the current graph (checked by run_sequence after every edit,
    for every source), a refresh stores exactly those lists, and nothing else moves."""
    rng = np.random.default_rng(5)
    live = LivePPRIndex(sbm_base, eager_lists=eager_lists, merge_fraction=0.05)
    refreshed = []

    def refresh_some(g):
        if rng.random() < 0.5 or not live.stale_count:
            return
        before = live.lookup(np.arange(g.num_nodes), return_scores=True)
        mat = (live.ptr.copy(), live.nodes.copy())
        prep = live.prepare_refresh(int(rng.integers(1, 2 * live.stale_count)))
        want = min(len(prep["targets"]), live.stale_count)
        assert live.install_refresh(prep) == want
        refreshed.append(want)
        assert not live.is_stale(prep["targets"]).any() and live.is_dirty(prep["targets"]).all()
        for a, b in zip(live.lookup(np.arange(g.num_nodes), return_scores=True), before, strict=True):
            np.testing.assert_array_equal(a, b)  # the stored lists are the ones lookups pushed
        np.testing.assert_array_equal(live.ptr, mat[0])
        np.testing.assert_array_equal(live.nodes, mat[1])

    g, totals = run_sequence(live, sbm, rng, 10, SBM_CFG, on_step=refresh_some)
    assert totals["recomputed"] <= 10 * eager_lists
    assert refreshed and sum(refreshed) > 0
    # a stale list stays stale through later edits, outside their choice of eager pushes
    stale = np.flatnonzero(live.is_stale(np.arange(g.num_nodes)))
    if len(stale):
        eff = apply_edit(g, make_edit(rng, g, new=False))
        live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
        assert live.is_stale(stale).all() and not np.isin(live.last_recomputed, stale).any()
    # the lists a lookup pushed are handed over: stored without a push, unless an edit came between
    while live.stale_count < 5:
        eff = apply_edit(g, make_edit(rng, g, new=False))
        live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
    t = np.flatnonzero(live.is_stale(np.arange(g.num_nodes)))[:5]
    want = live.lookup(t, return_scores=True)
    assert live.has_handed()
    eff = apply_edit(g, make_edit(rng, g, new=False))
    live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
    g = eff.graph
    assert live.install_handed() == 0 and not live.has_handed()  # pushed on the graph before the edit
    t = np.flatnonzero(live.is_stale(np.arange(g.num_nodes)))[:5]
    want = live.lookup(t, return_scores=True)
    live.lookup(t[:2])  # a second hand-over of two of them: stored once
    calls = []
    real = live._push
    live._push = lambda *a: calls.append(a) or real(*a)
    assert live.install_handed() == len(t) and not live.is_stale(t).any() and not calls
    live._push = real
    for a, b in zip(live.lookup(t, return_scores=True), want, strict=True):
        np.testing.assert_array_equal(a, b)
    # drain the rest: the lists after a full refresh are a fresh push for every source ever flagged
    stale = np.flatnonzero(live.is_stale(np.arange(g.num_nodes)))
    while live.stale_count:
        live.install_refresh(live.prepare_refresh(7))
    assert_fresh_lists(live, g, stale, SBM_CFG)
    assert live.prepare_refresh(7) is None
    # an edit between the halves of a refresh: nothing stored
    eff = apply_edit(g, make_edit(rng, g, new=False))
    live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
    if live.stale_count:
        prep = live.prepare_refresh(4)
        eff2 = apply_edit(eff.graph, make_edit(rng, eff.graph, new=False))
        live.apply(eff.graph, eff2.graph, eff2.changed_rows, eff2.new_ids)
        n_stale, voided = live.stale_count, live.refresh_stats["voided"]
        assert live.install_refresh(prep) == 0 and live.stale_count == n_stale
        assert live.refresh_stats["voided"] == voided + int(live.is_stale(prep["targets"]).sum()) > voided


def test_eager_lists_is_checked(sbm_base):
    with pytest.raises(ValueError, match="eager_lists"):
        LivePPRIndex(sbm_base, eager_lists=-1)


def recall(ptr, nodes, exact, k):
    out = []
    for b in range(len(ptr) - 1):
        top = set(np.argsort(-exact[b], kind="stable")[:k].tolist())
        out.append(len(top & set(nodes[ptr[b] : ptr[b + 1]].tolist())) / k)
    return float(np.mean(out))


@pytest.mark.parametrize(("dataset", "eager_lists"), [("sbm", None), ("sbm", 0), ("cora", None)])
def test_maintained_lists_are_as_good_as_a_fresh_index(request, sbm, sbm_base, dataset, eager_lists):
    if dataset == "sbm":
        g0, cfg, base, steps = sbm, SBM_CFG, sbm_base, 20
    else:
        (g0, base), cfg, steps = request.getfixturevalue("cora"), CORA_CFG, 15
    rng = np.random.default_rng(7)
    live = LivePPRIndex(base, eager_lists=eager_lists)
    g = g0
    touched: set[int] = set()
    for _ in range(steps):
        eff = apply_edit(g, make_edit(rng, g, adds=6, rems=6))
        live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        touched |= set(eff.changed_rows.tolist())
        g = eff.graph
    # the targets the edits concern most: the edited rows and their neighbours
    near = np.unique(np.concatenate([g.neighbors(v) for v in touched] + [np.array(sorted(touched))]))
    targets = np.sort(rng.choice(near[near < g0.num_nodes], size=min(120, len(near)), replace=False))
    k = cfg.topk
    exact = ppr_exact(g, targets, cfg)
    r_fresh = recall(*ppr_topk(g, targets, cfg)[:2], exact, k)  # what PPRIndex.build(g) holds for them
    r_live = recall(*live.lookup(targets), exact, k)
    r_stale = recall(*base.lookup(targets), exact, k)
    assert r_live >= r_fresh - 0.02, (r_live, r_fresh, r_stale)
    assert r_stale < r_live - 0.02  # the edits did move these lists: the check above has teeth


# ============================================================================ (3) induced batches
def batches_equal(a, b):
    assert a.graph.num_nodes == b.graph.num_nodes
    np.testing.assert_array_equal(a.graph.indptr, b.graph.indptr)
    np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
    assert (a.graph.weights is None) == (b.graph.weights is None)
    if a.graph.weights is not None:
        np.testing.assert_array_equal(a.graph.weights, b.graph.weights)
    for f in ("node_ids", "ptr", "target_rows", "unique_ids", "row_to_unique"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))


@pytest.mark.parametrize(("with_table", "tol_factor", "eager_lists"),
                         [(False, 1.0, None), (True, 1.0, None), (True, 1e9, None), (True, 1.0, 0)])
def test_induced_batch_equals_inducing_from_the_graph(sbm, with_table, tol_factor, eager_lists, monkeypatch):
    base = PPRIndex.build(sbm, SBM_CFG, progress=False)
    if with_table:
        assert base.ensure_induced(sbm, max_bytes=1 << 30)
    # tol_factor 1e9 recomputes no list: only the dirty marks of the lists holding changed rows
    # keep the table from serving stale subgraphs
    live = LivePPRIndex(base, tol_factor=tol_factor, eager_lists=eager_lists)
    calls = {"graph": 0}
    real = pl.induced_batch

    def counting(*a, **kw):
        calls["graph"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(pl, "induced_batch", counting)
    rng = np.random.default_rng(9)
    k_half = SBM_CFG.topk // 2

    def check_batches(g):
        n = g.num_nodes
        for k in (None, k_half):
            t = rng.choice(n, size=16, replace=False)
            if rng.random() < 0.5:
                t[0] = n - 1  # often a new node
            batches_equal(live.induced_batch(g, t, k), induced_batch(g, *live.lookup(t, k)))
            one = t[:1]
            batches_equal(live.induced_batch(g, one, k), induced_batch(g, *live.lookup(one, k)))
        clean = np.flatnonzero(~live.is_dirty(np.arange(n)))
        if len(clean) >= 8:
            t = rng.choice(clean, size=8, replace=False)
            before = calls["graph"]
            batches_equal(live.induced_batch(g, t), induced_batch(g, *live.lookup(t)))
            assert calls["graph"] == before + (0 if with_table else 1)  # clean targets: the table

    g, _ = run_sequence(live, sbm, np.random.default_rng(3), 8, SBM_CFG, on_step=check_batches)
    # soundness of the dirty marks: a clean target's subgraph is the one the offline lists and graph give
    n0 = sbm.num_nodes
    dirty = live.is_dirty(np.arange(n0))
    assert 0 < dirty.sum() < n0
    changed_subgraphs = 0
    for t in range(n0):
        now = induced_batch(g, *live.lookup([t]))
        then = induced_batch(sbm, *base.lookup([t]))
        same = (now.graph.num_edges == then.graph.num_edges and np.array_equal(now.node_ids, then.node_ids)
                and np.array_equal(now.graph.indices, then.graph.indices))  # fmt: skip
        if not dirty[t]:
            assert same, t
        changed_subgraphs += not same
    assert changed_subgraphs > 0
    assert live.is_dirty(np.arange(n0, g.num_nodes)).all()  # new nodes are never in the table
    # after edits, ensure_induced builds a table of the current lists and clears the marks (a stale list,
    # pushed at each lookup, stays dirty)
    assert live.ensure_induced(g, max_bytes=1 << 30)
    assert live.induced is not None and live.induced.num_nodes == g.num_nodes
    every = np.arange(g.num_nodes)
    np.testing.assert_array_equal(live.is_dirty(every), live.is_stale(every))
    assert (live.stale_count > 0) == (eager_lists is not None)
    fresh = np.flatnonzero(~live.is_stale(every))
    t = rng.choice(fresh, size=min(12, len(fresh)), replace=False)
    before = calls["graph"]
    batches_equal(live.induced_batch(g, t), induced_batch(g, *live.lookup(t)))
    assert calls["graph"] == before
    if live.stale_count:  # a stale target's batch comes from the graph, with its list pushed now
        t = np.flatnonzero(live.is_stale(every))[:4]
        batches_equal(live.induced_batch(g, t), induced_batch(g, *ppr_topk(g, t, SBM_CFG)[:2]))


# ============================================================================ (4) lookups
def test_lookup_contract(sbm, sbm_base):
    live = LivePPRIndex(sbm_base)
    # before any edit: the base's lists
    for t in ([5], [0, 7, 499], np.arange(40)):
        for k in (None, 1, 9):
            a, b = live.lookup(t, k, return_scores=True), sbm_base.lookup(t, k, return_scores=True)
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)
    edit = GraphEdit.make(new_count=2, new_ptr=[0, 3, 5], new_nbrs=[1, 2, 3, 500, 4], add_src=[10], add_dst=[500])
    eff = apply_edit(sbm, edit)
    live.apply(sbm, eff.graph, eff.changed_rows, eff.new_ids)
    g = eff.graph
    assert live.num_nodes == len(live) == 502
    full_ptr, full_nodes, full_scores = ppr_topk(g, [500, 501], SBM_CFG)
    ptr, nodes, scores = live.lookup([500, 501], return_scores=True)
    np.testing.assert_array_equal(ptr, full_ptr)
    np.testing.assert_array_equal(nodes, full_nodes)
    np.testing.assert_array_equal(scores, full_scores)
    assert nodes[0] == 500 and nodes[ptr[1]] == 501 and 1 in nodes[: ptr[1]]
    assert ptr.dtype == nodes.dtype == np.int64 and scores.dtype == np.float32
    for v in (500, 3, 250):  # new, recomputed or not: one-target and batch paths agree, k < k_max is a prefix
        p1, n1, s1 = live.lookup(v, return_scores=True)
        p2, n2 = live.lookup(np.array([v, v]), 5)
        np.testing.assert_array_equal(n2[: p2[1]], n1[:5])
        np.testing.assert_array_equal(n2[p2[1] :], n1[:5])
        assert p1.tolist() == [0, len(n1)] and len(s1) == len(n1) and n1[0] == v
        assert np.all(np.diff(s1[1:]) <= 0)
        assert live.lookup([v], 3)[1].tolist() == n1[:3].tolist()
    lonely = apply_edit(g, GraphEdit.make(new_count=1))  # a new node without edges: its list is itself
    live.apply(g, lonely.graph, lonely.changed_rows, lonely.new_ids)
    p1, n1, s1 = live.lookup(502, return_scores=True)
    assert n1.tolist() == [502] and s1.tolist() == [1.0]
    assert live.lookup([500, 502, 3])[1][-live.lookup(3)[0][1] - 1] == 502
    empty = live.lookup(np.zeros(0, dtype=np.int64))
    assert empty[0].tolist() == [0] and len(empty[1]) == 0
    with pytest.raises(ValueError, match="k must lie"):
        live.lookup([1], SBM_CFG.topk + 1)
    with pytest.raises(ValueError, match="targets must lie"):
        live.lookup([503])
    with pytest.raises(ValueError, match="targets must lie"):
        live.lookup([1, 503])
    assert live.k_max == SBM_CFG.topk and live.config == SBM_CFG


# ============================================================================ the bound
@pytest.mark.parametrize("cfg", [PPRConfig(topk=8), PPRConfig(topk=8, lazy=True)])
@pytest.mark.parametrize("weighted", [False, True])
def test_perturbation_bounds_hold_for_exact_ppr(cfg, weighted):
    rng = np.random.default_rng(21 + weighted)
    n = 120
    ei = rng.integers(0, n, size=(2, 400))
    w = rng.uniform(0.3, 2.0, 400) if weighted else None
    g = CSRGraph.from_edge_index(ei, num_nodes=n, weights=w, symmetrize=True, remove_self_loops=True)
    a = cfg.teleport
    for _ in range(4):
        eff = apply_edit(g, make_edit(rng, g, new=False, adds=2, rems=2))
        g2 = eff.graph
        rows = eff.changed_rows
        l1, mx = row_change_bounds(g, g2, rows)
        src = rng.choice(n, size=30, replace=False)
        old, new = ppr_exact(g, src, cfg), ppr_exact(g2, src, cfg)
        wd2 = _weighted_degree(g2)
        what = np.where(wd2 > 0, wd2, 1.0)
        for b in range(len(src)):
            d = new[b] - old[b]
            b_l1 = (1 - a) / a * np.sum(old[b, rows] * l1)
            b_node = (1 - a) / a * np.sum(old[b, rows] * mx)
            assert np.abs(d).sum() <= b_l1 + 1e-9
            assert np.all(np.abs(d) <= what * b_node + 1e-9)
        g = g2
    # a removal that leaves a node without edges (its walk then stays put): path 0-1-2-3, drop (0, 1)
    h = CSRGraph.from_edge_index(np.array([[0, 1, 2], [1, 2, 3]]), num_nodes=4, symmetrize=True)
    h2 = apply_edit(h, edit_from_pairs(remove=[(0, 1)])).graph
    l1, mx = row_change_bounds(h, h2, np.array([0, 1]))
    np.testing.assert_allclose(l1, [2.0, 1.0])  # row 0: e_1 -> e_0; row 1: (1/2, 1/2) -> e_2
    old, new = ppr_exact(h, np.arange(4), cfg), ppr_exact(h2, np.arange(4), cfg)
    what = np.maximum(_weighted_degree(h2), 1.0)
    for b in range(4):
        d = new[b] - old[b]
        assert np.abs(d).sum() <= (1 - a) / a * np.sum(old[b, [0, 1]] * l1) + 1e-9
        assert np.all(np.abs(d) <= what * (1 - a) / a * np.sum(old[b, [0, 1]] * mx) + 1e-9)
    # a one-edge addition between unit-degree rows: the bounds by hand
    h = CSRGraph.from_edge_index(np.array([[0, 2], [1, 3]]), num_nodes=4, symmetrize=True)
    h2 = apply_edit(h, edit_from_pairs(add=[(0, 2)])).graph
    l1, mx = row_change_bounds(h, h2, np.array([0, 2]))
    np.testing.assert_allclose(l1, [1.0, 1.0])  # row 0: (0, 1) -> (1/2, 1/2) on nodes 1, 2
    # the largest |Delta(x)| / w'(x): node 1 (or 3), degree 1, loses 1/2; node 2 (or 0) gains 1/2 over degree 2
    np.testing.assert_allclose(mx, [0.5, 0.5])
    l1, mx = row_change_bounds(h, h2, np.array([1]))  # an unchanged row moves by nothing
    assert l1.tolist() == [0.0] and mx.tolist() == [0.0]


def _transition_row(g: CSRGraph, u: int) -> np.ndarray:
    """``P_u`` dense (``e_u`` where ``w(u) = 0``: the walk stays)."""
    wd = _weighted_degree(g)
    row = np.zeros(g.num_nodes)
    if wd[u] <= 0:
        row[u] = 1.0
        return row
    w = g.weights[g.indptr[u] : g.indptr[u + 1]] if g.weights is not None else np.ones(g.degrees_of([u])[0])
    np.add.at(row, g.neighbors(u), w / wd[u])
    return row


def _exact_peaks(g: CSRGraph, g2: CSRGraph, rows: np.ndarray, cfg: PPRConfig) -> np.ndarray:
    """``max_y |(Delta_u Pi')(y)| / hat w'(y)`` per row, from exact PPR on ``g2`` (old nodes padded)."""
    n2 = g2.num_nodes
    pi2 = ppr_exact(g2, np.arange(n2), cfg)
    wd2 = _weighted_degree(g2)
    what = np.where(wd2 > 0, wd2, 1.0)
    out = []
    for u in rows:
        old = np.zeros(n2)
        old[: g.num_nodes] = _transition_row(g, int(u))
        out.append(np.max(np.abs((_transition_row(g2, int(u)) - old) @ pi2) / what))
    return np.array(out)


@pytest.mark.parametrize(
    "cfg", [PPRConfig(topk=8, eps=1e-4), PPRConfig(topk=8, eps=1e-6, lazy=True), PPRConfig(topk=8, eps=0.05)]
)
@pytest.mark.parametrize("weighted", [False, True])
def test_row_change_peaks_bound_the_exact_change(cfg, weighted):
    """The pushed peaks are upper bounds of the exact ``|Delta_u Pi'| / hat w'`` (any eps: the push error is
    in them), and at a fine eps close to it: most of ``m_u``'s slack is gone."""
    rng = np.random.default_rng(5 + weighted)
    n = 120
    ei = rng.integers(0, n, size=(2, 400))
    w = rng.uniform(0.3, 2.0, 400) if weighted else None
    g = CSRGraph.from_edge_index(ei, num_nodes=n, weights=w, symmetrize=True, remove_self_loops=True)
    ratios = []
    for step in range(4):
        eff = apply_edit(g, make_edit(rng, g, new=step % 2 == 1, adds=2, rems=2))
        rows = eff.changed_rows[eff.changed_rows < g.num_nodes]
        peaks = row_change_peaks(g, eff.graph, rows, cfg)
        exact = _exact_peaks(g, eff.graph, rows, cfg)
        _, mx = row_change_bounds(g, eff.graph, rows)
        assert np.all(exact <= peaks + 1e-12)
        assert np.all(exact <= mx + 1e-12)
        ratios.extend(peaks / mx)
        g = eff.graph
    if cfg.eps < 1e-5:
        assert np.median(ratios) < 0.7  # tighter than the rows' own bound
    # the corner cases: a node left without edges (path 0-1-2-3 without (0, 1)), an isolated node gaining one
    h = CSRGraph.from_edge_index(np.array([[0, 1, 2], [1, 2, 3]]), num_nodes=5, symmetrize=True)
    for edit in (edit_from_pairs(remove=[(0, 1)]), edit_from_pairs(add=[(4, 2)]), edit_from_pairs(add=[(0, 4)])):
        eff = apply_edit(h, edit)
        rows = eff.changed_rows
        exact = _exact_peaks(h, eff.graph, rows, cfg)
        assert np.all(exact <= row_change_peaks(h, eff.graph, rows, cfg) + 1e-12)
    assert row_change_peaks(h, h, np.zeros(0, dtype=np.int64), cfg).shape == (0,)


def _separable_peaks(g: CSRGraph, g2: CSRGraph, rows: np.ndarray, cfg: PPRConfig) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`row_change_peaks` computes, from exact PPR: per row the triangle inequality over the vectors
    of ``Delta_u Pi' = (1 - d'/d) P'_u Pi' + C_u Pi' / d`` (``P'_u Pi' = (pi'_u - a e_u) / (1 - a)``, ``e_u`` if
    ``d' = 0``; ``P'_u Pi' - pi'_u`` if ``d = 0``), and the sum of the absolute coefficients (its push margin
    is ``eps`` times that)."""
    n2, a = g2.num_nodes, cfg.teleport
    pi2 = ppr_exact(g2, np.arange(n2), cfg)
    wd, wd2 = _weighted_degree(g), _weighted_degree(g2)
    what = np.where(wd2 > 0, wd2, 1.0)
    plain = np.max(pi2 / what[None, :], axis=1)
    own = np.max(np.abs(pi2 - a * np.eye(n2)) / what[None, :], axis=1)
    ref, coef = [], []
    for u in (int(x) for x in rows):
        d, d2 = wd[u], wd2[u]
        if d <= 0:
            ref.append(own[u] / (1 - a) + plain[u])
            coef.append(1 / (1 - a) + 1)
            continue
        change = np.zeros(n2)
        change[: g.num_nodes] -= _transition_row(g, u) * d
        change += _transition_row(g2, u) * d2 if d2 > 0 else 0.0
        first = abs(1 - d2 / d) / (1 - a) if d2 > 0 else 0.0
        ref.append(first * own[u] + (1.0 if d2 <= 0 else 0.0) + np.sum(np.abs(change) / d * plain))
        coef.append(first + np.sum(np.abs(change)) / d)
    return np.array(ref), np.array(coef)


@pytest.mark.parametrize("cfg", [PPRConfig(topk=8, eps=1e-5), PPRConfig(topk=8, eps=0.02, lazy=True)])
def test_row_change_peaks_are_the_pushed_maxima_plus_the_push_margin(cfg):
    """Term by term: at least the maxima of the exact vectors (the push estimates lie below them), at most
    that plus ``eps`` per unit of coefficient (how far below they may lie)."""
    rng = np.random.default_rng(8)
    n = 90
    ei = rng.integers(0, n, size=(2, 300))
    g = CSRGraph.from_edge_index(ei, num_nodes=n, weights=rng.uniform(0.3, 2.0, 300), symmetrize=True,
                                 remove_self_loops=True)  # fmt: skip
    h = CSRGraph.from_edge_index(np.array([[0, 1, 2], [1, 2, 3]]), num_nodes=5, symmetrize=True)
    cases = [(h, edit_from_pairs(remove=[(0, 1)])), (h, edit_from_pairs(add=[(4, 2)]))]
    cases += [(g, make_edit(rng, g, new=False, adds=2, rems=2)), (g, make_edit(rng, g, new=True, adds=1, rems=1))]
    for old, edit in cases:
        eff = apply_edit(old, edit)
        rows = eff.changed_rows[eff.changed_rows < old.num_nodes]
        ref, coef = _separable_peaks(old, eff.graph, rows, cfg)
        peaks = row_change_peaks(old, eff.graph, rows, cfg)
        assert np.all(peaks >= ref - 1e-12)
        assert np.all(peaks <= ref + cfg.eps * coef + 1e-12)


def test_peaks_recompute_fewer_lists_and_keep_them_fresh(sbm, sbm_base):
    """With the peaks (the default) the same edits recompute fewer lists, every one of them the fresh push
    (run_sequence), and the node bound with the peaks still holds against exact PPR."""
    counts = {}
    for peaks in (False, True):
        live = LivePPRIndex(sbm_base, peaks=peaks)
        _, totals = run_sequence(live, sbm, np.random.default_rng(11), 5, SBM_CFG, new=False, adds=1, rems=1)
        counts[peaks] = totals["recomputed"]
    assert 0 < counts[True] < 0.7 * counts[False]
    a = SBM_CFG.teleport
    rng = np.random.default_rng(12)
    g = sbm
    live = LivePPRIndex(sbm_base)
    src = rng.choice(g.num_nodes, size=40, replace=False)
    for _ in range(3):
        eff = apply_edit(g, make_edit(rng, g, new=False, adds=1, rems=1))
        rows = eff.changed_rows
        coef = live._coefficients(g, eff.graph, rows)
        old, new = ppr_exact(g, src, SBM_CFG), ppr_exact(eff.graph, src, SBM_CFG)
        wd2 = _weighted_degree(eff.graph)
        what = np.where(wd2 > 0, wd2, 1.0)
        for b in range(len(src)):
            assert np.all(np.abs(new[b] - old[b]) <= what * np.sum(old[b, rows] * coef) + 1e-12)
        assert np.all(coef <= (1 - a) / a * row_change_bounds(g, eff.graph, rows)[1] + 1e-15)
        g = eff.graph


def test_peaks_are_skipped_for_an_edit_touching_many_nodes(sbm, sbm_base):
    """Past ``max(64, N / 8)`` pushed nodes the peaks are not computed: the bound of the rows alone."""
    eff = apply_edit(sbm, make_edit(np.random.default_rng(13), sbm, new=False, adds=40, rems=0))
    rows = eff.changed_rows
    assert np.all(row_change_peaks(sbm, eff.graph, rows, SBM_CFG, max_pushes=len(rows) - 1) == np.inf)
    assert np.all(np.isfinite(row_change_peaks(sbm, eff.graph, rows, SBM_CFG, max_pushes=len(rows))))
    coef = {pk: LivePPRIndex(sbm_base, peaks=pk)._coefficients(sbm, eff.graph, rows) for pk in (False, True)}
    np.testing.assert_array_equal(coef[True], coef[False])  # 80 rows > max(64, 500 // 8)
    small = apply_edit(sbm, make_edit(np.random.default_rng(13), sbm, new=False, adds=2, rems=0))
    coef = {pk: LivePPRIndex(sbm_base, peaks=pk)._coefficients(sbm, small.graph, small.changed_rows)
            for pk in (False, True)}  # fmt: skip
    assert np.all(coef[True] <= coef[False]) and np.any(coef[True] < coef[False])


def test_the_saved_inverse_is_read_until_the_first_merge(sbm, tmp_path, monkeypatch):
    """``PPRIndex.ensure_inverse`` saves the lists' inverse beside them and memory-maps it (a second open finds
    it); a live index over such a base reads it instead of building its own (the same drift and lists as one
    that builds it), and builds its own only after merging the overlay into new lists."""
    from kernels import ppr_index

    base = PPRIndex.open_or_build(tmp_path, sbm, SBM_CFG, progress=False)
    assert base.inverse is None
    ptr, pos = base.ensure_inverse()
    want_ptr, want_pos = ppr_index.inverse_lists(np.asarray(base.nodes), sbm.num_nodes)
    np.testing.assert_array_equal(ptr, want_ptr)
    np.testing.assert_array_equal(pos, want_pos)
    assert isinstance(base.inverse[1], np.ndarray) and not base.inverse[1].flags.writeable  # memory-mapped
    again = PPRIndex.open(base.path, sbm)
    built = []
    real = ppr_index.inverse_lists
    monkeypatch.setattr(pl, "inverse_lists", lambda *a: built.append(1) or real(*a))
    monkeypatch.setattr(ppr_index, "inverse_lists", lambda *a: built.append(1) or real(*a))
    np.testing.assert_array_equal(again.ensure_inverse()[1], want_pos)  # read, not built
    assert built == []
    live = LivePPRIndex(again, merge_fraction=1e9)
    plain = LivePPRIndex(PPRIndex.open(base.path, sbm), merge_fraction=1e9)  # no inverse attached: builds its own
    rng = np.random.default_rng(17)
    g = sbm
    for _ in range(3):
        eff = apply_edit(g, make_edit(rng, g, new=False))
        a = live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        b = plain.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        assert a["recomputed"] == b["recomputed"] and a["dirty"] == b["dirty"]
        np.testing.assert_array_equal(live._drift, plain._drift)
        g = eff.graph
    assert live._inv is again.inverse and len(built) == 1  # only `plain` built one
    live._merge()
    eff = apply_edit(g, make_edit(rng, g, new=False))
    live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
    assert len(built) == 2 and live._inv is not again.inverse
    # a damaged file is ignored and rebuilt; a directory that cannot be written keeps it in memory
    (base.path / "inverse_pos.bin").write_bytes(b"x")
    fresh = PPRIndex.open(base.path, sbm)
    np.testing.assert_array_equal(fresh.ensure_inverse()[1], want_pos)
    assert (base.path / "inverse_pos.bin").stat().st_size == want_pos.nbytes
    for f in ("inverse_ptr.npy", "inverse_pos.bin"):
        (base.path / f).unlink()

    def refuse(*_a):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(ppr_index.os, "replace", refuse)
    ro = PPRIndex.open(base.path, sbm)
    np.testing.assert_array_equal(ro.ensure_inverse()[1], want_pos)
    assert ro.inverse[1].flags.writeable  # in memory
    assert sorted(p.name for p in base.path.iterdir() if "inverse" in p.name) == []  # nothing left behind


def test_bounds_of_successive_edits_add_up(sbm, sbm_base):
    """Two edits that each stay under the tolerance but together exceed it recompute on the second."""
    u, v = 3, 7
    g1 = apply_edit(sbm, edit_from_pairs(add=[(u, v)]))
    g2 = apply_edit(g1.graph, edit_from_pairs(remove=[(u, v)]))
    probe = LivePPRIndex(sbm_base, tol_factor=1e9)
    probe.apply(sbm, g1.graph, g1.changed_rows, g1.new_ids)
    d1 = probe._drift.copy()
    probe.apply(g1.graph, g2.graph, g2.changed_rows, g2.new_ids)
    d2 = probe._drift.copy()
    s = int(np.argmax(d1))
    assert d2[s] > 1.5 * d1[s] > 0  # the second edit moved the same source again
    tol = (d1[s] + min(d2[s], 2 * d1[s])) / 2
    live = LivePPRIndex(sbm_base, tol_factor=tol / SBM_CFG.eps)
    assert live.apply(sbm, g1.graph, g1.changed_rows, g1.new_ids)["recomputed"] == 0
    live.apply(g1.graph, g2.graph, g2.changed_rows, g2.new_ids)
    assert s in live.last_recomputed.tolist()
    assert live._drift[s] == 0.0


# ============================================================================ compaction: the lists' drift
def test_a_compactions_lists_carry_their_drift(sbm, sbm_base, tmp_path):
    """``as_index`` (what a compaction saves) carries each list's accumulated bound, ``save``/``open`` keep it to the
    bit, and a live index over it recomputes after later edits exactly the lists the writer's index does, so a
    start from the snapshot answers as the writer (an operations tester: shaDow answers at one graph version
    differed between a writer and a restarted server). Lists taken without it (their bound reset to 0) recompute
    another set."""
    rng = np.random.default_rng(11)
    g = sbm
    writer = LivePPRIndex(sbm_base, tol_factor=8)  # lists moved by less than 8 eps keep their bound
    for _ in range(6):
        eff = apply_edit(g, make_edit(rng, g, new=False, adds=1, rems=1))
        writer.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
    snap = writer.as_index()
    assert snap.drift is not None and np.count_nonzero(snap.drift) > 0
    np.testing.assert_array_equal(snap.drift, writer._drift[: g.num_nodes])
    opened = PPRIndex.open(snap.save(tmp_path / "snap"), g)
    np.testing.assert_array_equal(opened.drift, snap.drift)
    restarted = LivePPRIndex(opened, tol_factor=8)
    no_drift = LivePPRIndex(PPRIndex(opened.config, opened.fingerprint, opened.ptr, opened.nodes, opened.scores),
                            tol_factor=8)
    differed = False
    for _ in range(8):
        eff = apply_edit(g, make_edit(rng, g, new=False, adds=1, rems=1))
        for live in (writer, restarted, no_drift):
            live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
        np.testing.assert_array_equal(restarted.last_recomputed, writer.last_recomputed)
        differed |= not np.array_equal(no_drift.last_recomputed, writer.last_recomputed)
        want = writer.lookup(np.arange(g.num_nodes), return_scores=True)
        got = restarted.lookup(np.arange(g.num_nodes), return_scores=True)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert differed, "the drift never mattered: the test does not test it"
