"""The ``gnnserve.v1.GnnService`` servicer: validation, dispatch to a model's batcher, replies."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from grpc import aio

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc

from .errors import Unavailable
from .validation import check_request_id, validate_predict

if TYPE_CHECKING:
    from .registry import ModelRegistry
    from .runtime import ModelRuntime, PredictResult

__all__ = ["GnnServicer", "model_info", "served_by", "set_process_slot"]

log = logging.getLogger(__name__)

_SLOT: tuple[int, int] | None = None  # (index, total) under ``gnnserve serve --processes N``


def set_process_slot(index: int, total: int) -> None:
    """Mark this process as process ``index`` (1-based) of ``total`` behind one port."""
    global _SLOT
    _SLOT = (int(index), int(total))


def served_by() -> str:
    """``PredictResponse.served_by`` / ``ModelInfo.served_by``: ``"<pid>"``, or ``"<pid> <i>/<N>"`` for
    process i of N (the pid is read per call: a forked child reports its own)."""
    return f"{os.getpid()} {_SLOT[0]}/{_SLOT[1]}" if _SLOT else str(os.getpid())


def deadline_of(context: aio.ServicerContext) -> float | None:
    """The request's deadline on the ``time.monotonic`` clock (None when the client set none)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > 1e8:
        return None
    return time.monotonic() + remaining


def model_info(rt: ModelRuntime, versions: list[str]) -> pb.ModelInfo:
    lim = rt.limits
    info = pb.ModelInfo(
        name=rt.name,
        version=str(rt.version),
        versions=versions,
        architecture=rt.architecture,
        extractor=lim.extractor,
        num_features=lim.num_features,
        num_classes=rt.num_classes,
        num_nodes=lim.num_nodes,
        max_ppr_budget=lim.max_ppr_budget,
        default_sampling_width=lim.default_sampling_width,
        default_ppr_budget=lim.default_ppr_budget,
        strategy=rt.strategy,
        dataset_fingerprint=rt.dataset_fingerprint,
        ready=rt.in_service,  # listed all the same: a graph out of service or a lost device shows as not ready
        feature_store=rt.feature_store_name,
        max_sampling_width=lim.max_sampling_width,
        max_nodes_per_request=lim.max_nodes_per_request,
        max_request_work=rt.options.max_request_work,
        max_new_node_edges=lim.max_new_node_edges,
        served_by=served_by(),
    )
    live = rt.data.live
    if live is not None:
        info.graph_version = live.version
        info.read_only = live.read_only
    for r in lim.knob_table:
        row = info.knob_table.add(
            ppr_budget=r.ppr_budget,
            sampling_width=r.sampling_width,
            val_accuracy=r.val_accuracy,
            latency_ms_per_node=r.latency_ms_per_node,
            edges_kept_fraction=r.edges_kept_fraction,
        )
        if r.agreement is not None:
            row.agreement = r.agreement
    for k, v in rt.metrics.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            info.metrics[k] = float(v)
    return info


def predict_response(rt: ModelRuntime, res: PredictResult, packed: bool = False) -> pb.PredictResponse:
    """The reply to one request. ``packed`` (the request's ``packed_outputs``): labels, probabilities and
    embeddings as little-endian arrays in bytes fields, one copy each, instead of repeated fields
    (building a repeated float field costs about 0.7 us per value in Python: 44 us for 64 nodes x 10
    classes, against 4 us packed; docs/BENCHMARKS.md, issue 22 item 5)."""
    call = res.call
    resp = pb.PredictResponse(
        model=rt.name,
        version=str(rt.version),
        request_id=call.request_id,
        num_classes=rt.num_classes,
        served_by=served_by(),
    )
    if packed:
        resp.packed = True
        resp.packed_labels = np.ascontiguousarray(res.labels, dtype="<i4").tobytes()
        if call.return_probabilities:
            resp.packed_probabilities = np.ascontiguousarray(res.probabilities, dtype="<f4").tobytes()
        if call.return_embeddings and res.embeddings is not None:
            resp.embedding_dim = int(res.embeddings.shape[1])
            resp.packed_embeddings = np.ascontiguousarray(res.embeddings, dtype="<f4").tobytes()
    else:
        resp.labels.extend(res.labels.tolist())
        if call.return_probabilities:
            resp.probabilities.extend(np.asarray(res.probabilities, dtype=np.float32).ravel().tolist())
        if call.return_embeddings and res.embeddings is not None:
            resp.embedding_dim = int(res.embeddings.shape[1])
            resp.embeddings.extend(np.asarray(res.embeddings, dtype=np.float32).ravel().tolist())
    s = resp.settings
    s.sampling_width = call.sampling_width
    s.ppr_budget = call.ppr_budget
    s.strategy = rt.strategy
    s.extractor = rt.limits.extractor
    s.chosen_by = call.chosen_by
    s.expected_accuracy = call.expected_accuracy
    s.edges_kept = res.edges_kept
    s.edges_total = res.edges_total
    t = resp.timing
    t.queue_ms = res.timing["queue"]
    t.subgraph_ms = res.timing["subgraph"]
    t.features_ms = res.timing["features"]
    t.forward_ms = res.timing["forward"]
    t.batch_size = res.batch_size
    from .features import data_version  # raises DataVersionChanged once a pinned version changed

    resp.data_version = data_version(rt.data.features, rt.data.graph, rt.dataset_fingerprint)
    resp.graph_version = res.graph_version
    return resp


#: the threads read-your-writes waits block in: a pool of their own, so that many waiting requests never hold up
#: the event loop's default executor (what else runs there queues behind them otherwise); its threads start on use
_VERSION_WAITS = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="gnnserve-ryw")


async def reach_version(rt: ModelRuntime, version: int, deadline: float | None) -> None:
    """Read-your-writes: wait (briefly) until the model's graph is at ``version`` or newer."""
    live = rt.data.live
    current = live.version if live is not None else 0
    if current >= version:
        return
    if live is None:
        raise Unavailable(f"model {rt.name} v{rt.version} is still loading")
    timeout = rt.options.read_your_writes_timeout_s
    if deadline is not None:
        timeout = min(timeout, max(0.0, deadline - time.monotonic()))
    end = time.monotonic() + timeout

    def wait() -> bool:  # the time spent queued for a thread counts against the timeout
        return live.wait_for(version, max(0.0, end - time.monotonic()))

    waiting = asyncio.get_running_loop().run_in_executor(_VERSION_WAITS, wait)
    # a read of the update log is bounded by its client, not by the timeout (a hung Redis: its socket timeout
    # times its attempts, about 3 s): the call is answered at the timeout all the same, and the thread finishes
    # its read in the background (its outcome is dropped; asyncio.wait does not cancel it). So is a call cancelled
    # meanwhile (its deadline passed)
    waiting.add_done_callback(_drop_outcome)
    done, _ = await asyncio.wait({waiting}, timeout=max(0.0, end - time.monotonic()) + _WAIT_SLACK_S)
    if not done:
        raise Unavailable(f"graph version {version} is not visible on this server yet (it is at {live.version}; "
                          f"the wait did not end within {timeout:.2f} s: the graph's update log did not answer in "
                          "time, or every waiting thread was busy); retry with backoff, or send the request to the "
                          "server that took the update")
    if not waiting.result():  # raises what the wait raised: Unavailable, NotWritten, GraphOutOfService
        raise Unavailable(f"graph version {version} is not visible on this server yet (it is at {live.version} "
                          f"after waiting {timeout:.2f} s); retry, or send the request to the server that took "
                          "the update")


#: how long past its timeout a read-your-writes wait may take to say so itself before the call is answered without
#: it (the wait's thread checks the time between log reads and 50 ms condition waits)
_WAIT_SLACK_S = 0.1


def _drop_outcome(fut: asyncio.Future[Any]) -> None:
    """Retrieve a wait's outcome: no 'exception was never retrieved' line for a call answered without it."""
    if not fut.cancelled():
        fut.exception()


class GnnServicer(pb_grpc.GnnServiceServicer):
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    async def Predict(self, request: pb.PredictRequest, context: aio.ServicerContext) -> pb.PredictResponse:
        t0 = time.perf_counter()
        rt = self.registry.get(request.model, request.version)
        if request.min_graph_version:
            await reach_version(rt, request.min_graph_version, deadline_of(context))
        call = validate_predict(request, rt.limits)
        res = await rt.submit(call, deadline=deadline_of(context), started=t0)
        resp = predict_response(rt, res, request.packed_outputs)
        total_ms = 1e3 * (time.perf_counter() - t0)
        resp.timing.total_ms = total_ms
        res.timing["total"] = total_ms
        rt.observe(res)
        log.debug("predict model=%s v=%s request_id=%s n=%d S=%d K=%d total=%.2fms", rt.name, rt.version,
                  call.request_id, call.size, call.sampling_width, call.ppr_budget, total_ms)
        return resp

    async def UpdateGraph(self, request: pb.UpdateGraphRequest,
                          context: aio.ServicerContext) -> pb.UpdateGraphResponse:
        rt = self.registry.get(request.model, request.version)
        live = rt.data.live
        if live is None:
            raise Unavailable(f"model {rt.name} v{rt.version} is still loading")
        check_request_id(request.request_id)
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        # validated, logged and applied by the graph's writer thread, grouped with the updates beside it
        res = await live.update_async(request, deadline=deadline_of(context))
        log.debug("update graph=%s version=%d request_id=%s new=%d apply=%.2fms", live.label, res.version,
                 request.request_id, len(res.new_ids), res.apply_ms)
        out = pb.UpdateGraphResponse(graph_version=res.version, new_node_ids=res.new_ids.tolist(),
                                     num_nodes=res.num_nodes, num_edges=res.num_edges,
                                     request_id=request.request_id, apply_ms=res.apply_ms)
        for cache, rows in res.invalidated.items():
            out.invalidated[cache] = rows
        return out

    async def ListModels(self, request: pb.ListModelsRequest, context: aio.ServicerContext) -> pb.ListModelsResponse:
        out = pb.ListModelsResponse()
        for runtimes in self.registry.snapshot().values():
            versions = [str(v) for v in sorted(runtimes)]
            for v in sorted(runtimes):
                out.models.append(model_info(runtimes[v], versions))
        return out

    async def GetModel(self, request: pb.GetModelRequest, context: aio.ServicerContext) -> pb.ModelInfo:
        rt = self.registry.get(request.name, request.version)
        return model_info(rt, [str(v) for v in self.registry.versions(rt.name)])


