"""The model repository: load checkpoints, share their data, swap in new versions live.

Layout (like Triton's)::

    REPO/
      <model-name>/
        <version>/      one checkpoint directory (models.checkpoint), version = positive integer
      _data/<fingerprint>/   optional dataset directories (kernels.datasets.GraphDataset.save)
      _ppr/             PPR top-K index files (built on first load, memory-mapped afterwards)

Names starting with ``_`` or ``.`` are not models. Every version present is served; requests
without a version get the highest. :meth:`ModelRegistry.watch` polls the repository: a new
version is loaded and warmed in the background and only then becomes visible, so in-flight
requests never fail; a removed version stops taking requests and is closed after its queue
drains. A checkpoint that fails to load is logged with the reason and skipped; the other models
keep serving, and it is retried when its directory changes.

Explicit control (Triton's repository extension; :meth:`ModelRegistry.unload` / :meth:`~ModelRegistry.load`):
an unloaded model, or one version of it, stops taking requests at once (NOT_FOUND) and its runtimes
close after their queues drain. It is then *held*: the poller does not load it again, even when its
directory changes or a new version of it appears, until an explicit load (or a restart: holds are
not persisted). A load lifts the hold and loads what the repository has for that model now.

Data a checkpoint needs is found by the dataset fingerprint in its config: ``data_paths``
(``--data``), then ``REPO/_data/<fingerprint>``, then the source path recorded at training time.
Versions trained on the same data share one graph, one feature store and one PPR index.

Stateless replicas (``RuntimeOptions.graph_url``, ``gnnserve serve --graph URL``): no dataset is
read from disk. The graph and the PPR lists come from Redis (:mod:`serve.graph_store`, keyed by the
checkpoint's graph fingerprint; the version must have been loaded from the checkpoint's dataset),
and the features from ``feature_url`` (when that is ``memory``, from the graph's Redis URL too).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kernels.datasets import GraphDataset, load_dataset

from .errors import ModelNotFound, ModelRefused, Unavailable
from .metrics import ServerMetrics
from .runtime import DataBundle, ModelRuntime, RuntimeOptions

__all__ = ["ModelRegistry", "RepositoryError"]

log = logging.getLogger(__name__)


class RepositoryError(RuntimeError):
    """A checkpoint or its data cannot be loaded (the message says which and why)."""


def _dir_stamp(path: Path) -> float:
    """Latest mtime under a checkpoint directory (files directly inside it)."""
    try:
        return max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.iterdir()])
    except OSError:
        return 0.0


def _dir_identity(path: Path) -> tuple[int, int, float]:
    """(device, inode, stamp) of a version directory: one replaced by another directory (a new inode:
    ``gnnserve train --overwrite``) or changed in place (a newer file) reads differently."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0.0)
    return (st.st_dev, st.st_ino, _dir_stamp(path))


def model_widths(repo: str | Path) -> set[int]:
    """The hidden and class counts of the models a repository holds (``REPO/<name>/<version>/config.json``):
    the row widths the CPU kernel may compile a narrow kernel for (``kernels.precompile.with_widths``). An
    unreadable repository or config adds nothing."""
    out: set[int] = set()
    try:
        configs = list(Path(repo).glob("*/*/config.json"))
    except OSError:
        return out
    for path in configs:
        try:
            model = json.loads(path.read_text()).get("model", {})
            out.update(int(model[k]) for k in ("hidden", "num_classes") if isinstance(model.get(k), int))
        except (OSError, ValueError, AttributeError):
            continue
    return out


#: model names a NOT_FOUND message lists at most
NOT_FOUND_NAMES = 10
#: characters of a client-sent model name a message repeats at most
SHOWN_NAME_CHARS = 64


def _shown(name: str) -> str:
    """A client-sent model name for a message, cut to :data:`SHOWN_NAME_CHARS` characters."""
    if len(name) <= SHOWN_NAME_CHARS:
        return repr(name)
    return f"{name[:SHOWN_NAME_CHARS]!r}... ({len(name)} characters)"


def version_not_in_repository(name: str, version: str, *, loading: bool) -> ModelNotFound:
    """The NOT_FOUND of a repository load (``loading``) or unload of model ``name`` at a version (as shown:
    ``version``) the repository does not hold (:meth:`ModelRegistry.load` / :meth:`ModelRegistry.unload`, and
    serve.triton for a version of more digits than any directory name)."""
    if loading:
        return ModelNotFound(f"model {_shown(name)} version {version} is not in the repository")
    return ModelNotFound(f"model {_shown(name)} has no version {version} in the repository")


def _in_daemon_thread(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Run ``fn(*args)`` in a new daemon thread; its result as a future of ``loop``.

    Model loads run here rather than in a ``ThreadPoolExecutor``: the interpreter joins a pool's
    threads at exit, so a SIGTERM during a long load (a PPR index build, a store that does not
    answer) would keep the process alive until the load ended, past any grace period. A daemon
    thread is abandoned at exit instead; awaiting the future can be cancelled at any time.
    """
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def run() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:
            ok, value = False, exc
        else:
            ok = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=run, name="gnnserve-loader", daemon=True).start()
    return fut


def _transient(exc: BaseException) -> bool:
    from .features.base import FeatureUnavailable

    return isinstance(exc, FeatureUnavailable)


def find_dataset(fingerprint: str, source: str | None, ckpt_path: Path, data_paths: Sequence[str] = (),
                 repo: Path | None = None) -> GraphDataset:
    """The dataset a checkpoint was trained on, by its fingerprint: among ``data_paths`` (``--data``),
    ``REPO/_data/<fingerprint>``, and the ``source`` the checkpoint recorded (a relative one also from the
    checkpoint's directory). Raises :class:`RepositoryError` naming every candidate tried and why."""
    cands: list[str] = list(data_paths)
    local = (repo / "_data" / fingerprint) if repo is not None else None
    if local is not None and local.exists():
        cands.insert(0, str(local))
    if source:
        cands.append(source)
        if not os.path.isabs(source):
            cands.append(str((ckpt_path / source).resolve()))
    seen = []
    for c in cands:
        try:
            ds = load_dataset(c)
        except Exception as exc:
            seen.append(f"{c} ({type(exc).__name__}: {exc})")
            continue
        if ds.fingerprint() == fingerprint:
            return ds
        seen.append(f"{c} (fingerprint {ds.fingerprint()[:12]}..., not {fingerprint[:12]}...)")
    where = f" or put the dataset directory at {local}" if local is not None else ""
    raise RepositoryError(
        f"no dataset with fingerprint {fingerprint} for {ckpt_path}; tried: {'; '.join(seen) or 'nothing'}. "
        f"Pass --data PATH{where}"
    )


def _not_in_service(rt: ModelRuntime) -> str:
    """Why a served version is not :attr:`ModelRuntime.in_service` (KServe's RepositoryIndex reason)."""
    if not rt.ready:
        return "loading"
    return rt.graph_out_of_service or "its device was lost; restart the server"


def _for_client(reason: str) -> str:
    """A load failure's reason as a client may see it: no paths of the server (docs/RELIABILITY.md, "status
    messages": file names only) and no addresses of its infrastructure (a URL keeps its scheme, a host its
    place), at most 300 characters."""
    reason = re.sub(r"\b([A-Za-z][A-Za-z0-9+.-]*)://[^\s'\",;)]*", r"\1://...", reason)
    reason = re.sub(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\blocalhost:\d+\b|\[[0-9A-Fa-f:.]+\](?::\d+)?",
                    "<host>", reason)
    reason = re.sub(r"(?<![\w.:/])(?:/[^\s'\"/]+)+/?", lambda m: os.path.basename(m.group(0).rstrip("/")) or "/",
                    reason)
    return reason if len(reason) <= 300 else reason[:297] + "..."

class ModelRegistry:
    """Loaded model versions by name, plus the data they share.

    Args:
        repo: the repository directory.
        options: runtime options (device, batching, limits).
        executor: where every model's batches run (shared); ``None`` (the server's default): each
            model name gets its own pool of ``workers`` threads, so a slow model (a Redis-backed one
            waiting on its store, a heavy batch) never holds up the batches of another.
        workers: threads per model when ``executor`` is not given.
        metrics: server metrics (feature-store metrics register on its registry too).
        data_paths: explicit dataset paths (``.npz``, dataset dirs) searched first by fingerprint.
        feature_url: feature store URL (``memory`` default, ``redis://...``); see serve.features.
        feature_options: extra keyword arguments for ``serve.features.open_store``.
        on_change: called after the set of ready models changes (health status updates).
    """

    def __init__(
        self,
        repo: str | os.PathLike[str],
        options: RuntimeOptions | None = None,
        *,
        executor: concurrent.futures.Executor | None = None,
        workers: int = 1,
        metrics: ServerMetrics | None = None,
        data_paths: list[str] | None = None,
        feature_url: str = "memory",
        feature_options: dict[str, Any] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.repo = Path(repo)
        if not self.repo.is_dir():
            raise RepositoryError(f"model repository {self.repo} is not a directory")
        self.options = options or RuntimeOptions()
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.executor = executor  # shared by every model when given
        self.workers = workers
        self._executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}  # per model name
        self.metrics = metrics or ServerMetrics()
        self.data_paths = list(data_paths or [])
        self.feature_url = feature_url
        self.feature_options = dict(feature_options or {})
        self.on_change = on_change
        self._models: dict[str, dict[int, ModelRuntime]] = {}
        self._data: dict[str, DataBundle] = {}
        self._failed: dict[Path, tuple[float, str]] = {}  # path -> (stamp, reason)
        #: models on disk with no version served yet that the scan running now will load: name -> since when
        self._loading: dict[str, float] = {}
        self._ignored: set[Path] = set()  # bad version directories already logged (once each, see scan)
        self._data_index: dict[str, Path] | None = None
        self._closing = False
        self._draining: set[asyncio.Future[None]] = set()
        # explicitly unloaded: (name, None) = the whole model, (name, version) = one version (see unload)
        self._held: set[tuple[str, int | None]] = set()
        self._loaded: dict[tuple[str, int], tuple[int, int, float]] = {}  # served version -> its directory's identity
        self._control = asyncio.Lock()  # one repository change at a time: the poller, load, unload
        self._induced_builds: list[threading.Thread] = []  # induced tables built beside serving (_induced_table)
        # while a model loads (_load_version): the builds beside serving it asks for, started after its compaction
        self._induced_later: list[tuple[Any, Any, int]] | None = None
        self._stop_builds = threading.Event()

    # ------------------------------------------------------------------ lookup
    def get(self, name: str, version: str | int = "") -> ModelRuntime:
        """The runtime for ``name`` (latest version unless given). NOT_FOUND / UNAVAILABLE otherwise."""
        versions = self._models.get(name)
        if not versions:
            self._check_refused(name, version)
            since = self._loading.get(name)
            if since is not None:  # a model being loaded exists: retryable, not "not found"
                raise Unavailable(f"model {_shown(name)} is being loaded (for {time.monotonic() - since:.0f} s: its "
                                  "data, PPR index and warm-up); retry shortly")
            raise ModelNotFound(f"model {_shown(name)} not found ({self._known_names()})")
        if version in ("", None):
            rt = versions[max(versions)]
        else:
            try:  # ASCII digits only: int() also reads "٣" and " 3 "
                if isinstance(version, str) and not (version.isascii() and version.isdigit()):
                    raise ValueError(version)
                v = int(version)
            except (TypeError, ValueError):
                raise ModelNotFound(f"model {name!r} has no version {_shown(str(version))} (versions: "
                                    f"{', '.join(map(str, sorted(versions)))})") from None
            rt = versions.get(v)
            if rt is None:
                self._check_refused(name, v)
                raise ModelNotFound(
                    f"model {name!r} has no version {v} (versions: {', '.join(map(str, sorted(versions)))})"
                )
        if not rt.ready:
            raise Unavailable(f"model {name!r} v{rt.version} is not ready")
        return rt

    def _check_refused(self, name: str, version: str | int = "") -> None:
        """Raise with the cause when a version of ``name`` (``version``, or the newest) is on disk but was refused
        at load: such a model exists, it is out of service, not "not found". UNAVAILABLE while the cause may pass
        (Redis unreachable: the load is tried again at every look at the repository), FAILED_PRECONDITION when
        only new files can mend it (clients do not retry that)."""
        found = self._failed_reason(name, version)
        if found is not None:
            failed, transient = found
            which = f"model {name!r}" + (f" v{version}" if version not in ("", None) else "")
            what = f"{which} is on disk but out of service: its load failed ({failed}); the server log has the details"
            if transient:
                raise Unavailable(f"{what}, and the server tries the load again at each look at the repository")
            raise ModelRefused(f"{what}; the server loads it again when the model's files change")

    def _failed_reason(self, name: str, version: str | int = "") -> tuple[str, bool] | None:
        """Why the load of a version of ``name`` on disk failed (the newest such version, or ``version``),
        cut to 300 characters for a client's message, and whether the cause may pass by itself; None when none
        failed."""
        want = None
        if version not in ("", None):
            try:
                want = int(version)
            except (TypeError, ValueError):
                return None
        hits = []
        for path, (stamp, reason) in list(self._failed.items()):
            if path.parent.name != name or not path.name.isdigit():
                continue
            if want is None or int(path.name) == want:
                hits.append((int(path.name), reason, stamp == -1.0))
        if not hits:
            return None
        _, reason, transient = max(hits)
        return _for_client(reason), transient

    def _known_names(self) -> str:
        """The served model names for a NOT_FOUND message: the first few (the message travels to any
        client, and a repository can hold many models; ListModels lists them all)."""
        names = sorted(self._models)
        if not names:
            return "no model is loaded"
        shown = ", ".join(names[:NOT_FOUND_NAMES])
        more = len(names) - NOT_FOUND_NAMES
        return f"models: {shown}" + (f" and {more} more (ListModels lists them)" if more > 0 else "")

    def label_of(self, name: str) -> str:
        """``name`` as a metric label: itself for a model this server serves, else "" (client-chosen
        names must not create time series)."""
        return name if name in self._models else ""

    def snapshot(self) -> dict[str, dict[int, ModelRuntime]]:
        # list() and dict() copy in one C call each: safe from the metrics thread while a version loads
        return {k: dict(v) for k, v in list(self._models.items())}

    def versions(self, name: str) -> list[int]:
        return sorted(self._models.get(name, {}))

    @property
    def ready(self) -> bool:
        return any(rt.ready for vs in self._models.values() for rt in vs.values())

    def lost_devices(self) -> set[str]:
        """The models whose CUDA context a kernel fault left unusable (ModelRuntime.lost_device), as
        "model NAME vN lost DEVICE": health reports NOT_SERVING while any is served."""
        return {f"model {rt.name} v{rt.version} lost {rt.device}" for vs in list(self._models.values())
                for rt in list(vs.values()) if rt.lost_device}

    def broken_graphs(self) -> dict[str, str]:
        """The graphs taken out of service (serve.live ``LiveGraph.broken``: the update log lost records or was
        replaced, an update failed half-way, storing refreshed PPR lists failed) that serve a model, as
        ``{graph label: why}``: health reports NOT_SERVING while any is served (it lasts until a restart)."""
        out: dict[str, str] = {}
        for vs in list(self._models.values()):
            for rt in list(vs.values()):
                why = rt.graph_out_of_service
                if why is not None:
                    out[rt.data.live.label] = why
        return out

    def failures(self) -> dict[str, str]:
        return {str(p): reason for p, (_, reason) in self._failed.items()}

    # ------------------------------------------------------------------ scanning and loading
    def scan(self) -> dict[str, dict[int, Path]]:
        """Model directories on disk: ``{name: {version: path}}`` (bad names are logged and skipped)."""
        found: dict[str, dict[int, Path]] = {}
        ignored: set[Path] = set()
        for mdir in sorted(self.repo.iterdir()):
            if not mdir.is_dir() or mdir.name.startswith(("_", ".")):
                continue
            for vdir in sorted(mdir.iterdir()):
                if not vdir.is_dir() or vdir.name.startswith((".", "_")):
                    continue
                if not (vdir.name.isascii() and vdir.name.isdigit()) or int(vdir.name) < 1:
                    ignored.add(vdir)
                    if vdir not in self._ignored:  # once per path, not at every poll; again if it comes back
                        log.warning("ignoring %s: version directories are positive integers", vdir)
                    continue
                found.setdefault(mdir.name, {})[int(vdir.name)] = vdir
        self._ignored = ignored
        return found

    async def refresh(self) -> bool:
        """Load new versions, drop removed ones. Returns whether the served set changed."""
        async with self._control:
            return await self._refresh()

    def _retire(self, name: str, version: int, why: str) -> None:
        """Stop serving ``name`` v``version`` at once; its runtime closes after its queue drains."""
        rt = self._models[name].pop(version)
        if not self._models[name]:
            del self._models[name]
        self._loaded.pop((name, version), None)
        self._drain(rt, why)

    def _drain(self, rt: ModelRuntime, why: str) -> None:
        log.info("model %s v%d %s; draining", rt.name, rt.version, why)
        task = asyncio.ensure_future(rt.close(grace_s=30))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    # ------------------------------------------------------------------ explicit control (Triton's repository API)
    def held(self, name: str, version: int) -> bool:
        """Whether ``name`` v``version`` was explicitly unloaded (the poller leaves it alone)."""
        return (name, None) in self._held or (name, version) in self._held

    async def unload(self, name: str, version: int | None = None) -> list[int]:
        """Stop serving ``name`` (every version, or one) and hold it unloaded; returns the versions that
        were served. :class:`ModelNotFound` when it is neither served nor in the repository."""
        async with self._control:
            on_disk = self.scan().get(name, {})
            served = self._models.get(name, {})
            if version is None:
                if not served and not on_disk:
                    raise ModelNotFound(f"model {_shown(name)} is not in the repository")
                self._held.add((name, None))
                gone = sorted(served)
            else:
                if version not in served and version not in on_disk:
                    raise version_not_in_repository(name, str(version), loading=False)
                self._held.add((name, version))
                gone = [version] if version in served else []
            for v in gone:
                self._retire(name, v, "unloaded on request")
            self.metrics.models_loaded.set(sum(len(v) for v in self._models.values()))
            if gone and self.on_change is not None:
                self.on_change()
            return gone

    async def load(self, name: str, version: int | None = None) -> list[int]:
        """Lift the unload hold on ``name`` (or on one version) and load what the repository holds for it
        now, retrying versions that failed before; returns the versions served afterwards.
        :class:`ModelNotFound` when the repository has no such model (version), :class:`RepositoryError`
        with the reason when a version fails to load."""
        async with self._control:
            on_disk = self.scan().get(name, {})
            if not on_disk or (version is not None and version not in on_disk):
                if version is not None:
                    raise version_not_in_repository(name, str(version), loading=True)
                raise ModelNotFound(f"model {_shown(name)} is not in the repository")
            if version is None:
                self._held = {h for h in self._held if h[0] != name}
            else:
                self._held.discard((name, version))
                if (name, None) in self._held:  # the model stays unloaded but for this version
                    self._held.discard((name, None))
                    self._held.update((name, v) for v in on_disk if v != version)
            for v, path in on_disk.items():
                if version is None or v == version:
                    self._failed.pop(path, None)  # retried now even if its directory did not change
            await self._refresh()
            served = self._models.get(name, {})
            missing = [v for v in on_disk if (version is None or v == version) and v not in served]
            if missing:
                reasons = "; ".join(f"v{v}: {self._failed.get(on_disk[v], (0.0, 'not loaded'))[1]}" for v in missing)
                raise RepositoryError(f"model {name!r} failed to load: {reasons}")
            return sorted(served)

    def index(self) -> list[tuple[str, int, str, str]]:
        """``(name, version, state, reason)`` for every version in the repository or served: ``READY``,
        or ``UNAVAILABLE`` and why (unloaded, the reason it failed to load, loading, not loaded yet)."""
        on_disk = self.scan()
        out = []
        for name in sorted(set(on_disk) | set(self._models)):
            served = self._models.get(name, {})
            for v in sorted(set(on_disk.get(name, {})) | set(served)):
                rt = served.get(v)
                if rt is not None:
                    out.append((name, v, "READY", "") if rt.in_service else
                               (name, v, "UNAVAILABLE", _not_in_service(rt)))
                elif self.held(name, v):
                    out.append((name, v, "UNAVAILABLE", "unloaded"))
                else:
                    failed = self._failed.get(on_disk[name][v])
                    out.append((name, v, "UNAVAILABLE", _for_client(failed[1]) if failed else "not loaded yet"))
        return out

    async def _refresh(self) -> bool:
        loop = asyncio.get_running_loop()
        on_disk = self.scan()
        now = time.monotonic()
        self._loading = {n: now for n, vs in on_disk.items()
                         if not self._models.get(n) and any(not self.held(n, v) for v in vs)}
        try:
            changed = await self._load_changed(loop, on_disk)
        finally:
            self._loading = {}
        for name in list(self._models):
            for version in list(self._models[name]):
                if version not in on_disk.get(name, {}):
                    self._retire(name, version, "removed from the repository")
                    changed = True
        self.metrics.models_loaded.set(sum(len(v) for v in self._models.values()))
        if changed and self.on_change is not None:
            self.on_change()
        return changed

    async def _load_changed(self, loop: asyncio.AbstractEventLoop, on_disk: dict[str, dict[int, Path]]) -> bool:
        """Load the versions on disk that are new or changed (or failed and changed since): :meth:`_refresh`'s
        loading half; returns whether any was loaded. A model leaves ``_loading`` once its versions are done."""
        changed = False
        for name, versions in on_disk.items():
            for version, path in versions.items():
                if self.held(name, version):
                    continue
                ident = _dir_identity(path)
                before = self._models.get(name, {}).get(version)
                if before is not None and self._loaded.get((name, version)) == ident:
                    continue
                stamp = ident[2]
                failed = self._failed.get(path)
                if failed is not None and failed[0] == stamp:
                    continue
                if not (path / "config.json").exists():
                    continue  # still being written: checkpoints land atomically, config last
                try:
                    rt = await _in_daemon_thread(loop, self._load_version, name, version, path)
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                    # Redis (graph or features) unreachable: retry at the next scan, not only when the
                    # checkpoint changes (a stateless replica started before Redis must come up by itself)
                    self._failed[path] = (-1.0 if _transient(exc) else stamp, reason)
                    log.error("model %s v%d at %s refused: %s", name, version, path, reason)
                    continue
                self._failed.pop(path, None)
                if self._closing:  # the server began to stop while this version loaded
                    await rt.close(0)
                    return changed
                self._models.setdefault(name, {})[version] = rt
                self._loaded[(name, version)] = ident
                changed = True
                log.info("serving model %s v%d (%s, %s) from %s", name, version, rt.architecture, rt.extractor, path)
                if before is not None:
                    self._drain(before, "replaced by its changed directory")
            self._loading.pop(name, None)
        return changed

    async def watch(self, interval_s: float = 2.0) -> None:
        """Poll the repository forever (cancel the task to stop)."""
        while not self._closing:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh()
            except Exception:  # a watcher must survive anything the filesystem does
                log.exception("repository scan failed; will retry")

    async def close(self, grace_s: float | None = None) -> None:
        self._closing = True
        self._stop_builds.set()  # a build beside serving stops at its next chunk
        await asyncio.to_thread(self.wait_for_induced_tables, 30.0)
        runtimes = [rt for vs in self._models.values() for rt in vs.values()]
        await asyncio.gather(*(rt.close(grace_s) for rt in runtimes), return_exceptions=True)
        for bundle in self._data.values():
            if bundle.live is not None:
                bundle.live.close()
            for part in (bundle.features, bundle.graph):
                close = getattr(part, "close", None)
                if close is not None and (part is bundle.features or getattr(part, "is_remote", False)):
                    try:
                        close()
                    except Exception:
                        log.exception("closing a data store failed")
        self.shutdown_executors()

    def executor_for(self, name: str) -> concurrent.futures.Executor:
        """Where model ``name``'s batches run: the shared executor, or the model's own pool."""
        if self.executor is not None:
            return self.executor
        pool = self._executors.get(name)
        if pool is None:
            pool = self._executors[name] = concurrent.futures.ThreadPoolExecutor(
                self.workers, thread_name_prefix=f"gnnserve-{name[:16]}")
        return pool

    def shutdown_executors(self) -> None:
        """Stop the per-model pools (running batches finish; queued ones are cancelled)."""
        for pool in self._executors.values():
            pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ one version
    def _load_version(self, name: str, version: int, path: Path) -> ModelRuntime:
        """Load, attach data, warm: runs in the loader thread. Raises on any problem.

        The induced tables it builds beside serving start once it is done: such a table is saved into its index's
        directory (a snapshot's lists), which a compaction at this start replaces, so a directory being written
        is never the one that compaction deletes (it was, on every start that compacted: "induced table not
        saved ... No such file", and once a directory without meta.json left behind)."""
        self._induced_later = []
        try:
            return self._load_version_now(name, version, path)
        finally:
            later, self._induced_later = self._induced_later or [], None
            for args in later:
                self._start_induced_build(*args)

    def _load_version_now(self, name: str, version: int, path: Path) -> ModelRuntime:
        from models.checkpoint import load_checkpoint

        t0 = time.perf_counter()
        ckpt = load_checkpoint(path)
        if self.options.graph_url:
            data = self._remote_data_for(ckpt.dataset_fingerprint, ckpt.graph_fingerprint)
        else:
            data = self._data_for(ckpt.dataset_fingerprint, ckpt.config["dataset"].get("source"), path)
        live = self._live_for(data)
        with live.writing():  # no update lands between the graph the index and model are built on and attaching
            index = self._ppr_index(data, ckpt.ppr_config) if ckpt.extractor == "ppr" else None
            if index is not None:  # --hot-bytes: the static hot tier from the first PPR model's index
                from .features import install_hot_from_index

                install_hot_from_index(data.features.base, index)
            rt = ModelRuntime(name, version, ckpt, data, index, self.options, self.executor_for(name), self.metrics)
            rt.on_device_lost = self.on_change  # health goes NOT_SERVING (the server's update is thread-safe)
            live.attach(rt)
            if not self.options.graph_url and self._replay_pending(live):
                self._open_saved_indexes(data)  # only before a replay: without one, each model finds its own
        t_replay = time.perf_counter()
        replayed = live.catch_up()  # the graph's logged updates (the first model on it: all of them)
        if replayed:
            log.info("graph %s: %d logged versions replayed in %.2f s, now at version %d", live.label, replayed,
                     time.perf_counter() - t_replay, live.version)
        limit, replay_s = self.options.compact_log_bytes, self.options.compact_replay_s
        snapshot = self._live_dir() / f"{data.fingerprint}.snapshot"
        if live.compaction_due(replay_s, max_log_bytes=limit):
            try:
                live.compact(snapshot, ppr_cache_dir=self._ppr_cache_dir)
            except Exception:  # an optimisation: the replayed graph serves, the log stays whole
                log.exception("graph %s: compacting the update log at start failed (disk full, or the directory "
                              "not writable?); serving the replayed graph, the log kept as it is", live.label)
        if replay_s > 0 and not self.options.graph_url:
            live.compact_when_idle(snapshot, self._ppr_cache_dir, replay_s=replay_s,
                                   idle_s=self.options.compact_idle_s)
        rt.warm()
        log.info("loaded %s v%d in %.1f s", name, version, time.perf_counter() - t0)
        return rt

    def _ppr_index(self, data: DataBundle, ppr_config: dict[str, Any] | None) -> Any:
        from kernels.ppr import PPRConfig, PPRIndex

        if not ppr_config:
            raise RepositoryError("a PPR model's checkpoint has no PPR configuration")
        cfg = PPRConfig(**ppr_config)
        key = repr(cfg)
        idx = data.ppr_indexes.get(key)
        if idx is not None:
            return idx
        if getattr(data.graph, "is_remote", False):
            idx = data.graph.ppr_index(cfg)  # lists in Redis; GraphNotFound names the missing config
        else:
            # directories no start can open (no meta.json: a writer's directory deleted under it by an older
            # server's compaction) and dead writers' temporary ones go first: one at this index's path blocks its build
            from kernels.ppr_index import remove_orphan_indexes

            for gone in remove_orphan_indexes(self._ppr_cache_dir):
                log.info("removed %s from %s: an incomplete PPR index no process writes", gone, self._ppr_cache_dir)
            # on a graph changed by updates (serve.live) this is an index of the current graph (its own
            # fingerprint): built now, then kept up to date with the graph like the others
            idx = PPRIndex.open_or_build(self._ppr_cache_dir, data.graph, cfg)
            if self.options.induced_table_bytes > 0:
                self._induced_table(idx, data.graph)
        if data.live is not None:
            idx = data.live.wrap_index(idx)
        data.ppr_indexes[key] = idx
        return idx

    def _induced_table(self, idx: Any, graph: Any) -> None:
        """Attach ``idx``'s induced table: the saved one; else build it now where ``induced_table_wait`` says so (by
        default on a CUDA device or with ``resident``), otherwise on a thread beside serving (a build takes minutes at millions of nodes:
        231 s at 2 M on 2 cores). Until it is attached, the index's batches are induced from the graph (same answers;
        :meth:`kernels.ppr.PPRIndex.induced_batch` reads the table at each call, and a live index's dirty marks
        hold against the base lists the table is built from). The build saves it beside the lists."""
        import torch

        max_bytes = self.options.induced_table_bytes
        if idx.open_saved_induced():
            return
        wait = self.options.induced_table_wait
        if wait is None:  # a resident shaDow path is chosen at load and needs the table then
            wait = torch.device(self.options.device).type != "cpu" or bool(self.options.resident)
        if wait:
            idx.ensure_induced(graph, max_bytes=max_bytes, limit_name="--induced-table-bytes")
            return
        if self._induced_later is not None:  # a model loads: after its start's compaction (_load_version)
            self._induced_later.append((idx, graph, max_bytes))
            return
        self._start_induced_build(idx, graph, max_bytes)

    def _start_induced_build(self, idx: Any, graph: Any, max_bytes: int) -> None:
        th = threading.Thread(target=self._build_induced, args=(idx, graph, max_bytes),
                              name="gnnserve-induced-table", daemon=True)
        self._induced_builds.append(th)
        th.start()

    def _build_induced(self, idx: Any, graph: Any, max_bytes: int) -> None:
        from kernels.subgraph import BuildStopped

        name = getattr(getattr(idx, "path", None), "name", "in memory")
        log.info("PPR index %s: its induced table is built beside serving; until it is ready, shaDow batches are "
                 "induced from the graph (same answers, more work per batch; --induced-table-wait waits instead)", name)
        t0 = time.perf_counter()
        try:
            if idx.ensure_induced(graph, max_bytes=max_bytes, progress=True, stop=self._stop_builds,
                                  limit_name="--induced-table-bytes"):
                log.info("PPR index %s: induced table ready after %.1f s; shaDow batches read it from now on", name,
                         time.perf_counter() - t0)
        except BuildStopped:
            log.info("PPR index %s: induced table build stopped (the server closes)", name)
        except Exception:
            log.exception("PPR index %s: the induced table could not be built; shaDow batches stay induced from "
                          "the graph", name)

    def wait_for_induced_tables(self, timeout: float | None = None) -> bool:
        """Wait for the induced tables being built beside serving; whether every build has ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for th in list(self._induced_builds):
            th.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(th.is_alive() for th in self._induced_builds)

    @staticmethod
    def _replay_pending(live: Any) -> bool:
        """Whether the graph's update log holds records the graph has not applied (a log that cannot be read
        counts as pending: the replay right after says what is wrong)."""
        if live.log is None:
            return False
        try:
            return int(live.log.head()) > live.version
        except Exception:
            return True

    @property
    def _ppr_cache_dir(self) -> Path:
        """Where PPR indexes are saved and looked for: ``--ppr-cache-dir``, else ``REPO/_ppr``."""
        return Path(self.options.ppr_cache_dir or self.repo / "_ppr")

    def _open_saved_indexes(self, data: DataBundle) -> None:
        """Open now the saved PPR indexes of the graph as it is (the dataset's, or a compacted snapshot's) that
        other checkpoints on this dataset use, before the logged updates are replayed: the replay then brings
        their lists up to date, and those models, loaded after it, find them (otherwise a model loaded after
        the replay built the index of the edited graph from every node: 15 minutes at 1 M nodes in a QA
        report). Only indexes already on disk: a missing one is built by its model's own load, as before."""
        from kernels.ppr import PPRConfig, PPRIndex

        cache_dir = self._ppr_cache_dir
        for versions in self.scan().values():
            for path in versions.values():
                try:
                    config = json.loads((path / "config.json").read_text())
                    if config.get("dataset", {}).get("fingerprint") != data.fingerprint or not config.get("ppr"):
                        continue
                    cfg = PPRConfig(**config["ppr"])
                except (OSError, ValueError, TypeError, AttributeError):
                    continue  # that model's own load says what is wrong with it
                if repr(cfg) in data.ppr_indexes or not (PPRIndex.path_for(cache_dir, data.graph, cfg)
                                                         / "meta.json").exists():
                    continue
                self._ppr_index(data, config["ppr"])
                log.info("graph %s: PPR index %s opened for %s before the update log's replay", data.live.label,
                         cfg.key(), path.parent.name)

    def _live_for(self, data: DataBundle) -> Any:
        """The dataset's :class:`serve.live.LiveGraph` with its update log (made on first use)."""
        if data.live is not None:
            return data.live
        from .features import is_redis_url
        from .live import LiveGraph
        from .update_log import FileUpdateLog, RedisUpdateLog, UpdateLogInUse

        o = self.options
        redis_url = o.graph_url or (self.feature_url if is_redis_url(self.feature_url) else None)
        if redis_url:  # replicas share one log next to the data they share
            update_log: Any = RedisUpdateLog(redis_url, data.fingerprint)
        else:
            path = self._live_dir() / f"{data.fingerprint}.log"
            follow = o.read_only  # a read-only server never writes the log: it follows whoever does
            if not follow:
                try:
                    update_log = FileUpdateLog(path, fsync=o.update_log_fsync)
                except UpdateLogInUse:  # another server on this repository takes this graph's updates
                    follow = True
                    log.warning("graph %s: another server on this repository writes its update log %s: this "
                                "one replays and follows it (every update that server takes is answered here "
                                "too; min_graph_version gives read-your-writes) and refuses updates itself "
                                "(FAILED_PRECONDITION) until that server stops (then it takes the log over); several servers that all take updates need the graph "
                                "and features in Redis", data.fingerprint[:12], path)
            if follow:
                update_log = FileUpdateLog(path, follow=True)
        data.live = LiveGraph(data, update_log, read_only=o.read_only, max_update_size=o.max_update_size,
                              metrics=self.metrics, version=data.base_version, ppr_tolerance=o.ppr_refresh_tolerance,
                              ppr_eager_lists=None if o.ppr_eager_lists < 0 else o.ppr_eager_lists,
                              log_fsync=o.update_log_fsync)
        # a graph taken out of service turns health NOT_SERVING (the server's update is thread-safe)
        data.live.on_out_of_service = self.on_change
        if redis_url or getattr(update_log, "follow", False):
            data.live.follow()
        return data.live

    def _live_dir(self) -> Path:
        """Where the embedded default keeps update logs and compacted snapshots (``--update-log-dir``)."""
        return Path(self.options.update_log_dir) if self.options.update_log_dir else self.repo / "_live"

    def _find_dataset(self, fingerprint: str, source: str | None, ckpt_path: Path) -> GraphDataset:
        return find_dataset(fingerprint, source, ckpt_path, self.data_paths, self.repo)

    def _remote_data_for(self, dataset_fp: str, graph_fp: str) -> DataBundle:
        """Graph, PPR lists and features from Redis (stateless replica); nothing from disk."""
        bundle = self._data.get(dataset_fp)
        if bundle is not None:
            return bundle
        from .features import is_redis_url, open_store
        from .graph_store import RedisGraphStore

        url = str(self.options.graph_url)
        graph = RedisGraphStore(url, graph_fp, self.options.graph_version,
                                expect_dataset_fingerprint=dataset_fp, cache_bytes=self.options.graph_cache_bytes)
        feature_url = self.feature_url if is_redis_url(self.feature_url) else url
        try:
            store = open_store(feature_url, fingerprint=graph_fp, expect_dataset_fingerprint=dataset_fp,
                               registry=self.metrics.registry, **self.feature_options)
        except BaseException:
            graph.close()
            raise
        if store.num_nodes != graph.num_nodes:
            store.close()
            graph.close()
            raise RepositoryError(f"features in Redis cover {store.num_nodes} nodes, the graph has {graph.num_nodes}")
        bundle = DataBundle(fingerprint=dataset_fp, graph=graph, features=store,
                            feature_store_name=getattr(store, "name", type(store).__name__))
        self._data[dataset_fp] = bundle
        return bundle

    def _data_for(self, fingerprint: str, source: str | None, ckpt_path: Path) -> DataBundle:
        bundle = self._data.get(fingerprint)
        if bundle is not None:
            return bundle
        from .features import is_redis_url, open_store

        if not is_redis_url(self.feature_url):  # the embedded default: a compacted live graph (serve.live)
            from .features.memory import MemoryFeatureStore
            from .live import load_snapshot

            snap = load_snapshot(self._live_dir() / f"{fingerprint}.snapshot", fingerprint)
            if snap is not None:
                graph, x, version = snap
                log.info("dataset %s: the snapshot of its live graph at version %d (%d nodes, %d edges)",
                         fingerprint[:12], version, graph.num_nodes, graph.num_edges)
                bundle = DataBundle(fingerprint=fingerprint, graph=graph,
                                    features=MemoryFeatureStore(x, registry=self.metrics.registry),
                                    feature_store_name="memory", base_version=version)
                self._data[fingerprint] = bundle
                return bundle
        ds = self._find_dataset(fingerprint, source, ckpt_path)

        # Redis: only a live version loaded from this very dataset (the newest such one unless
        # --feature-version names one); anything else is refused with the reason in the log
        store = open_store(self.feature_url, dataset=ds, expect_dataset_fingerprint=fingerprint,
                           registry=self.metrics.registry, **self.feature_options)
        bundle = DataBundle(
            fingerprint=fingerprint,
            graph=ds.graph,
            features=store,
            feature_store_name=getattr(store, "name", type(store).__name__),
        )
        self._data[fingerprint] = bundle
        return bundle

