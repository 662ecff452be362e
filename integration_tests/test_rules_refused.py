"""A rules job fed every hostile rule record issue 59 names, among good ones, end to end: it runs
to the end; each bad record is one dead letter with its reason and the record as it came (key and
value bytes, Kafka timestamp); the good rules' matches are those of the same job without the bad
records (the oracle: a second run over the same events and only the good records); the counters
balance over every stream; and the dead-letter page's replay recipe puts the records back as
they were."""

from __future__ import annotations

from collections import Counter

import pytest

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.avro.serde import AvroSerializer
from ctiflow.jobs.driver.checkpoint import ProgressLog, read_counters
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.recognize import job_schema_store
from ctiflow.operators.cep.rules import Rule
from integration_tests.harness import produce, read, run
from integration_tests.test_rules import DELAY, N, T0, at, definition, partition_of, record, transactions

pytestmark = [pytest.mark.integration, pytest.mark.spark]

STAMP = 1_767_000_000_000  # the Kafka timestamps the rule records are produced with


def nested_groups(depth: int) -> str:
    inner = '{"name": "x", "where": "amount > 1"}'
    for i in range(depth):
        inner = f'{{"name": "g{i}", "group": [{inner}]}}'
    return f'{{"stages": [{inner}]}}'


def alias_bomb() -> str:
    """521 bytes or so: five levels of ten aliases, each a group of the one before (10⁵ stages)."""
    lines = ["stages:", "- &x0 {name: a}"]
    lines += [f"- &x{i} {{name: g{i}, group: [{', '.join([f'*x{i - 1}'] * 10)}]}}" for i in range(1, 6)]
    return "\n".join(lines)


def put(operator: str, rule_id: str, version: int, effective: int, text: str | None, action: str = "put") -> Rule:
    return Rule(rule_id, operator, version, effective, action, text)


def good_records() -> dict[str, list[Rule]]:
    """Operator → its good rule records (a replacement and a second rule each)."""
    return {"fraud": [put("fraud", "big", 1, T0, definition("pattern", 3000)),
                      put("fraud", "other", 1, T0, definition("pattern", 2000)),
                      put("fraud", "big", 2, at(0.5), definition("pattern", 1000))],
            "fraud_sql": [put("fraud_sql", "q", 1, T0, definition("sql", 2500)),
                          put("fraud_sql", "q", 2, at(0.6), definition("sql", 1200))]}


def bad_records() -> dict[str, list[tuple[Rule | bytes, str]]]:
    """Operator → (a bad record, a fragment of its reason): each of issue 59's, and the old ones."""
    huge = "stages: [{name: a, where: 'amount > 1'}]\n" + "#" * 100_000
    return {"fraud": [
        (put("fraud", "typo", 1, T0, "stages: [{name: a, where: 'amount>1', or: 5}]"), "'or'"),
        (put("fraud", "deep", 1, T0, "[" * 3000), "nested more than"),
        (put("fraud", "groups", 1, T0, nested_groups(300)), "levels"),
        (put("fraud", "bomb", 1, T0, alias_bomb()), "100,000 values"),
        (put("fraud", "huge", 1, T0, huge), "bytes, more than"),
        (put("fraud", "", 1, T0, definition("pattern", 10)), "'rule_id'"),  # (the source: an empty key)
        (put("fraud", "neg", 1, -5, definition("pattern", 10)), "effective_time=-5"),  # (the source)
        (put("fraud", "zero", 0, T0, definition("pattern", 10)), "versions start at 1"),
        (put("fraud", "big", 1, at(0.55), definition("pattern", 10)), "not newer"),
        (put("other-op", "x", 1, T0, definition("pattern", 10)), "operator"),
        (put("fraud", "gone", 1, T0, None, "delete"), "no live version"),
        (put("fraud", "field", 1, T0, "stages: [{name: a, where: 'no_such_field > 1'}]"), "no_such_field"),
        (AvroSerializer("transaction")(transactions(1)[0]), "decode"),  # a foreign record on the topic
        (b"\x00garbage", "decode")],
        "fraud_sql": [
        (put("fraud_sql", "digits", 1, T0, "SELECT * FROM transactions MATCH_RECOGNIZE (PARTITION BY account "
             "ORDER BY event_time MEASURES A.amount AS amount PATTERN (A{" + "9" * 5000 + "}) DEFINE A AS "
             "A.amount > 1)"), "repetitions"),
        (put("fraud_sql", "paren", 1, T0, "SELECT * FROM transactions MATCH_RECOGNIZE (PARTITION BY account "
             "ORDER BY event_time MEASURES A.amount AS amount PATTERN (" + "(" * 3000 + "A" + ")" * 3000
             + ") DEFINE A AS A.amount > 1)"), ""),
        (put("fraud_sql", "notsql", 1, T0, "stages: [{name: a}]"), "")]}


def spec(stack, name: str, tmp_path) -> dict:
    topics = {k: stack.topic(f"{name}-{k}") for k in ("in", "rules", "sqlrules", "matches", "sqlmatches", "late",
                                                       "dlq")}
    ops = [{"kind": "match", "name": "fraud", "output": topics["matches"],
            "rules": {"topic": topics["rules"], "on_change": "drain", "idle_timeout": "1h"}},
           {"kind": "match", "name": "fraud_sql", "output": topics["sqlmatches"],
            "rules": {"topic": topics["sqlrules"], "on_change": "cut", "language": "sql", "idle_timeout": "1h"}}]
    return {"job": name, "kafka": {"bootstrap_servers": stack.bootstrap},
            "sources": [{"name": "transactions", "topic": topics["in"], "schema": "transaction",
                         "key_field": "account", "time_field": "event_time", "partitions": 3,
                         "max_offsets_per_trigger": 150, "cti": {"delay": DELAY, "idle_timeout": "1h"}}],
            "operators": ops, "outputs": {"late": topics["late"], "dead_letter": topics["dlq"]},
            "spark": {"checkpoint": str(tmp_path / name), "key_groups": 4}}


def load(stack, name: str, tmp_path, with_bad: bool) -> tuple[dict, list[tuple[bytes | None, bytes, int, str]]]:
    """The job's topics filled: the events (3 partitions, uneven), then each operator's rules topic
    — the good records, and with ``with_bad`` the bad ones between them, each with its own key
    and Kafka timestamp. → (the job spec, each bad record as (key, value, timestamp, reason))."""
    job = spec(stack, name, tmp_path)
    sources, ops = job["sources"][0], {o["name"]: o for o in job["operators"]}
    kafka.create_topics(stack.bootstrap, {sources["topic"]: 3, ops["fraud"]["rules"]["topic"]: 1,
                                          ops["fraud_sql"]["rules"]["topic"]: 1})
    produce(stack.bootstrap, sources["topic"], "transaction", transactions(11), "account",
            partition_of=lambda i, r: partition_of(r["account"]))
    encode = AvroSerializer("rule")
    prod = kafka.producer(stack.bootstrap)
    bad_sent = []
    for name_of, good in good_records().items():
        topic = ops[name_of]["rules"]["topic"]
        bad = bad_records()[name_of] if with_bad else []
        sequence = [(r, None) for r in good[:1]] + bad + [(r, None) for r in good[1:]]
        for i, (item, reason) in enumerate(sequence):
            value = encode(record(item)) if isinstance(item, Rule) else item
            key = (item.rule_id.encode() or None) if isinstance(item, Rule) else b"someone-else"
            stamp = STAMP + len(bad_sent) * 1000 + i
            kafka.send(prod, topic, value, key, partition=0, timestamp=stamp)
            if reason is not None:
                bad_sent.append((key, value, stamp, reason, topic))
    assert prod.flush(30) == 0
    return job, bad_sent


def test_a_rules_job_fed_every_hostile_rule_runs_to_the_end_and_matches_as_without_them(stack, spark, tmp_path):
    clean_spec, _ = load(stack, "rules-clean", tmp_path, with_bad=False)
    hostile_spec, bad = load(stack, "rules-hostile", tmp_path, with_bad=True)
    clean, hostile = parse(clean_spec, "clean"), parse(hostile_spec, "hostile")
    run(clean, spark)
    run(hostile, spark)  # (a bad rule used to end this run with "a bug in ctiflow")

    # The good rules' matches: those of the run without the bad records, and there are some.
    for i, name in enumerate(("fraud", "fraud_sql")):
        got = Counter(map(repr, read(stack, hostile_spec["operators"][i]["output"], job_schema_store(hostile))))
        want = Counter(map(repr, read(stack, clean_spec["operators"][i]["output"], job_schema_store(clean))))
        assert got == want and sum(want.values()) > 0, name

    # Every bad record: one dead letter, its reason, its own key, value bytes and Kafka timestamp.
    dead = read(stack, hostile_spec["outputs"]["dead_letter"])
    assert len(dead) == len(bad), [d["error"][:80] for d in dead]
    by_record = {(d["source_topic"], d["key"], d["value"]): d for d in dead}
    for key, value, stamp, reason, topic in bad:
        d = by_record[(topic, key, value)]
        assert d["kafka_timestamp"] == stamp and reason in d["error"], (reason, d["error"][:200])
        assert d["stage"] in ("rule", "decode", "validate")
    assert not read(stack, clean_spec["outputs"]["dead_letter"])

    # The counters balance over every stream, rule records included (each counted once).
    totals = read_counters(ProgressLog.of(hostile))
    rules_read = sum(len(g) for g in good_records().values()) + len(bad)
    assert totals["received"] == N + rules_read
    assert totals["dead_letter"] == len(bad)
    assert totals["received"] == totals["released"] + totals["late"] + totals["dead_letter"]

    # The dead-letter page's replay recipe writes each record back as it came.
    from ctiflow.jobs.datapath.kafka import iter_topic, producer

    cons = kafka.consumer(stack.bootstrap)
    before = {t: kafka.true_end_offset(cons, t, 0, 0) for t in {b[4] for b in bad}}
    prod = producer(stack.bootstrap)
    for d in iter_topic(stack.bootstrap, hostile_spec["outputs"]["dead_letter"]):
        if d["stage"] in ("rule", "decode", "validate"):
            prod.produce(d["source_topic"], key=d["key"], value=d["value"])
    prod.flush()
    replayed = Counter()
    for topic, start in before.items():
        end = kafka.true_end_offset(cons, topic, 0, start)
        for msgs in kafka.read_range(cons, topic, 0, start, end, raw=True):
            replayed.update((topic, m.key(), m.value()) for m in msgs)  # (confluent-kafka messages: raw=True)
    cons.close()
    assert replayed == Counter((topic, key, value) for key, value, _, _, topic in bad)
