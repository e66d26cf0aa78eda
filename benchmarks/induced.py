"""``kernels.subgraph.induced_batch`` per target on real PPR lists: the two ways a list's members are looked up
(the tagged ``[N]`` scratch and the per-list map and filter), and optionally the kernel of a git revision beside
this tree's, in one process, the same lists, rounds interleaved and their order alternated.

The lists are each target's top-``--k`` PPR list (``kernels.ppr_push.ppr_topk``) of ``--targets`` random nodes,
computed once; batches of ``--batches`` targets are induced from them. Every variant's batch of all targets is
checked equal (bit for bit) to this tree's default before anything is timed. Reported: the median over rounds of
each variant's median time per target, and the ratio to the first variant.

    python benchmarks/induced.py --graph synthetic:2000000:0:products --base 01b2dae
    python benchmarks/induced.py --graph ../shared/data/amazon_computers.npz

``--graph``: a dataset spec as ``kernels.datasets.load_dataset`` takes it (a ``.npz``, ``synthetic:N:SEED[:SHAPE]``,
a dataset directory) or a directory a ``CSRGraph`` was saved to.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "benchmarks"))  # at_revision (after REPO: serve.py)

from at_revision import kernels_module_at  # noqa: E402


def _load_graph(spec: str):
    from kernels.graph import CSRGraph

    p = Path(spec)
    if p.is_dir() and (p / "graph.json").exists():
        return CSRGraph.load(p)
    from kernels.datasets import load_dataset

    return load_dataset(spec).graph


def _digest(batch) -> str:
    h = hashlib.sha1()
    for a in (batch.graph.indptr, batch.graph.indices, batch.unique_ids, batch.row_to_unique,
              batch.graph.weights if batch.graph.weights is not None else np.zeros(0)):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", required=True, help="dataset spec or saved CSRGraph directory")
    ap.add_argument("--targets", type=int, default=2048, help="random targets whose lists are induced (default: %(default)s)")
    ap.add_argument("--k", type=int, default=64, help="PPR list length (default: %(default)s)")
    ap.add_argument("--eps", type=float, default=1e-4, help="PPR push threshold (default: %(default)s)")
    ap.add_argument("--batches", default="1,64,2048", help="targets per induced batch (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds (default: %(default)s)")
    ap.add_argument("--base", default=None, help="also time kernels/subgraph.py as it was at this git revision")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        sizes = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not sizes or min(sizes) < 1 or args.rounds < 1 or args.targets < 1 or args.k < 1:
        ap.error("--batches, --rounds, --targets and --k must be >= 1")

    import kernels.subgraph as sg
    from kernels.ppr_push import PPRConfig, ppr_topk

    t0 = time.perf_counter()
    g = _load_graph(args.graph)
    t = np.random.default_rng(args.seed).choice(g.num_nodes, min(args.targets, g.num_nodes), replace=False)
    ptr, nodes, _ = ppr_topk(g, t, PPRConfig(eps=args.eps), k=args.k)
    nt = len(ptr) - 1
    deg = np.diff(g.indptr)[nodes]
    print(f"{args.graph}: {g.num_nodes:,} nodes, {g.num_edges:,} edges; {nt} lists of {np.diff(ptr).mean():.1f} "
          f"nodes (their rows' mean degree {deg.mean():.0f}) in {time.perf_counter() - t0:.1f} s; default lookup "
          f"{'map' if g.num_nodes >= sg._HASHED_MIN_NODES else 'tagged'} (from {sg._HASHED_MIN_NODES:,} nodes)")

    limit = sg._HASHED_MIN_NODES
    variants = []  # (name, induced_batch, the lookup threshold to set or None)
    if args.base:
        tmp = Path(tempfile.mkdtemp(prefix="induced-base-"))
        variants.append((f"{args.base}", kernels_module_at(args.base, "subgraph", tmp).induced_batch, None))
    variants += [("tagged", sg.induced_batch, 1 << 62), ("map", sg.induced_batch, 0)]

    def run(fn, lim, p, nd):
        if lim is not None:
            sg._HASHED_MIN_NODES = lim
        try:
            return fn(g, p, nd)
        finally:
            sg._HASHED_MIN_NODES = limit

    want = _digest(sg.induced_batch(g, ptr, nodes))
    for name, fn, lim in variants:
        if _digest(run(fn, lim, ptr, nodes)) != want:
            raise SystemExit(f"{name}: its batch differs from this tree's")
    per: dict[tuple[str, int], list[float]] = {}
    for rnd in range(args.rounds + 1):  # round 0 untimed
        for name, fn, lim in (variants if rnd % 2 else variants[::-1]):
            for b in sizes:
                tt = []
                for s in range(0, min(nt, 32 * b), b):
                    e = min(s + b, nt)
                    p, nd = ptr[s:e + 1] - ptr[s], nodes[ptr[s]:ptr[e]]
                    a = time.perf_counter()
                    run(fn, lim, p, nd)
                    tt.append((time.perf_counter() - a) / (e - s))
                if rnd:
                    per.setdefault((name, b), []).append(float(np.median(tt)))
    print("| targets per batch | " + " | ".join(f"{n} us/target" for n, _, _ in variants) + " | " +
          " | ".join(f"{variants[0][0]} / {n}" for n, _, _ in variants[1:]) + " |")
    print("|---:|" + "---:|" * (2 * len(variants) - 1))
    for b in sizes:
        med = [float(np.median(per[(n, b)])) for n, _, _ in variants]
        print(f"| {b} | " + " | ".join(f"{1e6 * m:.1f}" for m in med) + " | " +
              " | ".join(f"{med[0] / m:.2f}x" for m in med[1:]) + " |")


if __name__ == "__main__":
    main()
