"""Prometheus metrics of the server (one registry per server, exported on ``--metrics-port``).

Names follow Prometheus conventions (base units, ``_total`` counters):

* ``gnnserve_request_seconds{model, stage}``: per-request time by stage
  (``queue``, ``subgraph``, ``features``, ``forward``, ``total``);
* ``gnnserve_batch_targets{model}``: targets per executed batch;
* ``gnnserve_sampling_width{model}`` / ``gnnserve_ppr_budget{model}``: settings used per request;
* ``gnnserve_requests_total{model, method, code}``: finished RPCs by status code;
* ``gnnserve_predictions_total{model}``: node predictions returned;
* ``gnnserve_queue_targets{model}``: targets waiting in a model's batcher;
* ``gnnserve_models_loaded``: model versions being served.

Feature stores register their own metrics (hit ratios, Redis latency) on the same registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_KNOB_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    """All server metrics on one registry (a fresh one by default, so tests can run many servers)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram(
            "gnnserve_request_seconds", "Per-request time by pipeline stage", ["model", "stage"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.batch_targets = Histogram(
            "gnnserve_batch_targets", "Targets per executed batch", ["model"], buckets=_SIZE_BUCKETS, registry=r
        )
        self.sampling_width = Histogram(
            "gnnserve_sampling_width", "Sampling width used per request (0 = exact)", ["model"],
            buckets=_KNOB_BUCKETS, registry=r,
        )
        self.ppr_budget = Histogram(
            "gnnserve_ppr_budget", "PPR budget K used per request (0 = L-hop model)", ["model"],
            buckets=_KNOB_BUCKETS, registry=r,
        )
        self.requests = Counter(
            "gnnserve_requests", "Finished RPCs by status code", ["model", "method", "code"], registry=r
        )
        self.predictions = Counter("gnnserve_predictions", "Node predictions returned", ["model"], registry=r)
        self.queue_targets = Gauge("gnnserve_queue_targets", "Targets waiting in the batcher", ["model"], registry=r)
        self.inflight = Gauge("gnnserve_inflight_requests",
                              "RPCs admitted and not yet answered (health checks not counted)", registry=r)
        self._per_model: dict[str, tuple] = {}
        self._batch_children: dict[str, object] = {}
        self.models_loaded = Gauge("gnnserve_models_loaded", "Model versions being served", registry=r)

    def observe_request(self, model: str, timing: dict[str, float], width: int, budget: int, n: int) -> None:
        """Record one answered Predict: ``timing`` in milliseconds by stage."""
        per_model = self._per_model.get(model)
        if per_model is None:  # labelled children looked up once per model (labels() locks and hashes)
            per_model = self._per_model[model] = (
                self.sampling_width.labels(model), self.ppr_budget.labels(model), self.predictions.labels(model), {})
        width_h, budget_h, predictions, stages = per_model
        for stage, ms in timing.items():
            h = stages.get(stage)
            if h is None:
                h = stages[stage] = self.request_seconds.labels(model, stage)
            h.observe(ms / 1e3)
        width_h.observe(width)
        budget_h.observe(budget)
        predictions.inc(n)

    def observe_batch(self, model: str, targets: int) -> None:
        """Record one executed batch of ``targets`` targets."""
        h = self._batch_children.get(model)
        if h is None:
            h = self._batch_children[model] = self.batch_targets.labels(model)
        h.observe(targets)

    def serve_http(self, port: int, addr: str = "0.0.0.0") -> int:
        """Expose ``/metrics`` over HTTP; returns the bound port (``port=0`` picks a free one)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._http_server = server
        return int(server.server_port)

    def close(self) -> None:
        srv = getattr(self, "_http_server", None)
        if srv is not None:
            srv.shutdown()
            srv.server_close()
            self._http_server = None
