"""Count, bins and match jobs through Kafka, each compared with an independent oracle.

Inputs are on three partitions with uneven rates (keys spread 2 : 1 : 2 over them); with
``max_offsets_per_trigger`` the source's micro-batch cuts — and with them each partition's
CTI — are known to the oracle (``ctiflow.jobs.testing.oracle.spread_batches``)."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from integration_tests.harness import job, produce, read, run
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.driver.recognize import job_schema_store
from ctiflow.jobs.testing import oracle, workload

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BATCH = 400
PARTITIONS = 3


def partition_of_key(key: str) -> int:
    """Uneven: two fifths of the keys on partition 0, one fifth on 1, two fifths on 2."""
    import zlib

    return (0, 0, 1, 2, 2)[zlib.crc32(key.encode()) % 5]


def spread_keys(field: str):
    return lambda i, rec: partition_of_key(str(rec[field]))


def checked_input(records: list[dict], key: str, time: str, end: str | None, delay: int, batch: int,
                  policy: str = "drop") -> list:
    events = oracle.to_events(records, key, time, end, partition_of=partition_of_key)
    return oracle.check(events, delay, policy=policy, batches=oracle.spread_batches(events, batch))


def tx_source(topic: str, delay: str, policy: str = "drop") -> dict:
    return {"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account", "time_field": "event_time",
            "partitions": PARTITIONS, "max_offsets_per_trigger": BATCH,
            # the oracle does not model idleness: no partition may go idle during the run
            "cti": {"delay": delay, "policy": policy, "idle_timeout": "1h"}}


def test_count_records_are_within_the_bound_of_the_brute_force_count(stack, spark, tmp_path):
    records = workload.transactions(2400, accounts=20, seed=3, disorder_ms=1500, late_fraction=0.01, late_by_ms=60_000)
    src, counts = stack.topic("cnt-in"), stack.topic("cnt-out")
    kafka.create_topics(stack.bootstrap, {src: PARTITIONS})
    produce(stack.bootstrap, src, "transaction", records, "account", partition_of=spread_keys("account"))
    cfg = job(stack, tmp_path, job="count", sources=[tx_source(src, "5s")],
              operators=[{"kind": "count", "name": "per_account_1m", "window": {"time": "1m"}, "epsilon": 0.1,
                          "per_key": True, "predicate": "amount > 100", "emit": "per_event", "output": counts},
                         {"kind": "count", "name": "global_last_200", "window": {"events": 200}, "epsilon": 0.05,
                          "per_key": False, "emit": "per_event", "output": counts}],
              outputs={"late": stack.topic("cnt-late"), "dead_letter": stack.topic("cnt-dlq")})
    run(cfg, spark)

    checked = checked_input(records, "account", "event_time", None, 5000, BATCH)
    late = [c for c in checked if c.status == oracle.LATE]
    assert late, "the workload must contain late events for this test to mean something"
    assert sorted((r["partition"], r["offset"]) for r in read(stack, cfg.late_topic)) == \
        sorted((c.event.partition, c.event.offset) for c in late)

    got = read(stack, counts)
    for name, kind, window, per_key, pred, eps in (
            ("per_account_1m", "time", 60_000, True, lambda f: f["amount"] > 100, 0.1),
            ("global_last_200", "events", 200, False, None, 0.05)):
        exact = oracle.sliding_counts(checked, kind, window, pred, per_key)
        mine = [r for r in got if r["counter"] == name]
        assert len(mine) == len(exact) == len(records) - len(late)
        by_key: dict[str, list] = {}
        for r in mine:
            by_key.setdefault(r["key"], []).append(r)
        expected: dict[str, list] = {}
        for e in exact:
            expected.setdefault(e["key"], []).append(e)
        assert by_key.keys() == expected.keys()
        for key, recs in by_key.items():
            for r, e in zip(recs, expected[key], strict=True):
                assert r["time"] == e["time"]
                assert r["lower"] <= e["exact"] <= r["upper"]
                assert abs(r["estimate"] - e["exact"]) <= eps * e["exact"] + 1e-9


@pytest.mark.parametrize("policy", ["drop", "adjust"])
def test_final_bins_equal_the_exhaustive_oracle_and_conserve_measures(stack, spark, tmp_path, policy):
    flows = workload.flows(1200, devices=6, seed=11, rate_per_s=0.5, late_fraction=0.05, late_by_ms=900_000)
    src = stack.topic(f"bins-in-{policy}")
    outs = {k: stack.topic(f"bins-{k}") for k in ("incremental", "updated", "final")}
    kafka.create_topics(stack.bootstrap, {src: PARTITIONS})
    produce(stack.bootstrap, src, "flow", flows, "device", partition_of=spread_keys("device"))
    cfg = job(stack, tmp_path, job=f"bins-{policy}",
              sources=[{"name": "flows", "topic": src, "schema": "flow", "key_field": "device",
                        "time_field": "start_time", "end_field": "end_time", "shape": "interval",
                        "partitions": PARTITIONS, "measures": ["bytes", "packets"], "max_offsets_per_trigger": 200,
                        "cti": {"delay": "2m", "policy": policy, "idle_timeout": "1h"}}],
              operators=[{"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes", "packets"],
                          "outputs": outs}],
              outputs={"late": stack.topic("bins-late"), "dead_letter": stack.topic("bins-dlq")})
    run(cfg, spark)

    checked = checked_input(flows, "device", "start_time", "end_time", 120_000, 200, policy)
    assert any(c.status == oracle.LATE for c in checked), "the workload must violate the CTI"
    if policy == "adjust":
        assert any(c.status == oracle.ADJUSTED for c in checked)
    expected = oracle.final_bins(checked, 60_000, 0, ["bytes", "packets"])
    final = read(stack, outs["final"])
    assert len(final) == len({(r["key"], r["bin_start"]) for r in final})  # each bin exactly once
    assert {(r["key"], r["bin_start"]) for r in final} == set(expected)
    for r in final:
        e = expected[(r["key"], r["bin_start"])]
        for m in ("bytes", "packets"):
            assert math.isclose(r["measures"][m], float(e.measures[m]), rel_tol=1e-9, abs_tol=1e-6)
        assert r["events"] == e.events

    incremental, updated = read(stack, outs["incremental"]), read(stack, outs["updated"])
    for (key, start), e in expected.items():
        inc = sum(r["measures"]["bytes"] for r in incremental if r["key"] == key and r["bin_start"] == start)
        assert math.isclose(inc, float(e.measures["bytes"]), rel_tol=1e-9, abs_tol=1e-6)
        revs = [r for r in updated if r["key"] == key and r["bin_start"] == start]
        assert [r["revision"] for r in revs] == sorted(r["revision"] for r in revs)
        assert math.isclose(revs[-1]["measures"]["bytes"], float(e.measures["bytes"]), rel_tol=1e-9, abs_tol=1e-6)

    late = read(stack, cfg.late_topic)
    late_bytes = sum((r["measures"] or {}).get("bytes", 0.0) if r["measures"] else
                     json.loads(r["fields_json"])["bytes"] for r in late)
    total = sum(Fraction(f["bytes"]) for f in flows)
    assert math.isclose(sum(r["measures"]["bytes"] for r in final) + late_bytes, float(total), rel_tol=1e-9)


BRUTE_FORCE = {"within_ms": 300_000, "skip": "skip_past_last_event",
               "stages": [{"name": "failures", "where": "type == 'login_failed'", "quantifier": {"times": 3},
                           "consecutive": True},
                          {"name": "success", "contiguity": "next", "where": "type == 'login_ok'"}]}

#: The same pattern as SQL (Flink's translation: strict contiguity, times(3) consecutive, WITHIN).
BRUTE_FORCE_SQL = """SELECT * FROM tx MATCH_RECOGNIZE (
  PARTITION BY account ORDER BY event_time
  MEASURES FIRST(F.event_time) AS first_time, S.event_time AS last_time, COUNT(F.id) AS failures,
           S.country AS login_country
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (F{3} S) WITHIN INTERVAL '5' MINUTE
  DEFINE F AS F.type = 'login_failed', S AS S.type = 'login_ok'
)"""


def brute_force_run(stack, spark, tmp_path, name: str, operator: dict, seed: int):
    """Out-of-order, multi-partition logins through a one-operator job; → (the job's config, the
    input records, the Pattern API operator's matches run stepwise over the admitted events in
    order: the oracle)."""
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
    from ctiflow.operators.time import CTI_INFINITY, Event

    records = workload.transactions(2000, accounts=15, seed=seed, disorder_ms=3000, scenario_rate=0.05)
    src, out = stack.topic(f"{name}-in"), stack.topic(f"{name}-out")
    kafka.create_topics(stack.bootstrap, {src: PARTITIONS})
    produce(stack.bootstrap, src, "transaction", records, "account", partition_of=spread_keys("account"))
    cfg = job(stack, tmp_path, job=name, sources=[tx_source(src, "10s")], operators=[{**operator, "output": out}],
              outputs={"late": stack.topic(f"{name}-late"), "dead_letter": stack.topic(f"{name}-dlq")})
    run(cfg, spark)
    checked = checked_input(records, "account", "event_time", None, 10_000, BATCH)
    assert all(c.status == oracle.ADMITTED for c in checked)  # disorder stays within the delay
    assert records != sorted(records, key=lambda r: r["event_time"])  # the input really was out of order
    stepwise = MatchOperator(MatchSettings(pattern=BRUTE_FORCE, name="brute-force", emit_timed_out=False))
    expected = []
    for c in sorted(checked, key=lambda c: c.order):
        expected += stepwise.process(Event(c.key, c.start, c.end, dict(c.fields), c.event.partition, c.event.offset, "tx"))
    expected += stepwise.advance_to(CTI_INFINITY)
    return cfg, records, [o.record for o in expected if o.role == "match"]


def test_match_job_on_out_of_order_input_equals_the_in_order_stepwise_run(stack, spark, tmp_path):
    cfg, _, expected = brute_force_run(stack, spark, tmp_path, "cep", {"kind": "match", "name": "brute-force",
                                                                       "pattern": BRUTE_FORCE}, seed=5)
    want = sorted((m["key"], m["first_time"], m["last_time"]) for m in expected)
    found = read(stack, cfg.operators[0].output)
    got = sorted((r["key"], r["first_time"], r["last_time"]) for r in found)
    assert want and got == want
    # the job's records carry the matched events as typed records (the operator alone: JSON text)
    def events(m, parse):
        return (m["key"], m["first_time"], m["last_time"]), [[parse(e) for e in s["events"]] for s in m["stages"]]

    assert dict(events(m, json.loads) for m in expected) == dict(events(r, lambda e: e) for r in found)
    # a reader that never saw the job (a fresh `ctiflow consume`, no job file) decodes the typed records too
    from integration_tests.test_schema_topic import consume

    fresh = consume(stack, cfg.operators[0].output)
    assert not any("_undecodable" in r for r in fresh) and len(fresh) == len(found)


def test_a_match_recognize_job_finds_what_the_equivalent_pattern_api_job_finds(stack, spark, tmp_path):
    """The SQL form of the brute-force pattern as a job: its typed records (partition column,
    measures) are the Pattern API operator's matches."""

    cfg, records, expected = brute_force_run(stack, spark, tmp_path, "sql", {
        "kind": "match", "name": "brute-force-sql", "sql": BRUTE_FORCE_SQL}, seed=6)
    by_id = {r["id"]: r for r in records}
    want = sorted((m["key"], m["first_time"], m["last_time"], 3,
                   by_id[json.loads(m["stages"][-1]["events"][-1])["id"]]["country"]) for m in expected)
    store = job_schema_store(cfg)  # this process decodes the derived record schema
    got = sorted((r["account"], millis(r["first_time"]), millis(r["last_time"]), r["failures"], r["login_country"])
                 for r in read(stack, cfg.operators[0].output, store))
    assert want and got == want


#: The brute-force pattern whose DEFINEs divide by an amount: 0-based CAST(-1.0) + 1 is zero, so a
#: record with amount -1 fails every F condition (the start state tries each record as F).
POISONED_SQL = BRUTE_FORCE_SQL.replace(
    "DEFINE F AS F.type = 'login_failed', S AS S.type = 'login_ok'",
    "DEFINE F AS 100 / (CAST(F.amount AS INT) + 1) >= 0 AND F.type = 'login_failed',\n"
    "         S AS 100 / (CAST(S.amount AS INT) + 1) >= 0 AND S.type = 'login_ok'")


def test_a_sql_job_dead_letters_a_record_its_define_fails_on_and_matches_the_rest(stack, spark, tmp_path):
    """Poison records (an integer division by zero in DEFINE) on every partition: each is in the
    dead-letter topic with the reason, the job runs to the end, and its matches are the Pattern API
    operator's over the admitted records without them (as if they had not come)."""
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
    from ctiflow.operators.time import CTI_INFINITY, Event

    assert POISONED_SQL != BRUTE_FORCE_SQL
    records = workload.transactions(2000, accounts=15, seed=9, disorder_ms=3000, scenario_rate=0.05)
    assert all(r["amount"] != -1.0 for r in records)
    poisoned = set()
    for p in range(PARTITIONS):  # four records of every kind on each partition, spread over the run
        on_p = [i for i, r in enumerate(records) if partition_of_key(r["account"]) == p]
        for i in on_p[10::len(on_p) // 4][:4]:
            records[i] = {**records[i], "amount": -1.0}
            poisoned.add(records[i]["id"])
    src, out, dlq = stack.topic("sql-poison-in"), stack.topic("sql-poison-out"), stack.topic("sql-poison-dlq")
    kafka.create_topics(stack.bootstrap, {src: PARTITIONS})
    produce(stack.bootstrap, src, "transaction", records, "account", partition_of=spread_keys("account"))
    cfg = job(stack, tmp_path, job="sql-poison", sources=[tx_source(src, "10s")],
              operators=[{"kind": "match", "name": "poisoned", "sql": POISONED_SQL, "output": out}],
              outputs={"late": stack.topic("sql-poison-late"), "dead_letter": dlq})
    run(cfg, spark)
    checked = checked_input(records, "account", "event_time", None, 10_000, BATCH)
    assert all(c.status == oracle.ADMITTED for c in checked)
    stepwise = MatchOperator(MatchSettings(pattern=BRUTE_FORCE, name="brute-force", emit_timed_out=False))
    expected = []
    for c in sorted(checked, key=lambda c: c.order):
        if c.fields["id"] not in poisoned:
            expected += stepwise.process(Event(c.key, c.start, c.end, dict(c.fields), c.event.partition,
                                               c.event.offset, "tx"))
    expected += stepwise.advance_to(CTI_INFINITY)
    want = sorted((o.record["key"], o.record["first_time"], o.record["last_time"]) for o in expected
                  if o.role == "match")
    store = job_schema_store(cfg)
    got = sorted((r["account"], millis(r["first_time"]), millis(r["last_time"])) for r in read(stack, out, store))
    assert len(want) > 5 and got == want
    letters = read(stack, dlq, store)
    assert sorted(json.loads(d["value"])["id"] for d in letters) == sorted(poisoned)
    assert all(d["stage"] == "operator" and "DEFINE F: division by zero" in d["error"] for d in letters)
    assert {d["partition"] for d in letters} == set(range(PARTITIONS))


def sql_job_and_recognize(stack, spark, tmp_path, name: str, operator: str, sql: str, records: list[dict]):
    """``records`` on three partitions through a job whose one operator runs ``sql`` → (its
    config, its output topic — read it with the job's schema store —, and what `ctiflow recognize`,
    checked against Flink, gives for the admitted events in application-time order: the oracle)."""
    from ctiflow.operators.cep.sql.translate import column_families, compile_query

    src, out = stack.topic(f"{name}-in"), stack.topic(f"{name}-out")
    kafka.create_topics(stack.bootstrap, {src: PARTITIONS})
    produce(stack.bootstrap, src, "transaction", records, "account", partition_of=spread_keys("account"))
    cfg = job(stack, tmp_path, job=name, sources=[tx_source(src, "10s")],
              operators=[{"kind": "match", "name": operator, "sql": sql, "output": out}],
              outputs={"late": stack.topic(f"{name}-late"), "dead_letter": stack.topic(f"{name}-dlq")})
    run(cfg, spark)
    checked = checked_input(records, "account", "event_time", None, 10_000, BATCH)
    assert all(c.status == oracle.ADMITTED for c in checked)
    rows = [dict(c.fields) for c in sorted(checked, key=lambda c: c.order)]
    want = compile_query(sql, column_families(rows)).run(rows)
    return cfg, out, want


def test_a_sql_job_with_a_hot_key_keeps_state_linear_in_its_rows_and_finds_what_recognize_finds(stack, spark, tmp_path):
    """``examples/recognize/two-countries.sql`` as a job's ``sql:``; beside 15 ordinary accounts one
    card-testing account makes 600 purchases 100 ms apart, countries alternating, then one large
    purchase: every row starts a run that waits for it. The job's rows are `ctiflow recognize`'s
    (checked against Flink) for the admitted events, and its keyed state stays small at its
    largest: before, this one key held ~70 MB (runs × their length) and cost ~30 s of CPU."""
    from pathlib import Path

    from ctiflow.bench.match_operator import hot_key_records
    from ctiflow.jobs.driver.checkpoint import ProgressLog, latest_query

    sql = (Path(__file__).resolve().parent.parent / "examples" / "recognize" / "two-countries.sql").read_text()
    base = workload.transactions(1500, accounts=15, seed=11, disorder_ms=3000, scenario_rate=0.05)
    t0 = base[0]["event_time"]
    hot = hot_key_records(600, start_ms=t0)
    hot.append({**hot[-1], "id": "h-large", "event_time": hot[-1]["event_time"] + 100, "amount": 2500.0,
                "country": "FR"})
    records = sorted(base + hot, key=lambda r: r["event_time"])  # the hot key interleaved, as it arrived
    cfg, out, want = sql_job_and_recognize(stack, spark, tmp_path, "sql-hot", "two-countries", sql, records)
    got = read(stack, out, job_schema_store(cfg))

    def table(found):
        return sorted((r["account"], r["home"], r["abroad"], r["amount"], millis(r["large_at"])) for r in found)

    assert any(r["account"] == "acct-hot" for r in want) and table(got) == table(want)
    batches = latest_query(ProgressLog.of(cfg).read()[0])
    largest = max(b.get("state_bytes", 0) for b in batches)
    assert 0 < largest < 4 * 2**20, largest  # a few hundred kB: the key's 600 rows and 600 short runs


def millis(value) -> int:
    """A timestamp-millis field as epoch ms, whether the decoder gave an int or a datetime."""
    return value if isinstance(value, int) else int(value.timestamp() * 1000)


#: Beyond the job's key: PARTITION BY a second column, ORDER BY a tie-breaking column, ALL ROWS
#: PER MATCH, MATCH_NUMBER() (numbers carried across micro-batches in the state).
ALL_ROWS_SQL = """SELECT * FROM tx MATCH_RECOGNIZE (
  PARTITION BY account, country ORDER BY event_time, id DESC
  MEASURES MATCH_NUMBER() AS n, CLASSIFIER() AS var, RUNNING COUNT(*) AS so_far
  ALL ROWS PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (F{2} S) WITHIN INTERVAL '5' MINUTE
  DEFINE F AS F.type IN ('login_failed', 'withdrawal'), S AS S.type <> F.type
)"""


def test_all_rows_per_match_with_a_wider_partition_gives_what_recognize_gives(stack, spark, tmp_path):
    """The job's typed rows, per partition (account, country), are those `ctiflow recognize`
    (checked against Flink) gives for the admitted events in application-time order."""

    records = workload.transactions(2000, accounts=15, seed=8, disorder_ms=3000, scenario_rate=0.05)
    cfg, out, want = sql_job_and_recognize(stack, spark, tmp_path, "sql-all", "all-rows", ALL_ROWS_SQL, records)

    def per_partition(found):
        table = {}
        for r in found:
            table.setdefault((r["account"], r["country"]), []).append(
                (millis(r["event_time"]), r["id"], r["n"], r["var"], r["so_far"], r["amount"]))
        return table

    got = per_partition(read(stack, out, job_schema_store(cfg)))
    assert len(want) > 20 and max(r["n"] for r in want) > 1
    assert got == per_partition(want)
