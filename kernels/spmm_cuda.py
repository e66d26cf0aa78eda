r"""CUDA path of ES-SpMM: the kernel in ``es_spmm.cu`` launched through CuPy on torch tensors.

:func:`sampled_spmm_cuda` computes exactly the operation specified in :mod:`kernels.spmm` (same
positions, same rescaling, same ``gcn`` self term) for a float tensor ``x`` ``[N, F]`` on a CUDA
device, and returns ``[N, F]`` on that device. It does not record autograd history: the dispatcher
:func:`kernels.spmm.sampled_spmm` sends anything that needs a gradient to the torch path.

Mechanics:

* CuPy is imported lazily (never at import time of :mod:`kernels`), and :func:`available` decides
  once per process whether the path can be used: CuPy imports, torch sees a CUDA device, and a tiny
  launch gives the expected numbers. On a CPU-only machine it returns ``False`` after one debug log.
* ``es_spmm.cu`` is compiled through ``cupy.RawModule`` (NVRTC), one module per template instance on
  its first launch (:data:`COMPILE_PER_INSTANCE`; the instance named by ``name_expressions``): value
  type float/double/half/bfloat16 x index type int/long long x columns per thread 1/2/4/8 x scalar or
  128-bit loads (:func:`kernel_instances`) x whether long rows are split (``SPLIT``).
* float16 and bfloat16 are native: ``x`` is read in its own 16 bits (half the bytes of a float32
  copy, 8 elements per 128-bit load), every product and sum is float32, and each output element is
  rounded once to nearest even -- the torch path's definition for these types (computed in float32,
  cast back). A launch that splits rows adds its chunks into a float32 output, narrowed afterwards
  (16-bit atomic adds would round every partial sum).
* The graph's arrays move to the device once and stay memoized in ``graph.cache()`` under
  ``"cuda_spmm:<device>"`` (indptr int64, indices in the graph's int32/int64, weights float32),
  together with the work schedules of long rows (below). The entry holds the host arrays it was made
  from and is used only while the graph still holds those very arrays (``is``) with the same sizes:
  the live graph edits CSR arrays by replacing them (:mod:`kernels.graph_edit` builds a new graph;
  assigning ``graph.indices = ...`` replaces an array), so a replaced array rebuilds the entry. An
  in-place write into an array the entry was built from is not detected (nothing in gnnserve does
  that).
* The kernel takes the torch tensors' device pointers as 64-bit arguments (no copies, and no DLPack
  conversion per call), and runs on torch's current CUDA stream, so it is ordered with the surrounding
  torch work without any synchronisation. The launch (:func:`_launch`) goes straight to the driver:
  the 18 arguments, plain Python ints (:data:`ARG_KINDS`), are written into a per-thread block of
  8-byte slots whose addresses ``cuLaunchKernel`` takes (:func:`param_block`; 0.4 us to fill against
  3.9 us to box them as the NumPy scalars CuPy's kernel call wants, before its own packing and its
  device and stream context managers). A thread without a CUDA context gets the device's primary
  context bound on its first launch; a thread whose current device is another one, or
  ``FAST_LAUNCH = False``, or a driver launch that fails the probe, takes CuPy's call.
* Everything of a launch that does not depend on its tensors is prepared once per graph arrays and shape
  (:func:`_prepare`, memoized in the device entry). Once the C++ launcher is built
  (:mod:`kernels.cpp_launch`, ``kernels/launcher.cpp``; in the background, from the first GPU launch after
  the probe) and has given the probe's answers on the device by itself, one C++ call per launch allocates
  the output, fills the parameters and calls ``cuLaunchKernel`` (``CPP_LAUNCH``, with ``FAST_LAUNCH``:
  the C++ launch is a driver launch too); the Python path above is its specification
  and serves until then, where it cannot be built, and in a thread whose CUDA context is not the kernel's.
  Host time per request-sized call (``benchmarks/kernels.py``, docs/BENCHMARKS.md, H200): 55 us through
  CuPy's call (H100, 2026-11-24), 25.2 us through the driver launch, 14.6 us after the preparation was
  memoized; with the C++ launcher 10.4 us for the direct call, 14.3 us through ``kernels.sampled_spmm``
  (H100, 2026-11-27; the Python launch 13.4 and 18.0 in the same run).

Launch shape (:func:`launch_config`): a group of ``G`` lanes (power of two, 4..32, inside one warp)
per row, each lane owning ``CPT`` feature columns per pass (``G * CPT`` columns a pass, any ``F``
through several passes); 256 threads a block unless shared memory asks for fewer. The shared-memory
stage of a row holds ``tile`` (column, coefficient) pairs: ``tile = min(S, 256, max degree)`` when
sampling (the whole sample of a row fits: ES-SpMM's cache-first idea), ``min(128, max degree)`` in
exact mode, where rows stream through the stage tile by tile.

128-bit loads (:data:`VECTOR`): when ``F`` is a multiple of ``V = 16 / sizeof(value)`` (4 floats, 2
doubles) and ``x`` starts on a 16-byte boundary, each lane owns runs of ``V`` consecutive columns
and gathers them with one ``float4`` / ``double2`` load; ``CPT`` is then at least ``V`` (``F = 64``
float32: 16 lanes of 4 columns instead of 32 lanes of 2). Other ``F`` (and misaligned views) take the
scalar loads: a row of ``x`` starts on a 16-byte boundary only when ``F % V == 0``.

Long rows: a row whose kept edge count ``k`` (``d`` exact, ``min(d, S)`` sampled) exceeds the split
threshold ``L`` is cut into ``ceil(k / L)`` chunks, each a work item of its own that adds its
partial sum into ``out`` with ``atomicAdd`` (``out`` is zeroed first; the row's scale is in every
coefficient, so chunks merge by addition; chunk 0 adds ``gcn``'s self term). ``L`` is
:func:`split_threshold`: four times the mean kept count, within [:data:`SPLIT_MIN_EDGES`,
:data:`SPLIT_EDGES`] = [128, 512] (small graphs, whose calls last tens of microseconds, need short
chunks to cut the tail of their few hubs; a Reddit-sized graph wants fewer atomics); a caller may
fix it (``split_edges=``; 0 = never split). The work list (:func:`work_schedule`: all chunks
first, then the whole rows, longest first under ``ROW_ORDER = "degree"``) is built on the host
once per (graph arrays, width, threshold, order) and kept on the device in the graph's entry. Graphs
whose kept rows all fit (request-sized subgraphs, sampled passes with ``S <= L``) get no schedule:
rows in index order, ``out`` not zeroed, the launch as before. Chunks of one row add in an
unspecified order, so the last bits of a split row's output can differ from run to run. None of
these constants has been measured on a GPU yet (docs/BENCHMARKS.md, GPU section).
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from . import cpp_launch
from ._lazy import imported
from .graph import CSRGraph
from .spmm import _check_args, _gcn_dinv, device_key  # kernels.spmm imports this module lazily

__all__ = [
    "COLS_PER_THREAD",
    "KERNEL_SOURCE",
    "KernelBuildError",
    "LaunchConfig",
    "available",
    "kept_counts",
    "kernel_instances",
    "kernel_name",
    "launch_config",
    "sampled_spmm_cuda",
    "shared_bytes",
    "split_threshold",
    "use_vector",
    "work_schedule",
]

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("es_spmm.cu")
COLS_PER_THREAD = (1, 2, 4, 8)
INDEX_CTYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}
#: the kernel's value types T: float32 and float64 computed in their own type; float16 and bfloat16
#: stored as 16-bit bit patterns and computed in float32 (ACC_DTYPES)
VALUE_CTYPES = {torch.float32: "float", torch.float64: "double", torch.float16: "es_spmm::half_t",
                torch.bfloat16: "es_spmm::bf16_t"}
VALUE_BYTES = {torch.float32: 4, torch.float64: 8, torch.float16: 2, torch.bfloat16: 2}
#: the accumulation type A of each value type (coefficients, dinv, the shared-memory stage, a split
#: launch's output)
ACC_DTYPES = {torch.float32: torch.float32, torch.float64: torch.float64, torch.float16: torch.float32,
              torch.bfloat16: torch.float32}
#: the same by C type name (the name expressions' side)
CTYPE_BYTES = {VALUE_CTYPES[d]: VALUE_BYTES[d] for d in VALUE_CTYPES}
ACC_CTYPES = {VALUE_CTYPES[d]: VALUE_CTYPES[ACC_DTYPES[d]] for d in VALUE_CTYPES}
STRATEGY_CODES = {"fastrand": 0, "bucket": 1}
AGGREGATOR_CODES = {"sum": 0, "mean": 1, "gcn": 2}

MAX_BLOCK_THREADS = 256  # matches __launch_bounds__ in es_spmm.cu
MAX_TILE = 256  # widest sample staged whole; wider ones are staged in tiles of this size
EXACT_TILE = 128  # stage size when a row is streamed (exact mode)
SHARED_BUDGET = 24 * 1024  # per block: keeps several blocks resident per SM on every arch >= sm_70
SHARED_LIMIT = 48 * 1024  # the dynamic shared memory a launch may take without opting in
DISABLE_ENV = "GNNSERVE_DISABLE_CUDA_SPMM"
#: the split threshold L (rows with more kept edges are cut into chunks of L edges, one work item
#: each) is SPLIT_MEAN_FACTOR x the mean kept count, clamped to [SPLIT_MIN_EDGES, SPLIT_EDGES].
#: Measured on an H200 (docs/BENCHMARKS.md, "GPU: an H200 machine"): without the split exact mode was
#: 0.17x-0.58x of cuSPARSE on the graphs with hubs (1.04x-1.07x on Coauthor Physics, max degree 382), with
#: it 0.96x-2.00x; a fixed 128 was even with this rule, 512 worse on small graphs.
SPLIT_EDGES = 512
SPLIT_MIN_EDGES = 128
SPLIT_MEAN_FACTOR = 4
#: order of the whole rows of a schedule, after the chunks: "degree" (longest first) or "index"
ROW_ORDER = "degree"
ROW_ORDERS = ("degree", "index")
#: 128-bit loads of x when F and the alignment allow
VECTOR = True
#: build one NVRTC module per kernel instance (value type, index type, CPT, 128-bit loads, split), on its
#: first launch, instead of all 16 instances of a (value type, split) at once: a fresh machine's first
#: start compiles the few instances it launches (CuPy keeps them in its disk cache after that).
#: ``GNNSERVE_CUDA_COMPILE=module`` restores the bundles (for comparing the two)
COMPILE_PER_INSTANCE = os.environ.get("GNNSERVE_CUDA_COMPILE", "instance").strip() != "module"
#: Split launches over many short rows hold the split instance to 4 blocks of 256 threads per SM (64
#: registers, es_spmm.cu's ES_SPMM_SPLIT_MIN_BLOCKS) instead of 3 (up to 85): with a few edges per work item,
#: more resident warps hide the gathers' latency better than more registers per thread. "Short": at most
#: SHORT_ROWS_MEAN kept edges per work item on average; "many": a grid of at least SHORT_ROWS_WAVES full
#: waves of 4 blocks on every SM. Measured on an H200 (docs/BENCHMARKS.md, 2026-11-26 morning), exact mode,
#: kernels.py: arxiv-like (6.8 edges a row) 0.96x -> 1.11x of cuSPARSE at F = 256 and 1.09x -> 1.26x at
#: F = 64, Coauthor Physics (14.4) 1.13x -> 1.25x and 1.62x -> 1.72x; but Amazon Computers (35.8) lost at
#: F = 64 (1.71x -> 1.46x), and so did the small grids of the paper's experiment (Cora, 170 blocks:
#: 1.11x -> 0.98x; pubmed-like, 1,236 blocks: 1.10x -> 0.99x; arxiv-like 10,628 and Coauthor Physics 2,160
#: gained), hence both bounds, which fall between the graphs measured: rough bounds. float32 only (the other
#: types were not measured: 3 blocks).
SHORT_ROWS_MEAN = 20.0
SHORT_ROWS_WAVES = 4
#: streaming multiprocessors assumed for a launch planned on the CPU (the tests' stand-in for a device): an
#: H100 SXM's and an H200's 132
HOST_SM_COUNT = 132
SHORT_ROWS_DEFINES = ("ES_SPMM_SPLIT_MIN_BLOCKS=4",)
#: extra preprocessor definitions ("NAME=VALUE") for the kernel's tuning macros (es_spmm.cu: ES_SPMM_VEC_UNROLL,
#: ES_SPMM_SPLIT_MIN_BLOCKS); part of every module's and instance's key. Empty = the shipped defaults; a
#: benchmark sets it around a variant (benchmarks/kernels.py --defines), and then it replaces the launcher's
#: own choice (SHORT_ROWS_DEFINES). ``GNNSERVE_CUDA_DEFINES="NAME=VALUE,..."`` sets it for a whole process (an A/B
#: of any benchmark: the serving path, the paper's experiment)
DEFINES_ENV = "GNNSERVE_CUDA_DEFINES"
DEFINE_PATTERN = r"ES_SPMM_[A-Z0-9_]+=[0-9]+"
COMPILE_DEFINES: tuple[str, ...] = tuple(d.strip() for d in os.environ.get(DEFINES_ENV, "").split(",") if d.strip())
#: entries of GNNSERVE_CUDA_DEFINES that are not NAME=<integer> for a tuning macro: the probe refuses the
#: kernel with them (a typo would otherwise fail every build, or define something else)
_bad_defines = [d for d in COMPILE_DEFINES if not re.fullmatch(DEFINE_PATTERN, d)]
#: seconds each module took to load (NVRTC compile, or CuPy's disk cache), in this process
compile_seconds: list[float] = []
SCHEDULES_KEPT = 4  # schedules memoized per graph and device (the oldest is dropped first)


# ----------------------------------------------------------------------------- launch shape
class KernelBuildError(RuntimeError):
    """A float32 / float64 kernel instance did not build (compiled on its first launch: NVRTC, or CuPy's
    kernel cache). :func:`kernels.spmm.sampled_spmm` then computes the pass on the torch path."""


@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch of ``es_spmm_kernel`` needs besides its arguments.

    Attributes:
        cols_per_thread: ``CPT``, the template parameter (1, 2, 4 or 8).
        group_size: ``G``, lanes per row (power of two, 4..32).
        tile: shared-memory stage entries per row.
        block_threads: threads per block (multiple of 32, <= 256).
        groups_per_block: rows a block works on at once (``block_threads / 32 * 32 / G``).
        blocks: grid size (rows beyond ``blocks * groups_per_block`` are reached grid-stride).
        shared_bytes: dynamic shared memory per block.
        vector: 128-bit loads (the ``VEC`` template parameter).
    """

    cols_per_thread: int
    group_size: int
    tile: int
    block_threads: int
    groups_per_block: int
    blocks: int
    shared_bytes: int
    vector: bool = False


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def shared_bytes(groups_per_block: int, tile: int, value_bytes: int, index_bytes: int) -> int:
    """Dynamic shared memory of a block: the layout of ``es_spmm.cu`` (coefficients padded to 16
    bytes, then indices; ``tile + 1`` entries per group). ``value_bytes`` is the size of the
    coefficients' type, the accumulation type (4 for the 16-bit value types)."""
    values = groups_per_block * (tile + 1) * value_bytes
    values = (values + 15) // 16 * 16
    return values + groups_per_block * (tile + 1) * index_bytes


def vector_width(value_bytes: int) -> int:
    """``V``: elements of one 128-bit load (4 float32, 2 float64, 8 float16 / bfloat16)."""
    return 16 // int(value_bytes)


def use_vector(num_features: int, value_bytes: int, *pointers: int) -> bool:
    """Whether a launch can use 128-bit loads: ``F`` a multiple of ``V`` and every pointer (of ``x``,
    ``out``) on a 16-byte boundary (whether it does is :data:`VECTOR`, or the caller's choice)."""
    return int(num_features) % vector_width(value_bytes) == 0 and all(int(p) % 16 == 0 for p in pointers)


def launch_config(
    num_rows: int,
    num_features: int,
    width: int,
    max_degree: int,
    value_bytes: int,
    index_bytes: int,
    *,
    tile: int | None = None,
    max_blocks: int = 2**31 - 1,
    vector: bool = False,
    num_items: int | None = None,
    acc_bytes: int | None = None,
    cols_per_thread: int | None = None,
) -> LaunchConfig:
    """Pick the launch shape for ``num_rows`` rows of ``num_features`` columns.

    ``CPT`` is the smallest power of two (<= 8) with ``32 * CPT >= F`` (with ``vector``: at least
    ``V``, and ``F`` must be a multiple of ``V``); ``G`` the smallest power of two (4..32) with ``G *
    CPT >= F``; so ``F <= 256`` runs in one pass. ``tile`` defaults to ``min(S, 256)`` when sampling
    (``S = width > 0``), 128 in exact mode, never above the largest row (at least 1). Warps per
    block halve from 8 until the stages fit :data:`SHARED_BUDGET`. The grid covers ``num_items``
    work items (default ``num_rows``: no schedule), one per group. ``value_bytes`` is the element
    size of ``x`` (the 128-bit layout), ``acc_bytes`` that of the stage's coefficients (default
    ``value_bytes``; 4 for float16 / bfloat16). ``cols_per_thread`` sets ``CPT`` instead (1, 2, 4 or 8; at
    least ``V`` with ``vector``): fewer columns per lane take more passes over a row (a benchmark's knob).
    """
    acc_bytes = int(value_bytes) if acc_bytes is None else int(acc_bytes)
    f = max(1, int(num_features))
    cpt = min(8, _next_pow2(math.ceil(f / 32)))
    if vector:
        v = vector_width(value_bytes)
        if f % v:
            raise ValueError(f"128-bit loads need F to be a multiple of {v}, got {f}")
        cpt = max(cpt, v)
    if cols_per_thread is not None:
        c = int(cols_per_thread)
        if c not in (1, 2, 4, 8) or (vector and c < vector_width(value_bytes)):
            raise ValueError(f"cols_per_thread must be 1, 2, 4 or 8 (at least {vector_width(value_bytes)} with "
                             f"128-bit loads), got {cols_per_thread}")
        cpt = c
    g = min(32, max(4, _next_pow2(math.ceil(f / cpt))))
    if tile is None:
        tile = min(int(width), MAX_TILE) if width > 0 else EXACT_TILE
        tile = min(tile, int(max_degree))
    tile = max(1, int(tile))
    warps = MAX_BLOCK_THREADS // 32
    while warps > 1 and shared_bytes(warps * (32 // g), tile, acc_bytes, index_bytes) > SHARED_BUDGET:
        warps //= 2
    gpb = warps * (32 // g)
    smem = shared_bytes(gpb, tile, acc_bytes, index_bytes)
    if smem > SHARED_LIMIT:
        raise ValueError(f"stage of {tile} entries needs {smem} bytes of shared memory, above {SHARED_LIMIT}")
    items = int(num_rows) if num_items is None else int(num_items)
    blocks = max(1, min(int(max_blocks), math.ceil(max(items, 1) / gpb)))
    return LaunchConfig(cpt, g, tile, warps * 32, gpb, blocks, smem, bool(vector))


def _cbool(b: bool) -> str:
    return "true" if b else "false"


def kernel_name(value_ctype: str, index_ctype: str, cols_per_thread: int, vector: bool = False,
                split: bool = False) -> str:
    """The template instance as NVRTC names it (a ``name_expressions`` entry)."""
    return (f"es_spmm::es_spmm_kernel<{value_ctype}, {index_ctype}, {cols_per_thread}, {_cbool(vector)}, "
            f"{_cbool(split)}>")


def kernel_instances(value_ctype: str) -> list[tuple[str, int, bool]]:
    """``(index ctype, CPT, vector)`` of every instance compiled for one value type (and each of
    ``split`` false / true): each CPT with scalar loads, and with 128-bit loads where ``CPT`` is a
    multiple of ``V``."""
    v = vector_width(CTYPE_BYTES[value_ctype])
    return [(ic, c, vec) for ic in INDEX_CTYPES.values() for c in COLS_PER_THREAD for vec in (False, True)
            if not vec or c % v == 0]


def kept_counts(indptr: np.ndarray, width: int) -> np.ndarray:
    """``k_r``: the edges row ``r`` aggregates (``d_r`` exact, ``min(d_r, width)`` sampled), int64."""
    deg = np.diff(np.asarray(indptr, dtype=np.int64))
    return np.minimum(deg, int(width)) if width > 0 else deg


def split_threshold(indptr: np.ndarray, width: int) -> int:
    """The default split threshold ``L`` of a pass: ``SPLIT_MEAN_FACTOR`` x the mean kept count,
    rounded up, clamped to ``[SPLIT_MIN_EDGES, SPLIT_EDGES]``."""
    kept = kept_counts(indptr, width)
    mean = float(kept.mean()) if len(kept) else 0.0
    return int(min(SPLIT_EDGES, max(SPLIT_MIN_EDGES, math.ceil(SPLIT_MEAN_FACTOR * mean))))


def work_schedule(indptr: np.ndarray, width: int, split_edges: int,
                  order: str = "degree") -> tuple[np.ndarray, np.ndarray] | None:
    """The work items of a launch, or ``None`` when no row is split (item ``r`` = row ``r``).

    Row ``r`` keeps ``k_r = d_r`` edges (``width`` 0) or ``min(d_r, width)``. A row with ``k_r >
    split_edges`` becomes ``ceil(k_r / split_edges)`` items ``(r, c)``, chunk ``c`` covering kept
    positions ``[c * split_edges, min(k_r, (c + 1) * split_edges))`` -- the rule ``es_spmm.cu``
    applies -- and these come first, chunk-major (every split row's chunk 0, then every chunk 1,
    ...: chunks of one row, which add into the same output row, are spread over the grid). Every
    other row is one item ``(r, 0)``, after them: longest first (``order="degree"``, stable) or in
    index order (``"index"``).

    Returns ``(work_row int64 [M], work_chunk int32 [M])``.
    """
    if order not in ROW_ORDERS:
        raise ValueError(f"order must be one of {ROW_ORDERS}, got {order!r}")
    split_edges = int(split_edges)
    if split_edges <= 0 or (width > 0 and width <= split_edges):
        return None
    kept = kept_counts(indptr, width)
    long_rows = np.flatnonzero(kept > split_edges)
    if not len(long_rows):
        return None
    nchunks = -(-kept[long_rows] // split_edges)
    rows = np.repeat(long_rows, nchunks)
    first = np.repeat(np.cumsum(nchunks) - nchunks, nchunks)
    chunks = np.arange(len(rows), dtype=np.int64) - first
    by_chunk = np.lexsort((rows, chunks))
    short_rows = np.flatnonzero(kept <= split_edges)
    if order == "degree":
        short_rows = short_rows[np.argsort(-kept[short_rows], kind="stable")]
    work_row = np.concatenate([rows[by_chunk], short_rows]).astype(np.int64)
    work_chunk = np.concatenate([chunks[by_chunk], np.zeros(len(short_rows), dtype=np.int64)]).astype(np.int32)
    return work_row, work_chunk


@cache
def kernel_source() -> str:
    return KERNEL_SOURCE.read_text()


# ----------------------------------------------------------------------------- CuPy state
_lock = threading.RLock()
#: (device index, value dtype, split[, index type, CPT, vector]) -> cupy.RawModule
_modules: dict[tuple, Any] = {}
_kernels: dict[tuple, Any] = {}  # _kernel's key -> (raw kernel, CUfunction handle)
_streams: dict[tuple[int, int], Any] = {}  # (device index, torch stream handle) -> CuPy stream
_available: bool | None = None
_why = ""  # the probe's reason, with _available
#: 16-bit value types whose module failed to build on a device (device index, dtype): those launches
#: compute in float32 instead (the path before native 16-bit), after one warning
_no_native: set[tuple[int, torch.dtype]] = set()
#: kernel instances whose build failed (``_kernel``'s key -> the error), not tried again in this process
_failed: dict[tuple, str] = {}


def _cupy() -> Any:
    """CuPy, imported on first GPU use only (an optional dependency)."""
    return imported("cupy")


def _kernel(device_index: int, dtype: torch.dtype, index_ctype: str, cpt: int, vector: bool = False,
            split: bool = False, defines: tuple[str, ...] = ()) -> Any:
    """The compiled kernel for one (device, dtype, index type, CPT, vector, split, preprocessor definitions):
    ``(raw kernel, CUfunction handle)``, the :class:`cupy.RawKernel` (for CuPy's call) and its function on
    ``device_index`` (for the driver launch). ``defines`` are the launch's own (:data:`SHORT_ROWS_DEFINES`);
    a non-empty :data:`COMPILE_DEFINES` replaces them."""
    key = (device_index, dtype, index_ctype, cpt, vector, split, COMPILE_DEFINES or defines)
    fn = _kernels.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _kernels.get(key)
        if fn is not None:
            return fn
        if key in _failed:  # built once and failed: not again on every launch
            raise RuntimeError(_failed[key])
        try:
            fn = _build(key)
        except Exception as exc:
            _failed[key] = f"{type(exc).__name__}: {exc}"
            raise
        _kernels[key] = fn
        return fn


def _instance(prep: _Prepared, device_index: int, dtype: torch.dtype) -> tuple[Any, int]:
    """:func:`_kernel`'s instance for the prepared launch ``prep`` of ``dtype`` values on ``device_index``."""
    cfg = prep.cfg
    return _kernel(device_index, dtype, prep.index_ctype, cfg.cols_per_thread, cfg.vector, prep.split, prep.defines)


def _build(key: tuple) -> tuple[Any, int]:
    """:func:`_kernel`'s build of one instance (under ``_lock``)."""
    device_index, dtype, index_ctype, cpt, vector, split, defines = key
    cp = _cupy()
    vt = VALUE_CTYPES[dtype]
    if COMPILE_PER_INSTANCE:  # one instance a module: a start compiles what it launches, nothing more
        mkey: tuple = (device_index, dtype, split, index_ctype, cpt, vector, defines)
        names = [kernel_name(vt, index_ctype, cpt, vector, split)]
    else:
        mkey = (device_index, dtype, split, defines)
        names = [kernel_name(vt, ic, c, vec, split) for ic, c, vec in kernel_instances(vt)]
    mod = _modules.get(mkey)
    with cp.cuda.Device(device_index):
        t0 = None
        if mod is None:
            t0 = time.perf_counter()
            options = ("-std=c++17", *(f"-D{d}" for d in defines))
            mod = cp.RawModule(code=kernel_source(), options=options, name_expressions=names)
            log.debug("loading %s for cuda:%d: %s", KERNEL_SOURCE.name, device_index,
                      names[0] if len(names) == 1 else f"{len(names)} instances of {vt} (split={split})")
        raw = mod.get_function(kernel_name(vt, index_ctype, cpt, vector, split))
        # RawModule.get_function gives a RawKernel; its Function on the current device (compiling the
        # module if needed: a build error surfaces here) holds the CUfunction handle cuLaunchKernel takes
        fn = (raw, int(raw.kernel.ptr))
        _modules[mkey] = mod  # kept once it built
        if t0 is not None:
            compile_seconds.append(time.perf_counter() - t0)
    return fn


def _upload(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    with warnings.catch_warnings():
        # memory-mapped graphs are read-only; the host view is only read, to copy it to the device
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.from_numpy(np.ascontiguousarray(arr)).to(device)


def _source(graph: CSRGraph) -> tuple[Any, ...]:
    """What a device entry is valid for: the graph's arrays themselves and their sizes."""
    return (graph.indptr, graph.indices, graph.weights, graph.indptr.size, graph.indices.size,
            None if graph.weights is None else graph.weights.size)


def _valid(entry: dict[str, Any] | None, graph: CSRGraph) -> bool:
    """Whether ``entry`` was made from the arrays ``graph`` holds now (same objects, same sizes)."""
    if entry is None:
        return False
    ip, ix, w, n_ip, n_ix, n_w = entry["source"]
    gw = graph.weights
    return (ip is graph.indptr and ix is graph.indices and w is gw and ip.size == n_ip and ix.size == n_ix
            and (gw is None or gw.size == n_w))


HOLD_CYCLES_PER_S = 2.0e9  # a little above the H100's and H200's 1.98 GHz SM boost clock: a hold lasts at least


def hold_stream(seconds: float) -> None:
    """Queue a kernel that spins for about ``seconds`` (at least that, at SM clocks up to 2 GHz) on the
    current CUDA stream. For timing: launches issued right after it queue behind it, so CUDA events
    recorded after it and after them bracket the device's work only, not the host's time to issue it
    (which on a small graph is longer than the kernels themselves)."""
    torch.cuda._sleep(max(1, int(seconds * HOLD_CYCLES_PER_S)))


_entry_keys: dict[torch.device, str] = {}  # entry_key of the devices that name their index (and the CPU)


def entry_key(device: torch.device) -> str:
    """The graph cache key of a device entry: ``"cuda_spmm:<device>"`` with the index filled in
    (:func:`kernels.spmm.device_key`): a server's ``torch.device("cuda")`` stages the entry that a launch,
    which derives ``cuda:0`` from its tensor, looks up. Memoized where the device says its index (every
    launch: a tensor's device does); ``cuda`` alone follows the current device."""
    key = _entry_keys.get(device)
    if key is None:
        key = f"cuda_spmm:{device_key(device)}"
        if device.type != "cuda" or device.index is not None:
            _entry_keys[device] = key
    return key


def _device_graph(graph: CSRGraph, device: torch.device) -> dict[str, Any]:
    """The graph's CSR arrays on ``device`` as torch tensors and their device pointers; memoized on the
    graph while it holds the same arrays (see the module docstring)."""
    key = entry_key(device)
    cache_ = graph.cache()
    entry = cache_.get(key)
    if _valid(entry, graph):
        return entry
    with _lock:
        entry = cache_.get(key)
        if _valid(entry, graph):
            return entry
        entry = cache_[key] = _entry(graph, {name: _upload(a, device) for name, a in _csr_arrays(graph).items()})
        return entry


def _csr_arrays(graph: CSRGraph) -> dict[str, np.ndarray]:
    """The host arrays a device entry holds: indptr int64, indices as they are, weights float32 (if any)."""
    out = {"indptr": graph.indptr.astype(np.int64, copy=False), "indices": graph.indices}
    if graph.weights is not None:
        out["weights"] = graph.weights.astype(np.float32, copy=False)
    return out


def _entry(graph: CSRGraph, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A device entry of ``graph`` over ``tensors`` (:func:`_csr_arrays` on the device)."""
    return {
        "tensors": tensors,  # owns the device memory the pointers below point into
        "ptr_indptr": tensors["indptr"].data_ptr(),
        "ptr_indices": tensors["indices"].data_ptr(),
        "ptr_weights": tensors["weights"].data_ptr() if "weights" in tensors else 0,
        "index_ctype": INDEX_CTYPES[np.dtype(graph.indices.dtype)],
        "index_bytes": int(graph.indices.dtype.itemsize),
        "max_degree": graph.max_degree,
        "source": _source(graph),  # keeps the host arrays alive, so `is` cannot match a recycled id
        "schedules": {},  # (width, split_edges or None = default, order) -> device schedule or None
        "prepared": {},  # _prepare's launches over these arrays
    }


_STAGE_ALIGN = 16


def stage_graphs(graphs: list[CSRGraph], device: torch.device,
                 extras: list[np.ndarray] | tuple[np.ndarray, ...] = ()) -> list[torch.Tensor]:
    """Put the device entries of ``graphs`` (what :func:`_device_graph` would upload for each, one copy per
    array) and the arrays ``extras`` on ``device`` with one copy: every array packed into this thread's
    staging buffer (pinned on a GPU) at 16-byte aligned offsets, one non-blocking copy, views of the one
    device buffer. A batch's execution plan has a fresh graph per layer and their degrees: about nine
    synchronous copies of pageable memory become one. Graphs whose entry is valid already are skipped.
    Returns ``extras`` on the device, in order."""
    key = entry_key(device)
    todo = [(g, _csr_arrays(g)) for g in graphs if not _valid(g.cache().get(key), g)]
    arrays = [np.ascontiguousarray(a) for _, named in todo for a in named.values()]
    arrays += [np.ascontiguousarray(e) for e in extras]
    if not arrays:
        return []
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // _STAGE_ALIGN) * _STAGE_ALIGN
    host = _staging_buffer(max(total, _STAGE_ALIGN), device)
    view = host.numpy()
    for a, off in zip(arrays, offsets, strict=True):
        view[off: off + a.nbytes] = a.reshape(-1).view(np.uint8)
    dev = torch.empty(max(total, _STAGE_ALIGN), dtype=torch.uint8, device=device)
    dev.copy_(host[: dev.numel()], non_blocking=device.type == "cuda")
    if device.type == "cuda":
        # the buffer is written again only after this copy (_staging_buffer)
        _tls.stage_event.record(torch.cuda.current_stream(device))
    parts = [dev[off: off + a.nbytes].view(torch.from_numpy(a[:0]).dtype) for a, off in zip(arrays, offsets,
                                                                                            strict=True)]
    i = 0
    with _lock:
        for g, named in todo:
            g.cache()[key] = _entry(g, dict(zip(named, parts[i: i + len(named)], strict=True)))
            i += len(named)
    return parts[i:]


def _staging_buffer(size: int, device: torch.device) -> torch.Tensor:
    """This thread's host staging buffer of at least ``size`` bytes (pinned on a GPU), once the copy that
    last read it has finished."""
    buf = getattr(_tls, "stage", None)
    if device.type == "cuda":
        if getattr(_tls, "stage_event", None) is None:
            _tls.stage_event = torch.cuda.Event()
        _tls.stage_event.synchronize()  # returns at once unless the previous batch's copy still runs
    if buf is None or buf.numel() < size or buf.is_pinned() != (device.type == "cuda"):
        cap = 1 << max(12, (size - 1).bit_length())
        buf = _tls.stage = torch.empty(cap, dtype=torch.uint8, pin_memory=device.type == "cuda")
    return buf


def _device_schedule(graph: CSRGraph, entry: dict[str, Any], width: int, split_edges: int | None,
                     order: str) -> dict[str, Any] | None:
    """:func:`work_schedule` of the entry's arrays on the device, with its threshold under
    ``"split_edges"`` (``split_edges`` None: :func:`split_threshold`); memoized in the entry (so it
    is dropped with it when the graph's arrays are replaced), the latest :data:`SCHEDULES_KEPT`."""
    floor = SPLIT_MIN_EDGES if split_edges is None else int(split_edges)
    kept_max = min(entry["max_degree"], width) if width > 0 else entry["max_degree"]
    if floor <= 0 or kept_max <= floor:
        return None  # nothing to split: no host work, no upload
    key = (int(width), split_edges, order)
    scheds = entry["schedules"]
    if key in scheds:
        return scheds[key]
    with _lock:
        if key in scheds:
            return scheds[key]
        threshold = split_threshold(graph.indptr, width) if split_edges is None else int(split_edges)
        ws = work_schedule(graph.indptr, width, threshold, order)
        sched = None
        if ws is not None:
            device = entry["tensors"]["indptr"].device
            row, chunk = _upload(ws[0], device), _upload(ws[1], device)
            sched = {"tensors": (row, chunk), "ptr_row": row.data_ptr(), "ptr_chunk": chunk.data_ptr(),
                     "num_items": len(ws[0]), "split_edges": threshold,
                     "mean_kept": float(kept_counts(graph.indptr, width).sum()) / len(ws[0])}
        scheds[key] = sched
        while len(scheds) > SCHEDULES_KEPT:
            old = scheds.pop(next(iter(scheds)))  # oldest first
            if old is not None:  # and the memoized launches that hold it: its memory goes with them
                prepared = entry["prepared"]
                for k in [k for k, p in prepared.items() if p.sched is old]:
                    del prepared[k]
        return sched


def _stream(device_index: int, handle: int) -> Any:
    """A CuPy view of torch's stream ``handle`` on device ``device_index`` (memoized: a launch enqueues
    on torch's current stream, ordered with the torch work around it)."""
    key = (device_index, handle)
    st = _streams.get(key)
    if st is None:
        cp = _cupy()
        with cp.cuda.Device(device_index):
            try:  # CuPy >= 14 (ExternalStream is deprecated there)
                st = cp.cuda.Stream.from_external(_TorchStreamHandle(handle))
            except (AttributeError, TypeError):
                st = cp.cuda.ExternalStream(handle, device_index)
        _streams[key] = st
    return st


class _TorchStreamHandle:
    """The CUDA stream protocol (``__cuda_stream__``) for a raw stream handle."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


# ----------------------------------------------------------------------------- public API
def sampled_spmm_cuda(
    graph: CSRGraph,
    x: torch.Tensor,
    width: int | None,
    strategy: str = "fastrand",
    aggregator: str = "sum",
    gcn_dinv: torch.Tensor | None = None,
    *,
    split_edges: int | None = None,
    row_order: str | None = None,
    vector: bool | None = None,
    cols_per_thread: int | None = None,
) -> torch.Tensor:
    """ES-SpMM on the GPU: ``out = A_S x`` with the formulas of :mod:`kernels.spmm`.

    Args:
        graph: the adjacency, ``N`` rows (host arrays; copied to the device once and memoized).
        x: ``[N, F]`` float32, float64, float16 or bfloat16 tensor on a CUDA device (16-bit types
            read natively, computed in float32; any other floating type is computed in float32
            and cast back). Must not require a gradient.
        width: sampling width ``S``; ``None`` or 0 = exact.
        strategy: ``"fastrand"`` or ``"bucket"``.
        aggregator: ``"sum"``, ``"mean"`` or ``"gcn"``.
        gcn_dinv: ``gcn`` only: ``D^{-1/2}`` ``[N]`` (default: from the graph's own degrees, ``D_i =
            1 + sum_j w_ij``).
        split_edges, row_order, vector, cols_per_thread: the launch knobs (default: :func:`split_threshold`,
            :data:`ROW_ORDER`, :data:`VECTOR`, :func:`launch_config`'s choice), for benchmarks and tests;
            ``split_edges=0`` never splits; ``vector=True`` still falls back to scalar loads where ``F``
            or the alignment forbid 128-bit ones.

    Returns:
        ``[N, F]`` tensor of ``x``'s dtype on ``x``'s device, written on torch's current stream.
    """
    width = _check_args(graph, x, width, strategy, aggregator)
    if not x.is_cuda:
        raise ValueError(f"sampled_spmm_cuda needs a CUDA tensor, got one on {x.device}")
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError("sampled_spmm_cuda records no gradient: call kernels.sampled_spmm for autograd")
    return _sampled_spmm_cuda(graph, x, width, strategy, aggregator, gcn_dinv, split_edges, row_order, vector,
                              cols_per_thread)


def _sampled_spmm_cuda(graph: CSRGraph, x: torch.Tensor, width: int, strategy: str, aggregator: str,
                       gcn_dinv: torch.Tensor | None, split_edges: int | None = None, row_order: str | None = None,
                       vector: bool | None = None, cols_per_thread: int | None = None) -> torch.Tensor:
    """:func:`sampled_spmm_cuda` once its arguments are checked (``width`` an int; ``x`` on a GPU, recording
    no gradient): what :func:`kernels.spmm.sampled_spmm`, which makes the same checks, calls."""
    out_dtype = x.dtype
    dtype = out_dtype if out_dtype in VALUE_CTYPES else torch.float32
    device = x.device
    dev_index = device.index if device.index is not None else torch.cuda.current_device()
    if _no_native and (dev_index, dtype) in _no_native:
        dtype = torch.float32
    acc = ACC_DTYPES[dtype]
    split_edges = None if split_edges is None else int(split_edges)
    row_order = ROW_ORDER if row_order is None else row_order
    if row_order not in ROW_ORDERS:
        raise ValueError(f"row_order must be one of {ROW_ORDERS}, got {row_order!r}")
    # a contiguous x of the kernel's type is read as it is (no copy, no autograd view: nothing records)
    xc = x if x.dtype is dtype and x.is_contiguous() else x.detach().to(dtype).contiguous()
    n, f = xc.shape
    if n == 0 or f == 0:
        return torch.empty((n, f), dtype=out_dtype, device=device)
    dinv = None
    if aggregator == "gcn":
        dinv = gcn_dinv if gcn_dinv is not None else _gcn_dinv(graph, device, acc)
        if dinv.dtype is not acc or dinv.device != device or not dinv.is_contiguous():
            dinv = dinv.detach().to(device=device, dtype=acc).contiguous()
        if dinv.shape != (n,):
            raise ValueError(f"gcn_dinv must have shape [{n}], got {tuple(dinv.shape)}")
    prep = _prepared(graph, xc, width, strategy, aggregator, device, split_edges, row_order, vector, cols_per_thread)
    cfg = prep.cfg
    try:
        fn = _instance(prep, dev_index, dtype)
    except Exception as exc:
        if ACC_DTYPES[dtype] == dtype:  # float32 / float64: the same source as the probe's instances
            raise KernelBuildError(f"ES-SpMM: the kernel instance for {dtype}, {prep.index_ctype} indices, "
                                   f"{cfg.cols_per_thread} columns per lane{', split rows' if prep.split else ''} "
                                   f"does not build on cuda:{dev_index} ({type(exc).__name__}: {exc})") from exc
        # a 16-bit module that does not build on this device/toolkit: float32 from now on, said once
        log.warning("ES-SpMM: the native %s kernel does not build on cuda:%d (%s: %s); computing %s inputs in "
                    "float32 instead", dtype, dev_index, type(exc).__name__, exc, dtype)
        _no_native.add((dev_index, dtype))
        return _sampled_spmm_cuda(graph, x, width, strategy, aggregator, gcn_dinv, split_edges, row_order, vector,
                                  cols_per_thread)
    stream = _current_stream(dev_index)
    if CPP_LAUNCH and FAST_LAUNCH and _fast_ok and _available:  # after the probe, which judges the Python launch
        launcher = _cpp_launcher(prep, fn, dev_index)
        if launcher is not None:
            out = launcher(xc, dinv.data_ptr() if dinv is not None else 0, stream)
            if out is not None:  # None: this thread's CUDA context is not the kernel's (the Python path binds it)
                return out if out.dtype == out_dtype else out.to(out_dtype)
    out, plan = _plan_of(prep, xc, dinv)
    _launch(fn, cfg, plan.args, dev_index, stream)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def _cpp_launcher(prep: _Prepared, fn: tuple[Any, int], device_index: int) -> Any:
    """The C++ ``Launch`` (kernels/launcher.cpp) of the prepared launch ``prep`` with the kernel instance ``fn``,
    kept in ``prep``; ``None`` while the launcher is not built (:mod:`kernels.cpp_launch`) or has not passed
    its check on the device (:func:`_cpp_checked_on`)."""
    lc = prep.launchers.get(fn[1])
    if lc is not None:
        return lc
    if cpp_launch.module() is None or not _cpp_checked_on(device_index):
        return None
    return _cpp_launch_object(prep, fn, device_index)


def _cpp_launch_object(prep: _Prepared, fn: tuple[Any, int], device_index: int) -> Any:
    """Make (once) and keep in ``prep`` its C++ ``Launch`` with the kernel instance ``fn``; ``None`` where the
    launcher is not built or the device's context cannot be found."""
    mod = cpp_launch.module()
    ctx = _context(device_index)
    if mod is None or ctx == 0:
        return None
    cfg = prep.cfg
    lc = mod.Launch(fn[1], ctx, cfg.blocks, cfg.block_threads, cfg.shared_bytes, [*prep.head, 0, 0, 0, *prep.tail],
                    prep.split, cfg.vector)
    prep.launchers[fn[1]] = lc
    return lc


def _cpp_probe_launch(g: CSRGraph, x: torch.Tensor, width: int, strategy: str, aggregator: str,
                      split_edges: int | None) -> torch.Tensor | None:
    """One of the probe's launches through the C++ launcher alone (no Python launch behind it): its output,
    or ``None`` when it declines (:func:`_cpp_checked_on`)."""
    dev_index = x.device.index
    prep = _prepared(g, x, width, strategy, aggregator, x.device, split_edges, ROW_ORDER, None)
    lc = _cpp_launch_object(prep, _instance(prep, dev_index, x.dtype), dev_index)
    return None if lc is None else lc(x, 0, _current_stream(dev_index))


#: device index -> whether the C++ launcher gave the probe's answers there (checked once per device, when it is
#: first ready; False: that device's launches stay on the Python path)
_cpp_ok: dict[int, bool] = {}


def _cpp_checked_on(device_index: int) -> bool:
    """Whether launches on ``device_index`` may go through the C++ launcher: the probe's two launches, made
    by it alone once (on that device, under the lock; other threads wait), must give the known answers. Not
    inside a CUDA graph capture or under a sync debug mode (the check reads its answers back): those calls
    take the Python path and the check waits for a later one."""
    ok = _cpp_ok.get(device_index)
    if ok is not None:
        return ok
    if torch.cuda.is_current_stream_capturing() or torch.cuda.get_sync_debug_mode() != 0:
        return False
    with _lock:
        if device_index not in _cpp_ok:
            try:
                with torch.cuda.device(device_index):
                    bad = _probe_answers(device_index, _cpp_probe_launch)
            except Exception as exc:  # a launch the driver refused: the Python path serves
                bad = f"{type(exc).__name__}: {exc}"
            if bad is not None:
                log.warning("ES-SpMM: the C++ launcher failed its check on cuda:%d (%s); launching from Python",
                            device_index, bad)
            _cpp_ok[device_index] = bad is None
    return _cpp_ok[device_index]


_contexts: dict[int, int] = {}


def _context(device_index: int) -> int:
    """The CUDA context CuPy loads the kernels of ``device_index`` in (its primary context), as an int; 0 when
    none can be bound (not memoized)."""
    ctx = _contexts.get(device_index)
    if ctx is None:
        cp = _cupy()
        with cp.cuda.Device(device_index):
            ctx = int(cp.cuda.driver.ctxGetCurrent())
            if ctx == 0:  # no context bound to this thread yet: a runtime call binds the primary one
                cp.cuda.runtime.free(0)
                ctx = int(cp.cuda.driver.ctxGetCurrent())
        if ctx == 0:
            return 0
        _contexts[device_index] = ctx
    return ctx


# ----------------------------------------------------------------------------- launching
#: the kinds of es_spmm_kernel's parameters, in order: 8 pointers, 5 long long, 5 int
ARG_KINDS = ("ptr",) * 8 + ("i64",) * 5 + ("i32",) * 5
_ARG_NP = {"ptr": np.uint64, "i64": np.int64, "i32": np.int32}
#: launch through the driver (cuLaunchKernel with a per-thread parameter block) instead of CuPy's
#: RawKernel call; the probe turns it off where it does not give the right numbers
FAST_LAUNCH = True
#: launch through the C++ launcher (kernels/launcher.cpp, built by kernels.cpp_launch) once it is built,
#: where the driver launch passed the probe; False: the Python path always
CPP_LAUNCH = True
_fast_ok = True  # the probe's verdict on the driver launch
_CUDA_ERROR_INVALID_CONTEXT = 201
_tls = threading.local()


def cupy_args(args: tuple, kinds: tuple[str, ...] = ARG_KINDS) -> tuple:
    """``args`` as the NumPy scalars CuPy's kernel call needs to know each C type (``kinds``)."""
    return tuple(_ARG_NP[k](v) for k, v in zip(kinds, args, strict=True))


def param_block(n: int = len(ARG_KINDS)) -> tuple[np.ndarray, int]:
    """This thread's ``cuLaunchKernel`` parameter block for a kernel of ``n`` parameters: ``(values,
    address)``. ``values`` is one 8-byte slot per kernel parameter (``uint64``; an ``int`` parameter reads
    the low 4 bytes of its slot, which is its value on a little-endian host); ``address`` points at the
    array of the slots' addresses, the ``kernelParams`` argument. The driver copies the parameters at
    launch, so a block is reused by every launch of its thread."""
    blocks = getattr(_tls, "params", None)
    if blocks is None:
        blocks = _tls.params = {}
    blk = blocks.get(n)
    if blk is None:
        values = np.zeros(n, dtype=np.uint64)
        base = values.ctypes.data
        slots = np.array([base + 8 * i for i in range(n)], dtype=np.uint64)
        blk = blocks[n] = (values, slots, int(slots.ctypes.data))  # slots kept alive with values
    return blk[0], blk[2]


def _current_stream(device_index: int) -> int:
    """torch's current stream on ``device_index`` as a raw handle (the private binding avoids building a
    Stream object per call; the public API where it is missing)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device_index))
    return int(torch.cuda.current_stream(device_index).cuda_stream)


def _launch(fn: tuple[Any, int], cfg: LaunchConfig, args: tuple, device_index: int, stream: int) -> None:
    """Enqueue one launch of ``es_spmm_kernel`` (``fn``) on ``stream`` (:func:`launch`)."""
    launch(fn, cfg.blocks, cfg.block_threads, cfg.shared_bytes, args, ARG_KINDS, device_index, stream)


def launch(fn: tuple[Any, int], blocks: int, threads: int, shared_bytes: int, args: tuple, kinds: tuple[str, ...],
           device_index: int, stream: int) -> None:
    """Enqueue one launch of ``fn`` (``(raw kernel, CUfunction handle)``) on ``stream`` with ``args`` (plain
    ints, of the C kinds ``kinds``: "ptr", "i64", "i32"). The driver launch fills this thread's parameter
    block and calls ``cuLaunchKernel`` (a few microseconds of host time) when the thread's current device is
    the launch's; a thread that has no CUDA context yet gets the device's primary context bound once.
    Otherwise, or with :data:`FAST_LAUNCH` off, CuPy's kernel call under the device and stream."""
    cp = _cupy()
    raw, handle = fn
    if FAST_LAUNCH and _fast_ok and sys.byteorder == "little" and cp.cuda.runtime.getDevice() == device_index:
        values, addr = param_block(len(kinds))
        values[:] = args
        driver = cp.cuda.driver
        try:
            driver.launchKernel(handle, blocks, 1, 1, threads, 1, 1, shared_bytes, stream, addr, 0)
            return
        except driver.CUDADriverError as exc:
            if getattr(exc, "status", None) != _CUDA_ERROR_INVALID_CONTEXT:
                raise
        cp.cuda.runtime.setDevice(device_index)  # binds the device's primary context to this thread
        driver.launchKernel(handle, blocks, 1, 1, threads, 1, 1, shared_bytes, stream, addr, 0)
        return
    with cp.cuda.Device(device_index), _stream(device_index, stream):
        raw((blocks,), (threads,), cupy_args(args, kinds), shared_mem=shared_bytes)


class _Plan(NamedTuple):
    """One launch of ``es_spmm_kernel``: its shape, its arguments in the kernel's order, and the
    template instance (value type from ``x``, ``index_ctype``, ``cfg.cols_per_thread``,
    ``cfg.vector``, ``split``). A tuple: built on every call (a frozen dataclass costs 0.3 us more)."""

    cfg: LaunchConfig
    args: tuple
    index_ctype: str
    split: bool
    defines: tuple[str, ...] = ()  # the instance's preprocessor definitions (SHORT_ROWS_DEFINES or none)
    #: holds the device memory ``args`` points into (the graph's arrays, the schedule) until the launch is
    #: queued, whatever the memo or the graph does meanwhile (a first launch compiles for seconds)
    keep: Any = None


@dataclass(frozen=True)
class _Prepared:
    """What a launch takes from its graph and its knobs, not from its tensors (:func:`_prepare`): the
    shape, the instance, the output's type, and the arguments around the three tensor pointers (``x``,
    ``dinv``, ``out``: positions 3 to 5 of :data:`ARG_KINDS`)."""

    cfg: LaunchConfig
    index_ctype: str
    split: bool  # rows are split: out is zeroed, of the accumulation type
    out_dtype: torch.dtype
    head: tuple  # indptr, indices, weights pointers
    tail: tuple  # schedule pointers, num_items, split_edges, n, f, width, strategy, aggregator, has_weights, G, tile
    sched: dict[str, Any] | None  # holds the schedule's device arrays while a memoized plan points into them
    tensors: dict[str, torch.Tensor]  # the graph's device arrays that head points into
    defines: tuple[str, ...]  # the instance's preprocessor definitions
    #: the C++ launches of this launch, by kernel instance handle (_cpp_launcher)
    launchers: dict[int, Any] = field(default_factory=dict, compare=False, repr=False)


PREPARED_KEPT = 256  # prepared launches memoized per device entry (all dropped when it is full)


def _prepare(graph: CSRGraph, dg: dict[str, Any], n: int, f: int, dtype: torch.dtype, width: int, strategy: str,
             aggregator: str, split_edges: int | None, row_order: str, vec: bool,
             cols_per_thread: int | None) -> _Prepared:
    """The launch of a pass over the device entry ``dg`` of ``graph``, all but its tensors; memoized in the
    entry (dropped with it when the graph's arrays are replaced, and with its schedule when that leaves the
    schedule memo; a launch in flight holds what it points into: ``_Plan.keep``). ``vec``: 128-bit loads
    asked for and ``x`` 16-byte aligned. The module's settings (SPLIT_*, SHORT_ROWS_*, HOST_SM_COUNT, the
    tile and shared-memory sizes) are read here, not on a memo hit: a benchmark that changes one drops the
    entries first (``graph.cache().pop(entry_key(device))``)."""
    key = (n, f, dtype, width, strategy, aggregator, split_edges, row_order, vec, cols_per_thread)
    memo = dg["prepared"]
    prep = memo.get(key)
    if prep is not None:
        return prep
    max_deg = dg["max_degree"]
    if width >= max_deg:
        width = 0  # no row is sampled: exact
    sched = _device_schedule(graph, dg, width, split_edges, row_order)
    vb, ab = VALUE_BYTES[dtype], VALUE_BYTES[ACC_DTYPES[dtype]]
    vec = vec and f % (16 // vb) == 0
    num_items = sched["num_items"] if sched is not None else n
    cfg = launch_config(n, f, width, max_deg, vb, dg["index_bytes"], vector=vec, num_items=num_items,
                        acc_bytes=ab, cols_per_thread=cols_per_thread)
    # Device pointers go in as 64-bit integers (a pointer parameter is 8 bytes): no DLPack round trip per
    # call. A null pointer stands for the weights of an unweighted graph, for dinv unless ``gcn`` and for
    # the schedule when no row is split: the kernel reads none of them then. Plain ints, in the order and
    # of the kinds of ARG_KINDS.
    prep = _Prepared(
        cfg=cfg,
        index_ctype=dg["index_ctype"],
        split=sched is not None,
        # split rows add into out (of the accumulation type): it starts at zero; otherwise every entry is stored
        out_dtype=ACC_DTYPES[dtype] if sched is not None else dtype,
        head=(dg["ptr_indptr"], dg["ptr_indices"], dg["ptr_weights"]),
        tail=(
            sched["ptr_row"] if sched is not None else 0,
            sched["ptr_chunk"] if sched is not None else 0,
            num_items,
            sched["split_edges"] if sched is not None else 0,
            n,
            f,
            width,
            STRATEGY_CODES[strategy],
            AGGREGATOR_CODES[aggregator],
            int(graph.weights is not None),
            cfg.group_size,
            cfg.tile,
        ),
        sched=sched,
        tensors=dg["tensors"],
        defines=SHORT_ROWS_DEFINES if (sched is not None and dtype == torch.float32
                                       and sched["mean_kept"] <= SHORT_ROWS_MEAN
                                       and cfg.blocks >= SHORT_ROWS_WAVES * 4 * _sm_count(dg)) else (),
    )
    with _lock:
        if len(memo) >= PREPARED_KEPT:
            memo.clear()
        memo[key] = prep
    return prep


_sm_counts: dict[torch.device, int] = {}


def _sm_count(entry: dict[str, Any]) -> int:
    """Streaming multiprocessors of the device a device entry lives on (:data:`HOST_SM_COUNT` on the CPU)."""
    device = entry["tensors"]["indptr"].device
    n = _sm_counts.get(device)
    if n is None:
        n = _sm_counts[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                                  if device.type == "cuda" else HOST_SM_COUNT)
    return n


def _prepared(graph: CSRGraph, xc: torch.Tensor, width: int, strategy: str, aggregator: str, device: torch.device,
              split_edges: int | None, row_order: str, vector: bool | None,
              cols_per_thread: int | None = None) -> _Prepared:
    """:func:`_prepare` for a pass over ``xc`` (contiguous ``[N, F]``, N, F > 0, in one of the kernel's value
    types, on ``device``): the graph's device entry there, and 128-bit loads where asked for and aligned."""
    n, f = xc.shape
    dg = _device_graph(graph, device)
    vec = (VECTOR if vector is None else bool(vector)) and xc.data_ptr() & 15 == 0
    return _prepare(graph, dg, n, f, xc.dtype, width, strategy, aggregator, split_edges, row_order, vec,
                    cols_per_thread)


def _plan_of(prep: _Prepared, xc: torch.Tensor, dinv: torch.Tensor | None) -> tuple[torch.Tensor, _Plan]:
    """The output (``xc``'s type, or the accumulation type zeroed when rows are split: the caller narrows it)
    and the arguments of the prepared launch ``prep`` over ``xc``; ``dinv`` (``gcn``) in the accumulation
    type. This is the specification of the C++ launcher's ``Launch`` (kernels/launcher.cpp)."""
    out = torch.zeros_like(xc, dtype=prep.out_dtype) if prep.split else torch.empty_like(xc)
    out_ptr = out.data_ptr()
    if prep.cfg.vector and out_ptr & 15:  # a fresh tensor from torch's allocators is aligned far more
        raise RuntimeError(f"ES-SpMM: torch allocated an output at {out_ptr:#x}, not 16-byte aligned")
    args = (*prep.head, xc.data_ptr(), dinv.data_ptr() if dinv is not None else 0, out_ptr, *prep.tail)
    return out, _Plan(prep.cfg, args, prep.index_ctype, prep.split, prep.defines, prep)


def _plan(graph: CSRGraph, xc: torch.Tensor, width: int, strategy: str, aggregator: str, dinv: torch.Tensor | None,
          device: torch.device, split_edges: int | None, row_order: str,
          vector: bool | None, cols_per_thread: int | None = None) -> tuple[torch.Tensor, _Plan]:
    """Everything of a launch but the launch: the graph's device entry and schedule (on ``device``),
    the output tensor (zeroed when rows are split), the shape and the argument tuple (:func:`_prepared`,
    :func:`_plan_of`). Separate from :func:`sampled_spmm_cuda` so that the tests can run it on the CPU and
    hand the arguments to the host emulation of the kernel."""
    prep = _prepared(graph, xc, width, strategy, aggregator, device, split_edges, row_order, vector, cols_per_thread)
    return _plan_of(prep, xc, dinv)


def available() -> bool:
    """Whether the CUDA path can run here (decided once per process, then cached).

    True when CuPy imports, torch sees a CUDA device, and a launch on a 3-node graph gives the
    numbers the specification gives. Setting ``GNNSERVE_DISABLE_CUDA_SPMM=1`` forces False.
    """
    global _available, _why
    if _available is not None:
        return _available
    with _lock:
        if _available is None:
            ok, why = _probe()
            _available, _why = ok, why
            if ok:
                log.info("ES-SpMM CUDA kernel available (%s)", why)
            else:
                log.debug("ES-SpMM CUDA kernel not used: %s; the torch path serves every call", why)
    return _available


def status() -> tuple[bool, str]:
    """``(available(), why)``: the probe's verdict and its reason, for messages a user acts on."""
    ok = available()
    return ok, _why


def _probe_answers(device_index: int, run: Any = None) -> str | None:
    """Two launches on ``cuda:<device_index>`` whose answers are known: ``None`` when both give them, else what
    went wrong. ``run(graph, x, width, strategy, aggregator, split_edges)`` makes a launch (default: the
    public call); ``None`` from it means it declined, which fails the check. Rows: 0 -> {1, 2} weights
    {1, 3}; 1 -> {0}; 2 -> {}; width 1 keeps edge 0 of row 0, scale 2. F = 4: 128-bit loads. The exact pass
    with split_edges=1 cuts row 0 into two chunks that add into out: it compiles and checks a split instance
    too (the other instances are the same source with other template arguments, compiled on their first
    launch; tests compile them all with nvcc)."""
    if run is None:
        def run(g, x, width, strategy, aggregator, split_edges):
            return sampled_spmm_cuda(g, x, width, strategy, aggregator, split_edges=split_edges)
    g = CSRGraph(
        indptr=np.array([0, 2, 3, 3], dtype=np.int64),
        indices=np.array([1, 2, 0], dtype=np.int32),
        weights=np.array([1.0, 3.0, 2.0], dtype=np.float32),
    )
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]],
                     device=torch.device("cuda", device_index))
    for (width, strategy, split_edges), want in (
        ((1, "bucket", None), [[10, 12, 14, 16], [2, 4, 6, 8], [0, 0, 0, 0]]),
        ((0, "fastrand", 1), [[32, 36, 40, 44], [2, 4, 6, 8], [0, 0, 0, 0]]),
    ):
        got = run(g, x, width, strategy, "sum", split_edges)
        if got is None:
            return "the launch was declined"
        if not torch.equal(got.cpu(), torch.tensor(want, dtype=torch.float32)):
            return f"probe launch gave {got.cpu().tolist()}, expected {want}"
    return None


def _probe() -> tuple[bool, str]:
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        return False, f"disabled by {DISABLE_ENV}"
    if _bad_defines:
        return False, (f"{DEFINES_ENV} has entries that are not ES_SPMM_<NAME>=<integer>: {_bad_defines}; fix or "
                       "unset it")
    try:
        _cupy()
    except Exception as exc:  # ImportError, or a CuPy that cannot find its CUDA libraries
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        if not torch.cuda.is_available():
            return False, "torch sees no CUDA device"
        cp = _cupy()
        if cp.cuda.runtime.getDeviceCount() < 1:
            return False, "CuPy sees no CUDA device"
        def wrong() -> str | None:
            return _probe_answers(torch.cuda.current_device())

        global _fast_ok
        try:
            bad = wrong()
        except Exception as exc:  # judged below: the CuPy launch decides
            bad = f"{type(exc).__name__}: {exc}"
        if bad is not None and FAST_LAUNCH and _fast_ok:
            # the driver launch is the newer of the two: without it, CuPy's kernel call (slower, proven)
            log.warning("ES-SpMM: the driver launch failed its probe (%s); launching through CuPy", bad)
            _fast_ok = False
            bad = wrong()
        if bad is not None:
            return False, bad
        how = "driver launch" if FAST_LAUNCH and _fast_ok else "CuPy launch"
        return True, f"CuPy {cp.__version__} on {torch.cuda.get_device_name()}, {how}"
    except Exception as exc:  # compilation or launch failure: fall back to torch, say why once
        log.info("ES-SpMM CUDA probe failed: %s: %s", type(exc).__name__, exc)
        return False, f"probe failed ({type(exc).__name__})"
