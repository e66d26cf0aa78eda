"""Training: ``gnnserve train`` / ``python -m models.train`` and the Python API :func:`train`.

What one run does:

1. load the dataset (``.npz`` path, saved dataset directory, ``ogb:NAME`` or
   ``synthetic[:N[:seed]]``; a bad file stops with the loader's message, exit code 2);
2. fit the model (:func:`models.fit.fit`): feature normalisation on the training nodes, Adam and
   cross-entropy (full batch, mini-batches of plans, or shaDow's PPR subgraph batches), early
   stopping on validation accuracy, all seeded;
3. measure the knob table on bounded samples of the validation nodes (:func:`models.knobs.measure_knobs`):
   accuracy on up to ``knob_accuracy_nodes`` (10,000) nodes with a 95 % Wilson interval, latency on
   up to ``knob_latency_nodes`` (256) of them through a torch copy of the serving path, so the
   table's cost does not grow with the graph; pick the default knobs and write the checkpoint
   atomically (:mod:`models.checkpoint`).

``gnnserve train`` then re-times the table's ``latency_ms_per_node`` on the path the server runs
(:mod:`serve.knob_timing`: a real ``ModelRuntime``, single-node requests; ``knobs.json`` says so in
``latency_source``). ``python -m models.train`` stops at step 3: its latency column is the torch
copy's (``latency_source: "training:torch-copy"``); ``python -m serve.knob_timing CHECKPOINT``
re-times such a checkpoint afterwards.

A served model repository can be the target (``--out REPO/<name>/<version>`` while ``gnnserve serve
--repo REPO`` polls it). So the checkpoint, the knob re-timing included, is written into a staging
directory beside the target (:func:`staging_dir`: ``.<version>.train-<random>``; the repository scan
skips names starting with ``.``) and renamed into place only when it is complete
(:func:`publish_checkpoint`): a polling server sees the version appear once, whole, with the
``knobs.json`` it keeps. ``--overwrite`` swaps the new directory with the existing one in one
``renameat2(RENAME_EXCHANGE)`` (two renames where the file system lacks it), then deletes the old
one: the version's directory is a new directory (new inode, newer files), never a mix of the two.

Every stage (load, build graph, PPR lists, fit, test accuracy, knob table, write) is logged with its wall
time (logger ``models.train``; ``gnnserve train`` prints these lines on stderr) and recorded in
``metrics.json["stage_times_s"]``; long stages show tqdm bars unless ``--no-progress``. The run ends with
one "stage times: ..." line, which under ``gnnserve train`` also holds the stages after training (the
shaDow PPR index, ``ppr_index``, and the served re-timing, ``served_knob_timing``; both recorded in
``metrics.json`` too).

The code lives in three modules: :mod:`models.fit` (settings, data, extractors, evaluation, the
training loops), :mod:`models.knobs` (the knob table and the default knobs) and this one
(:func:`train`, the CLI); the names of the first two are importable from here as before.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime as _dt
import errno
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from kernels.datasets import DATASET_HELP, DatasetError, GraphDataset, load_dataset
from kernels.spmm import STRATEGIES

from . import MODEL_KINDS
from .checkpoint import CheckpointError, _fsync_dir, save_checkpoint
from .fit import (
    DEFAULT_KNOB_WIDTHS,
    DEFAULT_LAYERS,
    EarlyStopping,
    LHopExtractor,
    PPRExtractor,
    TopKTable,
    TrainConfig,
    TrainData,
    TrainResult,
    evaluate,
    evaluate_plans,
    fit,
    full_batch_bytes,
    make_ppr_config,
    plan_logits,
    ppr_table,
    predict_batched,
    project_all,
    sample_nodes,
    stage,
    step_logits,
    use_minibatch,
)
from .fit import _batches as _batches  # benchmarks/accuracy.py
from .knobs import choose_defaults, measure_knobs, wilson_interval
from .norm import NORM_MODES
from .shadow import POOLS

__all__ = [
    "DEFAULT_KNOB_WIDTHS",
    "DEFAULT_LAYERS",
    "EarlyStopping",
    "LHopExtractor",
    "PPRExtractor",
    "TopKTable",
    "TrainConfig",
    "TrainData",
    "TrainResult",
    "build_parser",
    "choose_defaults",
    "evaluate",
    "evaluate_plans",
    "fit",
    "full_batch_bytes",
    "main",
    "make_ppr_config",
    "measure_knobs",
    "plan_logits",
    "ppr_table",
    "predict_batched",
    "project_all",
    "publish_checkpoint",
    "sample_nodes",
    "stage",
    "staging_dir",
    "step_logits",
    "train",
    "use_minibatch",
    "wilson_interval",
]

log = logging.getLogger("models.train")  # the same name when run as `python -m models.train`


def _dataset_source(spec: Any, ds: GraphDataset) -> str:
    if isinstance(spec, GraphDataset):
        return ""
    s = str(spec)
    if s.startswith(("synthetic", "ogb:")):
        return s
    return str(Path(s).resolve())


def train(
    dataset: GraphDataset | str | os.PathLike[str],
    model: str = "gcn",
    out_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    ppr_lookup: Any = None,
    source: str | None = None,
    stage_times: dict[str, float] | None = None,
    **settings: Any,
) -> Path:
    """Train a model and write its checkpoint directory; returns the directory.

    Args:
        dataset: a :class:`GraphDataset`, or a spec for :func:`kernels.datasets.load_dataset`
            (``.npz`` path, dataset directory, ``ogb:NAME``, ``synthetic[:N[:seed]]``).
        model: ``"gcn"``, ``"sage"``, ``"shadow-gcn"`` or ``"shadow-sage"``.
        out_dir: the checkpoint directory to create (required).
        overwrite: replace an existing checkpoint at ``out_dir``.
        progress: show a progress bar.
        ppr_lookup: precomputed PPR top-K lists (see :func:`fit`).
        source: dataset source recorded in the checkpoint (default: the resolved spec).
        stage_times: wall times of stages run before (e.g. ``{"load": ...}``), recorded in
            ``metrics.json["stage_times_s"]`` with this run's own (``ppr_lists``, ``fit``, ``test``,
            ``knob_table``; ``write`` is only logged: the metrics are part of what it writes); a
            dataset loaded by :func:`kernels.datasets.load_dataset` adds its ``load_times``
            (``read`` or ``generate``, and ``build_graph``; both inside ``load``).
        **settings: any :class:`TrainConfig` field (``hidden``, ``layers``, ``dropout``, ``lr``,
            ``weight_decay``, ``epochs``, ``patience``, ``seed``, ``width_train``, ``ppr_k``, ``ppr``, ...).

    Raises:
        kernels.datasets.DatasetError: the dataset cannot be loaded.
        CheckpointError: ``out_dir`` exists (without ``overwrite``).
        ValueError: a bad setting.
    """
    if out_dir is None:
        raise ValueError("out_dir is required")
    out = Path(out_dir)
    _check_out(out, overwrite)
    staged, times = _train_staged(dataset, model, out, progress=progress, ppr_lookup=ppr_lookup, source=source,
                                  stage_times=stage_times, **settings)
    _log_stage_times(times)
    try:
        return publish_checkpoint(staged, out, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _check_out(out: Path, overwrite: bool) -> None:
    if os.path.lexists(out) and not overwrite:
        raise CheckpointError(f"{out} already exists; pass overwrite=True (CLI: --overwrite) or choose another --out")


#: names a server's repository holds beside its model directories (serve.registry skips names starting with "_")
_REPO_DIRS = ("_data", "_ppr", "_live")


def version_problem(out: Path) -> str | None:
    """Why a server would not serve ``out`` from a repository, as a warning (None when it would or ``out`` does not
    look meant for one). ``--out`` is any checkpoint directory: a standalone one (``export-onnx``, ``python -m
    serve.knob_timing``, tests) is fine anywhere, so this is a warning, not a refusal. It is given when the last
    component is not a positive integer (``serve.registry`` ignores such version directories) and ``out`` looks
    meant as ``REPO/<name>/<version>``: a number-like name (``0``, ``-1``, ``1.0``, ``v2``, ``latest``), a
    sibling that is a version directory, or a grandparent holding a repository's ``_data``/``_ppr``/``_live``."""
    import re

    name = out.name
    if name.isascii() and name.isdigit() and int(name) >= 1:
        return None
    parent = out.parent
    versions = sorted(int(p.name) for p in (parent.iterdir() if parent.is_dir() else ())
                      if p.is_dir() and p.name.isascii() and p.name.isdigit() and int(p.name) >= 1)
    meant = (re.fullmatch(r"[-+]?\d+(\.\d*)?|[vV]\d+|latest", name) is not None or bool(versions)
             or any((parent.parent / d).is_dir() for d in _REPO_DIRS))
    if not meant:
        return None
    free = (versions[-1] + 1) if versions else 1
    return (f"--out {str(out)!r}: a server serves REPO/<name>/<version> with a positive integer version, and "
            f"ignores {name!r}; to serve this checkpoint, write it to {str(parent / str(free))!r}")


def _train_staged(
    dataset: GraphDataset | str | os.PathLike[str],
    model: str,
    out: Path,
    *,
    progress: bool,
    ppr_lookup: Any,
    source: str | None,
    stage_times: dict[str, float] | None,
    **settings: Any,
) -> tuple[Path, dict[str, float]]:
    """:func:`train` up to a complete checkpoint in :func:`staging_dir` ``(out)``, not yet in place;
    returns the staged directory and the stage times (``write`` included; the caller logs them, with the
    stages it runs after, :func:`_log_stage_times`)."""
    cfg = TrainConfig(model=model, **settings)
    times: dict[str, float] = dict(stage_times or {})
    if isinstance(dataset, GraphDataset):
        ds = dataset
    else:
        with stage("load", times, f"dataset {dataset}"):
            ds = load_dataset(dataset)
    for name, dt in getattr(ds, "load_times", {}).items():
        times.setdefault(name, round(float(dt), 3))
    log.info("training %s on %r", cfg.model, ds)
    res = fit(ds, cfg, ppr_lookup=ppr_lookup, progress=progress, stage_times=times)

    n_settings = len(cfg.knob_widths) * len(cfg.budgets())
    n_acc = min(len(res.data.val), cfg.knob_accuracy_nodes or len(res.data.val))
    n_lat = min(n_acc, cfg.knob_latency_nodes or n_acc)
    with stage("knob_table", times, f"{n_settings} settings x (accuracy on {n_acc:,} validation nodes, "
               f"latency on {n_lat:,} x {cfg.knob_repeats})"):
        t0 = time.perf_counter()
        knob_nodes = res.knob_nodes if res.knob_nodes is not None else res.data.val
        rows = measure_knobs(res.model, res.data, res.extractor, knob_nodes, widths=cfg.knob_widths,
                             budgets=cfg.budgets(), strategy=cfg.strategy, batch_size=cfg.knob_batch_size,
                             repeats=cfg.knob_repeats, latency_nodes=cfg.knob_latency_nodes,
                             accuracy_nodes=cfg.knob_accuracy_nodes, seed=cfg.seed, progress=progress,
                             full_graph=not res.minibatch, agreement_nodes=res.agreement_nodes)
        knob_time = time.perf_counter() - t0
    default_k, default_s = choose_defaults(rows, cfg.knob_tolerance)
    kmax = cfg.ppr_k if cfg.is_shadow else 0
    exact = next(r for r in rows if r["ppr_budget"] == kmax and r["sampling_width"] == 0)

    config = {
        "extractor": res.model.extractor,
        "hops": 0 if cfg.is_shadow else int(res.model.layers),
        "dataset": {
            "name": ds.name,
            "fingerprint": ds.fingerprint(),
            "graph_fingerprint": ds.graph.fingerprint(),
            "source": source if source is not None else _dataset_source(dataset, ds),
            "num_nodes": ds.num_nodes,
            "num_edges": ds.graph.num_edges,
            "num_features": ds.num_features,
            "num_classes": ds.num_classes,
        },
        "ppr": dataclasses.asdict(res.ppr_config) if res.ppr_config is not None else None,
        "max_ppr_budget": kmax,
        "strategy": cfg.strategy,
        "default_sampling_width": int(default_s),
        "default_ppr_budget": int(default_k),
        "training": cfg.to_json(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
    }
    metrics = {
        "val_accuracy": res.val_accuracy,
        "val_loss": res.val_loss,
        "test_accuracy": res.test_accuracy,
        "val_accuracy_serving_exact": exact["val_accuracy"],
        "best_epoch": res.best_epoch,
        "epochs_run": res.epochs_run,
        "train_time_s": round(res.train_time_s, 3),
        "ppr_time_s": round(res.ppr_time_s, 3),
        "knob_time_s": round(knob_time, 3),
        "num_train": len(res.data.train),
        "num_val": len(res.data.val),
        "num_test": len(res.data.test),
        "num_val_evaluated": res.num_val_eval,
        "num_test_evaluated": res.num_test_eval,
        "minibatch": res.minibatch,
        "stage_times_s": times,
        "history": res.history,
    }
    knobs = {
        "format_version": 1,
        "measured_on": "val",
        "num_nodes": rows[0]["accuracy_nodes"],
        "population_nodes": len(res.data.val),
        "accuracy_nodes": rows[0]["accuracy_nodes"],
        "latency_nodes": rows[0]["latency_nodes"],
        "accuracy_interval": "val_accuracy_ci95: 95 % Wilson score interval on the accuracy sample",
        "agreement_nodes": int(rows[0].get("agreement_nodes", 0)),
        "agreement": ("share of agreement_nodes (a seeded sample of the graph's nodes) whose predicted label "
                      "equals the exact reference's (the exact width at the largest budget): 1 - agreement "
                      "bounds a setting's accuracy loss, the loss max_accuracy_loss compares (clients.knob_rules)"),
        "batch_size": cfg.knob_batch_size,
        "repeats": cfg.knob_repeats,
        "strategy": cfg.strategy,
        "device": str(cfg.device),
        "torch_threads": torch.get_num_threads(),
        "latency": "wall time per node of extract + induced batch + gather cached projections + forward + argmax",
        # a torch copy of the serving path in batches of batch_size; `gnnserve train` re-times the column on
        # the served path (serve.knob_timing), which rewrites this field as "served:<path names>"
        "latency_source": "training:torch-copy",
        "rows": rows,
    }
    staged = staging_dir(out)
    with stage("write", times, f"checkpoint for {out} (staged at {staged.name})"):
        path = save_checkpoint(staged, res.model, config, metrics, knobs)
    return path, times


def _log_stage_times(times: dict[str, float]) -> None:
    """The run's summary line: every stage's wall time, in the order they ran."""
    log.info("stage times: %s (%.1f s in all)", ", ".join(f"{k} {v:.1f} s" for k, v in times.items()),
             sum(v for k, v in times.items() if k not in _INSIDE_LOAD))


#: stages timed inside ``load`` (a dataset's own load_times): not added again to the total
_INSIDE_LOAD = ("read", "generate", "build_graph")


def _add_stage_times(staged: Path, times: dict[str, float], extra: dict[str, float]) -> None:
    """Add the stages that ran after training (``extra``, :data:`AfterTrain`'s answer) to ``times`` and to
    ``metrics.json["stage_times_s"]`` of the checkpoint staged at ``staged`` (rewritten atomically)."""
    import json

    from .checkpoint import METRICS_FILE

    for k, v in extra.items():
        times[k] = round(times.get(k, 0.0) + float(v), 3)
    path = staged / METRICS_FILE
    doc = json.loads(path.read_text())
    st = doc.setdefault("stage_times_s", {})
    for k in extra:
        st[k] = times[k]
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ============================================================================ putting a checkpoint in place
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def staging_dir(out: str | os.PathLike[str]) -> Path:
    """A fresh (not yet existing) directory beside ``out`` to write its checkpoint into:
    ``<parent>/.<name>.train-<random>``. A model repository's scan skips it (names starting with ``.``
    are not versions, serve.registry), so a server polling the repository never sees it."""
    out = Path(out)
    return out.parent / f".{out.name}.train-{uuid.uuid4().hex[:12]}"


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is not
    available (another OS, an old C library or kernel, a file system without it)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish_checkpoint(staged: str | os.PathLike[str], out: str | os.PathLike[str], *,
                       overwrite: bool = False) -> Path:
    """Put the complete checkpoint directory ``staged`` (from :func:`staging_dir` ``(out)``) in place at
    ``out`` and return ``out``.

    A new ``out`` is one rename. An existing one (``overwrite``) is swapped with ``staged`` in one atomic
    ``renameat2(RENAME_EXCHANGE)`` where the system has it (a reader of ``out`` sees the old checkpoint or
    the new one, never a gap), else moved aside and replaced (two renames); the old directory is deleted
    afterwards. Either way ``out`` is then a different directory (inode) with newer files, which a
    polling server can tell from the one it loaded.

    Raises:
        CheckpointError: ``out`` exists and ``overwrite`` is false.
    """
    staged, out = Path(staged), Path(out)
    if os.path.lexists(out):
        if not overwrite:
            raise CheckpointError(f"{out} already exists; pass overwrite=True (CLI: --overwrite) or choose "
                                  "another --out")
        if _rename_exchange(staged, out):
            _remove(staged)  # the old checkpoint, swapped out
        else:
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(out, old)
            os.rename(staged, out)
            _remove(old)
    else:
        os.rename(staged, out)
    _fsync_dir(out.parent)
    log.info("checkpoint in place at %s", out)
    return out


# ============================================================================ CLI


def _int_list(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in s.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from exc


def build_parser(prog: str = "gnnserve train", epilog: str | None = None) -> argparse.ArgumentParser:
    d = TrainConfig()
    # no abbreviated options: "--width 8" (predict's sampling width) would silently be --width-train
    p = argparse.ArgumentParser(prog=prog, description="Train a GNN and write a gnnserve checkpoint directory.",
                                epilog=epilog, allow_abbrev=False)
    p.add_argument("--dataset", required=True, help=DATASET_HELP)
    p.add_argument("--model", required=True, choices=MODEL_KINDS,
                   help="architecture: GCN or GraphSAGE, or their shaDow versions (a subgraph of PPR top-K "
                        "neighbours per target)")
    p.add_argument("--out", required=True, help="checkpoint directory to create")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint directory")
    p.add_argument("--hidden", type=int, default=d.hidden, help="hidden width of each layer (default: %(default)s)")
    p.add_argument("--layers", type=int, default=None,
                   help="number of layers (default: " + ", ".join(f"{n} for {k}" for k, n in DEFAULT_LAYERS.items())
                        + ")")
    p.add_argument("--dropout", type=float, default=d.dropout, help="dropout probability (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate (default: %(default)s)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help="Adam weight decay on every parameter (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=d.epochs, help="maximum training epochs (default: %(default)s)")
    p.add_argument("--patience", type=int, default=d.patience,
                   help="stop after this many epochs without a better validation accuracy (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seeds torch and the batch order (default: %(default)s)")
    p.add_argument("--width-train", type=int, default=0,
                   help="sampling width while training (0 = exact; default: %(default)s)")
    p.add_argument("--strategy", choices=STRATEGIES, default=d.strategy,
                   help="edge sampling strategy recorded as the model's default: fastrand spreads the S kept edges "
                        "over a row, bucket keeps its first S (default: %(default)s)")
    p.add_argument("--feature-norm", choices=(*NORM_MODES, "auto"), default=d.feature_norm,
                   help="feature normalisation; auto = row for sparse non-negative features, standard otherwise "
                        "(default: %(default)s)")
    p.add_argument("--binarize", action="store_true", help="map non-zero features to 1 (e.g. Coauthor counts)")
    p.add_argument("--pool", choices=POOLS, default=d.pool, help="shaDow readout pooling (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="targets per training batch (shaDow; plain models in mini-batch mode; default: %(default)s)")
    p.add_argument("--minibatch", choices=("auto", "on", "off"), default=d.minibatch,
                   help="plain models: train on mini-batches of sampled plans; auto = when full-batch training "
                        f"would need more than {d.minibatch_above_bytes >> 30} GiB (models.train.full_batch_bytes; "
                        "default: %(default)s)")
    p.add_argument("--minibatch-width", type=int, default=d.minibatch_width,
                   help="sampling width of the mini-batch training plans (0 = exact; default: %(default)s)")
    p.add_argument("--ppr-k", type=int, default=d.ppr_k, help="shaDow: maximum PPR budget K (default: %(default)s)")
    p.add_argument("--ppr-alpha", type=float, default=None,
                   help="shaDow: PPR teleport probability (see kernels.ppr; default: 0.15)")
    p.add_argument("--ppr-eps", type=float, default=None,
                   help="shaDow: PPR push tolerance (smaller: finer lists, a slower index build; default: 1e-05)")
    p.add_argument("--knob-widths", type=_int_list, default=d.knob_widths,
                   help="sampling widths of the knob table, comma-separated (0 = exact, always included; default: "
                        + ",".join(str(w) for w in d.knob_widths) + ")")
    p.add_argument("--knob-budgets", type=_int_list, default=None,
                   help="shaDow: PPR budgets of the knob table, comma-separated, e.g. 8,16,32,64 (default: the "
                        "powers of two below --ppr-k, and --ppr-k)")
    p.add_argument("--knob-batch-size", type=int, default=d.knob_batch_size,
                   help="targets per batch while measuring the knob table (default: %(default)s)")
    p.add_argument("--knob-latency-nodes", type=int, default=d.knob_latency_nodes,
                   help="validation nodes timed per knob setting (0 = all; default: %(default)s)")
    p.add_argument("--knob-accuracy-nodes", type=int, default=d.knob_accuracy_nodes,
                   help="validation nodes whose accuracy each knob setting measures, with a 95%% interval (0 = all; "
                        "default: %(default)s)")
    p.add_argument("--knob-agreement-nodes", type=int, default=d.knob_agreement_nodes,
                   help="nodes of the graph (no labels needed) on which each knob setting's labels are compared "
                        "with the exact ones: the loss max_accuracy_loss and the default knobs bound (0 = none: "
                        "validation accuracies are compared instead; default: %(default)s)")
    p.add_argument("--eval-nodes", type=int, default=d.eval_nodes,
                   help="shaDow and mini-batch plain models: validation nodes per epoch and test nodes at the end "
                        "(0 = all; default: %(default)s)")
    p.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N (default %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _device_problem(device: str) -> str | None:
    """Why ``--device`` cannot train here, as one line naming the devices there are (None when it can)."""
    import torch

    available = "cpu" + "".join(f", cuda:{i}" for i in range(torch.cuda.device_count()))
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        return f"--device {device!r} is not a device to train on: cpu, cuda or cuda:N (available: {available})"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return f"--device {device} but no CUDA device is available (available: {available})"
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"--device {device} but there is no CUDA device {dev.index} (available: {available})"
    return None


def _stage_logging(extra: Sequence[str] = ()) -> Callable[[], None]:
    """Print the stage lines of ``models.train``, ``kernels.datasets``, numba's compilations
    (``kernels.compile_log``, installed here: a first run on a machine compiles the CPU kernels for minutes, and
    says so) and the loggers ``extra`` on stderr (INFO); returns what undoes that (the handlers it added removed,
    the loggers' levels and propagation as they were). A command run in a process of its own never calls it; one
    run inside another process (``main`` from Python, a test) does, or its handlers would go on writing to the
    stream ``sys.stderr`` was at the time, perhaps closed since."""
    from kernels import compile_log

    compile_log.install()
    fmt = logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S")
    undo: list[tuple[logging.Logger, logging.Handler | None, int, bool]] = []
    for name in ("models.train", "kernels.datasets", "kernels.compile_log", *extra):
        lg = logging.getLogger(name)
        added = None
        if not any(getattr(h, "_gnnserve_stage", False) for h in lg.handlers):
            added = logging.StreamHandler(sys.stderr)
            added.setFormatter(fmt)
            added._gnnserve_stage = True  # type: ignore[attr-defined]
            lg.addHandler(added)
        undo.append((lg, added, lg.level, lg.propagate))
        lg.setLevel(logging.INFO)
        lg.propagate = False

    def restore() -> None:
        for lg, added, level, propagate in reversed(undo):
            if added is not None:
                lg.removeHandler(added)
            lg.setLevel(level)
            lg.propagate = propagate

    return restore


#: called by :func:`main` on the complete checkpoint before it is put in place at ``--out``:
#: ``after_train(staged_dir, dataset, args) -> {stage: seconds} | None``, where ``staged_dir`` is the staging
#: directory beside ``args.out`` (:func:`staging_dir`; ``gnnserve train`` re-times the knob table there,
#: serve.knob_timing). What it writes there is published with the checkpoint, in one rename. The wall times
#: it answers (``gnnserve train``: ``ppr_index``, ``served_knob_timing``) join the run's: its summary line
#: ("stage times: ...") and ``metrics.json["stage_times_s"]``. An exception makes the run fail with exit
#: code 1; the checkpoint is still put in place, as training wrote it.
AfterTrain = Callable[[Path, GraphDataset, argparse.Namespace], "dict[str, float] | None"]


def main(argv: Sequence[str] | None = None, prog: str = "gnnserve train", *,
         after_train: AfterTrain | None = None, log_names: Sequence[str] = (), epilog: str | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 1 failure, 2 bad dataset/arguments).

    ``after_train`` (see :data:`AfterTrain`) runs on the complete checkpoint, in its staging directory
    before it is put in place at ``--out``, and the loaded dataset;
    ``log_names``: further loggers whose INFO lines go to stderr with the stage lines; ``epilog``: text
    at the end of ``--help``.
    """
    from kernels.malloc import tune_malloc

    tune_malloc()
    args = build_parser(prog, epilog).parse_args(argv)
    problem = _device_problem(args.device)
    if problem is not None:  # before the dataset is loaded: torch's own errors come as tracebacks mid-run
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    restore = _stage_logging(log_names)
    try:
        return _run(args, prog, after_train)
    finally:
        restore()


def _run(args: argparse.Namespace, prog: str, after_train: Any) -> int:
    """:func:`main` after its arguments are parsed and checked (under its stage logging)."""
    ppr: dict[str, Any] = {}
    if args.ppr_alpha is not None:
        ppr["alpha"] = args.ppr_alpha
    if args.ppr_eps is not None:
        ppr["eps"] = args.ppr_eps
    times: dict[str, float] = {}
    out = Path(args.out)
    try:
        _check_out(out, args.overwrite)  # before the dataset is loaded and the model trained
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if (why := version_problem(out)) is not None:  # said before training, so a mistake costs no run
        print(f"{prog}: warning: {why}", file=sys.stderr)
    try:
        with stage("load", times, f"dataset {args.dataset}"):
            # synthetic datasets: bars only on a terminal (None), none with --no-progress
            ds = load_dataset(args.dataset, progress=False if args.no_progress else None)
    except (DatasetError, OSError, ValueError) as exc:
        print(f"error: cannot load dataset {args.dataset}: {exc}", file=sys.stderr)
        return 2
    try:
        staged, times = _train_staged(
            ds, args.model, out, progress=not args.no_progress, ppr_lookup=None,
            source=_dataset_source(args.dataset, ds), stage_times=times,
            hidden=args.hidden, layers=args.layers, dropout=args.dropout, lr=args.lr,
            weight_decay=args.weight_decay, epochs=args.epochs, patience=args.patience, seed=args.seed,
            width_train=args.width_train or None, strategy=args.strategy, feature_norm=args.feature_norm,
            binarize=args.binarize, pool=args.pool, batch_size=args.batch_size, ppr_k=args.ppr_k,
            ppr=ppr or None, knob_widths=args.knob_widths, knob_budgets=args.knob_budgets,
            knob_batch_size=args.knob_batch_size, knob_latency_nodes=args.knob_latency_nodes,
            knob_accuracy_nodes=args.knob_accuracy_nodes, knob_agreement_nodes=args.knob_agreement_nodes,
            eval_nodes=args.eval_nodes, minibatch=args.minibatch,
            minibatch_width=args.minibatch_width, device=args.device,
        )
    except (CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed: Exception | None = None
    try:
        if after_train is not None:
            try:
                extra = after_train(staged, ds, args)
                if extra:
                    _add_stage_times(staged, times, extra)
            except Exception as exc:  # the checkpoint is complete: it is still put in place, and the run fails
                log.exception("after training: %s", exc)
                failed = exc
        publish_checkpoint(staged, out, overwrite=args.overwrite)
    except CheckpointError as exc:  # --out appeared while training ran
        shutil.rmtree(staged, ignore_errors=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    _log_stage_times(times)  # last: with what ran after training (the PPR index, the served re-timing)
    if failed is not None:
        print(f"error: {out} was written, but what follows training failed: {type(failed).__name__}: {failed}",
              file=sys.stderr)
        return 1
    from .checkpoint import load_checkpoint

    ck = load_checkpoint(out)
    m = ck.metrics
    print(f"wrote {out}")
    print(f"  {ck.arch} on {ck.config['dataset']['name']}: val {m['val_accuracy']:.4f}  test {m['test_accuracy']:.4f}  "
          f"(best epoch {m['best_epoch']}, {m['train_time_s']:.1f} s)")
    print(f"  default knobs: K={ck.default_ppr_budget} S={ck.default_sampling_width} ({ck.strategy})")
    meta = ck.knobs_meta
    print(f"  knob table: accuracy on {meta.get('accuracy_nodes', meta.get('num_nodes'))} of "
          f"{meta.get('population_nodes', meta.get('num_nodes'))} validation nodes, latency on "
          f"{meta.get('latency_nodes', meta.get('num_nodes'))} ({m.get('knob_time_s', 0):.1f} s)")
    print(f"  latency source: {meta.get('latency_source', 'training:torch-copy')}")
    if meta.get("agreement_nodes"):
        print(f"  agreement with the exact labels on {meta['agreement_nodes']:,} nodes of the graph: 1 - agreement "
              "bounds each setting's accuracy loss (what max_accuracy_loss compares)")
    print("  | K | S | val acc | 95% interval | agreement | ms/node | edges kept |")
    for r in ck.knobs:
        ci = r.get("val_accuracy_ci95")
        ci_s = f"{ci[0]:.4f}-{ci[1]:.4f}" if ci else "-"
        ag = f"{r['agreement']:.4f}" if r.get("agreement") is not None else "-"
        print(f"  | {r['ppr_budget']} | {r['sampling_width']} | {r['val_accuracy']:.4f} | {ci_s} | {ag} | "
              f"{r['latency_ms_per_node']:.4f} | {r['edges_kept_fraction']:.3f} |")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:], prog="python -m models.train"))
