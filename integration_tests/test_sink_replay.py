"""Replays, driven directly (no Spark): a micro-batch written in part, then replayed in full,
lands exactly once — recognised by the marker the first attempt left in the job's marker topic,
nothing on a disk; a replayed first batch starts where the first attempt started."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.datapath.sink import KafkaStreamWriter

pytestmark = pytest.mark.integration


def rows(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "topic": ["T"] * n,
        "key": [f"k{i % 7}".encode() for i in range(n)],
        "value": [f"v{i}".encode() for i in range(n)],
        "kind": ["count"] * n,
    })


def values_in(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every record value of ``topic``, partition by partition."""
    cons = kafka.consumer(bootstrap)
    try:
        return [m.value for p in range(partitions)
                for msgs in kafka.read_range(cons, topic, p, 0, kafka.true_end_offset(cons, topic, p, 0)) for m in msgs]
    finally:
        cons.close()


def markers(stack, name: str, partitions: int = 2) -> str:
    topic = stack.topic(name)
    kafka.create_topics(stack.bootstrap, {topic: partitions})
    return topic


def test_a_replayed_batch_skips_exactly_what_the_first_attempt_wrote(stack, tmp_path):
    topic = stack.topic("sink-replay")
    kafka.create_topics(stack.bootstrap, {topic: 3})
    batch = rows(100)
    batch = batch.set_column(0, "topic", pa.array([topic] * 100))
    writer = KafkaStreamWriter({"bootstrap": stack.bootstrap, "topics": json.dumps([topic]),
                                "markers": markers(stack, "sink-replay-markers")})
    first = writer.write(iter([batch.slice(0, 40)]))      # the attempt that "crashed" after 40 records
    assert first.written == 40
    second = writer.write(iter([batch]))                   # Spark replays the whole micro-batch
    assert (second.written, second.skipped) == (60, 40)
    values = values_in(stack.bootstrap, topic, 3)
    assert Counter(values) == Counter(f"v{i}".encode() for i in range(100))


def test_without_the_marker_a_rewrite_would_duplicate(stack, tmp_path):
    """The control: the same two writes with no state directory produce duplicates, so the
    test above really measures the dedup."""
    topic = stack.topic("sink-nodedup")
    kafka.create_topics(stack.bootstrap, {topic: 3})
    batch = rows(50).set_column(0, "topic", pa.array([topic] * 50))
    writer = KafkaStreamWriter({"bootstrap": stack.bootstrap, "topics": json.dumps([topic])})
    writer.write(iter([batch.slice(0, 20)]))
    assert writer.write(iter([batch])).written == 50


def test_a_batch_replayed_after_the_sinks_commit_lands_once(stack, tmp_path):
    """Spark calls the writer's ``commit`` before it writes its own commit log: a kill in
    between replays the whole batch, which must still be recognised as a replay."""
    topic = stack.topic("sink-after-commit")
    kafka.create_topics(stack.bootstrap, {topic: 2})
    batch = rows(30).set_column(0, "topic", pa.array([topic] * 30))
    writer = KafkaStreamWriter({"bootstrap": stack.bootstrap, "topics": json.dumps([topic]),
                                "markers": markers(stack, "sink-after-commit-markers")})
    first = writer.write(iter([batch]))                    # outside Spark the batch id is -1
    writer.commit([first], -1)                             # ... and the kill comes right after
    again = writer.write(iter([batch]))
    assert (again.written, again.skipped) == (0, 30)


def test_another_querys_records_are_not_taken_for_this_batchs(stack, tmp_path):
    """An output topic shared with another job, or one an earlier run wrote with a fresh
    checkpoint (batch ids start again at 0): records with the same batch/task/seq numbers but
    another query id must not be skipped on replay, or results would be lost."""
    from ctiflow.jobs.datapath.sink import H_BATCH, H_QUERY, H_SEQ, H_TASK

    topic = stack.topic("sink-two-queries")
    kafka.create_topics(stack.bootstrap, {topic: 1})
    batch = rows(30).set_column(0, "topic", pa.array([topic] * 30))
    writer = KafkaStreamWriter({"bootstrap": stack.bootstrap, "topics": json.dumps([topic]),
                                "markers": markers(stack, "sink-two-queries-markers")})
    writer.write(iter([batch.slice(0, 10)]))                # this query's attempt dies after 10
    prod = kafka.producer(stack.bootstrap)
    for seq in range(10, 30):                               # the other query's batch -1, task 0
        prod.produce(topic, value=f"other{seq}".encode(), partition=0,
                     headers=[(H_QUERY, b"other"), (H_BATCH, b"-1"), (H_TASK, b"0"), (H_SEQ, str(seq).encode())])
    assert prod.flush(30) == 0
    again = writer.write(iter([batch]))
    assert (again.written, again.skipped) == (20, 10)
    values = values_in(stack.bootstrap, topic, 1)
    assert Counter(v for v in values if v.startswith(b"v")) == Counter(f"v{i}".encode() for i in range(30))


def test_the_first_batchs_start_is_kept_for_its_replay(stack, tmp_path):
    """Spark asks the source for batch 0's start again when it replays batch 0; with
    ``latest`` the answer must still be the first attempt's, not the topic's new end."""
    from ctiflow.jobs.datapath.source.reader import KafkaStreamReader

    topic = stack.topic("source-start")
    kafka.create_topics(stack.bootstrap, {topic: 2})
    prod = kafka.producer(stack.bootstrap)

    def send(n: int) -> None:
        for i in range(n):
            prod.produce(topic, value=b"x", partition=i % 2)
        assert prod.flush(30) == 0

    from ctiflow.jobs.driver.checkpoint import CheckpointDir, start_offsets

    checkpoint = CheckpointDir.of(tmp_path / "checkpoint")
    opts = {"bootstrap": stack.bootstrap, "topic": topic, "startingoffsets": "latest"}

    def reader(checkpoint):  # as the driver builds the source: the start kept with the checkpoint
        if checkpoint is None:
            return KafkaStreamReader(opts, None)
        resolver = KafkaStreamReader(opts, None)
        start = start_offsets(checkpoint, "tx", resolver.resolve_start)
        resolver.stop()
        return KafkaStreamReader({**opts, "start_offsets": json.dumps(start)}, None)

    send(10)
    first = reader(checkpoint)
    assert first.initialOffset() == {"0": 5, "1": 5}
    first.stop()
    send(6)                                                 # the stream goes on during the outage
    again = reader(CheckpointDir.of(tmp_path / "checkpoint"))
    assert again.initialOffset() == {"0": 5, "1": 5}
    again.stop()
    unsaved = reader(None)                                  # the control: latest has moved
    assert unsaved.initialOffset() == {"0": 8, "1": 8}
    unsaved.stop()


def test_a_worker_keeps_its_producer_across_writes_and_drops_it_when_a_write_fails(stack, tmp_path):
    """One producer per Python worker (a fresh idempotent one costs ≈ 0.5 s before its first
    acknowledgement); a write that fails drops it, and the replay still lands each record once."""
    from ctiflow.jobs.datapath import sink

    topic = stack.topic("sink-producer")
    kafka.create_topics(stack.bootstrap, {topic: 3})
    batch = rows(60).set_column(0, "topic", pa.array([topic] * 60))
    opts = {"bootstrap": stack.bootstrap, "topics": json.dumps([topic]), "markers": markers(stack, "sink-keep-markers")}
    key = sink._config_key(stack.bootstrap, {})
    KafkaStreamWriter(opts).write(iter([batch.slice(0, 10)]))
    kept = sink._PRODUCERS[key]
    KafkaStreamWriter(opts).write(iter([batch.slice(0, 20)]))  # (a replay of the same task: skips 10)
    assert sink._PRODUCERS[key] is kept

    def failing():
        yield batch.slice(0, 30)
        raise RuntimeError("the task failed upstream")

    with pytest.raises(RuntimeError, match="upstream"):
        KafkaStreamWriter(opts).write(failing())
    assert key not in sink._PRODUCERS
    KafkaStreamWriter(opts).write(iter([batch]))
    assert sink._PRODUCERS[key] is not kept
    values = values_in(stack.bootstrap, topic, 3)
    assert Counter(values) == Counter(f"v{i}".encode() for i in range(60))


def test_after_a_broker_restart_the_next_write_gets_a_fresh_producer_and_lands(tmp_path):
    """The kept producer outlived its broker (tansu restarted: memory-only, it knows no producer
    id): the client errors it queued while idle retire it, and the next task writes with a new
    one instead of waiting in vain for acknowledgements (the job used to fail after an outage)."""
    import time

    from ctiflow.jobs.datapath import sink
    from ctiflow.jobs.ops import stack as embedded

    port = embedded.free_port()
    bootstrap = f"127.0.0.1:{port}"
    topic = "sink-restart"
    opts = {"bootstrap": bootstrap, "topics": json.dumps([topic]), "markers": "sink-restart-markers"}
    key = sink._config_key(bootstrap, {})
    batch = rows(40).set_column(0, "topic", pa.array([topic] * 40))
    embedded.up(port)
    try:
        kafka.create_topics(bootstrap, {topic: 2, "sink-restart-markers": 1})
        KafkaStreamWriter(opts).write(iter([batch.slice(0, 20)]))
        kept = sink._PRODUCERS[key]
        embedded.down(port)
        time.sleep(3)  # long enough for the idle producer to notice its broker is gone
        embedded.up(port)
        kafka.create_topics(bootstrap, {topic: 2, "sink-restart-markers": 1})
        sink._PARTITIONS.clear()
        KafkaStreamWriter(opts).write(iter([batch.slice(20, 20)]))
        assert sink._PRODUCERS[key] is not kept
        values = values_in(bootstrap, topic, 2)
        assert Counter(values) == Counter(f"v{i}".encode() for i in range(20, 40))
    finally:
        sink.drop_producer(bootstrap, {})
        embedded.down(port)


def test_true_end_offsets_probes_every_partition_at_once_past_the_reported_watermark(stack):
    """The source's planner asks for every partition's end each micro-batch in one probe: each
    answer is the offset after the partition's last record (tansu's high watermark hides the
    tail of the last producer batch), never below the given low mark; an empty partition's end
    is its low mark."""
    topic = stack.topic("true-ends")
    kafka.create_topics(stack.bootstrap, {topic: 4})
    counts = {0: 1500, 1: 7, 2: 0, 3: 300}
    prod = kafka.producer(stack.bootstrap)
    for p, n in counts.items():
        for i in range(n):
            prod.produce(topic, value=f"{p}-{i}".encode(), partition=p)
    assert prod.flush(30) == 0
    cons = kafka.consumer(stack.bootstrap)
    try:
        assert kafka.true_end_offsets(cons, topic, {p: 0 for p in counts}) == counts
        assert kafka.true_end_offsets(cons, topic, {0: 1000, 1: 9, 2: 4, 3: 0}) == {0: 1500, 1: 9, 2: 4, 3: 300}
        for p, n in counts.items():  # the one-partition form agrees
            assert kafka.true_end_offset(cons, topic, p, 0) == n
    finally:
        cons.close()


def test_a_marker_tells_a_tasks_retry_from_its_first_attempt(stack):
    """What the sink asks before it writes: did an attempt of this (query, batch, task) begin?
    A retry (task or stage) or a replay after a restart finds its first attempt's marker; the
    next batch, another task or another query (an earlier checkpoint of the job) do not."""
    from ctiflow.jobs.datapath.sink import began, leave_marker

    topic = markers(stack, "sink-began", partitions=2)
    prod, cons = kafka.producer(stack.bootstrap), kafka.consumer(stack.bootstrap)
    try:
        assert not began(cons, topic, 2, "q", 0, 1)
        leave_marker(prod, topic, 2, "q", 0, 1)
        assert began(cons, topic, 2, "q", 0, 1)             # task 1 of batch 0 again: a retry
        assert not began(cons, topic, 2, "q", 0, 0)         # task 0 has not begun
        assert not began(cons, topic, 2, "q", 1, 1)         # the next batch is new
        assert not began(cons, topic, 2, "other", 0, 1)     # another query's batch 0 is its own
        # more tasks than partitions: task 2 shares task 0's partition, found by reading back
        leave_marker(prod, topic, 2, "q", 0, 2)
        leave_marker(prod, topic, 2, "q", 0, 0)
        assert began(cons, topic, 2, "q", 0, 2) and began(cons, topic, 2, "q", 0, 0)
        leave_marker(prod, topic, 2, "q", 1, 0)
        assert not began(cons, topic, 2, "q", 1, 2)         # read back to batch 0's markers: not begun
        assert began(cons, topic, 2, "q", 1, 0)
    finally:
        cons.close()


def test_a_batch_the_checkpoint_planned_before_the_run_is_a_replay_without_a_marker(stack):
    """A checkpoint of a version that kept its markers on a disk (or a marker topic somebody
    deleted): the batch Spark's offset log had planned before this run is replayed as a replay."""
    topic = stack.topic("sink-planned")
    kafka.create_topics(stack.bootstrap, {topic: 2})
    batch = rows(30).set_column(0, "topic", pa.array([topic] * 30))
    opts = {"bootstrap": stack.bootstrap, "topics": json.dumps([topic]), "markers": markers(stack, "sink-planned-m")}
    KafkaStreamWriter(opts).write(iter([batch.slice(0, 12)]))   # (it leaves a marker: a new version's attempt)
    kafka.delete_topics(stack.bootstrap, [opts["markers"]])
    opts["markers"] = markers(stack, "sink-planned-m2")          # no marker of the first attempt
    assert KafkaStreamWriter({**opts, "replay_through": "-1"}).write(iter([batch])).skipped == 12
