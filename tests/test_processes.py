"""``gnnserve serve --processes N``: several server processes on one port (serve/processes.py).

Real servers on loopback: answers equal to one process's, requests spread over the processes
(``served_by``), merged metrics, the ready file, SIGTERM and a child's death; the refused
configurations, and the memory check counting N processes.
"""

from __future__ import annotations

import collections
import signal
import socket
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import grpc
import numpy as np
import pytest

from clients import GnnClient
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc

from .serving import ServerProcess, metric_samples

REPO_ROOT = Path(__file__).resolve().parent.parent


def _serve_cmd(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serve.cli", "serve", "--repo", str(repo), *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def _children(parent_pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent_pid)], capture_output=True, text=True).stdout
    return [int(v) for v in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout: float = 60) -> None:
    t_end = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        assert time.monotonic() < t_end, f"processes {[p for p in pids if _alive(p)]} still running"
        time.sleep(0.1)


def _metrics_port(log: str) -> int:
    for line in log.splitlines():
        if "metrics of" in line and "processes on port" in line:
            return int(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metrics port in the log:\n{log}")


def test_refuses_processes_without_read_only_or_a_shared_log(tiny_repo):
    res = _serve_cmd(tiny_repo, "--port", "0", "--processes", "2")
    assert res.returncode == 2, res.stderr
    assert "--processes 2 with a local graph needs --read-only" in res.stderr
    assert "Redis" in res.stderr


def test_read_only_processes_all_replay_a_local_update_log(tiny_repo, tmp_path):
    """--processes 2 --read-only over a file update log that holds updates (refused before: one process
    held the log and the others would have answered without them): every process follows the log,
    replays it and answers at its last version; the refusal is for a writable local graph only."""
    from serve.processes import refusal

    args = Namespace(processes=2, graph=None, features="memory", read_only=True, repo=str(tiny_repo),
                     update_log_dir=str(tmp_path))
    assert refusal(args) is None
    assert "needs --read-only" in refusal(Namespace(**{**vars(args), "read_only": False}))
    # features in Redis: every process follows the Redis log, no --read-only needed
    assert refusal(Namespace(**{**vars(args), "read_only": False, "features": "redis://localhost:6379/0"})) is None
    logs = ("--update-log-dir", str(tmp_path / "live"))
    with ServerProcess(tiny_repo, "--poll-s", "0", *logs) as one, GnnClient(one.address) as c:
        assert c.update_graph("gcn", features={3: np.full(c.get_model("gcn").num_features, 0.5)}).graph_version == 1
        want = c.predict("gcn", [3, 4], sampling_width=0)
    with ServerProcess(tiny_repo, "--processes", "2", "--read-only", "--poll-s", "0", *logs) as srv:
        seen = {}
        for _ in range(24):
            with grpc.insecure_channel(srv.address) as ch:
                resp = pb_grpc.GnnServiceStub(ch).Predict(
                    pb.PredictRequest(model="gcn", nodes=[3, 4], sampling_width=0, return_probabilities=True),
                    timeout=30)
            seen[resp.served_by] = resp
        assert len(seen) == 2, seen.keys()
        for resp in seen.values():
            assert resp.graph_version == 1
            assert list(resp.labels) == list(want.labels)


def test_memory_check_counts_every_process(tiny_repo):
    import re

    from kernels.ppr_push import new_node_workers
    from serve.memory_budget import estimate
    from serve.processes import child_env

    base = dict(repo=str(tiny_repo), projection_cache_bytes=2 << 30, activation_cache_bytes=256 << 20,
                induced_table_bytes=1 << 30, graph_cache_bytes=64 << 20, hot_bytes=0, graph=None, features="memory")
    one = estimate(Namespace(**base, processes=1))
    three = estimate(Namespace(**base, processes=3))
    assert all("x 3 processes" in what for what, _ in three.items)
    ones = dict(one.items)
    push_terms = 0
    for what, b in three.items:
        what = what.removesuffix(", x 3 processes")
        if what.startswith("PPR push state for new nodes"):
            # each child pushes new nodes on its share of the cores' threads (serve.processes.child_env), not on this
            # process's: its own count of workers, times 3
            workers, nodes = (int(x.replace(",", "")) for x in re.findall(r"\((\d+) worker\(s\) x ([\d,]+) nodes", what)[0])
            share = int(child_env(3)["NUMBA_NUM_THREADS"])
            assert workers == new_node_workers(nodes - 1, 1 << 30, share)
            assert b == 3 * workers * 40 * nodes
            push_terms += 1
        else:
            assert b == 3 * ones[what], what
    assert push_terms == 1  # the shaDow model's graph


def test_reserved_port_refuses_a_taken_port():
    from serve.processes import reserve_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            reserve_port("127.0.0.1", taken.getsockname()[1])
    holder, port = reserve_port("127.0.0.1", 0)
    try:
        assert port > 0
        with socket.socket() as other, pytest.raises(OSError):  # a plain bind cannot join the group
            other.bind(("127.0.0.1", port))
    finally:
        holder.close()


def test_two_processes_answer_spread_and_stop(tiny_repo):
    with ServerProcess(tiny_repo, "--processes", "2", "--read-only", "--metrics-port", "0", "--poll-s", "0",
                       "--grace-s", "5") as srv:
        kids = _children(srv.proc.pid)
        assert len(kids) == 2, srv.log()
        nodes = list(range(0, 800, 7))
        with GnnClient(srv.address) as client:
            res = client.predict("gcn", nodes)  # packed outputs (the SDK's default)
            info = client.get_model("gcn")
        # the answers of one process started alone over the same repository
        with ServerProcess(tiny_repo, "--read-only", "--poll-s", "0") as one, GnnClient(one.address) as client:
            ref = client.predict("gcn", nodes)
        np.testing.assert_array_equal(res.labels, ref.labels)
        np.testing.assert_allclose(res.probabilities, ref.probabilities, rtol=0, atol=1e-6)
        assert info.num_nodes == 800
        # each connection goes to one process; new connections spread over both
        seen = collections.Counter()
        for _ in range(24):
            with grpc.insecure_channel(srv.address) as ch:
                resp = pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(model="gcn", nodes=[1, 2]), timeout=30)
                seen[resp.served_by] += 1
        assert len(seen) == 2, seen
        assert {k.split()[1] for k in seen} == {"1/2", "2/2"}
        assert {int(k.split()[0]) for k in seen} == set(kids)
        # the parent's metrics endpoint merges both, labelled by process
        mport = _metrics_port(srv.log())
        procs = {labels.get("process") for labels, _ in metric_samples(mport, "gnnserve_requests_total")}
        assert procs == {"1", "2"}, procs
        procs = {labels.get("process") for labels, _ in metric_samples(mport, "nv_inference_count")}
        assert procs == {"1", "2"}, procs  # Triton's per-model figures by process, as gnnserve's
        # the machine's own figures once, unlabelled: sum() over them is the machine's, not twice it
        (mem,) = metric_samples(mport, "nv_cpu_memory_total_bytes")
        assert "process" not in mem[0] and mem[1] > 0
        assert srv.terminate(timeout=60) == 0, srv.log()
        _wait_gone(kids)
        assert srv.log().count("received SIGTERM") >= 2  # each child drained on its own


def test_a_dead_child_stops_the_group_with_an_error(tiny_repo):
    with ServerProcess(tiny_repo, "--processes", "2", "--read-only", "--poll-s", "0", "--grace-s", "2") as srv:
        kids = _children(srv.proc.pid)
        assert len(kids) == 2, srv.log()
        import os

        os.kill(kids[0], signal.SIGKILL)
        rc = srv.proc.wait(60)
        assert rc != 0, srv.log()
        assert "exited with code -9" in srv.log()
        _wait_gone(kids)


def test_a_killed_parent_leaves_no_status_directory(tiny_repo):
    """SIGKILL of the parent: its children get SIGTERM (PDEATHSIG), drain, and remove their status files and
    the directory the parent made for them (it used to stay in the temp directory, one per killed group)."""
    from pathlib import Path

    with ServerProcess(tiny_repo, "--processes", "2", "--read-only", "--poll-s", "0", "--grace-s", "1",
                       "--drain-s", "0") as srv:
        kids = _children(srv.proc.pid)
        assert len(kids) == 2, srv.log()
        args = Path(f"/proc/{kids[0]}/cmdline").read_bytes().split(b"\0")
        status = Path(args[args.index(b"--process-status") + 1].decode())
        assert status.parent.name.startswith("gnnserve-processes-") and status.exists()
        srv.kill()
        _wait_gone(kids)
    assert not status.parent.exists(), sorted(status.parent.iterdir())


pytest_plugins = ("tests.redis_server",)


def test_two_processes_over_redis_share_updates(redis_factory, tiny_repo, tiny_dataset, tmp_path):
    """Features in Redis: no --read-only needed; every process follows the Redis update log, so an update
    taken by either process is seen by both (at once with min_graph_version), and both answer alike."""
    from serve.features import load_features

    url = redis_factory().url
    load_features(tiny_dataset, url, progress=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("gcn", "_data"):
        (repo / name).symlink_to(tiny_repo / name)
    f = tiny_dataset.num_features
    g = tiny_dataset.graph
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    new_edges = []
    for i in range(8):  # an edge that does not exist yet from node i
        j = next(j for j in range(799, 0, -1) if j != i and j not in indices[indptr[i]:indptr[i + 1]])
        new_edges.append((i, j))
    with ServerProcess(repo, "--processes", "2", "--features", url, "--poll-s", "0", "--grace-s", "5") as srv:
        version = 0
        for i in range(8):  # each through a new connection: either process takes it
            with grpc.insecure_channel(srv.address) as ch:
                stub = pb_grpc.GnnServiceStub(ch)
                up = stub.UpdateGraph(pb.UpdateGraphRequest(
                    model="gcn", features=[pb.FeatureRow(node=i, features=[0.5 * i] * f)],
                    add_edges=[pb.Edge(src=i, dst=new_edges[i][1])]), timeout=60)
                version = up.graph_version
        assert version == 8  # one dense sequence of versions across both processes
        answers: dict[str, pb.PredictResponse] = {}
        for _ in range(24):
            with grpc.insecure_channel(srv.address) as ch:
                resp = pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(
                    model="gcn", nodes=list(range(12)), min_graph_version=version, packed_outputs=True,
                    return_probabilities=True), timeout=60)
            assert resp.graph_version == version
            answers[resp.served_by] = resp
        assert len(answers) == 2, list(answers)
        a, b = answers.values()
        assert a.packed_labels == b.packed_labels
        np.testing.assert_allclose(np.frombuffer(a.packed_probabilities, "<f4"),
                                   np.frombuffer(b.packed_probabilities, "<f4"), atol=1e-6)
        assert srv.terminate(timeout=60) == 0, srv.log()


def test_children_get_their_share_of_the_cores():
    import os

    from serve.processes import child_env

    cores = len(os.sched_getaffinity(0))
    env = child_env(2, {})
    assert env["OMP_NUM_THREADS"] == env["NUMBA_NUM_THREADS"] == env["MKL_NUM_THREADS"] == str(max(1, cores // 2))
    assert child_env(10 * cores, {})["OMP_NUM_THREADS"] == "1"
    assert child_env(2, {"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"  # the user's setting stays
