"""The source's per-batch control rows (the CTI's partitions and idle set, the flush flag) go
to every key group."""

import json

import pytest

pytest.importorskip("pyspark")

from ctiflow.jobs.datapath.source.reader import (BatchControl, KafkaStreamReader, OffsetRange, ReadTask,  # noqa: E402
                                                 read_tasks)

OPTIONS = {"bootstrap": "127.0.0.1:1", "topic": "t", "schema": "transaction", "stream": "tx", "key_field": "account",
           "time_field": "event_time", "key_groups": "3", "group_labels": "[7, 1, 4]"}


def reader() -> KafkaStreamReader:
    return KafkaStreamReader(dict(OPTIONS))


def test_packed_reads_send_one_control_row_to_every_key_group():
    rows = [b.to_pylist() for b in reader().read(ReadTask([], BatchControl([0, 1, 2], [2], True)))]
    assert len(rows) == 1
    assert sorted(r["meta_group"] for r in rows[0]) == [1, 4, 7]
    for r in rows[0]:
        assert json.loads(r["meta_control"]) == {"partitions": [0, 1, 2], "idle": [2], "flush": True}
        assert r["meta_stream"] == "tx" and r["meta_pack"] is None


def ranges_of(tasks) -> list[list[tuple[int, int, int]]]:
    return [[(r.partition, r.start, r.end) for r in t.ranges] for t in tasks]


def test_the_idle_set_and_flush_marker_are_not_partitions():
    r = reader()
    r._partitions = [0, 1]
    tasks = r.partitions({"0": 5, "1": 3}, {"0": 9, "1": 3, "idle": ["1"], "flushed": True})
    assert ranges_of(tasks) == [[(0, 5, 9)]]
    control = tasks[0].control  # carried by the first task: no task of its own
    assert (control.partitions, control.idle, control.flush) == ([0, 1], [1], True)


def test_a_small_batch_is_read_in_one_task_carrying_the_control_rows_and_an_empty_one_gets_a_control_task():
    r = reader()
    r._partitions = [0, 1, 2]
    tasks = r.partitions({"0": 0, "1": 0, "2": 0}, {"0": 4, "1": 0, "2": 7})
    assert ranges_of(tasks) == [[(0, 0, 4), (2, 0, 7)]]
    assert tasks[0].control.partitions == [0, 1, 2]
    (only,) = r.partitions({"0": 4, "1": 0, "2": 7, "flushed": True}, {"0": 4, "1": 0, "2": 7, "flushed": True})
    assert only.ranges == [] and only.control.partitions == [0, 1, 2] and not only.control.flush


def test_a_batch_gets_a_task_for_each_task_records_it_fills_up_to_one_a_partition_balanced_by_records():
    control = BatchControl([0, 1, 2, 3], [], False)
    uneven = [OffsetRange(0, 0, 9_000), OffsetRange(1, 100, 1_100), OffsetRange(2, 0, 2_500), OffsetRange(3, 50, 3_050)]
    # 15,500 records: 4 tasks of 4,096 would be 15.1 → 4 tasks, one a range
    assert sorted(map(len, ranges_of(read_tasks(uneven, control, 4_096)))) == [1, 1, 1, 1]
    # 15,500 / 8,000 → 2 tasks: the 9,000-record range alone, the three others (6,500) together
    two = read_tasks(uneven, control, 8_000)
    assert ranges_of(two) == [[(0, 0, 9_000)], [(1, 100, 1_100), (2, 0, 2_500), (3, 50, 3_050)]]
    assert two[0].control is control and two[1].control is None
    # every record read once, whatever the split
    for size in (1, 500, 3_000, 4_096, 100_000):
        got = sorted((r.partition, r.start, r.end) for t in read_tasks(uneven, control, size) for r in t.ranges)
        assert got == sorted((r.partition, r.start, r.end) for r in uneven), size
    # many small partitions: one task
    small = [OffsetRange(p, 10, 250) for p in range(12)]
    assert len(read_tasks(small, control)) == 1
