"""benchmarks/redis_memory.py at a small size against a real redis-server: memory per key is the
payload plus a per-key overhead in a sane range, and grows with the payload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_server import find_redis_server

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(find_redis_server() is None, reason="no redis-server binary")
def test_memory_per_key(tmp_path: Path) -> None:
    out = tmp_path / "mem.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "redis_memory.py"), "--sizes", "132,1216",
                           "--keys", "3000", "--json", str(out)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = {(r["kind"], r["value_bytes"]): r for r in res["rows"]}
    assert set(rows) == {(k, s) for k in ("feature", "adjacency") for s in (132, 1216)}
    for r in rows.values():
        assert 40 < r["overhead"] < 400, r  # key + dict entry + object header + allocator rounding
        assert 55 < r["key_bytes"] < 80
    assert rows[("feature", 1216)]["per_key"] > rows[("feature", 132)]["per_key"] + 1000
    assert "| feature | 64 | 132 |" in proc.stdout
