"""The commands the Docker files run, run outside Docker (issue 9).

* ``docker/prepare.sh`` (the compose ``prepare`` job) with the environment compose gives it:
  trains a small model, loads features and the graph into a real Redis; run twice (the second
  run takes the existing checkpoint and reloads idempotently).
* The replica command of ``docker/compose.yaml`` (``serve ... --graph URL --features URL
  --hot-bytes N --log-json``), parsed from the compose file itself, on a repository that holds
  only the checkpoint (no dataset, no PPR files: a stateless replica).
* The image's ``HEALTHCHECK`` command (``python -m serve.healthcheck --address ...``) against that
  server (exit 0, ``SERVING``) and against a closed port (exit 1).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg

from .serving import REPO_ROOT, ServerProcess, free_port

pytest_plugins = ("tests.redis_server",)

DOCKER = REPO_ROOT / "docker"
DATASET = "synthetic:400:5"


def env_for(redis_url: str, repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "REPO": str(repo), "DATASET": DATASET, "MODEL_NAME": "demo", "MODEL_KIND": "shadow-sage",
        "REDIS_URL": redis_url, "GNNSERVE": f"{sys.executable} -m serve.cli",
        "TRAIN_ARGS": "--epochs 8 --hidden 16 --ppr-k 16 --knob-widths 0,4 --knob-budgets 8,16",
        "PYTHONPATH": str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    return env


def compose_replica_args(redis_url: str) -> list[str]:
    """The ``command`` of the compose replicas, with the compose variables substituted."""
    text = (DOCKER / "compose.yaml").read_text()
    block = re.search(r"gnnserve-1: &replica.*?command: \[(.*?)\]", text, re.S)
    assert block, "compose.yaml has no gnnserve-1 command"
    args = re.findall(r'"([^"]*)"', block.group(1))
    out = []
    for a in args:
        a = a.replace("redis://:${REDIS_PASSWORD:-change-me}@redis:6379/0", redis_url)
        out.append(a)
    assert "${" not in " ".join(out), out
    return out


@pytest.fixture(scope="module")
def prepared(redis_server, tmp_path_factory):
    repo = tmp_path_factory.mktemp("deploy") / "models"
    repo.mkdir()
    env = env_for(redis_server.url, repo)
    r = subprocess.run(["sh", str(DOCKER / "prepare.sh")], env=env, capture_output=True, text=True, timeout=900,
                       cwd=REPO_ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "training shadow-sage" in r.stdout and "prepare: done" in r.stdout
    return repo, env, r.stdout


def test_prepare_job_trains_loads_and_is_rerunnable(prepared):
    repo, env, _ = prepared
    assert (repo / "demo" / "1" / "config.json").exists()
    r = subprocess.run(["sh", str(DOCKER / "prepare.sh")], env=env, capture_output=True, text=True, timeout=900,
                       cwd=REPO_ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "using the existing checkpoint" in r.stdout and "live" in r.stdout
    bad = dict(env)
    del bad["REDIS_URL"]
    r = subprocess.run(["sh", str(DOCKER / "prepare.sh")], env=bad, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "REDIS_URL" in r.stderr


def test_compose_replica_command_and_image_healthcheck(prepared, redis_server, tmp_path):
    repo, _, _ = prepared
    stateless = tmp_path / "models"  # only the checkpoint: what a replica without the prepare volume's data sees
    stateless.mkdir()
    shutil.copytree(repo / "demo", stateless / "demo")
    args = compose_replica_args(redis_server.url)
    assert args[:3] == ["serve", "--repo", "/models"] and "--graph" in args
    # ServerProcess adds serve --repo/--port; keep the rest, loopback instead of 0.0.0.0, a free metrics port
    rest = args[args.index("--port") + 2:]
    rest[rest.index("--metrics-port") + 1] = str(free_port())
    healthcheck = re.search(r'HEALTHCHECK .*?CMD \[(.*?)\]', (DOCKER / "Dockerfile").read_text(), re.S)
    assert healthcheck
    hc = re.findall(r'"([^"]*)"', healthcheck.group(1))
    assert hc[:3] == ["python", "-m", "serve.healthcheck"]
    env = {"PYTHONPATH": str(REPO_ROOT)}
    srv = ServerProcess(stateless, "--host", "127.0.0.1", *rest)
    try:
        srv.start(timeout=600)  # a loaded shared CI box needs minutes to import torch and warm up
        cmd = [sys.executable, *hc[1:]]
        cmd[cmd.index("--address") + 1] = srv.address
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, **env))
        assert r.returncode == 0 and r.stdout.strip() == "SERVING", r.stdout + r.stderr
        with grpc.insecure_channel(srv.address) as ch:
            resp = pbg.GnnServiceStub(ch).Predict(pb.PredictRequest(model="demo", nodes=[0, 5, 399]), timeout=60)
        assert len(resp.labels) == 3
        assert '"level"' in srv.log()  # --log-json
    finally:
        srv.kill()
    cmd[cmd.index("--address") + 1] = f"127.0.0.1:{free_port()}"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, **env))
    assert r.returncode == 1 and r.stdout.startswith("UNREACHABLE")
