"""KServe ``ModelInfer`` inputs, parameter ranges, model configuration and failure statistics
(serve/triton.py, serve/validation.py), on a real server on loopback with the generated KServe stubs
(tritonclient cannot send the ambiguous requests refused here: it fills either contents or raw data).

* an input's data in both ``contents`` and ``raw_input_contents``, or more raw entries than inputs, is
  INVALID_ARGUMENT naming the input (Triton refuses these; they were answered for the raw data, or the
  second raw entry was ignored);
* a knob outside its range is refused with the range, not "must be an integer";
* a plain model's advertised ``ppr_budget`` (min 0, max 0, default 0) is accepted, and every answer's
  settings can be sent back; ``ModelMetadata.platform`` is ``ModelConfig.platform``;
* failed requests count in ``inference_stats.fail`` as in Triton.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from clients import GnnClient
from clients._gen import inference_pb2 as pb
from clients._gen import inference_pb2_grpc as pb_grpc

from .serving import ServerThread

Tensor = pb.ModelInferRequest.InferInputTensor


@pytest.fixture(scope="module")
def server(tiny_repo):
    # its own server: the statistics tests count this server's failures; a short read-your-writes wait
    with ServerThread(tiny_repo, {"runtime_kw": {"read_your_writes_timeout_s": 0.05}}) as srv:
        yield srv


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as ch:
        yield pb_grpc.GRPCInferenceServiceStub(ch)


@pytest.fixture(scope="module")
def native(server):
    with GnnClient(server.address) as c:
        yield c


def _request(model: str = "shadow", *, contents: list[int] | None = None, raw: list[list[int]] = (),
             shape: int = 3, datatype: str = "INT64", **params: object) -> pb.ModelInferRequest:
    tensor = Tensor(name="NODE_IDS", datatype=datatype, shape=[shape])
    if contents is not None:
        tensor.contents.int64_contents.extend(contents)
    req = pb.ModelInferRequest(model_name=model, inputs=[tensor],
                               raw_input_contents=[np.asarray(r, dtype="<i8").tobytes() for r in raw])
    return set_params(req, params)


def set_params(req: pb.ModelInferRequest, params: dict[str, object]) -> pb.ModelInferRequest:
    """``req`` with each parameter in the field of its Python type (bool, str, float, else int64)."""
    for key, value in params.items():
        if isinstance(value, bool):
            req.parameters[key].bool_param = value
        elif isinstance(value, str):
            req.parameters[key].string_param = value
        elif isinstance(value, float):
            req.parameters[key].double_param = value
        else:
            req.parameters[key].int64_param = int(value)
    return req


def _labels(resp: pb.ModelInferResponse) -> list[int]:
    return np.frombuffer(resp.raw_output_contents[0], dtype="<i8").tolist()


def _refused(stub, req: pb.ModelInferRequest, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> str:
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(req, timeout=60)
    assert ei.value.code() == code, ei.value.details()
    return ei.value.details()


def _fails(stub, model: str) -> tuple[int, int]:
    (s,) = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model, version="1"), timeout=60).model_stats
    return s.inference_stats.fail.count, s.inference_stats.success.count


# ---------------------------------------------------------------------- item 3: input conflicts
def test_raw_data_and_contents_of_one_input_are_refused(stub, native):
    want_raw = native.predict("shadow", [1, 2, 3]).labels.tolist()
    want_contents = native.predict("shadow", [0, 5, 7]).labels.tolist()
    assert _labels(stub.ModelInfer(_request(raw=[[1, 2, 3]]), timeout=60)) == want_raw
    assert _labels(stub.ModelInfer(_request(contents=[0, 5, 7]), timeout=60)) == want_contents
    msg = _refused(stub, _request(contents=[0, 5, 7], raw=[[1, 2, 3]]))
    assert "input NODE_IDS has both contents (int64_contents) and raw_input_contents" in msg, msg
    # contents of the wrong type for INT64, with or without raw data
    wrong = _request()
    wrong.inputs[0].contents.int_contents.extend([0, 5, 7])
    assert "contents.int_contents" in _refused(stub, wrong)
    wrong.raw_input_contents.append(np.asarray([1, 2, 3], dtype="<i8").tobytes())
    assert "has both contents (int_contents) and raw_input_contents" in _refused(stub, wrong)


def test_more_raw_entries_than_inputs_are_refused(stub):
    msg = _refused(stub, _request(raw=[[1, 2, 3], [4, 5, 6]]))
    assert "2 raw_input_contents entries for 1 input (NODE_IDS)" in msg and "one entry per input" in msg, msg


# ---------------------------------------------------------------------- item 4: ranges
@pytest.mark.parametrize("name, value, lowest", [
    ("sampling_width", 2**31, 0), ("ppr_budget", 2**40, 1), ("sampling_width", -4, 0), ("ppr_budget", 0, 1)])
def test_knob_out_of_range_states_the_range(stub, name, value, lowest):
    msg = _refused(stub, _request(raw=[[1, 2, 3]], **{name: value}))
    assert f"parameter {name} must be >= {lowest} and <= 2147483647" in msg and f"got {value}" in msg, msg
    assert "must be an integer" not in msg


def test_knobs_at_the_field_limit_are_clamped(stub):
    resp = stub.ModelInfer(_request(raw=[[1, 2, 3]], sampling_width=2**31 - 1, ppr_budget=str(2**31 - 1)), timeout=60)
    cfg = stub.ModelConfig(pb.ModelConfigRequest(name="shadow"), timeout=60).config
    assert resp.parameters["ppr_budget"].int64_param == json.loads(cfg.parameters["ppr_budget"].string_value)["max"]
    assert resp.parameters["sampling_width"].int64_param == json.loads(
        cfg.parameters["sampling_width"].string_value)["max"]
    assert "must be an integer" in _refused(stub, _request(raw=[[1, 2, 3]], ppr_budget=2.5))
    msg = _refused(stub, _request(raw=[[1, 2, 3]], min_graph_version=-1))
    assert "min_graph_version must be >= 0" in msg, msg


# ---------------------------------------------------------------------- item 5: what a model advertises
@pytest.mark.parametrize("model", ["gcn", "shadow"])
def test_advertised_knobs_are_accepted_and_answers_can_be_replayed(stub, native, model):
    cfg = stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=60).config
    knobs = {k: json.loads(cfg.parameters[k].string_value) for k in ("sampling_width", "ppr_budget")}
    if model == "gcn":
        assert (knobs["ppr_budget"]["min"], knobs["ppr_budget"]["max"], knobs["ppr_budget"]["default"]) == (0, 0, 0)
    for key in ("min", "max", "default"):  # each advertised value is accepted, alone and together
        params = {k: v[key] for k, v in knobs.items()}
        resp = stub.ModelInfer(_request(model, raw=[[1, 2, 3]], **params), timeout=60)
        settings = {k: resp.parameters[k].int64_param for k in knobs}
        again = stub.ModelInfer(_request(model, raw=[[1, 2, 3]], **settings), timeout=60)  # sent back as answered
        assert {k: again.parameters[k].int64_param for k in knobs} == settings
        assert _labels(again) == _labels(resp)
    below = knobs["ppr_budget"]["min"] - 1
    msg = _refused(stub, _request(model, raw=[[1, 2, 3]], ppr_budget=below))
    assert f"ppr_budget must be >= {below + 1}" in msg, msg
    # the native API takes a plain model's reported budget back too (the one validation behind both)
    res = native.predict(model, [1, 2, 3], sampling_width=2)
    assert native.predict(model, [1, 2, 3], sampling_width=res.settings.sampling_width,
                          ppr_budget=res.settings.ppr_budget).labels.tolist() == res.labels.tolist()


@pytest.mark.parametrize("model", ["gcn", "shadow"])
def test_metadata_platform_is_the_config_platform(stub, model):
    cfg = stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=60).config
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=60)
    assert meta.platform == cfg.platform == cfg.backend == "gnnserve"
    assert cfg.parameters["architecture"].string_value in ("gcn", "shadow-sage")  # where the architecture is


# ---------------------------------------------------------------------- item 5: failure statistics
def test_failed_requests_count_in_the_model_statistics(stub):
    fail0, ok0 = _fails(stub, "gcn")
    stub.ModelInfer(_request("gcn", raw=[[1, 2, 3]]), timeout=60)
    assert _fails(stub, "gcn") == (fail0, ok0 + 1)
    # refused for their input before the model's queue took them (an unknown node id, a knob out of range, an
    # unknown parameter, a graph version no server has written): a failure on no path, as native Predict's refusals
    # (serve.stats; gnnserve_requests_total counts them by code)
    _refused(stub, _request("gcn", raw=[[1, 2, 10**9]]))
    _refused(stub, _request("gcn", raw=[[1, 2, 3]], sampling_width=-1))
    _refused(stub, _request("gcn", raw=[[1, 2, 3]], temperature=2))
    _refused(stub, _request("gcn", raw=[[1, 2, 3]], min_graph_version=10**6), grpc.StatusCode.FAILED_PRECONDITION)
    assert _fails(stub, "gcn") == (fail0, ok0 + 1)
    # refused before the model sees the request (what Triton itself checks): counted nowhere
    _refused(stub, _request("gcn", raw=[[1, 2, 3]], datatype="INT32"))
    _refused(stub, _request("gcn", contents=[0, 5, 7], raw=[[1, 2, 3]]))
    bad_output = _request("gcn", raw=[[1, 2, 3]])
    bad_output.outputs.add(name="LOGITS")
    _refused(stub, bad_output)
    assert _fails(stub, "gcn") == (fail0, ok0 + 1)


@pytest.mark.parametrize("version", ["²", "①", "٣", " 1", "1 "])
def test_a_version_is_ascii_digits(stub, version):
    """Versions outside ASCII digits (``str.isdigit`` takes "²", ``int`` takes "٣" and " 1"): INVALID_ARGUMENT
    for the repository's version parameter (was INTERNAL), NOT_FOUND for ModelInfer's model_version."""
    req = pb.RepositoryModelLoadRequest(model_name="gcn")
    req.parameters["version"].string_param = version
    with pytest.raises(grpc.RpcError) as ei:
        stub.RepositoryModelLoad(req, timeout=30)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
    assert "positive integer" in ei.value.details()
    infer = _request("gcn", contents=[0, 1, 2])
    infer.model_version = version
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(infer, timeout=30)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "has no version" in ei.value.details()


def test_unknown_tensor_parameters_are_refused(stub):
    """A parameter on the input or an output that the server does not act on is refused by name, before the
    model sees the request (it was ignored: a QA report); classification takes a positive int64."""
    req = _request("gcn", contents=[0, 1, 2])
    req.inputs[0].parameters["binary_data_size"].int64_param = 24
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(req, timeout=30)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input NODE_IDS: unknown parameter 'binary_data_size'" in ei.value.details()
    for key, setter, words in (("priority", lambda p: setattr(p, "int64_param", 1), "unknown parameter 'priority'"),
                               ("classification", lambda p: setattr(p, "int64_param", 0), "positive integer"),
                               ("classification", lambda p: setattr(p, "string_param", "2"), "positive integer")):
        req = _request("gcn", contents=[0, 1, 2])
        out = req.outputs.add(name="PROBABILITIES")
        setter(out.parameters[key])
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in ei.value.details(), key


# ---------------------------------------------------------------------- hostile-client report: versions, integers
@pytest.mark.parametrize("rpc", ["RepositoryModelLoad", "RepositoryModelUnload"])
@pytest.mark.parametrize("digits", [5000, 4301, 300])
def test_a_version_of_thousands_of_digits_is_not_found(stub, rpc, digits):
    """A repository ``version`` of more digits than ``int()`` reads (4300) was INTERNAL (its ValueError escaped);
    like any well-formed version that names nothing it is NOT_FOUND (as a 30-digit one was, and as ModelInfer's
    model_version of 5000 digits is), with the digits cut in the message. Leading zeros count in ``int()``'s
    limit too: 5000 characters naming a version that does not exist are NOT_FOUND as well."""
    request_type = getattr(pb, f"{rpc}Request")
    for version in ("1" * digits, "0" * digits + "7"):
        req = request_type(model_name="gcn")
        req.parameters["version"].string_param = version
        with pytest.raises(grpc.RpcError) as ei:
            getattr(stub, rpc)(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND, (version[:40], ei.value.details())
        details = ei.value.details()
        assert "model 'gcn'" in details and ("has no version" in details or "is not in the repository" in details)
        assert len(details) < 400, details
    infer = _request("gcn", contents=[0, 1, 2])
    infer.model_version = "1" * digits
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(infer, timeout=30)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "has no version" in ei.value.details()


@pytest.mark.parametrize("value", ["١٢", "1_0", " 8 ", "8 ", "+8", "1e308", "1e3", "12.0", "0x10", "", "٣", "８",
                                   "8\x00", "- 8"])
def test_integer_parameters_are_ascii_digits(stub, native, value):
    """A string integer parameter is ASCII digits with an optional leading '-' (as a model version is ASCII digits):
    Python's ``int()`` / ``float()`` read Arabic-Indic and full-width digits, underscores, spaces and exponents, and
    the knob ran at such a value (``"١٢"`` at width 12, a hostile-client report). Each parameter read as an integer
    refuses them."""
    for name in ("sampling_width", "ppr_budget", "timeout", "priority", "min_graph_version"):
        msg = _refused(stub, _request(raw=[[1, 2, 3]], **{name: value}))
        assert f"parameter {name} must be an integer" in msg and "ASCII digits" in msg, msg


def test_integer_parameters_in_range_are_read_strictly(stub, native):
    """What is accepted: ASCII digits (leading zeros too), int64 / uint64 fields, integral doubles; a '-' sign gets
    the parameter's range (as a negative int64 does); values beyond the 64-bit fields, as strings or doubles, are
    refused as such with a short message (no 309-digit number; no int() of 5000 digits)."""
    want = native.predict("shadow", [1, 2, 3], sampling_width=4).labels.tolist()
    for width in ("4", "004", 4, 4.0):
        resp = stub.ModelInfer(_request(raw=[[1, 2, 3]], sampling_width=width), timeout=60)
        assert resp.parameters["sampling_width"].int64_param == 4 and _labels(resp) == want, width
    # the documented "no timeout": the largest uint64, as a string too
    req = _request(raw=[[1, 2, 3]], sampling_width=4)
    req.parameters["timeout"].uint64_param = 2**64 - 1
    assert _labels(stub.ModelInfer(req, timeout=60)) == want
    assert _labels(stub.ModelInfer(_request(raw=[[1, 2, 3]], sampling_width=4, timeout=str(2**64 - 1)),
                                   timeout=60)) == want
    msg = _refused(stub, _request(raw=[[1, 2, 3]], sampling_width="-4"))
    assert "parameter sampling_width must be >= 0 and <= 2147483647" in msg and "got -4" in msg, msg
    assert "timeout must be >= 0" in _refused(stub, _request(raw=[[1, 2, 3]], timeout="-1"))
    for value in (str(2**64), "9" * 5000, "-" + "9" * 30, 1e308, -1e30):
        msg = _refused(stub, _request(raw=[[1, 2, 3]], sampling_width=value))
        assert "parameter sampling_width must be an integer from -9223372036854775808 to 18446744073709551615" in msg
        assert len(msg) < 300, msg
    msg = _refused(stub, _request(raw=[[1, 2, 3]], max_accuracy_loss=" 0.5"))
    assert "parameter max_accuracy_loss must be a number" in msg, msg
    for value in ("٠.٥", "0.0_1"):
        assert "must be a number" in _refused(stub, _request(raw=[[1, 2, 3]], max_accuracy_loss=value))
