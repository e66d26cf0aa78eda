"""The serving stack's ceiling (issue 22 item 5): one server process against ``--processes N``, and
probabilities as repeated floats against packed bytes, interleaved in one run; and where a batched
request's server time goes outside the model.

Servers: ``gnnserve serve --repo REPO --read-only --warm-projections --poll-s 0 --processes P`` for
each variant of ``--processes`` (default ``1,2``; ``PtK``: P processes with K compute threads each,
through ``OMP_NUM_THREADS`` / ``NUMBA_NUM_THREADS`` / ``MKL_NUM_THREADS``, the first of which OpenBLAS
read too until 2026-11-27, when servers began to set their BLAS pools to one thread whatever K is
(``--blas-threads``); ``--processes N`` alone gives each of its N processes ``cores // N``; a trailing ``p``:
``OMP_WAIT_POLICY=PASSIVE``; a trailing ``a``: the standard asyncio event loop instead of the default,
uvloop), all started first and left idle while another is measured.
Load: ``--client-procs`` client processes (grpc.aio and NumPy, no torch), each with ``--clients``
async clients (one TCP connection each) sending ``--batch``-node Predict requests with ``return_probabilities`` for
``--seconds``; each reply is decoded to NumPy arrays as the SDK does (``clients._core.response_arrays``),
so the client's decoding cost is in the figures. Variants: every (P, encoding) pair, encoding
``repeated`` (``packed_outputs`` off: repeated int64 labels and float probabilities) or ``packed``.
Each of ``--rounds`` rounds runs every variant once, in an order rotated (and reversed every other
round) so drift in a shared machine's load falls on every variant alike; the table gives the median
over rounds. CPU: the server processes' (parent and children) and the clients' CPU seconds per phase
(``/proc``), in cores.

``pygN`` in ``--processes``: N processes of the PyG twin of ``benchmarks/serve.py`` (our trained weights
as PyG layers on each request's exact 2-hop subgraph, probabilities returned as gnnserve returns them) on
one port, on ``--device``, under the same load: the like-for-like baseline of issue 22's "10x PyG".
List them first (``--processes pyg1,pyg4,1,4``) to get each gnnserve variant over each PyG one.

``--profile S``: first, one server process under the same load for S seconds with (a) CPU seconds per
thread, by thread name (``py-spy dump`` names the Python threads; the BLAS and numba pools, gRPC's
C-core threads), and (b) ``py-spy record`` (non-blocking, 250 Hz, Python frames) of the event-loop
thread, split into gRPC/asyncio (frames inside grpc's Cython code and the event loop: receive,
protobuf parse, serialisation, send), validation, admission (pricing, queueing), the batcher's loop
and the response build. Needs py-spy (in the dev venv) and ptrace rights.

    python benchmarks/ceiling.py --repo /tmp/gnnserve-bench-ab/amazon_computers --model gcn \\
        --processes 1,1t1,2 --batch 64 --clients 8 --seconds 4 --rounds 8 --profile 15

On a machine with few cores the clients share the cores with the servers: the figures are what
that machine allows end to end, not the servers' ceiling alone.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


# ============================================================================ client side (child process)
async def _load(spec: dict[str, Any]) -> dict[str, Any]:
    from grpc import aio

    from clients._core import response_arrays
    from clients._gen import gnnserve_pb2 as pb
    from clients._gen import gnnserve_pb2_grpc as pb_grpc

    n_nodes, batch, seconds = spec["num_nodes"], spec["batch"], spec["seconds"]
    # a subchannel pool per channel: each client gets its own TCP connection (channels to one target
    # share one connection by default), so SO_REUSEPORT can spread them over the server processes
    opts = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    channels = [aio.insecure_channel(spec["address"], options=opts) for _ in range(spec["clients"])]
    stubs = [pb_grpc.GnnServiceStub(ch).Predict for ch in channels]

    def request(rng: np.random.Generator) -> Any:
        return pb.PredictRequest(model=spec["model"], nodes=rng.choice(n_nodes, size=batch, replace=False).tolist(),
                                 return_probabilities=True, packed_outputs=spec["packed"])

    lat: list[float] = []
    served = collections.Counter()
    answered = [0]
    try:
        warm = np.random.default_rng(spec["seed"])
        await asyncio.gather(*(s(request(warm), timeout=600) for s in stubs))  # connect, warm
        t0 = time.perf_counter()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        stop_at = t0 + seconds

        async def worker(i: int) -> None:
            rng = np.random.default_rng(spec["seed"] + 1000 + i)
            while time.perf_counter() < stop_at:
                req = request(rng)
                t = time.perf_counter()
                resp = await stubs[i](req, timeout=600)
                labels, probs, _ = response_arrays(resp)  # what the SDK does with every reply
                lat.append(1e3 * (time.perf_counter() - t))
                if len(labels) != batch or len(probs) != batch * resp.num_classes or resp.packed != spec["packed"]:
                    raise RuntimeError("bad reply")
                answered[0] += len(labels)
                served[resp.served_by] += 1

        await asyncio.gather(*(worker(i) for i in range(len(stubs))))
        wall = time.perf_counter() - t0
        ru = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for ch in channels:
            await ch.close()
    cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime  # the load only: no imports, no connecting
    return {"nodes": answered[0], "wall_s": wall, "lat_ms": lat, "served_by": dict(served), "cpu_s": cpu}


def client_main(spec: dict[str, Any]) -> None:
    print(json.dumps(asyncio.run(_load(spec))))


# ============================================================================ driver
def _proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its threads (utime + stime)."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    f = s[s.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(v) for v in out.split()]


def _thread_cpu(pid: int) -> dict[str, float]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as fh:
            s = fh.read()
        f = s[s.rindex(")") + 2:].split()
        out[tid] = (s[s.index("(") + 1:s.rindex(")")], (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def _bench_serve() -> Any:
    """``benchmarks/serve.py`` as a module (its PyG twin; the name ``serve`` is the server package's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gnnserve_bench_serve", REPO / "benchmarks" / "serve.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def pyg_serve(spec: dict[str, Any]) -> None:
    """One PyG twin server process (``--pyg-serve``): benchmarks/serve.py's ``PygModel`` (the same trained
    weights as PyG layers on each request's exact 2-hop subgraph) behind a ``grpc.aio`` server on
    ``spec["port"]``, shared with the other such processes (SO_REUSEPORT); writes its ready file, then
    serves until SIGTERM."""
    import torch

    from models.checkpoint import load_checkpoint
    from serve.registry import find_dataset

    bench = _bench_serve()
    torch.set_num_threads(int(spec["threads"]))
    ckpt_dir = Path(spec["checkpoint"])
    ckpt = load_checkpoint(ckpt_dir)
    # the dataset the server would find for it: by fingerprint among --data and the recorded source
    ds = find_dataset(ckpt.dataset_fingerprint, ckpt.config["dataset"].get("source"), ckpt_dir, spec["data"])
    with torch.inference_mode():
        xn = ckpt.model.norm(torch.from_numpy(np.asarray(ds.x, dtype=np.float32)))
    model = bench.PygModel(ckpt, ds, xn, spec["device"])
    server = bench.PygServer({spec["model"]: model}, port=int(spec["port"]), served_by=spec["served_by"])
    stop = [False]  # the server's loop thread serves; this one waits for SIGTERM
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    Path(spec["ready"]).write_text(str(server.port))
    while not stop[0]:
        time.sleep(0.2)
    server.stop()


def parse_variant(variant: str) -> tuple[int, str, bool, bool]:
    """``"P[tK][p][a]"`` -> (processes P, compute threads K or ``""``, passive OpenMP waiting, the standard
    asyncio loop): see :class:`Server`."""
    m = re.fullmatch(r"(\d+)(?:t(\d+))?(p?)(a?)", variant)
    if m is None or int(m.group(1)) < 1:
        raise SystemExit(f"--processes: {variant!r} is not a server variant (P, PtK, then optional p and a, in "
                         "that order: 2, 1t1, 1t1pa; or pygN)")
    return int(m.group(1)), m.group(2) or "", bool(m.group(3)), bool(m.group(4))


class Server:
    """``variant``: ``"P"`` (P processes, their default compute threads) or ``"PtK"`` (K compute threads
    per process: OMP_NUM_THREADS, NUMBA_NUM_THREADS and MKL_NUM_THREADS set to K); a trailing ``p``
    sets ``OMP_WAIT_POLICY=PASSIVE``, a trailing ``a`` runs the servers on the standard asyncio loop
    (``--event-loop asyncio``; without it, the default: uvloop where installed), e.g. ``1t1pa``. ``"pygN"``: N PyG twin processes on one port (:func:`pyg_serve`),
    each with ``cores // N`` torch threads, on ``--device``."""

    def __init__(self, args: argparse.Namespace, variant: str, workdir: Path) -> None:
        self._log = None
        if variant.startswith("pyg"):
            self._start_pyg(args, variant, workdir)
            return
        processes, threads, passive, plain_loop = parse_variant(variant)
        self.processes = processes
        env = dict(os.environ)
        if passive:  # OpenMP threads sleep at once when idle instead of spinning for a while
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        if threads:
            env.update({v: threads for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS")})
        ready = workdir / f"ready-{variant}"
        self.log_path = workdir / f"server-{variant}.log"
        cmd = [sys.executable, "-m", "serve.cli", "serve", "--repo", str(args.repo), "--port", "0", "--read-only",
               "--warm-projections", "--poll-s", "0", "--processes", str(self.processes), "--ready-file", str(ready),
               "--device", args.device, *(["--event-loop", "asyncio"] if plain_loop else []), *({True: ["--resident"], False: ["--no-resident"]}.get(args.resident, [])),
               *[a for d in args.data for a in ("--data", str(d))]]
        self._log = open(self.log_path, "wb")
        from serve.processes import _die_with_parent  # the server goes if this script is killed

        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                     preexec_fn=_die_with_parent)
        t_end = time.monotonic() + 600
        while not (ready.exists() and ready.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > t_end:
                raise RuntimeError(f"server ({variant}) did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        self.address = f"127.0.0.1:{int(ready.read_text())}"
        # the loop each process reports at start ("listening on ... (plaintext, uvloop event loop)")
        self.event_loops = sorted(set(re.findall(r"(\w+) event loop\)", self.log_path.read_text(errors="replace"))))
        self.pids = [self.proc.pid] + (_children(self.proc.pid) if self.processes > 1 else [])

    def _start_pyg(self, args: argparse.Namespace, variant: str, workdir: Path) -> None:
        import socket

        from serve.processes import _die_with_parent

        self.processes = int(variant[3:] or 1)
        with socket.socket() as sock:  # a free port for all of them (each binds it with SO_REUSEPORT)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ckpt_dir = sorted((args.repo / args.model).glob("*/config.json"), key=lambda p: int(p.parent.name))[-1].parent
        data = [str(d) for d in args.data]
        threads = max(1, (os.cpu_count() or 1) // self.processes)
        self.log_path = workdir / f"server-{variant}.log"
        self._log = open(self.log_path, "wb")
        self.procs, readies = [], []
        for i in range(self.processes):
            ready = workdir / f"ready-{variant}-{i}"
            readies.append(ready)
            spec = {"checkpoint": str(ckpt_dir), "data": data, "model": args.model, "device": args.device,
                    "port": port, "threads": threads, "ready": str(ready),
                    "served_by": f"pyg {i + 1}/{self.processes}"}
            self.procs.append(subprocess.Popen([sys.executable, __file__, "--pyg-serve", json.dumps(spec)],
                                               stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO,
                                               preexec_fn=_die_with_parent))
        t_end = time.monotonic() + 600
        while not all(r.exists() and r.read_text().strip() for r in readies):
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > t_end:
                self.stop()
                raise RuntimeError(f"PyG server ({variant}) did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        self.proc = self.procs[0]
        self.address = f"127.0.0.1:{port}"
        self.pids = [p.pid for p in self.procs]

    def cpu(self) -> float:
        return sum(_proc_cpu(p) for p in self.pids)

    def stop(self) -> None:
        procs = getattr(self, "procs", None) or [self.proc]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()


def run_phase(args: argparse.Namespace, server: Server, packed: bool, seed: int) -> dict[str, Any]:
    spec = {"address": server.address, "model": args.model, "num_nodes": args.num_nodes, "batch": args.batch,
            "clients": args.clients, "seconds": args.seconds, "packed": packed}
    c0, t0 = server.cpu(), time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--client-spec", json.dumps({**spec, "seed": seed + 97 * k})],
                              stdout=subprocess.PIPE, text=True, cwd=REPO) for k in range(args.client_procs)]
    outs = []
    for p in procs:
        stdout, _ = p.communicate(timeout=args.seconds + 600)
        if p.returncode != 0:
            raise RuntimeError(f"client exited with {p.returncode}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    wall = time.perf_counter() - t0
    server_cpu = server.cpu() - c0
    lat = [v for o in outs for v in o["lat_ms"]]
    served = collections.Counter()
    for o in outs:
        served.update(o["served_by"])
    nodes = sum(o["nodes"] for o in outs)
    return {"nodes_per_s": sum(o["nodes"] / o["wall_s"] for o in outs), "p50_ms": float(np.percentile(lat, 50)),
            "server_us_per_node": 1e6 * server_cpu / max(nodes, 1),
            "client_us_per_node": 1e6 * sum(o["cpu_s"] for o in outs) / max(nodes, 1),
            "p99_ms": float(np.percentile(lat, 99)), "requests": len(lat),
            "server_cores": server_cpu / wall, "client_cores": sum(o["cpu_s"] / o["wall_s"] for o in outs),
            "served_by": dict(served)}


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# ---------------------------------------------------------------------------- profile
_CATEGORIES = [  # first match wins, on the event-loop thread's Python stack
    ("response build (predict_response)", ("predict_response",)),
    ("validation (validate_predict, wire checks)", ("validate_predict", "check_predict", "_lenient")),
    ("admission: pricing and queueing (submit, estimate_work)", ("ModelRuntime.submit", "estimate_work",
                                                                  "DynamicBatcher.submit")),
    ("batcher loop (take batch, hand to worker, results)", ("DynamicBatcher._loop",)),
    ("rest of the handler (interceptor, servicer, stats)", ("GnnServicer.Predict", "guarded", "observe")),
    ("waiting in epoll (idle)", ("EpollSelector.select",)),
]


def profile(args: argparse.Namespace, server: Server, workdir: Path, log: Any) -> dict[str, Any]:
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    pid = server.proc.pid
    raw = workdir / "profile.txt"
    before = _thread_cpu(pid)
    rec = subprocess.Popen([pyspy, "record", "-p", str(pid), "-d", str(int(args.profile) + 2), "-r", "250",
                            "--nonblocking", "-f", "raw", "--threads", "-o", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    saved = args.seconds
    args.seconds = args.profile
    phase = run_phase(args, server, False, 7)
    args.seconds = saved
    after = _thread_cpu(pid)
    rec.wait(120)
    names = {}  # after the phase: the worker thread exists once a batch went to it
    for line in subprocess.run([pyspy, "dump", "-p", str(pid)], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Thread "):
            names[line.split()[1]] = line.split('"')[1]
    # CPU seconds per thread group, per node answered
    groups: dict[str, float] = collections.defaultdict(float)
    for tid, (comm, c) in after.items():
        d = c - before.get(tid, (comm, 0.0))[1]
        name = names.get(tid)
        if name == "MainThread":
            g = "event-loop thread (gRPC, protobuf, handler, batcher)"
        elif name and name.startswith("gnnserve-"):
            g = "model worker thread"
        elif name and "poll" in name:
            g = "gRPC poller thread (Python)"
        elif comm in ("event_engine", "grpc_global_tim", "lifeguard"):
            g = "gRPC C-core threads"
        else:
            g = "other native threads (the BLAS and numba pools)"
        groups[g] += d
    nodes = phase["nodes_per_s"] * args.profile
    # py-spy samples of the event-loop thread
    cats: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        head = frames[0].split(": ", 1)  # "thread (TID): NAME"; a thread py-spy could not name has no ": NAME"
        if len(head) < 2 or not re.sub(r"_\d+$", "", head[1]).startswith("MainThread"):
            continue
        s = ";".join(frames[1:])
        for cat, keys in _CATEGORIES:
            if any(k in s for k in keys):
                cats[cat] += int(n)
                break
        else:
            cats["gRPC and asyncio (Cython code, event loop)"] += int(n)
    return {"phase": phase, "cpu_s": dict(groups), "nodes": nodes, "samples": dict(cats)}


def codec(classes: int, sizes: tuple[int, ...] = (64, 1024)) -> list[dict[str, Any]]:
    """Microseconds to build and serialise a PredictResponse (server) and to parse and decode it into
    NumPy (client, ``clients._core.response_arrays``), probabilities as repeated floats or packed; best
    of 5 repeats of a loop. Built as ``serve.servicer.predict_response`` builds them."""
    from clients._core import response_arrays
    from clients._gen import gnnserve_pb2 as pb

    def best(f: Any, n: int) -> float:
        f()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                f()
            times.append(1e6 * (time.perf_counter() - t) / n)
        return min(times)

    rng = np.random.default_rng(0)
    rows = []
    for b in sizes:
        labels = rng.integers(0, classes, b)
        probs = rng.random((b, classes), dtype=np.float32)
        req = pb.PredictRequest(model="gcn", nodes=rng.choice(1 << 20, b, replace=False).tolist(),
                                return_probabilities=True).SerializeToString()

        def repeated(labels: np.ndarray = labels, probs: np.ndarray = probs) -> Any:
            r = pb.PredictResponse(model="gcn", version="1", request_id="x", num_classes=classes)
            r.labels.extend(labels.tolist())
            r.probabilities.extend(np.asarray(probs, dtype=np.float32).ravel().tolist())
            return r

        def packed(labels: np.ndarray = labels, probs: np.ndarray = probs) -> Any:
            return pb.PredictResponse(model="gcn", version="1", request_id="x", num_classes=classes, packed=True,
                                      packed_labels=np.ascontiguousarray(labels, dtype="<i4").tobytes(),
                                      packed_probabilities=np.ascontiguousarray(probs, dtype="<f4").tobytes())

        n = max(200, 1_000_000 // (b * classes))
        row: dict[str, Any] = {"nodes": b, "classes": classes,
                               "request_parse_us": best(lambda q=req: pb.PredictRequest.FromString(q), n)}
        for name, make in (("repeated", repeated), ("packed", packed)):
            msg = make()
            data = msg.SerializeToString()
            row[name] = {"build_us": best(make, n), "serialize_us": best(msg.SerializeToString, n),
                         "bytes": len(data), "parse_us": best(lambda d=data: pb.PredictResponse.FromString(d), n),
                         "decode_us": best(lambda m=msg: response_arrays(m), n)}
        rows.append(row)
    return rows


def report_codec(rows: list[dict[str, Any]]) -> None:
    print("| nodes x classes | probabilities | server: build | serialise | bytes | client: parse | decode to NumPy "
          "| server + client per node |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        for name in ("repeated", "packed"):
            c = row[name]
            per = (c["build_us"] + c["serialize_us"] + c["parse_us"] + c["decode_us"]) / row["nodes"]
            print(f"| {row['nodes']} x {row['classes']} | {name} | {c['build_us']:.1f} us | {c['serialize_us']:.1f} us "
                  f"| {c['bytes']:,} | {c['parse_us']:.1f} us | {c['decode_us']:.1f} us | {per:.2f} us |")
    print("\nRequest parse (ids as packed varints): " + ", ".join(
        f"{r['nodes']} ids {r['request_parse_us']:.1f} us" for r in rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, help="model repository with a plain model (e.g. benchmarks/serve.py's)")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--data", type=Path, action="append", default=[],
                    help="the servers' --data: the dataset file, where the path the checkpoints recorded does "
                         "not exist on this machine (a lent GPU machine)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="the servers' --device")
    ap.add_argument("--resident", action=argparse.BooleanOptionalAction, default=None,
                    help="the servers' --resident / --no-resident (default: theirs, on with --device cuda)")
    ap.add_argument("--processes", default="1,2",
                    help="comma-separated server variants: P (P processes) or PtK (and K compute threads each), "
                         "a trailing 'a' for the asyncio event loop instead of uvloop (1a, 2t1a), "
                         "pygN (N processes of the PyG twin of benchmarks/serve.py, the same trained weights "
                         "as PyG layers on each request's exact 2-hop subgraph, on --device)")
    ap.add_argument("--batch", type=int, default=64, help="nodes per request")
    ap.add_argument("--clients", type=int, default=8, help="async clients per client process")
    ap.add_argument("--client-procs", type=int, default=1, help="client processes")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--profile", type=float, default=0.0, help="seconds of the profile phase (0 = none)")
    ap.add_argument("--codec", action="store_true",
                    help="first, the encode/decode microbenchmark of a response (repeated against packed)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--client-spec", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--pyg-serve", default=None, help=argparse.SUPPRESS)  # child: one PyG twin server process
    args = ap.parse_args(argv)
    if args.client_spec:
        client_main(json.loads(args.client_spec))
        return 0
    if args.pyg_serve:
        pyg_serve(json.loads(args.pyg_serve))
        return 0
    if args.repo is None:
        ap.error("--repo is required")
    conf = json.loads(next((args.repo / args.model).glob("*/config.json")).read_text())
    args.num_nodes = int(conf["dataset"]["num_nodes"])
    started = datetime.datetime.now(datetime.timezone.utc)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="gnnserve-ceiling-"))
    counts = args.processes.split(",")
    for p in counts:  # a mistyped variant fails before any server starts
        if not p.startswith("pyg"):
            parse_variant(p)
    load0 = os.getloadavg()
    servers: dict[str, Server] = {}
    results: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    prof = None
    codec_rows = None
    if args.codec:
        log("codec microbenchmark")
        codec_rows = codec(int(conf["dataset"].get("num_classes") or conf["model"]["num_classes"]))
    try:
        for p in counts:
            log(f"starting server {p}")
            servers[p] = Server(args, p, workdir)
        if args.profile > 0 and not counts[0].startswith("pyg") and parse_variant(counts[0])[0] == 1:
            log(f"profile: server {counts[0]}, repeated probabilities, {args.profile:.0f} s")
            prof = profile(args, servers[counts[0]], workdir, log)
        variants = [(p, enc) for p in counts for enc in ("repeated", "packed")]
        # a time limit (timeout's SIGTERM) or Ctrl-C ends the rounds; the rounds every variant finished are
        # still reported (a lent GPU's minutes are too few to lose a whole run)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            for r in range(args.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                if r % 2:
                    order = order[::-1]
                for p, enc in order:
                    res = run_phase(args, servers[p], enc == "packed", 11 + r)
                    results[(p, enc)].append(res)
                    log(f"round {r + 1}: server {p}, {enc}: {res['nodes_per_s']:,.0f} nodes/s, "
                        f"p50 {res['p50_ms']:.2f} ms, server {res['server_cores']:.2f} cores, "
                        f"clients {res['client_cores']:.2f} cores, served_by {res['served_by']}")
        except KeyboardInterrupt:
            done = min((len(results[v]) for v in variants), default=0)
            log(f"interrupted: reporting the {done} round(s) every variant finished")
            for v in variants:
                del results[v][done:]
            if not done:
                return 1
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    load1 = os.getloadavg()
    loops = {p: getattr(s, "event_loops", []) for p, s in servers.items()}
    report(args, results, prof, started, load0, load1, counts, loops)
    if codec_rows:
        report_codec(codec_rows)
    if args.json:
        out = {"codec": codec_rows, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "results": {f"{p}:{e}": v for (p, e), v in results.items()}, "profile": prof,
               "load": [load0, load1], "started": started.isoformat(),
               "event_loops": loops}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def report(args: argparse.Namespace, results: dict[tuple[str, str], list[dict[str, Any]]], prof: Any,
           started: datetime.datetime, load0: tuple[float, ...], load1: tuple[float, ...], counts: list[str],
           loops: dict[str, list[str]] | None = None) -> None:
    print(f"Started {started:%Y-%m-%d %H:%M} UTC on {platform.node() or 'this machine'}, {os.cpu_count()} CPUs; "
          f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end. Model `{args.model}` of {args.repo}, "
          f"{args.batch}-node requests with probabilities, {args.client_procs} client process(es) x {args.clients} "
          f"async clients, {args.seconds:.0f} s phases, {len(next(iter(results.values()), []))} rounds (median); servers on "
          f"`--device {args.device}`{({True: ' --resident', False: ' --no-resident'}).get(args.resident, '')}"
          + ("; event loops: " + ", ".join(f"{p} {'/'.join(v)}" for p, v in loops.items() if v) if loops else "")
          + ".\n")
    if prof is not None:
        ph, nodes = prof["phase"], prof["nodes"]
        print(f"Profile phase: {ph['nodes_per_s']:,.0f} nodes/s, p50 {ph['p50_ms']:.2f} ms, "
              f"server {ph['server_cores']:.2f} cores, clients {ph['client_cores']:.2f} cores.\n")
        print("| server thread group | CPU s | cores | us per node | us per request |")
        print("|---|---|---|---|---|")
        dur = args.profile
        for g, s in sorted(prof["cpu_s"].items(), key=lambda kv: -kv[1]):
            if s > 0.005:
                print(f"| {g} | {s:.2f} | {s / dur:.2f} | {1e6 * s / nodes:.1f} | {1e6 * s / nodes * args.batch:.0f} |")
        total = sum(prof["samples"].values())
        busy = total - prof["samples"].get("waiting in epoll (idle)", 0)
        print("\n| event-loop thread, py-spy samples | share of its busy samples |")
        print("|---|---|")
        for cat, n in sorted(prof["samples"].items(), key=lambda kv: -kv[1]):
            if "idle" not in cat:
                print(f"| {cat} | {100 * n / max(busy, 1):.1f}% |")
        print(f"\n({total} samples; {100 * (total - busy) / max(total, 1):.0f}% of them waiting in epoll)\n")
    print("| server (P processes, tK: K compute threads each) | probabilities | nodes/s (median) | per round | p50 / p99 ms | server cores | client cores "
          "| server CPU us / node | client CPU us / node |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in counts:
        for enc in ("repeated", "packed"):
            rows = results[(p, enc)]
            per = ", ".join(f"{r['nodes_per_s']:,.0f}" for r in rows)
            print(f"| {p} | {enc} | {_median(rows, 'nodes_per_s'):,.0f} | {per} | {_median(rows, 'p50_ms'):.2f} / "
                  f"{_median(rows, 'p99_ms'):.2f} | {_median(rows, 'server_cores'):.2f} | "
                  f"{_median(rows, 'client_cores'):.2f} | {_median(rows, 'server_us_per_node'):.1f} | "
                  f"{_median(rows, 'client_us_per_node'):.1f} |")
    print()
    for k, p in enumerate(counts):
        for base in counts[:k]:
            for enc in ("repeated", "packed"):
                a, b = results[(base, enc)], results[(p, enc)]
                ratios = [y["nodes_per_s"] / x["nodes_per_s"] for x, y in zip(a, b, strict=True)]
                print(f"- server {p} / {base}, {enc}: {_median(b, 'nodes_per_s') / _median(a, 'nodes_per_s'):.2f}x "
                      f"(per round {', '.join(f'{v:.2f}' for v in ratios)})")
    for p in counts:
        a, b = results[(p, "repeated")], results[(p, "packed")]
        ratios = [y["nodes_per_s"] / x["nodes_per_s"] for x, y in zip(a, b, strict=True)]
        print(f"- packed / repeated, server {p}: {_median(b, 'nodes_per_s') / _median(a, 'nodes_per_s'):.2f}x "
              f"(per round {', '.join(f'{v:.2f}' for v in ratios)})")


if __name__ == "__main__":
    raise SystemExit(main())
