"""Keep freed memory in the process: glibc ``mallopt`` settings for the serving and training loops.

Why. Every batch allocates arrays of a few to a few hundred MiB (block-diagonal CSRs, feature
rows, activations; hundreds of MiB for large batches of raw wide features) and frees them a moment
later. glibc serves blocks above its mmap threshold (128 KiB, adapting up to 32 MiB) with fresh
``mmap`` calls and returns them with ``munmap``, and gives the top of the heap back once more than
128 KiB is free; so the next batch touches brand new pages and pays a page fault for every 4 KiB.
On the 2-core VM this project is developed on, a first touch costs far more than on bare metal: in
``benchmarks/allocator.py`` allocating and touching 64 MiB had a median of 5.2 ms with the
defaults against 0.17 ms with these settings (docs/BENCHMARKS.md, "Allocator settings"; ad-hoc
runs saw single calls of 0.25 to 1.2 s with the defaults). Arrays below glibc's adaptive
threshold are already reused by default: the same benchmark's induced batch (1024 targets, arrays
of a few MiB) did not get faster. Keeping freed
memory for reuse is what jemalloc or tcmalloc do for PyTorch CPU inference; these settings get
the same effect from glibc itself:

* ``M_MMAP_THRESHOLD`` = 1 GiB: blocks below it come from the heap (reused), not from ``mmap``;
* ``M_TRIM_THRESHOLD`` = 2 GiB - 1: free memory at the top of the heap is not given back;
* ``M_TOP_PAD`` = 64 MiB: the heap grows in large steps;
* ``M_ARENA_MAX`` = 1: worker threads share the main arena, whose heap can grow to any size
  (a thread arena is limited to 64 MiB heaps and falls back to ``mmap`` above that).

The price: the resident set stays at the peak a process reached (it is not returned to the OS)
and threads contend on one arena lock (negligible next to the GIL on a few cores). Set
``GNNSERVE_MALLOC=default`` to keep glibc's behaviour. Elsewhere than glibc (musl, macOS) this
is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["tune_malloc"]

log = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

_SETTINGS = (
    ("M_MMAP_THRESHOLD", _M_MMAP_THRESHOLD, 1 << 30),
    ("M_TRIM_THRESHOLD", _M_TRIM_THRESHOLD, (1 << 31) - 1),
    ("M_TOP_PAD", _M_TOP_PAD, 64 << 20),
    ("M_ARENA_MAX", _M_ARENA_MAX, 1),
)

_done: bool | None = None


def tune_malloc() -> bool:
    """Apply the settings above once per process; ``True`` when glibc accepted all of them.

    Call it first thing in a process's ``main`` (before worker threads start, so they share the
    main arena). Later calls return the first call's answer.
    """
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("GNNSERVE_MALLOC", "").lower() in ("default", "0", "off", "no"):
        log.info("GNNSERVE_MALLOC=default: glibc malloc settings left alone")
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    refused = [label for label, param, value in _SETTINGS if mallopt(param, value) != 1]
    if refused:
        log.warning("glibc refused mallopt settings %s", refused)
    _done = not refused
    return _done
