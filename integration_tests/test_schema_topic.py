"""The schemas topic: a reader that never saw a job decodes the records of schemas the job derived
(published under their fingerprints), and an entry whose schema is not the one its key names is
refused — through ``ctiflow consume`` in a fresh process and through a real job's match records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.datapath.kafka import SCHEMAS_TOPIC as TOPIC
from ctiflow.jobs.datapath.kafka import publish_schemas as publish
from ctiflow.jobs.avro.serde import SCHEMA_DIR, AvroSerializer, SchemaStore

pytestmark = [pytest.mark.integration]


def consume(stack, topic: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "consume", "--topic", topic], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "CTIFLOW_BOOTSTRAP": stack.bootstrap})
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def derived(tag: str) -> dict:
    """A record schema no store has: a fresh name per test run."""
    return {"type": "record", "name": f"Derived{tag}", "namespace": "ctiflow.test",
            "fields": [{"name": "key", "type": "string"}, {"name": "n", "type": "long"}]}


def test_a_reader_decodes_records_of_a_schema_it_only_finds_in_the_schemas_topic(stack):
    tag = uuid.uuid4().hex[:8]
    store = SchemaStore(SCHEMA_DIR)
    name, text = f"match_{tag}", json.dumps(derived(tag))
    store.add(name, text)
    topic = stack.topic(f"derived-{tag}")
    kafka.create_topics(stack.bootstrap, {topic: 2})
    records = [{"key": f"k{i}", "n": i} for i in range(5)]
    kafka.produce(stack.bootstrap, topic, records, AvroSerializer(name, store=store))
    before = consume(stack, topic)
    assert all("_undecodable" in r and "unknown schema fingerprint" in r["_undecodable"] for r in before)
    assert publish(stack.bootstrap, {name: text}) == 1
    assert sorted(consume(stack, topic), key=lambda r: r["n"]) == records


def test_an_entry_whose_schema_is_not_its_fingerprints_is_ignored(stack):
    """No reader decodes with it: with no other entry for the fingerprint the record stays
    undecodable (an unknown fingerprint), not read with the wrong schema."""
    tag = uuid.uuid4().hex[:8]
    store = SchemaStore(SCHEMA_DIR)
    real = store.add(f"real_{tag}", json.dumps(derived(tag)))
    impostor = {**derived(tag), "fields": [{"name": "key", "type": "string"}]}  # fewer fields, another fingerprint
    prod = kafka.producer(stack.bootstrap)
    kafka.send(prod, TOPIC, json.dumps({"name": f"real_{tag}", "schema": json.dumps(impostor)}).encode(),
               key=real.fingerprint)
    assert prod.flush(30) == 0
    topic = stack.topic(f"impostor-{tag}")
    kafka.create_topics(stack.bootstrap, {topic: 1})
    kafka.produce(stack.bootstrap, topic, [{"key": "a", "n": 1}], AvroSerializer(f"real_{tag}", store=store))
    got, = consume(stack, topic)
    assert "unknown schema fingerprint" in got["_undecodable"], got


def test_a_later_impostor_or_garbage_entry_leaves_the_earlier_good_one_standing(stack):
    """A good entry, then under the same key a schema that is not the key's and bytes that are no
    entry at all (somebody else's producer): ``consume`` decodes with the good entry and warns
    about each foreign entry by its offset (the last entry used to win)."""
    tag = uuid.uuid4().hex[:8]
    store = SchemaStore(SCHEMA_DIR)
    name, text = f"good_{tag}", json.dumps(derived(tag))
    real = store.add(name, text)
    assert publish(stack.bootstrap, {name: text}) == 1
    impostor = {**derived(tag), "fields": [{"name": "key", "type": "string"}]}
    prod = kafka.producer(stack.bootstrap)
    kafka.send(prod, TOPIC, json.dumps({"name": name, "schema": json.dumps(impostor)}).encode(), key=real.fingerprint)
    kafka.send(prod, TOPIC, b"\xff\xfe not an entry", key=real.fingerprint)
    assert prod.flush(30) == 0
    topic = stack.topic(f"good-{tag}")
    kafka.create_topics(stack.bootstrap, {topic: 2})
    records = [{"key": f"k{i}", "n": i} for i in range(6)]
    kafka.produce(stack.bootstrap, topic, records, AvroSerializer(name, store=store), "key")
    done = subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "consume", "--topic", topic], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "CTIFLOW_BOOTSTRAP": stack.bootstrap})
    assert done.returncode == 0, done.stderr
    got = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert sorted(got, key=lambda r: r["n"]) == records
    cons = kafka.consumer(stack.bootstrap)
    try:
        end = kafka.true_end_offset(cons, TOPIC, 0, 0)
        ours = [m.offset for msgs in kafka.read_range(cons, TOPIC, 0, 0, end) for m in msgs
                if m.key == real.fingerprint]
    finally:
        cons.close()
    good, impostor_at, garbage_at = ours
    assert f"{TOPIC} partition 0 offset {impostor_at}: skipped a record ctiflow did not write" in done.stderr
    assert f"{TOPIC} partition 0 offset {garbage_at}: skipped a record ctiflow did not write (not UTF-8" \
        in done.stderr
