"""Refuse, at start, a ``gnnserve serve`` configuration that cannot fit in the machine's memory.

``gnnserve serve`` calls :func:`refuse_overcommit` before it loads anything. It adds up, for the
model repository on disk (every ``REPO/<name>/<version>/config.json``, read as JSON: no weights,
no torch):

* the **cache budgets** the options allow the process to fill:

  - ``--projection-cache-bytes``, per model version: the projection table is kept only when the
    whole table (``N x P x 4`` bytes, ``P`` the projection width) fits, so a version counts the
    table's size if it fits in the budget and nothing otherwise;
  - ``--activation-cache-bytes``, per plain 2-layer model version (its first-layer outputs, one
    table per sampling width; with ``--resident`` the resident tables, which replace that cache),
    the budget as given;
  - ``--induced-table-bytes``, per distinct PPR configuration served from a local graph;
  - ``--graph-cache-bytes``, with ``--graph`` (stateless replica), half of it again for the nodes each list the
    replica pushed read (kept so an update elsewhere leaves the list current), 16 MiB for the log of changed
    rows, and its degree chunks (12 bytes per node at most: row lengths and weight sums, kept once fetched);
  - ``--hot-bytes``, with features in Redis;

* the **resident data** estimated from each distinct dataset's sizes (``config.json["dataset"]``):
  the CSR graph (``(N + 1) x 8`` bytes of row pointers and ``E x 4`` or ``8`` of column ids), the
  features (``N x F x 4``, when they are held in memory) and each PPR top-K index (``N x K`` ids
  and float32 scores, plus row pointers), all skipped for a stateless replica (``--graph``).

With ``--processes N`` (several server processes on one port, :mod:`serve.processes`) every
process holds all of the above for itself, so each term counts N times.

The total is compared with the machine's memory: ``MemTotal`` of ``/proc/meminfo`` (else
``os.sysconf``), or the cgroup's ``memory.max`` when that is lower (a container's limit). A total
above it is refused with a message listing the terms and exit code 2; ``--allow-overcommit``
starts anyway (e.g. when the graph and index are memory-mapped from a fast disk and only part of
them is ever touched).

The estimate leaves out the Python/torch runtime (a few hundred MB), model weights (small) and
per-batch working memory, so a configuration that passes can still run short; it catches the
budgets and graphs that cannot fit at all.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MemoryEstimate", "estimate", "machine_memory_bytes", "refuse_overcommit", "resolve_auto_budgets"]

_GIB = float(1 << 30)


def machine_memory_bytes() -> int | None:
    """Physical memory of this machine (``/proc/meminfo`` MemTotal, else ``os.sysconf``), lowered
    to the cgroup v2/v1 memory limit when one is set; ``None`` when nothing can be read."""
    total: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        total = None
    if total is None:
        try:
            total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(path).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            limit = int(raw)
            if limit < (1 << 60) and (total is None or limit < total):
                total = limit
        break
    return total


@dataclass
class MemoryEstimate:
    """Bytes by term (``items``: (description, bytes)), their sum and the machine's memory."""

    items: list[tuple[str, int]] = field(default_factory=list)
    machine_bytes: int | None = None

    @property
    def total(self) -> int:
        return sum(b for _, b in self.items)

    def add(self, what: str, nbytes: int) -> None:
        if nbytes > 0:
            self.items.append((what, int(nbytes)))

    def describe(self, limit: int = 12) -> str:
        top = sorted(self.items, key=lambda t: -t[1])
        lines = [f"  {b / _GIB:10.2f} GiB  {what}" for what, b in top[:limit]]
        if len(top) > limit:
            rest = sum(b for _, b in top[limit:])
            lines.append(f"  {rest / _GIB:10.2f} GiB  ({len(top) - limit} more terms)")
        return "\n".join(lines)


def _checkpoints(repo: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(name/version, config.json)`` of every checkpoint in ``repo`` (unreadable ones skipped:
    the registry reports them when it loads)."""
    out = []
    if not repo.is_dir():
        return out
    for mdir in sorted(repo.iterdir()):
        if not mdir.is_dir() or mdir.name.startswith(("_", ".")):
            continue
        for vdir in sorted(mdir.iterdir()):
            if not (vdir.is_dir() and vdir.name.isdigit()):
                continue
            try:
                conf = json.loads((vdir / "config.json").read_text())
            except (OSError, ValueError):
                continue
            if isinstance(conf, dict) and isinstance(conf.get("dataset"), dict):
                out.append((f"{mdir.name}/{vdir.name}", conf))
    return out


def _projection_dim(model: dict[str, Any]) -> int:
    hidden = int(model.get("hidden", 0))
    backbone = model.get("backbone") or model.get("arch", "gcn")
    return hidden if str(backbone).endswith("gcn") else 2 * hidden


def _tables(conf: dict[str, Any]) -> tuple[int, int, int, int | None]:
    """``(N, P, projection table bytes, first-layer table bytes or None)`` of a checkpoint's ``config.json``: the
    projection table ``N x P x 4``; a plain 2-layer model's first-layer table at one width ``N x (4 hidden + 1)``
    (float32 rows and a filled flag), None for other models (they keep none)."""
    n = int(conf["dataset"].get("num_nodes", 0))
    model = conf.get("model", {}) if isinstance(conf.get("model"), dict) else {}
    p = _projection_dim(model)
    plain2 = conf.get("extractor") == "lhop" and int(conf.get("hops", 0)) == 2
    return n, p, n * p * 4, n * (4 * int(model.get("hidden", 0)) + 1) if plain2 else None


def estimate(args: Any) -> MemoryEstimate:
    """The memory a ``gnnserve serve`` configuration (its parsed ``args``) may use (module docstring)."""
    est = MemoryEstimate(machine_bytes=machine_memory_bytes())
    procs = int(getattr(args, "processes", 1) or 1)  # each holds its own copy of everything (serve.processes)
    stateless = bool(getattr(args, "graph", None))
    features_local = not stateless and str(getattr(args, "features", "memory")) == "memory"
    datasets: dict[str, dict[str, Any]] = {}
    ppr_indexes: dict[str, tuple[int, int]] = {}  # (graph fp, PPR config) -> (N, K)
    ppr_graphs: dict[str, int] = {}  # graph fp -> N, of the graphs with a PPR model
    for tag, conf in _checkpoints(Path(args.repo)):
        d = conf["dataset"]
        n, p, table, first_layer = _tables(conf)
        if 0 < table <= int(args.projection_cache_bytes):
            est.add(f"projection table of {tag} ({n:,} nodes x {p})", table)
        if first_layer is not None:
            est.add(f"activation cache budget of {tag} (--activation-cache-bytes)", int(args.activation_cache_bytes))
        fp = str(d.get("graph_fingerprint") or d.get("fingerprint") or tag)
        datasets.setdefault(fp, d)
        if conf.get("extractor") == "ppr" and not stateless:
            key = fp + json.dumps(conf.get("ppr"), sort_keys=True)
            ppr_indexes[key] = (n, int(conf.get("max_ppr_budget") or (conf.get("ppr") or {}).get("topk", 0)))
            ppr_graphs[fp] = n
    if not stateless:
        for d in datasets.values():
            n, e, f = int(d.get("num_nodes", 0)), int(d.get("num_edges", 0)), int(d.get("num_features", 0))
            idb = 4 if n < 2**31 else 8
            est.add(f"graph of {d.get('name', '?')} ({n:,} nodes, {e:,} edges)", (n + 1) * 8 + e * idb)
            if features_local:
                est.add(f"features of {d.get('name', '?')} ({n:,} x {f} float32)", n * f * 4)
        for n, k in ppr_indexes.values():
            est.add(f"PPR top-{k} index ({n:,} nodes)", n * k * 8 + (n + 1) * 8)
        from kernels.ppr_push import DENSE_NEW_NODE_MAX, new_node_workers

        threads = None  # this process's numba threads; a child of --processes N gets its share (serve.processes)
        if procs > 1:
            from .processes import child_env

            try:
                threads = max(1, int(child_env(procs).get("NUMBA_NUM_THREADS", "1")))
            except ValueError:  # a NUMBA_NUM_THREADS numba itself will refuse: count this process's
                threads = None
        for n in ppr_graphs.values():  # kernels.ppr_push._DenseScratch of one worker, per parallel worker and graph
            if n + 1 <= DENSE_NEW_NODE_MAX:
                w = new_node_workers(n, 1 << 30, threads)
                est.add(f"PPR push state for new nodes ({w} worker(s) x {n + 1:,} nodes x 40 bytes)", w * 40 * (n + 1))
        if ppr_indexes:
            est.add(f"induced-table budget x {len(ppr_indexes)} PPR index(es) (--induced-table-bytes)",
                    len(ppr_indexes) * int(args.induced_table_bytes))
    else:
        est.add("graph row cache (--graph-cache-bytes)", int(args.graph_cache_bytes))
        # serve.graph.store: what the pushes of the lists it pushed itself read (half the row cache's budget), and
        # the rows each structural update changed (16 MiB at most)
        est.add("PPR list reach sets (--graph-cache-bytes / 2) and the changed-row log",
                int(args.graph_cache_bytes) // 2 + (16 << 20))
        for d in datasets.values():  # serve.graph.store: row lengths (and weight sums) kept per node
            n = int(d.get("num_nodes", 0))
            est.add(f"graph degree chunks of {d.get('name', '?')} ({n:,} nodes x 12 bytes)", 12 * n)
    if not features_local:  # features in Redis: the hot tier in front of it
        est.add("feature hot tier (--hot-bytes)", int(getattr(args, "hot_bytes", 0) or 0))
    if procs > 1:
        est.items = [(f"{what}, x {procs} processes", b * procs) for what, b in est.items]
    return est


#: what ``--projection-cache-bytes`` and ``--activation-cache-bytes`` were before ``auto`` (and what auto falls back to)
DEFAULT_PROJECTION_BYTES = 2 << 30
DEFAULT_ACTIVATION_BYTES = 256 << 20
#: the share of the machine's memory the auto budgets may take, with everything else :func:`estimate` counts
AUTO_SHARE = 0.6


#: the room ``auto`` budgets leave a live graph to grow in: tables for ``1 / AUTO_GROWTH`` more nodes than the
#: checkpoint's graph has. Without it a server restarted after an update had added 4 nodes to a 2 M-node graph found
#: no room for its first-layer table (514,001,028 bytes against a budget of 514,000,000), dropped the table whole and
#: answered 500-node batches in 18-19 ms against 6.9 (a new user's report, 2026-11-29)
AUTO_GROWTH = 16


def _grown(table_bytes: int) -> int:
    """A table's bytes with room for :data:`AUTO_GROWTH`'s share of new nodes."""
    return table_bytes + table_bytes // AUTO_GROWTH


def _table_sizes(repo: Path) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """``(projection tables, first-layer tables)``: ``(tag, bytes)`` per checkpoint (:func:`_tables`), the latter for
    plain 2-layer models, each with room for :data:`AUTO_GROWTH`'s share of new nodes."""
    proj, act = [], []
    for tag, conf in _checkpoints(repo):
        _n, _p, table, first_layer = _tables(conf)
        proj.append((tag, _grown(table)))
        if first_layer is not None:
            act.append((tag, _grown(first_layer)))
    return proj, act


def checkpoint_budgets(checkpoint: str | os.PathLike[str]) -> tuple[int, int]:
    """``(projection, first-layer)`` cache budgets for timing one checkpoint as ``auto`` serves it (``gnnserve
    train``'s knob re-timing, serve.knob_timing): its tables with room to grow (:data:`AUTO_GROWTH`), never below the
    fixed defaults, when both fit in :data:`AUTO_SHARE` of the machine's memory; else the defaults. (With the fixed
    budgets a 2 M-node GCN's knob table was timed without the 514 MB first-layer table its server holds: a new
    user's report.)"""
    conf = json.loads((Path(checkpoint) / "config.json").read_text())
    _n, _p, table, first_layer = _tables(conf)
    proj = max(DEFAULT_PROJECTION_BYTES, _grown(table))
    act = max(DEFAULT_ACTIVATION_BYTES, _grown(first_layer or 0))
    mem = machine_memory_bytes()
    if mem is None or proj + act > AUTO_SHARE * mem:
        return DEFAULT_PROJECTION_BYTES, DEFAULT_ACTIVATION_BYTES
    return proj, act


def resolve_auto_budgets(args: Any) -> list[str]:
    """Turn ``auto`` cache budgets in ``args`` into bytes; the lines saying what was chosen (for the log).

    ``auto`` (the default of both) sizes the budget to the repository's graphs: ``--projection-cache-bytes`` to the
    largest model's projection table (``N x P x 4``) and ``--activation-cache-bytes`` to one first-layer table of the
    largest plain 2-layer model (``N x (4 hidden + 1)``), both with room for ``N / AUTO_GROWTH`` nodes more (updates
    add nodes), never below the fixed defaults (2 GiB, 256 MiB), when every
    model's tables fit, with the graph, features, indexes and other budgets :func:`estimate` counts (times
    ``--processes``), in :data:`AUTO_SHARE` of the machine's memory; otherwise the fixed default. Why: with the fixed
    defaults a 10 M-node GCN kept neither table (2.56 and 2.57 GB) and answered one node in 4.9 ms p50 against 2.7
    with both kept (and 0.71 with them filled at start, ``--warm-projections``; the 2-vCPU VM, 2026-11-29)."""
    from argparse import Namespace

    auto_p = str(args.projection_cache_bytes) == "auto"
    auto_a = str(args.activation_cache_bytes) == "auto"
    if not (auto_p or auto_a):
        return []
    fixed_args = Namespace(**dict(vars(args), projection_cache_bytes=0 if auto_p else args.projection_cache_bytes,
                                  activation_cache_bytes=0 if auto_a else args.activation_cache_bytes))
    fixed = estimate(fixed_args)
    procs = int(getattr(args, "processes", 1) or 1)
    proj, act = _table_sizes(Path(args.repo))
    room = None if fixed.machine_bytes is None else AUTO_SHARE * fixed.machine_bytes - fixed.total
    lines = []

    def choose(flag: str, default: int, tables: list[tuple[str, int]], count_all: bool) -> int:
        nonlocal room
        want = max((b for _, b in tables), default=0)
        need = (sum(b for _, b in tables) if count_all else want * len(tables)) * procs
        if want <= default:
            lines.append(f"{flag} auto: {default:,} bytes (the default; every table fits it)")
            return default
        if room is None or need > room:
            why = "this machine's memory could not be read" if room is None else (
                f"the tables ({need / _GIB:.2f} GiB) would not fit in {AUTO_SHARE:.0%} of this machine's memory beside "
                f"the rest ({fixed.total / _GIB:.2f} GiB)")
            lines.append(f"{flag} auto: {default:,} bytes (the default: {why}; the largest table, {want:,} bytes, "
                         "is not kept)")
            return default
        room -= need
        lines.append(f"{flag} auto: {want:,} bytes (the largest table, {max(tables, key=lambda t: t[1])[0]})")
        return want

    if auto_p:
        args.projection_cache_bytes = choose("--projection-cache-bytes", DEFAULT_PROJECTION_BYTES, proj, True)
    if auto_a:
        args.activation_cache_bytes = choose("--activation-cache-bytes", DEFAULT_ACTIVATION_BYTES, act, False)
    return lines


def refuse_overcommit(args: Any) -> int | None:
    """``None`` when the configuration fits (or ``args.allow_overcommit``); else print why on stderr
    and return the exit code 2."""
    import sys

    if getattr(args, "allow_overcommit", False):
        return None
    est = estimate(args)
    if est.machine_bytes is None or est.total <= est.machine_bytes:
        return None
    print(f"gnnserve serve: refusing to start: the cache budgets and estimated resident data add up to "
          f"{est.total / _GIB:.2f} GiB, more than this machine's memory of {est.machine_bytes / _GIB:.2f} GiB:\n"
          f"{est.describe()}\n"
          "Lower the budgets (--projection-cache-bytes, --activation-cache-bytes, --induced-table-bytes, "
          "--graph-cache-bytes, --hot-bytes), serve fewer models or datasets per process (or a stateless "
          "replica with --graph), run fewer --processes, or pass --allow-overcommit to start anyway.", file=sys.stderr)
    return 2
