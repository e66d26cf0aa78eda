"""Live-graph updates (issue #18): update throughput, update-to-visible latency, Predict under updates.

One ``gnnserve serve`` subprocess over a model repository (its own update log in a temp directory, so
the repository's data stays as it is), driven through the public SDK:

1. **throughput and latency of updates**, sequentially from one client: a single edge (added, then
   removed, alternately: the graph returns to where it was), a single feature row, and batches of
   ``--batch-edges`` edges (added then removed). Per kind: updates/s, the UpdateGraph round trip
   p50/p99 (an UpdateGraph returns once the update is visible: that is the update-to-visible
   latency a client sees), the server's own apply time p50/p99 (``apply_ms``: validation, log
   append, the new graph and every cache's invalidation) and, in a second pass of the same updates
   with nothing else asked, the server process's CPU time per update (from ``/proc``: gRPC and
   protobuf included);
2. **read-your-writes**: after each single-edge update a second client on its own connection asks
   with ``min_graph_version``: it must get that version (counted) and its Predict time is reported;
3. **Predict under a steady update stream**: one-node Predict p50/p99 at the default knobs (raw stub
   calls), in alternating blocks without and with another process sending single-edge updates at
   ``--rate`` per second from ``--writers`` threads (the two sides interleaved in time on this shared
   machine), and the ratio; beside each, the cores the server kept busy (its CPU seconds over the
   block's wall seconds: on a small machine an update stream can take most of them).

    python benchmarks/updates.py --repo /tmp/gnnserve-bench-ab/amazon_computers --model gcn
    python benchmarks/updates.py --dataset ../shared/data/amazon_computers.npz   # trains a GCN first
    python benchmarks/updates.py --synthetic 3000 --updates 40 --seconds 1        # a quick run (the test)

Prints a Markdown table (and ``--json PATH`` writes every figure).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clients import GnnClient  # noqa: E402
from tests.serving import ServerProcess, free_port, make_repo, metric_samples  # noqa: E402


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def _absent_edges(graph, rng: np.random.Generator, count: int) -> list[tuple[int, int]]:
    """``count`` distinct node pairs that are not edges of ``graph`` (and not self-loops)."""
    out: set[tuple[int, int]] = set()
    n = graph.num_nodes
    while len(out) < count:
        u, v = (int(x) for x in rng.integers(0, n, 2))
        if u == v or (min(u, v), max(u, v)) in out:
            continue
        row = graph.indices[graph.indptr[u]: graph.indptr[u + 1]]
        if not np.any(row == v):
            out.add((min(u, v), max(u, v)))
    return sorted(out)


def _cpu_s(pid: int | None) -> float | None:
    """CPU seconds the process ``pid`` has run, every thread summed, to the nanosecond (each thread's
    ``/proc/PID/task/TID/schedstat``; ``/proc/PID/stat`` counts in 10 ms ticks, too coarse for one update).
    None without /proc. A thread that ended between two reads drops out of the sum: the server's threads
    live as long as it does."""
    if pid is None:
        return None
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _wait_idle(pid: int | None, timeout: float = 120.0, window: float = 0.5, busy: float = 0.05) -> float:
    """Wait until the server process ``pid`` uses under ``busy`` of a core over ``window`` seconds (a background
    build after the first requests, an activation table of the default width, would otherwise count in the CPU
    of the updates measured meanwhile); returns the seconds waited (at most ``timeout``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        c0 = _cpu_s(pid)
        time.sleep(window)
        c1 = _cpu_s(pid)
        if c0 is None or c1 is None or (c1 - c0) < busy * window:
            break
    return time.monotonic() - t0


def update_phase(c: GnnClient, model: str, kinds: dict[str, list[dict]], reader: GnnClient | None = None):
    """Send each kind's updates in order; per kind: round trips, server apply times, wall seconds."""
    rows = {}
    ryw_ok = ryw_total = 0
    ryw_ms: list[float] = []
    for kind, updates in kinds.items():
        rtt, apply, deferred = [], [], []
        t_start = time.perf_counter()
        for upd in updates:
            t0 = time.perf_counter()
            res = c.update_graph(model, **upd)
            rtt.append(1e3 * (time.perf_counter() - t0))
            apply.append(res.apply_ms)
            deferred.append(res.invalidated.get("ppr_deferred", 0))  # PPR lists left stale (--ppr-eager-lists)
            if reader is not None and kind == "single edge":
                t1 = time.perf_counter()
                got = reader.predict(model, [upd["add_edges" if "add_edges" in upd else "remove_edges"][0][0]],
                                     min_graph_version=res.graph_version)
                ryw_ms.append(1e3 * (time.perf_counter() - t1))
                ryw_total += 1
                ryw_ok += got.graph_version >= res.graph_version
        rows[kind] = {"updates": len(updates), "per_s": len(updates) / (time.perf_counter() - t_start),
                      "rtt_p50_ms": _pct(rtt, 50), "rtt_p99_ms": _pct(rtt, 99),
                      "apply_p50_ms": _pct(apply, 50), "apply_p99_ms": _pct(apply, 99),
                      "ppr_deferred_mean": float(np.mean(deferred)) if deferred else 0.0}
    return rows, {"ryw_ok": ryw_ok, "ryw_total": ryw_total, "ryw_predict_p50_ms": _pct(ryw_ms, 50),
                  "ryw_predict_p99_ms": _pct(ryw_ms, 99)}


def cpu_phase(c: GnnClient, model: str, kinds: dict[str, list[dict]], server_pid: int | None) -> dict:
    """The server's CPU time per update of each kind, p50 and mean in ms: the kinds sent again, each once the
    server idles, with nothing else asked meanwhile, the CPU read around each UpdateGraph call. (Measured in
    the pass above, the read-your-writes Predicts of nodes the process had not met left work that landed in
    the next updates' windows: on Amazon Computers 4.6-6.8 ms per single edge there, 2.7-2.9 ms without.)"""
    out = {}
    for kind, updates in kinds.items():
        _wait_idle(server_pid)
        cpu = []
        for upd in updates:
            c0 = _cpu_s(server_pid)
            c.update_graph(model, **upd)
            c1 = _cpu_s(server_pid)
            if c0 is not None and c1 is not None:
                cpu.append(1e3 * (c1 - c0))
        out[kind] = {"server_cpu_p50_ms": _pct(cpu, 50),
                     "server_cpu_mean_ms": float(np.mean(cpu)) if cpu else float("nan")}
    return out


def _stream(address: str, model: str, edges: list[tuple[int, int]], rate: float, writers: int, stop: Any,
            sent: Any) -> None:
    """Single-edge updates at ``rate`` per second in all, from ``writers`` threads (as many independent
    writers would send them; each waits for its answer), each adding then removing its own edges so the
    graph returns to where it was; from a process of its own so that its client work does not share the
    measuring client's interpreter."""
    import threading

    def writer(i: int) -> None:
        mine = edges[i::writers]
        with GnnClient(address) as uc:
            period = writers / rate
            k = 0
            t_next = time.perf_counter() + i * period / writers
            while not stop.is_set():
                u, v = mine[(k // 2) % len(mine)]
                uc.update_graph(model, **({"add_edges": [(u, v)]} if k % 2 == 0 else {"remove_edges": [(u, v)]}))
                k += 1
                with sent.get_lock():
                    sent.value += 1
                t_next += period
                delay = t_next - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                elif delay < -1.0:  # the server (or this client) cannot keep the rate: do not build a backlog
                    t_next = time.perf_counter()
            if k % 2:  # leave the graph as it was
                u, v = mine[(k // 2) % len(mine)]
                uc.update_graph(model, remove_edges=[(u, v)])

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def ppr_refresh(metrics_port: int) -> dict[str, float]:
    """The server's stale PPR lists now and what its refresh thread did with its pushes so far (lists stored, or
    voided by an update that came between push and store: ``gnnserve_ppr_refreshed_lists``), over its graphs."""
    out = {"stale": sum(v for _, v in metric_samples(metrics_port, "gnnserve_ppr_stale_lists"))}
    for labels, v in metric_samples(metrics_port, "gnnserve_ppr_refreshed_lists_total"):
        out[labels["outcome"]] = out.get(labels["outcome"], 0.0) + v
    return out


def predict_under_updates(address: str, model: str, num_nodes: int, edges: list[tuple[int, int]], rate: float,
                          seconds: float, rounds: int, writers: int = 16, server_pid: int | None = None,
                          metrics_port: int | None = None) -> dict:
    """One-node Predict latency (raw stub calls) in alternating blocks without and with ``rate`` single-edge
    updates/s sent by another process; with ``server_pid``, the server's CPU use per side (cores busy: CPU
    seconds over wall seconds); with ``metrics_port``, the stale PPR lists at the end of each updating block
    and what the refresh thread did with its pushes (:func:`ppr_refresh`, the differences over the blocks)."""
    import multiprocessing as mp

    import grpc

    from clients._gen import gnnserve_pb2 as pb
    from clients._gen import gnnserve_pb2_grpc as pbg

    ctx = mp.get_context("spawn")
    lat: dict[str, list[float]] = {"quiet": [], "updating": []}
    busy: dict[str, list[float]] = {"quiet": [0.0, 0.0], "updating": [0.0, 0.0]}  # CPU s, wall s
    sent = ctx.Value("q", 0)
    rng = np.random.default_rng(5)
    t_updating = 0.0
    refresh = [ppr_refresh(metrics_port)] if metrics_port is not None else []
    with grpc.insecure_channel(address) as ch:
        stub = pbg.GnnServiceStub(ch)
        stub.Predict(pb.PredictRequest(model=model, nodes=[0]), timeout=60)
        for _ in range(rounds):
            for side in ("quiet", "updating"):
                stop = ctx.Event()
                proc = None
                if side == "updating":
                    proc = ctx.Process(target=_stream, args=(address, model, edges, rate, writers, stop, sent),
                                       daemon=True)
                    proc.start()
                    t_wait = time.monotonic() + 60
                    while sent.value == 0 and time.monotonic() < t_wait:  # the stream is running
                        time.sleep(0.01)
                    n0, t0 = sent.value, time.perf_counter()
                c_start, w_start = _cpu_s(server_pid), time.perf_counter()
                t_end = time.perf_counter() + seconds
                while time.perf_counter() < t_end:
                    v = int(rng.integers(0, num_nodes))
                    t1 = time.perf_counter()
                    stub.Predict(pb.PredictRequest(model=model, nodes=[v]), timeout=60)
                    lat[side].append(1e3 * (time.perf_counter() - t1))
                c_end = _cpu_s(server_pid)
                if c_start is not None and c_end is not None:
                    busy[side][0] += c_end - c_start
                    busy[side][1] += time.perf_counter() - w_start
                if proc is not None:
                    t_updating += time.perf_counter() - t0
                    n_block = sent.value - n0
                    stop.set()
                    proc.join(60)
                    sent.value = 0
                    lat.setdefault("_sent", []).append(n_block)
                    if metrics_port is not None:
                        refresh.append(ppr_refresh(metrics_port))
    blocks = lat.pop("_sent", [])
    out: dict[str, Any] = {f"{side}_{q}": _pct(xs, p) for side, xs in lat.items()
                           for q, p in (("p50_ms", 50), ("p99_ms", 99))}
    out["ratio_p50"] = out["updating_p50_ms"] / out["quiet_p50_ms"]
    out["ratio_p99"] = out["updating_p99_ms"] / out["quiet_p99_ms"]
    out["updates_per_s_achieved"] = sum(blocks) / max(t_updating, 1e-9)
    out["predicts"] = {k: len(v) for k, v in lat.items()}
    for side, (cpu_s, wall_s) in busy.items():
        out[f"{side}_server_cores"] = cpu_s / wall_s if wall_s > 0 else float("nan")
    if refresh:
        out["stale_after_blocks"] = [int(r["stale"]) for r in refresh[1:]]
        out["refreshed"] = {o: int(refresh[-1].get(o, 0) - refresh[0].get(o, 0)) for o in ("stored", "voided")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--repo", help="a model repository with --model in it")
    src.add_argument("--dataset", help="a dataset file: a GCN is trained on it into --cache-dir first")
    src.add_argument("--synthetic", type=int, help="a synthetic graph of this many nodes (trained into --cache-dir)")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "gnnserve-bench-updates"))
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--updates", type=int, default=400, help="single-edge and single-row updates per kind")
    ap.add_argument("--batches", type=int, default=10, help="batched updates (half add, half remove)")
    ap.add_argument("--batch-edges", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1000.0, help="updates per second during the updating blocks")
    ap.add_argument("--writers", type=int, default=16, help="threads sending the update stream")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each Predict block")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-args", default="", help="extra `gnnserve serve` flags, e.g. '--ppr-refresh-tolerance 16'")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from kernels.datasets import load_dataset, synthetic_sbm
    from serve.registry import find_dataset

    if args.repo:
        repo = Path(args.repo)
        ckpt = repo / args.model / "1"
        meta = json.loads((ckpt / "config.json").read_text())["dataset"]
        # where the server finds it: REPO/_data/<fingerprint> or the source the checkpoint recorded
        ds = find_dataset(meta["fingerprint"], meta.get("source"), ckpt, repo=repo)
        name = repo.name
    else:
        if args.dataset:
            ds = load_dataset(args.dataset)
            name = Path(args.dataset).stem
        else:
            ds = synthetic_sbm(args.synthetic, num_classes=8, avg_degree=20, num_features=64, seed=1,
                               name=f"synthetic-{args.synthetic}")
            name = ds.name
        repo = Path(args.cache_dir) / name
        if not (repo / args.model / "1").exists():
            print(f"training a GCN on {name} into {repo} ...", flush=True)
            make_repo(repo, ds, {args.model: "gcn"}, epochs=args.epochs, patience=args.epochs)
    g = ds.graph
    rng = np.random.default_rng(0)
    single = _absent_edges(g, rng, args.updates // 2 + 1)
    batch_edges = _absent_edges(g, np.random.default_rng(1), args.batch_edges)
    rows = np.random.default_rng(2).normal(size=(args.updates, ds.num_features)).astype(np.float32)
    kinds = {
        "single edge": [{"add_edges": [single[i // 2]]} if i % 2 == 0 else {"remove_edges": [single[i // 2]]}
                        for i in range(args.updates)],
        "single feature row": [{"features": {int(v): rows[i]}}
                               for i, v in enumerate(np.random.default_rng(3).integers(0, g.num_nodes, args.updates))],
        f"{args.batch_edges} edges": [{"add_edges": batch_edges} if i % 2 == 0 else {"remove_edges": batch_edges}
                                      for i in range(args.batches)],
    }
    mport = free_port()
    with tempfile.TemporaryDirectory() as logdir, \
            ServerProcess(repo, "--update-log-dir", logdir, "--poll-s", "0", "--metrics-port", str(mport),
                          *args.serve_args.split()) as srv, \
            GnnClient(srv.address, timeout=120) as c, GnnClient(srv.address, timeout=120) as reader:
        c.predict(args.model, [0])
        reader.predict(args.model, [0])
        pid = srv.proc.pid if srv.proc is not None else None
        upd_rows, ryw = update_phase(c, args.model, kinds, reader)
        for kind, cpu in cpu_phase(c, args.model, kinds, pid).items():
            upd_rows[kind].update(cpu)
        under = predict_under_updates(srv.address, args.model, g.num_nodes, _absent_edges(g, rng, 4 * args.writers),
                                      args.rate, args.seconds, args.rounds, args.writers, server_pid=pid,
                                      metrics_port=mport)
        final = c.get_model(args.model)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n### Live-graph updates: {name} (N = {g.num_nodes:,}, E = {g.num_edges:,}), model {args.model}\n")
    print(f"{when}, {platform.machine()} {platform.node()}; command: python benchmarks/updates.py "
          + " ".join(argv if argv is not None else sys.argv[1:]) + "\n")
    print("| update | count | updates/s | round trip p50 / p99 (ms) | server apply p50 / p99 (ms) | "
          "server CPU per update p50 / mean (ms) | PPR lists left stale, mean |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, r in upd_rows.items():
        print(f"| {kind} | {r['updates']} | {r['per_s']:,.0f} | {r['rtt_p50_ms']:.2f} / {r['rtt_p99_ms']:.2f} | "
              f"{r['apply_p50_ms']:.2f} / {r['apply_p99_ms']:.2f} | {r['server_cpu_p50_ms']:.2f} / "
              f"{r['server_cpu_mean_ms']:.2f} | {r['ppr_deferred_mean']:.1f} |")
    print(f"\nRead-your-writes: {ryw['ryw_ok']} of {ryw['ryw_total']} reads on a second connection with "
          f"min_graph_version saw the update; their Predict p50 / p99 {ryw['ryw_predict_p50_ms']:.2f} / "
          f"{ryw['ryw_predict_p99_ms']:.2f} ms.\n")
    print("| one-node Predict | p50 (ms) | p99 (ms) | server's cores busy |")
    print("|---|---:|---:|---:|")
    print(f"| no updates | {under['quiet_p50_ms']:.3f} | {under['quiet_p99_ms']:.3f} | "
          f"{under['quiet_server_cores']:.2f} |")
    print(f"| {under['updates_per_s_achieved']:,.0f} single-edge updates/s (asked {args.rate:,.0f}, "
          f"{args.writers} writers) | "
          f"{under['updating_p50_ms']:.3f} | {under['updating_p99_ms']:.3f} | {under['updating_server_cores']:.2f} |")
    print(f"| ratio | {under['ratio_p50']:.2f}x | {under['ratio_p99']:.2f}x | |")
    if under.get("refreshed") and any(under["refreshed"].values()):
        r = under["refreshed"]
        print(f"\nStale PPR lists pushed by the refresh thread or handed over by lookups during the update stream: "
              f"{r['stored']:,} stored, {r['voided']:,} voided by an update that came between push and store; "
              f"stale lists after each updating block: "
              f"{', '.join(f'{x:,}' for x in under['stale_after_blocks'])}.")
    print(f"\n{os.cpu_count()} CPUs on this machine (the update stream's client process shares them).")
    print(f"\nGraph version at the end: {final.graph_version} (every edge added was removed again).")
    if args.json:
        Path(args.json).write_text(json.dumps({"dataset": name, "nodes": g.num_nodes, "edges": g.num_edges,
                                               "updates": upd_rows, "read_your_writes": ryw,
                                               "predict_under_updates": under, "when": when}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
