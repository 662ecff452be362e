"""``ctiflow bench source``: Kafka → typed columns in one Python process, against its ceiling.

Every row reads the same topic (``transaction`` records, ≥ 2 partitions) from the embedded broker,
one partition range at a time as a Spark task does, and is timed in CPU time per message (the
process's, librdkafka's threads included) and in wall time. The rows run interleaved, ``rounds``
times; each figure is a row's median over the rounds (the machine is shared: ratios within one
run are what compare).

* **consume**: confluent-kafka ``consume`` + the values as one Arrow column — what reading costs;
* **decode**: :class:`~ctiflow.jobs.avro.decode.ColumnDecoder` alone over values fetched
  beforehand — what decoding costs;
* **ceiling**: consume + ``ColumnDecoder`` → typed columns, nothing else (no validation, no
  metadata, no dead letters): the Python ceiling for what the source does; once as a plain
  loop, once with the cyclic collector paused as the source pauses it (the goal compares the
  source with the faster of the two);
* **source**: the project's :meth:`KafkaStreamReader.read
  <ctiflow.jobs.datapath.source.reader.KafkaStreamReader.read>` as an executor runs it (decode, validate,
  key groups, packs, frontier rows);
* **source, librdkafka defaults**: the same with the consumer settings the project used before
  (``fetch.queue.backoff.ms`` = 1,000 ms): the stall after every over-full fetch, in wall time.

Then, in Spark (the embedded session, one query at a time): the source → Spark's ``noop`` sink,
:data:`SPARK_BATCH` records a micro-batch (each partition's range larger than one fetch of the
embedded broker), with today's consumer settings and with librdkafka's defaults: whether the
stall reaches Spark's source (events/s over the micro-batches after the warm-up share).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.table import Table

#: librdkafka's own defaults for the settings :func:`ctiflow.jobs.datapath.kafka.consumer` now chooses
#: (the "before" row of the stall finding).
LIBRDKAFKA_DEFAULTS = {"fetch.queue.backoff.ms": "1000", "queued.min.messages": "100000",
                       "queued.max.messages.kbytes": "65536", "fetch.max.bytes": "52428800"}
PARTITIONS = 2
#: Records the sink rows write (each round adds them to the embedded broker's memory).
SINK_RECORDS = 300_000
#: Records a micro-batch in the Spark rows: 2 ranges of 500k. A range up to ≈ 200k is one
#: fetch of the embedded broker and never stalls (measured: 200k in 0.18 s either way, 500k in
#: 0.34 s vs 2.17 s): the stall reaches Spark's source when a batch reads more than that per
#: partition (a large ``max_offsets_per_trigger``, or catching up without one).
SPARK_BATCH = 1_000_000
#: The Spark rows' topic: 4 micro-batches.
SPARK_EVENTS = 4_000_000


def _options(bootstrap: str, topic: str, client: dict) -> dict:
    import json

    return {"bootstrap": bootstrap, "topic": topic, "schema": "transaction", "key_field": "account",
            "time_field": "event_time", "key_groups": "8", "values": "errors", "client": json.dumps(client)}


def _ranges(bootstrap: str, topic: str) -> dict[int, int]:
    from ctiflow.jobs.datapath import kafka

    cons = kafka.consumer(bootstrap, {}, **{"group.id": "bench-source-ends"})
    try:
        return {p: kafka.true_end_offset(cons, topic, p, 0, timeout=3.0) for p in kafka.topic_partitions(bootstrap, topic)}
    finally:
        cons.close()


def _consume(bootstrap: str, topic: str, ends: dict[int, int], client: dict, each: Callable[[list], int]) -> int:
    """Read every range with a fresh consumer per range (as a task does); ``each(msgs)`` → rows."""
    from ctiflow.jobs.datapath import kafka

    n = 0
    for p, end in ends.items():
        cons = kafka.consumer(bootstrap, client, **{"group.id": "bench-source"})
        try:
            for msgs in kafka.read_range(cons, topic, p, 0, end, raw=True):
                n += each(msgs)
        finally:
            cons.close()
    return n


def _values(msgs: list) -> list:
    return [m.value() for m in msgs]


class _Ceiling:
    """consume + ColumnDecoder → typed columns (the framing header skipped, nothing checked)."""

    def __init__(self, bootstrap: str, topic: str):
        from ctiflow.jobs.datapath.source.decoder import RecordDecoder

        self.records = RecordDecoder(_options(bootstrap, topic, {}))

    def decoder(self, first: bytes):
        writer, header = self.records.decode.writer_schema(first)
        return self.records._column_decoder(writer), header

    def columns(self, values: list) -> pa.Table:
        bulk, header = self.decoder(values[0])
        lengths = np.fromiter(map(len, values), np.int64, len(values))
        ends = np.cumsum(lengths)
        columns, _, _ = bulk.decode(b"".join(values), ends - lengths + header, ends)
        return pa.Table.from_arrays(columns, schema=self.records.record_schema)


def _gc_paused(run: Callable[[], int]) -> Callable[[], int]:
    def paused() -> int:
        from ctiflow.jobs.core.alloc import cyclic_gc_paused

        with cyclic_gc_paused():
            return run()
    return paused


def _timed(run: Callable[[], int]) -> tuple[int, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    n = run()
    return n, time.process_time() - cpu, time.perf_counter() - wall


def measure(bootstrap: str, topic: str, rounds: int = 5) -> list[dict]:
    """The rows of the table (see the module docstring), each a median over ``rounds``."""
    from ctiflow.jobs.datapath.source.reader import KafkaStreamReader, OffsetRange, ReadTask

    ends = _ranges(bootstrap, topic)
    ceiling = _Ceiling(bootstrap, topic)
    fetched: list[list] = []
    _consume(bootstrap, topic, ends, {}, lambda msgs: fetched.append(_values(msgs)) or len(msgs))

    def source(client: dict) -> Callable[[], int]:
        def run() -> int:
            reader = KafkaStreamReader(_options(bootstrap, topic, client))
            for p, end in ends.items():
                for _ in reader.read(ReadTask([OffsetRange(p, 0, end)])):
                    pass  # rows are packs of records: the messages read are the ranges' lengths
            reader.stop()
            return sum(ends.values())
        return run

    rows: dict[str, Callable[[], int]] = {
        "consume: confluent-kafka consume + values as an Arrow column":
            lambda: _consume(bootstrap, topic, ends, {}, lambda msgs: len(pa.array(_values(msgs), pa.binary()))),
        "decode: ColumnDecoder alone (values fetched beforehand)":
            lambda: sum(ceiling.columns(v).num_rows for v in fetched),
        "ceiling: consume + ColumnDecoder → typed columns":
            lambda: _consume(bootstrap, topic, ends, {}, lambda msgs: ceiling.columns(_values(msgs)).num_rows),
        "ceiling, cyclic GC paused (as the source reads)": _gc_paused(
            lambda: _consume(bootstrap, topic, ends, {}, lambda msgs: ceiling.columns(_values(msgs)).num_rows)),
        "source: KafkaStreamReader.read (validate, key groups, packs)": source({}),
        "source, librdkafka's fetch defaults (before)": source(LIBRDKAFKA_DEFAULTS),
    }
    return _rounds(rows, rounds)


class _SinkInput:
    """Result records to write: the topic's transactions decoded once (typed columns, keys)."""

    def __init__(self, bootstrap: str, topic: str, ends: dict[int, int]):
        from ctiflow.jobs.avro.serde import AvroSerializer

        ceiling = _Ceiling(bootstrap, topic)
        tables: list[pa.Table] = []
        _consume(bootstrap, topic, ends, {}, lambda msgs: tables.append(ceiling.columns(_values(msgs))) or len(msgs))
        self.chunks: list[pa.Table] = []  # as an operator's output batches come
        self.n = 0
        for t in tables:
            if self.n >= SINK_RECORDS:
                break
            self.chunks.append(t.combine_chunks())
            self.n += t.num_rows
        self.serializer = AvroSerializer("transaction")

    def encoder(self):
        import json

        from ctiflow.jobs.avro.encode import ColumnEncoder

        return ColumnEncoder(json.loads(self.serializer.schema.text), self.serializer.header)

    def columns(self, table: pa.Table) -> dict:
        return {c: table.column(c) for c in table.column_names}


def sink_measure(bootstrap: str, source_topic: str, ends: dict[int, int], rounds: int = 5) -> list[dict]:
    """The sink's rows: records already decoded (an operator's output), encoded and produced."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.core import rows as result_rows
    from ctiflow.jobs.datapath.sink import KafkaStreamWriter, SinkOptions, partition_for

    given = _SinkInput(bootstrap, source_topic, ends)
    out_topic = "bench-sink-out"
    kafka.create_topics(bootstrap, {out_topic: PARTITIONS})
    encoder = given.encoder()
    encoded = [(t.column("account").cast(pa.binary()).to_pylist(), encoder.encode(given.columns(t), t.num_rows).to_pylist())
               for t in given.chunks]

    def produce(pairs) -> int:
        prod = kafka.producer(bootstrap)
        n = 0
        for keys, values in pairs():
            for key, value in zip(keys, values):
                kafka.send(prod, out_topic, value, key, partition=partition_for(key, value, PARTITIONS))
            n += len(values)
            prod.poll(0)
        if prod.flush(120):
            raise RuntimeError("bench sink: records not delivered")
        return n

    def produce_with_ids(pairs) -> int:
        """As :func:`produce`, each record with an exactly-once id in headers as the sink writes it."""
        from ctiflow.jobs.datapath.sink import H_BATCH, H_QUERY, H_SEQ, H_TASK

        prod = kafka.producer(bootstrap)
        fixed = ((H_QUERY, b"0" * 36), (H_BATCH, b"1"), (H_TASK, b"0"))
        n = 0
        for keys, values in pairs():
            for key, value in zip(keys, values):
                kafka.send(prod, out_topic, value, key, partition=partition_for(key, value, PARTITIONS),
                           headers=[*fixed, (H_SEQ, str(n).encode())])
                n += 1
            prod.poll(0)
        if prod.flush(120):
            raise RuntimeError("bench sink: records not delivered")
        return n

    def ceiling_pairs():
        for t in given.chunks:
            values = encoder.encode(given.columns(t), t.num_rows)
            yield t.column("account").cast(pa.binary()).to_pylist(), values.to_pylist()

    def sink() -> int:
        # What the adapter does with an operator's output batches (encode in bulk, packs, output
        # rows) and what the sink does with the rows (exactly-once headers, partition, produce).
        enc = result_rows.ResultEncoder({out_topic: given.serializer}, "late", "dead")
        packs = result_rows.ResultPacks()
        for t in given.chunks:
            packs.add_batch(out_topic, result_rows.result_batch(t.column("account"), enc.bulk(out_topic).encode(
                given.columns(t), t.num_rows), "match"))
        frame = result_rows.output_frame(packs.order, {})
        batch = pa.RecordBatch.from_pandas(frame, preserve_index=False)
        writer = KafkaStreamWriter(SinkOptions(bootstrap, topics=(out_topic,)))
        return writer.write(iter([batch])).written

    runs: dict[str, Callable[[], int]] = {
        "produce: confluent-kafka produce (values encoded beforehand)": lambda: produce(lambda: iter(encoded)),
        "encode: ColumnEncoder alone": lambda: sum(len(encoder.encode(given.columns(t), t.num_rows)) for t in given.chunks),
        "ceiling: ColumnEncoder → produce each": lambda: produce(ceiling_pairs),
        "ceiling, cyclic GC paused (as the sink writes)": _gc_paused(lambda: produce(ceiling_pairs)),
        "ceiling + the exactly-once headers (4 a record, as the sink's)": lambda: produce_with_ids(ceiling_pairs),
        "sink: encode, packs, KafkaStreamWriter.write (exactly-once headers)": sink,
    }
    return _rounds(runs, rounds)


def _rounds(runs: dict[str, Callable[[], int]], rounds: int) -> list[dict]:
    samples: dict[str, list[tuple[int, float, float]]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(_timed(run))
    out = []
    for name, got in samples.items():
        n = got[0][0]
        cpu = statistics.median(c for _, c, _ in got)
        wall = statistics.median(w for _, _, w in got)
        out.append({"name": name, "messages": n, "cpu_us": 1e6 * cpu / n, "wall_us": 1e6 * wall / n, "rate": n / wall})
    return out


def spark_rows(bootstrap: str, topic: str, home: str) -> list:
    """The Spark rows (module docstring) as :class:`ctiflow.bench.spark_jobs.Figures`."""
    from ctiflow.bench.spark_jobs import PeakMemory, _source, figures, source_spec, warm_up
    from ctiflow.jobs.driver.pipeline import spark_session

    spark = spark_session()
    try:
        def noop(name: str, client: dict, tag: str = ""):
            df = _source(spark, bootstrap, source_spec(topic, SPARK_BATCH), "packed", client)
            with PeakMemory() as mem:
                q = (df.writeStream.format("noop").option("checkpointLocation", f"{home}/ck{tag}-{len(client)}")
                     .trigger(availableNow=True).start())
                q.awaitTermination()
            return figures(name, q.recentProgress, mem.peak)

        warm_up(lambda tag: noop("warm-up", {}, tag))
        return [noop("Spark: the source → noop sink", {}),
                noop("Spark: the source → noop sink, librdkafka's fetch defaults (before)", LIBRDKAFKA_DEFAULTS)]
    finally:
        spark.stop()


def _table(out: Console, title: str, rows: list[dict], unit: str) -> None:
    ceiling = min((r for r in rows if r["name"].startswith("ceiling")), key=lambda r: r["cpu_us"])
    t = Table(title=title)
    for col in ("path", f"CPU µs/{unit[:-1]}", f"wall µs/{unit[:-1]}", f"{unit}/s (wall)", "CPU / best ceiling"):
        t.add_column(col, justify="left" if col == "path" else "right")
    for r in rows:
        t.add_row(r["name"], f"{r['cpu_us']:.2f}", f"{r['wall_us']:.2f}", f"{r['rate']:,.0f}",
                  f"{r['cpu_us'] / ceiling['cpu_us']:.2f}×")
    out.print(t)


def main(out: Console | None = None, events: int = 1_000_000, rounds: int = 5, *,
         record_figures: bool = False) -> list[dict]:
    """The three tables (module docstring); ``record_figures``: write the rows ``source`` and
    ``sink`` of bench/figures.yaml (``ctiflow bench source`` at its defaults)."""
    from ctiflow.bench.spark_jobs import produce_transactions
    from ctiflow.jobs.ops import stack

    out = out or Console(width=200)
    home = tempfile.mkdtemp(prefix="ctiflow-bench-source-")
    os.environ["CTIFLOW_HOME"] = home  # the broker's pid file and Spark's files
    port = stack.free_port()
    stack.up(port)
    try:
        bootstrap = f"127.0.0.1:{port}"
        produce_transactions(bootstrap, "bench-source", events, keys=10_000, partitions=PARTITIONS)
        rows = measure(bootstrap, "bench-source", rounds)
        sink = sink_measure(bootstrap, "bench-source", _ranges(bootstrap, "bench-source"), rounds)
        produce_transactions(bootstrap, "bench-source-spark", SPARK_EVENTS, keys=10_000, partitions=PARTITIONS)
        spark = spark_rows(bootstrap, "bench-source-spark", home)
    finally:
        stack.down(port)
        shutil.rmtree(home, ignore_errors=True)
    _table(out, f"ctiflow bench source: {events:,} transactions, {PARTITIONS} partitions, one Python process, "
                f"median of {rounds} interleaved rounds", rows, "messages")
    ceiling = min((r for r in rows if r["name"].startswith("ceiling")), key=lambda r: r["cpu_us"])
    source = next(r for r in rows if r["name"].startswith("source:"))
    out.print(f"source / ceiling (CPU): {source['cpu_us'] / ceiling['cpu_us']:.2f}× (goal ≤ 1.2×); "
              f"source: {source['cpu_us']:.2f} µs a message (goal ≤ 2.2)")
    _table(out, f"ctiflow bench source — the sink: {sink[0]['messages']:,} result records encoded and produced, one Python "
                f"process, median of {rounds} interleaved rounds", sink, "records")
    sink_ceiling = min((r for r in sink if r["name"].startswith("ceiling")), key=lambda r: r["cpu_us"])
    ours = next(r for r in sink if r["name"].startswith("sink:"))
    headers = next(r for r in sink if r["name"].startswith("ceiling + "))
    out.print(f"sink / ceiling (CPU): {ours['cpu_us'] / sink_ceiling['cpu_us']:.2f}× (goal ≤ 1.2×); "
              f"sink / ceiling with the exactly-once headers: {ours['cpu_us'] / headers['cpu_us']:.2f}×")
    s = Table(title=f"ctiflow bench source in Spark: the source → noop, {SPARK_BATCH:,} records a micro-batch "
                    "(sustained: the first half of the batches left out)")
    for col in ("query", "events/s", "batches", "p50 batch ms", "p99 batch ms"):
        s.add_column(col, justify="left" if col == "query" else "right")
    for f in spark:
        s.add_row(f.name, f"{f.rate:,.0f}", str(f.batches), f"{f.p50_ms:,.0f}", f"{f.p99_ms:,.0f}")
    out.print(s)
    out.print(f"Spark's source, today's settings / librdkafka's defaults: {spark[0].rate / spark[1].rate:.2f}×")
    if record_figures:
        _record(rows, sink, spark)
    return rows + [{"name": f.name, "rate": f.rate, "batches": f.batches} for f in spark]


def _record(rows: list[dict], sink: list[dict], spark: list) -> None:
    """The figures rows ``source`` and ``sink`` (bench/figures.yaml) with their full tables."""
    from ctiflow.bench.figures import record

    def first(of: list[dict], prefix: str) -> dict:
        return next(r for r in of if r["name"].startswith(prefix))

    def table(of: list[dict], unit: str) -> list[dict]:
        return [{"path": r["name"], f"CPU µs a {unit}": f"{r['cpu_us']:.2f}", f"wall µs a {unit}": f"{r['wall_us']:.2f}",
                 f"{unit}s/s (wall)": f"{r['rate'] / 1e3:,.1f}k"} for r in of]

    ours, plain, paused = first(rows, "source:"), first(rows, "ceiling:"), first(rows, "ceiling, cyclic GC")
    record("source", {
        "us": f"{ours['cpu_us']:.2f}", "ceiling": f"{plain['cpu_us']:.2f}",
        "ratio": f"{ours['cpu_us'] / plain['cpu_us']:.2f}", "paused": f"{paused['cpu_us']:.2f}",
        "paused_ratio": f"{ours['cpu_us'] / paused['cpu_us']:.2f}",
        "gap": f"{ours['cpu_us'] - paused['cpu_us']:.2f}", "spark": f"{spark[0].rate / 1e3:,.1f}k",
        "spark_defaults": f"{spark[1].rate / 1e3:,.1f}k", "spark_ratio": f"{spark[0].rate / spark[1].rate:.2f}"},
        table=table(rows, "message") + [{"path": f"Spark: {f.name}", "CPU µs a message": "",
                                         "wall µs a message": "", "messages/s (wall)": f"{f.rate / 1e3:,.1f}k"}
                                        for f in spark])
    ours, plain, headers = first(sink, "sink:"), first(sink, "ceiling:"), first(sink, "ceiling + ")
    record("sink", {
        "us": f"{ours['cpu_us']:.2f}", "ceiling": f"{plain['cpu_us']:.2f}",
        "ratio": f"{ours['cpu_us'] / plain['cpu_us']:.2f}", "headers": f"{headers['cpu_us']:.2f}",
        "headers_ratio": f"{ours['cpu_us'] / headers['cpu_us']:.2f}"}, table=table(sink, "record"))
