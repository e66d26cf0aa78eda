"""Say when numba compiles, and how long it took.

The CPU kernels are numba functions cached on disk (``cache=True``): every start after the first on a
machine loads them in a few seconds, but the first one compiles them before its models are ready. On the
2-vCPU VM (2026-11-27) a server for a GCN and a shaDow-GCN took 90 s to be ready on an empty cache, 86 s of
it in 19 compilations (``kernels.fused_forward._shadow`` 23 s, ``_inner`` 20 s), against 4-5 s on a warm
cache; without this module the log said nothing for 57 s of that minute and a half. Training
(``gnnserve train``, ``python -m models.train``) installs it too: a first training run on a 2-core machine took
2m40s against 9 s for the next one, with no line saying why (a new-user report).

:func:`install` registers a listener on numba's ``numba:compile`` event, which numba raises only when it
compiles (a signature found in the disk cache raises nothing): each outermost compilation is logged when
it starts and ends (a compilation that raised is said to have failed), the first with a line saying why,
and :func:`compiled` counts the ones that succeeded. Each one is also added to the machine's list of compiled
signatures (:func:`kernels.precompile.note`), which the next start on a cold cache compiles in parallel.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["compiled", "install"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_installed = False
_count = 0
_seconds = 0.0
_said = False


def _name(event: Any) -> str:
    data = event.data or {}
    fn = getattr(data.get("dispatcher"), "py_func", None)
    if fn is None:
        return "a function"
    return f"{fn.__module__}.{fn.__qualname__}"


def _cache_dir() -> str:
    import numba

    return numba.config.CACHE_DIR or "__pycache__ beside each kernel module"


def _make_listener() -> Any:
    from numba.core import event as numba_event

    class _CompileLog(numba_event.Listener):
        """Logs the outermost compilation of each thread (a kernel's callees compile inside it)."""

        def __init__(self) -> None:
            self._local = threading.local()

        def on_start(self, event: Any) -> None:
            global _said
            depth = max(0, getattr(self._local, "depth", 0))
            self._local.depth = depth + 1
            if depth:
                return
            self._local.t0 = time.perf_counter()
            with _lock:
                first, _said = not _said, True
            if first:
                log.info("numba is compiling CPU kernels: signatures not in its disk cache (%s), as on the first "
                         "start or training run on a machine; each takes seconds, and later runs load them from the "
                         "cache", _cache_dir())
            log.info("numba: compiling %s ...", _name(event))

        def on_end(self, event: Any) -> None:
            global _count, _seconds
            # never below 0: an end without its start (another listener's on_start raised, or this one was
            # registered while the thread was inside a compilation) must not silence the thread for good
            depth = max(0, getattr(self._local, "depth", 0) - 1)
            self._local.depth = depth
            t0 = getattr(self._local, "t0", None)
            if depth or t0 is None:
                return
            self._local.t0 = None
            took = time.perf_counter() - t0
            # numba's Event.is_failed reads the wrong way round in 0.68 (True when no exception): read the field
            if getattr(event, "_exc_details", None) is not None:
                log.info("numba: compiling %s failed after %.1f s (numba may retry it)", _name(event), took)
                return
            with _lock:
                _count += 1
                _seconds += took
            log.info("numba: compiled %s in %.1f s", _name(event), took)
            data = event.data or {}
            fn = getattr(data.get("dispatcher"), "py_func", None)
            if fn is not None and data.get("args") is not None:  # what the next cold start precompiles
                from .precompile import note

                note(fn, data["args"], took)

    return _CompileLog()


def install() -> bool:
    """Register the listener (once per process). False where numba's event API is missing (then nothing is
    logged, and :func:`compiled` stays at zero)."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from numba.core import event as numba_event

            numba_event.register("numba:compile", _make_listener())
            from .precompile import lock_cache_writes

            lock_cache_writes()  # beside the precompiling processes, or --processes siblings on a cold cache
        except (ImportError, AttributeError) as exc:  # numba's event API is marked experimental
            log.debug("numba compilations are not logged: %s", exc)
            return False
        _installed = True
        return True


def compiled() -> tuple[int, float]:
    """``(compilations, seconds)`` logged so far in this process (outermost compilations only)."""
    with _lock:
        return _count, _seconds
