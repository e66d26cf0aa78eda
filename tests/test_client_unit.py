"""Client SDK parts that need no gnnserve server: import weight, chunking, argument handling,
retry policy, error mapping, the CLI's node lists and argument errors. Calls to an address where
nothing listens are real gRPC calls."""

from __future__ import annotations

import json
import pickle
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

import clients
from clients import (
    AsyncGnnClient,
    Backoff,
    DeadlineExceededError,
    GnnClient,
    GnnServeError,
    InvalidArgumentError,
    KnobRow,
    ModelInfo,
    NewNode,
    UnavailableError,
)
from clients import errors as E
from clients._core import (
    FIRST_EMBEDDING_CHUNK,
    ChannelConfig,
    ChunkLimits,
    PredictPlan,
    RetryState,
    chunk_sizes,
    existing_chunk_size,
    knob_fields,
    new_node_messages,
    node_array,
)
from clients._gen import gnnserve_pb2 as pb
from clients.cli import NodeSpecError, models_main, parse_nodes, predict_main

REPO_ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "numba", "scipy", "serve", "models", "kernels", "pandas", "matplotlib")


# --------------------------------------------------------------------------- import weight
def test_import_clients_is_light():
    code = (
        "import sys, time, json\n"
        "t = time.perf_counter()\n"
        "import clients\n"
        "from clients import GnnClient, AsyncGnnClient\n"
        "import clients.cli\n"
        "dt = time.perf_counter() - t\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(json.dumps({'seconds': dt, 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["heavy"] == [], (
        f"'import clients' pulled in {info['heavy']} (import took {info['seconds']:.2f} s); "
        "the SDK may import only grpc, protobuf and numpy"
    )
    print(f"import clients + clients.cli: {info['seconds']:.3f} s, no heavy modules")


def test_public_names_and_py_typed():
    for name in clients.__all__:
        assert hasattr(clients, name), name
    assert (REPO_ROOT / "clients" / "py.typed").exists()
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'clients = ["py.typed"]' in text


# --------------------------------------------------------------------------- chunking
@pytest.mark.parametrize("n,k", [(0, 4), (1, 4), (4, 4), (5, 4), (10, 4), (4097, 4096), (12288, 4096)])
def test_chunk_sizes_cover_the_list_in_order(n, k):
    sizes = chunk_sizes(n, ChunkLimits(max_nodes=k), probabilities=True, embeddings=False)
    assert sum(sizes) == n
    assert all(1 <= s <= k for s in sizes)
    assert len(sizes) == -(-n // k)


def test_chunk_size_respects_message_budgets():
    lim = ChunkLimits(max_nodes=4096, response_bytes=1_000_000, num_classes=1000)
    k = existing_chunk_size(lim, probabilities=True, embeddings=False)
    assert k * (4 * 1000 + 10) <= 1_000_000 < (k + 1) * (4 * 1000 + 10)
    # without probabilities the response is labels only: the node limit binds
    assert existing_chunk_size(lim, probabilities=False, embeddings=False) == 4096
    lim = ChunkLimits(max_nodes=10**9, request_bytes=1000)
    assert existing_chunk_size(lim, probabilities=False, embeddings=False) == 100
    # unknown embedding width: a small first chunk, then the learned width decides
    lim = ChunkLimits(max_nodes=4096, num_classes=4)
    assert existing_chunk_size(lim, probabilities=True, embeddings=True) == FIRST_EMBEDDING_CHUNK
    lim.embedding_dim = 64
    assert existing_chunk_size(lim, probabilities=True, embeddings=True) == 4096
    # never zero, even when one row exceeds the budget
    lim = ChunkLimits(max_nodes=4096, response_bytes=10, num_classes=100)
    assert existing_chunk_size(lim, probabilities=True, embeddings=False) == 1


def _fake_reply(req: pb.PredictRequest, *, version: str, c: int = 3, h: int = 0) -> pb.PredictResponse:
    """What a server would answer: label = id % c, probabilities encode the id (for order checks)."""
    ids = list(req.nodes) + [1000 + i for i in range(len(req.new_nodes))]
    n = len(ids)
    probs = np.zeros((n, c), dtype=np.float32)
    for i, v in enumerate(ids):
        probs[i, v % c] = 1.0
    resp = pb.PredictResponse(model=req.model, version=version, request_id=req.request_id or "srv-made",
                              labels=[v % c for v in ids], num_classes=c)
    if req.return_probabilities:
        resp.probabilities.extend(probs.ravel().tolist())
    if req.return_embeddings and h:
        resp.embedding_dim = h
        resp.embeddings.extend(np.repeat(np.asarray(ids, np.float32), h).tolist())
    resp.settings.sampling_width = req.sampling_width if req.HasField("sampling_width") else 8
    resp.settings.edges_kept = 10 * n
    resp.settings.edges_total = 20 * n
    resp.timing.queue_ms = 1.0
    resp.timing.total_ms = 2.5
    resp.timing.batch_size = n
    return resp


def _drive(plan: PredictPlan, versions: list[str], **kw):
    sent = []
    while (req := plan.next_request()) is not None:
        sent.append(req)
        plan.add(_fake_reply(req, version=versions[min(len(sent) - 1, len(versions) - 1)], **kw))
    return sent, plan.result(12.0)


def _plan(nodes, new=(), *, max_nodes=4, emb=False, rid="", version=""):
    return PredictPlan(model="m", version=version, nodes=np.asarray(nodes, dtype=np.int64), new_nodes=list(new),
                       knobs={"sampling_width": 4}, return_probabilities=True, return_embeddings=emb,
                       request_id=rid, limits=ChunkLimits(max_nodes=max_nodes, num_classes=3))


def test_plan_reassembles_chunks_in_order_and_aggregates():
    nodes = [5, 3, 3, 9, 0, 7, 2, 2, 8, 1, 4]  # duplicates kept
    sent, res = _drive(_plan(nodes), versions=["2", "3", "3"])
    assert [len(r.nodes) for r in sent] == [4, 4, 3]
    assert np.concatenate([np.asarray(r.nodes) for r in sent]).tolist() == nodes
    assert all(r.sampling_width == 4 and r.model == "m" for r in sent)
    # pinned to the version that answered the first chunk
    assert sent[0].version == "" and sent[1].version == "2" and sent[2].version == "2"
    # no id given: the server's id of chunk 0 is the base of the others
    assert [r.request_id for r in sent] == ["", "srv-made/1", "srv-made/2"]
    assert res.request_id == "srv-made"
    assert res.labels.dtype == np.int64 and res.labels.tolist() == [v % 3 for v in nodes]
    assert res.probabilities.dtype == np.float32 and res.probabilities.shape == (11, 3)
    assert res.probabilities.argmax(1).tolist() == res.labels.tolist()
    assert res.nodes.tolist() == nodes
    assert res.timing.chunks == 3 and res.timing.total_ms == pytest.approx(7.5) and res.timing.queue_ms == 3.0
    assert res.timing.batch_size == 4 and res.timing.client_ms == 12.0
    assert res.settings.edges_kept == 110 and res.settings.edges_total == 220
    assert res.settings.edges_kept_fraction == pytest.approx(0.5)
    assert res.embeddings is None and res.num_classes == 3
    assert res.top_probabilities.tolist() == [1.0] * 11


def test_plan_request_ids_new_nodes_and_embeddings():
    new = new_node_messages(np.ones((5, 2)), [[0], [1], [2], [3], [4]])
    sent, res = _drive(_plan([1, 2, 3], new, max_nodes=2, emb=True, rid="abc"), versions=["1"], h=2)
    assert [r.request_id for r in sent] == ["abc", "abc/1", "abc/2", "abc/3", "abc/4"]
    # existing nodes first, then the new ones, never mixed in one request
    assert [(len(r.nodes), len(r.new_nodes)) for r in sent] == [(2, 0), (1, 0), (0, 2), (0, 2), (0, 1)]
    assert res.request_id == "abc" and len(res) == 8 and res.num_new_nodes == 5
    assert res.embeddings.shape == (8, 2)
    assert res.embeddings[:, 0].tolist() == [1, 2, 3, 1000, 1001, 1000, 1001, 1000]


def test_plan_packs_new_nodes_under_the_request_budget():
    new = new_node_messages(np.ones((10, 1000)), [[i] for i in range(10)])  # ~4 kB each
    plan = _plan([], new, max_nodes=100)
    plan.limits.request_bytes = 10_000
    sent, res = _drive(plan, versions=["1"])
    assert [len(r.new_nodes) for r in sent] == [2, 2, 2, 2, 2]
    assert all(r.ByteSize() <= 10_000 for r in sent)
    assert len(res) == 10


def test_plan_sends_an_empty_call_once_and_checks_reply_sizes():
    plan = _plan([])
    req = plan.next_request()
    assert req is not None and len(req.nodes) == 0  # the server answers it (INVALID_ARGUMENT)
    plan = _plan([1, 2])
    req = plan.next_request()
    bad = _fake_reply(req, version="1")
    del bad.labels[-1]
    with pytest.raises(E.InternalError, match="1 labels for 2 nodes"):
        plan.add(bad)


# --------------------------------------------------------------------------- arguments
def test_node_array_accepts_common_inputs():
    assert node_array(7).tolist() == [7]
    assert node_array(np.int32(7)).tolist() == [7]
    assert node_array(range(2, 8, 3)).tolist() == [2, 5]
    assert node_array([3, 1, 3]).dtype == np.int64
    assert node_array(np.array([1, 2], dtype=np.uint16)).tolist() == [1, 2]
    assert node_array(x for x in (4, 5)).tolist() == [4, 5]
    assert node_array([]).shape == (0,)
    assert node_array([-1]).tolist() == [-1]  # ranges are the server's to check (it names the id)


@pytest.mark.parametrize("bad", [[1.5], ["1"], "12", [[1, 2]], True, np.array([True]), [2**70], 2**70, -(2**64)])
def test_node_array_rejects_non_ids(bad):
    with pytest.raises(InvalidArgumentError) as ei:
        node_array(bad)
    assert isinstance(ei.value, ValueError) and ei.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_knob_fields():
    assert knob_fields(None, None, None) == {}
    assert knob_fields(0, 16, 0.01) == {"sampling_width": 0, "ppr_budget": 16, "max_accuracy_loss": 0.01}
    assert knob_fields(np.int64(4), None, None) == {"sampling_width": 4}
    assert knob_fields(-3, None, float("nan"))["sampling_width"] == -3  # the server rejects, naming the value
    for args in [(1.5, None, None), (None, "8", None), (True, None, None), (2**40, None, None), (None, None, "x")]:
        with pytest.raises(InvalidArgumentError):
            knob_fields(*args)


def test_new_node_messages_forms():
    one = new_node_messages([0.5, 1.0, 2.0], [4, 9], [1.0, 0.25])
    assert len(one) == 1 and list(one[0].neighbors) == [4, 9] and list(one[0].edge_weights) == [1.0, 0.25]
    assert list(one[0].features) == [0.5, 1.0, 2.0]
    many = new_node_messages(np.zeros((3, 2)), [[1], [], [2, 3]], [None, None, [0.5, 0.5]])
    assert [len(m.neighbors) for m in many] == [1, 0, 2] and list(many[2].edge_weights) == [0.5, 0.5]
    objs = new_node_messages([NewNode([1.0], [2]), NewNode([3.0], [4], [2.0])])
    assert [list(m.features) for m in objs] == [[1.0], [3.0]]
    with pytest.raises(InvalidArgumentError, match="neighbors is required"):
        new_node_messages([1.0, 2.0])
    with pytest.raises(InvalidArgumentError, match="2 feature rows but 1 neighbour lists"):
        new_node_messages(np.zeros((2, 2)), [[1]])
    with pytest.raises(InvalidArgumentError, match="new node 0"):
        new_node_messages([1.0], [0.5])
    # a finite value beyond float32 (the wire's type) is named, with no NumPy overflow warning on the way
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidArgumentError, match=r"features\[1\]: 1e\+39 does not fit a float32"):
            new_node_messages([0.5, 1e39], [4])


def test_channel_config_tls_token_and_options(tmp_path):
    b = Backoff()
    kw = dict(tls=False, root_certificates=None, client_cert=None, client_key=None, tls_server_name=None,
              token=None, backoff=b, channel_options=None)
    cfg = ChannelConfig.build("127.0.0.1:1", **kw)
    assert cfg.credentials is None and cfg.metadata == ()
    assert dict(cfg.options)["grpc.max_receive_message_length"] == 64 << 20
    cfg = ChannelConfig.build("grpcs://example.org:443", **{**kw, "token": " tok \n"})
    assert cfg.target == "example.org:443" and cfg.credentials is not None
    assert cfg.metadata == (("authorization", "Bearer tok"),)
    cfg = ChannelConfig.build("h:1", **{**kw, "channel_options": {"grpc.max_receive_message_length": 1 << 20}})
    assert cfg.max_receive_bytes == 1 << 20
    with pytest.raises(ValueError, match="cannot read root certificates"):
        ChannelConfig.build("h:1", **{**kw, "root_certificates": tmp_path / "missing.pem"})
    with pytest.raises(ValueError, match="go together"):
        ChannelConfig.build("h:1", **{**kw, "client_cert": b"-----BEGIN CERTIFICATE-----"})
    with pytest.raises(ValueError, match="single line"):
        ChannelConfig.build("h:1", **{**kw, "token": "a\nb"})
    with pytest.raises(ValueError):
        GnnClient("127.0.0.1:1", timeout=0)


# --------------------------------------------------------------------------- retries and errors
def test_backoff_delays_are_bounded_and_grow():
    b = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0, jitter=0.5)
    assert [b.nominal(i) for i in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    rng = random.Random(0)
    for i in range(8):
        d = b.delay(i, rng.random())
        assert 0.5 * b.nominal(i) <= d <= b.nominal(i)
    with pytest.raises(ValueError):
        Backoff(initial_s=2.0, max_s=1.0)
    with pytest.raises(ValueError):
        Backoff(jitter=1.5)


def _state(codes=(grpc.StatusCode.UNAVAILABLE,), retries=3, timeout=None):
    return RetryState(method="Predict", timeout=timeout, max_retries=retries, backoff=Backoff(0.01, 0.04),
                      retry_codes=frozenset(codes))


def test_a_deadline_past_grpcs_limit_is_sent_as_the_longest_it_takes():
    """gRPC fails a deadline past about 3e9 s (or infinity) at once with DEADLINE_EXCEEDED without sending the call:
    a longer SDK timeout is sent as MAX_RPC_TIMEOUT_S (a QA audit: --timeout 1e12 failed every call at once)."""
    from clients._core import MAX_RPC_TIMEOUT_S

    for t in (1e12, float("inf"), 1e300):
        assert _state(timeout=t).remaining() == MAX_RPC_TIMEOUT_S
    assert 0 < _state(timeout=5.0).remaining() <= 5.0


def test_clients_retry_a_server_side_cancel():
    """A server that stops cancels the calls grpc-core accepted but had not handed over (CANCELLED, seen in 3 of
    4 SIGTERMs under load with --drain-s 0): the SDK, which never cancels a call itself, retries it."""
    with GnnClient("127.0.0.1:1") as c:
        assert grpc.StatusCode.CANCELLED in c.retry_codes and grpc.StatusCode.UNAVAILABLE in c.retry_codes
        st = c._state("Predict", 5.0)
        assert 0 < st.failed_with(grpc.StatusCode.CANCELLED, "Cancelled") <= c.backoff.max_s


def test_retry_state_retries_only_unavailable_by_default():
    st = _state()
    delays = [st.failed_with(grpc.StatusCode.UNAVAILABLE, "down") for _ in range(3)]
    assert all(0 < d <= 0.04 for d in delays)
    with pytest.raises(UnavailableError):
        st.failed_with(grpc.StatusCode.UNAVAILABLE, "down")  # budget spent
    for code, cls in [(grpc.StatusCode.INVALID_ARGUMENT, E.InvalidArgumentError),
                      (grpc.StatusCode.NOT_FOUND, E.NotFoundError),
                      (grpc.StatusCode.RESOURCE_EXHAUSTED, E.ResourceExhaustedError),
                      (grpc.StatusCode.DEADLINE_EXCEEDED, E.DeadlineExceededError),
                      (grpc.StatusCode.UNAUTHENTICATED, E.UnauthenticatedError)]:
        with pytest.raises(cls):
            _state().failed_with(code, "x")
    # opting in to RESOURCE_EXHAUSTED
    st = _state(codes=(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert st.failed_with(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full") > 0


def test_retry_state_never_sleeps_past_the_deadline():
    st = _state(timeout=0.005)
    st.backoff = Backoff(1.0, 1.0, jitter=0.0)
    with pytest.raises(UnavailableError):
        st.failed_with(grpc.StatusCode.UNAVAILABLE, "down")
    time.sleep(0.01)
    with pytest.raises(DeadlineExceededError, match=r"deadline of 0\.005 s"):
        st.remaining()


ALL_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: (E.InvalidArgumentError, ValueError),
    grpc.StatusCode.NOT_FOUND: (E.NotFoundError, LookupError),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (E.ResourceExhaustedError, GnnServeError),
    grpc.StatusCode.UNAVAILABLE: (E.UnavailableError, ConnectionError),
    grpc.StatusCode.DEADLINE_EXCEEDED: (E.DeadlineExceededError, TimeoutError),
    grpc.StatusCode.UNAUTHENTICATED: (E.UnauthenticatedError, GnnServeError),
    grpc.StatusCode.PERMISSION_DENIED: (E.PermissionDeniedError, GnnServeError),
    grpc.StatusCode.DATA_LOSS: (E.DataLossError, GnnServeError),
    grpc.StatusCode.INTERNAL: (E.InternalError, GnnServeError),
    grpc.StatusCode.UNIMPLEMENTED: (E.UnimplementedError, GnnServeError),
    grpc.StatusCode.UNKNOWN: (GnnServeError, Exception),
    grpc.StatusCode.CANCELLED: (E.CancelledError, GnnServeError),
}


@pytest.mark.parametrize("code", list(ALL_CODES), ids=lambda c: c.name)
def test_error_for_code(code):
    cls, builtin = ALL_CODES[code]
    err = E.error_for_code(code, "the server's words", method="Predict", attempts=2)
    assert type(err) is cls and isinstance(err, builtin) and isinstance(err, GnnServeError)
    assert err.code == code and err.details == "the server's words" and err.method == "Predict"
    assert str(err) == f"{code.name}: the server's words (after 2 attempts)"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.code == code and back.details == err.details and back.attempts == 2


# --------------------------------------------------------------------------- real calls, no server
def _dead_address() -> str:
    with socket.socket() as s:  # a port nobody listens on (freed again at once)
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_unreachable_server_is_retried_then_unavailable():
    backoff = Backoff(initial_s=0.05, max_s=0.2)
    with GnnClient(_dead_address(), max_retries=3, backoff=backoff) as client:
        with pytest.raises(UnavailableError) as ei:
            client.predict("m", [1])
    assert ei.value.attempts == 4 and ei.value.method == "Predict"  # 1 try + 3 retries, then it gives up
    assert "(after 4 attempts)" in str(ei.value)
    with GnnClient(_dead_address(), max_retries=0) as client:
        with pytest.raises(UnavailableError) as ei:
            client.list_models()
        assert ei.value.attempts == 1
        with pytest.raises(UnavailableError):
            client.health()


def test_deadline_bounds_retries_against_a_dead_server():
    with GnnClient(_dead_address(), max_retries=1000, backoff=Backoff(0.05, 0.1), timeout=1.0) as client:
        with pytest.raises((UnavailableError, DeadlineExceededError)) as ei:
            client.get_model("m")
    # the 1 s deadline, not the retry budget, ended it (1000 retries take at least 50 s of backoff)
    assert 1 <= ei.value.attempts < 1000


def test_closed_client_refuses_calls():
    client = GnnClient(_dead_address())
    client.close()
    client.close()
    with pytest.raises(ValueError, match="closed"):
        client.predict("m", [1])


async def test_async_client_unreachable_and_closed():
    client = AsyncGnnClient(_dead_address(), max_retries=2, backoff=Backoff(0.02, 0.05))
    with pytest.raises(UnavailableError) as ei:
        await client.predict("m", [1, 2])
    assert ei.value.attempts == 3
    await client.close()
    with pytest.raises(ValueError, match="closed"):
        await client.list_models()


def test_wait_ready_times_out_with_a_clear_message():
    with GnnClient(_dead_address(), backoff=Backoff(0.05, 0.1)) as client:
        with pytest.raises(DeadlineExceededError, match=r"not SERVING within 0\.5 s"):
            client.wait_ready(timeout=0.5)


# --------------------------------------------------------------------------- model info
def _info(rows):
    return ModelInfo(name="m", version="1", versions=["1"], architecture="shadow-sage", extractor="ppr",
                     num_features=4, num_classes=3, num_nodes=10, max_ppr_budget=32, default_sampling_width=8,
                     default_ppr_budget=16, max_sampling_width=64, max_nodes_per_request=4096, strategy="fastrand",
                     knob_table=[KnobRow(*r) for r in rows], metrics={}, dataset_fingerprint="f", ready=True,
                     feature_store="memory")


def test_best_knobs_matches_the_server_rule():
    from serve.validation import KnobRow as ServerRow
    from serve.validation import ModelLimits, resolve_knobs

    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = []
        for k in (8, 16, 32):
            for s in (0, 2, 4, 8):
                rows.append((k, s, round(float(rng.uniform(0.5, 0.9)), 3), float(rng.uniform(0.01, 1.0)), 1.0))
        info = _info(rows)
        limits = ModelLimits(name="m", num_nodes=10, num_features=4, extractor="ppr", max_ppr_budget=32,
                             max_sampling_width=64, default_sampling_width=8, default_ppr_budget=16,
                             max_nodes_per_request=4096, knob_table=tuple(ServerRow(*r) for r in rows))
        loss = float(rng.choice([0.0, 0.01, 0.05, 0.2]))
        row = info.best_knobs(loss)
        s, k, chosen_by, _ = resolve_knobs(limits, None, None, loss)
        if chosen_by == "max_accuracy_loss":
            assert (row.sampling_width, row.ppr_budget) == (s, k)
    assert _info([(8, 4, 0.8, 0.1, 0.5)]).best_knobs(0.1) is None  # no exact row
    assert _info([(8, 0, 0.8, 0.1, 1.0)]).exact_accuracy == 0.8
    with pytest.raises(ValueError):
        _info([]).best_knobs(float("nan"))


# --------------------------------------------------------------------------- CLI without a server
def test_parse_nodes(tmp_path):
    assert parse_nodes("1,2,3").tolist() == [1, 2, 3]
    assert parse_nodes("0-4").tolist() == [0, 1, 2, 3, 4]
    assert parse_nodes(" 7 , 2-3 ,7").tolist() == [7, 2, 3, 7]
    f = tmp_path / "ids.txt"
    f.write_text("# ids\n5\n\n6-7  # a range\n 9\n")
    assert parse_nodes(f"@{f}").tolist() == [5, 6, 7, 9]
    assert parse_nodes(f"1,@{f},0").tolist() == [1, 5, 6, 7, 9, 0]
    assert parse_nodes("@ids.txt", base_dir=tmp_path).tolist() == [5, 6, 7, 9]
    for bad, msg in [("", "empty"), ("1,,2", "empty item"), ("x", "'x' is not a node id"), ("-3", "non-negative"),
                     ("5-2", "is empty"), ("1.5", "not a node id"), (f"@{tmp_path}/nope.txt", "cannot read"),
                     ("0-99999999999", "more than")]:
        with pytest.raises(NodeSpecError, match=msg):
            parse_nodes(bad)
    (tmp_path / "bad.txt").write_text("1\nabc\n")
    with pytest.raises(NodeSpecError, match=r"bad.txt:2: 'abc'"):
        parse_nodes(f"@{tmp_path}/bad.txt")


@pytest.mark.parametrize("argv,msg", [
    (["--model", "m"], "give --nodes (ids in the graph), --new-nodes FILE (nodes not in it), or both"),
    (["--model", "m", "--new-nodes", "/nonexistent/new.jsonl"], "cannot read '/nonexistent/new.jsonl'"),
    (["--model", "m", "--nodes", "1,x"], "'x' is not a node id"),
    (["--model", "m", "--nodes", "1", "--width", "abc"], "invalid int value"),
    (["--model", "m", "--nodes", "1", "--token-file", "/nonexistent/token"], "cannot read --token-file"),
    (["--model", "m", "--nodes", "1", "--ca", "/nonexistent/ca.pem"], "cannot read root certificates"),
    (["--model", "m", "--nodes", "1", "--cert", "c.pem"], "--cert and --key go together"),
    (["--model", "m", "--nodes", "1", "--timeout", "0"], "--timeout must be > 0"),
])
def test_predict_cli_bad_arguments_exit_2(argv, msg, capsys):
    rc = predict_main(["--server", _dead_address(), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err


def test_cli_unreachable_server_exit_1(capsys):
    rc = predict_main(["--server", _dead_address(), "--model", "m", "--nodes", "1", "--retries", "0"])
    err = capsys.readouterr().err
    assert rc == 1 and "UNAVAILABLE" in err and "Traceback" not in err
    rc = models_main(["--server", _dead_address(), "--retries", "0", "--json"])
    assert rc == 1 and "UNAVAILABLE" in capsys.readouterr().err


def test_cli_help_exits_0(capsys):
    assert predict_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--nodes" in out and "--max-accuracy-loss" in out
    assert models_main(["--help"]) == 0


def test_client_options_one_value_or_keywords():
    """Both clients take one ClientOptions, its fields as keywords, or both (keywords win); a misspelt
    keyword is a TypeError naming it, a bad value a ValueError."""
    import pytest

    from clients import AsyncGnnClient, Backoff, ClientOptions, GnnClient

    opts = ClientOptions(token="t0", timeout=2.0, max_retries=5, backoff=Backoff(initial_s=0.01))
    with GnnClient("127.0.0.1:1", opts) as c:
        assert (c.timeout, c.max_retries, c.backoff.initial_s) == (2.0, 5, 0.01)
        assert c.options is opts
    with GnnClient("127.0.0.1:1", opts, timeout=7.0) as c:
        assert c.timeout == 7.0 and c.options.token == "t0" and c.max_retries == 5
    a = AsyncGnnClient("127.0.0.1:1", max_nodes_per_call=10, retry_resource_exhausted=True)
    assert a.max_nodes_per_call == 10 and grpc.StatusCode.RESOURCE_EXHAUSTED in a.retry_codes and a.backoff == Backoff()
    with pytest.raises(TypeError, match="tiemout"):
        GnnClient("127.0.0.1:1", tiemout=1.0)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        GnnClient("127.0.0.1:1", opts, timeout=0)
    with pytest.raises(ValueError, match="max_retries"):
        ClientOptions(max_retries=-1)
