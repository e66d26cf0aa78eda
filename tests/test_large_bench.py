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
    proc = _bench(tmp / "work", out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, json.loads(out.read_text())


SMALL = ["--nodes", "3000", "--amazon", "none", "--epochs", "2", "--shadow-epochs", "1", "--queries", "30",
         "--seconds", "1", "--clients", "2", "--pool", "500", "--eval-nodes", "300", "--knob-accuracy-nodes", "300"]


def _bench(work: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "large.py"), *SMALL, "--work-dir", str(work),
                           "--json", str(out), *extra], capture_output=True, text=True, timeout=900, env=env,
                          cwd=REPO_ROOT)


def _table_rows(md: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("gcn", "shadow-gcn"):
            rows.setdefault(cells[0], cells)  # the first table (the stateless replica's follows)
    return rows


def _num(cell: str) -> float:
    return float(cell.replace(",", "").replace("%", "").strip())


def test_table_has_a_row_per_model(run) -> None:
    md, res = run
    for m in res["datasets"][0]["models"].values():  # the table rounds to 0.1 s: the stage times themselves
        assert m["train"]["stages"]["knob_table"] > 0, m["train"]["stages"]
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
        # the table rounds p50 and floor to 0.01 ms: the ratio lies within what those roundings allow
        x, r = _num(c["x floor p50"]), 0.005
        assert (p50 - r) / (floor + r) - r <= x <= (p50 + r) / max(floor - r, 1e-9) + r, c
        assert _num(c["nodes/s (load)"]) > 0
        assert 0 <= _num(c["test acc"]) <= 100
        assert _num(c["fit s"]) > 0 and _num(c["knob table s"]) >= 0 and _num(c["train wall s"]) > _num(c["fit s"])
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


def test_induced_table_and_budgets(run) -> None:
    _, res = run
    (d,) = res["datasets"]
    m = d["models"]["shadow-gcn"]
    assert m["induced"] is True and m["induced_bytes"] > 0 and m["ppr_index_bytes"] > 0
    # the server's induced budget is what the table takes, not the build limit
    assert m["induced_bytes"] < d["budgets"]["induced"] < 2 * m["induced_bytes"] + (2 << 20)
    assert d["budgets"]["activation"] >= 256 << 20 and d["budgets"]["projection"] >= 2 << 30
    assert d["reused"] == []


def test_stateless_replica_cold_and_warm(run) -> None:
    md, res = run
    (d,) = res["datasets"]
    st = d["stateless"]
    assert st["features_load_s"] > 0 and st["graph_load_s"] > 0 and st["redis_used_memory"] > 0
    for pas in ("cold", "warm"):
        for kind in ("gcn", "shadow-gcn"):
            r = st[pas][kind]
            assert r["seq"]["n"] == 30 and r["load"]["requests"] > 0
            assert 0 < r["seq"]["floor_p50_ms"] < r["seq"]["p50_ms"]
    assert "| gcn | warm |" in md and "| shadow-gcn | cold |" in md


def test_reuse_skips_finished_stages(run, tmp_path: Path) -> None:
    """A second run with --reuse on the same work directory keeps the dataset, models and index."""
    _, res = run
    work = Path(res["argv"][res["argv"].index("--work-dir") + 1])
    cfg = work / "d0" / "repo" / "gcn" / "1" / "config.json"
    before = cfg.stat().st_mtime_ns
    out = tmp_path / "again.json"
    proc = _bench(work, out, "--reuse", "--no-stateless")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (d,) = json.loads(out.read_text())["datasets"]
    assert d["reused"] == ["load", "train gcn", "train shadow-gcn", "index shadow-gcn"]
    assert cfg.stat().st_mtime_ns == before  # not retrained
    first = res["datasets"][0]["models"]["shadow-gcn"]
    assert d["models"]["shadow-gcn"]["ppr_index_s"] == first["ppr_index_s"]  # the build's time, not the open's
    assert d["models"]["gcn"]["train"] == res["datasets"][0]["models"]["gcn"]["train"]
    assert d["models"]["shadow-gcn"]["seq"]["n"] == 30 and "stateless" not in d
