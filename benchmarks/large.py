"""Large graphs (issue #19): train, index, start and serve a product-like synthetic graph beside Amazon Computers.

For each dataset, a synthetic graph shaped like a product co-purchase graph
(``synthetic:N:seed:products``: mean degree about 50, heavy-tailed degrees, 100 features, 47
classes; ``--nodes``, default 2,000,000) and Amazon Computers (``--amazon``, ``none`` to skip):

1. **load**: generate or read the dataset (the CSR build timed on its own) and save it as a
   memory-mappable dataset directory inside the model repository (``REPO/_data/<fingerprint>``);
2. **train** a plain GCN and a shaDow-GCN (``--models``) with ``gnnserve train``'s own code
   (:func:`models.train.train`) in a child process each: the stage times it records
   (``metrics.json["stage_times_s"]``: load, PPR lists, fit, knob table), its wall time and the
   child's peak RSS;
3. **PPR index**: build the shaDow model's top-K index for every node into ``REPO/_ppr`` (what
   ``gnnserve serve`` opens from disk), timed;
4. **start**: ``gnnserve serve --repo REPO --warm-projections`` in a subprocess (both models, the
   index on disk): seconds until it is ready, and its resident memory (VmRSS) then and its peak
   (VmHWM) at the end;
5. **serve**: single-node Predict p50/p99 at the model's default knobs, interleaved with the no-op
   gRPC floor, and batched throughput (``--clients`` async clients x ``--batch``-node requests for
   ``--seconds``). The client side is :func:`benchmarks.serve.run_client` (same measurement as
   ``benchmarks/serve.py``: a child process with grpc + NumPy only, the floor interleaved in blocks
   of :data:`benchmarks.serve.FLOOR_BLOCK`); the floor server is its :class:`NoopServer`.

PPR settings: teleport 0.15, ``eps`` ``--ppr-eps`` (default 1e-4, ten times the training default:
at 1e-5 the push cost about 1.9 ms per node on the products shape here, an hour for 2 M nodes on
2 cores; at 1e-4 0.14 ms), top-64. Training settings are :data:`benchmarks.serve.TRAIN_SETTINGS`
(+ ``SHADOW_SETTINGS`` for shaDow), ``--epochs`` for GCN and ``--shadow-epochs`` for shaDow.

    nice -n 10 python benchmarks/large.py                        # 2 M nodes + Amazon Computers
    python benchmarks/large.py --nodes 3000 --amazon none --epochs 2 --shadow-epochs 1 --queries 30 --seconds 1

Prints a Markdown table per dataset and a side-by-side summary (and ``--json`` writes every figure).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.serve import (  # noqa: E402
    DEFAULT_DATA,
    SHADOW_SETTINGS,
    TRAIN_SETTINGS,
    NoopServer,
    fmt,
    run_client,
)
from tests.serving import ServerProcess  # noqa: E402

MODELS = ("gcn", "shadow-gcn")
# A training run in a child process: models.train.train with JSON settings, stage lines on stderr,
# then the child's peak RSS.
# The peak is VmHWM: getrusage's ru_maxrss survives exec on Linux, so it would report the parent's
# resident size at the fork when that was larger.
_HWM = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])"
_TRAIN_CHILD = f"""
import json, sys
from models.train import _stage_logging, train
_stage_logging()
train(sys.argv[1], sys.argv[2], sys.argv[3], progress=False, overwrite=True, **json.loads(sys.argv[4]))
print("PEAK_RSS_KB", {_HWM}, file=sys.stderr)
"""


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process in bytes (empty when it is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, val = line.split(":", 1)
                out[key] = int(val.split()[0]) * 1024
    except OSError:
        pass
    return out


# Loading (generating) and saving a dataset in a child process, so that the benchmark process does
# not keep the generator's peak memory while the server runs: prints one JSON line of figures.
_LOAD_CHILD = f"""
import json, os, sys, time
import numpy as np
from kernels.datasets import load_dataset
spec, repo, pool, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
ds = load_dataset(spec)
load_s = time.perf_counter() - t0
deg = np.diff(np.asarray(ds.graph.indptr))
d = repo + "/_data/" + ds.fingerprint()
t0 = time.perf_counter()
if os.path.isdir(spec):  # a dataset directory already: link it, no copy
    os.makedirs(repo + "/_data", exist_ok=True)
    if not os.path.lexists(d):
        os.symlink(os.path.abspath(spec), d)
else:
    ds.save(d)
save_s = time.perf_counter() - t0
test = ds.split("test")
rng = np.random.default_rng(seed)
print(json.dumps({{"load_s": load_s, "load_times": dict(ds.load_times), "save_s": save_s, "data_dir": d,
                  "num_nodes": ds.num_nodes, "num_edges": ds.graph.num_edges, "mean_degree": float(deg.mean()),
                  "max_degree": int(deg.max()), "num_features": ds.num_features, "num_classes": ds.num_classes,
                  "pool": [int(v) for v in rng.choice(test, size=min(pool, len(test)), replace=False)],
                  "peak_rss": {_HWM} * 1024}}))
"""


def load_child(spec: str, repo: Path, pool: int, seed: int) -> dict[str, Any]:
    """Load or generate ``spec`` and save it under ``repo/_data`` in a child process; its figures."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _LOAD_CHILD, spec, str(repo), str(pool), str(seed)],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"loading {spec} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_child(data: Path, kind: str, out: Path, settings: dict[str, Any], log_path: Path) -> dict[str, Any]:
    """Train ``kind`` on the dataset directory ``data`` in a child process; its figures."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    with open(log_path, "w") as err:
        proc = subprocess.run([sys.executable, "-c", _TRAIN_CHILD, str(data), kind, str(out), json.dumps(settings)],
                              stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    text = log_path.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"training {kind} failed ({proc.returncode}):\n{text[-4000:]}")
    peak = next((int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("PEAK_RSS_KB")), 0)
    metrics = json.loads((out / "metrics.json").read_text())
    conf = json.loads((out / "config.json").read_text())
    return {"wall_s": wall, "peak_rss": peak, "stages": metrics.get("stage_times_s", {}),
            "test_accuracy": metrics["test_accuracy"], "val_accuracy": metrics["val_accuracy"],
            "epochs_run": metrics["epochs_run"], "default_S": conf["default_sampling_width"],
            "default_K": conf["default_ppr_budget"], "ppr": conf.get("ppr"), "minibatch": metrics.get("minibatch")}


def _json_cache(path: Path, reuse: bool, make: Any) -> tuple[dict[str, Any], bool]:
    """``make()``'s figures, saved to ``path``; with ``reuse``, the saved ones when present."""
    if reuse and path.exists():
        return json.loads(path.read_text()), True
    out = make()
    path.write_text(json.dumps(out))
    return out, False


def _dir_bytes(d: Path, prefix: str = "") -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file() and f.name.startswith(prefix)) if d.is_dir() else 0


def cache_budgets(num_nodes: int, kinds: list[str], args: argparse.Namespace) -> dict[str, int]:
    """Server cache budgets for a graph of ``num_nodes``: ``auto`` sizes the projection cache to every
    model's table and the activation cache to one table per plain model at its default width (the
    defaults, 2 GiB and 256 MiB, hold neither at 2 M nodes), never below the defaults."""
    hidden = int(TRAIN_SETTINGS["hidden"])
    plain = sum(1 for k in kinds if not k.startswith("shadow"))
    proj = max(2 << 30, int(1.05 * len(kinds) * num_nodes * hidden * 4))
    act = max(256 << 20, int(1.05 * plain * num_nodes * (4 * hidden + 1)))
    return {"projection": proj if args.projection_cache_bytes == "auto" else int(float(args.projection_cache_bytes)),
            "activation": act if args.activation_cache_bytes == "auto" else int(float(args.activation_cache_bytes))}


def measure(label: str, server: ServerProcess, kinds: list[str], pool: list[int], noop: NoopServer,
            args: argparse.Namespace, log: Any, tag: str = "") -> dict[str, Any]:
    """One-node p50/p99 against the interleaved floor and batched load, per model."""
    out = {}
    for kind in kinds:
        spec_c = {"seed": args.seed, "clients": args.clients, "batch": args.batch, "kind": "predict",
                  "address": server.address, "model": kind, "floor_address": noop.address, "pool": pool,
                  "queries": args.queries, "seconds": args.seconds}
        r = run_client(spec_c)
        out[kind] = {"seq": r["seq"], "load": r["load"]}
        s = r["seq"]
        log(f"{label} {kind}{tag}: p50 {s['p50_ms']:.2f} ms (floor {s.get('floor_p50_ms', float('nan')):.2f}), "
            f"p99 {s['p99_ms']:.2f} ms, {r['load']['per_s']:.0f} nodes/s")
    return out


def bench_dataset(label: str, spec: str, args: argparse.Namespace, kinds: list[str], work: Path,
                  noop: NoopServer, log: Any) -> dict[str, Any]:
    from kernels.datasets import GraphDataset

    res: dict[str, Any] = {"label": label, "spec": spec, "models": {}}
    repo = work / "repo"
    log(f"{label}: loading {spec} (child process) ...")
    info, reused = _json_cache(work / "load.json", args.reuse, lambda: load_child(spec, repo, args.pool, args.seed))
    info = dict(info)
    pool = info.pop("pool")
    data_dir = Path(info.pop("data_dir"))
    res["load_peak_rss"] = info.pop("peak_rss")
    res.update(info)
    res["reused"] = ["load"] if reused else []
    log(f"{label}: N={res['num_nodes']:,} E={res['num_edges']:,} (mean degree {res['mean_degree']:.1f}, max "
        f"{res['max_degree']:,}), loaded in {res['load_s']:.1f} s {res['load_times']}, saved in {res['save_s']:.1f} s, "
        f"peak RSS {res['load_peak_rss'] / 2**30:.2f} GiB" + (" (reused)" if reused else ""))

    for kind in kinds:
        settings = dict(TRAIN_SETTINGS, epochs=args.epochs, patience=args.epochs, eval_nodes=args.eval_nodes,
                        knob_accuracy_nodes=args.knob_accuracy_nodes)
        if kind.startswith("shadow"):
            settings.update(SHADOW_SETTINGS, epochs=args.shadow_epochs, patience=args.shadow_epochs,
                            ppr={"eps": args.ppr_eps})
        log(f"{label}: training {kind} ({settings}) ...")
        r, reused = _json_cache(work / f"train-{kind}.json", args.reuse and (repo / kind / "1" / "config.json").exists(),
                                lambda k=kind, st=settings: train_child(data_dir, k, repo / k / "1", st,
                                                                        work / f"train-{k}.log"))
        res["models"][kind] = {"train": r}
        if reused:
            res["reused"].append(f"train {kind}")
        log(f"{label}: {kind} trained in {r['wall_s']:.0f} s (peak RSS {r['peak_rss'] / 2**30:.2f} GiB), "
            f"stages {r['stages']}, test acc {r['test_accuracy']:.4f}" + (" (reused)" if reused else ""))

    # the PPR index of every node and its induced top-K table, where `gnnserve serve` opens them (REPO/_ppr)
    for kind in kinds:
        ppr = res["models"][kind]["train"]["ppr"]
        if not ppr:
            continue
        from kernels.ppr import PPRConfig, PPRIndex

        g = GraphDataset.load_dir(data_dir).graph
        log(f"{label}: building the PPR index of {g.num_nodes:,} nodes ({ppr}) ...")
        t0 = time.perf_counter()
        idx = PPRIndex.open_or_build(repo / "_ppr", g, PPRConfig.from_dict(ppr), progress=False)
        m = res["models"][kind]
        m["ppr_index_s"] = time.perf_counter() - t0
        if idx.path is not None:
            m["ppr_index_bytes"] = _dir_bytes(Path(idx.path)) - _dir_bytes(Path(idx.path), "induced_")
        log(f"{label}: PPR index in {m['ppr_index_s']:.0f} s")
        if args.induced_table_bytes > 0:
            t0 = time.perf_counter()
            m["induced"] = idx.ensure_induced(g, max_bytes=args.induced_table_bytes)
            m["induced_s"] = time.perf_counter() - t0
            if idx.path is not None:
                m["induced_bytes"] = _dir_bytes(Path(idx.path), "induced_")
            log(f"{label}: induced top-K table {'attached' if m['induced'] else 'skipped (over the limit)'} in "
                f"{m['induced_s']:.0f} s ({m.get('induced_bytes', 0) / 2**30:.2f} GiB on disk)")
        # with --reuse the index opens from disk: the times of the run that built it stand
        saved = work / f"index-{kind}.json"
        keys = ("ppr_index_s", "induced_s")
        if args.reuse and saved.exists():
            m.update(json.loads(saved.read_text()))
            res["reused"].append(f"index {kind}")
        else:
            saved.write_text(json.dumps({k: m[k] for k in keys if k in m}))
        del g, idx
        gc.collect()

    budgets = cache_budgets(res["num_nodes"], kinds, args)
    res["budgets"] = budgets
    # the server opens the table built above; its budget is what the table takes (what the memory check counts)
    induced = max((m.get("induced_bytes", 0) for m in res["models"].values() if m.get("induced")), default=0)
    res["budgets"]["induced"] = int(induced * 1.05) + (1 << 20) if induced else 0
    serve_args = ["--poll-s", "0", "--warm-projections", "--log-level", "WARNING",
                  "--induced-table-bytes", str(res["budgets"]["induced"]),
                  "--projection-cache-bytes", str(budgets["projection"]),
                  "--activation-cache-bytes", str(budgets["activation"]), *args.serve_arg]
    log(f"{label}: starting gnnserve serve {' '.join(serve_args)} ...")
    server = ServerProcess(repo, *serve_args, log_path=work / "serve.log")
    t0 = time.perf_counter()
    server.start(timeout=3600)
    res["server_start_s"] = time.perf_counter() - t0
    assert server.proc is not None
    res["server_rss_ready"] = _proc_status(server.proc.pid).get("VmRSS", 0)
    log(f"{label}: server ready in {res['server_start_s']:.1f} s, RSS {res['server_rss_ready'] / 2**30:.2f} GiB")
    try:
        for kind, r in measure(label, server, kinds, pool, noop, args, log).items():
            res["models"][kind].update(r)
        res["server_rss_end"] = _proc_status(server.proc.pid).get("VmRSS", 0)
        res["server_hwm"] = _proc_status(server.proc.pid).get("VmHWM", 0)
    finally:
        server.kill()
    if args.stateless:
        res["stateless"] = bench_stateless(label, data_dir, repo, kinds, pool, work, noop, args, log, budgets)
    return res


def bench_stateless(label: str, data_dir: Path, repo: Path, kinds: list[str], pool: list[int], work: Path,
                    noop: NoopServer, args: argparse.Namespace, log: Any, budgets: dict[str, int]) -> dict[str, Any]:
    """Features, adjacency rows and PPR lists loaded into a private redis-server with ``gnnserve
    features load`` / ``gnnserve graph load``; a replica with only the checkpoints (``serve --graph``)
    measured twice: first with empty caches (cold), then again (warm). The replica gets the in-memory
    server's projection and activation budgets (its tables are as large: N rows each, filled as
    batches ask), so the two differ only in where the graph and features live."""
    from tests.redis_server import RedisServer

    out: dict[str, Any] = {}
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cli = [sys.executable, "-m", "serve.cli"]
    rdir = work / "redis"
    shutil.rmtree(rdir, ignore_errors=True)
    rdir.mkdir()
    with RedisServer(directory=rdir) as rs:
        url = rs.unix_url
        for what, cmd in (("features", [*cli, "features", "load", "--dataset", str(data_dir), "--redis", url,
                                        "--no-progress"]),
                          ("graph", [*cli, "graph", "load", "--dataset", str(data_dir), "--redis", url,
                                     "--repo", str(repo), "--no-progress"])):
            log(f"{label}: gnnserve {what} load into Redis ...")
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            if proc.returncode != 0:
                raise RuntimeError(f"gnnserve {what} load failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
            out[f"{what}_load_s"] = time.perf_counter() - t0
            log(f"{label}: {what} loaded in {out[f'{what}_load_s']:.0f} s")
        c = rs.client()
        out["redis_used_memory"] = int(c.info("memory")["used_memory"])
        c.close()
        out["redis_rss"] = _proc_status(rs.proc.pid).get("VmRSS", 0) if rs.proc else 0
        bare = work / "stateless-repo"
        shutil.rmtree(bare, ignore_errors=True)
        bare.mkdir()
        for kind in kinds:
            shutil.copytree(repo / kind, bare / kind)
        serve_args = ["--graph", url, "--features", url, "--poll-s", "0", "--log-level", "WARNING",
                      "--projection-cache-bytes", str(budgets["projection"]),
                      "--activation-cache-bytes", str(budgets["activation"]), *args.stateless_arg]
        log(f"{label}: starting a stateless replica: gnnserve serve {' '.join(serve_args)} ...")
        server = ServerProcess(bare, *serve_args, log_path=work / "serve-stateless.log")
        t0 = time.perf_counter()
        server.start(timeout=3600)
        out["server_start_s"] = time.perf_counter() - t0
        assert server.proc is not None
        out["server_rss_ready"] = _proc_status(server.proc.pid).get("VmRSS", 0)
        log(f"{label}: stateless replica ready in {out['server_start_s']:.1f} s, "
            f"RSS {out['server_rss_ready'] / 2**30:.2f} GiB")
        try:
            out["cold"] = measure(label, server, kinds, pool, noop, args, log, " stateless cold")
            out["warm"] = measure(label, server, kinds, pool, noop, args, log, " stateless warm")
            out["server_hwm"] = _proc_status(server.proc.pid).get("VmHWM", 0)
        finally:
            server.kill()
    return out


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    la, le = results["load_start"], results["load_end"]
    print("## Large graphs (issue #19)\n")
    print(f"`python benchmarks/large.py {' '.join(results['argv'])}`".replace(" `", "`"))
    print(f"\n{results['date']}, {platform.machine()}, {os.cpu_count()} CPUs, load average at start {la[0]:.1f}, "
          f"at end {le[0]:.1f}; wall time {results['wall_s'] / 60:.1f} min; peak RSS of the benchmark process "
          f"{results['self_peak_rss'] / 2**30:.2f} GiB. Single-node: {args.queries} sequential requests at the "
          f"model's default knobs, interleaved with the no-op floor; load: {args.clients} async clients x "
          f"{args.batch}-node requests for {args.seconds:g} s. PPR eps {args.ppr_eps:g}; shaDow evaluated on "
          f"{args.eval_nodes:,} val/test nodes, knob accuracy on {args.knob_accuracy_nodes:,}.\n")
    for d in results["datasets"]:
        lt = d["load_times"]
        print(f"### {d['label']}\n")
        print(f"N = {d['num_nodes']:,}, E = {d['num_edges']:,} (CSR entries; mean degree {d['mean_degree']:.1f}, "
              f"max {d['max_degree']:,}), F = {d['num_features']}, C = {d['num_classes']}. Load {d['load_s']:.1f} s "
              f"(" + ", ".join(f"{k} {v:.1f} s" for k, v in lt.items()) + f"; peak RSS "
              f"{d['load_peak_rss'] / 2**30:.2f} GiB), saved as a dataset directory in {d['save_s']:.1f} s. Server ({', '.join(d['models'])}; --warm-projections): ready in {d['server_start_s']:.1f} s, "
              f"RSS {d['server_rss_ready'] / 2**30:.2f} GiB at ready, {d.get('server_rss_end', 0) / 2**30:.2f} GiB "
              f"after the load, peak {d.get('server_hwm', 0) / 2**30:.2f} GiB.\n")
        print("| model | epochs | test acc | train wall s | PPR lists s | fit s | knob table s | train peak RSS GiB | "
              "PPR index s | default S/K | single p50 ms | single p99 ms | floor p50 ms | x floor p50 | "
              "floor p99 ms | nodes/s (load) | load p50 ms |")
        print("|" + "---|" * 17)
        for kind, m in d["models"].items():
            t, s, ld = m["train"], m.get("seq", {}), m.get("load", {})
            st = t["stages"]
            f50 = s.get("floor_p50_ms")
            ratio = s["p50_ms"] / f50 if f50 else None
            print(f"| {kind} | {t['epochs_run']} | {fmt(100 * t['test_accuracy'])} % | {fmt(t['wall_s'], 1)} | "
                  f"{fmt(st.get('ppr_lists'), 1)} | {fmt(st.get('fit'), 1)} | {fmt(st.get('knob_table'), 1)} | "
                  f"{fmt(t['peak_rss'] / 2**30)} | {fmt(m.get('ppr_index_s'), 1)} | "
                  f"{t['default_S'] or 'exact'}/{t['default_K'] or '-'} | {fmt(s.get('p50_ms'))} | "
                  f"{fmt(s.get('p99_ms'))} | {fmt(f50)} | {fmt(ratio)} | {fmt(s.get('floor_p99_ms'))} | "
                  f"{fmt(ld.get('per_s'), 0)} | {fmt(ld.get('p50_ms'), 1)} |")
        print()
        idx_rows = [(k, m) for k, m in d["models"].items() if m.get("ppr_index_s") is not None]
        for kind, m in idx_rows:
            print(f"{kind}: PPR index {fmt(m['ppr_index_s'], 1)} s, {fmt(m.get('ppr_index_bytes', 0) / 2**30)} GiB on "
                  f"disk; induced top-K table " + (f"{fmt(m.get('induced_s'), 1)} s, "
                  f"{fmt(m.get('induced_bytes', 0) / 2**30)} GiB on disk" if m.get("induced") else "none") + ".")
        b = d.get("budgets")
        if b:
            print(f"Server cache budgets: projections {b['projection'] / 2**30:.2f} GiB, first-layer activations "
                  f"{b['activation'] / 2**30:.2f} GiB.")
        if d.get("reused"):
            print(f"Reused from an earlier run in the work directory: {', '.join(d['reused'])}.")
        st = d.get("stateless")
        if st:
            print(f"\nStateless replica (features, adjacency rows and PPR lists in a private redis-server over a unix "
                  f"socket; only the checkpoints on the replica): `features load` {fmt(st['features_load_s'], 1)} s, "
                  f"`graph load` {fmt(st['graph_load_s'], 1)} s, Redis used_memory "
                  f"{st['redis_used_memory'] / 2**30:.2f} GiB; replica ready in {fmt(st['server_start_s'], 1)} s, "
                  f"RSS {st['server_rss_ready'] / 2**30:.2f} GiB, peak {st.get('server_hwm', 0) / 2**30:.2f} GiB. "
                  f"Cold: the first pass after start; warm: the same measurement again.\n")
            print("| model | pass | single p50 ms | x floor p50 | single p99 ms | nodes/s (load) | x in-memory nodes/s |")
            print("|---|---|---|---|---|---|---|")
            for kind in d["models"]:
                mem = d["models"][kind].get("load", {}).get("per_s")
                for pas in ("cold", "warm"):
                    r = st.get(pas, {}).get(kind)
                    if not r:
                        continue
                    s_, ld = r["seq"], r["load"]
                    f50 = s_.get("floor_p50_ms")
                    print(f"| {kind} | {pas} | {fmt(s_['p50_ms'])} | {fmt(s_['p50_ms'] / f50 if f50 else None)} | "
                          f"{fmt(s_['p99_ms'])} | {fmt(ld['per_s'], 0)} | {fmt(ld['per_s'] / mem if mem else None)} |")
            print()
    if len(results["datasets"]) > 1:
        print("### Side by side\n")
        labels = [d["label"] for d in results["datasets"]]
        print("| figure | " + " | ".join(labels) + " |")
        print("|---|" + "---|" * len(labels))
        rows = [("nodes", lambda d: f"{d['num_nodes']:,}"), ("CSR edges", lambda d: f"{d['num_edges']:,}"),
                ("server start s", lambda d: fmt(d["server_start_s"], 1)),
                ("server RSS at ready GiB", lambda d: fmt(d["server_rss_ready"] / 2**30))]
        for kind in results["kinds"]:
            rows += [
                (f"{kind} training mode", lambda d, k=kind: "mini-batch" if d["models"][k]["train"].get("minibatch")
                 else "full batch" if not k.startswith("shadow") else "PPR batches"),
                (f"{kind} train wall s", lambda d, k=kind: fmt(d["models"][k]["train"]["wall_s"], 1)),
                (f"{kind} single p50 ms (x floor)", lambda d, k=kind: (
                    f"{fmt(d['models'][k]['seq']['p50_ms'])} ({fmt(d['models'][k]['seq']['p50_ms'] / d['models'][k]['seq']['floor_p50_ms'])}x)")),
                (f"{kind} single p99 ms", lambda d, k=kind: fmt(d["models"][k]["seq"]["p99_ms"])),
                (f"{kind} nodes/s (load)", lambda d, k=kind: fmt(d["models"][k]["load"]["per_s"], 0)),
            ]
        for kind in results["kinds"]:
            if kind.startswith("shadow"):
                rows.append((f"{kind} PPR index s", lambda d, k=kind: fmt(d["models"][k].get("ppr_index_s"), 1)))
        for name, f in rows:
            print(f"| {name} | " + " | ".join(f(d) for d in results["datasets"]) + " |")
        print()


def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2_000_000, help="nodes of the synthetic graph")
    ap.add_argument("--dataset", default=None,
                    help="a dataset (directory: linked, not copied; .npz; any load_dataset spec) instead of --nodes")
    ap.add_argument("--dataset-label", default=None)
    ap.add_argument("--shape", default="products", help="synthetic shape (kernels.datasets.SYNTHETIC_SHAPES)")
    ap.add_argument("--amazon", default=str(DEFAULT_DATA / "amazon_computers.npz"),
                    help="Amazon Computers .npz to run beside it ('none' to skip)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--epochs", type=int, default=30, help="GCN epochs (full batch)")
    ap.add_argument("--shadow-epochs", type=int, default=5, help="shaDow-GCN epochs")
    ap.add_argument("--ppr-eps", type=float, default=1e-4)
    ap.add_argument("--eval-nodes", type=int, default=10_000,
                    help="shaDow: validation nodes per epoch and test nodes at the end (TrainConfig.eval_nodes)")
    ap.add_argument("--knob-accuracy-nodes", type=int, default=10_000,
                    help="validation nodes of each knob-table row's accuracy (TrainConfig.knob_accuracy_nodes)")
    ap.add_argument("--queries", type=int, default=300, help="sequential single-node requests per model")
    ap.add_argument("--seconds", type=float, default=5.0, help="batched load per model")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--pool", type=int, default=5000, help="random test nodes the requests draw from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", type=Path, default=None, help="keep the repositories here (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--reuse", action="store_true",
                    help="with --work-dir: keep a dataset, trained models and PPR index found there from an earlier "
                         "run (their figures are the earlier run's) instead of starting over")
    ap.add_argument("--induced-table-bytes", type=float, default=16 << 30,
                    help="build the shaDow model's induced top-K table beside the index (memory-mapped) when its "
                         "estimate fits this many bytes, and serve with it (0: none)")
    ap.add_argument("--projection-cache-bytes", default="auto",
                    help="server --projection-cache-bytes ('auto': every model's table fits)")
    ap.add_argument("--activation-cache-bytes", default="auto",
                    help="server --activation-cache-bytes ('auto': one table per plain model at its default width)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for `gnnserve serve` (repeat: --serve-arg=--max-delay-ms --serve-arg=1)")
    ap.add_argument("--stateless", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure a stateless replica over a private redis-server, cold and warm")
    ap.add_argument("--stateless-arg", action="append", default=[],
                    help="one more argument for the stateless replica's `gnnserve serve`")
    args = ap.parse_args(argv)
    args.induced_table_bytes = int(args.induced_table_bytes)
    if args.reuse and args.work_dir is None:
        ap.error("--reuse needs --work-dir")
    kinds = [k for k in args.models.split(",") if k]
    for k in kinds:
        if k not in ("gcn", "sage", "shadow-gcn", "shadow-sage"):
            ap.error(f"unknown model {k!r}")

    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    datasets = [(f"synthetic products, {args.nodes:,} nodes", f"synthetic:{args.nodes}:{args.seed}:{args.shape}")]
    if args.dataset:
        datasets = [(args.dataset_label or Path(args.dataset).name, str(args.dataset))]
    if args.amazon.lower() != "none":
        datasets.append(("Amazon Computers", args.amazon))
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gnnserve-large-"))
    results: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else list(argv), "load_start": os.getloadavg(),
                               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                               "kinds": kinds, "datasets": []}
    noop = NoopServer()
    try:
        for i, (label, spec) in enumerate(datasets):
            d = work / f"d{i}"
            if not args.reuse:
                shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True, exist_ok=True)
            results["datasets"].append(bench_dataset(label, spec, args, kinds, d, noop, log))
    finally:
        noop.stop()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    results["load_end"] = os.getloadavg()
    results["wall_s"] = time.perf_counter() - t_start
    results["self_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
