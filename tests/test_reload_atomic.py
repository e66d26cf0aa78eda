"""`gnnserve train --out REPO/<name>/<version>` into a repository a server polls (models.train staging and
publish_checkpoint, serve.knob_timing's re-timing in the staging directory).

A polling server must see a new version appear once, whole: with the ``knobs.json`` that stays on disk
(the latency column re-timed on the served path, which ``max_accuracy_loss`` ranks settings by), not the
training copy's table that a scan between training and re-timing would load. An ``--overwrite``'d version
must be served after the swap. Real servers on loopback (tests/serving.py), no wall-clock assertions.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from clients import GnnClient

from .serving import ServerThread, make_repo, tiny_dataset

SMALL = {"epochs": 3, "patience": 3, "knob_widths": [0, 4], "knob_latency_nodes": 8, "knob_accuracy_nodes": 40,
         "knob_repeats": 1}


def _train_args(data: Path, model: str, out: Path, *extra: str) -> list[str]:
    return ["--dataset", str(data), "--model", model, "--out", str(out), "--epochs", "3", "--patience", "3",
            "--hidden", "16", "--knob-widths", "0,4", "--knob-latency-nodes", "8", "--knob-accuracy-nodes", "40",
            "--no-progress", *extra]


def _disk_knobs(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / "knobs.json").read_text())


def _served_latencies(client: GnnClient, name: str, version: int) -> list[tuple[int, int, float]]:
    info = client.get_model(name, version)
    return [(r.ppr_budget, r.sampling_width, r.latency_ms_per_node) for r in info.knob_table]


def _disk_latencies(ckpt: Path) -> list[tuple[int, int, float]]:
    return [(r["ppr_budget"], r["sampling_width"], r["latency_ms_per_node"]) for r in _disk_knobs(ckpt)["rows"]]


def _hidden_entries(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.iterdir() if p.name.startswith("."))


def _wait_for(what: str, check: Any, timeout: float = 180) -> Any:
    """Poll ``check()`` until it returns something true (bounded; the bound is a failure, not a measurement)."""
    t_end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < t_end, f"{what}: not after {timeout} s"
        time.sleep(0.05)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", tiny_dataset(), {"m": "gcn"}, **SMALL)


def test_a_scan_during_gnnserve_train_never_loads_the_unfinished_version(repo: Path) -> None:
    """Scans at the two moments that broke: after training wrote the checkpoint, before its knob table is
    re-timed, and after the re-timing. Neither may load the version; the next scan after `gnnserve train`
    returns serves it with the knobs.json on disk."""
    from models.train import main as train_cli
    from serve.knob_timing import _after_train

    data = repo / "_data" / tiny_dataset().fingerprint()
    out = repo / "m" / "2"
    with ServerThread(repo, {"poll_s": 0}) as srv, GnnClient(srv.address) as client:
        def scan() -> bool:
            return bool(srv.call(srv.server.registry.refresh()))

        scans: list[bool] = []

        def after_train(ckpt: Path, ds: Any, args: Any) -> None:  # gnnserve train's hook, with a scan either side
            scans.append(scan())
            _after_train(ckpt, ds, args)
            scans.append(scan())

        assert train_cli(_train_args(data, "gcn", out), after_train=after_train) == 0
        scan()  # the server's next poll
        assert client.get_model("m").version == "2"
        on_disk = _disk_latencies(out)
        assert _disk_knobs(out)["latency_source"].startswith("served:")  # re-timed, and that table is served
        assert _served_latencies(client, "m", 2) == on_disk
        assert scans == [False, False], "a scan while gnnserve train ran loaded the unfinished version"
    assert _hidden_entries(repo / "m") == []  # no staging directory left behind


def test_gnnserve_train_into_a_polled_repository(repo: Path) -> None:
    """The real `gnnserve train` command while the server polls every 50 ms: v2 is served, once, with
    the knob table on disk."""
    from serve.cli import main as gnnserve

    data = repo / "_data" / tiny_dataset().fingerprint()
    out = repo / "m" / "2"
    with ServerThread(repo, {"poll_s": 0.05}) as srv, GnnClient(srv.address) as client:
        assert gnnserve(["train", *_train_args(data, "gcn", out)]) == 0
        _wait_for("v2 served", lambda: client.get_model("m").version == "2")
        assert client.get_model("m", 2).architecture == "gcn"
        assert _disk_knobs(out)["latency_source"].startswith("served:")
        assert _served_latencies(client, "m", 2) == _disk_latencies(out)
        assert _hidden_entries(repo / "m") == []


def test_an_overwritten_version_is_served_after_the_swap(repo: Path) -> None:
    """`gnnserve train --overwrite` replaces a served version with another architecture: the version's
    directory is a new one (another inode), whole, and the server's next scan serves the new checkpoint
    with its knob table."""
    from serve.cli import main as gnnserve

    data = repo / "_data" / tiny_dataset().fingerprint()
    out = repo / "m" / "1"
    with ServerThread(repo, {"poll_s": 0}) as srv, GnnClient(srv.address) as client:
        assert client.get_model("m", 1).architecture == "gcn"
        inode = os.stat(out).st_ino
        assert gnnserve(["train", *_train_args(data, "sage", out, "--overwrite")]) == 0
        assert os.stat(out).st_ino != inode  # a new directory in place of the old one
        assert json.loads((out / "config.json").read_text())["architecture"] == "sage"
        assert _hidden_entries(repo / "m") == []  # the old checkpoint deleted, the staging directory renamed
        srv.call(srv.server.registry.refresh())  # the server's next poll
        assert client.get_model("m", 1).architecture == "sage"
        assert _served_latencies(client, "m", 1) == _disk_latencies(out)


def test_publish_checkpoint_swaps_whole_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """publish_checkpoint on its own: a new version is one rename; an existing one is replaced by another
    directory (atomic exchange, or the two-rename fallback), the old one deleted, nothing left beside."""
    import models.train as mt
    from models.checkpoint import CheckpointError

    parent = tmp_path / "m"

    def staged_with(text: str) -> Path:
        d = mt.staging_dir(parent / "2")
        assert d.parent == parent and d.name.startswith(".2.train-") and not d.exists()
        d.mkdir(parents=True)
        (d / "config.json").write_text(text)
        return d

    out = mt.publish_checkpoint(staged_with("one"), parent / "2")
    assert (out / "config.json").read_text() == "one" and _hidden_entries(parent) == []
    with pytest.raises(CheckpointError, match="already exists"):
        mt.publish_checkpoint(staged_with("two"), out)
    for p in parent.iterdir():  # the refused staging directory is the caller's to remove
        if p.name.startswith("."):
            (p / "config.json").unlink()
            p.rmdir()
    for fallback in (False, True):
        if fallback:
            monkeypatch.setattr(mt, "_rename_exchange", lambda a, b: False)
        inode = os.stat(out).st_ino
        text = f"replaced, fallback={fallback}"
        assert mt.publish_checkpoint(staged_with(text), out, overwrite=True) == out
        assert (out / "config.json").read_text() == text
        assert os.stat(out).st_ino != inode
        assert _hidden_entries(parent) == []


def test_a_failed_retiming_still_puts_the_whole_checkpoint_in_place(repo: Path, capsys: pytest.CaptureFixture) -> None:
    """What follows training fails: exit 1 and the message, the checkpoint (training's knob table) in place
    whole, no staging directory left; a second run without --overwrite is refused before training."""
    from models.train import main as train_cli

    data = repo / "_data" / tiny_dataset().fingerprint()
    out = repo / "m" / "2"

    def failing(ckpt: Path, ds: Any, args: Any) -> None:
        assert ckpt != out and ckpt.parent == out.parent and ckpt.name.startswith(".2.train-")
        assert not out.exists()  # nothing at --out until the checkpoint is complete
        raise RuntimeError("no device")

    assert train_cli(_train_args(data, "gcn", out), after_train=failing) == 1
    assert "was written, but what follows training failed: RuntimeError: no device" in capsys.readouterr().err
    assert _disk_knobs(out)["latency_source"] == "training:torch-copy"
    assert _hidden_entries(repo / "m") == []
    assert train_cli(_train_args(data, "gcn", out)) == 2
    assert "already exists" in capsys.readouterr().err
