"""The wire format: the rows Spark moves between source → adapter → sink, in one place.

Two row types cross Spark, each with one writer and one reader:

**Input rows** (``jobs.source`` writes them, ``jobs.adapter`` reads them), one Arrow schema
(:func:`input_schema`): the record's fields as typed columns (typed reads only) plus these
``meta_`` columns. Every row has ``meta_stream``, ``meta_group`` (the key group label Spark
shuffles on) and ``meta_partition``; what else is set says what the row is:

========== ====================================================================================
row        columns
========== ====================================================================================
pack       ``meta_pack``: a key group's good records of one fetch (:class:`PackWriter`);
           ``meta_offset`` its first offset, ``meta_start`` its largest start
dead       ``meta_error`` (``"<stage>: <reason>"``), ``meta_offset``, ``meta_value`` (the
           bytes), ``meta_raw_key``, ``meta_kafka_ts``: a record that did not decode/validate
frontier   ``meta_control = "frontier"``, ``meta_start``: the partition has been read up to
           that start (one row per key group per offset range read)
control    ``meta_control`` = :class:`Control` as JSON (one row per key group per micro-batch)
typed      (typed reads only, no operator) one row per record: fields + ``meta_key``,
           ``meta_start``, ``meta_end``, ``meta_offset``, ``meta_value``, ...
========== ====================================================================================

**Output rows** (``jobs.adapter`` writes them, ``jobs.sink`` reads them): :data:`OUTPUT_SCHEMA`
``(topic, key, value, kind)``. ``kind = "pack"``: ``value`` holds up to :data:`PACK_SIZE`
Avro-encoded result records of ``topic`` (:func:`pack_results`); ``kind = "metrics"``: the
key group's counters as JSON (summed by the sink, never written); any other kind: one record.

**What is pickled** (protocol 5): a pack's events, as tuples ``(key, start, end, record,
offset, bytes)``, and a result pack's ``(key, value, role)`` tuples. Pickle is only ever read by
the same job's code within one micro-batch (rows are not persisted), so it need not be stable
across versions. Tuples, not objects: loading a tuple costs ≈ 1 µs an event, an object several.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from jobs.progress import merge_metrics
from operators.events import Event

#: ``meta_`` columns of every input row, in order (Arrow types).
META_FIELDS = [
    ("meta_stream", pa.string()), ("meta_key", pa.string()), ("meta_start", pa.int64()), ("meta_end", pa.int64()),
    ("meta_group", pa.int32()), ("meta_partition", pa.int32()), ("meta_offset", pa.int64()), ("meta_kafka_ts", pa.int64()),
    ("meta_error", pa.string()), ("meta_value", pa.binary()), ("meta_raw_key", pa.binary()), ("meta_control", pa.string()),
]
#: Packed reads only: a key group's records of one fetch, pickled (see :class:`PackWriter`).
META_PACK = ("meta_pack", pa.binary())
#: The input columns the adapter reads (besides ``meta_group``, the grouping key).
INPUT_COLUMNS = ["meta_stream", "meta_partition", "meta_offset", "meta_error", "meta_value", "meta_raw_key",
                 "meta_kafka_ts", "meta_control", "meta_start", "meta_pack"]
#: ``meta_control`` of a frontier row.
FRONTIER = "frontier"

#: The adapter's output rows, read by the sink.
OUTPUT_SCHEMA = StructType([
    StructField("topic", StringType()), StructField("key", BinaryType()),
    StructField("value", BinaryType()), StructField("kind", StringType()),
])
OUTPUT_DDL = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in OUTPUT_SCHEMA.fields)
#: Result records per output row.
PACK_SIZE = 10_000
PACK, METRICS = "pack", "metrics"


def input_schema(fields: list[pa.Field], packed: bool) -> pa.Schema:
    """Input rows: ``fields`` (the record's typed columns; none for packed reads) + metadata."""
    return pa.schema(list(fields) + [pa.field(n, t) for n, t in (META_FIELDS + [META_PACK] if packed else META_FIELDS)])


# -- input: packs ---------------------------------------------------------------------------
class PackWriter:
    """One key group's good records of one fetch, in offset order."""

    __slots__ = ("items", "top")

    def __init__(self):
        self.items: list[tuple] = []
        self.top: int | None = None  # the largest start

    def add(self, key: str, start: int, end: int, record: dict, offset: int, raw: bytes | None) -> None:
        self.items.append((key, start, end, record, offset, raw))
        if self.top is None or start > self.top:
            self.top = start

    @property
    def first_offset(self) -> int:
        return self.items[0][4]

    def to_bytes(self) -> bytes:
        return pickle.dumps(self.items, 5)


def unpack_events(pack: bytes, stream: str, partition: int) -> list[Event]:
    """The events of a pack row, in offset order."""
    return [Event(key, start, end, rec, partition, offset, stream, None, False, raw)
            for key, start, end, rec, offset, raw in pickle.loads(pack)]


# -- input: control -------------------------------------------------------------------------
@dataclass(frozen=True)
class Control:
    """A micro-batch's control row: the topic's partitions, those idle (as the driver planned
    the batch) and whether the batch reaches the end of a bounded input."""

    partitions: list[int]
    idle: list[int]
    flush: bool

    def to_json(self) -> str:
        return json.dumps({"partitions": self.partitions, "idle": self.idle, "flush": self.flush})

    @classmethod
    def from_json(cls, text: str) -> "Control":
        d = json.loads(text)
        return cls(d["partitions"], d["idle"], d["flush"])


def rows_per_group(schema: pa.Schema, stream: str, labels: list[int], partition: int, start: int | None,
                   control: str) -> pa.RecordBatch:
    """One frontier or control row per key group label."""
    n = len(labels)
    cols: dict[str, list] = {name: [None] * n for name in schema.names}
    cols.update(meta_stream=[stream] * n, meta_group=list(labels), meta_partition=[partition] * n,
                meta_offset=[-1] * n, meta_start=[start] * n, meta_control=[control] * n)
    return pa.RecordBatch.from_pydict(cols, schema=schema)


# -- input: reading (the adapter) -----------------------------------------------------------
@dataclass(frozen=True)
class DeadRow:
    stream: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: str
    kafka_timestamp: int | None


@dataclass
class GroupInput:
    """What one key group received in one micro-batch, taken apart by row kind."""

    events: list[Event]
    frontiers: list[tuple[str, int, int]]  # (stream, partition, largest start read)
    controls: list[tuple[str, Control]]
    dead: list[DeadRow]


def read_input(frame) -> GroupInput:
    """A key group's input rows (a pandas frame of :data:`INPUT_COLUMNS`), sorted by stream,
    partition and offset so a replayed micro-batch yields the same events in the same order
    (a pack holds one fetch's consecutive offsets: sorting packs by their first offset sorts
    their events)."""
    frame = frame.sort_values(["meta_stream", "meta_partition", "meta_offset"], kind="stable")
    got = GroupInput([], [], [], [])
    extend = got.events.extend
    cols = [frame[c].tolist() for c in INPUT_COLUMNS]
    for stream, part, off, err, value, raw_key, ts, control, top, pack in zip(*cols):
        if pack is not None:
            extend(unpack_events(pack, stream, part))
        elif control == FRONTIER:
            got.frontiers.append((stream, int(part), int(top)))  # a float column where other rows are null
        elif control is not None:
            got.controls.append((stream, Control.from_json(control)))
        else:
            got.dead.append(DeadRow(stream, int(part), int(off), raw_key, value, err, None if ts != ts else int(ts)))
    return got


# -- dead letters ---------------------------------------------------------------------------
def dead_letter(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, error: str,
                kafka_timestamp: int | None = None, stage: str | None = None) -> dict:
    """The one dead-letter record (``schemas/dead_letter.avsc``): ``topic`` is the *source
    topic* the record was read from, whichever stage refused it; ``stage`` is decode, validate
    or operator (default: what ``error`` starts with, as the source writes ``"<stage>: <reason>"``)."""
    return {"source_topic": topic, "partition": int(partition), "offset": int(offset), "key": key, "value": value,
            "error": error, "stage": stage or error.split(":", 1)[0], "kafka_timestamp": kafka_timestamp}


# -- output ---------------------------------------------------------------------------------
def output_frame(packs: list[tuple[str, list[tuple]]], metrics: dict[str, int]):
    """Output rows: one ``pack`` row per ``(topic, [(key, value, role), ...])`` (≤ :data:`PACK_SIZE`
    each, in order), then one ``metrics`` row."""
    topics = [t for t, _ in packs] + [None]
    values = [pickle.dumps(p, 5) for _, p in packs] + [json.dumps(metrics).encode()]
    return pd.DataFrame({"topic": topics, "key": [None] * len(topics), "value": values,
                         "kind": [PACK] * len(packs) + [METRICS]})


def output_records(batches: Iterable[pa.RecordBatch], metrics: dict[str, int]) -> Iterator[tuple[str, bytes | None, bytes]]:
    """``(topic, key, value)`` of every record in the output rows, in row order; ``metrics``
    rows are summed into ``metrics`` (:func:`jobs.progress.merge_metrics`), not yielded."""
    for rows in batches:
        cols = [rows.column(c).to_pylist() for c in ("topic", "key", "value", "kind")]
        for topic, key, value, kind in zip(*cols):
            if kind == PACK:
                for k, v, _role in pickle.loads(value):
                    yield topic, k, v
            elif kind == METRICS:
                merge_metrics(metrics, json.loads(value))
            else:
                yield topic, key, value
