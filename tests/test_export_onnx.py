"""`gnnserve export-onnx` (models.export_onnx): every architecture, both exporters, answers equal to the served model's.

A user runs the exported file in onnxruntime (or Triton) on batches of every size, so the tests do too: a real
batch of L-hop subgraphs cut from the tiny graph, its rows and sizes unlike the exporter's trace example, against
the checkpoint's own exact forward (``forward_batch`` at width 0, the serving path's answer).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from .serving import make_repo

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

KINDS = {"gcn": "gcn", "sage": "sage", "shadow-gcn": "shadow-gcn", "shadow-sage": "shadow-sage"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory, tiny_dataset):
    return make_repo(tmp_path_factory.mktemp("onnx-repo"), tiny_dataset, KINDS)


def _batch_inputs(model, ds, targets: np.ndarray, hops: int) -> tuple[dict[str, np.ndarray], object]:
    """The exported model's inputs for the L-hop subgraphs of ``targets`` (the module docstring's table), and the
    batch itself."""
    from kernels.subgraph import induced_batch, lhop_nodes
    from models.base import segment_ids

    ptr, nodes = lhop_nodes(ds.graph, targets, hops)
    batch = induced_batch(ds.graph, ptr, nodes)
    x = np.ascontiguousarray(np.asarray(ds.x)[batch.node_ids], dtype=np.float32)
    feeds = {"x": x, "edge_index": np.ascontiguousarray(batch.graph.edge_index(), dtype=np.int64),
             "target_pos": batch.target_rows.astype(np.int64)}
    nd = model.norm_degrees_for(ds.graph, batch.node_ids)
    if nd is not None:
        feeds["norm_degrees"] = np.asarray(nd, dtype=np.float32)
    feeds["batch"] = segment_ids(torch.from_numpy(batch.ptr), batch.num_rows).numpy().astype(np.int64)
    return feeds, batch


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
@pytest.mark.parametrize("name", list(KINDS))
def test_the_exported_model_answers_as_the_checkpoint(repo, tiny_dataset, tmp_path, name, exporter):
    from models.checkpoint import load_checkpoint
    from models.export_onnx import OnnxBatchModel, export_onnx

    out = tmp_path / "m.onnx"
    info = export_onnx(repo / name / "1", out, dynamo=exporter == "dynamo")
    ckpt = load_checkpoint(repo / name / "1")
    model = ckpt.model
    want_inputs = OnnxBatchModel(model).input_names()
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == want_inputs == [n for n, _, _ in info["inputs"]]
    hops = len(model.convs)
    for targets in (np.array([5]), np.array([0, 17, 33, 101, 250])):  # sizes unlike the trace example's
        feeds, batch = _batch_inputs(model, tiny_dataset, targets, hops)
        logits, probs = sess.run(["logits", "probabilities"], {n: feeds[n] for n in want_inputs})
        with torch.no_grad():
            ref, _ = model.forward_batch(batch, torch.from_numpy(feeds["x"]), width=0,
                                         norm_degrees=feeds.get("norm_degrees"))
        assert logits.shape == (len(targets), model.num_classes)
        np.testing.assert_allclose(logits, ref.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(probs, torch.softmax(ref, 1).numpy(), atol=1e-5)
        # the answer depends on the features: another x gives other logits
        feeds2 = dict(feeds, x=feeds["x"][::-1].copy())
        other = sess.run(["logits"], {n: feeds2[n] for n in want_inputs})[0]
        assert not np.allclose(other, logits)


def test_the_cli_writes_a_triton_repository_only_for_a_model_that_exported(repo, tmp_path, monkeypatch, capsys):
    import models.export_onnx as ex

    tri = tmp_path / "triton"
    assert ex.main([str(repo / "gcn" / "1"), "--triton-repo", str(tri), "--name", "g"]) == 0
    assert (tri / "g" / "config.pbtxt").is_file() and (tri / "g" / "1" / "model.onnx").is_file()
    assert 'name: "x"' in (tri / "g" / "config.pbtxt").read_text()

    def broken(wrapper, path, dynamo):  # an exporter that fails half-way, after writing part of its file
        Path(path).write_bytes(b"partial")
        raise RuntimeError("exporter exploded\nwith a long trace")

    monkeypatch.setattr(ex, "_export", broken)
    capsys.readouterr()
    assert ex.main([str(repo / "sage" / "1"), "--triton-repo", str(tri), "--name", "s", "--out",
                    str(tmp_path / "s.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exporter exploded" in err and "nothing was written" in err
    assert not (tri / "s").exists() and not list(tmp_path.glob("s.onnx*"))


def test_an_export_that_does_not_answer_as_the_model_is_refused(repo, tmp_path, monkeypatch):
    """The check after the export runs the file on another batch: a model that baked its trace example in (what the
    legacy exporter wrote before 2026-11-29: no feature input) fails it, and nothing is written."""
    import models.export_onnx as ex
    from kernels import dense

    real_by_rows = dense._by_rows
    monkeypatch.setattr(dense, "_by_rows", lambda x, w: real_by_rows(x, w) or (
        x.device.type == "cpu" and x.dtype == w.dtype == torch.float32 and not x.requires_grad))  # the old rule
    monkeypatch.setattr(dense, "recording", lambda *t: False)
    out = tmp_path / "bad.onnx"
    with pytest.raises(ex.ExportCheckError, match=r"inputs|differ|fails"):
        ex.export_onnx(repo / "gcn" / "1", out, dynamo=False)
    assert not out.exists() and not list(tmp_path.glob("bad.onnx*"))
