"""A new node through the server equals the same node made part of the graph (issue 6).

The server is asked about a node it has never seen (features + edges to existing nodes). The
reference adds that node to the graph for real (a new CSR with N + 1 nodes, both edge
directions), recomputes its PPR top-K list from scratch on that graph (the "rebuilt index") or
takes the full-graph forward (plain GCN), and runs the same checkpoint offline. The stored graph
of the server is not changed by the request (checked afterwards).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from clients import GnnClient
from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, ppr_topk
from kernels.subgraph import induced_batch
from models.checkpoint import load_checkpoint


def _graph_plus(ds, nbrs: np.ndarray) -> CSRGraph:
    n = ds.graph.num_nodes
    a = ds.graph.to_scipy()
    col = sp.csr_matrix((np.ones(len(nbrs), np.float32), (nbrs, np.zeros(len(nbrs), np.int64))), shape=(n, 1))
    big = sp.bmat([[a, col], [col.T, None]], format="csr")
    big.sort_indices()
    return CSRGraph.from_scipy(big, weighted=False)


def test_new_node_equals_the_node_added_to_the_graph(served, tiny_repo, tiny_dataset):
    ds = tiny_dataset
    n = ds.num_nodes
    rng = np.random.default_rng(5)
    nbrs = np.sort(rng.choice(n, size=7, replace=False)).astype(np.int64)
    feats = (ds.x[nbrs].mean(axis=0) + rng.normal(0, 0.1, ds.num_features)).astype(np.float32)
    g2 = _graph_plus(ds, nbrs)
    x2 = torch.from_numpy(np.vstack([ds.x, feats[None, :]]).astype(np.float32))

    with GnnClient(served.address, timeout=120) as client:
        got_shadow = client.predict_new_node("shadow", feats, nbrs, sampling_width=0, ppr_budget=32)
        got_gcn = client.predict_new_node("gcn", feats, nbrs, sampling_width=0)
        sampled = {w: client.predict_new_node("gcn", feats, nbrs, sampling_width=w) for w in (1, 2, 3)}
        after = client.get_model("shadow")
    assert after.num_nodes == n  # the stored graph did not grow

    # shaDow: top-32 PPR list of node n computed on the graph that contains it
    ck = load_checkpoint(tiny_repo / "shadow" / "1")
    cfg = PPRConfig(**ck.ppr_config)
    ptr, lists = ppr_topk(g2, np.array([n]), cfg, k=32)[:2]
    batch = induced_batch(g2, np.asarray(ptr, np.int64), np.asarray(lists, np.int64))
    with torch.no_grad():
        logits, _ = ck.model.eval().forward_batch(batch, x2[torch.from_numpy(batch.node_ids)], None, ck.strategy)
    ref = torch.softmax(logits, 1).numpy()[0]
    np.testing.assert_allclose(got_shadow.probabilities[0], ref, rtol=1e-4, atol=1e-5)
    assert got_shadow.labels[0] == ref.argmax()

    # plain GCN: the full-graph forward on the grown graph, at the new node
    gk = load_checkpoint(tiny_repo / "gcn" / "1")
    with torch.no_grad():
        full = torch.softmax(gk.model.eval()(g2, x2), 1).numpy()[n]
    np.testing.assert_allclose(got_gcn.probabilities[0], full, rtol=1e-4, atol=1e-5)
    # and at sampled widths: the new node's subgraph rows in the graph's order sample what the grown graph's
    # forward samples (they once took breadth-first order and differed by up to 0.8)
    for w, got in sampled.items():
        with torch.no_grad():
            want = torch.softmax(gk.model.eval()(g2, x2, w, gk.strategy), 1).numpy()[n]
        np.testing.assert_allclose(got.probabilities[0], want, rtol=1e-4, atol=1e-5, err_msg=f"S={w}")


def test_new_nodes_benchmark_runs_both_push_variants(tiny_repo):
    """benchmarks/new_nodes.py at a small size: a plain model's served path and its torch path, a shaDow model's two
    push variants and its torch path per count (their answers are checked inside: equal, to rounding for the torch path), positive
    times."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "new_nodes.py"), "--repo", str(tiny_repo),
                           "--models", "gcn,shadow", "--counts", "1,3", "--reps", "2"],
                          capture_output=True, text=True, timeout=600, cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
            if line.startswith(("| gcn", "| shadow"))]
    assert {(r[0], int(r[1]), r[2]) for r in rows} == {
        *(("gcn", k, v) for k in (1, 3) for v in ("-", "torch path")),
        *(("shadow", k, v) for k in (1, 3) for v in ("1-thread", "parallel", "torch path"))}
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), rows
    bad = subprocess.run([sys.executable, str(root / "benchmarks" / "new_nodes.py"), "--repo", str(tiny_repo),
                          "--models", "gcn", "--counts", "0"], capture_output=True, text=True, timeout=120, cwd=root,
                         env=dict(os.environ, PYTHONPATH=str(root)))
    assert bad.returncode == 2 and "--counts" in bad.stderr
