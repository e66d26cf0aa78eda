"""ES-SpMM against ``torch.sparse.mm`` on the same CSR and features, side by side in one run.

For each graph and feature width F, one process times, interleaved round by round in an order that
rotates each round (so machine noise and the place in the round hit every variant alike), and reports,
per variant, the median over rounds of the speedup ``t(torch.sparse.mm) / t(variant)`` within the round
(> 1 = faster than ``torch.sparse.mm``):

* ``torch.sparse.mm(A, x)``: the baseline, ``A`` the graph's CSR built once (int32 indices, float32
  ones); MKL on CPU, cuSPARSE on CUDA;
* CPU, ``public``: ``kernels.sampled_spmm(graph, x, S)`` without gradient, S = exact (0) and the
  ``--widths`` (``fastrand``, ``sum``), exactly as a caller runs it: nothing memoized between calls,
  the compiled kernel samples while it multiplies (an exact pass goes where
  ``kernels.spmm.EXACT_BACKEND = "auto"`` sends it);
* CPU, ``exact via MKL``: the same public call with ``EXACT_BACKEND = "torch"``:
  ``torch.sparse.mm`` over ``exact_csr_view``, the graph's own arrays (the alternative the
  ``auto`` rule weighs, exact only); ``exact via the kernel``: with ``EXACT_BACKEND = "kernel"``;
* CPU, ``kernel on 1 thread``: the public call with the compiled kernel serial at every size (on
  machines where it has more than one thread);
* CPU, ``memoized CSR``: ``torch.sparse.mm`` on the sampled matrix of ``sampled_csr``, built
  before the timing (what the torch path does on repeated passes, e.g. training);
* CPU, with ``--base REV``: ``kernel`` (``kernels.spmm_cpu.sampled_spmm_cpu``, the compiled kernel as the
  public call runs it, exact passes included) and ``kernel at base`` (the same function of
  ``kernels/spmm_cpu.py`` as it was at git revision ``REV``, ``at_revision.kernels_module_at``): the
  A/B of a change to the kernel in the same rounds;
* CUDA, ``kernel``: the ES-SpMM kernel samples inside the kernel on every call (no memo), and its
  effective memory bandwidth is given as modelled bytes / time against the card's peak. Beside it,
  the launch knobs of ``kernels.spmm_cuda``, each against the same baseline in the same rounds:
  ``scalar loads`` (no 128-bit loads: at S <= 128, which never splits, the kernel from before the
  split and the 128-bit loads), ``no split`` (exact only: long rows walked by one group, in index
  order, with 128-bit loads), ``old exact`` (exact only: neither, the exact path from before),
  ``index order`` (exact only: split, but the whole rows in index order instead of longest first),
  ``split=N`` for each ``--split-edges`` value (exact only), and ``cpt=N`` for each ``--cols-per-thread``
  value (every width: N columns per lane instead of the launch's choice; scalar loads below 4). With ``--half bfloat16,float16``:
  per 16-bit type and width, ``<type> native`` (x held in 16 bits, read by the kernel as it is,
  float32 arithmetic) and ``<type> via fp32`` (the path before native 16-bit: x cast to float32,
  the float32 kernel, the output cast back), both against the float32 ``torch.sparse.mm`` baseline
  (the same product in float32). Device time comes from CUDA events
  around ``inner`` back-to-back calls; host time per call (the Python call, launch included,
  without waiting for the GPU) is reported beside it.

Graphs: Amazon Computers and Coauthor Physics from ``--data-dir`` (edge lists only; features are
random, F is a hidden width), and synthetic degree-skewed SBM graphs shaped like ogbn-arxiv (169,343
nodes, mean degree ~7) and Reddit (232,965 nodes, mean degree ~490, ~114M directed edges; about
1.5 GB for the graph and two CSR copies). Synthetic graphs are cached as memory-mapped CSR under
``--cache-dir``.

    python benchmarks/kernels.py                       # Amazon Computers + arxiv-like, F = 64, 256
    python benchmarks/kernels.py --quick               # the same graphs, F = 64, 3 rounds
    python benchmarks/kernels.py --graphs reddit-like --features 64 --widths 16,32 --device cuda
    python benchmarks/kernels.py --device cuda --widths 8,32 --split-edges 128,256,1024

Prints Markdown (machine, tables); writes nothing else except the synthetic-graph cache.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "benchmarks"))  # at_revision (after REPO: serve.py)

import torch  # noqa: E402
from at_revision import kernels_module_at  # noqa: E402

from kernels import spmm as spmm_mod  # noqa: E402
from kernels import spmm_cpu, spmm_cuda  # noqa: E402
from kernels.datasets import synthetic_sbm  # noqa: E402
from kernels.graph import CSRGraph  # noqa: E402
from kernels.spmm import forget_samples, kept_edges, sampled_csr, sampled_spmm  # noqa: E402

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks are implicitly disabled.*")
# synthetic graphs are opened memory-mapped (read-only); the baseline's CSR only reads them
warnings.filterwarnings("ignore", message=".*NumPy array is not writable.*")

DEFAULT_DATA = Path(os.environ.get("GNNSERVE_DATA", REPO.parent / "shared" / "data"))
DEFAULT_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "gnnserve-bench"
ALL_GRAPHS = ("amazon_computers", "coauthor_physics", "arxiv-like", "reddit-like")
# synthetic shapes: (nodes, avg_degree argument of synthetic_sbm, seed); the argument is set a little
# above the target mean degree because duplicate draws are merged
SYNTHETIC = {
    "arxiv-like": (169_343, 7.0, 1),
    "reddit-like": (232_965, 540.0, 2),
}
# peak DRAM bandwidth (GB/s) by device name, used when the driver does not report clock and bus width
PEAK_GBS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
            "A100-SXM4-40GB": 1555, "A100": 1555, "V100": 900, "L40S": 864, "L4": 300, "A10": 600}


# --------------------------------------------------------------------------- graphs
def load_real(name: str, data_dir: Path) -> CSRGraph:
    path = data_dir / f"{name}.npz"
    if not path.exists():
        raise SystemExit(f"{path} not found (use --data-dir or set GNNSERVE_DATA)")
    with np.load(path) as z:  # the edge list only: features here are random hidden-width ones
        n = int(z["y"].shape[0])
        return CSRGraph.from_edge_index(z["edge_index"], num_nodes=n)


def load_synthetic(name: str, cache_dir: Path | None) -> CSRGraph:
    n, avg, seed = SYNTHETIC[name]
    d = cache_dir / f"{name}-{n}-{avg}-{seed}" if cache_dir else None
    if d is not None and (d / "graph.json").exists():
        return CSRGraph.load(d, mmap=True)
    t0 = time.perf_counter()
    g = synthetic_sbm(n, num_classes=40, avg_degree=avg, num_features=1, seed=seed, name=name).graph
    print(f"<!-- generated {name}: {g} in {time.perf_counter() - t0:.0f} s -->", flush=True)
    if d is not None:
        g.save(d)
    return g


def load_graph(name: str, args: argparse.Namespace) -> CSRGraph:
    if name in SYNTHETIC:
        return load_synthetic(name, None if args.no_cache else args.cache_dir)
    return load_real(name, args.data_dir)


def baseline_csr(g: CSRGraph, device: torch.device) -> torch.Tensor:
    """The graph as torch CSR with int32 indices and float32 values (ones when unweighted)."""
    crow = torch.from_numpy(g.indptr.astype(np.int32))
    col = torch.from_numpy(np.ascontiguousarray(g.indices, dtype=np.int32))
    val = torch.from_numpy(np.ascontiguousarray(g.edge_weights(), dtype=np.float32))
    return torch.sparse_csr_tensor(crow, col, val, size=(g.num_nodes,) * 2, check_invariants=False).to(device)


# --------------------------------------------------------------------------- timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, prep: Callable[[], object] | None = None,
              inner: int = 1) -> float:
    """Seconds per call of ``fn`` (``prep`` runs untimed before; on CUDA, ``inner`` back-to-back
    calls between two events, divided by ``inner``)."""
    return time_call2(fn, device, prep, inner)[0]


def time_call2(fn: Callable[[], object], device: torch.device, prep: Callable[[], object] | None = None,
               inner: int = 1) -> tuple[float, float]:
    """``(device seconds, host seconds)`` per call of ``fn``. On CUDA the device time is CUDA events
    around ``inner`` back-to-back calls, the host time the wall clock of issuing them (before the
    final synchronisation), both divided by ``inner``; on the CPU both are the wall clock.

    The calls queue behind a hold (:func:`kernels.spmm_cuda.hold_stream`) longer than their issue, so
    the events bracket the kernels alone: without it, a call whose host side outlasts its kernel (a
    small graph) would time the host. A hold found too short (the host took longer) is doubled and the
    measurement repeated."""
    if prep is not None:
        prep()
    if device.type == "cuda":
        hold = 200e-6 * inner
        for _ in range(4):
            _sync(device)
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            spmm_cuda.hold_stream(hold)
            start.record()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            host = time.perf_counter() - t0
            stop.record()
            stop.synchronize()
            if host < 0.8 * hold:
                break
            hold = 2 * host
        return start.elapsed_time(stop) / 1e3 / inner, host / inner
    t0 = time.perf_counter()
    fn()
    t = time.perf_counter() - t0
    return t, t


def request_graph() -> CSRGraph:
    """A request-sized graph: 64 rows of 1..39 edges (~1,200), one shaDow target's subgraph."""
    rng = np.random.default_rng(0)
    n = 64
    deg = rng.integers(1, 40, size=n)
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = np.concatenate([np.sort(rng.choice(n, size=int(d), replace=False)) for d in deg]).astype(np.int32)
    return CSRGraph(indptr=indptr, indices=indices, num_nodes=n)


def host_prep(calls: int = 20000, rounds: int = 5) -> dict[str, float]:
    """Host microseconds per call of the CUDA launcher's preparation, run on CPU tensors (it needs no
    GPU): the argument checks, :func:`kernels.spmm_cuda._plan` (device entry, schedule, output, launch
    shape, argument tuple) on a request-sized graph (64 rows, ~1,200 edges, F = 64, S = 8), filling the
    driver launch's parameter block with the arguments, and boxing them as the NumPy scalars CuPy's kernel
    call takes instead (which CuPy then packs again). Median over ``rounds`` of ``calls`` calls each."""
    from kernels.spmm import _check_args

    g = request_graph()
    n = g.num_nodes
    x = torch.randn(n, 64)
    cpu = torch.device("cpu")
    _, plan = spmm_cuda._plan(g, x, 8, "fastrand", "sum", None, cpu, None, "degree", None)
    values, _ = spmm_cuda.param_block()

    def fill() -> None:
        values[:] = plan.args

    variants: dict[str, Callable[[], object]] = {
        "argument checks": lambda: _check_args(g, x, 8, "fastrand", "sum"),
        "_plan": lambda: spmm_cuda._plan(g, x, 8, "fastrand", "sum", None, cpu, None, "degree", None),
        "fill the driver's parameter block": fill,
        "box as NumPy scalars for CuPy": lambda: spmm_cuda.cupy_args(plan.args),
    }
    out: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def _with(setting: str, value: object, fn: Callable[[], object], module: object = spmm_cuda) -> object:
    """``fn()`` with ``module.<setting>`` (by default ``kernels.spmm_cuda``'s) set to ``value``, restored after."""
    before = getattr(module, setting)
    setattr(module, setting, value)
    try:
        return fn()
    finally:
        setattr(module, setting, before)


def _one_thread(fn: Callable[[], object]) -> object:
    """``fn()`` with the compiled CPU kernel serial at every size (what every process whose numba cache held
    the serial kernel's code under the parallel one ran, before 2026-11-26: the two shared one cache file)."""
    return _with("PARALLEL_ROWS", 2**62, lambda: _with("PARALLEL_WORK", 2**62, fn, spmm_cpu), spmm_cpu)


def _python_launch(fn: Callable[[], object]) -> object:
    """``fn()`` with the kernel launched from Python (the driver launch) instead of the C++ launcher."""
    return _with("CPP_LAUNCH", False, fn)


def _cupy_launch(fn: Callable[[], object]) -> object:
    """``fn()`` with the kernel launched through CuPy's kernel call instead of the driver launch."""
    return _with("FAST_LAUNCH", False, fn)


def launch_overhead(device: torch.device, calls: int = 2000, rounds: int = 5) -> dict[str, float]:
    """Host microseconds per call on a request-sized graph (64 rows, ~1,200 edges, F = 64: one shaDow
    target's subgraph), where launching, not the GPU, sets the pace: ``calls`` back-to-back calls timed
    on the host clock (one synchronisation at the end), median over ``rounds``."""
    from kernels import cpp_launch
    from kernels.spmm import sampled_spmm

    g = request_graph()
    n = g.num_nodes
    x = torch.randn(n, 64, device=device)
    mat = baseline_csr(g, device)
    cpp_launch.wait(300)  # the C++ launcher, built (or found built) before the timing
    print(f"<!-- C++ launcher: {cpp_launch.status()[1]} -->", flush=True)
    xb = x.to(torch.bfloat16)
    # the direct call's stages, each alone: the output's allocation, the preparation (device entry and
    # memoized launch, output, arguments), and the driver launch of a prepared plan
    idx = x.device.index
    out0, plan = spmm_cuda._plan(g, x, 8, "fastrand", "sum", None, x.device, None, "degree", None)
    prep = plan.keep  # the prepared launch behind the plan
    kern = spmm_cuda._instance(prep, idx, torch.float32)
    cpp = spmm_cuda._cpp_launcher(prep, kern, idx)
    if cpp is not None and cpp(x, 0, spmm_cuda._current_stream(idx)) is None:
        cpp = None  # it declines in this thread: timing it would time the refusal
    print(f"<!-- C++ launcher checked on cuda:{idx}: {spmm_cuda._cpp_ok.get(idx)}; its stage timed: "
          f"{cpp is not None} -->", flush=True)
    variants: dict[str, Callable[[], object] | None] = {
        "torch.sparse.mm": lambda: torch.sparse.mm(mat, x),
        "stage: torch.empty of the output": lambda: torch.empty((n, 64), device=device),
        "stage: _plan (entry, output, arguments)": lambda: spmm_cuda._plan(g, x, 8, "fastrand", "sum", None, x.device,
                                                                          None, "degree", None),
        # out0 is captured: the prepared launch writes into it on every call
        "stage: driver launch of a prepared plan": lambda out0=out0: spmm_cuda._launch(
            kern, plan.cfg, plan.args, idx, spmm_cuda._current_stream(idx)),
        "stage: C++ Launch of a prepared plan (output and launch)": (
            (lambda: cpp(x, 0, spmm_cuda._current_stream(idx))) if cpp is not None else None),
        "ES-SpMM S=8 sum": lambda: sampled_spmm(g, x, 8),
        "ES-SpMM S=8 sum, Python launch": lambda: _python_launch(lambda: sampled_spmm(g, x, 8)),
        "ES-SpMM S=8 sum, CuPy launch": lambda: _python_launch(lambda: _cupy_launch(lambda: sampled_spmm(g, x, 8))),
        "ES-SpMM exact sum": lambda: sampled_spmm(g, x, 0),
        "ES-SpMM S=8 gcn": lambda: sampled_spmm(g, x, 8, "fastrand", "gcn"),
        "ES-SpMM S=8 gcn, CuPy launch": lambda: _python_launch(
            lambda: _cupy_launch(lambda: sampled_spmm(g, x, 8, "fastrand", "gcn"))),
        "ES-SpMM S=8 sum bfloat16": lambda: sampled_spmm(g, xb, 8),
        "ES-SpMM S=8 sum, direct call": lambda: spmm_cuda.sampled_spmm_cuda(g, x, 8, "fastrand", "sum"),
        "ES-SpMM S=8 sum, direct call, Python launch": lambda: _python_launch(
            lambda: spmm_cuda.sampled_spmm_cuda(g, x, 8, "fastrand", "sum")),
    }
    timed = {k: fn for k, fn in variants.items() if fn is not None}  # the C++ stage only where it is built
    out: dict[str, list[float]] = {k: [] for k in timed}
    for fn in timed.values():  # compile / memoize outside the timing
        fn()
    _sync(device)
    for _ in range(rounds):
        for name, fn in timed.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(device)
            out[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


@dataclass
class Case:
    graph: str
    n: int
    e: int
    f: int
    device: str
    baseline_s: float
    times: dict[tuple[str, int], float] = field(default_factory=dict)  # (mode, width) -> median seconds
    ratios: dict[tuple[str, int], float] = field(default_factory=dict)  # (mode, width) -> median speedup
    host_s: dict[tuple[str, int], float] = field(default_factory=dict)  # (mode, width) -> median host s/call
    bytes_: dict[int, float] = field(default_factory=dict)  # width -> modelled bytes (CUDA)
    baseline_bytes: float = 0.0


def modelled_bytes(g: CSRGraph, width: int, f: int, value_bytes: int = 4, baseline: bool = False) -> float:
    """Bytes an SpMM must move at least once: row pointers, the kept (column[, value]) pairs, one
    gathered x row per kept edge, the output. Gathered rows that hit in L2 make the effective
    figure exceed what DRAM delivered."""
    kept = g.num_edges if baseline else kept_edges(g, width)
    idx = g.indices.dtype.itemsize
    per_edge = idx + (4 if (baseline or g.is_weighted) else 0)
    return (g.num_nodes + 1) * 8 + kept * per_edge + kept * f * value_bytes + g.num_nodes * f * value_bytes


def _exact_via(backend: str, g: CSRGraph, x: torch.Tensor, strategy: str, aggregator: str) -> torch.Tensor:
    """An exact ``sampled_spmm`` with ``kernels.spmm.EXACT_BACKEND`` pinned to ``backend``."""
    return _with("EXACT_BACKEND", backend, lambda: sampled_spmm(g, x, 0, strategy, aggregator), spmm_mod)


def _exact_via_mkl(g: CSRGraph, x: torch.Tensor, strategy: str, aggregator: str) -> torch.Tensor:
    return _exact_via("torch", g, x, strategy, aggregator)


def _via_fp32(g: CSRGraph, x: torch.Tensor, width: int, strategy: str, aggregator: str) -> torch.Tensor:
    """A 16-bit pass the way it ran before the kernel read 16-bit types: cast, float32 kernel, cast back."""
    return spmm_cuda.sampled_spmm_cuda(g, x.float(), width, strategy, aggregator).to(x.dtype)


def _with_defines(defines: tuple[str, ...], fn: Callable[[], object]) -> object:
    """``fn()`` with the kernel built under the preprocessor definitions ``defines`` (its tuning macros)."""
    return _with("COMPILE_DEFINES", defines, fn)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_case(name: str, g: CSRGraph, f: int, device: torch.device, widths: list[int], rounds: int,
             strategy: str, aggregator: str, seed: int, split_edges: list[int] | None = None,
             half: list[torch.dtype] | None = None, cols_per_thread: list[int] | None = None,
             defines: list[tuple[str, ...]] | None = None, base_kernel: object = None) -> Case:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g.num_nodes, f, generator=gen).to(device)
    a = baseline_csr(g, device)
    base = lambda: torch.sparse.mm(a, x)  # noqa: E731
    # sanity: exact mode is the same product, on every exact path
    want = base()
    tol = {"rtol": 1e-3, "atol": 1e-4 * float(want.abs().max())}
    torch.testing.assert_close(sampled_spmm(g, x, 0, strategy, "sum"), want, **tol)
    if device.type == "cpu":
        torch.testing.assert_close(_exact_via_mkl(g, x, strategy, "sum"), want, **tol)
    del want

    variants: dict[tuple[str, int], Callable[[], object]] = {("base", 0): base}
    if device.type == "cuda":
        cuda_call = spmm_cuda.sampled_spmm_cuda
        for w in [0, *widths]:
            variants[("kernel", w)] = lambda w=w: sampled_spmm(g, x, w, strategy, aggregator)
        for w in [0, *widths]:
            variants[("scalar loads", w)] = lambda w=w: cuda_call(g, x, w, strategy, aggregator, vector=False)
        variants[("no split", 0)] = lambda: cuda_call(g, x, 0, strategy, aggregator, split_edges=0)
        variants[("index order", 0)] = lambda: cuda_call(g, x, 0, strategy, aggregator, row_order="index")
        variants[("old exact", 0)] = lambda: cuda_call(g, x, 0, strategy, aggregator, split_edges=0, vector=False)
        for se in split_edges or []:
            variants[(f"split={se}", 0)] = lambda se=se: cuda_call(g, x, 0, strategy, aggregator, split_edges=se)
        for cpt in cols_per_thread or []:
            vec = None if cpt >= spmm_cuda.vector_width(4) else False  # fewer than V columns: scalar loads
            for w in [0, *widths]:
                variants[(f"cpt={cpt}", w)] = lambda w=w, cpt=cpt, vec=vec: cuda_call(
                    g, x, w, strategy, aggregator, cols_per_thread=cpt, vector=vec)
        for defs in defines or []:
            for w in [0, *widths]:
                variants[("defines " + ",".join(defs), w)] = lambda w=w, defs=defs: _with_defines(
                    defs, lambda: cuda_call(g, x, w, strategy, aggregator))
        for dt in half or []:
            xs = x.to(dt)
            short = str(dt).removeprefix("torch.")
            for w in [0, *widths]:
                variants[(f"{short} native", w)] = lambda w=w, xs=xs: cuda_call(g, xs, w, strategy, aggregator)
                variants[(f"{short} via fp32", w)] = lambda w=w, xs=xs: _via_fp32(g, xs, w, strategy, aggregator)
        # the knobs compute the same product
        for k, fn in variants.items():
            if k[0] != "base" and k[1] == 0 and aggregator == "sum":
                got = fn()
                if got.dtype != torch.float32:  # 16-bit inputs: the product of rounded inputs, rounded
                    torch.testing.assert_close(got.float(), base(), rtol=3e-2, atol=3e-2 * float(base().abs().max()))
                else:
                    torch.testing.assert_close(got, base(), **tol)
    else:
        forget_samples(g)
        for w in [0, *widths]:  # the public function as callers run it: nothing memoized
            variants[("public", w)] = lambda w=w: sampled_spmm(g, x, w, strategy, aggregator)
        variants[("exact via MKL", 0)] = lambda: _exact_via_mkl(g, x, strategy, aggregator)
        variants[("exact via the kernel", 0)] = lambda: _exact_via("kernel", g, x, strategy, aggregator)
        if spmm_cpu.runs_parallel(g.num_nodes, g.num_edges, x.shape[1]) and spmm_cpu.kernel_threads() > 1:
            for w in widths:  # the public call with the compiled kernel on one thread
                variants[("kernel on 1 thread", w)] = lambda w=w: _one_thread(
                    lambda: sampled_spmm(g, x, w, strategy, aggregator))
        for w in widths:  # MKL on a sampled matrix built before the timing
            mat = sampled_csr(g, w, strategy, aggregator, dtype=x.dtype)
            variants[("memoized CSR", w)] = lambda mat=mat: torch.sparse.mm(mat, x)
        if base_kernel is not None:  # --base: the compiled kernel of this tree and of the revision
            dinv = spmm_mod._gcn_dinv(g, x.device, x.dtype, None) if aggregator == "gcn" else None
            for w in [0, *widths]:
                for label, mod in (("kernel", spmm_cpu), ("kernel at base", base_kernel)):
                    variants[(label, w)] = lambda w=w, mod=mod: mod.sampled_spmm_cpu(g, x, w, strategy, aggregator, dinv)
    # CUDA: enough back-to-back calls per measurement to amortise launch jitter
    inner = 1
    if device.type == "cuda":
        t = time_call(base, device)
        inner = max(1, min(50, int(0.02 / max(t, 1e-6))))
    for fn in variants.values():  # warm-up (caches, compiles the kernel)
        fn()
    _sync(device)
    samples: dict[tuple[str, int], list[float]] = {k: [] for k in variants}
    host: dict[tuple[str, int], list[float]] = {k: [] for k in variants}
    keys = list(variants)
    for r in range(rounds):
        # the order rotates round by round, and runs backwards every other cycle of rotations, so that a
        # variant's place in the round and the variant before it vary
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for k in (order[::-1] if (r // len(keys)) % 2 else order):
            dev_t, host_t = time_call2(variants[k], device, None, inner)
            samples[k].append(dev_t)
            host[k].append(host_t)
    med = {k: statistics.median(v) for k, v in samples.items()}
    base_s = samples.pop(("base", 0))
    ratios = {k: statistics.median(b / t for b, t in zip(base_s, v, strict=True)) for k, v in samples.items()}
    case = Case(name, g.num_nodes, g.num_edges, f, device.type, med.pop(("base", 0)), med, ratios,
                {k: statistics.median(v) for k, v in host.items()})
    if device.type == "cuda":
        case.baseline_bytes = modelled_bytes(g, 0, f, baseline=True)
        case.bytes_ = {w: modelled_bytes(g, w, f) for w in [0, *widths]}
    forget_samples(g)
    return case


# --------------------------------------------------------------------------- reporting
def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown CPU"


def gpu_peak_gbs(device: torch.device) -> tuple[str, float | None]:
    name = torch.cuda.get_device_name(device)
    try:
        import cupy  # optional: only for the driver's memory clock and bus width

        idx = device.index or 0
        clock_khz = cupy.cuda.runtime.deviceGetAttribute(36, idx)  # cudaDevAttrMemoryClockRate
        bus_bits = cupy.cuda.runtime.deviceGetAttribute(37, idx)  # cudaDevAttrGlobalMemoryBusWidth
        if clock_khz > 0 and bus_bits > 0:
            return name, 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9
    except Exception:
        pass
    for key, gbs in PEAK_GBS.items():
        if key in name:
            return name, float(gbs)
    return name, None


def markdown(cases: list[Case], graphs: dict[str, CSRGraph], widths: list[int], args: argparse.Namespace,
             peak: tuple[str, float | None] | None) -> str:
    lines = []
    cols = ["exact", *[f"S={w}" for w in widths]]
    lines.append("Edges kept (fraction of E aggregated at each width):\n")
    lines.append("| graph | N | E | mean deg | max deg | " + " | ".join(cols[1:]) + " |")
    lines.append("|---" * (5 + len(widths)) + "|")
    for name, g in graphs.items():
        frac = [f"{kept_edges(g, w) / max(g.num_edges, 1):.1%}" for w in widths]
        lines.append(f"| {name} | {g.num_nodes:,} | {g.num_edges:,} | {g.num_edges / g.num_nodes:.1f} | "
                     f"{int(g.degrees.max())} | " + " | ".join(frac) + " |")
    lines.append("")
    lines.append("Speedup over `torch.sparse.mm` on the same CSR: median over rounds of t(sparse.mm) / "
                 "t(variant) within the round (> 1 = faster); the baseline's median time in ms:\n")
    lines.append("| graph | F | device | variant | sparse.mm ms | " + " | ".join(cols) + " |")
    lines.append("|---" * (5 + len(cols)) + "|")
    for c in cases:
        modes = list(dict.fromkeys(k[0] for k in c.ratios))
        for mode in modes:
            cells = []
            for w in [0, *widths]:
                r = c.ratios.get((mode, w))
                cells.append(f"{r:.2f}x" if r else "-")
            lines.append(f"| {c.graph} | {c.f} | {c.device} | {mode} | {c.baseline_s * 1e3:.2f} | "
                         + " | ".join(cells) + " |")
    gpu_cases = [c for c in cases if c.device == "cuda"]
    if gpu_cases and peak is not None:
        name, gbs = peak
        lines.append("")
        peak_txt = f"{gbs:.0f} GB/s" if gbs else "unknown"
        lines.append(f"Effective bandwidth on {name} (modelled bytes / median time; peak {peak_txt}):\n")
        lines.append("| graph | F | cuSPARSE GB/s | " + " | ".join(f"{c} GB/s" for c in cols) + " |")
        lines.append("|---" * (3 + len(cols)) + "|")
        for c in gpu_cases:
            def bw(b: float, t: float) -> str:
                v = b / t / 1e9
                return f"{v:.0f} ({v / gbs:.0%})" if gbs else f"{v:.0f}"
            cells = [bw(c.bytes_[w], c.times[("kernel", w)]) for w in [0, *widths]]
            lines.append(f"| {c.graph} | {c.f} | {bw(c.baseline_bytes, c.baseline_s)} | " + " | ".join(cells) + " |")
    if gpu_cases:
        lines.append("")
        lines.append("Device time per call (CUDA events, median, us) and host time per call (issuing the call, "
                     "launch included, not waiting for the GPU; median, us), `device / host`:\n")
        lines.append("| graph | F | variant | " + " | ".join(cols) + " |")
        lines.append("|---" * (3 + len(cols)) + "|")
        for c in gpu_cases:
            base_cell = f"{c.baseline_s * 1e6:.0f} / {c.host_s[('base', 0)] * 1e6:.0f}"
            lines.append(f"| {c.graph} | {c.f} | torch.sparse.mm | {base_cell} | " + " | ".join("-" for _ in widths)
                         + " |")
            for mode in dict.fromkeys(k[0] for k in c.ratios):
                cells = []
                for w in [0, *widths]:
                    t, h = c.times.get((mode, w)), c.host_s.get((mode, w))
                    cells.append(f"{t * 1e6:.0f} / {h * 1e6:.0f}" if t else "-")
                lines.append(f"| {c.graph} | {c.f} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()  # keep freed memory for reuse (see kernels/malloc.py)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where synthetic graphs are kept")
    p.add_argument("--no-cache", action="store_true", help="regenerate synthetic graphs, keep nothing")
    p.add_argument("--graphs", help=f"comma list of {ALL_GRAPHS} or other datasets of --data-dir (cora, ...; default: all)")
    p.add_argument("--features", help="comma list of feature widths F (default: 64,256)")
    p.add_argument("--widths", default="8,16,32,64", help="comma list of sampling widths S")
    p.add_argument("--split-edges", default="",
                   help="CUDA: comma list of extra split thresholds to time in exact mode, beside the default "
                        f"({spmm_cuda.SPLIT_EDGES}) and no split")
    p.add_argument("--cols-per-thread", default="",
                   help="CUDA: comma list of columns per lane (1, 2, 4, 8) to time beside the launch's own "
                        "choice, at every width (fewer columns per lane: more passes over a row)")
    p.add_argument("--defines", action="append", default=[],
                   help="CUDA: a comma list of NAME=VALUE for the kernel's tuning macros (es_spmm.cu: "
                        "ES_SPMM_VEC_UNROLL, ES_SPMM_SPLIT_MIN_BLOCKS), timed at every width as one more "
                        "variant; repeat the option for several")
    p.add_argument("--rounds", type=int, help="timed rounds per variant, median reported (default: 9)")
    p.add_argument("--big-rounds", type=int, help="rounds on graphs above 20M edges (default: 3)")
    p.add_argument("--device", choices=("cpu", "cuda", "both"), default="both",
                   help="cuda/both: also time on the GPU when CUDA and the kernel work")
    p.add_argument("--strategy", choices=("fastrand", "bucket"), default="fastrand")
    p.add_argument("--aggregator", choices=("sum", "mean", "gcn"), default="sum")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads, which the compiled kernel follows too (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base", default=None,
                   help="git revision: also time its kernels/spmm_cpu.py beside this tree's (CPU; docstring)")
    p.add_argument("--half", default="",
                   help="CUDA: comma list of 16-bit types (bfloat16, float16) to time natively and via float32")
    p.add_argument("--host-prep", action="store_true",
                   help="also time the CUDA launcher's host-side preparation on CPU tensors (no GPU needed)")
    p.add_argument("--quick", action="store_true",
                   help="defaults become: F = 64, 3 rounds")
    args = p.parse_args(argv)
    quick = {"graphs": "amazon_computers,arxiv-like", "features": "64", "rounds": 3, "big_rounds": 1}
    full = {"graphs": "amazon_computers,arxiv-like", "features": "64,256", "rounds": 9, "big_rounds": 3}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [s.strip() for s in args.graphs.split(",") if s.strip()]
    # a default dataset missing from --data-dir is load_real's "not found"; any other name must be a file there
    bad = [s for s in names if s not in ALL_GRAPHS and not (args.data_dir / f"{s}.npz").exists()]
    if bad:
        raise SystemExit(f"unknown graphs {bad}; choose from {ALL_GRAPHS} or another dataset in {args.data_dir}")
    feats = [int(s) for s in args.features.split(",")]
    widths = [int(s) for s in args.widths.split(",")]
    split_edges = [int(s) for s in args.split_edges.split(",") if s.strip()]
    defines = [tuple(d.strip() for d in spec.split(",") if d.strip()) for spec in args.defines]
    bad_defs = [d for spec in defines for d in spec if not re.fullmatch(spmm_cuda.DEFINE_PATTERN, d)]
    if bad_defs or any(not spec for spec in defines):
        raise SystemExit(f"--defines: each must be a comma list of ES_SPMM_NAME=<integer>, got {args.defines}")
    cpts = [int(s) for s in args.cols_per_thread.split(",") if s.strip()]
    if any(c not in (1, 2, 4, 8) for c in cpts):
        raise SystemExit(f"--cols-per-thread: each must be 1, 2, 4 or 8, got {cpts}")
    # every exact-mode variant's work schedule stays memoized across the interleaved rounds (default,
    # index order, each --split-edges): past spmm_cuda's 4, each round would rebuild them inside the timing
    spmm_cuda.SCHEDULES_KEPT = max(spmm_cuda.SCHEDULES_KEPT, 4 + len(split_edges))
    half_names = {"bfloat16": torch.bfloat16, "float16": torch.float16}
    bad_half = [s for s in args.half.split(",") if s.strip() and s.strip() not in half_names]
    if bad_half:
        raise SystemExit(f"--half: unknown types {bad_half}; choose from {sorted(half_names)}")
    half = [half_names[s.strip()] for s in args.half.split(",") if s.strip()]
    devices = [torch.device("cpu")] if args.device in ("cpu", "both") else []
    # --base: the revision's kernels/spmm_cpu.py, compiled afresh in a directory of its own (removed at exit)
    base_dir = tempfile.TemporaryDirectory() if args.base else None
    base_kernel = kernels_module_at(args.base, "spmm_cpu", Path(base_dir.name)) if base_dir else None
    if args.device in ("cuda", "both"):
        if torch.cuda.is_available() and spmm_cuda.available():
            devices.append(torch.device("cuda"))
        elif args.device == "cuda":
            raise SystemExit("--device cuda: no CUDA device, or CuPy / the ES-SpMM kernel does not work here")

    t_start = time.perf_counter()
    print(f"Command: `python benchmarks/{Path(__file__).name} {' '.join(argv if argv is not None else sys.argv[1:])}`  ")
    print(f"Date: {datetime.date.today().isoformat()}; CPU: {cpu_model()}, {os.cpu_count()} logical CPUs, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads, compiled kernel on "
          f"{spmm_cpu.kernel_threads()} (numba {numba.__version__}); load average at start "
          f"{os.getloadavg()[0]:.1f}  ")
    peak = gpu_peak_gbs(devices[-1]) if devices and devices[-1].type == "cuda" else None
    if peak:
        print(f"GPU: {peak[0]}  ")
    print(f"Aggregator `{args.aggregator}`, strategy `{args.strategy}`, median of {args.rounds} rounds "
          f"({args.big_rounds} above 20M edges), variants interleaved within each round.\n", flush=True)

    graphs: dict[str, CSRGraph] = {}
    cases: list[Case] = []
    # a time limit (timeout's SIGTERM) or Ctrl-C still prints the table of the cases finished so far:
    # a lent GPU's minutes are too few to lose a whole run to one slow graph
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for name in names:
            g = load_graph(name, args)
            graphs[name] = g
            rounds = args.big_rounds if g.num_edges > 20_000_000 else args.rounds
            for f in feats:
                for dev in devices:
                    c = run_case(name, g, f, dev, widths, rounds, args.strategy, args.aggregator, args.seed,
                                 split_edges if dev.type == "cuda" else None, half if dev.type == "cuda" else None,
                                 cpts if dev.type == "cuda" else None, defines if dev.type == "cuda" else None,
                                 base_kernel=base_kernel)
                    cases.append(c)
                    print(f"<!-- {name} F={f} {dev.type}: sparse.mm {c.baseline_s * 1e3:.2f} ms, "
                          f"{time.perf_counter() - t_start:.0f} s so far -->", flush=True)
            g.cache().clear()
    except KeyboardInterrupt:
        print(f"<!-- interrupted after {time.perf_counter() - t_start:.0f} s: the table holds the "
              f"{len(cases)} finished cases -->", flush=True)
        if not cases:
            return 1
    print(markdown(cases, graphs, widths, args, peak), flush=True)
    if args.host_prep:
        print("\nHost time of the CUDA launcher's preparation, on CPU tensors (64 rows, ~1,200 edges, F = 64, "
              "S = 8; median of 5 rounds of 20,000 calls):\n")
        print("| step | us per call |\n|---|---|")
        for k, v in host_prep().items():
            print(f"| {k} | {v:.2f} |")
    for dev in devices:
        if dev.type == "cuda":
            lo = launch_overhead(dev)
            print("\nHost time per call on a request-sized graph (64 rows, ~1,200 edges, F = 64; 2,000 "
                  "back-to-back calls, one synchronisation, median of 5 rounds):\n")
            print("| call | us per call |\n|---|---|")
            for k, v in lo.items():
                print(f"| {k} | {v:.1f} |")
    print(f"\nTotal {time.perf_counter() - t_start:.0f} s; load average at end {os.getloadavg()[0]:.1f}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
