"""The strict Avro decoders (per record and in bulk): they agree with fastavro on every valid
record of every schema in ``schemas/`` (fastavro is the oracle for valid bytes), and they refuse
the hostile bytes fastavro returns as records — each class, for every schema that has a field of
its type — with a reason, one bad record never costing its neighbours."""

from __future__ import annotations

import io
import json
import math
import random
import struct

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from ctiflow.jobs.avro.decode import ColumnDecoder, compile_schema, read_body, record_reader
from ctiflow.jobs.avro.serde import SchemaStore
from ctiflow.operators.errors import DecodeError

STORE = SchemaStore()
SCHEMAS = [n for n in STORE.names()]


def _schema(name: str) -> dict:
    return json.loads(STORE.get(name).text)


def _random_value(t, rng: random.Random, named: dict):
    """A random valid value of Avro type ``t`` (JSON schema form), written independently of the decoder."""
    if isinstance(t, list):
        return _random_value(rng.choice(t), rng, named)
    if isinstance(t, str) and t in named:
        return _random_value(named[t], rng, named)
    if isinstance(t, dict):
        kind = t["type"]
        if kind == "record":
            named[t["name"]] = t
            return {f["name"]: _random_value(f["type"], rng, named) for f in t["fields"]}
        if kind == "array":
            return [_random_value(t["items"], rng, named) for _ in range(rng.randrange(4))]
        if kind == "map":
            return {f"k{i}é": _random_value(t["values"], rng, named) for i in range(rng.randrange(4))}
        if kind == "enum":
            named[t["name"]] = t
            return rng.choice(t["symbols"])
        return _random_value(kind, rng, named)
    return {
        "null": lambda: None, "boolean": lambda: rng.random() < 0.5,
        "int": lambda: rng.choice([0, -1, 1, 63, -64, 64, 2**31 - 1, -2**31, rng.randrange(-2**31, 2**31)]),
        "long": lambda: rng.choice([0, -1, 2**63 - 1, -2**63, 1_767_225_600_000, rng.randrange(-2**63, 2**63)]),
        "float": lambda: struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0],
        "double": lambda: rng.choice([0.0, -1.5, 1e300, rng.uniform(-1e9, 1e9)]),
        "bytes": lambda: rng.randbytes(rng.randrange(12)),
        "string": lambda: rng.choice(["", "a", "Zürich", "東京", "x" * rng.randrange(300)]),
    }[t]()


def _encode(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema, named_schemas={}), record)
    return out.getvalue()


def _fastavro(schema: dict, body: bytes):
    return fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(schema, named_schemas={}), None)


def _records(name: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [_random_value(_schema(name), rng, {}) for _ in range(n)]


def _bulk(decoder: ColumnDecoder, bodies: list[bytes]):
    lengths = np.array([len(b) for b in bodies], np.int64)
    ends = np.cumsum(lengths)
    columns, good, reasons = decoder.decode(b"".join(bodies), ends - lengths, ends)
    return pa.Table.from_arrays(columns, names=decoder.names).to_pylist(), list(good), reasons


def _same(a, b) -> bool:
    """Equal, NaN included (the oracle's floats)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("name", SCHEMAS)
def test_valid_records_of_every_schema_decode_as_fastavro_decodes_them(name):
    schema = _schema(name)
    read = record_reader(compile_schema(schema))
    for rec in _records(name, 300, seed=len(name)):
        body = _encode(schema, rec)
        assert _same(read_body(read, body, 0), _fastavro(schema, body))


def _as_columns(schema: dict, record: dict) -> dict:
    """A record as the bulk decoder's columns hold it: a field that is not flat as JSON text."""
    flat = {name: node.flat() for name, node, _, _ in compile_schema(schema).fields}
    return {k: v if flat[k] or v is None or isinstance(v, str) else json.dumps(v, default=str)
            for k, v in record.items()}


@pytest.mark.parametrize("name", SCHEMAS)
def test_the_bulk_decoder_gives_the_records_fastavro_gives(name):
    schema = _schema(name)
    bodies = [_encode(schema, r) for r in _records(name, 500, seed=7)]
    rows, good, reasons = _bulk(ColumnDecoder(compile_schema(schema)), bodies)
    assert reasons == {} and good == list(range(len(bodies)))
    assert all(_same(row, _as_columns(schema, _fastavro(schema, b))) for row, b in zip(rows, bodies))


# -- hostile bytes ------------------------------------------------------------------------------
def _zigzag_varint(n: int) -> bytes:
    u = (n << 1) ^ (n >> 127)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _field_kind(t) -> str:
    return "union" if isinstance(t, list) else t if isinstance(t, str) else t["type"] if isinstance(t["type"], str) else "?"


#: Each class: which field types it applies to, and the field's hostile encoding (what fastavro
#: still reads as a value of that field).
HOSTILE = {
    "negative union index": ("union", lambda t, rng: _zigzag_varint(-1) + _encode(
        {"type": "record", "name": "W", "fields": [{"name": "v", "type": t[-1]}]}, {"v": _random_value(t[-1], rng, {})})),
    "int varint past 32 bits": ("int", lambda t, rng: _zigzag_varint(2**40)),
    "long varint past 10 bytes": ("long", lambda t, rng: b"\x80" * 10 + b"\x00"),
    "boolean other than 0/1": ("boolean", lambda t, rng: b"\x05"),
}


def _hostile_bodies(name: str, kind: str) -> list[tuple[str, bytes]]:
    """For every top-level field of the class's type: a record with that field's encoding replaced."""
    schema = _schema(name)
    applies, hostile = HOSTILE[kind]
    rng = random.Random(1)
    rec = _records(name, 1, seed=11)[0]
    out = []
    for i, f in enumerate(schema["fields"]):
        if _field_kind(f["type"]) != applies:
            continue
        parts = [_encode({**schema, "fields": [g]}, {g["name"]: rec[g["name"]]}) for g in schema["fields"]]
        parts[i] = hostile(f["type"], rng)
        out.append((f["name"], b"".join(parts)))
    return out


CASES = [(name, kind) for name in SCHEMAS for kind in HOSTILE if _hostile_bodies(name, kind)]


def test_every_schema_has_fields_the_hostile_classes_apply_to():
    assert {name for name, _ in CASES} == set(SCHEMAS)
    assert {kind for _, kind in CASES} == set(HOSTILE)


@pytest.mark.parametrize("name, kind", CASES)
def test_hostile_bytes_are_refused_with_a_reason_per_record(name, kind):
    read = record_reader(compile_schema(_schema(name)))
    for field, body in _hostile_bodies(name, kind):
        with pytest.raises(DecodeError, match="union branch index|varint|boolean byte"):
            read_body(read, body, 0)


@pytest.mark.parametrize("name, kind", CASES)
def test_hostile_bytes_are_refused_in_bulk_and_their_neighbours_decode(name, kind):
    schema = _schema(name)
    decoder = ColumnDecoder(compile_schema(schema))
    good = [_encode(schema, r) for r in _records(name, 3, seed=5)]
    for field, body in _hostile_bodies(name, kind):
        rows, kept, reasons = _bulk(decoder, [good[0], body, good[1], body, good[2]])
        assert kept == [0, 2, 4]
        assert set(reasons) == {1, 3} and all(("union" in r or "varint" in r or "boolean" in r) for r in reasons.values())
        assert all(_same(row, _as_columns(schema, _fastavro(schema, b))) for row, b in zip(rows, good))


def test_an_array_claiming_more_items_than_bytes_left_is_refused_at_once():
    schema = _schema("match")
    read = record_reader(compile_schema(schema))
    rec = _records("match", 1, seed=2)[0]
    prefix = b"".join(_encode({**schema, "fields": [g]}, {g["name"]: rec[g["name"]]}) for g in schema["fields"][:5])
    hostile = prefix + _zigzag_varint(2**60) + b"\x00" * 40
    with pytest.raises(DecodeError, match="items .* bytes left"):
        read_body(read, hostile, 0)
    # in bulk: the array is bounded by its own body's bytes, not by the neighbours after it
    good = [_encode(schema, r) for r in _records("match", 2, seed=3)]
    rows, kept, reasons = _bulk(ColumnDecoder(compile_schema(schema)), [good[0], hostile, good[1], good[1] * 50])
    assert kept == [0, 2] and "bytes left" in reasons[1] and "trailing bytes" in reasons[3]
    assert all(_same(row, _as_columns(schema, _fastavro(schema, b))) for row, b in zip(rows, good))


@pytest.mark.parametrize("body, reason", [
    (b"\x06ab", "bytes left"),                       # a string cut short
    (b"\x04\xff\xfe", "not UTF-8"),                   # invalid UTF-8
    (b"\x01", "length -1"),                           # a negative length
])
def test_malformed_strings_are_refused(body, reason):
    schema = {"type": "record", "name": "S", "fields": [{"name": "s", "type": "string"}]}
    with pytest.raises(DecodeError, match=reason):
        read_body(record_reader(compile_schema(schema)), body, 0)
    _, kept, reasons = _bulk(ColumnDecoder(compile_schema(schema)), [b"\x02a", body, b"\x02b"])
    assert kept == [0, 2] and set(reasons) == {1}


# -- resolution ---------------------------------------------------------------------------------
WRITER = {"type": "record", "name": "R", "fields": [
    {"name": "extra", "type": "string"},
    {"name": "n", "type": "int"}, {"name": "m", "type": ["null", "long"]},
    {"name": "f", "type": "float"}, {"name": "s", "type": "string"}, {"name": "b", "type": "bytes"},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
]}
READER = {"type": "record", "name": "R", "fields": [
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["B", "A", "Z"], "default": "Z"}},
    {"name": "n", "type": "double"}, {"name": "m", "type": ["null", "double"]},
    {"name": "f", "type": "double"}, {"name": "s", "type": "bytes"}, {"name": "b", "type": ["null", "string"]},
    {"name": "added", "type": "string", "default": "dflt"},
]}


def test_writer_to_reader_resolution_matches_fastavro_per_record_and_in_bulk():
    rng = random.Random(3)
    recs = [{"extra": "x", "n": rng.randrange(-2**31, 2**31), "m": rng.choice([None, rng.randrange(-2**40, 2**40)]),
             "f": struct.unpack("<f", struct.pack("<f", rng.uniform(-9, 9)))[0], "s": "ü" * rng.randrange(3),
             "b": rng.choice([b"", b"ok"]), "e": rng.choice("ABC")} for _ in range(200)]
    bodies = [_encode(WRITER, r) for r in recs]
    expected = [fastavro.schemaless_reader(io.BytesIO(b), fastavro.parse_schema(WRITER, named_schemas={}),
                                           fastavro.parse_schema(READER, named_schemas={})) for b in bodies]
    order = [f["name"] for f in READER["fields"]]
    expected = [{k: e[k] for k in order} for e in expected]  # fastavro keeps the writer's order; ours is the reader's
    read = record_reader(compile_schema(WRITER), compile_schema(READER))
    assert all(_same(read_body(read, b, 0), e) for b, e in zip(bodies, expected))
    rows, kept, reasons = _bulk(ColumnDecoder(compile_schema(WRITER), compile_schema(READER)), bodies)
    assert reasons == {} and all(_same(r, e) for r, e in zip(rows, expected))


def test_a_null_for_a_reader_field_without_null_fails_that_record_only():
    writer = {"type": "record", "name": "R", "fields": [{"name": "t", "type": ["null", "long"]}]}
    reader = {"type": "record", "name": "R", "fields": [{"name": "t", "type": "long"}]}
    bodies = [_encode(writer, {"t": 5}), _encode(writer, {"t": None}), _encode(writer, {"t": 7})]
    read = record_reader(compile_schema(writer), compile_schema(reader))
    with pytest.raises(DecodeError):
        read_body(read, bodies[1], 0)
    rows, kept, reasons = _bulk(ColumnDecoder(compile_schema(writer), compile_schema(reader)), bodies)
    assert rows == [{"t": 5}, {"t": 7}] and list(reasons) == [1]


def test_a_reader_field_with_no_default_that_the_writer_lacks_does_not_resolve():
    writer = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    reader = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "long"}]}
    with pytest.raises(DecodeError, match="'b'.*no default"):
        record_reader(compile_schema(writer), compile_schema(reader))


def test_a_renamed_field_and_a_renamed_record_resolve_through_the_readers_aliases():
    """The Avro spec's resolution: a reader field whose aliases name a writer field reads it (as
    Apache Avro Java does); a reader record whose aliases name the writer's record matches it."""
    writer = {"type": "record", "name": "Old", "namespace": "a", "fields": [
        {"name": "id", "type": "string"}, {"name": "old_name", "type": "int"},
        {"name": "inner", "type": {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "int"}]}}]}
    reader = {"type": "record", "name": "New", "namespace": "a", "aliases": ["Old"], "fields": [
        {"name": "new_name", "type": "long", "aliases": ["old_name"]}, {"name": "id", "type": "string"},
        {"name": "inner", "type": {"type": "record", "name": "Place", "aliases": ["a.Point"],
                                   "fields": [{"name": "x", "type": "double"}]}},
        {"name": "added", "type": "string", "default": "d"}]}
    body = _encode(writer, {"id": "k", "old_name": 7, "inner": {"x": 3}})
    read = record_reader(compile_schema(writer), compile_schema(reader))
    assert read_body(read, body, 0) == {"new_name": 7, "id": "k", "inner": {"x": 3.0}, "added": "d"}
    strict = {**reader, "aliases": []}  # without the record's alias the names do not match
    with pytest.raises(DecodeError):
        read_body(record_reader(compile_schema(writer), compile_schema(strict)), body, 0)
    no_alias = {**reader, "fields": [{**reader["fields"][0], "aliases": []}, *reader["fields"][1:]]}
    with pytest.raises(DecodeError, match="reader field 'new_name' of New is not written and has no default"):
        record_reader(compile_schema(writer), compile_schema(no_alias))


def test_the_bulk_decoder_reads_a_renamed_field_through_its_alias_as_per_record_does():
    writer = {"type": "record", "name": "T", "fields": [
        {"name": "old_name", "type": ["null", "long"]}, {"name": "kind", "type": {"type": "enum", "name": "K",
                                                                                  "symbols": ["a", "b"]}}]}
    reader = {"type": "record", "name": "T", "fields": [
        {"name": "kind2", "type": {"type": "enum", "name": "K", "symbols": ["a", "b"]}, "aliases": ["kind"]},
        {"name": "new_name", "type": ["null", "double"], "aliases": ["old_name"]}]}
    records = [{"old_name": 5, "kind": "b"}, {"old_name": None, "kind": "a"}]
    bodies = [_encode(writer, r) for r in records]
    decoder = ColumnDecoder(compile_schema(writer), compile_schema(reader))
    data = b"".join(bodies)
    ends = np.cumsum([len(b) for b in bodies])
    columns, take, reasons = decoder.decode(data, ends - [len(b) for b in bodies], ends)
    assert not reasons and list(take) == [0, 1]
    assert [c.to_pylist() for c in columns] == [["b", "a"], [5.0, None]]
    per_record = record_reader(compile_schema(writer), compile_schema(reader))
    assert [read_body(per_record, b, 0) for b in bodies] == [{"kind2": "b", "new_name": 5.0},
                                                             {"kind2": "a", "new_name": None}]


def test_items_that_take_no_bytes_are_capped_per_record_not_per_block():
    """An array of nulls: a block of 65,536 items costs 3 bytes, so before the cap was per block a
    1 kB record held 20 million items. At most MAX_ZERO_SIZE_ITEMS in one record, over all blocks
    and nested arrays."""
    from ctiflow.jobs.avro.decode import MAX_ZERO_SIZE_ITEMS

    schema = {"type": "record", "name": "Z", "fields": [{"name": "xs", "type": {"type": "array", "items": "null"}}]}
    read = record_reader(compile_schema(schema))

    def body(blocks: list[int]) -> bytes:
        out = io.BytesIO()
        for n in blocks:
            fastavro.io.binary_encoder.BinaryEncoder(out).write_long(n)
        out.write(b"\x00")  # the end of the array
        return out.getvalue()

    assert len(read_body(read, body([MAX_ZERO_SIZE_ITEMS // 2, MAX_ZERO_SIZE_ITEMS // 2]), 0)["xs"]) \
        == MAX_ZERO_SIZE_ITEMS
    with pytest.raises(DecodeError, match="items that take no bytes"):
        read_body(read, body([MAX_ZERO_SIZE_ITEMS] * 300), 0)  # 300 blocks in ≈ 1 kB
    nested = {"type": "record", "name": "N", "fields": [
        {"name": "xss", "type": {"type": "array", "items": {"type": "array", "items": "null"}}}]}
    inner = body([MAX_ZERO_SIZE_ITEMS])
    out = io.BytesIO()
    fastavro.io.binary_encoder.BinaryEncoder(out).write_long(40)
    with pytest.raises(DecodeError, match="items that take no bytes"):
        read_body(record_reader(compile_schema(nested)), out.getvalue() + inner * 40 + b"\x00", 0)
