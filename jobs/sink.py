"""Kafka sink for result topics: a PySpark 4 Python Data Source (stream writer), exactly-once.

Rows are the adapter's output rows (:mod:`ctiflow.jobs.rows`): ``(topic, key, value, kind)`` with the
values already Avro-encoded, many records a row.

**Exactly-once without transactions.** Spark replays a micro-batch whose commit did not
complete (a crash, a kill -9). The adapter makes a batch's output deterministic on replay
(same offsets, same state, rows sorted by partition/offset), so each record is identified by
``(query, batch, task, seq)``, carried in headers ``ctiflow.query`` (the streaming query's id,
kept in the checkpoint) / ``ctiflow.batch`` / ``ctiflow.task`` / ``ctiflow.seq``,
and the partition is chosen by us (a hash of the key, or of the value when there is none), so a
replayed record goes to the same partition as the first time. Before writing, a task leaves a
marker ``<state_dir>/<batch>-<task>.started``; if the marker is already there this is a replay:
the task reads the tail of every output partition back to the batch's first record, collects the
``seq`` numbers of ``(query, batch, task)`` already there and skips exactly those. This does not depend
on ``read_committed`` (tansu does not honour it). The state directory must be visible to every
executor (local mode: a local path; a cluster: a shared file system), like the checkpoint.

``kind = "metrics"`` rows are not written: the writers sum them and the driver's ``commit``
appends one JSON line per micro-batch to the job's progress file (a replayed batch gets a
second line; :func:`ctiflow.jobs.checkpoint.read_counters` keeps the last).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from ctiflow.jobs import kafka, rows
from ctiflow.jobs.alloc import cyclic_gc_paused
from ctiflow.jobs.kafka import low_offset, read_range, true_end_offset
from ctiflow.jobs import counters

H_QUERY, H_BATCH, H_TASK, H_SEQ = "ctiflow.query", "ctiflow.batch", "ctiflow.task", "ctiflow.seq"


@dataclass
class SinkCommit(WriterCommitMessage):
    written: int = 0
    skipped: int = 0
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options, typed and parsed once (Spark passes a string map)."""

    bootstrap: str
    client: dict = field(default_factory=dict)  # public librdkafka settings (no credentials)
    topics: tuple[str, ...] = ()  # every result topic (their partition counts are read once per task)
    state_dir: str | None = None  # replay markers; visible to every executor, like the checkpoint
    progress: str | None = None  # JSON-lines file: one line of counters per micro-batch

    def to_options(self) -> dict[str, str]:
        opts = {"bootstrap": self.bootstrap, "client": json.dumps(self.client), "topics": json.dumps(list(self.topics))}
        opts.update({k: v for k, v in (("state_dir", self.state_dir), ("progress", self.progress)) if v})
        return opts

    @classmethod
    def from_options(cls, options) -> "SinkOptions":
        o = {k.lower(): v for k, v in options.items()}
        return cls(bootstrap=o["bootstrap"], client=json.loads(o.get("client", "{}")),
                   topics=tuple(json.loads(o.get("topics", "[]"))), state_dir=o.get("state_dir") or None,
                   progress=o.get("progress") or None)


class KafkaSink(DataSource):
    """``writeStream.format("ctiflow_kafka_sink").options(**SinkOptions(...).to_options())``."""

    @classmethod
    def name(cls) -> str:
        return "ctiflow_kafka_sink"

    def schema(self) -> str:
        return rows.OUTPUT_DDL

    def streamWriter(self, schema, overwrite: bool) -> "KafkaStreamWriter":
        return KafkaStreamWriter(SinkOptions.from_options(self.options))



def _query_and_batch() -> tuple[str, int]:
    """The streaming query's id (kept in the checkpoint, the same after a restart) and the
    micro-batch id, from the task's local properties; ``("", -1)`` outside Spark."""
    ctx = TaskContext.get()
    if ctx is None:
        return "", -1
    query, batch = ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty("streaming.sql.batchId")
    if not query or batch is None:
        # Without them every batch would share one marker and a replay would skip other
        # batches' records: refuse rather than lose results.
        raise RuntimeError("Kafka sink: Spark did not pass the streaming query/batch id to the task "
                           f"(query {query!r}, batch {batch!r}); it only runs as a streaming sink")
    return query, int(batch)


def partition_for(key: bytes | None, value: bytes, partitions: int) -> int:
    """Deterministic partition: the same record lands in the same partition on a replay."""
    return zlib.crc32(key if key else value) % partitions


def landed(cons, topic: str, partition: int, query: str, batch: int, task: int) -> set[int]:
    """``seq`` numbers of records of ``(query, batch, task)`` already in ``topic[partition]``:
    scan the tail backwards (in growing chunks) until a record of an earlier batch of this query
    shows up. Other queries' records (another job sharing the topic, or an earlier run of this
    one with a fresh checkpoint, whose batch ids start again at 0) are passed over: neither ours
    nor that boundary, so a query's first batch scans the partition down to its low offset."""
    low = low_offset(cons, topic, partition)
    end = true_end_offset(cons, topic, partition, 0, require_eof=True)  # the tail is where ours are
    seqs: set[int] = set()
    step, hi = 256, end
    while hi > low:
        lo = max(low, hi - step)
        older = False
        for msgs in read_range(cons, topic, partition, lo, hi):
            for m in msgs:
                h = dict(m.headers or ())
                if h.get(H_QUERY, b"").decode() != query:
                    continue
                b = int(h.get(H_BATCH, b"-1"))
                if b < batch:
                    older = True
                elif b == batch and int(h.get(H_TASK, b"-1")) == task:
                    seqs.add(int(h[H_SEQ]))
        if older:
            break
        hi, step = lo, step * 4
    return seqs



#: Seconds a Python worker trusts the result topics' partition counts it read (one metadata
#: request per this interval, not one per topic and task).
PARTITIONS_TTL = 30.0
_PRODUCERS: dict[tuple, Any] = {}
_PARTITIONS: dict[tuple, tuple[float, dict[str, int]]] = {}


def _config_key(bootstrap: str, client: dict) -> tuple:
    return bootstrap, tuple(sorted(client.items())), tuple(sorted(kafka.env_credentials().items()))


def worker_producer(bootstrap: str, client: dict):
    """The Python worker's producer for this cluster, kept across tasks: a new idempotent
    producer waits ≈ 0.5 s for its producer id before its first record is acknowledged
    (measured against the embedded broker), which one per task paid on every micro-batch. Each
    task still flushes before it reports success; a task that fails drops the producer
    (:func:`drop_producer`), so a purged or fatally failed one is never reused. Nor is one that
    reported a client error (its ``error_cb``: a lost connection, all brokers down) since its
    last task: after a broker outage — a restarted broker may not know its producer id, and it
    would never get its records acknowledged — the next task starts with a fresh producer."""
    key = _config_key(bootstrap, client)
    kept = _PRODUCERS.get(key)
    if kept is not None:
        prod, errors = kept
        prod.poll(0)  # serve the client errors queued while it sat idle between tasks
        if not errors:
            return prod
        _PRODUCERS.pop(key, None)
    errors: list = []
    prod = kafka.producer(bootstrap, client, error_cb=errors.append)
    _PRODUCERS[key] = (prod, errors)
    return prod


def drop_producer(bootstrap: str, client: dict) -> None:
    _PRODUCERS.pop(_config_key(bootstrap, client), None)


def partition_counts(bootstrap: str, client: dict, topics) -> dict[str, int]:
    """The topics' partition counts, read at most once per :data:`PARTITIONS_TTL` per worker."""
    key = (_config_key(bootstrap, client), tuple(sorted(topics)))
    hit = _PARTITIONS.get(key)
    now = time.monotonic()
    if hit is None or now - hit[0] > PARTITIONS_TTL:
        hit = _PARTITIONS[key] = (now, {t: len(p) for t, p in kafka.partitions_of(bootstrap, topics, client).items()})
    return dict(hit[1])


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """Arrow record batches in (far cheaper than one Python ``Row`` per record)."""

    def __init__(self, options: "SinkOptions | dict[str, str]"):
        self.options = options if isinstance(options, SinkOptions) else SinkOptions.from_options(options)

    def _state_dir(self) -> Path | None:
        if not self.options.state_dir:
            return None
        path = Path(self.options.state_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write(self, iterator: Iterator) -> SinkCommit:
        with cyclic_gc_paused():  # (see ctiflow.jobs.alloc)
            return self._write(iterator)

    def _write(self, iterator: Iterator) -> SinkCommit:
        client, bootstrap = self.options.client, self.options.bootstrap
        query, batch = _query_and_batch()
        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx else 0
        topics = self.options.topics
        parts = partition_counts(bootstrap, client, topics)
        skip: dict[tuple[str, int], set[int]] = {}
        state = self._state_dir()
        if state is not None:
            marker = state / f"{batch}-{task}.started"
            if marker.exists():  # a replay of a batch this task already began writing
                cons = kafka.consumer(bootstrap, client, **{"group.id": "ctiflow-sink-recovery"})
                try:
                    skip = {(t, p): landed(cons, t, p, query, batch, task) for t, n in parts.items() for p in range(n)}
                finally:
                    cons.close()
            else:
                marker.write_text(str(time.time()))
        prod = worker_producer(bootstrap, client)
        try:
            return self._send(iterator, prod, parts, skip, query, batch, task)
        except BaseException:
            prod.purge()  # nothing of this failed attempt may land after the replay's scan
            drop_producer(bootstrap, client)
            raise

    def _send(self, iterator, prod, parts: dict[str, int], skip: dict, query: str, batch: int,
              task: int) -> SinkCommit:
        bootstrap, client = self.options.bootstrap, self.options.client
        errors: list[str] = []

        def report(err, msg):
            if err is not None:
                errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

        written = skipped = seq = 0
        metrics: dict[str, int] = {}
        per_topic: dict[str, int] = {}  # records written per topic (counter "written" by topic)
        q_header, b_header, t_header = query.encode(), str(batch).encode(), str(task).encode()
        for topic, key, value in rows.output_records(iterator, metrics):
            n = parts.get(topic) or parts.setdefault(topic, len(kafka.topic_partitions(bootstrap, topic, client)))
            partition = partition_for(key, value, n)
            this = seq
            seq += 1
            if skip and this in skip.get((topic, partition), ()):
                skipped += 1
                continue
            headers = [(H_QUERY, q_header), (H_BATCH, b_header), (H_TASK, t_header), (H_SEQ, str(this).encode())]
            kafka.send(prod, topic, value, key, partition=partition, headers=headers, on_delivery=report)
            written += 1
            per_topic[topic] = per_topic.get(topic, 0) + 1
            if written % 10000 == 0:
                prod.poll(0)
        remaining = prod.flush(120)
        if remaining or errors:
            raise RuntimeError(f"Kafka sink: {remaining} records not delivered; errors: {errors[:5]}")
        metrics.update((counters.key("written", topic), n) for topic, n in per_topic.items())
        return SinkCommit(written, skipped, metrics)

    def commit(self, messages, batchId: int) -> None:
        state = self._state_dir()
        if state is not None:
            # Keep this batch's markers: Spark writes its commit log *after* this call, so a kill
            # in between replays the batch, and only the markers make that replay skip what
            # landed. Running batch N means batch N - 1 is in the commit log: its markers can go.
            for marker in state.glob("*.started"):
                if int(marker.stem.rsplit("-", 1)[0]) < batchId:
                    marker.unlink(missing_ok=True)
        path = self.options.progress
        if not path:
            return
        totals: dict[str, int] = {"written": 0, "replay_skipped": 0}
        for m in messages:
            if m is None:
                continue
            totals["written"] += m.written
            totals["replay_skipped"] += m.skipped
            counters.merge(totals, m.metrics)
        with open(path, "a") as out:
            out.write(json.dumps({"batch": batchId, "time": time.time(), **totals}) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def abort(self, messages, batchId: int) -> None:
        pass
