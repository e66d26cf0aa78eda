r"""CUDA path of ES-SpMM: the kernel in ``es_spmm.cu`` launched through CuPy on torch tensors.

:func:`sampled_spmm_cuda` computes exactly the operation specified in :mod:`kernels.spmm` (same
positions, same rescaling, same ``gcn`` self term) for a float tensor ``x`` ``[N, F]`` on a CUDA
device, and returns ``[N, F]`` on that device. It does not record autograd history: the dispatcher
:func:`kernels.spmm.sampled_spmm` sends anything that needs a gradient to the torch path.

Mechanics:

* CuPy is imported lazily (never at import time of :mod:`kernels`), and :func:`available` decides
  once per process whether the path can be used: CuPy imports, torch sees a CUDA device, and a tiny
  launch gives the expected numbers. On a CPU-only machine it returns ``False`` after one debug log.
* ``es_spmm.cu`` is compiled through ``cupy.RawModule`` (NVRTC) once per (device, dtype), with the
  template instances named by ``name_expressions``: value type float/double x index type int/long
  long x columns per thread 1/2/4/8. float16/bfloat16 inputs are computed in float32.
* The graph's arrays move to the device once and stay memoized in ``graph.cache()`` under
  ``"cuda_spmm:<device>"`` (indptr int64, indices in the graph's int32/int64, weights float32).
* The kernel takes the torch tensors' device pointers as 64-bit arguments (no copies, and no DLPack
  conversion per call), and runs on torch's current CUDA stream (a memoized CuPy view of it), so it
  is ordered with the surrounding torch work without any synchronisation. A request-sized call costs
  about 55 us of host time on the H100 machine, against 32 us for ``torch.sparse.mm``
  (``benchmarks/kernels.py``, docs/BENCHMARKS.md).

Launch shape (:func:`launch_config`): a group of ``G`` lanes (power of two, 4..32, inside one warp)
per row, each lane owning ``CPT`` feature columns per pass (``G * CPT`` columns a pass, any ``F``
through several passes); 256 threads a block unless shared memory asks for fewer. The shared-memory
stage of a row holds ``tile`` (column, coefficient) pairs: ``tile = min(S, 256, max degree)`` when
sampling (the whole sample of a row fits: ES-SpMM's cache-first idea), ``min(128, max degree)`` in
exact mode, where rows stream through the stage tile by tile.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .graph import CSRGraph

__all__ = [
    "COLS_PER_THREAD",
    "KERNEL_SOURCE",
    "LaunchConfig",
    "available",
    "kernel_name",
    "launch_config",
    "sampled_spmm_cuda",
    "shared_bytes",
]

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("es_spmm.cu")
COLS_PER_THREAD = (1, 2, 4, 8)
INDEX_CTYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}
VALUE_CTYPES = {torch.float32: "float", torch.float64: "double"}
VALUE_BYTES = {torch.float32: 4, torch.float64: 8}
STRATEGY_CODES = {"fastrand": 0, "bucket": 1}
AGGREGATOR_CODES = {"sum": 0, "mean": 1, "gcn": 2}

MAX_BLOCK_THREADS = 256  # matches __launch_bounds__ in es_spmm.cu
MAX_TILE = 256  # widest sample staged whole; wider ones are staged in tiles of this size
EXACT_TILE = 128  # stage size when a row is streamed (exact mode)
SHARED_BUDGET = 24 * 1024  # per block: keeps several blocks resident per SM on every arch >= sm_70
SHARED_LIMIT = 48 * 1024  # the dynamic shared memory a launch may take without opting in
DISABLE_ENV = "GNNSERVE_DISABLE_CUDA_SPMM"


# ----------------------------------------------------------------------------- launch shape
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
    """

    cols_per_thread: int
    group_size: int
    tile: int
    block_threads: int
    groups_per_block: int
    blocks: int
    shared_bytes: int


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def shared_bytes(groups_per_block: int, tile: int, value_bytes: int, index_bytes: int) -> int:
    """Dynamic shared memory of a block: the layout of ``es_spmm.cu`` (coefficients padded to 16
    bytes, then indices; ``tile + 1`` entries per group)."""
    values = groups_per_block * (tile + 1) * value_bytes
    values = (values + 15) // 16 * 16
    return values + groups_per_block * (tile + 1) * index_bytes


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
) -> LaunchConfig:
    """Pick the launch shape for ``num_rows`` rows of ``num_features`` columns.

    ``CPT`` is the smallest power of two (<= 8) with ``32 * CPT >= F``; ``G`` the smallest power of
    two (4..32) with ``G * CPT >= F``; so ``F <= 256`` runs in one pass. ``tile`` defaults to
    ``min(S, 256)`` when sampling (``S = width > 0``), 128 in exact mode, never above the largest
    row (at least 1). Warps per block halve from 8 until the stages fit :data:`SHARED_BUDGET`.
    """
    f = max(1, int(num_features))
    cpt = min(8, _next_pow2(math.ceil(f / 32)))
    g = min(32, max(4, _next_pow2(math.ceil(f / cpt))))
    if tile is None:
        tile = min(int(width), MAX_TILE) if width > 0 else EXACT_TILE
        tile = min(tile, int(max_degree))
    tile = max(1, int(tile))
    warps = MAX_BLOCK_THREADS // 32
    while warps > 1 and shared_bytes(warps * (32 // g), tile, value_bytes, index_bytes) > SHARED_BUDGET:
        warps //= 2
    gpb = warps * (32 // g)
    smem = shared_bytes(gpb, tile, value_bytes, index_bytes)
    if smem > SHARED_LIMIT:
        raise ValueError(f"stage of {tile} entries needs {smem} bytes of shared memory, above {SHARED_LIMIT}")
    blocks = max(1, min(int(max_blocks), math.ceil(max(int(num_rows), 1) / gpb)))
    return LaunchConfig(cpt, g, tile, warps * 32, gpb, blocks, smem)


def kernel_name(value_ctype: str, index_ctype: str, cols_per_thread: int) -> str:
    """The template instance as NVRTC names it (a ``name_expressions`` entry)."""
    return f"es_spmm::es_spmm_kernel<{value_ctype}, {index_ctype}, {cols_per_thread}>"


@cache
def kernel_source() -> str:
    return KERNEL_SOURCE.read_text()


# ----------------------------------------------------------------------------- CuPy state
_lock = threading.RLock()
_modules: dict[tuple[int, torch.dtype], Any] = {}  # (device index, value dtype) -> cupy.RawModule
_kernels: dict[tuple[int, torch.dtype, str, int], Any] = {}
_streams: dict[tuple[int, int], Any] = {}  # (device index, torch stream handle) -> CuPy stream
_available: bool | None = None
_why = ""  # the probe's reason, with _available


def _cupy() -> Any:
    import cupy  # optional dependency: imported on first GPU use only

    return cupy


def _kernel(device_index: int, dtype: torch.dtype, index_ctype: str, cpt: int) -> Any:
    """The compiled kernel for one (device, dtype, index type, CPT); modules built once per (device, dtype)."""
    key = (device_index, dtype, index_ctype, cpt)
    fn = _kernels.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _kernels.get(key)
        if fn is not None:
            return fn
        cp = _cupy()
        mod = _modules.get((device_index, dtype))
        names = [kernel_name(VALUE_CTYPES[dtype], ic, c) for ic in INDEX_CTYPES.values() for c in COLS_PER_THREAD]
        with cp.cuda.Device(device_index):
            if mod is None:
                mod = cp.RawModule(code=kernel_source(), options=("-std=c++17",), name_expressions=names)
                _modules[(device_index, dtype)] = mod
                log.debug("compiling %s for cuda:%d %s", KERNEL_SOURCE.name, device_index, dtype)
            fn = mod.get_function(kernel_name(VALUE_CTYPES[dtype], index_ctype, cpt))
        _kernels[key] = fn
        return fn


def _upload(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    with warnings.catch_warnings():
        # memory-mapped graphs are read-only; the host view is only read, to copy it to the device
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.from_numpy(np.ascontiguousarray(arr)).to(device)


def _device_graph(graph: CSRGraph, device: torch.device) -> dict[str, Any]:
    """The graph's CSR arrays on ``device`` as torch tensors and their device pointers; memoized on the graph."""
    key = f"cuda_spmm:{device}"
    cache_ = graph.cache()
    entry = cache_.get(key)
    if entry is not None:
        return entry
    with _lock:
        entry = cache_.get(key)
        if entry is not None:
            return entry
        tensors = {
            "indptr": _upload(graph.indptr.astype(np.int64, copy=False), device),
            "indices": _upload(graph.indices, device),
        }
        if graph.weights is not None:
            tensors["weights"] = _upload(graph.weights.astype(np.float32, copy=False), device)
        entry = {
            "tensors": tensors,  # owns the device memory the pointers below point into
            "ptr_indptr": np.uint64(tensors["indptr"].data_ptr()),
            "ptr_indices": np.uint64(tensors["indices"].data_ptr()),
            "ptr_weights": np.uint64(tensors["weights"].data_ptr() if "weights" in tensors else 0),
            "index_ctype": INDEX_CTYPES[np.dtype(graph.indices.dtype)],
            "index_bytes": int(graph.indices.dtype.itemsize),
            "max_degree": int(graph.degrees.max()) if graph.num_nodes else 0,
        }
        cache_[key] = entry
        return entry


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
) -> torch.Tensor:
    """ES-SpMM on the GPU: ``out = A_S x`` with the formulas of :mod:`kernels.spmm`.

    Args:
        graph: the adjacency, ``N`` rows (host arrays; copied to the device once and memoized).
        x: ``[N, F]`` floating tensor on a CUDA device (float32/float64 natively; float16 and
            bfloat16 are computed in float32 and cast back). Must not require a gradient.
        width: sampling width ``S``; ``None`` or 0 = exact.
        strategy: ``"fastrand"`` or ``"bucket"``.
        aggregator: ``"sum"``, ``"mean"`` or ``"gcn"``.
        gcn_dinv: ``gcn`` only: ``D^{-1/2}`` ``[N]`` (default: from the graph's own degrees, ``D_i =
            1 + sum_j w_ij``).

    Returns:
        ``[N, F]`` tensor of ``x``'s dtype on ``x``'s device, written on torch's current stream.
    """
    from .spmm import _check_args, _gcn_dinv  # spmm imports this module lazily

    width = _check_args(graph, x, width, strategy, aggregator)
    if not x.is_cuda:
        raise ValueError(f"sampled_spmm_cuda needs a CUDA tensor, got one on {x.device}")
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError("sampled_spmm_cuda records no gradient: call kernels.sampled_spmm for autograd")
    out_dtype = x.dtype
    dtype = x.dtype if x.dtype in VALUE_CTYPES else torch.float32
    xc = x.detach().to(dtype).contiguous()
    n, f = xc.shape
    out = torch.empty((n, f), dtype=dtype, device=x.device)
    if n == 0 or f == 0:
        return out.to(out_dtype)
    device = x.device
    dev_index = device.index if device.index is not None else torch.cuda.current_device()
    dg = _device_graph(graph, torch.device("cuda", dev_index))
    max_deg = dg["max_degree"]
    if width >= max_deg:
        width = 0  # no row is sampled: exact
    dinv = None
    if aggregator == "gcn":
        dinv = gcn_dinv if gcn_dinv is not None else _gcn_dinv(graph, device, dtype)
        dinv = dinv.detach().to(device=device, dtype=dtype).contiguous()
        if dinv.shape != (n,):
            raise ValueError(f"gcn_dinv must have shape [{n}], got {tuple(dinv.shape)}")
    cfg = launch_config(n, f, width, max_deg, VALUE_BYTES[dtype], dg["index_bytes"])
    fn = _kernel(dev_index, dtype, dg["index_ctype"], cfg.cols_per_thread)
    cp = _cupy()
    # Device pointers go in as 64-bit scalars (a pointer parameter is 8 bytes): no DLPack round trip per
    # call. A null pointer stands for the weights of an unweighted graph and for dinv unless ``gcn``: the
    # kernel reads neither then.
    args = (
        dg["ptr_indptr"],
        dg["ptr_indices"],
        dg["ptr_weights"],
        np.uint64(xc.data_ptr()),
        np.uint64(dinv.data_ptr() if dinv is not None else 0),
        np.uint64(out.data_ptr()),
        np.int64(n),
        np.int64(f),
        np.int64(width),
        np.int32(STRATEGY_CODES[strategy]),
        np.int32(AGGREGATOR_CODES[aggregator]),
        np.int32(graph.weights is not None),
        np.int32(cfg.group_size),
        np.int32(cfg.tile),
    )
    with cp.cuda.Device(dev_index), _stream(dev_index, torch.cuda.current_stream(device).cuda_stream):
        fn((cfg.blocks,), (cfg.block_threads,), args, shared_mem=cfg.shared_bytes)
    return out if dtype == out_dtype else out.to(out_dtype)


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


def _probe() -> tuple[bool, str]:
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        return False, f"disabled by {DISABLE_ENV}"
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
        # rows: 0 -> {1, 2} weights {1, 3}; 1 -> {0}; 2 -> {} ; width 1 keeps edge 0 of row 0, scale 2
        g = CSRGraph(
            indptr=np.array([0, 2, 3, 3], dtype=np.int64),
            indices=np.array([1, 2, 0], dtype=np.int32),
            weights=np.array([1.0, 3.0, 2.0], dtype=np.float32),
        )
        x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device="cuda")
        got = sampled_spmm_cuda(g, x, 1, "bucket", "sum").cpu()
        want = torch.tensor([[6.0, 8.0], [2.0, 4.0], [0.0, 0.0]])
        if not torch.equal(got, want):
            return False, f"probe launch gave {got.tolist()}, expected {want.tolist()}"
        return True, f"CuPy {cp.__version__} on {torch.cuda.get_device_name()}"
    except Exception as exc:  # compilation or launch failure: fall back to torch, say why once
        log.info("ES-SpMM CUDA probe failed: %s: %s", type(exc).__name__, exc)
        return False, f"probe failed ({type(exc).__name__})"
