"""kernels.ppr_partial: pushes over rows handed in on demand make the whole graph's steps.

Each push here gets its rows from a graph in memory through ``run_partial`` (as a replica gets them from Redis)
with the degrees the in-memory push uses, and its list must equal :func:`kernels.ppr.ppr_topk`'s or
:func:`kernels.ppr.ppr_new_node`'s to the bit: unweighted and weighted graphs, lazy walks, a relative threshold,
nodes without edges, edges of weight 0, a hub longer than the queue, the push cap. The rows it asked for must be
those of the nodes it pushed, never every node it reached.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, ppr_new_node, ppr_topk
from kernels.ppr_partial import PartialPush, run_partial
from kernels.ppr_push import _weighted_degree


def _graph(n: int, m: int, seed: int, *, weighted: bool, hub: int = 0, isolated: int = 0,
           zero_weights: bool = False) -> CSRGraph:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n - isolated, m)
    dst = rng.integers(0, n - isolated, m)
    if hub:  # node 0 linked to `hub` others: a row longer than the push's first queue
        src = np.r_[src, np.zeros(hub, dtype=np.int64)]
        dst = np.r_[dst, rng.choice(np.arange(1, n - isolated), hub, replace=False)]
    w = None
    if weighted:
        w = rng.uniform(0.1, 4.0, len(src)).astype(np.float32)
        if zero_weights:
            w[rng.random(len(w)) < 0.1] = 0.0
    return CSRGraph.from_edge_index(np.stack([src, dst]), n, w, symmetrize=True, remove_self_loops=True)


class _Rows:
    """The rows of a graph in memory, as a replica's store hands them out, counting what was asked."""

    def __init__(self, g: CSRGraph) -> None:
        self.g = g
        self.asked: list[np.ndarray] = []

    def __call__(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        assert np.all(np.diff(ids) > 0), "ids sorted and distinct"
        self.asked.append(ids)
        g = self.g
        lens = g.indptr[ids + 1] - g.indptr[ids]
        ptr = np.r_[0, np.cumsum(lens)].astype(np.int64)
        take = np.concatenate([np.arange(g.indptr[v], g.indptr[v + 1]) for v in ids]) if len(ids) else \
            np.zeros(0, dtype=np.int64)
        cols = g.indices[take].astype(np.int64)
        return ptr, cols, None if g.weights is None else g.weights[take].astype(np.float64)

    def degrees(self, ids: np.ndarray) -> np.ndarray:
        return _weighted_degree(self.g)[ids]


CASES = [
    dict(weighted=False),
    dict(weighted=True),
    dict(weighted=True, zero_weights=True),
    dict(weighted=False, hub=600),
    dict(weighted=False, isolated=5),
]
CONFIGS = [PPRConfig(topk=24, eps=1e-4), PPRConfig(topk=40, eps=2e-5, lazy=True),
           PPRConfig(topk=16, eps=1e-4, threshold=0.05, alpha=0.25)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_partial_pushes_equal_the_whole_graphs_lists(case, ci):
    spec, cfg = CASES[case], CONFIGS[ci]
    n = 900
    g = _graph(n, 3 * n, seed=case * 10 + ci, **spec)
    rows = _Rows(g)
    rng = np.random.default_rng(ci)
    targets = np.unique(np.r_[rng.choice(n, 12, replace=False), 0, n - 1])  # the hub and, where any, an isolated node
    pushes = [PartialPush.target(t, rows.degrees(np.array([t]))[0], cfg) for t in targets.tolist()]
    rounds = run_partial(pushes, rows, rows.degrees)
    ptr, nodes, scores = ppr_topk(g, targets, cfg)
    for i, ps in enumerate(pushes):
        got_n, got_s = ps.result()
        np.testing.assert_array_equal(got_n, nodes[ptr[i]:ptr[i + 1]])
        np.testing.assert_array_equal(got_s, scores[ptr[i]:ptr[i + 1]])
    # one fetch per round for every push, each row fetched once in the run
    assert rounds == len(rows.asked)
    asked = np.concatenate(rows.asked)
    assert len(np.unique(asked)) == len(asked)
    held = reached = 0
    for ps in pushes:  # each push holds the rows of the nodes it pushed, a part of the nodes it reached
        ns = int(ps.meta[0])
        has_row = ps.rl[:ns] >= 0
        assert not np.any(has_row & (ps.p[:ns] <= 0))
        held += int(has_row.sum())
        reached += ns
    assert held < reached


def _new_node_case(case: int, lazy: bool):
    """``(n, graph, cfg, rng, specs)`` of the new-node tests: a 700-node graph of ``CASES[case]`` and new nodes'
    ``(neighbours, weights)``: one neighbour, random ones, weighted ones, none, a repeated neighbour."""
    n = 700
    g = _graph(n, 3 * n, seed=40 + case, **CASES[case])
    cfg = PPRConfig(topk=30, eps=5e-5, lazy=lazy)
    rng = np.random.default_rng(case)
    specs = [([3], None), (rng.choice(n, 6), None), (rng.choice(n, 4), rng.uniform(0.0, 3.0, 4)), ([], None),
             ([5, 5, 9], [1.0, 2.0, 0.5])]
    return n, g, cfg, rng, specs


@pytest.mark.parametrize("case", [0, 1, 2, 4])
@pytest.mark.parametrize("lazy", [False, True])
def test_partial_new_node_equals_ppr_new_node(case, lazy):
    n, g, cfg, rng, specs = _new_node_case(case, lazy)
    for nb, w in specs:
        want_n, want_s = ppr_new_node(g, nb, w, cfg)
        rows = _Rows(g)
        ps = PartialPush.new_node(n, nb, w, rows.degrees, cfg)
        run_partial([ps], rows, rows.degrees)
        got_n, got_s = ps.result()
        np.testing.assert_array_equal(got_n, want_n)
        np.testing.assert_array_equal(got_s, want_s)
    # the push cap stops both at the same step
    nb = rng.choice(n, 5)
    want_n, want_s = ppr_new_node(g, nb, None, cfg, max_pushes=25)
    rows = _Rows(g)
    ps = PartialPush.new_node(n, nb, None, rows.degrees, cfg, max_pushes=25)
    run_partial([ps], rows, rows.degrees)
    assert ps.pushes == 25
    got_n, got_s = ps.result()
    np.testing.assert_array_equal(got_n, want_n)
    np.testing.assert_array_equal(got_s, want_s)


def test_partial_push_checks_its_input():
    g = _graph(50, 100, 1, weighted=False)
    rows = _Rows(g)
    cfg = PPRConfig(topk=8)
    with pytest.raises(ValueError, match="existing ids"):
        PartialPush.new_node(50, [50], None, rows.degrees, cfg)
    with pytest.raises(ValueError, match="finite and >= 0"):
        PartialPush.new_node(50, [1], [-1.0], rows.degrees, cfg)
    ps = PartialPush.target(3, rows.degrees(np.array([3]))[0], cfg)
    ps.run()
    np.testing.assert_array_equal(ps.missing(), [3])  # paused before its first push: the source's row
    with pytest.raises(RuntimeError, match="waits for rows"):
        ps.result()


def test_rows_of_nodes_not_reached_are_left_out():
    """A row handed in for a node the push has not reached (or twice) changes nothing: the list is the same."""
    g = _graph(300, 900, 7, weighted=False)
    rows = _Rows(g)
    cfg = PPRConfig(topk=12, eps=1e-4)
    ps = PartialPush.target(5, rows.degrees(np.array([5]))[0], cfg)
    far = np.array([7, 123, 299])
    ptr, cols, ws = rows(far)
    ps.add_rows(far, ptr, cols, ws, rows.degrees(cols))  # none reached yet: ignored
    assert int(ps.meta[0]) == 1
    run_partial([ps], rows, rows.degrees)
    ptr, cols, ws = rows(np.array([5]))
    ps.add_rows(np.array([5]), ptr, cols, ws, rows.degrees(cols))  # held already
    _, want_n, want_s = ppr_topk(g, [5], cfg)
    got_n, got_s = ps.result()
    np.testing.assert_array_equal(got_n, want_n)
    np.testing.assert_array_equal(got_s, want_s)
