"""Events as columns (:mod:`ctiflow.operators.columns`) behave as the event-at-a-time path they replace.

* :class:`ColumnTimeLayer` against the row model (``ctiflow.jobs.testing.time_layer.TimeLayer``, its own
  tests elsewhere) on random arrivals of one or two streams from several partitions with uneven
  rates, lag and out-of-order starts, duplicated offsets, both policies: the same late records,
  the same released events per CTI.
* ``Binner.process_columns`` / ``CountOperator.process_columns`` against ``process`` called
  event by event (the exact path): the same per-row outputs and refusals, the same state bytes.
* Packs read as columns give the records they were written with (nulls, nested values).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctiflow.jobs.core.rows import pack_events, unpack_columns
from ctiflow.operators.bins import Binner, BinSettings
from ctiflow.jobs.state import compat
from ctiflow.operators.columns import ColumnTimeLayer, EventColumns, merged_events
from ctiflow.operators.count import CountOperator, CountSettings
from ctiflow.operators.errors import EventRejected
from ctiflow.operators.events import CTI_INFINITY, Cti, Event, outputs_of
from ctiflow.operators.time import AdvanceTimeSettings, ViolationPolicy
from ctiflow.jobs.testing.time_layer import TimeLayer


@st.composite
def arrivals(draw, streams=("flows",)):
    """Micro-batches of events of ``streams`` from up to 4 partitions each: each partition's
    starts drift forward at its own rate with jitter (out of order within the delay and beyond
    it), offsets ascend per partition unless ``dup`` repeats them."""
    parts = draw(st.integers(1, 4))
    dup = draw(st.booleans())
    slots = [(s, p) for s in streams for p in range(parts)]
    rate = {slot: draw(st.integers(1, 40)) for slot in slots}
    clock = {slot: draw(st.integers(0, 200)) for slot in slots}
    offset = dict.fromkeys(slots, 0)
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        batch = []
        for _ in range(draw(st.integers(0, 25))):
            slot = draw(st.sampled_from(slots))
            clock[slot] += draw(st.integers(0, rate[slot]))
            start = clock[slot] - draw(st.integers(0, 60))
            length = draw(st.sampled_from([0, 0, 5, 30, 200]))
            off = offset[slot] if not dup else draw(st.integers(0, 3))
            offset[slot] += 1
            batch.append(Event(draw(st.sampled_from("abc")), start, start + length,
                               {"v": draw(st.integers(-5, 5)), "s": draw(st.sampled_from(["x", None]))},
                               slot[1], off, slot[0]))
        batches.append(batch)
    return batches


def _row(e: Event) -> tuple:
    return (e.stream, e.key, e.start, e.end, e.partition, e.offset, e.original_start, e.fields)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([("flows",), ("ref", "flows")]).flatmap(lambda s: st.tuples(st.just(s), arrivals(s))),
       st.sampled_from(list(ViolationPolicy)), st.sampled_from(list(ViolationPolicy)), st.booleans(),
       st.integers(-5, 40))
def test_column_layer_releases_and_reports_as_the_row_time_layer(drawn, policy, other_policy, handles_adjust, delay):
    """One stream, or a reference stream and a fast one with their own policies: the column
    layer's late records and, per CTI, its releases interleaved across streams
    (:func:`merged_events`) are the row model's; a snapshot in between changes nothing."""
    streams, batches = drawn
    settings_ = {name: AdvanceTimeSettings(delay=delay, frequency=None, policy=p)
                 for name, p in zip(streams, (policy, other_policy))}
    ours = ColumnTimeLayer(settings_, handles_adjust=handles_adjust)
    theirs = TimeLayer(settings_, handles_adjust=handles_adjust)
    top = None
    for i, batch in enumerate(batches):
        late_ours = []
        for _, run in itertools.groupby(batch, key=lambda e: e.stream):
            late_ours += ours.offer_columns(EventColumns.from_events(list(run)))
        late_theirs = theirs.offer_many(batch)
        assert [(_row(e), [o.record for o in outs]) for e, outs in late_ours] == \
               [(_row(e), [o.record for o in outs]) for e, outs in late_theirs]
        if batch:
            top = max([top or batch[0].start] + [e.start for e in batch])
        cti = CTI_INFINITY if i == len(batches) - 1 else (top - delay if top is not None else None)
        if cti is None:
            continue
        ours.enqueue(cti)
        for name in streams:
            theirs.enqueue_cti(Cti(cti, name))
        got_cti, runs = ours.step() if ours.has_pending else (ours.cti(), [])
        step = theirs.step()
        assert got_cti == step.cti
        assert [_row(e) for e in merged_events(runs)] == [_row(e) for e in step.released]
        ours = ColumnTimeLayer.restore(settings_, ours.snapshot(), handles_adjust)
    assert ours.buffered() == 0


@pytest.mark.parametrize("streams", [("flows",), ("ref", "flows")])
def test_column_layer_restores_a_row_time_layer_snapshot(streams):
    """State written before the layer kept columns (a reference job's always was rows): the
    old layer's CTI and held events come back, in order (:mod:`ctiflow.jobs.state.compat`)."""
    settings_ = {name: AdvanceTimeSettings(delay=10, frequency=None) for name in streams}
    old = TimeLayer(settings_)
    for name in streams:
        old.enqueue_cti(Cti(2, name))
    old.step()
    old.offer_many([Event("a", 5, 5, {"v": 1}, 0, 1, s) for s in streams] +
                   [Event("b", 3, 3, {"v": 2}, 1, 7, "flows")])
    layer = compat.time_layer(settings_, old.snapshot())
    assert layer.cti() == 2 and layer.buffered() == len(streams) + 1
    layer.enqueue(CTI_INFINITY)
    _, runs = layer.step()
    assert [(e.stream, e.key, e.start, e.partition, e.offset, e.fields) for e in merged_events(runs)] == (
        [("flows", "b", 3, 1, 7, {"v": 2})] + [(s, "a", 5, 0, 1, {"v": 1}) for s in streams])


def test_column_layer_restores_a_one_stream_column_snapshot():
    """The one-stream column layout written before 2026-11-27 ("columns", 1, …)."""
    import pickle

    settings_ = {"flows": AdvanceTimeSettings(delay=10, frequency=None)}
    held = EventColumns.from_events([Event("b", 3, 3, {"v": 2}, 1, 7, "flows")])
    arrived = [EventColumns.from_events([Event("a", 1, 1, {"v": 1}, 0, 1, "flows")])]
    layer = compat.time_layer(settings_, pickle.dumps(("columns", 1, 0, 0, held, arrived)))
    layer.enqueue(CTI_INFINITY)
    _, (released,) = layer.step()
    assert [(e.key, e.start) for e in released.events()] == [("a", 1), ("b", 3)]


@st.composite
def bin_rows(draw):
    """Rows a binner may get: mostly on time with finite measures; some late (before the
    binner's CTI), ADJUSTed, ends before starts, missing/None/str/inf measures, huge spans."""
    rows = []
    for i in range(draw(st.integers(1, 40))):
        start = draw(st.one_of(st.integers(0, 500), st.sampled_from([119, 120, 121, 239, 240, 241])))  # CTI ± 1
        end = start + draw(st.sampled_from([0, 0, 7, 60, 250, -3]))
        kind = draw(st.sampled_from(["ok"] * 6 + ["none", "str", "inf", "missing", "adjusted"]))
        fields = {"bytes": draw(st.integers(0, 1000)), "packets": draw(st.floats(0, 10, allow_nan=False))}
        original = None
        if kind == "none":
            fields["bytes"] = None
        elif kind == "str":
            fields["packets"] = "many"
        elif kind == "inf":
            fields["packets"] = math.inf
        elif kind == "missing":
            del fields["packets"]
        elif kind == "adjusted":
            original, start = start - draw(st.integers(1, 200)), start
        rows.append(Event(draw(st.sampled_from(["k1", "k2", "k3"])), start, end, fields, i % 3, i, "flows",
                          original))
    return rows


def _outcome(got) -> object:
    return str(got) if isinstance(got, EventRejected) else [(o.role, o.record) for o in got]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(bin_rows(), min_size=1, max_size=4), st.sampled_from(list(ViolationPolicy)),
       st.frozensets(st.sampled_from(["incremental", "updated", "final"]), min_size=1))
def test_binner_takes_columns_as_it_takes_events(steps, policy, outputs):
    bin_settings = BinSettings("b", bin_size=50, measures=("bytes", "packets"), outputs=outputs, policy=policy,
                               max_bins_per_event=4)
    by_event, by_columns = Binner(bin_settings), Binner(bin_settings)
    cti = 0
    for rows in steps:
        expected = []
        for j, e in enumerate(rows):
            try:
                got = by_event.process(e)
            except EventRejected as exc:
                got = exc
            if isinstance(got, EventRejected) or got:
                expected.append((j, _outcome(got)))
        assert [(j, _outcome(g)) for j, g in by_columns.process_columns(EventColumns.from_events(rows))] == expected
        cti += 120
        assert [(o.role, o.record) for o in outputs_of(by_columns.advance_to(cti))] == \
               [(o.role, o.record) for o in outputs_of(by_event.advance_to(cti))]
        assert by_columns.snapshot() == by_event.snapshot()
    assert outputs_of(by_columns.advance_to(CTI_INFINITY)) == outputs_of(by_event.advance_to(CTI_INFINITY))


@pytest.mark.parametrize("predicate,value_field,window_kind,per_key", [
    (None, None, "time", True), ("amount > 10", None, "time", True), (None, "amount", "time", True),
    ("amount > 10", None, "events", True), (None, None, "events", True), ("amount > 10", None, "time", False),
    (None, None, "events", False)])
def test_count_takes_columns_as_it_takes_events(predicate, value_field, window_kind, per_key):
    rng = np.random.default_rng(7)
    events = [Event(f"acct{rng.integers(0, 5)}", int(t), int(t),
                    {"amount": (None if rng.random() < 0.05 else -1 if rng.random() < 0.05 else int(rng.integers(0, 30)))},
                    int(rng.integers(0, 3)), i, "tx")
              for i, t in enumerate(np.sort(rng.integers(0, 10_000, 400)))]
    count_settings = CountSettings("c", window_kind=window_kind, window=2_000 if window_kind == "time" else 40,
                                   epsilon=0.1, predicate=predicate, value_field=value_field, per_key=per_key)
    by_event, by_columns = CountOperator(count_settings), CountOperator(count_settings)
    refusals = 0
    for lo in range(0, len(events), 100):
        rows = events[lo:lo + 100]
        expected = []
        for j, e in enumerate(rows):
            try:
                by_event.process(e)
            except EventRejected as exc:
                expected.append((j, str(exc)))
        got = by_columns.process_columns(EventColumns.from_events(rows))
        assert [(j, str(exc)) for j, exc in got] == expected
        refusals += len(got)
        cti = rows[-1].start
        assert [o.record for o in outputs_of(by_columns.advance_to(cti))] == [o.record for o in outputs_of(by_event.advance_to(cti))]
        assert by_columns.snapshot() == by_event.snapshot()
    assert (refusals > 0) == (value_field is not None)  # negative amounts are refused as sums


def test_packs_read_as_columns_keep_their_records():
    """Typed columns without nulls become NumPy arrays; with nulls, or strings and nested
    values, object arrays of the values as written."""
    items = [("a", 1, 2, {"n": 1, "x": 1.5, "s": "é", "maybe": None, "flag": True}, 10, b"\x00"),
             ("b", 3, 3, {"n": 2, "x": -0.0, "s": "", "maybe": 7, "flag": False}, 11, None)]
    cols = unpack_columns(pack_events(items), "flows", 2)
    assert cols.fields["n"].dtype == np.int64 and cols.fields["x"].dtype == np.float64
    assert cols.fields["maybe"].dtype == object and cols.fields["s"].dtype == object
    assert [(e.key, e.start, e.end, e.fields, e.partition, e.offset, e.raw) for e in cols.events()] == [
        (k, s, e, r, 2, o, b) for k, s, e, r, o, b in items]
    assert [type(v) for v in cols.events()[0].fields.values()] == [int, float, str, type(None), bool]


@pytest.mark.parametrize("with_key_field", [False, True])
def test_passthrough_passes_columns_on_unchanged(with_key_field):
    """``Passthrough.process_columns`` gives, in row order, each event's record, bytes and Kafka
    key (a record's ``key`` field if it has one, else the event's key) in one batch."""
    from ctiflow.operators.events import OutputBatch
    from ctiflow.operators.passthrough import Passthrough

    events = []
    for i in range(9):
        fields = {"n": i, "name": f"r{i}"}
        if with_key_field:
            fields = {"key": None if i == 4 else i * 10, **fields}
        events.append(Event(f"k{i % 3}", 100 + i, 100 + i, fields, i % 2, i, "s",
                            raw=None if i == 2 else f"bytes-{i}".encode()))
    ((row, batch),) = Passthrough().process_columns(EventColumns.from_events(events))
    assert row == 0 and type(batch) is OutputBatch and batch.role == "passthrough" and len(batch) == len(events)

    def kafka_key(e):
        if "key" not in e.fields:
            return e.key
        return None if e.fields["key"] is None else str(e.fields["key"])

    expected = [("passthrough", e.fields, e.raw, kafka_key(e)) for e in events]
    assert [(o.role, o.record, o.encoded, o.key) for o in batch.outputs()] == expected


def test_plain_field_columns_follow_takes_of_takes_and_concats():
    """Plain (dict) field columns through takes of takes — slices, integer and boolean indexes —
    and concatenation: each row keeps its own record (the oracle: the records as Python lists,
    indexed by hand); a column never read is never taken; pickled, the columns are a plain dict."""
    import pickle

    rng = np.random.default_rng(7)
    n = 40
    records = [{"n": int(i), "s": f"v{i}", "x": float(i) / 4} for i in range(n)]
    events = [Event(f"k{i % 3}", i, i + 1, r, partition=i % 2, offset=i, stream="s") for i, r in enumerate(records)]
    cols = EventColumns.from_events(events)
    rows = list(range(n))
    for index in (slice(3, 35), rng.permutation(32)[:20], rng.random(20) < 0.6, slice(None, None, -1)):
        if isinstance(index, slice):
            index = np.arange(len(cols))[index]
        cols = cols.take(index)
        rows = [rows[i] for i in (np.flatnonzero(index) if index.dtype == bool else index)]
    assert cols.fields["n"].tolist() == [records[i]["n"] for i in rows]
    assert "s" not in cols.fields._taken  # not read: not taken
    both = EventColumns.concat([cols, cols.take(np.arange(len(cols))[::2])])
    assert both.records() == [records[i] for i in rows + rows[::2]]
    loaded = pickle.loads(pickle.dumps(cols.fields))
    assert type(loaded) is dict and {k: v.tolist() for k, v in loaded.items()} == {
        name: [records[i][name] for i in rows] for name in ("n", "s", "x")}
