"""Result and configuration types of the client SDK (plain dataclasses over NumPy arrays).

Example::

    from clients import GnnClient

    with GnnClient("127.0.0.1:8500") as client:
        res = client.predict("cora-sage", [0, 1, 2], sampling_width=16)
        res.labels            # int64 [3]
        res.probabilities     # float32 [3, C]
        res.settings.sampling_width, res.settings.edges_kept_fraction
        res.timing.total_ms
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .knob_rules import cheapest_within, exact_reference

__all__ = ["Backoff", "ClientOptions", "KnobRow", "ModelInfo", "NewNode", "PredictResult", "Settings", "Timing",
           "UpdateResult"]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter between retries of a call that failed ``UNAVAILABLE``.

    The nominal delay before retry ``i`` (0-based) is ``min(max_s, initial_s * multiplier**i)``;
    the actual delay is drawn uniformly from ``[(1 - jitter) * nominal, nominal]`` so that many
    clients do not retry in lock step. Retries never run past the call's deadline.

    Example::

        GnnClient("127.0.0.1:8500", max_retries=5, backoff=Backoff(initial_s=0.05, max_s=1.0))
    """

    initial_s: float = 0.1
    max_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (self.initial_s >= 0 and self.max_s >= self.initial_s and self.multiplier >= 1.0):
            raise ValueError(f"bad backoff {self}: need 0 <= initial_s <= max_s and multiplier >= 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"backoff jitter must be in [0, 1], got {self.jitter}")

    def nominal(self, attempt: int) -> float:
        """The delay before retry ``attempt`` (0-based), before jitter."""
        return min(self.max_s, self.initial_s * self.multiplier ** min(attempt, 64))

    def delay(self, attempt: int, rand: float) -> float:
        """The jittered delay for retry ``attempt`` given a uniform draw ``rand`` in [0, 1)."""
        return self.nominal(attempt) * (1.0 - self.jitter * rand)



PemSource = bytes | str | os.PathLike  # PEM bytes, a PEM string or a path

#: RPCs one client keeps in flight by default (ClientOptions.max_concurrent_calls): a quarter of a server's default
#: --max-concurrent-rpcs, and plenty to fill its batches
DEFAULT_MAX_CONCURRENT_CALLS = 256


@dataclass(frozen=True)
class ClientOptions:
    """How a :class:`~clients.GnnClient` / :class:`~clients.AsyncGnnClient` connects and calls: one
    value that both take (``GnnClient(address, options)``), or its fields as keywords
    (``GnnClient(address, token="s3cret", timeout=5.0)``; keywords override ``options``).

    Attributes:
        tls: use TLS and verify the server's certificate (against ``root_certificates``, or the
            system's roots when none are given). Giving any certificate also turns TLS on.
        root_certificates: CA certificate(s) to verify the server with: PEM bytes, a PEM string or a path.
        client_cert, client_key: a client certificate and its key (PEM bytes, string or path) for
            servers that require client certificates (mutual TLS).
        tls_server_name: the name to check the server's certificate against, when it differs from
            the host in the address.
        token: bearer token sent as ``authorization: Bearer <token>`` on every call.
        timeout: default deadline in seconds for each method call, covering every chunk and
            retry of the call (None = no deadline). Each method also takes ``timeout=``.
        max_retries: retries after ``UNAVAILABLE``, or a ``CANCELLED`` from the server side (0 = none); never
            for other codes unless ``retry_resource_exhausted`` adds ``RESOURCE_EXHAUSTED``. An update is
            retried only with ``expect_graph_version`` (a failed update may still have been applied: a deadline
            that passed, or an answer lost, after the server logged it; :meth:`GnnClient.update_graph`). This SDK never cancels a call itself, so a
            ``CANCELLED`` comes from the server's gRPC: a server that stops cancels the calls it accepted but
            had not yet handed over, and under a flood far past the server's capacity grpc-core may cancel
            calls waiting in its own queues before ``--max-concurrent-rpcs`` refuses them (uncounted by the
            server; docs/RELIABILITY.md, "Limits"). The two carry the same bare status, so both are retried,
            within ``timeout`` and with ``backoff``: what a rolling restart needs; under overload it adds a few
            spaced retries of the cancelled share. ``0`` sheds such calls at once instead.
        backoff: delays between retries (:class:`Backoff`: exponential with jitter).
        retry_resource_exhausted: also retry calls refused because the server's queue is full.
        channel_options: extra gRPC channel options (they override the client's own, e.g.
            ``{"grpc.max_receive_message_length": 16 << 20}``).
        max_nodes_per_call: send at most this many nodes per request (the server's own
            ``max_nodes_per_request`` applies too); longer lists are split and reassembled in order.
        max_concurrent_calls: RPCs one client has in flight at once (None = no bound); more wait in the
            client, within their deadline. A server takes ``--max-concurrent-rpcs`` (1000) at once and refuses
            or cancels the rest (RESOURCE_EXHAUSTED, CANCELLED), so ``asyncio.gather`` over thousands of
            ``predict`` calls failed part of them; bounded, they queue here and all are answered, as fast (the
            server batches the calls in flight).
        wait_for_ready: a call made while the server cannot be reached (restarting, not yet listening) waits
            for it, within ``timeout``, instead of failing ``UNAVAILABLE`` after ``max_retries`` quick retries
            (gRPC's wait-for-ready: the request is sent once the connection is up, so an update is never sent
            twice by it), and so does a call the server answers ``UNAVAILABLE`` while it loads its models
            (retried with ``backoff`` until the deadline, beyond ``max_retries``). A restart takes seconds (4-7
            s for the tiny test models, more with large graphs), longer than the default retries' backoff; give
            a ``timeout`` that covers it (without one such a call waits as long as the server is down). Health
            checks never wait (they report the server's state as it is). Default off: fail fast.
        max_version_rounds: a chunked ``predict`` whose chunks were answered at different graph versions (updates
            landed between them) sends the chunks behind the newest version again, asking for it, until all agree;
            at most this many rounds (each within the call's ``timeout``), then it raises
            :class:`~clients.errors.AbortedError` instead of returning rows of several versions under one label
            (:class:`PredictResult`). 0: never send again (raise at once, unless ``allow_mixed_versions``).
    """

    tls: bool = False
    root_certificates: PemSource | None = None
    client_cert: PemSource | None = None
    client_key: PemSource | None = None
    tls_server_name: str | None = None
    token: str | None = None
    timeout: float | None = None
    max_retries: int = 3
    backoff: Backoff | None = None  # None: Backoff()
    retry_resource_exhausted: bool = False
    channel_options: Sequence[tuple[str, Any]] | dict[str, Any] | None = None
    max_nodes_per_call: int | None = None
    max_concurrent_calls: int | None = DEFAULT_MAX_CONCURRENT_CALLS
    wait_for_ready: bool = False
    max_version_rounds: int = 3

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds (or None for no deadline), got {self.timeout}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.max_nodes_per_call is not None and self.max_nodes_per_call < 1:
            raise ValueError(f"max_nodes_per_call must be >= 1, got {self.max_nodes_per_call}")
        if self.max_version_rounds < 0:
            raise ValueError(f"max_version_rounds must be >= 0, got {self.max_version_rounds}")
        if self.max_concurrent_calls is not None and self.max_concurrent_calls < 1:
            raise ValueError(f"max_concurrent_calls must be >= 1 (or None for no bound), got {self.max_concurrent_calls}")

@dataclass(frozen=True)
class Settings:
    """The settings a request actually ran with (mirrors ``gnnserve.v1.Settings``).

    ``sampling_width`` 0 = exact aggregation; ``ppr_budget`` 0 = not applicable (L-hop model);
    ``chosen_by`` is ``"request"``, ``"default"`` or ``"max_accuracy_loss"``;
    ``expected_accuracy`` is the validation accuracy of the knob-table row at these settings (0 if
    the table has no such row); ``edges_kept`` / ``edges_total`` count aggregated edges over all
    layers (summed over chunks for a chunked call).
    """

    sampling_width: int = 0
    ppr_budget: int = 0
    strategy: str = ""
    extractor: str = ""
    chosen_by: str = ""
    expected_accuracy: float = 0.0
    edges_kept: int = 0
    edges_total: int = 0

    @property
    def edges_kept_fraction(self) -> float:
        """``edges_kept / edges_total`` (1.0 when there were no edges)."""
        return self.edges_kept / self.edges_total if self.edges_total else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """Server-side time per stage in milliseconds (mirrors ``gnnserve.v1.Timing``), plus the client's view.

    For a call the SDK split into several requests (``chunks > 1``) the stage times and
    ``total_ms`` are **sums over the chunks** (server time spent on this call; chunks run one
    after another; requests sent again in a version round, see :class:`PredictResult`, included), and
    ``batch_size`` is the **largest** batch any chunk rode in. ``client_ms`` is
    the wall time of the whole SDK call as the client saw it: every chunk, the network, retries and
    the one-off model lookup used for chunking.
    """

    queue_ms: float = 0.0
    subgraph_ms: float = 0.0
    features_ms: float = 0.0
    forward_ms: float = 0.0
    total_ms: float = 0.0
    batch_size: int = 0
    chunks: int = 1
    client_ms: float = 0.0
    #: rounds of sending again the chunks answered at an older graph version than the newest of the call, to
    #: bring every row to one version (0: none was needed; ``chunks`` counts the requests sent again too)
    version_rounds: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class PredictResult:
    """The answer to one :meth:`GnnClient.predict` / :meth:`GnnClient.predict_new_node` call.

    Rows follow the request order: first the existing ``nodes`` (duplicates kept), then any new
    nodes. ``labels`` int64 ``[n]``; ``probabilities`` float32 ``[n, num_classes]`` (None when
    not asked for); ``embeddings`` float32 ``[n, H]`` (None when not asked for or when the model
    has none); ``settings`` and ``timing`` as described on their classes; ``model`` / ``version``
    the model that answered (a chunked call is pinned to the version that answered its first
    chunk); ``request_id`` the id the server logged (chunks after the first are logged as
    ``"<request_id>/<i>"``); ``graph_version`` the live graph's version every row was computed on (see
    :meth:`GnnClient.update_graph`, and "Graph versions of a chunked call" below); ``data_version`` the data
    the answer was computed from, pinned by
    version and content digest (``"features:v3:<checksum>"``, ``";graph:v2:<checksum>"`` appended
    on a stateless replica, ``"memory:<dataset fingerprint>"`` for in-process data; empty from a
    server that predates it). A chunked call whose chunks were answered from different data (say,
    replicas mid-rollout) lists each distinct value, joined by ``" | "``.

    Graph versions of a chunked call: a server answers each request from its newest graph, so when updates land
    while the SDK sends a long call's chunks, they are answered at different versions. The SDK then sends the
    chunks answered at an older version again, asking for the newest (``min_graph_version``), until every chunk
    agrees (``timing.version_rounds`` counts the rounds; none, and no extra request, when no update landed), so
    every row, duplicates and new nodes included, is computed at ``graph_version``. If updates keep outrunning
    it for ``ClientOptions.max_version_rounds`` rounds the call raises :class:`~clients.errors.AbortedError`
    rather than mislabel rows. With ``predict(..., allow_mixed_versions=True)`` nothing is sent again: rows keep
    the version that answered them, ``graph_versions`` (int64 ``[n]``, aligned with the rows) says which, and
    ``graph_version`` is then the newest of them (``mixed_versions`` tells whether they differ).

    Example::

        res = client.predict("cora-sage", range(100))
        best = res.probabilities.max(axis=1)        # confidence per node
        print(res.settings.sampling_width, res.timing.total_ms)
    """

    labels: np.ndarray
    probabilities: np.ndarray | None
    embeddings: np.ndarray | None
    settings: Settings
    timing: Timing
    model: str
    version: str
    request_id: str
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    num_classes: int = 0
    data_version: str = ""
    #: the live graph's version every row was computed on (0 before any update; see "Graph versions of a chunked
    #: call" above); only under ``allow_mixed_versions`` can rows differ, and this is then the newest of them
    graph_version: int = 0
    #: which server process answered (``"<pid> <slot>/<N>"`` under ``--processes``, else ``"<pid>"``); a
    #: chunked call answered by several lists each, joined by ``" | "``
    served_by: str = ""
    #: int64 ``[n]``: the graph version each row was computed on, aligned with the rows (all ``graph_version``
    #: unless ``allow_mixed_versions`` let them differ); empty on a result built without it
    graph_versions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def mixed_versions(self) -> bool:
        """Whether rows were computed at different graph versions (possible only with ``allow_mixed_versions``;
        ``graph_versions`` says which row at which)."""
        return bool(self.graph_versions.size) and bool((self.graph_versions != self.graph_version).any())

    @property
    def num_new_nodes(self) -> int:
        """Rows after the existing nodes: the new nodes of the call."""
        return len(self) - int(self.nodes.shape[0])

    @property
    def top_probabilities(self) -> np.ndarray | None:
        """float32 ``[n]``: the probability of each row's predicted label (None without probabilities)."""
        if self.probabilities is None:
            return None
        if len(self) == 0:
            return np.zeros(0, dtype=np.float32)
        return self.probabilities[np.arange(len(self)), self.labels]

    def to_dict(self, *, probabilities: bool = True, embeddings: bool = True) -> dict[str, Any]:
        """JSON-friendly dict (lists instead of arrays)."""
        out: dict[str, Any] = {
            "model": self.model,
            "version": self.version,
            "request_id": self.request_id,
            "data_version": self.data_version,
            "graph_version": self.graph_version,
            "mixed_versions": self.mixed_versions,
            "served_by": self.served_by,
            "nodes": self.nodes.tolist(),
            "num_new_nodes": self.num_new_nodes,
            "labels": self.labels.tolist(),
        }
        top = self.top_probabilities
        if top is not None:
            out["top_probability"] = [float(v) for v in top]
        if self.mixed_versions:  # else every row's is graph_version
            out["graph_versions"] = self.graph_versions.tolist()
        if probabilities and self.probabilities is not None:
            out["probabilities"] = self.probabilities.tolist()
        if embeddings and self.embeddings is not None:
            out["embeddings"] = self.embeddings.tolist()
        out["settings"] = self.settings.to_dict()
        out["settings"]["edges_kept_fraction"] = self.settings.edges_kept_fraction
        out["timing"] = self.timing.to_dict()
        return out


@dataclass(frozen=True)
class KnobRow:
    """One row of a model's knob table, measured on its validation nodes at training time.

    ``ppr_budget`` 0 = not applicable (L-hop model); ``sampling_width`` 0 = exact.
    """

    ppr_budget: int
    sampling_width: int
    val_accuracy: float
    latency_ms_per_node: float
    edges_kept_fraction: float
    #: share of a sample of the graph's nodes (the checkpoint's ``knob_agreement_nodes``) whose label at this
    #: setting equals the exact reference's; ``1 - agreement`` bounds the setting's accuracy loss whatever the
    #: labels, and is the loss ``max_accuracy_loss`` and :meth:`ModelInfo.best_knobs` compare. None for a table
    #: measured before 2026-11-29 (they compare validation accuracies then).
    agreement: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model version as the server describes it (mirrors ``gnnserve.v1.ModelInfo``).

    Example::

        info = client.get_model("cora-sage")
        print(info.version, info.num_classes, info.max_nodes_per_request)
        for row in info.knob_table:
            print(row.ppr_budget, row.sampling_width, row.val_accuracy)
        row = info.best_knobs(0.01)   # cheapest setting within 1 point of exact
    """

    name: str
    version: str
    versions: list[str]
    architecture: str
    extractor: str
    num_features: int
    num_classes: int
    num_nodes: int
    max_ppr_budget: int
    default_sampling_width: int
    default_ppr_budget: int
    max_sampling_width: int
    max_nodes_per_request: int
    strategy: str
    knob_table: list[KnobRow]
    metrics: dict[str, float]
    dataset_fingerprint: str
    ready: bool
    feature_store: str
    #: updates applied to the model's graph (UpdateGraph); 0 = the graph as loaded
    graph_version: int = 0
    #: whether the server refuses graph updates for this model (``--read-only``, or no update log)
    read_only: bool = False
    #: a request's estimated aggregation work (edges) above which the server refuses it (RESOURCE_EXHAUSTED:
    #: the SDK then sends its nodes in smaller requests); 0 = not reported (a server before 2026-11-29)
    max_request_work: int = 0
    #: new-node neighbours over all new nodes of one request; 0 = not reported
    max_new_node_edges: int = 0

    @property
    def exact_accuracy(self) -> float | None:
        """Validation accuracy of the exact row (width 0) at the largest budget; None without a table."""
        ref = self._exact_row()
        return None if ref is None else ref.val_accuracy

    def _exact_row(self) -> KnobRow | None:
        return exact_reference(self.knob_table)

    def best_knobs(self, max_accuracy_loss: float) -> KnobRow | None:
        """The fastest knob-table row whose loss is at most ``max_accuracy_loss`` (absolute: 0.01 = one
        point): ``1 - agreement``, the share of nodes whose label differs from the exact one (older tables: its
        validation accuracy below exact's; :mod:`clients.knob_rules`); None when the table has no exact row.

        This is the rule the server applies to ``predict(..., max_accuracy_loss=L)`` without
        explicit knobs (both call :func:`clients.knob_rules.cheapest_within`), so a client can see
        in advance what it will get.

        Example::

            row = info.best_knobs(0.02)
            res = client.predict(info.name, nodes, sampling_width=row.sampling_width, ppr_budget=row.ppr_budget)
        """
        if not (math.isfinite(max_accuracy_loss) and max_accuracy_loss >= 0):
            raise ValueError(f"max_accuracy_loss must be finite and >= 0, got {max_accuracy_loss}")
        return cheapest_within(self.knob_table, max_accuracy_loss)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NewNode:
    """A node that is not in the stored graph: raw features ``[F]``, edges to existing node ids
    (taken in both directions) and optional edge weights (one per neighbour, finite and >= 0).

    Example::

        client.predict_new_node("cora-sage", [NewNode(x0, [1, 2]), NewNode(x1, [5], [0.5])])
    """

    features: Sequence[float] | np.ndarray
    neighbors: Sequence[int] | np.ndarray
    edge_weights: Sequence[float] | np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class UpdateResult:
    """The answer to one :meth:`GnnClient.update_graph` call.

    ``graph_version`` is the version that includes the update: pass it as ``min_graph_version`` to
    :meth:`GnnClient.predict` to read your own write on any replica. ``new_node_ids`` are the ids the
    call's new nodes got, in order; ``invalidated`` the cached rows the server dropped, per cache.

    Example::

        up = client.update_graph("cora-gcn", add_edges=[(1, 2)])
        res = client.predict("cora-gcn", [1, 2], min_graph_version=up.graph_version)
    """

    graph_version: int
    new_node_ids: np.ndarray
    num_nodes: int
    num_edges: int
    request_id: str
    invalidated: dict[str, int]
    apply_ms: float
    client_ms: float = 0.0
