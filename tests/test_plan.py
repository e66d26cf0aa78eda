"""Execution plans of plain models (kernels.plan): the same numbers as the full graph, far fewer rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.datasets import synthetic_sbm
from kernels.graph import CSRGraph
from kernels.plan import ExactPathEdges, edges_on_paths, edges_on_two_layer_paths, execution_plan
from kernels.spmm import sampled_csr
from kernels.subgraph import induced_batch, lhop_nodes
from models import FeatureNorm, build_model

from .test_models import _one_thread  # noqa: F401 (the module-wide one-thread fixture)


@pytest.fixture(scope="module")
def ds():
    # degree-skewed: many rows above widths 2..8, some far above (hubs)
    return synthetic_sbm(500, num_classes=4, avg_degree=12, num_features=10, seed=7)


def _weighted(ds) -> CSRGraph:
    g = ds.graph
    w = np.random.default_rng(1).uniform(0.2, 2.0, g.num_edges).astype(np.float32)
    return CSRGraph(g.indptr, g.indices, w, g.num_nodes)


def _model(arch: str, ds, layers: int):
    torch.manual_seed(layers)
    norm = FeatureNorm(ds.num_features, "standard").fit(ds.x, ds.split("train"))
    return build_model({"arch": arch, "in_dim": ds.num_features, "hidden": 8, "num_classes": ds.num_classes,
                        "layers": layers, "dropout": 0.5}, norm=norm).eval()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("arch", "layers"), [("gcn", 2), ("gcn", 3), ("sage", 2), ("sage", 3)])
@pytest.mark.parametrize("width", [0, 2, 5, 8, 1000])
def test_plan_equals_full_graph_and_lhop_subgraphs(ds, arch, layers, width, weighted):
    g = _weighted(ds) if weighted else ds.graph
    m = _model(arch, ds, layers)
    x = torch.from_numpy(ds.x)
    targets = np.array([3, 0, 499, 250, 17, 42, 301, 8])
    with torch.no_grad():
        full = m(g, x, width=width or None)[torch.from_numpy(targets)]
        plan = execution_plan(g, targets, layers, width)
        deg = m.norm_degrees_for(g, plan.node_ids)
        got, emb = m.forward_plan(plan, m.project(x[torch.from_numpy(plan.node_ids)]), deg)
        ptr, nodes = lhop_nodes(g, targets, layers)
        b = induced_batch(g, ptr, nodes)
        sub, sub_emb = m.forward_batch(b, x[torch.from_numpy(b.node_ids)], width or None, "fastrand",
                                       m.norm_degrees_for(g, b.node_ids))
    assert got.shape == (len(targets), ds.num_classes) and emb.shape == (len(targets), m.embedding_dim)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
    if width == 0 or width >= int(g.degrees.max()):
        # per-target induced subgraphs agree when nothing is sampled; sampled, they differ: their
        # rows list columns in local (discovery) order, so fastrand picks other edges there
        torch.testing.assert_close(got, sub, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(emb, sub_emb, rtol=1e-5, atol=1e-5)
    # it computed fewer rows than the per-target subgraphs hold, and nested prefixes
    assert list(plan.sizes) == sorted(plan.sizes, reverse=True) and plan.sizes[-1] == len(targets)
    assert plan.sizes[0] <= len(np.unique(nodes)) and plan.sizes[1] < b.graph.num_nodes
    assert np.array_equal(plan.node_ids[: len(targets)], targets)


def test_sampling_shrinks_the_plan(ds):
    targets = np.arange(0, 500, 7)
    sizes = {w: execution_plan(ds.graph, targets, 2, w).sizes for w in (0, 2, 4)}
    assert sizes[2][0] < sizes[4][0] < sizes[0][0]
    assert sizes[2][1] <= len(targets) * 3  # each target keeps at most 2 edges at layer 2


def _paths_brute(g: CSRGraph, width: int, t: int, layers: int) -> tuple[int, int]:
    """(kept, exact) edges on target t's path, by Python sets over the full graph's sampled matrix."""
    mat = sampled_csr(g, width or None)
    crow, col = mat.crow_indices().numpy(), mat.col_indices().numpy()
    kept_of = np.diff(crow)
    deg = g.degrees

    def walk(rows_ptr, rows_col, counts):
        frontier, total = {t}, 0
        for level in range(layers):
            total += sum(int(counts[u]) for u in frontier)
            if level + 1 < layers:
                frontier = frontier | {int(v) for u in frontier for v in rows_col[rows_ptr[u]:rows_ptr[u + 1]]}
        return total

    return walk(crow, col, kept_of), walk(g.indptr, g.indices, deg)


@pytest.mark.parametrize(("layers", "width"), [(2, 0), (2, 3), (3, 2), (3, 6)])
def test_edges_on_paths_match_a_brute_force_walk(ds, layers, width):
    g = ds.graph
    targets = np.array([1, 77, 250, 499, 3])
    plan = execution_plan(g, targets, layers, width)
    kept, total = edges_on_paths(plan, g, width)
    for i, t in enumerate(targets):
        assert (int(kept[i]), int(total[i])) == _paths_brute(g, width, int(t), layers), t
        # a one-target plan counts from its CSR prefix sums (kept_per_target's shortcut)
        alone = execution_plan(g, np.array([t]), layers, width)
        assert alone.kept_per_target().tolist() == [int(kept[i])], t
    assert np.all(kept <= total) and (width == 0) == bool(np.all(kept == total))


@pytest.mark.parametrize("width", [0, 1, 3, 8, 1000])
def test_two_layer_path_edges_from_the_last_layers_plan(ds, width):
    """The counts a server reports when it runs a 2-layer model's last layer alone (its first layer's
    rows kept per node) are those of the whole 2-layer plan, with and without the exact memo."""
    g = ds.graph
    memo = ExactPathEdges(g, 2)
    for targets in (np.array([1]), np.array([499]), np.array([1, 77, 250, 499, 3]), np.arange(0, 500, 7)):
        last = execution_plan(g, targets, 1, width)
        want = edges_on_paths(execution_plan(g, targets, 2, width), g, width)
        assert np.array_equal(edges_on_two_layer_paths(last, g, width), want)
        assert np.array_equal(edges_on_two_layer_paths(last, g, width, memo), want)
        for i, t in enumerate(targets[:3]):
            assert (int(want[0][i]), int(want[1][i])) == _paths_brute(g, width, int(t), 2)
    with pytest.raises(ValueError, match="one-layer plan"):
        edges_on_two_layer_paths(execution_plan(g, np.array([1]), 2, width), g, width)
    with pytest.raises(ValueError, match="another graph or depth"):
        edges_on_two_layer_paths(execution_plan(g, np.array([1]), 1, 3), g, 3, ExactPathEdges(g, 3))


@pytest.mark.parametrize("layers", [0, 2, 3])
def test_exact_path_edges_memo_matches_the_walk_and_fills_once(ds, layers):
    g = ds.graph
    memo = ExactPathEdges(g, layers)
    first = np.array([1, 77, 250, 499, 3])
    plan = execution_plan(g, first, layers, 4)
    kept, total = edges_on_paths(plan, g, 4, memo)
    assert np.array_equal((kept, total), edges_on_paths(plan, g, 4))  # same figures as without the memo
    if layers:
        assert [int(x) for x in total] == [_paths_brute(g, 4, int(t), layers)[1] for t in first]
    assert np.all(memo._memo[first] >= 0) and int((memo._memo >= 0).sum()) == len(first)
    # a later batch overlapping the first: the known nodes come from the memo, the new ones are computed
    second = np.array([3, 250, 10, 11])
    plan2 = execution_plan(g, second, layers, 2)
    assert np.array_equal(edges_on_paths(plan2, g, 2, memo), edges_on_paths(plan2, g, 2))
    assert int((memo._memo >= 0).sum()) == len(set(first) | set(second))
    memo.fill(chunk=64)
    assert np.all(memo._memo >= 0)
    everyone = np.arange(g.num_nodes)
    assert np.array_equal(memo(everyone), edges_on_paths(execution_plan(g, everyone, layers, 4), g, 4)[1])
    with pytest.raises(ValueError, match="another graph or depth"):
        edges_on_paths(execution_plan(g, second, layers + 1, 2), g, 2, memo)


def test_plan_arguments_are_checked(ds):
    with pytest.raises(ValueError, match="distinct"):
        execution_plan(ds.graph, np.array([1, 1]), 2, 0)
    with pytest.raises(ValueError, match=r"\[0, 500\)"):
        execution_plan(ds.graph, np.array([500]), 2, 0)
    with pytest.raises(ValueError, match=r"\[0, 500\)"):
        execution_plan(ds.graph, np.array([4, -1]), 2, 0)
    m = _model("gcn", ds, 2)
    plan = execution_plan(ds.graph, np.array([1, 2]), 3, 0)
    with pytest.raises(ValueError, match="3 layers, the model 2"):
        m.forward_plan(plan, torch.zeros(plan.sizes[0], 8))
    empty = execution_plan(ds.graph, np.zeros(0, np.int64), 2, 4)
    assert empty.sizes == (0, 0, 0) and len(empty.kept_per_target()) == 0


@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
@pytest.mark.parametrize("width", [0, 1, 3, 8, 577, 1200])
def test_kept_edges_follow_sample_positions(strategy, width):
    # the plan's compiled row sampler against its specification, kernels.spmm.sample_positions,
    # on degrees around the width and multiples of 577 (where fastrand's correction term applies)
    from kernels.plan import _kept_edges
    from kernels.spmm import sample_positions

    rng = np.random.default_rng(width)
    deg = np.concatenate([rng.integers(0, 40, 200), [0, 1, width, width + 1, 577, 1154, 1731, 2 * 577 + 1, 5000]])
    deg = deg.astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(deg)[:-1]]).astype(np.int64) + 7
    kept = np.minimum(deg, width) if width else deg
    got = np.empty(int(kept.sum()), dtype=np.int64)
    assert _kept_edges(starts, deg, kept, width, strategy == "fastrand", got) == len(got)
    rows = np.repeat(np.arange(len(deg)), kept)
    t = np.arange(len(got)) - np.repeat(np.cumsum(kept) - kept, kept)
    pos = sample_positions(torch.from_numpy(deg[rows]), torch.from_numpy(t), width, strategy).numpy()
    np.testing.assert_array_equal(got, starts[rows] + pos)
    for r in np.flatnonzero(deg > 0):  # distinct edges inside each row
        part = got[rows == r]
        assert len(np.unique(part)) == len(part) and part.min() >= starts[r] and part.max() < starts[r] + deg[r]
