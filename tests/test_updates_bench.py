"""benchmarks/updates.py runs end to end at a small size (the figures in docs/BENCHMARKS.md come from it)."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import REPO


def test_update_benchmark_small(tmp_path):
    out = tmp_path / "updates.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "updates.py"), "--synthetic", "1200", "--epochs", "1",
         "--updates", "12", "--batches", "2", "--batch-edges", "20", "--seconds", "0.4", "--rounds", "1",
         "--rate", "100", "--cache-dir", str(tmp_path / "cache"), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["updates"]) == {"single edge", "single feature row", "20 edges"}
    assert all(r["updates"] > 0 and r["rtt_p50_ms"] > 0 and r["apply_p50_ms"] > 0 for r in res["updates"].values())
    assert res["read_your_writes"]["ryw_ok"] == res["read_your_writes"]["ryw_total"] == 12
    under = res["predict_under_updates"]
    assert under["predicts"]["quiet"] > 0 and under["predicts"]["updating"] > 0
    assert under["updates_per_s_achieved"] > 0
    # the server's CPU, read from /proc: every update costs some; the Predict loop keeps the server busy on
    # both sides (a closed loop), so the sides' shares are only known to be positive
    assert all(0 < r["server_cpu_p50_ms"] <= 1e3 and r["server_cpu_mean_ms"] > 0 for r in res["updates"].values())
    assert under["quiet_server_cores"] > 0 and under["updating_server_cores"] > 0
    assert "| no updates |" in proc.stdout
