"""`gnnserve serve --ready-file` is written once a model is served (serve/server.py serve_forever).

A server whose models all fail to load keeps running, NOT_SERVING, and polls its repository: the
ready file must not appear then (it did: a deployment waiting on it went ahead with a server that
served nothing), and it must appear once a later scan brings a model that loads. A real
`gnnserve serve` process on loopback; the waits are bounded and assert nothing about time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc

from .serving import REPO_ROOT, free_port


def _wait(what: str, check: Any, proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> Any:
    t_end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert proc.poll() is None, f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}"
        assert time.monotonic() < t_end, f"{what}: not after {timeout} s:\n{log.read_text(errors='replace')[-4000:]}"
        time.sleep(0.05)


def _health(address: str) -> int | None:
    try:
        with grpc.insecure_channel(address) as ch:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
    except grpc.RpcError:
        return None  # not listening yet


def _broken_version(repo: Path, version: int) -> None:
    d = repo / "m" / str(version)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{ not json")


def test_ready_file_waits_for_a_served_model(tiny_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "_data", repo / "_data")
    _broken_version(repo, 1)
    ready, log = tmp_path / "ready", tmp_path / "server.log"
    port = free_port()
    address = f"127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serve.cli", "serve", "--repo", str(repo), "--port", str(port),
                                 "--poll-s", "0.1", "--ready-file", str(ready)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        text = lambda: log.read_text(errors="replace")  # noqa: E731
        # started: the first scan loaded nothing, and the server says so
        _wait("the failed first load", lambda: "no model could be loaded" in text(), proc, log)
        assert _health(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        # a later scan (after start-up, when the ready file used to be written) refuses another version
        _broken_version(repo, 2)
        _wait("the refusal of v2 by a later scan", lambda: "model m v2" in text() and "refused" in text(), proc, log)
        assert not ready.exists(), "the ready file was written while no model was served"
        assert _health(address) == health_pb2.HealthCheckResponse.NOT_SERVING

        # a version that loads: the next scan serves it, and only then is the ready file written
        staging = repo / "m" / ".3.copy"
        shutil.copytree(tiny_repo / "gcn" / "1", staging)
        staging.rename(repo / "m" / "3")
        _wait("the ready file", lambda: ready.exists() and ready.read_text().strip(), proc, log)
        assert int(ready.read_text()) == port
        assert _health(address) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(address) as ch:
            resp = pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(model="m", nodes=[1, 2]), timeout=60)
        assert resp.version == "3" and len(resp.labels) == 2
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
