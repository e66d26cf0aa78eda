"""benchmarks/ceiling.py at a small size (issue 22 item 5): real servers (one process and
``--processes 2``) on loopback under real gRPC load, repeated and packed probabilities, and the
encode/decode microbenchmark; its table and JSON carry every variant with sane numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_ceiling_small(tiny_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "ceiling.py"), "--repo", str(tiny_repo),
                           "--model", "gcn", "--processes", "1,2t1a", "--batch", "16", "--clients", "2",
                           "--seconds", "1", "--rounds", "2", "--codec", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"1:repeated", "1:packed", "2t1a:repeated", "2t1a:packed"}
    # the default loop (uvloop where installed: a dependency) and 'a' = --event-loop asyncio, as each server logged it
    from serve.loops import resolve_event_loop

    assert data["event_loops"] == {"1": [resolve_event_loop("auto")], "2t1a": ["asyncio"]}, data["event_loops"]
    for key, rounds in data["results"].items():
        assert len(rounds) == 2, key
        for r in rounds:
            assert r["nodes_per_s"] > 0 and r["requests"] > 0, (key, r)
            assert 0 < r["p50_ms"] <= r["p99_ms"], (key, r)
            assert r["server_us_per_node"] > 0, (key, r)
            # every reply came from a server process: one label for the single process, '<pid> i/2' for two
            by = r["served_by"]
            assert sum(by.values()) == r["requests"], (key, r)
            if key.startswith("2t1a"):
                assert all(k.split()[-1] in ("1/2", "2/2") for k in by), by
    codec = data["codec"]
    assert [row["nodes"] for row in codec] == [64, 1024]
    for row in codec:
        for enc in ("repeated", "packed"):
            c = row[enc]
            assert c["bytes"] > 0 and c["decode_us"] > 0 and c["serialize_us"] > 0, (enc, c)
        # packed: little-endian int32 labels and float32 probabilities, raw, plus a few bytes of framing
        raw = 4 * row["nodes"] * (1 + row["classes"])
        assert raw <= row["packed"]["bytes"] <= raw + 64, row
    md = proc.stdout
    for variant in ("| 1 | repeated |", "| 1 | packed |", "| 2t1a | repeated |", "| 2t1a | packed |"):
        assert variant in md, md
    assert "- packed / repeated, server 1:" in md and "- server 2t1a / 1, packed:" in md, md


def test_ceiling_pyg_twin_under_the_same_load(tiny_repo: Path, tmp_path: Path) -> None:
    """``pygN`` variants: N PyG twin processes on one port, answering the same requests (probabilities,
    repeated and packed, which the clients decode and check) under the same load as gnnserve; the
    replies come from both processes, and the report gives gnnserve over PyG."""
    out = tmp_path / "ceiling.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "ceiling.py"), "--repo", str(tiny_repo),
                           "--model", "gcn", "--processes", "pyg2,1", "--batch", "8", "--clients", "4",
                           "--seconds", "1", "--rounds", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"pyg2:repeated", "pyg2:packed", "1:repeated", "1:packed"}
    for key in ("pyg2:repeated", "pyg2:packed"):
        (r,) = data["results"][key]
        assert r["nodes_per_s"] > 0 and sum(r["served_by"].values()) == r["requests"], r
        assert set(r["served_by"]) <= {"pyg 1/2", "pyg 2/2"}, r["served_by"]
    assert "| pyg2 | packed |" in proc.stdout and "- server 1 / pyg2, packed:" in proc.stdout, proc.stdout
