"""benchmarks/protocols.py at a small size: a real server with --http-port, the four protocols' labels checked
equal by the script itself, and a row per variant with its latencies and ratios."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_protocols_bench_runs(tiny_repo: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "protocols.py"), "--repo", str(tiny_repo),
                           "--model", "shadow", "--nodes", "3", "--requests", "5", "--rounds", "2"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "labels of 16 nodes equal over the four protocols" in proc.stderr
    rows = {r[0].strip(): [c.strip() for c in r[1:]] for r in
            (line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ") and "variant" not in line)}
    assert set(rows) == {"grpc-noop", "native", "kserve-grpc", "http-noop", "http-json", "http-binary"}
    for v, (p50, p99, vs_native, vs_floor) in rows.items():
        assert 0 < float(p50) <= float(p99), (v, p50, p99)
        assert vs_native.endswith("x") and float(vs_native[:-1]) > 0
        assert (vs_floor == "-") == v.endswith("noop"), (v, vs_floor)
    assert rows["native"][2] == "1.00x"
