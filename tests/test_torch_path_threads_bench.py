"""benchmarks/torch_path_threads.py at a small size: two real servers (``--torch-path-threads 1`` and ``0``) answer
Predicts of new nodes (the torch operator path) idle and beside a spinning process; the table holds a row per side
and load with ordered, positive times."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_torch_path_threads_small(tiny_repo: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "torch_path_threads.py"), "--repo",
                           str(tiny_repo), "--model", "shadow", "--new-nodes", "3", "--requests", "4", "--busy", "0,1"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = re.findall(r"^\| (\d) \| (\d) \((?:default|before)\) \| ([\d.]+) / ([\d.]+) \| ([\d.]+) / ([\d.]+) \|$",
                      proc.stdout, re.M)
    assert {(r[0], r[1]) for r in rows} == {("0", "1"), ("0", "0"), ("1", "1"), ("1", "0")}, proc.stdout
    for r in rows:
        fwd50, fwd90, tot50, tot90 = map(float, r[2:])
        assert 0 < fwd50 <= fwd90 and 0 < tot50 <= tot90 and fwd50 <= tot50, r
