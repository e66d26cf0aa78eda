"""The knob table on bounded samples (issue #19): sample sizes and intervals in each row, backward
compatibility with tables without them, stage timings of a training run, the `products` shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels.datasets import load_dataset, synthetic_sbm
from kernels.plan import execution_plan
from models.checkpoint import load_checkpoint
from models.train import TrainData, measure_knobs, project_all, sample_nodes, train, wilson_interval
from serve.validation import ModelLimits, knob_rows, resolve_knobs

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ds():
    return synthetic_sbm(1500, seed=3, avg_degree=20)


@pytest.fixture(scope="module")
def gcn_dir(ds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("knobs") / "gcn"
    train(ds, "gcn", out, progress=False, epochs=15, patience=15, knob_widths=(0, 2, 8),
          knob_accuracy_nodes=60, knob_latency_nodes=20, knob_repeats=1)
    return out


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and 0.69 < lo < 0.73  # 0.7225
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_sample_nodes_is_bounded_and_seeded() -> None:
    nodes = np.arange(1000, 5000)
    a = sample_nodes(nodes, 100, seed=1)
    assert len(a) == 100 and len(np.unique(a)) == 100 and np.isin(a, nodes).all()
    assert np.array_equal(a, sample_nodes(nodes, 100, seed=1))
    assert np.array_equal(sample_nodes(nodes, 0), nodes) and np.array_equal(sample_nodes(nodes, 10**6), nodes)


def test_rows_carry_samples_and_intervals(ds, gcn_dir: Path) -> None:
    ck = load_checkpoint(gcn_dir)
    n_val = int(ds.val_mask.sum())
    assert n_val > 60
    assert ck.knobs_meta["accuracy_nodes"] == 60 and ck.knobs_meta["latency_nodes"] == 20
    assert ck.knobs_meta["population_nodes"] == n_val
    for r in ck.knobs:
        assert r["accuracy_nodes"] == 60 and r["latency_nodes"] == 20
        lo, hi = r["val_accuracy_ci95"]
        assert 0.0 <= lo <= r["val_accuracy"] <= hi <= 1.0
        # the accuracy is a count over 60 nodes
        assert round(r["val_accuracy"] * 60) == pytest.approx(r["val_accuracy"] * 60, abs=1e-3)
        assert r["latency_ms_per_node"] > 0
    widths = [r["sampling_width"] for r in ck.knobs]
    assert widths == [0, 2, 8]
    # agreement with the exact labels on every node of this small graph (knob_agreement_nodes: 10,000 by default)
    assert ck.knobs_meta["agreement_nodes"] == ds.num_nodes
    assert all(r["agreement_nodes"] == ds.num_nodes for r in ck.knobs)
    assert ck.knobs[0]["agreement"] == 1.0 and all(0.0 < r["agreement"] <= 1.0 for r in ck.knobs)
    kept = {r["sampling_width"]: r["edges_kept_fraction"] for r in ck.knobs}
    assert kept[0] == 1.0 and 0 < kept[2] < kept[8] <= 1.0


def test_plain_accuracy_matches_the_plan_path(ds, gcn_dir: Path) -> None:
    """Plain models' knob accuracy comes from one full-graph pass: it must equal the serving plans'."""
    ck = load_checkpoint(gcn_dir)
    model = ck.model
    data = TrainData(ds, model.norm)
    val = ds.split("val")
    rows = measure_knobs(model, data, None, val, widths=(0, 2, 8), budgets=(0,), strategy="fastrand",
                         batch_size=16, repeats=1, latency_nodes=8, accuracy_nodes=90, seed=5)
    acc_nodes = sample_nodes(val, 90, 5)
    proj = project_all(model, data)
    for r in rows:
        width = r["sampling_width"] or None
        correct = 0
        for i in range(0, len(acc_nodes), 16):
            chunk = acc_nodes[i : i + 16]
            plan = execution_plan(ds.graph, np.unique(chunk), model.hops, width, "fastrand")
            logits = model.forward_plan(plan, proj[torch.from_numpy(plan.node_ids)],
                                        model.norm_degrees_for(ds.graph, plan.node_ids))[0]
            logits = logits[torch.from_numpy(np.searchsorted(plan.node_ids[: plan.num_targets], chunk))]
            correct += int((logits.argmax(1) == torch.from_numpy(ds.y[chunk])).sum())
        assert r["val_accuracy"] == pytest.approx(correct / len(acc_nodes), abs=1e-6), r


@pytest.mark.parametrize("full_graph", [False, True])
def test_agreement_is_the_share_of_exact_labels_and_bounds_the_accuracy_loss(ds, gcn_dir: Path, full_graph: bool):
    """Each row's agreement is the share of the agreement sample (any nodes, no labels) whose label at that width
    equals the exact width's, from the full-graph pass or from plans alike; on those nodes the accuracy of the
    width differs from the exact one's by at most 1 - agreement, whatever the labels."""
    model = load_checkpoint(gcn_dir).model
    data = TrainData(ds, model.norm)
    agree = sample_nodes(np.arange(ds.num_nodes), 400, 9)
    rows = measure_knobs(model, data, None, ds.split("val"), widths=(0, 2, 8), budgets=(0,), strategy="fastrand",
                         batch_size=16, repeats=1, latency_nodes=8, accuracy_nodes=60, seed=5, full_graph=full_graph,
                         agreement_nodes=agree)
    proj = project_all(model, data)
    labels = {s: model.propagate(ds.graph, proj, s or None, "fastrand")[0][torch.from_numpy(agree)].argmax(1).numpy()
              for s in (0, 2, 8)}
    y = ds.y[agree]
    for r in rows:
        s = r["sampling_width"]
        assert r["agreement_nodes"] == 400
        assert r["agreement"] == pytest.approx(float(np.mean(labels[s] == labels[0])), abs=1e-6), r
        assert abs(np.mean(labels[s] == y) - np.mean(labels[0] == y)) <= 1 - r["agreement"] + 1e-9
    assert rows[0]["agreement"] == 1.0 and min(r["agreement"] for r in rows) < 1.0  # width 2 moves some labels
    without = measure_knobs(model, data, None, ds.split("val"), widths=(0, 2), budgets=(0,), strategy="fastrand",
                            batch_size=16, repeats=1, latency_nodes=8, accuracy_nodes=60, seed=5)
    assert all("agreement" not in r for r in without)


@pytest.mark.parametrize("full_graph", [False, True])
def test_the_bar_counts_nodes_inside_each_setting(ds, gcn_dir: Path, monkeypatch, full_graph: bool) -> None:
    """A new user's 2 M-node GCN: the knob table's bar counted settings and stayed at 0/6 with no ETA for the
    85 s of its first setting (the accuracy pass at every width runs there). It counts node evaluations: the
    accuracy sample at every width, then each setting's warm-up batch and timed passes."""
    import tqdm.auto

    from .progress_support import RecordingBars

    bars = RecordingBars()
    monkeypatch.setattr(tqdm.auto, "tqdm", bars)
    model = load_checkpoint(gcn_dir).model
    widths, n_acc, n_lat, batch, repeats = (0, 2, 8), 90, 12, 16, 2
    rows = measure_knobs(model, TrainData(ds, model.norm), None, ds.split("val"), widths=widths, budgets=(0,),
                         strategy="fastrand", batch_size=batch, repeats=repeats, latency_nodes=n_lat,
                         accuracy_nodes=n_acc, seed=5, progress=True, full_graph=full_graph)
    assert len(rows) == len(widths)
    bar = bars.named("knob table")
    assert bar["unit"] == "node" and bar["disable"] is False
    work = len(widths) * n_acc + len(widths) * (min(batch, n_lat) + repeats * n_lat)
    assert bar["total"] == sum(bar["updates"]) == work
    # the accuracy pass (all widths, before the first row) moves the bar step by step
    accuracy_steps = len(widths) * (1 if full_graph else -(-n_acc // batch))
    assert sum(bar["updates"][:accuracy_steps]) == len(widths) * n_acc
    assert bar["postfix"][0]["setting"] == f"1/{len(widths)}"


def test_old_tables_still_load_and_select(gcn_dir: Path, tmp_path: Path) -> None:
    import shutil

    old = tmp_path / "old"
    shutil.copytree(gcn_dir, old)
    knobs = json.loads((old / "knobs.json").read_text())
    for key in ("population_nodes", "accuracy_nodes", "latency_nodes", "accuracy_interval"):
        knobs.pop(key)
    for r in knobs["rows"]:
        for key in ("accuracy_nodes", "latency_nodes", "val_accuracy_ci95"):
            r.pop(key)
    (old / "knobs.json").write_text(json.dumps(knobs))
    for d in (gcn_dir, old):
        ck = load_checkpoint(d)
        limits = ModelLimits(name="m", num_nodes=10, num_features=4, extractor="lhop", max_ppr_budget=0,
                             max_sampling_width=64, default_sampling_width=0, default_ppr_budget=0,
                             max_nodes_per_request=10, knob_table=knob_rows(ck.knobs))
        exact = next(r for r in ck.knobs if r["sampling_width"] == 0)["val_accuracy"]
        s, _k, chosen, expected = resolve_knobs(limits, None, None, 1.0)  # anything goes: the fastest row
        assert chosen == "max_accuracy_loss"
        fastest = min(ck.knobs, key=lambda r: (r["latency_ms_per_node"], -r["val_accuracy"]))
        assert s == fastest["sampling_width"] and expected == fastest["val_accuracy"]
        _s0, _, _, e0 = resolve_knobs(limits, None, None, 0.0)
        assert e0 >= exact - 1e-12


def test_metrics_record_stage_times(gcn_dir: Path) -> None:
    m = json.loads((gcn_dir / "metrics.json").read_text())
    st = m["stage_times_s"]
    assert st["fit"] > 0 and st["knob_table"] > 0
    assert m["knob_time_s"] == pytest.approx(st["knob_table"], abs=0.01)


def test_shadow_training_evaluates_bounded_samples(tmp_path: Path) -> None:
    small = synthetic_sbm(900, seed=4)
    out = train(small, "shadow-sage", tmp_path / "sh", progress=False, epochs=2, patience=2, ppr_k=16,
                knob_widths=(0, 4), knob_budgets=(8, 16), eval_nodes=40, knob_accuracy_nodes=30,
                knob_latency_nodes=10, knob_repeats=1, knob_agreement_nodes=50)
    m = json.loads((out / "metrics.json").read_text())
    assert m["num_val_evaluated"] == 40 and m["num_test_evaluated"] == 40
    assert m["num_val"] == int(small.val_mask.sum()) > 40
    assert m["stage_times_s"]["ppr_lists"] > 0
    rows = load_checkpoint(out).knobs
    assert {(r["ppr_budget"], r["sampling_width"]) for r in rows} == {(8, 0), (8, 4), (16, 0), (16, 4)}
    assert all(r["accuracy_nodes"] == 30 and r["latency_nodes"] == 10 for r in rows)
    # the agreement sample's PPR lists were computed with the others: every row has its agreement on 50 nodes
    assert all(r["agreement_nodes"] == 50 and 0.0 <= r["agreement"] <= 1.0 for r in rows)
    assert next(r for r in rows if (r["ppr_budget"], r["sampling_width"]) == (16, 0))["agreement"] == 1.0


def test_cli_logs_every_stage(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    res = subprocess.run([sys.executable, "-m", "models.train", "--dataset", "synthetic:600", "--model", "gcn",
                          "--epochs", "2", "--out", str(tmp_path / "c"), "--no-progress", "--knob-widths", "0,4",
                          "--knob-accuracy-nodes", "25", "--knob-latency-nodes", "5"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    err = res.stderr
    for stage in ("load: done in", "synthetic graph:", "fit: 2 epochs in", "knob_table: done in", "write: done in",
                  "stage times:"):
        assert stage in err, (stage, err[-2000:])
    assert "accuracy on 25 of" in res.stdout and "95% interval" in res.stdout


def test_products_shape() -> None:
    d = load_dataset("synthetic:4000:1:products")
    assert d.num_features == 100 and d.num_classes == 47
    mean = d.graph.num_edges / d.num_nodes
    assert 35 < mean < 52, mean
    deg = np.diff(np.asarray(d.graph.indptr))
    assert deg.max() > 5 * np.median(deg)  # skewed
    with pytest.raises(ValueError, match="shape one of"):
        load_dataset("synthetic:4000:1:nosuchshape")
    default = load_dataset("synthetic:500")
    assert default.name == "synthetic-sbm-500-s0" and default.num_features == 32
