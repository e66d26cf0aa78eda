"""A hostile client cannot hurt the server (issue #23): bounded work per request, bounded labels,
honest status counts, one model never stalling another, a stop that a model load cannot outlive.

Everything runs against a real server on loopback (in-process :class:`serve.server.BackgroundServer`
or a ``gnnserve serve`` subprocess), real trained models and, where a store is needed, a real
``redis-server``. Memory tests read the server process's resident set (``/proc/PID/status``)
around the request; event-loop tests time health checks while the heavy request runs.
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg
from clients._gen import inference_pb2 as ipb
from clients._gen import inference_pb2_grpc as ipbg

from .hostile_support import INFER, PREDICT, PeakRss, field, id_bomb, neighbour_bomb, raw_call
from .hostile_support import hub_dataset as make_hub_dataset
from .reliability_support import check_answer
from .serving import REPO_ROOT, ServerProcess, ServerThread, make_repo, metric_samples

DOCUMENTED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
              grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}


def wait_for_count(port: int, method: str, code: str, value: float, timeout: float = 30) -> None:
    seen = None
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        seen = sum(v for labels, v in metric_samples(port, "gnnserve_requests_total")
                   if labels.get("method") == method and labels.get("code") == code)
        if seen == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{method} {code} counted {seen} times, not {value}")


@pytest.fixture(scope="module")
def hub_dataset():
    return make_hub_dataset()


@pytest.fixture(scope="module")
def hub_repo(tmp_path_factory, hub_dataset):
    return make_repo(tmp_path_factory.mktemp("hubrepo"), hub_dataset, {"hub": "gcn"}, epochs=5, patience=5,
                     knob_widths=[0, 4])


# ------------------------------------------------------------------- 5. work before limits
def test_declared_node_count_is_refused_from_the_bytes_before_parsing(tiny_repo, tiny_dataset):
    """40 million one-byte ids (a 40 MB message that parses into 320 MB of int64 and far more as a
    list) are refused from the message's bytes: INVALID_ARGUMENT, and the server's resident set
    grows by about the message itself, not by what it declares."""
    n = 40_000_000
    bombs = {method: id_bomb(method, "gcn", n) for method in (PREDICT, INFER)}
    with ServerProcess(tiny_repo, "--poll-s", "0") as srv, grpc.insecure_channel(
            srv.address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        assert srv.proc is not None
        for method, data in bombs.items():
            raw_call(ch, PREDICT, pb.PredictRequest(model="gcn", nodes=[1]).SerializeToString())  # warm path
            with PeakRss(srv.proc.pid) as mem:
                t0 = time.perf_counter()
                _, err = raw_call(ch, method, data)
                took = time.perf_counter() - t0
            assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            assert "more than the limit of 4096" in err.details()
            grown = mem.peak - mem.before
            print(f"{method}: {len(data) / 1e6:.0f} MB refused in {took * 1e3:.0f} ms, peak RSS +{grown / 1e6:.0f} MB")
            # the message itself (gRPC's receive buffers and the bytes handed to the deserializer: 118 MB
            # seen for the first 40 MB message, 7 MB for the second) and nothing of what it declares (the
            # parsed ids alone would be 320 MB, their NumPy copy as much again)
            assert grown < 4 * len(data), f"RSS grew by {grown / 1e6:.0f} MB for a {len(data) / 1e6:.0f} MB message"
        resp, err = raw_call(ch, PREDICT, pb.PredictRequest(model="gcn", nodes=[5], return_probabilities=True)
                             .SerializeToString())
        assert err is None
        check_answer(pb.PredictResponse.FromString(resp), [5], tiny_repo, tiny_dataset, "gcn")


UPDATE = "/gnnserve.v1.GnnService/UpdateGraph"
ENTRIES = "entries (rows, new nodes and their edges, edges), more than --max-update-size 100000; split it into several updates"


def _own_repo(tiny_repo, path):
    """A repository over ``tiny_repo``'s models with an update log of its own (no update reaches the shared one)."""
    path.mkdir()
    for name in ("gcn", "shadow", "_data"):
        (path / name).symlink_to(tiny_repo / name)
    return path


@pytest.fixture
def update_parses(monkeypatch):
    """The sizes of the UpdateGraph requests a server started afterwards parses (its deserializer, spied on)."""
    seen: list[int] = []
    parse = pb.UpdateGraphRequest.FromString

    def spy(data: bytes):
        seen.append(len(data))
        return parse(data)

    monkeypatch.setattr(pb.UpdateGraphRequest, "FromString", staticmethod(spy))
    return seen


def test_an_oversized_update_is_refused_from_its_bytes_before_parsing(tiny_repo, tmp_path, update_parses):
    """UpdateGraph requests were parsed whole before --max-update-size was counted: 60 MB of one-byte neighbour ids
    cost ~940 MB and seconds of the event loop (a hostile-client report). The entries parse_update counts are counted
    on the bytes (serve.wire.check_update), to the entry: 100,000 pass (and are parsed: this update is then refused
    for its feature row), 100,001 and the bomb are refused unparsed, with parse_update's message. A --read-only
    server refuses every update unparsed."""
    from clients import GnnClient

    bad_row = field(3, pb.FeatureRow(node=10**6, features=[0.0] * 16).SerializeToString())
    no_edge = field(5, b"")  # an (empty) Edge of remove_edges: one entry, two bytes
    at_limit = field(1, b"gcn") + bad_row + no_edge * 99_999
    over = at_limit + no_edge
    bomb = field(1, b"gcn") + field(4, field(2, b"\x01" * 5_000_000))  # one new node, 5 million neighbour ids
    opts = [("grpc.max_send_message_length", 64 << 20)]
    with ServerThread(_own_repo(tiny_repo, tmp_path / "repo"), {"poll_s": 0}) as srv, \
            grpc.insecure_channel(srv.address, options=opts) as ch:
        _, err = raw_call(ch, UPDATE, at_limit)
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "features[0]: node 1000000 is not in the graph" in err.details()
        assert update_parses == [len(at_limit)]  # parsed: the bytes' count let it through
        for data, n in ((over, "100001"), (bomb, "")):
            _, err = raw_call(ch, UPDATE, data)
            assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            assert update_parses == [len(at_limit)], f"an update of {len(data)} bytes was parsed before its refusal"
            assert err.details().startswith(f"this update has at least {n}") and err.details().endswith(ENTRIES), \
                err.details()
        with GnnClient(srv.address) as c:  # the server goes on taking updates
            assert c.update_graph("gcn", features={3: np.ones(16)}).graph_version == 1
    with ServerThread(_own_repo(tiny_repo, tmp_path / "ro"), {"poll_s": 0, "runtime_kw": {"read_only": True}}) as srv, \
            grpc.insecure_channel(srv.address, options=opts) as ch:
        valid = pb.UpdateGraphRequest(model="gcn", features=[pb.FeatureRow(node=3, features=[1.0] * 16)])
        for data in (valid.SerializeToString(), bomb):
            _, err = raw_call(ch, UPDATE, data)
            assert err is not None and err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
            assert err.details() == "this server does not take graph updates: it was started with --read-only"
    assert len(update_parses) == 2, "the read-only server parsed an update"


def _alive(kind, marker: str) -> int:
    """How many ``kind`` messages with request id ``marker`` exist in this process (live or garbage not collected)."""
    return sum(1 for o in gc.get_objects() if type(o) is kind and o.request_id == marker)


def test_a_requests_memory_is_freed_when_its_call_ends(tiny_repo, tmp_path):
    """A refused request stayed in memory until Python's cyclic garbage collector ran: the error kept its traceback,
    whose frames hold the request and what holds the error (the update's ticket and future, the aborted call's
    state), a reference cycle (a hostile-client report: RSS +940 MB per refused 60 MB update, 3.5 GB after three).
    With the collector off, every request here, refused or answered, is gone once its reply is in."""
    cases = [  # (method, message, status)
        (UPDATE, pb.UpdateGraphRequest(model="gcn", features=[pb.FeatureRow(node=10**6, features=[0.0] * 16)]),
         grpc.StatusCode.INVALID_ARGUMENT),  # refused by parse_update, in the graph's writer thread
        (UPDATE, pb.UpdateGraphRequest(model="gcn", add_edges=[pb.Edge(src=3, dst=3)]),
         grpc.StatusCode.INVALID_ARGUMENT),  # refused by the graph edit (a self-loop)
        (UPDATE, pb.UpdateGraphRequest(model="gcn", expect_graph_version=77,
                                       features=[pb.FeatureRow(node=5, features=[0.5] * 16)]),
         grpc.StatusCode.ABORTED),
        (UPDATE, pb.UpdateGraphRequest(model="gcn", new_nodes=[pb.NewNode(features=[0.1] * 16, neighbors=[1, 2])]),
         grpc.StatusCode.OK),
        (UPDATE, pb.UpdateGraphRequest(model="nope", features=[pb.FeatureRow(node=5, features=[0.5] * 16)]),
         grpc.StatusCode.NOT_FOUND),
        (PREDICT, pb.PredictRequest(model="gcn", nodes=[10**6]), grpc.StatusCode.INVALID_ARGUMENT),
        (PREDICT, pb.PredictRequest(model="gcn", new_nodes=[pb.NewNode(features=[0.1] * 15)]),
         grpc.StatusCode.INVALID_ARGUMENT),
        (PREDICT, pb.PredictRequest(model="gcn", nodes=[1, 2]), grpc.StatusCode.OK),
    ]
    with ServerThread(_own_repo(tiny_repo, tmp_path / "repo"), {"poll_s": 0}) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        raw_call(ch, PREDICT, pb.PredictRequest(model="gcn", nodes=[1]).SerializeToString())  # warm path
        # sent as bytes, each request marked by its id: the server parses its own copy, the test keeps none
        sent = []
        for i, (method, msg, code) in enumerate(cases):
            msg.request_id = f"freed-{i}"
            sent.append((method, type(msg), msg.request_id, msg.SerializeToString(), code))
        del cases, msg
        gc.collect()
        gc.disable()
        try:
            for method, kind, marker, data, code in sent:
                _, err = raw_call(ch, method, data, timeout=60)
                assert (err.code() if err is not None else grpc.StatusCode.OK) == code, (marker, err)
                t_end = time.monotonic() + 10
                while _alive(kind, marker) and time.monotonic() < t_end:  # the call's last steps after the reply
                    time.sleep(0.02)
                assert not _alive(kind, marker), f"{method} request {marker} ({code.name}) kept after its call"
        finally:
            gc.enable()


def test_new_node_neighbours_are_bounded_per_request(served):
    """200 new nodes of 600 neighbours each (120,000 in all, each node within its own limit) are
    refused as a whole: the total per request is bounded."""
    req = neighbour_bomb("shadow")
    with grpc.insecure_channel(served.address) as ch:
        try:
            pbg.GnnServiceStub(ch).Predict(req, timeout=60)
            raise AssertionError("accepted")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            assert "more than the limit of 100000 per request" in err.details()


def test_concurrent_rpcs_are_bounded(tiny_repo, tiny_dataset):
    """With --max-concurrent-rpcs 2, a third RPC while two run gets RESOURCE_EXHAUSTED at once;
    the two finish correctly."""
    opts = {"max_concurrent_rpcs": 2, "poll_s": 0, "runtime_kw": {"max_delay_ms": 1500.0, "inline_max_targets": 0}}
    with ServerThread(tiny_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        held = [stub.Predict.future(pb.PredictRequest(model="gcn", nodes=[v], return_probabilities=True), timeout=60)
                for v in (3, 4)]
        time.sleep(0.5)  # both admitted and waiting in the held-open batch
        t0 = time.perf_counter()
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="gcn", nodes=[5]), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.perf_counter() - t0 < 1.0, "refused only after the held batch ran"
        for fut, v in zip(held, (3, 4), strict=True):
            check_answer(fut.result(), [v], tiny_repo, tiny_dataset, "gcn")


def test_estimated_work_bounds_the_edges_each_request_aggregates(served, tiny_repo):
    """``ModelRuntime.estimate_work`` is an upper bound of what a request aggregates (the answer's
    ``edges_kept``), for plain and shaDow models, at exact and sampled widths, with new nodes."""
    rng = np.random.default_rng(5)
    reg = served.server.registry
    with grpc.insecure_channel(served.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        for model in ("gcn", "shadow"):
            rt = reg.get(model)
            for _ in range(25):
                nodes = rng.integers(0, 800, rng.integers(1, 6)).tolist()
                width = int(rng.choice([0, 1, 2, 4, 8, 64]))
                req = pb.PredictRequest(model=model, nodes=nodes, sampling_width=width)
                if rng.random() < 0.3:
                    nn = req.new_nodes.add()
                    nn.features.extend(rng.normal(size=16).astype(np.float32).tolist())
                    nn.neighbors.extend(rng.choice(800, int(rng.integers(1, 30)), replace=False).tolist())
                resp = stub.Predict(req, timeout=60)
                from serve.validation import validate_predict

                call = validate_predict(req, rt.limits)
                est = rt.estimate_work(call)
                if not call.new_nodes and rt.activations_complete(call.sampling_width):
                    # every first-layer row cached: the estimate is the last layer's rows (what runs),
                    # while edges_kept reports the 2-layer paths those rows stand for
                    assert est <= resp.settings.edges_kept
                    continue
                assert est >= resp.settings.edges_kept, (model, nodes, width, est, resp.settings.edges_kept)


def test_an_expensive_request_is_refused_before_it_runs(hub_repo, hub_dataset):
    """An exact-width request on the hub is priced (walk bound of its 2-layer pass) and refused with
    RESOURCE_EXHAUSTED when that exceeds --max-request-work; the same node sampled, and an ordinary
    node exact, are answered."""
    from kernels.plan import exact_path_edges, walk_bounds

    g = hub_dataset.graph
    hub_work = walk_bounds(g, 2)[0]
    assert hub_work >= exact_path_edges(g, np.array([0]), 2)[0] > g.num_edges // 2
    limit = int(hub_work // 4)
    # no activation cache: with every first-layer row cached (warm-up's batch holds the hub, whose rows
    # are every node) an exact hub request only runs its last layer, and is priced so
    opts = {"poll_s": 0, "runtime_kw": {"max_request_work": limit, "activation_budget_bytes": 0}}
    with ServerThread(hub_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="hub", nodes=[0], sampling_width=0), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"more than the limit of {limit} per request" in info.value.details()
        assert "sampling_width" in info.value.details()
        assert stub.Predict(pb.PredictRequest(model="hub", nodes=[0], sampling_width=4), timeout=60).labels
        ok = stub.Predict(pb.PredictRequest(model="hub", nodes=[7], sampling_width=0), timeout=60)
        assert ok.settings.edges_kept <= walk_bounds(g, 2)[7]


def test_a_shadow_models_work_refusal_names_the_ppr_budget(tiny_repo):
    """A new-user report: the refusal over --max-request-work suggested a smaller sampling_width, fewer nodes or
    fewer new-node neighbours, but a shaDow model's work is L K min(S, K) per target: K is the lever. A plain
    model's refusal names no budget (it has none)."""
    with ServerThread(tiny_repo, {"poll_s": 0, "runtime_kw": {"max_request_work": 200}}) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="shadow", nodes=list(range(10)), sampling_width=0, ppr_budget=32),
                         timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "more than the limit of 200 per request; use a smaller ppr_budget" in info.value.details()
        assert "this request has K = 32" in info.value.details(), info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="gcn", nodes=list(range(50)), sampling_width=0), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "; use a smaller sampling_width" in info.value.details() and "ppr_budget" not in info.value.details()


def test_the_sdk_chunks_of_large_ids_are_taken(hub_repo):
    """Ids from 16,384 up take three bytes on the wire: the SDK's full 4,096-id chunks of them are
    answered, not refused as "at least 8192 nodes" (the count before parsing once took the continuation
    bytes for the ids), and each answer equals the one for that node alone."""
    from clients import GnnClient

    ids = np.random.default_rng(3).integers(16_384, 20_000, 9_000)
    with ServerThread(hub_repo, {"poll_s": 0}) as srv, GnnClient(srv.address) as c:
        res = c.predict("hub", ids, sampling_width=4)
        assert len(res.labels) == len(ids)
        for i in (0, 4_095, 4_096, 8_999):
            assert c.predict("hub", [int(ids[i])], sampling_width=4).labels[0] == res.labels[i]


# ------------------------------------------------------------------- 6. heavy work off the loop
def test_a_heavy_request_runs_off_the_event_loop(hub_repo):
    """Exact requests on the hub (one target each, under --inline-max-targets) are priced above
    --inline-max-work and go to the worker thread: health checks keep answering while they run.
    A cheap one-node request still runs inline."""
    opts = {"poll_s": 0, "runtime_kw": {"activation_budget_bytes": 0}}  # every hub request pays its whole pass
    with ServerThread(hub_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        health = health_pb2_grpc.HealthStub(ch)
        rt = srv.server.registry.get("hub")
        inline0 = rt.batcher.batches_inline
        stub.Predict(pb.PredictRequest(model="hub", nodes=[9], sampling_width=4), timeout=60)
        assert rt.batcher.batches_inline == inline0 + 1, "a cheap request should still run inline"
        heavy_ms: list[float] = []
        stop = threading.Event()

        def heavy() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                stub.Predict(pb.PredictRequest(model="hub", nodes=[0], sampling_width=0), timeout=120)
                heavy_ms.append(1e3 * (time.perf_counter() - t0))

        inline1 = rt.batcher.batches_inline
        th = threading.Thread(target=heavy)
        th.start()
        probes: list[float] = []
        try:
            t_end = time.monotonic() + 3.0
            while time.monotonic() < t_end or len(heavy_ms) < 3:
                t0 = time.perf_counter()
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
                probes.append(1e3 * (time.perf_counter() - t0))
                time.sleep(0.003)
        finally:
            stop.set()
            th.join(120)
        assert rt.batcher.batches_inline == inline1, "a heavy request ran on the event loop"
        heavy_p50 = float(np.median(heavy_ms))
        probe_p50, probe_p99 = (float(v) for v in np.percentile(probes, [50, 99]))
        print(f"heavy request p50 {heavy_p50:.1f} ms ({len(heavy_ms)}), health check p50 {probe_p50:.1f} ms, "
              f"p99 {probe_p99:.1f} ms ({len(probes)} probes)")
        # a loop blocked by back-to-back heavy requests would hold a probe for the rest of the current one: half
        # of one at the median. The median, not the p99: a 2-vCPU CI machine's pauses reach the tail either way
        # (p99 21.2 ms against a heavy p50 of 19.2 in one CI run, 8.9 ms here on a quiet run)
        assert probe_p50 < heavy_p50 / 2, "health checks waited for the heavy requests"


# ------------------------------------------------------------------- 4. bounded metric labels
def test_client_chosen_model_names_never_become_metric_labels(tiny_repo):
    """ModelReady, ModelMetadata and Predict with 20 made-up names each, and Predict with made-up names
    while draining: every gnnserve_requests_total series is labelled with a served model or ""."""
    srv = ServerThread(tiny_repo, {"metrics_port": 0, "poll_s": 0, "drain_s": 5.0}).start()
    stopping = threading.Thread(target=srv.stop, kwargs={"grace_s": 10.0})
    try:
        with grpc.insecure_channel(srv.address) as ch:
            triton = ipbg.GRPCInferenceServiceStub(ch)
            stub = pbg.GnnServiceStub(ch)
            for i in range(20):
                name = f"made-up-{i}-{'x' * i}"
                assert not triton.ModelReady(ipb.ModelReadyRequest(name=name), timeout=10).ready
                with pytest.raises(grpc.RpcError):
                    triton.ModelMetadata(ipb.ModelMetadataRequest(name=name), timeout=10)
                with pytest.raises(grpc.RpcError):
                    stub.Predict(pb.PredictRequest(model=name, nodes=[1]), timeout=10)
            stub.Predict(pb.PredictRequest(model="gcn", nodes=[1]), timeout=10)
            port = srv.server.metrics_port
            stopping.start()  # a graceful stop: the listener refuses with UNAVAILABLE for drain_s
            refused = 0
            t_end = time.monotonic() + 30
            while refused < 20 and time.monotonic() < t_end:
                try:
                    stub.Predict(pb.PredictRequest(model=f"draining-{refused}", nodes=[1]), timeout=10)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        refused += 1
            assert refused == 20
            labels = {lab["model"] for lab, _ in metric_samples(port, "gnnserve_requests_total")}
            codes = {lab["code"] for lab, _ in metric_samples(port, "gnnserve_requests_total")}
        assert "UNAVAILABLE" in codes
        assert labels <= {"", "gcn", "shadow"}, labels
        assert "gcn" in labels
    finally:
        if stopping.is_alive() or not stopping.ident:
            stopping.join(60) if stopping.ident else srv.stop()


def test_deadline_and_cancellation_are_counted_as_such(tiny_repo):
    """A call whose deadline passes while its batch is held, and a call the client cancels, are
    counted DEADLINE_EXCEEDED and CANCELLED, never OK."""
    opts = {"metrics_port": 0, "poll_s": 0, "runtime_kw": {"max_delay_ms": 800.0, "inline_max_targets": 0}}
    with ServerThread(tiny_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="gcn", nodes=[1]), timeout=0.2)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for_count(srv.server.metrics_port, "Predict", "DEADLINE_EXCEEDED", 1)
        fut = stub.Predict.future(pb.PredictRequest(model="gcn", nodes=[2]), timeout=30)
        time.sleep(0.2)
        fut.cancel()
        wait_for_count(srv.server.metrics_port, "Predict", "CANCELLED", 1)
        time.sleep(1.0)  # the held batches have run by now
        ok = sum(v for lab, v in metric_samples(srv.server.metrics_port, "gnnserve_requests_total")
                 if lab.get("code") == "OK" and lab.get("method") == "Predict")
        assert ok == 0


def test_the_queue_gauge_is_current_after_deadline_drops_and_refusals(tiny_repo):
    """``gnnserve_queue_targets`` follows the queue through an overload burst and is back to 0 once the queue
    is empty. It was set only after a successful submit: a call that succeeded while others waited left their
    targets in the gauge after those were dropped for their deadline (an operations report: 15 000 "targets
    waiting" on an idle server). Here call A's batch waits in the worker for the graph's lock (held by the
    test), five calls of 10 targets queue behind it until their deadline passes, a sixth is refused (queue
    full); A then succeeds while the five are still queued, and the batcher drops them."""
    opts = {"metrics_port": 0, "poll_s": 0,
            "runtime_kw": {"max_delay_ms": 2500.0, "inline_max_targets": 0, "max_queue_targets": 64}}
    with ServerThread(tiny_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        port = srv.server.metrics_port
        rt = srv.server.registry.get("gcn")

        def gauge() -> float | None:
            got = [v for lab, v in metric_samples(port, "gnnserve_queue_targets") if lab.get("model") == "gcn"]
            return got[0] if got else None

        def wait_gauge(value: float) -> None:
            t_end = time.monotonic() + 60
            while (seen := gauge()) != value:
                assert time.monotonic() < t_end, f"gnnserve_queue_targets is {seen}, not {value}"
                time.sleep(0.02)

        with rt.data.live.lock.write():  # every batch waits in the worker for the graph's read lock
            a = stub.Predict.future(pb.PredictRequest(model="gcn", nodes=[1], sampling_width=4), timeout=120)
            t_end = time.monotonic() + 60
            while not rt.batcher._running_batch:  # A's batch taken (after its hold), waiting for the lock
                assert time.monotonic() < t_end, "A's batch never started"
                time.sleep(0.01)
            burst = [stub.Predict.future(pb.PredictRequest(model="gcn", nodes=list(range(10 * i, 10 * i + 10)),
                                                           sampling_width=2), timeout=1.0) for i in range(5)]
            wait_gauge(50.0)  # 5 x 10 targets queued behind A's batch
            with pytest.raises(grpc.RpcError) as info:
                stub.Predict(pb.PredictRequest(model="gcn", nodes=list(range(100, 120)), sampling_width=2),
                             timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue full" in info.value.details()
            for f in burst:
                assert f.exception(timeout=60).code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert gauge() == 50.0  # still queued: dropped when the batcher next takes a batch
        assert len(a.result(timeout=60).labels) == 1
        wait_gauge(0.0)  # the five dropped: nothing waits
        assert rt.batcher.queued_targets == 0 and rt.batcher.items_dropped == 5


# ------------------------------------------------------------------------- 7. smaller items
def test_not_found_names_a_bounded_number_of_models(tmp_path, tiny_repo):
    repo = tmp_path / "many"
    shutil.copytree(tiny_repo / "_data", repo / "_data")
    for i in range(13):
        shutil.copytree(tiny_repo / "gcn", repo / f"m{i:02d}")
    with ServerThread(repo, {"poll_s": 0}) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="nope", nodes=[1]), timeout=30)
        msg = info.value.details()
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert sum(f"m{i:02d}" in msg for i in range(13)) == 10 and "and 3 more" in msg, msg
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="y" * 50_000, nodes=[1]), timeout=30)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and len(info.value.details()) < 300


def test_client_widths_leave_room_for_the_default_width(tiny_repo):
    """An activation budget of two tables: client-chosen widths take one, the model's default width
    keeps the other (before, widths 3 and 5 took both and every default request ran the whole plan)."""
    from models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_repo / "gcn" / "1")
    table = 800 * (4 * int(ckpt.config["model"]["hidden"]) + 1)
    opts = {"poll_s": 0, "runtime_kw": {"activation_budget_bytes": 2 * table}}
    with ServerThread(tiny_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        rt = srv.server.registry.get("gcn")
        default = rt.limits.default_sampling_width
        widths = [w for w in (3, 5, 6) if w != default][:2]
        for w in widths:
            stub.Predict(pb.PredictRequest(model="gcn", nodes=[1, 2], sampling_width=w), timeout=30)
        stub.Predict(pb.PredictRequest(model="gcn", nodes=[1, 2]), timeout=30)
        held = rt.cache_stats()["activation"]
        assert held["widths"] == 2
        assert default in rt.activation_widths() and widths[1] not in rt.activation_widths()


def test_one_stalled_model_does_not_stall_another(tiny_repo, tiny_dataset):
    """Redis paused: model gcn's batch waits on it for uncached rows; model shadow, whose rows are
    cached, answers meanwhile (each model has its own worker; before, one thread served all)."""
    from serve.features import load_features

    from .redis_server import RedisServer, find_redis_server

    if find_redis_server() is None:
        pytest.skip("no redis-server binary")
    redis = RedisServer().start()
    try:
        load_features(tiny_dataset, redis.url, version=1, progress=False)
        opts = {"feature_url": redis.url, "poll_s": 0,
                "feature_options": {"socket_timeout": 20.0, "retries": 0}}
        with ServerThread(tiny_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
            stub = pbg.GnnServiceStub(ch)
            cached = [10, 11, 12]
            stub.Predict(pb.PredictRequest(model="shadow", nodes=cached), timeout=30)  # rows now cached
            redis.pause()
            try:
                stalled = stub.Predict.future(pb.PredictRequest(model="gcn", nodes=[700, 701]), timeout=60)
                time.sleep(0.5)
                assert not stalled.done(), "gcn's rows should need Redis"
                t0 = time.perf_counter()
                resp = stub.Predict(pb.PredictRequest(model="shadow", nodes=cached, return_probabilities=True),
                                    timeout=30)
                took = time.perf_counter() - t0
                assert not stalled.done()
            finally:
                redis.resume()
            print(f"shadow answered in {took * 1e3:.0f} ms while gcn waited on a paused Redis")
            assert took < 2.0
            check_answer(resp, cached, tiny_repo, tiny_dataset, "shadow")
            stalled.result()  # and gcn's request completes once Redis is back
    finally:
        redis.cleanup()


def test_sigterm_while_a_model_loads_exits_within_the_grace(tiny_repo, tmp_path):
    """The feature store is a socket that accepts connections and never answers, so the model load
    hangs on it; SIGTERM during that load stops the server within the grace period (exit 0),
    instead of waiting for the load."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "serve.cli", "serve", "--repo", str(tiny_repo), "--port", "0", "--poll-s", "0",
           "--grace-s", "2", "--features", f"redis://127.0.0.1:{port}/0?socket_timeout=60"]
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                    env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
            try:
                t_end = time.monotonic() + 120
                while b"listening on" not in log.read_bytes():
                    assert proc.poll() is None and time.monotonic() < t_end, log.read_text()
                    time.sleep(0.1)
                time.sleep(1.0)  # the load is under way, waiting on the silent store
                assert proc.poll() is None
                t0 = time.monotonic()
                proc.terminate()
                rc = proc.wait(30)
                took = time.monotonic() - t0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        print(f"exited {rc} {took:.2f} s after SIGTERM")
        assert rc == 0, log.read_text()
        assert took < 2.0 + 3.0, f"took {took:.1f} s; log:\n{log.read_text()}"
        assert "stopped while starting" in log.read_text()
    finally:
        silent.close()


# ------------------------------------------------------------------------- fuzzing the wire
def _mutations() -> st.SearchStrategy[bytes]:
    infer = ipb.ModelInferRequest(model_name="gcn", raw_input_contents=[np.arange(3, dtype=np.int64).tobytes()],
                                  inputs=[ipb.ModelInferRequest.InferInputTensor(name="NODE_IDS", datatype="INT64",
                                                                                 shape=[3])])
    infer.parameters["sampling_width"].int64_param = 2
    infer.outputs.add(name="LABELS")
    valid = [pb.PredictRequest(model="gcn", nodes=[1, 2, 3], sampling_width=2).SerializeToString(),
             pb.PredictRequest(model="shadow", nodes=[5], ppr_budget=8, max_accuracy_loss=0.01).SerializeToString(),
             infer.SerializeToString()]

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(valid)))
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(["flip", "cut", "insert"]))
            pos = draw(st.integers(0, max(0, len(data) - 1)))
            if op == "flip" and data:
                data[pos] ^= draw(st.integers(1, 255))
            elif op == "cut":
                del data[pos:]
            else:
                data[pos:pos] = draw(st.binary(min_size=1, max_size=12))
        return bytes(data)

    return st.one_of(st.binary(max_size=256), mutate())


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=_mutations(), method=st.sampled_from([PREDICT, INFER]))
def test_random_bytes_on_the_wire_get_documented_codes(served, tiny_repo, tiny_dataset, data, method):
    with grpc.insecure_channel(served.address) as ch:
        _, err = raw_call(ch, method, data, timeout=60)
        assert err is None or err.code() in DOCUMENTED, (err.code(), err.details())
        resp, err = raw_call(ch, PREDICT, pb.PredictRequest(model="gcn", nodes=[3], return_probabilities=True)
                             .SerializeToString())
        assert err is None
        check_answer(pb.PredictResponse.FromString(resp), [3], tiny_repo, tiny_dataset, "gcn")


def test_the_hostile_benchmark_runs(tiny_repo):
    """benchmarks/hostile.py --quick: every scenario runs and reports what the battery asserts (each bomb
    refused with INVALID_ARGUMENT, the flood partly RESOURCE_EXHAUSTED, probes correct)."""
    res = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "hostile.py"), "--quick", "--repo",
                          str(tiny_repo)], capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [line for line in res.stdout.splitlines() if line.startswith("| ") and "scenario" not in line]
    assert len(rows) == 8, res.stdout
    for line in rows[:4]:
        assert "INVALID_ARGUMENT" in line and "OK" not in line.split("|")[3], line
    assert "0 wrong" in rows[4] and "probes" in rows[4]
    assert "RESOURCE_EXHAUSTED" in rows[7] and "probe correct: True" in rows[7]
    assert all("probe correct: False" not in line for line in rows)


def test_a_stream_refuses_bad_messages_and_goes_on(served, tiny_repo, tiny_dataset):
    """ModelStreamInfer: an id bomb (refused from its bytes) and undecodable bytes each get an error
    message on the stream; the valid request after them is answered correctly."""
    good = ipb.ModelInferRequest(model_name="gcn", id="good",
                                 raw_input_contents=[np.array([3], dtype=np.int64).tobytes()],
                                 inputs=[ipb.ModelInferRequest.InferInputTensor(name="NODE_IDS", datatype="INT64",
                                                                                shape=[1])])
    msgs = [id_bomb(INFER, "gcn", 2_000_000), b"\xff\xff\xff", good.SerializeToString()]
    with grpc.insecure_channel(served.address) as ch:
        fn = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", request_serializer=None,
                              response_deserializer=None)
        out = [ipb.ModelStreamInferResponse.FromString(b) for b in fn(iter(msgs), timeout=60)]
    assert len(out) == 3
    assert out[0].error_message.startswith("INVALID_ARGUMENT") and "more than the limit of 4096" in out[0].error_message
    assert out[1].error_message.startswith("INVALID_ARGUMENT") and "cannot be parsed" in out[1].error_message
    assert not out[2].error_message and out[2].infer_response.id == "good"
    resp = out[2].infer_response
    labels = np.frombuffer(resp.raw_output_contents[[o.name for o in resp.outputs].index("LABELS")], dtype=np.int64)
    from .reliability_support import reference

    assert labels.tolist() == reference(tiny_repo, tiny_dataset, "gcn", int(resp.parameters["sampling_width"].int64_param),
                                        0, [3]).argmax(1).tolist()
