"""KServe RepositoryModelLoad / RepositoryModelUnload under `gnnserve serve --processes N` (serve/triton.py).

Each process holds its own models and a connection reaches one of them, so a load or unload would act
on one process only (the others would answer as before: fresh connections got NOT_FOUND from some
processes and answers from others). They are refused with FAILED_PRECONDITION saying how to load and
unload there (the repository directory, which every process polls). A real `--processes 2` server on
loopback; each fresh channel is a new connection, which the kernel gives to one of the processes.
"""

from __future__ import annotations

import grpc
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc
from clients._gen import inference_pb2 as ipb
from clients._gen import inference_pb2_grpc as ipb_grpc

from .serving import ServerProcess

CONNECTIONS = 48  # fresh connections tried until both processes have answered (each is one of 2)


def _refusal(call: grpc.RpcError) -> str:
    assert call.code() == grpc.StatusCode.FAILED_PRECONDITION, (call.code(), call.details())
    return call.details()


def test_load_and_unload_are_refused_on_every_process(tiny_repo):
    with ServerProcess(tiny_repo, "--processes", "2", "--read-only", "--poll-s", "0") as srv:
        refused: dict[str, list[str]] = {}
        for _ in range(CONNECTIONS):
            with grpc.insecure_channel(srv.address) as ch:
                who = pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(model="gcn", nodes=[1]), timeout=60).served_by
                stub = ipb_grpc.GRPCInferenceServiceStub(ch)
                messages = []
                for rpc, req in (("RepositoryModelUnload", ipb.RepositoryModelUnloadRequest(model_name="gcn")),
                                 ("RepositoryModelLoad", ipb.RepositoryModelLoadRequest(model_name="gcn"))):
                    with pytest.raises(grpc.RpcError) as ei:
                        getattr(stub, rpc)(req, timeout=60)
                    messages.append(_refusal(ei.value))
                refused.setdefault(who.split(" ", 1)[1], []).extend(messages)
            if len(refused) == 2:
                break
        assert sorted(refused) == ["1/2", "2/2"], f"only processes {sorted(refused)} were reached"
        for slot, messages in refused.items():
            for m in messages:
                assert "--processes 2" in m and f"reached process {slot[0]} of 2" in m, m
                assert "REPO/<model>/<version>/" in m and "move its directory out of the repository" in m, m
        # nothing was unloaded anywhere: every process still answers for the model
        seen = set()
        for _ in range(CONNECTIONS):
            with grpc.insecure_channel(srv.address) as ch:
                resp = pb_grpc.GnnServiceStub(ch).Predict(pb.PredictRequest(model="gcn", nodes=[1, 2]), timeout=60)
                assert list(resp.labels) and resp.model == "gcn"
                seen.add(resp.served_by.split(" ", 1)[1])
            if len(seen) == 2:
                break
        assert seen == {"1/2", "2/2"}
