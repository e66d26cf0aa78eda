"""Bulk edits of a live PPR index (``kernels.ppr_live.LivePPRIndex.prepare``): where a bulk shaDow update spends
its time, in one process per configuration so that each gets its own numba thread count and kernel version.

For each edit size (random added edges, the same for every configuration: seeded by the size) it times ``prepare``
on a fresh live index over the saved PPR index, and inside it the reverse pushes (``_reverse_terms``), and reports
how many lists the edit recomputes and how many reverse pushes the work cap stopped. Configurations run one after
another, each twice, interleaved (``--rounds``): the machine is noisy, compare within a round.

    python benchmarks/live_ppr_bulk.py --dataset-dir REPO/_data/<fp> --ppr-dir REPO/_ppr/<index> \\
        --sizes 100,1000 --threads 2,1 [--base-tree /path/to/a/checkout/of/an/older/revision]

``--base-tree`` adds that checkout's ``kernels`` (run with 2 threads) as the baseline: ``git worktree add DIR REV``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _child(args: argparse.Namespace) -> None:
    """One configuration: ``kernels`` from ``args.tree``, ``args.threads`` numba threads."""
    sys.path.insert(0, str(args.tree))
    import numba
    import numpy as np

    from kernels.datasets import GraphDataset
    from kernels.graph_edit import GraphEdit, apply_edit
    from kernels.ppr import ppr_topk
    from kernels.ppr_index import PPRIndex
    from kernels.ppr_live import LivePPRIndex

    numba.set_num_threads(args.threads)
    g = GraphDataset.load_dir(args.dataset_dir).graph
    idx = PPRIndex.open(args.ppr_dir, g)
    idx.ensure_inverse()
    orig = LivePPRIndex._reverse_terms
    spent: dict[str, float] = {}

    def timed(self, *a, **kw):  # the reverse pushes' share of prepare
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            spent["reverse"] = time.perf_counter() - t0

    LivePPRIndex._reverse_terms = timed
    ppr_topk(g, np.arange(args.threads), idx.config)  # the pooled push scratch, as a server's lookups leave it
    out = []
    for size in [3, *args.sizes]:  # 3 edges first: compilation and first touches outside the measurement
        rng = np.random.default_rng(size)
        e = rng.integers(0, g.num_nodes, (size, 2))
        e = e[e[:, 0] != e[:, 1]]
        eff = apply_edit(g, GraphEdit(add_src=e[:, 0], add_dst=e[:, 1]))
        live = LivePPRIndex(idx)
        spent.clear()
        t0 = time.perf_counter()
        prep = live.prepare(g, eff.graph, eff.changed_rows, eff.new_ids)
        took = time.perf_counter() - t0
        if size != 3:
            out.append(f"{size} edges: prepare {1e3 * took:.0f} ms (reverse pushes {1e3 * spent.get('reverse', 0):.0f}"
                       f" ms), {len(prep['recompute'])} lists recomputed, {prep['capped']} reverse pushes capped")
    print(f"{args.label} ({args.threads} numba threads): " + "; ".join(out), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset-dir", type=Path, required=True, help="a dataset directory (REPO/_data/<fingerprint>)")
    ap.add_argument("--ppr-dir", type=Path, required=True, help="the saved PPR index of that graph (REPO/_ppr/...)")
    ap.add_argument("--sizes", default="100,1000", help="edges per edit, comma-separated (default: %(default)s)")
    ap.add_argument("--threads", default="2,1", help="numba thread counts of this tree (default: %(default)s)")
    ap.add_argument("--base-tree", type=Path, default=None, help="a checkout whose kernels run as the baseline "
                    "(2 threads; default: none)")
    ap.add_argument("--rounds", type=int, default=2, help="times each configuration runs (default: %(default)s)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", type=Path, default=REPO, help=argparse.SUPPRESS)
    ap.add_argument("--label", default="this tree", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    if args.child:
        args.threads = int(args.threads)
        _child(args)
        return
    configs = [(REPO, int(t), "this tree") for t in str(args.threads).split(",")]
    if args.base_tree is not None:
        configs.insert(0, (args.base_tree, 2, f"base {args.base_tree}"))
    common = ["--dataset-dir", str(args.dataset_dir), "--ppr-dir", str(args.ppr_dir),
              "--sizes", ",".join(map(str, args.sizes))]
    for _ in range(args.rounds):
        for tree, threads, label in configs:
            subprocess.run([sys.executable, __file__, "--child", "--tree", str(tree), "--threads", str(threads),
                            "--label", label, *common], check=True)


if __name__ == "__main__":
    main()
