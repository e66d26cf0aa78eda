"""CUDA path of ES-SpMM (kernels/es_spmm.cu + kernels/spmm_cuda.py) held to the torch specification.

Three layers, so that a machine without a GPU still checks most of the kernel:

* the ``.cu`` file compiles with ``nvcc`` for sm_90 with every template instance the wrapper asks
  NVRTC for (skipped without nvcc);
* the kernel's own thread code runs on the CPU (``tests/es_spmm_host_harness.cpp``: every GPU
  thread a coroutine, row groups interleaved, ``__syncwarp`` as a group rendezvous, ``atomicAdd`` a
  plain add, 128-bit loads checked for alignment) against ``sampled_spmm_torch`` (skipped without a
  C++ compiler), including graphs with hub rows far above the split threshold, whose chunks add
  into the output from different groups and blocks;
* on a GPU with CuPy (marked ``gpu``): the real launches against ``sampled_spmm_torch``, the
  dispatch, streams, dtypes.
"""

from __future__ import annotations

import ast
import functools
import gc
import itertools
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import spmm as spmm_mod
from kernels import spmm_cuda
from kernels.graph import CSRGraph
from kernels.spmm import sampled_spmm, sampled_spmm_torch
from kernels.spmm_cuda import (
    ACC_CTYPES,
    AGGREGATOR_CODES,
    COLS_PER_THREAD,
    SHARED_BUDGET,
    SPLIT_EDGES,
    STRATEGY_CODES,
    VALUE_CTYPES,
    kernel_instances,
    kernel_name,
    launch_config,
    shared_bytes,
    split_threshold,
    use_vector,
    vector_width,
    work_schedule,
)

from .harness_support import build_host_harness

REPO = Path(__file__).resolve().parent.parent
KERNEL = REPO / "kernels" / "es_spmm.cu"
HARNESS = Path(__file__).resolve().parent / "es_spmm_host_harness.cpp"

WIDTHS = (0, 1, 8, 32, 128)
FEATURES = (1, 31, 64, 257)
DEGREES = (0, 1, 3, 7, 8, 9, 31, 32, 33, 127, 128, 129, 300)


# ----------------------------------------------------------------------------- graphs
@functools.cache
def random_graph(seed: int, *, weighted: bool, index_dtype: str = "int32", n: int = 1400) -> CSRGraph:
    """Rows of every kind for widths 1/8/32/128: zero degree, just below / at / just above the width,
    far above it, and nnz = 577, 1154 (multiples of the fastrand prime) and 1200."""
    rng = np.random.default_rng(seed)
    degs = rng.choice(DEGREES, size=n)
    degs[:4] = (577, 1154, 1200, 0)
    cols = [np.sort(rng.choice(n, size=int(d), replace=False)) for d in degs]
    indptr = np.concatenate([[0], np.cumsum(degs)]).astype(np.int64)
    indices = np.concatenate(cols).astype(np.int32)
    weights = rng.uniform(0.1, 2.0, size=len(indices)).astype(np.float32) if weighted else None
    g = CSRGraph(indptr=indptr, indices=indices, weights=weights, num_nodes=n)
    if index_dtype == "int64":
        # CSRGraph stores int32 whenever the ids fit; large graphs get int64, which the kernel must
        # handle too: force it on a small graph
        g.indices = g.indices.astype(np.int64)
    g.validate()
    assert g.degrees[0] == 577 and g.degrees[1] == 1154 and (g.degrees == 0).any()
    return g


@functools.cache
def hub_graph(seed: int, *, weighted: bool, index_dtype: str = "int32", n: int = 6000) -> CSRGraph:
    """Mostly short rows (0..40 edges) plus rows far above the split threshold: a hub of 5,200 edges
    (10 chunks of 512 and a short one), one of 1,731 (a multiple of 577), rows of 513 and 1,024
    (just above / a multiple of the threshold) and one of 3,000 placed last (a late hub)."""
    rng = np.random.default_rng(seed)
    degs = rng.integers(0, 41, size=n)
    degs[rng.choice(n, size=50, replace=False)] = 0
    degs[[3, 11, 12, 500, n - 1]] = (5200, 1731, 513, 1024, 3000)
    cols = [np.sort(rng.choice(n, size=int(d), replace=False)) for d in degs]
    indptr = np.concatenate([[0], np.cumsum(degs)]).astype(np.int64)
    indices = np.concatenate(cols).astype(np.int32)
    weights = rng.uniform(0.1, 2.0, size=len(indices)).astype(np.float32) if weighted else None
    g = CSRGraph(indptr=indptr, indices=indices, weights=weights, num_nodes=n)
    if index_dtype == "int64":
        g.indices = g.indices.astype(np.int64)
    g.validate()
    assert int(g.degrees.max()) == 5200 > 10 * SPLIT_EDGES
    return g


def features(n: int, f: int, seed: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(1000 + seed).standard_normal((n, f)).astype(dtype)


def reference(g: CSRGraph, x: np.ndarray, width: int, strategy: str, aggregator: str) -> np.ndarray:
    """The specification, evaluated in float64 on the CPU."""
    return sampled_spmm_torch(g, torch.from_numpy(x.astype(np.float64)), width, strategy, aggregator).numpy()


# ----------------------------------------------------------------------------- launch shape (pure Python)
@pytest.mark.parametrize("f", [1, 2, 4, 5, 8, 16, 20, 30, 31, 32, 33, 64, 100, 128, 256, 257, 260, 1000])
@pytest.mark.parametrize("width, max_degree", [(0, 5000), (0, 3), (8, 5000), (128, 5000), (1000, 5000), (16, 4)])
@pytest.mark.parametrize("sizes", [(4, 4), (4, 8), (8, 4), (8, 8)])
@pytest.mark.parametrize("vector", [False, True])
def test_launch_config_shape(f, width, max_degree, sizes, vector):
    vb, ib = sizes
    v = vector_width(vb)
    if vector and f % v:
        with pytest.raises(ValueError, match="multiple"):
            launch_config(10_000, f, width, max_degree, vb, ib, vector=True)
        return
    c = launch_config(10_000, f, width, max_degree, vb, ib, vector=vector)
    assert c.vector == vector
    if vector:
        assert c.cols_per_thread % v == 0  # whole 128-bit loads per lane
        assert ("long long" if ib == 8 else "int", c.cols_per_thread, True) in kernel_instances(
            "double" if vb == 8 else "float")
    else:  # the launch shape from before 128-bit loads existed
        assert c.cols_per_thread == min(8, 1 << max(0, (-(-f // 32) - 1).bit_length()))
    assert c.cols_per_thread in COLS_PER_THREAD
    assert c.group_size in (4, 8, 16, 32)
    # one pass for F <= 256, and no lane idles because of a too-wide group
    assert c.group_size * c.cols_per_thread >= min(f, 256)
    assert c.group_size == 4 or c.group_size * c.cols_per_thread < 2 * f
    assert launch_config(10_000, f, width, max_degree, vb, ib, vector=vector, num_items=12_345).blocks == \
        -(-12_345 // c.groups_per_block)  # the grid covers the work items of a schedule
    assert c.block_threads % 32 == 0 and 32 <= c.block_threads <= 256
    assert c.groups_per_block == c.block_threads // 32 * (32 // c.group_size)
    assert c.blocks * c.groups_per_block >= 10_000 > (c.blocks - 1) * c.groups_per_block
    if width > 0:
        assert c.tile == max(1, min(width, 256, max_degree))  # the whole sample of a row is staged
    else:
        assert c.tile == max(1, min(128, max_degree))
    assert c.shared_bytes == shared_bytes(c.groups_per_block, c.tile, vb, ib)
    assert c.shared_bytes <= SHARED_BUDGET or c.block_threads == 32


def test_launch_config_takes_a_columns_per_lane_override():
    # F = 256 float32 with 128-bit loads: 8 columns per lane, one pass by default; 4 columns: two passes
    assert launch_config(1000, 256, 0, 50, 4, 4, vector=True).cols_per_thread == 8
    c = launch_config(1000, 256, 0, 50, 4, 4, vector=True, cols_per_thread=4)
    assert (c.cols_per_thread, c.group_size) == (4, 32) and c.group_size * c.cols_per_thread * 2 == 256
    assert launch_config(1000, 40, 8, 50, 4, 4, cols_per_thread=1).group_size == 32
    for bad, vec in ((3, False), (16, False), (2, True)):  # 2 columns cannot hold a float4
        with pytest.raises(ValueError, match="cols_per_thread"):
            launch_config(1000, 256, 0, 50, 4, 4, vector=vec, cols_per_thread=bad)


@pytest.mark.parametrize(("width", "cpt"), [(0, 4), (16, 4), (0, 1)])
def test_host_emulation_with_fewer_columns_per_lane(harness, tmp_path, width, cpt):
    # the benchmark's --cols-per-thread: a row takes several column passes (F = 256 at 4 columns per lane: 2,
    # at 1: 8), every pass restaging the row's edges; exact mode with a hub splits rows too
    g = hub_graph(14, weighted=True)
    x = features(g.num_nodes, 256, 14)
    got = emulate(harness, tmp_path, g, x, width, "fastrand", "gcn", cols_per_thread=cpt, vector=cpt >= 4)
    np.testing.assert_allclose(got, reference(g, x, width, "fastrand", "gcn"), rtol=1e-4, atol=1e-4)


def test_launch_config_caps_blocks_and_counts_bytes():
    c = launch_config(10**9, 64, 32, 10**6, 4, 4, max_blocks=1000)
    assert c.blocks == 1000  # rows beyond the grid are reached grid-stride
    # 8 groups * 33 floats = 1056 bytes (already a multiple of 16), then 8 * 33 ints
    assert shared_bytes(8, 32, 4, 4) == 1056 + 1056
    assert shared_bytes(1, 2, 4, 8) == 16 + 24  # 12 value bytes padded to 16


@pytest.mark.parametrize("width", [0, 100, 600, 2000, 10_000])
@pytest.mark.parametrize("split", [0, 1, 7, 512])
@pytest.mark.parametrize("order", ["degree", "index"])
def test_work_schedule_covers_every_kept_edge_once(width, split, order):
    g = hub_graph(1, weighted=False)
    sched = work_schedule(g.indptr, width, split, order)
    kept = np.minimum(g.degrees, width) if width else g.degrees
    if split <= 0 or (width and width <= split) or kept.max() <= split:
        assert sched is None  # nothing to split: item r = row r
        return
    rows, chunks = sched
    assert rows.dtype == np.int64 and chunks.dtype == np.int32 and len(rows) == len(chunks)
    is_split = kept[rows] > split
    # chunks come first, chunk-major; then every other row once, longest first or in index order
    first_whole = int(np.argmin(is_split)) if not is_split.all() else len(rows)
    assert is_split[:first_whole].all() and not is_split[first_whole:].any()
    assert np.all(np.diff(chunks[:first_whole]) >= 0)
    whole = rows[first_whole:]
    assert sorted(whole.tolist()) == np.flatnonzero(kept <= split).tolist()
    assert np.all(chunks[first_whole:] == 0)
    if order == "degree":
        assert np.all(np.diff(kept[whole]) <= 0)
    else:
        assert np.all(np.diff(whole) > 0)
    # the chunks of each split row tile its kept positions [0, k) exactly (the kernel's rule)
    covered = np.zeros(len(kept), dtype=np.int64)
    for r, c in zip(rows[:first_whole].tolist(), chunks[:first_whole].tolist(), strict=True):
        lo, hi = c * split, min(int(kept[r]), (c + 1) * split)
        assert lo < hi
        covered[r] += hi - lo
    assert np.array_equal(covered[kept > split], kept[kept > split])
    assert len({(r, c) for r, c in zip(rows.tolist(), chunks.tolist(), strict=True)}) == len(rows)


def test_split_threshold_follows_the_mean_kept_count_within_bounds():
    def ptr(degs):
        return np.concatenate([[0], np.cumsum(degs)]).astype(np.int64)

    assert split_threshold(ptr([1] * 1000 + [5000]), 0) == spmm_cuda.SPLIT_MIN_EDGES  # mean ~6: the floor
    assert split_threshold(ptr([60] * 100), 0) == 240  # 4 x the mean
    assert split_threshold(ptr([60] * 100), 8) == spmm_cuda.SPLIT_MIN_EDGES  # sampled: the mean of min(d, S)
    assert split_threshold(ptr([400] * 100), 0) == SPLIT_EDGES  # Reddit-like: the cap
    assert split_threshold(np.zeros(1, dtype=np.int64), 0) == spmm_cuda.SPLIT_MIN_EDGES


def test_use_vector_needs_a_multiple_of_the_width_and_alignment():
    assert use_vector(64, 4, 0, 256) and use_vector(30, 8, 16)
    assert not use_vector(30, 4, 0) and not use_vector(31, 8, 0)
    assert not use_vector(64, 4, 4) and not use_vector(64, 4, 0, 8)


def test_device_entry_and_schedules_follow_the_graph_arrays():
    # the memo of spmm_cuda lives in graph.cache() and is keyed on the arrays themselves: the CPU
    # device stands in for a GPU here (the entry holds torch tensors and their data pointers)
    g = CSRGraph(indptr=hub_graph(2, weighted=True).indptr.copy(), indices=hub_graph(2, weighted=True).indices.copy(),
                 weights=hub_graph(2, weighted=True).weights.copy())
    cpu = torch.device("cpu")
    e1 = spmm_cuda._device_graph(g, cpu)
    assert spmm_cuda._device_graph(g, cpu) is e1
    s1 = spmm_cuda._device_schedule(g, e1, 0, 512, "degree")
    assert s1 is not None and s1["num_items"] == len(work_schedule(g.indptr, 0, 512)[0])
    assert spmm_cuda._device_schedule(g, e1, 0, 512, "degree") is s1  # memoized
    assert spmm_cuda._device_schedule(g, e1, 32, 512, "degree") is None  # S <= split: nothing to split
    assert spmm_cuda._device_schedule(g, e1, 0, 0, "degree") is None
    # replacing an array (what CSRGraph users and graph_edit do) rebuilds the entry and its schedules
    g.indices = g.indices.astype(np.int64)
    e2 = spmm_cuda._device_graph(g, cpu)
    assert e2 is not e1 and e2["index_ctype"] == "long long" and e2["schedules"] == {} and e2["prepared"] == {}
    g.weights = g.weights.copy()
    assert spmm_cuda._device_graph(g, cpu) is not e2
    # a graph with every row short gets no schedule at all (request-sized subgraphs)
    small = random_graph(3, weighted=False)
    assert spmm_cuda._device_schedule(small, spmm_cuda._device_graph(small, cpu), 0, 2000, "degree") is None
    for w in (0, 600, 700, 800, 900, 1000):
        spmm_cuda._device_schedule(g, spmm_cuda._device_graph(g, cpu), w, 512, "degree")
    assert len(spmm_cuda._device_graph(g, cpu)["schedules"]) == spmm_cuda.SCHEDULES_KEPT


def short_rows_graph(seed: int, *, low: int = 0, high: int = 10, n: int = 40_000) -> CSRGraph:
    """Rows of ``low..high`` edges and two hubs (2,000 and 700 edges), which split launches cut into chunks;
    at F = 64 a launch over its rows is 2,500 blocks (16 rows a block), more than 4 waves of 4 blocks on 132
    SMs."""
    rng = np.random.default_rng(seed)
    degs = rng.integers(low, high + 1, size=n)
    degs[[7, n - 2]] = (2000, 700)
    src = np.repeat(np.arange(n), degs)
    pos = np.arange(len(src)) - np.repeat(np.cumsum(degs) - degs, degs)  # position inside the row
    dst = (src * 7919 + pos * 13 + int(rng.integers(n))) % n  # distinct inside a row (13 * 2000 < n)
    dst = dst[np.lexsort((dst, src))]
    return CSRGraph(indptr=np.concatenate([[0], np.cumsum(degs)]).astype(np.int64), indices=dst.astype(np.int32),
                    num_nodes=n)


def test_split_launches_over_short_rows_take_the_four_block_instance():
    # the launcher's occupancy rule: a split launch whose work items keep at most SHORT_ROWS_MEAN edges on
    # average, over a grid of at least SHORT_ROWS_WAVES waves, asks for the split instance held to 4 blocks
    # per SM; longer rows, small grids, sampled passes that split nothing, float64 and 16-bit inputs keep
    # the default instance
    cpu = torch.device("cpu")

    def plan(g, dtype, width=0, f=64):
        x = torch.from_numpy(features(g.num_nodes, f, 1)).to(dtype)
        return spmm_cuda._plan(g, x, width, "fastrand", "sum", None, cpu, None, "degree", None)[1]

    short, long_ = short_rows_graph(1), short_rows_graph(2, low=25, high=60)
    p = plan(short, torch.float32)
    assert p.split and p.defines == spmm_cuda.SHORT_ROWS_DEFINES
    assert p.cfg.blocks >= spmm_cuda.SHORT_ROWS_WAVES * 4 * spmm_cuda.HOST_SM_COUNT
    assert spmm_cuda._device_graph(short, cpu)["schedules"][(0, None, "degree")]["mean_kept"] <= spmm_cuda.SHORT_ROWS_MEAN
    assert plan(long_, torch.float32).split and plan(long_, torch.float32).defines == ()
    small = short_rows_graph(4, n=4000)  # 250 blocks: under four waves
    assert plan(small, torch.float32).split and plan(small, torch.float32).defines == ()
    assert plan(short, torch.float64).defines == () and plan(short, torch.bfloat16).defines == ()
    assert not plan(short, torch.float32, 16).split and plan(short, torch.float32, 16).defines == ()


def test_memoized_launches_hold_no_more_schedules_than_the_schedule_memo():
    # every memoized launch holds its schedule's device arrays; when a schedule leaves the entry's memo the
    # launches holding it leave too, so widths chosen per request cannot pile up schedules on the device
    g = short_rows_graph(5, n=4000)
    cpu = torch.device("cpu")
    entry = spmm_cuda._device_graph(g, cpu)
    for f in (32, 64):
        x = torch.from_numpy(features(g.num_nodes, f, 5))
        for width in range(129, 149):  # each above the split threshold (128): a schedule per width
            assert spmm_cuda._plan(g, x, width, "fastrand", "sum", None, cpu, None, "degree", None)[1].split
    held = {id(p.sched) for p in entry["prepared"].values() if p.sched is not None}
    assert len(entry["schedules"]) == spmm_cuda.SCHEDULES_KEPT and len(held) <= spmm_cuda.SCHEDULES_KEPT
    assert all(p.sched is entry["schedules"].get((p.tail[6], None, "degree")) for p in entry["prepared"].values())


def test_a_malformed_defines_variable_turns_the_kernel_off_with_its_reason(monkeypatch):
    monkeypatch.setattr(spmm_cuda, "_available", None)
    monkeypatch.setattr(spmm_cuda, "_bad_defines", ["ES_SPMM_SPLIT_MIN_BLOCKS=four"])
    ok, why = spmm_cuda.status()
    assert not ok and spmm_cuda.DEFINES_ENV in why and "ES_SPMM_SPLIT_MIN_BLOCKS=four" in why


def test_lazy_import_waits_for_a_module_another_thread_is_importing(tmp_path, monkeypatch):
    # kernels._lazy.imported is on every GPU call's path; a module another thread is still importing sits in
    # sys.modules half built, and must not be handed out before its body has run
    from kernels._lazy import imported

    (tmp_path / "gnnserve_slow_module.py").write_text("import time\ntime.sleep(0.5)\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gnnserve_slow_module", raising=False)
    t = threading.Thread(target=lambda: imported("gnnserve_slow_module"))
    t.start()
    while "gnnserve_slow_module" not in sys.modules:
        time.sleep(0.001)
    assert imported("gnnserve_slow_module").VALUE == 42
    t.join()
    assert imported("gnnserve_slow_module") is sys.modules["gnnserve_slow_module"]
    monkeypatch.delitem(sys.modules, "gnnserve_slow_module")


# ----------------------------------------------------------------------------- the C++ launcher
@pytest.fixture(scope="module")
def launcher_module():
    """kernels/launcher.cpp, compiled (once per machine: torch's extension cache) and imported."""
    from kernels import cpp_launch

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    return cpp_launch.build_in_child(timeout=600)  # how a process builds it: in a child of its own session


@pytest.mark.parametrize("case", ["sampled-f32", "exact-split-f32-gcn", "exact-split-f64", "sampled-bf16-mean",
                                  "exact-split-f16", "exact-split-bf16-gcn"])
def test_cpp_launch_fills_what_the_python_plan_fills(launcher_module, case):
    # the C++ Launch's arguments and output (its specification: spmm_cuda._plan_of) for the same prepared
    # launch: every parameter slot equal but the output pointer, which is its own fresh output's; the output
    # of x's type, or zeroed in the accumulation type when rows are split
    width, aggregator, dtype = {"sampled-f32": (8, "sum", torch.float32),
                                "exact-split-f32-gcn": (0, "gcn", torch.float32),
                                "exact-split-f64": (0, "sum", torch.float64),
                                "sampled-bf16-mean": (8, "mean", torch.bfloat16),
                                "exact-split-f16": (0, "sum", torch.float16),
                                "exact-split-bf16-gcn": (0, "gcn", torch.bfloat16)}[case]
    g = hub_graph(43, weighted=True)
    cpu = torch.device("cpu")
    x = torch.from_numpy(features(g.num_nodes, 64, 43)).to(dtype)
    acc = spmm_cuda.ACC_DTYPES[dtype]
    dinv = spmm_mod._gcn_dinv(g, cpu, acc) if aggregator == "gcn" else None
    prep = spmm_cuda._prepared(g, x, width, "fastrand", aggregator, cpu, None, "degree", None)
    assert prep.split == (width == 0)
    want_out, want = spmm_cuda._plan_of(prep, x, dinv)
    cfg = prep.cfg
    lc = launcher_module.Launch(1234, 5678, cfg.blocks, cfg.block_threads, cfg.shared_bytes,
                                [*prep.head, 0, 0, 0, *prep.tail], prep.split, cfg.vector)
    out, args = lc.arguments(x, dinv.data_ptr() if dinv is not None else 0)
    assert out.dtype == want_out.dtype and out.shape == want_out.shape and out.device == x.device
    assert out.data_ptr() != want_out.data_ptr() and out.data_ptr() % 16 == 0
    if prep.split:
        assert torch.count_nonzero(out) == 0
    assert args[5] == out.data_ptr() and args[:5] + args[6:] == [*want.args[:5], *want.args[6:]]
    if launcher_module.has_driver():
        pytest.skip("a CUDA driver is loaded here: the no-driver answer is not this machine's")
    assert lc(x, 0, 0) is None  # no CUDA driver here: not launched, the caller takes the Python path


def test_cpp_launch_refuses_what_it_was_not_prepared_for(launcher_module):
    g = random_graph(44, weighted=False)
    x = torch.from_numpy(features(g.num_nodes, 16, 44))
    prep = spmm_cuda._prepared(g, x, 8, "fastrand", "sum", torch.device("cpu"), None, "degree", None)
    cfg = prep.cfg
    args = [*prep.head, 0, 0, 0, *prep.tail]
    lc = launcher_module.Launch(1, 2, cfg.blocks, cfg.block_threads, cfg.shared_bytes, args, False, cfg.vector)
    with pytest.raises(RuntimeError, match="prepared for"):
        lc.arguments(x[:-1].contiguous(), 0)
    with pytest.raises(RuntimeError, match="contiguous"):
        lc.arguments(x.t(), 0)
    with pytest.raises(ValueError, match="18 kernel arguments"):
        launcher_module.Launch(1, 2, cfg.blocks, cfg.block_threads, cfg.shared_bytes, args[:-1], False, False)
    with pytest.raises(ValueError, match="its context"):
        launcher_module.Launch(1, 0, cfg.blocks, cfg.block_threads, cfg.shared_bytes, args, False, False)
    assert launcher_module.PARAMS == len(spmm_cuda.ARG_KINDS)


def test_cpp_launch_build_removes_a_lock_a_killed_build_left(launcher_module):
    # torch's build lock is removed only by the build that took it: one killed mid-build (its process gone)
    # leaves it, and every later build would wait for it forever; an old one is taken for such a leftover
    from torch.utils import cpp_extension

    from kernels import cpp_launch

    lock = Path(cpp_extension._get_build_directory(cpp_launch.NAME, verbose=False)) / "lock"
    lock.write_text("")
    old = time.time() - cpp_launch.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    mod = cpp_launch.build_in_child(timeout=300)
    assert mod.PARAMS == launcher_module.PARAMS and not lock.exists()


def test_cpp_launch_build_policy(monkeypatch, caplog):
    # GNNSERVE_CPP_LAUNCH: off never builds; a build that fails is said once and leaves the Python path
    from kernels import cpp_launch

    for name, value in (("_module", None), ("_error", None), ("_thread", None)):
        monkeypatch.setattr(cpp_launch, name, value)
    monkeypatch.setenv(cpp_launch.MODE_ENV, "off")
    assert cpp_launch.mode() == "off" and cpp_launch.module() is None and cpp_launch._thread is None
    for value, want in (("1", "auto"), ("on", "auto"), ("Sync", "sync"), ("no", "off")):
        monkeypatch.setenv(cpp_launch.MODE_ENV, value)
        assert cpp_launch.mode() == want, value
    monkeypatch.setenv(cpp_launch.MODE_ENV, "bogus")
    with caplog.at_level(logging.WARNING, logger="kernels.cpp_launch"):
        assert cpp_launch.mode() == "auto" and cpp_launch.mode() == "auto"  # an unknown value: auto, said once
    assert sum("bogus" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()

    def no_compiler(timeout=None):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_launch, "build_in_child", no_compiler)
    monkeypatch.setenv(cpp_launch.MODE_ENV, "sync")
    with caplog.at_level(logging.WARNING, logger="kernels.cpp_launch"):
        assert cpp_launch.module() is None and cpp_launch.module() is None
    assert sum("did not build" in r.getMessage() for r in caplog.records) == 1
    ok, why = cpp_launch.status()
    assert not ok and "Ninja is required" in why


def test_kernels_package_never_imports_cupy_at_import_time():
    # CuPy is optional: every `import cupy` in kernels/ must sit inside a function
    for path in (REPO / "kernels").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "cupy" for n in names), f"{path.name} imports cupy at module level"


def test_available_is_false_and_quiet_without_cupy(monkeypatch, caplog):
    try:
        import cupy  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("CuPy is importable here")
    monkeypatch.setattr(spmm_cuda, "_available", None)
    with caplog.at_level(logging.DEBUG, logger="kernels.spmm_cuda"):
        assert spmm_cuda.available() is False
        assert spmm_cuda.available() is False  # cached: decided once
    msgs = [r for r in caplog.records if r.name == "kernels.spmm_cuda"]
    assert len(msgs) == 1 and msgs[0].levelno == logging.DEBUG and "CuPy" in msgs[0].getMessage()
    # and the dispatcher quietly serves a CPU tensor with the torch path
    g = random_graph(0, weighted=False)
    x = torch.from_numpy(features(g.num_nodes, 3, 0))
    torch.testing.assert_close(sampled_spmm(g, x, 8), sampled_spmm_torch(g, x, 8))


def test_available_can_be_disabled(monkeypatch):
    monkeypatch.setattr(spmm_cuda, "_available", None)
    monkeypatch.setenv(spmm_cuda.DISABLE_ENV, "1")
    assert spmm_cuda.available() is False
    assert spmm_cuda.status() == (False, f"disabled by {spmm_cuda.DISABLE_ENV}")  # the reason, for the server's warning


# ----------------------------------------------------------------------------- nvcc
def _instantiations() -> tuple[str, int]:
    lines = [f'#include "{KERNEL}"']
    for vt in VALUE_CTYPES.values():
        for it, cpt, vec in kernel_instances(vt):
            for split in (False, True):
                at = ACC_CTYPES[vt]
                ot = at if split else vt  # a split launch adds into an output of the accumulation type
                lines.append(
                    f"template __global__ void {kernel_name(vt, it, cpt, vec, split)}(const long long*, "
                    f"const {it}*, const float*, const {vt}*, const {at}*, {ot}*, const long long*, const int*, "
                    "long long, long long, long long, long long, long long, int, int, int, int, int);"
                )
    return "\n".join(lines) + "\n", len(lines) - 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernel_compiles_with_nvcc(tmp_path):
    src = tmp_path / "instantiate.cu"
    text, count = _instantiations()
    src.write_text(text)
    cubin = tmp_path / "es_spmm.cubin"
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(cubin), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "error" not in res.stderr.lower()
    # every template instance the wrapper asks for is in the binary
    names = set(re.findall(rb"_ZN7es_spmm14es_spmm_kernelI[0-9A-Za-z_]+", cubin.read_bytes()))
    assert len(names) == count == 2 * sum(len(kernel_instances(vt)) for vt in VALUE_CTYPES.values()), names
    # The float32 instances without splitting (every sampled pass a model serves, and exact passes on
    # graphs without long rows) stay in 64 registers without spilling: __launch_bounds__(256, 4), the
    # occupancy of the kernel before the split. The split instances may use up to 85 registers; the
    # float32 ones with int32 indices do not spill either (one int64 one spills a few bytes).
    entries = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores.*?Used (\d+) registers",
                         res.stderr, re.S)
    assert len(entries) == count
    plain = {name: (int(b), int(r)) for name, b, r in entries if "kernelIf" in name and name.split("ELb")[2][0] == "0"}
    assert len(plain) == len(kernel_instances("float"))
    assert all(b == 0 and r <= 64 for b, r in plain.values()), plain
    split32 = {name: int(b) for name, b, _ in entries if "kernelIfi" in name and name.split("ELb")[2][0] == "1"}
    assert len(split32) == len(kernel_instances("float")) // 2
    assert all(b == 0 for b in split32.values()), split32
    # the float16 / bfloat16 instances (float32 arithmetic, 16-bit loads) keep the float32 budget: no
    # spills anywhere, 64 registers without splitting
    short = {name: (int(b), int(r), name.split("ELb")[2][0] == "1") for name, b, r in entries
             if "half_t" in name or "bf16_t" in name}
    assert len(short) == 2 * len(kernel_instances("es_spmm::half_t")) + 2 * len(kernel_instances("es_spmm::bf16_t"))
    assert all(b == 0 and (split or r <= 64) for b, r, split in short.values()), short


# ----------------------------------------------------------------------------- host emulation
@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Path:
    return build_host_harness(tmp_path_factory, HARNESS, {"ES_SPMM_SOURCE": KERNEL}, "es_spmm_host")


VALUE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _raw(t: torch.Tensor) -> np.ndarray:
    """A tensor's bytes as NumPy sees them (16-bit types as their bit patterns)."""
    t = t.contiguous()
    return t.view(torch.int16).numpy() if t.element_size() == 2 else t.numpy()


def emulate(exe: Path, workdir: Path, g: CSRGraph, x, width: int, strategy: str, aggregator: str,
            *, block_threads: int | None = None, max_blocks: int | None = None, tile: int | None = None,
            split_edges: int | None = None, row_order: str = "degree", vector: bool | None = None,
            stats: dict | None = None, cols_per_thread: int | None = None, order: str = "forward"):
    """Run es_spmm.cu's thread code on the CPU with the launch sampled_spmm_cuda would make (its
    width rule, work schedule, 128-bit choice and shape; optionally fewer threads per block, fewer
    blocks, a smaller stage, another split threshold or forced scalar loads), return ``out``.
    ``x`` is a NumPy array (float32/float64; ``out`` comes back as one) or a torch tensor (also
    float16/bfloat16; ``out`` comes back as a tensor: in ``x``'s dtype, or float32 when rows were
    split, as the kernel writes it). ``stats`` receives ``atomics`` (atomic adds done), ``items``
    (work items launched), ``vector`` and ``split_edges`` (the threshold)."""
    as_numpy = isinstance(x, np.ndarray)
    xt = torch.from_numpy(np.ascontiguousarray(x)) if as_numpy else x.contiguous()
    n, f = xt.shape
    width_eff = width if 0 < width < int(g.degrees.max()) else 0  # as sampled_spmm_cuda does
    if split_edges is None:
        split_edges = split_threshold(g.indptr, width_eff)
    acc = spmm_cuda.ACC_DTYPES[xt.dtype]
    vb, ab, ib = xt.element_size(), spmm_cuda.VALUE_BYTES[acc], g.indices.dtype.itemsize
    sched = work_schedule(g.indptr, width_eff, split_edges, row_order)
    num_items = n if sched is None else len(sched[0])
    vec = use_vector(f, vb) if vector is None else vector  # the harness allocates x and out 16-byte aligned
    c = launch_config(n, f, width_eff, int(g.degrees.max()), vb, ib, tile=tile, max_blocks=max_blocks or 2**31 - 1,
                      vector=vec, num_items=num_items, acc_bytes=ab, cols_per_thread=cols_per_thread)
    bt = block_threads or c.block_threads
    gpb = bt // 32 * (32 // c.group_size)
    blocks = min(-(-num_items // gpb), max_blocks or 2**31 - 1)
    smem = shared_bytes(gpb, c.tile, ab, ib)
    workdir.mkdir(parents=True, exist_ok=True)
    g.indptr.astype(np.int64).tofile(workdir / "indptr.bin")
    g.indices.tofile(workdir / "indices.bin")
    g.edge_weights().tofile(workdir / "weights.bin")
    _raw(xt).tofile(workdir / "x.bin")
    dhat = np.bincount(np.repeat(np.arange(n), g.degrees), weights=g.edge_weights(), minlength=n) + 1.0
    (dhat**-0.5).astype(NP_DTYPES[acc]).tofile(workdir / "dinv.bin")
    if sched is not None:
        sched[0].tofile(workdir / "work_row.bin")
        sched[1].tofile(workdir / "work_chunk.bin")
    it = {4: "i32", 8: "i64"}[ib]
    args = [str(exe), str(workdir), VALUE_NAMES[xt.dtype], it, c.cols_per_thread, int(c.vector), c.group_size, c.tile,
            bt, blocks, smem, n, f, width_eff, STRATEGY_CODES[strategy], AGGREGATOR_CODES[aggregator],
            int(g.is_weighted), split_edges if sched is not None else 0, num_items]
    res = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, HARNESS_ORDER=order))
    why = {3: "shared-memory stages overflow", 4: "bad sync mask", 5: "lanes of a group diverge at a sync",
           6: "misaligned 128-bit access", 7: "atomic add outside a split row"}
    assert res.returncode == 0, f"harness exit {res.returncode}: {why.get(res.returncode, res.stderr)}"
    if stats is not None:
        stats["atomics"] = int(res.stdout.split()[-1])
        stats["items"] = num_items
        stats["vector"] = c.vector
        stats["split_edges"] = split_edges
    out_dtype = acc if sched is not None else xt.dtype
    if out_dtype in NP_DTYPES:
        out = torch.from_numpy(np.fromfile(workdir / "out.bin", dtype=NP_DTYPES[out_dtype]).reshape(n, f))
    else:
        out = torch.from_numpy(np.fromfile(workdir / "out.bin", dtype=np.int16).reshape(n, f)).view(out_dtype)
    return out.numpy() if as_numpy else out


def _emulation_cases():
    # every (width, strategy, aggregator); F, index type and weights rotate through all values
    combos = [(w, s, a) for w in WIDTHS for s in ("fastrand", "bucket") for a in ("sum", "mean", "gcn")
              if not (w == 0 and s == "bucket")]
    rot = itertools.cycle(itertools.product(FEATURES, ("int32", "int64"), (False, True)))
    return [(*c, *next(rot)) for c in combos]


@pytest.mark.parametrize("width, strategy, aggregator, f, index_dtype, weighted", _emulation_cases())
def test_host_emulation_matches_spec(harness, tmp_path, width, strategy, aggregator, f, index_dtype, weighted):
    g = random_graph(width + f, weighted=weighted, index_dtype=index_dtype)
    x = features(g.num_nodes, f, width)
    got = emulate(harness, tmp_path, g, x, width, strategy, aggregator)
    np.testing.assert_allclose(got, reference(g, x, width, strategy, aggregator), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("order", ["reverse", "shuffle"])
def test_host_emulation_does_not_depend_on_the_lanes_order(harness, tmp_path, order):
    """The lanes of a block run in reverse or shuffled order between syncs: rows that are not split give the
    same bits as in index order (a group reading what another lane of the same phase writes, its shared
    stage say, would differ); split rows add their chunks with atomics, in an order the GPU does not fix
    either, so they agree to rounding."""
    g = random_graph(14, weighted=True)
    x = features(g.num_nodes, 40, 14)
    split_seen = False
    for graph, feats, width, tile in ((g, x, 16, 5), (g, x, 0, 7), (g, x, 64, None),
                                      (hub_graph(3, weighted=True), features(6000, 32, 3), 0, None)):
        st: dict = {}
        base = emulate(harness, tmp_path, graph, feats, width, "fastrand", "gcn", block_threads=64, max_blocks=3,
                       tile=tile, stats=st)
        other = emulate(harness, tmp_path, graph, feats, width, "fastrand", "gcn", block_threads=64, max_blocks=3,
                        tile=tile, order=order)
        if st["atomics"]:  # split rows: their chunks' sums land in another order
            split_seen = True
            np.testing.assert_allclose(other, base, rtol=1e-5, atol=1e-5)
        else:
            assert np.array_equal(base.view(np.uint32), other.view(np.uint32)), (width, tile)
    assert split_seen


def test_host_emulation_grid_stride(harness, tmp_path):
    # fewer blocks than row groups, and narrow blocks: every group loops over many rows and reuses
    # its stage from one row to the next
    g = random_graph(11, weighted=True, n=1300)
    x = features(g.num_nodes, 8, 11)
    got = emulate(harness, tmp_path, g, x, 32, "fastrand", "gcn", block_threads=64, max_blocks=3)
    np.testing.assert_allclose(got, reference(g, x, 32, "fastrand", "gcn"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width, tile", [(128, 16), (32, 5), (0, 7), (300, 64)])
def test_host_emulation_rows_streamed_in_tiles(harness, tmp_path, width, tile):
    # a stage smaller than the sample (and exact mode with a tiny stage): rows go through shared
    # memory in several tiles, and F = 257 adds a second column pass that must restage them
    g = random_graph(12, weighted=True, index_dtype="int64")
    x = features(g.num_nodes, 257, 12)
    got = emulate(harness, tmp_path, g, x, width, "fastrand", "sum", block_threads=32, max_blocks=2, tile=tile)
    np.testing.assert_allclose(got, reference(g, x, width, "fastrand", "sum"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("aggregator", ["sum", "mean", "gcn"])
def test_host_emulation_float64(harness, tmp_path, aggregator):
    g = random_graph(13, weighted=True)
    x = features(g.num_nodes, 33, 13, np.float64)
    got = emulate(harness, tmp_path, g, x, 8, "fastrand", aggregator, block_threads=64, max_blocks=4)
    np.testing.assert_allclose(got, reference(g, x, 8, "fastrand", aggregator), rtol=1e-10, atol=1e-10)


def test_host_emulation_graph_without_edges(harness, tmp_path):
    g = CSRGraph(indptr=np.zeros(6, dtype=np.int64), indices=np.zeros(0, dtype=np.int32))
    x = features(5, 3, 0)
    assert np.all(emulate(harness, tmp_path / "s", g, x, 4, "fastrand", "sum", block_threads=32) == 0)
    np.testing.assert_allclose(emulate(harness, tmp_path / "g", g, x, 4, "fastrand", "gcn", block_threads=32), x)


def _hub_cases():
    # exact and a width above the split threshold (rows keep min(d, 1000) > 512 edges: split too),
    # every aggregator and strategy; F = 1, 30 (not a multiple of 4, but of 2: float64 vectors),
    # 64 (float4) and 257 (scalar, two passes); both value and index types, weights on and off
    combos = [(w, s, a) for w in (0, 1000) for s in ("fastrand", "bucket") for a in ("sum", "mean", "gcn")
              if not (w == 0 and s == "bucket")]
    rot = itertools.cycle(itertools.product((64, 30, 257, 1), (np.float32, np.float64), ("int32", "int64"),
                                            (True, False)))
    return [(*c, *next(rot)) for c in combos]


@pytest.mark.parametrize("width, strategy, aggregator, f, dtype, index_dtype, weighted", _hub_cases())
def test_host_emulation_split_hub_rows(harness, tmp_path, width, strategy, aggregator, f, dtype, index_dtype,
                                       weighted):
    g = hub_graph(width + f, weighted=weighted, index_dtype=index_dtype)
    x = features(g.num_nodes, f, f, dtype)
    stats: dict = {}
    got = emulate(harness, tmp_path, g, x, width, strategy, aggregator, stats=stats)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, reference(g, x, width, strategy, aggregator), rtol=tol, atol=tol)
    kept = np.minimum(g.degrees, width) if width else g.degrees
    split = stats["split_edges"]
    assert split == 128  # the mean kept count is ~20: the threshold's floor
    chunks = int((-(-kept[kept > split] // split)).sum())
    assert stats["items"] == g.num_nodes - int((kept > split).sum()) + chunks
    assert stats["atomics"] == chunks * f  # every chunk adds each column once, nothing else is atomic
    assert stats["vector"] == (f % (16 // x.dtype.itemsize) == 0)


@pytest.mark.parametrize("split, tile, width, f", [(7, 5, 0, 33), (33, 16, 0, 64), (1, 3, 32, 8), (100, 128, 300, 260),
                                                  (128, 128, 0, 20)])
@pytest.mark.parametrize("aggregator", ["sum", "mean", "gcn"])
def test_host_emulation_small_split_threshold(harness, tmp_path, split, tile, width, f, aggregator):
    # a threshold far below the rows' lengths: most rows split, chunk and stage boundaries disagree,
    # a narrow grid makes every group run many items (grid-stride), so the chunks of one row land in
    # different groups and blocks, in any order; F = 260 ends with a pass of one float4 per row
    g = random_graph(31 + split, weighted=True, index_dtype="int64" if split % 2 else "int32")
    x = features(g.num_nodes, f, split)
    stats: dict = {}
    got = emulate(harness, tmp_path, g, x, width, "fastrand", aggregator, block_threads=64, max_blocks=5, tile=tile,
                  split_edges=split, row_order="index" if split == 33 else "degree", stats=stats)
    np.testing.assert_allclose(got, reference(g, x, width, "fastrand", aggregator), rtol=1e-4, atol=1e-4)
    assert stats["atomics"] > 0


@pytest.mark.parametrize("f", [4, 64, 96])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_emulation_vector_and_scalar_loads_agree(harness, tmp_path, f, dtype):
    # the same launch with 128-bit loads and with scalar ones (what a misaligned x falls back to)
    g = hub_graph(5, weighted=True)
    x = features(g.num_nodes, f, 5, dtype)
    want = reference(g, x, 0, "fastrand", "gcn")
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for vec in (True, False):
        stats: dict = {}
        got = emulate(harness, tmp_path / str(vec), g, x, 0, "fastrand", "gcn", vector=vec, stats=stats)
        assert stats["vector"] is vec
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"vector={vec}")


def _from_ptr(ptr, dtype, count: int) -> np.ndarray:
    """A copy of ``count`` elements at host address ``ptr`` (the CPU stands in for the device)."""
    import ctypes

    buf = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(int(ptr))
    return np.frombuffer(buf, dtype=dtype).copy()


@pytest.mark.parametrize("case", ["hub-exact-gcn", "hub-s1000-f64-i64", "small-s8-mean-257", "misaligned-sum",
                                  "split-off", "hub-exact-f16-gcn", "small-s8-bf16-mean-64", "small-s8-f16-sum-31",
                                  "hub-exact-memoized-schedule-evicted"])
def test_launcher_plan_runs_in_the_host_emulation(harness, tmp_path, case):
    # spmm_cuda._plan -- what sampled_spmm_cuda launches: device entry, schedule, zeroed output, shape
    # and the argument tuple -- on CPU tensors; the arguments, read back from their pointers in the
    # kernel's parameter order, drive the host emulation, which must give the specification's numbers
    width, strategy, aggregator, f, dtype, split = {
        "hub-exact-gcn": (0, "fastrand", "gcn", 64, torch.float32, None),
        "hub-s1000-f64-i64": (1000, "bucket", "mean", 30, torch.float64, None),
        "small-s8-mean-257": (8, "fastrand", "mean", 257, torch.float32, None),
        "misaligned-sum": (0, "fastrand", "sum", 64, torch.float32, None),
        "split-off": (0, "fastrand", "gcn", 32, torch.float32, 0),
        "hub-exact-f16-gcn": (0, "fastrand", "gcn", 64, torch.float16, None),
        "small-s8-bf16-mean-64": (8, "fastrand", "mean", 64, torch.bfloat16, None),
        "small-s8-f16-sum-31": (8, "bucket", "sum", 31, torch.float16, None),
        "hub-exact-memoized-schedule-evicted": (0, "fastrand", "sum", 64, torch.float32, 64),
    }[case]
    if case.startswith("small"):
        g = random_graph(41, weighted=True)
    else:
        g = hub_graph(41, weighted=case != "misaligned-sum", index_dtype="int64" if "i64" in case else "int32")
    x = torch.from_numpy(features(g.num_nodes, f, 41)).to(dtype)
    if case == "misaligned-sum":
        flat = torch.empty(x.numel() + 1, dtype=dtype)
        xm = flat[1:].view(x.shape)
        xm.copy_(x)
        x = xm
    assert x.is_contiguous()
    acc = spmm_cuda.ACC_DTYPES[dtype]
    dinv = spmm_mod._gcn_dinv(g, torch.device("cpu"), acc) if aggregator == "gcn" else None
    held: list[torch.Tensor] = []  # alive until the end: memory a freed schedule would have had
    if case == "hub-exact-memoized-schedule-evicted":
        # a launch is planned (memoized), then its schedule leaves the entry's schedule memo (other thresholds
        # push it out) and takes the memoized launch with it, and the freed memory is reused before the
        # launch runs: the plan in flight must still hold every array it points into (_Plan.keep)
        entry = spmm_cuda._device_graph(g, torch.device("cpu"))
        out, plan = spmm_cuda._plan(g, x, width, strategy, aggregator, dinv, torch.device("cpu"), split, "degree",
                                    None)
        assert plan.split and any(p is plan.keep for p in entry["prepared"].values())
        for other in range(65, 65 + spmm_cuda.SCHEDULES_KEPT):
            spmm_cuda._device_schedule(g, entry, 0, other, "degree")
        assert (0, split, "degree") not in entry["schedules"]
        assert all(p.sched is not plan.keep.sched for p in entry["prepared"].values())  # dropped with it
        gc.collect()
        held.extend(torch.full((int(plan.args[8]),), -7, dtype=torch.int64) for _ in range(64))  # reuse freed memory
    else:
        out, plan = spmm_cuda._plan(g, x, width, strategy, aggregator, dinv, torch.device("cpu"), split, "degree",
                                    None)
    a = plan.args
    n = g.num_nodes
    num_items, split_edges = int(a[8]), int(a[9])
    assert (int(a[10]), int(a[11])) == (n, f) and plan.split == (split_edges > 0)
    assert plan.cfg.vector == (case != "misaligned-sum" and f % (16 // x.element_size()) == 0)
    if plan.split:
        assert torch.count_nonzero(out) == 0  # chunks add into a zeroed output
    assert out.dtype == (acc if plan.split else dtype)  # split rows add into the accumulation type
    e = g.num_edges
    itype = np.int64 if plan.index_ctype == "long long" else np.int32
    files = {"indptr": _from_ptr(a[0], np.int64, n + 1), "indices": _from_ptr(a[1], itype, e),
             "x": _from_ptr(a[3], NP_DTYPES.get(dtype, np.int16), n * f)}
    assert np.array_equal(files["indptr"], g.indptr) and np.array_equal(files["indices"], g.indices)
    if int(a[2]):
        files["weights"] = _from_ptr(a[2], np.float32, e)
    if int(a[4]):
        files["dinv"] = _from_ptr(a[4], NP_DTYPES[acc], n)
    if plan.split:
        files["work_row"] = _from_ptr(a[6], np.int64, num_items)
        files["work_chunk"] = _from_ptr(a[7], np.int32, num_items)
    else:
        assert int(a[6]) == int(a[7]) == 0 and num_items == n
    for name, arr in files.items():
        arr.tofile(tmp_path / f"{name}.bin")
    c = plan.cfg
    argv = [harness, tmp_path, VALUE_NAMES[dtype], "i64" if itype is np.int64 else "i32",
            c.cols_per_thread, int(c.vector), int(a[16]), int(a[17]), c.block_threads, c.blocks, c.shared_bytes,
            n, f, int(a[12]), int(a[13]), int(a[14]), int(a[15]), split_edges, num_items]
    assert (int(a[16]), int(a[17])) == (c.group_size, c.tile)
    res = subprocess.run([str(v) for v in argv], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    raw = np.fromfile(tmp_path / "out.bin", dtype=NP_DTYPES.get(out.dtype, np.int16)).reshape(n, f)
    got = torch.from_numpy(raw).view(out.dtype).to(dtype)  # sampled_spmm_cuda narrows a split launch's output
    want = reference(g, x.double().numpy(), width, strategy, aggregator)
    if dtype in HALF_TYPES:
        assert_rounded_once(got, want, dtype)
    else:
        tol = 1e-4 if dtype == torch.float32 else 1e-10
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)


def _kernel_parameter_kinds() -> tuple[str, ...]:
    """The parameter list of ``es_spmm_kernel`` in es_spmm.cu, as ``ptr`` / ``i64`` / ``i32``."""
    src = KERNEL.read_text()
    body = src[src.index("es_spmm_kernel(", src.index("__global__")):]
    params = body[len("es_spmm_kernel("): body.index(")")]
    while "<" in params:  # template arguments hold commas of their own: drop them
        params = re.sub(r"<[^<>]*>", "", params)
    kinds = []
    for p in params.split(","):
        p = " ".join(p.split())
        kinds.append("ptr" if "*" in p else "i64" if p.startswith("long long") else "i32" if p.startswith("int ") else p)
    return tuple(kinds)


def test_driver_launch_parameters_follow_the_kernel_signature():
    # the driver launch hands cuLaunchKernel one slot per parameter: kinds and order must be the
    # kernel's, every value must read back from its slot at its C width, and each thread has its block
    assert _kernel_parameter_kinds() == spmm_cuda.ARG_KINDS
    g = hub_graph(42, weighted=True)
    x = torch.from_numpy(features(g.num_nodes, 64, 42))
    dinv = spmm_mod._gcn_dinv(g, torch.device("cpu"), torch.float32)
    _, plan = spmm_cuda._plan(g, x, 0, "fastrand", "gcn", dinv, torch.device("cpu"), None, "degree", None)
    assert all(type(v) is int for v in plan.args)  # plain ints: nothing to box per call
    values, addr = spmm_cuda.param_block()
    values[:] = plan.args
    slots = _from_ptr(addr, np.uint64, len(plan.args))
    width = {"ptr": np.uint64, "i64": np.int64, "i32": np.int32}
    for i, (kind, want) in enumerate(zip(spmm_cuda.ARG_KINDS, plan.args, strict=True)):
        assert int(_from_ptr(slots[i], width[kind], 1)[0]) == want, (i, kind)
    typed = spmm_cuda.cupy_args(plan.args)
    assert [type(v) for v in typed] == [width[k] for k in spmm_cuda.ARG_KINDS]
    assert [int(v) for v in typed] == list(plan.args)
    other: list = []
    t = threading.Thread(target=lambda: other.append(spmm_cuda.param_block()[1]))
    t.start()
    t.join()
    assert other[0] != addr and spmm_cuda.param_block()[1] == addr  # one block per thread, reused


def test_device_keys_name_a_device_once():
    # the graph cache keys of kernels.spmm and kernels.spmm_cuda: a CPU is "cpu"; a GPU without an index
    # is keyed as the current device (checked on a GPU by test_cuda_staged_graphs_are_the_ones_launches_read)
    cpu = torch.device("cpu")
    assert spmm_mod.device_key(cpu) == "cpu" and spmm_cuda.entry_key(cpu) == "cuda_spmm:cpu"
    assert spmm_mod.device_key(torch.device("cuda", 1)) == "cuda:1"  # an explicit index is kept, no CUDA call


def test_stage_graphs_puts_every_entry_in_one_copy(monkeypatch):
    # a plan's layer graphs and its degrees staged with one copy (here onto the CPU, which stands in for
    # the device): the entries _device_graph then finds hold the graphs' arrays, 16-byte aligned views of
    # one buffer, and no array is uploaded on its own
    cpu = torch.device("cpu")
    graphs = [random_graph(80, weighted=True), random_graph(81, weighted=False, index_dtype="int64")]
    deg = np.random.default_rng(0).uniform(1, 9, 37)

    def no_upload(*args):
        raise AssertionError("an array uploaded on its own")

    monkeypatch.setattr(spmm_cuda, "_upload", no_upload)
    (d,) = spmm_cuda.stage_graphs(graphs, cpu, [deg])
    assert d.dtype == torch.float64 and np.array_equal(d.numpy(), deg)
    storages = {d.untyped_storage().data_ptr()}
    for g in graphs:
        entry = spmm_cuda._device_graph(g, cpu)  # found, not uploaded
        t = entry["tensors"]
        assert np.array_equal(t["indptr"].numpy(), g.indptr) and t["indptr"].dtype == torch.int64
        assert np.array_equal(t["indices"].numpy(), g.indices)
        assert ("weights" in t) == g.is_weighted and (not g.is_weighted or np.array_equal(t["weights"].numpy(),
                                                                                          g.weights))
        for name, tensor in t.items():
            assert tensor.data_ptr() % 16 == 0 and entry[f"ptr_{name}"] == tensor.data_ptr()
            storages.add(tensor.untyped_storage().data_ptr())
        assert entry["max_degree"] == int(g.degrees.max())
    assert len(storages) == 1  # one buffer, one copy
    before = [g.cache()["cuda_spmm:cpu"] for g in graphs]
    (again,) = spmm_cuda.stage_graphs(graphs, cpu, [deg])  # valid entries are kept
    assert [g.cache()["cuda_spmm:cpu"] for g in graphs] == before and np.array_equal(again.numpy(), deg)
    x = torch.from_numpy(features(graphs[1].num_nodes, 8, 1))
    _, plan = spmm_cuda._plan(graphs[1], x, 8, "fastrand", "sum", None, cpu, None, "degree", None)
    assert plan.args[:3] == (before[1]["ptr_indptr"], before[1]["ptr_indices"], 0)  # launches read the staged arrays


def test_host_emulation_of_the_probe_launches(harness, tmp_path):
    # spmm_cuda._probe expects these numbers from its two launches (128-bit loads; split rows)
    g = CSRGraph(indptr=np.array([0, 2, 3, 3], dtype=np.int64), indices=np.array([1, 2, 0], dtype=np.int32),
                 weights=np.array([1.0, 3.0, 2.0], dtype=np.float32))
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    stats: dict = {}
    got = emulate(harness, tmp_path / "a", g, x, 1, "bucket", "sum", stats=stats)
    assert stats["vector"] and np.array_equal(got, [[10, 12, 14, 16], [2, 4, 6, 8], [0, 0, 0, 0]])
    got = emulate(harness, tmp_path / "b", g, x, 0, "fastrand", "sum", split_edges=1, stats=stats)
    assert stats["atomics"] == 2 * 4 and np.array_equal(got, [[32, 36, 40, 44], [2, 4, 6, 8], [0, 0, 0, 0]])


def test_host_emulation_split_off_walks_hubs_whole(harness, tmp_path):
    # split_edges = 0 is the kernel without a schedule (one group per row, in index order, no atomics)
    g = hub_graph(6, weighted=False)
    x = features(g.num_nodes, 16, 6)
    stats: dict = {}
    got = emulate(harness, tmp_path, g, x, 0, "fastrand", "mean", split_edges=0, stats=stats)
    np.testing.assert_allclose(got, reference(g, x, 0, "fastrand", "mean"), rtol=1e-4, atol=1e-4)
    assert stats == {"atomics": 0, "items": g.num_nodes, "vector": True, "split_edges": 0}


# ----------------------------------------------------------------------------- 16-bit value types
HALF_TYPES = (torch.float16, torch.bfloat16)


def _ulp16(ref: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """One unit in the last place of ``dtype`` (float16 / bfloat16) at each ``|ref|`` (the subnormal
    step below the normal range)."""
    mant, emin = (10, -14) if dtype == torch.float16 else (7, -126)
    e = np.floor(np.log2(np.maximum(np.abs(ref), 2.0**emin)))
    return 2.0 ** (e - mant)


def assert_rounded_once(got: torch.Tensor, ref: np.ndarray, dtype: torch.dtype) -> None:
    """``got`` is the exact result ``ref`` (float64) computed in float32 and rounded once to ``dtype``:
    within one unit in the last place of ``dtype`` plus the float32 tests' tolerance (1e-4, relative
    and absolute: long rows with cancelling terms carry float32 error of that order) everywhere, and
    equal to the correctly rounded value almost everywhere. A conversion, layout or accumulation error
    is off by far more."""
    assert got.dtype == dtype and tuple(got.shape) == ref.shape
    g = got.double().numpy()
    err = np.abs(g - ref) / (_ulp16(ref, dtype) + 1e-4 * (1 + np.abs(ref)))
    assert np.all(err <= 1.0), f"{int((err > 1).sum())} entries off by more than one ulp (worst {err.max():.1f})"
    exact = torch.from_numpy(ref).float().to(dtype).double().numpy()
    assert np.mean(g == exact) >= 0.99, f"only {np.mean(g == exact):.3f} of the entries are the rounded exact value"


def test_host_conversions_match_numpy_and_torch(harness, tmp_path):
    # the kernel's host conversions (the device build uses cvt for float16, the same bit arithmetic for
    # bfloat16): every float16 and every bfloat16 bit pattern widened and narrowed back; midpoints
    # between neighbouring float16 values (ties: to even) and random float32 bit patterns narrowed
    every = np.arange(1 << 16, dtype=np.uint16)
    halves = every.view(np.float16).astype(np.float32)
    bf16s = (every.astype(np.uint32) << 16).view(np.float32)
    finite = np.sort(np.unique(halves[np.isfinite(halves)]).astype(np.float64))
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # 12 significant bits: exact in float32
    rnd = np.random.default_rng(7).integers(0, 1 << 32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.996, 65520, 65536, 1e-8, 2.0**-24,
                      2.0**-25, 2.0**-25 * (1 + 2.0**-20), 2.0**-14, 2.0**-14 * (1 - 2.0**-12), 3.4e38, 1e-45],
                     dtype=np.float32)
    values = np.concatenate([halves, bf16s, mids, rnd, edges]).astype(np.float32)
    values.tofile(tmp_path / "in.bin")
    res = subprocess.run([str(harness), "convert", str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    m = len(values)
    raw = np.fromfile(tmp_path / "out.bin", dtype=np.uint8)
    h = raw[: 2 * m].view(np.uint16)
    b = raw[2 * m: 4 * m].view(np.uint16)
    hf = raw[4 * m: 8 * m].view(np.float32)
    bf = raw[8 * m:].view(np.float32)
    nan = np.isnan(values)
    with np.errstate(over="ignore"):
        want_h = values.astype(np.float16).view(np.uint16)
    want_b = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(h[~nan], want_h[~nan]), values[~nan][h[~nan] != want_h[~nan]][:8]
    assert np.array_equal(b[~nan], want_b[~nan]), values[~nan][b[~nan] != want_b[~nan]][:8]
    assert np.all(np.isnan(h[nan].view(np.float16))) and np.all(np.isnan(bf[nan]))  # NaN stays NaN
    # widening is exact: every finite pattern comes back bit for bit
    assert np.array_equal(hf[: 1 << 16][~np.isnan(halves)], halves[~np.isnan(halves)])
    assert np.array_equal(bf[1 << 16: 2 << 16][~np.isnan(bf16s)], bf16s[~np.isnan(bf16s)])
    assert np.array_equal(h[: 1 << 16][~np.isnan(halves)], every[~np.isnan(halves)])


def _half_cases():
    return [  # width, strategy, aggregator, F, index type, weighted, vector loads
        (0, "fastrand", "gcn", 64, "int32", True, None),
        (8, "fastrand", "mean", 31, "int64", False, None),
        (32, "bucket", "sum", 257, "int32", True, None),
        (128, "fastrand", "gcn", 16, "int64", True, None),
        (1, "fastrand", "sum", 8, "int32", False, None),
        (8, "fastrand", "gcn", 64, "int32", True, False),
    ]


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("width, strategy, aggregator, f, index_dtype, weighted, vector", _half_cases())
def test_host_emulation_16bit_matches_spec(harness, tmp_path, dtype, width, strategy, aggregator, f, index_dtype,
                                           weighted, vector):
    # float16 / bfloat16 read natively (8 per 128-bit load when F % 8 == 0), float32 arithmetic, one
    # rounding per output: the specification's numbers (the torch path computes in float32 and casts)
    g = random_graph(50 + f, weighted=weighted, index_dtype=index_dtype)
    x = torch.from_numpy(features(g.num_nodes, f, width)).to(dtype)
    stats: dict = {}
    got = emulate(harness, tmp_path, g, x, width, strategy, aggregator, vector=vector, stats=stats)
    assert stats["vector"] == (f % 8 == 0 and vector is not False)
    # exact passes split the 577..1200-edge rows: float32 output, narrowed as the launcher does
    assert (got.dtype == torch.float32) == (stats["atomics"] > 0) == (width == 0)
    got = got.to(dtype)
    want = reference(g, x.double().numpy(), width, strategy, aggregator)
    assert_rounded_once(got, want, dtype)
    # the torch specification and the CPU dispatch hold to the same rule
    assert_rounded_once(sampled_spmm_torch(g, x, width, strategy, aggregator), want, dtype)
    assert_rounded_once(sampled_spmm(g, x, width, strategy, aggregator), want, dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("width, aggregator, f", [(0, "gcn", 64), (1000, "mean", 30), (0, "sum", 24)])
def test_host_emulation_16bit_split_hub_rows(harness, tmp_path, dtype, width, aggregator, f):
    # split rows of a 16-bit x add their float32 partial sums into a float32 output (no 16-bit atomics)
    g = hub_graph(60 + f, weighted=True)
    x = torch.from_numpy(features(g.num_nodes, f, f)).to(dtype)
    stats: dict = {}
    got = emulate(harness, tmp_path, g, x, width, "fastrand", aggregator, stats=stats)
    assert got.dtype == torch.float32 and stats["atomics"] > 0
    want = reference(g, x.double().numpy(), width, "fastrand", aggregator)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    assert_rounded_once(got.to(dtype), want, dtype)


def test_cpu_dispatch_takes_16bit_inputs_with_and_without_grad():
    # kernels.sampled_spmm on CPU float16 / bfloat16 tensors: the compiled kernel in float32 without a
    # gradient, the torch path (float32 inside) with one; both give x's dtype back
    g = random_graph(70, weighted=True)
    for dtype in HALF_TYPES:
        x = torch.from_numpy(features(g.num_nodes, 12, 70)).to(dtype)
        want = reference(g, x.double().numpy(), 8, "fastrand", "gcn")
        assert_rounded_once(sampled_spmm(g, x, 8, "fastrand", "gcn"), want, dtype)
        xg = x.clone().requires_grad_(True)
        y = sampled_spmm(g, xg, 8, "fastrand", "gcn")
        assert y.dtype == dtype and y.grad_fn is not None
        assert_rounded_once(y.detach(), want, dtype)
        y.float().sum().backward()
        assert xg.grad is not None and xg.grad.dtype == dtype


# ----------------------------------------------------------------------------- on a GPU
@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not spmm_cuda.available():
        pytest.skip("CuPy / the ES-SpMM kernel is not usable here")
    return torch.device("cuda")


def _to_gpu(x: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(x).to(device)


def _built(device_index: int, dtype: torch.dtype, split: bool) -> bool:
    """Whether a module of (device, value type, split) was built: a key begins so in either compile mode
    (one instance a module, or the bundles of ``GNNSERVE_CUDA_COMPILE=module``)."""
    return any(k[:3] == (device_index, dtype, split) for k in spmm_cuda._modules)


@pytest.mark.gpu
@pytest.mark.parametrize("aggregator", ["sum", "mean", "gcn"])
@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
@pytest.mark.parametrize("width", WIDTHS)
def test_cuda_matches_spec(cuda, width, strategy, aggregator):
    for f, index_dtype, weighted in itertools.product(FEATURES, ("int32", "int64"), (False, True)):
        g = random_graph(width + 7, weighted=weighted, index_dtype=index_dtype)
        x = features(g.num_nodes, f, width)
        got = spmm_cuda.sampled_spmm_cuda(g, _to_gpu(x, cuda), width, strategy, aggregator)
        assert got.device.type == "cuda" and got.dtype == torch.float32 and got.shape == x.shape
        np.testing.assert_allclose(
            got.cpu().numpy(), reference(g, x, width, strategy, aggregator), rtol=1e-4, atol=1e-4,
            err_msg=f"F={f} indices={index_dtype} weighted={weighted}",
        )


@pytest.mark.gpu
def test_a_fresh_process_compiles_only_what_it_launches(cuda, tmp_path):
    """COMPILE_PER_INSTANCE: the probe builds the two instances it launches (sampled, and an exact launch
    that splits rows), one more launch one more; GNNSERVE_CUDA_COMPILE=module builds the bundles of 16."""
    code = ("import torch, numpy as np\n"
            "from kernels import spmm_cuda\n"
            "from kernels.graph import CSRGraph\n"
            "assert spmm_cuda.available()\n"
            "n0 = len(spmm_cuda._modules)\n"
            "g = CSRGraph.from_edge_index(np.array([[0, 1, 2], [1, 2, 0]]), num_nodes=3, symmetrize=True)\n"
            "spmm_cuda.sampled_spmm_cuda(g, torch.ones(3, 256, device='cuda'), 1)\n"
            "print(n0, len(spmm_cuda._modules), len(spmm_cuda.compile_seconds))\n")
    counts = {}
    for mode in ("instance", "module"):
        env = dict(os.environ, GNNSERVE_CUDA_COMPILE=mode, CUPY_CACHE_DIR=str(tmp_path / mode),
                   PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent),
                                                          os.environ.get("PYTHONPATH", "")) if p))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        counts[mode] = tuple(int(v) for v in out.stdout.split())
    assert counts["instance"] == (2, 3, 3)  # F = 256: another CPT, another instance
    assert counts["module"] == (2, 2, 2)  # the float32 bundle and its split bundle hold it already


@pytest.mark.gpu
def test_an_instance_that_does_not_build_leaves_its_passes_to_the_torch_path(cuda, tmp_path):
    """Instances build on their first launch: one that fails then (NVRTC, CuPy's cache) raises
    KernelBuildError from sampled_spmm_cuda, is not built again, and kernels.sampled_spmm computes its
    passes on the torch path with one logged error."""
    code = ("import logging, torch, numpy as np\n"
            "from kernels import spmm_cuda\n"
            "from kernels.spmm import sampled_spmm, sampled_spmm_torch\n"
            "from kernels.graph import CSRGraph\n"
            "logging.basicConfig(level=logging.ERROR)\n"
            "assert spmm_cuda.available()\n"
            "spmm_cuda.kernel_source = lambda: 'this is not C++'\n"
            "rng = np.random.default_rng(0)\n"
            "g = CSRGraph.from_edge_index(rng.integers(0, 500, (2, 4000)), num_nodes=500, symmetrize=True)\n"
            "x = torch.randn(500, 256, device='cuda')\n"
            "try:\n"
            "    spmm_cuda.sampled_spmm_cuda(g, x, 8)\n"
            "    raise SystemExit('built')\n"
            "except spmm_cuda.KernelBuildError:\n"
            "    pass\n"
            "n = len(spmm_cuda.compile_seconds)\n"
            "for _ in range(3):\n"
            "    got = sampled_spmm(g, x, 8, 'fastrand', 'gcn')\n"
            "    torch.testing.assert_close(got, sampled_spmm_torch(g, x, 8, 'fastrand', 'gcn'))\n"
            "assert len(spmm_cuda.compile_seconds) == n and len(spmm_cuda._failed) == 1\n"
            "print('ok')\n")
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    assert out.stderr.count("does not build") == 1 and "the torch path computes these passes" in out.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("width", [0, 8, 1000])
def test_cuda_float64_and_float16(cuda, width):
    g = random_graph(21, weighted=True)
    x = features(g.num_nodes, 40, 21, np.float64)
    want = reference(g, x, width, "fastrand", "gcn")
    got = sampled_spmm(g, _to_gpu(x, cuda), width, "fastrand", "gcn")
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-10, atol=1e-10)
    for dtype in HALF_TYPES:
        xs = _to_gpu(x, cuda).to(dtype)
        short = sampled_spmm(g, xs, width, "fastrand", "mean")
        assert_rounded_once(short.cpu(), reference(g, xs.double().cpu().numpy(), width, "fastrand", "mean"), dtype)


@pytest.mark.gpu
def test_cuda_non_contiguous_input_side_stream_and_norm_degrees(cuda):
    g = random_graph(22, weighted=False)
    wide = _to_gpu(features(g.num_nodes, 70, 22), cuda)
    x = wide[:, 3:67]  # a strided view
    assert not x.is_contiguous()
    nd = 1.0 + 2.0 * g.degrees.astype(np.float64)
    want = sampled_spmm_torch(g, x.double().cpu(), 16, "fastrand", "gcn", norm_degrees=nd).numpy()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = sampled_spmm(g, x, 16, "fastrand", "gcn", norm_degrees=nd)
    s.synchronize()
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cuda_direct_calls_read_their_inputs_as_they_are(cuda):
    # the launcher reads a contiguous x of the kernel's type in place (no copy) and prepares a launch once per
    # graph and shape: new tensors of that shape each call, a dinv given on the CPU in float64, an x that
    # requires grad (under no_grad) all give the specification's numbers through the one memoized launch
    g = random_graph(231, weighted=True)  # its own graph: one prepared launch below
    entry = spmm_cuda._device_graph(g, cuda)
    nd = 1.0 + g.degrees.astype(np.float64)
    dinv64 = torch.from_numpy(nd ** -0.5)
    seen = []
    real_prepared = spmm_cuda._prepared  # what both launches (C++ and Python) prepare from: the x they read

    def prepared_spy(graph, xc, *args):
        if graph is g:  # not the C++ launcher's device check, which may run its probe's launches inside a call
            seen.append(xc.data_ptr() == x.data_ptr())
        return real_prepared(graph, xc, *args)

    for seed in range(3):
        x = _to_gpu(features(g.num_nodes, 64, seed), cuda).requires_grad_(seed == 2)
        with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
            mp.setattr(spmm_cuda, "_prepared", prepared_spy)
            got = spmm_cuda.sampled_spmm_cuda(g, x, 8, "fastrand", "gcn", gcn_dinv=dinv64)
        assert seen[-1], "a contiguous float32 x is read in place"
        want = sampled_spmm_torch(g, x.detach().double().cpu(), 8, "fastrand", "gcn", norm_degrees=nd).numpy()
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-4, atol=1e-4)
        assert not got.requires_grad
    assert len(entry["prepared"]) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("f", [64, 256, 33])
def test_cuda_short_rows_split_instance_matches_spec(cuda, f):
    # the four-block split instance (SHORT_ROWS_DEFINES) that exact passes over short rows launch
    g = short_rows_graph(3)
    x = _to_gpu(features(g.num_nodes, f, 3), cuda)
    got = sampled_spmm(g, x, 0).cpu().numpy()
    np.testing.assert_allclose(got, reference(g, x.double().cpu().numpy(), 0, "fastrand", "sum"), rtol=1e-4, atol=1e-4)
    _, p = spmm_cuda._plan(g, x, 0, "fastrand", "sum", None, x.device, None, "degree", None)
    assert p.defines == spmm_cuda.SHORT_ROWS_DEFINES  # 2,500+ blocks: above four waves on any GPU up to 156 SMs
    key = (x.device.index, torch.float32, p.index_ctype, p.cfg.cols_per_thread, p.cfg.vector, True, p.defines)
    assert key in spmm_cuda._kernels  # this launch's own instance was built, with the definitions


@pytest.mark.gpu
def test_cuda_cpp_launcher_matches_the_python_launch(cuda, launcher_module, monkeypatch):
    # once built, kernels/launcher.cpp launches every pass whose thread holds the kernel's context: the same
    # numbers as the Python launch (its specification), split rows included (equal up to the order of the
    # chunks' atomic adds), 16-bit inputs, gcn with dinv; and it passed its check on this device
    from kernels import cpp_launch

    monkeypatch.setattr(cpp_launch, "_module", launcher_module)
    idx = cuda.index if cuda.index is not None else torch.cuda.current_device()
    python_launch = spmm_cuda._launch

    def only_without_cpp(*args):  # the Python launch may run only when the C++ launcher is switched off
        assert not spmm_cuda.CPP_LAUNCH, "a pass fell back to the Python launch"
        return python_launch(*args)

    monkeypatch.setattr(spmm_cuda, "_launch", only_without_cpp)
    cases = [(random_graph(45, weighted=True), 8, "gcn", torch.float32, 64),
             (hub_graph(45, weighted=False), 0, "sum", torch.float32, 256),
             (hub_graph(46, weighted=True), 0, "mean", torch.float64, 30),
             (random_graph(46, weighted=False), 16, "sum", torch.bfloat16, 64)]
    for g, width, aggregator, dtype, f in cases:
        x = _to_gpu(features(g.num_nodes, f, 45), cuda).to(dtype)
        monkeypatch.setattr(spmm_cuda, "CPP_LAUNCH", True)
        got = spmm_cuda.sampled_spmm_cuda(g, x, width, "fastrand", aggregator)
        prep = spmm_cuda._prepared(g, x, width, "fastrand", aggregator, x.device, None, "degree", None)
        assert prep.launchers, "the C++ launcher launched this pass"
        monkeypatch.setattr(spmm_cuda, "CPP_LAUNCH", False)
        want = spmm_cuda.sampled_spmm_cuda(g, x, width, "fastrand", aggregator)
        assert got.dtype == want.dtype == dtype
        if prep.split:  # the chunks' atomic adds in another order: a rounding of the row's magnitudes, which
            # for a hub of 5,200 edges summing to near zero is above any fixed tolerance (1.2e-5 seen on an H100)
            scale = spmm_cuda.sampled_spmm_cuda(g, x.abs(), width, "fastrand", aggregator).double()
            slack = 16 * torch.finfo(dtype).eps * scale + 1e-12
            err = (got.double() - want.double()).abs()
            assert bool((err <= slack).all()), f"C++ and Python launches differ by {float((err - slack).max())} " \
                "beyond the rounding of the row's magnitudes"
        else:
            assert torch.equal(got, want)
    assert spmm_cuda._cpp_ok.get(idx) is True


@pytest.mark.gpu
def test_dispatch_picks_cuda_without_grad_and_torch_with_grad(cuda, monkeypatch):
    calls = []
    real = spmm_cuda._sampled_spmm_cuda  # what kernels.sampled_spmm calls, after its checks

    def spy(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(spmm_cuda, "_sampled_spmm_cuda", spy)
    g = random_graph(23, weighted=True)
    x = _to_gpu(features(g.num_nodes, 16, 23), cuda)
    out = sampled_spmm(g, x, 8)
    assert calls == [8] and out.grad_fn is None
    with torch.no_grad():
        sampled_spmm(g, x.clone().requires_grad_(True), 4)
    assert calls == [8, 4]  # no gradient is recorded under no_grad: the kernel serves it

    xg = x.clone().requires_grad_(True)
    y = sampled_spmm(g, xg, 8)
    assert calls == [8, 4], "a tensor that needs a gradient must take the torch path"
    assert y.grad_fn is not None
    y.sum().backward()
    assert xg.grad is not None and xg.grad.shape == x.shape
    torch.testing.assert_close(y.detach(), out, rtol=1e-4, atol=1e-4)  # both paths agree
    with pytest.raises(ValueError, match="gradient"):
        spmm_cuda.sampled_spmm_cuda(g, xg, 8)  # the public launcher checks what the dispatcher checked


@pytest.mark.gpu
def test_cuda_state_is_memoized(cuda):
    g = random_graph(24, weighted=False)
    x = _to_gpu(features(g.num_nodes, 8, 24), cuda)
    sampled_spmm(g, x, 8)
    entry = g.cache()[f"cuda_spmm:{x.device}"]
    sampled_spmm(g, x, 32, "bucket", "mean")
    assert g.cache()[f"cuda_spmm:{x.device}"] is entry  # graph arrays moved to the device once
    assert _built(x.device.index, torch.float32, False)
    empty = CSRGraph(indptr=np.zeros(4, dtype=np.int64), indices=np.zeros(0, dtype=np.int32))
    assert torch.equal(sampled_spmm(empty, torch.ones(3, 2, device=cuda), 4), torch.zeros(3, 2, device=cuda))


@pytest.mark.gpu
@pytest.mark.parametrize("width, strategy, aggregator, f, dtype, index_dtype, weighted", _hub_cases())
def test_cuda_split_hub_rows_match_spec(cuda, width, strategy, aggregator, f, dtype, index_dtype, weighted):
    # the host-emulated cases above, launched for real: hub rows split across groups, atomicAdd merges
    g = hub_graph(width + f, weighted=weighted, index_dtype=index_dtype)
    x = features(g.num_nodes, f, f, dtype)
    got = spmm_cuda.sampled_spmm_cuda(g, _to_gpu(x, cuda), width, strategy, aggregator)
    assert got.dtype == _to_gpu(x, cuda).dtype and got.shape == x.shape
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got.cpu().numpy(), reference(g, x, width, strategy, aggregator), rtol=tol, atol=tol)
    entry = g.cache()[spmm_cuda.entry_key(cuda)]
    w = width if width < int(g.degrees.max()) else 0
    assert entry["schedules"][(w, None, spmm_cuda.ROW_ORDER)]["split_edges"] == split_threshold(g.indptr, w) == 128
    assert _built(cuda.index or 0, torch.float32 if dtype == np.float32 else torch.float64, True)


@pytest.mark.gpu
@pytest.mark.parametrize("split, order", [(0, "degree"), (1, "degree"), (64, "index"), (512, "index"), (4096, "degree")])
@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("f", [4, 30, 64, 256, 260])
def test_cuda_launch_knobs_match_spec(cuda, split, order, vector, f):
    # every split threshold (0 = off), row order and load width gives the specification's numbers
    g = hub_graph(7, weighted=True)
    x = features(g.num_nodes, f, 7)
    # split=1: every edge its own chunk, a hub row's 5,200 float32 atomicAdds in the scheduler's order
    # (about 1.4e-4 of rounding at one sigma on the sum aggregator); the fixed-order cases keep 1e-4
    tol = 5e-4 if split == 1 else 1e-4
    for aggregator in ("sum", "gcn"):
        got = spmm_cuda.sampled_spmm_cuda(g, _to_gpu(x, cuda), 0, "fastrand", aggregator, split_edges=split,
                                          row_order=order, vector=vector)
        np.testing.assert_allclose(got.cpu().numpy(), reference(g, x, 0, "fastrand", aggregator), rtol=1e-4,
                                   atol=tol, err_msg=f"{aggregator} split={split} order={order} vector={vector}")


@pytest.mark.gpu
def test_cuda_hold_stream_delays_what_follows(cuda):
    # the benchmarks' timing aid: launches issued after a hold queue behind it
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    spmm_cuda.hold_stream(2e-3)
    b.record()
    b.synchronize()
    assert a.elapsed_time(b) >= 1.9  # ms: at least the hold, at SM clocks up to 2 GHz


@pytest.mark.gpu
def test_cuda_misaligned_input_falls_back_to_scalar_loads(cuda):
    g = hub_graph(8, weighted=False)
    x = features(g.num_nodes, 64, 8)
    flat = torch.empty(x.size + 1, device=cuda)
    xm = flat[1:].view(x.shape)  # contiguous, but 4 bytes past a 16-byte boundary
    xm.copy_(torch.from_numpy(x))
    assert xm.is_contiguous() and xm.data_ptr() % 16 == 4
    got = spmm_cuda.sampled_spmm_cuda(g, xm, 0, "fastrand", "mean")
    np.testing.assert_allclose(got.cpu().numpy(), reference(g, x, 0, "fastrand", "mean"), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["f16", "bf16"])
def test_cuda_16bit_input_on_split_rows(cuda, dtype):
    g = hub_graph(9, weighted=True)
    x = _to_gpu(features(g.num_nodes, 64, 9), cuda).to(dtype)
    got = sampled_spmm(g, x, 0, "fastrand", "gcn")
    assert_rounded_once(got.cpu(), reference(g, x.double().cpu().numpy(), 0, "fastrand", "gcn"), dtype)
    assert _built(cuda.index or 0, dtype, True)  # a native 16-bit split instance


@pytest.mark.gpu
def test_cuda_driver_launch_matches_the_cupy_launch(cuda, monkeypatch):
    ok, why = spmm_cuda.status()
    assert ok and "driver launch" in why, why
    g = hub_graph(14, weighted=True)
    cases = [(0, "gcn", torch.float32, 64), (8, "mean", torch.float64, 30), (16, "sum", torch.bfloat16, 64)]
    for width, aggregator, dtype, f in cases:
        x = _to_gpu(features(g.num_nodes, f, 14), cuda).to(dtype)
        fast = spmm_cuda.sampled_spmm_cuda(g, x, width, "fastrand", aggregator, split_edges=0)
        monkeypatch.setattr(spmm_cuda, "FAST_LAUNCH", False)
        slow = spmm_cuda.sampled_spmm_cuda(g, x, width, "fastrand", aggregator, split_edges=0)
        monkeypatch.setattr(spmm_cuda, "FAST_LAUNCH", True)
        assert torch.equal(fast, slow), (width, aggregator, dtype)  # one kernel, same arguments: same bits


@pytest.mark.gpu
def test_cuda_driver_launch_from_a_fresh_thread(cuda):
    # a thread that has done no CUDA work has no context bound: the first driver launch binds the
    # device's primary context and the result is right
    g = random_graph(15, weighted=True)
    x = _to_gpu(features(g.num_nodes, 32, 15), cuda)
    want = reference(g, x.double().cpu().numpy(), 8, "fastrand", "gcn")
    got: list = []
    errors: list = []

    def run():
        try:
            y = spmm_cuda.sampled_spmm_cuda(g, x, 8, "fastrand", "gcn")
            torch.cuda.current_stream(cuda).synchronize()
            got.append(y.cpu().numpy())
        except Exception as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cuda_16bit_module_that_fails_to_build_falls_back_to_float32(cuda, monkeypatch, caplog):
    real = spmm_cuda._kernel

    def failing(device_index, dtype, *args):
        if dtype == torch.bfloat16:
            raise RuntimeError("NVRTC says no")
        return real(device_index, dtype, *args)

    monkeypatch.setattr(spmm_cuda, "_kernel", failing)
    monkeypatch.setattr(spmm_cuda, "_no_native", set())
    g = random_graph(13, weighted=True)
    x = _to_gpu(features(g.num_nodes, 64, 13), cuda).to(torch.bfloat16)
    want = reference(g, x.double().cpu().numpy(), 8, "fastrand", "gcn")
    with caplog.at_level(logging.WARNING, logger="kernels.spmm_cuda"):
        for _ in range(2):
            assert_rounded_once(spmm_cuda.sampled_spmm_cuda(g, x, 8, "fastrand", "gcn").cpu(), want, torch.bfloat16)
    assert sum("does not build" in r.getMessage() for r in caplog.records) == 1  # said once, then float32
    assert spmm_cuda._no_native == {(cuda.index or 0, torch.bfloat16)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("f", [8, 30, 64, 256, 264])
@pytest.mark.parametrize("width", [0, 8, 128])
def test_cuda_16bit_native_matches_spec(cuda, dtype, vector, f, width):
    # 16-bit x read natively (8 elements per 128-bit load where F % 8 == 0), float32 arithmetic, one
    # rounding per output; scalar and vector loads, one and two column passes, split and whole rows
    g = hub_graph(12, weighted=True) if width == 0 else random_graph(12, weighted=True)
    x = _to_gpu(features(g.num_nodes, f, 12), cuda).to(dtype)
    for aggregator in ("sum", "gcn"):
        got = spmm_cuda.sampled_spmm_cuda(g, x, width, "fastrand", aggregator, vector=vector)
        assert got.dtype == dtype
        assert_rounded_once(got.cpu(), reference(g, x.double().cpu().numpy(), width, "fastrand", aggregator), dtype)
    assert _built(cuda.index or 0, dtype, False) or width == 0


@pytest.mark.gpu
def test_cuda_replaced_graph_arrays_are_never_served_stale(cuda):
    g = CSRGraph(indptr=hub_graph(10, weighted=False).indptr.copy(), indices=hub_graph(10, weighted=False).indices.copy())
    x = _to_gpu(features(g.num_nodes, 32, 10), cuda)
    sampled_spmm(g, x, 0)
    before = g.cache()[f"cuda_spmm:{x.device}"]
    # replace the column array with another valid one (every row's columns shifted by one, re-sorted)
    cols = (g.indices.astype(np.int64) + 1) % g.num_nodes
    for r in range(g.num_nodes):
        lo, hi = g.indptr[r], g.indptr[r + 1]
        cols[lo:hi] = np.sort(cols[lo:hi])
    g.indices = cols.astype(np.int32)
    got = sampled_spmm(g, x, 0).cpu().numpy()
    assert g.cache()[f"cuda_spmm:{x.device}"] is not before
    np.testing.assert_allclose(got, sampled_spmm_torch(g, x.cpu(), 0).numpy(), rtol=1e-4, atol=1e-4)
