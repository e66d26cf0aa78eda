"""``benchmarks/kernels.py`` on the CPU runs end to end on a synthetic graph and prints its variants."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_cpu_table_has_every_variant():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "kernels.py"), "--device", "cpu",
                           "--graphs", "arxiv-like", "--features", "10", "--widths", "16", "--rounds", "1", "--no-cache"],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| arxiv-like \| 10 \| cpu \| ([^|]+?) \| [\d.]+ \| (.+) \|$",
                                                         proc.stdout, re.M)}
    assert {"public", "exact via MKL", "exact via the kernel", "memoized CSR"} <= set(rows), proc.stdout
    threads = int(re.search(r"compiled kernel on (\d+)", proc.stdout).group(1))
    # the parallel kernel against itself on one thread: only where it has more than one
    assert ("kernel on 1 thread" in rows) == (threads > 1), proc.stdout
    for name, cells in rows.items():
        assert all(re.fullmatch(r"[\d.]+x|-", c.strip()) for c in cells.split("|")), (name, cells)


def test_cpu_table_times_a_base_revision_beside_this_tree():
    """--base REV: the compiled kernel of this tree and of kernels/spmm_cpu.py at REV, at every width."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True).returncode != 0:
        import pytest

        pytest.skip("not a git checkout")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "kernels.py"), "--device", "cpu",
                           "--graphs", "arxiv-like", "--features", "10", "--widths", "16", "--rounds", "1", "--no-cache",
                           "--base", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| arxiv-like \| 10 \| cpu \| ([^|]+?) \| [\d.]+ \| (.+) \|$",
                                                         proc.stdout, re.M)}
    for name in ("kernel", "kernel at base"):
        cells = [c.strip() for c in rows[name].split("|")]
        assert len(cells) == 2 and all(re.fullmatch(r"[\d.]+x", c) for c in cells), (name, rows)
    bad = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "kernels.py"), "--device", "cpu",
                          "--graphs", "arxiv-like", "--base", "no-such-revision"], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=600)
    assert bad.returncode != 0 and "--base no-such-revision" in bad.stderr, bad.stderr[-2000:]
