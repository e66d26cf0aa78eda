"""The batch-invariant product (kernels.dense.rows_matmul) against the BLAS products it replaced, side by side.

Per shape ``M x K x N``: the kernel called from numba code (how the compiled forwards call it), ``np.dot`` from
numba code (SciPy's OpenBLAS, what the compiled forwards called before), torch's CPU matmul (MKL/oneDNN, what
the torch paths called), and the Python entry ``rows_matmul``; all on one thread (the BLAS pools limited to one,
as a server sets them), best of ``--rounds`` alternating rounds. Also checked on each shape: whether each
product gives a row the same bits alone as inside the whole matrix (``x[:1] @ w`` against ``(x @ w)[:1]``).

    python benchmarks/dense.py
    python benchmarks/dense.py --shapes 1x767x64,4096x64x64 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.dense import TILE_BYTES, rows_matmul, rows_matmul_new

DEFAULT_SHAPES = "1x64x64,8x64x64,64x64x64,4096x64x64,64x128x10,1x767x64,8x767x64,1000x767x64,256x256x256"


@numba.njit(nogil=True)
def _rows(x, w, reps):  # pragma: no cover - compiled
    s = 0.0
    for _ in range(reps):
        s += rows_matmul_new(x, w)[0, 0]
    return s


@numba.njit(nogil=True)
def _blas(x, w, reps):  # pragma: no cover - compiled
    s = 0.0
    for _ in range(reps):
        s += np.dot(x, w)[0, 0]
    return s


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _per_call_us(fn, reps: int) -> float:
    t0 = time.perf_counter()
    fn(reps)
    return (time.perf_counter() - t0) / reps * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxKxN")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=float, default=2e7, help="multiply-adds per timed call group (sets repetitions)")
    args = ap.parse_args(argv)
    import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls SciPy's BLAS)
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print("## Batch-invariant products (`benchmarks/dense.py`)\n")
    print(f"`python benchmarks/dense.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {platform.machine()} ({_cpu_name()}), one thread, "
          f"{TILE_BYTES}-byte tiles; us per product, best of {args.rounds} alternating rounds\n")
    print("| M x K x N | rows_matmul (numba) | np.dot (numba, OpenBLAS) | torch matmul | rows_matmul (Python) "
          "| BLAS / rows | torch / rows | a row's bits alone = in the batch: rows, OpenBLAS, torch |")
    print("|---|---|---|---|---|---|---|---|")
    with threadpool_limits(1):
        for shape in args.shapes.split(","):
            m, k, n = (int(v) for v in shape.lower().split("x"))
            x = rng.standard_normal((m, k)).astype(np.float32)
            w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            reps = max(3, int(args.work / max(m * k * n, 1)))
            fns = {
                "rows": lambda r, x=x, w=w: _rows(x, w, r),
                "blas": lambda r, x=x, w=w: _blas(x, w, r),
                "torch": lambda r, xt=xt, wt=wt: [xt @ wt for _ in range(r)],
                "py": lambda r, x=x, w=w: [rows_matmul(x, w) for _ in range(r)],
            }
            for f in fns.values():
                f(1)  # compile, warm
            best = {name: float("inf") for name in fns}
            for _ in range(args.rounds):
                for name, f in fns.items():
                    best[name] = min(best[name], _per_call_us(f, reps))
            same = [np.array_equal(rows_matmul(x[:1], w), rows_matmul(x, w)[:1]),
                    np.array_equal(_blas1(x[:1], w), _blas1(x, w)[:1]),
                    torch.equal(xt[:1] @ wt, (xt @ wt)[:1])]
            print(f"| {m} x {k} x {n} | {best['rows']:.2f} | {best['blas']:.2f} | {best['torch']:.2f} | "
                  f"{best['py']:.2f} | {best['blas'] / best['rows']:.2f} | {best['torch'] / best['rows']:.2f} | "
                  f"{', '.join('yes' if s else 'no' for s in same)} |", flush=True)
    return 0


@numba.njit(nogil=True)
def _blas1(x, w):  # pragma: no cover - compiled
    return np.dot(x, w)


if __name__ == "__main__":
    raise SystemExit(main())
