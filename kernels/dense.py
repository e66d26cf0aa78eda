r"""Dense products whose rows do not depend on the batch: ``x @ w`` one row at a time, in one fixed order.

A BLAS product picks its blocking, its kernel and its split over threads from the whole matrix's shape,
so a row's bits depend on how many rows came with it: torch's CPU matmul gave ``X[:m] @ W`` other bits
than ``(X @ W)[:m]`` for ``m < 64`` (6e-5 apart at ``m = 1, 2, 7`` for 767 x 64 inputs), and OpenBLAS's
blocking moves with the batch as well. A server that answers a node alone and inside a batch then gives
two answers a few ulps apart, and a cache of per-node rows (the first-layer projections, a plain model's
first-layer outputs) keeps whichever bits the batch that first computed a row gave, so two servers whose
caches filled in other batches disagree (docs/RELIABILITY.md, "batch-invariant answers").

:func:`rows_matmul` computes each output element as one chain of fused multiply-adds in the order of the
input columns, whatever the batch:

.. math::

    y_{ij} = \operatorname{fma}\big(x_{i,K-1}, w_{K-1,j}, \dots \operatorname{fma}(x_{i,1}, w_{1,j},
    \operatorname{fma}(x_{i,0}, w_{0,j}, 0))\big)

(each ``fma`` rounded once, IEEE 754: the same bits on every machine; LLVM's ``llvm.fma``, which a CPU
without the instruction computes in software). The specification, :func:`rows_matmul_reference`, is the
same chain in torch, each fma emulated exactly in float64 (:func:`fma_reference`), so tests compare bits.
Every element goes through its own chain however the rows are grouped, so the kernel blocks across rows and
columns as a BLAS micro-kernel does: :func:`rows_matmul_into` keeps a tile of rows x vectors of columns in
registers through the whole ``k`` loop and loads each weight vector once per tile (4 rows x 4 vectors of 64
bytes where the CPU has AVX-512, 4 x 2 of 32 bytes otherwise; 8 rows x 1 vector for rows one vector wide or
less, the last 1 to 3 rows in one tile), and a row's last columns in a masked vector. No bit depends on the
tiling. What the order costs is the BLAS's freedom to split the ``k`` sum: on one thread 1.0x-1.7x OpenBLAS's
speed on every shape measured (the 10-column classifier 1.07x, a single 767-wide row 1.2x); a BLAS on several
threads is ahead on large products (docs/BENCHMARKS.md, "Batch-invariant products").

Rows are independent, so a large product splits its rows over threads (:func:`rows_matmul` with
``threads > 1``) with the same bits. Used wherever the serving paths multiply on a CPU: the compiled
forwards (:mod:`kernels.fused_forward`), and through :func:`linear` / :func:`product` (torch's product on a GPU or
under autograd) the models' transforms outside autograd (:func:`models.base.linear_any`, hence the projection cache
and the torch paths) and the resident paths' products (:mod:`kernels.resident`).
"""

# numba cache key: lanes 4d5e0af8c182

from __future__ import annotations

import weakref

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import prange
from numba import types as nbtypes
from numba.core import cgutils
from numba.extending import intrinsic

from .lanes import splat
from .threads import kernel_threads, numba_threads_set

__all__ = ["PARALLEL_WORK", "TILE_BYTES", "fma_reference", "linear", "product", "rows_matmul", "rows_matmul_into",
           "rows_matmul_new", "rows_matmul_reference", "transposed"]

#: products of at least this many multiply-adds (rows x K x N) split their rows over torch's threads
PARALLEL_WORK = 1 << 22


def _fma_fn(builder, ty):
    """``llvm.fma`` for a float or float vector type."""
    name = f"llvm.fma.v{ty.count}{ty.element}" if isinstance(ty, ir.VectorType) else f"llvm.fma.{ty}"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]), name)


def _masked_fn(builder, vt: ir.VectorType, store: bool):
    """``llvm.masked.load`` / ``llvm.masked.store`` for vectors of type ``vt``: lanes whose mask bit is off are
    neither read nor written (no fault past an array's end)."""
    mt = ir.VectorType(ir.IntType(1), vt.count)
    name = f"llvm.masked.{'store' if store else 'load'}.v{vt.count}{vt.element}.p0"
    ptr, i32 = vt.as_pointer(), ir.IntType(32)
    ft = ir.FunctionType(ir.VoidType(), [vt, ptr, i32, mt]) if store else ir.FunctionType(vt, [ptr, i32, mt, vt])
    return cgutils.get_or_insert_function(builder.module, ft, name)


def _emit_tile(context, builder, sig, args, rows: int, vectors: int, masked: bool) -> None:
    """LLVM IR of one register tile (:func:`_tile_at`'s arguments ``args``): ``out[i0:i0 + rows, c0:c0 +
    vectors L]``, each element one chain of fused multiply-adds over ``k = 0 .. K - 1`` (module docstring),
    the accumulators held in registers across the whole ``k`` loop; each step loads the ``vectors`` weight
    vectors once for all ``rows`` rows. With ``masked`` the last vector covers its first ``rem`` columns only
    (masked loads and stores: the lanes past a row's last column are neither read nor written)."""
    dt = sig.args[0].dtype
    lanes = TILE_BYTES // (dt.bitwidth // 8)
    et = context.get_value_type(dt)
    vt = ir.VectorType(et, lanes)
    esize = dt.bitwidth // 8
    align = ir.Constant(ir.IntType(32), esize)
    fma_v = _fma_fn(builder, vt)
    o_a, x_a, w_a = (context.make_array(sig.args[j])(context, builder, args[j]) for j in range(3))
    i0v, c0v, rem = args[3], args[4], args[8]
    kk = cgutils.unpack_tuple(builder, x_a.shape, 2)[1]
    n = cgutils.unpack_tuple(builder, w_a.shape, 2)[1]
    it = kk.type
    zero = ir.Constant(vt, [ir.Constant(et, 0.0)] * lanes)
    mask = None
    if masked:  # lane l of the last vector is on when l < rem
        iv = ir.VectorType(it, lanes)
        mask = builder.icmp_signed("<", ir.Constant(iv, list(range(lanes))), splat(builder, iv, rem))
    acc = [[cgutils.alloca_once(builder, vt) for _ in range(vectors)] for _ in range(rows)]
    for r in range(rows):
        for v in range(vectors):
            builder.store(zero, acc[r][v])
    x_rows = [builder.mul(builder.add(i0v, ir.Constant(it, r)), kk) for r in range(rows)]

    def vec_at(data, off):
        return builder.bitcast(builder.gep(data, [off]), vt.as_pointer())

    def last(v):
        return masked and v == vectors - 1

    with cgutils.for_range(builder, kk) as loop:
        k = loop.index
        base = builder.add(builder.mul(k, n), c0v)
        wv = []
        for v in range(vectors):
            ptr = vec_at(w_a.data, builder.add(base, ir.Constant(it, v * lanes)))
            wv.append(builder.call(_masked_fn(builder, vt, False), [ptr, align, mask, zero]) if last(v)
                      else builder.load(ptr, align=esize))
        for r in range(rows):
            xk = splat(builder, vt, builder.load(builder.gep(x_a.data, [builder.add(x_rows[r], k)])))
            for v in range(vectors):
                builder.store(builder.call(fma_v, [xk, wv[v], builder.load(acc[r][v])]), acc[r][v])
    for r in range(rows):
        row_base = builder.add(builder.mul(builder.add(i0v, ir.Constant(it, r)), n), c0v)
        for v in range(vectors):
            ptr = vec_at(o_a.data, builder.add(row_base, ir.Constant(it, v * lanes)))
            if last(v):
                builder.call(_masked_fn(builder, vt, True), [builder.load(acc[r][v]), ptr, align, mask])
            else:
                builder.store(builder.load(acc[r][v]), ptr, align=esize)


def _target_has_avx512() -> bool:
    """Whether the CPU numba compiles for has AVX-512: its features (``NUMBA_CPU_FEATURES`` where set, else the
    host's), so that a process told to compile for another CPU takes that CPU's tiles (and numba's cache,
    keyed by those features, keeps each one's code apart)."""
    try:
        from numba.core import config

        features = config.CPU_FEATURES
        if features is None:
            import llvmlite.binding as llvm

            features = llvm.get_host_cpu_features().flatten()
        return "+avx512f" in features.split(",")
    except Exception:  # pragma: no cover - a platform llvmlite cannot ask
        return False


#: bytes per vector of the tiles: 64 where the CPU numba compiles for has AVX-512 (32 registers), else 32 (16
#: registers). No bit depends on the choice.
TILE_BYTES = 64 if _target_has_avx512() else 32
#: rows per register tile (by up to :data:`TILE_VECTORS` vectors); a product whose rows are one vector wide or
#: less takes tiles of :data:`NARROW_ROWS` rows by one vector: at least 8 chains either way, enough to hide the
#: fma's latency
TILE_ROWS = 4
NARROW_ROWS = 8
#: vectors per tile of a product's last 1, 2 or 3 rows (index: the row count): up to 4 per row, as many as the
#: registers hold beside the weights (12 accumulators with AVX-512's 32 registers, 8 with 16)
REST_VECTORS = tuple(max(1, min(4, (12 if TILE_BYTES == 64 else 8) // r)) if r else 0 for r in range(4))
#: the tiles :func:`_tile_at` compiles, ``(rows, vectors)``
TILE_VECTORS = 4 if TILE_BYTES == 64 else 2
TILES = ((NARROW_ROWS, 1), *((TILE_ROWS, v) for v in range(1, TILE_VECTORS + 1)), *((r, v) for r in (1, 2, 3) for v in range(1, REST_VECTORS[r] + 1)))


@intrinsic
def _tile_at(typingctx, out, x, w, i0, c0, rows, vectors, masked, rem):
    """``_tile_at(out, x, w, i0, c0, rows, vectors, masked, rem)``: the register tile of ``rows`` rows by
    ``vectors`` vectors at row ``i0``, column ``c0`` (:func:`_emit_tile`; ``(rows, vectors)`` one of
    :data:`TILES`, anything else writes nothing), its last vector ``rem`` columns wide if ``masked``. ``x``,
    ``w`` and ``out`` are C-contiguous 2-D arrays of one float type (anything else does not type); bounds are
    the caller's."""
    arrays = (out, x, w)
    if not all(isinstance(a, nbtypes.Array) and a.ndim == 2 and a.layout == "C" for a in arrays):
        return None
    dt = out.dtype
    if dt not in (nbtypes.float32, nbtypes.float64) or x.dtype != dt or w.dtype != dt or not out.mutable:
        return None
    if not all(isinstance(v, nbtypes.Integer) for v in (i0, c0, rows, vectors, rem)) or \
            not isinstance(masked, nbtypes.Boolean):
        return None
    sig = nbtypes.void(out, x, w, *([nbtypes.intp] * 4), nbtypes.boolean, nbtypes.intp)

    def codegen(context, builder, signature, args):
        it = args[5].type
        key = builder.add(builder.add(builder.mul(args[5], ir.Constant(it, 64)), builder.mul(args[6], ir.Constant(it, 2))),
                          builder.zext(args[7], it))
        end = builder.append_basic_block("tile.end")
        switch = builder.switch(key, end)
        for rows_, vectors_ in TILES:
            for masked_ in (False, True):
                block = builder.append_basic_block(f"tile.{rows_}x{vectors_}{'m' if masked_ else ''}")
                switch.add_case(ir.Constant(it, rows_ * 64 + vectors_ * 2 + masked_), block)
                builder.position_at_end(block)
                _emit_tile(context, builder, signature, args, rows_, vectors_, masked_)
                builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _tiles(out, x, w, i, rows, per, lanes, vectors, rem):  # pragma: no cover - compiled
    """Rows ``i .. i + rows - 1``, every column, in tiles of at most ``per`` vectors of ``lanes`` elements;
    ``vectors`` vectors in all, the last one ``rem`` columns wide."""
    c = 0
    v = 0
    while v < vectors:
        k = min(per, vectors - v)
        _tile_at(out, x, w, i, c, rows, k, v + k == vectors and rem != lanes, rem)
        c += k * lanes
        v += k


@numba.njit(cache=True, nogil=True)
def rows_matmul_into(x, w, out, r0, r1):  # pragma: no cover - compiled
    """``out[i] = x[i] @ w`` for ``r0 <= i < r1`` in the module's order; ``x`` ``[M, K]``, ``w`` ``[K, N]``,
    ``out`` ``[M, N]``: C-contiguous, one float type. Callable from numba code. Rows run in register tiles
    of :data:`TILE_ROWS` rows by up to :data:`TILE_VECTORS` vectors (:data:`NARROW_ROWS` rows by one vector where
    a row is one vector wide or less), the last 1 to 3 rows in one tile of up to 4 vectors (:data:`REST_VECTORS`); a row's last
    columns in a masked vector. Every way computes each element with the same chain."""
    n = w.shape[1]
    if n == 0 or r1 <= r0:
        return
    lanes = TILE_BYTES // w.itemsize
    vectors = (n + lanes - 1) // lanes
    rem = n - (vectors - 1) * lanes
    i = r0
    if vectors == 1:
        while i + NARROW_ROWS <= r1:
            _tiles(out, x, w, i, NARROW_ROWS, 1, lanes, vectors, rem)
            i += NARROW_ROWS
    while i + TILE_ROWS <= r1:
        _tiles(out, x, w, i, TILE_ROWS, TILE_VECTORS, lanes, vectors, rem)
        i += TILE_ROWS
    if i < r1:
        _tiles(out, x, w, i, r1 - i, REST_VECTORS[r1 - i], lanes, vectors, rem)


@numba.njit(cache=True, nogil=True)
def rows_matmul_new(x, w):  # pragma: no cover - compiled
    """``x @ w`` into a new array (numba code's replacement for ``np.dot``)."""
    out = np.empty((x.shape[0], w.shape[1]), dtype=w.dtype)
    rows_matmul_into(x, w, out, 0, x.shape[0])
    return out


@numba.njit(cache=True, nogil=True, parallel=True)
def _rows_matmul_parallel(x, w, out, threads):  # pragma: no cover - compiled
    """:func:`rows_matmul_into` on ``threads`` contiguous ranges of rows, one per thread."""
    m = x.shape[0]
    per = (m + threads - 1) // threads
    for t in prange(threads):
        rows_matmul_into(x, w, out, min(m, t * per), min(m, (t + 1) * per))


_TRANSPOSED: dict[int, tuple[weakref.ref, tuple, np.ndarray]] = {}


def transposed(w: torch.Tensor) -> np.ndarray:
    """``w.T`` as a C-contiguous NumPy array, kept per tensor until the tensor changes (its version counter,
    which every in-place update such as an optimiser step moves): a layer's weight ``[out, in]`` is used as
    ``[in, out]`` by :func:`rows_matmul` on every call, and copying it each time cost more than a one-row
    product."""
    if w.is_inference():  # made under inference_mode (a weight assembled per call): no version counter to key on
        return np.ascontiguousarray(w.t().numpy())
    key = (w._version, w.data_ptr(), tuple(w.shape), w.dtype)
    hit = _TRANSPOSED.get(id(w))
    if hit is not None and hit[0]() is w and hit[1] == key:
        return hit[2]
    t = np.ascontiguousarray(w.detach().t().numpy())
    wid = id(w)
    _TRANSPOSED[wid] = (weakref.ref(w, lambda _r: _TRANSPOSED.pop(wid, None)), key, t)
    return t


def _as_numpy(a: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = (a.detach() if a.requires_grad else a).numpy()
    return np.ascontiguousarray(a)


def rows_matmul(x: torch.Tensor | np.ndarray, w: torch.Tensor | np.ndarray, threads: int | None = None):
    """``x @ w`` (``x`` ``[M, K]``, ``w`` ``[K, N]``, float32 or float64 on the CPU, one dtype) with each row's
    bits independent of the other rows (module docstring). Returns what ``x`` is (a tensor or an array).

    ``threads``: rows split over this many threads; None = torch's thread count
    (``torch.get_num_threads()``, capped by numba's) when the product has :data:`PARALLEL_WORK`
    multiply-adds or more, else one. Any count gives the same bits."""
    is_tensor = isinstance(x, torch.Tensor)
    xn, wn = _as_numpy(x), _as_numpy(w)
    if xn.ndim != 2 or wn.ndim != 2 or xn.shape[1] != wn.shape[0]:
        raise ValueError(f"rows_matmul: shapes {xn.shape} and {wn.shape} do not multiply")
    if xn.dtype != wn.dtype or xn.dtype not in (np.float32, np.float64):
        raise ValueError(f"rows_matmul: float32 or float64 operands of one dtype, not {xn.dtype} and {wn.dtype}")
    m = xn.shape[0]
    out = np.empty((m, wn.shape[1]), dtype=wn.dtype)
    if threads is None:
        threads = kernel_threads() if m * xn.shape[1] * wn.shape[1] >= PARALLEL_WORK else 1
    if min(int(threads), m) > 1:
        with numba_threads_set(min(int(threads), m)) as t:
            _rows_matmul_parallel(xn, wn, out, t)
    elif m:
        rows_matmul_into(xn, wn, out, 0, m)
    return torch.from_numpy(out) if is_tensor else out


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a fake, functional or other subclass tensor


def recording(*tensors: torch.Tensor) -> bool:
    """Whether a computation on ``tensors`` is being recorded rather than run: ``torch.export`` (its tensors are fake),
    ``torch.compile`` or the TorchScript tracer (an ONNX export). There nothing may leave torch (a NumPy product, a
    value kept between calls): it would be baked into the recorded graph as a constant of the example input. It was,
    until 2026-11-29: ``gnnserve export-onnx`` failed, and its legacy exporter wrote models without a feature input."""
    return (any(type(t) not in _PLAIN for t in tensors) or torch.jit.is_tracing()
            or torch.compiler.is_compiling())


def _by_rows(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``x``'s product with ``w`` is :func:`rows_matmul`'s: dense tensors on the CPU, one float dtype, no
    gradient wanted (training keeps torch's product), and nothing :func:`recording` it."""
    return (x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == w.dtype
            and x.dtype in (torch.float32, torch.float64)
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            and not recording(x, w))


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` (``w`` ``[K, N]``) for dense tensors: :func:`rows_matmul` on a CPU outside autograd, whose rows do not
    depend on the batch; torch's product elsewhere (a GPU, training)."""
    return rows_matmul(x, w) if _by_rows(x, w) else x @ w


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` (``weight`` ``[out, in]``, a layer's) as :func:`product`, the transpose kept per weight
    (:func:`transposed`)."""
    return rows_matmul(x, transposed(weight)) if _by_rows(x, weight) else x @ weight.t()


def fma_reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` rounded once, for float32 tensors (broadcast), computed in float64: the product of two
    float32 is exact there; the sum is made round-to-odd (its exact error by Knuth's two-sum, and an inexact
    sum with an even last bit moved one ulp toward the error), and a round-to-odd value with at least two more
    bits than the target rounds to the target correctly (Boldo and Melquiond, "Emulation of FMA and
    correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008). Non-finite values pass
    through as IEEE arithmetic gives them."""
    if not (a.dtype == b.dtype == c.dtype == torch.float32):
        raise ValueError("fma_reference: float32 operands")
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bb = s - p
    err = (p - (s - bb)) + (cd - bb)
    bits = s.view(torch.int64)
    fix = torch.isfinite(s) & (err != 0) & ((bits & 1) == 0)
    away = (err > 0) == (s > 0)  # toward the error: away from zero when they share a sign
    bits = torch.where(fix, bits + torch.where(away, 1, -1), bits)
    return bits.view(torch.float64).float()


def rows_matmul_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The specification of :func:`rows_matmul` for float32 in torch: each element's chain of
    :func:`fma_reference` over the input columns in order, so the same bits. Slow: ``K`` passes over the
    rows."""
    acc = x.new_zeros(x.shape[0], w.shape[1])
    for k in range(x.shape[1]):
        acc = fma_reference(x[:, k:k + 1], w[k:k + 1], acc)
    return acc
