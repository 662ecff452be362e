"""Nothing lost, nothing twice: crash loop with SIGKILL, and ≥ 10,000 malformed records."""

from __future__ import annotations

import json
import math
import os
import urllib.parse
from collections import Counter
from pathlib import Path

import pyspark
import pytest
from confluent_kafka import TopicPartition

from ctiflow.bench.chaos import crash_loop, kill_when
from integration_tests.harness import job, produce, read, run
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.testing import oracle, workload

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PATTERN = {"within_ms": 120_000, "skip": "skip_past_last_event",
           "stages": [{"name": "big", "where": "bytes > 40000"},
                      {"name": "small", "contiguity": "followed_by", "where": "bytes < 1000"}]}


#: 48 micro-batches, and kills between 6 and 24 s after each start (a JVM takes ≈ 7 s to
#: start here): enough work left that all ten kills land before the input is done. A killed run
#: gets a few batches through; 24 batches with kills up to 32 s ran out after 9 kills once the
#: source got faster (and 16 batches did with another seed before that).
PER_BATCH = 50
KILL_WINDOW = (6.0, 24.0)


def uneven(key: str) -> int:
    """Three partitions at uneven rates: devices 0–3 on partition 0, 4 on 1, the rest on 2."""
    n = int(key.rsplit("-", 1)[1])
    return 0 if n < 4 else 1 if n == 4 else 2


def two_uneven(key: str) -> int:
    """Two partitions at uneven rates: devices 0–3 on partition 0, the rest on 1."""
    return min(uneven(key), 1)


def test_results_are_exactly_once_across_repeated_sigkills(stack, tmp_path):
    exactly_once_across_sigkills(stack, tmp_path, "chaos", {"checkpoint": str(tmp_path / "checkpoint")}, kills=10)


def test_exactly_once_with_the_checkpoint_on_an_object_store_python_cannot_reach(stack, tmp_path):
    """The checkpoint on a Hadoop file system with an object store's semantics — no directories,
    objects appear whole on close, rename is copy-then-delete (not atomic) — registered under its
    own scheme from a class compiled now (integration_tests/objectstore): nothing ctiflow keeps
    can go through Python's ``open()``; it goes through Spark's CheckpointFileManager or Kafka.
    The SIGKILL loop's results are still exact."""
    import shutil
    import subprocess

    from ctiflow.jobs.driver.jvm import java_environment

    java_environment()
    javac = shutil.which("javac") or str(Path(os.environ["JAVA_HOME"]) / "bin" / "javac")
    jars = Path(pyspark.__file__).parent / "jars"
    classes = tmp_path / "classes"
    source = Path(__file__).parent / "objectstore" / "ObjectStoreFileSystem.java"
    subprocess.run([javac, "-d", str(classes), "-cp", f"{jars}/*", str(source)], check=True, timeout=120)
    objects = tmp_path / "objects"
    spark = {"checkpoint": "objstore://bucket/jobs/chaos-objstore",
             "conf": {"spark.driver.extraClassPath": str(classes), "spark.executor.extraClassPath": str(classes),
                      "spark.hadoop.fs.objstore.impl": "ObjectStoreFileSystem",
                      "spark.hadoop.fs.objstore.root": str(objects)}}
    exactly_once_across_sigkills(stack, tmp_path, "chaos-objstore", spark, kills=4)
    names = [urllib.parse.unquote(p.name) for p in objects.iterdir() if not p.name.startswith(".")]
    assert any(n.startswith("bucket/jobs/chaos-objstore/offsets/") for n in names)  # Spark's log is there
    assert "bucket/jobs/chaos-objstore/ctiflow-groups.json" in names                  # and ctiflow's files
    assert not [p for p in tmp_path.rglob("ctiflow-*") if "objects" not in p.parts]   # nothing on a local path


def exactly_once_across_sigkills(stack, tmp_path, name: str, spark: dict, kills: int) -> None:
    flows = workload.flows(2400, devices=8, seed=31, rate_per_s=0.5, late_fraction=0.02, late_by_ms=900_000)
    src = stack.topic(f"{name}-in")
    topics = {"counts": stack.topic(f"{name}-counts"), "matches": stack.topic(f"{name}-matches"),
              "final": stack.topic(f"{name}-final"), "incremental": stack.topic(f"{name}-inc"),
              "late": stack.topic(f"{name}-late"), "dlq": stack.topic(f"{name}-dlq")}
    kafka.create_topics(stack.bootstrap, {src: 3})
    produce(stack.bootstrap, src, "flow", flows, "device", partition_of=lambda i, rec: uneven(rec["device"]))
    spec = {"job": name, "kafka": {"bootstrap_servers": stack.bootstrap},
            "sources": [{"name": "flows", "topic": src, "schema": "flow", "key_field": "device",
                         "time_field": "start_time", "end_field": "end_time", "shape": "interval", "partitions": 3,
                         "measures": ["bytes", "packets"], "max_offsets_per_trigger": PER_BATCH,
                         # the oracle does not model idleness: no partition may go idle during the run
                         "cti": {"delay": "6m", "policy": "drop", "idle_timeout": "1h"}}],
            "operators": [
                {"kind": "count", "name": "flows_per_device_10m", "window": {"time": "10m"}, "epsilon": 0.1,
                 "per_key": True, "emit": "per_event", "output": topics["counts"]},
                {"kind": "match", "name": "big-then-small", "pattern": PATTERN, "output": topics["matches"]},
                {"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes"],
                 "outputs": {"final": topics["final"], "incremental": topics["incremental"]}}],
            "outputs": {"late": topics["late"], "dead_letter": topics["dlq"]},
            "spark": {**spark, "key_groups": 4}}
    report = crash_loop(spec, tmp_path, kills=kills, seed=7, window=KILL_WINDOW)
    print(f"\n[{name}] kills survived: {report.kills} at {report.kill_times} s; runs: {report.runs}")
    assert report.kills >= kills and report.final_returncode == 0

    # Each batch's cut over the three partitions follows from the offsets alone, so the replays
    # and re-plans of the crash loop cut where one uninterrupted run does.
    events = oracle.to_events(flows, "device", "start_time", "end_time", partition_of=uneven)
    checked = oracle.check(events, 360_000, batches=oracle.spread_batches(events, PER_BATCH))
    admitted = oracle.admitted(checked)
    # Counts: one record per admitted event, each within the bound of the exact count.
    counts = read(stack, topics["counts"])
    exact = oracle.sliding_counts(checked, "time", 600_000)
    assert len(counts) == len(exact) == len(admitted)
    assert Counter((r["key"], r["time"]) for r in counts) == Counter((e["key"], e["time"]) for e in exact)
    for r in counts:
        assert r["lower"] <= r["upper"]
    # Bins: every final bin exactly once with the oracle's value; incremental adds up to it.
    expected = oracle.final_bins(checked, 60_000, 0, ["bytes"])
    final = read(stack, topics["final"])
    assert sorted((r["key"], r["bin_start"]) for r in final) == sorted(expected)
    for r in final:
        assert math.isclose(r["measures"]["bytes"], float(expected[(r["key"], r["bin_start"])].measures["bytes"]),
                            rel_tol=1e-9, abs_tol=1e-6)
    inc = Counter()
    for r in read(stack, topics["incremental"]):
        inc[(r["key"], r["bin_start"])] += r["measures"]["bytes"]
    for k, e in expected.items():
        assert math.isclose(inc[k], float(e.measures["bytes"]), rel_tol=1e-9, abs_tol=1e-6)
    # Matches: the in-order stepwise run of the same pattern.
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
    from ctiflow.operators.time import CTI_INFINITY, Event

    stepwise = MatchOperator(MatchSettings(pattern=PATTERN, name="big-then-small", emit_timed_out=False))
    want = []
    for c in sorted(admitted, key=lambda c: c.order):
        want += stepwise.process(Event(c.key, c.start, c.end, dict(c.fields), c.event.partition, c.event.offset))
    want += stepwise.advance_to(CTI_INFINITY)
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.recognize import job_schema_store

    store = job_schema_store(parse(spec, name))  # the job (other processes) derived the match schema
    got = read(stack, topics["matches"], store)
    assert Counter(r["match_id"] for r in got) == Counter(o.record["match_id"] for o in want if o.role == "match")
    # Late: exactly the oracle's late events, once each.
    late = read(stack, topics["late"])
    assert any(c.status == oracle.LATE for c in checked), "the workload must hold late events to check them"
    assert sorted((r["partition"], r["offset"]) for r in late) == \
        sorted((c.event.partition, c.event.offset) for c in checked if c.status == oracle.LATE)
    # The counters after the kills say what the topics hold: records per result topic, and the
    # input's balance (every record read once: released, late or dead-lettered).
    from ctiflow.jobs.driver.checkpoint import ProgressLog, read_counters
    from ctiflow.jobs.core.counters import key

    totals = read_counters(ProgressLog.of(parse(spec, name)))
    for topic in topics.values():
        records = len(read(stack, topic, store))
        assert totals.get(key("written", topic), 0) == records, topic
    assert totals["received"] == len(flows) == totals["released"] + totals["late"] + totals["dead_letter"]


def test_a_batch_the_sink_committed_but_spark_did_not_is_replayed_once(stack, spark, tmp_path):
    """The narrowest kill window, made deterministic: Spark calls the sink's commit, then
    writes its commit log. A checkpoint whose last batch has offsets but no commit is what a
    kill in between leaves; the restart replays that batch, and no result may land twice.
    The batch is a drain's flush (no new data, so no later batch cleans up after it)."""
    from ctiflow.jobs.driver.checkpoint import ProgressLog, read_counters

    flows = workload.flows(900, devices=6, seed=5, rate_per_s=0.5)
    src = stack.topic("window-in")
    outs = {"counts": stack.topic("window-counts"), "final": stack.topic("window-final")}
    kafka.create_topics(stack.bootstrap, {src: 1})
    produce(stack.bootstrap, src, "flow", flows, "device")

    def config(flush: bool):
        return job(stack, tmp_path, job="window",
                   sources=[{"name": "flows", "topic": src, "schema": "flow", "key_field": "device",
                             "time_field": "start_time", "end_field": "end_time", "shape": "interval",
                             "partitions": 1, "measures": ["bytes"], "max_offsets_per_trigger": 300,
                             "cti": {"delay": "6m", "flush_at_end": flush}}],
                   operators=[{"kind": "count", "name": "per_device", "window": {"time": "10m"}, "per_key": True,
                               "emit": "per_event", "output": outs["counts"]},
                              {"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes"],
                               "outputs": {"final": outs["final"]}}],
                   outputs={"late": stack.topic("window-late"), "dead_letter": stack.topic("window-dlq")})

    run(config(flush=False), spark)                         # everything read, results still pending
    drain = run(config(flush=True), spark)                  # one batch: the flush
    assert drain.batches == 1
    progress, commits = ProgressLog.of(config(True)), tmp_path / "checkpoint" / "commits"
    last = max(int(f.name) for f in commits.glob("[0-9]*"))
    first = read_counters(progress, {last})
    assert first["written"] > 0
    before = {name: read(stack, t) for name, t in outs.items()}
    counters = read_counters(progress)
    (commits / str(last)).unlink()                          # the kill came before Spark's commit log
    (commits / f".{last}.crc").unlink()                     # (Hadoop's checksum goes with its file)
    run(config(flush=True), spark)
    assert (commits / str(last)).exists()                   # Spark replayed the batch
    for name, t in outs.items():
        assert Counter(map(repr, read(stack, t))) == Counter(map(repr, before[name])), name
    again = read_counters(progress, {last})
    assert (again["written"], again["replay_skipped"]) == (0, first["written"])
    # The replay's counters stand for the batch: per topic, its records, whoever wrote them.
    per_topic = {k: v for k, v in first.items() if k.startswith("written@")}
    assert per_topic and {k: again[k] for k in per_topic} == per_topic
    # Records name their query by the id the checkpoint keeps (what a replay matches them by).
    from ctiflow.jobs.datapath.sink import H_QUERY

    query = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    cons = kafka.consumer(stack.bootstrap)
    end = kafka.true_end_offset(cons, outs["final"], 0, 0)
    assert {dict(m.headers)[H_QUERY].decode() for msgs in kafka.read_range(cons, outs["final"], 0, 0, end)
            for m in msgs} == {query}
    cons.close()
    after = read_counters(progress)
    assert {k: after[k] for k in ("received", "released", "late")} == {k: counters[k] for k in ("received", "released", "late")}


def test_a_kill_after_the_first_batchs_state_but_before_its_commit_lands_once(stack, tmp_path):
    """Killed while batch 0's results land (nothing committed yet), and more input arrives
    before the restart: the restart drops only uncommitted operator state and replays batch 0
    over the offsets it logged (re-planned, it would take the new input too, and its results
    would no longer match what landed). Results: each exactly once, equal to the oracle."""
    flows = workload.flows(800, devices=6, seed=8, rate_per_s=0.5)
    src = stack.topic("first-in")
    outs = {"counts": stack.topic("first-counts"), "final": stack.topic("first-final")}
    kafka.create_topics(stack.bootstrap, {src: 2, outs["counts"]: 2})  # watched below before the job runs
    on = lambda i, rec: two_uneven(rec["device"])  # noqa: E731
    produce(stack.bootstrap, src, "flow", flows[:600], "device", partition_of=on)
    checkpoint = tmp_path / "checkpoint"
    spec = {"job": "first", "kafka": {"bootstrap_servers": stack.bootstrap},
            "sources": [{"name": "flows", "topic": src, "schema": "flow", "key_field": "device",
                         "time_field": "start_time", "end_field": "end_time", "shape": "interval", "partitions": 2,
                         "measures": ["bytes"], "cti": {"delay": "6m", "idle_timeout": "1h"}}],
            "operators": [{"kind": "count", "name": "per_device", "window": {"time": "10m"}, "per_key": True,
                           "emit": "per_event", "output": outs["counts"]},
                          {"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes"],
                           "outputs": {"final": outs["final"]}}],
            "outputs": {"late": stack.topic("first-late"), "dead_letter": stack.topic("first-dlq")},
            "spark": {"checkpoint": str(checkpoint), "key_groups": 4, "shuffle_partitions": 2}}
    killed_at: dict = {}
    watch = kafka.consumer(stack.bootstrap)

    def batch_0_landing_not_committed() -> bool:
        landed = any(watch.get_watermark_offsets(TopicPartition(outs["counts"], p), timeout=5, cached=False)[1] > 0
                     for p in range(2))
        if landed:
            killed_at["committed"] = (checkpoint / "commits" / "0").exists()
        return landed

    def more_input() -> None:
        produce(stack.bootstrap, src, "flow", flows[600:], "device", partition_of=on)

    # A continuous run (no drain: batch 0 carries no final CTI), killed; more input; a drain.
    assert kill_when(spec, tmp_path, batch_0_landing_not_committed, until_end=False, then=more_input) == 0
    watch.close()
    assert killed_at == {"committed": False}                 # the kill hit the window it aims at
    events = oracle.to_events(flows, "device", "start_time", "end_time", partition_of=two_uneven)
    checked = oracle.check(events, 360_000, batches=[0 if i < 600 else 1 for i in range(len(flows))])
    counts = read(stack, outs["counts"])
    assert Counter((r["key"], r["time"]) for r in counts) == Counter((c.key, c.start) for c in oracle.admitted(checked))
    expected = oracle.final_bins(checked, 60_000, 0, ["bytes"])
    assert Counter((r["key"], r["bin_start"]) for r in read(stack, outs["final"])) == Counter(expected.keys())


def test_ten_thousand_malformed_records_go_to_dead_letter_and_the_job_keeps_running(stack, spark, tmp_path):
    good = workload.transactions(2000, accounts=50, seed=9)
    bad = workload.bad_records(10_000, seed=9)
    src, out = stack.topic("fuzz-in"), stack.topic("fuzz-out")
    kafka.create_topics(stack.bootstrap, {src: 2})
    interleaved = []
    for i, (kind, value) in enumerate(bad):
        interleaved.append(value)
    produce(stack.bootstrap, src, "transaction", good, "account", raw=interleaved)
    cfg = job(stack, tmp_path, job="fuzz",
              sources=[{"name": "tx", "topic": src, "schema": "transaction", "key_field": "account",
                        "time_field": "event_time", "max_offsets_per_trigger": 5000, "cti": {"delay": "1h"}}],
              operators=[{"kind": "passthrough", "output": out}],
              outputs={"late": stack.topic("fuzz-late"), "dead_letter": stack.topic("fuzz-dlq")})
    summary = run(cfg, spark)
    dead = read(stack, cfg.dead_letter_topic)
    assert len(dead) == len(bad)
    assert Counter(d["value"] for d in dead) == Counter(v for _, v in bad)
    assert all(d["error"] and d["stage"] in ("decode", "validate") for d in dead)
    passed = read(stack, out)
    assert sorted(r["id"] for r in passed) == sorted(g["id"] for g in good)
    c = summary.counters
    assert c["received"] == len(good) + len(bad) == c["released"] + c["late"] + c["dead_letter"]


def test_a_30_second_broker_outage_is_waited_out_without_loss_or_duplicates(tmp_path):
    from ctiflow.bench.outage import outage_run
    from ctiflow.jobs.ops import stack as embedded

    port = embedded.free_port()
    bootstrap = f"127.0.0.1:{port}"
    records = workload.transactions(1200, accounts=30, seed=17)
    first, second = records[:600], records[600:]
    spec = {"job": "outage", "kafka": {"bootstrap_servers": bootstrap, "outage_timeout": "120s"},
            "sources": [{"name": "tx", "topic": "outage-in", "schema": "transaction", "key_field": "account",
                         "time_field": "event_time", "partitions": 1, "cti": {"delay": "5s"}}],
            "operators": [{"kind": "passthrough", "output": "outage-out"}],
            "spark": {"checkpoint": str(tmp_path / "checkpoint"), "trigger": "1s", "key_groups": 2}}
    report = outage_run(spec, tmp_path, port, [("outage-in", "transaction", first, "account")],
                        [("outage-in", "transaction", second, "account")], outage=32)
    print(f"\n[outage] broker down for {report.outage_seconds:.0f} s; the job waited and resumed")
    assert report.outage_seconds >= 30
    assert report.before["outage-out"], "results must flow before the outage"
    # Output is lost with tansu's memory at the restart, so what a consumer saw before the
    # outage plus what was written after it must be every event exactly once.
    seen = [r["id"] for r in report.before["outage-out"]] + [r["id"] for r in report.drained["outage-out"]]
    late = [json.loads(r["fields_json"])["id"] for r in report.before["outage.late"] + report.drained["outage.late"]]
    assert Counter(seen + late) == Counter(r["id"] for r in records)
