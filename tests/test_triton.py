"""KServe v2 / Triton protocol: ``tritonclient`` itself against a real gnnserve server.

tritonclient registers its own copy of the ``inference`` protobuf types, which must not share a
descriptor pool with the server's generated code, so the client side runs in a subprocess
(``tests/triton_probe.py``) and reports what it saw as JSON; this process compares it with the
native gnnserve API.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tritonclient") is None, reason="tritonclient not installed")

PROBE = Path(__file__).with_name("triton_probe.py")


@pytest.fixture(scope="module")
def probe(served):
    proc = subprocess.run([sys.executable, str(PROBE), served.address], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_liveness_readiness_metadata(probe):
    assert probe["live"] and probe["ready"]
    assert probe["model_ready"] == [True, True, False]
    assert probe["server_name"] == "gnnserve"
    assert probe["inputs"] == [["NODE_IDS", "INT64"], ["NEW_NODE_FEATURES", "FP32"], ["NEW_NODE_NEIGHBOR_COUNTS", "INT64"],
                               ["NEW_NODE_NEIGHBORS", "INT64"], ["NEW_NODE_EDGE_WEIGHTS", "FP32"]]
    assert set(probe["outputs"]) == {"LABELS", "PROBABILITIES", "EMBEDDINGS"}
    assert probe["outputs"]["PROBABILITIES"][1] == [-1, 4]


def test_infer_matches_native_api_with_knobs(probe, served):
    from clients import GnnClient

    inf = probe["infer"]
    assert inf["sampling_width"] == 4 and inf["ppr_budget"] == 16
    labels, probs = np.asarray(inf["labels"]), np.asarray(inf["probabilities"])
    assert labels.shape == (len(inf["nodes"]),) and probs.shape == (len(inf["nodes"]), 4)
    with GnnClient(served.address) as native:
        ref = native.predict("shadow", inf["nodes"], sampling_width=4, ppr_budget=16)
    np.testing.assert_array_equal(labels, ref.labels)
    np.testing.assert_allclose(probs, ref.probabilities, rtol=1e-6)
    assert probe["embedding_shape"][0] == 3 and probe["embedding_shape"][1] > 0
    # Triton's priority and timeout parameters are taken (one priority level; a 30 s timeout not reached)
    assert probe["infer_priority_timeout"] == inf["labels"] == probe["infer_no_timeout"]


@pytest.mark.parametrize(
    "case, status, text",
    [
        ("out_of_range", "StatusCode.INVALID_ARGUMENT", "out of range"),
        ("unknown_model", "StatusCode.NOT_FOUND", "not found"),
        ("bad_width", "StatusCode.INVALID_ARGUMENT", "sampling_width"),
        ("bad_budget", "StatusCode.INVALID_ARGUMENT", "ppr_budget"),
        ("bad_output", "StatusCode.INVALID_ARGUMENT", "unknown outputs"),
        ("bad_timeout", "StatusCode.INVALID_ARGUMENT", "timeout must be >= 0"),
    ],
)
def test_errors_reach_tritonclient(probe, case, status, text):
    err = probe["errors"][case]
    assert err is not None, f"{case} was answered instead of refused"
    assert err["status"] == status
    assert text in err["message"]
    assert err["ready_after"]
