"""A Predict's own new nodes (``PredictRequest.new_nodes``), in one process: what a batch of K new nodes costs per
stage, and the PPR pushes of a shaDow model's new nodes on one thread against parallel threads (``--shared``: every
new node of a batch with the same neighbours, the request that cost a batch time quadratic in its new nodes).

Models loaded as the server loads them (``serve.server.BackgroundServer``, the in-memory graph), each batch handed to
``ModelRuntime.process`` directly (no gRPC): ``--counts`` new nodes per batch, each with ``--neighbours`` random
neighbours and random normal features, new ones per batch. For a PPR model the variants run interleaved
in one loop (which goes first alternates): ``1-thread`` pushes the batch's new nodes one after another
(``kernels.ppr.ppr_new_nodes`` with ``threads=1``), ``parallel`` on its default workers; their answers are checked
equal; ``torch path`` is ``parallel`` with the batch forced onto the torch subgraph path (``subgraph-torch``, where
a shaDow model's new nodes ran until 2026-11-28; the compiled shaDow path takes them since), its answers checked
equal to rounding. A plain model has two (its new nodes take L-hop scopes, no push): ``-``, the path the runtime
chooses (``plain-compiled`` on a CPU since 2026-11-28), and ``torch path``. Reported: p50 of the whole batch and the
p50 of the runtime's own stages (subgraph, features, forward).

    python benchmarks/new_nodes.py --repo REPO --data amazon_computers.npz --models gcn,shadow-gcn
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "benchmarks"))  # bench_runtime (after REPO: benchmarks/serve.py is not serve)

import bench_runtime  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="a model repository (checkpoint directories)")
    ap.add_argument("--data", action="append", default=[], help="dataset path(s), as for gnnserve serve --data")
    ap.add_argument("--models", required=True, help="comma-separated model names in the repository")
    ap.add_argument("--counts", default="1,8,64,512", help="new nodes per batch (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=20, help="batches per count and variant (default: %(default)s)")
    ap.add_argument("--neighbours", type=int, default=5, help="each new node's neighbours (default: %(default)s)")
    ap.add_argument("--shared", action="store_true",
                    help="every new node of a batch lists the same neighbours (a hostile request: each of those rows "
                         "then holds an edge to every new node of the batch)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        counts = [int(c) for c in args.counts.split(",") if c]
    except ValueError:
        ap.error(f"--counts must be comma-separated integers, got {args.counts!r}")
    if not counts or min(counts) < 1 or args.reps < 1 or args.neighbours < 0:
        ap.error("--counts, --reps must be >= 1 and --neighbours >= 0")

    import kernels.ppr as kppr
    from kernels.threads import numba_threads
    from serve.batcher import WorkItem
    from serve.runtime import RuntimeOptions
    from serve.server import BackgroundServer, ServerConfig
    from serve.validation import NewNodeSpec, PredictCall

    server = BackgroundServer(ServerConfig(repo=args.repo, port=0, poll_s=0, data_paths=args.data,
                                           runtime=RuntimeOptions())).start()
    rng = np.random.default_rng(args.seed)
    parallel = kppr.ppr_new_nodes
    variants_of = {"1-thread": functools.partial(parallel, threads=1), "parallel": parallel, "torch path": parallel}
    print(f"numba threads {numba_threads()}; {args.neighbours} {'shared ' if args.shared else ''}neighbours per new node, "
          f"{args.reps} batches per cell")
    print("| model | new nodes | variant | p50 ms | per node ms | subgraph ms | features ms | forward ms |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    try:
        for model in [m for m in args.models.split(",") if m]:
            rt = server.server.registry.get(model)
            n = rt.graph.num_nodes
            ppr = rt.extractor == "ppr"
            names = list(variants_of) if ppr else ["-", "torch path"]
            f = rt.limits.num_features
            for k in counts:
                times: dict[str, list[float]] = {v: [] for v in names}
                stages: dict[str, list[list[float]]] = {v: [] for v in names}
                for rep in range(args.reps + 1):  # the first round untimed (first calls, scratch allocation)
                    specs = []
                    nbrs = None
                    for _ in range(k):
                        feats = rng.normal(size=f).astype(np.float32)
                        if nbrs is None or not args.shared:
                            nbrs = np.sort(rng.choice(n, min(args.neighbours, n), replace=False)).astype(np.int64)
                        specs.append(NewNodeSpec(feats, nbrs, None))
                    answers = []
                    for v in (names if rep % 2 else names[::-1]):
                        if ppr:
                            kppr.ppr_new_nodes = variants_of[v]
                        call = PredictCall("bench", np.zeros(0, np.int64), specs, 0, rt.limits.default_ppr_budget,
                                           "default", 0.0, True, False)
                        path = next(p for p in rt.paths if p.name == "subgraph-torch") if v == "torch path" else None
                        t0 = time.perf_counter()
                        res = rt.process([WorkItem(call, k, None, None, time.monotonic(),
                                                   bench_runtime._Pending())], path=path)[0]
                        dt = time.perf_counter() - t0
                        if isinstance(res, BaseException):
                            raise res
                        answers.append((v, res.probabilities))
                        if rep:
                            times[v].append(dt)
                            stages[v].append([res.timing[s] for s in ("subgraph", "features", "forward")])
                    same = [a for v, a in answers if v != "torch path"]
                    for a in same[1:]:
                        if not np.array_equal(a, same[0]):
                            raise SystemExit(f"{model}: the variants' answers differ at {k} new nodes")
                    for v, a in answers:
                        if v == "torch path" and not np.allclose(a, same[0], rtol=1e-4, atol=1e-5):
                            raise SystemExit(f"{model}: the torch path's answers differ at {k} new nodes")
                for v in names:
                    p50 = 1e3 * float(np.median(times[v]))
                    sub, feat, fwd = np.median(np.array(stages[v]), axis=0)
                    print(f"| {model} | {k} | {v} | {p50:.2f} | {p50 / k:.3f} | {sub:.2f} | {feat:.2f} | {fwd:.2f} |",
                          flush=True)
    finally:
        kppr.ppr_new_nodes = parallel
        server.stop()


if __name__ == "__main__":
    main()
