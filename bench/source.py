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
  metadata, no dead letters): the Python ceiling for what the source does;
* **source**: the project's :meth:`KafkaStreamReader.read
  <ctiflow.jobs.source.reader.KafkaStreamReader.read>` as an executor runs it (decode, validate,
  key groups, packs, frontier rows);
* **source, librdkafka defaults**: the same with the consumer settings the project used before
  (``fetch.queue.backoff.ms`` = 1,000 ms): the stall after every over-full fetch, in wall time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.table import Table

#: librdkafka's own defaults for the settings :func:`ctiflow.jobs.kafka.consumer` now chooses
#: (the "before" row of the stall finding).
LIBRDKAFKA_DEFAULTS = {"fetch.queue.backoff.ms": "1000", "queued.min.messages": "100000",
                       "queued.max.messages.kbytes": "65536"}
PARTITIONS = 2


def _options(bootstrap: str, topic: str, client: dict) -> dict:
    import json

    return {"bootstrap": bootstrap, "topic": topic, "schema": "transaction", "key_field": "account",
            "time_field": "event_time", "key_groups": "8", "values": "errors", "client": json.dumps(client)}


def _ranges(bootstrap: str, topic: str) -> dict[int, int]:
    from ctiflow.jobs import kafka

    cons = kafka.consumer(bootstrap, {}, **{"group.id": "bench-source-ends"})
    try:
        return {p: kafka.true_end_offset(cons, topic, p, 0, timeout=3.0) for p in kafka.topic_partitions(bootstrap, topic)}
    finally:
        cons.close()


def _consume(bootstrap: str, topic: str, ends: dict[int, int], client: dict, each: Callable[[list], int]) -> int:
    """Read every range with a fresh consumer per range (as a task does); ``each(msgs)`` → rows."""
    from ctiflow.jobs import kafka

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
        from ctiflow.jobs.source.decoder import RecordDecoder

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


def _timed(run: Callable[[], int]) -> tuple[int, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    n = run()
    return n, time.process_time() - cpu, time.perf_counter() - wall


def measure(bootstrap: str, topic: str, rounds: int = 5) -> list[dict]:
    """The rows of the table (see the module docstring), each a median over ``rounds``."""
    from ctiflow.jobs.source.reader import KafkaStreamReader, OffsetRange

    ends = _ranges(bootstrap, topic)
    ceiling = _Ceiling(bootstrap, topic)
    fetched: list[list] = []
    _consume(bootstrap, topic, ends, {}, lambda msgs: fetched.append(_values(msgs)) or len(msgs))

    def source(client: dict) -> Callable[[], int]:
        def run() -> int:
            reader = KafkaStreamReader(_options(bootstrap, topic, client))
            for p, end in ends.items():
                for _ in reader.read(OffsetRange(p, 0, end)):
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
        "source: KafkaStreamReader.read (validate, key groups, packs)": source({}),
        "source, librdkafka's fetch defaults (before)": source(LIBRDKAFKA_DEFAULTS),
    }
    samples: dict[str, list[tuple[int, float, float]]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, run in rows.items():
            samples[name].append(_timed(run))
    out = []
    for name, got in samples.items():
        n = got[0][0]
        cpu = statistics.median(c for _, c, _ in got)
        wall = statistics.median(w for _, _, w in got)
        out.append({"name": name, "messages": n, "cpu_us": 1e6 * cpu / n, "wall_us": 1e6 * wall / n, "rate": n / wall})
    return out


def main(out: Console | None = None, events: int = 1_000_000, rounds: int = 5) -> list[dict]:
    from ctiflow.bench.spark_jobs import produce_transactions
    from ctiflow.jobs import stack

    out = out or Console(width=200)
    port = stack.free_port()
    stack.up(port)
    try:
        bootstrap = f"127.0.0.1:{port}"
        produce_transactions(bootstrap, "bench-source", events, keys=10_000, partitions=PARTITIONS)
        rows = measure(bootstrap, "bench-source", rounds)
    finally:
        stack.down(port)
    ceiling = next(r for r in rows if r["name"].startswith("ceiling"))
    t = Table(title=f"ctiflow bench source: {events:,} transactions, {PARTITIONS} partitions, one Python process, "
                    f"median of {rounds} interleaved rounds")
    for col in ("path", "CPU µs/message", "wall µs/message", "messages/s (wall)", "CPU / ceiling"):
        t.add_column(col, justify="left" if col == "path" else "right")
    for r in rows:
        t.add_row(r["name"], f"{r['cpu_us']:.2f}", f"{r['wall_us']:.2f}", f"{r['rate']:,.0f}",
                  f"{r['cpu_us'] / ceiling['cpu_us']:.2f}×")
    out.print(t)
    return rows
