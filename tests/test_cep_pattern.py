"""Pattern API validation: Flink's errors, at the moment Flink raises them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ctiflow.operators.cep import (
    AfterMatchSkipStrategy,
    IterativeCondition,
    Nfa,
    Pattern,
    WithinType,
    can_produce_empty_matches,
    compile_pattern,
)
from ctiflow.operators.cep.conditions import IterativeCondition as IterativeConditionClass
from ctiflow.operators.cep.pattern import QuantifierProperty
from ctiflow.operators.errors import PatternError


def a() -> Pattern:
    return Pattern.begin("a").where(lambda e: e["name"] == "a")


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: a().one_or_more().greedy().followed_by("b").optional(), "cannot follow a greedy"),
        (lambda: a().greedy(), "looping/times stages only"),
        (lambda: a().consecutive(), "looping/times stages only"),
        (lambda: a().allow_combinations(), "looping/times stages only"),
        (lambda: a().one_or_more().consecutive().allow_combinations(), "not both"),
        (lambda: a().one_or_more().allow_combinations().greedy(), "allow_combinations"),
        (lambda: a().until(lambda e: True), "looping stages only"),
        (lambda: a().one_or_more().until(lambda e: True).until(lambda e: True), "only one until"),
        (lambda: a().one_or_more().times(2), "already applied"),
        (lambda: a().times(0), "positive"),
        (lambda: a().times(3, 2), "maximum"),
        (lambda: a().optional().optional(), "already applied"),
        (lambda: a().optional().not_next("b"), "cannot follow an optional"),
        (lambda: a().not_followed_by("b").optional(), "NOT stage cannot be optional"),
        (lambda: a().not_followed_by("b").one_or_more(), "NOT stage"),
        (lambda: Pattern.begin(Pattern.begin("x")).where(lambda e: True), "group"),
        (lambda: Pattern.begin(Pattern.begin("x")).times(2).greedy(), "group"),
        (lambda: a().where(None), "cannot be None"),
        (lambda: a().where(42), "must be callable"),
        (lambda: Pattern.begin("a:b"), "must not contain"),
        (lambda: a().within(5, "sideways"), "within_type"),
    ],
)
def test_builder_errors(build, fragment: str) -> None:
    with pytest.raises(PatternError) as info:
        build()
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: a().followed_by("a"), "duplicate stage name 'a'"),
        (lambda: a().not_followed_by("b"), "needs a window"),
        (lambda: Pattern.begin("a", AfterMatchSkipStrategy.skip_to_first("zz")).next("b"),
         "'zz', which is not a stage"),
        (lambda: a().followed_by("b").within(5, WithinType.PREVIOUS_AND_CURRENT).within(3),
         "cannot be larger"),
    ],
)
def test_compile_time_errors(build, fragment: str) -> None:
    pattern = build()  # building is fine, as in Flink ...
    with pytest.raises(PatternError) as info:  # ... NFACompiler rejects it
        compile_pattern(pattern)
    assert fragment in str(info.value)


def test_not_followed_by_at_the_end_with_a_window_compiles() -> None:
    compile_pattern(a().not_followed_by("b").within(10))
    compile_pattern(a().not_followed_by("b").within(10, WithinType.PREVIOUS_AND_CURRENT))


def test_two_parameter_callables_are_iterative() -> None:
    pattern = a().followed_by("b").where(
        lambda e, ctx: e["v"] > ctx.get_events_for_pattern("a")[0]["v"]
    )
    assert isinstance(pattern.condition, IterativeConditionClass)
    assert compile_pattern(pattern).has_iterative_conditions
    nfa = Nfa(compile_pattern(pattern))
    nfa.process({"name": "a", "v": 5}, 1)
    assert nfa.process({"name": "b", "v": 3}, 2) == []
    assert len(nfa.process({"name": "b", "v": 7}, 3)) == 1


def test_explicit_iterative_wrapper() -> None:
    pattern = a().where(IterativeCondition(lambda e, ctx: ctx.timestamp > 10))
    nfa = Nfa(compile_pattern(pattern))
    assert nfa.process({"name": "a"}, 5) == []
    assert nfa.process({"name": "a"}, 11) != []


def test_subtype_by_class_and_by_type_name() -> None:
    class Event:
        def __init__(self, name):
            self.name = name

    class SubEvent(Event):
        pass

    by_class = Pattern.begin("s").subtype(SubEvent)
    by_name = Pattern.begin("s").subtype("SubEvent")
    for pattern in (by_class, by_name):
        nfa = Nfa(compile_pattern(pattern))
        assert nfa.process(Event("x"), 1) == []
        assert len(nfa.process(SubEvent("y"), 2)) == 1
    on_dicts = Nfa(compile_pattern(Pattern.begin("s").subtype("SubEvent")))
    assert on_dicts.process({"type": "Event"}, 1) == []
    assert len(on_dicts.process({"type": "SubEvent"}, 2)) == 1


def test_windows_accept_timedelta() -> None:
    pattern = a().followed_by("b").times(2, timedelta(seconds=2)).within(timedelta(minutes=1))
    plan = compile_pattern(pattern)
    assert plan.window_ms == 60_000
    assert plan.state_windows_ms == {"b:0": 2_000}


def test_times_zero_to_n_is_optional() -> None:
    pattern = a().followed_by("b").times(0, 2)
    assert pattern.quantifier.has(QuantifierProperty.OPTIONAL)
    assert (pattern.times_range.from_, pattern.times_range.to) == (1, 2)


def test_empty_matches_are_detected() -> None:
    assert can_produce_empty_matches(a().optional())
    assert can_produce_empty_matches(a().one_or_more().optional())
    assert not can_produce_empty_matches(a().followed_by("b").optional())
