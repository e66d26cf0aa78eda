"""``gnnserve demo``: the whole product in one command, on the embedded defaults.

1. make a synthetic graph (degree-skewed SBM with class-correlated features), or load ``--dataset``;
2. train a small shaDow-GraphSAGE (it writes a checkpoint with a measured knob table);
3. start the server in this process on a free loopback port (memory feature store);
4. query it through the SDK at three knob settings (fast, balanced, exact): accuracy on the test
   nodes, p50/p99 latency of single-node requests, and the fraction of edges aggregated;
5. stop the server cleanly and print the table.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from .cli import DATASET_HELP

if TYPE_CHECKING:
    from clients.types import ModelInfo
    from kernels.datasets import GraphDataset

__all__ = ["main", "run_demo"]


log = logging.getLogger(__name__)

PPR_K = 32  # the demo model's largest PPR budget (top-K list length)
NUM_CLASSES = 5  # of the synthetic graph
#: the smallest synthetic graph (--nodes): its 5 classes take 100 training nodes (20 each), 10 % of the
#: nodes validate, and the rest are the test nodes the demo queries
MIN_NODES = 200


def _settings(info: ModelInfo) -> list[tuple[str, int, int]]:
    """(name, S, K) for fast, balanced and exact, from the model's limits and knob table."""
    budgets = sorted({r.ppr_budget for r in info.knob_table if r.ppr_budget > 0}) or [info.max_ppr_budget]
    widths = sorted({r.sampling_width for r in info.knob_table if r.sampling_width > 0}) or [info.default_sampling_width]
    return [
        ("fast", widths[0], budgets[0]),
        ("balanced", info.default_sampling_width, info.default_ppr_budget),
        ("exact", 0, info.max_ppr_budget),
    ]


def run_demo(
    dataset: str | GraphDataset | None = None,
    *,
    nodes: int = 3000,
    epochs: int = 20,
    queries: int = 200,
    workdir: str | None = None,
    seed: int = 0,
    out: TextIO = sys.stdout,
) -> list[dict[str, float]]:
    """Run the demo and return one row per knob setting (also printed to ``out``).

    ``dataset``: a dataset spec (:func:`kernels.datasets.load_dataset`), a loaded dataset, or None for
    the synthetic graph of ``nodes`` nodes."""
    from clients import GnnClient
    from kernels.datasets import load_dataset, synthetic_sbm
    from kernels.ppr import PPRIndex
    from models.train import make_ppr_config, train

    from .runtime import RuntimeOptions
    from .server import BackgroundServer, ServerConfig

    t_start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=out, flush=True)

    if dataset is None or dataset == "":
        ds = synthetic_sbm(nodes, num_classes=NUM_CLASSES, avg_degree=12, num_features=32, seed=seed, name="demo")
    elif isinstance(dataset, str):
        ds = load_dataset(dataset)
    else:
        ds = dataset
    say(f"dataset {ds}")
    from kernels import compile_log
    from kernels.precompile import at_start

    compile_log.install()
    # a first run on a machine: the CPU kernels numba's cache lacks, compiled in parallel processes now rather
    # than one after another as each stage below reaches them
    def processes(n: int) -> str:
        return f"{n} process{'es' if n != 1 else ''}"

    def announce(count: int, seconds: float, procs: int) -> None:
        say(f"compiling {count} CPU kernel signatures numba's cache lacks (a first run on this machine: about "
            f"{seconds:.0f} s of compilation, in {processes(procs)}) ...")

    done = at_start(None, (64, ds.num_classes), announce)  # the widths of the model trained below
    if done is not None:
        say(f"compiled {done.compiled} CPU kernel signatures in {done.seconds:.1f} s in {processes(done.processes)} "
            "(later runs load them from numba's cache)")
    with tempfile.TemporaryDirectory(prefix="gnnserve-demo-", dir=workdir) as tmp:
        repo = Path(tmp) / "repo"
        data_dir = repo / "_data" / ds.fingerprint()
        ds.save(data_dir)
        t0 = time.perf_counter()
        # long stages on a large graph (--nodes in the millions): each is announced, and shows a progress
        # bar on stderr
        say(f"building the PPR top-{PPR_K} index of {ds.graph.num_nodes:,} nodes ...")
        # One PPR index for training and serving: built where the server looks for it (REPO/_ppr, keyed by
        # the graph's fingerprint and the PPR settings), so the server opens it instead of rebuilding it.
        index = PPRIndex.open_or_build(repo / "_ppr", ds.graph, make_ppr_config(None, PPR_K), progress=True)
        index.ensure_induced(ds.graph, progress=True)  # every node's induced top-K subgraph: training batches and serving reuse it
        say(f"PPR top-{PPR_K} index of every node in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        say(f"training shadow-sage for {epochs} epochs, then timing its knob table ...")
        train(ds, "shadow-sage", repo / "demo" / "1", progress=True, source=str(data_dir), seed=seed,
              ppr_lookup=index, epochs=epochs, hidden=64, ppr_k=PPR_K, knob_budgets=[8, 16, PPR_K],
              knob_widths=[0, 2, 4, 8])
        say(f"trained shadow-sage in {time.perf_counter() - t0:.1f} s (checkpoint {repo / 'demo' / '1'})")
        cfg = ServerConfig(repo=str(repo), port=0, poll_s=0, runtime=RuntimeOptions())
        with BackgroundServer(cfg) as server, GnnClient(server.address, timeout=60) as client:
            say(f"server up at {server.address}; health {client.health()}")
            info = client.get_model("demo")
            test = ds.split("test")
            rng = np.random.default_rng(seed)
            probe = rng.choice(test, size=min(queries, len(test)), replace=False)
            rows = []
            for name, width, budget in _settings(info):
                res = client.predict("demo", test, sampling_width=width, ppr_budget=budget)
                acc = float((res.labels == ds.y[test]).mean())
                lat = []
                for v in probe:
                    t = time.perf_counter()
                    client.predict("demo", [int(v)], sampling_width=width, ppr_budget=budget,
                                   return_probabilities=False)
                    lat.append(1e3 * (time.perf_counter() - t))
                rows.append({
                    "setting": name,
                    "sampling_width": res.settings.sampling_width,
                    "ppr_budget": res.settings.ppr_budget,
                    "test_accuracy": acc,
                    "p50_ms": float(np.percentile(lat, 50)),
                    "p99_ms": float(np.percentile(lat, 99)),
                    "edges_kept": res.settings.edges_kept_fraction,
                })
            say("server stopping")
        say("server stopped")
    print("", file=out)
    print(f"{'setting':<10} {'S':>4} {'K':>4} {'test acc':>9} {'p50 ms':>8} {'p99 ms':>8} {'edges kept':>11}", file=out)
    for r in rows:
        print(f"{r['setting']:<10} {r['sampling_width'] or 'exact':>4} {r['ppr_budget']:>4} "
              f"{100 * r['test_accuracy']:>8.1f}% {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
              f"{100 * r['edges_kept']:>10.1f}%", file=out)
    print(f"\n({len(test)} test nodes per setting for accuracy; {len(probe)} single-node requests for latency; "
          f"total {time.perf_counter() - t_start:.0f} s)", file=out)
    return rows


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, as one line (None when nothing is): checked before anything runs."""
    if args.dataset is None and args.nodes < MIN_NODES:
        return (f"--nodes must be >= {MIN_NODES}, got {args.nodes} (the synthetic graph's {NUM_CLASSES} classes "
                f"need 100 training nodes, and validation and test nodes besides)")
    if args.epochs < 1:
        return f"--epochs must be >= 1, got {args.epochs}"
    if args.queries < 1:
        return f"--queries must be >= 1, got {args.queries}"
    if args.seed < 0:
        return f"--seed must be >= 0, got {args.seed}"
    return None


def _dataset_problem(ds: GraphDataset) -> str | None:
    """Why a ``--dataset`` cannot be demonstrated on (None when it can): the demo trains on its training
    nodes, picks the checkpoint on its validation nodes and queries its test nodes."""
    empty = [split for split in ("train", "val", "test") if len(ds.split(split)) == 0]
    if empty:
        return f"it has no {' and no '.join(empty)} nodes (the demo trains, validates and queries on its splits)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``gnnserve demo``; returns the exit code: 0, or 2 (one line on stderr) for bad arguments or a
    dataset that cannot be loaded."""
    ap = argparse.ArgumentParser(prog="gnnserve demo",
                                 description="The whole product in one command: train a small model on a synthetic "
                                             "graph (or --dataset), serve it and query it, on the embedded defaults.")
    ap.add_argument("--dataset", default=None,
                    help="use this dataset instead of a synthetic graph of --nodes nodes: " + DATASET_HELP)
    ap.add_argument("--nodes", type=int, default=3000, help=f"synthetic graph size (at least {MIN_NODES}; default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=20, help="training epochs (at least 1; default: %(default)s)")
    ap.add_argument("--queries", type=int, default=200, help="single-node requests per setting for latency (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the graph, the training and the queries (default: %(default)s)")
    ap.add_argument("--verbose", action="store_true", help="log at INFO level (training and server stages)")
    args = ap.parse_args(argv)
    problem = _argument_problem(args)
    if problem is not None:
        print(f"gnnserve demo: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    dataset: GraphDataset | None = None
    if args.dataset is not None:
        from kernels.datasets import load_dataset

        try:  # DatasetError is a ValueError; a spec like synthetic:abc or synthetic:5 raises a plain one
            dataset = load_dataset(args.dataset)
        except (ValueError, OSError) as exc:
            print(f"gnnserve demo: cannot load --dataset {args.dataset!r}: {exc}", file=sys.stderr)
            return 2
        problem = _dataset_problem(dataset)
        if problem is not None:
            print(f"gnnserve demo: --dataset {args.dataset!r}: {problem}", file=sys.stderr)
            return 2
    run_demo(dataset, nodes=args.nodes, epochs=args.epochs, queries=args.queries, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
