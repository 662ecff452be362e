"""Kafka source for Spark: a PySpark 4 Python Data Source (streaming reader) over confluent-kafka.

Spark's own Kafka connector needs jars from Maven Central; this one needs only pip. Contract,
in PySpark's terms:

* driver: ``initialOffset`` / ``latestOffset`` / ``partitions`` plan per-partition offset
  ranges (the offsets are ``{"<partition>": next_offset}``), gathered into a read task for each
  :data:`TASK_RECORDS` records, up to one a partition (:func:`read_tasks`); ``maxOffsetsPerTrigger``
  caps a micro-batch; ``prepareForTriggerAvailableNow`` fixes the end of a bounded run. The end of a
  partition is probed past tansu's lagging high watermark
  (:func:`ctiflow.jobs.datapath.kafka.true_end_offsets`, all partitions in one probe), and offsets never
  go backwards.
* executors: ``read`` fetches a task's ranges, decodes each fetch's Avro in bulk and strictly
  (:mod:`ctiflow.jobs.avro.decode`, per writer schema) and yields Arrow record batches
  (:data:`ctiflow.jobs.core.rows.INPUT_SCHEMA`): one row per key group whose ``meta_pack`` holds its
  records as Arrow columns, ``meta_``-prefixed metadata beside. A record that cannot be decoded or validated
  is *not* dropped: it comes out alone with ``meta_error`` set and its original bytes in
  ``meta_value``, so the job writes it to the dead-letter topic.
* everything here is picklable and imported by module path: the project must be installed
  (the bootstrap does ``pip install -e .``) so workers can import it.

**CTIs per partition** (see :class:`ctiflow.operators.time.PartitionCtis`). Every key group must know
how far *every* partition has got, not only the partitions its keys came from, so:

* each offset range read also yields one *frontier* row per key group (``meta_control =
  "frontier"``, ``meta_partition``, ``meta_start`` = the range's largest start);
* each micro-batch's first read task (with nothing to read, a task of its own) also
  yields one *control* row per key group with
  ``meta_control = {"partitions": [...], "idle": [...], "flush": bool}``: the topic's
  partitions, those idle as planned by the driver, and whether this batch reaches the end of a
  bounded input (the final CTI, +∞, once every stream has ended).

Idleness is decided on the driver, in processing time: a partition with nothing to read for
``idle_timeout`` seconds is idle; one the job has read nothing from and that has nothing to
read is idle from the start. The idle set is part of the batch's end offset
(``{"0": 17, "1": 9, "idle": ["1"]}``), so it is in Spark's offset log: a replayed batch sees
the same idle set, and therefore the same CTI.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import KafkaException
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from ctiflow.jobs.core import rows
from ctiflow.jobs.core.alloc import cyclic_gc_paused
from ctiflow.jobs.datapath.kafka import consumer, low_offset, read_range, topic_partitions, true_end_offsets
from ctiflow.jobs.datapath.source.decoder import RecordDecoder
from ctiflow.jobs.datapath.source.options import SourceOptions
from ctiflow.operators.errors import StackError

def spark_ddl(schema: pa.Schema) -> str:
    names = {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int", pa.float64(): "double",
             pa.float32(): "float", pa.bool_(): "boolean", pa.binary(): "binary"}
    return ", ".join(f"`{f.name}` {names[f.type]}" for f in schema)


class KafkaSource(DataSource):
    """``spark.readStream.format("ctiflow_kafka").options(**SourceOptions(...).to_options())``."""

    @classmethod
    def name(cls) -> str:
        return "ctiflow_kafka"

    def _arrow(self) -> pa.Schema:
        return rows.INPUT_SCHEMA

    def schema(self) -> str:
        return spark_ddl(self._arrow())

    def streamReader(self, schema) -> "KafkaStreamReader":
        return KafkaStreamReader(SourceOptions.from_options(self.options), self._arrow())


def _data(offsets: dict) -> dict:
    """The per-partition part of an offset (without the ``flushed`` and ``idle`` markers)."""
    return {p: v for p, v in offsets.items() if p.isdigit()}


def _spread(start: dict, ends: dict, budget: int) -> dict:
    """Spread a row budget over partitions in proportion to their backlogs, as Spark's Kafka source
    does (``budget × backlog / total``, rounded down; the few records left one each in partition
    order): deterministic batch cuts, and while a backlog is read, partitions of uneven rates
    advance alike in event time — an equal share each would let the busiest fall behind and hold
    the CTI back (events of the others that are late would not be, and the state would grow)."""
    backlog = {p: max(0, e - start.get(p, 0)) for p, e in ends.items()}
    total = sum(backlog.values())
    if total <= budget:
        return {**start, **{p: start.get(p, 0) + b for p, b in backlog.items()}}
    take = {p: budget * b // total for p, b in backlog.items()}
    left = budget - sum(take.values())
    for p in sorted(backlog, key=int):
        if left and take[p] < backlog[p]:
            take[p] += 1
            left -= 1
    return {**start, **{p: start.get(p, 0) + t for p, t in take.items()}}


class OffsetRange:
    """Records ``[start, end)`` of one Kafka partition."""

    def __init__(self, partition: int, start: int, end: int):
        self.partition, self.start, self.end = partition, start, end

    @property
    def records(self) -> int:
        return self.end - self.start


class BatchControl:
    """The micro-batch's control rows: the topic's partitions, the idle ones, the flush flag."""

    def __init__(self, partitions: list[int], idle: list[int], flush: bool):
        self.partitions, self.idle, self.flush = partitions, idle, flush


#: Records a read task takes before a batch's ranges are spread over more tasks. Spark's own cost of
#: a task of a Python reader — the hand-off to a Python worker, the pickled reader, the Arrow round
#: trip — is ≈ 60 ms here, what reading and decoding ≈ 3,000 records costs (≈ 20 µs each): a batch
#: of a few hundred records a partition read one task a partition (3 partitions on 2 cores: two
#: waves, ≈ 150 ms of a 350 ms batch at a 250 ms trigger) where one task does it in one
#: (``bench latency``, docs/performance.md#latency). A batch of more records gets as many tasks as
#: it fills, up to one a partition, as Spark's Kafka source plans.
TASK_RECORDS = 4096


class ReadTask(InputPartition):
    """One task of a micro-batch's read: its ``ranges``, read one after another, and — in the
    batch's first task only — its ``control`` rows (a task of its own only when the batch reads no
    records)."""

    def __init__(self, ranges: list[OffsetRange], control: BatchControl | None = None):
        self.ranges, self.control = ranges, control


def read_tasks(ranges: list[OffsetRange], control: BatchControl,
               task_records: int = TASK_RECORDS) -> list[ReadTask]:
    """``ranges`` gathered into ``ceil(records / task_records)`` tasks (at least one, at most one a
    range), each range to the task with the fewest records so far, largest range first; the first
    task carries ``control``. Deterministic in the ranges: a replayed batch reads the same tasks."""
    total = sum(r.records for r in ranges)
    tasks: list[list[OffsetRange]] = [[] for _ in range(max(1, min(len(ranges), -(-total // task_records))))]
    loads = [0] * len(tasks)
    for r in sorted(ranges, key=lambda r: (-r.records, r.partition)):
        i = loads.index(min(loads))
        tasks[i].append(r)
        loads[i] += r.records
    out = [ReadTask(sorted(t, key=lambda r: r.partition)) for t in tasks]
    out[0].control = control
    return out


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: "SourceOptions | dict[str, str]", schema: pa.Schema = rows.INPUT_SCHEMA):
        self.options = options = SourceOptions.parsed(options)
        self.arrow = schema
        self.topic = options.topic
        self.client = options.client
        self.max_rows = options.max_offsets_per_trigger
        self.idle_timeout = options.idle_timeout
        self.target: dict[str, int] | None = None
        self._active_at: dict[str, float] = {}  # partition → last time it had records to read (monotonic)
        self._initial: dict | None = None  # the offsets the first micro-batch started from
        self._consumer = None
        self._partitions: list[int] | None = None

    # -- driver side -------------------------------------------------------------------
    def _cons(self):
        if self._consumer is None:
            self._consumer = consumer(self.options.bootstrap, self.client, **{"group.id": "ctiflow-planner"})
        return self._consumer

    def _parts(self) -> list[int]:
        if self._partitions is None:
            self._partitions = topic_partitions(self.options.bootstrap, self.topic, self.client, timeout=3.0)
        return self._partitions

    def _ends(self, floor: dict[str, int]) -> dict[str, int]:
        ends = true_end_offsets(self._cons(), self.topic, {p: floor.get(str(p), 0) for p in self._parts()},
                                timeout=3.0)
        return {str(p): e for p, e in ends.items()}

    def _ends_or_wait(self, floor: dict[str, int]) -> dict[str, int] | None:
        """End offsets, or None while the broker is unreachable: the query idles (each trigger
        asks again) and resumes when the broker is back; after ``outage_timeout`` seconds
        (option, default 120) it fails with a clear error — restart the job then, it resumes
        from its checkpoint. (A call must return quickly: Spark's planner does not wait.)"""
        try:
            ends = self._ends(floor)
        except (KafkaException, StackError) as exc:
            now = time.monotonic()
            self._outage_since = getattr(self, "_outage_since", None) or now
            self._partitions = None
            self._drop_consumer()  # a fresh client after the outage (the broker may be a new one)
            limit = self.options.outage_timeout
            if now - self._outage_since > limit:
                raise StackError(f"Kafka at {self.options.bootstrap} unreachable (or topic {self.topic!r} "
                                 f"gone) for more than {limit:.0f} s: {exc}. Restart the job when the broker "
                                 "is back; it resumes from its checkpoint.") from exc
            return None
        self._outage_since = None
        return ends

    def initialOffset(self) -> dict:
        """Where the first micro-batch starts: option ``start_offsets`` (the driver resolved them
        once and keeps them with the checkpoint, :func:`ctiflow.jobs.driver.checkpoint.start_offsets`),
        else resolved now from ``starting_offsets`` (:meth:`resolve_start`)."""
        self._initial = self.options.start_offsets or self.resolve_start()
        return self._initial

    def resolve_start(self) -> dict:
        """``starting_offsets`` (``earliest``, ``latest`` or per-partition offsets) as offsets now."""
        how = self.options.starting_offsets
        if how == "earliest":
            return {str(p): low_offset(self._cons(), self.topic, p) for p in self._parts()}
        if how == "latest":
            return self._ends({})
        given = {str(p): int(o) for p, o in json.loads(how).get(self.topic, {}).items()}
        latest = self._ends({}) if -1 in given.values() else {}
        def at(p: int) -> int:
            wanted = given.get(str(p), 0)
            if wanted == -2:
                return low_offset(self._cons(), self.topic, p)
            return latest[str(p)] if wanted == -1 else wanted

        return {str(p): at(p) for p in self._parts()}

    def _initial_offsets(self) -> dict:
        if self._initial is None:
            self._initial = self.options.start_offsets or {}
        return self._initial

    def _idle(self, start: dict, available: dict[str, int]) -> list[str]:
        """Partitions idle for this micro-batch (see the module docstring). ``available``: the
        end offsets this run may read up to."""
        now = time.monotonic()
        data, before, initial = _data(start), set(start.get("idle", ())), self._initial_offsets()
        idle = []
        for p, end in available.items():
            if end > data.get(p, 0):
                self._active_at[p] = now  # records to read: active
                continue
            if p not in self._active_at:
                if p in before or (p in initial and data.get(p, 0) <= initial[p]):
                    idle.append(p)  # idle before a restart, or never had a record to read
                    continue
                self._active_at[p] = now  # first look after a restart: its timeout starts now
            if now - self._active_at[p] >= self.idle_timeout:
                idle.append(p)
        return sorted(idle, key=int)

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """A bounded run reads to each partition's end as it is now, or to ``ending_offsets`` where
        they say less (-1: the end)."""
        self.target = self._ends({})
        if self.options.ending_offsets != "latest":
            given = json.loads(self.options.ending_offsets).get(self.topic, {})
            self.target = {p: e if int(given.get(p, -1)) < 0 else min(e, int(given[p]))
                           for p, e in self.target.items()}

    def latestOffset(self, start: dict, limit) -> dict:
        data = _data(start)
        ends = self._ends_or_wait(data)
        if ends is None:
            return start
        if self.target is not None:
            ends = {p: max(min(e, self.target.get(p, e)), data.get(p, 0)) for p, e in ends.items()}
        idle = self._idle(start, ends)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if budget is not None:
            ends = _spread(data, ends, budget)
        if start.get("flushed") and ends == data:
            return start  # flushed, and nothing new: no batch
        if idle:
            ends["idle"] = idle
        if self._flushes and all(ends.get(p, 0) >= e for p, e in self.target.items()):
            # The batch that reaches the end of a bounded input carries the final CTI. The
            # marker is part of the offset, so a drain with no new data still gets one batch,
            # and a restart after the flush does not flush again.
            ends["flushed"] = True
        return ends

    @property
    def _flushes(self) -> bool:
        return self.target is not None and self.options.flush_at_end

    def partitions(self, start: dict, end: dict) -> list[ReadTask]:
        data_start = _data(start)
        ranges = [OffsetRange(int(p), data_start.get(p, 0), e)
                  for p, e in sorted(_data(end).items(), key=lambda x: int(x[0])) if e > data_start.get(p, 0)]
        flush = bool(end.get("flushed") and not start.get("flushed"))
        every = sorted({int(p) for p in _data(end)} | set(self._parts()))
        return read_tasks(ranges, BatchControl(every, [int(p) for p in end.get("idle", ())], flush))

    def reportLatestOffset(self):
        return None

    def _drop_consumer(self) -> None:
        cons, self._consumer = self._consumer, None
        if cons is not None:
            try:
                cons.close()
            except RuntimeError:
                pass  # already closed

    def stop(self) -> None:
        self._drop_consumer()

    # -- executor side -----------------------------------------------------------------
    #: What turns a fetch into rows (a benchmark's baseline reads typed rows with its own).
    decoder_class = RecordDecoder

    def read(self, partition: ReadTask) -> Iterator[pa.RecordBatch]:
        decoder = self.decoder_class(self.options, self.arrow)
        # Frontier and control rows go with packs (a baseline's typed rows have none).
        control = "meta_pack" in self.arrow.names
        if partition.control is not None and control:
            c = partition.control
            yield decoder.control_rows(c.partitions, c.idle, c.flush)
        if not partition.ranges:
            return
        cons = consumer(self.options.bootstrap, self.client, **{"group.id": "ctiflow-source"})
        try:
            for r in partition.ranges:
                yield from self._read_range(cons, decoder, r)
                if control and decoder.frontier is not None:
                    yield decoder.frontier_rows(r.partition)
                decoder.frontier = None  # (each range's own)
        finally:
            cons.close()

    def _read_range(self, cons, decoder, r: OffsetRange) -> Iterator[pa.RecordBatch]:
        fetches = read_range(cons, self.topic, r.partition, r.start, r.end, raw=True)
        while True:
            # The cyclic collector is paused while a fetch's messages live: 10k Message objects
            # a consume each set off collections that scan the worker's every object (measured:
            # consuming alone 0.78 → 0.43 µs of CPU a message, `ctiflow bench source`); they hold
            # no cycles and are freed by reference counting before it resumes.
            with cyclic_gc_paused():
                msgs = next(fetches, None)
                if msgs is None:
                    break
                batch = decoder.batch(msgs)
                del msgs
            yield batch
