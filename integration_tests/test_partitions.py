"""CTIs on multi-partition topics, through Kafka and Spark: each partition's CTI is its own
largest start − delay and the stream's CTI the minimum over the partitions that are not idle."""

from __future__ import annotations

import pytest

from integration_tests.harness import job, produce, read, run
from ctiflow.jobs.datapath import kafka

pytestmark = [pytest.mark.integration, pytest.mark.spark]

T0 = 1_767_225_600_000


def tx(i: int, account: str, t: int) -> dict:
    return {"id": f"tx-{i}", "account": account, "event_time": t, "type": "purchase", "amount": 10.0,
            "currency": "EUR", "country": "DE", "merchant": None}


def source(topic: str, delay: str, **cti) -> dict:
    return {"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account", "time_field": "event_time",
            "max_offsets_per_trigger": 100, "cti": {"delay": delay, **cti}}


def test_in_order_events_of_the_denser_partition_are_not_late(stack, spark, tmp_path):
    # The minimal case: key a on partition 0 and key b on partition 1, 100 and 200
    # events over the same 10 minutes, each partition in time order; 100 records a batch.
    # One global watermark (max start − delay over both) declared 126 of them late.
    a = [tx(i, "a", T0 + i * 6000) for i in range(100)]
    b = [tx(100 + i, "b", T0 + i * 3000) for i in range(200)]
    src, out = stack.topic("mp-in"), stack.topic("mp-out")
    kafka.create_topics(stack.bootstrap, {src: 2})
    produce(stack.bootstrap, src, "transaction", a + b, "account", partition_of=lambda i, rec: 0 if rec["account"] == "a" else 1)
    cfg = job(stack, tmp_path, job="minimal", sources=[source(src, "30s")],
              operators=[{"kind": "passthrough", "output": out}],
              outputs={"late": stack.topic("mp-late"), "dead_letter": stack.topic("mp-dlq")})
    summary = run(cfg, spark)

    assert read(stack, cfg.late_topic) == []
    got = read(stack, out)
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in a + b)
    for key in ("a", "b"):  # per key in application-time order
        times = [r["event_time"] for r in got if r["account"] == key]
        assert times == sorted(times)
    c = summary.counters
    assert c["received"] == 300 and c["released"] == 300 and c["late"] == 0
    assert summary.batches >= 3  # the input really was cut (≥ 100 a batch over 300 records)


def test_an_idle_partition_stops_holding_the_cti_back_and_an_empty_one_never_does(stack, spark, tmp_path):
    # Partition 0: a live producer, 10 minutes of event time over ≈ 20 s; partition 1: the
    # first minute, then nothing; partition 2: empty. A running job with idle_timeout 2 s.
    import threading
    import time

    busy = [tx(i, "a", T0 + i * 1000) for i in range(600)]
    quiet = [tx(1000 + i, "b", T0 + i * 1000) for i in range(60)]
    src, out = stack.topic("idle-in"), stack.topic("idle-out")
    kafka.create_topics(stack.bootstrap, {src: 3})
    on = {"a": 0, "b": 1}
    produce(stack.bootstrap, src, "transaction", quiet + busy[:30], "account", partition_of=lambda i, r: on[r["account"]])

    def live() -> None:
        for lo in range(30, len(busy), 30):
            time.sleep(1.0)
            produce(stack.bootstrap, src, "transaction", busy[lo:lo + 30], "account", partition_of=lambda i, r: 0)

    producer = threading.Thread(target=live, daemon=True)
    cfg = job(stack, tmp_path, job="idle", sources=[{**source(src, "5s", idle_timeout="2s", flush_at_end=False),
                                                     "max_offsets_per_trigger": 1000}],
              operators=[{"kind": "passthrough", "output": out}],
              outputs={"late": stack.topic("idle-late"), "dead_letter": stack.topic("idle-dlq")},
              spark={"trigger": "500ms"})
    producer.start()
    summary = run(cfg, spark, until_end=False, timeout=60)
    producer.join()

    # Without idleness the CTI would stop at partition 1's last start − delay (T0 + 54 s); with
    # it, partition 1 stops holding it back and partition 2 never did: partition 0 decides.
    last_busy = busy[-1]["event_time"]
    assert summary.cti == last_busy - 5000
    got = read(stack, out)
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in busy + quiet if r["event_time"] < last_busy - 5000)
    assert read(stack, cfg.late_topic) == []
