"""The C++ launcher of the ES-SpMM kernel (``kernels/launcher.cpp``): built once per machine, used when ready.

A call of :func:`kernels.sampled_spmm` on a GPU spends most of its host time in Python around two things:
allocating the output and CuPy's binding of ``cuLaunchKernel`` (docs/BENCHMARKS.md, "host time per call").
``launcher.cpp`` does both in one C++ call per launch, with the parameters :mod:`kernels.spmm_cuda` prepared
once per graph and shape. It is compiled with :func:`torch.utils.cpp_extension.load` (a C++ compiler and
ninja, the ``ninja`` package: ``pip install gnnserve[gpu]``) into torch's extension cache, where a later
process finds it built.

The compiler runs in a child process of its own session (:func:`build_in_child`), never in a thread of the
caller: torch's build holds a lock file that only its own ``finally`` removes, so a build thread dropped by
an exiting process (a short script, a server stopped while starting, a step killed by ``timeout``) would
leave the lock behind and every later build would wait for it forever. The child finishes its build however
the caller ends; a lock older than :data:`STALE_LOCK_S` is taken for one left by a killed build and removed.
The caller then imports the built library itself.

``GNNSERVE_CPP_LAUNCH`` decides when (read until the launcher is loaded; after that
``kernels.spmm_cuda.CPP_LAUNCH = False`` turns it off):

* ``auto`` (the default; also ``1``, ``on``, ``true``, ``yes``): the first GPU launch after the probe starts
  the build in the background; launches take the Python path until it is ready, so a server's start and
  first requests do not wait for the compiler;
* ``sync``: that launch waits for the build (at most :data:`BUILD_TIMEOUT_S`);
* ``off`` (``0``, ``false``, ``no``): never; every launch takes the Python path.

Any other value is taken as ``auto``, with one warning. A build that fails (no compiler, no ninja) is logged
once with the compiler's error lines and not tried again in the process; the Python path serves, as it does
for any launch the C++ side declines (:class:`Launch` returns ``None`` on a machine without a CUDA driver, or
in a thread whose current CUDA context is not the kernel's).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("launcher.cpp")
NAME = "gnnserve_es_spmm_launch"
MODE_ENV = "GNNSERVE_CPP_LAUNCH"
MODES = ("auto", "sync", "off")
_OFF = ("off", "0", "false", "no")
_AUTO = ("auto", "1", "on", "true", "yes", "")
#: seconds a build may take (the child is killed after that; the Python path serves)
BUILD_TIMEOUT_S = 900.0
#: a build lock older than this is one a killed build left behind
STALE_LOCK_S = 600.0

_lock = threading.Lock()
_module: Any = None
_error: str | None = None
_thread: threading.Thread | None = None
_warned_modes: set[str] = set()
#: seconds the build took in this process (compile in the child, or finding it built, and the import)
build_seconds: float | None = None


def mode() -> str:
    """The build policy from ``GNNSERVE_CPP_LAUNCH`` (read on every call until the launcher is loaded)."""
    m = os.environ.get(MODE_ENV, "auto").strip().lower()
    if m in _OFF:
        return "off"
    if m == "sync":
        return "sync"
    if m not in _AUTO and m not in _warned_modes:
        _warned_modes.add(m)
        log.warning("%s=%r is not one of %s: taken as auto", MODE_ENV, m, MODES)
    return "auto"


def _ninja_dirs() -> list[str]:
    """Where the ``ninja`` package keeps its binary: its ``BIN_DIR``, and the ``bin`` beside the package
    (``pip install --target DIR`` puts it in ``DIR/bin``, which ``BIN_DIR`` does not look at)."""
    try:
        import ninja
    except ImportError:
        return []
    dirs = [getattr(ninja, "BIN_DIR", "") or "", str(Path(ninja.__file__).resolve().parents[1] / "bin"),
            str(Path(ninja.__file__).resolve().parent / "data" / "bin")]
    return [d for d in dirs if d and Path(d, "ninja").exists()]


def build() -> Any:
    """Compile (or find compiled) and import the launcher in this process; raises what the build raises.
    What the child of :func:`build_in_child` runs; a test or a script may call it directly."""
    from torch.utils import cpp_extension

    path = os.environ.get("PATH", "").split(os.pathsep)
    extra = [d for d in _ninja_dirs() if d not in path]
    if extra:  # this process only: the child, or a script that asked for it
        os.environ["PATH"] = os.pathsep.join([*extra, *path])
    lock = Path(cpp_extension._get_build_directory(NAME, verbose=False)) / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            log.warning("removing %s, left %.0f s ago by a build that did not finish", lock,
                        time.time() - lock.stat().st_mtime)
            lock.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    return cpp_extension.load(name=NAME, sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=False)


_CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gnnserve_cpp_launch_build", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
print("BUILT", m.build().__file__)
"""


def build_in_child(timeout: float = BUILD_TIMEOUT_S) -> Any:
    """Build in a child process of its own session (it finishes whatever happens to this one), then import
    the library it built; raises ``RuntimeError`` with the compiler's error lines when it fails."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).resolve())], capture_output=True,
                          text=True, timeout=timeout, start_new_session=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BUILT ")]
    if proc.returncode != 0 or not lines:
        text = (proc.stderr or proc.stdout or "").strip().splitlines()
        errors = [ln.strip() for ln in text if "error" in ln.lower()] or text[-3:]
        raise RuntimeError("; ".join(errors[:6]) or f"exit status {proc.returncode}")
    path = lines[-1][len("BUILT "):]
    import torch  # noqa: F401  (the library links against torch's, loaded first)

    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import the built launcher at {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _build_once() -> None:
    global _module, _error, build_seconds
    t0 = time.perf_counter()
    try:
        mod = build_in_child()
    except Exception as exc:  # no compiler, no ninja, a failed compile, a timeout: the Python path serves
        _error = f"{type(exc).__name__}: {exc}"
        log.warning("ES-SpMM: the C++ launcher (%s) did not build (%s); launches stay on the Python path "
                    "(the same answers, more host time per call)", SOURCE.name, _error)
        return
    build_seconds = time.perf_counter() - t0
    log.info("ES-SpMM: C++ launcher ready in %.1f s", build_seconds)
    _module = mod


def module() -> Any | None:
    """The built launcher module, or ``None`` (not built yet under ``auto``, switched off, or failed)."""
    if _module is not None:
        return _module
    if _error is not None:
        return None
    m = mode()
    if m == "off":
        return None
    global _thread
    with _lock:
        if _module is None and _error is None and _thread is None:
            _thread = threading.Thread(target=_build_once, name="gnnserve-cpp-launch-build", daemon=True)
            _thread.start()
        thread = _thread
    if m == "sync" and thread is not None:
        thread.join(BUILD_TIMEOUT_S)
    return _module


def wait(timeout: float | None = None) -> Any | None:
    """Start the build if needed and wait for it (at most ``timeout`` seconds): the module or ``None``."""
    if _module is None and mode() == "off":
        return None
    module()
    thread = _thread
    if thread is not None:
        thread.join(timeout)
    return _module


def status() -> tuple[bool, str]:
    """``(ready, why)`` for messages and benchmarks."""
    if _module is not None:
        return True, f"built ({build_seconds:.1f} s in this process)" if build_seconds is not None else "built"
    if _error is not None:
        return False, f"build failed: {_error}"
    if mode() == "off":
        return False, f"off ({MODE_ENV})"
    return False, "building" if _thread is not None else "not started"
