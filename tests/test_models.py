"""Model math and the serving split: dense references, L-hop exactness, projection caching, shaDow batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.datasets import synthetic_sbm
from kernels.ppr import PPRConfig, ppr_topk
from kernels.subgraph import in_global_order, induced_batch, lhop_nodes
from models import GCN, MODEL_KINDS, FeatureNorm, GraphSAGE, ShadowGNN, build_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # the test machines are shared and small: one intra-op thread is much faster than two contended ones
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def ds():
    return synthetic_sbm(400, num_classes=4, avg_degree=8, num_features=12, seed=3)


def make_model(arch: str, ds, *, layers: int | None = None, pool: str = "mean+max", seed: int = 0):
    torch.manual_seed(seed)
    norm = FeatureNorm(ds.num_features, "standard").fit(ds.x, ds.split("train"))
    cfg = {"arch": arch, "in_dim": ds.num_features, "hidden": 8, "num_classes": ds.num_classes,
           "layers": layers or (3 if arch.startswith("shadow") else 2), "dropout": 0.5}
    if arch.startswith("shadow"):
        cfg["pool"] = pool
    return build_model(cfg, norm=norm).eval()


def dense_adj(ds) -> np.ndarray:
    a = np.zeros((ds.num_nodes, ds.num_nodes))
    g = ds.graph
    a[g.row_ids(), g.indices] = g.edge_weights()
    return a


# ----------------------------------------------------------------------------- math against dense references
def test_gcn_matches_dense_formula(ds):
    m = make_model("gcn", ds)
    a = dense_adj(ds) + np.eye(ds.num_nodes)
    dinv = 1.0 / np.sqrt(a.sum(1))
    ahat = dinv[:, None] * a * dinv[None, :]
    h = m.norm(torch.from_numpy(ds.x)).double().numpy()
    for i, conv in enumerate(m.convs):
        h = ahat @ (h @ conv.weight.detach().double().numpy().T) + conv.bias.detach().double().numpy()
        if i < len(m.convs) - 1:
            h = np.maximum(h, 0)
    with torch.no_grad():
        got = m(ds.graph, torch.from_numpy(ds.x)).double().numpy()
    np.testing.assert_allclose(got, h, rtol=1e-4, atol=1e-5)


def test_sage_matches_dense_formula(ds):
    m = make_model("sage", ds)
    a = dense_adj(ds)
    deg = a.sum(1, keepdims=True)
    mean = np.divide(a, deg, out=np.zeros_like(a), where=deg > 0)
    h = m.norm(torch.from_numpy(ds.x)).double().numpy()
    for i, conv in enumerate(m.convs):
        wr = conv.weight_root.detach().double().numpy()
        wn = conv.weight_neigh.detach().double().numpy()
        h = h @ wr.T + mean @ h @ wn.T + conv.bias.detach().double().numpy()
        if i < len(m.convs) - 1:
            h = np.maximum(h, 0)
    with torch.no_grad():
        got = m(ds.graph, torch.from_numpy(ds.x)).double().numpy()
    np.testing.assert_allclose(got, h, rtol=1e-4, atol=1e-5)


def test_sampled_width_reaches_the_kernel(ds):
    m = make_model("gcn", ds)
    x = torch.from_numpy(ds.x)
    with torch.no_grad():
        exact = m(ds.graph, x)
        wide = m(ds.graph, x, width=int(ds.graph.degrees.max()))
        narrow = m(ds.graph, x, width=2)
    torch.testing.assert_close(wide, exact)  # every row fits: exact
    assert (narrow - exact).abs().max() > 1e-3  # rows above width 2 are sampled


# ----------------------------------------------------------------------------- L-hop subgraphs reproduce the full graph
@pytest.mark.parametrize("arch,layers", [("gcn", 2), ("gcn", 3), ("sage", 2), ("sage", 3)])
def test_lhop_batch_equals_full_graph(ds, arch, layers):
    m = make_model(arch, ds, layers=layers)
    x = torch.from_numpy(ds.x)
    targets = np.array([0, 5, 17, 123, 399, 5, 250])  # a repeated target too
    with torch.no_grad():
        full = m(ds.graph, x)[torch.from_numpy(targets)]
        ptr, nodes = lhop_nodes(ds.graph, targets, m.hops)
        b = induced_batch(ds.graph, ptr, nodes)
        got, emb = m.forward_batch(b, x[torch.from_numpy(b.node_ids)], None, "fastrand",
                                   m.norm_degrees_for(ds.graph, b.node_ids))
    assert got.shape == (len(targets), ds.num_classes) and emb.shape == (len(targets), m.embedding_dim)
    assert (got - full).abs().max().item() < 1e-5
    assert torch.equal(got.argmax(1), full.argmax(1))
    # at sampled widths too, once the rows are in the graph's order (sampling picks slots by position)
    b = in_global_order(b)
    for width in (1, 2, 3):
        with torch.no_grad():
            full = m(ds.graph, x, width=width)[torch.from_numpy(targets)]
            got, _ = m.forward_batch(b, x[torch.from_numpy(b.node_ids)], width, "fastrand",
                                     m.norm_degrees_for(ds.graph, b.node_ids))
        assert (got - full).abs().max().item() < 1e-5, width


def test_lhop_batch_in_list_order_samples_other_neighbours(ds):
    """Without in_global_order the rows keep the breadth-first list order: a sampled width then picks other
    neighbours than the whole graph's forward (what the new-node path answered before it took the order)."""
    m = make_model("gcn", ds, layers=2)
    x = torch.from_numpy(ds.x)
    targets = np.arange(0, 400, 7)
    ptr, nodes = lhop_nodes(ds.graph, targets, m.hops)
    b = induced_batch(ds.graph, ptr, nodes)
    with torch.no_grad():
        full = m(ds.graph, x, width=2)[torch.from_numpy(targets)]
        got, _ = m.forward_batch(b, x[torch.from_numpy(b.node_ids)], 2, "fastrand",
                                 m.norm_degrees_for(ds.graph, b.node_ids))
    assert (got - full).abs().max().item() > 1e-4


def test_lhop_gcn_needs_full_graph_degrees(ds):
    """Without norm_degrees the subgraph's own (smaller) degrees change the outer rows: a real difference."""
    m = make_model("gcn", ds)
    x = torch.from_numpy(ds.x)
    targets = np.arange(0, 400, 9)
    with torch.no_grad():
        full = m(ds.graph, x)[torch.from_numpy(targets)]
        ptr, nodes = lhop_nodes(ds.graph, targets, 2)
        b = induced_batch(ds.graph, ptr, nodes)
        local = m.forward_batch(b, x[torch.from_numpy(b.node_ids)])[0]
    assert (local - full).abs().max().item() > 1e-4


# ----------------------------------------------------------------------------- projection split
def _ppr_batch(ds, targets, k=16):
    ptr, nodes, _ = ppr_topk(ds.graph, targets, PPRConfig(topk=k))
    return induced_batch(ds.graph, ptr, nodes)


@pytest.mark.parametrize("arch", MODEL_KINDS)
@pytest.mark.parametrize("width", [None, 3])
def test_projection_cache_equals_forward_batch(ds, arch, width):
    m = make_model(arch, ds)
    targets = np.array([1, 2, 3, 50, 300])
    if m.extractor == "ppr":
        b = _ppr_batch(ds, targets)
    else:
        b = induced_batch(ds.graph, *lhop_nodes(ds.graph, targets, m.hops))
    x = torch.from_numpy(ds.x)
    nd = m.norm_degrees_for(ds.graph, b.node_ids)
    with torch.no_grad():
        ref_logits, ref_emb = m.forward_batch(b, x[torch.from_numpy(b.node_ids)], width, "fastrand", nd)
        # what the server does: project every distinct node once (here: all nodes), gather per row
        table = m.project(x)
        assert table.shape == (ds.num_nodes, m.projection_dim)
        p_unique = table[torch.from_numpy(b.unique_ids)]
        p_rows = p_unique[torch.from_numpy(b.row_to_unique)]
        logits, emb = m.forward_batch_projected(b, p_rows, width, "fastrand", nd)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(emb, ref_emb, rtol=1e-5, atol=1e-6)
    assert torch.equal(logits.argmax(1), ref_logits.argmax(1))


@pytest.mark.parametrize("arch", MODEL_KINDS)
def test_project_is_rowwise(ds, arch):
    m = make_model(arch, ds)
    x = torch.from_numpy(ds.x)
    ids = torch.tensor([7, 3, 399, 0])
    with torch.no_grad():
        torch.testing.assert_close(m.project(x[ids]), m.project(x)[ids], rtol=1e-6, atol=1e-6)


def test_projected_rows_shape_checked(ds):
    m = make_model("sage", ds)
    b = induced_batch(ds.graph, *lhop_nodes(ds.graph, [0], 2))
    with pytest.raises(ValueError, match="p_rows must have shape"):
        m.forward_batch_projected(b, torch.zeros(b.graph.num_nodes, m.hidden))  # SAGE needs 2H


# ----------------------------------------------------------------------------- shaDow batches
@pytest.mark.parametrize("arch", ["shadow-gcn", "shadow-sage"])
@pytest.mark.parametrize("pool", ["none", "mean", "max", "mean+max"])
def test_shadow_batch_equals_per_target(ds, arch, pool):
    m = make_model(arch, ds, pool=pool, layers=2)
    x = torch.from_numpy(ds.x)
    targets = np.array([4, 9, 9, 100, 321])
    for width in (None, 2):
        with torch.no_grad():
            b = _ppr_batch(ds, targets)
            together, emb = m.forward_batch(b, x[torch.from_numpy(b.node_ids)], width)
            for i, t in enumerate(targets):
                one = _ppr_batch(ds, np.array([t]))
                alone, emb1 = m.forward_batch(one, x[torch.from_numpy(one.node_ids)], width)
                torch.testing.assert_close(together[i : i + 1], alone, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(emb[i : i + 1], emb1, rtol=1e-5, atol=1e-6)
    assert emb.shape[1] == m.embedding_dim == m.hidden * (1 + len(m.pools))


def test_shadow_pooling_reads_the_whole_subgraph(ds):
    """With pooling the prediction depends on non-target rows even when the target row is unchanged."""
    m = make_model("shadow-sage", ds, pool="mean", layers=1)
    b = _ppr_batch(ds, np.array([10]))
    x = torch.from_numpy(ds.x[b.node_ids]).clone()
    with torch.no_grad():
        before = m.forward_batch(b, x)[0]
        x[-1] += 5.0  # the last (lowest-score) node of the list
        after = m.forward_batch(b, x)[0]
    assert (before - after).abs().max() > 1e-4


# ----------------------------------------------------------------------------- construction
@pytest.mark.parametrize("arch", MODEL_KINDS)
def test_build_model_round_trips_config(ds, arch):
    m = make_model(arch, ds)
    m2 = build_model(m.config(), norm=FeatureNorm(ds.num_features, "standard"))
    assert type(m2) is type(m) and m2.config() == m.config()
    assert {k: v.shape for k, v in m2.state_dict().items()} == {k: v.shape for k, v in m.state_dict().items()}
    assert m.extractor == ("ppr" if arch.startswith("shadow") else "lhop")


def test_reset_parameters_reinitialises(ds):
    for m in (make_model("gcn", ds), make_model("sage", ds), make_model("shadow-gcn", ds)):
        before = {k: v.clone() for k, v in m.state_dict().items()}
        m.reset_parameters()
        changed = [k for k, v in m.state_dict().items() if "weight" in k and not torch.equal(v, before[k])]
        assert changed


def test_bad_arguments(ds):
    with pytest.raises(ValueError, match="at least 2 layers"):
        GCN(4, 8, 3, layers=1)
    with pytest.raises(ValueError, match="backbone"):
        ShadowGNN("gat", 4, 8, 3)
    with pytest.raises(ValueError, match="pool"):
        ShadowGNN("gcn", 4, 8, 3, pool="sum")
    with pytest.raises(ValueError, match="unknown model architecture"):
        build_model({"arch": "gat", "in_dim": 4, "hidden": 8, "num_classes": 3})
    with pytest.raises(ValueError, match="FeatureNorm has"):
        GraphSAGE(4, 8, 3, norm=FeatureNorm(5))


# ----------------------------------------------------------------------------- feature normalisation
def test_feature_norm_standard_fits_on_training_rows_only(ds):
    train = ds.split("train")
    n = FeatureNorm(ds.num_features, "standard").fit(ds.x, train)
    np.testing.assert_allclose(n.mean.numpy(), ds.x[train].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n.scale.numpy(), ds.x[train].std(0), rtol=1e-5, atol=1e-6)
    out = n(torch.from_numpy(ds.x[train])).numpy()
    np.testing.assert_allclose(out.mean(0), 0, atol=1e-5)


def test_feature_norm_auto_row_and_binarize():
    x = np.array([[0.0, 2.0, 2.0], [3.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    n = FeatureNorm(3, "auto").fit(x, np.array([0]))
    assert n.mode == "row"  # non-negative counts
    np.testing.assert_allclose(n(torch.from_numpy(x)).numpy(), [[0, 0.5, 0.5], [0.75, 0, 0.25], [0, 0, 0]])
    nb = FeatureNorm(3, "row", binarize=True).fit(x, np.array([0]))
    np.testing.assert_allclose(nb(torch.from_numpy(x)).numpy()[1], [0.5, 0, 0.5])
    # the sparse path (used for training) agrees with the dense one
    import scipy.sparse as sp

    np.testing.assert_allclose(nb.apply_sparse(sp.csr_matrix(x)).toarray(), nb(torch.from_numpy(x)).numpy())
    assert FeatureNorm(3, "auto").fit(-x, np.array([0, 1])).mode == "standard"
    # dense non-negative rows (Amazon-like bag-of-words with ~260 non-zeros) are standardised
    from models.norm import DENSE_ROW_NNZ

    rng = np.random.default_rng(0)
    dense = (rng.random((20, 400)) < (DENSE_ROW_NNZ + 40) / 400).astype(np.float32)
    sparse_rows = (rng.random((20, 400)) < (DENSE_ROW_NNZ - 40) / 400).astype(np.float32)
    assert FeatureNorm(400, "auto").fit(dense, np.arange(10)).mode == "standard"
    assert FeatureNorm(400, "auto").fit(sparse_rows, np.arange(10)).mode == "row"
    assert FeatureNorm(400, "auto").fit(sp.csr_matrix(dense), np.arange(10)).mode == "standard"
    # a feature constant on the training rows gets scale 1, not a division by ~0
    s = FeatureNorm(3, "standard").fit(x, np.array([0]))
    assert np.all(s.scale.numpy() == 1.0)
