"""Property tests: the NFA against brute-force oracles for simple patterns."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.operators.cep import Nfa, Pattern, compile_pattern
from ctiflow.operators.cep.nfa.heap import BinaryHeap

streams = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(min_value=0, max_value=4)), max_size=14
)


def timed(stream: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(name, gap) pairs -> (name, timestamp) with non-decreasing timestamps."""
    out, t = [], 0
    for name, gap in stream:
        t += gap
        out.append((name, t))
    return out


def is_(name: str):
    return lambda e: e["name"] == name


def run(pattern: Pattern, events: list[tuple[str, int]]) -> Counter:
    nfa = Nfa(compile_pattern(pattern))
    found: Counter = Counter()
    for i, (name, ts) in enumerate(events):
        nfa.advance_time(ts)
        for match in nfa.process({"name": name, "i": i}, ts):
            found[tuple((s, tuple(e["i"] for e in es)) for s, es in match.items())] += 1
    return found


@settings(max_examples=150, deadline=None)
@given(streams, st.integers(min_value=1, max_value=8))
def test_followed_by_any_within_is_every_pair_inside_the_window(stream, window) -> None:
    events = timed(stream)
    pattern = Pattern.begin("x").where(is_("a")).followed_by_any("y").where(is_("b")).within(window)
    oracle = Counter(
        (("x", (i,)), ("y", (j,)))
        for i, j in combinations(range(len(events)), 2)
        if events[i][0] == "a" and events[j][0] == "b" and events[j][1] - events[i][1] < window
    )
    assert run(pattern, events) == oracle


@settings(max_examples=150, deadline=None)
@given(streams)
def test_next_is_adjacent_pairs(stream) -> None:
    events = timed(stream)
    pattern = Pattern.begin("x").where(is_("a")).next("y").where(is_("b"))
    oracle = Counter(
        (("x", (i,)), ("y", (i + 1,)))
        for i in range(len(events) - 1)
        if events[i][0] == "a" and events[i + 1][0] == "b"
    )
    assert run(pattern, events) == oracle


@settings(max_examples=150, deadline=None)
@given(streams)
def test_followed_by_takes_the_first_matching_event(stream) -> None:
    events = timed(stream)
    pattern = Pattern.begin("x").where(is_("a")).followed_by("y").where(is_("b"))
    oracle: Counter = Counter()
    for i, (name, _) in enumerate(events):
        if name == "a":
            later = [j for j in range(i + 1, len(events)) if events[j][0] == "b"]
            if later:
                oracle[(("x", (i,)), ("y", (later[0],)))] += 1
    assert run(pattern, events) == oracle


@settings(max_examples=150, deadline=None)
@given(streams)
def test_consecutive_times_two_is_a_then_first_b_then_the_next_event_b(stream) -> None:
    events = timed(stream)
    pattern = (
        Pattern.begin("x").where(is_("a"))
        .followed_by("y").where(is_("b")).times(2).consecutive()
    )
    oracle: Counter = Counter()
    for i, (name, _) in enumerate(events):
        if name != "a":
            continue
        later = [j for j in range(i + 1, len(events)) if events[j][0] == "b"]
        if later and later[0] + 1 < len(events) and events[later[0] + 1][0] == "b":
            oracle[(("x", (i,)), ("y", (later[0], later[0] + 1)))] += 1
    assert run(pattern, events) == oracle


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["offer", "poll", "remove"]),
                          st.integers(min_value=0, max_value=5)), max_size=40))
def test_heap_keeps_the_heap_invariant_and_polls_in_key_order(ops) -> None:
    heap: BinaryHeap = BinaryHeap(lambda item: item[0])
    model: list = []
    counter = 0
    for op, value in ops:
        if op == "offer":
            item = (value, counter)
            counter += 1
            heap.offer(item)
            model.append(item)
        elif op == "poll" and model:
            item = heap.poll()
            assert item[0] == min(k for k, _ in model)
            model.remove(item)
        elif op == "remove":
            doomed = [item for item in model if item[0] == value]
            heap.remove_all(doomed)
            model = [item for item in model if item[0] != value]
        keys = [k for k, _ in heap.items()]
        assert all(keys[(i - 1) // 2] <= keys[i] for i in range(1, len(keys)))
        assert sorted(heap.items()) == sorted(model)
