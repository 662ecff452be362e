"""Avro binary bodies → Python records and Arrow columns, strictly, per record or in bulk.

Why by hand: the decoders on PyPI accept hostile bytes as records. fastavro (1.13) picks a
branch from the end for a *negative* union index, returns 2^40 for an ``int`` varint and reads
``long`` varints past 10 bytes; ``polars.read_avro`` is fast but accepts the same union index,
truncates an over-long ``int`` to 0 and reads a boolean byte 5 as a value (measured). Apache
Avro's Java decoder refuses those; a record ctiflow accepts must be one it would accept too. So:

* :func:`compile_schema` turns an ``.avsc`` (JSON) into :class:`Node` s — the description,
  once; named types resolve by full or short name;
* :func:`record_reader` compiles a writer schema (and optionally a reader schema, resolved as
  the Avro spec says: fields by name with defaults — read by the field's type, bytes from code
  points and a record's left-out fields from their own (:func:`default_value`) — promotions
  int→long→float→double and string↔bytes, unions either side, enum symbols) into one function
  ``read(buf, pos) → (value, pos)`` for any schema; every count and length is bounded by the
  bytes left;
* :class:`ColumnDecoder` decodes many bodies of one writer schema at once, field by field, to
  Arrow arrays in the reader schema's order and types: a flat field (a primitive, enum, fixed,
  or a union of ``null`` with one of those) in one NumPy step over every record, any other
  (records, arrays, maps, unions of several types) value by value with the field's per-record
  reader (as JSON text in its column); a record that fails gets its own reason and the others
  go on. It is how a job decodes; the per-record reader alone serves single messages (the
  CLI's consume, tests).

Both refuse, with a reason: a union index outside ``[0, branches)``; an ``int`` varint longer
than 5 bytes or above 32 bits; a ``long`` varint longer than 10 bytes or above 64 bits; a
boolean byte other than 0 or 1; a negative or too long length; invalid UTF-8 in a string; an
enum index outside its symbols; a body with bytes left over.
"""

from __future__ import annotations

import copy
import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ctiflow.operators.errors import DecodeError

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
#: A zero-size array or map item (``null``, an empty record) costs no bytes, so the bytes left
#: cannot bound how many there are: at most this many in one record, over all its arrays and
#: maps (:func:`read_body` counts; without the total, a block per 3 bytes multiplied them).
MAX_ZERO_SIZE_ITEMS = 1 << 16
_zero_size_items = threading.local()  # per record being read: how many zero-size items so far


@dataclass(eq=False)
class Node:
    """One Avro type. ``kind``: a primitive, ``record``, ``enum``, ``fixed``, ``array``,
    ``map`` or ``union``."""

    kind: str
    name: str = ""  # full name of a named type
    fields: list[tuple[str, "Node", bool, Any]] = field(default_factory=list)  # (name, type, has default,
                                                                              # default)
    items: "Node | None" = None  # array items, map values
    branches: list["Node"] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    enum_default: str | None = None
    size: int = 0  # fixed
    aliases: tuple[str, ...] = ()  # a named type's aliases, full names (a reader matches a writer by
                                   # them too)
    field_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # reader field → its aliases

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    def min_size(self, seen: frozenset = frozenset()) -> int:
        """The fewest bytes a value of this type takes (bounds counts by the bytes left)."""
        if self.kind in ("null",):
            return 0
        if self.kind in ("boolean", "int", "long", "bytes", "string", "enum", "array", "map", "union"):
            return 1
        if self.kind == "float":
            return 4
        if self.kind == "double":
            return 8
        if self.kind == "fixed":
            return self.size
        if id(self) in seen:  # a recursive record takes at least what its other fields take
            return 0
        return sum(f.min_size(seen | {id(self)}) for _, f, _, _ in self.fields)

    def flat(self) -> bool:
        """A type :class:`ColumnDecoder` decodes in bulk (as a record field)."""
        if self.kind == "union":
            others = [b for b in self.branches if b.kind != "null"]
            return (len(self.branches) == 2 and len(others) == 1 and others[0].kind != "null"
                    and others[0].flat())
        return self.kind in PRIMITIVES and self.kind != "null" or self.kind in ("enum", "fixed")


def compile_schema(schema: Any) -> Node:
    """An Avro schema (parsed JSON) → its :class:`Node` tree (named types shared, so recursion works)."""
    names: dict[str, Node] = {}

    def full(name: str, namespace: str) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def walk(s: Any, namespace: str) -> Node:
        if isinstance(s, str):
            if s in PRIMITIVES:
                return Node(s)
            for candidate in (full(s, namespace), s):
                if candidate in names:
                    return names[candidate]
            raise DecodeError(f"schema names an unknown type {s!r}")
        if isinstance(s, list):
            return Node("union", branches=[walk(b, namespace) for b in s])
        kind = s["type"]
        if kind in PRIMITIVES or isinstance(kind, (list, dict)):
            return walk(kind, namespace)  # {"type": "long", "logicalType": ...}: the underlying type
        if kind in ("record", "error", "enum", "fixed"):
            ns = s.get("namespace", namespace if "." not in s["name"] else s["name"].rsplit(".", 1)[0])
            node = Node("record" if kind == "error" else kind, name=full(s["name"], ns),
                        aliases=tuple(full(a, ns) for a in s.get("aliases", ())))
            names[node.name] = node
            if kind == "enum":
                node.symbols = list(s["symbols"])
                node.enum_default = s.get("default")
            elif kind == "fixed":
                node.size = int(s["size"])
            else:
                inner = node.name.rsplit(".", 1)[0] if "." in node.name else ""
                node.fields = [(f["name"], walk(f["type"], inner), "default" in f, f.get("default"))
                               for f in s["fields"]]
                node.field_aliases = {f["name"]: tuple(f["aliases"]) for f in s["fields"] if f.get("aliases")}
            return node
        if kind == "array":
            return Node("array", items=walk(s["items"], namespace))
        if kind == "map":
            return Node("map", items=walk(s["values"], namespace))
        raise DecodeError(f"schema has an unknown type {kind!r}")

    return walk(schema, "")


# -- per record ------------------------------------------------------------------------------
Reader = Callable[[bytes, int], tuple[Any, int]]


def _varint(buf: bytes, pos: int, max_bytes: int, what: str) -> tuple[int, int]:
    """A zig-zag varint of at most ``max_bytes`` bytes (5 for ``int``, 10 for ``long``)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result, shift, n = b & 0x7F, 7, 1
    while True:
        b = buf[pos + n]
        result |= (b & 0x7F) << shift
        n += 1
        if b < 0x80:
            break
        if n >= max_bytes:
            raise DecodeError(f"{what} varint longer than {max_bytes} bytes at byte {pos}")
        shift += 7
    if result >> (max_bytes * 7 - (3 if max_bytes == 5 else 6)):  # 32 or 64 bits
        raise DecodeError(f"{what} varint exceeds {32 if max_bytes == 5 else 64} bits at byte {pos}")
    return (result >> 1) ^ -(result & 1), pos + n


def _read_long(buf, pos):
    return _varint(buf, pos, 10, "long")


def _read_int(buf, pos):
    return _varint(buf, pos, 5, "int")


def _read_length(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    n, pos = _varint(buf, pos, 10, "long")
    if n < 0 or pos + n > len(buf):
        raise DecodeError(f"{what} length {n} at byte {pos} (only {len(buf) - pos} bytes left)")
    return n, pos


def _primitive(kind: str) -> Reader:
    if kind == "null":
        return lambda buf, pos: (None, pos)
    if kind == "boolean":
        def read(buf, pos):
            b = buf[pos]
            if b > 1:
                raise DecodeError(f"boolean byte {b} at byte {pos} (must be 0 or 1)")
            return b == 1, pos + 1
        return read
    if kind == "int":
        return _read_int
    if kind == "long":
        return _read_long
    if kind in ("float", "double"):
        fmt, n = ("<f", 4) if kind == "float" else ("<d", 8)
        unpack = struct.Struct(fmt).unpack_from

        def read(buf, pos):
            if pos + n > len(buf):
                raise DecodeError(f"{kind} at byte {pos} needs {n} bytes")
            return unpack(buf, pos)[0], pos + n
        return read
    if kind == "bytes":
        def read(buf, pos):
            n, pos = _read_length(buf, pos, "bytes")
            return bytes(buf[pos:pos + n]), pos + n
        return read

    def read_string(buf, pos):
        n, pos = _read_length(buf, pos, "string")
        try:
            return bytes(buf[pos:pos + n]).decode("utf-8"), pos + n
        except UnicodeDecodeError as exc:
            raise DecodeError(f"string at byte {pos} is not UTF-8: {exc.reason}") from None
    return read_string


_PROMOTIONS = {"int": ("long", "float", "double"), "long": ("float", "double"), "float": ("double",),
               "string": ("bytes",), "bytes": ("string",)}


def _matches(writer: Node, reader: Node) -> bool:
    """Whether ``writer`` resolves to ``reader`` (the spec's "match", promotions included)."""
    if writer.kind == reader.kind:
        return writer.kind not in ("record", "enum", "fixed") or writer.short_name == reader.short_name or \
            writer.name in reader.aliases or \
            writer.short_name in {a.rsplit(".", 1)[-1] for a in reader.aliases}
    return reader.kind in _PROMOTIONS.get(writer.kind, ())


def record_reader(writer: Node, reader: Node | None = None) -> Reader:
    """One function reading a value written with ``writer`` as ``reader`` (default: as written)."""
    return _compile(writer, reader or writer, {})


def _compile(w: Node, r: Node, cache: dict) -> Reader:
    slot = (id(w), id(r))
    if slot in cache:
        return cache[slot]
    cell: list[Reader] = []  # types may recur: a forwarding entry while this one compiles
    cache[slot] = lambda buf, pos: cell[0](buf, pos)
    got = _compile_new(w, r, cache)
    cell.append(got)
    cache[slot] = got
    return got


def _compile_new(w: Node, r: Node, cache: dict) -> Reader:
    if w.kind == "union":
        return _union(w, r, cache)
    if r.kind == "union":  # writer is not a union: the first reader branch it matches, exact first
        for exact in (True, False):
            for b in r.branches:
                if _matches(w, b) and (b.kind == w.kind or not exact):
                    return _compile(w, b, cache)
        raise DecodeError(f"writer type {w.name or w.kind} matches no branch of the reader's union")
    if not _matches(w, r):
        raise DecodeError(f"writer type {w.name or w.kind} does not resolve to reader type "
                          f"{r.name or r.kind}")
    if w.kind in PRIMITIVES:
        return _promoted(w.kind, r.kind)
    compile_kind = {"fixed": _fixed, "enum": _enum, "array": _blocks, "map": _blocks,
                    "record": _record}[w.kind]
    return compile_kind(w, r, cache)


def _union(w: Node, r: Node, cache: dict) -> Reader:
    branches = [_compile(b, b, cache) if r is w else _resolve_branch(b, r, cache) for b in w.branches]
    count = len(branches)

    def read_union(buf, pos):
        i, pos = _read_long(buf, pos)
        if not 0 <= i < count:
            raise DecodeError(f"union branch index {i} at byte {pos - 1} (the union has {count} branches)")
        return branches[i](buf, pos)
    return read_union


def _promoted(written: str, read_as: str) -> Reader:
    """A primitive as written, promoted as the spec allows (int→long→float→double, string↔bytes)."""
    read = _primitive(written)
    if written == read_as:
        return read
    if read_as in ("float", "double"):
        def promote(buf, pos):
            value, pos = read(buf, pos)
            return float(value), pos
        return promote
    if read_as == "bytes":
        def to_bytes(buf, pos):
            value, pos = read(buf, pos)
            return value.encode("utf-8"), pos
        return to_bytes
    if read_as == "string":
        return _primitive("string")  # bytes → string: the same bytes, checked as UTF-8
    return read  # int → long


def _fixed(w: Node, r: Node, cache: dict) -> Reader:
    if w.size != r.size:
        raise DecodeError(f"fixed {w.name} has size {w.size}, the reader's {r.size}")
    n = w.size

    def read_fixed(buf, pos):
        if pos + n > len(buf):
            raise DecodeError(f"fixed at byte {pos} needs {n} bytes")
        return bytes(buf[pos:pos + n]), pos + n
    return read_fixed


def _enum(w: Node, r: Node, cache: dict) -> Reader:
    symbols, known = w.symbols, set(r.symbols)
    default = r.enum_default

    def read_enum(buf, pos):
        i, pos = _read_long(buf, pos)
        if not 0 <= i < len(symbols):
            raise DecodeError(f"enum index {i} at byte {pos - 1} ({len(symbols)} symbols)")
        s = symbols[i]
        if s not in known:
            if default is None:
                raise DecodeError(f"enum symbol {s!r} is not in the reader's {w.short_name}")
            s = default
        return s, pos
    return read_enum


def _blocks(w: Node, r: Node, cache: dict) -> Reader:
    """An array or a map: blocks of items, each count bounded by the bytes left (zero-size items
    by :data:`MAX_ZERO_SIZE_ITEMS` per record)."""
    item = _compile(w.items, r.items, cache)
    zero_size = w.items.min_size() == 0
    is_map = w.kind == "map"

    def read_blocks(buf, pos):
        out: Any = {} if is_map else []
        while True:
            count, pos = _read_long(buf, pos)
            if count == 0:
                return out, pos
            if count < 0:
                count = -count
                _, pos = _read_long(buf, pos)  # the block's size in bytes (not needed to read it)
            left = len(buf) - pos
            if zero_size:
                _zero_size_items.n = seen = getattr(_zero_size_items, "n", 0) + count
                if seen > MAX_ZERO_SIZE_ITEMS:
                    raise DecodeError(f"{w.kind} items that take no bytes: {seen} in one record by byte "
                                      f"{pos}, more than {MAX_ZERO_SIZE_ITEMS}")
            elif count > left:
                raise DecodeError(f"{w.kind} block of {count} items at byte {pos} (only {left} bytes left)")
            for _ in range(count):
                if is_map:
                    n, pos = _read_length(buf, pos, "map key")
                    try:
                        key = bytes(buf[pos:pos + n]).decode("utf-8")
                    except UnicodeDecodeError:
                        raise DecodeError(f"map key at byte {pos} is not UTF-8") from None
                    out[key], pos = item(buf, pos + n)
                else:
                    value, pos = item(buf, pos)
                    out.append(value)
    return read_blocks


def _record(w: Node, r: Node, cache: dict) -> Reader:
    """Writer fields in writer order (those the reader lacks are read and dropped); a reader field
    takes the writer field of its name, else one named by its aliases (a renamed field)."""
    r_fields = {name: node for name, node, _, _ in r.fields}
    as_read = {written: name for name, written in sources(w, r).items()}  # writer field → reader field
    plan = [(as_read.get(name, name), _compile(node, r_fields[as_read[name]] if name in as_read and r is not w
                                                else node, cache), name in as_read)
            for name, node, _, _ in w.fields]
    written = set(as_read.values())
    defaults = []
    for name, node, has, default in r.fields:
        if name not in written:
            if not has:
                raise DecodeError(f"reader field {name!r} of {r.short_name} is not written and has no "
                                  "default")
            defaults.append((name, default_value(node, default, f"reader field {name!r} of {r.short_name}")))
    order = [name for name, _, _, _ in r.fields]
    in_order = [name for name, _, _, _ in w.fields] == order

    def read_record(buf, pos):
        rec = {}
        for name, read, kept in plan:
            value, pos = read(buf, pos)
            if kept:
                rec[name] = value
        for name, default in defaults:
            rec[name] = _fresh(default)
        return (rec if in_order else {n: rec[n] for n in order}), pos
    return read_record


def sources(w: Node, r: Node) -> dict[str, str]:
    """Reader field → the writer field it reads (the spec): the one of its name, else one its
    aliases name (a renamed field); reader fields written by neither are absent."""
    w_names = {name for name, _, _, _ in w.fields}
    r_names = {name for name, _, _, _ in r.fields}
    out = {name: name for name in r_names if name in w_names}
    for name, aliases in r.field_aliases.items():
        if name not in w_names:
            written = next((a for a in aliases if a in w_names and a not in r_names), None)
            if written is not None:
                out[name] = written
    return out


def _json(value: Any) -> str:
    """A nested value as the text its string column holds (bytes as their ``repr``)."""
    return json.dumps(value, default=str)


class _NotAValue(Exception):
    """A JSON default is no value of the type tried (a union tries its next branch)."""


def default_value(node: Node, default: Any, where: str) -> Any:
    """A field's JSON ``default`` as the value of type ``node`` it stands for, as the Avro
    specification's field-default table says (and Apache Avro Java reads it): ``bytes`` and
    ``fixed`` from a string whose code points 0–255 are the bytes (a fixed's as many as its size);
    ``float``/``double`` as floats; an enum's a symbol of it; array items and map values each of
    the item type; a record's an object whose fields take their types, a field it leaves out its
    own default (recursively); a union's of the first branch it is a value of (1.12's "first
    schema that matches"; 1.11 asks for the first branch, which then matches first). Dicts are in
    the record's field order. A default that is no value of its type raises :class:`DecodeError`
    naming ``where`` — when the reader needs it, so an unneeded bad default costs nothing."""
    try:
        return _from_json(node, default)
    except _NotAValue as exc:
        raise DecodeError(f"{where}: default {json.dumps(default)} is not a value of its type ({exc})") \
            from None
    except RecursionError:
        raise DecodeError(f"{where}: default nests too deeply") from None


def _from_json(node: Node, value: Any) -> Any:
    kind = node.kind
    if kind == "null":
        if value is None:
            return None
    elif kind == "boolean":
        if isinstance(value, bool):
            return value
    elif kind in ("int", "long"):
        bits = 32 if kind == "int" else 64
        bound = 1 << bits - 1
        if isinstance(value, int) and not isinstance(value, bool) and -bound <= value < bound:
            return value
    elif kind in ("float", "double"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind == "string":
        if isinstance(value, str):
            return value
    elif kind in ("bytes", "fixed"):
        if isinstance(value, str) and all(ord(c) < 256 for c in value):
            raw = value.encode("latin-1")
            if kind == "bytes" or len(raw) == node.size:
                return raw
    elif kind == "enum":
        if isinstance(value, str) and value in node.symbols:
            return value
    elif kind == "array":
        if isinstance(value, list):
            return [_from_json(node.items, item) for item in value]
    elif kind == "map":
        if isinstance(value, dict):
            return {key: _from_json(node.items, item) for key, item in value.items()}
    elif kind == "record":
        if isinstance(value, dict):
            out = {}
            for name, field_node, has, default in node.fields:
                if name in value:
                    out[name] = _from_json(field_node, value[name])
                elif has:
                    out[name] = _from_json(field_node, default)
                else:
                    raise _NotAValue(f"{node.short_name} field {name!r} is not given and has no default")
            return out
    elif kind == "union":
        for branch in node.branches:
            try:
                return _from_json(branch, value)
            except _NotAValue:
                continue
    raise _NotAValue(f"{json.dumps(value)} is not a {node.name or kind}")


def _fresh(value: Any) -> Any:
    """A default as one record holds it: a list or dict copied, so records never share one."""
    return copy.deepcopy(value) if isinstance(value, (dict, list)) else value


def _resolve_branch(b: Node, r: Node, cache: dict) -> Reader:
    """A writer union's branch as the reader reads it; a branch that does not resolve fails
    only when a record uses it (the spec: an error when that branch is read)."""
    try:
        return _compile(b, r, cache)
    except DecodeError as exc:
        message = f"union branch {b.name or b.kind}: {exc}"

        def fail(buf, pos):
            raise DecodeError(message)
        return fail


def read_body(read: Reader, buf: bytes, pos: int) -> Any:
    """``read`` over one whole body from ``pos``: a truncated body or bytes left over are errors."""
    _zero_size_items.n = 0
    try:
        value, end = read(buf, pos)
    except IndexError:
        raise DecodeError("truncated Avro body") from None
    except RecursionError:
        raise DecodeError("Avro body nests too deeply") from None
    if end != len(buf):
        raise DecodeError(f"{len(buf) - end} trailing bytes after the Avro record")
    return value


# -- in bulk -----------------------------------------------------------------------------------
_ARROW = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
          "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(), "enum": pa.string(),
          "fixed": pa.binary()}


def arrow_type(node: Node) -> pa.DataType:
    """A flat reader field's Arrow type (a union's non-null branch; nested values: JSON text)."""
    if node.kind == "union":
        others = [b for b in node.branches if b.kind != "null"]
        return arrow_type(others[0]) if len(others) == 1 else pa.string()
    return _ARROW.get(node.kind, pa.string())


class _Bulk:
    """The decoding state of one :meth:`ColumnDecoder.decode` call: positions, ends, reasons."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        self.data = data            # every body's bytes, 16 zero bytes of padding after the last
        self.pos = starts.copy()
        self.end = ends
        self.limit = len(data) - 16
        self.reason = np.zeros(len(starts), np.int32)  # 0 = fine, else 1 + index into messages
        self.zero_size = [0] * len(starts)  # zero-size array/map items read so far per record
        self.messages: list[str] = []

    def fail(self, rows: np.ndarray, bad: np.ndarray, message: str) -> np.ndarray:
        """Mark ``rows[bad]`` as failed with ``message`` (first reason wins); → rows still fine."""
        if bad.any():
            self.messages.append(message)
            hit = rows[bad]
            self.reason[hit] = np.where(self.reason[hit] == 0, len(self.messages), self.reason[hit])
            return rows[~bad]
        return rows

    def varints(self, rows: np.ndarray, max_bytes: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """Zig-zag varints at ``rows``' positions → (rows still fine, their values as int64).
        Byte by byte over the rows whose varint goes on, so short varints cost one step."""
        p = np.minimum(self.pos[rows], self.limit)
        byte = self.data[p]
        unsigned = (byte & 0x7F).astype(np.uint64)
        length = np.ones(len(rows), np.int64)
        last = byte
        going = np.nonzero(byte >= 0x80)[0]
        k = 1
        if going.size:
            last = byte.copy()
        while going.size and k < max_bytes:
            byte = self.data[p[going] + k]
            unsigned[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            length[going] += 1
            last[going] = byte
            going = going[byte >= 0x80]
            k += 1
        too_long = np.zeros(len(rows), bool)
        too_long[going] = True
        bits = 32 if max_bytes == 5 else 64
        # only the last of max_bytes bytes can carry bits past 32/64
        over = (length == max_bytes) & (last >= (1 << (bits - 7 * (max_bytes - 1)))) & ~too_long
        self.pos[rows] += length
        short = (self.pos[rows] > self.end[rows]) & ~too_long & ~over
        signed = (unsigned >> np.uint64(1)).astype(np.int64) ^ -(unsigned & np.uint64(1)).astype(np.int64)
        self.fail(rows, too_long, f"{what} varint longer than {max_bytes} bytes")
        self.fail(rows, over, f"{what} varint exceeds {bits} bits")
        self.fail(rows, short, "truncated Avro body")
        fine = ~(too_long | over | short)
        return rows[fine], signed[fine]

    def fixed(self, rows: np.ndarray, n: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """``n`` bytes at ``rows``' positions → (rows still fine, an (rows, n) uint8 array)."""
        p = self.pos[rows]
        short = p + n > self.end[rows]
        rows = self.fail(rows, short, f"truncated Avro body ({what})")
        p = self.pos[rows]
        self.pos[rows] = p + n
        return rows, self.data[p[:, None] + np.arange(n)]


@dataclass
class _Column:
    """A field's decoded values, full length; ``valid`` False where null (a union's null branch)."""

    kind: str
    name: str
    values: Any  # int64/float/bool array; (start, length) arrays for bytes and strings
    valid: np.ndarray


class ColumnDecoder:
    """Many bodies of one flat writer schema → Arrow columns of the reader schema, in bulk.

    ``decode(data, starts, ends)``: ``data`` holds the bodies (``starts[i]:ends[i]``); returns
    the reader's columns for the records that decoded and a reason (``str``) for each that did
    not. The columns hold the good records only, in input order. Strictness: see the module."""

    def __init__(self, writer: Node, reader: Node | None = None):
        reader = reader or writer
        if writer.kind != "record":
            raise DecodeError(f"a writer schema of {writer.kind}, not of a record")
        self.writer, self.reader = writer, reader
        record_reader(writer, reader)  # the per-record rules refuse an unresolvable pair here too
        self.names = [name for name, _, _, _ in reader.fields]
        self.types = [arrow_type(node) for _, node, _, _ in reader.fields]
        self.sources = sources(writer, reader)  # reader field → writer field (aliases resolved)
        #: reader field the writer lacks → its default's value (:func:`default_value`)
        self.defaults = {name: default_value(node, default, f"reader field {name!r} of {reader.short_name}")
                         for name, node, _, default in reader.fields if name not in self.sources}
        read_as = {written: node for name, node, _, _ in reader.fields if (written := self.sources.get(name))}
        cache: dict = {}
        #: writer field → its per-record reader, for the fields not decoded column-wise (a field
        #: the reader lacks is read as written, and dropped)
        self.each = {name: _compile(node, read_as.get(name, node) if reader is not writer else node, cache)
                     for name, node, _, _ in writer.fields if not node.flat()}

    def decode(self, data: bytes, starts: np.ndarray,
               ends: np.ndarray) -> tuple[list[pa.Array], np.ndarray, dict[int, str]]:
        """→ (the reader's columns for the good records, their indices, {index: reason} for the rest)."""
        buf = np.frombuffer(data + bytes(16), np.uint8)
        bulk = _Bulk(buf, np.asarray(starts, np.int64), np.asarray(ends, np.int64))
        n = len(starts)
        rows = np.arange(n)
        decoded: dict[str, _Column] = {}
        for name, node, _, _ in self.writer.fields:
            if name in self.each:
                rows, decoded[name] = self._each(bulk, rows, name, n, data)
            else:
                rows, decoded[name] = self._field(bulk, rows, node, name, n)
        leftover = bulk.pos[rows] != bulk.end[rows]
        rows = bulk.fail(rows, leftover, "trailing bytes after the Avro record")
        for name, r_node, _, _ in self.reader.fields:
            col = decoded.get(self.sources.get(name, ""))
            if col is None:
                continue
            nullable = r_node.kind == "union" and any(b.kind == "null" for b in r_node.branches)
            if col.kind == "each":  # (resolved by its per-record reader)
                continue
            if not nullable:
                rows = bulk.fail(rows, ~col.valid[rows], f"field {name!r}: null, and the reader's "
                                                          f"{r_node.kind} has no null branch")
            if col.kind == "enum":
                missing = [i for i, s in enumerate(self._symbols(self.sources[name], r_node)) if s is None]
                rows = bulk.fail(rows, col.valid[rows] & np.isin(col.values[rows], missing),
                                 f"field {name!r}: enum symbol not in the reader's enum (and no default)")
        good = np.zeros(n, bool)
        good[rows] = True
        take = np.nonzero(good)[0]
        columns = []
        for (name, r_node, has, default), typ in zip(self.reader.fields, self.types):
            col = decoded.get(self.sources.get(name, ""))
            if col is None:
                value = self.defaults[name]
                value = (value if typ != pa.string() or value is None or isinstance(value, str)
                         else _json(value))
                columns.append(pa.array([value] * len(take), typ))
            else:
                columns.append(self._arrow(col, take, typ, buf, r_node))
        # a string that is not UTF-8 fails its record only (found when building the column)
        bad_utf8 = [i for i, c in enumerate(columns) if isinstance(c, _Invalid)]
        if bad_utf8:
            keep = np.ones(len(take), bool)
            for i in bad_utf8:
                keep &= columns[i].ok
                bulk.fail(take, ~columns[i].ok, f"field {self.names[i]!r}: string is not UTF-8")
            for i in bad_utf8:
                columns[i] = columns[i].array
            mask = pa.array(keep)
            columns = [c.filter(mask) for c in columns]
            take = take[keep]
        reasons = {int(i): bulk.messages[bulk.reason[i] - 1] for i in np.nonzero(bulk.reason)[0]}
        return columns, take, reasons

    def _field(self, bulk: _Bulk, rows: np.ndarray, node: Node, name: str,
               n: int) -> tuple[np.ndarray, _Column]:
        if node.kind == "union":
            rows, index = bulk.varints(rows, 10, "long")
            bad = (index < 0) | (index > 1)
            rows_bad = rows[bad]
            if len(rows_bad):
                bulk.fail(rows, bad, f"field {name!r}: union branch index out of range (the union has 2 "
                                     "branches)")
            rows, index = rows[~bad], index[~bad]
            null_at = 0 if node.branches[0].kind == "null" else 1
            present = rows[index != null_at]
            other = node.branches[1 - null_at]
            fine_present, col = self._field(bulk, present, other, name, n)
            col.valid[rows[index == null_at]] = False
            failed = np.setdiff1d(present, fine_present, assume_unique=True)
            return np.setdiff1d(rows, failed, assume_unique=True), col
        kind = node.kind
        valid = np.ones(n, bool)
        if kind in ("int", "long", "enum"):
            rows, values = bulk.varints(rows, 5 if kind == "int" else 10, "int" if kind == "int" else "long")
            if kind == "enum":
                bad = (values < 0) | (values >= len(node.symbols))
                rows = bulk.fail(rows, bad, f"field {name!r}: enum index out of range "
                                            f"({len(node.symbols)} symbols)")
                values = values[~bad]
            full = np.zeros(n, np.int64)
            full[rows] = values
            return rows, _Column(kind, name, full, valid)
        if kind in ("float", "double"):
            size = 4 if kind == "float" else 8
            rows, raw = bulk.fixed(rows, size, kind)
            full = np.zeros(n, np.float32 if size == 4 else np.float64)
            full[rows] = raw.copy().view("<f4" if size == 4 else "<f8").ravel()
            return rows, _Column(kind, name, full, valid)
        if kind == "boolean":
            rows, raw = bulk.fixed(rows, 1, "boolean")
            raw = raw.ravel()
            bad = raw > 1
            good_rows = bulk.fail(rows, bad, f"field {name!r}: boolean byte other than 0 or 1")
            full = np.zeros(n, bool)
            full[good_rows] = raw[~bad] == 1
            return good_rows, _Column(kind, name, full, valid)
        if kind == "fixed":
            at = bulk.pos[rows].copy()
            rows2, _ = bulk.fixed(rows, node.size, "fixed")
            starts = np.zeros(n, np.int64)
            lengths = np.zeros(n, np.int64)
            starts[rows] = at
            lengths[rows2] = node.size
            return rows2, _Column(kind, name, (starts, lengths), valid)
        # bytes, string
        rows, length = bulk.varints(rows, 10, "long")
        at = bulk.pos[rows]
        bad = (length < 0) | (at + length > bulk.end[rows])
        rows_ok = bulk.fail(rows, bad, f"field {name!r}: {kind} length negative or past the end of the "
                                       "record")
        length, at = length[~bad], at[~bad]
        bulk.pos[rows_ok] = at + length
        starts = np.zeros(n, np.int64)
        lengths = np.zeros(n, np.int64)
        starts[rows_ok], lengths[rows_ok] = at, length
        return rows_ok, _Column(kind, name, (starts, lengths), valid)

    def _each(self, bulk: _Bulk, rows: np.ndarray, name: str, n: int,
              data: bytes) -> tuple[np.ndarray, _Column]:
        """A field read value by value with its per-record reader, each body on its own (so a
        count or length is bounded by that body's bytes, never its neighbours')."""
        read, values = self.each[name], [None] * n
        kept = np.ones(len(rows), bool)
        for j, r in enumerate(rows.tolist()):
            at, end = int(bulk.pos[r]), int(bulk.end[r])
            _zero_size_items.n = bulk.zero_size[r]
            try:
                values[r], used = read(data[at:end], 0)
            except DecodeError as exc:
                reason = f"field {name!r}: {exc}"
            except IndexError:
                reason = "truncated Avro body"
            except RecursionError:
                reason = "Avro body nests too deeply"
            else:
                bulk.pos[r] = at + used
                bulk.zero_size[r] = _zero_size_items.n
                continue
            kept[j] = False
            bulk.fail(rows[j:j + 1], np.ones(1, bool), reason)
        valid = np.fromiter((v is not None for v in values), bool, n)
        return rows[kept], _Column("each", name, values, valid)

    def _arrow(self, col: _Column, take: np.ndarray, typ: pa.DataType, buf: np.ndarray, r_node: Node):
        if col.kind == "each":  # JSON text, a string as it is (the per-record decoder did the same)
            values = [col.values[i] for i in take.tolist()]
            return pa.array([v if v is None or isinstance(v, str) else _json(v) for v in values], typ)
        valid = col.valid[take]
        mask = None if valid.all() else ~valid
        if col.kind in ("string", "bytes", "fixed"):
            starts, lengths = col.values[0][take], col.values[1][take]
            lengths = np.where(valid, lengths, 0)
            offsets = np.zeros(len(take) + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            total = int(offsets[-1])
            index = np.repeat(starts - offsets[:-1], lengths) + np.arange(total)
            data = buf[index].tobytes()
            validity = None if mask is None else pa.array(valid).buffers()[1]
            binary = pa.Array.from_buffers(pa.large_binary(), len(take),
                                           [validity, pa.py_buffer(offsets), pa.py_buffer(data)])
            if typ == pa.string():
                try:
                    return binary.cast(pa.large_string()).cast(pa.string())
                except pa.ArrowInvalid:
                    return _invalid_utf8(binary)
            return binary.cast(pa.binary())
        values = col.values[take]
        if col.kind == "enum":
            symbols = self._symbols(col.name, r_node)
            arr = pa.DictionaryArray.from_arrays(pa.array(values.astype(np.int32), mask=mask),
                                                 pa.array(symbols, pa.string())).cast(pa.string())
            return arr
        return pa.array(values, mask=mask).cast(typ, safe=False)  # promotions int → long → float →
                                                                  # double

    def _symbols(self, name: str, r_node: Node) -> list[str]:
        w_node = next(node for n, node, _, _ in self.writer.fields if n == name)
        w_enum = w_node if w_node.kind == "enum" else next(b for b in w_node.branches if b.kind == "enum")
        r_enum = r_node if r_node.kind == "enum" else next((b for b in r_node.branches if b.kind == "enum"),
                                                           w_enum)
        out = []
        for s in w_enum.symbols:
            if s in r_enum.symbols:
                out.append(s)
            elif r_enum.enum_default is not None:
                out.append(r_enum.enum_default)
            else:
                out.append(None)  # a record with it fails below (per-record rules), see decode
        return out


@dataclass
class _Invalid:
    """A string column with invalid UTF-8 in some rows: ``array`` with those rows empty, ``ok`` the others."""

    array: pa.Array
    ok: np.ndarray


def _invalid_utf8(binary: pa.Array) -> _Invalid:
    values = binary.to_pylist()
    ok = np.ones(len(values), bool)
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(v.decode("utf-8"))
        except UnicodeDecodeError:
            ok[i] = False
            out.append("")
    return _Invalid(pa.array(out, pa.string()), ok)
