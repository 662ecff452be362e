"""MATCH_RECOGNIZE semantics beyond the recorded Flink cases: Flink's own documented and tested
examples (their expected rows quoted from Flink's docs and MatchRecognizeITCase), and what SQL:2016
adds and Flink lacks — ALL ROWS PER MATCH, RUNNING/FINAL, CLASSIFIER(), MATCH_NUMBER() — with
the expected rows worked out by hand from the standard's definitions."""

from __future__ import annotations

import pytest

from ctiflow.operators.cep.sql.translate import compile_query, recognize
from ctiflow.operators.cep.expr.vocabulary import SqlError


def rows(values, column="price", start=1):
    return [{"ts": 1000 * (i + start), column: v, "id": i + start} for i, v in enumerate(values)]


@pytest.mark.parametrize("skip, sums", [
    ("PAST LAST ROW", [26, 17]), ("TO NEXT ROW", [26, 24, 25, 22, 17]), ("TO LAST A", [26, 25, 17])])
def test_flink_docs_after_match_table(skip, sums):
    """Flink docs, "After Match Strategy": prices 7, 9, 10, 5, 10, 7, 14; PATTERN (A+ C) with
    A AS SUM(A.price) < 30 (C undefined: any row)."""
    q = (f"SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES SUM(A.price) AS s AFTER MATCH SKIP {skip} "
         "PATTERN (A+ C) DEFINE A AS SUM(A.price) < 30)")
    assert [r["s"] for r in recognize(q, rows([7, 9, 10, 5, 10, 7, 14]))] == sums


def test_flink_docs_skip_to_first_the_first_variable_fails_at_run_time():
    q = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES SUM(A.price) AS s AFTER MATCH SKIP TO FIRST A "
         "PATTERN (A+ C) DEFINE A AS SUM(A.price) < 30)")
    with pytest.raises(Exception, match="skip to the first element"):
        recognize(q, rows([7, 9, 10, 5, 10, 7, 14]))


@pytest.mark.parametrize("b, last_prices", [("B*", [16]), ("B*?", [13, 16])])
def test_flink_docs_greedy_and_reluctant(b, last_prices):
    q = (f"SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES C.price AS lastPrice AFTER MATCH SKIP PAST LAST ROW "
         f"PATTERN (A {b} C) DEFINE A AS A.price > 10, B AS B.price < 15, C AS C.price > 12)")
    assert [r["lastPrice"] for r in recognize(q, rows([10, 11, 12, 13, 14, 16]))] == last_prices


@pytest.mark.parametrize("skip, pairs", [
    ("PAST LAST ROW", [(100, 106), (107, 107), (100, 111)]),
    ("TO NEXT ROW", [(100, 106), (102, 106), (104, 106), (106, 106), (105, 107), (107, 107), (101, 101), (100, 111),
                     (110, 111), (111, 111)]),
    ("TO FIRST B", [(100, 106), (105, 107), (101, 101), (100, 111)]),
    ("TO LAST B", [(100, 106), (105, 107), (101, 101), (100, 111)]),
])
def test_flink_skip_strategies_on_rising_temperatures(skip, pairs):
    """Flink's MatchRecognizeTestPrograms: PATTERN (A+ B), A rising, B below the last A."""
    q = (f"SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES FIRST(A.t) AS f, LAST(A.t) AS l AFTER MATCH SKIP "
         f"{skip} PATTERN (A+ B) DEFINE A AS LAST(A.t, 1) IS NULL OR A.t > LAST(A.t, 1), B AS B.t < LAST(A.t))")
    got = recognize(q, rows([100, 102, 104, 106, 105, 107, 101, 100, 110, 111, 99], "t"))
    assert [(r["f"], r["l"]) for r in got] == pairs


def test_flink_aggregates_with_null_inputs():
    """MatchRecognizeITCase.testAggregatesWithNullInputs: NULLs are skipped by SUM and COUNT(col)."""
    prices, names = [10, 10, None, None, 3, 3, 3, 3, 2], ["a"] * 5 + ["c"] * 4
    data = [{"ts": 1000 * (i + 1), "id": i + 1, "price": p, "name": n} for i, (p, n) in enumerate(zip(prices, names))]
    q = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES SUM(A.price) AS sumA, COUNT(A.id) AS ca, "
         "COUNT(A.price) AS cap, COUNT(*) AS c, COUNT(price) AS cp, LAST(id) AS lid AFTER MATCH SKIP PAST LAST ROW "
         "PATTERN (A+ C) DEFINE A AS SUM(A.price) < 30, C AS C.name = 'c')")
    assert recognize(q, data) == [{"sumA": 29, "ca": 7, "cap": 5, "c": 8, "cp": 6, "lid": 8}]


def test_flink_logical_offsets_of_the_universal_variable():
    """MatchRecognizeITCase.testLogicalOffsetsWithStarVariable."""
    measures = ", ".join([f"FIRST(id, {k}) AS f{k}" for k in range(8)] + [f"LAST(id, {k}) AS l{k}" for k in range(8)])
    q = (f"SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES {measures} AFTER MATCH SKIP PAST LAST ROW "
         "PATTERN (DOWN{2,} UP) DEFINE DOWN AS price < LAST(DOWN.price, 1) OR LAST(DOWN.price, 1) IS NULL, "
         "UP AS price = FIRST(price) AND price > FIRST(price, 3) AND price = LAST(price, 7))")
    [got] = recognize(q, rows([20, 19, 18, 17, 16, 15, 14, 20]))
    assert [got[f"f{k}"] for k in range(8)] == list(range(1, 9)) and [got[f"l{k}"] for k in range(8)] == list(range(8, 0, -1))


def test_ties_are_ordered_by_the_secondary_order_columns_then_arrival():
    """MatchRecognizeITCase.testEventsAreProperlyOrdered: ORDER BY rowtime, sec DESC, ter ASC
    turns each of the first three triples into b, a, c; only the last one matches (ids 10–12)."""
    data = [(2, 12, 1, "a", 1), (1, 11, 2, "b", 2), (3, 10, 3, "c", 3), (4, 8, 4, "a", 4), (4, 9, 5, "b", 5),
            (5, 7, 6, "c", 6), (6, 6, 8, "a", 7), (6, 6, 7, "b", 8), (8, 4, 9, "c", 9), (9, 3, 10, "a", 10),
            (10, 2, 11, "b", 11), (11, 1, 12, "c", 12)]
    q = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts, sec DESC, ter ASC MEASURES A.id AS a, B.id AS b, C.id AS c "
         "PATTERN (A B C) DEFINE A AS name = 'a', B AS name = 'b', C AS name = 'c')")
    got = recognize(q, [{"ts": t * 1000, "sec": s, "ter": te, "name": n, "id": i} for t, s, te, n, i in data])
    assert got == [{"a": 10, "b": 11, "c": 12}]


# -- beyond Flink: SQL:2016 --------------------------------------------------------------------------
ALL_ROWS = """SELECT * FROM t MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES CLASSIFIER() AS var, MATCH_NUMBER() AS n, RUNNING COUNT(*) AS so_far, FINAL COUNT(*) AS total,
           RUNNING LAST(UP.price) AS top, FINAL MAX(price) AS peak
  ALL ROWS PER MATCH
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (UP+ DOWN)
  DEFINE UP AS LAST(price, 1) IS NULL OR price > LAST(price, 1), DOWN AS price < LAST(UP.price)
)"""


def test_all_rows_per_match_gives_each_row_its_variable_and_running_and_final_measures():
    """Prices 10 12 15 11 9 14 8. UP+ takes 10 12 15 (each above the row before it in the
    match), 11 is below the last UP → DOWN: match 1 = rows 1–4. Skipping past it, 9 starts a
    new run, 14 rises, 8 falls: match 2 = rows 5–7. Per SQL:2016, a RUNNING measure is computed
    over the match's rows up to the current one, a FINAL one over the whole match; the output
    is the ORDER BY column, the measures, then the other input columns."""
    got = recognize(ALL_ROWS, rows([10, 12, 15, 11, 9, 14, 8]))
    assert [list(r) for r in got[:1]] == [["ts", "var", "n", "so_far", "total", "top", "peak", "price", "id"]]
    assert [(r["id"], r["var"], r["n"], r["so_far"], r["total"], r["top"], r["peak"]) for r in got] == [
        (1, "UP", 1, 1, 4, 10, 15), (2, "UP", 1, 2, 4, 12, 15), (3, "UP", 1, 3, 4, 15, 15), (4, "DOWN", 1, 4, 4, 15, 15),
        (5, "UP", 2, 1, 3, 9, 14), (6, "UP", 2, 2, 3, 14, 14), (7, "DOWN", 2, 3, 3, 14, 14)]


def test_one_row_per_match_classifier_is_the_last_rows_variable_and_match_number_counts_per_partition():
    q = ALL_ROWS.replace("ALL ROWS PER MATCH", "ONE ROW PER MATCH").replace("ORDER BY ts", "PARTITION BY k ORDER BY ts")
    data = [dict(r, k=k) for k in ("x", "y") for r in rows([10, 12, 15, 11, 9, 14, 8] if k == "x" else [1, 2, 0])]
    got = recognize(q, data)
    assert [(r["k"], r["var"], r["n"], r["total"], r["peak"]) for r in got] == [  # in time order: y's at 3 s
        ("y", "DOWN", 1, 3, 2), ("x", "DOWN", 1, 4, 15), ("x", "DOWN", 2, 3, 14)]


@pytest.mark.parametrize("query, message", [
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B+) DEFINE A AS price > 1)", "greedy quantifier on the last"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A?? B) DEFINE A AS price > 1)", "reluctant optional"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A*? B?) DEFINE A AS price > 1)", "can match no row"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A+ B? C) DEFINE A AS price > 1)", "cannot follow a greedy"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B A) DEFINE A AS price > 1)", "must be unique"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B) DEFINE A AS PREV(A.price) > 1)", "physical offsets"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES PREV(A.price) AS p PATTERN (A B) DEFINE A AS price > 1)",
     "cannot be used in MEASURES"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES SUM(A.price + B.price) AS p PATTERN (A B) "
     "DEFINE A AS price > 1)", "several pattern variables"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts DESC PATTERN (A B) DEFINE A AS price > 1)", "must be ascending"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A{,2} B) DEFINE A AS price > 1)", "{,m} is not supported"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B) DEFINE C AS price > 1)", "not a variable of the PATTERN"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B) DEFINE A AS prise > 1)", "column 'prise' is not in"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B) DEFINE A AS MATCH_ROWTIME() > 1)", "only be used in MEASURES"),
])
def test_what_flink_refuses_is_refused_with_the_spot(query, message):
    with pytest.raises(SqlError) as err:
        compile_query(query, ["ts", "price", "id"])
    assert message in err.value.message and err.value.render().count("^") == 1


EXAMPLES = sorted((__import__("pathlib").Path(__file__).resolve().parent.parent / "examples" / "recognize").glob("*.sql"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_readme_queries_run_on_the_demo_workload(path):
    from ctiflow.jobs.testing import workload

    got = recognize(path.read_text(), workload.transactions(20_000, seed=11, scenario_rate=0.05))
    assert got and all(r["account"] for r in got)


def test_the_brute_force_query_finds_what_the_demo_jobs_pattern_finds():
    """examples/recognize/brute-force.sql and the demo job's YAML pattern (Pattern API form) over
    the same rows in time order: the same matches, two front ends on one NFA."""
    from pathlib import Path

    import yaml

    from ctiflow.jobs.testing import workload
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
    from ctiflow.operators.time import CTI_INFINITY, Event

    records = sorted(workload.transactions(4000, seed=12, scenario_rate=0.08), key=lambda r: r["event_time"])
    sql = (Path(__file__).resolve().parent.parent / "examples" / "recognize" / "brute-force.sql").read_text()
    got = [(r["account"], int(r["first_failure"]), int(r["login_time"])) for r in recognize(sql, records)]
    demo = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "demo-transactions.yaml").read_text())
    pattern = next(o for o in demo["operators"] if o["name"] == "login-brute-force")["pattern"]
    op = MatchOperator(MatchSettings(pattern=pattern, name="b", emit_timed_out=False))
    out = []
    for r in records:
        out += op.process(Event(r["account"], r["event_time"], r["event_time"], r))
    out += op.advance_to(CTI_INFINITY)
    want = [(o.record["key"], o.record["first_time"], o.record["last_time"]) for o in out if o.role == "match"]
    assert want and sorted(got) == sorted(want)


@pytest.mark.parametrize("define, message", [
    ("A.tag > 5", "DEFINE A: A.tag (STRING) > 5 (NUMBER): the types do not match"),
    ("A.price + A.tag > 1", "DEFINE A: + needs numbers, A.tag (STRING) is not one"),
    ("A.price", "DEFINE A: the condition is A.price (NUMBER), not a BOOLEAN"),
    ("SUM(A.tag) > 1", "DEFINE A: SUM needs numbers, A.tag (STRING) is not one"),
    ("A.tag LIKE 3", "LIKE needs strings"),
])
def test_a_type_error_names_the_clause_the_variable_and_the_column(define, message):
    data = [{"ts": 1000, "price": 3, "tag": "a"}, {"ts": 2000, "price": None, "tag": "b"}]
    with pytest.raises(SqlError) as err:
        recognize(f"SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A B) DEFINE A AS {define})", data)
    assert message in err.value.message and "^" in err.value.render()


def test_a_type_error_in_a_job_query_is_refused_with_the_schema_types():
    from ctiflow.jobs.driver.check import config_errors
    from ctiflow.jobs.driver.config import parse

    sql = ("SELECT * FROM tx MATCH_RECOGNIZE (PARTITION BY account ORDER BY event_time MEASURES A.amount AS a "
           "PATTERN (A B) DEFINE A AS A.country > 3)")
    cfg = parse({"job": "t", "sources": [{"name": "tx", "topic": "t", "schema": "transaction", "key_field": "account",
                                          "time_field": "event_time"}],
                 "operators": [{"kind": "match", "name": "m", "sql": sql, "output": "o"}]})
    [error] = config_errors(cfg)
    assert "DEFINE A: A.country (STRING) > 3 (NUMBER)" in error


def test_a_sql_operator_reports_partial_matches_whose_within_expired_to_the_timed_out_role():
    """In a job, a query's timed-out partial matches keep their topic (Flink's SQL drops them):
    the same records the Pattern API operator writes there."""
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
    from ctiflow.operators.time import Event

    sql = ("SELECT * FROM tx MATCH_RECOGNIZE (PARTITION BY account ORDER BY event_time MEASURES COUNT(F.id) AS n "
           "PATTERN (F{3} S) WITHIN INTERVAL '5' SECOND DEFINE F AS F.type = 'login_failed', S AS S.type = 'login_ok')")
    op = MatchOperator(MatchSettings(None, name="bf", sql=sql, emit_timed_out=True))
    out = []
    for i in range(2):
        out += op.process(Event("a1", 1000 * i, 1000 * i, {"id": str(i), "account": "a1", "event_time": 1000 * i,
                                                             "type": "login_failed"}))
    out += op.advance_to(10_000)
    assert [(o.role, o.record["first_time"], o.record["timed_out_at"]) for o in out] == [
        ("timed_out", 0, 5000), ("timed_out", 1000, 6000)]


def test_the_order_by_column_may_be_iso_timestamps_and_prints_as_sql_timestamps():
    data = [{"ts": t, "price": p} for t, p in [("2026-01-01T00:00:02Z", 5), ("2026-01-01 00:00:01.250", 1),
                                                ("2026-01-01T01:00:03+01:00", 9)]]
    q = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES FIRST(A.ts) AS a, B.ts AS b, MATCH_ROWTIME() AS m "
         "AFTER MATCH SKIP PAST LAST ROW PATTERN (A B) DEFINE A AS A.price < 3, B AS B.price > 3)")
    [row] = recognize(q, data)  # sorted by time: 01.250 (1), 02 (5), 03 (9, written in +01:00)
    assert {k: str(v) for k, v in row.items()} == {
        "a": "2026-01-01 00:00:01.250", "b": "2026-01-01 00:00:02.000", "m": "2026-01-01 00:00:02.000"}
