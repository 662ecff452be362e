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

from ctiflow.jobs import kafka
from ctiflow.jobs.kafka import SCHEMAS_TOPIC as TOPIC
from ctiflow.jobs.kafka import publish_schemas as publish
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


def test_an_entry_whose_schema_is_not_its_fingerprints_is_refused(stack):
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
    assert "refused" in got["_undecodable"], got
