"""``ctiflow bench peers``: each result kind beside what a Spark user would write without ctiflow.

Like for like: in one process, over the *same* input topic and the *same* micro-batch size, after
one unmeasured round of both sides (:func:`warm_up`: the JVM's JIT), both
sides write their results through the same Kafka sink (``ctiflow_kafka_sink``), Avro-encoded in
the same framing (single-object). The native side encodes with a pandas UDF over fastavro — what
a PySpark user without the spark-avro jar writes. The native query writing to ``noop`` is printed
as context: the engine's own floor, not the peer.

* **bins** — ours (final only; and all three outputs with ADJUST and the late topic) vs Spark SQL
  ``explode`` of each flow into the bins it overlaps with fractional weights, then a windowed
  aggregation with a watermark, ``append`` mode.
* **count** — ours, per key, "interesting events in the last hour", one record per touched key per
  CTI, ε = 1 %, vs Spark's exact sliding-window count (``window(ts, '1 hour', '1 minute')`` per key,
  watermark, ``update`` mode). Ours is checked against the exact count by the oracle in
  :mod:`ctiflow.jobs.testing.oracle` (independent of the operator), and the largest error is printed.
* **match** — the operator vs Flink 2.3 ``MATCH_RECOGNIZE`` (PyFlink, ``bench/setup_flink.sh``)
  on the same events, operator level (:mod:`ctiflow.bench.match_operator`); skipped with one line when
  PyFlink is not installed.

Peak memory (PSS of the process tree: :class:`ctiflow.bench.spark_jobs.PeakMemory`) is compared with
each side run again **alone**, in a new process with its own Spark (:func:`alone`; the query
once unmeasured, then measured): in the shared
session a JVM keeps the heap earlier queries grew, so the ladder's memory column is the session's
high-water mark so far, not a query's own.

Where a target is missed the bench prints where each side's time goes, from a ladder of queries
over the same topic (source → noop; the stateful plumbing with no operator; the query → noop; the
query → Kafka): each rung adds one stage, so differences of seconds per 100k events are stage
costs. ``--costs`` (and the ``costs`` row) measures the adapter's per-record costs in one process.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd  # noqa: F401 - the pandas UDF's type hints are resolved in this module
from rich.console import Console
from rich.table import Table

from ctiflow.bench.spark_jobs import Figures, PeakMemory, bench_stack, figures, plumbing_ceiling, run_job, warm_up

BIN = 60_000
HOUR = 3_600_000
#: rounds of the comparison in the shared session (``ctiflow bench peers --runs``): each ratio recorded
#: is the median of its rounds' ratios, with their spread. One round's ratio moved ±10 % between
#: recordings here (count 2.45–3.33×, bins all three 1.04–1.14×).
ROUNDS = 3
PEER_TOPIC_PARTITIONS = 3
#: count: a transaction is interesting above this amount (about the median: ≈ 180 per account
#: and hour, so the histogram's ε matters; rarer events would be counted exactly).
INTERESTING = 30.0


# ---------------------------------------------------------------------------------------------
# The native side: what a PySpark user writes without ctiflow
# ---------------------------------------------------------------------------------------------


def avro_udf(schema_name: str, shape):
    """A pandas UDF encoding each row of a struct column to Avro (fastavro, single-object
    framing, the same header as ours): ``shape(row dict) -> record dict``."""
    import fastavro
    from pyspark.sql.functions import pandas_udf

    from ctiflow.jobs.avro.serde import default_store

    stored = default_store().get(schema_name)
    parsed = fastavro.parse_schema(json.loads(stored.text))
    header = b"\xc3\x01" + stored.fingerprint

    @pandas_udf("binary")
    def to_avro(rows: pd.DataFrame) -> pd.Series:
        out = []
        for row in rows.to_dict("records"):
            buf = io.BytesIO()
            buf.write(header)
            fastavro.schemaless_writer(buf, parsed, shape(row))
            out.append(buf.getvalue())
        return pd.Series(out)

    return to_avro


def _bin_record(r: dict) -> dict:
    return {"binner": "per_minute", "key": r["device"], "bin_start": r["bin_start"], "bin_end": r["bin_end"],
            "measures": {"bytes": r["bytes"], "packets": r["packets"]}, "fraction_sum": r["fraction_sum"],
            "events": int(r["events"]), "revision": 0, "final": True, "cti": r["bin_end"], "kind": "final"}


def _count_record(r: dict) -> dict:
    n = int(r["count"])
    return {"counter": "interesting_last_hour", "key": r["account"], "time": r["time"], "window_kind": "time",
            "window": HOUR, "epsilon": 0.0, "estimate": float(n), "lower": n, "upper": n, "seed_estimate": n,
            "bucket_count": 0, "exact": n}


def _typed_source(spark, bootstrap: str, spec: dict):
    from pyspark.sql import functions as F

    from ctiflow.bench.baselines import register as register_baselines
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.pipeline import source_options

    register_baselines(spark)  # the typed source and the batch sink of the baselines

    cfg = parse({"job": "native", "kafka": {"bootstrap_servers": bootstrap}, "sources": [spec],
                 "operators": [{"kind": "passthrough", "output": "unused"}]})
    return (spark.readStream.format("ctiflow_kafka_typed").options(**source_options(cfg, cfg.sources[0], False)
                                                                    .to_options()).load()
            .where(F.col("meta_error").isNull()))


def native_bins(spark, bootstrap: str, spec: dict):
    """Flows exploded into their 1-minute bins (``(b, b + BIN]``) with fractional weights, summed
    per (device, bin) by a windowed aggregation with a 6-minute watermark."""
    from pyspark.sql import functions as F

    df = _typed_source(spark, bootstrap, spec)
    s, e = F.col("start_time"), F.col("end_time")
    # The bin of t is ceil(t / BIN) − 1; a zero-length flow sits in the bin of its start.
    first = (F.ceil(s / BIN) - 1) * BIN
    last = F.when(e == s, first).otherwise((F.ceil(e / BIN) - 1) * BIN)
    exploded = df.select("device", s.alias("s"), e.alias("e"), "bytes", "packets",
                         F.explode(F.sequence(first, last, F.lit(BIN))).alias("b"))
    frac = F.when(F.col("e") == F.col("s"), F.lit(1.0)).otherwise(
        (F.least(F.col("e"), F.col("b") + BIN) - F.greatest(F.col("s"), F.col("b"))) / (F.col("e") - F.col("s")))
    weighted = (exploded.withColumn("f", frac).where(F.col("f") > 0)
                .withColumn("bin_ts", F.timestamp_millis(F.col("b") + 1))
                .withWatermark("bin_ts", "6 minutes"))
    agg = (weighted.groupBy("device", F.window("bin_ts", "1 minute"))
           .agg(F.sum(F.col("bytes") * F.col("f")).alias("bytes"), F.sum(F.col("packets") * F.col("f")).alias("packets"),
                F.sum("f").alias("fraction_sum"), F.count("*").alias("events")))
    fields = F.struct("device", F.unix_millis(F.col("window.start")).alias("bin_start"),
                      F.unix_millis(F.col("window.end")).alias("bin_end"), "bytes", "packets", "fraction_sum", "events")
    return agg, fields, "bin", _bin_record, "device"


def native_count(spark, bootstrap: str, spec: dict, predicate_amount: float):
    """Spark's exact sliding-window count: interesting transactions per account in
    ``window(ts, '1 hour', '1 minute')``, watermark = the CTI delay, ``update`` mode; a record's
    time is its window's last millisecond."""
    from pyspark.sql import functions as F

    df = _typed_source(spark, bootstrap, spec)
    agg = (df.where(F.col("amount") > predicate_amount)
           .withColumn("ts", F.timestamp_millis("event_time")).withWatermark("ts", "5 seconds")
           .groupBy("account", F.window("ts", "1 hour", "1 minute")).count())
    fields = F.struct("account", (F.unix_millis(F.col("window.end")) - 1).alias("time"), "count")
    return agg, fields, "count", _count_record, "account"


def run_native(built, mode: str, home: str, name: str, bootstrap: str | None = None, topic: str | None = None) -> Figures:
    """The native query → ``noop`` (``topic`` None) or → the Kafka sink, Avro-encoded by a pandas UDF."""
    from pyspark.sql import functions as F

    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.datapath.sink import SinkOptions

    agg, fields, schema, shape, key = built
    if topic is None:
        writer = agg.writeStream.format("noop")
        ck = f"{home}/ck-{name}-noop"
    else:
        kafka.create_topics(bootstrap, {topic: PEER_TOPIC_PARTITIONS})
        out = agg.select(F.lit(topic).alias("topic"), F.col(key).cast("binary").alias("key"),
                         avro_udf(schema, shape)(fields).alias("value"), F.lit("record").alias("kind"))
        options = SinkOptions(bootstrap, topics=(topic,)).to_options()
        if mode == "append":
            writer = out.writeStream.format("ctiflow_kafka_sink").options(**options)
        else:  # Spark offers Python stream writers append mode only: update mode goes through foreachBatch
            writer = out.writeStream.foreachBatch(
                lambda batch, _id: batch.write.format("ctiflow_kafka_batch_sink").options(**options).mode("append").save())
        ck = f"{home}/ck-{topic}"
    with PeakMemory(without_broker=True) as mem:
        q = writer.outputMode(mode).option("checkpointLocation", ck).trigger(availableNow=True).start()
        q.awaitTermination()
    return figures(name, q.recentProgress, mem.peak)


def source_noop(spark, bootstrap: str, spec: dict, home: str, name: str) -> Figures:
    """Rung 0: the source decoding into typed columns → noop."""
    df = _typed_source(spark, bootstrap, spec)
    with PeakMemory(without_broker=True) as mem:
        q = (df.writeStream.format("noop").option("checkpointLocation", f"{home}/ck-{name}")
             .trigger(availableNow=True).start())
        q.awaitTermination()
    return figures("source → noop (decode only)", q.recentProgress, mem.peak)


def alone(what: str, bootstrap: str, spec: dict, topic_suffix: str = "-alone") -> Figures:
    """One query of the comparison alone in a **new Python process with its own Spark** (driver
    JVM, Python workers), over the same input topic, writing to its own result topics: its peak
    memory is its own. In the shared session every query's figure includes the JVM heap the queries
    before it grew (a JVM does not give memory back), so whichever side ran later looked
    bigger. ``what``: ``bins-peer``, ``bins-final``, ``bins-three``, ``count-peer``, ``count``."""
    import subprocess
    import sys
    import tempfile

    home = tempfile.mkdtemp(prefix="ctiflow-bench-alone-")
    env = {**os.environ, "CTIFLOW_HOME": home}
    arg = json.dumps({"what": what, "bootstrap": bootstrap, "spec": spec, "suffix": topic_suffix})
    try:
        done = subprocess.run([sys.executable, "-m", "ctiflow.bench.peers", arg], env=env, capture_output=True, text=True,
                              timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"ctiflow.bench.peers {what} alone failed:\n{done.stderr[-3000:]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        return Figures(**got)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _alone_main(arg: str) -> None:
    """The child of :func:`alone`: run one query in this process's own Spark, print its figures."""
    from dataclasses import asdict

    from ctiflow.jobs.driver.pipeline import spark_session

    a = json.loads(arg)
    what, bootstrap, spec, suffix = a["what"], a["bootstrap"], a["spec"], a["suffix"]
    home = os.environ["CTIFLOW_HOME"]
    spark = spark_session()

    def query(tag: str = "") -> Figures:
        if what == "bins-peer":
            return run_native(native_bins(spark, bootstrap, spec), "append", home, what + tag, bootstrap,
                              "peers-bins-native" + suffix + tag)
        if what == "count-peer":
            return run_native(native_count(spark, bootstrap, spec, INTERESTING), "update", home, what + tag,
                              bootstrap, "peers-count-native" + suffix + tag)
        if what in ("bins-final", "bins-three"):
            outs = FINAL if what == "bins-final" else THREE
            return run_job(spark, bins_job(spec, {k: v + suffix + tag for k, v in outs.items()}), bootstrap, home,
                           what + tag, True)
        if what == "count":
            return run_job(spark, count_job(spec, "peers-counts" + suffix + tag), bootstrap, home, what + tag, True)
        raise ValueError(f"unknown query {what!r}")

    try:
        warm_up(query)  # the same query first, unmeasured: its JVM's JIT (see warm_up)
        f = query()
    finally:
        spark.stop()
    print(json.dumps(asdict(f)))


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, schema: str, records: list[dict], key_field: str) -> None:
    """Records keyed by ``key_field`` over :data:`PEER_TOPIC_PARTITIONS` partitions (Kafka's
    default partitioner: uneven rates per partition)."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer

    kafka.create_topics(bootstrap, {topic: PEER_TOPIC_PARTITIONS})
    kafka.produce(bootstrap, topic, records, AvroSerializer(schema), key_field=key_field)


BATCH = 100_000  # events a micro-batch (--trigger)
FINAL = {"final": "peers-bins-final-only"}
THREE = {"incremental": "peers-bins-inc", "updated": "peers-bins-upd", "final": "peers-bins-final"}


def _flows(n: int, rate_per_s: float = 200.0) -> list[dict]:
    from ctiflow.jobs.testing import workload

    return workload.flows(n, devices=1000, seed=1, rate_per_s=rate_per_s)


def _transactions(n: int) -> list[dict]:
    """1,000 accounts, ≈ 100 transactions a second: several hours of event time."""
    from ctiflow.jobs.testing import workload

    return workload.transactions(n, accounts=1000, seed=3, rate_per_s=100.0, disorder_ms=2_000)


def flow_spec(topic: str, limit: int) -> dict:
    return {"name": "flows", "topic": topic, "schema": "flow", "key_field": "device", "time_field": "start_time",
            "end_field": "end_time", "shape": "interval", "measures": ["bytes", "packets"],
            "max_offsets_per_trigger": limit, "cti": {"delay": "6m", "policy": "adjust"}}


def tx_spec(topic: str, limit: int) -> dict:
    return {"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account",
            "time_field": "event_time", "max_offsets_per_trigger": limit, "cti": {"delay": "5s"}}


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


@dataclass
class Peer:
    """One comparison: ours vs the peer, the target ratio, and the ladder behind each."""

    what: str
    ours: Figures
    peer: Figures
    target: float
    note: str = ""
    error_ok: bool = True  # count: the measured error is within ε
    ours_records: int = 0  # result records each side wrote to Kafka
    peer_records: int = 0
    checked: int = 0  # count: records of ours checked against the exact count
    error_max: float | None = None  # count: the largest relative error among them
    ours_alone: Figures | None = None  # each side again in a process of its own (:func:`alone`): memory
    peer_alone: Figures | None = None
    ratios: tuple[float, ...] = ()  # each round's ratio (:func:`paired`); ``ours``/``peer`` are the median round's

    @property
    def ratio(self) -> float:
        """The median of the rounds' ratios (one round: ours over the peer)."""
        if self.ratios:
            return statistics.median(self.ratios)
        return self.ours.rate / self.peer.rate if self.peer.rate else 0.0

    @property
    def spread(self) -> str:
        """The rounds' least and most ratio (``1.04–1.09``), or the one ratio."""
        low, high = (min(self.ratios), max(self.ratios)) if self.ratios else (self.ratio, self.ratio)
        return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f}"

    @property
    def met(self) -> bool:
        return self.ratio >= self.target


def rounds(n: int, sides: dict[str, Callable[[str], Figures]]) -> dict[str, list[Figures]]:
    """Each side (called with a tag for its names and topics: ``""`` in the first round, ``-r2``…
    after) once a round, ``n`` rounds, the order reversed every other round (A B C, C B A, A B C):
    a shared machine's drift over the minutes a comparison takes falls on every side alike, and a
    ratio is taken within a round, between queries minutes apart at most."""
    got: dict[str, list[Figures]] = {name: [] for name in sides}
    for i in range(n):
        for name in (sides if i % 2 == 0 else reversed(list(sides))):
            got[name].append(sides[name](f"-r{i + 1}" if i else ""))
    return got


def paired(what: str, ours: list[Figures], peer: list[Figures], target: float, **kw) -> Peer:
    """A comparison over rounds: each round's ratio kept, the figures shown those of the round whose
    ratio is the median (with an even number of rounds, the lower middle one)."""
    ratios = tuple(o.rate / p.rate if p.rate else 0.0 for o, p in zip(ours, peer, strict=True))
    mid = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]
    return Peer(what, ours[mid], peer[mid], target, ratios=ratios, **kw)


def records_in(bootstrap: str, topics) -> int:
    """Records in ``topics`` (every partition, low to true end offset)."""
    from ctiflow.jobs.datapath import kafka

    cons = kafka.consumer(bootstrap)
    try:
        n = 0
        for t in topics:
            for p in kafka.topic_partitions(bootstrap, t):
                low = kafka.low_offset(cons, t, p)
                n += kafka.true_end_offset(cons, t, p, low) - low
        return n
    finally:
        cons.close()


def per_100k(f: Figures) -> float:
    """Seconds per 100k events (sustained)."""
    return 1e5 / f.rate if f.rate else float("nan")


@dataclass
class Ladder:
    """Queries over the same topic, each adding stages to the one before (see the module doc)."""

    source: Figures  # source → noop
    native_noop: Figures  # the native query → noop
    native: Figures  # the native query → Kafka
    plumbing: Figures  # packed source → key groups → stateful function with no operator → noop
    ours: list[Figures]

    def rungs(self) -> list[Figures]:
        return [self.source, self.native_noop, self.native, self.plumbing, *self.ours]


def bench_bins(spark, bootstrap: str, home: str, events: int, limit: int, out: Console,
               rate_per_s: float = 200.0, n_rounds: int = 1) -> tuple[list[Peer], Ladder]:
    topic = "peers-flows"
    produce(bootstrap, topic, "flow", _flows(events, rate_per_s), "device")
    spec = flow_spec(topic, limit)
    native = native_bins(spark, bootstrap, spec)
    warm_up(lambda tag: run_native(native, "append", home, f"bins peer{tag}", bootstrap, f"peers-bins-native{tag}"),
            lambda tag: run_job(spark, bins_job(spec, {"final": f"peers-bins{tag}"}), bootstrap, home, f"bins{tag}", True))
    floor = source_noop(spark, bootstrap, spec, home, "bins-source")
    noop = run_native(native, "append", home, "Spark SQL explode + window agg (append) → noop [floor]")
    plumbing = plumbing_ceiling(spark, bootstrap, spec, home, forward=False, name="bins-plumbing", without_broker=True)
    got = rounds(n_rounds, {
        "peer": lambda tag: run_native(native, "append", home, "Spark SQL explode + window agg (append) → Kafka "
                                       f"(pandas UDF Avro){tag}", bootstrap, f"peers-bins-native{tag}"),
        "final": lambda tag: run_job(spark, bins_job(spec, {k: v + tag for k, v in FINAL.items()}), bootstrap, home,
                                     f"ctiflow bins, final only → Kafka{tag}", True),
        "three": lambda tag: run_job(spark, bins_job(spec, {k: v + tag for k, v in THREE.items()}), bootstrap, home,
                                     f"ctiflow bins, incremental+updated+final → Kafka{tag}", True)})
    native_out = records_in(bootstrap, ["peers-bins-native"])
    peer_alone = alone("bins-peer", bootstrap, spec)
    final = paired("bins, final only", got["final"], got["peer"], 1.5, ours_records=records_in(bootstrap, FINAL.values()),
                   peer_records=native_out, ours_alone=alone("bins-final", bootstrap, spec), peer_alone=peer_alone)
    three = paired("bins, all three outputs", got["three"], got["peer"], 1.2,
                   ours_records=records_in(bootstrap, THREE.values()), peer_records=native_out,
                   ours_alone=alone("bins-three", bootstrap, spec), peer_alone=peer_alone)
    return [final, three], Ladder(floor, noop, final.peer, plumbing, [final.ours, three.ours])


def bench_count(spark, bootstrap: str, home: str, events: int, limit: int, out: Console,
                n_rounds: int = 1) -> tuple[list[Peer], Ladder]:
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.testing import oracle

    topic, result = "peers-tx", "peers-counts"
    produce(bootstrap, topic, "transaction", _transactions(events), "account")
    spec = tx_spec(topic, limit)
    native = native_count(spark, bootstrap, spec, INTERESTING)
    job = count_job(spec, result)
    warm_up(lambda tag: run_native(native, "update", home, f"count peer{tag}", bootstrap, f"peers-count-native{tag}"),
            lambda tag: run_job(spark, count_job(spec, result + tag), bootstrap, home, f"count{tag}", True))
    floor = source_noop(spark, bootstrap, spec, home, "count-source")
    noop = run_native(native, "update", home, "Spark exact sliding window (1 h, 1 min; update) → noop [floor]")
    plumbing = plumbing_ceiling(spark, bootstrap, spec, home, forward=False, name="count-plumbing", without_broker=True)
    got = rounds(n_rounds, {
        "peer": lambda tag: run_native(native, "update", home, "Spark exact sliding window (1 h, 1 min; update) → "
                                       f"Kafka (pandas UDF Avro){tag}", bootstrap, f"peers-count-native{tag}"),
        "ours": lambda tag: run_job(spark, count_job(spec, result + tag), bootstrap, home,
                                    f"ctiflow count per key, last hour, ε = 1 %, per CTI → Kafka{tag}", True)})
    # The error ours actually had: every count record against the exact count at its time.
    cfg = parse({**job, "kafka": {"bootstrap_servers": bootstrap}})
    records = [r for r in kafka.read_topic(bootstrap, result) if "_undecodable" not in r]
    exact = oracle.exact_counts(cfg, records, lambda t: kafka.read_topic(bootstrap, t))
    worst, checked = 0.0, 0
    at: dict[tuple[str, str], int] = {}
    for r in records:  # exact_counts lists each key's exact counts in the order of ``records``
        k = (r["counter"], r["key"])
        i = at[k] = at.get(k, -1) + 1
        n = exact[k][i][1]
        err = abs(r["estimate"] - n) / n if n else (0.0 if r["estimate"] == 0 else float("inf"))
        worst, checked = max(worst, err), checked + 1
    note = f"error vs exact: max {worst:.2%} over {checked:,} count records (ε = 1 %)"
    count = paired("count per key, last hour", got["ours"], got["peer"], 2.0, note=note,
                   error_ok=checked > 0 and worst <= 0.01, ours_records=checked,
                   peer_records=records_in(bootstrap, ["peers-count-native"]), checked=checked, error_max=worst,
                   ours_alone=alone("count", bootstrap, spec), peer_alone=alone("count-peer", bootstrap, spec))
    return [count], Ladder(floor, noop, count.peer, plumbing, [count.ours])


def bench_match(events: int, out: Console) -> list[tuple[str, float, float | None, str]]:
    """(pattern, ours events/s, Flink events/s or None, note)."""
    from ctiflow.bench.match_operator import flink_python, run as match_run

    if flink_python() is None:
        out.print("match vs Flink: skipped — PyFlink is not installed (bash bench/setup_flink.sh)")
        return []
    r = match_run(events, patterns=["strict_sequence", "relaxed_one_or_more", "within"], end_to_end=False)
    rows = []
    for name, row in r["patterns"].items():
        f = row.get("flink") or {}
        rate = f.get("net_events_per_s") or f.get("events_per_s")
        rows.append((name, row["operator"]["events_per_s"], rate,
                     f.get("error", "") or f"matches {row['operator']['matches']:,} / {f.get('matches', '-'):,}"))
    return rows


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------


def print_ladder(title: str, rungs: list[Figures], out: Console) -> None:
    """Where the time goes: seconds per 100k events of each query, and what each rung adds."""
    t = Table(title=title)
    for col in ("query", "events/s", "s / 100k events", "p50 batch ms", "p99 batch ms", "peak PSS MB, session so far"):
        t.add_column(col, justify="left" if col == "query" else "right")
    for f in rungs:
        t.add_row(f.name, f"{f.rate:,.0f}", f"{per_100k(f):.2f}", f"{f.p50_ms:,.0f}", f"{f.p99_ms:,.0f}",
                  f"{f.peak_rss_mb:,.0f}")
    out.print(t)


def peers_table(title: str, peers: list[Peer], out: Console) -> Table:
    t = Table(title=title)
    for col in ("result", "ours events/s", "peer events/s", "ratio", "rounds' ratios", "target", "met", "ours p50/p99 ms",
                "peer p50/p99 ms", "each alone: ours / peer events/s", "each alone: ours / peer peak PSS MB",
                "records out ours / peer", "note"):
        t.add_column(col, justify="left" if col in ("result", "note") else "right")
    for p in peers:
        met = p.met and p.error_ok
        t.add_row(p.what, f"{p.ours.rate:,.0f}", f"{p.peer.rate:,.0f}", f"{p.ratio:.2f}×",
                  " · ".join(f"{r:.2f}" for r in p.ratios) or "-", f"≥ {p.target:.1f}×",
                  "yes" if met else "NO", f"{p.ours.p50_ms:,.0f} / {p.ours.p99_ms:,.0f}",
                  f"{p.peer.p50_ms:,.0f} / {p.peer.p99_ms:,.0f}", _pair(p, "rate", "{:,.0f}"),
                  _pair(p, "peak_rss_mb", "{:,.0f}"),
                  f"{p.ours_records:,} / {p.peer_records:,}", p.note)
    out.print(t)
    return t


def _pair(p: Peer, attr: str, fmt: str) -> str:
    if p.ours_alone is None or p.peer_alone is None:
        return "-"
    return f"{fmt.format(getattr(p.ours_alone, attr))} / {fmt.format(getattr(p.peer_alone, attr))}"


def rounds_said(n: int) -> str:
    """How a recorded ratio was taken, for its row's text."""
    return f"the median of {n} rounds, the sides' order reversed each round" if n > 1 else "one round"


def step(upper: float, lower: float) -> str:
    """A stage's cost, the difference of two rungs (s per 100k events): "≈ 0" where the upper rung
    measured below the lower one — two noisy rungs, not a stage that gains time."""
    return f"{upper - lower:.2f}" if upper >= lower else "≈ 0"


def where_time_goes(kind: str, ladder: Ladder, out: Console, parallel: int) -> None:
    """Stage costs as differences between rungs, in seconds per 100k events. State time is the
    key groups' task time divided by the ``parallel`` tasks that run at once (wall time, roughly)."""
    src, noop, peer, plumbing = (per_100k(f) for f in (ladder.source, ladder.native_noop, ladder.native, ladder.plumbing))
    out.print(f"{kind}, where the time goes (s per 100k events; differences of rungs over the same topic):")
    out.print(f"  native: source decode {src:.2f} · shuffle + aggregation + state {step(noop, src)} · "
              f"pandas UDF Avro encode + Kafka sink {step(peer, noop)}")
    for f in ladder.ours:
        c = f.counters
        state, python = (c.get(k, 0) / 1e6 / max(1, c.get("received", 1)) * 1e5 / parallel
                         for k in ("state_us", "python_us"))
        out.print(f"  {f.name}: source decode + pack ≈ {src:.2f} · shuffle + Python worker (plumbing) "
                  f"{step(plumbing, src)} · operator, state, encode, Kafka sink {step(per_100k(f), plumbing)} "
                  f"(task time ÷ {parallel} parallel tasks: the key groups' Python calls ≈ {python:.2f}, "
                  f"of which state ≈ {state:.2f})")


def record_peers(peers: list[Peer], ladders: dict[str, Ladder], table: Table) -> None:
    """The rows ``peers-*`` of bench/figures.yaml from a run of bins and count: the ratios, each
    side alone, memory, and what bounds bins and count (the ladders' stage costs, s per 100k)."""
    from ctiflow.bench.figures import record, rows_of, thousands, verdict

    by = {p.what: p for p in peers}
    final, three, count = by["bins, final only"], by["bins, all three outputs"], by["count per key, last hour"]

    def pair(p: Peer) -> dict[str, str]:
        return {"ours": thousands(p.ours.rate), "peer": thousands(p.peer.rate), "ratio": f"{p.ratio:.2f}",
                "spread": p.spread, "rounds": rounds_said(len(p.ratios)),
                "alone": f"{p.ours_alone.rate / p.peer_alone.rate:.2f}", "met": verdict(p.met and p.error_ok)}

    def stages(ladder: Ladder, ours: Figures) -> dict[str, str]:
        src, noop, native, plumbing, mine = (per_100k(f) for f in (ladder.source, ladder.native_noop, ladder.native,
                                                                   ladder.plumbing, ours))
        return {"source": f"{src:.2f}", "plumbing": step(plumbing, src), "share": f"{100 * plumbing / mine:.0f} %",
                "ours_s": f"{mine:.2f}", "rest": step(mine, plumbing), "peer_state": step(noop, src),
                "peer_sink": step(native, noop), "peer_s": f"{native:.2f}"}

    def gb(f: Figures | None) -> str:
        return f"{f.peak_rss_mb / 1e3:.2f}"

    def less(ours: Figures, peer: Figures) -> str:
        return f"{100 * (ours.peak_rss_mb / peer.peak_rss_mb - 1):+.0f} %".replace("-", "−")

    bins = stages(ladders["bins"], final.ours)
    need = per_100k(final.peer) / final.target  # ours, s per 100k, at the target ratio
    below = per_100k(ladders["bins"].plumbing)  # the source and the plumbing: no operator can go under it
    said = (f"i.e. the operator, state, encode and produce at {need - below:.2f} s: out of reach for a Python operator"
            if need > below else f"less than the source and the plumbing alone take ({below:.2f}): out of reach for any "
            "operator")
    record("peers-bins-final", {**pair(final), **bins, "need": f"{need:.2f}", "need_said": said}, table=rows_of(table))
    record("peers-bins-all", pair(three))
    record("peers-count", {**pair(count), **stages(ladders["count"], count.ours),
                           "error": f"{count.error_max:.2%}", "checked": f"{count.checked:,}"})
    record("peers-memory", {
        "final": gb(final.ours_alone), "three": gb(three.ours_alone), "count": gb(count.ours_alone),
        "peer_bins": gb(final.peer_alone), "peer_count": gb(count.peer_alone),
        "final_d": less(final.ours_alone, final.peer_alone), "three_d": less(three.ours_alone, three.peer_alone),
        "count_d": less(count.ours_alone, count.peer_alone),
        "met": verdict(all(p.ours_alone.peak_rss_mb <= p.peer_alone.peak_rss_mb for p in (final, three, count)))})


def bins_job(spec: dict, outputs: dict) -> dict:
    return {"job": f"bins-{len(outputs)}", "sources": [spec],
            "operators": [{"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes", "packets"],
                           "outputs": outputs}]}


def count_job(spec: dict, output: str) -> dict:
    return {"job": "peers-count", "sources": [spec],
            "operators": [{"kind": "count", "name": "interesting_last_hour", "window": {"time": "1h"}, "epsilon": 0.01,
                           "per_key": True, "predicate": f"amount > {INTERESTING}", "emit": "per_cti",
                           "output": output}]}


def record_costs(bootstrap: str | None, events: int, out: Console) -> None:
    """The adapter's Python costs per input event, stage by stage (:mod:`ctiflow.bench.record_costs`)."""
    from ctiflow.bench.record_costs import measure

    runs = {
        "bins, 3 outputs": measure(bins_job(flow_spec("costs-flows", BATCH), {k: f"costs-{v}" for k, v in THREE.items()}), _flows(events), bootstrap=bootstrap),
        "bins, 3 outputs, GC not paused": measure(bins_job(flow_spec("costs-flows", BATCH), {k: f"costs-{v}" for k, v in THREE.items()}), _flows(events), bootstrap=bootstrap, gc_paused=False),
        "bins, final only": measure(bins_job(flow_spec("costs-flows", BATCH), {"final": "costs-final-only"}), _flows(events), bootstrap=bootstrap),
        "count": measure(count_job(tx_spec("costs-tx", BATCH), "costs-counts"), _transactions(events),
                         bootstrap=bootstrap),
    }
    t = Table(title=f"where a record's Python time goes in the adapter: µs per input event, {events:,} events, "
                    f"{BATCH:,} a batch, one process (bench/record_costs.py)")
    t.add_column("stage")
    for name in runs:
        t.add_column(name, justify="right")
    stages = list(next(iter(runs.values()))["us_per_event"])
    for stage in stages:
        t.add_row(stage, *(f"{r['us_per_event'].get(stage, 0):.2f}" for r in runs.values()))
    t.add_row("total", *(f"{sum(v for k, v in r['us_per_event'].items() if not k.startswith(' ')):.2f}"
                         for r in runs.values()))
    t.add_row("results per event", *(f"{r['results'] / r['events']:.3f}" for r in runs.values()))
    out.print(t)


def main(out: Console | None = None, *, events: int | None = None, trigger: int | None = None,
         which: tuple[str, ...] = ("bins", "count", "costs", "match"), record_figures: bool = False,
         runs: int = ROUNDS) -> list[Peer]:
    """``runs``: rounds of each comparison in the shared session (:func:`rounds`), each ratio their
    median. ``record_figures``: write the ``peers-*`` rows of bench/figures.yaml (a run at the rows'
    defaults)."""
    out = out or Console(width=200)
    peers: list[Peer] = []
    ladders: dict[str, Ladder] = {}
    if {"bins", "count", "costs"} & set(which):
        with bench_stack() as (bootstrap, spark, home):
            # 30 micro-batches, the last 15 measured (ctiflow.bench.spark_jobs.WARM_UP), after a round of both
            # sides unmeasured (warm_up): the JIT's warm-up left out; then ``runs`` measured rounds
            n, limit = events or 3_000_000, trigger or BATCH
            for kind, run, title in (
                    ("bins", bench_bins, f"bins: {n:,} flows, 1,000 devices, 3 partitions, 1-minute bins"),
                    ("count", bench_count, f"count: {n:,} transactions, 1,000 accounts, 3 partitions")):
                if kind not in which:
                    continue
                got, rungs = run(spark, bootstrap, home, n, limit, out, n_rounds=runs)
                ladders[kind] = rungs
                print_ladder(f"{title}, {limit:,} a micro-batch", rungs.rungs(), out)
                peers += got
                if not all(p.met and p.error_ok for p in got):
                    where_time_goes(kind, rungs, out, spark.sparkContext.defaultParallelism)
            if "costs" in which:
                record_costs(bootstrap, min(events or 200_000, 400_000), out)
    if peers:
        t = peers_table("ctiflow vs writing it yourself (Spark, same topic, same micro-batch, same Kafka sink)", peers, out)
        if record_figures and {"bins", "count"} <= set(ladders):
            record_peers(peers, ladders, t)
    if "match" in which:
        rows = bench_match(events or 300_000, out)
        if rows:
            t = Table(title="match: the operator vs Flink 2.3 MATCH_RECOGNIZE (PyFlink, parallelism 1), same events")
            for col in ("pattern", "ours events/s", "Flink events/s (net of scan)", "ratio", "target", "met", "note"):
                t.add_column(col, justify="left" if col in ("pattern", "note") else "right")
            for name, ours, flink, note in rows:
                ratio = ours / flink if flink else 0.0
                t.add_row(name, f"{ours:,.0f}", f"{flink:,.0f}" if flink else "-", f"{ratio:.2f}×" if flink else "-",
                          "≥ 1.0×", "yes" if ratio >= 1.0 else "NO", note)
            out.print(t)
    return peers


if __name__ == "__main__":
    import sys

    _alone_main(sys.argv[1])
