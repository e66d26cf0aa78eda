"""Thread pools the serving process does not leave to their defaults.

numba's thread count, without numba's side effect on torch's:

numba starts its OpenMP worker pool on the first ``numba.get_num_threads()`` (or the first parallel
kernel) of a process, and that start sets the calling thread's OpenMP thread count to numba's own
(``NUMBA_NUM_THREADS``, by default every core). torch reads the same count: in a process started with
``OMP_NUM_THREADS=1`` and no ``NUMBA_NUM_THREADS``, the thread that started the pool ran torch on every
core from then on (found 2026-11-26: ``torch.get_num_threads()`` 1 before, 2 after, on the 2-core VM).
:func:`numba_threads` is the one place the package asks numba, and puts torch's count back.
"""

from __future__ import annotations

import logging
import os

import numba
import torch

__all__ = ["numba_threads", "serving_blas_threads"]

log = logging.getLogger(__name__)

#: the variable that names the OpenBLAS thread count; set, it is the user's choice and is left as it is
OPENBLAS_VAR = "OPENBLAS_NUM_THREADS"


def numba_threads() -> int:
    """``numba.get_num_threads()`` on the calling thread, with torch's thread count as it was before."""
    before = torch.get_num_threads()
    n = numba.get_num_threads()
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
    return n


def serving_blas_threads(threads: int | None = None) -> list[tuple[str, int]]:
    """Give the process's OpenBLAS libraries ``threads`` threads each (default: torch's thread count, the
    process's compute threads), unless ``OPENBLAS_NUM_THREADS`` is set; returns ``(library, threads
    before)`` for each one changed.

    The compiled CPU forwards (:mod:`kernels.fused_forward`) run their dense products through numba's
    ``np.dot``, which calls SciPy's OpenBLAS, and OpenBLAS sizes its pool by the cores it sees, not by the
    compute threads the process was given (``gnnserve serve --processes N`` gives each process
    ``cores // N`` through ``OMP_NUM_THREADS`` and the like, which OpenBLAS does not read), and lets its
    threads spin between calls. On the 2-core VM (2026-11-26, ``benchmarks/ceiling.py``, shaDow-GCN,
    64-node requests) ``--processes 2`` served 0.55x of one process that way: two pools of two spinning
    threads on two cores; with one BLAS thread per process, 1.6x. torch's own pools are not touched. The
    setting is process-wide: a program that embeds the server shares it."""
    if os.environ.get(OPENBLAS_VAR):
        return []
    threads = torch.get_num_threads() if threads is None else threads
    import scipy.linalg.cython_blas  # noqa: F401  (what numba's np.dot calls: loaded, so that it is found)

    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # a dependency of the package; a tuning step is no reason to refuse to serve
        log.warning("threadpoolctl is not installed: OpenBLAS keeps a thread per core (install gnnserve's "
                    "dependencies, or set %s)", OPENBLAS_VAR)
        return []

    libs = ThreadpoolController().select(internal_api="openblas")
    changed = [(lib.filepath, lib.num_threads) for lib in libs.lib_controllers if lib.num_threads != threads]
    if changed:
        libs.limit(limits=threads)
        log.info("OpenBLAS: %d thread(s), the process's compute threads (was %s); set %s to choose another",
                 threads, ", ".join(str(n) for _, n in changed), OPENBLAS_VAR)
    return changed
