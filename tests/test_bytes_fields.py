"""Packs without field columns (an identity job's: no operator reads the fields): the stateful
worker decodes the records' bytes only when something needs the values, and then gets exactly
the columns a pack with field columns holds — through takes, concatenations and the state's
pickling."""

import pickle

import numpy as np
import pyarrow as pa
import pytest

from ctiflow.jobs.core.rows import BytesFields, FIELD_DECODERS, pack_columns, unpack_columns
from ctiflow.jobs.avro.serde import AvroSerializer
from ctiflow.jobs.testing import workload
from ctiflow.operators.columns import EventColumns

SOURCES = {
    "transaction": ({"key_field": "account", "time_field": "event_time"}, lambda: workload.transactions(60, seed=4)),
    "flow": ({"key_field": "device", "time_field": "start_time", "end_field": "end_time", "shape": "interval"},
             lambda: workload.flows(60, seed=4)),
}


def _events(schema: str):
    pytest.importorskip("pyspark")
    from ctiflow.jobs.datapath.adapter import _field_decoder
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder
    from ctiflow.jobs.datapath.source.options import SourceOptions

    spec, records = SOURCES[schema]
    options = SourceOptions(bootstrap="127.0.0.1:9", topic="t", schema=schema, stream=f"bytes-{schema}",
                            **spec).to_options()
    values = [AvroSerializer(schema)(r) for r in records()]
    decoder = RecordDecoder(options)
    got = decoder.decoded(values)
    assert not got.errors
    args = (got.fields, got.keys, got.starts, got.ends, np.arange(len(values)) * 3, pa.array(values, pa.binary()),
            tuple(decoder.nested_fields))
    FIELD_DECODERS[f"bytes-{schema}"] = _field_decoder(options)
    full = unpack_columns(pack_columns(*args), f"bytes-{schema}", 2)
    lazy = unpack_columns(pack_columns(*args, with_fields=False), f"bytes-{schema}", 2)
    return full, lazy


def _same(expected: EventColumns, got: EventColumns) -> None:
    assert list(got.fields) == list(expected.fields)
    assert got.records() == expected.records()
    assert [got.event(i) for i in range(len(got))] == [expected.event(i) for i in range(len(expected))]
    assert list(got.raw) == list(expected.raw) and list(got.key) == list(expected.key)


@pytest.mark.parametrize("schema", sorted(SOURCES))
def test_a_pack_of_bytes_reads_as_the_pack_of_fields(schema):
    full, lazy = _events(schema)
    assert isinstance(lazy.fields, BytesFields)
    index = np.array([7, 0, 31, 2, 2, 59])
    taken = lazy.take(index)
    both = EventColumns.concat([lazy.take(np.arange(10, 20)), taken])
    kept = pickle.loads(pickle.dumps(both, protocol=5))
    assert "id" in taken.fields and "nope" not in taken.fields
    # takes, concatenations and pickling decoded nothing yet; the bytes are pickled once
    for cols in (lazy, taken, both, kept):
        assert isinstance(cols.fields, BytesFields) and cols.fields._columns is None
    assert len(pickle.dumps(both, protocol=5)) < 2 * sum(map(len, both.raw)) + 2_000
    _same(full, lazy)
    _same(full.take(index), taken)
    _same(EventColumns.concat([full.take(np.arange(10, 20)), full.take(index)]), kept)
    assert list(lazy.fields["id"]) == [r["id"] for r in full.records()]


def test_a_pack_without_fields_must_keep_every_records_bytes():
    pytest.importorskip("pyspark")
    from ctiflow.jobs.datapath.source.options import SourceOptions

    with pytest.raises(ValueError, match="bytes"):
        SourceOptions(bootstrap="x:1", topic="t", keep_values=False, pack_fields=False)


@pytest.mark.parametrize("operators, reference, bytes_only", [
    ([{"kind": "passthrough", "output": "o"}], False, True),
    ([{"kind": "passthrough", "output": "o"}, {"kind": "count", "name": "c", "window": {"events": 3}, "output": "n"}],
     False, False),
    ([{"kind": "passthrough", "output": "o"}], True, False),
])
def test_only_jobs_whose_operators_pass_records_on_ship_bytes_alone(operators, reference, bytes_only):
    pytest.importorskip("pyspark")
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.pipeline import source_options

    sources = [{"name": "tx", "topic": "t", "schema": "transaction", "key_field": "account", "time_field": "event_time"}]
    spec = {"job": "j", "kafka": {"bootstrap_servers": "x:1"}, "sources": sources, "operators": operators}
    if reference:
        sources.append({"name": "acct", "topic": "a", "schema": "account", "key_field": "account",
                        "time_field": "valid_from", "shape": "edge"})
        spec["reference"] = {"source": "acct", "fast": "tx", "join_field": "account"}
    cfg = parse(spec, "j")
    opts = source_options(cfg, cfg.sources[0], False)
    assert opts.pack_fields is not bytes_only and opts.keep_values
