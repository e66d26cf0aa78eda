"""The gRPC server on loopback with real trained models (issue 5)."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg
from kernels.plan import exact_path_edges, execution_plan
from kernels.subgraph import induced_batch
from models.base import full_gcn_degrees
from models.checkpoint import load_checkpoint
from serve.validation import validate_predict

from .serving import ServerThread


@pytest.fixture(scope="module")
def stub(served):
    with grpc.insecure_channel(served.address) as ch:
        yield pbg.GnnServiceStub(ch)


def offline(repo, name, ds, nodes, width, budget):
    """Labels and probabilities computed without the server (same kernels, raw features)."""
    ckpt = load_checkpoint(repo / name / "1")
    model = ckpt.model.eval()
    g = ds.graph
    nodes = np.asarray(nodes, dtype=np.int64)
    if ckpt.extractor == "ppr":
        from kernels.ppr import PPRConfig, PPRIndex

        index = PPRIndex.open_or_build(repo / "_ppr", g, PPRConfig(**ckpt.ppr_config))
        ptr, lists = index.lookup(nodes, budget)
        norm = None
    else:  # a plain model: the full-graph forward at this width is the definition
        with torch.no_grad():
            logits = model(g, torch.from_numpy(ds.x), width or None, ckpt.strategy)[torch.from_numpy(nodes)]
        probs = torch.softmax(logits, 1).numpy()
        return probs.argmax(1), probs
    batch = induced_batch(g, ptr, lists)
    if ckpt.arch == "gcn":
        norm = full_gcn_degrees(g)[batch.node_ids]
    with torch.no_grad():
        logits, _ = model.forward_batch(batch, torch.from_numpy(ds.x[batch.node_ids]), width or None,
                                        ckpt.strategy, norm)
    probs = torch.softmax(logits, 1).numpy()
    return probs.argmax(1), probs


def predict(stub, model, nodes, **kw):
    return stub.Predict(pb.PredictRequest(model=model, nodes=list(map(int, nodes)), return_probabilities=True, **kw))


@pytest.mark.parametrize("model", ["shadow", "gcn"])
@pytest.mark.parametrize("width", [0, 4])
def test_predictions_equal_offline_model(stub, tiny_repo, tiny_dataset, model, width):
    nodes = np.arange(0, 800, 37)
    budget = 16 if model == "shadow" else None
    kw = {"sampling_width": width} | ({"ppr_budget": budget} if budget else {})
    r = predict(stub, model, nodes, **kw)
    labels, probs = offline(tiny_repo, model, tiny_dataset, nodes, width, budget or 0)
    got = np.asarray(r.probabilities, dtype=np.float32).reshape(len(nodes), r.num_classes)
    np.testing.assert_allclose(got, probs, rtol=1e-4, atol=1e-5)
    assert list(r.labels) == labels.tolist()
    assert r.settings.sampling_width == width and r.settings.chosen_by == "request"
    assert r.settings.ppr_budget == (budget or 0)


def test_plain_gcn_over_grpc_equals_full_graph_forward(stub, tiny_repo, tiny_dataset):
    model = load_checkpoint(tiny_repo / "gcn" / "1").model.eval()
    with torch.no_grad():
        full = torch.softmax(model(tiny_dataset.graph, torch.from_numpy(tiny_dataset.x)), 1).numpy()
    nodes = np.arange(800)
    r = predict(stub, "gcn", nodes, sampling_width=0)
    got = np.asarray(r.probabilities, dtype=np.float32).reshape(800, -1)
    np.testing.assert_allclose(got, full, rtol=1e-4, atol=1e-5)
    acc = (np.asarray(r.labels) == tiny_dataset.y)[tiny_dataset.test_mask].mean()
    assert acc > 0.6, f"test accuracy {acc:.2f} should clearly beat chance (0.25)"


def test_plain_model_edge_counts_come_from_the_warm_memo(served, stub, tiny_dataset):
    rt = served.server.registry.get("gcn")
    assert rt._exact_edges is not None and bool(np.all(rt._exact_edges._memo >= 0))  # filled at warm-up
    nodes = np.array([3, 50, 777])
    r = predict(stub, "gcn", nodes, sampling_width=2)
    plan = execution_plan(tiny_dataset.graph, nodes, rt.num_layers, 2, rt.strategy)
    assert r.settings.edges_kept == int(plan.kept_per_target().sum())
    assert r.settings.edges_total == int(exact_path_edges(tiny_dataset.graph, nodes, rt.num_layers).sum())
    assert r.settings.edges_kept < r.settings.edges_total


def test_knobs_trade_edges_and_exact_is_stable(stub):
    nodes = list(range(0, 800, 11))
    wide = predict(stub, "shadow", nodes, sampling_width=0, ppr_budget=32)
    narrow = predict(stub, "shadow", nodes, sampling_width=2, ppr_budget=32)
    small = predict(stub, "shadow", nodes, sampling_width=0, ppr_budget=8)
    assert narrow.settings.edges_kept < wide.settings.edges_kept == wide.settings.edges_total
    assert narrow.settings.edges_total == wide.settings.edges_total
    assert small.settings.edges_total < wide.settings.edges_total
    again = predict(stub, "shadow", nodes, sampling_width=0, ppr_budget=32)
    assert list(again.labels) == list(wide.labels) and list(again.probabilities) == list(wide.probabilities)


def test_defaults_clamping_and_max_accuracy_loss(stub):
    info = stub.GetModel(pb.GetModelRequest(name="shadow"))
    r = predict(stub, "shadow", [5])
    assert r.settings.chosen_by == "default"
    assert (r.settings.sampling_width, r.settings.ppr_budget) == (info.default_sampling_width, info.default_ppr_budget)
    r = predict(stub, "shadow", [5], sampling_width=100_000, ppr_budget=100_000)
    assert r.settings.sampling_width == info.max_sampling_width and r.settings.ppr_budget == info.max_ppr_budget
    r = predict(stub, "shadow", [5], max_accuracy_loss=1.0)
    assert r.settings.chosen_by == "max_accuracy_loss"
    cheapest = min(info.knob_table, key=lambda k: k.latency_ms_per_node)
    assert (r.settings.sampling_width, r.settings.ppr_budget) == (cheapest.sampling_width, cheapest.ppr_budget)
    assert r.settings.expected_accuracy == pytest.approx(cheapest.val_accuracy)


def test_concurrent_requests_batch_and_match_one_by_one(served, stub, monkeypatch):
    nodes = list(range(0, 800, 7))
    alone = {n: predict(stub, "shadow", [n], sampling_width=4, ppr_budget=16) for n in nodes}
    # a one-node request takes well under a millisecond here: hold each batch open 50 ms so that the
    # concurrent ones meet in the queue (a batch still leaves as soon as it is full)
    monkeypatch.setattr(served.server.registry.get("shadow").batcher, "max_delay_s", 0.05)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = dict(zip(nodes, pool.map(lambda n: predict(stub, "shadow", [n], sampling_width=4, ppr_budget=16),
                                            nodes), strict=True))
    assert max(r.timing.batch_size for r in together.values()) > 1, "concurrent requests should share batches"
    for n in nodes:
        assert list(together[n].labels) == list(alone[n].labels)
        np.testing.assert_allclose(together[n].probabilities, alone[n].probabilities, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "request_kw, code, text",
    [
        ({"model": "nope", "nodes": [1]}, grpc.StatusCode.NOT_FOUND, "model 'nope' not found"),
        ({"model": "shadow", "version": "7", "nodes": [1]}, grpc.StatusCode.NOT_FOUND, "no version 7"),
        ({"model": "shadow", "nodes": [800]}, grpc.StatusCode.INVALID_ARGUMENT, "800"),
        ({"model": "shadow", "nodes": [-3]}, grpc.StatusCode.INVALID_ARGUMENT, "-3"),
        ({"model": "shadow", "nodes": []}, grpc.StatusCode.INVALID_ARGUMENT, "no nodes"),
        ({"model": "shadow", "nodes": list(range(800)) * 6}, grpc.StatusCode.INVALID_ARGUMENT, "4800 nodes"),
        ({"model": "shadow", "nodes": [1], "sampling_width": -1}, grpc.StatusCode.INVALID_ARGUMENT, "-1"),
        ({"model": "shadow", "nodes": [1], "ppr_budget": 0}, grpc.StatusCode.INVALID_ARGUMENT, "ppr_budget"),
        ({"model": "shadow", "nodes": [1], "max_accuracy_loss": float("nan")}, grpc.StatusCode.INVALID_ARGUMENT,
         "nan"),
    ],
)
def test_errors_have_their_codes_and_server_stays_healthy(served, stub, request_kw, code, text):
    with pytest.raises(grpc.RpcError) as ei:
        stub.Predict(pb.PredictRequest(**request_kw))
    assert ei.value.code() == code
    assert text in ei.value.details()
    assert list(predict(stub, "shadow", [3]).labels), "the next valid request is answered"
    with grpc.insecure_channel(served.address) as ch:
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
    assert h.status == health_pb2.HealthCheckResponse.SERVING


def test_expired_deadline_work_is_dropped(served, stub, monkeypatch):
    """A request whose deadline passes while it waits in the queue is dropped, never run.

    The running batch is held on a gate (no wall-clock race: this VM pauses for up to a second), the small
    request is seen in the queue, its client deadline expires, then, once its deadline has also passed on the
    server's clock, the gate opens.
    """
    import threading

    rt = served.server.registry.get("shadow")
    gate, running = threading.Event(), threading.Event()
    real_process = rt.process
    ran: list[list[int]] = []

    def gated(items):
        running.set()
        gate.wait(60)
        ran.append([int(n) for it in items for n in it.payload.nodes])
        return real_process(items)

    monkeypatch.setattr(rt.batcher, "_process", gated)  # the batcher holds the bound method; gate that
    # the held batch must run in the worker: one run inline (serve.batcher) would hold the event loop too
    monkeypatch.setattr(rt.batcher, "inline_max_targets", 0)
    before = rt.batcher.items_dropped
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        blocker = pool.submit(stub.Predict, pb.PredictRequest(model="shadow", nodes=[5], sampling_width=2,
                                                              ppr_budget=16))
        assert running.wait(60), "the blocking batch started"
        late = pool.submit(stub.Predict, pb.PredictRequest(model="shadow", nodes=[1], sampling_width=1,
                                                           ppr_budget=8), timeout=3)
        with pytest.raises(grpc.RpcError) as ei:
            late.result(60)
        queued_when_expired = rt.batcher.queued_targets
        # The client's deadline passes a little before the server's (the server counts from the request's
        # arrival): open the gate only once the queued item's own deadline has passed on the batcher's clock.
        waiting = list(rt.batcher._queue)
        assert len(waiting) == 1 and waiting[0].deadline is not None, "the late request carries its deadline"
        limit = time.monotonic() + 60
        while rt.batcher._clock() <= waiting[0].deadline and time.monotonic() < limit:
            time.sleep(0.01)
        gate.set()
        assert list(blocker.result(60).labels)
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert queued_when_expired == 1, "the late request was waiting in the queue when its deadline passed"
    deadline = time.monotonic() + 30
    while rt.batcher.items_dropped == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rt.batcher.items_dropped == before + 1, "the expired request's work was dropped"
    assert [1] not in ran, "the expired request never reached the model"


@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_duplicated_ids_cost_one_subgraph_and_are_answered_per_position(served, stub, model, monkeypatch):
    rt = served.server.registry.get(model)
    seen: list[np.ndarray] = []
    stage = "_plan" if rt.extractor == "lhop" else "_subgraphs"  # plain models: an execution plan
    real = getattr(rt, stage)

    def recording(targets, *args, **kw):
        seen.append(np.array(targets))
        return real(targets, *args, **kw)

    monkeypatch.setattr(rt, stage, recording)
    nodes = [7, 300, 7, 7, 0, 300, 799]
    dup = predict(stub, model, nodes, sampling_width=2)
    assert sorted(seen[-1].tolist()) == [0, 7, 300, 799], "one subgraph (or plan target) per distinct id"
    singles = {v: predict(stub, model, [v], sampling_width=2) for v in set(nodes)}
    p = np.asarray(dup.probabilities).reshape(len(nodes), -1)
    for i, v in enumerate(nodes):
        assert dup.labels[i] == singles[v].labels[0]
        np.testing.assert_allclose(p[i], singles[v].probabilities, rtol=1e-5, atol=1e-6)
    # edge counts are sums over positions, as if every position had its own subgraph
    assert dup.settings.edges_kept == sum(singles[v].settings.edges_kept for v in nodes)
    assert dup.settings.edges_total == sum(singles[v].settings.edges_total for v in nodes)


def test_list_and_get_models(stub):
    models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert set(models) == {"shadow", "gcn"}
    sh = models["shadow"]
    assert sh.extractor == "ppr" and sh.architecture == "shadow-sage" and sh.ready
    assert sh.num_nodes == 800 and sh.num_features == 16 and sh.num_classes == 4
    assert len(sh.knob_table) >= 4 and "val_accuracy" in sh.metrics
    assert models["gcn"].extractor == "lhop" and models["gcn"].max_ppr_budget == 0


def test_embeddings_and_timing(stub):
    r = stub.Predict(pb.PredictRequest(model="shadow", nodes=[1, 2], return_embeddings=True))
    assert r.embedding_dim > 0 and len(r.embeddings) == 2 * r.embedding_dim
    assert len(r.probabilities) == 0, "probabilities only when asked"
    t = r.timing
    assert t.total_ms >= t.forward_ms > 0 and t.subgraph_ms > 0 and t.batch_size >= 2


def test_a_model_being_loaded_is_unavailable_not_not_found(tiny_repo, tmp_path, monkeypatch):
    """A QA report: while a model loaded (a shaDow model's PPR index, minutes on a large graph) it answered
    NOT_FOUND, which clients do not retry. It is UNAVAILABLE, saying so; then it answers."""
    from serve.registry import ModelRegistry

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "gcn" / "1", repo / "gcn" / "1")
    shutil.copytree(tiny_repo / "_data", repo / "_data")
    real = ModelRegistry._load_version
    release = threading.Event()

    def slow(self, name, version, path):
        if name == "late":
            release.wait(60)
        return real(self, name, version, path)

    monkeypatch.setattr(ModelRegistry, "_load_version", slow)
    with ServerThread(repo, {"poll_s": 0.2}) as srv, grpc.insecure_channel(srv.address) as ch:
        st = pbg.GnnServiceStub(ch)
        shutil.copytree(tiny_repo / "gcn" / "1", repo / "late" / ".1.tmp")
        (repo / "late" / ".1.tmp").rename(repo / "late" / "1")
        deadline = time.monotonic() + 30
        while "late" not in srv.server.registry._loading and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as ei:
            predict(st, "late", [1])
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
        assert "model 'late' is being loaded" in ei.value.details()
        with pytest.raises(grpc.RpcError) as ei:  # a model not on disk stays NOT_FOUND
            predict(st, "nope", [1])
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
        release.set()
        deadline = time.monotonic() + 60
        while not srv.server.registry._models.get("late") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert predict(st, "late", [1]).version == "1"


def test_new_version_swaps_in_and_bad_checkpoint_is_refused(tiny_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "gcn" / "1", repo / "gcn" / "1")
    shutil.copytree(tiny_repo / "_data", repo / "_data")
    with ServerThread(repo, {"poll_s": 0.2}) as srv, grpc.insecure_channel(srv.address) as ch:
        st = pbg.GnnServiceStub(ch)
        assert predict(st, "gcn", [1]).version == "1"
        # a broken model next to it: refused with a clear log, the others keep serving
        (repo / "broken" / "1").mkdir(parents=True)
        (repo / "broken" / "1" / "config.json").write_text("{not json")
        # a new version dropped in while requests flow
        errors, versions = [], set()
        shutil.copytree(tiny_repo / "gcn" / "1", repo / "gcn" / ".2.tmp")
        (repo / "gcn" / ".2.tmp").rename(repo / "gcn" / "2")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "2" not in versions:
            try:
                versions.add(predict(st, "gcn", [1, 2, 3]).version)
            except grpc.RpcError as e:
                errors.append(e)
        assert not errors and "2" in versions
        assert predict(st, "gcn", [1], version="1").version == "1"
        assert "broken" in "".join(srv.server.registry.failures())
        with pytest.raises(grpc.RpcError) as ei:
            predict(st, "broken", [1])
        # on disk, refused at load: out of service with the cause (no server path in it), not "not found"; only new
        # files mend it, so FAILED_PRECONDITION (clients do not retry it)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION, ei.value
        assert "out of service: its load failed (CheckpointError: config.json: not valid JSON" in ei.value.details()


def test_metrics_endpoint(tiny_repo, tmp_path):
    with ServerThread(tiny_repo, {"metrics_port": 0}) as srv, grpc.insecure_channel(srv.address) as ch:
        predict(pbg.GnnServiceStub(ch), "shadow", [1, 2])
        predict(pbg.GnnServiceStub(ch), "shadow", [3], sampling_width=2)
        with pytest.raises(grpc.RpcError):
            predict(pbg.GnnServiceStub(ch), "shadow", [10_000])
        for name in ("no-such-model-1", "no-such-model-2"):
            with pytest.raises(grpc.RpcError):
                predict(pbg.GnnServiceStub(ch), name, [1])
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.server.metrics_port}/metrics", timeout=10).read().decode()
    lines = set(text.splitlines())
    assert 'gnnserve_request_seconds_count{model="shadow",stage="forward"} 2.0' in lines
    assert 'gnnserve_request_seconds_bucket{le="+Inf",model="shadow",stage="total"} 2.0' in lines
    assert 'gnnserve_sampling_width_bucket{le="1.0",model="shadow"} 0.0' in lines
    assert 'gnnserve_sampling_width_bucket{le="2.0",model="shadow"} 1.0' in lines  # S = 2 in the "<= 2" bucket
    assert 'gnnserve_predictions_total{model="shadow"} 3.0' in lines
    assert 'gnnserve_requests_total{code="INVALID_ARGUMENT",method="Predict",model="shadow"} 1.0' in lines
    # unknown model names are the client's: counted without a series per name
    assert 'gnnserve_requests_total{code="NOT_FOUND",method="Predict",model=""} 2.0' in lines
    assert "no-such-model" not in text
    assert "gnnserve_batch_targets_bucket" in text
    # the per-node caches, per model version: a plain model's activation rows too
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}

    def sample(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    assert sample("gnnserve_cache_lookups_total", model="shadow", version="1", cache="projection", result="miss") > 0
    assert sample("gnnserve_cache_rows", model="shadow", version="1", cache="projection") > 0
    assert sample("gnnserve_cache_bytes", model="gcn", version="1", cache="projection") > 0
    # the gcn model served only its warm-up batches: their rows were computed once each
    acts_rows = sample("gnnserve_cache_rows", model="gcn", version="1", cache="activation")
    assert acts_rows > 0 and sample("gnnserve_cache_lookups_total", model="gcn", version="1", cache="activation",
                                    result="miss") == acts_rows
    assert sample("gnnserve_cache_bytes", model="gcn", version="1", cache="activation") > 0


def test_metrics_bind_their_own_host(tiny_repo):
    """``--metrics-host``: the /metrics endpoint (no token) binds where the operator says, apart from gRPC (a QA
    report: with --host 0.0.0.0 it was open on every interface, with no way to keep it internal)."""
    import urllib.error

    with ServerThread(tiny_repo, {"metrics_port": 0, "metrics_host": "127.0.0.2"}) as srv:
        port = srv.server.metrics_port
        assert srv.server.metrics._http_server.server_address[0] == "127.0.0.2"
        assert b"gnnserve_" in urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10).read()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
    with ServerThread(tiny_repo, {"metrics_port": 0}) as srv:  # default: --host
        assert srv.server.metrics._http_server.server_address[0] == "127.0.0.1"


def test_metrics_of_the_resident_paths(tiny_repo):
    """--resident: the scrape reports each resident model's device state as cache "resident" (targets
    answered, rows and bytes held) instead of failing on it."""
    with ServerThread(tiny_repo, {"metrics_port": 0, "runtime_kw": {"resident": True}}) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        for model in ("gcn", "shadow"):
            predict(pbg.GnnServiceStub(ch), model, [1, 2, 3])
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.server.metrics_port}/metrics", timeout=10).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    for model in ("gcn", "shadow"):
        key = (("cache", "resident"), ("model", model), ("version", "1"))
        assert samples[("gnnserve_cache_lookups_total", tuple(sorted((*key, ("result", "hit")))))] >= 3
        assert samples[("gnnserve_cache_rows", key)] >= 800 and samples[("gnnserve_cache_bytes", key)] > 0


def test_warm_projections_fills_the_cache_before_the_model_is_served(tiny_repo):
    from serve.registry import ModelRegistry
    from serve.runtime import RuntimeOptions

    loaded = {}
    for warm in (False, True):
        reg = ModelRegistry(str(tiny_repo), RuntimeOptions(warm_projections=warm))
        try:
            rt = reg._load_version("gcn", 1, tiny_repo / "gcn" / "1")  # load + warm, as the loader thread does
            assert rt.projections.enabled
            loaded[warm] = int(rt.projections._valid.sum())
            if warm:  # and a plain model's first-layer rows at its default width
                _, valid = rt._activations._tables[rt.limits.default_sampling_width]
                assert valid.all()
        finally:
            reg.shutdown_executors()
    assert loaded[True] == 800  # every node of tiny_dataset
    assert loaded[False] < 800  # without the option only the warm-up request's nodes are projected


def test_small_batches_run_torch_on_one_thread_and_restore_the_count():
    from serve.runtime import SMALL_BATCH_ROWS, _torch_threads_for

    before = torch.get_num_threads()
    configured = max(2, before)
    torch.set_num_threads(configured)
    try:
        with _torch_threads_for(SMALL_BATCH_ROWS - 1, configured):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == configured
        with _torch_threads_for(SMALL_BATCH_ROWS, configured):
            assert torch.get_num_threads() == configured
        with pytest.raises(RuntimeError), _torch_threads_for(10, configured):
            raise RuntimeError("a failing forward pass restores the count too")
        assert torch.get_num_threads() == configured
        with _torch_threads_for(10 * SMALL_BATCH_ROWS, configured, fixed=1):  # a count given: any batch
            assert torch.get_num_threads() == 1
        with _torch_threads_for(1, configured, fixed=2):
            assert torch.get_num_threads() == 2
        with _torch_threads_for(1, configured, fixed=configured + 5):  # never above the process's count
            assert torch.get_num_threads() == configured
        assert torch.get_num_threads() == configured
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("option, large, small", [(None, 1, 1), (0, "configured", 1), (2, 2, 2)])
def test_the_torch_operator_paths_run_on_torch_path_threads(option, large, small):
    """RuntimeOptions.torch_path_threads (--torch-path-threads): by default a batch on the torch operator paths (new
    nodes on a CPU) runs on one torch thread however large it is (a descheduled thread of two stalls every
    operator's barrier); 0 keeps the rule of the compiled paths; the count is restored after."""
    import types

    from serve.paths import _torch_answers
    from serve.runtime import SMALL_BATCH_ROWS, RuntimeOptions

    before = torch.get_num_threads()
    configured = max(3, before)
    torch.set_num_threads(configured)
    opts = RuntimeOptions() if option is None else RuntimeOptions(torch_path_threads=option)
    rt = types.SimpleNamespace(options=opts, _torch_threads=configured)  # what _torch_answers reads of a runtime
    seen = []

    def forward():
        seen.append(torch.get_num_threads())
        return torch.zeros(2, 3), None, 0.0

    try:
        for rows in (10 * SMALL_BATCH_ROWS, 10):
            probs, labels, emb, _ = _torch_answers(rt, rows, forward, False)
            assert probs.shape == (2, 3) and list(labels) == [0, 0] and emb is None
            assert torch.get_num_threads() == configured
        assert seen == [configured if large == "configured" else large, small]
    finally:
        torch.set_num_threads(before)


def test_batched_requests_run_inline_on_the_cpu_by_default(served, stub):
    """RuntimeOptions.inline_max_targets unset: INLINE_MAX_TARGETS["cpu"] (256) on the CPU, so a 64-node request
    with nothing else waiting runs on the event loop (no thread hand-off) when its estimated work is within
    inline_max_work."""
    from serve.runtime import INLINE_MAX_TARGETS

    rt = served.server.registry.get("gcn")
    assert rt.batcher.inline_max_targets == INLINE_MAX_TARGETS["cpu"] == 256
    nodes = list(range(64))
    call_work = rt.estimate_work(validate_predict(pb.PredictRequest(model="gcn", nodes=nodes, sampling_width=2),
                                                  rt.limits))
    assert call_work <= rt.batcher.inline_max_work
    before = rt.batcher.batches_inline
    res = stub.Predict(pb.PredictRequest(model="gcn", nodes=nodes, sampling_width=2))
    assert len(res.labels) == 64
    assert rt.batcher.batches_inline == before + 1


def test_inline_targets_by_device():
    """serve.runtime.inline_targets_for: 256 on the CPU, 0 (never inline) on CUDA (any index) and any other
    device, a value given kept whatever the device."""
    from serve.runtime import inline_targets_for

    assert inline_targets_for(torch.device("cpu"), None) == 256
    assert inline_targets_for(torch.device("cuda"), None) == 0
    assert inline_targets_for(torch.device("cuda:1"), None) == 0
    assert inline_targets_for(torch.device("meta"), None) == 0
    assert inline_targets_for(torch.device("cpu"), 0) == 0
    assert inline_targets_for(torch.device("cuda"), 64) == 64


def test_a_load_failures_reason_reaches_clients_without_paths_or_addresses():
    """A new-user audit: the reason of a refused load mangled URLs (redis://127.0.0.1:1/3 became redis:/3) and
    passed the Redis host on to clients. Paths keep their file name, URLs their scheme, hosts their place."""
    from serve.registry import _for_client

    got = _for_client("FeatureUnavailable: Redis at redis://u:***@10.1.2.3:6379/3 unreachable (ConnectionError: "
                      "Error 111 connecting to 10.1.2.3:6379. Connection refused.) [::1]:7000 localhost:6380")
    assert got == ("FeatureUnavailable: Redis at redis://... unreachable (ConnectionError: Error 111 connecting to "
                   "<host>. Connection refused.) <host> <host>"), got
    assert _for_client("CheckpointError: /srv/repo/m/1/config.json: not valid JSON") == \
        "CheckpointError: config.json: not valid JSON"
    assert len(_for_client("x" * 500)) == 300


def test_a_checkpoint_without_a_version_directory_is_named_at_start(tiny_repo, tmp_path, caplog):
    """A new-user audit: `gnnserve train --out REPO/x` (no version directory) succeeded, and `serve --repo REPO`
    said only "no model could be loaded". The start now names the stray checkpoint and where to move it, and says
    that with --poll-s 0 the server stays NOT_SERVING."""
    import logging
    import shutil

    from .serving import ServerThread

    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(tiny_repo / "gcn" / "1", repo / "x")
    with caplog.at_level(logging.ERROR), ServerThread(repo, {"poll_s": 0}):
        pass
    text = caplog.text
    assert "no model could be loaded from" in text
    assert f"{repo / 'x'}: a checkpoint without a version directory; move it to {repo / 'x' / '1'}" in text, text
    assert "--poll-s 0: the repository is not looked at again" in text
