"""The CSR graph type every other part of gnnserve works on.

A :class:`CSRGraph` is a directed adjacency in compressed-sparse-row form: the out-edges of node
``i`` are ``indices[indptr[i]:indptr[i + 1]]`` with optional ``weights`` in the same slots. Row order
is the order the edges were given after sorting by (source, destination), so every row is sorted by
destination id; all code that samples edges by position (ES-SpMM) depends on that order being
deterministic.

Storage choices:

* ``indptr`` is always int64 (edge counts of large graphs pass 2**31).
* ``indices`` is int32 when the node count fits, else int64: half the memory and bandwidth.
* ``weights`` is float32 or ``None`` (an unweighted graph: every edge weighs 1).

Graphs can be saved to a directory of ``.npy`` files and opened memory-mapped, so a server (or
several server processes on one host) maps a large graph instead of copying it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["CSRGraph", "GraphFormatError", "gather_ranges", "index_dtype_for"]

_FORMAT = "gnnserve.csr/1"
_INT32_MAX = np.iinfo(np.int32).max


class GraphFormatError(ValueError):
    """A graph's arrays are inconsistent (shapes, dtypes, ids out of range) or a stored graph is damaged."""


def index_dtype_for(num_nodes: int) -> np.dtype:
    """int32 when every node id fits in it, else int64."""
    return np.dtype(np.int32) if num_nodes <= _INT32_MAX else np.dtype(np.int64)


@dataclass(eq=False)
class CSRGraph:
    """Directed graph in CSR form (see the module docstring for the storage contract).

    Attributes:
        indptr: int64 ``[N + 1]``, ``indptr[0] == 0``, non-decreasing, ``indptr[N] == E``.
        indices: int32/int64 ``[E]``, destination ids in ``[0, N)``, sorted inside each row.
        weights: float32 ``[E]`` or ``None`` for an unweighted graph.
        num_nodes: ``N``.
    """

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray | None = None
    num_nodes: int = -1
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_nodes < 0:
            self.num_nodes = len(self.indptr) - 1
        if self.indptr.ndim != 1 or len(self.indptr) != self.num_nodes + 1:
            raise GraphFormatError(
                f"indptr must have num_nodes + 1 = {self.num_nodes + 1} entries, got shape {self.indptr.shape}"
            )
        if self.indptr.dtype != np.int64:
            self.indptr = self.indptr.astype(np.int64)
        if self.indices.ndim != 1:
            raise GraphFormatError(f"indices must be 1-D, got shape {self.indices.shape}")
        want = index_dtype_for(self.num_nodes)
        if self.indices.dtype.kind not in "iu":
            raise GraphFormatError(f"indices must be integers, got {self.indices.dtype}")
        if self.indices.dtype != want:
            self.indices = self.indices.astype(want)
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != len(self.indices):
            raise GraphFormatError(
                f"indptr must start at 0 and end at len(indices) = {len(self.indices)}, "
                f"got {int(self.indptr[0])} .. {int(self.indptr[-1])}"
            )
        if self.weights is not None:
            if self.weights.shape != self.indices.shape:
                raise GraphFormatError(
                    f"weights must match indices: {self.weights.shape} != {self.indices.shape}"
                )
            if self.weights.dtype != np.float32:
                self.weights = self.weights.astype(np.float32)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_edge_index(
        cls,
        edge_index: np.ndarray,
        num_nodes: int | None = None,
        weights: np.ndarray | None = None,
        *,
        symmetrize: bool = False,
        remove_self_loops: bool = False,
    ) -> CSRGraph:
        """Build a CSR graph from a ``[2, E]`` (source, destination) edge list.

        Duplicate edges are merged (weights summed; an unweighted graph stays unweighted). With
        ``symmetrize`` every edge is added in both directions (a weight is kept per direction, and
        an edge given both ways keeps the larger weight). No Python loop runs over edges: the work
        is SciPy's COO -> CSR conversion, O(E) plus a sort inside each row.
        """
        ei = np.asarray(edge_index)
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise GraphFormatError(f"edge_index must have shape [2, E], got {ei.shape}")
        if ei.dtype.kind not in "iu":
            raise GraphFormatError(f"edge_index must hold integers, got {ei.dtype}")
        src, dst = ei[0], ei[1]
        if num_nodes is None:
            num_nodes = int(ei.max()) + 1 if ei.size else 0
        if ei.size:
            lo, hi = int(ei.min()), int(ei.max())
            if lo < 0 or hi >= num_nodes:
                raise GraphFormatError(f"edge_index ids must lie in [0, {num_nodes}), found {lo} .. {hi}")
        idt = index_dtype_for(num_nodes)
        src = src.astype(idt, copy=False)
        dst = dst.astype(idt, copy=False)
        w = None if weights is None else np.asarray(weights, dtype=np.float32)
        if w is not None and w.shape != (ei.shape[1],):
            raise GraphFormatError(f"weights must have shape [E] = [{ei.shape[1]}], got {w.shape}")
        if remove_self_loops and ei.size:
            keep = src != dst
            src, dst = src[keep], dst[keep]
            w = None if w is None else w[keep]
        data = np.ones(len(src), dtype=np.float32) if w is None else w
        mat = sp.csr_matrix((data, (src, dst)), shape=(num_nodes, num_nodes))
        if symmetrize:
            mat = mat.maximum(mat.T.tocsr()) if w is not None else (mat + mat.T).tocsr()
        mat.sum_duplicates()  # also sorts the indices of every row
        return cls.from_scipy(mat, weighted=w is not None)

    @classmethod
    def from_scipy(cls, mat: sp.spmatrix | sp.sparray, *, weighted: bool = True) -> CSRGraph:
        """Wrap a SciPy sparse matrix (converted to canonical CSR); ``weighted=False`` drops values."""
        m = sp.csr_matrix(mat)
        if m.shape[0] != m.shape[1]:
            raise GraphFormatError(f"adjacency must be square, got {m.shape}")
        if not m.has_canonical_format:
            m.sum_duplicates()
        n = m.shape[0]
        return cls(
            indptr=m.indptr.astype(np.int64, copy=False),
            indices=m.indices.astype(index_dtype_for(n), copy=False),
            weights=m.data.astype(np.float32, copy=False) if weighted else None,
            num_nodes=n,
        )

    # ------------------------------------------------------------------ basic properties
    @property
    def num_edges(self) -> int:
        return len(self.indices)

    @property
    def degrees(self) -> np.ndarray:
        """Out-degree (row nnz) of every node, int64 ``[N]`` (cached)."""
        d = self._cache.get("degrees")
        if d is None:
            d = np.diff(self.indptr)
            self._cache["degrees"] = d
        return d

    def degrees_of(self, nodes: np.ndarray) -> np.ndarray:
        """int64: the row lengths of ``nodes`` (O(len(nodes)), where :attr:`degrees` is an O(N) pass on the
        first read of a graph, as each update of a live graph makes a new one)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        return (self.indptr[nodes + 1] - self.indptr[nodes]).astype(np.int64, copy=False)

    @property
    def max_degree(self) -> int:
        """The largest row nnz (0 without nodes), cached; an edit carries it over where it can
        (:func:`kernels.graph_edit.apply_edit`)."""
        m = self._cache.get("max_degree")
        if m is None:
            m = int(self.degrees.max()) if self.num_nodes else 0
            self._cache["max_degree"] = m
        return m

    @property
    def is_weighted(self) -> bool:
        return self.weights is not None

    def edge_weights(self) -> np.ndarray:
        """Weights as an array even for an unweighted graph (ones)."""
        return self.weights if self.weights is not None else np.ones(self.num_edges, dtype=np.float32)

    def neighbors(self, node: int) -> np.ndarray:
        return self.indices[self.indptr[node] : self.indptr[node + 1]]

    def neighbors_of(self, nodes: np.ndarray) -> np.ndarray:
        """int64: the neighbours of every node of ``nodes``, row after row (repeats kept)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if not len(nodes):
            return np.zeros(0, dtype=np.int64)
        starts = self.indptr[nodes]
        _, idx = gather_ranges(starts, self.indptr[nodes + 1] - starts)
        return np.asarray(self.indices[idx], dtype=np.int64)

    def row_ids(self) -> np.ndarray:
        """Source node of every edge slot (the COO row array), int ``[E]``."""
        return np.repeat(np.arange(self.num_nodes, dtype=self.indices.dtype), self.degrees)

    def edge_index(self) -> np.ndarray:
        """``[2, E]`` int64 edge list in CSR order."""
        return np.stack([self.row_ids().astype(np.int64), self.indices.astype(np.int64)])

    def to_scipy(self) -> sp.csr_matrix:
        return sp.csr_matrix((self.edge_weights(), self.indices, self.indptr), shape=(self.num_nodes,) * 2)

    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.indices.nbytes + (0 if self.weights is None else self.weights.nbytes))

    def __repr__(self) -> str:
        w = "weighted" if self.is_weighted else "unweighted"
        return f"CSRGraph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, {w}, indices={self.indices.dtype})"

    def validate(self) -> None:
        """Full O(E) check of the invariants (monotone indptr, ids in range, sorted rows)."""
        if np.any(np.diff(self.indptr) < 0):
            raise GraphFormatError("indptr is not non-decreasing")
        if self.num_edges:
            lo, hi = int(self.indices.min()), int(self.indices.max())
            if lo < 0 or hi >= self.num_nodes:
                raise GraphFormatError(f"indices must lie in [0, {self.num_nodes}), found {lo} .. {hi}")
            step = np.diff(self.indices.astype(np.int64))
            row_start = np.zeros(self.num_edges, dtype=bool)
            row_start[self.indptr[:-1][self.degrees > 0]] = True
            if np.any((step < 0) & ~row_start[1:]):
                raise GraphFormatError("indices are not sorted inside every row")
        if self.weights is not None and not np.all(np.isfinite(self.weights)):
            raise GraphFormatError("weights contain NaN or infinity")

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """Content hash (hex, 16 bytes of BLAKE2b) of the topology and weights; cached.

        Two graphs with the same fingerprint have the same nodes, edges, edge order and weights, so
        anything keyed by it (PPR index files, Redis keys, checkpoints) can never mix two graphs.
        """
        fp = self._cache.get("fingerprint")
        if fp is None:
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{_FORMAT}|{self.num_nodes}|{self.num_edges}|{self.indices.dtype.str}".encode())
            for arr in (self.indptr, self.indices) + (() if self.weights is None else (self.weights,)):
                _hash_array(h, arr)
            fp = h.hexdigest()
            self._cache["fingerprint"] = fp
        return fp

    # ------------------------------------------------------------------ storage
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``indptr.npy``, ``indices.npy``, (``weights.npy``) and ``graph.json`` to a directory."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "indptr.npy", np.ascontiguousarray(self.indptr))
        np.save(d / "indices.npy", np.ascontiguousarray(self.indices))
        if self.weights is not None:
            np.save(d / "weights.npy", np.ascontiguousarray(self.weights))
        elif (d / "weights.npy").exists():
            (d / "weights.npy").unlink()
        meta = {
            "format": _FORMAT,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "weighted": self.is_weighted,
            "fingerprint": self.fingerprint(),
        }
        tmp = d / "graph.json.tmp"
        tmp.write_text(json.dumps(meta, indent=2))
        tmp.replace(d / "graph.json")  # the metadata lands last: a half-written graph has none
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, mmap: bool = True, verify: bool = False) -> CSRGraph:
        """Open a graph written by :meth:`save`; ``mmap=True`` maps the arrays read-only (no copy).

        ``verify=True`` recomputes the fingerprint and checks it against the stored one.
        """
        d = Path(directory)
        meta_path = d / "graph.json"
        if not meta_path.exists():
            raise GraphFormatError(f"{d} holds no graph.json: not a saved graph (or an interrupted save)")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != _FORMAT:
            raise GraphFormatError(f"{d}: unknown graph format {meta.get('format')!r}, expected {_FORMAT!r}")
        mode = "r" if mmap else None
        try:
            indptr = np.load(d / "indptr.npy", mmap_mode=mode)
            indices = np.load(d / "indices.npy", mmap_mode=mode)
            weights = np.load(d / "weights.npy", mmap_mode=mode) if meta["weighted"] else None
        except (OSError, ValueError) as exc:
            raise GraphFormatError(f"{d}: cannot read graph arrays: {exc}") from exc
        if len(indptr) != meta["num_nodes"] + 1 or len(indices) != meta["num_edges"]:
            raise GraphFormatError(
                f"{d}: arrays do not match graph.json (nodes {len(indptr) - 1} vs {meta['num_nodes']}, "
                f"edges {len(indices)} vs {meta['num_edges']})"
            )
        g = cls(indptr=indptr, indices=indices, weights=weights, num_nodes=int(meta["num_nodes"]))
        if verify:
            stored = meta["fingerprint"]
            if g.fingerprint() != stored:
                raise GraphFormatError(f"{d}: fingerprint mismatch ({g.fingerprint()} != stored {stored})")
        else:
            g._cache["fingerprint"] = meta["fingerprint"]
        return g

    # ------------------------------------------------------------------ derived graphs
    def with_self_loops_removed(self) -> CSRGraph:
        m = self.to_scipy()
        m.setdiag(0)
        m.eliminate_zeros()
        return CSRGraph.from_scipy(m, weighted=self.is_weighted)

    def reverse(self) -> CSRGraph:
        """The transposed graph (in-edges become out-edges)."""
        return CSRGraph.from_scipy(self.to_scipy().T.tocsr(), weighted=self.is_weighted)

    def cache(self) -> dict[str, Any]:
        """Per-graph memo for derived data (torch views, normalisation vectors, ...)."""
        return self._cache


def gather_ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr int64 [n + 1], positions int64 [sum(lengths)])``: the ranges ``starts[i] ..
    starts[i] + lengths[i] - 1`` concatenated, and their CSR offsets (slices of CSR-shaped arrays
    gathered without a Python loop)."""
    ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    pos = np.repeat(np.asarray(starts, dtype=np.int64) - ptr[:-1], lengths) + np.arange(int(ptr[-1]), dtype=np.int64)
    return ptr, pos


def _hash_array(h: Any, arr: np.ndarray, chunk: int = 1 << 24) -> None:
    a = np.ascontiguousarray(arr)
    flat = a.reshape(-1).view(np.uint8)
    for start in range(0, len(flat), chunk):
        h.update(memoryview(flat[start : start + chunk]))
