"""Start-up fails closed (issue 23): a REAL ``gnnserve serve`` refuses, with exit code 2 and a
message, every configuration that would leave it open or half-protected; ``--insecure`` is the
only way to serve a non-loopback address unauthenticated, and it says so in the log.

Servers that do start bind 0.0.0.0 only with port 0 and are only talked to over 127.0.0.1.
The health-check tool presents a client certificate to a server started with ``--tls-client-ca``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg

from .serving import REPO_ROOT, ServerProcess, ServerThread
from .test_security import make_certs

TOKEN = "fc-Tq81-token-from-a-secret-file"
REFUSE_TIMEOUT_S = 90  # a refused start exits in seconds; one that starts serving would run forever


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GNNSERVE_TOKEN", "GNNSERVE_TOKEN_FILE")}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI to make certificates")
    d = tmp_path_factory.mktemp("failclosed")
    certs = make_certs(d / "certs")
    (d / "empty-token").write_text("")
    (d / "blank-token").write_text("  \n\t \n")
    (d / "token").write_text(TOKEN + "\n")
    (d / "not-pem").write_text("this is not a certificate\n")
    (d / "repo").mkdir()
    return d, certs


def _refused(args: list[str], env: dict[str, str], repo: Path) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "serve.cli", "serve", "--repo", str(repo), "--port", "0", "--poll-s", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
    try:
        out, err = proc.communicate(timeout=REFUSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"gnnserve serve {' '.join(args)} started instead of refusing:\n{(out + err)[-3000:]}")
    return proc.returncode, out + err


# (id, args, extra environment, what the message says); paths are relative to the fixture's folder
REFUSED = [
    ("empty-token-file", ["--token-file", "{d}/empty-token"], {}, "--token-file '{d}/empty-token' is empty or blank"),
    ("blank-token-file", ["--token-file", "{d}/blank-token"], {}, "--token-file '{d}/blank-token' is empty or blank"),
    ("unreadable-token-file", ["--token-file", "{d}/missing"], {}, "cannot read --token-file '{d}/missing'"),
    ("blank-env-token", [], {"GNNSERVE_TOKEN": "  "}, "$GNNSERVE_TOKEN is empty or blank"),
    ("empty-env-token", [], {"GNNSERVE_TOKEN": ""}, "$GNNSERVE_TOKEN is empty or blank"),
    ("blank-env-token-file", [], {"GNNSERVE_TOKEN_FILE": "{d}/blank-token"},
     "$GNNSERVE_TOKEN_FILE '{d}/blank-token' is empty or blank"),
    ("client-ca-without-cert", ["--tls-client-ca", "{c}/ca.pem"], {},
     "--tls-client-ca needs --tls-cert and --tls-key"),
    ("client-ca-with-cert-only", ["--tls-client-ca", "{c}/ca.pem", "--tls-cert", "{c}/server.pem"], {},
     "--tls-client-ca needs --tls-cert and --tls-key"),
    ("cert-without-key", ["--tls-cert", "{c}/server.pem"], {}, "TLS needs both --tls-cert and --tls-key"),
    ("unreadable-key", ["--tls-cert", "{c}/server.pem", "--tls-key", "{c}/missing.key"], {},
     "cannot read --tls-key '{c}/missing.key'"),
    ("non-pem-client-ca", ["--tls-cert", "{c}/server.pem", "--tls-key", "{c}/server.key", "--tls-client-ca",
                           "{d}/not-pem"], {}, "--tls-client-ca '{d}/not-pem' is not a PEM file"),
    ("all-interfaces-no-auth", ["--host", "0.0.0.0"], {}, "refusing to serve on '0.0.0.0' (not a loopback address)"),
    ("ipv6-any-no-auth", ["--host", "::"], {}, "refusing to serve on '::' (not a loopback address)"),
    # TLS without client certificates encrypts but authenticates nobody
    ("all-interfaces-tls-only", ["--host", "0.0.0.0", "--tls-cert", "{c}/server.pem", "--tls-key",
                                 "{c}/server.key"], {}, "refusing to serve on '0.0.0.0'"),
]


@pytest.mark.parametrize("args, env, message", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_serve_refuses_to_start(files, args, env, message):
    d, certs = files

    def fill(s: str) -> str:
        return s.format(d=d, c=certs)

    rc, output = _refused([fill(a) for a in args], _clean_env(**{k: fill(v) for k, v in env.items()}), d / "repo")
    assert rc == 2, output[-3000:]
    assert f"gnnserve serve: {fill(message)}" in output, output[-3000:]
    assert "Traceback" not in output
    if "--host" in args and "--insecure" not in args:
        assert "--insecure" in output  # the message names the way out


@pytest.fixture(scope="module")
def gcn_repo(tiny_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("failclosed-repo")
    for part in ("gcn/1", "_data"):
        shutil.copytree(tiny_repo / part, repo / part)
    return repo


def _bound_port(srv: ServerProcess) -> int:
    """The port a ``--port 0`` server bound (from its ready file)."""
    return int(srv.log_path.with_suffix(".port").read_text())


def _start_on_all_interfaces(repo: Path, *args: str, env: dict[str, str], tmp: Path) -> ServerProcess:
    # ServerProcess passes --port <free loopback port> first; the later "--port 0" wins
    srv = ServerProcess(repo, "--host", "0.0.0.0", "--port", "0", "--poll-s", "0", *args, log_path=tmp / "server.log")
    srv.env = _clean_env(**env)
    srv.start(timeout=600)
    srv.port = _bound_port(srv)
    assert srv.address.startswith("127.0.0.1:")
    return srv


def test_insecure_serves_all_interfaces_with_a_warning(gcn_repo, tmp_path):
    srv = _start_on_all_interfaces(gcn_repo, "--insecure", env={}, tmp=tmp_path)
    try:
        with grpc.insecure_channel(srv.address) as ch:
            models = pbg.GnnServiceStub(ch).ListModels(pb.ListModelsRequest(), timeout=60)
        assert [m.name for m in models.models] == ["gcn"]  # no token needed: --insecure
        log = srv.log_path.read_text(errors="replace")
        assert "WARNING" in log and "--insecure: serving on '0.0.0.0' without authentication" in log
        assert srv.terminate(60) == 0
    finally:
        srv.kill()


def test_token_from_env_file_is_required_on_all_interfaces(gcn_repo, files, tmp_path):
    d, _ = files
    srv = _start_on_all_interfaces(gcn_repo, env={"GNNSERVE_TOKEN_FILE": str(d / "token")}, tmp=tmp_path)
    try:
        with grpc.insecure_channel(srv.address) as ch:
            stub = pbg.GnnServiceStub(ch)
            for md in ((), (("authorization", "Bearer wrong"),), (("authorization", f"Bearer {TOKEN[:-1]}"),)):
                with pytest.raises(grpc.RpcError) as ei:
                    stub.ListModels(pb.ListModelsRequest(), metadata=md, timeout=60)
                assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED, md
            ok = stub.Predict(pb.PredictRequest(model="gcn", nodes=[1, 2]),
                              metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=60)
            assert len(ok.labels) == 2
            h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
            assert h.status == health_pb2.HealthCheckResponse.SERVING  # health stays open
        assert TOKEN not in srv.log_path.read_text(errors="replace")
    finally:
        srv.kill()


def _healthcheck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serve.healthcheck", "--timeout", "20", *args], capture_output=True,
                          text=True, timeout=120, env=_clean_env(), cwd=REPO_ROOT)


def test_healthcheck_presents_a_client_certificate(gcn_repo, files, tmp_path):
    """Mutual TLS on all interfaces (client certificates are authentication: no --insecure needed);
    the health-check tool gets SERVING only with the client certificate."""
    _, c = files
    srv = _start_on_all_interfaces(gcn_repo, "--tls-cert", str(c / "server.pem"), "--tls-key", str(c / "server.key"),
                                   "--tls-client-ca", str(c / "ca.pem"), env={}, tmp=tmp_path)
    try:
        addr = srv.address
        r = _healthcheck("--address", addr, "--ca", str(c / "ca.pem"), "--cert", str(c / "client.pem"),
                         "--key", str(c / "client.key"))
        assert (r.returncode, r.stdout.strip()) == (0, "SERVING"), r.stdout + r.stderr
        r = _healthcheck("--address", f"localhost:{srv.port}", "--tls", "--ca", str(c / "ca.pem"),
                         "--cert", str(c / "client.pem"), "--key", str(c / "client.key"), "--server-name", "localhost")
        assert (r.returncode, r.stdout.strip()) == (0, "SERVING"), r.stdout + r.stderr
        for args in (["--ca", str(c / "ca.pem")],  # no client certificate: the handshake fails
                     ["--ca", str(c / "other-ca.pem"), "--cert", str(c / "client.pem"), "--key", str(c / "client.key")],
                     []):  # plaintext against the TLS port
            r = _healthcheck("--address", addr, *args)
            assert r.returncode == 1 and r.stdout.startswith("UNREACHABLE"), (args, r.stdout + r.stderr)
        r = _healthcheck("--address", addr, "--ca", str(c / "ca.pem"), "--cert", str(c / "client.pem"))
        assert r.returncode == 2 and "--cert and --key" in r.stderr
        r = _healthcheck("--address", addr, "--cert", str(c / "client.pem"), "--key", str(tmp_path / "missing.key"))
        assert r.returncode == 2 and "missing.key" in r.stderr
    finally:
        srv.kill()


# --------------------------------------------------------------------------- the embedded server
@pytest.mark.parametrize("options, message", [
    ({"host": "0.0.0.0"}, "refusing to serve on '0.0.0.0'"),
    ({"token": "  "}, "the bearer token is empty or blank"),
    ({"token": ""}, "the bearer token is empty or blank"),
    ({"tls_client_ca": "ca.pem"}, "--tls-client-ca needs --tls-cert and --tls-key"),
], ids=["all-interfaces", "blank-token", "empty-token", "client-ca-alone"])
def test_background_server_fails_closed(files, options, message):
    """:class:`serve.server.BackgroundServer` (demo, notebooks, tests) runs the same checks."""
    from serve.security import SecurityConfigError

    d, certs = files
    opts = {k: (str(certs / v) if k == "tls_client_ca" else v) for k, v in options.items()}
    srv = ServerThread(d / "repo", {**opts, "poll_s": 0})
    try:
        with pytest.raises(SecurityConfigError) as ei:
            srv.start(timeout=120)
        assert message in str(ei.value)
    finally:
        srv.stop()


def test_background_server_insecure_logs_a_warning(files, caplog):
    d, _ = files
    srv = ServerThread(d / "repo", {"host": "0.0.0.0", "insecure": True, "poll_s": 0})
    try:
        with caplog.at_level("WARNING", logger="serve.server"):
            srv.start(timeout=120)
        assert srv.port > 0
        assert any("--insecure: serving on '0.0.0.0' without authentication" in r.getMessage()
                   for r in caplog.records if r.levelname == "WARNING")
    finally:
        srv.stop()


# --------------------------------------------------------------------------- the checks themselves
@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False), ("[::]", False), ("192.168.1.10", False),
    ("10.0.0.5", False), ("", False), ("gnnserve.example", False), ("::ffff:10.0.0.1", False),
])
def test_loopback_or_refused(host, loopback):
    from serve.security import SecurityConfigError, check_security_config, is_loopback

    assert is_loopback(host) is loopback
    if loopback:
        assert check_security_config(host=host) == []
    else:
        with pytest.raises(SecurityConfigError, match="not a loopback address"):
            check_security_config(host=host)
        assert check_security_config(host=host, token="t0k") == []
        warnings = check_security_config(host=host, insecure=True)
        assert len(warnings) == 1 and warnings[0].startswith("--insecure: serving on")


def test_token_sources(files):
    from serve.security import SecurityConfigError, resolve_token

    d, _ = files
    assert resolve_token(None, {}) is None
    assert resolve_token(str(d / "token"), {"GNNSERVE_TOKEN": "other"}) == TOKEN  # the flag wins
    assert resolve_token(None, {"GNNSERVE_TOKEN_FILE": str(d / "token")}) == TOKEN
    assert resolve_token(None, {"GNNSERVE_TOKEN": f" {TOKEN} "}) == TOKEN
    for env, message in (({"GNNSERVE_TOKEN_FILE": str(d / "token"), "GNNSERVE_TOKEN": "x"}, "both"),
                         ({"GNNSERVE_TOKEN_FILE": " "}, "names no file"),
                         ({"GNNSERVE_TOKEN_FILE": str(d / "missing")}, "cannot read $GNNSERVE_TOKEN_FILE"),
                         ({"GNNSERVE_TOKEN": "tok\x00en"}, "cannot carry"),
                         ({"GNNSERVE_TOKEN": "t\u00f6ken"}, "cannot carry")):
        with pytest.raises(SecurityConfigError, match=message.replace("$", r"\$")):
            resolve_token(None, env)
