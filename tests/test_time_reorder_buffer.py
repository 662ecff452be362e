"""ReorderBuffer: the violation policy (DROP / ADJUST) and release in application-time order."""

import json

from ctiflow.operators.time import (CTI_INFINITY, REASON_ADJUSTED, REASON_BEFORE_CTI, REASON_DROPPED,
                            REASON_EDGE_END, Event, ViolationPolicy, late_record)
from ctiflow.jobs.testing.time_layer import ReorderBuffer

LATE_FIELDS = {"stream", "key", "start", "end", "cti", "reason", "policy", "partition", "offset",
               "fields_json"}


def buffer_at(cti, policy=ViolationPolicy.DROP, handles_adjust=False):
    buf = ReorderBuffer(policy, handles_adjust)
    buf.advance(cti)
    return buf


def test_releases_in_start_then_partition_then_offset_order():
    buf = ReorderBuffer()
    events = [Event("a", 5, 5, partition=1, offset=0), Event("b", 5, 5, partition=0, offset=9),
              Event("c", 3, 3, partition=2, offset=1), Event("d", 5, 5, partition=0, offset=2)]
    for e in events:
        assert buf.offer(e) == []
    assert [e.key for e in buf.advance(CTI_INFINITY)] == ["c", "d", "b", "a"]


def test_event_at_the_cti_waits_for_the_next_cti():
    buf = ReorderBuffer()
    buf.offer(Event("a", 10, 10))
    buf.offer(Event("b", 9, 9))
    assert [e.key for e in buf.advance(10)] == ["b"]
    assert [e.key for e in buf.advance(11)] == ["a"]


def test_a_lower_cti_is_ignored():
    buf = buffer_at(10)
    assert buf.advance(5) == []
    assert buf.cti == 10
    assert buf.offer(Event("a", 7, 7))[0].record["cti"] == 10


def test_event_at_the_cti_is_not_a_violation():
    buf = buffer_at(10)
    assert buf.offer(Event("a", 10, 10)) == []
    assert len(buf) == 1


def test_drop_sends_an_event_before_the_cti_to_late_with_its_fields():
    buf = buffer_at(10)
    [out] = buf.offer(Event("a", 9, 12, {"bytes": 7}, partition=3, offset=44, stream="flows"))
    assert out.role == "late"
    assert set(out.record) == LATE_FIELDS
    assert out.record == {
        "stream": "flows", "key": "a", "start": 9, "end": 12, "cti": 10,
        "reason": REASON_DROPPED, "policy": "drop", "partition": 3, "offset": 44,
        "fields_json": json.dumps({"bytes": 7}),
    }
    assert len(buf) == 0


def test_adjust_moves_interval_start_to_cti():
    buf = buffer_at(10, ViolationPolicy.ADJUST)
    [late] = buf.offer(Event("a", 4, 15, {"x": 1}))
    assert (late.record["reason"], late.record["policy"]) == (REASON_ADJUSTED, "adjust")
    assert (late.record["start"], late.record["end"], late.record["cti"]) == (4, 15, 10)
    [released] = buf.advance(11)
    assert (released.start, released.end, released.original_start) == (10, 15, 4)
    assert released.fields == {"x": 1}


def test_adjust_is_silent_when_the_operator_accounts_for_the_dropped_share():
    buf = buffer_at(10, ViolationPolicy.ADJUST, handles_adjust=True)
    assert buf.offer(Event("a", 4, 15)) == []
    assert buf.advance(11)[0].original_start == 4


def test_adjust_drops_an_interval_wholly_before_the_cti():
    buf = buffer_at(10, ViolationPolicy.ADJUST)
    [late] = buf.offer(Event("a", 4, 10))  # [4, 10) ends at the CTI
    assert late.record["reason"] == REASON_BEFORE_CTI
    assert len(buf) == 0


def test_adjust_always_drops_a_late_point_because_it_lives_one_tick():
    buf = buffer_at(10, ViolationPolicy.ADJUST)
    [late] = buf.offer(Event("a", 9, 9))  # [9, 10)
    assert late.record["reason"] == REASON_BEFORE_CTI


def test_adjust_moves_an_edge_start_to_the_cti():
    buf = buffer_at(10, ViolationPolicy.ADJUST, handles_adjust=True)
    buf.offer(Event("a", 2, CTI_INFINITY))
    [e] = buf.advance(11)
    assert (e.start, e.end, e.original_start) == (10, CTI_INFINITY, 2)


def test_end_edge_is_checked_by_its_end_not_its_start():
    # seed: "for edge-end events, the end time must be at or after the CTI"
    buf = buffer_at(10)
    assert buf.offer(Event("a", 2, 10, edge_end=True)) == []
    assert buf.advance(10) == []  # takes effect at its end, 10
    assert [e.end for e in buf.advance(11)] == [10]


def test_end_edge_ending_before_the_cti_is_late_under_both_policies():
    for policy in ViolationPolicy:
        [late] = buffer_at(10, policy).offer(Event("a", 2, 9, edge_end=True))
        assert (late.record["reason"], late.record["policy"]) == (REASON_EDGE_END, policy.value)


def test_infinity_releases_everything():
    buf = ReorderBuffer()
    for t in (5, 1, 3):
        buf.offer(Event("k", t, t))
    assert [e.start for e in buf.advance(CTI_INFINITY)] == [1, 3, 5]
    assert len(buf) == 0


def test_release_upto_releases_below_the_merged_cti_only():
    buf = ReorderBuffer()
    for t in (1, 5, 8):
        buf.offer(Event("k", t, t))
    assert [e.start for e in buf.advance(10, release_upto=6)] == [1, 5]
    assert buf.offer(Event("k", 9, 9))[0].record["cti"] == 10


def test_snapshot_restore_keeps_cti_and_buffered_events():
    buf = buffer_at(3, ViolationPolicy.ADJUST)
    events = [Event(str(i), 10 - i, 20, {"i": i}, partition=i % 2, offset=i) for i in range(5)]
    for e in events:
        buf.offer(e)
    buf.offer(Event("late", 1, 9))
    restored = ReorderBuffer.restore(ViolationPolicy.ADJUST, buf.snapshot())
    assert restored.cti == 3
    assert restored.offer(Event("x", 2, 2)) == buf.offer(Event("x", 2, 2))
    assert [(e, e.fields) for e in restored.advance(CTI_INFINITY)] == [
        (e, e.fields) for e in buf.advance(CTI_INFINITY)
    ]


def test_late_record_is_public_and_serialises_odd_fields_with_str():
    out = late_record(Event("k", 1, 1, {"when": object}), 5, "custom", "adjust")
    assert out.record["policy"] == "adjust"
    assert json.loads(out.record["fields_json"]) == {"when": str(object)}


def test_a_snapshot_of_the_earlier_heap_layout_restores_and_releases_in_order():
    """Checkpoints written before the sorted layout hold ``(cti, events in heap order)``."""
    import heapq
    import pickle

    from ctiflow.operators.time import event_tuple

    events = [Event("k", t, t, {"i": i}, partition=i % 2, offset=i) for i, t in enumerate([50, 10, 40, 10, 30])]
    heap = [(e.start, e.partition, e.offset, e.key, e.start, e.end, i, e) for i, e in enumerate(events)]
    heapq.heapify(heap)
    old = pickle.dumps((5, [event_tuple(entry[-1]) for entry in heap]), protocol=5)
    buf = ReorderBuffer.restore(ViolationPolicy.DROP, old)
    assert buf.cti == 5 and len(buf) == 5
    released = buf.advance(45)
    assert [(e.start, e.partition, e.offset) for e in released] == [(10, 1, 1), (10, 1, 3), (30, 0, 4), (40, 0, 2)]
