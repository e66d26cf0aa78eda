"""A knob-table width above a model's degree bound: the clamped request keeps its row's expected accuracy.

``max_sampling_width`` bounds every aggregated row's degree (the graph's maximum degree; for a shaDow
model also ``K - 1`` of its largest budget), so a width at or above it keeps every edge: the same
computation as the table's row at the larger width. Real models trained on the tiny graph (maximum
degree 114) with a knob-table width of 256, a real server on loopback; the expected accuracy must come
through the native API, the SDK, the client CLI and the KServe/Triton response parameters.
"""

from __future__ import annotations

import json
import shutil

import grpc
import numpy as np
import pytest

from clients import GnnClient
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc

from .serving import ServerThread, make_repo

WIDE = 256  # a knob-table width above every degree bound of the tiny graph
FASTEST = 8  # the shaDow row (K = 8, S = WIDE) is made the table's fastest: a loss alone picks it


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_dataset):
    root = tmp_path_factory.mktemp("knob-clamp")
    assert int(tiny_dataset.graph.degrees.max()) < WIDE
    make_repo(root, tiny_dataset, {"shadow": "shadow-sage"}, knob_widths=[0, 4, WIDE], epochs=15, patience=15)
    # the GCN's widths: exact and WIDE, which is exact too, so WIDE is its default width (the smallest
    # width within the tolerance of exact)
    repo = make_repo(root, tiny_dataset, {"gcn": "gcn"}, knob_widths=[0, WIDE], epochs=15, patience=15)
    knobs = repo / "shadow" / "1" / "knobs.json"
    doc = json.loads(knobs.read_text())
    for r in doc["rows"]:  # the latency column only (what a re-timing rewrites); accuracies stay as trained
        if (r["ppr_budget"], r["sampling_width"]) == (FASTEST, WIDE):
            r["latency_ms_per_node"] = min(x["latency_ms_per_node"] for x in doc["rows"]) / 2
    knobs.write_text(json.dumps(doc))
    # a 2 M-node report's shape: the shaDow default width equal to its largest budget K (there 64), one above its
    # bound K - 1 (the tests here ask the shaDow model for explicit knobs, except the default's own)
    config = repo / "shadow" / "1" / "config.json"
    cfg = json.loads(config.read_text())
    cfg["default_sampling_width"] = cfg["max_ppr_budget"]
    config.write_text(json.dumps(cfg))
    srv = ServerThread(repo).start()
    yield srv
    srv.stop()
    shutil.rmtree(root, ignore_errors=True)


def _row(info, k: int, s: int):
    return next(r for r in info.knob_table if (r.ppr_budget, r.sampling_width) == (k, s))


def _raw(addr: str, **fields) -> pb.PredictResponse:
    with grpc.insecure_channel(addr) as ch:
        return pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(**fields), timeout=60)


def test_a_width_above_the_bound_is_clamped_and_keeps_its_rows_accuracy(served):
    with GnnClient(served.address, timeout=60) as c:
        gcn, shadow = c.get_model("gcn"), c.get_model("shadow")
        assert gcn.max_sampling_width == 114 and shadow.max_sampling_width == 31  # max degree; K 32 - 1
        # the checkpoint's default is WIDE; a knob-less request runs at the bound, and that is the default shown
        assert gcn.default_sampling_width == gcn.max_sampling_width
        row = _row(gcn, 0, WIDE)
        for res in (c.predict("gcn", [1]), c.predict("gcn", [1], sampling_width=WIDE)):
            assert res.settings.sampling_width == gcn.max_sampling_width
            assert res.settings.expected_accuracy == pytest.approx(row.val_accuracy) and row.val_accuracy > 0
        raw = _raw(served.address, model="gcn", nodes=[1])
        assert raw.settings.sampling_width == 114 and raw.settings.expected_accuracy == pytest.approx(row.val_accuracy)
        for k in (8, 16, 32):
            res = c.predict("shadow", [1], sampling_width=WIDE, ppr_budget=k)
            assert (res.settings.sampling_width, res.settings.ppr_budget) == (31, k)
            assert res.settings.expected_accuracy == pytest.approx(_row(shadow, k, WIDE).val_accuracy)
            # the bound itself, asked for, is the same computation and reports the same row
            assert c.predict("shadow", [1], sampling_width=31, ppr_budget=k).settings.expected_accuracy \
                == pytest.approx(_row(shadow, k, WIDE).val_accuracy)


def test_the_default_width_shown_is_the_width_a_knobless_request_runs_at(served):
    """A new user's 2 M-node report: a shaDow model showed ``default_sampling_width=64`` beside
    ``max_sampling_width=63``, and every knob-less answer echoed 63. ModelInfo (GetModel and ListModels),
    ``gnnserve models`` and KServe's ModelConfig report the default as a request without a width runs it."""
    from clients._gen import inference_pb2 as ipb
    from clients._gen import inference_pb2_grpc as ipbg
    from models.checkpoint import load_checkpoint

    repo = served.server.registry.repo
    with GnnClient(served.address, timeout=60) as c:
        listed = {m.name: m for m in c.list_models()}
        for name in ("gcn", "shadow"):
            info = c.get_model(name)
            assert listed[name].default_sampling_width == info.default_sampling_width
            trained = load_checkpoint(repo / name / "1").default_sampling_width
            assert trained > info.max_sampling_width, "the fixture's default is above the bound"
            assert info.default_sampling_width == info.max_sampling_width
            used = c.predict(name, [1], ppr_budget=info.default_ppr_budget or None).settings.sampling_width
            assert used == info.default_sampling_width
            with grpc.insecure_channel(served.address) as ch:
                cfg = ipbg.GRPCInferenceServiceStub(ch).ModelConfig(ipb.ModelConfigRequest(name=name), timeout=60)
            width = json.loads(cfg.config.parameters["sampling_width"].string_value)
            assert width["default"] == used


def test_the_clamped_width_is_the_same_computation_as_exact(served):
    """The premise of reporting the WIDE row for the clamped width: nothing is sampled at the bound."""
    nodes = list(range(0, 800, 7))
    with GnnClient(served.address, timeout=60) as c:
        for model, knobs in (("gcn", {}), ("shadow", {"ppr_budget": 32})):
            clamped = c.predict(model, nodes, sampling_width=WIDE, return_probabilities=True, **knobs)
            exact = c.predict(model, nodes, sampling_width=0, return_probabilities=True, **knobs)
            assert clamped.settings.edges_kept == clamped.settings.edges_total == exact.settings.edges_total
            assert np.array_equal(clamped.labels, exact.labels)
            np.testing.assert_allclose(clamped.probabilities, exact.probabilities, atol=1e-6)


def _loss_for_the_fastest_row(info) -> float:
    """A loss that admits the (FASTEST, WIDE) row (its loss as the knob rules read it: 1 - agreement): the table
    then picks it, the fastest."""
    from clients.knob_rules import losses

    row = _row(info, FASTEST, WIDE)
    return round(max(0.0, losses(info.knob_table)[info.knob_table.index(row)]) + 0.001, 4)


def test_a_loss_picks_the_wide_row_and_reports_its_accuracy(served, capsys):
    from serve.cli import main

    with GnnClient(served.address, timeout=60) as c:
        shadow = c.get_model("shadow")
        loss = _loss_for_the_fastest_row(shadow)
        best = shadow.best_knobs(loss)
        assert (best.ppr_budget, best.sampling_width) == (FASTEST, WIDE), "the fixture made it the fastest"
        res = c.predict("shadow", [1], max_accuracy_loss=loss)
        s = res.settings
        assert (s.sampling_width, s.ppr_budget, s.chosen_by) == (31, FASTEST, "max_accuracy_loss")
        assert s.expected_accuracy == pytest.approx(best.val_accuracy) and best.val_accuracy > 0
        # an explicit width above the bound with a loss: the loss still chooses among that width's rows
        res = c.predict("shadow", [1], sampling_width=WIDE, max_accuracy_loss=loss)
        assert (res.settings.ppr_budget, res.settings.chosen_by) == (FASTEST, "max_accuracy_loss")
        assert res.settings.expected_accuracy == pytest.approx(best.val_accuracy)
    assert main(["predict", "--server", served.address, "--model", "shadow", "--nodes", "1",
                 "--max-accuracy-loss", str(loss)]) == 0
    out = capsys.readouterr().out
    assert f"sampling_width=31 ppr_budget={FASTEST} " in out
    assert f"chosen_by=max_accuracy_loss expected_accuracy={best.val_accuracy:.4f} " in out


def test_kserve_parameters_carry_the_expected_accuracy(served):
    from clients._gen import inference_pb2 as ipb
    from clients._gen import inference_pb2_grpc as ipbg

    with GnnClient(served.address, timeout=60) as c:
        info = c.get_model("shadow")
    loss = _loss_for_the_fastest_row(info)
    best = info.best_knobs(loss)
    req = ipb.ModelInferRequest(
        model_name="shadow", raw_input_contents=[np.array([1], dtype=np.int64).tobytes()],
        inputs=[ipb.ModelInferRequest.InferInputTensor(name="NODE_IDS", datatype="INT64", shape=[1])])
    req.parameters["max_accuracy_loss"].double_param = loss
    with grpc.insecure_channel(served.address) as ch:
        resp = ipbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=60)
    p = resp.parameters
    assert (p["sampling_width"].int64_param, p["ppr_budget"].int64_param) == (31, FASTEST)
    assert "expected_accuracy" in p
    assert p["expected_accuracy"].double_param == pytest.approx(best.val_accuracy)


def test_bench_reads_the_served_settings_accuracy(served):
    # gnnserve bench without a dataset reports the knob table's accuracy of each setting: for the bound
    # width (114, not a table width) the server's reading, the WIDE row's, not NaN
    from serve.bench import measure_curve

    with GnnClient(served.address, timeout=60) as c:
        gcn = c.get_model("gcn")
        table = {(r.sampling_width, r.ppr_budget): r.val_accuracy for r in gcn.knob_table}
        rows = measure_curve(c, "gcn", [(114, 0), (WIDE, 0)], probe_nodes=np.array([1, 2]), val_accuracy=table)
    assert [r["accuracy"] for r in rows] == pytest.approx([_row(gcn, 0, WIDE).val_accuracy] * 2)


def test_a_loss_with_a_width_the_table_lacks_still_picks_the_budget(served, capsys):
    """A new-user report: ``--width 5 --max-accuracy-loss L`` (table widths 0, 4, WIDE) dropped the loss:
    the default budget, chosen_by=request. The loss picks K among the rows of width 4, the largest table
    width below 5; the request runs at width 5, which no row measured (expected accuracy n/a). A budget the
    table lacks (20: budgets 8, 16, 32) has its width picked among the K = 16 rows."""
    from clients.knob_rules import cheapest_within
    from serve.cli import main

    with GnnClient(served.address, timeout=60) as c:
        shadow = c.get_model("shadow")
        assert sorted({r.sampling_width for r in shadow.knob_table}) == [0, 4, WIDE]
        loss = 0.5  # every row of width 4 is within it: the fastest of them is the pick
        at_4 = cheapest_within(shadow.knob_table, loss, sampling_width=4)
        s = c.predict("shadow", [1], sampling_width=5, max_accuracy_loss=loss).settings
        assert (s.sampling_width, s.ppr_budget, s.chosen_by) == (5, at_4.ppr_budget, "max_accuracy_loss")
        assert s.expected_accuracy == 0.0
        at_16 = cheapest_within(shadow.knob_table, loss, ppr_budget=16)
        s = c.predict("shadow", [1], ppr_budget=20, max_accuracy_loss=loss).settings
        assert (s.ppr_budget, s.chosen_by) == (20, "max_accuracy_loss")
        assert s.sampling_width == min(at_16.sampling_width, shadow.max_sampling_width)
    assert main(["predict", "--server", served.address, "--model", "shadow", "--nodes", "1", "--width", "5",
                 "--max-accuracy-loss", str(loss)]) == 0
    out = capsys.readouterr().out
    assert f"sampling_width=5 ppr_budget={at_4.ppr_budget} " in out and "chosen_by=max_accuracy_loss " in out, out


def test_a_loss_no_row_at_the_fixed_width_meets_is_refused(served, capsys):
    """A tester's report: ``--width S --max-accuracy-loss L`` where no row of width S is within L served the
    default budget with the loss dropped (only ``chosen_by`` told). It is refused now, through the SDK and the
    CLI, with the least loss measured at that width; a loss that row meets is served."""
    from clients.errors import InvalidArgumentError
    from clients.knob_rules import losses
    from serve.cli import main

    with GnnClient(served.address, timeout=60) as c:
        shadow = c.get_model("shadow")
        table = shadow.knob_table
        loss = losses(table)
        least = {w: min(x for r, x in zip(table, loss, strict=True) if r.sampling_width == w)
                 for w in {r.sampling_width for r in table}}
        width = max(least, key=lambda w: least[w])
        assert least[width] > 0.001, least  # the tiny model's sampled widths disagree with exact on some nodes
        with pytest.raises(InvalidArgumentError, match=rf"no setting with sampling_width={width} is within "
                           rf"max_accuracy_loss=0.0: the least loss measured at sampling_width={width} is "
                           rf"{least[width]:.4f}"):
            c.predict("shadow", [1], sampling_width=width, max_accuracy_loss=0.0)
        s = c.predict("shadow", [1], sampling_width=width, max_accuracy_loss=least[width] + 1e-6).settings
        assert (s.sampling_width, s.chosen_by) == (width, "max_accuracy_loss")
    assert main(["predict", "--server", served.address, "--model", "shadow", "--nodes", "1", "--width", str(width),
                 "--max-accuracy-loss", "0"]) != 0
    err = capsys.readouterr().err
    assert "is within max_accuracy_loss=0.0" in err and "Traceback" not in err, err
