"""Review of the grouped replay and the online compaction by replay time (serve.live ``compact_when_idle``,
``compact``; serve.registry's compaction at start): what a follower, a crash, a full disk or a failing snapshot
write does to a server compacting its update log. Real servers on loopback over copies of the tiny repository.

Each test here failed on the change under review (see /work/scratch/rel/REPORT.md for the findings).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from clients import GnnClient
from serve.update_log import FileUpdateLog

from .serving import ServerProcess, ServerThread
from .test_live_replay import _wait, slow_snapshots

pytestmark = pytest.mark.timeout(300)

F = 16  # the tiny dataset's features


def _plain(tiny_repo: Path, dest: Path) -> Path:
    """The tiny repository's GCN alone (a graph without PPR lists), without any update log or snapshot."""
    shutil.copytree(tiny_repo, dest, ignore=shutil.ignore_patterns("_live", "_ppr", "shadow"))
    return dest


def _log_path(repo: Path) -> Path:
    (path,) = (repo / "_live").glob("*.log")
    return path


def _base_head(repo: Path) -> tuple[int, int]:
    with FileUpdateLog(_log_path(repo), follow=True) as lg:
        return lg.base, lg.head()


def _snapshot_version(repo: Path) -> int:
    try:
        return int(json.loads(next((repo / "_live").glob("*.snapshot/snapshot.json")).read_text())["version"])
    except (StopIteration, OSError, ValueError):
        return 0


def _updates(c: GnnClient, first: int, count: int, seed: int) -> int:
    """``count`` updates (a feature row and a new edge each) through ``c``; the last version."""
    rng = np.random.default_rng(seed)
    version = 0
    for i in range(first, first + count):
        version = c.update_graph("gcn", features={i: rng.normal(size=F).astype(np.float32)},
                                 add_edges=[(i, 799 - 3 * i)]).graph_version
    return version


def _live(srv):
    return srv.server.registry.get("gcn").data.live


NODES = np.arange(0, 800, 3)


def test_a_lagging_follower_keeps_serving_after_the_writer_compacts_online(tiny_repo, tmp_path):
    """A second server on the repository follows the writer's log. While it lags (here: its catch-up held back;
    in life a paused or starved process, or one still replaying at its start), the writer goes idle and compacts
    online, dropping records the follower has not applied. The follower must go on answering, at the writer's
    version and bit for bit as the writer (from the snapshot, or because the writer kept what it still needs) --
    not take the graph out of service until someone restarts it."""
    repo = _plain(tiny_repo, tmp_path / "repo")
    # idle 2 s: the three updates land before the one compaction even on a loaded machine (a follower lagging
    # across two compactions does lose records: the log keeps one generation)
    opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9, "compact_idle_s": 2.0}}
    with ServerThread(repo, opts) as w, GnnClient(w.address) as cw:
        assert _updates(cw, 0, 3, 1) == 3
        with ServerThread(repo, opts) as f, GnnClient(f.address, max_retries=0) as cf:
            assert _live(f).follows_writer
            assert cf.predict("gcn", [1], min_graph_version=3).graph_version == 3
            lag = _live(f)._writer  # the follower's catch-up waits for it: the follower lags
            lag.acquire()
            try:
                assert _updates(cw, 3, 3, 2) == 6
                assert _wait(lambda: _snapshot_version(repo) == 6), "the writer did not compact"
            finally:
                lag.release()
            want = cw.predict("gcn", NODES, sampling_width=2)
            got = cf.predict("gcn", NODES, sampling_width=2, min_graph_version=6)
            assert got.graph_version == 6
            np.testing.assert_array_equal(got.probabilities, want.probabilities)
            assert cf.health(timeout=10) == "SERVING"


class _Killed(BaseException):
    """The process dying (SIGKILL) at that point: nothing after it runs."""


def test_a_writer_killed_between_the_snapshot_renames_restarts_with_every_acknowledged_update(tiny_repo, tmp_path,
                                                                                             monkeypatch):
    """``compact`` moves the old snapshot aside (``os.replace(d, d.old-PID)``) before renaming the new one in
    (``os.replace(d.tmp-PID, d)``). A writer killed between the two leaves no snapshot at ``d`` while the log's
    records up to the old snapshot are gone: the next start must still serve every acknowledged update (the
    snapshot swap must be atomic, or a start must find the complete snapshot that was being swapped in)."""
    repo = _plain(tiny_repo, tmp_path / "repo")
    opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 0}}
    with ServerThread(repo, opts) as w, GnnClient(w.address) as c:
        live = _live(w)
        snapshot = repo / "_live" / f"{live.data.fingerprint}.snapshot"
        assert _updates(c, 0, 3, 3) == 3
        live.compact(snapshot)  # a first snapshot, at version 3
        assert _updates(c, 3, 2, 4) == 5
        before = c.predict("gcn", NODES, sampling_width=2)
        real = os.replace

        def replace(src, dst, *a, **k):
            real(src, dst, *a, **k)
            if Path(src) == snapshot and ".old-" in str(dst):
                raise _Killed  # the old snapshot moved aside, the new one not yet renamed in

        monkeypatch.setattr(os, "replace", replace)
        with pytest.raises(_Killed):
            live.compact(snapshot)
        monkeypatch.setattr(os, "replace", real)
    # the killed process's leftovers, as a dead process leaves them (a pid that no longer runs)
    dead = 2**22 + 12345
    for p in snapshot.parent.glob(f"{snapshot.name}.*-{os.getpid()}"):
        p.rename(p.with_name(p.name.rsplit("-", 1)[0] + f"-{dead}"))
    with ServerThread(repo, opts) as w, GnnClient(w.address, max_retries=0) as c:
        got = c.predict("gcn", NODES, sampling_width=2)
        assert got.graph_version == 5
        np.testing.assert_array_equal(got.probabilities, before.probabilities)
    # the newer complete snapshot was renamed into place, the older one it left removed
    assert (snapshot / "snapshot.json").exists()
    assert not list(snapshot.parent.glob(f"{snapshot.name}.old-*")), list(snapshot.parent.iterdir())


def _fail_snapshot_writes(monkeypatch, what: str) -> None:
    """The snapshot's graph (``what="graph"``) or features (``"x"``) cannot be written: no space left."""
    from kernels.graph import CSRGraph

    def enospc(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if what == "graph":
        real = CSRGraph.save

        def save(self, directory, *a, **k):
            if ".snapshot.tmp-" in str(directory):
                enospc()
            return real(self, directory, *a, **k)

        monkeypatch.setattr(CSRGraph, "save", save)
    else:  # the features are written after the graph: the snapshot's directory is half-written then
        import kernels.datasets

        monkeypatch.setattr(kernels.datasets, "npy_header", enospc)


def test_a_start_whose_compaction_fails_still_serves_the_graph(tiny_repo, tmp_path, monkeypatch):
    """Compacting at start (the replay took longer than ``compact_replay_s``) is an optimisation: when the
    snapshot cannot be written (disk full, unwritable directory) the server must log it and serve the replayed
    graph, keeping the log -- not refuse the model (then nothing is served, and every restart fails the same
    way while the disk stays full)."""
    repo = _plain(tiny_repo, tmp_path / "repo")
    with ServerThread(repo, {"poll_s": 0, "runtime_kw": {"compact_replay_s": 0}}) as w, GnnClient(w.address) as c:
        assert _updates(c, 0, 3, 5) == 3
        before = c.predict("gcn", NODES, sampling_width=2)
    _fail_snapshot_writes(monkeypatch, "graph")
    opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9}}
    with ServerThread(repo, opts) as w, GnnClient(w.address, max_retries=0) as c:
        got = c.predict("gcn", NODES, sampling_width=2)
        assert got.graph_version == 3
        np.testing.assert_array_equal(got.probabilities, before.probabilities)
    assert _base_head(repo) == (0, 3)


def test_a_failed_online_compaction_leaves_no_partial_snapshot_behind(tiny_repo, tmp_path, monkeypatch, caplog):
    """An online compaction that fails half-way (here: the features cannot be written, disk full) must remove
    what it wrote: a partial ``<fp>.snapshot.tmp-PID`` left in place holds the disk space the log's appends need
    until the next try, 10 minutes later. The log stays whole and updates go on."""
    repo = _plain(tiny_repo, tmp_path / "repo")
    _fail_snapshot_writes(monkeypatch, "x")
    opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9, "compact_idle_s": 0.3}}
    with caplog.at_level("ERROR"), ServerThread(repo, opts) as w, GnnClient(w.address) as c:
        assert _updates(c, 0, 3, 6) == 3
        assert _wait(lambda: any("compacting the update log failed" in r.getMessage() for r in caplog.records))
        assert _base_head(repo) == (0, 3)
        assert c.update_graph("gcn", features={9: np.zeros(F, np.float32)}).graph_version == 4
        left = sorted(p.name for p in (repo / "_live").glob("*.snapshot.tmp-*"))
        assert not left, f"a failed compaction left {left}"


def test_compaction_makes_the_snapshot_durable_before_dropping_the_log_records(tiny_repo, tmp_path, monkeypatch):
    """With ``--update-log-fsync`` an acknowledged update survives a machine crash. ``compact`` drops the logged
    records (the log's new file is fsynced and renamed) after writing the snapshot that replaces them; that
    snapshot's files must be on disk (fsynced, with their directory) before, or a power cut right after a
    compaction loses every update it folded in."""
    repo = _plain(tiny_repo, tmp_path / "repo")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        try:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            synced.append(f"fd {fd}")
        return real_fsync(fd)

    opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 0, "update_log_fsync": True}}
    with ServerThread(repo, opts) as w, GnnClient(w.address) as c:
        assert _updates(c, 0, 3, 7) == 3
        live = _live(w)
        snapshot = repo / "_live" / f"{live.data.fingerprint}.snapshot"
        live.compact(snapshot)  # the first snapshot: the log keeps its records (followers up to one behind)
        assert _updates(c, 3, 2, 8) == 5
        monkeypatch.setattr(os, "fsync", fsync)
        live.compact(snapshot)  # drops the records up to the first snapshot's version
        monkeypatch.setattr(os, "fsync", real_fsync)
    assert _base_head(repo) == (3, 5)
    log_synced = [i for i, p in enumerate(synced) if p.endswith(".compact.tmp")]
    assert log_synced, synced
    before_truncate = synced[:log_synced[0]]
    for name in ("x.npy", "snapshot.json", "indices.npy", "indptr.npy"):
        assert any(p.endswith(name) for p in before_truncate), (name, synced)


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_full_disk_during_an_online_compaction_does_not_kill_the_writer(tiny_repo, tmp_path):
    """The snapshot's features are written through a memory map of a sparse file (``open_memmap``); on a full
    disk the page faults get SIGBUS and the writer process dies in the middle of serving (then crash-loops: each
    start compacts again). A full disk must be an error the compaction logs and retries (the log is kept).
    Needs root to mount a 1 MiB tmpfs for --update-log-dir (skipped otherwise)."""
    small = tmp_path / "small"
    if not _mount_tmpfs(small, "1M"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        repo = _plain(tiny_repo, tmp_path / "repo")
        live_dir = small / "live"
        args = ["--no-progress", "--update-log-dir", str(live_dir), "--compact-replay-s", "1e-9",
                "--compact-idle-s", "1"]
        with ServerProcess(repo, *args) as srv, GnnClient(srv.address, max_retries=0) as c:
            assert _updates(c, 0, 5, 8) == 5
            st = os.statvfs(small)
            free = st.f_bavail * st.f_frsize
            (small / "filler").write_bytes(b"\0" * max(0, free - 80 * 1024))  # room for part of a snapshot
            time.sleep(4)  # idle: the writer tries to compact
            assert srv.proc.poll() is None, f"the writer died (exit {srv.proc.returncode}):\n{srv.log()[-2000:]}"
            assert c.predict("gcn", [1]).graph_version == 5
            (small / "filler").unlink()
            assert c.update_graph("gcn", features={9: np.zeros(F, np.float32)}).graph_version == 6
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_updates_sent_during_a_compaction_all_land_in_order(tiny_repo, tmp_path, monkeypatch):
    """(Held on the change: kept as a regression test.) Updates arriving while the writer compacts wait for it,
    then land, each once, in order; predictions go on meanwhile."""
    repo = _plain(tiny_repo, tmp_path / "repo")
    started = slow_snapshots(monkeypatch)
    opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9, "compact_idle_s": 0.3}}
    with ServerThread(repo, opts) as w, GnnClient(w.address) as c:
        assert _updates(c, 0, 3, 9) == 3
        assert started.wait(30)
        out: list[int] = []

        def one(k: int) -> None:
            with GnnClient(w.address) as cc:
                out.append(cc.update_graph("gcn", features={100 + k: np.full(F, k, np.float32)},
                                           timeout=60).graph_version)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        t0 = time.monotonic()
        while any(th.is_alive() for th in threads):
            assert c.predict("gcn", [1], timeout=10).graph_version >= 3
            assert time.monotonic() - t0 < 60
        for th in threads:
            th.join()
        assert len(out) == 4 and min(out) == 4
        assert _wait(lambda: _snapshot_version(repo) >= 3)
        live = _live(w)
        x = live.features.get(np.arange(100, 104))
        np.testing.assert_array_equal(x, np.repeat(np.arange(4, dtype=np.float32)[:, None], F, 1))


def test_online_compactions_of_a_ppr_graph_do_not_pile_up_ppr_indexes(tiny_repo, tmp_path):
    """Each compaction saves the graph's PPR lists as the index of the snapshot's graph (``_save_ppr_lists``: a
    new ``REPO/_ppr/ppr-<graph fingerprint>-<config>`` directory, the graph's fingerprint changing with every
    update). With compaction while serving, every idle period after updates adds one, and nothing removes the
    previous snapshot's (no start can load it any more: the snapshot was replaced): the disk fills, one PPR index
    per compaction (GiBs each on a large graph). At most the dataset's index and the current snapshot's may
    stay."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, ignore=shutil.ignore_patterns("_live", "_ppr"))
    opts = {"poll_s": 0, "runtime_kw": {"compact_replay_s": 1e-9, "compact_idle_s": 0.3}}
    with ServerThread(repo, opts) as w, GnnClient(w.address) as c:
        for k in range(4):
            v = c.update_graph("shadow", add_edges=[(k, 799 - 3 * k)]).graph_version
            assert _wait(lambda v=v: _snapshot_version(repo) == v)
    dirs = sorted(p.name for p in (repo / "_ppr").glob("ppr-*"))
    assert len(dirs) <= 2, dirs
