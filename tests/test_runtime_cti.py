"""CTIs per Kafka partition, with GroupRuntime driven exactly as the Spark adapter drives it:
each key group gets its own keys' events, a frontier per partition read and the batch's
partition/idle set; it checks the batch's events against the CTI the previous batch ended with,
then advances to its own CTI (+∞ at the end). Checked against brute-force oracles that know
nothing of the time layer: events within the delay of their own partition are never late,
whatever the partitions' rates, lag, read order, batch cut or number of key groups, and every
result equals the single-partition, in-order run."""

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import GroupInput
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.jobs.testing import oracle
from ctiflow.operators.time import CTI_NONE, Event, PartitionCtis, combined_cti

DELAY = 50


def job_plan(policy: str = "drop", operators=None, idle_timeout: int = 60_000):
    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time",
                              "cti": {"delay": DELAY, "policy": policy, "idle_timeout": idle_timeout}}],
                 "operators": operators or [{"kind": "passthrough", "output": "out"}]}, "t")
    return plan_job(cfg)


def drive(plan, batches: list[dict[int, list[Event]]], partitions: list[int], groups: int,
          idle: list[list[int]] | None = None) -> tuple[list, dict, list[int]]:
    """``batches``: per micro-batch, each partition's records read (in offset order). Returns
    every group's outputs (in emission order), the summed counters and each batch's CTI."""
    runtimes = [GroupRuntime(plan) for _ in range(groups)]
    out: list = []
    ctis: list[int] = []
    totals: dict[str, int] = {}
    for b, batch in enumerate(batches):
        last = b == len(batches) - 1
        for g, rt in enumerate(runtimes):
            # What the source ships: frontier rows and the control row to every group, its packs.
            got = GroupInput.of("s", batch, partitions, idle[b] if idle else [], flush=last,
                                mine=lambda e: zlib.crc32(e.key.encode()) % groups == g)
            out += rt.run_batch(got).outputs
            # snapshot/restore after every batch, as the state store does
            runtimes[g] = GroupRuntime(plan, rt.snapshot())
            if g == 0:
                ctis.append(rt.cti)
            for k, v in rt.counters.metrics().items():
                totals[k] = totals.get(k, 0) + v
    return out, totals, ctis


@st.composite
def partitioned_input(draw):
    """N partitions, uneven rates and lag; each partition's events within the delay of the
    events before them in that partition; cut into batches that take any number of records
    from any partition."""
    n = draw(st.integers(1, 4))
    events: dict[int, list[Event]] = {}
    i = 0
    for p in range(n):
        t = draw(st.integers(1_000, 5_000))  # lag: partitions start at different event times
        step = draw(st.integers(1, 40))      # rate
        mine = []
        top = None
        for off in range(draw(st.integers(0, 25))):
            t += draw(st.integers(0, step))
            jitter = draw(st.integers(0, DELAY))  # disorder within the delay of this partition
            start = t - jitter if top is None else max(t - jitter, top - DELAY)
            top = start if top is None else max(top, start)
            mine.append(Event(f"k{draw(st.integers(0, 5))}", start, start, {"i": i}, p, off, "s"))
            i += 1
        events[p] = mine
    batches: list[dict[int, list[Event]]] = []
    pos = {p: 0 for p in events}
    while any(pos[p] < len(events[p]) for p in events):
        batch = {}
        for p in events:
            k = draw(st.integers(0, 6))
            batch[p] = events[p][pos[p]:pos[p] + k]
            pos[p] += len(batch[p])
        batches.append(batch)
    batches.append({p: [] for p in events})  # the flush batch
    return events, batches


@settings(max_examples=300, deadline=None)
@given(partitioned_input(), st.integers(1, 4))
def test_events_within_their_partitions_delay_are_never_late_and_results_equal_the_in_order_run(data, groups):
    events, batches = data
    every = [e for p in sorted(events) for e in events[p]]
    out, counters, ctis = drive(job_plan(), batches, sorted(events), groups)
    assert [o for topic, o, _ in out if topic != "out"] == []  # nothing late
    assert counters["late"] == 0 and counters["received"] == counters["released"] == len(every)
    # oracle: one partition, in order — every event comes out, per key in (start, partition, offset) order
    want: dict[str, list] = {}
    for e in sorted(every, key=lambda e: (e.start, e.partition, e.offset)):
        want.setdefault(e.key, []).append(e.fields["i"])
    got: dict[str, list] = {}
    for _, o, key in out:
        got.setdefault(key, []).append(o.record["i"])
    assert got == want
    assert ctis == sorted(ctis)  # never goes back


@settings(max_examples=150, deadline=None)
@given(partitioned_input(), st.integers(1, 3))
def test_counts_per_key_equal_the_exact_count_of_the_in_order_input(data, groups):
    events, batches = data
    every = [e for p in sorted(events) for e in events[p]]
    plan = job_plan(operators=[{"kind": "count", "name": "c", "window": {"time": 200}, "epsilon": 0.01,
                                "per_key": True, "emit": "per_event", "output": "counts"}])
    out, _, _ = drive(plan, batches, sorted(events), groups)
    got = sorted((o.record["key"], o.record["time"], o.record["estimate"]) for topic, o, _ in out if topic == "counts")
    exact = oracle.sliding_counts(oracle.check(every, DELAY), "time", 200)  # one batch: nothing late
    assert len(got) == len(exact) == len(every)
    # ε = 1 % of counts ≤ 25 events: the estimate is exact
    assert got == sorted((e["key"], e["time"], float(e["exact"])) for e in exact)


def test_the_minimal_case_one_partition_twice_as_dense_is_never_late():
    # The case: p0 100 events and p1 200 events over the same 10 minutes, both in time
    # order, 100 records a batch spread evenly (50 a partition, as the source then read a backlog):
    # a global max − delay declared 126 late.
    t0 = 1_767_225_600_000
    p0 = [Event("a", t0 + i * 6000, t0 + i * 6000, {"i": i}, 0, i, "s") for i in range(100)]
    p1 = [Event("b", t0 + i * 3000, t0 + i * 3000, {"i": 100 + i}, 1, i, "s") for i in range(200)]
    spread = [i // 50 for i in range(100)] + [i // 50 for i in range(200)]
    batches = []
    for b in range(max(spread) + 1):
        batches.append({p: [e for e, n in zip(p0 + p1, spread) if n == b and e.partition == p] for p in (0, 1)})
    batches.append({0: [], 1: []})
    plan = parse_delay_plan(30_000)
    out, counters, _ = drive(plan, batches, [0, 1], 2)
    assert counters["late"] == 0 and counters["released"] == 300
    # One global max − delay (every event seen as one partition) declares the 126 late.
    as_one = [Event("x", e.start, e.start, {}, 0, 0) for e in p0 + p1]
    assert len(oracle.late_indices(as_one, 30_000, batches=spread)) == 126
    # The source now reads a backlog in shares proportional to each partition's: the partitions
    # advance alike in time, and not even one global max − delay finds one late.
    assert len(oracle.late_indices(as_one, 30_000, batches=oracle.spread_batches(p0 + p1, 100))) == 0


def parse_delay_plan(delay: int):
    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time", "cti": {"delay": delay}}],
                 "operators": [{"kind": "passthrough", "output": "out"}]}, "t")
    return plan_job(cfg)


# ---- idle partitions -----------------------------------------------------------------------

def test_an_idle_partition_stops_holding_the_cti_back_and_an_empty_one_never_does():
    clock = PartitionCtis(delay=10)
    clock.assign([0, 1, 2], idle=[2])      # partition 2 is empty: idle from the start
    clock.observe(0, 100)
    assert clock.advance() == CTI_NONE      # partition 1 has records coming: no CTI yet
    clock.observe(1, 40)
    assert clock.advance() == 30            # min(100, 40) − 10
    clock.observe(0, 500)
    assert clock.advance() == 30            # partition 1 holds it back …
    clock.assign([0, 1, 2], idle=[1, 2])    # … until it has been idle for idle_timeout
    assert clock.advance() == 490
    clock.assign([0, 1, 2], idle=[2])       # partition 1 has records again: the CTI does not go back
    assert clock.advance() == 490
    clock.observe(1, 600)
    clock.observe(0, 700)
    assert clock.advance() == 590


def test_when_every_partition_is_idle_the_cti_stays():
    clock = PartitionCtis(delay=0)
    clock.assign([0, 1], idle=[])
    clock.observe(0, 10)
    clock.observe(1, 20)
    assert clock.advance() == 10
    clock.assign([0, 1], idle=[0, 1])
    assert clock.advance() == 10


def test_streams_combine_by_min_and_a_stream_that_never_had_data_does_not_hold_back():
    fast, ref = PartitionCtis(0), PartitionCtis(0)
    fast.assign([0], [])
    fast.observe(0, 100)
    fast.advance()
    ref.assign([0], [0])                    # the reference topic is empty: idle from the start
    assert combined_cti({"fast": fast, "ref": ref}) == 100
    ref.assign([0], [])
    ref.observe(0, 40)
    ref.advance()
    assert combined_cti({"fast": fast, "ref": ref}) == 40
    ref.assign([0], [0])                    # silent now, but it had a CTI: sync min waits for it
    assert combined_cti({"fast": fast, "ref": ref}) == 40


def test_idle_partition_through_the_runtime_releases_what_the_busy_partition_passed():
    plan = job_plan()
    busy = [Event("a", t, t, {"i": i}, 0, i, "s") for i, t in enumerate(range(1000, 3000, 100))]
    rt = GroupRuntime(plan)
    quiet = Event("b", 1000, 1000, {"i": -1}, 1, 0, "s")  # partition 1 was read up to 1000, then went quiet
    out = rt.run_batch(GroupInput.of("s", {0: busy, 1: [quiet]}, [0, 1], mine=lambda e: e.key == "a")).outputs
    assert rt.cti == 1000 - DELAY and [o.record["i"] for _, o, _ in out] == []
    out = rt.run_batch(GroupInput.of("s", {}, [0, 1], idle=[1])).outputs  # idle_timeout passed
    assert rt.cti == 2900 - DELAY
    assert [o.record["i"] for _, o, _ in out] == [i for i, e in enumerate(busy) if e.start < 2900 - DELAY]
