"""serve.projection.ActivationCache: a plain model's first-layer rows kept per node and width."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.fused_forward import plan_forward_cpu, plan_inner_cpu, plan_outer_cpu
from kernels.plan import execution_plan
from models.base import gcn_dinv32
from serve.features.memory import MemoryFeatureStore
from serve.projection import ActivationCache, ProjectionCache

from .test_models import _one_thread  # noqa: F401 (the module-wide one-thread fixture)
from .test_plan import _model, ds  # noqa: F401 (the module's dataset fixture)


def _caches(ds, arch, budget):  # noqa: F811
    m = _model(arch, ds, 2)
    store = MemoryFeatureStore(ds.x, registry=None)
    proj = ProjectionCache(m.project, store, ds.graph.num_nodes, int(m.projection_dim))
    dinv = gcn_dinv32(ds.graph) if arch == "gcn" else None
    acts = ActivationCache(ds.graph, m.fused_params(), dinv, proj, strategy="fastrand", budget_bytes=budget)
    return m, proj, dinv, acts


@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_rows_are_computed_once_per_width_and_equal_the_inner_layers(ds, arch):  # noqa: F811
    m, _, dinv, acts = _caches(ds, arch, 1 << 20)
    g = ds.graph
    assert acts.has_table(4) and acts.has_table(0)
    first = np.array([3, 250, 17])
    table = acts.table_for(first, 4)
    assert (acts.hits, acts.misses) == (0, 3)
    table = acts.table_for(np.array([17, 3, 40]), 4)  # two known rows, one new
    assert (acts.hits, acts.misses) == (2, 4)
    with torch.no_grad():
        ptab = m.project(torch.from_numpy(ds.x)).numpy()
    for width in (4, 0):
        rows = np.array([3, 17, 40, 250])
        got = acts.table_for(rows, width)[rows]
        want = plan_inner_cpu(execution_plan(g, rows, 1, width), m.fused_params(), ptab, dinv)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the width-0 table is another table: the width-4 rows did not leak into it
    assert not np.allclose(acts.table_for(np.array([250]), 0)[250], table[250]) or g.degrees[250] <= 4
    # every node warmed: a batch's answer is the whole plan's
    assert acts.warm(4) == g.num_nodes
    before = acts.misses
    targets = np.array([1, 499, 250, 42])
    last = execution_plan(g, targets, 1, 4)
    got = plan_outer_cpu(last, m.fused_params(), acts.table_for(last.node_ids, 4), dinv)
    assert acts.misses == before, "warmed: no row computed again"
    want = plan_forward_cpu(execution_plan(g, targets, 2, 4), m.fused_params(), ptab, dinv)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    st = acts.stats()
    assert st["widths"] == 2 and 0 < st["hit_ratio"] < 1 and st["bytes"] == 2 * acts.table_bytes
    assert st["rows"] == g.num_nodes + 4, "width 4 warmed for every node, width 0 holds the 4 rows asked for"


def test_widths_beyond_the_budget_get_no_table(ds, caplog):  # noqa: F811
    _, _, _, acts = _caches(ds, "gcn", 0)
    with caplog.at_level("INFO", logger="serve.projection"):
        assert not acts.has_table(4) and acts.warm(4) == 0 and not acts.has_table(4)
    said = [r.getMessage() for r in caplog.records if "no room for width 4" in r.getMessage()]
    assert len(said) == 1, "a refused width is said once"
    assert acts.stats()["bytes"] == 0 and acts.stats()["rows"] == 0
    _, _, _, acts = _caches(ds, "gcn", 1)  # a budget of one byte: no table fits
    assert not acts.has_table(2)
    hidden = _model("gcn", ds, 2).embedding_dim
    _, _, _, acts = _caches(ds, "gcn", 2 * ds.graph.num_nodes * (4 * hidden + 1))  # room for two widths
    assert acts.has_table(1) and acts.has_table(2) and not acts.has_table(3)
    assert acts.has_table(1), "a width with a table keeps it"


def test_a_refused_width_is_told_the_budget_that_would_hold_it(ds, caplog):  # noqa: F811
    """The log of a refused width names the --activation-cache-bytes that holds it: its table, the tables
    held and the default width's (room is kept for it), not one table's size, which may be below the budget
    already set (a 1M-node server logged "514000000 bytes needed ... budget 268435456 ...
    (--activation-cache-bytes 257000000 would hold one table)")."""
    m = _model("gcn", ds, 2)
    proj = ProjectionCache(m.project, MemoryFeatureStore(ds.x, registry=None), ds.graph.num_nodes,
                           int(m.projection_dim))
    dinv = gcn_dinv32(ds.graph)

    def cache(budget: int, reserved: int | None = 8) -> ActivationCache:
        return ActivationCache(ds.graph, m.fused_params(), dinv, proj, strategy="fastrand", budget_bytes=budget,
                               reserved_width=reserved)

    def refusal(acts: ActivationCache, width: int) -> str:
        caplog.clear()
        with caplog.at_level("INFO", logger="kernels.resident"):
            assert not acts.has_table(width)
        (said,) = [r.getMessage() for r in caplog.records if f"no room for width {width}" in r.getMessage()]
        return said

    table = ds.graph.num_nodes * (4 * m.embedding_dim + 1)
    one_and_a_half = table + table // 2  # the default width's table fits, a second one does not
    acts = cache(one_and_a_half)
    assert acts.table_bytes == table and acts.has_table(8)
    said = refusal(acts, 4)
    assert f"{2 * table} bytes needed with it, budget {one_and_a_half}" in said
    assert (f"--activation-cache-bytes {2 * table} would hold it beside the 1 table held (each width's table "
            f"takes {table} bytes)") in said, said
    assert cache(2 * table).has_table(8) and cache(2 * table).has_table(4), "the figure given is enough"
    # before the default width has its table, room is kept for it: the advice counts it
    said = refusal(cache(one_and_a_half), 4)
    assert (f"--activation-cache-bytes {2 * table} would hold it beside the table kept for the default width 8 "
            f"(each width's table takes {table} bytes)") in said, said
    fresh = cache(2 * table)
    assert fresh.has_table(4) and fresh.has_table(8), "the figure given is enough, the default width's table too"
    # nothing held, nothing reserved: one table is what it takes
    said = refusal(cache(table - 1, reserved=None), 4)
    assert f"--activation-cache-bytes {table} would hold it (each width's table takes {table} bytes)" in said, said
    assert cache(table, reserved=None).has_table(4)


def test_a_one_layer_stack_is_refused(ds):  # noqa: F811
    from kernels.fused_forward import StackParams

    _, proj, _, _ = _caches(ds, "sage", 1 << 20)
    single = StackParams.pack(1, [np.zeros((16, 10), np.float32)], [None], [8])
    with pytest.raises(ValueError, match="no layer before its last"):
        ActivationCache(ds.graph, single, None, proj, strategy="fastrand", budget_bytes=1 << 20)


@pytest.mark.parametrize("kind", ["sage", "gcn"])
def test_a_served_plain_model_answers_the_same_with_and_without_the_cache(tmp_path, tiny_dataset, kind):
    """Two runtimes of one checkpoint, activation cache on and off: equal labels, probabilities,
    embeddings and edge counts, batch after batch (cold rows, warm rows, repeated ids, several widths)."""
    import time

    from serve.batcher import WorkItem
    from serve.registry import ModelRegistry
    from serve.runtime import RuntimeOptions, _WarmupFuture
    from serve.validation import PredictCall

    from .serving import make_repo

    repo = make_repo(tmp_path, tiny_dataset, {"m": kind}, epochs=15)
    runtimes, registries = [], []
    for budget in (1 << 20, 0):
        # each registry its own update log (one file log has one writer; nothing is updated here)
        reg = ModelRegistry(str(repo), RuntimeOptions(activation_budget_bytes=budget,
                                                      update_log_dir=str(tmp_path / f"_live-{budget}")))
        registries.append(reg)
        runtimes.append(reg._load_version("m", 1, repo / "m" / "1"))
    cached, plain = runtimes
    assert cached._activations is not None and plain._activations is None
    try:
        rng = np.random.default_rng(0)
        for width in (4, 0, 2, 4):
            for nodes in ([5], [5], rng.choice(800, 12, replace=False).tolist(), [1, 2, 2, 799, 1]):
                outs = []
                for rt in runtimes:
                    call = PredictCall("t", np.asarray(nodes, dtype=np.int64), [], width, 0, "request", 0.0, True, True)
                    res = rt.process([WorkItem(call, len(nodes), None, None, time.monotonic(), _WarmupFuture())])[0]
                    assert not isinstance(res, BaseException), res
                    outs.append(res)
                a, b = outs
                assert np.array_equal(a.labels, b.labels)
                np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(a.embeddings, b.embeddings, rtol=1e-5, atol=1e-5)
                assert (a.edges_kept, a.edges_total) == (b.edges_kept, b.edges_total)
        assert cached._activations.hits > 0 and cached._activations.stats()["widths"] >= 3
    finally:
        for reg in registries:
            reg.shutdown_executors()


def test_a_warmed_width_is_complete_and_priced_by_the_last_layer(tiny_repo):
    """After --warm-projections the default width's table holds every row (activations_complete), and a
    request at that width is priced by its targets' degrees (only the last layer runs)."""
    import numpy as np

    from serve.validation import PredictCall, resolve_knobs

    from .serving import ServerThread

    with ServerThread(tiny_repo, {"poll_s": 0, "runtime_kw": {"warm_projections": True}}) as srv:
        rt = srv.server.registry.get("gcn")
        s = resolve_knobs(rt.limits, None, None, None)[0]
        assert rt.activations_complete(s) and not rt.activations_complete(s + 1)
        nodes = np.array([3, 9, 700])
        call = PredictCall("w", nodes, [], s, 0, "default", 0.0, False, False)
        deg = rt.graph.degrees[nodes]
        assert rt.estimate_work(call) == int(np.minimum(deg, s).sum() if s else deg.sum())


def test_a_resident_width_is_priced_by_the_last_layer(tiny_repo):
    """On the resident path (--resident) a width whose first-layer table is built is priced by its targets'
    degrees as well (without building a table: pricing runs on the event loop); an unbuilt width keeps the
    plan's bound."""
    import numpy as np

    from serve.validation import PredictCall, resolve_knobs

    from .serving import ServerThread

    with ServerThread(tiny_repo, {"poll_s": 0, "runtime_kw": {"resident": True}}) as srv:
        rt = srv.server.registry.get("gcn")
        s = resolve_knobs(rt.limits, None, None, None)[0]
        # the warm-up built the default width's table and the knob table's widths (what clients pick)
        knob_widths = {r.sampling_width for r in rt.limits.knob_table}
        assert rt._resident.holds(s) and all(rt._resident.holds(w) for w in knob_widths)
        assert s + 1 not in knob_widths and not rt._resident.holds(s + 1)
        nodes = np.array([3, 9, 700])
        deg = rt.graph.degrees[nodes]
        call = PredictCall("w", nodes, [], s, 0, "default", 0.0, False, False)
        assert rt.estimate_work(call) == int(np.minimum(deg, s).sum() if s else deg.sum())
        wider = PredictCall("w", nodes, [], s + 1, 0, "default", 0.0, False, False)
        assert rt.estimate_work(wider) > int(np.minimum(deg, s + 1).sum())
        assert not rt._resident.holds(s + 1)


def test_concurrent_fills_count_each_row_once(ds):  # noqa: F811
    """Several --workers threads filling overlapping rows of one width: every row held is counted once, so
    ``complete`` turns true exactly when every node's row is held (it prices requests)."""
    import concurrent.futures

    _, _, _, acts = _caches(ds, "gcn", 1 << 22)
    n = ds.graph.num_nodes
    assert acts.has_table(4)
    rng = np.random.default_rng(3)
    chunks = [np.unique(rng.choice(n, 60)) for _ in range(12)]  # overlapping sets of distinct ids
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda ids: acts.table_for(ids, 4), chunks))
    held = int(np.count_nonzero(acts._tables[4][1][:n]))
    assert acts._filled[4] == held < n and not acts.complete(4)
    acts.table_for(np.arange(n), 4)
    assert acts.complete(4) and acts._filled[4] == n
