"""serve.metrics: LightHistogram against prometheus_client's Histogram (its specification)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from serve.metrics import LightHistogram, ServerMetrics

BUCKETS = (0.0005, 0.001, 0.002, 0.5, 1.0, 10.0)


def _exposition(registry: CollectorRegistry) -> list[str]:
    return sorted(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)


def test_light_histogram_exposes_what_prometheus_histogram_does():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    light = LightHistogram("h_seconds", "doc", ["model", "stage"], BUCKETS, ours)
    reference = Histogram("h_seconds", "doc", ["model", "stage"], buckets=BUCKETS, registry=theirs)
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(0.01, 500), list(BUCKETS), [0.0, 11.0, 1e9]])  # bounds land inclusive
    for i, v in enumerate(values):
        labels = ("m", "total") if i % 3 else ("other", "queue")
        light.labels(*labels).observe(float(v))
        reference.labels(*labels).observe(float(v))
    got, want = _exposition(ours), _exposition(theirs)
    assert got == want
    assert any('le="0.0005"' in line for line in got) and any("_sum" in line for line in got)


def test_light_histogram_counts_every_observation_across_threads():
    reg = CollectorRegistry()
    h = LightHistogram("t", "doc", ["model"], (1.0, 2.0), reg)

    def work():
        for _ in range(20_000):
            h.labels("m").observe(1.5)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 't_count{model="m"} 80000.0' in generate_latest(reg).decode()


def test_light_histogram_checks_its_arguments():
    reg = CollectorRegistry()
    with pytest.raises(ValueError, match="strictly increasing"):
        LightHistogram("a", "doc", ["m"], (2.0, 1.0), reg)
    h = LightHistogram("b", "doc", ["m", "s"], (1.0,), reg)
    with pytest.raises(ValueError, match="2 label values expected, got 1"):
        h.labels("x")
    with pytest.raises(ValueError, match="Duplicated timeseries"):  # the registry refuses the name twice
        LightHistogram("b", "doc", ["m"], (1.0,), reg)


def test_server_metrics_record_a_request_and_a_batch():
    m = ServerMetrics()
    m.observe_request("g", {"queue": 0.1, "subgraph": 0.2, "features": 0.0, "forward": 0.3, "total": 0.7}, 8, 0, 3)
    m.observe_batch("g", 3)
    m.count_request("g", "Predict", "OK")
    m.count_request("g", "Predict", "OK")
    m.set_queue("g", 5)
    text = generate_latest(m.registry).decode()
    for line in ('gnnserve_request_seconds_bucket{le="0.001",model="g",stage="total"} 1.0',
                 'gnnserve_request_seconds_bucket{le="0.0005",model="g",stage="total"} 0.0',
                 'gnnserve_sampling_width_bucket{le="8.0",model="g"} 1.0',
                 'gnnserve_batch_targets_bucket{le="4.0",model="g"} 1.0',
                 'gnnserve_requests_total{code="OK",method="Predict",model="g"} 2.0',
                 'gnnserve_queue_targets{model="g"} 5.0',
                 'gnnserve_predictions_total{model="g"} 3.0'):
        assert line in text.splitlines(), line


# ---------------------------------------------------------------------------- Triton's metric names
def _triton_values(port: int, name: str, model: str = "gcn") -> dict[str, float]:
    """``{reason or "": value}`` of ``name``'s samples for ``model`` (``reason`` only on the failure counter)."""
    from .serving import metric_samples

    return {lab.get("reason", ""): v for lab, v in metric_samples(port, name)
            if lab.get("model") == model and lab.get("version") == "1"}


def _wait_until(check, timeout: float = 30.0) -> None:
    import time

    t_end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < t_end, "condition not met in time"
        time.sleep(0.02)


def test_failure_reasons_of_exceptions_and_model_stats():
    import asyncio

    from serve.errors import DeadlineExceeded, InvalidArgument, Overloaded, Unavailable
    from serve.stats import ModelStats, failure_reason

    assert failure_reason(asyncio.CancelledError()) == "CANCELED"
    for exc in (Overloaded("queue full"), DeadlineExceeded("late"), Unavailable("stopping")):
        assert failure_reason(exc) == "REJECTED"
    assert failure_reason(InvalidArgument("bad id")) == "BACKEND" == failure_reason(RuntimeError("x"))
    assert failure_reason(KeyboardInterrupt()) == "OTHER"
    st = ModelStats()
    for reason in ("REJECTED", "REJECTED", "CANCELED", "nonsense"):
        st.failed(1000, reason)
    snap = st.snapshot()
    assert snap.fail == (4, 4000)
    assert snap.fail_reasons == {"REJECTED": 2, "CANCELED": 1, "BACKEND": 0, "OTHER": 1}


def test_cpu_metrics_read_proc(tmp_path):
    """nv_cpu_utilization is the busy share of the jiffies since the previous scrape; memory used is MemTotal -
    MemAvailable, as Triton computes them (here from a /proc written by the test)."""
    from serve.metrics import TritonCollector

    (tmp_path / "meminfo").write_text("MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n")
    # user nice system idle iowait irq softirq steal
    (tmp_path / "stat").write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    reg = CollectorRegistry()
    TritonCollector(lambda: {}, reg, proc=str(tmp_path))
    (tmp_path / "stat").write_text("cpu  160 0 70 900 70 0 0 0 0 0\n")  # busy +80 of +200
    text = generate_latest(reg).decode().splitlines()
    assert "nv_cpu_utilization 0.4" in text
    assert "nv_cpu_memory_total_bytes 1.024e+06" in text
    assert "nv_cpu_memory_used_bytes 768000.0" in text
    text = generate_latest(reg).decode().splitlines()  # nothing since the last scrape: 0, not a division by zero
    assert "nv_cpu_utilization 0.0" in text
    (tmp_path / "stat").unlink()  # unreadable: the CPU figures are left out, the scrape still answers
    assert not any(line.startswith("nv_cpu_utilization") for line in generate_latest(reg).decode().splitlines())


def test_triton_metrics_of_a_served_model(tiny_repo):
    """A real server: Triton's per-model metrics count the answered requests, their nodes and batches, a call
    whose deadline passed in the queue, one refused for a full queue (REJECTED) and a cancelled one (CANCELED);
    the pending count sees requests waiting for their batch; the samples carry Triton's exact names (no ``_total``) and the real machine's RAM."""
    import grpc

    from clients._gen import gnnserve_pb2 as pb
    from clients._gen import gnnserve_pb2_grpc as pbg

    from .serving import ServerThread, metric_samples

    opts = {"metrics_port": 0, "poll_s": 0, "runtime_kw": {"max_delay_ms": 4000.0, "inline_max_targets": 0,
                                                              "max_queue_targets": 8}}
    with ServerThread(tiny_repo, opts) as srv, grpc.insecure_channel(srv.address) as ch:
        port = srv.server.metrics_port
        stub = pbg.GnnServiceStub(ch)
        assert _triton_values(port, "nv_inference_request_success") == {"": 0.0}
        futures = [stub.Predict.future(pb.PredictRequest(model="gcn", nodes=[i, i + 1]), timeout=60)
                   for i in range(3)]
        # the three wait for their batch (the batcher holds it up to 4 s for more targets)
        _wait_until(lambda: _triton_values(port, "nv_inference_pending_request_count").get("") == 3.0, 3.5)
        for f in futures:
            assert len(f.result().labels) == 2
        assert _triton_values(port, "nv_inference_pending_request_count") == {"": 0.0}
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(pb.PredictRequest(model="gcn", nodes=[1]), timeout=0.2)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        def failures() -> dict[str, float]:
            return _triton_values(port, "nv_inference_request_failure")

        # cancelled by gRPC at its deadline (CANCELED) or dropped by the batcher for it (REJECTED): a race
        _wait_until(lambda: sum(failures().values()) == 1.0)
        # and gone from the queue (dropped when the batch it waited for came due), so the next one waits alone
        _wait_until(lambda: _triton_values(port, "nv_inference_pending_request_count").get("") == 0.0)
        late = stub.Predict.future(pb.PredictRequest(model="gcn", nodes=[2]), timeout=60)
        _wait_until(lambda: _triton_values(port, "nv_inference_pending_request_count").get("") == 1.0)
        with pytest.raises(grpc.RpcError) as info:  # 8 more targets than the queue's 8 holds beside it
            stub.Predict(pb.PredictRequest(model="gcn", nodes=list(range(8))), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        late.cancel()
        _wait_until(lambda: sum(failures().values()) == 3.0)
        with pytest.raises(grpc.RpcError) as info:  # refused for its input: not a failure of the model (serve.stats)
            stub.Predict(pb.PredictRequest(model="gcn", nodes=[10**6]), timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        f = failures()
        assert sum(f.values()) == 3.0
        assert set(f) == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}
        assert f["REJECTED"] >= 1 and f["CANCELED"] >= 1 and f["BACKEND"] == f["OTHER"] == 0
        assert _triton_values(port, "nv_inference_request_success") == {"": 3.0}
        assert _triton_values(port, "nv_inference_count") == {"": 6.0}
        assert 1 <= _triton_values(port, "nv_inference_exec_count")[""] <= 3
        dur = {k: _triton_values(port, f"nv_inference_{k}_duration_us")[""]
               for k in ("request", "queue", "compute_input", "compute_infer", "compute_output")}
        assert dur["queue"] > 3 * 1e6  # each waited most of the 4 s for its batch
        assert dur["compute_infer"] > 0 and dur["request"] >= dur["queue"] + dur["compute_infer"]
        # the other model is listed, idle
        assert _triton_values(port, "nv_inference_request_success", "shadow") == {"": 0.0}

        import urllib.request

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "# TYPE nv_inference_request_success untyped" in text.splitlines()
        assert "nv_inference_request_success_total" not in text
        with open("/proc/meminfo") as f:
            mem_total = int(f.readline().split()[1]) * 1024
        assert [v for _, v in metric_samples(port, "nv_cpu_memory_total_bytes")] == [float(mem_total)]
        (util,) = [v for _, v in metric_samples(port, "nv_cpu_utilization")]
        assert 0.0 <= util <= 1.0
