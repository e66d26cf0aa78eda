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
