"""One loaded model version and the pipeline that answers its requests.

Path of a batch (:meth:`ModelRuntime.process`, in the worker thread):

1. **subgraph**: top-K PPR lists from the offline index (``ppr`` models) or the exact L-hop scope
   (``lhop`` models); new nodes get an online push / their L-hop scope on the graph plus their
   edges (virtual ids ``N, N+1, ...``; the stored graph is never changed); then one block-diagonal
   :class:`~kernels.subgraph.SubgraphBatch` with the batch's distinct node ids.
2. **features**: first-layer projections of the distinct ids from the
   :class:`~serve.projection.ProjectionCache` (fetching raw features from the feature store only
   for nodes not seen before); new nodes are projected from the features in the request.
3. **forward**: ``forward_batch_projected`` at the batch's sampling width; softmax; argmax.
4. **split**: rows back to their requests, with the edges each request's subgraphs kept.

A plain 2-layer model on the compiled CPU path keeps its first layer's output per node and width
(:class:`~serve.projection.ActivationCache`): step 1 is then the last layer's one-layer plan, step
2 that layer's input rows (first-layer rows computed for the nodes not seen before), step 3 the
last layer alone.

Items with the same (sampling width, PPR budget, whether they bring new nodes) share a batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kernels.graph import CSRGraph
from kernels.graph_edit import _self_loop_count
from kernels.plan import (
    ExactPathEdges,
    ExecutionPlan,
    execution_plan,
    update_walk_sums,
    walk_bounds,
    walk_sums,
)
from kernels.subgraph import (
    ExtraEdges,
    SubgraphBatch,
    in_global_order,
    induced_batch,
    lhop_nodes,
    new_node_scopes,
)
from models.base import carry_gcn_degrees, gcn_dinv32

from .batcher import DynamicBatcher, WorkItem, WouldBlock
from .errors import GraphOutOfService, InvalidArgument, NonFiniteOutput, Overloaded, Unavailable
from .features.memory import MemoryFeatureStore
from .metrics import ServerMetrics
from .paths import PATH_NAMES, ServingPath, joined, paths_for
from .projection import ActivationCache, ProjectionCache
from .stats import ModelStats, failure_reason
from .validation import ModelLimits, PredictCall, knob_rows, resolve_knobs

__all__ = ["DataBundle", "ModelRuntime", "PredictResult", "RuntimeOptions"]

log = logging.getLogger(__name__)

#: opt-in serving paths switched off for a model version when a batch on them raises (the batch takes
#: the next path): the resident paths, whose device code is the newest
SWITCHABLE_PATHS = frozenset({"plain-resident", "shadow-resident"})

# A plain model of at most 2 layers on at most this many nodes gets its exact path-edge counts for every
# node at warm-up; otherwise each node's count is computed on first use (at 3 layers the 2-hop balls reach
# the hubs and the whole graph costs seconds). Timings: docs/BENCHMARKS.md, "Serving over gRPC".
EXACT_EDGES_EAGER_NODES = 1 << 20
#: a batch computing fewer rows than this runs torch on one thread: waking its OpenMP team costs more
#: than a small operation saves, while large batches keep every thread (docs/BENCHMARKS.md, "Serving
#: over gRPC", SMALL_BATCH_ROWS)
SMALL_BATCH_ROWS = 4096
#: the default ``RuntimeOptions.torch_path_threads``: the torch operator paths (a batch with new nodes, on a CPU)
#: run on one thread. A forward there is some fifty small operators, each a parallel region whose threads meet at
#: a barrier, so one descheduled thread holds the batch: on the 2-vCPU VM (2026-11-28, shaDow-GCN, Predicts of 64
#: new nodes, docs/BENCHMARKS.md) the forward's p90 was 58 ms on two threads against 2.4 on one beside one busy
#: process, while idle the second thread saved 0.7 ms of a 20 ms request (512 new nodes: 5.8 of 142)
TORCH_PATH_THREADS = 1
#: ``RuntimeOptions.gpu_min_targets`` left unset, by the GPU path a model takes: the smallest batch at which
#: that path beat the compiled CPU path in ``benchmarks/device_split.py`` on an H200 machine (16 CPU cores;
#: Amazon Computers, docs/BENCHMARKS.md, "GPU: an H200 machine, 2026-11-25"). With CUDA graphs a plain GCN
#: batch of 48 targets was even (0.98x) and 64 faster (0.89x); shaDow-GCN 4 even (1.05x), 8 faster (0.72x).
#: Resident without graphs: plain 256 slower (1.37x), 1,024 faster (0.52x); shaDow 32 even (0.99x). The
#: torch path: shaDow 32 faster (0.88x); plain GCN never, up to 1,024 targets (3.6x slower there), so None:
#: the compiled CPU paths take every batch they can. A batch the resident path declines (a width without
#: its table yet, dirty targets after an update) goes to the compiled CPU paths below the torch entry
#: ``plain-fused``: a plain model resident with its last layer in one kernel (kernels.resident_head; CUDA
#: graphs are not captured for it): on the H200 on 2026-11-26 (docs/BENCHMARKS.md, "GPU: an H200 machine,
#: 2026-11-26") one target cost 0.058 ms there and on the compiled CPU path alike (1.00x), 8 targets 0.79x,
#: 64 0.47x, 1,024 0.08x, so it takes every batch. ``shadow-fused``: a shaDow model's whole batch in one
#: kernel (kernels.shadow_block, the default since 2026-11-27): on an H100 on 2026-11-27 (docs/BENCHMARKS.md,
#: "GPU: an H100 machine, 2026-11-27") one target at the default width cost 1.12x the compiled CPU path's,
#: 2 targets 0.76x, 8 0.32x, 1,024 0.01x (one target at the exact width 0.61x), so batches from 2 targets
GPU_MIN_TARGETS_AUTO: dict[str, int | None] = {"plain-fused": 0, "shadow-fused": 2, "plain-graphs": 64,
                                               "shadow-graphs": 8,
                                               "plain-resident": 512, "shadow-resident": 32, "plain-torch": None,
                                               "shadow-torch": 32}


#: at the exact width (sampling width 0) a path in this table takes smaller batches than
#: :data:`GPU_MIN_TARGETS_AUTO` gives it: shaDow's one-launch kernel answered one exact-width target in 0.61x
#: (H100, 2026-11-27) and 0.74x (H200, 2026-11-28) of the compiled CPU path's time, where one target at the
#: default width took 1.12x and 0.96x (docs/BENCHMARKS.md, "GPU: an H200 machine, 2026-11-28"): an exact
#: row of the dense block costs the kernel about what a sampled one does, the CPU path twice as much
GPU_MIN_TARGETS_EXACT_AUTO: dict[str, int] = {"shadow-fused": 1}


def gpu_min_targets_auto(shadow: bool, resident: bool, graphs: bool, fused: bool = False) -> int | None:
    """:data:`GPU_MIN_TARGETS_AUTO`'s entry for a GPU model (``shadow``: a shaDow model; ``resident`` /
    ``graphs`` / ``fused``: whether it took a resident path, captures CUDA graphs, answers in one kernel
    launch; ``resident`` False: the torch path's). None: no batch is better on the GPU."""
    family = "shadow" if shadow else "plain"
    kind = "torch" if not resident else ("fused" if fused else "graphs" if graphs else "resident")
    return GPU_MIN_TARGETS_AUTO[f"{family}-{kind}"]


def gpu_thresholds(options: RuntimeOptions, shadow: bool, resident: bool, graphs: bool,
                   on_gpu: bool, fused: bool = False) -> tuple[float, float]:
    """``(gpu_min_targets, fused_max_targets)`` of a runtime: its resident paths take batches of at least
    the first; its compiled CPU paths batches of at most the second. On a GPU with ``gpu_min_targets``
    unset, the compiled paths take every batch below the torch path's crossover, so that a batch the
    resident path declines goes to the faster of the two; set, it is one threshold for every GPU path."""
    if not on_gpu:
        return math.inf, options.fused_max_targets
    if options.gpu_min_targets is not None:
        torch_min: int | None = options.gpu_min_targets
        resident_min: float = options.gpu_min_targets
    else:
        torch_min = gpu_min_targets_auto(shadow, False, False)
        resident_min = gpu_min_targets_auto(shadow, True, graphs, fused) or 0
    if not resident:
        resident_min = torch_min if torch_min is not None else math.inf
    fused_max = min(options.fused_max_targets, torch_min - 1 if torch_min is not None else math.inf)
    return resident_min, fused_max


#: the default RuntimeOptions.fused_max_targets: a batch of at most this many targets on a CPU takes a
#: compiled path (serve.paths; one call instead of a dozen tensor operations per layer): by default every batch,
#: whatever its size. benchmarks/fused.py found the compiled paths faster than the torch paths at every batch
#: size the server forms (docs/BENCHMARKS.md, "Serving over gRPC"); with the torch paths on one thread
#: (TORCH_PATH_THREADS) and large shaDow batches run in chunks (COMPILED_CHUNK_TARGETS), at the sizes above that too
#: (2026-11-28, "Batch-invariant products"). One path for every batch is also what keeps a node's answer the
#: same, to the bit, whatever batch it comes in (the torch paths' bits differ in the last places).
FUSED_MAX_TARGETS = 1 << 40
#: a batch of more targets than this on the compiled shaDow path runs in chunks of this many (each target's
#: subgraph is its own, so the answers are the same bits): its rows beyond a few thousand subgraphs left the
#: caches (2026-11-28 on the 2-vCPU VM, shaDow-GCN at K = 64: 74 us per target at 4,096 targets in one call, 35
#: in chunks, against 33 at 512; docs/BENCHMARKS.md, "Batch-invariant products"). A plain model's plan shares
#: the rows of neighbouring targets, which chunks would compute again: its compiled paths take a batch whole
CHUNKED_PATHS = frozenset({"shadow-compiled"})
COMPILED_CHUNK_TARGETS = 512


@contextlib.contextmanager
def _torch_threads_for(rows: int, configured: int, fixed: int = 0):
    """One torch thread for a small batch (``fixed`` threads for any, when given), ``configured`` (the count at
    startup) restored after."""
    want = min(fixed, configured) if fixed > 0 else (configured if rows >= SMALL_BATCH_ROWS else 1)
    if want == configured:
        yield
        return
    torch.set_num_threads(want)
    try:
        yield
    finally:
        torch.set_num_threads(configured)


#: ``RuntimeOptions.inline_max_targets`` by device when not given. CPU: 256, so that a batched request of up
#: to 256 nodes whose estimated work is within ``inline_max_work`` skips the two thread hand-offs; on the
#: 2-vCPU VM (docs/BENCHMARKS.md, 2026-11-26 15:00 UTC) 64-node GCN requests served 1.08x-1.13x the node
#: predictions/s of the former 8. CUDA: 0, never (it was 8, chosen without a GPU): on an H100 on 2026-11-27
#: (docs/BENCHMARKS.md, "GPU: an H100 machine, 2026-11-27"; benchmarks/inline.py, GCN) 16 single-node
#: clients got 1.24x-1.52x the node predictions/s with batches in the worker (which then form batches of ~4
#: while a device batch runs) than inline at 8 and a lower p50, while one client's p50 was 0.10-0.25 ms
#: better inline (shaDow-GCN, one round: even at 16 clients); the server under load wins.
INLINE_MAX_TARGETS = {"cpu": 256, "cuda": 0}


def inline_targets_for(device: torch.device, configured: int | None) -> int:
    """The batcher's ``inline_max_targets`` for a model on ``device``: ``configured`` when given (0 = never
    inline), else :data:`INLINE_MAX_TARGETS` of the device's type (any device but the CPU as CUDA)."""
    if configured is not None:
        return configured
    return INLINE_MAX_TARGETS["cpu"] if device.type == "cpu" else INLINE_MAX_TARGETS["cuda"]


@dataclass
class RuntimeOptions:
    device: str = "cpu"
    max_batch_targets: int = 1024
    max_queue_targets: int = 16384
    max_delay_ms: float = 0.0
    max_nodes_per_request: int = 4096
    projection_budget_bytes: int = 2 << 30
    ppr_cache_dir: str | None = None
    #: stateless replicas: read the graph and PPR lists from Redis (``serve.graph_store``), not from disk
    graph_url: str | None = None
    graph_version: int | None = None
    graph_cache_bytes: int = 64 << 20
    #: precompute each node's induced top-K subgraph next to the PPR index when it fits (0: never)
    induced_table_bytes: int = 1 << 30
    #: build a missing induced table before the model is served (True) or on a thread beside serving, batches induced
    #: from the graph until it is attached (False); None = wait on a CUDA device or with ``resident`` (the resident
    #: shaDow path is chosen at load and needs the table), otherwise build beside serving
    induced_table_wait: bool | None = None
    #: fill the projection cache for every node while a model warms up (before it is served), and a plain
    #: model's activation table at its default width, so the first request for a node costs what later ones
    #: cost; startup then reads every node's features once
    warm_projections: bool = False
    #: plain 2-layer models on the compiled CPU path: keep each node's first-layer output per sampling
    #: width (``serve.projection.ActivationCache``, ``[N, hidden]`` floats per width) within this many
    #: bytes for all widths together; 0 = never
    activation_budget_bytes: int = 256 << 20
    #: batches of at most this many targets run on the event loop when nothing else waits (no thread
    #: hand-off; serve.batcher), when features are in memory and the graph local; 0 = never; None =
    #: :data:`INLINE_MAX_TARGETS` for the model's device (the work bound below caps the time either way)
    inline_max_targets: int | None = None
    #: ... and only when their estimated work (edges aggregated, :meth:`ModelRuntime.estimate_work`) is at
    #: most this: an exact-width request on a hub or new nodes with long neighbour lists go to the worker
    inline_max_work: int = 20_000
    #: batches of at most this many targets take a compiled path (serve.paths; a request's new node counts as
    #: one); larger ones the torch paths
    fused_max_targets: int = FUSED_MAX_TARGETS
    #: torch threads of a batch on the torch operator paths (:data:`TORCH_PATH_THREADS`); 0 = the process's count
    #: for batches of :data:`SMALL_BATCH_ROWS` rows or more, one below (the rule of the compiled paths)
    torch_path_threads: int = TORCH_PATH_THREADS
    #: a path name of serve.paths.PATH_NAMES to prefer for every batch it can take (tests, benchmarks);
    #: None = the runtime's own order
    serving_path: str | None = None
    #: a request whose estimated work exceeds this is refused (RESOURCE_EXHAUSTED) before it is queued
    max_request_work: int = 50_000_000
    #: the batcher's queue bound in estimated work (beside max_queue_targets)
    max_queue_work: int = 500_000_000
    #: neighbours over all new nodes of one request
    max_new_node_edges: int = 100_000
    #: ``device="cuda"``: batches of fewer targets than this take the compiled CPU forward (a CPU copy of the
    #: model and its own projection table) instead of the GPU, where launches and copies, not arithmetic, set
    #: a small batch's cost; 0 = every batch on the GPU; None = the measured crossover of the GPU path the
    #: model takes (:data:`GPU_MIN_TARGETS_AUTO`)
    gpu_min_targets: int | None = None
    #: keep what a batch reads on the model's device and answer batches without new nodes there, sampling on
    #: the device (:mod:`kernels.resident`): a plain 2-layer model's graph, projection table and one first-layer
    #: table per sampling width (within ``activation_budget_bytes``; ``plain-resident``), a shaDow model's
    #: PPR lists, induced table and projections (``shadow-resident``). On a GPU, batches of fewer than
    #: ``gpu_min_targets`` targets still take the compiled CPU paths. None = on a CUDA device only (on a CPU
    #: the compiled paths are faster: docs/BENCHMARKS.md, "Resident paths")
    resident: bool | None = None
    #: with ``resident`` on a CUDA device: replay one captured CUDA graph per (batch bucket, width, PPR budget)
    #: (plain models: at sampled widths up to ``kernels.resident.PAD_MAX``, and only without the fused last
    #: layer, ``fused_head``); None = whenever such a model is resident on a CUDA device
    cuda_graphs: bool | None = None
    #: a plain model resident on a CUDA device: its last layer (aggregation, classifier, softmax, arg-max) in
    #: one kernel launch whose answers land in mapped host memory (:mod:`kernels.resident_head`), instead of
    #: a dozen torch operators (and CUDA graphs of them); None = wherever that kernel runs, True = required
    #: (a plain 2-layer model that cannot take it fails to load)
    fused_head: bool | None = None
    #: a shaDow model resident on a CUDA device: its whole batch in one kernel launch, one block per target
    #: with its subgraph in shared memory (:mod:`kernels.shadow_block`), instead of the torch operators (CUDA
    #: graphs of them keep what it leaves); None = as ``kernels.shadow_block.DEFAULT_ON`` says (on, where
    #: the kernel builds and passes its check), True = required (a shaDow model that cannot take it fails to load, saying why)
    fused_shadow: bool | None = None

    #: refuse UpdateGraph (the graph stays as loaded plus its logged updates)
    read_only: bool = False
    #: entries (feature rows, new nodes and their edges, edges) per UpdateGraph request
    max_update_size: int = 100_000
    #: where the embedded default keeps each graph's update log (``<dir>/<dataset fingerprint>.log``);
    #: None = ``REPO/_live``. With Redis features or graph the log is a Redis stream beside them
    update_log_dir: str | None = None
    #: fsync the update log after every update (survives a machine crash, not only a process crash)
    update_log_fsync: bool = False
    #: how long a Predict with ``min_graph_version`` waits for that version before UNAVAILABLE
    read_your_writes_timeout_s: float = 1.0
    #: after a graph update, push a PPR list again when the bound of its move exceeds this many times the push
    #: threshold eps (kernels.ppr_live); 1 = the offline lists' own tolerance
    ppr_refresh_tolerance: float = 1.0
    #: after a graph update, push at most this many existing PPR lists again before the update returns (those
    #: moved most); the rest stay stale: a lookup pushes such a list itself until the graph's refresh thread stores it
    #: (kernels.ppr_live, "Stale lists"). -1 (the default): every list in the update, so that every server of the
    #: graph (a restart replaying the log, a follower, the writer) holds the same lists at each version; with a
    #: limit, when the refresh thread stores a list depends on timing, and later answers on it may differ between
    #: servers at one version (within the PPR tolerance)
    ppr_eager_lists: int = -1
    #: at start, after replaying a graph's file log: fold it into a snapshot when it is larger than this
    #: (``serve.live.LiveGraph.compact``); 0 = never
    compact_log_bytes: int = 256 << 20
    #: fold a graph's file log into a snapshot once replaying it would take a start more than this many seconds
    #: (the time its updates took to apply here): at start after the replay, and while serving once no update
    #: came for ``compact_idle_s`` (``serve.live.LiveGraph.compact_when_idle``); 0 = never by time
    compact_replay_s: float = 30.0
    compact_idle_s: float = 60.0

    def __post_init__(self) -> None:
        if self.serving_path is not None and self.serving_path not in PATH_NAMES:
            raise ValueError(f"unknown serving path {self.serving_path!r}; the paths are {', '.join(PATH_NAMES)}")


@dataclass
class DataBundle:
    """Graph, features and PPR indexes shared by every model version trained on one dataset."""

    fingerprint: str
    graph: CSRGraph | Any  # or a serve.graph_store.RedisGraphStore (stateless replicas)
    features: Any  # serve.features FeatureStore
    feature_store_name: str
    ppr_indexes: dict[str, Any] = field(default_factory=dict)  # PPRConfig key -> PPRIndex
    #: the graph's updates (serve.live.LiveGraph): its version, lock and update log
    live: Any = None
    #: the version ``graph`` and ``features`` are at when loaded (a compacted snapshot's; 0 = the dataset)
    base_version: int = 0


@dataclass
class PredictResult:
    call: PredictCall
    labels: np.ndarray  # int64 [n]
    probabilities: np.ndarray  # float32 [n, C]
    embeddings: np.ndarray | None  # float32 [n, H]
    timing: dict[str, float]  # ms by stage
    batch_size: int
    edges_kept: int
    edges_total: int
    path: str = ""  # the serving path that answered (serve.paths)
    graph_version: int = 0  # the live graph's version the answer was computed on (serve.live)


class ModelRuntime:
    """A model version ready to serve: model, data, projection cache, batcher."""

    def __init__(
        self,
        name: str,
        version: int,
        checkpoint: Any,  # models.checkpoint.Checkpoint
        data: DataBundle,
        ppr_index: Any | None,
        options: RuntimeOptions,
        executor: concurrent.futures.Executor,
        server_metrics: ServerMetrics | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.path = Path(checkpoint.path)
        self.device = torch.device(options.device)
        if self.device.type == "cuda":
            from kernels import spmm_cuda

            ok, why = spmm_cuda.status()
            if not ok:
                log.warning("model %s v%s on %s: the ES-SpMM CUDA kernel is not usable (%s); GPU aggregation "
                            "falls back to torch's sparse kernels (install CuPy for your CUDA: gnnserve[gpu])",
                            name, version, self.device, why)
        self._torch_threads = torch.get_num_threads()  # restored after each small batch (one thread)
        model = checkpoint.model
        self.model = model.to(self.device).eval()
        self.config = checkpoint.config
        self.metrics = checkpoint.metrics
        self.data = data
        self.graph = data.graph
        self.ppr_index = ppr_index
        self.options = options
        self.server_metrics = server_metrics
        self.architecture = str(checkpoint.arch)
        self.extractor = str(checkpoint.extractor)
        self.num_classes = int(model.num_classes)
        self.strategy = str(checkpoint.strategy)
        self.num_layers = int(getattr(model, "layers", 2))  # the model's layers (= hops of a plain model's scope)
        self.dataset_fingerprint = data.fingerprint
        self.feature_store_name = data.feature_store_name
        if self.extractor == "ppr" and ppr_index is None:
            raise ValueError(f"model {name} v{version} needs a PPR index")
        max_k = min(int(checkpoint.max_ppr_budget), int(ppr_index.k_max)) if ppr_index is not None else 0
        self.remote_graph = bool(getattr(self.graph, "is_remote", False))
        self._max_k = max_k
        self._checkpoint_defaults = (int(checkpoint.default_sampling_width), int(checkpoint.default_ppr_budget or 0),
                                     knob_rows(checkpoint.knobs))
        # plain models on a local graph: each node's exact path-edge count, kept once computed
        self._exact_edges = (ExactPathEdges(self.graph, self.num_layers)
                             if self.extractor == "lhop" and not self.remote_graph else None)
        # the price of a request before it runs (estimate_work): per node, a bound of its exact pass, from
        # the walk sums c_j = A^j d, j = 0..L (kernels.plan; kept, so that a graph update recomputes only
        # the entries it changed)
        self._walk_bound = self._nbr_scope_bound = None
        # c_0 .. c_{L-1}; the induced scope's c_L is summed per request from c_{L-1} (_scope_bound_of), so
        # that an update of the graph recomputes the sums within L - 1 hops of its rows, not L
        self._walk_sums = (walk_sums(self.graph, max(0, self.num_layers - 1))
                           if self.extractor == "lhop" and not self.remote_graph else None)
        self._mean_degree = 0.0
        self._set_derived(self._graph_derived())
        self.projections = ProjectionCache(
            self.model.project,
            data.features,
            self.graph.num_nodes,
            int(model.projection_dim),
            budget_bytes=options.projection_budget_bytes,
            device=self.device,
        )
        self._gcn_degrees: np.ndarray | None = None
        # with a projection table, batches up to FUSED_MAX_TARGETS take the compiled CPU forward
        # (kernels.fused_forward): plain models on a local graph (their plans index it), shaDow models; the
        # torch path stays for the rest (no table, new nodes, larger batches). On a GPU, only batches of fewer
        # than gpu_min_targets targets take it, with a CPU copy of the model and a CPU projection table.
        on_gpu = self.device.type == "cuda"
        fusable = (self.projections.enabled and (not on_gpu or options.gpu_min_targets != 0)
                   and ((self.extractor == "lhop" and not self.remote_graph
                         and getattr(self.model, "plan_aggregator", -1) >= 0) or self.extractor == "ppr"))
        self._cpu_projections = self.projections
        cpu_model = self.model
        if fusable and on_gpu:  # its own CPU copy of the model and a CPU projection table
            cpu_model = copy.deepcopy(self.model).cpu().eval()
            self._cpu_projections = ProjectionCache(cpu_model.project, data.features, self.graph.num_nodes,
                                                    int(model.projection_dim),
                                                    budget_bytes=options.projection_budget_bytes, device="cpu")
        self._fused_params = cpu_model.fused_params() if fusable else None
        self._dinv = gcn_dinv32(self.graph) if fusable and self.architecture == "gcn" else None
        # a stateless replica's plain model has no compiled whole-plan path (its plans index a local graph),
        # but keeps first-layer rows per node like a local one: the compiled layers run on gathered tables
        remote_acts = (self.remote_graph and not on_gpu and self.extractor == "lhop" and self.projections.enabled
                       and getattr(self.model, "plan_aggregator", -1) >= 0)
        #: the compiled layers of the activation path (the fused parameters, or a stateless replica's own)
        self._act_params = self._fused_params if not remote_acts else cpu_model.fused_params()
        #: the resident paths' state (kernels.resident), when asked for and this model can take one
        self._resident: Any = None
        self._resident_shadow: Any = None
        self._captured: Any = None
        #: a kernel fault left the model's CUDA context unusable (:meth:`_device_lost`); then called (the
        #: registry sets it: the server's health goes NOT_SERVING)
        self.lost_device = False
        self.on_device_lost: Any = None
        # resident and CUDA graphs unless told otherwise on a GPU, never unless told on a CPU
        wants_resident = options.resident if options.resident is not None else on_gpu
        if wants_resident or options.serving_path in ("plain-resident", "shadow-resident"):
            # asked for: a failure is the model's; by default on a GPU: said, and the torch path serves
            asked = options.fused_shadow if self.extractor == "ppr" else options.fused_head
            self._resident_init(fallback=options.resident is None and options.serving_path is None and not asked)
        resident_now = self._resident is not None or self._resident_shadow is not None
        #: a GPU runtime's resident paths take batches of at least this many targets (serve.paths); the
        #: largest batch a compiled path takes
        fused_head = self._fused_head
        self._set_thresholds()
        if on_gpu:
            least = self.gpu_min_targets if resident_now else self.fused_max_targets + 1
            log.info("model %s v%s on %s: %s%s; %s", name, version,
                     self.device, "resident" if resident_now else "not resident (torch path)",
                     (", whole batch in one kernel" if self._resident_shadow is not None else
                      ", last layer in one kernel") if fused_head else
                     ", CUDA graphs" if self._captured is not None else "",
                     "every batch on the GPU" if least <= 0 else
                     "every batch on the compiled CPU paths" if least > FUSED_MAX_TARGETS else
                     f"batches under {least} targets on the compiled CPU paths" + (
                         f" (at the exact width under {self.gpu_min_targets_exact})"
                         if resident_now and self.gpu_min_targets_exact < least else ""))
        elif resident_now:
            log.info("model %s v%s resident on the CPU (--resident): its batches take the resident path, which on a "
                     "CPU serves about 0.4x-0.6x the batched throughput of the compiled paths (the default, "
                     "--no-resident; docs/BENCHMARKS.md)", name, version)
        if options.cuda_graphs and fused_head and self._resident is not None:
            log.warning("model %s v%s: --cuda-graphs not used: it answers with one kernel launch, which a CUDA "
                        "graph would not shorten (--no-fused-head replays CUDA graphs of the torch operators)",
                        name, version)
        elif options.cuda_graphs and self._captured is None:
            log.warning("model %s v%s: --cuda-graphs ignored (it needs a model resident on --device cuda, where "
                        "models are resident unless --no-resident)", name, version)
        # the plan path of a 2-layer plain model: the last layer alone from per-node first-layer rows
        # (edges_on_two_layer_paths counts a 2-layer path from the last layer's plan, hence 2 layers only).
        # A resident model keeps its first-layer tables on its device: no second copy in an ActivationCache,
        # except on a GPU without the fused last layer, where batches under gpu_min_targets still take the
        # compiled CPU paths. With the fused last layer (threshold 0) a CPU copy would serve only what the
        # resident path declines (a width whose table is being built, or that the budget leaves out) for a
        # full-graph CPU pass at warm-up and its share of every update: those batches take the compiled
        # whole-plan path instead
        keeps_acts = ((self._resident is None or (on_gpu and not fused_head)) and self._act_params is not None
                      and self.extractor == "lhop" and self.num_layers == 2 and options.activation_budget_bytes > 0)
        self._activations = (ActivationCache(self.graph, self._act_params, self._dinv, self._cpu_projections,
                                             strategy=self.strategy, budget_bytes=options.activation_budget_bytes,
                                             reserved_width=resolve_knobs(self.limits, None, None, None)[0])
                             if keeps_acts else None)
        #: the serving paths this runtime takes, in order of preference (decided once; serve.paths)
        self.paths = paths_for(self, options.serving_path)
        self.switched_off: list[str] = []  # paths that failed a batch and were switched off (_run_path)
        self.batcher = DynamicBatcher(
            self.process,
            max_batch_targets=options.max_batch_targets,
            max_queue_targets=options.max_queue_targets,
            max_delay_s=options.max_delay_ms / 1e3,
            executor=executor,
            # never on the loop when a batch may wait on Redis (features or graph rows)
            inline_max_targets=(inline_targets_for(self.device, options.inline_max_targets)
                                if isinstance(getattr(data.features, "base", data.features), MemoryFeatureStore)
                                and not self.remote_graph else 0),
            inline_max_work=options.inline_max_work,
            process_inline=self._process_inline,
            max_queue_work=options.max_queue_work,
            name=f"{name}/v{version}",
            on_queue=self._observe_queue,
        )
        self.stats = ModelStats()  # Triton's ModelStatistics (serve.stats): recorded in submit and process
        self.ready = False

    def _set_thresholds(self) -> None:
        """:attr:`gpu_min_targets` and :attr:`fused_max_targets` from the paths this runtime has now
        (:func:`gpu_thresholds`)."""
        resident = self._resident is not None or self._resident_shadow is not None
        self.gpu_min_targets, self.fused_max_targets = gpu_thresholds(
            self.options, self.extractor == "ppr", resident, self._captured is not None, self.device.type == "cuda",
            self._fused_head)
        #: the same at the exact width: lower where :data:`GPU_MIN_TARGETS_EXACT_AUTO` says so and the one-launch
        #: kernel's block fits at the exact width for every budget the model serves
        self.gpu_min_targets_exact = self.gpu_min_targets
        block = self._resident_shadow.block if self._resident_shadow is not None else None
        if (self.device.type == "cuda" and self.options.gpu_min_targets is None and block is not None
                and block.fits(0, self._resident_shadow.k)):
            self.gpu_min_targets_exact = min(self.gpu_min_targets, GPU_MIN_TARGETS_EXACT_AUTO["shadow-fused"])
        if self.lost_device:  # nothing runs on the device any more: the compiled CPU paths take all they can
            self.gpu_min_targets = self.gpu_min_targets_exact = self.fused_max_targets = math.inf

    @property
    def graph_out_of_service(self) -> str | None:
        """Why this model's graph was taken out of service (serve.live ``LiveGraph.broken``: every request for it
        fails until a restart), or None."""
        live = self.data.live
        return None if live is None else live.broken

    @property
    def in_service(self) -> bool:
        """Whether this model answers requests as it should: loaded and warm (:attr:`ready`), its device usable
        (not :attr:`lost_device`) and its graph in service (:attr:`graph_out_of_service` None). What ModelInfo's
        ``ready`` (GetModel, ListModels, ``gnnserve models``) and KServe's ModelReady report; a model that is not
        is still listed, as not ready."""
        return self.ready and not self.lost_device and self.graph_out_of_service is None

    @property
    def _fused_head(self) -> bool:
        """Whether the resident path answers with one kernel launch now (a plain model's last layer,
        kernels.resident_head; a shaDow model's whole batch, kernels.shadow_block): it turns off for good
        after a failed launch (:meth:`fused_head_lost`)."""
        return ((self._resident is not None and self._resident.head is not None)
                or (self._resident_shadow is not None and self._resident_shadow.block is not None))

    def fused_head_lost(self) -> None:
        """The fused kernel failed a batch and is off (``ResidentPlain.answer``, ``ResidentShadow.answer``):
        the GPU threshold goes to the one measured for the torch operators, so small batches return to the
        compiled CPU paths (an explicit ``gpu_min_targets`` stays the one threshold for every path)."""
        if self.options.gpu_min_targets is not None:
            return
        self._set_thresholds()
        log.warning("model %s v%s: the fused kernel is off after a failure; batches under %s targets take "
                    "the compiled CPU paths now", self.name, self.version, self.gpu_min_targets)

    def _resident_init(self, fallback: bool = False) -> None:
        """Build the resident path's state (kernels.resident) or say why this model cannot take it.
        ``fallback`` (resident by default, not asked for): a failure to build it (the GPU's memory, say) is
        logged and the model serves without it."""
        try:
            self._resident_build()
        except Exception:
            if not fallback:
                raise
            log.exception("model %s v%s: its resident state could not be built on %s; it serves on the other "
                          "paths (--no-resident says so at start)", self.name, self.version, self.device)
            self._resident = self._resident_shadow = self._captured = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _resident_build(self) -> None:
        why = None
        shadow = self.extractor == "ppr"
        plain2 = not shadow and self.num_layers == 2 and getattr(self.model, "plan_aggregator", -1) >= 0
        if not shadow and not plain2:
            why = "it serves plain 2-layer GCN / GraphSAGE models and shaDow models"
        elif shadow and getattr(self.ppr_index, "induced", None) is None:
            why = "the PPR index has no induced table (--induced-table-bytes)"
        elif self.remote_graph:
            why = "it needs the whole graph in memory (this replica reads it from Redis)"
        elif not self.projections.enabled:
            why = "the projection table does not fit --projection-cache-bytes"
        elif not shadow and self.options.activation_budget_bytes <= 0:
            why = "--activation-cache-bytes is 0 (it keeps first-layer tables within that budget)"
        if why is not None:
            if plain2 and self.options.fused_head:  # asked for a kernel this configuration rules out
                raise ValueError(f"model {self.name} v{self.version}: fused_head (--fused-head) needs the model "
                                 f"resident, and {why}")
            if shadow and self.options.fused_shadow:
                raise ValueError(f"model {self.name} v{self.version}: fused_shadow (--fused-shadow) needs the model "
                                 f"resident, and {why}")
            if not shadow and self.options.fused_head:
                log.warning("model %s v%s: --fused-head does not apply (%s)", self.name, self.version, why)
            log.info("model %s v%s: no resident path: %s", self.name, self.version, why)
            return
        from kernels.resident import CapturedForward, ResidentPlain, ResidentShadow

        t0 = time.perf_counter()
        resident: Any
        if shadow:
            resident = self._resident_shadow = ResidentShadow(self.model, self.ppr_index,
                                                              self.projections.complete_table, strategy=self.strategy,
                                                              fused=self.options.fused_shadow)
            log.info("model %s v%s: resident on %s (lists and induced table, k = %d%s) in %.1f s", self.name,
                     self.version, self.device, resident.k,
                     ", whole batch in one kernel" if resident.block is not None else "", time.perf_counter() - t0)
            # with the kernel, CUDA graphs still serve what it leaves to the torch operators (a block beyond the
            # device's shared memory; every batch after a failed launch): captured only once such keys recur
        else:
            resident = self._resident = ResidentPlain(
                self.model, self.graph, self.projections.complete_table, strategy=self.strategy,
                budget_bytes=self.options.activation_budget_bytes,
                reserved_width=resolve_knobs(self.limits, None, None, None)[0], fused_head=self.options.fused_head)
            log.info("model %s v%s: resident on %s (graph %.1f MiB%s) in %.1f s", self.name, self.version,
                     self.device, resident.dg.nbytes() / 2**20,
                     ", last layer in one kernel" if resident.head is not None else "", time.perf_counter() - t0)
            if resident.head is not None:
                return  # one launch a batch already: nothing for a CUDA graph to save
        if self.options.cuda_graphs is not False and self.device.type == "cuda":
            self._captured = CapturedForward(resident, max_bucket=self.options.max_batch_targets)

    def _graph_derived(self, graph: Any = None, walk_sums_: np.ndarray | None = None,
                       columns: np.ndarray | None = None) -> dict[str, Any]:
        """What the runtime derives from the whole graph (``graph``, default its own): its limits and the
        per-node bounds that price a request, as attribute values (:meth:`_set_derived` assigns them).
        ``columns``: after an update, the nodes whose walk sums changed (``walk_sums_`` the new sums); the
        bounds of every other node are copied from the current ones instead of computed again (an O(N)
        copy instead of passes over every node: 2026-11-27, 2 M nodes, about 15 ms of an update's 50)."""
        g = self.graph if graph is None else graph
        c = self._walk_sums if walk_sums_ is None else walk_sums_
        out: dict[str, Any] = {}
        max_deg = max(1, int(g.max_degree))  # memoized on a local graph, carried over by an edit
        max_k = self._max_k
        # a shaDow subgraph of K nodes: a row has at most K - 1 neighbours, K where the graph keeps
        # self-loops (the subgraph builder keeps them; a Redis graph's are not counted: K)
        loops = bool(max_k) and (self.remote_graph or _self_loop_count(g) > 0)
        max_width = max(1, min(max_deg, max_k - (0 if loops else 1)) if max_k else max_deg)
        default_width, default_budget, knobs = self._checkpoint_defaults
        if c is not None:
            layers = max(1, self.num_layers)
            # a plan's pass; a new node's scope, its neighbours' (L - 1)-hop balls (an induced scope's last
            # hop is summed per request: _scope_bound_of)
            out["_walk_sums"] = c
            if columns is not None and self._walk_bound is not None and self._nbr_scope_bound is not None:
                cols = np.asarray(columns, dtype=np.int64)
                out["_walk_bound"] = _patched(self._walk_bound, g.num_nodes, cols,
                                              walk_bounds(g, layers, sums=c, columns=cols))
                out["_nbr_scope_bound"] = _patched(self._nbr_scope_bound, g.num_nodes, cols,
                                                   layers * c[:layers, cols].sum(axis=0))
            else:
                out["_walk_bound"] = walk_bounds(g, layers, sums=c).astype(np.float32)
                out["_nbr_scope_bound"] = (layers * c[:layers].sum(axis=0)).astype(np.float32)
        out["_mean_degree"] = (g.num_edges / max(1, g.num_nodes)) if g.num_nodes else 0.0
        out["limits"] = ModelLimits(
            name=self.name,
            num_nodes=g.num_nodes,
            num_features=int(self.model.in_dim),
            extractor=self.extractor,
            max_ppr_budget=max_k,
            max_sampling_width=max_width,
            # what a request without a width runs at (serve.validation.resolve_knobs clamps a width to the
            # bound): the default the checkpoint chose, clamped like any width, so that ModelInfo, ListModels
            # and KServe's metadata report the width the answers echo (a shaDow model's K - 1, not its table's K)
            default_sampling_width=min(default_width, max_width) if default_width > 0 else 0,
            default_ppr_budget=min(default_budget or max_k, max_k) if max_k else 0,
            max_nodes_per_request=self.options.max_nodes_per_request,
            knob_table=knobs,
            max_new_node_edges=self.options.max_new_node_edges,
        )
        return out

    def _set_derived(self, values: dict[str, Any]) -> None:
        limits = values.pop("limits")
        for k, v in values.items():
            setattr(self, k, v)
        self.limits = limits  # last: a request validated against it finds every array sized for it

    def prepare_rebase(self, graph: CSRGraph | Any, old: CSRGraph | Any, changed_rows: np.ndarray,
                       feature_ids: np.ndarray, new_ids: np.ndarray) -> dict[str, Any]:
        """The first half of moving to an updated graph (:mod:`serve.live`), done while batches still run
        on the old one: everything computed from the new graph alone (which rows to drop, degrees, request
        prices, limits); :meth:`commit_rebase` installs it under the write lock.

        ``changed_rows``: nodes whose adjacency row changed (new nodes and every endpoint of an added or
        removed edge); ``feature_ids``: existing nodes with new features; ``new_ids``: the new nodes.
        """
        feats = np.asarray(feature_ids, dtype=np.int64)
        changed = np.asarray(changed_rows, dtype=np.int64)
        plan: dict[str, Any] = {"graph": graph, "features": feats}
        if self._activations is not None or self._resident is not None:
            # a node's first-layer row reads its own row and projection and its neighbours' projections (and,
            # for GCN, their degrees): the changed rows, the changed features and their neighbours (a stateless
            # replica reads them from its store, whose overlay already holds the new rows)
            spread = np.concatenate([feats, changed]) if self.architecture == "gcn" else feats
            plan["activation"] = np.unique(np.concatenate([changed, feats, graph.neighbors_of(spread)]))
        if graph is old and not len(changed) and not len(new_ids):  # features only: the graph is the same
            return plan
        if self._resident is not None:  # the new CSR and kept edges on the device, built while batches still run
            from kernels.resident import DeviceGraph

            dg = plan["resident_graph"] = DeviceGraph.upload(graph, self.device)
            plan["resident_prepared"] = self._resident.prepare(graph, dg)
        if not self.remote_graph:
            carry_gcn_degrees(old, graph, changed)  # memoized on the new graph, not yet visible
            if self._dinv is not None:
                plan["dinv"] = gcn_dinv32(graph)
            hops = max(0, self.num_layers - 1)
            cols = None
            if self._walk_sums is not None:
                sums, cols = update_walk_sums(graph, self._walk_sums, changed, with_columns=True)
                plan["derived"] = self._graph_derived(graph, sums, cols)
            else:
                plan["derived"] = self._graph_derived(graph)
            if self._exact_edges is not None:  # the nodes whose (L-1)-hop ball holds a changed row
                if cols is not None and self._walk_sums.shape[0] - 1 == hops:
                    ball = cols  # the walk sums' columns are that ball: expanded over the same hops
                else:
                    ball = changed
                    for _ in range(hops):
                        ball = np.unique(np.concatenate([ball, graph.neighbors_of(ball)]))
                plan["exact_edges"] = ball
        else:
            plan["derived"] = self._graph_derived(graph)
        return plan

    def commit_rebase(self, plan: dict[str, Any]) -> dict[str, int]:
        """Install :meth:`prepare_rebase`'s result (under the live graph's write lock: no batch runs),
        dropping exactly the cached values the update changed; returns the rows dropped per cache."""
        inv: dict[str, int] = {}
        graph = plan["graph"]
        self.graph = graph
        for cache in {id(self.projections): self.projections, id(self._cpu_projections): self._cpu_projections}.values():
            cache.grow(graph.num_nodes)
            inv["projection"] = inv.get("projection", 0) + cache.invalidate_rows(plan["features"])
        if "dinv" in plan:
            self._dinv = plan["dinv"]
        if self._activations is not None and "activation" in plan:
            inv["activation"] = self._activations.rebase(graph, self._dinv, plan["activation"])
        if self._resident is not None:
            inv["resident"] = self._resident.rebase(graph, plan.get("resident_graph"), plan["activation"],
                                                    plan.get("resident_prepared"))
        if self._resident_shadow is not None:  # new features: its projection rows (lists follow the dirty marks)
            self._resident_shadow.rebase()
        if self._exact_edges is not None and "exact_edges" in plan:
            inv["exact_edges"] = self._exact_edges.rebase(graph, plan["exact_edges"])
        if "derived" in plan:
            self._set_derived(dict(plan["derived"]))
        return inv

    # ------------------------------------------------------------------ serving API
    async def submit(self, call: PredictCall, deadline: float | None = None, started: float | None = None) -> PredictResult:
        """Answer ``call`` through the batcher (refused past ``max_request_work``), counting it in :attr:`stats`;
        ``started``: when its RPC handler began (``time.perf_counter``), the start of its ``success`` time."""
        if not self.ready:
            raise Unavailable(f"model {self.name} v{self.version} is still loading")
        work = self.estimate_work(call)
        if work > self.options.max_request_work:
            if self.extractor == "ppr":  # L K min(S, K) per target (estimate_work): the budget K is the lever
                levers = (f"use a smaller ppr_budget (a shaDow model aggregates up to layers x K x min(S, K) "
                          f"edges per target; this request has K = {call.ppr_budget}), a smaller sampling_width")
            else:
                levers = "use a smaller sampling_width (the exact width 0 costs most on high-degree nodes)"
            raise Overloaded(
                f"model {self.name}: this request would aggregate about {work} edges, more than the limit of "
                f"{self.options.max_request_work} per request; {levers}, fewer nodes per request, or fewer "
                "new-node neighbours")
        # a batch with new nodes takes induced subgraphs for every target (no plan, no induced table):
        # requests with new nodes batch among themselves, so the others keep their fast path
        key = (call.sampling_width, call.ppr_budget, bool(call.new_nodes))
        t0 = time.perf_counter_ns()
        try:
            res: PredictResult = await self.batcher.submit(call, size=call.size, key=key, deadline=deadline,
                                                           work=work)
        except BaseException as exc:
            self.stats.failed(time.perf_counter_ns() - t0, failure_reason(exc))
            raise
        now = time.perf_counter_ns()
        self.stats.succeeded(call.size, now - t0, res.timing,
                             None if started is None else now - round(started * 1e9))
        return res

    def _observe_queue(self, targets: int) -> None:
        """``gnnserve_queue_targets`` for this model: set by the batcher whenever its queue changes (an item
        queued, a batch taken, items dropped for their deadline or cancelled, the queue failed at stop)."""
        if self.server_metrics is not None:
            self.server_metrics.set_queue(self.name, targets)

    def _run_batch(self, blocking: bool, path: ServingPath | None, targets: np.ndarray, new_specs: list, width: int,
                   budget: int, want_emb: bool) -> tuple[str, Any]:
        """The batch's answers and the name of the path (or paths) that gave them. A batch of existing targets and
        new nodes (``path`` not forced) answers the targets on the path they take without new nodes and the new
        nodes on theirs: a request's new nodes are in no existing target's subgraph, so the targets get the same
        answers, to the bit, as asked without them (the path a batch takes moves an answer's last bits:
        docs/RELIABILITY.md, "Batch-invariant answers"); the name is then both paths', joined by ``+``. A batch of
        more than :data:`COMPILED_CHUNK_TARGETS` targets on a path of :data:`CHUNKED_PATHS` runs in chunks of that many."""
        if path is None and new_specs and len(targets):
            own = self._path_for(targets, 0, width, budget)
            if own.name != self._path_for(targets, len(new_specs), width, budget).name:
                n1, o1 = self._run_batch(blocking, None, targets, [], width, budget, want_emb)
                p2, o2 = self._run_path_waiting(blocking, None, targets[:0], new_specs, width, budget, want_emb)
                return (n1 if n1 == p2.name else f"{n1}+{p2.name}"), joined(o1, o2)
        step = COMPILED_CHUNK_TARGETS
        if path is None and not new_specs and len(targets) > step and \
                self._path_for(targets, 0, width, budget).name in CHUNKED_PATHS:
            names: list[str] = []
            o = None
            for i in range(0, len(targets), step):
                p, part = self._run_path_waiting(blocking, None, targets[i:i + step], [], width, budget, want_emb)
                names += [p.name] if p.name not in names else []
                o = part if o is None else joined(o, part)
            return "+".join(names), o
        p, o = self._run_path_waiting(blocking, path, targets, new_specs, width, budget, want_emb)
        return p.name, o

    def _run_path_waiting(self, blocking: bool, path: ServingPath | None, targets: np.ndarray, new_specs: list,
                          width: int, budget: int, want_emb: bool) -> tuple[ServingPath, Any]:
        """:meth:`_run_path`; with ``blocking=False`` (an inline batch on the event loop) a resident model whose
        lock is held (a GPU table build, another batch's capture) or that would first capture a CUDA graph or
        upload an induced table raises :class:`WouldBlock` instead of holding the loop, before the batch did
        anything, and the batcher's worker runs it."""
        if blocking or (self._resident is None and self._resident_shadow is None):
            return self._run_path(path, targets, new_specs, width, budget, want_emb)
        from kernels.resident import DeviceBusy, no_waiting

        try:
            with no_waiting():
                return self._run_path(path, targets, new_specs, width, budget, want_emb)
        except DeviceBusy as exc:
            raise WouldBlock(f"{self.name}: {exc}") from exc

    def _run_path(self, path: ServingPath | None, targets: np.ndarray, new_specs: list, width: int, budget: int,
                  want_emb: bool) -> tuple[ServingPath, Any]:
        """Run the batch on ``path`` (or the first path that takes it). An opt-in path that raises
        (:data:`SWITCHABLE_PATHS`: the resident paths, the newest code) is switched off for this model
        version, loudly, and the batch runs on the next path: a fault there costs no request and no
        restart. Any other path's error is the batch's. A CUDA error that left the device unusable
        (kernels.resident.device_lost), met on any path, sends every later batch the compiled CPU paths can
        take there (:meth:`_device_lost`)."""
        chosen = path is None
        if path is None:
            path = self._path_for(targets, len(new_specs), width, budget)
        try:
            return path, path.run(targets, new_specs, width, budget, want_emb)
        except (InvalidArgument, Overloaded, Unavailable, GraphOutOfService):
            raise  # the request's or the server's state, not a fault of the path
        except Exception as exc:
            from kernels.resident import DeviceBusy, device_lost

            if isinstance(exc, DeviceBusy):
                raise  # an inline batch met a busy resident model: the worker runs it (process)

            if self.device.type == "cuda" and not self.lost_device and device_lost(exc):
                self._device_lost()  # whichever path met it: later batches stay off the device where they can
            if not chosen or path.name not in SWITCHABLE_PATHS:
                raise
            log.exception("model %s v%s: serving path %s failed; switched off for this model version, its "
                          "batches take the next path", self.name, self.version, path.name)
            self.paths = [p for p in self.paths if p is not path]
            self.switched_off.append(path.name)
            path = self._path_for(targets, len(new_specs), width, budget)
            return path, path.run(targets, new_specs, width, budget, want_emb)

    def _device_lost(self) -> None:
        """A kernel fault left this model's CUDA context unusable (kernels.resident.device_lost): every batch
        the compiled CPU paths can take goes there from now on; the rest fail, loudly, until a restart, and
        the server's health says NOT_SERVING (so that an orchestrator restarts it)."""
        self.lost_device = True
        self._set_thresholds()
        log.critical("model %s v%s: the CUDA context of %s is lost after a kernel fault; batches the compiled "
                     "CPU paths take are answered there, the others fail until the server restarts", self.name,
                     self.version, self.device)
        if self.on_device_lost is not None:
            self.on_device_lost()

    def _path_for(self, targets: np.ndarray, new_nodes: int, width: int, budget: int) -> ServingPath:
        """The first of this runtime's paths that takes such a batch (``new_nodes``: how many; serve.paths)."""
        return next(p for p in self.paths if p.accepts(len(targets), new_nodes, width) and p.takes(targets, budget))

    def activation_widths(self) -> list[int]:
        """The sampling widths whose first-layer rows this model keeps (empty without an activation cache)."""
        return [] if self._activations is None else self._activations.widths()

    def activations_complete(self, width: int) -> bool:
        """Whether the activation cache holds every node's first-layer row at ``width``."""
        return self._activations is not None and self._activations.complete(width)

    def estimate_work(self, call: PredictCall) -> int:
        """The edges ``call`` would aggregate at most, before anything is computed (admission, the
        inline decision). Upper bounds (tested against the answers' ``edges_kept``), as cheap as a
        lookup per node, from :func:`kernels.plan.walk_sums` computed once per model:

        * plain (L-hop) model, no new nodes (an execution plan): per distinct node, the walk bound of
          its exact pass, capped at ``S (1 + S)^(L - l)`` edges for layer ``l`` when sampled at width
          ``S``; when the activation cache holds every node's first-layer row at that width (after
          ``--warm-projections``, or once every row was asked for), its degree (at most ``S``): only
          the last layer runs; with new nodes (induced L-hop scopes, every row at every layer): ``L`` times the
          walk bound of the node's L-hop ball. A remote graph has no per-node bound: the mean degree
          stands in for it;
        * shaDow model: ``L K min(S, K)`` per target (a K-node subgraph, at most S edges per row);
        * a new node: twice its neighbours (its edges count both ways), their degrees (the push or
          the scope reads their rows) and its subgraph's cost as above.

        Requests with and without new nodes never share a batch (:meth:`submit`), so a batch's work
        is the sum of its requests'.
        """
        s, k = call.sampling_width, call.ppr_budget
        layers = max(1, self.num_layers)
        nodes = call.nodes
        if len(nodes) > 1:
            nodes = np.unique(nodes)  # a repeated id costs one subgraph and one forward row
        local = not self.remote_graph
        if self.extractor == "ppr":  # K-node subgraphs, at most min(S, K) edges per row and layer
            per_target = float(layers * k * (min(s, k) if s else k))
            work = per_target * len(nodes)
        elif self._walk_sums is None:  # a remote graph: no per-node bound, the mean degree stands in
            per_target = _sampled_edges_bound(min(s, self._mean_degree) if s else self._mean_degree, layers)
            work = per_target * len(nodes)
        elif call.new_nodes:  # the batch takes induced L-hop scopes (every row at every layer)
            work = self._scope_bound_of(nodes)
        elif (self._resident is not None and self._resident.holds(s)) or (
                self.activations_complete(s)
                and self._path_for(nodes, 0, s, call.ppr_budget).name == "plain-activations"):
            # the resident path at a width it holds, or the activation path with every first-layer row held:
            # the last layer's rows alone
            deg = self.graph.degrees_of(nodes)
            work = float(np.minimum(deg, s).sum() if s else deg.sum())
        else:  # an execution plan; sampled rows keep at most S edges
            cap = _sampled_edges_bound(s, layers) if s else math.inf
            if len(nodes) == 1:
                work = min(float(self._walk_bound[nodes[0]]), cap)
            else:
                work = float(np.minimum(self._walk_bound[nodes], cap).sum())
        for spec in call.new_nodes:
            d = len(spec.neighbors)
            # the push or the scope reads the neighbours' rows; the new edges count both ways
            work += 2 * d + (float(self.graph.degrees_of(spec.neighbors).sum()) if d and local else 0.0)
            if self.extractor == "ppr" or self._nbr_scope_bound is None:
                work += per_target
            elif d:  # its scope: itself and its neighbours' (L - 1)-hop balls, every row at every layer
                work += float(self._nbr_scope_bound[spec.neighbors].sum()) + layers * (2 * d + 1)
            else:
                work += layers
        return int(min(work, 2**62))

    def _scope_bound_of(self, nodes: np.ndarray) -> float:
        """``L sum_{j <= L} c_j[t]`` over ``nodes``: the edges of their induced L-hop scopes, every row at
        every layer, at most (c_L from the neighbours' c_{L-1}, summed here for these nodes only)."""
        c = self._walk_sums
        assert c is not None
        layers = max(1, self.num_layers)
        top = float(c[-1][self.graph.neighbors_of(nodes)].sum())
        return float(self._nbr_scope_bound[nodes].sum()) + layers * top

    def cache_stats(self) -> dict[str, dict[str, float]]:
        """The per-node caches' statistics by cache: ``projection`` (and ``projection_cpu``, a GPU
        model's CPU table), ``activation`` for a plain model that keeps one, ``resident`` for one on the
        plain-resident path (kernels.resident); on a replica ``graph_rows`` and ``ppr_reach``
        (:meth:`serve.graph.store.RedisGraphStore.cache_stats`, shared by the models of one graph)."""
        out = {"projection": self.projections.stats()}
        if self._cpu_projections is not self.projections:
            out["projection_cpu"] = self._cpu_projections.stats()
        if self._activations is not None:
            out["activation"] = self._activations.stats()
        if self._resident is not None:
            out["resident"] = self._resident.stats()
        if self._resident_shadow is not None:
            out["resident"] = self._resident_shadow.stats()
        if self.remote_graph:  # a replica: its row cache and the reach of the PPR lists it pushed (the graph's)
            out.update(self.graph.cache_stats())
        return out

    def observe(self, res: PredictResult) -> None:
        if self.server_metrics is not None:
            self.server_metrics.observe_request(
                self.name, res.timing, res.call.sampling_width, res.call.ppr_budget, len(res.labels)
            )

    def warm(self, num_nodes: int = 8) -> None:
        """Compile and exercise the whole path once (numba JIT, torch lazy init), then mark ready."""
        n = min(num_nodes, self.graph.num_nodes)
        ids = np.linspace(0, self.graph.num_nodes - 1, n).astype(np.int64)
        if self._exact_edges is not None and self.num_layers <= 2 and self.graph.num_nodes <= EXACT_EDGES_EAGER_NODES:
            self._exact_edges.fill()
        if self.options.warm_projections and self.projections.enabled:
            t0 = time.perf_counter()
            rows = self.warm_projections()
            log.info("model %s v%s: projections of %d nodes cached in %.1f s", self.name, self.version, rows,
                     time.perf_counter() - t0)
            prefetch = getattr(self.ppr_index, "prefetch", None)
            if prefetch is not None:  # the mapped PPR lists and induced table, read before the server is ready
                t0 = time.perf_counter()
                got = prefetch()
                log.info("model %s v%s: %.0f MiB of PPR index read into the page cache in %.1f s", self.name,
                         self.version, got / 2**20, time.perf_counter() - t0)
        if self._resident is not None:  # the tables of the widths clients pick (knob table), default first
            t0 = time.perf_counter()
            default = resolve_knobs(self.limits, None, None, None)[0]
            widths = [default, *sorted({r.sampling_width for r in self.limits.served_knob_table} - {default})]
            built = [w for w in widths if self._resident.has_table(w)]
            log.info("model %s v%s: resident first-layer tables of widths %s built in %.2f s", self.name,
                     self.version, built, time.perf_counter() - t0)
        for width in {self.limits.default_sampling_width, 0}:
            # every path a batch of existing nodes can take (an L-hop model's induced scopes serve only
            # batches with new nodes: not warmed, an exact scope of a deep model can be the whole graph)
            for path in self.paths:
                if not (path.accepts(len(ids), False, width) and path.takes(ids, self.limits.default_ppr_budget)):
                    continue
                call = PredictCall("warmup", ids, [], width, self.limits.default_ppr_budget, "default", 0.0,
                                   True, True)
                item = WorkItem(call, len(ids), None, None, time.monotonic(), _WarmupFuture())
                res = self.process([item], path=path)[0]
                if isinstance(res, BaseException):
                    raise res
        self.ready = True

    def warm_projections(self) -> int:
        """Project every node's features into the projection table(s) now, and fill a plain 2-layer model's
        first-layer rows at its default width; returns the rows projected."""
        rows = self.projections.warm()
        if self._cpu_projections is not self.projections:  # a GPU model's CPU table (gpu_min_targets)
            self._cpu_projections.warm()
        if self._activations is not None:  # and a plain model's first-layer rows at its default width
            self._activations.warm(resolve_knobs(self.limits, None, None, None)[0])  # the width a knob-less request gets
        return rows

    async def close(self, grace_s: float | None = None) -> None:
        self.ready = False
        await self.batcher.stop(grace_s)
        if self._resident is not None:  # a table build in flight ends (or the grace does) before the process
            await asyncio.to_thread(self._resident.wait_for_builds, 30.0 if grace_s is None else grace_s)

    # ------------------------------------------------------------------ the pipeline
    def process(self, items: list[WorkItem], path: ServingPath | None = None, *,
                blocking: bool = True) -> list[PredictResult | BaseException]:
        """Answer one batch (the batcher's worker, or the loop for inline batches): distinct targets,
        one serving path (``path``, or the first of :attr:`paths` that accepts the batch), rows split
        back per request. ``blocking=False`` (the loop's inline batches): raise
        :class:`~serve.batcher.WouldBlock` instead of waiting for the live graph's read lock."""
        calls: list[PredictCall] = [it.payload for it in items]
        width = calls[0].sampling_width
        budget = calls[0].ppr_budget
        started = time.perf_counter()
        if len(calls) == 1:
            targets = calls[0].nodes
        else:
            targets = np.concatenate([c.nodes for c in calls]) if calls else np.zeros(0, np.int64)
        new_specs = [nn for c in calls for nn in c.new_nodes]
        # A node asked for more than once in the batch (within or across requests) gets one subgraph and
        # one forward row; ``row_map`` copies that row back to every position that asked for it.
        row_map: np.ndarray | None = None
        if len(targets) > 1:
            uniq, inverse = np.unique(targets, return_inverse=True)
            if len(uniq) < len(targets):
                row_map = np.concatenate([inverse.reshape(-1), len(uniq) + np.arange(len(new_specs))])
                targets = uniq
        want_emb = any(c.return_embeddings for c in calls)
        live = self.data.live
        if live is None:
            graph_version = 0
            path_name, o = self._run_batch(blocking, path, targets, new_specs, width, budget, want_emb)
        else:  # one graph version for the whole batch (serve.live: an update waits for it)
            graph_version = live.begin_read(blocking)
            if graph_version is None:  # an update holds or waits for the lock: the worker waits, not the loop
                raise WouldBlock(f"{self.name}: the live graph is being updated")
            try:
                # the path is chosen under the read lock too: a path's accepts() may allocate per-graph
                # state (the activation cache's table of a new width), which an update must not interleave with
                path_name, o = self._run_batch(blocking, path, targets, new_specs, width, budget, want_emb)
            finally:
                live.end_read()
        probs_np, labels_np, emb_np, kept, total = o.probs, o.labels, o.emb, o.kept, o.total
        t_sub, t_feat, t_fwd = o.t_sub, o.t_feat, o.t_fwd
        if row_map is not None:
            probs_np, labels_np, kept, total = probs_np[row_map], labels_np[row_map], kept[row_map], total[row_map]
            emb_np = None if emb_np is None else emb_np[row_map]
        timing_batch = {
            "subgraph": 1e3 * (t_sub - started),
            "features": 1e3 * (t_feat - t_sub),
            "forward": 1e3 * (t_fwd - t_feat),
        }
        if self.server_metrics is not None:
            self.server_metrics.observe_batch(self.name, len(labels_np))
        if self.ready:  # not warm-up batches
            self.stats.executed(len(labels_np), t_feat - started, t_fwd - t_feat, time.perf_counter() - t_fwd)
        # never a NaN answer as a result: values near float32's limit overflow (what UpdateGraph and new nodes
        # refuse; data loaded with the graph is not checked value by value)
        finite = bool(np.isfinite(probs_np).all())
        # Output rows: every call's existing nodes in call order, then every call's new nodes.
        n_existing = sum(len(c.nodes) for c in calls)
        out: list[PredictResult | BaseException] = []
        pos_e = 0
        pos_n = n_existing
        for it, c in zip(items, calls, strict=True):
            rows: slice | np.ndarray = slice(None)  # one call: every row, in order
            if len(calls) > 1:
                rows = np.concatenate([np.arange(pos_e, pos_e + len(c.nodes)),
                                       np.arange(pos_n, pos_n + len(c.new_nodes))])
            pos_e += len(c.nodes)
            pos_n += len(c.new_nodes)
            timing = dict(timing_batch, queue=1e3 * (it.started - it.enqueued) if it.started else 0.0)
            if not finite and not np.isfinite(probs_np[rows]).all():
                out.append(self._non_finite(c, probs_np[rows]))
                continue
            out.append(
                PredictResult(
                    call=c,
                    labels=labels_np[rows],
                    probabilities=probs_np[rows],
                    embeddings=None if emb_np is None else emb_np[rows],
                    timing=timing,
                    batch_size=len(labels_np),
                    edges_kept=int(kept[rows].sum()),
                    edges_total=int(total[rows].sum()),
                    path=path_name,
                    graph_version=graph_version,
                )
            )
        return out

    def _non_finite(self, call: PredictCall, probs: np.ndarray) -> NonFiniteOutput:
        """The error of a call some of whose answers are not finite, naming those nodes (new ones by index)."""
        bad = np.flatnonzero(~np.isfinite(probs).all(axis=1))
        n = len(call.nodes)
        names = [str(int(call.nodes[i])) if i < n else f"new_nodes[{i - n}]" for i in bad[:5]]
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        log.warning("model %s: answers not finite for nodes %s%s", self.name, ", ".join(names), more)
        return NonFiniteOutput(
            f"model {self.name!r}: answers not finite (NaN or infinity) for node {', '.join(names)}{more}: "
            f"feature values or edge weights around it overflow float32; send smaller values with UpdateGraph")

    def _process_inline(self, items: list[WorkItem]) -> list[PredictResult | BaseException]:
        """:meth:`process` for a batch on the event loop: never waits for the live graph's lock."""
        return self.process(items, blocking=False)

    # ------------------------------------------------------------------ pipeline stages
    def _subgraphs(self, targets: np.ndarray, new_specs: list, budget: int) -> SubgraphBatch:
        # on a replica (remote_graph) lists and rows come from Redis (serve.graph.store), each existing target's
        # PPR subgraph cached there; a plain model's batches without new nodes take the plan paths
        g = self.graph
        held: list = []  # a replica's local graphs of the rows the L-hop lists fetched: the batch is induced on them
        if self.extractor == "ppr":
            if not new_specs:  # the precomputed induced table when there is one (same result)
                return self.ppr_index.induced_batch(g, targets, budget)
            ptr, nodes = self.ppr_index.lookup(targets, budget)
        else:
            ptr, nodes = self._lhop_lists(targets, self.num_layers, held)
        extra = inner = None
        if new_specs:
            edges = _new_edges(new_specs)
            extra = self._extra_edges(edges)
            nptr, new_nodes, inner_new = self._new_node_lists(new_specs, edges, budget, held)
            if inner_new is not None:  # targets' rows all aggregated, new nodes' last hop read as inputs only
                inner = np.concatenate([np.diff(ptr), inner_new])
            ptr = np.concatenate([ptr, ptr[-1] + nptr[1:]])
            nodes = np.concatenate([nodes, new_nodes])
        batch = g.induced_batch(ptr, nodes, extra=extra, held=held, inner=inner) if self.remote_graph else \
            induced_batch(g, ptr, nodes, extra=extra, inner=inner)
        # a plain model's rows in the graph's own order: sampled widths pick what the whole graph's forward does
        if self.extractor == "ppr":
            return batch
        ordered = in_global_order(batch)  # the same rows: a replica's full-graph degrees per row stay
        if self.remote_graph:
            ordered.gcn_degrees = batch.gcn_degrees  # type: ignore[attr-defined]
        return ordered

    def _extra_edges(self, edges: _NewEdges) -> ExtraEdges:
        """The batch's new nodes' edges (:func:`_new_edges`) in both directions: the new node's rows and its
        neighbours' rows gain them."""
        n = self.graph.num_nodes
        src = n + edges.owner
        w = None if edges.weights is None else np.concatenate([edges.weights, edges.weights])
        return ExtraEdges.from_edges(n, np.concatenate([src, edges.neighbors]), np.concatenate([edges.neighbors, src]),
                                     w, num_virtual=edges.count)

    def _new_node_lists(self, specs: list, edges: _NewEdges, budget: int, held: list | None = None,
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(ptr, nodes, inner)``: the node list of each new node of the batch (the ``j``-th, under virtual id
        ``N + j``, first; ``nodes[ptr[j]:ptr[j + 1]]``): its top ``budget`` PPR entries on the graph plus it alone, or
        itself and its neighbours' ``L - 1``-hop balls. On a replica all of them are found together (the pushes in
        lockstep, the balls in one walk): one fetch round per wave or hop for the whole batch, not per node; in
        memory the pushes run on parallel threads. ``held``: a replica's local graph of the balls' rows is appended
        to it (``_lhop_lists``). ``edges``: :func:`_new_edges` of ``specs``.

        ``inner``, for an L-hop model: each list's count of rows within ``L - 1`` hops of its new node, which come
        first (``kernels.subgraph.new_node_scopes``): the rows the model aggregates; the last hop's are read as
        inputs only, and get no edges (``induced_batch``'s ``inner``). None for a PPR model (every row counts)."""
        n = self.graph.num_nodes
        if self.extractor == "ppr":
            from kernels.ppr import ppr_new_nodes
            from serve.graph.store import pushed_new_nodes

            cfg = self.ppr_index.config
            push = pushed_new_nodes if self.remote_graph else ppr_new_nodes  # Redis rounds / parallel threads
            found = push(self.graph, [(s.neighbors, s.weights) for s in specs], cfg)
            lists = []
            for j, (nodes, _scores) in enumerate(found):
                nodes = np.asarray(nodes, dtype=np.int64)[:budget]
                lists.append(np.where(nodes == n, n + j, nodes) if j else nodes)
            ptr = np.zeros(len(lists) + 1, dtype=np.int64)
            np.cumsum([len(x) for x in lists], out=ptr[1:])
            return ptr, np.concatenate(lists), None
        m = edges.count
        if self.num_layers == 0 or not len(edges.neighbors):
            return np.arange(m + 1, dtype=np.int64), n + np.arange(m, dtype=np.int64), np.ones(m, dtype=np.int64)
        flat = edges.neighbors
        # the balls' last hop is each new node's last: read without edges, so a replica reads their degrees, not rows
        ptr, scope = self._lhop_lists(flat, self.num_layers - 1, held, last_rows=False)
        if self.num_layers == 2:  # the inner scope: the neighbours themselves (plain models have 2 layers or more)
            iptr, iscope = np.arange(len(flat) + 1, dtype=np.int64), flat
        else:
            iptr, iscope = self._lhop_lists(flat, self.num_layers - 2, held)
        return new_node_scopes(n, np.cumsum(edges.lengths), ptr, scope, iptr, iscope)

    def _lhop_lists(self, nodes: np.ndarray, hops: int, held: list | None = None,
                    last_rows: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr, nodes)``: each node's nodes within ``hops``, it first, on the graph in memory or a replica's; there
        the local graph of the rows fetched for them is appended to ``held`` when given (``last_rows`` False: without
        the rows of the last hop, ``RedisGraphStore.lhop_local``)."""
        if self.remote_graph:
            ptr, found, local = self.graph.lhop_local(nodes, hops, last_rows)
            if held is not None:
                held.append(local)
            return ptr, found
        return lhop_nodes(self.graph, nodes, hops)

    def _projections(self, batch: SubgraphBatch, new_specs: list, projections: Any = None) -> torch.Tensor:
        """The projection of every row of ``batch`` (new nodes' projected from their features; ``projections``: the
        cache to read, default the model's)."""
        p_unique = self._unique_projections(batch, new_specs, projections)
        # index_select: on a CPU 4x faster than indexing with the tensor (92,000 rows of 64: 1.9 against 7.8 ms)
        return p_unique.index_select(0, torch.from_numpy(batch.row_to_unique).to(p_unique.device))

    def _unique_projections(self, batch: SubgraphBatch, new_specs: list, projections: Any = None) -> torch.Tensor:
        """The projections of ``batch.unique_ids`` (``projections``: the cache to read, default the model's)."""
        cache = self.projections if projections is None else projections
        n = self.graph.num_nodes
        uniq = batch.unique_ids
        n_stored = int(np.searchsorted(uniq, n))  # unique ids are sorted; virtual ids come last
        parts = [cache.get(uniq[:n_stored])]
        if n_stored < len(uniq):
            feats = np.stack([s.features for s in new_specs])[uniq[n_stored:] - n]
            parts.append(cache.project_raw(feats))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _norm_degrees(self, batch: SubgraphBatch, new_specs: list) -> np.ndarray | None:
        """Full-graph GCN degrees of every row; inside a new node's subgraph, of the graph plus that node."""
        n = self.graph.num_nodes
        if self.remote_graph:
            from models.base import GNNModel

            if type(self.model).norm_degrees_for is GNNModel.norm_degrees_for:
                return None
            base = batch.gcn_degrees  # type: ignore[attr-defined]  # full-graph degrees from Redis (1 for new nodes)
        else:
            base = self.model.norm_degrees_for(self.graph, np.minimum(batch.node_ids, n - 1))
        if base is None or not new_specs:
            return base
        d = np.asarray(base, dtype=np.float64).copy()
        edges = _new_edges(new_specs)
        nj = edges.count
        first = batch.num_subgraphs - nj  # new nodes' subgraphs come last
        lo = int(batch.ptr[first])
        ids = batch.node_ids[lo:]
        block = np.repeat(np.arange(nj, dtype=np.int64), np.diff(batch.ptr[first:]))
        seg = d[lo:]  # a view: writes land in d
        w = edges.weights if edges.weights is not None else np.ones(len(edges.neighbors), np.float32)
        own = ids == n + block  # each new node's own row: 1 + its edges' weights (float64, added in order)
        seg[own] = 1.0 + np.bincount(edges.owner, weights=w, minlength=nj)[block[own]]
        # a row next to its block's new node gains that edge's weight (neighbours are distinct: validation)
        span = n + nj
        keys = edges.owner * span + edges.neighbors
        if len(keys):
            order = np.argsort(keys)
            keys, kw = keys[order], w[order]
            row_keys = block * span + ids
            pos = np.clip(np.searchsorted(keys, row_keys), 0, len(keys) - 1)
            hit = keys[pos] == row_keys
            seg[hit] += kw[pos[hit]]
        return d

    def _plan(self, targets: np.ndarray, width: int, degrees: bool = True,
              layers: int | None = None) -> tuple[ExecutionPlan, CSRGraph, np.ndarray, np.ndarray | None]:
        """``(plan, graph it indexes, global ids of its nodes, GCN degrees of them or None)``
        (``degrees=False``: no degrees, for the compiled forward, which reads its own; ``layers``: the
        last ones only, default all)."""
        layers = self.num_layers if layers is None else layers
        gcn = self.architecture == "gcn"
        if self.remote_graph:  # only the rows the plan expands, from Redis, as a local graph
            plan, g, ids = self.graph.sampled_plan(targets, layers, width, self.strategy)
            return plan, g, ids, self.graph.gcn_degrees(ids) if gcn and degrees else None
        plan = execution_plan(self.graph, targets, layers, width, self.strategy)
        degrees = self.model.norm_degrees_for(self.graph, plan.node_ids) if gcn and degrees else None
        return plan, self.graph, plan.node_ids, degrees

    def _edges_per_subgraph(self, batch: SubgraphBatch, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Edges aggregated (over all layers) per target: kept at this width, and exact."""
        kept, total = batch.edge_counts(width)
        layers = max(1, self.num_layers)
        return kept * layers, total * layers


def _patched(old: np.ndarray, n: int, columns: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A new float32 ``[n]`` array: ``old`` (``n`` or fewer entries, the rest new nodes, which
    ``columns`` holds) with ``values`` at ``columns``."""
    out = np.empty(n, dtype=np.float32)
    out[: len(old)] = old
    out[columns] = values
    return out


def _sampled_edges_bound(width: float, layers: int) -> float:
    """Edges an L-layer pass keeps per target at most when every row keeps ``width``: layer ``l``
    aggregates at most ``(1 + width)^(L - l)`` rows of ``width`` edges each."""
    return float(sum(width * (1.0 + width) ** (layers - layer) for layer in range(1, layers + 1)))


@dataclass(frozen=True)
class _NewEdges:
    """A batch's new nodes' edges laid end to end: new node ``j``'s neighbours are ``neighbors[owner == j]``."""

    count: int  # new nodes
    lengths: np.ndarray  # int64 [count]: neighbours per new node
    neighbors: np.ndarray  # int64 [E]
    owner: np.ndarray  # int64 [E]: the new node (0 .. count - 1) of each edge
    weights: np.ndarray | None  # float32 [E] (1 for a new node without weights), None when no new node has any


def _new_edges(specs: list) -> _NewEdges:
    lengths = np.fromiter((len(s.neighbors) for s in specs), dtype=np.int64, count=len(specs))
    nbrs = np.concatenate([np.asarray(s.neighbors, dtype=np.int64) for s in specs]) if specs else np.zeros(0, np.int64)
    weights = None
    if any(s.weights is not None for s in specs):
        weights = np.concatenate([s.weights if s.weights is not None else np.ones(len(s.neighbors), np.float32)
                                  for s in specs]).astype(np.float32, copy=False)
    owner = np.repeat(np.arange(len(specs), dtype=np.int64), lengths)
    return _NewEdges(len(specs), lengths, nbrs, owner, weights)


class _WarmupFuture:
    """The future of a warm-up item, which :meth:`ModelRuntime.warm` processes directly: never done
    (``done()`` is False), so the item counts as live, as a waiting request's would."""

    def done(self) -> bool:
        return False

