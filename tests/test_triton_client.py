"""What Triton's own tools need from the KServe service (serve/triton.py), on a real server on loopback with the
generated KServe stubs (no tritonclient or perf_analyzer needed):

* ``ModelMetadata`` reports each input as Triton reports a batching model's inputs: ``-1`` for the batch, then the
  configuration's ``dims`` (``NODE_IDS`` ``[-1, 1]``, neighbours ``[-1, -1]``). perf_analyzer builds its requests
  from these shapes and stopped with "unable to set shape for the input" on ``[-1]`` (an empty shape per node);
  the ``[n, 1]`` tensor it then sends is answered as ``[n]`` is;
* ``triton_enable_empty_final_response`` (a bool_param: tritonclient's ``async_stream_infer(...,
  enable_empty_final_response=True)``, and perf_analyzer on every request) is accepted, on ``ModelInfer`` and on a
  stream, and another type is refused as Triton refuses it (it was refused as an unknown parameter);
* each ``ModelStreamInfer`` response, answer or error, carries ``triton_final_response`` = true, as Triton's do:
  clients of streams wait for it to know that a request is done.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from clients._gen import inference_pb2 as pb
from clients._gen import inference_pb2_grpc as pb_grpc

from .serving import ServerThread
from .test_triton_inputs import _labels, set_params

Tensor = pb.ModelInferRequest.InferInputTensor
F = 16  # tiny_dataset's features per node
EMPTY_FINAL = "triton_enable_empty_final_response"


@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(tiny_repo) as srv:
        yield srv


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as ch:
        yield pb_grpc.GRPCInferenceServiceStub(ch)


def _request(model: str, nodes: list[int], shape: list[int] | None = None, rid: str = "",
             **params: object) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, id=rid,
                               inputs=[Tensor(name="NODE_IDS", datatype="INT64", shape=shape or [len(nodes)])],
                               raw_input_contents=[np.asarray(nodes, dtype="<i8").tobytes()])
    return set_params(req, params)


@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_metadata_input_shapes_are_the_batch_then_the_config_dims(stub, model):
    cfg = stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=60).config
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=60)
    assert cfg.max_batch_size > 0
    assert [(t.name, list(t.shape)) for t in meta.inputs] == [(i.name, [-1, *i.dims]) for i in cfg.input]
    assert [(t.name, list(t.shape)) for t in meta.inputs] == [
        ("NODE_IDS", [-1, 1]), ("NEW_NODE_FEATURES", [-1, F]), ("NEW_NODE_NEIGHBOR_COUNTS", [-1, 1]),
        ("NEW_NODE_NEIGHBORS", [-1, -1]), ("NEW_NODE_EDGE_WEIGHTS", [-1, -1])]
    # what a client that follows the metadata sends ([n, 1]) is answered as [n] is
    nodes = [3, 1, 4, 1, 5]
    flat = stub.ModelInfer(_request(model, nodes, sampling_width=0), timeout=60)
    batched = stub.ModelInfer(_request(model, nodes, shape=[len(nodes), 1], sampling_width=0), timeout=60)
    assert _labels(batched) == _labels(flat)
    assert batched.raw_output_contents == flat.raw_output_contents


@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_enable_empty_final_response_is_accepted(stub, model):
    nodes = [0, 7, 9]
    plain = stub.ModelInfer(_request(model, nodes, sampling_width=0), timeout=60)
    for flag in (True, False):
        resp = stub.ModelInfer(_request(model, nodes, sampling_width=0, **{EMPTY_FINAL: flag}), timeout=60)
        assert resp.raw_output_contents == plain.raw_output_contents
    with pytest.raises(grpc.RpcError) as ei:  # Triton: "expected bool_param"
        stub.ModelInfer(_request(model, nodes, **{EMPTY_FINAL: 1}), timeout=60)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert EMPTY_FINAL in ei.value.details() and "bool" in ei.value.details()
    with pytest.raises(grpc.RpcError) as ei:  # other triton_ keys stay unknown
        stub.ModelInfer(_request(model, nodes, triton_other=True), timeout=60)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_stream_responses_are_marked_final(stub):
    reqs = [_request("shadow", [1, 2], rid="a", **{EMPTY_FINAL: True}),
            _request("shadow", [1, 2], rid="b", sampling_width=-1, **{EMPTY_FINAL: True}),  # refused
            _request("gcn", [5], rid="c"),
            _request("shadow", [1, 2], rid="d", **{EMPTY_FINAL: 3})]  # refused: not a bool
    got = list(stub.ModelStreamInfer(iter(reqs), timeout=60))
    assert [r.infer_response.id for r in got] == ["a", "b", "c", "d"]
    assert [bool(r.error_message) for r in got] == [False, True, False, True]
    assert "sampling_width" in got[1].error_message and EMPTY_FINAL in got[3].error_message
    for r in got:  # one response per request, the last one: final, answer or error
        assert r.infer_response.parameters["triton_final_response"].bool_param is True
    assert _labels(got[0].infer_response) == _labels(stub.ModelInfer(_request("shadow", [1, 2]), timeout=60))


# ---------------------------------------------------------------------------- the same answer as native Predict
def test_response_parameters_carry_the_native_settings_and_data_version(server, stub):
    from clients import GnnClient

    nodes = [2, 4, 8]
    with GnnClient(server.address) as c:
        native = c.predict("shadow", nodes, sampling_width=4, ppr_budget=16)
    resp = stub.ModelInfer(_request("shadow", nodes, sampling_width=4, ppr_budget=16), timeout=60)
    p = resp.parameters
    assert _labels(resp) == native.labels.tolist()
    s = native.settings
    assert (p["sampling_width"].int64_param, p["ppr_budget"].int64_param, p["strategy"].string_param,
            p["extractor"].string_param, p["chosen_by"].string_param, p["edges_kept"].int64_param,
            p["edges_total"].int64_param) == (s.sampling_width, s.ppr_budget, s.strategy, s.extractor, s.chosen_by,
                                              s.edges_kept, s.edges_total)
    assert native.data_version.startswith("memory:")
    assert p["data_version"].string_param == native.data_version


def test_a_replaced_data_version_fails_closed_as_native_predict(server, stub, monkeypatch):
    """Native Predict refuses (DATA_LOSS) answers once the feature / graph store saw its pinned version deleted or
    replaced (serve.features.data_version raises), cached rows included; ModelInfer and streams did not check."""
    from clients import GnnClient
    from clients.errors import DataLossError
    from serve import features

    def changed(*args, **kwargs):
        raise features.DataVersionChanged("features v1 was replaced under the same number", version=1)

    monkeypatch.setattr(features, "data_version", changed)
    with GnnClient(server.address, max_retries=0) as c, pytest.raises(DataLossError):
        c.predict("gcn", [1, 2])
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(_request("gcn", [1, 2]), timeout=60)
    assert ei.value.code() == grpc.StatusCode.DATA_LOSS, ei.value.details()
    (got,) = stub.ModelStreamInfer(iter([_request("gcn", [1, 2], rid="z")]), timeout=60)
    assert got.error_message.startswith("DATA_LOSS") and got.infer_response.id == "z"
    monkeypatch.undo()
    assert _labels(stub.ModelInfer(_request("gcn", [1, 2]), timeout=60))
