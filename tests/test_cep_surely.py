"""What a column form can tell of a condition it cannot evaluate whole (``conditions.surely``):
where it says "surely false" (or true), the condition's own test, record by record, gives that
and raises nothing — conditions built from exact parts, parts only a record at a time can decide
(one that fails on some records), ``and``, ``or`` and ``not``, and stage expressions whose later
operands read the match (``first(...)``) and are never evaluated where an earlier one decides."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.operators.cep.conditions import (AndCondition, IterativeCondition, NotCondition, OrCondition,
                                              surely)
from ctiflow.operators.cep.declarative import stage_condition
from ctiflow.operators.cep.expr.column_form import evaluator
from ctiflow.operators.errors import EventRejected


def _opaque(record, ctx):
    """Decided only a record at a time, and failing on some records (as a refused event)."""
    if record["note"] == "x":
        raise EventRejected("note is not a number")
    return record["amount"] > 4


EXACT = ["kind == 'a'", "kind != 'b' and amount > 2", "amount <= 5 or kind == 'c'", "not (kind == 'd')"]


@st.composite
def conditions(draw, depth=3):
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        if draw(st.booleans()):
            return stage_condition(draw(st.sampled_from(EXACT)), "stage", "where")
        return IterativeCondition(_opaque)
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        return NotCondition(draw(conditions(depth - 1)))
    left, right = draw(conditions(depth - 1)), draw(conditions(depth - 1))
    return (AndCondition if kind == "and" else OrCondition)(left, right)


RECORDS = [{"kind": k, "amount": float(a), "note": n} for k in "abcd" for a in range(0, 10, 3) for n in (None, "x")]


def _columns():
    return {name: np.array([r[name] for r in RECORDS], dtype=object if name != "amount" else float)
            for name in ("kind", "amount", "note")}, len(RECORDS)


def _told(condition, truth: bool) -> list[int]:
    node = surely(condition, truth)
    if node is None:
        return []
    got = evaluator(node)(*_columns())
    assert got is not None
    return np.flatnonzero(got).tolist()


@settings(max_examples=300, deadline=None)
@given(conditions(), st.booleans())
def test_where_a_column_form_tells_a_conditions_truth_its_test_gives_it_without_failing(condition, truth):
    for i in _told(condition, truth):
        assert condition.test(RECORDS[i], None) is truth


def test_a_stage_expression_is_told_false_by_its_leading_operands_the_match_is_never_read():
    condition = stage_condition("kind == 'b' and note > first('a').amount", "stage", "where")
    told = _told(condition, False)
    assert told == [i for i, r in enumerate(RECORDS) if r["kind"] != "b"]
    for i in told:  # (no match context given: reading it would fail)
        assert condition.test(RECORDS[i], None) is False
    assert _told(NotCondition(condition), True) == told


def test_nothing_is_told_where_an_operand_only_a_record_at_a_time_decides_comes_first():
    assert surely(stage_condition("note > first('a').amount and kind == 'b'", "stage", "where"), False) is None
    assert surely(AndCondition(IterativeCondition(_opaque), stage_condition("kind == 'a'", "s", "w")), False) is None
    assert surely(stage_condition("kind == 'b' and note > first('a').amount", "stage", "where"), True) is None
