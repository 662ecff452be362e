"""Build and run a job's Spark query: sources → adapter (CTIs, operators) → Kafka sink.

How StreamInsight's settings map onto Spark (also in the README's time model):

* ``delay`` → each Kafka partition's CTI is its largest start − delay, and a stream's CTI the
  **minimum** over its partitions that are not idle (:class:`ctiflow.operators.time.PartitionCtis`,
  Flink's per-partition watermarks). Not Spark's watermark: that is one ``max(start) − delay``
  over all rows of all partitions, so the faster partition would declare the slower one's
  in-order events late, by an amount that depends on the batch size. The source sends every
  key group each partition's progress and the batch's idle set
  (:mod:`ctiflow.jobs.datapath.source.reader`); each group computes the same CTI and keeps it in its
  state. Spark never drops a row for being
  late: our time layer sends late rows to the ``late`` topic.
* ``idle_timeout`` → Flink's ``withIdleness``: a partition with nothing to read for that long
  (processing time) stops holding the CTI back; an empty partition is idle from the start.
* ``frequency`` → a CTI at each micro-batch boundary; ``frequency.events`` caps a batch
  (``maxOffsetsPerTrigger``). Events within the delay of their partition give the same results
  however the input is cut, so this only changes latency, never results.
* ``flush_at_end`` → a bounded run (``trigger: available_now`` / ``ctiflow run --until-end``):
  the source marks the batch that reaches the end offsets and the adapter advances every key
  group to +∞ once every stream has ended.
* CTI import (``reference.sync: import``): the job's CTI is the fast stream's; the reference
  stream follows it. ``sync: min``: the older of both streams' CTIs — the join stalls while
  the reference stream is silent, as StreamInsight's join does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import LOCAL_MASTER, JobConfig, duration_ms
from ctiflow.jobs.avro.serde import REGISTRY_SECRETS_ENV, SCHEMA_PATH_ENV
from ctiflow.jobs.datapath.kafka import (CLIENT_SECRETS_ENV, create_topics, public_client, publish_schemas,
                                         topic_partitions, wait_for_broker)
from ctiflow.jobs.datapath.own_topics import stack_error_in
from ctiflow.jobs.driver.checkpoint import (FILE_SYSTEM_MANAGER, MANAGER_CLASS, CheckpointDir, CounterReader,
                                            ProgressLog, group_labels, read_counters, replay_through,
                                            reset_uncommitted_checkpoint, start_offsets, state_layout)
from ctiflow.jobs.driver.jvm import (driver_java_options, gateway, java_environment, launcher_settings,
                                     spark_log_path)
from ctiflow.jobs.driver.masters import check_master
from ctiflow.jobs.driver.progress import FAILED_ATTEMPTS, RunSummary
from ctiflow.jobs.core.plan import Plan
from ctiflow.jobs.driver.metrics import start as start_metrics
from ctiflow.operators.errors import ConfigError
from ctiflow.operators.time import CTI_NONE


def executor_credentials(cfg: JobConfig) -> dict[str, str]:
    """The job's secrets (SASL, other secret client settings such as ``ssl.key.password``, the
    registry's) as the variables the executors' clients read
    (:func:`ctiflow.jobs.datapath.kafka.env_credentials`,
    :func:`ctiflow.jobs.avro.serde.registry_client`). Spark redacts these names in its UI and logs.
    They reach the executors as ``spark.executorEnv.*`` set on the context's ``SparkConf`` through
    py4j, never on a command line (:func:`ctiflow.jobs.driver.jvm.launch_settings_of` says how, locally
    and on a cluster)."""
    k = cfg.kafka
    found = {}
    if k.sasl_username and k.sasl_password:
        found |= {"CTIFLOW_SASL_USERNAME": k.sasl_username,
                  "CTIFLOW_SASL_PASSWORD": k.sasl_password.get_secret_value()}
    if k.client_secrets:
        found[CLIENT_SECRETS_ENV] = json.dumps({n: v.get_secret_value() for n, v in k.client_secrets.items()})
    if k.schema_registry.secrets:
        found[REGISTRY_SECRETS_ENV] = json.dumps({n: v.get_secret_value()
                                                  for n, v in k.schema_registry.secrets.items()})
    if os.environ.get(SCHEMA_PATH_ENV):  # not a secret, but the executors' decoders need the same schemas
        found[SCHEMA_PATH_ENV] = os.environ[SCHEMA_PATH_ENV]
    return found


def spark_options(cfg: JobConfig | None, log: Path, app: str = "ctiflow") -> dict[str, str]:
    """The session's Spark settings: the job's ``spark`` section over ctiflow's defaults."""
    spark_cfg = cfg.spark if cfg else None
    return {
        # Spark's own log to a file (jobs/spark-log4j2.properties), no progress bars:
        # the console shows ctiflow's progress lines only.
        "spark.driver.extraJavaOptions":
            driver_java_options(log),
        "spark.ui.showConsoleProgress": "false",
        "spark.master": spark_cfg.master if spark_cfg else LOCAL_MASTER,
        "spark.app.name": app,
        "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions if cfg else 2),
        "spark.ui.enabled": "false",
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        # A commit writes the batch's changes, not a snapshot of the store (snapshots are made in
        # the background): docs/performance.md#where-the-time-goes.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Checkpoint files (offset and commit logs, state changelogs) through Hadoop's FileSystem
        # API, not FileContext: without Hadoop's native library, every FileContext rename runs
        # `readlink` as a child process four times (measured: ≈ 70 checkpoint-file process starts
        # a micro-batch; the state commit 33 → 3 ms a partition,
        # docs/changelog.md#one-state-variable-and-no-process-starts). Its files appear by a rename:
        # atomic on a local or shared POSIX disk and on HDFS; an object store may want its own manager
        # (spark.conf).
        MANAGER_CLASS: FILE_SYSTEM_MANAGER,
        "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
        "spark.python.worker.reuse": "true",
        # A worker that dies natively (a signal, an abort in a C library) leaves its Python stack in the error
        "spark.python.worker.faulthandler.enabled": "true",
        # Python workers forked with pandas, pyarrow and ctiflow imported: their pages shared
        # (ctiflow.jobs.datapath.spark_daemon)
        "spark.python.daemon.module": "ctiflow.jobs.datapath.spark_daemon",
        "spark.driver.memory": "2g",
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
        **(spark_metrics(cfg.metrics.spark_ui_port) if cfg and cfg.metrics.spark_ui_port else {}),
        **(spark_cfg.conf if spark_cfg else {}),
        # The executors' Kafka clients get credentials from their environment
        # (ctiflow.jobs.datapath.kafka.env_credentials), never from Spark options; Spark redacts these values
        # (spark.redaction.regex) in its UI and logs, and the driver's JVM is started without them
        # (ctiflow.jobs.driver.jvm.launch_settings_of: no command line has them).
        **({f"spark.executorEnv.{var}": value for var, value in executor_credentials(cfg).items()}
           if cfg else {}),
    }


#: Settings the job file decides even under spark-submit: the stateful stage's partitions are
#: fixed for a checkpoint, and ctiflow sizes its marker topic and key groups by them.
JOB_OWNED = frozenset({"spark.sql.shuffle.partitions"})


def spark_conf(cfg: JobConfig | None = None, app: str = "ctiflow"):
    """The ``SparkConf`` of a job's session (:func:`spark_options`); under spark-submit, the
    settings it was given win (``--conf``, spark-defaults.conf: as a user of spark-submit
    expects), but for :data:`JOB_OWNED`."""
    from pyspark import SparkConf

    given = {k: v for k, v in launcher_settings().items() if k not in JOB_OWNED}
    return SparkConf().setAll(list({**spark_options(cfg, spark_log_path(), app), **given}.items()))


def spark_session(cfg: JobConfig | None = None, app: str = "ctiflow"):
    """A Spark session configured for this machine's realities (see ENVIRONMENT.md)."""
    java_environment()
    # Spark's modules are imported where a session starts: the CLI imports this module to
    # refuse a bad configuration before Spark, in a fraction of pyspark's import time.
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    log = spark_log_path()
    conf = spark_conf(cfg, app)  # all of it: the JVM started without its secrets, the context gets them
    fresh = SparkSession.getActiveSession() is None
    if SparkContext._gateway is None:  # the first session of this process (a stopped one keeps its JVM)
        # The driver JVM's own stdout/stderr go to the log file too (ctiflow.jobs.driver.jvm.gateway): Python
        # workers the driver starts (transformWithStateInPandas's pre-init worker) print start/finish
        # lines there, which Spark copies to the JVM's stderr, not through log4j.
        SparkContext(conf=conf, gateway=gateway(conf))
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    if fresh:
        print(f"Spark's own log: {log}", file=sys.stderr, flush=True)
    accumulator_drops_to_log(getattr(spark.sparkContext, "_accumulatorServer", None), log)
    register_data_sources(spark)
    return spark


def accumulator_drops_to_log(server, log: Path) -> None:
    """PySpark's accumulator server prints a connection the JVM drops mid-request ("Exception
    occurred during processing of request", an ``EOFError`` traceback) on the console. The JVM
    drops it while a query or the session stops — on SIGTERM, sometimes before
    :func:`stop_session` runs (seen once in a CI run). ctiflow uses no accumulators, so such a
    drop loses nothing of ours: it goes to Spark's log file, not the console."""
    if server is None:
        return

    def handle_error(_request, client_address):
        with open(log, "a") as out:
            out.write(f"ctiflow: PySpark's accumulator server lost its connection from {client_address}:\n")
            traceback.print_exc(file=out)

    server.handle_error = handle_error


def spark_metrics(port: int) -> dict[str, str]:
    """Spark's own metrics in Prometheus's format: the driver's UI on ``port`` with Spark's
    Prometheus servlet (``/metrics/prometheus``: the driver's metrics system;
    ``/metrics/executors/prometheus``: every executor's)."""
    return {"spark.ui.enabled": "true", "spark.ui.port": str(port), "spark.ui.prometheus.enabled": "true",
            "spark.metrics.conf.*.sink.prometheusServlet.class":
                "org.apache.spark.metrics.sink.PrometheusServlet",
            "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus",
            "spark.metrics.appStatusSource.enabled": "true"}


def register_data_sources(spark) -> None:
    """ctiflow's Kafka source (``ctiflow_kafka``) and exactly-once sink (``ctiflow_kafka_sink``)."""
    from ctiflow.jobs.datapath.sink import KafkaSink  # (imports pyspark: see spark_session)
    from ctiflow.jobs.datapath.source.reader import KafkaSource

    spark.dataSource.register(KafkaSource)
    spark.dataSource.register(KafkaSink)


def stop_session() -> None:
    """Stop this process's Spark session, if it has one. PySpark's accumulator server is stopped
    first: in ``SparkContext.stop``'s order (or when the JVM dies at interpreter exit) the JVM
    closes the server's connection while its handler polls it (PySpark 4.3)."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:  # (its dropped connections go to Spark's log: accumulator_drops_to_log)
        server.shutdown()  # its handler sees the flag within its 1 s poll; a second shutdown is a no-op
    spark.stop()


def source_options(cfg: JobConfig, src, flush: bool, labels: list[int] | None = None,
                   start: dict | None = None):
    """The Kafka source's options for one of the job's sources
    (:class:`ctiflow.jobs.datapath.source.options.SourceOptions`); ``start``: its first batch's offsets,
    as the checkpoint keeps them."""
    from ctiflow.jobs.datapath.source.options import SourceOptions  # (imports pyspark: see spark_session)

    return SourceOptions(
        bootstrap=cfg.kafka.bootstrap_servers, topic=src.topic, schema=src.schema_name, stream=src.name,
        key_field=src.key_field, time_field=src.time_field, end_field=src.end_field, shape=src.shape,
        key_groups=cfg.key_groups, group_labels=tuple(labels) if labels is not None else None,
        starting_offsets=src.starting_offsets, ending_offsets=src.ending_offsets,
        max_offsets_per_trigger=src.batch_records,
        measures=tuple(src.measures), client=public_client(cfg.kafka.client),
        schema_registry=cfg.kafka.schema_registry.model_dump() if cfg.kafka.schema_registry.url else None,
        outage_timeout=cfg.kafka.outage_timeout / 1000, idle_timeout=src.cti.idle_timeout / 1000,
        flush_at_end=flush and src.cti.flush_at_end, start_offsets=start,
        broadcast=src in cfg.rule_sources,  # every key group judges every rule
        # Only an operator passing records on unchanged needs every record's bytes (dead letters always get
        # theirs).
        keep_values=cfg.passes_records, pack_fields=cfg.reads_fields)


def build_query(spark, cfg: JobConfig, *, until_end: bool, progress: str | None = None,
                checkpoint: CheckpointDir | None = None):
    """The job's streaming query (not started yet: returns the DataStreamWriter)."""
    from ctiflow.jobs.datapath.adapter import OUTPUT_SCHEMA, OperatorProcessor  # these import pyspark (see
                                                                                # spark_session)
    from ctiflow.jobs.core.rows import INPUT_COLUMNS
    from ctiflow.jobs.datapath.sink import SinkOptions
    from ctiflow.jobs.datapath.source.reader import KafkaStreamReader

    checkpoint = checkpoint or CheckpointDir.of(cfg.checkpoint_dir, spark)
    job_plan: Plan = plan_job(cfg)
    partitions = cfg.shuffle_partitions  # (JOB_OWNED: the job's, also in a session another job set;
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))  # a checkpoint keeps its own)
    labels = group_labels(cfg.key_groups, partitions, checkpoint)
    starts = {}
    for src in cfg.read_sources:
        reader = KafkaStreamReader(source_options(cfg, src, until_end, labels))
        try:
            starts[src.name] = start_offsets(checkpoint, src.name, reader.resolve_start)
        finally:
            reader.stop()
    options = {src.name: source_options(cfg, src, until_end, labels, starts[src.name]).to_options()
               for src in cfg.read_sources}
    frames = [spark.readStream.format("ctiflow_kafka").options(**options[src.name]).load()
              for src in cfg.read_sources]
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other, allowMissingColumns=True)
    processor = OperatorProcessor(job_plan, cfg.result_topics(), cfg.kafka.effective_framing,
                                  (cfg.kafka.schema_registry.model_dump() if cfg.kafka.schema_registry.url
                                   else None),
                                  sources=options, state_layout=state_layout(checkpoint))
    df = df.select("meta_group", *INPUT_COLUMNS)
    out = df.groupBy("meta_group").transformWithStateInPandas(processor, OUTPUT_SCHEMA, "Append", "None")
    sink = SinkOptions(bootstrap=cfg.kafka.bootstrap_servers, client=public_client(cfg.kafka.client),
                       topics=tuple(sorted(cfg.result_topics())), markers=cfg.marker_topic,
                       replay_through=replay_through(checkpoint), progress=progress)
    writer = (out.writeStream.format("ctiflow_kafka_sink").options(**sink.to_options())
              .option("checkpointLocation", cfg.checkpoint_dir)
              .queryName(cfg.job.replace("-", "_").replace(".", "_")))
    if until_end or cfg.spark.trigger == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{duration_ms(cfg.spark.trigger)} milliseconds")
    return writer


@contextlib.contextmanager
def _signals_stop_gracefully():
    """While a query runs, the first SIGINT/SIGTERM asks the run loop to stop the query and
    return (``docker compose stop``, Ctrl-C); a second one interrupts at once. Raising inside a
    py4j call instead would leave py4j's tracebacks on the console and the query unstopped."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, _frame):
        if received:
            raise KeyboardInterrupt
        received.append(signum)

    before = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def refuse_errors(cfg: JobConfig, checkpoint: CheckpointDir | None = None, *,
                  checkpoint_too: bool = True) -> None:
    """The job's own errors — fields against the schemas, predicates, patterns and queries, the
    checkpoint (unless not ``checkpoint_too``: ``ctiflow submit`` leaves it to the driver, whose
    classpath has the jars spark-submit adds) — as one :class:`ConfigError` listing every one
    (what ``ctiflow check`` finds), before anything connects."""
    from ctiflow.jobs.driver.check import config_errors

    if checkpoint_too and checkpoint is None:
        checkpoint = CheckpointDir.for_job(cfg, spark_conf(cfg))
    errors = config_errors(cfg, checkpoint=checkpoint, checkpoint_too=checkpoint_too)
    if len(errors) == 1:  # one line, as every other refusal
        raise ConfigError(f"job {cfg.job!r}: {errors[0]}")
    if errors:
        raise ConfigError(f"job {cfg.job!r} cannot run", errors)


def prepare(cfg: JobConfig) -> CheckpointDir:
    """Everything before Spark: the master answers (:func:`ctiflow.jobs.driver.masters.check_master`), the
    job's own errors (:func:`refuse_errors`), the broker answers,
    the input topics exist, the result topics are created, the checkpoint is this job's and fits
    the config (each refusal one clear error). The checkpoint is read through the JVM the session
    will then run in (:func:`ctiflow.jobs.driver.jvm.gateway`)."""
    check_master(cfg.spark.master, "spark.master")  # now, not after Spark's ≈ 80 s of retries
    checkpoint = CheckpointDir.for_job(cfg, spark_conf(cfg))
    refuse_errors(cfg, checkpoint)
    client = cfg.kafka.client_config()  # with credentials: this process's own clients
    wait_for_broker(cfg.kafka.bootstrap_servers, client)
    for src in cfg.sources:
        topic_partitions(cfg.kafka.bootstrap_servers, src.topic, client)  # clear error if missing
    # (a rules topic may be empty until the first `ctiflow rules put`)
    create_topics(cfg.kafka.bootstrap_servers, cfg.written_topics() | {s.topic: 1 for s in cfg.rule_sources},
                  client)
    from ctiflow.jobs.driver.recognize import derived_schemas

    derived = derived_schemas(cfg)
    if cfg.kafka.effective_framing == "single_object":  # and so can every reader: the schemas topic
        publish_schemas(cfg.kafka.bootstrap_servers, derived, client)
    reset_uncommitted_checkpoint(checkpoint)
    return checkpoint


def run(cfg: JobConfig, *, until_end: bool, spark=None, on_progress=None, timeout: float | None = None,
        max_batches: int | None = None) -> RunSummary:
    """Run the job. ``until_end``: a bounded run that drains and flushes, then returns;
    ``timeout`` (seconds) / ``max_batches``: stop gracefully after that long / that many batches."""
    entered = time.monotonic()
    bounded = [src.name for src in cfg.sources if src.ending_offsets != "latest"]
    if bounded and not until_end:
        raise ConfigError(f"sources {', '.join(bounded)}: ending_offsets ends a bounded run only; run with "
                          "--until-end, or leave ending_offsets out for a job that keeps running")
    checkpoint = prepare(cfg)
    metrics = start_metrics(cfg)  # before Spark: a port in use is one error, not a traceback 15 s later
    if metrics is not None:
        print(f"{cfg.job}: metrics at http://{cfg.metrics.host}:{metrics.port}/metrics", file=sys.stderr,
              flush=True)
    prog = ProgressLog.of(cfg)
    counters_now = CounterReader(prog)
    try:
        spark = spark or spark_session(cfg)
        query = build_query(spark, cfg, until_end=until_end, progress=prog.topic,
                            checkpoint=checkpoint).start()
    except BaseException:
        if metrics is not None:
            metrics.close()
        raise
    started = time.monotonic()
    collect = _Progress(spark, query, entered, counters_now, metrics, on_progress)
    batches = collect.batches

    with _signals_stop_gracefully() as signals:
        try:
            while query.isActive and not signals:
                query.awaitTermination(0.5)
                collect()  # every batch, also when several finished within the second
                if timeout and time.monotonic() - started > timeout:
                    break
                if max_batches and len(batches) >= max_batches:
                    break
            if query.exception():
                raise stack_error_in(query.exception()) or query.exception()  # a topic gone for good:
                                                                              # one line
        finally:
            if query.isActive:
                query.stop()
            try:
                collect()  # the batches that finished since the last poll
            finally:
                if metrics is not None:
                    metrics.close()
    progress = [batches[b] for b in sorted(batches)]
    mine = read_counters(prog, set(batches))
    counters = read_counters(prog)
    cti = counters.get("cti")
    return RunSummary(len(progress), mine.get("received", 0), time.monotonic() - started, counters,
                      None if cti is None or cti <= CTI_NONE else cti, progress,
                      signals[0] if signals else None, collect.first_batch)


class FailedAttempts:
    """Task attempts that failed since the last call: a task whose Python worker died (a crash in a
    native library, the OOM killer) runs again and the batch succeeds, and this is how the driver
    learns of it. Read from Spark's count per executor (its status store, what its UI's executors
    page shows; dead executors included): a few py4j calls a batch, where the public status tracker
    takes one per job and stage (7–15 ms a batch measured). The session's tasks: ctiflow runs one
    query a session."""

    def __init__(self, spark) -> None:
        self.store = spark.sparkContext._jsc.sc().statusStore()
        self.seen = self._total()

    def _total(self) -> int:
        executors = self.store.executorList(False)
        return sum(executors.apply(i).failedTasks() for i in range(executors.size()))

    def __call__(self) -> int:
        total = self._total()
        failed, self.seen = total - self.seen, total
        return failed


class _Progress:
    """Polled after every wait on the query: each completed micro-batch's progress, once
    (``batches``: id → progress; idle triggers repeat an id, the first is kept), handed with
    the job's counters to the metrics and ``on_progress``; ``first_batch``: seconds from
    ``entered`` to the first (recovery time on a restart; polled every 0.5 s)."""

    def __init__(self, spark, query, entered: float, counters_now, metrics, on_progress) -> None:
        self.query, self.entered, self.counters_now = query, entered, counters_now
        self.metrics, self.on_progress = metrics, on_progress
        self.batches: dict[int, dict] = {}
        self.first_batch: float | None = None
        self.failed_attempts = FailedAttempts(spark)

    def __call__(self) -> None:
        # Idle triggers report the last batch again, without ``addBatch``: not a batch. The last
        # progress alone (one JSON) when it is the only new batch; all recent ones (up to 100,
        # each with its state metrics: CPU the driver shares with the job) only after a jump.
        batches, query = self.batches, self.query
        last = query.lastProgress
        if last is None or last["batchId"] in batches:
            return
        follows = last["batchId"] - 1 in batches or (not batches and last["batchId"] == 0)
        if "addBatch" in last["durationMs"] and follows:
            fresh = [last]
        else:
            fresh = [p for p in query.recentProgress
                     if p["batchId"] not in batches and "addBatch" in p["durationMs"]]
        for p in fresh:
            batches.setdefault(p["batchId"], p)
        if fresh:
            fresh[-1][FAILED_ATTEMPTS] = self.failed_attempts()
        if fresh and self.first_batch is None:
            self.first_batch = time.monotonic() - self.entered
        if fresh and (self.on_progress or self.metrics):
            counters = self.counters_now()
            for p in fresh:
                if self.metrics:
                    self.metrics.update(p, counters)
                if self.on_progress:
                    self.on_progress(p, counters)
