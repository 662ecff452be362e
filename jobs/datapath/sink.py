"""Kafka sink for result topics: a PySpark 4 Python Data Source (stream writer), exactly-once.

Rows are the adapter's output rows (:mod:`ctiflow.jobs.core.rows`): ``(topic, key, value, kind)`` with the
values already Avro-encoded, many records a row.

**Exactly-once without transactions.** Spark replays a micro-batch whose commit did not
complete (a crash, a kill -9). The adapter makes a batch's output deterministic on replay
(same offsets, same state, rows sorted by partition/offset), so each record is identified by
``(query, batch, task, seq)``, carried in headers ``ctiflow.query`` (the streaming query's id,
kept in the checkpoint) / ``ctiflow.batch`` / ``ctiflow.task`` / ``ctiflow.seq``,
and the partition is chosen by us (a hash of the key, or of the value when there is none), so a
replayed record goes to the same partition as the first time. Before writing, a task leaves a
*marker* ``(query, batch, task)`` in the job's marker topic (``<job>.ctiflow-markers``, a
partition per task, created with the result topics) and waits for it to land; if a marker of
its ``(query, batch, task)`` is already there — an earlier attempt began, whether Spark retried
the task, re-ran its stage or replays the batch after a restart — this is a replay: the task
reads the tail of every output partition back to the batch's first record, collects the ``seq``
numbers of ``(query, batch, task)`` already there and skips exactly those. A batch the
checkpoint had planned before this run started (option ``replay_through``, from Spark's offset
log) is treated as a replay whatever the markers say, and so is a later batch whose marker
partition holds no marker of its query at all (the topic was deleted, and created again by the
first task to miss it): nothing tells whether an attempt began. This does not depend on
``read_committed`` (tansu does not honour it), and the executors keep nothing on a disk: any
checkpoint location Spark accepts works without a file system shared with them. A record of the
marker or progress topic ctiflow did not write is skipped with a warning, and a missing one is
created again (:mod:`ctiflow.jobs.datapath.own_topics`).

``kind = "metrics"`` rows are not written: the writers sum them and the driver's ``commit``
writes one record per micro-batch to the job's progress topic (a replayed batch gets a second
one; :func:`ctiflow.jobs.driver.checkpoint.read_counters` keeps the last).
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from ctiflow.jobs.datapath import kafka, own_topics
from ctiflow.jobs.core import rows
from ctiflow.jobs.core.alloc import cyclic_gc_paused
from ctiflow.jobs.datapath.kafka import low_offset, read_range, true_end_offset
from ctiflow.jobs.core import counters
from ctiflow.jobs.datapath.own_topics import ForeignRecord, marker_record
from ctiflow.jobs.state.keyhash import crc32_column
from ctiflow.operators.errors import StackError

H_QUERY, H_BATCH, H_TASK, H_SEQ = "ctiflow.query", "ctiflow.batch", "ctiflow.task", "ctiflow.seq"


@dataclass
class SinkCommit(WriterCommitMessage):
    written: int = 0
    skipped: int = 0
    metrics: dict = field(default_factory=dict)
    query: str = ""


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options, typed and parsed once (Spark passes a string map)."""

    bootstrap: str
    client: dict = field(default_factory=dict)  # public librdkafka settings (no credentials)
    topics: tuple[str, ...] = ()  # every result topic (their partition counts are read once per task)
    markers: str | None = None  # the marker topic (exactly-once); None: no replay detection
    marker_partitions: int | None = None  # what the marker topic is created again with if it is gone
    replay_through: int | None = None  # batches up to this one were planned before this run: replays
    progress: str | None = None  # the progress topic: a record of counters per micro-batch

    def to_options(self) -> dict[str, str]:
        opts = {"bootstrap": self.bootstrap, "client": json.dumps(self.client),
                "topics": json.dumps(list(self.topics))}
        opts.update({k: v for k, v in (("markers", self.markers), ("progress", self.progress)) if v})
        if self.replay_through is not None:
            opts["replay_through"] = str(self.replay_through)
        if self.marker_partitions is not None:
            opts["marker_partitions"] = str(self.marker_partitions)
        return opts

    @classmethod
    def from_options(cls, options) -> "SinkOptions":
        o = {k.lower(): v for k, v in options.items()}
        return cls(bootstrap=o["bootstrap"], client=json.loads(o.get("client", "{}")),
                   topics=tuple(json.loads(o.get("topics", "[]"))), markers=o.get("markers") or None,
                   replay_through=int(o["replay_through"]) if o.get("replay_through") else None,
                   progress=o.get("progress") or None,
                   marker_partitions=int(o["marker_partitions"]) if o.get("marker_partitions") else None)


class KafkaSink(DataSource):
    """``writeStream.format("ctiflow_kafka_sink").options(**SinkOptions(...).to_options())``."""

    @classmethod
    def name(cls) -> str:
        return "ctiflow_kafka_sink"

    def schema(self) -> str:
        return rows.OUTPUT_DDL

    def streamWriter(self, schema, overwrite: bool) -> "KafkaStreamWriter":
        """On the driver, as the query starts: the marker topic's partition count is read here
        (``prepare`` created it), so a task that finds the topic gone creates it again alike."""
        options = SinkOptions.from_options(self.options)
        if options.markers and options.marker_partitions is None:
            try:
                count = kafka.list_topics(options.bootstrap, options.client).get(options.markers)
            except KafkaException:  # the broker is away: a task that misses the topic uses what it saw
                count = None
            options = replace(options, marker_partitions=count)
        return KafkaStreamWriter(options)



def _query_and_batch() -> tuple[str, int]:
    """The streaming query's id (kept in the checkpoint, the same after a restart) and the
    micro-batch id, from the task's local properties; ``("", -1)`` outside Spark."""
    ctx = TaskContext.get()
    if ctx is None:
        return "", -1
    query, batch = (ctx.getLocalProperty("sql.streaming.queryId"),
                    ctx.getLocalProperty("streaming.sql.batchId"))
    if not query or batch is None:
        # Without them every batch would share one marker and a replay would skip other
        # batches' records: refuse rather than lose results.
        raise RuntimeError("Kafka sink: Spark did not pass the streaming query/batch id to the task "
                           f"(query {query!r}, batch {batch!r}); it only runs as a streaming sink")
    return query, int(batch)


def partition_for(key: bytes | None, value: bytes, partitions: int) -> int:
    """Deterministic partition: the same record lands in the same partition on a replay."""
    return zlib.crc32(key if key else value) % partitions


def partitions_for(keys: pa.Array, values: pa.Array, partitions: int) -> list[int]:
    """:func:`partition_for` of every record of a pack: the keys hashed as one column
    (:func:`ctiflow.jobs.state.keyhash.crc32_column`), a record without a key by its value."""
    crc = crc32_column(keys)
    unkeyed = np.flatnonzero(np.asarray(pc.fill_null(pc.binary_length(keys), 0)) == 0)
    if len(unkeyed):
        raw = values.take(pa.array(unkeyed)).to_pylist()
        crc[unkeyed] = np.fromiter([zlib.crc32(v) for v in raw], np.uint32, len(raw))
    return (crc % partitions).tolist()


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


def began(cons, topic: str, partitions: int, query: str, batch: int, task: int) -> bool:
    """Whether an attempt of ``(query, batch, task)`` may have begun before this one: its marker
    is in partition ``task mod partitions`` of the marker topic. Read backwards from the tail until
    that marker (True), a marker of an earlier batch of ``query`` (False: a batch's markers come
    after its predecessor's, Spark runs a query's batches one after another), or the partition's
    start. There, with no marker of ``query`` at all, the answer is True for a batch after the
    query's first: the partition lost the markers its earlier batches left (the topic was deleted
    and created again), so nothing tells that no attempt began; for the first batch (0) of a new
    query it is False. With a partition per task (the topic is created so) the last record
    decides: one short read. Markers of other queries (an earlier checkpoint of the job) are passed
    over, and so are records that are not markers (skipped with a warning:
    :func:`ctiflow.jobs.datapath.own_topics.skip`)."""
    partition = task % partitions
    low = low_offset(cons, topic, partition)
    step, hi = 16, true_end_offset(cons, topic, partition, 0, require_eof=True)
    while hi > low:
        lo = max(low, hi - step)
        marks = []
        for msgs in read_range(cons, topic, partition, lo, hi):
            for m in msgs:
                try:
                    marks.append(marker_record(m.key, m.value))
                except ForeignRecord as why:
                    own_topics.skip(topic, partition, m.offset, why)
        for mark in reversed(marks):
            if mark["query"] == query:
                if mark["batch"] == batch and mark["task"] == task:
                    return True
                if mark["batch"] < batch:
                    return False
        hi, step = lo, step * 4
    return batch > 0


#: Errors of a producer whose idea of a topic is older than the topic (it was deleted and
#: created again, maybe with another partition count): a fresh producer may succeed.
STALE_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                         KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN})


def _stale(exc: KafkaException) -> bool:
    """Whether ``exc`` is one of :data:`STALE_TOPIC` (a topic gone or replaced under the client)."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() in STALE_TOPIC


class MarkerNotLanded(RuntimeError):
    """A replay marker the broker did not acknowledge: the task must not write (a bug report
    only if it persists; the message names the topic)."""

    def __init__(self, message: str, stale: bool) -> None:
        super().__init__(message)
        self.stale = stale  # the errors were those of a producer that knew an older topic


def leave_marker(prod, topic: str, partitions: int, query: str, batch: int, task: int) -> None:
    """``(query, batch, task)``'s marker, landed before the task writes a record (keyed by task:
    a compacted marker topic keeps each task's last); :class:`MarkerNotLanded` if it did not."""
    value = json.dumps({"query": query, "batch": batch, "task": task, "time": time.time()}).encode()
    failed: list = []

    def report(err, _msg):
        if err is not None:
            failed.append(err)

    try:
        kafka.send(prod, topic, value, str(task).encode(), partition=task % partitions, on_delivery=report)
    except KafkaException as exc:  # refused at once (a partition the producer does not know)
        failed.append(exc.args[0])
    if prod.flush(60) or failed:  # not sent in time, or sent and refused (the report says why)
        why = f": {failed[0]}" if failed else ""
        raise MarkerNotLanded(f"Kafka sink: the replay marker of batch {batch}, task {task} did not land in "
                              f"{topic}{why}", bool(failed) and all(e.code() in STALE_TOPIC for e in failed))


def marker_topic_partitions(options: SinkOptions) -> tuple[int, bool]:
    """The marker topic's partition count, read afresh for each task (a count from before the
    topic was replaced could name a partition that is not there), and whether the topic was
    gone and had to be created again (with ``options.marker_partitions`` partitions, else the
    count this worker saw last): then no marker tells whether an attempt began. A
    :class:`StackError` naming the topic if it can be neither found nor created."""
    bootstrap, client, topic = options.bootstrap, options.client, options.markers
    count = kafka.list_topics(bootstrap, client).get(topic)
    if count:
        _MARKER_PARTITIONS[topic] = count
        return count, False
    wanted = options.marker_partitions or _MARKER_PARTITIONS.get(topic) or 1
    if kafka.create_topics(bootstrap, {topic: wanted}, client):  # (a StackError naming it if refused)
        own_topics.recreate(topic, wanted, "the marker topic")
    count = kafka.list_topics(bootstrap, client).get(topic)
    if not count:
        raise StackError(f"the job's marker topic {topic} is missing and could not be created again on "
                         f"{bootstrap}; create it with `ctiflow topics create --config JOB.yaml`")
    _MARKER_PARTITIONS[topic] = count
    return count, True



#: Seconds a Python worker trusts the result topics' partition counts it read (one metadata
#: request per this interval, not one per topic and task).
PARTITIONS_TTL = 30.0
_PRODUCERS: dict[tuple, Any] = {}
_MARKER_PARTITIONS: dict[str, int] = {}  # the marker topic's partition count this worker saw last
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
    # Delivery reports for failed records only: a task learns of every failure (its
    # ``on_delivery``) without a Python callback per record written (measured: 0.66 µs a record).
    prod = kafka.producer(bootstrap, client, error_cb=errors.append, **{"delivery.report.only.error": True})
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
        hit = _PARTITIONS[key] = (now, {t: len(p)
                                        for t, p in kafka.partitions_of(bootstrap, topics, client).items()})
    return dict(hit[1])


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """Arrow record batches in (far cheaper than one Python ``Row`` per record)."""

    def __init__(self, options: "SinkOptions | dict[str, str]"):
        self.options = options if isinstance(options, SinkOptions) else SinkOptions.from_options(options)

    def write(self, iterator: Iterator) -> SinkCommit:
        with cyclic_gc_paused():  # (see ctiflow.jobs.core.alloc)
            return self._write(iterator)

    def _write(self, iterator: Iterator) -> SinkCommit:
        client, bootstrap = self.options.client, self.options.bootstrap
        query, batch = _query_and_batch()
        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx else 0
        markers = self.options.markers
        parts = partition_counts(bootstrap, client, self.options.topics)
        skip: dict[tuple[str, int], set[int]] = {}
        if markers is not None:
            skip, marker_partitions = self._replayed(parts, query, batch, task)
        prod = worker_producer(bootstrap, client)
        try:
            if markers is not None:
                # Also on a replay: the next batch finds the history it reads back to (an earlier batch's
                # marker).
                try:
                    leave_marker(prod, markers, marker_partitions, query, batch, task)
                except MarkerNotLanded as exc:
                    if not exc.stale:
                        raise
                    # The topic was replaced or deleted since it was read: created again if missing, a new
                    # producer.
                    prod.purge()
                    drop_producer(bootstrap, client)
                    marker_partitions, _ = marker_topic_partitions(self.options)
                    prod = worker_producer(bootstrap, client)
                    leave_marker(prod, markers, marker_partitions, query, batch, task)
            return self._send(iterator, prod, parts, skip, query, batch, task)
        except BaseException:
            prod.purge()  # nothing of this failed attempt may land after the replay's scan
            drop_producer(bootstrap, client)
            raise

    def _replayed(self, parts: dict[str, int], query: str, batch: int,
                  task: int) -> tuple[dict[tuple[str, int], set[int]], int]:
        """What an earlier attempt of this task wrote (``(topic, partition)`` → its ``seq``s; empty
        unless one may have begun) and the marker topic's partition count. A marker topic deleted
        while this reads it is created again, and then no marker can tell: a replay."""
        bootstrap, client, markers = self.options.bootstrap, self.options.client, self.options.markers
        for attempt in (1, 2):
            marker_partitions, recreated = marker_topic_partitions(self.options)
            if recreated:  # the kept producer may know the old topic's partitions
                drop_producer(bootstrap, client)
            # (a consumer a task, not one kept by the worker: one that outlived a broker restart crashed its
            # worker)
            cons = kafka.consumer(bootstrap, client, **{"group.id": "ctiflow-sink-recovery"})
            try:
                through = self.options.replay_through
                # planned before this run, or no marker can tell (the topic was created again)
                replay = (through is not None and batch <= through) or recreated
                replay = replay or began(cons, markers, marker_partitions, query, batch, task)
                if not replay:
                    return {}, marker_partitions
                return ({(t, p): landed(cons, t, p, query, batch, task)
                         for t, n in parts.items() for p in range(n)}, marker_partitions)
            except KafkaException as exc:
                if attempt == 2 or not _stale(exc):
                    raise
                # the marker topic was deleted under this read: the next attempt creates it again
                # (or finds it created again, holding no marker of this query: a replay)
            finally:
                cons.close()
        raise AssertionError("unreachable")

    def _send(self, iterator, prod, parts: dict[str, int], skip: dict, query: str, batch: int,
              task: int) -> SinkCommit:
        bootstrap, client = self.options.bootstrap, self.options.client
        errors: list[str] = []

        def report(err, msg):
            if err is not None:
                errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

        written = skipped = seq = 0
        metrics: dict[str, int] = {}
        per_topic: dict[str, int] = {}  # the batch's records per topic (counter "written" by topic)
        fixed = ((H_QUERY, query.encode()), (H_BATCH, str(batch).encode()), (H_TASK, str(task).encode()))
        produce = prod.produce
        for topic, keys, values in rows.output_columns(iterator, metrics):
            n = parts.get(topic) or parts.setdefault(topic,
                                                     len(kafka.topic_partitions(bootstrap, topic, client)))
            partitions = partitions_for(keys, values, n)
            first, count = seq, len(partitions)
            seq += count
            records = zip(range(first, seq), keys.to_pylist(), values.to_pylist(), partitions)
            if skip:  # a replay: what an earlier attempt wrote is not written again
                records = [r for r in records if r[0] not in skip.get((topic, r[3]), ())]
                skipped += count - len(records)
            sent = 0
            for this, key, value, partition in records:
                headers = [*fixed, (H_SEQ, str(this).encode())]
                try:  # (kafka.send, inlined: a Python call a record less)
                    produce(topic, value, key, partition=partition, headers=headers, on_delivery=report)
                except BufferError:
                    kafka.send(prod, topic, value, key, partition=partition, headers=headers,
                               on_delivery=report)
                sent += 1
            written += sent
            # per topic: the batch's records, those an earlier attempt wrote included (that attempt's
            # counters never reached the progress topic: the replay's stand for the batch)
            per_topic[topic] = per_topic.get(topic, 0) + count
            prod.poll(0)
        remaining = prod.flush(120)
        if remaining or errors:
            raise RuntimeError(f"Kafka sink: {remaining} records not delivered; errors: {errors[:5]}")
        metrics.update((counters.key("written", topic), n) for topic, n in per_topic.items())
        return SinkCommit(written, skipped, metrics, query)

    def commit(self, messages, batchId: int) -> None:
        topic = self.options.progress
        if not topic:
            return
        totals: dict[str, int] = {"written": 0, "replay_skipped": 0}
        query = ""
        for m in messages:
            if m is None:
                continue
            query = m.query or query
            totals["written"] += m.written
            totals["replay_skipped"] += m.skipped
            counters.merge(totals, m.metrics)
        record = json.dumps({"batch": batchId, "time": time.time(), "query": query, **totals}).encode()
        bootstrap, client = self.options.bootstrap, self.options.client
        for attempt in (1, 2):
            if topic not in kafka.list_topics(bootstrap, client):  # deleted: created again, the kept
                                                                   # producer dropped
                if kafka.create_topics(bootstrap, {topic: 1}, client):  # (a StackError naming it if refused)
                    own_topics.recreate(topic, 1, "the progress topic")
                drop_producer(bootstrap, client)
            failed: list = []
            prod = worker_producer(bootstrap, client)
            kafka.send(prod, topic, record, str(batchId).encode(), partition=0,
                       on_delivery=lambda err, _msg: failed.append(err) if err is not None else None)
            if not prod.flush(60) and not failed:
                return
            drop_producer(bootstrap, client)
            if not failed or not all(e.code() in STALE_TOPIC for e in failed):
                break  # else it knew the topic before it was replaced: once more with a new one
        raise StackError(f"Kafka sink: batch {batchId}'s counters did not land in the progress topic {topic}"
                         + (f": {failed[0].str()}" if failed else " within 60 s; is the broker up?"))

    def abort(self, messages, batchId: int) -> None:
        pass
