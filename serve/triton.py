"""KServe v2 / Triton ``inference.GRPCInferenceService`` on top of the same models and pipeline.

Tensor mapping (so ``tritonclient.grpc.InferenceServerClient`` works unchanged):

* input ``NODE_IDS``: INT64, shape ``[n]`` (or ``[n, 1]``), raw little-endian or ``int64_contents``;
* outputs ``LABELS`` (INT64 ``[n]``), ``PROBABILITIES`` (FP32 ``[n, C]``), ``EMBEDDINGS``
  (FP32 ``[n, H]``); all of them when the request names none;
* request parameters ``sampling_width``, ``ppr_budget`` (integers) and ``max_accuracy_loss``
  (number) are the knobs; the response parameters report the settings used and the timing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
from grpc import aio

from clients._gen import gnnserve_pb2 as gpb
from clients._gen import inference_pb2 as pb
from clients._gen import inference_pb2_grpc as pb_grpc

from .errors import InvalidArgument, ModelNotFound, Unavailable
from .servicer import deadline_of
from .validation import validate_predict

if TYPE_CHECKING:
    from .registry import ModelRegistry

__all__ = ["TritonServicer"]

SERVER_NAME = "gnnserve"
SERVER_VERSION = "0.1.0"
INPUT = "NODE_IDS"
OUTPUTS = ("LABELS", "PROBABILITIES", "EMBEDDINGS")
KNOBS = ("sampling_width", "ppr_budget", "max_accuracy_loss")


def _param_value(p: pb.InferParameter) -> float | int | str | bool:
    which = p.WhichOneof("parameter_choice")
    if which is None:
        raise InvalidArgument("empty request parameter")
    return getattr(p, which)


def _int_param(name: str, p: pb.InferParameter) -> int:
    v = _param_value(p)
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise InvalidArgument(f"parameter {name} must be an integer, got {v!r}")
    try:
        f = float(v)
    except ValueError:
        raise InvalidArgument(f"parameter {name} must be an integer, got {v!r}") from None
    if not f.is_integer() or abs(f) > 2**31 - 1:
        raise InvalidArgument(f"parameter {name} must be an integer, got {v!r}")
    return int(f)


def _float_param(name: str, p: pb.InferParameter) -> float:
    v = _param_value(p)
    if isinstance(v, bool):
        raise InvalidArgument(f"parameter {name} must be a number, got {v!r}")
    try:
        return float(v)
    except ValueError:
        raise InvalidArgument(f"parameter {name} must be a number, got {v!r}") from None


def _node_ids(request: pb.ModelInferRequest) -> np.ndarray:
    if len(request.inputs) != 1 or request.inputs[0].name != INPUT:
        names = [i.name for i in request.inputs]
        raise InvalidArgument(f"expected exactly one input named {INPUT!r} (INT64, shape [n]), got {names}")
    tensor = request.inputs[0]
    if tensor.datatype != "INT64":
        raise InvalidArgument(f"input {INPUT} must be INT64, got {tensor.datatype or 'no datatype'}")
    shape = list(tensor.shape)
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1) or any(d < 0 for d in shape):
        raise InvalidArgument(f"input {INPUT} must have shape [n] or [n, 1], got {shape}")
    n = shape[0]
    if len(request.raw_input_contents):
        raw = request.raw_input_contents[0]
        if len(raw) != 8 * n:
            raise InvalidArgument(f"input {INPUT}: {len(raw)} raw bytes for shape {shape} (need {8 * n})")
        return np.frombuffer(raw, dtype="<i8").astype(np.int64)
    ids = np.asarray(tensor.contents.int64_contents, dtype=np.int64)
    if len(ids) != n:
        raise InvalidArgument(f"input {INPUT}: {len(ids)} values for shape {shape}")
    return ids


class TritonServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.registry.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> pb.ModelReadyResponse:
        try:
            self.registry.get(request.name, request.version)
        except (ModelNotFound, Unavailable):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=["parameters"])

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        rt = self.registry.get(request.name, request.version)
        T = pb.ModelMetadataResponse.TensorMetadata
        emb_dim = int(getattr(rt.model, "embedding_dim", -1))
        return pb.ModelMetadataResponse(
            name=rt.name,
            versions=[str(v) for v in self.registry.versions(rt.name)],
            platform="gnnserve_" + rt.architecture,
            inputs=[T(name=INPUT, datatype="INT64", shape=[-1])],
            outputs=[
                T(name="LABELS", datatype="INT64", shape=[-1]),
                T(name="PROBABILITIES", datatype="FP32", shape=[-1, rt.num_classes]),
                T(name="EMBEDDINGS", datatype="FP32", shape=[-1, emb_dim]),
            ],
        )

    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> pb.ModelInferResponse:
        t0 = time.perf_counter()
        rt = self.registry.get(request.model_name, request.model_version)
        wanted = [o.name for o in request.outputs] or ["LABELS", "PROBABILITIES"]
        unknown = sorted(set(wanted) - set(OUTPUTS))
        if unknown:
            raise InvalidArgument(f"unknown outputs {unknown}; this model has {list(OUTPUTS)}")
        unknown_params = sorted(set(request.parameters) - set(KNOBS))
        if unknown_params:
            raise InvalidArgument(f"unknown request parameters {unknown_params}; supported: {list(KNOBS)}")
        greq = gpb.PredictRequest(
            model=rt.name,
            version=str(rt.version),
            nodes=_node_ids(request).tolist(),
            request_id=request.id,
            return_probabilities="PROBABILITIES" in wanted,
            return_embeddings="EMBEDDINGS" in wanted,
        )
        params = request.parameters
        if "sampling_width" in params:
            greq.sampling_width = _int_param("sampling_width", params["sampling_width"])
        if "ppr_budget" in params:
            greq.ppr_budget = _int_param("ppr_budget", params["ppr_budget"])
        if "max_accuracy_loss" in params:
            greq.max_accuracy_loss = _float_param("max_accuracy_loss", params["max_accuracy_loss"])
        call = validate_predict(greq, rt.limits)
        res = await rt.submit(call, deadline=deadline_of(context))
        res.timing["total"] = 1e3 * (time.perf_counter() - t0)
        rt.observe(res)
        resp = pb.ModelInferResponse(model_name=rt.name, model_version=str(rt.version), id=request.id)
        n = len(res.labels)
        for name in wanted:
            out = resp.outputs.add(name=name)
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
        p["chosen_by"].string_param = call.chosen_by
        p["edges_kept"].int64_param = res.edges_kept
        p["edges_total"].int64_param = res.edges_total
        p["total_ms"].double_param = res.timing["total"]
        return resp
