"""The commands the Docker files run, run outside Docker (issue 9).

* ``docker/prepare.sh`` (the compose ``prepare`` job) with the environment compose gives it:
  trains a small model, loads features and the graph into a real Redis; run twice (the second
  run takes the existing checkpoint and reloads idempotently).
* The replica command of ``docker/compose.yaml`` (``serve ... --graph URL --features URL
  --hot-bytes N --log-json``), parsed from the compose file itself, on a repository that holds
  only the checkpoint (no dataset, no PPR files: a stateless replica).
* The image's ``HEALTHCHECK`` command (``python -m serve.healthcheck --address ...``) against that
  server (exit 0, ``SERVING``) and against a closed port (exit 1).

Secure defaults (issue 23): Redis is started by ``docker/redis-entrypoint.sh`` with the ``command``
of compose's ``redis`` service and its password from a secret file (never in a process's
arguments); the prepare job and the replica run through ``docker/launch.py`` (``gnnserve-launch``,
the images' ENTRYPOINT), which adds that password to password-less Redis URLs inside the process;
the replica binds 0.0.0.0 (port 0, talked to over 127.0.0.1) and requires the bearer token from its
secret file; the images' default command refuses to start without that file; the deploy files hold
no password, publish Envoy's admin port on loopback only and never say ``--insecure``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg

from .serving import REPO_ROOT, free_port

pytest_plugins = ("tests.redis_server",)

DOCKER = REPO_ROOT / "docker"
DATASET = "synthetic:400:5"
REDIS_PASSWORD = 'rp-9Qz "deploy\\secret" x'  # a space, quotes and a backslash: the config escaping is exercised
TOKEN = "deploy-token-4Kd8s"
COMPOSE_REDIS_URL = "redis://redis:6379/0"
TOKEN_SECRET = "/run/secrets/gnnserve_token"


def _without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _service_list(service: str, key: str) -> list[str]:
    """The strings of a ``key: [...]`` list (``command``, ``entrypoint``) of a compose service."""
    text = _without_comments((DOCKER / "compose.yaml").read_text())
    block = re.search(rf"^  {re.escape(service)}:.*?^    {key}: \[(.*?)\]", text, re.S | re.M)
    assert block, f"compose.yaml has no {service} {key}"
    return re.findall(r'"([^"]*)"', block.group(1))


def _dockerfile_list(name: str, instruction: str) -> list[str]:
    text = (DOCKER / name).read_text().replace("\\\n", " ")
    found = re.search(rf"^{instruction} \[(.*?)\]$", text, re.M)
    assert found, f"{name} has no {instruction}"
    return re.findall(r'"([^"]*)"', found.group(1))


def env_for(redis_url: str, repo: Path, password_file: Path) -> dict[str, str]:
    """What compose gives the prepare job: a password-less REDIS_URL, the password's secret file and
    GNNSERVE=gnnserve-launch (here docker/launch.py run by this Python)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GNNSERVE_TOKEN", "GNNSERVE_TOKEN_FILE")}
    env.update({
        "REPO": str(repo), "DATASET": DATASET, "MODEL_NAME": "demo", "MODEL_KIND": "shadow-sage",
        "REDIS_URL": redis_url, "REDIS_PASSWORD_FILE": str(password_file),
        "GNNSERVE": f"{sys.executable} {DOCKER / 'launch.py'}",
        "TRAIN_ARGS": "--epochs 8 --hidden 16 --ppr-k 16 --knob-widths 0,4 --knob-budgets 8,16",
        "PYTHONPATH": str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    return env


def compose_replica_args(redis_url: str, token_file: Path) -> list[str]:
    """The ``command`` of the compose replicas, with the Redis host and the token secret's path replaced."""
    args = _service_list("gnnserve-1", "command")
    assert args.count(COMPOSE_REDIS_URL) == 2 and args[args.index("--token-file") + 1] == TOKEN_SECRET, args
    out = [redis_url if a == COMPOSE_REDIS_URL else str(token_file) if a == TOKEN_SECRET else a for a in args]
    assert "${" not in " ".join(out), out
    return out


class SecretRedis:
    """``docker/redis-entrypoint.sh`` running a real ``redis-server`` with compose's redis ``command``."""

    def __init__(self, tmp: Path) -> None:
        from .redis_server import find_redis_server, free_port

        binary = find_redis_server()
        if binary is None:
            pytest.skip("needs a redis-server binary")
        self.binary, self.tmp, self.port = binary, tmp, free_port()
        self.password_file = tmp / "redis_password"
        self.password_file.write_text(REDIS_PASSWORD + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:  # no password: gnnserve-launch adds it
        return f"redis://127.0.0.1:{self.port}/0"

    def run(self, password_file: Path, wait: bool = True) -> subprocess.Popen[bytes]:
        args = [*_service_list("redis", "command"), "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.tmp), "--save", ""]
        env = dict(os.environ, REDIS_PASSWORD_FILE=str(password_file), REDIS_SERVER=self.binary)
        proc = subprocess.Popen(["sh", str(DOCKER / "redis-entrypoint.sh"), *args], env=env, cwd=self.tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if wait:
            import redis

            client = redis.Redis(host="127.0.0.1", port=self.port, password=REDIS_PASSWORD, socket_timeout=2)
            for _ in range(200):
                try:
                    if client.ping():
                        break
                except redis.ConnectionError:
                    assert proc.poll() is None, proc.communicate()
                    time.sleep(0.05)
            self.proc = proc
        return proc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def secret_redis(tmp_path_factory):
    srv = SecretRedis(tmp_path_factory.mktemp("secret-redis"))
    srv.run(srv.password_file)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def prepared(secret_redis, tmp_path_factory):
    repo = tmp_path_factory.mktemp("deploy") / "models"
    repo.mkdir()
    env = env_for(secret_redis.url, repo, secret_redis.password_file)
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


def _launch(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``gnnserve-launch ARGS`` (the images' ENTRYPOINT) as the image runs it."""
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, str(DOCKER / "launch.py"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)


def test_compose_replica_command_and_image_healthcheck(prepared, secret_redis, tmp_path):
    repo, prep_env, _ = prepared
    stateless = tmp_path / "models"  # only the checkpoint: what a replica without the prepare volume's data sees
    stateless.mkdir()
    shutil.copytree(repo / "demo", stateless / "demo")
    token_file = tmp_path / "gnnserve_token"
    token_file.write_text(TOKEN + "\n")
    args = compose_replica_args(secret_redis.url, token_file)
    assert args[:3] == ["serve", "--repo", "/models"] and "--graph" in args
    assert args[args.index("--host") + 1] == "0.0.0.0" and "--insecure" not in args
    # the compose command as it is (0.0.0.0, the token file, the password-less Redis URLs), but the
    # temporary repository, and port 0 for gRPC and metrics (bound on all interfaces: any free port)
    args[args.index("--repo") + 1] = str(stateless)
    args[args.index("--port") + 1] = "0"
    args[args.index("--metrics-port") + 1] = "0"
    ready = tmp_path / "ready"
    healthcheck = re.search(r'HEALTHCHECK .*?CMD \[(.*?)\]', (DOCKER / "Dockerfile").read_text(), re.S)
    assert healthcheck
    hc = re.findall(r'"([^"]*)"', healthcheck.group(1))
    assert hc[:3] == ["python", "-m", "serve.healthcheck"]
    env = {"PYTHONPATH": str(REPO_ROOT)}
    proc = _launch([*args, "--ready-file", str(ready)], prep_env, tmp_path / "replica.log")
    try:
        deadline = time.monotonic() + 600  # a loaded shared CI box needs minutes to import torch and warm up
        while not (ready.exists() and ready.read_text().strip()):
            assert proc.poll() is None, (tmp_path / "replica.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "replica not ready"
            time.sleep(0.1)
        address = f"127.0.0.1:{int(ready.read_text())}"
        # the Redis password reached the replica through the secret file only
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert REDIS_PASSWORD.encode() not in cmdline and b"rp-9Qz" not in cmdline
        assert b"redis://127.0.0.1" in cmdline
        cmd = [sys.executable, *hc[1:]]
        cmd[cmd.index("--address") + 1] = address
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, **env))
        assert r.returncode == 0 and r.stdout.strip() == "SERVING", r.stdout + r.stderr
        with grpc.insecure_channel(address) as ch:
            stub = pbg.GnnServiceStub(ch)
            with pytest.raises(grpc.RpcError) as ei:  # the replica requires the token from its secret file
                stub.Predict(pb.PredictRequest(model="demo", nodes=[0, 5, 399]), timeout=60)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
            resp = stub.Predict(pb.PredictRequest(model="demo", nodes=[0, 5, 399]), timeout=60,
                                metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert len(resp.labels) == 3
        log = (tmp_path / "replica.log").read_text(errors="replace")
        assert '"level"' in log  # --log-json
        assert "rp-9Qz" not in log and TOKEN not in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    cmd[cmd.index("--address") + 1] = f"127.0.0.1:{free_port()}"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, **env))
    assert r.returncode == 1 and r.stdout.startswith("UNREACHABLE")


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_image_default_command_fails_closed_without_the_token_secret(dockerfile, tmp_path):
    """The images' ENTRYPOINT + CMD, run as they are (but for an empty repository), on a machine
    without /run/secrets/gnnserve_token: exit 2 and the message, before anything binds."""
    if Path(TOKEN_SECRET).exists():
        pytest.skip(f"{TOKEN_SECRET} exists on this machine")
    assert _dockerfile_list(dockerfile, "ENTRYPOINT") == ["gnnserve-launch"]
    assert "COPY docker/launch.py /usr/local/bin/gnnserve-launch" in (DOCKER / dockerfile).read_text()
    cmd = _dockerfile_list(dockerfile, "CMD")
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--token-file") + 1] == TOKEN_SECRET
    assert "--insecure" not in cmd
    cmd[cmd.index("--repo") + 1] = str(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    for var in ("GNNSERVE_TOKEN", "GNNSERVE_TOKEN_FILE", "REDIS_PASSWORD_FILE"):
        env.pop(var, None)
    r = subprocess.run([sys.executable, str(DOCKER / "launch.py"), *cmd], capture_output=True, text=True,
                       timeout=300, env=env, cwd=REPO_ROOT)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"gnnserve serve: cannot read --token-file '{TOKEN_SECRET}'" in r.stderr


def test_deploy_files_hold_no_secret_and_publish_admin_on_loopback():
    compose = _without_comments((DOCKER / "compose.yaml").read_text())
    for name in ("compose.yaml", "Dockerfile", "Dockerfile.cuda", "envoy.yaml", "prepare.sh"):
        text = _without_comments((DOCKER / name).read_text())
        assert "change-me" not in text and "--insecure" not in text, name
        assert "--requirepass" not in text and "REDIS_PASSWORD:-" not in text, name
        assert not re.search(r"redis(\+cluster)?s?://[^/\s\"']*@", text), f"{name}: a Redis URL with credentials"
    assert "${REDIS_PASSWORD" not in compose
    # the password reaches Redis as configuration on stdin, and gnnserve through its secret file
    assert _service_list("redis", "entrypoint")[-1] == "/usr/local/bin/gnnserve-redis-entrypoint"
    assert "./redis-entrypoint.sh:/usr/local/bin/gnnserve-redis-entrypoint:ro" in compose
    assert "REDIS_PASSWORD_FILE: /run/secrets/redis_password" in compose and "GNNSERVE: gnnserve-launch" in compose
    assert re.search(r"^  redis_password:\n    file: ", compose, re.M)
    assert re.search(r"^  gnnserve_token:\n    file: ", compose, re.M)
    assert "REDISCLI_AUTH=" in compose and "redis-cli -a" not in compose
    # replicas: the token from the secret, which they mount
    replica = _service_list("gnnserve-1", "command")
    assert replica[replica.index("--token-file") + 1] == TOKEN_SECRET
    block = re.search(r"^  gnnserve-1: &replica\n(.*?)^  gnnserve-2:", compose, re.S | re.M)
    assert block and re.search(r"secrets:\n(\s+- \w+\n)*\s+- gnnserve_token\n", block.group(1))
    # Envoy's admin port (stats, /quitquitquit) is published on the host's loopback only
    ports = re.findall(r'^\s+- "([^"]+)"$', compose.split("  envoy:", 1)[1].split("depends_on", 1)[0], re.M)
    assert "8500:8500" in ports
    admin = [p for p in ports if p.endswith(":9901")]
    assert admin == ["127.0.0.1:9901:9901"], ports


def test_redis_entrypoint_keeps_the_password_off_the_command_line(secret_redis, tmp_path):
    import redis

    proc = secret_redis.proc
    assert proc is not None and proc.poll() is None
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()  # exec'd: the shell became redis-server
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
    for blob in (cmdline, environ):
        assert REDIS_PASSWORD.encode() not in blob and b"rp-9Qz" not in blob
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=secret_redis.port, socket_timeout=2).get("x")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=secret_redis.port, password="change-me", socket_timeout=2).ping()
    assert redis.Redis(host="127.0.0.1", port=secret_redis.port, password=REDIS_PASSWORD, socket_timeout=2).ping()
    # no secret, a blank one: refuses to start
    (tmp_path / "blank").write_text(" \n")
    for secret, message in ((tmp_path / "missing", "cannot read the Redis password file"),
                            (tmp_path / "blank", "is empty or blank")):
        p = secret_redis.run(secret, wait=False)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and message in err.decode(), (out, err)
