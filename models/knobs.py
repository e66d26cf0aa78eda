"""The knob table of a training run: accuracy, latency and kept edges per (PPR budget K, sampling
width S) on bounded samples of the validation nodes (:func:`measure_knobs`), and the default knobs
chosen from it (:func:`choose_defaults`, the rule of :mod:`clients.knob_rules`).

The latency measured here is that of a torch copy of the serving path (subgraph extraction ->
induced batch or execution plan -> gather cached projections -> forward), in batches of
``knob_batch_size`` targets: what ``python -m models.train`` writes. ``gnnserve train`` replaces that
column by the served cost of a single-node request on the path the server runs
(:mod:`serve.knob_timing`; models never import serve).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kernels.plan import ExactPathEdges, edges_on_paths, execution_plan
from kernels.spmm import kept_edges

from .base import GNNModel
from .fit import TrainData, _batches, project_all, sample_nodes

__all__ = ["choose_defaults", "measure_knobs", "wilson_interval"]


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion ``correct / n`` (95 % at ``z = 1.96``); ``(0, 1)`` when ``n = 0``."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    z2 = z * z
    den = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)



@torch.no_grad()
def measure_knobs(model: GNNModel, data: TrainData, extractor: Any, nodes: np.ndarray, *,
                  widths: Sequence[int], budgets: Sequence[int], strategy: str, batch_size: int,
                  repeats: int = 3, latency_nodes: int = 0, accuracy_nodes: int = 0, seed: int = 0,
                  progress: bool = False, full_graph: bool = True,
                  agreement_nodes: np.ndarray | None = None) -> list[dict[str, Any]]:
    """The knob table on ``nodes``: one row per (K, S) with accuracy, latency and kept edges.

    Samples: accuracy is measured on ``accuracy_nodes`` of ``nodes`` (a seeded uniform sample, the
    same nodes for every setting, so the rows' differences are paired; 0 = all), latency on the
    first ``latency_nodes`` of that sample (0 = the whole accuracy sample). Plain models' accuracy
    comes from one full-graph pass per width when ``full_graph`` (else from plans, batch by batch) (:meth:`propagate`: the same logits as their execution
    plans, since ES-SpMM keeps the same edges of a row wherever the row is aggregated; cheaper than
    a plan per batch once the sample holds thousands of nodes). Each row stores
    ``accuracy_nodes``, ``latency_nodes`` and ``val_accuracy_ci95`` (the 95 % Wilson interval of
    its accuracy on the sample). The cost is bounded by the sample sizes, not by the graph.

    ``agreement_nodes`` (any nodes of the graph, no labels needed; None or empty: none): each row also
    stores ``agreement``, the share of them whose predicted label at that setting equals the exact
    reference's (the exact width at the largest budget), and ``agreement_nodes``, their number. A
    setting's accuracy differs from the reference's by at most ``1 - agreement`` on those nodes whatever
    their labels: the loss :mod:`clients.knob_rules` bounds (a validation set of a few hundred nodes reads
    accuracy differences to a few points only).

    Latency is the wall time of the serving path per node, over batches of ``batch_size`` targets:
    for a plain model its execution plan (:mod:`kernels.plan`), gathering the cached projections,
    GCN degrees and ``forward_plan``; for shaDow the top-K lookup, induced batch, projections and
    ``forward_batch_projected``; then argmax. After one untimed warm-up batch; the table
    keeps the fastest of ``repeats`` passes (the machine is shared: the minimum is the stable
    statistic). Projections are computed once beforehand and not timed (the server caches them per
    node). ``edges_kept_fraction`` = edges aggregated at width S / edges at exact width (shaDow: of
    the accuracy sample's subgraphs; plain models: on the latency sample's own paths, as the server
    reports).

    ``progress``: a tqdm bar over the nodes evaluated (each accuracy-sample node at every width of every
    budget, then each setting's warm-up batch and timed passes), so that it moves, with an ETA, inside a
    setting too (postfix: the setting, and K and S).
    """
    from tqdm.auto import tqdm

    model.eval()
    proj = project_all(model, data)
    acc_nodes = sample_nodes(nodes, accuracy_nodes, seed)
    lat_nodes = acc_nodes[: latency_nodes] if latency_nodes > 0 else acc_nodes
    y = data.y[torch.from_numpy(acc_nodes).to(data.y.device)].cpu().numpy()
    agree = np.zeros(0, dtype=np.int64) if agreement_nodes is None else np.asarray(agreement_nodes, dtype=np.int64)
    eval_nodes = np.concatenate([acc_nodes, agree])  # the accuracy sample, then the agreement sample
    n_acc = len(acc_nodes)
    rows = []
    graph = data.ds.graph
    plan_path = hasattr(model, "forward_plan")
    exact_edges = ExactPathEdges(graph, model.hops) if plan_path else None  # the same nodes at every setting

    def serve_batch(chunk: np.ndarray, k: int, width: int | None) -> tuple[Tensor, Any]:
        """Logits of one batch through the serving path, and a callable counting its (kept, exact) edges."""
        if plan_path:  # the server's path for plain models: an execution plan per batch
            plan = execution_plan(graph, np.unique(chunk), model.hops, width, strategy)
            p_rows = proj[torch.from_numpy(plan.node_ids).to(proj.device)]
            logits = model.forward_plan(plan, p_rows, model.norm_degrees_for(graph, plan.node_ids))[0]
            logits = logits[torch.from_numpy(np.searchsorted(plan.node_ids[: plan.num_targets], chunk))]
            return logits, lambda: tuple(int(c.sum()) for c in edges_on_paths(plan, graph, width, exact_edges))
        b = extractor.batch(chunk, k)
        p_rows = proj[torch.from_numpy(b.node_ids).to(proj.device)]
        logits = model.forward_batch_projected(b, p_rows, width, strategy, model.norm_degrees_for(graph, b.node_ids))[0]
        return logits, lambda: (kept_edges(b.graph, width), b.graph.num_edges)

    eval_index = torch.from_numpy(eval_nodes).to(proj.device)
    settings = [(int(k), int(s)) for k in budgets for s in widths]
    # the bar counts node evaluations, not settings: a large graph's first setting (its budget's accuracy pass at
    # every width, exact included) took 85 s of a 2 M-node GCN's 95 s with the bar at 0/6 and no ETA
    warm_nodes = min(batch_size, len(lat_nodes))
    work = len(budgets) * len(widths) * len(eval_nodes) + len(settings) * (warm_nodes + max(1, repeats) * len(lat_nodes))
    bar = tqdm(total=work, desc="knob table", unit="node", unit_scale=True, disable=not progress, leave=False,
               dynamic_ncols=True)

    def accuracy_pass(k: int, widths_k: list[int]) -> dict[int, tuple[np.ndarray, int, int]]:
        """Per width: (predicted labels of the accuracy then the agreement sample, kept edges, exact edges) (untimed;
        edges: shaDow, over the accuracy sample's subgraphs; plain models: none). shaDow: each batch is extracted
        once and run at every width."""
        if plan_path and full_graph:  # one full-graph pass: the same logits as the plans (tests/test_knob_table.py)
            out = {}
            for s in widths_k:
                logits = model.propagate(graph, proj, s or None, strategy)[0][eval_index]
                out[s] = (logits.argmax(1).cpu().numpy(), 0, 0)
                bar.update(len(eval_nodes))
            return out
        preds: dict[int, list[np.ndarray]] = {s: [] for s in widths_k}
        edges = {s: [0, 0] for s in widths_k}
        chunks = [(c, True) for c in _batches(acc_nodes, batch_size)] + [(c, False) for c in _batches(agree, batch_size)]
        for chunk, counted in chunks:
            if plan_path:  # plans batch by batch (no full-graph activations)
                for s in widths_k:
                    preds[s].append(serve_batch(chunk, k, s or None)[0].argmax(1).cpu().numpy())
                    bar.update(len(chunk))
                continue
            b = extractor.batch(chunk, k)
            p_rows = proj[torch.from_numpy(b.node_ids).to(proj.device)]
            nd = model.norm_degrees_for(graph, b.node_ids)
            for s in widths_k:
                logits = model.forward_batch_projected(b, p_rows, s or None, strategy, nd)[0]
                preds[s].append(logits.argmax(1).cpu().numpy())
                if counted:
                    edges[s][0] += kept_edges(b.graph, s or None)
                    edges[s][1] += b.graph.num_edges
            bar.update(len(chunk) * len(widths_k))
        return {s: (np.concatenate(preds[s]) if preds[s] else np.zeros(0, dtype=np.int64), edges[s][0], edges[s][1])
                for s in widths_k}

    def timed_pass(k: int, width: int | None, count: bool) -> tuple[float, int, int]:
        """Serving time of the latency sample; with ``count``, its (kept, exact) edges (counted untimed)."""
        elapsed = 0.0
        kept = total = 0
        for chunk in _batches(lat_nodes, batch_size):
            t0 = time.perf_counter()
            logits, count_edges = serve_batch(chunk, k, width)
            logits.argmax(1)
            elapsed += time.perf_counter() - t0
            if count:
                k_e, t_e = count_edges()
                kept += k_e
                total += t_e
            bar.update(len(chunk))
        return elapsed, kept, total

    accuracy: dict[int, dict[int, tuple[int, int, int]]] = {}
    for i, (k, s) in enumerate(settings):
        width = s or None
        if k not in accuracy:
            bar.set_postfix({"setting": f"{i + 1}/{len(settings)}", "K": k, "accuracy at": f"{len(widths)} widths"})
            accuracy[k] = accuracy_pass(k, [int(w) for w in widths])
        bar.set_postfix({"setting": f"{i + 1}/{len(settings)}", "K": k, "S": s})  # in this order (kwargs: sorted)
        pred, kept, total = accuracy[k][s]
        correct = int((pred[:n_acc] == y).sum())
        serve_batch(lat_nodes[:batch_size], k, width)  # untimed warm-up
        bar.update(warm_nodes)
        elapsed, lat_kept, lat_total = timed_pass(k, width, plan_path)
        if plan_path:  # plain models: edges on the latency sample's paths
            kept, total = lat_kept, lat_total
        for _ in range(max(0, repeats - 1)):
            elapsed = min(elapsed, timed_pass(k, width, False)[0])
        n = len(acc_nodes)
        lo, hi = wilson_interval(correct, n)
        rows.append({
            "ppr_budget": k,
            "sampling_width": s,
            "val_accuracy": round(correct / n, 6) if n else float("nan"),
            "latency_ms_per_node": elapsed * 1000.0 / max(len(lat_nodes), 1),
            "edges_kept_fraction": kept / total if total else 1.0,
            "accuracy_nodes": n,
            "latency_nodes": len(lat_nodes),
            "val_accuracy_ci95": [round(lo, 6), round(hi, 6)],
        })
    bar.close()
    ref = accuracy.get(max(int(k) for k in budgets), {}).get(0) if len(agree) else None
    if ref is not None:  # the exact reference's labels on the agreement sample
        for row in rows:
            got = accuracy[row["ppr_budget"]][row["sampling_width"]][0][n_acc:]
            row["agreement"] = round(float(np.mean(got == ref[0][n_acc:])), 6)
            row["agreement_nodes"] = len(agree)
    return rows


def choose_defaults(rows: list[dict[str, Any]], tolerance: float) -> tuple[int, int]:
    """Default ``(K, S)`` of a knob table (rows as stored in knobs.json):
    :func:`clients.knob_rules.default_knobs`, the rule the SDK and the server share."""
    from clients.knob_rules import default_knobs, rows_of

    return default_knobs(rows_of(rows), tolerance)
