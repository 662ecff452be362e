"""Avro serde: both framings, schema resolution, typed errors, and a hypothesis fuzz of the decoder."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.serde import AvroDeserializer, AvroSerializer, SchemaStore, registry_client
from operators.errors import DecodeError, SchemaError

TX = {"id": "1", "account": "acct-1", "event_time": 1_767_225_600_000, "type": "purchase", "amount": 12.5,
      "currency": "EUR", "country": "DE", "merchant": None}


def crc64_avro(data: bytes) -> int:
    """The Avro spec's reference Rabin fingerprint, written out independently of fastavro."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for b in data:
        fp = (fp >> 8) ^ table[(fp ^ b) & 0xFF]
    return fp


def test_single_object_header_is_magic_plus_little_endian_crc64_of_the_canonical_form():
    from fastavro.schema import to_parsing_canonical_form

    store = SchemaStore()
    value = AvroSerializer("transaction", store=store)(TX)
    canonical = to_parsing_canonical_form(store.get("transaction").parsed).encode()
    assert value[:2] == b"\xc3\x01"
    assert value[2:10] == crc64_avro(canonical).to_bytes(8, "little")
    assert AvroDeserializer("transaction", store=store)(value) == TX


def test_confluent_framing_round_trips_through_a_registry():
    reg = registry_client("mock://serde-test")
    value = AvroSerializer("transaction", framing="confluent", registry=reg, subject="tx-value")(TX)
    assert value[0] == 0 and int.from_bytes(value[1:5], "big") >= 1
    assert AvroDeserializer("transaction", registry=reg)(value) == TX


def test_an_older_writer_schema_resolves_to_the_current_reader_schema(tmp_path):
    current = json.loads((SchemaStore().directory / "transaction.avsc").read_text())
    old = {**current, "fields": [f for f in current["fields"] if f["name"] not in ("currency", "merchant")]}
    (tmp_path / "transaction.avsc").write_text(json.dumps(current))
    (tmp_path / "versions").mkdir()
    (tmp_path / "versions" / "transaction_v1.avsc").write_text(json.dumps(old))
    store = SchemaStore(tmp_path)
    old_value = AvroSerializer("transaction_v1", store=store)({k: v for k, v in TX.items() if k not in ("currency", "merchant")})
    decoded = AvroDeserializer("transaction", store=store)(old_value)
    assert decoded["currency"] == "EUR" and decoded["merchant"] is None  # defaults filled in


def test_a_record_that_violates_the_schema_is_refused_when_writing():
    with pytest.raises(SchemaError, match="does not match"):
        AvroSerializer("transaction")({**TX, "amount": "a lot"})


@pytest.mark.parametrize("value, reason", [
    (b"", "empty"), (b"\x17abc", "magic"), (b"\xc3\x01\x00", "truncated"),
    (b"\xc3\x01" + b"\xee" * 8 + b"\x00", "fingerprint"), (b"\x00\x00\x00\x00\x07abc", "registry"),
])
def test_undecodable_values_raise_a_typed_error_with_the_reason(value, reason):
    with pytest.raises(DecodeError, match=reason):
        AvroDeserializer("transaction")(value)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"", b"\xc3\x01", b"\x00\x00\x00\x00\x01"]))
def test_the_decoder_never_fails_with_anything_but_a_decode_error(data, prefix):
    value = prefix + data
    try:
        rec = AvroDeserializer("transaction")(value)
    except DecodeError:
        return
    assert isinstance(rec, dict)  # only possible when the bytes happen to be a valid record


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=255))
def test_mutating_one_byte_of_a_valid_record_never_crashes_the_decoder(pos, byte):
    value = bytearray(AvroSerializer("transaction")(TX))
    value[pos % len(value)] = byte
    try:
        AvroDeserializer("transaction")(bytes(value))
    except DecodeError:
        pass
