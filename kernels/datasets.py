"""Node-classification datasets: the ``.npz`` format, OGB, a synthetic generator, mmap storage.

The ``.npz`` layout (shared with ``../shared/data``): ``edge_index`` int64 ``[2, E]``, ``x`` float32
``[N, F]``, ``y`` int64 ``[N]``, ``train_mask`` / ``val_mask`` / ``test_mask`` bool ``[N]`` and
``num_classes`` (scalar). Every array is checked on load; a bad file raises :class:`DatasetError`
naming the array and what is wrong with it.

The synthetic generator is a degree-corrected stochastic block model: node ``i`` of class ``c``
gets a Pareto-distributed propensity ``theta_i``; each edge picks its source with probability
proportional to ``theta`` and its destination, with probability ``p_in``, from the source's own
class (again by ``theta``), otherwise from the whole graph. Features are a class centroid plus
Gaussian noise, so a GNN that aggregates neighbours beats one that looks at a node alone.
Named shapes (:data:`SYNTHETIC_SHAPES`, ``synthetic:N:seed:SHAPE``) set its parameters:
``products`` is shaped like a product co-purchase graph (ogbn-products: mean degree about 50,
heavy-tailed degrees, 100 features, 47 classes).

Loading logs what it does and how long it took (logger ``kernels.datasets``) and records the
times on the dataset (:attr:`GraphDataset.load_times`: ``read`` or ``generate``, ``build_graph``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .graph import CSRGraph, GraphFormatError, _hash_array

__all__ = [
    "SYNTHETIC_SHAPES",
    "DatasetError",
    "GraphDataset",
    "load_dataset",
    "load_npz",
    "load_ogb",
    "save_npz",
    "synthetic_sbm",
]

_DIR_FORMAT = "gnnserve.dataset/1"
log = logging.getLogger(__name__)

#: parameters of :func:`synthetic_sbm` per named shape (``synthetic:N:seed:SHAPE``)
SYNTHETIC_SHAPES: dict[str, dict[str, Any]] = {
    "default": {},
    # like ogbn-products (2.4 M nodes, 61.9 M undirected edges, mean degree ~51, max ~17 k, 100
    # features, 47 classes). Pareto index 3 (propensity tail ~ x^-2): on 2 M nodes the largest
    # propensity is ~sqrt(N) times the median, so the largest degrees are in the ten thousands
    # rather than a hub joined to a tenth of the graph (index 2.5).
    # feature_signal 0.12: a node's own features alone do not give its class (0.6 made every
    # model score 100 % on 100 features)
    "products": {"avg_degree": 50.0, "power": 3.0, "num_features": 100, "num_classes": 47, "p_in": 0.8,
                 "feature_signal": 0.12},
}


class DatasetError(ValueError):
    """A dataset file is missing, unreadable or inconsistent. The message names the array at fault."""


@dataclass(eq=False)
class GraphDataset:
    """A graph with node features, labels and splits.

    Attributes:
        name: short name (file stem for loaded files).
        graph: the (directed, usually symmetric) adjacency.
        x: float32 ``[N, F]`` node features (may be a read-only memory map).
        y: int64 ``[N]`` class per node.
        train_mask, val_mask, test_mask: bool ``[N]``.
        num_classes: ``C``; every ``y`` lies in ``[0, C)``.
    """

    name: str
    graph: CSRGraph
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    #: seconds spent loading it, by step (``read``/``generate``, ``build_graph``); not part of its identity
    load_times: dict[str, float] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def split(self, which: str) -> np.ndarray:
        """Node ids of ``"train"``, ``"val"`` or ``"test"``."""
        masks = {"train": self.train_mask, "val": self.val_mask, "test": self.test_mask}
        if which not in masks:
            raise ValueError(f"split must be one of {sorted(masks)}, got {which!r}")
        return np.flatnonzero(masks[which])

    def feature_fingerprint(self) -> str:
        """Content hash of the feature matrix (hex, 16 bytes of BLAKE2b)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(f"x|{self.x.shape}|{self.x.dtype.str}".encode())
        _hash_array(h, self.x)
        return h.hexdigest()

    def fingerprint(self) -> str:
        """Hash of graph, features and labels: identifies the data a model was trained on."""
        h = hashlib.blake2b(digest_size=16)
        h.update(self.graph.fingerprint().encode())
        h.update(self.feature_fingerprint().encode())
        _hash_array(h, np.ascontiguousarray(self.y, dtype=np.int64))
        return h.hexdigest()

    def __repr__(self) -> str:
        return (
            f"GraphDataset({self.name!r}, N={self.num_nodes}, E={self.graph.num_edges}, "
            f"F={self.num_features}, C={self.num_classes}, train/val/test="
            f"{int(self.train_mask.sum())}/{int(self.val_mask.sum())}/{int(self.test_mask.sum())})"
        )

    # ---------------------------------------------------------------- directory storage (mmap)
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Store as a directory (graph arrays, ``x.npy``, labels, masks, ``dataset.json``) for mmap."""
        d = Path(directory)
        self.graph.save(d / "graph")
        np.save(d / "x.npy", np.ascontiguousarray(self.x, dtype=np.float32))
        np.savez(d / "labels.npz", y=self.y, train_mask=self.train_mask, val_mask=self.val_mask,
                 test_mask=self.test_mask)
        meta = {"format": _DIR_FORMAT, "name": self.name, "num_classes": int(self.num_classes)}
        (d / "dataset.json").write_text(json.dumps(meta, indent=2))
        return d

    @classmethod
    def load_dir(cls, directory: str | os.PathLike[str], *, mmap: bool = True) -> GraphDataset:
        d = Path(directory)
        try:
            meta = json.loads((d / "dataset.json").read_text())
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{d}: not a saved dataset directory ({exc})") from exc
        if meta.get("format") != _DIR_FORMAT:
            raise DatasetError(f"{d}: unknown dataset format {meta.get('format')!r}")
        try:
            graph = CSRGraph.load(d / "graph", mmap=mmap)
        except GraphFormatError as exc:
            raise DatasetError(str(exc)) from exc
        x = np.load(d / "x.npy", mmap_mode="r" if mmap else None)
        with np.load(d / "labels.npz") as z:
            arrays = {k: z[k] for k in ("y", "train_mask", "val_mask", "test_mask")}
        ds = cls(name=meta["name"], graph=graph, x=x, num_classes=int(meta["num_classes"]), **arrays)
        _check_node_arrays(ds, str(d))
        return ds


# --------------------------------------------------------------------------- .npz
_REQUIRED = ("edge_index", "x", "y", "train_mask", "val_mask", "test_mask", "num_classes")


def load_npz(path: str | os.PathLike[str], *, name: str | None = None) -> GraphDataset:
    """Load the ``.npz`` dataset layout, validating every array.

    Raises:
        DatasetError: missing file or array, wrong dtype or shape, ids or labels out of range.
    """
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"dataset file {p} does not exist")
    t0 = time.perf_counter()
    try:
        z = np.load(p, allow_pickle=False)
    except Exception as exc:  # zipfile.BadZipFile, ValueError, OSError: all mean "not an npz"
        raise DatasetError(f"{p}: not a readable .npz archive ({exc})") from exc
    with z:
        missing = [k for k in _REQUIRED if k not in z.files]
        if missing:
            raise DatasetError(f"{p}: missing arrays {missing}; a dataset needs {list(_REQUIRED)}")
        arrays = {k: z[k] for k in _REQUIRED}
    read = time.perf_counter() - t0
    log.info("read %s: %d nodes, %d edges in the file, in %.1f s", p.name, arrays["x"].shape[0],
             np.asarray(arrays["edge_index"]).shape[-1], read)
    ds = dataset_from_arrays(arrays, name=name or p.stem, source=str(p))
    ds.load_times = {"read": round(read, 3), **ds.load_times}
    return ds


def dataset_from_arrays(arrays: dict[str, np.ndarray], *, name: str, source: str = "arrays") -> GraphDataset:
    """Validate raw arrays in the ``.npz`` layout and build a :class:`GraphDataset`."""
    ei = np.asarray(arrays["edge_index"])
    x = np.asarray(arrays["x"])
    y = np.asarray(arrays["y"])
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DatasetError(f"{source}: edge_index must have shape [2, E], got {ei.shape}")
    if ei.dtype.kind not in "iu":
        raise DatasetError(f"{source}: edge_index must be integer, got {ei.dtype}")
    if x.ndim != 2:
        raise DatasetError(f"{source}: x must have shape [N, F], got {x.shape}")
    if x.dtype.kind != "f":
        raise DatasetError(f"{source}: x must be floating point, got {x.dtype}")
    n = x.shape[0]
    if y.shape != (n,):
        raise DatasetError(f"{source}: y must have shape [N] = [{n}], got {y.shape}")
    if y.dtype.kind not in "iu":
        raise DatasetError(f"{source}: y must be integer class ids, got {y.dtype}")
    try:
        num_classes = int(np.asarray(arrays["num_classes"]).reshape(()))
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"{source}: num_classes must be a scalar integer ({exc})") from exc
    if num_classes < 2:
        raise DatasetError(f"{source}: num_classes must be at least 2, got {num_classes}")
    if ei.size and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise DatasetError(
            f"{source}: edge_index refers to nodes {int(ei.min())} .. {int(ei.max())} outside [0, {n})"
        )
    if not np.all(np.isfinite(x)):
        raise DatasetError(f"{source}: x contains NaN or infinite values")
    masks = {}
    for k in ("train_mask", "val_mask", "test_mask"):
        m = np.asarray(arrays[k])
        if m.shape != (n,):
            raise DatasetError(f"{source}: {k} must have shape [N] = [{n}], got {m.shape}")
        if m.dtype != np.bool_:
            raise DatasetError(f"{source}: {k} must be bool, got {m.dtype}")
        masks[k] = m
    t0 = time.perf_counter()
    graph = CSRGraph.from_edge_index(ei, num_nodes=n, remove_self_loops=False)
    built = time.perf_counter() - t0
    log.info("built the CSR graph: %d nodes, %d edges in %.1f s", n, graph.num_edges, built)
    ds = GraphDataset(
        name=name,
        graph=graph,
        x=np.ascontiguousarray(x, dtype=np.float32),
        y=y.astype(np.int64),
        num_classes=num_classes,
        **masks,
    )
    _check_node_arrays(ds, source)
    ds.load_times = {"build_graph": round(built, 3)}
    return ds


def _check_node_arrays(ds: GraphDataset, source: str) -> None:
    labelled = ds.train_mask | ds.val_mask | ds.test_mask
    if labelled.any():
        yl = ds.y[labelled]
        lo, hi = int(yl.min()), int(yl.max())
        if lo < 0 or hi >= ds.num_classes:
            raise DatasetError(
                f"{source}: labels of split nodes must lie in [0, num_classes={ds.num_classes}), found {lo} .. {hi}"
            )
    if not ds.train_mask.any():
        raise DatasetError(f"{source}: train_mask selects no node")
    if (ds.train_mask & ds.test_mask).any() or (ds.train_mask & ds.val_mask).any():
        raise DatasetError(f"{source}: train_mask overlaps val_mask or test_mask")


def save_npz(ds: GraphDataset, path: str | os.PathLike[str]) -> Path:
    """Write a dataset in the ``.npz`` layout (compressed)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        p,
        edge_index=ds.graph.edge_index(),
        x=np.asarray(ds.x, dtype=np.float32),
        y=ds.y.astype(np.int64),
        train_mask=ds.train_mask,
        val_mask=ds.val_mask,
        test_mask=ds.test_mask,
        num_classes=np.int64(ds.num_classes),
    )
    return p


def load_ogb(name: str, root: str | os.PathLike[str] = "dataset") -> GraphDataset:
    """Load an OGB node-property dataset (e.g. ``ogbn-arxiv``) already on disk under ``root``.

    Needs the ``ogb`` package; the graph is symmetrized (OGB's citation graphs are directed) and
    the official split is used. Multi-label tasks (ogbn-proteins) are refused.
    """
    try:
        from ogb.nodeproppred import NodePropPredDataset  # type: ignore[import-not-found]
    except ImportError as exc:
        raise DatasetError("loading OGB datasets needs the 'ogb' package: pip install ogb") from exc
    data = NodePropPredDataset(name=name, root=str(root))
    g, labels = data[0]
    y = np.asarray(labels).reshape(-1)
    if np.asarray(labels).ndim == 2 and np.asarray(labels).shape[1] != 1:
        raise DatasetError(f"{name} is multi-label; gnnserve serves single-label node classification")
    n = int(g["num_nodes"])
    split = data.get_idx_split()
    masks = {}
    for ours, theirs in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        m = np.zeros(n, dtype=bool)
        m[np.asarray(split[theirs])] = True
        masks[ours] = m
    y = np.where(np.isnan(y.astype(np.float64)), 0, y).astype(np.int64) if y.dtype.kind == "f" else y.astype(np.int64)
    graph = CSRGraph.from_edge_index(np.asarray(g["edge_index"]), num_nodes=n, symmetrize=True, remove_self_loops=True)
    return GraphDataset(
        name=name, graph=graph, x=np.ascontiguousarray(g["node_feat"], dtype=np.float32), y=y,
        num_classes=int(data.num_classes), **masks,
    )


def load_dataset(spec: str | os.PathLike[str]) -> GraphDataset:
    """Load by path or name: ``*.npz``, a saved dataset directory, ``ogb:<name>[@root]`` or
    ``synthetic[:N[:seed[:shape]]]`` (shape: a key of :data:`SYNTHETIC_SHAPES`, e.g.
    ``synthetic:2000000:0:products``)."""
    s = str(spec)
    if s.startswith("ogb:"):
        name, _, root = s[4:].partition("@")
        return load_ogb(name, root or "dataset")
    if s == "synthetic" or s.startswith("synthetic:"):
        parts = s.split(":")[1:]
        n = int(parts[0]) if parts and parts[0] else 2000
        seed = int(parts[1]) if len(parts) > 1 and parts[1] else 0
        shape = parts[2] if len(parts) > 2 else "default"
        if shape not in SYNTHETIC_SHAPES or len(parts) > 3:
            raise DatasetError(f"{s}: expected synthetic[:N[:seed[:shape]]] with shape one of "
                               f"{sorted(SYNTHETIC_SHAPES)}")
        name = None if shape == "default" else f"synthetic-{shape}-{n}-s{seed}"
        return synthetic_sbm(n, seed=seed, name=name, **SYNTHETIC_SHAPES[shape])
    p = Path(s)
    if p.is_dir():
        return GraphDataset.load_dir(p)
    return load_npz(p)


# --------------------------------------------------------------------------- synthetic
def synthetic_sbm(
    num_nodes: int = 2000,
    *,
    num_classes: int = 5,
    avg_degree: float = 12.0,
    num_features: int = 32,
    p_in: float = 0.8,
    power: float = 2.5,
    feature_signal: float = 0.6,
    train_per_class: int = 20,
    val_fraction: float = 0.1,
    seed: int = 0,
    name: str | None = None,
) -> GraphDataset:
    """Degree-skewed stochastic block model with class-correlated features (deterministic per seed).

    Args:
        num_nodes: N (1 thousand to a few million; edges are drawn in chunks, memory is O(E)).
        num_classes: C.
        avg_degree: target mean degree of the symmetric graph (duplicates and self-loops drawn
            are dropped, so the realised mean is slightly lower).
        num_features: F.
        p_in: probability that an edge stays inside its source's class (homophily).
        power: Pareto tail index of the degree propensity (smaller = more skewed).
        feature_signal: scale of the class centroid against unit Gaussian noise.
        train_per_class, val_fraction: split sizes; every other node is a test node.
        seed: NumPy seed; the same arguments give byte-identical datasets.
    """
    if num_nodes < num_classes * 2:
        raise ValueError(f"num_nodes={num_nodes} is too small for {num_classes} classes")
    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    n, c = int(num_nodes), int(num_classes)
    y = rng.integers(0, c, size=n).astype(np.int64)
    theta = (rng.pareto(power - 1.0, size=n) + 1.0).astype(np.float64)
    # Nodes grouped by class so a class is one contiguous slice of `order`.
    order = np.argsort(y, kind="stable")
    class_start = np.searchsorted(y[order], np.arange(c + 1))
    cum_all = np.cumsum(theta)
    cum_sorted = np.cumsum(theta[order])
    seg_lo = np.concatenate([[0.0], cum_sorted])[class_start[:-1]]
    seg_w = cum_sorted[class_start[1:] - 1] - seg_lo

    m_total = round(n * avg_degree / 2)  # undirected edges to draw
    chunk = 1 << 22
    srcs, dsts = [], []
    for start in range(0, m_total, chunk):
        m = min(chunk, m_total - start)
        src = np.searchsorted(cum_all, rng.random(m) * cum_all[-1], side="right")
        src = np.minimum(src, n - 1)
        inside = rng.random(m) < p_in
        dst = np.empty(m, dtype=np.int64)
        k = int(inside.sum())
        cls = y[src[inside]]
        u = seg_lo[cls] + rng.random(k) * seg_w[cls]
        pos = np.searchsorted(cum_sorted, u, side="right")
        pos = np.clip(pos, class_start[cls], class_start[cls + 1] - 1)
        dst[inside] = order[pos]
        out = ~inside
        d_out = np.searchsorted(cum_all, rng.random(m - k) * cum_all[-1], side="right")
        dst[out] = np.minimum(d_out, n - 1)
        idt = np.int32 if n < 2**31 else np.int64
        srcs.append(src.astype(idt))
        dsts.append(dst.astype(idt))
    src = np.concatenate(srcs) if srcs else np.zeros(0, dtype=np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, dtype=np.int64)
    del srcs, dsts
    t_graph = time.perf_counter()
    graph = CSRGraph.from_edge_index(np.stack([src, dst]), num_nodes=n, symmetrize=True, remove_self_loops=True)
    del src, dst
    built = time.perf_counter() - t_graph
    log.info("synthetic graph: %d nodes, %d edges drawn, CSR of %d edges built in %.1f s", n, m_total,
             graph.num_edges, built)

    centroids = rng.standard_normal((c, num_features)).astype(np.float32)
    x = np.empty((n, num_features), dtype=np.float32)
    rows = 1 << 18
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        x[start:stop] = feature_signal * centroids[y[start:stop]]
        x[start:stop] += rng.standard_normal((stop - start, num_features), dtype=np.float32)

    perm = rng.permutation(n)
    train_mask = np.zeros(n, dtype=bool)
    for cl in range(c):
        members = perm[y[perm] == cl]
        train_mask[members[:train_per_class]] = True
    rest = perm[~train_mask[perm]]
    n_val = round(val_fraction * n)
    val_mask = np.zeros(n, dtype=bool)
    val_mask[rest[:n_val]] = True
    test_mask = ~(train_mask | val_mask)
    total = time.perf_counter() - t_start
    log.info("synthetic dataset of %d nodes generated in %.1f s (graph %.1f s)", n, total, built)
    return GraphDataset(
        load_times={"generate": round(total - built, 3), "build_graph": round(built, 3)},
        name=name or f"synthetic-sbm-{n}-s{seed}",
        graph=graph,
        x=x,
        y=y,
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=c,
    )
