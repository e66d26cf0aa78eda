"""The knob table's latency, measured on the path the server runs.

A checkpoint's ``knobs.json`` holds one row per setting (PPR budget K, sampling width S) with its
validation accuracy and ``latency_ms_per_node``; a request's ``max_accuracy_loss`` picks the fastest
row within the loss by that column (:mod:`clients.knob_rules`). Training (:mod:`models.knobs`)
times a torch copy of the serving path in batches; the server answers through the paths of
:mod:`serve.paths` (compiled forwards, the activation cache), whose costs differ and do not scale
the same way with S and K. :func:`retime_knobs` re-measures the column on the served path:

1. it builds a real :class:`~serve.runtime.ModelRuntime` as the model registry does
   (``ModelRegistry._load_version``): the dataset's graph, an in-memory feature store, the PPR
   index of a shaDow model (:meth:`kernels.ppr.PPRIndex.open_or_build`, with its induced table
   when it fits ``induced_table_bytes``), default :class:`~serve.runtime.RuntimeOptions` and a
   one-thread executor; then warms it (``ModelRuntime.warm``);
2. it draws a seeded sample of at most ``nodes`` (256) validation nodes (every node when the
   dataset has no validation split);
3. per row, each sampled node is asked for alone through the public ``ModelRuntime.process``
   (no forced path: the runtime picks its path as it does for a one-node request): one untimed
   pass over the sample (the caches a warm server holds: projections, first-layer activations at
   that width), then ``repeats`` timed passes, node by node with every row in turn (a shared
   machine's changing load then falls on every row alike); a node's time is the fastest of its
   passes, and the row's ``latency_ms_per_node`` is the **median over the sampled nodes**.

So ``latency_ms_per_node`` means: the served cost of a single-node request with this setting, in
milliseconds, on a warm model (``process`` alone: not the RPC, the queue or request parsing). A
batch of many targets costs less per node; the column ranks settings, as the knob rules use it.

The rows' accuracy, intervals and kept-edge fractions stay as training measured them. Each row
gains ``latency_path`` (the serving path that answered, a name of :data:`serve.paths.PATH_NAMES`)
and ``train_latency_ms_per_node`` (the training copy's figure it replaced); the table's metadata
gains ``latency_source`` (``"served:<path>[,<path>...]"``, against training's
``"training:torch-copy"``), the sample (``latency_nodes``, ``latency_seed``, ``latency_population``),
``latency_batch_size`` (1), ``latency_repeats``, ``latency_statistic``, ``latency_time_s``,
``latency_device``. ``knobs.json`` is replaced atomically; nothing else in the checkpoint changes
(the default knobs are chosen from accuracy alone).

``gnnserve train`` runs this after training (:func:`train_main`, the CLI's ``train`` handler), on the
checkpoint in its staging directory beside ``--out`` (``models.train.staging_dir``), before the
directory is renamed into place: a server polling the repository loads the version once, with the
re-timed ``knobs.json``. ``python -m models.train`` does not (models never import serve), and
``python -m serve.knob_timing CHECKPOINT`` re-times any checkpoint afterwards, in place: a server
polling the repository that serves that checkpoint loads it again (its directory changed,
serve.registry).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cli import DATASET_HELP

__all__ = ["DEFAULT_NODES", "DEFAULT_REPEATS", "main", "retime_knobs", "train_main"]

log = logging.getLogger("serve.knob_timing")  # also when run as `python -m serve.knob_timing`

#: sampled nodes timed per knob setting
DEFAULT_NODES = 256
#: timed passes over the sample per setting (each node keeps its fastest)
DEFAULT_REPEATS = 3

STATISTIC = ("median over the sampled nodes of each node's fastest of `latency_repeats` single-node requests "
             "through ModelRuntime.process (warm model, after one untimed pass)")


class _Pending:
    """The future of a timed item, which is processed directly (``ModelRuntime.process``), never queued:
    not done, as a waiting request's."""

    def done(self) -> bool:
        return False


def _default_ppr_cache(ckpt_dir: Path) -> Path | None:
    """``REPO/_ppr`` for a checkpoint at ``REPO/<name>/<version>`` (where ``gnnserve serve --repo REPO``
    looks for PPR indexes, so the server reuses the index built here); else None (a temporary one)."""
    if ckpt_dir.name.isdigit() and int(ckpt_dir.name) >= 1:
        return ckpt_dir.parent.parent / "_ppr"
    return None


def _load_dataset(ckpt: Any, dataset: Any) -> Any:
    from kernels.datasets import GraphDataset, load_dataset

    if isinstance(dataset, GraphDataset):
        ds = dataset
    else:
        spec = dataset
        if spec is None:
            spec = ckpt.config["dataset"].get("source")
            if not spec:
                raise ValueError(f"{ckpt.path}: the checkpoint records no dataset source; pass the dataset")
            if not os.path.isabs(str(spec)) and not str(spec).startswith(("synthetic", "ogb:")):
                spec = str((Path(ckpt.path) / str(spec)).resolve())
        ds = load_dataset(spec)
    if ds.fingerprint() != ckpt.dataset_fingerprint:
        raise ValueError(f"{ckpt.path} was trained on dataset {ckpt.dataset_fingerprint[:12]}..., not on "
                         f"{ds.name} ({ds.fingerprint()[:12]}...)")
    return ds


def _write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    data = (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def retime_knobs(
    checkpoint_dir: str | os.PathLike[str],
    dataset: Any = None,
    *,
    nodes: int = DEFAULT_NODES,
    seed: int | None = None,
    repeats: int = DEFAULT_REPEATS,
    options: Any = None,
    ppr_cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    write: bool = True,
    stage_times: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Re-time the knob table of a checkpoint on the served path (module docstring); returns the new
    ``knobs.json`` document (written into the checkpoint unless ``write`` is false).

    Args:
        checkpoint_dir: the checkpoint directory.
        dataset: its dataset (a :class:`~kernels.datasets.GraphDataset` or a spec for
            :func:`~kernels.datasets.load_dataset`); ``None``: the source recorded in the checkpoint.
        nodes: validation nodes timed per setting (a seeded sample; 0 = all of them).
        seed: the sample's seed (default: the training seed recorded in the checkpoint).
        repeats: timed passes per setting (each node keeps its fastest).
        options: :class:`~serve.runtime.RuntimeOptions` (default: the server's defaults).
        ppr_cache_dir: where a shaDow model's PPR index is found or built (default ``REPO/_ppr`` for a
            checkpoint at ``REPO/<name>/<version>``, else a temporary directory removed afterwards).
        progress: a tqdm bar over the timed requests.
        write: replace ``knobs.json`` in the checkpoint.
        stage_times: filled with ``ppr_index``, the wall time of opening or building a shaDow model's
            PPR index (its induced table included), which is part of this call's time.

    Raises:
        models.checkpoint.CheckpointError: not a valid checkpoint.
        ValueError: the dataset is not the checkpoint's.
    """
    import torch
    from tqdm.auto import tqdm

    from models.checkpoint import KNOBS_FILE, load_checkpoint
    from models.fit import sample_nodes

    from .batcher import WorkItem
    from .features import open_store
    from .runtime import DataBundle, ModelRuntime, RuntimeOptions
    from .validation import PredictCall

    t_start = time.perf_counter()
    path = Path(checkpoint_dir)
    ckpt = load_checkpoint(path)
    ds = _load_dataset(ckpt, dataset)
    options = options or RuntimeOptions()
    if repeats < 1 or nodes < 0:
        raise ValueError(f"need repeats >= 1 and nodes >= 0, got {repeats} and {nodes}")
    if seed is None:
        seed = int((ckpt.config.get("training") or {}).get("seed", 0))

    store = open_store("memory", dataset=ds, registry=None)
    data = DataBundle(fingerprint=ds.fingerprint(), graph=ds.graph, features=store,
                      feature_store_name=getattr(store, "name", "memory"))
    tmp_cache: str | None = None
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gnnserve-knob-timing")
    try:
        index = None
        if ckpt.extractor == "ppr":
            from kernels.ppr import PPRConfig, PPRIndex

            if not ckpt.ppr_config:
                raise ValueError(f"{path}: a PPR model's checkpoint has no PPR configuration")
            cache = ppr_cache_dir or options.ppr_cache_dir or _default_ppr_cache(path)
            if cache is None:
                cache = tmp_cache = tempfile.mkdtemp(prefix="gnnserve-knob-timing-ppr-")
            t0 = time.perf_counter()
            cfg = PPRConfig(**ckpt.ppr_config)
            if not (PPRIndex.path_for(Path(cache), ds.graph, cfg) / "meta.json").exists():
                log.info("knob timing: building the PPR index of %s (%d nodes, the longest stage on a large "
                         "graph: a push from every node) into %s; `gnnserve serve` then opens it instead of "
                         "building it", ds.name, ds.num_nodes, "a temporary directory" if tmp_cache else cache)
            index = PPRIndex.open_or_build(Path(cache), ds.graph, cfg, progress=progress)
            if options.induced_table_bytes > 0:
                index.ensure_induced(ds.graph, max_bytes=options.induced_table_bytes)
            took = time.perf_counter() - t0
            if stage_times is not None:
                stage_times["ppr_index"] = round(stage_times.get("ppr_index", 0.0) + took, 3)
            log.info("knob timing: PPR index of %s ready in %.1f s (%s)", ds.name, took,
                     "temporary" if tmp_cache else cache)
        rt = ModelRuntime(path.name, 1, ckpt, data, index, options, executor, None)
        rt.warm()

        val = ds.split("val")
        population = "val" if len(val) else "all"
        pool = val if len(val) else np.arange(ds.num_nodes, dtype=np.int64)
        sample = sample_nodes(pool, nodes, seed)
        doc = json.loads((path / KNOBS_FILE).read_text())
        rows = doc["rows"]
        log.info("knob timing: %d settings x %d %s nodes x (1 + %d) single-node requests on %s",
                 len(rows), len(sample), population, repeats, ", ".join(p.name for p in rt.paths))

        def ask(node: int, width: int, budget: int) -> tuple[float, str]:
            call = PredictCall("knob-timing", np.array([node], dtype=np.int64), [], width, budget, "knob-timing",
                               0.0, True, False)
            item = WorkItem(call, 1, None, None, time.monotonic(), _Pending())  # type: ignore[arg-type]
            t0 = time.perf_counter()
            res = rt.process([item])[0]
            dt = time.perf_counter() - t0
            if isinstance(res, BaseException):
                raise res
            return dt, res.path

        settings = [(int(r["sampling_width"]), int(r["ppr_budget"]) if rt.extractor == "ppr" else 0) for r in rows]
        names: list[set[str]] = [set() for _ in rows]
        bar = tqdm(total=len(rows) * len(sample) * (1 + repeats), desc="served knob timing", unit="request",
                   disable=not progress, leave=False, dynamic_ncols=True)
        for j, (width, budget) in enumerate(settings):  # untimed: the caches a warm server holds for the sample
            for v in sample:
                names[j].add(ask(int(v), width, budget)[1])
            bar.update(len(sample))
        # timed: node by node, every setting in turn, so that a shared machine's changing load falls on
        # every row alike (rows timed one after another would rank by the load of their moment)
        best = np.full((len(rows), len(sample)), np.inf)
        for _ in range(repeats):
            for i, v in enumerate(sample):
                for j, (width, budget) in enumerate(settings):
                    dt, name = ask(int(v), width, budget)
                    best[j, i] = min(best[j, i], dt)
                    names[j].add(name)
                bar.update(len(rows))
        bar.close()
        seen: list[str] = []
        for j, r in enumerate(rows):
            width, budget = settings[j]
            ms = float(np.median(best[j])) * 1e3 if len(sample) else float("nan")
            name = ",".join(sorted(names[j]))
            if "latency_path" not in r:  # first re-timing: keep the training copy's figure beside
                r["train_latency_ms_per_node"] = r["latency_ms_per_node"]
            log.info("knob timing: K=%d S=%d: %.4f ms/node on %s (training copy: %.4f)", budget, width, ms, name,
                     float(r.get("train_latency_ms_per_node", float("nan"))))
            r["latency_ms_per_node"] = ms
            r["latency_nodes"] = len(sample)
            r["latency_path"] = name
            for n in sorted(names[j]):
                if n not in seen:
                    seen.append(n)
        elapsed = time.perf_counter() - t_start
        doc.update({
            "latency_source": "served:" + ",".join(seen),
            "latency": "served cost of a single-node request: ModelRuntime.process on the serving path the "
                       "runtime picks (row's latency_path), warm caches",
            "latency_statistic": STATISTIC,
            "latency_nodes": len(sample),
            "latency_seed": int(seed),
            "latency_population": population,
            "latency_batch_size": 1,
            "latency_repeats": int(repeats),
            "latency_device": str(rt.device),
            "latency_time_s": round(elapsed, 3),
            "torch_threads": torch.get_num_threads(),
        })
        if write:
            _write_json_atomic(path / KNOBS_FILE, doc)
        log.info("knob timing: %s re-timed on %s in %.1f s", path, doc["latency_source"], elapsed)
        return doc
    finally:
        executor.shutdown(wait=True)
        store.close()
        if tmp_cache is not None:
            shutil.rmtree(tmp_cache, ignore_errors=True)


# ============================================================================ gnnserve train
TRAIN_EPILOG = ("After the checkpoint is written, its knob table's latency_ms_per_node is re-timed on the path the "
                "server runs (serve.knob_timing: a real ModelRuntime, single-node requests on --knob-latency-nodes "
                "validation nodes, median per setting); `python -m models.train` skips that step.")


def _after_train(staged: Path, ds: Any, args: argparse.Namespace) -> dict[str, float]:
    """``gnnserve train``: re-time the knob table of the checkpoint training wrote, in its staging
    directory beside ``--out`` (models.train.staging_dir), before it is put in place: a server polling
    the repository loads the version once, with this ``knobs.json``. A shaDow model's PPR index goes
    where the server of ``--out``'s repository looks for it (``REPO/_ppr`` for ``REPO/<name>/<version>``),
    so serving does not build it again. Returns the stages' wall times for the run's summary and
    ``metrics.json`` (models.train.AfterTrain): ``ppr_index`` (shaDow models) and ``served_knob_timing``
    (the rest: the runtime built and warmed, the requests timed)."""
    import torch

    from .memory_budget import checkpoint_budgets
    from .runtime import RuntimeOptions

    device = "cuda" if str(args.device).startswith("cuda") and torch.cuda.is_available() else "cpu"
    proj, act = checkpoint_budgets(staged)  # as `gnnserve serve` sizes them by default (auto)
    log.info("knob timing: re-timing the checkpoint for %s (staged at %s) on the served path (%s; cache budgets "
             "%s and %s bytes, as a server's auto) ...", args.out, staged, device, f"{proj:,}", f"{act:,}")
    t0 = time.perf_counter()
    times: dict[str, float] = {}
    retime_knobs(staged, ds, nodes=int(args.knob_latency_nodes), seed=int(args.seed),
                 options=RuntimeOptions(device=device, projection_budget_bytes=proj, activation_budget_bytes=act),
                 ppr_cache_dir=_default_ppr_cache(Path(args.out)), progress=not args.no_progress,
                 stage_times=times)
    total = time.perf_counter() - t0
    times["served_knob_timing"] = round(max(0.0, total - times.get("ppr_index", 0.0)), 3)
    log.info("knob timing: done in %.1f s", total)
    return times


def train_main(argv: Sequence[str]) -> int:
    """``gnnserve train``: :func:`models.train.main`, then :func:`retime_knobs` on the checkpoint."""
    from models.train import main as train_cli

    return train_cli(list(argv), prog="gnnserve train", after_train=_after_train, log_names=(log.name,),
                     epilog=TRAIN_EPILOG)


# ============================================================================ python -m serve.knob_timing
def main(argv: Sequence[str] | None = None) -> int:
    """Re-time an existing checkpoint's knob table (exit 0 ok, 2 bad checkpoint or dataset)."""
    from models.checkpoint import CheckpointError

    ap = argparse.ArgumentParser(prog="python -m serve.knob_timing",
                                 description="Re-time a checkpoint's knob table on the served path (in place).")
    ap.add_argument("checkpoint", help="checkpoint directory")
    ap.add_argument("--dataset", default=None,
                    help="the checkpoint's dataset (default: the source the checkpoint records): " + DATASET_HELP)
    ap.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="validation nodes timed per setting (0 = all; default: %(default)s)")
    ap.add_argument("--seed", type=int, default=None, help="sample seed (default: the training seed)")
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                    help="timed passes over the sample per setting, each node keeping its fastest (default: %(default)s)")
    ap.add_argument("--ppr-cache", default=None, help="PPR index directory (default REPO/_ppr or a temporary one)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs (default: %(default)s)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    from models.train import _stage_logging

    from .runtime import RuntimeOptions

    restore = _stage_logging((log.name,))
    try:
        doc = retime_knobs(args.checkpoint, args.dataset, nodes=args.nodes, seed=args.seed, repeats=args.repeats,
                           options=RuntimeOptions(device=args.device), ppr_cache_dir=args.ppr_cache,
                           progress=not args.no_progress)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        restore()
    print(f"{args.checkpoint}: latency {doc['latency_source']} on {doc['latency_nodes']} nodes")
    print("  | K | S | path | ms/node served | ms/node training copy |")
    for r in doc["rows"]:
        print(f"  | {r['ppr_budget']} | {r['sampling_width']} | {r['latency_path']} | {r['latency_ms_per_node']:.4f} | "
              f"{r.get('train_latency_ms_per_node', float('nan')):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
