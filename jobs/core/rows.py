"""The wire format: the rows Spark moves between source → adapter → sink, in one place.

Two row types cross Spark, each with one writer and one reader:

**Input rows** (``ctiflow.jobs.datapath.source.decoder`` writes them, ``ctiflow.jobs.datapath.adapter``
reads them), one Arrow schema (:data:`INPUT_SCHEMA`) of ``meta_`` columns. Every row has
``meta_stream``, ``meta_group`` (the key group label Spark shuffles on) and ``meta_partition``; what
else is set says what the row is:

========== ====================================================================================
row        columns
========== ====================================================================================
pack       ``meta_pack``: a key group's good records of one fetch as Arrow columns
           (:func:`pack_columns`); ``meta_offset`` its first offset, ``meta_start`` its largest start
dead       ``meta_error`` (``"<stage>: <reason>"``), ``meta_offset``, ``meta_value`` (the
           bytes), ``meta_raw_key``, ``meta_kafka_ts``: a record that did not decode/validate
frontier   ``meta_control = "frontier"``, ``meta_start``: the partition has been read up to
           that start (one row per key group per offset range read)
control    ``meta_control`` = :class:`Control` as JSON (one row per key group per micro-batch)
========== ====================================================================================

**Output rows** (``ctiflow.jobs.datapath.adapter`` writes them, ``ctiflow.jobs.datapath.sink`` reads
them): :data:`OUTPUT_SCHEMA` ``(topic, key, value, kind)``. ``kind = "pack"``: ``value`` holds up to
:data:`PACK_SIZE` Avro-encoded result records of ``topic`` as Arrow columns ``(key, value, role)``
(:func:`output_frame`); ``kind = "metrics"``: the key group's counters as JSON (summed by the
sink, never written); any other kind: one record.

**Packs are Arrow IPC streams**, nothing is pickled: an input pack holds one record batch with
the record's fields as typed columns in the reader schema's order (nested values as JSON text,
named in the schema's metadata) and the ``meta_key``, ``meta_start``, ``meta_end``,
``meta_offset`` and ``meta_value`` columns (:data:`PACK_META`). Writing one is a copy of columns
the source already has; reading one is zero-copy until the adapter asks for Python values.
When nothing in the stateful stage reads the fields (identity operators only), a pack carries
the records' bytes and only the field *names* (``ctiflow.field_names`` metadata); the adapter
decodes the bytes when it needs the values (:class:`BytesFields`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ctiflow.jobs.core import counters
from ctiflow.jobs.avro.encode import ColumnEncoder
from ctiflow.operators.columns import EventColumns, LazyFields, object_array
from ctiflow.operators.events import Event, OutputBatch

#: ``meta_`` columns of every input row, in order (Arrow types).
META_FIELDS = [
    ("meta_stream", pa.string()), ("meta_key", pa.string()), ("meta_start", pa.int64()),
    ("meta_end", pa.int64()), ("meta_group", pa.int32()), ("meta_partition", pa.int32()),
    ("meta_offset", pa.int64()), ("meta_kafka_ts", pa.int64()), ("meta_error", pa.string()),
    ("meta_value", pa.binary()), ("meta_raw_key", pa.binary()), ("meta_control", pa.string()),
]
#: A key group's records of one fetch, Arrow columns (see :func:`pack_columns`).
META_PACK = ("meta_pack", pa.binary())
#: The input rows' schema.
INPUT_SCHEMA = pa.schema([pa.field(n, t) for n, t in META_FIELDS + [META_PACK]])
#: The input columns the adapter reads (besides ``meta_group``, the grouping key).
INPUT_COLUMNS = ["meta_stream", "meta_partition", "meta_offset", "meta_error", "meta_value", "meta_raw_key",
                 "meta_kafka_ts", "meta_control", "meta_start", "meta_pack"]
#: ``meta_control`` of a frontier row.
FRONTIER = "frontier"

#: The adapter's output rows, read by the sink, as Spark DDL (the adapter's ``OUTPUT_SCHEMA`` is this).
OUTPUT_DDL = "topic string, key binary, value binary, kind string"
#: Result records per output row.
PACK_SIZE = 10_000
#: A pack's size bound (input packs per key group of a fetch, result packs): a pack is one binary
#: value in the driver JVM (shuffle rows, Arrow hand-offs), and one of 512 KiB or more is a G1
#: "humongous" object — allocated outside the young generation, each such allocation a
#: collection, and the heap grows to cope (1 MiB regions: heaps under 4 GiB). Measured under
#: docs/changelog.md#memory.
PACK_BYTES = 128 * 1024
PACK, METRICS = "pack", "metrics"


# -- input: packs ---------------------------------------------------------------------------
#: The columns of a pack beside the record's fields, in order.
PACK_META = [("meta_key", pa.string()), ("meta_start", pa.int64()), ("meta_end", pa.int64()),
             ("meta_offset", pa.int64()), ("meta_value", pa.binary())]
#: Columns a broadcast stream's packs carry besides (:attr:`EventColumns.origin`): each record's
#: key bytes and Kafka timestamp, for a dead letter decided after decoding (a refused rule).
PACK_ORIGIN = [("meta_raw_key", pa.binary()), ("meta_kafka_ts", pa.int64())]
#: Schema metadata of a pack: the fields that hold nested values as JSON text.
JSON_FIELDS = b"ctiflow.json_fields"
#: Schema metadata of a pack without field columns: the record's field names, in order.
FIELD_NAMES = b"ctiflow.field_names"


#: The end-of-stream marker of Arrow's IPC stream format (continuation token, zero length).
_IPC_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def pack_batch(fields: pa.Table | pa.RecordBatch, keys, starts, ends, offsets, values,
               json_fields: tuple[str, ...] = (), with_fields: bool = True, origin=None) -> pa.RecordBatch:
    """The records' ``fields`` and, per record, its key, start, end, offset and Avro bytes
    (``values`` may be all null) as one record batch in the pack layout; ``with_fields=False``
    (every record's bytes kept): only the field *names* travel (schema metadata), the reader
    decodes the bytes when it needs the values (:class:`BytesFields`). ``origin``: each
    record's ``(key bytes, Kafka timestamps)`` (:data:`PACK_ORIGIN`), or None. :func:`pack_slices`
    cuts it into packs."""
    meta = [pa.array(keys, pa.string()), pa.array(starts, pa.int64()), pa.array(ends, pa.int64()),
            pa.array(offsets, pa.int64()), pa.array(values, pa.binary())]
    extra = []
    if origin is not None:
        meta += [pa.array(origin[0], pa.binary()), pa.array(origin[1], pa.int64())]
        extra = PACK_ORIGIN
    metadata = {JSON_FIELDS: json.dumps(list(json_fields)).encode()}
    if not with_fields:
        metadata[FIELD_NAMES] = json.dumps(list(fields.schema.names)).encode()
        fields = pa.table({})
    columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in fields.columns] + meta
    schema = pa.schema(list(fields.schema) + [pa.field(n, t) for n, t in PACK_META + extra],
                       metadata=metadata)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def pack_slices(batch: pa.RecordBatch, cuts: list[int]) -> pa.BinaryArray:
    """Packs of ``batch``'s rows ``[cuts[i], cuts[i+1])``, as one binary column: each an Arrow
    IPC stream (schema message, one record batch message, end of stream) of one zero-copy slice,
    the schema's message serialized once, written straight into the column's data buffer."""
    head = batch.schema.serialize()
    sink = pa.BufferOutputStream()
    ends = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        sink.write(head)
        sink.write(batch.slice(a, b - a).serialize())
        sink.write(_IPC_EOS)
        ends.append(sink.tell())
    offsets = np.array([0, *ends], np.int32)  # a fetch's packs: far below 2 GiB
    return pa.BinaryArray.from_buffers(pa.binary(), len(ends), [None, pa.py_buffer(offsets), sink.getvalue()])


def pack_columns(fields: pa.Table | pa.RecordBatch, keys, starts, ends, offsets, values,
                 json_fields: tuple[str, ...] = (), with_fields: bool = True) -> bytes:
    """One pack of all the records (:func:`pack_batch`, :func:`pack_slices`)."""
    batch = pack_batch(fields, keys, starts, ends, offsets, values, json_fields, with_fields)
    return pack_slices(batch, [0, batch.num_rows])[0].as_py()


def pack_events(items: list[tuple]) -> bytes:
    """A pack from ``(key, start, end, record, offset, bytes)`` tuples (tests and tools; the
    source writes columns it already has, :func:`pack_columns`). Field types are inferred."""
    fields = pa.Table.from_pylist([it[3] for it in items])
    return pack_columns(fields, *([it[i] for it in items] for i in (0, 1, 2, 4, 5)))


def _numpy(column: pa.Array, as_json: bool) -> np.ndarray:
    """One field column for :class:`EventColumns`: numeric and boolean columns without nulls as
    typed NumPy arrays (zero-copy for numbers), the rest as object arrays of Python values."""
    t = column.type
    if as_json:
        return object_array([None if v is None else json.loads(v) for v in column.to_pylist()])
    if column.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)
                                   or pa.types.is_boolean(t)):
        return column.to_numpy(zero_copy_only=False)
    return object_array(column.to_pylist())


#: stream → the function that decodes its records' bytes into field columns (an Arrow table
#: in the reader schema's layout, as the source packs them): set where packs without field
#: columns are read (:class:`ctiflow.jobs.datapath.adapter.OperatorProcessor`), used by :class:`BytesFields`.
FIELD_DECODERS: dict = {}


class BytesFields(LazyFields):
    """The field columns of records whose packs carried only their bytes: names known, values
    decoded from ``raw`` (every row's Avro bytes) on first use of any column — all columns at
    once, by the stream's decoder (:data:`FIELD_DECODERS`, the source's own), so the values are
    those a pack with field columns would hold. What an identity job's records need only for a
    late record or a result topic in another schema. :meth:`take` and :meth:`concat` stay lazy;
    pickles as its bytes (the reorder buffer in state)."""

    __slots__ = ("stream", "names", "json_fields", "raw", "_columns")

    def __init__(self, stream: str, names: tuple[str, ...], json_fields: tuple[str, ...],
                 raw: np.ndarray) -> None:
        self.stream, self.names, self.json_fields, self.raw = stream, tuple(names), tuple(json_fields), raw
        self._columns: dict[str, np.ndarray] | None = None

    def _decoded(self) -> dict[str, np.ndarray]:
        if self._columns is None:
            n = len(self.raw)
            decode = FIELD_DECODERS.get(self.stream)
            if decode is None:
                raise RuntimeError(f"stream {self.stream!r}: its packs carry records' bytes only and this "
                                   "process has no decoder for them (ctiflow.jobs.core.rows.FIELD_DECODERS; "
                                   "a bug in ctiflow)")
            table = decode(list(self.raw)) if n else None
            if table is not None and table.num_rows != n:
                raise RuntimeError(f"stream {self.stream!r}: {n - table.num_rows} records the source decoded "
                                   "do not decode again (a bug in ctiflow)")
            as_json = set(self.json_fields)
            self._columns = {name: _numpy(table.column(name).combine_chunks(), name in as_json) if n else
                             np.empty(0, object) for name in self.names}
        return self._columns

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise KeyError(name)
        return self._decoded()[name]

    def take(self, index, raw: np.ndarray) -> "BytesFields":
        return BytesFields(self.stream, self.names, self.json_fields, raw)

    @staticmethod
    def concat(parts: list["BytesFields"], raw: np.ndarray) -> "BytesFields":
        first = parts[0]
        return BytesFields(first.stream, first.names, first.json_fields, raw)

    def __reduce__(self):
        return BytesFields, (self.stream, self.names, self.json_fields, self.raw)


class ArrowFields(LazyFields):
    """The field columns of a pack's records kept as Arrow, each converted to the NumPy column
    :class:`EventColumns` promises (:func:`_numpy`) on first use: an operator that reads two
    fields of a wide record converts two columns, and the fields no operator reads (strings
    above all) never become Python objects.

    A view: the rows ``index`` (None: all, in order) of ``table``. :meth:`take` composes the
    index and copies nothing; a column read is converted once for the whole table (shared by
    every view of it) and indexed with NumPy; the Arrow rows are taken only where they are
    needed as Arrow — :meth:`concat` and pickling (the reorder buffer in state, one Arrow IPC
    stream: no Python object per value)."""

    __slots__ = ("table", "index", "json_fields", "_columns", "_converted")

    def __init__(self, table: pa.Table | pa.RecordBatch, json_fields: tuple[str, ...] = (),
                 index: np.ndarray | None = None, converted: dict[str, np.ndarray] | None = None,
                 columns: dict[str, np.ndarray] | None = None) -> None:
        self.table = pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table
        self.index = index
        self.json_fields = tuple(json_fields)
        self._converted = {} if converted is None else converted  # the whole table's, shared by its views
        self._columns = {} if columns is None else columns  # this view's rows

    def __getitem__(self, name: str) -> np.ndarray:
        column = self._columns.get(name)
        if column is None:
            whole = self._converted.get(name)
            if whole is None:
                if name not in self.table.schema.names:
                    raise KeyError(name)
                whole = self._converted[name] = _numpy(self.table.column(name).combine_chunks(),
                                                       name in self.json_fields)
            column = self._columns[name] = whole if self.index is None else whole[self.index]
        return column

    @property
    def names(self) -> list[str]:
        return self.table.schema.names

    def converted(self) -> set[str]:
        """The fields whose NumPy column this view has without converting Arrow again."""
        return set(self._columns) | (set(self._converted) if self.index is None else set())

    def take(self, index, raw: np.ndarray | None = None) -> "ArrowFields":
        rows = np.arange(self.table.num_rows)[index] if self.index is None else self.index[index]
        return ArrowFields(self.table, self.json_fields, rows, self._converted,
                           {name: column[index] for name, column in self._columns.items()})

    def arrow(self) -> pa.Table:
        """The view's rows as an Arrow table."""
        if self.index is None:
            return self.table
        return self.table.take(pa.array(self.index, pa.int64()))

    @staticmethod
    def concat(parts: list["ArrowFields"], raw: np.ndarray | None = None) -> "ArrowFields":
        """The rows of ``parts`` one after the other: every field of any part, in the order of
        the part with the most fields (the rows of a projected part are null in the fields it
        dropped)."""
        first = parts[0]
        table = pa.concat_tables([p.arrow() for p in parts], promote_options="permissive")
        widest = max((p.table.schema.names for p in parts), key=len)
        if table.schema.names != widest:
            table = table.select(widest + [n for n in table.schema.names if n not in widest])
        read = first.converted().intersection(*(p.converted() for p in parts[1:]))
        json_fields = sorted(set().union(*(p.json_fields for p in parts)))
        return ArrowFields(table, tuple(json_fields),
                           converted={name: np.concatenate([p[name] for p in parts]) for name in read})

    def project(self, names) -> "ArrowFields":
        """The view with only the fields ``names`` (those it has), in its own order."""
        kept = [n for n in self.table.schema.names if n in names]
        if len(kept) == self.table.num_columns:
            return self
        return ArrowFields(self.table.select(kept), tuple(n for n in self.json_fields if n in kept),
                           self.index, {n: c for n, c in self._converted.items() if n in kept},
                           {n: c for n, c in self._columns.items() if n in kept})

    def __reduce__(self):
        table = self.arrow()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return _arrow_fields, (sink.getvalue().to_pybytes(), self.json_fields)


def _arrow_fields(ipc: bytes, json_fields: tuple[str, ...]) -> ArrowFields:
    """An :class:`ArrowFields` from its pickled form (an Arrow IPC stream)."""
    return ArrowFields(pa.ipc.open_stream(ipc).read_all(), json_fields)


def unpack_columns(pack: bytes, stream: str, partition: int) -> EventColumns:
    """The events of a pack row as columns, in offset order."""
    batches = list(pa.ipc.open_stream(pack))
    batch = (batches[0] if len(batches) == 1
             else pa.Table.from_batches(batches).combine_chunks().to_batches()[0])
    schema = batch.schema
    metadata = schema.metadata or {}
    as_json = set(json.loads(metadata.get(JSON_FIELDS, b"[]")))
    meta = {name: batch.column(schema.get_field_index(name)) for name, _ in PACK_META}
    origin = None
    if PACK_ORIGIN[0][0] in schema.names:
        origin = tuple(object_array(batch.column(schema.get_field_index(name)).to_pylist())
                       for name, _ in PACK_ORIGIN)
    value = meta["meta_value"]
    n = batch.num_rows
    raw = None if value.null_count == n else value.to_numpy(zero_copy_only=False)
    if FIELD_NAMES in metadata:
        if value.null_count:
            raise ValueError("a pack without field columns must keep every record's bytes")
        fields = BytesFields(stream, tuple(json.loads(metadata[FIELD_NAMES])), tuple(sorted(as_json)), raw)
    else:
        names = [name for name in schema.names if not name.startswith("meta_")]
        fields = ArrowFields(batch.select(names), tuple(sorted(as_json & set(names))))
    return EventColumns(stream, meta["meta_key"].to_numpy(zero_copy_only=False),
                        meta["meta_start"].to_numpy(), meta["meta_end"].to_numpy(),
                        np.full(n, partition, np.int64), meta["meta_offset"].to_numpy(), fields, raw,
                        origin=origin)


def pack_items(pack: bytes) -> list[tuple]:
    """A pack's records as ``(key, start, end, record, offset, bytes)`` tuples, in offset order."""
    return [(e.key, e.start, e.end, e.fields, e.offset, e.raw) for e in unpack_events(pack, "", 0)]


def unpack_events(pack: bytes, stream: str, partition: int) -> list[Event]:
    """The events of a pack row, in offset order."""
    return unpack_columns(pack, stream, partition).events()


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

    columns: list[EventColumns]  # the packs' events, in (stream, partition, offset) order
    frontiers: list[tuple[str, int, int]]  # (stream, partition, largest start read)
    controls: list[tuple[str, Control]]
    dead: list[DeadRow]

    @property
    def events(self) -> list[Event]:
        return [e for cols in self.columns for e in cols.events()]

    @classmethod
    def of(cls, stream: str, read: Mapping[int, Sequence[Event]], partitions: Sequence[int],
           idle: Sequence[int] = (), flush: bool = False,
           mine: Callable[[Event], bool] | None = None) -> "GroupInput":
        """What the source ships one key group for a micro-batch of ``stream`` (tests, tools,
        benchmarks): ``read`` is each partition's events read, in offset order; every partition
        read gives the group a frontier row (the largest start read), the events of the group
        (those ``mine`` accepts; None: all) come as one pack per partition; then the control
        row (``partitions``, the ``idle`` ones, ``flush``: the bounded input ends)."""
        got = cls([], [], [(stream, Control(list(partitions), list(idle), flush))], [])
        for p in sorted(read):
            events = list(read[p])
            if not events:
                continue
            got.frontiers.append((stream, p, max(e.start for e in events)))
            kept = events if mine is None else [e for e in events if mine(e)]
            if kept:
                got.columns.append(EventColumns.from_events(kept))
        return got


def read_input(frame) -> GroupInput:
    """A key group's input rows (a pandas frame of :data:`INPUT_COLUMNS`), sorted by stream,
    partition and offset so a replayed micro-batch yields the same events in the same order
    (a pack holds one fetch's consecutive offsets: sorting packs by their first offset sorts
    their events)."""
    frame = frame.sort_values(["meta_stream", "meta_partition", "meta_offset"], kind="stable")
    got = GroupInput([], [], [], [])
    cols = [frame[c].tolist() for c in INPUT_COLUMNS]
    for stream, part, off, err, value, raw_key, ts, control, top, pack in zip(*cols):
        if pack is not None:
            got.columns.append(unpack_columns(pack, stream, part))
        elif control == FRONTIER:
            got.frontiers.append((stream, int(part), int(top)))  # a float column where other rows are null
        elif control is not None:
            got.controls.append((stream, Control.from_json(control)))
        else:
            got.dead.append(DeadRow(stream, int(part), int(off), raw_key, value, err,
                                    None if ts != ts else int(ts)))
    return got


# -- dead letters ---------------------------------------------------------------------------
def dead_letter(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, error: str,
                kafka_timestamp: int | None = None, stage: str | None = None) -> dict:
    """The one dead-letter record (``schemas/dead_letter.avsc``): ``topic`` is the *source
    topic* the record was read from, whichever stage refused it; ``stage`` is decode, validate
    or operator (default: what ``error`` starts with, as the source writes ``"<stage>: <reason>"``)."""
    return {"source_topic": topic, "partition": int(partition), "offset": int(offset), "key": key,
            "value": value, "error": error, "stage": stage or error.split(":", 1)[0],
            "kafka_timestamp": kafka_timestamp}


# -- output ---------------------------------------------------------------------------------
RESULT_PACK = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("role", pa.string())])


def result_pack(items: list) -> bytes:
    """One result topic's pack: ``(key, value, role)`` tuples, or :data:`RESULT_PACK` record
    batches (:meth:`ResultPacks.add_batch`), or a list mixing runs of both, in order."""
    parts: list[pa.RecordBatch] = []
    run: list[tuple] = []
    for item in items:
        if isinstance(item, pa.RecordBatch):
            if run:
                parts.append(_tuples_batch(run))
                run = []
            parts.append(item)
        else:
            run.append(item)
    if run or not parts:
        parts.append(_tuples_batch(run))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RESULT_PACK) as writer:
        for batch in parts:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _tuples_batch(items: list[tuple]) -> pa.RecordBatch:
    if not items:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in RESULT_PACK], schema=RESULT_PACK)
    return pa.RecordBatch.from_arrays([pa.array(list(c), f.type) for c, f in zip(zip(*items), RESULT_PACK)],
                                      schema=RESULT_PACK)


def result_batch(keys, values: pa.Array, role: str) -> pa.RecordBatch:
    """Result records as Arrow columns: ``keys`` (strings, or None for null keys), their
    encoded ``values`` (binary) and one ``role``."""
    n = len(values)
    if keys is None:
        key = pa.nulls(n, pa.binary())
    else:
        key = (keys if isinstance(keys, pa.Array) else pa.array(keys, pa.string())).cast(pa.binary())
    if pa.types.is_large_binary(values.type):
        values = values.cast(pa.binary())
    return pa.RecordBatch.from_arrays([key, values, pa.repeat(pa.scalar(role, pa.string()), n)],
                                      schema=RESULT_PACK)


class ResultPacks:
    """Result records → packs of at most :data:`PACK_SIZE` records and about :data:`PACK_BYTES`
    (a single larger record is a pack of its own) per topic, in output order: records
    one at a time (:meth:`add`) or as Arrow batches (:meth:`add_batch`)."""

    def __init__(self) -> None:
        self.order: list[tuple[str, list]] = []
        self._open: dict[str, list] = {}  # topic → [items, records, bytes]

    def _pack(self, topic: str, size: int) -> list:
        pack = self._open.get(topic)
        if pack is None or pack[1] >= PACK_SIZE or (pack[1] and pack[2] + size > PACK_BYTES):
            pack = self._open[topic] = [[], 0, 0]  # items, records, bytes
            self.order.append((topic, pack[0]))
        return pack

    def add(self, topic: str, key: bytes | None, value: bytes, role: str) -> None:
        size = len(value) + (len(key) if key else 0)
        pack = self._pack(topic, size)
        pack[0].append((key, value, role))
        pack[1] += 1
        pack[2] += size

    def add_batch(self, topic: str, batch: pa.RecordBatch) -> None:
        """``batch``'s records in order, split where a pack reaches :data:`PACK_SIZE` records
        or :data:`PACK_BYTES` (by the batch's mean record size)."""
        at, each = 0, max(1, batch.nbytes // max(1, batch.num_rows))
        while at < batch.num_rows:
            pack = self._pack(topic, each)
            room = min(PACK_SIZE - pack[1], max(1, (PACK_BYTES - pack[2]) // each))
            take = min(room, batch.num_rows - at)
            pack[0].append(batch.slice(at, take))
            pack[1] += take
            pack[2] += take * each
            at += take


def output_frame(packs: list[tuple[str, list]], metrics: dict[str, int]):
    """Output rows: one ``pack`` row per ``(topic, items)`` (≤ :data:`PACK_SIZE` records each,
    in order; :func:`result_pack`), then one ``metrics`` row."""
    topics = [t for t, _ in packs] + [None]
    values = [result_pack(p) for _, p in packs]
    values.append(json.dumps(metrics).encode())
    return pd.DataFrame({"topic": topics, "key": [None] * len(topics), "value": values,
                         "kind": [PACK] * len(packs) + [METRICS]})


def output_columns(batches: Iterable[pa.RecordBatch],
                   metrics: dict[str, int]) -> Iterator[tuple[str, pa.Array, pa.Array]]:
    """``(topic, keys, values)`` (binary columns, a key may be null) of the records in the
    output rows, in row order: a pack's records at a time, and runs of consecutive one-record
    rows of a topic as one slice of the rows' columns; ``metrics`` rows are summed into
    ``metrics`` (:func:`ctiflow.jobs.core.counters.merge`), not yielded."""
    for rows in batches:
        topics, kinds = rows.column("topic").to_pylist(), rows.column("kind").to_pylist()
        keys, values = rows.column("key"), rows.column("value")
        start = 0  # the first row of the current run of one-record rows
        for i, (topic, kind) in enumerate(zip(topics, kinds)):
            plain = kind != PACK and kind != METRICS
            if start < i and (not plain or topic != topics[start]):
                yield topics[start], keys.slice(start, i - start), values.slice(start, i - start)
                start = i
            if plain:
                continue
            if kind == PACK:
                table = pa.ipc.open_stream(values[i].as_py()).read_all()
                yield topic, table.column("key").combine_chunks(), table.column("value").combine_chunks()
            else:
                counters.merge(metrics, json.loads(values[i].as_py()))
            start = i + 1
        if start < len(topics):
            yield topics[start], keys.slice(start), values.slice(start)


def output_records(batches: Iterable[pa.RecordBatch],
                   metrics: dict[str, int]) -> Iterator[tuple[str, bytes | None, bytes]]:
    """``(topic, key, value)`` of every record in the output rows (:func:`output_columns`)."""
    for topic, keys, values in output_columns(batches, metrics):
        for k, v in zip(keys.to_pylist(), values.to_pylist()):
            yield topic, k, v


class ResultEncoder:
    """A key group's results → Avro-encoded packs per topic (:class:`ResultPacks`),
    in output order: what the adapter does with a micro-batch's output.

    ``out`` items are ``(topic, Output, key)`` — encoded with the topic's serializer, except an
    input record passed on unchanged, which keeps its bytes if they carry the topic's schema —
    or ``(topic, OutputBatch, None)``, encoded in bulk (:class:`ColumnEncoder`) where the topic's
    schema allows, else record by record. ``dead``: dead-letter records, after the rest."""

    def __init__(self, serializers: dict, late_topic: str, dead_letter_topic: str):
        self.serializers = serializers  # topic → ctiflow.jobs.avro.serde.AvroSerializer
        self.headers = {topic: s.header for topic, s in serializers.items()}
        self.late_topic, self.dead_letter_topic = late_topic, dead_letter_topic
        self._bulk: dict[str, ColumnEncoder] = {}

    def bulk(self, topic: str) -> ColumnEncoder:
        encoder = self._bulk.get(topic)
        if encoder is None:
            encoder = self._bulk[topic] = ColumnEncoder(json.loads(self.serializers[topic].schema.text),
                                                        self.headers[topic])
        return encoder

    def _value(self, topic: str, o) -> bytes:
        """An :class:`Output`'s bytes: as they came if they carry the topic's schema, else encoded."""
        raw = o.encoded
        return (raw if raw is not None and raw.startswith(self.headers[topic])
                else self.serializers[topic](o.record))

    def _as_they_came(self, topic: str, raw) -> pa.Array | None:
        """Records passed on unchanged (their original bytes, ``raw``) as one binary array, if
        every one was kept and carries the topic's schema; None if any must be encoded."""
        values = pa.array(raw, pa.binary())
        if values.null_count:
            return None
        header = self.headers[topic]
        if header and len(values) and not pc.all(pc.starts_with(values, pattern=header)).as_py():
            return None
        return values

    def packs(self, out: list, dead: list, counters) -> ResultPacks:
        """``counters.late_records`` counts the records written to the late topic."""
        enc, late = self.serializers, self.late_topic
        packs = ResultPacks()
        for topic, o, k in out:
            if type(o) is OutputBatch:
                if topic == late:
                    counters.late_records += o.n
                keys = o.keys if o.keys is not None else o.columns.get("key")
                if isinstance(keys, str):  # (one key shared by every record: a global count's)
                    keys = pa.repeat(pa.scalar(keys, pa.string()), o.n)
                if o.raw is not None:
                    values = self._as_they_came(topic, o.raw)
                    if values is not None:
                        packs.add_batch(topic, result_batch(keys, values, o.role))
                        continue
                else:
                    packs.add_batch(topic, result_batch(keys, self.bulk(topic).encode(o.columns, o.n),
                                                        o.role))
                    continue
                for one in o.outputs():  # record by record, as the Output items below
                    key = one.key if one.key is not None else one.record.get("key")
                    packs.add(topic, None if key is None else str(key).encode(), self._value(topic, one),
                              o.role)
                continue
            if topic == late:
                counters.late_records += 1
            packs.add(topic, None if k is None else str(k).encode(), self._value(topic, o), o.role)
        dlq = self.dead_letter_topic
        for rec in dead:
            packs.add(dlq, rec["key"], enc[dlq](rec), "dead_letter")
        return packs
