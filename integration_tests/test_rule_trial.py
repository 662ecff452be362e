"""``ctiflow rules test`` (a candidate rule over a range of history) against the live job.

The oracle is the job itself: a live run whose rules topic puts the same rule at ``from`` and deletes
it at ``to`` (``on_change: drain``) over the whole topic. The trial, over the range only, must emit
the same records, matches and timed-out runs, record for record; its comparison run must emit what a
live run of the versions it compares with emits. The input: 3 partitions at uneven rates (12
accounts: 6 / 3 / 3), out of order within the delay, and events held back far behind the CTI
(late: to the late topic in both), produced with the producer's clock as Kafka timestamp (not the
event time: the trial finds the range by the records' event time)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import yaml

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.recognize import job_schema_store
from ctiflow.jobs.driver.rule_trial import try_rule
from ctiflow.operators.cep.rules import Rule
from ctiflow.operators.errors import ConfigError
from integration_tests.harness import produce, read, run
from integration_tests.test_rules import partition_of  # (12 accounts: 6 / 3 / 3 over the partitions)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

T0 = 1_767_225_600_000
N = 2000
STEP = 200  # ms between events
DELAY = 4_000
#: a late event arrives this far behind its partition's newest. Lateness is judged against the CTI, the
#: slowest partition's newest − the delay, and how far the partitions drift apart in event time depends
#: on how a run reads them: a backlog is read a share of records per partition each micro-batch, so the
#: busiest partition falls behind the others in event time (here by up to ≈ 150 s), and further the
#: earlier a run starts (the live run from the topic's beginning, the trial from the range's). An event
#: this far behind is late whichever run reads it (docs/concepts/rules.md says what is not exact).
HELD_BACK = 200_000


def at(fraction: float) -> int:
    return T0 + int(N * STEP * fraction)


def transactions(seed: int) -> list[dict]:
    """In time order per partition but for a jitter within the delay; every 37th event is held back
    and produced ``HELD_BACK`` later (late: the CTI has passed it by then)."""
    rng = random.Random(seed)
    made = []
    for i in range(N):
        account = f"a{rng.randrange(12)}"
        t = T0 + i * STEP + rng.randrange(0, DELAY // 2)
        made.append({"id": f"t{i}", "account": account, "event_time": t,
                     "type": rng.choice(["purchase"] * 4 + ["refund"]), "amount": float(rng.randrange(1, 80) * 50),
                     "currency": "EUR", "country": rng.choice(["DE", "DE", "FR"]), "merchant": None})
    # arrival order: by event time, a held-back event by its time + HELD_BACK
    return sorted(made, key=lambda r: r["event_time"] + (HELD_BACK if int(r["id"][1:]) % 37 == 5 else 0))


def definition(language: str, threshold: int) -> str:
    if language == "sql":
        return ("SELECT * FROM transactions MATCH_RECOGNIZE (PARTITION BY account ORDER BY event_time "
                "MEASURES A.id AS a_id, B.id AS b_id, B.amount AS b_amount AFTER MATCH SKIP PAST LAST ROW "
                "PATTERN (A B) WITHIN INTERVAL '10' SECOND DEFINE A AS A.type = 'purchase', "
                f"B AS B.type = 'purchase' AND B.amount > {threshold})")
    return yaml.safe_dump({"within": "10s", "skip": "skip_past_last_event",
                           "stages": [{"name": "first", "where": "type == 'purchase'"},
                                      {"name": "large", "contiguity": "followed_by",
                                       "where": f"type == 'purchase' and amount > {threshold}"}]})


def spec(stack, name: str, language: str, rules_topic: str, out: dict, tmp_path) -> dict:
    return {"job": name, "kafka": {"bootstrap_servers": stack.bootstrap},
            "sources": [{"name": "transactions", "topic": out["in"], "schema": "transaction",
                         "key_field": "account", "time_field": "event_time", "partitions": 3,
                         "max_offsets_per_trigger": 120, "cti": {"delay": DELAY, "idle_timeout": "1h"}}],
            "operators": [{"kind": "match", "name": "fraud", "output": out["matches"], "timed_out": out["timed_out"],
                           "rules": {"topic": rules_topic, "on_change": "drain", "language": language,
                                     "idle_timeout": "1h"}}],
            "outputs": {"late": out["late"], "dead_letter": out["dlq"]},
            "spark": {"checkpoint": str(tmp_path / name), "key_groups": 4}}


def rule_record(rule: Rule) -> dict:
    return {f: getattr(rule, f) for f in Rule.__dataclass_fields__}


def live(stack, spark, tmp_path, name: str, language: str, input_topic: str, rules: list[Rule]):
    """A live run of the job over the whole topic with ``rules`` in its rules topic → (matches, timed-out, late)."""
    out = {k: stack.topic(f"{name}-{k}") for k in ("matches", "timed_out", "late", "dlq")}
    out["in"] = input_topic
    rules_topic = stack.topic(f"{name}-rules")
    kafka.create_topics(stack.bootstrap, {rules_topic: 1})
    produce(stack.bootstrap, rules_topic, "rule", [rule_record(r) for r in rules], "rule_id")
    cfg = parse(spec(stack, name, language, rules_topic, out, tmp_path), name)
    run(cfg, spark)
    store = job_schema_store(cfg)
    return (read(stack, out["matches"], store), read(stack, out["timed_out"], store), read(stack, out["late"]))


def multiset(records: list[dict]) -> Counter:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in records)


@pytest.mark.parametrize("language", ["pattern", "sql"])
def test_a_trial_emits_what_the_live_job_emits_for_the_rule_put_at_from_and_deleted_at_to(
        stack, spark, tmp_path, language):
    name = f"trial-{language}"
    input_topic = stack.topic(f"{name}-in")
    kafka.create_topics(stack.bootstrap, {input_topic: 3})
    data = transactions(17)
    produce(stack.bootstrap, input_topic, "transaction", data, "account",
            partition_of=lambda i, r: partition_of(r["account"]))
    start, end = at(0.3), at(0.7)
    # the job's own rules topic: "big" at T0 (over 3,000), replaced inside the range (over 2,000)
    job_rules = [Rule("big", "fraud", 1, T0, "put", definition(language, 3000)),
                 Rule("big", "fraud", 2, at(0.55), "put", definition(language, 2000))]
    job_out = {k: stack.topic(f"{name}-job-{k}") for k in ("matches", "timed_out", "late", "dlq")}
    job_out["in"] = input_topic
    job_rules_topic = stack.topic(f"{name}-job-rules")
    kafka.create_topics(stack.bootstrap, {job_rules_topic: 1})
    produce(stack.bootstrap, job_rules_topic, "rule", [rule_record(r) for r in job_rules], "rule_id")
    job = parse(spec(stack, f"{name}-job", language, job_rules_topic, job_out, tmp_path), name)

    candidate = definition(language, 1500)
    trial = try_rule(job, candidate, start=start, end=end, rule_id="big", against="current", spark=spark)

    # the oracle: the live job with the candidate put (as version 3, as `rules put` would) at from, deleted at to
    want, want_timed_out, late = live(stack, spark, tmp_path, f"{name}-cand", language, input_topic,
                                      [Rule("big", "fraud", 3, start, "put", candidate),
                                       Rule("big", "fraud", 4, end, "delete")])
    assert want and multiset(trial.matches) == multiset(want)
    assert multiset(trial.timed_out) == multiset(want_timed_out)
    assert any(start <= r["start"] < end for r in late)  # late events inside the range, as in the live run
    # what the trial compares with: the live job with big's versions over the range, closed at to
    was, was_timed_out, _ = live(stack, spark, tmp_path, f"{name}-was", language, input_topic,
                                 [Rule("big", "fraud", 1, start, "put", job_rules[0].definition),
                                  Rule("big", "fraud", 2, at(0.55), "put", job_rules[1].definition),
                                  Rule("big", "fraud", 3, end, "delete")])
    assert multiset(trial.against_matches) == multiset(was)
    assert multiset(trial.against_timed_out) == multiset(was_timed_out)
    ignore = ("match_id", "rule_id", "rule_version", "rule_effective_time")

    def what(r):
        return json.dumps({k: v for k, v in r.items() if k not in ignore}, sort_keys=True, default=str)

    added = Counter(map(what, want)) - Counter(map(what, was))
    removed = Counter(map(what, was)) - Counter(map(what, want))
    assert Counter(map(what, trial.added)) == added and sum(added.values()) > 0  # over 1,500 adds matches
    assert Counter(map(what, trial.removed)) == removed
    assert trial.unchanged == len(want) - sum(added.values()) > 0
    # the range, not the topic: each partition read from near the range's start
    assert all(o > 0 for o in trial.starts[input_topic].values())
    assert sum(trial.ends[input_topic].values()) < N
    # nothing of the trial is left on the broker or beside the job's checkpoint (where it had its
    # own), and the job's topics and checkpoint got nothing
    assert not [t for t in kafka.list_topics(stack.bootstrap) if ".rules-test-" in t]
    assert not [p for p in tmp_path.iterdir() if ".rules-test-" in p.name]
    assert not (tmp_path / f"{name}-job").exists()
    assert [r["rule_id"] for r in read(stack, job_rules_topic)] == ["big", "big"]


def small_job(stack, name: str, seed: int, n: int, tmp_path) -> tuple[dict, str, dict]:
    """``n`` transactions of ``transactions(seed)`` in a topic of 3 partitions, an empty rules topic,
    and the job over them → (its topics, the rules topic, the job's spec)."""
    out = {k: stack.topic(f"{name}-{k}") for k in ("in", "matches", "timed_out", "late", "dlq")}
    rules_topic = stack.topic(f"{name}-rules")
    kafka.create_topics(stack.bootstrap, {out["in"]: 3, rules_topic: 1})
    produce(stack.bootstrap, out["in"], "transaction", transactions(seed)[:n], "account",
            partition_of=lambda i, r: partition_of(r["account"]))
    return out, rules_topic, spec(stack, name, "pattern", rules_topic, out, tmp_path)


def test_a_trial_refuses_a_rule_the_job_would_refuse_before_spark(stack, tmp_path):
    """(A range past the topics' retention: tests/test_rule_trial.py — tansu, the broker here, deletes no
    records: no DeleteRecords, no retention by time.)"""
    job = parse(small_job(stack, "trial-refused", 3, 300, tmp_path)[2], "trial-refused")
    bad = yaml.safe_dump({"stages": [{"name": "a", "where": "no_such_field > 3"}]})
    with pytest.raises(ConfigError, match="no_such_field"):
        try_rule(job, bad, start=at(0.1), end=at(0.2))
    with pytest.raises(ConfigError, match="--from .* is not before --to"):
        try_rule(job, definition("pattern", 100), start=at(0.2), end=at(0.1))


def test_rules_test_on_the_command_line_prints_the_table_and_writes_the_records(stack, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    _, rules_topic, job_spec = small_job(stack, "trial-cli", 5, 600, tmp_path)
    produce(stack.bootstrap, rules_topic, "transaction", transactions(1)[:1], "account")  # a foreign record first
    produce(stack.bootstrap, rules_topic, "rule",
            [rule_record(Rule("big", "fraud", 1, T0, "put", definition("pattern", 3000)))], "rule_id")
    job_file, rule_file, records = tmp_path / "job.yaml", tmp_path / "big.yaml", tmp_path / "trial.jsonl"
    job_file.write_text(yaml.safe_dump(job_spec))
    rule_file.write_text(definition("pattern", 1500))
    ctiflow = str(Path(sys.executable).parent / "ctiflow")
    done = subprocess.run([ctiflow, "rules", "test", str(rule_file), "--job", str(job_file), "--from", str(at(0.05)),
                           "--to", str(at(0.25)), "--out", str(records), "--show", "2"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    # the rules topic read once for the candidate's version and what it is compared with: warned of once
    assert done.stderr.count(f"{rules_topic} partition 0 offset 0: not a rule record, skipped") == 1
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    matches = [r for r in lines if r["diff"] in ("added", "unchanged")]
    assert matches and {r["rule_id"] for r in matches} == {"big"} and {r["rule_version"] for r in matches} == {2}
    assert all(at(0.05) <= r["first_time"] < at(0.25) for r in matches)
    added = sum(r["diff"] == "added" for r in lines)
    unchanged = sum(r["diff"] == "unchanged" for r in lines)
    removed = sum(r["diff"] == "removed" for r in lines)
    table = {row.split("│")[1].strip(): row.split("│")[2].strip() for row in done.stdout.splitlines()
             if row.startswith("│") and row.count("│") >= 3}
    assert table["candidate"] == f"{len(matches):,}" and table["added (candidate only)"] == f"{added:,}"
    assert table["unchanged"] == f"{unchanged:,}" and table["removed (against only)"] == f"{removed:,}"
    assert added > 0  # over 1,500 instead of over 3,000: more matches
    assert f"first matches (first 2 of {len(matches):,}):" in done.stdout
    refused = subprocess.run([ctiflow, "rules", "test", str(job_file), "--job", str(job_file), "--from", str(at(0.05)),
                              "--to", str(at(0.25))], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "Spark's own log" not in refused.stderr  # refused before Spark


@pytest.mark.parametrize("scan", [kafka.SCAN_RECORDS, 4])
def test_offsets_for_times_finds_the_first_record_at_a_time_by_event_time_or_kafka_timestamp(
        stack, monkeypatch, scan):
    """tansu answers offset 0 for every timestamp: the answer is checked and searched — with a scan
    of 4 records the search's steps run (interpolation over uneven times, bisection), each time
    from the records the earlier searches saw. The oracle: a scan of each partition's records
    (their event times ascend per partition)."""
    monkeypatch.setattr(kafka, "SCAN_RECORDS", scan)
    from ctiflow.jobs.avro.serde import AvroDeserializer
    from ctiflow.jobs.driver.rule_trial import _event_time

    topic = stack.topic(f"offsets-for-times-{scan}")
    kafka.create_topics(stack.bootstrap, {topic: 3})
    rows = sorted(transactions(23)[:700], key=lambda r: r["event_time"])  # ascending: no held-back ones
    produce(stack.bootstrap, topic, "transaction", rows, "account",
            partition_of=lambda i, r: partition_of(r["account"]))
    by_partition = {p: [r["event_time"] for r in rows if partition_of(r["account"]) == p] for p in (0, 1, 2)}
    time_of = _event_time(AvroDeserializer("transaction"), "event_time")
    cons = kafka.consumer(stack.bootstrap)
    seen: dict = {}
    try:
        for ms in (T0 - 1, T0, rows[1]["event_time"], rows[333]["event_time"], rows[333]["event_time"] + 1,
                   rows[-1]["event_time"], rows[-1]["event_time"] + 1, rows[100]["event_time"] + 1,
                   rows[650]["event_time"]):
            want = {p: next((i for i, t in enumerate(times) if t >= ms), len(times))
                    for p, times in by_partition.items()}
            assert kafka.offsets_for_times(cons, topic, [0, 1, 2], ms, time_of) == want, ms
            assert kafka.offsets_for_times(cons, topic, [0, 1, 2], ms, time_of, seen=seen) == want, ms
        # by Kafka timestamp (the producer's clock, ascending as produced): all before a time past the
        # last record, none before one ahead of the first
        stamps = {p: [m.timestamp for part in kafka.read_range(cons, topic, p, 0, len(times)) for m in part]
                  for p, times in by_partition.items()}
        last = max(max(s) for s in stamps.values())
        assert kafka.offsets_for_times(cons, topic, [0, 1, 2], last + 1) == {
            p: len(t) for p, t in by_partition.items()}
        assert kafka.offsets_for_times(cons, topic, [0, 1, 2], 0) == {0: 0, 1: 0, 2: 0}
        middle = sorted(stamps[0])[len(stamps[0]) // 2]
        assert kafka.offsets_for_times(cons, topic, [0], middle)[0] == next(
            i for i, s in enumerate(stamps[0]) if s >= middle)
    finally:
        cons.close()
