"""PPR extraction (issue 3): our push against PyG's ``get_ppr``, index builds, induced batches.

One run, three tables (Markdown on stdout):

1. **Per-target extraction** on Amazon Computers and Coauthor Physics at teleport ``alpha`` (0.15),
   ``eps`` (1e-5), K (200): ``kernels.ppr.ppr_topk`` on a batch of targets (both numba threads),
   the same one target per call, and ``torch_geometric.utils.get_ppr`` on the same batch (PyG's
   ``alpha`` is also the teleport probability, its threshold ``r >= alpha*eps*deg`` on its
   alpha-scaled residue is our ``r >= eps*deg``: the same parameters mean the same thing). Rounds
   are interleaved so machine noise hits both alike; medians are reported. PyG's time is for
   ``get_ppr`` alone (it returns every touched node; the top-K cut on top is not charged to it).
   **Top-K overlap with exact PPR** (power iteration, ``kernels.ppr.ppr_exact``) for both:
   ``|L ∩ E| / |E|`` with ``E`` = target + the K - 1 best other nodes by exact score (nodes with
   exact score 0 left out) and ``L`` = target + the K - 1 best others by the method's score.
2. **Index build** (``PPRIndex.build`` streaming to disk, all threads) for every node of both
   graphs and of a synthetic SBM with 2M nodes and ~60M directed edges (``--skip-large`` skips
   it). Each build runs in a fresh child process on the memory-mapped graph, so its peak RSS is
   the build's own memory (graph pages + per-thread scratch + one chunk of results).
3. **Induced batch** construction (``induced_batch`` on index lookups of Amazon Computers) for 1,
   64 and 1024 random targets at K = 32, 64, 128, 200 (and the lookup itself).

    python benchmarks/ppr.py                 # everything (the 2M-node build takes long)
    python benchmarks/ppr.py --skip-large    # the two real graphs only
    python benchmarks/ppr.py --quick         # fewer targets and rounds, no large graph

Writes only under ``--workdir`` (graphs and indexes; the large index is deleted afterwards unless
``--keep``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_DATA = Path(os.environ.get("GNNSERVE_DATA", REPO.parent / "shared" / "data"))
DEFAULT_WORK = Path(os.environ.get("TMPDIR", "/tmp")) / "gnnserve-bench-ppr"
DATASETS = {"amazon_computers": "Amazon Computers", "coauthor_physics": "Coauthor Physics"}


def _kernels():
    """Import the kernels modules without the package ``__init__`` (which pulls in torch)."""
    import importlib
    import types

    if "kernels" not in sys.modules:
        pkg = types.ModuleType("kernels")
        pkg.__path__ = [str(REPO / "kernels")]
        sys.modules["kernels"] = pkg
    return (
        importlib.import_module("kernels.graph"),
        importlib.import_module("kernels.ppr"),
        importlib.import_module("kernels.subgraph"),
    )


def load_graph(data_dir: Path, name: str):
    """The graph of a ``.npz`` dataset (edge list only: the features are not needed here)."""
    graph_mod, _, _ = _kernels()
    with np.load(data_dir / f"{name}.npz") as z:
        ei = z["edge_index"]
        n = int(z["y"].shape[0])
    return graph_mod.CSRGraph.from_edge_index(ei, num_nodes=n)


def machine() -> str:
    model = platform.processor() or "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    import numba

    return (
        f"{model}, {os.cpu_count()} cores, numba {numba.__version__} with {numba.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )


# ============================================================================ 1. extraction
def topk_lists(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, targets: np.ndarray, k: int):
    """Per target: {target} + the k - 1 best other columns by value (rows index ``targets``)."""
    out = []
    order = np.lexsort((-vals, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    bounds = np.searchsorted(rows, np.arange(len(targets) + 1))
    for b, t in enumerate(targets):
        c = cols[bounds[b] : bounds[b + 1]]
        c = c[c != t][: k - 1]
        out.append(set(c.tolist()) | {int(t)})
    return out


def exact_lists(exact: np.ndarray, targets: np.ndarray, k: int):
    out = []
    for b, t in enumerate(targets):
        row = exact[b].copy()
        row[t] = -1.0
        best = np.argsort(-row, kind="stable")[: k - 1]
        best = best[row[best] > 0]
        out.append(set(best.tolist()) | {int(t)})
    return out


def overlap(lists, ref) -> float:
    return float(np.mean([len(a & e) / len(e) for a, e in zip(lists, ref, strict=True)]))


def bench_extraction(args, name: str) -> dict:
    import torch
    from torch_geometric.utils import get_ppr

    _, ppr, _ = _kernels()
    g = load_graph(args.data_dir, name)
    cfg = ppr.PPRConfig(alpha=args.alpha, eps=args.eps, topk=args.k)
    rng = np.random.default_rng(0)
    targets = np.sort(rng.choice(g.num_nodes, args.targets, replace=False))
    singles = targets[: args.single]
    ei = torch.from_numpy(g.edge_index())
    tt = torch.from_numpy(targets)
    # warm-up: numba compilation / cache load for both
    ppr.ppr_topk(g, targets[:4], cfg)
    get_ppr(ei, alpha=args.alpha, eps=args.eps, target=tt[:4], num_nodes=g.num_nodes)
    ours, ours1, pyg = [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        optr, onodes, oscores = ppr.ppr_topk(g, targets, cfg)
        ours.append((time.perf_counter() - t0) / len(targets))
        t0 = time.perf_counter()
        for t in singles:
            ppr.ppr_topk(g, int(t), cfg)
        ours1.append((time.perf_counter() - t0) / len(singles))
        t0 = time.perf_counter()
        pei, pw = get_ppr(ei, alpha=args.alpha, eps=args.eps, target=tt, num_nodes=g.num_nodes)
        pyg.append((time.perf_counter() - t0) / len(targets))
    # quality against exact PPR
    t0 = time.perf_counter()
    exact = ppr.ppr_exact(g, targets, cfg, tol=1e-10)
    exact_s = time.perf_counter() - t0
    ref = exact_lists(exact, targets, args.k)
    our_rows = np.repeat(np.arange(len(targets)), np.diff(optr))
    our_lists = topk_lists(our_rows, onodes, oscores.astype(np.float64), targets, args.k)
    prow = np.searchsorted(targets, pei[0].numpy())
    pyg_lists = topk_lists(prow, pei[1].numpy(), pw.numpy().astype(np.float64), targets, args.k)
    # how far the lists are from exact, in units of the per-node bound eps * deg
    wd = g.degrees.astype(np.float64)
    gap = np.concatenate(
        [(exact[b, onodes[optr[b] : optr[b + 1]]] - oscores[optr[b] : optr[b + 1]]) / (args.eps * np.maximum(wd[onodes[optr[b] : optr[b + 1]]], 1))
         for b in range(len(targets))]
    )  # fmt: skip
    return {
        "name": DATASETS[name],
        "n": g.num_nodes,
        "e": g.num_edges,
        "ours_ms": statistics.median(ours) * 1e3,
        "ours1_ms": statistics.median(ours1) * 1e3,
        "pyg_ms": statistics.median(pyg) * 1e3,
        "ours_overlap": overlap(our_lists, ref),
        "pyg_overlap": overlap(pyg_lists, ref),
        "pyg_touched": pei.shape[1] / len(targets),
        "max_gap": float(gap.max()),
        "exact_s": exact_s,
    }


# ============================================================================ 2. index build
def _child_build(args) -> None:
    """(child process) build the index of a saved graph; print one JSON line."""
    graph_mod, ppr, _ = _kernels()
    g = graph_mod.CSRGraph.load(args.graph_dir, mmap=True)
    cfg = ppr.PPRConfig(alpha=args.alpha, eps=args.eps, topk=args.k)
    ppr.ppr_topk(g, [0], cfg)  # compile / cache load outside the timed part
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    idx = ppr.PPRIndex.build(g, cfg, directory=out, progress=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    size = sum(f.stat().st_size for f in out.iterdir())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"wall": wall, "cpu": cpu, "rss": rss, "bytes": size, "nnz": len(idx.nodes),
                      "n": g.num_nodes, "e": g.num_edges, "graph_bytes": g.nbytes()}))  # fmt: skip


def _child_gen(args) -> None:
    """(child process) generate the large synthetic graph and save it for memory mapping."""
    import importlib

    _kernels()
    ds = importlib.import_module("kernels.datasets")
    t0 = time.perf_counter()
    g = ds.synthetic_sbm(args.large_nodes, avg_degree=args.large_degree, num_features=8, seed=0).graph
    g.save(args.graph_dir)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": time.perf_counter() - t0, "rss": rss, "n": g.num_nodes, "e": g.num_edges}))


def _run_child(cmd: list[str], timeout: float | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, *cmd], stdout=subprocess.PIPE, text=True, check=True, timeout=timeout
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _common(args) -> list[str]:
    return ["--alpha", str(args.alpha), "--eps", str(args.eps), "--k", str(args.k)]


def bench_build(args, label: str, graph_dir: Path, keep: bool = True) -> dict:
    out = args.workdir / f"index-{graph_dir.parent.name}"
    res = _run_child(["_build", "--graph-dir", str(graph_dir), "--out", str(out), *_common(args)])
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    res["name"] = label
    res["index_dir"] = str(out)
    return res


# ============================================================================ 3. induced batches
def bench_induced(args, graph, index_dir: Path) -> tuple[list[dict], list[dict]]:
    """Induced batches three ways, interleaved on the same target sets: induced from the graph
    (``kernels.subgraph.induced_batch``), and from precomputed induced tables (``InducedTable``)
    built at K = 64 (the training default) and at the index's K_max."""
    _, ppr, sub = _kernels()
    idx = ppr.PPRIndex.open(index_dir, graph)
    tables, builds = {}, []
    for tk in sorted({min(64, idx.k_max), idx.k_max}):
        t0 = time.perf_counter()
        tables[tk] = sub.InducedTable.build(graph, idx.lookup, tk)
        builds.append({"k": tk, "seconds": time.perf_counter() - t0, "edges": len(tables[tk].src),
                       "bytes": tables[tk].nbytes})  # fmt: skip
    rng = np.random.default_rng(1)
    rows = []
    sub.induced_batch(graph, *idx.lookup([0, 1], 8))  # warm-up (numba)
    for tab in tables.values():
        tab.batch(graph, np.array([0, 1]), *idx.lookup([0, 1], 8))
    for b in (1, 64, 1024):
        for k in (32, 64, 128, 200):
            if k > idx.k_max:
                continue
            reps = max(5, min(200, 20_000 // (b * k // 8 + 1)))
            look, ind = [], []
            tab = {tk: [] for tk in tables if tk >= k}
            for _ in range(reps):
                targets = rng.choice(graph.num_nodes, b, replace=False)
                t0 = time.perf_counter()
                ptr, nodes = idx.lookup(targets, k)
                t1 = time.perf_counter()
                batch = sub.induced_batch(graph, ptr, nodes)
                t2 = time.perf_counter()
                look.append(t1 - t0)
                ind.append(t2 - t1)
                for tk in tab:
                    t3 = time.perf_counter()
                    tb = tables[tk].batch(graph, targets, ptr, nodes)
                    tab[tk].append(time.perf_counter() - t3)
                    if tb.graph.num_edges != batch.graph.num_edges:
                        raise AssertionError("induced table and induced_batch disagree")
            rows.append({"b": b, "k": k, "rows": batch.num_rows, "edges": batch.graph.num_edges,
                         "unique": len(batch.unique_ids), "lookup_ms": statistics.median(look) * 1e3,
                         "induced_ms": statistics.median(ind) * 1e3, "reps": reps,
                         "table_ms": {tk: statistics.median(v) * 1e3 for tk, v in tab.items()}})  # fmt: skip
    return rows, builds


# ============================================================================ main
def fmt_bytes(x: float) -> str:
    return f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.0f} MiB"


def fmt_s(x: float) -> str:
    return f"{x / 60:.1f} min" if x >= 120 else f"{x:.1f} s"


def main(argv: list[str] | None = None) -> None:
    from kernels.malloc import tune_malloc

    tune_malloc()  # keep freed memory for reuse (see kernels/malloc.py)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "mode", nargs="?", default="all", choices=["all", "_build", "_gen"], help=argparse.SUPPRESS
    )
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORK)
    ap.add_argument("--alpha", type=float, default=0.15, help="teleport probability (PyG convention)")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--targets", type=int, default=200, help="targets per extraction batch")
    ap.add_argument("--single", type=int, default=32, help="targets timed one per call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true", help="skip the 2M-node synthetic index build")
    ap.add_argument("--sections", default="extraction,build,induced",
                    help="comma list of extraction, build, induced (default: all three)")
    ap.add_argument("--large-nodes", type=int, default=2_000_000)
    ap.add_argument("--large-degree", type=float, default=30.0)
    ap.add_argument("--keep", action="store_true", help="keep the large index files")
    ap.add_argument("--quick", action="store_true", help="64 targets, 1 round, no large graph")
    ap.add_argument("--graph-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mode == "_build":
        return _child_build(args)
    if args.mode == "_gen":
        return _child_gen(args)
    if args.quick:
        args.targets, args.rounds, args.single, args.skip_large = 64, 1, 8, True
    args.workdir.mkdir(parents=True, exist_ok=True)
    graph_mod, _, _ = _kernels()

    started = time.perf_counter()
    print("## PPR extraction (issue 3)\n")
    cmd = " ".join(["python", f"benchmarks/{Path(__file__).name}", *sys.argv[1:]])
    print(f"- command: `{cmd}`")
    print(f"- machine: {machine()}")
    print(f"- date: {datetime.date.today().isoformat()}")
    print(f"- parameters: teleport alpha = {args.alpha} (non-lazy), eps = {args.eps}, K = {args.k}\n")
    sys.stdout.flush()

    sections = set(args.sections.split(","))
    # 1. extraction
    ext = [bench_extraction(args, name) for name in DATASETS] if "extraction" in sections else []
    if ext:
        print(f"### Per-target extraction ({args.targets} random targets, median of {args.rounds} interleaved rounds)\n")
        print("| graph | N | E | ours, batch (ms/target) | ours, 1 per call (ms/target) | PyG get_ppr (ms/target) "
              "| speed-up (batch) | top-K overlap with exact: ours | PyG | max (exact - ours) / (eps deg) |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in ext:
            print(f"| {r['name']} | {r['n']:,} | {r['e']:,} | {r['ours_ms']:.3f} | {r['ours1_ms']:.3f} | "
                  f"{r['pyg_ms']:.3f} | {r['pyg_ms'] / r['ours_ms']:.1f}x | {r['ours_overlap']:.3f} | "
                  f"{r['pyg_overlap']:.3f} | {r['max_gap']:.2f} |")  # fmt: skip
        print()
        sys.stdout.flush()

    # 2. index builds (the induced section needs the Amazon Computers index: built here if absent)
    builds = []
    for name, label in DATASETS.items():
        gdir = args.workdir / name / "graph"
        load_graph(args.data_dir, name).save(gdir)
        if "build" in sections or not (args.workdir / f"index-{name}" / "meta.json").exists():
            builds.append(bench_build(args, label, gdir))
    if "build" in sections and not args.skip_large:
        gdir = args.workdir / f"sbm-{args.large_nodes}-{args.large_degree:g}" / "graph"
        gen = None
        if not (gdir / "graph.json").exists():
            gen = _run_child(["_gen", "--graph-dir", str(gdir), "--large-nodes", str(args.large_nodes),
                              "--large-degree", str(args.large_degree)])  # fmt: skip
        label = f"synthetic SBM ({args.large_nodes:,} nodes)"
        res = bench_build(args, label, gdir, keep=args.keep)
        res["gen"] = gen
        builds.append(res)
    if builds:
        print("### Index build (all nodes, top-K lists to disk, fresh process per graph)\n")
        print("| graph | N | E | build wall | build CPU | ms/node (wall) | peak RSS | graph (CSR) | index on disk "
              "| entries |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in builds:
            print(f"| {r['name']} | {r['n']:,} | {r['e']:,} | {fmt_s(r['wall'])} | {fmt_s(r['cpu'])} | "
                  f"{r['wall'] / r['n'] * 1e3:.3f} | {fmt_bytes(r['rss'])} | {fmt_bytes(r['graph_bytes'])} | "
                  f"{fmt_bytes(r['bytes'])} | {r['nnz']:,} |")  # fmt: skip
        for r in builds:
            if r.get("gen"):
                print(f"\n(synthetic graph generated in {fmt_s(r['gen']['seconds'])}, "
                      f"peak RSS {fmt_bytes(r['gen']['rss'])})")  # fmt: skip
        print()
        sys.stdout.flush()

    # 3. induced batches on Amazon Computers
    if "induced" not in sections:
        return
    g = graph_mod.CSRGraph.load(args.workdir / "amazon_computers" / "graph", mmap=False)
    rows, tbuilds = bench_induced(args, g, args.workdir / "index-amazon_computers")
    tks = [t["k"] for t in tbuilds]
    print("### Induced batch on Amazon Computers (PPR index lookups, median over random target sets)\n")
    print("Induced from the graph (`induced_batch`, scans each row's neighbour list) against the precomputed "
          "induced tables (`InducedTable`, a filtered copy of each target's stored edges), same targets, "
          "interleaved.\n")  # fmt: skip
    print("| targets | K | rows | edges | distinct ids | lookup (ms) | induced_batch (ms) | "
          + " | ".join(f"table k={tk} (ms)" for tk in tks) + " |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(tks))
    for r in rows:
        cells = " | ".join(f"{r['table_ms'][tk]:.3f}" if tk in r["table_ms"] else "-" for tk in tks)
        print(f"| {r['b']} | {r['k']} | {r['rows']:,} | {r['edges']:,} | {r['unique']:,} | "
              f"{r['lookup_ms']:.3f} | {r['induced_ms']:.3f} | {cells} |")  # fmt: skip
    print()
    for t in tbuilds:
        print(f"- table k={t['k']}: built in {fmt_s(t['seconds'])} (one thread), {t['edges']:,} stored edges, "
              f"{fmt_bytes(t['bytes'])}")  # fmt: skip
    print(f"\nTotal benchmark time {fmt_s(time.perf_counter() - started)}; load average at the end "
          f"{os.getloadavg()[0]:.1f}.")  # fmt: skip


if __name__ == "__main__":
    main()
