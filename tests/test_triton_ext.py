"""Triton's extensions of ``inference.GRPCInferenceService``, driven by ``tritonclient`` itself.

The server is a real gnnserve server on loopback over the session's trained test repository (its own
instance: these tests unload models and change log levels). tritonclient registers its own copy of
the ``inference`` protobuf types, which cannot share a process with the server's generated code, so
the client side of each test runs this same file in a subprocess (``python -m tests.test_triton_ext
ADDRESS SCENARIO``): each scenario below (``client_*``) calls ``tritonclient.grpc`` or
``tritonclient.grpc.aio`` and prints what it saw as JSON; the tests compare that with the native
gnnserve API and with what the scenario was made to provoke.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

from .conftest import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tritonclient") is None, reason="tritonclient not installed")

POLL_S = 0.25  # the test server's repository poll interval


# ============================================================================ client side (subprocess)
def _inputs(tg: Any, nodes: list[int]) -> list[Any]:
    inp = tg.InferInput("NODE_IDS", [len(nodes)], "INT64")
    inp.set_data_from_numpy(np.asarray(nodes, dtype=np.int64))
    return [inp]


def _outputs(tg: Any, names: tuple[str, ...] = ("LABELS", "PROBABILITIES")) -> list[Any]:
    return [tg.InferRequestedOutput(n) for n in names]


def _err(e: Any) -> dict[str, Any]:
    return {"status": e.status(), "message": e.message()}


def _call(fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    """``{"ok": result}`` or ``{"error": {status, message}}``."""
    from tritonclient.utils import InferenceServerException

    try:
        return {"ok": fn(*args, **kw)}
    except InferenceServerException as e:
        return {"error": _err(e)}


def client_descriptors(address: str) -> dict[str, Any]:
    """tritonclient's own protocol: every message's fields and the service's methods."""
    from tritonclient.grpc import model_config_pb2, service_pb2

    return describe([service_pb2, model_config_pb2])


def client_repository(address: str) -> dict[str, Any]:
    """Index, unload (NOT_FOUND after, the poller does not bring it back), load (served again)."""
    import tritonclient.grpc as tg
    from tritonclient.grpc import service_pb2

    c = tg.InferenceServerClient(address)
    nodes = [1, 50, 333, 799]
    out: dict[str, Any] = {}
    idx = c.get_model_repository_index(as_json=True)
    out["index_before"] = idx.get("models", [])
    out["labels_before"] = c.infer("gcn", _inputs(tg, nodes)).as_numpy("LABELS").tolist()
    c.unload_model("gcn")
    out["ready_after_unload"] = c.is_model_ready("gcn")
    out["infer_after_unload"] = _call(c.infer, "gcn", _inputs(tg, nodes))
    out["index_unloaded"] = c.get_model_repository_index(as_json=True).get("models", [])
    ready_only = c._client_stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
    out["index_ready_only"] = [[m.name, m.version, m.state] for m in ready_only.models]
    time.sleep(6 * POLL_S)  # several repository scans: an unloaded model must stay unloaded
    out["ready_after_polls"] = c.is_model_ready("gcn")
    out["shadow_still_ready"] = c.is_model_ready("shadow")
    c.load_model("gcn")
    out["ready_after_load"] = c.is_model_ready("gcn")
    out["labels_after_load"] = c.infer("gcn", _inputs(tg, nodes)).as_numpy("LABELS").tolist()
    # one version: gnnserve's "version" parameter
    req = service_pb2.RepositoryModelUnloadRequest(model_name="gcn")
    req.parameters["version"].string_param = "1"
    c._client_stub.RepositoryModelUnload(req)
    out["ready_after_version_unload"] = [c.is_model_ready("gcn", "1"), c.is_model_ready("gcn")]
    req = service_pb2.RepositoryModelLoadRequest(model_name="gcn")
    req.parameters["version"].int64_param = 1
    c._client_stub.RepositoryModelLoad(req)
    out["ready_after_version_load"] = c.is_model_ready("gcn", "1")
    out["errors"] = {
        "load_unknown": _call(c.load_model, "nope"),
        "unload_unknown": _call(c.unload_model, "nope"),
        "load_config": _call(c.load_model, "gcn", config='{"max_batch_size": 8}'),
    }
    out["errors"]["bad_repository"] = _grpc_call(lambda: c._client_stub.RepositoryIndex(
        service_pb2.RepositoryIndexRequest(repository_name="other")))
    c.close()
    return out


def _grpc_call(fn: Any) -> dict[str, Any]:
    import grpc

    try:
        fn()
        return {"ok": True}
    except grpc.RpcError as e:
        return {"error": {"status": str(e.code()), "message": e.details()}}


def client_repository_aio(address: str) -> dict[str, Any]:
    """The same through ``tritonclient.grpc.aio``: unload, NOT_FOUND, load, index."""
    import tritonclient.grpc as tg
    import tritonclient.grpc.aio as tga
    from tritonclient.utils import InferenceServerException

    async def run() -> dict[str, Any]:
        c = tga.InferenceServerClient(address)
        out: dict[str, Any] = {}
        await c.unload_model("shadow")
        out["ready_after_unload"] = await c.is_model_ready("shadow")
        try:
            await c.infer("shadow", _inputs(tg, [3]))
            out["infer_after_unload"] = None
        except InferenceServerException as e:
            out["infer_after_unload"] = _err(e)
        idx = await c.get_model_repository_index(as_json=True)
        out["index_unloaded"] = idx.get("models", [])
        await c.load_model("shadow")
        out["ready_after_load"] = await c.is_model_ready("shadow")
        res = await c.infer("shadow", _inputs(tg, [3, 4]), parameters={"sampling_width": 4, "ppr_budget": 16})
        out["labels_after_load"] = res.as_numpy("LABELS").tolist()
        await c.close()
        return out

    return asyncio.run(run())


def client_config(address: str) -> dict[str, Any]:
    import tritonclient.grpc as tg
    import tritonclient.grpc.aio as tga

    c = tg.InferenceServerClient(address)
    out = {"shadow": c.get_model_config("shadow", as_json=True)["config"],
           "gcn": c.get_model_config("gcn", "1", as_json=True)["config"],
           "unknown": _call(c.get_model_config, "nope")}
    c.close()

    async def aio_config() -> dict[str, Any]:
        a = tga.InferenceServerClient(address)
        try:
            return (await a.get_model_config("shadow", as_json=True))["config"]
        finally:
            await a.close()

    out["shadow_aio"] = asyncio.run(aio_config())
    return out


def client_statistics(address: str, sends: str) -> dict[str, Any]:
    """Statistics of shadow v1 before and after ``sends`` ModelInfer requests of 3 nodes each, one
    refused by the model (a node id it does not have: a failure, as a Triton backend's refusal counts),
    one refused for its parameter's range (counts too) and one refused for its input tensor before the
    model sees it (an INT32 NODE_IDS: counts nowhere, as in Triton)."""
    import tritonclient.grpc as tg
    import tritonclient.grpc.aio as tga

    c = tg.InferenceServerClient(address)
    before = c.get_inference_statistics("shadow", "1", as_json=True)
    for i in range(int(sends)):
        c.infer("shadow", _inputs(tg, [i, i + 100, i + 200]), parameters={"sampling_width": 4, "ppr_budget": 16})
    refused = _call(c.infer, "shadow", _inputs(tg, [100_000]))
    refused_param = _call(c.infer, "shadow", _inputs(tg, [1]), parameters={"ppr_budget": 2**40})
    int32 = tg.InferInput("NODE_IDS", [1], "INT32")
    int32.set_data_from_numpy(np.asarray([1], dtype=np.int32))
    refused_input = _call(c.infer, "shadow", [int32])
    after = c.get_inference_statistics("shadow", "1", as_json=True)
    every = c.get_inference_statistics(as_json=True)
    c.close()

    async def aio_stats() -> Any:
        a = tga.InferenceServerClient(address)
        try:
            return await a.get_inference_statistics("shadow", as_json=True)
        finally:
            await a.close()

    return {"before": before, "after": after, "all": every, "refused": refused, "refused_param": refused_param,
            "refused_input": refused_input, "aio": asyncio.run(aio_stats())}


def client_read_statistics(address: str) -> dict[str, Any]:
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(address)
    try:
        return c.get_inference_statistics("shadow", "1", as_json=True)
    finally:
        c.close()


def _stream_request(i: int) -> tuple[str, list[int], dict[str, Any]]:
    nodes = [(i * 37) % 800, (i * 11 + 5) % 800]
    params = {"sampling_width": [0, 2, 4][i % 3], "ppr_budget": [8, 16][i % 2]}
    return f"r{i}", nodes, params


def client_stream(address: str, count: str, bad: str) -> dict[str, Any]:
    """``count`` requests on one stream (start_stream / async_stream_infer / stop_stream); the ones at
    the indices in ``bad`` are broken on purpose. Every other answer is compared with the unary one."""
    import queue

    import tritonclient.grpc as tg

    n = int(count)
    broken = {int(b): kind for b, kind in (x.split(":") for x in bad.split(",") if x)}
    c = tg.InferenceServerClient(address)
    got: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    t0 = time.perf_counter()
    for i in range(n):
        rid, nodes, params = _stream_request(i)
        outs = ("LABELS", "PROBABILITIES")
        if broken.get(i) == "width":
            params = dict(params, sampling_width=-4)
        elif broken.get(i) == "repeat":
            outs = ("LABELS", "LABELS")
        elif broken.get(i) == "range":
            nodes = [5000]
        c.async_stream_infer("shadow", _inputs(tg, nodes), request_id=rid, outputs=_outputs(tg, outs),
                             parameters=params)
    answers = [got.get(timeout=60) for _ in range(n)]
    stream_s = time.perf_counter() - t0
    c.stop_stream()
    ids, errors, mismatches = [], {}, []
    unary: dict[str, Any] = {}
    for i, (result, error) in enumerate(answers):
        if error is not None:
            ids.append(None)
            errors[i] = error.message()
            continue
        ids.append(result.get_response().id)
        rid, nodes, params = _stream_request(int(result.get_response().id[1:]))
        key = json.dumps([nodes, params])
        if key not in unary:
            r = c.infer("shadow", _inputs(tg, nodes), outputs=_outputs(tg), parameters=params)
            unary[key] = (r.as_numpy("LABELS"), r.as_numpy("PROBABILITIES"))
        labels, probs = unary[key]
        if not (np.array_equal(result.as_numpy("LABELS"), labels)
                and np.allclose(result.as_numpy("PROBABILITIES"), probs, rtol=1e-6, atol=1e-7)):
            mismatches.append(i)
    after = c.infer("shadow", _inputs(tg, [7]), outputs=_outputs(tg)).as_numpy("LABELS").tolist()
    c.close()
    return {"ids": ids, "errors": errors, "mismatches": mismatches, "unary_checked": len(unary),
            "stream_s": stream_s, "after": after}


def client_stream_cancel(address: str, count: str) -> dict[str, Any]:
    """``count`` requests on a stream, cancelled at once; then a new stream on the same client."""
    import queue

    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(address)
    got: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    for i in range(int(count)):
        c.async_stream_infer("shadow", _inputs(tg, [i % 800, (i * 7) % 800]), request_id=f"r{i}")
    c.stop_stream(cancel_requests=True)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    while not got.empty():
        got.get()
    c.async_stream_infer("shadow", _inputs(tg, [5]), request_id="again")
    result, error = got.get(timeout=60)
    c.stop_stream()
    c.close()
    return {"again": result.get_response().id if error is None else _err(error)}


def client_stream_aio(address: str, count: str) -> dict[str, Any]:
    """``stream_infer`` of ``tritonclient.grpc.aio``: request 3 is broken, the others answer in order."""
    import tritonclient.grpc as tg
    import tritonclient.grpc.aio as tga

    n = int(count)

    async def run() -> dict[str, Any]:
        c = tga.InferenceServerClient(address)

        async def requests():
            for i in range(n):
                rid, nodes, params = _stream_request(i)
                if i == 3:
                    params = dict(params, ppr_budget="many")
                yield {"model_name": "shadow", "inputs": _inputs(tg, nodes), "request_id": rid,
                       "outputs": _outputs(tg), "parameters": params}

        ids, errors, labels = [], {}, {}
        async for result, error in c.stream_infer(requests()):
            if error is not None:
                errors[len(ids)] = error.message()
                ids.append(None)
            else:
                rid = result.get_response().id
                ids.append(rid)
                labels[rid] = result.as_numpy("LABELS").tolist()
            if len(ids) == n:
                break
        unary = {}
        for rid in labels:
            _, nodes, params = _stream_request(int(rid[1:]))
            unary[rid] = (await c.infer("shadow", _inputs(tg, nodes), parameters=params)).as_numpy("LABELS").tolist()
        await c.close()
        return {"ids": ids, "errors": errors, "labels": labels, "unary": unary}

    return asyncio.run(run())


def client_log_settings(address: str, updates: str) -> dict[str, Any]:
    """``get_log_settings``, then each update in ``updates`` (a JSON list of dicts) in turn."""
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(address)
    out: dict[str, Any] = {"initial": c.get_log_settings(as_json=True)["settings"], "updates": []}
    for u in json.loads(updates):
        r = _call(c.update_log_settings, u, as_json=True)
        out["updates"].append(r["ok"]["settings"] if "ok" in r else r)
    out["final"] = c.get_log_settings(as_json=True)["settings"]
    c.close()
    return out


def client_unsupported(address: str) -> dict[str, Any]:
    """Shared memory and trace settings: each call's error."""
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(address)
    out = {
        "metadata": c.get_server_metadata(as_json=True),
        "system_status": _call(c.get_system_shared_memory_status, as_json=True),
        "system_register": _call(c.register_system_shared_memory, "r0", "/gnnserve_shm", 64),
        "system_unregister": _call(c.unregister_system_shared_memory),
        "system_unregister_one": _call(c.unregister_system_shared_memory, "r0"),
        "cuda_status": _call(c.get_cuda_shared_memory_status, as_json=True),
        "cuda_register": _call(c.register_cuda_shared_memory, "r0", b"\0" * 64, 0, 64),
        "cuda_unregister": _call(c.unregister_cuda_shared_memory),
        "trace": _call(c.get_trace_settings),
        "live": c.is_server_live(),
    }
    c.close()
    return out


def client_classification(address: str) -> dict[str, Any]:
    """The classification extension (``class_count``) beside the plain outputs; tensors in shared memory and
    classification of another output: each call's error."""
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(address)
    nodes = [1, 2, 3, 50]
    plain = c.infer("gcn", _inputs(tg, nodes))
    top = c.infer("gcn", _inputs(tg, nodes), outputs=[tg.InferRequestedOutput("PROBABILITIES", class_count=3),
                                                      tg.InferRequestedOutput("LABELS")])
    every = c.infer("gcn", _inputs(tg, nodes), outputs=[tg.InferRequestedOutput("PROBABILITIES", class_count=99)])
    shm_out = tg.InferRequestedOutput("PROBABILITIES")
    shm_out.set_shared_memory("r0", 1024)
    shm_in = tg.InferInput("NODE_IDS", [2], "INT64")
    shm_in.set_shared_memory("r0", 16)
    out = {
        "probabilities": plain.as_numpy("PROBABILITIES").tolist(),
        "labels": top.as_numpy("LABELS").tolist(),
        "top3": [[x.decode() for x in row] for row in top.as_numpy("PROBABILITIES")],
        "all": [[x.decode() for x in row] for row in every.as_numpy("PROBABILITIES")],
        "labels_classified": _call(c.infer, "gcn", _inputs(tg, nodes),
                                   outputs=[tg.InferRequestedOutput("LABELS", class_count=2)]),
        "shm_output": _call(c.infer, "gcn", _inputs(tg, nodes), outputs=[shm_out]),
        "shm_input": _call(c.infer, "gcn", [shm_in]),
    }
    c.close()
    return out


def client_repeated_outputs(address: str) -> dict[str, Any]:
    """The request of issue #23: 4,096 ids and 100,000 repeats of EMBEDDINGS; then smaller bad lists."""
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(address)
    nodes = list(range(800)) * 5 + list(range(96))  # 4,096 ids
    before = c.infer("shadow", _inputs(tg, nodes[:50]), parameters={"sampling_width": 4, "ppr_budget": 16})
    huge = _outputs(tg, ("EMBEDDINGS",) * 100_000)
    stats_before = c.get_inference_statistics("shadow", "1", as_json=True)
    t0 = time.perf_counter()
    flood = _call(c.infer, "shadow", _inputs(tg, nodes), outputs=huge)
    flood_s = time.perf_counter() - t0
    out = {
        "flood": flood, "flood_s": flood_s,
        "twice": _call(c.infer, "shadow", _inputs(tg, [1]), outputs=_outputs(tg, ("EMBEDDINGS", "EMBEDDINGS"))),
        "four": _call(c.infer, "shadow", _inputs(tg, [1]),
                      outputs=_outputs(tg, ("LABELS", "PROBABILITIES", "EMBEDDINGS", "LABELS"))),
        "unknown": _call(c.infer, "shadow", _inputs(tg, [1]), outputs=_outputs(tg, ("LABELS", "LOGITS"))),
        "stats_before": stats_before,
        "stats_after": c.get_inference_statistics("shadow", "1", as_json=True),
    }
    after = c.infer("shadow", _inputs(tg, nodes[:50]), parameters={"sampling_width": 4, "ppr_budget": 16},
                    outputs=_outputs(tg, ("LABELS", "PROBABILITIES", "EMBEDDINGS")))
    out["same_after"] = bool(np.array_equal(before.as_numpy("LABELS"), after.as_numpy("LABELS"))
                             and np.allclose(before.as_numpy("PROBABILITIES"), after.as_numpy("PROBABILITIES")))
    out["embedding_shape"] = list(after.as_numpy("EMBEDDINGS").shape)
    c.close()
    return out


def client_auth(address: str, token: str) -> dict[str, Any]:
    """A server with a bearer token: the extensions without it, then with it."""
    import queue

    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    auth = {"authorization": f"Bearer {token}"}
    c = tg.InferenceServerClient(address)
    out: dict[str, Any] = {
        "index": _call(c.get_model_repository_index),
        "unload": _call(c.unload_model, "gcn"),
        "stats": _call(c.get_inference_statistics),
        "log": _call(c.update_log_settings, {"log_verbose_level": 1, "log_info": True}),
        "ready_with_token": c.is_model_ready("gcn", headers=auth),
        "index_with_token": [m.name for m in c.get_model_repository_index(headers=auth).models],
    }
    for label, headers in (("stream", None), ("stream_with_token", auth)):
        got: queue.Queue[Any] = queue.Queue()
        c.start_stream(callback=lambda result, error, got=got: got.put((result, error)), headers=headers)
        with contextlib.suppress(InferenceServerException):  # refused already: the callback has the error
            c.async_stream_infer("gcn", _inputs(tg, [1, 2]))
        result, error = got.get(timeout=60)
        c.stop_stream()
        out[label] = {"error": _err(error)} if error is not None else {"labels": result.as_numpy("LABELS").tolist()}
    c.close()
    return out


SCENARIOS = {name[len("client_"):]: fn for name, fn in dict(globals()).items() if name.startswith("client_")}


def describe(modules: list[Any]) -> dict[str, Any]:
    """Every message's fields (number, type, repeated, type name, oneof) and every service method."""
    out: dict[str, Any] = {}

    def walk(d: Any) -> None:
        out[d.full_name] = {
            f.name: [f.number, f.type, bool(f.is_repeated),
                     (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else None,
                     f.containing_oneof.name if f.containing_oneof else None]
            for f in d.fields}
        for n in d.nested_types:
            walk(n)
        for e in d.enum_types:
            out[e.full_name] = {v.name: v.number for v in e.values}

    for mod in modules:
        for d in mod.DESCRIPTOR.message_types_by_name.values():
            walk(d)
        for e in mod.DESCRIPTOR.enum_types_by_name.values():
            out[e.full_name] = {v.name: v.number for v in e.values}
        for s in mod.DESCRIPTOR.services_by_name.values():
            out["service " + s.full_name] = {
                m.name: [m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
                for m in s.methods}
    return out


# ============================================================================ test side
def run_client(address: str, scenario: str, *args: Any, timeout: float = 240) -> Any:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "tests.test_triton_ext", address, scenario,
                           *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def server(tiny_repo):
    """Its own server over the session's repository: these tests unload models and change log levels."""
    from .serving import ServerThread

    srv = ServerThread(tiny_repo, {"poll_s": POLL_S}).start()
    yield srv
    srv.stop()


@pytest.fixture()
def native(server):
    from clients import GnnClient

    with GnnClient(server.address) as c:
        yield c


def test_wire_format_matches_tritonclient():
    """Every message, field and method gnnserve declares has tritonclient's name, number and type."""
    from clients._gen import inference_pb2

    theirs = run_client("-", "descriptors")
    ours = describe([inference_pb2])
    assert set(ours["service inference.GRPCInferenceService"]) == set(theirs["service inference.GRPCInferenceService"])
    for name, fields in ours.items():
        assert name in theirs, f"{name} is not in Triton's protocol"
        for fname, spec in fields.items():
            assert theirs[name].get(fname) == spec, f"{name}.{fname}: ours {spec}, Triton's {theirs[name].get(fname)}"
    # the service's own messages are complete (only the model configuration is a subset)
    for name in ("inference.ModelStatistics", "inference.InferStatistics", "inference.RepositoryIndexResponse.ModelIndex",
                 "inference.ModelStreamInferResponse", "inference.LogSettingsRequest.SettingValue"):
        assert set(ours[name]) == set(theirs[name]), name


def test_repository_index_unload_load(server, native):
    out = run_client(server.address, "repository")
    before = {(m["name"], m["version"]): m for m in out["index_before"]}
    assert set(before) == {("gcn", "1"), ("shadow", "1")}
    assert all(m["state"] == "READY" for m in before.values())

    assert out["ready_after_unload"] is False
    err = out["infer_after_unload"]["error"]
    assert err["status"] == "StatusCode.NOT_FOUND" and "gcn" in err["message"]
    unloaded = {(m["name"], m["version"]): m for m in out["index_unloaded"]}
    assert unloaded[("gcn", "1")]["state"] == "UNAVAILABLE" and unloaded[("gcn", "1")]["reason"] == "unloaded"
    assert unloaded[("shadow", "1")]["state"] == "READY"
    assert out["index_ready_only"] == [["shadow", "1", "READY"]]
    assert out["ready_after_polls"] is False, "the repository poller re-loaded an explicitly unloaded model"
    assert out["shadow_still_ready"] is True

    assert out["ready_after_load"] is True
    assert out["labels_after_load"] == out["labels_before"]
    ref = native.predict("gcn", [1, 50, 333, 799])
    assert out["labels_after_load"] == ref.labels.tolist()
    assert out["ready_after_version_unload"] == [False, False]
    assert out["ready_after_version_load"] is True

    errs = out["errors"]
    assert errs["load_unknown"]["error"]["status"] == "StatusCode.NOT_FOUND"
    assert errs["unload_unknown"]["error"]["status"] == "StatusCode.NOT_FOUND"
    assert errs["load_config"]["error"]["status"] == "StatusCode.UNIMPLEMENTED"
    assert "configuration override" in errs["load_config"]["error"]["message"]
    assert errs["bad_repository"]["error"]["status"] == "StatusCode.INVALID_ARGUMENT"
    # the native API sees the same served set again
    assert sorted(m.name for m in native.list_models()) == ["gcn", "shadow"]


def test_repository_through_aio_client(server, native):
    out = run_client(server.address, "repository_aio")
    assert out["ready_after_unload"] is False
    assert out["infer_after_unload"]["status"] == "StatusCode.NOT_FOUND"
    assert {(m["name"], m.get("state"), m.get("reason")) for m in out["index_unloaded"]} == {
        ("gcn", "READY", None), ("shadow", "UNAVAILABLE", "unloaded")}
    assert out["ready_after_load"] is True
    ref = native.predict("shadow", [3, 4], sampling_width=4, ppr_budget=16)
    assert out["labels_after_load"] == ref.labels.tolist()


def test_model_config_values(server, native):
    out = run_client(server.address, "config")
    info = native.get_model("shadow")
    cfg = out["shadow"]
    assert out["shadow_aio"] == cfg
    assert cfg["name"] == "shadow" and cfg["platform"] == "gnnserve" and cfg["backend"] == "gnnserve"
    assert int(cfg["max_batch_size"]) == info.max_nodes_per_request
    assert cfg["input"] == [  # every input optional: existing nodes, new nodes (features, neighbours), or both
        {"name": "NODE_IDS", "data_type": "TYPE_INT64", "dims": ["1"], "reshape": {}, "optional": True},
        {"name": "NEW_NODE_FEATURES", "data_type": "TYPE_FP32", "dims": [str(info.num_features)], "optional": True},
        {"name": "NEW_NODE_NEIGHBOR_COUNTS", "data_type": "TYPE_INT64", "dims": ["1"], "reshape": {}, "optional": True},
        # ragged: their length is the request's edge count (tritonclient's own ModelInput reads field 7 so)
        {"name": "NEW_NODE_NEIGHBORS", "data_type": "TYPE_INT64", "dims": ["-1"], "allow_ragged_batch": True,
         "optional": True},
        {"name": "NEW_NODE_EDGE_WEIGHTS", "data_type": "TYPE_FP32", "dims": ["-1"], "allow_ragged_batch": True,
         "optional": True},
    ]
    outputs = {o["name"]: o for o in cfg["output"]}
    assert list(outputs) == ["LABELS", "PROBABILITIES", "EMBEDDINGS"]
    assert outputs["LABELS"]["data_type"] == "TYPE_INT64" and outputs["LABELS"]["dims"] == ["1"]
    assert outputs["PROBABILITIES"]["data_type"] == "TYPE_FP32"
    assert outputs["PROBABILITIES"]["dims"] == [str(info.num_classes)] == ["4"]
    assert int(outputs["EMBEDDINGS"]["dims"][0]) > 0
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert "all" in cfg["version_policy"]
    params = {k: v["string_value"] for k, v in cfg["parameters"].items()}
    width = json.loads(params["sampling_width"])
    assert (width["min"], width["max"], width["default"]) == (0, info.max_sampling_width, info.default_sampling_width)
    budget = json.loads(params["ppr_budget"])
    assert (budget["min"], budget["max"], budget["default"]) == (1, info.max_ppr_budget, info.default_ppr_budget)
    loss = json.loads(params["max_accuracy_loss"])
    assert (loss["min"], loss["max"]) == (0.0, 1.0)
    assert params["architecture"] == info.architecture and params["extractor"] == "ppr"
    table = json.loads(params["knob_table"])
    assert len(table) == len(info.knob_table) > 0
    assert {(r["ppr_budget"], r["sampling_width"]) for r in table} == {
        (r.ppr_budget, r.sampling_width) for r in info.knob_table}
    # an L-hop model: the budget does not apply
    gcn = {k: v["string_value"] for k, v in out["gcn"]["parameters"].items()}
    assert json.loads(gcn["ppr_budget"])["max"] == 0 and gcn["extractor"] == "lhop"
    assert out["unknown"]["error"]["status"] == "StatusCode.NOT_FOUND"


def _stats(js: dict[str, Any]) -> dict[str, Any]:
    (m,) = js["model_stats"]
    s = m.get("inference_stats", {})
    d = {k: (int(s.get(k, {}).get("count", 0)), int(s.get(k, {}).get("ns", 0)))
         for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")}
    d["inference_count"] = int(m.get("inference_count", 0))
    d["execution_count"] = int(m.get("execution_count", 0))
    d["last_inference"] = int(m.get("last_inference", 0))
    d["batch_counts"] = sum(int(b["compute_infer"]["count"]) for b in m.get("batch_stats", []))
    return d


def test_statistics_count_kserve_and_native_requests(server, native):
    sends = 7
    out = run_client(server.address, "statistics", sends)
    b, a = _stats(out["before"]), _stats(out["after"])
    for key in ("refused", "refused_param", "refused_input"):
        assert out[key]["error"]["status"] == "StatusCode.INVALID_ARGUMENT", key
    assert "ppr_budget must be >= 1 and <= 2147483647" in out["refused_param"]["error"]["message"]
    assert a["success"][0] - b["success"][0] == sends
    # requests refused for their input (the unknown node id, the budget, the INT32 input) count nowhere, as native
    # Predict's refusals: the failures are requests the model took and could not answer (serve.stats)
    assert a["fail"] == b["fail"]
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert a[key][0] - b[key][0] == sends, key
        assert a[key][1] > b[key][1], f"{key} duration did not grow"
    # from the handler's start: above queue + compute by the handler's own time (perf_analyzer's overhead read 0)
    assert a["success"][1] - b["success"][1] > sum(a[k][1] - b[k][1] for k in ("queue", "compute_input",
                                                                              "compute_infer", "compute_output"))
    assert a["inference_count"] - b["inference_count"] == 3 * sends
    assert 1 <= a["execution_count"] - b["execution_count"] <= sends
    assert a["batch_counts"] == a["execution_count"]
    assert abs(a["last_inference"] / 1e3 - time.time()) < 120
    names = {(m["name"], m["version"]) for m in out["all"]["model_stats"]}
    assert names == {("gcn", "1"), ("shadow", "1")}
    assert _stats(out["aio"])["success"][0] == a["success"][0]

    # native Predict requests count in the same place
    for i in range(5):
        native.predict("shadow", [i, i + 1], sampling_width=2, ppr_budget=8)
    c = _stats(run_client(server.address, "read_statistics"))
    assert c["success"][0] - a["success"][0] == 5
    assert c["inference_count"] - a["inference_count"] == 10


def test_stream_of_1000_matches_unary(server):
    n = 1000
    out = run_client(server.address, "stream", n, "")
    assert out["errors"] == {}
    assert out["ids"] == [f"r{i}" for i in range(n)]  # every answer, in order
    assert out["mismatches"] == [] and out["unary_checked"] == n  # each equal to its own unary call


def test_stream_of_1000_survives_bad_requests(server):
    n = 1000
    out = run_client(server.address, "stream", n, "300:width,500:repeat,700:range")
    assert len(out["ids"]) == n
    assert set(out["errors"]) == {"300", "500", "700"}
    assert "INVALID_ARGUMENT" in out["errors"]["300"] and "sampling_width" in out["errors"]["300"]
    assert "more than once" in out["errors"]["500"]
    assert "out of range" in out["errors"]["700"]
    assert out["ids"] == [None if i in (300, 500, 700) else f"r{i}" for i in range(n)]  # in order
    assert out["mismatches"] == []
    assert out["unary_checked"] == n - 3  # every answer was compared with the unary answer to its request
    assert out["after"] and len(out["after"]) == 1


def test_stream_cancelled_by_the_client_leaves_nothing_running(server):
    out = run_client(server.address, "stream_cancel", 500)
    assert out["again"] == "again"
    gate = server.server.gate
    t_end = time.monotonic() + 60
    while gate.inflight and time.monotonic() < t_end:  # the cancelled stream's requests end or are cancelled
        time.sleep(0.05)
    assert gate.inflight == 0


def test_stream_through_aio_client(server):
    out = run_client(server.address, "stream_aio", 40)
    assert out["ids"] == [None if i == 3 else f"r{i}" for i in range(40)]
    assert list(out["errors"]) == ["3"] and "ppr_budget" in out["errors"]["3"]
    assert out["labels"] == out["unary"]


def test_log_settings(server):
    serve_logger = logging.getLogger("serve")
    old_level = serve_logger.level
    updates = [
        {"log_verbose_level": 1, "log_info": True, "log_warning": True, "log_error": True},
        {"log_verbose_level": 0},
        {"log_info": False},
        {"log_rotation": True},  # unknown
        {"log_info": True, "log_warning": False},  # Python's levels cannot express info on, warning off
        {"log_file": "/tmp/x.log"},
    ]
    try:
        out = run_client(server.address, "log_settings", json.dumps(updates))
        initial = out["initial"]
        assert set(initial) == {"log_info", "log_warning", "log_error", "log_verbose_level", "log_file", "log_format"}
        assert initial["log_format"]["string_param"] == "default"
        up = out["updates"]
        assert up[0]["log_verbose_level"]["uint32_param"] == 1 and up[0]["log_info"]["bool_param"] is True
        assert up[1]["log_verbose_level"] == {"uint32_param": 0} and up[1]["log_info"] == {"bool_param": True}
        assert up[2]["log_info"] == {"bool_param": False} and up[2]["log_warning"] == {"bool_param": True}
        for bad, text in ((3, "unknown log setting"), (4, "more severe"), (5, "log_file")):
            assert up[bad].get("error", {}).get("status") == "StatusCode.INVALID_ARGUMENT", up[bad]
            assert text in up[bad]["error"]["message"]
        assert out["final"] == up[2]
        # the server's loggers (this process: the server runs in a thread here) follow the last good update
        assert serve_logger.level == logging.WARNING
        assert logging.getLogger("kernels").level == logging.WARNING
        # and a verbose level turns DEBUG on
        run_client(server.address, "log_settings", json.dumps([{"log_verbose_level": 2, "log_info": True}]))
        assert serve_logger.level == logging.DEBUG
    finally:
        for name in ("serve", "kernels", "models"):
            logging.getLogger(name).setLevel(old_level)


def test_bearer_token_guards_the_extensions(tiny_repo):
    """The interceptor's auth covers the new RPCs, streams included: nothing happens without the token."""
    from .serving import ServerThread

    with ServerThread(tiny_repo, {"token": "s3cret-token", "poll_s": 0}) as srv:
        out = run_client(srv.address, "auth", "s3cret-token")
        ready_after = srv.server.registry.get("gcn").ready
        levels = logging.getLogger("serve").level
    for call in ("index", "unload", "stats", "log"):
        assert out[call]["error"]["status"] == "StatusCode.UNAUTHENTICATED", call
    assert "UNAUTHENTICATED" in out["stream"]["error"]["status"]
    assert out["ready_with_token"] is True and ready_after  # the unload without the token did nothing
    assert levels != logging.DEBUG
    assert sorted(out["index_with_token"]) == ["gcn", "shadow"]
    assert len(out["stream_with_token"]["labels"]) == 2


def test_unsupported_extensions_answer_unimplemented(server):
    """Trace settings and registering shared memory: UNIMPLEMENTED naming what is served. The shared-memory status
    lists no region and unregistering succeeds, as Triton with none registered: Triton's example scripts
    unregister every region first (a Triton user's report: they raised here)."""
    out = run_client(server.address, "unsupported")
    from serve.triton import EXTENSIONS

    assert out["metadata"]["extensions"] == list(EXTENSIONS)
    assert set(EXTENSIONS) == {"classification", "parameters", "model_repository", "model_configuration",
                               "statistics", "logging"}
    for call in ("system_register", "cuda_register", "trace"):
        err = out[call]["error"]
        assert err["status"] == "StatusCode.UNIMPLEMENTED", call
        assert "model_repository, model_configuration, statistics, logging" in err["message"], call
    for call in ("system_status", "cuda_status"):
        assert not out[call]["ok"].get("regions"), out[call]
    for call in ("system_unregister", "system_unregister_one", "cuda_unregister"):
        assert "ok" in out[call], out[call]
    assert "system shared memory is not supported" in out["system_register"]["error"]["message"]
    assert "CUDA shared memory is not supported" in out["cuda_register"]["error"]["message"]
    assert "no request tracing" in out["trace"]["error"]["message"]
    assert out["live"] is True


def test_classification_and_tensor_parameters(server):
    """``InferRequestedOutput("PROBABILITIES", class_count=k)``: Triton's classification output, BYTES [n, k]
    of ``"<probability>:<class>"``, most likely first (all classes when k is larger); a classification of
    LABELS and tensors in shared memory are refused, naming the parameter (a QA report: they were ignored)."""
    out = run_client(server.address, "classification")
    probs = np.asarray(out["probabilities"], dtype=np.float32)
    for row, top, full, label in zip(probs, out["top3"], out["all"], out["labels"], strict=True):
        order = np.argsort(-row, kind="stable")
        assert top == [f"{row[c]:f}:{c}" for c in order[:3]] and full == [f"{row[c]:f}:{c}" for c in order]
        assert int(top[0].split(":")[1]) == label
    for case, words in (("labels_classified", "applies to PROBABILITIES only"),
                        ("shm_output", "output PROBABILITIES: shared memory is not supported"),
                        ("shm_input", "input NODE_IDS: shared memory is not supported")):
        err = out[case]["error"]
        assert err["status"] == "StatusCode.INVALID_ARGUMENT" and words in err["message"], (case, err)


def test_repeated_outputs_are_refused_before_any_work(server, native):
    out = run_client(server.address, "repeated_outputs")
    flood = out["flood"]["error"]
    assert flood["status"] == "StatusCode.INVALID_ARGUMENT" and "output" in flood["message"]
    # refused before any work: the model saw none of the four requests (no success, no failure, no batch)
    b, a = _stats(out["stats_before"]), _stats(out["stats_after"])
    assert (a["success"], a["fail"], a["execution_count"]) == (b["success"], b["fail"], b["execution_count"])
    # the refusal is immediate; unrefused, this request would build 100,000 copies of a [4096, H] output
    assert out["flood_s"] < 30, f"the refusal of 100,000 repeated outputs took {out['flood_s']:.1f} s"
    assert out["twice"]["error"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "EMBEDDINGS requested more than once" in out["twice"]["error"]["message"]
    assert out["four"]["error"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "outputs" in out["four"]["error"]["message"]
    assert out["unknown"]["error"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "unknown outputs ['LOGITS']" in out["unknown"]["error"]["message"]
    assert out["same_after"] is True
    assert out["embedding_shape"][0] == 50
    assert native.predict("shadow", [9]).labels.shape == (1,)


def test_requested_outputs_rules():
    """The check itself, on real request messages (no server)."""
    from clients._gen import inference_pb2 as pb
    from serve.errors import InvalidArgument
    from serve.triton import requested_outputs

    def req(*names: str) -> pb.ModelInferRequest:
        r = pb.ModelInferRequest(model_name="m")
        for n in names:
            r.outputs.add(name=n)
        return r

    assert requested_outputs(req()) == ["LABELS", "PROBABILITIES"]
    assert requested_outputs(req("EMBEDDINGS", "LABELS")) == ["EMBEDDINGS", "LABELS"]
    for bad in (("LABELS", "LABELS"), ("X",), ("LABELS", "PROBABILITIES", "EMBEDDINGS", "EMBEDDINGS")):
        with pytest.raises(InvalidArgument):
            requested_outputs(req(*bad))
    with pytest.raises(InvalidArgument, match="asks for 100000 outputs"):  # refused on the count alone
        requested_outputs(req(*["EMBEDDINGS"] * 100_000))


def test_model_stats_failures_and_batches():
    """serve.stats on its own: failures, batches by size, the output remainder."""
    from serve.stats import ModelStats

    s = ModelStats()
    s.succeeded(4, 5_000_000, {"queue": 1.0, "subgraph": 0.5, "features": 0.5, "forward": 2.0})
    s.failed(3_000)
    s.succeeded(1, 5_000_000, {"queue": 1.0, "subgraph": 0.5, "features": 0.5, "forward": 2.0}, handler_ns=6_000_000)
    s.executed(4, 0.001, 0.002, 0.0005)
    s.executed(4, 0.001, 0.002, 0.0005)
    snap = s.snapshot()
    # the success time runs from the handler's start (6 ms), the stages from submit's (5 ms): perf_analyzer's
    # overhead, success minus queue and compute, is the 1 ms of the handler outside submit
    assert snap.success == (2, 11_000_000) and snap.fail == (1, 3_000)
    assert snap.queue == (2, 2_000_000) and snap.compute_input == (2, 2_000_000)
    assert snap.compute_infer == (2, 4_000_000) and snap.compute_output == (2, 2_000_000)
    assert snap.inference_count == 5 and snap.execution_count == 2
    assert snap.batches[4].count == 2 and snap.batches[4].compute_infer_ns == 4_000_000


if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[2]](sys.argv[1], *sys.argv[3:])))
