"""The update log (serve/update_log.py): the file log's framing, crash safety and compaction, and the
Redis stream log shared by replicas, against a real ``redis-server``."""

from __future__ import annotations

import logging
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

import pytest

from serve.update_log import (
    FileUpdateLog,
    RecordsCompacted,
    RedisUpdateLog,
    UpdateLog,
    UpdateLogError,
    UpdateLogUnavailable,
    VersionConflict,
    _encode_record,
)

pytest_plugins = ("tests.redis_server",)

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
HDR = 20  # file header bytes
REC = 20  # record header bytes


def payload(v: int) -> bytes:
    return b"update-%d|" % v + bytes((v * 7 + i) % 256 for i in range(v % 50))


def offsets(path: Path) -> list[int]:
    """Record offsets parsed independently of the implementation."""
    data = path.read_bytes()
    out, off = [], HDR
    while off + REC <= len(data):
        _, _, length, _ = struct.unpack_from("<4sQII", data, off)
        out.append(off)
        off += REC + length
    return out


# =========================================================================== file log
def test_file_log_round_trip_and_reopen(tmp_path):
    p = tmp_path / "g" / "updates.log"
    with FileUpdateLog(p) as lg:
        assert isinstance(lg, UpdateLog)
        assert (lg.head(), lg.base, lg.read()) == (0, 0, [])
        for v in range(1, 31):
            assert lg.append(payload(v)) == v
        assert lg.head() == 30
        assert lg.read() == [(v, payload(v)) for v in range(1, 31)]
        assert lg.read(27) == [(28, payload(28)), (29, payload(29)), (30, payload(30))]
        assert lg.read(10, limit=2) == [(11, payload(11)), (12, payload(12))]
        assert lg.read(30) == []
        with pytest.raises(UpdateLogError, match="behind version 31"):
            lg.read(31)
        assert lg.size_bytes() == p.stat().st_size == HDR + sum(REC + len(payload(v)) for v in range(1, 31))
        assert lg.append(b"") == 31 and lg.read(30) == [(31, b"")]
    with pytest.raises(UpdateLogError, match="closed"):
        lg.append(b"x")
    with FileUpdateLog(tmp_path / "other.log") as other, pytest.raises(TypeError, match="bytes"):
        other.append(5)  # type: ignore[arg-type]
    (p.parent / (p.name + ".compact.tmp")).write_bytes(b"half a compaction")
    with FileUpdateLog(p) as lg:
        assert not (p.parent / (p.name + ".compact.tmp")).exists()
        assert lg.head() == 31
        assert lg.read(0, limit=3) == [(1, payload(1)), (2, payload(2)), (3, payload(3))]
        assert lg.append(b"again") == 32
    assert len(offsets(p)) == 32


def test_file_log_expect_version_and_single_opener(tmp_path):
    p = tmp_path / "u.log"
    lg = FileUpdateLog(p)
    assert lg.append(b"a", expect_version=0) == 1
    with pytest.raises(VersionConflict, match="another writer") as ei:
        lg.append(b"b", expect_version=0)
    assert (ei.value.head, ei.value.expected) == (1, 0)
    with pytest.raises(VersionConflict, match="lost records"):
        lg.append(b"b", expect_version=5)
    assert lg.append(b"b", expect_version=1) == 2 and lg.head() == 2
    with pytest.raises(UpdateLogError, match="open in another process"):
        FileUpdateLog(p)
    lg.close()
    FileUpdateLog(p).close()  # released on close


_CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
from serve.update_log import FileUpdateLog
from tests.test_update_log import payload
lg = FileUpdateLog({path!r}, fsync={fsync})
v = 0
while True:
    v = lg.append(payload(v + 1))
    print(v, flush=True)
    if v >= {stop}:
        time.sleep(60)
"""


@pytest.mark.parametrize("fsync", [False, True])
def test_file_log_survives_sigkill(tmp_path, fsync):
    """Every version the child printed (acknowledged) is in the file after a SIGKILL mid-stream."""
    p = tmp_path / "kill.log"
    code = _CHILD.format(repo=str(REPO), path=str(p), fsync=fsync, stop=10**9)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    acked: list[int] = []
    try:
        assert child.stdout is not None
        while len(acked) < 300:
            line = child.stdout.readline()
            assert line, "the child died before appending"
            acked.append(int(line))
        child.send_signal(signal.SIGKILL)  # while it keeps appending
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert child.returncode == -signal.SIGKILL
    assert acked == list(range(1, len(acked) + 1))
    with FileUpdateLog(p) as lg:
        got = lg.read()
        assert lg.head() >= acked[-1]
        assert got == [(v, payload(v)) for v in range(1, lg.head() + 1)]


def test_torn_tail_is_cut_off(tmp_path, caplog):
    p = tmp_path / "t.log"
    with FileUpdateLog(p) as lg:
        for v in range(1, 6):
            lg.append(payload(v))
    good = p.stat().st_size
    # a crash mid-write: only part of record 6 reached the file
    rec6 = struct.pack("<4sQII", b"GUR1", 6, 40, zlib.crc32(b"x" * 40, zlib.crc32(struct.pack("<Q", 6)))) + b"x" * 40
    for tail in (rec6[:7], rec6[:-1], rec6[:-1] + b"y", b"\0" * 64):
        with open(p, "ab") as f:
            f.write(tail)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="serve.update_log"), FileUpdateLog(p) as lg:
            assert lg.head() == 5 and lg.read(3) == [(4, payload(4)), (5, payload(5))]
            assert p.stat().st_size == good
        assert any("torn last record" in r.getMessage() and f"byte offset {good}" in r.getMessage()
                   for r in caplog.records), tail
    with open(p, "ab") as f:
        f.write(rec6[:30])
    with FileUpdateLog(p) as lg:
        assert lg.append(payload(6)) == 6  # written where the torn bytes were
    with FileUpdateLog(p) as lg:
        assert lg.read(4) == [(5, payload(5)), (6, payload(6))]
    # a file cut inside its header right after creation holds nothing: it is started again
    q = tmp_path / "h.log"
    q.write_bytes(b"GNNULOG")
    with FileUpdateLog(q) as lg:
        assert lg.head() == 0 and lg.append(b"a") == 1


def test_damage_before_the_end_is_refused(tmp_path):
    p = tmp_path / "c.log"
    with FileUpdateLog(p) as lg:
        for v in range(1, 9):
            lg.append(payload(v))
    offs = offsets(p)
    original = p.read_bytes()
    for where, what in ((offs[2] + REC + 3, "CRC mismatch"), (offs[4], "bad record magic"),
                        (offs[3] + 12, "runs past the end")):
        data = bytearray(original)
        if what == "runs past the end":
            struct.pack_into("<I", data, offs[3] + 12, 10**6)  # a length field damaged mid-file
            at = offs[3]
        else:
            data[where] ^= 0x5A
            at = offs[2] if what == "CRC mismatch" else offs[4]
        p.write_bytes(bytes(data))
        with pytest.raises(UpdateLogError, match=f"damaged at byte offset {at} .*{what}"):
            FileUpdateLog(p)
        assert p.read_bytes() == bytes(data), "a refused log is never changed"
    p.write_bytes(original[:10] + b"X" + original[11:])  # the base field
    with pytest.raises(UpdateLogError, match=r"header .* fails its CRC"):
        FileUpdateLog(p)
    (tmp_path / "other").write_bytes(b"hello world, not a log at all")
    with pytest.raises(UpdateLogError, match="not an update log"):
        FileUpdateLog(tmp_path / "other")


def test_versions_must_be_dense(tmp_path):
    p = tmp_path / "d.log"
    with FileUpdateLog(p) as lg:
        for v in range(1, 4):
            lg.append(payload(v))
    # a valid record (correct CRC) whose version skips one
    rec = struct.pack("<4sQII", b"GUR1", 5, 3, zlib.crc32(b"abc", zlib.crc32(struct.pack("<Q", 5)))) + b"abc"
    with open(p, "ab") as f:
        f.write(rec)
    with pytest.raises(UpdateLogError, match=r"version 5, expected 4 \(versions must be dense\)"):
        FileUpdateLog(p)


def test_truncate_before(tmp_path):
    p = tmp_path / "tr.log"
    lg = FileUpdateLog(p, fsync=True)
    for v in range(1, 11):
        lg.append(payload(v))
    size = lg.size_bytes()
    lg.truncate_before(6)
    assert (lg.base, lg.head()) == (6, 10)
    assert lg.read(6) == [(v, payload(v)) for v in range(7, 11)]
    assert lg.size_bytes() == p.stat().st_size == size - sum(REC + len(payload(v)) for v in range(1, 7))
    with pytest.raises(RecordsCompacted, match="snapshot") as ei:
        lg.read(3)
    assert (ei.value.base, ei.value.after) == (6, 3)
    lg.truncate_before(4)  # already compacted: nothing to do
    with pytest.raises(ValueError, match="head is 10"):
        lg.truncate_before(11)
    assert lg.append(payload(11)) == 11
    lg.close()
    assert not list(tmp_path.glob("*.tmp"))
    lg = FileUpdateLog(p)
    assert (lg.base, lg.head()) == (6, 11) and lg.read(9) == [(10, payload(10)), (11, payload(11))]
    lg.truncate_before(11)
    assert (lg.base, lg.head(), lg.read(11), lg.size_bytes()) == (11, 11, [], HDR)
    assert lg.append(b"next") == 12
    lg.close()
    with FileUpdateLog(p) as lg:
        assert (lg.base, lg.read(11)) == (11, [(12, b"next")])


def test_concurrent_appends_are_dense(tmp_path):
    p = tmp_path / "cc.log"
    lg = FileUpdateLog(p)
    got: dict[int, bytes] = {}
    lock = threading.Lock()

    def writer(t: int) -> None:
        for i in range(60):
            data = b"t%d-%d" % (t, i)
            v = lg.append(data)
            with lock:
                got[v] = data

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(got) == list(range(1, 361))
    assert lg.read() == sorted(got.items())
    lg.close()
    with FileUpdateLog(p) as lg:
        assert lg.read() == sorted(got.items())


def test_file_wait(tmp_path):
    lg = FileUpdateLog(tmp_path / "w.log")
    lg.append(b"one")
    assert lg.wait(0, 5) == [(1, b"one")]  # already there: no waiting
    t0 = time.monotonic()
    assert lg.wait(1, 0.3) == []
    assert 0.25 <= time.monotonic() - t0 < 2
    threading.Timer(0.2, lambda: lg.append(b"two")).start()
    t0 = time.monotonic()
    assert lg.wait(1, 10) == [(2, b"two")]
    assert time.monotonic() - t0 < 3
    threading.Timer(0.2, lg.close).start()
    assert lg.wait(2, 10) == []  # closing wakes a waiter


# =========================================================================== Redis log
def fp() -> str:
    return "t" + uuid.uuid4().hex[:16]


FAST = {"socket_timeout": 0.5, "connect_timeout": 0.3, "retries": 1}


def test_redis_logs_share_records_in_order(redis_server):
    g = fp()
    a = RedisUpdateLog(redis_server.url, g, **FAST)
    b = RedisUpdateLog(redis_server.url, g, **FAST)
    try:
        assert isinstance(a, UpdateLog)
        assert (a.head(), b.read(), a.base) == (0, [], 0)
        assert a.append(payload(1)) == 1
        assert b.append(payload(2), expect_version=1) == 2
        assert a.append(payload(3), expect_version=2) == 3
        for v in range(4, 41):
            assert (a if v % 2 else b).append(payload(v)) == v
        for lg in (a, b):
            assert lg.head() == 40
            assert lg.read() == [(v, payload(v)) for v in range(1, 41)]
            assert lg.read(37) == [(38, payload(38)), (39, payload(39)), (40, payload(40))]
            assert lg.read(5, limit=2) == [(6, payload(6)), (7, payload(7))]
            assert lg.read(40) == []
        assert a.size_bytes() == sum(len(payload(v)) for v in range(1, 41))
        with pytest.raises(UpdateLogError, match="behind version 41"):
            b.read(41)
        # the keys of the schema
        c = redis_server.client()
        assert int(c.get(f"gnnserve:live:{g}:{{log}}:head")) == 40
        assert c.xlen(f"gnnserve:live:{g}:{{log}}") == 40
        assert c.xrange(f"gnnserve:live:{g}:{{log}}", "3-1", "3-1")[0][1][b"u"] == payload(3)
        c.close()
    finally:
        a.close()
        b.close()


def test_redis_concurrent_writers_are_dense(redis_server):
    g = fp()
    logs = [RedisUpdateLog(redis_server.url, g, **FAST) for _ in range(4)]
    got: dict[int, bytes] = {}
    lock = threading.Lock()

    def writer(i: int) -> None:
        for j in range(40):
            data = b"w%d-%d" % (i, j)
            v = logs[i].append(data)
            with lock:
                got[v] = data

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(got) == list(range(1, 161))
    assert logs[0].read() == sorted(got.items())
    for lg in logs:
        lg.close()


def test_redis_expect_version_conflict(redis_server):
    g = fp()
    a = RedisUpdateLog(redis_server.url, g, **FAST)
    b = RedisUpdateLog(redis_server.url, g, **FAST)
    assert a.append(b"a", expect_version=0) == 1
    with pytest.raises(VersionConflict, match="another writer") as ei:
        b.append(b"b", expect_version=0)  # b has not seen record 1
    assert (ei.value.head, ei.value.expected) == (1, 0)
    assert b.read(0) == [(1, b"a")]  # so it catches up and retries
    assert b.append(b"b", expect_version=1) == 2
    assert a.read(1) == [(2, b"b")] and a.head() == 2
    a.close()
    b.close()


def test_redis_append_sent_again_after_a_lost_answer_is_not_a_conflict(redis_server):
    """redis-py sends a command again after a timeout (serve.redisdata.connection.TransientRetry), and the first one
    may have run with its answer lost. An append with ``expect_version`` then met its own record: VersionConflict, so
    the writer read the log, applied the record (its own update) and appended the update again: applied twice. The
    record's token makes the second send answer the first one's version; another writer's record stays a conflict."""
    g = fp()
    a = RedisUpdateLog(redis_server.url, g, **FAST)
    b = RedisUpdateLog(redis_server.url, g, **FAST)
    assert a.append(b"x", expect_version=0) == 1
    k = a.keys
    args = [b"once", "1", uuid.uuid4().hex, a._epoch or "", "token-1"]
    first = a._append(keys=[k["stream"], k["head"], k["bytes"], k["epoch"]], args=args)
    assert b.append(b"other", expect_version=2) == 3  # another writer right after it, before the send again
    again = a._append(keys=[k["stream"], k["head"], k["bytes"], k["epoch"]], args=args)  # what redis-py re-sends
    assert [x if isinstance(x, bytes) else str(x).encode() for x in first[:2]] == [b"ok", b"2"]
    assert [x if isinstance(x, bytes) else str(x).encode() for x in again[:2]] == [b"ok", b"2"]
    assert a.read(0) == [(1, b"x"), (2, b"once"), (3, b"other")] and a.head() == 3
    with pytest.raises(VersionConflict):  # a different update expecting the same head is still refused
        a.append(b"late", expect_version=1)
    a.close()
    b.close()


def test_redis_wait_wakes_on_another_append_and_times_out(redis_server):
    g = fp()
    a = RedisUpdateLog(redis_server.url, g, **FAST)
    b = RedisUpdateLog(redis_server.url, g, **FAST)
    try:
        t0 = time.monotonic()
        assert b.wait(0, 1.2) == []
        assert 1.1 <= time.monotonic() - t0 < 3  # several XREAD BLOCK slices of 0.25 s
        threading.Timer(0.4, lambda: a.append(b"first")).start()
        t0 = time.monotonic()
        assert b.wait(0, 10) == [(1, b"first")]
        assert 0.3 <= time.monotonic() - t0 < 2
        a.append(b"second")
        a.append(b"third")
        assert b.wait(0, 10) == [(1, b"first"), (2, b"second"), (3, b"third")]  # a follower that missed messages
        assert b.wait(2, 10) == [(3, b"third")]
        threading.Timer(0.3, lambda: a.append(b"fourth")).start()
        assert b.wait(3, 10) == [(4, b"fourth")]
    finally:
        a.close()
        b.close()


def test_redis_truncate_before_and_lost_log(redis_server):
    g = fp()
    a = RedisUpdateLog(redis_server.url, g, **FAST)
    b = RedisUpdateLog(redis_server.url, g, **FAST)
    for v in range(1, 11):
        a.append(payload(v))
    a.truncate_before(7)
    assert (b.base, b.head()) == (7, 10)
    assert b.read(7) == [(8, payload(8)), (9, payload(9)), (10, payload(10))]
    assert b.size_bytes() == sum(len(payload(v)) for v in range(8, 11))
    with pytest.raises(RecordsCompacted) as ei:
        b.read(2)
    assert ei.value.base == 7
    with pytest.raises(RecordsCompacted):
        b.wait(6, 1)
    with pytest.raises(ValueError, match="head is 10"):
        a.truncate_before(11)
    a.truncate_before(5)  # no-op
    assert b.append(payload(11)) == 11 and a.read(9) == [(10, payload(10)), (11, payload(11))]
    a.truncate_before(11)
    assert (a.base, a.head(), a.read(11), a.size_bytes()) == (11, 11, [], 0)
    assert a.append(b"x") == 12
    # Redis loses everything (a restart without persistence): nobody re-uses version numbers silently
    c = redis_server.client()
    keys = c.keys(f"gnnserve:live:{g}:*")
    c.delete(*keys)
    with pytest.raises(UpdateLogError, match="lost records"):
        b.read(12)
    with pytest.raises(UpdateLogError, match="was lost and started again") as ei:
        a.append(b"y", expect_version=12)  # it never writes into a log other than the one it saw
    assert not isinstance(ei.value, VersionConflict)
    assert c.exists(f"gnnserve:live:{g}:{{log}}") == 0
    # a server that never saw the old log starts a new one and gets past version 12
    fresh = RedisUpdateLog(redis_server.url, g, **FAST)
    assert fresh.head() == 0
    for v in range(1, 16):
        assert fresh.append(b"new-%d" % v, expect_version=v - 1) == v
    with pytest.raises(UpdateLogError, match="was lost and started again"):
        b.read(12)  # versions 13.. of the new log are other updates than b's 1..12
    with pytest.raises(UpdateLogError, match="was lost and started again"):
        a.append(b"y", expect_version=15)
    assert fresh.read(14) == [(15, b"new-15")]
    # the head counter lost but the stream kept: appending never writes over it
    c.delete(f"gnnserve:live:{g}:{{log}}:head")
    with pytest.raises(UpdateLogError, match="damaged"):
        fresh.append(b"r2")
    # a record deleted from the stream: a reader never skips it
    c.set(f"gnnserve:live:{g}:{{log}}:head", 15)
    fresh.append(b"16")
    fresh.append(b"17")
    c.xdel(f"gnnserve:live:{g}:{{log}}", "16-1")
    with pytest.raises(UpdateLogError, match="record 16 is missing"):
        fresh.read(14)
    with pytest.raises(UpdateLogError, match="missing"):
        fresh.read(15)
    c.close()
    for lg in (a, b, fresh):
        lg.close()


def _prompt(call, limit: float = 3.0) -> UpdateLogUnavailable:
    t0 = time.monotonic()
    with pytest.raises(UpdateLogUnavailable) as ei:
        call()
    assert time.monotonic() - t0 < limit
    return ei.value


@pytest.mark.parametrize("password", [None, "s3cr:et/pw"])
def test_redis_down_is_unavailable_promptly(redis_factory, password):
    srv = redis_factory(password=password)
    g = fp()
    lg = RedisUpdateLog(srv.url, g, **FAST)
    follower = RedisUpdateLog(srv.url, g, **FAST)
    assert lg.append(b"a") == 1
    waiting: dict[str, object] = {}

    def wait() -> None:
        t0 = time.monotonic()
        try:
            follower.wait(1, 30)
        except Exception as exc:
            waiting["exc"] = exc
        waiting["s"] = time.monotonic() - t0

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.3)
    srv.kill()
    th.join(10)
    assert not th.is_alive()
    assert isinstance(waiting.get("exc"), UpdateLogUnavailable) and waiting["s"] < 4
    errors = [_prompt(lambda: lg.append(b"b")), _prompt(lambda: lg.read(0)), _prompt(lg.head),
              _prompt(lambda: lg.wait(1, 5)), _prompt(lg.size_bytes), _prompt(lambda: lg.truncate_before(1))]
    for exc in errors:
        msg = str(exc)
        assert str(srv.port) not in msg and "127.0.0.1" not in msg, msg
        assert "running and reachable" in msg, msg
        if password:
            assert "s3cr" not in msg and "et/pw" not in msg and "s3cr%3Aet" not in msg, msg
    # back (empty: killed without persistence): the same objects reconnect, and see the loss
    srv.start()
    assert lg.head() == 0
    with pytest.raises(UpdateLogError, match="lost records"):
        follower.read(1)
    with pytest.raises(UpdateLogError, match="was lost"):
        lg.append(b"b")
    lg.close()
    follower.close()


def test_redis_wrong_password_and_frozen_server(redis_factory):
    srv = redis_factory(password="right-pw")
    bad = srv.url.replace("right-pw", "wrong-pw")
    lg = RedisUpdateLog(bad, fp(), **FAST)
    exc = _prompt(lambda: lg.append(b"x"))
    assert "wrong-pw" not in str(exc) and "credentials" in str(exc)
    lg.close()
    good = RedisUpdateLog(srv.url, fp(), **FAST)
    assert good.append(b"x") == 1
    srv.pause()  # a hung server: the socket timeout bounds every call
    try:
        _prompt(lambda: good.append(b"y"), limit=4.0)
        _prompt(lambda: good.wait(1, 30), limit=4.0)
    finally:
        srv.resume()
    good.close()


def test_redis_cluster_log(redis_cluster):
    g = fp()
    a = RedisUpdateLog(redis_cluster.url, g, **FAST)
    b = RedisUpdateLog(redis_cluster.url, g, **FAST)
    try:
        for v in range(1, 6):
            assert a.append(payload(v), expect_version=v - 1) == v
        assert b.read(2) == [(v, payload(v)) for v in range(3, 6)]
        threading.Timer(0.3, lambda: a.append(b"six")).start()
        assert b.wait(5, 10) == [(6, b"six")]
        b.truncate_before(3)
        assert (a.base, a.read(3)[0][0], a.size_bytes()) == (3, 4, sum(len(payload(v)) for v in (4, 5)) + 3)
    finally:
        a.close()
        b.close()


def test_file_log_followers_read_what_the_writer_appends(tmp_path):
    # a second server, a --read-only one or a --processes child opens the log to follow it: no lock, no
    # write (not even the cut of a torn tail), and each read picks up the complete records appended since
    p = tmp_path / "u.log"
    f = FileUpdateLog(p, follow=True)  # before the log exists: nothing yet, nothing created
    assert f.head() == 0 and f.read(0) == [] and f.wait(0, 0.05) == [] and not p.exists()
    w = FileUpdateLog(p)  # the writer is not kept out by followers
    with pytest.raises(UpdateLogError, match="open in another process"):
        FileUpdateLog(p)  # but by another writer
    for v in range(1, 4):
        w.append(payload(v))
    assert f.read(0) == [(v, payload(v)) for v in range(1, 4)] and f.head() == 3
    f2 = FileUpdateLog(p, follow=True)
    assert f2.read(1) == [(2, payload(2)), (3, payload(3))]
    got: list = []
    t = threading.Thread(target=lambda: got.extend(f.wait(3, 10)))
    t.start()
    time.sleep(0.1)
    w.append(payload(4))  # another process's append: seen by polling the file
    t.join(10)
    assert got == [(4, payload(4))]
    with open(p, "ab") as fh:  # half a record, as a reader may see one being written
        fh.write(_encode_record(5, payload(5))[:9])
    size = p.stat().st_size
    assert f.head() == 4 and p.stat().st_size == size  # read once whole; the follower cuts nothing
    with pytest.raises(UpdateLogError, match="follow another process's writes"):
        f.append(payload(5))
    with pytest.raises(UpdateLogError, match="follow another process's writes"):
        f.truncate_before(2)
    w.close()
    w = FileUpdateLog(p)  # a writer's restart cuts the torn tail and goes on
    assert w.head() == 4 and w.append(payload(5)) == 5
    assert f.read(4) == [(5, payload(5))]
    w.truncate_before(3)  # compaction replaces the file: followers reopen it
    w.append(payload(6))
    assert f.read(5) == [(6, payload(6))] and f.base == 3
    w.close()
    p.write_bytes(p.read_bytes()[:-3])  # cut back behind what the follower read: it must not go on
    with pytest.raises(UpdateLogError, match="cut back"):
        f.read(6)
    f.close()
    f2.close()
