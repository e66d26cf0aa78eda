"""kernels.ppr_partial's dense engine (run_partial with ``num_nodes``): the same lists as the whole graph's push.

``run_partial(..., num_nodes=N)`` runs the pushes on dense state indexed by node id over the rows fetched for all
of them, a group at a time. Each list must equal :func:`kernels.ppr.ppr_topk`'s or
:func:`kernels.ppr.ppr_new_node`'s to the bit (the graphs, walks and thresholds of ``tests/test_ppr_partial.py``),
with one group or several, new nodes and existing targets in one group, and the push cap; the rows fetched are
those of pushed nodes, each once; what a push reached is what the hash-map engine reports. Pushes the engine may
not take (handed rows by hand, mixed configurations, a graph past ``DENSE_PUSH_BYTES``) keep the hash-map engine.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernels.ppr_partial as pp
from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, ppr_new_node, ppr_topk
from kernels.ppr_partial import PartialPush, dense_group, run_partial
from tests.test_ppr_partial import CASES, CONFIGS, _graph, _new_node_case, _Rows


@pytest.fixture
def engines(monkeypatch):
    """Counts the runs of each engine."""
    count = {"dense": 0, "hash": 0}
    dense, run = pp._run_dense, PartialPush.run

    def counted_dense(*a, **k):
        count["dense"] += 1
        return dense(*a, **k)

    def counted_run(self):
        count["hash"] += 1
        return run(self)

    monkeypatch.setattr(pp, "_run_dense", counted_dense)
    monkeypatch.setattr(PartialPush, "run", counted_run)
    return count


def _pushed(pushes):
    """Every node some push pushed (its estimate > 0)."""
    return np.unique(np.concatenate([ps.ids[: int(ps.meta[0])][ps.p[: int(ps.meta[0])] > 0] for ps in pushes]))


def _check_rows(rows, rounds, pushes):
    assert rounds == len(rows.asked)
    asked = np.concatenate(rows.asked) if rows.asked else np.zeros(0, dtype=np.int64)
    assert len(np.unique(asked)) == len(asked), "each row fetched once"
    assert np.isin(asked, _pushed(pushes)).all(), "only rows of pushed nodes"


@pytest.mark.parametrize("small_groups", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_dense_lists_equal_the_whole_graphs(case, ci, small_groups, engines, monkeypatch):
    spec, cfg = CASES[case], CONFIGS[ci]
    n = 900
    g = _graph(n, 3 * n, seed=case * 10 + ci, **spec)
    if small_groups:  # groups of 8: a later group pushes over rows an earlier one fetched
        monkeypatch.setattr(pp, "DENSE_GROUP_BYTES", 1)
    rows = _Rows(g)
    rng = np.random.default_rng(ci)
    targets = np.unique(np.r_[rng.choice(n, 20, replace=False), 0, n - 1])
    pushes = [PartialPush.target(t, rows.degrees(np.array([t]))[0], cfg) for t in targets.tolist()]
    asked_degrees = []

    def degrees(ids):
        asked_degrees.append(ids)
        return rows.degrees(ids)

    rounds = run_partial(pushes, rows, degrees, num_nodes=n)
    assert engines == {"dense": 1, "hash": 0}
    asked_degrees = np.concatenate(asked_degrees)
    assert len(np.unique(asked_degrees)) == len(asked_degrees), "each degree asked once in the run"
    if not small_groups:  # the sources' degrees came with the pushes
        assert not np.isin(targets, asked_degrees).any()
    ptr, nodes, scores = ppr_topk(g, targets, cfg)
    for i, ps in enumerate(pushes):
        assert ps.done and not len(ps.missing())
        got_n, got_s = ps.result()
        np.testing.assert_array_equal(got_n, nodes[ptr[i]:ptr[i + 1]])
        np.testing.assert_array_equal(got_s, scores[ptr[i]:ptr[i + 1]])
        k_n, k_s = ps.result(5)  # another k from the same state
        np.testing.assert_array_equal(k_n, nodes[ptr[i]:ptr[i + 1]][:5])
        np.testing.assert_array_equal(k_s, scores[ptr[i]:ptr[i + 1]][:5])
    _check_rows(rows, rounds, pushes)
    # what each push reached (read) and how many pushes it made: as the hash-map engine reports them
    hashed = [PartialPush.target(t, rows.degrees(np.array([t]))[0], cfg) for t in targets.tolist()]
    run_partial(hashed, _Rows(g), rows.degrees)
    for a, b in zip(pushes, hashed, strict=True):
        np.testing.assert_array_equal(a.reached(), b.reached())
        assert a.pushes == b.pushes


@pytest.mark.parametrize("case", [0, 1, 2, 4])
@pytest.mark.parametrize("lazy", [False, True])
def test_dense_new_nodes_and_targets_in_one_group(case, lazy, engines):
    """New nodes (each with its own edges and its neighbours' thresholds counting them) pushed in lockstep with
    existing targets whose pushes reach the same neighbours (which must keep the graph's thresholds)."""
    n, g, cfg, _, specs = _new_node_case(case, lazy)
    specs = [*specs, (np.arange(0, 60, 3), None)]  # and twenty neighbours
    rows = _Rows(g)
    news = [PartialPush.new_node(n, nb, w, rows.degrees, cfg) for nb, w in specs]
    targets = np.array([3, 5, 9, 27, 400])  # neighbours of the new nodes
    olds = [PartialPush.target(t, rows.degrees(np.array([t]))[0], cfg) for t in targets.tolist()]
    mixed = [x for pair in zip(news[: len(olds)], olds, strict=True) for x in pair] + news[len(olds):]
    rounds = run_partial(mixed, rows, rows.degrees, num_nodes=n)
    assert engines == {"dense": 1, "hash": 0}
    for ps, (nb, w) in zip(news, specs, strict=True):
        want_n, want_s = ppr_new_node(g, nb, w, cfg)
        got_n, got_s = ps.result()
        np.testing.assert_array_equal(got_n, want_n)
        np.testing.assert_array_equal(got_s, want_s)
    ptr, nodes, scores = ppr_topk(g, targets, cfg)
    for i, ps in enumerate(olds):
        got_n, got_s = ps.result()
        np.testing.assert_array_equal(got_n, nodes[ptr[i]:ptr[i + 1]])
        np.testing.assert_array_equal(got_s, scores[ptr[i]:ptr[i + 1]])
    _check_rows(rows, rounds, mixed)


def test_dense_push_cap_stops_at_the_same_step(engines):
    g = _graph(700, 2100, 41, weighted=True)
    cfg = PPRConfig(topk=30, eps=5e-5)
    rng = np.random.default_rng(3)
    specs = [rng.choice(700, 5) for _ in range(3)]
    rows = _Rows(g)
    pushes = [PartialPush.new_node(700, nb, None, rows.degrees, cfg, max_pushes=25) for nb in specs]
    run_partial(pushes, rows, rows.degrees, num_nodes=700)
    assert engines == {"dense": 1, "hash": 0}
    for ps, nb in zip(pushes, specs, strict=True):
        assert ps.pushes == 25
        want_n, want_s = ppr_new_node(g, nb, None, cfg, max_pushes=25)
        got_n, got_s = ps.result()
        np.testing.assert_array_equal(got_n, want_n)
        np.testing.assert_array_equal(got_s, want_s)


def test_pushes_the_dense_engine_may_not_take_keep_their_state(engines, monkeypatch):
    g = _graph(300, 900, 7, weighted=False)
    rows = _Rows(g)
    cfg = PPRConfig(topk=12, eps=1e-4)
    deg = rows.degrees

    def check(pushes):
        ptr, nodes, scores = ppr_topk(g, [int(ps.ids[0]) for ps in pushes], pushes[0].cfg)
        for i, ps in enumerate(pushes):
            if ps.cfg == pushes[0].cfg:
                np.testing.assert_array_equal(ps.result()[0], nodes[ptr[i]:ptr[i + 1]])
                np.testing.assert_array_equal(ps.result()[1], scores[ptr[i]:ptr[i + 1]])

    # a push handed a row by hand
    by_hand = [PartialPush.target(t, deg(np.array([t]))[0], cfg) for t in (5, 17)]
    ptr, cols, ws = rows(np.array([5]))
    by_hand[0].add_rows(np.array([5]), ptr, cols, ws, deg(cols))
    run_partial(by_hand, rows, deg, num_nodes=300)
    check(by_hand)
    # a push run by hand
    ran = [PartialPush.target(t, deg(np.array([t]))[0], cfg) for t in (5, 17)]
    ran[1].run()
    run_partial(ran, rows, deg, num_nodes=300)
    check(ran)
    # two configurations
    two = [PartialPush.target(5, deg(np.array([5]))[0], cfg),
           PartialPush.target(17, deg(np.array([17]))[0], PPRConfig(topk=12, eps=2e-4))]
    run_partial(two, rows, deg, num_nodes=300)
    check(two)
    # no num_nodes, or a graph past DENSE_PUSH_BYTES
    plain = [PartialPush.target(t, deg(np.array([t]))[0], cfg) for t in (5, 17)]
    run_partial(plain, rows, deg)
    check(plain)
    monkeypatch.setattr(pp, "DENSE_PUSH_BYTES", 25 * 301)
    big = [PartialPush.target(t, deg(np.array([t]))[0], cfg) for t in (5, 17)]
    run_partial(big, rows, deg, num_nodes=300)
    check(big)
    assert engines["dense"] == 0 and engines["hash"] > 0
    # one more node of room: dense
    monkeypatch.setattr(pp, "DENSE_PUSH_BYTES", 25 * 302)
    fits = [PartialPush.target(t, deg(np.array([t]))[0], cfg) for t in (5, 17)]
    run_partial(fits, rows, deg, num_nodes=300)
    check(fits)
    assert engines["dense"] == 1


def test_dense_group_sizes(monkeypatch):
    per = 25 * (13752 + 2)
    assert dense_group(100, 13752) == min(100, (8 << 20) // per)
    assert dense_group(3, 13752) == 3
    assert dense_group(0, 13752) == 0
    assert dense_group(100, 2_000_000) == 0  # past DENSE_PUSH_BYTES: the hash-map engine
    assert dense_group(100, 150_000) == 8  # a group of 8 at least
    monkeypatch.setattr(pp, "DENSE_GROUP_BYTES", 1 << 40)
    assert dense_group(100, 13752) == 100


@pytest.mark.parametrize("case", [0, 1, 3])
@pytest.mark.parametrize("lazy", [False, True])
def test_dense_pushes_read_stored_rows_in_place(case, lazy, engines):
    """``stored``: the pushes read a row arena's rows in place and fetch only what it lacks and the rows an update
    changed (``own``): the same lists as the whole graph's push, fewer fetch rounds (none when the arena holds every
    row the pushes read), and a changed row read from the fetch, not from the arena's stale copy."""
    from kernels.row_arena import RowArena

    n, g, cfg, _, specs = _new_node_case(case, lazy)
    rows = _Rows(g)
    deg = rows.degrees(np.arange(n))
    targets = np.array([0, 3, 5, 400])

    def pushes(graph_rows):
        news = [PartialPush.new_node(n, nb, w, graph_rows.degrees, cfg) for nb, w in specs]
        return news + [PartialPush.target(t, graph_rows.degrees(np.array([t]))[0], cfg) for t in targets.tolist()]

    def check(done, graph):
        for ps, (nb, w) in zip(done[:len(specs)], specs, strict=True):
            for got, want in zip(ps.result(), ppr_new_node(graph, nb, w, cfg), strict=True):
                np.testing.assert_array_equal(got, want)
        ptr, nodes, scores = ppr_topk(graph, targets, cfg)
        for i, ps in enumerate(done[len(specs):]):
            got_n, got_s = ps.result()
            np.testing.assert_array_equal(got_n, nodes[ptr[i]:ptr[i + 1]])
            np.testing.assert_array_equal(got_s, scores[ptr[i]:ptr[i + 1]])

    arena = RowArena(n, 1 << 24, g.weights is not None)
    half = np.arange(0, n, 2)
    p0, c0, w0 = rows(half)
    arena.add(half, np.diff(p0), c0, w0)  # every other row held: the others are fetched
    plain, fetched = pushes(rows), _Rows(g)
    base_rounds = run_partial(plain, _Rows(g), rows.degrees, num_nodes=n)
    done = pushes(rows)
    rounds = run_partial(done, fetched, rows.degrees, num_nodes=n, stored=(arena, deg, np.zeros(0, np.int64)))
    check(done, g)
    assert rounds <= base_rounds and np.all(np.concatenate(fetched.asked) % 2 == 1), "only rows the arena lacks"
    for a, b in zip(done, plain, strict=True):
        np.testing.assert_array_equal(a.reached(), b.reached())
    every = np.arange(n)
    pe, ce, we = rows(every)
    arena.add(every, np.diff(pe), ce, we)
    fetched = _Rows(g)
    done = pushes(rows)
    assert run_partial(done, fetched, rows.degrees, num_nodes=n, stored=(arena, deg, np.zeros(0, np.int64))) == 0
    check(done, g)
    # an update: node 3 loses its first edge (both directions), the arena keeps the stored rows
    v = 3
    u = int(g.indices[g.indptr[v]])
    keep = ~(((np.repeat(np.arange(n), np.diff(g.indptr)) == v) & (g.indices == u))
             | ((np.repeat(np.arange(n), np.diff(g.indptr)) == u) & (g.indices == v)))
    src = np.repeat(np.arange(n), np.diff(g.indptr))[keep]
    edited = CSRGraph(indptr=np.r_[0, np.cumsum(np.bincount(src, minlength=n))].astype(np.int64),
                      indices=g.indices[keep], weights=None if g.weights is None else g.weights[keep], num_nodes=n)
    now = _Rows(edited)
    own = np.unique([u, v]).astype(np.int64)
    fetched = _Rows(edited)
    done = pushes(now)
    run_partial(done, fetched, now.degrees, num_nodes=n, stored=(arena, now.degrees(np.arange(n)), own))
    check(done, edited)
    asked = np.concatenate(fetched.asked) if fetched.asked else np.zeros(0, np.int64)
    assert np.isin(asked, own).all(), "the changed rows only"
