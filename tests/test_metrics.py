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
