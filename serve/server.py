"""The gnnserve gRPC server on ``grpc.aio``.

Services: ``gnnserve.v1.GnnService``, the KServe v2 / Triton ``inference.GRPCInferenceService``,
``grpc.health.v1.Health`` (NOT_SERVING until the start has loaded and warmed every model of the
repository it can, and again while shutting down; a model still loading answers UNAVAILABLE, "being
loaded", meanwhile) and server reflection. Prometheus metrics on ``metrics_port``. With ``http_port``, the
KServe v2 HTTP/REST endpoint too (:mod:`serve.http`, over the same KServe servicer, on the same event loop; it
drains with gRPC: 503 to new requests, closed once gRPC stops).

Shutdown (SIGTERM / SIGINT): new RPCs get UNAVAILABLE from the server's own handler (see
:class:`~serve.interceptors.DrainGate`), then health goes NOT_SERVING; in-flight requests finish
within the grace period; the listener stays open, refusing, for at least ``drain_s`` seconds after
the signal (so load balancers see NOT_SERVING and route away before connections are closed); then
gRPC stops and the process exits 0. A call that reaches the server exactly while gRPC itself
closes can still be cancelled by grpc-core (``CANCELLED``): ``drain_s`` keeps that moment away
from the traffic a balancer still sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from clients._gen import gnnserve_pb2, gnnserve_pb2_grpc, inference_pb2, inference_pb2_grpc
from kernels import compile_log

from .http import HttpFrontEnd, server_ssl_context
from .interceptors import BearerAuthInterceptor, DrainGate, ErrorMappingInterceptor
from .loops import loop_name, new_event_loop
from .metrics import CacheCollector, ServerMetrics, TritonCollector
from .registry import ModelRegistry
from .runtime import RuntimeOptions
from .security import check_security_config
from .servicer import GnnServicer
from .triton import TritonServicer
from .wire import WireLimits

__all__ = ["BackgroundServer", "GnnServer", "ServerConfig", "serve_forever"]

log = logging.getLogger(__name__)

GNN_SERVICE = gnnserve_pb2.DESCRIPTOR.services_by_name["GnnService"].full_name
TRITON_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _set_blas_threads(configured: int | None) -> None:
    """The BLAS pools on ``ServerConfig.blas_threads``' count (``kernels.threads``), said in the log. A bad
    count raises; a pool that cannot be set (threadpoolctl missing, or too old to find the libraries, or a
    library it cannot drive) is a warning: the server serves, with that pool at its own count."""
    from kernels.threads import server_blas_threads, set_blas_threads

    n = server_blas_threads(configured)
    if n is None:
        return
    try:
        pools = set_blas_threads(n)
    except Exception as exc:
        log.warning("could not set the BLAS pools to %d thread(s), they keep their own count: %s", n, exc)
        return
    said = ", ".join(f"{p.internal_api} {p.version} at {p.threads}" for p in pools)
    if not pools or any(p.threads != n for p in pools):
        log.warning("BLAS pools not all on %d thread(s) (--blas-threads): %s (threadpoolctl >= 3.5 finds the "
                    "scipy-openblas libraries of NumPy's and SciPy's wheels)", n, said or "none found")
    else:
        log.info("BLAS pools on %d thread(s) (--blas-threads): %s", n, said)
    for p in (p for p in pools if p.per_thread):
        log.warning("BLAS library %s is built on OpenMP: its count is per thread, and only the thread that built "
                    "the server has %d", p.path, n)


@dataclass
class ServerConfig:
    repo: str
    host: str = "127.0.0.1"
    port: int = 8500  # 0 = pick a free port
    metrics_port: int | None = None  # None = no metrics endpoint; 0 = free port
    metrics_host: str | None = None  # the address /metrics binds (None: host)
    #: the KServe v2 HTTP/REST port on ``host`` (serve.http; None = none, 0 = a free port): TLS and the token as gRPC
    http_port: int | None = None
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    data_paths: list[str] = field(default_factory=list)
    feature_url: str = "memory"
    feature_options: dict = field(default_factory=dict)
    poll_s: float = 2.0  # repository watch interval; 0 = no watching
    grace_s: float = 10.0
    drain_s: float = 0.0  # minimum time the listener refuses with UNAVAILABLE before gRPC closes
    workers: int = 1  # batch worker threads per model
    #: RPCs the server runs at once (streams count as one each); more get RESOURCE_EXHAUSTED from gRPC
    max_concurrent_rpcs: int = 1000
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # require client certificates signed by this CA
    #: allow a non-loopback bind with neither a token nor client certificates (logged as a warning)
    insecure: bool = False
    #: bind with SO_REUSEPORT: one of several processes on one port (``gnnserve serve --processes N``,
    #: serve.processes); off by default, so a second server on a taken port fails to bind
    reuse_port: bool = False
    #: the asyncio loop the server runs on (serve.loops): "auto" = uvloop where installed, "uvloop", "asyncio"
    event_loop: str = "auto"
    #: threads of the BLAS libraries' pools (SciPy's OpenBLAS: the compiled CPU forwards' dense products),
    #: set process-wide when the server is built: None = ``kernels.threads.server_blas_threads``' rule (1,
    #: or the pools left alone where ``OPENBLAS_NUM_THREADS`` is set), 0 = leave the pools as they are
    blas_threads: int | None = None
    #: processes that compile the CPU kernels numba's disk cache lacks before the models load
    #: (kernels.precompile: the signatures shipped with the package and those this machine compiled before):
    #: None = the cores, at most 8 (nothing on one core, or when the cache has them); 0 = never
    precompile_jobs: int | None = None


class GnnServer:
    """Build with a :class:`ServerConfig`, then ``await start()``, ``await wait()`` / ``await stop()``."""

    def __init__(self, config: ServerConfig) -> None:
        # fail closed before anything is built or bound (serve.security: blank token, half TLS, open bind)
        for warning in check_security_config(host=config.host, token=config.token, tls_cert=config.tls_cert,
                                             tls_key=config.tls_key, tls_client_ca=config.tls_client_ca,
                                             insecure=config.insecure):
            log.warning("%s", warning)
        self.config = config
        # a first start on a machine compiles the CPU kernels for a minute or more: said kernel by kernel
        compile_log.install()
        _set_blas_threads(config.blas_threads)
        self.metrics = ServerMetrics()
        self.health = health.aio.HealthServicer()
        self.registry = ModelRegistry(
            config.repo,
            config.runtime,
            workers=config.workers,
            metrics=self.metrics,
            data_paths=config.data_paths,
            feature_url=config.feature_url,
            feature_options=config.feature_options,
            on_change=self._update_health,
        )
        CacheCollector(self.registry.snapshot, self.metrics.registry)
        TritonCollector(self.registry.snapshot, self.metrics.registry)
        interceptors: list[aio.ServerInterceptor] = []
        #: the token check (None without a token): refusals counted (gnnserve_requests_total) and logged there
        self.auth = BearerAuthInterceptor(config.token, self.metrics) if config.token is not None else None
        if self.auth is not None:
            interceptors.append(self.auth)
        self.gate = DrainGate(self.metrics.inflight)
        rt_opts = config.runtime
        wire_limits = WireLimits(max_nodes=rt_opts.max_nodes_per_request,
                                 max_new_node_edges=rt_opts.max_new_node_edges,
                                 max_update_size=rt_opts.max_update_size)
        interceptors.append(ErrorMappingInterceptor(self.metrics, self.gate, wire_limits=wire_limits,
                                                    model_label=self.registry.label_of,
                                                    read_only=rt_opts.read_only))
        if config.max_concurrent_rpcs < 1:
            raise ValueError("max_concurrent_rpcs must be >= 1")
        self.server = aio.server(
            interceptors=interceptors,
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 1 if config.reuse_port else 0),
            ],
        )
        gnnserve_pb2_grpc.add_GnnServiceServicer_to_server(GnnServicer(self.registry), self.server)
        triton = TritonServicer(self.registry, self.gate)
        inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(triton, self.server)
        #: the KServe v2 HTTP/REST front end over the same servicer (None without ``http_port``)
        self.http: HttpFrontEnd | None = None
        if config.http_port is not None:
            self.http = HttpFrontEnd(triton, metrics=self.metrics, gate=self.gate, auth=self.auth, token=config.token,
                                     model_label=self.registry.label_of, max_body_bytes=MAX_MESSAGE_BYTES,
                                     max_concurrent=config.max_concurrent_rpcs)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (GNN_SERVICE, TRITON_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME),
            self.server,
        )
        self.port = 0
        self.metrics_port: int | None = None
        self.http_port: int | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._served = asyncio.Event()  # set once health first reports SERVING (a model loaded and warmed)
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop (health updates from threads)
        self._said_lost: set[str] = set()
        self._said_broken: set[str] = set()  # graphs out of service already logged (once each, CRITICAL)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Bind, load and warm every model, then report SERVING. Returns the bound port."""
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        for svc in ("", GNN_SERVICE, TRITON_SERVICE):
            await self.health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{cfg.host}:{cfg.port}"
        if cfg.tls_cert or cfg.tls_key:
            if not (cfg.tls_cert and cfg.tls_key):
                raise ValueError("TLS needs both --tls-cert and --tls-key")
            creds = grpc.ssl_server_credentials(
                [(Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes())],
                root_certificates=Path(cfg.tls_client_ca).read_bytes() if cfg.tls_client_ca else None,
                require_client_auth=bool(cfg.tls_client_ca),
            )
            self.port = self.server.add_secure_port(address, creds)
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot bind {address}")
        if cfg.metrics_port is not None:
            self.metrics_port = self.metrics.serve_http(
                cfg.metrics_port, addr=cfg.metrics_host if cfg.metrics_host is not None else cfg.host)
        await self.server.start()
        log.info("listening on %s:%d (%s, %s event loop)", cfg.host, self.port, "TLS" if cfg.tls_cert else "plaintext",
                 loop_name(asyncio.get_running_loop()))
        if self.http is not None:  # HTTPS whenever gRPC is TLS, never plaintext beside it
            ctx = server_ssl_context(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) if cfg.tls_cert and cfg.tls_key \
                else None
            self.http_port = await self.http.start(cfg.host, int(cfg.http_port or 0), ssl_context=ctx,
                                                   reuse_port=cfg.reuse_port)
            log.info("KServe v2 HTTP/REST on %s:%d (%s)", cfg.host, self.http_port, "HTTPS" if ctx else "plaintext")
        if cfg.precompile_jobs != 0:  # a cold cache's compilations in parallel (health says NOT_SERVING meanwhile)
            from kernels import precompile

            from .registry import _in_daemon_thread, model_widths

            # on a daemon thread, not the loop's executor (whose threads the loop's shutdown joins): a signal
            # meanwhile abandons start() at once, and the compiling processes are ended with it
            try:
                await _in_daemon_thread(asyncio.get_running_loop(), precompile.at_start, cfg.precompile_jobs,
                                        model_widths(cfg.repo))
            except asyncio.CancelledError:
                precompile.abort()
                raise
        await self.registry.refresh()
        if not self.registry.ready:
            failures = self.registry.failures()
            # a checkpoint written straight into REPO/<name> (train --out REPO/<name>) is no version of anything
            stray = sorted(d.name for d in Path(cfg.repo).iterdir() if (d / "config.json").is_file()) \
                if Path(cfg.repo).is_dir() else []
            hint = "".join(f"\n  {Path(cfg.repo) / name}: a checkpoint without a version directory; move it to "
                           f"{Path(cfg.repo) / name / '1'} (gnnserve train --out REPO/<name>/<version>)"
                           for name in stray)
            also = "" if cfg.poll_s > 0 else ("\n  --poll-s 0: the repository is not looked at again; the server "
                                              "stays NOT_SERVING until it is restarted")
            log.error("no model could be loaded from %s%s%s%s", cfg.repo,
                      "".join(f"\n  {p}: {r}" for p, r in failures.items()), hint, also)
        await self._update_health_async()
        if cfg.poll_s > 0:
            self._watch_task = asyncio.get_running_loop().create_task(self.registry.watch(cfg.poll_s))
        return self.port

    def _update_health(self) -> None:
        """Schedule a health update: from the event loop, or from a worker thread (a model that lost its
        device, ModelRuntime._device_lost; a graph taken out of service, LiveGraph._out_of_service)."""
        try:
            asyncio.get_running_loop().create_task(self._update_health_async())
            return
        except RuntimeError:  # not on the loop
            pass
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: the server is stopping anyway
                loop.call_soon_threadsafe(lambda: loop.create_task(self._update_health_async()))

    async def _update_health_async(self) -> None:
        lost = self.registry.lost_devices()
        for what in lost - self._said_lost:
            log.critical("health NOT_SERVING: %s; restart the server (batches the compiled CPU paths take are "
                         "still answered)", what)
        self._said_lost |= lost
        broken = self.registry.broken_graphs()
        for label in broken.keys() - self._said_broken:
            log.critical("health NOT_SERVING: %s (its models' requests get FAILED_PRECONDITION); restart the "
                         "server", broken[label])
        self._said_broken |= broken.keys()
        serving = self.registry.ready and self.gate.open and not lost and not broken
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for svc in ("", GNN_SERVICE, TRITON_SERVICE):
            await self.health.set(svc, status)
        if serving:
            self._served.set()

    async def wait_served(self) -> None:
        """Return once the server has served a model (health SERVING), which can be long after
        :meth:`start`: when no model loads at first, a later repository scan may bring one."""
        await self._served.wait()

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop: NOT_SERVING, refuse new RPCs, finish in-flight ones within the grace."""
        if not self.gate.open:  # a stop is under way
            await self._stopped.wait()
            return
        grace = self.config.grace_s if grace_s is None else grace_s
        # our own handler refuses new RPCs with UNAVAILABLE from here on (see DrainGate), then the
        # health service says NOT_SERVING: a probe that sees NOT_SERVING can rely on the refusal
        self.gate.close()
        log.info("shutting down (grace %.1f s, %d requests in flight)", grace, self.gate.inflight)
        await self.health.enter_graceful_shutdown()
        if self._watch_task is not None:
            self._watch_task.cancel()
        await asyncio.gather(self._drain_then_stop_grpc(grace), self.registry.close(grace))
        self.metrics.close()
        self._stopped.set()
        log.info("stopped")

    async def _drain_then_stop_grpc(self, grace: float) -> None:
        t0 = time.monotonic()
        if not await self.gate.wait_idle(grace):
            log.warning("%d requests still running after the %.1f s grace; cancelling them",
                        self.gate.inflight, grace)
        await asyncio.sleep(max(0.0, self.config.drain_s - (time.monotonic() - t0)))
        if self.http is not None:  # its admitted requests were waited for above, with gRPC's
            await self.http.stop()
        await self.server.stop(max(0.0, grace - (time.monotonic() - t0)))

    async def wait(self) -> None:
        await self._stopped.wait()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: (log.info("received %s", s.name),
                                                        loop.create_task(self.stop())))


async def serve_forever(config: ServerConfig, ready_file: str | None = None, status_file: str | None = None) -> None:
    """Run until SIGTERM/SIGINT; ``ready_file`` gets the bound port once a model is served (loaded and
    warmed: health SERVING). When no model could be loaded at start the server keeps running,
    NOT_SERVING, and polls the repository: the file is written when a scan first brings a model, not
    before (never, with ``poll_s`` 0). ``status_file`` (a child of ``--processes N``) is written at the
    same moment, with JSON: port, metrics port, pid and the graph version of each dataset served from a
    local graph (serve.processes compares them, and writes the parent's ``--ready-file`` once every child
    has written its status: once all of them serve)."""
    server = GnnServer(config)
    server.install_signal_handlers()
    # a signal during start-up (models still loading) stops the server at once: start() is abandoned,
    # not awaited to its end (a load can take minutes; loads run in daemon threads, see serve.registry)
    starting = asyncio.ensure_future(server.start())
    stopped = asyncio.ensure_future(server.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("stopped while starting; model loads still running are abandoned")
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    stopped.cancel()
    port = starting.result()
    if (ready_file or status_file) and not await _served_or_stopped(server):
        return
    if ready_file:
        Path(ready_file).write_text(f"{port}\n")
    if status_file:
        import json
        import os

        versions = {rt.dataset_fingerprint: rt.data.live.version
                    for runtimes in server.registry.snapshot().values() for rt in runtimes.values()
                    if rt.data.live is not None}
        tmp = Path(f"{status_file}.tmp")
        tmp.write_text(json.dumps({"port": port, "metrics_port": server.metrics_port, "pid": os.getpid(),
                                   "graph_versions": versions}))
        tmp.replace(status_file)  # the parent polls for the file: it appears whole
    try:
        await server.wait()
    finally:
        if status_file:
            _remove_status(status_file)


def _remove_status(status_file: str) -> None:
    """A ``--processes`` child leaving: its status file goes, and the parent's directory of them when it is
    the last (the parent removes that directory itself when it stops; this covers a parent killed with
    SIGKILL, whose children still get SIGTERM and drain)."""
    from .processes import STATUS_DIR_PREFIX

    path = Path(status_file)
    with contextlib.suppress(OSError):
        path.unlink()
    if path.parent.name.startswith(STATUS_DIR_PREFIX):  # the directory serve.processes made, nobody else's
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only when empty: another child's file keeps it


async def _served_or_stopped(server: GnnServer) -> bool:
    """Wait until ``server`` serves a model (True) or stops first (False), saying why it waits."""
    if not server.registry.ready:
        if server.config.poll_s > 0:
            log.warning("no model is served yet: the ready file is written once one is (the repository is polled "
                        "every %g s)", server.config.poll_s)
        else:
            log.error("no model is served, and the repository is not polled (poll interval 0): the ready file will "
                      "not be written; restart once the repository holds a model that loads")
    served = asyncio.ensure_future(server.wait_served())
    stopped = asyncio.ensure_future(server.wait())
    await asyncio.wait({served, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in (served, stopped):
        task.cancel()
    return served.done() and not served.cancelled() and server.gate.open


class BackgroundServer:
    """A :class:`GnnServer` in a background thread with its own event loop (demo, notebooks, tests).

    ``start()`` returns once the models are served; ``address`` is ``host:port``; ``stop()`` shuts
    down gracefully. Usable as a context manager.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.server: GnnServer | None = None
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def start(self, timeout: float = 600) -> BackgroundServer:
        loop = new_event_loop(self.config.event_loop)
        self._loop = loop
        started = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self.server = GnnServer(self.config)
                self.port = loop.run_until_complete(self.server.start())
            except BaseException as exc:
                errors.append(exc)
                return
            finally:
                started.set()
            loop.run_until_complete(self.server.wait())

        self._thread = threading.Thread(target=run, name="gnnserve-server", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise TimeoutError(f"server did not start within {timeout} s")
        if errors:
            self._thread.join(10)
            loop.close()
            raise errors[0]
        return self

    def call(self, coro: Any, timeout: float = 60) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self, grace_s: float = 5.0) -> None:
        if self._loop is None or self.server is None:
            return
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.call(self.server.stop(grace_s), timeout=grace_s + 30)
        if self._thread is not None:
            self._thread.join(30)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
