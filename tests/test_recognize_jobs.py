"""A ``sql`` match operator in a job gives, per partition, the rows ``ctiflow recognize`` gives
for the same events (the latter is checked against Flink's own rows: test_recognize_flink):
PARTITION BY more columns than the job's key, ORDER BY the time and then further columns, ALL
ROWS PER MATCH and MATCH_NUMBER() — across micro-batches whose state is snapshotted and restored,
with one key per chunk so chunks split as keys arrive, and with the key TTL forgetting keys.

Inputs look like a topic: three partitions at uneven rates, each out of order within the
CTI's slack, many events sharing a millisecond (ties for the further ORDER BY columns)."""

import random

import pytest

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.cep.sql.translate import compile_query, column_families
from ctiflow.operators.time import CTI_INFINITY, Event

T0 = 1_767_225_600_000
TYPES = ["purchase", "withdrawal", "login_failed", "login_ok"]


def job(sql: str, chunk_keys: int = 1, ttl: str | None = None):
    state = {"chunk_keys": chunk_keys, **({"ttl": ttl} if ttl else {})}
    return plan_job(parse({"job": "r", "kafka": {"bootstrap_servers": "x:1"},
                            "sources": [{"name": "transactions", "topic": "tx", "schema": "transaction",
                                         "key_field": "account", "time_field": "event_time"}],
                            "operators": [{"kind": "match", "name": "q", "sql": sql, "output": "out"}],
                            "state": state}, "t"))


def stream(seed: int, n: int = 160):
    """Events of 4 accounts × 2 countries over three partitions (rates 5:3:1), times on a coarse
    grid (ties), arrival order shuffled within each batch; → (batches, CTI after each)."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        t = T0 + rng.randrange(0, n // 2) * 10
        fields = {"id": f"e{i}", "account": f"a{rng.randrange(4)}", "event_time": t,
                  "type": rng.choice(TYPES), "amount": float(rng.randrange(1, 6) * 10),
                  "currency": "EUR", "country": rng.choice(["DE", "FR"]), "merchant": None}
        events.append(fields)
    events.sort(key=lambda f: f["event_time"])
    partitions = [rng.choices([0, 1, 2], weights=[5, 3, 1])[0] for _ in events]
    offsets = {0: 0, 1: 0, 2: 0}
    out = []
    for f, p in zip(events, partitions):
        out.append(Event(f["account"], f["event_time"], f["event_time"], f, p, offsets[p], "transactions"))
        offsets[p] += 1
    cuts = sorted(rng.sample(range(1, n), 4))
    batches = [out[a:b] for a, b in zip([0, *cuts], [*cuts, n])]
    ctis = [batches[i + 1][0].start for i in range(len(batches) - 1)] + [CTI_INFINITY]  # none is late
    for b in batches:
        rng.shuffle(b)
    return batches, ctis


def run_job(plan, batches, ctis):
    """Each micro-batch as the adapter runs it: restore from the committed bytes, offer, advance, commit."""
    rt = GroupRuntime(plan)
    rows = []
    for events, cti in zip(batches, ctis):
        rt = GroupRuntime(plan, header=rt.commit(), chunks=rt.chunks)
        rt.offer_many(events)
        for topic, o, key in rt.advance(cti):
            assert topic == "out", o
            rows.append((key, o.record))
        rt.commit()
    return rows


def oracle(sql, batches):
    """``ctiflow recognize`` over the same events, in the order the job releases them (time, then
    partition and offset: the order ties keep after the further ORDER BY columns)."""
    events = sorted((e for b in batches for e in b), key=lambda e: (e.start, e.partition, e.offset))
    rows = [dict(e.fields) for e in events]
    return compile_query(sql, column_families(rows)).run(rows)


def by_partition(rows, columns):
    found = {}
    for r in rows:
        found.setdefault(tuple(r[c] for c in columns), []).append(r)
    return found


QUERIES = {
    "partition by account and country": """
        SELECT * FROM transactions MATCH_RECOGNIZE (
          PARTITION BY account, country ORDER BY event_time
          MEASURES FIRST(A.id) AS first_id, LAST(B.id) AS last_id, COUNT(A.id) AS spends
          ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
          PATTERN (A{2,} B)
          DEFINE A AS A.type = 'purchase', B AS B.type <> 'purchase')""",
    "order by time, then amount descending and id": """
        SELECT * FROM transactions MATCH_RECOGNIZE (
          PARTITION BY account ORDER BY event_time, amount DESC, id
          MEASURES A.id AS a_id, B.id AS b_id, C.id AS c_id, B.amount AS b_amount
          AFTER MATCH SKIP TO NEXT ROW
          PATTERN (A B C)
          DEFINE B AS B.amount < A.amount, C AS C.amount <= B.amount)""",
    "all rows per match with running and final measures": """
        SELECT * FROM transactions MATCH_RECOGNIZE (
          PARTITION BY account ORDER BY event_time
          MEASURES RUNNING COUNT(*) AS so_far, FINAL COUNT(*) AS total, CLASSIFIER() AS var,
                   RUNNING SUM(A.amount) AS spent
          ALL ROWS PER MATCH AFTER MATCH SKIP PAST LAST ROW
          PATTERN (A+? B)
          DEFINE A AS A.type IN ('purchase', 'withdrawal'), B AS B.type = 'login_failed')""",
    "match numbers per partition, across batches": """
        SELECT * FROM transactions MATCH_RECOGNIZE (
          PARTITION BY country, account ORDER BY event_time, id
          MEASURES MATCH_NUMBER() AS n, A.id AS a_id, B.id AS b_id
          AFTER MATCH SKIP PAST LAST ROW
          PATTERN (A B) WITHIN INTERVAL '1' SECOND
          DEFINE A AS A.amount >= 30, B AS B.amount < A.amount)""",
}


@pytest.mark.parametrize("name", sorted(QUERIES))
@pytest.mark.parametrize("seed", range(12))
def test_a_job_gives_the_rows_recognize_gives(name, seed):
    sql = QUERIES[name]
    q = compile_query(sql).query
    batches, ctis = stream(seed)
    got = run_job(job(sql), batches, ctis)
    want = oracle(sql, batches)
    assert want, "the stream should produce some matches"
    assert all(key == r["account"] for key, r in got)  # the Kafka key is the job's key
    got_rows = [r for _, r in got]
    assert by_partition(got_rows, q.partition_by) == by_partition(want, q.partition_by)


def test_chunking_and_restoring_do_not_change_the_rows():
    sql = QUERIES["match numbers per partition, across batches"]
    batches, ctis = stream(99, 400)
    one_chunk = run_job(job(sql, chunk_keys=1_000_000), batches, ctis)
    split = run_job(job(sql, chunk_keys=1), batches, ctis)
    assert sorted(map(repr, one_chunk)) == sorted(map(repr, split))
    assert max(r["n"] for _, r in split) > 3  # numbers carried over batches


def test_numbering_starts_again_after_the_key_ttl_forgets_a_key():
    sql = QUERIES["match numbers per partition, across batches"]
    plan = job(sql, ttl="1m")
    e = [Event("a0", t, t, {"id": i, "account": "a0", "event_time": t, "type": "purchase", "amount": amount,
                            "currency": "EUR", "country": "DE", "merchant": None}, 0, n, "transactions")
         for n, (i, t, amount) in enumerate([("x1", T0, 50.0), ("x2", T0 + 1, 10.0),
                                              ("x3", T0 + 5, 50.0), ("x4", T0 + 6, 10.0),
                                              ("x5", T0 + 600_000, 50.0), ("x6", T0 + 600_001, 10.0)])]
    rows = run_job(plan, [e[:4], [], e[4:]], [T0 + 100, T0 + 300_000, CTI_INFINITY])  # the 2nd CTI forgets a0
    assert [(r["n"], r["a_id"]) for _, r in rows] == [(1, "x1"), (2, "x3"), (1, "x5")]


def test_all_rows_per_match_derives_a_schema_with_every_column():
    import json

    from ctiflow.jobs.driver.recognize import derived_schemas

    cfg = parse({"job": "r", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "transactions", "topic": "tx", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time"}],
                 "operators": [{"kind": "match", "name": "q", "sql": QUERIES[
                     "all rows per match with running and final measures"], "output": "out"}]}, "t")
    schema = json.loads(derived_schemas(cfg)["recognize_q"])
    names = [f["name"] for f in schema["fields"]]
    assert names == ["account", "event_time", "so_far", "total", "var", "spent", "id", "type", "amount", "currency",
                     "country", "merchant"]
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types["so_far"] == "long" and types["var"] == "string" and types["amount"] == ["null", "double"]
    assert types["event_time"] == ["null", "long"]  # the input's plain long: a BIGINT, as declared


def test_the_time_columns_type_is_the_declared_one():
    from ctiflow.jobs.core.definitions import family

    assert family(["null", "long"]) == "number"  # epoch ms you can subtract: B.event_time - A.event_time
    assert family({"type": "long", "logicalType": "timestamp-millis"}) == "timestamp"
    assert family(["null", {"type": "long", "logicalType": "timestamp-millis"}]) == "timestamp"
