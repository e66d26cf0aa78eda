"""kernels.dense: row-wise products with the same bits as their torch specification and as the same rows in
any other batch."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from kernels import dense
from kernels.dense import fma_reference, rows_matmul, rows_matmul_reference, transposed
from models.base import linear_any


def _operands(rng, m, k, n, dtype=np.float32, zeros=0.3):
    x = rng.standard_normal((m, k)).astype(dtype)
    x[rng.random((m, k)) < zeros] = 0
    return x, rng.standard_normal((k, n)).astype(dtype)


SHAPES = [(1, 767, 64), (7, 64, 64), (64, 129, 10), (300, 5, 130), (3, 1, 1), (2, 3, 7), (33, 8, 128), (5, 4, 200),
          (9, 6, 3), (6, 11, 12), (4, 2, 16), (13, 40, 47)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_matmul_equals_its_torch_specification_bit_for_bit(m, k, n, dtype):
    rng = np.random.default_rng(m * 1000 + k + n)
    x, w = _operands(rng, m, k, n, dtype)
    got = rows_matmul(x, w)
    assert got.dtype == dtype and got.shape == (m, n)
    if dtype == np.float32:  # the specification is float32's (float64's would need wider arithmetic)
        assert np.array_equal(got, rows_matmul_reference(torch.from_numpy(x), torch.from_numpy(w)).numpy())
    else:
        assert np.array_equal(got, rows_matmul(x[::-1].copy(), w)[::-1])
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.astype(np.float64), rtol=tol, atol=tol * np.sqrt(k))


def test_a_row_has_the_same_bits_in_every_batch_and_on_any_thread_count():
    rng = np.random.default_rng(1)
    x, w = _operands(rng, 700, 767, 64)
    whole = rows_matmul(x, w, threads=1)
    assert np.array_equal(rows_matmul(x, w, threads=2), whole)
    assert np.array_equal(rows_matmul(x, w, threads=7), whole)
    for lo, hi in [(0, 1), (5, 6), (3, 10), (100, 164), (0, 63), (650, 700)]:
        assert np.array_equal(rows_matmul(x[lo:hi], w), whole[lo:hi]), (lo, hi)
    perm = rng.permutation(700)
    assert np.array_equal(rows_matmul(x[perm], w), whole[perm])


def test_the_fma_specification_rounds_once():
    """fma_reference against exact rational arithmetic on cases where rounding twice (float64, then float32)
    goes wrong, and on random ones; and the compiled kernel's scalar fma against it."""
    from fractions import Fraction

    rng = np.random.default_rng(5)
    a = rng.standard_normal(4000).astype(np.float32)
    b = rng.standard_normal(4000).astype(np.float32)
    c = (rng.standard_normal(4000) * 10.0 ** rng.integers(-12, 3, 4000)).astype(np.float32)
    # products exactly halfway between two float32 plus a tiny c: the float64 sum rounds to the halfway point,
    # and rounding that to float32 (ties to even) goes the wrong way
    h = np.float32(1 + 2.0 ** -12)
    a[:3] = [h, h, -h]
    b[:3] = [h, np.float32(1 + 3 * 2.0 ** -12), h]  # 1 + 2^-11 + 2^-24; 1 + 2^-10 + 2^-23 + 2^-24
    c[:3] = [np.float32(2.0 ** -70), np.float32(-(2.0 ** -70)), np.float32(-(2.0 ** -80))]
    naive = (a[:3].astype(np.float64) * b[:3] + c[:3]).astype(np.float32)
    got = fma_reference(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)).numpy()
    exact = [np.float32(float(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))) for x, y, z in zip(a, b, c, strict=True)]
    # float() of a Fraction rounds correctly to float64, and float64 -> float32 rounds again: recheck the
    # float32 candidates around it by exact distance instead
    for i, (x, y, z) in enumerate(zip(a, b, c, strict=True)):
        t = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        cands = [exact[i], np.nextafter(exact[i], np.float32(np.inf)), np.nextafter(exact[i], np.float32(-np.inf))]
        best = min(cands, key=lambda v: (abs(Fraction(float(v)) - t), int(np.float32(v).view(np.int32)) & 1))
        assert got[i] == best, (i, x, y, z, got[i], best)
    assert (naive != got[:3]).all()  # the cases do need the single rounding
    for i in range(0, 4000, 400):  # the kernel's fma on one element (a masked vector of one column)
        xs = np.array([[a[i]]], np.float32)
        ws = np.array([[b[i]]], np.float32)
        assert rows_matmul(xs, ws)[0, 0] == fma_reference(torch.tensor([a[i]]), torch.tensor([b[i]]),
                                                          torch.zeros(1))[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_tile_writes_its_own_elements_only(dtype):
    """Row counts that take every tile (8 x 1 for rows one vector wide or less, 4 x up to 4 vectors, the last
    1 to 3 rows together) and widths whose last vector is masked: each element has the specification's bits,
    nothing past the output is written, and rows computed one at a time from the last (a masked lane written
    past a row's end would overwrite the next row, already done) or in a middle range leave the others alone."""
    lanes = dense.TILE_BYTES // np.dtype(dtype).itemsize
    rng = np.random.default_rng(11)
    widths = sorted({1, 2, lanes - 1, lanes, lanes + 1, 2 * lanes + 3, 3 * lanes, 4 * lanes + 1, 5 * lanes - 2,
                     9 * lanes + 5})
    for n in widths:
        for m in (1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 17):
            x, w = _operands(rng, m, 9, n, dtype)
            if dtype == np.float32:
                want = rows_matmul_reference(torch.from_numpy(x), torch.from_numpy(w)).numpy()
            else:  # float64: each row alone (one-row tiles) against the whole product's tiles
                want = np.concatenate([rows_matmul(x[i:i + 1], w) for i in range(m)])
                np.testing.assert_allclose(want, x @ w, rtol=1e-12, atol=1e-12)
            buf = np.full(m * n + 2 * lanes, 7.0, dtype=dtype)
            out = buf[:m * n].reshape(m, n)
            dense.rows_matmul_into(x, w, out, 0, m)
            assert np.array_equal(out, want), (m, n)
            assert (buf[m * n:] == 7.0).all(), (m, n)
            one = np.full((m, n), 7.0, dtype=dtype)
            for i in reversed(range(m)):
                dense.rows_matmul_into(x, w, one, i, i + 1)
            assert np.array_equal(one, want), (m, n)
            part = np.full((m, n), 7.0, dtype=dtype)
            dense.rows_matmul_into(x, w, part, m // 3, m - m // 3)
            assert np.array_equal(part[m // 3:m - m // 3], want[m // 3:m - m // 3]), (m, n)
            assert (part[:m // 3] == 7.0).all() and (part[m - m // 3:] == 7.0).all(), (m, n)


def test_graphsage_keeps_its_stacked_weights_until_they_change():
    """SAGEConv.transform_matrix: outside autograd one stacked ``[W_r; W_n]`` (and through it one kept transpose)
    until a weight changes in place or is replaced; under autograd a fresh one whose gradient reaches both."""
    from models.sage import SAGEConv

    torch.manual_seed(3)
    conv = SAGEConv(40, 6)
    x = torch.randn(9, 40)
    with torch.inference_mode():
        first = conv.transform_matrix()
        assert conv.transform_matrix() is first and not first.is_inference()
        assert transposed(first) is transposed(conv.transform_matrix())
        before = conv.transform(x)
        torch.testing.assert_close(before, x @ torch.cat([conv.weight_root, conv.weight_neigh]).t())
    with torch.no_grad():
        conv.weight_neigh.mul_(2.0)  # in place: its version moves
    with torch.inference_mode():
        after = conv.transform(x)
        assert conv.transform_matrix() is not first
        assert torch.equal(after[:, :6], before[:, :6])
        torch.testing.assert_close(after[:, 6:], 2.0 * before[:, 6:])
    conv.load_state_dict({k: torch.zeros_like(v) for k, v in conv.state_dict().items()})
    with torch.inference_mode():
        assert (conv.transform(x) == 0).all()
    assert "_stacked" not in conv.state_dict()
    conv.transform(x).sum().backward()  # autograd: both weights get their gradient
    assert conv.weight_root.grad.abs().sum() > 0 and conv.weight_neigh.grad.abs().sum() > 0


def test_special_values_propagate_like_a_product():
    w = np.ones((4, 3), dtype=np.float32)
    x = np.array([[np.nan, 0, 0, 0], [np.inf, 1, 0, 0], [0, 0, 0, 0]], dtype=np.float32)
    got = rows_matmul(x, w)
    assert np.isnan(got[0]).all() and np.isinf(got[1]).all() and (got[2] == 0).all()


def test_tensors_in_tensors_out_and_bad_operands_refused():
    x = torch.randn(3, 5)
    w = torch.randn(5, 2)
    out = rows_matmul(x, w)
    assert isinstance(out, torch.Tensor) and out.shape == (3, 2)
    torch.testing.assert_close(out, x @ w)
    assert rows_matmul(np.zeros((0, 5), np.float32), w.numpy()).shape == (0, 2)
    with pytest.raises(ValueError, match="do not multiply"):
        rows_matmul(x, torch.randn(4, 2))
    with pytest.raises(ValueError, match="one dtype"):
        rows_matmul(x, w.double())
    with pytest.raises(ValueError, match="one dtype"):
        rows_matmul(x.half(), w.half())


def test_linear_any_serves_batch_invariant_rows_and_trains_with_torch():
    torch.manual_seed(0)
    lin = torch.nn.Linear(767, 64)
    x = torch.randn(200, 767)
    with torch.inference_mode():
        whole = linear_any(x, lin.weight)
        assert all(torch.equal(linear_any(x[i:i + 1], lin.weight), whole[i:i + 1]) for i in range(0, 200, 17))
        torch.testing.assert_close(whole, x @ lin.weight.t())
    # autograd: torch's product, with a gradient
    y = linear_any(x, lin.weight)
    y.sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.shape == lin.weight.shape


def test_the_transposed_weight_follows_in_place_updates_and_is_released():
    w = torch.nn.Parameter(torch.randn(6, 4))
    a = transposed(w)
    assert transposed(w) is a
    with torch.no_grad():
        w.mul_(2)  # an optimiser step: in place
    b = transposed(w)
    assert b is not a and np.array_equal(b, w.detach().t().numpy())
    wid = id(w)
    assert wid in dense._TRANSPOSED
    del w
    gc.collect()
    assert wid not in dense._TRANSPOSED


def test_a_weight_made_under_inference_mode_is_used_as_it_is():
    """An inference tensor has no version counter (a weight assembled per call, as GraphSAGE's
    ``[W_r; W_n]``): it is transposed afresh, not cached."""
    with torch.inference_mode():
        w = torch.randn(5, 3)
        x = torch.randn(4, 3)
        assert np.array_equal(transposed(w), w.t().numpy())
        torch.testing.assert_close(linear_any(x, w), x @ w.t())


def test_the_benchmark_times_every_product_and_checks_the_rows_bits(capsys):
    """benchmarks/dense.py end to end on two small shapes: one row each, positive times, and this kernel's row
    alone equal to the same row in the batch."""
    from .test_fused_forward import _benchmark

    mod = _benchmark("dense")
    assert mod.main(["--shapes", "3x20x9,17x33x70", "--rounds", "1", "--work", "1e4"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 3 x") or ln.startswith("| 17 x")]
    assert len(rows) == 2
    for r in rows:
        cells = [c.strip() for c in r.strip(" |").split("|")]
        assert all(float(c) > 0 for c in cells[1:7]), r
        assert cells[7].split(", ")[0] == "yes", r


_CHECK_32 = """
import numpy as np, torch
from kernels import dense
assert dense.TILE_BYTES == 32, dense.TILE_BYTES
rng = np.random.default_rng(3)
for m, k, n in [(1, 767, 64), (3, 9, 10), (4, 5, 8), (9, 7, 9), (12, 33, 47), (17, 3, 1), (2, 40, 130)]:
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    got = dense.rows_matmul(x, w)
    assert np.array_equal(got, dense.rows_matmul_reference(torch.from_numpy(x), torch.from_numpy(w)).numpy()), (m, k, n)
    assert all(np.array_equal(dense.rows_matmul(x[i:i + 1], w), got[i:i + 1]) for i in range(m)), (m, k, n)
print("ok")
"""


def test_the_32_byte_tiles_of_a_cpu_without_avx512(tmp_path):
    """A process whose numba compiles for a CPU without AVX-512 (``NUMBA_CPU_FEATURES``) takes the 32-byte tiles
    (4 rows x 2 vectors, masked 8-lane last vectors), with the specification's bits: the code an AVX2 machine
    runs, checked on this one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import llvmlite.binding as llvm

    # every AVX-512 feature off (the host's CPU name would otherwise imply them): AVX2's masked moves, 16 registers
    feats = [("-" + f[1:]) if f[1:].startswith("avx512") else f for f in llvm.get_host_cpu_features().flatten().split(",") if f]
    if "+avx2" not in feats or "+fma" not in feats:
        pytest.skip("the host has no AVX2 with fma to run the 32-byte tiles natively")
    env = {**os.environ, "NUMBA_CPU_FEATURES": ",".join(feats), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    out = subprocess.run([sys.executable, "-c", _CHECK_32], cwd=Path(__file__).resolve().parent.parent, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
