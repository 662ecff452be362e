"""Build and run a job's Spark query: sources → adapter (CTIs, operators) → Kafka sink.

How StreamInsight's settings map onto Spark (also in the README's time model):

* ``delay`` → each Kafka partition's CTI is its largest start − delay, and a stream's CTI the
  **minimum** over its partitions that are not idle (:class:`operators.time.PartitionCtis`,
  Flink's per-partition watermarks). Not Spark's watermark: that is one ``max(start) − delay``
  over all rows of all partitions, so the faster partition would declare the slower one's
  in-order events late, by an amount that depends on the batch size. The source sends every
  key group each partition's progress and the batch's idle set (:mod:`jobs.source`); each
  group computes the same CTI and keeps it in its state. Spark never drops a row for being
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

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jobs.config import JobConfig, PassthroughOp
from jobs.kafka import public_client
from jobs.runtime import Plan, plan as make_plan
from operators.time import CTI_INFINITY, CTI_NONE


#: Spark's logging configuration for the driver (everything to one file, see spark_log_path).
SPARK_LOG4J2 = Path(__file__).resolve().parent / "spark-log4j2.properties"


def spark_log_path() -> Path:
    """Where this process's Spark log goes: ``$CTIFLOW_HOME/logs/spark-<pid>.log``."""
    logs = Path(os.environ.get("CTIFLOW_HOME", Path.cwd() / ".ctiflow")) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"spark-{os.getpid()}.log"


def spark_session(cfg: JobConfig | None = None, app: str = "ctiflow"):
    """A Spark session configured for this machine's realities (see ENVIRONMENT.md)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if not os.environ.get("JAVA_HOME"):
        import shutil

        java = shutil.which("java")
        if java:
            os.environ["JAVA_HOME"] = str(Path(os.path.realpath(java)).parent.parent)
    from pyspark.sql import SparkSession

    spark_cfg = cfg.spark if cfg else None
    log = spark_log_path()
    builder = (SparkSession.builder.appName(app)
               # Spark's own log to a file (jobs/spark-log4j2.properties), no progress bars:
               # the console shows ctiflow's progress lines only.
               .config("spark.driver.extraJavaOptions",
                       f"-Dlog4j2.configurationFile=file:{SPARK_LOG4J2} -Dctiflow.spark.log={log}")
               .config("spark.ui.showConsoleProgress", "false")
               .master(spark_cfg.master if spark_cfg else "local[2]")
               .config("spark.sql.shuffle.partitions", str(spark_cfg.shuffle_partitions if spark_cfg else 2))
               .config("spark.ui.enabled", "false")
               .config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000")
               .config("spark.python.worker.reuse", "true")
               .config("spark.driver.memory", "2g")
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "true"))
    for k, v in (spark_cfg.conf.items() if spark_cfg else []):
        builder = builder.config(k, v)
    fresh = SparkSession.getActiveSession() is None
    spark = builder.getOrCreate()
    if fresh:
        print(f"Spark's own log: {log}", file=sys.stderr, flush=True)
    from jobs.sink import KafkaSink
    from jobs.source import KafkaSource

    spark.dataSource.register(KafkaSource)
    spark.dataSource.register(KafkaSink)
    return spark


def group_labels(groups: int, partitions: int, checkpoint: Path | None = None) -> list[int]:
    """The value each key group carries into Spark's shuffle, chosen so the groups spread
    evenly over the stateful stage's partitions. Spark places a row by
    ``pmod(murmur3(value, seed 42), partitions)``; the plain numbers 0..7 land 3 and 5 on 2
    partitions, so one core would do 5/8 of the work. Label *g* is the next integer Spark puts
    in partition ``g mod partitions`` (Spark's hash is Murmur3 x86_32 with seed 42 over the
    int's 4 little-endian bytes; a test checks the placement against Spark's partitioner).
    Labels name the state, so they are kept with the checkpoint and reused on restart (Spark
    keeps a checkpoint's partition count too); a changed ``key_groups`` is refused."""
    path = checkpoint / "ctiflow-groups.json" if checkpoint else None
    if path is not None and path.exists():
        saved = json.loads(path.read_text())
        if saved["key_groups"] != groups:
            from operators.errors import ConfigError

            raise ConfigError(f"spark.key_groups is {groups}, but the checkpoint {checkpoint} was written with "
                              f"{saved['key_groups']} key groups (each group's state is stored under its group): "
                              f"set spark.key_groups back to {saved['key_groups']}, or use a new checkpoint")
        return saved["labels"]
    if checkpoint is not None and any((checkpoint / "commits").glob("[0-9]*")):
        labels = list(range(groups))  # committed before labels existed: state is under 0..G-1
    else:
        labels = _spread_labels(groups, partitions)
    if path is not None:
        write_atomically(path, json.dumps({"key_groups": groups, "partitions": partitions, "labels": labels}))
    return labels


def _spread_labels(groups: int, partitions: int) -> list[int]:
    """Label *g* is the next integer Spark's partitioner puts in partition ``g mod partitions``."""
    import struct

    import mmh3

    def spark_partition(label: int) -> int:  # Spark's HashPartitioning of an int: murmur3, seed 42
        return mmh3.hash(struct.pack("<i", label), 42) % partitions

    free: dict[int, list[int]] = {p: [] for p in range(partitions)}
    labels: list[int] = []
    candidate = 0
    for g in range(groups):
        want = g % partitions
        while not free[want]:
            free[spark_partition(candidate)].append(candidate)
            candidate += 1
        labels.append(free[want].pop(0))
    return labels


def write_atomically(path: Path, text: str) -> None:
    """Written whole or not at all: a kill mid-write must not leave a file the restart cannot read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def start_file(cfg: JobConfig, src) -> Path:
    """Where a source keeps the offsets its first micro-batch starts from (see
    :meth:`jobs.source.KafkaStreamReader.initialOffset`)."""
    return Path(cfg.checkpoint_dir) / f"ctiflow-start-{src.name}.json"


def source_options(cfg: JobConfig, src, flush: bool, labels: list[int] | None = None) -> dict[str, str]:
    opts = {
        "bootstrap": cfg.kafka.bootstrap_servers, "topic": src.topic, "schema": src.schema_name,
        "stream": src.name, "key_field": src.key_field, "time_field": src.time_field,
        "end_field": src.end_field or "", "shape": src.shape, "key_groups": str(cfg.key_groups),
        "startingOffsets": src.starting_offsets, "measures": json.dumps(src.measures),
        "outage_timeout": str(cfg.kafka.outage_timeout / 1000),
        "client": json.dumps(public_client(cfg.kafka.client)), "flush_at_end": "true" if flush and src.cti.flush_at_end else "false",
        "start_file": str(start_file(cfg, src)), "idle_timeout": str(src.cti.idle_timeout / 1000),
    }
    if labels is not None:
        opts["group_labels"] = json.dumps(labels)
    if cfg.kafka.schema_registry.url:
        opts["schema_registry"] = json.dumps(cfg.kafka.schema_registry.model_dump())
    limit = src.max_offsets_per_trigger or src.cti.frequency.events
    if limit:
        opts["maxOffsetsPerTrigger"] = str(limit)
    return opts


def build_query(spark, cfg: JobConfig, *, until_end: bool, progress_file: str | None = None):
    """The job's streaming query (not started yet: returns the DataStreamWriter)."""
    from jobs.adapter import INPUT_COLUMNS, OUTPUT_SCHEMA, OperatorProcessor

    job_plan: Plan = make_plan(cfg)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    labels = group_labels(cfg.key_groups, partitions, Path(cfg.checkpoint_dir))
    frames = []
    passes_records = any(isinstance(op, PassthroughOp) for op in cfg.operators)  # keeps input bytes
    for src in cfg.sources:
        frames.append(spark.readStream.format("ctiflow_kafka").options(**source_options(cfg, src, until_end, labels))
                      .option("columns", "packed").option("values", "all" if passes_records else "errors").load())
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other, allowMissingColumns=True)
    processor = OperatorProcessor(job_plan, cfg.result_topics(), cfg.kafka.effective_framing,
                                  cfg.kafka.schema_registry.model_dump() if cfg.kafka.schema_registry.url else None,
                                  {s.name: s.topic for s in cfg.sources})
    df = df.select("meta_group", *INPUT_COLUMNS)
    out = df.groupBy("meta_group").transformWithStateInPandas(processor, OUTPUT_SCHEMA, "Append", "None")
    writer = (out.writeStream.format("ctiflow_kafka_sink")
              .option("bootstrap", cfg.kafka.bootstrap_servers)
              .option("client", json.dumps(public_client(cfg.kafka.client)))
              .option("checkpointLocation", cfg.checkpoint_dir)
              .option("topics", json.dumps(sorted(cfg.result_topics())))
              .option("state_dir", str(Path(cfg.checkpoint_dir) / "ctiflow-sink"))
              .queryName(cfg.job.replace("-", "_").replace(".", "_")))
    if progress_file:
        writer = writer.option("progress", progress_file)
    if until_end or cfg.spark.trigger == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        from jobs.config import duration_ms

        writer = writer.trigger(processingTime=f"{duration_ms(cfg.spark.trigger)} milliseconds")
    return writer


def records_read(progress: dict) -> int | None:
    """Kafka records a micro-batch read, from its source offsets (``numInputRows`` counts
    Spark rows, and the operator pipeline's rows are packs of records); ``None`` for a query's
    first batch, whose progress has no start offset."""
    def offsets(value) -> dict | None:
        value = json.loads(value) if isinstance(value, str) else value
        return None if value is None else {p: int(v) for p, v in value.items() if p != "flushed"}

    total = 0
    for src in progress.get("sources", []):
        start, end = offsets(src.get("startOffset")), offsets(src.get("endOffset"))
        if start is None:
            return None
        total += sum(max(0, v - start.get(p, 0)) for p, v in (end or {}).items())
    return total


def format_cti(cti: int | None) -> str:
    """A CTI for people: UTC time to the millisecond, ``-`` before the first, ``+∞`` after the final one."""
    if cti is None or cti <= CTI_NONE:
        return "-"
    if cti >= CTI_INFINITY:
        return "+∞"
    import datetime as dt

    return dt.datetime.fromtimestamp(cti / 1000, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def progress_line(p: dict, counters: dict) -> str:
    """One micro-batch for people: batch, records/s, CTI and the job's counters so far."""
    records = records_read(p)
    secs = p["durationMs"].get("triggerExecution", 0) / 1000
    rate = f"{records / secs:>9.0f}" if records is not None and secs else f"{'-':>9}"
    return (f"batch {p['batchId']:>4}  records {'-' if records is None else records:>7}  {rate} records/s  "
            f"CTI {format_cti(counters.get('cti'))}  in {counters.get('received', 0)} "
            f"released {counters.get('released', 0)} late {counters.get('late', 0)} "
            f"dead-letter {counters.get('dead_letter', 0)} out {counters.get('written', 0)}")


def summary_line(job: str, summary: "RunSummary") -> str:
    """A run for people: batches, records, seconds, the final CTI and the counters' balance."""
    c = summary.counters
    received, released, late, dead = (c.get(k, 0) for k in ("received", "released", "late", "dead_letter"))
    return (f"{job}: {summary.batches} batches, {summary.records} input records in {summary.seconds:.1f} s; "
            f"CTI {format_cti(summary.cti)}; in {received} = released {released} + late {late} + dead-letter {dead} "
            f"+ buffered {received - released - late - dead}; out {c.get('written', 0)} records "
            f"(late topic {c.get('late_records', 0)})")


#: A stream partition that sends more than this share of its records to the late topic is warned about.
LATE_WARNING_SHARE = 0.01


def late_warnings(counters: dict, already: set[str]) -> list[str]:
    """Warnings for stream partitions whose late share exceeds :data:`LATE_WARNING_SHARE`
    (each once: ``already`` collects the ones warned about)."""
    out = []
    for name, late in sorted(counters.items()):
        if not name.startswith("late@") or name in already:
            continue
        where = name.removeprefix("late@")
        received = counters.get(f"received@{where}", 0)
        if late and received and late > LATE_WARNING_SHARE * received:
            already.add(name)
            stream, partition = where.rsplit("/", 1)
            out.append(f"warning: stream {stream!r} partition {partition}: {late} of {received} records "
                       f"({late / received:.1%}) went to the late topic; if they were not really late, raise "
                       f"the stream's cti.delay (or its idle_timeout, if that partition was idle)")
    return out


@dataclass
class RunSummary:
    batches: int
    records: int  # input records of this run's batches (good and dead-lettered, every stream)
    seconds: float
    counters: dict  # the job's counters over every run of this checkpoint (see jobs.runtime.Counters)
    cti: int | None  # the job's CTI after the last batch (None: no CTI yet)
    progress: list[dict]  # one entry per micro-batch, in order


def progress_path(cfg: JobConfig) -> Path:
    """The job's per-batch counters (JSON lines), kept inside its checkpoint directory."""
    path = Path(cfg.checkpoint_dir) / "ctiflow-progress.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def read_counters(path: Path, batches: set[int] | None = None) -> dict:
    """The job's counters summed over the progress file's batches (``batches``: only those).
    A batch replayed after a crash has a line per attempt; the last one is the committed one."""
    last: dict[int, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if batches is None or rec["batch"] in batches:
                last[rec["batch"]] = rec
    from jobs.sink import merge_metrics

    totals: dict[str, int] = {}
    for rec in last.values():
        merge_metrics(totals, {k: v for k, v in rec.items() if k not in ("batch", "time")})
    return totals


def reset_uncommitted_checkpoint(checkpoint: Path) -> bool:
    """A run killed before its first micro-batch committed can leave operator state but no
    committed batch; Spark 4 then refuses to plan batch 0 if it has to plan it again
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). None of that state was committed, so it goes;
    everything else stays: the offset log (Spark replays batch 0 over exactly the offsets it
    logged, from the starting offsets the source saved, so its output is the same and the sink's
    replay markers skip what landed), the markers and the key-group labels."""
    state = checkpoint / "state"
    if not state.is_dir() or any((checkpoint / "commits").glob("[0-9]*")):
        return False
    import shutil

    shutil.rmtree(state)
    return True


def run(cfg: JobConfig, *, until_end: bool, spark=None, on_progress=None, timeout: float | None = None,
        max_batches: int | None = None) -> RunSummary:
    """Run the job. ``until_end``: a bounded run that drains and flushes, then returns;
    ``timeout`` (seconds) / ``max_batches``: stop gracefully after that long / that many batches."""
    from jobs.kafka import create_topics, wait_for_broker

    wait_for_broker(cfg.kafka.bootstrap_servers, cfg.kafka.client)
    for src in cfg.sources:
        from jobs.kafka import topic_partitions

        topic_partitions(cfg.kafka.bootstrap_servers, src.topic, cfg.kafka.client)  # clear error if missing
    create_topics(cfg.kafka.bootstrap_servers, {t: cfg.outputs.partitions for t in cfg.result_topics()},
                  cfg.kafka.client)
    reset_uncommitted_checkpoint(Path(cfg.checkpoint_dir))
    spark = spark or spark_session(cfg)
    prog = progress_path(cfg)
    query = build_query(spark, cfg, until_end=until_end, progress_file=str(prog)).start()
    started = time.monotonic()
    batches: dict[int, dict] = {}  # batch id → its progress (idle triggers repeat an id: keep the first)

    def collect() -> None:
        # Idle triggers report the last batch again, without ``addBatch``: not a batch.
        fresh = [p for p in query.recentProgress if p["batchId"] not in batches and "addBatch" in p["durationMs"]]
        for p in fresh:
            batches.setdefault(p["batchId"], p)
        if fresh and on_progress:
            counters = read_counters(prog)
            for p in fresh:
                on_progress(p, counters)

    try:
        while query.isActive:
            query.awaitTermination(0.5)
            collect()  # every batch, also when several finished within the second
            if timeout and time.monotonic() - started > timeout:
                break
            if max_batches and len(batches) >= max_batches:
                break
        if query.exception():
            raise query.exception()
    finally:
        if query.isActive:
            query.stop()
    collect()
    progress = [batches[b] for b in sorted(batches)]
    mine = read_counters(prog, set(batches))
    counters = read_counters(prog)
    cti = counters.get("cti")
    return RunSummary(len(progress), mine.get("received", 0), time.monotonic() - started, counters,
                      None if cti is None or cti <= CTI_NONE else cti, progress)
