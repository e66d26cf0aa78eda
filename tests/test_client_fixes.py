"""SDK fixes from a user's session against a real server (Amazon Computers, GCN / SAGE / shaDow-GCN), each checked
here without one: the SDK's calls go over real gRPC to a small in-process fake of ``gnnserve.v1.GnnService`` that
enforces a per-request node limit and a per-request work limit the way the server words its refusals.

* a request refused for its size alone (a node limit lower than the one cached, a work limit) is sent again in
  smaller requests instead of failing the call;
* ``add_edges`` as a float array ``[k, 3]`` (ids and weights) is taken;
* a 0-d integer array is one node id; a flat id list beside ``features [m, F]`` is refused, not read as one
  neighbour per new node;
* clients pickle (a multiprocessing pool's argument) and open a channel of their own;
* ``AsyncGnnClient.repository_index``; ``CancelledError`` for CANCELLED; ``update_graph(features=...)`` typed
  for NumPy rows; ``version="latest"``;
* a client keeps at most ``max_concurrent_calls`` RPCs in flight (thousands of gathered calls overflowed the
  server's ``--max-concurrent-rpcs`` and part of them failed RESOURCE_EXHAUSTED / CANCELLED).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
import types
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

import clients
from clients import AsyncGnnClient, Backoff, GnnClient, InvalidArgumentError, NewNode, ResourceExhaustedError
from clients import errors as E
from clients._core import ChunkLimits, PredictPlan, RetryState, new_node_messages, node_array, update_request
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc
from clients._gen import inference_pb2 as ipb
from clients._gen import inference_pb2_grpc as ipb_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
CLASSES = 4


def _answer(req: pb.PredictRequest) -> pb.PredictResponse:
    """label = id % CLASSES (a new node: 100 + its index in the request), one-hot probabilities."""
    ids = list(req.nodes) + [100 + i for i in range(len(req.new_nodes))]
    probs = np.zeros((len(ids), CLASSES), dtype=np.float32)
    probs[np.arange(len(ids)), [v % CLASSES for v in ids]] = 1.0
    resp = pb.PredictResponse(model=req.model, version="1", request_id=req.request_id or "rid",
                              labels=[v % CLASSES for v in ids], num_classes=CLASSES)
    if req.return_probabilities:
        resp.probabilities.extend(probs.ravel().tolist())
    resp.timing.batch_size = len(ids)
    return resp


class FakeGnn(pb_grpc.GnnServiceServicer):
    """Refuses, in the server's words, a request of more than ``node_limit`` rows (INVALID_ARGUMENT) and one whose
    work (``work_per_row`` per row) exceeds ``work_limit`` (RESOURCE_EXHAUSTED); GetModel reports ``advertised``."""

    def __init__(self) -> None:
        self.advertised = 1000
        self.node_limit = 1000
        self.work_per_row = 0
        self.work_limit = 10**9
        self.edge_limit = 10**9  # neighbours over the new nodes of one request
        self.sizes: list[int] = []  # rows of every Predict received
        self.get_versions: list[str] = []  # the version of every GetModel received
        self.predict_versions: list[str] = []  # the version of every Predict received
        self.lock = threading.Lock()
        self.delay_s = 0.0  # each Predict takes this long
        self.in_flight = self.most_in_flight = 0

    def GetModel(self, request, context):
        self.get_versions.append(request.version)
        return pb.ModelInfo(name=request.name, version="1", num_classes=CLASSES,
                            max_nodes_per_request=self.advertised, ready=True)

    def Predict(self, request, context):
        n = len(request.nodes) + len(request.new_nodes)
        with self.lock:
            self.sizes.append(n)
            self.predict_versions.append(request.version)
        if n > self.node_limit:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"request has {n} nodes, more than the limit of {self.node_limit} per request; "
                          "split it (the SDK chunks long lists automatically)")
        if self.delay_s:
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            time.sleep(self.delay_s)
            with self.lock:
                self.in_flight -= 1
        edges = sum(len(nn.neighbors) for nn in request.new_nodes)
        if edges > self.edge_limit:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"new nodes have at least {edges} neighbours in all, more than the limit of "
                          f"{self.edge_limit} per request; send fewer or split the request")
        work = n * self.work_per_row
        if work > self.work_limit:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"model {request.model}: this request would aggregate about {work} edges, more than the "
                          f"limit of {self.work_limit} per request; use a smaller ppr_budget, fewer nodes per request")
        return _answer(request)


class FakeIndex(ipb_grpc.GRPCInferenceServiceServicer):
    def RepositoryIndex(self, request, context):
        return ipb.RepositoryIndexResponse(models=[
            ipb.RepositoryIndexResponse.ModelIndex(name="m", version="1", state="READY", reason=""),
            ipb.RepositoryIndexResponse.ModelIndex(name="b", version="2", state="UNAVAILABLE", reason="bad")])


@pytest.fixture
def fake():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    svc = FakeGnn()
    pb_grpc.add_GnnServiceServicer_to_server(svc, server)
    ipb_grpc.add_GRPCInferenceServiceServicer_to_server(FakeIndex(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield types.SimpleNamespace(svc=svc, address=f"127.0.0.1:{port}")
    server.stop(None)


def _expected(nodes) -> list[int]:
    return [int(v) % CLASSES for v in nodes]


# --------------------------------------------------------------------------- refused for its size: sent again smaller
def _plan(n: int, max_nodes: int) -> PredictPlan:
    return PredictPlan(model="m", version="", nodes=np.arange(n, dtype=np.int64), new_nodes=[], knobs={},
                       return_probabilities=True, return_embeddings=False, request_id="",
                       limits=ChunkLimits(max_nodes=max_nodes, num_classes=CLASSES))


def test_plan_resends_the_rows_of_a_request_refused_for_its_node_count():
    plan = _plan(10, max_nodes=8)
    first = plan.next_request()
    assert len(first.nodes) == 8
    refusal = InvalidArgumentError("request has 8 nodes, more than the limit of 3 per request; split it")
    assert plan.shrink(refusal) and plan.refused_node_limit == 3
    sizes = []
    while (req := plan.next_request()) is not None:
        sizes.append(len(req.nodes))
        plan.add(_answer(req))
    assert sizes == [3, 3, 3, 1]
    assert plan.result(1.0).labels.tolist() == _expected(range(10))


def test_plan_resends_the_rows_of_a_request_refused_for_its_work():
    plan = _plan(100, max_nodes=100)
    plan.next_request()
    refusal = ResourceExhaustedError("model m: this request would aggregate about 2000 edges, more than the limit "
                                     "of 1000 per request; use a smaller sampling_width, fewer nodes per request")
    assert plan.shrink(refusal) and plan.refused_node_limit is None
    assert len(plan.next_request().nodes) == 45  # half the rows, with a margin of 0.9


@pytest.mark.parametrize("exc", [
    InvalidArgumentError("node ids out of range [0, 10): 99"),
    ResourceExhaustedError("model m v1: queue full (1000 targets waiting)"),
    E.UnavailableError("request has 8 nodes, more than the limit of 3 per request"),
])
def test_plan_does_not_resend_other_refusals(exc):
    plan = _plan(8, max_nodes=8)
    plan.next_request()
    assert not plan.shrink(exc)


def test_plan_never_splits_one_row():
    plan = _plan(1, max_nodes=8)
    plan.next_request()
    assert not plan.shrink(ResourceExhaustedError("would aggregate about 9 edges, more than the limit of 1 per request"))


def test_client_resends_after_a_node_limit_lowered_since_it_was_cached(fake):
    with GnnClient(fake.address, timeout=30) as client:
        client.get_model("m")  # caches the advertised limit, 1000
        fake.svc.node_limit = fake.svc.advertised = 300  # say, the server restarted with a smaller limit
        res = client.predict("m", range(1000))
        assert res.labels.tolist() == _expected(range(1000))
        assert fake.svc.sizes == [1000, 300, 300, 300, 100]
        fake.svc.sizes.clear()
        client.predict("m", range(600))  # the refused limit was kept for later calls: no refusal again
        assert fake.svc.sizes == [300, 300]


def test_client_resends_requests_refused_for_their_work(fake):
    fake.svc.work_per_row, fake.svc.work_limit = 12_288, 50_000_000  # shaDow K = 64, exact: 4069 rows fit
    fake.svc.advertised = fake.svc.node_limit = 4096
    with GnnClient(fake.address, timeout=30) as client:
        nodes = np.arange(13_252)
        res = client.predict("m", nodes)
        assert res.labels.tolist() == _expected(nodes) and res.probabilities.shape == (13_252, CLASSES)
        assert fake.svc.sizes[0] == 4096 and max(fake.svc.sizes[1:]) * 12_288 <= 50_000_000
        fake.svc.sizes.clear()
        # new nodes too (their work is per node as well), numbered in the call's order
        x = np.ones((500, 3))
        fake.svc.work_limit = 100 * 12_288
        res = client.predict_new_node("m", x, neighbors=[[1]] * 500)
        assert len(res) == 500 and fake.svc.sizes[0] == 500 and max(fake.svc.sizes[1:]) <= 100


def test_client_resends_new_nodes_refused_for_their_neighbours(fake):
    fake.svc.edge_limit = 1000
    with GnnClient(fake.address, timeout=30) as client:
        res = client.predict_new_node("m", np.ones((300, 2)), neighbors=[list(range(10))] * 300)
    assert len(res) == 300 and fake.svc.sizes[0] == 300 and max(fake.svc.sizes[1:]) * 10 <= 1000


async def test_async_client_resends_refused_requests(fake):
    fake.svc.work_per_row, fake.svc.work_limit = 10, 1000
    async with AsyncGnnClient(fake.address, timeout=30) as client:
        res = await client.predict("m", range(1000))
    assert res.labels.tolist() == _expected(range(1000))
    assert fake.svc.sizes[0] == 1000 and max(fake.svc.sizes[1:]) <= 100


def test_a_work_refusal_is_not_retried_as_a_full_queue_is(fake):
    fake.svc.work_per_row, fake.svc.work_limit = 10, 5
    with GnnClient(fake.address, timeout=30, retry_resource_exhausted=True, max_retries=3) as client:
        with pytest.raises(ResourceExhaustedError, match="would aggregate") as ei:
            client.predict("m", [1])
    assert ei.value.attempts == 1 and fake.svc.sizes == [1]  # refused alike every time: sent once
    st = RetryState(method="Predict", timeout=None, max_retries=3, backoff=Backoff(0.01, 0.02),
                    retry_codes=frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED}))
    assert st.failed_with(grpc.StatusCode.RESOURCE_EXHAUSTED, "model m v1: queue full (9 targets waiting)") > 0


def test_a_refusal_of_one_row_still_fails(fake):
    fake.svc.work_per_row, fake.svc.work_limit = 10, 5
    with GnnClient(fake.address, timeout=30) as client:
        with pytest.raises(ResourceExhaustedError, match="would aggregate"):
            client.predict("m", range(50))
    assert fake.svc.sizes[-1] == 1  # shrunk down to one row, which is refused: the call fails


# --------------------------------------------------------------------------- arguments
def test_add_edges_as_a_float_array_with_weights():
    req = update_request("m", "", add_edges=np.array([[1, 2, 0.5], [3, 4, 2.0]]))
    assert [(e.src, e.dst, e.weight) for e in req.add_edges] == [(1, 2, 0.5), (3, 4, 2.0)]
    req = update_request("m", "", add_edges=np.array([[1, 2], [3, 4]]), remove_edges=np.array([[5, 6]]))
    assert [(e.src, e.dst, e.HasField("weight")) for e in req.add_edges] == [(1, 2, False), (3, 4, False)]
    assert [(e.src, e.dst) for e in req.remove_edges] == [(5, 6)]
    with pytest.raises(InvalidArgumentError, match=r"add_edges\[1\]: node ids must be whole numbers"):
        update_request("m", "", add_edges=np.array([[1, 2, 0.5], [3.5, 4, 1.0]]))
    with pytest.raises(InvalidArgumentError, match=r"add_edges\[0\]: node ids must be whole numbers"):
        update_request("m", "", add_edges=np.array([[np.nan, 2, 0.5]]))
    with pytest.raises(InvalidArgumentError, match=r"an edge array is \[k, 2\] or \[k, 3\]"):
        update_request("m", "", add_edges=np.array([1, 2]))
    with pytest.raises(InvalidArgumentError):
        update_request("m", "", remove_edges=np.array([[1.0, 2.0]]))  # float ids without weights: as ever


def test_a_0d_integer_array_is_one_node_id():
    assert node_array(np.array(5)).tolist() == [5]
    assert node_array(np.array(5, dtype=np.uint16)).tolist() == [5]
    with pytest.raises(InvalidArgumentError):
        node_array(np.array(5.0))


class _Tensorish:
    """An array-like that is not a Sequence, as a torch tensor or a pandas Series is: ``__array__`` converts it
    whole; iterating a 0-d one fails (torch: "iteration over a 0-d tensor"), iterating a 1-d one yields an object
    per element (slow for 10k ids)."""

    def __init__(self, values) -> None:
        self.values = np.asarray(values)
        self.iterated = False

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    def __iter__(self):
        self.iterated = True
        if self.values.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter([_Tensorish(v) for v in self.values])


def test_array_likes_convert_whole_and_a_0d_one_is_one_id():
    one = _Tensorish(np.int64(3))
    assert node_array(one).tolist() == [3]  # was TypeError: iteration over a 0-d tensor
    many = _Tensorish(np.arange(5, dtype=np.int32))
    assert node_array(many).tolist() == [0, 1, 2, 3, 4] and not many.iterated
    with pytest.raises(InvalidArgumentError, match="dtype float32"):
        node_array(_Tensorish(np.arange(3, dtype=np.float32)))


def test_flat_neighbours_beside_several_new_nodes_are_refused():
    with pytest.raises(InvalidArgumentError, match=r"neighbors is a list of 2 lists, one per new node; neighbors\[0\]"):
        new_node_messages(np.ones((2, 3)), [1, 2])
    with pytest.raises(InvalidArgumentError, match=r"edge_weights\[1\] is a single number"):
        new_node_messages(np.ones((2, 3)), [[1], [2]], [[0.5], 0.5])
    msgs = new_node_messages(np.ones((2, 3)), np.array([[1, 2], [3, 4]]))
    assert [list(m.neighbors) for m in msgs] == [[1, 2], [3, 4]]


def test_update_features_take_any_mapping_of_arrays():
    rows = types.MappingProxyType({7: np.full(3, 0.5), 8: [1.0, 2.0, 3.0]})
    req = update_request("m", "", features=rows)
    assert [(f.node, list(f.features)) for f in req.features] == [(7, [0.5] * 3), (8, [1.0, 2.0, 3.0])]


def test_update_graph_features_type_check_with_numpy_rows(tmp_path):
    """The README's own ``features={7: np.full(f, 0.1)}`` must type-check (the SDK ships py.typed)."""
    pytest.importorskip("mypy")
    user = tmp_path / "user.py"
    user.write_text(
        "import numpy as np\n"
        "from clients import AsyncGnnClient, GnnClient\n\n"
        "def f(c: GnnClient) -> int:\n"
        "    return c.update_graph('m', features={7: np.full(3, 0.1)}).graph_version\n\n"
        "async def g(c: AsyncGnnClient) -> list[dict[str, str]]:\n"
        "    await c.update_graph('m', features={7: np.full(3, 0.1)})\n"
        "    return await c.repository_index()\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # as a user's project that installed the SDK sees it
    res = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          "--cache-dir", str(tmp_path / "cache"), str(user)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


# --------------------------------------------------------------------------- pickling, async twin, CANCELLED
def test_a_client_pickles_and_reopens(fake):
    with GnnClient(fake.address, timeout=12.5, max_retries=1) as client:
        copy = pickle.loads(pickle.dumps(client))
        assert copy is not client and copy.address == client.address
        assert copy.timeout == 12.5 and copy.max_retries == 1 and repr(copy).endswith("open)")
        assert copy.predict("m", [5, 6]).labels.tolist() == _expected([5, 6])
        copy.close()
        assert client.predict("m", [7]).labels.tolist() == _expected([7])  # its own channel closed, not this one
    closed = pickle.loads(pickle.dumps(client))
    with pytest.raises(ValueError, match="closed"):
        closed.predict("m", [1])
    a = pickle.loads(pickle.dumps(AsyncGnnClient(fake.address, timeout=3.0)))
    assert isinstance(a, AsyncGnnClient) and a.timeout == 3.0


def test_a_client_is_a_multiprocessing_pool_argument(fake):
    with GnnClient(fake.address, timeout=30) as client:
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            out = pool.starmap(GnnClient.predict, [(client, "m", [i]) for i in range(4)])
    assert [r.labels.tolist() for r in out] == [[i % CLASSES] for i in range(4)]


async def test_async_client_repository_index(fake):
    async with AsyncGnnClient(fake.address, timeout=10) as client:
        assert await client.repository_index() == [
            {"name": "m", "version": "1", "state": "READY", "reason": ""},
            {"name": "b", "version": "2", "state": "UNAVAILABLE", "reason": "bad"}]


def test_cancelled_has_its_class():
    err = E.error_for_code(grpc.StatusCode.CANCELLED, "", method="Predict")
    assert type(err) is E.CancelledError and clients.CancelledError is E.CancelledError
    assert isinstance(err, E.GnnServeError) and not isinstance(err, asyncio.CancelledError)
    assert type(pickle.loads(pickle.dumps(err))) is E.CancelledError


def test_new_node_objects_still_pass_as_before(fake):
    with GnnClient(fake.address, timeout=30) as client:
        res = client.predict("m", [1], new_nodes=[NewNode(np.ones(3), [1]), NewNode(np.ones(3), [2])])
    assert res.labels.tolist() == [1, 100 % CLASSES, 101 % CLASSES]


def test_version_latest_means_the_newest_loaded(fake):
    """``gnnserve predict --version latest`` is the newest loaded version; so is the SDK's ``version="latest"``
    (the server has no version named so: it answered NOT_FOUND)."""
    with GnnClient(fake.address, timeout=10) as client:
        for v in ("latest", "LATEST", None, 3):
            client.get_model("m", version=v)
        client.predict("m", [1, 2], version="latest")
    assert fake.svc.get_versions == ["", "", "", "3"] and fake.svc.predict_versions == [""]


# --------------------------------------------------------------------------- calls in flight
async def test_async_client_bounds_its_calls_in_flight(fake):
    fake.svc.delay_s = 0.05
    async with AsyncGnnClient(fake.address, timeout=30, max_concurrent_calls=3) as client:
        res = await asyncio.gather(*(client.predict("m", [i]) for i in range(24)))
    assert [int(r.labels[0]) for r in res] == _expected(range(24))
    assert fake.svc.most_in_flight == 3
    fake.svc.most_in_flight = 0
    async with AsyncGnnClient(fake.address, timeout=30, max_concurrent_calls=None) as client:
        await asyncio.gather(*(client.predict("m", [i]) for i in range(24)))
    assert fake.svc.most_in_flight > 3  # no bound: the fake server sees them all at once


async def test_a_wait_for_a_call_slot_spends_the_deadline(fake):
    fake.svc.delay_s = 0.5
    async with AsyncGnnClient(fake.address, max_concurrent_calls=1) as client:
        res = await asyncio.gather(client.predict("m", [1], timeout=5), client.predict("m", [2], timeout=0.2),
                                   return_exceptions=True)
    assert res[0].labels.tolist() == [1]
    assert isinstance(res[1], E.DeadlineExceededError) and "max_concurrent_calls=1" in str(res[1])


def test_sync_client_bounds_its_calls_in_flight(fake):
    fake.svc.delay_s = 0.05
    with GnnClient(fake.address, timeout=30, max_concurrent_calls=2) as client:
        with futures.ThreadPoolExecutor(12) as pool:
            out = list(pool.map(lambda i: int(client.predict("m", [i]).labels[0]), range(24)))
        assert out == _expected(range(24)) and fake.svc.most_in_flight == 2
        with pytest.raises(ValueError, match="max_concurrent_calls must be >= 1"):
            GnnClient(fake.address, max_concurrent_calls=0)


def test_the_refusals_the_plan_reads_are_a_real_servers(tiny_repo):
    """:meth:`PredictPlan.shrink` reads the server's refusal texts (node, work and new-node-neighbour limits): a real
    server's, sent raw, match them; through the SDK a call over the work limit is split and answers as the same
    nodes asked one request at a time (the fake above only copies the wording)."""
    from clients._core import _EDGE_LIMIT_REFUSAL, _NODE_LIMIT_REFUSAL, _WORK_LIMIT_REFUSAL

    from .serving import ServerThread

    opts = {"poll_s": 0, "runtime_kw": {"max_nodes_per_request": 16, "max_request_work": 3000,
                                        "max_new_node_edges": 4}}
    with ServerThread(tiny_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.GnnServiceStub(ch)
        f = srv.server.registry.get("shadow").model.in_dim
        cases = [
            (pb.PredictRequest(model="gcn", nodes=list(range(40))), grpc.StatusCode.INVALID_ARGUMENT,
             _NODE_LIMIT_REFUSAL),
            (pb.PredictRequest(model="shadow", nodes=list(range(12)), sampling_width=0),
             grpc.StatusCode.RESOURCE_EXHAUSTED, _WORK_LIMIT_REFUSAL),
            (pb.PredictRequest(model="gcn", new_nodes=[pb.NewNode(features=[0.0] * f, neighbors=[1, 2, 3]),
                                                       pb.NewNode(features=[0.0] * f, neighbors=[4, 5, 6])]),
             grpc.StatusCode.INVALID_ARGUMENT, _EDGE_LIMIT_REFUSAL),
        ]
        for req, code, pattern in cases:
            with pytest.raises(grpc.RpcError) as info:
                stub.Predict(req, timeout=60)
            assert info.value.code() == code, info.value.details()
            assert pattern.search(info.value.details()), info.value.details()
        with GnnClient(srv.address, timeout=60, max_retries=0) as c:
            info = c.get_model("shadow")  # the limits are listed, as the server applies them
            assert (info.max_nodes_per_request, info.max_request_work, info.max_new_node_edges) == (16, 3000, 4)
            nodes = np.arange(12)
            whole = c.predict("shadow", nodes, sampling_width=0)  # 12 nodes over the work limit: split
            one = [c.predict("shadow", [int(v)], sampling_width=0) for v in nodes]
        np.testing.assert_array_equal(whole.labels, [r.labels[0] for r in one])
        np.testing.assert_allclose(whole.probabilities, np.stack([r.probabilities[0] for r in one]), atol=1e-6)


def test_wait_for_ready_rides_out_a_server_that_is_not_up_yet(tiny_repo):
    """A service's calls during a restart: by default they fail UNAVAILABLE after the quick retries (here none);
    with ``wait_for_ready`` the sync and the async client's calls made while nothing listens are answered once the
    server comes up, within their timeout. A health check never waits."""
    import random
    import socket

    from serve.server import BackgroundServer, ServerConfig

    # a free port outside the ephemeral range: a client connecting again and again to a local port nobody
    # listens on can be given that very port as its own source port (TCP's self-connect), which then holds it
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.Random(os.getpid()).sample(range(max(1024, low - 8000), low), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
    address = f"127.0.0.1:{port}"
    with GnnClient(address, timeout=30, max_retries=0) as c:
        t0 = time.monotonic()
        with pytest.raises(E.UnavailableError):
            c.list_models()
        assert time.monotonic() - t0 < 10  # failed fast, not at the deadline
    with GnnClient(address, timeout=30, wait_for_ready=True) as c:
        with pytest.raises(E.UnavailableError):
            c.health()

    got: dict[str, object] = {}

    def sync_call() -> None:
        with GnnClient(address, timeout=180, wait_for_ready=True, max_retries=0) as c:
            got["sync"] = c.predict("gcn", [1, 2]).labels

    async def async_call() -> None:
        async with AsyncGnnClient(address, timeout=180, wait_for_ready=True, max_retries=0) as c:
            got["aio"] = (await c.predict("gcn", [1, 2])).labels

    caller = threading.Thread(target=sync_call)
    caller.start()
    aio = threading.Thread(target=lambda: asyncio.run(async_call()))
    aio.start()
    time.sleep(2.0)  # both wait on a port nobody listens on
    assert not got and caller.is_alive() and aio.is_alive()
    with BackgroundServer(ServerConfig(repo=str(tiny_repo), port=port, poll_s=0)):
        caller.join(120)
        aio.join(120)
        with GnnClient(address, timeout=60) as c:
            want = c.predict("gcn", [1, 2]).labels
    assert not caller.is_alive() and not aio.is_alive()
    np.testing.assert_array_equal(got["sync"], want)
    np.testing.assert_array_equal(got["aio"], want)


def test_wait_for_ready_retries_unavailable_until_the_deadline_beyond_max_retries():
    """A restarting server listens before its models are loaded and answers UNAVAILABLE ("being loaded") for
    seconds: with wait_for_ready such a call is retried with the backoff until its deadline, max_retries aside;
    without it, max_retries bound it; other codes are not retried by it."""
    def state(wait: bool, timeout: float | None = 30.0) -> RetryState:
        return RetryState(method="Predict", timeout=timeout, max_retries=1, backoff=Backoff(0.01, 0.02),
                          retry_codes=frozenset({grpc.StatusCode.UNAVAILABLE}), wait_for_ready=wait)

    st = state(True)
    for _ in range(50):
        assert 0 < st.failed_with(grpc.StatusCode.UNAVAILABLE, "model 'gcn' is being loaded") <= 0.02
    with pytest.raises(E.InvalidArgumentError):
        st.failed_with(grpc.StatusCode.INVALID_ARGUMENT, "bad id")
    st = state(False)
    st.failed_with(grpc.StatusCode.UNAVAILABLE, "model 'gcn' is being loaded")
    with pytest.raises(E.UnavailableError):
        st.failed_with(grpc.StatusCode.UNAVAILABLE, "model 'gcn' is being loaded")
    st = state(True, timeout=0.001)  # the deadline still bounds the wait
    time.sleep(0.01)
    with pytest.raises(E.UnavailableError):
        st.failed_with(grpc.StatusCode.UNAVAILABLE, "model 'gcn' is being loaded")
