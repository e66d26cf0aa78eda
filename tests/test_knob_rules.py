"""The knob rules live once (clients.knob_rules): the server's choice for max_accuracy_loss, the SDK's
ModelInfo.best_knobs and training's defaults are the same functions, checked here on random tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.knob_rules import Row, cheapest_within, default_knobs, exact_reference, rows_of, stand_in
from clients.types import KnobRow, ModelInfo
from models.train import choose_defaults
from serve.errors import InvalidArgument
from serve.validation import ModelLimits, knob_rows, resolve_knobs


@st.composite
def tables(draw):
    budgets = draw(st.lists(st.sampled_from([8, 16, 32, 64]), min_size=1, max_size=3, unique=True))
    widths = draw(st.lists(st.sampled_from([2, 4, 8, 16]), max_size=3, unique=True))
    acc = st.floats(0.3, 0.95)
    lat = st.floats(0.01, 5.0)
    rows = [{"ppr_budget": k, "sampling_width": s, "val_accuracy": draw(acc), "latency_ms_per_node": draw(lat)}
            for k in budgets for s in [0, *widths]]
    if draw(st.booleans()):  # a table measured since 2026-11-29: each row's agreement with the exact labels
        for r in rows:
            exact_ref = r["sampling_width"] == 0 and r["ppr_budget"] == max(budgets)
            r["agreement"] = 1.0 if exact_ref else draw(st.floats(0.5, 1.0))
    return rows


def _info(rows):
    return ModelInfo(name="m", version="1", versions=["1"], architecture="shadow-gcn", extractor="ppr",
                     num_features=4, num_classes=2, num_nodes=100, max_ppr_budget=64, default_sampling_width=0,
                     default_ppr_budget=8, strategy="fastrand", knob_table=[KnobRow(**r, edges_kept_fraction=1.0) for r in rows],
                     max_sampling_width=64, max_nodes_per_request=10, metrics={}, dataset_fingerprint="", ready=True,
                     feature_store="memory")


@settings(max_examples=200, derandomize=True, deadline=None)
@given(rows=tables(), loss=st.floats(0.0, 0.5))
def test_server_sdk_and_training_apply_one_rule(rows, loss):
    limits = ModelLimits(name="m", num_nodes=100, num_features=4, extractor="ppr", max_ppr_budget=64,
                         max_sampling_width=64, default_sampling_width=0, default_ppr_budget=8,
                         max_nodes_per_request=10, knob_table=knob_rows(rows))
    s, k, chosen_by, _ = resolve_knobs(limits, None, None, loss)
    best = _info(rows).best_knobs(loss)
    assert best is not None and chosen_by == "max_accuracy_loss"
    assert (s, k) == (best.sampling_width, best.ppr_budget)
    # the definition, written out once more: fastest row within loss of the exact row at the largest K, the loss
    # being the share of labels that differ from exact ones where the table has it, else the accuracy given up
    ref = max((r for r in rows if r["sampling_width"] == 0), key=lambda r: r["ppr_budget"])["val_accuracy"]
    agreed = "agreement" in rows[0]
    ok = [r for r in rows if (1 - r["agreement"] if agreed else ref - r["val_accuracy"]) <= loss + 1e-12]
    fastest = min(ok, key=lambda r: (r["latency_ms_per_node"], -r["val_accuracy"]))
    assert best.latency_ms_per_node == fastest["latency_ms_per_node"]
    # training's defaults: the same reference and tolerance rule
    dk, ds = choose_defaults(rows, loss)
    assert (dk, ds) == default_knobs(rows_of(rows), loss)
    assert any(r["ppr_budget"] == dk and r["sampling_width"] == ds for r in rows)
    row = next(r for r in rows if r["ppr_budget"] == dk and r["sampling_width"] == ds)
    assert row in ok or (ds == 0 and dk == max(r["ppr_budget"] for r in rows))


def test_agreement_is_the_loss_where_the_table_has_it():
    """A data scientist asked shaDow-GCN for at most 0.5 points (max_accuracy_loss=0.005) and lost 4.1 on the test
    nodes: the rule read validation accuracies of 300 nodes, a few points of noise. With agreement (the share of
    10,000 nodes whose label equals the exact one) the loss is 1 - agreement, which bounds the accuracy given up
    on any labels; validation accuracy then only breaks ties. A table without it on every row compares
    accuracies as before."""
    rows = [Row(16, 0, 0.80, 2.0, 1.0), Row(16, 4, 0.84, 0.2, 0.95), Row(16, 8, 0.79, 0.5, 0.996),
            Row(8, 0, 0.80, 1.0, 0.99)]
    assert cheapest_within(rows, 0.005) == rows[2]  # S=4's accuracy looks better, but 5 % of its labels moved
    assert cheapest_within(rows, 0.05) == rows[1]
    assert cheapest_within(rows, 0.0) == rows[0]
    assert default_knobs(rows, 0.005) == (16, 8)  # K=8's exact row moves 1 % of the labels
    assert default_knobs(rows, 0.01) == (8, 0)
    old = [r._replace(agreement=None) for r in rows]
    assert cheapest_within(old, 0.005) == old[1]  # accuracies: 0.84 >= 0.80
    mixed = [rows[0], old[1], rows[2], rows[3]]
    assert cheapest_within(mixed, 0.005) == mixed[1]  # not every row has one: accuracies
    assert rows_of([{"ppr_budget": 8, "sampling_width": 0, "val_accuracy": 0.5, "latency_ms_per_node": 1,
                     "agreement": 0.97}])[0].agreement == 0.97


def test_fixed_coordinates_and_no_exact_row():
    rows = [Row(8, 0, 0.80, 1.0), Row(8, 4, 0.79, 0.2), Row(16, 0, 0.82, 2.0), Row(16, 4, 0.81, 0.5)]
    assert exact_reference(rows) == rows[2]
    assert cheapest_within(rows, 0.02) == rows[3]  # 0.79 is more than 0.02 below 0.82
    assert cheapest_within(rows, 0.05) == rows[1]
    assert cheapest_within(rows, 0.05, ppr_budget=16) == rows[3]
    assert cheapest_within(rows, 0.0, sampling_width=4) is None
    assert cheapest_within([Row(8, 4, 0.9, 0.1)], 0.5) is None
    assert default_knobs(rows, 0.02) == (8, 0)
    assert default_knobs(rows, 0.05) == (8, 4)
    assert default_knobs(rows, 0.0) == (16, 0)


def _limits(rows, **kw):
    base = dict(name="m", num_nodes=100, num_features=4, extractor="ppr", max_ppr_budget=64, max_sampling_width=64,
                default_sampling_width=0, default_ppr_budget=64, max_nodes_per_request=10, knob_table=knob_rows(rows))
    return ModelLimits(**{**base, **kw})


def test_stand_in_is_the_largest_measured_value_below_else_the_smallest():
    widths = [0, 4, 8, 16]
    assert [stand_in(s, widths, exact_zero=True) for s in (4, 5, 7, 9, 100, 2, 0)] == [4, 4, 4, 8, 16, 4, 0]
    assert stand_in(0, [4, 8], exact_zero=True) == 8  # exact ranks above every width
    assert stand_in(3, [0], exact_zero=True) == 0
    assert [stand_in(k, [8, 16, 64]) for k in (20, 64, 4, 1000)] == [16, 64, 8, 64]
    assert stand_in(5, [], exact_zero=True) is None


def test_a_loss_still_picks_the_other_coordinate_of_a_value_the_table_lacks():
    """A new-user report: width 5 (the table has 0, 4, 8, 16) with a loss fell back to the default budget with
    chosen_by=request. The loss now picks K among the width-4 rows; the width is served as asked."""
    acc = {(8, 0): 0.80, (8, 4): 0.795, (8, 8): 0.80, (8, 16): 0.80,
           (16, 0): 0.81, (16, 4): 0.79, (16, 8): 0.81, (16, 16): 0.81,
           (64, 0): 0.81, (64, 4): 0.70, (64, 8): 0.81, (64, 16): 0.81}
    rows = [{"ppr_budget": k, "sampling_width": s, "val_accuracy": a, "latency_ms_per_node": k / 64 + s / 100}
            for (k, s), a in acc.items()]
    limits = _limits(rows)
    assert resolve_knobs(limits, 4, None, 0.02)[:3] == (4, 8, "max_accuracy_loss")  # a table width, as before
    for width in (5, 7, 2):  # stand-in: width 4 (2 is below every width: the smallest, 4)
        s, k, chosen_by, expected = resolve_knobs(limits, width, None, 0.02)
        assert (s, k, chosen_by, expected) == (width, 8, "max_accuracy_loss", 0.0), width  # no row at (8, 5)
    # the stand-in's rows decide: none at width 4 within 0.005 of exact but K = 8's (0.795 >= 0.81 - 0.015)
    assert resolve_knobs(limits, 5, None, 0.015)[:3] == (5, 8, "max_accuracy_loss")
    with pytest.raises(InvalidArgument, match=r"no setting with sampling_width=5 \(measured at sampling_width=4, "
                       r"the nearest knob-table values\) is within max_accuracy_loss=0.005: the least loss measured "
                       r"at sampling_width=4 is 0.0150 \(sampling_width=4, ppr_budget=8\)"):
        resolve_knobs(limits, 5, None, 0.005)  # none within: refused (it served the default K, the loss dropped)
    # at or above the degree bound a width keeps every edge: the exact rows are that computation's
    s, k, chosen_by, expected = resolve_knobs(_limits(rows, max_sampling_width=12), 100, None, 0.0)
    assert (s, k, chosen_by) == (12, 16, "max_accuracy_loss")  # (16, 0) is the cheapest exact row within 0
    assert expected == 0.81  # the bound and exact are one computation (the module's rule)
    # a budget the table lacks: the width is chosen among the rows of the largest table budget below it
    assert resolve_knobs(limits, None, 20, 0.0)[:3] == (0, 20, "max_accuracy_loss")  # K = 16 rows: 0 is cheapest
    assert resolve_knobs(limits, None, 4, 0.011)[:3] == (0, 4, "max_accuracy_loss")  # below every budget: K = 8's rows
    assert resolve_knobs(limits, 5, 20, 0.02)[:3] == (5, 20, "request")  # both given: the loss checked, met
    with pytest.raises(InvalidArgument, match=r"sampling_width=5, ppr_budget=20 \(measured at sampling_width=4, "
                       r"ppr_budget=16, .*least loss measured .* is 0.0200"):
        resolve_knobs(limits, 5, 20, 0.01)  # (16, 4) is 0.02 below exact
    assert resolve_knobs(limits, 4, 16, 0.02)[:3] == (4, 16, "request")  # a table row: checked as itself
    with pytest.raises(InvalidArgument, match=r"no setting with sampling_width=4, ppr_budget=16 is within"):
        resolve_knobs(limits, 4, 16, 0.019)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(rows=tables(), loss=st.floats(0.0, 0.5), width=st.integers(1, 40))
def test_a_fixed_width_is_chosen_against_its_stand_in(rows, loss, width):
    limits = _limits(rows, default_ppr_budget=rows[0]["ppr_budget"])
    widths = {r["sampling_width"] for r in rows}
    best = cheapest_within(rows_of(rows), loss, sampling_width=stand_in(width, widths, exact_zero=True))
    if best is None:  # no row at the width's stand-in meets the loss: refused, never served with it dropped
        with pytest.raises(InvalidArgument, match="is within max_accuracy_loss"):
            resolve_knobs(limits, width, None, loss)
        return
    s, k, chosen_by, _ = resolve_knobs(limits, width, None, loss)
    assert (s, k, chosen_by) == (width, best.ppr_budget, "max_accuracy_loss")
