"""Rules that change at a CTI, end to end: Kafka topics → Spark → Kafka, against an oracle.

The oracle runs each rule version as a static match operator (the one the CEP conformance
tests check against Flink) over the events its definition assigns it: for ``cut`` those in
``[effective, until)``, then time to ``until``, then its open runs ended (a match a skip strategy
held back for them is emitted); for ``drain`` every event from ``effective`` on
with the first stage also needing ``event_time < until``. Which records are late is worked out
from the CTI each arrived at: the first run is bounded without a final CTI, so the second run's
rule records arrive at the CTI the first ended with (the minimum over the partitions of their
largest time − the delay).

The input: 3 partitions at uneven rates (12 accounts: 6 / 3 / 3), out of order within the delay,
read ``PER_BATCH`` records a micro-batch in the first run and another number in the second; the
first run is SIGKILLed once, the second twice."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import yaml

from ctiflow.bench.chaos import crash_loop
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.avro.serde import AvroDeserializer
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.recognize import job_schema_store
from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
from ctiflow.operators.cep.rules import Rule
from ctiflow.operators.time import CTI_INFINITY, Event
from integration_tests.harness import produce, read, run

pytestmark = [pytest.mark.integration, pytest.mark.spark]

T0 = 1_767_225_600_000
N = 1200
STEP = 250  # ms between events
DELAY = 5_000
PER_BATCH = 90


def partition_of(account: str) -> int:
    n = int(account[1:])
    return 0 if n < 6 else 1 if n < 9 else 2


def transactions(seed: int) -> list[dict]:
    """Per partition in time order but for a jitter within the delay (out of order, never late)."""
    rng = random.Random(seed)
    out = []
    for i in range(N):
        account = f"a{rng.randrange(12)}"
        t = T0 + i * STEP + rng.randrange(0, DELAY // 2)
        out.append({"id": f"t{i}", "account": account, "event_time": t,
                    "type": rng.choice(["purchase"] * 4 + ["refund"]), "amount": float(rng.randrange(1, 80) * 50),
                    "currency": "EUR", "country": rng.choice(["DE", "DE", "FR"]), "merchant": None})
    return out


def at(fraction: float) -> int:
    return T0 + int(N * STEP * fraction)


def pattern(threshold: int, until: int | None = None) -> dict:
    first = "type == 'purchase'" + ("" if until is None else f" and event_time < {until}")
    return {"within": "10s", "skip": "skip_past_last_event",
            "stages": [{"name": "first", "where": first},
                       {"name": "large", "contiguity": "followed_by",
                        "where": f"type == 'purchase' and amount > {threshold}"}]}


def query(threshold: int, until: int | None = None) -> str:
    first = "A.type = 'purchase'" + ("" if until is None else f" AND A.event_time < {until}")
    return ("SELECT * FROM transactions MATCH_RECOGNIZE (PARTITION BY account ORDER BY event_time "
            "MEASURES A.id AS a_id, B.id AS b_id, B.amount AS b_amount AFTER MATCH SKIP PAST LAST ROW "
            f"PATTERN (A B) WITHIN INTERVAL '10' SECOND DEFINE A AS {first}, "
            f"B AS B.type = 'purchase' AND B.amount > {threshold})")


def definition(language: str, threshold: int, until: int | None = None) -> str:
    return query(threshold, until) if language == "sql" else yaml.safe_dump(pattern(threshold, until))


def record(rule: Rule) -> dict:
    return {f: getattr(rule, f) for f in Rule.__dataclass_fields__}


def spec_for(stack, name: str, language: str, on_change: str, late_rules: str, sync: str = "import",
             flush: bool = True, topics: dict | None = None, per_batch: int = PER_BATCH) -> dict:
    op = {"kind": "match", "name": "fraud", "output": topics["matches"],
          "rules": {"topic": topics["rules"], "on_change": on_change, "late_rules": late_rules, "sync": sync,
                    "language": language, "idle_timeout": "1h"}}
    return {"job": name, "kafka": {"bootstrap_servers": stack.bootstrap},
            "sources": [{"name": "transactions", "topic": topics["in"], "schema": "transaction",
                         "key_field": "account", "time_field": "event_time", "partitions": 3,
                         "max_offsets_per_trigger": per_batch,
                         "cti": {"delay": DELAY, "idle_timeout": "1h", "flush_at_end": flush}}],
            "operators": [op],
            "outputs": {"late": topics["late"], "dead_letter": topics["dlq"]},
            "spark": {"checkpoint": topics["checkpoint"], "key_groups": 4}}


def events_of(records: list[dict], offsets_from: dict[int, int] | None = None) -> list[Event]:
    offsets = dict(offsets_from or {0: 0, 1: 0, 2: 0})
    out = []
    for r in records:
        p = partition_of(r["account"])
        out.append(Event(r["account"], r["event_time"], r["event_time"], r, p, offsets[p], "transactions"))
        offsets[p] += 1
    return out


def schedule(arrivals: list[tuple[Rule, int]], late_rules: str):
    """``(rule, CTI at arrival)`` in topic order → each rule id's versions ``(version, effective,
    definition)`` as the job must schedule them, and the ids of refused records."""
    kept: dict[str, list] = {}
    refused = []
    for rule, cti in arrivals:
        mine = kept.setdefault(rule.rule_id, [])
        eff = rule.effective_time
        if eff < cti:
            if late_rules == "reject":
                refused.append((rule.rule_id, rule.version))
                continue
            eff = cti
        if mine and (rule.version <= mine[-1][0] or eff < mine[-1][1]):
            refused.append((rule.rule_id, rule.version))
            continue
        mine.append((rule.version, eff, rule))
    return kept, refused


def expected(events: list[Event], kept: dict, language: str, on_change: str) -> Counter:
    ordered = sorted(events, key=lambda e: (e.start, e.partition, e.offset))
    want = Counter()
    for rule_id, versions in kept.items():
        for k, (version, eff, rule) in enumerate(versions):
            if rule.action == "delete":
                continue
            until = versions[k + 1][1] if k + 1 < len(versions) else None
            threshold = rule.comment and int(rule.comment)
            if on_change == "cut":
                text, mine, end = rule.definition, [e for e in ordered if eff <= e.start < (until or CTI_INFINITY)], \
                    until or CTI_INFINITY
            else:
                text, mine, end = definition(language, threshold, until), [e for e in ordered if eff <= e.start], \
                    CTI_INFINITY
            if language == "sql":
                columns = (("id", "string"), ("account", "string"), ("event_time", "number"), ("type", "string"),
                           ("amount", "number"), ("currency", "string"), ("country", "string"), ("merchant", "string"))
                settings = MatchSettings(None, name="fraud", sql=text, columns=columns, emit_timed_out=False,
                                         structured_events=True)
            else:
                from ctiflow.jobs.core.definitions import parse_pattern
                settings = MatchSettings(pattern=parse_pattern(text), name="fraud", emit_timed_out=False,
                                         structured_events=True)
            op = MatchOperator(settings)
            outputs = [o for e in mine for o in op.process(e)] + op.advance_to(end)
            if on_change == "cut" and end < CTI_INFINITY:
                # the cut discards the open runs, so a match they held back is released (the
                # patterns are windowed: time passing alone ends every open run, as the cut does)
                outputs += [o for o in op.advance_to(CTI_INFINITY) if o.role == "match"]
            for o in outputs:
                want[identity(rule_id, version, eff, o.record, language)] += 1
    return want


def identity(rule_id, version, effective, r: dict, language: str) -> tuple:
    if language == "sql":
        measures = r["measures"] if "measures" in r else [{"name": k, "value": v} for k, v in r.items()]
        return rule_id, version, effective, json.dumps(measures, sort_keys=True)
    match_id = r["match_id"].split("/", 1)[-1]
    return rule_id, version, effective, match_id


def got_identities(records: list[dict], language: str) -> Counter:
    return Counter(identity(r["rule_id"], r["rule_version"], r["rule_effective_time"], r, language) for r in records)


@pytest.mark.parametrize("language, on_change, late_rules", [("pattern", "drain", "adjust"),
                                                             ("sql", "cut", "reject")])
def test_rule_versions_judge_their_events_across_sigkills(stack, tmp_path, language, on_change, late_rules):
    name = f"rules-{language}-{on_change}"
    topics = {k: stack.topic(f"{name}-{k}") for k in ("in", "rules", "matches", "late", "dlq")}
    topics["checkpoint"] = str(tmp_path / "checkpoint")
    data = transactions(7)
    first, second = data[:N // 2], data[N // 2:]
    kafka.create_topics(stack.bootstrap, {topics["in"]: 3, topics["rules"]: 1})

    def put(rule_id, version, eff, threshold=None, action="put"):
        text = definition(language, threshold) if action == "put" else None
        return Rule(rule_id, "fraud", version, eff, action, text, None if threshold is None else str(threshold))

    rules_1 = [put("big", 1, T0, 3000), put("big", 2, at(0.2), 1500), put("mid", 1, at(0.1), 2500),
               put("big", 3, at(0.35), action="delete"), put("big", 4, at(0.45), 3500)]
    # Arrive after the first run: "late" behind its CTI (≈ at(0.5) − the delay), the others ahead.
    rules_2 = [put("late", 1, at(0.3), 1000), put("big", 5, at(0.7), 500), put("mid", 2, at(0.8), action="delete"),
               put("mid", 3, at(0.9), 2000)]
    produce(stack.bootstrap, topics["rules"], "rule", [record(r) for r in rules_1], "rule_id")
    produce(stack.bootstrap, topics["in"], "transaction", first, "account",
            partition_of=lambda i, r: partition_of(r["account"]))
    spec = spec_for(stack, name, language, on_change, late_rules, flush=False, topics=topics)
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    report = crash_loop(spec, tmp_path / "run1", kills=1, seed=3, window=(9.0, 20.0))
    assert report.final_returncode == 0

    produce(stack.bootstrap, topics["rules"], "rule", [record(r) for r in rules_2], "rule_id")
    produce(stack.bootstrap, topics["in"], "transaction", second, "account",
            partition_of=lambda i, r: partition_of(r["account"]))
    # (another micro-batch size: the results must not depend on where batches end)
    spec = spec_for(stack, name, language, on_change, late_rules, flush=True, topics=topics,
                    per_batch=PER_BATCH + 55 if language == "pattern" else PER_BATCH - 35)
    report = crash_loop(spec, tmp_path / "run2", kills=2, seed=5, window=(9.0, 20.0))
    assert report.final_returncode == 0 and report.kills == 2

    events = events_of(data)
    cti_1 = min(max(e.start for e in events_of(first) if e.partition == p) for p in (0, 1, 2)) - DELAY
    kept, refused = schedule([(r, -1) for r in rules_1] + [(r, cti_1) for r in rules_2], late_rules)
    store = job_schema_store(parse(spec, name))
    got = got_identities(read(stack, topics["matches"], store), language)
    want = expected(events, kept, language, on_change)
    assert got == want
    assert {k[0] for k in want} >= ({"big", "mid", "late"} if late_rules == "adjust" else {"big", "mid"})
    assert {k[1] for k in want if k[0] == "big"} >= {1, 2, 5}
    dead = [r for r in read(stack, topics["dlq"]) if r["source_topic"] == topics["rules"]]
    decode = AvroDeserializer("rule")  # (a dead letter holds the record's own bytes)
    assert sorted((decode(d["value"])["rule_id"], decode(d["value"])["version"]) for d in dead) == sorted(refused)
    assert (late_rules == "reject") == (("late", 1) in refused)
    # an adjusted rule is a late record (the time it asked for, the CTI it took effect at); no event
    # is late (the oracle need not model it)
    adjusted = {(rule.rule_id, rule.version): eff for vs in kept.values() for _, eff, rule in vs
                if eff != rule.effective_time}
    assert (late_rules == "adjust") == (adjusted == {("late", 1): cti_1})
    lates = read(stack, topics["late"])
    assert sorted((r["stream"], r["key"], json.loads(r["fields_json"])["version"], r["start"], r["cti"], r["policy"])
                  for r in lates) == sorted(("rules_fraud", k[0], k[1], at(0.3), eff, "adjust")
                                            for k, eff in adjusted.items())
    # `ctiflow rules list` reads back what the job did with every record
    from ctiflow.jobs.driver.rules import list_rules
    judged = {(j.rule.rule_id, j.rule.version): (j.judged, j.effective) for j in list_rules(parse(spec, name))["fraud"]}
    assert judged == {(r.rule_id, r.version): ("refused", None) if (r.rule_id, r.version) in refused else
                      ("adjusted", adjusted[(r.rule_id, r.version)]) if (r.rule_id, r.version) in adjusted else
                      ("applied", r.effective_time) for r in rules_1 + rules_2}


def test_a_replay_and_a_backfill_with_sync_min_reproduce_the_live_run(stack, spark, tmp_path):
    """Live: two runs, the second's rules arriving after the first ended but ahead of the CTI.
    Replay: every topic from the beginning on a new checkpoint (all rules in its first batch).
    Backfill: the same with ``sync: min`` (events wait for the rules stream's CTI)."""
    name = "rules-replay"
    base = {k: stack.topic(f"{name}-{k}") for k in ("in", "rules", "late", "dlq")}
    data = transactions(11)
    kafka.create_topics(stack.bootstrap, {base["in"]: 3, base["rules"]: 1})
    rules_1 = [Rule("big", "fraud", 1, T0, "put", definition("pattern", 2500)),
               Rule("big", "fraud", 2, at(0.3), "put", definition("pattern", 1000))]
    rules_2 = [Rule("big", "fraud", 3, at(0.6), "put", definition("pattern", 3000)),
               Rule("odd", "fraud", 1, at(0.75), "put", definition("pattern", 3800))]
    runs = {}
    for label, sync, fresh in (("live", "import", None), ("replay", "import", "replay"), ("backfill", "min", "fill")):
        topics = {**base, "matches": stack.topic(f"{name}-{label}-matches"),
                  "checkpoint": str(tmp_path / label)}
        if label == "live":
            produce(stack.bootstrap, base["rules"], "rule", [record(r) for r in rules_1], "rule_id")
            produce(stack.bootstrap, base["in"], "transaction", data[:N // 2], "account",
                    partition_of=lambda i, r: partition_of(r["account"]))
            run(parse(spec_for(stack, f"{name}-{label}", "pattern", "drain", "reject", sync, flush=False,
                               topics=topics), "live"), spark)
            produce(stack.bootstrap, base["rules"], "rule", [record(r) for r in rules_2], "rule_id")
            produce(stack.bootstrap, base["in"], "transaction", data[N // 2:], "account",
                    partition_of=lambda i, r: partition_of(r["account"]))
        spec = spec_for(stack, f"{name}-{label}", "pattern", "drain", "reject", sync, topics=topics)
        run(parse(spec, label), spark)
        runs[label] = Counter(json.dumps(r, sort_keys=True)
                              for r in read(stack, topics["matches"], job_schema_store(parse(spec, label))))
    assert runs["live"] and runs["replay"] == runs["live"] and runs["backfill"] == runs["live"]
    assert {json.loads(r)["rule_version"] for r in runs["live"]} == {1, 2, 3}


def test_rules_put_list_and_rm_on_the_command_line(stack, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    topics = {k: stack.topic(f"rules-cli-{k}") for k in ("in", "rules", "matches", "late", "dlq")}
    topics["checkpoint"] = str(tmp_path / "checkpoint")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(spec_for(stack, "rules-cli", "pattern", "drain", "reject", topics=topics)))
    ctiflow = str(Path(sys.executable).parent / "ctiflow")

    def cli(*args):
        return subprocess.run([ctiflow, "rules", *args, "--job", str(job_file)], capture_output=True, text=True,
                              timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(definition("pattern", 1000))
    bad.write_text(yaml.safe_dump({"stages": [{"name": "a", "where": "amount >> 3"}]}))
    done = cli("put", str(bad), "--id", "big", "--effective", str(T0))
    assert done.returncode != 0 and (done.stderr + done.stdout).count("amount >> 3") == 1  # stated once
    assert topics["rules"] not in kafka.list_topics(stack.bootstrap)  # nothing written
    kafka.create_topics(stack.bootstrap, {topics["rules"]: 1})  # a foreign record first: skipped, with a warning
    produce(stack.bootstrap, topics["rules"], "transaction", transactions(1)[:1], "account")
    first = cli("put", str(good), "--id", "big", "--effective", "2026-01-01T00:00:00Z")
    assert first.returncode == 0, first.stderr
    assert first.stderr.count(f"{topics['rules']} partition 0 offset 0: not a rule record, skipped") == 1
    assert cli("put", str(good), "--id", "big", "--effective", str(T0 + 60_000), "--comment", "again").returncode == 0
    refused = cli("put", str(good), "--id", "big", "--effective", str(T0 + 90_000), "--version", "2")
    assert refused.returncode != 0 and "is not newer than version 2" in refused.stderr + refused.stdout
    assert cli("rm", "--id", "big", "--effective", str(T0 + 120_000)).returncode == 0
    listed = cli("list", "--at", str(T0 + 70_000))
    assert listed.returncode == 0, listed.stderr
    lines = [line for line in listed.stdout.splitlines() if " big " in line]
    assert [line.split()[3] for line in lines] == ["1", "2", "3"], listed.stdout
    assert [next(w for w in ("replaced", "current", "scheduled", "deleted") if w in line) for line in lines] == \
        ["replaced", "current", "scheduled"]
    written = [r for r in read(stack, topics["rules"]) if "rule_id" in r]
    assert [(r["version"], r["action"], r["effective_time"]) for r in written] == \
        [(1, "put", T0), (2, "put", T0 + 60_000), (3, "delete", T0 + 120_000)]
