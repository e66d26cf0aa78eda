"""``gnnserve bench``: a model's accuracy-versus-latency curve over its knob settings, measured live.

    gnnserve bench --server HOST[:PORT] --model NAME --dataset PATH.npz [--plot curve.png] [--json]
    gnnserve bench --repo REPO --model NAME [--dataset ...] ...   # starts a server in this process

For every (K, S) of the model's knob table (or ``--widths`` x ``--budgets``) it sends
``--queries`` single-node requests (p50/p99 latency as the client sees it, through the SDK) and
one batched pass over ``--eval-nodes`` test nodes (accuracy against the dataset's labels; without a
dataset, the knob table's validation accuracy is shown instead). ``--plot`` draws accuracy against
p50 latency with each point labelled by its setting (matplotlib, the ``plot`` extra).

``--json`` prints one object per setting (:func:`measure_curve`'s rows): ``sampling_width`` (0 = exact) and
``ppr_budget`` (0 for an L-hop model), integers as requested; ``p50_ms``, ``p99_ms`` (client side) and
``server_p50_ms``; ``accuracy``, a fraction, with ``accuracy_source``: ``"test"`` (measured on the
``--dataset``'s test nodes) or ``"knob-table"`` (the validation accuracy the knob table records for the
setting served: no ``--dataset``); ``edges_kept``, the fraction of edges aggregated in the test pass (1.0 =
every edge; with ``--dataset`` only); ``graph_version``, the graph version measured on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .cli import DATASET_HELP

__all__ = ["BenchError", "main", "measure_curve", "plot_curve"]



def measure_curve(
    client: Any,
    model: str,
    settings: list[tuple[int, int]],
    *,
    probe_nodes: np.ndarray,
    eval_nodes: np.ndarray | None = None,
    eval_labels: np.ndarray | None = None,
    val_accuracy: dict[tuple[int, int], float] | None = None,
) -> list[dict[str, Any]]:
    """One row per (S, K): p50/p99 single-node latency, accuracy, edges kept, server-side p50 (the fields of
    the module docstring)."""
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
            "sampling_width": int(width),
            "ppr_budget": int(budget),
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "server_p50_ms": float(np.percentile(server, 50)),
        }
        if eval_nodes is not None and eval_labels is not None:
            res = client.predict(model, eval_nodes, return_probabilities=False, **kw)
            row["accuracy"] = float((res.labels == eval_labels).mean())
            row["edges_kept"] = res.settings.edges_kept_fraction
            row["accuracy_source"] = "test"  # measured on the eval nodes (the dataset's test split)
        else:  # the server's own reading of its knob table for the setting it served (a width it clamped
            # to max_sampling_width included), else the table's row as asked
            row["accuracy"] = float(r.settings.expected_accuracy) or float((val_accuracy or {}).get((width, budget), float("nan")))
            row["accuracy_source"] = "knob-table"  # the table's validation accuracy
        rows.append(row)
    return rows


def plot_curve(rows: list[dict[str, Any]], path: str, title: str) -> None:
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
    measured = all(r.get("accuracy_source") == "test" for r in rows)
    ax.set_xlabel("p50 latency of a single-node request (ms, client side)")
    ax.set_ylabel(("test" if measured else "validation") + " accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


class BenchError(Exception):
    """A bad argument or a dataset that does not fit the model: one line, exit code 2."""


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _int_list(minimum: int, what: str) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers of at least ``minimum`` (duplicates dropped)."""

    def parse(text: str) -> list[int]:
        values: list[int] = []
        for item in text.split(","):
            item = item.strip()
            try:
                value = int(item)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{item!r} in {text!r} is not an integer (give comma-separated {what}s, e.g. 0,4,16)") from None
            if value < minimum:
                raise argparse.ArgumentTypeError(f"{what} {value} in {text!r}: must be >= {minimum}")
            if value not in values:
                values.append(value)
        return values

    return parse


def _parser() -> argparse.ArgumentParser:
    from clients.cli import security_args

    ap = argparse.ArgumentParser(prog="gnnserve bench",
                                 description="Measure a model's accuracy-versus-latency curve over its knob settings, "
                                             "live through the client SDK.",
                                 epilog="Exit codes: 0 done, 2 bad arguments, a dataset that is not the model's, or "
                                        "INVALID_ARGUMENT from the server, 1 other server errors.")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="HOST[:PORT] of a running server (port 8500 when not given)")
    where.add_argument("--repo", help="start a server on this repository in-process")
    security_args(ap.add_argument_group("connection (with --server)"))
    ap.add_argument("--model", required=True, help="name of the model to measure (see 'gnnserve models')")
    ap.add_argument("--dataset", default=None,
                    help="the dataset the model was trained on, with labels (accuracy on its test nodes; default: "
                         "the knob table's validation accuracy is shown): " + DATASET_HELP)
    ap.add_argument("--queries", type=_count(1), default=100, help="single-node requests per setting (default: %(default)s)")
    ap.add_argument("--eval-nodes", type=_count(1), default=2000,
                    help="test nodes for accuracy per setting, with --dataset (default: %(default)s)")
    ap.add_argument("--widths", type=_int_list(0, "sampling width"), default=None,
                    help="comma-separated S values, 0 = exact (default: the knob table's)")
    ap.add_argument("--budgets", type=_int_list(1, "PPR budget"), default=None,
                    help="comma-separated K values (default: the knob table's)")
    ap.add_argument("--plot", default=None, help="write the curve to this PNG")
    ap.add_argument("--json", action="store_true", help="print the curve's rows as JSON instead of a table")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the sampled query and test nodes (default: %(default)s)")
    return ap


def _check_plot(path: str) -> None:
    """Fail before measuring, not after: the plot's directory exists and matplotlib is installed."""
    import importlib.util
    from pathlib import Path

    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise BenchError(f"--plot {path!r}: directory {str(parent)!r} does not exist")
    if importlib.util.find_spec("matplotlib") is None:
        raise BenchError("--plot needs matplotlib: pip install 'gnnserve[plot]'")


def _load_eval_data(path: str) -> Any:
    from kernels.datasets import DatasetError, load_dataset

    try:
        ds = load_dataset(path)
    except (DatasetError, OSError) as exc:
        raise BenchError(f"--dataset {path!r}: {exc}") from None
    if not len(ds.split("test")):
        raise BenchError(f"--dataset {path!r} has no test nodes to measure accuracy on")
    return ds


def _check_dataset(ds: Any, path: str, info: Any) -> None:
    """The dataset must be the one the model serves: its test ids and labels mean nothing otherwise."""
    if info.dataset_fingerprint and ds.fingerprint() != info.dataset_fingerprint:
        raise BenchError(
            f"--dataset {path!r} ({ds.num_nodes} nodes, fingerprint {ds.fingerprint()[:12]}) is not the data model "
            f"{info.name!r} serves ({info.num_nodes} nodes, fingerprint {info.dataset_fingerprint[:12]}); give the "
            "dataset it was trained on")
    if ds.num_nodes > info.num_nodes:
        raise BenchError(f"--dataset {path!r} has {ds.num_nodes} nodes, model {info.name!r} serves "
                         f"{info.num_nodes}: not the model's graph")


def main(argv: Sequence[str] | None = None) -> int:
    """``gnnserve bench``: returns the exit code (0 done, 2 bad arguments / dataset / INVALID_ARGUMENT, 1 other
    server errors); failures are one line on stderr."""
    from clients.errors import GnnServeError, InvalidArgumentError

    args = _parser().parse_args(argv)
    try:
        return _bench(args)
    except BenchError as exc:
        print(f"gnnserve bench: error: {exc}", file=sys.stderr)
        return 2
    except GnnServeError as exc:
        print(f"gnnserve bench: {exc.code.name}: {exc.details}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidArgumentError) else 1
    except KeyboardInterrupt:
        print("gnnserve bench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the table piped into `head`, say
        from .cli import stdout_closed

        return stdout_closed()


def _bench(args: argparse.Namespace) -> int:
    from clients import GnnClient
    from clients.cli import security_options, server_address

    if args.plot:
        _check_plot(args.plot)
    address = None
    security: dict = {}
    if args.server is not None:
        try:
            address = server_address(args.server)
            security = security_options(args)
        except ValueError as exc:
            raise BenchError(str(exc)) from None
    ds = _load_eval_data(args.dataset) if args.dataset else None
    server = None
    if args.repo:
        from .registry import RepositoryError
        from .runtime import RuntimeOptions
        from .server import BackgroundServer, ServerConfig

        cfg = ServerConfig(repo=args.repo, port=0, poll_s=0, runtime=RuntimeOptions(),
                           data_paths=[args.dataset] if args.dataset else [])
        try:
            server = BackgroundServer(cfg).start()
        except RepositoryError as exc:
            raise BenchError(f"--repo {args.repo!r}: {exc}") from None
        address = server.address
    try:
        with GnnClient(address, timeout=120, **security) as client:
            info = client.get_model(args.model)
            table = {(r.sampling_width, r.ppr_budget): r.val_accuracy for r in info.knob_table}
            widths = args.widths if args.widths is not None else sorted({w for w, _ in table})
            budgets = args.budgets if args.budgets is not None else sorted({k for _, k in table})
            if not widths or not budgets:
                raise BenchError(f"model {args.model!r} has no knob table: give --widths (and --budgets for a "
                                 "PPR model)")
            settings = [(w, k) for k in budgets for w in widths]
            rng = np.random.default_rng(args.seed)
            eval_nodes = eval_labels = None
            if ds is not None:
                _check_dataset(ds, args.dataset, info)
                test = ds.split("test")
                eval_nodes = rng.choice(test, size=min(args.eval_nodes, len(test)), replace=False)
                eval_labels = ds.y[eval_nodes]
                pool = test
            else:
                pool = np.arange(info.num_nodes)
            probe = rng.choice(pool, size=min(args.queries, len(pool)), replace=False)
            rows = measure_curve(client, args.model, settings, probe_nodes=probe, eval_nodes=eval_nodes,
                                 eval_labels=eval_labels, val_accuracy=table)
            graph_version = client.get_model(args.model).graph_version
            for r in rows:
                r["graph_version"] = graph_version
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(rows, indent=2), flush=True)
    else:
        if rows and rows[0]["graph_version"]:  # the labels of --dataset are the dataset's, not the live graph's
            print(f"measured on graph version {rows[0]['graph_version']} (a live graph updated since the dataset; "
                  "its accuracy is against the dataset's labels)")
        print(f"{'S':>6} {'K':>5} {'accuracy':>9} {'p50 ms':>8} {'p99 ms':>8} {'server p50':>11} {'edges kept':>11}")
        for r in rows:
            print(f"{int(r['sampling_width']) or 'exact':>6} {int(r['ppr_budget']):>5} {100 * r['accuracy']:>8.1f}% "
                  f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['server_p50_ms']:>10.2f}  "
                  f"{100 * r.get('edges_kept', float('nan')):>9.1f}%")
    if args.plot:
        try:
            plot_curve(rows, args.plot, f"gnnserve: {args.model} ({info.architecture}), {len(probe)} queries/setting")
        except OSError as exc:
            print(f"gnnserve bench: cannot write --plot {args.plot!r}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
