"""The source's per-batch control rows (the CTI's partitions and idle set, the flush flag) go
to every key group."""

import json

import pytest

pytest.importorskip("pyspark")

from ctiflow.jobs.datapath.source.reader import BatchControl, KafkaStreamReader  # noqa: E402

OPTIONS = {"bootstrap": "127.0.0.1:1", "topic": "t", "schema": "transaction", "stream": "tx", "key_field": "account",
           "time_field": "event_time", "key_groups": "3", "group_labels": "[7, 1, 4]"}


def reader() -> KafkaStreamReader:
    return KafkaStreamReader(dict(OPTIONS))


def test_packed_reads_send_one_control_row_to_every_key_group():
    rows = [b.to_pylist() for b in reader().read(BatchControl([0, 1, 2], [2], True))]
    assert len(rows) == 1
    assert sorted(r["meta_group"] for r in rows[0]) == [1, 4, 7]
    for r in rows[0]:
        assert json.loads(r["meta_control"]) == {"partitions": [0, 1, 2], "idle": [2], "flush": True}
        assert r["meta_stream"] == "tx" and r["meta_pack"] is None


def test_the_idle_set_and_flush_marker_are_not_partitions():
    r = reader()
    r._partitions = [0, 1]
    parts = r.partitions({"0": 5, "1": 3}, {"0": 9, "1": 3, "idle": ["1"], "flushed": True})
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 5, 9)]
    control = parts[0].control  # carried by the first range: no task of its own
    assert (control.partitions, control.idle, control.flush) == ([0, 1], [1], True)


def test_the_first_range_carries_the_control_rows_and_a_batch_with_nothing_to_read_gets_a_control_task():
    r = reader()
    r._partitions = [0, 1, 2]
    parts = r.partitions({"0": 0, "1": 0, "2": 0}, {"0": 4, "1": 0, "2": 7})
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 4), (2, 0, 7)]
    assert parts[0].control is not None and parts[1].control is None
    assert parts[0].control.partitions == [0, 1, 2]
    (only,) = r.partitions({"0": 4, "1": 0, "2": 7, "flushed": True}, {"0": 4, "1": 0, "2": 7, "flushed": True})
    assert isinstance(only, BatchControl) and only.partitions == [0, 1, 2] and not only.flush
