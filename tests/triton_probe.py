"""Runs ``tritonclient`` against a gnnserve address and prints what it saw as JSON.

tritonclient registers its own copy of the KServe ``inference`` protobuf types, which cannot share a
process (descriptor pool) with gnnserve's generated code, so ``tests/test_triton.py`` runs this
script in a subprocess: ``python tests/triton_probe.py ADDRESS``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException


def infer(client, nodes, outputs=("LABELS", "PROBABILITIES"), model="shadow", priority=0, timeout=None, **params):
    inp = tritongrpc.InferInput("NODE_IDS", [len(nodes)], "INT64")
    inp.set_data_from_numpy(np.asarray(nodes, dtype=np.int64))
    outs = [tritongrpc.InferRequestedOutput(o) for o in outputs]
    return client.infer(model, [inp], outputs=outs, parameters=params or None, priority=priority, timeout=timeout)


def main(address: str) -> dict:
    client = tritongrpc.InferenceServerClient(address)
    out: dict = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": [client.is_model_ready("shadow"), client.is_model_ready("gcn", "1"),
                        client.is_model_ready("nope")],
    }
    meta = client.get_server_metadata()
    out["server_name"] = meta.name
    mm = client.get_model_metadata("shadow")
    out["inputs"] = [(i.name, i.datatype) for i in mm.inputs]
    out["outputs"] = {o.name: [o.datatype, list(o.shape)] for o in mm.outputs}

    nodes = list(range(0, 800, 9))
    res = infer(client, nodes, sampling_width=4, ppr_budget=16)
    params = res.get_response().parameters
    out["infer"] = {
        "nodes": nodes,
        "labels": res.as_numpy("LABELS").tolist(),
        "probabilities": res.as_numpy("PROBABILITIES").tolist(),
        "sampling_width": params["sampling_width"].int64_param,
        "ppr_budget": params["ppr_budget"].int64_param,
    }
    # tritonclient's own priority and timeout (request parameters "priority" and "timeout", microseconds)
    res = infer(client, nodes, sampling_width=4, ppr_budget=16, priority=3, timeout=30_000_000)
    out["infer_priority_timeout"] = res.as_numpy("LABELS").tolist()
    # the largest int64 for "no timeout", as clients send it: answered, not refused
    res = infer(client, nodes, sampling_width=4, ppr_budget=16, timeout=2**63 - 1)
    out["infer_no_timeout"] = res.as_numpy("LABELS").tolist()
    out["embedding_shape"] = list(infer(client, nodes[:3], outputs=("EMBEDDINGS",)).as_numpy("EMBEDDINGS").shape)

    cases = {
        "out_of_range": {"nodes": [5000]},
        "unknown_model": {"nodes": [1], "model": "nope"},
        "bad_width": {"nodes": [1], "sampling_width": -4},
        "bad_budget": {"nodes": [1], "ppr_budget": "many"},
        "bad_output": {"nodes": [1], "outputs": ("LOGITS",)},
        "bad_timeout": {"nodes": [1], "timeout": -5},
    }
    out["errors"] = {}
    for name, kw in cases.items():
        try:
            infer(client, **kw)
            out["errors"][name] = None
        except InferenceServerException as e:
            out["errors"][name] = {"status": e.status(), "message": str(e), "ready_after": client.is_server_ready()}
    client.close()
    return out


if __name__ == "__main__":
    json.dump(main(sys.argv[1]), sys.stdout)
