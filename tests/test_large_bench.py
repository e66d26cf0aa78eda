"""benchmarks/large.py at a small size: it trains, indexes, starts and serves for real, and its table
has a row per model with sane numbers (issue #19)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    tmp = tmp_path_factory.mktemp("large")
    out = tmp / "large.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "large.py"), "--nodes", "3000", "--amazon", "none",
         "--epochs", "2", "--shadow-epochs", "1", "--queries", "30", "--seconds", "1", "--clients", "2",
         "--pool", "500", "--eval-nodes", "300", "--knob-accuracy-nodes", "300", "--json", str(out)],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, json.loads(out.read_text())


def _table_rows(md: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("gcn", "shadow-gcn"):
            rows[cells[0]] = cells
    return rows


def _num(cell: str) -> float:
    return float(cell.replace(",", "").replace("%", "").strip())


def test_table_has_a_row_per_model(run) -> None:
    md, _ = run
    assert "## Large graphs" in md and "synthetic products, 3,000 nodes" in md
    header = next(line for line in md.splitlines() if line.startswith("| model |"))
    cols = [c.strip() for c in header.strip().strip("|").split("|")]
    rows = _table_rows(md)
    assert set(rows) == {"gcn", "shadow-gcn"}
    for cells in rows.values():
        assert len(cells) == len(cols)
        c = dict(zip(cols, cells, strict=True))
        p50, p99, floor = _num(c["single p50 ms"]), _num(c["single p99 ms"]), _num(c["floor p50 ms"])
        assert 0 < floor < p50 <= p99 < 5000, c  # a Predict costs more than a no-op call
        assert _num(c["x floor p50"]) == pytest.approx(p50 / floor, rel=0.02)
        assert _num(c["nodes/s (load)"]) > 0
        assert 0 <= _num(c["test acc"]) <= 100
        assert _num(c["fit s"]) > 0 and _num(c["knob table s"]) > 0 and _num(c["train wall s"]) > _num(c["fit s"])
        assert 0.05 < _num(c["train peak RSS GiB"]) < 8
    assert _num(dict(zip(cols, rows["shadow-gcn"], strict=True))["PPR index s"]) > 0
    assert dict(zip(cols, rows["gcn"], strict=True))["PPR index s"] == "-"


def test_json_figures(run) -> None:
    _, res = run
    (d,) = res["datasets"]
    assert d["num_nodes"] == 3000 and d["num_features"] == 100 and d["num_classes"] == 47
    assert 20 < d["mean_degree"] < 52 and d["max_degree"] > d["mean_degree"]
    assert 0 < d["server_start_s"] < 600
    assert 50 << 20 < d["server_rss_ready"] < 8 << 30 and d["server_hwm"] >= d["server_rss_ready"]
    assert set(d["load_times"]) == {"generate", "build_graph"}
    for kind in ("gcn", "shadow-gcn"):
        m = d["models"][kind]
        assert m["seq"]["n"] == 30 and m["load"]["requests"] > 0
        assert m["train"]["stages"]["fit"] > 0
    assert d["models"]["shadow-gcn"]["train"]["stages"]["ppr_lists"] > 0
    assert res["self_peak_rss"] > 0 and res["wall_s"] > 0
