"""The brute-force oracles, on small examples worked out by hand (quoted as data) and on
properties that follow from their definitions."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.testing import oracle
from ctiflow.jobs.testing.oracle import ADJUSTED, ADMITTED, LATE, OracleEvent
from ctiflow.operators.errors import ConfigError


def ev(key: str, start: int, end: int | None = None, offset: int = 0, partition: int = 0, **fields) -> OracleEvent:
    return OracleEvent(key, start, start if end is None else end, fields, partition, offset)


def arrivals(*items: tuple) -> list[OracleEvent]:
    """(key, start[, end]) per arrival; offsets count up in arrival order."""
    return [ev(it[0], it[1], it[2] if len(it) > 2 else None, offset=i) for i, it in enumerate(items)]


# ---- late set: the CTI per micro-batch (one partition: max start − delay) ---------------------

# delay 5, batches [a@10 a@30 b@25 | a@20 b@25 a@40 | b@34 a@35]
# batch 0: no watermark yet                         → all admitted; max start 30
# batch 1: CTI = 30 − 5 = 25: a@20 < 25 late, b@25 on time (at the CTI), a@40 ok; max start 40
# batch 2: CTI = 40 − 5 = 35: b@34 late, a@35 on time
WORKED = arrivals(("a", 10), ("a", 30), ("b", 25), ("a", 20), ("b", 25), ("a", 40), ("b", 34), ("a", 35))
WORKED_CUTS = [3, 6]


def test_cti_of_each_batch_is_the_max_start_of_earlier_batches_minus_delay():
    assert oracle.batch_ctis(WORKED, 5, WORKED_CUTS) == [None, 25, 35]


def test_worked_example_late_set():
    assert oracle.late_indices(WORKED, 5, WORKED_CUTS) == {3, 6}


def test_event_exactly_at_the_cti_is_on_time():
    checked = oracle.check(WORKED, 5, WORKED_CUTS)
    assert (checked[4].cti, checked[4].status) == (25, ADMITTED)
    assert (checked[7].cti, checked[7].status) == (35, ADMITTED)


def test_one_micro_batch_admits_everything():
    assert oracle.late_indices(WORKED, 5, cuts=()) == set()


def test_a_batch_is_checked_against_the_previous_batch_not_its_own():
    # a@100 and a@1 in the same batch: a@1 is not late, the watermark 100 − 5 only applies next batch
    events = arrivals(("a", 100), ("a", 1), ("a", 2))
    assert oracle.late_indices(events, 5, cuts=[2]) == {2}


def test_a_cti_at_or_below_zero_is_still_a_cti():
    # Our CTIs are not Spark's watermark (which starts at 0): 3 − 5 = −2 is a CTI.
    events = arrivals(("a", 3), ("a", -3))
    assert oracle.batch_ctis(events, 5, [1]) == [None, -2]
    assert oracle.late_indices(events, 5, [1]) == {1}


# ---- several partitions: each partition's CTI, combined by min ---------------------------------

def parted(*items: tuple) -> list[OracleEvent]:
    """(partition, start) per arrival; offsets count up per partition."""
    offsets: dict[int, int] = {}
    out = []
    for p, t in items:
        out.append(ev("k", t, None, partition=p, offset=offsets.get(p, 0)))
        offsets[p] = offsets.get(p, 0) + 1
    return out


# delay 5; partition 0 twice as fast in event time as partition 1, both in order:
# batch 0: p0@10 p0@20 p1@10   batch 1: p0@30 p0@40 p1@15   batch 2: p1@20 p1@25
# CTI in batch 1 = min(20, 10) − 5 = 5; in batch 2 = min(40, 15) − 5 = 10.
# One global max − delay would be 15 and 35: p1@15 (batch 1) and p1@20, p1@25 (batch 2) late.
PARTED = parted((0, 10), (0, 20), (1, 10), (0, 30), (0, 40), (1, 15), (1, 20), (1, 25))


def test_cti_is_the_min_over_partitions_of_their_own_cti():
    assert oracle.batch_ctis(PARTED, 5, [3, 6]) == [None, 5, 10]
    assert oracle.late_indices(PARTED, 5, [3, 6]) == set()


def test_no_cti_until_every_partition_was_read():
    events = parted((0, 10), (0, 20), (1, 12), (0, 30))
    assert oracle.batch_ctis(events, 0, [1, 2, 3]) == [None, None, None, 12]


def test_a_partition_behind_its_own_cti_is_late_even_if_others_lag():
    events = parted((0, 100), (1, 10), (0, 50), (1, 20))
    # batch 1: CTI = min(100, 10) − 0 = 10; p0@50 is not late (only its own partition's CTI is 100,
    # but the stream's CTI is the min); p1@20 fine.
    assert oracle.late_indices(events, 0, [2]) == set()
    # a later batch, once p1 has caught up: CTI = min(100, 200) = 100, p0@50 is late
    events = parted((0, 100), (1, 200), (0, 50))
    assert oracle.late_indices(events, 0, [2]) == {2}


def test_spread_batches_share_the_budget_in_proportion_to_the_records_left():
    events = parted((0, 1), (0, 2), (0, 3), (0, 4), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (1, 8))
    # budget 4 of 4 + 8 left: p0 4·4/12 = 1.33 → 1, p1 4·8/12 = 2.67 → 2, the 1 left to p0 (partition order):
    # [p0 0-1, p1 0-1]; then 2 + 6 left: p0 1, p1 3 → [p0 2, p1 2-4]; then 1 + 3 left: p0 1, p1 3
    assert oracle.spread_batches(events, 4) == [0, 0, 1, 2, 0, 0, 1, 1, 1, 2, 2, 2]
    # budget 5: p0 5·4/12 = 1.67 → 1, p1 3.33 → 3, the 1 left to p0: [p0 0-1, p1 0-2]; 2 + 5 left ≤ …:
    # p0 5·2/7 = 1.43 → 1, p1 3.57 → 3, 1 left to p0: [p0 2-3, p1 3-5]; then p1 6-7
    assert oracle.spread_batches(events, 5) == [0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 2, 2]
    # everything left fits: one batch
    assert oracle.spread_batches(events, 12) == [0] * 12


def test_watermark_never_goes_back():
    events = arrivals(("a", 50), ("a", 10), ("a", 44), ("a", 46))
    assert oracle.batch_ctis(events, 5, [1, 2, 3]) == [None, 45, 45, 45]
    assert oracle.late_indices(events, 5, [1, 2, 3]) == {1, 2}


def test_negative_delay_commits_the_latest_event():
    events = arrivals(("a", 10), ("a", 10), ("a", 11))
    assert oracle.batch_ctis(events, -1, [1, 2]) == [None, 11, 11]
    assert oracle.late_indices(events, -1, [1, 2]) == {1}


# delay 10, batches [k@100 | k(80,120) k@85 k(70,90) k(89,95) k(95,95)], CTI in batch 1 = 90:
#   (80, 120) reaches past 90       → adjusted, start 90
#   point 85 lives [85, 86)         → late
#   (70, 90) ends at the CTI        → late (max(90, 71) ≤ 90)
#   (89, 95) reaches past 90        → adjusted, start 90
#   point 95                        → admitted
ADJUST = arrivals(("k", 100), ("k", 80, 120), ("k", 85), ("k", 70, 90), ("k", 89, 95), ("k", 95))


def test_adjust_moves_starts_of_intervals_reaching_past_the_cti():
    checked = oracle.check(ADJUST, 10, [1], policy="adjust")
    assert [(c.status, c.start) for c in checked] == [
        (ADMITTED, 100), (ADJUSTED, 90), (LATE, 85), (LATE, 70), (ADJUSTED, 90), (ADMITTED, 95)]
    assert oracle.late_indices(ADJUST, 10, [1], policy="adjust") == {2, 3}
    assert oracle.late_indices(ADJUST, 10, [1], policy="drop") == {1, 2, 3, 4}


def test_admitted_events_come_in_application_time_order():
    checked = oracle.check(ADJUST, 10, [1], policy="adjust")
    assert [(c.start, c.event.offset) for c in oracle.admitted(checked)] == [(90, 1), (90, 4), (95, 5), (100, 0)]


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="Valid choices are: drop, adjust"):
        oracle.check(WORKED, 5, policy="ignore")


def test_to_events_numbers_offsets_per_partition():
    recs = [{"k": "a", "t": 1}, {"k": "b", "t": 2}, {"k": "a", "t": 3}]
    events = oracle.to_events(recs, "k", "t", partition_of=lambda key: 0 if key == "a" else 1)
    assert [(e.key, e.start, e.end, e.partition, e.offset) for e in events] == [
        ("a", 1, 1, 0, 0), ("b", 2, 2, 1, 0), ("a", 3, 3, 0, 1)]


def test_even_cuts():
    assert oracle.even_cuts(7, 3) == [3, 6]
    assert oracle.even_cuts(6, 3) == [3]


@st.composite
def stream(draw):
    starts = draw(st.lists(st.integers(1, 200), min_size=1, max_size=30))
    events = [ev("k", s, offset=i) for i, s in enumerate(starts)]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(events) - 1)))))
    return events, cuts


@given(stream(), st.integers(-5, 50), st.integers(0, 50))
@settings(max_examples=200, deadline=None)
def test_a_longer_delay_never_makes_more_events_late(data, delay, extra):
    events, cuts = data
    assert oracle.late_indices(events, delay + extra, cuts) <= oracle.late_indices(events, delay, cuts)


@given(stream(), st.integers(0, 50))
@settings(max_examples=200, deadline=None)
def test_nothing_is_late_when_the_delay_covers_the_disorder(data, delay):
    events, cuts = data
    disorder = max(max(e.start for e in events[:i + 1]) - events[i].start for i in range(len(events)))
    if disorder <= delay:
        assert oracle.late_indices(events, delay, cuts) == set()


# ---- sliding counts --------------------------------------------------------------------------

# key a, one batch; interesting = flag:    t=1 I, t=2 -, t=3 I, t=4 I, t=5 -
# last 3 events:  [I]=1  [I -]=1  [I - I]=2  [- I I]=2  [I I -]=2
# last 2 ms (start > t − 2):  {1}=1  {1,2}=1  {2,3}=1  {3,4}=2  {4,5}=1
COUNTS = [ev("a", t, offset=t, flag=f) for t, f in [(1, True), (2, False), (3, True), (4, True), (5, False)]]


def interesting(fields) -> bool:
    return fields["flag"]


def exact(events, kind, window, **kw) -> list[int]:
    return [r["exact"] for r in oracle.sliding_counts(oracle.check(events, 0), kind, window, interesting, **kw)]


def test_count_over_the_last_n_events():
    assert exact(COUNTS, "events", 3) == [1, 1, 2, 2, 2]


def test_count_over_the_last_t_ms():
    assert exact(COUNTS, "time", 2) == [1, 1, 1, 2, 1]


def test_count_records_carry_key_time_and_tie_breakers():
    recs = oracle.sliding_counts(oracle.check(COUNTS, 0), "events", 3, interesting)
    assert recs[2] == {"key": "a", "time": 3, "partition": 0, "offset": 3, "exact": 2}


def test_counts_are_per_key_unless_global():
    mixed = [ev("a", 1, offset=0, flag=True), ev("b", 2, offset=1, flag=True), ev("a", 3, offset=2, flag=True)]
    assert exact(mixed, "events", 5) == [1, 1, 2]
    glob = oracle.sliding_counts(oracle.check(mixed, 0), "events", 5, interesting, per_key=False)
    assert [(r["key"], r["exact"]) for r in glob] == [("*", 1), ("*", 2), ("*", 3)]


def test_no_predicate_counts_every_event_and_value_field_sums():
    events = [ev("a", t, offset=t, n=t * 10) for t in (1, 2, 3)]
    checked = oracle.check(events, 0)
    assert [r["exact"] for r in oracle.sliding_counts(checked, "events", 2)] == [1, 2, 2]
    assert [r["exact"] for r in oracle.sliding_counts(checked, "events", 2, value_field="n")] == [10, 30, 50]


def test_counts_follow_application_time_not_arrival_order():
    # same events, arriving reversed, with a tie at t=3 broken by partition
    events = [ev("a", 3, partition=1, offset=0, flag=True), ev("a", 3, partition=0, offset=0, flag=False),
              ev("a", 1, partition=0, offset=1, flag=True)]
    recs = oracle.sliding_counts(oracle.check(events, 0), "events", 2, interesting)
    assert [(r["time"], r["partition"], r["exact"]) for r in recs] == [(1, 0, 1), (3, 0, 1), (3, 1, 1)]


def test_late_events_are_not_counted():
    checked = oracle.check(WORKED, 5, WORKED_CUTS)
    recs = oracle.sliding_counts(checked, "events", 100)
    assert [(r["key"], r["time"]) for r in recs] == [
        ("a", 10), ("b", 25), ("b", 25), ("a", 30), ("a", 35), ("a", 40)]
    assert [r["exact"] for r in recs] == [1, 1, 2, 2, 3, 4]


def test_count_at_a_cti_covers_events_up_to_that_time():
    checked = oracle.check(COUNTS, 0)
    assert oracle.count_at(checked, "a", 3, "events", 2, interesting) == 1  # t=2 -, t=3 I
    assert oracle.count_at(checked, "a", 4, "time", 3, interesting) == 2     # t=2,3,4
    assert oracle.count_at(checked, "b", 4, "time", 3, interesting) == 0


def test_unknown_window_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="events, time"):
        oracle.sliding_counts([], "rows", 3)


# ---- bins ------------------------------------------------------------------------------------

# B = 10, origin 0, bins cover (b, b + 10]:
#   (5, 25]: (0,10] gets 5/20, (10,20] 10/20, (20,30] 5/20
#   zero-length at 20: fraction 1 in (10, 20] (20 is its end, not the start of (20, 30])
#   zero-length at 0:  fraction 1 in (-10, 0]
#   (10, 20] exactly on the edges: fraction 1 in (10, 20]


def test_interval_spreads_over_the_bins_it_overlaps():
    assert oracle.bin_shares(5, 25, 10) == {0: Fraction(1, 4), 10: Fraction(1, 2), 20: Fraction(1, 4)}


def test_zero_length_event_goes_to_the_bin_that_ends_at_or_after_it():
    assert oracle.bin_shares(20, 20, 10) == {10: Fraction(1)}
    assert oracle.bin_shares(0, 0, 10) == {-10: Fraction(1)}
    assert oracle.bin_shares(21, 21, 10) == {20: Fraction(1)}


def test_interval_on_bin_edges_fills_exactly_one_bin():
    assert oracle.bin_shares(10, 20, 10) == {10: Fraction(1)}


def test_origin_shifts_the_bins():
    assert oracle.bin_shares(5, 25, 10, origin=3) == {3: Fraction(8, 20), 13: Fraction(10, 20), 23: Fraction(2, 20)}


def test_end_before_start_is_rejected():
    with pytest.raises(ValueError):
        oracle.bin_shares(5, 4, 10)


@given(st.integers(-60, 60), st.integers(0, 60), st.integers(1, 12), st.integers(-20, 20))
@settings(max_examples=300, deadline=None)
def test_shares_equal_tick_counting_and_sum_to_one(s, length, size, origin):
    e = s + length
    shares = oracle.bin_shares(s, e, size, origin)
    assert sum(shares.values()) == 1
    if length:
        ticks = defaultdict(int)
        for t in range(s + 1, e + 1):  # tick t covers (t − 1, t]
            ticks[next(b for b in range(origin - 100 * size, t, size) if b < t <= b + size)] += 1
        assert shares == {b: Fraction(n, length) for b, n in ticks.items()}


def test_final_bins_of_two_events():
    # key k: (5, 25] with bytes 20 → 5, 10, 5; zero-length at 20 with bytes 3 → (10, 20]
    events = [ev("k", 5, 25, offset=0, bytes=20.0), ev("k", 20, 20, offset=1, bytes=3.0)]
    bins = oracle.final_bins(oracle.check(events, 0), 10, measures=("bytes",))
    assert {b: (x.measures["bytes"], x.fraction_sum, x.events) for (_, b), x in bins.items()} == {
        0: (5, Fraction(1, 4), 1), 10: (13, Fraction(3, 2), 2), 20: (5, Fraction(1, 4), 1)}
    assert bins[("k", 10)].bin_end == 20


def test_adjusted_event_loses_the_share_of_bins_final_at_its_cti():
    # batch 0: k@40 → CTI 12 with delay 28; batch 1: (5, 25] bytes 20 is adjusted at CTI 12.
    # Bins with bin_end < 12 are final: (0, 10] → its 1/4 share goes late; (10, 20] and
    # (20, 30] keep 1/2 and 1/4 of the ORIGINAL lifetime.
    events = [ev("k", 40, 40, offset=0, bytes=0.0), ev("k", 5, 25, offset=1, bytes=20.0)]
    checked = oracle.check(events, 28, [1], policy="adjust")
    assert (checked[1].status, checked[1].start) == (ADJUSTED, 12)
    bins = oracle.final_bins(checked, 10, measures=("bytes",))
    assert {b: x.measures["bytes"] for (_, b), x in bins.items()} == {10: 10, 20: 5, 30: 0}
    [(late, frac, measures)] = oracle.late_shares(checked, 10, measures=("bytes",))
    assert (late.index, frac, measures) == (1, Fraction(1, 4), {"bytes": 5})


def test_a_bin_ending_at_the_cti_still_takes_an_adjusted_share():
    # CTI 20: (10, 20] is not final yet (a zero-length event at 20 may still come)
    events = [ev("k", 30, 30, offset=0, x=0.0), ev("k", 5, 25, offset=1, x=4.0)]
    checked = oracle.check(events, 10, [1], policy="adjust")
    bins = oracle.final_bins(checked, 10, measures=("x",))
    assert {b: x.measures["x"] for (_, b), x in bins.items()} == {10: 2, 20: 1}  # k@30 is in (20, 30]


def test_dropped_events_go_wholly_late():
    events = [ev("k", 40, 40, offset=0, x=1.0), ev("k", 5, 25, offset=1, x=4.0)]
    checked = oracle.check(events, 28, [1])
    assert list(oracle.final_bins(checked, 10, measures=("x",))) == [("k", 30)]
    assert [(c.index, f, m) for c, f, m in oracle.late_shares(checked, 10, measures=("x",))] == [
        (1, Fraction(1), {"x": 4})]



def test_exact_counts_recount_the_input_topic_at_each_count_record():
    cfg = parse({"job": "j",
                 "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time"}],
                 "operators": [{"kind": "count", "name": "big", "window": {"events": 2},
                                "predicate": "amount > 100", "output": "counts"}]})
    inputs = {"tx": [{"account": "a", "event_time": 1000, "amount": 50},
                     {"account": "b", "event_time": 1500, "amount": 500},
                     {"account": "a", "event_time": 2000, "amount": 200},
                     {"_undecodable": "bad", "_bytes": ""},
                     {"account": None, "event_time": 2500, "amount": 900},
                     {"account": "a", "event_time": 3000, "amount": 300}]}
    records = [{"counter": "big", "key": "a", "time": 1000}, {"counter": "big", "key": "a", "time": 3000},
               {"counter": "big", "key": "b", "time": 3000}, {"counter": "other", "key": "a", "time": 3000}]
    exact = oracle.exact_counts(cfg, records, inputs.__getitem__)
    assert exact == {("big", "a"): [(1000, 0), (3000, 2)], ("big", "b"): [(3000, 1)]}

@st.composite
def intervals(draw):
    n = draw(st.integers(1, 25))
    events = []
    for i in range(n):
        s = draw(st.integers(0, 120))
        events.append(ev(draw(st.sampled_from("ab")), s, s + draw(st.integers(0, 40)), offset=i,
                         m=draw(st.floats(0, 1e6, allow_nan=False))))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)))))
    return events, cuts


@given(intervals(), st.integers(-5, 60), st.sampled_from(["drop", "adjust"]), st.integers(1, 30))
@settings(max_examples=200, deadline=None)
def test_final_bins_plus_late_shares_conserve_every_measure(data, delay, policy, size):
    events, cuts = data
    checked = oracle.check(events, delay, cuts, policy)
    bins = oracle.final_bins(checked, size, measures=("m",))
    late = oracle.late_shares(checked, size, measures=("m",))
    total = sum((Fraction(e.fields["m"]) for e in events), Fraction(0))
    binned = sum((b.measures["m"] for b in bins.values()), Fraction(0))
    assert binned + sum((m["m"] for _, _, m in late), Fraction(0)) == total
    fractions = sum((b.fraction_sum for b in bins.values()), Fraction(0))
    assert fractions + sum((f for _, f, _ in late), Fraction(0)) == len(events)
