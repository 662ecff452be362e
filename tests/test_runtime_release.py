"""GroupRuntime driven as the Spark adapter drives it — the CTI is the watermark at each
micro-batch's start, events below the batch's own ``max(start) − delay`` are released ahead of
the next CTI — checked against a brute-force oracle, and against the same run without the
early release."""

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.config import parse
from jobs.runtime import GroupRuntime, plan as make_plan
from operators.time import CTI_INFINITY, CTI_NONE, Event

DELAY = 50


def runtime(policy: str = "drop") -> GroupRuntime:
    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time", "cti": {"delay": DELAY, "policy": policy}}],
                 "operators": [{"kind": "passthrough", "output": "out"}]}, "t")
    return GroupRuntime(make_plan(cfg))


def drive(batches: list[list[Event]], ahead: bool) -> tuple[list[tuple], list[tuple], dict]:
    rt = runtime()
    out: list = []
    watermark = None
    for batch in batches:
        out += rt.advance(watermark if watermark is not None else CTI_NONE)
        out += rt.offer_many(batch)
        if batch:
            floor = max(e.start for e in batch) - DELAY
            if ahead:
                out += rt.release_ahead(floor)
            watermark = floor if watermark is None else max(watermark, floor)
    out += rt.advance(CTI_INFINITY)
    released = [(o.record["i"],) for topic, o, _ in out if topic == "out"]
    late = sorted((o.record["offset"],) for topic, o, _ in out if topic != "out")
    return released, late, vars(rt.counters)


def oracle(batches: list[list[Event]]) -> tuple[list[tuple], list[tuple]]:
    """Late: start below the CTI in force when the batch arrived (the largest start − delay of
    all earlier batches); everything else comes out sorted by (start, partition, offset)."""
    admitted, late, cti = [], [], None
    for batch in batches:
        for e in batch:
            (late if cti is not None and e.start < cti else admitted).append(e)
        if batch:
            floor = max(e.start for e in batch) - DELAY
            cti = floor if cti is None else max(cti, floor)
    admitted.sort(key=lambda e: (e.start, e.partition, e.offset))
    return [(e.fields["i"],) for e in admitted], sorted((e.offset,) for e in late)


arrivals = st.lists(st.tuples(st.integers(100, 400), st.integers(0, 1)), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(arrivals, st.lists(st.integers(0, 60), max_size=6))
def test_release_ahead_gives_the_oracle_sequence(times, cuts):
    events = [Event(f"k{i % 3}", t, t, {"i": i}, p, i, "s") for i, (t, p) in enumerate(times)]
    bounds = sorted({0, len(events), *(c for c in cuts if c < len(events))})
    batches = [events[a:b] for a, b in zip(bounds, bounds[1:])]
    released, late, counters = drive(batches, ahead=True)
    assert (released, late) == oracle(batches)
    assert drive(batches, ahead=False)[:2] == (released, late)
    assert counters["received"] == counters["released"] + counters["late"] == len(events)


def test_release_ahead_releases_within_the_batch_only_below_the_floor():
    rt = runtime()
    out = rt.offer_many([Event("a", 100, 100, {"i": 0}, 0, 0, "s"), Event("a", 170, 170, {"i": 1}, 0, 1, "s")])
    assert out == []
    got = rt.release_ahead(170 - DELAY)
    assert [o.record["i"] for _, o, _ in got] == [0]  # 170 waits: below 120 only
    assert rt.layer.buffered() == 1


def test_release_ahead_is_off_with_a_reference_stream():
    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time", "cti": {"delay": DELAY}},
                             {"name": "r", "topic": "r", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time", "shape": "edge"}],
                 "reference": {"fast": "s", "source": "r", "sync": "import", "join_field": "account"},
                 "operators": [{"kind": "passthrough", "output": "out"}]}, "t")
    rt = GroupRuntime(make_plan(cfg))
    rt.offer_many([Event("a", 100, 100, {"i": 0}, 0, 0, "s")])
    assert rt.release_ahead(10_000) == []
    assert rt.layer.buffered() == 1
