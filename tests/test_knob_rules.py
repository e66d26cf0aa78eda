"""The knob rules live once (clients.knob_rules): the server's choice for max_accuracy_loss, the SDK's
ModelInfo.best_knobs and training's defaults are the same functions, checked here on random tables."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clients.knob_rules import Row, cheapest_within, default_knobs, exact_reference, rows_of
from clients.types import KnobRow, ModelInfo
from models.train import choose_defaults
from serve.validation import ModelLimits, knob_rows, resolve_knobs


@st.composite
def tables(draw):
    budgets = draw(st.lists(st.sampled_from([8, 16, 32, 64]), min_size=1, max_size=3, unique=True))
    widths = draw(st.lists(st.sampled_from([2, 4, 8, 16]), max_size=3, unique=True))
    acc = st.floats(0.3, 0.95)
    lat = st.floats(0.01, 5.0)
    return [{"ppr_budget": k, "sampling_width": s, "val_accuracy": draw(acc), "latency_ms_per_node": draw(lat)}
            for k in budgets for s in [0, *widths]]


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
    # the definition, written out once more: fastest row within loss of the exact row at the largest K
    ref = max((r for r in rows if r["sampling_width"] == 0), key=lambda r: r["ppr_budget"])["val_accuracy"]
    ok = [r for r in rows if r["val_accuracy"] >= ref - loss - 1e-12]
    fastest = min(ok, key=lambda r: (r["latency_ms_per_node"], -r["val_accuracy"]))
    assert best.latency_ms_per_node == fastest["latency_ms_per_node"]
    # training's defaults: the same reference and tolerance rule
    dk, ds = choose_defaults(rows, loss)
    assert (dk, ds) == default_knobs(rows_of(rows), loss)
    assert any(r["ppr_budget"] == dk and r["sampling_width"] == ds for r in rows)
    row = next(r for r in rows if r["ppr_budget"] == dk and r["sampling_width"] == ds)
    assert row["val_accuracy"] >= ref - loss - 1e-12 or (ds == 0 and dk == max(r["ppr_budget"] for r in rows))


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
