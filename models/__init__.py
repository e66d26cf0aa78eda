"""gnnserve models: GCN, GraphSAGE and the shaDow-GNN wrapper, their checkpoints, training and ONNX export.

Every model implements the serving interface of :mod:`models.base` (``project``,
``forward_batch_projected``, ``forward_batch``, ``extractor``); :func:`build_model` turns a
model's ``config()`` (as stored in a checkpoint) back into the module.
"""

from __future__ import annotations

from typing import Any

from .base import GNNModel, full_gcn_degrees
from .gcn import GCN, GCNConv
from .norm import FeatureNorm
from .sage import GraphSAGE, SAGEConv
from .shadow import ShadowGNN

__all__ = [
    "GCN",
    "MODEL_KINDS",
    "FeatureNorm",
    "GCNConv",
    "GNNModel",
    "GraphSAGE",
    "SAGEConv",
    "ShadowGNN",
    "build_model",
    "full_gcn_degrees",
]

MODEL_KINDS = ("gcn", "sage", "shadow-gcn", "shadow-sage")


def build_model(config: dict[str, Any], norm: FeatureNorm | None = None) -> GNNModel:
    """Construct a model from ``config`` (``{"arch": ..., "in_dim": ..., ...}``, as returned by ``config()``)."""
    cfg = dict(config)
    arch = cfg.pop("arch", None)
    if arch not in MODEL_KINDS:
        raise ValueError(f"unknown model architecture {arch!r}; expected one of {MODEL_KINDS}")
    if arch == "gcn":
        return GCN(**cfg, norm=norm)
    if arch == "sage":
        return GraphSAGE(**cfg, norm=norm)
    backbone = cfg.pop("backbone", arch.split("-", 1)[1])
    if f"shadow-{backbone}" != arch:
        raise ValueError(f"architecture {arch!r} does not match backbone {backbone!r}")
    return ShadowGNN(backbone, **cfg, norm=norm)
