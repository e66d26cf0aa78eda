"""The hostile-client battery with counts (issue 23): what each attack costs a real server.

Runs ``gnnserve serve`` subprocesses on loopback (their resident set is read from /proc while the
attack runs) over the two tiny test models and a 20,000-node graph with a hub linked to every node.
For each scenario: requests sent, answers by status code, the server's peak RSS growth, health-check
latency during the attack (where the attack targets the event loop), and whether the server still
answers correctly afterwards (probes compared with reference numbers computed without the server).
Prints one markdown table (docs/RELIABILITY.md holds the figures of the last run).

    PYTHONPATH=. python benchmarks/hostile.py [--repo DIR] [--fuzz 1000] [--names 500] [--seconds 4]

``--quick`` runs every scenario at a small size (the suite's smoke test).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clients._gen import gnnserve_pb2 as pb  # noqa: E402
from clients._gen import inference_pb2 as ipb  # noqa: E402
from tests.hostile_support import INFER, PREDICT, PeakRss, hub_dataset, id_bomb, neighbour_bomb, raw_call  # noqa: E402
from tests.reliability_support import answers_match  # noqa: E402

ROWS: list[dict] = []


def row(scenario: str, sent: int, codes: Counter, rss_mb: float | None, health_ms: str, note: str) -> None:
    ROWS.append({"scenario": scenario, "sent": sent, "codes": codes, "rss": rss_mb, "health": health_ms,
                 "note": note})
    print(f"  {scenario}: sent {sent}, {dict(codes)}, RSS +{rss_mb} MB, health {health_ms}; {note}", flush=True)


def table() -> str:
    out = ["| scenario | requests | answers by code | peak RSS growth | health check p50 / p99 | notes |",
           "|---|---:|---|---:|---|---|"]
    for r in ROWS:
        codes = ", ".join(f"{k} {v}" for k, v in sorted(r["codes"].items()))
        rss = "-" if r["rss"] is None else f"{r['rss']:.0f} MB"
        out.append(f"| {r['scenario']} | {r['sent']} | {codes} | {rss} | {r['health']} | {r['note']} |")
    return "\n".join(out)


def code_of(err: grpc.RpcError | None) -> str:
    return "OK" if err is None else err.code().name


def probe(ch: grpc.Channel, repo: Path, ds, model: str = "gcn", node: int = 3) -> bool:
    resp, err = raw_call(ch, PREDICT, pb.PredictRequest(model=model, nodes=[node], return_probabilities=True)
                         .SerializeToString())
    return err is None and answers_match(pb.PredictResponse.FromString(resp), [node], repo, ds, model)


def health_latency(ch: grpc.Channel, stop: threading.Event, out: list[float]) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(ch)
    while not stop.is_set():
        t0 = time.perf_counter()
        stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=60)
        out.append(1e3 * (time.perf_counter() - t0))
        time.sleep(0.003)


def pct(xs: list[float]) -> str:
    return f"{np.percentile(xs, 50):.1f} / {np.percentile(xs, 99):.1f} ms" if xs else "-"


# ------------------------------------------------------------------------------- scenarios
def bombs(srv, ch, repo, ds, n: int, reps: int) -> None:
    """Requests that declare far more than they weigh: ids of one byte each, and KServe outputs repeated."""
    for method in (PREDICT, INFER):
        data = id_bomb(method, "gcn", n)
        codes: Counter = Counter()
        with PeakRss(srv.proc.pid) as mem:
            t0 = time.perf_counter()
            for _ in range(reps):
                codes[code_of(raw_call(ch, method, data)[1])] += 1
            took = (time.perf_counter() - t0) / reps
        row(f"{method.rsplit('/', 1)[-1]}: {n:,} one-byte ids ({len(data) / 1e6:.0f} MB)", reps, codes,
            (mem.peak - mem.before) / 1e6, "-", f"{1e3 * took:.0f} ms per refusal; probe correct: "
            f"{probe(ch, repo, ds)}")
    req = ipb.ModelInferRequest(model_name="gcn")
    req.inputs.add(name="NODE_IDS", datatype="INT64", shape=[4096])
    req.raw_input_contents.append((np.arange(4096, dtype=np.int64) % 800).tobytes())
    for _ in range(100_000):
        req.outputs.add(name="EMBEDDINGS")
    data = req.SerializeToString()
    codes = Counter()
    with PeakRss(srv.proc.pid) as mem:
        for _ in range(reps):
            codes[code_of(raw_call(ch, INFER, data)[1])] += 1
    row(f"ModelInfer: 4,096 ids, EMBEDDINGS requested 100,000 times ({len(data) / 1e6:.1f} MB)", reps, codes,
        (mem.peak - mem.before) / 1e6, "-", f"probe correct: {probe(ch, repo, ds)}")
    req2 = neighbour_bomb("shadow")
    codes = Counter()
    with PeakRss(srv.proc.pid) as mem:
        for _ in range(reps):
            codes[code_of(raw_call(ch, PREDICT, req2.SerializeToString())[1])] += 1
    row("Predict: 200 new nodes x 600 neighbours (120,000 edges)", reps, codes, (mem.peak - mem.before) / 1e6, "-",
        f"probe correct: {probe(ch, repo, ds, 'shadow')}")


def fuzz(srv, ch, repo, ds, count: int) -> None:
    """Random and mutated bytes on Predict and ModelInfer; a probe compared with the reference every 50
    (every tenth of them when there are fewer)."""
    rng = np.random.default_rng(1)
    valid = [pb.PredictRequest(model="gcn", nodes=[1, 2, 3], sampling_width=2).SerializeToString(),
             pb.PredictRequest(model="shadow", nodes=[5], ppr_budget=8).SerializeToString(),
             ipb.ModelInferRequest(model_name="gcn", raw_input_contents=[np.arange(3, dtype=np.int64).tobytes()],
                                   inputs=[ipb.ModelInferRequest.InferInputTensor(
                                       name="NODE_IDS", datatype="INT64", shape=[3])]).SerializeToString()]
    codes: Counter = Counter()
    wrong = probes = 0
    every = max(1, min(50, count // 10))
    with PeakRss(srv.proc.pid) as mem:
        for i in range(count):
            if rng.random() < 0.3:
                data = rng.bytes(int(rng.integers(0, 256)))
            else:
                buf = bytearray(valid[int(rng.integers(0, len(valid)))])
                for _ in range(int(rng.integers(1, 5))):
                    pos = int(rng.integers(0, max(1, len(buf))))
                    op = rng.integers(0, 3)
                    if op == 0 and buf:
                        buf[pos] ^= int(rng.integers(1, 256))
                    elif op == 1:
                        del buf[pos:]
                    else:
                        buf[pos:pos] = rng.bytes(int(rng.integers(1, 12)))
                data = bytes(buf)
            codes[code_of(raw_call(ch, PREDICT if i % 2 == 0 else INFER, data, timeout=60)[1])] += 1
            if i % every == every - 1:
                probes += 1
                wrong += not probe(ch, repo, ds)
    row("random / mutated bytes on Predict and ModelInfer", count, codes, (mem.peak - mem.before) / 1e6, "-",
        f"{probes} probes, {wrong} wrong")


def names(srv, ch, metrics_port: int, count: int) -> None:
    """Made-up model names on ModelReady, ModelMetadata and Predict: metric series must not grow."""
    def series() -> int:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        return sum(1 for line in text.splitlines() if line.startswith("gnnserve_requests_total{"))

    before = series()
    codes: Counter = Counter()
    for i in range(count):
        name = f"made-up-{i}"
        codes[code_of(raw_call(ch, "/inference.GRPCInferenceService/ModelReady",
                               ipb.ModelReadyRequest(name=name).SerializeToString())[1])] += 1
        codes[code_of(raw_call(ch, PREDICT, pb.PredictRequest(model=name, nodes=[1]).SerializeToString())[1])] += 1
    row("made-up model names (ModelReady + Predict)", 2 * count, codes, None, "-",
        f"gnnserve_requests_total series {before} -> {series()}")


def heavy(hub_repo: Path, seconds: float) -> None:
    """Exact requests on a hub (one target each: the old inline rule ran them on the event loop)."""
    from tests.serving import ServerProcess

    with ServerProcess(hub_repo, "--poll-s", "0", "--activation-cache-bytes", "0") as srv, \
            grpc.insecure_channel(srv.address) as ch:
        idle: list[float] = []
        stop = threading.Event()
        t = threading.Thread(target=health_latency, args=(ch, stop, idle))
        t.start()
        time.sleep(min(2.0, seconds))
        stop.set()
        t.join()
        busy: list[float] = []
        stop = threading.Event()
        t = threading.Thread(target=health_latency, args=(ch, stop, busy))
        t.start()
        codes: Counter = Counter()
        took: list[float] = []
        t_end = time.monotonic() + seconds
        with PeakRss(srv.proc.pid) as mem:
            while time.monotonic() < t_end:
                t0 = time.perf_counter()
                codes[code_of(raw_call(ch, PREDICT, pb.PredictRequest(model="hub", nodes=[0], sampling_width=0)
                                       .SerializeToString())[1])] += 1
                took.append(1e3 * (time.perf_counter() - t0))
        stop.set()
        t.join()
        row("exact-width requests on a hub linked to all 20,000 nodes, one client", sum(codes.values()), codes,
            (mem.peak - mem.before) / 1e6, f"idle {pct(idle)}; under attack {pct(busy)}",
            f"heavy request p50 {np.median(took):.0f} ms; they run in the model's worker, not on the loop")


def flood(repo: Path, ds, count: int) -> None:
    """More concurrent RPCs than --max-concurrent-rpcs, each held in the batcher for 300 ms."""
    from tests.serving import ServerProcess

    with ServerProcess(repo, "--poll-s", "0", "--max-concurrent-rpcs", "64", "--max-delay-ms", "300",
                       "--inline-max-targets", "0") as srv, grpc.insecure_channel(srv.address) as ch:
        fn = ch.unary_unary(PREDICT, request_serializer=None, response_deserializer=None)
        data = pb.PredictRequest(model="gcn", nodes=[7]).SerializeToString()
        codes: Counter = Counter()
        with PeakRss(srv.proc.pid) as mem:
            futs = [fn.future(data, timeout=60) for _ in range(count)]
            for f in futs:
                try:
                    f.result()
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    codes[exc.code().name] += 1
        row(f"{count} concurrent Predicts, --max-concurrent-rpcs 64", count, codes, (mem.peak - mem.before) / 1e6,
            "-", f"probe correct: {probe(ch, repo, ds)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=None, help="repository of the tiny models (trained there if empty)")
    ap.add_argument("--fuzz", type=int, default=1000)
    ap.add_argument("--names", type=int, default=500)
    ap.add_argument("--ids", type=int, default=40_000_000, help="ids declared by each id bomb")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--flood", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="every scenario at a small size (smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.fuzz, args.names, args.ids, args.reps, args.seconds, args.flood = 40, 10, 200_000, 1, 1.0, 80
    from tests.serving import ServerProcess, ensure_tiny_repo, make_repo, tiny_dataset

    ds = tiny_dataset()
    with tempfile.TemporaryDirectory(prefix="gnnserve-hostile-") as tmpd:
        tmp = Path(tmpd)
        repo = ensure_tiny_repo(args.repo or tmp / "repo", ds)
        hub_repo = tmp / "hub"
        print("training a GCN on the 20,000-node hub graph ...", flush=True)
        make_repo(hub_repo, hub_dataset(), {"hub": "gcn"}, epochs=5, patience=5, knob_widths=[0, 4])
        t0 = time.time()
        from tests.serving import free_port

        metrics_port = free_port()
        with ServerProcess(repo, "--poll-s", "0", "--metrics-port", str(metrics_port)) as srv, \
                grpc.insecure_channel(srv.address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            bombs(srv, ch, repo, ds, args.ids, args.reps)
            fuzz(srv, ch, repo, ds, args.fuzz)
            names(srv, ch, metrics_port, args.names)
        heavy(hub_repo, args.seconds)
        flood(repo, ds, args.flood)
        print(f"\n(scenarios took {time.time() - t0:.0f} s)\n")
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
