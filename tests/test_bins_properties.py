"""Binner properties against an exhaustive oracle, under a tiny in-test time layer.

The oracle counts, tick by tick, how much of each event's lifetime ``(s, e]`` falls in each
bin (exact ``Fraction``s; a zero-length event goes to the bin whose ``(start, end]`` holds
it, found by scanning bins) — it shares no code with ``ctiflow.operators.bins``.

The driver plays the time layer and the reorder buffer: events arrive in some order, CTIs
are interleaved; an event behind the CTI follows the violation policy (DROP → ``late``;
ADJUST → start moved to the CTI, ``original_start`` kept; wholly before the CTI → ``late``);
at each CTI the buffered events that the CTI has passed are sorted by (start, partition,
offset) and fed to the binner — one by one or in ``process_columns`` chunks — then
``advance_to(cti)``. Snapshots are taken and restored at random points.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

import ctiflow.operators.bins as bins_module
from ctiflow.operators.bins import Binner, BinSettings, late_share
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.events import outputs_of
from ctiflow.operators.time import CTI_INFINITY, CTI_NONE, Event, ViolationPolicy

MEASURES = ("bytes", "load")


# ---- oracle ---------------------------------------------------------------------------------


def bin_of(t: int, bin_size: int, origin: int) -> int:
    """Start of the bin ``(b, b + B]`` holding ``t``, by scanning from a bin surely below it."""
    b = origin + math.floor(Fraction(t - origin, bin_size)) * bin_size - bin_size
    while not (b < t <= b + bin_size):
        b += bin_size
    return b


def oracle_shares(s: int, e: int, bin_size: int, origin: int) -> dict[int, Fraction]:
    """bin_start → exact fraction of (s, e] in that bin, counting unit ticks (t, t+1]."""
    if e == s:
        return {bin_of(s, bin_size, origin): Fraction(1)}
    ticks: dict[int, int] = defaultdict(int)
    for t in range(s, e):
        ticks[bin_of(t + 1, bin_size, origin)] += 1
    return {b: Fraction(n, e - s) for b, n in ticks.items()}


def values(ev: Event) -> dict[str, Fraction]:
    return {m: Fraction(ev.fields[m]) for m in MEASURES}


@dataclass
class Expected:
    finals: dict[tuple[str, int], dict[str, Fraction]]
    fractions: dict[tuple[str, int], Fraction]
    events: dict[tuple[str, int], int]
    late: dict[str, Fraction]


def oracle(arrived: list[tuple[Event, int]], s: BinSettings) -> Expected:
    """Final bins and late shares, given each event and the CTI it arrived under."""
    finals: dict = defaultdict(lambda: dict.fromkeys(MEASURES, Fraction(0)))
    fractions: dict = defaultdict(Fraction)
    counts: dict = defaultdict(int)
    late = dict.fromkeys(MEASURES, Fraction(0))
    for ev, cti in arrived:
        v = values(ev)
        for bin_start, f in oracle_shares(ev.start, ev.end, s.bin_size, s.origin).items():
            on_time = ev.start >= cti
            adjusted = s.policy is ViolationPolicy.ADJUST and ev.end > cti and bin_start + s.bin_size >= cti
            if on_time or adjusted:
                for m in MEASURES:
                    finals[(ev.key, bin_start)][m] += v[m] * f
                fractions[(ev.key, bin_start)] += f
                counts[(ev.key, bin_start)] += 1
            else:
                for m in MEASURES:
                    late[m] += v[m] * f
    return Expected(dict(finals), dict(fractions), dict(counts), late)


# ---- driver ---------------------------------------------------------------------------------


@dataclass
class Run:
    outputs: list  # every Output of the binner, in order
    late: list[dict]  # late records: the binner's and the time layer's
    arrived: list[tuple[Event, int]]  # each event with the CTI current when it arrived


def open_bins(binner: Binner) -> tuple[int, dict]:
    """A binner's CTI and open bins, (key, bin) → its sums, counts, revision and pending
    increments, read from its snapshot's columns (not from its slots: independent of how they
    are laid out)."""
    b = Binner.restore(binner.settings, binner.snapshot())
    live = [i for i in range(b._hi) if b._live[i]]
    keys = b._keys.keys_of([int(b._kid[i]) for i in live])
    return b.cti, {(key, int(b._k[i])): (tuple(b._cum[:, i]), float(b._cfrac[i]), int(b._cev[i]), int(b._rev[i]),
                                         bool(b._touched[i]), tuple(b._inc[:, i]), float(b._ifrac[i]), int(b._iev[i]))
                   for key, i in zip(keys, live)}


class Stored:
    """A binner kept as a chunk is: a base snapshot and the frames (:meth:`Binner.delta` of the keys
    :meth:`Binner.changed_keys` named) written since, compacted after ``frames`` of them; ``cold``,
    in turn for each commit: whether the binner goes on read back (else as it is, as a worker's
    cache keeps it)."""

    def __init__(self, binner: Binner, frames: int, cold: list[bool]) -> None:
        self.base, self.frames, self.most, self.cold, self.commits = binner.snapshot(), [], frames, cold, 0
        binner.changed_keys()

    def commit(self, binner: Binner) -> Binner:
        """``binner``'s changes written; → the binner read back from the base and frames (checked
        equal to it) or ``binner``."""
        changed = binner.changed_keys()
        if len(self.frames) >= self.most:
            self.base, self.frames = binner.snapshot(), []
        else:
            self.frames.append(binner.delta(changed))
        got = Binner.restore(binner.settings, self.base)
        for snap, dropped in self.frames:
            got.absorb(Binner.restore(binner.settings, snap), set(dropped))
        assert open_bins(got) == open_bins(binner)
        self.commits += 1
        return got if self.cold[self.commits % len(self.cold)] else binner


def drive(s: BinSettings, arrivals: list[Event], ctis: list[int | None], chunks: list[int],
          restores: list[bool], frames: tuple[int, list[bool]] | None = None) -> Run:
    """Feed ``arrivals``; after arrival i, ``ctis[i]`` (if not None and not behind) is the next CTI.
    At each ``restores`` point the binner is restored from its snapshot, or with ``frames`` kept
    as a base and deltas (``frames``: :class:`Stored`'s ``frames`` and ``cold``) and read back from them."""
    binner = Binner(s)
    cti = CTI_NONE
    buffered: list[Event] = []
    run = Run([], [], [])
    steps = 0
    stored = None if frames is None else Stored(binner, *frames)

    def restored(b: Binner) -> Binner:
        return Binner.restore(s, b.snapshot()) if stored is None else stored.commit(b)

    def step(c: int) -> None:
        nonlocal binner, buffered, cti, steps
        c = max(c, cti)
        ready = sorted((e for e in buffered if e.start < c or c == CTI_INFINITY),
                       key=lambda e: (e.start, e.partition, e.offset))
        buffered = [e for e in buffered if not (e.start < c or c == CTI_INFINITY)]
        size = chunks[steps % len(chunks)]
        for lo in range(0, len(ready), max(size, 1)):
            part = ready[lo: lo + max(size, 1)]
            if size > 0:
                got = [o for _, outs in binner.process_columns(EventColumns.from_events(part)) for o in outs]
            else:
                got = [o for e in part for o in binner.process(e)]
            if restores[(steps + lo) % len(restores)]:
                binner = restored(binner)
            run.outputs += got
        run.outputs += outputs_of(binner.advance_to(c))
        if restores[steps % len(restores)]:
            binner = restored(binner)
        cti = c
        steps += 1

    for ev, c in zip(arrivals, ctis):
        run.arrived.append((ev, cti))
        if ev.start < cti:
            if s.policy is ViolationPolicy.DROP or ev.end <= cti:
                run.late.append(late_share(ev, cti, s))
            else:
                buffered.append(replace(ev, start=cti, original_start=ev.start))
        else:
            buffered.append(ev)
        if c is not None:
            step(c)
    step(CTI_INFINITY)
    run.late += [o.record for o in run.outputs if o.role == "late"]
    return run


# ---- strategies -----------------------------------------------------------------------------


@st.composite
def workloads(draw):
    bin_size = draw(st.one_of(st.sampled_from([1, 2, 3, 10, 60]), st.integers(1, 200), st.just(2**40)))
    origin = draw(st.integers(-50, 50))
    edge = st.builds(lambda k, d: origin + k * bin_size + d, st.integers(-4, 4), st.sampled_from([0, 0, 1, -1]))
    times = st.one_of(st.integers(-300, 300), edge)
    n = draw(st.integers(0, 20))
    events = []
    for i in range(n):
        start = draw(times)
        end = draw(st.one_of(st.just(start), st.integers(start, start + 12), st.integers(start, start + 400),
                             edge.filter(lambda t, s=start: s <= t <= s + 400)))
        events.append(Event(
            key=draw(st.sampled_from(["a", "b", "c"])), start=start, end=end,
            fields={"bytes": draw(st.integers(0, 10**6)),
                    "load": draw(st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False))},
            partition=draw(st.integers(0, 2)), offset=i, stream="flows"))
    policy = draw(st.sampled_from(list(ViolationPolicy)))
    outputs = draw(st.sampled_from([frozenset({"incremental", "updated", "final"}), frozenset({"final"})]))
    return BinSettings("flows", bin_size, origin, MEASURES, outputs, policy), events


@st.composite
def on_time_schedules(draw, events):
    """Arrival order and CTIs such that every event arrives before a CTI passes its start."""
    order = draw(st.permutations(range(len(events))))
    arrivals = [events[i] for i in order]
    ctis = []
    for i in range(len(arrivals)):
        if draw(st.booleans()):
            rest = [e.start for e in arrivals[i + 1:]]
            bound = min(rest) if rest else max(e.end for e in events) + 1
            ctis.append(bound - draw(st.sampled_from([0, 0, 1, 5, 50])))
        else:
            ctis.append(None)
    chunks = draw(st.lists(st.sampled_from([0, 1, 2, 1000]), min_size=1, max_size=4))
    restores = draw(st.lists(st.booleans(), min_size=1, max_size=4))
    return arrivals, ctis, chunks, restores


@st.composite
def any_schedules(draw, events):
    """Arrival order and CTIs generated as latest start − delay: events may be late."""
    order = draw(st.permutations(range(len(events))))
    arrivals = [events[i] for i in order]
    delay = draw(st.integers(-1, 200))
    latest = None
    ctis = []
    for ev in arrivals:
        latest = ev.start if latest is None else max(latest, ev.start)
        ctis.append(latest - delay if draw(st.booleans()) else None)
    chunks = draw(st.lists(st.sampled_from([0, 1, 3, 1000]), min_size=1, max_size=3))
    restores = draw(st.lists(st.booleans(), min_size=1, max_size=3))
    return arrivals, ctis, chunks, restores


# ---- checks ---------------------------------------------------------------------------------


def close(got: float, exact: Fraction, scale: Fraction) -> bool:
    return abs(Fraction(got) - exact) <= Fraction(1, 10**9) * max(abs(scale), Fraction(1))


def records(run: Run, role: str) -> list[dict]:
    return [o.record for o in run.outputs if o.role == role]


def check_against_oracle(run: Run, s: BinSettings) -> None:
    exp = oracle(run.arrived, s)
    finals = records(run, "bin_final")
    got = {(r["key"], r["bin_start"]): r for r in finals}
    assert len(got) == len(finals), "a bin was final twice"
    assert set(got) == set(exp.finals)
    scale = {m: sum((abs(v) for (ev, _) in run.arrived for v in [values(ev)[m]]), Fraction(0)) for m in MEASURES}
    for b, rec in got.items():
        assert rec["bin_end"] == rec["bin_start"] + s.bin_size
        assert rec["events"] == exp.events[b]
        assert close(rec["fraction_sum"], exp.fractions[b], Fraction(exp.events[b]))
        for m in MEASURES:
            assert close(rec["measures"][m], exp.finals[b][m], scale[m]), (b, m)
    # conservation: Σ final bins + Σ late shares = Σ events
    for m in MEASURES:
        total = sum((values(ev)[m] for ev, _ in run.arrived), Fraction(0))
        binned = sum((Fraction(r["measures"][m]) for r in finals), Fraction(0))
        dropped = sum((Fraction(r["measures"][m]) for r in run.late), Fraction(0))
        assert abs(binned + dropped - total) <= Fraction(1, 10**9) * max(scale[m], Fraction(1))
        assert close(float(sum((Fraction(r["measures"][m]) for r in run.late), Fraction(0))), exp.late[m], scale[m])


def check_streams(run: Run, s: BinSettings) -> None:
    """Σ incremental = final, last updated = final, revisions 1..n, nothing after final, order."""
    finals = {(r["key"], r["bin_start"]): r for r in records(run, "bin_final")}
    if "incremental" in s.outputs:
        inc = defaultdict(list)
        for r in records(run, "bin_incremental"):
            inc[(r["key"], r["bin_start"])].append(r)
        assert set(inc) == set(finals)
        for b, rs in inc.items():
            f = finals[b]
            assert sum(r["events"] for r in rs) == f["events"]
            assert [r["revision"] for r in rs] == list(range(1, f["revision"] + 1))
            assert [r["final"] for r in rs] == [False] * (len(rs) - 1) + [rs[-1]["cti"] == f["cti"]]
            for m in MEASURES:
                scale = sum(abs(r["measures"][m]) for r in rs)
                assert close(math.fsum(r["measures"][m] for r in rs), Fraction(f["measures"][m]), Fraction(scale))
    if "updated" in s.outputs:
        last = {}
        for r in records(run, "bin_updated"):
            b = (r["key"], r["bin_start"])
            assert r["revision"] == last.get(b, {"revision": 0})["revision"] + 1
            last[b] = r
        assert set(last) == set(finals)
        for b, r in last.items():
            f = finals[b]
            assert (r["measures"], r["fraction_sum"], r["events"], r["revision"]) == (
                f["measures"], f["fraction_sum"], f["events"], f["revision"])
    seen_final = set()
    previous = None
    for o in run.outputs:
        if not o.role.startswith("bin_"):
            continue
        b = (o.record["key"], o.record["bin_start"])
        assert b not in seen_final, "a record after the bin's final"
        if o.role == "bin_final":
            seen_final.add(b)
            assert o.record["bin_end"] < o.record["cti"]
        here = (o.record["cti"], o.role, o.record["key"], o.record["bin_start"])
        if previous is not None and previous[:2] == here[:2]:
            assert previous[2:] < here[2:], "records of one role at one CTI are sorted by key, bin_start"
        previous = here


def final_values(run: Run) -> dict:
    return {(r["key"], r["bin_start"]): (r["measures"], r["fraction_sum"], r["events"])
            for r in records(run, "bin_final")}


# ---- properties -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_on_time_events_final_bins_match_the_oracle(data):
    s, events = data.draw(workloads())
    forget = data.draw(st.booleans())  # renumber keys at every CTI that finalises a bin
    saved, bins_module._FORGET_KEYS_ABOVE = bins_module._FORGET_KEYS_ABOVE, (0 if forget else 1024)
    try:
        run = drive(s, *data.draw(on_time_schedules(events)))
    finally:
        bins_module._FORGET_KEYS_ABOVE = saved
    assert run.late == []
    check_against_oracle(run, s)
    check_streams(run, s)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_binner_read_back_from_its_base_and_deltas_holds_what_it_held(data):
    """Kept as a chunk is (a base, then a frame of the keys each commit changed, compacted now and
    then) and read back at random points, a binner holds the open bins it held (checked at every
    point) and its results stay the oracle's — keys renumbered between commits or not."""
    s, events = data.draw(workloads())
    forget = data.draw(st.booleans())
    saved, bins_module._FORGET_KEYS_ABOVE = bins_module._FORGET_KEYS_ABOVE, (0 if forget else 1024)
    try:
        kept = (data.draw(st.sampled_from([0, 1, 3, 100])), data.draw(st.lists(st.booleans(), min_size=1, max_size=3)))
        run = drive(s, *data.draw(on_time_schedules(events)), frames=kept)
    finally:
        bins_module._FORGET_KEYS_ABOVE = saved
    assert run.late == []
    check_against_oracle(run, s)
    check_streams(run, s)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_late_events_are_conserved_under_both_policies(data):
    s, events = data.draw(workloads())
    run = drive(s, *data.draw(any_schedules(events)))
    check_against_oracle(run, s)
    check_streams(run, s)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_final_bins_are_bit_identical_for_any_arrival_order_and_batching(data):
    s, events = data.draw(workloads())
    one = drive(s, *data.draw(on_time_schedules(events)))
    two = drive(s, *data.draw(on_time_schedules(events)))
    assert final_values(one) == final_values(two)


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_times_beyond_float_precision_match_the_oracle(data):
    s, events = data.draw(workloads())
    base = data.draw(st.sampled_from([2**53, 2**60, -(2**60)]))
    base -= base % s.bin_size  # keep the bins aligned with the shifted events
    shifted = [replace(e, start=e.start + base, end=e.end + base) for e in events]
    run = drive(s, *data.draw(on_time_schedules(shifted)))
    check_against_oracle(run, s)
    small = drive(s, *data.draw(on_time_schedules(events)))
    assert {(k, b + base): v for (k, b), v in final_values(small).items()} == final_values(run)
