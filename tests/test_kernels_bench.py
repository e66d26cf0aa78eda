"""``benchmarks/kernels.py`` on the CPU runs end to end on a synthetic graph and prints its variants."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
#: the smallest CPU table: one synthetic graph, one feature width, one sampling width, one round
_SMALL = ("--graphs", "arxiv-like", "--features", "10", "--widths", "16", "--rounds", "1", "--no-cache")


def _kernels_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "kernels.py"), "--device", "cpu", *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)


def _cpu_rows(*extra: str) -> tuple[str, dict[str, str]]:
    """The small table's output and its rows: variant -> the cells after the baseline's time."""
    proc = _kernels_py(*_SMALL, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| arxiv-like \| 10 \| cpu \| ([^|]+?) \| [\d.]+ \| (.+) \|$",
                                                         proc.stdout, re.M)}
    return proc.stdout, rows


def test_cpu_table_has_every_variant():
    out, rows = _cpu_rows()
    assert {"public", "exact via MKL", "exact via the kernel", "memoized CSR"} <= set(rows), out
    threads = int(re.search(r"compiled kernel on (\d+)", out).group(1))
    # the parallel kernel against itself on one thread: only where it has more than one
    assert ("kernel on 1 thread" in rows) == (threads > 1), out
    for name, cells in rows.items():
        assert all(re.fullmatch(r"[\d.]+x|-", c.strip()) for c in cells.split("|")), (name, cells)


def test_cpu_table_times_a_base_revision_beside_this_tree():
    """--base REV: the compiled kernel of this tree and of kernels/spmm_cpu.py at REV, at every width."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    _, rows = _cpu_rows("--base", "HEAD")
    for name in ("kernel", "kernel at base"):
        cells = [c.strip() for c in rows[name].split("|")]
        assert len(cells) == 2 and all(re.fullmatch(r"[\d.]+x", c) for c in cells), (name, rows)
    bad = _kernels_py("--graphs", "arxiv-like", "--base", "no-such-revision")
    assert bad.returncode != 0 and "--base no-such-revision" in bad.stderr, bad.stderr[-2000:]


def test_graphs_take_any_dataset_of_the_data_dir(tmp_path):
    """--graphs names a dataset file of --data-dir (Cora, CiteSeer, ... in ../shared/data), here a tiny one; a name
    that is neither a synthetic shape nor a file there is refused with the choices."""
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "tiny.npz", edge_index=rng.integers(0, 50, (2, 300)), y=np.zeros(50, np.int64))
    proc = _kernels_py("--graphs", "tiny", "--features", "7", "--widths", "4", "--rounds", "1",
                       "--data-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^\| tiny \| 7 \| cpu \| public \| [\d.]+ \| [\d.]+x \| [\d.]+x \|$", proc.stdout, re.M), proc.stdout
    bad = _kernels_py("--graphs", "nowhere", "--data-dir", str(tmp_path))
    assert bad.returncode != 0 and "unknown graphs ['nowhere']" in (bad.stdout + bad.stderr), bad.stderr[-2000:]
