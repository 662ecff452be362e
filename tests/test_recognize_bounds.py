"""Hostile and careless queries get one ``SqlError`` with line and caret, never a traceback; Flink
features a held-out suite found missing (``LISTAGG``, a quantified parenthesised variable) work;
``ctiflow recognize`` refuses a row a DEFINE fails on and goes on."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ctiflow.jobs.cli import app
from ctiflow.operators.cep.sql.translate import recognize
from ctiflow.operators.cep.expr.vocabulary import SqlError

BASE = "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS v PATTERN (A) DEFINE A AS {})"
ROWS = [{"ts": 1, "v": 1, "c": "x"}, {"ts": 2, "v": 2, "c": "y"}]


@pytest.mark.parametrize("query, fragment", [
    (BASE.format("(" * 500 + "v = 1" + ")" * 500), "nested more than 100 levels"),
    (BASE.format("NOT " * 3000 + "TRUE"), "nested more than 100 levels"),
    (BASE.format("CASE WHEN TRUE THEN " * 400 + "TRUE" + " END" * 400), "nested more than 100 levels"),
    (BASE.format("-" + " -" * 400 + " v < 1"), "nested more than 100 levels"),
    (BASE.format("1" * 5001 + " > v"), "out of the BIGINT range"),
    (BASE.format("9223372036854775808 > v"), "out of the BIGINT range"),
    (BASE.format("1e400 > v"), "out of the DOUBLE range"),
    (BASE.replace("PATTERN (A)", "PATTERN (" + "(" * 5000 + "A" + ")" * 5000 + ")").format("TRUE"),
     "nested more than 100 levels"),
    (BASE.replace("PATTERN (A)", "PATTERN (A) WITHIN INTERVAL 'nan' SECOND").format("TRUE"), "not a finite number"),
    (BASE.replace("PATTERN (A)", "PATTERN (A) WITHIN INTERVAL 'inf' SECOND").format("TRUE"), "not a finite number"),
    (BASE.replace("PATTERN (A)", "PATTERN (A) WITHIN INTERVAL '1e400' MINUTE").format("TRUE"), "not a finite number"),
    (BASE.replace("PATTERN (A)", "PATTERN ((A B)+)").format("TRUE"), "a quantifier on a group of several"),
    (BASE.replace("PATTERN (A)", "PATTERN ((A+)+)").format("TRUE"), "a quantifier on a group of several"),
    (BASE.replace("A.v AS v", "LISTAGG(A.v) AS l").format("TRUE"), "LISTAGG needs strings"),
    (BASE.format("v > 1 / 0"), "DEFINE A: division by zero (a constant: it would fail on every row)"),
    (BASE.format("v > CAST('x' AS INT) + 1"), "CAST('x' AS BIGINT) is not possible (a constant"),
    (BASE.replace("A.v AS v", "MOD(7, 0) AS m").format("TRUE"), "MEASURES m: division by zero (a constant"),
    (BASE.replace("A.v AS v", "LISTAGG(A.c, c) AS l").format("TRUE"), "separator of LISTAGG must be a string"),
])
def test_a_hostile_query_is_one_sql_error_with_the_spot(query, fragment):
    with pytest.raises(SqlError) as caught:
        recognize(query, ROWS)
    assert fragment in str(caught.value)
    assert caught.value.render().count("\n") == 2  # message, the query line, the caret


@pytest.mark.parametrize("rows, fragment", [
    ([{"ts": 1e400, "v": 1}], "ORDER BY column 'ts' must be epoch milliseconds"),
    ([{"ts": 1, "v": {"a": 1}}], "PARTITION BY column 'v' holds a record"),
    ([{"ts": 1, "v": [1]}], "PARTITION BY column 'v' holds a list"),
])
def test_rows_that_cannot_be_matched_are_one_sql_error(rows, fragment):
    query = "SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY v ORDER BY ts MEASURES A.ts AS x PATTERN (A) DEFINE A AS TRUE)"
    with pytest.raises(SqlError, match=fragment):
        recognize(query, rows)


def test_deep_but_allowed_nesting_runs():
    query = BASE.format("(" * 90 + "v = 1" + ")" * 90)
    assert [r["v"] for r in recognize(query, ROWS)] == [1]
    assert [r["v"] for r in recognize(BASE.format("NOT " * 98 + "v = 1"), ROWS)] == [1]  # 98 NOTs: v <> 1


def test_a_quantified_parenthesised_variable_is_the_variable_quantified():
    rows = [{"ts": t, "v": v} for t, v in enumerate([1, 1, 2, 1, 2, 2, 1, 1, 1, 2], 1)]
    plain = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES COUNT(A.ts) AS n, LAST(B.ts) AS b "
             "AFTER MATCH SKIP PAST LAST ROW PATTERN (A+ B{1}?) DEFINE A AS A.v = 1, B AS B.v = 2)")
    wrapped = plain.replace("(A+ B{1}?)", "((A)+ (B){1}?)")
    want = [(2, 3), (1, 5), (3, 10)]
    assert [(r["n"], int(r["b"])) for r in recognize(plain, rows)] == want
    assert [(r["n"], int(r["b"])) for r in recognize(wrapped, rows)] == want


def test_listagg_joins_a_variables_non_null_values_in_row_order():
    query = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES LISTAGG(A.c, '-') AS dash, LISTAGG(c) AS every "
             "AFTER MATCH SKIP PAST LAST ROW PATTERN (A+ B) DEFINE A AS A.v = 1, B AS B.v = 2)")
    rows = [{"ts": 1, "v": 1, "c": "x"}, {"ts": 2, "v": 1, "c": None}, {"ts": 3, "v": 1, "c": "z"},
            {"ts": 4, "v": 2, "c": "w"}]
    assert recognize(query, rows) == [{"dash": "x-z", "every": "x,z,w"}]


def test_a_string_that_looks_like_an_operator_or_a_keyword_is_a_string():
    query = ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.c || '+' || 'AND' AS s "
             "PATTERN (A) DEFINE A AS A.c <> '-' AND A.c <> '*')")
    rows = [{"ts": 1, "c": "-"}, {"ts": 2, "c": "q"}, {"ts": 3, "c": "*"}]
    assert recognize(query, rows) == [{"s": "q+AND"}]


def test_recognize_refuses_a_row_a_define_fails_on_and_matches_the_rest(tmp_path):
    query = tmp_path / "q.sql"
    query.write_text("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES FIRST(A.ts) AS a, B.ts AS b\n"
                     "  AFTER MATCH SKIP PAST LAST ROW PATTERN (A B)\n"
                     "  DEFINE A AS CAST(A.code AS INT) > 0, B AS MOD(CAST(B.code AS INT), 2) = 0)")
    events = tmp_path / "e.jsonl"
    rows = [{"ts": 1, "code": "1"}, {"ts": 2, "code": "DE"}, {"ts": 3, "code": "4"}, {"ts": 4, "code": "3"}]
    events.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = CliRunner().invoke(app, ["recognize", "--query", str(query), "--events", str(events)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"a": 1, "b": 3}]  # row 2 never came
    messages = result.stderr.replace("\n", " ")
    assert f"{events}:2: DEFINE " in messages and ": CAST('DE' AS BIGINT) is not possible" in messages
    assert "1 row(s) refused" in messages
