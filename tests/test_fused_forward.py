"""The compiled forwards (kernels.fused_forward) against their specifications: PlainGNN.forward_plan for
plain models, ShadowGNN.forward_batch_projected for shaDow models."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from kernels.fused_forward import StackParams, plan_forward_cpu, shadow_forward_cpu
from kernels.graph import CSRGraph
from kernels.plan import execution_plan
from kernels.subgraph import induced_batch, lhop_nodes
from models import FeatureNorm, build_model
from models.base import gcn_dinv32

from .test_models import _one_thread  # noqa: F401 (the module-wide one-thread fixture)
from .test_plan import _model, _weighted, ds  # noqa: F401 (the module's dataset fixture)


def _with_isolated(g: CSRGraph) -> CSRGraph:
    """``g`` plus three nodes without edges (rows with k = 0 at every layer)."""
    indptr = np.concatenate([g.indptr, np.full(3, g.indptr[-1])])
    return CSRGraph(indptr, g.indices, g.weights, g.num_nodes + 3)


def _compare(m, g, x, targets, width, strategy="fastrand"):
    plan = execution_plan(g, targets, m.layers, width, strategy)
    with torch.no_grad():
        table = m.project(x)
        deg = m.norm_degrees_for(g, plan.node_ids)
        want, want_emb = m.forward_plan(plan, table[torch.from_numpy(plan.node_ids)], deg)
    dinv = gcn_dinv32(g) if m.arch == "gcn" else None
    _check(plan_forward_cpu(plan, m.fused_params(), table.numpy(), dinv), want, want_emb, m)


def _check(got, want, want_emb, m):
    logits, probs, labels, emb = got
    want_p = torch.softmax(want, dim=1)
    b = len(want)
    assert logits.shape == (b, m.num_classes) and emb.shape == (b, m.embedding_dim)
    assert logits.dtype == probs.dtype == emb.dtype == np.float32 and labels.dtype == np.int64
    np.testing.assert_allclose(logits, want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(emb, want_emb.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(probs, want_p.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    # the arg-max of the probabilities; a near-tie may go either way between two roundings
    top2 = np.sort(want_p.numpy(), axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-5
    assert np.array_equal(labels[clear], want_p.argmax(dim=1).numpy()[clear])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("arch", "layers"), [("gcn", 2), ("gcn", 3), ("sage", 2), ("sage", 3)])
@pytest.mark.parametrize("width", [0, 1, 2, 5, 1000])
@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
def test_compiled_forward_equals_forward_plan(ds, arch, layers, width, weighted, strategy):  # noqa: F811
    g = _with_isolated(_weighted(ds) if weighted else ds.graph)
    x = torch.from_numpy(np.concatenate([ds.x, np.random.default_rng(2).normal(size=(3, ds.num_features))
                                         .astype(np.float32)]))
    m = _model(arch, ds, layers)
    rng = np.random.default_rng(layers * 100 + width)
    targets = np.concatenate([rng.choice(ds.graph.num_nodes, 12, replace=False), [g.num_nodes - 2]])
    _compare(m, g, x, targets, width, strategy)


@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_compiled_forward_one_target_and_every_node(ds, arch):  # noqa: F811
    m = _model(arch, ds, 2)
    x = torch.from_numpy(ds.x)
    _compare(m, ds.graph, x, np.array([7]), 4)
    _compare(m, ds.graph, x, np.arange(ds.graph.num_nodes)[::-1].copy(), 3)  # every node, reversed


def test_compiled_forward_checks_its_arguments(ds):  # noqa: F811
    m = _model("gcn", ds, 2)
    x = torch.from_numpy(ds.x)
    with torch.no_grad():
        table = m.project(x).numpy()
    params = m.fused_params()
    dinv = gcn_dinv32(ds.graph)
    with pytest.raises(ValueError, match="3 layers, expected 2"):
        plan_forward_cpu(execution_plan(ds.graph, np.array([1]), 3, 0), params, table, dinv)
    plan = execution_plan(ds.graph, np.array([1, 2]), 2, 0)
    with pytest.raises(ValueError, match="float32"):
        plan_forward_cpu(plan, params, table.astype(np.float64), dinv)
    with pytest.raises(ValueError, match=r"\[N, 8\]"):
        plan_forward_cpu(plan, params, table[:, :4].copy(), dinv)
    with pytest.raises(ValueError, match="gcn needs dinv"):
        plan_forward_cpu(plan, params, table, None)
    with pytest.raises(ValueError, match="one transform"):
        StackParams.pack(0, [np.zeros((8, 10), np.float32)], [None, None], [8, 4])
    with pytest.raises(ValueError, match="transform of 8 rows for output width 4"):
        StackParams.pack(0, [np.zeros((8, 10), np.float32)], [None], [4])  # gcn: T width = output width


def _shadow(backbone: str, ds, layers: int, pool: str):  # noqa: F811
    torch.manual_seed(layers)
    norm = FeatureNorm(ds.num_features, "standard").fit(ds.x, ds.split("train"))
    return build_model({"arch": f"shadow-{backbone}", "backbone": backbone, "in_dim": ds.num_features, "hidden": 8,
                        "num_classes": ds.num_classes, "layers": layers, "dropout": 0.5, "pool": pool},
                       norm=norm).eval()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("backbone", "layers", "pool"), [("gcn", 2, "mean"), ("gcn", 3, "none"), ("gcn", 1, "max"),
                                                          ("sage", 2, "mean+max"), ("sage", 3, "mean"),
                                                          ("sage", 1, "none")])
@pytest.mark.parametrize("width", [0, 1, 3, 1000])
@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
def test_compiled_shadow_forward_equals_the_torch_one(ds, backbone, layers, pool, width, weighted,  # noqa: F811
                                                      strategy):
    g = _with_isolated(_weighted(ds) if weighted else ds.graph)
    x = torch.from_numpy(np.concatenate([ds.x, np.random.default_rng(2).normal(size=(3, ds.num_features))
                                         .astype(np.float32)]))
    m = _shadow(backbone, ds, layers, pool)
    rng = np.random.default_rng(layers * 10 + width)
    targets = np.concatenate([rng.choice(ds.graph.num_nodes, 9, replace=False), [g.num_nodes - 1, 4]])
    ptr, nodes = lhop_nodes(g, targets, 2)  # any induced subgraphs: 2-hop balls, one of a lone node
    batch = induced_batch(g, ptr, nodes)
    with torch.no_grad():
        table = m.project(x)
        want, want_emb = m.forward_batch_projected(batch, table[torch.from_numpy(batch.node_ids)], width or None,
                                                   strategy)
    got = shadow_forward_cpu(batch, m.fused_params(), table.numpy(), width or None, strategy)
    _check(got, want, want_emb, m)


def test_compiled_shadow_forward_checks_its_arguments(ds):  # noqa: F811
    m = _shadow("gcn", ds, 2, "mean")
    batch = induced_batch(ds.graph, *lhop_nodes(ds.graph, np.array([1]), 1))
    with torch.no_grad():
        table = m.project(torch.from_numpy(ds.x)).numpy()
    with pytest.raises(ValueError, match="no readout"):
        shadow_forward_cpu(batch, _model("gcn", ds, 2).fused_params(), table, 2)
    with pytest.raises(ValueError, match="float32"):
        shadow_forward_cpu(batch, m.fused_params(), table.astype(np.float64), 2)
    w = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="classifier takes 8 inputs, the readout has 16"):
        StackParams.pack(0, [np.zeros((8, 10), np.float32)], [None], [8], ["mean"], (w, None))


def test_a_table_that_is_not_contiguous_is_refused_with_a_message():
    """The compiled forwards sum table rows in vectors (kernels.lanes): a strided or Fortran-order table gets
    a ValueError naming the fix, not a numba typing error."""
    from kernels.fused_forward import _check_table

    _check_table(np.zeros((5, 4), np.float32), 4)
    for table in (np.zeros((5, 8), np.float32)[:, :4], np.asfortranarray(np.zeros((5, 4), np.float32))):
        with pytest.raises(ValueError, match="C-contiguous"):
            _check_table(table, 4)


def _benchmark(name: str):
    """``benchmarks/<name>.py`` loaded as a module (the folder is not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fused_benchmark_runs_on_a_repository(tiny_repo, capsys):
    """benchmarks/fused.py end to end on the test repository: one row per model, setting and batch size."""
    mod = _benchmark("fused")
    assert mod.main(["--repo", str(tiny_repo), "--models", "gcn,shadow", "--batches", "1,3", "--sets", "2",
                     "--rounds", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gcn") or line.startswith("| shadow")]
    assert len(rows) == 8  # 2 models x 2 settings x 2 batch sizes
    cells = [[c.strip() for c in r.strip(" |").split("|")] for r in rows]
    assert all(float(c[6]) > 0 for c in cells)  # torch / compiled
    # a plain 2-layer model also without its activation cache (whole plan / cached); shaDow has none
    assert all(float(c[8]) > 0 if c[0] == "gcn" else c[7:9] == ["-", "-"] for c in cells)
    assert all(len(c) == 11 and float(c[9]) > 0 and float(c[10]) > 0 for c in cells)  # served, torch / served


def test_fused_benchmark_times_a_base_revision_beside_this_tree(tiny_repo, capsys):
    """--base REV: the compiled path with kernels/fused_forward.py as committed at REV in the same rounds
    (two more columns); serve.paths calls this tree's functions again afterwards."""
    import shutil
    import subprocess
    from pathlib import Path

    import serve.paths as paths

    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse", "HEAD"], cwd=root,
                                                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    before = (paths.plan_forward_cpu, paths.plan_outer_cpu, paths.shadow_forward_cpu)
    mod = _benchmark("fused")
    assert mod.main(["--repo", str(tiny_repo), "--models", "gcn,shadow", "--batches", "2", "--sets", "2",
                     "--rounds", "1", "--base", "HEAD"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gcn") or line.startswith("| shadow")]
    assert len(rows) == 4
    for r in rows:
        cells = [c.strip() for c in r.strip(" |").split("|")]
        assert len(cells) == 13 and float(cells[11]) > 0 and float(cells[12]) > 0, r
    assert (paths.plan_forward_cpu, paths.plan_outer_cpu, paths.shadow_forward_cpu) == before
    assert sys.modules["kernels._fused_forward_at_base"].shadow_forward_cpu is not before[2]


def test_inline_benchmark_runs_on_a_repository(tiny_repo, capsys):
    """benchmarks/inline.py end to end on the test repository: one row per round and setting."""
    mod = _benchmark("inline")
    assert mod.main(["--repo", str(tiny_repo), "--models", "gcn", "--concurrency", "2", "--seconds", "0.3",
                     "--rounds", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gcn")]
    assert [r.split("|")[4].strip() for r in rows] == ["off", "8", "256"]  # the default settings, round 1's order
    assert all(float(r.split("|")[5].replace(",", "")) > 0 for r in rows)


def test_device_split_benchmark_runs_on_a_repository(tiny_repo, capsys):
    """benchmarks/device_split.py end to end on the test repository (the CPU variants without a GPU): the
    resident variant's batches take the resident paths."""
    mod = _benchmark("device_split")
    assert mod.main(["--repo", str(tiny_repo), "--models", "gcn,shadow", "--batches", "1,5", "--sets", "2",
                     "--rounds", "1", "--variants", "cpu,cpu-resident,cuda"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| gcn", "| shadow"))]
    assert len(rows) == 4  # 2 models x 2 batch sizes
    for r in rows:
        cells = [c.strip() for c in r.split("|")]
        assert float(cells[4]) > 0 and float(cells[5]) > 0 and float(cells[6]) > 0  # cpu, cpu-resident, ratio
        want = "plain-resident" if cells[1] == "gcn" else "shadow-resident"
        assert f"cpu-resident: {want}" in cells[7], r


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("arch", "layers"), [("gcn", 2), ("gcn", 3), ("sage", 2), ("sage", 3)])
@pytest.mark.parametrize("width", [0, 1, 2, 5, 1000])
@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
def test_last_layer_from_kept_activations_equals_the_whole_plan(ds, arch, layers, width, weighted,  # noqa: F811
                                                                 strategy):
    """plan_inner_cpu's rows depend on the node and the width only: computed for every node at once
    (an L - 1-layer plan), the last layer on the targets' one-layer plan gives the whole plan's outputs."""
    from kernels.fused_forward import plan_inner_cpu, plan_outer_cpu

    g = _with_isolated(_weighted(ds) if weighted else ds.graph)
    x = torch.from_numpy(np.concatenate([ds.x, np.random.default_rng(2).normal(size=(3, ds.num_features))
                                         .astype(np.float32)]))
    m = _model(arch, ds, layers)
    with torch.no_grad():
        table = m.project(x).numpy()
    params = m.fused_params()
    dinv = gcn_dinv32(g) if arch == "gcn" else None
    everyone = execution_plan(g, np.arange(g.num_nodes), layers - 1, width, strategy)
    acts = np.zeros((g.num_nodes, m.embedding_dim), np.float32)
    acts[everyone.node_ids[: g.num_nodes]] = plan_inner_cpu(everyone, params, table, dinv)
    assert (acts >= 0).all(), "the rows the last layer reads are ReLU'd"
    rng = np.random.default_rng(layers * 100 + width)
    for targets in (np.array([g.num_nodes - 2]), np.array([11]),
                    np.concatenate([rng.choice(ds.graph.num_nodes, 12, replace=False), [g.num_nodes - 1]])):
        got = plan_outer_cpu(execution_plan(g, targets, 1, width, strategy), params, acts, dinv)
        want = plan_forward_cpu(execution_plan(g, targets, layers, width, strategy), params, table, dinv)
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[3], want[3], rtol=1e-5, atol=1e-5)
        clear = np.diff(np.sort(want[1], axis=1)[:, -2:], axis=1)[:, 0] > 1e-5
        assert np.array_equal(got[2][clear], want[2][clear])


def test_inner_and_outer_forwards_check_their_arguments(ds):  # noqa: F811
    from kernels.fused_forward import plan_inner_cpu, plan_outer_cpu

    m = _model("gcn", ds, 2)
    with torch.no_grad():
        table = m.project(torch.from_numpy(ds.x)).numpy()
    params = m.fused_params()
    dinv = gcn_dinv32(ds.graph)
    acts = np.zeros((ds.graph.num_nodes, m.embedding_dim), np.float32)
    with pytest.raises(ValueError, match="2 layers, expected 1"):
        plan_inner_cpu(execution_plan(ds.graph, np.array([1]), 2, 0), params, table, dinv)
    with pytest.raises(ValueError, match="2 layers, expected 1"):
        plan_outer_cpu(execution_plan(ds.graph, np.array([1]), 2, 0), params, acts, dinv)
    one = execution_plan(ds.graph, np.array([1, 2]), 1, 0)
    with pytest.raises(ValueError, match=r"\[N, 8\]"):
        plan_outer_cpu(one, params, acts[:, :3].copy(), dinv)
    with pytest.raises(ValueError, match="gcn needs dinv"):
        plan_inner_cpu(one, params, table, None)
    single = StackParams.pack(0, [np.zeros((8, 10), np.float32)], [None], [8])
    with pytest.raises(ValueError, match="no inner layers"):
        plan_outer_cpu(one, single, acts, dinv)


def test_paper_benchmark_runs_on_a_synthetic_graph(capsys):
    """benchmarks/paper.py end to end (train, time both aggregations, accuracy per width) on a small synthetic
    graph: the exact ES-SpMM forward has the baseline's accuracy, kept fractions grow with the width."""
    mod = _benchmark("paper")
    assert mod.main(["--graphs", "synthetic:1500", "--models", "gcn,sage", "--epochs", "5", "--rounds", "1",
                     "--widths", "2,8", "--device", "cpu"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| synthetic")]
    assert len(rows) == 6  # 2 models x (exact, 2, 8)
    for exact, w2, w8 in (rows[:3], rows[3:]):
        acc, base = exact[4].split(" (baseline ")
        assert acc.strip() == base.strip().rstrip(")")
        kept = [float(r[3].strip().rstrip("%")) for r in (w2, w8)]
        assert kept[0] < kept[1] <= 100.0
        assert all(float(r[5]) > 0 and float(r[6]) > 0 for r in (exact, w2, w8))
