"""The knob rules, in one place: how a setting (PPR budget K, sampling width S) is chosen from a
model's knob table. Torch-free and NumPy-free: the SDK (``ModelInfo.best_knobs``), the server
(``serve.validation.resolve_knobs``) and training (``models.train`` picks a checkpoint's defaults)
all call these functions, so a client can see in advance what the server will pick.

A knob-table row is anything with ``ppr_budget``, ``sampling_width`` (0 = exact),
``val_accuracy`` and ``latency_ms_per_node`` (``clients.types.KnobRow``, ``serve.validation.KnobRow``),
and, in tables measured since 2026-11-29, ``agreement``.

* **exact reference**: the exact-width row (S = 0) at the largest budget K.
* **a row's loss**: ``1 - agreement`` where every row has one: the share of a large sample of the graph's
  nodes (``knob_agreement_nodes``, 10,000 by default, no labels needed) whose predicted label at that
  setting differs from the exact reference's. A setting's accuracy can differ from exact by at most that
  share, whatever the labels, so a loss bound L holds on the nodes served, not only on the validation
  nodes; and a sample of 10,000 reads it to a tenth of a point where a validation set of a few hundred
  nodes (Amazon Computers' 300) moves the accuracy difference by points (a data scientist asked for 0.5
  points and lost 4.1 on the test nodes). Older tables: ``reference accuracy - val_accuracy``.
* **cheapest within a loss L**: among the rows whose loss is at most L, the one with the lowest
  measured latency per node (ties: higher accuracy);
  an explicit S or K restricts the rows to that value, and the loss picks the other coordinate.
  An explicit value the table has no rows for is served as asked, and the loss picks the other
  coordinate among the rows of a measured stand-in (:func:`stand_in`): the largest table value
  below it (its rows keep fewer edges, or a smaller subgraph, so their accuracy is the table's
  nearest reading that does not overstate the requested one), else the smallest table value.
* **defaults** (chosen at training time, deterministic, no timings): the smallest K whose exact row's
  loss is within the tolerance, then the smallest S > 0 within it at that K (else exact).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

__all__ = ["KnobTableRow", "Row", "cheapest_within", "default_knobs", "exact_reference", "losses", "rows_of",
           "stand_in"]

#: slack for comparing accuracies stored as floats
EPS = 1e-12


class KnobTableRow(Protocol):
    @property
    def ppr_budget(self) -> int: ...

    @property
    def sampling_width(self) -> int: ...

    @property
    def val_accuracy(self) -> float: ...

    @property
    def latency_ms_per_node(self) -> float: ...


R = TypeVar("R", bound=KnobTableRow)


class Row(NamedTuple):
    """A knob-table row with just what the rules read."""

    ppr_budget: int
    sampling_width: int
    val_accuracy: float
    latency_ms_per_node: float
    agreement: float | None = None


def rows_of(dicts: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Rows as stored in a checkpoint's knobs.json (dicts) for the functions below."""
    return [Row(int(d["ppr_budget"]), int(d["sampling_width"]), float(d["val_accuracy"]),
                float(d["latency_ms_per_node"]), None if d.get("agreement") is None else float(d["agreement"]))
            for d in dicts]


def exact_reference(rows: Sequence[R]) -> R | None:
    """The exact-width row at the largest budget (None when the table has no exact row)."""
    exact = [r for r in rows if r.sampling_width == 0]
    return max(exact, key=lambda r: (r.ppr_budget, r.val_accuracy)) if exact else None


def losses(rows: Sequence[R]) -> list[float] | None:
    """Each row's loss against the exact reference (module docstring): ``1 - agreement`` when every row has
    an agreement, else the reference's validation accuracy minus the row's; None without an exact row."""
    ref = exact_reference(rows)
    if ref is None:
        return None
    agree = [getattr(r, "agreement", None) for r in rows]
    if all(a is not None for a in agree):
        return [1.0 - float(a) for a in agree]  # type: ignore[arg-type]
    return [ref.val_accuracy - r.val_accuracy for r in rows]


def cheapest_within(rows: Sequence[R], max_loss: float, *, sampling_width: int | None = None,
                    ppr_budget: int | None = None) -> R | None:
    """The fastest row whose loss (:func:`losses`; absolute: 0.01 = one point) is at most ``max_loss``, among
    the rows with the given ``sampling_width`` / ``ppr_budget`` (None = any); None if there is none."""
    loss = losses(rows)
    if loss is None:
        return None
    ok = [r for r, x in zip(rows, loss, strict=True)
          if (sampling_width is None or r.sampling_width == sampling_width)
          and (ppr_budget is None or r.ppr_budget == ppr_budget)
          and x <= max_loss + EPS]
    return min(ok, key=lambda r: (r.latency_ms_per_node, -r.val_accuracy)) if ok else None


def stand_in(value: int, measured: Iterable[int], *, exact_zero: bool = False) -> int | None:
    """The knob-table value whose rows a fixed knob ``value`` is chosen against: ``value`` itself when the
    table measured it, else the largest measured value below it, else the smallest one above it; None for no
    values. ``exact_zero``: the values are sampling widths, where 0 (exact) keeps every edge and so ranks
    above every width.

    Why below: a smaller width keeps at most as many edges of each row, a smaller budget a smaller part of
    each subgraph, so that row's accuracy is the measured reading nearest the requested setting that does not
    overstate it, and the loss a request gives is not met by an optimistic stand-in. Only a value below every
    measured one takes the nearest above.

    Example::

        >>> stand_in(5, [0, 4, 8, 16], exact_zero=True), stand_in(2, [0, 4, 8], exact_zero=True)
        (4, 4)
        >>> stand_in(100, [0, 4, 8], exact_zero=True), stand_in(20, [8, 16, 32])
        (8, 16)
    """
    def rank(v: int) -> float:
        return float("inf") if exact_zero and v == 0 else float(v)

    values = set(measured)
    if value in values or not values:
        return value if values else None
    below = [v for v in values if rank(v) < rank(value)]
    return max(below, key=rank) if below else min(values, key=rank)


def default_knobs(rows: Sequence[R], tolerance: float) -> tuple[int, int]:
    """A checkpoint's default ``(K, S)`` (module docstring); the table must hold an exact row."""
    ref = exact_reference(rows)
    loss = losses(rows)
    if ref is None or loss is None:
        raise ValueError("a knob table needs an exact-width row (sampling_width 0) to choose defaults")
    ok = [r for r, x in zip(rows, loss, strict=True) if x <= tolerance + EPS]
    exact_ok = [r.ppr_budget for r in ok if r.sampling_width == 0]
    k = min(exact_ok) if exact_ok else ref.ppr_budget
    widths = sorted(r.sampling_width for r in ok if r.ppr_budget == k and r.sampling_width > 0)
    return k, (widths[0] if widths else 0)
