"""One request's latency by protocol, side by side on one server: the native gRPC ``Predict``, KServe's gRPC
``ModelInfer``, and KServe's HTTP/REST ``infer`` with JSON tensors and with Triton's binary tensor data, each next
to its transport's no-op floor (the gRPC health check; HTTP ``GET /v2/health/live``).

A ``gnnserve serve --http-port`` subprocess serves the repository; this process is the client, one request at a
time over one kept-alive connection per protocol (raw gRPC stubs, ``http.client``: what the protocols cost, not a
client library's extras). Every request asks for the labels only, of ``--nodes`` random node ids. Rounds
interleave the variants in a shuffled order; the table gives each variant's p50 and p99 over all rounds, and the
median over rounds of its p50 against the native call's and against its own transport's floor (ratios within one
run: the machine is shared and noisy). Before timing, the labels of one node list are checked equal across the
four protocols.

    python benchmarks/protocols.py --repo REPO --model gcn [--nodes 1] [--requests 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_runtime import REPO, server_process

VARIANTS = ("grpc-noop", "native", "kserve-grpc", "http-noop", "http-json", "http-binary")
FLOOR = {"native": "grpc-noop", "kserve-grpc": "grpc-noop", "http-json": "http-noop", "http-binary": "http-noop"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Clients:
    """One connection per protocol to ``127.0.0.1``; each ``call_*`` sends one request for ``ids``' labels."""

    def __init__(self, grpc_port: int, http_port: int, model: str) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from clients._gen import gnnserve_pb2, gnnserve_pb2_grpc, inference_pb2, inference_pb2_grpc

        self.model = model
        self.pb, self.ipb, self.hpb = gnnserve_pb2, inference_pb2, health_pb2
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.native = gnnserve_pb2_grpc.GnnServiceStub(self.channel)
        self.kserve = inference_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.http = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
        self.path = f"/v2/models/{model}/infer"

    def close(self) -> None:
        self.http.close()
        self.channel.close()

    def _post(self, body: bytes, headers: dict[str, str]) -> http.client.HTTPResponse:
        self.http.request("POST", self.path, body=body, headers=headers)
        r = self.http.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        return r

    def call_grpc_noop(self, ids: np.ndarray) -> None:
        self.health.Check(self.hpb.HealthCheckRequest(service=""), timeout=60)

    def call_http_noop(self, ids: np.ndarray) -> None:
        self.http.request("GET", "/v2/health/live")
        r = self.http.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"/v2/health/live answered {r.status}")

    def call_native(self, ids: np.ndarray) -> np.ndarray:
        r = self.native.Predict(self.pb.PredictRequest(model=self.model, nodes=ids.tolist()), timeout=60)
        return np.asarray(r.labels, dtype=np.int64)

    def call_kserve_grpc(self, ids: np.ndarray) -> np.ndarray:
        ipb = self.ipb
        req = ipb.ModelInferRequest(model_name=self.model,
                                    inputs=[ipb.ModelInferRequest.InferInputTensor(name="NODE_IDS", datatype="INT64",
                                                                                   shape=[len(ids)])],
                                    outputs=[ipb.ModelInferRequest.InferRequestedOutputTensor(name="LABELS")],
                                    raw_input_contents=[ids.astype("<i8").tobytes()])
        r = self.kserve.ModelInfer(req, timeout=60)
        return np.frombuffer(r.raw_output_contents[0], dtype="<i8")

    def call_http_json(self, ids: np.ndarray) -> np.ndarray:
        body = json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [len(ids)],
                                       "data": ids.tolist()}],
                           "outputs": [{"name": "LABELS"}]}).encode()
        r = self._post(body, {"Content-Type": "application/json"})
        out = json.loads(r.read())["outputs"][0]
        return np.asarray(out["data"], dtype=np.int64)

    def call_http_binary(self, ids: np.ndarray) -> np.ndarray:
        raw = ids.astype("<i8").tobytes()
        header = json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [len(ids)],
                                         "parameters": {"binary_data_size": len(raw)}}],
                             "outputs": [{"name": "LABELS", "parameters": {"binary_data": True}}]}).encode()
        r = self._post(header + raw, {"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(len(header))})
        body = r.read()
        n = int(r.getheader("Inference-Header-Content-Length"))
        return np.frombuffer(body[n:], dtype="<i8")

    def fn(self, variant: str) -> Callable[[np.ndarray], object]:
        return getattr(self, "call_" + variant.replace("-", "_"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="a model repository")
    ap.add_argument("--data", action="append", default=[], help="dataset path(s), as for gnnserve serve --data")
    ap.add_argument("--model", required=True)
    ap.add_argument("--nodes", type=int, default=1, help="node ids per request")
    ap.add_argument("--requests", type=int, default=300, help="requests per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; one of {', '.join(VARIANTS)}")
    if args.nodes < 1 or args.requests < 1 or args.rounds < 1:
        ap.error("--nodes, --requests and --rounds must be >= 1")

    grpc_port, http_port = _free_port(), _free_port()
    serve_args = ["--repo", args.repo, "--port", str(grpc_port), "--http-port", str(http_port), "--poll-s", "0",
                  "--no-progress", *[x for d in args.data for x in ("--data", d)]]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix="gnnserve-protocols-"))
    rng = np.random.default_rng(args.seed)
    print(f"machine: {platform.node()} ({os.cpu_count()} CPUs), load average at start "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
          file=sys.stderr)
    with server_process(serve_args, env=env, log_path=tmp / "server.log") as ready_s:
        print(f"server ready in {ready_s:.1f} s", file=sys.stderr)
        clients = Clients(grpc_port, http_port, args.model)
        with contextlib.closing(clients):
            info = clients.native.GetModel(clients.pb.GetModelRequest(name=args.model), timeout=60)
            n = int(info.num_nodes)
            probe = rng.integers(0, n, size=max(args.nodes, 16))
            answers = {v: clients.fn(v)(probe) for v in ("native", "kserve-grpc", "http-json", "http-binary")}
            for v, got in answers.items():
                if not np.array_equal(got, answers["native"]):
                    raise SystemExit(f"{v}'s labels differ from the native call's: {got[:8]} vs {answers['native'][:8]}")
            print(f"labels of {len(probe)} nodes equal over the four protocols", file=sys.stderr)
            for v in variants:  # warm every path
                for _ in range(20):
                    clients.fn(v)(rng.integers(0, n, size=args.nodes))
            lat: dict[str, list[float]] = {v: [] for v in variants}
            p50s: dict[str, list[float]] = {v: [] for v in variants}
            order = list(variants)
            for _ in range(args.rounds):
                random.Random(int(rng.integers(1 << 31))).shuffle(order)
                for v in order:
                    call = clients.fn(v)
                    ids = rng.integers(0, n, size=(args.requests, args.nodes))
                    times = []
                    for row in ids:
                        t0 = time.perf_counter()
                        call(row)
                        times.append(time.perf_counter() - t0)
                    lat[v] += times
                    p50s[v].append(statistics.median(times))

    def ratio(v: str, ref: str) -> str:
        if ref not in p50s or v not in p50s:
            return "-"
        return f"{statistics.median(a / b for a, b in zip(p50s[v], p50s[ref], strict=True)):.2f}x"

    print(f"\n{args.model}, {args.nodes} node(s) per request, {args.requests} requests x {args.rounds} rounds per "
          "variant, labels only\n")
    print("| variant | p50 (us) | p99 (us) | p50 / native | p50 / its floor |")
    print("|---|---:|---:|---:|---:|")
    for v in variants:
        a = np.asarray(lat[v]) * 1e6
        print(f"| {v} | {np.percentile(a, 50):.0f} | {np.percentile(a, 99):.0f} | {ratio(v, 'native')} | "
              f"{ratio(v, FLOOR[v]) if v in FLOOR else '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
