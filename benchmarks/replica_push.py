"""A stateless replica's own PPR pushes against the same pushes on the graph in memory, in one process.

A real redis-server on a free port (``tests.redis_server.RedisServer``), the dataset's graph loaded into it with the
model's PPR lists (from ``--repo``'s ``_ppr`` index when it has one), a :class:`serve.graph.store.RedisGraphStore`
over it (the replica's row cache, ``--cache-mib``). Measured, one call at a time, each checked equal to the
in-memory push on the same graph to the bit (an unweighted graph; on a weighted one the node order and the scores
to 1e-5): ``serve.graph.store.pushed_new_node`` (a new node with ``--new-degree`` random neighbours) against
``kernels.ppr.ppr_new_node``, and ``serve.graph.store.pushed_lists`` for batches of ``--batches`` random existing
targets (the lists a replica pushes again after a structural update) against ``kernels.ppr.ppr_topk``.
Then ``--edits`` single-edge updates applied to the replica and to a copy in memory, each followed by a lookup of
the same ``--edit-targets`` lists through the replica's PPR index (a list a structural update may have moved is
pushed again; one whose push read no changed row is kept), checked against a fresh ``ppr_topk``.
``--base-tree DIR`` runs the same measurement from another source tree (an exported or checked-out revision) in a
child process first, for a before / after table.

    python benchmarks/replica_push.py --repo REPO --model shadow-gcn --dataset amazon_computers.npz
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(args: argparse.Namespace) -> dict:
    import numpy as np

    from kernels.datasets import load_dataset
    from kernels.ppr import PPRConfig, ppr_new_node, ppr_topk
    from serve.graph.store import RedisGraphStore, pushed_lists, pushed_new_node
    from serve.graph_store import load_graph
    from tests.redis_server import RedisServer

    cfg = PPRConfig.from_dict(json.loads((args.repo / args.model / "1" / "config.json").read_text())["ppr"])
    ds = load_dataset(args.dataset)
    g = ds.graph
    weighted = g.weights is not None
    out: dict = {"nodes": g.num_nodes, "edges": g.num_edges, "config": cfg.to_dict()}

    def same(a_nodes, a_scores, b_nodes, b_scores) -> None:
        np.testing.assert_array_equal(a_nodes, b_nodes)
        if weighted:
            np.testing.assert_allclose(a_scores, b_scores, rtol=1e-5)
        else:
            np.testing.assert_array_equal(a_scores, b_scores)

    with RedisServer(binary=args.redis_server) as red:
        t0 = time.time()
        load_graph(ds, red.url, ppr=[cfg], ppr_cache_dir=str(args.repo / "_ppr"), progress=False)
        out["load_s"] = time.time() - t0
        print(f"{g.num_nodes:,} nodes, {g.num_edges:,} edges loaded into Redis in {out['load_s']:.1f} s", flush=True)
        store = RedisGraphStore(red.url, g.fingerprint(), cache_bytes=int(args.cache_mib) << 20)
        try:
            rng = np.random.default_rng(args.seed)
            rep, mem, trips = [], [], []
            for _ in range(args.new_nodes):
                nb = rng.choice(g.num_nodes, args.new_degree, replace=False)
                r0 = store.round_trips
                t = time.perf_counter()
                a = pushed_new_node(store, nb, None, cfg)
                rep.append(time.perf_counter() - t)
                trips.append(store.round_trips - r0)
                t = time.perf_counter()
                b = ppr_new_node(g, nb, None, cfg)
                mem.append(time.perf_counter() - t)
                same(a[0], a[1], b[0], b[1])
            out["new_node"] = {"replica_ms": [1e3 * x for x in rep], "memory_ms": [1e3 * x for x in mem],
                               "round_trips": trips}
            for size in args.batches:
                rep, mem = [], []
                for _ in range(args.rounds):
                    t_ = np.sort(rng.choice(g.num_nodes, size, replace=False))
                    t = time.perf_counter()
                    got = pushed_lists(store, t_, cfg)
                    rep.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    ptr, nodes, scores = ppr_topk(g, t_, cfg)
                    mem.append(time.perf_counter() - t)
                    for j, v in enumerate(t_.tolist()):
                        same(got[v][0], got[v][1], nodes[ptr[j]:ptr[j + 1]], scores[ptr[j]:ptr[j + 1]])
                out[f"lists_{size}"] = {"replica_ms": [1e3 * x for x in rep], "memory_ms": [1e3 * x for x in mem]}
            if args.new_batch:
                out["new_batch"] = new_batch(args, red.url, g, cfg, rng, same)
            if args.edits:
                out["edits"] = edits(args, store, g, cfg, rng, same)
        finally:
            store.close()
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def new_batch(args: argparse.Namespace, url: str, g, cfg, rng, same) -> dict | None:
    """``--rounds`` requests of ``--new-batch`` new nodes each: ``pushed_new_nodes`` (the pushes in lockstep, as a
    Predict's new nodes are pushed since 2026-11-28) against ``pushed_new_node`` once per node, interleaved, each on
    a fresh replica store (its row cache empty, the degree chunks loaded before the clock starts), checked equal to
    ``ppr_new_node``. None on a tree without ``pushed_new_nodes``."""
    import numpy as np

    from kernels.ppr import ppr_new_node
    from serve.graph import store as st

    if not hasattr(st, "pushed_new_nodes"):
        return None
    times: dict[str, list[float]] = {"together": [], "each": []}
    trips: dict[str, list[int]] = {"together": [], "each": []}
    for i in range(args.rounds):
        specs = [(rng.choice(g.num_nodes, args.new_degree, replace=False), None) for _ in range(args.new_batch)]
        want = [ppr_new_node(g, nb, w, cfg) for nb, w in specs]
        for mode in ("together", "each")[:: 1 if i % 2 else -1]:
            store = st.RedisGraphStore(url, g.fingerprint(), cache_bytes=int(args.cache_mib) << 20)
            try:
                store.push_degrees(np.arange(g.num_nodes, dtype=np.int64))
                r0 = store.round_trips
                t = time.perf_counter()
                got = (st.pushed_new_nodes(store, specs, cfg) if mode == "together"
                       else [st.pushed_new_node(store, nb, w, cfg) for nb, w in specs])
                times[mode].append(1e3 * (time.perf_counter() - t))
                trips[mode].append(store.round_trips - r0)
            finally:
                store.close()
            for a, b in zip(got, want, strict=True):
                same(a[0], a[1], b[0], b[1])
    return {"size": args.new_batch, "ms": times, "round_trips": trips}


def edits(args: argparse.Namespace, store, g, cfg, rng, same) -> dict:
    """Single-edge additions applied to the replica (``apply_rows``, as its update follower does) and to a copy in
    memory (:func:`kernels.graph_edit.apply_edit`); after each, one lookup of the same ``--edit-targets`` lists
    through the replica's PPR index (each list it must push again is pushed then), checked against ``ppr_topk`` on
    the edited graph. The first edit is not timed: the snapshot's lists are pushed once after any change."""
    import numpy as np

    from kernels.graph_edit import GraphEdit, apply_edit
    from kernels.ppr import ppr_topk

    idx = store.ppr_index(cfg)
    hot = np.sort(rng.choice(g.num_nodes, args.edit_targets, replace=False))
    cur = g
    rep, mem, kept = [], [], []
    for i in range(args.edits + 1):
        while True:
            u, v = (int(x) for x in rng.choice(cur.num_nodes, 2, replace=False))
            if v not in set(cur.neighbors(u).tolist()):
                break
        eff = apply_edit(cur, GraphEdit.make(add_src=[u], add_dst=[v]))
        cur = eff.graph
        rows = {}
        for x in eff.changed_rows.tolist():
            a, b = int(cur.indptr[x]), int(cur.indptr[x + 1])
            rows[x] = (cur.indices[a:b].astype(np.int64), None if cur.weights is None else cur.weights[a:b])
        store.apply_rows(rows, cur.num_nodes)
        k0 = getattr(store, "lists_kept", 0)
        t = time.perf_counter()
        got_ptr, got_nodes = idx.lookup(hot)
        dt = time.perf_counter() - t
        t = time.perf_counter()
        ptr, nodes, _ = ppr_topk(cur, hot, cfg)
        dm = time.perf_counter() - t
        np.testing.assert_array_equal(got_ptr, ptr)
        np.testing.assert_array_equal(got_nodes, nodes)
        if i:
            rep.append(1e3 * dt)
            mem.append(1e3 * dm)
            kept.append(getattr(store, "lists_kept", 0) - k0)
    return {"replica_ms": rep, "memory_ms": mem, "kept": kept}


def table(label: str, res: dict, batches: list[int]) -> list[str]:
    import numpy as np

    def p50(x: list[float]) -> float:
        return float(np.median(x))

    nn = res["new_node"]
    rows = [f"| {label} | new node ({len(nn['replica_ms'])} calls) | {p50(nn['replica_ms']):.2f} "
            f"(first {nn['replica_ms'][0]:.1f}) | {p50(nn['memory_ms']):.2f} | "
            f"{p50(nn['replica_ms']) / p50(nn['memory_ms']):.1f}x | {p50(nn['round_trips']):.0f} |"]
    for size in batches:
        r = res[f"lists_{size}"]
        rows.append(f"| {label} | {size} existing targets ({len(r['replica_ms'])} batches) | "
                    f"{p50(r['replica_ms']):.2f} | {p50(r['memory_ms']):.2f} | "
                    f"{p50(r['replica_ms']) / p50(r['memory_ms']):.1f}x | |")
    if res.get("new_batch"):
        nb = res["new_batch"]
        for mode, what in (("together", "in lockstep"), ("each", "one after another")):
            rows.append(f"| {label} | {nb['size']} new nodes of one request, {what} ({len(nb['ms'][mode])} requests, "
                        f"fresh row cache) | {p50(nb['ms'][mode]):.2f} | | | {p50(nb['round_trips'][mode]):.0f} |")
    if "edits" in res:
        e = res["edits"]
        rows.append(f"| {label} | the same lists after each of {len(e['replica_ms'])} single-edge updates (lists "
                    f"kept without a push: p50 {p50(e['kept']):.0f}) | {p50(e['replica_ms']):.2f} | "
                    f"{p50(e['memory_ms']):.2f} | {p50(e['replica_ms']) / p50(e['memory_ms']):.1f}x | |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="a model repository holding --model (and its _ppr index)")
    ap.add_argument("--model", default="shadow-gcn", help="the shaDow model whose PPR configuration is pushed")
    ap.add_argument("--dataset", required=True, help="the model's dataset (a path or a name kernels.datasets loads)")
    ap.add_argument("--new-nodes", type=int, default=40, help="new-node pushes (default: %(default)s)")
    ap.add_argument("--new-degree", type=int, default=5, help="each new node's neighbours (default: %(default)s)")
    ap.add_argument("--batches", default="1,64", help="sizes of the batches of existing targets (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=6, help="batches of each size (default: %(default)s)")
    ap.add_argument("--cache-mib", type=int, default=256, help="the replica's row cache (default: %(default)s)")
    ap.add_argument("--new-batch", type=int, default=8,
                    help="new nodes per request in the lockstep comparison (0: skip; default: %(default)s)")
    ap.add_argument("--edits", type=int, default=10,
                    help="single-edge updates, each followed by a lookup of --edit-targets lists (default: %(default)s)")
    ap.add_argument("--edit-targets", type=int, default=64, help="(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--redis-server", default=None, help="a redis-server binary (default: the tests' choice)")
    ap.add_argument("--base-tree", type=Path, default=None, help="measure this source tree first, in a child process")
    ap.add_argument("--json-out", type=Path, default=None, help=argparse.SUPPRESS)  # the base child's result
    ap.add_argument("--source-tree", type=Path, default=REPO, help=argparse.SUPPRESS)  # the base child's tree
    args = ap.parse_args(argv)
    args.batches = [int(x) for x in str(args.batches).split(",") if x]
    sys.path.insert(0, str(args.source_tree))

    results: list[tuple[str, dict]] = []
    if args.base_tree is not None:
        base = args.base_tree.resolve()
        with tempfile.TemporaryDirectory() as d:
            child_out = Path(d) / "base.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--repo", str(args.repo.resolve()), "--model",
                   args.model, "--dataset", str(Path(args.dataset).resolve()) if Path(args.dataset).exists()
                   else args.dataset, "--new-nodes", str(args.new_nodes), "--new-degree", str(args.new_degree),
                   "--new-batch", str(args.new_batch),
                   "--batches", ",".join(map(str, args.batches)), "--rounds", str(args.rounds), "--cache-mib",
                   str(args.cache_mib), "--seed", str(args.seed), "--edits", str(args.edits), "--edit-targets",
                   str(args.edit_targets), "--source-tree", str(base), "--json-out",
                   str(child_out)] + (["--redis-server", args.redis_server] if args.redis_server else [])
            subprocess.run(cmd, cwd=str(base), env={**os.environ, "PYTHONPATH": str(base)}, check=True)
            results.append((f"base ({args.base_tree})", json.loads(child_out.read_text())))
    res = measure(args)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(res))
        return 0
    results.append(("this tree", res))
    print(f"\n`python benchmarks/replica_push.py {shlex.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{res['nodes']:,} nodes, {res['edges']:,} edges; PPR {res['config']}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| tree | push | replica p50 ms | in memory p50 ms | replica / memory | Redis round trips p50 |")
    print("|---|---|---|---|---|---|")
    for label, r in results:
        print("\n".join(table(label, r, args.batches)))
    print(f"\npeak RSS of this tree's process: {res['peak_rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
