"""CUDA path of ES-SpMM (kernels/es_spmm.cu + kernels/spmm_cuda.py) held to the torch specification.

Three layers, so that a machine without a GPU still checks most of the kernel:

* the ``.cu`` file compiles with ``nvcc`` for sm_90 with every template instance the wrapper asks
  NVRTC for (skipped without nvcc);
* the kernel's own thread code runs on the CPU (``tests/es_spmm_host_harness.cpp``: every GPU
  thread a coroutine, row groups interleaved, ``__syncwarp`` as a group rendezvous) against
  ``sampled_spmm_torch`` (skipped without a C++ compiler);
* on a GPU with CuPy (marked ``gpu``): the real launches against ``sampled_spmm_torch``, the
  dispatch, streams, dtypes.
"""

from __future__ import annotations

import ast
import functools
import itertools
import logging
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import spmm_cuda
from kernels.graph import CSRGraph
from kernels.spmm import sampled_spmm, sampled_spmm_torch
from kernels.spmm_cuda import (
    AGGREGATOR_CODES,
    COLS_PER_THREAD,
    INDEX_CTYPES,
    SHARED_BUDGET,
    STRATEGY_CODES,
    VALUE_CTYPES,
    kernel_name,
    launch_config,
    shared_bytes,
)

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


def features(n: int, f: int, seed: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(1000 + seed).standard_normal((n, f)).astype(dtype)


def reference(g: CSRGraph, x: np.ndarray, width: int, strategy: str, aggregator: str) -> np.ndarray:
    """The specification, evaluated in float64 on the CPU."""
    return sampled_spmm_torch(g, torch.from_numpy(x.astype(np.float64)), width, strategy, aggregator).numpy()


# ----------------------------------------------------------------------------- launch shape (pure Python)
@pytest.mark.parametrize("f", [1, 2, 5, 16, 31, 32, 33, 64, 100, 128, 256, 257, 1000])
@pytest.mark.parametrize("width, max_degree", [(0, 5000), (0, 3), (8, 5000), (128, 5000), (1000, 5000), (16, 4)])
@pytest.mark.parametrize("sizes", [(4, 4), (4, 8), (8, 4), (8, 8)])
def test_launch_config_shape(f, width, max_degree, sizes):
    vb, ib = sizes
    c = launch_config(10_000, f, width, max_degree, vb, ib)
    assert c.cols_per_thread in COLS_PER_THREAD
    assert c.group_size in (4, 8, 16, 32)
    # one pass for F <= 256, and no lane idles because of a too-wide group
    assert c.group_size * c.cols_per_thread >= min(f, 256)
    assert c.group_size == 4 or c.group_size * c.cols_per_thread < 2 * f
    assert c.block_threads % 32 == 0 and 32 <= c.block_threads <= 256
    assert c.groups_per_block == c.block_threads // 32 * (32 // c.group_size)
    assert c.blocks * c.groups_per_block >= 10_000 > (c.blocks - 1) * c.groups_per_block
    if width > 0:
        assert c.tile == max(1, min(width, 256, max_degree))  # the whole sample of a row is staged
    else:
        assert c.tile == max(1, min(128, max_degree))
    assert c.shared_bytes == shared_bytes(c.groups_per_block, c.tile, vb, ib)
    assert c.shared_bytes <= SHARED_BUDGET or c.block_threads == 32


def test_launch_config_caps_blocks_and_counts_bytes():
    c = launch_config(10**9, 64, 32, 10**6, 4, 4, max_blocks=1000)
    assert c.blocks == 1000  # rows beyond the grid are reached grid-stride
    # 8 groups * 33 floats = 1056 bytes (already a multiple of 16), then 8 * 33 ints
    assert shared_bytes(8, 32, 4, 4) == 1056 + 1056
    assert shared_bytes(1, 2, 4, 8) == 16 + 24  # 12 value bytes padded to 16


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
def _instantiations() -> str:
    lines = [f'#include "{KERNEL}"']
    for vt in VALUE_CTYPES.values():
        for it in INDEX_CTYPES.values():
            for cpt in COLS_PER_THREAD:
                lines.append(
                    f"template __global__ void {kernel_name(vt, it, cpt)}(const long long*, const {it}*, "
                    f"const float*, const {vt}*, const {vt}*, {vt}*, long long, long long, long long, "
                    "int, int, int, int, int);"
                )
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernel_compiles_with_nvcc(tmp_path):
    src = tmp_path / "instantiate.cu"
    src.write_text(_instantiations())
    cubin = tmp_path / "es_spmm.cubin"
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(cubin), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "error" not in res.stderr.lower()
    # every template instance the wrapper asks for is in the binary
    names = set(re.findall(rb"_ZN7es_spmm14es_spmm_kernelI[0-9A-Za-z_]+", cubin.read_bytes()))
    assert len(names) == len(VALUE_CTYPES) * len(INDEX_CTYPES) * len(COLS_PER_THREAD), names
    # the float32 instances (what a model serves) keep everything in registers; ptxas caps the
    # kernel near 64 registers for 256-thread blocks, and one float64 instance spills a few bytes
    entries = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores", res.stderr, re.S)
    assert len(entries) == len(names)
    float_spills = {name: int(b) for name, b in entries if "kernelIf" in name}
    assert len(float_spills) == len(INDEX_CTYPES) * len(COLS_PER_THREAD)
    assert all(b == 0 for b in float_spills.values()), float_spills


# ----------------------------------------------------------------------------- host emulation
@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the host emulation")
    exe = tmp_path_factory.mktemp("harness") / "es_spmm_host"
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Wno-unknown-pragmas", "-Werror", "-x", "c++",
           f'-DES_SPMM_SOURCE="{KERNEL}"', str(HARNESS), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return exe


def emulate(exe: Path, workdir: Path, g: CSRGraph, x: np.ndarray, width: int, strategy: str, aggregator: str,
            *, block_threads: int | None = None, max_blocks: int | None = None, tile: int | None = None) -> np.ndarray:
    """Run es_spmm.cu's thread code on the CPU with the launch shape spmm_cuda would pick (optionally
    fewer threads per block, fewer blocks or a smaller stage), return ``out``."""
    n, f = x.shape
    width_eff = width if 0 < width < int(g.degrees.max()) else 0  # as sampled_spmm_cuda does
    vb, ib = x.dtype.itemsize, g.indices.dtype.itemsize
    c = launch_config(n, f, width_eff, int(g.degrees.max()), vb, ib, tile=tile, max_blocks=max_blocks or 2**31 - 1)
    bt = block_threads or c.block_threads
    gpb = bt // 32 * (32 // c.group_size)
    blocks = min(-(-n // gpb), max_blocks or 2**31 - 1)
    smem = shared_bytes(gpb, c.tile, vb, ib)
    workdir.mkdir(parents=True, exist_ok=True)
    g.indptr.astype(np.int64).tofile(workdir / "indptr.bin")
    g.indices.tofile(workdir / "indices.bin")
    g.edge_weights().tofile(workdir / "weights.bin")
    np.ascontiguousarray(x).tofile(workdir / "x.bin")
    dhat = np.bincount(np.repeat(np.arange(n), g.degrees), weights=g.edge_weights(), minlength=n) + 1.0
    (dhat**-0.5).astype(x.dtype).tofile(workdir / "dinv.bin")
    vt = {4: "f32", 8: "f64"}[vb]
    it = {4: "i32", 8: "i64"}[ib]
    args = [str(exe), str(workdir), vt, it, c.cols_per_thread, c.group_size, c.tile, bt, blocks, smem, n, f,
            width_eff, STRATEGY_CODES[strategy], AGGREGATOR_CODES[aggregator], int(g.is_weighted)]
    res = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    why = {3: "shared-memory stages overflow", 4: "bad sync mask", 5: "lanes of a group diverge at a sync"}
    assert res.returncode == 0, f"harness exit {res.returncode}: {why.get(res.returncode, res.stderr)}"
    return np.fromfile(workdir / "out.bin", dtype=x.dtype).reshape(n, f)


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
@pytest.mark.parametrize("width", [0, 8, 1000])
def test_cuda_float64_and_float16(cuda, width):
    g = random_graph(21, weighted=True)
    x = features(g.num_nodes, 40, 21, np.float64)
    want = reference(g, x, width, "fastrand", "gcn")
    got = sampled_spmm(g, _to_gpu(x, cuda), width, "fastrand", "gcn")
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-10, atol=1e-10)
    half = sampled_spmm(g, _to_gpu(x, cuda).half(), width, "fastrand", "mean")
    assert half.dtype == torch.float16
    np.testing.assert_allclose(half.float().cpu().numpy(), reference(g, x.astype(np.float16), width, "fastrand",
                                                                     "mean"), rtol=2e-2, atol=2e-2)


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
def test_dispatch_picks_cuda_without_grad_and_torch_with_grad(cuda, monkeypatch):
    calls = []
    real = spmm_cuda.sampled_spmm_cuda

    def spy(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(spmm_cuda, "sampled_spmm_cuda", spy)
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
        real(g, xg, 8)


@pytest.mark.gpu
def test_cuda_state_is_memoized(cuda):
    g = random_graph(24, weighted=False)
    x = _to_gpu(features(g.num_nodes, 8, 24), cuda)
    sampled_spmm(g, x, 8)
    entry = g.cache()[f"cuda_spmm:{x.device}"]
    sampled_spmm(g, x, 32, "bucket", "mean")
    assert g.cache()[f"cuda_spmm:{x.device}"] is entry  # graph arrays moved to the device once
    assert (x.device.index, torch.float32) in spmm_cuda._modules
    empty = CSRGraph(indptr=np.zeros(4, dtype=np.int64), indices=np.zeros(0, dtype=np.int32))
    assert torch.equal(sampled_spmm(empty, torch.ones(3, 2, device=cuda), 4), torch.zeros(3, 2, device=cuda))
