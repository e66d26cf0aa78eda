"""A sum of four weighted rows in explicit vectors, for numba code that LLVM does not vectorise well.

numba cannot tell that an output row and the source rows it sums do not overlap. LLVM's loop vectoriser
then versions the loop with overlap checks, and its vector body needs 64 elements (16 lanes unrolled 4
times) before it runs, so a row of 10 or 32 features ran scalar code. :func:`add4_lanes` is written as
LLVM IR with a vector type: one load, multiply and add per lane group, in the scalar loop's order (the
same bits). :mod:`kernels.fused_forward` sums its kept edges with it.

The ES-SpMM CPU kernel (:mod:`kernels.spmm_cpu`) sums its groups of four rows with :func:`add4_rows`: the
vectors for float32 rows of 8 to 127 features, LLVM's own loop otherwise; a row that is not a whole number
of vectors ends with two overlapping ones (:func:`add4_lanes2`) instead of scalar columns. A first try
(2026-11-26 morning) put the vectors into a kernel whose parallel copy was numba's ``prange`` over its rows; that copy ran
0.36x-2.12x depending on F and on the loop around the call. The kernel's parallel copy is now a driver
that calls the generic serial kernel, the same function, on ranges of rows (docs/BENCHMARKS.md, "the kernel's rows
in vectors").
"""

from __future__ import annotations

from llvmlite import ir
from numba import types as nbtypes
from numba.extending import intrinsic, overload

__all__ = ["LANE_BYTES", "ROWS_WIDE", "add4_lanes", "add4_lanes2", "add4_rows", "splat"]

#: the width of the hand-written vector sum (:func:`add4_lanes`): 32 bytes, eight float32 or four float64 (an
#: AVX2 register; LLVM splits it on narrower targets)
LANE_BYTES = 32


def splat(builder, vt: ir.VectorType, scalar):
    """LLVM IR: ``scalar`` in every lane of a vector of type ``vt`` (for intrinsics' codegen)."""
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vt.count), [0] * vt.count))


def _lanes_types(arrays, ks, offs):
    """The element type when every array is a contiguous, aligned 1-D array of one float type, ``arrays[0]``
    (the output) writable, every weight of that type and every offset an integer; else None (no typing)."""
    if not all(isinstance(a, nbtypes.Array) and a.ndim == 1 and a.layout == "C" and a.aligned for a in arrays):
        return None
    dt = arrays[0].dtype
    if dt not in (nbtypes.float32, nbtypes.float64) or any(a.dtype != dt for a in arrays) or not arrays[0].mutable:
        return None
    if not all(isinstance(o, nbtypes.Integer) for o in offs) or any(k != dt for k in ks):
        return None  # no silent conversion: a float64 weight rounded to float32 would change the sum
    return dt


def _add4(acc, xs, offs, ks):
    """``(signature, codegen)`` of ``acc[o:o + L] += (k0 x0[..] + k1 x1[..]) + (k2 x2[..] + k3 x3[..])`` at each
    offset ``o`` of ``offs`` (one or two), the arguments in the order ``acc, *xs, *offs, *ks``. Every load at
    every offset comes before the first store, and the stores go in the order of ``offs``: two overlapping
    vectors (a row's last full vector and the one ending at its last column) each compute the overlap from
    the same values, so it is written with the scalar loop's bits and added once."""
    dt = _lanes_types((acc, *xs), ks, offs)
    if dt is None:
        return None
    sig = nbtypes.void(acc, *xs, *([nbtypes.intp] * len(offs)), *([dt] * len(ks)))
    lanes = LANE_BYTES // (4 if dt == nbtypes.float32 else 8)
    first_k = 1 + len(xs) + len(offs)

    def codegen(context, builder, signature, args):
        vt = ir.VectorType(context.get_value_type(dt), lanes)
        at = dt.bitwidth // 8

        def at_off(i, off):
            data = context.make_array(signature.args[i])(context, builder, args[i]).data
            return builder.bitcast(builder.gep(data, [off]), vt.as_pointer())

        kv = [splat(builder, vt, args[first_k + i]) for i in range(4)]
        sums = []
        for off in args[1 + len(xs):first_k]:
            target = at_off(0, off)
            t = [builder.fmul(kv[i], builder.load(at_off(1 + i, off), align=at)) for i in range(4)]
            total = builder.fadd(builder.fadd(t[0], t[1]), builder.fadd(t[2], t[3]))
            sums.append((target, builder.fadd(builder.load(target, align=at), total)))
        for target, value in sums:
            builder.store(value, target, align=at)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def add4_lanes(typingctx, acc, x0, x1, x2, x3, off, k0, k1, k2, k3):
    """``acc[off:off + L] += (k0 x0[..] + k1 x1[..]) + (k2 x2[..] + k3 x3[..])`` over ``L`` =
    :data:`LANE_BYTES` of elements, as one vector operation each, in that order (the scalar loop's order:
    the same bits, no fused multiply-add). ``acc`` and the ``x`` are contiguous 1-D arrays of one float
    type (anything else does not type), ``off + L`` within each (the caller's loop bound; not checked
    here), and ``acc`` overlaps none of the ``x`` (the loads all come before the store). The weights are
    of that type too and ``off`` an integer; anything else does not type (a read-only ``acc`` neither).

    The same bits hold in callers compiled without ``fastmath``: numba's fast-math pass flags the inlined
    operations too, and LLVM then fuses them. numba's cache checks a function's own source file only, so
    an edit here reaches a cached caller only through the digest line the caller carries, once
    ``python -m kernels.cache_key --write`` has rewritten it (:mod:`kernels.cache_key`; a test fails until then)."""
    return _add4(acc, (x0, x1, x2, x3), (off,), (k0, k1, k2, k3))


@intrinsic
def add4_lanes2(typingctx, acc, x0, x1, x2, x3, off, off2, k0, k1, k2, k3):
    """:func:`add4_lanes` at ``off`` and ``off2`` (which may overlap: both read before either is written)."""
    return _add4(acc, (x0, x1, x2, x3), (off, off2), (k0, k1, k2, k3))


#: from this many features :func:`add4_rows` leaves float32 rows to LLVM's loop (as it does rows shorter than one
#: vector), which on an AVX-512 machine
#: runs 64-byte vectors unrolled four times: at 128 and 256 features the 32-byte vectors measured 0.84x-1.00x
#: of it, below 128 they gained (the 8 to 64 features of a hidden layer or a class count: LLVM's vector
#: body needs 64 elements, so a row of 10 or 32 ran scalar)
ROWS_WIDE = 128


def add4_rows(acc, x0, x1, x2, x3, k0, k1, k2, k3, n):  # pragma: no cover - the specification
    """``acc[c] += (k0 x0[c] + k1 x1[c]) + (k2 x2[c] + k3 x3[c])`` for ``c < n``, in that order (the same
    bits however it is computed). In numba code: float32 rows of one vector to :data:`ROWS_WIDE` features in
    :func:`add4_lanes` vectors where they type for the arguments (contiguous, aligned float32 rows, a
    writable ``acc``, float32 weights), any other row in a plain loop; ``n`` at most the rows' length. The
    vectors: four per step, then one, and a row that is not a whole number of vectors ends with the pair of
    its last full vector and the one ending at column ``n`` (:func:`add4_lanes2`), so no column is scalar."""
    for c in range(n):
        acc[c] += (k0 * x0[c] + k1 * x1[c]) + (k2 * x2[c] + k3 * x3[c])


def _takes_lanes(acc, xs, ks) -> bool:
    """Whether the lane operations type for these numba types with float32 rows (what the ``*_rows`` helpers
    vectorise); anything else takes the plain loop rather than failing to type."""
    return _lanes_types((acc, *xs), ks, ()) == nbtypes.float32


@overload(add4_rows, inline="always")
def _add4_rows_numba(acc, x0, x1, x2, x3, k0, k1, k2, k3, n):
    if _takes_lanes(acc, (x0, x1, x2, x3), (k0, k1, k2, k3)):
        lw = LANE_BYTES // 4
        wide = ROWS_WIDE

        def vectors(acc, x0, x1, x2, x3, k0, k1, k2, k3, n):  # pragma: no cover - compiled
            if n >= wide or n < lw:
                for c in range(n):
                    acc[c] += (k0 * x0[c] + k1 * x1[c]) + (k2 * x2[c] + k3 * x3[c])
                return
            whole = n if n % lw == 0 else n - n % lw - lw  # the pair takes the last full vector
            c = 0
            while c + 4 * lw <= whole:
                add4_lanes(acc, x0, x1, x2, x3, c, k0, k1, k2, k3)
                add4_lanes(acc, x0, x1, x2, x3, c + lw, k0, k1, k2, k3)
                add4_lanes(acc, x0, x1, x2, x3, c + 2 * lw, k0, k1, k2, k3)
                add4_lanes(acc, x0, x1, x2, x3, c + 3 * lw, k0, k1, k2, k3)
                c += 4 * lw
            while c < whole:
                add4_lanes(acc, x0, x1, x2, x3, c, k0, k1, k2, k3)
                c += lw
            if c < n:
                add4_lanes2(acc, x0, x1, x2, x3, c, n - lw, k0, k1, k2, k3)

        return vectors

    def loop(acc, x0, x1, x2, x3, k0, k1, k2, k3, n):  # pragma: no cover - compiled
        for c in range(n):
            acc[c] += (k0 * x0[c] + k1 * x1[c]) + (k2 * x2[c] + k3 * x3[c])

    return loop
