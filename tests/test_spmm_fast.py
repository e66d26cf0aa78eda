"""The fast CPU paths of the public ``kernels.sampled_spmm`` against its torch twin (the specification).

Every call here goes through :func:`kernels.sampled_spmm` on CPU tensors without gradient, which
runs the compiled kernel of :mod:`kernels.spmm_cpu` (serial or parallel over rows) or, for exact
passes, ``torch.sparse.mm`` over :func:`kernels.spmm.exact_csr_view`; the answer is compared with
:func:`kernels.sampled_spmm_torch` on random graphs that hold every kind of row (no edges, below,
at and above the width, nnz a multiple of 577).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
from numba.core.caching import FunctionCache
from numba.core.registry import CPUDispatcher

import kernels
from kernels import sampled_spmm, sampled_spmm_torch, spmm_cpu
from kernels import spmm as spmm_mod
from kernels.graph import CSRGraph

STRATEGIES = ("fastrand", "bucket")
AGGREGATORS = ("sum", "mean", "gcn")
WIDTHS = (0, 1, 7, 16, 577, 5000)


def make_graph(seed: int, *, n: int = 1300, weighted: bool = False, big_rows: bool = True) -> CSRGraph:
    """A random graph: degrees drawn from a skewed mix with many empty rows; with ``big_rows`` three
    rows of 577, 1154 (multiples of the fastrand prime) and 1000 edges, each with distinct columns."""
    rng = np.random.default_rng(seed)
    degs = rng.choice([0, 0, 1, 2, 6, 7, 8, 15, 16, 17, 40, 120], size=n)
    if big_rows:
        degs[rng.choice(n, size=3, replace=False)] = (577, 1154, 1000)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degs, out=indptr[1:])
    indices = np.concatenate([np.sort(rng.choice(n, size=int(d), replace=False)) for d in degs] + [np.zeros(0)])
    w = rng.uniform(0.1, 2.0, size=len(indices)).astype(np.float32) if weighted else None
    g = CSRGraph(indptr, indices.astype(np.int32), w, n)
    g.validate()
    return g


def fresh(g: CSRGraph) -> CSRGraph:
    return CSRGraph(g.indptr, g.indices, g.weights, g.num_nodes)


_SPEC: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def spec(g: CSRGraph, x: torch.Tensor, width: int, strategy: str, aggregator: str, key: tuple | None = None):
    """The torch twin's answer and the same on ``|x|`` (memoized under ``key`` when given)."""
    if key is not None and key in _SPEC:
        return _SPEC[key]
    out = (sampled_spmm_torch(fresh(g), x, width, strategy, aggregator),
           sampled_spmm_torch(fresh(g), x.abs(), width, strategy, aggregator))
    if key is not None:
        _SPEC[key] = out
    return out


def assert_matches_spec(got: torch.Tensor, g: CSRGraph, x: torch.Tensor, width: int, strategy: str, aggregator: str,
                        what: str, key: tuple | None = None) -> None:
    # rounding error grows with the sum of magnitudes (scale), not with the (possibly cancelling) result
    want, scale = spec(g, x, width, strategy, aggregator, key)
    f32 = x.dtype == torch.float32
    tol = (4e-6 if f32 else 1e-13) * scale + (2e-5 if f32 else 1e-12)
    assert got.dtype == x.dtype and got.shape == want.shape, what
    err = (got - want).abs()
    assert bool(torch.all(err <= tol)), f"{what}: max error {float(err.max()):.3g}"


@pytest.fixture
def parallel_always(monkeypatch):
    """Every graph takes the parallel kernel, however small."""
    monkeypatch.setattr(spmm_cpu, "PARALLEL_ROWS", 0)


@pytest.fixture(params=["kernel", "torch"])
def exact_backend(request, monkeypatch):
    monkeypatch.setattr(spmm_mod, "EXACT_BACKEND", request.param)
    return request.param


@pytest.mark.parametrize("seed, weighted, f", [(0, False, 5), (1, True, 13), (2, False, 67), (3, True, 1), (4, False, 8),
                                               (5, True, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("parallel", [False, True])
def test_public_function_matches_torch_twin(seed, weighted, f, dtype, parallel, exact_backend, monkeypatch):
    if parallel:
        monkeypatch.setattr(spmm_cpu, "PARALLEL_ROWS", 0)
    else:
        monkeypatch.setattr(spmm_cpu, "PARALLEL_ROWS", 1 << 62)
        monkeypatch.setattr(spmm_cpu, "PARALLEL_WORK", 1 << 62)
    g = make_graph(seed, weighted=weighted)
    assert (g.degrees == 0).any() and (g.degrees % 577 == 0).sum() >= 3  # empty rows, 577 and 1154
    x = torch.from_numpy(np.random.default_rng(100 + seed).standard_normal((g.num_nodes, f))).to(dtype)
    with torch.no_grad():
        for strategy in STRATEGIES:
            for aggregator in AGGREGATORS:
                for width in WIDTHS:
                    got = sampled_spmm(g, x, width, strategy, aggregator)
                    assert_matches_spec(got, g, x, width, strategy, aggregator,
                                        f"{strategy} {aggregator} S={width} {dtype} parallel={parallel}",
                                        key=(seed, dtype, width, strategy, aggregator))
    assert not g.cache().get("spmm_csr"), "the fast paths memoize no sparse matrix"


def test_fast_kernel_reads_the_fastrand_positions():
    """A row whose columns are its own positions: the kernel's sum is the sum of the kept positions,
    which must be the formula's (distinct, including the rows of nnz 577 and 1154)."""
    for d, width in [(577, 16), (1154, 16), (1154, 600), (1731, 1000), (600, 7), (578, 577), (40, 39)]:
        n = d
        indptr = np.array([0, d] + [d] * (n - 1), dtype=np.int64)
        g = CSRGraph(indptr, np.arange(d, dtype=np.int32), None, n)
        x = torch.arange(n, dtype=torch.float64).unsqueeze(1)
        t = torch.arange(width)
        pos = spmm_mod.sample_positions(torch.full((width,), d), t, width, "fastrand")
        assert len(set(pos.tolist())) == width
        with torch.no_grad():
            got = sampled_spmm(g, x, width, "fastrand", "mean")
        assert float(got[0, 0]) == pytest.approx(float(pos.double().mean()), rel=1e-12), (d, width)


@numba.njit(cache=False)
def _walked(fastrand, width, d, k):
    w = spmm_cpu.walk_start(fastrand, width, d, k)
    kind = w[0]
    out = np.empty(k, np.int64)
    for t in range(k):
        p, w = spmm_cpu.walk_step(w)
        out[t] = p
    return kind, out


def test_the_walk_gives_the_formula_positions_for_every_kind_of_row():
    """walk_start / walk_step (the CPU kernel, the execution plans and the compiled forwards walk rows with
    them) against the closed form of sample_positions, on rows of every kind: at or below the width, sampled
    with a period of at least k, and degrees that are multiples of 577 keeping more than their period."""
    kinds = set()
    for d in (1, 2, 7, 8, 9, 576, 577, 578, 1154, 1155, 1731, 2308, 5000):
        for width in (0, 1, 3, 8, 16, 577, 600, 1200):
            k = d if width <= 0 or d <= width else width
            for fastrand in (True, False):
                kind, got = _walked(fastrand, width, d, k)
                kinds.add(kind)
                strategy = "fastrand" if fastrand else "bucket"
                want = spmm_mod.sample_positions(torch.full((k,), d), torch.arange(k), width, strategy)
                assert got.tolist() == want.tolist(), (d, width, fastrand, kind)
    assert kinds == {0, 1, 2}


def test_parallel_equals_serial_exactly(parallel_always, monkeypatch):
    monkeypatch.setattr(spmm_mod, "EXACT_BACKEND", "kernel")  # exact passes too: the kernel both times
    g = make_graph(5, weighted=True)
    x = torch.randn(g.num_nodes, 37)
    with torch.no_grad():
        par = [sampled_spmm(g, x, w, s, a) for w in (0, 7, 16) for s in STRATEGIES for a in AGGREGATORS]
    monkeypatch.setattr(spmm_cpu, "PARALLEL_ROWS", 10**9)
    monkeypatch.setattr(spmm_cpu, "PARALLEL_WORK", 1 << 62)
    with torch.no_grad():
        ser = [sampled_spmm(g, x, w, s, a) for w in (0, 7, 16) for s in STRATEGIES for a in AGGREGATORS]
    for p, s in zip(par, ser, strict=True):
        assert torch.equal(p, s)


@pytest.mark.parametrize(("chunk", "threads"), [(1, 2), (7, 2), (7, 3), (333, 2), (10_000, 2)])
def test_parallel_driver_writes_every_row_as_the_serial_kernel(chunk, threads):
    """spmm_cpu._kernel_parallel deals ranges of ``chunk`` rows round-robin to ``threads`` and runs the serial
    kernel on views of them: every row written (the output starts as NaN), each as the serial kernel writes
    it, whatever the range size (1 row, one that does not divide n, more than n) and thread count."""
    g = make_graph(9, n=1501, weighted=True)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((g.num_nodes, 12)).astype(np.float32)  # one vector and a scalar tail
    dinv = rng.uniform(0.1, 1.0, g.num_nodes).astype(np.float32)
    for width, agg in ((0, 2), (16, 2), (7, 1), (16, 0)):
        want = np.full_like(x, np.nan)
        got = np.full_like(x, np.nan)
        args = (g.indptr, g.indices, g.weights, x, width, True, agg, dinv)
        spmm_cpu.serial_kernel(x.shape[1])(*args, want, 0)
        spmm_cpu._parallel(*args, got, chunk, threads)
        assert not np.isnan(want).any()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (width, agg)


def test_every_cached_kernel_has_its_own_cache_file():
    """numba names a cache file after the function, not after its compile flags: two cached dispatchers of
    one function read each other's machine code (the parallel kernel ran serially that way)."""
    files: dict[str, str] = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        mod = importlib.import_module(f"kernels.{info.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher) and isinstance(obj._cache, FunctionCache):
                path = obj._cache._cache_file._index_path
                owner = files.setdefault(path, f"{obj.py_func.__module__}.{obj.py_func.__qualname__}/{id(obj)}")
                assert owner == f"{obj.py_func.__module__}.{obj.py_func.__qualname__}/{id(obj)}", (
                    f"kernels.{info.name}.{name} shares its numba cache file with {owner}")
    assert len(files) > 20  # the scan found the package's kernels


def _fresh_process(script: str, tmp_path: Path, timeout: float, **env: str | None) -> list[str]:
    """The words ``script`` prints in a new Python process run from the repository, on numba's cache under
    ``tmp_path`` (empty on the first run), with ``env`` changed (``None``: the variable removed)."""
    root = Path(__file__).resolve().parent.parent
    full = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(root)}
    for name, value in env.items():
        full.pop(name, None)
        if value is not None:
            full[name] = value
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=full, cwd=root,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


_THREADS_LAUNCHED = """
import sys
import numpy as np
from numba.np.ufunc import parallel
from kernels import spmm_cpu
indptr = np.array([0, 2, 3], dtype=np.int64)
indices = np.array([1, 0, 0], dtype=np.int32)
x = np.ones((2, 3), np.float32)
args = (indptr, indices, spmm_cpu._NO_W, x, 0, True, 0, np.zeros(0, np.float32), np.empty_like(x))
spmm_cpu.serial_kernel(x.shape[1])(*args, 0)
print(parallel._is_initialized)
spmm_cpu._parallel(*args, 1, 2)
print(parallel._is_initialized)
"""


def test_serial_and_parallel_kernels_stay_what_they_are_through_the_cache(tmp_path):
    """In a fresh process with an empty numba cache, and again in one that loads both from it, the serial
    kernel runs no parallel region (numba's thread pool stays down) and the parallel one does (it brings
    the pool up). Before each had its own cache file, whichever compiled first served both."""
    for run in ("compiles", "loads from the cache"):
        assert _fresh_process(_THREADS_LAUNCHED, tmp_path, 300) == ["False", "True"], run
    # the serial kernel for width 3 (serial_kernel_f3), the generic _kernel that the parallel driver calls, the driver
    assert len(list((tmp_path / "numba").rglob("spmm_cpu.*.nbi"))) == 3


def test_large_graph_parallel_path_and_chunking():
    """A graph above PARALLEL_ROWS: the natural parallel path, several chunks per thread."""
    g = make_graph(6, n=9000, big_rows=True)
    assert g.num_nodes >= spmm_cpu.PARALLEL_ROWS
    x = torch.randn(g.num_nodes, 33)
    with torch.no_grad():
        for width in (0, 16):
            for aggregator in ("sum", "mean"):
                got = sampled_spmm(g, x, width, "fastrand", aggregator)
                assert_matches_spec(got, g, x, width, "fastrand", aggregator, f"S={width} {aggregator}")


def test_thread_count_follows_torch_and_numba(monkeypatch):
    torch_threads = torch.get_num_threads()
    assert spmm_cpu.kernel_threads() == max(1, min(torch_threads, numba.get_num_threads()))
    g = make_graph(7, n=5000)
    x = torch.randn(g.num_nodes, 8)
    with torch.no_grad():
        want = sampled_spmm(g, x, 16)
    seen = []
    real = spmm_cpu._parallel

    def spy(*args):
        seen.append(numba.get_num_threads())
        return real(*args)

    def no_serial(*args):
        raise AssertionError("a graph above PARALLEL_ROWS ran serially with more than one thread")

    monkeypatch.setattr(spmm_cpu, "_parallel", spy)
    try:
        torch.set_num_threads(1)  # torch's configured count caps the kernel: one thread, serial
        assert spmm_cpu.kernel_threads() == 1
        with torch.no_grad():
            assert torch.equal(sampled_spmm(g, x, 16), want)
        assert seen == []
        if numba.config.NUMBA_NUM_THREADS >= 2:
            torch.set_num_threads(2)
            monkeypatch.setattr(spmm_cpu, "serial_kernel", lambda f: no_serial)
            with torch.no_grad():
                assert torch.equal(sampled_spmm(g, x, 16), want)  # the result does not depend on it
            assert seen == [2]
            assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS  # restored after the call
    finally:
        torch.set_num_threads(torch_threads)


_TORCH_THREADS_KEPT = """
import threading
import numpy as np
import torch
from kernels import spmm_cpu
from kernels.ppr import ppr_topk
from kernels.threads import numba_threads
from tests.test_spmm_fast import make_graph
seen = []

def worker(run):
    seen.append(torch.get_num_threads())
    run()
    seen.append(torch.get_num_threads())

g = make_graph(3, n=5000)
x = torch.ones(g.num_nodes, 8)
runs = [lambda: spmm_cpu.sampled_spmm_cpu(g, x, 4, "fastrand", "sum"),  # the first: starts numba's pool
        lambda: ppr_topk(g, np.arange(4))]
for run in runs:
    t = threading.Thread(target=worker, args=(run,))
    t.start()
    t.join()
worker(lambda: numba_threads() > 1 or exit(3))  # numba's own count is every core; the main thread's stays
print(*seen)
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="numba's default thread count is 1 here: nothing to reset")
def test_numba_does_not_change_torch_thread_count(tmp_path):
    """numba's pool, started by the first query or parallel kernel of a thread, set that thread's OpenMP
    count (which torch reads) to numba's: with OMP_NUM_THREADS=1 alone, torch then ran on every core.
    kernels.threads.numba_threads keeps torch's count, in the main thread and in a worker thread that runs
    a parallel pass and a PPR batch."""
    assert _fresh_process(_TORCH_THREADS_KEPT, tmp_path, 600, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS=None,
                          MKL_NUM_THREADS=None) == ["1"] * 6


def test_exact_dispatch_rule(monkeypatch):
    """``auto``: an exact pass over fewer than EXACT_KERNEL_MIN_FEATURES features on a graph of EXACT_MKL_MIN_ROWS
    rows or more goes to MKL over the view; sampled passes, wider exact passes and exact passes on smaller
    graphs run the kernel."""
    g = make_graph(8, n=5000, weighted=True)
    assert g.num_nodes >= spmm_mod.EXACT_MKL_MIN_ROWS
    x = torch.randn(g.num_nodes, 12)
    calls = []
    real = spmm_mod._exact_spmm_mkl
    monkeypatch.setattr(spmm_mod, "_exact_spmm_mkl", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(spmm_mod, "EXACT_BACKEND", "auto")
    with torch.no_grad():
        sampled_spmm(g, x, 16)  # sampled: the kernel
        small = make_graph(9, n=300, big_rows=False)  # below EXACT_MKL_MIN_ROWS: the kernel
        sampled_spmm(small, torch.randn(300, 3), 0)
        assert calls == []
        got = sampled_spmm(g, x, 0, aggregator="gcn")
        assert calls == [1]
        sampled_spmm(g, x, int(g.degrees.max()), aggregator="mean")  # a width no row exceeds is exact
        assert calls == [1, 1]
    assert_matches_spec(got, g, x, 0, "fastrand", "gcn", "gcn through MKL")
    wide = torch.randn(g.num_nodes, spmm_mod.EXACT_KERNEL_MIN_FEATURES)
    with torch.no_grad():
        got = sampled_spmm(g, wide, 0, aggregator="gcn")  # as wide as the rule's bound: the kernel
    assert calls == [1, 1]
    assert_matches_spec(got, g, wide, 0, "fastrand", "gcn", "wide gcn through the kernel")
    # short rows (mean degree at most EXACT_SHORT_ROWS_DEGREE): gcn and mean from EXACT_SHORT_ROWS_MIN_FEATURES
    # features run the kernel, sum stays with MKL; on g (mean degree about 19) gcn stays with MKL there too
    rng = np.random.default_rng(4)
    n = 5000
    degs = rng.choice([0, 1, 2, 3, 4, 6, 9], size=n)
    indptr = np.concatenate([[0], np.cumsum(degs)]).astype(np.int64)
    short = CSRGraph(indptr, rng.integers(0, n, int(indptr[-1])).astype(np.int32), None, n)
    assert short.num_edges <= spmm_mod.EXACT_SHORT_ROWS_DEGREE * n < g.num_edges * n / g.num_nodes
    f = spmm_mod.EXACT_SHORT_ROWS_MIN_FEATURES
    with torch.no_grad():
        for graph, feats, aggregator, to_mkl in ((short, f, "gcn", False), (short, f, "mean", False),
                                                 (short, f, "sum", True), (short, f - 1, "gcn", True),
                                                 (g, f, "gcn", True)):
            before = len(calls)
            xs = torch.randn(graph.num_nodes, feats)
            got = sampled_spmm(graph, xs, 0, aggregator=aggregator)
            assert len(calls) - before == int(to_mkl), (graph.num_nodes, feats, aggregator)
            assert_matches_spec(got, graph, xs, 0, "fastrand", aggregator, f"{aggregator} F={feats}")
    calls.clear()
    monkeypatch.setattr(spmm_mod, "EXACT_BACKEND", "kernel")
    with torch.no_grad():
        sampled_spmm(g, x, 0)
    assert calls == []


def test_exact_view_is_never_stale(monkeypatch):
    """The MKL path reads the graph's arrays on every call: an in-place edit of the columns or the
    weights is seen by the next call (the only thing kept is the ones of an unweighted graph)."""
    monkeypatch.setattr(spmm_mod, "EXACT_BACKEND", "torch")
    for weighted in (False, True):
        g = make_graph(10, n=500, weighted=weighted, big_rows=False)
        x = torch.randn(g.num_nodes, 6)
        with torch.no_grad():
            first = sampled_spmm(g, x, 0)
            g.indices[:] = np.sort(np.random.default_rng(1).integers(0, 500, size=g.num_edges)).astype(np.int32)
            if weighted:
                g.weights *= 3.0
            second = sampled_spmm(g, x, 0)
        want = torch.from_numpy(g.to_scipy() @ x.numpy())
        torch.testing.assert_close(second, want, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(first, second)
        assert [k for k in g.cache() if isinstance(k, tuple) and k[0] == "spmm_ones"] == (
            [] if weighted else [("spmm_ones", g.num_edges, torch.float32)])


def test_exact_view_shares_the_graph_arrays():
    g = make_graph(11, n=400, weighted=True, big_rows=False)
    mat = spmm_mod.exact_csr_view(g, torch.float32)
    assert mat.col_indices().data_ptr() == g.indices.ctypes.data
    assert mat.values().data_ptr() == g.weights.ctypes.data
    torch.testing.assert_close(mat.to_dense(), torch.from_numpy(g.to_scipy().toarray()))
    empty = CSRGraph(np.zeros(5, dtype=np.int64), np.zeros(0, dtype=np.int32), None, 4)
    with torch.no_grad():
        torch.testing.assert_close(spmm_mod._exact_spmm_mkl(empty, torch.ones(4, 3), "sum", None), torch.zeros(4, 3))
