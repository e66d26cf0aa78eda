"""kernels.lanes: the sum of four weighted rows in explicit vectors gives the scalar loop's bits."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from kernels.lanes import LANE_BYTES, ROWS_WIDE, _add4_rows_numba, add4_lanes, add4_lanes2, add4_rows


@numba.njit
def _lanes_row_sum(acc, xs, ks, lw):  # pragma: no cover - compiled
    """acc += the four rows of xs weighted by ks, in add4_lanes steps, the tail as the kernel's scalar loop."""
    f = acc.shape[0]
    c = 0
    while c + lw <= f:
        add4_lanes(acc, xs[0], xs[1], xs[2], xs[3], c, ks[0], ks[1], ks[2], ks[3])
        c += lw
    for cc in range(c, f):
        acc[cc] += (ks[0] * xs[0, cc] + ks[1] * xs[1, cc]) + (ks[2] * xs[2, cc] + ks[3] * xs[3, cc])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("f", [1, 4, 8, 9, 17, 64, 77])
def test_lanes_give_the_scalar_sums_bits(dtype, f):
    """kernels.add4_lanes: acc + ((k0 x0 + k1 x1) + (k2 x2 + k3 x3)), rounded after every operation
    as NumPy's float arithmetic does (no fused multiply-add), lane by lane; rows of any length with the
    kernel's scalar tail, NaN and infinities carried."""
    rng = np.random.default_rng(f)
    lw = LANE_BYTES // np.dtype(dtype).itemsize
    xs = rng.standard_normal((4, f)).astype(dtype) * dtype(1e3)
    ks = rng.standard_normal(4).astype(dtype)
    acc = rng.standard_normal(f).astype(dtype)
    if f > 2:
        xs[1, 1], xs[2, 2] = np.nan, np.inf
    want = acc + ((ks[0] * xs[0] + ks[1] * xs[1]) + (ks[2] * xs[2] + ks[3] * xs[3]))
    got = acc.copy()
    _lanes_row_sum(got, xs, ks, lw)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_lanes_refuse_rows_that_are_not_contiguous():
    """add4_lanes reads L contiguous elements from a data pointer: a strided row does not type."""
    x = np.ones((4, 16), np.float32)
    with pytest.raises(numba.core.errors.TypingError):
        _lanes_row_sum(np.zeros(8, np.float32), x[:, ::2], np.ones(4, np.float32), 8)


@numba.njit
def _lanes_once(acc, x, k, off):  # pragma: no cover - compiled
    add4_lanes(acc, x, x, x, x, off, k, k, k, k)


def test_lanes_convert_nothing_silently():
    """Weights of another type than the rows (a float64 weight rounded to float32 would change the sum), a
    float offset and a read-only output do not type."""
    x = np.ones(8, np.float32)
    with pytest.raises(numba.core.errors.TypingError):
        _lanes_once(np.zeros(8, np.float32), x, np.float64(0.5), 0)
    with pytest.raises(numba.core.errors.TypingError):
        _lanes_once(np.zeros(8, np.float32), x, np.float32(0.5), 0.0)
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(numba.core.errors.TypingError):
        _lanes_once(frozen, x, np.float32(0.5), 0)
    acc = np.zeros(8, np.float32)
    _lanes_once(acc, x, np.float32(0.5), 0)
    assert np.array_equal(acc, np.full(8, 2.0, np.float32))


@numba.njit
def _rows_sum(acc, xs, ks, n):  # pragma: no cover - compiled
    add4_rows(acc, xs[0], xs[1], xs[2], xs[3], ks[0], ks[1], ks[2], ks[3], n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("f", [1, 7, 8, 10, 31, 32, 33, 40, 64, 100, ROWS_WIDE - 1, ROWS_WIDE, 300])
def test_add4_rows_gives_the_scalar_sums_bits(dtype, f):
    """kernels.lanes.add4_rows, the ES-SpMM kernel's group sum: four vectors per step, one, then an overlapping
    pair for the last columns (float32 under ROWS_WIDE features), LLVM's loop otherwise; the bits of NumPy's sum in every case, and
    only the first ``n`` columns written."""
    rng = np.random.default_rng(1000 + f)
    xs = (rng.standard_normal((4, f + 3)) * 1e3).astype(dtype)
    ks = rng.standard_normal(4).astype(dtype)
    acc = rng.standard_normal(f + 3).astype(dtype)
    if f > 2:
        xs[1, 1], xs[2, f - 1] = np.nan, -np.inf
    want = acc.copy()
    want[:f] += (ks[0] * xs[0, :f] + ks[1] * xs[1, :f]) + (ks[2] * xs[2, :f] + ks[3] * xs[3, :f])
    got = acc.copy()
    _rows_sum(got, xs, ks, f)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    spec = acc.copy()
    add4_rows(spec, xs[0], xs[1], xs[2], xs[3], *ks, f)  # the Python function is the specification
    assert np.array_equal(spec.view(np.uint8), want.view(np.uint8))


def test_add4_rows_takes_the_vectors_only_where_they_type():
    """The overload's choice by numba type: float32 contiguous rows, a writable output and float32 weights get
    the vector code; float64, strided or read-only rows and float64 weights the plain loop (no typing error)."""
    f32, f64 = numba.float32, numba.float64
    row = numba.types.Array(f32, 1, "C")
    rows = (row, row, row, row)

    def chosen(acc, xs, k):
        return _add4_rows_numba(acc, *xs, k, k, k, k, numba.int64).__name__

    assert chosen(row, rows, f32) == "vectors"
    assert chosen(numba.types.Array(f64, 1, "C"), (numba.types.Array(f64, 1, "C"),) * 4, f64) == "loop"
    assert chosen(row, (row, numba.types.Array(f32, 1, "A"), row, row), f32) == "loop"
    assert chosen(numba.types.Array(f32, 1, "C", readonly=True), rows, f32) == "loop"
    assert chosen(row, rows, f64) == "loop"


def test_add4_rows_sums_strided_rows_in_the_plain_loop():
    xs = np.arange(4 * 40, dtype=np.float32).reshape(4, 40)[:, ::2]  # rows of 20, stride 2: no vectors
    ks = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    got = np.ones(20, np.float32)
    _rows_sum(got, xs, ks, 20)
    want = np.ones(20, np.float32) + ((ks[0] * xs[0] + ks[1] * xs[1]) + (ks[2] * xs[2] + ks[3] * xs[3]))
    assert np.array_equal(got, want)


@numba.njit
def _lanes_pair(acc, xs, ks, off, off2):  # pragma: no cover - compiled
    add4_lanes2(acc, xs[0], xs[1], xs[2], xs[3], off, off2, ks[0], ks[1], ks[2], ks[3])


@pytest.mark.parametrize("off2", [0, 2, 7, 8, 12])
def test_a_pair_of_vectors_adds_every_column_once(off2):
    """add4_lanes2 at 0 and ``off2``: both read before either is written, so the columns two overlapping
    vectors share are added once, with the scalar sum's bits; columns outside both are untouched."""
    rng = np.random.default_rng(off2)
    xs = rng.standard_normal((4, 24)).astype(np.float32) * 100
    ks = rng.standard_normal(4).astype(np.float32)
    acc = rng.standard_normal(24).astype(np.float32)
    cover = np.zeros(24, bool)
    cover[0:8] = cover[off2:off2 + 8] = True
    want = acc.copy()
    want[cover] += ((ks[0] * xs[0] + ks[1] * xs[1]) + (ks[2] * xs[2] + ks[3] * xs[3]))[cover]
    got = acc.copy()
    _lanes_pair(got, xs, ks, 0, off2)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
