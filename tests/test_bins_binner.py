"""Binner: the three bin streams, when a bin is final, late shares, errors, settings, snapshots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ctiflow.operators.columns import EventColumns
from ctiflow.operators.bins import REASON_FINAL_BINS, Binner, BinSettings, late_share
from ctiflow.operators.errors import ConfigError
from ctiflow.operators.operator import Operator, Output, outputs_of
from ctiflow.operators.time import CTI_INFINITY, REASON_BEFORE_CTI, REASON_DROPPED, Event, ViolationPolicy
from ctiflow.jobs.testing.time_layer import ReorderBuffer

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def flow(key, start, end, bytes_=100, packets=1, offset=0, **kw):
    return Event(key, start, end, {"bytes": bytes_, "packets": packets}, offset=offset, stream="flows", **kw)


def binner(bin_size=60, policy=ViolationPolicy.ADJUST, outputs=("incremental", "updated", "final"), **kw):
    return Binner(BinSettings("flows", bin_size, measures=("bytes", "packets"), outputs=frozenset(outputs),
                              policy=policy, **kw))


def by_role(outputs, role):
    return [o.record for o in outputs if o.role == role]


def bins(records):
    return [(r["key"], r["bin_start"], r["measures"]["bytes"]) for r in records]


# ---- the operator contract ------------------------------------------------------------------


def test_binner_is_an_operator_that_handles_adjust():
    b = binner()
    assert isinstance(b, Operator)
    assert b.traits(b.settings).handles_adjust is True


def test_process_emits_nothing_until_a_cti():
    b = binner()
    assert b.process(flow("a", 0, 100)) == []


def test_outputs_are_tagged_with_their_role():
    b = binner()
    b.process(flow("a", 0, 30))
    out = outputs_of(b.advance_to(CTI_INFINITY))
    assert [o.role for o in out] == ["bin_incremental", "bin_updated", "bin_final"]
    assert all(isinstance(o, Output) for o in out)


def test_record_has_exactly_the_fields_of_the_bin_schema():
    b = binner()
    b.process(flow("a", 0, 100, bytes_=100, packets=10))
    out = outputs_of(b.advance_to(61))
    schema = json.loads((SCHEMAS / "bin.avsc").read_text())
    names = [f["name"] for f in schema["fields"]]
    assert by_role(out, "bin_final") == [{
        "binner": "flows", "key": "a", "bin_start": 0, "bin_end": 60,
        "measures": {"bytes": 60.0, "packets": 6.0}, "fraction_sum": 0.6, "events": 1,
        "revision": 1, "final": True, "cti": 61, "kind": "final",
    }]
    for o in out:
        assert list(o.record) == names
        assert o.record["kind"] == o.role.removeprefix("bin_")


# ---- incremental, updated, final ------------------------------------------------------------


def test_incremental_carries_only_the_events_since_the_previous_cti():
    b = binner()
    b.process(flow("a", 0, 10, bytes_=5))
    assert bins(by_role(outputs_of(b.advance_to(20)), "bin_incremental")) == [("a", 0, 5.0)]
    b.process(flow("a", 20, 30, bytes_=7))
    assert bins(by_role(outputs_of(b.advance_to(40)), "bin_incremental")) == [("a", 0, 7.0)]


def test_updated_carries_the_cumulative_value_and_counts_revisions():
    b = binner()
    b.process(flow("a", 0, 10, bytes_=5))
    first = by_role(outputs_of(b.advance_to(20)), "bin_updated")
    b.process(flow("a", 20, 30, bytes_=7))
    second = by_role(outputs_of(b.advance_to(40)), "bin_updated")
    assert [(r["measures"]["bytes"], r["revision"], r["events"]) for r in first + second] == [(5.0, 1, 1), (12.0, 2, 2)]


def test_untouched_bins_are_not_re_emitted():
    b = binner()
    b.process(flow("a", 0, 10))
    outputs_of(b.advance_to(20))
    assert outputs_of(b.advance_to(30)) == []


def test_bin_is_final_only_once_the_cti_is_past_its_end():
    b = binner()
    b.process(flow("a", 0, 10))
    assert by_role(outputs_of(b.advance_to(60)), "bin_final") == []  # a point event at 60 still belongs to (0, 60]
    final = by_role(outputs_of(b.advance_to(61)), "bin_final")
    assert [(r["bin_start"], r["revision"], r["cti"]) for r in final] == [(0, 1, 61)]


def test_point_event_at_the_cti_on_a_bin_edge_lands_in_the_still_open_bin():
    b = binner()
    b.process(flow("a", 0, 10, bytes_=1))
    outputs_of(b.advance_to(60))
    assert b.process(flow("a", 60, 60, bytes_=2)) == []
    final = by_role(outputs_of(b.advance_to(61)), "bin_final")
    assert bins(final) == [("a", 0, 3.0)]


def test_each_bin_is_final_exactly_once_and_then_leaves_the_state():
    b = binner()
    b.process(flow("a", 0, 130))
    assert b.open_bins == 3
    assert len(by_role(outputs_of(b.advance_to(121)), "bin_final")) == 2
    assert b.open_bins == 1
    assert by_role(outputs_of(b.advance_to(121)), "bin_final") == []
    assert len(by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")) == 1
    assert b.open_bins == 0


def test_last_revision_is_flagged_final_on_updated_and_incremental():
    b = binner()
    b.process(flow("a", 0, 10))
    out = outputs_of(b.advance_to(61))
    assert [(o.role, o.record["final"]) for o in out] == [
        ("bin_incremental", True), ("bin_updated", True), ("bin_final", True)]


def test_final_record_of_a_bin_not_touched_at_that_cti_carries_the_last_revision():
    b = binner()
    b.process(flow("a", 0, 10))
    outputs_of(b.advance_to(20))
    b.process(flow("a", 20, 30))
    outputs_of(b.advance_to(40))
    out = outputs_of(b.advance_to(100))
    assert [(o.role, o.record["revision"], o.record["events"]) for o in out] == [("bin_final", 2, 2)]


def test_records_are_grouped_by_role_and_sorted_by_key_then_bin_start():
    b = binner()
    for i, (key, start) in enumerate([("b", 70), ("a", 70), ("b", 10), ("c", 0), ("a", 10)]):
        b.process(flow(key, start, start + 5, offset=i))
    out = outputs_of(b.advance_to(CTI_INFINITY))
    assert [o.role for o in out] == ["bin_incremental"] * 5 + ["bin_updated"] * 5 + ["bin_final"] * 5
    order = [(r["key"], r["bin_start"]) for r in by_role(out, "bin_final")]
    assert order == [("a", 0), ("a", 60), ("b", 0), ("b", 60), ("c", 0)]
    assert [(r["key"], r["bin_start"]) for r in by_role(out, "bin_updated")] == order


@pytest.mark.parametrize("outputs", [("final",), ("incremental",), ("updated", "final")])
def test_only_the_selected_outputs_are_emitted(outputs):
    b = binner(outputs=outputs)
    b.process(flow("a", 0, 100))
    roles = {o.role for o in outputs_of(b.advance_to(CTI_INFINITY))}
    assert roles == {"bin_" + kind for kind in outputs}


def test_cti_infinity_finalises_every_bin():
    b = binner()
    b.process(flow("a", 0, 1000, bytes_=1000))
    final = by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")
    assert len(final) == 17
    assert math.fsum(r["measures"]["bytes"] for r in final) == pytest.approx(1000.0, rel=1e-12)
    assert {r["cti"] for r in final} == {CTI_INFINITY}


def test_zero_length_event_contributes_fraction_one():
    b = binner()
    b.process(flow("a", 60, 60, bytes_=9))
    final = by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")
    assert [(r["bin_start"], r["fraction_sum"], r["measures"]["bytes"]) for r in final] == [(0, 1.0, 9.0)]


def test_binner_without_measures_counts_prorated_events():
    b = Binner(BinSettings("n", 10))
    b.process(Event("a", 0, 20))
    b.process(Event("a", 5, 5))
    final = by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")
    assert [(r["bin_start"], r["fraction_sum"], r["events"], r["measures"]) for r in final] == [
        (0, 1.5, 2, {}), (10, 0.5, 1, {})]


def test_columns_refuse_a_bad_row_and_take_the_others():
    b = binner()
    got = take(b, [flow("a", 0, 10, bytes_=1), flow("a", 5, 4), flow("a", 6, 7, bytes_=100)])
    assert [(row, type(r).__name__) for row, r in got] == [(1, "EventRejected")]
    assert bins(by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")) == [("a", 0, 101.0)]


def test_columns_equal_process_one_by_one():
    events = [flow(k, t, t + d, bytes_=t + 1, offset=i)
              for i, (k, t, d) in enumerate([("a", 0, 500), ("b", 3, 0), ("a", 9, 61), ("c", 60, 0), ("b", 70, 7)])]
    one, many = binner(), binner()
    for e in events:
        one.process(e)
    take(many, events)
    assert outputs_of(one.advance_to(80)) == outputs_of(many.advance_to(80))
    assert outputs_of(one.advance_to(CTI_INFINITY)) == outputs_of(many.advance_to(CTI_INFINITY))


def take(b: Binner, events) -> list:
    """``events`` into ``b`` in one ``process_columns`` call (as the runtime feeds it)."""
    events = list(events)
    return b.process_columns(EventColumns.from_events(events)) if events else []


def test_measures_given_as_int_and_float_are_summed_as_floats():
    b = Binner(BinSettings("f", 60, measures=("x",)))
    b.process(Event("a", 0, 10, {"x": 3}))
    b.process(Event("a", 0, 10, {"x": 0.5}))
    assert by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")[0]["measures"] == {"x": 3.5}


def test_times_beyond_float_precision_are_prorated_exactly():
    t = 2**60
    b = binner(bin_size=3)
    b.process(flow("a", t + 1, t + 4, bytes_=3))
    final = by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")
    # 2**60 ≡ 1 (mod 3): bins (t − 1, t + 2], (t + 2, t + 5]
    assert [(r["bin_start"], r["measures"]["bytes"]) for r in final] == [(t - 1, 1.0), (t + 2, 2.0)]


# ---- late events ----------------------------------------------------------------------------


def test_adjusted_event_applies_open_bins_with_its_original_duration():
    b = binner()
    b.process(flow("a", 0, 10, bytes_=0))
    outputs_of(b.advance_to(121))  # bins (0,60], (60,120] are final
    out = b.process(flow("a", 121, 180, bytes_=180, packets=18, original_start=0))
    assert [o.role for o in out] == ["late"]
    late = out[0].record
    assert (late["start"], late["end"], late["cti"], late["reason"]) == (0, 180, 121, REASON_FINAL_BINS)
    assert late["fraction"] == pytest.approx(2 / 3)
    assert late["measures"] == pytest.approx({"bytes": 120.0, "packets": 12.0})
    final = by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")
    assert bins(final) == [("a", 120, 60.0)]
    assert final[0]["fraction_sum"] == pytest.approx(1 / 3)


def test_adjusted_event_touching_no_final_bin_has_no_late_record():
    b = binner()
    outputs_of(b.advance_to(60))  # (0, 60] is still open at CTI 60
    assert b.process(flow("a", 60, 90, bytes_=90, original_start=30)) == []
    final = by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")
    assert bins(final) == [("a", 0, 45.0), ("a", 60, 45.0)]


def test_behind_the_reorder_buffer_an_adjusted_event_is_reported_late_once():
    buffer = ReorderBuffer(ViolationPolicy.ADJUST, handles_adjust=True)  # (the binner accounts for the dropped share: its traits say so)
    b = binner()
    late = buffer.offer(flow("a", 0, 10))
    buffer.advance(121)
    take(b, buffer.advance(121))
    outputs_of(b.advance_to(121))
    late += buffer.offer(flow("a", 30, 180, bytes_=150, offset=1))  # behind CTI 121: start moved to 121
    assert late == []
    for event in buffer.advance(200):
        late += b.process(event)
    assert [(o.record["start"], o.record["cti"]) for o in late] == [(30, 121)]
    assert late[0].record["fraction"] == pytest.approx(0.6)  # (60 − 30)/150 + 60/150
    assert late[0].record["measures"] == pytest.approx({"bytes": 90.0, "packets": 0.6})
    final = by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final")
    assert bins(final) == [("a", 120, 60.0)]


def test_late_record_is_the_time_layers_record_plus_fraction_and_measures():
    b = binner()
    outputs_of(b.advance_to(100))
    late = b.process(flow("a", 100, 200, original_start=0, offset=42))[0].record
    schema = json.loads((SCHEMAS / "late.avsc").read_text())
    assert set(late) == {f["name"] for f in schema["fields"]}
    assert (late["stream"], late["key"], late["partition"], late["offset"], late["policy"]) == (
        "flows", "a", 0, 42, "adjust")
    assert json.loads(late["fields_json"]) == {"bytes": 100, "packets": 1}


def test_late_share_with_drop_is_the_whole_event():
    s = BinSettings("flows", 60, measures=("bytes",), policy=ViolationPolicy.DROP)
    late = late_share(flow("a", 10, 130, bytes_=120), 100, s)
    assert (late["reason"], late["fraction"], late["measures"], late["cti"]) == (
        REASON_DROPPED, 1.0, {"bytes": 120.0}, 100)


def test_late_share_with_adjust_is_the_share_of_final_bins():
    s = BinSettings("flows", 60, measures=("bytes",), policy=ViolationPolicy.ADJUST)
    late = late_share(flow("a", 0, 240, bytes_=240), 121, s)
    assert (late["reason"], late["measures"]) == (REASON_FINAL_BINS, {"bytes": 120.0})


def test_late_share_with_adjust_of_an_event_ending_by_the_cti_is_the_whole_event():
    s = BinSettings("flows", 60, measures=("bytes",), policy=ViolationPolicy.ADJUST)
    late = late_share(flow("a", 0, 100, bytes_=5), 100, s)
    assert (late["reason"], late["fraction"]) == (REASON_BEFORE_CTI, 1.0)


def test_late_share_of_an_event_the_cti_has_not_passed_is_none():
    s = BinSettings("flows", 60, measures=("bytes",), policy=ViolationPolicy.DROP)
    assert late_share(flow("a", 100, 100), 100, s) is None


def test_event_behind_the_cti_under_drop_goes_wholly_to_late():
    b = binner(policy=ViolationPolicy.DROP)
    outputs_of(b.advance_to(100))
    out = b.process(flow("a", 50, 150, bytes_=10))
    assert [(o.role, o.record["fraction"]) for o in out] == [("late", 1.0)]
    assert by_role(outputs_of(b.advance_to(CTI_INFINITY)), "bin_final") == []


# ---- bad input and bad settings -------------------------------------------------------------


@pytest.mark.parametrize("event, match", [
    (flow("a", 10, 9), "ends before it starts"),
    (Event("a", 0, 10, {"bytes": 1}), "lacks measure field"),
    (Event("a", 0, 10, {"bytes": "12", "packets": 1}), "not a number"),
    (Event("a", 0, 10, {"bytes": None, "packets": 1}), "not a number"),
    (Event("a", 0, 10, {"bytes": float("nan"), "packets": 1}), "not a finite number"),
    (Event("a", 0, 10, {"bytes": 10**400, "packets": 1}), "not a finite number"),
    (flow("a", 0, CTI_INFINITY), "open-ended"),
    (flow("a", 0, 60 * 10_000), "max_bins_per_event"),
])
def test_bad_event_raises_value_error_and_leaves_state_unchanged(event, match):
    b = binner(max_bins_per_event=1000)
    b.process(flow("a", 0, 10, bytes_=1))
    before = b.snapshot()
    with pytest.raises(ValueError, match=match):
        b.process(event)
    assert b.snapshot() == before


def test_cti_never_goes_back():
    b = binner()
    outputs_of(b.advance_to(10))
    with pytest.raises(ValueError, match="CTI went back"):
        outputs_of(b.advance_to(9))


@pytest.mark.parametrize("kwargs, match", [
    (dict(bin_size=0), '"bin_size"'),
    (dict(bin_size=1.5), '"bin_size"'),
    (dict(bin_size=60, origin=2**62), '"origin"'),
    (dict(bin_size=60, outputs=frozenset({"final", "partial"})),
     'Invalid "outputs" value: \'partial\'. Valid choices are: final, incremental, updated.'),
    (dict(bin_size=60, outputs=frozenset()), '"outputs"'),
    (dict(bin_size=60, measures=("a", "a")), '"measures"'),
    (dict(bin_size=60, policy="ignore"), '"policy"'),
])
def test_bad_settings_raise_config_error_naming_the_field(kwargs, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(".", r"\.")):
        BinSettings("flows", **kwargs)


def test_settings_accept_plain_values():
    s = BinSettings("flows", 60, measures=["bytes"], outputs=["final"], policy="adjust")
    assert (s.measures, s.outputs, s.policy) == (("bytes",), frozenset({"final"}), ViolationPolicy.ADJUST)


# ---- snapshot / restore ---------------------------------------------------------------------


def test_restored_binner_behaves_identically():
    a = binner()
    a.process(flow("x", 0, 200, bytes_=7))
    outputs_of(a.advance_to(70))
    a.process(flow("y", 80, 90, bytes_=3))
    a.process(flow("x", 95, 95, bytes_=1))
    b = Binner.restore(a.settings, a.snapshot())
    assert b.cti == a.cti == 70
    assert outputs_of(b.advance_to(130)) == outputs_of(a.advance_to(130))
    assert outputs_of(b.advance_to(CTI_INFINITY)) == outputs_of(a.advance_to(CTI_INFINITY))


def test_snapshot_of_many_keys_is_compact():
    b = binner()
    take(b, [flow(f"host-{i:04d}", 0, 100, offset=i) for i in range(5000)])
    outputs_of(b.advance_to(10))
    data = b.snapshot()
    assert len(data) < 5000 * 2 * 80  # two open bins a key: 56 bytes of columns + its share of the key
    restored = Binner.restore(b.settings, data)
    assert outputs_of(restored.advance_to(CTI_INFINITY)) == outputs_of(b.advance_to(CTI_INFINITY))


def test_restore_with_a_different_bin_size_is_refused():
    b = binner()
    with pytest.raises(ConfigError, match='"bin_size"'):
        Binner.restore(BinSettings("flows", 30, measures=("bytes", "packets")), b.snapshot())


def test_restore_may_change_the_selected_outputs():
    a = binner()
    a.process(flow("x", 0, 10))
    final_only = BinSettings("flows", 60, measures=("bytes", "packets"), outputs=frozenset({"final"}))
    b = Binner.restore(final_only, a.snapshot())
    assert [o.role for o in outputs_of(b.advance_to(CTI_INFINITY))] == ["bin_final"]


def test_keys_without_open_bins_are_forgotten_and_open_ones_kept():
    b = binner()
    b.process(flow("stay", -1, 1000, bytes_=1001))
    for step in range(5):
        take(b, [flow(f"k{step}-{i}", step * 100, step * 100 + 10, offset=i) for i in range(1000)])
        outputs_of(b.advance_to(step * 100 + 99))
    assert len(b._keys) <= 1024 + 1
    b.process(flow("k4-1", 500, 510))
    out = outputs_of(b.advance_to(CTI_INFINITY))
    final = by_role(out, "bin_final")
    assert [(r["key"], r["bin_start"]) for r in final if r["key"] != "stay"] == [("k4-1", 480)]
    stay = [r for r in by_role(out, "bin_final") if r["key"] == "stay"]
    assert [r["bin_start"] for r in stay] == list(range(480, 1000, 60))


def test_a_snapshot_listing_a_key_twice_or_out_of_order_is_refused():
    """The snapshot's keys are one sorted column (ids are rows, found by binary search): a key
    listed twice or the column out of order would find wrong bins, so the restore refuses it."""
    import struct

    from ctiflow.operators.bins import _SNAPSHOT_MAGIC as MAGIC

    b = binner()
    b.process(flow("y", 10, 20, bytes_=3))
    b.process(flow("x", 0, 200, bytes_=7))
    data = b.snapshot()
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    at = len(MAGIC) + 4
    header = json.loads(data[at: at + hlen])
    assert (header["keys"], header["width"]) == (2, 2)
    names = at + hlen
    assert data[names: names + 4] == b"x\x01y\x01"  # (sorted, though y came first)
    for wrong in (b"x\x01x\x01", b"y\x01x\x01"):
        tampered = data[:names] + wrong + data[names + 4:]
        with pytest.raises(ValueError, match="listed twice"):
            Binner.restore(b.settings, tampered)
    assert outputs_of(Binner.restore(b.settings, data).advance_to(CTI_INFINITY)) == outputs_of(b.advance_to(CTI_INFINITY))


def test_a_snapshot_of_version_2_restores_and_goes_on_as_that_version_did():
    """``tests/data/state/bins-v2-2026-12-01.pkl.gz``, written by 8d5a0a4 (the keys a JSON list;
    ``record_bins_v2.py`` beside it): restored here, the same events give the records that version
    gave, and a snapshot taken here (version 3) restores to the same records too."""
    import gzip
    import pickle

    with gzip.open(Path(__file__).parent / "data" / "state" / "bins-v2-2026-12-01.pkl.gz") as f:
        recorded = pickle.load(f)
    assert recorded["snapshot"].startswith(b"CTIFLOW-BINS\x02")
    events = [flow(key, s, e, bytes_=fields["bytes"], packets=fields["packets"], offset=off)
              for key, s, e, fields, off in recorded["after"]]

    def run(b):
        got = []
        for j, e in enumerate(events):
            b.process(e)
            if j % 5 == 4:
                got.append([(o.role, o.record) for o in outputs_of(b.advance_to(e.start))])
        got.append([(o.role, o.record) for o in outputs_of(b.advance_to(CTI_INFINITY))])
        return got

    settings = binner().settings
    assert run(Binner.restore(settings, recorded["snapshot"])) == recorded["outputs"]
    again = Binner.restore(settings, Binner.restore(settings, recorded["snapshot"]).snapshot())
    assert run(again) == recorded["outputs"]


def test_the_key_table_finds_adds_and_sorts_keys_as_a_dict_would():
    """``_Keys`` (a snapshot's keys as a sorted UTF-8 column, keys added since in a list) against a
    dict: lookups of a few keys (binary search) and of many (the column made strings once), keys
    added, the ids' keys, and a sorted table of a subset naming the same keys."""
    import random

    import numpy as np

    from ctiflow.operators.bins import _Keys
    from ctiflow.operators.packed import names_of

    rng = random.Random(11)
    alphabet = "ab0ÄЖ日\x00🙂"
    pool = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 8))) for _ in range(3_000)})
    for asked in (5, 100, 2_000):  # (≤ and > an eighth of the column)
        held = sorted(rng.sample(pool, 1_000))
        table = _Keys(np.sort(names_of(held)))
        column_order = lambda k: k.encode() + b"\x01"  # noqa: E731 (each key followed by END, as names_of)
        oracle = {k: i for i, k in enumerate(sorted(held, key=column_order))}
        probe = [rng.choice(pool) for _ in range(asked)]
        assert table.find(probe).tolist() == [oracle.get(k, -1) for k in probe]
        got = table.ids_of(probe).tolist()
        for k in probe:
            oracle.setdefault(k, len(oracle))
        assert got == [oracle[k] for k in probe]
        assert len(table) == len(oracle)
        ids = np.array(rng.sample(range(len(oracle)), 300))
        by_id = {i: k for k, i in oracle.items()}
        assert table.keys_of(ids) == [by_id[i] for i in ids.tolist()]
        used = np.unique(ids)
        part, new_id = table.sorted_of(used)
        assert part.keys_of(new_id) == [by_id[i] for i in used.tolist()]
        assert part.keys_of(np.arange(len(part))) == sorted((by_id[i] for i in used.tolist()), key=column_order)
        # another table's keys (a frame's: a sorted column and keys added since) found here by name,
        # those not here added; keys of every width, some here only as added ones
        sorted_part = set(rng.sample(pool, 200))
        other = _Keys(np.sort(names_of(list(sorted_part))), [k for k in rng.sample(pool, 30) if k not in sorted_part])
        theirs = other.keys_of(np.arange(len(other)))
        got = table.ids_of_table(other).tolist()
        for k in theirs:
            oracle.setdefault(k, len(oracle))
        assert got == [oracle[k] for k in theirs] and len(table) == len(oracle)
