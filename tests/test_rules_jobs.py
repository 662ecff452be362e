"""Rules in a job, without Spark: the ``rules:`` section, the rules stream through a key group's
runtime (every micro-batch restored from its committed bytes, as the adapter runs it), refused
rule records to the dead-letter topic, ``sync: min``, and the schemas the records are written with.

The oracle: each rule version as a static match operator over the events of its span (``cut``)."""

from __future__ import annotations

import json
import random

import pytest

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.recognize import derived_schemas
from ctiflow.jobs.core.rows import Control, GroupInput
from ctiflow.jobs.driver.rules import check_rule, new_book
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.cep.operator import MatchOperator
from ctiflow.operators.cep.rules import Rule
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.errors import ConfigError
from ctiflow.operators.time import CTI_INFINITY, CTI_NONE, Event

from ctiflow.jobs.avro.serde import AvroSerializer, default_store

T0 = 1_767_225_600_000


def job(on_change="cut", sync="import", late_rules="reject", static=True):
    op = {"kind": "match", "name": "fraud", "output": "rule-matches",
          "rules": {"topic": "fraud-rules", "on_change": on_change, "sync": sync, "late_rules": late_rules}}
    if static:
        op["pattern"] = pattern(2000)
    return parse({"job": "r", "kafka": {"bootstrap_servers": "x:1"},
                  "sources": [{"name": "transactions", "topic": "tx", "schema": "transaction", "key_field": "account",
                               "time_field": "event_time", "partitions": 3}],
                  "operators": [op]}, "t")


def pattern(threshold: float) -> dict:
    return {"within": "10s", "skip": "skip_past_last_event",
            "stages": [{"name": "first", "where": "type == 'purchase'"},
                       {"name": "large", "contiguity": "followed_by",
                        "where": f"type == 'purchase' and amount > {threshold}"}]}


def yaml_of(spec: dict) -> str:
    return json.dumps(spec)  # (JSON is YAML)


def events(seed: int, n: int = 300):
    rng = random.Random(seed)
    out, offsets, t = [], {0: 0, 1: 0, 2: 0}, T0
    for i in range(n):
        t += rng.choice((0, 50, 100, 300))
        p = rng.choices([0, 1, 2], weights=[5, 3, 1])[0]
        f = {"id": f"e{i}", "account": f"a{rng.randrange(4)}", "event_time": t, "type": rng.choice(["purchase"] * 3 + ["refund"]),
             "amount": float(rng.randrange(1, 100) * 50), "currency": "EUR", "country": "DE", "merchant": None}
        out.append(Event(f["account"], t, t, f, p, offsets[p], "transactions"))
        offsets[p] += 1
    return out


def rule_event(rule: Rule, offset: int) -> Event:
    fields = {f: getattr(rule, f) for f in Rule.__dataclass_fields__}
    return Event(rule.rule_id, rule.effective_time, rule.effective_time, fields, 0, offset, "rules_fraud")


def batch_input(evs: list[Event], rules: list[Event]) -> GroupInput:
    got = GroupInput([], [], [("transactions", Control([0, 1, 2], [], False)), ("rules_fraud", Control([0], [], False))], [])
    for stream, mine, parts in (("transactions", evs, (0, 1, 2)), ("rules_fraud", rules, (0,))):
        for p in parts:
            read = sorted((e for e in mine if e.partition == p), key=lambda e: e.offset)
            if read:
                got.frontiers.append((stream, p, max(e.start for e in read)))
                got.columns.append(EventColumns.from_events(read))
    return got


def run(cfg, batches):
    """``batches``: (events, rule events) per micro-batch; the last one flushes."""
    plan = plan_job(cfg)
    rt = GroupRuntime(plan)
    out = []
    for i, (evs, rules) in enumerate(batches):
        rt = GroupRuntime(plan, header=rt.commit(), chunks=rt.chunks)
        got = rt.run_batch(batch_input(evs, rules), final=i == len(batches) - 1)
        out.extend(got.outputs)
        rt.commit()
    return out, rt


def static_matches(spec: dict, evs, end: int, name="fraud"):
    from ctiflow.jobs.core.definitions import parse_pattern
    from ctiflow.operators.cep.operator import MatchSettings

    op = MatchOperator(MatchSettings(pattern=parse_pattern(json.dumps(spec)), name=name, structured_events=True,
                                   emit_timed_out=False))
    got = []
    for e in sorted(evs, key=lambda e: (e.start, e.partition, e.offset)):
        got.extend(op.process(e))
    got.extend(op.advance_to(end))
    return got


def key_of(record: dict) -> tuple:
    return (record["rule_id"] or "", record["rule_version"] or 0, record["key"], record["first_time"],
            record["last_time"])


@pytest.mark.parametrize("seed", range(4))
def test_versions_take_effect_at_their_time_whatever_the_batches(seed):
    evs = events(seed)
    t1, t2 = evs[100].start + 1, evs[200].start + 1
    rules = [Rule("big", "fraud", 1, T0, "put", yaml_of(pattern(3000))),
             Rule("big", "fraud", 2, t1, "put", yaml_of(pattern(1000))),
             Rule("big", "fraud", 3, t2, "delete")]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(evs)), 5))
    parts = [evs[a:b] for a, b in zip([0, *cuts], [*cuts, len(evs)])]
    # Every rule record before the events it governs arrive (none late); the CTI moves with the events.
    batches = [(parts[0], [rule_event(r, i) for i, r in enumerate(rules)]), *[(p, []) for p in parts[1:]], ([], [])]
    out, rt = run(job(), batches)
    got = sorted(key_of(o.record) for topic, o, _ in out if topic == "rule-matches")
    want = []
    for version, spec, lo, hi in ((1, pattern(3000), T0, t1), (2, pattern(1000), t1, t2)):
        for o in static_matches(spec, [e for e in evs if lo <= e.start < hi], hi):
            want.append(("big", version, o.record["key"], o.record["first_time"], o.record["last_time"]))
    for o in static_matches(pattern(2000), evs, CTI_INFINITY):
        want.append(("", 0, o.record["key"], o.record["first_time"], o.record["last_time"]))
    assert got == sorted(want) and any(w[1] == 2 for w in want)
    assert rt.counters.shared["fraud"]["rules_applied"] == 3


def test_a_refused_rule_is_a_dead_letter_with_the_reason_and_changes_nothing():
    evs = events(1, 60)
    bad = Rule("big", "fraud", 1, T0, "put", yaml_of({"stages": [{"name": "a", "where": "no_such_field > 1"}]}))
    late = Rule("late", "fraud", 1, T0, "put", yaml_of(pattern(10)))
    batches = [(evs[:30], [rule_event(bad, 0)]), (evs[30:], [rule_event(late, 1)]), ([], [])]
    out, rt = run(job(static=False), batches)
    dead = [o.record for topic, o, _ in out if topic == "r.dead-letter"]
    assert [d["source_topic"] for d in dead] == ["fraud-rules", "fraud-rules"]
    assert "no_such_field" in dead[0]["error"] and "late: effective_time" in dead[1]["error"]
    assert dead[0]["stage"] == "rule"
    assert [topic for topic, _, _ in out if topic == "rule-matches"] == []
    assert rt.counters.shared["fraud"]["rules_rejected"] == 2
    assert [topic for topic, _, _ in out if topic == "r.late"] == []  # (refused: not late records)


def _rules_through_the_source(cfg, records: list[tuple[bytes, dict, int]], groups: int):
    """Rule records as Kafka messages (key bytes, record, Kafka timestamp) → Avro bytes → the
    source's decoder (the rules stream: every record to every key group) → each key group's
    input rows, as the adapter reads them. → ({label: GroupInput}, the messages)."""
    import confluent_kafka

    from ctiflow.jobs.driver.pipeline import source_options
    from ctiflow.jobs.core.rows import read_input
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder

    source = cfg.rule_sources[0]
    options = source_options(cfg.model_copy(update={"key_groups": groups}), source, False, list(range(groups)))
    encode = AvroSerializer("rule")
    msgs = [confluent_kafka.Message(topic="fraud-rules", partition=0, offset=i, key=key, value=encode(record),
                                    timestamp=(1, stamp)) for i, (key, record, stamp) in enumerate(records)]
    frame = RecordDecoder(options.to_options()).batch(msgs).to_pandas()
    return {label: read_input(rows_of) for label, rows_of in frame.groupby("meta_group")}, msgs


def test_a_refused_rule_record_is_dead_lettered_as_it_came_and_counted_once_over_the_key_groups():
    """The dead letter of a refused rule holds the record's own key and value bytes and its
    Kafka timestamp (the replay recipe of the dead-letter page writes them back as they were);
    every key group judges the rule, one reports it, so the counters balance once: received =
    released (applied) + dead letters (refused)."""
    from ctiflow.jobs.avro.serde import AvroDeserializer

    cfg = job(static=False)
    good = Rule("big", "fraud", 1, T0, "put", yaml_of(pattern(10)))
    bad = Rule("bad", "fraud", 1, T0, "put", "stages: {or: 5}")
    records = [(b"big", {f: getattr(good, f) for f in Rule.__dataclass_fields__}, 1_700_000_000_123),
               (b"a foreign key", {f: getattr(bad, f) for f in Rule.__dataclass_fields__}, 1_700_000_000_456)]
    inputs, msgs = _rules_through_the_source(cfg, records, groups=3)
    assert len(inputs) == 3  # (the rules stream reaches every key group)
    plan = plan_job(cfg)
    dead, counted = [], []
    for label, got in sorted(inputs.items()):
        rt = GroupRuntime(plan, reports_shared=label == min(inputs))
        result = rt.run_batch(got)
        dead += [o.record for topic, o, _ in result.outputs if topic == "r.dead-letter"]
        counted.append(result.counters)
        assert rt.shared.states[0].stats(rt.cti)["versions"] == 1  # every group applied the good one
    assert len(dead) == 1
    d = dead[0]
    assert (d["key"], d["value"], d["kafka_timestamp"], d["offset"]) == (b"a foreign key", msgs[1].value(),
                                                                        1_700_000_000_456, 1)
    assert d["stage"] == "rule" and "rule refused" in d["error"]
    assert AvroDeserializer("rule")(d["value"])["rule_id"] == "bad"  # (the bytes decode as the rule again)
    assert sum(c.received for c in counted) == 2
    assert sum(c.released for c in counted) == 1 and sum(c.dead_letter for c in counted) == 1
    assert sum(c.by_partition.get(("rules_fraud", 0), [0])[0] for c in counted) == 2
    assert [c.side_read for c in counted] == [{("rules_fraud", 0): 2}, {}, {}]  # read through offset 1


def test_an_adjusted_rule_takes_effect_at_the_cti_and_its_records_say_so():
    evs = events(2, 200)
    late = Rule("big", "fraud", 1, T0, "put", yaml_of(pattern(100)))
    batches = [(evs[:100], []), (evs[100:], [rule_event(late, 4)]), ([], [])]
    out, rt = run(job(late_rules="adjust", static=False), batches)
    records = [o.record for topic, o, _ in out if topic == "rule-matches"]
    cti = min(max(e.start for e in evs[:100] if e.partition == p) for p in (0, 1, 2))  # (delay 0)
    assert records and {r["rule_effective_time"] for r in records} == {cti}
    assert min(r["first_time"] for r in records) >= cti
    assert rt.counters.shared["fraud"]["rules_adjusted"] == 1
    # the late topic says which record was moved, from when to when (`ctiflow rules list` reads it)
    late_records = [o.record for topic, o, _ in out if topic == "r.late"]
    assert [(r["stream"], r["partition"], r["offset"], r["start"], r["cti"], r["policy"]) for r in late_records] \
        == [("rules_fraud", 0, 4, T0, cti, "adjust")]
    assert json.loads(late_records[0]["fields_json"])["rule_id"] == "big"
    assert [topic for topic, _, _ in out if topic == "r.dead-letter"] == []


def test_with_sync_min_events_wait_for_the_rules_stream():
    evs = events(3, 100)
    cfg = job(sync="min", static=False)
    plan = plan_job(cfg)
    rt = GroupRuntime(plan)
    got = rt.run_batch(batch_input(evs, []))
    assert got.counters.released == 0  # the rules stream has no CTI yet: nothing released
    rule = Rule("big", "fraud", 1, T0, "put", yaml_of(pattern(100)))
    got = rt.run_batch(batch_input([], [rule_event(rule, 0)]))
    assert got.counters.released == 1  # the rule record alone: its CTI is T0 now, the events after T0 still wait
    later = Rule("big", "fraud", 2, evs[-1].start + 1, "delete")
    got = rt.run_batch(batch_input([], [rule_event(later, 1)]))
    events_cti = min(max(e.start for e in evs if e.partition == p) for p in (0, 1, 2))  # the older now
    assert got.counters.released == 2 + sum(e.start < events_cti for e in evs) > 2  # (the two rule records)


def test_the_records_of_an_operator_with_rules_have_their_own_schema():
    cfg = job()
    name = cfg.result_topics()["rule-matches"]
    assert name == "ruled_match_transactions"
    schema = json.loads(derived_schemas(cfg)[name])
    assert [f["name"] for f in schema["fields"]][-3:] == ["rule_id", "rule_version", "rule_effective_time"]
    store = default_store().with_schemas(derived_schemas(cfg))
    assert default_store().get("rule").parsed["name"] == "ctiflow.rules.Rule"
    evs = events(4, 40)
    out, _ = run(job(static=True), [(evs, []), ([], [])])
    encode = AvroSerializer(name, store=store)
    assert [encode(o.record) for topic, o, _ in out if topic == "rule-matches"]  # (encodes)


def test_sql_rules_write_measures_as_name_value_pairs():
    cfg = parse({"job": "r", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "transactions", "topic": "tx", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time"}],
                 "operators": [{"kind": "match", "name": "q", "output": "out",
                                "rules": {"topic": "q-rules", "language": "sql"}}]}, "t")
    assert cfg.result_topics()["out"] == "ruled_recognize"
    query = ("SELECT * FROM transactions MATCH_RECOGNIZE (PARTITION BY account ORDER BY event_time "
             "MEASURES A.id AS a_id, B.amount AS b_amount PATTERN (A B) "
             "DEFINE A AS A.type = 'purchase', B AS B.amount > 2000)")
    compile = plan_job(cfg).side_inputs[0].shared.compile
    assert compile(Rule("s", "q", 1, T0, "put", query)).sql == query
    with pytest.raises(ConfigError, match="PARTITION BY must include"):
        compile(Rule("s", "q", 1, T0, "put", query.replace("PARTITION BY account", "PARTITION BY country")))
    plan = plan_job(cfg)
    evs = events(5, 80)
    store = default_store().with_schemas(derived_schemas(cfg))
    encode = AvroSerializer("ruled_recognize", store=store)
    from ctiflow.operators.cep.rules import RuleBook
    book = RuleBook(plan.side_inputs[0].shared.settings)
    assert book.offer(Rule("s", "q", 1, T0, "put", query), T0, compile).outcome == "applied"
    op = plan.operators[0].build()
    op.use_shared(book)
    records = [o for e in sorted(evs, key=lambda e: e.start) for o in op.process(e)] + op.advance_to(CTI_INFINITY)
    assert records
    for o in records:
        assert o.record["rule_id"] == "s" and [m["name"] for m in o.record["measures"]] == ["account", "a_id",
                                                                                          "b_amount"]
        encode(o.record)


def test_rule_records_are_checked_before_they_are_written():
    cfg = job()
    check_rule(cfg, Rule("big", "fraud", 1, T0, "put", yaml_of(pattern(10))))
    with pytest.raises(ConfigError, match="no match operator with rules by that name"):
        check_rule(cfg, Rule("big", "other", 1, T0, "put", yaml_of(pattern(10))))
    with pytest.raises(ConfigError, match="stage"):
        check_rule(cfg, Rule("big", "fraud", 1, T0, "put", yaml_of({"stages": []})))
    x, y = yaml_of(pattern(10)), yaml_of(pattern(20))
    book, compile = new_book(cfg, cfg.operators[0])
    assert [book.offer(r, CTI_NONE, compile).outcome for r in (
        Rule("a", "fraud", 1, 5, "put", x), Rule("a", "fraud", 1, 9, "put", y), Rule("a", "fraud", 2, 7, "delete"))] \
        == ["applied", "rejected", "applied"]


def test_the_rules_section_is_checked_with_the_job():
    with pytest.raises(ConfigError, match="rules.topic: 'tx' is a source's topic"):
        parse({"job": "r", "sources": [{"name": "transactions", "topic": "tx", "schema": "transaction",
                                        "key_field": "account", "time_field": "event_time"}],
               "operators": [{"kind": "match", "name": "q", "output": "out", "rules": {"topic": "tx"}}]}, "t")
    with pytest.raises(ConfigError, match="on_change"):
        parse({"job": "r", "sources": [{"name": "transactions", "topic": "tx", "schema": "transaction",
                                        "key_field": "account", "time_field": "event_time"}],
               "operators": [{"kind": "match", "name": "q", "output": "out",
                              "rules": {"topic": "q-rules", "on_change": "flush"}}]}, "t")
    cfg = job()
    assert cfg.topics()["fraud-rules"] == 1 and [s.name for s in cfg.rule_sources] == ["rules_fraud"]


def test_partial_matches_per_rule_are_counted_over_the_chunks_without_decoding_them():
    """``rule_partial_matches@operator/rule``: each rule's runs in flight after the batch, kept in
    the chunks' bookkeeping (a chunk not touched by the next batch still counts)."""
    cfg = job(static=False)
    plan = plan_job(cfg)
    evs = events(6, 120)
    rules = [rule_event(Rule("big", "fraud", 1, T0, "put", yaml_of(pattern(4000))), 0),
             rule_event(Rule("small", "fraud", 1, T0, "put", yaml_of(pattern(10))), 1)]
    rt = GroupRuntime(plan)
    rt.run_batch(batch_input(evs, rules))
    rt.commit()
    runs = dict(rt.counters.tallies)
    # what each rule holds, counted the slow way: every chunk decoded
    want = {}
    rt.keyed.load_all()
    for c in rt.keyed.loaded.values():
        for (rule_id, _), sub in c.ops[0].subs.items():
            want[("fraud", rule_id)] = want.get(("fraud", rule_id), 0) + sub.partial_match_count()
    assert runs == {k: v for k, v in want.items() if v} and runs
    flat = rt.counters.metrics()
    assert flat["rule_partial_matches@fraud/big"] == runs[("fraud", "big")]
    # the next batch touches nothing: the figures stay (from the header's totals)
    rt2 = GroupRuntime(plan, header=rt.commit(), chunks=rt.chunks)
    rt2.run_batch(batch_input([], []))
    rt2.commit()
    assert rt2.counters.tallies == runs


@pytest.mark.parametrize("on_change", ["cut", "drain"])
def test_replaced_versions_leave_the_header_once_no_chunk_and_no_later_event_needs_them(on_change):
    """2,000 replacements of one rule, a few per micro-batch while events flow: the group's
    header keeps the versions in effect or held by a chunk, not every one ever put — it ends the
    size it has with one version — and the matches are the oracle's all along (versions dropped
    only once nothing can judge with them)."""
    evs = events(5, 400)
    span = evs[-1].start - evs[0].start
    times = [T0 + span * i // 2000 for i in range(2000)]
    rules = [Rule("big", "fraud", i + 1, t, "put", yaml_of(pattern(1000 + 500 * (i % 3))))
             for i, t in enumerate(times)]
    cfg = job(on_change=on_change, static=False)
    per = 20
    batches = []
    for b in range(0, 400, per):  # each batch: its events and the rule versions up to its events' time
        mine = evs[b:b + per]
        top = mine[-1].start
        due = [r for r in rules if r.effective_time <= top + 1000 and r.version > sum(map(len, (x[1] for x in batches)))]
        batches.append((mine, [rule_event(r, r.version - 1) for r in due]))
    rest = [r for r in rules if r.version > sum(len(x[1]) for x in batches)]
    batches.append(([], [rule_event(r, r.version - 1) for r in rest]))
    out, rt = run(cfg, batches + [([], [])])
    assert rt.counters.shared["fraud"]["rules_applied"] == 2000
    header = len(rt.shared.states[0].snapshot())
    assert rt.shared.states[0].stats(rt.cti)["versions"] <= 2
    one = run(cfg, [([], [rule_event(rules[-1], 0)])])[1].shared.states[0]
    assert header <= 2 * len(one.snapshot())
    # The matches: each version over the events of its span (cut), or whose runs start in it (drain).
    got = sorted(key_of(o.record) for topic, o, _ in out if topic == "rule-matches")
    want = []
    bounds = [r.effective_time for r in rules[1:]] + [CTI_INFINITY]
    for r, hi in zip(rules, bounds):
        spec = json.loads(r.definition)
        if on_change == "cut":
            mine = [e for e in evs if r.effective_time <= e.start < hi]
            found = static_matches(spec, mine, hi) if mine else []
        else:
            spec["stages"][0]["where"] = f"({spec['stages'][0]['where']}) and event_time >= {r.effective_time} " \
                                         f"and event_time < {hi}"
            found = static_matches(spec, [e for e in evs if e.start >= r.effective_time], CTI_INFINITY)
        want += [("big", r.version, o.record["key"], o.record["first_time"], o.record["last_time"]) for o in found]
    assert got == sorted(want) and want
