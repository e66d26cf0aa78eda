"""Test harness: real trained models in a temporary repository and a real server on loopback.

* :func:`make_repo` trains small models on a dataset into ``REPO/<name>/1`` and stores the dataset
  under ``REPO/_data/<fingerprint>`` (where the server looks for it).
* :class:`ServerThread` runs :class:`serve.server.GnnServer` in a background thread with its own
  event loop (for synchronous clients in tests).
* :class:`ServerProcess` runs ``gnnserve serve`` in a subprocess (signals, and clients such as
  tritonclient whose protobuf types must not share a process with the server's).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

# Small, fast settings: enough to beat chance clearly on the synthetic graph.
TINY_TRAIN = {"hidden": 32, "epochs": 60, "patience": 30, "seed": 0, "knob_widths": [0, 2, 4, 8],
              "knob_budgets": [8, 16, 32], "ppr_k": 32}
# shaDow test models get 2 layers (shaDow-SAGE's default is 1): every served path then stacks layers
TINY_SHADOW = {"layers": 2}


def skip_without_cuda() -> None:
    """Skip the calling test without a CUDA device."""
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def skip_without_cuda_kernel() -> None:
    """Skip the calling test without a CUDA device, or where the ES-SpMM kernel (CuPy) cannot run."""
    import pytest

    from kernels import spmm_cuda

    skip_without_cuda()
    if not spmm_cuda.available():
        pytest.skip("CuPy / the ES-SpMM kernel is not usable here")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def no_traceback(err: str) -> None:
    """A command's stderr holds a message for a user, not a traceback or a raw exception."""
    assert "Traceback" not in err and "Error:" not in err.replace("error:", ""), err


def metric_samples(port: int, name: str) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` of every sample ``name`` the Prometheus endpoint on ``port`` exposes now."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name]


def wait_for_metric(port: int, name: str, value: float, timeout: float = 60) -> None:
    """Poll the Prometheus endpoint on ``port`` until the unlabelled sample ``name`` equals ``value``."""
    seen = None
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        seen = [v for _, v in metric_samples(port, name)]
        if seen == [value]:
            return
        time.sleep(0.02)
    raise AssertionError(f"{name} is {seen}, not {value}, after {timeout} s")


def deferred_while_held(batcher: Any, client: Any, send: Any, models: set[str]) -> tuple[threading.Thread, dict]:
    """With a lock held by the caller (an update's, a resident model's): ``send()``, a Predict from another
    client, in a thread. Waits until ``batcher`` deferred that inline batch to its worker, checks that the event
    loop still answers a health check and a model listing naming ``models`` through ``client``, and that the
    request still waits. Returns the thread and the dict its answer lands in (key ``"r"``) once the caller
    releases the lock and joins the thread."""
    deferred, out = batcher.batches_deferred, {}
    th = threading.Thread(target=lambda: out.setdefault("r", send()))
    th.start()
    t_end = time.monotonic() + 30
    while batcher.batches_deferred == deferred:
        assert time.monotonic() < t_end, "the inline batch never tried the lock"
        time.sleep(0.005)
    assert client.health(timeout=10) == "SERVING"  # the loop answers meanwhile
    assert models <= {m.name for m in client.list_models(timeout=10)}
    assert th.is_alive() and "r" not in out  # the request waits, in the worker
    return th, out


def tiny_dataset() -> Any:
    """The 800-node synthetic graph the server tests serve (tests/conftest.py's ``tiny_dataset``)."""
    from kernels.datasets import synthetic_sbm

    return synthetic_sbm(800, num_classes=4, avg_degree=10, num_features=16, seed=3, name="tiny")


def ensure_tiny_repo(repo: Path, dataset: Any) -> Path:
    """``repo`` holding the tiny shaDow-SAGE "shadow" and GCN "gcn" models, trained there if absent
    (the benchmarks that replay the reliability and hostile-client scenarios)."""
    if not (repo / "gcn" / "1").exists():
        print(f"training the tiny models into {repo} ...", flush=True)
        make_repo(repo, dataset, {"shadow": "shadow-sage", "gcn": "gcn"})
    return repo


def make_repo(root: Path, dataset: Any, kinds: dict[str, str], **settings: Any) -> Path:
    """Train ``{model_name: kind}`` on ``dataset`` into ``root`` (a model repository)."""
    from models.train import train

    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / "_data" / dataset.fingerprint()
    if not data_dir.exists():
        dataset.save(data_dir)
    opts = dict(TINY_TRAIN, **settings)
    for name, kind in kinds.items():
        if kind.startswith("shadow"):
            opts_k = {**TINY_SHADOW, **opts}
        else:
            opts_k = {k: v for k, v in opts.items() if k not in ("ppr_k", "knob_budgets")}
        train(dataset, kind, root / name / "1", progress=False, source=str(data_dir), **opts_k)
    return root


def ServerThread(repo: Path, options: dict[str, Any] | None = None) -> Any:
    """A :class:`serve.server.BackgroundServer` on a free loopback port over ``repo``.

    ``options`` are :class:`serve.server.ServerConfig` fields; ``runtime_kw`` holds
    :class:`serve.runtime.RuntimeOptions` fields; the repository is polled every 0.5 s by default.
    """
    from serve.runtime import RuntimeOptions
    from serve.server import BackgroundServer, ServerConfig

    opts = dict(options or {})
    runtime = opts.pop("runtime", None) or RuntimeOptions(**opts.pop("runtime_kw", {}))
    cfg = ServerConfig(repo=str(repo), port=0, runtime=runtime, poll_s=opts.pop("poll_s", 0.5), **opts)
    return BackgroundServer(cfg)


_LOG_DIR = Path(tempfile.gettempdir()) / f"gnnserve-server-logs-{os.getuid()}"  # one per user: no shared dir


class ServerProcess:
    """``gnnserve serve`` in a subprocess; ``start()`` returns once models are served."""

    def __init__(self, repo: Path, *args: str, env: dict[str, str] | None = None, log_path: Path | None = None,
                 tree: Path | None = None):
        """``tree``: the source tree to run (default this one; benchmarks/ab.py runs a base commit's)."""
        self.repo = repo
        self.args = list(args)
        self.tree = tree or REPO_ROOT
        self.env = dict(os.environ, **(env or {}))
        self.env["PYTHONPATH"] = str(self.tree) + os.pathsep + self.env.get("PYTHONPATH", "")
        # default: a log (and its ready file) under the temp dir, not inside ``repo`` (benchmarks/ab.py and
        # hostile.py run this over a user's model repository, which must not collect them)
        self.log_path = log_path or _LOG_DIR / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> ServerProcess:
        ready = self.log_path.with_suffix(".port")
        ready.unlink(missing_ok=True)
        self.port = free_port()
        cmd = [sys.executable, "-m", "serve.cli", "serve", "--repo", str(self.repo), "--port", str(self.port),
               "--ready-file", str(ready), *self.args]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.tree)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready.exists() and ready.read_text().strip():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        self.kill()
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def sigterm_and_wait_draining(self, channel: Any, timeout: float = 30) -> None:
        """Send SIGTERM and return once health says NOT_SERVING.

        The server closes its admission before it reports NOT_SERVING, so from then on new calls
        are refused with UNAVAILABLE (for ``--drain-s`` at least). A starved machine can take a while
        to deliver the signal: wait for the report rather than sleep.
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        stub = health_pb2_grpc.HealthStub(channel)
        t_end = time.monotonic() + timeout
        while (stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
               == health_pb2.HealthCheckResponse.SERVING):
            assert time.monotonic() < t_end, f"still SERVING {timeout} s after SIGTERM"
            time.sleep(0.01)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if hasattr(self, "_log"):
            self._log.close()
