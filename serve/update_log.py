"""The ordered log of accepted graph updates: a file (single server) or a Redis stream (replicas).

Every accepted update is one record: opaque bytes (a serialized ``UpdateGraphRequest``) with a
dense, monotone version ``1, 2, 3, ...`` per graph. A server replays the log on start; stateless
replicas over one Redis follow each other's updates through it. Both implementations share the
:class:`UpdateLog` protocol:

* ``append(payload, expect_version=None) -> version``: assigns ``head + 1``, stores the record
  durably (see below) before returning. With ``expect_version`` the append is refused with
  :class:`VersionConflict` unless ``head == expect_version`` (the caller holds its lock and has
  applied every earlier record, so nothing written by another writer is ever skipped).
* ``read(after=0, limit=None)``: the records with version ``> after``, ascending and dense (the
  first one is ``after + 1``). A follower always reads by version from its own last applied one,
  so a missed notification never loses a record. ``after < base`` (those records were compacted
  into a snapshot) raises :class:`RecordsCompacted`; ``after > head`` (the log is behind its
  reader: it was lost or replaced) raises :class:`UpdateLogError`; a gap raises it too.
* ``head()``: the newest version (0 = empty); ``base``: the version before the first record kept
  (0 unless compacted); ``wait(after, timeout)``: ``read`` that blocks up to ``timeout`` seconds
  until a record ``> after`` exists (``[]`` on timeout); ``size_bytes()``; ``truncate_before(v)``
  (compaction: drop records ``<= v``, ``head`` stays, ``base`` becomes ``v``); ``close()``.

File log (:class:`FileUpdateLog`)
---------------------------------
A 20-byte file header, then the records back to back (little-endian)::

    header: b"GNNULOG\\x01" | base (u64) | CRC32 of the 16 bytes before it (u32)
    record: b"GUR1" | version (u64) | length (u32) | CRC32 of version (u64) + payload (u32) | payload

Opening scans the whole file: versions must run ``base + 1, base + 2, ...`` and every CRC must
match. A damaged *last* record (short, bad CRC or zero-filled: a crash in the middle of a write)
is cut off with a WARNING; damage anywhere before the end (a valid record follows it) is
:class:`UpdateLogError` naming the byte offset, and nothing is changed. An append is one
``pwrite`` of the whole record (the file is unbuffered), so an acknowledged record survives the
process being killed (it is in the page cache); with ``fsync=True`` it is also ``fsync``-ed before
``append`` returns and survives a machine crash. A failed write is cut back off, so it never
leaves damage in front of later records. ``truncate_before`` writes the kept records into a temp
file (fsynced) and ``os.replace``-s it over the log: a crash leaves either the old or the new log.
One writer at a time: a sidecar ``<path>.lock`` is held with ``flock`` while the log is open to
write (a second writer gets :class:`UpdateLogInUse`); any number of processes may **follow** it
(``follow=True``: no lock, read-only, each read first picks up the complete records appended since).
Thread-safe.

Redis log (:class:`RedisUpdateLog`)
-----------------------------------
Keys (``<fp>`` the graph fingerprint; the ``{log}`` hash tag keeps them in one Cluster slot, so
the Lua scripts below may touch them together)::

    gnnserve:live:<fp>:{log}           stream: one entry per record, id "<version>-1", field u = payload,
                                       c = payload bytes appended so far (for size_bytes)
    gnnserve:live:<fp>:{log}:head      string: the newest version
    gnnserve:live:<fp>:{log}:base      string: the compaction base (absent = 0)
    gnnserve:live:<fp>:{log}:bytes     string: payload bytes ever appended
    gnnserve:live:<fp>:{log}:trimmed   string: payload bytes of the compacted records
    gnnserve:live:<fp>:{log}:epoch     string: a random id set by the first append (the log's identity)

``append`` is one Lua script (atomic): check the epoch (once an object has seen its log, it never
writes into another one) and ``expect_version`` against ``head``, ``XADD`` with
the explicit id ``<head + 1>-1`` (refused by Redis if the stream already holds a later id: a
damaged log is never written over), then ``INCR`` the head. ``read`` is one script returning
``head``, ``base`` and ``XRANGE <after + 1>-0 +`` together, so the checks above are made against
one consistent state. ``wait`` reads first, then blocks with ``XREAD BLOCK`` from id
``<after>-1`` (entries with a greater id: versions ``> after``) in slices shorter than the socket
timeout, and when woken reads again by version. ``truncate_before(v)``: ``XTRIM MINID <v + 1>-0``
and ``base = v`` in one script.

Durability on Redis is Redis's: an acknowledged record survives a Redis restart only with
``appendonly yes`` (and a machine crash only with ``appendfsync always``); a WARNING says so when
the server reports AOF off. If Redis loses the log anyway (restart without persistence), the head
falls behind the servers' versions: their appends get :class:`VersionConflict` naming the loss and
their reads :class:`UpdateLogError`; and once a new log was started in its place (another epoch),
every call of an object that saw the old one raises :class:`UpdateLogError`: a version number is
never silently re-used for another update.

Redis unreachable: every call fails with :class:`UpdateLogUnavailable` within the bounded retries
of :func:`serve.features.redis_store.connect` (``(retries + 1) * socket_timeout`` at worst, at once
when the connection is refused), never hangs; its message names neither the host nor the
password and says what to do. URLs (TLS, unix sockets, passwords, Cluster) are the feature
store's (:func:`serve.features.redis_store.parse_redis_url`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "FileUpdateLog",
    "RecordsCompacted",
    "RedisUpdateLog",
    "UpdateLog",
    "UpdateLogError",
    "UpdateLogInUse",
    "UpdateLogUnavailable",
    "VersionConflict",
    "log_keys",
]

log = logging.getLogger(__name__)

LIVE_PREFIX = "gnnserve:live"
_FILE_MAGIC = b"GNNULOG\x01"
_FILE_HDR = struct.Struct("<8sQI")  # magic, base, crc32(magic + base)
_REC_MAGIC = b"GUR1"
_REC_HDR = struct.Struct("<4sQII")  # magic, version, length, crc32(version + payload)
_U64 = struct.Struct("<Q")
MAX_RECORD = 1 << 30  # bytes of one payload


# =========================================================================== errors
class UpdateLogError(RuntimeError):
    """The log cannot be used as asked: damaged (not a torn tail), a version conflict, a gap."""


class UpdateLogUnavailable(UpdateLogError):
    """The log's storage (Redis) cannot be reached: the server answers UNAVAILABLE."""


class UpdateLogInUse(UpdateLogError):
    """A file log is already open (its lock is held) in another process, or elsewhere in this one."""


class VersionConflict(UpdateLogError):
    """``append(expect_version=e)`` found ``head != e``: another writer came first (``head > e``:
    apply its records and retry) or the log lost records (``head < e``)."""

    def __init__(self, message: str, *, head: int, expected: int) -> None:
        super().__init__(message)
        self.head = head
        self.expected = expected


class RecordsCompacted(UpdateLogError):
    """``read(after)`` with ``after < base``: those records were folded into a snapshot and dropped."""

    def __init__(self, message: str, *, base: int, after: int) -> None:
        super().__init__(message)
        self.base = base
        self.after = after


@runtime_checkable
class UpdateLog(Protocol):
    """What :mod:`serve.live` needs of a log (see the module docstring for the semantics)."""

    def append(self, payload: bytes, *, expect_version: int | None = None) -> int: ...

    def read(self, after: int = 0, limit: int | None = None) -> list[tuple[int, bytes]]: ...

    def head(self) -> int: ...

    def wait(self, after: int, timeout: float) -> list[tuple[int, bytes]]: ...

    def size_bytes(self) -> int: ...

    def truncate_before(self, version: int) -> None: ...

    @property
    def base(self) -> int: ...

    def close(self) -> None: ...


def _payload_bytes(payload: Any) -> bytes:
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"an update log record is bytes, got {type(payload).__name__}")
    data = bytes(payload)
    if len(data) > MAX_RECORD:
        raise ValueError(f"an update log record holds at most {MAX_RECORD} bytes, got {len(data)}")
    return data


def _check_after(after: int, limit: int | None) -> tuple[int, int | None]:
    after = int(after)
    if after < 0:
        raise ValueError(f"after must be >= 0, got {after}")
    if limit is not None:
        limit = int(limit)
        if limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
    return after, limit


#: what a log that lost records means for a restart (said with every "lost records" error): the server replays the
#: log as it now is, so what it lost stays lost
LOST_RECORDS_CONSEQUENCE = (
    "A restart replays only what the log still holds: the acknowledged updates it lost (after a Redis restart "
    "without persistence or a FLUSHALL: every update since the last snapshot in Redis) are gone for good, the graph "
    "comes back at an older version (0 when nothing is left), and graph versions and new-node ids already handed "
    "out are reused by later updates. Restore the log from a copy first if one exists; to avoid this, run Redis "
    "with persistence (appendonly yes; docs/RELIABILITY.md)")


def _conflict(head: int, expected: int, where: str) -> VersionConflict:
    if head < expected:
        msg = (f"{where}: the log ends at version {head}, behind version {expected} that the caller has applied: "
               f"the log lost records (a Redis restart without persistence, a FLUSHALL, or another log file). "
               f"{LOST_RECORDS_CONSEQUENCE}")
    else:
        msg = (f"{where}: the log is at version {head}, not {expected}: another writer appended first; apply its "
               "records and retry")
    return VersionConflict(msg, head=head, expected=expected)


def _check_range(after: int, head: int, base: int, where: str) -> None:
    if after < base:
        raise RecordsCompacted(f"{where}: records 1..{base} were compacted into a snapshot; the caller at version "
                               f"{after} must restart from that snapshot", base=base, after=after)
    if after > head:
        raise UpdateLogError(f"{where}: the log ends at version {head}, behind version {after} that the caller has "
                             f"applied: the log lost records or was replaced. {LOST_RECORDS_CONSEQUENCE}")


# =========================================================================== file log
FOLLOW_POLL_S = 0.02  # how often a follower's wait looks at the file (an fstat when nothing changed)


class FileUpdateLog:
    """Append-only file log (format and guarantees in the module docstring).

    Args:
        path: the log file (created with its directory when absent).
        fsync: ``fsync`` every append (survives a machine crash, not only the process dying).
        follow: open to **follow** the log another process writes (a second server on the repository,
            a ``--read-only`` server, ``--processes`` children): no writer's lock (a shared one on
            ``<log>.readers``, which :meth:`truncate_after` checks), nothing written to the log (no header
            for a new log, no cut of a torn tail; ``append`` and ``truncate_before`` raise), and every
            ``read`` / ``head`` / ``wait`` first picks up what the writer appended since (complete
            records only: a record being written is read once it is whole). A log replaced by the
            writer's compaction is reopened (records this follower had not applied yet are then in the
            writer's snapshot: :class:`RecordsCompacted`); a log cut back behind what was read raises
            :class:`UpdateLogError`.

        salvage: an operator's look at a log damaged before its last record (``gnnserve log``): the records
            in front of the damage are the log, :attr:`damage` says where it starts, and nothing is written
            but :meth:`truncate_after` at or before the damage (which cuts it off); ``append`` and
            ``truncate_before`` raise while it is there. Servers never open a log this way.

    Raises (constructor): :class:`UpdateLogError` when the file is damaged before its last record (unless
    ``salvage``) or is not a log; :class:`UpdateLogInUse` (a writer) when another process writes it.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False, follow: bool = False,
                 salvage: bool = False) -> None:
        self.path = Path(path)
        self.fsync = bool(fsync)
        self.follow = bool(follow)
        self.salvage = bool(salvage)
        #: with ``salvage``: the damage in front of a later valid record, where the usable log ends
        self.damage: LogDamage | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._fd = -1
        self._lock_fd = -1
        self._base, self._offsets, self._end = 0, array("q"), _FILE_HDR.size
        self._have_header = False
        self._readers_fd = -1
        if self.follow:
            self._hold_reader_lock()
            try:
                self._reopen()
            except BaseException:  # a damaged log: its shared lock would block the repair (truncate_after)
                self._release()
                raise
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UpdateLogInUse(f"update log {self.path} is open in another process (or twice in this one): "
                                     "one server writes a file log, others follow it; for several servers that "
                                     "all take updates, use a Redis log") from None
            raise
        try:
            self._open()
        except BaseException:
            self._release()
            raise

    # ---------------------------------------------------------------- opening
    def _readers_path(self) -> Path:
        return self.path.with_name(self.path.name + ".readers")

    def _hold_reader_lock(self) -> None:
        """A follower holds a shared lock on ``<log>.readers`` while open, so that an operator's
        :meth:`truncate_after` can tell it runs (the writer's own lock does not cover followers). Where the
        file cannot be made (a read-only directory, where nothing truncates the log either) it goes without."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._readers_path(), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            os.close(fd)
            return
        self._readers_fd = fd

    def _open(self) -> None:
        with contextlib.suppress(FileNotFoundError):  # a compaction that crashed before its os.replace
            os.unlink(self.path.with_name(self.path.name + ".compact.tmp"))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fd = fd
        size = os.fstat(fd).st_size
        if size < _FILE_HDR.size:
            head = os.pread(fd, size, 0)
            if head != _header(0)[:size]:  # a compacted log is never torn (os.replace): only a new one is
                raise UpdateLogError(f"{self.path} is not an update log (it starts with {head[:8]!r})")
            if size:
                log.warning("update log %s: its header was cut short (a crash while creating it): starting it "
                            "again, it held no records", self.path)
            self._write_all(_header(0), 0)
            os.ftruncate(fd, _FILE_HDR.size)
            self._sync(directory=True)
            size = _FILE_HDR.size
        self._base = self._read_header(fd)
        self._offsets = array("q")
        self._end = _FILE_HDR.size
        self._scan(size)

    def _read_header(self, fd: int) -> int:
        """The log's base version, from a header that must be whole and valid."""
        magic, base, crc = _FILE_HDR.unpack(os.pread(fd, _FILE_HDR.size, 0))
        if magic != _FILE_MAGIC:
            raise UpdateLogError(f"{self.path} is not an update log (it starts with {magic!r})")
        if crc != zlib.crc32(_FILE_HDR.pack(magic, base, 0)[:16]):
            raise UpdateLogError(f"update log {self.path}: its header (byte offset 0) fails its CRC")
        return int(base)

    def _scan(self, size: int) -> None:
        """Index every record from :attr:`_end` on; a writer cuts a torn tail off, a follower leaves it
        (the writer may be writing it); damage before the end is refused."""
        if size <= self._end:
            return
        with mmap.mmap(self._fd, size, prot=mmap.PROT_READ) as mm:
            off = self._end
            expect = self._head + 1
            while off < size:
                problem = _record_problem(mm, off, size)
                if problem is None:
                    _, version, length, _ = _REC_HDR.unpack_from(mm, off)
                    if version != expect:
                        if self.salvage:  # a record missing or repeated: the usable log ends in front of it
                            self.damage = LogDamage(off, f"version {version} where {expect} belongs", off,
                                                    _versions_from(mm, off, size), size)
                            self._end = off
                            return
                        raise UpdateLogError(f"update log {self.path}: the record at byte offset {off} has version "
                                             f"{version}, expected {expect} (versions must be dense): 'gnnserve log "
                                             "show' lists the records in front of it and 'gnnserve log truncate' cuts "
                                             "the rest off; or restore the log from a copy")
                    self._offsets.append(off)
                    off += _REC_HDR.size + length
                    expect += 1
                    continue
                later = _next_valid_record(mm, off + 1, size)
                if later is not None:
                    if self.salvage:
                        self.damage = LogDamage(off, problem, later, _versions_from(mm, later, size), size)
                        self._end = off
                        return
                    raise UpdateLogError(f"update log {self.path} is damaged at byte offset {off} ({problem}); a "
                                         f"valid record follows at byte offset {later}, so this is not a torn "
                                         "write: 'gnnserve log show' lists the records in front of the damage and "
                                         "'gnnserve log truncate' cuts the rest off; or restore the log from a copy "
                                         "or rebuild the graph from a snapshot")
                break
        if off < size and not self.follow:
            log.warning("update log %s: cut off %d bytes of a torn last record at byte offset %d (a crash in "
                        "the middle of a write; that update was never acknowledged)", self.path, size - off, off)
            os.ftruncate(self._fd, off)
            self._sync()
        self._end = off

    # ---------------------------------------------------------------- following
    def _reopen(self) -> None:
        """A follower's (re)open: the log as it is now, or nothing while it does not exist."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self._base, self._offsets, self._end = 0, array("q"), _FILE_HDR.size
        self._have_header = False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # nothing logged yet
        self._fd = fd
        size = os.fstat(fd).st_size
        if size < _FILE_HDR.size:  # a log being created: no records yet
            head = os.pread(fd, size, 0)
            if head != _header(0)[:size]:
                raise UpdateLogError(f"{self.path} is not an update log (it starts with {head[:8]!r})")
            return
        self._have_header = True
        self._base = self._read_header(fd)
        self._scan(size)

    def _refresh(self) -> None:
        """A follower: pick up what the writer appended (or a log it created or replaced) since the last
        look. Called under :attr:`_lock`."""
        if not self.follow:
            return
        try:
            ino = os.stat(self.path).st_ino
        except FileNotFoundError:
            return  # not created yet (or between a compaction's unlink and rename: look again later)
        if self._fd < 0 or not self._have_header or ino != os.fstat(self._fd).st_ino:
            head = self._head
            self._reopen()  # created, or replaced by a compaction (os.replace): a new file
            if self._head < head:
                raise UpdateLogError(f"update log {self.path} was replaced by one that ends at version "
                                     f"{self._head}, behind version {head} this server read: restart it")
            return
        size = os.fstat(self._fd).st_size
        if size < self._end:
            raise UpdateLogError(f"update log {self.path} was cut back to {size} bytes, behind the {self._end} this "
                                 "server read (records it applied are gone): restart it")
        self._scan(size)

    # ---------------------------------------------------------------- helpers
    def _write_all(self, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def _sync(self, *, directory: bool = False) -> None:
        if not self.fsync:
            return
        os.fsync(self._fd)
        if directory:
            fsync_dir(self.path.parent)

    def _check_open(self) -> None:
        if self._closed:
            raise UpdateLogError(f"update log {self.path} is closed")

    def _check_writable(self, repair: bool = False) -> None:
        if self.follow:
            raise UpdateLogError(f"update log {self.path} is open to follow another process's writes, not to write")
        if self.damage is not None and not repair:
            raise UpdateLogError(f"update log {self.path} is damaged at byte offset {self.damage.offset}: only "
                                 "truncate_after (at or before the damage) writes it")

    @property
    def _head(self) -> int:
        return self._base + len(self._offsets)

    # ---------------------------------------------------------------- API
    @property
    def base(self) -> int:
        return self._base

    def head(self) -> int:
        with self._lock:
            self._refresh()
            return self._head

    def size_bytes(self) -> int:
        with self._lock:
            return self._end

    def append(self, payload: bytes, *, expect_version: int | None = None) -> int:
        data = _payload_bytes(payload)
        with self._lock:
            self._check_open()
            self._check_writable()
            head = self._head
            if expect_version is not None and int(expect_version) != head:
                raise _conflict(head, int(expect_version), f"update log {self.path}")
            version = head + 1
            rec = _encode_record(version, data)
            off = self._end
            try:
                self._write_all(rec, off)
                self._sync()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, off)  # no partial record in front of later ones
                raise UpdateLogError(f"update log {self.path}: writing record {version} failed ({exc}); it was "
                                     "not stored") from None
            self._offsets.append(off)
            self._end = off + len(rec)
            self._cond.notify_all()
            return version

    def truncate_after(self, version: int) -> int:
        """Drop every record after ``version`` (an operator's repair, ``gnnserve log truncate``: a record
        that fails on replay and the ones after it); returns how many. A writer only, so no server writes
        the log meanwhile; records compacted into the snapshot (``version < base``) cannot be dropped."""
        with self._lock:
            self._check_open()
            self._check_writable(repair=True)
            head, base = self._head, self._base
            version = int(version)
            if version < base:
                raise UpdateLogError(f"update log {self.path}: versions up to {base} are compacted into the "
                                     f"snapshot; the log holds {base + 1}..{head}")
            if version >= head and self.damage is None:
                return 0
            version = min(version, head)
            if not self._no_followers():
                raise UpdateLogInUse(f"update log {self.path} is followed by a running server (a --read-only one, "
                                     "a --processes child, or a second server on the repository) or read by a "
                                     "'gnnserve log show': stop it first")
            # where record version + 1 starts (the damage, when it is the next thing)
            cut = self._offsets[version - base] if version < head else self._end
            os.ftruncate(self._fd, cut)
            self._sync()
            del self._offsets[version - base:]
            self._end = cut
            if self.damage is not None:
                log.warning("update log %s: the damage at byte offset %d and every byte after it dropped",
                            self.path, self.damage.offset)
                self.damage = None
            log.info("update log %s: records %d..%d dropped (truncated after version %d)", self.path,
                     version + 1, head, version)
            return head - version

    def _no_followers(self) -> bool:
        """Whether no process follows this log now (:meth:`_hold_reader_lock`)."""
        try:
            fd = os.open(self._readers_path(), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        finally:
            os.close(fd)  # releases the lock too
        return True

    def read(self, after: int = 0, limit: int | None = None) -> list[tuple[int, bytes]]:
        after, limit = _check_after(after, limit)
        with self._lock:
            self._check_open()
            self._refresh()
            return self._read_locked(after, limit)

    def _read_locked(self, after: int, limit: int | None) -> list[tuple[int, bytes]]:
        head = self._head
        _check_range(after, head, self._base, f"update log {self.path}")
        first = after - self._base  # index of record after + 1
        last = head - self._base if limit is None else min(head - self._base, first + limit)
        if first >= last:
            return []
        lo = self._offsets[first]
        hi = self._offsets[last] if last < len(self._offsets) else self._end
        buf = os.pread(self._fd, hi - lo, lo)
        out: list[tuple[int, bytes]] = []
        pos = 0
        for i in range(first, last):
            magic, version, length, crc = _REC_HDR.unpack_from(buf, pos)
            payload = buf[pos + _REC_HDR.size : pos + _REC_HDR.size + length]
            if (magic != _REC_MAGIC or version != self._base + 1 + i or len(payload) != length
                    or zlib.crc32(payload, zlib.crc32(_U64.pack(version))) != crc):
                raise UpdateLogError(f"update log {self.path}: the record at byte offset {lo + pos} changed on "
                                     "disk since it was written (CRC or framing mismatch)")
            out.append((int(version), payload))
            pos += _REC_HDR.size + length
        return out

    def wait(self, after: int, timeout: float, *, limit: int | None = 1024) -> list[tuple[int, bytes]]:
        """Records ``> after`` (at most ``limit``), waiting up to ``timeout`` s for an append of this
        process (a follower: looking at the file every :data:`FOLLOW_POLL_S`); ``[]`` on timeout or when
        the log is closed meanwhile."""
        after, limit = _check_after(after, limit)
        deadline = time.monotonic() + max(0.0, float(timeout))
        with self._cond:
            self._check_open()
            self._refresh()
            while self._head <= after:
                _check_range(after, self._head, self._base, f"update log {self.path}")
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return []
                self._cond.wait(min(left, FOLLOW_POLL_S) if self.follow else left)
                if self._closed:
                    return []
                self._refresh()
            return self._read_locked(after, limit)

    def truncate_before(self, version: int) -> None:
        version = int(version)
        with self._lock:
            self._check_open()
            self._check_writable()
            if version <= self._base:
                return
            if version > self._head:
                raise ValueError(f"cannot compact update log {self.path} up to version {version}: its head is "
                                 f"{self._head}")
            k = version - self._base  # records kept start at index k
            keep_from = self._offsets[k] if k < len(self._offsets) else self._end
            tmp = self.path.with_name(self.path.name + ".compact.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, _header(version))
                pos = keep_from
                while pos < self._end:
                    chunk = os.pread(self._fd, min(8 << 20, self._end - pos), pos)
                    if not chunk:
                        raise UpdateLogError(f"update log {self.path} shrank while being compacted")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                    pos += len(chunk)
                os.fsync(fd)  # the rename must never expose an empty file
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
            new_fd = os.open(self.path, os.O_RDWR)
            os.close(self._fd)
            self._fd = new_fd
            shift = keep_from - _FILE_HDR.size
            self._offsets = array("q", (o - shift for o in self._offsets[k:]))
            self._end -= shift
            self._base = version
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._release()

    def _release(self) -> None:
        if self._fd >= 0 and not self._closed:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._closed = True
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = -1
        if self._readers_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._readers_fd)
            self._readers_fd = -1

    def __enter__(self) -> FileUpdateLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileUpdateLog({str(self.path)!r}, base={self._base}, head={self._head}, fsync={self.fsync})"


def _header(base: int) -> bytes:
    body = _FILE_HDR.pack(_FILE_MAGIC, base, 0)[:16]
    return body + struct.pack("<I", zlib.crc32(body))


def _encode_record(version: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(_U64.pack(version)))
    return _REC_HDR.pack(_REC_MAGIC, version, len(payload), crc) + payload


def _record_problem(mm: Any, off: int, size: int) -> str | None:
    """Why the record at ``off`` is not valid (``None``: it is)."""
    if size - off < _REC_HDR.size:
        return f"{size - off} bytes left, shorter than a record header"
    magic, version, length, crc = _REC_HDR.unpack_from(mm, off)
    if magic != _REC_MAGIC:
        return f"bad record magic {bytes(magic)!r}"
    if length > MAX_RECORD:
        return f"record length {length} over the limit"
    end = off + _REC_HDR.size + length
    if end > size:
        return f"record of {length} bytes runs past the end of the file"
    if zlib.crc32(mm[off + _REC_HDR.size : end], zlib.crc32(_U64.pack(version))) != crc:
        return "CRC mismatch"
    return None


@dataclass(frozen=True)
class LogDamage:
    """Where a file log is damaged in front of a later valid record (:attr:`FileUpdateLog.damage`)."""

    offset: int  # byte offset of the damage: the usable log ends here
    problem: str  # what is wrong there (:func:`_record_problem`)
    next_valid: int  # byte offset of the first valid record after it
    later_versions: tuple[int, ...]  # versions of the valid records from there on, as far as they run back to back
    size: int  # the file's size: ``size - offset`` bytes would be cut off


def _versions_from(mm: Any, off: int, size: int) -> tuple[int, ...]:
    """Versions of the valid records back to back from ``off`` (a damaged log's later records)."""
    out = []
    while off < size and _record_problem(mm, off, size) is None:
        _, version, length, _ = _REC_HDR.unpack_from(mm, off)
        out.append(int(version))
        off += _REC_HDR.size + length
    return tuple(out)


def _next_valid_record(mm: Any, start: int, size: int) -> int | None:
    """Offset of the first valid record at or after ``start`` (a torn tail is never followed by one).

    Any valid record counts, whatever its version: bytes removed from the middle of a file (a bad copy, a
    hand edit) leave later records whose versions no count of the bytes left can bound, and taking them
    for a torn tail would cut acknowledged records. The price: a torn record whose own payload holds a
    whole valid record (an update carrying such bytes, and a crash in the middle of writing it) is refused
    as damage too, and ``gnnserve log truncate`` repairs it."""
    pos = start
    while True:
        pos = mm.find(_REC_MAGIC, pos, size)
        if pos < 0:
            return None
        if _record_problem(mm, pos, size) is None:
            return pos
        pos += 1


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


# =========================================================================== Redis log
def log_keys(fingerprint: str) -> dict[str, str]:
    """The Redis keys of a graph's log (see the module docstring)."""
    if not fingerprint or any(c in fingerprint for c in "{}: \n"):
        raise ValueError(f"bad graph fingerprint {fingerprint!r}")
    stream = f"{LIVE_PREFIX}:{fingerprint}:{{log}}"
    return {"stream": stream, "head": f"{stream}:head", "base": f"{stream}:base", "bytes": f"{stream}:bytes",
            "trimmed": f"{stream}:trimmed", "epoch": f"{stream}:epoch"}


# KEYS: stream, head, bytes, epoch; ARGV: payload, expected head ('' = any), epoch for a new log,
# expected epoch ('' = the caller has seen none yet), the record's token ('' = none: an append sent again after a
# lost answer finds its own record, right after the expected head, by it and answers 'ok' instead of a conflict)
_APPEND = """
local epoch = redis.call('GET', KEYS[4])
if ARGV[4] ~= '' and epoch ~= ARGV[4] then
  return {'epoch', epoch or ''}
end
local head = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= head then
  if ARGV[5] and ARGV[5] ~= '' and head > tonumber(ARGV[2]) then
    local id = string.format('%d-1', tonumber(ARGV[2]) + 1)
    local r = redis.call('XRANGE', KEYS[1], id, id)
    if r[1] then
      local f = r[1][2]
      for i = 1, #f - 1, 2 do
        if f[i] == 't' and f[i + 1] == ARGV[5] then
          return {'ok', string.format('%d', tonumber(ARGV[2]) + 1), epoch or ''}
        end
      end
    end
  end
  return {'conflict', string.format('%d', head), epoch or ''}
end
if not epoch then redis.call('SET', KEYS[4], ARGV[3]) end
local v = head + 1
local total = redis.call('INCRBY', KEYS[3], 0) + string.len(ARGV[1])
local r
if ARGV[5] and ARGV[5] ~= '' then
  r = redis.pcall('XADD', KEYS[1], string.format('%d-1', v), 'u', ARGV[1], 'c', string.format('%d', total), 't', ARGV[5])
else
  r = redis.pcall('XADD', KEYS[1], string.format('%d-1', v), 'u', ARGV[1], 'c', string.format('%d', total))
end
if type(r) == 'table' and r.err then
  return {'damaged', r.err}
end
redis.call('SET', KEYS[3], string.format('%d', total))
return {'ok', string.format('%d', redis.call('INCR', KEYS[2])), redis.call('GET', KEYS[4])}
"""

# KEYS: stream, head, base, epoch; ARGV: first id, count ('' = all)
_READ = """
local head = redis.call('GET', KEYS[2]) or '0'
local base = redis.call('GET', KEYS[3]) or '0'
local epoch = redis.call('GET', KEYS[4]) or ''
local recs
if ARGV[2] == '' then
  recs = redis.call('XRANGE', KEYS[1], ARGV[1], '+')
else
  recs = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
end
return {head, base, recs, epoch}
"""

# KEYS: stream, head, base, trimmed; ARGV: version
_TRUNCATE = """
local head = tonumber(redis.call('GET', KEYS[2]) or '0')
local base = tonumber(redis.call('GET', KEYS[3]) or '0')
local v = tonumber(ARGV[1])
if v <= base then return {'ok', string.format('%d', base)} end
if v > head then return {'ahead', string.format('%d', head)} end
local e = redis.call('XRANGE', KEYS[1], string.format('%d-1', v), string.format('%d-1', v))
if #e == 0 then return {'damaged', string.format('record %d is missing', v)} end
local fields = e[1][2]
local c = nil
for i = 1, #fields, 2 do if fields[i] == 'c' then c = fields[i + 1] end end
if not c then return {'damaged', string.format('record %d has no byte count', v)} end
redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d-0', v + 1))
redis.call('SET', KEYS[3], string.format('%d', v))
redis.call('SET', KEYS[4], c)
return {'ok', string.format('%d', v)}
"""


def _b2s(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


class RedisUpdateLog:
    """A graph's update log in Redis (schema and guarantees in the module docstring).

    Args:
        url: any URL :func:`serve.features.redis_store.parse_redis_url` accepts (TLS, unix socket,
            password, ``redis+cluster://``).
        graph_fingerprint: the graph's fingerprint (the log's key).
        client: an existing redis-py client (not closed by :meth:`close`).
        socket_timeout, connect_timeout, retries: of the client made here; a call on an
            unreachable Redis fails within about ``(retries + 1) * socket_timeout``.
        block_slice: seconds one ``XREAD BLOCK`` of :meth:`wait` lasts at most (default half the
            socket timeout, so a blocked read never looks like a dead server).
        wait_limit: records :meth:`wait` returns at most.
    """

    def __init__(self, url: str, graph_fingerprint: str, *, client: Any = None, socket_timeout: float = 1.0,
                 connect_timeout: float = 0.5, retries: int = 2, block_slice: float | None = None,
                 wait_limit: int = 1024) -> None:
        from .redisdata.connection import connect, parse_redis_url

        self._target = parse_redis_url(url)
        self.fingerprint = graph_fingerprint
        self.keys = log_keys(graph_fingerprint)
        self._owns = client is None
        self._closed = False
        self._epoch: str | None = None  # the log's identity, from the first answer that carries one
        self.wait_limit = int(wait_limit)
        self.block_slice = float(block_slice) if block_slice is not None else max(0.01, socket_timeout / 2)
        if client is None:
            with self._errors("connecting to the update log"):
                client = connect(self._target, socket_timeout=socket_timeout, connect_timeout=connect_timeout,
                                 retries=retries)
        self._client = client
        self._append = client.register_script(_APPEND)
        self._read = client.register_script(_READ)
        self._truncate = client.register_script(_TRUNCATE)
        self._warn_without_aof()

    # ---------------------------------------------------------------- errors
    def _clean(self, text: str) -> str:
        """``text`` without the URL, the host names, the socket path or the password."""
        t = self._target
        out = t.scrub(text).replace(t.masked, "<redis>")
        hosts = sorted({f"{h}:{p}" for h, p in t.nodes} | {h for h, _ in t.nodes} | ({t.path} if t.path else set()),
                       key=len, reverse=True)
        for h in hosts:
            if h:
                out = out.replace(h, "<redis>")
        return out

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        from .features.base import FeatureStoreError, FeatureUnavailable
        from .redisdata.errors import redis_errors

        try:
            with redis_errors(self._target, what):
                yield
        except UpdateLogError:
            raise
        except FeatureUnavailable as exc:
            raise UpdateLogUnavailable(
                f"{self._clean(str(exc))}: graph updates are refused until the update log's Redis answers again; "
                "check that it is running and reachable and that the URL's credentials are right, then retry"
            ) from None
        except FeatureStoreError as exc:  # WRONGTYPE: a key of the log holds something else
            raise UpdateLogError(f"update log of graph {self.fingerprint} is damaged: {self._clean(str(exc))}") from None

    def _warn_without_aof(self) -> None:
        try:
            info = self._client.info("persistence")
        except Exception:  # INFO may be disabled (managed Redis) or Redis down: appends will say so
            return
        vals = [info] if "aof_enabled" in info else [v for v in info.values() if isinstance(v, dict)]
        if any(str(v.get("aof_enabled", "1")) == "0" for v in vals):
            log.warning("update log of graph %s: Redis runs without appendonly, so acknowledged updates are lost "
                        "if it restarts (servers then refuse new updates: the log is behind them); set "
                        "appendonly yes (appendfsync always to survive a machine crash)", self.fingerprint)

    def _check_open(self) -> None:
        if self._closed:
            raise UpdateLogError(f"update log of graph {self.fingerprint} is closed")

    def _check_epoch(self, epoch: Any) -> None:
        """The log must stay the one this object first saw: a log that Redis lost and a server
        started again re-uses version numbers for other updates."""
        e = _b2s(epoch) if epoch is not None else ""
        if self._epoch is None:
            if e:
                self._epoch = e
            return
        if e != self._epoch:
            raise UpdateLogError(f"{self._where} was lost and started again ({'another' if e else 'no'} log "
                                 "in its place): this server's graph holds updates of the old one; restart it "
                                 "(from a snapshot) to follow the new log")

    @property
    def _where(self) -> str:
        return f"update log of graph {self.fingerprint}"

    # ---------------------------------------------------------------- API
    def append(self, payload: bytes, *, expect_version: int | None = None) -> int:
        self._check_open()
        data = _payload_bytes(payload)
        k = self.keys
        exp = "" if expect_version is None else str(int(expect_version))
        # the record's token: redis-py sends the script again after a timeout (TransientRetry), and the first may
        # have run, its answer lost; with expect_version the second then finds its own record right after the
        # expected head and answers it instead of a conflict, after which the writer would apply it twice
        token = os.urandom(12).hex() if exp else ""
        with self._errors("appending to the update log"):
            status, value, *rest = self._append(keys=[k["stream"], k["head"], k["bytes"], k["epoch"]],
                                                args=[data, exp, os.urandom(12).hex(), self._epoch or "", token])
        status, value = _b2s(status), _b2s(value)
        if status == "epoch":
            self._check_epoch(value)
        elif status in ("ok", "conflict"):
            self._check_epoch(rest[0])
        if status == "conflict":
            raise _conflict(int(value), int(exp), self._where)
        if status != "ok":
            raise UpdateLogError(f"{self._where} is damaged: Redis refused the next record ({self._clean(value)}); "
                                 "its head counter is behind its stream")
        return int(value)

    def _read_raw(self, after: int, limit: int | None) -> list[tuple[int, bytes]]:
        k = self.keys
        with self._errors("reading the update log"):
            head, base, recs, epoch = self._read(keys=[k["stream"], k["head"], k["base"], k["epoch"]],
                                                 args=[f"{after + 1}-0", "" if limit is None else str(limit)])
        head, base = int(_b2s(head)), int(_b2s(base))
        _check_range(after, head, base, self._where)
        self._check_epoch(epoch)
        out: list[tuple[int, bytes]] = []
        for i, (rid, fields) in enumerate(recs):
            want = after + 1 + i
            if _b2s(rid) != f"{want}-1":
                raise UpdateLogError(f"{self._where}: record {want} is missing (found id {_b2s(rid)}): the log is "
                                     "damaged; rebuild the graph from a snapshot")
            payload = None
            for j in range(0, len(fields) - 1, 2):
                if _b2s(fields[j]) == "u":
                    payload = fields[j + 1]
            if payload is None:
                raise UpdateLogError(f"{self._where}: record {want} has no payload field")
            out.append((want, bytes(payload)))
        expected = head - after if limit is None else min(limit, head - after)
        if len(out) < expected:
            raise UpdateLogError(f"{self._where}: the head is {head} but records from {after + len(out) + 1} on are "
                                 "missing from the stream (Redis lost data or the stream was trimmed by hand)")
        return out

    def read(self, after: int = 0, limit: int | None = None) -> list[tuple[int, bytes]]:
        after, limit = _check_after(after, limit)
        self._check_open()
        return self._read_raw(after, limit)

    def head(self) -> int:
        self._check_open()
        with self._errors("reading the update log's head"):
            v = self._client.get(self.keys["head"])
        return int(_b2s(v)) if v is not None else 0

    @property
    def base(self) -> int:
        self._check_open()
        with self._errors("reading the update log's base"):
            v = self._client.get(self.keys["base"])
        return int(_b2s(v)) if v is not None else 0

    def wait(self, after: int, timeout: float) -> list[tuple[int, bytes]]:
        """Records ``> after`` (at most ``wait_limit``), blocking up to ``timeout`` s; ``[]`` on timeout."""
        after, _ = _check_after(after, None)
        recs = self.read(after, self.wait_limit)
        if recs:
            return recs
        deadline = time.monotonic() + max(0.0, float(timeout))
        stream = self.keys["stream"]
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            ms = max(1, int(1000 * min(left, self.block_slice)))
            with self._errors("waiting on the update log"):
                got = self._client.xread({stream: f"{after}-1"}, count=1, block=ms)
            if got:
                return self.read(after, self.wait_limit)  # by version: never skips one
        return []

    def size_bytes(self) -> int:
        """Payload bytes of the records kept (not Redis's own overhead)."""
        self._check_open()
        with self._errors("reading the update log's size"):
            total, trimmed = self._client.mget([self.keys["bytes"], self.keys["trimmed"]])
        return int(_b2s(total or b"0")) - int(_b2s(trimmed or b"0"))

    def truncate_before(self, version: int) -> None:
        self._check_open()
        version = int(version)
        k = self.keys
        with self._errors("compacting the update log"):
            status, value = self._truncate(keys=[k["stream"], k["head"], k["base"], k["trimmed"]], args=[version])
        status, value = _b2s(status), _b2s(value)
        if status == "ahead":
            raise ValueError(f"cannot compact the {self._where} up to version {version}: its head is {value}")
        if status != "ok":
            raise UpdateLogError(f"{self._where} is damaged: {value}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns:
            with contextlib.suppress(Exception):
                self._client.close()

    def __enter__(self) -> RedisUpdateLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisUpdateLog({self._target.masked!r}, {self.fingerprint!r})"
