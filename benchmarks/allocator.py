"""Allocator settings (kernels/malloc.py) side by side: glibc defaults against ``tune_malloc()``.

Each setting runs in its own fresh process (mallopt acts per process), in alternation, on the same
work: a large batch induced from the graph (``kernels.subgraph.induced_batch``, 1024 targets at
K = 64 on Amazon Computers, whose output arrays are tens of MiB) repeated ``--reps`` times, and a
plain "allocate and touch N MiB" probe. Reported: median and 90th percentile per call, and the
ratio default / tuned.

    python benchmarks/allocator.py                       # Amazon Computers from ../shared/data
    python benchmarks/allocator.py --dataset PATH.npz --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT_DATA = REPO.parent / "shared" / "data" / "amazon_computers.npz"


def child(args: argparse.Namespace) -> None:
    """(child process) time the work under the allocator setting given by GNNSERVE_MALLOC."""
    from kernels.malloc import tune_malloc

    tuned = tune_malloc()
    import numpy as np

    from kernels.datasets import load_npz
    from kernels.ppr import PPRConfig, PPRIndex
    from kernels.subgraph import induced_batch

    ds = load_npz(args.dataset)
    idx = PPRIndex.open_or_build(args.cache, ds.graph, PPRConfig(topk=args.k), progress=False)
    rng = np.random.default_rng(0)
    sets = [rng.choice(ds.graph.num_nodes, args.targets, replace=False) for _ in range(args.reps)]
    induced_batch(ds.graph, *idx.lookup(sets[0][:8], args.k))  # compile / cache load
    ind = []
    for t in sets:
        ptr, nodes = idx.lookup(t, args.k)
        t0 = time.perf_counter()
        induced_batch(ds.graph, ptr, nodes)
        ind.append(time.perf_counter() - t0)
    touch = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        a = np.empty(args.mib << 20, dtype=np.uint8)
        a[::4096] = 1
        touch.append(time.perf_counter() - t0)
        del a
    print(json.dumps({"tuned": tuned, "induced": ind, "touch": touch}))


def q(v: list[float], p: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(p * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "gnnserve-bench-alloc")
    ap.add_argument("--targets", type=int, default=1024)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mib", type=int, default=64, help="size of the allocate-and-touch probe")
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per setting, alternating")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    cmd = [sys.executable, __file__, "--child", "--dataset", str(args.dataset), "--cache", str(args.cache),
           "--targets", str(args.targets), "--k", str(args.k), "--reps", str(args.reps), "--mib", str(args.mib)]  # fmt: skip
    res: dict[str, dict[str, list[float]]] = {"default": {"induced": [], "touch": []},
                                              "tuned": {"induced": [], "touch": []}}  # fmt: skip
    for _ in range(args.rounds):
        for mode in ("default", "tuned"):
            env = {**os.environ, "GNNSERVE_MALLOC": "default" if mode == "default" else ""}
            out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            if r["tuned"] != (mode == "tuned"):
                raise SystemExit(f"the {mode} child reported tuned={r['tuned']}")
            for key in ("induced", "touch"):
                res[mode][key] += r[key]
    print("## Allocator settings (`benchmarks/allocator.py`)\n")
    print(f"- command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`".rstrip())
    print(f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at the end; date {datetime.date.today().isoformat()}")  # fmt: skip
    print(f"- work: induced_batch of {args.targets} targets at K = {args.k} on {args.dataset.stem}; "
          f"allocate and touch {args.mib} MiB; {args.reps} calls x {args.rounds} processes per setting\n")
    print("| work | default p50 (ms) | default p90 (ms) | tuned p50 (ms) | tuned p90 (ms) | p50 ratio | p90 ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key, label in (("induced", "induced_batch"), ("touch", f"touch {args.mib} MiB")):
        d, t = res["default"][key], res["tuned"][key]
        d50, d90, t50, t90 = statistics.median(d) * 1e3, q(d, 0.9) * 1e3, statistics.median(t) * 1e3, q(t, 0.9) * 1e3
        print(f"| {label} | {d50:.2f} | {d90:.2f} | {t50:.2f} | {t90:.2f} | {d50 / t50:.1f}x | {d90 / t90:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
