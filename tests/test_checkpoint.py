"""What a restart reads back: key-group labels (reused, and a changed count refused; their
placement on Spark's partitions is checked against Spark in integration_tests), read and written
through Hadoop's file system in a JVM (:class:`CheckpointDir`), and the per-batch counters of the
progress log."""

import json
from pathlib import Path

import pytest

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.checkpoint import CheckpointDir
from ctiflow.jobs.driver.checkpoint import group_labels as _group_labels
from ctiflow.operators.errors import ConfigError


def cp(path):
    return CheckpointDir.of(path)


def group_labels(groups, partitions, path=None):
    return _group_labels(groups, partitions, None if path is None else cp(path))


def test_the_jvm_a_tool_starts_for_a_checkpoint_logs_where_a_session_on_it_would(tmp_path):
    """A tool reads a checkpoint before any session (``CheckpointDir.of`` without a ``SparkConf``);
    the session a job then starts runs on that JVM, whose logging was fixed at its start. It logs
    to ctiflow's file like a session's (a CI run found Spark's log missing after such a start)."""
    from ctiflow.jobs.driver.jvm import gateway, spark_log_path

    cp(tmp_path / "cp")
    jvm = gateway().jvm
    named = jvm.java.lang.System.getProperty("ctiflow.spark.log")
    assert named and Path(named).parent == spark_log_path().parent, named
    assert str(jvm.java.lang.System.getProperty("log4j2.configurationFile")).endswith("spark-log4j2.properties")


class Lines:
    """A progress log's records in memory (the Kafka topic's reader is tested against a broker)."""

    def __init__(self, records=()):
        self.records = list(records)

    def read(self, start=0):
        return self.records[start:], len(self.records)


def test_labels_are_distinct_and_kept_with_the_checkpoint(tmp_path):
    labels = group_labels(8, 2, tmp_path)
    assert len(set(labels)) == 8
    assert group_labels(8, 4, tmp_path) == labels  # the checkpoint's labels, not recomputed
    assert group_labels(8, 2) == labels  # deterministic


def test_a_changed_key_group_count_is_refused_on_restart(tmp_path):
    group_labels(8, 2, tmp_path)
    with pytest.raises(ConfigError, match="spark.key_groups is 4.*written with 8"):
        group_labels(4, 2, tmp_path)


def test_a_checkpoint_of_the_one_blob_state_layout_is_refused_before_spark(tmp_path):
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1")  # committed before labels existed (one blob per group)
    with pytest.raises(ConfigError, match="earlier ctiflow.*new checkpoint"):
        group_labels(8, 2, tmp_path)
    old = tmp_path / "labelled"
    (old / "commits").mkdir(parents=True)
    (old / "ctiflow-groups.json").write_text(json.dumps({"key_groups": 8, "partitions": 2, "labels": list(range(8))}))
    with pytest.raises(ConfigError, match="earlier ctiflow.*new checkpoint"):
        group_labels(8, 2, old)
    assert group_labels(8, 2, tmp_path / "fresh") != list(range(8))  # 0..7 land 3 : 5 on 2 partitions


def test_a_new_checkpoint_gets_the_current_state_layout_and_an_older_one_keeps_its_own(tmp_path):
    from ctiflow.jobs.driver.checkpoint import STATE_LAYOUT, state_layout

    group_labels(8, 2, tmp_path / "new")
    assert state_layout(cp(tmp_path / "new")) == STATE_LAYOUT == 3
    assert state_layout(cp(tmp_path / "not-started")) == 3
    for layout, expected in ((2, 2), (3, 3)):
        ck = tmp_path / f"layout{layout}"
        (ck / "commits").mkdir(parents=True)
        (ck / "commits" / "4").write_text("v1")
        (ck / "ctiflow-groups.json").write_text(json.dumps({"key_groups": 8, "partitions": 2, "labels": [1] * 8,
                                                            "state_layout": layout}))
        assert group_labels(8, 2, ck) == [1] * 8  # accepted, its labels kept
        assert state_layout(cp(ck)) == expected
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "ctiflow-groups.json").write_text(json.dumps({"key_groups": 8, "partitions": 2, "labels": [1] * 8,
                                                           "state_layout": 4}))
    with pytest.raises(ConfigError, match="newer ctiflow.*state layout 4"):
        group_labels(8, 2, newer)


def test_a_replayed_batchs_counters_count_once(tmp_path):
    """The sink appends a progress line per attempt of a batch; a crash after the first
    attempt's line must not count the replayed batch twice."""
    from ctiflow.jobs.driver.checkpoint import read_counters

    lines = [{"batch": 0, "time": 1.0, "received": 5, "late": 1},
             {"batch": 1, "time": 2.0, "received": 7, "late": 0},
             {"batch": 1, "time": 9.0, "received": 7, "late": 0}]   # batch 1 replayed
    assert read_counters(Lines(lines)) == {"received": 12, "late": 1}
    assert read_counters(Lines(lines), {1}) == {"received": 7, "late": 0}
    # an earlier checkpoint's query in the same topic is not this one's
    older = [{**rec, "query": "q-old", "received": 1000} for rec in lines]
    assert read_counters(Lines(older + [{**rec, "query": "q"} for rec in lines])) == {"received": 12, "late": 1}


def test_state_bytes_is_the_latest_batchs_not_a_sum_over_batches(tmp_path):
    from ctiflow.jobs.driver.checkpoint import read_counters
    from ctiflow.jobs.core.counters import merge as merge_metrics

    per_group = {}
    for group_state in (300, 200):  # two key groups' counters in one batch add up
        merge_metrics(per_group, {"received": 1, "state_bytes": group_state})
    assert per_group == {"received": 2, "state_bytes": 500}
    lines = [{"batch": 1, "time": 2.0, "received": 2, "state_bytes": 900},
             {"batch": 0, "time": 1.0, "received": 2, "state_bytes": 500}]  # out of order on purpose
    assert read_counters(Lines(lines)) == {"received": 4, "state_bytes": 900}


def test_a_checkpoint_killed_before_its_first_commit_keeps_its_offset_log(tmp_path):
    """Only the uncommitted operator state goes (Spark refuses to plan batch 0 over it); the
    logged offsets stay, so batch 0 is replayed over the same records, not re-planned."""
    from ctiflow.jobs.driver.checkpoint import reset_uncommitted_checkpoint

    for name in ("offsets/0", "state/0/0/1.zip", "ctiflow-start-tx.json", "ctiflow-groups.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "commits").mkdir()
    assert reset_uncommitted_checkpoint(cp(tmp_path))
    assert not (tmp_path / "state").exists()
    assert all((tmp_path / n).exists() for n in ("offsets/0", "ctiflow-start-tx.json", "ctiflow-groups.json"))
    # Once a batch is committed, the state is the job's: never touched.
    (tmp_path / "state/0/0/2.zip").parent.mkdir(parents=True)
    (tmp_path / "state/0/0/2.zip").write_text("x")
    (tmp_path / "commits/0").write_text("x")
    assert not reset_uncommitted_checkpoint(cp(tmp_path))
    assert (tmp_path / "state/0/0/2.zip").exists()


def test_a_folder_ctiflow_did_not_make_is_never_cleaned_and_is_refused_as_a_checkpoint(tmp_path):
    """A mistyped ``spark.checkpoint`` naming a user's folder that happens to hold ``state/``:
    nothing in it is deleted, and the run is refused before Spark starts."""
    from ctiflow.jobs.driver.checkpoint import check_checkpoint_dir, reset_uncommitted_checkpoint

    for name in ("state/thesis.tex", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert not reset_uncommitted_checkpoint(cp(tmp_path))
    assert (tmp_path / "state/thesis.tex").exists()
    with pytest.raises(ConfigError, match=r"spark.checkpoint: .* is not a ctiflow checkpoint \(it holds notes.txt\)"):
        check_checkpoint_dir(cp(tmp_path))
    (tmp_path / "notes.txt").unlink()
    assert not reset_uncommitted_checkpoint(cp(tmp_path))  # only state/: still not ctiflow's (no key-group labels)
    assert (tmp_path / "state/thesis.tex").exists()
    # only state/ is refused too: before, the run went on, wrote its key groups, and the reset deleted it
    with pytest.raises(ConfigError, match=r"holds state but neither Spark metadata nor ctiflow key groups"):
        check_checkpoint_dir(cp(tmp_path))
    (tmp_path / "metadata").write_text('{"id": "x"}')  # as Spark writes it when a query starts
    check_checkpoint_dir(cp(tmp_path))
    only_ours = tmp_path / "killed-early"
    only_ours.mkdir()
    (only_ours / "ctiflow-start-tx.json").write_text("{}")  # a run killed before its key groups were written
    check_checkpoint_dir(cp(only_ours))
    # a run killed while Spark wrote its metadata (seen in the SIGKILL test: refused, the job could not restart)
    killed = tmp_path / "killed-at-start"
    killed.mkdir()
    uuid = "12465bf9-ab8f-4543-9026-bbf36a95dde2"
    (killed / f".metadata.{uuid}.tmp").write_text('{"id"')
    (killed / f"..metadata.{uuid}.tmp.crc").write_bytes(b"crc")
    check_checkpoint_dir(cp(killed))
    (killed / ".notes.tmp").write_text("x")  # (anything else is still not Spark's)
    with pytest.raises(ConfigError, match=r"it holds \.notes\.tmp\)"):
        check_checkpoint_dir(cp(killed))
    check_checkpoint_dir(cp(tmp_path / "new"))  # a new directory is fine
    with pytest.raises(ConfigError, match="is a file"):
        check_checkpoint_dir(cp(tmp_path / "state" / "thesis.tex"))


def test_the_cti_of_a_run_is_the_largest_not_the_sum_and_the_progress_is_the_jobs_topic(tmp_path):
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.checkpoint import ProgressLog, read_counters

    lines = [{"batch": 0, "time": 1.0, "received": 5, "cti": 100, "late@tx/0": 1},
             {"batch": 1, "time": 2.0, "received": 7, "cti": 250, "late@tx/0": 2}]
    assert read_counters(Lines(lines)) == {"received": 12, "cti": 250, "late@tx/0": 3}
    cfg = parse({"job": "j", "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "a",
                                          "time_field": "t"}], "operators": [{"kind": "passthrough", "output": "o"}],
                 "spark": {"checkpoint": str(tmp_path / "cp")}})
    assert ProgressLog.of(cfg).topic == "j.ctiflow-progress"


def test_a_partition_with_more_than_one_percent_late_is_warned_about_once():
    from ctiflow.jobs.driver.progress import late_warnings

    warned: set[str] = set()
    counters = {"received@tx/0": 1000, "late@tx/0": 10, "received@tx/1": 1000, "late@tx/1": 11}
    first = late_warnings(counters, warned)
    assert len(first) == 1 and "'tx' partition 1: 11 of 1000" in first[0]
    assert late_warnings(counters, warned) == []


def test_counters_balance_with_a_reference_stream_and_dead_letters():
    """received = released + late + dead_letter + buffered, over both streams; after the final
    CTI nothing is buffered."""
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.core.rows import Control, DeadRow, GroupInput
    from ctiflow.jobs.core.runtime import GroupRuntime
    from ctiflow.operators.columns import EventColumns
    from ctiflow.operators.time import CTI_INFINITY, Event

    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time", "cti": {"delay": 10}},
                             {"name": "r", "topic": "r", "schema": "account", "key_field": "account",
                              "time_field": "valid_from", "shape": "edge"}],
                 "reference": {"fast": "s", "source": "r", "sync": "import", "join_field": "account"},
                 "operators": [{"kind": "passthrough", "output": "out"}]}, "t")
    rt = GroupRuntime(plan_job(cfg))
    got = GroupInput.of("s", {0: [Event("a", t, t, {"account": "a", "i": t}, 0, t, "s") for t in (100, 110, 120)]},
                        [0])
    got.columns.insert(0, EventColumns.from_events([Event("a", 5, 2**62, {"account": "a"}, 0, 0, "r")]))
    got.controls.append(("r", Control([0], [], False)))
    got.dead.append(DeadRow("s", 0, 3, None, b"?", "decode: not Avro", None))
    rt.run_batch(got)                                         # CTI 110: releases the version and 100
    rt.offer_many([Event("a", 50, 50, {"account": "a"}, 0, 200, "s")])   # late
    c = rt.counters
    buffered = c.received - c.released - c.late - c.dead_letter
    assert (c.received, c.late, c.dead_letter) == (6, 1, 1) and buffered == 2
    rt.advance(CTI_INFINITY)
    assert c.received == c.released + c.late + c.dead_letter


def test_an_event_an_operator_refuses_is_dead_lettered_under_its_topic_not_its_stream_name():
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.core.runtime import GroupRuntime
    from ctiflow.operators.time import CTI_INFINITY, Event

    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "flows", "topic": "netflow-raw", "schema": "flow", "key_field": "device",
                              "time_field": "start_time", "end_field": "end_time", "shape": "interval"}],
                 "operators": [{"kind": "bins", "name": "b", "bin_size": 10, "measures": ["bytes"],
                                "outputs": {"final": "bins"}}]}, "t")
    rt = GroupRuntime(plan_job(cfg))
    rt.offer_many([Event("d", 0, 5, {"device": "d", "bytes": "many"}, 1, 7, "flows")])
    out = rt.advance(CTI_INFINITY)
    dead = [o.record for topic, o, _ in out if topic == cfg.dead_letter_topic]
    assert len(dead) == 1 and dead[0]["source_topic"] == "netflow-raw" and dead[0]["stage"] == "operator"
    assert (dead[0]["partition"], dead[0]["offset"]) == (1, 7) and rt.counters.refused == 1


def test_an_output_role_without_a_topic_fails_loudly_instead_of_going_to_the_late_topic():
    import dataclasses

    import pytest

    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.core.runtime import GroupRuntime
    from ctiflow.operators.time import CTI_INFINITY, Event

    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time"}],
                 "operators": [{"kind": "passthrough", "output": "out"}]}, "t")
    p = plan_job(cfg)
    broken = dataclasses.replace(p, operators=(dataclasses.replace(p.operators[0], role_topics={"other": "x"}),))
    rt = GroupRuntime(broken)
    rt.offer_many([Event("a", 1, 1, {}, 0, 0, "s")])
    with pytest.raises(RuntimeError, match="output role 'passthrough' that has no topic"):
        rt.advance(CTI_INFINITY)


def test_config_refuses_fields_nothing_would_read():
    import pytest

    from ctiflow.jobs.driver.config import parse
    from ctiflow.operators.errors import ConfigError

    base = {"job": "t", "operators": [{"kind": "passthrough", "output": "o"}]}
    src = {"name": "s", "topic": "t", "schema": "transaction", "key_field": "account", "time_field": "event_time"}
    with pytest.raises(ConfigError, match="frequency.time.*spark.trigger"):
        parse({**base, "sources": [{**src, "cti": {"frequency": {"time": "5s"}}}]})
    with pytest.raises(ConfigError, match="import_from.*reference.sync: import"):
        parse({**base, "sources": [{**src, "cti": {"import_from": "s"}}]})
    ref = {"name": "r", "topic": "r", "schema": "account", "key_field": "account", "time_field": "valid_from",
           "shape": "edge"}
    with pytest.raises(ConfigError, match="join_field is 'acct' but source 'r' is keyed by 'account'"):
        parse({**base, "sources": [src, ref], "reference": {"source": "r", "fast": "s", "join_field": "acct"}})
    parse({**base, "sources": [src, ref], "reference": {"source": "r", "fast": "s", "join_field": "account"}})


def test_data_faults_are_dead_lettered_and_code_faults_fail_the_batch():
    import dataclasses

    import pytest

    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.core.runtime import GroupRuntime
    from ctiflow.operators.time import CTI_INFINITY, Event

    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "tx-topic", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time"}],
                 "operators": [{"kind": "count", "name": "c", "window": {"events": 5}, "predicate": "amount > 10",
                                "emit": "per_event", "output": "n"}]}, "t")
    p = plan_job(cfg)
    rt = GroupRuntime(p)
    rt.offer_many([Event("a", 1, 1, {"amount": "lots"}, 0, 0, "s"), Event("a", 2, 2, {"amount": 20.0}, 0, 1, "s")])
    out = rt.advance(CTI_INFINITY)
    dead = [o.record for topic, o, _ in out if topic == cfg.dead_letter_topic]
    assert len(dead) == 1 and "amount > 10" in dead[0]["error"] and dead[0]["offset"] == 0  # the record's fault
    assert [o.record["estimate"] for topic, o, _ in out if topic == "n"] == [1.0]

    class Broken(p.operators[0].cls):
        def process_columns(self, cols):
            return len(cols.events()[0])  # a bug: TypeError

    bug = dataclasses.replace(p, operators=(dataclasses.replace(p.operators[0], cls=Broken),))
    rt = GroupRuntime(bug)
    rt.offer_many([Event("a", 1, 1, {"amount": 1.0}, 0, 0, "s")])
    with pytest.raises(TypeError):
        rt.advance(CTI_INFINITY)


def test_key_groups_default_to_the_stateful_stages_partitions_and_can_be_set_higher():
    from ctiflow.jobs.driver.config import parse

    def cfg(spark: dict, per_key: bool = True):
        return parse({"job": "g", "sources": [{"name": "tx", "topic": "tx", "schema": "transaction",
                                               "key_field": "account", "time_field": "event_time"}],
                      "operators": [{"kind": "count", "name": "c", "window": {"events": 10}, "per_key": per_key,
                                     "output": "c"}], "spark": spark})

    assert cfg({"shuffle_partitions": 6}).key_groups == 6
    assert cfg({}).key_groups == 2  # the default shuffle_partitions
    assert cfg({"shuffle_partitions": 6, "key_groups": 24}).key_groups == 24
    assert cfg({"shuffle_partitions": 6}, per_key=False).key_groups == 1  # a global count sees every event


def test_a_job_with_one_key_group_runs_its_stateful_stage_as_one_task_unless_told_otherwise():
    """The stateful stage's tasks (``spark.sql.shuffle.partitions``, the marker topic's partitions):
    2 by default, 1 for a job whose one key group a global operator makes, what the job says if it
    says."""
    from ctiflow.jobs.driver.config import marker_topic, parse
    from ctiflow.jobs.driver.pipeline import spark_options

    def cfg(spark: dict, per_key: bool):
        return parse({"job": "g", "sources": [{"name": "tx", "topic": "tx", "schema": "transaction",
                                               "key_field": "account", "time_field": "event_time"}],
                      "operators": [{"kind": "count", "name": "c", "window": {"events": 10}, "per_key": per_key,
                                     "output": "c"}], "spark": spark})

    for spark, per_key, tasks in (({}, True, 2), ({}, False, 1), ({"shuffle_partitions": 3}, False, 3),
                                  ({"shuffle_partitions": 3}, True, 3), ({"key_groups": 8}, True, 2)):
        job = cfg(spark, per_key)
        assert job.shuffle_partitions == tasks, (spark, per_key)
        assert job.written_topics()[marker_topic("g")] == tasks
        assert spark_options(job, Path("/dev/null"))["spark.sql.shuffle.partitions"] == str(tasks)


def test_a_changed_count_is_refused_by_the_check_run_makes_before_spark(tmp_path):
    from ctiflow.jobs.driver.checkpoint import check_key_groups

    assert check_key_groups(6, cp(tmp_path)) is None  # a new checkpoint
    group_labels(6, 6, tmp_path)
    assert check_key_groups(6, cp(tmp_path))["key_groups"] == 6
    with pytest.raises(ConfigError, match=r"spark.key_groups is 2.*written with 6.*set spark.key_groups to 6"):
        check_key_groups(2, cp(tmp_path))


def test_the_counter_reader_reads_only_what_was_added_and_sums_as_read_counters():
    """Equal to :func:`read_counters` after every record — replays of the newest batch, a gauge,
    a new query (a new checkpoint) — while reading each record once."""
    import random

    from ctiflow.jobs.driver.checkpoint import CounterReader
    from ctiflow.jobs.driver.checkpoint import read_counters

    rng = random.Random(5)
    log = Lines()
    reader = CounterReader(log)
    assert reader() == {}
    for batch in range(60):
        query = "q1" if batch < 40 else "q2"  # the job restarted on a new checkpoint at batch 40
        for _attempt in range(rng.choice([1, 1, 1, 2, 3])):  # a replayed batch: one record per attempt
            log.records.append({"batch": batch % 40, "time": float(batch), "query": query,
                                "received": rng.randint(0, 9), "late": rng.randint(0, 2),
                                "cti": 1000 * batch - rng.randint(0, 500), "state_bytes": rng.randint(100, 999)})
            assert reader() == read_counters(log), batch
    assert reader.offset == len(log.records)
