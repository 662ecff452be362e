"""``ctiflow.jobs.datapath.kafka.produce``: records in order, keyed by their field; bad ones reported by position or raised."""

from __future__ import annotations

import json

import pytest

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.avro.serde import AvroDeserializer, AvroSerializer
from ctiflow.operators.errors import SchemaError

TX = {"id": "t1", "account": "a1", "event_time": 1_767_225_600_000, "type": "purchase", "amount": 1.5,
      "currency": "EUR", "country": "DE", "merchant": None}


class FakeProducer:
    def __init__(self):
        self.sent: list[tuple[str, bytes | None, bytes]] = []

    def produce(self, topic, value=None, key=None):
        self.sent.append((topic, key, value))

    def poll(self, _timeout):
        return 0

    def flush(self, _timeout):
        return 0


@pytest.fixture
def producer(monkeypatch) -> FakeProducer:
    fake = FakeProducer()
    monkeypatch.setattr(kafka, "producer", lambda bootstrap, client=None: fake)
    return fake


def test_json_lines_are_sent_in_order_keyed_by_the_key_field(producer):
    lines = [json.dumps(TX) + "\n", "\n", json.dumps(TX | {"id": "t2", "account": "a2"}) + "\n"]
    done = kafka.produce("b:1", "tx", lines, AvroSerializer("transaction"), "account")
    assert done == kafka.Produced(sent=2, rejected=0, unflushed=0)
    assert [(t, k) for t, k, _ in producer.sent] == [("tx", b"a1"), ("tx", b"a2")]
    assert AvroDeserializer("transaction")(producer.sent[0][2]) == TX


def test_a_null_key_field_and_raw_bytes_are_sent_unkeyed(producer):
    done = kafka.produce("b:1", "tx", [TX, b"not avro"], AvroSerializer("transaction"), "merchant")
    assert done.sent == 2
    assert [(k, v) for _, k, v in producer.sent][1] == (None, b"not avro")
    assert producer.sent[0][1] is None  # merchant is null


def test_a_bad_record_is_reported_with_its_line_number_and_skipped(producer):
    rejected = []
    lines = ["\n", "{not json\n", '{"id": "broken"}\n']
    done = kafka.produce("b:1", "tx", lines, AvroSerializer("transaction"), "account",
                         on_rejected=lambda line, error: rejected.append((line, type(error))))
    assert done == kafka.Produced(sent=0, rejected=2, unflushed=0) and producer.sent == []
    assert [line for line, _ in rejected] == [2, 3] and rejected[1][1] is SchemaError


def test_without_a_rejection_handler_a_bad_record_raises(producer):
    with pytest.raises(SchemaError):
        kafka.produce("b:1", "tx", [{"id": "broken"}], AvroSerializer("transaction"), "account")


def test_partition_of_picks_each_record_s_partition_and_config_reaches_the_producer(monkeypatch):
    """What the load generators need: a record's partition from its index and fields, producer
    settings beside the defaults, and a generator that paces itself consumed as it yields."""
    sent, configs = [], []

    class Partitioned(FakeProducer):
        def produce(self, topic, value=None, key=None, partition=None):
            sent.append((key, partition))

    def make(bootstrap, client=None, **config):
        configs.append(config)
        return Partitioned()

    monkeypatch.setattr(kafka, "producer", make)
    yielded = []

    def paced():
        for i in range(5):
            yielded.append(i)
            assert len(sent) == i  # the previous record went out before this one was made
            yield TX | {"id": f"t{i}", "account": f"a{i % 2}"}

    done = kafka.produce("b:1", "tx", paced(), AvroSerializer("transaction"), "account",
                         partition_of=lambda i, rec: (i + int(rec["account"][1])) % 3, config={"linger.ms": 500})
    assert done.sent == 5 and configs == [{"linger.ms": 500}]
    assert sent == [(b"a0", 0), (b"a1", 2), (b"a0", 2), (b"a1", 1), (b"a0", 1)]
