"""One specification for every serving path (serve.paths).

Every path a runtime has runs the same random batches (exact and sampled widths, repeated ids, one
and many targets) through the public ``ModelRuntime.process(items, path=...)``; each must give the
torch path's labels, probabilities, embeddings and edge counts, and the torch path must give the
offline model's probabilities (``tests/reliability_support.reference``: no server code). Models:
GCN, GraphSAGE, shaDow-GCN and shaDow-SAGE on a synthetic graph, GCN and shaDow-SAGE on Cora
(skipped where the shared data is absent). The served variants (inline and worker thread, a forced
path through ``RuntimeOptions.serving_path``) answer the same over gRPC.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg

from .conftest import dataset_path
from .reliability_support import reference
from .serving import ServerThread, make_repo

KINDS = {"gcn": "gcn", "sage": "sage", "sgcn": "shadow-gcn", "ssage": "shadow-sage"}
TORCH = {"lhop": "plain-torch", "ppr": "subgraph-torch"}


@pytest.fixture(scope="module")
def four_repo(tmp_path_factory, small_dataset):
    return make_repo(tmp_path_factory.mktemp("paths"), small_dataset, KINDS, epochs=20, patience=20)


@pytest.fixture(scope="module")
def cora():
    from kernels.datasets import load_dataset

    return load_dataset(str(dataset_path("cora")))


@pytest.fixture(scope="module")
def cora_repo(tmp_path_factory, cora):
    return make_repo(tmp_path_factory.mktemp("cora-paths"), cora, {"gcn": "gcn", "ssage": "shadow-sage"},
                     epochs=15, patience=15, knob_widths=[0, 4])


def _run(rt, path, nodes, width, budget):
    from serve.batcher import WorkItem
    from serve.runtime import _WarmupFuture
    from serve.validation import PredictCall

    call = PredictCall("spec", np.asarray(nodes, dtype=np.int64), [], width, budget, "request", 0.0, True, True)
    res = rt.process([WorkItem(call, len(nodes), None, None, time.monotonic(), _WarmupFuture())], path=path)[0]
    assert not isinstance(res, BaseException), res
    assert res.path == path.name
    return res


def _check_every_path(srv, repo, ds, models, rng, batches=6):
    seen: set[str] = set()
    for model in models:
        rt = srv.server.registry.get(model)
        names = [p.name for p in rt.paths]
        torch_path = next(p for p in rt.paths if p.name == TORCH[rt.extractor])
        for _ in range(batches):
            n = int(rng.choice([1, 3, 17]))
            nodes = rng.integers(0, ds.num_nodes, n).tolist()
            if n > 1:
                nodes.append(nodes[0])  # a repeated id: one row, copied
            width = int(rng.choice([0, 2, 5]))
            budget = rt.limits.default_ppr_budget
            want = _run(rt, torch_path, nodes, width, budget)
            ref = reference(repo, ds, model, width, budget, nodes)
            np.testing.assert_allclose(want.probabilities, ref, rtol=1e-4, atol=1e-5)
            for path in rt.paths:
                if path is torch_path or not (path.accepts(len(set(nodes)), False, width)
                                              and path.takes(np.unique(nodes), budget)):
                    continue
                got = _run(rt, path, nodes, width, budget)
                seen.add(path.name)
                assert np.array_equal(got.labels, want.labels), (model, path.name, nodes, width)
                np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(got.embeddings, want.embeddings, rtol=1e-4, atol=1e-5)
                assert (got.edges_kept, got.edges_total) == (want.edges_kept, want.edges_total), (model, path.name)
        seen.add(torch_path.name)
        assert names[-1] == "subgraph-torch", names  # every runtime can answer new nodes
    return seen


def test_every_path_meets_the_specification(four_repo, small_dataset):
    rng = np.random.default_rng(0)
    seen: set[str] = set()
    for runtime_kw in ({}, {"resident": True}):  # the resident path replaces the activation cache when on
        with ServerThread(four_repo, {"poll_s": 0, "runtime_kw": runtime_kw}) as srv:
            seen |= _check_every_path(srv, four_repo, small_dataset, list(KINDS), rng)
    from serve.paths import PATH_NAMES

    assert seen == set(PATH_NAMES), f"paths never compared: {set(PATH_NAMES) - seen}"


def test_every_path_meets_the_specification_on_cora(cora_repo, cora):
    rng = np.random.default_rng(1)
    seen: set[str] = set()
    for runtime_kw in ({}, {"resident": True}):
        with ServerThread(cora_repo, {"poll_s": 0, "runtime_kw": runtime_kw}) as srv:
            seen |= _check_every_path(srv, cora_repo, cora, ["gcn", "ssage"], rng, batches=4)
    assert {"plain-resident", "shadow-resident", "plain-activations", "plain-torch", "shadow-compiled",
            "subgraph-torch"} <= seen


def test_batches_with_new_nodes_take_their_paths(four_repo):
    """New nodes take the compiled paths on a CPU runtime (plain-compiled: a plan on their L-hop scopes; shaDow's
    compiled path), held to the subgraph path, the specification, on the same batches (weighted, edgeless and
    linked new nodes, three widths); a batch's existing targets take their own path beside a plain model's new
    nodes (the new nodes are in none of their subgraphs), with the answers they get without new nodes, to the
    bit."""
    from serve.validation import NewNodeSpec

    ask = _ask

    rng = np.random.default_rng(9)
    with ServerThread(four_repo, {"poll_s": 0}) as srv:
        for model, kind in KINDS.items():
            rt = srv.server.registry.get(model)
            shadow = kind.startswith("shadow")
            spec = NewNodeSpec(np.ones(16, np.float32), np.array([1, 2, 3], np.int64), None)
            alone = ask(rt, [], [spec])
            assert alone.path == ("shadow-compiled" if shadow else "plain-compiled") and len(alone.labels) == 1
            without = ask(rt, [4, 5, 1], [])
            mixed = ask(rt, [4, 5, 1], [spec])
            assert mixed.path == ("shadow-compiled" if shadow else "plain-activations+plain-compiled"), (model, mixed.path)
            if not shadow:  # no activation table at this width: one path for both, the targets on their own plan
                forced = ask(rt, [4, 5, 1], [spec], path=next(p for p in rt.paths if p.name == "plain-compiled"))
                assert np.array_equal(forced.probabilities, mixed.probabilities), model
                _stages_cover_both_runs(rt, spec)
            assert without.path != "subgraph-torch"
            assert len(mixed.labels) == 4
            assert np.array_equal(mixed.probabilities[:3], without.probabilities), model
            assert np.array_equal(mixed.embeddings[:3], without.embeddings), model
            assert np.array_equal(mixed.probabilities[3:], alone.probabilities), model
            assert (mixed.edges_kept, mixed.edges_total) == (without.edges_kept + alone.edges_kept,
                                                               without.edges_total + alone.edges_total)
            torch_path = next(p for p in rt.paths if p.name == "subgraph-torch")
            for width in (0, 2, 5):  # new nodes linked to each other's neighbours, weighted, without edges
                specs = [_new_node(rng, [1, 2, 3]), _new_node(rng, [7, 40], [0.5, 2.0]), _new_node(rng, []),
                         _new_node(rng, [3, 599])]
                nodes = [0, 17, 3]
                got = ask(rt, nodes, specs, width=width)
                want = ask(rt, nodes, specs, path=torch_path, width=width)
                assert got.path == ("shadow-compiled" if shadow else "plain-activations+plain-compiled")
                assert np.array_equal(got.labels, want.labels), (model, width)
                np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(got.embeddings, want.embeddings, rtol=1e-4, atol=1e-5)
                if shadow:
                    assert (got.edges_kept, got.edges_total) == (want.edges_kept, want.edges_total), (model, width)
                else:  # a plain model's targets count the edges on their paths, the torch path its scopes': new nodes only
                    got, want = ask(rt, [], specs, width=width), ask(rt, [], specs, path=torch_path, width=width)
                    assert (got.edges_kept, got.edges_total) == (want.edges_kept, want.edges_total), (model, width)


class _DeviceTable:
    """Stands for a GPU runtime's device projection table: a compiled CPU path must not read it."""

    def __getattr__(self, name):
        raise AssertionError(f"the device projection table was read ({name})")


def test_a_gpu_runtimes_new_nodes_take_the_compiled_paths_on_its_cpu_copy(four_repo, monkeypatch):
    """A GPU runtime's new nodes (serve.paths: a new node counts as a target in ``fused_max_targets``, the bound
    below which the compiled CPU paths beat the device's torch path) take the compiled paths on its CPU copy of the
    model and its CPU projection table, never the device's table; beyond the bound, the torch subgraph path. Run on
    a CPU runtime dressed as a GPU one (its device, its device table, its bound): the answers are the CPU runtime's
    to the bit. tests/test_live.py runs a real GPU server's new nodes."""
    import torch

    rng = np.random.default_rng(21)
    with ServerThread(four_repo, {"poll_s": 0}) as srv:
        for model in ("gcn", "sgcn"):
            rt = srv.server.registry.get(model)
            compiled = "shadow-compiled" if model == "sgcn" else "plain-compiled"
            specs = [_new_node(rng, [1, 2, 3]), _new_node(rng, [7, 40], [0.5, 2.0]), _new_node(rng, [])]
            want = {w: (_ask(rt, [], specs, width=w), _ask(rt, [4, 5], specs, width=w)) for w in (0, 2)}
            with monkeypatch.context() as m:
                m.setattr(rt, "device", torch.device("cuda"))
                m.setattr(rt, "projections", _DeviceTable())
                m.setattr(rt, "fused_max_targets", 4)
                none = np.zeros(0, np.int64)
                assert rt._path_for(none, 4, 2, rt.limits.default_ppr_budget).name == compiled
                assert rt._path_for(none, 5, 2, rt.limits.default_ppr_budget).name == "subgraph-torch"
                for w, (alone, mixed) in want.items():
                    got = _ask(rt, [], specs, width=w)
                    assert got.path == compiled, (model, got.path)
                    assert np.array_equal(got.probabilities, alone.probabilities), (model, w)
                    assert (got.edges_kept, got.edges_total) == (alone.edges_kept, alone.edges_total)
                    got = _ask(rt, [4, 5], specs, width=w)
                    assert got.path == mixed.path and np.array_equal(got.probabilities, mixed.probabilities)


@pytest.fixture(scope="module")
def depth_repo(tmp_path_factory, small_dataset):
    """A 3-layer GCN and GraphSAGE (a new node's inner scope from its neighbours' balls, not the neighbours)."""
    return make_repo(tmp_path_factory.mktemp("depths"), small_dataset, {"gcn3": "gcn", "sage3": "sage"}, epochs=5,
                     patience=5, layers=3)


def test_a_new_nodes_last_hop_is_read_without_its_edges(four_repo, depth_repo, monkeypatch):
    """A plain model's new node aggregates only its rows within L - 1 hops (``induced_batch``'s ``inner``):
    at 2 and 3 layers and three widths the answers equal, to the bit, those of the batch whose every row
    carries its edges (as before), with fewer edges aggregated."""
    import serve.runtime as runtime_mod

    real = runtime_mod.new_node_scopes

    def every_row(*args):
        optr, nodes, _ = real(*args)
        return optr, nodes, np.diff(optr)

    rng = np.random.default_rng(12)
    for repo, models in ((four_repo, ("gcn", "sage")), (depth_repo, ("gcn3", "sage3"))):
        with ServerThread(repo, {"poll_s": 0}) as srv:
            for model in models:
                rt = srv.server.registry.get(model)
                assert rt.num_layers == (3 if model.endswith("3") else 2)
                specs = [_new_node(rng, [1, 2, 3]), _new_node(rng, [7, 40], [0.5, 2.0]), _new_node(rng, []),
                         _new_node(rng, [3, 599])]
                torch_path = next(p for p in rt.paths if p.name == "subgraph-torch")
                for width in (0, 2, 5):
                    got = _ask(rt, [], specs, path=torch_path, width=width)
                    with monkeypatch.context() as m:
                        m.setattr(runtime_mod, "new_node_scopes", every_row)
                        want = _ask(rt, [], specs, path=torch_path, width=width)
                    assert got.path == want.path == "subgraph-torch"
                    assert np.array_equal(got.probabilities, want.probabilities), (model, width)
                    assert np.array_equal(got.embeddings, want.embeddings), (model, width)
                    assert got.edges_total < want.edges_total, (model, width)
                    plan = _ask(rt, [], specs, width=width)  # the compiled plan on the same scopes
                    assert plan.path == "plain-compiled" and np.array_equal(plan.labels, got.labels), (model, width)
                    np.testing.assert_allclose(plan.probabilities, got.probabilities, rtol=1e-5, atol=1e-6)


def _stages_cover_both_runs(rt, spec):
    """One path answering a request's targets, then its new nodes (plain-compiled forced): its stage times add up
    both runs. Under a clock that moves 1 ms per reading, the stages of the mixed request sum to more than those of
    its new nodes alone (a join that took the new nodes' run for the first counted only theirs)."""
    import itertools

    path = next(p for p in rt.paths if p.name == "plain-compiled")
    tick = itertools.count()
    real = time.perf_counter
    try:
        time.perf_counter = lambda: next(tick) * 1e-3
        _ask(rt, [], [spec], path=path)  # rows projected: the next runs read the same clock
        alone = _ask(rt, [], [spec], path=path).timing
        mixed = _ask(rt, [4, 5, 1], [spec], path=path).timing
    finally:
        time.perf_counter = real
    total = {k: sum(t[s] for s in ("subgraph", "features", "forward")) for k, t in (("alone", alone), ("mixed", mixed))}
    assert min(mixed["subgraph"], mixed["features"], mixed["forward"]) >= 0, mixed
    assert total["mixed"] >= total["alone"] + 3, (alone, mixed)  # the targets' three marks at least


def _ask(rt, nodes, specs, path=None, width=2):
    from serve.batcher import WorkItem
    from serve.runtime import _WarmupFuture
    from serve.validation import PredictCall

    call = PredictCall("n", np.array(nodes, np.int64), specs, width, rt.limits.default_ppr_budget, "request",
                       0.0, True, True)
    res = rt.process([WorkItem(call, len(nodes) + len(specs), None, None, time.monotonic(), _WarmupFuture())],
                     path=path)[0]
    assert not isinstance(res, BaseException), res
    return res


def _new_node(rng, neighbors, weights=None):
    from serve.validation import NewNodeSpec

    w = None if weights is None else np.asarray(weights, np.float32)
    return NewNodeSpec(rng.normal(size=16).astype(np.float32), np.asarray(neighbors, np.int64), w)


@pytest.mark.parametrize("variant", ["inline", "worker", "forced-torch"])
def test_served_variants_answer_as_the_specification(four_repo, small_dataset, variant):
    """Over gRPC: batches on the event loop (inline), in the worker thread only, and with the torch path
    forced for every model that has it first (serving_path) give the offline model's answers."""
    runtime_kw: dict = {"inline_max_targets": 8 if variant == "inline" else 0}
    models = list(KINDS)
    if variant == "forced-torch":
        runtime_kw["serving_path"] = "subgraph-torch"
    with ServerThread(four_repo, {"poll_s": 0, "runtime_kw": runtime_kw}) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        stub = pbg.GnnServiceStub(ch)
        rng = np.random.default_rng(2)
        for model in models:
            rt = srv.server.registry.get(model)
            if variant == "forced-torch":
                assert rt.paths[0].name == "subgraph-torch"
            for _ in range(3):
                nodes = rng.integers(0, small_dataset.num_nodes, int(rng.integers(1, 5))).tolist()
                width = int(rng.choice([0, 3]))
                resp = stub.Predict(pb.PredictRequest(model=model, nodes=nodes, sampling_width=width,
                                                      return_probabilities=True), timeout=60)
                got = np.asarray(resp.probabilities, np.float32).reshape(len(nodes), -1)
                ref = reference(four_repo, small_dataset, model, width, resp.settings.ppr_budget, nodes)
                np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
        if variant == "inline":
            assert sum(srv.server.registry.get(m).batcher.batches_inline for m in models) > 0


def test_a_forced_path_must_exist_and_apply(four_repo):
    """serving_path names a path of serve.paths: an unknown name refuses every model, a path a model
    cannot take refuses that model (the reason in the registry's failures), the others serve it."""
    with ServerThread(four_repo, {"poll_s": 0, "runtime_kw": {"serving_path": "shadow-compiled"}}) as srv:
        reg = srv.server.registry
        assert reg.get("sgcn").paths[0].name == "shadow-compiled"
        assert reg.get("ssage").paths[0].name == "shadow-compiled"
        failures = reg.failures()
        assert len(failures) == 2 and all("cannot take serving path 'shadow-compiled'" in r for r in failures.values())
    from serve.runtime import RuntimeOptions

    with pytest.raises(ValueError, match="unknown serving path 'nope'; the paths are plain-resident, shadow-resident, plain-activations"):
        RuntimeOptions(serving_path="nope")


def test_answers_packed_for_one_copy_back_equal_the_separate_copies():
    """A GPU batch's probabilities, labels and embeddings come back in one packed copy (serve.paths
    answers_to_host); on CPU tensors the packing gives what the separate copies give."""
    import torch

    from serve.paths import answers_to_host

    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(37, 7, generator=gen), dim=1)
    labels = probs.argmax(dim=1)
    emb = torch.randn(37, 16, generator=gen).to(torch.bfloat16)
    for e in (emb, None):
        want = answers_to_host(probs, labels, e, pack=False)
        got = answers_to_host(probs, labels, e, pack=True)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[1].dtype == np.int64
        assert (got[2] is None) == (e is None) and (e is None or np.array_equal(got[2], want[2]))


def test_a_failing_staged_upload_falls_back_to_per_array_uploads(monkeypatch, caplog):
    """Staging a batch's graphs in one copy is an optimisation: if it raises, the batch goes on with its
    degrees as they were (each array then uploaded on its own), it is said once, and not tried again."""
    import logging

    import torch

    from kernels import spmm_cuda
    from kernels.graph import CSRGraph
    from serve import paths

    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("no pinned memory")

    monkeypatch.setattr(spmm_cuda, "available", lambda: True)
    monkeypatch.setattr(spmm_cuda, "stage_graphs", broken)
    monkeypatch.setattr(paths, "_staging_ok", True)
    g = CSRGraph(indptr=np.array([0, 1, 2]), indices=np.array([1, 0], dtype=np.int32))
    deg = np.array([2.0, 2.0])
    rt = type("Runtime", (), {"device": torch.device("cuda")})()
    with caplog.at_level(logging.ERROR, logger="serve.paths"):
        assert paths._stage(rt, [g], deg) is deg
        assert paths._stage(rt, [g], deg) is deg
    assert calls == [1] and not paths._staging_ok
    assert sum("one by one" in r.getMessage() for r in caplog.records) == 1
