"""benchmarks/live_ppr_bulk.py and benchmarks/replica_updates.py run end to end at a small size (docs/BENCHMARKS.md,
"2026-11-28, 00:15-01:00 UTC")."""

from __future__ import annotations

import json
import subprocess
import sys

from kernels.ppr import PPRConfig, PPRIndex

from .conftest import REPO

pytest_plugins = ("tests.redis_server",)


def _shadow_index(tiny_repo, tiny_dataset):
    conf = json.loads((tiny_repo / "shadow" / "1" / "config.json").read_text())
    return PPRIndex.open_or_build(tiny_repo / "_ppr", tiny_dataset.graph, PPRConfig.from_dict(conf["ppr"]))


def test_live_ppr_bulk_benchmark_small(tiny_repo, tiny_dataset):
    idx = _shadow_index(tiny_repo, tiny_dataset)
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "live_ppr_bulk.py"), "--dataset-dir",
         str(tiny_repo / "_data" / tiny_dataset.fingerprint()), "--ppr-dir", str(idx.path), "--sizes", "5,40",
         "--threads", "1,2", "--rounds", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("this tree")]
    assert len(lines) == 2 and "(1 numba threads)" in lines[0] and "(2 numba threads)" in lines[1]
    # the same edits on 1 and 2 threads recompute the same lists
    assert [ln.split("): ", 1)[1].split("prepare")[0] for ln in lines] == ["5 edges: "] * 2
    counts = [[part.split(" lists recomputed")[0].rsplit(", ", 1)[1] for part in ln.split("; ")] for ln in lines]
    assert counts[0] == counts[1] and int(counts[0][1]) > 0, lines


def test_replica_updates_benchmark_small(tiny_repo, tiny_dataset, redis_server):
    _shadow_index(tiny_repo, tiny_dataset)
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "replica_updates.py"), "--repo", str(tiny_repo), "--model",
         "shadow", "--dataset", str(tiny_repo / "_data" / tiny_dataset.fingerprint()), "--targets", "20",
         "--redis-server", redis_server.binary, "--new-nodes", "6", "--new-per-request", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "| first after a single-edge update (each list pushed again) | p50" in proc.stdout
    assert "| one batch of them after a second update / again |" in proc.stdout
    assert "| 6 Predicts of 3 new nodes (5 neighbours each): replica | p50" in proc.stdout
    # a replica's answers for new nodes are the in-memory server's
    worst = float(proc.stdout.split("largest probability difference | ")[1].split("; ")[1].split(" |")[0])
    assert worst <= 1e-6, proc.stdout


def test_replica_push_benchmark_small(tiny_repo, tiny_dataset, redis_server):
    """benchmarks/replica_push.py, with this tree as its own base (the child process path): every push and every
    lookup after an edit it times is checked equal to the in-memory one inside the script, so a zero exit means
    equal lists."""
    _shadow_index(tiny_repo, tiny_dataset)
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "replica_push.py"), "--repo", str(tiny_repo), "--model", "shadow",
         "--dataset", str(tiny_repo / "_data" / tiny_dataset.fingerprint()), "--new-nodes", "5", "--batches", "1,8",
         "--rounds", "2", "--new-batch", "4", "--edits", "3", "--edit-targets", "20", "--redis-server", redis_server.binary,
         "--base-tree", str(REPO)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(("| base", "| this tree"))]
    assert len(rows) == 12, proc.stdout
    assert sum("| 4 new nodes of one request, in lockstep (2 requests, fresh row cache) |" in r for r in rows) == 2
    assert sum("| the same lists after each of 3 single-edge updates (lists kept without a push: p50" in r
               for r in rows) == 2
    assert sum("| new node (5 calls) |" in r for r in rows) == 2
    assert sum("| 8 existing targets (2 batches) |" in r for r in rows) == 2
