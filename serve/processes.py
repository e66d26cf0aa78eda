"""``gnnserve serve --processes N``: N server processes behind one port (issue 22 item 5).

One server process is bounded by one event loop: gRPC's receive and send, protobuf, validation and
batching run in Python on one thread, whatever the model costs. N processes share the port with
``SO_REUSEPORT`` (the kernel spreads incoming connections over the processes' listeners; one
connection stays with one process), each a complete server: its own models, caches, batcher, and
on a GPU its own CUDA context and stream. Memory is N times one process's (the start-up budget
check of :mod:`serve.memory_budget` counts N).

This module is the parent. It

* refuses a configuration in which the processes could answer from different graph states
  without saying so (:func:`refusal`): with N > 1 either the server is ``--read-only`` (every process
  replays and follows the local update log, which no process writes, so all serve its last version), or the
  graph and features are in Redis, whose update log every process follows (as replicas do; each answer
  carries its ``graph_version`` and ``min_graph_version`` gives read-your-writes across processes);
* reserves the port (binds it, with ``SO_REUSEPORT``, without listening: it never takes a
  connection, and ``--port 0`` gets a port every child can join), then starts the N children:
  ``gnnserve serve`` with the same options plus ``--port P --process-slot i/N`` (each child binds
  with ``grpc.so_reuseport`` on, and reports ``"<pid> <i>/<N>"`` in ``PredictResponse.served_by``
  and ``ModelInfo.served_by``); ``--http-port`` (the KServe HTTP/REST port, serve.http) is reserved the same
  way and passed on, and every child binds it with ``SO_REUSEPORT`` too;
* once every child serves, checks that the children with a local graph are at one graph version,
  writes ``--ready-file``, and serves ``--metrics-port``: each scrape reads every child's own
  endpoint (children bind free ports) and merges the families, each sample labelled
  ``process="<i>"``;
* on SIGTERM / SIGINT forwards SIGTERM to every child (each drains as a single server does:
  UNAVAILABLE to new RPCs, NOT_SERVING, in-flight requests finish within ``--grace-s``, listener
  held ``--drain-s``), waits for them and exits 0 when they all exited 0;
* when a child exits without being asked to (crashed, killed, failed to start), stops the others
  and exits non-zero (the child's own code, 1 if it had none).

Each child's compute threads (torch, the compiled kernels' numba pool, MKL) default to its share of
the cores, ``max(1, cores // N)`` through ``OMP_NUM_THREADS`` / ``NUMBA_NUM_THREADS`` /
``MKL_NUM_THREADS`` (unless those are set): N processes each spreading a parallel kernel over every
core oversubscribe them. On the 2-vCPU VM two processes with the default pools used 1.75x the CPU
per node of one process (122 against 70 us; docs/BENCHMARKS.md, issue 22 item 5).

Children die with the parent (``PR_SET_PDEATHSIG``), so a parent killed with SIGKILL leaves no
process behind on Linux.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["refusal", "reserve_port", "run_processes"]

log = logging.getLogger("gnnserve.processes")

def refusal(args: Any) -> str | None:
    """Why ``args`` (``gnnserve serve`` with ``--processes`` > 1) cannot run, or None."""
    n = int(args.processes)
    if _shared_log(args):
        return None  # every process follows the Redis update log (as replicas do)
    if not args.read_only:
        return (f"--processes {n} with a local graph needs --read-only: a file update log is written by one "
                "process, and the others would answer from a graph without its updates. Either serve "
                "read-only (--read-only: every process replays the log, none takes updates), or keep the "
                "features (and graph) in Redis (--features redis://... or --graph redis://...), whose update log "
                "every process follows, or run one process")
    return None  # read-only: every process follows the file log (serve.update_log.FileUpdateLog, follow=True)


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Bind ``host:port`` (0: a free port) with ``SO_REUSEPORT`` and return the socket (never listening:
    it takes no connection) and the port. The port is first bound without ``SO_REUSEPORT``, so a port
    another server already holds (with or without the option) is refused, not joined."""
    bind_host = host.strip("[]")
    family, _, _, _, addr = socket.getaddrinfo(bind_host or None, port, type=socket.SOCK_STREAM,
                                               flags=socket.AI_PASSIVE)[0]
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind(addr)  # EADDRINUSE if anyone holds the port, including another reuse-port group
        port = probe.getsockname()[1]
    finally:
        probe.close()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((addr[0], port, *addr[2:]))
    except OSError:
        sock.close()
        raise
    return sock, port


#: the prefix of the temporary directory of the children's status files (each child removes its own file when
#: it stops, and the directory once empty: serve.server._remove_status)
STATUS_DIR_PREFIX = "gnnserve-processes-"


def _die_with_parent() -> None:  # in the child, between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


#: families of the whole machine (Triton's CPU and GPU figures: every process reads the same ones), merged once
#: without a ``process`` label, so that ``sum()`` over them is not N times the machine
MACHINE_FAMILIES = ("nv_cpu_", "nv_gpu_")


class _MergedMetrics:
    """A prometheus_client collector: every child's /metrics, samples labelled ``process`` (but the machine's own
    figures, :data:`MACHINE_FAMILIES`: the first child's, unlabelled)."""

    def __init__(self, endpoints: dict[int, str]) -> None:
        self.endpoints = endpoints

    def collect(self) -> Any:
        import urllib.request

        from prometheus_client.core import Metric
        from prometheus_client.parser import text_string_to_metric_families
        from prometheus_client.samples import Sample

        merged: dict[str, Metric] = {}
        for index, url in sorted(self.endpoints.items()):
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = r.read().decode()
            except OSError as exc:
                log.warning("metrics of process %d (%s) unreadable: %s", index, url, exc)
                continue
            for fam in text_string_to_metric_families(text):
                out = merged.get(fam.name)
                machine = fam.name.startswith(MACHINE_FAMILIES)
                if out is None:
                    out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                elif machine:
                    continue  # the first child's figures of the machine are the machine's
                for s in fam.samples:
                    labels = s.labels if machine else {**s.labels, "process": str(index)}
                    out.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
        yield from merged.values()


def _child_argv(args: Any, argv: Sequence[str], port: int, index: int, tmp: Path,
                http_port: int | None = None) -> list[str]:
    # argparse keeps the last value of an option: the overrides go after the user's own options
    out = [sys.executable, "-m", "serve.cli", "serve", *argv, "--port", str(port), "--processes", "1",
           "--process-slot", f"{index}/{args.processes}", "--process-status", str(tmp / f"{index}.json"),
           "--ready-file", ""]
    if http_port is not None:  # the HTTP/REST port reserved as the gRPC one: every child joins it (SO_REUSEPORT)
        out += ["--http-port", str(http_port)]
    if args.metrics_port is not None:  # a child's endpoint is the parent's to scrape, on loopback only
        out += ["--metrics-port", "0", "--metrics-host", "127.0.0.1"]
    return out


_THREAD_VARS = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS")


def child_env(processes: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The children's environment: compute threads per process = its share of the cores (module docstring)."""
    env = dict(os.environ if environ is None else environ)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    share = str(max(1, cores // max(1, processes)))
    for var in _THREAD_VARS:
        env.setdefault(var, share)
    return env


def _shared_log(args: Any) -> bool:
    from .features import is_redis_url

    return bool(args.graph) or is_redis_url(str(args.features))


def run_processes(args: Any, argv: Sequence[str]) -> int:
    """Supervise ``args.processes`` children serving on one port (module docstring); the exit code."""
    n = int(args.processes)
    try:
        holder, port = reserve_port(args.host, args.port)
    except OSError as exc:
        log.error("cannot start: cannot bind %s:%d: %s", args.host, args.port, exc)
        return 1
    http_holder, http_port = None, None
    if getattr(args, "http_port", None) is not None:  # --http-port 0: one free port, shared by every child
        try:
            http_holder, http_port = reserve_port(args.host, args.http_port)
        except OSError as exc:
            holder.close()
            log.error("cannot start: cannot bind %s:%d (--http-port): %s", args.host, args.http_port, exc)
            return 1
    tmp = Path(tempfile.mkdtemp(prefix=STATUS_DIR_PREFIX))
    env = child_env(n)
    children: dict[int, subprocess.Popen[bytes]] = {}
    stopping = threading.Event()
    metrics_server = None
    signalled: set[int] = set()

    def stop_children() -> None:
        # once each: a second SIGTERM could reach a child after its event loop (and handler) is gone,
        # and kill it with the default action instead of letting it finish its drain
        for i, c in list(children.items()):
            if i not in signalled and c.poll() is None:
                signalled.add(i)
                with contextlib.suppress(ProcessLookupError):
                    c.send_signal(signal.SIGTERM)

    def on_signal(signum: int, _frame: Any) -> None:
        if not stopping.is_set():
            log.info("received %s: stopping %d processes", signal.Signals(signum).name, len(children))
        stopping.set()
        stop_children()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        for i in range(1, n + 1):
            if stopping.is_set():
                break
            children[i] = subprocess.Popen(_child_argv(args, argv, port, i, tmp, http_port), env=env,
                                           preexec_fn=_die_with_parent)  # no threads yet
        if http_port is not None:
            log.info("HTTP/REST of the %d processes on %s:%d", n, args.host, http_port)
        log.info("started %d processes on %s:%d (pids %s), compute threads per process: %s", n, args.host, port,
                 ", ".join(str(c.pid) for c in children.values()),
                 ", ".join(f"{v}={env[v]}" for v in _THREAD_VARS))
        status: dict[int, dict[str, Any]] = {}
        ready = False
        while True:
            if stopping.is_set():
                break
            died = {i: c.returncode for i, c in children.items() if c.poll() is not None}
            if died:
                i, rc = next(iter(died.items()))
                log.error("process %d/%d (pid %d) exited with code %s%s; stopping the others", i, n,
                          children[i].pid, rc, "" if ready else " before it was ready")
                code = rc if rc and rc > 0 else 1
                break
            if not ready:
                for i in children:
                    f = tmp / f"{i}.json"
                    if i not in status and f.exists():
                        with contextlib.suppress(ValueError, OSError):
                            status[i] = json.loads(f.read_text())
                if len(status) == n:
                    problem = _version_mismatch(status, args)
                    if problem:
                        log.error("cannot start: %s", problem)
                        code = 1
                        break
                    ready = True
                    if args.metrics_port is not None:
                        metrics_server = _serve_metrics(args, status)
                    if args.ready_file:
                        Path(args.ready_file).write_text(f"{port}\n")
                    log.info("%d processes serving on %s:%d", n, args.host, port)
            time.sleep(0.05)
    finally:
        stopping.set()
        stop_children()
        deadline = time.monotonic() + float(args.grace_s) + float(args.drain_s) + 30
        for i, c in children.items():
            try:
                rc = c.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("process %d/%d (pid %d) did not stop in time; killing it", i, n, c.pid)
                c.kill()
                rc = c.wait()
            if rc != 0 and code == 0:
                log.error("process %d/%d (pid %d) exited with code %s", i, n, c.pid, rc)
                code = rc if rc > 0 else 1
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        holder.close()
        if http_holder is not None:
            http_holder.close()
        for s, h in old.items():
            signal.signal(s, h)
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("stopped (exit code %d)", code)
    return code


def _version_mismatch(status: dict[int, dict[str, Any]], args: Any) -> str | None:
    """With local graphs, every process must have started at the same graph version per dataset."""
    if _shared_log(args):
        return None  # they follow one Redis log; each answer names its version
    versions: dict[str, dict[int, int]] = {}
    for i, st in status.items():
        for fp, v in st.get("graph_versions", {}).items():
            versions.setdefault(fp, {})[i] = int(v)
    for fp, by in versions.items():
        if len(set(by.values())) > 1:
            return (f"the processes started at different versions of graph {fp[:12]} "
                    f"({', '.join(f'process {i}: {v}' for i, v in sorted(by.items()))}); serve it with one process")
    return None


def _serve_metrics(args: Any, status: dict[int, dict[str, Any]]) -> Any:
    from prometheus_client import CollectorRegistry, start_http_server

    endpoints = {i: f"http://127.0.0.1:{st['metrics_port']}/metrics"  # the children bind loopback (_child_argv)
                 for i, st in status.items() if st.get("metrics_port")}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_MergedMetrics(endpoints))
    from .cli import _metrics_host

    server, _thread = start_http_server(int(args.metrics_port), addr=_metrics_host(args), registry=registry)
    log.info("metrics of %d processes on port %d", len(endpoints), server.server_port)
    return server
