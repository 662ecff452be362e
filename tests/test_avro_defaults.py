"""Defaults under schema evolution, as the Avro specification (1.11, 1.12) says: a reader field
the writer lacks takes its ``default``, read by the field's type — "Default values for bytes and
fixed fields are JSON strings, where Unicode code points 0-255 are mapped to unsigned 8-bit byte
values 0-255"; a record's default is a JSON object whose missing fields take their own defaults
(as Apache Avro Java resolves it); an array's items and a map's values are each of the item type;
a union's default is of its first branch (1.12: the first branch it matches). Per record and in
bulk alike; the encoder writes a missing field's default by the same reading. Every expected
value below is written down from the specification, not computed by the code under test; the
bodies are written by hand too."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ctiflow.jobs.avro.decode import ColumnDecoder, compile_schema, read_body, record_reader
from ctiflow.jobs.avro.encode import ColumnEncoder, record_writer
from ctiflow.operators.errors import DecodeError

#: The writer: one ``long`` field. The body of ``{"id": 1}`` is the zig-zag varint of 1.
WRITER = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
BODY_ID_1 = b"\x02"
BODY_ID_MINUS_1 = b"\x01"

INNER = {"type": "record", "name": "Inner", "fields": [
    {"name": "a", "type": "int"},
    {"name": "b", "type": ["null", "string"], "default": None},
    {"name": "raw", "type": "bytes", "default": "\u00ff\u0000A"}]}


def _reader(*added: dict) -> dict:
    return {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}, *added]}


def _per_record(reader: dict, body: bytes = BODY_ID_1):
    return read_body(record_reader(compile_schema(WRITER), compile_schema(reader)), body, 0)


def _in_bulk(reader: dict, bodies: tuple[bytes, ...] = (BODY_ID_1, BODY_ID_MINUS_1)) -> list[dict]:
    decoder = ColumnDecoder(compile_schema(WRITER), compile_schema(reader))
    lengths = np.array([len(b) for b in bodies], np.int64)
    ends = np.cumsum(lengths)
    columns, good, reasons = decoder.decode(b"".join(bodies), ends - lengths, ends)
    assert reasons == {} and list(good) == list(range(len(bodies)))
    return pa.Table.from_arrays(columns, names=decoder.names).to_pylist()


# -- bytes and fixed: code points 0–255 are the bytes ------------------------------------------
def test_a_bytes_default_is_the_bytes_its_code_points_name_per_record():
    reader = _reader({"name": "tag", "type": "bytes", "default": "\u00ff\u0000A\u0080"})
    assert _per_record(reader) == {"id": 1, "tag": b"\xff\x00A\x80"}


def test_a_fixed_default_is_the_bytes_its_code_points_name_per_record():
    fixed = {"type": "fixed", "name": "Mac", "size": 3}
    reader = _reader({"name": "mac", "type": fixed, "default": "\u00de\u00ad\u0001"})
    assert _per_record(reader) == {"id": 1, "mac": b"\xde\xad\x01"}


def test_bytes_and_fixed_defaults_are_bytes_in_the_bulk_columns():
    reader = _reader({"name": "tag", "type": "bytes", "default": "\u00ff\u0000A\u0080"},
                     {"name": "mac", "type": {"type": "fixed", "name": "Mac", "size": 3},
                      "default": "\u00de\u00ad\u0001"},
                     {"name": "maybe", "type": ["bytes", "null"], "default": "\u00e9"})
    assert _in_bulk(reader) == [
        {"id": 1, "tag": b"\xff\x00A\x80", "mac": b"\xde\xad\x01", "maybe": b"\xe9"},
        {"id": -1, "tag": b"\xff\x00A\x80", "mac": b"\xde\xad\x01", "maybe": b"\xe9"}]


def test_a_union_default_with_bytes_first_is_bytes_per_record():
    reader = _reader({"name": "maybe", "type": ["bytes", "null"], "default": "\u00e9"})
    assert _per_record(reader) == {"id": 1, "maybe": b"\xe9"}


# -- records: a field the default leaves out takes its own default ------------------------------
def test_a_record_default_fills_the_fields_it_leaves_out_from_their_defaults_per_record():
    reader = _reader({"name": "inner", "type": INNER, "default": {"a": 5}})
    assert _per_record(reader) == {"id": 1, "inner": {"a": 5, "b": None, "raw": b"\xff\x00A"}}


def test_a_record_default_keeps_the_fields_it_gives_bytes_as_bytes_per_record():
    reader = _reader({"name": "inner", "type": INNER, "default": {"raw": "\u0001\u0002", "b": "x", "a": 7}})
    assert _per_record(reader) == {"id": 1, "inner": {"a": 7, "b": "x", "raw": b"\x01\x02"}}


def test_a_record_default_is_its_full_record_as_json_text_in_bulk():
    point = {"type": "record", "name": "Point", "fields": [
        {"name": "a", "type": "int"}, {"name": "b", "type": ["null", "string"], "default": None},
        {"name": "c", "type": "double", "default": 1}]}
    reader = _reader({"name": "point", "type": point, "default": {"a": 5}})
    assert _in_bulk(reader) == [{"id": 1, "point": '{"a": 5, "b": null, "c": 1.0}'},
                                {"id": -1, "point": '{"a": 5, "b": null, "c": 1.0}'}]


def test_records_in_an_array_or_map_default_each_take_their_fields_defaults():
    reader = _reader({"name": "list", "type": {"type": "array", "items": INNER},
                      "default": [{"a": 1}, {"a": 2}]},
                     {"name": "by_key", "type": {"type": "map", "values": "Inner"},
                      "default": {"k": {"a": 3}}})
    assert _per_record(reader) == {
        "id": 1,
        "list": [{"a": 1, "b": None, "raw": b"\xff\x00A"}, {"a": 2, "b": None, "raw": b"\xff\x00A"}],
        "by_key": {"k": {"a": 3, "b": None, "raw": b"\xff\x00A"}}}


def test_an_array_and_a_map_default_are_json_text_of_full_records_in_bulk():
    point = {"type": "record", "name": "Point", "fields": [
        {"name": "a", "type": "int"}, {"name": "b", "type": ["null", "string"], "default": None}]}
    reader = _reader({"name": "list", "type": {"type": "array", "items": point}, "default": [{"a": 1}]},
                     {"name": "by_key", "type": {"type": "map", "values": "Point"},
                      "default": {"k": {"a": 3}}})
    row = {"list": '[{"a": 1, "b": null}]', "by_key": '{"k": {"a": 3, "b": null}}'}
    assert _in_bulk(reader) == [{"id": 1, **row}, {"id": -1, **row}]


def test_a_union_default_of_a_record_first_fills_the_records_fields():
    reader = _reader({"name": "inner", "type": [INNER, "null"], "default": {"a": 5}})
    assert _per_record(reader) == {"id": 1, "inner": {"a": 5, "b": None, "raw": b"\xff\x00A"}}


def test_a_nested_record_the_writer_wrote_takes_its_added_fields_bytes_default_as_bytes():
    writer = {"type": "record", "name": "R", "fields": [
        {"name": "inner", "type": {"type": "record", "name": "Inner",
                                   "fields": [{"name": "a", "type": "int"}]}}]}
    reader = {"type": "record", "name": "R", "fields": [{"name": "inner", "type": INNER}]}
    read = record_reader(compile_schema(writer), compile_schema(reader))
    assert read_body(read, b"\x0a", 0) == {"inner": {"a": 5, "b": None, "raw": b"\xff\x00A"}}


# -- the other types, as the specification's table says ----------------------------------------
def test_enum_float_and_null_defaults_take_their_types_per_record_and_in_bulk():
    reader = _reader({"name": "colour", "type": {"type": "enum", "name": "C", "symbols": ["RED", "BLUE"]},
                      "default": "BLUE"},
                     {"name": "ratio", "type": "double", "default": 2},
                     {"name": "note", "type": ["null", "string"], "default": None})
    expected = {"colour": "BLUE", "ratio": 2.0, "note": None}
    got = _per_record(reader)
    assert got == {"id": 1, **expected} and type(got["ratio"]) is float
    assert _in_bulk(reader) == [{"id": 1, **expected}, {"id": -1, **expected}]


def test_each_record_gets_its_own_copy_of_a_mutable_default():
    reader = _reader({"name": "list", "type": {"type": "array", "items": "long"}, "default": [1]})
    read = record_reader(compile_schema(WRITER), compile_schema(reader))
    first = read_body(read, BODY_ID_1, 0)
    first["list"].append(2)
    assert read_body(read, BODY_ID_1, 0) == {"id": 1, "list": [1]}


# -- a default that is no value of its type ------------------------------------------------------
@pytest.mark.parametrize("field", [
    {"name": "tag", "type": "bytes", "default": "\u0100"},  # code point 256 is no byte
    {"name": "mac", "type": {"type": "fixed", "name": "Mac", "size": 3},
     "default": "\u00de"},  # 1 byte, not 3
    {"name": "inner", "type": INNER, "default": {"b": "x"}},  # a has no default and is not given
    {"name": "colour", "type": {"type": "enum", "name": "C", "symbols": ["RED"]}, "default": "GREEN"},
])
def test_a_default_that_is_no_value_of_its_type_does_not_resolve(field):
    with pytest.raises(DecodeError, match=f"reader field '{field['name']}' of R: default"):
        record_reader(compile_schema(WRITER), compile_schema(_reader(field)))
    with pytest.raises(DecodeError, match=f"reader field '{field['name']}' of R: default"):
        ColumnDecoder(compile_schema(WRITER), compile_schema(_reader(field)))


# -- the encoder takes the same defaults -----------------------------------------------------------
def test_the_encoder_writes_a_missing_fields_default_as_the_specification_reads_it():
    """A record without ``inner`` and ``maybe`` writes their defaults: ``inner`` = {a: 5, b: null
    (union index 0), raw: the bytes ff 00 41}, ``maybe`` = its bytes branch (index 0) holding e9."""
    schema = _reader({"name": "inner", "type": INNER, "default": {"a": 5}},
                     {"name": "maybe", "type": ["bytes", "null"], "default": "\u00e9"})
    expected = b"\x02" + b"\x0a" + b"\x00" + b"\x06\xff\x00A" + b"\x00" + b"\x02\xe9"
    out = bytearray()
    record_writer(compile_schema(schema))({"id": 1}, out)
    assert bytes(out) == expected
    assert ColumnEncoder(schema).encode({"id": np.array([1])}, 1).to_pylist() == [expected]
