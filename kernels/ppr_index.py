"""The offline top-K PPR index: every node's list on disk, memory-mapped (:class:`PPRIndex`).

An index holds the lists :func:`kernels.ppr_push.ppr_topk` computes for every node of one graph
under one :class:`kernels.ppr_push.PPRConfig` (see :mod:`kernels.ppr` for the push and its bound),
CSR-shaped. Saved, it is a directory ``ppr-<graph fingerprint>-<config key>`` holding
``meta.json``, ``ptr.npy`` (int64 ``[N + 1]``), ``nodes.bin`` (int32 or int64 ``[nnz]``) and
``scores.bin`` (float32 ``[nnz]``), and, once :meth:`PPRIndex.ensure_induced` has built it, the
induced subgraph of every list (:class:`kernels.subgraph.InducedTable`: ``induced_eptr.npy``,
``induced_src.bin``, ``induced_dst.bin``, ``induced_w.bin`` on a weighted graph; recorded under
``"induced"`` in ``meta.json``). :meth:`PPRIndex.open_or_build` builds into a temporary
directory renamed into place; the induced files and ``meta.json`` are written under names unique
to their writer and renamed into place, so servers sharing one index may attach a table at once.
Whoever writes into a saved index's directory holds a shared ``flock`` on it (:func:`writing_into`), and
whoever removes one (:func:`remove_index_dir`: a compaction dropping an earlier snapshot's lists,
:func:`remove_orphan_indexes`) takes it exclusively without waiting and moves the directory away
before deleting it: a directory is never deleted under its writer, and a writer that finds its
directory gone keeps what it built in memory instead of leaving files in a directory without
``meta.json`` behind.

A server whose graph takes updates also keeps the lists' inverse beside them
(:meth:`PPRIndex.ensure_inverse`: ``inverse_ptr.npy``, int64 ``[N + 1]``, and ``inverse_pos.bin``,
the positions in ``nodes.bin`` holding each node, int32 below ``2^31`` entries): the live index
(:mod:`kernels.ppr_live`) looks up which lists hold an edited node in it. Built once (a counting
sort over every entry: 4.4 s for the 128 M entries of a 2 M-node index on 2 cores) and then
memory-mapped, so a server's first update neither waits for it nor holds it in its own memory.
"""

# numba cache key: datasets dd10b366f7b3, ppr_push 9fa4796b3dd5, subgraph 47e999493df1

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np

from .datasets import pid_alive, remove_stale_tmp
from .graph import CSRGraph, gather_ranges, index_dtype_for
from .ppr_push import _ALGO_VERSION, PPRConfig, _compact, _give_dense, _run_batch, _take_dense
from .subgraph import InducedTable, SubgraphBatch, induced_batch
from .threads import numba_threads

__all__ = ["PPRIndex", "PPRIndexError", "inverse_lists", "remove_index_dir", "remove_orphan_indexes", "writing_into"]

log = logging.getLogger(__name__)

_FORMAT = "gnnserve.ppr/1"


@numba.njit(cache=True, nogil=True)
def _inverse_csr(nodes, n, pos):  # pragma: no cover - compiled
    """Counting sort: ``ptr int64 [n + 1]``, with ``pos`` (``len(nodes)`` entries, int32 or int64)
    filled so that the positions holding node ``v`` are ``pos[ptr[v]:ptr[v + 1]]`` in increasing order."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(nodes.shape[0]):
        ptr[nodes[i] + 1] += 1
    for v in range(n):
        ptr[v + 1] += ptr[v]
    fill = ptr[:-1].copy()
    for i in range(nodes.shape[0]):
        v = nodes[i]
        pos[fill[v]] = i
        fill[v] += 1
    return ptr


def inverse_lists(nodes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of CSR lists over ``n`` nodes: ``(ptr int64 [n + 1], pos)``, the positions in ``nodes``
    holding node ``v`` being ``pos[ptr[v]:ptr[v + 1]]`` in increasing order (``pos`` int32 below ``2^31``
    entries, else int64)."""
    pos = np.empty(len(nodes), dtype=index_dtype_for(len(nodes)))
    return _inverse_csr(nodes, int(n), pos), pos


def _unwrapped(a: np.ndarray) -> np.ndarray:
    """A plain ndarray view of a memory map (the same pages): every index or slice of an
    ``np.memmap`` builds another memmap, a few microseconds each on a one-node lookup."""
    return np.asarray(a)


def _read_ahead(arrays: list[np.ndarray | None]) -> int:
    """Read the memory maps behind ``arrays`` into the page cache now: one byte per page, in order
    (the kernel's sequential readahead does the rest), after ``madvise(MADV_WILLNEED)`` where the
    platform has it. Returns the bytes read (0 for arrays held in memory)."""
    import mmap

    advice = getattr(mmap, "MADV_WILLNEED", None)
    page = mmap.PAGESIZE
    total = 0
    seen: set[int] = set()
    for a in arrays:
        b: object = a
        while b is not None and not isinstance(b, mmap.mmap):
            b = getattr(b, "base", None)
        if not isinstance(b, mmap.mmap) or id(b) in seen or len(b) == 0:
            continue
        seen.add(id(b))
        if advice is not None:
            try:
                b.madvise(advice)
            except (OSError, ValueError):  # only a hint
                pass
        np.frombuffer(b, dtype=np.uint8)[::page].sum()  # touch every page
        total += len(b)
    return total


class PPRIndexError(ValueError):
    """A PPR index file is damaged, or it was built for another graph or configuration."""


def _fingerprint_of(graph_or_fp: CSRGraph | str) -> str:
    return graph_or_fp.fingerprint() if isinstance(graph_or_fp, CSRGraph) else str(graph_or_fp)


class PPRIndex:
    """Top-K PPR lists of every node of one graph under one :class:`PPRConfig`, CSR-shaped.

    Attributes:
        config: the parameters it was built with (``config.topk`` = ``k_max``).
        fingerprint: :meth:`CSRGraph.fingerprint` of the graph it belongs to.
        num_nodes: ``N``.
        ptr: int64 ``[N + 1]``; nodes/scores of node ``v`` are ``[ptr[v]:ptr[v + 1]]``.
        nodes: int32/int64 ``[nnz]`` (node ``v`` first in its own list, then decreasing score).
        scores: float32 ``[nnz]``.
        path: directory it was loaded from (``None`` for an unsaved index).
    """

    def __init__(
        self,
        config: PPRConfig,
        fingerprint: str,
        ptr: np.ndarray,
        nodes: np.ndarray,
        scores: np.ndarray,
        *,
        path: Path | None = None,
        meta: dict[str, Any] | None = None,
        drift: np.ndarray | None = None,
    ) -> None:
        self.config = config
        #: per list, the bound of its move accumulated since it was pushed (float64 ``[N]``): the state of a
        #: live index (:class:`kernels.ppr_live.LivePPRIndex`) that a compaction saves with its lists, so that a
        #: start from the snapshot recomputes after later edits exactly the lists the serving writer does; None
        #: for lists as pushed (all 0)
        self.drift = drift
        self.fingerprint = fingerprint
        self.ptr = ptr
        self.nodes = nodes
        self.scores = scores
        self.num_nodes = len(ptr) - 1
        self.path = path
        self.meta = dict(meta or {})
        self.induced: InducedTable | None = None  # see ensure_induced
        self.inverse: tuple[np.ndarray, np.ndarray] | None = None  # see ensure_inverse
        if len(nodes) != int(ptr[-1]) or len(scores) != len(nodes):
            raise PPRIndexError(
                f"index arrays disagree: ptr ends at {int(ptr[-1])}, {len(nodes)} nodes, {len(scores)} scores"
            )
        if drift is not None and np.shape(drift) != (self.num_nodes,):
            raise PPRIndexError(f"drift has shape {np.shape(drift)}, expected ({self.num_nodes},)")

    # ------------------------------------------------------------------ properties
    @property
    def k_max(self) -> int:
        """Largest list length stored (= ``config.topk``); any ``k <= k_max`` is served by slicing."""
        return self.config.topk

    def __len__(self) -> int:
        return self.num_nodes

    def __repr__(self) -> str:
        return (
            f"PPRIndex(N={self.num_nodes}, k_max={self.k_max}, nnz={len(self.nodes)}, "
            f"alpha={self.config.alpha}, eps={self.config.eps}, lazy={self.config.lazy}, "
            f"graph={self.fingerprint[:12]}, path={self.path})"
        )

    def check_graph(self, graph: CSRGraph | str) -> None:
        """Raise :class:`PPRIndexError` unless the index was built for this graph (fingerprint)."""
        fp = _fingerprint_of(graph)
        if fp != self.fingerprint:
            raise PPRIndexError(
                f"PPR index was built for graph {self.fingerprint} but is used with graph {fp}; "
                "rebuild it (PPRIndex.open_or_build) for this graph"
            )

    # ------------------------------------------------------------------ lookup
    def lookup(
        self, targets: np.ndarray | Sequence[int] | int, k: int | None = None, *, return_scores: bool = False
    ) -> tuple[np.ndarray, ...]:
        """The first ``k`` entries of each target's list (no recomputation), CSR-shaped.

        Returns ``(ptr int64 [B + 1], nodes int64 [ptr[-1]])`` and, with ``return_scores``, also
        ``scores float32 [ptr[-1]]``. Lists may be shorter than ``k`` (few reachable nodes, or the
        relative threshold). Vectorized: O(B + output).
        """
        k = self.k_max if k is None else int(k)
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k must lie in [1, k_max={self.k_max}], got {k}")
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        one = len(t) == 1
        if len(t) and not (0 <= int(t[0]) < self.num_nodes if one else
                           (int(t.min()) >= 0 and int(t.max()) < self.num_nodes)):
            raise ValueError(f"targets must lie in [0, {self.num_nodes}) (use ppr_new_node for new nodes)")
        if one and not return_scores:  # a one-node request: one slice, no gather
            v = int(t[0])
            lo = int(self.ptr[v])
            cnt = min(int(self.ptr[v + 1]) - lo, k)
            return np.array([0, cnt], dtype=np.int64), self.nodes[lo : lo + cnt].astype(np.int64)
        start = self.ptr[t]
        cnt = np.minimum(self.ptr[t + 1] - start, k)
        optr, idx = gather_ranges(start, cnt)
        nodes = self.nodes[idx].astype(np.int64)
        if return_scores:
            return optr, nodes, np.asarray(self.scores[idx], dtype=np.float32)
        return optr, nodes

    # ------------------------------------------------------------------ induced subgraphs
    def induced_batch(
        self, graph: CSRGraph, targets: np.ndarray | Sequence[int], k: int | None = None
    ) -> SubgraphBatch:
        """The block-diagonal batch of the targets' top-``k`` subgraphs (:func:`kernels.subgraph.induced_batch`).

        Served from the precomputed :class:`kernels.subgraph.InducedTable` when one covers ``k``
        (see :meth:`ensure_induced`), else induced from the graph; the result is the same.
        """
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        ptr, nodes = self.lookup(t, k)
        table = self.induced
        if table is not None and (self.k_max if k is None else int(k)) <= table.k:
            return table.batch(graph, t, ptr, nodes, checked=True)  # our own lists: nothing to check
        return induced_batch(graph, ptr, nodes)

    def prefetch(self) -> int:
        """Read the memory-mapped lists and induced table into the page cache now
        (:func:`_read_ahead`): a server over a large index otherwise pays a disk read on the first
        request that touches each page. Returns the bytes read."""
        t = self.induced
        return _read_ahead([self.ptr, self.nodes, self.scores,
                            *((t.eptr, t.src, t.dst, t.weights) if t is not None else ())])

    def ensure_induced(
        self, graph: CSRGraph, *, max_bytes: int = 1 << 30, k: int | None = None, progress: bool = False,
        stop: threading.Event | None = None, limit_name: str = "limit",
    ) -> bool:
        """Attach the induced subgraph of every node's top-``k`` list (default ``k_max``), building it if needed.

        A saved index keeps the table beside its lists (``induced_*`` files, recorded in
        ``meta.json``) and memory-maps it on later calls. Refused (``False``, logged) when the
        estimate from 256 sampled nodes exceeds ``max_bytes``: batches are then induced from the
        graph as before (the log line names the limit ``limit_name``, a server's flag). Returns whether a table is
        attached. ``stop`` (set from another thread)
        abandons a build between chunks (:class:`kernels.subgraph.BuildStopped`); lookups may run
        meanwhile: the table is attached in one assignment once complete.
        """
        self.check_graph(graph)
        k = self.k_max if k is None else int(k)
        if not 1 <= k <= min(self.k_max, InducedTable.MAX_K):
            raise ValueError(f"k must lie in [1, {min(self.k_max, InducedTable.MAX_K)}], got {k}")
        if self.open_saved_induced(k):
            return True
        n = self.num_nodes
        if n == 0:
            return False
        sample = np.random.default_rng(0).choice(n, size=min(n, 256), replace=False)
        ptr, nodes = self.lookup(sample, k)
        per_edge = 8 if graph.is_weighted else 4
        est = induced_batch(graph, ptr, nodes).graph.num_edges / len(sample) * n * per_edge + 8 * (n + 1)
        if est > max_bytes:
            log.info("induced table for k=%d skipped: about %.0f MiB > %s %.0f MiB (a larger one builds it)", k,
                     est / 2**20, limit_name, max_bytes / 2**20)  # fmt: skip
            return False
        t0 = time.perf_counter()
        log.info("building the induced table for k=%d of %d nodes (about %.0f MiB; saved beside the index)", k, n,
                 est / 2**20)
        table = InducedTable.build(graph, self.lookup, k, progress=progress, stop=stop)
        log.info("induced table for k=%d: %d edges, %.0f MiB in %.1f s", k, len(table.src), table.nbytes / 2**20,
                 time.perf_counter() - t0)  # fmt: skip
        if self.path is not None:
            try:
                with writing_into(self.path) as there:
                    if there:
                        self._save_induced(table)
                    else:  # a compaction replaced these lists (no start loads them): kept in memory only
                        log.info("induced table not saved: %s was removed (the lists of a replaced snapshot); "
                                 "it is kept in memory", self.path)
            except OSError as exc:  # a read-only index directory: keep the table in memory
                log.warning("induced table not saved in %s: %s", self.path, exc)
        self.induced = table
        return True

    def ensure_inverse(self) -> tuple[np.ndarray, np.ndarray]:
        """The lists' inverse, :func:`inverse_lists` of ``nodes`` (module docstring), attached as ``inverse``.

        A saved index keeps it beside its lists and memory-maps it on later calls; where the directory
        cannot be written it stays in memory (logged). Writers rename their files into place (the
        positions first, then ``inverse_ptr.npy``, whose presence marks a complete pair), so servers
        sharing one index may attach it at once."""
        if self.inverse is not None:
            return self.inverse
        loaded = self._open_inverse()
        if loaded is None:
            t0 = time.perf_counter()
            ptr, pos = inverse_lists(np.asarray(self.nodes), self.num_nodes)
            log.info("inverse of the PPR lists (%d entries) in %.1f s", len(pos), time.perf_counter() - t0)
            loaded = (ptr, pos)
            if self.path is not None:
                try:
                    with writing_into(self.path) as there:  # not into the lists of a replaced snapshot
                        if there:
                            _write_arrays(self.path, {"inverse_pos.bin": pos, "inverse_ptr.npy": ptr})
                            loaded = self._open_inverse() or loaded  # memory-mapped: the page cache holds it
                except OSError as exc:  # a read-only index directory: keep it in memory
                    log.warning("inverse of the PPR lists not saved in %s: %s", self.path, exc)
        self.inverse = loaded
        return loaded

    def _open_inverse(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.path is None or not (self.path / "inverse_ptr.npy").exists():
            return None
        d, nnz = self.path, len(self.nodes)
        dt = np.dtype(index_dtype_for(nnz))
        try:
            ptr = _unwrapped(np.load(d / "inverse_ptr.npy", mmap_mode="r"))
            if ptr.shape != (self.num_nodes + 1,) or int(ptr[-1]) != nnz:
                raise ValueError(f"inverse_ptr.npy has shape {ptr.shape}, expected ({self.num_nodes + 1},) ending at {nnz}")
            if (d / "inverse_pos.bin").stat().st_size != nnz * dt.itemsize:
                raise ValueError("inverse_pos.bin has the wrong size")
            pos = _unwrapped(np.memmap(d / "inverse_pos.bin", dtype=dt, mode="r", shape=(nnz,))) if nnz else np.zeros(0, dt)
            return ptr, pos
        except (OSError, ValueError) as exc:
            log.warning("ignoring the inverse of the PPR lists in %s (%s); it will be rebuilt", d, exc)
            return None

    _INDUCED_FILES = ("induced_src.bin", "induced_dst.bin", "induced_w.bin")

    def open_saved_induced(self, k: int | None = None) -> bool:
        """Attach the induced table saved beside the lists when it covers ``k`` (default ``k_max``), without building
        one; whether a table covering ``k`` is attached."""
        k = self.k_max if k is None else int(k)
        if self.induced is not None and self.induced.k >= k:
            return True
        loaded = self._open_induced()
        if loaded is not None and loaded.k >= k:
            self.induced = loaded
            return True
        return False

    def _save_induced(self, table: InducedTable) -> None:
        d = self.path
        assert d is not None
        arrays = {"induced_eptr.npy": table.eptr, "induced_src.bin": table.src, "induced_dst.bin": table.dst}
        if table.weights is not None:
            arrays["induced_w.bin"] = table.weights
        _write_arrays(d, arrays)
        meta = json.loads((d / "meta.json").read_text())
        meta["induced"] = {"k": table.k, "edges": len(table.src), "weighted": table.weights is not None}
        _write_meta(d, meta)
        self.meta = meta

    def _open_induced(self) -> InducedTable | None:
        if self.path is None or not (self.path / "meta.json").exists():  # none, or the directory was removed
            return None
        d = self.path
        try:
            info = json.loads((d / "meta.json").read_text()).get("induced")
            if not info:
                return None
            m = int(info["edges"])
            eptr = _unwrapped(np.load(d / "induced_eptr.npy", mmap_mode="r"))
            if eptr.shape != (self.num_nodes + 1,):
                raise ValueError(f"induced_eptr.npy has shape {eptr.shape}, expected ({self.num_nodes + 1},)")
            names = self._INDUCED_FILES if info["weighted"] else self._INDUCED_FILES[:2]
            dts = (np.uint16, np.uint16, np.float32)[: len(names)]
            for name, dt in zip(names, dts, strict=True):
                if (d / name).stat().st_size != m * np.dtype(dt).itemsize:
                    raise ValueError(f"{name} has the wrong size")
            arr = [_unwrapped(np.memmap(d / name, dtype=dt, mode="r", shape=(m,))) if m else np.zeros(0, dt)
                   for name, dt in zip(names, dts, strict=True)]  # fmt: skip
            return InducedTable(int(info["k"]), eptr, arr[0], arr[1], arr[2] if info["weighted"] else None)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("ignoring the induced table in %s (%s); it will be rebuilt", d, exc)
            return None

    # ------------------------------------------------------------------ build
    @classmethod
    def build(
        cls,
        graph: CSRGraph,
        cfg: PPRConfig | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        progress: bool = True,
        chunk_size: int | None = None,
        quiet: bool = False,
    ) -> PPRIndex:
        """Push from every node (parallel on all numba threads, a progress bar over chunks).

        With ``directory`` the lists are streamed to files there (memory O(chunk)), the index is
        saved and returned memory-mapped; otherwise it is built in memory. ``quiet``: its log line at DEBUG
        (an internal index, such as the update warm-up's, which a server log should not show as the user's).
        """
        from tqdm.auto import tqdm

        cfg = cfg or PPRConfig()
        n = graph.num_nodes
        k = cfg.topk
        threads = numba_threads()
        chunk = chunk_size or int(min(max(2048, n // 200), 65536))
        idt = index_dtype_for(n)
        ptr = np.zeros(n + 1, dtype=np.int64)
        t0 = time.perf_counter()
        out_dir = Path(directory) if directory is not None else None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            fn = open(out_dir / "nodes.bin", "wb")
            fs = open(out_dir / "scores.bin", "wb")
        parts_n: list[np.ndarray] = []
        parts_s: list[np.ndarray] = []
        sc = _take_dense(graph, threads, cfg.eps)
        try:
            with tqdm(total=n, desc="PPR index", unit="node", disable=not progress, smoothing=0.05) as bar:
                for lo in range(0, n, chunk):
                    hi = min(n, lo + chunk)
                    tg = np.arange(lo, hi, dtype=np.int64)
                    counts, nodes, scores = _run_batch(graph, tg, cfg, k, sc)
                    cptr, cn, cs = _compact(counts, nodes, scores)
                    ptr[lo + 1 : hi + 1] = ptr[lo] + cptr[1:]
                    cn = cn.astype(idt)
                    cs = cs.astype(np.float32)
                    if out_dir is not None:
                        cn.tofile(fn)
                        cs.tofile(fs)
                    else:
                        parts_n.append(cn)
                        parts_s.append(cs)
                    bar.update(hi - lo)
        finally:
            _give_dense(graph, sc)
            if out_dir is not None:
                fn.close()
                fs.close()
        seconds = time.perf_counter() - t0
        meta = {
            "format": _FORMAT,
            "fingerprint": graph.fingerprint(),
            "num_nodes": n,
            "nnz": int(ptr[-1]),
            "config": cfg.to_dict(),
            "config_key": cfg.key(),
            "algorithm_version": _ALGO_VERSION,
            "weighted_degrees": _DEGREE_SUMS,
            "nodes_dtype": np.dtype(idt).str,
            "scores_dtype": np.dtype(np.float32).str,
            "build_seconds": round(seconds, 3),
            "threads": threads,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        log.log(logging.DEBUG if quiet else logging.INFO, "PPR index for %d nodes (k=%d) built in %.1f s, %d entries",
                n, k, seconds, int(ptr[-1]))
        if out_dir is not None:
            np.save(out_dir / "ptr.npy", ptr)
            _write_meta(out_dir, meta)
            return cls.open(out_dir, graph)
        nodes_all = np.concatenate(parts_n) if parts_n else np.zeros(0, dtype=idt)
        scores_all = np.concatenate(parts_s) if parts_s else np.zeros(0, dtype=np.float32)
        return cls(cfg, meta["fingerprint"], ptr, nodes_all, scores_all, meta=meta)

    # ------------------------------------------------------------------ storage
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the index files to ``directory`` (``meta.json`` last)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "ptr.npy", np.ascontiguousarray(self.ptr, dtype=np.int64))
        np.ascontiguousarray(self.nodes).tofile(d / "nodes.bin")
        np.ascontiguousarray(self.scores, dtype=np.float32).tofile(d / "scores.bin")
        if self.drift is not None:
            np.save(d / "drift.npy", np.ascontiguousarray(self.drift, dtype=np.float64))
        meta = {
            **self.meta,
            "drift": self.drift is not None,
            "format": _FORMAT,
            "fingerprint": self.fingerprint,
            "num_nodes": self.num_nodes,
            "nnz": len(self.nodes),
            "config": self.config.to_dict(),
            "config_key": self.config.key(),
            "algorithm_version": _ALGO_VERSION,
            "weighted_degrees": _DEGREE_SUMS,
            "nodes_dtype": np.dtype(self.nodes.dtype).str,
            "scores_dtype": np.dtype(np.float32).str,
        }
        _write_meta(d, meta)
        return d

    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], graph: CSRGraph | str | None = None, *, mmap: bool = True
    ) -> PPRIndex:
        """Open a saved index (memory-mapped by default); with ``graph`` refuse a mismatched graph."""
        d = Path(directory)
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise PPRIndexError(f"{d}: not a PPR index (no readable meta.json: {exc})") from exc
        if meta.get("format") != _FORMAT:
            raise PPRIndexError(f"{d}: unknown PPR index format {meta.get('format')!r}, expected {_FORMAT!r}")
        if meta.get("algorithm_version") != _ALGO_VERSION:
            raise PPRIndexError(
                f"{d}: built by PPR algorithm version {meta.get('algorithm_version')}, this is {_ALGO_VERSION}"
            )
        n, nnz = int(meta["num_nodes"]), int(meta["nnz"])
        mode = "r" if mmap else None
        try:
            ptr = _unwrapped(np.load(d / "ptr.npy", mmap_mode=mode))
            nd, sd = np.dtype(meta["nodes_dtype"]), np.dtype(meta["scores_dtype"])
            for name, dt in (("nodes.bin", nd), ("scores.bin", sd)):
                size = (d / name).stat().st_size
                if size != nnz * dt.itemsize:
                    raise PPRIndexError(f"{d}/{name}: {size} bytes, expected {nnz} x {dt.itemsize}")
            if nnz == 0:
                nodes, scores = np.zeros(0, dtype=nd), np.zeros(0, dtype=sd)
            elif mmap:
                nodes = _unwrapped(np.memmap(d / "nodes.bin", dtype=nd, mode="r", shape=(nnz,)))
                scores = _unwrapped(np.memmap(d / "scores.bin", dtype=sd, mode="r", shape=(nnz,)))
            else:
                nodes = np.fromfile(d / "nodes.bin", dtype=nd)
                scores = np.fromfile(d / "scores.bin", dtype=sd)
            drift = np.load(d / "drift.npy") if meta.get("drift") else None  # [N] float64, read whole
        except (OSError, ValueError) as exc:
            raise PPRIndexError(f"{d}: cannot read index arrays: {exc}") from exc
        if ptr.shape != (n + 1,) or int(ptr[-1]) != nnz:
            raise PPRIndexError(f"{d}: ptr.npy does not match meta.json (N = {n}, nnz = {nnz})")
        if drift is not None and (drift.shape != (n,) or drift.dtype != np.float64):
            raise PPRIndexError(f"{d}: drift.npy is {drift.dtype} {drift.shape}, expected float64 ({n},)")
        idx = cls(
            PPRConfig.from_dict(meta["config"]), meta["fingerprint"], ptr, nodes, scores, path=d, meta=meta,
            drift=drift,
        )
        if graph is not None:
            idx.check_graph(graph)
            if _stale_degrees(meta, graph):
                raise PPRIndexError(
                    f"{d}: built on weighted degrees summed as one running sum (before 2026-11-28), which differ from "
                    "the per-row sums the pushes use now where weights span a wide range; build it again "
                    "(PPRIndex.open_or_build does)")
        return idx

    @staticmethod
    def path_for(cache_dir: str | os.PathLike[str], graph: CSRGraph | str, cfg: PPRConfig) -> Path:
        """``cache_dir/ppr-<fingerprint>-<config key>``."""
        return Path(cache_dir) / f"ppr-{_fingerprint_of(graph)}-{cfg.key()}"

    @classmethod
    def open_or_build(
        cls,
        cache_dir: str | os.PathLike[str],
        graph: CSRGraph,
        cfg: PPRConfig | None = None,
        *,
        progress: bool = True,
        quiet: bool = False,
    ) -> PPRIndex:
        """Open the index for (graph, cfg) from ``cache_dir``, building and saving it first if absent
        (``quiet``: as :meth:`build`'s).

        The build writes to a temporary directory renamed into place at the end, so an interrupted
        build leaves nothing that looks like an index, and concurrent builders do not clash.
        """
        cfg = cfg or PPRConfig()
        final = cls.path_for(cache_dir, graph, cfg)
        if (final / "meta.json").exists() and _stale_degrees(_read_meta(final), graph):
            log.info("%s: built on the weighted degrees of an earlier version; building it again", final)
            shutil.rmtree(final, ignore_errors=True)  # readers that mapped it keep their mapping
        if not (final / "meta.json").exists():
            _publish(final, lambda tmp: cls.build(graph, cfg, directory=tmp, progress=progress, quiet=quiet))
        return cls.open(final, graph)

    def publish(self, cache_dir: str | os.PathLike[str]) -> Path:
        """Save this index where :meth:`open_or_build` looks for it in ``cache_dir`` (written beside and renamed
        into place; an index already there is kept). Returns its directory."""
        final = self.path_for(cache_dir, self.fingerprint, self.config)
        if not (final / "meta.json").exists():
            _publish(final, self.save)
        return final


#: how the push's weighted degrees are summed (kernels.ppr_push._row_sums: each row in order); an index of a weighted
#: graph built without this mark summed them as one running sum over every edge, whose bits can differ
_DEGREE_SUMS = "rows"
DEGREE_SUMS = _DEGREE_SUMS  # the mark other stores of lists record too (serve.graph.loader, RedisGraphStore)


def _read_meta(d: Path) -> dict[str, Any]:
    try:
        return json.loads((d / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def _stale_degrees(meta: dict[str, Any], graph: Any) -> bool:
    """Whether an index's lists were pushed on weighted degrees summed otherwise than the pushes sum them now (an
    unweighted graph's degrees are counts: the same either way)."""
    return getattr(graph, "weights", None) is not None and meta.get("weighted_degrees") != _DEGREE_SUMS


def _publish(final: Path, write: Any) -> None:
    """``write(tmp)`` an index into a temporary directory beside ``final``, then rename it into place: an
    interrupted writer leaves nothing that looks like an index, and concurrent writers do not clash (the
    first to finish is kept)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(final.parent, final.name, "an interrupted PPR index build")
    tmp = final.with_name(f"{final.name}{_writer_tag()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "meta.json").exists():
                raise
            # another process finished the same index first: keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _writer_tag() -> str:
    """Suffix of a temporary file name unique to this process and thread (renamed into place after)."""
    return f".tmp-{os.getpid()}-{threading.get_ident()}"


def _write_arrays(d: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write each array to ``d / name`` (``.npy`` names with ``np.save``, others raw) under a name unique to
    this writer, then rename them into place in the order given (the last one's presence can mark a complete
    set). On an error the temporary files are removed and the error raised."""
    tag = _writer_tag()
    tmp = {name: d / f"{name}{tag}" for name in arrays}
    try:
        for name, a in arrays.items():
            if name.endswith(".npy"):
                with open(tmp[name], "wb") as f:
                    np.save(f, a)
            else:
                np.ascontiguousarray(a).tofile(tmp[name])
        for name in arrays:
            os.replace(tmp[name], d / name)
    except OSError:
        for t in tmp.values():
            t.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def writing_into(d: Path) -> Iterator[bool]:
    """Hold a shared ``flock`` on the saved index directory ``d`` for the block, in which its holder writes files
    into it; yields whether ``d`` is still there (``False``: removed, or moved away for removal: write nothing).
    :func:`remove_index_dir` takes the lock exclusively without waiting, so it never deletes a directory under a
    writer, and a writer that waited for a removal finds the directory gone."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        fd = None
    if fd is None:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            st, here = os.fstat(fd), os.stat(d)
            there = (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino) and (d / "meta.json").exists()
        except FileNotFoundError:
            there = False
        yield there
    finally:
        os.close(fd)  # releases the lock


def _live_writer_files(d: Path) -> list[str]:
    """Files in ``d`` a live process is writing (``NAME.tmp-<pid>[-<more>]``, :func:`_writer_tag`): a writer that holds
    no lock (an older server on the same repository) still keeps its directory."""
    out = []
    with contextlib.suppress(OSError):
        for p in d.iterdir():
            _, sep, tag = p.name.partition(".tmp-")
            pid = tag.split("-", 1)[0]
            if sep and pid.isdigit() and pid_alive(int(pid)):
                out.append(p.name)
    return out


def remove_index_dir(d: Path) -> bool:
    """Remove the saved index directory ``d`` unless a process is writing into it (holds :func:`writing_into`'s lock,
    or has a ``.tmp-<live pid>`` file in it); whether it is gone. Moved aside (``<name>.tmp-<pid>-rm``, which
    :func:`kernels.datasets.remove_stale_tmp` finishes if this process dies) under the exclusive lock, then
    deleted: a writer that comes after finds nothing to write into. A server that mapped its files keeps them."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being written
        if _live_writer_files(d):
            return False
        gone = d.with_name(f"{d.name}.tmp-{os.getpid()}-rm")
        shutil.rmtree(gone, ignore_errors=True)
        try:
            os.replace(d, gone)
        except FileNotFoundError:
            return True
        except OSError:
            return False
    finally:
        os.close(fd)
    shutil.rmtree(gone, ignore_errors=True)
    return True


def remove_orphan_indexes(cache_dir: Path, *, dataset: str | None = None, keep_prefix: str | None = None) -> list[str]:
    """Remove what no start can open from the PPR index directory ``cache_dir`` (``REPO/_ppr``), unless a live
    process writes it (:func:`remove_index_dir`): index directories without ``meta.json`` (left by a writer
    whose directory was deleted under it, or a removal cut short: they would also block a build of that index);
    with ``dataset``, the lists earlier compactions of that dataset saved (``meta.json``'s ``from_live.dataset``),
    except those whose name starts with ``keep_prefix`` (``ppr-<the current snapshot graph's fingerprint>-``); the
    temporary directories of writers that died
    (:func:`kernels.datasets.remove_stale_tmp`). The indexes built from a dataset stay. Returns the names removed."""
    removed: list[str] = []
    try:
        entries = sorted(Path(cache_dir).glob("ppr-*"))
    except OSError:
        return removed
    bases = set()
    for d in entries:
        if ".tmp-" in d.name:
            bases.add(d.name.split(".tmp-", 1)[0])
            continue
        if d.is_symlink() or not d.is_dir():
            continue
        if (d / "meta.json").exists():
            if dataset is None or (keep_prefix is not None and d.name.startswith(keep_prefix)) \
                    or (_read_meta(d).get("from_live") or {}).get("dataset") != dataset:
                continue
        if remove_index_dir(d):
            removed.append(d.name)
    for base in sorted(bases):
        remove_stale_tmp(Path(cache_dir), base, "an interrupted PPR index write")
    return removed


def _write_meta(d: Path, meta: dict[str, Any]) -> None:
    # a name per writer: two servers attaching an induced table to one shared index may write at once
    tmp = d / f"meta.json{_writer_tag()}"
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(d / "meta.json")
