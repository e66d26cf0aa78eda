"""Security of a REAL ``gnnserve serve`` process (issue 8): TLS, bearer token, Redis password in the
feature URL, no secrets in the server log, and checkpoints that are never unpickled.

One subprocess serves a repository (a GCN plus a planted malicious checkpoint) over TLS with a
server certificate (made here with the ``openssl`` CLI), a token file, and features from a
password-protected Redis named by a ``redis://:PASSWORD@...`` URL, logging at DEBUG into a file
that the test then searches for the secrets. Mutual TLS (client certificates) is covered in
tests/test_client_server.py::test_mutual_tls.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from clients import GnnClient, UnauthenticatedError
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg

from .reliability_support import PROBE, check_answer
from .serving import ServerProcess

TOKEN = "tok-7Hq2-unguessable-Zx9"
REDIS_PASSWORD = "pw-Kd83!redis-S3cret"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> Path:
    """A CA, a server certificate for localhost / 127.0.0.1 and a client certificate signed by the CA
    (EC P-256, 2 days); an unrelated CA."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN=gnnserve security test {ca}", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=d)
    _openssl("req", *ec, "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=gnnserve test client", cwd=d)
    _openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "client.pem", "-days", "2", cwd=d)
    return d


class _Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def plant_pickle_checkpoint(src: Path, dst: Path, marker: Path) -> None:
    """A copy of checkpoint ``src`` whose weights file is a malicious pickle, with config.json's
    recorded size and SHA-256 updated to match (so only the format check can stop it)."""
    shutil.copytree(src, dst)
    blob = pickle.dumps({"layers.0.weight": _Payload(marker)})
    (dst / "weights.safetensors").write_bytes(blob)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["weights"].update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    (dst / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def secure(tiny_repo, tiny_dataset, tmp_path_factory):
    from serve.features import load_features

    from .redis_server import RedisServer, find_redis_server

    if shutil.which("openssl") is None or find_redis_server() is None:
        pytest.skip("needs the openssl CLI and a redis-server binary")
    tmp = tmp_path_factory.mktemp("secure")
    certs = make_certs(tmp / "certs")
    repo = tmp / "repo"
    for part in ("gcn/1", "_data"):
        shutil.copytree(tiny_repo / part, repo / part)
    marker = tmp / "PWNED"
    # the payload is live: unpickling it in a scratch place does run it
    probe_marker = tmp / "payload-works"
    pickle.loads(pickle.dumps(_Payload(probe_marker)))
    assert probe_marker.exists()
    plant_pickle_checkpoint(repo / "gcn" / "1", repo / "evil" / "1", marker)
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    redis = RedisServer(password=REDIS_PASSWORD).start()
    assert REDIS_PASSWORD.replace("!", "%21") in redis.url or REDIS_PASSWORD in redis.url
    load_features(tiny_dataset, redis.url, version=1, progress=False)
    proc = ServerProcess(repo, "--features", redis.url, "--token-file", str(token_file), "--tls-cert",
                         str(certs / "server.pem"), "--tls-key", str(certs / "server.key"), "--log-level", "DEBUG",
                         "--projection-cache-bytes", "0", "--poll-s", "0", log_path=tmp / "server.log")
    try:
        proc.start()
        yield {"proc": proc, "certs": certs, "marker": marker, "redis": redis, "repo": repo}
    finally:
        proc.kill()
        redis.cleanup()


def _tls_channel(proc: ServerProcess, ca: Path) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    return grpc.secure_channel(f"localhost:{proc.port}", creds)


def test_tls_and_token_answer_correctly(secure, tiny_repo, tiny_dataset):
    proc, certs = secure["proc"], secure["certs"]
    with GnnClient(f"localhost:{proc.port}", root_certificates=certs / "ca.pem", token=TOKEN, timeout=60) as c:
        assert c.tls and c.health() == "SERVING"
        assert {m.name for m in c.list_models()} == {"gcn"}  # "evil" was refused
    with _tls_channel(proc, certs / "ca.pem") as ch:  # no projection cache: every batch reads Redis
        r = pbg.GnnServiceStub(ch).Predict(pb.PredictRequest(model="gcn", nodes=PROBE, return_probabilities=True),
                                           metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=60)
    check_answer(r, PROBE, tiny_repo, tiny_dataset, "gcn")  # features came from the password-protected Redis


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),),
                                      (("authorization", f"Bearer {TOKEN}x"),), (("authorization", "Basic abc"),)],
                         ids=["missing", "wrong", "no-scheme", "suffix", "basic"])
def test_missing_or_wrong_token_is_unauthenticated_with_no_detail(secure, metadata):
    proc, certs = secure["proc"], secure["certs"]
    with _tls_channel(proc, certs / "ca.pem") as ch:
        st = pbg.GnnServiceStub(ch)
        for call in (lambda: st.Predict(pb.PredictRequest(model="gcn", nodes=[1]), metadata=metadata, timeout=30),
                     lambda: st.Predict(pb.PredictRequest(model="nope", nodes=[-1]), metadata=metadata, timeout=30),
                     lambda: st.ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=30)):
            with pytest.raises(grpc.RpcError) as ei:
                call()
            # the same answer whatever the request: nothing about models, ids or the token leaks
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert ei.value.details() == "missing or invalid bearer token"
            assert not ei.value.trailing_metadata()
        # the health check stays open for orchestrators; the streams a client holds open do not (each counts
        # against --max-concurrent-rpcs: anonymous ones could fill it)
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert h.status == health_pb2.HealthCheckResponse.SERVING
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), metadata=metadata,
                                                     timeout=30)
        refl = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata, timeout=30)
        for stream in (watch, refl):
            with pytest.raises(grpc.RpcError) as ei:
                next(stream)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with _tls_channel(proc, certs / "ca.pem") as ch:  # with the token, both answer
        md = (("authorization", f"Bearer {TOKEN}"),)
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), metadata=md, timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        refl = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=md, timeout=30)
        names = [s.name for s in next(refl).list_services_response.service]
        assert "gnnserve.v1.GnnService" in names
    with GnnClient(f"localhost:{proc.port}", root_certificates=certs / "ca.pem", token="wrong", timeout=30) as c:
        with pytest.raises(UnauthenticatedError):
            c.predict("gcn", [1])


def test_tls_is_required_and_the_certificate_checked(secure):
    proc, certs = secure["proc"], secure["certs"]
    md = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(proc.address) as ch:  # plaintext against the TLS port
        with pytest.raises(grpc.RpcError) as ei:
            pbg.GnnServiceStub(ch).ListModels(pb.ListModelsRequest(), metadata=md, timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    with _tls_channel(proc, certs / "other-ca.pem") as ch:  # server certificate from an untrusted CA
        with pytest.raises(grpc.RpcError) as ei:
            pbg.GnnServiceStub(ch).ListModels(pb.ListModelsRequest(), metadata=md, timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE


def test_pickled_checkpoint_is_refused_and_never_run(secure):
    proc = secure["proc"]
    assert not secure["marker"].exists(), "the malicious pickle was executed"
    log = proc.log_path.read_text(errors="replace")
    assert "model evil v1" in log and "refused" in log and "unreadable safetensors" in log
    with _tls_channel(proc, secure["certs"] / "ca.pem") as ch:
        with pytest.raises(grpc.RpcError) as ei:
            pbg.GnnServiceStub(ch).Predict(pb.PredictRequest(model="evil", nodes=[1]),
                                           metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30)
        # on disk, refused at load: out of service with the cause (only new files mend it: not retried)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "unreadable safetensors" in ei.value.details()


def test_no_secrets_in_the_log(secure):
    """Runs last: after every request above (and a Redis outage, so errors about the URL get logged)
    the server is stopped and its whole DEBUG log searched for the token and the Redis password."""
    proc, redis, certs = secure["proc"], secure["redis"], secure["certs"]
    redis.stop(save=True)
    try:
        with _tls_channel(proc, certs / "ca.pem") as ch:
            with pytest.raises(grpc.RpcError) as ei:  # a node whose features are not cached: Redis is needed
                pbg.GnnServiceStub(ch).Predict(pb.PredictRequest(model="gcn", nodes=[777]),
                                               metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert REDIS_PASSWORD not in ei.value.details() and "pw-Kd83" not in ei.value.details()
    finally:
        redis.start()
    assert proc.terminate(60) == 0
    log = proc.log_path.read_text(errors="replace")
    assert "feature store" in log.lower() or "redis" in log.lower()  # the log does talk about the store
    for secret in (TOKEN, "unguessable", REDIS_PASSWORD, REDIS_PASSWORD.replace("!", "%21"), "Kd83"):
        assert secret not in log, f"{secret!r} appears in the server log"


def test_refused_calls_are_counted_and_logged_rate_limited(tiny_repo, caplog):
    """Calls refused for a missing or wrong token are counted in gnnserve_requests_total (code UNAUTHENTICATED,
    model "" whatever model they name, their method; streams too) and logged: one WARNING line at most per
    interval, with the number of calls refused since the last one and the latest one's peer, never the token
    sent. They used to leave no trace in the metrics or the log (an operations report)."""
    from .serving import ServerThread, metric_samples

    sent = "wrong-Zq81-token"
    opts = {"token": "s3cret-Kd93-token", "metrics_port": 0, "poll_s": 0}
    with caplog.at_level("WARNING", logger="serve.interceptors"), ServerThread(tiny_repo, opts) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        port = srv.server.metrics_port
        st = pbg.GnnServiceStub(ch)
        refused = [
            lambda: st.Predict(pb.PredictRequest(model="gcn", nodes=[1]), timeout=30),
            lambda: st.Predict(pb.PredictRequest(model="made-up-name", nodes=[1]),
                               metadata=(("authorization", f"Bearer {sent}"),), timeout=30),
            lambda: st.ListModels(pb.ListModelsRequest(), metadata=(("authorization", sent),), timeout=30),
            lambda: next(health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""),
                                                              timeout=30)),
        ]
        for call in refused:
            with pytest.raises(grpc.RpcError) as ei:
                call()
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        md = (("authorization", "Bearer s3cret-Kd93-token"),)
        st.Predict(pb.PredictRequest(model="gcn", nodes=[1]), metadata=md, timeout=30)  # counted OK, as before
        samples = metric_samples(port, "gnnserve_requests_total")
        unauth = {(lab["model"], lab["method"]): v for lab, v in samples if lab["code"] == "UNAUTHENTICATED"}
        assert unauth == {("", "Predict"): 2.0, ("", "ListModels"): 1.0, ("", "Watch"): 1.0}, unauth
        assert any(lab["code"] == "OK" and lab["model"] == "gcn" for lab, _ in samples)
        lines = [r.getMessage() for r in caplog.records if "bearer token" in r.getMessage()]
        assert len(lines) == 1, lines  # the first refusal is said at once, the next three wait for the interval
        assert "refused 1 call" in lines[0] and "127.0.0.1" in lines[0] and "Predict" in lines[0], lines[0]
        srv.server.auth._next_line = 0.0  # the interval is over: the next refusal says how many came since
        with pytest.raises(grpc.RpcError):
            st.ListModels(pb.ListModelsRequest(), timeout=30)
        lines = [r.getMessage() for r in caplog.records if "bearer token" in r.getMessage()]
        assert len(lines) == 2 and "refused 4 call" in lines[1] and "ListModels" in lines[1], lines
        assert all(sent not in r.getMessage() and "s3cret" not in r.getMessage() for r in caplog.records)
