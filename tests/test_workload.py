"""Sample workloads: deterministic, schema-valid, with the planted scenarios, bounded disorder and
late events the docstring of ``ctiflow.jobs.testing.workload`` promises; bad records that each fail as labelled."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import fastavro
import pytest
from fastavro.validation import validate_many

from ctiflow.jobs.avro.serde import AvroDeserializer, default_store
from ctiflow.jobs.testing import oracle, workload
from ctiflow.operators.errors import ConfigError, DecodeError

N = 3000


def schema(name: str):
    return default_store().get(name).parsed


def field_names(name: str) -> list[str]:
    return [f["name"] for f in json.loads(default_store().get(name).text)["fields"]]


def lateness(records: list[dict], field: str) -> list[int]:
    """Per record (arrival order): how far its time lies behind the newest time arrived before it."""
    out, newest = [], None
    for r in records:
        out.append(0 if newest is None else max(0, newest - r[field]))
        newest = r[field] if newest is None else max(newest, r[field])
    return out


@pytest.fixture(scope="module")
def tx() -> list[dict]:
    return workload.transactions(N, accounts=200, seed=3)


@pytest.fixture(scope="module")
def fl() -> list[dict]:
    return workload.flows(N, devices=10, seed=3)


# ---- determinism and schemas -----------------------------------------------------------------


def test_same_seed_gives_the_same_records():
    assert workload.transactions(500, seed=11) == workload.transactions(500, seed=11)
    assert workload.flows(500, seed=11) == workload.flows(500, seed=11)
    assert workload.accounts(100, seed=11) == workload.accounts(100, seed=11)
    assert workload.bad_records(20, seed=11) == workload.bad_records(20, seed=11)


def test_another_seed_gives_other_records():
    assert workload.transactions(200, seed=1) != workload.transactions(200, seed=2)
    assert workload.flows(200, seed=1) != workload.flows(200, seed=2)
    assert workload.accounts(50, seed=1) != workload.accounts(50, seed=2)


@pytest.mark.parametrize("name, make", [
    ("transaction", lambda: workload.transactions(N, accounts=200, seed=3, late_fraction=0.01)),
    ("flow", lambda: workload.flows(N, devices=10, seed=3, late_fraction=0.01)),
    ("account", lambda: workload.accounts(300, seed=3)),
])
def test_records_validate_against_their_schema_field_by_field(name, make):
    records = make()
    assert validate_many(records, schema(name), raise_errors=True)
    assert all(list(r) == field_names(name) for r in records)


def test_times_are_integer_ms_since_epoch(tx, fl):
    for r in tx:
        assert type(r["event_time"]) is int and r["event_time"] >= workload.DEFAULT_START_MS
    for r in fl:
        assert type(r["start_time"]) is int and type(r["end_time"]) is int


def test_n_records_with_unique_ids(tx, fl):
    assert len(tx) == N and len({r["id"] for r in tx}) == N
    assert len(fl) == N and len({r["id"] for r in fl}) == N


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="late_fraction"):
        workload.transactions(10, late_fraction=2)
    with pytest.raises(ConfigError, match="rate_per_s"):
        workload.flows(10, rate_per_s=0)


# ---- transactions ----------------------------------------------------------------------------


def test_transactions_are_mostly_purchases_with_every_type(tx):
    types = Counter(r["type"] for r in tx)
    assert set(types) == set(workload.TRANSACTION_TYPES)
    assert types["purchase"] > N / 2


def test_accounts_are_named_acct_and_four_digits(tx):
    assert all(len(r["account"]) == len("acct-0042") and r["account"].startswith("acct-") for r in tx)


def test_logins_have_no_amount_and_no_merchant(tx):
    logins = [r for r in tx if r["type"].startswith("login")]
    assert logins and all(r["amount"] == 0.0 and r["merchant"] is None for r in logins)


def test_amounts_include_occasional_high_value_ones(tx):
    high = [r for r in tx if r["amount"] > workload.HIGH_VALUE]
    assert 0 < len(high) < 0.05 * N


def test_countries_are_mostly_the_home_country(tx):
    home = sum(r["country"] == workload.home_country(int(r["account"][5:]), 3) for r in tx)
    assert 0.9 * N < home < N


def test_login_bursts_are_planted(tx):
    bursts = workload.login_bursts(tx)
    assert len(bursts) >= 0.5 * 0.01 * N
    for b in bursts:
        assert [e["type"] for e in b] == ["login_failed"] * 3 + ["login_ok"]
        assert len({e["account"] for e in b}) == 1


def test_country_hops_are_planted_within_ten_minutes_and_end_large(tx):
    hops = workload.country_hops(tx)
    assert len(hops) >= 0.5 * 0.01 * N
    for a, b, c in hops:
        assert a["type"] == b["type"] == "purchase" and a["country"] != b["country"]
        assert c["event_time"] - a["event_time"] <= workload.HOP_WINDOW_MS
        assert c["type"] == "purchase" and c["amount"] > max(workload.RISK_THRESHOLDS)


def test_small_workload_still_has_one_scenario_of_each_kind():
    small = workload.transactions(60, accounts=50, seed=5, scenario_rate=0.001)
    assert workload.login_bursts(small) and workload.country_hops(small)


def test_no_scenarios_when_scenario_rate_is_zero():
    assert not workload.country_hops(workload.transactions(N, accounts=200, seed=3, scenario_rate=0.0))


def test_arrival_order_differs_from_time_order(tx):
    times = [r["event_time"] for r in tx]
    assert times != sorted(times)


def test_arrival_disorder_is_bounded_by_disorder_ms():
    records = workload.transactions(N, accounts=200, seed=3, disorder_ms=1_500)
    assert max(lateness(records, "event_time")) <= 1_500


def test_late_events_arrive_far_behind_their_time():
    late_by, disorder = 20_000, 2_000
    records = workload.transactions(N, accounts=200, seed=3, late_fraction=0.05, late_by_ms=late_by,
                                    disorder_ms=disorder)
    newest = max(r["event_time"] for r in records)
    # events whose delayed arrival still falls inside the stream have many newer ones before them
    inside = [(r, d) for r, d in zip(records, lateness(records, "event_time"))
              if r["event_time"] + late_by + disorder < newest]
    assert all(d <= disorder or d >= late_by - 2 * disorder for _, d in inside)
    far = sum(d > disorder for _, d in inside)
    assert 0.02 * len(inside) < far < 0.08 * len(inside)


def test_lateness_changes_the_order_not_the_records(tx):
    late = workload.transactions(N, accounts=200, seed=3, late_fraction=0.1, disorder_ms=9_000)
    assert late != tx
    assert sorted(late, key=lambda r: r["id"]) == sorted(tx, key=lambda r: r["id"])


def test_planted_scenario_events_are_never_made_late():
    records = workload.transactions(N, accounts=200, seed=3, late_fraction=0.3, late_by_ms=600_000)
    behind = dict(zip((r["id"] for r in records), lateness(records, "event_time")))
    planted = [e for b in workload.login_bursts(records) for e in b]
    assert planted and all(behind[e["id"]] <= 2_000 for e in planted)


def test_no_transaction_is_late_when_the_delay_covers_the_disorder(tx):
    events = oracle.to_events(tx, "account", "event_time")
    assert oracle.late_indices(events, delay=2_000, cuts=oracle.even_cuts(len(events), 97)) == set()


# ---- flows -----------------------------------------------------------------------------------


def test_flow_durations_span_zero_to_five_minutes(fl):
    durations = [r["end_time"] - r["start_time"] for r in fl]
    assert min(durations) == 0 and max(durations) <= workload.MAX_FLOW_MS
    assert sum(d == 0 for d in durations) > 0.05 * N
    assert sum(d > 60_000 for d in durations) > 0


def test_some_flows_lie_exactly_on_minute_boundaries(fl):
    on_edges = [r for r in fl if r["start_time"] % 60_000 == 0 and r["end_time"] % 60_000 == 0
                and r["end_time"] > r["start_time"]]
    assert len(on_edges) > 0.05 * N


def test_flow_measures_are_positive_whole_numbers(fl):
    for r in fl:
        assert r["bytes"] >= 60 and r["packets"] >= 1
        assert r["bytes"].is_integer() and r["packets"].is_integer()
        assert r["protocol"] in workload.PROTOCOLS


def test_flows_arrive_by_end_time_within_the_disorder(fl):
    assert max(lateness(fl, "end_time")) <= 2_000
    starts = [r["start_time"] for r in fl]
    assert starts != sorted(starts)


def test_no_flow_is_late_when_the_delay_covers_five_minutes_and_the_disorder(fl):
    events = oracle.to_events(fl, "device", "start_time", "end_time")
    cuts = oracle.even_cuts(len(events), 50)
    assert oracle.late_indices(events, workload.MAX_FLOW_MS + 2_000, cuts) == set()
    slow = dict(devices=10, seed=3, rate_per_s=2.0)  # 1500 s of flows: late ones arrive within them
    events = oracle.to_events(workload.flows(N, **slow), "device", "start_time", "end_time")
    assert oracle.late_indices(events, workload.MAX_FLOW_MS + 2_000, cuts) == set()
    events = oracle.to_events(workload.flows(N, late_fraction=0.05, **slow), "device", "start_time", "end_time")
    assert len(oracle.late_indices(events, workload.MAX_FLOW_MS + 2_000, cuts)) > 0.02 * N


# ---- accounts --------------------------------------------------------------------------------


def test_every_account_has_a_first_version_at_the_start():
    records = workload.accounts(200, versions=50, seed=3, start_ms=1_000_000)
    first = records[:200]
    assert [r["account"] for r in first] == [workload.account_name(i, 200) for i in range(200)]
    assert all(r["valid_from"] == 1_000_000 for r in first)
    assert all(r["home_country"] == workload.home_country(i, 3) for i, r in enumerate(first))


def test_later_versions_arrive_in_valid_from_order_within_the_span():
    records = workload.accounts(200, versions=50, seed=3, start_ms=1_000_000, span_ms=60_000)
    later = records[200:]
    assert len(later) == 50
    assert [r["valid_from"] for r in later] == sorted(r["valid_from"] for r in later)
    assert all(1_000_000 < r["valid_from"] <= 1_060_000 for r in later)
    assert len({(r["account"], r["valid_from"]) for r in records}) == len(records)


def test_risk_thresholds_stay_below_the_large_amount():
    records = workload.accounts(500, versions=500, seed=3)
    assert max(r["risk_threshold"] for r in records) < workload.LARGE_AMOUNT
    assert {r["tier"] for r in records} == set(workload.TIERS)


# ---- JSON lines ------------------------------------------------------------------------------


def test_jsonl_round_trips(tmp_path, tx):
    path = workload.write_jsonl(tx[:100], tmp_path / "sub" / "tx.jsonl")
    assert workload.read_jsonl(path) == tx[:100]
    assert path.read_text().count("\n") == 100


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{oops\n')
    with pytest.raises(ConfigError, match="bad.jsonl:3"):
        workload.read_jsonl(path)


# ---- bad records -----------------------------------------------------------------------------

#: What the deserializer (no registry) must say for each kind that fails to decode.
DECODE_ERRORS = {
    "random_bytes": ("not Avro: unknown magic byte",),
    "truncated": ("not Avro: unknown magic byte 0xc3", "truncated single-object header", "does not decode"),
    "unknown_fingerprint": ("unknown schema fingerprint",),
    "unknown_schema_id": ("no schema registry is configured",),
    "huge_string": ("bytes left",),  # a length past the end of the record
}
#: What the source's validation must say for each kind that decodes but is rejected.
VALIDATE_ERRORS = {
    "null_event_time": "missing event time",
    "absurd_event_time": "absurd event time",
    "flow_end_before_start": "end < start",
    "flow_non_finite_bytes": "measures must be finite numbers",
}


@pytest.fixture(scope="module")
def bad() -> list[tuple[str, bytes]]:
    return workload.bad_records(5 * len(workload.BAD_KINDS), seed=3)


def test_bad_records_contain_every_kind(bad):
    assert Counter(k for k, _ in bad) == {k: 5 for k in workload.BAD_KINDS}
    assert set(DECODE_ERRORS) | set(VALIDATE_ERRORS) == set(workload.BAD_KINDS)
    assert all(isinstance(v, bytes) and v for _, v in bad)


def test_undecodable_kinds_fail_to_decode_for_the_intended_reason(bad):
    for kind, value in bad:
        schema_name, stage = workload.BAD_KINDS[kind]
        if stage != "decode":
            continue
        with pytest.raises(DecodeError) as err:
            AvroDeserializer(schema_name)(value)
        assert any(m in str(err.value) for m in DECODE_ERRORS[kind]), (kind, str(err.value))


def test_unknown_schema_id_is_unknown_to_a_registry_too(bad):
    from ctiflow.jobs.avro.serde import registry_client

    decode = AvroDeserializer("transaction", registry=registry_client("mock://workload-test"))
    for kind, value in bad:
        if kind == "unknown_schema_id":
            with pytest.raises(DecodeError, match="unknown schema id"):
                decode(value)


def test_decodable_kinds_carry_the_intended_defect(bad):
    for kind, value in bad:
        schema_name, stage = workload.BAD_KINDS[kind]
        if stage != "validate":
            continue
        rec = AvroDeserializer(schema_name)(value)
        if kind == "null_event_time":
            assert rec["event_time"] is None
        elif kind == "absurd_event_time":
            assert rec["event_time"] in workload.ABSURD_TIMES
        elif kind == "flow_end_before_start":
            assert rec["end_time"] < rec["start_time"]
        else:
            assert not math.isfinite(rec["bytes"])


class _Message:
    """Just enough of confluent-kafka's Message for the source's decoder."""

    def __init__(self, value: bytes, offset: int, partition: int = 0, key: bytes | None = None, ts: int = 0):
        self._value, self._offset, self._partition, self._key, self._ts = value, offset, partition, key, ts

    def value(self):
        return self._value

    def key(self):
        return self._key

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def timestamp(self):
        return (1, self._ts)


SOURCE_OPTIONS = {
    "transaction": {"schema": "transaction", "topic": "transactions", "key_field": "account",
                    "time_field": "event_time"},
    "flow": {"schema": "flow", "topic": "flows", "key_field": "device", "time_field": "start_time",
             "end_field": "end_time", "shape": "interval", "measures": '["bytes", "packets"]'},
}


def test_the_source_dead_letters_every_bad_record_at_the_intended_stage(bad):
    pytest.importorskip("pyspark")
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder

    for schema_name, options in SOURCE_OPTIONS.items():
        mine = [(k, v) for k, v in bad if workload.BAD_KINDS[k][0] == schema_name]
        good = workload.transactions(3) if schema_name == "transaction" else workload.flows(3)
        from ctiflow.jobs.avro.serde import AvroSerializer

        values = [v for _, v in mine] + [AvroSerializer(schema_name)(r) for r in good]
        decoder = RecordDecoder(options)
        rows = decoder.batch([_Message(v, i) for i, v in enumerate(values)]).to_pylist()
        dead = {r["meta_offset"]: r["meta_error"] for r in rows if r["meta_error"] is not None}
        for i, (kind, _) in enumerate(mine):
            stage = workload.BAD_KINDS[kind][1]
            error = dead.get(i)
            assert error is not None and error.startswith(f"{stage}:"), (kind, error)
            if stage == "validate":
                assert VALIDATE_ERRORS[kind] in error, (kind, error)
        assert sorted(dead) == list(range(len(mine)))  # the good records are all packed


@pytest.mark.parametrize("values", ["all", "errors"])
def test_the_operator_pipelines_rows_pack_each_key_groups_records(bad, values):
    """``columns=packed``: one row per key group (``crc32(key) mod G``, then the group's label)
    holding its records in offset order, with the largest start and the first offset; one row
    per failed record; Avro bytes with the records only with ``values=all``."""
    pytest.importorskip("pyspark")
    import zlib

    from ctiflow.jobs.core.rows import pack_items
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder

    good = workload.transactions(40, seed=7)
    mine = [v for k, v in bad if workload.BAD_KINDS[k][0] == "transaction"]
    encoded = [AvroSerializer("transaction")(r) for r in good] + mine
    labels = [11, 5, 23, 42]
    decoder = RecordDecoder({**SOURCE_OPTIONS["transaction"], "key_groups": "4", "values": values,
                             "group_labels": json.dumps(labels)})
    msgs = [_Message(v, i, partition=3, key=f"k{i}".encode(), ts=1000 + i) for i, v in enumerate(encoded)]
    rows = decoder.batch(msgs).to_pylist()
    assert "amount" not in rows[0]
    packs = [r for r in rows if r["meta_pack"] is not None]
    expected: dict[int, list] = {}
    for i, (rec, value) in enumerate(zip(good, encoded)):
        group = labels[zlib.crc32(rec["account"].encode()) % 4]
        expected.setdefault(group, []).append(
            (rec["account"], rec["event_time"], rec["event_time"], rec, i, value if values == "all" else None))
    assert {r["meta_group"]: pack_items(r["meta_pack"]) for r in packs} == expected
    for r in packs:
        group = expected[r["meta_group"]]
        assert (r["meta_start"], r["meta_offset"], r["meta_error"]) == (max(e[1] for e in group), group[0][4], None)
    failed = [r for r in rows if r["meta_pack"] is None]
    assert [r["meta_value"] for r in failed] == mine
    assert all(r["meta_error"] and r["meta_group"] == labels[3 % 4] and r["meta_partition"] == 3 for r in failed)
    offsets = list(range(len(good), len(encoded)))
    assert [r["meta_offset"] for r in failed] == offsets
    assert [(r["meta_raw_key"], r["meta_kafka_ts"]) for r in failed] == [(f"k{i}".encode(), 1000 + i) for i in offsets]
    assert all(r["meta_partition"] == 3 for r in packs)


def test_a_fetch_larger_than_a_pack_splits_each_key_groups_records_into_consecutive_runs():
    """Packs stay under about PACK_BYTES (a larger one is a "humongous" object in the driver
    JVM): a group's records go in several packs, each a run of consecutive records; sorted by
    first offset (as the adapter does) and concatenated they are the group's records in order."""
    pytest.importorskip("pyspark")
    import zlib

    from ctiflow.jobs.core.rows import PACK_BYTES, pack_items
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder

    good = workload.transactions(6000, seed=11)
    encoded = [AvroSerializer("transaction")(r) for r in good]
    decoder = RecordDecoder({**SOURCE_OPTIONS["transaction"], "key_groups": "2", "values": "all",
                             "group_labels": "[0, 1]"})
    rows = decoder.batch([_Message(v, 500 + i, partition=1) for i, v in enumerate(encoded)]).to_pylist()
    expected: dict[int, list] = {}
    for i, rec in enumerate(good):
        expected.setdefault(zlib.crc32(rec["account"].encode()) % 2, []).append(500 + i)
    assert sum(len(v) for v in expected.values()) == len(good)
    for group, offsets in expected.items():
        mine = sorted((r for r in rows if r["meta_group"] == group), key=lambda r: r["meta_offset"])
        assert len(mine) >= 2, "6,000 records a fetch are more than one pack a group"
        assert all(len(r["meta_pack"]) <= PACK_BYTES * 1.1 for r in mine)
        items = [pack_items(r["meta_pack"]) for r in mine]
        assert [e[4] for pack in items for e in pack] == offsets
        assert [r["meta_offset"] for r in mine] == [pack[0][4] for pack in items]
        assert [r["meta_start"] for r in mine] == [max(e[1] for e in pack) for pack in items]


def test_packs_and_dead_letters_hold_with_gapped_offsets_and_bad_records_between_good_ones(bad):
    """A fetch as a compacted topic gives it (offsets with gaps), bad records between good ones,
    many keys over 8 groups, confluent-kafka's own ``Message`` objects: every good record is in
    exactly one pack of its key's group, in offset order, each pack's first offset and largest
    start its records'; every bad record is one dead row at its own offset."""
    pytest.importorskip("pyspark")
    import random
    import zlib

    from confluent_kafka import Message

    from ctiflow.jobs.datapath.kafka import message_offsets
    from ctiflow.jobs.core.rows import pack_items
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder

    rng = random.Random(3)
    good = workload.transactions(3000, seed=13)
    mine = [v for k, v in bad if workload.BAD_KINDS[k][0] == "transaction"]
    values = [AvroSerializer("transaction")(r) for r in good]
    for v in mine:
        values.insert(rng.randrange(len(values)), v)
    offsets = list(itertools.accumulate(rng.choice((1, 1, 1, 2, 7)) for _ in values))
    msgs = [Message(topic="tx", partition=2, offset=o, value=v, key=b"k") for o, v in zip(offsets, values)]
    assert message_offsets(msgs).tolist() == offsets
    assert message_offsets(msgs[:5]).tolist() == offsets[:5]
    labels = list(range(100, 108))
    decoder = RecordDecoder({**SOURCE_OPTIONS["transaction"], "key_groups": "8", "values": "errors",
                             "group_labels": json.dumps(labels)})
    rows = decoder.batch(msgs).to_pylist()
    bad_offsets = [o for o, v in zip(offsets, values) if v in mine]
    assert [r["meta_offset"] for r in rows if r["meta_error"]] == bad_offsets
    decode = AvroDeserializer("transaction")
    expected: dict[int, list] = {}
    for o, v in zip(offsets, values):
        if v not in mine:
            rec = decode(v)
            expected.setdefault(labels[zlib.crc32(rec["account"].encode()) % 8], []).append((o, rec))
    assert len(expected) == 8
    for group, records in expected.items():
        packs = sorted((r for r in rows if r["meta_group"] == group and r["meta_pack"]), key=lambda r: r["meta_offset"])
        items = [pack_items(r["meta_pack"]) for r in packs]
        assert len(packs) <= 2, "a group's ≈ 375 records (≈ 40 kB) are not cut into runs as the fetch interleaves them"
        assert [(e[4], e[3]) for pack in items for e in pack] == records
        assert [r["meta_offset"] for r in packs] == [pack[0][4] for pack in items]
        assert [r["meta_start"] for r in packs] == [max(e[1] for e in pack) for pack in items]
        assert all(r["meta_partition"] == 2 for r in packs)


def test_good_records_still_decode():
    from ctiflow.jobs.avro.serde import AvroSerializer

    for r in workload.transactions(20, seed=4):
        assert AvroDeserializer("transaction")(AvroSerializer("transaction")(r)) == r
    fastavro.validation.validate(workload.flows(1)[0], schema("flow"), raise_errors=True)


def test_the_source_dead_letters_a_record_framed_with_another_subjects_schema_id():
    """The job's source accepts only ids registered under ``<topic>-value``; the forged record is
    a dead letter with that reason and its neighbours decode."""
    pytest.importorskip("pyspark")
    from confluent_kafka.schema_registry import Schema

    from ctiflow.jobs.avro.serde import AvroSerializer, registry_client
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder

    options = {**SOURCE_OPTIONS["transaction"], "schema_registry": json.dumps({"url": "mock://source-subject"})}
    decoder = RecordDecoder(options)
    reg = decoder.decode.registry  # the mock registry lives in this client: register through it
    good = [AvroSerializer("transaction", framing="confluent", registry=reg, subject="transactions-value")(r)
            for r in workload.transactions(3, seed=5)]
    other = reg.register_schema("other-value", Schema(default_store().get("transaction").text, "AVRO"))
    forged = b"\x00" + other.to_bytes(4, "big") + good[0][5:]
    rows = decoder.batch([_Message(v, i) for i, v in enumerate([good[0], forged, *good[1:]])]).to_pylist()
    errors = [r["meta_error"] for r in rows if r["meta_error"]]
    assert len(errors) == 1 and "not registered under subject 'transactions-value'" in errors[0], errors
