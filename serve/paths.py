"""The serving paths of a model version: every way :class:`~serve.runtime.ModelRuntime` answers a batch.

Each path runs the same four stages on a batch of distinct targets (plus the batch's new nodes):
**subgraph** (the rows to compute: an execution plan or induced subgraphs), **rows** (their inputs:
first-layer projections or cached first-layer outputs), **forward** (the layers, softmax, argmax)
and **edge counts** (edges aggregated, kept and exact, per target). A runtime decides once, when it
is built, which paths it has (:func:`paths_for`); per batch it takes the first of them that
accepts the batch (by its size and whether it brings new nodes). ``RuntimeOptions.serving_path``
puts one path first (its batches take it wherever it applies; others fall to the next path), which
is how tests and benchmarks reach a path without touching private state. A new node counts as a target in the
compiled paths' size bound ``fused_max_targets`` (unbounded on a CPU by default; on a GPU the measured crossover
below which the compiled CPU paths beat the device's torch path, :func:`serve.runtime.gpu_thresholds`).

==================  =====================================================  ====================================
path                when it is taken                                        what it caches (beyond the model)
==================  =====================================================  ====================================
plain-resident      plain 2-layer model on a local graph, resident (on a     the graph, projections and one
                    GPU by default, on a CPU with ``resident=True``), no     first-layer table per width, all
                    new nodes, the width has a table in the activation       on the model's device
                    budget; on a GPU, at least ``gpu_min_targets``
                    targets (default: serve.runtime.GPU_MIN_TARGETS_AUTO)
shadow-resident     shaDow model, resident as above, no new nodes, an        the lists, the induced table and
                    induced table covering the budget, no target dirty       projections on the model's device
                    after a graph update; on a GPU, at least
                    ``gpu_min_targets`` targets
plain-activations   plain 2-layer model, compiled layers, no new nodes,      first-layer projections per node;
                    at most ``fused_max_targets`` targets, the width has a   first-layer outputs per node and
                    table in the activation budget                           width (``ActivationCache``)
plain-compiled      plain model on a local graph, compiled forward, at most  first-layer projections per node
                    ``fused_max_targets`` targets and new nodes (an          (a GPU runtime: its CPU copy's)
                    execution plan on their L-hop scopes; a GPU runtime's
                    on its CPU copy, a stateless replica's new nodes only)
plain-torch         plain model, no new nodes (larger batches, a remote      first-layer projections per node
                    graph, or no projection table)
shadow-compiled     shaDow model, compiled forward, at most                  projections; the induced top-K
                    ``fused_max_targets`` targets and new nodes (their       table beside the PPR index
                    lists pushed on the graph plus their edges, their
                    projections from their features)
subgraph-torch      shaDow batches beyond the compiled forward; new nodes    projections; the induced table
                    without a compiled path (L-hop scopes on the graph plus  when there are no new nodes
                    their edges), beyond ``fused_max_targets`` on a GPU
==================  =====================================================  ====================================

The torch paths (``plain-torch``, ``subgraph-torch``) are the specification: ``tests/test_paths.py``
runs every path on the same batches against them and against the offline model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from kernels.fused_forward import plan_forward_cpu, plan_outer_cpu, shadow_forward_cpu
from kernels.plan import edges_on_paths, edges_on_two_layer_paths, execution_plan, local_plan, two_layer_kept
from models.base import dinv32

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .runtime import ModelRuntime

__all__ = ["PATH_NAMES", "PathOutput", "ServingPath", "joined", "paths_for"]


@dataclass
class PathOutput:
    """One batch's answers, row per distinct target then per new node, and its stage marks."""

    probs: np.ndarray  # float32 [n, C]
    labels: np.ndarray  # int64 [n]
    emb: np.ndarray | None  # float32 [n, H] when asked
    kept: np.ndarray  # int64 [n]: edges aggregated at the batch's width
    total: np.ndarray  # int64 [n]: edges an exact pass aggregates
    t_sub: float  # perf_counter marks: subgraph done, rows ready, forward done
    t_feat: float
    t_fwd: float


def joined(a: PathOutput, b: PathOutput) -> PathOutput:
    """One batch's answers from two paths run one after the other (``a``'s rows first): the rows concatenated,
    each stage's mark moved so that its duration is the sum of both runs' (the last mark is ``b``'s)."""
    t_sub = a.t_sub + (b.t_sub - a.t_fwd)
    t_feat = t_sub + (a.t_feat - a.t_sub) + (b.t_feat - b.t_sub)
    t_fwd = t_feat + (a.t_fwd - a.t_feat) + (b.t_fwd - b.t_feat)
    emb = None if a.emb is None or b.emb is None else np.concatenate([a.emb, b.emb])
    return PathOutput(np.concatenate([a.probs, b.probs]), np.concatenate([a.labels, b.labels]), emb,
                      np.concatenate([a.kept, b.kept]), np.concatenate([a.total, b.total]), t_sub, t_feat, t_fwd)


class ServingPath:
    """One way to answer a batch; subclasses say when they apply and run the four stages."""

    name: ClassVar[str]

    def __init__(self, rt: ModelRuntime) -> None:
        self.rt = rt

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        """Whether a runtime can take this path at all (decided once, at construction)."""
        raise NotImplementedError

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        """Whether this path answers a batch of ``targets`` distinct targets and ``new_nodes`` new nodes."""
        raise NotImplementedError

    def takes(self, targets: np.ndarray, budget: int) -> bool:
        """Whether this path answers these distinct ``targets`` at this PPR budget (after :meth:`accepts`;
        a path whose data may not cover every node or budget says so here)."""
        return True

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<serving path {self.name}>"


def _compiled_fits(rt: ModelRuntime, targets: int, new_nodes: int = 0) -> bool:
    """Whether a batch of ``targets`` existing targets and ``new_nodes`` new nodes is within the compiled paths'
    size bound (``fused_max_targets``: every batch on a CPU by default; on a GPU the crossover below which the
    compiled CPU paths beat the device's torch path), a new node counted as a target."""
    return targets + new_nodes <= rt.fused_max_targets


def _small_on_gpu(rt: ModelRuntime, targets: int, width: int) -> bool:
    """A batch a GPU runtime's resident paths leave to its compiled CPU paths (fewer than its
    ``gpu_min_targets``: ``--gpu-min-targets``, or the measured crossover of its resident path, at the exact
    width ``gpu_min_targets_exact``)."""
    least = rt.gpu_min_targets_exact if width == 0 else rt.gpu_min_targets
    return rt.device.type == "cuda" and rt._fused_params is not None and targets < least


def _stateless_edges(rt: ModelRuntime, kept: np.ndarray, ids: np.ndarray, plan: Any, layers: int,
                     width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, exact)`` edge counts on a stateless replica, as ``kernels.plan._with_exact`` gives them
    on a local graph: ``ids`` are the plan's global node ids, the exact counts come from the store."""
    return kept, rt.graph.exact_path_edges(ids[: plan.num_targets], layers) if width else kept


def _torch_answers(rt: ModelRuntime, rows: int, forward: Any, want_emb: bool) -> tuple[Any, ...]:
    """Run ``forward() -> (logits, emb, t_feat)`` on ``RuntimeOptions.torch_path_threads`` torch threads; NumPy
    answers."""
    from .runtime import _torch_threads_for

    with _torch_threads_for(rows, rt._torch_threads, rt.options.torch_path_threads), torch.inference_mode():
        logits, emb, t_feat = forward()
        probs = torch.softmax(logits.float(), dim=1)
        labels = probs.argmax(dim=1)
        probs_np, labels_np, emb_np = answers_to_host(probs, labels, emb if want_emb else None, pack=probs.is_cuda)
    return probs_np, labels_np, emb_np, t_feat


def answers_to_host(probs: torch.Tensor, labels: torch.Tensor, emb: torch.Tensor | None,
                    pack: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(probs, labels, emb)`` as NumPy. ``pack`` (a GPU batch): one ``[n, C + 1 (+ H)]`` float32 tensor
    copied back once (labels, class ids below 2^24, are exact in float32) instead of a copy and a
    synchronisation per tensor; otherwise each tensor's own (CPU) memory."""
    if not pack:
        emb_np = emb.float().cpu().numpy() if emb is not None else None
        return probs.cpu().numpy(), labels.cpu().numpy().astype(np.int64), emb_np
    c = probs.shape[1]
    parts = [probs, labels.to(probs.dtype).unsqueeze(1)] + ([emb.float()] if emb is not None else [])
    flat = torch.cat(parts, dim=1).cpu().numpy()
    return flat[:, :c], flat[:, c].astype(np.int64), (flat[:, c + 1:] if emb is not None else None)


class ResidentPath(ServingPath):
    """A plain 2-layer model resident on its device (kernels.resident): the batch's ids go up once, the
    last layer samples and aggregates there from the width's first-layer table, one packed copy back."""

    name = "plain-resident"

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        return rt._resident is not None

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        # a width without its table starts its build in the background and takes the next path meanwhile
        return not new_nodes and not _small_on_gpu(self.rt, targets, width) and self.rt._resident.request(width)

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        from .runtime import _torch_threads_for

        rt = self.rt
        t_sub = time.perf_counter()  # no host plan: the device samples
        captured = rt._captured
        if rt._resident.head is not None:  # one kernel launch: no torch operator, no thread setting
            probs, labels, kept, emb = rt._resident.answer(targets, width, want_emb)
            if rt._resident.head is None:  # its launch failed: the torch operators answered, and serve from now on
                rt.fused_head_lost()
        else:
            with _torch_threads_for(len(targets) * max(width, 1), rt._torch_threads):
                if captured is not None and captured.wants(len(targets), width, 0, want_emb):
                    probs, labels, kept, emb = captured.answer(targets, width, want_emb)
                else:
                    probs, labels, kept, emb = rt._resident.answer(targets, width, want_emb)
                    if captured is not None:
                        captured.served(len(targets), width, 0, want_emb)
        t_fwd = time.perf_counter()
        total = rt._exact_edges(targets)
        return PathOutput(probs, labels, emb, total if kept is None else kept, total, t_sub, t_sub, t_fwd)


class ShadowResidentPath(ServingPath):
    """A shaDow model resident on its device (kernels.resident.ResidentShadow): lists, induced table and
    projections there, one dense block per target, one packed copy back."""

    name = "shadow-resident"

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        return rt._resident_shadow is not None

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        return not new_nodes and not _small_on_gpu(self.rt, targets, width)

    def takes(self, targets: np.ndarray, budget: int) -> bool:
        return bool(self.rt._resident_shadow.takes(targets, budget))

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        from .runtime import _torch_threads_for

        rt = self.rt
        t_sub = time.perf_counter()
        captured = rt._captured
        res = rt._resident_shadow
        block = res.block  # read once: another thread's failed launch sets it to None
        if block is not None and block.fits(width, budget):  # one launch: no torch operator to set up
            probs, labels, kept, total, emb = res.answer(targets, width, budget, want_emb)
            if res.block is None:  # its launch failed: the torch operators answered, and serve from now on
                rt.fused_head_lost()
        else:
            with _torch_threads_for(len(targets) * budget, rt._torch_threads):
                if captured is not None and captured.wants(len(targets), width, budget, want_emb):
                    probs, labels, kept, total, emb = captured.answer(targets, width, want_emb, budget)
                else:
                    probs, labels, kept, total, emb = res.answer(targets, width, budget, want_emb)
                    if captured is not None:
                        captured.served(len(targets), width, budget, want_emb)
        return PathOutput(probs, labels, emb, kept, total, t_sub, t_sub, time.perf_counter())


class ActivationPath(ServingPath):
    """A plain 2-layer model's last layer alone, from cached first-layer rows (serve.projection)."""

    name = "plain-activations"

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        return rt._activations is not None

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        acts = self.rt._activations
        return not new_nodes and _compiled_fits(self.rt, targets) and acts is not None and acts.has_table(width)

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        rt = self.rt
        plan, _, ids, _ = rt._plan(targets, width, degrees=False, layers=1)
        t_sub = time.perf_counter()
        table = rt._activations.table_for(ids, width)  # type: ignore[union-attr]
        t_feat = time.perf_counter()
        if not rt.remote_graph:
            _, probs, labels, emb = plan_outer_cpu(plan, rt._act_params, table, rt._dinv)
            t_fwd = time.perf_counter()
            kept, total = edges_on_two_layer_paths(plan, rt.graph, width, rt._exact_edges)
            return PathOutput(probs, labels, emb if want_emb else None, kept, total, t_sub, t_feat, t_fwd)
        # a stateless replica: the plan indexes a local graph; its rows gathered, degrees from the store
        dinv = rt.graph.gcn_dinv32(ids) if rt.architecture == "gcn" else None
        _, probs, labels, emb = plan_outer_cpu(local_plan(plan), rt._act_params, table[ids], dinv)
        t_fwd = time.perf_counter()
        kept, total = _stateless_edges(rt, two_layer_kept(plan, rt.graph.row_lengths(ids), width), ids, plan, 2, width)
        return PathOutput(probs, labels, emb if want_emb else None, kept, total, t_sub, t_feat, t_fwd)


class CompiledPlanPath(ServingPath):
    """A plain model's execution plan through the compiled forward (kernels.fused_forward); a batch's new nodes
    (a CPU runtime) on the plan of their own L-hop scopes, built on the batch's induced graph."""

    name = "plain-compiled"

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        return rt._act_params is not None and rt.extractor == "lhop"

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        # new nodes within the size bound, a GPU runtime's too (on its CPU copy of the model: the device's torch path
        # is the slower one for a plain model at every batch size measured, serve.runtime.GPU_MIN_TARGETS_AUTO); a
        # stateless replica's plans index a local graph: it takes new nodes only, their plan on the batch's
        if self.rt._fused_params is None:
            return bool(new_nodes) and not targets and self.rt.device.type != "cuda"
        return _compiled_fits(self.rt, targets, new_nodes)

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        if new_specs:  # the targets first, on their own plan (the bits they get without new nodes), then the new nodes
            first = self.run(targets, [], width, budget, want_emb) if len(targets) else None
            out = self._new_nodes(new_specs, width, budget, want_emb)
            return joined(first, out) if first is not None else out
        rt = self.rt
        plan, plan_graph, plan_ids, _ = rt._plan(targets, width, degrees=False)
        t_sub = time.perf_counter()
        table = rt._cpu_projections.table_for(plan_ids).numpy()
        t_feat = time.perf_counter()
        _, probs, labels, emb = plan_forward_cpu(plan, rt._fused_params, table, rt._dinv)
        t_fwd = time.perf_counter()
        kept, total = edges_on_paths(plan, plan_graph, width, rt._exact_edges)
        return PathOutput(probs, labels, emb if want_emb else None, kept, total, t_sub, t_feat, t_fwd)

    def _new_nodes(self, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        """New nodes as the torch subgraph path defines them (their L-hop scopes on the graph plus their edges, in
        the graph's column order), through an execution plan built on that batch's graph from each scope's
        first row: only the rows within L - 1 hops are aggregated, and only at the layers that read them. GCN
        degrees per batch row (a node next to a new node counts its edge there)."""
        rt = self.rt
        batch = rt._subgraphs(np.zeros(0, np.int64), new_specs, budget)
        plan = execution_plan(batch.graph, batch.ptr[:-1], rt.num_layers, width, rt.strategy)
        t_sub = time.perf_counter()
        table = np.ascontiguousarray(rt._projections(batch, new_specs, rt._cpu_projections).numpy())
        dinv = dinv32(rt._norm_degrees(batch, new_specs)) if rt.architecture == "gcn" else None
        t_feat = time.perf_counter()
        _, probs, labels, emb = plan_forward_cpu(plan, rt._act_params, table, dinv)
        t_fwd = time.perf_counter()
        kept, total = rt._edges_per_subgraph(batch, width)
        return PathOutput(probs, labels, emb if want_emb else None, kept, total, t_sub, t_feat, t_fwd)


class TorchPlanPath(ServingPath):
    """A plain model's execution plan through the model's torch layers (the plain specification)."""

    name = "plain-torch"

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        return rt.extractor == "lhop"

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        return not new_nodes

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        rt = self.rt
        plan, plan_graph, plan_ids, degrees = rt._plan(targets, width, degrees=True)
        if rt.device.type == "cuda":
            layers = [plan.layer_graph(layer, rt.model.rescales_samples) for layer in range(1, plan.layers + 1)]
            degrees = _stage(rt, layers, degrees)
        t_sub = time.perf_counter()

        def forward() -> tuple[Any, Any, float]:
            p_rows = rt.projections.get(plan_ids)
            t_feat = time.perf_counter()
            logits, emb = rt.model.forward_plan(plan, p_rows, degrees)
            return logits, emb, t_feat

        probs, labels, emb, t_feat = _torch_answers(rt, plan.sizes[0], forward, want_emb)
        t_fwd = time.perf_counter()
        if rt.remote_graph:  # plan_graph holds only the expanded rows: exact counts from the store's degrees
            kept, total = _stateless_edges(rt, plan.kept_per_target(), plan_ids, plan, plan.layers, width)
        else:
            kept, total = edges_on_paths(plan, plan_graph, width, rt._exact_edges)
        return PathOutput(probs, labels, emb, kept, total, t_sub, t_feat, t_fwd)


def _stage(rt: ModelRuntime, graphs: list, degrees: Any) -> Any:
    """On a GPU with the ES-SpMM kernel: a batch's graphs (a plan's layer graphs, or the induced subgraphs)
    and its GCN degrees on the device in one copy (:func:`kernels.spmm_cuda.stage_graphs`) instead of one
    synchronous copy per array; returns the degrees to hand to the forward (on the device, or as they
    were)."""
    global _staging_ok
    from kernels import spmm_cuda

    if not (_staging_ok and spmm_cuda.available()):
        return degrees
    extras = [] if degrees is None else [np.asarray(degrees, dtype=np.float64)]
    try:
        staged = spmm_cuda.stage_graphs(graphs, rt.device, extras)
    except Exception:  # an optimisation: without it each array is uploaded on its own, as before
        _staging_ok = False
        log.exception("staging a batch's graphs in one copy failed; uploading them one by one from now on")
        return degrees
    return staged[0] if degrees is not None else None


_staging_ok = True  # False once staging failed (then every batch uploads its arrays one by one)


class CompiledShadowPath(ServingPath):
    """A shaDow model's block-diagonal subgraph batch through the compiled forward."""

    name = "shadow-compiled"

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        return rt._fused_params is not None and rt.extractor == "ppr"

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        # new nodes too (a GPU runtime's on its CPU copy, within the size bound like any batch): their subgraphs
        # are the push's lists on the graph plus their edges, read like any other
        return _compiled_fits(self.rt, targets, new_nodes)

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        rt = self.rt
        batch = rt._subgraphs(targets, new_specs, budget)
        t_sub = time.perf_counter()
        rows = None
        if new_specs:  # the unique rows' projections, new nodes' from their features; each batch row reads its own
            table = rt._unique_projections(batch, new_specs, rt._cpu_projections).numpy()
            rows = batch.row_to_unique
        else:
            table = rt._cpu_projections.table_for(batch.unique_ids).numpy()
        t_feat = time.perf_counter()
        args = (batch, rt._fused_params, table, width or None, rt.strategy)
        # ``rows`` only where needed: benchmarks/fused.py --base calls an older shadow_forward_cpu here
        _, probs, labels, emb = shadow_forward_cpu(*args) if rows is None else shadow_forward_cpu(*args, rows=rows)
        t_fwd = time.perf_counter()
        kept, total = rt._edges_per_subgraph(batch, width)
        return PathOutput(probs, labels, emb if want_emb else None, kept, total, t_sub, t_feat, t_fwd)


class TorchSubgraphPath(ServingPath):
    """Induced subgraphs (PPR top-K or L-hop scopes, new nodes placed on the graph plus their edges)
    through the model's torch layers: the specification of shaDow and of new nodes, and the batches with new
    nodes the compiled paths do not take (a GPU runtime's, a plain model without compiled layers)."""

    name = "subgraph-torch"

    @staticmethod
    def available(rt: ModelRuntime) -> bool:
        return True

    def accepts(self, targets: int, new_nodes: int, width: int) -> bool:
        # a plain model's induced L-hop scopes equal its plan at exact width only (kernels.plan): they
        # serve the batches a plan cannot, those with new nodes
        return new_nodes or self.rt.extractor == "ppr"

    def run(self, targets: np.ndarray, new_specs: list, width: int, budget: int, want_emb: bool) -> PathOutput:
        rt = self.rt
        batch = rt._subgraphs(targets, new_specs, budget)
        t_sub = time.perf_counter()

        def forward() -> tuple[Any, Any, float]:
            p_rows = rt._projections(batch, new_specs)
            t_feat = time.perf_counter()
            norm_degrees = rt._norm_degrees(batch, new_specs) if rt.architecture == "gcn" else None
            if rt.device.type == "cuda":
                norm_degrees = _stage(rt, [batch.graph], norm_degrees)
            logits, emb = rt.model.forward_batch_projected(batch, p_rows, width or None, rt.strategy, norm_degrees)
            return logits, emb, t_feat

        probs, labels, emb, t_feat = _torch_answers(rt, batch.graph.num_nodes, forward, want_emb)
        t_fwd = time.perf_counter()
        kept, total = rt._edges_per_subgraph(batch, width)
        return PathOutput(probs, labels, emb, kept, total, t_sub, t_feat, t_fwd)


#: every path, in the order a runtime prefers them
PATHS: tuple[type[ServingPath], ...] = (ResidentPath, ShadowResidentPath, ActivationPath, CompiledPlanPath, TorchPlanPath, CompiledShadowPath,
                                        TorchSubgraphPath)
PATH_NAMES: tuple[str, ...] = tuple(p.name for p in PATHS)


def paths_for(rt: ModelRuntime, first: str | None = None) -> tuple[ServingPath, ...]:
    """The paths ``rt`` can take, in order of preference; ``first`` (a path name) leads when given.

    Raises ``ValueError`` for an unknown name or a path this runtime cannot take.
    """
    paths = [cls(rt) for cls in PATHS if cls.available(rt)]
    if first is not None:
        if first not in PATH_NAMES:
            raise ValueError(f"unknown serving path {first!r}; the paths are {', '.join(PATH_NAMES)}")
        chosen = [p for p in paths if p.name == first]
        if not chosen:
            raise ValueError(f"model {rt.name} v{rt.version} cannot take serving path {first!r}; it has "
                             f"{', '.join(p.name for p in paths)}")
        paths = chosen + [p for p in paths if p.name != first]
    return tuple(paths)
