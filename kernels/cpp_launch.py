"""The C++ launcher of the ES-SpMM kernel (``kernels/launcher.cpp``): built once per machine, used when ready.

A call of :func:`kernels.sampled_spmm` on a GPU spends most of its host time in Python around two things:
allocating the output and CuPy's binding of ``cuLaunchKernel`` (docs/BENCHMARKS.md, "host time per call").
``launcher.cpp`` does both in one C++ call per launch, with the parameters :mod:`kernels.spmm_cuda` prepared
once per graph and shape. It is compiled with :func:`torch.utils.cpp_extension.load` (a C++ compiler and
ninja, the ``ninja`` package: ``pip install gnnserve[gpu]``), into torch's extension cache, where a later
process finds it built.

``GNNSERVE_CPP_LAUNCH`` decides when:

* ``auto`` (the default): the first GPU launch starts the build in a background thread; launches take the
  Python path until it is ready, so a server's start and first requests do not wait for the compiler;
* ``sync``: the first GPU launch builds it and waits (benchmarks, tests);
* ``off`` (or ``0``): never; every launch takes the Python path.

A build that fails (no compiler, no ninja) is logged once with its reason and not tried again in the process;
the Python path serves, as it does for any launch the C++ side declines (:class:`Launch` returns ``None`` on
a machine without a CUDA driver, or in a thread whose current CUDA context is not the kernel's).
"""

from __future__ import annotations

import logging
import os
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


def mode() -> str:
    """The build policy from ``GNNSERVE_CPP_LAUNCH`` (read on every call: tests and benchmarks switch it)."""
    m = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if m in _OFF:
        return "off"
    if m not in MODES:
        raise ValueError(f"{MODE_ENV} must be one of {MODES}, got {m!r}")
    return m


_lock = threading.Lock()
_module: Any = None
_error: str | None = None
_thread: threading.Thread | None = None
#: seconds the build took in this process (compile, or finding it in torch's extension cache)
build_seconds: float | None = None


def build() -> Any:
    """Compile (or find compiled) and import the launcher; raises what the build raises."""
    from torch.utils import cpp_extension

    try:  # the ninja package's binary, where the environment's bin directory is not on PATH
        import ninja

        bin_dir = getattr(ninja, "BIN_DIR", None)
        if bin_dir and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass  # torch's own check says what is missing
    return cpp_extension.load(name=NAME, sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=False)


def _build_once() -> None:
    global _module, _error, build_seconds
    t0 = time.perf_counter()
    try:
        mod = build()
    except Exception as exc:  # no compiler, no ninja, a failed compile: the Python path serves
        _error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
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
        thread.join()
    return _module


def wait(timeout: float | None = None) -> Any | None:
    """Start the build if needed and wait for it (at most ``timeout`` seconds): the module or ``None``."""
    if mode() == "off":
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
