"""numba's thread count, without numba's side effect on torch's; the BLAS pools' thread counts.

numba starts its OpenMP worker pool on the first ``numba.get_num_threads()`` (or the first parallel
kernel) of a process, and that start sets the calling thread's OpenMP thread count to numba's own
(``NUMBA_NUM_THREADS``, by default every core). torch reads the same count: in a process started with
``OMP_NUM_THREADS=1`` and no ``NUMBA_NUM_THREADS``, the thread that started the pool ran torch on every
core from then on (found 2026-11-26: ``torch.get_num_threads()`` 1 before, 2 after, on the 2-core VM).
:func:`numba_threads` is the one place the package asks numba, and puts torch's count back.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numba
import torch

__all__ = ["SERVER_BLAS_THREADS", "BlasPool", "blas_pools", "kernel_threads", "numba_threads", "numba_threads_set",
           "per_thread_pools", "server_blas_threads", "set_blas_threads"]

#: a server's BLAS pools unless told otherwise (``gnnserve serve --blas-threads``). Since 2026-11-28 the serving
#: paths' dense products are :mod:`kernels.dense`'s own (batch-invariant, no BLAS); what follows is why the pools
#: were set to one thread when the compiled CPU forwards (every CPU batch) did their dense products in SciPy's
#: OpenBLAS, which a pool still serves for anything else. OpenBLAS splits a product over more of its
#: pool's threads as the product grows (a shaDow layer of 4 targets, 256 x 64 x 64, already takes several:
#: with the pool set to 4 threads on the 2-vCPU VM three such products took 24 ms against 0.11 on one). With
#: the pool at the core count (its own default) a batch of a few targets takes every core, and one other
#: runnable thread (another request, the event loop, another process) leaves one of the product's threads
#: waiting for a time slice. On the VM beside one spinning process (docs/BENCHMARKS.md, "The compiled
#: forwards' BLAS pool") 2 threads took 4.4x the time of 1 at 16 shaDow targets and 1.4x-1.9x from 64 to
#: 1,024; idle, 0.81x-1.07x (shaDow, 1 to 1,024 targets: one thread costs up to 13% at 256 and more) and
#: 0.96x-1.15x (GCN); under gRPC load on the idle VM one thread served shaDow 5-7% fewer node predictions/s.
#: On an H100 machine's 16 cores the compiled shaDow path took 7.9 ms for 16 targets against 0.82 for 8,
#: which this stall would explain; how a part of many cores compares with one is not yet measured
#: (``benchmarks/gpu_session.sh next``). One thread gives up a little on an idle machine to never stall.
SERVER_BLAS_THREADS = 1


def numba_threads() -> int:
    """``numba.get_num_threads()`` on the calling thread, with torch's thread count as it was before."""
    before = torch.get_num_threads()
    n = numba.get_num_threads()
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
    return n


def kernel_threads() -> int:
    """Threads a parallel CPU kernel uses (the ES-SpMM kernel, the dense products): torch's configured count
    (``torch.set_num_threads``, ``OMP_NUM_THREADS``), capped by numba's (``NUMBA_NUM_THREADS``, or a lower
    ``numba.set_num_threads`` on the calling thread), at least 1. On a 2-core machine with the defaults: 2."""
    return max(1, min(torch.get_num_threads(), numba_threads()))


@contextlib.contextmanager
def numba_threads_set(n: int) -> Iterator[int]:
    """numba's thread count on the calling thread set to ``n`` (at least 1, at most ``NUMBA_NUM_THREADS``) inside
    the block and put back after; yields the count set (what a kernel's ``prange`` over threads should use)."""
    before = numba_threads()
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(before)


@dataclass(frozen=True)
class BlasPool:
    """One BLAS library loaded in the process, as threadpoolctl sees it."""

    path: str
    internal_api: str  # "openblas", "mkl", "blis"
    version: str | None
    threads: int
    per_thread: bool = False  # an OpenBLAS built on OpenMP: its count is per calling thread


def _controllers():
    import numpy  # noqa: F401  (NumPy's own OpenBLAS)
    import scipy.linalg.cython_blas  # noqa: F401  (SciPy's OpenBLAS: numba's np.dot calls it)
    from threadpoolctl import ThreadpoolController

    return [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]


def _pool(c) -> BlasPool:
    threads = c.num_threads
    return BlasPool(c.filepath, c.internal_api, c.version, -1 if threads is None else int(threads),
                    getattr(c, "threading_layer", None) == "openmp")


def blas_pools() -> list[BlasPool]:
    """The BLAS libraries NumPy, SciPy (through it numba's ``np.dot``) and anything else loaded so far use,
    with their thread counts (-1 where the library does not say). torch's MKL is linked into torch and not
    among them: torch's count is ``torch.set_num_threads``'."""
    return [_pool(c) for c in _controllers()]


_set_lock = threading.Lock()


def set_blas_threads(n: int) -> list[BlasPool]:
    """Every loaded BLAS library (:func:`blas_pools`) on ``n`` threads, process-wide; the pools after (a
    pool that did not take the count shows its own: callers check).

    OpenBLAS keeps one count per library, not per thread (``openblas_set_num_threads_local`` is process-wide
    in its pthreads builds too), so this is meant for a process's start, before any thread calls BLAS; a
    pool already at ``n`` is left alone. An OpenBLAS built on OpenMP takes the count per calling thread
    (``omp_set_num_threads``): those come back with ``per_thread`` set. One scan of the loaded libraries:
    the pools returned are read from the controllers that set them (their counts are read live)."""
    if n < 1:
        raise ValueError(f"BLAS threads must be >= 1, got {n}")
    with _set_lock:  # two servers built at once on two threads: each call's release-set-release whole
        controllers = _controllers()
        for c in controllers:
            if c.num_threads == n:
                continue
            # threadpoolctl (3.8) lets only the first thread that sets a pthreads OpenBLAS's count set it
            # again and makes every other thread's call a silent no-op; a server is built on whichever
            # thread its owner chose, so each call here takes and then releases that role
            release = getattr(type(c), "clear_controlling_thread", None)
            if release is not None:
                release(force=True)
            try:
                c.set_num_threads(n)
            finally:
                if release is not None:
                    release(force=True)
        return [_pool(c) for c in controllers]


def per_thread_pools() -> list[BlasPool]:
    """The loaded BLAS libraries whose thread count is per calling thread (an OpenBLAS built on OpenMP):
    :func:`set_blas_threads` reaches only the thread that calls it there."""
    return [p for p in blas_pools() if p.per_thread]


def server_blas_threads(configured: int | None, environ: dict[str, str] | None = None) -> int | None:
    """The BLAS thread count a server sets (None: it leaves the pools as they are, which at a process's start
    is ``OPENBLAS_NUM_THREADS``, else ``OMP_NUM_THREADS``, else every core): ``configured`` when given (0
    means leave them), else None where the environment sets ``OPENBLAS_NUM_THREADS`` (someone chose it),
    else :data:`SERVER_BLAS_THREADS`."""
    env = os.environ if environ is None else environ
    if configured is not None:
        if configured < 0:
            raise ValueError(f"BLAS threads must be >= 0 (0: leave the pools as they are), got {configured}")
        return configured or None
    return None if env.get("OPENBLAS_NUM_THREADS") else SERVER_BLAS_THREADS
