"""Application time through Kafka and Spark: CTI import vs min, restart from the checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from integration_tests.harness import job, produce, read, run
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.testing import oracle, workload

pytestmark = [pytest.mark.integration, pytest.mark.spark]

T0 = 1_767_225_600_000


def reference_job(stack, tmp_path, sync: str, fast: str, ref: str, enriched: str) -> object:
    return job(stack, tmp_path / sync, job=f"ref-{sync}",
               sources=[{"name": "tx", "topic": fast, "schema": "transaction", "key_field": "account",
                         "time_field": "event_time", "partitions": 2, "max_offsets_per_trigger": 250,
                         "cti": {"delay": "5s", "flush_at_end": False}},
                        {"name": "accounts", "topic": ref, "schema": "account", "key_field": "account",
                         "time_field": "valid_from", "shape": "edge", "partitions": 2,
                         "cti": {"delay": 0, "policy": "adjust", "flush_at_end": False}}],
               reference={"source": "accounts", "fast": "tx", "join_field": "account", "sync": sync,
                          "output": enriched},
               operators=[{"kind": "passthrough", "output": stack.topic("ref-pt")}],
               outputs={"late": stack.topic("ref-late"), "dead_letter": stack.topic("ref-dlq")})


def test_import_keeps_pace_with_a_silent_reference_stream_and_min_stalls(stack, spark, tmp_path):
    # One version per account at T0, then the reference stream is silent for 20 minutes of
    # application time while transactions keep coming.
    accounts = [{"account": f"acct-{i:04d}", "valid_from": T0, "home_country": "DE", "risk_threshold": 500.0,
                 "tier": "gold"} for i in range(10)]
    txs = [{"id": str(i), "account": f"acct-{i % 10:04d}", "event_time": T0 + 1000 + i * 1200, "type": "purchase",
            "amount": 10.0, "currency": "EUR", "country": "DE", "merchant": None} for i in range(1000)]
    fast, ref = stack.topic("ref-fast"), stack.topic("ref-accounts")
    kafka.create_topics(stack.bootstrap, {fast: 2, ref: 2})
    # uneven: accounts 0-6 on partition 0, 7-9 on partition 1
    partition = lambda i, rec: 0 if int(rec["account"][-4:]) < 7 else 1  # noqa: E731
    produce(stack.bootstrap, ref, "account", accounts, "account", partition_of=partition)
    produce(stack.bootstrap, fast, "transaction", txs, "account", partition_of=partition)

    outcome = {}
    for sync in ("import", "min"):
        enriched = stack.topic(f"enriched-{sync}")
        cfg = reference_job(stack, tmp_path, sync, fast, ref, enriched)
        run(cfg, spark)
        outcome[sync] = read(stack, enriched)

    # import: the join's CTI is the fast stream's: everything before its last CTI (per partition
    # the largest start − delay, the min over both) is out, enriched with the reference version,
    # although the reference stream said nothing.
    last_cti = min(max(t["event_time"] for i, t in enumerate(txs) if partition(i, t) == p) for p in (0, 1)) - 5000
    expected = [t for t in txs if t["event_time"] < last_cti]
    assert len(outcome["import"]) == len(expected)
    assert all(not r["reference_missing"] and r["reference_valid_from"] == T0 for r in outcome["import"])
    assert max(r["time"] for r in outcome["import"]) > T0 + 15 * 60_000
    # min: the join waits for the silent reference stream: nothing after its CTI comes out.
    assert outcome["min"] == []


CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


@pytest.mark.parametrize("changelog,long_buffer,layout", [(("true", "true"), False, 3), (("false", "true"), False, 3),
                                                          (("true", "false"), False, 3), (("true", "true"), True, 3),
                                                          (("true", "true"), True, 2)],
                         ids=["changelog-on", "checkpoint-without-changelog-then-on", "with-changelog-then-off",
                              "long-buffer", "state-layout-2-long-buffer"])
def test_restart_from_the_checkpoint_continues_the_operator_state(stack, spark, tmp_path, changelog, long_buffer,
                                                                  layout):
    """Also across RocksDB changelog checkpointing turned on (ctiflow's default since 2026-11-26:
    a checkpoint of an earlier version) or off (a deployment's ``spark.conf``) between runs; with
    a reorder buffer of 16,000 events or more (a 1 h CTI delay), stored apart from the header in
    parts (ctiflow.jobs.state.parts) when the first run stops; and in a checkpoint of state layout 2
    (three state variables, before 2026-11-26), which keeps its layout."""
    try:
        _restart(stack, spark, tmp_path, changelog, long_buffer, layout)
    finally:
        spark.conf.set(CHANGELOG, "true")


def _restart(stack, spark, tmp_path, changelog, long_buffer=False, layout=3):
    # The first run stops after max_batches, polled every 0.5 s: a batch or two more may finish
    # before the stop, so the topic holds well over 4 batches (40,000 = 10 batches of 4,000; the
    # 16,000+ events buffered at the stop, in one key group, are several parts of the buffer).
    n, rate, delay, per_batch = (40_000, 10.0, 3_600_000, 4000) if long_buffer else (1500, 0.5, 360_000, 100)
    flows = workload.flows(n, devices=5, seed=21, rate_per_s=rate)
    src, final = stack.topic("restart-in"), stack.topic("restart-final")
    kafka.create_topics(stack.bootstrap, {src: 2})
    partition = lambda key: 0 if key in ("dev-000", "dev-001", "dev-002") else 1  # noqa: E731 - 3 : 2 devices
    produce(stack.bootstrap, src, "flow", flows, "device", partition_of=lambda i, rec: partition(rec["device"]))
    cfg = job(stack, tmp_path, job="restart",
              sources=[{"name": "flows", "topic": src, "schema": "flow", "key_field": "device",
                        "time_field": "start_time", "end_field": "end_time", "shape": "interval", "partitions": 2,
                        "measures": ["bytes", "packets"], "max_offsets_per_trigger": per_batch,
                        "cti": {"delay": delay, "policy": "drop", "idle_timeout": "1h"}}],
              operators=[{"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes"],
                          "outputs": {"final": final}}],
              outputs={"late": stack.topic("restart-late"), "dead_letter": stack.topic("restart-dlq")},
              spark={"trigger": "500ms", **({"key_groups": 1} if long_buffer else {})})
    if layout != 3:  # a checkpoint started by the ctiflow of that layout
        from ctiflow.jobs.driver.checkpoint import CheckpointDir, group_labels, state_layout
        groups = Path(cfg.spark.checkpoint) / "ctiflow-groups.json"
        checkpoint = CheckpointDir.of(cfg.spark.checkpoint, spark)
        group_labels(cfg.key_groups, int(spark.conf.get("spark.sql.shuffle.partitions")), checkpoint)
        saved = json.loads(checkpoint.read_text(groups.name))  # (Hadoop's local files carry a checksum file)
        checkpoint.write_text(groups.name, json.dumps({**saved, "state_layout": layout}))
        assert state_layout(checkpoint) == layout
    # First run: a continuous query stopped part-way (graceful stop), nothing flushed yet.
    spark.conf.set(CHANGELOG, changelog[0])
    first = run(cfg, spark, until_end=False, max_batches=4, timeout=60)
    partial = read(stack, final)
    assert 0 < first.records < len(flows)
    if long_buffer:  # the buffer is in parts beside the header (Spark's state data source reads them)
        from ctiflow.jobs.state.parts import PART_KEYS

        reader = spark.read.format("statestore").option("path", cfg.spark.checkpoint)
        entries = reader.option("stateVarName", "chunks" if layout == 2 else "state").load()
        parts = entries.where(entries.user_map_key.chunk >= PART_KEYS).collect()
        assert len(parts) >= 2
    # Second run from the checkpoint: bounded, drains and flushes.
    spark.conf.set(CHANGELOG, changelog[1])
    run(cfg, spark)
    got = read(stack, final)
    assert len(got) > len(partial)
    events = oracle.to_events(flows, "device", "start_time", "end_time", partition_of=partition)
    checked = oracle.check(events, delay, batches=oracle.spread_batches(events, per_batch))
    expected = oracle.final_bins(checked, 60_000, 0, ["bytes"])
    assert len(got) == len(expected)  # every bin exactly once across the restart
    for r in got:
        assert math.isclose(r["measures"]["bytes"], float(expected[(r["key"], r["bin_start"])].measures["bytes"]),
                            rel_tol=1e-9, abs_tol=1e-6)
