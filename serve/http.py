"""KServe v2 / Triton HTTP/REST front end (Triton's port 8000), beside the gRPC services, on the same event loop.

Enabled with ``gnnserve serve --http-port PORT`` (``ServerConfig.http_port``; 0 = a free port), on ``--host``. It is
a translation layer only: each HTTP request becomes the protobuf request the gRPC KServe handler takes
(:class:`serve.triton.TritonServicer`), which runs it, so validation, knobs, new-node inputs, outputs, statistics,
response parameters and limits are the gRPC ones; the answer is written back as JSON (and, on request, Triton's
binary tensor data). Endpoints:

* ``GET /v2/health/live``, ``GET /v2/health/ready``: 200, or 400 when not ready (KServe: 4xx means false; Triton
  answers 400). Open without the bearer token, as the gRPC health check is (Kubernetes HTTP probes), and answered
  while the server drains (ready then says 400);
* ``GET /v2`` (server metadata; ``extensions`` adds ``binary_tensor_data``), ``GET /v2/models/{m}[/versions/{v}]``
  (metadata), ``.../ready`` (200 / 400, and 400 while the server drains, as health ready; with the token, not
  capped), ``.../config`` (the ``ModelConfig`` in protobuf's JSON mapping with the field names of the ``.proto``,
  but every 64-bit integer field a JSON number, not protobuf's string, as Triton prints it: ``"dims": [1]``),
  ``POST .../infer``;
* ``GET /v2/models/stats``, ``GET /v2/models/{m}[/versions/{v}]/stats`` (``{"model_stats": [...]}``, every field,
  integers as JSON numbers, as Triton prints them). Under ``--processes N`` (N > 1) they are the counts of the one
  process the connection reached (each process serves its own connections and keeps its own statistics), so two
  calls may answer from different processes: totals are on the metrics port, which merges every process;
* ``POST /v2/repository/index`` (body ``{"ready": bool}``, optional), ``POST /v2/repository/models/{m}/load`` and
  ``/unload`` (body ``{"parameters": {...}}``, optional: ``version``, ``unload_dependents``, as over gRPC);
* ``GET`` / ``POST /v2/logging`` (Triton's log settings; a POST answers the settings now in force; under
  ``--processes N`` (N > 1) a POST that changes them is 400 (FAILED_PRECONDITION, as over gRPC): it would set one
  process's loggers; ``--log-level`` sets every process's at start);
* ``/v2/trace/setting`` and registering shared memory: 501, as gRPC's UNIMPLEMENTED; the shared-memory status
  lists no region and unregistering succeeds (as over gRPC).

Inference (``POST /v2/models/{m}[/versions/{v}]/infer``): ``{"id", "parameters", "inputs", "outputs"}``, each input
``{"name", "datatype", "shape", "data"}`` (``data`` flat or nested row-major) or, with Triton's binary tensor data
extension, ``"parameters": {"binary_data_size": N}`` and its N raw little-endian bytes after the JSON header, whose
length the ``Inference-Header-Content-Length`` header gives (inputs in the order of ``inputs``; all of the body
accounted for). Outputs ``{"name", "parameters": {"binary_data": bool, "classification": k}}``; the request
parameter ``binary_data_output`` sets ``binary_data`` for every output that does not say. The other request
parameters (knobs, ``min_graph_version``, ``timeout``, ``priority``) are gRPC's; ``id`` is held to the limit on a
request id of gnnserve's gRPC service (:data:`serve.validation.MAX_REQUEST_ID` characters, 400 beyond, not
echoed): a JSON integer is an
``int64_param`` (``uint64_param`` above 2**63 - 1), a number a ``double_param``, a string a ``string_param``, a
bool a ``bool_param``. A binary output's bytes are exactly gRPC's ``raw_output_contents``; a JSON output's ``data``
holds the same values (FP32 printed as the float64 that holds the float32 exactly: parsed back to float32 it is the
same bits). An answer is compressed when ``Accept-Encoding`` asks (tritonclient's
``response_compression_algorithm``). JSON is parsed and printed on the event loop, binary data is only copied:
large requests should use binary data.

Errors: ``{"error": "<message>"}`` with the gRPC status's message, and an HTTP status from the gRPC code as Google's
API mapping has it (:data:`HTTP_STATUS`): INVALID_ARGUMENT, FAILED_PRECONDITION and OUT_OF_RANGE 400,
UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS and ABORTED 409, RESOURCE_EXHAUSTED 429,
CANCELLED 499, UNKNOWN, INTERNAL and DATA_LOSS 500, UNIMPLEMENTED 501, UNAVAILABLE 503, DEADLINE_EXCEEDED 504. The
header ``Gnnserve-Status`` names the gRPC code (400 stands for several). The front end's own refusals: a body over
:attr:`HttpFrontEnd.max_body_bytes` (the gRPC server's largest message) 413; a body not received within
:data:`BODY_TIMEOUT_S` 408; a body past the receive budget 429 (below); a client that hangs up before its body has
arrived CANCELLED (499, which it never reads; logged at DEBUG, no incident); a ``Content-Encoding`` other than gzip,
deflate or identity 415 (a compressed body is inflated here, never past the limit: 413); an unknown path 404, a
known one with another method 405; malformed JSON, wrong JSON types, a binary header length or sizes that do not add
up to the body 400 (INVALID_ARGUMENT), with what to fix. Before the JSON of an inference request is parsed, its
separators are counted: more values than the model takes in one request (nodes, features, new-node edges:
:func:`json_value_cap`) are refused without parsing, as gRPC refuses an oversized request from its bytes
(:mod:`serve.wire`); more inputs than the model has or more than 64 parameters are refused before any work on them.

Security: the bearer token (``--token-file``...) is required as on gRPC (``Authorization: Bearer <token>``; 401 and
``WWW-Authenticate: Bearer`` otherwise, the body unread) on every endpoint but the two health ones; with
``--tls-cert``/``--tls-key`` the port serves HTTPS only (never plaintext beside a TLS gRPC port), and
``--tls-client-ca`` requires client certificates there too. Under ``--processes N`` every process binds the HTTP
port with ``SO_REUSEPORT``, as the gRPC one.

Admission: a request counts toward the cap on requests at once, ``--max-concurrent-rpcs`` (429 beyond, as gRPC caps
its own), only once its body has arrived, as gRPC calls a handler once the whole message has: a client slow to send
its body (or sending none: slowloris) holds no slot. What bodies being received hold instead is bounded by a byte
budget, :attr:`HttpFrontEnd.receive_budget_bytes` (:data:`RECEIVE_BUDGET_BODIES` bodies of the largest size, 256 MiB
by default): the bytes received so far of every body not yet whole. A new body is refused at once, unread, when its
declared ``Content-Length`` (1 byte for a chunked one) would pass the budget, and a body being received is refused
when its next bytes would (429 RESOURCE_EXHAUSTED, "retry with backoff"); the bytes go back to the budget when the
body is whole (then it counts toward the cap), refused, timed out, or its client hangs up. The budget counts bytes
received, not declared lengths, so a client must send the bytes it holds: a thousand stalled bodies of one byte hold
a thousand bytes. (aiohttp reads ahead of the handler a bounded buffer per connection.) :data:`BODY_TIMEOUT_S` stays
60 s: with no slot held, a stalled body costs its connection and the bytes it sent, so a shorter timeout would buy
little and would cut off slow clients sending large bodies (a body of the largest size, 64 MiB, needs about 1.1
MiB/s to arrive within 60 s). During a graceful stop new requests get 503, before their body is read (health live
still 200).

Metrics: every request is counted in ``gnnserve_requests_total{model, method, code}`` with ``method`` ``http_<what>``
(``http_infer``, ``http_model_metadata``, ...; :data:`METHODS`) and ``code`` the gRPC code's name, as gRPC calls are.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import math
import socket
import ssl
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import ContentLengthError
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from clients._gen import inference_pb2 as pb

from .errors import InvalidArgument, detached
from .interceptors import bearer_token, bounded, error_status
from .triton import INPUT_SPECS
from .validation import MAX_REQUEST_ID
from .wire import WireLimits

if TYPE_CHECKING:
    from .interceptors import BearerAuthInterceptor, DrainGate
    from .metrics import ServerMetrics
    from .triton import TritonServicer

__all__ = ["HTTP_STATUS", "METHODS", "HttpFrontEnd", "server_ssl_context"]

log = logging.getLogger(__name__)

#: the HTTP status of each gRPC code (Google's API mapping, google/rpc/code.proto)
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}

#: the ``method`` label of gnnserve_requests_total for each endpoint
METHODS = ("http_live", "http_ready", "http_model_ready", "http_server_metadata", "http_model_metadata",
           "http_model_config", "http_infer", "http_statistics", "http_repository_index", "http_repository_load",
           "http_repository_unload", "http_logging", "http_trace", "http_shared_memory")

#: seconds a request's body may take to arrive (a client that trickles it is answered 408 and closed; module
#: docstring: why not shorter)
BODY_TIMEOUT_S = 60.0
#: the budget of bytes of bodies being received, in bodies of the largest size (``max_body_bytes``)
RECEIVE_BUDGET_BODIES = 4
#: the request's key for the body _serve received (a typed key where aiohttp has them: 3.12 on)
_BODY: Any = web.RequestKey("gnnserve_body", object) if hasattr(web, "RequestKey") else "gnnserve_body"
#: the header of Triton's binary tensor data extension: the length of the JSON part of a body
HEADER_LENGTH = "Inference-Header-Content-Length"
#: the request bodies' Content-Encodings taken: zlib's window bits for each (None: as is)
_WBITS: dict[str, int | None] = {"identity": None, "gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: the response header naming the gRPC status code of the answer
STATUS_HEADER = "Gnnserve-Status"
#: the extension the HTTP endpoint adds to the gRPC service's (serve.triton.EXTENSIONS)
BINARY_EXTENSION = "binary_tensor_data"
#: JSON array nesting accepted in an input's ``data`` (row-major nested lists: one level per dimension)
MAX_DATA_DEPTH = 16
#: JSON values allowed in an inference request beyond its tensors' (ids, parameters, shapes, names)
_JSON_SLACK = 4096
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_INFER_KEYS = ("id", "parameters", "inputs", "outputs")
#: request parameters an inference request may carry (gRPC's bound, serve.wire.WireLimits.max_parameters)
_MAX_PARAMETERS = WireLimits().max_parameters


class _Context:
    """What the gRPC handlers read from their context: no gRPC deadline over HTTP (the request parameter
    ``timeout`` is the deadline there, as in Triton's HTTP protocol)."""

    @staticmethod
    def time_remaining() -> None:
        return None


_CONTEXT: Any = _Context()


def server_ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The HTTPS context of ``--tls-cert``/``--tls-key`` (TLS 1.2 or later), requiring a client certificate signed by
    ``client_ca`` when given (``--tls-client-ca``), as the gRPC port does."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def json_value_cap(num_features: int, max_nodes: int, max_new_node_edges: int) -> int:
    """The most JSON values (so separators) an inference request to a model can need: its node ids and counts,
    new nodes' features, neighbours and weights at the model's limits, plus :data:`_JSON_SLACK`."""
    return 2 * max_nodes + max_nodes * num_features + 2 * max_new_node_edges + _JSON_SLACK


# ---------------------------------------------------------------------- JSON <-> protobuf
def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _infer_parameter(key: str, value: object, out: pb.InferParameter, where: str) -> None:
    """A JSON parameter value into an ``InferParameter`` (module docstring); other JSON types are refused."""
    if isinstance(value, bool):
        out.bool_param = value
    elif isinstance(value, int):  # (bool is checked first)
        if _INT64_MIN <= value <= _INT64_MAX:
            out.int64_param = value
        elif 0 <= value <= _UINT64_MAX:
            out.uint64_param = value
        else:
            raise InvalidArgument(f"{where} parameter {key[:64]}: the integer {str(value)[:32]}... is outside the "
                                  f"64-bit range ({_INT64_MIN} to {_UINT64_MAX})")
    elif isinstance(value, float):
        out.double_param = value
    elif isinstance(value, str):
        out.string_param = value
    else:
        raise InvalidArgument(f"{where} parameter {key[:64]} must be a bool, a number or a string, got "
                              f"{_json_type(value)}")


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _flatten(data: object, name: str) -> list[Any]:
    """An input's ``data``: a flat or nested (row-major) JSON array, flattened; scalars only at the leaves."""
    if not isinstance(data, list):
        raise InvalidArgument(f"input {name}: data must be a JSON array (flat, or nested row-major), got "
                              f"{_json_type(data)}")
    flat: list[Any] = []
    stack: list[tuple[list[Any], int]] = [(data, 0)]
    while stack:
        seq, depth = stack.pop()
        if not any(isinstance(x, (list, dict)) for x in seq):
            flat.extend(seq)
            continue
        if depth >= MAX_DATA_DEPTH:
            raise InvalidArgument(f"input {name}: data nested deeper than {MAX_DATA_DEPTH} arrays")
        for x in reversed(seq):  # pushed in reverse: popped in order
            if isinstance(x, dict):
                raise InvalidArgument(f"input {name}: data holds an object; it takes numbers (in arrays)")
            stack.append((x, depth + 1) if isinstance(x, list) else ([x], depth + 1))
    return flat


def _json_values(name: str, datatype: str, data: object) -> np.ndarray | None:
    """An input's JSON ``data`` as the array of its datatype (INT64: integers only; FP32: numbers); None for the
    other datatypes (which no input of this server takes: the handler refuses the datatype, naming the input)."""
    flat = _flatten(data, name)
    if datatype == "INT64":
        for x in flat:
            if not _is_int(x):
                raise InvalidArgument(f"input {name} (INT64): data must hold integers, got {_json_type(x)} "
                                      f"{str(x)[:32]}")
        try:
            return np.array(flat, dtype=np.int64)
        except OverflowError:
            raise InvalidArgument(f"input {name} (INT64): a value is outside the int64 range") from None
    if datatype == "FP32":
        for x in flat:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise InvalidArgument(f"input {name} (FP32): data must hold numbers, got {_json_type(x)}")
        with np.errstate(over="ignore"):  # a value past float32's range becomes inf, which the checks refuse
            try:
                return np.array(flat, dtype=np.float64).astype(np.float32)
            except OverflowError:  # an integer past float64's range
                return np.full(len(flat), np.inf, dtype=np.float32)
    return None


def _shape(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(d) and _INT64_MIN <= d <= _INT64_MAX for d in value):
        raise InvalidArgument(f"input {name}: shape must be an array of integers, got {str(value)[:64]}")
    return value


def _binary_size(params: dict[str, Any], where: str) -> int | None:
    if "binary_data_size" not in params:
        return None
    n = params["binary_data_size"]
    if not _is_int(n) or n < 0:
        raise InvalidArgument(f"{where}: binary_data_size must be an integer >= 0 (bytes), got {str(n)[:32]}")
    return int(n)


def infer_request(body: dict[str, Any], model: str, version: str, binary: bytes | memoryview
                  ) -> tuple[pb.ModelInferRequest, dict[str, bool], bool]:
    """The ``ModelInferRequest`` of a parsed KServe v2 JSON inference request (``binary``: the body's bytes after
    its JSON header), which outputs go back as binary data (by name, for those the request names) and the
    request-wide choice (``binary_data_output``, for the others)."""
    unknown = sorted(set(body) - set(_INFER_KEYS))
    if unknown:
        raise InvalidArgument(f"unknown keys {[u[:64] for u in unknown[:8]]} in the inference request; it takes "
                              f"{list(_INFER_KEYS)}")
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    rid = body.get("id", "")
    if not isinstance(rid, str):
        raise InvalidArgument(f"id must be a string, got {_json_type(rid)}")
    if len(rid) > MAX_REQUEST_ID:  # gRPC's limit on a request id (serve.validation.check_request_id), not echoed
        raise InvalidArgument(f"id has {len(rid)} characters, more than the limit of {MAX_REQUEST_ID}; use a short "
                              "id, such as a UUID")
    req.id = rid
    params = _object(body.get("parameters", {}), "parameters")
    if len(params) > _MAX_PARAMETERS:  # as gRPC refuses it from the request's bytes (serve.wire)
        raise InvalidArgument(f"request has more than {_MAX_PARAMETERS} parameters")
    binary_default = False
    for key, value in params.items():
        if key == "binary_data_output":
            if not isinstance(value, bool):
                raise InvalidArgument(f"parameter binary_data_output must be a bool, got {_json_type(value)}")
            binary_default = value
            continue
        _infer_parameter(key, value, req.parameters[key], "request")
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidArgument("the inference request needs inputs: a JSON array of {\"name\", \"datatype\", "
                              "\"shape\", \"data\"} objects" + ("" if inputs is None else f", got {_json_type(inputs)}"))
    if len(inputs) > len(INPUT_SPECS):  # before any per-input work (gRPC's message size bounds its count)
        raise InvalidArgument(f"request has {len(inputs)} inputs; this model takes at most {len(INPUT_SPECS)}: "
                              f"{list(INPUT_SPECS)} (all optional, each at most once)")
    specs = []
    for i, tensor in enumerate(inputs):
        t = _object(tensor, f"inputs[{i}]")
        name, datatype = t.get("name"), t.get("datatype")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise InvalidArgument(f"inputs[{i}] needs a name and a datatype (strings)")
        extra = sorted(set(t) - {"name", "datatype", "shape", "parameters", "data"})
        if extra:
            raise InvalidArgument(f"input {name[:64]}: unknown keys {[e[:64] for e in extra[:8]]}")
        shape = _shape(t.get("shape"), name[:64])
        tparams = _object(t.get("parameters", {}), f"input {name[:64]}: parameters")
        size = _binary_size(tparams, f"input {name[:64]}")
        if size is not None and "data" in t:
            raise InvalidArgument(f"input {name[:64]} has both data and binary_data_size: send its values in one")
        if size is None and "data" not in t:
            raise InvalidArgument(f"input {name[:64]} has no data (give \"data\", or its bytes after the JSON with "
                                  "the binary_data_size parameter)")
        specs.append((name, datatype, shape, tparams, size, t.get("data")))
    any_binary = any(s[4] is not None for s in specs)
    offset = 0
    for name, datatype, shape, tparams, size, data in specs:
        tensor_pb = req.inputs.add(name=name, datatype=datatype, shape=shape)
        for key, value in tparams.items():
            if key != "binary_data_size":
                _infer_parameter(key, value, tensor_pb.parameters[key], f"input {name[:64]}")
        if size is not None:
            if offset + size > len(binary):
                raise InvalidArgument(f"input {name[:64]}: binary_data_size {size} runs past the body: "
                                      f"{len(binary) - offset} bytes of binary data are left after the JSON header "
                                      f"({HEADER_LENGTH})")
            req.raw_input_contents.append(bytes(binary[offset:offset + size]))
            offset += size
            continue
        values = _json_values(name[:64], datatype, data)
        if any_binary:  # one raw entry per input (serve.triton: all raw or none)
            if values is not None and values.size != math.prod(shape) and all(d >= 0 for d in shape):
                raise InvalidArgument(f"input {name[:64]}: {values.size} values in data for shape {shape[:4]}")
            req.raw_input_contents.append(b"" if values is None else values.astype(values.dtype.newbyteorder("<"))
                                          .tobytes())
        elif values is not None:
            field = "int64_contents" if datatype == "INT64" else "fp32_contents"
            getattr(tensor_pb.contents, field).extend(values.tolist())
    if offset != len(binary):
        raise InvalidArgument(f"the body has {len(binary) - offset} bytes after the JSON header that no input's "
                              "binary_data_size accounts for")
    outputs = body.get("outputs", [])
    if not isinstance(outputs, list):
        raise InvalidArgument(f"outputs must be a JSON array, got {_json_type(outputs)}")
    binary_out: dict[str, bool] = {}
    for i, o in enumerate(outputs):
        o = _object(o, f"outputs[{i}]")
        name = o.get("name")
        if not isinstance(name, str):
            raise InvalidArgument(f"outputs[{i}] needs a name (a string)")
        extra = sorted(set(o) - {"name", "parameters"})
        if extra:
            raise InvalidArgument(f"output {name[:64]}: unknown keys {[e[:64] for e in extra[:8]]}")
        out_pb = req.outputs.add(name=name)
        flag = binary_default
        for key, value in _object(o.get("parameters", {}), f"output {name[:64]}: parameters").items():
            if key == "binary_data":
                if not isinstance(value, bool):
                    raise InvalidArgument(f"output {name[:64]}: binary_data must be a bool, got {_json_type(value)}")
                flag = value
            else:
                _infer_parameter(key, value, out_pb.parameters[key], f"output {name[:64]}")
        binary_out[name] = flag
    return req, binary_out, binary_default


def _parameter_value(p: Any) -> Any:
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def _bytes_elements(raw: bytes) -> list[str]:
    """A BYTES tensor's elements (each a 4-byte little-endian length, then its bytes) as strings."""
    out, pos = [], 0
    while pos < len(raw):
        n = int.from_bytes(raw[pos:pos + 4], "little")
        out.append(raw[pos + 4:pos + 4 + n].decode("utf-8", "replace"))
        pos += 4 + n
    return out


_NUMPY = {"INT64": "<i8", "FP32": "<f4"}


def infer_response(resp: pb.ModelInferResponse, binary_out: dict[str, bool], binary_default: bool = False
                   ) -> tuple[bytes, bytes]:
    """The JSON header and the binary part (empty when no output is binary) of the HTTP answer to ``resp``."""
    head: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        head["id"] = resp.id
    head["parameters"] = {k: _parameter_value(v) for k, v in resp.parameters.items()}
    outputs, parts = [], []
    for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
        as_binary = binary_out.get(out.name, binary_default)
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}
        if as_binary:
            entry["parameters"] = {"binary_data_size": len(raw)}
            parts.append(raw)
        elif out.datatype == "BYTES":
            entry["data"] = _bytes_elements(raw)
        else:
            entry["data"] = np.frombuffer(raw, dtype=_NUMPY[out.datatype]).tolist()
        outputs.append(entry)
    head["outputs"] = outputs
    return json.dumps(head, allow_nan=False, separators=(",", ":")).encode(), b"".join(parts)


_WIDE = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                   FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


def _int64_numbers(desc: Any, value: dict[str, Any]) -> dict[str, Any]:
    """``value`` (protobuf's JSON mapping of a message of ``desc``, field names kept) with every 64-bit integer
    field a JSON number instead of a string, as Triton's ModelConfigToJson prints them; found from the descriptor,
    at any depth (messages, repeated fields, map values). Changed in place; returned."""
    for field in desc.fields:
        if field.name not in value:
            continue
        v = value[field.name]
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            vf = sub.fields_by_name["value"]
            for key, item in v.items():  # keys stay strings (JSON's object keys)
                if vf.message_type is not None:
                    _int64_numbers(vf.message_type, item)
                elif vf.type in _WIDE:
                    v[key] = int(item)
        elif sub is not None:
            for item in (v if field.is_repeated else [v]):
                _int64_numbers(sub, item)
        elif field.type in _WIDE:
            value[field.name] = [int(x) for x in v] if field.is_repeated else int(v)
    return value


def _message_dict(msg: Any) -> dict[str, Any]:
    """A protobuf message as a dict with every field, integers as JSON numbers (Triton's statistics JSON)."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = {k: (_message_dict(v) if hasattr(v, "DESCRIPTOR") else v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_message_dict(v) if field.message_type is not None else v for v in value]
        elif field.message_type is not None:
            out[field.name] = _message_dict(value)
        else:
            out[field.name] = value
    return out


def _tensor_metadata(t: Any) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


# ---------------------------------------------------------------------- the front end
class _Refusal(Exception):
    """An answer the front end gives itself (not a gRPC status): an HTTP status, a gRPC code for the metrics and
    the message."""

    def __init__(self, status: int, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpFrontEnd:
    """The HTTP/REST endpoint over a :class:`~serve.triton.TritonServicer` (module docstring). Build, then
    ``await start(host, port)``; ``await stop(grace_s)`` once the server's gate has closed."""

    def __init__(self, servicer: TritonServicer, *, metrics: ServerMetrics | None = None,
                 gate: DrainGate | None = None, auth: BearerAuthInterceptor | None = None,
                 token: str | None = None, model_label: Callable[[str], str] | None = None,
                 max_body_bytes: int = 64 * 1024 * 1024, max_concurrent: int = 1000,
                 body_timeout_s: float = BODY_TIMEOUT_S, receive_budget_bytes: int | None = None) -> None:
        self.servicer = servicer
        self.registry = servicer.registry
        self.metrics = metrics
        self.gate = gate
        self.auth = auth  # counts and logs refusals, as for gRPC
        self._expected = hashlib.sha256(token.encode()).digest() if token is not None else None
        self.model_label = model_label or (lambda name: "")
        self.max_body_bytes = int(max_body_bytes)
        self.max_concurrent = int(max_concurrent)
        self.body_timeout_s = float(body_timeout_s)
        self.receive_budget_bytes = int(RECEIVE_BUDGET_BODIES * self.max_body_bytes if receive_budget_bytes is None
                                        else receive_budget_bytes)
        self.receiving_bytes = 0  # bytes of the bodies being received (their requests not yet admitted)
        self.inflight = 0
        self.port = 0
        self._runner: web.AppRunner | None = None
        self.app = self._build_app()

    # ------------------------------------------------------------------ routes
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._json_errors])
        r = app.router
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        r.add_get("/v2/health/live", self._live)
        r.add_get("/v2/health/ready", self._ready)
        r.add_get("/v2", self._server_metadata)
        r.add_get("/v2/models/stats", self._statistics)
        for base in (model, versioned):
            r.add_get(base, self._model_metadata)
            r.add_get(base + "/ready", self._model_ready)
            r.add_get(base + "/config", self._model_config)
            r.add_post(base + "/infer", self._infer)
            r.add_get(base + "/stats", self._statistics)
            r.add_route("*", base + "/trace/setting", self._trace)
        r.add_post("/v2/repository/index", self._repository_index)
        r.add_post("/v2/repository/models/{model}/load", self._repository_load)
        r.add_post("/v2/repository/models/{model}/unload", self._repository_unload)
        r.add_get("/v2/logging", self._logging)
        r.add_post("/v2/logging", self._logging)
        r.add_route("*", "/v2/trace/setting", self._trace)
        for kind in ("systemsharedmemory", "cudasharedmemory"):
            for region in ("", "/region/{region}"):
                r.add_get(f"/v2/{kind}{region}/status", self._shm_status)
                r.add_post(f"/v2/{kind}{region}/unregister", self._shm_unregister)
            r.add_post(f"/v2/{kind}/region/{{region}}/register", self._shm_register)
        return app

    @web.middleware
    async def _json_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """aiohttp's own refusals (no such path 404, another method 405) as ``{"error": ...}``; anything that
        escaped a handler as 500 with an incident id (logged with its traceback)."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = {404: f"no such endpoint: {request.path[:200]} (KServe v2: /v2, /v2/health/..., "
                            "/v2/models/<model>[/versions/<version>][/ready|/config|/infer|/stats], "
                            "/v2/repository/..., /v2/logging)",
                       405: f"{request.method} is not allowed on {request.path[:200]}"}.get(exc.status, exc.reason)
            code = grpc.StatusCode.NOT_FOUND if exc.status == 404 else grpc.StatusCode.UNIMPLEMENTED
            return _error_response(exc.status, code, message, headers=exc.headers if exc.status == 405 else None)
        except Exception as exc:
            code, message = error_status(exc, f"HTTP {request.method} {request.path[:200]}")
            return _error_response(HTTP_STATUS.get(code, 500), code, message)

    # ------------------------------------------------------------------ the common path
    def _authorized(self, request: web.Request) -> bool:
        if self._expected is None:
            return True
        given = bearer_token(request.headers.get("Authorization", ""))
        ok = hmac.compare_digest(hashlib.sha256(given or b"").digest(), self._expected) and bool(given)
        del given  # never logged nor kept
        return ok

    async def _serve(self, request: web.Request, method: str, work: Callable[[], Awaitable[web.StreamResponse]], *,
                     model: str = "", open_: bool = False, gated: bool = True, body: bool = False
                     ) -> web.StreamResponse:
        """Admit, run ``work`` and answer: the token (unless ``open_``), the request's body when ``body`` (received
        before the request counts toward the cap, within the byte budget: :meth:`_receive`), the cap on requests at
        once and the drain gate (when ``gated``), the error mapping and the count in gnnserve_requests_total."""
        code = grpc.StatusCode.OK
        admitted = counted_inflight = counted = False
        try:
            if not open_ and not self._authorized(request):
                code = grpc.StatusCode.UNAUTHENTICATED
                if self.auth is not None:  # counts it (model "") and logs it, rate-limited, as for gRPC
                    self.auth.refused(method, f"HTTP {request.remote or 'an unknown peer'}")
                    counted = True
                model = ""  # a client's name, unauthenticated: no series of its own
                return _error_response(401, code, "missing or invalid bearer token",
                                       headers={"WWW-Authenticate": "Bearer"})
            if body:
                if gated and self.gate is not None and not self.gate.open:
                    self.gate.enter(method)  # draining: 503 at once, the body unread
                # the whole body first, as gRPC calls a handler once its message has arrived: a client that is
                # slow to send it holds no slot (only the bytes it sent, held to the budget, and its connection)
                request[_BODY] = await self._receive(request)
            if gated:
                if self.inflight >= self.max_concurrent:
                    raise _Refusal(429, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"{self.max_concurrent} HTTP requests are running (--max-concurrent-rpcs); retry "
                                   "with backoff")
                self.inflight += 1
                counted_inflight = True
                if self.gate is not None:
                    self.gate.enter(method)
                    admitted = True
            return await work()
        except _Refusal as exc:
            code = exc.code
            # a client that hung up is no incident, nor news (it reads no answer)
            log.log(logging.DEBUG if code == grpc.StatusCode.CANCELLED else logging.INFO, "%s -> %s: %s", method,
                    code.name, bounded(exc.message))
            return _error_response(exc.status, exc.code, exc.message)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code, message = error_status(exc, method)
            detached(exc)
            return _error_response(HTTP_STATUS.get(code, 500), code, message)
        finally:
            if admitted:
                self.gate.leave()  # type: ignore[union-attr]
            if counted_inflight:
                self.inflight -= 1
            if self.metrics is not None and not counted:
                self.metrics.count_request(self.model_label(model), method, code.name)

    async def _body(self, request: web.Request) -> bytes | bytearray:
        """The request's body: the one :meth:`_serve` received (``body=True``), else received now."""
        data = request.pop(_BODY, None)
        return await self._receive(request) if data is None else data

    async def _receive(self, request: web.Request) -> bytes | bytearray:
        """The request's body, within :attr:`max_body_bytes` (413), :attr:`body_timeout_s` (408) and the budget of
        bytes being received (:attr:`receive_budget_bytes`, 429; module docstring); a client that hangs up
        before it is whole: CANCELLED (499, logged at DEBUG)."""
        declared = request.content_length
        if declared is not None and declared > self.max_body_bytes:
            raise _Refusal(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the body ({declared} bytes) is larger than the limit of "
                           f"{self.max_body_bytes} bytes per request; split the request")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in _WBITS:
            raise _Refusal(415, grpc.StatusCode.INVALID_ARGUMENT,
                           f"Content-Encoding {encoding[:32]!r} is not supported: send gzip, deflate or identity")
        if not request.body_exists:
            return b""
        if self.receiving_bytes + (declared or 1) > self.receive_budget_bytes:  # refused at once, unread
            raise self._over_budget(declared)
        data = bytearray()
        held = 0  # this body's bytes counted in receiving_bytes

        async def receive() -> None:
            nonlocal held
            while chunk := await request.content.readany():
                if len(data) + len(chunk) > self.max_body_bytes:
                    raise self._too_large()
                if self.receiving_bytes + len(chunk) > self.receive_budget_bytes:
                    raise self._over_budget(declared)
                self.receiving_bytes += len(chunk)
                held += len(chunk)
                data.extend(chunk)

        try:
            await asyncio.wait_for(receive(), self.body_timeout_s)
        except asyncio.TimeoutError:
            raise _Refusal(408, grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"the body did not arrive within {self.body_timeout_s:g} s") from None
        except (ConnectionError, ContentLengthError) as exc:  # aiohttp's "Connection lost": the client hung up
            raise _Refusal(499, grpc.StatusCode.CANCELLED, f"the client closed the connection after {len(data)} "
                           f"bytes of the body ({exc.__class__.__name__})") from None
        finally:
            self.receiving_bytes -= held
        if _WBITS[encoding] is None:
            return data
        # decompressed here, never past the limit (aiohttp's own decompression is off: a 1 MB gzip body of zeros
        # cost it half a gigabyte before its size limit refused it); zlib works without the GIL, off the loop
        return await asyncio.to_thread(self._inflate, data, int(_WBITS[encoding] or 0), encoding)

    def _over_budget(self, declared: int | None) -> _Refusal:
        size = "of unknown length" if declared is None else f"of {declared} bytes"
        return _Refusal(429, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the server is receiving {self.receiving_bytes} bytes of request bodies, and a body {size} "
                        f"would pass its budget of {self.receive_budget_bytes} bytes for bodies in transit; retry "
                        "with backoff")

    def _too_large(self) -> _Refusal:
        return _Refusal(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the body is larger than the limit of {self.max_body_bytes} bytes per request; split the "
                        "request")

    def _inflate(self, data: bytes | bytearray, wbits: int, encoding: str) -> bytes:
        d = zlib.decompressobj(wbits)
        out = bytearray()
        try:
            pending = data
            while pending:
                out += d.decompress(pending, self.max_body_bytes + 1 - len(out))
                if len(out) > self.max_body_bytes:
                    raise self._too_large()
                pending = d.unconsumed_tail
            out += d.flush()
        except zlib.error as exc:
            raise InvalidArgument(f"the body is not valid {encoding} data ({exc})") from None
        if not d.eof or len(out) > self.max_body_bytes:
            raise self._too_large() if len(out) > self.max_body_bytes else InvalidArgument(
                f"the body's {encoding} data is truncated")
        return bytes(out)

    @staticmethod
    def _parse(data: bytes | bytearray | memoryview, what: str = "the body") -> Any:
        try:
            return json.loads(bytes(data))
        except RecursionError:
            raise InvalidArgument(f"{what} is nested too deeply to be a KServe request") from None
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise InvalidArgument(f"{what} is not valid JSON: {str(exc)[:200]}") from None

    async def _json_body(self, request: web.Request, *, optional: bool = True) -> dict[str, Any]:
        data = await self._body(request)
        if not data.strip() and optional:
            return {}
        return _object(self._parse(data), "the body")

    # ------------------------------------------------------------------ health and metadata
    async def _live(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            live = (await self.servicer.ServerLive(pb.ServerLiveRequest(), _CONTEXT)).live
            return _empty(200 if live else 400)

        return await self._serve(request, "http_live", work, open_=True, gated=False)

    async def _ready(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            ready = (await self.servicer.ServerReady(pb.ServerReadyRequest(), _CONTEXT)).ready
            return _empty(200 if ready and (self.gate is None or self.gate.open) else 400)

        return await self._serve(request, "http_ready", work, open_=True, gated=False)

    async def _model_ready(self, request: web.Request) -> web.StreamResponse:
        name, version = _model_of(request)

        async def work() -> web.StreamResponse:
            ready = (await self.servicer.ModelReady(pb.ModelReadyRequest(name=name, version=version), _CONTEXT)).ready
            return _empty(200 if ready and (self.gate is None or self.gate.open) else 400)

        # a probe, as health ready (not capped, answered while draining: then 400, KServe's false), with the token
        return await self._serve(request, "http_model_ready", work, model=name, gated=False)

    async def _server_metadata(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            m = await self.servicer.ServerMetadata(pb.ServerMetadataRequest(), _CONTEXT)
            return _json({"name": m.name, "version": m.version, "extensions": [*m.extensions, BINARY_EXTENSION]})

        return await self._serve(request, "http_server_metadata", work)

    async def _model_metadata(self, request: web.Request) -> web.StreamResponse:
        name, version = _model_of(request)

        async def work() -> web.StreamResponse:
            m = await self.servicer.ModelMetadata(pb.ModelMetadataRequest(name=name, version=version), _CONTEXT)
            return _json({"name": m.name, "versions": list(m.versions), "platform": m.platform,
                          "inputs": [_tensor_metadata(t) for t in m.inputs],
                          "outputs": [_tensor_metadata(t) for t in m.outputs]})

        return await self._serve(request, "http_model_metadata", work, model=name)

    async def _model_config(self, request: web.Request) -> web.StreamResponse:
        name, version = _model_of(request)

        async def work() -> web.StreamResponse:
            c = await self.servicer.ModelConfig(pb.ModelConfigRequest(name=name, version=version), _CONTEXT)
            return _json(_int64_numbers(c.config.DESCRIPTOR, json_format.MessageToDict(
                c.config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)))

        return await self._serve(request, "http_model_config", work, model=name)

    async def _statistics(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("model", "")
        version = request.match_info.get("version", "")

        async def work() -> web.StreamResponse:
            s = await self.servicer.ModelStatistics(pb.ModelStatisticsRequest(name=name, version=version), _CONTEXT)
            return _json(_message_dict(s))

        return await self._serve(request, "http_statistics", work, model=name)

    # ------------------------------------------------------------------ inference
    async def _infer(self, request: web.Request) -> web.StreamResponse:
        name, version = _model_of(request)

        async def work() -> web.StreamResponse:
            data = await self._body(request)
            header = request.headers.get(HEADER_LENGTH)
            if header is None:
                head_len = len(data)
            else:
                text = header.strip().lstrip("0") or "0"
                if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > len(data):
                    raise InvalidArgument(f"{HEADER_LENGTH} must be the length in bytes of the JSON part of the "
                                          f"body, at most the body's {len(data)} bytes; got {header[:32]!r}")
                head_len = int(text)
            view = memoryview(data)
            rt = self.registry.get(name, version)  # NOT_FOUND / UNAVAILABLE as gRPC answers them
            lim = rt.limits
            cap = json_value_cap(lim.num_features, lim.max_nodes_per_request, lim.max_new_node_edges)
            separators = data.count(b",", 0, head_len)
            if separators > cap:
                raise InvalidArgument(f"the request's JSON holds more values ({separators} separators) than a request to "
                                      f"{rt.name} can (at most about {cap}: {lim.max_nodes_per_request} nodes, "
                                      f"{lim.num_features} features each, {lim.max_new_node_edges} new-node edges); "
                                      "split it")
            body = _object(self._parse(view[:head_len], "the JSON header" if header is not None else "the body"),
                           "the inference request")
            req, binary_out, binary_default = infer_request(body, name, version, view[head_len:])
            del body, data, view
            resp = await self.servicer._infer(req, None)
            head, tail = infer_response(resp, binary_out, binary_default)
            out = web.Response(body=head + tail, status=200)
            if any(binary_out.get(o.name, binary_default) for o in resp.outputs):
                out.headers[HEADER_LENGTH] = str(len(head))
                out.content_type = "application/octet-stream"
            else:
                out.content_type = "application/json"
            out.headers[STATUS_HEADER] = "OK"
            if request.headers.get("Accept-Encoding"):
                out.enable_compression()
            return out

        return await self._serve(request, "http_infer", work, model=name, body=True)

    # ------------------------------------------------------------------ repository
    async def _repository_index(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            body = await self._json_body(request)
            unknown = sorted(set(body) - {"ready", "repository_name"})
            if unknown:
                raise InvalidArgument(f"unknown keys {[u[:64] for u in unknown[:8]]}; the index takes ready (a bool)")
            ready = body.get("ready", False)
            repo = body.get("repository_name", "")
            if not isinstance(ready, bool) or not isinstance(repo, str):
                raise InvalidArgument("ready must be a bool and repository_name a string")
            idx = await self.servicer.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready, repository_name=repo),
                                                      _CONTEXT)
            return _json([{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
                          for m in idx.models])

        return await self._serve(request, "http_repository_index", work, body=True)

    async def _repository_change(self, request: web.Request, load: bool) -> web.StreamResponse:
        name = request.match_info["model"]

        async def work() -> web.StreamResponse:
            body = await self._json_body(request)
            unknown = sorted(set(body) - {"parameters"})
            if unknown:
                raise InvalidArgument(f"unknown keys {[u[:64] for u in unknown[:8]]}; the body takes parameters")
            req: Any = (pb.RepositoryModelLoadRequest if load else pb.RepositoryModelUnloadRequest)(model_name=name)
            for key, value in _object(body.get("parameters", {}), "parameters").items():
                p = req.parameters[key]
                if isinstance(value, bool):
                    p.bool_param = value
                elif _is_int(value) and _INT64_MIN <= value <= _INT64_MAX:
                    p.int64_param = value
                elif isinstance(value, str):
                    p.string_param = value
                else:
                    raise InvalidArgument(f"parameter {key[:64]} must be a bool, an integer or a string, got "
                                          f"{_json_type(value)}")
            if load:
                await self.servicer.RepositoryModelLoad(req, _CONTEXT)
            else:
                await self.servicer.RepositoryModelUnload(req, _CONTEXT)
            return _empty(200)

        return await self._serve(request, "http_repository_load" if load else "http_repository_unload", work,
                                 model=name, body=True)

    async def _repository_load(self, request: web.Request) -> web.StreamResponse:
        return await self._repository_change(request, True)

    async def _repository_unload(self, request: web.Request) -> web.StreamResponse:
        return await self._repository_change(request, False)

    # ------------------------------------------------------------------ settings
    async def _logging(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            req = pb.LogSettingsRequest()
            if request.method == "POST":
                for key, value in (await self._json_body(request, optional=False)).items():
                    sv = req.settings[key]
                    if isinstance(value, bool):
                        sv.bool_param = value
                    elif _is_int(value):
                        if not 0 <= value < 2**32:
                            raise InvalidArgument(f"log setting {key[:64]} must be from 0 to {2**32 - 1}, got "
                                                  f"{str(value)[:32]}")
                        sv.uint32_param = value
                    elif isinstance(value, str):
                        sv.string_param = value
                    else:
                        raise InvalidArgument(f"log setting {key[:64]} must be a bool, an integer or a string, got "
                                              f"{_json_type(value)}")
            resp = await self.servicer.LogSettings(req, _CONTEXT)
            return _json({k: _parameter_value(v) for k, v in resp.settings.items()})

        return await self._serve(request, "http_logging", work, body=request.method == "POST")

    async def _trace(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            return await self.servicer.TraceSetting(pb.TraceSettingRequest(), _CONTEXT)  # UNIMPLEMENTED

        return await self._serve(request, "http_trace", work, model=request.match_info.get("model", ""))

    async def _shm_status(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            return _json([])  # no region can be registered (serve.triton)

        return await self._serve(request, "http_shared_memory", work)

    async def _shm_unregister(self, request: web.Request) -> web.StreamResponse:
        async def work() -> web.StreamResponse:
            return _empty(200)  # nothing registered: nothing to do, as Triton and the gRPC service answer

        return await self._serve(request, "http_shared_memory", work)

    async def _shm_register(self, request: web.Request) -> web.StreamResponse:
        kind = "CUDA" if request.path.startswith("/v2/cuda") else "system"

        async def work() -> web.StreamResponse:
            return await self.servicer._no_shared_memory(kind)

        return await self._serve(request, "http_shared_memory", work)

    # ------------------------------------------------------------------ lifecycle
    async def start(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                    reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (0: a free port, the same on every address ``host`` resolves to); the port."""
        try:
            sockets = _listen(host, port, reuse_port)
        except OSError as exc:  # named as the HTTP port's (the filename: not the metrics endpoint's bind error)
            raise OSError(exc.errno, f"cannot listen on {host}:{port} (--http-port, HTTP/REST): "
                                     f"{exc.strerror or exc}", f"{host}:{port}") from None
        # handler_cancellation off (aiohttp's default): a request whose client went away still finishes, as a
        # batch it joined is shared; keep-alive bounded; no access log (the metrics count every request)
        runner = web.AppRunner(self.app, handle_signals=False, access_log=None, keepalive_timeout=75.0,
                               shutdown_timeout=0.5, auto_decompress=False)
        await runner.setup()
        self._runner = runner
        try:
            for sock in sockets:
                await web.SockSite(runner, sock, ssl_context=ssl_context).start()
        except BaseException:
            for sock in sockets:
                sock.close()
            await runner.cleanup()
            self._runner = None
            raise
        self.port = sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Close the listener and the connections (in-flight requests were waited for by the drain gate)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


def _listen(host: str, port: int, reuse_port: bool) -> list[socket.socket]:
    """Bound, listening sockets for every address of ``host`` (``[::]`` style brackets allowed; ``::`` alone takes
    IPv4 too, as gRPC's does), each with ``SO_REUSEPORT`` when ``reuse_port`` (``--processes``)."""
    bind_host = host.strip("[]") or None
    infos, seen = [], set()
    for info in socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        if (info[0], info[4][0]) not in seen:
            seen.add((info[0], info[4][0]))
            infos.append(info)
    out: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6 and len(infos) > 1:  # beside an IPv4 socket; alone ("::"), dual-stack
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(out) > 1:  # the port the first address got
                addr = (addr[0], out[0].getsockname()[1], *addr[2:])
            sock.bind(addr)
            sock.listen(1024)
            sock.setblocking(False)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


def _model_of(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


def _json(value: Any) -> web.Response:
    return web.Response(body=json.dumps(value, separators=(",", ":")).encode(), content_type="application/json",
                        headers={STATUS_HEADER: "OK"})


def _empty(status: int) -> web.Response:
    return web.Response(status=status, headers={STATUS_HEADER: "OK"})


def _error_response(status: int, code: grpc.StatusCode, message: str,
                    headers: Any | None = None) -> web.Response:
    out = web.Response(status=status, body=json.dumps({"error": bounded(message)}).encode(),
                       content_type="application/json")
    if headers:
        for key, value in headers.items():
            if key.lower() not in ("content-type", "content-length"):
                out.headers[key] = value
    out.headers[STATUS_HEADER] = code.name
    return out
