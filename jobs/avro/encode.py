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
every record. Other fields (arrays, nested records, unions of several types, a map given as a
list of dicts) are written value by value into their own piece by :func:`record_writer` — the
one per-record Avro writer, also what :class:`~ctiflow.jobs.avro.serde.AvroSerializer` encodes a
single record with. The output is the framed bodies as an Arrow ``binary`` array. Equal, byte
for byte, to fastavro's ``schemaless_writer`` on the same records, union branches included
(``tests/test_avro_encode.py``: fastavro is the oracle, not a dependency of the path).
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ctiflow.jobs.avro.decode import Node, compile_schema, default_value
from ctiflow.operators.errors import DecodeError
from ctiflow.operators.events import MapColumn

__all__ = ["AvroWriteError", "ColumnEncoder", "record_writer"]

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
        column.tolist() if isinstance(column, np.ndarray) else column,
        pa.string() if kind == "string" else pa.binary())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise ValueError(f"a {kind} column holds nulls")
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset:arr.offset + len(arr) + 1]
    else:
        offsets = (np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:arr.offset + len(arr) + 1]
                   .astype(np.int64))
    data = arr.buffers()[2]
    flat = (np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]] if data is not None
            else np.zeros(0, np.uint8))
    return np.diff(offsets), flat


class ColumnEncoder:
    """Framed Avro bodies of one record schema from columns (see the module docstring).
    ``header``: the framing prefix of every record (single-object or Confluent)."""

    def __init__(self, schema: Any, header: bytes = b""):
        self.root = compile_schema(schema)
        self.header = header
        if self.root.kind != "record":
            raise ValueError("ColumnEncoder encodes records")
        self._writers: dict[int, Writer] = {}

    @classmethod
    def _columnar(cls, t: Node) -> bool:
        """``t`` is encoded column-wise (else value by value, :func:`record_writer`)."""
        if t.kind == "map":
            return t.items is not None and t.items.flat() and t.items.kind != "union"
        if t.kind == "union":
            return t.flat() or (len(t.branches) == 2 and any(b.kind == "null" for b in t.branches)
                                and all(b.kind == "null" or cls._columnar(b) for b in t.branches))
        return t.flat()

    def encode(self, columns: dict[str, Any], n: int) -> pa.BinaryArray:
        """The ``n`` records' framed bodies, in record order. ``columns`` holds every field of
        the schema by name (a missing field with a default takes it)."""
        pieces = [_Piece(const=self.header)] if self.header else []
        for name, t, has_default, default in self.root.fields:
            if name in columns:
                column = columns[name]
            elif has_default:
                column = _default_or_refuse(name, t, default)()
            else:
                raise ValueError(f"no column and no default for field {name!r}")
            try:
                pieces.extend(self._field(t, column, n))
            except AvroWriteError as exc:
                raise exc.at(name) from None
        return _assemble(pieces, n)

    # -- fields -----------------------------------------------------------------------------
    def _field(self, t: Node, column: Any, n: int) -> list[_Piece]:
        if column is None or isinstance(column, (*_SCALAR, dict)):
            return [_Piece(const=self._one(t, column))]
        if not self._columnar(t) or (t.kind == "map" and not isinstance(column, MapColumn)):
            return self._each(t, column, n)
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
                raise ValueError("an int column holds values outside 32 bits "
                                 f"({int(a.min())}..{int(a.max())})")
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
        raise AssertionError(f"type {kind} is written value by value (_columnar)")

    def _writer(self, t: Node) -> Writer:
        got = self._writers.get(id(t))
        if got is None:
            got = self._writers[id(t)] = record_writer(t)
        return got

    def _one(self, t: Node, value: Any) -> bytes:
        """One value's bytes (a column that is the same for every record)."""
        out = bytearray()
        self._writer(t)(value, out)
        return bytes(out)

    def _each(self, t: Node, column: Any, n: int) -> list[_Piece]:
        """A field that is not encoded column-wise (arrays, records, unions of several types):
        value by value with :func:`record_writer`, into one variable-width piece."""
        if isinstance(column, (pa.Array, pa.ChunkedArray)):
            column = column.to_pylist()
        elif isinstance(column, MapColumn):
            column = [dict(zip(column.names, row)) for row in np.asarray(column.values).T.tolist()]
        elif isinstance(column, np.ndarray):
            column = column.tolist()
        write, out = self._writer(t), bytearray()
        if len(column) != n:
            raise ValueError(f"a column of {len(column)} values for {n} records")
        lens = np.empty(n, np.int64)
        at = 0
        for i, value in enumerate(column):
            try:
                write(value, out)
            except AvroWriteError as exc:
                raise AvroWriteError(f"{exc.message} (record {i} of {n})", exc.path) from None
            lens[i], at = len(out) - at, len(out)
        return [_Piece(lens=lens, flat=np.frombuffer(bytes(out), np.uint8))]

    def _union(self, t: Node, column: Any, n: int) -> list[_Piece]:
        null = next(i for i, b in enumerate(t.branches) if b.kind == "null")
        other = 1 - null
        if isinstance(column, MapColumn):  # a map in every record
            return [_Piece(const=_zigzag_varint(other)), *self._field(t.branches[other], column, n)]
        if isinstance(column, (pa.Array, pa.ChunkedArray)) and t.branches[other].flat():
            # a flat value's nulls from the validity bitmap, no Python step a value
            if not column.null_count:
                return [_Piece(const=_zigzag_varint(other)), *self._field(t.branches[other], column, n)]
            if column.null_count == n:
                return [_Piece(const=_zigzag_varint(null))]
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


# -- per record ------------------------------------------------------------------------------
Writer = Callable[[Any, bytearray], None]
_LONG = (-(2**63), 2**63 - 1)
_MISSING = object()
_pack_float, _pack_double = struct.Struct("<f").pack, struct.Struct("<d").pack


class AvroWriteError(ValueError):
    """A value does not fit the schema; ``path`` names where (``events[2].amount``)."""

    def __init__(self, message: str, path: tuple = ()):
        super().__init__(message)
        self.message, self.path = message, path

    def at(self, step: str | int) -> "AvroWriteError":
        return AvroWriteError(self.message, (step, *self.path))

    def __str__(self) -> str:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path).lstrip(".")
        return f"{where}: {self.message}" if where else self.message


def _mismatch(node: Node, value: Any) -> AvroWriteError:
    return AvroWriteError(f"expected {node.name or node.kind}, got {type(value).__name__} {value!r:.80}")


def _varint_into(out: bytearray, value: int) -> None:
    z = (value << 1) ^ (value >> 63)
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def record_writer(node: Node) -> Writer:
    """``write(value, out)``: ``value``'s Avro binary encoding appended to ``out`` (a
    ``bytearray``); an :class:`AvroWriteError` naming the field when ``value`` does not fit.

    The one per-record writer (the bulk :class:`ColumnEncoder` uses it for the fields it does not
    encode column-wise). Which values fit and which union branch a value takes are fastavro's
    rules (its ``validate`` and ``write_union``; fastavro is the test oracle,
    ``tests/test_avro_encode.py``): a branch is the first that accepts the value, except that a
    ``float`` branch gives way to a later ``double`` and among record branches the one sharing the
    most fields with the value wins. A missing field takes its default, or null in a union with
    ``null``; an ``int`` beyond 32 bits or a ``long`` beyond 64 is refused, never wrapped."""
    return _writer(node, {})


def _writer(node: Node, cache: dict) -> Writer:
    got = cache.get(id(node))
    if got is not None:
        return got
    if node.kind == "record":  # (named, maybe recursive: the cache holds a forward reference)
        slot: list[Writer] = []
        cache[id(node)] = lambda value, out: slot[0](value, out)
        slot.append(_record_writer(node, cache))
        cache[id(node)] = slot[0]
        return slot[0]
    got = cache[id(node)] = _WRITERS[node.kind](node, cache)
    return got


def _null_writer(node: Node, cache: dict) -> Writer:
    def write_null(value, out):
        if value is not None:
            raise _mismatch(node, value)
    return write_null


def _boolean_writer(node: Node, cache: dict) -> Writer:
    def write_boolean(value, out):
        if value is True or value is False or isinstance(value, np.bool_):
            out.append(1 if value else 0)
        else:
            raise _mismatch(node, value)
    return write_boolean


def _integer_writer(node: Node, cache: dict) -> Writer:
    low, high = _INT32 if node.kind == "int" else _LONG

    def write_integer(value, out):
        if type(value) is not int:
            if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
                raise _mismatch(node, value)
            value = int(value)
        if not low <= value <= high:
            raise AvroWriteError(f"{value} is outside {node.kind}'s {32 if node.kind == 'int' else 64} bits")
        _varint_into(out, value)
    return write_integer


def _real_writer(node: Node, cache: dict) -> Writer:
    pack = _pack_float if node.kind == "float" else _pack_double

    def write_real(value, out):
        if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
            raise _mismatch(node, value)
        try:
            out += pack(value)
        except OverflowError:  # beyond float's range: Java's (float) cast gives ±Infinity
            out += pack(math.copysign(math.inf, value))
    return write_real


def _binary_writer(node: Node, cache: dict) -> Writer:
    string = node.kind == "string"

    def write_binary(value, out):
        if string:
            if not isinstance(value, str):
                raise _mismatch(node, value)
            try:
                value = value.encode()
            except UnicodeEncodeError as exc:
                raise AvroWriteError(f"string is not encodable as UTF-8: {exc.reason}") from None
        elif not isinstance(value, (bytes, bytearray)):
            raise _mismatch(node, value)
        _varint_into(out, len(value))
        out += value
    return write_binary


def _fixed_writer(node: Node, cache: dict) -> Writer:
    def write_fixed(value, out):
        if not isinstance(value, bytes) or len(value) != node.size:
            raise _mismatch(node, value)
        out += value
    return write_fixed


def _enum_writer(node: Node, cache: dict) -> Writer:
    index = {s: i for i, s in enumerate(node.symbols)}

    def write_enum(value, out):
        i = index.get(value) if isinstance(value, str) else None
        if i is None:
            raise AvroWriteError(f"{value!r:.80} is not a symbol of enum {node.name} "
                                 f"({', '.join(node.symbols)})")
        _varint_into(out, i)
    return write_enum


def _blocks_writer(node: Node, cache: dict) -> Writer:
    item = _writer(node.items, cache)
    is_map = node.kind == "map"

    def write_blocks(value, out):
        if is_map:
            if not isinstance(value, Mapping):
                raise _mismatch(node, value)
        elif (isinstance(value, (str, bytes, bytearray, Mapping))
              or not isinstance(value, (Sequence, np.ndarray))):
            raise _mismatch(node, value)
        if len(value):
            _varint_into(out, len(value))
            for step, v in (value.items() if is_map else enumerate(value)):
                try:
                    if is_map:
                        if not isinstance(step, str):
                            raise AvroWriteError(f"a map key must be a string, got {step!r:.80}")
                        key = step.encode()
                        _varint_into(out, len(key))
                        out += key
                    item(v, out)
                except AvroWriteError as exc:
                    raise exc.at(step) from None
        out.append(0)
    return write_blocks


def _record_writer(node: Node, cache: dict) -> Writer:
    fields = [(name, _writer(t, cache), _absent(name, t, has, default))
              for name, t, has, default in node.fields]

    def write_record(value, out):
        if not isinstance(value, Mapping):
            raise _mismatch(node, value)
        name = None
        try:
            for name, write, absent in fields:
                v = value.get(name, _MISSING)
                write(absent() if v is _MISSING else v, out)
        except AvroWriteError as exc:
            raise exc.at(name) from None
    return write_record


def _absent(name: str, t: Node, has_default: bool, default: Any) -> Callable[[], Any]:
    """What a record without field ``name`` writes: its default (read from its JSON form by the
    field's type, :func:`~ctiflow.jobs.avro.decode.default_value`: bytes and fixed from code
    points, a record default's left-out fields from their own defaults), else null where the type
    is a union with ``null``, else an error."""
    if has_default:
        return _default_or_refuse(name, t, default)
    if t.kind == "union" and any(b.kind == "null" for b in t.branches):
        return lambda: None

    def missing():
        raise AvroWriteError("no value and no default")
    return missing


def _default_or_refuse(name: str, t: Node, default: Any) -> Callable[[], Any]:
    """The default's value, or (a default that is no value of its type) a function raising
    :class:`AvroWriteError` — refused when a record needs it, not when the schema compiles."""
    try:
        value = default_value(t, default, f"field {name!r}")
    except DecodeError as exc:
        message = str(exc)

        def refuse():
            raise AvroWriteError(message)
        return refuse
    return lambda: value


def _union_writer(node: Node, cache: dict) -> Writer:
    writers = [_writer(b, cache) for b in node.branches]
    accepts = [_accepter(b, {}) for b in node.branches]
    kinds = [b.kind for b in node.branches]
    null = kinds.index("null") if "null" in kinds else None
    single = len(kinds) == 2 and null is not None  # null or the other: no search needed

    def branch(value) -> int:
        if value is None and null is not None:
            return null
        if single:
            return 1 - null
        best, most, after_float = -1, -1, False
        for i, (kind, accept) in enumerate(zip(kinds, accepts)):
            if after_float:  # fastavro prefers a later double to a float
                if kind == "double":
                    return i
                continue
            if accept(value):
                if kind == "record":
                    shared = len({f for f, _, _, _ in node.branches[i].fields} & set(value))
                    if shared > most:
                        best, most = i, shared
                elif kind == "float":
                    best, after_float = i, True
                else:
                    return i
        if best < 0:
            raise AvroWriteError(f"{type(value).__name__} {value!r:.80} fits no branch of "
                                 f"[{', '.join(b.name or b.kind for b in node.branches)}]")
        return best

    def write_union(value, out):
        i = branch(value)
        _varint_into(out, i)
        writers[i](value, out)
    return write_union


def _accepter(node: Node, cache: dict) -> Callable[[Any], bool]:
    """Whether ``value`` fits ``node`` (fastavro's ``validate``: what picks a union's branch)."""
    if id(node) in cache:
        return lambda value: cache[id(node)](value)
    kind = node.kind
    if kind == "record":
        cache[id(node)] = None
        # a missing field counts as its default, else as null (fastavro: ``datum.get(name, default)``)
        fields = [(name, _accepter(t, cache), default if has else None)
                  for name, t, has, default in node.fields]
        cache[id(node)] = got = lambda value: (
            isinstance(value, Mapping) and value.get("-type", node.name) == node.name
            and all(accept(value.get(name, default)) for name, accept, default in fields))
        return got
    if kind in ("array", "map"):
        item = _accepter(node.items, cache)
        if kind == "map":
            return lambda value: isinstance(value, Mapping) and all(
                isinstance(k, str) and item(v) for k, v in value.items())
        return lambda value: isinstance(value, (Sequence, np.ndarray)) and not isinstance(
            value, (str, bytes, bytearray)) and all(map(item, value))
    if kind == "union":
        branches = [_accepter(b, cache) for b in node.branches]
        return lambda value: any(accept(value) for accept in branches)
    if kind in ("int", "long"):
        low, high = _INT32 if kind == "int" else _LONG
        return lambda value: isinstance(value, numbers.Integral) and not isinstance(
            value, (bool, np.bool_)) and low <= value <= high
    return _SIMPLE_ACCEPTS[kind] if kind in _SIMPLE_ACCEPTS else (
        (lambda value: isinstance(value, bytes) and len(value) == node.size) if kind == "fixed"
        else (lambda value: value in node.symbols))  # enum


_SIMPLE_ACCEPTS: dict[str, Callable[[Any], bool]] = {
    "null": lambda value: value is None,
    "boolean": lambda value: isinstance(value, (bool, np.bool_)),
    "string": lambda value: isinstance(value, str),
    "bytes": lambda value: isinstance(value, (bytes, bytearray)),
    "float": lambda value: isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)),
    "double": lambda value: isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)),
}

_WRITERS: dict[str, Callable[[Node, dict], Writer]] = {
    "null": _null_writer, "boolean": _boolean_writer, "int": _integer_writer, "long": _integer_writer,
    "float": _real_writer, "double": _real_writer, "bytes": _binary_writer, "string": _binary_writer,
    "fixed": _fixed_writer, "enum": _enum_writer, "array": _blocks_writer, "map": _blocks_writer,
    "union": _union_writer,
}
