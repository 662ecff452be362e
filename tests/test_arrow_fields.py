"""A pack's field columns stay Arrow (:class:`ctiflow.jobs.core.rows.ArrowFields`) until an operator reads
one: the values read are the records that were packed — through takes (integer, boolean,
slice), concatenations and the state's pickling — and a column nobody reads is never converted.
The oracle is the records as produced (the workload's dicts), indexed in plain Python."""

import pickle

import numpy as np
import pyarrow as pa
import pytest

from ctiflow.jobs.core.rows import ArrowFields, pack_columns, unpack_columns
from ctiflow.jobs.avro.serde import AvroSerializer
from ctiflow.jobs.testing import workload
from ctiflow.operators.columns import EventColumns

SOURCES = {
    "transaction": ({"key_field": "account", "time_field": "event_time"}, lambda: workload.transactions(80, seed=7)),
    "flow": ({"key_field": "device", "time_field": "start_time", "end_field": "end_time", "shape": "interval"},
             lambda: workload.flows(80, seed=7)),
}


def _packed(schema: str) -> tuple[EventColumns, list[dict]]:
    """Records → Avro → the source's bulk decode → one pack → unpacked columns, and the records."""
    pytest.importorskip("pyspark")
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder
    from ctiflow.jobs.datapath.source.options import SourceOptions

    spec, make = SOURCES[schema]
    records = make()
    options = SourceOptions(bootstrap="127.0.0.1:9", topic="t", schema=schema, stream=schema,
                            keep_values=False, **spec).to_options()
    decoder = RecordDecoder(options)
    got = decoder.decoded([AvroSerializer(schema)(r) for r in records])
    assert not got.errors
    n = len(records)
    pack = pack_columns(got.fields, got.keys, got.starts, got.ends, np.arange(n) * 2, pa.nulls(n, pa.binary()),
                        tuple(decoder.nested_fields))
    return unpack_columns(pack, schema, 1), records


def _values(cols: EventColumns, name: str) -> list:
    return cols.fields[name].tolist()


@pytest.mark.parametrize("schema", sorted(SOURCES))
def test_fields_read_as_the_records_written_through_takes_concats_and_pickling(schema):
    cols, records = _packed(schema)
    assert isinstance(cols.fields, ArrowFields) and cols.fields.converted() == set()
    assert list(cols.fields) == list(records[0])
    index = np.array([5, 0, 79, 3, 3, 41])
    mask = np.zeros(len(records), bool)
    mask[[1, 2, 60]] = True
    picks = {
        "integers": (cols.take(index), [records[i] for i in index.tolist()]),
        "mask": (cols.take(mask), [records[i] for i in (1, 2, 60)]),
        "slice": (cols.take(slice(10, 30)), records[10:30]),
        "empty": (cols.take(np.array([], np.int64)), []),
    }
    taken, expected = picks["integers"]
    sliced, expected_slice = picks["slice"]
    both = EventColumns.concat([sliced, taken])
    picks["concat"] = (both, expected_slice + expected)
    picks["pickled"] = (pickle.loads(pickle.dumps(both, protocol=5)), expected_slice + expected)
    picks["take of a concat"] = (both.take(np.array([25, 0])), [expected[5], expected_slice[0]])
    assert cols.fields.converted() == set() and both.fields.converted() == set()  # taking converted nothing
    for what, (got, want) in picks.items():
        assert isinstance(got.fields, ArrowFields), what
        assert got.records() == want, what


def test_only_the_fields_read_are_converted_once_for_all_views():
    cols, records = _packed("flow")
    taken = cols.take(np.array([3, 1]))
    assert taken.fields["bytes"].tolist() == [records[3]["bytes"], records[1]["bytes"]]
    assert taken.fields.converted() == {"bytes"}
    assert cols.fields.converted() == {"bytes"}  # converted for the whole pack, once, shared by its views
    measures = cols.fields["bytes"]
    assert measures.dtype == np.float64 and measures.tolist() == [r["bytes"] for r in records]
    again = cols.take(slice(5, 7)).take(np.array([1, 0]))  # a view of a view: one index into the pack
    assert again.fields["bytes"].tolist() == [records[6]["bytes"], records[5]["bytes"]]
    both = EventColumns.concat([taken, cols.take(slice(0, 2))])
    assert both.fields.converted() == {"bytes"}  # every part had it: concatenated, not converted again
    fresh, _ = _packed("flow")
    mixed = EventColumns.concat([both, fresh.take(slice(5, 6))])
    assert mixed.fields.converted() == set()  # not every part had it: converted on use
    assert _values(mixed, "bytes") == [records[i]["bytes"] for i in (3, 1, 0, 1, 5)]
    restored = pickle.loads(pickle.dumps(taken, protocol=5))
    assert restored.fields.converted() == set()
    assert _values(restored, "device") == [records[3]["device"], records[1]["device"]]
    assert restored.fields.table.num_rows == 2  # a view pickles its own rows, not the whole pack
    assert "protocol" in cols.fields and "nope" not in cols.fields
    with pytest.raises(KeyError):
        cols.fields["nope"]
    assert cols.fields.get("nope") is None


def test_arrow_fields_concatenate_with_plain_columns():
    """State written before the fields stayed Arrow holds plain columns (a dict of arrays): a
    release concatenates both kinds."""
    cols, records = _packed("transaction")
    old = EventColumns.from_events(cols.take(slice(0, 4)).events())
    assert type(old.fields) is dict
    both = EventColumns.concat([old, cols.take(slice(4, 9))])
    assert both.records() == records[:9]


def test_nested_values_and_nulls_read_as_written():
    items = [("a", 1, 2, {"n": 1, "tags": ["x", "y"], "maybe": None, "s": "é"}, 10, None),
             ("b", 3, 3, {"n": 2, "tags": [], "maybe": 7, "s": ""}, 11, None)]
    fields = pa.Table.from_pylist([it[3] for it in items])
    fields = fields.set_column(1, "tags", pa.array(['["x", "y"]', "[]"]))  # nested values travel as JSON text
    pack = pack_columns(fields, ["a", "b"], [1, 3], [2, 3], [10, 11], [None, None], ("tags",))
    cols = unpack_columns(pack, "s", 0)
    assert isinstance(cols.fields, ArrowFields)
    again = pickle.loads(pickle.dumps(cols.take(np.array([1, 0])), protocol=5))
    assert again.records() == [items[1][3], items[0][3]]
    assert cols.fields["n"].dtype == np.int64 and cols.fields["maybe"].dtype == object


def test_a_projected_view_concatenates_with_full_rows_in_the_full_field_order():
    """The reorder buffer's stored rows keep only the fields read (``project``); joined with new
    rows that have every field, the fields come in the record's order again, the stored rows'
    dropped fields are null and the kept ones read as written."""
    cols, records = _packed("flow")
    old = cols.take(np.arange(10, 20)).fields.project(["packets", "bytes"])
    assert list(old) == ["bytes", "packets"]  # the record's order, not the request's
    assert old.project(["bytes", "packets", "nope"]) is old
    restored = pickle.loads(pickle.dumps(old))
    new = cols.take(np.arange(30, 35)).fields
    both = ArrowFields.concat([restored, new])
    assert list(both) == list(records[0])
    assert both["bytes"].tolist() == [r["bytes"] for r in records[10:20] + records[30:35]]
    assert both["id"].tolist() == [None] * 10 + [r["id"] for r in records[30:35]]
