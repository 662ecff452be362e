"""The adapter writes an input record passed on unchanged as its original bytes — but only when
those bytes carry the result topic's schema; otherwise it encodes the record again."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import GroupInput
from ctiflow.jobs.core.counters import Counters
from ctiflow.jobs.avro.serde import AvroDeserializer, AvroSerializer
from ctiflow.jobs.testing import workload
from ctiflow.operators.operator import Output
from tests.test_runtime_cti import partitioned_input
from tests.test_runtime_restore import with_fields


class _Handle:
    """The one call ``init`` makes on PySpark's handle (no Spark needed to encode)."""

    def getValueState(self, name, schema):
        return None

    def getMapState(self, name, key_schema, value_schema):
        return None

    def getListState(self, name, schema):
        return None


def _processor(handle, delay: str = "0s", operators=None):
    """An identity (pass-through) job's processor, initialised on ``handle`` without Spark."""
    from ctiflow.jobs.datapath.adapter import OperatorProcessor

    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time", "cti": {"delay": delay}}],
                 "operators": operators or [{"kind": "passthrough", "output": "out"}]}, "t")
    proc = OperatorProcessor(plan_job(cfg), cfg.result_topics(), cfg.kafka.effective_framing, None)
    proc.init(handle)
    return cfg, proc


def test_unchanged_records_keep_their_bytes_only_with_the_topics_schema():
    pytest.importorskip("pyspark")
    _, proc = _processor(_Handle())
    rec = workload.transactions(1, seed=3)[0]
    same = AvroSerializer("transaction")(rec)
    # An older writer's bytes (another fingerprint): readable, but not the topic's schema.
    foreign = AvroSerializer("flow")(workload.flows(1)[0])
    outs = [("out", Output("passthrough", rec, same), rec["account"]),
            ("out", Output("passthrough", rec, foreign), rec["account"]),
            ("out", Output("passthrough", rec), rec["account"])]
    frame = next(proc._encode(outs, [], Counters()))
    assert frame["kind"].tolist() == ["pack", "metrics"]
    import pyarrow as pa

    packed = list(zip(*(c.to_pylist() for c in pa.ipc.open_stream(frame["value"][0]).read_all().columns)))
    values = [v for _, v, _ in packed]
    assert values[0] == same
    assert values[1] != foreign and values[1] == values[2] == same
    assert AvroDeserializer("transaction")(values[1]) == rec
    assert [(k, role) for k, _, role in packed] == [(rec["account"].encode(), "passthrough")] * 3


def test_the_sink_unpacks_result_records_in_order_and_sums_metrics():
    """What the adapter packs is what the sink writes: every record, in order, packs split
    at PACK_SIZE records or PACK_BYTES; metrics rows are summed, not written."""
    pytest.importorskip("pyspark")
    import pyarrow as pa

    from ctiflow.jobs.core.rows import PACK_SIZE
    from ctiflow.jobs.core.rows import PACK_BYTES, pack_events
    from ctiflow.jobs.core.rows import output_records as records

    cfg, proc = _processor(_Handle())
    recs = workload.transactions(PACK_SIZE + 5, seed=9)
    outs = [("out", Output("passthrough", r), r["account"]) for r in recs]
    dead = [{"source_topic": "t", "partition": 0, "offset": 7, "key": None, "value": b"x", "error": "decode: bad",
             "stage": "decode", "kafka_timestamp": None}]
    frame = next(proc._encode(outs, dead, Counters(received=3)))
    assert frame["kind"].tolist()[-1] == "metrics" and set(frame["kind"].tolist()[:-1]) == {"pack"}
    sizes = [pa.ipc.open_stream(v).read_all() for v in frame["value"].tolist()[:-1]]
    assert len(sizes) >= 3 and all(t.num_rows <= PACK_SIZE for t in sizes)
    assert all(t.num_rows == 1 or sum(len(k or b"") + len(v) for k, v in zip(t.column("key").to_pylist(),
               t.column("value").to_pylist())) <= PACK_BYTES * 1.1 for t in sizes)
    metrics: dict = {}
    got = list(records(iter([pa.RecordBatch.from_pandas(frame)]), metrics))
    assert [t for t, _, _ in got] == ["out"] * len(recs) + [cfg.dead_letter_topic]
    decode = AvroDeserializer("transaction")
    assert [decode(v) for _, _, v in got[:-1]] == recs
    assert [k for _, k, _ in got[:-1]] == [r["account"].encode() for r in recs]
    assert AvroDeserializer("dead_letter")(got[-1][2])["error"] == "decode: bad"
    assert metrics["received"] == 3


class _State:
    def __init__(self):
        self.value = None

    def exists(self):
        return self.value is not None

    def get(self):
        return self.value

    def update(self, value):
        self.value = value


class _Map:
    """PySpark's ``MapState`` calls the adapter makes, over a dict."""

    def __init__(self):
        self.values = {}

    def getValue(self, key):
        return self.values.get(key)

    def updateValue(self, key, value):
        self.values[key] = value

    def removeKey(self, key):
        del self.values[key]

    def iterator(self):
        return iter(list(self.values.items()))


class _List:
    """PySpark's ``ListState`` calls the adapter makes, over a list."""

    def __init__(self):
        self.values = []

    def get(self):
        return iter(list(self.values))

    def put(self, values):
        self.values = list(values)

    def clear(self):
        self.values = []


class _Timers:
    """The handle calls ``init``/``_finish`` make: one value state, one map state, one list
    state, timers."""

    def __init__(self):
        self.state = _State()
        self.chunks = _Map()
        self.parts = _List()

    def getValueState(self, name, schema):
        return self.state

    def getMapState(self, name, key_schema, value_schema):
        return self.chunks

    def getListState(self, name, schema):
        return self.parts

    def listTimers(self):
        return []

    def deleteTimer(self, t):
        pass

    def registerTimer(self, t):
        pass


class _Watermark:
    def getCurrentWatermarkInMs(self):
        return 0


def test_packs_from_two_partitions_in_any_row_order_give_the_same_records(tmp_path):
    """The shuffle delivers a group's pack rows in any order: the adapter's output must not
    depend on it (exactly-once replay), and every event below the batch's floor
    (per partition max start − delay, min over partitions) comes out in application-time order
    (start, partition, offset)."""
    pytest.importorskip("pyspark")
    import random

    import pandas as pd
    import pyarrow as pa

    from ctiflow.jobs.core.rows import pack_events
    from ctiflow.jobs.core.rows import output_records as records

    recs = workload.transactions(60, seed=5)
    ser = AvroSerializer("transaction")
    rows = []
    for part in (0, 1):
        mine = [r for i, r in enumerate(recs) if i % 2 == part]
        for lo in range(0, len(mine), 7):  # one fetch's share of a key group: consecutive offsets
            pack = [(r["account"], r["event_time"], r["event_time"], r, off, ser(r))
                    for off, r in enumerate(mine[lo:lo + 7], lo)]
            rows.append({"meta_stream": "s", "meta_partition": part, "meta_offset": lo, "meta_error": None,
                         "meta_value": None, "meta_raw_key": None, "meta_kafka_ts": None, "meta_control": None,
                         "meta_start": max(e[1] for e in pack), "meta_pack": pack_events(pack)})
        # what the source adds for every key group: the partition's frontier …
        rows.append({"meta_stream": "s", "meta_partition": part, "meta_offset": -1, "meta_error": None,
                     "meta_value": None, "meta_raw_key": None, "meta_kafka_ts": None, "meta_control": "frontier",
                     "meta_start": max(r["event_time"] for r in mine), "meta_pack": None})
    # … and the batch's control row
    rows.append({"meta_stream": "s", "meta_partition": -1, "meta_offset": -1, "meta_error": None,
                 "meta_value": None, "meta_raw_key": None, "meta_kafka_ts": None,
                 "meta_control": '{"partitions": [0, 1], "idle": [], "flush": false}', "meta_start": None,
                 "meta_pack": None})

    def run(order: list[dict]) -> list[tuple]:
        _, proc = _processor(_Timers(), delay="1s")
        frames = [pd.DataFrame(order[:3]), pd.DataFrame(order[3:])]
        out = list(proc.handleInputRows(("g",), iter(frames), _Watermark()))
        return list(records(iter([pa.RecordBatch.from_pandas(f) for f in out]), {}))

    first = run(rows)
    for seed in range(5):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        assert run(shuffled) == first
    # the batch ends with its CTI: the min over both partitions of their largest start − delay
    floor = min(max(r["event_time"] for i, r in enumerate(recs) if i % 2 == p) for p in (0, 1)) - 1000
    expected = sorted(((r["event_time"], i % 2, (i // 2), r) for i, r in enumerate(recs) if r["event_time"] < floor),
                      key=lambda t: t[:3])
    decode = AvroDeserializer("transaction")
    assert [decode(v) for t, _, v in first if t == "out"] == [r for *_, r in expected]


def test_a_batch_with_dead_letters_and_control_rows_gives_integer_ctis_to_the_operators():
    """Null cells (dead letters, control rows) make pandas columns float: the CTI the adapter
    computes from them must still be an int (a count operator's snapshot packs it as int64)."""
    pytest.importorskip("pyspark")
    import pandas as pd
    import pyarrow as pa

    from ctiflow.jobs.core.rows import pack_events
    from ctiflow.jobs.core.rows import output_records as records

    recs = workload.transactions(40, seed=2)
    pack = [(r["account"], r["event_time"], r["event_time"], r, off, None) for off, r in enumerate(recs)]
    base = {"meta_stream": "s", "meta_error": None, "meta_value": None, "meta_raw_key": None, "meta_kafka_ts": None,
            "meta_control": None, "meta_start": None, "meta_pack": None}
    rows = [{**base, "meta_partition": 0, "meta_offset": 0, "meta_start": max(r["event_time"] for r in recs),
             "meta_pack": pack_events(pack)},
            {**base, "meta_partition": 0, "meta_offset": 40, "meta_error": "decode: bad", "meta_value": b"x",
             "meta_kafka_ts": 5},
            {**base, "meta_partition": 0, "meta_offset": -1, "meta_control": "frontier",
             "meta_start": max(r["event_time"] for r in recs)},
            {**base, "meta_partition": -1, "meta_offset": -1,
             "meta_control": '{"partitions": [0], "idle": [], "flush": false}'}]
    timers = _Timers()
    _, proc = _processor(timers, delay="1s", operators=[
        {"kind": "count", "name": "c", "window": {"events": 10}, "per_key": False, "emit": "per_cti", "output": "n"}])
    out = list(proc.handleInputRows(("g",), iter([pd.DataFrame(rows)]), _Watermark()))
    metrics: dict = {}
    got = list(records(iter([pa.RecordBatch.from_pandas(f) for f in out]), metrics))
    cti = max(r["event_time"] for r in recs) - 1000
    assert metrics["cti"] == cti and isinstance(metrics["cti"], int)
    assert [AvroDeserializer("count")(v)["time"] for t, _, v in got if t == "n"] == [cti - 1]
    assert metrics["dead_letter"] == 1 and metrics["received"] == 41


BULK_OPERATORS = {
    "bins": [{"kind": "bins", "name": "per_100", "bin_size": 100, "measures": ["amount"],
              "outputs": {"incremental": "bi", "updated": "bu", "final": "bf"}}],
    "bins, two measures": [{"kind": "bins", "name": "n", "bin_size": 70, "measures": ["amount", "event_time"],
                            "outputs": {"final": "bf", "updated": "bu"}}],
    "count": [{"kind": "count", "name": "per_key_events", "window": {"events": 4}, "output": "c2",
               "predicate": "type == 'a'"},
              {"kind": "count", "name": "per_key_time", "window": {"time": 300}, "epsilon": 0.1, "output": "c1"}],
}


def _sink_records(frame) -> list[tuple]:
    import pyarrow as pa

    from ctiflow.jobs.core.rows import output_records as records
    return list(records(iter([pa.RecordBatch.from_pandas(frame)]), {}))


def _written(proc, rt, batch: dict, partitions: list[int], last: bool) -> tuple[list, int]:
    """One micro-batch of ``batch`` (partition → events) through runtime ``rt`` and the
    processor's encoder: (the sink's ``(topic, key, value)`` records, late records counted)."""
    out = rt.run_batch(GroupInput.of("s", batch, partitions, flush=last)).outputs
    c = Counters()
    return _sink_records(next(proc._encode(out, [], c))), c.late_records


@settings(max_examples=60, deadline=None)
@given(partitioned_input(), st.sampled_from(sorted(BULK_OPERATORS)))
def test_results_encoded_in_bulk_are_the_records_encoded_one_by_one(data, kind):
    """The job's path (a batched runtime, OutputBatch columns, ColumnEncoder) writes the bytes,
    keys and order that per-record fastavro encoding of the unbatched runtime's records writes,
    on several partitions with disorder and late events."""
    pytest.importorskip("pyspark")
    from ctiflow.jobs.core.runtime import GroupRuntime

    events, batches = data
    _, proc = _processor(_Handle(), delay="50ms", operators=BULK_OPERATORS[kind])
    bulk, single = GroupRuntime(proc.plan, batched=True), GroupRuntime(proc.plan)
    seen = 0
    for b, batch in enumerate(with_fields(batches)):
        frames = [_written(proc, rt, batch, sorted(events), b == len(batches) - 1) for rt in (bulk, single)]
        assert frames[0] == frames[1]
        seen += len(frames[0][0])
    assert seen or not any(events.values())
    assert bulk.counters.outputs == single.counters.outputs


@settings(max_examples=60, deadline=None)
@given(partitioned_input(), st.lists(st.sampled_from(["same", "foreign", "none"]), min_size=1, max_size=7))
def test_records_passed_on_as_columns_are_those_passed_on_one_by_one(data, kinds):
    """The identity job's path (a batched runtime passes the released columns on as one batch,
    their bytes kept where they carry the topic's schema) writes the bytes, keys and order that
    the unbatched runtime's one ``Output`` per event writes — with every event's bytes kept, some
    kept in another schema, some not kept — on several partitions with disorder and late events."""
    pytest.importorskip("pyspark")
    import dataclasses

    from ctiflow.jobs.core.runtime import GroupRuntime

    events, batches = data
    _, proc = _processor(_Handle(), delay="50ms")
    txs = workload.transactions(64, seed=11)
    same, foreign = AvroSerializer("transaction"), AvroSerializer("flow")
    flow = foreign(workload.flows(1)[0])

    def dress(e):
        i = e.fields["i"]
        rec = {**txs[i % len(txs)], "account": e.key, "event_time": e.start}
        kind = kinds[i % len(kinds)]
        return dataclasses.replace(e, fields=rec, raw=same(rec) if kind == "same" else flow if kind == "foreign" else None)

    bulk, single = GroupRuntime(proc.plan, batched=True), GroupRuntime(proc.plan)
    seen = 0
    for b, batch in enumerate(batches):
        batch = {p: [dress(e) for e in recs] for p, recs in batch.items()}
        frames = [_written(proc, rt, batch, sorted(events), b == len(batches) - 1) for rt in (bulk, single)]
        assert frames[0] == frames[1]
        for topic, key, value in frames[0][0]:
            if topic == "out":
                assert AvroDeserializer("transaction")(value)["account"] == key.decode()
                seen += 1
    assert bulk.counters.outputs == single.counters.outputs == seen
