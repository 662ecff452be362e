"""The match operator under the Operator contract: keys, CTIs, flushing, snapshots, records."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import fastavro
import pytest

from ctiflow.operators.cep import MatchOperator, MatchSettings, Pattern
from ctiflow.operators.errors import PatternError
from ctiflow.operators.operator import Operator, Output
from ctiflow.operators.time import CTI_INFINITY, Event

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def kind_is(kind: str):
    return lambda e: e["kind"] == kind


def login_burst_pattern() -> Pattern:
    """login, then two failed payments (relaxed), then no logout within 100 ms."""
    return (
        Pattern.begin("login").where(kind_is("login"))
        .followed_by("fail").where(kind_is("fail")).times(2)
        .not_followed_by("logout").where(kind_is("logout"))
        .within(100)
    )


def settings(**kw) -> MatchSettings:
    return MatchSettings(pattern=kw.pop("pattern", login_burst_pattern()), name="burst", **kw)


def random_events(seed: int, n: int = 300, keys: int = 4) -> list[Event]:
    rng = random.Random(seed)
    kinds = ["login", "fail", "fail", "pay", "logout"]
    events, t = [], 0
    for offset in range(n):
        t += rng.choice([0, 1, 3, 10, 40])
        key = f"k{rng.randrange(keys)}"
        events.append(Event(key=key, start=t, end=t,
                            fields={"kind": rng.choice(kinds), "n": offset}, offset=offset))
    return events


def run(op: MatchOperator, events: list[Event], cti_every: int | None = None) -> list[Output]:
    out: list[Output] = []
    for i, event in enumerate(events):
        out += op.process(event)
        if cti_every and i % cti_every == cti_every - 1:
            out += op.advance_to(event.start)
    out += op.advance_to(CTI_INFINITY)
    return out


def canon(outputs: list[Output]) -> Counter:
    return Counter(json.dumps([o.role, o.record], sort_keys=True) for o in outputs)


def test_implements_the_operator_protocol() -> None:
    op = MatchOperator(settings())
    assert isinstance(op, Operator)
    assert op.traits(op.settings).handles_adjust is False


def test_match_and_timed_out_records_follow_the_avro_schemas() -> None:
    op = MatchOperator(settings())
    events = [
        Event("u1", 1, 1, {"kind": "login"}),
        Event("u1", 2, 2, {"kind": "fail"}),
        Event("u1", 3, 3, {"kind": "fail"}),
        Event("u2", 4, 4, {"kind": "login"}),
        Event("u2", 5, 5, {"kind": "fail"}),
    ]
    out = run(op, events)
    roles = Counter(o.role for o in out)
    assert roles["match"] >= 1 and roles["timed_out"] >= 1
    match_schema = fastavro.parse_schema(json.loads((SCHEMAS / "match.avsc").read_text()))
    timeout_schema = fastavro.parse_schema(
        json.loads((SCHEMAS / "timed_out_match.avsc").read_text())
    )
    for o in out:
        schema = match_schema if o.role == "match" else timeout_schema
        assert fastavro.validation.validate(o.record, schema, raise_errors=True)
    match = next(o.record for o in out if o.role == "match")
    assert match["pattern"] == "burst" and match["key"] == "u1"
    assert (match["first_time"], match["last_time"]) == (1, 3)
    assert [s["stage"] for s in match["stages"]] == ["login", "fail"]
    assert [json.loads(e) for e in match["stages"][1]["events"]] == [{"kind": "fail"}] * 2


def test_not_followed_by_at_the_end_completes_when_the_cti_passes_the_window() -> None:
    op = MatchOperator(settings())
    out = []
    for t, kind in [(0, "login"), (1, "fail"), (2, "fail")]:
        out += op.process(Event("u", t, t, {"kind": kind}))
    assert [o for o in out if o.role == "match"] == []
    assert [o.role for o in op.advance_to(50)] == []
    done = op.advance_to(100)
    assert "match" in [o.role for o in done]


def test_a_forbidden_event_cancels_the_pending_match() -> None:
    op = MatchOperator(settings())
    out = []
    for t, kind in [(0, "login"), (1, "fail"), (2, "fail"), (3, "fail"), (4, "logout")]:
        out += op.process(Event("u", t, t, {"kind": kind}))
    out += op.advance_to(CTI_INFINITY)
    assert [o for o in out if o.role == "match"] == []


def test_keys_are_matched_independently() -> None:
    pattern = Pattern.begin("a").where(kind_is("a")).next("b").where(kind_is("b"))
    op = MatchOperator(settings(pattern=pattern))
    out = []
    out += op.process(Event("x", 1, 1, {"kind": "a"}))
    out += op.process(Event("y", 2, 2, {"kind": "b"}))  # other key: does not break x's 'next'
    out += op.process(Event("x", 3, 3, {"kind": "b"}))
    assert [(o.role, o.record["key"]) for o in out] == [("match", "x")]


def test_key_field_overrides_the_event_key() -> None:
    pattern = Pattern.begin("a").where(kind_is("a")).next("b").where(kind_is("b"))
    op = MatchOperator(settings(pattern=pattern, key_field="user"))
    out = []
    out += op.process(Event("ignored", 1, 1, {"kind": "a", "user": 7}))
    out += op.process(Event("ignored", 2, 2, {"kind": "b", "user": 7}))
    assert [o.record["key"] for o in out] == ["7"]


def test_idle_keys_are_pruned_from_the_state() -> None:
    op = MatchOperator(settings())
    for t in range(50):
        op.process(Event(f"k{t}", t, t, {"kind": "pay"}))
    op.advance_to(60)
    assert op.keys_in_flight == 0
    op.process(Event("u", 70, 70, {"kind": "login"}))
    op.advance_to(71)
    assert op.keys_in_flight == 1
    op.advance_to(CTI_INFINITY)
    assert op.keys_in_flight == 0


@pytest.mark.parametrize("seed", range(4))
def test_snapshot_restore_mid_stream_gives_the_same_results(seed: int) -> None:
    events = random_events(seed)
    whole = run(MatchOperator(settings()), events, cti_every=7)

    first = MatchOperator(settings())
    out: list[Output] = []
    half = len(events) // 2
    for i, event in enumerate(events[:half]):
        out += first.process(event)
        if i % 7 == 6:
            out += first.advance_to(event.start)
    restored = MatchOperator.restore(settings(), first.snapshot())
    for i, event in enumerate(events[half:], start=half):
        out += restored.process(event)
        if i % 7 == 6:
            out += restored.advance_to(event.start)
    out += restored.advance_to(CTI_INFINITY)
    assert out == whole
    assert any(o.role == "match" for o in whole) and any(o.role == "timed_out" for o in whole)


@pytest.mark.parametrize("seed", range(3))
def test_results_do_not_depend_on_cti_cadence(seed: int) -> None:
    events = random_events(seed)
    baseline = canon(run(MatchOperator(settings()), events))
    for cadence in (1, 5, 50):
        assert canon(run(MatchOperator(settings()), events, cti_every=cadence)) == baseline


@pytest.mark.parametrize("seed", range(3))
def test_results_do_not_depend_on_how_keys_interleave(seed: int) -> None:
    """Only each key's own application-time order matters: regrouping the stream by key
    (keeping every key's order) gives the same records."""
    events = random_events(seed)
    baseline = canon(run(MatchOperator(settings()), events))
    by_key = sorted(events, key=lambda e: (e.key, e.start, e.offset))
    assert canon(run(MatchOperator(settings()), by_key)) == baseline


def test_match_ids_are_unique_and_stable() -> None:
    events = random_events(7)
    first = run(MatchOperator(settings()), events, cti_every=3)
    second = run(MatchOperator(settings()), events, cti_every=11)
    ids = [o.record["match_id"] for o in first if o.role == "match"]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(o.record["match_id"] for o in second if o.role == "match")


def test_declarative_settings() -> None:
    spec = {
        "name": "ab",
        "stages": [
            {"name": "a", "where": "kind == 'a'"},
            {"name": "b", "contiguity": "next", "where": "kind == 'b'"},
        ],
    }
    op = MatchOperator(MatchSettings(pattern=spec))
    op.process(Event("u", 1, 1, {"kind": "a"}))
    (out,) = op.process(Event("u", 2, 2, {"kind": "b"}))
    assert out.record["pattern"] == "ab"


def test_patterns_that_match_nothing_are_refused() -> None:
    with pytest.raises(PatternError, match="without any event"):
        MatchOperator(settings(pattern=Pattern.begin("a").optional()))


def test_a_snapshot_of_another_pattern_is_refused() -> None:
    op = MatchOperator(settings())
    op.process(Event("u", 1, 1, {"kind": "login"}))
    other = Pattern.begin("x").where(kind_is("a")).next("y").where(kind_is("b"))
    with pytest.raises(PatternError, match="different pattern"):
        MatchOperator.restore(settings(pattern=other), op.snapshot())


def test_settings_validate_the_whole_pattern_before_a_job_starts() -> None:
    bad = {"stages": [{"name": "a"}, {"name": "a"}]}
    with pytest.raises(PatternError, match="duplicate stage name"):
        MatchSettings(pattern=bad).pattern_object()
