"""TimeLayer, merge_ctis and CTI import: determinism, conservation and the brute-force oracle."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.operators.errors import ConfigError
from ctiflow.operators.time import (CTI_INFINITY, CTI_NONE, REASON_ADJUSTED, AdvanceTimeSettings, Cti, Event,
                            Frequency, ViolationPolicy, effective_ctis, imported_cti, merge_ctis)
from ctiflow.jobs.testing.time_layer import TimeLayer

# ------------------------------------------------------------------------------- strategies


@st.composite
def events(draw, streams=("events",), max_size=25):
    n = draw(st.integers(0, max_size))
    out = []
    for i in range(n):
        start = draw(st.integers(0, 60))
        kind = draw(st.sampled_from(["point", "interval", "edge", "end_edge"]))
        end = {
            "point": start,
            "interval": start + draw(st.integers(0, 15)),
            "edge": CTI_INFINITY,
            "end_edge": start + draw(st.integers(0, 15)),
        }[kind]
        out.append(Event(
            key=draw(st.sampled_from("abc")), start=start, end=end, fields={"i": i},
            partition=draw(st.integers(0, 2)), offset=i, stream=draw(st.sampled_from(streams)),
            edge_end=kind == "end_edge",
        ))
    return out


frequencies = st.one_of(
    st.builds(Frequency, events=st.integers(1, 5)),
    st.builds(Frequency, duration=st.integers(1, 20)),
    st.builds(Frequency, events=st.integers(1, 5), duration=st.integers(1, 20)),
)
policies = st.sampled_from(list(ViolationPolicy))


@st.composite
def within_delay(draw, evs, delay):
    """An arrival order in which every event arrives at most ``delay`` behind the latest one:
    sort by sync time + a jitter in [0, delay], ties in random order."""
    jitter = [draw(st.integers(0, delay)) for _ in evs]
    tiebreak = draw(st.permutations(range(len(evs))))
    return [e for _, _, e in sorted(zip([e.sync_time + j for e, j in zip(evs, jitter)], tiebreak, evs))]


@st.composite
def cuts_for(draw, n):
    return draw(st.one_of(st.none(), st.sets(st.integers(1, max(1, n - 1))).map(sorted)))


def in_order(evs, streams=("events",)):
    rank = {s: i for i, s in enumerate(streams)}
    return sorted(evs, key=lambda e: (e.sync_time, rank[e.stream], e.partition, e.offset))


# ---------------------------------------------------------------------- combining CTIs


def test_join_or_union_releases_at_the_older_cti():
    assert merge_ctis({"fast": 100, "slow": 40}) == 40


def test_merge_of_no_inputs_has_no_cti():
    assert merge_ctis({}) == CTI_NONE


def test_importing_stream_takes_the_named_streams_cti_transitively():
    s = {"a": AdvanceTimeSettings(), "b": AdvanceTimeSettings(import_from="a"),
         "c": AdvanceTimeSettings(frequency=None, import_from="b")}
    assert imported_cti("c", s, {"a": 10, "c": 3}) == 10
    assert effective_ctis(s, {"a": 10, "b": 20}) == {"a": 10, "b": 20, "c": 20}


def test_import_cycle_is_a_config_error():
    s = {"a": AdvanceTimeSettings(import_from="b"), "b": AdvanceTimeSettings(import_from="a")}
    with pytest.raises(ConfigError, match="cycle: a -> b -> a"):
        TimeLayer(s)


def test_import_from_unknown_stream_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown stream 'nope'"):
        TimeLayer({"a": AdvanceTimeSettings(import_from="nope")})


def test_event_of_unknown_stream_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown stream 'x'"):
        TimeLayer({"a": AdvanceTimeSettings()}).offer(Event("k", 1, 1, stream="x"))


def test_union_stalls_at_the_older_cti_until_the_slow_stream_advances():
    layer = TimeLayer({"fast": AdvanceTimeSettings(delay=-1), "slow": AdvanceTimeSettings(delay=-1)})
    run = layer.run([Event("k", 1, 1, stream="slow")] +
                    [Event("k", t, t, stream="fast", offset=t) for t in range(2, 6)] +
                    [Event("k", 9, 9, stream="slow")], flush=False)
    assert [(s.cti, [e.start for e in s.released]) for s in run.steps] == [
        (2, [1]), (6, [2, 3, 4, 5])  # fast CTIs 3..6 wait for the slow CTIs 2, then 10
    ]


def test_stream_that_imports_drops_its_own_events_behind_the_imported_cti():
    layer = TimeLayer({"fast": AdvanceTimeSettings(delay=0),
                       "ref": AdvanceTimeSettings(frequency=None, import_from="fast")})
    run = layer.run([Event("k", 50, 50, stream="fast"), Event("k", 40, CTI_INFINITY, stream="ref")])
    assert [(r.record["stream"], r.record["cti"]) for r in run.late] == [("ref", 50)]


def test_stream_that_imports_adjusts_an_edge_to_take_effect_from_the_imported_cti():
    layer = TimeLayer({"fast": AdvanceTimeSettings(delay=0),
                       "ref": AdvanceTimeSettings(frequency=None, import_from="fast",
                                                  policy=ViolationPolicy.ADJUST)})
    run = layer.run([Event("k", 50, 50, stream="fast"), Event("k", 40, CTI_INFINITY, stream="ref")])
    assert [r.record["reason"] for r in run.late] == [REASON_ADJUSTED]
    ref = [e for e in run.released if e.stream == "ref"]
    assert [(e.start, e.original_start) for e in ref] == [(50, 40)]


def test_explicit_ctis_drive_a_stream_without_generation():
    layer = TimeLayer({"events": AdvanceTimeSettings(frequency=None, flush_at_end=False)})
    run = layer.run([Event("k", 5, 5), Event("k", 7, 7), Cti(6), Event("k", 4, 4)])
    assert [(s.cti, [e.start for e in s.released]) for s in run.steps] == [(6, [5])]
    assert [r.record["start"] for r in run.late] == [4]


def test_micro_batch_cuts_defer_ctis_to_the_end_of_the_batch():
    s = {"events": AdvanceTimeSettings(delay=0)}
    arrivals = [Event("k", 10, 10, offset=0), Event("k", 5, 5, offset=1)]
    assert len(TimeLayer(s).run(arrivals).late) == 1  # StreamInsight: CTI 10 at once
    assert TimeLayer(s).run(arrivals, cuts=[]).late == []  # Spark: one batch, one watermark


# ------------------------------------------------------------------------ properties


@settings(max_examples=120, deadline=None)
@given(data=st.data(), evs=events(), delay=st.integers(0, 10), freq=frequencies, policy=policies)
def test_within_delay_release_is_independent_of_arrival_order_and_batching(data, evs, delay, freq,
                                                                           policy):
    arrivals = data.draw(within_delay(evs, delay))
    cuts = data.draw(cuts_for(len(arrivals)))
    run = TimeLayer({"events": AdvanceTimeSettings(delay, freq, True, policy)}).run(arrivals, cuts)
    assert run.late == []
    assert run.released == in_order(evs)
    assert run.ctis == sorted(run.ctis) and run.ctis[-1:] == [CTI_INFINITY]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), evs=events(streams=("s1", "s2")), d1=st.integers(0, 8), d2=st.integers(0, 8),
       f1=frequencies, f2=frequencies)
def test_within_delay_union_of_two_streams_is_released_in_one_order(data, evs, d1, d2, f1, f2):
    s1 = [e for e in evs if e.stream == "s1"]
    s2 = [e for e in evs if e.stream == "s2"]
    a1, a2 = data.draw(within_delay(s1, d1)), data.draw(within_delay(s2, d2))
    interleave = data.draw(st.lists(st.booleans(), min_size=len(evs), max_size=len(evs)))
    arrivals = []
    for first in interleave:
        src = a1 if (first and a1) or not a2 else a2
        arrivals.append(src.pop(0))
    layer = TimeLayer({"s1": AdvanceTimeSettings(d1, f1), "s2": AdvanceTimeSettings(d2, f2)})
    run = layer.run(arrivals, data.draw(cuts_for(len(arrivals))))
    assert run.late == []
    assert run.released == in_order(evs, ("s1", "s2"))


@settings(max_examples=120, deadline=None)
@given(data=st.data(), evs=events(), delay=st.integers(-2, 6), freq=frequencies, policy=policies,
       batched=st.booleans())
def test_nothing_is_lost_and_release_is_ordered_for_any_arrival(data, evs, delay, freq, policy,
                                                                batched):
    arrivals = data.draw(st.permutations(evs))
    cuts = data.draw(cuts_for(len(arrivals))) if batched else None
    run = TimeLayer({"events": AdvanceTimeSettings(delay, freq, True, policy)}).run(arrivals, cuts)
    assert run.ctis == sorted(run.ctis)
    assert run.released == in_order(run.released)
    previous = CTI_NONE
    for step in run.steps:
        assert all(previous <= e.sync_time < step.cti for e in step.released)
        previous = step.cti
    by_offset = {e.offset: e for e in evs}
    adjusted = [e for e in run.released if e.original_start is not None]
    for e in adjusted:
        original = by_offset[e.offset]
        assert e.original_start == original.start < e.start < original.end
    late_adjust = Counter(r.record["offset"] for r in run.late if r.record["reason"] == REASON_ADJUSTED)
    late_lost = Counter(r.record["offset"] for r in run.late if r.record["reason"] != REASON_ADJUSTED)
    assert late_adjust == Counter(e.offset for e in adjusted)
    assert Counter(e.offset for e in run.released) + late_lost == Counter(list(by_offset))


@settings(max_examples=120, deadline=None)
@given(data=st.data(), evs=events(), delay=st.integers(-2, 6))
def test_drop_with_a_cti_per_event_matches_the_brute_force_oracle(data, evs, delay):
    arrivals = data.draw(st.permutations(evs))
    run = TimeLayer({"events": AdvanceTimeSettings(delay=delay)}).run(arrivals)
    late, latest = [], None
    for e in arrivals:  # oracle: late iff behind (latest start before it) - delay
        if latest is not None and e.sync_time < latest - delay:
            late.append(e.offset)
        if not e.edge_end:
            latest = e.start if latest is None else max(latest, e.start)
    assert [r.record["offset"] for r in run.late] == late
    assert run.released == in_order([e for e in evs if e.offset not in set(late)])


@settings(max_examples=100, deadline=None)
@given(data=st.data(), evs=events(streams=("fast", "ref")), policy=policies,
       split=st.integers(0, 25))
def test_snapshot_restore_mid_run_changes_nothing(data, evs, policy, split):
    cfg = {"fast": AdvanceTimeSettings(delay=3, frequency=Frequency(events=2), policy=policy),
           "ref": AdvanceTimeSettings(frequency=Frequency(duration=5), import_from="fast",
                                      policy=policy)}
    arrivals = data.draw(st.permutations(evs))
    whole = TimeLayer(cfg).run(arrivals)
    first = TimeLayer(cfg)
    head = first.run(arrivals[:split], flush=False)
    tail = TimeLayer.restore(cfg, first.snapshot()).run(arrivals[split:])
    assert head.released + tail.released == whole.released
    assert head.late + tail.late == whole.late
