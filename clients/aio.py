"""The asyncio client: :class:`AsyncGnnClient`, the twin of :class:`clients.GnnClient` on ``grpc.aio``.

Same constructor, same methods and results; the methods are coroutines.

Example::

    import asyncio
    from clients import AsyncGnnClient

    async def main() -> None:
        async with AsyncGnnClient("127.0.0.1:8500") as client:
            results = await asyncio.gather(*(client.predict("cora-sage", [i]) for i in range(10)))
            print([int(r.labels[0]) for r in results])

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from grpc import aio

from ._core import (
    SAFE_UNCHUNKED,
    ChunkLimits,
    PredictPlan,
    RetryState,
    has_new_nodes,
    knob_fields,
    model_info_from_pb,
    new_node_messages,
    node_array,
    update_request,
    update_result_from_pb,
)
from ._gen import gnnserve_pb2 as pb
from ._gen import gnnserve_pb2_grpc as pb_grpc
from .client import _ClientBase
from .errors import DeadlineExceededError, GnnServeError, NotFoundError, UnavailableError
from .types import ClientOptions, ModelInfo, NewNode, PredictResult, UpdateResult

__all__ = ["AsyncGnnClient"]


class AsyncGnnClient(_ClientBase):
    """Asyncio client for a gnnserve server; arguments as for :class:`clients.GnnClient` (a
    :class:`~clients.types.ClientOptions` and/or its fields as keywords).

    The channel is opened on first use inside the running event loop; use one client per event
    loop. Use it as ``async with`` or ``await client.close()``. Concurrent calls on one client are
    fine (they share one HTTP/2 connection).

    Example::

        async with AsyncGnnClient("127.0.0.1:8500", timeout=5.0) as client:
            res = await client.predict("cora-sage", range(100), sampling_width=16)
            info = await client.get_model("cora-sage")
    """

    def __init__(self, address: str, options: ClientOptions | None = None, **overrides: Any) -> None:
        super().__init__(address, options, **overrides)
        self._channel: aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stub: Any = None
        self._health_stub: Any = None
        self._slots: asyncio.Semaphore | None = None  # max_concurrent_calls, made in the client's event loop

    # ------------------------------------------------------------------ lifecycle
    def _ensure_channel(self) -> Any:
        self._check_open()
        loop = asyncio.get_running_loop()
        if self._channel is None:
            cfg = self._config
            if cfg.credentials is not None:
                self._channel = aio.secure_channel(cfg.target, cfg.credentials, options=cfg.options)
            else:
                self._channel = aio.insecure_channel(cfg.target, options=cfg.options)
            self._loop = loop
            self._stub = pb_grpc.GnnServiceStub(self._channel)
            n = self.max_concurrent_calls
            self._slots = asyncio.Semaphore(n) if n is not None else None
        elif self._loop is not loop:
            raise RuntimeError(
                f"{type(self).__name__} for {self.address} was opened in another event loop; "
                "create one client per event loop"
            )
        return self._stub

    async def close(self) -> None:
        """Close the channel (idempotent). Calls made afterwards raise ``ValueError``."""
        if self._closed:
            return
        self._closed = True
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> AsyncGnnClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ transport
    async def _invoke(self, state: RetryState, fn: Any, request: Any) -> Any:
        state.attempts = state.retries = 0  # the retry budget is per RPC; the deadline is per call
        while True:
            state.attempts += 1
            timeout = state.remaining()
            slots = self._slots
            if slots is not None:
                try:
                    await asyncio.wait_for(slots.acquire(), timeout)
                except asyncio.TimeoutError:
                    raise self._no_slot(state) from None
            try:
                # a wait for a slot spends the deadline too
                return await fn(request, timeout=timeout if slots is None else state.remaining(),
                                metadata=self._config.metadata, wait_for_ready=state.wait_for_ready)
            except grpc.RpcError as err:
                try:
                    delay = state.failed(err)
                except GnnServeError as exc:
                    raise exc from None
            finally:
                if slots is not None:
                    slots.release()
            await asyncio.sleep(delay)

    async def _chunk_limits(self, model: str, version: str, rows: int, state: RetryState) -> ChunkLimits:
        if rows <= SAFE_UNCHUNKED:
            return ChunkLimits(max_nodes=max(1, rows))
        lim = self._cached_limits(model, version)
        if lim is None:
            stub = self._ensure_channel()
            info = await self._invoke(state, stub.GetModel, pb.GetModelRequest(name=model, version=version))
            lim = self._store_limits(model, version, info)
        return lim

    async def _run(self, plan: PredictPlan, state: RetryState, t0: float, model: str, version: str) -> PredictResult:
        stub = self._ensure_channel()
        while (req := plan.next_request()) is not None:
            try:
                resp = await self._invoke(state, stub.Predict, req)
            except GnnServeError as exc:
                if plan.shrink(exc):  # refused for its size alone: its rows go again, in smaller requests
                    self._learn_node_limit(model, version, plan)
                    continue
                raise plan.located(exc) from None
            plan.add(resp)
        self._learn(model, version, plan)
        return plan.result(1e3 * (time.perf_counter() - t0))

    # ------------------------------------------------------------------ API
    async def predict(
        self,
        model: str,
        nodes: int | Iterable[int] | np.ndarray,
        sampling_width: int | None = None,
        ppr_budget: int | None = None,
        max_accuracy_loss: float | None = None,
        return_probabilities: bool = True,
        return_embeddings: bool = False,
        version: str | int | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        min_graph_version: int | None = None,
        new_nodes: Sequence[NewNode] | NewNode | None = None,
        allow_mixed_versions: bool = False,
    ) -> PredictResult:
        """Classify existing nodes (and ``new_nodes``, rows after theirs); see :meth:`clients.GnnClient.predict` (the
        same arguments).

        ``min_graph_version``: read-your-writes: answer from the model's graph at this version or newer
        (an :meth:`update_graph` result's ``graph_version``; None or 0: any). A server still behind waits
        for it up to its ``--read-your-writes-timeout-s`` (1 s by default; never past ``timeout``), then
        raises ``UNAVAILABLE`` (:class:`~clients.errors.UnavailableError`); a version the graph's update
        log never wrote is refused at once (:class:`~clients.errors.FailedPreconditionError`, not retried).

        ``allow_mixed_versions``: as for the blocking client: by default every row is computed at the one
        ``graph_version`` the result reports (chunks behind are sent again; :class:`~clients.errors.AbortedError`
        when updates outrun ``max_version_rounds`` rounds); True keeps each row at its own version
        (``result.graph_versions``).

        Example::

            res = await client.predict("cora-sage", [0, 5, 7], sampling_width=8)
        """
        t0 = time.perf_counter()
        self._ensure_channel()
        model, ver = self._model_args(model, version)
        ids = node_array(nodes)
        msgs = new_node_messages(new_nodes) if has_new_nodes(new_nodes) else []
        knobs = knob_fields(sampling_width, ppr_budget, max_accuracy_loss, min_graph_version)
        state = self._state("Predict", timeout)
        limits = await self._chunk_limits(model, ver, len(ids) + len(msgs), state)
        plan = self._plan(model, ver, ids, msgs, knobs, return_probabilities, return_embeddings, request_id, limits,
                          allow_mixed_versions)
        return await self._run(plan, state, t0, model, ver)

    async def predict_new_node(
        self,
        model: str,
        features: Sequence[float] | np.ndarray | Sequence[NewNode] | NewNode,
        neighbors: Sequence[int] | np.ndarray | Sequence[Sequence[int]] | None = None,
        edge_weights: Sequence[float] | np.ndarray | Sequence[Sequence[float] | None] | None = None,
        sampling_width: int | None = None,
        ppr_budget: int | None = None,
        max_accuracy_loss: float | None = None,
        return_probabilities: bool = True,
        return_embeddings: bool = False,
        version: str | int | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        min_graph_version: int | None = None,
        allow_mixed_versions: bool = False,
    ) -> PredictResult:
        """Classify nodes that are not in the graph; see :meth:`clients.GnnClient.predict_new_node`.

        ``min_graph_version``: read-your-writes, as for :meth:`predict`: the new nodes are attached to the
        graph at this version or newer; the server waits up to its ``--read-your-writes-timeout-s`` for it
        (``UNAVAILABLE`` after that) and refuses at once a version its update log never wrote
        (``FAILED_PRECONDITION``).

        Example::

            res = await client.predict_new_node("cora-sage", x, neighbors=[12, 40])
        """
        t0 = time.perf_counter()
        self._ensure_channel()
        model, ver = self._model_args(model, version)
        msgs = new_node_messages(features, neighbors, edge_weights)
        knobs = knob_fields(sampling_width, ppr_budget, max_accuracy_loss, min_graph_version)
        state = self._state("Predict", timeout)
        limits = await self._chunk_limits(model, ver, len(msgs), state)
        plan = self._plan(model, ver, np.zeros(0, dtype=np.int64), msgs, knobs, return_probabilities,
                          return_embeddings, request_id, limits, allow_mixed_versions)
        return await self._run(plan, state, t0, model, ver)

    async def update_graph(
        self,
        model: str,
        *,
        features: Mapping[int, Sequence[float] | np.ndarray] | tuple[Any, Any] | None = None,
        new_nodes: Sequence[NewNode] | NewNode | None = None,
        add_edges: Iterable[Sequence[Any]] | np.ndarray | None = None,
        remove_edges: Iterable[Sequence[int]] | np.ndarray | None = None,
        expect_graph_version: int | None = None,
        version: str | int | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> UpdateResult:
        """Change the graph ``model`` serves on; see :meth:`clients.GnnClient.update_graph`.

        Example::

            up = await client.update_graph("cora-gcn", add_edges=[(1, 2)])
            res = await client.predict("cora-gcn", [1, 2], min_graph_version=up.graph_version)
        """
        t0 = time.perf_counter()
        model, ver = self._model_args(model, version)
        req = update_request(model, ver, features=features, new_nodes=new_nodes, add_edges=add_edges,
                             remove_edges=remove_edges, expect_graph_version=expect_graph_version,
                             request_id=request_id)
        state = self._state("UpdateGraph", timeout, retries=expect_graph_version is not None)
        resp = await self._invoke(state, self._ensure_channel().UpdateGraph, req)
        return update_result_from_pb(resp, 1e3 * (time.perf_counter() - t0))

    async def list_models(self, timeout: float | None = None) -> list[ModelInfo]:
        """Every loaded model version with its knob table; see :meth:`clients.GnnClient.list_models`.

        Example::

            names = [m.name for m in await client.list_models()]
        """
        stub = self._ensure_channel()
        state = self._state("ListModels", timeout)
        resp = await self._invoke(state, stub.ListModels, pb.ListModelsRequest())
        return [model_info_from_pb(m) for m in resp.models]

    async def repository_index(self, timeout: float | None = None) -> list[dict[str, str]]:
        """Every model version in the server's repository, loaded or not; see
        :meth:`clients.GnnClient.repository_index`.

        Example::

            broken = [m for m in await client.repository_index() if m["state"] != "READY"]
        """
        from ._gen import inference_pb2 as ipb
        from ._gen import inference_pb2_grpc as ipb_grpc

        self._ensure_channel()
        stub = ipb_grpc.GRPCInferenceServiceStub(self._channel)
        state = self._state("RepositoryIndex", timeout)
        resp = await self._invoke(state, stub.RepositoryIndex, ipb.RepositoryIndexRequest())
        return [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in resp.models]

    async def get_model(self, name: str, version: str | int | None = None, timeout: float | None = None) -> ModelInfo:
        """One model (latest version unless ``version``); see :meth:`clients.GnnClient.get_model`.

        Example::

            info = await client.get_model("cora-sage")
        """
        stub = self._ensure_channel()
        name, ver = self._model_args(name, version)
        state = self._state("GetModel", timeout)
        info = await self._invoke(state, stub.GetModel, pb.GetModelRequest(name=name, version=ver))
        self._store_limits(name, ver, info)
        return model_info_from_pb(info)

    async def health(self, service: str = "", timeout: float | None = None) -> str:
        """``"SERVING"``, ``"NOT_SERVING"`` or ``"UNKNOWN"``; see :meth:`clients.GnnClient.health`.

        Example::

            assert await client.health() == "SERVING"
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self._ensure_channel()
        if self._health_stub is None:
            self._health_stub = health_pb2_grpc.HealthStub(self._channel)
        state = self._state("Health", timeout, retries=False)
        try:
            resp = await self._invoke(state, self._health_stub.Check, health_pb2.HealthCheckRequest(service=service))
        except NotFoundError:
            raise NotFoundError(f"the server has no health status for service {service!r}", method="Health") from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    async def wait_ready(self, timeout: float = 30.0, service: str = "") -> None:
        """Wait until the server reports ``SERVING``; see :meth:`clients.GnnClient.wait_ready`.

        Example::

            await client.wait_ready(timeout=60)
        """
        deadline = time.monotonic() + timeout
        attempt, last = 0, "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceededError(
                    f"server at {self.address} not SERVING within {timeout:g} s (last: {last})", method="Health"
                )
            try:
                status = await self.health(service, timeout=min(left, max(1.0, self.backoff.max_s)))
                if status == "SERVING":
                    return
                last = status
            except (UnavailableError, DeadlineExceededError, NotFoundError) as exc:
                last = str(exc)
            await asyncio.sleep(min(max(0.0, deadline - time.monotonic()), self.backoff.nominal(attempt)))
            attempt += 1
