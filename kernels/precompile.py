"""A cold start's numba compilations, run in parallel processes before the server loads its models.

The CPU kernels are numba functions cached on disk (``cache=True``). On a machine whose cache lacks them (a
fresh install, a new version of the kernels, an image built elsewhere) a server compiled them one after
another while loading its models: about a minute on the 2-vCPU VM for a GCN and a shaDow-GCN
(docs/BENCHMARKS.md, "A first start on a machine"), all on one core, because numba's compiler lock is
process-wide and compiling holds the interpreter.

This module compiles them in several processes at once, before anything else needs them. Each process
compiles its share of the signatures with ``Dispatcher.compile``, which saves them to the disk cache. The
server's own warm-up then loads them from the cache.

Which signatures: lines of ``module``, ``qualname`` and the argument types (their ``repr``, as numba's
cache index keys them), from three places:

- the list shipped with the package (:data:`SHIPPED`, ``kernels/precompile.tsv``): what servers on the
  repositories of the tests and benchmarks compiled (plain and shaDow models on in-memory and on
  memory-mapped, read-only datasets; the narrow kernel of 7 classes);
- what this machine's servers compiled before (:func:`local_path`, beside numba's cache). Every compilation a
  server makes is added there (:func:`note`, from :mod:`kernels.compile_log`): after a new version of the
  kernels invalidates the cache, the next start compiles what this deployment used, in parallel;
- the narrow serial kernel of each class or hidden count of the repository's models (:func:`with_widths`).

Several processes writing numba's cache at once need :func:`lock_cache_writes` (numba's own writes race).

A signature numba cannot read back (a literal, a type whose ``repr`` is not its constructor) or a function
that no longer exists is skipped; whatever the list misses, the server compiles itself as before. Nothing here
can change an answer: a compiled signature is the code numba would have compiled on first use.

``gnnserve precompile`` runs it from the command line (an image's build, a machine's set-up); a server does
it at start when the signatures it knows of are not cached (``--precompile-jobs``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SHIPPED", "Entry", "abort", "at_start", "dispatcher", "known", "local_path", "lock_cache_writes", "main", "missing",
           "note", "parse", "read", "run", "start_jobs", "with_widths"]

log = logging.getLogger(__name__)

#: the signatures shipped with the package (one ``module<TAB>qualname<TAB>signature<TAB>seconds`` per line)
SHIPPED = Path(__file__).with_name("precompile.tsv")
#: the file beside numba's cache that lists what this machine compiled
LOCAL_NAME = "gnnserve-compiled.tsv"
#: beside it: the signatures a precompiling process failed to compile (not tried again by later starts)
FAILED_NAME = "gnnserve-precompile-failed.tsv"
#: a start precompiles only when the missing signatures took at least this long to compile where they were
#: recorded: a child process costs a second or two to start
MIN_SECONDS = 5.0
_SERIAL = re.compile(r"serial_kernel_f(\d+)$")


@dataclass(frozen=True)
class Entry:
    """One compiled signature: the function (``module``, ``qualname``) and its argument types' ``repr``;
    ``seconds``: how long it took where it was recorded (to share the work out)."""

    module: str
    qualname: str
    signature: str
    seconds: float = 1.0

    @property
    def key(self) -> tuple[str, str, str]:
        return self.module, self.qualname, self.signature

    def line(self) -> str:
        return f"{self.module}\t{self.qualname}\t{self.signature}\t{self.seconds:.2f}\n"


def read(path: str | Path) -> list[Entry]:
    """The entries of a list file (a missing or unreadable file is empty; malformed lines are skipped). A
    signature listed twice keeps its last time."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return []
    out: dict[tuple[str, str, str], Entry] = {}
    for ln in text.splitlines():
        parts = ln.rstrip("\n").split("\t")
        if len(parts) != 4 or not parts[0].startswith("kernels."):
            continue
        try:
            e = Entry(parts[0], parts[1], parts[2], float(parts[3]))
        except ValueError:
            continue
        out[e.key] = e
    return list(out.values())


def known() -> list[Entry]:
    """The shipped entries and this machine's (:func:`local_path`), each signature once."""
    merged = {e.key: e for e in read(SHIPPED)}
    local = local_path()
    if local is not None:
        merged.update((e.key, e) for e in read(local))
        stamps: dict[str, str] = {}
        for e in read(local.with_name(FAILED_NAME)):
            stamp = stamps.setdefault(e.module, _stamp(e.module))
            if f"{e.seconds:.2f}" == stamp:  # failed with this version of its module's source
                merged.pop(e.key, None)
    return list(merged.values())


def _stamp(module: str) -> str:
    """A module's source file as numba stamps it (modification time and size), in the failed list's time
    column: a failure counts only for the source it happened with."""
    try:
        import importlib.util

        spec = importlib.util.find_spec(module)
        st = os.stat(spec.origin)  # type: ignore[union-attr, arg-type]
        return f"{float(int(st.st_mtime) + st.st_size):.2f}"  # one number: the list's fourth column is a float
    except Exception:
        return "-1.00"


def _append(name: str, entries: list[Entry]) -> None:
    """Add ``entries`` to the list ``name`` beside :func:`local_path` (short lines, appended under a lock:
    they do not interleave). Raises ``OSError`` where it cannot be written."""
    local = local_path()
    if local is None or not entries:
        return
    with _note_lock:
        local.parent.mkdir(parents=True, exist_ok=True)
        with open(local.with_name(name), "a", encoding="utf-8") as f:
            f.writelines(e.line() for e in entries)


def _remember_failed(entries: list[Entry]) -> None:
    try:
        _append(FAILED_NAME, [Entry(e.module, e.qualname, e.signature, float(_stamp(e.module))) for e in entries])
    except (OSError, ValueError):
        pass


def local_path() -> Path | None:
    """``gnnserve-compiled.tsv`` in numba's cache directory for this package's kernels (``NUMBA_CACHE_DIR``'s
    directory for them, else ``kernels/__pycache__`` or numba's per-user cache where the package cannot be
    written); None where numba does not say."""
    try:
        from .subgraph import _grow

        return Path(_grow._cache._cache_path) / LOCAL_NAME
    except Exception:  # numba's cache internals moved: nothing is recorded, the shipped list still serves
        return None


_note_lock = threading.Lock()


def note(fn: Any, args: Any, seconds: float) -> None:
    """Add a signature a process just compiled to :func:`local_path` (a kernel of this package's own files only; a
    signature that :func:`parse` cannot read back is left out). Never raises."""
    try:
        module, qualname = fn.__module__, fn.__qualname__
        if not module.startswith("kernels.") or "<locals>" in qualname:
            return
        source = getattr(sys.modules.get(module), "__file__", None)
        if source is None or Path(source).resolve().parent != SHIPPED.resolve().parent:
            return  # a copy imported under the package's name from elsewhere (benchmarks.at_revision's old kernels)
        signature = repr(tuple(args))
        parse(signature)
        _append(LOCAL_NAME, [Entry(module, qualname, signature, seconds)])
    except Exception as exc:
        log.debug("not recording a compiled signature: %s", exc)


@functools.cache
def _namespace() -> dict[str, Any]:
    from numba.core import types

    ns = {n: getattr(types, n) for n in dir(types) if not n.startswith("_")}
    ns.update(bool=types.boolean, none=types.none)
    return ns


def parse(signature: str) -> tuple[Any, ...]:
    """The argument types of a signature's ``repr`` (``ValueError`` for one numba cannot read back: a literal,
    a type whose ``repr`` is not its constructor)."""
    try:
        # numba's type names only, no builtins; the lists come from the package and from numba's cache directory,
        # whose writers can already place compiled code there
        value = eval(signature, {"__builtins__": {}}, _namespace())
    except Exception as exc:
        raise ValueError(f"not a signature numba can read back: {signature!r} ({exc})") from None
    if not isinstance(value, tuple):
        raise ValueError(f"not a tuple of argument types: {signature!r}")
    from numba.core import types

    if not all(isinstance(t, types.Type) for t in value) or any(isinstance(t, types.Literal) for t in value):
        raise ValueError(f"not a tuple of (non-literal) numba types: {signature!r}")
    return value


def dispatcher(entry: Entry) -> Any:
    """The numba function of an entry (``LookupError`` when the package no longer has it)."""
    import importlib

    import numba

    mod = importlib.import_module(entry.module)
    narrow = _SERIAL.match(entry.qualname)
    if entry.module == "kernels.spmm_cpu" and narrow is not None:
        obj: Any = mod.serial_kernel(int(narrow.group(1)))
    else:
        obj = mod
        for part in entry.qualname.split("."):
            obj = getattr(obj, part, None)
    if not isinstance(obj, numba.core.dispatcher.Dispatcher):
        raise LookupError(f"{entry.module}.{entry.qualname} is not a numba function of this version")
    return obj


def _cached(disp: Any, sig: tuple[Any, ...]) -> bool:
    cache = disp._cache
    key = cache._index_key(sig, disp.targetctx.codegen())
    return key in cache._cache_file._load_index()


def missing(entries: Iterable[Entry]) -> list[Entry]:
    """The entries whose signature numba's disk cache lacks for this machine, skipping those of functions the
    package no longer has or signatures it cannot read back."""
    out = []
    for e in entries:
        try:
            disp = dispatcher(e)
            sig = parse(e.signature)
            arity = disp.py_func.__code__.co_argcount
            if len(sig) != arity:  # recorded for an earlier version of the kernel: it can never compile now
                raise ValueError(f"{len(sig)} argument types for a kernel of {arity} arguments")
        except Exception as exc:  # ImportError, LookupError, ValueError
            log.debug("precompile: skipping %s.%s %s: %s", e.module, e.qualname, e.signature[:60], exc)
            continue
        try:
            if _cached(disp, sig):
                continue
        except Exception:  # numba's cache internals moved: take it as missing (compiling it again is harmless)
            pass
        out.append(e)
    return out


def _share(entries: list[Entry], jobs: int) -> list[list[Entry]]:
    """The entries in ``jobs`` lists of about equal recorded time. A module's entries stay together: they share
    callees (the compiled forwards all call ``_layers``), which a second process would compile again."""
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.module, []).append(e)
    bins: list[list[Entry]] = [[] for _ in range(max(1, jobs))]
    load = [0.0] * len(bins)
    for g in sorted(groups.values(), key=lambda g: -sum(e.seconds for e in g)):
        i = load.index(min(load))
        bins[i].extend(sorted(g, key=lambda e: -e.seconds))
        load[i] += sum(e.seconds for e in g)
    return [b for b in bins if b]


_children: set[subprocess.Popen] = set()  # the precompiling processes running now (abort() ends them)
_aborted = threading.Event()
_at_exit = False


def abort() -> None:
    """End every precompiling process now (a server told to stop while it waits for them; at exit). A
    :func:`run` in progress returns with their signatures failed; later runs start processes again."""
    _aborted.set()
    with _note_lock:
        procs = list(_children)
    for p in procs:
        with contextlib.suppress(OSError):
            p.kill()


@dataclass
class Result:
    """What :func:`run` did: signatures compiled, those that failed (with why), processes, seconds."""

    compiled: int
    failed: list[tuple[Entry, str]]
    processes: int
    seconds: float


def run(entries: list[Entry], jobs: int, timeout_s: float = 1800.0) -> Result:
    """Compile ``entries`` in ``jobs`` child processes (each runs :func:`_child` on its share), each saving
    to numba's disk cache; returns once all have ended. A child that fails or times out is logged, never
    raised: the server compiles what is left on first use, as it would have anyway."""
    global _at_exit
    t0 = time.perf_counter()
    _aborted.clear()
    if not _at_exit:  # children never outlive an interpreter that exits while they compile
        atexit.register(abort)
        _at_exit = True
    shares = _share(entries, jobs)
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # a child only compiles: no thread pools to start
    # this package's directory first on the path (``python -m`` would put the working directory first, where
    # another checkout's ``kernels`` may be); the child checks that it imported this one
    code = (f"import sys; sys.path.insert(0, {root!r}); from kernels.precompile import _child; "
            f"sys.exit(_child({root!r}))")
    procs = []
    for share in shares:
        if _aborted.is_set():
            break
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
        with _note_lock:
            _children.add(p)
        procs.append((p, share))
    outputs: list[tuple[str, str]] = []
    threads = []
    for p, share in procs:  # each child's pipes on a thread of their own: none blocks on a full pipe
        # a share's time limit: its recorded seconds several times over, and a minute to start
        limit = min(timeout_s, 60.0 + 4.0 * sum(e.seconds for e in share))

        def talk(p: subprocess.Popen, share: list[Entry], limit: float) -> None:
            try:
                outputs.append(p.communicate(json.dumps([e.key for e in share]), timeout=limit))
            except subprocess.TimeoutExpired:
                log.warning("precompile: a process took more than %.0f s; stopped (its kernels compile on first "
                            "use instead)", limit)
                p.kill()
                outputs.append(p.communicate())
            except (OSError, ValueError):  # killed by abort() meanwhile
                outputs.append(("", ""))
            finally:
                with _note_lock:
                    _children.discard(p)
        th = threading.Thread(target=talk, args=(p, share, limit), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    done: dict[tuple[str, str, str], str | None] = {}
    rejected: set[tuple[str, str, str]] = set()  # numba refused the signature (typing or lowering)
    for out, err in outputs:
        for ln in (out or "").splitlines():
            try:
                r = json.loads(ln)
                key = tuple(r["key"])
            except (ValueError, TypeError, KeyError):
                continue
            done[key] = r.get("error")
            if r.get("rejected"):
                rejected.add(key)
        if err and "Traceback" in err:
            log.warning("precompile: a child process failed: %s", err.strip().splitlines()[-1])
    failed = [(e, done.get(e.key) or "the process ended before it") for e in entries
              if e.key not in done or done[e.key] is not None]
    # never tried again for this version of their module: what numba refused, and what compiled but is still
    # not in the cache (numba did not save it), which would otherwise start these processes at every start
    unsaved = missing([e for e in entries if e.key in done and done[e.key] is None])
    _remember_failed([e for e, _ in failed if e.key in rejected] + unsaved)
    return Result(len(entries) - len(failed), failed, len(procs), time.perf_counter() - t0)


def start_jobs(jobs: int | None) -> int:
    """The processes a start uses when ``jobs`` is None: the cores this process may run on, at most 8."""
    if jobs is not None:
        return jobs
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:  # a container's CPU quota (cgroup v2 ``cpu.max``: "quota period", or "max")
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, min(cores, 8))


def with_widths(entries: list[Entry], widths: Iterable[int]) -> list[Entry]:
    """``entries`` and the serial CPU kernel of each narrow row width in ``widths`` (a model's class or hidden
    count under ``spmm_cpu.NARROW_FEATURES``: ``spmm_cpu.serial_kernel`` compiles one per width, with the
    argument types of the others), taken from a listed width's entries."""
    from .spmm_cpu import NARROW_FEATURES

    listed = [e for e in entries if e.module == "kernels.spmm_cpu" and _SERIAL.match(e.qualname)]
    have = {e.key for e in entries}
    out = list(entries)
    for w in sorted({int(w) for w in widths if 0 < int(w) < NARROW_FEATURES}):
        for e in listed:
            clone = Entry(e.module, f"serial_kernel_f{w}", e.signature, e.seconds)
            if clone.key not in have:
                have.add(clone.key)
                out.append(clone)
    return out


def at_start(jobs: int | None, widths: Iterable[int] = (), announce: Any = None) -> Result | None:
    """What a server runs before loading its models: the known signatures (and the narrow kernels of
    ``widths``, :func:`with_widths`) the cache lacks, in :func:`start_jobs` processes, when there are at least
    two cores to spread them over and they took at least :data:`MIN_SECONDS` where recorded. Logs what it does;
    never raises. ``announce(count, recorded_seconds, processes)``, when given, is called before compiling (a
    console's line: the wait that follows is a first run's, tens of seconds)."""
    try:
        n = start_jobs(jobs)
        if n < 2 or not lock_cache_writes():  # parallel writers of numba's cache need the lock
            return None
        todo = missing(with_widths(known(), widths))
        recorded = sum(e.seconds for e in todo)
        if not todo or recorded < MIN_SECONDS:
            return None
        procs = min(n, len({e.module for e in todo}))
        log.info("numba's cache lacks %d kernel signatures (%.0f s of compilation where recorded): compiling them "
                 "in %d processes before the models load (--precompile-jobs)", len(todo), recorded, procs)
        if announce is not None:
            announce(len(todo), recorded, procs)
        res = run(todo, n)
        log.info("precompiled %d kernel signatures in %.1f s in %d processes%s", res.compiled, res.seconds,
                 res.processes, f"; {len(res.failed)} failed (compiled on first use instead)" if res.failed else "")
        for e, why in res.failed[:5]:
            first = why.strip().splitlines()[0] if why.strip() else why
            if why.startswith("TypingError"):  # a signature recorded before the kernel's arguments changed
                log.info("precompile: a recorded signature of %s.%s no longer fits the kernel (it changed since it "
                         "was recorded); skipped and not tried again: %s", e.module, e.qualname, first)
            else:
                log.warning("precompile: %s.%s failed: %s", e.module, e.qualname, first)
        return res
    except Exception:
        log.exception("precompiling the kernels failed; they compile on first use instead")
        return None


_locked = False


def lock_cache_writes() -> bool:
    """Make this process's writes to numba's disk cache take a lock per function (``fcntl.flock`` on a file
    beside the function's index, for at most a minute). numba (0.68) reads a function's index, picks the
    first free data file name and writes both without a lock: two processes saving two signatures of one
    function at once can each pick the same name, and the index can then name, for one signature, the other's
    compiled code. The precompiling processes and every process that installs :mod:`kernels.compile_log` (the
    servers, the demo) take the lock; numba's own save runs inside it, unchanged. Where the lock cannot be
    taken (a file system without ``flock``, a lock file it may not open, a minute passed) that save runs
    without it, as it always did. False where ``fcntl`` is missing (then no process of this package compiles
    in parallel)."""
    global _locked
    with _note_lock:
        if _locked:
            return True
        try:
            import fcntl

            from numba.core.caching import IndexDataCacheFile
        except ImportError:
            return False
        unlocked = IndexDataCacheFile.save

        def save(self: Any, key: Any, data: Any) -> None:
            try:
                fd = os.open(self._index_path + ".lock", os.O_RDONLY | os.O_CREAT, 0o666)
            except (OSError, AttributeError):
                return unlocked(self, key, data)
            try:
                deadline = time.monotonic() + 60.0
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            return unlocked(self, key, data)
                        time.sleep(0.01)
                    except OSError:  # no flock on this file system
                        return unlocked(self, key, data)
                return unlocked(self, key, data)  # the lock goes with the descriptor
            finally:
                os.close(fd)

        IndexDataCacheFile.save = save
        _locked = True
        return True


def _child(root: str) -> int:
    """Compile the entries read from stdin (a JSON list of keys), one JSON line per entry on stdout; ``root``:
    the directory the parent's package is in (a child that imported another one compiles nothing)."""
    from numba.core.errors import NumbaError

    here = str(Path(__file__).resolve().parent.parent)
    if here != root:
        print(f"precompile: imported kernels from {here}, not {root}", file=sys.stderr)
        return 2
    if not lock_cache_writes():
        return 2
    keys = json.loads(sys.stdin.read() or "[]")
    for key in keys:
        e = Entry(*key)
        t0 = time.perf_counter()
        try:
            dispatcher(e).compile(parse(e.signature))
            r = {"key": key, "error": None, "seconds": time.perf_counter() - t0}
        except Exception as exc:  # NumbaError: numba refused the types (not a passing failure: not tried again)
            r = {"key": key, "error": f"{type(exc).__name__}: {exc}"[:500], "seconds": time.perf_counter() - t0,
                 "rejected": isinstance(exc, NumbaError)}
        print(json.dumps(r), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``gnnserve precompile``: compile the known signatures numba's cache lacks, in parallel, and say what
    was done (an image's build step, a machine's set-up, before timing anything)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="gnnserve precompile",
        description="Compile the CPU kernels (numba functions cached on disk) that numba's cache lacks, in parallel "
                    "processes, so that a server's first start on a machine or image does not compile them one "
                    "after another while it loads its models (about a minute on 2 vCPUs). Run it in an image's "
                    "build or a machine's set-up; 'gnnserve serve --precompile-jobs' does the same at start.",
        epilog="The signatures compiled: the list shipped with the package (kernels/precompile.tsv), what this "
               "machine's servers compiled before, and with --repo the narrow kernels of its models.")
    ap.add_argument("--jobs", type=int, default=None,
                    help="compiling processes (default: the cores, at most 8)")
    ap.add_argument("--repo", default=None, help="a model repository: the narrow kernels of its models' class and "
                                                  "hidden counts too (as a server on it compiles them)")
    ap.add_argument("--list", action="store_true", help="only list the known signatures and whether each is cached")
    args = ap.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        print("gnnserve precompile: --jobs must be >= 1", file=sys.stderr)
        return 2
    if args.repo is not None and not Path(args.repo).is_dir():
        why = "is not a directory" if Path(args.repo).exists() else "does not exist"
        print(f"gnnserve precompile: model repository {args.repo!r} {why} (--repo: a directory of "
              "<name>/<version>/ checkpoints, as 'gnnserve serve --repo' takes)", file=sys.stderr)
        return 2
    widths: set[int] = set()
    if args.repo is not None:
        from serve.registry import model_widths

        widths = model_widths(args.repo)
    entries = with_widths(known(), widths)
    todo = missing(entries)
    if args.list:
        lacking = {e.key for e in todo}
        for e in sorted(entries, key=lambda e: e.key):
            print(f"{'missing' if e.key in lacking else 'cached '}  {e.module}.{e.qualname}  {e.seconds:6.1f} s  "
                  f"{e.signature[:100]}")
        return 0
    if not todo:
        print(f"all {len(entries)} known kernel signatures are in numba's cache ({local_path()})")
        return 0
    jobs = start_jobs(args.jobs) if lock_cache_writes() else 1  # parallel writers of the cache need the lock
    print(f"compiling {len(todo)} kernel signatures ({sum(e.seconds for e in todo):.0f} s where recorded) in "
          f"{min(jobs, len({e.module for e in todo}))} processes ...", flush=True)
    res = run(todo, jobs)
    print(f"compiled {res.compiled} in {res.seconds:.1f} s; cache: {local_path()}")
    for e, why in res.failed:
        print(f"failed: {e.module}.{e.qualname} {e.signature[:80]}: {why}", file=sys.stderr)
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
