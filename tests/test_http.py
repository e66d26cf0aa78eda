"""The KServe v2 / Triton HTTP/REST endpoint (serve/http.py, ``gnnserve serve --http-port``) on real servers on loopback.

Every endpoint is compared with the gRPC KServe service of the same server: answers equal bit for bit (JSON and
binary tensor data), the same refusals with their codes mapped to HTTP statuses, the same statistics; the bearer
token, TLS (and client certificates), the body limit and hostile bodies, the drain, the metrics, Triton's own
``tritonclient.http`` and ``--processes 2``.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import shutil
import socket
import ssl
import time
import zlib
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from clients._gen import inference_pb2 as pb
from clients._gen import inference_pb2_grpc as pb_grpc
from serve.http import HTTP_STATUS, _message_dict, json_value_cap

from .serving import ServerProcess, ServerThread, free_port, metric_samples
from .test_triton_inputs import set_params

F = 16  # tiny_dataset's features per node
N = 800  # its nodes
Tensor = pb.ModelInferRequest.InferInputTensor
TOKEN = "s3cret-http-token"


# ---------------------------------------------------------------------- helpers
class Http:
    """A small HTTP(S) client: one connection per call, the answer's status, headers and body."""

    def __init__(self, port: int, *, context: ssl.SSLContext | None = None, token: str | None = None) -> None:
        self.port, self.context, self.token = port, context, token

    def call(self, method: str, path: str, body: bytes | dict | list | None = None,
             headers: dict[str, str] | None = None, token: str | bool | None = True) -> tuple[int, dict, bytes]:
        if self.context is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection("localhost", self.port, timeout=60,
                                                                           context=self.context)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        hdrs = dict(headers or {})
        tok = self.token if token is True else token
        if tok:
            hdrs["Authorization"] = f"Bearer {tok}"
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        try:
            conn.request(method, path, body=data, headers=hdrs)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, _, data = self.call(method, path, body, **kw)
        return status, (json.loads(data) if data else None)


def _grpc_infer(stub, model: str, nodes: list[int] | None = None, outputs: tuple[str, ...] = (),
                new: dict[str, np.ndarray] | None = None, classes: dict[str, int] | None = None,
                **params: object) -> pb.ModelInferResponse:
    req = pb.ModelInferRequest(model_name=model)
    arrays: list[tuple[str, str, np.ndarray]] = []
    if nodes is not None:
        arrays.append(("NODE_IDS", "INT64", np.asarray(nodes, dtype="<i8")))
    for name, arr in (new or {}).items():
        arrays.append((name, "FP32" if arr.dtype.kind == "f" else "INT64", arr))
    for name, dtype, arr in arrays:
        req.inputs.append(Tensor(name=name, datatype=dtype, shape=list(arr.shape)))
        req.raw_input_contents.append(arr.astype("<f4" if dtype == "FP32" else "<i8").tobytes())
    for o in outputs:
        out = req.outputs.add(name=o)
        if classes and o in classes:
            out.parameters["classification"].int64_param = classes[o]
    return stub.ModelInfer(set_params(req, params), timeout=60)


def _json_inputs(nodes: list[int] | None = None, new: dict[str, np.ndarray] | None = None,
                 binary: bool = False) -> tuple[list[dict], bytes]:
    inputs, tail = [], b""
    arrays = [] if nodes is None else [("NODE_IDS", np.asarray(nodes, dtype=np.int64))]
    arrays += list((new or {}).items())
    for name, arr in arrays:
        dtype = "FP32" if arr.dtype.kind == "f" else "INT64"
        entry: dict[str, Any] = {"name": name, "datatype": dtype, "shape": list(arr.shape)}
        if binary:
            raw = arr.astype("<f4" if dtype == "FP32" else "<i8").tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail += raw
        else:
            entry["data"] = arr.tolist()  # nested row-major for 2-D arrays
        inputs.append(entry)
    return inputs, tail


def _post_infer(client: Http, model: str, body: dict, tail: bytes = b"", headers: dict | None = None,
                path: str | None = None) -> tuple[int, dict, bytes]:
    head = json.dumps(body).encode()
    hdrs = dict(headers or {})
    if tail or any("binary_data_size" in i.get("parameters", {}) for i in body.get("inputs", [])):
        hdrs["Inference-Header-Content-Length"] = str(len(head))
    return client.call("POST", path or f"/v2/models/{model}/infer", head + tail, headers=hdrs)


def _split(headers: dict, data: bytes) -> tuple[dict, dict[str, bytes]]:
    """The JSON header of an inference answer and the binary part of each output that has one."""
    n = int(headers.get("inference-header-content-length", len(data)))
    head = json.loads(data[:n])
    parts, pos = {}, n
    for o in head["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is not None:
            parts[o["name"]] = data[pos:pos + size]
            pos += size
    assert pos == len(data)
    return head, parts


def _as_raw(o: dict) -> bytes:
    """A JSON output's data as gRPC's raw_output_contents bytes."""
    if o["datatype"] == "BYTES":
        return b"".join(len(s.encode()).to_bytes(4, "little") + s.encode() for s in o["data"])
    return np.asarray(o["data"], dtype="<i8" if o["datatype"] == "INT64" else "<f4").tobytes()


def _same_parameters(head: dict, resp: pb.ModelInferResponse) -> None:
    got = dict(head["parameters"])
    want = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in resp.parameters.items()}
    assert got.pop("total_ms") > 0 and want.pop("total_ms") > 0  # the timing of each request: its own
    assert got == want


def _error(status: int, data: bytes) -> str:
    body = json.loads(data)
    assert set(body) == {"error"}, body
    return body["error"]


def _grpc_refusal(fn, *args: Any, **kw: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        fn(*args, **kw)
    return ei.value


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def server(tiny_repo):
    with ServerThread(tiny_repo, {"http_port": 0, "metrics_port": 0}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> Http:
    return Http(server.server.http_port)


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as ch:
        yield pb_grpc.GRPCInferenceServiceStub(ch)


# ---------------------------------------------------------------------- health and metadata
def test_health_and_server_metadata(server, client, stub):
    from serve.loops import loop_name, resolve_event_loop

    assert loop_name(server._loop) == resolve_event_loop("auto")  # uvloop where installed: aiohttp runs on it
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, body = client.call("GET", path)
        assert (status, body) == (200, b"")
    status, meta = client.json("GET", "/v2")
    grpc_meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=60)
    assert status == 200
    assert meta == {"name": grpc_meta.name, "version": grpc_meta.version,
                    "extensions": [*grpc_meta.extensions, "binary_tensor_data"]}


@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_model_metadata_config_and_ready_equal_grpc(client, stub, model):
    for suffix, version in (("", ""), ("/versions/1", "1")):
        status, meta = client.json("GET", f"/v2/models/{model}{suffix}")
        m = stub.ModelMetadata(pb.ModelMetadataRequest(name=model, version=version), timeout=60)
        assert status == 200
        assert meta == {"name": m.name, "versions": list(m.versions), "platform": m.platform,
                        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in m.inputs],
                        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                                    for t in m.outputs]}
        status, cfg = client.json("GET", f"/v2/models/{model}{suffix}/config")
        assert status == 200
        # protobuf's JSON mapping, as Triton prints its configuration: parsed back, it is gRPC's message
        assert json_format.ParseDict(cfg, pb.ModelConfig()) == stub.ModelConfig(
            pb.ModelConfigRequest(name=model, version=version), timeout=60).config
        assert cfg["max_batch_size"] == 4096 and cfg["input"][0]["dims"] == [1]  # numbers, as Triton
        assert client.call("GET", f"/v2/models/{model}{suffix}/ready")[0] == 200
    assert client.call("GET", f"/v2/models/{model}/versions/2/ready")[0] == 400  # not ready: KServe's 4xx
    status, _, data = client.call("GET", f"/v2/models/{model}/versions/2")
    assert status == 404 and "version" in _error(status, data)


def test_unknown_model_endpoint_and_method(client, stub):
    status, headers, data = client.call("GET", "/v2/models/nope")
    e = _grpc_refusal(stub.ModelMetadata, pb.ModelMetadataRequest(name="nope"), timeout=60)
    assert (status, _error(status, data)) == (404, e.details()) and headers["gnnserve-status"] == "NOT_FOUND"
    assert client.call("GET", "/v2/models/nope/ready")[0] == 400
    status, _, data = client.call("GET", "/v2/nothing/here")
    assert status == 404 and "no such endpoint" in _error(status, data)
    status, headers, data = client.call("DELETE", "/v2/models/gcn")
    assert status == 405 and "not allowed" in _error(status, data) and "GET" in headers.get("allow", "")


# ---------------------------------------------------------------------- inference
@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_infer_json_equals_grpc_bit_for_bit(client, stub, model):
    nodes = [0, 5, 7, 5, 799]
    params = {"sampling_width": 4} if model == "shadow" else {"sampling_width": 0}
    outputs = ("LABELS", "PROBABILITIES", "EMBEDDINGS")
    want = _grpc_infer(stub, model, nodes, outputs, **params)
    inputs, _ = _json_inputs(nodes)
    status, headers, data = _post_infer(client, model, {"id": "req-1", "inputs": inputs, "parameters": params,
                                                        "outputs": [{"name": o} for o in outputs]})
    assert status == 200, data
    assert headers["content-type"].startswith("application/json") and "inference-header-content-length" not in headers
    head, parts = _split(headers, data)
    assert parts == {} and head["id"] == "req-1"
    assert (head["model_name"], head["model_version"]) == (model, "1")
    assert [(o["name"], o["datatype"], o["shape"]) for o in head["outputs"]] == [
        (o.name, o.datatype, list(o.shape)) for o in want.outputs]
    assert [_as_raw(o) for o in head["outputs"]] == list(want.raw_output_contents)
    _same_parameters(head, want)
    # the default outputs (LABELS, PROBABILITIES), with a versioned path and [n, 1] ids
    status, headers, data = _post_infer(
        client, model, {"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [len(nodes), 1],
                                    "data": [[n] for n in nodes]}], "parameters": params},
        path=f"/v2/models/{model}/versions/1/infer")
    head, _ = _split(headers, data)
    assert [o["name"] for o in head["outputs"]] == ["LABELS", "PROBABILITIES"] and "id" not in head
    assert [_as_raw(o) for o in head["outputs"]] == list(want.raw_output_contents[:2])


@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_infer_binary_data_equals_grpc_bit_for_bit(client, stub, model):
    nodes = list(range(0, 800, 37))
    want = _grpc_infer(stub, model, nodes, ("PROBABILITIES", "LABELS", "EMBEDDINGS"), sampling_width=0)
    inputs, tail = _json_inputs(nodes, binary=True)
    body = {"inputs": inputs, "parameters": {"sampling_width": 0, "binary_data_output": True},
            "outputs": [{"name": "PROBABILITIES"}, {"name": "LABELS", "parameters": {"binary_data": False}},
                        {"name": "EMBEDDINGS"}]}
    status, headers, data = _post_infer(client, model, body, tail)
    assert status == 200, data
    assert headers["content-type"] == "application/octet-stream"
    head, parts = _split(headers, data)
    assert parts == {"PROBABILITIES": want.raw_output_contents[0], "EMBEDDINGS": want.raw_output_contents[2]}
    assert _as_raw(head["outputs"][1]) == want.raw_output_contents[1]  # LABELS asked as JSON
    _same_parameters(head, want)
    # classification: BYTES [n, k], as JSON strings and as binary
    want = _grpc_infer(stub, model, nodes, ("PROBABILITIES",), classes={"PROBABILITIES": 3}, sampling_width=0)
    for as_binary in (False, True):
        body = {"inputs": inputs, "parameters": {"sampling_width": 0},
                "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 3, "binary_data": as_binary}}]}
        status, headers, data = _post_infer(client, model, body, tail)
        head, parts = _split(headers, data)
        (o,) = head["outputs"]
        assert (o["datatype"], o["shape"]) == ("BYTES", [len(nodes), 3])
        assert (parts["PROBABILITIES"] if as_binary else _as_raw(o)) == want.raw_output_contents[0]


def _new_nodes(rng: np.random.Generator, m: int = 3) -> dict[str, np.ndarray]:
    counts = np.array([2, 0, 3][:m], dtype=np.int64)
    return {"NEW_NODE_FEATURES": rng.standard_normal((m, F)).astype(np.float32),
            "NEW_NODE_NEIGHBOR_COUNTS": counts,
            "NEW_NODE_NEIGHBORS": rng.integers(0, N, int(counts.sum())).astype(np.int64),
            "NEW_NODE_EDGE_WEIGHTS": rng.uniform(0.5, 2.0, int(counts.sum())).astype(np.float32)}


@pytest.mark.parametrize("model", ["shadow", "gcn"])
def test_new_nodes_json_binary_and_mixed_equal_grpc(client, stub, model):
    new = _new_nodes(np.random.default_rng(7))
    nodes = [1, 2, 3]
    want = _grpc_infer(stub, model, nodes, ("LABELS", "PROBABILITIES"), new=new, sampling_width=0)
    for mode in ("json", "binary", "mixed"):
        inputs, tail = _json_inputs(nodes, new, binary=mode == "binary")
        if mode == "mixed":  # the features binary, the rest JSON
            bin_inputs, bin_tail = _json_inputs(None, {"NEW_NODE_FEATURES": new["NEW_NODE_FEATURES"]}, binary=True)
            inputs = [bin_inputs[0] if i["name"] == "NEW_NODE_FEATURES" else i for i in inputs]
            tail = bin_tail
        status, headers, data = _post_infer(client, model, {"inputs": inputs, "parameters": {"sampling_width": 0}},
                                            tail)
        assert status == 200, (mode, data)
        head, _ = _split(headers, data)
        assert [_as_raw(o) for o in head["outputs"]] == list(want.raw_output_contents), mode
        assert head["outputs"][0]["shape"] == [len(nodes) + 3]


def test_knobs_and_request_parameters_behave_as_on_grpc(client, stub):
    nodes = [10, 20, 30]
    for params in ({"sampling_width": 2, "ppr_budget": 16}, {"max_accuracy_loss": 0.05}, {"sampling_width": "3"},
                   {"min_graph_version": 0, "priority": 1, "timeout": 0}, {"sampling_width": 1e9}):
        want = _grpc_infer(stub, "shadow", nodes, **params)
        status, headers, data = _post_infer(client, "shadow", {"inputs": _json_inputs(nodes)[0], "parameters": params})
        assert status == 200, (params, data)
        head, _ = _split(headers, data)
        assert [_as_raw(o) for o in head["outputs"]] == list(want.raw_output_contents)
        _same_parameters(head, want)


# ---------------------------------------------------------------------- refusals: the gRPC ones, mapped
@pytest.mark.parametrize("case", [
    "bad_knob", "unknown_param", "unknown_output", "repeated_output", "wrong_datatype", "wrong_shape", "no_inputs",
    "id_out_of_range", "unknown_model", "unknown_version", "counts_without_features", "class_on_labels",
])
def test_refusals_equal_grpc(client, stub, case):
    nodes = [0, 1]
    http_body: dict[str, Any] = {"inputs": _json_inputs(nodes)[0]}
    req = pb.ModelInferRequest(model_name="shadow", inputs=[Tensor(name="NODE_IDS", datatype="INT64", shape=[2])],
                               raw_input_contents=[np.asarray(nodes, "<i8").tobytes()])
    model, version = "shadow", ""
    if case == "bad_knob":
        http_body["parameters"] = {"sampling_width": -1}
        req.parameters["sampling_width"].int64_param = -1
    elif case == "unknown_param":
        http_body["parameters"] = {"sampling_widht": 3}
        req.parameters["sampling_widht"].int64_param = 3
    elif case in ("unknown_output", "repeated_output"):
        names = ["LOGITS"] if case == "unknown_output" else ["LABELS", "LABELS"]
        http_body["outputs"] = [{"name": n} for n in names]
        for n in names:
            req.outputs.add(name=n)
    elif case == "wrong_datatype":
        http_body["inputs"][0]["datatype"] = "FP32"
        http_body["inputs"][0]["data"] = [0.0, 1.0]
        req.inputs[0].datatype = "FP32"
        req.raw_input_contents[0] = np.asarray([0, 1], "<f4").tobytes()
    elif case == "wrong_shape":
        http_body["inputs"][0]["shape"] = [1, 2]
        http_body["inputs"][0]["data"] = [[0, 1]]
        req.inputs[0].shape[:] = [1, 2]
    elif case == "no_inputs":
        http_body["inputs"] = []
        del req.inputs[:]
        del req.raw_input_contents[:]
    elif case == "id_out_of_range":
        http_body["inputs"][0]["data"] = [0, N]
        req.raw_input_contents[0] = np.asarray([0, N], "<i8").tobytes()
    elif case == "unknown_model":
        model = req.model_name = "nope"
    elif case == "unknown_version":
        version = req.model_version = "9"
    elif case == "counts_without_features":
        http_body["inputs"].append({"name": "NEW_NODE_NEIGHBOR_COUNTS", "datatype": "INT64", "shape": [1],
                                    "data": [0]})
        req.inputs.append(Tensor(name="NEW_NODE_NEIGHBOR_COUNTS", datatype="INT64", shape=[1]))
        req.raw_input_contents.append(np.zeros(1, "<i8").tobytes())
    elif case == "class_on_labels":
        http_body["outputs"] = [{"name": "LABELS", "parameters": {"classification": 2}}]
        req.outputs.add(name="LABELS").parameters["classification"].int64_param = 2
    e = _grpc_refusal(stub.ModelInfer, req, timeout=60)
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    status, headers, data = _post_infer(client, model, http_body, path=path)
    assert status == HTTP_STATUS[e.code()] and headers["gnnserve-status"] == e.code().name, (case, data)
    assert _error(status, data) == e.details()


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"\xff\xfe\x00", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (json.dumps({"inputs": {"name": "NODE_IDS"}}).encode(), "needs inputs"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": ["2"], "data": [1, 2]}]}).encode(),
     "shape must be an array of integers"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [2], "data": [1, 2.5]}]}).encode(),
     "must hold integers"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [2], "data": [1, True]}]}).encode(),
     "must hold integers"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [1], "data": [2**70]}]}).encode(),
     "int64 range"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [1], "data": "1"}]}).encode(),
     "data must be a JSON array"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [1], "data": [{"a": 1}]}]}).encode(),
     "holds an object"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [1]}]}).encode(), "has no data"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [2], "data": [1]}]}).encode(),
     "1 values for shape [2]"),
    (json.dumps({"input": []}).encode(), "unknown keys ['input']"),
    (json.dumps({"inputs": [], "parameters": {"sampling_width": [1]}}).encode(), "must be a bool, a number or a string"),
    (json.dumps({"inputs": [], "parameters": {"binary_data_output": 1}}).encode(), "binary_data_output must be a bool"),
    (json.dumps({"inputs": [], "id": 5}).encode(), "id must be a string"),
    (json.dumps({"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [0], "data": []}] * 6}).encode(),
     "request has 6 inputs; this model takes at most 5"),
    (json.dumps({"inputs": [], "parameters": {f"p{i}": i for i in range(65)}}).encode(),
     "more than 64 parameters"),
])
def test_malformed_bodies_are_400_with_a_message(client, body, fragment):
    status, headers, data = client.call("POST", "/v2/models/gcn/infer", body)
    assert status == 400 and headers["gnnserve-status"] == "INVALID_ARGUMENT", data
    assert fragment in _error(status, data)


def test_binary_framing_errors(client):
    inputs, tail = _json_inputs([1, 2, 3], binary=True)
    head = json.dumps({"inputs": inputs}).encode()
    cases = [
        (head + tail, str(len(head) + len(tail) + 1), "Inference-Header-Content-Length must be"),
        (head + tail, "12x", "Inference-Header-Content-Length must be"),
        (head + tail, "-5", "Inference-Header-Content-Length must be"),
        (head + tail, "9" * 5000, "Inference-Header-Content-Length must be"),
        (head + tail[:-1], str(len(head)), "runs past the body"),
        (head + tail + b"\x00", str(len(head)), "1 bytes after the JSON header"),
        (head, None, "runs past the body"),  # binary_data_size but no binary part
    ]
    for data, length, fragment in cases:
        status, _, answer = client.call("POST", "/v2/models/gcn/infer", data,
                                        headers={} if length is None else {"Inference-Header-Content-Length": length})
        assert status == 400 and fragment in _error(status, answer), (length, answer)
    both = [{**inputs[0], "data": [1, 2, 3]}]
    status, _, answer = _post_infer(client, "gcn", {"inputs": both}, tail)
    assert status == 400 and "both data and binary_data_size" in _error(status, answer)


def test_values_past_the_model_limits_are_refused_before_parsing(client, server):
    rt = server.server.registry.get("gcn")
    lim = rt.limits
    cap = json_value_cap(lim.num_features, lim.max_nodes_per_request, lim.max_new_node_edges)
    data = b'{"inputs": [{"name": "NODE_IDS", "datatype": "INT64", "shape": [1], "data": [' + b"0," * (cap + 1) + b"0]}]}"
    t0 = time.monotonic()
    status, _, answer = client.call("POST", "/v2/models/gcn/infer", data)
    assert status == 400 and "separators" in _error(status, answer) and "split it" in _error(status, answer)
    assert time.monotonic() - t0 < 10
    # within the separator cap, the node limit of the model (as on gRPC)
    n = lim.max_nodes_per_request + 1
    status, _, answer = _post_infer(client, "gcn", {"inputs": _json_inputs([0] * n)[0]})
    assert status == 400 and "more than the limit" in _error(status, answer)


def _raw_exchange(port: int, request: bytes, wait_s: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(request)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
                    b"content-length:")]
                if length and len(rest) >= length[0]:
                    break
        return out


def test_body_limit_413(client, server):
    limit = server.server.http.max_body_bytes
    # declared too large: refused from the header, before any of the body is read
    answer = _raw_exchange(client.port, b"POST /v2/models/gcn/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: " + str(limit + 1).encode() + b"\r\n\r\n{")
    assert answer.startswith(b"HTTP/1.1 413") and b"larger than the limit" in answer, answer[:300]
    # chunked, without a length: refused once it passes the limit
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=120)
    block = b" " * (1 << 20)
    conn.request("POST", "/v2/models/gcn/infer", body=(block for _ in range(limit // len(block) + 2)),
                 encode_chunked=True, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 413 and b"larger than the limit" in r.read()
    conn.close()


def test_a_trickled_body_is_answered_408(client, server):
    front = server.server.http
    old, front.body_timeout_s = front.body_timeout_s, 0.5
    try:
        t0 = time.monotonic()
        answer = _raw_exchange(client.port, b"POST /v2/models/gcn/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100"
                                            b"\r\n\r\n{\"inputs\"", wait_s=30)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within" in answer, answer[:300]
        assert time.monotonic() - t0 < 20
    finally:
        front.body_timeout_s = old
    assert client.call("GET", "/v2/health/live")[0] == 200  # the server goes on


def test_requests_past_the_concurrency_cap_are_429(client, server):
    front = server.server.http
    old, front.max_concurrent = front.max_concurrent, 0  # every slot taken
    try:
        status, headers, data = _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0]})
        assert status == 429 and headers["gnnserve-status"] == "RESOURCE_EXHAUSTED"
        assert "--max-concurrent-rpcs" in _error(status, data)
        assert client.call("GET", "/v2/health/ready")[0] == 200  # probes are not capped
    finally:
        front.max_concurrent = old
    assert _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0]})[0] == 200


def test_the_standard_asyncio_loop_serves_http_too(tiny_repo, stub):
    with ServerThread(tiny_repo, {"http_port": 0, "event_loop": "asyncio"}) as srv:
        from serve.loops import loop_name

        assert loop_name(srv._loop) == "asyncio"
        c = Http(srv.server.http_port)
        status, headers, data = _post_infer(c, "shadow", {"inputs": _json_inputs([9, 8])[0],
                                                          "parameters": {"sampling_width": 0}})
        head, _ = _split(headers, data)
        assert status == 200 and [_as_raw(o) for o in head["outputs"]] == list(
            _grpc_infer(stub, "shadow", [9, 8], sampling_width=0).raw_output_contents)


# ---------------------------------------------------------------------- statistics, repository, logging
def test_statistics_equal_grpc_and_count_http_requests(client, stub):
    def grpc_stats(name: str = "", version: str = "") -> dict:
        # every field, numbers as numbers (Triton's statistics JSON), from the message gRPC answered
        return _message_dict(stub.ModelStatistics(pb.ModelStatisticsRequest(name=name, version=version), timeout=60))

    _, before = client.json("GET", "/v2/models/gcn/versions/1/stats")
    (b,) = before["model_stats"]
    assert _post_infer(client, "gcn", {"inputs": _json_inputs([1, 2, 3, 4])[0]})[0] == 200
    assert _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0],
                                       "parameters": {"sampling_width": -1}})[0] == 400  # refused for its input
    for path, name, version in (("/v2/models/stats", "", ""), ("/v2/models/gcn/stats", "gcn", ""),
                                ("/v2/models/gcn/versions/1/stats", "gcn", "1")):
        status, stats = client.json("GET", path)
        assert status == 200 and stats == grpc_stats(name, version)
        assert json_format.ParseDict(stats, pb.ModelStatisticsResponse())  # Triton's field names
    _, after = client.json("GET", "/v2/models/gcn/versions/1/stats")
    (a,) = after["model_stats"]
    assert a["inference_count"] - b["inference_count"] == 4
    assert a["inference_stats"]["success"]["count"] - b["inference_stats"]["success"]["count"] == 1
    # a request refused for its input is a failure on no path (serve.stats): the model never took it
    assert a["inference_stats"].get("fail", {}).get("count", 0) == b["inference_stats"].get("fail", {}).get("count", 0)
    status, _, data = client.call("GET", "/v2/models/nope/stats")
    assert status == 404 and "nope" in _error(status, data)


def test_repository_index_unload_load(client, stub):
    status, index = client.json("POST", "/v2/repository/index")
    g = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=60)
    assert status == 200 and index == [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
                                       for m in g.models]
    assert client.json("POST", "/v2/repository/index", {"ready": True})[1] == [m for m in index
                                                                              if m["state"] == "READY"]
    assert client.call("POST", "/v2/repository/models/gcn/unload")[0] == 200
    try:
        assert client.call("GET", "/v2/models/gcn/ready")[0] == 400
        e = _grpc_refusal(stub.ModelInfer, pb.ModelInferRequest(model_name="gcn"), timeout=60)
        assert e.code() == grpc.StatusCode.NOT_FOUND
        status, _, data = _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0]})
        assert status == 404 and _error(status, data) == e.details()
    finally:
        assert client.call("POST", "/v2/repository/models/gcn/load", {"parameters": {}})[0] == 200
    assert client.call("GET", "/v2/models/gcn/ready")[0] == 200
    for body, status_, fragment in (({"parameters": {"config": "{}"}}, 501, "configuration override"),
                                    ({"parameters": {"version": "0"}}, 400, "positive integer"),
                                    ({"parameters": {"version": 99}}, 404, "99"),
                                    ({"parameters": {"version": [1]}}, 400, "must be a bool, an integer or a string"),
                                    ({"params": {}}, 400, "unknown keys")):
        status, _, data = client.call("POST", "/v2/repository/models/gcn/load", body)
        assert status == status_ and fragment in _error(status, data), (body, data)
    status, _, data = client.call("POST", "/v2/repository/models/gcn/unload", b"{")
    assert status == 400 and "not valid JSON" in _error(status, data)
    assert client.call("GET", "/v2/models/gcn/ready")[0] == 200


def test_log_settings(client, stub):
    status, settings = client.json("GET", "/v2/logging")
    g = stub.LogSettings(pb.LogSettingsRequest(), timeout=60)
    assert status == 200 and settings == {k: getattr(v, v.WhichOneof("parameter_choice"))
                                          for k, v in g.settings.items()}
    try:
        status, changed = client.json("POST", "/v2/logging", {"log_verbose_level": 1, "log_info": True,
                                                              "log_warning": True, "log_error": True})
        assert status == 200 and changed["log_verbose_level"] == 1 and changed["log_info"] is True
        assert client.json("GET", "/v2/logging")[1] == changed
        for body, fragment in (({"log_file": "/tmp/x"}, "cannot be changed"), ({"log_info": 1}, "is a bool"),
                               ({"log_verbose_level": -1}, "must be from 0"), ({"nope": True}, "unknown log setting"),
                               ([], "must be a JSON object")):
            status, _, data = client.call("POST", "/v2/logging", body)
            assert status == 400 and fragment in _error(status, data), body
    finally:
        client.call("POST", "/v2/logging", {k: v for k, v in settings.items() if k not in ("log_file", "log_format")})
    assert client.json("GET", "/v2/logging")[1] == settings


def test_trace_and_shared_memory(client):
    status, _, data = client.call("GET", "/v2/trace/setting")
    assert status == 501 and "TraceSetting" in _error(status, data)
    assert client.json("GET", "/v2/systemsharedmemory/status") == (200, [])
    assert client.json("GET", "/v2/cudasharedmemory/region/r0/status") == (200, [])
    assert client.call("POST", "/v2/systemsharedmemory/unregister")[0] == 200
    status, _, data = client.call("POST", "/v2/cudasharedmemory/region/r0/register", {"raw_handle": {"b64": ""}})
    assert status == 501 and "CUDA shared memory is not supported" in _error(status, data)


def test_http_requests_are_counted_in_the_metrics(server, client):
    port = server.server.metrics_port

    def count(**labels: str) -> float:
        return sum(v for s, v in metric_samples(port, "gnnserve_requests_total")
                   if all(s.get(k) == x for k, x in labels.items()))

    ok = count(model="gcn", method="http_infer", code="OK")
    bad = count(model="gcn", method="http_infer", code="INVALID_ARGUMENT")
    missing = count(model="", method="http_infer", code="NOT_FOUND")
    meta = count(model="", method="http_server_metadata", code="OK")
    assert _post_infer(client, "gcn", {"inputs": _json_inputs([3])[0]})[0] == 200
    assert _post_infer(client, "gcn", {"inputs": _json_inputs([N])[0]})[0] == 400
    assert _post_infer(client, "made-up-name", {"inputs": _json_inputs([3])[0]})[0] == 404
    assert client.call("GET", "/v2")[0] == 200
    assert count(model="gcn", method="http_infer", code="OK") == ok + 1
    assert count(model="gcn", method="http_infer", code="INVALID_ARGUMENT") == bad + 1
    assert count(model="", method="http_infer", code="NOT_FOUND") == missing + 1  # a client's name: no series
    assert count(model="", method="http_server_metadata", code="OK") == meta + 1
    assert not any(s.get("model") == "made-up-name" for s, _ in metric_samples(port, "gnnserve_requests_total"))


def test_gzip_request_and_response(client, stub):
    import gzip

    nodes = [4, 8, 15]
    want = _grpc_infer(stub, "gcn", nodes)
    body = gzip.compress(json.dumps({"inputs": _json_inputs(nodes)[0]}).encode())
    status, headers, data = client.call("POST", "/v2/models/gcn/infer", body,
                                        headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("content-encoding") == "gzip"
    head, _ = _split({}, gzip.decompress(data))
    assert [_as_raw(o) for o in head["outputs"]] == list(want.raw_output_contents)
    status, _, data = client.call("POST", "/v2/models/gcn/infer", zlib.compress(json.dumps(
        {"inputs": _json_inputs(nodes)[0]}).encode()), headers={"Content-Encoding": "deflate"})
    assert status == 200 and [_as_raw(o) for o in _split({}, data)[0]["outputs"]] == list(want.raw_output_contents)
    for encoding, payload, status_, fragment in (("br", b"x", 415, "not supported"),
                                                 ("gzip", b"not gzip at all", 400, "not valid gzip"),
                                                 ("gzip", body[:-9], 400, "truncated")):
        status, _, data = client.call("POST", "/v2/models/gcn/infer", payload, headers={"Content-Encoding": encoding})
        assert status == status_ and fragment in _error(status, data), (encoding, data)


def test_a_compressed_body_is_held_to_the_limit_once_inflated(client, server):
    limit = server.server.http.max_body_bytes
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * (1 << 20)
    bomb = b"".join(c.compress(zeros) for _ in range(2 * limit // len(zeros))) + c.flush()  # ~130 KB on the wire
    assert len(bomb) < limit // 100
    t0 = time.monotonic()
    status, _, data = client.call("POST", "/v2/models/gcn/infer", bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413 and "larger than the limit" in _error(status, data)
    assert time.monotonic() - t0 < 20


# ---------------------------------------------------------------------- slow and abandoned bodies, ids, config numbers
def _open_stalled(port: int, declared: int, sent: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v2/models/gcn/infer HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(declared).encode()
              + b"\r\n\r\n" + sent)
    return s


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    t_end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < t_end, "timed out"
        time.sleep(0.02)


def test_bodies_still_arriving_hold_no_admission_slot(client, server):
    front = server.server.http
    old = front.max_concurrent
    front.max_concurrent = 2
    stalled = [_open_stalled(client.port, 100, b"{") for _ in range(6)]  # t5_slowloris, in small
    try:
        time.sleep(0.3)
        status, _, data = _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0]})
        assert status == 200, data
        assert client.call("GET", "/v2/models/gcn")[0] == 200
        assert client.call("GET", "/v2/models/gcn/ready")[0] == 200
        assert front.inflight == 0
    finally:
        front.max_concurrent = old
        for s in stalled:
            s.close()


def test_bodies_in_transit_are_held_to_a_byte_budget(client, server):
    front = server.server.http
    old = front.receive_budget_bytes
    _wait_for(lambda: front.receiving_bytes == 0)
    front.receive_budget_bytes = 4096
    try:
        answer = _raw_exchange(client.port, b"POST /v2/models/gcn/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                               b"5000\r\n\r\n{")  # declared past the budget: refused at once, unread
        assert answer.startswith(b"HTTP/1.1 429") and b"budget of 4096 bytes" in answer, answer[:300]
        held = _open_stalled(client.port, 4090, b"{" + b" " * 4049)  # 4050 bytes received, more to come
        try:
            _wait_for(lambda: front.receiving_bytes == 4050)
            status, headers, data = _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0]})
            assert status == 429 and headers["gnnserve-status"] == "RESOURCE_EXHAUSTED", data
            assert "request bodies" in _error(status, data) and "4096" in _error(status, data)
            assert client.call("GET", "/v2/models/gcn")[0] == 200  # no body: not held to it
        finally:
            held.close()
        _wait_for(lambda: front.receiving_bytes == 0)  # the hang-up gave its bytes back
        assert _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0]})[0] == 200
        # a chunked body (no length) is held to it by the bytes that arrive
        conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=60)
        conn.request("POST", "/v2/models/gcn/infer", body=(b" " * 1024 for _ in range(8)), encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 429 and b"of unknown length" in r.read()
        conn.close()
    finally:
        front.receive_budget_bytes = old
    _wait_for(lambda: front.receiving_bytes == 0)
    assert _post_infer(client, "gcn", {"inputs": _json_inputs([1])[0]})[0] == 200


def test_a_client_hanging_up_mid_body_is_cancelled_not_internal(server, client, caplog):
    import logging

    port = server.server.metrics_port

    def count(code: str) -> float:
        return sum(v for s, v in metric_samples(port, "gnnserve_requests_total")
                   if s.get("method") == "http_infer" and s.get("code") == code)

    internal, cancelled = count("INTERNAL"), count("CANCELLED")
    with caplog.at_level(logging.INFO):
        for _ in range(3):  # t10_disconnect
            s = _open_stalled(client.port, 1000, b'{"inputs":')
            time.sleep(0.1)
            s.close()
        _wait_for(lambda: count("CANCELLED") >= cancelled + 3)
    assert count("INTERNAL") == internal and count("CANCELLED") == cancelled + 3
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and "http_infer" in r.getMessage()], [
        r.getMessage() for r in caplog.records]


def test_request_ids_are_held_to_the_grpc_limit(client):
    from serve.validation import MAX_REQUEST_ID

    body = {"id": "a" * MAX_REQUEST_ID, "inputs": _json_inputs([1])[0]}
    status, headers, data = _post_infer(client, "gcn", body)
    assert status == 200 and _split(headers, data)[0]["id"] == "a" * MAX_REQUEST_ID
    body["id"] = "a" * (60 * MAX_REQUEST_ID)
    status, _, data = _post_infer(client, "gcn", body)
    assert status == 400 and f"more than the limit of {MAX_REQUEST_ID}" in _error(status, data)
    assert len(data) < 1000  # not echoed


def test_model_config_prints_64_bit_integers_as_numbers(client, stub):
    from google.protobuf.descriptor import FieldDescriptor

    wide = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
            FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
    seen = []

    def check(desc, value: dict) -> None:  # every 64-bit integer field a JSON number, as Triton prints them
        for f in desc.fields:
            if f.name not in value:
                continue
            v = value[f.name]
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                vf = f.message_type.fields_by_name["value"]
                for item in v.values():
                    check(vf.message_type, item) if vf.message_type is not None else None
            elif f.message_type is not None:
                for item in (v if f.is_repeated else [v]):
                    check(f.message_type, item)
            elif f.type in wide:
                for item in (v if f.is_repeated else [v]):
                    assert isinstance(item, int) and not isinstance(item, bool), (f.full_name, item)
                    seen.append(f.full_name)

    status, cfg = client.json("GET", "/v2/models/gcn/config")
    assert status == 200
    check(pb.ModelConfig.DESCRIPTOR, cfg)
    assert cfg["input"][0]["dims"] == [1] and "inference.ModelInput.dims" in seen
    assert json_format.ParseDict(cfg, pb.ModelConfig()) == stub.ModelConfig(
        pb.ModelConfigRequest(name="gcn"), timeout=60).config
    status, stats = client.json("GET", "/v2/models/gcn/stats")  # the statistics: numbers already
    assert status == 200 and isinstance(stats["model_stats"][0]["inference_count"], int)
    assert isinstance(stats["model_stats"][0]["inference_stats"]["success"]["ns"], int)


# ---------------------------------------------------------------------- the drain
def test_drain_refuses_new_requests_with_503_and_health_says_not_ready(tiny_repo):
    import threading

    srv = ServerThread(tiny_repo, {"http_port": 0, "drain_s": 3.0}).start()
    stopper = threading.Thread(target=srv.stop, args=(2.0,))
    try:
        c = Http(srv.server.http_port)
        assert c.call("GET", "/v2/health/ready")[0] == 200
        stopper.start()  # the graceful stop: the listener stays, refusing, for drain_s
        t_end = time.monotonic() + 2
        while srv.server.gate.open and time.monotonic() < t_end:
            time.sleep(0.01)
        status, headers, data = _post_infer(c, "gcn", {"inputs": _json_inputs([1])[0]})
        assert status == 503 and "shutting down" in _error(status, data) and headers["gnnserve-status"] == "UNAVAILABLE"
        assert c.call("GET", "/v2/health/live")[0] == 200
        assert c.call("GET", "/v2/health/ready")[0] == 400
        assert c.call("GET", "/v2/models/gcn/ready")[0] == 400  # not ready: 4xx (KServe), 400 (Triton)
        stopper.join(60)
        assert not stopper.is_alive()
        with pytest.raises(OSError):  # the listener is closed once stopped
            c.call("GET", "/v2/health/live")
    finally:
        if not stopper.is_alive() and srv._loop is not None:
            srv.stop()


# ---------------------------------------------------------------------- the token and TLS
@pytest.fixture(scope="module")
def token_server(tiny_repo):
    with ServerThread(tiny_repo, {"http_port": 0, "metrics_port": 0, "token": TOKEN}) as srv:
        yield srv


def test_token_is_required_as_on_grpc(token_server):
    c = Http(token_server.server.http_port)
    for path in ("/v2/health/live", "/v2/health/ready"):  # open, as the gRPC health check (probes)
        assert c.call("GET", path, token=None)[0] == 200
    body = {"inputs": _json_inputs([1, 2])[0]}
    for token in (None, "wrong", TOKEN + "x"):
        for method, path, payload in (("GET", "/v2", None), ("GET", "/v2/models/gcn", None),
                                      ("GET", "/v2/models/gcn/ready", None), ("POST", "/v2/models/gcn/infer", body),
                                      ("GET", "/v2/models/stats", None), ("POST", "/v2/repository/index", None),
                                      ("POST", "/v2/repository/models/gcn/unload", None), ("GET", "/v2/logging", None)):
            status, headers, data = c.call(method, path, payload, token=token)
            assert status == 401 and headers["www-authenticate"] == "Bearer", (token, path)
            assert _error(status, data) == "missing or invalid bearer token"
    status, _, _ = c.call("GET", "/v2", headers={"Authorization": TOKEN}, token=None)  # not "Bearer <token>"
    assert status == 401
    assert c.call("GET", "/v2", headers={"Authorization": f"bearer \t{TOKEN}"}, token=None)[0] == 200
    status, _, data = c.call("POST", "/v2/models/gcn/infer", body, token=TOKEN)
    assert status == 200 and json.loads(data)["outputs"][0]["name"] == "LABELS"
    with grpc.insecure_channel(token_server.address) as ch:  # gRPC refuses the same
        e = _grpc_refusal(pb_grpc.GRPCInferenceServiceStub(ch).ServerMetadata, pb.ServerMetadataRequest(), timeout=60)
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED


def test_refused_http_requests_are_counted_unauthenticated(token_server):
    c = Http(token_server.server.http_port)
    port = token_server.server.metrics_port

    def refused() -> float:
        return sum(v for s, v in metric_samples(port, "gnnserve_requests_total")
                   if s.get("method") == "http_infer" and s.get("code") == "UNAUTHENTICATED" and s.get("model") == "")

    before = refused()
    assert _post_infer(c, "gcn", {"inputs": _json_inputs([1])[0]}, headers={"Authorization": "Bearer no"})[0] == 401
    assert refused() == before + 1


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    from .test_security import make_certs

    return make_certs(tmp_path_factory.mktemp("http-certs"))


def _client_context(certs: Path, client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if client_cert:
        ctx.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    return ctx


def test_tls_serves_https_only(tiny_repo, certs, stub):
    opts = {"http_port": 0, "tls_cert": str(certs / "server.pem"), "tls_key": str(certs / "server.key")}
    with ServerThread(tiny_repo, opts) as srv:
        port = srv.server.http_port
        c = Http(port, context=_client_context(certs, False))
        assert c.call("GET", "/v2/health/ready")[0] == 200
        nodes = [5, 6]
        status, headers, data = _post_infer(c, "gcn", {"inputs": _json_inputs(nodes)[0]})
        head, _ = _split(headers, data)
        assert status == 200 and [_as_raw(o) for o in head["outputs"]] == list(
            _grpc_infer(stub, "gcn", nodes).raw_output_contents)
        # plaintext HTTP to the TLS port gets no HTTP answer
        answer = _raw_exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", wait_s=10)
        assert not answer.startswith(b"HTTP/1.1 200")
        with pytest.raises(ssl.SSLError):  # a certificate from another CA is not trusted
            Http(port, context=ssl.create_default_context(cafile=str(certs / "other-ca.pem"))).call(
                "GET", "/v2/health/live")


def test_tls_client_certificates_are_required(tiny_repo, certs):
    opts = {"http_port": 0, "tls_cert": str(certs / "server.pem"), "tls_key": str(certs / "server.key"),
            "tls_client_ca": str(certs / "ca.pem")}
    with ServerThread(tiny_repo, opts) as srv:
        port = srv.server.http_port
        assert Http(port, context=_client_context(certs, True)).call("GET", "/v2")[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            Http(port, context=_client_context(certs, False)).call("GET", "/v2")


# ---------------------------------------------------------------------- Triton's own client


def _tritonclient_http():
    if importlib.util.find_spec("tritonclient") is None or importlib.util.find_spec("geventhttpclient") is None:
        pytest.skip("tritonclient[http] not installed")
    import tritonclient.http as th

    return th


def test_tritonclient_http(client, stub, server):
    th = _tritonclient_http()
    from tritonclient.utils import InferenceServerException

    tc = th.InferenceServerClient(f"127.0.0.1:{client.port}", network_timeout=60)
    try:
        assert tc.is_server_live() and tc.is_server_ready()
        assert tc.is_model_ready("gcn") and not tc.is_model_ready("gcn", "2") and not tc.is_model_ready("nope")
        assert tc.get_server_metadata()["name"] == "gnnserve"
        assert tc.get_model_metadata("shadow")["inputs"][0] == {"name": "NODE_IDS", "datatype": "INT64",
                                                                 "shape": [-1, 1]}
        assert tc.get_model_config("shadow")["max_batch_size"] == 4096
        nodes = np.array([0, 5, 7, 123], dtype=np.int64)
        new = _new_nodes(np.random.default_rng(3), 2)
        want = _grpc_infer(stub, "shadow", nodes.tolist(), ("LABELS", "PROBABILITIES", "EMBEDDINGS"), new=new,
                           sampling_width=2, ppr_budget=16)
        for binary in (True, False):
            inputs = []
            for name, arr in [("NODE_IDS", nodes), *new.items()]:
                i = th.InferInput(name, list(arr.shape), "FP32" if arr.dtype.kind == "f" else "INT64")
                i.set_data_from_numpy(arr, binary_data=binary)
                inputs.append(i)
            outputs = [th.InferRequestedOutput(o, binary_data=binary)
                       for o in ("LABELS", "PROBABILITIES", "EMBEDDINGS")]
            res = tc.infer("shadow", inputs, outputs=outputs, parameters={"sampling_width": 2, "ppr_budget": 16},
                           request_id="tc-1")
            assert res.as_numpy("LABELS").astype("<i8").tobytes() == want.raw_output_contents[0]
            assert res.as_numpy("PROBABILITIES").astype("<f4").tobytes() == want.raw_output_contents[1]
            assert res.as_numpy("EMBEDDINGS").astype("<f4").tobytes() == want.raw_output_contents[2]
            assert res.get_response()["id"] == "tc-1"
            assert res.get_response()["parameters"]["graph_version"] == want.parameters["graph_version"].int64_param
        for algorithm in ("gzip", "deflate"):  # tritonclient's compressed requests and answers
            res = tc.infer("shadow", inputs, outputs=outputs, parameters={"sampling_width": 2, "ppr_budget": 16},
                           request_compression_algorithm=algorithm, response_compression_algorithm=algorithm)
            assert res.as_numpy("PROBABILITIES").astype("<f4").tobytes() == want.raw_output_contents[1]
        i = th.InferInput("NODE_IDS", [2], "INT64")
        i.set_data_from_numpy(np.array([1, 2], dtype=np.int64))
        res = tc.infer("gcn", [i], outputs=[th.InferRequestedOutput("PROBABILITIES", class_count=2)])
        assert res.as_numpy("PROBABILITIES").shape == (2, 2)
        with pytest.raises(InferenceServerException) as ei:
            tc.infer("gcn", [i], parameters={"sampling_width": -1})
        assert ei.value.status() == "400" and "sampling_width" in ei.value.message()
        with pytest.raises(InferenceServerException) as ei:
            tc.infer("nope", [i])
        assert ei.value.status() == "404"
        stats = tc.get_inference_statistics("gcn")["model_stats"][0]
        assert stats["name"] == "gcn" and stats["inference_count"] >= 2
        assert {m["name"] for m in tc.get_model_repository_index()} == {"gcn", "shadow"}
        tc.unload_model("gcn")
        assert not tc.is_model_ready("gcn")
        tc.load_model("gcn")
        assert tc.is_model_ready("gcn")
        assert tc.get_log_settings()["log_format"] == "default"
        tc.unregister_system_shared_memory()
        tc.unregister_cuda_shared_memory()
        assert tc.get_system_shared_memory_status() == []
    finally:
        tc.close()


# ---------------------------------------------------------------------- --processes and the command line
def test_processes_share_the_http_port(tiny_repo):
    http_port = free_port()
    with ServerProcess(tiny_repo, "--processes", "2", "--read-only", "--poll-s", "0", "--http-port",
                       str(http_port)) as srv:
        c = Http(http_port)
        assert c.call("GET", "/v2/health/ready")[0] == 200
        reached = set()
        for _ in range(48):  # each call a new connection: the kernel gives it to one of the processes
            status, _, data = c.call("POST", "/v2/repository/models/gcn/unload")
            assert status == 400, data  # FAILED_PRECONDITION under --processes, as on gRPC
            message = _error(status, data)
            reached.add(message.split("reached process ", 1)[1].split(" ", 1)[0])
            if len(reached) == 2:
                break
        assert reached == {"1", "2"}, f"only processes {reached} answered over HTTP"
        assert _post_infer(c, "gcn", {"inputs": _json_inputs([1, 2])[0]})[0] == 200
        # log settings: read anywhere, never changed in one process alone (over HTTP and gRPC alike)
        status, settings = c.json("GET", "/v2/logging")
        assert status == 200 and settings["log_verbose_level"] == 0
        status, _, data = c.call("POST", "/v2/logging", {"log_verbose_level": 1})
        assert status == 400 and "--log-level" in _error(status, data) and "one process only" in _error(status, data)
        with grpc.insecure_channel(srv.address) as ch:
            g = pb_grpc.GRPCInferenceServiceStub(ch)
            req = pb.LogSettingsRequest()
            req.settings["log_verbose_level"].uint32_param = 1
            e = _grpc_refusal(g.LogSettings, req, timeout=60)
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "--log-level" in e.details()
            assert g.LogSettings(pb.LogSettingsRequest(), timeout=60).settings["log_verbose_level"].uint32_param == 0
        for _ in range(8):
            assert c.json("GET", "/v2/logging") == (200, settings)
        assert srv.proc is not None


def test_cli_refuses_an_http_port_that_is_the_grpc_port(tiny_repo, capsys):
    from serve import cli

    port = free_port()
    assert cli.main(["serve", "--repo", str(tiny_repo), "--port", str(port), "--http-port", str(port)]) == 2
    assert f"--http-port {port} is also the gRPC port" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        assert cli.main(["serve", "--repo", str(tiny_repo), "--port", "0", "--http-port", str(busy)]) == 2
        assert "(--host/--http-port, HTTP/REST)" in capsys.readouterr().err
