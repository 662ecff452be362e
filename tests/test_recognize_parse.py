"""The MATCH_RECOGNIZE parser: the clauses land where they belong, and a query that does not
parse or uses something unsupported fails with the line, the column and a caret under the spot."""

from __future__ import annotations

import pytest

from ctiflow.operators.cep.expr.vocabulary import SqlError

from ctiflow.operators.cep.sql.parse import parse

QUERY = """SELECT * FROM events MATCH_RECOGNIZE (
  PARTITION BY account, channel ORDER BY event_time, id DESC
  MEASURES FIRST(A.event_time) AS start_t, FINAL LAST(B.amount) AS amt, COUNT(*) AS n, CLASSIFIER() AS c
  ALL ROWS PER MATCH
  AFTER MATCH SKIP TO FIRST B
  PATTERN (A{3} B+? (C D) E{0,2}) WITHIN INTERVAL '10' MINUTE
  DEFINE A AS A.type = 'login_failed', B AS B.amount > PREV(B.amount, 1) AND SUM(B.amount) < 100,
    C AS CASE WHEN amount IS NULL THEN FALSE ELSE amount BETWEEN 1 AND 5 END
) AS T"""


def test_every_clause_lands_in_the_query():
    q = parse(QUERY)
    assert (q.table, q.partition_by, q.alias) == ("events", ["account", "channel"], "T")
    assert [(c, asc) for c, asc, _ in q.order_by] == [("event_time", True), ("id", False)]
    assert [(m.name, m.running) for m in q.measures] == [("start_t", True), ("amt", False), ("n", True), ("c", True)]
    assert q.all_rows and q.skip == ("to_first", "B") and q.within_ms == 600_000
    assert [(v.name, v.min, v.max, v.greedy) for v in q.pattern] == [
        ("A", 3, 3, True), ("B", 1, None, False), ("C", 1, 1, True), ("D", 1, 1, True), ("E", 0, 2, True)]
    assert sorted(q.define) == ["A", "B", "C"]
    b = q.define["B"]
    assert b.kind == "binary" and b.value == "AND" and b.args[0].args[1].value == "PREV"


def test_the_defaults_are_flinks():
    q = parse("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts PATTERN (A) DEFINE A AS TRUE)")
    assert q.skip == ("to_next_row", None) and not q.all_rows and q.partition_by == [] and q.within_ms is None


@pytest.mark.parametrize("query, spot, message", [
    ("SELECT a FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A))", "a FROM", "only SELECT * is supported"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A | B))", "| B", "alternation (|) is not supported"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN ((A B)+))", "+))", "a quantifier on a group"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (PERMUTE(A, B)))", "PERMUTE", "PERMUTE is not supported"),
    ("SELECT * FROM t MATCH_RECOGNIZE (PATTERN (A))", "PATTERN", "needs ORDER BY"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A{3,1}))", "}))", "maximum 1 is below its minimum 3"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A) WITHIN INTERVAL '5' FORTNIGHT)", "FORTNIGHT",
     "expected an interval unit"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x SUBSET U = (A, B) PATTERN (A B))", "SUBSET", "SUBSET is not"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A) DEFINE A AS x >> 3)", "> 3)", "expected an expression"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x MEASURES A.x PATTERN (A))", "PATTERN", "each measure needs a name"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A) DEFINE A AS 'open)", "'open", "unterminated string"),
    ("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY x PATTERN (A) DEFINE A AS CAST(x AS BLOB))", "BLOB", "CAST to BLOB"),
])
def test_an_error_names_line_and_column_with_a_caret_under_the_spot(query, spot, message):
    with pytest.raises(SqlError) as err:
        parse(query)
    e = err.value
    assert message in e.message
    assert e.pos == query.index(spot), (e.pos, query.index(spot))
    assert (e.line, e.column) == (1, query.index(spot) + 1)
    rendered = e.render().splitlines()
    assert rendered[0].startswith(f"line 1, column {e.column}: ") and rendered[1] == "  " + query
    assert rendered[2] == " " * (e.column + 1) + "^"


def test_positions_count_lines():
    query = "SELECT *\nFROM t MATCH_RECOGNIZE (\n  ORDER BY ts\n  PATTERN (A ^ B)\n)"
    with pytest.raises(SqlError) as err:
        parse(query)
    assert (err.value.line, err.value.column) == (4, 14)
    assert err.value.render().splitlines()[1:] == ["    PATTERN (A ^ B)", "               ^"]
