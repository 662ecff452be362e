"""Kafka sink for result topics: a PySpark 4 Python Data Source (stream writer).

Rows are ``(topic, key, value, kind)`` with ``value`` already Avro-encoded by the adapter.
Executors produce with an idempotent ``acks=all`` producer; every record carries headers
``ctiflow.batch`` / ``ctiflow.task`` / ``ctiflow.seq`` (micro-batch id, writer partition,
position) — output of a micro-batch is deterministic on replay, so these identify a record
across a crash and restart. ``kind = "metrics"`` rows are not written: the writers sum them
and the driver's ``commit`` appends one JSON line per micro-batch to the job's progress file
(counters in / released / late / dead-letter / outputs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage


@dataclass
class SinkCommit(WriterCommitMessage):
    written: int = 0
    metrics: dict = field(default_factory=dict)


class KafkaSink(DataSource):
    """``writeStream.format("ctiflow_kafka_sink")`` with options ``bootstrap``, ``client`` (JSON
    librdkafka settings) and ``progress`` (a JSON-lines file for per-batch counters)."""

    @classmethod
    def name(cls) -> str:
        return "ctiflow_kafka_sink"

    def schema(self) -> str:
        return "topic string, key binary, value binary, kind string"

    def streamWriter(self, schema, overwrite: bool) -> "KafkaStreamWriter":
        return KafkaStreamWriter({k.lower(): v for k, v in self.options.items()})


def _batch_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    return int(value) if value is not None else -1


class KafkaStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: dict[str, str]):
        self.options = options

    def write(self, iterator: Iterator) -> SinkCommit:
        from pyspark import TaskContext

        from jobs.kafka import producer

        client = json.loads(self.options.get("client", "{}"))
        prod = producer(self.options["bootstrap"], client)
        batch = str(_batch_id()).encode()
        ctx = TaskContext.get()
        task = str(ctx.partitionId() if ctx else 0).encode()
        errors: list[str] = []

        def report(err, msg):
            if err is not None:
                errors.append(f"{msg.topic()}: {err}")

        written, seq = 0, 0
        metrics: dict[str, int] = {}
        for row in iterator:
            if row.kind == "metrics":
                for k, v in json.loads(row.value).items():
                    metrics[k] = metrics.get(k, 0) + v
                continue
            headers = [("ctiflow.batch", batch), ("ctiflow.task", task), ("ctiflow.seq", str(seq).encode())]
            seq += 1
            while True:
                try:
                    prod.produce(row.topic, value=row.value, key=row.key, headers=headers, on_delivery=report)
                    break
                except BufferError:
                    prod.poll(0.1)
            written += 1
            if written % 10000 == 0:
                prod.poll(0)
        remaining = prod.flush(120)
        if remaining or errors:
            raise RuntimeError(f"Kafka sink: {remaining} records not delivered, errors: {errors[:5]}")
        return SinkCommit(written, metrics)

    def commit(self, messages, batchId: int) -> None:
        path = self.options.get("progress")
        if not path:
            return
        totals: dict[str, int] = {"written": 0}
        for m in messages:
            if m is None:
                continue
            totals["written"] += m.written
            for k, v in m.metrics.items():
                totals[k] = totals.get(k, 0) + v
        with open(path, "a") as out:
            out.write(json.dumps({"batch": batchId, "time": time.time(), **totals}) + "\n")

    def abort(self, messages, batchId: int) -> None:
        pass
