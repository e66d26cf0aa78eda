"""numba's thread count, without numba's side effect on torch's.

numba starts its OpenMP worker pool on the first ``numba.get_num_threads()`` (or the first parallel
kernel) of a process, and that start sets the calling thread's OpenMP thread count to numba's own
(``NUMBA_NUM_THREADS``, by default every core). torch reads the same count: in a process started with
``OMP_NUM_THREADS=1`` and no ``NUMBA_NUM_THREADS``, the thread that started the pool ran torch on every
core from then on (found 2026-11-26: ``torch.get_num_threads()`` 1 before, 2 after, on the 2-core VM).
:func:`numba_threads` is the one place the package asks numba, and puts torch's count back.
"""

from __future__ import annotations

import numba
import torch

__all__ = ["numba_threads"]


def numba_threads() -> int:
    """``numba.get_num_threads()`` on the calling thread, with torch's thread count as it was before."""
    before = torch.get_num_threads()
    n = numba.get_num_threads()
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
    return n
