"""Dynamic batching: a plain object over a queue and a clock, tested without a server.

Requests (``WorkItem``s) wait in a bounded queue. One batch at a time runs ``process`` in a
worker thread; while it runs, new requests pile up and the next batch takes them all (up to
``max_batch_targets`` targets). ``max_delay_s`` optionally holds a batch open a little longer to
let more requests join (0 = never wait: the lowest single-request latency). Items carry a ``key``:
only items with the same key share a batch (e.g. same model version and sampling width, since
one forward pass runs at one width).

Guarantees:
* the queue is bounded in targets and in estimated work (``WorkItem.work``): ``submit`` raises
  :class:`~serve.errors.Overloaded` at once when it is full, so overload turns into
  RESOURCE_EXHAUSTED instead of unbounded latency/memory;
* an item whose deadline has passed, or whose caller went away, is dropped before its batch runs
  (its future gets :class:`~serve.errors.DeadlineExceeded` / is left cancelled);
* an exception from ``process`` fails exactly the items of that batch;
* ``stop()`` refuses new work and lets queued and running work finish (graceful drain).

``inline_max_targets``: a batch of at most that many targets, taken when nothing else waits, runs
on the event loop itself instead of the worker thread. It skips two thread hand-offs (the worker's
wake-up and the loop's wake-up for the result), most of what an idle server adds to a one-node
request beyond its compute; requests that arrive meanwhile wait in the socket and batch together
next. Only for a ``process`` that never waits on I/O (in-memory features, a local graph): it blocks
the loop while it runs, so the batch's estimated work must also be at most ``inline_max_work`` (a
one-target request can still be expensive: an exact pass over a hub's neighbourhood). An inline batch
runs ``process_inline``, which may refuse by raising :class:`WouldBlock` before it does anything (the
live graph's read lock is wanted by an update): the batch then goes to the worker as any other, so a
wait never holds the loop and with it every other model and the health checks.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import DeadlineExceeded, Overloaded, Unavailable

__all__ = ["DynamicBatcher", "WorkItem", "WouldBlock"]

log = logging.getLogger(__name__)


class WouldBlock(Exception):
    """Raised by a ``process_inline`` that cannot start its batch without waiting; the batcher runs the
    batch in its worker instead (with ``process``, which waits rather than raise it: raised there, it would
    fail the batch's items like any other exception)."""


@dataclass(eq=False)
class WorkItem:
    """One request in the queue. ``size`` = its number of targets."""

    payload: Any
    size: int
    key: Hashable
    deadline: float | None  # on the batcher's clock; None = no deadline
    enqueued: float
    future: asyncio.Future[Any]
    work: int = 0  # estimated cost (edges aggregated); admission and the inline decision use it
    started: float = field(default=0.0)  # when its batch began (queue time = started - enqueued)
    batch_size: int = 0  # targets in the batch it ran in


class DynamicBatcher:
    """Collects :class:`WorkItem`s into batches and runs ``process(items) -> results`` in a thread.

    Args:
        process: called in a worker thread with the items of one batch; returns one result per
            item (an ``Exception`` instance in a slot fails just that item).
        max_batch_targets: targets per batch (a single larger item still runs, alone).
        max_queue_targets: bound of the queue in targets; beyond it ``submit`` raises ``Overloaded``.
        max_delay_s: how long a batch may wait for more items after its first one.
        executor: where ``process`` runs (default: a private single-thread pool).
        inline_max_targets: batches up to this size run on the event loop when nothing else
            waits (module docstring); 0 = always in ``executor``.
        inline_max_work: and only when their items' estimated work adds up to at most this
            (``None``: no bound): an expensive batch of few targets (an exact-width request on a
            hub, new nodes with long neighbour lists) must not block the loop.
        process_inline: what an inline batch calls on the loop (default ``process``); it raises
            :class:`WouldBlock`, having done nothing, where it would have to wait, and the batch
            runs in ``executor`` instead (counted in ``batches_deferred``).
        max_queue_work: bound of the queue in estimated work (``None``: none); like the target
            bound, beyond it ``submit`` raises ``Overloaded``.
        clock: monotonic clock in seconds (deadlines are on this clock).
        name: for logs and error messages.
        on_queue: called with :attr:`queued_targets` on the event loop whenever the queue changed (an item
            queued, a batch taken, items dropped for their deadline or a cancelled caller, the queue failed at
            stop): a gauge of it never keeps a value the queue no longer has.
    """

    def __init__(
        self,
        process: Callable[[list[WorkItem]], Sequence[Any]],
        *,
        max_batch_targets: int = 1024,
        max_queue_targets: int = 16384,
        max_delay_s: float = 0.0,
        executor: concurrent.futures.Executor | None = None,
        inline_max_targets: int = 0,
        inline_max_work: int | None = None,
        max_queue_work: int | None = None,
        process_inline: Callable[[list[WorkItem]], Sequence[Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "batcher",
        on_queue: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch_targets < 1 or max_queue_targets < 1 or max_delay_s < 0 or inline_max_targets < 0:
            raise ValueError("max_batch_targets and max_queue_targets must be >= 1, max_delay_s and "
                             "inline_max_targets >= 0")
        self.inline_max_targets = inline_max_targets
        self.inline_max_work = math.inf if inline_max_work is None else inline_max_work
        self.max_queue_work = math.inf if max_queue_work is None else max_queue_work
        self._queued_work = 0
        self.batches_inline = 0
        self.batches_worker = 0  # batches sent to the executor (each counter only grows: /metrics reads them)
        self.batches_deferred = 0  # of those, batches due inline that refused (WouldBlock)
        self._process = process
        self._process_inline = process if process_inline is None else process_inline
        self.max_batch_targets = max_batch_targets
        self.max_queue_targets = max_queue_targets
        self.max_delay_s = max_delay_s
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self._clock = clock
        self.name = name
        self._on_queue = on_queue
        self._queue: collections.deque[WorkItem] = collections.deque()
        self._queued_targets = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._running_batch = False
        self.batches_run = 0
        self.items_dropped = 0

    # ------------------------------------------------------------------ public API
    @property
    def queued_targets(self) -> int:
        return self._queued_targets

    @property
    def queued_requests(self) -> int:
        """Requests waiting for a batch (not those of the batch running)."""
        return len(self._queue)

    @property
    def idle(self) -> bool:
        return not self._queue and not self._running_batch

    def start(self) -> None:
        """Start the batching loop on the running event loop (idempotent)."""
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"{self.name}-loop")

    async def submit(self, payload: Any, *, size: int, key: Hashable = None, deadline: float | None = None,
                     work: int = 0) -> Any:
        """Queue one request and wait for its result (raises what its processing raised).
        ``work``: its estimated cost, in the unit of ``max_queue_work`` / ``inline_max_work``."""
        if self._closing:
            raise Unavailable(f"{self.name}: shutting down, not accepting new requests")
        self.start()
        if self._queued_targets + size > self.max_queue_targets and self._queued_targets > 0:
            raise Overloaded(
                f"{self.name}: queue full ({self._queued_targets} targets waiting, limit "
                f"{self.max_queue_targets}); retry with backoff"
            )
        if self._queued_work + work > self.max_queue_work and self._queued_work > 0:
            raise Overloaded(
                f"{self.name}: queue full ({self._queued_work} units of work waiting, limit "
                f"{self.max_queue_work}); retry with backoff"
            )
        loop = asyncio.get_running_loop()
        item = WorkItem(payload, size, key, deadline, self._clock(), loop.create_future(), work)
        self._queue.append(item)
        self._queued_targets += size
        self._queued_work += work
        self._observe_queue()
        assert self._wakeup is not None
        self._wakeup.set()
        return await item.future

    async def stop(self, grace_s: float | None = None) -> None:
        """Refuse new work; let queued and running batches finish (within ``grace_s`` if given)."""
        self._closing = True
        if self._task is not None:
            assert self._wakeup is not None
            self._wakeup.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace_s)
            except asyncio.TimeoutError:
                log.warning("%s: grace period over with %d targets queued; cancelling", self.name,
                            self._queued_targets)
                self._task.cancel()
                self._fail_queued(Unavailable(f"{self.name}: server shut down before the request ran"))
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ internals
    def _release(self, it: WorkItem) -> None:
        """Take a dequeued item's targets and work off the queue's totals."""
        self._queued_targets -= it.size
        self._queued_work -= it.work

    def _fail_queued(self, exc: BaseException) -> None:
        while self._queue:
            it = self._queue.popleft()
            self._release(it)
            if not it.future.done():
                it.future.set_exception(exc)
        self._observe_queue()

    def _observe_queue(self) -> None:
        """Tell ``on_queue`` the queue's size now (a failing observer never stops the batching loop)."""
        if self._on_queue is not None:
            try:
                self._on_queue(self._queued_targets)
            except Exception:
                log.exception("%s: observing the queue failed", self.name)

    def _take_batch(self) -> list[WorkItem]:
        """Pop the first live item and every later item with its key, up to the target limit."""
        now = self._clock()
        batch: list[WorkItem] = []
        kept: collections.deque[WorkItem] = collections.deque()
        targets = 0
        key: Hashable = None
        while self._queue:
            it = self._queue.popleft()
            if it.future.done():  # caller cancelled (client went away)
                self._release(it)
                self.items_dropped += 1
                continue
            if it.deadline is not None and it.deadline <= now:
                self._release(it)
                self.items_dropped += 1
                it.future.set_exception(
                    DeadlineExceeded(f"deadline passed after {1e3 * (now - it.enqueued):.1f} ms in the queue; dropped")
                )
                continue
            if not batch:
                key = it.key
            elif it.key != key or targets + it.size > self.max_batch_targets:
                kept.append(it)
                continue
            batch.append(it)
            targets += it.size
            self._release(it)
        kept.extend(self._queue)
        self._queue = kept
        self._observe_queue()
        return batch

    async def _hold_open(self, until: float) -> None:
        """Wait for more items until ``until`` (batcher clock), the batch limit is reached or the
        batcher closes: every arrival wakes the wait, so a batch that fills up leaves at once."""
        assert self._wakeup is not None
        while self._queued_targets < self.max_batch_targets and not self._closing:
            wait = until - self._clock()
            if wait <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
            except asyncio.TimeoutError:
                return

    async def _loop(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self.max_delay_s > 0:
                await self._hold_open(self._queue[0].enqueued + self.max_delay_s)
            batch = self._take_batch()
            if not batch:
                continue
            started = self._clock()
            total = sum(it.size for it in batch)
            for it in batch:
                it.started, it.batch_size = started, total
            self._running_batch = True
            try:
                inline = (total <= self.inline_max_targets and not self._queue
                          and sum(it.work for it in batch) <= self.inline_max_work)
                if inline:
                    try:
                        results = self._process_inline(batch)
                    except WouldBlock:
                        self.batches_deferred += 1
                        inline = False
                    finally:  # counted once it ran (a failure included), never counted and taken back
                        if inline:
                            self.batches_inline += 1
                if not inline:
                    self.batches_worker += 1
                    results = await loop.run_in_executor(self._executor, self._process, batch)
            except Exception as exc:  # the whole batch failed: fail exactly its items
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(exc)
                continue
            except asyncio.CancelledError:
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(Unavailable(f"{self.name}: shut down while the request ran"))
                raise
            finally:
                self._running_batch = False
                self.batches_run += 1
            if len(results) != len(batch):
                err = RuntimeError(f"{self.name}: process returned {len(results)} results for {len(batch)} items")
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(err)
                continue
            for it, res in zip(batch, results, strict=True):
                if it.future.done():
                    continue
                if isinstance(res, BaseException):
                    it.future.set_exception(res)
                else:
                    it.future.set_result(res)
