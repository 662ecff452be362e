"""Avro serde: both framings, schema resolution, typed errors, and a hypothesis fuzz of the decoder."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.avro.serde import AvroDeserializer, AvroSerializer, SchemaStore, registry_client
from ctiflow.jobs.testing.workload import zigzag
from ctiflow.operators.errors import DecodeError, SchemaError

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


HOSTILE_ARRAY = {"type": "record", "name": "Basket", "fields": [{"name": "items", "type": {"type": "array", "items": "long"}}]}


def _framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def test_with_a_registry_only_the_topics_subject_names_writer_schemas():
    """A record framed with the id of a schema registered for *another* subject is refused, even
    though the registry knows the id: here a 40-byte record whose array claims 2^60 items."""
    from confluent_kafka.schema_registry import Schema

    reg = registry_client("mock://subject-test")
    good = AvroSerializer("transaction", framing="confluent", registry=reg, subject="tx-value")(TX)
    other = reg.register_schema("baskets-value", Schema(json.dumps(HOSTILE_ARRAY), "AVRO"))
    hostile = _framed(other, zigzag(2 ** 60) + b"\x02" * 26)
    assert len(hostile) == 40
    decode = AvroDeserializer("transaction", registry=reg, subject="tx-value")
    assert decode(good) == TX
    with pytest.raises(DecodeError, match=f"schema id {other} is not registered under subject 'tx-value'"):
        decode(hostile)
    # A version registered for the subject after the deserializer started is accepted (the
    # subject's ids are re-read for an id not seen before).
    newer = {**json.loads(default_schema_text("transaction")), "doc": "v2"}
    newer["fields"] = [*newer["fields"], {"name": "channel", "type": ["null", "string"], "default": None}]
    new_id = reg.register_schema("tx-value", Schema(json.dumps(newer), "AVRO"))
    assert new_id != other
    value = _framed(new_id, good[5:] + b"\x00")  # the same fields, then channel: null (union branch 0)
    assert decode(value) == TX


def test_a_forged_array_count_in_the_topics_own_schema_is_bounded_by_the_bytes_left():
    from confluent_kafka.schema_registry import Schema

    reg = registry_client("mock://bound-test")
    own = reg.register_schema("baskets-value", Schema(json.dumps(HOSTILE_ARRAY), "AVRO"))
    decode = AvroDeserializer(None, registry=reg, subject="baskets-value")
    assert decode(_framed(own, zigzag(2) + zigzag(7) + zigzag(-1) + b"\x00")) == {"items": [7, -1]}
    with pytest.raises(DecodeError, match="bytes left"):
        decode(_framed(own, zigzag(2 ** 60) + b"\x02" * 26))


def default_schema_text(name: str) -> str:
    return SchemaStore().get(name).text
