"""The shared buffer stores each event once and frees it when no run needs it."""

from __future__ import annotations

import pickle

from ctiflow.operators.cep import DeweyNumber, Nfa, NfaState, Pattern, SharedBuffer, compile_pattern


def name_is(name: str):
    return lambda event: event["name"] == name


def overlapping_pattern(within: int | None = None) -> Pattern:
    """a followed_by_any b+ followed_by_any c: every a starts a run, every b forks runs."""
    pattern = (
        Pattern.begin("a").where(name_is("a"))
        .followed_by_any("b").where(name_is("b")).one_or_more().allow_combinations()
        .followed_by_any("c").where(name_is("c"))
    )
    return pattern.within(within) if within is not None else pattern


def test_overlapping_runs_store_each_event_once() -> None:
    nfa = Nfa(compile_pattern(overlapping_pattern()))
    events = [{"name": n, "i": i} for i, n in enumerate("aaabbbb")]
    for ts, event in enumerate(events):
        nfa.process(event, ts)
    runs = sum(1 for cs in nfa.state.partial_matches if cs.start_event_id is not None)
    buffer = nfa.state.buffer
    assert runs > len(events)  # many more partial matches than events...
    assert len(buffer.events) == len(events)  # ...but every event is stored exactly once
    stored = [wrapper[0] for wrapper in buffer.events.values()]
    assert all(any(s is e for s in stored) for e in events)  # the same objects, no copies


def test_matches_share_the_stored_event_objects() -> None:
    nfa = Nfa(compile_pattern(overlapping_pattern()))
    events = [{"name": n} for n in "aabbc"]
    matches = []
    for ts, event in enumerate(events):
        matches += nfa.process(event, ts)
    assert len(matches) > 2
    firsts = {id(m["a"][0]) for m in matches}
    assert firsts <= {id(events[0]), id(events[1])}


def test_buffer_is_empty_once_every_run_expired() -> None:
    nfa = Nfa(compile_pattern(overlapping_pattern(within=10)))
    for ts, name in enumerate("aabbbcb"):
        nfa.advance_time(ts)
        nfa.process({"name": name}, ts)
    assert nfa.state.buffer.events
    nfa.advance_time(1_000)
    assert nfa.state.buffer.events == {}
    assert nfa.state.buffer.nodes == {}
    assert nfa.state.is_idle()


def test_events_that_no_run_takes_are_not_stored() -> None:
    nfa = Nfa(compile_pattern(overlapping_pattern()))
    for ts, name in enumerate("xyzxyz"):
        nfa.process({"name": name}, ts)
    assert nfa.state.buffer.events == {}


def test_release_of_a_shared_prefix_keeps_the_other_run() -> None:
    buffer = SharedBuffer()
    e0, e1, e2 = (buffer.register_event(f"e{i}", i) for i in range(3))
    v = DeweyNumber.from_string
    root = buffer.put("a", e0, None, v("1"))
    left = buffer.put("b", e1, root, v("1.0"))
    right = buffer.put("b", e2, root, v("1.1"))
    buffer.lock_node(left, v("1.0.0"))
    buffer.lock_node(right, v("1.1.0"))
    for event_id in (e0, e1, e2):
        buffer.release_event(event_id)  # the processing locks of register_event

    buffer.release_node(left, v("1.0.0"))
    assert "e1" not in [w[0] for w in buffer.events.values()]
    (path,) = buffer.extract_patterns(right, v("1.1.0"))
    assert buffer.materialize(path) == {"a": ["e0"], "b": ["e2"]}

    buffer.release_node(right, v("1.1.0"))
    assert buffer.is_empty()


def test_state_snapshot_round_trips_events_and_versions() -> None:
    plan = compile_pattern(overlapping_pattern())
    nfa = Nfa(plan)
    for ts, name in enumerate("aabb"):
        nfa.process({"name": name, "ts": ts}, ts)
    restored = Nfa.restore(plan, nfa.snapshot())
    assert restored.state.to_plain() == nfa.state.to_plain()
    assert pickle.loads(nfa.snapshot())  # plain data, loadable anywhere
    rest = [{"name": "b"}, {"name": "c"}]
    got = [restored.process(e, 10 + i) for i, e in enumerate(rest)]
    want = [nfa.process(e, 10 + i) for i, e in enumerate(rest)]
    assert got == want and want[-1]


def test_initial_state_is_idle() -> None:
    plan = compile_pattern(overlapping_pattern())
    assert NfaState.initial(plan).is_idle()


def test_shared_buffer_is_properly_cleared_after_skipped_matches() -> None:
    """AfterMatchSkipITCase.testSharedBufferIsProperlyCleared."""
    from ctiflow.operators.cep import AfterMatchSkipStrategy

    pattern = Pattern.begin("start", AfterMatchSkipStrategy.skip_past_last_event()).times(2)
    nfa = Nfa(compile_pattern(pattern))
    for ts in range(4):
        nfa.advance_time(ts)
        nfa.process({"id": 1, "name": "a", "price": 1.0}, ts)
    assert nfa.state.buffer.is_empty()
