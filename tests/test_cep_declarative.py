"""Patterns declared as dicts (job files) behave like the same patterns built in Python."""

from __future__ import annotations

import pytest
import yaml

from ctiflow.operators.cep import AfterMatchSkipStrategy, Nfa, Pattern, compile_pattern, pattern_from_dict
from ctiflow.operators.cep.declarative import skip_from_spec
from ctiflow.operators.errors import CtiflowError, PatternError

EVENTS = [
    {"kind": "login", "amount": 0, "country": "DE"},
    {"kind": "pay", "amount": 5, "country": "FR"},
    {"kind": "pay", "amount": 150, "country": "FR"},
    {"kind": "pay", "amount": 300, "country": "DE"},
    {"kind": "pay", "amount": 900, "country": "US"},
    {"kind": "logout", "amount": 0, "country": "US"},
]


def run(pattern: Pattern, events=EVENTS) -> list[dict]:
    nfa = Nfa(compile_pattern(pattern))
    found = []
    for ts, event in enumerate(events):
        nfa.advance_time(ts)
        found += nfa.process(event, ts)
    return found


def as_indices(matches: list[dict]) -> list[dict]:
    return [{s: [EVENTS.index(e) for e in es] for s, es in m.items()} for m in matches]


def test_yaml_pattern_matches_like_the_python_api() -> None:
    spec = yaml.safe_load(
        """
        name: big-payments-after-login
        stages:
          - name: login
            where: "kind == 'login'"
          - name: big
            contiguity: followed_by
            where: "kind == 'pay' and amount > 100 and country != 'DE'"
            quantifier: one_or_more
          - name: out
            contiguity: followed_by
            where: "kind == 'logout'"
        """
    )
    python = (
        Pattern.begin("login").where(lambda e: e["kind"] == "login")
        .followed_by("big")
        .where(lambda e: e["kind"] == "pay" and e["amount"] > 100 and e["country"] != "DE")
        .one_or_more()
        .followed_by("out").where(lambda e: e["kind"] == "logout")
    )
    declared = as_indices(run(pattern_from_dict(spec)))
    assert declared == as_indices(run(python))
    assert {"login": [0], "big": [2, 4], "out": [5]} in declared


def test_or_conditions_and_times_range() -> None:
    spec = {
        "stages": [
            {"name": "a", "where": "amount == 5", "or": ["kind == 'login'"]},
            {"name": "b", "contiguity": "next", "where": "kind == 'pay'",
             "quantifier": {"times": [1, 2]}, "consecutive": True},
        ]
    }
    got = as_indices(run(pattern_from_dict(spec)))
    assert {"a": [1], "b": [2, 3]} in got
    assert {"a": [0], "b": [1]} in got


def test_iterative_condition_sees_the_matched_events() -> None:
    spec = {
        "stages": [
            {"name": "first", "where": "kind == 'pay'"},
            {"name": "bigger", "contiguity": "followed_by_any",
             "where": "kind == 'pay' and amount > 2 * last('first').amount"},
        ]
    }
    got = as_indices(run(pattern_from_dict(spec)))
    assert {"first": [2], "bigger": [4]} in got
    assert {"first": [2], "bigger": [3]} not in got  # 300 is not > 2 * 150


def test_aggregate_over_a_loop_stage() -> None:
    spec = {
        "stages": [
            {"name": "pays", "where": "kind == 'pay' and (count('pays') == 0 or "
             "amount > avg_of('pays', 'amount'))", "quantifier": "one_or_more",
             "consecutive": True},
            {"name": "out", "contiguity": "followed_by", "where": "kind == 'logout'"},
        ]
    }
    got = as_indices(run(pattern_from_dict(spec)))
    assert {"pays": [1, 2, 3, 4], "out": [5]} in got


def test_not_followed_by_and_window() -> None:
    spec = {
        "within_ms": 10,
        "stages": [
            {"name": "a", "where": "kind == 'login'"},
            {"name": "no_pay", "negation": "not_followed_by", "where": "amount > 1000"},
            {"name": "c", "contiguity": "followed_by", "where": "kind == 'logout'"},
        ],
    }
    assert as_indices(run(pattern_from_dict(spec))) == [{"a": [0], "c": [5]}]


def test_group_stage() -> None:
    spec = {
        "stages": [
            {"name": "start", "where": "kind == 'login'"},
            {"name": "pair", "contiguity": "followed_by", "quantifier": {"times": 2},
             "group": [
                 {"name": "x", "where": "country == 'FR'"},
                 {"name": "y", "contiguity": "next", "where": "country != 'FR'"},
             ]},
        ]
    }
    pattern = pattern_from_dict(spec)
    assert pattern.name == "GroupPattern"
    assert run(pattern) == []  # only one FR->non-FR pair exists


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, AfterMatchSkipStrategy.no_skip()),
        ("skip_to_next", AfterMatchSkipStrategy.skip_to_next()),
        ("skip_past_last_event", AfterMatchSkipStrategy.skip_past_last_event()),
        ({"skip_to_first": "a"}, AfterMatchSkipStrategy.skip_to_first("a")),
        ({"skip_to_last": "a", "throw_on_miss": True},
         AfterMatchSkipStrategy.skip_to_last("a").throw_exception_on_miss()),
    ],
)
def test_skip_strategy_forms(spec, expected) -> None:
    assert skip_from_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"stages": []}, "non-empty list"),
        ({"stages": [{"name": "a", "wher": "x"}]}, "unknown key(s) 'wher'"),
        ({"stages": [{"name": "a", "where": "amount >> 2"}]}, "stage 'a'"),
        ({"stages": [{"name": "a", "where": "__import__('os')"}]}, "stage 'a'"),
        ({"stages": [{"name": "a", "negation": "not_next"}]}, "first stage cannot be negated"),
        ({"stages": [{"name": "a"}, {"name": "b", "contiguity": "sometimes"}]},
         'invalid "contiguity"'),
        ({"stages": [{"name": "a", "quantifier": {"times": "2"}}]}, 'invalid "quantifier"'),
        ({"stages": [{"name": "a", "quantifier": "one_or_more", "greedy": True,
                      "allow_combinations": True}]}, "stage 'a'"),
        ({"stages": [{"name": "a"}], "skip": "skip_everything"}, 'invalid "skip"'),
        ({"stages": [{"name": "a"}], "within_ms": -1}, "non-negative"),
        ({"stages": [{"name": "a", "until": "amount > 1"}]}, "looping"),
        ({"stages": [{"name": "a", "within_ms": 5, "within_type": "sideways"}]},
         'Invalid "within_type"'),
    ],
)
def test_errors_name_the_stage_and_the_problem(spec, fragment) -> None:
    with pytest.raises(PatternError) as info:
        compile_pattern(pattern_from_dict(spec))
    assert fragment in str(info.value)
    assert isinstance(info.value, CtiflowError)


def test_duplicate_stage_names_are_rejected_at_compile_time() -> None:
    pattern = pattern_from_dict({"stages": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(PatternError, match="duplicate stage name 'a'"):
        compile_pattern(pattern)
