"""The safe expression language over record fields."""

from __future__ import annotations

import pytest

from ctiflow.operators.cep.expr.expression import ExpressionError, compile_expression
from ctiflow.operators.errors import ConfigError

RECORD = {"amount": 120, "country": "FR", "name": "Alice", "tags": ["vip", "new"],
          "geo": {"lat": 48.8}, "missing_is_none": None}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("amount > 100 and country != 'DE'", True),
        ("amount > 100 and country == 'DE'", False),
        ("100 < amount <= 120", True),
        ("amount * 2 - 40", 200),
        ("amount // 7 + amount % 7", 17 + 1),
        ("country in ('FR', 'IT')", True),
        ("'vip' in tags", True),
        ("'gold' not in tags", True),
        ("lower(name) == 'alice'", True),
        ("name.upper().startswith('AL')", True),
        ("len(tags)", 2),
        ("geo.lat > 48", True),
        ("geo['lat']", 48.8),
        ("tags[0]", "vip"),
        ("tags[5]", None),
        ("nothing is None", True),
        ("nothing > 3", False),
        ("not (nothing < 3)", True),
        ("coalesce(nothing, amount)", 120),
        ("abs(-3) + max(1, 2)", 5),
        ("'big' if amount > 100 else 'small'", "big"),
        ("true and not false", True),
        ("null is None", True),
        ("contains(name, 'lic')", True),
        ("round(geo.lat)", 49),
    ],
)
def test_expressions_evaluate_over_record_fields(text: str, value) -> None:
    assert compile_expression(text)(RECORD) == value


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("__import__('os')", "function __import__() is not allowed"),
        ("__import__('os').system('true')", "method system() is not allowed"),
        ("amount.__class__", "'_' are not allowed"),
        ("_private", "'_' are not allowed"),
        ("(lambda: 1)", "Lambda is not allowed"),
        ("(lambda: 1)()", "only named functions"),
        ("[x for x in tags]", "ListComp is not allowed"),
        ("open('/etc/passwd')", "function open() is not allowed"),
        ("name.format(1)", "method format() is not allowed"),
        ("amount >> 2", "RShift is not allowed"),
        ("amount is 3", "only compare with None"),
        ("amount =", "invalid expression"),
        ("", "must not be empty"),
        ("first('a')", "only allowed in stage conditions"),
        ("tags[0:1]", "slices are not allowed"),
        ("f'{amount}'", "JoinedStr is not allowed"),
    ],
)
def test_unsafe_or_invalid_expressions_are_rejected(text: str, fragment: str) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text)
    assert fragment in str(info.value)


def test_expression_errors_are_config_errors() -> None:
    assert issubclass(ExpressionError, ConfigError)


def test_runtime_failure_names_the_expression() -> None:
    expression = compile_expression("amount + country")
    with pytest.raises(ExpressionError, match="amount \\+ country"):
        expression(RECORD)


def test_huge_exponents_are_refused() -> None:
    with pytest.raises(ExpressionError, match="exponent"):
        compile_expression("amount ** 100000")(RECORD)


def test_match_functions_read_the_context() -> None:
    class Ctx:
        def get_events_for_pattern(self, name):
            return [{"amount": 10}, {"amount": 30}] if name == "a" else []

    expression = compile_expression(
        "amount > avg_of('a', 'amount') and first('a').amount == 10 and count('b') == 0 "
        "and last('a').amount == max_of('a', 'amount') and sum_of('a', 'amount') == 40",
        match_functions=True,
    )
    assert expression.uses_match_context
    assert expression.stage_references == {"a", "b"}
    assert expression({"amount": 25}, Ctx()) is True
    assert expression({"amount": 15}, Ctx()) is False


def test_plain_expressions_do_not_need_a_context() -> None:
    assert not compile_expression("amount > 1", match_functions=True).uses_match_context
