"""The dynamic batcher on its own: a queue, a clock and a process function; no server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from serve.batcher import DynamicBatcher, WouldBlock
from serve.errors import DeadlineExceeded, Overloaded, Unavailable


class Recorder:
    """A process function that records its batches and can be held at a gate."""

    def __init__(self, delay: float = 0.0):
        self.batches: list[list] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items):
        self.gate.wait(5)
        time.sleep(self.delay)
        self.batches.append([it.payload for it in items])
        return [it.payload * 10 for it in items]


async def test_concurrent_requests_are_batched_and_answered_in_order():
    rec = Recorder()
    b = DynamicBatcher(rec, max_batch_targets=100)
    rec.gate.clear()  # hold the first batch so the rest pile up
    first = asyncio.ensure_future(b.submit(0, size=1))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(b.submit(i, size=1)) for i in range(1, 30)]
    await asyncio.sleep(0.05)
    rec.gate.set()
    results = await asyncio.gather(first, *rest)
    assert results == [i * 10 for i in range(30)]
    assert rec.batches[0] == [0]
    assert rec.batches[1] == list(range(1, 30)), "everything queued during a batch rides the next one"
    await b.stop()


async def test_keys_never_mix_and_target_limit_holds():
    rec = Recorder()
    b = DynamicBatcher(rec, max_batch_targets=5)
    rec.gate.clear()
    hold = asyncio.ensure_future(b.submit(-1, size=1, key="x"))
    await asyncio.sleep(0.05)
    futs = [asyncio.ensure_future(b.submit(i, size=2, key="a" if i % 2 else "b")) for i in range(8)]
    await asyncio.sleep(0.05)
    rec.gate.set()
    await asyncio.gather(hold, *futs)
    for batch in rec.batches[1:]:
        keys = {"a" if p % 2 else "b" for p in batch}
        assert len(keys) == 1, f"batch {batch} mixes keys"
        assert 2 * len(batch) <= 5
    await b.stop()


async def test_full_queue_is_refused_with_resource_exhausted():
    rec = Recorder()
    b = DynamicBatcher(rec, max_batch_targets=4, max_queue_targets=6)
    rec.gate.clear()
    running = asyncio.ensure_future(b.submit(0, size=4))
    await asyncio.sleep(0.05)  # now running, queue empty
    queued = [asyncio.ensure_future(b.submit(i, size=3)) for i in (1, 2)]
    await asyncio.sleep(0.01)
    with pytest.raises(Overloaded, match="queue full"):
        await b.submit(3, size=1)
    rec.gate.set()
    assert await asyncio.gather(running, *queued) == [0, 10, 20]
    assert await b.submit(4, size=1) == 40, "after draining, requests are accepted again"
    await b.stop()


async def test_expired_requests_are_dropped_before_processing():
    rec = Recorder()
    now = [0.0]
    b = DynamicBatcher(rec, clock=lambda: now[0])
    rec.gate.clear()
    running = asyncio.ensure_future(b.submit(1, size=1))
    await asyncio.sleep(0.05)
    late = asyncio.ensure_future(b.submit(2, size=1, deadline=5.0))
    fine = asyncio.ensure_future(b.submit(3, size=1, deadline=50.0))
    await asyncio.sleep(0.01)
    now[0] = 10.0  # the clock passes the first deadline while the batch runs
    rec.gate.set()
    assert await running == 10
    with pytest.raises(DeadlineExceeded, match="dropped"):
        await late
    assert await fine == 30
    assert [p for batch in rec.batches for p in batch] == [1, 3], "expired work never reached process()"
    assert b.items_dropped == 1
    await b.stop()


async def test_cancelled_callers_are_skipped():
    rec = Recorder()
    b = DynamicBatcher(rec)
    rec.gate.clear()
    running = asyncio.ensure_future(b.submit(1, size=1))
    await asyncio.sleep(0.05)
    gone = asyncio.ensure_future(b.submit(2, size=1))
    await asyncio.sleep(0.01)
    gone.cancel()
    rec.gate.set()
    assert await running == 10
    assert await b.submit(3, size=1) == 30
    assert [p for batch in rec.batches for p in batch] == [1, 3]
    await b.stop()


async def test_failures_stay_inside_their_batch_or_item():
    def process(items):
        if any(it.payload == "boom" for it in items):
            raise RuntimeError("batch failed")
        return [ValueError("bad item") if it.payload == "bad" else it.payload for it in items]

    b = DynamicBatcher(process)
    with pytest.raises(RuntimeError, match="batch failed"):
        await b.submit("boom", size=1)
    with pytest.raises(ValueError, match="bad item"):
        await b.submit("bad", size=1)
    assert await b.submit("ok", size=1) == "ok"
    await b.stop()


async def test_stop_drains_queued_work_and_refuses_new():
    rec = Recorder(delay=0.02)
    b = DynamicBatcher(rec, max_batch_targets=2)
    futs = [asyncio.ensure_future(b.submit(i, size=1)) for i in range(6)]
    await asyncio.sleep(0)
    await b.stop(grace_s=5)
    assert [f.result() for f in futs] == [i * 10 for i in range(6)]
    with pytest.raises(Unavailable, match="shutting down"):
        await b.submit(9, size=1)


async def test_stop_grace_expiry_fails_the_rest_loudly():
    rec = Recorder(delay=0.3)
    b = DynamicBatcher(rec, max_batch_targets=1)
    futs = [asyncio.ensure_future(b.submit(i, size=1)) for i in range(4)]
    await asyncio.sleep(0.05)
    await b.stop(grace_s=0.1)
    outcomes = await asyncio.gather(*futs, return_exceptions=True)
    assert any(isinstance(o, Unavailable) for o in outcomes), outcomes
    assert all(isinstance(o, (int, Unavailable)) for o in outcomes), "nothing is silently lost"


async def test_max_delay_lets_late_arrivals_join():
    # an hour's delay, cut short by the batch filling up: the second arrival must end the wait
    # (a batcher that sleeps out the delay fails here after 2 minutes instead of passing slowly)
    rec = Recorder()
    b = DynamicBatcher(rec, max_batch_targets=2, max_delay_s=3600.0)
    f1 = asyncio.ensure_future(b.submit(1, size=1))
    await asyncio.sleep(0.05)
    assert not f1.done() and rec.batches == [], "the first item waits for company"
    f2 = asyncio.ensure_future(b.submit(2, size=1))
    assert await asyncio.wait_for(asyncio.gather(f1, f2), 120) == [10, 20]
    assert rec.batches == [[1, 2]]
    await b.stop()


async def test_drain_gate_refuses_after_close_and_waits_for_admitted_rpcs():
    from prometheus_client import CollectorRegistry, Gauge

    from serve.interceptors import DrainGate

    gauge = Gauge("inflight", "test", registry=CollectorRegistry())
    gate = DrainGate(gauge)
    assert gate.gates("/gnnserve.v1.GnnService/Predict") and gate.gates("/inference.GRPCInferenceService/ModelInfer")
    assert not gate.gates("/grpc.health.v1.Health/Check")
    assert not gate.gates("/inference.GRPCInferenceService/ServerLive")
    gate.enter("Predict")
    gate.enter("Predict")
    assert gate.inflight == 2 and gauge._value.get() == 2
    gate.close()
    with pytest.raises(Unavailable, match="Predict: the server is shutting down"):
        gate.enter("Predict")
    assert gate.inflight == 2
    assert not await gate.wait_idle(0.05), "two RPCs still admitted"
    waiter = asyncio.ensure_future(gate.wait_idle(30))
    await asyncio.sleep(0)
    gate.leave()
    await asyncio.sleep(0)
    assert not waiter.done()
    gate.leave()
    assert await waiter and gate.inflight == 0 and gauge._value.get() == 0


async def test_small_batches_of_an_idle_batcher_run_on_the_loop():
    """``inline_max_targets``: a small batch with nothing behind it runs on the event loop's thread;
    a larger one, or one with work queued behind it, runs in the worker; answers are the same."""
    threads: list[tuple[list, int]] = []

    def process(items):
        threads.append(([it.payload for it in items], threading.get_ident()))
        if any(it.payload == "boom" for it in items):
            raise RuntimeError("boom")
        return [f"{it.payload}!" for it in items]

    loop_thread = threading.get_ident()
    b = DynamicBatcher(process, max_batch_targets=100, inline_max_targets=4)
    assert await b.submit("a", size=1) == "a!"
    assert await b.submit("b", size=4) == "b!"
    assert await b.submit("c", size=5) == "c!"
    with pytest.raises(RuntimeError, match="boom"):  # an inline failure fails its items, the loop lives on
        await b.submit("boom", size=1)
    assert [t == loop_thread for _, t in threads] == [True, True, False, True]
    assert b.batches_inline == 3
    threads.clear()
    # two requests at once: the first batch sees the second queued behind it and leaves the loop free
    results = await asyncio.gather(b.submit("x", size=1), b.submit("y", size=1, key="other"))
    assert results == ["x!", "y!"]
    assert threads[0][0] == ["x"] and threads[0][1] != loop_thread
    assert threads[1][0] == ["y"] and threads[1][1] == loop_thread
    await b.stop()
    with pytest.raises(ValueError, match="inline_max_targets"):
        DynamicBatcher(process, inline_max_targets=-1)


async def test_an_inline_batch_that_would_wait_runs_in_the_worker_and_the_loop_stays_free():
    """``process_inline`` raising WouldBlock (the live graph's lock is wanted by an update): the same batch
    runs in the worker, answered like any other; while the worker waits, the event loop keeps running."""
    loop_thread = threading.get_ident()
    gate = threading.Event()
    ran: list[tuple[str, bool]] = []

    def process(items):
        gate.wait(10)  # the worker waits (as for the read lock) ...
        ran.append(("worker", threading.get_ident() == loop_thread))
        return [it.payload * 2 for it in items]

    def process_inline(items):
        if not gate.is_set():
            raise WouldBlock("an update holds the lock")
        ran.append(("inline", threading.get_ident() == loop_thread))
        return [it.payload * 3 for it in items]

    b = DynamicBatcher(process, max_batch_targets=100, inline_max_targets=8, process_inline=process_inline)
    pending = asyncio.ensure_future(b.submit(5, size=1))
    ticks = 0
    for _ in range(20):  # ... and the loop is not held meanwhile
        await asyncio.sleep(0.005)
        ticks += 1
    assert not pending.done() and ticks == 20 and b.batches_deferred == 1 and b.batches_inline == 0
    gate.set()
    assert await pending == 10 and ran == [("worker", False)]
    assert await b.submit(7, size=1) == 21 and ran[-1] == ("inline", True)  # the lock free: inline again
    assert (b.batches_inline, b.batches_deferred, b.batches_worker, b.batches_run) == (1, 1, 1, 2)
    await b.stop()
