"""serve.live.RWLock on its own: readers share, a writer waits for them and goes before new readers, and
``try_acquire_read`` never waits (the event loop's inline batches use it)."""

from __future__ import annotations

import threading
import time

from serve.live import RWLock


def _wait_for(cond, what: str, timeout: float = 10.0) -> None:
    t_end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < t_end, what
        time.sleep(0.002)


def test_try_read_takes_a_free_or_shared_lock_and_refuses_a_wanted_one():
    lock = RWLock()
    assert lock.try_acquire_read() and lock.try_acquire_read()  # readers share
    assert lock._readers == 2
    in_write, release = threading.Event(), threading.Event()

    def writer() -> None:
        with lock.write():
            in_write.set()
            release.wait(10)

    th = threading.Thread(target=writer)
    th.start()
    _wait_for(lambda: lock._writers_waiting == 1, "the writer never queued")
    assert not lock.try_acquire_read()  # a writer waits: no new reader, and nothing was taken
    assert lock._readers == 2 and not in_write.is_set()
    lock.release_read()
    lock.release_read()
    assert in_write.wait(10)
    assert not lock.try_acquire_read() and lock._readers == 0  # a writer holds it
    blocked = threading.Thread(target=lock.acquire_read)  # the blocking call waits for the writer
    blocked.start()
    time.sleep(0.05)
    assert blocked.is_alive()
    release.set()
    th.join(10)
    blocked.join(10)
    assert not blocked.is_alive() and lock._readers == 1
    assert lock.try_acquire_read() and lock._readers == 2
