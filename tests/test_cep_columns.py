"""The match operator on columns (rows whose key is idle and on which the pattern's start
cannot move are skipped; rows on which no run of a packed key can move, before its due CTI)
gives exactly what it gives event by event: the same records in the same order, the same
refusals, the same state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.errors import EventRejected
from ctiflow.operators.time import CTI_INFINITY, Event
from ctiflow.jobs.testing.snapshots import match_state

PATTERNS = {
    "strict": {"name": "strict", "within_ms": 50, "stages": [
        {"name": "a", "where": "kind == 'a'"}, {"name": "b", "contiguity": "next", "where": "kind == 'b'"}]},
    "relaxed one or more": {"name": "r", "within_ms": 80, "stages": [
        {"name": "a", "where": "kind == 'a' and amount > 3"},
        {"name": "b", "contiguity": "followed_by", "where": "kind == 'b'", "quantifier": "one_or_more"},
        {"name": "c", "contiguity": "followed_by", "where": "kind == 'c'"}]},
    "optional start": {"name": "o", "within_ms": 60, "stages": [
        {"name": "a", "where": "kind == 'a'", "optional": True},
        {"name": "b", "contiguity": "followed_by", "where": "kind == 'b' or amount >= 8"}]},
    "looping start, until": {"name": "l", "within_ms": 40, "stages": [
        {"name": "a", "where": "kind == 'a'", "quantifier": {"times_or_more": 1}, "until": "amount > 8"},
        {"name": "c", "contiguity": "followed_by_any", "where": "kind == 'c'"}]},
    "not next": {"name": "n", "within_ms": 40, "skip": "skip_past_last_event", "stages": [
        {"name": "a", "where": "kind == 'a'", "or": ["amount == 0"]},
        {"name": "x", "negation": "not_next", "where": "kind == 'c'"},
        {"name": "b", "contiguity": "followed_by", "where": "kind == 'b'"}]},
    "refusing condition": {"name": "f", "within_ms": 30, "stages": [
        {"name": "a", "where": "note > 1"},  # note is a string sometimes: refused per event
        {"name": "b", "contiguity": "followed_by", "where": "kind == 'b'"}]},
    "relaxed pair": {"name": "p", "within_ms": 40, "stages": [
        {"name": "a", "where": "kind == 'a'"},
        {"name": "b", "contiguity": "followed_by", "where": "kind == 'b' and amount > 2"}]},
    "any, then not followed by": {"name": "q", "within_ms": 50, "stages": [
        {"name": "a", "where": "kind == 'a'"}, {"name": "b", "contiguity": "followed_by_any", "where": "kind == 'b'"},
        {"name": "x", "negation": "not_followed_by", "where": "kind == 'c'"}]},
    "times, relaxed": {"name": "t", "within_ms": 60, "skip": "skip_to_next", "stages": [
        {"name": "a", "where": "kind == 'a' or amount == 9"},
        {"name": "b", "contiguity": "followed_by", "where": "kind == 'b'", "quantifier": {"times": 2}}]},
    # a later operand reads the match, and fails on a note of "x": never evaluated where kind decides
    "plain, then first()": {"name": "pf", "within_ms": 40, "stages": [
        {"name": "a", "where": "kind == 'a'"},
        {"name": "b", "contiguity": "followed_by", "where": "kind == 'b' and note > first('a').amount"}]},
    "first(), then plain": {"name": "fp", "within_ms": 40, "stages": [
        {"name": "a", "where": "kind == 'a'"},
        {"name": "b", "contiguity": "followed_by", "where": "note > first('a').amount and kind == 'b'"}]},
    "iterative": {"name": "i", "within_ms": 30, "stages": [
        {"name": "a", "where": "kind == 'a'"},
        {"name": "b", "contiguity": "followed_by", "where": "amount > first('a').amount"}]},
}


@st.composite
def streams(draw):
    n = draw(st.integers(1, 120))
    keys = draw(st.integers(1, 6))
    t = 1000
    events = []
    for i in range(n):
        t += draw(st.integers(0, 6))
        note = draw(st.sampled_from([None, 1, 2, "x"]))
        fields = {"kind": draw(st.sampled_from("aabcdddd")), "amount": float(draw(st.integers(0, 10))), "note": note}
        events.append(Event(f"k{draw(st.integers(0, keys - 1))}", t, t, fields, draw(st.integers(0, 2)), i, "s"))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=5)))
    return events, cuts


def _state(op) -> dict:
    """Each key's due CTI, state and runs in flight (the snapshot's content, whatever the order of its keys)."""
    content = match_state(op.snapshot())
    return content["keys"] | {"numbers": content["numbers"]}


def _per_event(op, chunk):
    """Each event into its key's NFA, none skipped (``process_event``: not through
    :meth:`MatchOperator.rows_to_take`, whose skipping the columns' path is checked against)."""
    got = []
    for i, e in enumerate(chunk):
        try:
            out = op.process_event(e)
        except EventRejected as exc:  # what time passing emitted before the refusal comes first
            if exc.outputs:
                got.append((i, [o.record for o in exc.outputs]))
            got.append((i, str(exc)))
            continue
        if out:
            got.append((i, [o.record for o in out]))
    return got


def _by_columns(op, chunk):
    return [(i, str(r) if isinstance(r, EventRejected) else [o.record for o in r])
            for i, r in op.process_columns(EventColumns.from_events(chunk))]


#: (max_partial_matches, max_buffered_events): a key past a cap has its next event refused
CAPS = [(None, None), (2, None), (None, 3), (3, 4)]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(PATTERNS)), streams(), st.sampled_from(CAPS))
def test_columns_and_events_give_the_same_records_and_state(name, data, caps):
    events, cuts = data
    s = MatchSettings(pattern=PATTERNS[name], emit_timed_out=True, max_partial_matches=caps[0],
                      max_buffered_events=caps[1])
    by_columns, by_event = MatchOperator(s), MatchOperator(s)
    bounds = [0, *cuts, len(events)]
    for lo, hi in zip(bounds, bounds[1:]):
        chunk = events[lo:hi]
        if not chunk:
            continue
        assert _by_columns(by_columns, chunk) == _per_event(by_event, chunk)
        cti = events[hi].start if hi < len(events) else chunk[-1].start + 1  # never past a later event
        assert [o.record for o in by_columns.advance_to(cti)] == [o.record for o in by_event.advance_to(cti)]
        assert _state(by_columns) == _state(by_event)
        if hi < len(events) and lo % 2:  # sometimes across a restore
            by_columns = MatchOperator.restore(s, by_columns.snapshot())
    assert [o.record for o in by_columns.advance_to(CTI_INFINITY)] == [o.record for o in by_event.advance_to(CTI_INFINITY)]


@pytest.mark.parametrize("name", ["strict", "relaxed one or more", "looping start, until", "not next"])
def test_expression_patterns_have_a_start_filter_that_skips_rows(name, monkeypatch):
    op = MatchOperator(MatchSettings(pattern=PATTERNS[name]))
    assert op._start_filter is not None
    events = [Event(f"k{i % 3}", 1000 + i, 1000 + i, {"kind": "d", "amount": 5.0, "note": None}, 0, i, "s")
              for i in range(50)]
    built = []
    real = EventColumns.events
    monkeypatch.setattr(EventColumns, "events", lambda self: built.append(len(self)) or real(self))
    assert op.process_columns(EventColumns.from_events(events)) == []
    assert built == []  # no row became an Event: none can start the pattern


def test_rows_that_change_an_idle_key_are_kept():
    """An optional first stage: from the start, the second stage's IGNORE edge fires on any
    other event and changes the start's version — such rows are never skipped."""
    import numpy as np

    op = MatchOperator(MatchSettings(pattern=PATTERNS["optional start"]))
    cols = {"kind": np.array(["d", "a"], object), "amount": np.array([5.0, 5.0]), "note": np.array([None, None], object)}
    assert op._start_filter(cols, 2).tolist() == [False, False]


def test_patterns_without_a_column_form_process_every_row():
    assert MatchOperator(MatchSettings(pattern={"name": "t", "stages": [{"name": "a"}]}))._start_filter is None
    assert MatchOperator(MatchSettings(pattern={"name": "p", "stages": [
        {"name": "a", "where": "lower(kind) == 'a'"}]}))._start_filter is None  # a function: per event


def _relaxed_pair(**caps) -> MatchSettings:
    return MatchSettings(pattern=PATTERNS["relaxed pair"], **caps)


def _restored_with_a_run(s: MatchSettings, key: str = "k0", at: int = 1000) -> MatchOperator:
    """An operator whose ``key`` has a run waiting for its second stage, packed (as restored)
    after a CTI past its event (the buffer's counter of events at ``at`` is gone: its due CTI
    is the run's window)."""
    op = MatchOperator(s)
    op.process(Event(key, at, at, {"kind": "a", "amount": 1.0, "note": None}, 0, 0, "s"))
    op.advance_to(at + 1)
    return MatchOperator.restore(s, op.snapshot())


def _others(t0: int, n: int, key: str = "k0") -> list[Event]:
    return [Event(key, t, t, {"kind": "d", "amount": 5.0, "note": None}, 0, t, "s") for t in range(t0, t0 + n)]


def test_rows_no_run_of_a_packed_key_can_move_on_are_skipped_until_its_window_closes(monkeypatch):
    s = _relaxed_pair()
    assert MatchOperator(s)._inert_filter is not None
    op = _restored_with_a_run(s)
    events = _others(1001, 50)  # the run's window (within 40 ms) closes at 1040
    took = op.rows_to_take(EventColumns.from_events(events))
    assert list(took) == list(range(39, 50))  # from the row at 1040 on: the timeout, then the key as it is
    by_event = _restored_with_a_run(s)
    assert _by_columns(op, events) == _per_event(by_event, events)
    assert _state(op) == _state(by_event)


def test_a_run_that_can_move_takes_the_row_and_every_later_one_of_its_key():
    op = _restored_with_a_run(_relaxed_pair())
    events = _others(1001, 10)
    events[4] = Event("k0", 1005, 1005, {"kind": "b", "amount": 5.0, "note": None}, 0, 1005, "s")  # completes the run
    assert list(op.rows_to_take(EventColumns.from_events(events))) == list(range(4, 10))


@pytest.mark.parametrize("caps", [{"max_partial_matches": 1}, {"max_buffered_events": 0}])
def test_a_packed_key_past_a_cap_takes_every_row_so_each_is_refused(caps):
    s = _relaxed_pair(**caps)
    op = _restored_with_a_run(s)
    events = _others(1001, 3)
    assert list(op.rows_to_take(EventColumns.from_events(events))) == [0, 1, 2]
    got = _by_columns(op, events)
    assert [i for i, r in got if isinstance(r, str)] == [0, 1, 2]
    assert got == _per_event(_restored_with_a_run(s), events)


def test_a_later_operand_that_reads_the_match_leaves_the_leading_ones_to_tell_an_event_inert():
    assert MatchOperator(MatchSettings(pattern=PATTERNS["plain, then first()"]))._inert_filter is not None
    assert MatchOperator(MatchSettings(pattern=PATTERNS["first(), then plain"]))._inert_filter is None


def test_a_pattern_whose_runs_wait_strictly_has_no_inert_filter():
    assert MatchOperator(MatchSettings(pattern=PATTERNS["strict"]))._inert_filter is None
    # a looping stage's run moves to its waiting copy on any other event: not inert either
    assert MatchOperator(MatchSettings(pattern=PATTERNS["relaxed one or more"]))._inert_filter is None


def test_a_snapshot_restored_under_other_caps_or_from_format_4_has_every_key_due_at_once():
    """A key's due CTI says "at once" when it is past a cap (its events are then all taken and
    refused) — of the caps it was packed under. Restored under other caps, or from format 4 (no
    caps known), every key is due at once: the first events of a key now past a cap are refused
    as one event at a time refuses them, not skipped. Format 5 (the keys a list of strings) keeps
    its caps, so its dues, through ``compat``."""
    import pickle

    from ctiflow.jobs.state import compat
    from ctiflow.jobs.testing.snapshots import keys_as_list, match_state
    from ctiflow.operators.events import CTI_NONE

    packed_without = _restored_with_a_run(_relaxed_pair()).snapshot()
    capped = _relaxed_pair(max_partial_matches=1)
    version, fingerprint, plain, numbers, caps = pickle.loads(packed_without)
    assert version == 6
    format_4 = pickle.dumps((4, fingerprint, keys_as_list(plain), numbers))
    format_5 = pickle.dumps((5, fingerprint, keys_as_list(plain), numbers, caps))
    five = compat.restored(lambda d: MatchOperator.restore(_relaxed_pair(), d), format_5)
    assert five._raw.dues.tolist() == [1040] and match_state(five.snapshot()) == match_state(packed_without)
    for data in (packed_without, format_4):
        op = compat.restored(lambda d: MatchOperator.restore(capped, d), data)
        assert op._raw.dues.tolist() == [CTI_NONE]
        events = _others(1001, 3)
        got = _by_columns(op, events)
        assert [i for i, r in got if isinstance(r, str)] == [0, 1, 2]
    same = MatchOperator.restore(_relaxed_pair(), packed_without)  # the caps it was packed under
    assert same._raw.dues.tolist() == [1040]
