"""The exponential histogram (operators/histogram.py) as a specification.

Worked example: Figure 3 of seeds/approximate-counting-exponential-histogram.txt. Properties:
against brute-force exact counters over count-based windows, time-based windows and weighted
sums, after every update.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctiflow.operators.errors import ConfigError
from ctiflow.operators.histogram import Bucket, ExponentialHistogram, buckets_per_size

EPSILONS = st.sampled_from([1.0, 0.5, 0.34, 0.25, 0.2, 0.1, 0.07, 0.05, 0.03, 0.01])
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Figure 3: n = 7, ε = 0.5 (k = 2). Per timestamp: the event, the buckets (timestamp, count)
# newest … oldest after merges, total, the seed's query, the exact count.
FIGURE_3 = [
    (1, 0, [], 0, 0, 0),
    (2, 1, [(2, 1)], 1, 1, 1),
    (3, 1, [(3, 1), (2, 1)], 2, 2, 2),
    (4, 0, [(3, 1), (2, 1)], 2, 2, 2),
    (5, 1, [(5, 1), (3, 2)], 3, 2, 3),
    (6, 1, [(6, 1), (5, 1), (3, 2)], 4, 3, 4),
    (7, 1, [(7, 1), (6, 2), (3, 2)], 5, 4, 5),
    (8, 1, [(8, 1), (7, 1), (6, 2), (3, 2)], 6, 5, 6),
    (9, 1, [(9, 1), (8, 2), (6, 4)], 7, 5, 6),
    (10, 0, [(9, 1), (8, 2), (6, 4)], 7, 5, 5),
    (11, 0, [(9, 1), (8, 2), (6, 4)], 7, 5, 5),
    (12, 0, [(9, 1), (8, 2), (6, 4)], 7, 5, 4),
    (13, 0, [(9, 1), (8, 2)], 3, 2, 3),
]


def state(h: ExponentialHistogram) -> tuple:
    return (h.now, h.total, h.buckets())


def check_guarantees(h: ExponentialHistogram, exact: int) -> None:
    lower, upper = h.bounds()
    assert lower <= exact <= upper, (lower, exact, upper, h.buckets())
    assert abs(h.estimate() - exact) <= h.epsilon * exact, (h.estimate(), exact, h.buckets())
    assert h.bucket_count <= h.cap * (math.log2(max(exact, 1)) + 1)


class ExactWindow:
    """Brute force: every (timestamp, value) kept; exact = Σ values with t > now − window."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.items: deque[tuple[int, int]] = deque()
        self.now = None

    def update(self, t: int, v: int) -> None:
        self.now = t
        if v:
            self.items.append((t, v))

    def exact(self) -> int:
        while self.items and self.items[0][0] <= self.now - self.window:
            self.items.popleft()
        return sum(v for _, v in self.items)


# -- the seed's worked example ------------------------------------------------------------------


def test_figure_3_rows_are_reproduced_row_by_row():
    h = ExponentialHistogram(7, 0.5)
    oracle = ExactWindow(7)
    for timestamp, event, buckets, total, query, exact in FIGURE_3:
        h.update(timestamp, event)
        oracle.update(timestamp, event)
        assert h.buckets() == [Bucket(t, c) for t, c in buckets], timestamp
        assert h.total == total
        assert h.seed_estimate() == query
        assert oracle.exact() == exact


def test_figure_3_exact_counts_lie_within_bounds_and_epsilon():
    h = ExponentialHistogram(7, 0.5)
    for timestamp, event, _, _, _, exact in FIGURE_3:
        h.update(timestamp, event)
        check_guarantees(h, exact)


def test_k_and_cap_follow_the_seed():
    assert buckets_per_size(0.5) == 2  # k = 2: merge on the third bucket of a size
    assert buckets_per_size(0.05) == 11  # k = 20
    assert buckets_per_size(0.01) == 51  # k = 100
    assert buckets_per_size(0.1) == 6  # k = 10 although 1/0.1 is inexact in binary
    assert buckets_per_size(0.3) == 3  # k = 4
    assert ExponentialHistogram(10, 0.07).k == 15


# -- the seed's estimate is not enough ----------------------------------------------------------


def ten_ones_and_one_two() -> ExponentialHistogram:
    h = ExponentialHistogram(1000, 0.05)  # k = 20: at most 11 buckets per size
    for t in range(1, 13):
        h.update(t, 1)
    return h


def test_seed_estimate_breaks_the_bound_with_ten_ones_and_one_two_at_epsilon_5_percent():
    h = ten_ones_and_one_two()
    assert h.buckets() == [Bucket(t, 1) for t in range(12, 2, -1)] + [Bucket(2, 2)]
    exact = 12
    assert h.seed_estimate() == 11
    assert abs(h.seed_estimate() - exact) > 0.05 * exact


def test_midpoint_estimate_keeps_the_bound_where_the_seed_fails():
    h = ten_ones_and_one_two()
    assert h.estimate() == 11.5
    assert h.bounds() == (11, 12)
    assert abs(h.estimate() - 12) <= 0.05 * 12


def test_estimate_is_exact_while_the_oldest_bucket_has_count_one():
    h = ExponentialHistogram(100, 0.05)
    for t in range(1, 12):
        h.update(t, 1)
    assert h.bounds() == (11, 11)
    assert h.estimate() == 11.0


def test_empty_histogram_estimates_zero():
    h = ExponentialHistogram(5, 0.1)
    assert (h.estimate(), h.seed_estimate(), h.bounds(), h.bucket_count) == (0.0, 0, (0, 0), 0)


# -- properties against brute force -------------------------------------------------------------


@PROPERTY
@given(window=st.integers(1, 60), epsilon=EPSILONS, bits=st.lists(st.booleans(), max_size=400))
def test_count_window_estimate_within_epsilon_after_every_update(window, epsilon, bits):
    h = ExponentialHistogram(window, epsilon)
    oracle = ExactWindow(window)
    for seq, bit in enumerate(bits, start=1):
        h.update(seq, bit)
        oracle.update(seq, bit)
        check_guarantees(h, oracle.exact())
        assert h.bucket_count <= h.cap * (math.log2(window) + 1)


@PROPERTY
@given(
    window=st.integers(1, 50),
    epsilon=EPSILONS,
    steps=st.lists(st.tuples(st.integers(0, 6), st.booleans(), st.booleans()), max_size=300),
)
def test_time_window_estimate_within_epsilon_with_ties_and_idle_advances(window, epsilon, steps):
    h = ExponentialHistogram(window, epsilon)
    oracle = ExactWindow(window)
    t = 0
    for gap, bit, idle in steps:
        t += gap
        if idle:
            h.advance(t)
            oracle.update(t, 0)
        else:
            h.update(t, bit)
            oracle.update(t, bit)
        check_guarantees(h, oracle.exact())


@PROPERTY
@given(
    window=st.integers(1, 40),
    epsilon=EPSILONS,
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.one_of(st.integers(0, 3), st.integers(0, 10**6))), max_size=150
    ),
)
def test_weighted_sum_estimate_within_epsilon_after_every_update(window, epsilon, steps):
    h = ExponentialHistogram(window, epsilon)
    oracle = ExactWindow(window)
    t = 0
    for gap, value in steps:
        t += gap
        h.update(t, value)
        oracle.update(t, value)
        check_guarantees(h, oracle.exact())


@PROPERTY
@given(
    window=st.integers(1, 30),
    epsilon=EPSILONS,
    steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 80)), max_size=40),
)
def test_weighted_update_equals_that_many_unit_updates(window, epsilon, steps):
    heavy = ExponentialHistogram(window, epsilon)
    units = ExponentialHistogram(window, epsilon)
    t = 0
    for gap, value in steps:
        t += gap
        heavy.update(t, value)
        units.update(t, 0)
        for _ in range(value):
            units.update(t, 1)
        assert state(heavy) == state(units)


def test_huge_weight_is_added_in_closed_form():
    h = ExponentialHistogram(10, 0.01)
    h.update(1, 10**15)
    assert h.total == 10**15
    assert h.bounds()[0] <= 10**15 <= h.bounds()[1]
    assert h.bucket_count <= h.cap * (math.log2(10**15) + 1)


def test_bucket_count_stays_logarithmic_on_a_long_stream():
    window, epsilon = 20_000, 0.01
    h = ExponentialHistogram(window, epsilon)
    rng = np.random.default_rng(7)
    bits = rng.random(100_000) < 0.5
    h.update_many(np.arange(1, len(bits) + 1), bits)
    exact = int(bits[-window:].sum())
    check_guarantees(h, exact)
    assert h.bucket_count <= h.cap * (math.log2(window) + 1)
    assert h.bucket_count < exact / 10


# -- batched updates ------------------------------------------------------------------------------


@st.composite
def batched_streams(draw):
    """A stream (timestamps, values) and cut points into micro-batches."""
    n = draw(st.integers(0, 700))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    max_gap = draw(st.sampled_from([1, 1, 2, 4, 30]))
    min_gap = draw(st.sampled_from([0, 1]))
    stamps = draw(st.integers(-5, 5)) + np.cumsum(rng.integers(min_gap, max_gap + 1, n))
    kind = draw(st.sampled_from(["none", "bool", "small", "heavy", "huge"]))
    p = draw(st.floats(0.0, 1.0))
    if kind == "none":
        values = None
    elif kind == "bool":
        values = rng.random(n) < p
    elif kind == "small":
        values = rng.integers(0, 4, n) * (rng.random(n) < p)
    elif kind == "heavy":
        values = rng.integers(0, 50, n) * (rng.random(n) < p)
    else:
        values = rng.integers(0, 10**6, n) * (rng.random(n) < 0.05)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=5)))
    return stamps.astype(np.int64), values, cuts


@PROPERTY
@given(window=st.sampled_from([1, 3, 10, 47, 64, 150, 500, 10**6]), epsilon=EPSILONS, stream=batched_streams())
def test_update_many_equals_updates_one_by_one(window, epsilon, stream):
    stamps, values, cuts = stream
    sequential = ExponentialHistogram(window, epsilon)
    batched = ExponentialHistogram(window, epsilon)
    for i, t in enumerate(stamps.tolist()):
        sequential.update(t, 1 if values is None else int(values[i]))
    prev = 0
    for cut in cuts + [len(stamps)]:
        batched.update_many(stamps[prev:cut], None if values is None else values[prev:cut])
        prev = cut
    assert state(batched) == state(sequential)


def test_update_many_accepts_lists_and_rejects_disorder():
    h = ExponentialHistogram(10, 0.5)
    h.update_many([1, 2, 2, 3], [True, False, True, True])
    assert h.total == 3
    with pytest.raises(ValueError, match="non-decreasing"):
        h.update_many([5, 4])
    with pytest.raises(ValueError, match="before"):
        h.update_many([1])
    with pytest.raises(ValueError, match="non-negative"):
        h.update_many([7], [-1])


# -- expiry and time ----------------------------------------------------------------------------


def test_advance_expires_a_time_window_without_events():
    h = ExponentialHistogram(1000, 0.1)
    h.update(0, 5)
    h.advance(999)
    assert h.bounds() == (5, 5)
    h.advance(1000)  # 0 ≤ 1000 − 1000: out
    assert (h.total, h.bucket_count, h.estimate()) == (0, 0, 0.0)


def test_timestamps_never_decrease():
    h = ExponentialHistogram(10, 0.1)
    h.update(5)
    with pytest.raises(ValueError, match="never decrease"):
        h.update(4)
    with pytest.raises(ValueError, match="never decrease"):
        h.advance(4)


def test_rejected_update_leaves_the_histogram_unchanged():
    h = ExponentialHistogram(10, 0.1)
    h.update(1, 4)
    before = state(h)
    with pytest.raises(ValueError, match="negative"):
        h.update(50, -3)
    with pytest.raises(TypeError):
        h.update(50, "many")
    assert state(h) == before


@pytest.mark.parametrize("window", [0, -1, 2**62, 1.5, True])
def test_invalid_window_is_a_config_error(window):
    with pytest.raises(ConfigError, match="window"):
        ExponentialHistogram(window, 0.1)


@pytest.mark.parametrize("epsilon", [0, -0.1, 1.5, "0.1", float("nan")])
def test_invalid_epsilon_is_a_config_error(epsilon):
    with pytest.raises(ConfigError, match="epsilon"):
        ExponentialHistogram(10, epsilon)


# -- state ----------------------------------------------------------------------------------------


@PROPERTY
@given(
    window=st.integers(1, 40),
    epsilon=EPSILONS,
    values=st.lists(st.integers(0, 5), max_size=200),
    cut=st.integers(0, 200),
)
def test_snapshot_restore_mid_stream_continues_identically(window, epsilon, values, cut):
    original = ExponentialHistogram(window, epsilon)
    for t, v in enumerate(values[:cut]):
        original.update(t, v)
    restored = ExponentialHistogram.restore(original.snapshot())
    assert state(restored) == state(original)
    assert (restored.window, restored.epsilon) == (window, epsilon)
    for t, v in enumerate(values[cut:], start=len(values[:cut])):
        original.update(t, v)
        restored.update(t, v)
        assert state(restored) == state(original)
        assert restored.estimate() == original.estimate()


def test_snapshot_is_compact():
    h = ExponentialHistogram(10**6, 0.01)
    h.update_many(np.arange(1, 200_001), np.ones(200_000, dtype=bool))
    assert len(h.snapshot()) <= 32 + 8 * (2 + 30 + h.bucket_count)


def test_restore_rejects_foreign_bytes():
    with pytest.raises(ValueError):
        ExponentialHistogram.restore(b"not a snapshot at all, sorry")
    data = ExponentialHistogram(10, 0.1).snapshot()
    with pytest.raises(ValueError):
        ExponentialHistogram.restore(data[:-3])
