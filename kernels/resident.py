r"""A plain 2-layer model resident on its device: graph, projections and first-layer tables, sampled inside.

The paper's point (ES-SpMM) is that the kernel samples each row's edges itself, so nothing is
pre-sampled on the host. The other serving paths build an execution plan on the host
(:mod:`kernels.plan`) and send it to the device per batch: on a GPU that is a dozen pageable copies
and as many hidden synchronisations per request (issue #22). Here everything a batch reads lives on
the model's device once:

* the CSR (``indptr``, ``indices``, ``weights``), the row lengths and the GCN :math:`D^{-1/2}`;
* the first-layer projection table ``P`` ``[N, P]`` (:class:`serve.projection.ProjectionCache`);
* per sampling width ``S``, the ReLU'd first-layer output of every node ``H_S`` ``[N, H]`` (on a CPU
  one full-graph :func:`kernels.spmm.sampled_spmm`, the compiled ES-SpMM kernel; on a GPU from the
  width's kept edges below, in chunks): the rows layer 1 computes for node ``i`` at width ``S`` depend on
  ``i`` and ``S`` only, so one table serves every batch at that width (the same argument as
  :class:`serve.projection.ActivationCache`);
* per width, its kept edges with their coefficients and every node's 2-layer kept-edge count
  (:class:`WidthCSR`, the sampled graph built once on the device), so a batch reads slices instead of
  sampling again (a third of the operators a batch ran when it sampled per request).

A batch then sends its target ids once and runs the last layer on the device:

.. math::

    \text{gcn:}\quad z_t = \Big(g_t^2 H_t + s_t g_t \sum_{q < k_t} w_{e_q} g_{j_q} H_{j_q}\Big) W^T + b,
    \qquad \text{sage:}\quad z_t = H_t W_r^T + \Big(\frac{1}{k_t} \sum_{q < k_t} w_{e_q} H_{j_q}\Big) W_n^T + b

with the kept edges :math:`e_q = \mathrm{indptr}_t + p_t(q)` of :func:`kernels.spmm.sample_positions`
(:math:`k_t = \min(d_t, S)`, :math:`s_t = d_t / k_t`, :math:`g = D^{-1/2}`; no neighbour term when
:math:`k_t = 0`), then softmax and arg-max; the answers, the embeddings (``H_t``) and the kept edge
counts come back in one packed copy. The formula is the last layer of :meth:`models.base.PlainGNN.forward_plan`
transformed after aggregating instead of before (equal up to rounding; tests hold it to the model).

Slots. At a sampled width every target gets exactly ``S`` slots (``[B, S]``, the ones past ``k_t``
masked with weight 0 and pointed at a dummy edge): static shapes, no data-dependent size anywhere,
so a batch is free of host synchronisations and can be captured in a CUDA graph per (batch bucket,
width) (:class:`CapturedForward`). At the exact width (or a width above :data:`PAD_MAX`) the slots are
the targets' kept edges back to back; their number is summed on the host from its own copy of the
kept counts, so that path does not synchronise either.

Live graphs. :meth:`ResidentPlain.rebase` installs an updated graph (its CSR uploaded again, which the
host's copy-on-write edit costs anyway, and every width's kept edges built again from it) and
recomputes, at every width held, exactly the first-layer rows the update changed (the caller's stale
set), through the same slots as the last layer.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .dense import linear, product  # on a CPU batch-invariant (a BLAS's rows move with the batch)
from .graph import CSRGraph
from .spmm import _gcn_dinv, sample_positions
from .spmm_cuda import _upload as _to_device  # host array -> device tensor (no copy on a CPU)

__all__ = ["PAD_MAX", "CapturedForward", "DeviceBusy", "DeviceGraph", "ResidentPlain", "ResidentShadow", "WidthBudget",
           "bucket_of", "no_waiting"]

log = logging.getLogger(__name__)

#: sampled widths up to this get ``[B, S]`` padded slots (static shapes); wider ones, packed slots
PAD_MAX = 256
#: rows per chunk when recomputing first-layer rows after an update (bounds the gathered slots)
REFRESH_ROWS = 8192
#: rows per chunk when a GPU builds a width's first-layer table from its kept edges
BUILD_ROWS = 16384


#: CUDA errors after which a context is unusable (sticky): illegal address, launch timeout, device-side
#: assert, hardware stack error, illegal instruction, misaligned address, invalid address space, invalid
#: program counter, launch failure (the driver's and the runtime's codes agree); and how torch words them
STICKY_CUDA_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})
_STICKY_TEXT = ("illegal memory access", "illegal address", "illegal instruction", "misaligned address",
                "unspecified launch failure", "device-side assert", "invalid program counter",
                "hardware stack error", "launch timed out", "invalid address space")


def device_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error that leaves its context unusable (a kernel fault is sticky: every later
    operation on that device fails, the torch operators too), from its status (CuPy's errors carry one) or
    its text (torch's). Then a failed fused kernel must not hand its batch to the torch operators there: the
    error goes up, and the runtime switches the resident path off and keeps what it can off the device
    (serve.runtime's ``_run_path``). Decided from the error alone: synchronising the device to ask would
    disturb another model's CUDA graph capture."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status in STICKY_CUDA_ERRORS:
        return True
    text = str(exc).lower()
    return any(t in text for t in _STICKY_TEXT)


def _fused_failed(exc: Exception, what: str) -> None:
    """A fused kernel (``what``) failed a batch and its owner dropped it: said, and the torch operators answer
    from now on; unless the error lost the device (:func:`device_lost`), where they cannot run either: then
    it goes up to the runtime."""
    if device_lost(exc):
        raise exc
    log.error("%s failed a batch; the torch operators answer this model's batches from now on", what,
              exc_info=exc)


def bucket_of(n: int) -> int:
    """The batch bucket of ``n`` targets: the next power of two (CUDA graphs are captured per bucket)."""
    return 1 << max(0, int(n) - 1).bit_length()


class WidthBudget:
    """Which sampling widths get their per-node state (an ``[N, H]`` table, and for the resident path the
    width's kept edges) within a byte budget: a width is admitted while its state fits beside that of the
    widths held, with room always kept for ``reserved_width`` (the model's default width) until it has its
    own, so widths that clients choose cannot take the budget from the width a knob-less request gets.
    ``size_of(width)`` gives a width's bytes. A refusal is logged once per width: as a warning when no
    width fits at all (a configuration to fix), else as information, with ``consequence`` (formatted with
    ``table_bytes``, the refused width's bytes)."""

    def __init__(self, budget_bytes: int, reserved_width: int | None, owner: str, consequence: str) -> None:
        self.budget_bytes = int(budget_bytes)
        self.reserved_width = reserved_width
        self.owner = owner
        self.consequence = consequence
        self.refused: set[int] = set()

    def admits(self, width: int, held: Any, size_of: Any) -> bool:
        """Whether ``width``'s state fits beside that of the widths ``held`` (a container of widths)."""
        reserved = self.reserved_width
        need = size_of(width) + sum(size_of(w) for w in held)
        if reserved is not None and width != reserved and reserved not in held:
            need += size_of(reserved)
        if need <= self.budget_bytes:
            return True
        if width not in self.refused:  # said once per width
            self.refused.add(width)
            mine = size_of(width)
            log.log(logging.WARNING if not held else logging.INFO,
                    "%s: no room for width %d (%d widths held; %d bytes needed with it, budget %d); %s", self.owner,
                    width, len(held), need, self.budget_bytes, self.consequence.format(table_bytes=mine))
        return False


@dataclass
class DeviceGraph:
    """A :class:`~kernels.graph.CSRGraph` on a device (on a CPU, the host's arrays themselves)."""

    indptr: torch.Tensor  # int64 [N + 1]
    indices: torch.Tensor  # int32 / int64 [E]
    weights: torch.Tensor | None  # float32 [E]
    deg: torch.Tensor  # int64 [N]
    deg_host: np.ndarray  # int64 [N]: the host's row lengths (sizes computed without the device)
    num_nodes: int
    num_edges: int

    @classmethod
    def upload(cls, graph: CSRGraph, device: torch.device) -> DeviceGraph:
        w = None if graph.weights is None else _to_device(np.asarray(graph.weights, dtype=np.float32), device)
        indptr = _to_device(np.asarray(graph.indptr, dtype=np.int64), device)
        return cls(indptr, _to_device(np.asarray(graph.indices), device), w, indptr[1:] - indptr[:-1],
                   np.asarray(graph.degrees, dtype=np.int64), graph.num_nodes, graph.num_edges)

    def nbytes(self) -> int:
        return _nbytes(self.indptr, self.indices, self.deg, self.weights)


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@dataclass
class WidthCSR:
    """The kept edges of every row at one sampling width, with their aggregation coefficients: the
    sampled graph of ES-SpMM, built once per width on the device (:func:`width_csr`), so that a batch
    reads its targets' slices instead of sampling again. Entry ``K`` (past the kept edges) is a dummy
    (node 0, coefficient 0) where masked slots point."""

    crow: torch.Tensor  # int64 [N + 1]
    col: torch.Tensor  # int64 [K + 1]
    coef: torch.Tensor  # float32 [K + 1]: gcn w s_i g_i g_j, sage w / k_i
    k: torch.Tensor  # int64 [N]: kept edges per row
    k_host: np.ndarray  # int64 [N]: the same on the host (packed slot counts without the device)
    kept2: torch.Tensor | None  # int64 [N]: a 2-layer path's kept edges per node (sampled widths)

    def nbytes(self) -> int:
        return _nbytes(self.crow, self.col, self.coef, self.k, self.kept2)


def width_csr(dg: DeviceGraph, width: int, strategy: str, dinv: torch.Tensor | None) -> WidthCSR:
    """The :class:`WidthCSR` of ``dg`` at ``width`` (0: every edge). ``dinv``: GCN's :math:`D^{-1/2}` (the
    coefficients are then GCN's, else GraphSAGE-mean's). The kept positions are
    :func:`kernels.spmm.sample_positions`' (through ``kernels.spmm._sampled_edges``); ``kept2`` counts
    each distinct neighbour once (:func:`kernels.plan.edges_on_two_layer_paths`). Reads sizes back
    from the device: a build, not a batch."""
    from .spmm import _sampled_edges

    dev = dg.indptr.device
    n = dg.num_nodes
    sampled = bool(width) and dg.num_edges > 0 and int(dg.deg_host.max(initial=0)) > width
    if sampled:
        kept, crow, row, edge = _sampled_edges({"indptr": dg.indptr, "deg": dg.deg}, width, strategy)
    else:
        kept, crow = dg.deg, dg.indptr
        edge = torch.arange(dg.num_edges, device=dev)
        row = torch.repeat_interleave(torch.arange(n, device=dev), kept, output_size=dg.num_edges)
    col = dg.indices.index_select(0, edge).long()
    w = dg.weights.index_select(0, edge) if dg.weights is not None else torch.ones(len(edge), device=dev)
    kf = kept.float().clamp(min=1)
    if dinv is not None:
        coef = w * (dg.deg.float() / kf * dinv).index_select(0, row) * dinv.index_select(0, col)
    else:
        coef = w / kf.index_select(0, row)
    kept2 = None
    if width:
        # k_t + sum over {t} u N_S(t) of k_u, each node once: sort the kept (row, column) pairs
        key, order = torch.sort(row * (n + 1) + col)
        first = torch.ones_like(key, dtype=torch.bool)
        first[1:] = key[1:] != key[:-1]
        r_s, c_s = row.index_select(0, order), col.index_select(0, order)
        k_u = torch.where(first & (c_s != r_s), kept.index_select(0, c_s), 0)
        kept2 = 2 * kept + torch.zeros(n, dtype=torch.int64, device=dev).index_add_(0, r_s, k_u)
    k_host = np.minimum(dg.deg_host, width) if width else dg.deg_host
    zero_i, zero_f = torch.zeros(1, dtype=torch.int64, device=dev), torch.zeros(1, device=dev)
    return WidthCSR(crow, torch.cat([col, zero_i]), torch.cat([coef, zero_f]), kept, k_host, kept2)


@dataclass
class Slots:
    """The kept edges of some rows at one width, read from its :class:`WidthCSR`: slot ``q`` belongs to
    row ``seg[q]`` and reads node ``nbr[q]`` with coefficient ``coef[q]`` (0 on a masked slot).
    ``padded``: ``S`` slots per row in row order (``[R * S]``)."""

    seg: torch.Tensor | None  # int64 [T] (packed slots only)
    nbr: torch.Tensor  # int64 [T]
    coef: torch.Tensor  # float32 [T]
    padded: int  # S when padded, else 0


def padded_slots(c: WidthCSR, rows: torch.Tensor, width: int) -> Slots:
    """``width`` slots per row (``width`` > 0): the kept edges first, the rest masked (static shapes)."""
    start = c.crow.index_select(0, rows).unsqueeze(1)
    q = torch.arange(width, device=rows.device)
    e = torch.where(q < c.k.index_select(0, rows).unsqueeze(1), start + q, c.col.numel() - 1).reshape(-1)
    return Slots(None, c.col.index_select(0, e), c.coef.index_select(0, e), width)


def packed_slots(c: WidthCSR, rows: torch.Tensor, rows_host: np.ndarray) -> Slots:
    """The rows' kept edges back to back; their count comes from the host's copy of the kept counts
    (``rows_host``: the same ids), so no size is read back from the device."""
    total = int(c.k_host[rows_host].sum())
    k = c.k.index_select(0, rows)
    seg = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), k, output_size=total)
    shift = (c.crow.index_select(0, rows) - (torch.cumsum(k, 0) - k)).index_select(0, seg)
    e = torch.arange(total, device=rows.device) + shift
    return Slots(seg, c.col.index_select(0, e), c.coef.index_select(0, e), 0)


def slot_sum(s: Slots, x: torch.Tensor, rows: int) -> torch.Tensor:
    """``[R, F]``: per row, the sum over its slots of ``coef[q] * x[nbr[q]]``."""
    xs = x.index_select(0, s.nbr) * s.coef.unsqueeze(1)
    if s.padded:  # a fixed number of slots per row: a reshape and a sum (deterministic, no atomics)
        return xs.view(rows, s.padded, x.shape[1]).sum(1)
    assert s.seg is not None
    return torch.zeros(rows, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, s.seg, xs)


class DeviceBusy(RuntimeError):
    """A resident model's lock is held (a width's table build on a GPU, a CPU build's snapshot and install,
    another thread's batch or its CUDA graph capture), or the batch would first have to capture a CUDA graph
    or upload a new induced table, and this thread asked not to wait (:class:`no_waiting`): raised before the
    batch did anything, so that the caller can run it where waiting is harmless."""


_waiting = threading.local()


def _not_waiting() -> bool:
    """Whether this thread is inside :class:`no_waiting`."""
    return getattr(_waiting, "off", False)


class no_waiting:
    """Within this block, on this thread, a resident model's batch raises :class:`DeviceBusy` instead of
    waiting for the model's lock or doing slow one-off work (a CUDA graph capture, an induced table's upload).
    The server's event loop answers small batches itself (``serve.batcher``'s inline batches); a GPU table build
    holds the lock for the whole build (milliseconds), and every other request on the loop would wait with it."""

    def __enter__(self) -> no_waiting:
        self._before = _not_waiting()
        _waiting.off = True
        return self

    def __exit__(self, *exc: object) -> None:
        _waiting.off = self._before


class _Held:
    """``with model.held():`` the model's lock, or :class:`DeviceBusy` at once inside :class:`no_waiting`."""

    __slots__ = ("lock", "what")

    def __init__(self, lock: threading.Lock, what: str) -> None:
        self.lock = lock
        self.what = what

    def __enter__(self) -> None:
        if _not_waiting():
            if not self.lock.acquire(blocking=False):
                raise DeviceBusy(f"{self.what}: busy (a table build, or another batch or its CUDA graph capture)")
        else:
            self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


class _OnDevice:
    """What both resident models keep beside their data: one batch at a time on the device state (a lock:
    its pinned buffers and a captured graph's static tensors are shared by ``--workers`` threads), the
    counters their statistics report, a ``generation`` bumped whenever a tensor a captured graph reads is
    replaced, and the two transfers of a batch (ids up through a pinned buffer, one packed copy back)."""

    def _init_device_state(self, device: torch.device) -> None:
        self.device = device
        self.lock = threading.Lock()
        self.generation = 0
        self.batches = 0
        self.targets = 0
        self._pinned_in: torch.Tensor | None = None
        self._pinned_out: torch.Tensor | None = None
        self._event = torch.cuda.Event() if device.type == "cuda" else None

    def held(self) -> _Held:
        """:attr:`lock` for one batch: waited for, or inside :class:`no_waiting` taken only if free
        (:class:`DeviceBusy` otherwise). Table builds and rebases take :attr:`lock` itself: they run in
        background or update threads, where waiting is what they should do."""
        return _Held(self.lock, f"resident {type(self).__name__} on {self.device}")

    def stage_ids(self, targets: np.ndarray, size: int | None = None) -> torch.Tensor:
        """``targets`` as a host int64 tensor of ``size`` entries (default their count; the rest filled
        with the first id): the pinned buffer on a GPU, so that the upload does not block."""
        n = len(targets)
        size = n if size is None else int(size)
        if self.device.type != "cuda":
            ids = torch.empty(size, dtype=torch.int64)
        else:
            if self._pinned_in is None or self._pinned_in.numel() < size:
                self._pinned_in = torch.empty(bucket_of(size), dtype=torch.int64, pin_memory=True)
            ids = self._pinned_in[:size]
        view = ids.numpy()
        view[:n] = targets
        view[n:] = targets[0] if n else 0
        return ids

    def upload_ids(self, targets: np.ndarray) -> torch.Tensor:
        """``targets`` on the device: through the pinned buffer, without blocking, on a GPU."""
        ids = self.stage_ids(targets)
        return ids if self.device.type != "cuda" else ids.to(self.device, non_blocking=True)

    def fetch(self, packed: torch.Tensor) -> np.ndarray:
        """A packed float32 device tensor on the host: one copy into the pinned buffer and one wait on a GPU
        (on a CPU, a view of ``packed``)."""
        if self.device.type != "cuda":
            return packed.numpy()
        if self._pinned_out is None or self._pinned_out.numel() < packed.numel():
            self._pinned_out = torch.empty(max(packed.numel(), 1 << 12), dtype=torch.float32, pin_memory=True)
        host = self._pinned_out[: packed.numel()]
        host.copy_(packed, non_blocking=True)
        assert self._event is not None
        self._event.record(torch.cuda.current_stream(self.device))  # the copy's stream, on the model's device
        self._event.synchronize()
        return host.numpy().copy()


class ResidentPlain(_OnDevice):
    """A plain 2-layer GCN / GraphSAGE, its graph, projections and first-layer tables on one device
    (module docstring).

    Args:
        model: the :class:`models.base.PlainGNN` (2 layers, ``plan_aggregator`` gcn or sage), on ``device``.
        graph: the full graph (host).
        projections: a zero-argument callable returning the complete ``[N, P]`` projection table on the
            device (every row valid; :meth:`serve.projection.ProjectionCache.complete_table`).
        strategy: the model's sampling strategy.
        budget_bytes: bound on the first-layer tables of all widths together.
        reserved_width: a width whose table always has room (the model's default width).
    """

    def __init__(self, model: Any, graph: CSRGraph, projections: Any, *, strategy: str, budget_bytes: int,
                 reserved_width: int | None = None, fused_head: bool | None = None) -> None:
        from .fused_forward import AGG_GCN, AGG_SAGE

        if int(getattr(model, "layers", 0)) != 2 or model.plan_aggregator not in (AGG_GCN, AGG_SAGE):
            raise ValueError("the resident path serves plain 2-layer GCN / GraphSAGE models")
        self.model = model
        self.gcn = model.plan_aggregator == AGG_GCN
        self._init_device_state(next(model.parameters()).device)
        self.projections = projections
        self.strategy = strategy
        self._room = WidthBudget(budget_bytes, reserved_width, "resident path", "its batches take the next path")
        #: build first-layer tables from the kept edges rather than through sampled_spmm (:meth:`_full_table`)
        self.build_from_slots = self.device.type == "cuda"
        last = model.convs[1]
        self.hidden = int(model.convs[0].out_channels)
        self.num_classes = int(last.out_channels)
        with torch.no_grad():
            if self.gcn:
                self._w = (last.weight.detach().t().contiguous(),)
            else:
                self._w = (last.weight_root.detach().t().contiguous(), last.weight_neigh.detach().t().contiguous())
            zeros = torch.zeros(self.num_classes, device=self.device)
            self._b = last.bias.detach().clone() if last.bias is not None else zeros
            first = model.convs[0]
            self._b1 = first.bias.detach().clone() if first.bias is not None else torch.zeros(self.hidden, device=self.device)
        self._tables: dict[int, torch.Tensor] = {}
        self._csr: dict[int, WidthCSR] = {}  # the kept edges per width, beside its table
        #: bumped (under :attr:`lock`) by every :meth:`rebase`: a table built from the state before one is
        #: brought up to it before its install (:meth:`_build`, :meth:`_catch_up`)
        self._epoch = 0
        self._build_lock = threading.Lock()
        self._one_build = threading.Lock()  # builds run one at a time (the stale rows below are the build's)
        #: while a build runs: the rows each rebase recomputed, which the build recomputes in its own table
        #: before installing it (:meth:`_catch_up`)
        self._tracking = False
        self._pending_stale: list[np.ndarray] = []
        self._building: int | None = None  # the width the background builder works on
        self._builder: threading.Thread | None = None
        self.builds = 0  # tables installed
        self.caught_up = 0  # tables built across an update, brought up to it before their install
        self._install(graph, DeviceGraph.upload(graph, self.device))
        #: the last layer in one kernel launch (kernels.resident_head) on a GPU; None: the torch operators
        self.head: Any = None
        if fused_head is not False and self.device.type == "cuda":
            from . import resident_head

            self.head = resident_head.create(self)
        if fused_head and self.head is None:
            raise RuntimeError("the fused last layer cannot run here (the log says why); leave fused_head unset")

    # ------------------------------------------------------------------ state
    def _install(self, graph: CSRGraph, dg: DeviceGraph, dinv: torch.Tensor | None = None) -> None:
        self.graph = graph
        self.dg = dg
        self.num_nodes = graph.num_nodes
        # D^{-1/2}, D_i = 1 + sum_j w_ij: the full graph's GCN degrees, as sampled_spmm computes them
        if self.gcn and dinv is None:
            dinv = _gcn_dinv(graph, self.device, torch.float32)
        self.dinv = dinv if self.gcn else None
        self.table_bytes = self.num_nodes * self.hidden * 4
        self.generation += 1

    def widths(self) -> list[int]:
        return sorted(self._tables)

    def holds(self, width: int) -> bool:
        """Whether the table of ``width`` is built (:meth:`has_table` may build it)."""
        return width in self._tables

    def width_bytes(self, width: int) -> int:
        """The device bytes a width holds: its first-layer table and its kept edges (:class:`WidthCSR`:
        row pointers, kept counts and 2-layer counts per node, a column and a coefficient per kept edge)."""
        deg = self.dg.deg_host
        kept = int((np.minimum(deg, width) if width else deg).sum())
        return self.table_bytes + 8 * (self.num_nodes + 1) + 16 * self.num_nodes + 12 * (kept + 1)

    def nbytes(self) -> int:
        """Device bytes: the graph, the first-layer tables and each width's kept edges."""
        return self.dg.nbytes() + len(self._tables) * self.table_bytes + sum(c.nbytes() for c in self._csr.values())

    def stats(self) -> dict[str, float]:
        """A per-node cache's statistics (serve.metrics): targets answered from the tables (``hits``; a
        table is built whole, so no ``misses``), rows held over all widths, device bytes (:meth:`nbytes`);
        and widths, batches."""
        return {"hits": self.targets, "misses": 0, "rows": len(self._tables) * self.num_nodes,
                "bytes": self.nbytes(), "widths": len(self._tables), "batches": self.batches}

    def has_table(self, width: int) -> bool:
        """Whether ``width`` has a first-layer table, building it here and now (one full-graph pass) if the
        budget has room: the warm-up's call, before the model serves. Batches call :meth:`request`."""
        return width in self._tables or self._build(width)

    def request(self, width: int) -> bool:
        """Whether ``width``'s table is held; if not, and the budget has room, start building it on a
        background thread, so that no batch waits for a full-graph pass (seconds on a CPU at millions of
        nodes): the batch takes the next path, later ones find the table. One build at a time: while one
        runs, other widths are not queued (a later batch asks again), so a client cycling through widths
        costs at most one build in flight, and no more tables than the budget holds."""
        if width in self._tables:
            return True
        with self._build_lock:
            if self._building is not None or width in self._tables:
                return width in self._tables
            if not self._room.admits(width, self._tables, self.width_bytes):
                return False
            self._building = width
            self._builder = threading.Thread(target=self._build_in_background, args=(width,),
                                             name=f"resident-table-{width}", daemon=True)
            self._builder.start()
        return False

    def _build_in_background(self, width: int) -> None:
        t0 = time.perf_counter()
        try:
            if self._build(width):
                log.info("resident path: first-layer table of width %d built in %.2f s", width,
                         time.perf_counter() - t0)
        except Exception:  # loud, and the width keeps taking the host paths
            log.exception("resident path: building the first-layer table of width %d failed", width)
        finally:
            with self._build_lock:
                self._building = None

    def wait_for_builds(self, timeout: float | None = None) -> bool:
        """Wait for the background build (if one runs); whether none runs any more."""
        t = self._builder
        if t is not None:
            t.join(timeout)
        return self._building is None

    def _build(self, width: int) -> bool:
        """Build ``width``'s kept edges and table from a snapshot of the state taken under :attr:`lock`,
        outside it (batches of other widths go on), and install them under it. Updates that came in
        meanwhile (:attr:`_epoch` moved) are applied to the new table first, exactly as :meth:`rebase`
        applied them to the held ones (:meth:`_catch_up`): a table never holds a row of an older graph or
        older features than the held ones, and a write load cannot starve a build. An update after the
        install recomputes the new table's stale rows with the others'. On a GPU the whole build holds the
        lock instead (a CUDA graph capture, done under it, tolerates no other thread's allocation or
        synchronisation). Whether the width is held."""
        with self._one_build:
            if self.device.type == "cuda":
                # a batch thread may be capturing a CUDA graph (under the lock), and a capture forbids other
                # threads' allocations and synchronisations: on a GPU (a build of milliseconds) the whole
                # build holds the lock
                with self.lock:
                    return self._build_now(width, contextlib.nullcontext())
            return self._build_now(width, self.lock)

    def _build_now(self, width: int, lock: Any) -> bool:
        """:meth:`_build`'s steps, ``lock`` taken for the snapshot and the install (a no-op context when the
        caller holds the lock throughout)."""
        with lock:
            if width in self._tables:
                return True
            if not self._room.admits(width, self._tables, self.width_bytes):
                return False
            epoch, graph, dg, dinv = self._epoch, self.graph, self.dg, self.dinv
            self._tracking, self._pending_stale = True, []
        try:
            with torch.inference_mode():
                csr = width_csr(dg, width, self.strategy, dinv)
                table = self._full_table(width, graph, csr, dinv)
                if table.is_cuda:
                    torch.cuda.current_stream(table.device).synchronize()  # done before any batch reads it
            with lock, torch.inference_mode():
                if width in self._tables:
                    return True
                if not self._room.admits(width, self._tables, self.width_bytes):
                    return False
                if self._epoch != epoch:
                    csr, table = self._catch_up(width, csr, table, dg)
                self._csr[width] = csr
                self._tables[width] = table
                self.generation += 1
                self.builds += 1
        finally:
            with lock:
                self._tracking, self._pending_stale = False, []
        return True

    def _catch_up(self, width: int, csr: WidthCSR, table: torch.Tensor,
                  dg: DeviceGraph) -> tuple[WidthCSR, torch.Tensor]:
        """A table (and kept edges) built from device graph ``dg`` and the features of then, brought to the
        state the held tables are in now (under :attr:`lock`): the kept edges again if the graph changed,
        rows for new nodes, and every row an update since then recomputed."""
        if self.dg is not dg:
            csr = width_csr(self.dg, width, self.strategy, self.dinv)
        stale = np.unique(np.concatenate(self._pending_stale)) if self._pending_stale else np.zeros(0, np.int64)
        table = self._refreshed(table, width, stale, self.projections(), csr)
        self.caught_up += 1
        log.info("resident path: the table of width %d was built across %d row recomputes; %d rows brought up "
                 "to date", width, len(self._pending_stale), len(stale))
        return csr, table

    def _full_table(self, width: int, graph: CSRGraph, csr: WidthCSR, dinv: torch.Tensor | None) -> torch.Tensor:
        """``relu(layer 1)`` of every node of ``graph`` at ``width`` (``csr``: its kept edges, ``dinv``: its
        GCN degrees). On a CPU, the model's own layer over the whole graph (the compiled ES-SpMM kernel); on
        a GPU (:attr:`build_from_slots`), the width's kept edges read :data:`BUILD_ROWS` rows at a time,
        because the CUDA kernel would keep a second copy of the CSR on the device (its own memo) for this
        one pass."""
        n = graph.num_nodes
        with torch.inference_mode():
            p = self.projections()
            if self.build_from_slots:
                table = torch.empty((n, self.hidden), dtype=torch.float32, device=self.device)
                for lo in range(0, n, BUILD_ROWS):
                    rows = np.arange(lo, min(n, lo + BUILD_ROWS), dtype=np.int64)
                    table[lo: lo + len(rows)] = self.first_layer_rows(rows, width, p, csr, dinv)
                return table
            h = self.model.convs[0].aggregate(graph, p[:n], width or None, self.strategy)
            return torch.relu_(h).contiguous()

    def prepare(self, graph: CSRGraph, dg: DeviceGraph) -> dict[str, Any]:
        """What a structural update's :meth:`rebase` needs from the new graph alone, computed while batches
        still run on the old one (an update's prepare phase, outside the write lock): its GCN degrees and
        the kept edges of every width held now (O(E) each on the device). A width installed after this is
        built in the rebase itself."""
        dinv = _gcn_dinv(graph, self.device, torch.float32) if self.gcn else None
        with torch.inference_mode():
            csr = {w: width_csr(dg, w, self.strategy, dinv) for w in list(self._csr)}
        return {"dinv": dinv, "csr": csr}

    def rebase(self, graph: CSRGraph, dg: DeviceGraph | None, stale: np.ndarray,
               prepared: dict[str, Any] | None = None) -> int:
        """Serve ``graph`` (an update of the one held: same nodes plus new ones) with ``dg`` (its upload,
        ``None`` when only features changed), recomputing the first-layer rows of ``stale`` (and of every
        new node) at every width held; returns the rows recomputed. ``prepared``: :meth:`prepare`'s result
        for ``graph`` and ``dg`` (else computed here, under the lock). Under :attr:`lock`, with the epoch
        bumped: a table a background build made from the state before is brought up to this one."""
        with self.lock:
            self._epoch += 1
            return self._rebase(graph, dg, stale, prepared or {})

    def _rebase(self, graph: CSRGraph, dg: DeviceGraph | None, stale: np.ndarray, prepared: dict[str, Any]) -> int:
        n_old = self.num_nodes
        if dg is not None:
            self._install(graph, dg, prepared.get("dinv"))
        stale = np.asarray(stale, dtype=np.int64)
        if graph.num_nodes > n_old:
            stale = np.union1d(stale, np.arange(n_old, graph.num_nodes, dtype=np.int64))
        if self._tracking:  # a build runs: it recomputes these rows in its table too before installing it
            self._pending_stale.append(stale)
        done = 0
        with torch.inference_mode():  # the tables are inference tensors: written in that mode only
            p = self.projections() if self._tables else None
            if dg is not None:  # every width's kept edges on the new graph (prepared, or O(E) here)
                ready = prepared.get("csr", {})
                for width in list(self._csr):
                    c = ready.get(width)
                    self._csr[width] = c if c is not None else width_csr(self.dg, width, self.strategy, self.dinv)
            for width, table in list(self._tables.items()):
                refreshed = self._refreshed(table, width, stale, p)
                if refreshed is not table:  # grown: a captured graph read the old tensor
                    self._tables[width] = refreshed
                    self.generation += 1
                done += len(stale)
        return done

    def _refreshed(self, table: torch.Tensor, width: int, stale: np.ndarray, p: torch.Tensor,
                   csr: WidthCSR | None = None) -> torch.Tensor:
        """``table`` (first-layer rows at ``width``) grown to the graph's node count if it is shorter (a new
        tensor; the new nodes' rows are among ``stale``), with the rows of ``stale`` recomputed from ``p``
        (the complete projection table) and ``csr`` (default: the width's held kept edges)."""
        if table.shape[0] < self.num_nodes:
            grown = torch.empty((self.num_nodes, self.hidden), dtype=table.dtype, device=table.device)
            grown[: table.shape[0]] = table
            table = grown
        for lo in range(0, len(stale), REFRESH_ROWS):
            part = stale[lo: lo + REFRESH_ROWS]
            table[torch.from_numpy(part).to(self.device)] = self.first_layer_rows(part, width, p, csr)
        return table

    # ------------------------------------------------------------------ the layers
    def first_layer_rows(self, rows: np.ndarray, width: int, p: torch.Tensor | None = None,
                         csr: WidthCSR | None = None, dinv: torch.Tensor | None = None) -> torch.Tensor:
        """``relu(layer 1)`` of ``rows`` at ``width`` from the width's kept edges (the rows an update changed);
        ``p``: the complete projection table, when the caller has it (fetched here otherwise); ``csr`` and
        ``dinv``: the kept edges and GCN degrees to use (default: the width's held ones and the graph's)."""
        with torch.inference_mode():
            p = self.projections() if p is None else p
            r = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(self.device)
            s = self._slots(r, rows, width, csr)
            if self.gcn:
                h = self._gcn(s, r, p, dinv) + self._b1
            else:
                o = self.hidden
                h = p.index_select(0, r)[:, :o] + slot_sum(s, p[:, o:], r.numel()) + self._b1
            return torch.relu_(h)

    def _slots(self, rows: torch.Tensor, rows_host: np.ndarray | None, width: int,
               csr: WidthCSR | None = None) -> Slots:
        c = self._csr[width] if csr is None else csr
        if width and width <= PAD_MAX:
            return padded_slots(c, rows, width)
        if rows_host is None:
            raise ValueError("packed slots need the host's copy of the row ids")
        return packed_slots(c, rows, rows_host)

    def _gcn(self, s: Slots, rows: torch.Tensor, x: torch.Tensor, dinv: torch.Tensor | None = None) -> torch.Tensor:
        """``g_t^2 x_t + sum_q coef_q x_{j_q}`` for the rows (before the transform; ``coef = w s_t g_t g_j``)."""
        dinv = self.dinv if dinv is None else dinv
        assert dinv is not None
        gt = dinv.index_select(0, rows)
        return (gt * gt).unsqueeze(1) * x.index_select(0, rows) + slot_sum(s, x, rows.numel())

    def forward(self, rows: torch.Tensor, rows_host: np.ndarray | None, width: int,
                want_emb: bool) -> tuple[torch.Tensor, ...]:
        """Device tensors ``(probs [B, C], labels [B], kept [B] or empty, emb [B, H] or empty)`` of the
        targets ``rows`` at ``width`` (which :meth:`has_table`). ``kept`` is given at sampled widths
        only (the exact width's counts are the host's)."""
        h = self._tables[width]
        s = self._slots(rows, rows_host, width)
        b = rows.numel()
        if self.gcn:
            z = product(self._gcn(s, rows, h), self._w[0])
        else:
            z = product(h.index_select(0, rows), self._w[0]) + product(slot_sum(s, h, b), self._w[1])
        probs = torch.softmax(z + self._b, dim=1)
        labels = probs.argmax(dim=1)
        kept2 = self._csr[width].kept2
        kept = kept2.index_select(0, rows) if kept2 is not None else labels[:0]
        emb = h.index_select(0, rows) if want_emb else probs[:0]
        return probs, labels, kept, emb

    # ------------------------------------------------------------------ one batch, host to host
    def answer(self, targets: np.ndarray, width: int, want_emb: bool) -> tuple[np.ndarray, ...]:
        """NumPy ``(probs, labels, kept or None, emb or None)`` of ``targets`` (distinct global ids): with the
        fused last layer (:attr:`head`), one launch and one wait; otherwise one upload of the ids, the batch
        on the device (:meth:`forward`, the fused kernel's specification), one packed copy back and one wait."""
        with self.held(), torch.inference_mode():
            self.batches += 1
            self.targets += len(targets)
            if self.head is not None:  # one launch, the answers in mapped host memory
                try:
                    flat = self.head.answer(targets, width, want_emb)
                    return self.unpack_host(flat, len(targets), width, want_emb)
                except Exception as exc:  # the newest code: the torch operators (its specification) serve now
                    self.head = None
                    _fused_failed(exc, "resident path: the fused last layer")
            rows = self.upload_ids(targets)
            out = self.forward(rows, targets, width, want_emb)
            return self.download(out, len(targets), width, want_emb)

    def download(self, out: tuple[torch.Tensor, ...], b: int, width: int, want_emb: bool) -> tuple[np.ndarray, ...]:
        """The outputs of :meth:`forward` (its ``b`` first rows) on the host: one packed copy."""
        return self.unpack_host(self.fetch(self.pack(out, b, width, want_emb)), b, width, want_emb)

    def pack(self, out: tuple[torch.Tensor, ...], b: int, width: int, want_emb: bool) -> torch.Tensor:
        """The ``b`` first rows of :meth:`forward`'s outputs as one float32 device tensor."""
        probs, labels, kept, emb = out
        parts = [probs[:b].reshape(-1), labels[:b].float()]
        if width:
            parts.append(kept[:b].double().view(torch.float32))  # int64 counts, carried bit for bit
        if want_emb:
            parts.append(emb[:b].reshape(-1))
        return torch.cat(parts)

    def unpack_host(self, flat: np.ndarray, b: int, width: int,
                    want_emb: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Split :meth:`pack`'s buffer (``b`` rows) into ``(probs, labels, kept or None, emb or None)``."""
        classes, hidden = self.num_classes, self.hidden
        pos = b * classes
        probs = flat[:pos].reshape(b, classes)
        labels = flat[pos: pos + b].astype(np.int64)
        pos += b
        kept = None
        if width:
            kept = np.rint(flat[pos: pos + 2 * b].view(np.float64)).astype(np.int64)
            pos += 2 * b
        emb = flat[pos: pos + b * hidden].reshape(b, hidden) if want_emb else None
        return probs, labels, kept, emb


class ResidentShadow(_OnDevice):
    r"""A shaDow-GNN (GCN or GraphSAGE backbone), its PPR lists, induced table and projections on one device.

    A batch of ``B`` targets at PPR budget ``K'`` and width ``S`` runs as dense ``[B, K', K']`` blocks, one
    per target (a subgraph has at most ``K'`` rows, 32 to 64 in practice, so a block is a small dense
    matrix and every layer one batched matrix product):

    * rows: the first ``c_b = min(|L_b|, K')`` entries of the target's list (the target first), the rest
      masked; inputs ``P`` gathered at them;
    * edges: the target's stored pairs of the induced table (row-major, columns ascending, so a row's
      pairs inside the prefix are a prefix of its stored pairs, :class:`kernels.subgraph.InducedTable`),
      padded to the table's longest run and masked to ``i, j < c_b``; row ``i`` keeps its
      :func:`kernels.spmm.sample_positions` at ``S`` (all of them at the exact width);
    * ``gcn``: block :math:`\hat A = \mathrm{diag}(g^2) + (s_i w_{ij} g_i g_j)` over the kept edges with the
      subgraph's own degrees :math:`g = (1 + \sum_j w_{ij})^{-1/2}`; ``sage``: :math:`(w_{ij} / k_i)` and the
      root term; ReLU after every layer; readout (target row, mean and / or max over the ``c_b`` rows),
      classifier, softmax, arg-max, and the edge counts of ``SubgraphBatch.edge_counts`` times the layers.

    Static shapes throughout (``[B, K']``, ``[B, E_max]``, ``[B, K', S]``): no host synchronisation. The
    lists and table are the ones the index had when this was built: a batch is accepted only for targets
    the live index has not marked dirty (their lists and subgraphs are unchanged since), and a rebuilt
    table (``ensure_induced``) is uploaded again on the next batch. Features follow :meth:`rebase`.
    """

    def __init__(self, model: Any, index: Any, projections: Any, *, strategy: str,
                 fused: bool | None = None) -> None:
        if getattr(model, "extractor", None) != "ppr" or model.backbone not in ("gcn", "sage"):
            raise ValueError("ResidentShadow serves shaDow-GNN models")
        self.model = model
        self.gcn = model.backbone == "gcn"
        self._init_device_state(next(model.parameters()).device)
        self.index = index
        self.projections = projections
        self.strategy = strategy
        self.layers = len(model.convs)
        self.hidden = int(model.hidden)
        self.num_classes = int(model.num_classes)
        self.pools = list(model.pools)
        self.dirty_batches = 0
        self.uploads = 0
        self.table: Any = None
        self._p = projections()
        self._upload()
        #: the whole batch in one kernel launch (kernels.shadow_block) on a GPU; None: the torch operators.
        #: ``fused`` (RuntimeOptions.fused_shadow) None: as kernels.shadow_block.DEFAULT_ON says; True:
        #: required (a RuntimeError says why it cannot run)
        from . import shadow_block

        self.block: Any = None
        if fused or (fused is None and self.device.type == "cuda" and shadow_block.DEFAULT_ON):
            self.block = shadow_block.create(self, required=bool(fused))

    def _upload(self) -> None:
        table = self.index.induced
        if table is None:
            raise ValueError("the PPR index has no induced table (--induced-table-bytes)")
        dev = self.device
        ptr = np.asarray(self.index.ptr, dtype=np.int64)[: table.num_nodes + 1]
        self.lptr = _to_device(ptr, dev)
        self.lnodes = _to_device(np.asarray(self.index.nodes[: int(ptr[-1])], dtype=np.int64), dev)
        self.eptr = _to_device(np.asarray(table.eptr, dtype=np.int64), dev)
        m = max(len(table.src), 1)
        src = np.zeros(m, np.int32)
        dst = np.zeros(m, np.int32)
        src[: len(table.src)] = table.src
        dst[: len(table.dst)] = table.dst
        self.src, self.dst = _to_device(src, dev), _to_device(dst, dev)
        self.weights = None
        if table.weights is not None:
            w = np.zeros(m, np.float32)
            w[: len(table.weights)] = table.weights
            self.weights = _to_device(w, dev)
        self.e_max = int(np.diff(table.eptr).max()) if table.num_nodes else 0
        self.k = int(table.k)
        self.num_nodes = int(table.num_nodes)
        self.table = table
        self.uploads += 1
        self.generation += 1

    def stats(self) -> dict[str, float]:
        """A per-node cache's statistics (serve.metrics): targets answered here (``hits``), batches left to
        the other paths because a target was dirty (``misses``), nodes whose lists are held, device bytes;
        and batches, uploads, the table's ``k``."""
        return {"hits": self.targets, "misses": self.dirty_batches, "rows": self.num_nodes, "bytes": self.nbytes(),
                "batches": self.batches, "uploads": self.uploads, "k": self.k}

    def nbytes(self) -> int:
        block = self.block  # read once: a failed launch sets it to None under the lock, stats read without
        return (_nbytes(self.lptr, self.lnodes, self.eptr, self.src, self.dst, self.weights)
                + (block.nbytes() if block is not None else 0))

    def takes(self, targets: np.ndarray, budget: int) -> bool:
        """Whether this answers a batch of ``targets`` at ``budget``: the budget within the table's ``k``,
        every target a node of the table and not dirty in a live index."""
        if self.index.induced is not self.table:
            if self.index.induced is None:
                return False
            with self.held():  # a path's choice, on the loop for an inline batch: never waits there
                if self.index.induced is not self.table:
                    if _not_waiting():  # nor uploads the new table there: the worker does
                        raise DeviceBusy(f"resident {type(self).__name__}: a new induced table to upload first")
                    self._upload()
        if not 1 <= budget <= self.k or not len(targets) or int(targets.max()) >= self.num_nodes:
            return False
        dirty = getattr(self.index, "is_dirty", None)
        if dirty is not None and bool(dirty(targets).any()):
            self.dirty_batches += 1
            return False
        return True

    def rebase(self) -> None:
        """Features changed (or nodes were added): refresh the projection rows the update dropped."""
        p = self.projections()
        if p.data_ptr() != self._p.data_ptr() or p.shape != self._p.shape:
            self.generation += 1
        self._p = p

    def forward(self, rows: torch.Tensor, width: int, budget: int, want_emb: bool) -> tuple[torch.Tensor, ...]:
        """Device tensors ``(probs [B, C], labels [B], kept [B], total [B], emb [B, E] or empty)``."""
        dev = rows.device
        b, kk = rows.numel(), int(budget)
        ar_k = torch.arange(kk, device=dev)
        lo = self.lptr.index_select(0, rows)
        cnt = (self.lptr.index_select(0, rows + 1) - lo).clamp(max=kk)  # rows of each subgraph
        nmask = ar_k.unsqueeze(0) < cnt.unsqueeze(1)  # [B, K']
        nodes = self.lnodes.index_select(0, torch.where(nmask, lo.unsqueeze(1) + ar_k, 0).reshape(-1))
        # the stored pairs, padded to the longest run; those inside the prefix kept
        e_max = max(self.e_max, 1)
        ar_e = torch.arange(e_max, device=dev)
        e0 = self.eptr.index_select(0, rows)
        pvalid = ar_e.unsqueeze(0) < (self.eptr.index_select(0, rows + 1) - e0).unsqueeze(1)
        pair = torch.where(pvalid, e0.unsqueeze(1) + ar_e, 0).reshape(-1)
        src = self.src.index_select(0, pair).view(b, e_max).long()
        dst = self.dst.index_select(0, pair).view(b, e_max).long()
        inside = pvalid & (src < cnt.unsqueeze(1)) & (dst < cnt.unsqueeze(1))
        w_all = (self.weights.index_select(0, pair).view(b, e_max) if self.weights is not None
                 else torch.ones(b, e_max, device=dev))
        # per row of each block: stored pairs (for the row starts), pairs inside, their weight sum
        row_key = (torch.arange(b, device=dev).unsqueeze(1) * kk + src.clamp(max=kk - 1)).reshape(-1)
        stored = torch.zeros(b * kk, dtype=torch.int64, device=dev).index_add_(
            0, row_key, (pvalid & (src < kk)).reshape(-1).long())
        start = (torch.cumsum(stored.view(b, kk), 1) - stored.view(b, kk))  # first stored pair of each row
        deg = torch.zeros(b * kk, dtype=torch.int64, device=dev).index_add_(0, row_key, inside.reshape(-1).long())
        deg = deg.view(b, kk)
        # kept slots of each row: S per row at a sampled width, every pair inside at the exact one
        sw = width if width else kk
        ks = deg.clamp(max=sw)
        t = torch.arange(sw, device=dev).expand(b, kk, sw)
        svalid = t < ks.unsqueeze(2)
        pos = sample_positions(deg.unsqueeze(2).expand(b, kk, sw), t, width, self.strategy) if width else t
        slot = torch.where(svalid, (e0.view(b, 1, 1) + start.unsqueeze(2) + pos), 0).reshape(-1)
        col = self.dst.index_select(0, slot).view(b, kk, sw).long().clamp(max=kk - 1)
        w = (self.weights.index_select(0, slot).view(b, kk, sw) if self.weights is not None
             else torch.ones(b, kk, sw, device=dev)) * svalid
        kf = ks.clamp(min=1).float()
        if self.gcn:
            wsum = torch.zeros(b * kk, device=dev).index_add_(0, row_key, (w_all * inside).reshape(-1))
            g = (wsum.view(b, kk) + 1.0).rsqrt() * nmask
            gcol = torch.gather(g, 1, col.view(b, -1)).view(b, kk, sw)
            coef = w * ((deg.float() / kf) * g).unsqueeze(2) * gcol
        else:
            coef = w / kf.unsqueeze(2)
        flat = (torch.arange(kk, device=dev).view(1, kk, 1) * kk + col).view(b, -1)  # (row, column) in a block
        adj = torch.zeros(b, kk * kk, device=dev).scatter_add_(1, flat, coef.view(b, -1)).view(b, kk, kk)
        if self.gcn:
            adj = adj + torch.diag_embed(g * g)
        # rows past a subgraph's end are 0, not node 0's row masked later: a NaN there would survive the mask
        h = self._p.index_select(0, nodes).view(b, kk, -1).masked_fill_(~nmask.unsqueeze(2), 0.0)
        for i, conv in enumerate(self.model.convs):
            tr = h if i == 0 else linear(h.reshape(b * kk, -1), conv.transform_matrix()).view(b, kk, -1)
            if self.gcn:
                h = torch.bmm(adj, tr)
            else:
                o = conv.out_channels
                h = tr[..., :o] + torch.bmm(adj, tr[..., o:])
            if conv.bias is not None:
                h = h + conv.bias
            h = torch.relu(h) * nmask.unsqueeze(2)  # padded rows stay 0 (every valid row is >= 0 after ReLU)
        parts = [h[:, 0]]
        for kind in self.pools:
            parts.append(h.sum(1) / cnt.clamp(min=1).unsqueeze(1).float() if kind == "mean" else h.amax(1))
        r = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        cls = self.model.classifier
        logits = linear(r, cls.weight)
        probs = torch.softmax(logits + cls.bias if cls.bias is not None else logits, dim=1)
        labels = probs.argmax(dim=1)
        kept = ks.sum(1) * self.layers
        total = deg.sum(1) * self.layers
        return probs, labels, kept, total, (r if want_emb else probs[:0])

    def answer(self, targets: np.ndarray, width: int, budget: int, want_emb: bool) -> tuple[np.ndarray, ...]:
        """NumPy ``(probs, labels, kept, total, emb or None)`` of ``targets`` (which :meth:`takes`)."""
        with self.held(), torch.inference_mode():
            self.batches += 1
            self.targets += len(targets)
            if self.block is not None and self.block.fits(width, budget):  # one launch, answers in mapped memory
                try:
                    return self.unpack_host(self.block.answer(targets, width, budget, want_emb), len(targets),
                                            want_emb)
                except Exception as exc:  # the newest code: the torch operators (its specification) serve now
                    self.block = None
                    _fused_failed(exc, "resident shaDow path: the one-launch kernel")
            rows = self.upload_ids(targets)
            return self.download(self.forward(rows, width, budget, want_emb), len(targets), want_emb)

    def download(self, out: tuple[torch.Tensor, ...], b: int, want_emb: bool) -> tuple[np.ndarray, ...]:
        """The outputs of :meth:`forward` (its ``b`` first rows) on the host: one packed copy."""
        return self.unpack_host(self.fetch(self.pack(out, b, want_emb)), b, want_emb)

    def pack(self, out: tuple[torch.Tensor, ...], b: int, want_emb: bool) -> torch.Tensor:
        """The ``b`` first rows of :meth:`forward`'s outputs as one float32 device tensor."""
        probs, labels, kept, total, emb = out
        return torch.cat([probs[:b].reshape(-1), labels[:b].float(), kept[:b].double().view(torch.float32),
                          total[:b].double().view(torch.float32), emb[:b].reshape(-1)])

    def unpack_host(self, flat: np.ndarray, b: int, want_emb: bool) -> tuple[np.ndarray, ...]:
        c = self.num_classes
        pos = b * c
        out_p = flat[:pos].reshape(b, c)
        out_l = flat[pos: pos + b].astype(np.int64)
        pos += b
        out_k = np.rint(flat[pos: pos + 2 * b].view(np.float64)).astype(np.int64)
        pos += 2 * b
        out_t = np.rint(flat[pos: pos + 2 * b].view(np.float64)).astype(np.int64)
        pos += 2 * b
        out_e = flat[pos:].reshape(b, -1) if want_emb else None
        return out_p, out_l, out_k, out_t, out_e


#: One CUDA graph capture at a time in the process (torch's documented restriction: ``torch.cuda.graph``
#: synchronises the device on entry and captures on one process-wide stream, so a second capture begun
#: on another thread, by another model or a version warming beside the one serving, would fail both
#: batches and switch the resident path off). Taken inside a resident model's own lock.
_CAPTURE_LOCK = threading.Lock()
#: captured graphs kept per model (least recently replayed dropped first): each holds its own device memory
#: pool, and the widths and budgets come from requests
MAX_GRAPHS = 48
#: a (bucket, width, budget, embeddings) key is captured on its this-many-th batch; the ones before take the
#: resident forward uncaptured (:meth:`CapturedForward.served` counts them), so one-off settings do not each pay
#: a capture and a pool
CAPTURE_AFTER = 2


class CapturedForward:
    """A resident model's ``forward`` captured in one CUDA graph per (batch bucket, width, PPR budget,
    embeddings): a batch copies its ids into the bucket's static input (padded with its first id) and
    replays. Captured graphs read the resident tensors in place, so they are dropped whenever one is
    replaced (the model's ``generation``). A plain model: sampled widths up to :data:`PAD_MAX` (the
    exact width's slot count depends on the batch); a shaDow model: every width (its shapes depend on
    the budget only).

    CUDA only, except with ``emulate=True`` on a CPU (tests): a "graph" then runs the forward again on
    its static input and copies the results into its static outputs, so the bucketing, padding,
    slicing and invalidation around the capture are exercised without a GPU."""

    def __init__(self, resident: ResidentPlain | ResidentShadow, max_bucket: int = 1024, *,
                 emulate: bool = False) -> None:
        if resident.device.type != "cuda" and not emulate:
            raise ValueError("CUDA graphs need a CUDA device")
        self.emulate = resident.device.type != "cuda"
        self.r = resident
        self.shadow = isinstance(resident, ResidentShadow)
        self.max_bucket = int(max_bucket)
        self._graphs: collections.OrderedDict[tuple[int, int, int, bool], tuple[Any, torch.Tensor, torch.Tensor]] = (
            collections.OrderedDict())
        self._seen: collections.Counter[tuple[int, int, int, bool]] = collections.Counter()
        self._generation = resident.generation
        self.captures = 0
        self.replays = 0
        self.evictions = 0

    def accepts(self, targets: int, width: int) -> bool:
        return 0 < targets <= self.max_bucket and (self.shadow or 0 < width <= PAD_MAX)

    def _key(self, targets: int, width: int, budget: int, want_emb: bool) -> tuple[int, int, int, bool]:
        return bucket_of(targets), int(width), int(budget) if self.shadow else 0, bool(want_emb)

    def wants(self, targets: int, width: int, budget: int = 0, want_emb: bool = False) -> bool:
        """Whether this batch should replay a graph: :meth:`accepts` it, and its key is captured or
        :data:`CAPTURE_AFTER` - 1 batches of it were :meth:`served` uncaptured (the serving paths ask this;
        :meth:`answer` captures on demand). Asking counts nothing: a batch deferred from the event loop to the
        worker asks twice."""
        if not self.accepts(targets, width):
            return False
        key = self._key(targets, width, budget, want_emb)
        return key in self._graphs or self._seen[key] + 1 >= CAPTURE_AFTER

    def served(self, targets: int, width: int, budget: int = 0, want_emb: bool = False) -> None:
        """Count a batch of this key that the resident model answered uncaptured (after it did: a batch that
        raised, :class:`DeviceBusy` on the event loop included, was not served and is not counted)."""
        if not self.accepts(targets, width):
            return
        if len(self._seen) > 64 * MAX_GRAPHS:  # bounded: requests choose the keys
            self._seen.clear()
        # not under the model's lock: the loop's and the worker's batches can race here and lose a count, which
        # only captures that key a batch later
        self._seen[self._key(targets, width, budget, want_emb)] += 1

    def _forward(self, rows: torch.Tensor, width: int, budget: int, want_emb: bool) -> torch.Tensor:
        """The forward and the packing of its outputs for a whole bucket (what a graph captures)."""
        b = rows.numel()
        if self.shadow:
            out = self.r.forward(rows, width, budget, want_emb)  # type: ignore[call-arg]
            return self.r.pack(out, b, want_emb)  # type: ignore[call-arg]
        out = self.r.forward(rows, None, width, want_emb)  # type: ignore[call-arg]
        return self.r.pack(out, b, width, want_emb)  # type: ignore[call-arg]

    def answer(self, targets: np.ndarray, width: int, want_emb: bool, budget: int = 0) -> tuple[np.ndarray, ...]:
        r = self.r
        with r.held():
            return self._answer(targets, width, want_emb, budget)

    def _answer(self, targets: np.ndarray, width: int, want_emb: bool, budget: int) -> tuple[np.ndarray, ...]:
        r = self.r
        b = len(targets)
        key = self._key(b, width, budget, want_emb)
        if _not_waiting() and (r.generation != self._generation or key not in self._graphs):
            # a capture (two warm-up forwards, a synchronisation, the process-wide capture lock) is no work for
            # the event loop: the worker captures, and this key replays on the loop from then on
            raise DeviceBusy(f"resident {type(r).__name__}: a CUDA graph to capture first")
        if r.generation != self._generation:
            self._graphs.clear()
            self._generation = r.generation
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(*key)
            self._graphs[key] = entry
            while len(self._graphs) > MAX_GRAPHS:  # its pool goes with the graph
                self._graphs.popitem(last=False)
                self.evictions += 1
        else:
            self._graphs.move_to_end(key)
        graph, static_in, static_out = entry
        r.batches += 1
        r.targets += b
        bucket = static_in.numel()
        with torch.inference_mode():
            # per batch: one upload of the padded ids, one replay, one copy back (the packing is captured)
            static_in.copy_(r.stage_ids(targets, bucket), non_blocking=True)
            graph.replay()
            self.replays += 1
            flat = r.fetch(static_out)
            if self.emulate:  # on a CPU that is a view of the static output, which the next replay overwrites
                flat = flat.copy()
        if self.shadow:
            full = r.unpack_host(flat, bucket, want_emb)  # type: ignore[call-arg]
        else:
            full = r.unpack_host(flat, bucket, width, want_emb)  # type: ignore[call-arg]
        return tuple(None if part is None else part[:b] for part in full)

    def _capture(self, bucket: int, width: int, budget: int, want_emb: bool) -> tuple[Any, torch.Tensor, torch.Tensor]:
        r = self.r
        static_in = torch.zeros(bucket, dtype=torch.int64, device=r.device)
        if self.emulate:
            self.captures += 1
            with torch.inference_mode():
                host = _HostGraph(lambda: self._forward(static_in, width, budget, want_emb))
                host.output = host.run().clone()
            return host, static_in, host.output
        with torch.inference_mode(), _CAPTURE_LOCK:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up runs outside the capture (lazy allocations, cuBLAS handles)
                for _ in range(2):
                    self._forward(static_in, width, budget, want_emb)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: other threads go on allocating and copying while this one captures (an update's
            # prepare phase uploads the new CSR while batches run); the default, global, would fail them
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                static_out = self._forward(static_in, width, budget, want_emb)
        self.captures += 1
        log.info("resident path: captured a CUDA graph for %d targets at width %d%s", bucket, width,
                 f", budget {budget}" if self.shadow else "")
        return graph, static_in, static_out


class _HostGraph:
    """:class:`CapturedForward`'s stand-in for a CUDA graph on a CPU: ``replay`` recomputes into the output."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.output = torch.empty(0)

    def replay(self) -> None:
        self.output.copy_(self.run())
