"""prorate(): which bins an event touches and its fraction of each (Spark PR 2633's functions).

The oracle transliterates the PR's ``filter`` and ``prorate`` (quoted below as data) into
exact rational arithmetic and scans *every* bin around the event — it shares no code with
``ctiflow.operators.bins``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ctiflow.operators.bins import BinShare, prorate

#: seeds/spark-pr-2633-event-proration.txt, verbatim.
PR_PRORATE = """\
def prorate(binStart: Time, binEnd: Time)(x: T) = {
val sx = startFunc(x)
val ex = endFunc(x)
// Even though binStart is not inclusive, binStart here implies limit
x as x approaches binStart+
val s = if (sx > binStart) sx else binStart
val e = if (ex < binEnd) ex else binEnd
if (ex == sx) {
(x, 1.0)
}
else {
(x, (e - s) / (ex - sx))
}
}"""

PR_FILTER = """\
def filter(binStart: Time, binEnd: Time)(x: T) = {
// The flow is starting in the subsequent bin
if (startFunc(x) > binEnd) false
// The flow ended in the prior bin
else if (endFunc(x) <= binStart) false
// start(x) approaches from binEnd+
else if (startFunc(x) == binEnd && endFunc(x) > binEnd) false
else true
}"""


def pr_filter(bin_start: int, bin_end: int, sx: int, ex: int) -> bool:
    """PR_FILTER, line by line."""
    if sx > bin_end:
        return False
    elif ex <= bin_start:
        return False
    elif sx == bin_end and ex > bin_end:
        return False
    else:
        return True


def pr_prorate(bin_start: int, bin_end: int, sx: int, ex: int) -> Fraction:
    """PR_PRORATE, line by line, in exact arithmetic."""
    s = sx if sx > bin_start else bin_start
    e = ex if ex < bin_end else bin_end
    if ex == sx:
        return Fraction(1)
    return Fraction(e - s, ex - sx)


def oracle_shares(start: int, end: int, bin_size: int, origin: int) -> list[tuple[int, int, Fraction]]:
    """Every bin from one before the start's to one after the end's, kept if the PR's filter says so."""
    first = math.floor(Fraction(start - origin, bin_size)) - 1
    last = math.floor(Fraction(end - origin, bin_size)) + 1
    out = []
    for k in range(first, last + 1):
        bin_start = origin + k * bin_size
        bin_end = bin_start + bin_size
        if pr_filter(bin_start, bin_end, start, end):
            out.append((bin_start, bin_end, pr_prorate(bin_start, bin_end, start, end)))
    return out


def test_the_quoted_pr_functions_are_the_ones_transliterated():
    assert "if (startFunc(x) == binEnd && endFunc(x) > binEnd) false" in PR_FILTER
    assert "else if (endFunc(x) <= binStart) false" in PR_FILTER
    assert "(x, (e - s) / (ex - sx))" in PR_PRORATE
    assert "if (ex == sx) {\n(x, 1.0)" in PR_PRORATE


def test_interval_is_split_in_proportion_to_overlap():
    assert prorate(0, 100, 60) == [(0, 60, 0.6), (60, 120, 0.4)]


def test_shares_are_named_tuples():
    share = prorate(10, 20, 60)[0]
    assert isinstance(share, BinShare)
    assert (share.bin_start, share.bin_end, share.fraction) == (0, 60, 1.0)


def test_bin_excludes_its_start_and_includes_its_end():
    assert prorate(60, 120, 60) == [(60, 120, 1.0)]
    assert prorate(0, 60, 60) == [(0, 60, 1.0)]


def test_zero_length_event_on_a_bin_edge_belongs_to_the_bin_ending_there():
    assert prorate(60, 60, 60) == [(0, 60, 1.0)]


def test_zero_length_event_just_after_an_edge_belongs_to_the_next_bin():
    assert prorate(61, 61, 60) == [(60, 120, 1.0)]


def test_event_spanning_many_bins_gets_equal_inner_shares():
    shares = prorate(30, 630, 60)
    assert [s.bin_start for s in shares] == list(range(0, 630, 60))
    assert shares[0].fraction == shares[-1].fraction == 0.05
    assert all(s.fraction == 0.1 for s in shares[1:-1])


def test_negative_times_and_origin():
    assert prorate(-90, -30, 60) == [(-120, -60, 0.5), (-60, 0, 0.5)]
    assert prorate(5, 65, 60, origin=5) == [(5, 65, 1.0)]
    assert prorate(5, 5, 60, origin=5) == [(-55, 5, 1.0)]
    assert prorate(0, 10, 60, origin=-1_000_003) == [(-43, 17, 1.0)]  # -1_000_003 ≡ 17 (mod 60)


def test_bin_size_one_gives_one_bin_per_tick():
    assert prorate(0, 5, 1) == [(t, t + 1, 0.2) for t in range(5)]


def test_huge_bin_size_and_huge_times():
    assert prorate(0, 10, 2**62) == [(0, 2**62, 1.0)]
    assert prorate(2**61 + 1, 2**61 + 3, 2) == [(2**61, 2**61 + 2, 0.5), (2**61 + 2, 2**61 + 4, 0.5)]


def test_end_before_start_is_an_error():
    with pytest.raises(ValueError, match="ends before it starts"):
        prorate(10, 9, 60)


@pytest.mark.parametrize("bad", [0, -5, 2.5])
def test_bin_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="bin_size"):
        prorate(0, 10, bad)


times = st.integers(-10**6, 10**6)


@settings(max_examples=400, deadline=None)
@given(
    start=times,
    length=st.one_of(st.just(0), st.integers(0, 5_000)),
    bin_size=st.one_of(st.integers(1, 100), st.integers(100, 10**7), st.just(2**62)),
    origin=st.integers(-10**6, 10**6),
)
@example(start=60, length=0, bin_size=60, origin=0)
@example(start=0, length=60, bin_size=60, origin=0)
@example(start=-60, length=120, bin_size=60, origin=0)
@example(start=7, length=0, bin_size=7, origin=7)
def test_prorate_matches_the_pr_exhaustively(start, length, bin_size, origin):
    end = start + length
    expected = oracle_shares(start, end, bin_size, origin)
    got = prorate(start, end, bin_size, origin)
    assert [(s.bin_start, s.bin_end) for s in got] == [(b, e) for b, e, _ in expected]
    for share, (_, _, exact) in zip(got, expected):
        assert share.fraction == float(exact)  # each fraction correctly rounded
    assert math.fsum(s.fraction for s in got) == pytest.approx(1.0, abs=1e-12)
    assert abs(sum(s.fraction for s in got) - 1.0) <= 1e-12


@settings(max_examples=100, deadline=None)
@given(start=st.integers(-(2**61), 2**61), length=st.integers(0, 10**4), bin_size=st.integers(1, 2**62))
def test_prorate_is_exact_for_times_beyond_float_precision(start, length, bin_size):
    end = start + length
    expected = oracle_shares(start, end, bin_size, 0)
    got = prorate(start, end, bin_size)
    assert got == [(b, e, float(f)) for b, e, f in expected]
