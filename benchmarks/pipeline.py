"""The serving pipeline of one checkpoint in process (no gRPC): time per batch and per stage.

Loads ``REPO/NAME/1`` through :class:`serve.registry.ModelRegistry` (so the PPR index, the induced
table and the projection cache are the server's), then times ``ModelRuntime.process`` on random
target sets of 64, 448 and 1024 distinct nodes at three (S, K) settings: 6 sets per cell, the
median of the last 5, with the server's own per-stage timing (subgraph or plan, features, forward).

    python benchmarks/pipeline.py REPO PPR_CACHE_DIR DATASET.npz NAME
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()
    import numpy as np

    from serve.batcher import WorkItem
    from serve.registry import ModelRegistry
    from serve.runtime import RuntimeOptions, _WarmupFuture
    from serve.validation import PredictCall

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo")
    ap.add_argument("ppr_cache")
    ap.add_argument("dataset")
    ap.add_argument("name")
    ap.add_argument("--sets", type=int, default=6)
    args = ap.parse_args(argv)
    reg = ModelRegistry(args.repo, RuntimeOptions(ppr_cache_dir=args.ppr_cache), data_paths=[args.dataset])
    t0 = time.perf_counter()
    rt = reg._load_version(args.name, 1, reg.repo / args.name / "1")
    print(f"load + warm-up {time.perf_counter() - t0:.1f} s", flush=True)
    rng = np.random.default_rng(0)
    n = rt.graph.num_nodes
    settings = [(8, 16), (16, 64), (0, 64)] if rt.extractor == "ppr" else [(8, 0), (16, 0), (0, 0)]
    print("| batch | S | K | ms per batch | node predictions/s | subgraph ms | features ms | forward ms |")
    print("|---|---|---|---|---|---|---|---|")
    for bs in (64, 448, 1024):
        for w, k in settings:
            times, stages = [], []
            for _ in range(args.sets):
                ids = rng.choice(n, bs, replace=False).astype(np.int64)
                call = PredictCall("bench", ids, [], w, k, "bench", 0.0, True, False)
                item = WorkItem(call, bs, None, None, time.monotonic(), _WarmupFuture())
                t = time.perf_counter()
                res = rt.process([item])[0]
                times.append(time.perf_counter() - t)
                stages.append(res.timing)
            med = float(np.median(times[1:]))
            st = [float(np.median([x[s] for x in stages[1:]])) for s in ("subgraph", "features", "forward")]
            print(f"| {bs} | {w or 'exact'} | {k or '-'} | {1e3 * med:.1f} | {bs / med:,.0f} | "
                  + " | ".join(f"{v:.1f}" for v in st) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
