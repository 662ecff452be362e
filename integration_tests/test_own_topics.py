"""The job's own topics against a real broker: records ctiflow did not write in the progress
and marker topics are skipped with a warning, a deleted progress or marker topic is created
again, and the results stay exactly-once — first each reader and writer alone (no Spark), then a
real job whose progress and marker topics are corrupted and deleted while it runs."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pyarrow as pa
import pytest

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.driver.checkpoint import CounterReader, ProgressLog
from ctiflow.jobs.datapath.sink import KafkaStreamWriter, SinkCommit, began, leave_marker

pytestmark = pytest.mark.integration

#: Records nobody's sink wrote: binary, text, JSON of other shapes, a marker-like record of the wrong type.
GARBAGE = [(None, b"\xff\x00\x13\x80binary"), (b"0", b"not json {"), (b"1", b"[1, 2, 3]"),
           (b"0", b'{"query": 5, "batch": "x", "task": 0}'), (b"0", b'{"batch": 0, "time": "soon"}')]


def put(bootstrap: str, topic: str, records, partitions=(0,)) -> None:
    prod = kafka.producer(bootstrap)
    for p in partitions:
        for key, value in records:
            kafka.send(prod, topic, value, key, partition=p)
    assert prod.flush(30) == 0


def rows(topic: str, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"topic": [topic] * n, "key": [f"k{i % 7}".encode() for i in range(n)],
                                       "value": [f"v{i}".encode() for i in range(n)], "kind": ["count"] * n})


def values_in(bootstrap: str, topic: str) -> list[bytes]:
    cons = kafka.consumer(bootstrap)
    try:
        return [m.value for p in kafka.topic_partitions(bootstrap, topic)
                for msgs in kafka.read_range(cons, topic, p, 0, kafka.true_end_offset(cons, topic, p, 0)) for m in msgs]
    finally:
        cons.close()


def test_records_that_are_no_markers_are_passed_over_with_a_warning(stack, caplog):
    caplog.set_level(logging.WARNING, "ctiflow.own_topics")
    topic = stack.topic("foreign-markers")
    kafka.create_topics(stack.bootstrap, {topic: 2})
    prod, cons = kafka.producer(stack.bootstrap), kafka.consumer(stack.bootstrap)
    try:
        leave_marker(prod, topic, 2, "q", 3, 1)
        put(stack.bootstrap, topic, GARBAGE, partitions=(1,))      # at the tail, after the marker
        assert began(cons, topic, 2, "q", 3, 1)                    # this task's marker is still found
        assert not began(cons, topic, 2, "q", 4, 1)                # and batch 3's tells batch 4 is new
        put(stack.bootstrap, topic, GARBAGE, partitions=(0,))      # a partition with garbage only
        assert not began(cons, topic, 2, "q", 0, 0)                # a new query's first batch
    finally:
        cons.close()
    warned = [r.getMessage() for r in caplog.records]
    for offset in range(1, 1 + len(GARBAGE)):
        assert sum(f"{topic} partition 1 offset {offset}: skipped a record ctiflow did not write" in w
                   for w in warned) == 1, warned
    assert any(f"{topic} partition 1 offset 1: skipped a record ctiflow did not write (not UTF-8 text" in w
               for w in warned)


def test_a_partition_without_any_marker_of_the_query_is_a_replay_after_its_first_batch(stack):
    """The topic was created again: no marker tells whether batch 5 began, so it is a replay
    (a scan of the result partitions), never a guess that could write records twice."""
    topic = stack.topic("markers-lost")
    kafka.create_topics(stack.bootstrap, {topic: 1})
    cons = kafka.consumer(stack.bootstrap)
    try:
        assert began(cons, topic, 1, "q", 5, 0)
        assert not began(cons, topic, 1, "q", 0, 0)
    finally:
        cons.close()


def test_a_task_that_finds_the_marker_topic_deleted_creates_it_again_and_writes_each_record_once(stack, caplog):
    caplog.set_level(logging.WARNING, "ctiflow.own_topics")
    out, markers = stack.topic("lost-out"), stack.topic("lost-markers")
    kafka.create_topics(stack.bootstrap, {out: 3, markers: 2})
    batch = rows(out, 90)
    opts = {"bootstrap": stack.bootstrap, "topics": json.dumps([out]), "markers": markers, "marker_partitions": "2"}
    assert KafkaStreamWriter(opts).write(iter([batch.slice(0, 35)])).written == 35  # the attempt that died
    kafka.delete_topics(stack.bootstrap, [markers])
    again = KafkaStreamWriter(opts).write(iter([batch]))                         # its retry
    assert (again.written, again.skipped) == (55, 35)
    assert Counter(values_in(stack.bootstrap, out)) == Counter(f"v{i}".encode() for i in range(90))
    assert kafka.list_topics(stack.bootstrap)[markers] == 2
    assert any(f"the marker topic {markers} was missing" in r.getMessage() for r in caplog.records)


def test_a_marker_topic_deleted_while_a_task_reads_it_is_created_again_and_the_task_writes_each_record_once(
        stack, monkeypatch, caplog):
    """The race CI and a loaded machine showed: the task finds the marker topic, and it is deleted
    before the task reads its markers (the job's driver deleted it between two micro-batches while
    the next one ran). The read fails as a topic gone; the task creates the topic again, and with no
    marker left to tell, replays: it writes what the attempt before it did not."""
    from ctiflow.jobs.datapath import sink

    caplog.set_level(logging.WARNING, "ctiflow.own_topics")
    out, markers = stack.topic("race-out"), stack.topic("race-markers")
    kafka.create_topics(stack.bootstrap, {out: 3, markers: 2})
    batch = rows(out, 90)
    opts = {"bootstrap": stack.bootstrap, "topics": json.dumps([out]), "markers": markers, "marker_partitions": "2"}
    assert KafkaStreamWriter(opts).write(iter([batch.slice(0, 40)])).written == 40  # the attempt that died
    found = sink.marker_topic_partitions
    deleted = []

    def found_then_deleted(options):
        got = found(options)
        if not deleted:  # right after the task found it
            kafka.delete_topics(stack.bootstrap, [markers])
            deleted.append(got)
        return got

    monkeypatch.setattr(sink, "marker_topic_partitions", found_then_deleted)
    again = KafkaStreamWriter(opts).write(iter([batch]))  # its retry
    assert deleted == [(2, False)]
    assert (again.written, again.skipped) == (50, 40)
    assert Counter(values_in(stack.bootstrap, out)) == Counter(f"v{i}".encode() for i in range(90))
    assert kafka.list_topics(stack.bootstrap)[markers] == 2
    assert any(f"the marker topic {markers} was missing" in r.getMessage() for r in caplog.records)


def test_the_progress_log_skips_foreign_records_and_reads_a_topic_created_again_from_its_start(stack, caplog):
    caplog.set_level(logging.WARNING, "ctiflow.own_topics")
    topic = stack.topic("progress")
    kafka.create_topics(stack.bootstrap, {topic: 1})

    def progress(batch: int, received: int) -> tuple[bytes, bytes]:
        return str(batch).encode(), json.dumps({"batch": batch, "time": 1.0, "query": "q",
                                                "received": received}).encode()

    put(stack.bootstrap, topic, [progress(0, 5), *GARBAGE, progress(1, 7)])
    log = ProgressLog(stack.bootstrap, topic)
    counters = CounterReader(log)
    assert counters()["received"] == 12
    records, end = log.read(0)
    assert [r["batch"] for r in records] == [0, 1] and end == 2 + len(GARBAGE)
    assert {r.getMessage() for r in caplog.records} == {
        f"warning: {topic} partition 0 offset {o}: skipped a record ctiflow did not write ({why})"
        for o, why in zip(range(1, 6), ["not UTF-8 text: byte 0xff at position 0",
                                        "not JSON: Expecting value: line 1 column 1 (char 0)",
                                        "a JSON list, not an object", "field 'batch' is 'x', not an int",
                                        "no field 'query'"])}
    kafka.delete_topics(stack.bootstrap, [topic])
    kafka.create_topics(stack.bootstrap, {topic: 1})
    put(stack.bootstrap, topic, [progress(2, 11)])
    assert log.read(end) == ([{"batch": 2, "time": 1.0, "query": "q", "received": 11}], 1)
    assert counters()["received"] == 23  # the counters go on from what they had read


def test_the_sinks_commit_creates_a_deleted_progress_topic_again(stack, caplog):
    caplog.set_level(logging.WARNING, "ctiflow.own_topics")
    topic = stack.topic("progress-gone")
    kafka.create_topics(stack.bootstrap, {topic: 1})
    writer = KafkaStreamWriter({"bootstrap": stack.bootstrap, "progress": topic})
    writer.commit([SinkCommit(4, 0, {"received": 4}, "q")], 0)
    kafka.delete_topics(stack.bootstrap, [topic])
    writer.commit([SinkCommit(6, 0, {"received": 6}, "q")], 1)
    records, _ = ProgressLog(stack.bootstrap, topic).read(0)
    assert [(r["batch"], r["received"]) for r in records] == [(1, 6)]
    assert any(f"the progress topic {topic} was missing" in r.getMessage() for r in caplog.records)



T0 = 1_767_225_600_000


def tx(i: int, account: str, t: int) -> dict:
    return {"id": f"tx-{i}", "account": account, "event_time": t, "type": "purchase", "amount": float(i),
            "currency": "EUR", "country": "DE", "merchant": None}


def uneven_input(stack, name: str) -> tuple[list[dict], str]:
    """Transactions over ten minutes in a new three-partition topic ``name``: one event a second in
    partition 0, one every 2.5 s in 1, one every 10 s in 2 (600, 240 and 60), each in time order
    (nothing late); → the events and the topic."""
    from integration_tests.harness import produce

    rates = {0: 1_000, 1: 2_500, 2: 10_000}  # ms between events
    events = [tx(len(rates) * 1000 * p + i, f"acct-{p}-{i % 3}", T0 + i * step)
              for p, step in rates.items() for i in range(600_000 // step)]
    src = stack.topic(name)
    kafka.create_topics(stack.bootstrap, {src: 3})
    produce(stack.bootstrap, src, "transaction", events, "account",
            partition_of=lambda i, rec: int(rec["account"].split("-")[1]))
    return events, src


@pytest.mark.spark
def test_a_job_whose_progress_and_marker_topics_are_corrupted_and_deleted_writes_each_result_once(
        stack, spark, tmp_path, caplog):
    """A passthrough job over three partitions at uneven rates (one event a second, one every
    2.5 s, one every 10 s over the same ten minutes, each in time order: nothing is late), 50
    records a micro-batch (18 batches). While it runs: after batch 1, garbage in the progress topic
    and in every partition of the marker topic (binary, text, JSON of other shapes, a marker of this
    query with a batch that is not a number); after batch 3, both topics deleted; after batch 6,
    garbage in both again, at the first batch that finds both created again. The oracle is the
    input: every transaction id exactly once in the result topic, nothing late or dead-lettered."""
    from integration_tests.harness import job, read, run

    caplog.set_level(logging.WARNING, "ctiflow.own_topics")
    events, src = uneven_input(stack, "own-in")
    out = stack.topic("own-out")
    cfg = job(stack, tmp_path, job=stack.topic("own"),
              sources=[{"name": "tx", "topic": src, "schema": "transaction", "key_field": "account",
                        "time_field": "event_time", "partitions": 3, "max_offsets_per_trigger": 50,
                        "cti": {"delay": "30s"}}],
              operators=[{"kind": "passthrough", "output": out}],
              outputs={"late": stack.topic("own-late"), "dead_letter": stack.topic("own-dlq")})
    done: dict[str, int] = {}

    def garbage(query: str) -> bool:
        """Garbage in both topics if both exist (False if not: Spark reports batches in bursts, so a
        progress after the deletion may be of a batch that ran before it, and nothing has created
        the topics again yet)."""
        present = kafka.list_topics(stack.bootstrap)
        if cfg.progress_topic not in present or cfg.marker_topic not in present:
            return False
        put(stack.bootstrap, cfg.progress_topic, GARBAGE)
        put(stack.bootstrap, cfg.marker_topic, [*GARBAGE, (b"0", json.dumps(
            {"query": query, "batch": "x", "task": 0, "time": 1.0}).encode())],
            partitions=range(present[cfg.marker_topic]))
        return True

    def meddle(progress: dict, _counters: dict) -> None:
        batch = progress["batchId"]
        if batch >= 1 and "garbage" not in done:
            assert garbage(progress["id"]), "the job's own topics exist after its first batch"
            done["garbage"] = batch
        elif batch >= 3 and "deleted" not in done:
            kafka.delete_topics(stack.bootstrap, [cfg.progress_topic, cfg.marker_topic])
            done["deleted"] = batch
        elif batch >= 6 and "again" not in done and garbage(progress["id"]):
            done["again"] = batch

    summary = run(cfg, spark, on_progress=meddle)

    assert set(done) == {"garbage", "deleted", "again"}, done
    assert max(p["batchId"] for p in summary.progress) >= done["again"] + 2  # batches ran after each
    got = Counter(r["id"] for r in read(stack, out))
    assert got == Counter(e["id"] for e in events)  # nothing lost, nothing twice
    assert read(stack, cfg.late_topic) == [] and read(stack, cfg.dead_letter_topic) == []
    warned = [r.getMessage() for r in caplog.records]
    assert any(f"{cfg.progress_topic} partition 0 offset" in w and "skipped a record" in w for w in warned), warned
