"""The Python subset, lowered to the shared tree (:mod:`ctiflow.operators.cep.expr.tree`) and run by the
one row evaluator, against CPython's own ``eval`` of the same text (the oracle: the language the
subset claims to be), on random expressions over records with ints, floats, strings and bools."""

from __future__ import annotations

import ast
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.operators.cep.expr.column_form import evaluator
from ctiflow.operators.cep.expr.evaluate import column_form
from ctiflow.operators.cep.expr.expression import ExpressionError, ExpressionFailed, compile_expression
from ctiflow.operators.cep.expr.tree import BOUNDS

FIELDS = {"a": st.integers(-50, 50), "b": st.integers(-3, 3), "x": st.floats(-1e3, 1e3, allow_nan=False),
          "s": st.sampled_from(["", "de", "DE", "fr"]), "ok": st.booleans()}


def _numbers(depth: int):
    leaf = st.one_of(st.sampled_from(["a", "b", "x"]), st.integers(-9, 9).map(str),
                     st.sampled_from(["0.5", "-2.25"]))
    if depth == 0:
        return leaf
    sub = _numbers(depth - 1)
    return st.one_of(leaf, st.tuples(sub, st.sampled_from(["+", "-", "*", "//", "%", "/"]), sub).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"), sub.map(lambda e: f"(-{e})"),
        st.tuples(sub, sub).map(lambda t: f"(abs({t[0]}) if {t[1]} else {t[0]})"))


def _predicates(depth: int):
    compare = st.tuples(_numbers(2), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _numbers(2)).map(
        lambda t: f"{t[0]} {t[1]} {t[2]}")
    chain = st.tuples(_numbers(1), _numbers(1), _numbers(1)).map(lambda t: f"{t[0]} < {t[1]} <= {t[2]}")
    text = st.sampled_from(["s == 'DE'", "s != ''", "s in ('de', 'fr')", "s.upper() == 'DE'", "ok", "not ok",
                            "len(s) > 1", "s.startswith('d')"])
    operand = st.tuples(_numbers(1), st.sampled_from(["and", "or"]), _numbers(1)).map(  # the operand, not a bool
        lambda t: f"({t[0]} {t[1]} {t[2]})")
    leaf = st.one_of(compare, chain, text, operand)
    if depth == 0:
        return leaf
    sub = _predicates(depth - 1)
    return st.one_of(leaf, st.tuples(sub, st.sampled_from(["and", "or"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
                     sub.map(lambda e: f"not ({e})"))


def _same(got, want) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return got == want or (math.isnan(got) and math.isnan(want))
    return got == want and type(got) is type(want)


def _failing_constant(text: str) -> bool:
    """``text`` has a sub-expression without fields whose evaluation raises ArithmeticError."""
    for node in ast.walk(ast.parse(text, mode="eval")):
        if isinstance(node, ast.expr) and not any(isinstance(n, ast.Name) for n in ast.walk(node)):
            try:
                eval(compile(ast.Expression(node), "<sub>", "eval"), {"__builtins__": {}})  # noqa: S307 (our own text)
            except ArithmeticError:
                return True
            except Exception:  # noqa: BLE001 - not arithmetic: not what this looks for
                pass
    return False


@settings(max_examples=400, deadline=None)
@given(_predicates(2), st.fixed_dictionaries(FIELDS))
def test_the_tree_evaluates_as_python_does(text, record):
    try:
        want = eval(text, {"__builtins__": {"abs": abs, "len": len}}, dict(record))  # noqa: S307 (our own text)
    except ArithmeticError:
        want = ArithmeticError
    try:
        expression = compile_expression(text)
    except ExpressionError as exc:  # constant arithmetic that fails: refused when compiled, even
        # where Python would short-circuit past it for this record (`a or 0 / 0`)
        assert (want is ArithmeticError or _failing_constant(text)) and "Error" in str(exc), exc
        return
    try:
        got = expression(record)
    except ExpressionFailed:
        got = ArithmeticError
    assert got is want if want is ArithmeticError else _same(got, want), (text, record, got, want)
    node = column_form(expression.tree)  # where the column form applies, it says the same
    if node is not None and want is not ArithmeticError:
        columns = {name: __import__("numpy").array([record[name]]) for name in FIELDS}
        truth = evaluator(node)(columns, 1)
        assert truth is None or bool(truth[0]) == bool(want), (text, record)


def test_one_bounds_table_limits_both_languages():
    from ctiflow.operators.cep.sql.parse import MAX_DEPTH, MAX_QUERY_LENGTH

    assert (MAX_DEPTH, MAX_QUERY_LENGTH) == (BOUNDS.depth, BOUNDS.query_length)
    with pytest.raises(ExpressionError, match=f"longer than {BOUNDS.length}"):
        compile_expression("a + " * (BOUNDS.length // 4) + "1")
    with pytest.raises(ExpressionFailed, match=f"more than {BOUNDS.int_bits} bits"):
        compile_expression("a ** 900")({"a": 1024})
    with pytest.raises(ExpressionFailed, match=f"more than {BOUNDS.sequence} items"):
        compile_expression("s * a")({"s": "xy", "a": BOUNDS.sequence})


def test_the_tree_is_what_the_languages_share():
    from ctiflow.operators.cep.sql.parse import parse

    py = compile_expression("amount > 100 and country == 'DE'").tree
    assert (py.kind, py.value, [a.kind for a in py.args]) == ("py_logic", "and", ["py_compare", "py_compare"])
    sql = parse("SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.amount AS m PATTERN (A) "
                "DEFINE A AS A.amount > 100 AND A.country = 'DE')").define["A"]
    assert type(sql) is type(py) and (sql.kind, sql.value) == ("binary", "AND")
    assert column_form(py) is not None and column_form(sql) is not None
    assert column_form(py).parts[0].rule == "python" and column_form(sql).parts[0].rule == "sql"
