"""CtiGenerator reproduces StreamInsight's AdvanceTimeGenerationSettings (seed:
streaminsight-application-time-advance.de.txt)."""

from ctiflow.operators.time import CTI_INFINITY, AdvanceTimeSettings, Event, Frequency
from ctiflow.jobs.testing.time_layer import CtiGenerator, TimeLayer


def points(*times, stream="events"):
    return [Event("k", t, t, offset=i, stream=stream) for i, t in enumerate(times)]


def generated(settings, events):
    gen = CtiGenerator(settings)
    out = [c for e in events if (c := gen.observe(e)) is not None]
    final = gen.flush()
    return out + ([final] if final is not None else [])


def releases(settings, events):
    run = TimeLayer({"events": settings}).run(events)
    return [(s.cti, [e.start for e in s.released]) for s in run.steps]


def test_seed_example_ten_events_five_seconds_delay_flush_at_end():
    # "new AdvanceTimeGenerationSettings(10, TimeSpan.FromSeconds(5), true): a CTI after every
    # 10 events, stamped with the time of the last event minus five seconds; a CTI at infinity
    # when the query ends."
    s = AdvanceTimeSettings(delay=5000, frequency=Frequency(events=10), flush_at_end=True)
    events = points(*range(1000, 26000, 1000))  # 25 events at 1 s, 2 s, ..., 25 s
    assert generated(s, events) == [10000 - 5000, 20000 - 5000, CTI_INFINITY]


def test_seed_example_frequency_one_delay_zero_commits_each_point_only_with_the_next_cti():
    # "Frequency 1 and delay 0 produce CTIs with exactly the timestamp of each point event ...
    # the last point event is committed only with the next CTI, because its timestamp is not
    # strictly earlier than that CTI."
    s = AdvanceTimeSettings(delay=0, frequency=Frequency(events=1))
    assert releases(s, points(1, 2, 3)) == [(1, []), (2, [1]), (3, [2]), (CTI_INFINITY, [3])]


def test_seed_example_delay_minus_one_tick_commits_each_point_at_once():
    # "new AdvanceTimeGenerationSettings(1, TimeSpan.FromTicks(-1), true)"
    s = AdvanceTimeSettings(delay=-1, frequency=Frequency(events=1))
    assert releases(s, points(1, 2, 3)) == [(2, [1]), (3, [2]), (4, [3]), (CTI_INFINITY, [])]


def test_end_edges_do_not_count_towards_the_frequency():
    s = AdvanceTimeSettings(delay=0, frequency=Frequency(events=2), flush_at_end=False)
    start_a = Event("a", 10, CTI_INFINITY)
    end_a = Event("a", 10, 20, edge_end=True)
    start_b = Event("b", 30, CTI_INFINITY)
    assert generated(s, [start_a, end_a, start_b]) == [30]
    assert generated(s, [start_a, end_a]) == []


def test_end_edges_do_not_count_towards_a_duration():
    s = AdvanceTimeSettings(delay=0, frequency=Frequency(duration=10), flush_at_end=False)
    assert generated(s, [Event("a", 0, CTI_INFINITY), Event("a", 0, 50, edge_end=True)]) == []


def test_duration_frequency_generates_after_every_t_of_application_time():
    s = AdvanceTimeSettings(delay=1, frequency=Frequency(duration=5), flush_at_end=False)
    # anchor 0; due at 5 (CTI 4), anchor 5; due at 12 (CTI 11), anchor 12; 14 not yet due
    assert generated(s, points(0, 2, 5, 7, 12, 14)) == [4, 11]


def test_events_or_duration_whichever_comes_first_restarts_both():
    s = AdvanceTimeSettings(delay=0, frequency=Frequency(events=3, duration=100), flush_at_end=False)
    # 3 events -> CTI 2; then 200 is 100 past the anchor 2 -> CTI 200; then 3 more events
    assert generated(s, points(0, 1, 2, 200, 201, 202, 203)) == [2, 200, 203]


def test_ctis_never_go_backwards():
    s = AdvanceTimeSettings(delay=0, flush_at_end=False)
    assert generated(s, points(10, 5, 10, 11, 3)) == [10, 11]


def test_no_final_cti_without_flush_at_end():
    s = AdvanceTimeSettings(flush_at_end=False)
    gen = CtiGenerator(s)
    gen.observe(Event("k", 1, 1))
    assert gen.flush() is None


def test_snapshot_restore_continues_identically():
    s = AdvanceTimeSettings(delay=2, frequency=Frequency(events=3, duration=7))
    events = points(1, 4, 2, 9, 3, 15, 16, 17, 30, 31)
    gen = CtiGenerator(s)
    first = [gen.observe(e) for e in events[:5]]
    restored = CtiGenerator.restore(s, gen.snapshot())
    rest = [restored.observe(e) for e in events[5:]]
    whole = CtiGenerator(s)
    assert first + rest == [whole.observe(e) for e in events]
