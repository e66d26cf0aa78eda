"""The resident plain path (kernels.resident): held to the model's own full-graph forward, free of host
synchronisations by construction, and (on a GPU, marked ``gpu``) under torch's sync debug mode and in
captured CUDA graphs.

The serving path built on it (``plain-resident``) is also in ``tests/test_paths.py`` (every path
against the specification) and ``tests/test_live.py`` (random updates)."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.graph import CSRGraph
from kernels.plan import edges_on_two_layer_paths, execution_plan
from kernels.resident import PAD_MAX, ResidentPlain, bucket_of
from models.gcn import GCN
from models.sage import GraphSAGE

from .serving import skip_without_cuda

ARCHS = {"gcn": GCN, "sage": GraphSAGE}
HUB = 2 * 577  # a hub whose degree is a multiple of 577: fastrand's second formula (kernels.spmm)


def _graph(seed: int, weighted: bool, n: int = 1400) -> CSRGraph:
    """Random sparse edges, a hub of degree HUB, self-loops on a few nodes, and isolated nodes."""
    rng = np.random.default_rng(seed)
    m = 5 * n
    src, dst = rng.integers(0, n - 20, m), rng.integers(0, n - 20, m)  # the last 20 nodes stay isolated
    hub_nbrs = rng.choice(np.arange(1, n - 20), HUB, replace=False)
    loops = np.arange(3, 60, 7)
    ei = np.concatenate([np.stack([src, dst]), np.stack([np.zeros(HUB, np.int64), hub_nbrs]),
                         np.stack([loops, loops])], axis=1)
    g = CSRGraph.from_edge_index(ei, num_nodes=n, symmetrize=True)
    if weighted:
        w = rng.uniform(0.2, 2.0, g.num_edges).astype(np.float32)
        g = CSRGraph(g.indptr, g.indices, w, g.num_nodes)
    return g


def _setup(arch: str, seed: int, weighted: bool, strategy: str, device: str = "cpu", budget: int = 1 << 26):
    torch.manual_seed(seed)
    g = _graph(seed, weighted)
    model = ARCHS[arch](24, 16, 5, dropout=0.0).to(device).eval()
    x = torch.randn(g.num_nodes, 24, generator=torch.Generator().manual_seed(seed)).to(device)
    with torch.no_grad():
        p = model.project(x)
    return g, model, p, ResidentPlain(model, g, lambda: p, strategy=strategy, budget_bytes=budget)


def _spec(model, g, p, width, strategy):
    with torch.no_grad():
        logits, emb = model.propagate(g, p, width or None, strategy)
    return torch.softmax(logits, 1), emb


def _targets(g: CSRGraph, rng) -> np.ndarray:
    picks = rng.choice(g.num_nodes, 40, replace=False)
    return np.unique(np.concatenate([[0, 3, g.num_nodes - 1], picks]))  # the hub, a self-loop, an isolated node


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
def test_resident_answers_equal_the_full_graph_forward(arch, weighted, strategy):
    """Probabilities, labels and embeddings of the model's full-graph forward at the targets, and the
    kept edges of edges_on_two_layer_paths, at the exact width, padded widths and a packed sampled
    width above PAD_MAX (the hub keeps a sample there)."""
    g, model, p, res = _setup(arch, 3, weighted, strategy)
    rng = np.random.default_rng(4)
    for width in (0, 1, 3, 7, PAD_MAX + 5):
        assert res.has_table(width)
        want_p, want_emb = _spec(model, g, p, width, strategy)
        t = _targets(g, rng)
        probs, labels, kept, emb = res.answer(t, width, want_emb=True)
        np.testing.assert_allclose(probs, want_p[t].numpy(), rtol=1e-5, atol=1e-6, err_msg=f"S={width}")
        np.testing.assert_allclose(emb, want_emb[t].numpy(), rtol=1e-5, atol=1e-6)
        top2 = np.sort(probs, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-5
        assert np.array_equal(labels[clear], want_p[t].argmax(1).numpy()[clear])
        if width:
            plan = execution_plan(g, t, 1, width, strategy)
            want_kept, _ = edges_on_two_layer_paths(plan, g, width)
            assert np.array_equal(kept, want_kept), f"S={width}"
        else:
            assert kept is None
        _, _, _, no_emb = res.answer(t[:3], width, want_emb=False)
        assert no_emb is None


@pytest.mark.parametrize("arch", list(ARCHS))
def test_recomputed_rows_equal_the_table(arch, monkeypatch):
    """The slot formula that recomputes first-layer rows after an update gives the rows of the full-graph
    table built by the model's own layer through sampled_spmm (a CPU's build), and a table built from the
    kept edges in chunks (a GPU's build) equals it."""
    import kernels.resident as resident

    g, model, p, res = _setup(arch, 5, True, "fastrand")
    rows = np.array([0, 1, 3, 17, 400, g.num_nodes - 1], dtype=np.int64)
    monkeypatch.setattr(resident, "BUILD_ROWS", 300)  # several chunks on this graph
    sliced = ResidentPlain(model, g, lambda: p, strategy="fastrand", budget_bytes=1 << 26)
    sliced.build_from_slots = True
    for width in (0, 4, PAD_MAX + 5):
        assert res.has_table(width) and sliced.has_table(width)
        np.testing.assert_allclose(res.first_layer_rows(rows, width).numpy(), res._tables[width][rows].numpy(),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(sliced._tables[width].numpy(), res._tables[width].numpy(), rtol=1e-5, atol=1e-6)


def test_rebase_recomputes_the_stale_rows_and_grows():
    """rebase onto a graph with one more node and a changed row: the tables' rows of the stale set equal a
    fresh resident model's; others are left alone."""
    g, model, p, res = _setup("gcn", 6, False, "fastrand")
    assert res.has_table(3) and res.has_table(0)
    # a new node n linked to 0 and 5: rows n, 0, 5 change, and (GCN degrees) their neighbours' rows
    n = g.num_nodes
    ei = np.stack([np.repeat(np.arange(n), np.diff(g.indptr)), g.indices.astype(np.int64)])
    ei = np.concatenate([ei, [[n, n, 0, 5], [0, 5, n, n]]], axis=1)
    g2 = CSRGraph.from_edge_index(ei, num_nodes=n + 1)
    p2 = torch.cat([p, torch.randn(1, p.shape[1])])
    res.projections = lambda: p2
    from kernels.resident import DeviceGraph

    changed = np.array([0, 5, n])
    stale = np.unique(np.concatenate([changed, g2.neighbors_of(changed)]))
    assert res.rebase(g2, DeviceGraph.upload(g2, torch.device("cpu")), stale) == 2 * len(stale)
    fresh = ResidentPlain(model, g2, lambda: p2, strategy="fastrand", budget_bytes=1 << 26)
    for width in (0, 3):
        assert fresh.has_table(width)
        np.testing.assert_allclose(res._tables[width].numpy(), fresh._tables[width].numpy(), rtol=1e-5, atol=1e-6)


def test_rebase_with_the_kept_edges_prepared_outside_the_lock(monkeypatch):
    """prepare() builds every held width's kept edges from the new graph before the write lock (batches
    still run); the rebase then builds none and ends where a rebase that builds them does."""
    import kernels.resident as resident
    from kernels.resident import DeviceGraph

    g, _, p, res = _setup("gcn", 6, False, "fastrand")
    _, _, _, twin = _setup("gcn", 6, False, "fastrand")
    for r in (res, twin):
        assert r.has_table(3) and r.has_table(0)
    g2, p2, stale = _update(g, p, True)
    dg2 = DeviceGraph.upload(g2, torch.device("cpu"))
    prepared = res.prepare(g2, dg2)
    assert sorted(prepared["csr"]) == [0, 3]
    built = []
    real = resident.width_csr
    monkeypatch.setattr(resident, "width_csr", lambda *a: built.append(a[1]) or real(*a))
    res.projections = twin.projections = lambda: p2
    res.rebase(g2, dg2, stale, prepared)
    assert built == []  # nothing O(E) under the lock
    twin.rebase(g2, DeviceGraph.upload(g2, torch.device("cpu")), stale)
    assert sorted(built) == [0, 3]
    for width in (0, 3):
        np.testing.assert_allclose(res._tables[width].numpy(), twin._tables[width].numpy(), rtol=1e-6, atol=1e-7)
        assert torch.equal(res._csr[width].coef, twin._csr[width].coef)


def _update(g: CSRGraph, p: torch.Tensor, gcn: bool):
    """A new node n linked to 0 and 5, and new features (projection) for node 7: the new graph and
    projections, and the stale first-layer rows as the runtime computes them (serve.runtime.prepare_rebase)."""
    n = g.num_nodes
    ei = np.stack([np.repeat(np.arange(n), np.diff(g.indptr)), g.indices.astype(np.int64)])
    ei = np.concatenate([ei, [[n, n, 0, 5], [0, 5, n, n]]], axis=1)
    g2 = CSRGraph.from_edge_index(ei, num_nodes=n + 1)
    p2 = torch.cat([p, torch.randn(1, p.shape[1], generator=torch.Generator().manual_seed(1))])
    p2[7] = torch.randn(p.shape[1], generator=torch.Generator().manual_seed(2))
    changed, feats = np.array([0, 5, n]), np.array([7])
    spread = np.concatenate([feats, changed]) if gcn else feats
    stale = np.unique(np.concatenate([changed, feats, g2.neighbors_of(spread)]))
    return g2, p2, stale


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("width", [3, 0])
def test_a_table_built_across_an_update_is_brought_up_to_it(arch, width):
    """request() builds a missing width on a background thread and answers "not yet" (the batch takes
    another path); one build at a time, nothing queued meanwhile. An update committed while the build runs
    (a new node, changed rows, new features) is applied to the new table before it is installed: it then
    equals a table built fresh on the updated graph, and the answers equal the model's forward there."""
    from kernels.resident import DeviceGraph

    g, model, p, res = _setup(arch, 8, False, "fastrand")  # unweighted: _update's graph has no weights
    entered, release = threading.Event(), threading.Event()
    real = res._full_table

    def slow(*args):
        out = real(*args)
        entered.set()
        assert release.wait(30)
        return out

    res._full_table = slow
    assert not res.request(width)
    assert entered.wait(30)
    assert not res.request(width) and not res.request(11) and res._building == width  # one build in flight
    g2, p2, stale = _update(g, p, arch == "gcn")
    res.projections = lambda: p2
    assert res.rebase(g2, DeviceGraph.upload(g2, torch.device("cpu")), stale) == 0  # no table held yet
    release.set()
    assert res.wait_for_builds(30) and res.holds(width) and not res.holds(11)
    assert (res.builds, res.caught_up) == (1, 1)
    fresh = ResidentPlain(model, g2, lambda: p2, strategy="fastrand", budget_bytes=1 << 26)
    assert fresh.has_table(width)
    np.testing.assert_allclose(res._tables[width].numpy(), fresh._tables[width].numpy(), rtol=1e-5, atol=1e-6)
    t = np.array([0, 5, 7, 3, g2.num_nodes - 1])
    want, _ = _spec(model, g2, p2, width, "fastrand")
    probs, _, _, _ = res.answer(t, width, want_emb=False)
    np.testing.assert_allclose(probs, want[t].numpy(), rtol=1e-5, atol=1e-6)


def test_a_failed_build_is_logged_and_frees_the_builder(caplog):
    res = _setup("gcn", 9, False, "fastrand")[3]

    def broken(*args):
        raise RuntimeError("out of device memory")

    res._full_table = broken
    with caplog.at_level(logging.ERROR, logger="kernels.resident"):
        assert not res.request(4)
        assert res.wait_for_builds(30)
    assert not res.holds(4) and res._building is None and not res._tracking
    assert any("width 4 failed" in r.getMessage() for r in caplog.records)


def test_table_budget_keeps_room_for_the_default_width():
    """The budget counts each width's table and kept edges (width_bytes), and keeps room for the default
    width until it has them."""
    g, model, p, probe = _setup("gcn", 7, False, "fastrand")
    sizes = {w: probe.width_bytes(w) for w in (3, 5, 8)}
    assert sizes[3] < sizes[5] < sizes[8]  # more kept edges at a wider width
    assert sizes[3] > g.num_nodes * 16 * 4  # the table plus the kept edges
    res = ResidentPlain(model, g, lambda: p, strategy="fastrand", budget_bytes=sizes[3] + sizes[8], reserved_width=8)
    assert res.has_table(3)  # its state, and room kept back for width 8
    assert not res.has_table(5)
    assert res.has_table(8)
    assert res.widths() == [3, 8]
    assert res.stats()["bytes"] == res.dg.nbytes() + sizes[3] + sizes[8] == res.nbytes()


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


# operators whose output size or value is read back on the host: each is a device synchronisation on a GPU
_SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "bincount", "item", "equal", "is_nonzero", "allclose"}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_batch_reads_nothing_back_from_the_device(arch):
    """Every tensor operation of a batch's forward (the ids uploaded, sampling, the last layer, the kept
    counts) at padded, packed and exact widths: none reads a size or a value back (on a GPU each would be
    a synchronisation), repeat_interleave always gets its output size, no boolean-mask indexing."""
    g, _, _, res = _setup(arch, 8, True, "fastrand")
    t = _targets(g, np.random.default_rng(9))
    for width in (0, 5, PAD_MAX + 5):
        assert res.has_table(width)
        with torch.inference_mode(), _Ops() as ops:
            rows = res.upload_ids(t)
            res.forward(rows, t, width, want_emb=True)
        names = [f.__name__.split(".")[0] for f, _, _ in ops.calls]
        assert len(names) > 10
        assert not _SYNCING & set(names), (width, _SYNCING & set(names))
        for f, args, kwargs in ops.calls:
            if f.__name__.startswith("repeat_interleave") and isinstance(args[0], torch.Tensor) and len(args) < 2:
                assert kwargs.get("output_size") is not None, "repeat_interleave without its output size"
            if f.__name__.startswith(("index.", "index_put")):
                idx = args[1]
                assert not any(i is not None and i.dtype == torch.bool for i in idx), "boolean-mask indexing"


def test_buckets():
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 63, 64, 65, 1024)] == [1, 2, 4, 4, 8, 64, 64, 128, 1024]


def test_refuses_what_it_cannot_serve():
    g = _graph(1, False)
    model = GCN(8, 4, 3, layers=3).eval()
    with pytest.raises(ValueError, match="2-layer"):
        ResidentPlain(model, g, lambda: None, strategy="fastrand", budget_bytes=1 << 20)


# ----------------------------------------------------------------------------- shaDow
def _shadow_setup(backbone: str, pool: str, layers: int, weighted: bool, seed: int = 21, device: str = "cpu", *,
                  hidden: int = 8, classes: int = 3, strategy: str = "fastrand", topk: int = 24, **resident_kw):
    from kernels.datasets import synthetic_sbm
    from kernels.ppr import PPRConfig
    from kernels.ppr_index import PPRIndex
    from kernels.resident import ResidentShadow
    from models.shadow import ShadowGNN

    g = synthetic_sbm(600, num_classes=4, avg_degree=10, num_features=4, seed=seed).graph
    if weighted:
        g = CSRGraph(g.indptr, g.indices, np.random.default_rng(seed).uniform(0.2, 2, g.num_edges).astype(np.float32),
                     g.num_nodes)
    index = PPRIndex.build(g, PPRConfig(topk=topk, eps=1e-4), progress=False)
    assert index.ensure_induced(g)
    torch.manual_seed(seed)
    model = ShadowGNN(backbone, 12, hidden, classes, layers=layers, dropout=0.0, pool=pool).to(device).eval()
    x = torch.randn(g.num_nodes, 12, generator=torch.Generator().manual_seed(seed)).to(device)
    with torch.no_grad():
        p = model.project(x)
    return g, index, model, p, ResidentShadow(model, index, lambda: p, strategy=strategy, **resident_kw)


def test_the_shadow_readout_reads_nothing_back():
    """The host-path shaDow model's readout (segment ids, mean and max pooling), which a --device cuda server
    runs without --resident: no operator reads a size or value back (it used repeat_interleave without its
    output size and bincount, two synchronisations per batch on a GPU)."""
    from models.base import segment_ids
    from models.shadow import segment_max, segment_mean

    ptr = torch.tensor([0, 3, 3, 7, 12])
    h = torch.randn(12, 5)
    with torch.inference_mode(), _Ops() as ops:
        seg = segment_ids(ptr, 12)
        mean, top = segment_mean(h, seg, 4), segment_max(h, seg, 4)
    names = [f.__name__.split(".")[0] for f, _, _ in ops.calls]
    assert not _SYNCING & set(names), _SYNCING & set(names)
    for f, args, kwargs in ops.calls:
        if f.__name__.startswith("repeat_interleave") and isinstance(args[0], torch.Tensor) and len(args) < 2:
            assert kwargs.get("output_size") is not None, "repeat_interleave without its output size"
    assert seg.tolist() == [0, 0, 0, 2, 2, 2, 2, 3, 3, 3, 3, 3]
    torch.testing.assert_close(mean[2], h[3:7].mean(0))
    torch.testing.assert_close(mean[1], torch.zeros(5))  # an empty segment
    torch.testing.assert_close(top[3], h[7:12].max(0).values)


@pytest.mark.parametrize(("backbone", "pool", "layers"), [("gcn", "mean", 2), ("sage", "max", 3), ("gcn", "mean+max", 1),
                                                          ("sage", "none", 2)])
@pytest.mark.parametrize("weighted", [False, True])
def test_resident_shadow_equals_the_model_on_induced_subgraphs(backbone, pool, layers, weighted):
    """Probabilities, readout embeddings and edge counts of forward_batch_projected on the index's induced
    batch, at exact and sampled widths and smaller budgets."""
    g, index, model, p, res = _shadow_setup(backbone, pool, layers, weighted)
    t = np.unique(np.random.default_rng(5).choice(g.num_nodes, 50, replace=False))
    for width in (0, 1, 3):
        for budget in (24, 10):
            assert res.takes(t, budget)
            batch = index.induced_batch(g, t, budget)
            with torch.no_grad():
                logits, emb = model.forward_batch_projected(batch, p[torch.from_numpy(batch.node_ids)], width or None,
                                                            "fastrand")
            kept, total = batch.edge_counts(width)
            probs, labels, got_k, got_t, got_e = res.answer(t, width, budget, want_emb=True)
            want = torch.softmax(logits, 1).numpy()
            np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-6, err_msg=f"S={width} K={budget}")
            np.testing.assert_allclose(got_e, emb.numpy(), rtol=1e-5, atol=1e-5)
            assert np.array_equal(got_k, kept * layers) and np.array_equal(got_t, total * layers)
            clear = np.diff(np.sort(want, 1)[:, -2:], axis=1)[:, 0] > 1e-5
            assert np.array_equal(labels[clear], want.argmax(1)[clear])
    assert not res.takes(t, 25)  # beyond the table's k


def test_resident_shadow_reads_nothing_back_from_the_device():
    _, _, _, _, res = _shadow_setup("gcn", "mean+max", 2, True)
    t = np.arange(0, 600, 7)
    for width in (0, 4):
        with torch.inference_mode(), _Ops() as ops:
            res.forward(torch.from_numpy(t), width, 16, True)
        names = {f.__name__.split(".")[0] for f, _, _ in ops.calls}
        assert not _SYNCING & names, _SYNCING & names


@pytest.mark.parametrize("shadow", [False, True])
def test_captured_forward_buckets_pads_and_invalidates(shadow):
    """CapturedForward's logic around the capture, with its CPU emulation: batches pad to their bucket with
    their first id and answer like the uncaptured forward, one capture per (bucket, width, budget,
    embeddings), and a replaced resident tensor drops them."""
    from kernels.resident import CapturedForward, DeviceGraph

    if shadow:
        _, _, _, _, res = _shadow_setup("gcn", "mean", 2, False)
        n_nodes = 600
    else:
        g, _, _, res = _setup("sage", 15, True, "fastrand")
        n_nodes = g.num_nodes
    cap = CapturedForward(res, max_bucket=64, emulate=True)
    rng = np.random.default_rng(16)
    for n in (1, 3, 4, 17, 64):
        t = np.sort(rng.choice(n_nodes, n, replace=False))
        if shadow:
            want, got = res.answer(t, 3, 12, True), cap.answer(t, 3, True, 12)
        else:
            assert res.has_table(3)
            want, got = res.answer(t, 3, True), cap.answer(t, 3, True)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert cap.captures == 4 and cap.replays == 5  # buckets 1, 4 (3 and 4 share it), 32, 64
    assert not cap.accepts(65, 3) and cap.accepts(64, 3) and cap.accepts(1, 0) == shadow
    if shadow:
        res.table = None  # as if the index rebuilt its table: uploaded again, a new generation
        assert res.takes(np.array([1, 2]), 12)
    else:
        res.rebase(g, DeviceGraph.upload(g, torch.device("cpu")), np.array([1, 2]))
    cap.answer(np.array([5]), 3, True, 12)
    assert cap.captures == 5


@pytest.mark.parametrize("shadow", [False, True])
def test_no_waiting_leaves_captures_to_the_worker(shadow):
    """Inside ``no_waiting`` (the event loop's inline batches) a batch whose CUDA graph is not captured yet, or
    was dropped by a new generation, and a shaDow path choice that would upload a new induced table raise
    ``DeviceBusy`` before doing anything; once the worker (outside the block) has captured, the same batch
    replays inside the block with the same answer."""
    from kernels.resident import CapturedForward, DeviceBusy, DeviceGraph, no_waiting

    if shadow:
        _, _, _, _, res = _shadow_setup("gcn", "mean", 2, False)
    else:
        g, _, _, res = _setup("sage", 15, True, "fastrand")
        assert res.has_table(3)
    cap = CapturedForward(res, max_bucket=64, emulate=True)
    t = np.array([3, 9, 40])

    def ask():
        return cap.answer(t, 3, True, 12) if shadow else cap.answer(t, 3, True)

    with no_waiting(), pytest.raises(DeviceBusy, match="capture"):
        ask()
    assert cap.captures == 0 and cap.replays == 0 and res.batches == 0
    want = ask()  # the worker: captures and replays
    assert cap.captures == 1 and cap.replays == 1
    with no_waiting():
        got = ask()  # captured: the loop replays
    assert cap.captures == 1 and cap.replays == 2
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    if shadow:
        res.table = None  # as if the index rebuilt its table: the loop does not upload it
        with no_waiting(), pytest.raises(DeviceBusy, match="upload"):
            res.takes(t, 12)
        assert res.table is None and res.takes(t, 12) and res.table is not None
    else:
        res.rebase(g, DeviceGraph.upload(g, torch.device("cpu")), np.array([1, 2]))  # a new generation
    with no_waiting(), pytest.raises(DeviceBusy, match="capture"):
        ask()
    assert cap.captures == 1


def test_concurrent_batches_share_the_captured_buffers_safely():
    """Several worker threads (--workers) answering through one CapturedForward (its static input and
    outputs are shared): every answer is its own batch's."""
    import concurrent.futures

    from kernels.resident import CapturedForward

    g, _, _, res = _setup("gcn", 17, False, "fastrand")
    assert res.has_table(5)
    cap = CapturedForward(res, max_bucket=16, emulate=True)
    rng = np.random.default_rng(18)
    batches = [np.sort(rng.choice(g.num_nodes, 9, replace=False)) for _ in range(24)]
    want = [res.answer(t, 5, False)[0] for t in batches]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: cap.answer(t, 5, False)[0], batches))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("arch", list(ARCHS))
def test_cuda_resident_batches_do_not_synchronise(arch):
    """On the GPU: answers equal the CPU resident model's, and a batch (ids up, forward, packed copy back)
    runs under torch.cuda.set_sync_debug_mode("error") at padded, packed and exact widths."""
    skip_without_cuda()
    g, _, _, cpu = _setup(arch, 10, True, "fastrand")
    _, _, _, gpu = _setup(arch, 10, True, "fastrand", device="cuda")
    t = _targets(g, np.random.default_rng(11))
    for width in (0, 6, PAD_MAX + 5):
        assert cpu.has_table(width) and gpu.has_table(width)
        want = cpu.answer(t, width, True)
        gpu.answer(t, width, True)  # first use: lazy CUDA state outside the check
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = gpu.answer(t, width, True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[3], want[3], rtol=1e-4, atol=1e-5)
        if width:
            assert np.array_equal(got[2], want[2])


@pytest.mark.gpu
def test_cuda_graphs_replay_the_forward():
    """CapturedForward: one graph per (bucket, width), answers equal the uncaptured forward, and a rebase
    (a replaced tensor) drops the captured graphs."""
    skip_without_cuda()
    from kernels.resident import CapturedForward, DeviceGraph

    g, _, _, res = _setup("gcn", 12, False, "fastrand", device="cuda")
    cap = CapturedForward(res, max_bucket=64)
    rng = np.random.default_rng(13)
    for n in (1, 3, 17, 64):
        t = np.sort(rng.choice(g.num_nodes, n, replace=False))
        assert res.has_table(4)
        want = res.answer(t, 4, True)
        got = cap.answer(t, 4, True)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        assert np.array_equal(got[2], want[2])
    assert cap.captures == 4 and cap.replays == 4
    cap.answer(np.array([5, 6]), 4, False)
    assert cap.captures == 5  # without embeddings: its own graph
    res.rebase(g, DeviceGraph.upload(g, res.device), np.array([1, 2]))
    cap.answer(np.array([5, 6]), 4, False)
    assert cap.captures == 6


@pytest.mark.gpu
def test_cuda_graph_captures_of_two_models_at_once():
    # two models' first batches on two threads (each model has its own lock and executor): their
    # captures take turns (kernels.resident._CAPTURE_LOCK) instead of failing each other
    skip_without_cuda()
    from kernels.resident import CapturedForward

    models = [_setup(arch, seed, False, "fastrand", device="cuda")[3] for arch, seed in (("gcn", 41), ("sage", 42))]
    assert all(r.has_table(4) for r in models)
    caps = [CapturedForward(r, max_bucket=64) for r in models]
    errors: list[BaseException] = []

    def run(cap: CapturedForward, seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for b in (1, 2, 4, 8, 16, 32, 64):
                targets = np.sort(rng.choice(cap.r.graph.num_nodes, b, replace=False))
                got = cap.answer(targets, 4, want_emb=False)[0]
                np.testing.assert_allclose(got, cap.r.answer(targets, 4, want_emb=False)[0], rtol=1e-5, atol=1e-6)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(cap, i)) for i, cap in enumerate(caps)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [cap.captures for cap in caps] == [7, 7]


@pytest.mark.gpu
def test_cuda_graph_capture_while_another_thread_uploads():
    """An update's prepare phase uploads the new CSR (allocations, copies) on its own thread while batches
    run, and a batch may be capturing a CUDA graph then: neither may fail (capture_error_mode
    thread_local), and the replays answer like the plain forward."""
    from kernels.resident import CapturedForward, DeviceGraph

    skip_without_cuda()
    cuda = torch.device("cuda")
    g, _, _, res = _setup("gcn", 31, False, "fastrand", device="cuda")
    assert res.has_table(4)
    cap = CapturedForward(res, max_bucket=64)
    stop, errors = threading.Event(), []

    def uploads():
        try:
            while not stop.is_set():
                DeviceGraph.upload(g, cuda)
        except Exception as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=uploads)
    t.start()
    try:
        rng = np.random.default_rng(5)
        for b in (1, 2, 5, 9, 17, 33, 64):
            targets = np.sort(rng.choice(g.num_nodes, b, replace=False))
            got = cap.answer(targets, 4, want_emb=False)[0]
            want = res.answer(targets, 4, want_emb=False)[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert cap.captures == 6  # one per bucket: 33 and 64 targets share the bucket of 64


@pytest.mark.gpu
def test_cuda_resident_shadow_does_not_synchronise():
    """shaDow on the GPU: answers equal the CPU resident model's, under set_sync_debug_mode("error")."""
    skip_without_cuda()
    _, _, _, _, cpu = _shadow_setup("gcn", "mean+max", 2, True)
    _, _, _, _, gpu = _shadow_setup("gcn", "mean+max", 2, True, device="cuda", fused=False)  # the torch operators
    t = np.arange(0, 600, 5)
    for width in (0, 4):
        want = cpu.answer(t, width, 16, True)
        gpu.answer(t, width, 16, True)
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = gpu.answer(t, width, 16, True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
        assert np.array_equal(got[2], want[2]) and np.array_equal(got[3], want[3])


@pytest.mark.gpu
def test_cuda_graphs_replay_the_shadow_forward():
    """CapturedForward on a shaDow model: per (bucket, width, budget), equal to the uncaptured forward."""
    skip_without_cuda()
    from kernels.resident import CapturedForward

    # the torch operators (CapturedForward's subject) on both sides: not the one-launch kernel, on by default
    _, _, _, _, res = _shadow_setup("sage", "mean", 2, False, device="cuda", fused=False)
    cap = CapturedForward(res, max_bucket=64)
    rng = np.random.default_rng(14)
    for n, width, budget in ((1, 0, 24), (5, 3, 24), (5, 3, 10), (40, 0, 10)):
        t = np.sort(rng.choice(600, n, replace=False))
        want = res.answer(t, width, budget, True)
        got = cap.answer(t, width, True, budget)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        assert np.array_equal(got[2], want[2]) and np.array_equal(got[3], want[3])
    assert cap.captures == 4


@pytest.mark.gpu
def test_cuda_server_with_resident_paths_answers_like_the_cpu_server(tiny_repo):
    """A --device cuda --resident --cuda-graphs --gpu-min-targets 0 server (ModelRuntime in process): gcn and
    shaDow batches take the resident paths and answer as a CPU server does; with the default
    --gpu-min-targets, small batches keep the compiled CPU paths."""
    skip_without_cuda()
    from .serving import ServerThread

    nodes = np.arange(0, 800, 29)
    with ServerThread(tiny_repo, {"runtime_kw": {"device": "cuda", "resident": True, "fused_head": False}}) as hybrid:
        assert _process(hybrid.server.registry.get("gcn"), nodes[:5], 4).path == "plain-activations"
        assert _process(hybrid.server.registry.get("gcn"), np.arange(0, 800, 5), 4).path == "plain-resident"
    with ServerThread(tiny_repo, {"runtime_kw": {"device": "cuda"}}) as fused:  # the fused last layer: every batch
        rt = fused.server.registry.get("gcn")
        assert rt._resident.head is not None and rt._captured is None and rt.gpu_min_targets == 0
        assert rt._activations is None  # no CPU copy of the first-layer tables beside the fused head
        assert _process(rt, nodes[:1], 4).path == "plain-resident"
    with ServerThread(tiny_repo, {"runtime_kw": {"device": "cpu"}}) as cpu_srv, \
            ServerThread(tiny_repo, {"runtime_kw": {"device": "cuda", "resident": True, "cuda_graphs": True,
                                                    "gpu_min_targets": 0}}) as gpu_srv:
        for model, path in (("gcn", "plain-resident"), ("shadow", "shadow-resident")):
            rt_c, rt_g = cpu_srv.server.registry.get(model), gpu_srv.server.registry.get(model)
            for width in (0, 4):
                want = _process(rt_c, nodes, width)
                got = _process(rt_g, nodes, width)
                assert got.path == path
                np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-4, atol=1e-5)
                assert (got.edges_kept, got.edges_total) == (want.edges_kept, want.edges_total)


def _process(rt, nodes, width, path=None):
    import time

    from serve.batcher import WorkItem
    from serve.runtime import _WarmupFuture
    from serve.validation import PredictCall

    call = PredictCall("t", np.asarray(nodes, np.int64), [], width, rt.limits.default_ppr_budget, "request", 0.0,
                       True, True)
    res = rt.process([WorkItem(call, len(nodes), None, None, time.monotonic(), _WarmupFuture())], path=path)[0]
    assert not isinstance(res, BaseException), res
    return res


def test_serve_cli_resident_answers_like_the_default_server(tiny_repo, tmp_path):
    """`gnnserve serve --resident` (a subprocess, the flag through the CLI): plain and shaDow requests,
    exact and sampled, answer as the default server does, and its log says the models are resident."""
    import grpc

    from clients._gen import gnnserve_pb2 as pb
    from clients._gen import gnnserve_pb2_grpc as pbg

    from .serving import ServerProcess

    def ask(address):
        out = []
        with grpc.insecure_channel(address) as ch:
            stub = pbg.GnnServiceStub(ch)
            for model in ("gcn", "shadow"):
                for width in (0, 3):
                    r = stub.Predict(pb.PredictRequest(model=model, nodes=[5, 77, 300, 5], sampling_width=width,
                                                       return_probabilities=True), timeout=60)
                    out.append((np.asarray(r.probabilities), r.settings.edges_kept, r.settings.edges_total))
        return out

    log = tmp_path / "resident.log"
    with ServerProcess(tiny_repo, "--poll-s", "0") as base, \
            ServerProcess(tiny_repo, "--poll-s", "0", "--resident", "--log-level", "INFO", log_path=log) as res:
        want, got = ask(base.address), ask(res.address)
    for (pw, kw, tw), (pg, kg, tg) in zip(want, got, strict=True):
        np.testing.assert_allclose(pg, pw, rtol=1e-4, atol=1e-5)
        assert (kg, tg) == (kw, tw)
    text = log.read_text()
    assert "model gcn v1: resident on cpu" in text and "model shadow v1: resident on cpu" in text


def test_cuda_graphs_without_a_gpu_is_said_and_ignored(tiny_repo, caplog):
    """--cuda-graphs on a CPU server: a warning per model, the resident paths still serve."""
    from .serving import ServerThread

    with caplog.at_level("WARNING", logger="serve.runtime"), \
            ServerThread(tiny_repo, {"runtime_kw": {"resident": True, "cuda_graphs": True}}) as srv:
        rt = srv.server.registry.get("gcn")
        assert rt._captured is None and rt.paths[0].name == "plain-resident"
    assert any("--cuda-graphs ignored" in r.getMessage() for r in caplog.records)


def test_a_busy_resident_model_never_holds_the_event_loop(tiny_repo):
    """A width's table build (its CUDA graph captures, on a GPU) and an update's rebase hold a resident model's
    lock. A small batch answered on the event loop that meets it goes to the batcher's worker, which waits:
    health checks and model listings answer meanwhile, the request is answered once the lock is free (by
    the resident path, with the same answer), and the path is not taken for faulty."""
    from clients import GnnClient

    from .serving import ServerThread, deferred_while_held

    with ServerThread(tiny_repo, {"runtime_kw": {"resident": True}}) as srv:
        rt = srv.server.registry.get("gcn")
        res, batcher = rt._resident, rt.batcher
        res.request(3)
        assert res.wait_for_builds(60) and res.holds(3)
        with GnnClient(srv.address) as c, GnnClient(srv.address) as waiting:
            inline, batches = batcher.batches_inline, res.batches
            first = c.predict("gcn", [5, 77], sampling_width=3)
            assert batcher.batches_inline == inline + 1 and res.batches == batches + 1  # inline, resident
            deferred = batcher.batches_deferred
            with res.lock:  # a table build or a rebase in progress
                th, out = deferred_while_held(
                    batcher, c, lambda: waiting.predict("gcn", [5, 77], sampling_width=3, timeout=60), {"gcn"})
            th.join(30)
        assert "r" in out and res.batches == batches + 2  # the worker's batch took the resident path too
        np.testing.assert_array_equal(out["r"].labels, first.labels)
        np.testing.assert_array_equal(out["r"].probabilities, first.probabilities)
        assert batcher.batches_deferred == deferred + 1 and rt.switched_off == []


def test_a_deferred_batch_counts_once_toward_its_capture(tiny_repo):
    """A batch that meets a busy resident model on the event loop is answered by the worker: it asks whether to
    replay a CUDA graph twice but is one batch of its key, so its key is captured on the next batch, not on
    this one (CAPTURE_AFTER = 2), through the same deferral (a capture is the worker's work too). CPU emulation of
    the capture."""
    from clients import GnnClient
    from kernels.resident import CAPTURE_AFTER, CapturedForward

    from .serving import ServerThread, deferred_while_held

    assert CAPTURE_AFTER == 2
    with ServerThread(tiny_repo, {"runtime_kw": {"resident": True}}) as srv:
        rt = srv.server.registry.get("gcn")
        res, batcher = rt._resident, rt.batcher
        res.request(3)
        assert res.wait_for_builds(60) and res.holds(3)
        cap = rt._captured = CapturedForward(res, max_bucket=rt.options.max_batch_targets, emulate=True)
        with GnnClient(srv.address) as c, GnnClient(srv.address) as waiting:
            deferred = batcher.batches_deferred
            with res.lock:  # a table build in progress: the inline batch goes to the worker
                th, out = deferred_while_held(
                    batcher, c, lambda: waiting.predict("gcn", [5, 77], sampling_width=3, timeout=60), {"gcn"})
            th.join(30)
            assert "r" in out and batcher.batches_deferred == deferred + 1
            assert cap.captures == 0 and list(cap._seen.values()) == [1]  # one batch, counted once
            again = c.predict("gcn", [5, 77], sampling_width=3)  # the key's second batch: captured (by the worker)
            assert cap.captures == 1 and cap.replays == 1 and batcher.batches_deferred == deferred + 2
            third = c.predict("gcn", [5, 77], sampling_width=3)  # replayed on the loop
            assert cap.captures == 1 and cap.replays == 2 and batcher.batches_deferred == deferred + 2
        for got in (again, third):
            np.testing.assert_array_equal(got.labels, out["r"].labels)
            np.testing.assert_allclose(got.probabilities, out["r"].probabilities, rtol=1e-6, atol=1e-7)
        assert rt.switched_off == []


def test_no_waiting_raises_only_where_the_lock_is_taken():
    """``no_waiting`` is per thread and nests; a free lock is taken and released as usual inside it."""
    from kernels.resident import DeviceBusy, _Held, no_waiting

    lock = threading.Lock()
    with no_waiting():
        with _Held(lock, "m"):
            assert lock.locked()
        assert not lock.locked()
        lock.acquire()
        with pytest.raises(DeviceBusy, match="m: busy"), _Held(lock, "m"):
            pass
        got = []
        th = threading.Thread(target=lambda: got.append(_Held(lock, "m").__enter__()))  # another thread waits
        th.start()
        time.sleep(0.05)
        assert th.is_alive()
        with no_waiting():
            pass
        with pytest.raises(DeviceBusy):  # the inner block's exit left this thread's flag on
            _Held(lock, "m").__enter__()
        lock.release()
        th.join(10)
        assert got == [None] and lock.locked()
        lock.release()
    with _Held(lock, "m"):  # outside the block: waited for, taken
        assert lock.locked()


def test_a_failing_resident_path_is_switched_off_and_the_batch_answered(tiny_repo, caplog, monkeypatch):
    """A batch whose resident path raises (device code that no CPU test reached, say) is answered by the
    next path, with the same answer; the path is switched off for the model version, loudly, and later
    batches no longer try it. Other paths' errors stay the batch's."""
    from .serving import ServerThread

    with ServerThread(tiny_repo, {"runtime_kw": {"resident": True}}) as srv:
        rt = srv.server.registry.get("gcn")
        nodes = [5, 77, 300]
        rt._resident.request(3)
        assert rt._resident.wait_for_builds(60) and rt._resident.holds(3)
        want = _process(rt, nodes, 3)
        assert want.path == "plain-resident"
        calls = []

        def broken(*args, **kwargs):
            calls.append(1)
            raise RuntimeError("injected device fault")

        monkeypatch.setattr(rt._resident, "answer", broken)
        with caplog.at_level(logging.ERROR, logger="serve.runtime"):
            got = _process(rt, nodes, 3)
        assert got.path != "plain-resident" and calls == [1]
        np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-5, atol=1e-6)
        assert (got.edges_kept, got.edges_total) == (want.edges_kept, want.edges_total)
        assert rt.switched_off == ["plain-resident"] and "plain-resident" not in [p.name for p in rt.paths]
        assert any("switched off" in r.getMessage() for r in caplog.records)
        from prometheus_client import generate_latest

        scraped = generate_latest(srv.server.metrics.registry).decode()
        assert 'gnnserve_serving_path_switched_off{model="gcn",path="plain-resident",version="1"} 1.0' in scraped
        _process(rt, nodes, 3)
        assert calls == [1]  # not tried again
        # a path that is not opt-in: its error is the batch's
        path = rt.paths[0]
        monkeypatch.setattr(path, "run", broken)
        from serve.batcher import WorkItem
        from serve.runtime import _WarmupFuture
        from serve.validation import PredictCall

        call = PredictCall("t", np.asarray(nodes, np.int64), [], 3, rt.limits.default_ppr_budget, "request", 0.0,
                           True, True)
        with pytest.raises(RuntimeError, match="injected"):
            rt.process([WorkItem(call, 3, None, None, time.monotonic(), _WarmupFuture())])
        assert rt.paths[0] is path


def test_gpu_defaults_resident_with_graphs_and_the_measured_crossover(tiny_repo, capsys):
    """The GPU defaults decided from the H200 run (docs/BENCHMARKS.md, "GPU: an H200 machine, 2026-11-25"):
    ``--gpu-min-targets`` left unset follows the GPU path a model takes; a CPU server on its defaults is not
    resident and warns of nothing; a negative ``--gpu-min-targets`` is refused by the CLI."""
    from serve.cli import main
    from serve.runtime import GPU_MIN_TARGETS_AUTO, RuntimeOptions, gpu_min_targets_auto, gpu_thresholds

    from .serving import ServerThread

    assert gpu_min_targets_auto(shadow=False, resident=True, graphs=True) == GPU_MIN_TARGETS_AUTO["plain-graphs"] == 64
    assert gpu_min_targets_auto(shadow=True, resident=True, graphs=True) == GPU_MIN_TARGETS_AUTO["shadow-graphs"] == 8
    assert gpu_min_targets_auto(shadow=True, resident=True, graphs=True, fused=True) == GPU_MIN_TARGETS_AUTO[
        "shadow-fused"] == 2
    # a GPU runtime with shaDow's kernel: batches from 2 targets on the GPU, the compiled CPU paths below the
    # torch path's own crossover (32) take the rest, a batch the kernel's path declines included
    assert gpu_thresholds(RuntimeOptions(), True, True, True, True, fused=True) == (2, 31)
    assert gpu_min_targets_auto(shadow=False, resident=True, graphs=False) == 512
    assert gpu_min_targets_auto(shadow=True, resident=True, graphs=False) == 32
    assert gpu_min_targets_auto(shadow=True, resident=False, graphs=False) == GPU_MIN_TARGETS_AUTO["shadow-torch"] == 32
    assert gpu_min_targets_auto(shadow=False, resident=False, graphs=False) is None  # the torch path never won
    assert gpu_min_targets_auto(shadow=False, resident=True, graphs=False, fused=True) == GPU_MIN_TARGETS_AUTO[
        "plain-fused"] == 0
    opts = RuntimeOptions()
    assert (opts.resident, opts.cuda_graphs, opts.gpu_min_targets) == (None, None, None)
    with ServerThread(tiny_repo, {"runtime_kw": {}}) as srv:
        for name in ("gcn", "shadow"):
            rt = srv.server.registry.get(name)
            assert rt._resident is None and rt._resident_shadow is None and rt._captured is None
            assert not any(p.name.endswith("-resident") for p in rt.paths)
    assert main(["serve", "--repo", str(tiny_repo), "--gpu-min-targets", "-1"]) == 2
    assert "--gpu-min-targets must be >= 0" in capsys.readouterr().err
    assert main(["serve", "--repo", str(tiny_repo), "--serving-path", "plain-resident", "--no-resident"]) == 2
    assert "drop one of them" in capsys.readouterr().err
    assert main(["serve", "--repo", str(tiny_repo), "--fused-head"]) == 2  # a CPU server
    assert "--fused-head is a kernel for models resident on the GPU" in capsys.readouterr().err
    assert main(["serve", "--repo", str(tiny_repo), "--device", "cuda", "--no-resident", "--fused-head"]) == 2
    assert "needs --device cuda without --no-resident" in capsys.readouterr().err
    assert main(["serve", "--repo", str(tiny_repo), "--fused-shadow"]) == 2  # a CPU server
    assert "--fused-shadow is a kernel for models resident on the GPU" in capsys.readouterr().err


def test_gpu_thresholds_send_declined_batches_to_the_faster_path():
    """serve.runtime.gpu_thresholds: with CUDA graphs a shaDow model's resident path takes 8 targets and
    up, and its compiled CPU path every batch below the torch path's crossover (32), so a batch of 8..31
    the resident path declines (dirty targets after an update, say) stays on the CPU rather than go to the
    slower torch path on the GPU; a plain model's torch path never won, so its compiled paths take all;
    ``--gpu-min-targets N`` is one threshold for every path; a CPU runtime has no GPU threshold."""
    import math

    from serve.runtime import FUSED_MAX_TARGETS, RuntimeOptions, gpu_thresholds

    auto = RuntimeOptions()
    assert gpu_thresholds(auto, True, True, True, True) == (8, 31)
    assert gpu_thresholds(auto, True, True, False, True) == (32, 31)
    assert gpu_thresholds(auto, False, True, True, True) == (64, FUSED_MAX_TARGETS)
    assert gpu_thresholds(auto, False, False, False, True) == (math.inf, FUSED_MAX_TARGETS)
    assert gpu_thresholds(auto, True, False, False, True) == (32, 31)
    assert gpu_thresholds(RuntimeOptions(gpu_min_targets=16), True, True, True, True) == (16, 15)
    assert gpu_thresholds(RuntimeOptions(gpu_min_targets=0), False, True, True, True) == (0, -1)
    assert gpu_thresholds(auto, True, True, True, False) == (math.inf, FUSED_MAX_TARGETS)
    assert gpu_thresholds(auto, False, True, False, True, fused=True) == (0, FUSED_MAX_TARGETS)


def test_a_resident_state_that_cannot_be_built_falls_back_when_not_asked_for(tiny_repo, monkeypatch, caplog):
    """Resident by default (a GPU server) but its state cannot be built (the GPU's memory, say): the failure
    is logged and the model serves on its other paths; asked for (--resident), the failure is the model's."""
    from .serving import ServerThread

    with ServerThread(tiny_repo, {"runtime_kw": {}}) as srv:
        rt = srv.server.registry.get("gcn")

        def no_memory() -> None:
            rt._resident = object()  # half built when it failed
            raise MemoryError("out of device memory (injected)")

        monkeypatch.setattr(rt, "_resident_build", no_memory)
        with caplog.at_level(logging.ERROR, logger="serve.runtime"):
            rt._resident_init(fallback=True)
        assert rt._resident is None and rt._captured is None
        assert any("could not be built" in r.getMessage() for r in caplog.records)
        with pytest.raises(MemoryError):
            rt._resident_init(fallback=False)


def test_captured_graphs_are_bounded_and_captured_on_a_second_request(monkeypatch):
    """The serving paths replay a graph only for a (bucket, width, budget, embeddings) key of which CAPTURE_AFTER - 1
    batches were served uncaptured (one-off widths run uncaptured), and at most MAX_GRAPHS graphs are kept, the least
    recently replayed dropped first: requests choose widths, and each graph holds device memory."""
    import kernels.resident as resident
    from kernels.resident import CapturedForward

    monkeypatch.setattr(resident, "MAX_GRAPHS", 3)
    _, _, _, res = _setup("gcn", 12, False, "fastrand")
    for width in (2, 3, 4, 5, 6):  # each width's first-layer table, built in the background, one at a time
        res.request(width)
        assert res.wait_for_builds(120) and res.holds(width)
    cap = CapturedForward(res, max_bucket=64, emulate=True)
    nodes = np.array([1, 5, 9])
    assert not cap.wants(3, 4) and not cap.wants(3, 4)  # asking counts nothing (a deferred batch asks twice)
    cap.served(3, 4)  # one batch of the key answered uncaptured
    assert cap.wants(3, 4)  # the second batch of the key
    assert not cap.wants(3, 4, want_emb=True) and not cap.wants(70, 4) and not cap.wants(3, 0)
    cap.served(70, 4)
    cap.served(70, 4)
    assert not cap.wants(70, 4) and len(cap._seen) == 1  # beyond the largest bucket: never counted, never captured
    for width in (2, 3, 4, 5):
        cap.answer(nodes, width, False)
    assert cap.captures == 4 and cap.evictions == 1 and len(cap._graphs) == 3
    cap.answer(nodes, 3, False)  # replayed: now the most recent
    cap.answer(nodes, 6, False)  # evicts width 4, the least recently replayed
    assert cap.evictions == 2 and {k[1] for k in cap._graphs} == {3, 5, 6}
    assert cap.wants(3, 3)  # captured already: no second request needed
    want = res.answer(nodes, 4, False)
    got = cap.answer(nodes, 4, False)  # captured again after its eviction, same answer
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert cap.captures == 6
