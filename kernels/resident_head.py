r"""A resident plain model's last layer in one kernel launch, answers straight into mapped host memory.

:class:`kernels.resident.ResidentPlain` answers a batch with a dozen torch operators on the device
(slot gathers, the aggregation, the classifier, softmax, arg-max, packing) between an upload of the ids
and a copy back: on the H200 a one-target batch cost 0.145 ms against 0.081 on the compiled CPU path,
almost all of it per-operator launch and device time, not work (issue #22's one-node target).
``resident_head.cu`` does the whole of :meth:`ResidentPlain.forward` and :meth:`ResidentPlain.pack` in one
launch, one block per target, for every width (the exact width too: a block walks its target's kept
edges, so the host's slot count is not needed). Its specification is that torch code, which stays the
path wherever this one is not used; tests compare the two on random graphs on a GPU.

The ids and the packed answers live in page-locked host memory mapped into the device's address space
(``cudaHostAllocMapped``): the host writes the ids where the kernel reads them and reads the answers
where the kernel wrote them, so a batch is one launch and one stream synchronisation, with no copy
enqueued either way. The launch goes through :func:`kernels.spmm_cuda.launch` (the driver call with a
per-thread parameter block) on torch's current stream, ordered after whatever torch work built the
tables.

:func:`create` returns ``None`` (and says why once, in the log) where this cannot run: no CUDA device,
CuPy missing or failing (or ``GNNSERVE_DISABLE_CUDA_SPMM=1``, which turns off every CuPy kernel), tensors
not float32, or a hidden width too wide for the block's shared memory. A batch whose launch fails is
answered by the torch operators, which serve that model from then on (:meth:`ResidentPlain.answer`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import spmm_cuda

__all__ = ["KERNEL_SOURCE", "MappedBuffer", "MappedIO", "ResidentHead", "create", "kernel_tensors", "launch_shape",
           "nvrtc_code", "packed_floats", "synchronize"]

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("resident_head.cu")
#: what the one-launch kernels share (the CUDA / host switch, intrinsics with host twins): NVRTC gets its text
#: in front of a kernel's, so that CuPy's cache is keyed on it too
HELPERS_SOURCE = Path(__file__).with_name("device_helpers.cuh")
#: the kernel's parameters, in order: 12 pointers, 4 ints
ARG_KINDS = ("ptr",) * 12 + ("i32",) * 4
#: shared memory a block may take (the default limit without opting in to more is 48 KiB)
SHARED_LIMIT = 48 * 1024
#: the most warps a block uses (they split a target's kept edges)
MAX_WARPS = 8

_lock = threading.Lock()
#: (device index, source, kernel name, shared-memory opt-in) -> (raw kernel, CUfunction handle)
_functions: dict[tuple[int, str, str, int], tuple[Any, int]] = {}


def launch_shape(hidden: int, classes: int, limit: int = SHARED_LIMIT) -> tuple[int, int] | None:
    """``(threads per block, shared bytes)`` for ``hidden`` features and ``classes`` outputs: as many
    warps (up to :data:`MAX_WARPS`) as fit their partial rows in ``limit`` bytes; None when one does not."""
    fixed = 4 * (hidden + classes)
    warps = min(MAX_WARPS, (limit - fixed) // (4 * hidden)) if hidden > 0 else 0
    if warps < 1:
        return None
    return 32 * warps, fixed + 4 * hidden * warps


def packed_floats(b: int, classes: int, hidden: int, kept: bool, want_emb: bool) -> int:
    """Float32 entries of the packed answers of ``b`` targets (:meth:`ResidentPlain.pack`'s layout)."""
    return b * classes + b + (2 * b if kept else 0) + (b * hidden if want_emb else 0)


def nvrtc_code(source: Path) -> str:
    """What NVRTC compiles for the kernel file ``source``: :data:`HELPERS_SOURCE`'s text, then the file's
    (its line numbers restored for NVRTC's messages)."""
    return f'{HELPERS_SOURCE.read_text()}#line 1 "{source.name}"\n{source.read_text()}'


def _function(device_index: int, source: Path = KERNEL_SOURCE, name: str = "resident_head",
              max_shared: int = 0) -> tuple[Any, int]:
    """The kernel ``name`` of the CUDA file ``source`` (after :data:`HELPERS_SOURCE`: :func:`nvrtc_code`),
    compiled once per device (NVRTC through CuPy). ``max_shared`` > 0: its launches may take that much dynamic
    shared memory (the opt-in beyond 48 KiB, set on this device's copy of the function: CuPy resolves a
    kernel per current device)."""
    key = (device_index, str(source), name, max_shared)
    fn = _functions.get(key)
    if fn is None:
        with _lock:
            fn = _functions.get(key)
            if fn is None:
                cp = spmm_cuda._cupy()
                with cp.cuda.Device(device_index):
                    mod = cp.RawModule(code=nvrtc_code(source), options=("-std=c++17",))
                    raw = mod.get_function(name)
                    if max_shared > 0:
                        raw.max_dynamic_shared_size_bytes = max_shared
                    fn = _functions[key] = (raw, int(raw.kernel.ptr))
    return fn


def synchronize(stream: int) -> None:
    """Wait for ``stream`` (a raw handle, of the thread's current device): the batch's answers are then in
    the mapped output."""
    spmm_cuda._cupy().cuda.runtime.streamSynchronize(stream)


class MappedBuffer:
    """Page-locked host memory mapped into the device's address space: ``array`` (NumPy, on the host)
    and ``device_ptr`` (the same bytes, for a kernel). Freed with the object."""

    def __init__(self, count: int, dtype: np.dtype | type, device_index: int) -> None:
        cp = spmm_cuda._cupy()
        rt = cp.cuda.runtime
        dtype = np.dtype(dtype)
        nbytes = max(int(count), 1) * dtype.itemsize
        with cp.cuda.Device(device_index):
            self._ptr = int(rt.hostAlloc(nbytes, rt.hostAllocMapped | rt.hostAllocPortable))
            try:
                self.device_ptr = int(rt.pointerGetAttributes(self._ptr).devicePointer)
            except Exception:
                rt.freeHost(self._ptr)
                raise
        self._free = rt.freeHost
        self.array = np.frombuffer((ctypes.c_char * nbytes).from_address(self._ptr), dtype=dtype)

    def __len__(self) -> int:
        return len(self.array)

    def __del__(self) -> None:
        ptr, self._ptr = getattr(self, "_ptr", 0), 0
        if ptr:
            self.array = None  # type: ignore[assignment]
            try:
                self._free(ptr)
            except Exception:  # interpreter shutdown: the process's memory goes anyway
                pass


class MappedIO:
    """A fused kernel's mapped ids and answers (:class:`MappedBuffer`), grown by powers of two as batches
    need, and its launch-and-wait. Not thread-safe: the caller holds its model's lock."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self._ids: MappedBuffer | None = None
        self._out: MappedBuffer | None = None

    def buffers(self, b: int, floats: int) -> tuple[MappedBuffer, MappedBuffer]:
        """The ids buffer (at least ``b`` entries) and the answers buffer (at least ``floats``)."""
        from .resident import bucket_of

        if self._ids is None or len(self._ids) < b:
            self._ids = MappedBuffer(max(bucket_of(b), 64), np.int64, self.device_index)
        if self._out is None or len(self._out) < floats:  # grown by powers of two: few reallocations
            self._out = MappedBuffer(max(bucket_of(floats), 1 << 14), np.float32, self.device_index)
        return self._ids, self._out

    def run(self, fn: tuple[Any, int], blocks: int, threads: int, shared_bytes: int, args: tuple,
            kinds: tuple[str, ...]) -> None:
        """Launch ``fn`` on torch's current stream of the buffers' device and wait for it: its answers are
        then in the mapped output."""
        cp = spmm_cuda._cupy()
        # the launch and the wait on the model's device: torch's default stream (handle 0) is the current
        # device's, and a worker thread's current device is 0 unless set
        with contextlib.nullcontext() if cp.cuda.runtime.getDevice() == self.device_index else cp.cuda.Device(
                self.device_index):
            stream = spmm_cuda._current_stream(self.device_index)
            spmm_cuda.launch(fn, blocks, threads, shared_bytes, args, kinds, self.device_index, stream)
            synchronize(stream)


class ResidentHead:
    """One resident plain model's fused last layer (module docstring). Not thread-safe: the caller holds
    the model's lock (its mapped buffers are shared)."""

    def __init__(self, resident: Any, device_index: int, shape: tuple[int, int]) -> None:
        self.r = resident
        self.device_index = device_index
        self.threads, self.shared_bytes = shape
        self.fn = _function(device_index)
        self.io = MappedIO(device_index)
        self.launches = 0

    def answer(self, targets: np.ndarray, width: int, want_emb: bool) -> np.ndarray:
        """The packed answers of ``targets`` at ``width`` (its table held): a copy of the mapped output."""
        r = self.r
        b = len(targets)
        ts = kernel_tensors(r, width)
        floats = packed_floats(b, r.num_classes, r.hidden, ts["kept2"] is not None, want_emb)
        ids, out = self.io.buffers(b, floats)
        ids.array[:b] = targets
        args = (ids.device_ptr, *(0 if ts[n] is None else ts[n].data_ptr() for n in TENSOR_ARGS), out.device_ptr,
                b, r.hidden, r.num_classes, int(bool(want_emb)))
        self.io.run(self.fn, b, self.threads, self.shared_bytes, args, ARG_KINDS)
        self.launches += 1
        return out.array[:floats].copy()


#: the kernel's tensor parameters between ``ids`` and ``out``, in order (:func:`kernel_tensors`)
TENSOR_ARGS = ("h", "crow", "col", "coef", "k", "dinv", "kept2", "w_agg", "w_self", "bias")


def kernel_tensors(r: Any, width: int) -> dict[str, torch.Tensor | None]:
    """What the kernel reads of ``r`` (a :class:`kernels.resident.ResidentPlain`) at ``width``: the width's
    first-layer table and kept edges, GCN's ``dinv`` (None for GraphSAGE), the 2-layer kept counts (None at
    the exact width), the classifier's weights applied to the aggregate and to the target's own row (None
    for GCN), the bias. The launch passes their pointers; the host emulation in the tests their arrays."""
    c = r._csr[width]
    w_agg, w_self = (r._w[0], None) if r.gcn else (r._w[1], r._w[0])
    return {"h": r._tables[width], "crow": c.crow, "col": c.col, "coef": c.coef, "k": c.k,
            "dinv": r.dinv if r.gcn else None, "kept2": c.kept2 if width else None, "w_agg": w_agg,
            "w_self": w_self, "bias": r._b}


def create(resident: Any) -> ResidentHead | None:
    """The fused last layer of ``resident`` (a :class:`kernels.resident.ResidentPlain`), or None where it
    cannot run (the reason logged)."""
    why = None
    dev = resident.device
    shape = launch_shape(resident.hidden, resident.num_classes)
    tensors = [*resident._w, resident._b] + ([resident.dinv] if resident.gcn else [])
    if dev.type != "cuda":
        why = "it needs a CUDA device"
    elif not spmm_cuda.available():
        why = f"the CUDA kernels are not available ({spmm_cuda.status()[1]})"
    elif any(t.dtype != torch.float32 or not t.is_contiguous() for t in tensors):
        why = "it computes float32 models"
    elif shape is None:
        why = f"{resident.hidden} hidden features do not fit a block's shared memory"
    if why is None:
        try:
            return ResidentHead(resident, dev.index if dev.index is not None else torch.cuda.current_device(), shape)
        except Exception as exc:  # compilation or mapped memory: the torch operators serve
            why = f"{type(exc).__name__}: {exc}"
    log.info("resident path: the fused last layer is not used (%s); torch operators serve its batches", why)
    return None
