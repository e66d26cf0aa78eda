from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from kernels.datasets import (
    DatasetError,
    GraphDataset,
    load_dataset,
    load_npz,
    save_npz,
    synthetic_sbm,
)
from kernels.graph import CSRGraph, GraphFormatError

from .conftest import dataset_path


def test_from_edge_index_matches_scipy_and_sorts_rows():
    rng = np.random.default_rng(0)
    n, e = 50, 400
    ei = rng.integers(0, n, size=(2, e))
    g = CSRGraph.from_edge_index(ei, num_nodes=n)
    g.validate()
    ref = sp.csr_matrix((np.ones(e), (ei[0], ei[1])), shape=(n, n))
    ref.sum_duplicates()
    assert g.indices.dtype == np.int32
    assert g.weights is None  # duplicates merged, graph stays unweighted
    np.testing.assert_array_equal(g.indptr, ref.indptr)
    np.testing.assert_array_equal(g.indices, ref.indices)


def test_weighted_duplicates_sum_and_symmetrize():
    ei = np.array([[0, 0, 1, 2], [1, 1, 2, 0]])
    g = CSRGraph.from_edge_index(ei, num_nodes=3, weights=np.array([1.0, 2.0, 0.5, 4.0]))
    dense = g.to_scipy().toarray()
    assert dense[0, 1] == 3.0 and dense[1, 2] == 0.5 and dense[2, 0] == 4.0
    s = CSRGraph.from_edge_index(ei, num_nodes=3, symmetrize=True)
    d = s.to_scipy().toarray()
    assert (d == d.T).all() and s.weights is None and s.num_edges == 6


def test_self_loops_removed_on_request():
    ei = np.array([[0, 1, 1], [0, 0, 1]])
    assert CSRGraph.from_edge_index(ei, 2, remove_self_loops=True).num_edges == 1
    assert CSRGraph.from_edge_index(ei, 2).num_edges == 3


@pytest.mark.parametrize(
    "ei, n, msg",
    [
        (np.array([[0, 5]]), 6, r"shape \[2, E\]"),
        (np.array([[0, 1], [1, 9]]), 5, r"outside|lie in"),
        (np.array([[0, -1], [1, 0]]), 5, "lie in"),
        (np.array([[0.5, 1.0], [1.0, 0.0]]), 5, "integers"),
    ],
)
def test_bad_edge_index_is_refused(ei, n, msg):
    with pytest.raises(GraphFormatError, match=msg):
        CSRGraph.from_edge_index(ei, num_nodes=n)


def test_save_load_mmap_roundtrip(tmp_path):
    ds = synthetic_sbm(300, seed=3)
    g = ds.graph
    g.save(tmp_path / "g")
    h = CSRGraph.load(tmp_path / "g", mmap=True, verify=True)
    assert isinstance(h.indices, np.memmap)
    assert h.fingerprint() == g.fingerprint()
    np.testing.assert_array_equal(h.indices, g.indices)


def test_load_detects_tampering(tmp_path):
    g = synthetic_sbm(300, seed=3).graph
    g.save(tmp_path / "g")
    idx = np.load(tmp_path / "g" / "indices.npy")
    idx[0] = (idx[0] + 1) % g.num_nodes
    np.save(tmp_path / "g" / "indices.npy", idx)
    with pytest.raises(GraphFormatError, match="fingerprint"):
        CSRGraph.load(tmp_path / "g", verify=True)
    (tmp_path / "g" / "graph.json").unlink()
    with pytest.raises(GraphFormatError, match=r"graph\.json"):
        CSRGraph.load(tmp_path / "g")


def test_fingerprint_changes_with_any_edge():
    ei = np.array([[0, 1, 2], [1, 2, 0]])
    a = CSRGraph.from_edge_index(ei, 3)
    b = CSRGraph.from_edge_index(np.array([[0, 1, 2], [1, 2, 1]]), 3)
    c = CSRGraph.from_edge_index(ei, 3, weights=np.ones(3))
    assert len({a.fingerprint(), b.fingerprint(), c.fingerprint()}) == 3
    assert a.fingerprint() == CSRGraph.from_edge_index(ei[:, ::-1], 3).fingerprint()


def test_synthetic_is_deterministic_homophilous_and_skewed():
    a = synthetic_sbm(3000, seed=11)
    b = synthetic_sbm(3000, seed=11)
    assert a.fingerprint() == b.fingerprint()
    assert synthetic_sbm(3000, seed=12).fingerprint() != a.fingerprint()
    g = a.graph
    g.validate()
    d = g.to_scipy()
    assert (d != d.T).nnz == 0, "synthetic graphs are symmetric"
    assert d.diagonal().sum() == 0
    rows = g.row_ids()
    same = (a.y[rows] == a.y[g.indices]).mean()
    assert same > 0.6, f"edges should mostly stay inside a class, got {same:.2f}"
    deg = g.degrees
    assert deg.max() > 5 * deg.mean(), "degree distribution should be skewed"
    assert not (a.train_mask & a.test_mask).any() and a.train_mask.sum() == 20 * a.num_classes
    # features are class-correlated: nearest-centroid on raw features beats chance clearly
    cent = np.stack([a.x[a.y == c].mean(0) for c in range(a.num_classes)])
    pred = np.argmin(((a.x[:, None, :] - cent[None]) ** 2).sum(-1), axis=1)
    assert (pred == a.y).mean() > 1.5 / a.num_classes


def test_npz_roundtrip_and_directory_mmap(tmp_path):
    ds = synthetic_sbm(400, seed=1)
    save_npz(ds, tmp_path / "d.npz")
    back = load_npz(tmp_path / "d.npz")
    assert back.fingerprint() == ds.fingerprint()
    ds.save(tmp_path / "dir")
    mm = GraphDataset.load_dir(tmp_path / "dir")
    assert isinstance(mm.x, np.memmap) and mm.fingerprint() == ds.fingerprint()
    assert load_dataset(tmp_path / "dir").num_nodes == 400
    assert load_dataset("synthetic:500:2").num_nodes == 500


def _write(tmp_path, **over):
    ds = synthetic_sbm(200, seed=0)
    arrays = dict(
        edge_index=ds.graph.edge_index(), x=ds.x, y=ds.y, train_mask=ds.train_mask,
        val_mask=ds.val_mask, test_mask=ds.test_mask, num_classes=np.int64(ds.num_classes),
    )
    arrays.update(over)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    return p


@pytest.mark.parametrize(
    "over, msg",
    [
        ({"x": None}, "missing arrays \\['x'\\]"),
        ({"y": np.zeros(5, dtype=np.int64)}, "y must have shape"),
        ({"y": np.full(200, 99, dtype=np.int64)}, "labels of split nodes"),
        ({"edge_index": np.array([[0, 1], [1, 500]])}, "outside"),
        ({"train_mask": np.zeros(200, dtype=np.int64)}, "train_mask must be bool"),
        ({"x": np.full((200, 4), np.nan, dtype=np.float32)}, "NaN"),
        ({"num_classes": np.int64(1)}, "at least 2"),
    ],
)
def test_bad_dataset_files_are_explained(tmp_path, over, msg):
    with pytest.raises(DatasetError, match=msg):
        load_npz(_write(tmp_path, **over))


def test_not_an_npz(tmp_path):
    p = tmp_path / "x.npz"
    p.write_text("hello")
    with pytest.raises(DatasetError, match="not a readable"):
        load_npz(p)
    with pytest.raises(DatasetError, match="does not exist"):
        load_npz(tmp_path / "nope.npz")


@pytest.mark.data
def test_real_cora_loads_with_documented_counts():
    ds = load_npz(dataset_path("cora"))
    assert (ds.num_nodes, ds.graph.num_edges, ds.num_features, ds.num_classes) == (2708, 10556, 1433, 7)
    assert ds.train_mask.sum() == 140 and ds.val_mask.sum() == 500 and ds.test_mask.sum() == 1000
    ds.graph.validate()
