"""Iterative conditions, ported from Flink's ``IterativeConditionsITCase``.

The recorded conformance file skips these (their conditions are Java code); here the same
patterns, events and expected matches are written in Python. Expected matches are compared as
multisets of event sets, as Flink's ``compareMaps`` does.
"""

from __future__ import annotations

from collections import Counter

from ctiflow.operators.cep import IterativeCondition, Nfa, Pattern, compile_pattern


def event(label: str, eid: int, name: str, price: float, volume: float | None = None) -> dict:
    e = {"label": label, "id": eid, "name": name, "price": price, "type": "Event"}
    if volume is not None:
        e.update(type="SubEvent", volume=volume)
    return e


START1 = event("start1", 40, "start", 1.0)
START2 = event("start2", 40, "start", 2.0)
START3 = event("start3", 40, "start", 3.0)
START4 = event("start4", 40, "start", 4.0)
MIDDLE1 = event("middle1", 41, "foo1", 1.0, 10)
MIDDLE2 = event("middle2", 42, "foo2", 2.0, 10)
MIDDLE3 = event("middle3", 43, "foo3", 3.0, 10)
MIDDLE4 = event("middle4", 43, "foo4", 1.0, 10)
NEXT_ONE = event("next", 44, "next-one", 1.0)
END = event("end", 46, "end", 1.0)


def name_is(name: str):
    return lambda e: e["name"] == name


def feed(pattern: Pattern, records: list[tuple[dict, int]]) -> Counter:
    nfa = Nfa(compile_pattern(pattern))
    found: Counter = Counter()
    for e, ts in records:
        nfa.advance_time(ts)
        for match in nfa.process(e, ts):
            found[frozenset(Counter(x["label"] for es in match.values() for x in es).items())] += 1
    return found


def expect(*matches: list[dict]) -> Counter:
    return Counter(frozenset(Counter(e["label"] for e in m).items()) for m in matches)


def price_sum_below_five(stage: str, name_test):
    def condition(value, ctx):
        if not name_test(value):
            return False
        total = sum(e["price"] for e in ctx.get_events_for_pattern(stage)) + value["price"]
        return total < 5.0

    return IterativeCondition(condition)


def branching_pattern(eager: bool) -> Pattern:
    middle = (
        Pattern.begin("start").where(name_is("start"))
        .followed_by("middle").subtype("SubEvent")
        .where(price_sum_below_five("middle", lambda v: v["name"].startswith("foo")))
        .one_or_more()
    )
    if not eager:
        middle = middle.allow_combinations()
    return middle.followed_by("end").where(name_is("end"))


BRANCHING_INPUT = [(START1, 1), (MIDDLE1, 2), (MIDDLE2, 3), (START2, 4), (MIDDLE3, 5),
                   (MIDDLE4, 5), (NEXT_ONE, 6), (END, 8)]


def test_iterative_with_branching_pattern_eager() -> None:
    assert feed(branching_pattern(True), BRANCHING_INPUT) == expect(
        [START1, END, MIDDLE1, MIDDLE2, MIDDLE4],
        [START1, END, MIDDLE2, MIDDLE1],
        [START1, END, MIDDLE1],
        [START2, END, MIDDLE3, MIDDLE4],
        [START2, END, MIDDLE3],
    )


def test_iterative_with_branching_pattern_combinations() -> None:
    assert feed(branching_pattern(False), BRANCHING_INPUT) == expect(
        [START1, END, MIDDLE1, MIDDLE2, MIDDLE4],
        [START1, END, MIDDLE2, MIDDLE1],
        [START1, END, MIDDLE3, MIDDLE1],
        [START2, END, MIDDLE3, MIDDLE4],
        [START1, END, MIDDLE4, MIDDLE1],
        [START1, END, MIDDLE1],
        [START2, END, MIDDLE3],
    )


def looping_start_pattern(eager: bool) -> Pattern:
    start = (
        Pattern.begin("start")
        .where(price_sum_below_five("start", name_is("start")))
        .one_or_more()
    )
    if not eager:
        start = start.allow_combinations()
    return start.optional().followed_by("end").where(name_is("end"))


LOOPING_INPUT = [(START1, 1), (START2, 2), (START3, 3), (END, 4)]


def test_iterative_with_looping_starting_eager() -> None:
    assert feed(looping_start_pattern(True), LOOPING_INPUT) == expect(
        [START1, START2, END], [START1, END], [START2, END], [START3, END], [END]
    )


def test_iterative_with_looping_starting_combination() -> None:
    assert feed(looping_start_pattern(False), LOOPING_INPUT) == expect(
        [START1, START2, END], [START1, START3, END], [START1, END], [START2, END],
        [START3, END], [END],
    )


def test_iterative_with_prev_pattern_dependency() -> None:
    pattern = (
        Pattern.begin("start").where(name_is("start")).one_or_more()
        .followed_by("end").where(
            lambda v, ctx: v["name"] == "end"
            and sum(e["price"] for e in ctx.get_events_for_pattern("start")) >= 2.0
        )
    )
    got = feed(pattern, [(START1, 1), (START2, 2), (END, 4)])
    assert got == expect([START1, START2, END], [START2, END])


def test_iterative_with_abac_pattern() -> None:
    def middle2(value, ctx):
        if value["name"] != "start":
            return False
        total = sum(e["price"] for e in ctx.get_events_for_pattern("middle2")) + value["price"]
        return total <= 5.0

    pattern = (
        Pattern.begin("start").where(name_is("start"))
        .followed_by_any("middle1").subtype("SubEvent").where(lambda v: v["name"].startswith("foo"))
        .followed_by("middle2").where(IterativeCondition(middle2)).one_or_more()
        .followed_by("end").where(name_is("end"))
    )
    records = [(START1, 1), (MIDDLE1, 2), (START2, 2), (START3, 2), (MIDDLE2, 2), (START4, 2),
               (MIDDLE3, 2), (MIDDLE4, 2), (END, 4)]
    assert feed(pattern, records) == expect(
        [START1, START2, START3, MIDDLE1, END],
        [START1, MIDDLE1, START2, END],
        [START1, MIDDLE2, START4, END],
        [START2, MIDDLE2, START4, END],
        [START3, MIDDLE2, START4, END],
    )


def test_iterative_with_prev_pattern_dependency_after_branching() -> None:
    pattern = (
        Pattern.begin("start").where(name_is("start")).one_or_more()
        .followed_by_any("middle1").subtype("SubEvent").where(lambda v: v["name"].startswith("foo"))
        .followed_by_any("end").where(
            lambda v, ctx: v["name"] == "end"
            and sum(e["price"] for e in ctx.get_events_for_pattern("start")) >= 2.0
        )
    )
    records = [(START1, 1), (START2, 2), (MIDDLE1, 4), (START3, 5), (MIDDLE2, 6), (END, 7)]
    assert feed(pattern, records) == expect(
        [START1, START2, MIDDLE1, END],
        [START2, MIDDLE1, END],
        [START1, START2, MIDDLE2, END],
        [START1, START2, START3, MIDDLE2, END],
        [START2, START3, MIDDLE2, END],
        [START2, MIDDLE2, END],
        [START3, MIDDLE2, END],
    )


def test_skip_to_first_waits_for_an_earlier_partial_match() -> None:
    """AfterMatchSkipITCase.testSkipBeforeOtherAlreadyCompleted (records without timestamps)."""
    a1, c1, a2 = event("a1", 1, "a1", 0.0), event("c1", 2, "c1", 0.0), event("a2", 3, "a2", 1.0)
    c2, b1, b2 = event("c2", 4, "c2", 0.0), event("b1", 5, "b1", 1.0), event("b2", 6, "b2", 0.0)
    from ctiflow.operators.cep import AfterMatchSkipStrategy

    pattern = (
        Pattern.begin("a", AfterMatchSkipStrategy.skip_to_first("c"))
        .where(lambda v: "a" in v["name"])
        .followed_by("c").where(lambda v: "c" in v["name"])
        .followed_by("b").where(
            lambda v, ctx: "b" in v["name"]
            and ctx.get_events_for_pattern("a")[0]["price"] == v["price"]
        )
    )
    nfa = Nfa(compile_pattern(pattern))
    found: Counter = Counter()
    for e in (a1, c1, a2, c2, b1, b2):
        for match in nfa.process(e, -(2**63)):
            found[frozenset(Counter(x["label"] for es in match.values() for x in es).items())] += 1
    assert found == expect([a1, c1, b2], [a2, c2, b1])


def _until_sum_is_six(value, ctx) -> bool:
    return sum(e["price"] for e in ctx.get_events_for_pattern("middle")) == 6.0


UNTIL_START = event("start", 40, "c", 1.0)
UNTIL_MIDDLE = [event("m1", 41, "a", 2.0), event("m2", 42, "a", 3.0), event("m3", 40, "d", 1.0)]
UNTIL_INPUT = [(UNTIL_START, 1), (UNTIL_MIDDLE[0], 3), (UNTIL_MIDDLE[1], 4), (UNTIL_MIDDLE[2], 5),
               (event("breaking", 44, "a", 5.0), 6), (event("ignored", 45, "a", 6.0), 7)]


def test_iterative_until_condition_one_or_more() -> None:
    """UntilConditionITCase.testIterativeUntilConditionOneOrMore: the loop stops once the
    middle events sum to 6, and only the start state is left."""
    pattern = (
        Pattern.begin("start").where(name_is("c"))
        .followed_by("middle").one_or_more().until(_until_sum_is_six)
    )
    nfa = Nfa(compile_pattern(pattern))
    found: Counter = Counter()
    for e, ts in UNTIL_INPUT:
        nfa.advance_time(ts)
        for match in nfa.process(e, ts):
            found[frozenset(Counter(x["label"] for es in match.values() for x in es).items())] += 1
    m1, m2, m3 = UNTIL_MIDDLE
    assert found == expect([UNTIL_START, m1, m2, m3], [UNTIL_START, m1, m2], [UNTIL_START, m1])
    assert [cs.state for cs in nfa.state.partial_matches] == ["start"]


def test_iterative_until_condition_zero_or_more() -> None:
    pattern = (
        Pattern.begin("start").where(name_is("c"))
        .followed_by("middle").one_or_more().optional().until(_until_sum_is_six)
    )
    nfa = Nfa(compile_pattern(pattern))
    found: Counter = Counter()
    for e, ts in UNTIL_INPUT:
        nfa.advance_time(ts)
        for match in nfa.process(e, ts):
            found[frozenset(Counter(x["label"] for es in match.values() for x in es).items())] += 1
    m1, m2, m3 = UNTIL_MIDDLE
    assert found == expect([UNTIL_START, m1, m2, m3], [UNTIL_START, m1, m2], [UNTIL_START, m1],
                           [UNTIL_START])
    assert [cs.state for cs in nfa.state.partial_matches] == ["start"]
