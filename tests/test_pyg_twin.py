"""Our models against their PyG twins (``benchmarks/accuracy.py``): the same function, trained the same way.

From the same weights, the same batches and the same seed per step (dropout 0.5 included: both draw
their masks in the same order), a few Adam steps of :func:`models.train.step_logits` and of the PyG
model give the same losses and the same logits afterwards. So a gap between the two columns of the
accuracy table is a matter of seeds (initial weights, dropout masks), not of the model or training.
Runs on dense features and on sparse bag-of-words features (the sparse COO input path of both).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric")

from kernels.datasets import dataset_from_arrays, synthetic_sbm
from models import build_model
from models.norm import FeatureNorm
from models.train import PPRExtractor, TrainConfig, TrainData, make_ppr_config, ppr_table, step_logits

KINDS = ("gcn", "sage", "shadow-gcn", "shadow-sage")


@pytest.fixture(scope="module")
def accuracy_mod():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "accuracy.py"
    spec = importlib.util.spec_from_file_location("gnnserve_bench_accuracy", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # PyG's MessagePassing inspects the module of a conv subclass
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def _dataset(features: str):
    ds = synthetic_sbm(300, num_classes=3, avg_degree=8, num_features=40, seed=5, name="twin")
    if features == "dense":
        return ds
    rng = np.random.default_rng(1)
    x = ((rng.random(ds.x.shape) < 0.06) | (ds.x > 1.2)).astype(np.float32)  # sparse, class-correlated
    arrays = {"edge_index": ds.graph.edge_index(), "x": x, "y": ds.y,
              "train_mask": ds.train_mask, "val_mask": ds.val_mask, "test_mask": ds.test_mask,
              "num_classes": np.int64(ds.num_classes)}
    return dataset_from_arrays(arrays, name="twin-bow")


@pytest.mark.parametrize("features", ["dense", "sparse"])
@pytest.mark.parametrize("kind", KINDS)
def test_ours_and_pyg_twin_train_identically(accuracy_mod, kind, features):
    ds = _dataset(features)
    layers = 2
    cfg = TrainConfig(model=kind, hidden=16, layers=layers, dropout=0.5, ppr_k=16)
    norm = FeatureNorm(ds.num_features, cfg.feature_norm, cfg.binarize).fit(ds.x, ds.split("train"))
    data = TrainData(ds, norm)
    assert data.sparse == (features == "sparse")
    torch.manual_seed(0)
    spec = {"arch": kind, "in_dim": ds.num_features, "hidden": 16, "num_classes": ds.num_classes,
            "layers": layers, "dropout": 0.5}
    if cfg.is_shadow:
        spec["pool"] = "mean"
    ours = build_model(spec, norm=norm)
    if cfg.is_shadow:
        twin = accuracy_mod.PygShadow(kind.split("-")[1], ds.num_features, 16, ds.num_classes, layers, 0.5)
        need = np.concatenate([data.train, data.val])
        extractor = PPRExtractor(ds.graph, ppr_table(ds.graph, need, make_ppr_config(cfg.ppr, 16), 16))
    else:
        twin = accuracy_mod.PygPlain(kind, ds.num_features, 16, ds.num_classes, layers, 0.5)
        adj = accuracy_mod._adj_t(ds.graph)
    twin.load_state_dict(accuracy_mod.twin_state_from(ours))
    opt_o = torch.optim.Adam(ours.parameters(), lr=0.01, weight_decay=5e-4)
    opt_t = torch.optim.Adam(twin.parameters(), lr=0.01, weight_decay=5e-4)
    y = data.y

    def twin_logits(b=None):
        return twin(*accuracy_mod._shadow_inputs(b, data)) if b is not None else twin(data.xn, adj)

    rng = np.random.default_rng(0)
    steps = 0
    for epoch in range(4):
        ours.train()
        twin.train()
        for chunk in np.array_split(rng.permutation(data.train), 2):
            b = extractor.batch(chunk, 16) if cfg.is_shadow else None
            rows = torch.from_numpy(chunk)
            losses = []
            for opt, which in ((opt_o, "ours"), (opt_t, "twin")):
                torch.manual_seed(100 + steps)  # the same dropout masks for both
                opt.zero_grad()
                out = step_logits(ours, data, cfg, b) if which == "ours" else twin_logits(b)
                loss = F.cross_entropy(out if b is not None else out[rows], y[rows])
                loss.backward()
                opt.step()
                losses.append(loss.item())
            steps += 1
            assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-6), (epoch, losses)
            if not cfg.is_shadow:
                break  # full batch: one step per epoch
    ours.eval()
    twin.eval()
    with torch.no_grad():
        if cfg.is_shadow:
            b = extractor.batch(data.val, 16)
            lo, lt = step_logits(ours, data, cfg, b), twin_logits(b)
        else:
            lo, lt = step_logits(ours, data, cfg), twin_logits()
    assert steps >= 4
    torch.testing.assert_close(lo, lt, rtol=1e-4, atol=1e-5)
    assert lo.std() > 0.01  # trained away from a constant output
