"""Per model version request statistics, as Triton's ``ModelStatistics`` defines them.

One :class:`ModelStats` lives on each :class:`serve.runtime.ModelRuntime` and is recorded at two
places only: ``ModelRuntime.submit`` (every request of the native ``Predict`` and of KServe
``ModelInfer`` / ``ModelStreamInfer`` goes through it) and ``ModelRuntime.process`` (once per
executed batch). What the counters mean:

* ``success``: requests answered, with their time from the start of their handler (the RPC's parsing and
  checks, a read-your-writes wait, then ``submit``: queue + batch + hand-back; as Triton measures it, so that
  perf_analyzer's "overhead", success minus queue and compute, is the handler's own time);
  ``fail``: requests that reached ``submit``'s batcher and failed there (queue full, deadline passed,
  cancelled, an error in the batch), each with the reason Triton's ``nv_inference_request_failure`` metric gives
  (:func:`failure_reason`). Requests refused for their input (INVALID_ARGUMENT: ids out of range, bad knobs or
  parameters, too many nodes) are not counted, on any path (native ``Predict``, KServe over gRPC and HTTP): a
  failure rate alert sees requests the model took and could not answer; ``gnnserve_requests_total{code}``
  counts every refusal.
* ``queue``: time from the batcher's queue to the start of the request's batch;
  ``compute_input``: the batch's subgraph / execution-plan stage and its feature (projection) fetch;
  ``compute_infer``: the batch's forward pass; ``compute_output``: the rest of the request's time in
  ``submit`` (edge counts, the per-request split of the batch's outputs and the hand-back to the
  caller). Each of these is counted once per successful request, durations summed in nanoseconds.
* ``inference_count``: node ids answered (Triton counts each item of a batched request as one
  inference: a node is gnnserve's item); ``execution_count``: batches executed (several requests can
  share one); ``batch_stats``: per executed batch size (in nodes), the count and the batch's input,
  infer and output durations.
* ``last_inference``: milliseconds since the epoch of the last successful request.

Counters are guarded by one lock: ``submit`` runs on the event loop, ``process`` in a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import DeadlineExceeded, Overloaded, Unavailable

__all__ = ["FAILURE_REASONS", "BatchStats", "ModelStats", "StatsSnapshot", "failure_reason"]

#: the ``reason`` label of Triton's ``nv_inference_request_failure``: refused by the scheduler (queue full, work
#: limit, deadline passed in the queue), cancelled by its client, failed in the model, anything else
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def failure_reason(exc: BaseException) -> str:
    """The :data:`FAILURE_REASONS` entry of a request that failed with ``exc``."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    if isinstance(exc, (Overloaded, DeadlineExceeded, Unavailable)):
        return "REJECTED"
    return "BACKEND" if isinstance(exc, Exception) else "OTHER"


@dataclass
class BatchStats:
    count: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


@dataclass
class StatsSnapshot:
    """A consistent copy of one version's counters (durations in ns, each as ``(count, ns)``)."""

    success: tuple[int, int] = (0, 0)
    fail: tuple[int, int] = (0, 0)
    queue: tuple[int, int] = (0, 0)
    compute_input: tuple[int, int] = (0, 0)
    compute_infer: tuple[int, int] = (0, 0)
    compute_output: tuple[int, int] = (0, 0)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)
    #: ``fail``'s count by :data:`FAILURE_REASONS` entry
    fail_reasons: dict[str, int] = field(default_factory=dict)


def _ns(ms: float) -> int:
    return max(0, round(ms * 1e6))


class ModelStats:
    """Counters of one model version (see the module docstring for their meaning)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # [count, ns] per duration
        self._d: dict[str, list[int]] = {k: [0, 0] for k in ("success", "fail", "queue", "compute_input",
                                                              "compute_infer", "compute_output")}
        self._inferences = 0
        self._executions = 0
        self._last_ms = 0
        self._batches: dict[int, BatchStats] = {}
        self._fail_reasons = dict.fromkeys(FAILURE_REASONS, 0)

    def succeeded(self, items: int, total_ns: int, timing_ms: dict[str, Any], handler_ns: int | None = None) -> None:
        """A request of ``items`` nodes answered after ``total_ns`` in ``submit`` and ``handler_ns`` since its
        handler started (None: ``total_ns``); ``timing_ms`` is its :class:`~serve.runtime.PredictResult` timing
        (``queue``, ``subgraph``, ``features``, ``forward``)."""
        queue = _ns(timing_ms.get("queue", 0.0))
        inp = _ns(timing_ms.get("subgraph", 0.0) + timing_ms.get("features", 0.0))
        infer = _ns(timing_ms.get("forward", 0.0))
        out = max(0, total_ns - queue - inp - infer)
        success = total_ns if handler_ns is None else max(total_ns, handler_ns)
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            d = self._d
            for key, ns in (("success", success), ("queue", queue), ("compute_input", inp),
                            ("compute_infer", infer), ("compute_output", out)):
                d[key][0] += 1
                d[key][1] += ns
            self._inferences += items
            self._last_ms = now_ms

    def failed(self, total_ns: int, reason: str = "OTHER") -> None:
        """A request failed after ``total_ns``; ``reason``: a :data:`FAILURE_REASONS` entry (:func:`failure_reason`)."""
        with self._lock:
            self._d["fail"][0] += 1
            self._d["fail"][1] += max(0, total_ns)
            self._fail_reasons[reason if reason in self._fail_reasons else "OTHER"] += 1

    def executed(self, batch_size: int, input_s: float, infer_s: float, output_s: float) -> None:
        """One batch of ``batch_size`` nodes ran (stage durations in seconds)."""
        with self._lock:
            self._executions += 1
            b = self._batches.get(batch_size)
            if b is None:
                b = self._batches[batch_size] = BatchStats()
            b.count += 1
            b.compute_input_ns += max(0, round(input_s * 1e9))
            b.compute_infer_ns += max(0, round(infer_s * 1e9))
            b.compute_output_ns += max(0, round(output_s * 1e9))

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            d = {k: (v[0], v[1]) for k, v in self._d.items()}
            batches = {k: BatchStats(b.count, b.compute_input_ns, b.compute_infer_ns, b.compute_output_ns)
                       for k, b in self._batches.items()}
            return StatsSnapshot(inference_count=self._inferences, execution_count=self._executions,
                                 last_inference_ms=self._last_ms, batches=batches, fail_reasons=dict(self._fail_reasons),
                                 **d)
