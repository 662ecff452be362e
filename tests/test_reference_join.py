"""ReferenceJoin: the temporal as-of join (SPEC §4.4) against a brute-force oracle."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.operators.errors import ConfigError
from ctiflow.operators.operator import Operator, Output
from ctiflow.operators.reference import MissingReference, ReferenceJoin, ReferenceJoinSettings, enriched_event
from ctiflow.jobs.testing.time_layer import run_reference_sync
from ctiflow.operators.time import CTI_INFINITY, AdvanceTimeSettings, Event, Frequency

INF = CTI_INFINITY


def fast(key, t, offset=0, end=None, **fields):
    return Event(key, t, t if end is None else end, fields, offset=offset, stream="events")


def version(key, t, offset=0, **fields):
    return Event(key, t, INF, fields, offset=offset, stream="reference")


def drive(join, events, cti=INF):
    out = []
    for e in events:
        out += join.process(e)
    return out + join.advance_to(cti)


def refs(outputs):
    return [(o.record["time"], o.record["reference_valid_from"], o.record["reference_missing"])
            for o in outputs]


def test_reference_join_is_a_state_machine_between_the_time_layer_and_the_operators():
    # Not an Operator (it takes reference versions, edges, one event at a time), but the same
    # lifecycle: process / advance_to / snapshot / restore.
    join = ReferenceJoin(ReferenceJoinSettings())
    assert not isinstance(join, Operator)
    assert ReferenceJoin.restore(join.settings, join.snapshot()).live_keys() == set()
    assert ReferenceJoin.traits(None).handles_adjust is False


def test_fast_event_gets_the_latest_version_at_or_before_its_time():
    join = ReferenceJoin(ReferenceJoinSettings())
    out = drive(join, [version("a", 0, limit=1), version("a", 10, limit=2), fast("a", 15, amount=7)])
    assert out == [Output("enriched", {
        "key": "a", "time": 15, "end": 15, "partition": 0, "offset": 0, "event": {"amount": 7},
        "reference": {"limit": 2}, "reference_valid_from": 10, "reference_missing": False,
    })]


def test_version_with_the_same_start_applies_whatever_the_arrival_order_at_that_time():
    for order in ([version("a", 0), version("a", 5), fast("a", 5)],
                  [version("a", 0), fast("a", 5), version("a", 5)]):
        assert refs(drive(ReferenceJoin(ReferenceJoinSettings()), order)) == [(5, 5, False)]


def test_fast_event_at_a_time_waits_until_the_join_moves_past_it():
    join = ReferenceJoin(ReferenceJoinSettings())
    join.process(version("a", 0))
    assert join.process(fast("a", 5)) == []
    assert join.advance_to(5) == []  # a version at 5 may still come
    assert refs(join.advance_to(6)) == [(5, 0, False)]


def test_missing_reference_is_emitted_with_nulls_and_a_flag():
    [out] = drive(ReferenceJoin(ReferenceJoinSettings()), [fast("a", 3), version("a", 4)])
    assert (out.record["reference"], out.record["reference_valid_from"],
            out.record["reference_missing"]) == (None, None, True)


def test_versions_of_other_keys_do_not_apply():
    assert refs(drive(ReferenceJoin(ReferenceJoinSettings()), [version("b", 0), fast("a", 1)])) == [
        (1, None, True)
    ]


def test_hold_waits_for_the_first_version_of_the_key():
    join = ReferenceJoin(ReferenceJoinSettings(missing="hold"))
    assert drive(join, [fast("a", 3), fast("b", 4)], cti=100) == []
    assert join.output_cti == 3
    assert refs(join.process(version("a", 120))) == [(3, 120, False)]
    assert refs(join.advance_to(INF)) == [(4, None, True)]  # flushed with the missing flag


def test_hold_for_bounds_the_wait_in_application_time():
    join = ReferenceJoin(ReferenceJoinSettings(missing="hold", hold_for=10))
    join.process(fast("a", 3))
    assert join.advance_to(13) == []  # a version at 13 would still be in time
    assert refs(join.advance_to(14)) == [(3, None, True)]


def test_hold_for_expires_before_a_version_beyond_the_window_applies():
    join = ReferenceJoin(ReferenceJoinSettings(missing="hold", hold_for=10))
    out = drive(join, [fast("a", 3), fast("a", 8), version("a", 15)])
    assert refs(out) == [(3, None, True), (8, 15, False)]


def test_end_edge_closes_the_version():
    out = drive(ReferenceJoin(ReferenceJoinSettings()), [
        version("a", 0), fast("a", 4),
        Event("a", 0, 5, stream="reference", edge_end=True), fast("a", 5), fast("a", 6),
    ])
    assert refs(out) == [(4, 0, False), (5, None, True), (6, None, True)]


def test_stale_end_edge_does_not_close_a_newer_version():
    out = drive(ReferenceJoin(ReferenceJoinSettings()), [
        version("a", 0), version("a", 3), Event("a", 0, 5, stream="reference", edge_end=True),
        fast("a", 6),
    ])
    assert refs(out) == [(6, 3, False)]


def test_out_of_order_input_is_rejected():
    join = ReferenceJoin(ReferenceJoinSettings())
    join.process(fast("a", 5))
    with pytest.raises(ValueError, match="application-time order"):
        join.process(fast("a", 4))


def test_event_of_another_stream_is_rejected():
    with pytest.raises(ValueError, match="stream 'other'"):
        ReferenceJoin(ReferenceJoinSettings()).process(Event("a", 1, 1, stream="other"))


def test_enriched_event_feeds_another_operator():
    [out] = drive(ReferenceJoin(ReferenceJoinSettings()),
                  [version("a", 0, threshold=10), fast("a", 5, offset=7, end=9, amount=12)])
    e = enriched_event(out)
    assert (e.key, e.start, e.end, e.offset, e.stream) == ("a", 5, 9, 7, "enriched")
    assert e.fields == {"amount": 12, "reference": {"threshold": 10}, "reference_valid_from": 0,
                        "reference_missing": False}
    assert e.fields["amount"] > e.fields["reference"]["threshold"]


def test_keeps_one_version_per_key():
    join = ReferenceJoin(ReferenceJoinSettings())
    drive(join, [version("a", t, v=t) for t in range(50)] + [version("b", 70)], cti=100)
    assert join.versions() == {"a": (49, {"v": 49}), "b": (70, {})}


@pytest.mark.parametrize("kwargs, match", [
    ({"missing": "wait"}, 'Invalid "missing" value: .*Valid choices are: emit, hold'),
    ({"sync": "max"}, 'Invalid "sync" value: .*Valid choices are: import, min'),
    ({"hold_for": 5}, 'only meaningful with missing: "hold"'),
    ({"missing": "hold", "hold_for": -1}, "hold_for must be"),
    ({"fast_stream": "x", "reference_stream": "x"}, "both 'x'"),
    ({"output_stream": ""}, "output_stream"),
])
def test_settings_are_validated(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ReferenceJoinSettings(**kwargs)


def test_settings_accept_enum_values_as_strings():
    s = ReferenceJoinSettings(missing="hold", hold_for=0, sync="min")
    assert s.missing is MissingReference.HOLD


# --------------------------------------------------------------- oracle and properties


@st.composite
def join_inputs(draw):
    n = draw(st.integers(0, 30))
    out = []
    for i in range(n):
        key, t = draw(st.sampled_from("ab")), draw(st.integers(0, 40))
        if draw(st.booleans()):
            out.append(Event(key, t, INF, {"v": i}, partition=draw(st.integers(0, 1)), offset=i,
                             stream="reference"))
        else:
            out.append(Event(key, t, t + draw(st.integers(0, 3)), {"f": i},
                             partition=draw(st.integers(0, 1)), offset=i, stream="events"))
    return out


def order(e):
    return (e.start, e.partition, e.offset)


def oracle(events, missing="emit", hold_for=None):
    versions = [e for e in events if e.stream == "reference"]
    out = []
    for e in sorted((e for e in events if e.stream == "events"), key=order):
        before = [v for v in versions if v.key == e.key and v.start <= e.start]
        v = max(before, key=order) if before else None
        if v is None and missing == "hold":
            later = [w for w in versions if w.key == e.key and w.start > e.start
                     and (hold_for is None or w.start <= e.start + hold_for)]
            v = min(later, key=order) if later else None
        out.append({"key": e.key, "time": e.start, "end": e.end, "partition": e.partition,
                    "offset": e.offset, "event": e.fields,
                    "reference": None if v is None else v.fields,
                    "reference_valid_from": None if v is None else v.start,
                    "reference_missing": v is None})
    return out


def arrivals_within(data, events, delay):
    jitter = [data.draw(st.integers(0, delay)) for _ in events]
    tiebreak = data.draw(st.permutations(range(len(events))))
    return [e for _, _, e in sorted(zip([e.start + j for e, j in zip(events, jitter)], tiebreak, events))]


@settings(max_examples=120, deadline=None)
@given(data=st.data(), events=join_inputs(), delay=st.integers(0, 6), sync=st.sampled_from(["import", "min"]))
def test_emit_matches_the_brute_force_as_of_join(data, events, delay, sync):
    # within the delay of both streams (min) / a common delay on time-ordered input (import)
    arrivals = arrivals_within(data, events, delay if sync == "min" else 0)
    cuts = data.draw(st.one_of(st.none(), st.sets(st.integers(1, 30)).map(sorted)))
    time = AdvanceTimeSettings(delay=delay, frequency=Frequency(events=data.draw(st.integers(1, 3))))
    run = run_reference_sync(ReferenceJoinSettings(sync=sync), time, time, arrivals, cuts)
    assert run.late == []
    assert [o.record for o in run.outputs] == oracle(events)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), events=join_inputs(), hold_for=st.one_of(st.none(), st.integers(0, 15)))
def test_hold_matches_the_brute_force_oracle(data, events, hold_for):
    arrivals = arrivals_within(data, events, 3)
    time = AdvanceTimeSettings(delay=3)
    s = ReferenceJoinSettings(missing="hold", hold_for=hold_for, sync="min")
    run = run_reference_sync(s, time, time, arrivals)
    by_offset = sorted((o.record for o in run.outputs), key=lambda r: r["offset"])
    assert by_offset == sorted(oracle(events, "hold", hold_for), key=lambda r: r["offset"])
    for step in run.steps:  # emitted records are final: the CTI has passed them
        assert all(o.record["time"] < step.cti for o in step.outputs)


@settings(max_examples=100, deadline=None)
@given(events=join_inputs(), split=st.integers(0, 30), missing=st.sampled_from(["emit", "hold"]))
def test_snapshot_restore_mid_stream_changes_nothing(events, split, missing):
    s = ReferenceJoinSettings(missing=missing, hold_for=5 if missing == "hold" else None)
    ordered = sorted(events, key=lambda e: (e.start, e.stream != "reference", e.partition, e.offset))
    whole = drive(ReferenceJoin(s), ordered)
    first = ReferenceJoin(s)
    head = [o for e in ordered[:split] for o in first.process(e)]
    rest = drive(ReferenceJoin.restore(s, first.snapshot()), ordered[split:])
    assert head + rest == whole
