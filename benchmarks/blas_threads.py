"""The compiled CPU forwards with their BLAS pool on 1 thread against more, idle and beside busy processes:
where ``gnnserve serve --blas-threads`` comes from.

The compiled forwards (``kernels.fused_forward``: every CPU batch a server forms) do their dense products
with numba's ``np.dot``, which calls SciPy's OpenBLAS. OpenBLAS splits a product over more of its pool's
threads as the product grows, so from a few targets on a product takes the whole pool, and with the pool at the machine's core
count one other runnable thread (another request, the event loop, another process) leaves a thread of
the product waiting for a core: on an H100 machine's 16 cores the compiled shaDow path took 0.82 ms for 8
targets and 7.9 ms for 16 (docs/BENCHMARKS.md, "GPU: an H100 machine, 2026-11-27").

One process loads the repository the way the server does (``--device cpu``) and times
``ModelRuntime.process`` on batches of ``B`` random distinct targets, the pool set by
``kernels.threads.set_blas_threads`` before each variant, the variants interleaved round by round on the
same batches (each count first in turn); ``--busy K`` repeats everything beside K processes that spin (``while True: pass``), which is
what other requests and other processes are to the product's threads. Reported: the median over rounds of
the mean ms per batch and of the 90th percentile of the batches, and each thread count over 1.

    python benchmarks/blas_threads.py --repo DIR/amazon_computers/repo --data ../shared/data/amazon_computers.npz \\
        --models gcn,shadow-gcn --threads 1,2 --busy 0,1
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_runtime

VARIANTS = {"cpu": {"device": "cpu"}}


def _spinners(k: int) -> list[subprocess.Popen[bytes]]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]
    time.sleep(0.3 if k else 0)
    return procs


def main(argv: list[str] | None = None) -> int:
    ap = bench_runtime.parser(__doc__, VARIANTS, "cpu", batches="1,8,16,64,256,1024", sets=30)
    ap.add_argument("--threads", default=f"1,{len(os.sched_getaffinity(0))}", help="BLAS thread counts to compare")
    ap.add_argument("--busy", default="0,1", help="spinning processes beside the timed one, per condition")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from kernels.threads import blas_pools, set_blas_threads

    counts = [int(t) for t in args.threads.split(",") if t]
    busy = [int(b) for b in args.busy.split(",") if b]
    servers = bench_runtime.start_variants(ap, VARIANTS, "cpu", args.repo, args.data)
    sizes = [int(b) for b in args.batches.split(",") if b]
    rng = np.random.default_rng(0)
    pools = ", ".join(f"{p.internal_api} {p.version} ({Path(p.path).parent.name})" for p in blas_pools())
    print("## The compiled forwards' BLAS pool (`benchmarks/blas_threads.py`)\n")
    print(f"`python benchmarks/blas_threads.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; BLAS: {pools}; ms per `ModelRuntime.process` call (compiled CPU path), "
          f"median over {args.rounds} interleaved rounds of {args.sets} batches of the mean and of the p90\n")
    others = [c for c in counts if c != counts[0]]
    print("| model | busy processes | targets | " + " | ".join(f"{c} thr mean | {c} thr p90" for c in counts)
          + "".join(f" | {c} / {counts[0]} mean | {c} / {counts[0]} p90" for c in others) + " |")
    print("|---|---|---|" + "---|" * (2 * len(counts) + 2 * len(others)))
    server = servers["cpu"]
    try:
        for model in [m for m in args.models.split(",") if m]:
            rt = server.server.registry.get(model)
            with torch.inference_mode():
                rt.warm_projections()
            lim = rt.limits
            width, budget = lim.default_sampling_width, lim.default_ppr_budget
            for k in busy:
                spin = _spinners(k)
                try:
                    for size in sizes:
                        size = min(size, lim.num_nodes)
                        means: dict[int, list[float]] = {c: [] for c in counts}
                        p90s: dict[int, list[float]] = {c: [] for c in counts}
                        bench_runtime.process(rt, np.arange(size, dtype=np.int64), width, budget)  # untimed
                        for r in range(args.rounds):
                            batches = [np.sort(rng.choice(lim.num_nodes, size, replace=False)).astype(np.int64)
                                       for _ in range(args.sets)]
                            for c in counts[r % len(counts):] + counts[:r % len(counts)]:  # each first in turn
                                after = set_blas_threads(c)
                                if not after or any(p.threads != c for p in after):
                                    raise SystemExit(f"the BLAS pools did not take {c} threads: {after}")
                                ts = []
                                for nodes in batches:
                                    t0 = time.perf_counter()
                                    bench_runtime.process(rt, nodes, width, budget)
                                    ts.append((time.perf_counter() - t0) * 1e3)
                                means[c].append(statistics.fmean(ts))
                                p90s[c].append(float(np.percentile(ts, 90)))
                        m = {c: statistics.median(v) for c, v in means.items()}
                        p = {c: statistics.median(v) for c, v in p90s.items()}
                        base = counts[0]
                        print(f"| {model} | {k} | {size} | " + " | ".join(f"{m[c]:.3f} | {p[c]:.3f}" for c in counts)
                              + "".join(f" | {m[c] / m[base]:.2f} | {p[c] / p[base]:.2f}" for c in others) + " |",
                              flush=True)
                finally:
                    for s in spin:
                        s.kill()
                        s.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
