"""Foundation: valid events come out exactly once; malformed ones land in dead-letter with a reason."""

from __future__ import annotations

import pytest

from integration_tests.harness import job, produce, read, run
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.avro.serde import AvroSerializer

pytestmark = [pytest.mark.integration, pytest.mark.spark]

T0 = 1_767_225_600_000


def transactions(n: int) -> list[dict]:
    return [{"id": f"tx-{i}", "account": f"acct-{i % 37}", "event_time": T0 + i * 100, "type": "purchase",
             "amount": float(i % 500), "currency": "EUR", "country": "DE", "merchant": None} for i in range(n)]


def malformed() -> dict[str, bytes]:
    good = AvroSerializer("transaction")(transactions(1)[0])
    flow = AvroSerializer("flow")({"id": "f", "device": "d", "start_time": 1, "end_time": 2, "bytes": 1.0,
                                   "packets": 1.0, "protocol": "tcp"})
    no_time = AvroSerializer("transaction")({**transactions(1)[0], "event_time": None})
    absurd = AvroSerializer("transaction")({**transactions(1)[0], "event_time": -5})
    return {
        "garbage": b"\x17not avro at all",
        "truncated": good[:15],
        "unknown fingerprint": b"\xc3\x01" + b"\x99" * 8 + good[10:],
        "unknown schema id": b"\x00\x00\x00\x30\x39" + good[10:],
        "wrong schema (a flow on the transactions topic)": flow,
        "missing event time": no_time,
        "absurd event time": absurd,
        "trailing bytes": good + b"\x00\x01",
        "empty": b"",
    }


def test_valid_events_once_bad_ones_dead_lettered(stack, spark, tmp_path):
    src, out = stack.topic("pt-in"), stack.topic("pt-out")
    kafka.create_topics(stack.bootstrap, {src: 2})
    events = transactions(3000)
    bad = malformed()
    produce(stack.bootstrap, src, "transaction", events, "account", raw=list(bad.values()))
    cfg = job(stack, tmp_path, job="pt", sources=[{"name": "tx", "topic": src, "schema": "transaction",
                                                   "key_field": "account", "time_field": "event_time",
                                                   "max_offsets_per_trigger": 1000, "cti": {"delay": "1h"}}],
              operators=[{"kind": "passthrough", "output": out}],
              outputs={"late": stack.topic("pt-late"), "dead_letter": stack.topic("pt-dlq")})
    summary = run(cfg, spark)

    got = read(stack, out)
    ids = [r["id"] for r in got]
    assert sorted(ids) == sorted(e["id"] for e in events)  # every valid event, exactly once
    assert got[0].keys() == events[0].keys()
    dead = read(stack, cfg.dead_letter_topic)
    assert sorted(d["value"] for d in dead) == sorted(bad.values())
    for d in dead:
        assert d["source_topic"] == src and d["error"] and d["stage"] in ("decode", "validate")
    reasons = {d["value"]: d["error"] for d in dead}
    assert "fingerprint" in reasons[bad["unknown fingerprint"]]
    assert "event time" in reasons[bad["missing event time"]]
    assert "absurd" in reasons[bad["absurd event time"]]
    assert "trailing" in reasons[bad["trailing bytes"]]
    assert read(stack, cfg.late_topic) == []
    c = summary.counters
    assert c["received"] == len(events) + len(bad) == c["released"] + c["late"] + c["dead_letter"]


def test_missing_topic_is_a_clear_error_before_spark(stack, spark, tmp_path):
    from ctiflow.operators.errors import StackError

    cfg = job(stack, tmp_path, job="missing", sources=[{"name": "tx", "topic": stack.topic("nope"),
                                                        "schema": "transaction", "key_field": "account",
                                                        "time_field": "event_time"}],
              operators=[{"kind": "passthrough", "output": stack.topic("x")}])
    with pytest.raises(StackError, match="does not exist"):
        run(cfg, spark)


@pytest.mark.parametrize("groups,partitions", [(8, 2), (16, 4), (6, 4)])
def test_key_groups_spread_evenly_over_the_stateful_partitions(spark, tmp_path, groups, partitions):
    """Spark's own partitioner (repartition by the label column, as the stateful operator's
    shuffle does) puts the groups' labels evenly on the partitions: no core gets 5/8 of the work."""
    from pyspark.sql import functions as F

    from ctiflow.jobs.driver.checkpoint import CheckpointDir, group_labels

    labels = group_labels(groups, partitions, CheckpointDir.of(tmp_path, spark))
    assert len(set(labels)) == groups
    rows = (spark.createDataFrame([(lbl,) for lbl in labels], "meta_group int").repartition(partitions, "meta_group")
            .select(F.spark_partition_id().alias("p")).collect())
    counts = [sum(1 for r in rows if r.p == p) for p in range(partitions)]
    assert max(counts) - min(counts) <= 1, counts
    # Kept with the checkpoint: the same labels on restart, whatever the partition count now.
    assert group_labels(groups, partitions + 1, CheckpointDir.of(tmp_path, spark)) == labels



def test_late_records_of_an_identity_job_carry_the_fields_its_packs_left_out(stack, spark, tmp_path):
    """An identity job's packs carry records' bytes, not their fields (no operator reads them):
    the late topic still gets every late record's fields as they were produced. Three partitions
    at uneven rates, disorder within the delay, stragglers an hour behind at the end of each."""
    import json
    import random

    rnd = random.Random(7)
    sizes = {0: 600, 1: 250, 2: 90}
    events, stragglers, where = [], [], {}
    for p, n in sizes.items():
        step = 36_000_000 // n  # each partition spans the same ten hours at its own rate
        for i in range(n):
            rec = {"id": f"p{p}-{i}", "account": f"acct-{rnd.randrange(23)}", "event_time": T0 + i * step - rnd.randrange(2000),
                   "type": rnd.choice(["purchase", "refund"]), "amount": round(rnd.uniform(1, 900), 2),
                   "currency": "EUR", "country": rnd.choice(["DE", "FR"]), "merchant": rnd.choice([None, "m-1", "m-2"])}
            events.append(rec)
            where[rec["id"]] = p
        for j in range(3):
            rec = {**events[-1], "id": f"late-p{p}-{j}", "event_time": T0 - 3_600_000 + j, "merchant": [None, "x", "y"][j]}
            stragglers.append(rec)
            where[rec["id"]] = p
    src, out = stack.topic("ptl-in"), stack.topic("ptl-out")
    kafka.create_topics(stack.bootstrap, {src: 3})
    produce(stack.bootstrap, src, "transaction", events + stragglers, "account",
            partition_of=lambda i, rec: where[rec["id"]])
    cfg = job(stack, tmp_path, job="ptl", sources=[{"name": "tx", "topic": src, "schema": "transaction",
                                                    "key_field": "account", "time_field": "event_time",
                                                    "max_offsets_per_trigger": 200, "cti": {"delay": "5s"}}],
              operators=[{"kind": "passthrough", "output": out}],
              outputs={"late": stack.topic("ptl-late"), "dead_letter": stack.topic("ptl-dlq")})
    run(cfg, spark)

    late = read(stack, cfg.late_topic)
    expected = {r["id"]: json.dumps(r, default=str, sort_keys=True) for r in stragglers}
    got = {json.loads(r["fields_json"])["id"]: r["fields_json"] for r in late}
    assert got == expected
    assert {(r["partition"], r["offset"]) for r in late} == {(p, sizes[p] + j) for p in sizes for j in range(3)}
    passed = read(stack, out)
    assert sorted(r["id"] for r in passed) == sorted(r["id"] for r in events)
    for key in {r["account"] for r in passed}:
        times = [r["event_time"] for r in passed if r["account"] == key]
        assert times == sorted(times)
