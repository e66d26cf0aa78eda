"""The knob table's latency re-timed on the served path (serve.knob_timing, issue 21 item 3): the
fields it writes, the path names (the served path of each row), the accuracy columns kept, the
shaDow path through a model repository's PPR index, and `gnnserve train` writing it all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernels.datasets import synthetic_sbm
from models.checkpoint import load_checkpoint
from models.train import train
from serve.knob_timing import retime_knobs
from serve.paths import PATH_NAMES

from .serving import make_repo, tiny_dataset


def _knobs(ckpt: Path) -> dict:
    return json.loads((ckpt / "knobs.json").read_text())


def _served_paths(doc: dict) -> list[str]:
    source = doc["latency_source"]
    assert source.startswith("served:"), source
    names = source[len("served:"):].split(",")
    assert names and set(names) <= set(PATH_NAMES), names
    return names


@pytest.fixture(scope="module")
def dense():
    """Mean degree 150 on 600 nodes: an exact 3-layer scope is the whole graph, width 2 keeps 2 + 4 + 8 rows."""
    return synthetic_sbm(600, avg_degree=150, num_features=16, num_classes=4, seed=7, name="dense")


@pytest.fixture(scope="module")
def deep_gcn(dense, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("knob-timing") / "gcn3"
    train(dense, "gcn", out, progress=False, layers=3, hidden=16, epochs=5, patience=5, knob_widths=(0, 2),
          knob_accuracy_nodes=40, knob_latency_nodes=8, knob_repeats=1)
    return out


def test_retiming_writes_served_latency(dense, deep_gcn: Path) -> None:
    before = _knobs(deep_gcn)
    assert before["latency_source"] == "training:torch-copy"
    doc = retime_knobs(deep_gcn, dense, nodes=24, seed=3, repeats=2)
    assert doc == _knobs(deep_gcn)  # written as returned
    names = _served_paths(doc)
    assert names == ["plain-compiled"]  # a 3-layer plain model: no activation cache; one-node batches compile
    assert doc["latency_nodes"] == 24 and doc["latency_seed"] == 3 and doc["latency_batch_size"] == 1
    assert doc["latency_repeats"] == 2 and doc["latency_population"] == "val" and doc["latency_time_s"] > 0
    for old, new in zip(before["rows"], doc["rows"], strict=True):
        assert new["latency_ms_per_node"] > 0 and new["latency_nodes"] == 24
        assert new["latency_path"] in PATH_NAMES
        assert new["train_latency_ms_per_node"] == old["latency_ms_per_node"]
        for key in ("ppr_budget", "sampling_width", "val_accuracy", "val_accuracy_ci95", "edges_kept_fraction",
                    "accuracy_nodes"):
            assert new[key] == old[key], key  # accuracy stays from training
    lat = {r["sampling_width"]: r["latency_ms_per_node"] for r in doc["rows"]}
    # (no comparison of the two timings: tests assert no wall-clock relations; docs/BENCHMARKS.md has them)
    # the checkpoint still loads, and the runtime's knob rules read the new column
    ck = load_checkpoint(deep_gcn)
    assert ck.knobs_meta["latency_source"] == doc["latency_source"]
    assert [r["latency_ms_per_node"] for r in ck.knobs] == [lat[0], lat[2]]

    # re-timing again keeps the training copy's figure (not the previous served one)
    again = retime_knobs(deep_gcn, dense, nodes=8, seed=3, repeats=1, write=False)
    assert [r["train_latency_ms_per_node"] for r in again["rows"]] == [r["latency_ms_per_node"]
                                                                         for r in before["rows"]]
    assert _knobs(deep_gcn) == doc  # write=False left the file alone


def test_retiming_refuses_another_dataset(deep_gcn: Path) -> None:
    with pytest.raises(ValueError, match="trained on dataset"):
        retime_knobs(deep_gcn, synthetic_sbm(200, seed=1), nodes=4, write=False)


def test_shadow_model_in_a_repository(tmp_path: Path) -> None:
    """A shaDow model at REPO/<name>/<version>: its PPR index is built where the server looks (REPO/_ppr),
    and one-node requests take the compiled shaDow path at every (K, S)."""
    ds = tiny_dataset()
    repo = make_repo(tmp_path / "repo", ds, {"shadow": "shadow-sage"}, epochs=3, patience=3, knob_widths=[0, 4],
                     knob_budgets=[8, 32], knob_latency_nodes=8, knob_accuracy_nodes=40, knob_repeats=1)
    ckpt = repo / "shadow" / "1"
    doc = retime_knobs(ckpt, ds, nodes=16, repeats=1)
    assert _served_paths(doc) == ["shadow-compiled"]
    assert {(r["ppr_budget"], r["sampling_width"]) for r in doc["rows"]} == {(8, 0), (8, 4), (32, 0), (32, 4)}
    assert all(r["latency_ms_per_node"] > 0 and r["latency_path"] == "shadow-compiled" for r in doc["rows"])
    assert any((repo / "_ppr").iterdir())  # the index the server will open instead of building it


def test_gnnserve_train_retimes(tmp_path: Path) -> None:
    from models.train import main as train_module_main
    from serve.cli import main

    common = ["--dataset", "synthetic:400", "--model", "gcn", "--epochs", "3", "--patience", "3", "--no-progress",
              "--knob-widths", "0,4", "--knob-latency-nodes", "12", "--knob-accuracy-nodes", "30"]
    assert main(["train", *common, "--out", str(tmp_path / "served")]) == 0
    doc = _knobs(tmp_path / "served")
    assert _served_paths(doc) == ["plain-activations"]  # a 2-layer plain model on the compiled CPU path
    assert doc["latency_nodes"] == 12 and doc["latency_seed"] == 0
    assert all(r["latency_ms_per_node"] > 0 and "train_latency_ms_per_node" in r for r in doc["rows"])
    assert np.isfinite([r["latency_ms_per_node"] for r in doc["rows"]]).all()

    # python -m models.train: the same run without the re-timing (models never import serve)
    assert train_module_main([*common, "--out", str(tmp_path / "plain")], prog="python -m models.train") == 0
    plain = _knobs(tmp_path / "plain")
    assert plain["latency_source"] == "training:torch-copy"
    assert all("latency_path" not in r for r in plain["rows"])


def test_gnnserve_train_summary_holds_the_index_and_the_retiming(tmp_path: Path, capsys) -> None:
    """A new user's 2 M-node run: `gnnserve train`'s "stage times:" line (and metrics.json) left out its two
    longest stages, the shaDow PPR index (333.5 s) and the served re-timing, which ran after it. The one
    summary line now comes last and holds them, and metrics.json records them."""
    from serve.cli import main

    out = tmp_path / "repo" / "shadow" / "1"
    assert main(["train", "--dataset", "synthetic:400", "--model", "shadow-sage", "--epochs", "2", "--patience", "2",
                 "--no-progress", "--ppr-k", "16", "--knob-widths", "0,4", "--knob-budgets", "8,16",
                 "--knob-latency-nodes", "6", "--knob-accuracy-nodes", "30", "--eval-nodes", "30",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    summaries = [line for line in err.splitlines() if "stage times:" in line]
    assert len(summaries) == 1, err[-3000:]
    line = summaries[0]
    for name in ("load", "fit", "test", "knob_table", "write", "ppr_index", "served_knob_timing"):
        assert f" {name} " in line, (name, line)
    assert err.index("knob timing: done in") < err.index("stage times:")
    st = json.loads((out / "metrics.json").read_text())["stage_times_s"]
    assert st["ppr_index"] > 0 and st["served_knob_timing"] > 0
    assert any((tmp_path / "repo" / "_ppr").iterdir())
