"""The compiler on shapes the conformance cases do not cover, and its one error type.

Issue 16: ``begin(a).not_followed_by(b).followed_by(c).one_or_more().optional().greedy()
.until(d)`` used to fail with a bare ``KeyError: '$endState$'``. Flink's ``NFACompiler``
compiles it, but to a graph with a PROCEED edge whose target is ``null`` (below); the expected
graphs and matches here are worked out from Flink's compiler and NFA rules, and were checked
against ``flink-cep`` 2.3.0 run on the same events.
"""

from __future__ import annotations

import itertools

import pytest

from ctiflow.operators.cep import GroupPattern, Nfa, Pattern, compile_pattern
from ctiflow.operators.cep.pattern import ConsumingStrategy
from ctiflow.operators.errors import PatternError


def first_char_is(char: str):
    return lambda event: event[0] == char


def issue_pattern() -> Pattern:
    return (
        Pattern.begin("a").where(first_char_is("a"))
        .not_followed_by("b").where(first_char_is("b"))
        .followed_by("c").where(first_char_is("c")).one_or_more().optional().greedy()
        .until(first_char_is("d"))
    )


def run(pattern: Pattern, events: str) -> list[list[dict[str, list[str]]]]:
    """The matches emitted after each event (events are labels such as ``a1``; the first
    character decides which conditions hold)."""
    nfa = Nfa(compile_pattern(pattern))
    return [nfa.process(event, t) for t, event in enumerate(events.split(), start=1)]


def graph(pattern: Pattern) -> dict[str, list[tuple[str, str]]]:
    plan = compile_pattern(pattern)
    return {
        name: [(t.action.value, t.target.name) for t in state.transitions]
        for name, state in plan.states.items()
    }


def test_the_issue_pattern_compiles_to_flinks_graph() -> None:
    # Flink's NFACompiler, from the last stage back:
    # * c (looping, optional, greedy, until d, after the NOT stage b): copyWithoutTransitiveNots
    #   copies the final state for the loop ("$endState$:0"); createLooping builds "c" (PROCEED
    #   to a copy "$endState$:1" when d holds, else to "$endState$:0"; TAKE itself; IGNORE to
    #   "c:0") and records originalStateMap["$endState$:0"] = "$endState$:1";
    # * createTimesState builds c's first state "c:1": TAKE to "c:2" (the loop state copied
    #   without the NOT check, PROCEED targets copied too: "$endState$:1:0", "$endState$:0:0"),
    #   PROCEED when d holds to originalStateMap.get("$endState$"), which is absent (null in
    #   Flink), PROCEED otherwise to "$endState$", IGNORE to "c:3", and the stop edge to "b";
    # * b (not_followed_by) adds no state; a is the start state, TAKE to "c:1".
    # The one difference: the PROCEED Flink leaves dangling goes to "$endState$" here (the
    # unmodified proceed state; see _Compiler._original_state).
    assert graph(issue_pattern()) == {
        "$endState$": [],
        "$endState$:0": [],
        "$endState$:1": [],
        "$endState$:1:0": [],
        "$endState$:0:0": [],
        "a": [("take", "c:1")],
        "b": [("take", "b")],
        "c": [("proceed", "$endState$:1"), ("proceed", "$endState$:0"), ("take", "c"),
              ("ignore", "c:0")],
        "c:0": [("take", "c"), ("ignore", "c:0")],
        "c:1": [("take", "c:2"), ("proceed", "$endState$"), ("proceed", "$endState$"),
                ("ignore", "c:3"), ("proceed", "b")],
        "c:2": [("proceed", "$endState$:1:0"), ("proceed", "$endState$:0:0"), ("take", "c:2"),
                ("ignore", "c:0")],
        "c:3": [("take", "c:2"), ("ignore", "c:3"), ("proceed", "b")],
    }


A1 = {"a": ["a1"]}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # c is optional and last: taking a1 reaches the final state by PROCEED at once (Flink's
        # findFinalStateAfterProceed), so [a1] is emitted on a1. Every c the greedy loop takes
        # emits the longer match; x1 is skipped (relaxed inner contiguity); e1 matches nothing.
        ("a1 c1 c2 x1 c3 e1",
         [[A1], [{"a": ["a1"], "c": ["c1"]}], [{"a": ["a1"], "c": ["c1", "c2"]}], [],
          [{"a": ["a1"], "c": ["c1", "c2", "c3"]}], []]),
        # b before any c: c:1's PROCEED to the stop state "b" fires, the run is discarded
        # (with its IGNORE branch).
        ("a1 b1 c1", [[A1], [], []]),
        # the same after a skipped event: the ignore state c:3 has the stop edge too.
        ("a1 x1 b1 c1", [[A1], [], [], []]),
        # b after a c: the loop states were copied without the NOT check, b is just skipped.
        ("a1 c1 b1 c2",
         [[A1], [{"a": ["a1"], "c": ["c1"]}], [], [{"a": ["a1"], "c": ["c1", "c2"]}]]),
        # d ends the loop: TAKE needs "not d", the PROCEED on d goes to a final state (nothing
        # to emit without a TAKE), IGNORE needs "not d": the run ends; c2 extends nothing.
        ("a1 c1 d1 c2", [[A1], [{"a": ["a1"], "c": ["c1"]}], [], []]),
        # two runs: both take c1, emitted in the order of their first event; d1 ends both.
        ("a1 a2 c1 d1 c2",
         [[A1], [{"a": ["a2"]}], [{"a": ["a1"], "c": ["c1"]}, {"a": ["a2"], "c": ["c1"]}],
          [], []]),
        # a2's run took c2 before b1, so b1 kills neither run.
        ("a1 c1 a2 c2 b1 c3",
         [[A1], [{"a": ["a1"], "c": ["c1"]}], [{"a": ["a2"]}],
          [{"a": ["a1"], "c": ["c1", "c2"]}, {"a": ["a2"], "c": ["c2"]}], [],
          [{"a": ["a1"], "c": ["c1", "c2", "c3"]}, {"a": ["a2"], "c": ["c2", "c3"]}]]),
        # d before any c, after a skipped event: the run waits in c:3, which has no until edge.
        ("a1 x1 d1 c1", [[A1], [], [], [{"a": ["a1"], "c": ["c1"]}]]),
    ],
)
def test_the_issue_pattern_matches_like_flink(events: str, expected: list) -> None:
    assert run(issue_pattern(), events) == expected


def test_until_right_after_the_previous_stage_does_not_end_the_loop() -> None:
    # Here Flink's NFA follows the dangling PROCEED and throws NullPointerException on d1.
    # The edge now goes where the "not d" PROCEED goes, so d1 is skipped like any other
    # non-c event: the same as Flink for "a1 x1 d1 c1" (above) and for this pattern without
    # the NOT stage, whose c:1 has no dangling edge.
    assert run(issue_pattern(), "a1 d1 c1") == [[A1], [], [{"a": ["a1"], "c": ["c1"]}]]
    without_not = (
        Pattern.begin("a").where(first_char_is("a"))
        .followed_by("c").where(first_char_is("c")).one_or_more().optional().greedy()
        .until(first_char_is("d"))
    )
    assert run(without_not, "a1 d1 c1") == [[A1], [], [{"a": ["a1"], "c": ["c1"]}]]


def test_the_same_stage_inside_a_group_and_behind_an_optional_stage_compiles() -> None:
    loop = (
        Pattern.begin("x").where(first_char_is("x"))
        .not_followed_by("b").where(first_char_is("b"))
        .followed_by("c").where(first_char_is("c")).one_or_more().optional().greedy()
        .until(first_char_is("d"))
    )
    grouped = (
        Pattern.begin("a").where(first_char_is("a")).followed_by(loop)
        .followed_by("e").where(first_char_is("e"))
    )
    # The group may end after x (c optional, the run proceeds to e) or after c1; both runs
    # wait for e, and e1 completes both (same first event: compared without order).
    assert sorted(map(str, run(grouped, "a1 x1 c1 e1")[-1])) == sorted(map(str, [
        {"a": ["a1"], "x": ["x1"], "c": ["c1"], "e": ["e1"]},
        {"a": ["a1"], "x": ["x1"], "e": ["e1"]},
    ]))
    # Flink's compiler itself throws here (copyWithoutTransitiveNots for the optional x
    # follows the dangling edge); with the edge in place the pattern compiles.
    behind_optional = (
        Pattern.begin("a").where(first_char_is("a"))
        .not_followed_by("b").where(first_char_is("b"))
        .followed_by("x").where(first_char_is("x")).optional()
        .followed_by("c").where(first_char_is("c")).one_or_more().optional().greedy()
        .until(first_char_is("d"))
        .followed_by("e").where(first_char_is("e"))
    )
    compile_pattern(behind_optional)


def _stage_builders():
    """Ways to append one stage (name given) to a pattern, through the public API only."""
    def loop_group(name: str) -> Pattern:
        return (
            Pattern.begin(f"{name}x").where(first_char_is("x"))
            .not_followed_by(f"{name}z").where(first_char_is("z"))
            .followed_by(f"{name}y").where(first_char_is("y")).one_or_more().optional()
            .greedy().until(first_char_is("d"))
        )

    return [
        lambda p, n: p.next(n).where(first_char_is("c")),
        lambda p, n: p.followed_by(n).where(first_char_is("c")).optional(),
        lambda p, n: p.followed_by_any(n).where(first_char_is("c")).one_or_more(),
        lambda p, n: p.not_next(n).where(first_char_is("b")),
        lambda p, n: p.not_followed_by(n).where(first_char_is("b")),
        lambda p, n: p.followed_by(n).where(first_char_is("c")).one_or_more().optional()
        .greedy().until(first_char_is("d")),
        lambda p, n: p.followed_by(n).where(first_char_is("c")).times_or_more(2)
        .until(first_char_is("d")),
        lambda p, n: p.next(n).where(first_char_is("c")).times(1, 3).optional().greedy(),
        lambda p, n: p.followed_by(n).where(first_char_is("c")).times(2).consecutive(),
        lambda p, n: p.followed_by(n).where(first_char_is("c")).one_or_more()
        .allow_combinations().optional(),
        lambda p, n: p.followed_by(loop_group(n)),
        lambda p, n: p.followed_by_any(loop_group(n)).one_or_more().optional(),
    ]


def test_every_shape_compiles_or_raises_pattern_error() -> None:
    """Three appended stages of every kind: a deliberate PatternError (not one wrapping an
    internal failure) or a plan whose edges all lead to states of the plan, and which runs."""
    builders = _stage_builders()
    compiled = 0
    for combo in itertools.product(range(len(builders)), repeat=3):
        pattern = Pattern.begin("s").where(first_char_is("a"))
        try:
            for position, index in enumerate(combo):
                pattern = builders[index](pattern, f"p{position}")
            pattern = pattern.within(50)
        except PatternError:
            continue  # refused while building, as in Flink
        try:
            plan = compile_pattern(pattern)
        except PatternError as error:
            assert error.__cause__ is None, (pattern, error)
            continue
        compiled += 1
        for state in plan.states.values():
            for transition in state.transitions:
                assert plan.states.get(transition.target.name) is transition.target, (
                    pattern, state.name, transition)
        nfa = Nfa(plan)
        for t, event in enumerate("a1 x1 c1 y1 d1 c2 b1 y2 z1 c3 e1".split(), start=1):
            nfa.process(event, t)
        nfa.advance_time(1_000)
    assert compiled > 500


def _tamper_times(pattern: Pattern) -> Pattern:
    pattern._times = None  # type: ignore[attr-defined]
    return pattern


def _tamper_condition(pattern: Pattern) -> Pattern:
    pattern._condition = "kind == 'c'"  # type: ignore[attr-defined]
    return pattern


def _tamper_previous(pattern: Pattern) -> Pattern:
    pattern._previous = "a"  # type: ignore[attr-defined]
    return pattern


@pytest.mark.parametrize(
    ("broken", "fragment"),
    [
        # a looping stage without its times range
        (lambda: _tamper_times(Pattern.begin("a").followed_by("c").one_or_more()),
         "stage 'c': a looping/times stage has no times range"),
        # a condition that is not a condition (a string)
        (lambda: _tamper_condition(Pattern.begin("a").followed_by("c").optional()),
         "stage 'c'"),
        # a previous stage that is not a stage
        (lambda: _tamper_previous(Pattern.begin("x").followed_by("c")), "stage 'c'"),
        # the same inside a group: the message names the group too
        (lambda: Pattern.begin("a").followed_by(
            _tamper_times(Pattern.begin("g").followed_by("h").one_or_more())),
         "stage 'h' (in the group starting at stage 'g')"),
    ],
)
def test_a_broken_pattern_gives_a_pattern_error_naming_the_stage(broken, fragment: str) -> None:
    with pytest.raises(PatternError) as info:
        compile_pattern(broken())
    assert fragment in str(info.value)


def test_a_group_of_something_else_is_refused_when_built() -> None:
    with pytest.raises(PatternError, match="a group stage needs a Pattern, got str"):
        GroupPattern(None, "a", ConsumingStrategy.STRICT, None)  # type: ignore[arg-type]
