"""Inline batches (``--inline-max-targets``) on and off, side by side, over gRPC.

For each model and client concurrency, alternating rounds start a fresh server (in this process,
its own event-loop thread; projections warmed) with each ``inline_max_targets`` of ``--inline`` (default 0,
8 and the CPU default, 256), and a
client process sends single-node ``Predict`` requests of random nodes from ``N`` concurrent asyncio
tasks for ``--seconds``. Reported per round: node predictions per second, latency p50 / p99 and
the mean batch size the server formed. Concurrency 1 is the sequential single-node case.

    python benchmarks/serve.py --datasets amazon_computers --models gcn,shadow-gcn --cache-dir DIR --train-only
    python benchmarks/inline.py --repo DIR/amazon_computers/repo --models gcn,shadow-gcn --concurrency 1,4,16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CLIENT = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[6])
import grpc, numpy as np
from clients._gen import gnnserve_pb2 as pb, gnnserve_pb2_grpc as pbg
addr, model, conc, secs, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])

async def main():
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = pbg.GnnServiceStub(ch)
        lat, batch = [], []
        async def worker(i):
            rng = np.random.default_rng(i)
            end = time.perf_counter() + secs
            while time.perf_counter() < end:
                req = pb.PredictRequest(model=model, nodes=[int(rng.integers(0, n))], return_probabilities=False)
                t = time.perf_counter()
                r = await stub.Predict(req)
                lat.append(1e3 * (time.perf_counter() - t))
                batch.append(r.timing.batch_size)
        for i in range(20):
            await stub.Predict(pb.PredictRequest(model=model, nodes=[i % n]))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(conc)))
        el = time.perf_counter() - t0
        print(json.dumps({"nodes_per_s": len(lat) / el, "p50": float(np.percentile(lat, 50)),
                          "p99": float(np.percentile(lat, 99)), "batch": float(np.mean(batch))}))

asyncio.run(main())
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="a model repository (checkpoint directories)")
    ap.add_argument("--models", required=True, help="comma-separated model names in the repository")
    ap.add_argument("--concurrency", default="1,4,16", help="concurrent client tasks")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--inline", default="0,8,256",
                    help="comma-separated inline_max_targets, one server each per round (0 = off; 256 is the CPU "
                         "default, serve.runtime.INLINE_MAX_TARGETS)")
    ap.add_argument("--data", action="append", default=[],
                    help="a dataset file the checkpoints were trained on, where the path they recorded does not exist "
                         "(a lent GPU machine); repeatable")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="the models' device (cuda: the default inline bound there is 8, unmeasured before this option)")
    args = ap.parse_args(argv)
    values = [int(v) for v in args.inline.split(",") if v.strip()]

    from serve.runtime import RuntimeOptions
    from serve.server import BackgroundServer, ServerConfig

    print("## Inline batches on and off (`benchmarks/inline.py`)\n")
    print(f"`python benchmarks/inline.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the start; device {args.device}; single-node requests for {args.seconds:g} s "
          "per cell\n")
    print("| model | clients | round | inline max targets | nodes/s | p50 ms | p99 ms | mean batch |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for conc in [int(c) for c in args.concurrency.split(",") if c]:
            for rnd in range(args.rounds):
                for inline in values[rnd % len(values):] + values[:rnd % len(values)]:  # rotated: drift falls on all
                    cfg = ServerConfig(repo=args.repo, port=0, poll_s=0, data_paths=args.data,
                                       runtime=RuntimeOptions(warm_projections=True, inline_max_targets=inline,
                                                              device=args.device))
                    with BackgroundServer(cfg) as srv:
                        n = srv.server.registry.get(model).graph.num_nodes
                        out = subprocess.run([sys.executable, "-c", CLIENT, srv.address, model, str(conc),
                                              str(args.seconds), str(n), str(REPO)],
                                             capture_output=True, text=True, timeout=300 + 2 * args.seconds)
                    if out.returncode != 0:
                        raise RuntimeError(f"client failed: {out.stderr[-2000:]}")
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    print(f"| {model} | {conc} | {rnd + 1} | {inline or 'off'} | {r['nodes_per_s']:,.0f} | "
                          f"{r['p50']:.2f} | {r['p99']:.2f} | {r['batch']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
