"""Request validation and knob resolution: protobuf in, a typed :class:`PredictCall` out.

Every check raises :class:`~serve.errors.InvalidArgument` with the offending value in the message.
Knobs are resolved here, against the model's :class:`ModelLimits` and knob table:

* ``sampling_width`` S: must be >= 0; 0 = exact; values above the model's maximum
  (``max_sampling_width``, a bound on every row's degree: a width at or above it keeps every edge)
  are clamped to it.
* ``ppr_budget`` K: a shaDow (PPR) model: must be >= 1; clamped to the K the model's top-K index
  holds. An L-hop (plain GCN / GraphSAGE) model has no PPR budget: 0 or absent means none, and is
  what it echoes (``settings.ppr_budget``, KServe's ``ppr_budget`` response parameter), so an answer's
  settings can be sent back as they are; a larger value is accepted and ignored (as a shaDow model
  clamps a K above its maximum); a negative one is refused. KServe's ``ModelConfig`` advertises
  exactly this: ``min`` is the lowest accepted value, ``max`` the largest one served
  (:func:`knob_rule`).
* Both are ``int32`` in ``PredictRequest``; a KServe request parameter above :data:`KNOB_MAX` is
  refused with the same range message (:func:`knob_range_error`).
* ``max_accuracy_loss`` L: finite, in [0, 1]. The server picks the knob-table row with the lowest
  measured latency whose validation accuracy is at least ``exact - L`` (exact = the table's
  exact-width row at the largest budget). An explicit S or K fixes that coordinate, and the loss
  picks the other among the table's rows at that value. A value the table has no rows for (width 5
  in a table of widths 0, 4, 8, ...) is served as asked, and the loss picks the other coordinate
  among the rows of its stand-in, :func:`clients.knob_rules.stand_in`: the largest table value below
  it (width 4: it keeps fewer edges, so its accuracy does not overstate width 5's), else the smallest
  table value. ``chosen_by`` is then ``max_accuracy_loss``, and the expected accuracy 0.0 (no row was
  measured at the served setting). With both S and K fixed the loss is checked against their row (or its
  stand-in's) and ``chosen_by`` is ``request``. A loss no row at the fixed values meets is refused
  (INVALID_ARGUMENT naming the least loss measured there): the bound a client asked for is never dropped
  in silence. The rule is :func:`clients.knob_rules.cheapest_within`, the one the SDK's
  ``ModelInfo.best_knobs`` applies. (A table without an exact-width row has no reference to measure a loss
  against: the loss then picks nothing and the defaults are served, ``chosen_by`` ``default``.)
* nothing given: the model's defaults.

New nodes' ``edge_weights`` (optional, one per neighbour) must be finite and >= 0: the rule of every
edge weight the server takes (``UpdateGraph``'s new nodes and ``add_edges``,
:mod:`kernels.graph_edit`; :meth:`kernels.graph.CSRGraph.from_edge_index`). A weight of 0 is an edge
that contributes nothing to an aggregation; GCN's degree is ``1 + sum of weights``, never 0.

The knob table is read with its widths clamped the same way (:attr:`ModelLimits.served_knob_table`):
a row measured at a width at or above ``max_sampling_width`` ran the computation the clamped width
runs, every node keeping every edge. So a request clamped from S = 64 to 63 (the (K = 8, S = 64) row
of a model whose bound is 63) reports that row's accuracy, and the table's choice for a loss or an
explicit width finds it. The expected accuracy is the validation accuracy of the row at the resolved
``(K, S)``; an exact request (S = 0) and one at the bound are one computation, so either finds the
other's row when its own is missing; 0.0 when the table has no such row.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from clients.knob_rules import cheapest_within, losses, stand_in
from kernels.graph_edit import valid_weights, weight_rule

from .errors import InvalidArgument

__all__ = ["KNOB_MAX", "MAX_REQUEST_ID", "KnobRow", "ModelLimits", "NewNodeSpec", "PredictCall", "check_request_id",
           "knob_range_error", "knob_rule", "resolve_knobs", "validate_predict"]

MAX_NEW_NODE_NEIGHBORS = 100_000
#: the largest ``sampling_width`` / ``ppr_budget`` a request can carry (``int32`` fields of PredictRequest)
KNOB_MAX = 2**31 - 1
#: characters of a request_id (echoed in answers and logs, and kept in the update log for an update)
MAX_REQUEST_ID = 256
#: the largest feature magnitude a request or an update may send: larger values overflow float32 in the first
#: layer's sums (3e38 in one row turned a sixth of a graph's answers NaN; a QA report, 2026-11-27)
MAX_ABS_FEATURE = 1e15


def feature_problem(row: np.ndarray) -> str | None:
    """What is wrong with the float32 feature ``row`` (NaN, infinity, or beyond :data:`MAX_ABS_FEATURE`,
    naming the first such position), or None."""
    bad = ~(np.abs(row) <= MAX_ABS_FEATURE)  # NaN compares false
    if not bad.any():
        return None
    j = int(np.flatnonzero(bad)[0])
    if not np.isfinite(row[j]):
        return f"features must be finite (NaN or infinity at position {j})"
    return f"feature {float(row[j]):g} at position {j} is beyond +-{MAX_ABS_FEATURE:g}"


@dataclass(frozen=True)
class KnobRow:
    ppr_budget: int  # 0 = not applicable
    sampling_width: int  # 0 = exact
    val_accuracy: float
    latency_ms_per_node: float
    edges_kept_fraction: float = 1.0
    #: share of a sample of the graph's nodes whose label at this setting equals the exact reference's (None: a
    #: table measured before 2026-11-29); 1 - agreement is the loss max_accuracy_loss compares (clients.knob_rules)
    agreement: float | None = None


@dataclass(frozen=True)
class ModelLimits:
    """What validation needs to know about one model version."""

    name: str
    num_nodes: int
    num_features: int
    extractor: str  # "ppr" or "lhop"
    max_ppr_budget: int  # 0 for L-hop models
    max_sampling_width: int
    default_sampling_width: int
    default_ppr_budget: int
    max_nodes_per_request: int
    knob_table: tuple[KnobRow, ...] = ()
    max_new_node_edges: int = MAX_NEW_NODE_NEIGHBORS  # neighbours over all new nodes of one request

    def clamp_width(self, s: int) -> int:
        """The width a request for ``s`` runs at: 0 (exact) stays 0, others at most ``max_sampling_width``."""
        return min(s, self.max_sampling_width) if s > 0 else 0

    @cached_property
    def served_knob_table(self) -> tuple[KnobRow, ...]:
        """:attr:`knob_table` with each row's width as a request for it runs (:meth:`clamp_width`): a width
        at or above the degree bound ``max_sampling_width`` keeps every edge of every row, so the row's
        accuracy is that of the clamped width. Computed once per limits (they are rebuilt when a live
        graph's degrees change, and the bound with them)."""
        return tuple(r if self.clamp_width(r.sampling_width) == r.sampling_width
                     else replace(r, sampling_width=self.clamp_width(r.sampling_width)) for r in self.knob_table)


@dataclass
class NewNodeSpec:
    features: np.ndarray  # float32 [F]
    neighbors: np.ndarray  # int64 [d]
    weights: np.ndarray | None  # float32 [d], finite and >= 0, or None (1 each)


@dataclass
class PredictCall:
    """A validated Predict request with its resolved knobs."""

    request_id: str
    nodes: np.ndarray  # int64 [n]
    new_nodes: list[NewNodeSpec]
    sampling_width: int
    ppr_budget: int
    chosen_by: str
    expected_accuracy: float
    return_probabilities: bool
    return_embeddings: bool
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.nodes) + len(self.new_nodes)


def _preview(values: np.ndarray, limit: int = 5) -> str:
    shown = ", ".join(str(int(v)) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def check_node_ids(nodes: np.ndarray, num_nodes: int, what: str = "node id") -> None:
    if len(nodes) == 1 and 0 <= int(nodes[0]) < num_nodes:  # a one-node request: no masks
        return
    bad = nodes[(nodes < 0) | (nodes >= num_nodes)]
    if len(bad):
        raise InvalidArgument(f"{what}s out of range [0, {num_nodes}): {_preview(bad)}")


def knob_rule(limits: ModelLimits, name: str) -> tuple[int, int, str]:
    """``(lowest, highest, meaning)`` of the values integer knob ``name`` (``sampling_width`` or
    ``ppr_budget``) accepts for this model: what a refusal states and what ModelConfig advertises."""
    if name == "sampling_width":
        return 0, KNOB_MAX, (f"0 = exact; a width above this model's maximum, {limits.max_sampling_width}, "
                             "runs at that maximum")
    if name != "ppr_budget":
        raise ValueError(f"not an integer knob: {name!r}")
    if limits.extractor != "ppr":
        return 0, KNOB_MAX, "this model has no PPR budget: 0 or absent; a larger value is ignored"
    return 1, KNOB_MAX, f"a budget above this model's maximum, {limits.max_ppr_budget}, runs at that maximum"


def knob_range_error(limits: ModelLimits, name: str, value: object) -> InvalidArgument:
    """The refusal of ``value`` for integer knob ``name``: it states the accepted range."""
    lo, hi, meaning = knob_rule(limits, name)
    return InvalidArgument(f"{name} must be >= {lo} and <= {hi} ({meaning}), got {value}")


def resolve_knobs(
    limits: ModelLimits,
    sampling_width: int | None,
    ppr_budget: int | None,
    max_accuracy_loss: float | None,
) -> tuple[int, int, str, float]:
    """Return ``(S, K, chosen_by, expected_accuracy)`` for one request (see module docstring)."""
    for name, value in (("sampling_width", sampling_width), ("ppr_budget", ppr_budget)):
        if value is not None:
            lo, hi, _ = knob_rule(limits, name)
            if not lo <= value <= hi:
                raise knob_range_error(limits, name, value)
    if max_accuracy_loss is not None and not (math.isfinite(max_accuracy_loss) and 0.0 <= max_accuracy_loss <= 1.0):
        raise InvalidArgument(f"max_accuracy_loss must be a finite fraction in [0, 1], got {max_accuracy_loss}")
    lhop = limits.extractor != "ppr"
    table = limits.served_knob_table  # widths as served: a clamped request finds its row

    def clamp_k(k: int) -> int:
        return 0 if lhop else max(1, min(k, limits.max_ppr_budget))

    s = limits.clamp_width(sampling_width) if sampling_width is not None else None
    k = clamp_k(ppr_budget) if ppr_budget is not None and not lhop else None  # an L-hop model has none to choose
    chosen_by = "request"
    loss = losses(table) if max_accuracy_loss is not None and table else None
    if loss is not None:
        # a fixed value the table lacks is chosen against its measured stand-in's rows (module docstring)
        widths = {r.sampling_width for r in table}
        # the bound keeps every edge: an exact row is its own computation, not a stand-in's
        at_bound = s is not None and s not in widths and s >= limits.max_sampling_width and 0 in widths
        row_s = None if s is None else 0 if at_bound else stand_in(s, widths, exact_zero=True)
        row_k = None if k is None or lhop else stand_in(k, (r.ppr_budget for r in table))
        best = cheapest_within(table, max_accuracy_loss, sampling_width=row_s, ppr_budget=row_k)
        if best is None:
            raise _loss_not_met(table, loss, max_accuracy_loss, s, k, row_s, row_k)
        if s is None or k is None:
            s = best.sampling_width if s is None else s
            k = clamp_k(best.ppr_budget) if k is None else k
            chosen_by = "max_accuracy_loss"
    if s is None and k is None and chosen_by == "request":
        chosen_by = "default"
    s = limits.clamp_width(limits.default_sampling_width) if s is None else s
    k = clamp_k(limits.default_ppr_budget) if k is None else k
    expected = _expected_accuracy(table, s, k, lhop, limits.max_sampling_width)
    return s, k, chosen_by, expected


def _loss_not_met(table: Sequence[KnobRow], loss: Sequence[float], max_loss: float, sampling_width: int | None,
                  ppr_budget: int | None, row_s: int | None, row_k: int | None) -> InvalidArgument:
    """The refusal of a ``max_accuracy_loss`` no knob-table row at the request's fixed knobs (as served: a width
    clamped to the model's bound; None: not fixed) meets."""
    fixed = ", ".join(f"{name}={value}" for name, value in (("sampling_width", sampling_width),
                                                           ("ppr_budget", ppr_budget)) if value is not None)
    measured = ", ".join(f"{name}={value}" for name, value in (("sampling_width", row_s), ("ppr_budget", row_k))
                         if value is not None)
    at = [(x, r) for r, x in zip(table, loss, strict=True)
          if (row_s is None or r.sampling_width == row_s) and (row_k is None or r.ppr_budget == row_k)]
    if not at:
        where = f"the model's knob table has no row at {measured}"
    else:
        x, r = min(at, key=lambda t: t[0])
        where = (f"the least loss measured at {measured} is {x:.4f} (sampling_width={r.sampling_width}, "
                 f"ppr_budget={r.ppr_budget})")
    shown = "" if measured == fixed else f" (measured at {measured}, the nearest knob-table values)"
    return InvalidArgument(
        f"no setting with {fixed}{shown} is within max_accuracy_loss={max_loss}: "
        f"{where}; raise max_accuracy_loss, or leave the fixed knob out so that the loss chooses it (ModelInfo's "
        "knob_table lists each setting's accuracy)")


def _expected_accuracy(table: Sequence[KnobRow], s: int, k: int, lhop: bool, bound: int) -> float:
    """The validation accuracy of the row of ``table`` (widths clamped) at ``(k, s)``; an exact width and
    the bound, which keeps every edge too, stand in for each other; 0.0 when there is no such row."""
    at_k = [r for r in table if lhop or r.ppr_budget == k]
    for r in at_k:
        if r.sampling_width == s:
            return r.val_accuracy
    if s == 0 or s >= bound:
        for r in at_k:
            if r.sampling_width == 0 or r.sampling_width >= bound:
                return r.val_accuracy
    return 0.0


def check_request_id(request_id: str) -> None:
    """Refuse a ``request_id`` longer than :data:`MAX_REQUEST_ID` characters (an update's stays in the log)."""
    if len(request_id) > MAX_REQUEST_ID:
        raise InvalidArgument(f"request_id has {len(request_id)} characters, more than the limit of {MAX_REQUEST_ID}; "
                              "use a short id, such as a UUID")


def validate_predict(request, limits: ModelLimits) -> PredictCall:
    """Turn a ``gnnserve.v1.PredictRequest`` into a :class:`PredictCall` or raise InvalidArgument."""
    check_request_id(request.request_id)
    nodes = np.asarray(request.nodes, dtype=np.int64)
    new_nodes = list(request.new_nodes)
    n = len(nodes) + len(new_nodes)
    if n == 0:
        raise InvalidArgument("request has no nodes: give at least one node id (or a new node)")
    if n > limits.max_nodes_per_request:
        raise InvalidArgument(
            f"request has {n} nodes, more than the limit of {limits.max_nodes_per_request} per request; "
            "split it (the SDK chunks long lists automatically)"
        )
    check_node_ids(nodes, limits.num_nodes)
    if new_nodes:
        edges = sum(len(nn.neighbors) for nn in new_nodes)
        if edges > limits.max_new_node_edges:
            raise InvalidArgument(
                f"new nodes have {edges} neighbours in all, more than the limit of {limits.max_new_node_edges} "
                "per request; send fewer or split the request")
    specs = [_validate_new_node(i, nn, limits) for i, nn in enumerate(new_nodes)]
    s, k, chosen_by, expected = resolve_knobs(
        limits,
        request.sampling_width if request.HasField("sampling_width") else None,
        request.ppr_budget if request.HasField("ppr_budget") else None,
        request.max_accuracy_loss if request.HasField("max_accuracy_loss") else None,
    )
    return PredictCall(
        request_id=request.request_id or os.urandom(8).hex(),  # 16 random hex digits
        nodes=nodes,
        new_nodes=specs,
        sampling_width=s,
        ppr_budget=k,
        chosen_by=chosen_by,
        expected_accuracy=expected,
        return_probabilities=bool(request.return_probabilities),
        return_embeddings=bool(request.return_embeddings),
    )


def _validate_new_node(i: int, nn, limits: ModelLimits) -> NewNodeSpec:
    feats = np.asarray(nn.features, dtype=np.float32)
    if feats.shape != (limits.num_features,):
        raise InvalidArgument(
            f"new_nodes[{i}]: features must have {limits.num_features} values for model "
            f"{limits.name!r}, got {feats.shape[0]}"
        )
    problem = feature_problem(feats)
    if problem:
        raise InvalidArgument(f"new_nodes[{i}]: {problem}")
    nbrs = np.asarray(nn.neighbors, dtype=np.int64)
    if len(nbrs) > MAX_NEW_NODE_NEIGHBORS:
        raise InvalidArgument(f"new_nodes[{i}]: {len(nbrs)} neighbours, more than {MAX_NEW_NODE_NEIGHBORS}")
    check_node_ids(nbrs, limits.num_nodes, what=f"new_nodes[{i}] neighbour")
    weights = None
    if len(nn.edge_weights):
        weights = np.asarray(nn.edge_weights, dtype=np.float32)
        if weights.shape != nbrs.shape:
            raise InvalidArgument(
                f"new_nodes[{i}]: edge_weights has {len(weights)} values for {len(nbrs)} neighbours"
            )
        bad = ~valid_weights(weights)
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            raise InvalidArgument(f"new_nodes[{i}].edge_weights[{t}]: weight {float(weights[t])} of the edge to "
                                  f"node {int(nbrs[t])} {weight_rule(weights[t])}")
    if len(np.unique(nbrs)) != len(nbrs):
        raise InvalidArgument(f"new_nodes[{i}]: neighbours repeat; give each neighbour once")
    return NewNodeSpec(features=feats, neighbors=nbrs, weights=weights)


def knob_rows(rows: Sequence[dict]) -> tuple[KnobRow, ...]:
    """Knob-table rows (dicts as stored in a checkpoint's knobs.json) as :class:`KnobRow`s."""
    return tuple(
        KnobRow(
            ppr_budget=int(r["ppr_budget"]),
            sampling_width=int(r["sampling_width"]),
            val_accuracy=float(r["val_accuracy"]),
            latency_ms_per_node=float(r["latency_ms_per_node"]),
            edges_kept_fraction=float(r.get("edges_kept_fraction", 1.0)),
            agreement=None if r.get("agreement") is None else float(r["agreement"]),
        )
        for r in rows
    )
