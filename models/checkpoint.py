"""Versioned checkpoint directories: config, safetensors weights, metrics and the knob table.

Layout of one checkpoint directory (the server's model repository holds them as
``REPO/<model-name>/<version>/``)::

    config.json          format, format_version, architecture, model (constructor arguments: dims,
                         layers, dropout, pool), normalization, extractor ("lhop" + hops, or "ppr"),
                         dataset (name, fingerprint, graph_fingerprint, source, sizes), ppr (the
                         kernels.ppr.PPRConfig fields, null for L-hop models), max_ppr_budget,
                         strategy, default_sampling_width, default_ppr_budget, training settings,
                         and the size and SHA-256 of weights.safetensors
    weights.safetensors  every parameter and buffer (safetensors: plain tensors, never a pickle)
    metrics.json         validation and test accuracy, training time, best epoch, ...
    knobs.json           the knob table: {"format_version", "measured_on", "batch_size", ...,
                         "rows": [...]}, one row per (ppr_budget K, sampling_width S) with
                         val_accuracy (fraction), latency_ms_per_node, edges_kept_fraction;
                         K = 0 for L-hop models, S = 0 = exact

:func:`save_checkpoint` writes everything into a temporary sibling directory, flushes it to disk
and renames it into place, so a crash never leaves a directory that looks like a complete
checkpoint. :func:`load_checkpoint` checks every file (presence, JSON, format version, weights
size and hash, tensor names and shapes against the architecture) and raises
:class:`CheckpointError` with a message that names the file and the problem. It never unpickles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .base import GNNModel
from .norm import FeatureNorm

__all__ = [
    "CONFIG_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "KNOBS_FILE",
    "METRICS_FILE",
    "WEIGHTS_FILE",
    "Checkpoint",
    "CheckpointError",
    "load_checkpoint",
    "model_from_config",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

FORMAT = "gnnserve.checkpoint"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
METRICS_FILE = "metrics.json"
KNOBS_FILE = "knobs.json"
_FILES = (CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE, KNOBS_FILE)
_KNOB_KEYS = ("ppr_budget", "sampling_width", "val_accuracy", "latency_ms_per_node", "edges_kept_fraction")


class CheckpointError(Exception):
    """A checkpoint directory is missing, incomplete, damaged, of another format version, or
    inconsistent (weights that do not fit the configured architecture)."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (eval mode, on ``map_location``) and its JSON documents.

    Attributes:
        path: the directory.
        config: ``config.json``.
        model: the model with its weights.
        metrics: ``metrics.json``.
        knobs: the knob-table rows (``knobs.json["rows"]``), dicts with ``ppr_budget``,
            ``sampling_width``, ``val_accuracy``, ``latency_ms_per_node``, ``edges_kept_fraction``.
        knobs_meta: the rest of ``knobs.json`` (how the table was measured).
    """

    path: Path
    config: dict[str, Any]
    model: GNNModel
    metrics: dict[str, Any]
    knobs: list[dict[str, Any]]
    knobs_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def arch(self) -> str:
        return str(self.config["architecture"])

    @property
    def extractor(self) -> str:
        return str(self.config["extractor"])

    @property
    def ppr_config(self) -> dict[str, Any] | None:
        """``kernels.ppr.PPRConfig`` fields for shaDow models (``PPRConfig(**ckpt.ppr_config)``), else ``None``."""
        ppr = self.config.get("ppr")
        return None if ppr is None else dict(ppr)

    @property
    def max_ppr_budget(self) -> int:
        """Largest K the model was trained with (0 for L-hop models)."""
        return int(self.config.get("max_ppr_budget", 0))

    @property
    def hops(self) -> int:
        """Receptive field of an L-hop model (0 for shaDow models)."""
        return int(self.config.get("hops", 0))

    @property
    def strategy(self) -> str:
        return str(self.config.get("strategy", "fastrand"))

    @property
    def default_sampling_width(self) -> int:
        return int(self.config.get("default_sampling_width", 0))

    @property
    def default_ppr_budget(self) -> int:
        return int(self.config.get("default_ppr_budget", 0))

    @property
    def dataset_fingerprint(self) -> str:
        return str(self.config["dataset"]["fingerprint"])

    @property
    def graph_fingerprint(self) -> str:
        return str(self.config["dataset"]["graph_fingerprint"])


# ----------------------------------------------------------------------------- helpers
def model_from_config(config: dict[str, Any]) -> GNNModel:
    """Build the (untrained) model a checkpoint config describes."""
    from . import build_model

    n = config["normalization"]
    norm = FeatureNorm(int(config["model"]["in_dim"]), n["mode"], bool(n.get("binarize", False)))
    return build_model(config["model"], norm=norm)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n").encode()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- save
def save_checkpoint(
    out_dir: str | os.PathLike[str],
    model: GNNModel,
    config: dict[str, Any],
    metrics: dict[str, Any],
    knobs: dict[str, Any],
    *,
    overwrite: bool = False,
) -> Path:
    """Write a checkpoint directory atomically and return its path.

    Args:
        out_dir: the checkpoint directory to create (its parent is created if needed).
        model: the trained model; its ``config()`` and normalisation go into ``config.json``.
        config: the remaining ``config.json`` entries (``extractor``, ``hops``, ``dataset``,
            ``ppr``, ``max_ppr_budget``, ``strategy``, ``default_sampling_width``,
            ``default_ppr_budget``, ``training``, ...); ``format``, ``format_version``,
            ``architecture``, ``model``, ``normalization`` and ``weights`` are filled in here.
        metrics: ``metrics.json`` content.
        knobs: ``knobs.json`` content; must hold ``rows`` with the knob-table keys.
        overwrite: replace an existing directory (the old one is moved aside first and deleted
            only after the new one is in place).

    Raises:
        CheckpointError: ``out_dir`` exists and ``overwrite`` is false, or the knob table is malformed.
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise CheckpointError(f"{out} already exists; pass overwrite=True (CLI: --overwrite) or choose another --out")
    rows = knobs.get("rows")
    if not isinstance(rows, list) or not rows:
        raise CheckpointError("knobs must hold a non-empty list 'rows'")
    for r in rows:
        missing = [k for k in _KNOB_KEYS if k not in r]
        if missing:
            raise CheckpointError(f"knob row {r} lacks {missing}")

    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    weights = st_save(state, metadata={"format": FORMAT, "format_version": str(FORMAT_VERSION)})
    full_config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": model.arch,
        "model": model.config(),
        "normalization": model.norm.config(),
        **config,
        "weights": {"file": WEIGHTS_FILE, "bytes": len(weights), "sha256": _sha256(weights)},
    }
    full_config.setdefault("extractor", model.extractor)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_file(tmp / WEIGHTS_FILE, weights)
        _write_file(tmp / METRICS_FILE, _json_bytes(metrics))
        _write_file(tmp / KNOBS_FILE, _json_bytes(knobs))
        _write_file(tmp / CONFIG_FILE, _json_bytes(full_config))
        _fsync_dir(tmp)
        os.chmod(tmp, 0o755)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
        os.rename(tmp, out)
        _fsync_dir(out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote checkpoint %s (%s, %d weight bytes)", out, model.arch, len(weights))
    return out


# ----------------------------------------------------------------------------- load
def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: missing {path.name} (not a checkpoint, or an incomplete one)")
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu",
                    *, verify_hash: bool = True) -> Checkpoint:
    """Load and check a checkpoint directory; the model comes back in eval mode.

    Raises:
        CheckpointError: missing directory or file, invalid JSON, unknown format or format version,
            truncated or corrupted weights (size or SHA-256 mismatch, unreadable safetensors),
            tensors missing, unexpected or of the wrong shape for the configured architecture.
    """
    d = Path(path)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory {d} does not exist")
    config = _read_json(d / CONFIG_FILE)
    if config.get("format") != FORMAT:
        raise CheckpointError(f"{d / CONFIG_FILE}: format is {config.get('format')!r}, expected {FORMAT!r}")
    version = config.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{d / CONFIG_FILE}: checkpoint format version {version!r} is not supported "
            f"(this gnnserve reads version {FORMAT_VERSION}); retrain or convert the checkpoint"
        )
    for key in ("architecture", "model", "normalization", "extractor", "dataset", "weights"):
        if key not in config:
            raise CheckpointError(f"{d / CONFIG_FILE}: missing entry {key!r}")
    metrics = _read_json(d / METRICS_FILE)
    knobs = _read_json(d / KNOBS_FILE)
    rows = knobs.get("rows")
    if not isinstance(rows, list) or not rows or any(not isinstance(r, dict) for r in rows):
        raise CheckpointError(f"{d / KNOBS_FILE}: needs a non-empty list 'rows' of objects")
    for r in rows:
        missing = [k for k in _KNOB_KEYS if k not in r]
        if missing:
            raise CheckpointError(f"{d / KNOBS_FILE}: a row lacks {missing}: {r}")

    wpath = d / WEIGHTS_FILE
    if not wpath.is_file():
        raise CheckpointError(f"{d}: missing {WEIGHTS_FILE}")
    data = wpath.read_bytes()
    winfo = config["weights"]
    if len(data) != int(winfo.get("bytes", -1)):
        raise CheckpointError(
            f"{wpath}: {len(data)} bytes, config.json records {winfo.get('bytes')}: the file is truncated or was replaced"
        )
    if verify_hash and _sha256(data) != winfo.get("sha256"):
        raise CheckpointError(f"{wpath}: SHA-256 does not match config.json: the weights are corrupted")
    try:
        state = st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{wpath}: unreadable safetensors file ({exc})") from exc

    if config["architecture"] != config["model"].get("arch"):
        raise CheckpointError(
            f"{d / CONFIG_FILE}: architecture {config['architecture']!r} != model.arch {config['model'].get('arch')!r}"
        )
    try:
        model = model_from_config(config)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{d / CONFIG_FILE}: cannot build the model from its config ({exc})") from exc
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{wpath}: tensors do not match architecture {config['architecture']!r}: "
            f"missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    bad = [f"{k}: weights {tuple(state[k].shape)} vs config {tuple(v.shape)}"
           for k, v in expected.items() if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise CheckpointError(f"{wpath}: tensor shapes do not match config.json: " + "; ".join(bad[:8]))
    model.load_state_dict(state, strict=True)
    model.to(map_location)
    model.eval()
    meta = {k: v for k, v in knobs.items() if k != "rows"}
    return Checkpoint(path=d, config=config, model=model, metrics=metrics, knobs=list(rows), knobs_meta=meta)
