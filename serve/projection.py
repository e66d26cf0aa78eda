"""Per-node caches: first-layer projections in front of a feature store, and a plain model's
activations before its last layer.

A model's first layer applies its weights to each node's own features before (GCN) or beside
(GraphSAGE) aggregation, so ``project(x_i)`` can be computed once per node and reused by every
request whose subgraph contains node ``i``: exact, and it removes most of the arithmetic and
most feature fetches per request. The cache is a dense ``[N, P]`` table filled on demand
(a bitmap says which rows are valid) when it fits the byte budget; otherwise every batch fetches
and projects its nodes afresh.

The same holds one layer further for a plain (GCN / GraphSAGE) model: the rows layer ``L - 1``
computes for node ``i`` at sampling width ``S`` depend on ``i`` and ``S`` only (its kept edges are
the graph row's sampled positions, not the batch's), so :class:`ActivationCache` keeps them per
width and a request runs the last layer alone on a one-layer plan: at ``S = 32`` a 2-layer GCN reads
33 cached rows per target instead of projecting and aggregating about a thousand.

Thread safety: one batch runs at a time per model, but several model versions can share a
feature store; the table itself belongs to one model version, so no lock is needed beyond the
runtime's single worker per model.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from kernels.fused_forward import AGG_GCN, StackParams, plan_inner_cpu
from kernels.graph import CSRGraph
from kernels.plan import execution_plan, local_plan
from kernels.resident import WidthBudget

__all__ = ["ActivationCache", "FeatureSource", "ProjectionCache"]

log = logging.getLogger(__name__)


class FeatureSource(Protocol):
    def get(self, node_ids: np.ndarray) -> np.ndarray: ...


class ProjectionCache:
    """``get(ids) -> torch.Tensor [len(ids), P]`` = ``project(features.get(ids))``, cached per node.

    Args:
        project: the model's own-feature map, float32 ``[n, F] -> [n, P]`` (torch, no grad).
        features: the feature store (raw features).
        num_nodes: N.
        dim: P.
        budget_bytes: the table is kept only if ``N * P * 4`` fits; 0 disables caching.
        device: where projections live (the model's device).
    """

    def __init__(
        self,
        project: Callable[[torch.Tensor], torch.Tensor],
        features: FeatureSource,
        num_nodes: int,
        dim: int,
        *,
        budget_bytes: int = 2 << 30,
        device: torch.device | str = "cpu",
    ) -> None:
        self._project = project
        self.features = features
        self.num_nodes = num_nodes
        self.dim = dim
        self.device = torch.device(device)
        self.enabled = budget_bytes > 0 and num_nodes * dim * 4 <= budget_bytes
        self._table = torch.empty((num_nodes, dim), dtype=torch.float32, device=self.device) if self.enabled else None
        self._valid = np.zeros(num_nodes, dtype=bool) if self.enabled else None
        self.hits = 0
        self.misses = 0
        self.fetch_seconds = 0.0
        if not self.enabled:
            log.info("projection cache off: %d x %d floats exceed the %d-byte budget", num_nodes, dim, budget_bytes)

    def project_raw(self, x: np.ndarray) -> torch.Tensor:
        with torch.inference_mode():
            return self._project(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device))

    def get(self, node_ids: np.ndarray) -> torch.Tensor:
        """Projections of ``node_ids`` (distinct ids expected: callers dedupe per batch)."""
        ids = np.asarray(node_ids, dtype=np.int64)
        if not self.enabled:
            t0 = time.perf_counter()
            raw = self.features.get(ids)
            self.fetch_seconds += time.perf_counter() - t0
            self.misses += len(ids)
            return self.project_raw(raw)
        table = self._fill(ids)
        return table.index_select(0, torch.from_numpy(ids).to(self.device))  # 4x to 8x faster than [ids] on CPU

    def table_for(self, node_ids: np.ndarray) -> torch.Tensor | None:
        """The whole ``[N, P]`` table with every row of ``node_ids`` valid (projected first where
        missing), for kernels that read rows in place; ``None`` when the cache is off."""
        if not self.enabled:
            return None
        return self._fill(np.asarray(node_ids, dtype=np.int64))

    def _fill(self, ids: np.ndarray) -> torch.Tensor:
        assert self._table is not None and self._valid is not None
        missing = ids[~self._valid[ids]]
        self.hits += len(ids) - len(missing)
        if len(missing):
            self.misses += len(missing)
            t0 = time.perf_counter()
            raw = self.features.get(missing)
            self.fetch_seconds += time.perf_counter() - t0
            self._table[torch.from_numpy(missing).to(self.device)] = self.project_raw(raw)
            self._valid[missing] = True
        return self._table

    def complete_table(self, chunk: int = 65536) -> torch.Tensor:
        """The whole ``[N, P]`` table with every row valid (the missing ones projected first, ``chunk`` at a
        time), for a model that reads every row in place (:mod:`kernels.resident`); the cache must be on."""
        if self._table is None or self._valid is None:
            raise RuntimeError("the projection cache is off (its table exceeds the budget)")
        missing = np.flatnonzero(~self._valid[: self.num_nodes])
        for start in range(0, len(missing), chunk):
            self._fill(missing[start: start + chunk])
        return self._table[: self.num_nodes]

    def warm(self, node_ids: np.ndarray | None = None, chunk: int = 65536) -> int:
        """Fill the table (all nodes by default) in chunks; returns rows filled."""
        if not self.enabled:
            return 0
        ids = np.arange(self.num_nodes) if node_ids is None else np.asarray(node_ids, dtype=np.int64)
        for start in range(0, len(ids), chunk):
            self.get(ids[start : start + chunk])
        return len(ids)

    def invalidate(self) -> None:
        if self._valid is not None:
            self._valid[:] = False

    def invalidate_rows(self, node_ids: np.ndarray) -> int:
        """Drop the rows of ``node_ids`` (their features changed); returns the rows that were held."""
        if self._valid is None or not len(node_ids):
            return 0
        held = int(np.count_nonzero(self._valid[node_ids]))
        self._valid[node_ids] = False
        return held

    def grow(self, num_nodes: int) -> None:
        """Room for ``num_nodes`` nodes (new nodes of a live graph; their rows start empty). The table
        keeps spare rows so that a stream of single new nodes does not copy it each time."""
        if num_nodes <= self.num_nodes:
            return
        if self._table is not None and self._valid is not None and num_nodes > len(self._valid):
            cap = max(num_nodes, len(self._valid) + len(self._valid) // 8 + 64)
            table = torch.empty((cap, self.dim), dtype=torch.float32, device=self.device)
            table[: self.num_nodes] = self._table[: self.num_nodes]
            valid = np.zeros(cap, dtype=bool)
            valid[: self.num_nodes] = self._valid[: self.num_nodes]
            self._table, self._valid = table, valid
        self.num_nodes = num_nodes

    def stats(self) -> dict[str, float]:
        """Lookups by outcome, rows held, table bytes, raw-feature fetch time."""
        total = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_ratio": self.hits / total if total else 0.0,
            "fetch_seconds": self.fetch_seconds,
            "enabled": float(self.enabled),
            "rows": int(np.count_nonzero(self._valid)) if self._valid is not None else 0,
            "bytes": self.num_nodes * self.dim * 4 if self.enabled else 0,
        }


class ActivationCache:
    """A plain model's ReLU'd layer ``L - 1`` rows per node, one ``[N, H]`` table per sampling width.

    ``table_for(ids, width)`` returns the width's table with the rows of ``ids`` valid, computing
    the missing ones (:func:`kernels.fused_forward.plan_inner_cpu` on an ``L - 1``-layer plan of
    them, from ``projections``); :func:`kernels.fused_forward.plan_outer_cpu` then runs the last
    layer. Tables are allocated on first use of a width while their total fits ``budget_bytes``;
    for a width that does not fit :meth:`has_table` is false (the caller runs the whole plan).
    On a live graph (:mod:`serve.live`) :meth:`rebase` moves it to the updated graph, dropping the rows
    the update changed.
    :meth:`stats` may be called from another thread (a metrics scrape).

    On a stateless replica ``graph`` is a :class:`serve.graph.store.RedisGraphStore`: the plan of the
    missing rows is built on the local graph of the rows it expands (``sampled_plan``), its inputs
    gathered at its nodes (projections by global id, :math:`D^{-1/2}` from the store's degrees), and
    :meth:`warm` does nothing (it would read the whole graph from Redis); rows fill as batches ask.

    Args:
        graph: the full graph (local: plans index it), or a stateless replica's graph store.
        params: the model's :class:`~kernels.fused_forward.StackParams` (at least two layers).
        dinv: float32 ``[N]`` ``D^{-1/2}`` of the full graph (GCN) or ``None``.
        projections: the model's CPU :class:`ProjectionCache` (enabled).
        strategy: the model's sampling strategy.
        budget_bytes: bound on all tables together (with their validity bitmaps).
        reserved_width: a width whose table always has room (the model's default width): other
            widths get a table only while one is left for it.
    """

    def __init__(self, graph: CSRGraph, params: StackParams, dinv: np.ndarray | None,
                 projections: ProjectionCache, *, strategy: str, budget_bytes: int,
                 reserved_width: int | None = None) -> None:
        if params.layers < 2:
            raise ValueError("a one-layer model has no layer before its last")
        self.graph = graph
        self.remote = bool(getattr(graph, "is_remote", False))
        self.gcn = int(params.agg) == AGG_GCN
        self.params = params
        self.dinv = dinv
        self.projections = projections
        self.strategy = strategy
        self.layers = params.layers
        self.dim = int(params.dims[-1, 0])
        self.table_bytes = graph.num_nodes * (4 * self.dim + 1)
        self.reserved_width = reserved_width
        # the consequence a refusal logs is set per width before it is asked for (_refusal_advice)
        self._room = WidthBudget(budget_bytes, reserved_width, "activation cache", "its batches run the whole plan")
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._filled: dict[int, int] = {}  # rows held per width
        self._count_lock = threading.Lock()  # _filled exact under --workers threads (they write equal rows)
        self.hits = 0
        self.misses = 0

    def widths(self) -> list[int]:
        """The widths that have a table, ascending."""
        return sorted(list(self._tables))

    def has_table(self, width: int) -> bool:
        """Whether ``width`` has a table, allocating it if the budget has room (:class:`kernels.resident.WidthBudget`:
        room stays for the reserved width; a width refused runs the whole plan)."""
        if width in self._tables:
            return True
        with self._count_lock:  # two --workers threads asking for one new width allocate it once
            if width in self._tables:
                return True
            if width not in self._room.refused:  # a refusal is logged once per width, with this advice
                self._room.consequence = self._refusal_advice(width)
            if not self._room.admits(width, self._tables, lambda _w: self.table_bytes):
                return False
            cap = self._capacity()
            self._filled[width] = 0
            self._tables[width] = (np.empty((cap, self.dim), dtype=np.float32), np.zeros(cap, dtype=bool))
        return True

    def _capacity(self) -> int:
        return max([self.graph.num_nodes] + [len(v) for _, v in self._tables.values()])

    def budget_to_admit(self, width: int) -> int:
        """The ``--activation-cache-bytes`` that holds ``width``'s table beside the tables held now and the
        reserved width's (room is kept for it: :class:`kernels.resident.WidthBudget`); every table of one
        cache has :attr:`table_bytes`."""
        tables = set(self._tables) | {width}
        if self.reserved_width is not None:
            tables.add(self.reserved_width)
        return len(tables) * self.table_bytes

    def _refusal_advice(self, width: int) -> str:
        """What the log of ``width``'s refusal says to do: the budget that holds it, what that counts, what
        one table takes (a budget of one table's size, the advice this replaced, may be below the one set)."""
        held = len(self._tables)
        beside = [f"the {held} table{'' if held == 1 else 's'} held"] if held else []
        if self.reserved_width not in (None, width, *self._tables):
            beside.append(f"the table kept for the default width {self.reserved_width}")
        return (f"its batches run the whole plan; --activation-cache-bytes {self.budget_to_admit(width)} would hold it"
                + (" beside " + " and ".join(beside) if beside else "")
                + f" (each width's table takes {self.table_bytes} bytes)")  # no braces: WidthBudget formats it

    def rebase(self, graph: CSRGraph, dinv: np.ndarray | None, stale: np.ndarray) -> int:
        """Serve ``graph`` (the updated graph: same nodes plus new ones) from now on, dropping the rows
        of ``stale`` at every width; returns the rows dropped that were held."""
        n = graph.num_nodes
        dropped = 0
        for width, (table, valid) in list(self._tables.items()):
            if n > len(valid):  # spare rows: a stream of single new nodes does not copy every time
                cap = max(n, len(valid) + len(valid) // 8 + 64)
                t2 = np.empty((cap, self.dim), dtype=np.float32)
                t2[: len(valid)] = table
                v2 = np.zeros(cap, dtype=bool)
                v2[: len(valid)] = valid
                table, valid = t2, v2
                self._tables[width] = (table, valid)
            if len(stale):
                held = int(np.count_nonzero(valid[stale]))
                valid[stale] = False
                self._filled[width] -= held
                dropped += held
        self.graph = graph
        self.dinv = dinv
        self.table_bytes = n * (4 * self.dim + 1)
        return dropped

    def complete(self, width: int) -> bool:
        """Whether every node's row of ``width`` is held (then a batch at that width only aggregates
        its targets' last-layer rows)."""
        return self._filled.get(width, -1) == self.graph.num_nodes

    def table_for(self, node_ids: np.ndarray, width: int) -> np.ndarray:
        """The ``[N, H]`` table of ``width`` (which :meth:`has_table`) with the rows of the distinct
        ``node_ids`` valid."""
        table, valid = self._tables[width]
        missing = node_ids[~valid[node_ids]]
        self.hits += len(node_ids) - len(missing)
        if len(missing):
            self.misses += len(missing)
            if self.remote:
                table[missing] = self._remote_rows(missing, width)
            else:
                inner = execution_plan(self.graph, missing, self.layers - 1, width, self.strategy)
                proj = self.projections.table_for(inner.node_ids)
                assert proj is not None, "the activation cache reads an enabled projection cache"
                table[missing] = plan_inner_cpu(inner, self.params, proj.numpy(), self.dinv)
            with self._count_lock:  # --workers threads may have filled some of the same rows meanwhile
                fresh = int(np.count_nonzero(~valid[missing]))  # node_ids are distinct
                valid[missing] = True
                self._filled[width] += fresh
        return table

    def _remote_rows(self, missing: np.ndarray, width: int) -> np.ndarray:
        """The rows of ``missing`` on a stateless replica (class docstring)."""
        inner, _, ids = self.graph.sampled_plan(missing, self.layers - 1, width, self.strategy)
        proj = self.projections.table_for(ids)
        assert proj is not None, "the activation cache reads an enabled projection cache"
        dinv = self.graph.gcn_dinv32(ids) if self.gcn else None
        return plan_inner_cpu(local_plan(inner), self.params, proj.numpy()[ids], dinv)

    def warm(self, width: int, chunk: int = 4096) -> int:
        """Fill the table of ``width`` for every node, ``chunk`` at a time; rows filled (0: no room, or a
        stateless replica's graph, which this would read whole from Redis)."""
        if self.remote or not self.has_table(width):
            return 0
        n = self.graph.num_nodes
        for lo in range(0, n, chunk):
            self.table_for(np.arange(lo, min(n, lo + chunk), dtype=np.int64), width)
        return n

    def stats(self) -> dict[str, float]:
        """Lookups by outcome, widths with a table, rows held (over all widths), table bytes."""
        total = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_ratio": self.hits / total if total else 0.0,
                "widths": len(self._tables),
                # list(): one C call under the GIL, while the serving thread may add a width
                "rows": sum(int(np.count_nonzero(valid)) for _, valid in list(self._tables.values())),
                "bytes": len(self._tables) * self.table_bytes}
