"""The readers of the job's own topics: a record ctiflow did not write — bytes that are not
UTF-8, text that is not JSON, JSON of another shape, a key the value does not name, a schema
whose fingerprint is not its key — is a ForeignRecord saying why, never another exception; the
records the sink and ``publish_schemas`` write are read back as they were written."""

from __future__ import annotations

import json
import logging

import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from ctiflow.jobs.datapath import own_topics
from ctiflow.jobs.datapath.own_topics import ForeignRecord, marker_record, progress_record, schema_entry

#: As the sink's commit writes them (key: the batch id).
PROGRESS = (b"7", b'{"batch": 7, "time": 1767225600.25, "query": "q-1", "written": 12, "received@tx/0": 3}')
#: As a sink task leaves it (key: the task id).
MARKER = (b"2", b'{"query": "q-1", "batch": 7, "task": 2, "time": 1767225600.5}')
SCHEMA = {"type": "record", "name": "Reading", "namespace": "t", "fields": [{"name": "n", "type": "long"}]}


def crc64_avro(schema: dict) -> bytes:
    """The single-object fingerprint of ``schema``: CRC-64-AVRO of its Parsing Canonical Form,
    little-endian (fastavro's, checked against the spec's algorithm in tests/test_serde.py)."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def test_the_sinks_progress_record_reads_back_as_written():
    assert progress_record(*PROGRESS) == {"batch": 7, "time": 1767225600.25, "query": "q-1", "written": 12,
                                          "received@tx/0": 3}


def test_a_replay_marker_reads_back_as_written():
    assert marker_record(*MARKER) == {"query": "q-1", "batch": 7, "task": 2, "time": 1767225600.5}


@pytest.mark.parametrize("read, good", [(progress_record, PROGRESS), (marker_record, MARKER)])
@pytest.mark.parametrize("value, why", [
    (b"\xff\x00\x13garbage", "not UTF-8 text: byte 0xff at position 0"),
    (b"not json {", "not JSON"),
    (b"", "not JSON"),
    (None, "no value"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b'"text"', "a JSON str, not an object"),
    (b"{}", "no field"),
])
def test_bytes_that_are_not_a_json_object_are_foreign(read, good, value, why):
    with pytest.raises(ForeignRecord, match=why):
        read(good[0], value)


@pytest.mark.parametrize("change, why", [
    ({"batch": "7"}, "field 'batch' is '7', not an int"),
    ({"batch": True}, "field 'batch' is True, not an int"),
    ({"query": 5}, "field 'query' is 5, not text"),
    ({"time": "now"}, "field 'time' is 'now', not a number"),
    ({"written": 1.5}, "counter 'written' is 1.5, not an int"),
    ({"written": None}, "counter 'written' is None, not an int"),
    ({"received@tx/0": [3]}, r"counter 'received@tx/0' is \[3\], not an int"),
])
def test_a_progress_record_of_another_shape_is_foreign(change, why):
    record = {**json.loads(PROGRESS[1]), **change}
    with pytest.raises(ForeignRecord, match=why):
        progress_record(PROGRESS[0], json.dumps(record).encode())


def test_a_progress_record_without_its_batch_as_key_is_foreign():
    with pytest.raises(ForeignRecord, match="its key b'8' is not '7'"):
        progress_record(b"8", PROGRESS[1])
    with pytest.raises(ForeignRecord, match="its key None is not '7'"):
        progress_record(None, PROGRESS[1])


@pytest.mark.parametrize("change, why", [
    ({"batch": 7.0}, "field 'batch' is 7.0, not an int"),
    ({"task": -1}, "field 'task' is -1, not a task id"),
    ({"query": None}, "field 'query' is None, not text"),
    ({"time": float("nan")}, "field 'time' is nan, not a number"),
])
def test_a_marker_of_another_shape_is_foreign(change, why):
    record = {**json.loads(MARKER[1]), **change}
    with pytest.raises(ForeignRecord, match=why):
        marker_record(MARKER[0], json.dumps(record).encode())


def test_a_marker_whose_key_is_not_its_task_is_foreign():
    with pytest.raises(ForeignRecord, match="its key b'3' is not '2'"):
        marker_record(b"3", MARKER[1])


def entry(schema: dict, name: str = "reading") -> bytes:
    return json.dumps({"name": name, "schema": json.dumps(schema)}).encode()


def test_a_schema_entry_under_its_fingerprint_reads_back():
    key = crc64_avro(SCHEMA)
    stored = schema_entry(key, entry(SCHEMA))
    assert (stored.name, stored.fingerprint, json.loads(stored.text)) == ("reading", key, SCHEMA)


def test_a_schema_entry_under_another_schemas_fingerprint_is_foreign():
    other = {**SCHEMA, "fields": [{"name": "n", "type": "long"}, {"name": "m", "type": "string"}]}
    key = crc64_avro(SCHEMA)
    with pytest.raises(ForeignRecord, match=f"has fingerprint {crc64_avro(other).hex()}, "
                                            f"not its key {key.hex()}"):
        schema_entry(key, entry(other))


@pytest.mark.parametrize("key, value, why", [
    (b"12345678", b"\xc3\x01\x00", "not UTF-8 text"),
    (b"12345678", b"{]", "not JSON"),
    (b"12345678", b'{"name": "x"}', "no field 'schema'"),
    (b"12345678", b'{"name": "", "schema": "{}"}', "field 'name' is '', not a schema name"),
    (b"12345678", b'{"name": "x", "schema": {"type": "long"}}', "not a schema's Avro JSON as text"),
    (b"12345678", b'{"name": "x", "schema": "{\\"type\\": \\"nothing\\"}"}', "schema 'x' does not parse"),
    (b"1234", entry(SCHEMA), "its key b'1234' is not a fingerprint"),
    (None, entry(SCHEMA), "its key None is not a fingerprint"),
])
def test_a_schema_entry_that_is_not_one_is_foreign(key, value, why):
    with pytest.raises(ForeignRecord, match=why):
        schema_entry(key, value)


def test_a_skipped_record_is_warned_about_once_with_its_topic_partition_and_offset(caplog):
    caplog.set_level(logging.WARNING, "ctiflow.own_topics")
    for _ in range(3):
        own_topics.skip("j.ctiflow-markers", 2, 41, ForeignRecord("not JSON"))
    own_topics.skip("j.ctiflow-markers", 2, 42, ForeignRecord("not JSON"))
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: j.ctiflow-markers partition 2 offset {o}: skipped a record ctiflow did not write (not JSON)"
        for o in (41, 42)]


def test_a_topic_a_task_could_not_create_again_stops_the_run_with_its_own_line():
    """Spark stops the query with its own exception around the task's Python traceback; the run
    raises the StackError's line (one line at the command line), and anything else stays as it was."""
    from ctiflow.jobs.datapath.own_topics import stack_error_in
    from ctiflow.operators.errors import StackError

    spark_text = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to stage "
                  "failure: Task 1 in stage 4.0 failed 1 times, most recent failure: Lost task 1.0 in stage 4.0 "
                  "(TID 9): org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
                  '  File "/work/main/jobs/sink.py", line 251, in marker_topic_partitions\n'
                  "ctiflow.operators.errors.StackError: the job's marker topic j.ctiflow-markers is missing and "
                  "could not be created again on 127.0.0.1:9092; create it with `ctiflow topics create`\n"
                  "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException")
    error = stack_error_in(RuntimeError(spark_text))
    assert isinstance(error, StackError)
    assert str(error) == ("the job's marker topic j.ctiflow-markers is missing and could not be created again on "
                          "127.0.0.1:9092; create it with `ctiflow topics create`")
    assert stack_error_in(RuntimeError("PythonException: ... TypeError: unsupported operand")) is None
