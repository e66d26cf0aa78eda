"""``benchmarks/induced.py`` runs end to end on a small synthetic graph, checks its variants' batches equal and prints
one row per batch size; ``--base`` adds a git revision's kernel."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _induced_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "induced.py"), "--graph", "synthetic:3000:0",
                           "--targets", "40", "--k", "16", "--batches", "1,8", "--rounds", "1", *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)


def test_both_lookups_timed_on_equal_batches():
    proc = _induced_py()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "default lookup tagged (from 131,072 nodes)" in proc.stdout, proc.stdout
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "8"], proc.stdout


def test_a_base_revision_beside_this_tree():
    proc = _induced_py("--base", "HEAD")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| HEAD us/target | tagged us/target | map us/target |" in proc.stdout, proc.stdout
    proc = _induced_py("--base", "no-such-revision")
    assert proc.returncode != 0 and "no-such-revision" in proc.stderr
