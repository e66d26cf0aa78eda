"""Packed outputs (issue 22 item 5): ``PredictRequest.packed_outputs`` answers labels, probabilities
and embeddings as little-endian arrays in bytes fields; the SDK asks for them and decodes them, and
still reads the repeated fields of a server that predates them."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest

from clients import GnnClient
from clients._core import ChunkLimits, PredictPlan, response_arrays
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc
from clients.errors import InternalError


def _ask(address: str, **kw) -> pb.PredictResponse:
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(**kw), timeout=60)


@pytest.mark.parametrize("model", ["gcn", "shadow"])
def test_packed_equals_repeated(served, model):
    nodes = [0, 5, 7, 5, 799]
    kw = dict(model=model, nodes=nodes, return_probabilities=True, return_embeddings=True, sampling_width=4)
    rep = _ask(served.address, **kw)
    pk = _ask(served.address, packed_outputs=True, **kw)
    assert not rep.packed and pk.packed
    assert len(pk.labels) == len(pk.probabilities) == len(pk.embeddings) == 0  # nothing twice
    assert len(rep.packed_labels) == len(rep.packed_probabilities) == 0
    labels = np.frombuffer(pk.packed_labels, "<i4")
    probs = np.frombuffer(pk.packed_probabilities, "<f4").reshape(len(nodes), pk.num_classes)
    np.testing.assert_array_equal(labels, list(rep.labels))
    np.testing.assert_array_equal(probs.ravel(), np.array(rep.probabilities, dtype=np.float32))
    assert pk.embedding_dim == rep.embedding_dim > 0
    np.testing.assert_array_equal(np.frombuffer(pk.packed_embeddings, "<f4"),
                                  np.array(rep.embeddings, dtype=np.float32))
    assert pk.served_by == rep.served_by == str(os.getpid())  # an in-process server, one process


def test_packed_without_probabilities_carries_labels_only(served):
    pk = _ask(served.address, model="gcn", nodes=[1, 2, 3], packed_outputs=True)
    assert pk.packed and len(pk.packed_labels) == 12 and not pk.packed_probabilities and not pk.packed_embeddings


def test_sdk_asks_for_packed_and_decodes_it(served):
    nodes = list(range(0, 800, 9))
    with GnnClient(served.address) as client:
        res = client.predict("shadow", nodes, return_embeddings=True, sampling_width=4)
    rep = _ask(served.address, model="shadow", nodes=nodes, return_probabilities=True, return_embeddings=True,
               sampling_width=4)
    assert res.labels.dtype == np.int64 and res.probabilities.dtype == np.float32
    assert res.embeddings.dtype == np.float32
    assert res.probabilities.shape == (len(nodes), rep.num_classes)
    np.testing.assert_array_equal(res.labels, list(rep.labels))
    # two requests (the SDK's and this one) may run in batches of different sizes: float32 sums can
    # differ in the last place; test_packed_equals_repeated checks the encoding bit for bit
    np.testing.assert_allclose(res.probabilities.ravel(), np.array(rep.probabilities, dtype=np.float32), atol=1e-6)
    np.testing.assert_allclose(res.embeddings.ravel(), np.array(rep.embeddings, dtype=np.float32), atol=1e-5)
    res.probabilities[0, 0] = 0.5  # a writable array, as before


def _plan(n: int) -> PredictPlan:
    plan = PredictPlan(model="m", version="", nodes=np.arange(n, dtype=np.int64), new_nodes=[], knobs={},
                       return_probabilities=True, return_embeddings=False, request_id="r", limits=ChunkLimits(max_nodes=4096))
    req = plan.next_request()
    assert req.packed_outputs
    return plan


def test_sdk_reads_an_old_servers_repeated_fields():
    plan = _plan(2)  # asked for packed outputs; a server before them ignores the flag
    plan.add(pb.PredictResponse(model="m", version="1", labels=[3, 1], num_classes=2,
                                probabilities=[0.25, 0.75, 0.5, 0.5]))
    assert plan.next_request() is None
    res = plan.result(1.0)
    np.testing.assert_array_equal(res.labels, [3, 1])
    np.testing.assert_array_equal(res.probabilities, [[0.25, 0.75], [0.5, 0.5]])


def test_sdk_refuses_a_damaged_packed_field():
    plan = _plan(2)
    with pytest.raises(InternalError, match="whole number"):
        plan.add(pb.PredictResponse(model="m", version="1", num_classes=2, packed=True,
                                    packed_labels=np.array([3, 1], "<i4").tobytes(), packed_probabilities=b"\0" * 15))
    plan = _plan(2)
    with pytest.raises(InternalError, match="probabilities"):
        plan.add(pb.PredictResponse(model="m", version="1", num_classes=2, packed=True,
                                    packed_labels=np.array([3, 1], "<i4").tobytes(),
                                    packed_probabilities=np.zeros(3, "<f4").tobytes()))


def test_response_arrays_decodes_both_forms():
    labels, probs, emb = response_arrays(pb.PredictResponse(packed=True, packed_labels=np.array([2], "<i4").tobytes(),
                                                            packed_probabilities=np.array([1.0], "<f4").tobytes()))
    assert labels.dtype == np.int64 and list(labels) == [2] and list(probs) == [1.0] and len(emb) == 0
    labels, probs, emb = response_arrays(pb.PredictResponse(labels=[2], probabilities=[1.0]))
    assert list(labels) == [2] and list(probs) == [1.0] and len(emb) == 0
