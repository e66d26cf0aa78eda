"""The blocking client: :class:`GnnClient`.

Example::

    from clients import GnnClient

    with GnnClient("127.0.0.1:8500", timeout=10.0) as client:
        res = client.predict("cora-sage", [0, 1, 2], sampling_width=16, ppr_budget=64)
        print(res.labels, res.probabilities.max(axis=1), res.settings, res.timing)

The asyncio twin with the same methods is :class:`clients.aio.AsyncGnnClient`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from ._core import (
    SAFE_UNCHUNKED,
    TLS_HINT,
    ChannelConfig,
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
from .errors import DeadlineExceededError, GnnServeError, NotFoundError, UnavailableError
from .types import Backoff, ClientOptions, ModelInfo, NewNode, PemSource, PredictResult, UpdateResult

__all__ = ["GnnClient", "PemSource"]

log = logging.getLogger("clients")

DEFAULT_MAX_NODES_PER_REQUEST = 4096  # the server's default, used if a server does not report its limit


class _ClientBase:
    """Configuration, argument handling and caches shared by the blocking and the asyncio client."""

    def __init__(self, address: str, options: ClientOptions | None = None, **overrides: Any) -> None:
        # keywords are ClientOptions fields (a misspelt one is a TypeError naming it)
        opts = dataclasses.replace(options or ClientOptions(), **overrides) if overrides else (options or ClientOptions())
        self.options = opts
        self.address = address
        self.timeout = opts.timeout
        self.max_retries = int(opts.max_retries)
        self.backoff = opts.backoff if opts.backoff is not None else Backoff()
        self.max_nodes_per_call = opts.max_nodes_per_call
        # CANCELLED here comes from the server side: this SDK never cancels a call itself (a deadline is
        # DEADLINE_EXCEEDED, an asyncio task's cancellation is not an RPC error). A server that stops cancels
        # the calls grpc-core accepted but had not yet handed to gnnserve, and under a flood far past capacity
        # grpc-core may cancel calls waiting in its queues (docs/RELIABILITY.md, "Limits"); the two look the
        # same, so both are retried like UNAVAILABLE: bounded by max_retries, the backoff and the deadline
        self.retry_codes = frozenset(
            {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
            | ({grpc.StatusCode.RESOURCE_EXHAUSTED} if opts.retry_resource_exhausted else set())
        )
        self._config = ChannelConfig.build(
            address,
            tls=opts.tls,
            root_certificates=opts.root_certificates,
            client_cert=opts.client_cert,
            client_key=opts.client_key,
            tls_server_name=opts.tls_server_name,
            token=opts.token,
            backoff=self.backoff,
            channel_options=opts.channel_options,
        )
        self._limits: dict[tuple[str, str], ChunkLimits] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.max_concurrent_calls = opts.max_concurrent_calls

    def _no_slot(self, state: RetryState) -> DeadlineExceededError:
        return DeadlineExceededError(
            f"deadline of {state.timeout:g} s passed while {state.method} waited for a free call slot of this client "
            f"(max_concurrent_calls={self.max_concurrent_calls} RPCs in flight at once)",
            method=state.method, attempts=state.attempts)

    @property
    def tls(self) -> bool:
        """Whether the channel uses TLS."""
        return self._config.credentials is not None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"{type(self).__name__}({self.address!r}, tls={self.tls}, {state})"

    def __reduce__(self) -> tuple[Any, ...]:
        # a channel cannot cross processes: a pickled client (a multiprocessing pool's argument, say) is its
        # address and options, and opens a channel of its own where it is unpickled (closed if this one is)
        return (_reopened, (type(self), self.address, self.options, self._closed))

    def clear_cache(self) -> None:
        """Forget the per-model limits looked up for chunking (e.g. after the server was reconfigured)."""
        with self._lock:
            self._limits.clear()

    # ------------------------------------------------------------------ helpers
    def _state(self, method: str, timeout: float | None, retries: bool = True) -> RetryState:
        t = self.timeout if timeout is None else timeout
        if t is not None and not t > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {t}")
        return RetryState(method=method, timeout=t, max_retries=self.max_retries if retries else 0,
                          backoff=self.backoff, retry_codes=self.retry_codes,
                          unavailable_hint=TLS_HINT if self._config.credentials is not None else "",
                          wait_for_ready=bool(self.options.wait_for_ready) and method != "Health")

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{type(self).__name__} for {self.address} is closed")

    def _cached_limits(self, model: str, version: str) -> ChunkLimits | None:
        with self._lock:
            lim = self._limits.get((model, version))
            return None if lim is None else ChunkLimits(**vars(lim))

    def _store_limits(self, model: str, version: str, info: pb.ModelInfo) -> ChunkLimits:
        server_max = int(info.max_nodes_per_request) or DEFAULT_MAX_NODES_PER_REQUEST
        user_max = self.max_nodes_per_call or server_max
        lim = ChunkLimits(
            max_nodes=min(server_max, user_max),
            response_bytes=int(0.75 * self._config.max_receive_bytes),
            num_classes=int(info.num_classes) or None,
        )
        with self._lock:
            old = self._limits.get((model, version))
            if old is not None:
                lim.embedding_dim = old.embedding_dim
            self._limits[(model, version)] = lim
        return ChunkLimits(**vars(lim))

    def _learn(self, model: str, version: str, plan: PredictPlan) -> None:
        if plan.return_embeddings and plan.limits.embedding_dim is not None:
            with self._lock:
                lim = self._limits.get((model, version))
                if lim is not None:
                    lim.embedding_dim = plan.limits.embedding_dim

    def _learn_node_limit(self, model: str, version: str, plan: PredictPlan) -> None:
        """Keep the per-request node limit a server refusal named (:meth:`PredictPlan.shrink`) for later calls."""
        cap = plan.refused_node_limit
        if cap is None:
            return
        with self._lock:
            lim = self._limits.get((model, version))
            if lim is not None:
                lim.max_nodes = min(lim.max_nodes, cap)

    def _plan(
        self,
        model: str,
        version: str,
        nodes: np.ndarray,
        new_nodes: list[pb.NewNode],
        knobs: dict[str, Any],
        return_probabilities: bool,
        return_embeddings: bool,
        request_id: str | None,
        limits: ChunkLimits,
        allow_mixed_versions: bool = False,
    ) -> PredictPlan:
        return PredictPlan(
            model=model,
            version=version,
            nodes=nodes,
            new_nodes=new_nodes,
            knobs=knobs,
            return_probabilities=return_probabilities,
            return_embeddings=return_embeddings,
            request_id=request_id or "",
            limits=limits,
            max_version_rounds=self.options.max_version_rounds,
            allow_mixed_versions=allow_mixed_versions,
        )

    @staticmethod
    def _model_args(model: str, version: str | int | None) -> tuple[str, str]:
        if not isinstance(model, str):
            raise TypeError(f"model must be a name (str), got {type(model).__name__}")
        if version is None or (isinstance(version, str) and version.strip().lower() == "latest"):
            return model, ""  # "latest", as `gnnserve predict --version latest` takes it: the newest loaded
        return model, str(version)


def _reopened(cls: type[_ClientBase], address: str, options: ClientOptions, closed: bool) -> _ClientBase:
    """A client unpickled (:meth:`_ClientBase.__reduce__`): the same address and options, a channel of its own."""
    client = cls(address, options)
    if closed:
        client._closed = True  # nothing to close: the async channel opens on first use, a sync one ...
        if isinstance(client, GnnClient):
            client._channel.close()  # ... is closed here
    return client


class GnnClient(_ClientBase):
    """Blocking client for a gnnserve server (``gnnserve.v1.GnnService`` and ``grpc.health.v1``).

    Args:
        address: ``"host:port"`` (``grpcs://host:port`` turns TLS on; any gRPC target works).
        options: a :class:`~clients.types.ClientOptions` (TLS, token, timeout, retries, chunking).
        **overrides: any :class:`~clients.types.ClientOptions` field as a keyword (it overrides ``options``).

    The client may be shared between threads. Use it as a context manager or call :meth:`close`.
    It pickles as its address and options (for a ``multiprocessing`` pool, say; the token and TLS material
    travel in the pickle): the copy opens a channel of its own in the process that unpickles it.

    Example::

        with GnnClient("127.0.0.1:8500", token="s3cret", timeout=5.0) as client:
            print(client.health())                       # "SERVING"
            for info in client.list_models():
                print(info.name, info.version, len(info.knob_table))
            res = client.predict("cora-sage", range(1000), max_accuracy_loss=0.01)
            print(res.labels[:10], res.settings.chosen_by)
    """

    def __init__(self, address: str, options: ClientOptions | None = None, **overrides: Any) -> None:
        super().__init__(address, options, **overrides)
        cfg = self._config
        if cfg.credentials is not None:
            self._channel = grpc.secure_channel(cfg.target, cfg.credentials, options=cfg.options)
        else:
            self._channel = grpc.insecure_channel(cfg.target, options=cfg.options)
        self._stub = pb_grpc.GnnServiceStub(self._channel)
        self._health_stub: Any = None
        n = self.max_concurrent_calls
        self._slots = threading.BoundedSemaphore(n) if n is not None else None

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the channel (idempotent). Calls made afterwards raise ``ValueError``."""
        if not self._closed:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> GnnClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def _invoke(self, state: RetryState, fn: Any, request: Any) -> Any:
        """One RPC with retries (see :class:`~clients._core.RetryState`) under the call's deadline."""
        self._check_open()
        state.attempts = state.retries = 0  # the retry budget is per RPC; the deadline is per call
        while True:
            state.attempts += 1
            timeout = state.remaining()
            slots = self._slots
            if slots is not None and not slots.acquire(timeout=timeout):
                raise self._no_slot(state)
            try:
                # a wait for a slot spends the deadline too
                return fn(request, timeout=timeout if slots is None else state.remaining(),
                          metadata=self._config.metadata, wait_for_ready=state.wait_for_ready)
            except grpc.RpcError as err:
                try:
                    delay = state.failed(err)
                except GnnServeError as exc:
                    raise exc from None
            finally:
                if slots is not None:
                    slots.release()
            time.sleep(delay)

    def _chunk_limits(self, model: str, version: str, rows: int, state: RetryState) -> ChunkLimits:
        if rows <= SAFE_UNCHUNKED:
            return ChunkLimits(max_nodes=max(1, rows))
        lim = self._cached_limits(model, version)
        if lim is None:
            info = self._invoke(state, self._stub.GetModel, pb.GetModelRequest(name=model, version=version))
            lim = self._store_limits(model, version, info)
        return lim

    def _run(self, plan: PredictPlan, state: RetryState, t0: float, model: str, version: str) -> PredictResult:
        while (req := plan.next_request()) is not None:
            try:
                resp = self._invoke(state, self._stub.Predict, req)
            except GnnServeError as exc:
                if plan.shrink(exc):  # refused for its size alone: its rows go again, in smaller requests
                    self._learn_node_limit(model, version, plan)
                    continue
                raise plan.located(exc) from None
            plan.add(resp)
        self._learn(model, version, plan)
        return plan.result(1e3 * (time.perf_counter() - t0))

    # ------------------------------------------------------------------ API
    def predict(
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
        """Classify existing nodes of the model's graph.

        Args:
            model: model name. version: a loaded version (default, None or ``"latest"``: the newest loaded).
            nodes: node ids (a list, range, integer array or a single id); duplicates allowed.
                Lists longer than the server's per-request limit (or ``max_nodes_per_call``) or
                than fits a message are sent in several requests and reassembled in order; a request the
                server refuses for its size alone (its node, new-node-neighbour or work limit: an exact width
                at a large PPR budget, say) is sent again in smaller ones.
            sampling_width: S, edges kept per row in each aggregation (0 = exact; default: the model's).
            ppr_budget: K, nodes in each PPR subgraph (default: the model's).
            max_accuracy_loss: let the server choose the cheapest knob-table setting within this
                loss of exact (absolute, 0.01 = one point); an explicit S / K is kept and the loss chooses the
                other; a loss no setting at the explicit knobs meets raises :class:`InvalidArgumentError`.
            return_probabilities / return_embeddings: what to send back besides labels.
            timeout: deadline in seconds for the whole call (default: the client's).
            request_id: id the server logs (the server makes one when omitted).
            min_graph_version: read-your-writes: answer from the model's graph at this version or newer
                (the ``graph_version`` an :meth:`update_graph` result carries; None or 0: whatever version
                the server holds). A server still behind waits for it, up to its
                ``--read-your-writes-timeout-s`` (1 s by default) and never past ``timeout``, then fails
                ``UNAVAILABLE``; a version the graph's update log has never written is refused at once
                (:class:`FailedPreconditionError`, not retried). A negative value raises
                :class:`InvalidArgumentError`.
            new_nodes: nodes that are not in the graph (:class:`~clients.types.NewNode`: features, neighbours,
                optional weights), classified in the same call as ``nodes`` (as :meth:`predict_new_node` does,
                the graph unchanged): their rows follow the existing nodes' rows in the result (``result.nodes``
                holds the existing ids only). ``nodes`` may then be empty. They travel in requests of their own
                (the server answers them on the path that builds induced subgraphs, where existing nodes would
                lose their faster paths), answered at the same graph version as the existing nodes.
            allow_mixed_versions: a chunked call over a graph taking updates has its chunks answered at different
                graph versions (a server answers from its newest graph). By default (False) the chunks behind the
                newest are sent again at it, up to ``ClientOptions.max_version_rounds`` rounds, so every row is
                computed at the one ``graph_version`` the result reports; if updates outrun that, the call raises
                :class:`AbortedError`. True: nothing is sent again; rows keep the version that answered them,
                given per row by ``result.graph_versions`` (``result.graph_version`` is then the newest).

        Returns:
            :class:`~clients.types.PredictResult` (labels, probabilities, embeddings, settings, timing).

        Raises:
            InvalidArgumentError (id out of range, bad knob), NotFoundError (model/version),
            UnavailableError (after retries; also a ``min_graph_version`` not reached in time),
            FailedPreconditionError (a ``min_graph_version`` never written; an answer that would not be
            finite), AbortedError (chunks still at different graph versions after ``max_version_rounds`` rounds;
            see ``allow_mixed_versions``), DeadlineExceededError, UnauthenticatedError, ...

        Example::

            res = client.predict("cora-sage", [0, 5, 7], sampling_width=8, ppr_budget=32)
            res.labels                  # array([3, 1, 3])
            res.settings.sampling_width # 8
            res = client.predict("cora-sage", [0, 5], new_nodes=[NewNode(x, neighbors=[12, 40])])
            res.labels[2]               # the new node's label
        """
        t0 = time.perf_counter()
        model, ver = self._model_args(model, version)
        ids = node_array(nodes)
        msgs = new_node_messages(new_nodes) if has_new_nodes(new_nodes) else []
        knobs = knob_fields(sampling_width, ppr_budget, max_accuracy_loss, min_graph_version)
        state = self._state("Predict", timeout)
        limits = self._chunk_limits(model, ver, len(ids) + len(msgs), state)
        plan = self._plan(model, ver, ids, msgs, knobs, return_probabilities, return_embeddings, request_id, limits,
                          allow_mixed_versions)
        return self._run(plan, state, t0, model, ver)

    def predict_new_node(
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
        """Classify nodes that are not in the stored graph, from raw features and edges.

        One node: ``features`` ``[F]`` and ``neighbors`` (existing ids; edges go both ways) with
        optional ``edge_weights`` (one weight per neighbour, finite and >= 0). Several nodes: ``features``
        ``[m, F]`` with ``neighbors`` a list of m id lists (and ``edge_weights`` a list of m lists
        or None), or a list of :class:`~clients.types.NewNode`. The stored graph is not changed.
        Knobs and the result are as for :meth:`predict` (``result.nodes`` is empty; row i is new node i).

        ``min_graph_version``: read-your-writes, as for :meth:`predict`: the new nodes are attached to the
        model's graph at this version or newer (an :meth:`update_graph` result's ``graph_version``); a
        server still behind waits up to its ``--read-your-writes-timeout-s`` (and never past ``timeout``)
        before ``UNAVAILABLE``, and refuses at once (``FAILED_PRECONDITION``) a version the graph's log never wrote.
        ``allow_mixed_versions``: as for :meth:`predict` (a call of many new nodes is chunked too; every row is
        computed at ``result.graph_version`` unless it is True).

        Example::

            x = np.random.rand(info.num_features).astype(np.float32)
            res = client.predict_new_node("cora-sage", x, neighbors=[12, 40, 41])
            print(res.labels[0], res.probabilities[0])
        """
        t0 = time.perf_counter()
        model, ver = self._model_args(model, version)
        msgs = new_node_messages(features, neighbors, edge_weights)
        knobs = knob_fields(sampling_width, ppr_budget, max_accuracy_loss, min_graph_version)
        state = self._state("Predict", timeout)
        limits = self._chunk_limits(model, ver, len(msgs), state)
        plan = self._plan(model, ver, np.zeros(0, dtype=np.int64), msgs, knobs, return_probabilities,
                          return_embeddings, request_id, limits, allow_mixed_versions)
        return self._run(plan, state, t0, model, ver)

    def update_graph(
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
        """Change the graph ``model`` serves on (every model on that graph sees it), atomically.

        Args:
            model: any model served on the graph. version: a loaded version (default: the latest).
            features: new raw features of existing nodes: ``{node: row}`` or ``(node_ids, rows [n, F])``.
            new_nodes: :class:`~clients.types.NewNode` objects (features, neighbours, optional weights);
                they get the ids ``num_nodes, num_nodes + 1, ...`` (``result.new_node_ids``).
            add_edges: ``(u, v)`` or ``(u, v, weight)`` per edge, or an array ``[k, 2]`` / ``[k, 3]``;
                edges are undirected and may name this call's new nodes.
            remove_edges: ``(u, v)`` per edge; removals apply before additions (remove and add the
                same edge to re-weight it).
            expect_graph_version: apply only if the graph is still at this version (else
                :class:`~clients.errors.AbortedError`): optimistic concurrency.

        A bad entry is :class:`~clients.errors.InvalidArgumentError` naming it, and nothing of the call
        is applied. Not retried (an update is not idempotent), unless ``expect_graph_version`` is given:
        then a retry of an update that did land fails with ABORTED instead of applying twice.

        A failure does not always mean "not applied". The server commits an update when it appends it to its
        update log; one whose ``timeout`` passes before that is refused and never applied. But if the timeout
        passes after the append (while the server applies it: seconds for a large update) or the answer is lost
        on the way, the update stands although this call raises :class:`~clients.errors.DeadlineExceededError`
        (or ``UnavailableError``): no server can tell a client about a commit whose answer was lost. Before
        sending such an update again, read ``graph_version`` (:meth:`get_model`), or send it with
        ``expect_graph_version`` from the start (ABORTED on the retry then means the first attempt landed).

        Example::

            up = client.update_graph("cora-gcn", add_edges=[(1, 2)], features={7: x7})
            res = client.predict("cora-gcn", [1, 2, 7], min_graph_version=up.graph_version)
        """
        t0 = time.perf_counter()
        model, ver = self._model_args(model, version)
        req = update_request(model, ver, features=features, new_nodes=new_nodes, add_edges=add_edges,
                             remove_edges=remove_edges, expect_graph_version=expect_graph_version,
                             request_id=request_id)
        state = self._state("UpdateGraph", timeout, retries=expect_graph_version is not None)
        resp = self._invoke(state, self._stub.UpdateGraph, req)
        return update_result_from_pb(resp, 1e3 * (time.perf_counter() - t0))

    def list_models(self, timeout: float | None = None) -> list[ModelInfo]:
        """Every loaded model version with its knob table.

        Example::

            for m in client.list_models():
                print(m.name, m.version, m.architecture, m.metrics.get("test_accuracy"))
        """
        state = self._state("ListModels", timeout)
        resp = self._invoke(state, self._stub.ListModels, pb.ListModelsRequest())
        return [model_info_from_pb(m) for m in resp.models]

    def repository_index(self, timeout: float | None = None) -> list[dict[str, str]]:
        """Every model version in the server's repository, loaded or not: ``{"name", "version", "state",
        "reason"}`` with state ``READY`` or ``UNAVAILABLE`` and why (the reason its load failed, loading,
        unloaded). The KServe / Triton ``RepositoryIndex`` call on the same connection.

        Example::

            for m in client.repository_index():
                if m["state"] != "READY":
                    print(m["name"], m["version"], m["reason"])
        """
        from ._gen import inference_pb2 as ipb
        from ._gen import inference_pb2_grpc as ipb_grpc

        stub = ipb_grpc.GRPCInferenceServiceStub(self._channel)
        state = self._state("RepositoryIndex", timeout)
        resp = self._invoke(state, stub.RepositoryIndex, ipb.RepositoryIndexRequest())
        return [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in resp.models]

    def get_model(self, name: str, version: str | int | None = None, timeout: float | None = None) -> ModelInfo:
        """One model (the latest version unless ``version`` is given).

        Example::

            info = client.get_model("cora-sage")
            print(info.num_classes, info.default_sampling_width, info.best_knobs(0.01))
        """
        name, ver = self._model_args(name, version)
        state = self._state("GetModel", timeout)
        info = self._invoke(state, self._stub.GetModel, pb.GetModelRequest(name=name, version=ver))
        self._store_limits(name, ver, info)
        return model_info_from_pb(info)

    def health(self, service: str = "", timeout: float | None = None) -> str:
        """The server's ``grpc.health.v1`` status: ``"SERVING"``, ``"NOT_SERVING"`` or ``"UNKNOWN"``.

        ``service`` "" asks about the server as a whole. Not retried: a failure to connect raises
        :class:`~clients.errors.UnavailableError` at once; an unknown service raises NotFoundError.

        Example::

            if client.health() != "SERVING":
                ...
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        if self._health_stub is None:
            self._health_stub = health_pb2_grpc.HealthStub(self._channel)
        state = self._state("Health", timeout, retries=False)
        try:
            resp = self._invoke(state, self._health_stub.Check, health_pb2.HealthCheckRequest(service=service))
        except NotFoundError:
            raise NotFoundError(f"the server has no health status for service {service!r}", method="Health") from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def wait_ready(self, timeout: float = 30.0, service: str = "") -> None:
        """Block until the server reports ``SERVING`` (polling with the client's backoff).

        Raises :class:`~clients.errors.DeadlineExceededError` when it does not within ``timeout``
        seconds (the message says what it last saw).

        Example::

            client = GnnClient("127.0.0.1:8500")
            client.wait_ready(timeout=60)   # e.g. right after starting the server
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
                status = self.health(service, timeout=min(left, max(1.0, self.backoff.max_s)))
                if status == "SERVING":
                    return
                last = status
            except (UnavailableError, DeadlineExceededError, NotFoundError) as exc:
                last = str(exc)
            time.sleep(min(max(0.0, deadline - time.monotonic()), self.backoff.nominal(attempt)))
            attempt += 1
