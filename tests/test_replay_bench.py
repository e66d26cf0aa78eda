"""``benchmarks/replay.py`` runs end to end on the tiny repository: the log written, the starts timed with it and
without, the answers after the replay equal to those before (it exits non-zero otherwise), and with
``--compact-replay-s`` the writing server's compaction once idle, after which a start replays nothing."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(600)


def _replay_py(repo: Path, *args: str) -> subprocess.CompletedProcess:
    data = next((repo / "_data").iterdir())
    return subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "replay.py"), "--repo", str(repo),
                           "--graph", str(data), "--model", "gcn", "--updates", "4", "--edges", "2", "--probe", "8",
                           "--rounds", "1", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)


def _rows(out: str) -> list[tuple[str, ...]]:
    return re.findall(r"^\| (new) \| 0 \| ([\d.]+) \| ([\d.]+) \| (-?[\d.]+) \| ([\d.-]+) \| (.+) \|$", out, re.M)


@pytest.fixture()
def repo(tiny_repo: Path, tmp_path: Path) -> Path:
    d = tmp_path / "repo"
    shutil.copytree(tiny_repo, d, ignore=shutil.ignore_patterns("_live"))
    return d


def test_the_whole_log_replayed_at_each_start(repo):
    proc = _replay_py(repo)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    (row,) = _rows(proc.stdout)
    assert row[5] == "yes" and float(row[4]) > 0, proc.stdout  # the server logged its replay
    assert not (repo / "_live").exists() or not list((repo / "_live").iterdir())  # the log went to a temp dir


def test_a_log_compacted_by_the_idle_writer_is_not_replayed(repo):
    proc = _replay_py(repo, "--compact-replay-s", "1e-6")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert re.search(r"the writer's compaction once idle: [\d.]+ s", proc.stdout), proc.stdout
    (row,) = _rows(proc.stdout)
    assert row[5] == "yes" and row[4] == "-", proc.stdout  # from the snapshot: nothing replayed
