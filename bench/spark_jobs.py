"""End-to-end Spark benchmarks on the embedded stack (one Spark job at a time: 2 cores).

Each benchmark produces its input once, then runs the variants over the *same* topic in the
same process: the baseline first, then ours. Rates are "sustained": the first micro-batch
(JVM warm-up, query planning) is reported apart and left out of events/s.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil
from rich.console import Console
from rich.table import Table

T0 = 1_767_225_600_000


@dataclass
class Figures:
    name: str
    events: int
    seconds: float
    batches: int
    p50_ms: float
    p99_ms: float
    first_batch_ms: float
    peak_rss_mb: float
    counters: dict = field(default_factory=dict)  # a ctiflow job's counters (ctiflow.jobs.core.counters.Counters), summed

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


class PeakMemory:
    """Peak memory of this process and its children (JVM, Python workers); with
    ``without_broker``, not the embedded broker's (its memory-only storage holds the topics).

    Summed as **PSS** (proportional set size: each shared page split among the processes that
    map it), not RSS: Spark's Python workers are forked from one daemon and share its pages
    copy-on-write, and the JVM forks to start a process — summed RSS counted those pages once
    per process (a JVM caught mid-fork counted twice)."""

    #: seconds between samples. Reading the PSS of a Spark job's ≈ 20 processes costs ≈ 65 ms of
    #: CPU (the kernel walks their page tables: measured 2026-11-26): at 0.25 s that was a quarter
    #: of a core taken from the job measured, on both sides of every comparison
    INTERVAL = 1.0

    def __init__(self, without_broker: bool = False):
        self.peak = 0
        self.without_broker = without_broker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                children = me.children(recursive=True)
                if self.without_broker:
                    children = [c for c in children if c.name() != "tansu"]
                total = sum(_pss(p) for p in [me, *children])
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._stop.wait(self.INTERVAL)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _pss(process: psutil.Process) -> int:
    try:
        return process.memory_full_info().pss
    except (psutil.AccessDenied, AttributeError):  # no smaps here: resident memory instead
        return process.memory_info().rss


#: The share of a query's micro-batches left out of its rate: the JVM's JIT is still compiling
#: Spark's code paths for the query during its first dozens of batches, and not equally for both
#: sides of a comparison (measured over 30 batches of 100k flows, a batch's mean per third: the
#: Spark SQL proration 1,111 → 777 → 712 ms, ctiflow's bins 770 → 705 → 681 ms;
#: docs/changelog.md#warm-up-and-steady-state). A rate over the first batches compares
#: warm-ups.
WARM_UP = 0.5

#: Suffix of the unmeasured warm-up round's names and topics (:func:`warm_up`).
WARM_UP_TAG = "-warm-up"


def warm_up(*queries) -> None:
    """Run each of ``queries`` (called with :data:`WARM_UP_TAG`, for its names and topics) once,
    unmeasured, before any measured query of a comparison.

    The driver JVM's JIT keeps compiling Spark's per-micro-batch code (analysis, planning,
    scheduling, the state store) for minutes: over a 30-batch bins query it still spent ≈ 0.3 of
    a core on compilation at the end (``jstat -compiler``), and a query inherits what the queries
    before it had compiled — in a shared session whichever side runs later gains. One round of
    both sides first puts both on compiled code (measured: a second round in the same JVM moves
    neither side by more than the noise)."""
    for query in queries:
        query(WARM_UP_TAG)


def figures(name: str, progress: list[dict], peak: int) -> Figures:
    """A query's figures over its micro-batches after the :data:`WARM_UP` share (the first batch
    at least: it is reported apart)."""
    from ctiflow.jobs.driver.progress import records_read

    def read(p: dict) -> int:  # a first batch has no start offset: it is reported apart anyway
        n = records_read(p)
        return p["numInputRows"] if n is None else n

    batches = [p for p in progress if read(p) > 0]
    steady = batches[max(1, int(len(batches) * WARM_UP)):] or batches
    durations = [p["durationMs"]["triggerExecution"] for p in steady]
    ordered = sorted(durations) or [0]
    return Figures(name, sum(records_read(p) or 0 for p in steady), sum(durations) / 1000, len(batches),
                   statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                   batches[0]["durationMs"]["triggerExecution"] if batches else 0, peak / 2**20)


@contextmanager
def bench_stack():
    """A private embedded broker and Spark session for one benchmark."""
    from ctiflow.jobs.ops import stack
    from ctiflow.jobs.driver.pipeline import spark_session

    home = tempfile.mkdtemp(prefix="ctiflow-bench-")
    os.environ["CTIFLOW_HOME"] = home
    port = stack.free_port()
    stack.up(port)
    spark = None
    try:
        from ctiflow.bench.baselines import register as register_baselines

        spark = spark_session()
        register_baselines(spark)
        yield f"127.0.0.1:{port}", spark, home
    finally:
        if spark is not None:
            spark.stop()
        stack.down(port)
        shutil.rmtree(home, ignore_errors=True)


def produce_transactions(bootstrap: str, topic: str, n: int, keys: int, partitions: int = 2) -> None:
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer

    kafka.create_topics(bootstrap, {topic: partitions})
    records = ({"id": str(i), "account": f"acct-{i % keys:05d}", "event_time": T0 + i * 10, "type": "purchase",
                "amount": float((i * 7919) % 2000), "currency": "EUR", "country": "DE", "merchant": None}
               for i in range(n))
    kafka.produce(bootstrap, topic, records, AvroSerializer("transaction"), "account",
                  partition_of=lambda i, _: i % partitions)


def run_job(spark, cfg_spec: dict, bootstrap: str, home: str, name: str, without_broker: bool = False) -> Figures:
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.config import parse

    cfg_spec = {**cfg_spec, "kafka": {"bootstrap_servers": bootstrap},
                "spark": {**cfg_spec.get("spark", {}), "checkpoint": f"{home}/ck-{name}"}}
    cfg = parse(cfg_spec, name)
    with PeakMemory(without_broker) as mem:
        summary = pipeline.run(cfg, until_end=True, spark=spark)
    f = figures(name, summary.progress, mem.peak)
    f.counters = summary.counters
    return f


def python_limit(bootstrap: str, topic: str, out_topic: str) -> Figures:
    """The limit of one Python process, no Spark: consume → bulk decode and validate (the
    source's :class:`~ctiflow.jobs.datapath.source.decoder.RecordDecoder`) → bulk Avro-encode the records
    (:class:`~ctiflow.jobs.avro.encode.ColumnEncoder`, the fastest encoder here) → produce each to the
    same broker. What the identity job does, minus Spark and state."""
    import json

    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.encode import ColumnEncoder
    from ctiflow.jobs.avro.serde import AvroSerializer, default_store
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder

    opts = {"bootstrap": bootstrap, "topic": topic, "schema": "transaction", "key_field": "account",
            "time_field": "event_time", "values": "errors"}
    decoder = RecordDecoder(opts)
    serializer = AvroSerializer("transaction")
    encode = ColumnEncoder(json.loads(serializer.schema.text), serializer.header)
    kafka.create_topics(bootstrap, {out_topic: 2})
    parts = kafka.topic_partitions(bootstrap, topic)
    cons = kafka.consumer(bootstrap, {}, **{"group.id": "bench-limit"})
    ends = {p: kafka.true_end_offset(cons, topic, p, 0, timeout=3.0) for p in parts}
    prod = kafka.producer(bootstrap)
    start = time.perf_counter()
    n, lat = 0, []
    try:
        for p, end in ends.items():
            for msgs in kafka.read_range(cons, topic, p, 0, end, raw=True):
                t = time.perf_counter()
                got = decoder.decoded([m.value() for m in msgs])
                fields = got.fields
                values = encode.encode({c: fields.column(c) for c in fields.column_names}, fields.num_rows)
                for key, value in zip(got.keys.to_pylist(), values.to_pylist()):
                    kafka.send(prod, out_topic, value, key.encode(), partition=p)
                prod.poll(0)
                n += len(msgs)
                lat.append((time.perf_counter() - t) * 1000)
        prod.flush(60)
    finally:
        cons.close()
    secs = time.perf_counter() - start
    return Figures("limit: 1 Python process, no Spark: consume → bulk decode → encode → produce", n, secs,
                   len(lat), statistics.median(lat), max(lat), 0, psutil.Process().memory_info().rss / 2**20)


def source_spec(topic: str, limit: int) -> dict:
    return {"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account",
            "time_field": "event_time", "max_offsets_per_trigger": limit, "cti": {"delay": "5s"}}


def noop_passthrough(spark, bootstrap: str, topic: str, limit: int, home: str) -> Figures:
    """Stateless pass-through: the Spark source decoding into typed columns → noop sink."""
    import json

    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.pipeline import source_options

    cfg = parse({"job": "noop", "kafka": {"bootstrap_servers": bootstrap}, "sources": [source_spec(topic, limit)],
                 "operators": [{"kind": "passthrough", "output": "unused"}]})
    df = spark.readStream.format("ctiflow_kafka_typed").options(**source_options(cfg, cfg.sources[0], False).to_options()).load()
    with PeakMemory() as mem:
        q = (df.writeStream.format("noop").option("checkpointLocation", f"{home}/ck-noop")
             .trigger(availableNow=True).start())
        q.awaitTermination()
    return figures("stateless pass-through (source → noop)", q.recentProgress, mem.peak)


def _source(spark, bootstrap: str, spec: dict, columns: str, client: dict | None = None):
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.pipeline import group_labels, source_options

    cfg = parse({"job": "plumbing", "kafka": {"bootstrap_servers": bootstrap, "client": client or {}}, "sources": [spec],
                 "operators": [{"kind": "passthrough", "output": "unused"}], "spark": {"key_groups": 8}})
    labels = group_labels(8, int(spark.conf.get("spark.sql.shuffle.partitions")))
    opts = source_options(cfg, cfg.sources[0], False, labels)
    source = "ctiflow_kafka" if columns == "packed" else "ctiflow_kafka_typed"  # (typed: the baselines')
    return spark.readStream.format(source).options(**opts.to_options()).load()


def _to_kafka(df, bootstrap: str, topic: str, home: str, name: str) -> Figures:
    from ctiflow.jobs.datapath import kafka

    kafka.create_topics(bootstrap, {topic: 2})
    with PeakMemory() as mem:
        q = (df.writeStream.format("ctiflow_kafka_sink").option("bootstrap", bootstrap)
             .option("topics", f'["{topic}"]').option("checkpointLocation", f"{home}/ck-{topic}")
             .trigger(availableNow=True).start())
        q.awaitTermination()
    return figures(name, q.recentProgress, mem.peak)


def passthrough_to_kafka(spark, bootstrap: str, spec: dict, home: str, out_topic: str = "bench-pass-out") -> Figures:
    """Stateless pass-through to a topic: source → Kafka sink, each record's bytes as they came."""
    from pyspark.sql import functions as F

    df = _source(spark, bootstrap, spec, "all").select(
        F.lit(out_topic).alias("topic"), F.col("meta_key").cast("binary").alias("key"),
        F.col("meta_value").alias("value"), F.lit("passthrough").alias("kind"))
    return _to_kafka(df, bootstrap, out_topic, home, "stateless pass-through (source → Kafka sink)")


class _Forward:
    """A ``StatefulProcessor`` that forwards each group's records unchanged (or, with
    ``forward=False``, only unpacks them and emits nothing): Spark's stateful plumbing (shuffle,
    Python worker, Arrow both ways, one state update a group) with the least work of ours — the
    packs' columns read (:func:`ctiflow.jobs.core.rows.unpack_columns`) and each record's bytes passed on as
    one Arrow array, no time layer, no operator. (Defined lazily: PySpark classes are imported
    only when a benchmark runs.)"""

    @staticmethod
    def make(forward: bool = True, topic: str = "bench-forward-out"):
        import pandas as pd
        import pyarrow as pa
        from pyspark.sql.streaming import StatefulProcessor

        from ctiflow.jobs.core.alloc import cyclic_gc_paused
        from ctiflow.jobs.core.rows import result_batch, result_pack, unpack_columns

        class Forward(StatefulProcessor):
            def init(self, handle) -> None:
                self.state = handle.getValueState("group", "n long")  # one state call a group, as ours

            def handleInputRows(self, key, rows, timerValues):
                out = []
                with cyclic_gc_paused():  # as the adapter does (ctiflow.jobs.core.alloc)
                    for r in rows:
                        packs = [unpack_columns(p, "s", 0) for p in r["meta_pack"] if p is not None]
                        if forward:
                            values = [result_pack([result_batch(c.key, pa.array(c.raw, pa.binary()), "passthrough")])
                                      for c in packs]
                            out.append(pd.DataFrame({"topic": topic, "key": None, "value": values,
                                                     "kind": "pack"}))
                self.state.update((1,))
                yield from out

            def close(self) -> None:
                pass

        return Forward()


#: The stateful plumbing's tasks: 8 key groups over 2 partitions (a job's default on 2 cores)
PLUMBING_PARTITIONS = 2


def forwarded(spark, bootstrap: str, spec: dict, topic: str, forward: bool = True):
    """Packed source → key groups → :class:`_Forward` (its records to ``topic``): the streaming
    frame of Spark's stateful plumbing alone, for a sink to start."""
    from ctiflow.jobs.datapath.adapter import OUTPUT_SCHEMA
    from ctiflow.jobs.core.rows import INPUT_COLUMNS

    spark.conf.set("spark.sql.shuffle.partitions", str(PLUMBING_PARTITIONS))  # (a job run before may have set it)
    df = _source(spark, bootstrap, spec, "packed").select("meta_group", *INPUT_COLUMNS)
    return df.groupBy("meta_group").transformWithStateInPandas(_Forward.make(forward, topic), OUTPUT_SCHEMA,
                                                               "Append", "None")


def plumbing_ceiling(spark, bootstrap: str, spec: dict, home: str, forward: bool = True,
                     name: str = "plumbing-noop", without_broker: bool = False) -> Figures:
    """Packed source → key groups → a stateful function with no operator → Kafka (``forward``)
    or, without output, → noop: the least any job on the adapter costs."""
    out = forwarded(spark, bootstrap, spec, "bench-forward-out", forward)
    if forward:
        return _to_kafka(out, bootstrap, "bench-forward-out", home,
                         "Spark stateful plumbing alone (bytes forwarded, no time layer, no operator) → Kafka")
    with PeakMemory(without_broker) as mem:
        q = (out.writeStream.format("noop").option("checkpointLocation", f"{home}/ck-{name}")
             .trigger(availableNow=True).start())
        q.awaitTermination()
    return figures("Spark stateful plumbing alone (records unpacked, no operator, no output) → noop",
                   q.recentProgress, mem.peak)


def table(title: str, rows: list[Figures], baseline: Figures, out: Console) -> Table:
    t = Table(title=title)
    for col in ("variant", "events", "events/s", "vs baseline", "batches", "p50 batch ms", "p99 batch ms",
                "first batch ms", "peak PSS MB"):
        t.add_column(col, justify="right" if col != "variant" else "left")
    for f in rows:
        t.add_row(f.name, f"{f.events:,}", f"{f.rate:,.0f}", f"{f.rate / baseline.rate:.2f}×" if baseline.rate else "-",
                  str(f.batches), f"{f.p50_ms:,.0f}", f"{f.p99_ms:,.0f}", f"{f.first_batch_ms:,.0f}", f"{f.peak_rss_mb:,.0f}")
    out.print(t)
    return t


def identity_job(topic: str, out_topic: str, limit: int) -> dict:
    return {"job": "identity", "sources": [source_spec(topic, limit)],
            "operators": [{"kind": "passthrough", "output": out_topic}], "spark": {"key_groups": 8}}


def bench_adapter(events: int, out: Console, trigger: int = 200_000, record_figures: bool = False) -> None:
    """``record_figures``: write the ``adapter`` row of bench/figures.yaml (a run at its defaults)."""
    with bench_stack() as (bootstrap, spark, home):
        produce_transactions(bootstrap, "bench-adapter", events, keys=10_000)
        warm_up(lambda tag: passthrough_to_kafka(spark, bootstrap, source_spec("bench-adapter", trigger), home,
                                                 "bench-pass-out" + tag),
                lambda tag: run_job(spark, identity_job("bench-adapter", "bench-identity-out" + tag, trigger), bootstrap,
                                    home, "identity" + tag))
        noop = noop_passthrough(spark, bootstrap, "bench-adapter", trigger, home)
        base = passthrough_to_kafka(spark, bootstrap, source_spec("bench-adapter", trigger), home)
        ceiling = plumbing_ceiling(spark, bootstrap, source_spec("bench-adapter", trigger), home)
        ident = run_job(spark, identity_job("bench-adapter", "bench-identity-out", trigger), bootstrap, home,
                        "identity operator, 10k keys, 8 key groups → Kafka")
        limit = python_limit(bootstrap, "bench-adapter", "bench-limit-out")
        t = table(f"ctiflow bench adapter: {events:,} events, 10,000 keys, {trigger:,} events a micro-batch "
                  "(vs the stateless pass-through to a topic)",
                  [noop, base, ceiling, ident, limit], base, out)
        out.print(f"identity job / pass-through: {ident.rate / base.rate:.2f}× (goal ≥ 0.9×); "
                  f"identity job / one Python process's limit: {ident.rate / limit.rate:.2f}× (goal ≥ 0.5)")
        if record_figures:
            record_adapter(ident, base, limit, t)


def record_adapter(ident: Figures, base: Figures, limit: Figures, t: Table) -> None:
    """The ``adapter`` row of bench/figures.yaml: the identity job against the pass-through and
    against one Python process's limit."""
    from ctiflow.bench.figures import record, rows_of, thousands, verdict

    record("adapter", {"ours": thousands(ident.rate), "base": thousands(base.rate),
                       "ratio": f"{ident.rate / base.rate:.2f}", "limit": thousands(limit.rate),
                       "limit_ratio": f"{ident.rate / limit.rate:.2f}",
                       "met": verdict(ident.rate >= 0.9 * base.rate),
                       "limit_met": verdict(ident.rate >= 0.5 * limit.rate)}, table=rows_of(t))


def bench_count_e2e(events: int, out: Console) -> None:
    with bench_stack() as (bootstrap, spark, home):
        produce_transactions(bootstrap, "bench-count", events, keys=10_000)
        ident = run_job(spark, identity_job("bench-count", "bench-count-id", 100_000), bootstrap, home, "identity operator")
        count = run_job(spark, {"job": "count", "sources": [source_spec("bench-count", 100_000)],
                                "operators": [{"kind": "count", "name": "hv", "window": {"events": 10_000},
                                               "epsilon": 0.01, "per_key": False, "predicate": "amount > 1000",
                                               "emit": "per_cti", "output": "bench-counts"}],
                                "spark": {"key_groups": 8}}, bootstrap, home, "count (global, last 10k events, ε=1%)")
        table(f"ctiflow bench count (end to end): {events:,} events", [ident, count], ident, out)
