"""Helpers of the hostile-client battery (tests/test_hostile.py, benchmarks/hostile.py): hand-made
protobuf bytes, raw gRPC calls that bypass client-side serialization, and a peak-RSS sampler."""

from __future__ import annotations

import threading
import time

import grpc


def varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def raw_call(channel: grpc.Channel, method: str, data: bytes, timeout: float = 120) -> tuple[bytes | None, grpc.RpcError | None]:
    fn = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        return fn(data, timeout=timeout), None
    except grpc.RpcError as exc:
        return None, exc


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class PeakRss:
    """The largest resident set of ``pid`` seen while the block runs (sampled every 2 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.002)

    def __enter__(self) -> PeakRss:
        self.before = rss_bytes(self.pid)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_bytes(self.pid))




PREDICT = "/gnnserve.v1.GnnService/Predict"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def id_bomb(method: str, model: str, n: int) -> bytes:
    """A request declaring ``n`` node ids of one byte each (packed ``nodes`` / ``int64_contents``)."""
    ids = varint(3 << 3 | 2) + varint(n) + b"\x01" * n
    if method == PREDICT:
        return field(1, model.encode()) + ids
    tensor = field(1, b"NODE_IDS") + field(2, b"INT64") + field(3, varint(n)) + field(5, ids)
    return field(1, model.encode()) + field(5, tensor)


def hub_dataset(num_nodes: int = 20_000, seed: int = 11):
    """A synthetic graph whose node 0 is linked to every other node: an exact 2-layer pass on it
    aggregates the whole graph's edges, a sampled one a handful."""
    import numpy as np

    from kernels.datasets import synthetic_sbm
    from kernels.graph import CSRGraph

    ds = synthetic_sbm(num_nodes, num_classes=4, avg_degree=10, num_features=16, seed=seed, name="hub")
    g = ds.graph
    src = np.repeat(np.arange(g.num_nodes, dtype=np.int64), np.diff(g.indptr))
    others = np.arange(1, g.num_nodes, dtype=np.int64)
    ei = np.stack([np.concatenate([src, np.zeros_like(others)]), np.concatenate([g.indices, others])])
    ds.graph = CSRGraph.from_edge_index(ei, g.num_nodes, symmetrize=True)
    return ds


def neighbour_bomb(model: str, nodes: int = 200, per_node: int = 600, num_nodes: int = 800, features: int = 16):
    """A PredictRequest of ``nodes`` new nodes with ``per_node`` distinct neighbours each: every node
    within its own limit, the request over the per-request total."""
    import numpy as np

    from clients._gen import gnnserve_pb2 as pb

    rng = np.random.default_rng(0)
    req = pb.PredictRequest(model=model)
    for _ in range(nodes):
        nn = req.new_nodes.add()
        nn.features.extend([0.1] * features)
        nn.neighbors.extend(rng.choice(num_nodes, per_node, replace=False).tolist())
    return req
