"""The out-of-core synthetic generator (kernels.datasets.synthetic_sbm_to_dir) and load_dataset's dispatch.

The out-of-core path must give exactly what synthetic_sbm gives: every array, dtype, fingerprint
and even the .npy files GraphDataset.save writes. Chunk sizes are shrunk here so small graphs go
through many edge chunks, feature chunks and CSR row blocks.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from kernels import datasets as D
from kernels.datasets import (
    SYNTHETIC_SHAPES,
    DatasetError,
    GraphDataset,
    load_dataset,
    synthetic_cache_dir,
    synthetic_sbm,
    synthetic_sbm_to_dir,
)
from kernels.graph import CSRGraph

from .progress_support import RecordingBars

FILES = ("x.npy", "labels.npz", "graph/indptr.npy", "graph/indices.npy", "graph/graph.json")


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(D, "_EDGE_CHUNK", 3001)
    monkeypatch.setattr(D, "_FEATURE_ROWS", 257)


def _assert_same(a: GraphDataset, b: GraphDataset) -> None:
    for k in ("x", "y", "train_mask", "val_mask", "test_mask"):
        va, vb = getattr(a, k), getattr(b, k)
        assert va.dtype == vb.dtype and va.shape == vb.shape, k
        assert np.array_equal(va, vb), k
    ga, gb = a.graph, b.graph
    assert ga.num_nodes == gb.num_nodes
    assert ga.indptr.dtype == gb.indptr.dtype and np.array_equal(ga.indptr, gb.indptr)
    assert ga.indices.dtype == gb.indices.dtype and np.array_equal(ga.indices, gb.indices)
    assert ga.weights is None and gb.weights is None
    assert a.num_classes == b.num_classes and a.name == b.name
    assert a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize(
    ("n", "seed", "shape", "budget"),
    [
        (20, 5, "default", 1 << 30),       # fewer nodes than an edge chunk, one block
        (1000, 0, "default", 1 << 30),
        (3000, 1, "products", 1000),       # many blocks, hubs larger than a block (blocks of one row)
        (7000, 2, "default", 20_000),
        (5000, 3, "products", 1 << 30),
    ],
)
def test_out_of_core_is_byte_identical(tmp_path, small_chunks, n, seed, shape, budget):
    kw = dict(SYNTHETIC_SHAPES[shape], seed=seed, name=f"t-{shape}")
    ref = synthetic_sbm(n, **kw)
    d = synthetic_sbm_to_dir(tmp_path / "ooc", n, memory_budget=budget, **kw)
    got = GraphDataset.load_dir(d, mmap=True)
    assert isinstance(got.x, np.memmap)
    _assert_same(ref, got)
    meta = json.loads((d / "dataset.json").read_text())
    assert meta["fingerprint"] == ref.fingerprint()
    assert CSRGraph.load(d / "graph", verify=True).fingerprint() == ref.graph.fingerprint()
    ref.save(tmp_path / "saved")
    for f in FILES:
        assert filecmp.cmp(tmp_path / "saved" / f, d / f, shallow=False), f
    assert sorted(p.name for p in d.iterdir()) == ["dataset.json", "graph", "labels.npz", "x.npy"]
    assert not list(tmp_path.glob(".ooc.tmp-*"))


def test_default_chunk_sizes_match_the_fingerprints(tmp_path):
    # no monkeypatching: the real chunk sizes, the fingerprint the in-memory path had before
    # synthetic_sbm was split into the helpers both paths share
    d = synthetic_sbm_to_dir(tmp_path / "ds", 1000, seed=0)
    assert json.loads((d / "dataset.json").read_text())["fingerprint"] == "198b637d47b84b0de47552b8de50cb3b"
    assert synthetic_sbm(1000, seed=0).fingerprint() == "198b637d47b84b0de47552b8de50cb3b"


def test_reuses_a_complete_directory(tmp_path, small_chunks, monkeypatch):
    d = synthetic_sbm_to_dir(tmp_path / "ds", 500, seed=1)
    before = {f: (d / f).stat().st_mtime_ns for f in FILES}

    def boom(*a, **k):
        raise AssertionError("regenerated a complete dataset")

    monkeypatch.setattr(D, "_write_synthetic", boom)
    assert synthetic_sbm_to_dir(tmp_path / "ds", 500, seed=1) == d
    assert {f: (d / f).stat().st_mtime_ns for f in FILES} == before
    # other arguments for the same directory: refused, nothing overwritten
    with pytest.raises(DatasetError, match="does not hold this synthetic dataset"):
        synthetic_sbm_to_dir(tmp_path / "ds", 500, seed=2)
    (tmp_path / "other").mkdir()
    with pytest.raises(DatasetError):
        synthetic_sbm_to_dir(tmp_path / "other", 500, seed=1)


def test_a_failed_generation_leaves_nothing(tmp_path, small_chunks, monkeypatch):
    def fail(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(D, "_sort_unique_rows", fail)  # after the spill, features and labels exist
    with pytest.raises(RuntimeError, match="disk full"):
        synthetic_sbm_to_dir(tmp_path / "ds", 800, seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ds.lock"]
    monkeypatch.undo()
    ref = synthetic_sbm(800, seed=0)
    _assert_same(ref, GraphDataset.load_dir(synthetic_sbm_to_dir(tmp_path / "ds", 800, seed=0)))


def test_a_dead_process_temp_dir_is_removed(tmp_path, small_chunks):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(proc.stdout)
    stale = tmp_path / f".ds.tmp-{dead}"
    (stale / "graph").mkdir(parents=True)
    (stale / "x.npy").write_bytes(b"half")
    (stale / "dataset.json").write_text("{}")  # even a stale metadata file never makes it look complete
    old = time.time() - 3600  # untouched for an hour (a recent one may be another host's writer)
    for p in (stale, stale / "graph", stale / "x.npy", stale / "dataset.json"):
        os.utime(p, (old, old))
    d = synthetic_sbm_to_dir(tmp_path / "ds", 300, seed=4)
    assert not stale.exists()
    _assert_same(synthetic_sbm(300, seed=4), GraphDataset.load_dir(d))


def test_load_dataset_out_of_core_into_the_cache(tmp_path, small_chunks):
    spec = "synthetic:3000:1:products"
    ref = load_dataset(spec, out_of_core=False)
    assert not isinstance(ref.x, np.memmap)
    got = load_dataset(spec, out_of_core=True, cache_dir=tmp_path, progress=False)
    assert isinstance(got.x, np.memmap) and not got.x.flags.writeable
    _assert_same(ref, got)
    assert set(got.load_times) == {"generate", "build_graph", "read"}
    d = synthetic_cache_dir(3000, tmp_path, seed=1, name="synthetic-products-3000-s1", **SYNTHETIC_SHAPES["products"])
    assert d.parent == tmp_path / "datasets" and d.name.startswith("synthetic-products-3000-s1-")
    assert (d / "dataset.json").exists()
    again = load_dataset(spec, out_of_core=True, cache_dir=tmp_path)
    assert set(again.load_times) == {"read"}
    _assert_same(ref, again)
    # another seed or another argument is another directory
    other = synthetic_cache_dir(3000, tmp_path, seed=2, name="synthetic-products-3000-s2",
                                **SYNTHETIC_SHAPES["products"])
    assert other != d
    assert synthetic_cache_dir(3000, tmp_path, seed=1, name="synthetic-products-3000-s1",
                               **{**SYNTHETIC_SHAPES["products"], "p_in": 0.7}) != d


def test_load_dataset_decides_by_memory(tmp_path, monkeypatch, small_chunks):
    monkeypatch.setenv("GNNSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GNNSERVE_OUT_OF_CORE", raising=False)
    monkeypatch.setattr(D, "_available_memory", lambda: 1 << 40)
    assert not isinstance(load_dataset("synthetic:400:0").x, np.memmap)
    assert not (tmp_path / "cache").exists()
    # estimate above half of what is available: out of core, under $GNNSERVE_CACHE
    need = D.synthetic_memory_estimate(400, seed=0)
    monkeypatch.setattr(D, "_available_memory", lambda: need)
    ds = load_dataset("synthetic:400:0")
    assert isinstance(ds.x, np.memmap)
    assert str(ds.x.filename).startswith(str(tmp_path / "cache" / "datasets" / "synthetic-sbm-400-s0-"))
    _assert_same(synthetic_sbm(400, seed=0), ds)
    # the environment forces either way
    monkeypatch.setenv("GNNSERVE_OUT_OF_CORE", "0")
    assert not isinstance(load_dataset("synthetic:400:0").x, np.memmap)
    monkeypatch.setenv("GNNSERVE_OUT_OF_CORE", "1")
    monkeypatch.setattr(D, "_available_memory", lambda: 1 << 40)
    assert isinstance(load_dataset("synthetic:400:0").x, np.memmap)


def test_memory_estimate_matches_the_measured_point():
    # 3.43 GiB measured for synthetic:2000000:0:products (docs/BENCHMARKS.md, issue #19)
    est = D.synthetic_memory_estimate(2_000_000, **SYNTHETIC_SHAPES["products"])
    assert 3.2 * 2**30 < est < 3.7 * 2**30
    assert D.synthetic_memory_estimate(10_000_000, **SYNTHETIC_SHAPES["products"]) > 15 * 2**30
    with pytest.raises(TypeError):
        D.synthetic_memory_estimate(100, not_an_argument=1)


def test_in_memory_generation_logs_each_step_and_shows_progress(monkeypatch, caplog, small_chunks):
    """A new user's 2 M-node run: ``synthetic:2000000:0:products`` in memory printed nothing for 24 s between
    its start and "CSR ... built". The edges and the features are drawn under tqdm bars (many chunks here), and
    each step logs a line with its time, the CSR build one before it starts; the dataset is the same."""
    import tqdm.auto

    bars = RecordingBars()
    monkeypatch.setattr(tqdm.auto, "tqdm", bars)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    n, degree = 3000, 12.0
    with caplog.at_level("INFO", logger="kernels.datasets"):
        ds = synthetic_sbm(n, seed=1, avg_degree=degree, progress=True)
    by_desc = {b["desc"]: b for b in bars.made}
    assert set(by_desc) == {"draw edges", "features"}
    m_total = round(n * degree / 2)
    assert by_desc["draw edges"]["total"] == sum(by_desc["draw edges"]["updates"]) == m_total
    assert len(by_desc["draw edges"]["updates"]) == -(-m_total // D._EDGE_CHUNK) > 1  # a step per chunk
    assert by_desc["features"]["total"] == sum(by_desc["features"]["updates"]) == n
    assert len(by_desc["features"]["updates"]) > 1
    assert all(b["disable"] is False for b in bars.made)
    said = [r.getMessage() for r in caplog.records if r.name == "kernels.datasets"]
    steps = ("drawing", "edges drawn in", "building the CSR", "CSR of", "features 3000 x 32", "generated in")
    at = [next((i for i, m in enumerate(said) if s in m), None) for s in steps]
    assert None not in at and at == sorted(at), said
    _assert_same(ds, synthetic_sbm(n, seed=1, avg_degree=degree, progress=False))
    # load_dataset hands its progress to the in-memory generator (None: bars only on a terminal)
    bars.made.clear()
    load_dataset("synthetic:300:2", out_of_core=False)
    assert [b["disable"] for b in bars.made] == [None, None]
    bars.made.clear()  # and none under `gnnserve serve --no-progress` (TQDM_DISABLE)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    load_dataset("synthetic:300:2", out_of_core=False)
    assert [b["disable"] for b in bars.made] == [True, True]
    # the argument is no generator parameter: the out-of-core cache key does not change with it
    assert "progress" not in D._synthetic_params(n, {})
