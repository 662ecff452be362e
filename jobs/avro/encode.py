"""Avro binary bodies from columns, in bulk: the result topics' encoder.

Why by hand: fastavro (and Apache Avro) encode one record, a dict, per call — measured here the
largest cost of a bin or count result once the operators work on columns. The column writers
on PyPI (``polars.write_avro``, ``pyarrow``) write object-container files, whose blocks do not
say where one body ends. :class:`ColumnEncoder` writes each record's single body (behind the
framing header) field by field, each field one NumPy step over every record:

* ``int`` / ``long`` / ``enum`` — zig-zag varints, 1–10 bytes, built as a ``(n, 10)`` byte
  matrix and masked; ``int`` values outside 32 bits are refused (a bug in the caller);
* ``float`` / ``double`` / ``boolean`` — fixed width, little-endian views;
* ``string`` / ``bytes`` — a length varint, then the bytes from an Arrow array's data buffer
  (UTF-8 done by Arrow); ``fixed`` — the bytes, length checked;
* a union of ``null`` and one of those — the branch index, then the value where not null;
* a ``map`` given as a :class:`~ctiflow.operators.events.MapColumn` (every record the same keys) —
  one block of ``len(keys)`` entries, then the end marker.

A column is a NumPy array, a list, a :class:`~ctiflow.operators.events.MapColumn`, or one scalar for
every record. Schemas with other field types (arrays, nested records) are not bulk-encodable:
:attr:`ColumnEncoder.bulk` is False and the caller encodes those records one by one. The
output is the framed bodies as an Arrow ``binary`` array. Equal, byte for byte, to fastavro's
``schemaless_writer`` on the same records (``tests/test_avro_encode.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctiflow.jobs import rows
from ctiflow.jobs.avro.decode import Node, compile_schema
from ctiflow.operators.events import MapColumn, OutputBatch

__all__ = ["ColumnEncoder", "ResultEncoder"]

_INT32 = (-(2**31), 2**31 - 1)
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # 7-bit groups of a 64-bit value
_SCALAR = (str, bytes, int, float, bool, np.generic)


def _zigzag_varint(value: int) -> bytes:
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


class _Piece:
    """One field's bytes for every record: ``const`` (the same bytes each), ``fixed`` (an
    ``(n, w)`` uint8 matrix) or ``var`` (``lens`` per record and their concatenation ``flat``)."""

    __slots__ = ("const", "matrix", "lens", "flat")

    def __init__(self, const: bytes | None = None, matrix: np.ndarray | None = None,
                 lens: np.ndarray | None = None, flat: np.ndarray | None = None):
        self.const, self.matrix, self.lens, self.flat = const, matrix, lens, flat

    def lengths(self, n: int) -> np.ndarray | int:
        if self.const is not None:
            return len(self.const)
        if self.matrix is not None:
            return self.matrix.shape[1]
        return self.lens


def _varints(values: np.ndarray) -> _Piece:
    """Zig-zag varints of an int64 array (a fixed-width piece where all take as many bytes)."""
    v = values.astype(np.int64, copy=False)
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)
    width = max(1, (int(z.max(initial=0)).bit_length() + 6) // 7)
    groups = ((z[:, None] >> _SHIFTS[None, :width]) & np.uint64(0x7F)).astype(np.uint8)
    if width == 1:
        return _Piece(matrix=groups)
    lens = np.ones(len(z), np.int64)
    for k in range(1, width):
        lens += z >= np.uint64(1) << np.uint64(7 * k)
    cols = np.arange(width)
    groups |= (cols[None, :] < (lens[:, None] - 1)).view(np.uint8) << np.uint8(7)
    if lens.min(initial=0) == width:
        return _Piece(matrix=groups)
    return _Piece(lens=lens, flat=groups[cols[None, :] < lens[:, None]])


def _as_array(column: Any, n: int, dtype) -> np.ndarray:
    a = np.asarray(column, dtype=dtype)
    if a.shape != (n,):
        raise ValueError(f"a column of {a.shape} values for {n} records")
    return a


def _binary(column: Any, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, concatenated bytes) of a string or bytes column, via Arrow."""
    arr = column if isinstance(column, (pa.Array, pa.ChunkedArray)) else pa.array(
        column.tolist() if isinstance(column, np.ndarray) else column, pa.string() if kind == "string" else pa.binary())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise ValueError(f"a {kind} column holds nulls")
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset:arr.offset + len(arr) + 1]
    else:
        offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
    data = arr.buffers()[2]
    flat = np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    return np.diff(offsets), flat


class ColumnEncoder:
    """Framed Avro bodies of one record schema from columns (see the module docstring).
    ``header``: the framing prefix of every record (single-object or Confluent)."""

    def __init__(self, schema: Any, header: bytes = b""):
        self.root = compile_schema(schema)
        self.header = header
        if self.root.kind != "record":
            raise ValueError("ColumnEncoder encodes records")
        self.bulk = all(self._encodable(t) for _, t, _, _ in self.root.fields)

    @classmethod
    def _encodable(cls, t: Node) -> bool:
        if t.kind == "map":
            return t.items is not None and t.items.flat() and t.items.kind != "union"
        if t.kind == "union":
            return t.flat() or (len(t.branches) == 2 and any(b.kind == "null" for b in t.branches)
                                and all(b.kind == "null" or cls._encodable(b) for b in t.branches))
        return t.flat()

    def encode(self, columns: dict[str, Any], n: int) -> pa.BinaryArray:
        """The ``n`` records' framed bodies, in record order. ``columns`` holds every field of
        the schema by name (a missing field with a default takes it)."""
        if not self.bulk:
            raise ValueError("this schema has fields that are not bulk-encodable (see ColumnEncoder.bulk)")
        pieces = [_Piece(const=self.header)] if self.header else []
        for name, t, has_default, default in self.root.fields:
            if name in columns:
                column = columns[name]
            elif has_default:
                column = default
            else:
                raise ValueError(f"no column and no default for field {name!r}")
            pieces.extend(self._field(t, column, n))
        return _assemble(pieces, n)

    # -- fields -----------------------------------------------------------------------------
    def _field(self, t: Node, column: Any, n: int) -> list[_Piece]:
        if column is None or isinstance(column, _SCALAR):
            return [_Piece(const=self._scalar(t, column))]
        kind = t.kind
        if kind == "union":
            return self._union(t, column, n)
        if kind == "map":
            return self._map(t, column, n)
        if kind == "boolean":
            return [_Piece(matrix=_as_array(column, n, np.bool_).view(np.uint8)[:, None])]
        if kind in ("int", "long"):
            a = _as_array(column, n, np.int64)
            if kind == "int" and n and (int(a.min()) < _INT32[0] or int(a.max()) > _INT32[1]):
                raise ValueError(f"an int column holds values outside 32 bits ({int(a.min())}..{int(a.max())})")
            return [_varints(a)]
        if kind in ("float", "double"):
            a = np.ascontiguousarray(_as_array(column, n, "<f4" if kind == "float" else "<f8"))
            return [_Piece(matrix=a.view(np.uint8).reshape(n, a.itemsize))]
        if kind in ("string", "bytes"):
            lens, flat = _binary(column, kind)
            if len(lens) != n:
                raise ValueError(f"a column of {len(lens)} values for {n} records")
            return [_varints(lens), _Piece(lens=lens, flat=flat)]
        if kind == "enum":
            index = {s: i for i, s in enumerate(t.symbols)}
            return [_varints(np.fromiter((index[s] for s in column), np.int64, count=n))]
        if kind == "fixed":
            data = b"".join(column)
            if len(data) != n * t.size:
                raise ValueError(f"fixed {t.name} values are not all {t.size} bytes")
            return [_Piece(matrix=np.frombuffer(data, np.uint8).reshape(n, t.size))]
        raise ValueError(f"type {kind} is not bulk-encodable")

    def _scalar(self, t: Node, value: Any) -> bytes:
        """One value's bytes (a column that is the same for every record)."""
        if t.kind == "union":
            branch = next((i for i, b in enumerate(t.branches) if (b.kind == "null") == (value is None)), None)
            if branch is None:
                raise ValueError(f"no branch of the union for {value!r}")
            return _zigzag_varint(branch) + (b"" if value is None else self._scalar(t.branches[branch], value))
        if value is None:
            if t.kind == "null":
                return b""
            raise ValueError(f"null for a {t.kind} field")
        pieces = self._field(t, [value], 1) if not isinstance(value, dict) else self._field(
            t, MapColumn(tuple(value), np.array([[v] for v in value.values()])), 1)
        return bytes(_assemble(pieces, 1).to_pylist()[0])

    def _union(self, t: Node, column: Any, n: int) -> list[_Piece]:
        null = next(i for i, b in enumerate(t.branches) if b.kind == "null")
        other = 1 - null
        if isinstance(column, MapColumn):  # a map in every record
            return [_Piece(const=_zigzag_varint(other)), *self._field(t.branches[other], column, n)]
        if isinstance(column, (pa.Array, pa.ChunkedArray)):
            column = column.to_pylist()
        values = column if isinstance(column, (list, np.ndarray)) else list(column)
        is_null = np.fromiter((v is None for v in values), np.bool_, count=n)
        if not is_null.any():
            return [_Piece(const=_zigzag_varint(other)), *self._field(t.branches[other], column, n)]
        if is_null.all():
            return [_Piece(const=_zigzag_varint(null))]
        index = _varints(np.where(is_null, null, other))
        present = [v for v, miss in zip(values, is_null.tolist()) if not miss]
        inner = self._field(t.branches[other], np.array(present) if isinstance(values, np.ndarray) and
                            values.dtype != object else present, len(present))
        sub = _assemble_raw(inner, len(present))
        lens = np.zeros(n, np.int64)
        lens[~is_null] = sub[0]
        return [index, _Piece(lens=lens, flat=sub[1])]

    def _map(self, t: Node, column: Any, n: int) -> list[_Piece]:
        if not isinstance(column, MapColumn):
            raise ValueError("a map field is bulk-encoded from a MapColumn (the same keys in every record)")
        names = column.names
        if not names:
            return [_Piece(const=b"\x00")]
        values = np.asarray(column.values)
        pieces = [_Piece(const=_zigzag_varint(len(names)))]
        for j, name in enumerate(names):
            key = name.encode()
            pieces.append(_Piece(const=_zigzag_varint(len(key)) + key))
            pieces.extend(self._field(t.items, values[j], n))
        pieces.append(_Piece(const=b"\x00"))
        return pieces


def _merge_fixed(pieces: list[_Piece], n: int) -> list[_Piece]:
    """Runs of const and fixed pieces as one fixed matrix (fewer scatters)."""
    out: list[_Piece] = []
    run: list[np.ndarray] = []

    def close():
        if run:
            out.append(_Piece(matrix=run[0] if len(run) == 1 else np.hstack(run)))
            run.clear()

    for p in pieces:
        if p.const is not None:
            if p.const:
                run.append(np.broadcast_to(np.frombuffer(p.const, np.uint8), (n, len(p.const))))
        elif p.matrix is not None:
            run.append(p.matrix)
        else:
            close()
            out.append(p)
    close()
    return out


def _assemble_raw(pieces: list[_Piece], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(length per record, the records' bytes concatenated)."""
    pieces = _merge_fixed(pieces, n)
    total = np.zeros(n, np.int64)
    for p in pieces:
        total += p.lengths(n)
    ends = np.cumsum(total)
    at = ends - total  # where each record's next piece goes
    out = np.empty(int(ends[-1]) if n else 0, np.uint8)
    for p in pieces:
        if p.matrix is not None:
            w = p.matrix.shape[1]
            out[(at[:, None] + np.arange(w)[None, :]).reshape(-1)] = p.matrix.reshape(-1)
            at = at + w
        else:
            lens = p.lens
            if len(p.flat):
                src = np.cumsum(lens) - lens
                out[np.repeat(at - src, lens) + np.arange(len(p.flat))] = p.flat
            at = at + lens
    return total, out


def _assemble(pieces: list[_Piece], n: int) -> pa.BinaryArray:
    lens, data = _assemble_raw(pieces, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                      pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


class ResultEncoder:
    """A key group's results → Avro-encoded packs per topic (:class:`ctiflow.jobs.rows.ResultPacks`),
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
            import json

            encoder = self._bulk[topic] = ColumnEncoder(json.loads(self.serializers[topic].schema.text),
                                                        self.headers[topic])
        return encoder

    def _value(self, topic: str, o) -> bytes:
        """An :class:`Output`'s bytes: as they came if they carry the topic's schema, else encoded."""
        raw = o.encoded
        return raw if raw is not None and raw.startswith(self.headers[topic]) else self.serializers[topic](o.record)

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

    def packs(self, out: list, dead: list, counters) -> rows.ResultPacks:
        """``counters.late_records`` counts the records written to the late topic."""
        enc, late = self.serializers, self.late_topic
        packs = rows.ResultPacks()
        for topic, o, k in out:
            if type(o) is OutputBatch:
                if topic == late:
                    counters.late_records += o.n
                keys = o.keys if o.keys is not None else o.columns.get("key")
                if o.raw is not None:
                    values = self._as_they_came(topic, o.raw)
                    if values is not None:
                        packs.add_batch(topic, rows.result_batch(keys, values, o.role))
                        continue
                else:
                    encoder = self.bulk(topic)
                    if encoder.bulk:
                        packs.add_batch(topic, rows.result_batch(keys, encoder.encode(o.columns, o.n), o.role))
                        continue
                for one in o.outputs():  # record by record, as the Output items below
                    key = one.key if one.key is not None else one.record.get("key")
                    packs.add(topic, None if key is None else str(key).encode(), self._value(topic, one), o.role)
                continue
            if topic == late:
                counters.late_records += 1
            packs.add(topic, None if k is None else str(k).encode(), self._value(topic, o), o.role)
        dlq = self.dead_letter_topic
        for rec in dead:
            packs.add(dlq, rec["key"], enc[dlq](rec), "dead_letter")
        return packs
