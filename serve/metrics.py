"""Prometheus metrics of the server (one registry per server, exported on ``--metrics-port``).

Names follow Prometheus conventions (base units, ``_total`` counters):

* ``gnnserve_request_seconds{model, stage}``: per-request time by stage
  (``queue``, ``subgraph``, ``features``, ``forward``, ``total``);
* ``gnnserve_batch_targets{model}``: targets per executed batch;
* ``gnnserve_sampling_width{model}`` / ``gnnserve_ppr_budget{model}``: settings used per request;
* ``gnnserve_requests_total{model, method, code}``: finished RPCs by status code (``model`` empty for
  NOT_FOUND: a client's unknown names do not become series; and for the calls refused UNAUTHENTICATED for
  their token, which ``serve.interceptors.BearerAuthInterceptor`` counts, streams included);
* ``gnnserve_predictions_total{model}``: node predictions returned;
* ``gnnserve_queue_targets{model}``: targets waiting in a model's batcher (set after every request's
  outcome and whenever the batcher's loop changes its queue: back to 0 once an overload burst is over);
* ``gnnserve_models_loaded``: model versions being served;
* ``gnnserve_cache_lookups_total`` / ``gnnserve_cache_rows`` / ``gnnserve_cache_bytes``: the per-node
  caches of every model version (:class:`CacheCollector`);
* Triton's own names, so dashboards and alerts written for Triton work unchanged (:class:`TritonCollector`):
  ``nv_inference_request_success`` / ``_failure{reason}`` / ``nv_inference_count`` / ``nv_inference_exec_count`` /
  ``nv_inference_*_duration_us`` / ``nv_inference_pending_request_count`` per model version, ``nv_cpu_*`` and, on
  a GPU, ``nv_gpu_*``.

The histograms are :class:`LightHistogram` (the same exposition as ``prometheus_client.Histogram``
at a fraction of its cost per observation; a one-node Predict records eight). Feature stores
register their own metrics (hit ratios, Redis latency) on the same registry.
"""

from __future__ import annotations

import bisect
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

__all__ = ["CacheCollector", "LightHistogram", "ServerMetrics", "TritonCollector"]

log = logging.getLogger(__name__)

# from 0.1 ms: a one-node request's server time is a fraction of a millisecond (docs/BENCHMARKS.md)
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 10.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_KNOB_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _Series:
    """One labelled series of a :class:`LightHistogram`: per-bucket counts (not cumulative) and a sum."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self._bounds, value)  # buckets are "less than or equal to" their bound
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self._counts), self._sum


class LightHistogram:
    """A labelled Prometheus histogram for the per-request path, exported through the registry's
    custom-collector interface.

    ``prometheus_client.Histogram`` takes a lock and increments two values per observation behind
    several layers of calls; a one-node Predict records eight of them, which came to about 10 us of
    its 100 us of server time here. This keeps one count per bucket and a sum per series (a
    bisection and one lock), and builds the cumulative buckets only when ``/metrics`` is scraped:
    the same exposition (``_bucket{le=...}``, ``_count``, ``_sum``), without ``_created``.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"{name}: buckets must be strictly increasing, got {buckets}")
        self._series: dict[tuple[str, ...], _Series] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: str) -> _Series:
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(key)}")
        series = self._series.get(key)
        if series is None:
            with self._lock:
                series = self._series.setdefault(key, _Series(self.bounds))
        return series

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            items = list(self._series.items())
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for key, series in items:
            counts, total = series.snapshot()
            cumulative, running = [], 0
            for le, c in zip(les, counts, strict=True):
                running += c
                cumulative.append((le, running))
            family.add_metric(list(key), cumulative, total)
        yield family


class CacheCollector:
    """The per-node caches and the batch counts of every served model version, read when ``/metrics`` is
    scraped:

    * ``gnnserve_cache_lookups_total{model, version, cache, result}``: rows looked up, ``result``
      ``hit`` or ``miss`` (computed and stored);
    * ``gnnserve_cache_rows{model, version, cache}``: rows held;
    * ``gnnserve_cache_bytes{model, version, cache}``: memory of the tables allocated;
    * ``gnnserve_serving_path_switched_off{model, version, path}``: 1 for an opt-in serving path a
      failed batch switched off (``ModelRuntime.switched_off``; its batches take the next path);
    * ``gnnserve_batches_total{model, version, where}``: batches run, ``where`` ``inline`` (on the event
      loop) or ``worker``; ``deferred`` counts the batches among the worker's that were due inline but would
      have waited for the live graph's lock (``DynamicBatcher.batches_deferred``).

    ``cache`` is ``projection`` (first-layer projections), ``projection_cpu`` (a GPU model's CPU
    copy), ``activation`` (a plain model's first-layer output per width), ``resident``, and on a stateless
    replica ``graph_rows`` (rows and lists read from Redis) and ``ppr_reach`` (a hit: an outdated PPR list whose
    push's reach was held; the graph's, repeated under each of its models). ``snapshot`` returns
    ``{name: {version: runtime}}``; a runtime gives ``cache_stats()``.
    """

    def __init__(self, snapshot: Callable[[], dict[str, dict[int, Any]]], registry: CollectorRegistry) -> None:
        self._snapshot = snapshot
        registry.register(self)

    def _families(self) -> tuple[CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
                                 CounterMetricFamily]:
        labels = ["model", "version", "cache"]
        return (CounterMetricFamily("gnnserve_cache_lookups", "Rows looked up in a per-node cache, by result",
                                    labels=[*labels, "result"]),
                GaugeMetricFamily("gnnserve_cache_rows", "Rows held by a per-node cache", labels=labels),
                GaugeMetricFamily("gnnserve_cache_bytes", "Memory of a per-node cache's tables", labels=labels),
                GaugeMetricFamily("gnnserve_serving_path_switched_off",
                                  "1: an opt-in serving path a failed batch switched off", labels=["model", "version",
                                                                                                  "path"]),
                CounterMetricFamily("gnnserve_batches", "Batches run, by where: on the event loop (inline), in the "
                                    "model's worker, and of those deferred (due inline, the live graph's lock wanted)",
                                    labels=["model", "version", "where"]))

    def describe(self) -> list[Any]:
        return list(self._families())

    def collect(self) -> Iterator[Any]:
        lookups, rows, nbytes, off, batches = self._families()
        for name, versions in sorted(self._snapshot().items()):
            for version, rt in sorted(versions.items()):
                for cache, st in rt.cache_stats().items():
                    key = [name, str(version), cache]
                    lookups.add_metric([*key, "hit"], st["hits"])
                    lookups.add_metric([*key, "miss"], st["misses"])
                    rows.add_metric(key, st["rows"])
                    nbytes.add_metric(key, st["bytes"])
                for path in getattr(rt, "switched_off", ()):
                    off.add_metric([name, str(version), path], 1)
                b = getattr(rt, "batcher", None)
                if b is not None:
                    batches.add_metric([name, str(version), "inline"], b.batches_inline)
                    batches.add_metric([name, str(version), "worker"], b.batches_worker)
                    batches.add_metric([name, str(version), "deferred"], b.batches_deferred)
        yield from (lookups, rows, nbytes, off, batches)


def _proc_cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from the first line of ``/proc/stat``; None where it is unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest is inside user)
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def _proc_memory(path: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(total, used) bytes of RAM, used = MemTotal - MemAvailable (as Triton computes it); None where unreadable."""
    values: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(values) != 2:
        return None
    return values["MemTotal"], values["MemTotal"] - values["MemAvailable"]


def _gpu_samples() -> list[tuple[str, dict[str, float]]]:
    """Per GPU of this process: (``GPU-<uuid>``, {metric suffix: value}). Through NVML (``pynvml``) where it is
    installed (no CUDA context made); otherwise torch's view of the current device, and only once this process
    has initialised CUDA (a scrape never starts a context). Empty on a machine without a GPU in use."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    out: list[tuple[str, dict[str, float]]] = []
    try:
        import pynvml  # nvidia-ml-py: the library Triton's DCGM figures come from
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                values = {"memory_total_bytes": float(mem.total), "memory_used_bytes": float(mem.used),
                          "utilization": pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0}
                try:  # milliwatts; not every board reports power
                    values["power_usage"] = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
                    values["power_limit"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
                except pynvml.NVMLError:
                    pass
                out.append((uuid if isinstance(uuid, str) else uuid.decode(), values))
            return out
        except pynvml.NVMLError:
            out = []
    dev = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(dev)
    uuid = str(getattr(torch.cuda.get_device_properties(dev), "uuid", dev))
    return [(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}",
             {"memory_total_bytes": float(total), "memory_used_bytes": float(total - free)})]


class TritonCollector:
    """Triton's Prometheus metrics, by Triton's names and labels, read when ``/metrics`` is scraped, so that a
    Grafana dashboard or an alert written for Triton works on gnnserve unchanged:

    * per model version (labels ``model``, ``version``), from its :class:`serve.stats.ModelStats` (the same
      counters as the KServe statistics extension: native ``Predict`` and KServe requests alike):
      ``nv_inference_request_success``, ``nv_inference_request_failure`` (label ``reason``: ``REJECTED``,
      ``CANCELED``, ``BACKEND``, ``OTHER``), ``nv_inference_count`` (nodes answered),
      ``nv_inference_exec_count`` (batches run), ``nv_inference_request_duration_us`` (successful requests, from
      their handler's start), ``nv_inference_queue_duration_us``, ``nv_inference_compute_input_duration_us``,
      ``nv_inference_compute_infer_duration_us``, ``nv_inference_compute_output_duration_us`` (cumulative
      microseconds) and ``nv_inference_pending_request_count`` (requests waiting for a batch);
    * ``nv_cpu_utilization`` (all cores, 0 to 1, since the previous scrape), ``nv_cpu_memory_total_bytes``,
      ``nv_cpu_memory_used_bytes`` (from ``/proc``; absent where it is unreadable);
    * ``nv_gpu_memory_total_bytes``, ``nv_gpu_memory_used_bytes`` and, through NVML where ``pynvml`` is
      installed, ``nv_gpu_utilization``, ``nv_gpu_power_usage``, ``nv_gpu_power_limit`` (label ``gpu_uuid``),
      once this process uses a GPU.

    Triton declares its counters ``counter`` without the ``_total`` suffix that ``prometheus_client`` adds to
    every counter's name; these are declared untyped instead, so the sample names are Triton's exactly
    (``rate()`` and ``increase()`` work on them as on Triton's).
    """

    _COUNTERS = (
        ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
        ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
        ("nv_inference_count", "Number of inferences performed (a node answered is one)"),
        ("nv_inference_exec_count", "Number of model executions performed (batches)"),
        ("nv_inference_request_duration_us", "Cumulative request duration in microseconds (successful requests)"),
        ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
        ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds"),
        ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds"),
        ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds"),
    )
    _GPU = (("utilization", "GPU utilization rate [0.0 - 1.0]"), ("memory_total_bytes", "GPU total memory, in bytes"),
            ("memory_used_bytes", "GPU used memory, in bytes"), ("power_usage", "GPU power usage in watts"),
            ("power_limit", "GPU power management limit in watts"))

    def __init__(self, snapshot: Callable[[], dict[str, dict[int, Any]]], registry: CollectorRegistry | None,
                 proc: str = "/proc") -> None:
        self._snapshot = snapshot
        self._stat, self._meminfo = f"{proc}/stat", f"{proc}/meminfo"
        self._cpu_last = _proc_cpu_times(self._stat)  # utilisation is over the time since the previous scrape
        self._cpu_lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Any]:
        return []  # families are built per scrape (which of the CPU and GPU ones exist depends on the machine)

    def _cpu_utilization(self) -> float | None:
        now = _proc_cpu_times(self._stat)
        if now is None:
            return None
        with self._cpu_lock:
            last, self._cpu_last = self._cpu_last, now
        if last is None or now[1] <= last[1]:
            return 0.0
        return min(1.0, max(0.0, (now[0] - last[0]) / (now[1] - last[1])))

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import Metric

        fams = {name: Metric(name, doc, "unknown") for name, doc in self._COUNTERS}
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=["model", "version"])

        def add(name: str, labels: dict[str, str], value: float) -> None:
            fams[name].add_sample(name, labels, value)

        for name, versions in sorted(self._snapshot().items()):
            for version, rt in sorted(versions.items()):
                st = rt.stats.snapshot()
                lab = {"model": name, "version": str(version)}
                add("nv_inference_request_success", lab, st.success[0])
                for reason, n in st.fail_reasons.items():
                    add("nv_inference_request_failure", {**lab, "reason": reason}, n)
                add("nv_inference_count", lab, st.inference_count)
                add("nv_inference_exec_count", lab, st.execution_count)
                for metric, (_, ns) in (("request", st.success), ("queue", st.queue),
                                        ("compute_input", st.compute_input), ("compute_infer", st.compute_infer),
                                        ("compute_output", st.compute_output)):
                    add(f"nv_inference_{metric}_duration_us", lab, ns // 1000)
                b = getattr(rt, "batcher", None)
                pending.add_metric([name, str(version)], b.queued_requests if b is not None else 0)
        yield from fams.values()
        yield pending
        util = self._cpu_utilization()
        if util is not None:
            yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=util)
        mem = _proc_memory(self._meminfo)
        if mem is not None:
            yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=mem[0])
            yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=mem[1])
        try:
            gpus = _gpu_samples()
        except Exception as exc:  # a scrape must not fail for a GPU query: the request metrics above still count
            log.warning("GPU metrics unreadable: %s", exc)
            gpus = []
        for suffix, doc in self._GPU:
            rows = [(uuid, v[suffix]) for uuid, v in gpus if suffix in v]
            if rows:
                fam = GaugeMetricFamily(f"nv_gpu_{suffix}", doc, labels=["gpu_uuid"])
                for uuid, value in rows:
                    fam.add_metric([uuid], value)
                yield fam


class ServerMetrics:
    """All server metrics on one registry (a fresh one by default, so tests can run many servers)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.request_seconds = LightHistogram(
            "gnnserve_request_seconds", "Per-request time by pipeline stage", ["model", "stage"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.batch_targets = LightHistogram(
            "gnnserve_batch_targets", "Targets per executed batch", ["model"], buckets=_SIZE_BUCKETS, registry=r
        )
        self.sampling_width = LightHistogram(
            "gnnserve_sampling_width", "Sampling width used per request (0 = exact)", ["model"],
            buckets=_KNOB_BUCKETS, registry=r,
        )
        self.ppr_budget = LightHistogram(
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
        self._children: dict[tuple[str, ...], Any] = {}  # labelled children of the counter and gauge, by labels
        self.models_loaded = Gauge("gnnserve_models_loaded", "Model versions being served", registry=r)
        # the live graph (serve.live); ``graph`` = the first 12 characters of the dataset fingerprint
        self.graph_updates = Counter("gnnserve_graph_updates", "Graph updates applied (UpdateGraph and log replay)",
                                     ["graph"], registry=r)
        self.graph_version = Gauge("gnnserve_graph_version", "Version of each live graph", ["graph"], registry=r)
        self.update_seconds = LightHistogram(
            "gnnserve_graph_update_seconds", "Update to visible: validation, log append and apply", ["graph"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.rows_invalidated = Counter("gnnserve_graph_rows_invalidated",
                                        "Cached rows dropped by graph updates, per cache", ["graph", "cache"],
                                        registry=r)
        self.update_log_bytes = Gauge("gnnserve_graph_update_log_bytes", "Size of each graph's update log",
                                      ["graph"], registry=r)
        self.ppr_stale_lists = Gauge("gnnserve_ppr_stale_lists",
                                     "PPR lists updates left stale (--ppr-eager-lists): pushed by the lookups that "
                                     "need them until the refresh thread stores them", ["graph"], registry=r)
        self.ppr_refreshed_lists = Counter(
            "gnnserve_ppr_refreshed_lists", "Stale PPR lists the refresh thread pushed (or lookups handed over) and "
            "stored (outcome=stored), or left stale because an update came between push and store (voided)",
            ["graph", "outcome"], registry=r)

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
        self.batch_targets.labels(model).observe(targets)

    def set_queue(self, model: str, targets: int) -> None:
        """The targets waiting in ``model``'s batcher now."""
        g = self._children.get(("queue_targets", model))
        if g is None:
            g = self._children[("queue_targets", model)] = self.queue_targets.labels(model)
        g.set(targets)

    def count_request(self, model: str, method: str, code: str) -> None:
        """One finished RPC with status ``code``."""
        c = self._children.get(("requests", model, method, code))
        if c is None:
            c = self._children[("requests", model, method, code)] = self.requests.labels(model, method, code)
        c.inc()

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
