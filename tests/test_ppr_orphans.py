"""PPR index directories under ``REPO/_ppr`` and the compactions of a live graph (serve.live ``_save_ppr_lists``,
kernels.ppr_index ``writing_into`` / ``remove_index_dir`` / ``remove_orphan_indexes``; serve.registry's start).

A production test found that a start which loads a snapshot, replays records after it and compacts at once removed the
snapshot's PPR index directory while the induced table of that index was being built beside serving: the save failed
("induced table not saved ... No such file", on every such start), and once the deletion raced the writes and left a
33 MB directory without meta.json that no later compaction removed (about 5 GiB per table at 10 M nodes). Real servers
on loopback over copies of the tiny repository; the other process is a real one.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from clients import GnnClient

from .serving import ServerThread
from .test_live_replay import _wait, ppr_repo  # noqa: F401  (a fixture)
from .test_live_replay_review import _snapshot_version

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]


def slow_induced_builds(monkeypatch, until) -> threading.Event:
    """Make each induced-table build last until ``until()`` holds (a large graph's takes minutes at millions of nodes,
    longer than a start's replay and compaction); the real build runs after. The event is set when one starts."""
    from kernels.subgraph import InducedTable

    real = InducedTable.build.__func__
    started = threading.Event()

    def slow(cls, *a, **k):
        started.set()
        _wait(until, 120)
        return real(cls, *a, **k)

    monkeypatch.setattr(InducedTable, "build", classmethod(slow))
    return started


def _dirs(repo: Path) -> dict[str, bool]:
    """``REPO/_ppr``'s index directories: name -> whether it holds a meta.json."""
    return {p.name: (p / "meta.json").exists() for p in sorted((repo / "_ppr").glob("ppr-*")) if p.is_dir()}


def test_a_start_that_compacts_does_not_delete_the_index_its_induced_table_is_written_into(ppr_repo, monkeypatch,  # noqa: F811
                                                                                             caplog):
    """A snapshot with its PPR lists, records logged after it, then a start that compacts at once while it builds
    the snapshot index's induced table beside serving: no "induced table not saved" warning, no directory without
    meta.json left, the replaced snapshot's lists gone, and the server answers from the table it built."""
    repo = ppr_repo
    compacting = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9, "compact_idle_s": 0.3,
                                              "induced_table_bytes": 0}}
    with ServerThread(repo, compacting) as srv, GnnClient(srv.address) as c:
        v = c.update_graph("shadow", add_edges=[(0, 799)]).graph_version
        assert _wait(lambda: _snapshot_version(repo) == v)
    snap_dirs = _dirs(repo)
    # records after the snapshot, not compacted (and no induced table saved into the snapshot's lists)
    with ServerThread(repo, {"poll_s": 0, "runtime_kw": {"compact_replay_s": 0, "induced_table_bytes": 0}}) as srv, \
            GnnClient(srv.address) as c:
        for k in range(1, 4):
            c.update_graph("shadow", add_edges=[(k, 799 - 3 * k)])
    assert _snapshot_version(repo) == v
    started = slow_induced_builds(monkeypatch, lambda: _snapshot_version(repo) == v + 3)  # after the compaction
    caplog.set_level(logging.INFO)
    with ServerThread(repo, {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9, "compact_idle_s": 1000,
                                                         "induced_table_wait": False}}) as srv, \
            GnnClient(srv.address) as c:
        assert _snapshot_version(repo) == v + 3  # the start compacted
        assert started.is_set()
        assert srv.server.registry.wait_for_induced_tables(120)
        got = c.predict("shadow", np.arange(0, 800, 7))
        assert got.graph_version == v + 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                and ("induced table" in r.getMessage() or "_ppr" in r.getMessage())]
    assert not warnings, warnings
    after = _dirs(repo)
    # (the build may run for the replaced snapshot's lists, kept in memory then, or for the new ones: which one
    # depends on how the start's steps interleave; either way nothing is left half-written)
    assert all(after.values()), after  # every index directory complete
    replaced = [name for name in snap_dirs if name not in after]
    assert replaced, (snap_dirs, after)  # the earlier snapshot's lists were removed (the compaction did its part)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _holder(d: Path) -> subprocess.Popen:
    """Another process writing into ``d``: it holds ``writing_into``'s lock until killed."""
    code = ("import sys, time; from pathlib import Path; from kernels.ppr_index import writing_into\n"
            "with writing_into(Path(sys.argv[1])):\n    print('holding', flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(d)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "holding"
    return p


def _orphan(repo: Path, name: str, files: list[str], meta: dict | None = None) -> Path:
    d = repo / "_ppr" / name
    d.mkdir(parents=True)
    for f in files:
        (d / f).write_bytes(b"\0" * 4096)
    if meta is not None:
        (d / "meta.json").write_text(json.dumps(meta))
    return d


def test_orphaned_index_directories_are_removed_unless_a_live_process_writes_them(ppr_repo):  # noqa: F811
    """Directories under REPO/_ppr that no start can open (no meta.json: no writer's pid, or a dead one's) are removed
    at the next start; a complete one an earlier compaction of this dataset saved goes at the next compaction;
    one a live process writes (its lock held, or a ``.tmp-<live pid>`` file in it) is kept until it stops."""
    repo = ppr_repo
    key = "k0"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    holder = None
    try:
        no_pid = _orphan(repo, f"ppr-{'a' * 32}-{key}", ["induced_src.bin", "induced_eptr.npy"])
        dead = _orphan(repo, f"ppr-{'b' * 32}-{key}", [f"induced_src.bin.tmp-{_dead_pid()}-7"])
        live_tmp = _orphan(repo, f"ppr-{'c' * 32}-{key}", [f"induced_src.bin.tmp-{sleeper.pid}-7"])
        opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9, "compact_idle_s": 0.3}}
        with ServerThread(repo, opts) as srv, GnnClient(srv.address) as c:
            assert not no_pid.exists() and not dead.exists()  # removed at the start
            assert live_tmp.exists()  # a live process's file in it
            fp = srv.server.registry.get("shadow").data.fingerprint
            # an earlier snapshot's lists of this dataset (complete), written into by another process right now
            locked = _orphan(repo, f"ppr-{'d' * 32}-{key}", ["nodes.bin"],
                             meta={"from_live": {"dataset": fp}, "num_nodes": 1})
            holder = _holder(locked)
            earlier = _orphan(repo, f"ppr-{'e' * 32}-{key}", ["nodes.bin"],
                              meta={"from_live": {"dataset": fp}, "num_nodes": 1})
            other = _orphan(repo, f"ppr-{'f' * 32}-{key}", ["nodes.bin"],
                            meta={"from_live": {"dataset": "another dataset"}, "num_nodes": 1})
            v = c.update_graph("shadow", add_edges=[(0, 799)]).graph_version
            assert _wait(lambda: _snapshot_version(repo) == v)
            assert not earlier.exists()  # an earlier compaction's lists: removed by this one
            assert locked.exists() and live_tmp.exists() and other.exists()
            holder.kill()
            holder.wait()
            sleeper.kill()
            sleeper.wait()
            v = c.update_graph("shadow", add_edges=[(1, 796)]).graph_version
            assert _wait(lambda: _snapshot_version(repo) == v)
            assert not locked.exists() and not live_tmp.exists()  # their writers are gone: removed
            assert other.exists()  # another dataset's lists are that dataset's business
            assert all(_dirs(repo).values()), _dirs(repo)
    finally:
        for p in (sleeper, holder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
