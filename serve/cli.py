"""The ``gnnserve`` command.

Server-side subcommands live here (``serve``, ``features``, ``bench``, ``demo``); ``train`` and
``export-onnx`` hand over to :mod:`models`, ``predict`` and ``models`` to the client SDK's CLI
(:mod:`clients.cli`), so each keeps one parser of its own.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .loops import EVENT_LOOPS, resolve_event_loop
from .loops import run as run_on_loop

__all__ = ["main"]

#: the help of every option that takes a dataset spec: kernels.datasets.DATASET_HELP, copied here because this module
#: imports no kernels (every gnnserve command loads it); tests/test_help_text.py holds the two equal
DATASET_HELP = ("PATH.npz, a saved dataset directory, ogb:NAME[@ROOT] (an OGB dataset under directory ROOT, default "
                "./dataset) or synthetic[:N[:SEED[:SHAPE]]]: a synthetic graph of N nodes (default 2000) drawn with SEED "
                "(default 0) in SHAPE 'default' or 'products' (shaped like ogbn-products), e.g. synthetic:1000000 or "
                "synthetic:2000000:0:products")

COMMANDS = {
    "train": "train a model and write a checkpoint (models.train), its knob latency timed on the served path",
    "serve": "run the gRPC server over a model repository",
    "predict": "query a server (client SDK)",
    "models": "list a server's models and knob tables (client SDK)",
    "update": "apply graph updates (features, new nodes, edges) from a file to a live server (client SDK)",
    "log": "show a repository's graph update logs, or drop the records after a version (servers stopped)",
    "features": "load features into Redis / verify a load",
    "graph": "load a graph's adjacency and PPR top-K lists into Redis (stateless replicas) / verify",
    "bench": "measure a model's latency-accuracy curve over its knob settings (and plot it)",
    "export-onnx": "export a checkpoint to ONNX (and a Triton model repository)",
    "demo": "train a small model on a synthetic graph, serve it and query it",
    "precompile": "compile the CPU kernels into numba's disk cache in parallel (a machine's or image's set-up)",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per log line (time, level, logger, message, and any ``extra`` fields)."""

    _skip = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in self._skip:
                out[k] = v
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _StderrHandler(logging.StreamHandler):
    """A stream handler on ``sys.stderr`` as it is when each record is written, not as it was when logging was
    set up: a caller that replaced ``sys.stderr`` for a while (a test's capture, a wrapper) and closed its stream
    leaves no handler writing into a closed file (found: server threads still logging after an in-process
    ``main`` returned printed "--- Logging error ---" tracebacks into later output)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # logging.StreamHandler.__init__ assigns it: ignored
        pass


def setup_logging(level: str = "INFO", json_logs: bool = False) -> None:
    handler = _StderrHandler()
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0 to 65535; 0 = any free port)")
    return value


def _budget(text: str) -> int | str:
    """An argparse type: a byte count (an integer) or ``auto`` (``serve.memory_budget.resolve_auto_budgets``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of bytes nor 'auto'") from None


_BIND_ERRNOS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


def _unbindable(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (None when it can), found by binding it the way the gRPC
    server and the metrics endpoint do (``SO_REUSEADDR``, every address the host resolves to)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve host {host!r}: {exc.strerror}"
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(addr)
            except OSError as exc:
                return exc.strerror or str(exc)
    return None


def _grpc_port_problem(args: argparse.Namespace) -> str:
    why = _unbindable(args.host, args.port) or "the address could not be bound"
    return f"cannot listen on {args.host}:{args.port} (--host/--port, gRPC): {why}"


def _metrics_port_problem(args: argparse.Namespace, why: str) -> str:
    return f"cannot serve metrics on {_metrics_host(args)}:{args.metrics_port} (--metrics-port): {why}"


def _metrics_host(args: argparse.Namespace) -> str:
    host = getattr(args, "metrics_host", None)
    return host if host is not None else args.host


def _flag_problem(args: argparse.Namespace) -> str | None:
    """The first numeric flag of ``gnnserve serve`` out of its range (or the log level not one), as a message; the
    models would otherwise be refused one by one after the server had started, in the components' own names."""
    import math

    def ok(x: float | None, lo: float, hi: float = math.inf, *, low_open: bool = False) -> bool:
        return x is not None and math.isfinite(x) and (x > lo if low_open else x >= lo) and x <= hi

    at_least_1 = ("--max-batch-targets", "--max-queue-targets", "--max-nodes-per-request", "--max-queue-work",
                  "--max-request-work", "--max-concurrent-rpcs", "--workers", "--max-update-size")
    at_least_0 = ("--max-delay-ms", "--inline-max-work", "--hot-bytes", "--induced-table-bytes",
                  "--graph-cache-bytes", "--projection-cache-bytes", "--activation-cache-bytes", "--poll-s",
                  "--grace-s", "--drain-s", "--read-your-writes-timeout-s", "--compact-log-bytes",
                  "--compact-replay-s", "--compact-idle-s", "--max-new-node-edges")
    for flag in at_least_1 + at_least_0:
        x = getattr(args, flag[2:].replace("-", "_"), None)
        if x is not None and x != "auto" and not ok(x, 1 if flag in at_least_1 else 0):
            return f"{flag} must be {'>= 1' if flag in at_least_1 else '>= 0'} and finite, got {x}"
    if args.inline_max_targets is not None and args.inline_max_targets < 0:
        return f"--inline-max-targets must be >= 0 (0: every batch in the worker thread), got {args.inline_max_targets}"
    if not ok(args.hot_fraction, 0.0, 1.0):
        return f"--hot-fraction must lie in [0, 1], got {args.hot_fraction}"
    if not ok(args.ppr_refresh_tolerance, 0.0, low_open=True):
        return f"--ppr-refresh-tolerance must be > 0 and finite (1e-9: every list an update reaches), got " \
               f"{args.ppr_refresh_tolerance}"
    for flag, x, lo, meaning in (("--processes", args.processes, 1, None),
                                 ("--precompile-jobs", args.precompile_jobs, 0, "0: never"),
                                 ("--blas-threads", args.blas_threads, 0, "0: leave the BLAS pools as they are"),
                                 ("--torch-path-threads", args.torch_path_threads, 0,
                                  "0: torch's own count for large batches"),
                                 ("--gpu-min-targets", args.gpu_min_targets, 0, "0: every batch on the GPU")):
        if x is not None and x < lo:
            return f"{flag} must be >= {lo}" + (f" ({meaning})" if meaning else "") + f", got {x}"
    if args.ppr_eager_lists < -1:
        return f"--ppr-eager-lists must be >= 0, or -1 (every list in the update), got {args.ppr_eager_lists}"
    if args.resident is False and args.serving_path in ("plain-resident", "shadow-resident"):
        return (f"--serving-path {args.serving_path} needs the resident state that --no-resident turns off: drop "
                "one of them")
    for flag, on in (("--fused-head", args.fused_head), ("--fused-shadow", args.fused_shadow)):
        if on and (args.device != "cuda" or args.resident is False):
            return f"{flag} is a kernel for models resident on the GPU: it needs --device cuda without --no-resident"
    if not isinstance(logging.getLevelName(str(args.log_level).upper()), int):
        return f"--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {args.log_level!r}"
    return None


def _data_problem(specs: Sequence[str]) -> str | None:
    """The first ``--data`` path that does not exist, as one line (None when each is there). The datasets are
    looked for by fingerprint only when a checkpoint needs one, after ``REPO/_data``: a mistyped path went
    unmentioned whenever another candidate held the data (a new-user report). ``ogb:`` and ``synthetic``
    specs name no path that must exist yet (an OGB root is downloaded into)."""
    for spec in specs:
        if spec.startswith("ogb:") or spec == "synthetic" or spec.startswith("synthetic:"):
            continue
        if not os.path.exists(spec):
            return (f"--data {spec!r} does not exist (--data takes a .npz file, a saved dataset directory, "
                    "ogb:NAME[@ROOT] or synthetic[:N...]; repeat it for several)")
    return None


def _port_problem(args: argparse.Namespace) -> str | None:
    """Before anything loads: a gRPC or metrics port that cannot be bound, as one line (None when both can).
    Port 0 (any free port) always can; a child of --processes shares its port with its siblings (its parent
    checked)."""
    if args.process_slot is not None:
        return None
    if args.port and _unbindable(args.host, args.port) is not None:
        return _grpc_port_problem(args)
    if args.metrics_port and (why := _unbindable(_metrics_host(args), args.metrics_port)) is not None:
        return _metrics_port_problem(args, why)
    if args.http_port and args.http_port in (args.port, args.metrics_port):
        return f"--http-port {args.http_port} is also the {'gRPC' if args.http_port == args.port else 'metrics'} port"
    if args.http_port and (why := _unbindable(args.host, args.http_port)) is not None:
        return f"cannot listen on {args.host}:{args.http_port} (--host/--http-port, HTTP/REST): {why}"
    return None


def _start_failure(exc: BaseException, args: argparse.Namespace) -> str | None:
    """One line naming what could not be bound, for the bind failures ``serve_forever`` raises when a port
    was taken after :func:`_port_problem` looked; None for anything else. gRPC raises
    ``RuntimeError("Failed to bind to address ...")`` for its port, the metrics endpoint (bound after it) an
    ``OSError`` with a bind errno and no file name."""
    if isinstance(exc, RuntimeError) and "failed to bind" in str(exc).lower():
        return _grpc_port_problem(args)
    if (isinstance(exc, OSError) and args.metrics_port is not None and exc.errno in _BIND_ERRNOS
            and exc.filename is None):
        return _metrics_port_problem(args, exc.strerror or str(exc))
    return None


def _serve(argv: Sequence[str]) -> int:
    from .paths import PATH_NAMES
    from .runtime import RuntimeOptions
    from .server import ServerConfig, serve_forever

    ap = argparse.ArgumentParser(prog="gnnserve serve", description="Serve the models of a repository over gRPC.")
    ap.add_argument("--repo", required=True, help="model repository: REPO/<name>/<version>/ checkpoints")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for all interfaces; default: %(default)s)")
    ap.add_argument("--port", type=_port, default=8500, help="gRPC port (0 = any free port; default: %(default)s)")
    ap.add_argument("--http-port", type=_port, default=None,
                    help="also serve the KServe v2 / Triton HTTP/REST protocol on this port of --host (Triton's "
                         "8000: curl, Kubernetes HTTP probes, tritonclient.http, perf_analyzer -i http; off by "
                         "default; 0 = any free port). Same models, checks, token and TLS as gRPC; /v2/health/live "
                         "and /v2/health/ready take no token (serve/http.py)")
    ap.add_argument("--metrics-port", type=_port, default=None,
                    help="Prometheus /metrics port (off by default; 0 = any free port). The endpoint takes no "
                         "token: bind it where only the scraper reaches it (--metrics-host)")
    ap.add_argument("--metrics-host", default=None,
                    help="address the /metrics endpoint binds (default: --host; e.g. 127.0.0.1 or an internal "
                         "interface while gRPC serves 0.0.0.0)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the models run (default: %(default)s)")
    ap.add_argument("--data", action="append", default=[], help="a dataset the checkpoints may have been trained on, matched by fingerprint (after "
                         "REPO/_data/<fingerprint>, before the source each checkpoint records; repeat the option "
                         "for several): " + DATASET_HELP)
    ap.add_argument("--features", default="memory",
                    help="feature store: 'memory' (default) or a Redis URL (redis://, rediss://, unix://, redis+cluster://)")
    ap.add_argument("--feature-version", default=None, help="feature version to read from Redis (default: latest live)")
    ap.add_argument("--hot-bytes", type=int, default=0,
                    help="feature cache in bytes in front of the store (0 = off): --hot-fraction of it is the static "
                         "hot tier (the nodes most frequent in the first PPR model's top-K lists, fetched at load), "
                         "the rest an LRU (default: %(default)s)")
    ap.add_argument("--hot-fraction", type=float, default=0.75,
                    help="share of --hot-bytes for the static hot tier (default 0.75; 0 = LRU only)")
    ap.add_argument("--graph", default=None,
                    help="stateless replica: read the graph and PPR top-K lists from this Redis URL (loaded with "
                         "`gnnserve graph load`) instead of datasets on disk; features default to the same URL")
    ap.add_argument("--graph-version", type=int, default=None, help="graph version in Redis (default: current)")
    ap.add_argument("--induced-table-bytes", type=int, default=1 << 30,
                    help="precompute every node's induced top-K subgraph beside the PPR index when its "
                         "estimated size fits in this many bytes (0: induce per batch; default: %(default)s = 1 GiB)")
    ap.add_argument("--induced-table-wait", action=argparse.BooleanOptionalAction, default=None,
                    help="build a missing induced table before the model is served (--induced-table-wait) or on a "
                         "thread while it serves, its batches induced from the graph until the table is ready "
                         "(--no-induced-table-wait; minutes at millions of nodes); default: wait where shaDow models are "
                         "resident (a GPU, or --resident), whose path needs the table at load, else build beside serving")
    ap.add_argument("--graph-cache-bytes", type=int, default=64 << 20,
                    help="LRU budget in bytes for adjacency rows and PPR lists fetched from Redis with --graph, and half "
                         "as much again for the nodes each PPR list the replica pushed itself read (an update away from "
                         "them leaves the list current without a push); on graphs of up to budget / 192 nodes a quarter "
                         "of it keeps the stored rows end to end for the replica's pushes; 0 = off (default: "
                         "%(default)s = 64 MiB)")
    ap.add_argument("--max-batch-targets", type=int, default=1024,
                    help="most targets (node ids and new nodes) of queued requests merged into one batch per model; "
                         "a single larger request still runs, alone (default: %(default)s)")
    ap.add_argument("--max-queue-targets", type=int, default=16384,
                    help="bound of each model's queue in targets: a request that would pass it gets "
                         "RESOURCE_EXHAUSTED (default: %(default)s)")
    ap.add_argument("--max-delay-ms", type=float, default=0.0, help="extra wait in milliseconds for a batch to fill (0 = none; default: %(default)s)")
    ap.add_argument("--inline-max-targets", type=int, default=None,
                    help="batches up to this many targets (and --inline-max-work) run on the event loop when "
                         "nothing else waits (no thread hand-off; in-memory features only; 0 = always in the "
                         "worker thread; default 256 on the CPU, 0 with --device cuda)")
    ap.add_argument("--gpu-min-targets", type=int, default=None,
                    help="--device cuda: batches of fewer targets run the compiled CPU paths (a CPU copy of the "
                         "model), where the GPU's launch and copy costs outweigh its arithmetic (0 = all on GPU; "
                         "default: where the model's GPU path was measured to win: 0 for plain models with the "
                         "fused last layer, 2 for shaDow with its one-launch kernel (1 at the exact width), 8 with CUDA graphs; 64 and "
                         "512 for plain models with and "
                         "without CUDA graphs (--no-fused-head), 32 for shaDow without; on the torch path never "
                         "for plain models, 32 for shaDow: serve.runtime.GPU_MIN_TARGETS_AUTO)")
    ap.add_argument("--resident", action=argparse.BooleanOptionalAction, default=None,
                    help="plain 2-layer models: keep the graph, the projection table and one first-layer table per "
                         "sampling width (within --activation-cache-bytes) on the model's device and answer every "
                         "batch without new nodes there, sampling on the device (kernels.resident); shaDow models: "
                         "their PPR lists and induced table. With --device cuda, batches under --gpu-min-targets "
                         "still take the compiled CPU paths. Default: on with --device cuda, off on a CPU (where "
                         "the compiled paths are faster)")
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                    help="on a resident --device cuda model: replay a captured CUDA graph per batch size bucket, "
                         "sampling width and PPR budget (shaDow models; plain models only with --no-fused-head, "
                         "at sampled widths up to 256). Default: on wherever such a model is resident on a GPU")
    ap.add_argument("--fused-head", action=argparse.BooleanOptionalAction, default=None,
                    help="on a plain model resident on --device cuda: its last layer (aggregation, classifier, "
                         "softmax, arg-max) in one kernel launch, answers read from mapped host memory "
                         "(kernels.resident_head); --no-fused-head runs it as torch operators (with --cuda-graphs). "
                         "Default: wherever that kernel compiles")
    ap.add_argument("--fused-shadow", action=argparse.BooleanOptionalAction, default=None,
                    help="on a shaDow model resident on --device cuda: its whole batch in one kernel launch, one "
                         "block per target with its subgraph in shared memory, answers read from mapped host "
                         "memory (kernels.shadow_block); the torch operators (and --cuda-graphs of them) keep what "
                         "it leaves. Default: on wherever it builds and passes its check against the torch operators "
                         "when the model loads. Asked for and unable to run, the model fails to load")
    ap.add_argument("--max-nodes-per-request", type=int, default=4096,
                    help="ids plus new nodes per request; checked on the request's bytes before it is parsed "
                         "(default: %(default)s)")
    ap.add_argument("--max-new-node-edges", type=int, default=100_000,
                    help="neighbours over all new nodes of one request (default: %(default)s)")
    ap.add_argument("--max-request-work", type=int, default=50_000_000,
                    help="refuse (RESOURCE_EXHAUSTED) a request whose estimated work, in edges aggregated, "
                         "exceeds this (an exact-width request on a hub of a deep plain model, say; default: %(default)s)")
    ap.add_argument("--max-queue-work", type=int, default=500_000_000,
                    help="bound of each model's queue in estimated work (edges), beside --max-queue-targets "
                         "(default: %(default)s)")
    ap.add_argument("--inline-max-work", type=int, default=20_000,
                    help="a batch runs on the event loop (see --inline-max-targets) only when its estimated "
                         "work is at most this many edges (default: %(default)s)")
    ap.add_argument("--serving-path", default=None, choices=PATH_NAMES,
                    help="prefer this serving path (serve.paths) for every batch it can take; a model that cannot "
                         "take it is refused (for tests and comparisons; default: each batch takes the path that suits it)")
    ap.add_argument("--max-concurrent-rpcs", type=int, default=1000,
                    help="RPCs run at once (a stream counts as one); more get RESOURCE_EXHAUSTED (default: %(default)s)")
    ap.add_argument("--projection-cache-bytes", type=_budget, default="auto",
                    help="per model: cache every node's first-layer projection (one [nodes, hidden] float32 "
                         "table, nodes x hidden x 4 bytes), kept only when the whole table fits this many bytes; "
                         "an integer (0 = off) or 'auto' (the default): the largest model's table when every "
                         "model's fits in 60%% of the machine's memory beside the graph and features, else 2 GiB")
    ap.add_argument("--activation-cache-bytes", type=_budget, default="auto",
                    help="plain 2-layer models: keep each node's first-layer output per sampling width (one "
                         "[nodes, hidden] float32 table per width) within this many bytes; an integer (0 = off) or "
                         "'auto' (the default): one table of the largest plain model when they fit beside the "
                         "projection tables (as above), else 256 MiB")
    ap.add_argument("--warm-projections", action="store_true",
                    help="cache every node's first-layer projection (and a plain model's first-layer output at "
                         "its default width) while a model warms up, before it is served, and read a "
                         "memory-mapped PPR index and induced table into the page cache (startup reads all "
                         "features and the index once; first requests cost what later ones do)")
    ap.add_argument("--ppr-cache", default=None, help="directory for PPR index files (default REPO/_ppr)")
    ap.add_argument("--poll-s", type=float, default=2.0, help="seconds between looks at the repository for new or changed versions (0 = off; default: "
                         "%(default)s)")
    ap.add_argument("--grace-s", type=float, default=10.0, help="at shutdown (SIGTERM), seconds in-flight RPCs get to finish before they are cancelled "
                         "(default: %(default)s)")
    ap.add_argument("--drain-s", type=float, default=0.0,
                    help="after SIGTERM, keep refusing new RPCs with UNAVAILABLE for at least this long "
                         "before closing the listener (give load balancers time to route away; default: %(default)s)")
    ap.add_argument("--workers", type=int, default=1,
                    help="batch worker threads per model (each model has its own: a slow one never stalls another; "
                         "default: %(default)s)")
    ap.add_argument("--token-file", default=None,
                    help="require 'authorization: Bearer <token>' (token in this file; default: the file named by "
                         "$GNNSERVE_TOKEN_FILE, else $GNNSERVE_TOKEN); a blank or unreadable token refuses to start")
    ap.add_argument("--tls-cert", default=None,
                    help="serve TLS with this certificate (chain) file, PEM; needs --tls-key (default: plaintext)")
    ap.add_argument("--tls-key", default=None, help="private key file (PEM) of --tls-cert; needs --tls-cert")
    ap.add_argument("--tls-client-ca", default=None,
                    help="require client certificates signed by this CA (mutual TLS; needs --tls-cert/--tls-key)")
    ap.add_argument("--insecure", action="store_true",
                    help="allow a non-loopback --host with neither a token nor client certificates (without "
                         "it such a server refuses to start; with it, it logs a warning)")
    ap.add_argument("--ready-file", default=None,
                    help="write the bound port here once the start has loaded the repository's models (not while "
                         "every model failed to load)")
    ap.add_argument("--processes", type=int, default=1,
                    help="server processes sharing the port (SO_REUSEPORT; each a whole server with its own "
                         "models and caches: N times the memory). A parent supervises them: it forwards SIGTERM, "
                         "merges their metrics on --metrics-port, writes --ready-file once all serve, and exits "
                         "non-zero if one dies. Needs --read-only, or graph and features in Redis (serve/processes.py; "
                         "default: %(default)s)")
    ap.add_argument("--event-loop", choices=EVENT_LOOPS, default="auto",
                    help="the asyncio loop the server runs on: uvloop (1.07x-1.10x the node predictions/s of asyncio's "
                         "loop on 64-node requests, docs/BENCHMARKS.md), asyncio, or auto = uvloop where it "
                         "is installed (default)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="threads of the BLAS pools the compiled CPU forwards' dense products run in (SciPy's "
                         "OpenBLAS; torch's own threads are apart). Default 1, or the pools left alone where "
                         "OPENBLAS_NUM_THREADS is set; 0 = leave them as the process starts them "
                         "(OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else every core). With the pool at the core "
                         "count, another busy thread stalls a product: 4.4x slower at 16 shaDow targets on the "
                         "2-vCPU VM beside one busy process; idle, one thread costs up to 13%% (docs/BENCHMARKS.md)")
    ap.add_argument("--torch-path-threads", type=int, default=None,
                    help="torch threads of a batch on the torch operator paths (a CPU batch with new nodes). Default 1: "
                         "with two, one descheduled thread holds the whole forward (p90 58 ms against 2.4 beside one "
                         "busy process on the 2-vCPU VM, 64 new nodes; idle, the second thread saved 0.7 ms of 20: "
                         "docs/BENCHMARKS.md); 0 = torch's own count from 4,096 rows, one below")
    ap.add_argument("--precompile-jobs", type=int, default=None,
                    help="when numba's disk cache lacks the CPU kernels (a first start on a machine, new kernels), "
                         "compile them in this many processes before the models load (default: the cores, at "
                         "most 8; 0 or 1 = never: they compile one after another as the models load). 'gnnserve "
                         "precompile --repo REPO' does the same ahead of time")
    ap.add_argument("--process-slot", default=None, help=argparse.SUPPRESS)  # "i/N": a child of --processes
    ap.add_argument("--process-status", default=None, help=argparse.SUPPRESS)  # the child's JSON status file
    ap.add_argument("--log-level", default="INFO",
                    help="least severe log level shown: DEBUG, INFO, WARNING or ERROR (default: %(default)s)")
    ap.add_argument("--log-json", action="store_true", help="write the logs as JSON, one object per line (default: plain text)")
    ap.add_argument("--read-only", action="store_true",
                    help="refuse UpdateGraph (FAILED_PRECONDITION); logged updates are still replayed")
    ap.add_argument("--max-update-size", type=int, default=100_000,
                    help="entries (feature rows, new nodes and their edges, edges) per UpdateGraph request "
                         "(default: %(default)s)")
    ap.add_argument("--update-log-dir", default=None,
                    help="where each graph's update log lives (default REPO/_live; with Redis features or "
                         "--graph the log is a Redis stream beside the data)")
    ap.add_argument("--update-log-fsync", action="store_true",
                    help="fsync the update log after every update (survive a machine crash, not only a "
                         "process crash; costs a disk flush per update)")
    ap.add_argument("--ppr-refresh-tolerance", type=float, default=1.0,
                    help="after a graph update, push a shaDow model's PPR list again when the bound of its move "
                         "exceeds this many times the push threshold eps (1: the offline lists' own tolerance; "
                         "larger: cheaper updates, looser lists; kernels/ppr_live.py has the measurements; default: "
                         "%(default)s)")
    ap.add_argument("--ppr-eager-lists", type=int, default=-1,
                    help="after a graph update, push at most this many existing PPR lists again before the update "
                         "returns (those moved most); the others are pushed by the Predicts that need them until "
                         "a background thread has stored them. Faster updates (a single edge's p99 5-13x shorter "
                         "on Amazon Computers), but when a list is stored then depends on timing, so a restarted "
                         "server, a follower and the writer may answer a few nodes apart at one graph version "
                         "(within the PPR tolerance). -1 (default): every list in the update, the same lists on "
                         "every server")
    ap.add_argument("--compact-log-bytes", type=int, default=256 << 20,
                    help="at start, fold a graph's update log larger than this into a snapshot of the graph and "
                         "features next to it (loaded at later starts instead of the dataset); 0 = never (default: "
                         "%(default)s = 256 MiB)")
    ap.add_argument("--compact-replay-s", type=float, default=30.0,
                    help="fold a graph's update log into that snapshot once replaying it would take a start more than "
                         "this many seconds (the time its updates took to apply): at start after the replay, and "
                         "while serving once no update has come for --compact-idle-s (updates wait for the snapshot; "
                         "predictions go on); 0 = never by time (default: %(default)s)")
    ap.add_argument("--compact-idle-s", type=float, default=60.0,
                    help="seconds without an update before a serving server compacts its update log "
                         "(--compact-replay-s; default: %(default)s)")
    ap.add_argument("--read-your-writes-timeout-s", type=float, default=1.0,
                    help="seconds a Predict with min_graph_version waits for that graph version before UNAVAILABLE "
                         "(a version the graph's update log never wrote is refused at once; default: %(default)s)")
    ap.add_argument("--allow-overcommit", action="store_true",
                    help="start even when the cache budgets plus the estimated graph, features and PPR index "
                         "exceed the machine's memory (serve/memory_budget.py; refused by default)")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress bars for the long start-up stages (a PPR index or induced table build, "
                         "dataset generation): their start and end are logged either way, and a bar written to a "
                         "log file is one long line")
    args = ap.parse_args(argv)
    if (problem := _flag_problem(args)) is not None:  # before anything binds or loads (a new-user audit)
        print(f"gnnserve serve: {problem}", file=sys.stderr)
        return 2
    if args.no_progress:  # tqdm reads TQDM_* environment variables as its defaults (--processes children too)
        os.environ["TQDM_DISABLE"] = "1"
    setup_logging(args.log_level, args.log_json)
    repo = Path(args.repo)
    if not repo.is_dir():
        why = "is not a directory" if repo.exists() else "does not exist"
        print(f"gnnserve serve: model repository {args.repo!r} {why} (--repo: a directory of <name>/<version>/ "
              "checkpoints, written by 'gnnserve train --out REPO/<name>/<version>')", file=sys.stderr)
        return 2
    if (problem := _data_problem(args.data)) is not None:
        print(f"gnnserve serve: {problem}", file=sys.stderr)
        return 2
    try:
        resolve_event_loop(args.event_loop)
    except ValueError as exc:
        print(f"gnnserve serve: {exc}", file=sys.stderr)
        return 2
    if args.gpu_min_targets is not None and args.device != "cuda":
        logging.getLogger("serve").warning("--gpu-min-targets has no effect without --device cuda")
    if (problem := _port_problem(args)) is not None:
        print(f"gnnserve serve: {problem}", file=sys.stderr)
        return 2
    if args.processes > 1:
        from .processes import refusal

        if (why := refusal(args)) is not None:
            print(f"gnnserve serve: refusing to start: {why}", file=sys.stderr)
            return 2
    from .memory_budget import refuse_overcommit, resolve_auto_budgets

    for line in resolve_auto_budgets(args):  # before the check, which counts what they chose
        if args.process_slot is None:  # (a child of --processes chooses the same: its parent said it)
            logging.getLogger("serve").info(line)
    if args.process_slot is None and (code := refuse_overcommit(args)) is not None:  # a child: its parent checked
        return code
    from .security import SecurityConfigError, check_security_config, resolve_token

    try:  # fail closed, before anything loads (GnnServer checks again, and logs --insecure's warning)
        token = resolve_token(args.token_file)
        check_security_config(host=args.host, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
                              tls_client_ca=args.tls_client_ca, insecure=args.insecure)
    except SecurityConfigError as exc:
        print(f"gnnserve serve: {exc}", file=sys.stderr)
        return 2
    feature_options: dict = {}
    if args.feature_version is not None:
        feature_options["version"] = int(args.feature_version)
    if args.hot_bytes:
        feature_options["cache_bytes"] = args.hot_bytes
        feature_options["hot_fraction"] = args.hot_fraction
        if args.hot_fraction > 0:
            feature_options["hot"] = "ppr"  # serve.features.HOT_FROM_PPR: installed from the PPR index at load
    cfg = ServerConfig(
        repo=args.repo,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        metrics_host=_metrics_host(args),
        http_port=args.http_port,
        runtime=RuntimeOptions(
            device=args.device,
            max_batch_targets=args.max_batch_targets,
            max_queue_targets=args.max_queue_targets,
            max_delay_ms=args.max_delay_ms,
            inline_max_targets=args.inline_max_targets,
            gpu_min_targets=args.gpu_min_targets,
            resident=args.resident,
            cuda_graphs=args.cuda_graphs,
            fused_head=args.fused_head,
            fused_shadow=args.fused_shadow,
            max_nodes_per_request=args.max_nodes_per_request,
            max_new_node_edges=args.max_new_node_edges,
            max_request_work=args.max_request_work,
            max_queue_work=args.max_queue_work,
            inline_max_work=args.inline_max_work,
            **({} if args.torch_path_threads is None else {"torch_path_threads": args.torch_path_threads}),
            serving_path=args.serving_path,
            projection_budget_bytes=args.projection_cache_bytes,
            activation_budget_bytes=args.activation_cache_bytes,
            ppr_cache_dir=args.ppr_cache,
            graph_url=args.graph,
            graph_version=args.graph_version,
            graph_cache_bytes=args.graph_cache_bytes,
            induced_table_bytes=args.induced_table_bytes,
            induced_table_wait=args.induced_table_wait,
            warm_projections=args.warm_projections,
            read_only=args.read_only,
            max_update_size=args.max_update_size,
            update_log_dir=args.update_log_dir,
            update_log_fsync=args.update_log_fsync,
            read_your_writes_timeout_s=args.read_your_writes_timeout_s,
            compact_log_bytes=args.compact_log_bytes,
            compact_replay_s=args.compact_replay_s,
            compact_idle_s=args.compact_idle_s,
            ppr_refresh_tolerance=args.ppr_refresh_tolerance,
            ppr_eager_lists=args.ppr_eager_lists,
        ),
        data_paths=args.data,
        feature_url=args.features,
        feature_options=feature_options,
        poll_s=args.poll_s,
        grace_s=args.grace_s,
        drain_s=args.drain_s,
        workers=args.workers,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        token=token,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        insecure=args.insecure,
        event_loop=args.event_loop,
        blas_threads=args.blas_threads,
        # a child of --processes: its parent precompiled before starting it (N children would each do it)
        precompile_jobs=0 if args.process_slot is not None else args.precompile_jobs,
    )
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gnnserve serve: --device cuda but no CUDA device is available", file=sys.stderr)
            return 2
    if args.processes > 1:  # the parent: supervise N children, each this command with --process-slot
        from kernels import compile_log
        from kernels.precompile import at_start

        from .processes import run_processes
        from .registry import model_widths

        if args.precompile_jobs != 0:
            compile_log.install()  # the cache-write lock, before any child compiles
            at_start(args.precompile_jobs, model_widths(args.repo))

        return run_processes(args, argv)
    if args.process_slot is not None:
        from .servicer import set_process_slot

        index, total = (int(v) for v in args.process_slot.split("/"))
        set_process_slot(index, total)
        cfg.reuse_port = True
    from .registry import RepositoryError

    try:
        run_on_loop(serve_forever(cfg, ready_file=args.ready_file, status_file=args.process_status), cfg.event_loop)
    except (SecurityConfigError, RepositoryError) as exc:
        print(f"gnnserve serve: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RuntimeError) as exc:
        why = _start_failure(exc, args)
        if why is not None:
            print(f"gnnserve serve: {why}", file=sys.stderr)
            return 2
        if isinstance(exc, RuntimeError):  # not a bind failure: a bug, shown as one
            raise
        logging.getLogger("gnnserve").error("cannot start: %s", exc)
        return 1
    return 0


def _delegate(module: str, func: str = "main") -> Callable[[Sequence[str]], int]:
    def run(argv: Sequence[str]) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), func)(list(argv)) or 0)

    return run


HANDLERS: dict[str, Callable[[Sequence[str]], int]] = {
    "serve": _serve,
    "train": _delegate("serve.knob_timing", "train_main"),  # models.train's CLI, then the served knob timing
    "export-onnx": _delegate("models.export_onnx"),
    "predict": _delegate("clients.cli", "predict_main"),
    "models": _delegate("clients.cli", "models_main"),
    "update": _delegate("clients.cli", "update_main"),
    "log": _delegate("serve.log_cli"),
    "features": _delegate("serve.features.cli"),
    "graph": _delegate("serve.graph_store"),
    "bench": _delegate("serve.bench"),
    "demo": _delegate("serve.demo"),
    "precompile": _delegate("kernels.precompile"),
}


#: the commands that only call a server (the client SDK): they import no kernels, so neither numba nor PyTorch (a
#: new user's report: each `gnnserve predict` took 3.1-3.3 s and 308 MB importing them, the SDK alone 1.4 s, 48 MB)
CLIENT_COMMANDS = frozenset({"predict", "models", "update"})


def stdout_closed() -> int:
    """After a ``BrokenPipeError`` on stdout (output piped into ``head``, say): point stdout at /dev/null so
    that Python's flush at exit does not raise again, and return the exit code 0."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = ["usage: gnnserve <command> [options]", "", "commands:"]
        lines += [f"  {name:<12} {text}" for name, text in COMMANDS.items()]
        lines += ["", "'gnnserve <command> --help' describes a command."]
        try:
            print("\n".join(lines), flush=True)
        except BrokenPipeError:
            stdout_closed()
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    handler = HANDLERS.get(cmd)
    if handler is None:
        print(f"gnnserve: unknown command {cmd!r}; run 'gnnserve --help'", file=sys.stderr)
        return 2
    if cmd not in CLIENT_COMMANDS:
        from kernels.malloc import tune_malloc  # imports the kernels package (numba, PyTorch)

        tune_malloc()  # before any worker thread: freed batch memory is reused, not faulted in again
    return handler(rest)


if __name__ == "__main__":
    raise SystemExit(main())
