"""A ``DEFINE``'s column form (the sql rule of :mod:`ctiflow.operators.cep.expr.column_form`) against the
per-row SQL evaluator: over columns with NULLs, NaNs, ints, floats, strings and absent fields, the
bulk mask is each row's ``DEFINE … is TRUE``, or the form declines (None) and rows are tested one
by one."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings, strategies as st

from ctiflow.operators.cep.expr.column_form import evaluator
from ctiflow.operators.cep.expr.evaluate import column_form
from ctiflow.operators.cep.sql.translate import define_condition
from ctiflow.operators.cep.sql.parse import parse

OPS = ["=", "<>", "<", "<=", ">", ">="]
LITERALS = ["0", "1", "-3", "2.5", "1e300", "'DE'", "'a'", "''"]


def query(define: str) -> str:
    return ("SELECT * FROM t MATCH_RECOGNIZE (PARTITION BY k ORDER BY ts MEASURES A.ts AS at "
            f"ONE ROW PER MATCH PATTERN (A) DEFINE A AS {define})")


comparison = st.builds(lambda c, op, lit, flip: f"{lit} {op} {c}" if flip else f"{c} {op} {lit}",
                       st.sampled_from(["x", "y", "s", "absent"]), st.sampled_from(OPS),
                       st.sampled_from(LITERALS), st.booleans())
define = st.recursive(comparison, lambda inner: st.builds(lambda a, j, b: f"({a} {j} {b})", inner,
                                                          st.sampled_from(["AND", "OR"]), inner), max_leaves=4)
ints = st.lists(st.integers(-5, 5), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(define, ints, st.data())
def test_the_column_form_a_define_is_each_row_s_truth_or_nothing(text, xs, data):
    n = len(xs)
    ys = data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, -3.0, math.nan, 1e300]), min_size=n, max_size=n))
    ss = data.draw(st.lists(st.sampled_from([None, "DE", "a", "", "b"]), min_size=n, max_size=n))
    expr = parse(query(text)).define["A"]
    node = column_form(expr)
    columns = {"x": np.array(xs, np.int64), "y": np.array(ys, np.float64), "s": np.array(ss, object)}
    rows = [{"x": x, "y": None if math.isnan(y) else y, "s": s, "ts": i} for i, (x, y, s) in enumerate(zip(xs, ys, ss))]
    expected = []
    for row in rows:
        try:
            expected.append(bool(define_condition(expr, "A", ["A"]).predicate(row)))
        except Exception:  # (a row the per-row evaluation refuses: the form must decline)
            expected.append(None)
    if node is None:
        return
    mask = evaluator(node)(columns, n)
    if mask is None:
        return
    assert None not in expected, (text, rows)
    assert mask.tolist() == expected, text


def test_common_defines_have_a_column_form():
    for text in ("x > 1", "s = 'DE' AND y < 2.5", "1 < x OR s <> 'a'"):
        assert column_form(parse(query(text)).define["A"]) is not None, text
    assert column_form(parse(query("NOT x > 1")).define["A"]) is None  # NOT of unknown is not TRUE
