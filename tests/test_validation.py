"""Validation and knob resolution on protobuf requests (no server)."""

from __future__ import annotations

import math

import pytest

from clients._gen import gnnserve_pb2 as pb
from serve.errors import InvalidArgument
from serve.validation import KnobRow, ModelLimits, resolve_knobs, validate_predict

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
    cases = [
        (pb.NewNode(features=[0.5] * 7, neighbors=[1]), "must have 8 values"),
        (pb.NewNode(features=[math.nan] + [0.5] * 7, neighbors=[1]), "NaN"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1, 5000]), "neighbours out of range"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1, 2], edge_weights=[1.0]), "edge_weights has 1"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1], edge_weights=[-1.0]), "finite and > 0"),
        (pb.NewNode(features=[0.5] * 8, neighbors=[1, 1]), "repeat"),
    ]
    for nn, msg in cases:
        with pytest.raises(InvalidArgument, match=msg):
            validate_predict(pb.PredictRequest(model="m", new_nodes=[nn]), PPR)
