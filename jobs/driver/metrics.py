"""A running job's Prometheus metrics, served by its driver process (``metrics.port``).

What the driver knows after each micro-batch — the job's counters summed over its key groups
(:class:`ctiflow.jobs.core.counters.Counters`, through the progress file) and Spark's progress of the
batch — is exposed through ``prometheus_client`` (its HTTP server, in a daemon thread): nothing on the
data path calls into it. Names follow Prometheus's conventions: the unit in the name, ``_total``
for counters, labels of low cardinality only (job, stream, partition, operator, topic, stage;
never a key). Counters count over every run of the job's checkpoint (they restart from the
checkpoint's totals, as Prometheus expects of a restarted process's counters).

=====================================================  =======================================
``ctiflow_info{job}``                                   1; ``version`` label
``ctiflow_cti_timestamp_seconds{job}``                  the job's CTI (min over its streams)
``ctiflow_partition_cti_timestamp_seconds{…}``          a partition's CTI: its frontier − delay
``ctiflow_partition_event_time_lag_seconds{…}``         wall clock − the partition's CTI
``ctiflow_partition_idle{…}``                           1 while the source counts it idle
``ctiflow_partition_offsets_behind{…}``                 the partition's end − the next offset read
``ctiflow_records_received_total{…}``                   per stream and partition; ``…_late_total``
``ctiflow_records_released_total{job}``                 and ``…_dead_letter_total``, ``…_refused_total``;
``ctiflow_late_records_written_total{job}``             ``ctiflow_keys_expired_total{job}`` (state.ttl)
``ctiflow_records_written_total{job,topic}``            result records per topic
``ctiflow_batches_total{job}``                          micro-batches completed by this process
``ctiflow_batch_duration_seconds{job}``                 histogram of a batch's whole duration
``ctiflow_last_batch_duration_seconds{job,stage}``      the last batch's parts (Spark's durationMs)
``ctiflow_last_batch_timestamp_seconds{job}``           when the last batch completed
``ctiflow_state_bytes{job,operator}``                   state size per operator (and ``operator=""``: all)
``ctiflow_state_keys{job,operator}``                    keys with state per operator
=====================================================  =======================================
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from collections.abc import Iterable

from ctiflow.jobs.core import counters
from ctiflow.jobs.driver.config import JobConfig
from ctiflow.operators.errors import ConfigError
from ctiflow.jobs.driver.progress import FAILED_ATTEMPTS, records_read
from ctiflow.operators.events import CTI_INFINITY, CTI_NONE

#: Batch duration buckets (seconds): micro-batches take 0.1 s to minutes.
BATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 55, 90, 150, 300, float("inf"))


def _seconds(ms: int) -> float | None:
    return None if ms is None or ms <= CTI_NONE or ms >= CTI_INFINITY else ms / 1000


class JobMetrics:
    """The job's metrics for one driver process: :meth:`update` after each micro-batch,
    :meth:`serve` to expose them; a ``prometheus_client`` collector (:meth:`collect`)."""

    def __init__(self, cfg: JobConfig, *, ends=None, clock=time.time) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.cfg = cfg
        self.job = cfg.job
        self.clock = clock
        self._ends = ends  # (topic, [partitions]) → {partition: end offset}; None: not probed
        self._lock = threading.Lock()
        self.counters: dict = {}
        self.progress: dict | None = None
        self.behind: dict[tuple[str, int], int] = {}
        self.batches = 0
        self.failed_attempts = 0
        self.last_batch_at: float | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.batch_seconds = Histogram("ctiflow_batch_duration_seconds",
                                       counters.DRIVER_METRICS["ctiflow_batch_duration_seconds"], ["job"],
                                       buckets=BATCH_BUCKETS, registry=self.registry)
        self.registry.register(self)
        self.server = None
        self.port: int | None = None

    # -- input ------------------------------------------------------------------------------------
    def update(self, progress: dict, counters: dict) -> None:
        """One completed micro-batch: its Spark progress and the job's counters after it."""
        behind = self._offsets_behind(progress)
        with self._lock:
            self.progress, self.counters = progress, dict(counters)
            self.behind.update(behind)
            self.batches += 1
            self.failed_attempts += progress.get(FAILED_ATTEMPTS, 0)
            self.last_batch_at = self.clock()
        self.batch_seconds.labels(self.job).observe(
            progress.get("durationMs", {}).get("triggerExecution", 0) / 1000)

    def _offsets_behind(self, progress: dict) -> dict[tuple[str, int], int]:
        """Per stream and partition: the partition's end (high watermark) − the batch's end offset."""
        if self._ends is None:
            return {}
        out = {}
        for src, sp in zip(self.cfg.read_sources, progress.get("sources", [])):
            end = sp.get("endOffset")
            end = json.loads(end) if isinstance(end, str) else end
            read = {int(p): int(v) for p, v in (end or {}).items() if str(p).isdigit()}
            if not read:
                continue
            try:
                ends = self._ends(src.topic, sorted(read))
            except Exception:  # noqa: BLE001 - a broker hiccup: keep the last figures, never fail the job
                continue
            for p, offset in read.items():
                if p in ends:
                    out[(src.name, p)] = max(0, ends[p] - offset)
        return out

    # -- output -----------------------------------------------------------------------------------
    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint (``/metrics``); → the port it listens on. A port another
        process holds, or a host this machine cannot listen on, is a :class:`ConfigError`
        naming the field and the fix."""
        from prometheus_client import start_http_server

        try:
            self.server, thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL,):
                raise ConfigError(f"metrics.host: {host!r} is not an address of this machine to listen on "
                                  f"({reason}); use 127.0.0.1, 0.0.0.0 or one of its interfaces' "
                                  "addresses") from None
            raise ConfigError(f"metrics.port: {host}:{port} cannot be served ({reason}): another process (a "
                              "second job?) holds it; give each job its own metrics.port (or "
                              "CTIFLOW_METRICS_PORT), or 0 for any free port") from None
        self.port = self.server.server_port
        return self.port

    def close(self) -> None:
        getattr(self._ends, "close", lambda: None)()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def collect(self) -> Iterable:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        with self._lock:
            c, progress, behind = dict(self.counters), self.progress, dict(self.behind)
            batches, last_at, failed = self.batches, self.last_batch_at, self.failed_attempts
        job, now = self.job, self.clock()
        yield InfoMetricFamily("ctiflow", counters.DRIVER_METRICS["ctiflow"],
                               value={"job": job, "version": _version()})

        yield from _counter_families(c, job, now)
        labels = ["job", *counters.PARTITION]
        p_behind = GaugeMetricFamily("ctiflow_partition_offsets_behind",
                                     counters.DRIVER_METRICS["ctiflow_partition_offsets_behind"],
                                     labels=labels)
        for (stream, partition), n in sorted(behind.items()):
            p_behind.add_metric([job, stream, str(partition)], n)
        yield p_behind

        driver = counters.DRIVER_METRICS
        count = CounterMetricFamily("ctiflow_batches_total", driver["ctiflow_batches_total"], labels=["job"])
        count.add_metric([job], batches)
        yield count
        retried = CounterMetricFamily("ctiflow_task_attempts_failed_total",
                                      driver["ctiflow_task_attempts_failed_total"], labels=["job"])
        retried.add_metric([job], failed)
        yield retried
        parts = GaugeMetricFamily("ctiflow_last_batch_duration_seconds",
                                  driver["ctiflow_last_batch_duration_seconds"], labels=["job", "stage"])
        records = GaugeMetricFamily("ctiflow_last_batch_records", driver["ctiflow_last_batch_records"],
                                    labels=["job"])
        at = GaugeMetricFamily("ctiflow_last_batch_timestamp_seconds",
                               driver["ctiflow_last_batch_timestamp_seconds"], labels=["job"])
        if progress is not None:
            for stage, ms in sorted(progress.get("durationMs", {}).items()):
                parts.add_metric([job, stage], ms / 1000)
            n = records_read(progress)
            if n is not None:
                records.add_metric([job], n)
            at.add_metric([job], last_at)
        yield from (parts, records, at)


def _counter_families(c: dict, job: str, now: float) -> Iterable:
    """The families of :data:`ctiflow.jobs.core.counters.TABLE` from the job's counters ``c``: a counter of
    :attr:`~ctiflow.jobs.core.counters.Kind.COUNT` as a Prometheus counter, any other as a gauge; labels
    ``job`` + the counter's (a counter without the family's labels: ``""``); a timestamp in epoch
    seconds, with its lag family (wall clock − it)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for name, members in counters.families().items():
        widest = max(members, key=lambda m: len(m.labels))
        labels = ["job", *widest.labels]
        counting = widest.kind is counters.Kind.COUNT
        family = (CounterMetricFamily if counting else GaugeMetricFamily)(name, members[0].help,
                                                                          labels=labels)
        lag = GaugeMetricFamily(widest.lag, f"wall clock − {name}", labels=labels) if widest.lag else None
        for m in members:
            pad = [""] * (len(widest.labels) - len(m.labels))
            if m.labels:
                values = list(counters.labelled(c, m.name))
            else:
                values = [((), c.get(m.name, 0))] if m.name in c or counting else []
            for where, value in values:
                key = [job, *where, *pad]
                if m.timestamp:
                    value = _seconds(value)
                    if value is None:
                        continue
                    lag.add_metric(key, now - value)
                family.add_metric(key, value)
        yield family
        if lag is not None:
            yield lag


def kafka_ends(cfg: JobConfig):
    """``(topic, partitions) → {partition: high watermark}`` over one consumer of the job's
    connection (the reported end; tansu's lags by its last producer batch)."""
    from confluent_kafka import Consumer, TopicPartition

    from ctiflow.jobs.datapath.kafka import LIBRDKAFKA_LOG, base_config

    conf = {**base_config(cfg.kafka.bootstrap_servers, cfg.kafka.client_config()),
            "group.id": f"ctiflow-metrics-{cfg.job}", "enable.auto.commit": False}
    consumer: list = []

    def ends(topic: str, partitions: list[int]) -> dict[int, int]:
        if not consumer:
            consumer.append(Consumer(conf, logger=LIBRDKAFKA_LOG))
        return {p: consumer[0].get_watermark_offsets(TopicPartition(topic, p), timeout=2, cached=False)[1]
                for p in partitions}

    ends.close = lambda: consumer and consumer.pop().close()
    return ends


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ctiflow")
    except PackageNotFoundError:
        return "unknown"


def start(cfg: JobConfig) -> JobMetrics | None:
    """The job's metrics, served if ``metrics.port`` is set (else None)."""
    if cfg.metrics.port is None:
        return None
    metrics = JobMetrics(cfg, ends=kafka_ends(cfg))
    metrics.serve(cfg.metrics.port, cfg.metrics.host)
    return metrics
