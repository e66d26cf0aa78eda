"""Compile the graph-update kernels before the first update needs them.

The update path runs numba kernels that nothing at server start runs: the CSR splice
(:mod:`kernels.graph_edit`), the walk sums of the changed rows (:mod:`kernels.plan`), and for shaDow
models the live PPR maintenance (:mod:`kernels.ppr_live`) and the pushes it recomputes lists with
(:mod:`kernels.ppr_push`; a server that opened its PPR index from disk never ran them). Their compiled
code is cached on disk (``cache=True``), but where that cache is empty (a fresh install) or cannot be
written (a read-only image without ``NUMBA_CACHE_DIR``), the first ``UpdateGraph`` of a process paid
about 3 s of compilation (measured on Amazon Computers with an empty cache: 2,988 ms for the first
single-edge update, 43 ms for the second).

:func:`warm_update_kernels` runs the same public functions on a six-node graph of the served graph's
kind (its index type and whether it is weighted), so the specializations the real update uses are
compiled (or loaded from the cache) then; :func:`warm_once` does that once per process and kind, while a
server loads a model on a graph that can take updates (not on a thread beside serving: compiling holds the
interpreter, for up to 175 ms at a time in a measurement, which requests would wait out). With a warm
numba cache it takes about 0.3 s; with an empty one, seconds (once per install).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from .graph import CSRGraph

log = logging.getLogger(__name__)

_done: set[tuple[Any, ...]] = set()
_lock = threading.Lock()


def _tiny_like(graph: Any) -> CSRGraph:
    """A 6-node ring with one chord, both directions, weighted if ``graph`` is."""
    src = np.array([0, 1, 2, 3, 4, 5, 0], dtype=np.int64)
    dst = np.array([1, 2, 3, 4, 5, 0, 3], dtype=np.int64)
    s, d = np.concatenate([src, dst]), np.concatenate([dst, src])
    order = np.lexsort((d, s))
    s, d = s[order], d[order]
    indptr = np.zeros(7, dtype=np.int64)
    np.add.at(indptr, s + 1, 1)
    weighted = getattr(graph, "weights", None) is not None
    tiny = CSRGraph(np.cumsum(indptr), d.astype(np.int32),
                    np.linspace(0.5, 1.5, len(d)).astype(np.float32) if weighted else None, 6)
    # numba compiles read-only arrays (a memory-mapped graph) apart from writable ones: mirror the flags
    for name in ("indptr", "indices", "weights"):
        ours, theirs = getattr(tiny, name), getattr(graph, name, None)
        if ours is not None and theirs is not None and not getattr(theirs, "flags", ours.flags).writeable:
            ours.flags.writeable = False
    return tiny


def warm_update_kernels(graph: Any, ppr_config: Any | None = None, layers: int = 2) -> float:
    """Run two small edits (a new node and an edge, then an edge added and one removed) through the update
    path's kernels on a graph of ``graph``'s kind: the splice, the walk sums of ``layers - 1`` hops, and with ``ppr_config`` (a
    :class:`kernels.ppr.PPRConfig`) a PPR index's build and live refresh. Returns the seconds taken."""
    from .graph_edit import GraphEdit, apply_edit
    from .plan import update_walk_sums, walk_sums

    t0 = time.perf_counter()
    tiny = _tiny_like(graph)
    weighted = tiny.weights is not None
    # three edits: the first on a graph like the loaded one (its arrays may be read-only, memory-mapped),
    # the others on the graphs the edits produce (writable arrays, as every later update sees)
    edits = [GraphEdit.make(new_count=1, new_ptr=[0, 1], new_nbrs=[0], new_weights=[1.0] if weighted else None,
                            add_src=[1], add_dst=[4], add_w=[0.75] if weighted else None),
             GraphEdit.make(add_src=[2], add_dst=[5], add_w=[1.25] if weighted else None, rem_src=[1], rem_dst=[4]),
             GraphEdit.make(rem_src=[2], rem_dst=[5])]
    steps = []
    g = tiny
    for edit in edits:
        effect = apply_edit(g, edit)
        update_walk_sums(effect.graph, walk_sums(g, max(1, layers - 1)), effect.changed_rows)
        steps.append((g, effect))
        g = effect.graph
    if ppr_config is not None:
        import tempfile

        from .ppr import PPRIndex
        from .ppr_live import LivePPRIndex

        # built and then opened from its files, memory-mapped and read-only as a server's index is
        with tempfile.TemporaryDirectory(prefix="gnnserve-warmup-") as d:
            live = LivePPRIndex(PPRIndex.open_or_build(d, tiny, ppr_config, progress=False, quiet=True), tol_factor=1e-12)
            for i, (old, effect) in enumerate(steps):
                if i == len(steps) - 1:
                    # lists folded into memory (what a server's index does once its overlay grows): the last
                    # edit runs on in-memory, writable lists, as updates after such a merge do; the one before
                    # ran on an edited (writable) graph with the offline (read-only) lists, as a server's
                    # updates do until the first merge (with --ppr-eager-lists that can be many updates)
                    live._merge()
                live.apply(old, effect.graph, effect.changed_rows, effect.new_ids)
            del live
    return time.perf_counter() - t0


def warm_once(graph: Any, ppr_config: Any | None = None, layers: int = 2) -> None:
    """:func:`warm_update_kernels`, once per process for each kind of graph and PPR configuration, before
    the caller goes on (a server's model load: its first updates then compile nothing, and no compilation
    holds the interpreter while it serves). A failure is logged, never raised: the first real update then
    compiles as it did before."""
    key = (getattr(graph, "weights", None) is not None, None if ppr_config is None else repr(ppr_config))
    with _lock:
        if key in _done:
            return
        _done.add(key)
        try:
            took = warm_update_kernels(graph, ppr_config, layers)
            log.debug("update kernels ready (%s) in %.2f s", "with PPR" if ppr_config else "graph", took)
        except Exception:
            log.exception("warming the update kernels failed; the first update compiles them instead")
