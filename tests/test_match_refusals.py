"""A record a condition fails on is refused as if it had not come, and a busy key's state grows
with its events, not with its runs × their length — for SQL ``MATCH_RECOGNIZE`` and the Pattern
API alike (one NFA, one buffer per plan shape).

Oracles: Flink's own recorded answers (``tests/data/recognize``) for the queries with poison rows
added; the same operator fed without the poison events for the Pattern API."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.bench.match_operator import HOT_KEY_PATTERN, HOT_KEY_SQL_FILE, hot_key_records, to_events
from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
from ctiflow.operators.cep.sql.translate import column_families, compile_query
from ctiflow.operators.cep.expr.vocabulary import Timestamp
from ctiflow.operators.cep.sql.parse import parse
from ctiflow.operators.cep.expr.tree import Expr
from ctiflow.operators.errors import EventRejected
from ctiflow.operators.time import CTI_INFINITY, Event
from ctiflow.jobs.testing.snapshots import match_state
from tests.test_recognize_flink import RECORDED, TYPES, by_partition, same

TWO_COUNTRIES = HOT_KEY_SQL_FILE.read_text()


def _poisoned(query_text: str):
    """The query with ``CAST(chk AS INT) = 1 AND (…)`` before every variable's DEFINE (one
    without a DEFINE gets ``TRUE``): on a row whose ``chk`` is ``'1'`` each condition is what it
    was; on ``'x'`` the first condition tried fails (CAST), and the start state tries one on
    every row."""
    q = parse(query_text)
    check = Expr("binary", 0, "=", (Expr("cast", 0, "INT", (Expr("column", 0, (None, "chk")),)),
                                     Expr("literal", 0, 1)))
    for var in q.pattern:
        original = q.define.get(var.name, Expr("literal", 0, True))
        q.define[var.name] = Expr("binary", 0, "AND", (check, original))
        q.define_pos.setdefault(var.name, var.pos)
    return q


ANSWERED = [c for c in RECORDED if c["error"] is None]


@pytest.mark.parametrize("case", ANSWERED[::3], ids=[c["name"] for c in ANSWERED[::3]])
def test_rows_a_define_fails_on_are_refused_and_the_rest_gives_flinks_answer(case):
    rng = random.Random(case["name"])
    rows, poison = [], set()
    for values in case["events"]:
        row = {**dict(zip(case["columns"], values)), "chk": "1"}
        rows.append(row)
        if rng.random() < 0.15:  # a copy at the same time and partition that fails every DEFINE
            rows.append({**row, "chk": "x"})
            poison.add(len(rows))
    refused: list = []
    got = compile_query(_poisoned(case["query"]), {**column_families(rows), **TYPES}).run(rows, refused)
    assert sorted(n for n, _ in refused) == sorted(poison)
    assert all("CAST('x' AS BIGINT) is not possible" in reason for _, reason in refused)
    columns = case["output"]
    ours = [[str(r.get(c)) if isinstance(r.get(c), Timestamp) else r.get(c) for c in columns] for r in got]
    partition = sum(1 for c in columns if c in ("part",))
    theirs, mine = by_partition(columns, case["rows"], partition), by_partition(columns, ours, partition)
    assert mine.keys() == theirs.keys()
    for key in theirs:
        assert len(mine[key]) == len(theirs[key])
        assert all(all(same(x, y) for x, y in zip(m, t)) for m, t in zip(mine[key], theirs[key]))


def test_some_poisoned_cases_match_something():
    assert sum(bool(c["rows"]) for c in ANSWERED[::3]) > 300


#: Pattern API stages whose conditions fail on a record with a string ``note`` (compared with a
#: number): iterative and simple, with a window so that time passing emits too.
PATTERNS = [
    {"within_ms": 40, "stages": [
        {"name": "a", "where": "kind == 'a' and note > 0"},
        {"name": "b", "contiguity": "followed_by", "where": "amount > first('a').amount and note > 0",
         "quantifier": "one_or_more"},
        {"name": "c", "contiguity": "followed_by", "where": "kind == 'c' and note > 0"}]},
    {"skip": "skip_past_last_event", "stages": [
        {"name": "a", "where": "note > 0"},
        {"name": "b", "contiguity": "next", "where": "note > 0 and kind != 'a'", "quantifier": "one_or_more",
         "consecutive": True},
        {"name": "c", "contiguity": "next", "where": "kind == 'c' and note > 0"}]},
]


@st.composite
def streams(draw):
    n = draw(st.integers(5, 60))
    events, t = [], 1000
    for i in range(n):
        t += draw(st.integers(0, 9))
        fields = {"kind": draw(st.sampled_from("abc")), "amount": float(draw(st.integers(0, 5))), "note": 1}
        key = draw(st.sampled_from(["k0", "k1"]))
        events.append(Event(key, t, t, fields, 0, i, "s"))
        if draw(st.integers(0, 5)) == 0:  # a poison event at the same time and key
            events.append(Event(key, t, t, {**fields, "note": "x"}, 0, -1, "s"))
    return events


def _content(snapshot: bytes) -> tuple:
    """A match operator's snapshot as content (keys sorted, each key's state unpickled)."""
    content = match_state(snapshot)
    return (content["version"], content["fingerprint"], sorted(content["keys"].items()),
            sorted(content["numbers"].items()))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(range(len(PATTERNS))), streams())
def test_a_refused_event_leaves_the_pattern_api_operator_as_if_it_had_not_come(which, events):
    settings_ = MatchSettings(pattern=PATTERNS[which], emit_timed_out=True)
    fed, clean = MatchOperator(settings_), MatchOperator(settings_)
    got, want = [], []
    for e in events:
        try:
            got += fed.process(e)
        except EventRejected as exc:
            assert e.fields["note"] == "x" and "failed on record" in str(exc)
            got += exc.outputs
            continue
        assert e.fields["note"] != "x" or _content(fed.snapshot()) == _content(clean.snapshot())
        want += clean.process(e)
    assert [o.record for o in got] == [o.record for o in want]
    assert _content(fed.snapshot()) == _content(clean.snapshot())
    assert [o.record for o in fed.advance_to(CTI_INFINITY)] == [o.record for o in clean.advance_to(CTI_INFINITY)]


def _hot_key(n: int) -> list[Event]:
    """One account's purchases 100 ms apart, countries alternating, none large: every row starts
    a run that waits (for ten minutes) for a large purchase."""
    return to_events(hot_key_records(n))


def _state_bytes(settings_: MatchSettings, n: int) -> tuple[int, int]:
    op = MatchOperator(settings_)
    for e in _hot_key(n):
        op.process(e)
    return len(op.snapshot()), op.partial_match_count()


def test_a_hot_keys_sql_state_grows_with_its_events_as_the_pattern_apis_does():
    sql = MatchSettings(pattern=None, sql=TWO_COUNTRIES, emit_timed_out=False)
    api = MatchSettings(pattern=HOT_KEY_PATTERN, emit_timed_out=False)
    small, runs_small = _state_bytes(sql, 200)
    large, runs_large = _state_bytes(sql, 600)
    assert runs_large >= 3 * runs_small - 3  # every row started a run that is still alive
    assert large < 3.6 * small  # linear in the events (3×); runs × their length would be ≥ 9×
    api_large, _ = _state_bytes(api, 600)
    assert large < 2 * api_large


def test_the_buffered_events_limit_bounds_a_sql_key():
    limited = MatchSettings(pattern=None, sql=TWO_COUNTRIES, emit_timed_out=False, max_buffered_events=100)
    op = MatchOperator(limited)
    refused = 0
    for e in _hot_key(400):
        try:
            op.process(e)
        except EventRejected:
            refused += 1
    assert refused >= 250 and op.buffered_event_count() <= 101


def test_integer_measures_wrap_as_java_longs_and_never_leave_64_bits():
    """``A.q * B.q * C.q`` of large BIGINTs: Flink's long arithmetic wraps at 64 bits; a result
    Python would keep whole (2^69) would not fit the output's Avro ``long``, and the encoder would
    fail the whole job on that one match. A CAST beyond BIGINT refuses the row instead."""
    from ctiflow.jobs.avro.encode import ColumnEncoder

    query = ("SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES A.q * B.q * C.q AS p, "
             "SUM(A.q) + SUM(B.q) AS s ONE ROW PER MATCH PATTERN (A B C) DEFINE A AS q > 0)")
    import numpy as np

    qs = [3_000_000_007, 5_000_000_011, 7_000_000_013]
    rows = [{"k": "x", "ts": i, "q": q} for i, q in enumerate(qs)]
    (out,) = compile_query(query).run(rows)
    with np.errstate(over="ignore"):  # NumPy's int64 wraps as Java's long does: the oracle
        want = int(np.int64(qs[0]) * np.int64(qs[1]) * np.int64(qs[2]))
    assert out["p"] == want and want != qs[0] * qs[1] * qs[2] and out["s"] == qs[0] + qs[1]
    schema = {"type": "record", "name": "r", "fields": [{"name": "p", "type": "long"}]}
    assert len(ColumnEncoder(schema, b"").encode({"p": [out["p"]]}, 1)) == 1
    refused = []
    cast = ("SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES A.ts AS at ONE ROW PER MATCH "
            "PATTERN (A) DEFINE A AS CAST(s AS BIGINT) > 0)")
    got = compile_query(cast).run([{"k": "x", "ts": 1, "s": "1e30"}, {"k": "x", "ts": 2, "s": "5"}], refused)
    assert [r["at"] for r in got] == [2] and len(refused) == 1 and "BIGINT" in str(refused[0])
