"""The torch operator paths' thread count (``--torch-path-threads``) beside busy processes.

Two ``gnnserve serve`` processes over one model repository, one with ``--torch-path-threads 1`` (the default) and one
with ``--torch-path-threads 0`` (torch's own count for batches of 4,096 rows or more, as before 2026-11-28), asked in
turn for the same Predicts of ``--new-nodes`` new nodes each (random features and ``--degree`` random neighbours:
such a batch takes the torch operator path on a CPU), first on an idle machine, then beside 1 and 2 processes
spinning a core each. Prints the forward stage (the server's ``Timing.forward_ms``) and the server's total, p50 and
p90 of each, per side.

    python benchmarks/torch_path_threads.py --repo REPO --model shadow-gcn --new-nodes 64
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clients import GnnClient, NewNode  # noqa: E402
from tests.serving import ServerProcess  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--model", default="shadow-gcn")
    ap.add_argument("--new-nodes", type=int, default=64, help="new nodes per Predict (default: %(default)s)")
    ap.add_argument("--degree", type=int, default=5, help="neighbours of each new node (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=60, help="Predicts per side and load (default: %(default)s)")
    ap.add_argument("--busy", default="0,1,2", help="spinning processes beside the servers (default: %(default)s)")
    args = ap.parse_args(argv)

    sides = {"1 (default)": "1", "0 (before)": "0"}
    servers = {k: ServerProcess(args.repo, "--poll-s", "0", "--read-only", "--torch-path-threads", v).start()
               for k, v in sides.items()}
    try:
        clients = {k: GnnClient(s.address, timeout=120) for k, s in servers.items()}
        info = next(iter(clients.values())).get_model(args.model)
        n, f = info.num_nodes, info.num_features
        rng = np.random.default_rng(0)
        print("| busy processes | --torch-path-threads | forward p50 / p90 (ms) | server total p50 / p90 (ms) |")
        print("|---:|---|---:|---:|")
        for busy in (int(b) for b in args.busy.split(",")):
            spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in clients}
            try:
                for i in range(args.requests + 6):
                    nodes = [NewNode(features=rng.normal(size=f).astype(np.float32),
                                     neighbors=rng.choice(n, args.degree, replace=False).tolist())
                             for _ in range(args.new_nodes)]
                    for k in list(clients)[:: 1 if i % 2 else -1]:  # alternate who goes first
                        t = clients[k].predict_new_node(args.model, nodes).timing
                        if i >= 6:  # the first few warm both servers
                            times[k].append((t.forward_ms, t.total_ms))
            finally:
                for p in spin:
                    p.kill()
            for k, v in times.items():
                a = np.array(v)
                print(f"| {busy} | {k} | {np.median(a[:, 0]):.2f} / {np.percentile(a[:, 0], 90):.2f} | "
                      f"{np.median(a[:, 1]):.2f} / {np.percentile(a[:, 1], 90):.2f} |", flush=True)
    finally:
        for s in servers.values():
            s.terminate()


if __name__ == "__main__":
    main()
