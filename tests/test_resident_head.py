"""kernels.resident_head: a resident plain model's last layer in one kernel launch.

* its launch shape and packed size (CPU);
* where it cannot run (a CPU, or required but unavailable) it says so and the torch operators serve;
* ``resident_head.cu`` compiles with nvcc for sm_90 without spilling (skipped without nvcc);
* its thread code, run on the CPU by ``tests/resident_head_host_harness.cpp`` (one coroutine per GPU
  thread, ``__syncthreads`` a block barrier, ``__shfl_xor_sync`` a warp exchange), gives the answers of
  ``ResidentPlain.forward`` + ``pack`` on the CPU: GCN and GraphSAGE, weighted and not, sampled widths,
  one above PAD_MAX and the exact width, a hub longer than the block's warps, hidden and class counts that
  are not multiples of 32 (more classes than a warp's lanes), fewer warps, with and without embeddings,
  a target twice, a NaN row;
* on a GPU: the kernel's packed answers equal its specification, ``ResidentPlain.forward`` + ``pack`` (the
  torch operators), on random graphs with a hub longer than a block's warps, every width (sampled, above
  PAD_MAX, exact), GCN and GraphSAGE, hidden and class counts that are not multiples of 32, with and
  without embeddings, batches of 1 to a few hundred targets; after an update's rebase it reads the new
  tables.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import resident_head, shadow_block
from kernels.resident import PAD_MAX, DeviceGraph, ResidentPlain
from models.gcn import GCN

from .harness_support import (
    ASAN_FLAGS,
    build_host_harness,
    compile_cubin,
    compile_nvrtc,
    kernel_params,
    nvrtc_library,
    run_harness,
    struct_members,
)
from .serving import skip_without_cuda
from .test_resident import ARCHS, _graph, _update


def test_launch_shape_fits_the_shared_memory():
    threads, shared = resident_head.launch_shape(64, 10)
    assert threads == 32 * resident_head.MAX_WARPS and shared == 4 * (64 + 10 + 64 * resident_head.MAX_WARPS)
    threads, shared = resident_head.launch_shape(4096, 47)  # fewer warps for a wide hidden layer
    assert 32 <= threads < 32 * resident_head.MAX_WARPS and shared <= resident_head.SHARED_LIMIT
    assert resident_head.launch_shape(12_000, 10) is None  # not even one warp's partial row
    assert resident_head.launch_shape(0, 10) is None


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("width", [3, 0])
@pytest.mark.parametrize("want_emb", [False, True])
def test_packed_size_is_the_torch_packing(arch, width, want_emb):
    """packed_floats gives the length of ResidentPlain.pack's buffer (the layout the kernel writes)."""
    g = _graph(2, False)
    model = ARCHS[arch](12, 9, 5, dropout=0.0).eval()
    with torch.no_grad():
        p = model.project(torch.randn(g.num_nodes, 12))
    r = ResidentPlain(model, g, lambda: p, strategy="fastrand", budget_bytes=1 << 24)
    assert r.head is None  # a CPU: the torch operators
    t = np.array([0, 5, 17])
    with torch.inference_mode():
        assert r.has_table(width)
        flat = r.pack(r.forward(torch.from_numpy(t), t, width, want_emb), len(t), width, want_emb)
    assert flat.numel() == resident_head.packed_floats(len(t), 5, 9, bool(width), want_emb)


def test_without_a_gpu_it_is_not_used_and_required_it_fails(caplog):
    g = _graph(3, False)
    model = GCN(8, 6, 3, dropout=0.0).eval()
    with torch.no_grad():
        p = model.project(torch.randn(g.num_nodes, 8))
    with caplog.at_level(logging.INFO, logger="kernels.resident_head"):
        r = ResidentPlain(model, g, lambda: p, strategy="fastrand", budget_bytes=1 << 24, fused_head=None)
    assert r.head is None
    r.device = torch.device("cuda", 0)  # what create() reads: a CUDA device it cannot use here
    if not torch.cuda.is_available():
        with caplog.at_level(logging.INFO, logger="kernels.resident_head"):
            assert resident_head.create(r) is None
        assert "the fused last layer is not used" in caplog.text
    with pytest.raises(RuntimeError, match="fused last layer cannot run here"):
        ResidentPlain(model, g, lambda: p, strategy="fastrand", budget_bytes=1 << 24, fused_head=True)


# ----------------------------------------------------------------------------- host emulation
HARNESS = Path(__file__).with_name("resident_head_host_harness.cpp")
HARNESS_ERRORS = {3: "shared memory written past the launcher's size",
                  5: "threads diverge at a barrier or an exchange", 8: "an answer was not written"}


@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Path:
    return build_host_harness(tmp_path_factory, HARNESS, {"RESIDENT_HEAD_SOURCE": resident_head.KERNEL_SOURCE},
                              "resident_head_host")


@pytest.fixture(scope="session")
def harness_asan(tmp_path_factory) -> Path:
    """The harness under AddressSanitizer and UBSan, shared memory and arrays of their exact sizes."""
    return build_host_harness(tmp_path_factory, HARNESS, {"RESIDENT_HEAD_SOURCE": resident_head.KERNEL_SOURCE},
                              "resident_head_asan", ASAN_FLAGS)


def emulate(exe: Path, workdir: Path, r: ResidentPlain, targets: np.ndarray, width: int, want_emb: bool, *,
            threads: int | None = None, order: str = "forward") -> np.ndarray:
    """Run resident_head.cu's thread code on the CPU with what ResidentHead.answer launches with
    (kernels.resident_head.kernel_tensors, launch_shape; optionally fewer threads, or the threads run in
    another ``order`` between waits) and return the packed answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    ts = resident_head.kernel_tensors(r, width)
    for name, t in {"ids": torch.from_numpy(np.asarray(targets, np.int64)), **ts}.items():
        if t is not None:
            t.detach().cpu().contiguous().numpy().tofile(workdir / f"{name}.bin")
    shape_threads, _ = resident_head.launch_shape(r.hidden, r.num_classes)
    threads = threads or shape_threads
    shared = 4 * (r.hidden + r.num_classes + r.hidden * (threads // 32))
    b = len(targets)
    floats = resident_head.packed_floats(b, r.num_classes, r.hidden, ts["kept2"] is not None, want_emb)
    args = [exe, workdir, b, r.hidden, r.num_classes, int(want_emb), int(ts["dinv"] is not None),
            int(ts["kept2"] is not None), int(ts["w_self"] is not None), threads, shared, floats]
    return run_harness(args, workdir, HARNESS_ERRORS, order)


def _on_cpu(arch: str, seed: int, weighted: bool, strategy: str, hidden: int, classes: int) -> ResidentPlain:
    torch.manual_seed(seed)
    g = _graph(seed, weighted)
    model = ARCHS[arch](24, hidden, classes, dropout=0.0).eval()
    with torch.no_grad():
        p = model.project(torch.randn(g.num_nodes, 24, generator=torch.Generator().manual_seed(seed)))
    return ResidentPlain(model, g, lambda: p, strategy=strategy, budget_bytes=1 << 28)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize(("hidden", "classes", "threads"), [(16, 5, None), (37, 7, 64), (70, 47, None)])
@pytest.mark.parametrize("weighted", [False, True])
def test_host_emulation_equals_the_torch_operators(harness, tmp_path, arch, hidden, classes, threads, weighted):
    r = _on_cpu(arch, 30 + hidden, weighted, "fastrand", hidden, classes)
    n = r.num_nodes
    rng = np.random.default_rng(hidden)
    # the hub, an isolated node, a self-loop, a target twice, random ones
    t = np.concatenate([[0, n - 1, 3, 0], rng.choice(n, 60, replace=False)])
    for width in (1, 8, PAD_MAX + 5, 0):
        assert r.has_table(width)
        for want_emb in (False, True):
            got = r.unpack_host(emulate(harness, tmp_path, r, t, width, want_emb, threads=threads), len(t), width,
                                want_emb)
            _assert_same(got, r.answer(t, width, want_emb), width)


def test_host_emulation_nan_rows_answer_like_torch(harness, tmp_path):
    """A NaN in the first-layer table: the targets that read it answer NaN, labelled as torch labels a NaN
    row (its first NaN: 0); the others as before."""
    r = _on_cpu("gcn", 4, False, "fastrand", 9, 6)
    assert r.has_table(4)
    with torch.inference_mode():  # the table was built under it
        r._tables[4][5] = float("nan")
    t = np.arange(0, 200, 5)
    want = r.answer(t, 4, False)
    assert np.isnan(want[0]).any() and not np.isnan(want[0]).all()
    got = r.unpack_host(emulate(harness, tmp_path, r, t, 4, False), len(t), 4, False)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])


@pytest.mark.parametrize("arch", list(ARCHS))
def test_host_emulation_breaks_ties_as_torch(harness, tmp_path, arch):
    """Equal largest probabilities held by different lanes of warp 0 (class 32 by lane 0, class 5 by lane 5,
    each its lane's best): the label is the first of them, 5, as torch's arg-max gives it."""
    r = _on_cpu(arch, 6, False, "fastrand", 12, 40)
    assert r.has_table(3)
    with torch.no_grad():
        for w in r._w:
            w.zero_()
        r._b.zero_()
        r._b[5] = r._b[32] = 1.0
    t = np.arange(0, 300, 7)
    want = r.answer(t, 3, False)
    assert (want[1] == 5).all()
    got = r.unpack_host(emulate(harness, tmp_path, r, t, 3, False), len(t), 3, False)
    assert (got[1] == 5).all()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


@pytest.mark.parametrize("order", ["reverse", "shuffle"])
def test_host_emulation_does_not_depend_on_the_threads_order(harness, tmp_path, order):
    """The block's threads run in reverse or shuffled order between waits: the same answer bits as in index
    order (a phase reading what another thread of the same phase writes would differ)."""
    for arch in ARCHS:
        r = _on_cpu(arch, 8, True, "fastrand", 37, 40)
        t = np.array([0, 3, 77, 1399, 500])
        for width in (4, 0):
            assert r.has_table(width)
            base = emulate(harness, tmp_path, r, t, width, True, threads=128)
            other = emulate(harness, tmp_path, r, t, width, True, threads=128, order=order)
            assert np.array_equal(base.view(np.uint32), other.view(np.uint32)), (arch, width)


def test_host_emulation_under_address_sanitizer(harness_asan, tmp_path):
    """AddressSanitizer and UBSan over the thread code with every buffer exactly as large as the launch's
    (the answers too): nothing read or written past an end, and the specification's answers."""
    for arch in ARCHS:
        r = _on_cpu(arch, 9, True, "fastrand", 21, 35)
        t = np.array([0, 1399, 3, 3, 640])
        for width in (2, 0):
            assert r.has_table(width)
            for want_emb in (False, True):
                got = r.unpack_host(emulate(harness_asan, tmp_path, r, t, width, want_emb, threads=64), len(t), width,
                                    want_emb)
                _assert_same(got, r.answer(t, width, want_emb), width)


def test_the_launch_arguments_are_the_kernels_parameters():
    """The launchers' argument order and kinds against each kernel's parameter list as written, and the
    host emulations' Args struct (built in its member order) against it too: a swap of two pointers of one
    type would pass every CPU test and answer wrongly on a GPU."""
    params = kernel_params(resident_head.KERNEL_SOURCE, "resident_head")
    assert [n for _, n in params] == ["ids", *resident_head.TENSOR_ARGS, "out", "B", "H", "C", "want_emb"]
    assert tuple(k for k, _ in params) == resident_head.ARG_KINDS
    assert struct_members(resident_head.KERNEL_SOURCE, "Args") == [n for _, n in params]
    params = kernel_params(shadow_block.KERNEL_SOURCE, shadow_block.KERNEL_NAME)
    assert [n for _, n in params] == [*shadow_block.PTR_ARGS, *shadow_block.INT_ARGS]
    assert tuple(k for k, _ in params) == shadow_block.ARG_KINDS
    assert struct_members(shadow_block.KERNEL_SOURCE, "Args") == [n for _, n in params]


@pytest.mark.parametrize(("source", "kernel"), [(resident_head.KERNEL_SOURCE, "resident_head"),
                                                (shadow_block.KERNEL_SOURCE, shadow_block.KERNEL_NAME)])
def test_the_kernels_compile_with_nvrtc_as_loaded(source, kernel):
    """What CuPy's RawModule compiles (kernels.resident_head.nvrtc_code: the shared header's text, then the
    kernel's) with the options CuPy adds, through a libnvrtc (no GPU needed; skipped where there is none,
    ``GNNSERVE_NVRTC`` names one)."""
    lib = nvrtc_library()
    if lib is None:
        pytest.skip("no libnvrtc here (GNNSERVE_NVRTC names one)")
    ptx = compile_nvrtc(lib, resident_head.nvrtc_code(source), source.name,
                        ["-std=c++17", "-ftz=true", "--device-as-default-execution-space", "-arch=compute_90"])
    assert f".entry {kernel}(" in ptx


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernel_compiles_with_nvcc(tmp_path):
    compile_cubin(tmp_path, resident_head.KERNEL_SOURCE, "resident_head")


# ----------------------------------------------------------------------------- on a GPU
def _resident(arch: str, seed: int, weighted: bool, strategy: str, hidden: int, classes: int):
    """A model and graph resident on the GPU with the fused last layer."""
    torch.manual_seed(seed)
    g = _graph(seed, weighted)
    model = ARCHS[arch](24, hidden, classes, dropout=0.0).to("cuda").eval()
    x = torch.randn(g.num_nodes, 24, generator=torch.Generator().manual_seed(seed)).to("cuda")
    with torch.no_grad():
        p = model.project(x)
    r = ResidentPlain(model, g, lambda: p, strategy=strategy, budget_bytes=1 << 28, fused_head=True)
    assert r.head is not None
    return g, p, r


def _spec(r: ResidentPlain, t: np.ndarray, width: int, want_emb: bool):
    """The same batch on the same state through the torch operators (forward, pack, one copy back): the
    kernel's specification. The same object, so that both read the very same tables (two builds of a
    table may differ in the last bit: the exact width's first layer adds with atomics)."""
    head, r.head = r.head, None
    try:
        return r.answer(t, width, want_emb)
    finally:
        r.head = head


def _assert_same(got, want, width):
    probs, labels, kept, emb = got
    w_probs, w_labels, w_kept, w_emb = want
    np.testing.assert_allclose(probs, w_probs, rtol=1e-5, atol=1e-6)
    top2 = np.sort(w_probs, axis=1)[:, -2:] if w_probs.shape[1] > 1 else None
    clear = np.ones(len(labels), bool) if top2 is None else (top2[:, 1] - top2[:, 0]) > 1e-5
    assert np.array_equal(labels[clear], w_labels[clear])  # ties within rounding may resolve either way
    if width:
        assert np.array_equal(kept, w_kept)
    else:
        assert kept is None and w_kept is None
    if w_emb is None:
        assert emb is None
    else:
        assert np.array_equal(emb, w_emb)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize(("hidden", "classes"), [(16, 5), (37, 7), (256, 47)])
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_head_equals_the_torch_operators(arch, hidden, classes, weighted):
    skip_without_cuda()
    g, _, fused = _resident(arch, 30 + hidden, weighted, "fastrand", hidden, classes)
    rng = np.random.default_rng(hidden)
    batches = [np.array([0]), np.array([g.num_nodes - 1]), np.array([3]),  # the hub, an isolated node, a self-loop
               np.unique(np.concatenate([[0, 3, g.num_nodes - 1], rng.choice(g.num_nodes, 300, replace=False)]))]
    for width in (1, 8, 64, PAD_MAX + 5, 0):
        assert fused.has_table(width)
        for t in batches:
            for want_emb in (False, True):
                _assert_same(fused.answer(t, width, want_emb), _spec(fused, t, width, want_emb), width)
    assert fused.head.launches == 5 * len(batches) * 2  # the spec's batches did not launch it


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
def test_fused_head_reads_the_tables_an_update_installed(strategy):
    """After a rebase (an update's new graph, the stale rows recomputed), the kernel answers from the new
    state: equal to the torch operators on the same updated model."""
    skip_without_cuda()
    g, p, fused = _resident("gcn", 7, True, strategy, 16, 5)
    t = np.arange(0, g.num_nodes, 9)
    assert fused.has_table(6) and fused.has_table(0)
    before = fused.answer(t, 6, True)
    g2, p2, stale = _update(g, p.cpu(), gcn=True)
    p2 = p2.to("cuda")
    fused.projections = lambda: p2
    fused.rebase(g2, DeviceGraph.upload(g2, fused.device), stale)
    t2 = np.append(t, g2.num_nodes - 1)  # the new node too
    for width in (6, 0):
        assert fused.has_table(width)
        _assert_same(fused.answer(t2, width, True), _spec(fused, t2, width, True), width)
    after = fused.answer(t, 6, True)
    changed = np.isin(t, stale)
    assert changed.any() and not np.allclose(after[3][changed], before[3][changed])  # it reads the new rows


@pytest.mark.gpu
def test_fused_head_nan_rows_answer_like_torch():
    """A NaN in a first-layer row (features are checked finite, not bounded): every probability NaN, and the
    label torch's argmax gives (its first NaN, class 0), never an out-of-range class."""
    skip_without_cuda()
    _, _, r = _resident("gcn", 5, False, "fastrand", 16, 5)
    assert r.has_table(4)
    t = np.array([0, 9, 33])
    with torch.inference_mode():
        r._tables[4][9] = float("nan")
    got, want = r.answer(t, 4, False), _spec(r, t, 4, False)
    assert np.isnan(got[0][1]).all() and np.array_equal(np.isnan(got[0]), np.isnan(want[0]))
    assert np.array_equal(got[1], want[1]) and got[1][1] == 0


@pytest.mark.gpu
def test_fused_head_on_a_second_gpu():
    """A model on cuda:1 from a thread whose current device is 0: the launch and the wait are on cuda:1."""
    skip_without_cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device")
    g = _graph(8, False)
    model = GCN(24, 16, 5, dropout=0.0).to("cuda:1").eval()
    with torch.no_grad():
        p = model.project(torch.randn(g.num_nodes, 24).to("cuda:1"))
    r = ResidentPlain(model, g, lambda: p, strategy="fastrand", budget_bytes=1 << 26, fused_head=True)
    assert r.has_table(8)
    t = np.arange(0, g.num_nodes, 7)
    torch.cuda.set_device(0)
    for _ in range(5):
        _assert_same(r.answer(t, 8, True), _spec(r, t, 8, True), 8)


@pytest.mark.gpu
def test_fused_head_batches_from_worker_threads():
    """Batches from threads other than the one that built the model (a server's workers) take the driver
    launch on their own parameter blocks, one at a time under the model's lock."""
    import concurrent.futures as cf

    skip_without_cuda()
    g, _, fused = _resident("sage", 9, False, "fastrand", 32, 6)
    assert fused.has_table(4)
    rng = np.random.default_rng(0)
    batches = [np.unique(rng.choice(g.num_nodes, int(rng.integers(1, 80)), replace=False)) for _ in range(64)]
    want = [_spec(fused, t, 4, False) for t in batches]
    with cf.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda t: fused.answer(t, 4, False), batches))
    for a, b in zip(got, want, strict=True):
        _assert_same(a, b, 4)



class _FailingHead:
    """A head whose launch fails (what a launch error raises): ResidentPlain must answer anyway."""

    launches = 0

    def answer(self, *_a):
        raise RuntimeError("cuLaunchKernel failed (injected)")


def _plain_on_cpu() -> ResidentPlain:
    """A small resident GCN on the CPU with its width-5 table (for a head that is injected)."""
    g = _graph(4, True)
    model = GCN(8, 6, 3, dropout=0.0).eval()
    with torch.no_grad():
        p = model.project(torch.randn(g.num_nodes, 8))
    r = ResidentPlain(model, g, lambda: p, strategy="fastrand", budget_bytes=1 << 24)
    assert r.has_table(5)
    return r


def test_a_failing_head_leaves_the_batch_to_the_torch_operators(caplog):
    r = _plain_on_cpu()
    t = np.array([0, 9, 33])
    want = r.answer(t, 5, True)
    r.head = _FailingHead()
    with caplog.at_level(logging.ERROR, logger="kernels.resident"):
        got = r.answer(t, 5, True)
    assert r.head is None and "the fused last layer failed a batch" in caplog.text
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)


def test_a_head_failure_that_lost_the_device_goes_up(monkeypatch):
    """A kernel fault that left the CUDA context unusable (kernels.resident.device_lost): the torch
    operators on that device cannot answer either, so the error reaches the runtime, which switches the
    resident path off (serve.runtime's _run_path; the shaDow case runs that end to end in
    tests/test_shadow_block.py)."""
    from kernels import resident as resident_mod

    r = _plain_on_cpu()
    r.head = _FailingHead()
    monkeypatch.setattr(resident_mod, "device_lost", lambda exc: True)
    with pytest.raises(RuntimeError, match="injected"):
        r.answer(np.array([0, 9, 33]), 5, True)
    assert r.head is None


class _CudaError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def test_device_lost_reads_the_error():
    """Sticky CUDA errors, by status (CuPy's errors) or by torch's wording; everything else is not a loss."""
    from kernels.resident import device_lost

    assert device_lost(_CudaError(700, "cudaErrorIllegalAddress: an illegal memory access was encountered"))
    assert device_lost(_CudaError(719, "CUDA_ERROR_LAUNCH_FAILED"))
    assert device_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert device_lost(RuntimeError("CUDA error: device-side assert triggered"))
    assert not device_lost(_CudaError(1, "CUDA_ERROR_INVALID_VALUE: invalid argument"))
    assert not device_lost(_CudaError(2, "cudaErrorMemoryAllocation: out of memory"))
    assert not device_lost(RuntimeError("cuLaunchKernel failed (injected)"))


def test_fused_head_required_where_the_configuration_rules_it_out(tiny_repo, caplog):
    """fused_head=True (--fused-head) on a plain model that cannot be resident (here: no first-layer table
    budget) fails that model loudly instead of serving it silently on other paths; a shaDow model beside it
    is not concerned (its kernel is --fused-shadow)."""
    from serve.errors import ModelRefused
    from serve.runtime import RuntimeOptions

    from .serving import ServerThread

    opts = {"device": "cpu", "resident": True, "fused_head": True, "activation_budget_bytes": 0}
    with caplog.at_level(logging.ERROR), ServerThread(tiny_repo, {"runtime_kw": opts}) as srv:
        assert srv.server.registry.get("shadow") is not None
        with pytest.raises(ModelRefused, match=r"out of service: its load failed .*fused_head"):  # it did not load
            srv.server.registry.get("gcn")
    assert "fused_head (--fused-head) needs the model resident, and --activation-cache-bytes is 0" in caplog.text
    assert RuntimeOptions().fused_head is None


def test_a_failed_head_puts_small_batches_back_on_the_cpu_paths(tiny_repo, caplog, monkeypatch):
    """The fused head fails a batch (the resident path is not switched off: the torch operators answer it
    and the next ones); the runtime then takes the torch operators' measured threshold instead of the
    fused head's 0, so that small batches go back to the compiled CPU paths."""
    from serve.runtime import GPU_MIN_TARGETS_AUTO

    from .serving import ServerThread
    from .test_resident import _process

    with ServerThread(tiny_repo, {"runtime_kw": {"device": "cpu", "resident": True, "serving_path":
                                                 "plain-resident"}}) as srv:
        rt = srv.server.registry.get("gcn")
        want = _process(rt, np.arange(0, 200, 7), 4)
        rt._resident.head = _FailingHead()
        with caplog.at_level(logging.WARNING):
            got = _process(rt, np.arange(0, 200, 7), 4)
        assert got.path == "plain-resident" and rt._resident.head is None
        np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-6)
        assert "the fused kernel is off after a failure" in caplog.text
        assert rt.gpu_min_targets == float("inf")  # a CPU runtime has no GPU threshold
        monkeypatch.setattr(rt, "device", torch.device("cuda", 0))  # what a GPU runtime derives (no launch here)
        rt.fused_head_lost()
        assert rt.gpu_min_targets == GPU_MIN_TARGETS_AUTO["plain-resident"] == 512
