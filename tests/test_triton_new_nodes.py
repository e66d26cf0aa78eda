"""New nodes through KServe ``ModelInfer`` / ``ModelStreamInfer`` (serve/triton.py): the optional inputs
``NEW_NODE_FEATURES`` [m, F], ``NEW_NODE_NEIGHBOR_COUNTS`` [m], ``NEW_NODE_NEIGHBORS`` [e] and
``NEW_NODE_EDGE_WEIGHTS`` [e], on a real server on loopback.

* answers equal the native SDK's ``GnnClient.predict(model, nodes, new_nodes=[NewNode(...)])`` (shaDow and
  GCN, raw and contents encodings, with and without NODE_IDS, with and without weights), on the stream too;
* every malformed input is INVALID_ARGUMENT naming the input;
* the wire pre-check (serve/wire.py) counts each input against its own limit: big features pass, too many
  ids or neighbours are refused on the bytes ("at least": before protobuf parses the request);
* ModelConfig / ModelMetadata list the inputs; one tritonclient run (a subprocess: its protobuf types
  cannot share the server's pool) sends them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from clients import GnnClient, NewNode
from clients._gen import inference_pb2 as pb
from clients._gen import inference_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent
Tensor = pb.ModelInferRequest.InferInputTensor
F = 16  # tiny_dataset's features per node
DTYPES = {"INT64": ("<i8", "int64_contents"), "FP32": ("<f4", "fp32_contents"), "INT32": ("<i4", "int_contents"),
          "FP64": ("<f8", "fp64_contents")}


def _request(model: str, inputs: list[tuple[str, str, list[int], Any]], *, raw: bool = True,
             outputs: tuple[str, ...] = ("LABELS", "PROBABILITIES"), **params: int) -> pb.ModelInferRequest:
    """A ModelInferRequest of ``(name, datatype, shape, values)`` inputs, raw or in contents."""
    req = pb.ModelInferRequest(model_name=model, outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=o)
                                                          for o in outputs])
    for name, datatype, shape, values in inputs:
        t = req.inputs.add(name=name, datatype=datatype, shape=shape)
        dtype, field = DTYPES[datatype]
        arr = np.asarray(values, dtype=dtype).ravel()
        if raw:
            req.raw_input_contents.append(arr.tobytes())
        else:
            getattr(t.contents, field).extend(arr.tolist())
    for key, value in params.items():
        req.parameters[key].int64_param = value
    return req


def _new_node_inputs(new: list[NewNode], weights: bool = True) -> list[tuple[str, str, list[int], Any]]:
    feats = np.stack([np.asarray(n.features, np.float32) for n in new])
    counts = [len(n.neighbors) for n in new]
    nbrs = [int(v) for n in new for v in n.neighbors]
    out = [("NEW_NODE_FEATURES", "FP32", [len(new), feats.shape[1]], feats),
           ("NEW_NODE_NEIGHBOR_COUNTS", "INT64", [len(new)], counts),
           ("NEW_NODE_NEIGHBORS", "INT64", [len(nbrs)], nbrs)]
    if weights:
        out.append(("NEW_NODE_EDGE_WEIGHTS", "FP32", [len(nbrs)],
                    [float(w) for n in new for w in (n.edge_weights if n.edge_weights is not None else ())]))
    return out


def _outputs(resp: pb.ModelInferResponse) -> tuple[np.ndarray, np.ndarray]:
    by = {o.name: i for i, o in enumerate(resp.outputs)}
    labels = np.frombuffer(resp.raw_output_contents[by["LABELS"]], dtype="<i8")
    probs = np.frombuffer(resp.raw_output_contents[by["PROBABILITIES"]], dtype="<f4").reshape(len(labels), -1)
    return labels, probs


def _new_nodes(dataset: Any, weighted: bool, seed: int = 0) -> list[NewNode]:
    rng = np.random.default_rng(seed)
    out = []
    for i, d in enumerate((3, 0, 5)):  # one new node without edges
        nbrs = rng.choice(dataset.num_nodes, d, replace=False)
        w = rng.uniform(0.1, 2.0, d).astype(np.float32) if weighted else None
        out.append(NewNode(dataset.x[10 * i + 1] + 0.1 * rng.standard_normal(F).astype(np.float32), nbrs, w))
    return out


@pytest.fixture(scope="module")
def stub(served):
    with grpc.insecure_channel(served.address) as ch:
        yield pb_grpc.GRPCInferenceServiceStub(ch)


@pytest.fixture(scope="module")
def native(served):
    with GnnClient(served.address) as c:
        yield c


def _refused(stub, req: pb.ModelInferRequest) -> str:
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(req, timeout=60)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
    return ei.value.details()


# ---------------------------------------------------------------------------- answers
@pytest.mark.parametrize("model", ["shadow", "gcn"])
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "contents"])
def test_new_nodes_answer_as_native_predict(stub, native, tiny_dataset, model, raw):
    ids = [0, 17, 5]
    for with_ids in (True, False):
        for weighted in (True, False):
            new = _new_nodes(tiny_dataset, weighted, seed=int(with_ids) * 2 + int(weighted))
            expected = native.predict(model, ids if with_ids else [], new_nodes=new, sampling_width=0)
            inputs = _new_node_inputs(new, weights=weighted)
            if with_ids:
                inputs.insert(0, ("NODE_IDS", "INT64", [len(ids)], ids))
            labels, probs = _outputs(stub.ModelInfer(_request(model, inputs, raw=raw, sampling_width=0), timeout=60))
            assert len(labels) == len(ids) * with_ids + len(new)
            np.testing.assert_array_equal(labels, expected.labels, err_msg=f"{with_ids=} {weighted=}")
            np.testing.assert_allclose(probs, expected.probabilities, atol=1e-5, err_msg=f"{with_ids=} {weighted=}")


def test_neighbours_and_weights_with_a_batch_dimension(stub, native, tiny_dataset):
    """NEW_NODE_NEIGHBORS and NEW_NODE_EDGE_WEIGHTS as [1, e]: what a client reading their dims [-1] in a batching
    model's configuration sends (a batch dimension first); the same answers as [e]."""
    new = _new_nodes(tiny_dataset, True, seed=5)
    expected = native.predict("shadow", [], new_nodes=new, sampling_width=0)
    inputs = [(name, dt, [1, *shape] if name in ("NEW_NODE_NEIGHBORS", "NEW_NODE_EDGE_WEIGHTS") else shape, v)
              for name, dt, shape, v in _new_node_inputs(new)]
    for raw in (True, False):
        labels, probs = _outputs(stub.ModelInfer(_request("shadow", inputs, raw=raw, sampling_width=0), timeout=60))
        np.testing.assert_array_equal(labels, expected.labels)
        np.testing.assert_allclose(probs, expected.probabilities, atol=1e-5)


def test_weights_change_the_answer(stub, tiny_dataset):
    # the weights reach the model: the same new node with other weights gets other probabilities
    new = [NewNode(tiny_dataset.x[3], [1, 2, 3, 4], [1.0, 1.0, 1.0, 1.0])]
    inputs = _new_node_inputs(new)
    _, one = _outputs(stub.ModelInfer(_request("gcn", inputs, sampling_width=0), timeout=60))
    inputs[3] = ("NEW_NODE_EDGE_WEIGHTS", "FP32", [4], [5.0, 0.0, 0.0, 0.5])
    _, other = _outputs(stub.ModelInfer(_request("gcn", inputs, sampling_width=0), timeout=60))
    assert not np.allclose(one, other)


def test_features_alone_are_nodes_without_edges(stub, native, tiny_dataset):
    feats = tiny_dataset.x[[4, 9]]
    expected = native.predict("shadow", [], new_nodes=[NewNode(f, []) for f in feats], sampling_width=0)
    req = _request("shadow", [("NEW_NODE_FEATURES", "FP32", [2, F], feats)], sampling_width=0)
    labels, probs = _outputs(stub.ModelInfer(req, timeout=60))
    np.testing.assert_array_equal(labels, expected.labels)
    np.testing.assert_allclose(probs, expected.probabilities, atol=1e-5)


def test_stream_answers_new_nodes_in_order(stub, native, tiny_dataset):
    new = _new_nodes(tiny_dataset, True, seed=9)
    expected = native.predict("gcn", [7], new_nodes=new, sampling_width=0)
    good = _request("gcn", [("NODE_IDS", "INT64", [1], [7]), *_new_node_inputs(new)], sampling_width=0)
    bad = _request("gcn", [("NEW_NODE_FEATURES", "FP32", [1, F], np.zeros(F)),
                           ("NEW_NODE_NEIGHBOR_COUNTS", "INT64", [1], [2]),
                           ("NEW_NODE_NEIGHBORS", "INT64", [1], [3])])
    answers = list(stub.ModelStreamInfer(iter([good, bad, good]), timeout=120))
    assert len(answers) == 3
    assert answers[1].error_message.startswith("INVALID_ARGUMENT") and "NEW_NODE_NEIGHBOR_COUNTS" in \
        answers[1].error_message, answers[1].error_message
    for a in (answers[0], answers[2]):
        assert not a.error_message, a.error_message
        labels, probs = _outputs(a.infer_response)
        np.testing.assert_array_equal(labels, expected.labels)
        np.testing.assert_allclose(probs, expected.probabilities, atol=1e-5)


# ---------------------------------------------------------------------------- malformed inputs
def _base(**change: Any) -> list[tuple[str, str, list[int], Any]]:
    inputs = {"NODE_IDS": ("NODE_IDS", "INT64", [2], [0, 1]),
              "NEW_NODE_FEATURES": ("NEW_NODE_FEATURES", "FP32", [2, F], np.ones((2, F))),
              "NEW_NODE_NEIGHBOR_COUNTS": ("NEW_NODE_NEIGHBOR_COUNTS", "INT64", [2], [2, 1]),
              "NEW_NODE_NEIGHBORS": ("NEW_NODE_NEIGHBORS", "INT64", [3], [4, 5, 6]),
              "NEW_NODE_EDGE_WEIGHTS": ("NEW_NODE_EDGE_WEIGHTS", "FP32", [3], [1.0, 0.5, 2.0])}
    for name, value in change.items():
        if value is None:
            inputs.pop(name)
        else:
            inputs[name] = (name, *value)
    return list(inputs.values())


MALFORMED = {
    "features datatype": (_base(NEW_NODE_FEATURES=("FP64", [2, F], np.ones((2, F)))),
                          "input NEW_NODE_FEATURES must be FP32, got FP64"),
    "features shape": (_base(NEW_NODE_FEATURES=("FP32", [2 * F], np.ones(2 * F))),
                       "input NEW_NODE_FEATURES must have shape [m, F] with F = 16"),
    "features width": (_base(NEW_NODE_FEATURES=("FP32", [2, F + 1], np.ones((2, F + 1)))),
                       "input NEW_NODE_FEATURES must have shape [m, F] with F = 16"),
    "counts datatype": (_base(NEW_NODE_NEIGHBOR_COUNTS=("INT32", [2], [2, 1])),
                        "input NEW_NODE_NEIGHBOR_COUNTS must be INT64, got INT32"),
    "counts shape": (_base(NEW_NODE_NEIGHBOR_COUNTS=("INT64", [1, 2], [2, 1])),
                     "input NEW_NODE_NEIGHBOR_COUNTS must have shape [n] or [n, 1]"),
    "neighbors shape": (_base(NEW_NODE_NEIGHBORS=("INT64", [3, 1], [4, 5, 6])),
                        "input NEW_NODE_NEIGHBORS must have shape [e] or [1, e]"),
    "neighbors batch of 2": (_base(NEW_NODE_NEIGHBORS=("INT64", [2, 3], [4, 5, 6, 4, 5, 6])),
                             "input NEW_NODE_NEIGHBORS must have shape [e] or [1, e]"),
    "weights datatype": (_base(NEW_NODE_EDGE_WEIGHTS=("INT64", [3], [1, 1, 1])),
                         "input NEW_NODE_EDGE_WEIGHTS must be FP32, got INT64"),
    "counts too few": (_base(NEW_NODE_NEIGHBOR_COUNTS=("INT64", [2], [1, 1])),
                       "input NEW_NODE_NEIGHBOR_COUNTS adds up to 2 neighbours, but NEW_NODE_NEIGHBORS has 3"),
    "counts too many": (_base(NEW_NODE_NEIGHBOR_COUNTS=("INT64", [2], [2, 9])),
                        "input NEW_NODE_NEIGHBOR_COUNTS adds up to more neighbours, but NEW_NODE_NEIGHBORS has 3"),
    "negative count": (_base(NEW_NODE_NEIGHBOR_COUNTS=("INT64", [2], [4, -1])),
                       "input NEW_NODE_NEIGHBOR_COUNTS[1] is -1: a neighbour count must be >= 0"),
    "one count per node": (_base(NEW_NODE_NEIGHBOR_COUNTS=("INT64", [3], [2, 1, 0])),
                           "input NEW_NODE_NEIGHBOR_COUNTS has 3 counts for 2 new nodes"),
    "weights length": (_base(NEW_NODE_EDGE_WEIGHTS=("FP32", [2], [1.0, 1.0])),
                       "input NEW_NODE_EDGE_WEIGHTS has 2 weights for 3 neighbours"),
    "counts without neighbours": (_base(NEW_NODE_NEIGHBORS=None, NEW_NODE_EDGE_WEIGHTS=None),
                                  "input NEW_NODE_NEIGHBOR_COUNTS needs NEW_NODE_NEIGHBORS"),
    "neighbours without counts": (_base(NEW_NODE_NEIGHBOR_COUNTS=None),
                                  "input NEW_NODE_NEIGHBORS needs NEW_NODE_NEIGHBOR_COUNTS"),
    "weights without neighbours": (_base(NEW_NODE_NEIGHBOR_COUNTS=None, NEW_NODE_NEIGHBORS=None),
                                   "input NEW_NODE_EDGE_WEIGHTS needs NEW_NODE_NEIGHBORS"),
    "neighbours without features": (_base(NEW_NODE_FEATURES=None), "input NEW_NODE_NEIGHBOR_COUNTS needs "
                                    "NEW_NODE_FEATURES"),
    "unknown input": ([*_base(), ("NEW_NODE_LABELS", "INT64", [1], [1])], "unknown inputs ['NEW_NODE_LABELS']"),
    "duplicate input": ([*_base(), ("NEW_NODE_NEIGHBORS", "INT64", [3], [4, 5, 6])],
                        "input NEW_NODE_NEIGHBORS given more than once"),
    "no nodes": ([("NODE_IDS", "INT64", [0], [])], "request has no nodes"),
    # the semantic checks stay validate_predict's (serve/validation.py), as for native Predict
    "neighbour out of range": (_base(NEW_NODE_NEIGHBORS=("INT64", [3], [4, 5, 10**6])),
                               "new_nodes[1] neighbours out of range [0, 800): 1000000"),
    "negative weight": (_base(NEW_NODE_EDGE_WEIGHTS=("FP32", [3], [1.0, 1.0, -1.0])),
                        "new_nodes[1].edge_weights[0]: weight -1.0"),
    "NaN feature": (_base(NEW_NODE_FEATURES=("FP32", [2, F], np.full((2, F), np.nan))),
                    "new_nodes[0]: features must be finite"),
}


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "contents"])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_inputs_are_refused_naming_them(stub, case, raw):
    inputs, words = MALFORMED[case]
    msg = _refused(stub, _request("shadow", inputs, raw=raw))
    assert words in msg, msg


def test_the_valid_base_request_is_answered(stub):
    # MALFORMED's cases each change one thing of this request
    for raw in (True, False):
        labels, _ = _outputs(stub.ModelInfer(_request("shadow", _base(), raw=raw), timeout=60))
        assert len(labels) == 4


def test_raw_and_contents_layout(stub):
    req = _request("shadow", _base())
    req.inputs[1].contents.fp32_contents.append(1.0)  # raw data and contents
    assert "input NEW_NODE_FEATURES has both contents (fp32_contents) and raw_input_contents" in _refused(stub, req)
    req = _request("shadow", _base())
    del req.raw_input_contents[-1]  # all inputs raw, or none
    assert "4 raw_input_contents entries for 5 inputs" in _refused(stub, req)
    req = _request("shadow", _base(), raw=False)
    req.inputs[1].contents.ClearField("fp32_contents")
    req.inputs[1].contents.fp64_contents.extend([1.0] * 2 * F)
    msg = _refused(stub, req)
    assert "input NEW_NODE_FEATURES (FP32) has its values in contents.fp64_contents" in msg, msg
    req = _request("shadow", _base())
    req.raw_input_contents[1] = req.raw_input_contents[1][:-4]
    assert f"input NEW_NODE_FEATURES: {8 * F - 4} raw bytes for shape [2, 16] (need {8 * F})" in _refused(stub, req)
    req = _request("shadow", _base(), raw=False)
    req.inputs[3].contents.int64_contents.append(7)
    assert "input NEW_NODE_NEIGHBORS: 4 values for shape [3]" in _refused(stub, req)


def test_too_many_nodes_after_the_parse(stub):
    # under the wire's counts (ids + counts <= 4096) but 4000 ids + 200 new nodes are over the node limit
    inputs = [("NODE_IDS", "INT64", [4000], np.zeros(4000)),
              ("NEW_NODE_FEATURES", "FP32", [200, F], np.ones((200, F)))]
    msg = _refused(stub, _request("shadow", inputs))
    assert "request has 4200 nodes (NODE_IDS and NEW_NODE_FEATURES rows), more than the limit of 4096" in msg, msg


# ---------------------------------------------------------------------------- wire limits
@pytest.fixture(scope="module")
def small_edges(tiny_repo):
    from .serving import ServerThread

    with ServerThread(tiny_repo, {"runtime_kw": {"max_new_node_edges": 200}}) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        yield pb_grpc.GRPCInferenceServiceStub(ch)


def test_big_features_pass_the_wire(small_edges):
    # 1,000 new nodes x 16 features = 16,000 floats: more than the node limit of elements, and answered
    m = 1000
    for raw in (True, False):
        req = _request("gcn", [("NEW_NODE_FEATURES", "FP32", [m, F], np.ones((m, F)))], raw=raw)
        labels, _ = _outputs(small_edges.ModelInfer(req, timeout=120))
        assert len(labels) == m


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "contents"])
def test_wire_refuses_too_many_ids_and_neighbours(small_edges, raw):
    req = _request("gcn", [("NODE_IDS", "INT64", [4097], np.zeros(4097))], raw=raw)
    msg = _refused(small_edges, req)
    assert "at least 4097 nodes, more than the limit of 4096" in msg, msg  # "at least": the wire's count
    nbrs = list(range(201))
    inputs = [("NEW_NODE_FEATURES", "FP32", [1, F], np.ones(F)), ("NEW_NODE_NEIGHBOR_COUNTS", "INT64", [1], [201]),
              ("NEW_NODE_NEIGHBORS", "INT64", [201], nbrs)]
    msg = _refused(small_edges, _request("gcn", inputs, raw=raw))
    assert "input NEW_NODE_NEIGHBORS has at least 201 values, more than the limit of 200" in msg, msg
    inputs[1:] = [("NEW_NODE_NEIGHBOR_COUNTS", "INT64", [1], [200]), ("NEW_NODE_NEIGHBORS", "INT64", [200], nbrs[:200]),
                  ("NEW_NODE_EDGE_WEIGHTS", "FP32", [201], np.ones(201))]
    msg = _refused(small_edges, _request("gcn", inputs, raw=raw))
    assert "input NEW_NODE_EDGE_WEIGHTS has at least 201 values, more than the limit of 200" in msg, msg
    # an unknown name counts as node ids, the strictest limit: not a way around the limits
    req = _request("gcn", [("NODE_IDS", "INT64", [1], [0]), ("SOMETHING", "FP32", [9000], np.ones(9000))], raw=raw)
    msg = _refused(small_edges, req)
    assert "at least" in msg and "more than the limit of 4096" in msg, msg


def test_wire_counts_neighbours_under_their_limit(small_edges, tiny_dataset):
    # 200 neighbours (under the edge limit) with 200 weights: answered
    nbrs = list(range(200))
    inputs = [("NEW_NODE_FEATURES", "FP32", [1, F], tiny_dataset.x[0]),
              ("NEW_NODE_NEIGHBOR_COUNTS", "INT64", [1], [200]), ("NEW_NODE_NEIGHBORS", "INT64", [200], nbrs),
              ("NEW_NODE_EDGE_WEIGHTS", "FP32", [200], np.ones(200))]
    labels, _ = _outputs(small_edges.ModelInfer(_request("gcn", inputs), timeout=60))
    assert len(labels) == 1


# ---------------------------------------------------------------------------- configuration
INPUT_NAMES = ["NODE_IDS", "NEW_NODE_FEATURES", "NEW_NODE_NEIGHBOR_COUNTS", "NEW_NODE_NEIGHBORS",
               "NEW_NODE_EDGE_WEIGHTS"]


@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_config_and_metadata_list_the_inputs(stub, model):
    cfg = stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=60).config
    got = {i.name: (pb.DataType.Name(i.data_type), list(i.dims), i.HasField("reshape"), i.optional,
                    i.allow_ragged_batch) for i in cfg.input}
    assert list(got) == INPUT_NAMES
    # neighbours and weights: ragged (their length is the request's edge count, not its node count)
    assert got == {"NODE_IDS": ("TYPE_INT64", [1], True, True, False),
                   "NEW_NODE_FEATURES": ("TYPE_FP32", [F], False, True, False),
                   "NEW_NODE_NEIGHBOR_COUNTS": ("TYPE_INT64", [1], True, True, False),
                   "NEW_NODE_NEIGHBORS": ("TYPE_INT64", [-1], False, True, True),
                   "NEW_NODE_EDGE_WEIGHTS": ("TYPE_FP32", [-1], False, True, True)}
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=60)
    # as Triton reports a batching model's inputs: the batch dimension, then the config's dims (test_triton_client)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("NODE_IDS", "INT64", [-1, 1]), ("NEW_NODE_FEATURES", "FP32", [-1, F]),
        ("NEW_NODE_NEIGHBOR_COUNTS", "INT64", [-1, 1]), ("NEW_NODE_NEIGHBORS", "INT64", [-1, -1]),
        ("NEW_NODE_EDGE_WEIGHTS", "FP32", [-1, -1])]


# ---------------------------------------------------------------------------- tritonclient
#: run in a subprocess with ``python -c`` (this module imports the server's protobuf types, which cannot share
#: tritonclient's pool): tritonclient sends NODE_IDS and the NEW_NODE_* inputs (raw, as it does)
CLIENT = """
import json, sys
import numpy as np
import tritonclient.grpc as tg

p = json.loads(sys.argv[2])
arrays = {"NODE_IDS": np.asarray(p["ids"], np.int64), "NEW_NODE_FEATURES": np.asarray(p["features"], np.float32),
          "NEW_NODE_NEIGHBOR_COUNTS": np.asarray(p["counts"], np.int64),
          "NEW_NODE_NEIGHBORS": np.asarray(p["neighbors"], np.int64),
          "NEW_NODE_EDGE_WEIGHTS": np.asarray(p["weights"], np.float32)}
inputs = []
for name, arr in arrays.items():
    inp = tg.InferInput(name, list(arr.shape), "INT64" if arr.dtype == np.int64 else "FP32")
    inp.set_data_from_numpy(arr)
    inputs.append(inp)
client = tg.InferenceServerClient(sys.argv[1])
res = client.infer("gcn", inputs, outputs=[tg.InferRequestedOutput("LABELS"), tg.InferRequestedOutput("PROBABILITIES")],
                   parameters={"sampling_width": 0})
print(json.dumps({"labels": res.as_numpy("LABELS").tolist(), "probabilities": res.as_numpy("PROBABILITIES").tolist()}))
"""


@pytest.mark.skipif(importlib.util.find_spec("tritonclient") is None, reason="tritonclient not installed")
def test_tritonclient_sends_new_nodes(served, native, tiny_dataset):
    new = _new_nodes(tiny_dataset, True, seed=4)
    expected = native.predict("gcn", [3, 8], new_nodes=new, sampling_width=0)
    payload = {"ids": [3, 8], "features": [np.asarray(n.features, np.float32).tolist() for n in new],
               "counts": [len(n.neighbors) for n in new], "neighbors": [int(v) for n in new for v in n.neighbors],
               "weights": [float(w) for n in new for w in n.edge_weights]}
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CLIENT, served.address, json.dumps(payload)], capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout)
    np.testing.assert_array_equal(got["labels"], expected.labels)
    np.testing.assert_allclose(got["probabilities"], expected.probabilities, atol=1e-5)
