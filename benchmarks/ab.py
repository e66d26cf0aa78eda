"""A/B of the serving path: this tree against a base commit, side by side in one run.

Starts two ``gnnserve serve`` subprocesses over the same model repository, one from a git worktree
of ``--base`` and one from this working tree, and alternates blocks of ``--block`` one-node
``Predict`` calls between them from one client (so both see the same moments of a shared, noisy
machine), then alternates batched-load phases (``--clients`` threads, ``--batch`` nodes per
request). Reports, per model, p50/p99 of the one-node calls and batched node predictions per
second for each side, and the ratio new / base.

    python benchmarks/ab.py --repo DIR --base ca485fe --models gcn,shadow-gcn
    python benchmarks/ab.py --dataset ../shared/data/amazon_computers.npz --base ca485fe   # trains first

Without ``--repo`` it trains a plain GCN and a shaDow-GCN on ``--dataset`` (``--epochs``) into
``--cache-dir`` and reuses them on later runs. ``--base-args`` / ``--new-args`` add server options to one
side, so that one revision can be compared under two settings:

    python benchmarks/ab.py --repo DIR --base HEAD --base-args "--blas-threads 0"

``--base-tree DIR`` runs the base side from a tree exported before (``git archive REV | tar -x -C DIR``), for a
machine whose copy of the project has no git history (the lent GPU machines: ``benchmarks/gpu_session.sh
prepare`` exports one into ``.gpu/base``); ``--args`` adds server options to both sides (``--args="--device
cuda"``).

(one word that starts with ``--`` needs the ``=`` form: ``--base-args=--no-resident``; the base revision
must know the options it is given).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clients._gen import gnnserve_pb2 as pb  # noqa: E402
from clients._gen import gnnserve_pb2_grpc as pbg  # noqa: E402
from tests.serving import ServerProcess  # noqa: E402


def one_node_block(stub, model: str, nodes: np.ndarray, out: list[float]) -> None:
    for v in nodes:
        t0 = time.perf_counter()
        stub.Predict(pb.PredictRequest(model=model, nodes=[int(v)]), timeout=60)
        out.append(1e3 * (time.perf_counter() - t0))


def load_phase(address: str, model: str, num_nodes: int, clients: int, batch: int, seconds: float) -> float:
    done = [0] * clients

    def run(i: int) -> None:
        rng = np.random.default_rng(i)
        with grpc.insecure_channel(address) as ch:
            stub = pbg.GnnServiceStub(ch)
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                stub.Predict(pb.PredictRequest(model=model, nodes=rng.integers(0, num_nodes, batch).tolist()),
                             timeout=60)
                done[i] += batch

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - t0)


def train_repo(dataset: Path, cache: Path, models: list[str], epochs: int) -> Path:
    from kernels.datasets import load_dataset
    from tests.serving import make_repo

    repo = cache / dataset.stem
    todo = {m: m for m in models if not (repo / m / "1" / "config.json").exists()}
    if todo:
        print(f"training {', '.join(todo)} on {dataset.name} ({epochs} epochs) into {repo} ...", flush=True)
        make_repo(repo, load_dataset(str(dataset)), todo, hidden=64, epochs=epochs, patience=epochs,
                  knob_widths=[0, 8, 16, 32], knob_budgets=[16, 32, 64], ppr_k=64)
    return repo


@contextlib.contextmanager
def base_side(args: argparse.Namespace) -> Iterator[tuple[Path, str]]:
    """``(tree, revision)`` of the base side: ``--base-tree`` as it is (its revision from a REVISION file in it, or
    ``--base``), or a git worktree of ``--base``, removed afterwards."""
    if args.base_tree is not None:
        rev_file = args.base_tree / "REVISION"
        yield args.base_tree.resolve(), rev_file.read_text().strip() if rev_file.is_file() else args.base
        return
    rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="gnnserve-ab-") as tmpd:
        tree = Path(tmpd) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=ROOT, check=True)
        try:
            yield tree, rev
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def compare(args: argparse.Namespace, repo: Path, models: list[str], base_tree: Path) -> list[str]:
    """One table row per model: the base side (a server from ``base_tree``) against this tree's."""
    common = ("--poll-s", "0", "--warm-projections", *[a for d in args.data for a in ("--data", str(d))],
              *shlex.split(args.args))
    with ServerProcess(repo, *common, *shlex.split(args.base_args), tree=base_tree) as base, \
            ServerProcess(repo, *common, *shlex.split(args.new_args)) as new:
        rows = []
        for model in models:
            with grpc.insecure_channel(base.address) as cb, grpc.insecure_channel(new.address) as cn:
                sb, sn = pbg.GnnServiceStub(cb), pbg.GnnServiceStub(cn)
                num_nodes = sn.GetModel(pb.GetModelRequest(name=model), timeout=30).num_nodes
                rng = np.random.default_rng(0)
                lat = {"base": [], "new": []}
                for stub in (sb, sn):  # warm both
                    one_node_block(stub, model, rng.integers(0, num_nodes, 20), [])
                for r in range(args.rounds):
                    nodes = rng.integers(0, num_nodes, args.block)
                    order = (("base", sb), ("new", sn)) if r % 2 == 0 else (("new", sn), ("base", sb))
                    for side, stub in order:
                        one_node_block(stub, model, nodes, lat[side])
            tput = {"base": [], "new": []}
            abba = (("base", base), ("new", new), ("new", new), ("base", base))
            for side, srv in [abba[i % 4] for i in range(2 * args.phases)]:
                tput[side].append(load_phase(srv.address, model, num_nodes, args.clients, args.batch,
                                             args.seconds))
            p = {s: (np.percentile(v, 50), np.percentile(v, 99)) for s, v in lat.items()}
            t = {s: float(np.mean(v)) for s, v in tput.items()}
            rows.append(f"| {model} | {p['base'][0]:.3f} / {p['base'][1]:.3f} | {p['new'][0]:.3f} / "
                        f"{p['new'][1]:.3f} | {p['new'][0] / p['base'][0]:.2f} | {t['base']:,.0f} | "
                        f"{t['new']:,.0f} | {t['new'] / t['base']:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=None)
    ap.add_argument("--dataset", type=Path, default=ROOT.parent / "shared" / "data" / "amazon_computers.npz")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/gnnserve-bench-ab"))
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--models", default="gcn,shadow-gcn")
    ap.add_argument("--base", default="HEAD", help="git revision to compare this working tree with")
    ap.add_argument("--rounds", type=int, default=8, help="alternating blocks per model")
    ap.add_argument("--block", type=int, default=50, help="one-node calls per block")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0, help="per batched-load phase")
    ap.add_argument("--phases", type=int, default=2, help="batched-load phases per side (alternated ABBA)")
    ap.add_argument("--base-tree", type=Path, default=None,
                    help="an exported source tree to run as the base side instead of a git worktree of --base "
                         "(its revision from --base, or a REVISION file in it)")
    ap.add_argument("--data", action="append", default=[], type=Path,
                    help="a dataset the checkpoints were trained on, for both servers (gnnserve serve --data: where "
                         "the path they recorded does not exist)")
    ap.add_argument("--args", default="", help="extra gnnserve serve options of both sides (shell words)")
    ap.add_argument("--base-args", default="", help="extra gnnserve serve options of the base side (shell words)")
    ap.add_argument("--new-args", default="", help="extra gnnserve serve options of the new side (shell words)")
    args = ap.parse_args(argv)
    if args.phases < 1:
        ap.error("--phases must be >= 1")
    models = [m for m in args.models.split(",") if m]
    repo = args.repo or train_repo(args.dataset, args.cache_dir, models, args.epochs)
    if args.base_tree is not None and not (args.base_tree / "serve" / "cli.py").is_file():
        ap.error(f"--base-tree {args.base_tree}: not a gnnserve source tree (no serve/cli.py)")
    with base_side(args) as (base_tree, base_rev):
        rows = compare(args, repo, models, base_tree)
    print(f"\n`python benchmarks/ab.py {shlex.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs; base {base_rev}, "
          f"new = this tree; {args.rounds} alternating blocks of {args.block} one-node calls per side, batched load "
          f"{args.clients} clients x {args.batch} nodes, {args.phases} x {args.seconds:.0f} s per side\n")
    print("| model | base one-node p50 / p99 ms | new p50 / p99 ms | new / base p50 | base nodes/s | new nodes/s "
          "| new / base |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
