"""numba's thread count, without numba's side effect on torch's; the BLAS pools' thread counts.

numba starts its OpenMP worker pool on the first ``numba.get_num_threads()`` (or the first parallel
kernel) of a process, and that start sets the calling thread's OpenMP thread count to numba's own
(``NUMBA_NUM_THREADS``, by default every core). torch reads the same count: in a process started with
``OMP_NUM_THREADS=1`` and no ``NUMBA_NUM_THREADS``, the thread that started the pool ran torch on every
core from then on (found 2026-11-26: ``torch.get_num_threads()`` 1 before, 2 after, on the 2-core VM).
:func:`numba_threads` is the one place the package asks numba, and puts torch's count back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numba
import torch

__all__ = ["SERVER_BLAS_THREADS", "BlasPool", "blas_pools", "numba_threads", "server_blas_threads",
           "set_blas_threads"]

#: a server's BLAS pools unless told otherwise (``gnnserve serve --blas-threads``). The compiled CPU forwards
#: (every CPU batch) do their dense products in SciPy's OpenBLAS, which gives a product of ``m n k`` flops
#: ``min(pool, m n k / 2^18)`` threads: with the pool at the core count (its own default), a shaDow batch of
#: 16 targets on 16 cores, or of 4 on the 2-vCPU VM, takes every core, and one other runnable thread (another
#: request, the event loop, another process) leaves one of the product's threads waiting for a time slice.
#: On the VM beside one spinning process (docs/BENCHMARKS.md, "The compiled forwards' BLAS pool") 2 threads
#: took 4.4x the time of 1 at 16 shaDow targets and 1.4x-1.9x from 64 to 1,024, where idle they were
#: 0.87x-1.07x; on an H100 machine's 16 cores 16 targets took 7.9 ms against 0.82 for 8. The products are a
#: small part of a batch (the sampled aggregation and the readout are serial loops), so one thread loses
#: little when the machine is idle and avoids the stall when it is not.
SERVER_BLAS_THREADS = 1


def numba_threads() -> int:
    """``numba.get_num_threads()`` on the calling thread, with torch's thread count as it was before."""
    before = torch.get_num_threads()
    n = numba.get_num_threads()
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
    return n


@dataclass(frozen=True)
class BlasPool:
    """One BLAS library loaded in the process, as threadpoolctl sees it."""

    path: str
    internal_api: str  # "openblas", "mkl", "blis"
    version: str | None
    threads: int


def _controllers():
    import numpy  # noqa: F401  (NumPy's own OpenBLAS)
    import scipy.linalg.cython_blas  # noqa: F401  (SciPy's OpenBLAS: numba's np.dot calls it)
    from threadpoolctl import ThreadpoolController

    return [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]


def blas_pools() -> list[BlasPool]:
    """The BLAS libraries NumPy, SciPy (through it numba's ``np.dot``) and anything else loaded so far use,
    with their thread counts. torch's MKL is linked into torch and not among them: torch's count is
    ``torch.set_num_threads``'."""
    return [BlasPool(c.filepath, c.internal_api, c.version, int(c.num_threads)) for c in _controllers()]


def set_blas_threads(n: int) -> list[BlasPool]:
    """Every loaded BLAS library (:func:`blas_pools`) on ``n`` threads, process-wide; the pools after.

    OpenBLAS keeps one count per library, not per thread (``openblas_set_num_threads_local`` is process-wide
    in its pthreads builds too), so this is meant for a process's start, before any thread calls BLAS."""
    if n < 1:
        raise ValueError(f"BLAS threads must be >= 1, got {n}")
    for c in _controllers():
        # threadpoolctl (3.8) lets only the first thread that sets a pthreads OpenBLAS's count set it again and
        # makes every other thread's call a silent no-op; a server is built on whichever thread its owner
        # chose, so each call here takes and then releases that role
        release = getattr(type(c), "clear_controlling_thread", None)
        if release is not None:
            release(force=True)
        c.set_num_threads(n)
        if release is not None:
            release(force=True)
    return blas_pools()


def server_blas_threads(configured: int | None, environ: dict[str, str] | None = None) -> int | None:
    """The BLAS thread count a server sets (None: it leaves the pools as the libraries started them):
    ``configured`` when given (0 means leave them), else the pools' own count where the environment sets
    ``OPENBLAS_NUM_THREADS`` (someone chose it), else :data:`SERVER_BLAS_THREADS`."""
    env = os.environ if environ is None else environ
    if configured is not None:
        if configured < 0:
            raise ValueError(f"BLAS threads must be >= 0 (0: as the libraries start), got {configured}")
        return configured or None
    return None if env.get("OPENBLAS_NUM_THREADS") else SERVER_BLAS_THREADS
