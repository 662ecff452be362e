"""Kafka source for Spark: a PySpark 4 Python Data Source (streaming reader) over confluent-kafka.

Spark's own Kafka connector needs jars from Maven Central; this one needs only pip. Contract,
in PySpark's terms:

* driver: ``initialOffset`` / ``latestOffset`` / ``partitions`` plan per-partition offset
  ranges (the offsets are ``{"<partition>": next_offset}``); ``maxOffsetsPerTrigger`` caps a
  micro-batch; ``prepareForTriggerAvailableNow`` fixes the end of a bounded run. The end of a
  partition is probed past tansu's lagging high watermark (:func:`jobs.kafka.true_end_offsets`,
  all partitions in one probe), and offsets never go backwards.
* executors: ``read`` fetches one range, decodes each fetch's Avro in bulk and strictly
  (:mod:`jobs.avro_columns`, per writer schema) and yields Arrow record batches: typed columns
  plus ``meta_``-prefixed metadata, or, for the operator pipeline, one row per key group whose
  ``meta_pack`` holds its records as Arrow columns. A record that cannot be decoded or validated
  is *not* dropped: it comes out alone with ``meta_error`` set and its original bytes in
  ``meta_value``, so the job writes it to the dead-letter topic.
* everything here is picklable and imported by module path: the project must be installed
  (the bootstrap does ``pip install -e .``) so workers can import it.

**CTIs per partition** (see :class:`operators.time.PartitionCtis`). Every key group must know
how far *every* partition has got, not only the partitions its keys came from, so:

* each offset range read also yields one *frontier* row per key group (``meta_control =
  "frontier"``, ``meta_partition``, ``meta_start`` = the range's largest start);
* each micro-batch's first offset range (or, with nothing to read, a task of its own) also
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
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from confluent_kafka import KafkaException
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from jobs import rows
from jobs.alloc import cyclic_gc_paused
from jobs.checkpoint import write_atomically
from jobs.kafka import (MESSAGE_OFFSET, MESSAGE_PARTITION, MESSAGE_TIMESTAMP, MESSAGE_VALUE, consumer, low_offset,
                        read_range, topic_partitions, true_end_offsets)
from jobs.avro_columns import ColumnDecoder, arrow_type, compile_schema, read_body
from jobs.serde import CONFLUENT_MAGIC, SINGLE_OBJECT_MAGIC, AvroDeserializer, default_store, registry_client
from operators.errors import DecodeError, StackError
from operators.events import CTI_INFINITY

FRONTIER = rows.FRONTIER  # re-exported: the row kinds and their columns are jobs.rows's
#: Event times outside [1970, 2500) are "absurd" and go to dead-letter.
MIN_TIME, MAX_TIME = 0, 16_725_225_600_000
EDGE_END = CTI_INFINITY  # an edge's end while it is current


def arrow_schema(avro_schema: dict, typed: bool = True) -> pa.Schema:
    """Typed columns for an Avro record's fields (nested values as JSON strings) + metadata, one
    row per record; ``typed=False``: the operator pipeline's packed rows (one per key group of
    a fetch, see :meth:`RecordDecoder._packed_batch`)."""
    return rows.input_schema(record_fields(avro_schema) if typed else [], packed=not typed)


def record_fields(avro_schema: dict) -> list[pa.Field]:
    """An Avro record's fields as Arrow fields (:func:`jobs.avro_columns.arrow_type`)."""
    return [pa.field(name, arrow_type(t)) for name, t, _, _ in compile_schema(avro_schema).fields]


def nested_fields(avro_schema: dict) -> list[str]:
    """Fields whose values are records/arrays/maps: they travel as JSON strings."""
    return [name for name, t, _, _ in compile_schema(avro_schema).fields
            if arrow_type(t) == pa.string() and _complex(t)]


def _complex(node) -> bool:
    if node.kind == "union":
        return any(_complex(b) for b in node.branches)
    return node.kind in ("record", "array", "map")


def spark_ddl(schema: pa.Schema) -> str:
    names = {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int", pa.float64(): "double",
             pa.float32(): "float", pa.bool_(): "boolean", pa.binary(): "binary"}
    return ", ".join(f"`{f.name}` {names[f.type]}" for f in schema)


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, typed and parsed once (Spark passes options as a case-insensitive
    string map: :meth:`to_options` writes it, :meth:`from_options` reads it back)."""

    bootstrap: str
    topic: str
    schema: str = ""  # name in schemas/ (the executors' decoder needs it; planning does not)
    key_field: str = ""
    time_field: str = ""
    stream: str = ""  # the job's source name (default: the topic)
    end_field: str | None = None
    shape: str = "point"
    key_groups: int = 1
    group_labels: tuple[int, ...] | None = None  # key group → the label Spark shuffles on
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    measures: tuple[str, ...] = ()
    client: dict = field(default_factory=dict)  # public librdkafka settings (no credentials)
    schema_registry: dict | None = None  # {url, config}
    outage_timeout: float = 120.0  # seconds
    idle_timeout: float = 60.0  # seconds
    flush_at_end: bool = True
    start_file: str | None = None  # where the first batch's start offsets are kept
    packed: bool = False  # columns=packed: the operator pipeline's rows (jobs.rows)
    keep_values: bool = True  # values=all: every row keeps its Avro bytes (else only failed rows)
    pack_fields: bool = True  # fields=packed: packs carry field columns (else only names: jobs.rows.BytesFields)

    def __post_init__(self):
        if not self.stream:
            object.__setattr__(self, "stream", self.topic)
        if not self.pack_fields and not self.keep_values:
            raise ValueError("packs without field columns need every record's bytes (values=all)")

    def to_options(self) -> dict[str, str]:
        opts = {"bootstrap": self.bootstrap, "topic": self.topic, "schema": self.schema, "stream": self.stream,
                "key_field": self.key_field, "time_field": self.time_field, "end_field": self.end_field or "",
                "shape": self.shape, "key_groups": str(self.key_groups), "startingOffsets": self.starting_offsets,
                "measures": json.dumps(list(self.measures)), "client": json.dumps(self.client),
                "outage_timeout": str(self.outage_timeout), "idle_timeout": str(self.idle_timeout),
                "flush_at_end": "true" if self.flush_at_end else "false",
                "columns": "packed" if self.packed else "all", "values": "all" if self.keep_values else "errors",
                "fields": "packed" if self.pack_fields else "bytes"}
        if self.group_labels is not None:
            opts["group_labels"] = json.dumps(list(self.group_labels))
        if self.max_offsets_per_trigger:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.schema_registry:
            opts["schema_registry"] = json.dumps(self.schema_registry)
        if self.start_file:
            opts["start_file"] = self.start_file
        return opts

    @classmethod
    def from_options(cls, options) -> "SourceOptions":
        o = {k.lower(): v for k, v in options.items()}
        labels = json.loads(o.get("group_labels") or "null")
        return cls(bootstrap=o.get("bootstrap", ""), topic=o["topic"], schema=o.get("schema", ""),
                   key_field=o.get("key_field", ""), time_field=o.get("time_field", ""), stream=o.get("stream", ""), end_field=o.get("end_field") or None,
                   shape=o.get("shape", "point"), key_groups=int(o.get("key_groups", "1")),
                   group_labels=tuple(labels) if labels else None,
                   starting_offsets=o.get("startingoffsets", "earliest"),
                   max_offsets_per_trigger=int(o["maxoffsetspertrigger"]) if o.get("maxoffsetspertrigger") else None,
                   measures=tuple(json.loads(o.get("measures", "[]"))), client=json.loads(o.get("client", "{}")),
                   schema_registry=json.loads(o["schema_registry"]) if o.get("schema_registry") else None,
                   outage_timeout=float(o.get("outage_timeout", "120")), idle_timeout=float(o.get("idle_timeout", "60")),
                   flush_at_end=o.get("flush_at_end", "true") == "true", start_file=o.get("start_file") or None,
                   packed=o.get("columns", "all") == "packed", keep_values=o.get("values", "all") == "all",
                   pack_fields=o.get("fields", "packed") != "bytes")

    @staticmethod
    def parsed(options) -> "SourceOptions":
        return options if isinstance(options, SourceOptions) else SourceOptions.from_options(options)


class KafkaSource(DataSource):
    """``spark.readStream.format("ctiflow_kafka").options(**SourceOptions(...).to_options())``."""

    @classmethod
    def name(cls) -> str:
        return "ctiflow_kafka"

    def _arrow(self) -> pa.Schema:
        opts = SourceOptions.from_options(self.options)
        # columns=packed: the operator pipeline needs no typed columns (Spark cannot prune a
        # Python source's columns itself) and far fewer rows.
        return arrow_schema(json.loads(default_store().get(opts.schema).text), typed=not opts.packed)

    def schema(self) -> str:
        return spark_ddl(self._arrow())

    def streamReader(self, schema) -> "KafkaStreamReader":
        return KafkaStreamReader(SourceOptions.from_options(self.options), self._arrow())


def _data(offsets: dict) -> dict:
    """The per-partition part of an offset (without the ``flushed`` and ``idle`` markers)."""
    return {p: v for p, v in offsets.items() if p.isdigit()}


def _spread(start: dict, ends: dict, budget: int) -> dict:
    """Spread a row budget over partitions in a fixed order: deterministic batch cuts."""
    out = dict(start)
    backlog = {p: max(0, e - start.get(p, 0)) for p, e in ends.items()}
    while budget > 0 and any(backlog.values()):
        share = max(1, budget // max(1, sum(1 for v in backlog.values() if v)))
        for p in sorted(backlog, key=int):
            take = min(share, backlog[p], budget)
            out[p] = out.get(p, 0) + take
            backlog[p] -= take
            budget -= take
    return out


class OffsetRange(InputPartition):
    """Records ``[start, end)`` of one Kafka partition; ``control``: the micro-batch's control
    rows, yielded first by the task that reads this range (the first range of a batch carries
    them, so they cost no task of their own: Spark's per-task cost for a Python reader is
    tens of milliseconds)."""

    def __init__(self, partition: int, start: int, end: int, control: "BatchControl | None" = None):
        self.partition, self.start, self.end, self.control = partition, start, end, control


class BatchControl(InputPartition):
    """The micro-batch's control rows: the topic's partitions, the idle ones, the flush flag (a
    task of its own only when the batch reads no records: :class:`OffsetRange` carries it)."""

    def __init__(self, partitions: list[int], idle: list[int], flush: bool):
        self.partitions, self.idle, self.flush = partitions, idle, flush


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: "SourceOptions | dict[str, str]", schema: pa.Schema):
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
                raise StackError(f"Kafka at {self.options.bootstrap} unreachable (or topic {self.topic!r} gone) "
                                 f"for more than {limit:.0f} s: {exc}. Restart the job when the broker is back; "
                                 "it resumes from its checkpoint.") from exc
            return None
        self._outage_since = None
        return ends

    def initialOffset(self) -> dict:
        """Where the first micro-batch starts, resolved once and kept with the checkpoint
        (option ``start_file``). Spark logs only a batch's *end* offsets and asks again for
        the start of batch 0 when it replays it after a crash; ``latest`` (or ``earliest``
        after retention) would by then be elsewhere, and the replay would not be the batch whose
        results already landed."""
        saved = Path(self.options.start_file) if self.options.start_file else None
        if saved is not None and saved.exists():
            self._initial = json.loads(saved.read_text())
            return self._initial
        how = self.options.starting_offsets
        if how == "earliest":
            start = {str(p): low_offset(self._cons(), self.topic, p) for p in self._parts()}
        elif how == "latest":
            start = self._ends({})
        else:
            given = json.loads(how).get(self.topic, {})
            start = {str(p): int(given.get(str(p), 0)) for p in self._parts()}
        if saved is not None:
            write_atomically(saved, json.dumps(start))
        self._initial = start
        return start

    def _initial_offsets(self) -> dict:
        if self._initial is None:
            saved = Path(self.options.start_file) if self.options.start_file else None
            self._initial = json.loads(saved.read_text()) if saved is not None and saved.exists() else {}
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
        self.target = self._ends({})

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

    def partitions(self, start: dict, end: dict):
        data_start = _data(start)
        ranges = [OffsetRange(int(p), data_start.get(p, 0), e)
                  for p, e in sorted(_data(end).items(), key=lambda x: int(x[0])) if e > data_start.get(p, 0)]
        flush = bool(end.get("flushed") and not start.get("flushed"))
        every = sorted({int(p) for p in _data(end)} | set(self._parts()))
        control = BatchControl(every, [int(p) for p in end.get("idle", ())], flush)
        if not ranges:
            return [control]
        ranges[0].control = control
        return ranges

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
    def read(self, partition) -> Iterator[pa.RecordBatch]:
        decoder = RecordDecoder(self.options, self.arrow)
        # Frontier and control rows are for the operator pipeline (packed rows) only: a typed
        # read (one row per record, e.g. a stateless pass-through) gets records and dead rows.
        control = "meta_pack" in self.arrow.names
        batch_control = partition if isinstance(partition, BatchControl) else partition.control
        if batch_control is not None and control:
            yield decoder.control_rows(batch_control.partitions, batch_control.idle, batch_control.flush)
        if isinstance(partition, BatchControl):
            return
        cons = consumer(self.options.bootstrap, self.client, **{"group.id": "ctiflow-source"})
        try:
            for msgs in read_range(cons, self.topic, partition.partition, partition.start, partition.end, raw=True):
                with cyclic_gc_paused():
                    batch = decoder.batch(msgs)
                yield batch
        finally:
            cons.close()
        if control and decoder.frontier is not None:
            yield decoder.frontier_rows(partition.partition)


@dataclass
class Decoded:
    """One fetch, decoded and validated: the good records as columns (``fields``: the reader
    schema's, in its order) with their message index, key, start and end; a reason per failed
    message (``"<stage>: <reason>"``)."""

    fields: pa.Table
    index: np.ndarray
    keys: pa.Array
    starts: np.ndarray
    ends: np.ndarray
    errors: dict[int, str]


class RecordDecoder:
    """Avro bytes → typed columns in bulk (:mod:`jobs.avro_columns`), validated on the columns;
    a message that fails gets its own reason, its neighbours go on."""

    def __init__(self, options: "SourceOptions | dict[str, str]", arrow: pa.Schema):
        options = SourceOptions.parsed(options)
        reg = options.schema_registry or {}
        registry = registry_client(reg["url"], reg.get("config")) if reg.get("url") else None
        self.decode = AvroDeserializer(options.schema, registry=registry, subject=f"{options.topic}-value")
        self.arrow = arrow
        reader = json.loads(self.decode.reader.text)
        self.nested_fields = nested_fields(reader)
        self.record_schema = pa.schema(record_fields(reader))
        self.stream = options.stream
        self.key_field = options.key_field
        self.time_field = options.time_field
        self.end_field = options.end_field
        self.shape = options.shape
        self.groups = options.key_groups
        # crc32(key) mod G picks the group (stable across processes, unlike hash()); the label
        # is the value Spark shuffles on (see jobs.checkpoint.group_labels).
        self.labels = list(options.group_labels or range(self.groups))
        self.measures = list(options.measures)
        # values=errors: good rows leave meta_value null (only dead letters need the bytes,
        # unless an operator passes records on unchanged); less to shuffle and to keep in state.
        self.keep_values = options.keep_values
        # fields=bytes: no operator reads the fields, the bytes travel alone (jobs.rows.BytesFields).
        self.pack_fields = options.pack_fields
        self.frontier: int | None = None  # the largest start of a good record decoded so far
        self._bulk: dict[bytes, ColumnDecoder | DecodeError | None] = {}

    # -- decoding ------------------------------------------------------------------------
    def _column_decoder(self, writer) -> "ColumnDecoder | None":
        """The bulk decoder for ``writer`` (None: not flat, decode per record); raises
        :class:`DecodeError` when ``writer`` does not resolve to the reader schema."""
        got = self._bulk.get(writer.fingerprint, False)
        if got is False:
            try:
                self.decode.record_reader(writer)  # refuses an unresolvable writer schema
                reader = None if writer.fingerprint == self.decode.reader.fingerprint else self.decode.reader.node
                got = ColumnDecoder(writer.node, reader) if ColumnDecoder.flat(writer.node) else None
            except DecodeError as exc:
                got = exc
            self._bulk[writer.fingerprint] = got
        if isinstance(got, DecodeError):
            raise got
        return got

    def decoded(self, values: list) -> Decoded:
        """Decode and validate Kafka values (bytes or None), in bulk per writer schema."""
        n = len(values)
        if None in values:  # (a C-level scan; tombstones are rare)
            values = [b"" if v is None else v for v in values]
        lengths = np.fromiter(map(len, values), np.int64, n)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        data = b"".join(values)
        errors: dict[int, str] = {}
        parts: list[tuple[pa.Table, np.ndarray]] = []
        for writer, header, index in self._by_writer(values, data, starts, lengths, errors):
            self._decode_group(writer, header, index, values, data, starts, ends, parts, errors)
        if not parts:
            table, index = self.record_schema.empty_table(), np.zeros(0, np.int64)
        elif len(parts) == 1:
            table, index = parts[0]
        else:
            index = np.concatenate([i for _, i in parts])
            order = np.argsort(index, kind="stable")
            table, index = pa.concat_tables([t for t, _ in parts]).take(order), index[order]
        return self._validated(table, index, errors)

    def _by_writer(self, values: list, data: bytes, starts: np.ndarray, lengths: np.ndarray,
                   errors: dict[int, str]) -> list[tuple]:
        """``(writer schema, header length, message indices)``, from the framing headers in bulk;
        an unknown or malformed header is each message's error."""
        buf = np.frombuffer(data + bytes(10), np.uint8)
        first, second = buf[starts], buf[starts + 1]
        single = (lengths >= 10) & (first == SINGLE_OBJECT_MAGIC[0]) & (second == SINGLE_OBJECT_MAGIC[1])
        confluent = (lengths >= 5) & (first == CONFLUENT_MAGIC[0])
        ids = np.zeros(len(values), np.uint64)
        if single.any():
            at = starts[single]
            ids[single] = buf[at[:, None] + np.arange(2, 10)].copy().view("<u8").ravel()
        if confluent.any():
            at = starts[confluent]
            ids[confluent] = buf[at[:, None] + np.arange(1, 5)].copy().view(">u4").ravel().astype(np.uint64)
        kind = np.where(single, 1, np.where(confluent, 2, 0))
        groups: dict = {}
        for i in np.nonzero(kind == 0)[0]:
            errors[int(i)] = f"decode: {self._header_error(values[i])}"
        for k in (1, 2):
            mine = np.nonzero(kind == k)[0]
            if not len(mine):
                continue
            distinct, inverse = np.unique(ids[mine], return_inverse=True)
            for j in range(len(distinct)):
                index = mine[inverse == j]
                try:
                    writer, header = self.decode.writer_schema(values[index[0]])
                except DecodeError as exc:
                    errors.update((int(i), f"decode: {exc}") for i in index)
                    continue
                groups.setdefault(writer.fingerprint, (writer, header, []))[2].append(index)
        return [(writer, header, np.sort(np.concatenate(idx))) for writer, header, idx in groups.values()]

    def _header_error(self, value: bytes) -> str:
        """Why a value with neither a full single-object nor a full Confluent header is refused."""
        if not value:
            return "empty value"
        try:
            self.decode.writer_schema(value)
        except DecodeError as exc:
            return str(exc)
        return "malformed header"  # not reached: writer_schema refuses what the bulk checks refuse

    def _decode_group(self, writer, header: int, index: np.ndarray, values: list, data: bytes, starts: np.ndarray,
                      ends: np.ndarray, parts: list, errors: dict[int, str]) -> None:
        where = f"decode: Avro body does not decode with schema {writer.name!r}"
        try:
            bulk = self._column_decoder(writer)
        except DecodeError as exc:
            errors.update((int(i), f"{where}: {exc}") for i in index)
            return
        if bulk is not None:
            columns, good, reasons = bulk.decode(data, starts[index] + header, ends[index])
            errors.update((int(index[i]), f"{where}: {reason}") for i, reason in reasons.items())
            parts.append((pa.Table.from_arrays(columns, schema=self.record_schema), index[good]))
            return
        read, records, kept = self.decode.record_reader(writer), [], []
        for i in index:
            try:
                rec = read_body(read, values[i], header)
            except DecodeError as exc:
                errors[int(i)] = f"{where}: {exc}"
                continue
            for f in self.nested_fields:
                if rec.get(f) is not None and not isinstance(rec[f], str):
                    rec[f] = json.dumps(rec[f], default=str)
            records.append(rec)
            kept.append(i)
        parts.append((pa.Table.from_pylist(records, schema=self.record_schema), np.array(kept, np.int64)))

    # -- validation ----------------------------------------------------------------------
    def _column(self, table: pa.Table, name: str | None):
        return table.column(name) if name and name in table.column_names else pa.nulls(table.num_rows)

    def _times(self, table: pa.Table, name: str, fail, missing: str, absurd) -> np.ndarray:
        """A time column as int64 (0 where null), failing nulls and values outside [1970, 2500)."""
        col = self._column(table, name)
        null = np.asarray(col.is_null())
        fail(null, missing)
        if pa.types.is_integer(col.type):
            values = np.asarray(col.fill_null(0).to_numpy(), np.int64)
            out_of_range = ~null & ((values < MIN_TIME) | (values >= MAX_TIME))
        else:  # not an integer: every value is absurd (ms since 1970 are integers)
            values = np.zeros(table.num_rows, np.int64)
            out_of_range = ~null
        fail(out_of_range, lambda i: absurd(col[int(i)].as_py()))
        return values

    def _validated(self, table: pa.Table, index: np.ndarray, errors: dict[int, str]) -> Decoded:
        """The checks of a record's key, times and measures, on the columns; the first that
        fails is the record's reason."""
        n = table.num_rows
        bad = np.zeros(n, bool)
        reasons: dict[int, str] = {}

        def fail(mask: np.ndarray, message) -> None:
            new = mask & ~bad
            if new.any():
                for i in np.nonzero(new)[0]:
                    reasons[int(i)] = "validate: " + (message(i) if callable(message) else message)
                bad[:] |= new

        key = self._column(table, self.key_field)
        if not pa.types.is_string(key.type):
            key = pa.array([None if k is None else str(k) for k in key.to_pylist()], pa.string())
        fail(np.asarray(pc.or_kleene(key.is_null(), pc.equal(key, "")).fill_null(True)),
             f"missing key field {self.key_field!r}")
        tf, ef = self.time_field, self.end_field
        start = self._times(table, tf, fail, f"missing event time {tf!r}",
                            lambda v: f"absurd event time {tf}={v!r} (expected ms since 1970, before 2500)")
        if self.shape == "interval":
            end = self._times(table, ef, fail, f"missing end time {ef!r}", lambda v: f"absurd end time {ef}={v!r}")
            fail(end < start, lambda i: f"end < start ({ef}={end[i]} < {tf}={start[i]})")
        elif self.shape == "edge":
            end = np.full(n, EDGE_END, np.int64)
        else:
            end = start
        for m in self.measures:
            col = self._column(table, m)
            wrong = np.asarray(col.is_null())
            if pa.types.is_floating(col.type):
                wrong |= ~np.isfinite(np.asarray(col.fill_null(0).to_numpy(), np.float64))
            fail(wrong, lambda i, col=col, m=m: f"measure {m!r} is {col[int(i)].as_py()!r}; measures must be finite numbers")
        for i, reason in reasons.items():
            errors[int(index[i])] = reason
        if bad.any():
            keep = ~bad
            table, index, key, start, end = (table.filter(pa.array(keep)), index[keep], key.filter(pa.array(keep)),
                                            start[keep], end[keep])
        return Decoded(table, index, key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key,
                       start, end, errors)

    # -- rows ----------------------------------------------------------------------------
    def _group_of(self, keys: pa.Array) -> np.ndarray:
        """Each key's group label: crc32 once per distinct key."""
        encoded = pc.dictionary_encode(keys)
        labels, groups, crc = self.labels, self.groups, zlib.crc32
        per_key = np.array([labels[crc(k.encode()) % groups] for k in encoded.dictionary.to_pylist()], np.int64)
        return per_key[np.asarray(encoded.indices)] if len(per_key) else np.zeros(0, np.int64)

    def batch(self, msgs) -> pa.RecordBatch:
        """Kafka messages (confluent-kafka ``Message`` objects) → one Arrow record batch."""
        values = list(map(MESSAGE_VALUE, msgs))
        got = self.decoded(values)
        if len(got.starts):
            top = int(got.starts.max())
            if self.frontier is None or top > self.frontier:
                self.frontier = top
        if "meta_pack" in self.arrow.names:
            return self._packed_batch(msgs, values, got)
        n_good = got.fields.num_rows
        offsets = np.fromiter(map(MESSAGE_OFFSET, msgs), np.int64, len(msgs))
        kafka_ts = [ts for _, ts in map(MESSAGE_TIMESTAMP, msgs)]
        partitions = list(map(MESSAGE_PARTITION, msgs))
        good_cols = {name: got.fields.column(name) for name in got.fields.column_names}
        index = got.index
        good_cols.update(
            meta_stream=pa.array([self.stream] * n_good, pa.string()), meta_key=got.keys,
            meta_start=pa.array(got.starts, pa.int64()), meta_end=pa.array(got.ends, pa.int64()),
            meta_group=pa.array(self._group_of(got.keys), pa.int32()),
            meta_partition=pa.array([partitions[i] for i in index], pa.int32()),
            meta_offset=pa.array(offsets[index], pa.int64()),
            meta_kafka_ts=pa.array([kafka_ts[i] for i in index], pa.int64()),
            meta_value=pa.array([values[i] for i in index], pa.binary()))
        good = pa.table({name: good_cols.get(name, pa.nulls(n_good, self.arrow.field(name).type))
                         for name in self.arrow.names}, schema=self.arrow)
        dead_index = sorted(got.errors)
        groups = self.groups
        dead = pa.table({
            "meta_stream": [self.stream] * len(dead_index),
            "meta_group": [self.labels[partitions[i] % groups] for i in dead_index],
            "meta_partition": [partitions[i] for i in dead_index], "meta_offset": [int(offsets[i]) for i in dead_index],
            "meta_kafka_ts": [kafka_ts[i] for i in dead_index], "meta_error": [got.errors[i] for i in dead_index],
            "meta_value": [values[i] for i in dead_index], "meta_raw_key": [msgs[i].key() for i in dead_index],
        })
        dead = pa.table({name: dead.column(name) if name in dead.column_names else pa.nulls(len(dead_index), f.type)
                         for name, f in zip(self.arrow.names, self.arrow)}, schema=self.arrow)
        both = pa.concat_tables([good, dead])
        order = np.argsort(np.concatenate([index, np.array(dead_index, np.int64)]), kind="stable")
        return both.take(order).combine_chunks().to_batches()[0] if both.num_rows else pa.RecordBatch.from_pylist([], schema=self.arrow)

    def _packed_batch(self, msgs, values: list, got: Decoded) -> pa.RecordBatch:
        """The operator pipeline's rows: one row per **key group** of a fetch, its good records
        as Arrow columns in ``meta_pack`` (:func:`jobs.rows.pack_columns`), plus one row per
        failed record (error, raw key, Kafka timestamp, bytes). Spark then moves a few hundred
        rows a micro-batch instead of one per event: the shuffle and the Arrow hand-offs to and
        from the stateful worker cost per row, the operators per event. A pack row's
        ``meta_start`` is its largest start (all the watermark needs) and its ``meta_offset``
        its first offset (the adapter's replay-stable order)."""
        part = msgs[0].partition() if msgs else 0
        if msgs and msgs[-1].partition() != part:  # packs and their order assume one partition a fetch
            raise ValueError(f"a fetch spans partitions {part} and {msgs[-1].partition()}; read one partition at a time")
        offsets = np.fromiter(map(MESSAGE_OFFSET, msgs), np.int64, len(msgs))
        index = got.index
        group = self._group_of(got.keys)
        kept = pa.array([values[i] for i in index], pa.binary()) if self.keep_values else pa.nulls(len(index), pa.binary())
        packs: list[tuple[int, int, int, bytes]] = []
        each = self._record_bytes(got, kept)
        for g in np.unique(group):
            chosen = np.nonzero(group == g)[0]
            # consecutive runs of the group's records, each about PACK_BYTES: sorting packs by first offset sorts events
            count = max(1, min(len(chosen), int(np.ceil(len(chosen) * each / rows.PACK_BYTES))))
            for sel in np.array_split(chosen, count):
                take = pa.array(sel)
                blob = rows.pack_columns(got.fields.take(take), got.keys.take(take), got.starts[sel], got.ends[sel],
                                         offsets[index[sel]], kept.take(take), tuple(self.nested_fields),
                                         with_fields=self.pack_fields)
                packs.append((int(g), int(offsets[index[sel[0]]]), int(got.starts[sel].max()), blob))
        dead = [(self.labels[part % self.groups], int(offsets[i]), got.errors[i], values[i], msgs[i].key(),
                 msgs[i].timestamp()[1]) for i in sorted(got.errors)]
        names = self.arrow.names
        n = len(packs) + len(dead)
        cols: dict[str, list] = {name: [None] * n for name in names}
        for i, (g, first, top, blob) in enumerate(packs):
            cols["meta_group"][i], cols["meta_offset"][i], cols["meta_start"][i], cols["meta_pack"][i] = g, first, top, blob
        for i, (g, off, error, value, raw_key, ts) in enumerate(dead, len(packs)):
            cols["meta_group"][i], cols["meta_offset"][i], cols["meta_error"][i] = g, off, error
            cols["meta_value"][i], cols["meta_raw_key"][i], cols["meta_kafka_ts"][i] = value, raw_key, ts
        cols["meta_stream"] = [self.stream] * n
        cols["meta_partition"] = [part] * n
        return pa.RecordBatch.from_pydict(cols, schema=self.arrow)

    def _record_bytes(self, got: Decoded, kept: pa.Array) -> float:
        """A good record's mean size in a pack of this fetch (what splits packs at
        :data:`jobs.rows.PACK_BYTES`)."""
        return ((got.fields.nbytes if self.pack_fields else 0) + kept.nbytes + got.keys.nbytes) / max(1, len(got.index)) + 32

    def frontier_rows(self, partition: int) -> pa.RecordBatch:
        """One frontier row per key group: ``partition`` has been read up to :attr:`frontier`."""
        return rows.rows_per_group(self.arrow, self.stream, self.labels, partition, self.frontier, FRONTIER)

    def control_rows(self, partitions: list[int], idle: list[int], flush: bool) -> pa.RecordBatch:
        """One control row per key group (see the module docstring)."""
        return rows.rows_per_group(self.arrow, self.stream, self.labels, -1, None,
                                   rows.Control(partitions, idle, flush).to_json())
