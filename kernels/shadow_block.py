r"""A resident shaDow-GNN batch in one kernel launch: one block per target, its subgraph in shared memory.

:class:`kernels.resident.ResidentShadow` answers a batch with about sixty torch operators on the device
(gathers of the lists and pairs, scatters into dense ``[B, K', K']`` blocks, one batched product per
layer, the readout, softmax, arg-max, packing): on the H200 one target waited 241 us for them (CUDA graphs
included) against 103 us for the whole compiled CPU path, so batches under 8 targets stayed on the CPU
(issue #22, "shaDow: one block per target with its subgraph in shared memory"). ``shadow_block.cu`` does
all of :meth:`ResidentShadow.forward` and :meth:`ResidentShadow.pack` in one launch: a block finds its
target's rows and kept pairs in the induced table, keeps the subgraph, its coefficients and two ``[K', H]``
activation buffers in shared memory through every layer, and writes the packed answers. Its
specification is that torch code; tests run the kernel's own thread code on the CPU against it
(``tests/shadow_block_host_harness.cpp``) and, on a GPU, the launch against it.

The ids and answers go through mapped host memory (:class:`kernels.resident_head.MappedIO`): a batch is
one launch and one stream synchronisation.

:func:`create` returns ``None`` (saying why once, in the log; asked for, a RuntimeError that says it) where
this cannot run: no CUDA device, the CUDA kernels off or failing, a model that is not float32, more than two
pools -- or where its first launch on a few targets does not give the torch operators' answers (the check
runs once, when the model becomes resident). A batch whose shared memory would exceed the device's limit (a
large budget at the exact width on a wide model) takes the torch operators; a batch whose launch fails is
answered by them, which serve the model from then on (:meth:`ResidentShadow.answer`), unless the failure
left the CUDA context unusable (:func:`kernels.resident.device_lost`): then the error goes up to the runtime.

It is a resident shaDow model's default on a GPU (:data:`DEFAULT_ON`; ``--no-fused-shadow`` turns it off,
``--fused-shadow`` requires it): on an H100 on 2026-11-27 it answered every batch size faster than the CUDA
graphs of the torch operators it replaces, and passed compute-sanitizer's memcheck, racecheck and synccheck.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import resident_head, spmm_cuda

__all__ = ["DEFAULT_ON", "KERNEL_SOURCE", "ShadowBlock", "block_bytes", "capacity", "create", "launch_shape",
           "model_tensors", "packed_floats", "pointer_args", "scalars", "shared_bytes"]

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("shadow_block.cu")
KERNEL_NAME = "shadow_block_kernel"
#: the kernel's parameters, in order: 13 pointers (:data:`PTR_ARGS`), 13 ints (:data:`INT_ARGS`, :func:`scalars`)
PTR_ARGS = ("ids", "lptr", "lnodes", "eptr", "src", "dst", "ew", "p", "wt", "bias", "wc", "bc", "out")
INT_ARGS = ("B", "K", "width", "fastrand", "gcn", "layers", "H", "C", "pool0", "pool1", "cap", "want_emb",
            "scratch")
ARG_KINDS = ("ptr",) * len(PTR_ARGS) + ("i32",) * len(INT_ARGS)
#: threads per block (the kernel's __launch_bounds__)
THREADS = 256
#: rows GraphSAGE transforms per pass where all of a block's rows do not fit :data:`SHARED_LIMIT`
SCRATCH_ROWS = 8
POOL_CODES = {"mean": 1, "max": 2}
#: dynamic shared memory a launch may take without opting in (more where the device allows it)
SHARED_LIMIT = 48 * 1024
#: whether a resident shaDow model on a GPU uses the kernel unless told (``--fused-shadow`` /
#: ``--no-fused-shadow``). On, from an H100 on 2026-11-27 (docs/BENCHMARKS.md, "GPU: an H100 machine,
#: 2026-11-27"; ``benchmarks/device_split.py``, Amazon Computers, shaDow-GCN): ms per batch against the CUDA
#: graphs of the torch operators, 0.266 / 0.758 for one target, 0.261 / 0.626 for 8, 0.367 / 1.247 for 1,024
#: at the default width, 0.166 / 0.353 and 0.450 / 1.394 at the exact width
DEFAULT_ON = True
#: (width, budget) launch shapes a kernel memoizes (all dropped when full)
SHAPES_KEPT = 256
#: targets of the check at creation, and its tolerance on probabilities
CHECK_TARGETS = 8
CHECK_RTOL, CHECK_ATOL = 1e-4, 1e-6


def shared_bytes(k: int, hidden: int, classes: int, emb: int, cap: int, scratch: int) -> int:
    """Dynamic shared memory of a block (the layout in ``shadow_block.cu``): per-row arrays, the kept
    pairs, two ``[k, hidden]`` buffers, GraphSAGE's ``scratch`` rows, the readout and the logits."""
    return 4 * (5 * k + 2 + 2 * cap + 2 * k * hidden + scratch * hidden + emb + classes)


def capacity(e_max: int, k: int, width: int) -> int:
    """Kept pairs a block may hold: at most ``min(deg, S)`` per row and a target's stored pairs in all."""
    per_row = width if width > 0 else k
    return max(1, min(int(e_max), k * per_row))


def scratch_rows(gcn: bool, k: int, hidden: int, classes: int, emb: int, cap: int) -> int:
    """GraphSAGE's transform rows per pass: all ``k`` where the block then fits :data:`SHARED_LIMIT`, else
    :data:`SCRATCH_ROWS`; GCN needs none (its transform reads one buffer and writes the other)."""
    if gcn:
        return 0
    if shared_bytes(k, hidden, classes, emb, cap, k) <= SHARED_LIMIT:
        return k
    return min(k, SCRATCH_ROWS)


def packed_floats(b: int, classes: int, emb: int, want_emb: bool) -> int:
    """Float32 entries of the packed answers of ``b`` targets (:meth:`ResidentShadow.pack`'s layout)."""
    return b * classes + 5 * b + (b * emb if want_emb else 0)


def embedding_dim(res: Any) -> int:
    return int(res.hidden) * (1 + len(res.pools))


def model_tensors(model: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """The weights the kernel reads, float32 on ``device``: ``wt`` the layers after the first, transposed
    (``[L - 1, H, H]`` GCN, ``[L - 1, H, 2H]`` GraphSAGE: root columns, then neighbour ones), ``bias``
    ``[L, H]`` (zeros where a layer has none), ``wc`` the classifier transposed ``[E, C]``, ``bc`` ``[C]``."""

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=device, dtype=torch.float32).contiguous()

    with torch.no_grad():
        mats = [f32(conv.transform_matrix().t()) for conv in model.convs[1:]]
        wt = torch.stack(mats) if mats else torch.zeros(1, device=device)
        zeros = torch.zeros(int(model.hidden), device=device)
        bias = torch.stack([f32(conv.bias) if conv.bias is not None else zeros for conv in model.convs])
        cls = model.classifier
        bc = f32(cls.bias) if cls.bias is not None else torch.zeros(cls.out_features, device=device)
        return {"wt": wt.contiguous(), "bias": bias.contiguous(), "wc": f32(cls.weight.t()), "bc": bc}


def launch_shape(res: Any, width: int, budget: int) -> tuple[int, int, int]:
    """``(cap, scratch, shared bytes)`` of a block of ``res`` (a :class:`kernels.resident.ResidentShadow`) at
    ``width`` and ``budget``: its kept-pair capacity, GraphSAGE's scratch rows, its shared memory."""
    k, emb = int(budget), embedding_dim(res)
    cap = capacity(res.e_max, k, int(width))
    scratch = scratch_rows(res.gcn, k, res.hidden, res.num_classes, emb, cap)
    return cap, scratch, shared_bytes(k, int(res.hidden), int(res.num_classes), emb, cap, scratch)


def scalars(res: Any, b: int, width: int, budget: int, want_emb: bool,
            shape: tuple[int, int, int] | None = None) -> tuple[int, ...]:
    """The kernel's int parameters for a batch of ``b`` targets of ``res``, in the order of :data:`INT_ARGS`
    (``shape``: its :func:`launch_shape`, computed when not given)."""
    cap, scratch, _ = launch_shape(res, width, budget) if shape is None else shape
    pools = [POOL_CODES[p] for p in res.pools] + [0, 0]
    return (int(b), int(budget), int(width), int(res.strategy != "bucket"), int(res.gcn), int(res.layers),
            int(res.hidden), int(res.num_classes), pools[0], pools[1], cap, int(bool(want_emb)), scratch)


def pointer_args(res: Any, weights: dict[str, torch.Tensor], ids: int, out: int) -> tuple[int, ...]:
    """The kernel's pointer parameters in the order of :data:`PTR_ARGS`: the batch's ``ids`` and ``out``, the
    resident lists and induced table of ``res``, its projection table, the kernel's ``weights``
    (:func:`model_tensors`); 0 for an unweighted graph's pair weights."""
    ptrs = {"ids": ids, "out": out, "ew": 0 if res.weights is None else res.weights.data_ptr(),
            "p": res._p.data_ptr(), **{n: getattr(res, n).data_ptr() for n in ("lptr", "lnodes", "eptr", "src", "dst")},
            **{n: t.data_ptr() for n, t in weights.items()}}
    return tuple(ptrs[n] for n in PTR_ARGS)


def block_bytes(res: Any, width: int, budget: int) -> int:
    """Shared memory of a block of ``res`` at ``width`` and ``budget`` (:func:`launch_shape`)."""
    return launch_shape(res, width, budget)[2]


def check_labels(flat: np.ndarray, b: int, classes: int) -> None:
    """Raise when a block refused its target (label -1: its kept pairs exceeded the capacity, which the
    host computes as a bound, so this means a bug, not a batch to answer)."""
    if (flat[b * classes: b * classes + b] < 0).any():
        raise RuntimeError("shadow_block: a block's kept pairs exceeded the launch's capacity")


class ShadowBlock:
    """One resident shaDow model's kernel (module docstring). Not thread-safe: the caller holds the
    model's lock (its mapped buffers are shared)."""

    def __init__(self, res: Any, device_index: int) -> None:
        self.r = res
        self.device_index = device_index
        props = torch.cuda.get_device_properties(device_index)
        #: the most shared memory a block may take on this device (opted in once where above 48 KiB)
        self.limit = max(SHARED_LIMIT, int(getattr(props, "shared_memory_per_block_optin", SHARED_LIMIT)))
        self.fn = resident_head._function(device_index, KERNEL_SOURCE, KERNEL_NAME,
                                          self.limit if self.limit > SHARED_LIMIT else 0)
        self.t = model_tensors(res.model, res.device)
        self.io = resident_head.MappedIO(device_index)
        self.launches = 0
        self._shapes: dict[tuple[int, int, int], tuple[int, int, int]] = {}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.t.values())

    def shape(self, width: int, budget: int) -> tuple[int, int, int]:
        """:func:`launch_shape` at ``width`` and ``budget``, memoized (the path asks before the batch, the
        launch again): it changes only with the induced table's longest run."""
        key = (int(width), int(budget), int(self.r.e_max))
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) >= SHAPES_KEPT:  # widths and budgets come from requests
                self._shapes.clear()
            shape = self._shapes[key] = launch_shape(self.r, width, budget)
        return shape

    def fits(self, width: int, budget: int) -> bool:
        """Whether a block of this batch fits the device's shared memory (else the torch operators serve)."""
        return self.shape(width, budget)[2] <= self.limit

    def answer(self, targets: np.ndarray, width: int, budget: int, want_emb: bool) -> np.ndarray:
        """The packed answers of ``targets`` (which the model :meth:`takes`): a copy of the mapped output."""
        r = self.r
        b = len(targets)
        floats = packed_floats(b, r.num_classes, embedding_dim(r), want_emb)
        ids, out = self.io.buffers(b, floats)
        ids.array[:b] = targets
        shape = self.shape(width, budget)
        args = (*pointer_args(r, self.t, ids.device_ptr, out.device_ptr),
                *scalars(r, b, width, budget, want_emb, shape))
        self.io.run(self.fn, b, THREADS, shape[2], args, ARG_KINDS)
        self.launches += 1
        flat = out.array[:floats].copy()
        check_labels(flat, b, r.num_classes)
        return flat


def _why_not(res: Any) -> str | None:
    if res.device.type != "cuda":
        return "it needs a CUDA device"
    if not spmm_cuda.available():
        return f"the CUDA kernels are not available ({spmm_cuda.status()[1]})"
    if any(t.dtype != torch.float32 for t in [res._p, *res.model.parameters()]) or not res._p.is_contiguous():
        return "it computes float32 models"
    if len(res.pools) > 2 or any(p not in POOL_CODES for p in res.pools):
        return f"pools {res.pools} (it reads at most a mean and a max)"
    return None


def _check_targets(res: Any) -> np.ndarray:
    """Up to :data:`CHECK_TARGETS` targets the resident state answers now (not dirty in a live index)."""
    cand = np.arange(min(res.num_nodes, 1024), dtype=np.int64)
    dirty = getattr(res.index, "is_dirty", None)
    if dirty is not None and len(cand):
        cand = cand[~np.asarray(dirty(cand), dtype=bool)]
    return cand[:CHECK_TARGETS]


def _agrees(block: ShadowBlock, res: Any) -> str | None:
    """Run the kernel on a few targets at the exact width and one sampled width and compare its answers
    (probabilities, clear labels, edge counts, readouts) with the torch operators': None when they agree,
    else what differed."""
    targets = _check_targets(res)
    n, checked = len(targets), 0
    for width in (0, 2):
        if not n or not block.fits(width, res.k):  # such batches take the torch operators anyway
            continue
        got = res.unpack_host(block.answer(targets, width, res.k, True), n, True)
        with torch.inference_mode():
            want = res.download(res.forward(res.upload_ids(targets), width, res.k, True), n, True)
        if not np.allclose(got[0], want[0], rtol=CHECK_RTOL, atol=CHECK_ATOL, equal_nan=True):
            worst = float(np.nanmax(np.abs(got[0] - want[0])))
            return f"its probabilities differ from the torch operators' by up to {worst:.3g} (width {width})"
        top2 = np.sort(np.nan_to_num(want[0], nan=2.0), axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-5  # ties within rounding may resolve either way
        if not np.array_equal(got[1][clear], want[1][clear]):
            return f"its labels differ from the torch operators' (width {width})"
        if not (np.array_equal(got[2], want[2]) and np.array_equal(got[3], want[3])):
            return f"its edge counts differ from the torch operators' (width {width})"
        if not np.allclose(got[4], want[4], rtol=CHECK_RTOL, atol=1e-5, equal_nan=True):
            return f"its readouts differ from the torch operators' (width {width})"
        checked += 1
    if not checked:
        log.warning("resident shaDow path: the one-launch kernel was not checked at creation (%s)",
                    "no target to compare on" if not n else "no width fits the device's shared memory")
    return None


def create(res: Any, required: bool = False) -> ShadowBlock | None:
    """The one-launch kernel of ``res`` (a :class:`kernels.resident.ResidentShadow`), checked against the
    torch operators on a few targets, or None where it cannot run (the reason logged; ``required``: a
    RuntimeError that says it)."""
    why = _why_not(res)
    block = None
    if why is None:
        dev = res.device
        try:
            block = ShadowBlock(res, dev.index if dev.index is not None else torch.cuda.current_device())
            why = _agrees(block, res)
        except Exception as exc:  # compilation, mapped memory, a failing launch: the torch operators serve
            why = f"{type(exc).__name__}: {exc}"
    if why is None:
        return block
    if required:
        raise RuntimeError(f"the one-launch shaDow kernel (--fused-shadow) cannot run here: {why}")
    log.warning("resident shaDow path: the one-launch kernel is not used (%s); torch operators serve its batches",
                why)
    return None
