"""kernels.shadow_block: a resident shaDow-GNN batch in one kernel launch.

* its shared-memory size, capacity and packed size (CPU; the harness holds the kernel's own size to the
  launcher's on every run);
* ``shadow_block.cu`` compiles with nvcc for sm_90 without spilling (skipped without nvcc);
* the kernel's thread code, run on the CPU by ``tests/shadow_block_host_harness.cpp`` (one coroutine per
  GPU thread, ``__syncthreads`` a barrier, shared memory guarded, every answer checked written), gives the
  answers of its specification, ``ResidentShadow.forward`` + ``pack``: GCN and GraphSAGE backbones, 1 to 3
  layers, every pool, weighted and not, the exact width and sampled ones (rows longer than the width, so
  fastrand positions are taken), both strategies, budgets below the table's k, hidden and class counts
  that are not multiples of 32, fewer threads than rows, GraphSAGE's transform in passes of a few rows,
  NaN rows (as the model: along kept edges only), duplicate targets; a capacity too small is refused,
  never written past; the same bits whatever order the threads run in between barriers (a race within a
  phase would show); clean under AddressSanitizer and UBSan with exact-size buffers;
* the check at creation names any part of the answers that differs;
* through a real server on loopback (CPU), with the emulated kernel as the model's block: its answers
  are the torch operators'; a failing launch leaves the batch to them and the threshold to theirs; a
  failure that lost the device's context goes up, and the batch takes the next path;
* where it cannot run it says so, and required it fails;
* on a GPU: the launch against the torch operators, wide models in opted-in shared memory, the runtime's
  choice with ``fused_shadow``.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import shadow_block

from .harness_support import ASAN_FLAGS, build_host_harness, compile_cubin, run_harness
from .serving import skip_without_cuda
from .test_resident import _process, _shadow_setup

HARNESS = Path(__file__).with_name("shadow_block_host_harness.cpp")


# ----------------------------------------------------------------------------- sizes
def test_sizes():
    # 5 per-row arrays (two of K + 1), 2 per kept pair, two [k, H] buffers, the scratch rows, readout, logits
    assert shadow_block.shared_bytes(64, 64, 10, 192, 1300, 8) == 4 * (322 + 2600 + 8192 + 512 + 192 + 10)
    assert shadow_block.shared_bytes(3, 5, 2, 5, 1, 0) == 4 * (17 + 2 + 30 + 5 + 2)
    assert shadow_block.capacity(1300, 64, 8) == 512  # S per row bounds it
    assert shadow_block.capacity(1300, 64, 0) == 1300  # the target's stored pairs bound it
    assert shadow_block.capacity(0, 64, 0) == 1
    # GCN needs no scratch; GraphSAGE all rows where that fits 48 KiB, else 8 per pass
    assert shadow_block.scratch_rows(True, 64, 64, 10, 128, 512) == 0
    assert shadow_block.scratch_rows(False, 24, 8, 3, 16, 72) == 24
    assert shadow_block.scratch_rows(False, 64, 64, 10, 128, 3040) == 8
    assert shadow_block.packed_floats(4, 3, 16, False) == 4 * 3 + 5 * 4
    assert shadow_block.packed_floats(4, 3, 16, True) == 4 * 3 + 5 * 4 + 4 * 16


def test_pointer_arguments_follow_the_kernels_order():
    """kernels.shadow_block.pointer_args (what ShadowBlock.answer launches with) in PTR_ARGS's order: each
    the tensor of its name (the order itself is held to the kernel's parameter list in test_resident_head)."""
    for weighted in (False, True):
        _, _, _, _, res = _shadow_setup("sage", "mean", 2, weighted)
        t = shadow_block.model_tensors(res.model, torch.device("cpu"))
        got = dict(zip(shadow_block.PTR_ARGS, shadow_block.pointer_args(res, t, 11, 22), strict=True))
        assert got["ids"] == 11 and got["out"] == 22 and got["p"] == res._p.data_ptr()
        assert got["ew"] == (res.weights.data_ptr() if weighted else 0)
        for name in ("lptr", "lnodes", "eptr", "src", "dst"):
            assert got[name] == getattr(res, name).data_ptr()
        for name in ("wt", "bias", "wc", "bc"):
            assert got[name] == t[name].data_ptr()


def test_launch_shapes_are_memoized_per_table():
    """ShadowBlock.shape (what a batch's fit check and its launch both read) is launch_shape, kept per
    (width, budget) and recomputed when a rebuilt induced table has another longest run; scalars and
    block_bytes give the same with or without it."""
    import types

    _, _, _, _, res = _shadow_setup("sage", "mean+max", 2, True)
    block = types.SimpleNamespace(r=res, _shapes={})
    shape = shadow_block.ShadowBlock.shape(block, 2, 24)
    assert shape == shadow_block.launch_shape(res, 2, 24) and len(block._shapes) == 1
    assert shadow_block.ShadowBlock.shape(block, 2, 24) is shape
    assert shadow_block.scalars(res, 3, 2, 24, True, shape) == shadow_block.scalars(res, 3, 2, 24, True)
    assert shadow_block.block_bytes(res, 2, 24) == shape[2]
    res.e_max += 100  # as a rebuilt table with a longer run would
    assert shadow_block.ShadowBlock.shape(block, 2, 24) == shadow_block.launch_shape(res, 2, 24)
    assert len(block._shapes) == 2


def test_packed_size_is_the_torch_packing():
    _, _, _, _, res = _shadow_setup("gcn", "mean+max", 2, False)
    t = np.array([0, 5, 17])
    with torch.inference_mode():
        flat = res.pack(res.forward(torch.from_numpy(t), 3, 24, True), 3, True)
    assert flat.numel() == shadow_block.packed_floats(3, 3, shadow_block.embedding_dim(res), True)


def test_without_a_gpu_it_is_not_used_and_required_it_fails(caplog):
    _, _, _, _, res = _shadow_setup("sage", "mean", 2, False)
    assert res.block is None  # a CPU: the torch operators
    with caplog.at_level(logging.WARNING, logger="kernels.shadow_block"):
        assert shadow_block.create(res) is None
    assert "the one-launch kernel is not used (it needs a CUDA device)" in caplog.text
    with pytest.raises(RuntimeError, match=r"one-launch shaDow kernel \(--fused-shadow\) cannot run here: it needs "
                                           "a CUDA device"):
        _shadow_setup("sage", "mean", 2, False, fused=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernel_compiles_with_nvcc(tmp_path):
    report = compile_cubin(tmp_path, shadow_block.KERNEL_SOURCE, shadow_block.KERNEL_NAME)
    assert "warning" not in report.lower(), report
    regs = re.findall(r"Used (\d+) registers", report)
    assert regs and int(regs[0]) <= 64, report  # __launch_bounds__(256, 4): 4 blocks per SM


# ----------------------------------------------------------------------------- host emulation
@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Path:
    return build_host_harness(tmp_path_factory, HARNESS, {"SHADOW_BLOCK_SOURCE": shadow_block.KERNEL_SOURCE},
                              "shadow_block_host")


@pytest.fixture(scope="session")
def harness_asan(tmp_path_factory) -> Path:
    """The harness under AddressSanitizer and UBSan, its shared memory and inputs allocated to their exact
    sizes (HARNESS_EXACT): reads past an end are caught too."""
    return build_host_harness(tmp_path_factory, HARNESS, {"SHADOW_BLOCK_SOURCE": shadow_block.KERNEL_SOURCE},
                              "shadow_block_asan", ASAN_FLAGS)


HARNESS_ERRORS = {3: "shared memory: the kernel's size is not the launcher's, or written past",
                  5: "threads diverge at a barrier", 8: "an answer was not written"}


def emulate(exe: Path, workdir: Path, res, targets: np.ndarray, width: int, budget: int, want_emb: bool, *,
            threads: int = shadow_block.THREADS, cap: int | None = None, order: str = "forward") -> np.ndarray:
    """Run shadow_block.cu's thread code on the CPU with the arguments ShadowBlock.answer launches with
    (``res``'s tensors, kernels.shadow_block.scalars; optionally fewer threads, another capacity, or the
    threads run in another ``order`` between barriers) and return the packed answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    t = shadow_block.model_tensors(res.model, torch.device("cpu"))
    arrays = {"ids": np.asarray(targets, np.int64), "lptr": res.lptr, "lnodes": res.lnodes, "eptr": res.eptr,
              "src": res.src, "dst": res.dst, "p": res._p, **t}
    if res.weights is not None:
        arrays["ew"] = res.weights
    for name, a in arrays.items():
        np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a).tofile(workdir / f"{name}.bin")
    b = len(targets)
    sc = list(shadow_block.scalars(res, b, width, budget, want_emb))
    if cap is not None:
        sc[10] = cap
    emb = shadow_block.embedding_dim(res)
    shared = shadow_block.shared_bytes(budget, res.hidden, res.num_classes, emb, sc[10], sc[12])
    floats = shadow_block.packed_floats(b, res.num_classes, emb, want_emb)
    args = [exe, workdir, *sc, int(res.weights is not None), threads, shared, floats]
    return run_harness(args, workdir, HARNESS_ERRORS, order)


def _spec(res, targets: np.ndarray, width: int, budget: int, want_emb: bool):
    with torch.inference_mode():
        return res.download(res.forward(res.upload_ids(targets), width, budget, want_emb), len(targets), want_emb)


def assert_same(got, want, msg=""):
    probs, labels, kept, total, emb = got
    w_probs, w_labels, w_kept, w_total, w_emb = want
    np.testing.assert_allclose(probs, w_probs, rtol=1e-4, atol=1e-6, equal_nan=True, err_msg=msg)
    top2 = np.sort(np.nan_to_num(w_probs, nan=2.0), axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-5
    assert np.array_equal(labels[clear], w_labels[clear]), msg  # ties within rounding may resolve either way
    assert np.array_equal(kept, w_kept) and np.array_equal(total, w_total), msg
    if w_emb is None:
        assert emb is None
    else:
        np.testing.assert_allclose(emb, w_emb, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=msg)


@pytest.mark.parametrize(("backbone", "pool", "layers"), [("gcn", "mean", 2), ("sage", "max", 3), ("gcn", "mean+max", 1),
                                                          ("sage", "none", 2), ("gcn", "max", 3),
                                                          ("sage", "mean+max", 1)])
@pytest.mark.parametrize("weighted", [False, True])
def test_host_emulation_equals_the_torch_operators(harness, tmp_path, backbone, pool, layers, weighted):
    _, _, _, _, res = _shadow_setup(backbone, pool, layers, weighted)
    t = np.unique(np.random.default_rng(5).choice(res.num_nodes, 40, replace=False))
    sampled_rows = 0
    for width in (0, 1, 3):
        for budget in (24, 10):
            assert res.takes(t, budget)
            want = _spec(res, t, width, budget, True)
            got = res.unpack_host(emulate(harness, tmp_path, res, t, width, budget, True), len(t), True)
            assert_same(got, want, f"S={width} K={budget}")
            sampled_rows += int((want[2] < want[3]).sum()) if width else 0
    assert sampled_rows > 0  # some rows were longer than the width: fastrand positions were taken


@pytest.mark.parametrize("strategy", ["fastrand", "bucket"])
@pytest.mark.parametrize(("hidden", "classes", "threads"), [(37, 7, 256), (5, 2, 7), (64, 33, 32)])
def test_host_emulation_shapes_threads_and_strategies(harness, tmp_path, strategy, hidden, classes, threads):
    """Hidden and class counts that are not multiples of 32, fewer threads than rows (7 threads for 24),
    both sampling strategies, without embeddings, a batch with a target twice."""
    for backbone in ("gcn", "sage"):
        _, _, _, _, res = _shadow_setup(backbone, "mean+max", 2, True, hidden=hidden, classes=classes,
                                        strategy=strategy, seed=3)
        t = np.array([4, 90, 4, 599, 311])
        for width in (0, 2):
            want = _spec(res, t, width, 24, False)
            got = res.unpack_host(emulate(harness, tmp_path, res, t, width, 24, False, threads=threads), len(t), False)
            assert_same(got, want, f"{backbone} S={width}")


def test_host_emulation_graphsage_in_passes_of_a_few_rows(harness, tmp_path, monkeypatch):
    """Where all of a block's rows do not fit the shared memory, GraphSAGE transforms 8 rows per pass (here
    forced by a small limit): 24 rows are 3 passes, 10 rows a pass of 8 and one of 2 (a partial row tile)."""
    monkeypatch.setattr(shadow_block, "SHARED_LIMIT", 1024)
    _, _, _, _, res = _shadow_setup("sage", "mean+max", 3, True, hidden=5, classes=4, seed=9)
    t = np.arange(0, 600, 37)
    for budget in (24, 10):
        assert shadow_block.scalars(res, len(t), 2, budget, True)[12] == shadow_block.SCRATCH_ROWS
        for width in (0, 2):
            want = _spec(res, t, width, budget, True)
            got = res.unpack_host(emulate(harness, tmp_path, res, t, width, budget, True), len(t), True)
            assert_same(got, want, f"S={width} K={budget}")


def test_host_emulation_nan_rows_answer_like_torch(harness, tmp_path):
    """A NaN projection row: its subgraphs' answers are NaN and their labels torch's (0, its arg-max of a
    NaN row), the other targets' are unchanged."""
    _, _, _, p, res = _shadow_setup("gcn", "mean+max", 2, False)
    p[7] = float("nan")
    t = np.r_[7, np.arange(0, 60, 3)]  # 7's own subgraph has the NaN row
    want = _spec(res, t, 0, 24, True)
    assert np.isnan(want[0]).any() and not np.isnan(want[0]).all()
    got = res.unpack_host(emulate(harness, tmp_path, res, t, 0, 24, True), len(t), True)
    assert_same(got, want)
    nan_rows = np.isnan(want[0]).any(1)
    assert np.array_equal(got[1][nan_rows], want[1][nan_rows])


def test_host_emulation_nan_rows_follow_the_model(harness, tmp_path):
    """Non-finite features: a NaN projection row reaches a target through the subgraph's kept edges only, as
    in the model itself (forward_batch_projected on the index's induced batch), and the kernel answers as the
    model does. The torch operators' dense blocks also multiply it by zero entries (0 x NaN = NaN), so they
    give NaN for more targets: a documented difference on non-finite input. Rows past a subgraph's end are
    zeros on both paths (node 0's NaN row reaches no list that lacks it)."""
    g, index, model, p, res = _shadow_setup("gcn", "none", 1, False)
    p[0] = float("nan")
    t = np.arange(0, 600, 3)
    batch = index.induced_batch(g, t, 24)
    with torch.no_grad():
        logits, _ = model.forward_batch_projected(batch, p[torch.from_numpy(batch.node_ids)], None, "fastrand")
    want = torch.softmax(logits, 1).numpy()
    got = res.unpack_host(emulate(harness, tmp_path, res, t, 0, 24, False), len(t), False)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-6, equal_nan=True)
    model_nan = np.isnan(want).any(1)
    assert model_nan.any() and not model_nan.all()
    spec_nan = np.isnan(_spec(res, t, 0, 24, False)[0]).any(1)
    assert (spec_nan >= model_nan).all() and (spec_nan > model_nan).any()
    short = np.diff(np.asarray(index.ptr))[t] == 1  # a list of the target alone: no padded row reaches it
    assert not spec_nan[short & (t != 0)].any()


@pytest.mark.parametrize("order", ["reverse", "shuffle"])
def test_host_emulation_does_not_depend_on_the_threads_order(harness, tmp_path, monkeypatch, order):
    """The threads of a block run in reverse or shuffled order between barriers: the answers are the same
    bits as in index order. A phase that read what another thread of the same phase writes would differ."""
    for backbone, pool, layers, small in [("gcn", "mean+max", 3, False), ("sage", "max", 2, True)]:
        if small:  # GraphSAGE's transform in passes of a few rows
            monkeypatch.setattr(shadow_block, "SHARED_LIMIT", 1024)
        _, _, _, _, res = _shadow_setup(backbone, pool, layers, True, hidden=13, classes=5, seed=4)
        t = np.arange(0, 600, 41)
        for width in (0, 2):
            base = emulate(harness, tmp_path, res, t, width, 24, True, threads=64)
            other = emulate(harness, tmp_path, res, t, width, 24, True, threads=64, order=order)
            assert np.array_equal(base.view(np.uint32), other.view(np.uint32)), (backbone, width)


def test_host_emulation_under_address_sanitizer(harness_asan, tmp_path, monkeypatch):
    """AddressSanitizer and UBSan over the thread code, with the shared memory and every input array exactly
    as large as the launch's: no read or write past an end, no undefined behaviour, and the answers of the
    specification."""
    for backbone, pool, layers, small in [("gcn", "mean", 2, False), ("sage", "mean+max", 3, False),
                                          ("sage", "none", 2, True)]:
        if small:
            monkeypatch.setattr(shadow_block, "SHARED_LIMIT", 1024)
        _, _, _, _, res = _shadow_setup(backbone, pool, layers, True, hidden=11, classes=3, seed=6)
        t = np.array([0, 77, 599, 77, 310])
        for width, budget in ((0, 24), (3, 10)):
            want = _spec(res, t, width, budget, True)
            got = res.unpack_host(emulate(harness_asan, tmp_path, res, t, width, budget, True, threads=32),
                                  len(t), True)
            assert_same(got, want, f"{backbone} S={width} K={budget}")


def test_a_capacity_too_small_is_refused_not_overrun(harness, tmp_path):
    """The capacity is a bound the host computes; a launch given less refuses the targets that need more
    (label -1, which ShadowBlock.answer raises on) and writes nothing past it (the harness's guard)."""
    _, _, _, _, res = _shadow_setup("gcn", "mean", 2, False)
    t = np.arange(5)
    flat = emulate(harness, tmp_path, res, t, 0, 24, True, cap=3)
    labels = flat[len(t) * res.num_classes: len(t) * res.num_classes + len(t)]
    assert (labels == -1).all()
    with pytest.raises(RuntimeError, match="exceeded the launch's capacity"):
        shadow_block.check_labels(flat, len(t), res.num_classes)


class EmulatedBlock:
    """The kernel's thread code on the CPU as a ResidentShadow's block: ResidentShadow.answer's one-launch
    branch end to end, through the host emulation."""

    def __init__(self, exe: Path, workdir: Path, res) -> None:
        self.exe, self.workdir, self.r = exe, workdir, res
        self.launches = 0

    def fits(self, width: int, budget: int) -> bool:
        return True

    def nbytes(self) -> int:
        return 0

    def answer(self, targets, width, budget, want_emb):
        self.launches += 1
        flat = emulate(self.exe, self.workdir, self.r, targets, width, budget, want_emb)
        shadow_block.check_labels(flat, len(targets), self.r.num_classes)
        return flat


class _FailingBlock(EmulatedBlock):
    def answer(self, *_a):
        raise RuntimeError("cuLaunchKernel failed (injected)")


class _Perturbed(EmulatedBlock):
    """The emulated kernel with one part of its packed answers changed."""

    def __init__(self, exe, workdir, res, part: str) -> None:
        super().__init__(exe, workdir, res)
        self.part = part

    def answer(self, targets, width, budget, want_emb):
        flat = super().answer(targets, width, budget, want_emb).copy()
        b, c = len(targets), self.r.num_classes
        # the edge count's high word (its float64's exponent): a change there changes the count
        at = {"probabilities": 0, "labels": b * c, "edge counts": b * c + b + 1, "readouts": len(flat) - 1}[self.part]
        if self.part == "labels":  # a clear label replaced by another class
            flat[at: at + b] = (flat[at: at + b] + 1) % c
        else:
            flat[at] += 0.5
        return flat


def test_the_creation_check_compares_every_answer(harness, tmp_path, caplog):
    """kernels.shadow_block's check when the kernel is created (here with the emulated kernel): it agrees,
    and a change in any part of the answers is named; a kernel that fits no width is said to be unchecked."""
    _, _, _, _, res = _shadow_setup("sage", "mean+max", 2, True, classes=4)
    assert shadow_block._agrees(EmulatedBlock(harness, tmp_path, res), res) is None
    for part in ("probabilities", "labels", "edge counts", "readouts"):
        why = shadow_block._agrees(_Perturbed(harness, tmp_path, res, part), res)
        assert why is not None and f"its {part} differ" in why, (part, why)

    class _Unfit(EmulatedBlock):
        def fits(self, width, budget):
            return False

    with caplog.at_level(logging.WARNING, logger="kernels.shadow_block"):
        assert shadow_block._agrees(_Unfit(harness, tmp_path, res), res) is None
    assert "not checked at creation (no width fits" in caplog.text


def test_the_server_answers_through_the_block(harness, tmp_path, tiny_repo, caplog, monkeypatch):
    """A real server (CPU, the shaDow model resident): with the emulated kernel as its block, the
    shadow-resident path's answers are the torch operators'; a failing launch is answered by them, which
    serve from then on, and the GPU threshold goes back to theirs; a failure that lost the device's context
    switches the resident path off and the batch takes the next one."""
    from kernels import resident as resident_mod
    from serve.paths import _small_on_gpu
    from serve.runtime import GPU_MIN_TARGETS_AUTO, GPU_MIN_TARGETS_EXACT_AUTO

    real_device_lost = resident_mod.device_lost

    from .serving import ServerThread

    with ServerThread(tiny_repo, {"runtime_kw": {"device": "cpu", "resident": True,
                                                 "serving_path": "shadow-resident"}}) as srv:
        rt = srv.server.registry.get("shadow")
        res = rt._resident_shadow
        nodes = np.arange(0, 200, 9)
        want = [_process(rt, nodes, w) for w in (0, 4)]
        res.block = EmulatedBlock(harness, tmp_path, res)
        assert rt._fused_head
        # the thresholds a GPU runtime derives from them (no launch here): the kernel from 2 targets, from 1 at
        # the exact width, unless its block would not fit the exact width at the table's largest budget
        monkeypatch.setattr(rt, "device", torch.device("cuda", 0))
        rt._set_thresholds()
        assert (rt.gpu_min_targets, rt.gpu_min_targets_exact) == (
            GPU_MIN_TARGETS_AUTO["shadow-fused"], GPU_MIN_TARGETS_EXACT_AUTO["shadow-fused"]) == (2, 1)
        assert _small_on_gpu(rt, 1, 4) and not _small_on_gpu(rt, 1, 0) and not _small_on_gpu(rt, 2, 4)
        fits = res.block.fits
        monkeypatch.setattr(res.block, "fits", lambda width, budget: width != 0 or budget < res.k)
        rt._set_thresholds()
        assert rt.gpu_min_targets_exact == rt.gpu_min_targets == 2 and _small_on_gpu(rt, 1, 0)
        monkeypatch.setattr(res.block, "fits", fits)
        rt.options.gpu_min_targets = 4  # an explicit threshold is the one threshold at every width
        rt._set_thresholds()
        assert rt.gpu_min_targets_exact == rt.gpu_min_targets == 4 and _small_on_gpu(rt, 3, 0)
        rt.options.gpu_min_targets = None
        monkeypatch.setattr(rt, "device", torch.device("cpu"))
        rt._set_thresholds()
        assert rt.gpu_min_targets == rt.gpu_min_targets_exact == float("inf")
        got = [_process(rt, nodes, w) for w in (0, 4)]
        assert res.block is not None and res.block.launches == 2
        for g, w in zip(got, want, strict=True):
            assert g.path == w.path == "shadow-resident"
            np.testing.assert_allclose(g.probabilities, w.probabilities, rtol=1e-4, atol=1e-6)
            assert (g.edges_kept, g.edges_total) == (w.edges_kept, w.edges_total)
        res.block = _FailingBlock(harness, tmp_path, res)
        with caplog.at_level(logging.WARNING):
            again = _process(rt, nodes, 4)
        assert again.path == "shadow-resident" and res.block is None and not rt._fused_head
        assert "the one-launch kernel failed a batch" in caplog.text
        assert "the fused kernel is off after a failure" in caplog.text
        np.testing.assert_allclose(again.probabilities, want[1].probabilities, rtol=1e-6)
        assert rt.gpu_min_targets == float("inf")  # a CPU runtime has no GPU threshold
        monkeypatch.setattr(rt, "device", torch.device("cuda", 0))  # what a GPU runtime derives (no launch here)
        rt.fused_head_lost()
        assert rt.gpu_min_targets == GPU_MIN_TARGETS_AUTO["shadow-resident"] == 32  # no CUDA graphs were captured
        monkeypatch.setattr(rt, "device", torch.device("cpu"))
        # a kernel fault that left the device's context unusable: the torch operators there cannot answer
        # either, so the error goes up, the resident path is switched off and the batch takes the next path
        res.block = _FailingBlock(harness, tmp_path, res)
        monkeypatch.setattr(resident_mod, "device_lost", lambda exc: True)
        lost = _process(rt, nodes, 4)
        assert lost.path != "shadow-resident" and "shadow-resident" in rt.switched_off and res.block is None
        np.testing.assert_allclose(lost.probabilities, want[1].probabilities, rtol=1e-4, atol=1e-6)
        # on a GPU runtime, a sticky CUDA error met on any path keeps every later batch it can off the device
        monkeypatch.setattr(resident_mod, "device_lost", real_device_lost)
        monkeypatch.setattr(rt, "device", torch.device("cuda", 0))

        class _Faulting:
            name = "subgraph-torch"

            def run(self, *_a):
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

        with pytest.raises(RuntimeError, match="illegal memory access"):
            rt._run_path(_Faulting(), nodes, [], 4, 24, False)
        assert rt.lost_device and rt.gpu_min_targets == rt.fused_max_targets == float("inf")
        # and the server's health says NOT_SERVING (an orchestrator restarts it), from this worker thread
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(srv.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            t_end = time.monotonic() + 30
            while stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
                    health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < t_end, "still SERVING after the device was lost"
                time.sleep(0.01)
        assert f"model shadow v{rt.version} lost cuda:0" in srv.server.registry.lost_devices()
        rt.fused_head_lost()  # a later threshold update keeps it so
        assert rt.gpu_min_targets == rt.fused_max_targets == float("inf")


# ----------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize(("backbone", "pool", "layers"), [("gcn", "mean", 2), ("sage", "mean+max", 3), ("gcn", "max", 1),
                                                          ("sage", "none", 2)])
@pytest.mark.parametrize(("hidden", "classes", "topk"), [(8, 3, 24), (37, 7, 24), (256, 47, 64)])
@pytest.mark.parametrize("weighted", [False, True])
def test_kernel_equals_the_torch_operators(backbone, pool, layers, hidden, classes, topk, weighted):
    """The launch (created, so checked at creation too) against ResidentShadow.forward + pack on the same
    device state: every width kind, budgets below k, batches of 1 to all nodes; 256 hidden features at a
    budget of 64 take shared memory beyond 48 KiB (opted in)."""
    skip_without_cuda()
    _, _, _, _, res = _shadow_setup(backbone, pool, layers, weighted, device="cuda", hidden=hidden, classes=classes,
                                    topk=topk, fused=True)
    block = res.block
    assert block is not None
    if hidden == 256:
        assert shadow_block.block_bytes(res, 0, topk) > shadow_block.SHARED_LIMIT and block.fits(0, topk)
    rng = np.random.default_rng(hidden)
    for b in (1, 7, 600):
        t = np.sort(rng.choice(res.num_nodes, b, replace=False))
        for width in (0, 1, 4):
            for budget in (topk, 10):
                for want_emb in (False, True):
                    want = _spec(res, t, width, budget, want_emb)
                    got = res.unpack_host(block.answer(t, width, budget, want_emb), b, want_emb)
                    assert_same(got, want, f"B={b} S={width} K={budget}")
    assert block.launches > 0


@pytest.mark.gpu
def test_answer_takes_the_block_and_the_torch_operators_beyond_its_shared_memory():
    skip_without_cuda()
    _, _, _, _, res = _shadow_setup("gcn", "mean", 2, False, device="cuda", fused=True)
    t = np.arange(0, 600, 11)
    before = res.block.launches
    want = _spec(res, t, 3, 24, True)
    assert_same(res.answer(t, 3, 24, True), want)
    assert res.block.launches == before + 1
    res.block.limit = 1024  # as if the device had little shared memory: the torch operators answer
    assert not res.block.fits(3, 24)
    assert_same(res.answer(t, 3, 24, True), want)
    assert res.block.launches == before + 1


@pytest.mark.gpu
def test_one_exact_width_target_takes_the_kernel_on_the_gpu(tiny_repo):
    """On its default thresholds a GPU server answers one shaDow target at the exact width with the one-launch
    kernel (GPU_MIN_TARGETS_EXACT_AUTO), one at a sampled width on the compiled CPU path, two with the kernel;
    the answers agree with the compiled CPU path's."""
    skip_without_cuda()
    from .serving import ServerThread

    with ServerThread(tiny_repo, {"runtime_kw": {"device": "cuda"}}) as srv:
        rt = srv.server.registry.get("shadow")
        assert rt._fused_head and rt.gpu_min_targets_exact == 1 < rt.gpu_min_targets == 2
        one_exact, one_sampled, two = (_process(rt, [5], 0), _process(rt, [5], 4), _process(rt, [5, 9], 4))
        assert (one_exact.path, one_sampled.path, two.path) == ("shadow-resident", "shadow-compiled",
                                                                "shadow-resident")
        on_cpu = _process(rt, [5], 0, path=next(p for p in rt.paths if p.name == "shadow-compiled"))
        assert on_cpu.path == "shadow-compiled"
        np.testing.assert_allclose(one_exact.probabilities, on_cpu.probabilities, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_fused_shadow_serves_shadow_models_on_the_gpu(tiny_repo):
    """A shaDow model on --device cuda with fused_shadow (asked for, and on its default: DEFAULT_ON): the whole
    batch in one kernel (CUDA graphs kept for what it leaves to the torch operators), its answers those of the
    same server without it."""
    skip_without_cuda()
    from .serving import ServerThread

    assert shadow_block.DEFAULT_ON
    answers = {}
    for fused in (True, None, False):
        with ServerThread(
            tiny_repo, {"runtime_kw": {"device": "cuda", "fused_shadow": fused, "gpu_min_targets": 0}}
        ) as srv:
            rt = srv.server.registry.get("shadow")
            on = fused is not False
            assert (rt._resident_shadow.block is not None) is on and rt._fused_head is on
            assert rt._captured is not None  # CUDA graphs serve what the kernel leaves to the torch operators
            answers[fused] = [_process(rt, np.arange(0, 300, 13), w) for w in (0, 4)]
    for fused in (True, None):
        for a, b in zip(answers[fused], answers[False], strict=True):
            assert a.path == b.path == "shadow-resident"
            np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-4, atol=1e-6)
            assert (a.edges_kept, a.edges_total) == (b.edges_kept, b.edges_total)
