"""The committed generated gRPC code must equal a fresh generation from proto/."""

from __future__ import annotations

import subprocess
import sys

from .conftest import REPO


def test_generated_code_is_up_to_date():
    res = subprocess.run(
        [sys.executable, str(REPO / "proto" / "generate.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_generated_modules_import_and_carry_services():
    from clients._gen import gnnserve_pb2, gnnserve_pb2_grpc, inference_pb2, inference_pb2_grpc

    assert gnnserve_pb2.DESCRIPTOR.package == "gnnserve.v1"
    assert set(gnnserve_pb2.DESCRIPTOR.services_by_name["GnnService"].methods_by_name) == {
        "Predict", "ListModels", "GetModel", "UpdateGraph",
    }
    assert inference_pb2.DESCRIPTOR.package == "inference"
    # the six core KServe v2 RPCs and Triton's extensions of the same service (tests/test_triton_ext.py
    # checks every message and field against tritonclient's own copy of the protocol)
    methods = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    assert set(methods) == {
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
        "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
        "RepositoryModelUnload", "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings",
    }
    stream = methods["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    assert hasattr(gnnserve_pb2_grpc, "GnnServiceStub") and hasattr(inference_pb2_grpc, "GRPCInferenceServiceServicer")
