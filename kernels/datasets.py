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

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import numba
import numpy as np

from .graph import _FORMAT as _GRAPH_FORMAT
from .graph import CSRGraph, GraphFormatError, _hash_array, index_dtype_for
from .threads import numba_threads

__all__ = [
    "SYNTHETIC_SHAPES",
    "DatasetError",
    "GraphDataset",
    "load_dataset",
    "load_npz",
    "load_ogb",
    "load_synthetic",
    "save_npz",
    "synthetic_cache_dir",
    "synthetic_memory_estimate",
    "synthetic_sbm",
    "synthetic_sbm_to_dir",
]

#: the help of every command-line option that takes a dataset spec (:func:`load_dataset`)
DATASET_HELP = ("PATH.npz, a saved dataset directory, ogb:NAME[@ROOT] (an OGB dataset under directory ROOT, default "
                "./dataset) or synthetic[:N[:SEED[:SHAPE]]]: a synthetic graph of N nodes (default 2000) drawn with SEED "
                "(default 0) in SHAPE 'default' or 'products' (shaped like ogbn-products), e.g. synthetic:1000000 or "
                "synthetic:2000000:0:products")

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
        _save_labels(d, self.y, self.train_mask, self.val_mask, self.test_mask)
        _write_dataset_meta(d, self.name, self.num_classes)
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


def _save_labels(d: Path, y: np.ndarray, train_mask: np.ndarray, val_mask: np.ndarray,
                 test_mask: np.ndarray) -> None:
    np.savez(d / "labels.npz", y=y, train_mask=train_mask, val_mask=val_mask, test_mask=test_mask)


def _write_dataset_meta(d: Path, name: str, num_classes: int, extra: dict[str, Any] | None = None) -> None:
    meta = {"format": _DIR_FORMAT, "name": name, "num_classes": int(num_classes), **(extra or {})}
    (d / "dataset.json").write_text(json.dumps(meta, indent=2))


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
        with open(p, "rb") as f:
            head = f.read(6)
    except OSError as exc:
        raise DatasetError(f"{p}: not a readable .npz archive ({exc})") from exc
    if not head.startswith(b"PK"):  # np.load takes anything else for a pickle and says so, which misleads
        what = "a single .npy array" if head.startswith(b"\x93NUMPY") else f"a file starting {head!r}"
        raise DatasetError(f"{p}: not a readable .npz archive (a .npz is a zip of the dataset's arrays; this is "
                           f"{what})")
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


def load_dataset(
    spec: str | os.PathLike[str],
    *,
    out_of_core: bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> GraphDataset:
    """Load by path or name: ``*.npz``, a saved dataset directory, ``ogb:<name>[@root]`` or
    ``synthetic[:N[:seed[:shape]]]`` (shape: a key of :data:`SYNTHETIC_SHAPES`, e.g.
    ``synthetic:2000000:0:products``).

    A synthetic dataset too large to build in memory comfortably is generated out of core into a
    cache directory and returned memory-mapped (see :func:`load_synthetic` for the rule and the
    arguments, which only apply to synthetic specs)."""
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
        return load_synthetic(n, seed=seed, name=name, out_of_core=out_of_core, cache_dir=cache_dir,
                              progress=progress, **SYNTHETIC_SHAPES[shape])
    p = Path(s)
    if p.is_dir():
        return GraphDataset.load_dir(p)
    return load_npz(p)


#: out of core when synthetic_sbm's estimated peak passes this share of the available memory
OUT_OF_CORE_FRACTION = 0.5


def load_synthetic(
    num_nodes: int = 2000,
    *,
    out_of_core: bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    **kwargs: Any,
) -> GraphDataset:
    """:func:`synthetic_sbm` in memory, or out of core into a cache directory and memory-mapped.

    ``out_of_core=None`` decides by size: out of core when :func:`synthetic_memory_estimate`
    passes :data:`OUT_OF_CORE_FRACTION` of the available memory (``MemAvailable``); the
    environment variable ``GNNSERVE_OUT_OF_CORE`` (``1`` / ``0``) forces either way. Both give
    the same arrays and fingerprints; out of core the arrays are read-only memory maps of
    :func:`synthetic_cache_dir` (generated once by :func:`synthetic_sbm_to_dir`, reused later).
    """
    if out_of_core is None:
        env = os.environ.get("GNNSERVE_OUT_OF_CORE", "").strip().lower()
        if env in ("1", "true", "yes"):
            out_of_core = True
        elif env in ("0", "false", "no"):
            out_of_core = False
        else:
            need, avail = synthetic_memory_estimate(num_nodes, **kwargs), _available_memory()
            out_of_core = need > OUT_OF_CORE_FRACTION * avail
            if out_of_core:
                log.info("synthetic %d nodes: about %.1f GiB in memory against %.1f GiB available: "
                         "out of core, memory-mapped from the cache", num_nodes, need / 2**30, avail / 2**30)
    if not out_of_core:
        return synthetic_sbm(num_nodes, progress=progress, **kwargs)
    d = synthetic_cache_dir(num_nodes, cache_dir, **kwargs)
    reused = _synthetic_dir_matches(d, _synthetic_params(num_nodes, kwargs))
    t0 = time.perf_counter()
    synthetic_sbm_to_dir(d, num_nodes, progress=progress, **kwargs)
    made = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = GraphDataset.load_dir(d, mmap=True)
    read = time.perf_counter() - t0
    if reused:
        ds.load_times = {"read": round(read, 3)}
        log.info("synthetic %d nodes: memory-mapped from %s (generated earlier) in %.1f s", num_nodes, d, read)
    else:
        gen = json.loads((d / "dataset.json").read_text()).get("generate_times_s", {})
        csr = float(gen.get("build_csr", 0.0))
        ds.load_times = {"generate": round(made - csr, 3), "build_graph": round(csr, 3), "read": round(read, 3)}
    return ds


# --------------------------------------------------------------------------- synthetic
#: bumped whenever the generator's output for the same arguments changes (cache keys include it)
_SYNTHETIC_VERSION = 1
#: edges drawn per chunk and feature rows per chunk: both fix the order of the RNG stream, so
#: changing either changes every synthetic dataset (tests shrink them to exercise many chunks)
_EDGE_CHUNK = 1 << 22
_FEATURE_ROWS = 1 << 18


@dataclass
class _SBMModel:
    """The node-level draws of :func:`synthetic_sbm` (labels, propensities and their sampling tables)."""

    n: int
    c: int
    y: np.ndarray
    order: np.ndarray
    class_start: np.ndarray
    cum_all: np.ndarray
    cum_sorted: np.ndarray
    seg_lo: np.ndarray
    seg_w: np.ndarray
    guide_all: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    guide_sorted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        self.guide_all = _search_guide(self.cum_all)
        self.guide_sorted = _search_guide(self.cum_sorted)


def _search_guide(a: np.ndarray) -> np.ndarray:
    """Bucket table for :func:`_searchsorted_right`: ``guide[b]`` is where values from
    ``b * a[-1] / K`` on start (``K = len(guide) - 1``, about one bucket per two entries)."""
    n = len(a)
    k = max(1, min(1 << 23, n // 2))
    if n == 0:
        return np.zeros(2, dtype=np.int64)
    guide = np.searchsorted(a, np.arange(k, dtype=np.float64) * (a[-1] / k), side="right").astype(np.int64)
    return np.append(guide, np.int64(n))


@numba.njit(cache=True, nogil=True, parallel=True)
def _searchsorted_guided(a, guide, q, out):  # pragma: no cover - compiled
    n = len(a)
    k = len(guide) - 1
    scale = k / a[n - 1]
    for j in numba.prange(len(q)):
        u = q[j]
        b = int(u * scale) if u > 0 else 0
        if b > k - 1:
            b = k - 1
        lo = guide[b]
        hi = guide[b + 1]
        # the answer (the first index whose value exceeds u) must lie in [lo, hi]; where rounding
        # put u in a neighbouring bucket, search everything
        if (lo > 0 and a[lo - 1] > u) or (hi < n and a[hi] <= u):
            lo = 0
            hi = n
        while lo < hi:
            mid = (lo + hi) >> 1
            if a[mid] <= u:
                lo = mid + 1
            else:
                hi = mid
        out[j] = lo


def _searchsorted_right(a: np.ndarray, guide: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.searchsorted(a, q, side="right")`` for a sorted float64 ``a``: the same int64 result,
    found through a bucket table and on every core (unsorted queries into an array larger than the
    CPU caches cost NumPy about 2 us each; this is what bounded drawing 10 M nodes' edges)."""
    q = np.ascontiguousarray(q, dtype=np.float64)
    out = np.empty(len(q), dtype=np.int64)
    if len(a) == 0 or len(q) == 0:
        out[:] = 0
        return out
    _searchsorted_guided(a, guide, q, out)
    return out


def _sbm_model(rng: np.random.Generator, num_nodes: int, num_classes: int, power: float) -> _SBMModel:
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
    return _SBMModel(n, c, y, order, class_start, cum_all, cum_sorted, seg_lo, seg_w)


def _sbm_edge_chunks(rng: np.random.Generator, model: _SBMModel, m_total: int, p_in: float):
    """Yield the drawn (source, destination) pairs chunk by chunk (int32 ids when N fits)."""
    n, y = model.n, model.y
    idt = np.int32 if n < 2**31 else np.int64
    for start in range(0, m_total, _EDGE_CHUNK):
        m = min(_EDGE_CHUNK, m_total - start)
        src = _searchsorted_right(model.cum_all, model.guide_all, rng.random(m) * model.cum_all[-1])
        src = np.minimum(src, n - 1)
        inside = rng.random(m) < p_in
        dst = np.empty(m, dtype=np.int64)
        k = int(inside.sum())
        cls = y[src[inside]]
        u = model.seg_lo[cls] + rng.random(k) * model.seg_w[cls]
        pos = _searchsorted_right(model.cum_sorted, model.guide_sorted, u)
        pos = np.clip(pos, model.class_start[cls], model.class_start[cls + 1] - 1)
        dst[inside] = model.order[pos]
        out = ~inside
        d_out = _searchsorted_right(model.cum_all, model.guide_all, rng.random(m - k) * model.cum_all[-1])
        dst[out] = np.minimum(d_out, n - 1)
        yield src.astype(idt), dst.astype(idt)


def _sbm_feature_chunks(rng: np.random.Generator, y: np.ndarray, num_classes: int, num_features: int,
                        feature_signal: float):
    """Yield ``(start, stop, rows)``: float32 feature rows, a class centroid plus unit noise."""
    n = len(y)
    centroids = rng.standard_normal((num_classes, num_features)).astype(np.float32)
    for start in range(0, n, _FEATURE_ROWS):
        stop = min(n, start + _FEATURE_ROWS)
        block = np.empty((stop - start, num_features), dtype=np.float32)
        block[...] = feature_signal * centroids[y[start:stop]]
        block += rng.standard_normal((stop - start, num_features), dtype=np.float32)
        yield start, stop, block


def _sbm_masks(rng: np.random.Generator, y: np.ndarray, num_classes: int, train_per_class: int,
               val_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(y)
    perm = rng.permutation(n)
    train_mask = np.zeros(n, dtype=bool)
    for cl in range(num_classes):
        members = perm[y[perm] == cl]
        train_mask[members[:train_per_class]] = True
    rest = perm[~train_mask[perm]]
    n_val = round(val_fraction * n)
    val_mask = np.zeros(n, dtype=bool)
    val_mask[rest[:n_val]] = True
    test_mask = ~(train_mask | val_mask)
    return train_mask, val_mask, test_mask


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
    progress: bool | None = None,
) -> GraphDataset:
    """Degree-skewed stochastic block model with class-correlated features (deterministic per seed).

    Everything is built in memory (peak about ``4 N F + 57 E_drawn`` bytes; 3.4 GiB for
    ``synthetic:2000000:0:products``). :func:`synthetic_sbm_to_dir` writes the byte-identical
    dataset straight to a memory-mappable directory with bounded memory.

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
        progress: tqdm bars on stderr while the edges and the features are drawn (``None``: only on a
            terminal); every step also logs a line with its time (logger ``kernels.datasets``), the CSR
            build (one SciPy conversion, no bar) a line before it starts.
    """
    if num_nodes < num_classes * 2:
        raise ValueError(f"num_nodes={num_nodes} is too small for {num_classes} classes")
    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    model = _sbm_model(rng, num_nodes, num_classes, power)
    n, c, y = model.n, model.c, model.y
    m_total = round(n * avg_degree / 2)  # undirected edges to draw
    log.info("synthetic %d nodes: drawing %d edges ...", n, m_total)
    srcs, dsts = [], []
    with _bar(m_total, "draw edges", progress, "edge") as bar:
        for src, dst in _sbm_edge_chunks(rng, model, m_total, p_in):
            srcs.append(src)
            dsts.append(dst)
            bar.update(len(src))
    del model
    src = np.concatenate(srcs) if srcs else np.zeros(0, dtype=np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, dtype=np.int64)
    del srcs, dsts
    t_graph = time.perf_counter()
    log.info("synthetic %d nodes: %d edges drawn in %.1f s; building the CSR graph (both directions, "
             "deduplicated) ...", n, m_total, t_graph - t_start)
    graph = CSRGraph.from_edge_index(np.stack([src, dst]), num_nodes=n, symmetrize=True, remove_self_loops=True)
    del src, dst
    built = time.perf_counter() - t_graph
    log.info("synthetic graph: %d nodes, %d edges drawn, CSR of %d edges built in %.1f s", n, m_total,
             graph.num_edges, built)

    t_feat = time.perf_counter()
    x = np.empty((n, num_features), dtype=np.float32)
    with _bar(n, "features", progress, "node") as bar:
        for start, stop, block in _sbm_feature_chunks(rng, y, c, num_features, feature_signal):
            x[start:stop] = block
            bar.update(stop - start)
    train_mask, val_mask, test_mask = _sbm_masks(rng, y, c, train_per_class, val_fraction)
    log.info("synthetic %d nodes: features %d x %d, labels and splits drawn in %.1f s", n, n, num_features,
             time.perf_counter() - t_feat)
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


# --------------------------------------------------------------------------- synthetic, out of core
# synthetic_sbm_to_dir draws exactly what synthetic_sbm draws, in the same order, but never holds
# the edge list or the feature matrix: edges go to a spill file as they are drawn (their endpoint
# counts, self-loops left out, give every row's size before deduplication), features go to x.npy
# row chunk by row chunk, and the CSR is built by row blocks that fit a memory budget: for each
# block the spill file is read once, both directions of every edge that ends in the block are
# scattered into the block's rows, every row is sorted and deduplicated, and the compacted block is
# appended to indices.npy. That is the CSR from_edge_index(symmetrize=True, remove_self_loops=True)
# builds: row i holds every j != i with (i, j) or (j, i) drawn, sorted, once, and no weights.


@numba.njit(cache=True, nogil=True)
def _count_endpoints(src, dst, counts):  # pragma: no cover - compiled
    for e in range(len(src)):
        s = src[e]
        d = dst[e]
        if s != d:
            counts[s] += 1
            counts[d] += 1


@numba.njit(cache=True, nogil=True, parallel=True)
def _scatter_block(src, dst, bounds, r0, cursor, buf):  # pragma: no cover - compiled
    # bounds: absolute row boundaries splitting the block [r0, r1) between threads; a thread scans
    # every edge but writes only rows of its own part, so no two threads touch the same slot
    for t in numba.prange(len(bounds) - 1):
        lo = bounds[t]
        hi = bounds[t + 1]
        for e in range(len(src)):
            s = src[e]
            d = dst[e]
            if s == d:
                continue
            if s >= lo and s < hi:
                k = s - r0
                buf[cursor[k]] = d
                cursor[k] += 1
            if d >= lo and d < hi:
                k = d - r0
                buf[cursor[k]] = s
                cursor[k] += 1


@numba.njit(cache=True, nogil=True, parallel=True)
def _sort_unique_rows(buf, ptr, out_len):  # pragma: no cover - compiled
    for i in numba.prange(len(ptr) - 1):
        a = ptr[i]
        b = ptr[i + 1]
        if b - a < 2:
            out_len[i] = b - a
            continue
        row = buf[a:b]
        row.sort()
        w = a + 1
        for j in range(a + 1, b):
            if buf[j] != buf[w - 1]:
                buf[w] = buf[j]
                w += 1
        out_len[i] = w - a


@numba.njit(cache=True, nogil=True)
def _compact_rows(buf, ptr, out_len):  # pragma: no cover - compiled
    w = 0
    for i in range(len(ptr) - 1):
        a = ptr[i]
        k = out_len[i]
        if w != a:
            for j in range(k):
                buf[w + j] = buf[a + j]
        w += k
    return w


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The header ``np.save`` writes for a C-ordered array of ``shape`` and ``dtype``."""
    bio = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        bio, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape})
    return bio.getvalue()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bar(total: int, desc: str, progress: bool | None, unit: str = "it"):
    from tqdm.auto import tqdm

    # progress=None: a bar only on a terminal (tqdm's own rule for disable=None), and none under TQDM_DISABLE
    # (`gnnserve serve --no-progress` sets it; an explicit disable= wins over tqdm's own reading of it)
    if progress is None and os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes"):
        progress = False
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False,
                disable=None if progress is None else not progress)


def _synthetic_params(num_nodes: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument of :func:`synthetic_sbm` that changes its output, with the generator version."""
    import inspect

    sig = inspect.signature(synthetic_sbm)
    params: dict[str, Any] = {"version": _SYNTHETIC_VERSION, "num_nodes": int(num_nodes),
                              "edge_chunk": _EDGE_CHUNK, "feature_rows": _FEATURE_ROWS}
    for k, p in sig.parameters.items():
        if k in ("num_nodes", "name", "progress"):  # the output does not depend on them
            continue
        v = kwargs.get(k, p.default)
        params[k] = float(v) if isinstance(p.default, float) else int(v)
    unknown = set(kwargs) - set(sig.parameters) - {"name"}
    if unknown:
        raise TypeError(f"unknown synthetic_sbm arguments {sorted(unknown)}")
    return params


def synthetic_sbm_to_dir(
    directory: str | os.PathLike[str],
    num_nodes: int = 2000,
    *,
    memory_budget: int = 1 << 30,
    progress: bool | None = False,
    **kwargs: Any,
) -> Path:
    """Write :func:`synthetic_sbm`'s dataset straight to a dataset directory, out of core.

    The result, opened with :meth:`GraphDataset.load_dir`, is byte-identical to
    ``synthetic_sbm(num_nodes, **kwargs)`` (arrays, fingerprints and the ``.npy`` files
    :meth:`GraphDataset.save` writes), but memory stays bounded: the node arrays (about 60 bytes
    per node while edges are drawn), one edge chunk, and one CSR row block of at most
    ``memory_budget`` bytes (one row larger than that is a block of its own). The drawn edges are
    spilled to a temporary file (8 bytes per edge) beside the directory.

    The directory appears only when complete: everything is written to a temporary sibling
    (``.NAME.tmp-PID``), synced, and renamed. A directory that already holds this dataset (same
    generator arguments, recorded in ``dataset.json``) is returned as it is; a leftover temporary
    directory of a process that died is removed; two processes asking for the same directory
    take turns (a lock file beside it), the second reuses the first's result.

    Args:
        directory: the dataset directory to create.
        num_nodes, **kwargs: as for :func:`synthetic_sbm` (``name`` included).
        memory_budget: bytes for one CSR row block (the edge spill is re-read once per block).
        progress: tqdm bars on stderr (``None``: only on a terminal).

    Raises:
        DatasetError: ``directory`` exists but holds something else.
    """
    import fcntl

    d = Path(directory)
    num_classes = int(kwargs.get("num_classes", 5))
    if num_nodes < num_classes * 2:
        raise ValueError(f"num_nodes={num_nodes} is too small for {num_classes} classes")
    params = _synthetic_params(num_nodes, kwargs)
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f".{d.name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _synthetic_dir_matches(d, params):
            log.info("synthetic dataset %s already complete, reused", d)
            return d
        if d.exists():
            raise DatasetError(f"{d} exists and does not hold this synthetic dataset "
                               f"({params}); remove it or choose another directory")
        remove_stale_tmp(d.parent, f".{d.name}", "an interrupted generation")
        tmp = d.parent / f".{d.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            _write_synthetic(tmp, params, kwargs.get("name"), memory_budget, progress)
            for f in tmp.rglob("*"):
                if f.is_file():
                    fsync_path(f)
            for sub in (tmp / "graph", tmp):
                fsync_path(sub)
            tmp.rename(d)
            fsync_path(d.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return d


#: a temporary directory is left alone while anything in it changed this recently: its writer may run on
#: another host sharing the directory (a network volume), where its pid means nothing here
STALE_AFTER_S = 300.0


def remove_stale_tmp(parent: Path, name: str, what: str) -> int:
    """Remove ``parent/<name>.tmp-<pid>[-<more>]`` files and directories left by a writer killed mid-write
    (a clean failure removes its own): its pid is not a live process here and nothing in it changed for
    :data:`STALE_AFTER_S`. Names whose pid is not a number are not this code's and are kept. Returns how
    many were removed. ``what`` names the writer in the log line ("an interrupted PPR index build")."""
    removed = 0
    now = time.time()
    for stale in parent.glob(f"{glob_escape(name)}.tmp-*"):
        pid = stale.name[len(name) + len(".tmp-"):].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)) or now - _newest_mtime(stale) < STALE_AFTER_S:
            continue
        log.warning("removing %s, left by %s", stale, what)
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
        removed += 1
    return removed


def _newest_mtime(path: Path) -> float:
    """The latest modification time of ``path`` and, for a directory, of everything in it."""
    try:
        newest = path.lstat().st_mtime
        if path.is_dir() and not path.is_symlink():
            for p in path.rglob("*"):
                with contextlib.suppress(OSError):
                    newest = max(newest, p.lstat().st_mtime)
    except OSError:
        return time.time()  # vanished or unreadable: not this call's to judge
    return newest


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # another user's, or no pid at all: leave it
        return True
    return True


def _synthetic_dir_matches(d: Path, params: dict[str, Any]) -> bool:
    try:
        meta = json.loads((d / "dataset.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == _DIR_FORMAT and meta.get("generator") == params


def _write_synthetic(d: Path, params: dict[str, Any], name: str | None, memory_budget: int,
                     progress: bool | None) -> None:
    """The generation itself, into the (empty, temporary) directory ``d``."""
    n, c, seed = params["num_nodes"], params["num_classes"], params["seed"]
    f_dim = params["num_features"]
    stages: dict[str, float] = {}
    t_all = t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    model = _sbm_model(rng, n, c, params["power"])
    y = model.y
    idt = np.dtype(index_dtype_for(n))
    m_total = round(n * params["avg_degree"] / 2)

    # 1. edges: drawn chunk by chunk into the spill file, endpoint counts on the way
    counts = np.zeros(n, dtype=np.int64)
    spill = d / "edges.spill"
    chunk_sizes = []
    with open(spill, "wb") as fh, _bar(m_total, "draw edges", progress, "edge") as bar:
        for src, dst in _sbm_edge_chunks(rng, model, m_total, params["p_in"]):
            _count_endpoints(src, dst, counts)
            src.tofile(fh)
            dst.tofile(fh)
            chunk_sizes.append(len(src))
            bar.update(len(src))
    del model
    stages["draw_edges"] = time.perf_counter() - t0
    log.info("synthetic %d nodes: %d edges drawn and spilled (%.2f GiB) in %.1f s", n, m_total,
             spill.stat().st_size / 2**30, stages["draw_edges"])

    # 2. features, written row chunk by row chunk (the RNG draws them after the edges)
    t0 = time.perf_counter()
    gd = d / "graph"
    gd.mkdir()
    h_feat = hashlib.blake2b(digest_size=16)
    h_feat.update(f"x|{(n, f_dim)}|{np.dtype(np.float32).str}".encode())
    with open(d / "x.npy", "wb") as fh, _bar(n, "features", progress, "node") as bar:
        fh.write(npy_header((n, f_dim), np.float32))
        for start, stop, block in _sbm_feature_chunks(rng, y, c, f_dim, params["feature_signal"]):
            fh.write(memoryview(block).cast("B"))
            h_feat.update(memoryview(block).cast("B"))
            bar.update(stop - start)
    stages["features"] = time.perf_counter() - t0
    log.info("synthetic %d nodes: features %d x %d written in %.1f s", n, n, f_dim, stages["features"])

    # 3. labels and splits (the last RNG draws)
    t0 = time.perf_counter()
    train_mask, val_mask, test_mask = _sbm_masks(rng, y, c, params["train_per_class"], params["val_fraction"])
    _save_labels(d, y, train_mask, val_mask, test_mask)
    del train_mask, val_mask, test_mask
    stages["labels"] = time.perf_counter() - t0

    # 4. the CSR, by row blocks
    t0 = time.perf_counter()
    raw_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=raw_ptr[1:])
    del counts
    raw_total = int(raw_ptr[-1])
    budget = max(1, int(memory_budget) // idt.itemsize)
    indptr = np.zeros(n + 1, dtype=np.int64)
    header = npy_header((raw_total,), idt)
    threads = max(1, numba_threads())
    written = 0
    blocks = 0
    with open(gd / "indices.npy", "wb") as out, _bar(n, "build CSR", progress, "row") as bar:
        out.write(header)
        r0 = 0
        while r0 < n:
            r1 = int(np.searchsorted(raw_ptr, raw_ptr[r0] + budget, side="right")) - 1
            r1 = min(n, max(r1, r0 + 1))
            ptr = raw_ptr[r0:r1 + 1] - raw_ptr[r0]
            buf = np.empty(int(ptr[-1]), dtype=idt)
            cursor = ptr[:-1].copy()
            # thread boundaries at equal shares of the block's entries
            cuts = np.searchsorted(ptr, np.linspace(0, ptr[-1], threads + 1)[1:-1], side="left")
            bounds = np.concatenate([[r0], r0 + cuts, [r1]]).astype(np.int64)
            with open(spill, "rb") as fh:
                for m in chunk_sizes:
                    src = np.fromfile(fh, dtype=idt, count=m)
                    dst = np.fromfile(fh, dtype=idt, count=m)
                    _scatter_block(src, dst, bounds, np.int64(r0), cursor, buf)
            del src, dst, cursor
            out_len = np.empty(r1 - r0, dtype=np.int64)
            _sort_unique_rows(buf, ptr, out_len)
            kept = int(_compact_rows(buf, ptr, out_len))
            out.write(memoryview(buf[:kept]).cast("B"))
            np.cumsum(out_len, out=indptr[r0 + 1:r1 + 1])
            indptr[r0 + 1:r1 + 1] += written
            written += kept
            del buf, out_len
            blocks += 1
            bar.update(r1 - r0)
            r0 = r1
        final_header = npy_header((written,), idt)
        if len(final_header) != len(header):  # NumPy pads the header for growth: not expected
            raise AssertionError("npy header length changed with the array length")
        out.seek(0)
        out.write(final_header)
        out.truncate(len(final_header) + written * idt.itemsize)
    spill.unlink()
    del raw_ptr
    np.save(gd / "indptr.npy", indptr)
    stages["build_csr"] = time.perf_counter() - t0
    log.info("synthetic %d nodes: CSR of %d edges (%d entries before deduplication) built in %d row "
             "block(s) in %.1f s", n, written, raw_total, blocks, stages["build_csr"])

    # 5. fingerprints: the graph's (as CSRGraph.fingerprint hashes it) and the dataset's
    t0 = time.perf_counter()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{_GRAPH_FORMAT}|{n}|{written}|{idt.str}".encode())
    _hash_array(h, indptr)
    del indptr
    step = 1 << 24
    with open(gd / "indices.npy", "rb") as fh, _bar(written * idt.itemsize, "fingerprint", progress, "B") as bar:
        fh.seek(len(final_header))
        while chunk := fh.read(step):
            h.update(chunk)
            bar.update(len(chunk))
    graph_fp = h.hexdigest()
    h_ds = hashlib.blake2b(digest_size=16)
    h_ds.update(graph_fp.encode())
    h_ds.update(h_feat.hexdigest().encode())
    _hash_array(h_ds, np.ascontiguousarray(y, dtype=np.int64))
    stages["fingerprint"] = time.perf_counter() - t0
    graph_meta = {"format": _GRAPH_FORMAT, "num_nodes": n, "num_edges": written, "weighted": False,
                  "fingerprint": graph_fp}
    (gd / "graph.json").write_text(json.dumps(graph_meta, indent=2))
    stages["total"] = time.perf_counter() - t_all
    _write_dataset_meta(d, name or f"synthetic-sbm-{n}-s{seed}", c, {
        "generator": params, "fingerprint": h_ds.hexdigest(),
        "generate_times_s": {k: round(v, 3) for k, v in stages.items()}})
    log.info("synthetic %d nodes written to %s in %.1f s (%s)", n, d, stages["total"],
             ", ".join(f"{k} {v:.1f} s" for k, v in stages.items() if k != "total"))


def _synthetic_cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("GNNSERVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gnnserve"


def synthetic_cache_dir(num_nodes: int, cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Path:
    """Where :func:`load_dataset` keeps a synthetic dataset generated out of core:
    ``CACHE/datasets/NAME-KEY`` (``CACHE``: ``cache_dir``, else ``$GNNSERVE_CACHE``, else
    ``~/.cache/gnnserve``; ``KEY``: 12 hex digits of a hash of every generator argument and the
    generator version, so changed arguments never reuse a stale directory)."""
    params = _synthetic_params(num_nodes, kwargs)
    key = hashlib.blake2b(json.dumps(params, sort_keys=True).encode(), digest_size=6).hexdigest()
    name = kwargs.get("name") or f"synthetic-sbm-{int(num_nodes)}-s{params['seed']}"
    return _synthetic_cache_root(cache_dir) / "datasets" / f"{name}-{key}"


def synthetic_memory_estimate(num_nodes: int, **kwargs: Any) -> int:
    """Bytes :func:`synthetic_sbm` needs at its peak (fitted: 3.43 GiB measured at
    ``synthetic:2000000:0:products``): the features plus about 57 bytes per drawn edge."""
    p = _synthetic_params(num_nodes, kwargs)
    return int(4 * p["num_nodes"] * p["num_features"] + 57 * round(p["num_nodes"] * p["avg_degree"] / 2))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
