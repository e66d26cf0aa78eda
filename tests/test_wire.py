"""serve.wire's counts of what a request declares, against protobuf's own encoding: exact for ids of
every varint length (a packed id takes 1 to 10 bytes), so the node limit refuses what is over it and
nothing under it. The count once took the continuation bytes for the elements: ids below 128 counted
zero, ids from 16,384 up twice, and the SDK's own 4,096-id chunks of a large graph were refused."""

from __future__ import annotations

import numpy as np
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import inference_pb2 as ipb
from serve.errors import InvalidArgument
from serve.wire import WireLimits, _Walk, check_infer, check_predict

LIMITS = WireLimits()


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    # every varint length: 1 byte (< 2^7) up to 9 (< 2^63), and negative ids (10 bytes)
    bits = rng.integers(0, 63, n)
    ids = rng.integers(0, 1 << 62, n) >> (62 - bits)
    ids[rng.random(n) < 0.05] *= -1
    return ids.astype(np.int64)


@pytest.mark.parametrize("seed", range(5))
def test_packed_counts_are_exact_for_every_varint_length(seed):
    rng = np.random.default_rng(seed)
    ids = _ids(rng, int(rng.integers(1, 3000)))
    buf = pb.PredictRequest(model="m", nodes=ids.tolist()).SerializeToString()
    w = _Walk(buf, LIMITS.max_fields)
    counted = sum(w.count(t, s, e, cap=LIMITS.max_nodes) for n, t, s, e in w.fields(0, len(buf)) if n == 3)
    assert counted == len(ids)


@pytest.mark.parametrize("low, high", [(0, 128), (16_384, 2_097_152), (2_097_152, 1 << 40)])
def test_the_node_limit_takes_exactly_its_count(low, high):
    # 4,096 ids pass and 4,097 are refused, whatever their size on the wire
    rng = np.random.default_rng(low)
    ok = rng.integers(low, high, LIMITS.max_nodes).tolist()
    check_predict(pb.PredictRequest(model="m", nodes=ok).SerializeToString(), LIMITS)
    tensor = ipb.ModelInferRequest.InferInputTensor(name="NODE_IDS", datatype="INT64", shape=[len(ok)])
    tensor.contents.int64_contents.extend(ok)
    check_infer(ipb.ModelInferRequest(model_name="m", inputs=[tensor]).SerializeToString(), LIMITS)
    over = [*ok, low]
    with pytest.raises(InvalidArgument, match="more than the limit of 4096"):
        check_predict(pb.PredictRequest(model="m", nodes=over).SerializeToString(), LIMITS)
    tensor.contents.int64_contents.append(low)
    tensor.shape[0] += 1
    with pytest.raises(InvalidArgument, match="more than the limit of 4096"):
        check_infer(ipb.ModelInferRequest(model_name="m", inputs=[tensor]).SerializeToString(), LIMITS)


def test_new_node_neighbours_are_counted_exactly():
    limits = WireLimits(max_new_node_edges=1000)
    nbrs = list(range(20_000, 21_000))  # three bytes each
    ok = pb.PredictRequest(model="m", new_nodes=[pb.NewNode(neighbors=nbrs)]).SerializeToString()
    check_predict(ok, limits)
    over = pb.PredictRequest(model="m", new_nodes=[pb.NewNode(neighbors=[*nbrs, 5])]).SerializeToString()
    with pytest.raises(InvalidArgument, match="more than the limit of 1000"):
        check_predict(over, limits)
