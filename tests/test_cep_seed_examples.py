"""The worked examples of seeds/flink-cep-internals.zh.txt, quoted as data."""

from __future__ import annotations

from ctiflow.operators.cep import DeweyNumber, Nfa, Pattern, SharedBuffer, compile_pattern
from ctiflow.operators.cep.nfa.compiler import IGNORE, PROCEED, TAKE

# Event(id, name, price) as in the article; timestamps: every record at 3 in the first example.
SEED_EVENTS = [
    {"id": 0, "name": "x", "price": 1.0},
    {"id": 1, "name": "a", "price": 1.0},
    {"id": 2, "name": "b", "price": 2.0},
    {"id": 3, "name": "c", "price": 3.0},
    {"id": 4, "name": "a", "price": 4.0},
    {"id": 5, "name": "b", "price": 5.0},
]


def name_is(name: str):
    return lambda event: event["name"] == name


def run(pattern: Pattern, events: list[dict], timestamps: list[int]) -> list[list[int]]:
    nfa = Nfa(compile_pattern(pattern))
    found = []
    for event, ts in zip(events, timestamps):
        nfa.advance_time(ts)
        for match in nfa.process(event, ts):
            found.append([e["id"] for stage_events in match.values() for e in stage_events])
    return found


def test_next_matches_two_consecutive_events() -> None:
    """"所以最后的输出结果是[event1, event2]和[event4, event5]。"""
    pattern = Pattern.begin("pattern1").where(name_is("a")).next("pattern2").where(name_is("b"))
    assert run(pattern, SEED_EVENTS, [3] * 6) == [[1, 2], [4, 5]]


def test_optional_middle_emits_start_alone_then_with_middle() -> None:
    """"理论上的输出结果应该是[event1] 和 [event1,event4]。" (start c, followedBy middle a, optional)"""
    events = [
        {"id": 0, "name": "x", "price": 1.0},
        {"id": 1, "name": "c", "price": 1.0},
        {"id": 2, "name": "b", "price": 2.0},
        {"id": 3, "name": "b", "price": 2.0},
        {"id": 4, "name": "a", "price": 2.0},
        {"id": 5, "name": "b", "price": 5.0},
    ]
    pattern = (
        Pattern.begin("start").where(name_is("c"))
        .followed_by("middle").where(name_is("a")).optional()
    )
    assert run(pattern, events, [40, 40, 42, 43, 44, 45]) == [[1], [1, 4]]


def test_followed_by_any_finds_every_later_b() -> None:
    """"上述的例子输出结果是[event1, event2]、[event4, event5]和[event1, event5]。"""
    pattern = (
        Pattern.begin("pattern1").where(name_is("a"))
        .followed_by_any("pattern2").where(name_is("b"))
    )
    found = run(pattern, SEED_EVENTS, [3] * 6)
    assert sorted(found) == sorted([[1, 2], [4, 5], [1, 5]])


def test_optional_middle_state_has_take_proceed_and_ignore_edges() -> None:
    """"state2做状态迁移的时候存在三条边(take,proceed,ingore)": the optional relaxed stage."""
    pattern = (
        Pattern.begin("start").where(name_is("c"))
        .followed_by("middle").where(name_is("a")).optional()
    )
    plan = compile_pattern(pattern)
    middle = plan.states["middle"]
    assert {t.action for t in middle.transitions} == {TAKE, PROCEED, IGNORE}
    start = plan.states[plan.start_state]
    assert [t.action for t in start.transitions] == [TAKE]


def test_shared_buffer_versions_extract_the_two_runs_of_the_article() -> None:
    """The article's buffer: a1 holds e0 (v1) and e2 (v2); a[] chains e1..e6 with versions
    1.0 / 1.1; b holds e8 after e4 (v1.0.0) and e7 after e6 (v1.1.0). Walking back along
    compatible versions gives [e0,e1,e2,e3,e4,e8] and [e0,e1,e2,e3,e4,e5,e6,e7]."""
    buffer = SharedBuffer()
    ids = [buffer.register_event(f"e{i}", timestamp=i) for i in range(9)]
    d = DeweyNumber.from_string
    a1_e0 = buffer.put("a1", ids[0], None, d("1"))
    buffer.put("a1", ids[2], None, d("2"))
    e1 = buffer.put("a[]", ids[1], a1_e0, d("1.0"))
    e2 = buffer.put("a[]", ids[2], e1, d("1.0"))
    e3 = buffer.put("a[]", ids[3], e2, d("1.0"))
    e4 = buffer.put("a[]", ids[4], e3, d("1.0"))
    e5 = buffer.put("a[]", ids[5], e4, d("1.1"))
    e6 = buffer.put("a[]", ids[6], e5, d("1.1"))
    b_e8 = buffer.put("b", ids[8], e4, d("1.0.0"))
    b_e7 = buffer.put("b", ids[7], e6, d("1.1.0"))

    def events(node, version):
        (path,) = buffer.extract_patterns(node, d(version))
        return [e for stage in buffer.materialize(path).values() for e in stage]

    assert sorted(events(b_e8, "1.0.0"), key=lambda e: int(e[1:])) == \
        ["e0", "e1", "e2", "e3", "e4", "e8"]
    assert sorted(events(b_e7, "1.1.0"), key=lambda e: int(e[1:])) == \
        ["e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7"]


def test_dewey_compatibility_rule_of_the_article() -> None:
    """"(1)v包含了v'作为前缀或者(2)v与v'仅最后一个数值不同,而对于版本v而言要大于版本v'"."""
    d = DeweyNumber.from_string
    assert d("1.0.0").is_compatible_with(d("1.0"))  # prefix
    assert d("1.1").is_compatible_with(d("1.0"))  # last digit greater
    assert d("1.0").is_compatible_with(d("1.0"))
    assert not d("1.0").is_compatible_with(d("1.1"))
    assert not d("1.0").is_compatible_with(d("1.0.0"))
    assert not d("2.0").is_compatible_with(d("1"))
