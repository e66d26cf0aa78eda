"""The server with ``--device cuda`` (issue 5): the model, the projection table and the ES-SpMM kernel on the
GPU, answers held to the offline CPU model. Marked ``gpu``: skipped without a CUDA device and a working
CuPy kernel (every test here needs both)."""

from __future__ import annotations

import concurrent.futures
import re

import grpc
import numpy as np
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg
from kernels import spmm_cuda

from .serving import ServerProcess, ServerThread, skip_without_cuda_kernel
from .test_server import offline

pytestmark = pytest.mark.gpu

NODES = np.arange(0, 800, 37)


@pytest.fixture(scope="module")
def served_cuda(tiny_repo):
    skip_without_cuda_kernel()
    # every batch on the GPU's torch path (by default a GPU server is resident with CUDA graphs, and small
    # batches take the compiled CPU forward; tests/test_resident.py covers those)
    srv = ServerThread(tiny_repo, {"runtime_kw": {"device": "cuda", "gpu_min_targets": 0, "resident": False}}).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cuda_stub(served_cuda):
    with grpc.insecure_channel(served_cuda.address) as ch:
        yield pbg.GnnServiceStub(ch)


def _predict(stub, model, nodes, **kw):
    r = stub.Predict(pb.PredictRequest(model=model, nodes=list(map(int, nodes)), return_probabilities=True,
                                       return_embeddings=True, **kw))
    return r, np.asarray(r.probabilities, dtype=np.float32).reshape(len(nodes), r.num_classes)


def _assert_same_answers(labels, probs, want_labels, want_probs):
    np.testing.assert_allclose(probs, want_probs, rtol=1e-4, atol=1e-5)
    top2 = np.sort(want_probs, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4  # a near-tie may break either way in float32
    assert np.array_equal(np.asarray(labels)[clear], np.asarray(want_labels)[clear])


def test_cuda_runtime_holds_model_and_projections_on_the_gpu(served_cuda):
    for name in ("shadow", "gcn"):
        rt = served_cuda.server.registry.get(name)
        assert rt.device.type == "cuda"
        assert all(p.device.type == "cuda" for p in rt.model.parameters())
        assert rt._fused_params is None, "gpu_min_targets=0: no batch takes the compiled CPU forward"
        if rt.projections.enabled:
            rows = rt.projections.get(np.array([0, 5, 799]))
            assert rows.device.type == "cuda"


def test_triton_gpu_metrics_of_a_cuda_server(served_cuda):
    """nv_gpu_memory_*: the process's GPU, labelled by its UUID as Triton labels it, total that of torch's
    view of the device and used at least what torch's allocator holds (one GPU on the test machine)."""
    import torch
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(served_cuda.server.metrics.registry).decode()
    got = {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples
           if s.name.startswith("nv_gpu_memory")}
    total, used = got["nv_gpu_memory_total_bytes"], got["nv_gpu_memory_used_bytes"]
    assert total.labels["gpu_uuid"].startswith("GPU-") and total.labels == used.labels
    assert total.value == pytest.approx(torch.cuda.mem_get_info()[1], rel=0.01)  # NVML's figure or CUDA's
    assert torch.cuda.memory_reserved() <= used.value <= total.value


@pytest.mark.parametrize("model", ["shadow", "gcn"])
@pytest.mark.parametrize("width", [0, 4])
def test_cuda_predictions_equal_offline_cpu_model(cuda_stub, tiny_repo, tiny_dataset, model, width):
    budget = 16 if model == "shadow" else 0
    kw = {"sampling_width": width} | ({"ppr_budget": budget} if budget else {})
    r, probs = _predict(cuda_stub, model, NODES, **kw)
    labels, want = offline(tiny_repo, model, tiny_dataset, NODES, width, budget)
    _assert_same_answers(r.labels, probs, labels, want)
    assert r.settings.sampling_width == width and r.settings.ppr_budget == budget


def test_cuda_shadow_forward_runs_the_es_spmm_kernel(served_cuda, cuda_stub, monkeypatch):
    widths = []
    real = spmm_cuda._sampled_spmm_cuda  # what kernels.sampled_spmm calls, after its checks

    def spy(graph, x, width, *args, **kwargs):
        widths.append(width)
        return real(graph, x, width, *args, **kwargs)

    monkeypatch.setattr(spmm_cuda, "_sampled_spmm_cuda", spy)
    r, _ = _predict(cuda_stub, "shadow", [3, 14, 15], sampling_width=2, ppr_budget=16)
    layers = served_cuda.server.registry.get("shadow").num_layers
    assert widths == [2] * layers, "each shaDow layer aggregates through the CUDA kernel at the asked width"
    assert 0 < r.settings.edges_kept < r.settings.edges_total


def test_cuda_concurrent_requests_match_one_by_one(cuda_stub):
    rng = np.random.default_rng(5)
    reqs = [(m, rng.choice(800, size=int(rng.integers(1, 9)), replace=False)) for m in ("shadow", "gcn") * 12]
    alone = [_predict(cuda_stub, m, nodes, sampling_width=4)[1] for m, nodes in reqs]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        together = list(pool.map(lambda mr: _predict(cuda_stub, mr[0], mr[1], sampling_width=4)[1], reqs))
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("model", "kernels"), [("gcn", ("plan_forward_cpu", "plan_outer_cpu")),
                                                ("shadow", ("shadow_forward_cpu",))])
def test_small_batches_on_a_gpu_server_take_the_compiled_cpu_forward(tiny_repo, served_cuda, monkeypatch, model,
                                                                      kernels):
    """``gpu_min_targets``: smaller batches run kernels.fused_forward on a CPU copy of the model (a plain
    model's last layer through plan_outer_cpu when its activation cache serves the batch, else the whole
    forward), larger ones the GPU; both give the all-GPU server's answers."""
    import serve.paths as paths_mod  # where the serving paths call the compiled forwards

    calls_made = []
    for kernel in kernels:
        real = getattr(paths_mod, kernel)
        monkeypatch.setattr(paths_mod, kernel, lambda *a, real=real: calls_made.append(1) or real(*a))
    srv = ServerThread(tiny_repo, {"runtime_kw": {"device": "cuda", "gpu_min_targets": 16, "resident": False}}).start()
    try:
        rt = srv.server.registry.get(model)
        assert rt._fused_params is not None and rt._cpu_projections is not rt.projections
        assert rt._cpu_projections.device.type == "cpu" and rt.projections.device.type == "cuda"
        assert next(rt.model.parameters()).device.type == "cuda"
        kw = {"sampling_width": 4} | ({"ppr_budget": 16} if model == "shadow" else {})
        with grpc.insecure_channel(srv.address) as ch, grpc.insecure_channel(served_cuda.address) as ch_gpu:
            for nodes, on_cpu in ((NODES[:15], True), (NODES[:16], False), ([7], True)):
                before = len(calls_made)
                r, probs = _predict(pbg.GnnServiceStub(ch), model, nodes, **kw)
                assert len(calls_made) == before + int(on_cpu), f"{len(nodes)} targets: CPU forward {on_cpu}"
                r_gpu, p_gpu = _predict(pbg.GnnServiceStub(ch_gpu), model, nodes, **kw)
                _assert_same_answers(r.labels, probs, r_gpu.labels, p_gpu)
                assert r.settings.edges_kept == r_gpu.settings.edges_kept
    finally:
        srv.stop()


def test_serve_cli_with_device_cuda_answers_like_the_cpu_server(tiny_repo, served, served_cuda, tmp_path):
    """``gnnserve serve --device cuda`` from the command line, on its defaults (resident; the plain model's last
    layer in one kernel for every batch, the shaDow model's whole batch in one kernel from 2 targets), gives the
    CPU server's answers."""
    log = tmp_path / "cuda.log"
    with ServerProcess(tiny_repo, "--device", "cuda", "--log-level", "INFO", log_path=log) as proc:
        for model, kw in (("shadow", {"sampling_width": 4, "ppr_budget": 16}), ("gcn", {"sampling_width": 0})):
            with grpc.insecure_channel(proc.address) as ch_gpu, grpc.insecure_channel(served.address) as ch_cpu:
                r_gpu, p_gpu = _predict(pbg.GnnServiceStub(ch_gpu), model, NODES, **kw)
                r_cpu, p_cpu = _predict(pbg.GnnServiceStub(ch_cpu), model, NODES, **kw)
            _assert_same_answers(r_gpu.labels, p_gpu, r_cpu.labels, p_cpu)
            emb_gpu = np.asarray(r_gpu.embeddings, dtype=np.float32)
            np.testing.assert_allclose(emb_gpu, np.asarray(r_cpu.embeddings, dtype=np.float32), rtol=1e-3, atol=1e-4)
            assert (r_gpu.settings.edges_kept, r_gpu.settings.edges_total) == (r_cpu.settings.edges_kept,
                                                                                r_cpu.settings.edges_total)
    text = log.read_text()
    # serve.runtime.GPU_MIN_TARGETS_AUTO: plain-fused 0, shadow-fused 2 (kernels.shadow_block.DEFAULT_ON)
    assert re.search(r"model gcn v\d+ on cuda(:0)?: resident, last layer in one kernel; every batch on the GPU",
                     text), text[-3000:]
    assert re.search(r"model shadow v\d+ on cuda(:0)?: resident, whole batch in one kernel; batches under 2 targets",
                     text), text[-3000:]
