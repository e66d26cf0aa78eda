"""``gnnserve bench``: a model's accuracy-versus-latency curve over its knob settings, measured live.

    gnnserve bench --server HOST:PORT --model NAME --dataset PATH.npz [--plot curve.png] [--json]
    gnnserve bench --repo REPO --model NAME [--dataset ...] ...   # starts a server in this process

For every (K, S) of the model's knob table (or ``--widths`` x ``--budgets``) it sends
``--queries`` single-node requests (p50/p99 latency as the client sees it, through the SDK) and
one batched pass over ``--eval-nodes`` test nodes (accuracy against the dataset's labels; without a
dataset, the knob table's validation accuracy is shown instead). ``--plot`` draws accuracy against
p50 latency with each point labelled by its setting (matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["main", "measure_curve", "plot_curve"]


def measure_curve(
    client: Any,
    model: str,
    settings: list[tuple[int, int]],
    *,
    probe_nodes: np.ndarray,
    eval_nodes: np.ndarray | None = None,
    eval_labels: np.ndarray | None = None,
    val_accuracy: dict[tuple[int, int], float] | None = None,
) -> list[dict[str, float]]:
    """One row per (S, K): p50/p99 single-node latency, accuracy, edges kept, server-side p50."""
    rows = []
    for width, budget in settings:
        kw = {"sampling_width": width} | ({"ppr_budget": budget} if budget else {})
        client.predict(model, [int(probe_nodes[0])], **kw)  # warm this setting
        lat, server = [], []
        for v in probe_nodes:
            t = time.perf_counter()
            r = client.predict(model, [int(v)], return_probabilities=False, **kw)
            lat.append(1e3 * (time.perf_counter() - t))
            server.append(r.timing.total_ms)
        row = {
            "sampling_width": float(width),
            "ppr_budget": float(budget),
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "server_p50_ms": float(np.percentile(server, 50)),
        }
        if eval_nodes is not None and eval_labels is not None:
            res = client.predict(model, eval_nodes, return_probabilities=False, **kw)
            row["accuracy"] = float((res.labels == eval_labels).mean())
            row["edges_kept"] = res.settings.edges_kept_fraction
            row["accuracy_source"] = 1.0  # measured on the eval nodes
        else:
            row["accuracy"] = float((val_accuracy or {}).get((width, budget), float("nan")))
            row["accuracy_source"] = 0.0  # from the knob table (validation)
        rows.append(row)
    return rows


def plot_curve(rows: list[dict[str, float]], path: str, title: str) -> None:
    """Accuracy against p50 latency, one labelled point per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    budgets = sorted({int(r["ppr_budget"]) for r in rows})
    for b in budgets:
        pts = sorted((r for r in rows if int(r["ppr_budget"]) == b), key=lambda r: r["p50_ms"])
        ax.plot([r["p50_ms"] for r in pts], [100 * r["accuracy"] for r in pts], marker="o",
                label=f"K = {b}" if b else "L-hop")
        for r in pts:
            s = int(r["sampling_width"])
            ax.annotate(f"S={s or 'exact'}", (r["p50_ms"], 100 * r["accuracy"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    measured = all(r.get("accuracy_source", 0) == 1.0 for r in rows)
    ax.set_xlabel("p50 latency of a single-node request (ms, client side)")
    ax.set_ylabel(("test" if measured else "validation") + " accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gnnserve bench", description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="HOST:PORT of a running server")
    where.add_argument("--repo", help="start a server on this repository in-process")
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", default=None, help="dataset with labels (accuracy on its test nodes)")
    ap.add_argument("--queries", type=int, default=100, help="single-node requests per setting")
    ap.add_argument("--eval-nodes", type=int, default=2000, help="test nodes for accuracy per setting")
    ap.add_argument("--widths", default=None, help="comma-separated S values (default: the knob table's)")
    ap.add_argument("--budgets", default=None, help="comma-separated K values (default: the knob table's)")
    ap.add_argument("--plot", default=None, help="write the curve to this PNG")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from clients import GnnClient

    server = None
    if args.repo:
        from .runtime import RuntimeOptions
        from .server import BackgroundServer, ServerConfig

        cfg = ServerConfig(repo=args.repo, port=0, poll_s=0, runtime=RuntimeOptions(),
                           data_paths=[args.dataset] if args.dataset else [])
        server = BackgroundServer(cfg).start()
        address = server.address
    else:
        address = args.server
    try:
        with GnnClient(address, timeout=120) as client:
            info = client.get_model(args.model)
            table = {(r.sampling_width, r.ppr_budget): r.val_accuracy for r in info.knob_table}
            widths = [int(x) for x in args.widths.split(",")] if args.widths else sorted({w for w, _ in table})
            budgets = [int(x) for x in args.budgets.split(",")] if args.budgets else sorted({k for _, k in table})
            settings = [(w, k) for k in budgets for w in widths]
            rng = np.random.default_rng(args.seed)
            eval_nodes = eval_labels = None
            if args.dataset:
                from kernels.datasets import load_dataset

                ds = load_dataset(args.dataset)
                test = ds.split("test")
                eval_nodes = rng.choice(test, size=min(args.eval_nodes, len(test)), replace=False)
                eval_labels = ds.y[eval_nodes]
                pool = test
            else:
                pool = np.arange(info.num_nodes)
            probe = rng.choice(pool, size=min(args.queries, len(pool)), replace=False)
            rows = measure_curve(client, args.model, settings, probe_nodes=probe, eval_nodes=eval_nodes,
                                 eval_labels=eval_labels, val_accuracy=table)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'S':>6} {'K':>5} {'accuracy':>9} {'p50 ms':>8} {'p99 ms':>8} {'server p50':>11} {'edges kept':>11}")
        for r in rows:
            print(f"{int(r['sampling_width']) or 'exact':>6} {int(r['ppr_budget']):>5} {100 * r['accuracy']:>8.1f}% "
                  f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['server_p50_ms']:>10.2f}  "
                  f"{100 * r.get('edges_kept', float('nan')):>9.1f}%")
    if args.plot:
        plot_curve(rows, args.plot, f"gnnserve: {args.model} ({info.architecture}), {len(probe)} queries/setting")
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
