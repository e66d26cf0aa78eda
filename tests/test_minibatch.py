"""Mini-batch training of plain models (issue #19): sampled execution plans instead of the full graph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels.datasets import synthetic_sbm
from models.checkpoint import load_checkpoint
from models.gcn import GCN
from models.train import TrainConfig, full_batch_bytes, train, use_minibatch


@pytest.fixture(scope="module")
def ds():
    # a weak feature signal: a node alone is often wrong, its neighbourhood helps
    return synthetic_sbm(2500, seed=7, avg_degree=14, feature_signal=0.25)


def test_auto_switch(ds) -> None:
    cfg = TrainConfig(model="gcn")
    assert 0 < full_batch_bytes(ds, cfg) < cfg.minibatch_above_bytes
    assert not use_minibatch(ds, cfg)
    assert use_minibatch(ds, TrainConfig(model="gcn", minibatch_above_bytes=full_batch_bytes(ds, cfg) - 1))
    assert use_minibatch(ds, TrainConfig(model="sage", minibatch="on"))
    assert not use_minibatch(ds, TrainConfig(model="shadow-gcn", minibatch="on"))  # shaDow is mini-batch anyway
    with pytest.raises(ValueError, match="minibatch"):
        TrainConfig(model="gcn", minibatch="sometimes")


def test_minibatch_matches_full_batch_accuracy_without_a_full_graph_pass(ds, tmp_path: Path, monkeypatch) -> None:
    settings = dict(epochs=30, patience=30, knob_widths=(0, 8), knob_repeats=1, batch_size=32, eval_nodes=200)
    full = train(ds, "gcn", tmp_path / "full", progress=False, minibatch="off", **settings)
    m_full = json.loads((full / "metrics.json").read_text())

    def no_full_graph(*args, **kwargs):
        raise AssertionError("mini-batch mode ran a full-graph propagate")

    with monkeypatch.context() as mp:
        mp.setattr(GCN, "propagate", no_full_graph)
        mb = train(ds, "gcn", tmp_path / "mb", progress=False, minibatch="on", minibatch_width=8, **settings)
    m_mb = json.loads((mb / "metrics.json").read_text())
    assert m_mb["minibatch"] is True and m_full["minibatch"] is False
    assert m_mb["num_val_evaluated"] == 200 and m_mb["num_test_evaluated"] == 200
    chance = 1 / ds.num_classes
    assert m_mb["test_accuracy"] > chance + 0.3
    assert m_mb["test_accuracy"] > m_full["test_accuracy"] - 0.05, (m_mb["test_accuracy"], m_full["test_accuracy"])
    ck = load_checkpoint(mb)  # a normal checkpoint: served like any other
    assert ck.config["training"]["minibatch"] == "on" and {r["sampling_width"] for r in ck.knobs} == {0, 8}


def test_the_test_accuracy_pass_is_a_logged_stage_with_a_bar(ds, tmp_path: Path, monkeypatch, caplog) -> None:
    """A new user's 2 M-node run: after "fit: 5 epochs in 238.8 s" a mini-batch GCN's test accuracy (10,000 exact
    plans) ran 45 s with nothing logged before "knob_table". It is a stage of its own: a start line, a bar over
    the test nodes, "test: done in", its time in metrics.json."""
    import tqdm.auto

    from .progress_support import RecordingBars

    bars = RecordingBars()
    monkeypatch.setattr(tqdm.auto, "tqdm", bars)
    with caplog.at_level("INFO", logger="models.train"):
        out = train(ds, "gcn", tmp_path / "mb", progress=True, minibatch="on", epochs=2, patience=2, batch_size=64,
                    eval_nodes=150, eval_batch_size=32, knob_widths=(0, 8), knob_repeats=1,
                    knob_accuracy_nodes=40, knob_latency_nodes=8)
    said = [r.getMessage() for r in caplog.records if r.name == "models.train"]
    steps = ("fit: 2 epochs in", "test: accuracy of the best epoch on 150 test nodes", "test: done in",
             "knob_table:")
    at = [next((i for i, m in enumerate(said) if m.startswith(s)), None) for s in steps]
    assert None not in at and at == sorted(at), said
    bar = bars.named("test accuracy")
    assert bar["unit"] == "node" and bar["total"] == sum(bar["updates"]) == 150 and len(bar["updates"]) == 5
    m = json.loads((out / "metrics.json").read_text())
    assert m["stage_times_s"]["test"] > 0 and m["num_test_evaluated"] == 150
