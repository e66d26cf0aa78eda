"""KServe v2 / Triton ``inference.GRPCInferenceService`` on top of the same models and pipeline.

Tensor mapping (so ``tritonclient.grpc.InferenceServerClient`` works unchanged):

* inputs, all optional (at least one node in all), each at most once:

  - ``NODE_IDS``: INT64, shape ``[n]`` (or ``[n, 1]``): nodes of the graph;
  - ``NEW_NODE_FEATURES``: FP32 ``[m, F]`` (F = the model's features per node): new nodes, not in the graph,
    classified with the graph unchanged, as native ``Predict``'s ``new_nodes``;
  - ``NEW_NODE_NEIGHBOR_COUNTS``: INT64 ``[m]`` (or ``[m, 1]``): how many of ``NEW_NODE_NEIGHBORS`` belong to
    each new node, in order (each >= 0, adding up to its length);
  - ``NEW_NODE_NEIGHBORS``: INT64 ``[e]`` (or ``[1, e]``, a batch dimension first): the new nodes' neighbours
    (existing node ids), flattened;
  - ``NEW_NODE_EDGE_WEIGHTS``: FP32 ``[e]`` (or ``[1, e]``), optional: one weight per neighbour (default 1).

  Counts and neighbours come together, and need features; weights need neighbours. Features without counts
  and neighbours are new nodes without edges (classified from their own features). Each input's values are
  raw little-endian or in the ``contents`` field of its datatype (``int64_contents`` / ``fp32_contents``),
  not both: ``raw_input_contents`` is empty or holds one entry per input, in the order of ``inputs`` (any
  other number of entries is INVALID_ARGUMENT), and an input sent raw must have empty ``contents``
  (INVALID_ARGUMENT naming the input, as Triton refuses it). Unknown or repeated input names, another
  datatype or shape, counts that do not add up and lengths that disagree are INVALID_ARGUMENT naming the
  input, before any model work; the values (ids in range, finite features, weights >= 0, the limits) are
  checked by the native ``Predict``'s :func:`serve.validation.validate_predict` on the request built from
  them. :func:`serve.wire.check_infer` counts each input against its own limit on the request's bytes
  (ids and counts: nodes per request; neighbours and weights: new-node edges per request);
* outputs: one row per ``NODE_IDS`` entry, then one per new node (as native ``Predict``): ``LABELS``
  (INT64 ``[n]``), ``PROBABILITIES`` (FP32 ``[n, C]``), ``EMBEDDINGS``
  (FP32 ``[n, H]``); ``LABELS`` and ``PROBABILITIES`` when the request names none. A request that
  names an output twice, names one the model does not have, or names more outputs than there are is
  refused with INVALID_ARGUMENT before any work (each named output is built once per request: a
  repeated name would multiply the response's size);
* request parameters ``sampling_width``, ``ppr_budget`` (integers) and ``max_accuracy_loss``
  (number) are the knobs (an integer parameter is an ``int64_param`` / ``uint64_param``, an integral
  ``double_param`` or a ``string_param`` of ASCII digits with an optional leading ``-``, nothing else:
  :func:`_int_param`); a value outside what the model accepts is refused with that range
  (:func:`serve.validation.knob_rule`: ``sampling_width`` >= 0, ``ppr_budget`` >= 1 on a shaDow
  model and >= 0 on a plain one, which has no budget: 0 or absent means none; both at most
  2**31 - 1, the fields' width); ``min_graph_version`` is a graph version (>= 0); Triton's own
  ``priority`` (>= 0, accepted and ignored: one priority level), ``timeout`` (microseconds, 0 = none:
  the request fails if still queued when it expires, as with a gRPC deadline) and
  ``triton_enable_empty_final_response`` (a bool_param, as Triton requires; tritonclient's streams and
  perf_analyzer send it; nothing to do: each request gets one response, final) are taken too. The response
  parameters report the settings used (as native ``Predict``'s ``settings``: ``sampling_width``, ``ppr_budget``,
  ``strategy``, ``extractor``, ``chosen_by``, ``expected_accuracy``, ``edges_kept``, ``edges_total``), the timing
  (``total_ms``), ``graph_version`` and ``data_version`` (the data the answer was computed from, as native
  ``Predict``'s; a model whose store saw its pinned data version replaced answers DATA_LOSS, as there).

Triton's extensions of the service, and what gnnserve does with each:

* ``ModelStreamInfer``: a bidirectional stream of ``ModelInferRequest``; every request is answered
  on the stream, in the order sent, with the same validation and knobs as ``ModelInfer``. A request
  that fails gets a response with ``error_message`` (its status code's name and the message) and the
  stream goes on. Up to :data:`STREAM_WINDOW` requests of one stream run at once (they batch
  together); answers still leave in order. Each response, answer or error, carries the response parameter
  ``triton_final_response`` = true, as Triton's do (a stream client waits for it to know a request is done).
* ``ModelConfig``: a Triton model configuration (platform and backend ``gnnserve``, every version
  served, ``max_batch_size`` = the node limit per request, the inputs, each ``optional``: ``NODE_IDS`` and
  ``NEW_NODE_NEIGHBOR_COUNTS`` dims ``[1]`` reshaped to a scalar per node, ``NEW_NODE_FEATURES`` ``[F]``,
  ``NEW_NODE_NEIGHBORS`` and ``NEW_NODE_EDGE_WEIGHTS`` ``[-1]`` with ``allow_ragged_batch`` (their length is the
  request's edge count, not its node count); the outputs with their dims, the batcher's queue delay, and ``parameters`` with
  the knobs and their ranges as JSON strings, plus the architecture and the knob table). A knob's
  ``min`` is the lowest value a request may send and ``max`` the largest one served (a larger value
  runs at it); a plain model's ``ppr_budget`` is ``{"min": 0, "max": 0, "default": 0}``, and 0 is
  accepted. ``ModelMetadata.platform`` is the same ``gnnserve`` (the architecture is the config's
  ``architecture`` parameter); ``ModelMetadata`` gives each input's shape as Triton does for a batching model:
  ``-1`` (the batch), then its ``dims`` (``NODE_IDS`` ``[-1, 1]``, ``NEW_NODE_NEIGHBORS`` ``[-1, -1]``), the
  shapes perf_analyzer sends (it cannot build an input whose shape per node is empty).
* ``ModelStatistics``: :mod:`serve.stats` (native ``Predict`` and KServe requests alike). Under
  ``--processes N`` (N > 1) they are the counts of the one process the connection reached (each serves its
  own connections), so two calls may come from different processes and go backwards; the metrics port
  merges every process (``nv_inference_*``) and is the place for totals. A ``ModelInfer`` / stream request
  counts in ``inference_stats.fail`` (with its duration) once the model's queue took it, as a native ``Predict``
  does: a full queue, a passed deadline, a cancellation or a failed batch. A request refused before that (an
  unknown output, a bad input tensor, an unknown model, and also a refused parameter, node id or new node's value,
  or a graph version not reached, which Triton would count as its backend's failures) counts nowhere, on every
  path alike, so that a failure-rate alert sees requests the model took and could not answer;
  ``gnnserve_requests_total{code}`` counts every refusal.
* ``RepositoryIndex`` / ``RepositoryModelLoad`` / ``RepositoryModelUnload``: the model repository
  through :class:`serve.registry.ModelRegistry` (its docstring has the unload rule: an unloaded
  model stays unloaded, whatever the poller sees, until it is loaded again). Parameters: ``version``
  (gnnserve's own: one version instead of the whole model; a positive integer, a string of ASCII digits of
  any length: one that names no version is NOT_FOUND) and ``unload_dependents`` (accepted;
  gnnserve models have no dependents); ``config`` overrides and uploaded ``file:`` contents are not
  supported (UNIMPLEMENTED). Under ``gnnserve serve --processes N`` (N > 1) load and unload answer
  FAILED_PRECONDITION: a connection reaches one process, and each holds its own models, so they would
  act on that process alone; the message says how to load and unload there (change the repository
  directory, which every process polls).
* ``LogSettings``: ``log_info``, ``log_warning``, ``log_error``, ``log_verbose_level`` set the level of
  the server's loggers (``serve``, ``kernels``, ``models``): DEBUG when the verbose level is above 0,
  else the lowest enabled of INFO, WARNING, ERROR, else nothing. Python's levels are thresholds, so a
  setting that enables a level while disabling a more severe one is refused, as are other settings
  and values (INVALID_ARGUMENT); ``log_file`` is ``""`` (stderr) and ``log_format`` ``default``. Under
  ``--processes N`` (N > 1) a change answers FAILED_PRECONDITION, as load and unload do (it would set the
  loggers of the one process the connection reached): set ``--log-level`` at start; reading is answered.
* ``TraceSetting`` and registering a system or CUDA shared-memory region: UNIMPLEMENTED, with a message naming
  what is supported. The shared-memory status answers no regions and unregistering (one region or all) succeeds
  with nothing to do, as Triton answers with none registered: Triton's example scripts and tools unregister
  every region before they start (a Triton user's report: they stopped there). ``ServerMetadata.extensions``
  lists exactly the extensions served (:data:`EXTENSIONS`; not the shared-memory ones).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from grpc import aio

from clients._gen import gnnserve_pb2 as gpb
from clients._gen import inference_pb2 as pb
from clients._gen import inference_pb2_grpc as pb_grpc

from .errors import GnnServeError, InvalidArgument, ModelNotFound, Unavailable
from .interceptors import bounded, error_status, unparsed_reason
from .registry import RepositoryError, _shown, version_not_in_repository
from .servicer import deadline_of, reach_version
from .validation import MAX_REQUEST_ID, knob_range_error, knob_rule, validate_predict
from .wire import INPUT, NEW_COUNTS, NEW_FEATURES, NEW_NEIGHBORS, NEW_WEIGHTS  # the input names

if TYPE_CHECKING:
    from .interceptors import DrainGate
    from .registry import ModelRegistry
    from .runtime import ModelRuntime
    from .validation import ModelLimits

__all__ = ["EXTENSIONS", "TritonServicer", "Unimplemented"]

log = logging.getLogger(__name__)

SERVER_NAME = "gnnserve"
SERVER_VERSION = "0.1.0"
PLATFORM = "gnnserve"
OUTPUTS = ("LABELS", "PROBABILITIES", "EMBEDDINGS")
DEFAULT_OUTPUTS = ("LABELS", "PROBABILITIES")
KNOBS = ("sampling_width", "ppr_budget", "max_accuracy_loss")
#: the one ``triton_`` request parameter Triton takes (a bool_param: tritonclient's
#: ``async_stream_infer(enable_empty_final_response=True)`` and perf_analyzer send it): accepted, with nothing to
#: do, as every model answers each request with one response, marked final (:data:`FINAL_RESPONSE`)
EMPTY_FINAL = "triton_enable_empty_final_response"
#: Triton's own request parameters: ``priority`` (accepted; the batcher has one priority level, as a Triton
#: model without ``priority_levels``, which ignores it too), ``timeout`` (microseconds, 0 = none: a request
#: still queued when it expires fails, as with a gRPC deadline, whichever comes first) and :data:`EMPTY_FINAL`
TRITON_PARAMS = ("priority", "timeout", EMPTY_FINAL)
#: the response parameter Triton sets on each ModelStreamInfer response: true on a request's last response (here
#: its only one, answer or error), which clients of decoupled models wait for
FINAL_RESPONSE = "triton_final_response"
#: request parameters besides the knobs: read-your-writes on a live graph (serve.live), Triton's own
REQUEST_PARAMS = (*KNOBS, "min_graph_version", *TRITON_PARAMS)
#: a ``timeout`` above this many microseconds (a year) means none, as 0 does: clients send the largest
#: integer for "no timeout"
MAX_TIMEOUT_US = 365 * 86400 * 10**6
#: Triton's names of the protocol extensions this server implements (ServerMetadata.extensions)
EXTENSIONS = ("classification", "parameters", "model_repository", "model_configuration", "statistics", "logging")
#: the largest min_graph_version (PredictRequest's uint64 field)
MAX_GRAPH_VERSION = 2**64 - 1
#: requests of one ModelStreamInfer stream that run at once
STREAM_WINDOW = 64
#: the loggers LogSettings controls
LOGGERS = ("serve", "kernels", "models")

_SUPPORTED = (f"gnnserve implements {', '.join(EXTENSIONS)} and ModelStreamInfer besides the core protocol; "
              "send tensors in the request itself (raw_input_contents)")


class Unimplemented(GnnServeError):
    """A Triton extension gnnserve does not implement."""

    code = grpc.StatusCode.UNIMPLEMENTED


class FailedPrecondition(GnnServeError):
    """The repository holds the model, but it cannot be loaded, or the call cannot act in this server's
    configuration (a repository load or unload, or a log settings change, under ``--processes N``); the message
    says why."""

    code = grpc.StatusCode.FAILED_PRECONDITION


# ---------------------------------------------------------------------- request parsing
def _param_value(p: pb.InferParameter) -> float | int | str | bool:
    which = p.WhichOneof("parameter_choice")
    if which is None:
        raise InvalidArgument("empty request parameter")
    return getattr(p, which)


#: an integer request parameter sent as a string: ASCII digits, a minus sign allowed in front (the range checks
#: then name the range, as for a negative ``int64_param``); no "+", spaces, underscores or other scripts' digits,
#: which Python's ``int()`` would take. The same rule as a model version's ASCII digits (serve.registry)
_INT_TEXT = re.compile(r"-?[0-9]+")
#: the integers a request parameter can hold: what its ``int64_param`` and ``uint64_param`` fields carry. A
#: string or double beyond is refused as such (``int()`` would spend time on thousands of digits, and refuses
#: more than 4300; a message would repeat them)
INT_PARAM_MIN, INT_PARAM_MAX = -(2**63), 2**64 - 1
_INT_RULE = "an integer: int64_param, uint64_param, an integral double_param or a string of ASCII digits"


def _shown_value(v: object) -> str:
    """A client-sent parameter value for a message: its repr, cut to 32 characters."""
    text = repr(v)
    return text if len(text) <= 34 else f"{text[:32]}... ({len(str(v))} characters)"


def _int_param(name: str, p: pb.InferParameter) -> int:
    """An integer request parameter: ``int64_param`` / ``uint64_param``, an integral ``double_param``, or a
    ``string_param`` of ASCII digits with an optional leading ``-`` (:data:`_INT_TEXT`), within
    [:data:`INT_PARAM_MIN`, :data:`INT_PARAM_MAX`]. Anything else is INVALID_ARGUMENT ``must be an integer``;
    the range of each parameter is the caller's to check (and to state: :func:`_knob_param`)."""
    v = _param_value(p)

    def out_of_range(shown: str) -> InvalidArgument:
        return InvalidArgument(f"parameter {name} must be an integer from {INT_PARAM_MIN} to {INT_PARAM_MAX}, "
                               f"got {shown}")

    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise InvalidArgument(f"parameter {name} must be {_INT_RULE}, got {_shown_value(v)}")
    if isinstance(v, int):  # the int64 and uint64 fields: within the range by their width
        return v
    if isinstance(v, float):
        if not v.is_integer():  # also NaN and infinities
            raise InvalidArgument(f"parameter {name} must be {_INT_RULE}, got {v!r}")
        if not INT_PARAM_MIN <= v <= INT_PARAM_MAX:
            raise out_of_range(repr(v))
        return int(v)
    if _INT_TEXT.fullmatch(v) is None:
        raise InvalidArgument(f"parameter {name} must be {_INT_RULE} (an optional '-' in front, nothing else), "
                              f"got {_shown_value(v)}")
    digits = v.lstrip("-").lstrip("0") or "0"  # int() counts leading zeros in its limit of 4300 digits
    if len(digits) > len(str(INT_PARAM_MAX)):  # out of range: refused before int() reads it
        raise out_of_range(_shown_value(v))
    n = -int(digits) if v.startswith("-") else int(digits)
    if not INT_PARAM_MIN <= n <= INT_PARAM_MAX:
        raise out_of_range(repr(v))
    return n


def _request_deadline(request: pb.ModelInferRequest, deadline: float | None) -> float | None:
    """The request's deadline (``time.monotonic``): its gRPC deadline, or its ``timeout`` parameter
    (microseconds from now, 0 = none) if that comes first."""
    if "timeout" not in request.parameters:
        return deadline
    us = _int_param("timeout", request.parameters["timeout"])
    if us < 0:
        raise InvalidArgument(f"parameter timeout must be >= 0 microseconds (0 = none), got {str(us)[:32]}")
    if us == 0 or us > MAX_TIMEOUT_US:
        return deadline
    mine = time.monotonic() + us / 1e6
    return mine if deadline is None else min(deadline, mine)


def _knob_param(name: str, p: pb.InferParameter, rt: ModelRuntime) -> int:
    """``sampling_width`` / ``ppr_budget``: an integer in the range the model accepts
    (:func:`serve.validation.knob_rule`, which the refusal states)."""
    v = _int_param(name, p)
    lo, hi, _ = knob_rule(rt.limits, name)
    if not lo <= v <= hi:
        raise InvalidArgument(f"parameter {knob_range_error(rt.limits, name, v).message}")
    return v


def _float_param(name: str, p: pb.InferParameter) -> float:
    """A number: ``double_param``, an integer field, or a ``string_param`` in Python's float syntax restricted to
    ASCII (as :func:`_int_param`: no spaces, underscores or other scripts' digits, which ``float()`` takes)."""
    v = _param_value(p)
    if isinstance(v, bool) or (isinstance(v, str) and (not v.isascii() or "_" in v or v != v.strip())):
        raise InvalidArgument(f"parameter {name} must be a number, got {_shown_value(v)}")
    try:
        return float(v)
    except ValueError:
        raise InvalidArgument(f"parameter {name} must be a number, got {_shown_value(v)}") from None


def requested_outputs(request: pb.ModelInferRequest) -> list[str]:
    """The outputs a request names, in its order (the default ones when it names none).

    Refuses, before anything is built, more names than the model has outputs, a name it does not
    have, and a name given twice: Triton refuses these too, and each name costs a copy of that output.
    """
    outs = request.outputs
    if not outs:
        return list(DEFAULT_OUTPUTS)
    if len(outs) > len(OUTPUTS):
        raise InvalidArgument(f"request asks for {len(outs)} outputs; this model has {len(OUTPUTS)}: "
                              f"{list(OUTPUTS)} (name each at most once)")
    wanted = [o.name for o in outs]
    unknown = sorted(set(wanted) - set(OUTPUTS))
    if unknown:
        raise InvalidArgument(f"unknown outputs {[u[:64] for u in unknown]}; this model has {list(OUTPUTS)}")
    if len(set(wanted)) < len(wanted):
        repeated = sorted({w for w in wanted if wanted.count(w) > 1})
        raise InvalidArgument(f"output {', '.join(repeated)} requested more than once; name each output at most once")
    for o in outs:
        for key in o.parameters:
            if key != "classification":
                _refuse_tensor_param("output", o.name, key)
            if o.name != "PROBABILITIES":
                raise InvalidArgument(f"output {o.name}: classification (class_count) applies to PROBABILITIES only")
    return wanted


def class_counts(request: pb.ModelInferRequest) -> dict[str, int]:
    """The outputs the classification extension asks for (``parameters["classification"]``, tritonclient's
    ``InferRequestedOutput(name, class_count=k)``): name -> k, after :func:`requested_outputs` checked them."""
    out = {}
    for o in request.outputs:
        if "classification" in o.parameters:
            p = o.parameters["classification"]
            k = p.int64_param if p.WhichOneof("parameter_choice") == "int64_param" else -1
            if k < 1:
                raise InvalidArgument(f"output {o.name}: classification must be a positive integer (int64_param)")
            out[o.name] = int(k)
    return out


def classification_bytes(probs: np.ndarray, k: int) -> bytes:
    """Triton's classification output of ``probs`` ``[n, C]``: the top ``min(k, C)`` classes of each row, most
    likely first (ties: the lower index), as ``"<probability>:<index>"`` strings, serialised as a BYTES tensor
    (each element a 4-byte little-endian length, then its bytes)."""
    k = min(k, probs.shape[1])
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    parts = []
    for row, idx in zip(probs, order, strict=True):
        for c in idx.tolist():
            s = f"{float(row[c]):f}:{c}".encode()
            parts.append(len(s).to_bytes(4, "little") + s)
    return b"".join(parts)


def _refuse_tensor_param(kind: str, name: str, key: str) -> None:
    if key.startswith("shared_memory"):
        raise InvalidArgument(f"{kind} {name[:64]}: shared memory is not supported by this server ({key}); "
                              + ("send the values in contents or raw_input_contents" if kind == "input"
                                 else "the output comes in raw_output_contents"))
    raise InvalidArgument(f"{kind} {name[:64]}: unknown parameter {key[:64]!r}"
                          + (" (outputs take classification only)" if kind == "output" else ""))


@dataclass(frozen=True)
class _InputSpec:
    """One input tensor: its datatype, the ``contents`` field of that type, the raw element type, and its
    shape rule (``"ids"``: ``[n]`` or ``[n, 1]``; ``"rows"``: ``[m, F]``; ``"flat"``: ``[e]`` or ``[1, e]``)."""

    datatype: str
    field: str
    dtype: str
    shape: str


#: the inputs ModelInfer takes (all optional; at least one node in all), in the order ModelConfig lists them
INPUT_SPECS = {
    INPUT: _InputSpec("INT64", "int64_contents", "<i8", "ids"),
    NEW_FEATURES: _InputSpec("FP32", "fp32_contents", "<f4", "rows"),
    NEW_COUNTS: _InputSpec("INT64", "int64_contents", "<i8", "ids"),
    NEW_NEIGHBORS: _InputSpec("INT64", "int64_contents", "<i8", "flat"),
    NEW_WEIGHTS: _InputSpec("FP32", "fp32_contents", "<f4", "flat"),
}
_SHAPE_TEXT = {"ids": "[n] or [n, 1]", "rows": "[m, F]", "flat": "[e] or [1, e]"}


def _tensor(request: pb.ModelInferRequest, index: int, spec: _InputSpec, max_elements: int,
            num_features: int) -> np.ndarray:
    """Input ``index``'s values, refusing what Triton refuses before a model sees a request: another
    datatype or shape, more elements than ``max_elements``, data that does not fit the shape, and
    ambiguous data (an input in ``raw_input_contents`` must have empty ``contents``; without raw data the
    values are in the ``contents`` field of its datatype, no other one). ``"rows"`` come back ``[m, F]``."""
    tensor = request.inputs[index]
    name = tensor.name
    for key in tensor.parameters:  # first: an input in shared memory has no values here at all
        _refuse_tensor_param("input", name, key)
    if tensor.datatype != spec.datatype:
        raise InvalidArgument(f"input {name} must be {spec.datatype}, got {tensor.datatype[:32] or 'no datatype'}")
    shape = list(tensor.shape)
    if spec.shape == "ids":
        ok = len(shape) in (1, 2) and (len(shape) == 1 or shape[1] == 1)
    elif spec.shape == "rows":
        ok = len(shape) == 2 and shape[1] == num_features
    else:  # [1, e]: a client that reads dims [-1] of a batching model sends a batch dimension first
        ok = len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)
    if not ok or any(d < 0 for d in shape):
        extra = f" with F = {num_features}, the model's features per node" if spec.shape == "rows" else ""
        raise InvalidArgument(f"input {name} must have shape {_SHAPE_TEXT[spec.shape]}{extra}, got {shape[:4]}")
    count = math.prod(shape)
    if count > max_elements:
        what = "nodes" if spec.shape == "ids" else "values"
        raise InvalidArgument(f"input {name} has {count} {what}, more than the limit of {max_elements} per request; "
                              "split it")
    given = [f.name for f, _ in tensor.contents.ListFields()]  # the non-empty contents fields
    if request.raw_input_contents:
        if given:
            raise InvalidArgument(f"input {name} has both contents ({', '.join(given)}) and raw_input_contents: "
                                  "send its values in one of them (an input with raw data must have empty contents)")
        raw = request.raw_input_contents[index]
        width = np.dtype(spec.dtype).itemsize
        if len(raw) != width * count:
            raise InvalidArgument(f"input {name}: {len(raw)} raw bytes for shape {shape} (need {width * count})")
        values = np.frombuffer(raw, dtype=spec.dtype).astype(spec.dtype[1:])
    else:
        other = [g for g in given if g != spec.field]
        if other:
            raise InvalidArgument(f"input {name} ({spec.datatype}) has its values in contents.{', contents.'.join(other)}; "
                                  f"{spec.datatype} values go in contents.{spec.field} (or raw_input_contents)")
        values = np.asarray(getattr(tensor.contents, spec.field), dtype=spec.dtype[1:])
        if len(values) != count:
            raise InvalidArgument(f"input {name}: {len(values)} values for shape {shape}")
    return values.reshape(-1, num_features) if spec.shape == "rows" else values


def _input_tensors(request: pb.ModelInferRequest, limits: ModelLimits) -> dict[str, np.ndarray]:
    """The request's input tensors by name (:data:`INPUT_SPECS`), each checked by :func:`_tensor`: unknown and
    repeated names, a ``raw_input_contents`` that is neither empty nor one entry per input (in the order of
    ``inputs``), and a request without inputs are refused, naming the inputs."""
    names = [i.name for i in request.inputs]
    if not names:
        raise InvalidArgument(f"request has no inputs: send {INPUT} (INT64, shape [n]) and/or {NEW_FEATURES} "
                              f"(FP32, shape [m, {limits.num_features}]) with its NEW_NODE_* inputs")
    unknown = [n[:64] for n in names if n not in INPUT_SPECS]
    if unknown:
        raise InvalidArgument(f"unknown inputs {unknown[:8]}; this model takes {list(INPUT_SPECS)} (all optional)")
    repeated = sorted(n for n, c in collections.Counter(names).items() if c > 1)  # linear: 70k names fit a request
    if repeated:
        raise InvalidArgument(f"input {', '.join(repeated)} given more than once; send each input at most once")
    raw_entries = len(request.raw_input_contents)
    if raw_entries and raw_entries != len(names):
        plural = "input" if len(names) == 1 else "inputs"
        raise InvalidArgument(f"request has {raw_entries} raw_input_contents entries for {len(names)} {plural} "
                              f"({', '.join(names)}): raw_input_contents holds one entry per input, in the order "
                              "of inputs (all inputs raw, or none)")
    caps = {INPUT: limits.max_nodes_per_request, NEW_COUNTS: limits.max_nodes_per_request,
            NEW_FEATURES: limits.max_nodes_per_request * limits.num_features,
            NEW_NEIGHBORS: limits.max_new_node_edges, NEW_WEIGHTS: limits.max_new_node_edges}
    return {name: _tensor(request, i, INPUT_SPECS[name], caps[name], limits.num_features)
            for i, name in enumerate(names)}


def _infer_inputs(request: pb.ModelInferRequest, limits: ModelLimits) -> tuple[np.ndarray, list[gpb.NewNode]]:
    """The request's node ids and new nodes (``NewNode`` messages for :func:`serve.validation.validate_predict`,
    which checks their values: ids in range, feature values, weights, neighbour limits), after the checks of
    the inputs' agreement: counts need features (one count per new node, each >= 0, adding up to the
    neighbours given), neighbours need counts, weights need neighbours (one weight per neighbour). Features
    without counts and neighbours are new nodes without edges. At least one node in all."""
    t = _input_tensors(request, limits)
    ids = t.get(INPUT, np.zeros(0, np.int64))
    feats = t.get(NEW_FEATURES)
    counts, nbrs, weights = t.get(NEW_COUNTS), t.get(NEW_NEIGHBORS), t.get(NEW_WEIGHTS)
    if feats is None:
        given = [n for n in (NEW_COUNTS, NEW_NEIGHBORS, NEW_WEIGHTS) if n in t]
        if given:
            raise InvalidArgument(f"input {given[0]} needs {NEW_FEATURES} (FP32, shape [m, {limits.num_features}]): "
                                  "new nodes are given by their features")
        feats = np.zeros((0, limits.num_features), np.float32)
    m = len(feats)
    if len(ids) + m == 0:
        raise InvalidArgument(f"request has no nodes: give at least one node id ({INPUT}) or a new node "
                              f"({NEW_FEATURES})")
    if len(ids) + m > limits.max_nodes_per_request:
        raise InvalidArgument(f"request has {len(ids) + m} nodes ({INPUT} and {NEW_FEATURES} rows), more than the "
                              f"limit of {limits.max_nodes_per_request} per request; split it")
    if (counts is None) != (nbrs is None):
        have, lack = (NEW_COUNTS, NEW_NEIGHBORS) if nbrs is None else (NEW_NEIGHBORS, NEW_COUNTS)
        raise InvalidArgument(f"input {have} needs {lack}: {NEW_COUNTS} says how many of {NEW_NEIGHBORS} belong "
                              "to each new node (leave both out for new nodes without edges)")
    if counts is None:
        if weights is not None:
            raise InvalidArgument(f"input {NEW_WEIGHTS} needs {NEW_NEIGHBORS} (one weight per neighbour)")
        counts = np.zeros(m, np.int64)
        nbrs = np.zeros(0, np.int64)
    if len(counts) != m:
        raise InvalidArgument(f"input {NEW_COUNTS} has {len(counts)} counts for {m} new nodes ({NEW_FEATURES} "
                              "rows): give one count per new node")
    if (counts < 0).any():
        i = int(np.flatnonzero(counts < 0)[0])
        raise InvalidArgument(f"input {NEW_COUNTS}[{i}] is {int(counts[i])}: a neighbour count must be >= 0")
    total = int(counts.sum()) if m else 0  # each count <= len(nbrs) <= the edge limit: no overflow below
    if (counts > len(nbrs)).any() or total != len(nbrs):
        raise InvalidArgument(f"input {NEW_COUNTS} adds up to {total if (counts <= len(nbrs)).all() else 'more'} "
                              f"neighbours, but {NEW_NEIGHBORS} has {len(nbrs)}: the counts split it, in order")
    if weights is not None and len(weights) != len(nbrs):
        raise InvalidArgument(f"input {NEW_WEIGHTS} has {len(weights)} weights for {len(nbrs)} neighbours "
                              f"({NEW_NEIGHBORS}): give one weight per neighbour, or leave it out")
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    new_nodes = []
    for i in range(m):
        a, b = bounds[i], bounds[i + 1]
        nn = gpb.NewNode(features=feats[i].tolist(), neighbors=nbrs[a:b].tolist())
        if weights is not None:
            nn.edge_weights.extend(weights[a:b].tolist())
        new_nodes.append(nn)
    return ids, new_nodes


def _repository_param(name: str, p: pb.ModelRepositoryParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    if which is None:
        raise InvalidArgument(f"repository parameter {name[:64]!r} has no value")
    return getattr(p, which)


#: the most digits (leading zeros aside) of a repository ``version`` parameter that can name a version: a version is
#: a directory name, at most 255 bytes on the usual file systems. A longer string of digits names none: NOT_FOUND, as
#: a 30-digit version is, without ``int()`` (which refuses more than 4300 digits with a ValueError: that was INTERNAL)
MAX_VERSION_DIGITS = 255


def _version_param(params: Any, model_name: str, rpc: str) -> int | None:
    """The ``version`` parameter of a repository load or unload: a positive integer (``int64_param`` /
    ``uint64_param``, or a string of ASCII digits, as a model version is everywhere: serve.registry), else
    INVALID_ARGUMENT; one of more digits than any version directory has is NOT_FOUND in the repository."""
    if "version" not in params:
        return None
    v = _repository_param("version", params["version"])
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and v.isascii() and v.isdigit())):
        raise InvalidArgument(f"parameter version must be a positive integer, got {str(v)[:32]!r}")
    if isinstance(v, str) and len(v.lstrip("0")) > MAX_VERSION_DIGITS:
        raise version_not_in_repository(model_name, _shown(v), loading=rpc == "RepositoryModelLoad")
    n = v if isinstance(v, int) else int(v.lstrip("0") or "0")  # int() counts leading zeros in its digit limit
    if n < 1:
        raise InvalidArgument(f"parameter version must be a positive integer, got {str(v)[:32]!r}")
    return n


def _check_repository(name: str, registry: ModelRegistry) -> None:
    if name not in ("", registry.repo.name):
        raise InvalidArgument(f"repository {name[:64]!r}: this server has one model repository "
                              f"({registry.repo.name!r}); leave repository_name empty")


_REPOSITORY_WAY = (
    "Change the model repository instead, which every process polls (--poll-s; with --poll-s 0, restart the "
    "server): to load, add REPO/<model>/<version>/ (gnnserve train --out writes it whole); to unload a version or a "
    "model, move its directory out of the repository or rename it to start with '.'")


def _refuse_under_processes(rpc: str, way: str = _REPOSITORY_WAY) -> None:
    """Under ``gnnserve serve --processes N`` (N > 1) a load or unload would change the one process this
    connection reached (each process holds its own models; the others would go on serving, or not, as
    before), so it is refused with the way that reaches every process (``way``): the repository directory; a
    change of the log settings likewise (each process has its own loggers), with ``--log-level``."""
    from . import servicer

    slot = servicer._SLOT  # (index, total) of a --processes child (serve.servicer.set_process_slot)
    if slot is None or slot[1] <= 1:
        return
    raise FailedPrecondition(
        f"{rpc} is not available under gnnserve serve --processes {slot[1]}: it would act on one process only "
        f"(this connection reached process {slot[0]} of {slot[1]}). {way}")


# ---------------------------------------------------------------------- model configuration
def _input_dims(spec: _InputSpec, num_features: int) -> list[int]:
    """An input's ``dims`` in the model configuration (per node, the batch dimension left out): an id or count is
    ``[1]`` (reshaped to a scalar), a new node's features ``[F]``, neighbours and weights ``[-1]`` (ragged)."""
    return [1] if spec.shape == "ids" else [num_features] if spec.shape == "rows" else [-1]


def model_config(rt: ModelRuntime) -> pb.ModelConfig:
    """Triton's view of one model version (see the module docstring)."""
    lim = rt.limits
    emb_dim = int(getattr(rt.model, "embedding_dim", -1))
    scalar = pb.ModelTensorReshape()  # dims [1] per node, sent as a [n] tensor
    cfg = pb.ModelConfig(
        name=rt.name,
        platform=PLATFORM,
        backend=PLATFORM,
        version_policy=pb.ModelVersionPolicy(all=pb.ModelVersionPolicy.All()),
        max_batch_size=lim.max_nodes_per_request,
        # per node: an id or count is a scalar, a new node's features [F]; neighbours and weights [-1], ragged (their
        # length is the request's edge count, not its node count: sent as [e] or [1, e])
        input=[
            pb.ModelInput(name=name, data_type=getattr(pb, f"TYPE_{spec.datatype}"), optional=True,
                          **({"dims": [1], "reshape": scalar} if spec.shape == "ids" else
                             {"dims": [lim.num_features]} if spec.shape == "rows" else
                             {"dims": [-1], "allow_ragged_batch": True}))
            for name, spec in INPUT_SPECS.items()
        ],
        output=[
            pb.ModelOutput(name="LABELS", data_type=pb.TYPE_INT64, dims=[1], reshape=scalar),
            pb.ModelOutput(name="PROBABILITIES", data_type=pb.TYPE_FP32, dims=[rt.num_classes]),
            pb.ModelOutput(name="EMBEDDINGS", data_type=pb.TYPE_FP32, dims=[emb_dim]),
        ],
        instance_group=[pb.ModelInstanceGroup(
            name=f"{rt.name}_0", count=1,
            kind=pb.ModelInstanceGroup.KIND_GPU if rt.device.type == "cuda" else pb.ModelInstanceGroup.KIND_CPU,
            gpus=[rt.device.index or 0] if rt.device.type == "cuda" else [],
        )],
        dynamic_batching=pb.ModelDynamicBatching(
            max_queue_delay_microseconds=max(0, round(rt.options.max_delay_ms * 1000))),
    )
    ppr = lim.extractor == "ppr"
    # min: the lowest value a request may send (serve.validation.knob_rule, which refuses below it);
    # max: the largest value served, a request above it runs at it
    params = {
        "sampling_width": {"type": "int", "min": knob_rule(lim, "sampling_width")[0], "max": lim.max_sampling_width,
                           "default": lim.default_sampling_width,
                           "doc": "edges kept per node in each aggregation; 0 = exact; larger values are clamped"},
        "ppr_budget": ({"type": "int", "min": knob_rule(lim, "ppr_budget")[0], "max": lim.max_ppr_budget,
                        "default": lim.default_ppr_budget,
                        "doc": "nodes in each target's PPR subgraph; larger values are clamped"} if ppr else
                       {"type": "int", "min": knob_rule(lim, "ppr_budget")[0], "max": 0, "default": 0,
                        "doc": "not used by this model (L-hop neighbourhoods, no PPR subgraph): 0 or absent; a "
                               "larger value is accepted and ignored, and the answer reports 0"}),
        "max_accuracy_loss": {"type": "float", "min": 0.0, "max": 1.0,
                              "doc": "the cheapest knob-table setting whose labels differ from the exact ones on at "
                                     "most this share of nodes (1 - agreement; tables without it: validation "
                                     "accuracy within this of exact); an explicit sampling_width or ppr_budget "
                                     "wins"},
    }
    for key, value in params.items():
        cfg.parameters[key].string_value = json.dumps(value)
    cfg.parameters["architecture"].string_value = rt.architecture
    cfg.parameters["extractor"].string_value = lim.extractor
    cfg.parameters["strategy"].string_value = rt.strategy
    cfg.parameters["num_nodes"].string_value = str(lim.num_nodes)
    cfg.parameters["num_classes"].string_value = str(rt.num_classes)
    cfg.parameters["knob_table"].string_value = json.dumps(
        [{"ppr_budget": r.ppr_budget, "sampling_width": r.sampling_width, "val_accuracy": r.val_accuracy,
          "latency_ms_per_node": r.latency_ms_per_node, **({} if r.agreement is None else {"agreement": r.agreement})}
         for r in lim.knob_table])
    return cfg


# ---------------------------------------------------------------------- statistics
def _duration(count_ns: tuple[int, int]) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=count_ns[0], ns=count_ns[1])


def model_statistics(rt: ModelRuntime) -> pb.ModelStatistics:
    s = rt.stats.snapshot()
    out = pb.ModelStatistics(
        name=rt.name, version=str(rt.version), last_inference=s.last_inference_ms,
        inference_count=s.inference_count, execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(s.success), fail=_duration(s.fail), queue=_duration(s.queue),
            compute_input=_duration(s.compute_input), compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output),
        ),
    )
    for size in sorted(s.batches):
        b = s.batches[size]
        out.batch_stats.add(
            batch_size=size, compute_input=pb.StatisticDuration(count=b.count, ns=b.compute_input_ns),
            compute_infer=pb.StatisticDuration(count=b.count, ns=b.compute_infer_ns),
            compute_output=pb.StatisticDuration(count=b.count, ns=b.compute_output_ns),
        )
    return out


# ---------------------------------------------------------------------- log settings
class LogState:
    """Triton's log settings over Python logging levels (see the module docstring)."""

    BOOLS = ("log_info", "log_warning", "log_error")

    def __init__(self, loggers: tuple[str, ...] = LOGGERS) -> None:
        self.loggers = [logging.getLogger(n) for n in loggers]
        level = self.loggers[0].getEffectiveLevel()
        self.values: dict[str, Any] = {
            "log_info": level <= logging.INFO, "log_warning": level <= logging.WARNING,
            "log_error": level <= logging.ERROR, "log_verbose_level": 1 if level <= logging.DEBUG else 0,
            "log_file": "", "log_format": "default",
        }

    @staticmethod
    def level_of(v: dict[str, Any]) -> int:
        if v["log_verbose_level"] > 0:
            return logging.DEBUG
        for key, level in (("log_info", logging.INFO), ("log_warning", logging.WARNING), ("log_error", logging.ERROR)):
            if v[key]:
                return level
        return logging.CRITICAL + 1

    def update(self, settings: Any) -> None:
        new = dict(self.values)
        for key, sv in settings.items():
            which = sv.WhichOneof("parameter_choice")
            if key not in new:
                raise InvalidArgument(f"unknown log setting {key[:64]!r}; gnnserve has {sorted(new)}")
            if which is None:
                raise InvalidArgument(f"log setting {key} has no value (gnnserve cannot clear a log setting)")
            value = getattr(sv, which)
            if key in self.BOOLS:
                if which != "bool_param":
                    raise InvalidArgument(f"log setting {key} is a bool, got {which}")
            elif key == "log_verbose_level":
                if which != "uint32_param":
                    raise InvalidArgument(f"log setting {key} is a uint32, got {which}")
            elif which != "string_param" or value != self.values[key]:
                what = "stderr only (log_file \"\")" if key == "log_file" else "the default format only"
                raise InvalidArgument(f"log setting {key} cannot be changed: gnnserve logs to {what}")
            new[key] = value
        v = new
        # Python's levels are thresholds: enabling a level implies every more severe one
        if (v["log_verbose_level"] > 0 and not (v["log_info"] and v["log_warning"] and v["log_error"])) or \
                (v["log_info"] and not (v["log_warning"] and v["log_error"])) or \
                (v["log_warning"] and not v["log_error"]):
            raise InvalidArgument("log settings: a level cannot be on while a more severe one is off (Python "
                                  "logging levels are thresholds): log_verbose_level > 0 needs log_info, "
                                  "log_info needs log_warning, log_warning needs log_error")
        level = self.level_of(v)
        log.warning("log settings changed to %s: level %s", v, logging.getLevelName(level))  # before it is off
        for lg in self.loggers:
            lg.setLevel(level)
        self.values = v

    def response(self) -> pb.LogSettingsResponse:
        out = pb.LogSettingsResponse()
        for key, value in self.values.items():
            sv = out.settings[key]
            if isinstance(value, bool):
                sv.bool_param = value
            elif isinstance(value, int):
                sv.uint32_param = value
            else:
                sv.string_param = value
        return out


class TritonServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, registry: ModelRegistry, gate: DrainGate | None = None) -> None:
        self.registry = registry
        self.gate = gate  # streams admit each request through it (the interceptor wraps unary calls only)
        self.log_state = LogState()

    # ------------------------------------------------------------------ core protocol
    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: aio.ServicerContext) -> pb.ServerReadyResponse:
        # as gRPC health: not ready while a served model lost its device or a graph is out of service (a restart)
        reg = self.registry
        return pb.ServerReadyResponse(ready=reg.ready and not reg.lost_devices() and not reg.broken_graphs())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> pb.ModelReadyResponse:
        try:
            rt = self.registry.get(request.name, request.version)
        except (ModelNotFound, Unavailable):
            return pb.ModelReadyResponse(ready=False)
        # a graph out of service answers every request FAILED_PRECONDITION
        return pb.ModelReadyResponse(ready=rt.in_service)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=list(EXTENSIONS))

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        rt = self.registry.get(request.name, request.version)
        T = pb.ModelMetadataResponse.TensorMetadata
        emb_dim = int(getattr(rt.model, "embedding_dim", -1))
        return pb.ModelMetadataResponse(
            name=rt.name,
            versions=[str(v) for v in self.registry.versions(rt.name)],
            platform=PLATFORM,  # as ModelConfig.platform; the architecture is ModelConfig's parameter
            # as Triton reports a batching model's inputs: the batch dimension, then the configuration's dims
            # (ModelConfig), the shape a Triton client (perf_analyzer) sends; [n] is accepted as well
            inputs=[T(name=name, datatype=spec.datatype, shape=[-1, *_input_dims(spec, rt.limits.num_features)])
                    for name, spec in INPUT_SPECS.items()],
            outputs=[
                T(name="LABELS", datatype="INT64", shape=[-1]),
                T(name="PROBABILITIES", datatype="FP32", shape=[-1, rt.num_classes]),
                T(name="EMBEDDINGS", datatype="FP32", shape=[-1, emb_dim]),
            ],
        )

    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> pb.ModelInferResponse:
        return await self._infer(request, deadline_of(context))

    async def _infer(self, request: pb.ModelInferRequest, deadline: float | None) -> pb.ModelInferResponse:
        t0 = time.perf_counter()
        # what Triton checks before the model sees a request (not counted in the model's statistics): the
        # outputs (first: a bad list is refused before any work), the model version, the input tensor
        wanted = requested_outputs(request)
        classes = class_counts(request)
        rt = self.registry.get(request.model_name, request.model_version)
        nodes, new_nodes = _infer_inputs(request, rt.limits)
        # its parameters and values checked against the model, a read-your-writes wait: what fails here is refused
        # before the model's queue took it, and counts in no failure, as native Predict's checks (serve.stats)
        deadline = _request_deadline(request, deadline)
        call = await self._model_call(rt, request, nodes, new_nodes, wanted, deadline)
        # counts its own failures (queue, deadline, batch), and its success from t0, the handler's start
        res = await rt.submit(call, deadline=deadline, started=t0)
        res.timing["total"] = 1e3 * (time.perf_counter() - t0)
        rt.observe(res)
        # as native Predict: DATA_LOSS once the store saw a pinned data version replaced (cached rows included)
        from . import features

        data_version = features.data_version(rt.data.features, rt.data.graph, rt.dataset_fingerprint)
        resp = pb.ModelInferResponse(model_name=rt.name, model_version=str(rt.version), id=request.id)
        n = len(res.labels)
        for name in wanted:
            out = resp.outputs.add(name=name)
            if name in classes:  # the classification extension: BYTES [n, k], "<probability>:<index>"
                k = min(classes[name], res.probabilities.shape[1])
                out.datatype = "BYTES"
                out.shape.extend([n, k])
                resp.raw_output_contents.append(classification_bytes(res.probabilities, k))
                continue
            if name == "LABELS":
                out.datatype, arr = "INT64", np.ascontiguousarray(res.labels, dtype="<i8")
                out.shape.extend([n])
            elif name == "PROBABILITIES":
                out.datatype, arr = "FP32", np.ascontiguousarray(res.probabilities, dtype="<f4")
                out.shape.extend([n, arr.shape[1]])
            else:
                emb = res.embeddings if res.embeddings is not None else np.zeros((n, 0), np.float32)
                out.datatype, arr = "FP32", np.ascontiguousarray(emb, dtype="<f4")
                out.shape.extend([n, arr.shape[1]])
            resp.raw_output_contents.append(arr.tobytes())
        p = resp.parameters
        p["sampling_width"].int64_param = call.sampling_width
        p["ppr_budget"].int64_param = call.ppr_budget
        p["strategy"].string_param = rt.strategy
        p["extractor"].string_param = rt.limits.extractor
        p["chosen_by"].string_param = call.chosen_by
        if call.expected_accuracy:  # the knob table's accuracy of the setting served (absent: none measured)
            p["expected_accuracy"].double_param = call.expected_accuracy
        p["edges_kept"].int64_param = res.edges_kept
        p["edges_total"].int64_param = res.edges_total
        p["total_ms"].double_param = res.timing["total"]
        p["graph_version"].int64_param = res.graph_version
        p["data_version"].string_param = data_version
        return resp

    @staticmethod
    async def _model_call(rt: ModelRuntime, request: pb.ModelInferRequest, nodes: np.ndarray,
                          new_nodes: list[gpb.NewNode], wanted: list[str], deadline: float | None) -> Any:
        """The request's parameters, node ids and new nodes checked against the model (the native Predict's
        checks, :func:`serve.validation.validate_predict`): a validated PredictCall."""
        unknown_params = sorted(set(request.parameters) - set(REQUEST_PARAMS))
        if unknown_params:
            raise InvalidArgument(f"unknown request parameters {[u[:64] for u in unknown_params[:8]]}; "
                                  f"supported: {list(REQUEST_PARAMS)}")
        greq = gpb.PredictRequest(
            model=rt.name,
            version=str(rt.version),
            nodes=nodes.tolist(),
            new_nodes=new_nodes,
            request_id=request.id[:MAX_REQUEST_ID],  # for the logs; the answer echoes the whole id, as Triton does
            return_probabilities="PROBABILITIES" in wanted,
            return_embeddings="EMBEDDINGS" in wanted,
        )
        params = request.parameters
        if "sampling_width" in params:
            greq.sampling_width = _knob_param("sampling_width", params["sampling_width"], rt)
        if "ppr_budget" in params:
            greq.ppr_budget = _knob_param("ppr_budget", params["ppr_budget"], rt)
        if "max_accuracy_loss" in params:
            greq.max_accuracy_loss = _float_param("max_accuracy_loss", params["max_accuracy_loss"])
        if EMPTY_FINAL in params and params[EMPTY_FINAL].WhichOneof("parameter_choice") != "bool_param":
            raise InvalidArgument(f"parameter {EMPTY_FINAL} must be a bool_param (Triton's; every response here is final)")
        if "priority" in params and _int_param("priority", params["priority"]) < 0:
            raise InvalidArgument("parameter priority must be >= 0 (Triton's priority level; this server has one)")
        if "min_graph_version" in params:
            v = _int_param("min_graph_version", params["min_graph_version"])
            if not 0 <= v <= MAX_GRAPH_VERSION:
                raise InvalidArgument(f"parameter min_graph_version must be >= 0 and <= {MAX_GRAPH_VERSION} (a graph "
                                      f"version; 0 = any), got {v}")
            if v:
                await reach_version(rt, v, deadline)
        return validate_predict(greq, rt.limits)

    # ------------------------------------------------------------------ streaming
    async def _stream_one(self, request: pb.ModelInferRequest, deadline: float | None) -> pb.ModelStreamInferResponse:
        """One request of a stream, answered: its response, or its error as ``error_message``."""
        problem = unparsed_reason(request)
        if problem is not None:  # refused from its bytes, or undecodable: the stream goes on
            resp = pb.ModelStreamInferResponse(error_message=bounded(f"INVALID_ARGUMENT: {problem}"))
            resp.infer_response.parameters[FINAL_RESPONSE].bool_param = True
            return resp
        admitted = False
        try:
            if self.gate is not None:
                self.gate.enter("ModelStreamInfer")
                admitted = True
            resp = pb.ModelStreamInferResponse(infer_response=await self._infer(request, deadline))
            resp.infer_response.parameters[FINAL_RESPONSE].bool_param = True
            return resp
        except Exception as exc:
            code, message = error_status(exc, "ModelStreamInfer request", request.id[:64])
            resp = pb.ModelStreamInferResponse(error_message=bounded(f"{code.name}: {message}"))
            # the request's model and id, so a client can tell which request failed
            resp.infer_response.model_name = request.model_name[:256]
            resp.infer_response.model_version = request.model_version[:64]
            resp.infer_response.id = request.id[:256]
            resp.infer_response.parameters[FINAL_RESPONSE].bool_param = True
            return resp
        finally:
            if admitted:
                self.gate.leave()  # type: ignore[union-attr]

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        deadline = deadline_of(context)
        pending: asyncio.Queue[asyncio.Future[pb.ModelStreamInferResponse] | None] = asyncio.Queue(STREAM_WINDOW)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await pending.put(asyncio.ensure_future(self._stream_one(request, deadline)))
            except Exception as exc:  # the client's half failed: answer what was read, then end
                log.info("ModelStreamInfer: reading the stream failed (%s); answering what was read", exc)
            # the end of the requests (not when cancelled: then nobody reads the answers any more)
            await pending.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                task = await pending.get()
                if task is None:
                    break
                yield await task
        finally:
            reader.cancel()
            while not pending.empty():
                task = pending.get_nowait()
                if task is not None:
                    task.cancel()

    # ------------------------------------------------------------------ model configuration and statistics
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: aio.ServicerContext) -> pb.ModelConfigResponse:
        rt = self.registry.get(request.name, request.version)
        return pb.ModelConfigResponse(config=model_config(rt))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        out = pb.ModelStatisticsResponse()
        if request.name:
            rt = self.registry.get(request.name, request.version)  # NOT_FOUND for an unknown one
            runtimes = [rt] if request.version else [
                r for v, r in sorted(self.registry.snapshot().get(rt.name, {}).items())]
        else:
            if request.version:
                raise InvalidArgument("a version needs a model name")
            runtimes = [r for _, vs in sorted(self.registry.snapshot().items()) for _, r in sorted(vs.items())]
        out.model_stats.extend(model_statistics(r) for r in runtimes)
        return out

    # ------------------------------------------------------------------ repository
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        _check_repository(request.repository_name, self.registry)
        out = pb.RepositoryIndexResponse()
        for name, version, state, reason in self.registry.index():
            if request.ready and state != "READY":
                continue
            out.models.add(name=name, version=str(version), state=state, reason=bounded(reason, 512))
        return out

    def _repository_request(self, request: Any, allowed: tuple[str, ...], rpc: str) -> int | None:
        _check_repository(request.repository_name, self.registry)
        _refuse_under_processes(rpc)
        if not request.model_name:
            raise InvalidArgument("model_name is empty")
        for key in request.parameters:
            if key == "config" or key.startswith("file:"):
                raise Unimplemented(f"parameter {key[:64]!r}: gnnserve loads checkpoints from its repository as they "
                                    "are; it takes no configuration override or uploaded model files")
            if key not in allowed:
                raise InvalidArgument(f"unknown parameter {key[:64]!r}; supported: {list(allowed)}")
        return _version_param(request.parameters, request.model_name, rpc)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        version = self._repository_request(request, ("version",), "RepositoryModelLoad")
        try:
            await self.registry.load(request.model_name, version)
        except RepositoryError as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        version = self._repository_request(request, ("version", "unload_dependents"), "RepositoryModelUnload")
        if "unload_dependents" in request.parameters:
            v = _repository_param("unload_dependents", request.parameters["unload_dependents"])
            if not isinstance(v, bool):
                raise InvalidArgument("parameter unload_dependents must be a bool")
        await self.registry.unload(request.model_name, version)
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ settings
    async def LogSettings(self, request: pb.LogSettingsRequest, context: aio.ServicerContext) -> pb.LogSettingsResponse:
        if request.settings:
            _refuse_under_processes("LogSettings (a change)", "Set the log level of every process when the server "
                                    "starts (gnnserve serve --log-level DEBUG|INFO|WARNING|ERROR); reading the "
                                    "settings (no settings in the request) is available")
            self.log_state.update(request.settings)
        return self.log_state.response()

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: aio.ServicerContext) -> Any:
        raise Unimplemented("TraceSetting: gnnserve has no request tracing; every response carries its timing "
                            "(response parameter total_ms) and the metrics port has latency by stage. " + _SUPPORTED)

    # ------------------------------------------------------------------ shared memory: no region can be registered
    async def _no_shared_memory(self, kind: str) -> Any:
        raise Unimplemented(f"{kind} shared memory is not supported by gnnserve: no region can be registered (the "
                            f"status lists none, unregistering does nothing); send tensors in the request. "
                            f"{_SUPPORTED}")

    async def SystemSharedMemoryStatus(self, request: Any, context: aio.ServicerContext) -> Any:
        return pb.SystemSharedMemoryStatusResponse()  # no region registered

    async def SystemSharedMemoryRegister(self, request: Any, context: aio.ServicerContext) -> Any:
        return await self._no_shared_memory("system")

    async def SystemSharedMemoryUnregister(self, request: Any, context: aio.ServicerContext) -> Any:
        return pb.SystemSharedMemoryUnregisterResponse()  # nothing registered: nothing to do, as Triton

    async def CudaSharedMemoryStatus(self, request: Any, context: aio.ServicerContext) -> Any:
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: aio.ServicerContext) -> Any:
        return await self._no_shared_memory("CUDA")

    async def CudaSharedMemoryUnregister(self, request: Any, context: aio.ServicerContext) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()

