"""Helpers shared by the reliability and security tests and ``benchmarks/reliability.py``.

* :func:`reference` - probabilities for every node of the tiny graph computed WITHOUT the server
  (same checkpoint, same kernels, raw features), memoised per (model, S, K): what a correct answer
  must equal.
* :func:`expected_error` - an oracle of the documented validation contract: for a
  ``PredictRequest`` (as a dict of fields) the status code and message fragment the server must
  answer with, or ``None`` when the request is valid.
* :func:`check_answer` - compares a ``PredictResponse`` with the reference, position by position
  (duplicated ids are answered per position: every occurrence gets the same row).
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg

N, F = 800, 16  # the tiny synthetic graph of tests/conftest.py
LIMIT = 4096  # RuntimeOptions.max_nodes_per_request default
KNOWN_MODELS = {"shadow", "gcn"}
PROBE = [3, 141, 592, 653, 799]  # a valid request sent after every bad one
HOT_TARGETS = [10, 20, 30]  # Redis scenario: requests whose subgraph rows sit in the hot tier

_ref_lock = threading.Lock()
_models: dict[tuple[str, str, int], Any] = {}
_rows: dict[tuple[str, str, int, int], dict[int, np.ndarray]] = {}


def _offline_model(repo: Path, ds: Any, model: str, version: int) -> tuple[Any, Any, Any]:
    key = (str(repo), model, version)
    if key not in _models:
        from models.base import full_gcn_degrees
        from models.checkpoint import load_checkpoint

        ckpt = load_checkpoint(Path(repo) / model / str(version))
        index = None
        if ckpt.extractor == "ppr":
            from kernels.ppr import PPRConfig, PPRIndex

            index = PPRIndex.open_or_build(Path(repo) / "_ppr", ds.graph, PPRConfig(**ckpt.ppr_config))
        degrees = full_gcn_degrees(ds.graph) if ckpt.arch == "gcn" else None
        _models[key] = (ckpt, index, degrees)
    return _models[key]


def reference(repo: Path, ds: Any, model: str, width: int, budget: int, nodes: Any = None,
              version: int = 1) -> np.ndarray:
    """float32 [len(nodes), C]: softmax of the offline model at (S=width, K=budget), no server involved.

    A PPR model computes every target on its own subgraph, a plain model on the full graph (its
    definition; the server computes the same rows by an execution plan), so each row is computed once and
    memoised per (model, S, K, node); ``nodes=None`` warms nothing and returns an empty array."""
    nodes = np.zeros(0, np.int64) if nodes is None else np.asarray(nodes, dtype=np.int64)
    key = (str(repo), model, int(width), int(budget))
    with _ref_lock:
        cache = _rows.setdefault(key, {})
        todo = np.unique(nodes[[int(v) not in cache for v in nodes.tolist()]]) if len(nodes) else nodes
        if len(todo):
            import torch

            from kernels.subgraph import induced_batch

            ckpt, index, degrees = _offline_model(repo, ds, model, version)
            m = ckpt.model.eval()
            g = ds.graph
            with torch.no_grad():
                if index is not None:
                    ptr, lists = index.lookup(todo, budget)
                    batch = induced_batch(g, ptr, lists)
                    norm = degrees[batch.node_ids] if degrees is not None else None
                    logits, _ = m.forward_batch(batch, torch.from_numpy(ds.x[batch.node_ids]), width or None,
                                                ckpt.strategy, norm)
                else:  # a plain model: the full-graph forward at this width is the definition
                    logits = m(g, torch.from_numpy(ds.x), width or None, ckpt.strategy)[torch.from_numpy(todo)]
            probs = torch.softmax(logits, 1).numpy().astype(np.float32)
            for v, row in zip(todo.tolist(), probs, strict=True):
                cache[v] = row
        if not len(nodes):
            return np.zeros((0, 0), np.float32)
        return np.stack([cache[int(v)] for v in nodes.tolist()])


def probs_of(resp: Any) -> np.ndarray:
    n = len(resp.labels)
    return np.asarray(resp.probabilities, dtype=np.float32).reshape(n, resp.num_classes)


def check_answer(resp: Any, nodes: list[int], repo: Path, ds: Any, model: str) -> None:
    """Assert ``resp`` answers ``nodes`` (existing ids, in order) with the reference numbers."""
    s = resp.settings
    got = probs_of(resp)[: len(nodes)]
    if not len(nodes):
        return
    ref = reference(repo, ds, model, s.sampling_width, s.ppr_budget, nodes)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert list(resp.labels)[: len(nodes)] == ref.argmax(1).tolist()


def answers_match(resp: Any, nodes: list[int], repo: Path, ds: Any, model: str) -> bool:
    try:
        check_answer(resp, nodes, repo, ds, model)
    except AssertionError:
        return False
    return True


# --------------------------------------------------------------------------- the validation oracle
def _version_found(version: str) -> bool:
    """Whether the server finds ``version`` of a model whose only version is 1: empty (the latest), or ASCII digits
    only that read 1 (serve.registry: " 1" and "٣" are not versions, though int() reads them)."""
    if version == "":
        return True
    return version.isascii() and version.isdigit() and int(version) == 1


def expected_error(req: dict[str, Any], limit: int = LIMIT, knob_tables: dict[str, Any] | None = None
                   ) -> tuple[grpc.StatusCode, str] | None:
    """(code, message fragment) the documented contract demands for ``req``; None = must succeed.

    Order of the checks (docs/RELIABILITY.md): model, version, request size, node ids, each new
    node (feature width, finite features, neighbour ids, edge weights, repeated neighbours), knobs.
    ``knob_tables``: each model's served :class:`serve.validation.ModelLimits`, for the last rule, a
    ``max_accuracy_loss`` no knob-table row at the fixed knobs meets (the rule's own cases are
    tests/test_knob_rules.py's); None: that rule is not checked.
    """
    inv = grpc.StatusCode.INVALID_ARGUMENT
    model = req.get("model", "")
    if model not in KNOWN_MODELS:
        return grpc.StatusCode.NOT_FOUND, "not found"
    if not _version_found(req.get("version", "")):
        return grpc.StatusCode.NOT_FOUND, "has no version"
    nodes = list(req.get("nodes", []))
    new = list(req.get("new_nodes", []))
    n = len(nodes) + len(new)
    if n == 0:
        return inv, "request has no nodes"
    if n > limit:
        return inv, f"more than the limit of {limit}"
    if any(not 0 <= v < N for v in nodes):
        return inv, f"node ids out of range [0, {N})"
    for i, nn in enumerate(new):
        feats = np.asarray(nn.get("features", []), dtype=np.float32)
        if feats.shape != (F,):
            return inv, f"new_nodes[{i}]: features must have {F} values"
        if not np.all(np.isfinite(feats)):
            j = int(np.flatnonzero(~np.isfinite(feats))[0])
            return inv, f"new_nodes[{i}]: features must be finite (NaN or infinity at position {j})"
        if np.any(np.abs(feats) > 1e15):
            return inv, f"new_nodes[{i}]: feature"
        nb = list(nn.get("neighbors", []))
        if any(not 0 <= v < N for v in nb):
            return inv, f"new_nodes[{i}] neighbours out of range"
        w = nn.get("edge_weights", [])
        if len(w):
            w32 = np.asarray(w, dtype=np.float32)
            if len(w32) != len(nb):
                return inv, f"new_nodes[{i}]: edge_weights has"
            bad = ~np.isfinite(w32) | (w32 < 0) | (w32 > 1e15)  # 0 is a weight, as everywhere in the server
            if bad.any():
                t = int(np.flatnonzero(bad)[0])
                rule = "must be at most 1e+15" if np.isfinite(w32[t]) and w32[t] > 1e15 else "must be finite and >= 0"
                return inv, (f"new_nodes[{i}].edge_weights[{t}]: weight {float(w32[t])} of the edge to node {nb[t]} "
                             + rule)
        if len(set(nb)) != len(nb):
            return inv, f"new_nodes[{i}]: neighbours repeat"
    s, k, loss = req.get("sampling_width"), req.get("ppr_budget"), req.get("max_accuracy_loss")
    if s is not None and s < 0:
        return inv, "sampling_width must be >= 0"
    lowest_k = 1 if model == "shadow" else 0  # a plain model has no PPR budget: 0 means none (serve.validation)
    if k is not None and k < lowest_k:
        return inv, f"ppr_budget must be >= {lowest_k}"
    if loss is not None and not (math.isfinite(loss) and 0.0 <= loss <= 1.0):
        return inv, "max_accuracy_loss must be a finite fraction in [0, 1]"
    if loss is not None and knob_tables is not None and (s is not None or k is not None):
        from serve.errors import InvalidArgument
        from serve.validation import KNOB_MAX, resolve_knobs

        if (s or 0) <= KNOB_MAX and (k or 0) <= KNOB_MAX:
            try:
                resolve_knobs(knob_tables[model], s, k, loss)
            except InvalidArgument:
                return inv, "is within max_accuracy_loss"
    return None


# --------------------------------------------------------------------------- clients
def call(stub, fields: dict, timeout: float = 60):
    """(response, None) or (None, RpcError)."""
    try:
        return stub.Predict(pb.PredictRequest(**fields, return_probabilities=True), timeout=timeout), None
    except grpc.RpcError as e:
        return None, e



def run_load(address: str, repo, ds, seconds: float, clients: int, seed: int = 0) -> dict:
    """``clients`` threads, each with its own channel, send 1-4 random nodes for ``seconds``.

    Every answer is compared with the reference; returns counts, latencies (s) and mismatches."""
    codes: Counter[str] = Counter()
    lat: list[float] = []
    answers: list[tuple[str, list[int], Any]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(i: int) -> None:
        rng = np.random.default_rng(seed + i)
        with grpc.insecure_channel(address) as ch:
            st_ = pbg.GnnServiceStub(ch)
            while time.monotonic() < stop_at:
                model = "shadow" if rng.random() < 0.6 else "gcn"
                nodes = rng.integers(0, N, int(rng.integers(1, 5))).tolist()
                kw = {"sampling_width": int(rng.choice([0, 4])), "ppr_budget": 16}
                t0 = time.perf_counter()
                resp, err = call(st_, {"model": model, "nodes": nodes, **kw})
                dt = time.perf_counter() - t0
                with lock:
                    codes["OK" if err is None else err.code().name] += 1
                    if err is None:
                        lat.append(dt)
                        answers.append((model, nodes, resp))

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    # compared after the timed window, so the reference computation does not slow the clients
    bad = [f"{m} {nodes}" for m, nodes, resp in answers if not answers_match(resp, nodes, repo, ds, m)]
    return {"codes": codes, "latencies": lat, "mismatches": bad, "seconds": seconds}


def summary(name: str, res: dict) -> str:
    lat = np.asarray(res["latencies"]) * 1e3
    total = sum(res["codes"].values())
    p50, p99 = (np.percentile(lat, 50), np.percentile(lat, 99)) if len(lat) else (float("nan"),) * 2
    return (f"{name}: {total} requests in {res['seconds']:.1f} s = {total / res['seconds']:.0f} req/s, "
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, codes {dict(res['codes'])}, wrong answers {len(res['mismatches'])}")


