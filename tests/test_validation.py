"""Validation and knob resolution on protobuf requests (no server)."""

from __future__ import annotations

import math

import pytest

from clients._gen import gnnserve_pb2 as pb
from serve.errors import InvalidArgument
from serve.validation import KNOB_MAX, KnobRow, ModelLimits, knob_rule, resolve_knobs, validate_predict

TABLE = (
    KnobRow(200, 0, 0.90, 1.00, 1.0),
    KnobRow(200, 16, 0.895, 0.50, 0.4),
    KnobRow(64, 0, 0.89, 0.40, 0.3),
    KnobRow(64, 16, 0.885, 0.20, 0.1),
    KnobRow(32, 8, 0.80, 0.05, 0.05),
)
PPR = ModelLimits("m", 1000, 8, "ppr", 200, 512, 16, 64, 256, TABLE)
LHOP = ModelLimits("g", 1000, 8, "lhop", 0, 512, 0, 0, 256, (KnobRow(0, 0, 0.8, 1.0), KnobRow(0, 8, 0.79, 0.3)))


def test_defaults_and_explicit_knobs_clamped_and_echoed():
    assert resolve_knobs(PPR, None, None, None) == (16, 64, "default", 0.885)
    assert resolve_knobs(PPR, 0, 200, None)[:3] == (0, 200, "request")
    assert resolve_knobs(PPR, 10_000, 5000, None)[:2] == (512, 200), "clamped to the model's maximum"
    assert resolve_knobs(LHOP, 8, 50, None)[:2] == (8, 0), "budget does not apply to L-hop models"


def test_max_accuracy_loss_picks_cheapest_row_within_loss():
    assert resolve_knobs(PPR, None, None, 0.0)[:3] == (0, 200, "max_accuracy_loss")
    assert resolve_knobs(PPR, None, None, 0.012)[:2] == (0, 64)
    assert resolve_knobs(PPR, None, None, 0.016)[:2] == (16, 64)
    assert resolve_knobs(PPR, None, None, 0.2)[:2] == (8, 32)
    # an explicit width fixes that coordinate, the table picks the budget
    assert resolve_knobs(PPR, 0, None, 0.011)[:2] == (0, 64)
    assert resolve_knobs(LHOP, None, None, 0.05)[:2] == (8, 0)


def test_a_table_width_above_the_bound_keeps_its_accuracy_once_clamped():
    """max_sampling_width bounds every row's degree: the (K=8, S=64) row of a model whose bound is 63 is
    the computation a request clamped to 63 runs, and reports that row's accuracy (it used to find none)."""
    table = (KnobRow(64, 0, 0.90, 1.0), KnobRow(8, 0, 0.88, 0.5), KnobRow(8, 64, 0.87, 0.1), KnobRow(8, 4, 0.70, 0.05),
             KnobRow(16, 0, 0.89, 0.6))
    lim = ModelLimits("cora", 2708, 8, "ppr", 64, 63, 64, 8, 256, table)
    assert resolve_knobs(lim, None, None, 0.05) == (63, 8, "max_accuracy_loss", 0.87)  # the row a loss picks
    assert resolve_knobs(lim, 64, 8, None) == (63, 8, "request", 0.87)
    assert resolve_knobs(lim, 1000, 8, None) == (63, 8, "request", 0.87)
    assert resolve_knobs(lim, 63, 8, None) == (63, 8, "request", 0.87), "the bound asked for: the same computation"
    assert resolve_knobs(lim, None, None, None) == (63, 8, "default", 0.87), "a default above the bound too"
    # an explicit width above the bound with a loss: the loss chooses among that width's rows
    assert resolve_knobs(lim, 64, None, 0.05) == (63, 8, "max_accuracy_loss", 0.87)
    # at K = 16 the table has no wide row: the exact row stands in for the bound, which keeps every edge
    assert resolve_knobs(lim, 64, 16, None) == (63, 16, "request", 0.89)
    assert resolve_knobs(lim, 4, 16, None)[3] == 0.0, "no row, and width 4 is not exact: no accuracy"
    assert resolve_knobs(lim, 0, 8, None)[3] == 0.88, "an exact request keeps the exact row"
    assert [r.sampling_width for r in lim.served_knob_table] == [0, 0, 63, 4, 0]
    assert [r.sampling_width for r in lim.knob_table] == [0, 0, 64, 4, 0], "the table itself is reported as trained"
    lhop = ModelLimits("g", 1000, 8, "lhop", 0, 20, 32, 0, 256, (KnobRow(0, 0, 0.8, 1.0), KnobRow(0, 32, 0.8, 0.3)))
    assert resolve_knobs(lhop, None, None, None) == (20, 0, "default", 0.8)


@pytest.mark.parametrize(
    "args, msg",
    [
        ((-1, None, None), "sampling_width must be >= 0"),
        ((None, 0, None), "ppr_budget must be >= 1"),
        ((None, -5, None), "got -5"),
        ((None, None, math.nan), "max_accuracy_loss"),
        ((None, None, math.inf), "max_accuracy_loss"),
        ((None, None, -0.1), "got -0.1"),
    ],
)
def test_bad_knobs(args, msg):
    with pytest.raises(InvalidArgument, match=msg):
        resolve_knobs(PPR, *args)


def test_refusals_state_the_accepted_range():
    with pytest.raises(InvalidArgument, match=r"^sampling_width must be >= 0 and <= 2147483647 \(0 = exact; a width "
                                              r"above this model's maximum, 512, runs at that maximum\), got -1$"):
        resolve_knobs(PPR, -1, None, None)
    with pytest.raises(InvalidArgument, match=r"^ppr_budget must be >= 1 and <= 2147483647 \(a budget above this "
                                              r"model's maximum, 200, runs at that maximum\), got 0$"):
        resolve_knobs(PPR, None, 0, None)
    with pytest.raises(InvalidArgument, match=r"got 2147483648$"):
        resolve_knobs(PPR, KNOB_MAX + 1, None, None)  # beyond the int32 field (a KServe parameter can carry it)
    assert resolve_knobs(PPR, KNOB_MAX, KNOB_MAX, None)[:2] == (512, 200)


def test_a_plain_model_has_no_budget_and_takes_0_as_none():
    """What KServe's ModelConfig advertises for a plain model (min 0, max 0, default 0) and what every
    answer reports (0) is accepted; a larger value is ignored; a negative one refused."""
    assert knob_rule(LHOP, "ppr_budget")[:2] == (0, KNOB_MAX) and knob_rule(PPR, "ppr_budget")[:2] == (1, KNOB_MAX)
    assert resolve_knobs(LHOP, None, 0, None) == resolve_knobs(LHOP, None, None, None) == (0, 0, "default", 0.8)
    assert resolve_knobs(LHOP, 8, 0, None) == (8, 0, "request", 0.79)
    assert resolve_knobs(LHOP, None, 50, None) == (0, 0, "default", 0.8), "an ignored budget chooses nothing"
    assert resolve_knobs(LHOP, None, 0, 0.05)[:3] == (8, 0, "max_accuracy_loss")
    with pytest.raises(InvalidArgument, match=r"^ppr_budget must be >= 0 and <= 2147483647 \(this model has no PPR "
                                              r"budget: 0 or absent; a larger value is ignored\), got -7$"):
        resolve_knobs(LHOP, None, -7, None)
    call = validate_predict(pb.PredictRequest(model="g", nodes=[1], ppr_budget=0), LHOP)
    assert (call.sampling_width, call.ppr_budget) == (0, 0)


def test_validate_request_shapes_and_ids():
    call = validate_predict(pb.PredictRequest(model="m", nodes=[1, 2, 2], return_probabilities=True), PPR)
    assert call.nodes.tolist() == [1, 2, 2] and call.size == 3 and call.request_id
    assert (call.sampling_width, call.ppr_budget, call.chosen_by) == (16, 64, "default")
    with pytest.raises(InvalidArgument, match="no nodes"):
        validate_predict(pb.PredictRequest(model="m"), PPR)
    with pytest.raises(InvalidArgument, match=r"out of range \[0, 1000\): -1, 1000"):
        validate_predict(pb.PredictRequest(model="m", nodes=[3, -1, 1000]), PPR)
    with pytest.raises(InvalidArgument, match="300 nodes, more than the limit of 256"):
        validate_predict(pb.PredictRequest(model="m", nodes=list(range(300))), PPR)
    with pytest.raises(InvalidArgument, match="sampling_width"):
        validate_predict(pb.PredictRequest(model="m", nodes=[1], sampling_width=-3), PPR)


def test_new_node_checks():
    ok = pb.NewNode(features=[0.5] * 8, neighbors=[1, 5], edge_weights=[1.0, 2.0])
    call = validate_predict(pb.PredictRequest(model="m", new_nodes=[ok]), PPR)
    assert call.size == 1 and call.new_nodes[0].neighbors.tolist() == [1, 5]
    # 0 is a weight, as in UpdateGraph and CSRGraph.from_edge_index (an edge that adds nothing)
    zero = pb.NewNode(features=[0.5] * 8, neighbors=[1, 5], edge_weights=[0.0, 2.0])
    assert validate_predict(pb.PredictRequest(model="m", new_nodes=[zero]), PPR).new_nodes[0].weights.tolist() == [0, 2]
    cases = [
        (pb.NewNode(features=[0.5] * 7, neighbors=[1]), "must have 8 values"),
        (pb.NewNode(features=[math.nan] + [0.5] * 7, neighbors=[1]), "NaN"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1, 5000]), "neighbours out of range"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1, 2], edge_weights=[1.0]), "edge_weights has 1"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1, 7], edge_weights=[1.0, -1.0]),
         r"new_nodes\[0\]\.edge_weights\[1\]: weight -1\.0 of the edge to node 7 must be finite and >= 0"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1], edge_weights=[math.nan]), r"edge_weights\[0\]: weight nan"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1, 1]), "repeat"),
    ]
    for nn, msg in cases:
        with pytest.raises(InvalidArgument, match=msg):
            validate_predict(pb.PredictRequest(model="m", new_nodes=[nn]), PPR)
