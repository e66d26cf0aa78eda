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
from serve.wire import WireLimits, _Walk, check_infer, check_predict, check_update

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


def _infer_request(tensors: list[tuple[str, str, np.ndarray]], raw: bool, raw_first: bool = False) -> bytes:
    """A serialised ModelInferRequest of ``(name, datatype, values)`` inputs; ``raw_first``: the raw entries
    come before the inputs on the wire (protobuf accepts fields in any order)."""
    req = ipb.ModelInferRequest(model_name="m")
    for name, datatype, values in tensors:
        t = req.inputs.add(name=name, datatype=datatype, shape=list(values.shape))
        if raw:
            req.raw_input_contents.append(values.tobytes())
        elif datatype == "FP32":
            t.contents.fp32_contents.extend(values.ravel().tolist())
        else:
            t.contents.int64_contents.extend(values.ravel().tolist())
    if not raw_first:
        return req.SerializeToString()
    rest = ipb.ModelInferRequest(model_name="m", inputs=req.inputs).SerializeToString()
    return ipb.ModelInferRequest(raw_input_contents=req.raw_input_contents).SerializeToString() + rest


@pytest.mark.parametrize("raw, raw_first", [(True, False), (True, True), (False, False)])
def test_infer_inputs_count_against_their_own_limits(raw, raw_first):
    limits = WireLimits(max_new_node_edges=1000)
    m = 2000  # new nodes of 64 features: 128,000 floats, none of them node ids
    feats = np.ones((m, 64), "<f4")
    ids = np.arange(LIMITS.max_nodes - m, dtype="<i8")
    counts = np.full(m, 0, "<i8")
    counts[:10] = 100
    nbrs = np.arange(1000, dtype="<i8")
    ok = [("NODE_IDS", "INT64", ids), ("NEW_NODE_FEATURES", "FP32", feats), ("NEW_NODE_NEIGHBOR_COUNTS", "INT64", counts),
          ("NEW_NODE_NEIGHBORS", "INT64", nbrs), ("NEW_NODE_EDGE_WEIGHTS", "FP32", np.ones(1000, "<f4"))]
    check_infer(_infer_request(ok, raw, raw_first), limits)
    # ids + one count per new node: the node limit
    over = [("NODE_IDS", "INT64", np.arange(LIMITS.max_nodes - m + 1, dtype="<i8")), *ok[1:]]
    with pytest.raises(InvalidArgument, match="at least 4097 nodes, more than the limit of 4096"):
        check_infer(_infer_request(over, raw, raw_first), limits)
    # neighbours and weights: the new-node edge limit, each
    for i, name in ((3, "NEW_NODE_NEIGHBORS"), (4, "NEW_NODE_EDGE_WEIGHTS")):
        over = list(ok)
        over[i] = (name, ok[i][1], np.ones(1001, ok[i][2].dtype))
        with pytest.raises(InvalidArgument, match=f"input {name} has at least 1001 values, more than the limit of 1000"):
            check_infer(_infer_request(over, raw, raw_first), limits)
    # features: max_nodes x max_features
    small = WireLimits(max_nodes=4096, max_features=16)
    with pytest.raises(InvalidArgument, match="input NEW_NODE_FEATURES has at least"):
        check_infer(_infer_request(ok[1:2], raw, raw_first), small)


@pytest.mark.parametrize("raw", [True, False])
def test_unknown_inputs_count_as_node_ids(raw):
    # an unknown name (refused after the parse) or a repeated one cannot carry more than the node limit
    big = np.ones(LIMITS.max_nodes + 1, "<i8")
    for name in ("OTHER", "x" * 100, ""):
        with pytest.raises(InvalidArgument, match="more than the limit of 4096"):
            check_infer(_infer_request([(name, "INT64", big)], raw), LIMITS)
    half = np.ones(LIMITS.max_nodes // 2 + 1, "<i8")
    with pytest.raises(InvalidArgument, match="more than the limit of 4096"):
        check_infer(_infer_request([("NODE_IDS", "INT64", half), ("NODE_IDS", "INT64", half)], raw), LIMITS)
    # raw entries without an input count as ids too
    extra = ipb.ModelInferRequest(model_name="m", raw_input_contents=[big.tobytes()]).SerializeToString()
    with pytest.raises(InvalidArgument, match="more than the limit of 4096"):
        check_infer(extra, LIMITS)


def test_infer_walk_stays_bounded_on_many_inputs():
    # a message of many tiny inputs hits the field budget, not memory or time
    req = ipb.ModelInferRequest(model_name="m", inputs=[ipb.ModelInferRequest.InferInputTensor(name="A")] * 1)
    one = req.inputs[0].SerializeToString()
    buf = b"".join(b"\x2a" + bytes([len(one)]) + one for _ in range(LIMITS.max_fields))
    with pytest.raises(InvalidArgument, match="fields"):
        check_infer(buf, LIMITS)


# ---------------------------------------------------------------------- UpdateGraph: --max-update-size on the bytes
def _varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1  # negative int64: ten bytes, as protobuf writes them
    while True:
        if v < 0x80:
            return bytes(out + bytes([v]))
        out.append(v & 0x7F | 0x80)
        v >>= 7


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _update_bytes(req: pb.UpdateGraphRequest, unpacked: bool) -> bytes:
    """``req`` serialised; ``unpacked``: its new nodes' neighbours and weights one field each (a valid encoding
    protobuf parses as the packed one)."""
    if not unpacked:
        return req.SerializeToString()
    rest = pb.UpdateGraphRequest()
    rest.CopyFrom(req)
    del rest.new_nodes[:]
    out = rest.SerializeToString()
    for nn in req.new_nodes:
        body = pb.NewNode(features=nn.features).SerializeToString()
        body += b"".join(_varint(2 << 3) + _varint(v) for v in nn.neighbors)
        body += b"".join(b"\x1d" + np.float32(w).tobytes() for w in nn.edge_weights)
        out += _field(4, body)
    return out


def _random_update(rng: np.random.Generator) -> pb.UpdateGraphRequest:
    req = pb.UpdateGraphRequest(model="m", request_id="r", expect_graph_version=int(rng.integers(0, 1 << 40)))
    for _ in range(int(rng.integers(0, 5))):
        req.features.add(node=int(rng.integers(0, 1 << 40)), features=rng.random(int(rng.integers(0, 8))).tolist())
    for _ in range(int(rng.integers(0, 6))):
        k = int(rng.integers(0, 40))
        nn = req.new_nodes.add(features=rng.random(4).tolist(), neighbors=_ids(rng, k).tolist())
        if rng.random() < 0.5:
            nn.edge_weights.extend(rng.random(k).tolist())
    for edges in (req.add_edges, req.remove_edges):
        for _ in range(int(rng.integers(0, 6))):
            e = edges.add(src=int(rng.integers(0, 1 << 20)), dst=-int(rng.integers(0, 1 << 62)))
            if rng.random() < 0.5:
                e.weight = 0.5
    return req


@pytest.mark.parametrize("unpacked", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_update_entries_are_counted_as_parse_update_counts_them(seed, unpacked):
    """check_update counts, from the bytes, exactly the entries serve.live.parse_update counts on the parsed request
    (feature rows, new nodes and their neighbours, removed and added edges; not features or weights): an update of
    that many entries passes a limit of as many and is refused by a limit of one less, with parse_update's message."""
    from serve.live import parse_update

    req = _random_update(np.random.default_rng(seed))
    buf = _update_bytes(req, unpacked)
    parsed = pb.UpdateGraphRequest.FromString(buf)
    assert parsed == req
    size = (len(req.features) + len(req.new_nodes) + sum(len(n.neighbors) for n in req.new_nodes)
            + len(req.add_edges) + len(req.remove_edges))
    if size == 0:
        return
    check_update(buf, WireLimits(max_update_size=size))
    with pytest.raises(InvalidArgument) as ei:
        parse_update(parsed, 1 << 41, 8, max_size=size - 1)
    want = ei.value.message
    assert want.startswith(f"this update has {size} entries")
    with pytest.raises(InvalidArgument) as ei:
        check_update(buf, WireLimits(max_update_size=size - 1))
    assert ei.value.message == want.replace("has ", "has at least ", 1), ei.value.message


def test_an_update_bomb_is_refused_from_a_look_at_its_bytes():
    """The hostile-client report's update: one new node of 60 million one-byte neighbour ids (60 MB, about 940 MB
    once parsed): refused from its length alone, and a message of many fields by the walk's budget."""
    limits = WireLimits()
    bomb = _field(1, b"gcn") + _field(4, _field(2, b"\x01" * 60_000_000))
    with pytest.raises(InvalidArgument, match=r"this update has at least \d+ entries .* more than --max-update-size "
                                              r"100000; split it into several updates"):
        check_update(bomb, limits)
    many = b"".join(_field(1, b"gcn") for _ in range(limits.max_update_fields + 1))  # no entries, all headers
    with pytest.raises(InvalidArgument, match="fields"):
        check_update(many, limits)
    # small messages are not read; a malformed one is left to protobuf's parse (INVALID_ARGUMENT there)
    check_update(b"\xff" * 100, limits)
    check_update(_field(4, _field(2, b"\x01" * 200_000))[:-1] + b"\xff\xff", WireLimits(max_update_size=300_000))
