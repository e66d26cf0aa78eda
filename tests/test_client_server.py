"""The client SDK and the client CLI against a REAL gnnserve server on loopback (no mocks).

The shared server (``served`` from conftest: a shaDow-SAGE model "shadow" and a GCN "gcn" trained
on the synthetic ``tiny_dataset``) answers most tests. Three more servers over the same repository
cover what needs other settings: a strict one (bearer token, 16 nodes per request, a 1.5 s batch
delay and a small queue), a mutual-TLS one, and one that starts late and is then stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from clients import (
    AsyncGnnClient,
    Backoff,
    DeadlineExceededError,
    GnnClient,
    GnnServeError,
    InvalidArgumentError,
    NewNode,
    NotFoundError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc

serving = pytest.importorskip("tests.serving", reason="needs the server test harness tests/serving.py")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHADOW, GCN = "shadow", "gcn"
TOKEN = "s3cret-token"
STRICT_LIMIT = 16
STRICT_DELAY_MS = 1500.0


# --------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def addr(served) -> str:
    return served.address


@pytest.fixture
def client(addr):
    with GnnClient(addr, timeout=120) as c:
        yield c


def raw_predict(addr: str, **fields) -> pb.PredictResponse:
    """One PredictRequest straight through the generated stub: what the server itself answers."""
    with grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        return pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(**fields), timeout=120)


def raw_arrays(resp: pb.PredictResponse) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(resp.labels, dtype=np.int64)
    return labels, np.asarray(resp.probabilities, dtype=np.float32).reshape(len(labels), resp.num_classes)


class PortServer:
    """A GnnServer on a given port in a thread with its own loop (optionally started after a delay)."""

    def __init__(self, repo: Path, port: int, delay_s: float = 0.0, **config) -> None:
        self.repo, self.port, self.delay_s, self.config = repo, port, delay_s, config
        self.loop = asyncio.new_event_loop()
        self.server = None
        self.started = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="client-test-server")

    def _run(self) -> None:
        from serve.server import GnnServer, ServerConfig

        asyncio.set_event_loop(self.loop)
        time.sleep(self.delay_s)
        try:
            self.server = GnnServer(ServerConfig(repo=str(self.repo), port=self.port, poll_s=0, **self.config))
            self.loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self.errors.append(exc)
            return
        finally:
            self.started.set()
        self.loop.run_until_complete(self.server.wait())

    def start(self) -> PortServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.started.wait(300)
        if self.server is not None and not self.loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.server.stop(2.0), self.loop).result(60)
        self.thread.join(60)
        self.loop.close()


@pytest.fixture(scope="module")
def strict(tiny_repo):
    """Token auth, 16 nodes per request, every batch held 1.5 s, a queue of 24 targets."""
    from serve.runtime import RuntimeOptions

    runtime = RuntimeOptions(max_nodes_per_request=STRICT_LIMIT, max_delay_ms=STRICT_DELAY_MS,
                             max_queue_targets=24)
    srv = serving.ServerThread(tiny_repo, {"runtime": runtime, "token": TOKEN}).start()
    yield srv
    srv.stop()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate; a second, unrelated CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed (needed to make test certificates)")
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN=gnnserve test {ca}", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)
    return d


@pytest.fixture(scope="module")
def mtls(tiny_repo, certs):
    srv = serving.ServerThread(tiny_repo, {"tls_cert": str(certs / "server.pem"), "tls_key": str(certs / "server.key"),
                                           "tls_client_ca": str(certs / "ca.pem")}).start()
    yield srv
    srv.stop()


# --------------------------------------------------------------------------- health and models
def test_health_and_wait_ready(client):
    assert client.health() == "SERVING"
    assert client.health("gnnserve.v1.GnnService") == "SERVING"
    client.wait_ready(timeout=10)
    with pytest.raises(NotFoundError, match="no-such-service"):
        client.health("no-such-service")


def test_list_and_get_models(client, tiny_dataset):
    from serve.runtime import RuntimeOptions  # the limits the session's server runs with

    infos = {m.name: m for m in client.list_models()}
    assert set(infos) == {SHADOW, GCN}
    for name, info in infos.items():
        assert info == client.get_model(name) == client.get_model(name, version=1)
        assert info.version == "1" and info.versions == ["1"] and info.ready
        assert info.num_nodes == tiny_dataset.num_nodes
        assert info.num_features == tiny_dataset.num_features
        assert info.num_classes == tiny_dataset.num_classes
        assert info.max_nodes_per_request == 4096
        assert (info.max_request_work, info.max_new_node_edges) == (RuntimeOptions().max_request_work,
                                                                     RuntimeOptions().max_new_node_edges)
        assert info.knob_table and info.exact_accuracy is not None and 0 < info.exact_accuracy <= 1
        assert all(0 < r.edges_kept_fraction <= 1 for r in info.knob_table)
    shadow, gcn = infos[SHADOW], infos[GCN]
    assert shadow.extractor == "ppr" and shadow.max_ppr_budget == 32
    assert {r.ppr_budget for r in shadow.knob_table} == {8, 16, 32}
    assert {r.sampling_width for r in shadow.knob_table} == {0, 2, 4, 8}
    assert gcn.extractor == "lhop" and gcn.max_ppr_budget == 0 and {r.ppr_budget for r in gcn.knob_table} == {0}


def test_a_model_whose_graph_is_out_of_service_is_listed_not_ready(tiny_repo, capsys):
    """A graph taken out of service (its update log lost or replaced, an update failed half-way: every request for
    its models fails until a restart) left ListModels and GetModel saying ready, while health and KServe's
    ModelReady said not. The models stay listed, as not ready, and ``gnnserve models`` prints NOT READY."""
    from serve.cli import main

    with serving.ServerThread(tiny_repo, {"poll_s": 0}) as srv, GnnClient(srv.address, timeout=60) as c:
        assert all(m.ready for m in c.list_models())
        registry = srv.server.registry
        live = registry.get(GCN).data.live
        assert live is not None
        live._out_of_service("a test took the graph out of service", trace=False)  # what a lost log does
        listed = {m.name: m for m in c.list_models()}
        assert set(listed) == {GCN, SHADOW}  # still listed
        for name, info in listed.items():
            broken = registry.get(name).data.live is live
            assert info.ready is (not broken), name
            assert c.get_model(name).ready is info.ready
        assert not listed[GCN].ready
        index = {name: (state, reason) for name, _, state, reason in registry.index()}  # KServe's RepositoryIndex
        assert index[GCN][0] == "UNAVAILABLE" and "a test took the graph out of service" in index[GCN][1], index
        assert main(["models", "--server", srv.address, "--model", GCN]) == 0
        assert "NOT READY" in capsys.readouterr().out


# --------------------------------------------------------------------------- predict
def test_predict_across_chunk_boundaries_equals_one_request(addr, tiny_dataset):
    rng = np.random.default_rng(1)
    nodes = rng.integers(0, tiny_dataset.num_nodes, size=53)
    nodes[10] = nodes[3]  # a duplicate
    ref = raw_predict(addr, model=SHADOW, nodes=nodes.tolist(), sampling_width=4, ppr_budget=16,
                      return_probabilities=True, return_embeddings=True)
    ref_labels, ref_probs = raw_arrays(ref)
    with GnnClient(addr, max_nodes_per_call=7, timeout=120) as c:
        res = c.predict(SHADOW, nodes, sampling_width=4, ppr_budget=16, return_embeddings=True, request_id="chunky")
    assert res.timing.chunks == 8  # 7 * 7 + 4
    assert res.nodes.tolist() == nodes.tolist() and len(res) == 53
    assert res.labels.dtype == np.int64 and res.labels.tolist() == ref_labels.tolist()
    assert res.probabilities.dtype == np.float32 and res.probabilities.shape == (53, 4)
    np.testing.assert_allclose(res.probabilities, ref_probs, atol=1e-5)
    np.testing.assert_allclose(res.probabilities.sum(1), 1.0, atol=1e-5)
    assert res.labels[10] == res.labels[3]
    emb = np.asarray(ref.embeddings, dtype=np.float32).reshape(53, ref.embedding_dim)
    assert res.embeddings.shape == emb.shape and ref.embedding_dim > 0
    np.testing.assert_allclose(res.embeddings, emb, atol=1e-4)
    # edge counts add up over chunks to what one request reports
    assert (res.settings.edges_kept, res.settings.edges_total) == (ref.settings.edges_kept, ref.settings.edges_total)
    assert 0 < res.settings.edges_kept < res.settings.edges_total
    assert (res.model, res.version, res.request_id) == (SHADOW, "1", "chunky")
    assert res.timing.total_ms > 0 and res.timing.client_ms > 0 and res.timing.batch_size >= 1


def test_predict_quality_beats_chance(client, tiny_dataset):
    test_nodes = np.flatnonzero(tiny_dataset.test_mask)[:160]
    for model in (SHADOW, GCN):
        res = client.predict(model, test_nodes, sampling_width=0)
        acc = float((res.labels == tiny_dataset.y[test_nodes]).mean())
        assert acc > 1.5 / tiny_dataset.num_classes, f"{model}: test accuracy {acc:.3f}"
        assert res.embeddings is None and res.probabilities.shape == (len(test_nodes), tiny_dataset.num_classes)


def test_knobs_are_echoed(client):
    info = client.get_model(SHADOW)
    nodes = [0, 1, 2, 3]
    s = client.predict(SHADOW, nodes, sampling_width=2, ppr_budget=8).settings
    assert (s.sampling_width, s.ppr_budget, s.chosen_by) == (2, 8, "request")
    assert s.extractor == "ppr" and s.strategy == info.strategy
    row = next(r for r in info.knob_table if (r.ppr_budget, r.sampling_width) == (8, 2))
    assert s.expected_accuracy == pytest.approx(row.val_accuracy)
    s = client.predict(SHADOW, nodes).settings
    assert (s.sampling_width, s.ppr_budget, s.chosen_by) == (
        info.default_sampling_width, info.default_ppr_budget, "default")
    s = client.predict(SHADOW, nodes, sampling_width=10**6, ppr_budget=10**6).settings  # clamped
    assert (s.sampling_width, s.ppr_budget) == (info.max_sampling_width, info.max_ppr_budget)
    best = info.best_knobs(0.05)
    s = client.predict(SHADOW, nodes, max_accuracy_loss=0.05).settings
    assert (s.sampling_width, s.ppr_budget, s.chosen_by) == (best.sampling_width, best.ppr_budget, "max_accuracy_loss")
    s = client.predict(SHADOW, nodes, max_accuracy_loss=0.05, ppr_budget=32).settings
    assert s.ppr_budget == 32 and s.chosen_by == "max_accuracy_loss"
    exact = client.predict(SHADOW, nodes, sampling_width=0).settings
    assert exact.sampling_width == 0 and exact.edges_kept == exact.edges_total
    s = client.predict(GCN, nodes, sampling_width=2, ppr_budget=8).settings
    assert (s.sampling_width, s.ppr_budget, s.extractor) == (2, 0, "lhop")


def test_predict_new_nodes(client, tiny_dataset):
    g, x = tiny_dataset.graph, np.asarray(tiny_dataset.x)
    picks = [5, 17, 123]
    nbrs = [g.indices[g.indptr[v]:g.indptr[v + 1]].astype(np.int64) for v in picks]
    one = client.predict_new_node(SHADOW, x[5], nbrs[0], sampling_width=0)
    assert len(one) == 1 and one.num_new_nodes == 1 and one.nodes.size == 0
    assert 0 <= one.labels[0] < tiny_dataset.num_classes
    np.testing.assert_allclose(one.probabilities.sum(), 1.0, atol=1e-5)
    assert one.probabilities[0].argmax() == one.labels[0]
    many = client.predict_new_node(SHADOW, x[picks], nbrs, sampling_width=0)
    assert len(many) == 3
    np.testing.assert_allclose(many.probabilities[0], one.probabilities[0], atol=1e-5)
    # chunked: one new node per request, same answers, in order
    with GnnClient(client.address, max_nodes_per_call=1, timeout=120) as c1:
        objs = [NewNode(x[v], n, np.ones(len(n))) for v, n in zip(picks, nbrs, strict=True)]
        chunked = c1.predict_new_node(SHADOW, objs, sampling_width=0, return_embeddings=True)
    assert chunked.timing.chunks == 3 and chunked.embeddings.shape[0] == 3
    assert chunked.labels.tolist() == many.labels.tolist()
    np.testing.assert_allclose(chunked.probabilities, many.probabilities, atol=1e-5)
    # a copy of a well-connected node with all its edges is classified like the node itself, mostly
    orig = client.predict(SHADOW, picks, sampling_width=0)
    assert (orig.labels == many.labels).sum() >= 2
    with pytest.raises(InvalidArgumentError, match=f"features must have {tiny_dataset.num_features} values"):
        client.predict_new_node(SHADOW, x[5][:3], [1, 2])
    with pytest.raises(InvalidArgumentError, match=str(tiny_dataset.num_nodes + 5)):
        client.predict_new_node(SHADOW, x[5], [1, tiny_dataset.num_nodes + 5])


def test_predict_existing_and_new_nodes_in_one_call(client, tiny_dataset):
    """GnnClient.predict(nodes, new_nodes=...) (and the asyncio client's): existing nodes' rows first, then the new
    nodes', each equal to the calls made separately; chunked across requests too; new nodes alone with empty nodes."""
    g, x = tiny_dataset.graph, np.asarray(tiny_dataset.x)
    picks = [5, 17, 123]
    new = [NewNode(x[v], g.indices[g.indptr[v]:g.indptr[v + 1]]) for v in picks]
    for model in (SHADOW, GCN):
        both = client.predict(model, [3, 9, 3], new_nodes=new, sampling_width=0)
        assert both.nodes.tolist() == [3, 9, 3] and both.num_new_nodes == 3 and len(both) == 6
        old = client.predict(model, [3, 9, 3], sampling_width=0)
        fresh = client.predict_new_node(model, new, sampling_width=0)
        assert both.labels.tolist() == old.labels.tolist() + fresh.labels.tolist()
        np.testing.assert_allclose(both.probabilities, np.vstack([old.probabilities, fresh.probabilities]), atol=1e-5)
        with GnnClient(client.address, max_nodes_per_call=2, timeout=120) as c2:
            chunked = c2.predict(model, [3, 9, 3], new_nodes=new, sampling_width=0)
        assert chunked.timing.chunks == 4 and chunked.labels.tolist() == both.labels.tolist()  # 2 + 2 requests
        alone = client.predict(model, [], new_nodes=new[0], sampling_width=0)
        assert alone.nodes.size == 0 and alone.labels.tolist() == fresh.labels[:1].tolist()

    async def run():
        async with AsyncGnnClient(client.address, timeout=120) as c:
            return await c.predict(SHADOW, [3, 9, 3], new_nodes=new, sampling_width=0)

    res = asyncio.run(run())
    ref = client.predict(SHADOW, [3, 9, 3], new_nodes=new, sampling_width=0)
    assert res.labels.tolist() == ref.labels.tolist()
    np.testing.assert_allclose(res.probabilities, ref.probabilities, atol=1e-5)


def test_cli_predict_new_nodes_from_a_file(addr, client, tiny_dataset, capsys, tmp_path, monkeypatch):
    """gnnserve predict --new-nodes FILE (JSON lines or an array, '-' for stdin), with and without --nodes; the rows
    equal the SDK's; a malformed file is one line naming the entry, exit 2, before anything is sent."""
    import io

    from serve.cli import main

    g, x = tiny_dataset.graph, np.asarray(tiny_dataset.x)
    objs = [{"features": x[v].tolist(), "neighbors": g.indices[g.indptr[v]:g.indptr[v + 1]].tolist()} for v in (5, 17)]
    objs[1]["edge_weights"] = [0.5] * len(objs[1]["neighbors"])
    lines = tmp_path / "new.jsonl"
    lines.write_text("# two new nodes\n" + "\n".join(json.dumps(o) for o in objs) + "\n")
    ref = client.predict(SHADOW, [7], new_nodes=[NewNode(o["features"], o["neighbors"], o.get("edge_weights"))
                                                 for o in objs], sampling_width=0)
    rc = main(["predict", "--server", addr, "--model", SHADOW, "--nodes", "7", "--new-nodes", str(lines),
               "--width", "0", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["nodes"] == [7] and doc["labels"] == ref.labels.tolist()
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(objs)))
    rc = main(["predict", "--server", addr, "--model", SHADOW, "--new-nodes", "-", "--width", "0"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert [row.split()[:2] for row in out[2:4]] == [["new[0]", str(ref.labels[1])], ["new[1]", str(ref.labels[2])]]
    bad = tmp_path / "bad.jsonl"
    for text, msg in (('{"features": [1.0], "neighbours": [1]}', "unknown field(s) ['neighbours']"),
                      ('{"neighbors": [1]}', "a new node is an object"),
                      ('{"features": [1.0, "x"]}', "features"),
                      ("", "no new nodes in it")):
        bad.write_text(text + "\n")
        rc = main(["predict", "--server", addr, "--model", SHADOW, "--new-nodes", str(bad)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and msg in err[0] and str(bad) in err[0], err
    rc = main(["predict", "--server", addr, "--model", SHADOW])
    err = capsys.readouterr().err
    assert rc == 2 and "give --nodes" in err and "--new-nodes" in err


# --------------------------------------------------------------------------- typed errors
def test_typed_errors_carry_the_server_message(client, tiny_dataset):
    n = tiny_dataset.num_nodes
    with pytest.raises(NotFoundError, match="no-such-model") as ei:
        client.predict("no-such-model", [1, 2])
    assert ei.value.code == grpc.StatusCode.NOT_FOUND and ei.value.attempts == 1
    with pytest.raises(NotFoundError, match="no-such-model"):
        client.predict("no-such-model", [1])  # single node: no model lookup first
    with pytest.raises(NotFoundError, match="version 7"):
        client.predict(SHADOW, [1], version=7)
    with pytest.raises(NotFoundError):
        client.get_model("no-such-model")
    with pytest.raises(InvalidArgumentError) as ei:
        client.predict(SHADOW, [0, n + 12, 3])
    assert str(n + 12) in ei.value.details and ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InvalidArgumentError, match="-4"):
        client.predict(SHADOW, [-4])
    with pytest.raises(InvalidArgumentError, match="no nodes"):
        client.predict(SHADOW, [])
    with pytest.raises(InvalidArgumentError, match="-3"):
        client.predict(SHADOW, [1], sampling_width=-3)
    with pytest.raises(InvalidArgumentError, match="ppr_budget"):
        client.predict(SHADOW, [1], ppr_budget=0)
    with pytest.raises(InvalidArgumentError, match="max_accuracy_loss"):
        client.predict(SHADOW, [1], max_accuracy_loss=float("nan"))
    # the server is fine afterwards
    assert client.predict(SHADOW, [1]).labels.shape == (1,)


def test_oversized_request_is_refused_by_the_server_and_chunked_by_the_client(strict, tiny_dataset):
    nodes = list(range(40))
    with pytest.raises(grpc.RpcError) as ei:
        with grpc.insecure_channel(strict.address) as ch:
            pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(model=SHADOW, nodes=nodes), timeout=60,
                                               metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"limit of {STRICT_LIMIT}" in ei.value.details()
    with GnnClient(strict.address, token=TOKEN, timeout=120) as c:
        assert c.get_model(SHADOW).max_nodes_per_request == STRICT_LIMIT
        res = c.predict(SHADOW, nodes, sampling_width=2, ppr_budget=8)
    assert res.timing.chunks == 3 and len(res) == 40  # 16 + 16 + 8, limit read from the server
    assert res.timing.queue_ms >= 3 * STRICT_DELAY_MS * 0.5  # each chunk waited in the batcher


# --------------------------------------------------------------------------- auth, deadlines, overload
def test_bearer_token(strict):
    with GnnClient(strict.address, timeout=60) as c:
        assert c.health() == "SERVING"  # health stays open without a token
        with pytest.raises(UnauthenticatedError) as ei:
            c.list_models()
        assert ei.value.attempts == 1  # never retried
        with pytest.raises(UnauthenticatedError):
            c.predict(SHADOW, [1])
    with GnnClient(strict.address, token="wrong", timeout=60) as c:
        with pytest.raises(UnauthenticatedError) as ei:
            c.get_model(SHADOW)
        assert "token" in ei.value.details and TOKEN not in ei.value.details
    with GnnClient(strict.address, token=TOKEN, timeout=60) as c:
        assert {m.name for m in c.list_models()} == {GCN, SHADOW}


def test_deadline_exceeded(strict):
    with GnnClient(strict.address, token=TOKEN) as c:
        c.get_model(SHADOW)
        with pytest.raises(DeadlineExceededError) as ei:
            c.predict(SHADOW, [1, 2], timeout=0.3)  # every batch is held 1.5 s
        assert ei.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and isinstance(ei.value, TimeoutError)
    with GnnClient(strict.address, token=TOKEN, timeout=0.3) as c:  # the client default applies too
        with pytest.raises(DeadlineExceededError):
            c.predict(SHADOW, [3])
        assert len(c.predict(SHADOW, [3], timeout=30)) == 1  # per call overrides the default


async def test_queue_full_is_not_retried_unless_asked(strict):
    # the queue holds 24 targets and batches wait 1.5 s: 4 concurrent 16-node calls cannot all fit
    async with AsyncGnnClient(strict.address, token=TOKEN, timeout=60, max_retries=5) as c:
        await c.get_model(SHADOW)
        out = await asyncio.gather(*(c.predict(SHADOW, range(16 * i, 16 * i + 16)) for i in range(4)),
                                   return_exceptions=True)
    refused = [r for r in out if isinstance(r, ResourceExhaustedError)]
    assert refused, f"expected RESOURCE_EXHAUSTED for some of {out}"
    assert all(r.attempts == 1 for r in refused)
    assert all(not isinstance(r, BaseException) or isinstance(r, ResourceExhaustedError) for r in out)
    async with AsyncGnnClient(strict.address, token=TOKEN, timeout=120, max_retries=20,
                              backoff=Backoff(0.5, 2.0), retry_resource_exhausted=True) as c:
        out = await asyncio.gather(*(c.predict(SHADOW, range(16 * i, 16 * i + 16)) for i in range(4)))
    assert [len(r) for r in out] == [16, 16, 16, 16]


# --------------------------------------------------------------------------- TLS
def test_mutual_tls(mtls, certs):
    with GnnClient(mtls.address, root_certificates=certs / "ca.pem", client_cert=certs / "client.pem",
                   client_key=certs / "client.key", timeout=60) as c:
        assert c.tls and c.health() == "SERVING"
        assert len(c.predict(SHADOW, [1, 2, 3])) == 3
    with GnnClient(f"localhost:{mtls.address.rsplit(':', 1)[1]}", root_certificates=(certs / "ca.pem").read_bytes(),
                   client_cert=(certs / "client.pem").read_bytes(), client_key=(certs / "client.key").read_bytes(),
                   timeout=60) as c:
        assert c.health() == "SERVING"  # certificate checked against the name "localhost"
    failing = [
        dict(),  # plaintext against a TLS port
        dict(root_certificates=certs / "ca.pem"),  # no client certificate
        dict(root_certificates=certs / "other-ca.pem", client_cert=certs / "client.pem",
             client_key=certs / "client.key"),  # server certificate not trusted
    ]
    for kw in failing:
        with GnnClient(mtls.address, timeout=20, max_retries=1, backoff=Backoff(0.05, 0.1), **kw) as c:
            with pytest.raises(UnavailableError):
                c.list_models()


# --------------------------------------------------------------------------- retries and a server that comes and goes
def test_retries_until_a_late_server_is_up_and_give_up_once_it_is_gone(tiny_repo, caplog):
    port = serving.free_port()
    late = PortServer(tiny_repo, port, delay_s=1.0).start()
    try:
        with GnnClient(f"127.0.0.1:{port}", max_retries=60, backoff=Backoff(0.1, 0.5), timeout=120) as c:
            with caplog.at_level(logging.DEBUG, logger="clients"):
                c.list_models()  # the port opens after ~1 s: the first attempts fail UNAVAILABLE
            retried = [r for r in caplog.records if "UNAVAILABLE" in r.getMessage() and "retry" in r.getMessage()]
            assert retried, "expected the first attempts to fail UNAVAILABLE and be retried"
            c.wait_ready(timeout=300)
            assert len(c.predict(SHADOW, [4, 5])) == 2
            late.stop()
            with GnnClient(f"127.0.0.1:{port}", max_retries=3, backoff=Backoff(0.05, 0.2)) as gone:
                with pytest.raises(UnavailableError) as ei:
                    gone.predict(SHADOW, [4])
            assert ei.value.attempts == 4  # bounded: 1 try + 3 retries
    finally:
        if late.thread.is_alive():
            late.stop()
    assert not late.errors, late.errors


# --------------------------------------------------------------------------- asyncio twin
async def test_async_twin_parity(addr, tiny_dataset):
    nodes = np.arange(0, 45)
    with GnnClient(addr, max_nodes_per_call=10, timeout=120) as sc:
        sync_res = sc.predict(SHADOW, nodes, sampling_width=4, ppr_budget=16, return_embeddings=True)
        sync_models = sc.list_models()
    async with AsyncGnnClient(addr, max_nodes_per_call=10, timeout=120) as ac:
        assert await ac.health() == "SERVING"
        await ac.wait_ready(timeout=10)
        res = await ac.predict(SHADOW, nodes, sampling_width=4, ppr_budget=16, return_embeddings=True)
        assert await ac.list_models() == sync_models
        assert await ac.get_model(SHADOW) == next(m for m in sync_models if m.name == SHADOW)
        assert res.timing.chunks == 5 == sync_res.timing.chunks
        assert res.labels.tolist() == sync_res.labels.tolist()
        np.testing.assert_allclose(res.probabilities, sync_res.probabilities, atol=1e-5)
        np.testing.assert_allclose(res.embeddings, sync_res.embeddings, atol=1e-4)
        assert res.settings == sync_res.settings
        x = np.asarray(tiny_dataset.x)
        new = await ac.predict_new_node(SHADOW, x[[1, 2]], [[3, 4], [5]])
        assert len(new) == 2
        many = await asyncio.gather(*(ac.predict(GCN, [i]) for i in range(12)))
        assert [int(r.labels[0]) for r in many] == sc_labels(addr, GCN, range(12))
        with pytest.raises(NotFoundError):
            await ac.predict("no-such-model", [1, 2])
        with pytest.raises(InvalidArgumentError, match=str(tiny_dataset.num_nodes)):
            await ac.predict(SHADOW, [tiny_dataset.num_nodes])


def sc_labels(addr: str, model: str, nodes) -> list[int]:
    with GnnClient(addr, timeout=120) as c:
        return c.predict(model, list(nodes)).labels.tolist()


# --------------------------------------------------------------------------- CLI
def test_timeouts_past_grpcs_limit_answer(addr, client, capsys):
    """A timeout past what gRPC takes (about 3e9 s) or infinity means no practical deadline: the call is answered
    (it failed at once with DEADLINE_EXCEEDED, never sent), through the SDK and the CLI."""
    from clients import GnnClient
    from serve.cli import main

    ref = client.predict(GCN, [7, 8])
    for t in (1e12, float("inf")):
        with GnnClient(addr, timeout=t) as c:
            assert c.predict(GCN, [7, 8]).labels.tolist() == ref.labels.tolist()
        assert client.predict(GCN, [7, 8], timeout=t).labels.tolist() == ref.labels.tolist()
    assert main(["predict", "--server", addr, "--model", GCN, "--nodes", "7,8", "--timeout", "1e12", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == ref.labels.tolist()


def test_a_tls_client_to_a_plaintext_server_is_told_so(addr):
    """A new-user audit: --tls against a plaintext server ended in "Connection refused" after the retries, never
    naming TLS. An UNAVAILABLE over a TLS channel now says that a plaintext server looks unreachable to it."""
    from clients import GnnClient
    from clients._core import TLS_HINT
    from clients.errors import UnavailableError

    with GnnClient(addr, tls=True, max_retries=0, timeout=10) as c, pytest.raises(UnavailableError) as ei:
        c.predict(GCN, [1])
    assert TLS_HINT in str(ei.value), ei.value
    with GnnClient(addr, max_retries=0, timeout=10) as c:  # plaintext to plaintext: answered, and no hint anywhere
        assert len(c.predict(GCN, [1]).labels) == 1


def test_cli_predict_json_and_table(addr, client, capsys):
    from serve.cli import main

    rc = main(["predict", "--server", addr, "--model", SHADOW, "--nodes", "0-9,3", "--width", "2", "--budget", "8",
               "--json", "--probabilities", "--max-nodes-per-call", "4"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    ref = client.predict(SHADOW, [*range(10), 3], sampling_width=2, ppr_budget=8)
    assert doc["nodes"] == [*range(10), 3] and doc["labels"] == ref.labels.tolist()
    np.testing.assert_allclose(doc["probabilities"], ref.probabilities, atol=1e-5)
    assert doc["settings"]["sampling_width"] == 2 and doc["settings"]["ppr_budget"] == 8
    assert doc["timing"]["chunks"] == 3 and doc["model"] == SHADOW and doc["version"] == "1"
    rc = main(["predict", "--server", addr, "--model", GCN, "--nodes", "7,8"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"model {GCN}  version 1")
    ref = client.predict(GCN, [7, 8])
    assert lines[2].split()[:2] == ["7", str(ref.labels[0])] and lines[3].split()[:2] == ["8", str(ref.labels[1])]
    assert any(line.startswith("settings:") and "extractor=lhop" in line for line in lines)
    assert any(line.startswith("timing:") for line in lines)


def test_cli_errors(addr, tiny_dataset, capsys, tmp_path):
    from serve.cli import main

    rc = main(["predict", "--server", addr, "--model", "no-such-model", "--nodes", "1,2"])
    err = capsys.readouterr().err
    assert rc == 1 and "NOT_FOUND" in err and "no-such-model" in err and "Traceback" not in err
    n = tiny_dataset.num_nodes
    ids = tmp_path / "ids.txt"
    ids.write_text(f"1\n{n + 3}\n")
    rc = main(["predict", "--server", addr, "--model", SHADOW, "--nodes", f"@{ids}"])
    err = capsys.readouterr().err
    assert rc == 2 and "INVALID_ARGUMENT" in err and str(n + 3) in err
    rc = main(["predict", "--server", addr, "--model", SHADOW, "--nodes", "1", "--width", "-1"])
    assert rc == 2 and "sampling_width" in capsys.readouterr().err


def test_cli_models(addr, capsys):
    from serve.cli import main

    assert main(["models", "--server", addr, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {m["name"] for m in doc} == {SHADOW, GCN}
    shadow = next(m for m in doc if m["name"] == SHADOW)
    assert {(r["ppr_budget"], r["sampling_width"]) for r in shadow["knob_table"]} == {
        (k, s) for k in (8, 16, 32) for s in (0, 2, 4, 8)}
    assert main(["models", "--server", addr, "--model", GCN]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{GCN}  version 1") and "exact" in out and SHADOW not in out
    assert main(["models", "--server", addr, "--model", "nope"]) == 1


def test_cli_subprocess_with_token(strict, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("GNNSERVE_TOKEN", None)
    base = [sys.executable, "-m", "serve.cli", "predict", "--server", strict.address, "--model", GCN, "--nodes", "1-3"]
    out = subprocess.run([*base, "--json", "--token-file", str(token_file)], capture_output=True, text=True,
                         env=env, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["labels"]) == 3
    out = subprocess.run(base, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 1 and "UNAUTHENTICATED" in out.stderr and "Traceback" not in out.stderr


def test_errors_are_gnnserve_errors():
    # every typed error the tests above meet derives from the one base class
    for cls in (NotFoundError, InvalidArgumentError, UnavailableError, DeadlineExceededError, UnauthenticatedError,
                ResourceExhaustedError):
        assert issubclass(cls, GnnServeError)
