"""SQL ``LIKE`` (:func:`ctiflow.operators.cep.expr.evaluate.like_match`) against a regular
expression built from the pattern (the oracle: ``%`` → ``.*``, ``_`` → ``.``), and a pattern that
makes a backtracking matcher run for ever finishes."""

from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from ctiflow.operators.cep.sql.translate import compile_query
from ctiflow.operators.cep.expr.evaluate import like_match

ALPHABET = st.sampled_from("ab%_\n.*")


def oracle(text: str, pattern: str) -> bool:
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab\n.*%_"), max_size=12), st.text(alphabet=ALPHABET, max_size=8))
def test_like_is_the_regular_expression_s_match(text, pattern):
    assert like_match(text, pattern) is oracle(text, pattern), (text, pattern)


def test_a_pattern_with_many_percent_signs_against_a_long_row_finishes():
    """A backtracking regex takes ~n^k steps here (k = 12 ``%``, n = 20,000): this would not return."""
    text, pattern = "a" * 20_000, "%a" * 12 + "%b"
    assert like_match(text, pattern) is False
    assert like_match(text + "b", pattern) is True
    query = ("SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES A.ts AS at "
             f"ONE ROW PER MATCH PATTERN (A) DEFINE A AS s LIKE '{pattern}')")
    rows = [{"k": "x", "ts": 1, "s": text}, {"k": "x", "ts": 2, "s": text + "b"}]
    assert [r["at"] for r in compile_query(query).run(rows)] == [2]
