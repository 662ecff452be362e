"""One fetch of Kafka messages → typed Arrow columns and metadata, on an executor.

Avro bodies are decoded in bulk per writer schema (:mod:`ctiflow.jobs.avro.decode`) and checked on
the columns (key, event time, end time, measures); a message that fails gets its own reason and
comes out alone with its bytes (the job dead-letters it), its neighbours go on. For the operator
pipeline the good records are packed per key group (:mod:`ctiflow.jobs.core.rows`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctiflow.jobs.core import rows
from ctiflow.jobs.avro.decode import ColumnDecoder, arrow_type, compile_schema
from ctiflow.jobs.avro.serde import CONFLUENT_MAGIC, SINGLE_OBJECT_MAGIC, AvroDeserializer, registry_client
from ctiflow.jobs.datapath.kafka import message_offsets
from ctiflow.jobs.state.keyhash import crc32_column
from ctiflow.jobs.datapath.source.options import SourceOptions
from ctiflow.operators.errors import DecodeError
from ctiflow.operators.events import CTI_INFINITY

#: Event times outside [1970, 2500) are "absurd" and go to dead-letter.
MIN_TIME, MAX_TIME = 0, 16_725_225_600_000
EDGE_END = CTI_INFINITY  # an edge's end while it is current


def record_fields(avro_schema: dict) -> list[pa.Field]:
    """An Avro record's fields as Arrow fields (:func:`ctiflow.jobs.avro.decode.arrow_type`)."""
    return [pa.field(name, arrow_type(t)) for name, t, _, _ in compile_schema(avro_schema).fields]


def nested_fields(avro_schema: dict) -> list[str]:
    """Fields whose values are records/arrays/maps: they travel as JSON strings."""
    return [name for name, t, _, _ in compile_schema(avro_schema).fields
            if arrow_type(t) == pa.string() and _complex(t)]


def _complex(node) -> bool:
    if node.kind == "union":
        return any(_complex(b) for b in node.branches)
    return node.kind in ("record", "array", "map")



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
    """Avro bytes → typed columns in bulk (:mod:`ctiflow.jobs.avro.decode`), validated on the columns;
    a message that fails gets its own reason, its neighbours go on."""

    def __init__(self, options: "SourceOptions | dict[str, str]", arrow: pa.Schema = rows.INPUT_SCHEMA):
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
        # is the value Spark shuffles on (see ctiflow.jobs.driver.checkpoint.group_labels).
        self.labels = list(options.group_labels or range(self.groups))
        self.measures = list(options.measures)
        # values=errors: good rows leave meta_value null (only dead letters need the bytes,
        # unless an operator passes records on unchanged); less to shuffle and to keep in state.
        self.keep_values = options.keep_values
        # fields=bytes: no operator reads the fields, the bytes travel alone
        # (ctiflow.jobs.core.rows.BytesFields).
        self.pack_fields = options.pack_fields
        self.broadcast = options.broadcast
        self.frontier: int | None = None  # the largest start of a good record decoded so far
        self._bulk: dict[bytes, ColumnDecoder | DecodeError] = {}
        self._labels = np.asarray(self.labels, np.int64)  # group → its label

    # -- decoding ------------------------------------------------------------------------
    def _column_decoder(self, writer) -> ColumnDecoder:
        """The decoder for ``writer``; raises :class:`DecodeError` when ``writer`` does not
        resolve to the reader schema."""
        got = self._bulk.get(writer.fingerprint)
        if got is None:
            try:
                self.decode.record_reader(writer)  # refuses an unresolvable writer schema
                reader = (None if writer.fingerprint == self.decode.reader.fingerprint
                          else self.decode.reader.node)
                got = ColumnDecoder(writer.node, reader)
            except DecodeError as exc:
                got = exc
            self._bulk[writer.fingerprint] = got
        if isinstance(got, DecodeError):
            raise got
        return got

    def decoded(self, values: list) -> Decoded:
        """Decode and validate Kafka values (bytes or None), in bulk per writer schema."""
        n = len(values)
        try:
            lengths = np.fromiter(map(len, values), np.int64, n)
        except TypeError:  # a tombstone (None) among them: rare, so not scanned for beforehand
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
            if (ids[mine] == ids[mine[0]]).all():  # one writer schema: the usual case, no sort
                split = [mine]
            else:
                distinct, inverse = np.unique(ids[mine], return_inverse=True)
                split = [mine[inverse == j] for j in range(len(distinct))]
            for index in split:
                try:
                    writer, header = self.decode.writer_schema(values[index[0]])
                except DecodeError as exc:
                    errors.update((int(i), f"decode: {exc}") for i in index)
                    continue
                groups.setdefault(writer.fingerprint, (writer, header, []))[2].append(index)
        return [(writer, header, idx[0] if len(idx) == 1 else np.sort(np.concatenate(idx)))
                for writer, header, idx in groups.values()]

    def _header_error(self, value: bytes) -> str:
        """Why a value with neither a full single-object nor a full Confluent header is refused."""
        if not value:
            return "empty value"
        try:
            self.decode.writer_schema(value)
        except DecodeError as exc:
            return str(exc)
        return "malformed header"  # not reached: writer_schema refuses what the bulk checks refuse

    def _decode_group(self, writer, header: int, index: np.ndarray, values: list, data: bytes,
                      starts: np.ndarray, ends: np.ndarray, parts: list, errors: dict[int, str]) -> None:
        where = f"decode: Avro body does not decode with schema {writer.name!r}"
        try:
            bulk = self._column_decoder(writer)
        except DecodeError as exc:
            errors.update((int(i), f"{where}: {exc}") for i in index)
            return
        columns, good, reasons = bulk.decode(data, starts[index] + header, ends[index])
        errors.update((int(index[i]), f"{where}: {reason}") for i, reason in reasons.items())
        parts.append((pa.Table.from_arrays(columns, schema=self.record_schema), index[good]))

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
            end = self._times(table, ef, fail, f"missing end time {ef!r}",
                              lambda v: f"absurd end time {ef}={v!r}")
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
            fail(wrong, lambda i, col=col, m=m: f"measure {m!r} is {col[int(i)].as_py()!r}; measures must "
                                                "be finite numbers")
        for i, reason in reasons.items():
            errors[int(index[i])] = reason
        if bad.any():
            keep = ~bad
            table, index, key, start, end = (table.filter(pa.array(keep)), index[keep],
                                            key.filter(pa.array(keep)), start[keep], end[keep])
        return Decoded(table, index, key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key,
                       start, end, errors)

    # -- rows ----------------------------------------------------------------------------
    def _group_of(self, keys: pa.Array) -> np.ndarray:
        """Each key's group label: ``crc32(key) mod G`` per distinct key of the fetch, computed
        on the Arrow string column (:func:`ctiflow.jobs.state.keyhash.crc32_column`, no Python step per
        key)."""
        encoded = pc.dictionary_encode(keys)
        per_key = self._labels[crc32_column(encoded.dictionary) % self.groups]
        return per_key[np.asarray(encoded.indices)] if len(per_key) else np.zeros(0, np.int64)

    def batch(self, msgs) -> pa.RecordBatch:
        """Kafka messages (confluent-kafka ``Message`` objects) → one Arrow record batch."""
        values = [m.value() for m in msgs]
        got = self.decoded(values)
        if len(got.starts):
            top = int(got.starts.max())
            if self.frontier is None or top > self.frontier:
                self.frontier = top
        return self.rows(msgs, values, got)

    def rows(self, msgs, values: list, got: Decoded) -> pa.RecordBatch:
        """The operator pipeline's rows: one row per **key group** of a fetch, its good records
        as Arrow columns in ``meta_pack`` (:func:`ctiflow.jobs.core.rows.pack_columns`), plus one row per
        failed record (error, raw key, Kafka timestamp, bytes). Spark then moves a few hundred
        rows a micro-batch instead of one per event: the shuffle and the Arrow hand-offs to and
        from the stateful worker cost per row, the operators per event. A pack row's
        ``meta_start`` is its largest start (all the watermark needs) and its ``meta_offset``
        its first offset (the adapter's replay-stable order)."""
        part = msgs[0].partition() if msgs else 0
        if msgs and msgs[-1].partition() != part:  # packs and their order assume one partition a fetch
            raise ValueError(f"a fetch spans partitions {part} and {msgs[-1].partition()}; read one "
                             "partition at a time")
        offsets = message_offsets(msgs)
        index = got.index
        group = self._group_of(got.keys)
        origin = None
        if self.broadcast and len(index):  # every record to every key group (a rules topic: a few records)
            n = len(self.labels)
            group = np.repeat(np.asarray(self.labels, np.int64), len(index))
            got = Decoded(pa.concat_tables([got.fields] * n), np.tile(index, n),
                          pa.concat_arrays([got.keys] * n), np.tile(got.starts, n), np.tile(got.ends, n),
                          got.errors)
            index = got.index
            # (a record refused after decoding becomes a dead letter of its bytes, key and time)
            origin = ([msgs[i].key() for i in index], [msgs[i].timestamp()[1] for i in index])
        kept = (pa.array([values[i] for i in index], pa.binary()) if self.keep_values or origin is not None
                else pa.nulls(len(index), pa.binary()))
        firsts, packs = self._packs(group, got, offsets[index], kept, origin)
        dead = [(self.labels[part % self.groups], int(offsets[i]), got.errors[i], values[i], msgs[i].key(),
                 msgs[i].timestamp()[1]) for i in sorted(got.errors)]
        n, d = len(packs), len(dead)
        cols: dict[str, pa.Array] = {
            "meta_group": pa.array([*firsts["group"], *(x[0] for x in dead)], pa.int32()),
            "meta_offset": pa.array([*firsts["offset"], *(x[1] for x in dead)], pa.int64()),
            "meta_start": pa.array([*firsts["start"], *([None] * d)], pa.int64()),
            "meta_pack": pa.concat_arrays([packs, pa.nulls(d, pa.binary())]) if d else packs,
            "meta_error": pa.array([*([None] * n), *(x[2] for x in dead)], pa.string()),
            "meta_value": pa.array([*([None] * n), *(x[3] for x in dead)], pa.binary()),
            "meta_raw_key": pa.array([*([None] * n), *(x[4] for x in dead)], pa.binary()),
            "meta_kafka_ts": pa.array([*([None] * n), *(x[5] for x in dead)], pa.int64()),
            "meta_stream": pa.array([self.stream] * (n + d), pa.string()),
            "meta_partition": pa.array([part] * (n + d), pa.int32()),
        }
        return pa.RecordBatch.from_arrays([cols[f.name] if f.name in cols else pa.nulls(n + d, f.type)
                                           for f in self.arrow], schema=self.arrow)

    def _packs(self, group: np.ndarray, got: Decoded, offsets: np.ndarray, kept: pa.Array,
               origin: tuple[list, list] | None = None) -> tuple[dict, pa.Array]:
        """The packs of the good records, ``({"group", "offset", "start": one per pack}, packs)``
        (a pack's group, first offset and largest start; the packs as one binary column): each group's
        records in consecutive runs of about :data:`ctiflow.jobs.core.rows.PACK_BYTES` (sorting packs
        by first offset sorts events). The records are put in group order with one ``take`` per
        column (none when they already are), each pack a zero-copy slice of that."""
        n = len(group)
        if not n:
            return {"group": [], "offset": [], "start": []}, pa.array([], pa.binary())
        fields, keys, starts, ends = got.fields, got.keys, got.starts, got.ends
        if n > 1 and (group[1:] < group[:-1]).any():
            order = np.argsort(group, kind="stable")
            take = pa.array(order)
            group, starts, ends, offsets = group[order], starts[order], ends[order], offsets[order]
            fields, keys = fields.take(take), keys.take(take)
            kept = kept.take(take) if kept.null_count != len(kept) else kept
            if origin is not None:
                origin = tuple([column[i] for i in order.tolist()] for column in origin)
        batch = rows.pack_batch(fields, keys, starts, ends, offsets, kept, tuple(self.nested_fields),
                                with_fields=self.pack_fields, origin=origin)
        each = self._record_bytes(got, kept)
        bounds = np.flatnonzero(group[1:] != group[:-1]) + 1
        cuts = [0]
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), n]):
            count = max(1, min(hi - lo, int(np.ceil((hi - lo) * each / rows.PACK_BYTES))))
            q, r = divmod(hi - lo, count)  # the cuts of np.array_split: the first r runs one longer
            cuts.extend(lo + i * q + min(i, r) for i in range(1, count + 1))
        first = cuts[:-1]
        return ({"group": group[first].tolist(), "offset": offsets[first].tolist(),
                 "start": np.maximum.reduceat(starts, first).tolist()}, rows.pack_slices(batch, cuts))

    def _record_bytes(self, got: Decoded, kept: pa.Array) -> float:
        """A good record's mean size in a pack of this fetch (what splits packs at
        :data:`ctiflow.jobs.core.rows.PACK_BYTES`)."""
        return (((got.fields.nbytes if self.pack_fields else 0) + kept.nbytes + got.keys.nbytes)
                / max(1, len(got.index)) + 32)

    def frontier_rows(self, partition: int) -> pa.RecordBatch:
        """One frontier row per key group: ``partition`` has been read up to :attr:`frontier`."""
        return rows.rows_per_group(self.arrow, self.stream, self.labels, partition, self.frontier,
                                   rows.FRONTIER)

    def control_rows(self, partitions: list[int], idle: list[int], flush: bool) -> pa.RecordBatch:
        """One control row per key group (see the module docstring)."""
        return rows.rows_per_group(self.arrow, self.stream, self.labels, -1, None,
                                   rows.Control(partitions, idle, flush).to_json())
