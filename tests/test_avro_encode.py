"""ColumnEncoder against fastavro's schemaless_writer: the same bytes for every record.

The oracle is fastavro (an independent encoder); the inputs are random columns of every
bulk-encodable type, given as lists, NumPy arrays, Arrow arrays and one scalar per column."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.avro.encode import ColumnEncoder
from ctiflow.operators.events import MapColumn

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"

ALL_KINDS = {
    "type": "record", "name": "All", "namespace": "t",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "y", "type": "bytes"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "x", "type": {"type": "fixed", "name": "F", "size": 3}},
        {"name": "ol", "type": ["null", "long"]},
        {"name": "os", "type": ["string", "null"]},
        {"name": "m", "type": {"type": "map", "values": "double"}},
        {"name": "om", "type": ["null", {"type": "map", "values": "long"}]},
        {"name": "dflt", "type": "string", "default": "zz"},
    ],
}

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=12)  # includes non-ASCII and empty strings


def _oracle(schema: dict, header: bytes, records: list[dict]) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        buf.write(header)
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out


@st.composite
def batches(draw):
    n = draw(st.integers(1, 40))
    keys = draw(st.lists(st.sampled_from(["a", "bé", "c_3", "ключ"]), min_size=0, max_size=3, unique=True))
    okeys = draw(st.lists(st.sampled_from(["p", "q"]), min_size=1, max_size=2, unique=True))
    om_null = draw(st.sampled_from(["none", "all", "some"]))
    rows = []
    for _ in range(n):
        rows.append({
            "b": draw(st.booleans()), "i": draw(st.integers(-(2**31), 2**31 - 1)), "l": draw(INT64),
            "f": float(np.float32(draw(st.floats(width=32, allow_nan=False)))),
            "d": draw(st.floats(allow_nan=False)), "s": draw(TEXT), "y": draw(st.binary(max_size=6)),
            "e": draw(st.sampled_from("ABC")), "x": draw(st.binary(min_size=3, max_size=3)),
            "ol": draw(st.one_of(st.none(), INT64)), "os": draw(st.one_of(st.none(), TEXT)),
            "m": {k: draw(st.floats(allow_nan=False)) for k in keys},
        })
    om_vals = [[draw(st.integers(-(2**40), 2**40)) for _ in okeys] for _ in range(n)]
    nulls = [om_null == "all" or (om_null == "some" and draw(st.booleans())) for _ in range(n)]
    for r, vals, null in zip(rows, om_vals, nulls):
        r["om"] = None if null else dict(zip(okeys, vals))
    return rows, keys, okeys, om_vals, nulls, draw(st.sampled_from(["list", "numpy", "arrow"]))


def _columns(rows, keys, okeys, om_vals, nulls, form):
    cols = {name: [r[name] for r in rows] for name in ("b", "i", "l", "f", "d", "s", "y", "e", "x", "ol", "os")}
    if form == "numpy":
        for name, dtype in (("b", np.bool_), ("i", np.int32), ("l", np.int64), ("f", np.float32), ("d", np.float64)):
            cols[name] = np.array(cols[name], dtype)
        cols["ol"] = np.array(cols["ol"], object)
    elif form == "arrow":
        cols["s"] = pa.array(cols["s"], pa.string())
        cols["y"] = pa.array(cols["y"], pa.binary()).slice(0)  # an Arrow array as the source gives
    cols["m"] = MapColumn(tuple(keys), np.array([[r["m"][k] for r in rows] for k in keys]).reshape(len(keys), len(rows)))
    if all(nulls):
        cols["om"] = None
    elif not any(nulls):
        cols["om"] = MapColumn(tuple(okeys), np.array(om_vals, np.int64).T)
    else:  # a nullable map of some nulls is not bulk input: checked separately below
        cols["om"] = None
    return cols


@settings(max_examples=150, deadline=None)
@given(batches())
def test_columns_encode_as_fastavro_does(batch):
    rows, keys, okeys, om_vals, nulls, form = batch
    if any(nulls) and not all(nulls):
        for r in rows:
            r["om"] = None
    header = b"\xc3\x01" + bytes(range(8))
    enc = ColumnEncoder(ALL_KINDS, header)
    assert enc.bulk
    got = enc.encode(_columns(rows, keys, okeys, om_vals, nulls, form), len(rows)).to_pylist()
    want = _oracle(ALL_KINDS, header, [dict(r, dflt="zz") for r in rows])
    assert got == want


def test_scalar_columns_repeat_one_value():
    enc = ColumnEncoder(ALL_KINDS)
    cols = {"b": True, "i": -5, "l": 2**62, "f": 1.5, "d": -0.25, "s": "wört", "y": b"\x00\xff", "e": "B",
            "x": b"abc", "ol": None, "os": "s", "m": MapColumn(("k",), np.array([[1.0, 2.0, 3.0]])), "om": None,
            "dflt": "given"}
    got = enc.encode(cols, 3).to_pylist()
    records = [{**{k: v for k, v in cols.items() if k != "m"}, "m": {"k": v}} for v in (1.0, 2.0, 3.0)]
    assert got == _oracle(ALL_KINDS, b"", records)


@pytest.mark.parametrize("name", ["bin", "count", "late", "dead_letter"])
def test_result_schemas_bulk_encode(name):
    schema = json.loads((SCHEMAS / f"{name}.avsc").read_text())
    assert ColumnEncoder(schema).bulk


def test_bin_records_as_the_binner_gives_them():
    schema = json.loads((SCHEMAS / "bin.avsc").read_text())
    rng = np.random.default_rng(7)
    n = 500
    measures = rng.normal(size=(2, n)) * 1e6
    cols = {"binner": "b", "key": [f"k{i % 37}é" for i in range(n)],
            "bin_start": rng.integers(-(2**50), 2**50, n), "bin_end": rng.integers(0, 2**40, n),
            "measures": MapColumn(("amount", "qty"), measures), "fraction_sum": rng.random(n),
            "events": rng.integers(0, 2**31 - 1, n), "revision": rng.integers(0, 50, n), "final": rng.random(n) < 0.5,
            "cti": 1_700_000_000_000, "kind": "updated"}
    got = ColumnEncoder(schema, b"\x00\x00\x00\x00\x07").encode(cols, n).to_pylist()
    records = [{"binner": "b", "key": cols["key"][i], "bin_start": int(cols["bin_start"][i]),
                "bin_end": int(cols["bin_end"][i]), "measures": {"amount": measures[0, i], "qty": measures[1, i]},
                "fraction_sum": float(cols["fraction_sum"][i]), "events": int(cols["events"][i]),
                "revision": int(cols["revision"][i]), "final": bool(cols["final"][i]), "cti": cols["cti"],
                "kind": "updated"} for i in range(n)]
    assert got == _oracle(schema, b"\x00\x00\x00\x00\x07", records)


def test_not_bulk_encodable_and_bad_columns_are_refused():
    assert not ColumnEncoder(json.loads((SCHEMAS / "match.avsc").read_text())).bulk
    enc = ColumnEncoder({"type": "record", "name": "R", "fields": [{"name": "i", "type": "int"}]})
    with pytest.raises(ValueError, match="outside 32 bits"):
        enc.encode({"i": np.array([2**31])}, 1)
    with pytest.raises(ValueError, match="no column"):
        enc.encode({}, 1)
    with pytest.raises(ValueError, match="values for 2 records"):
        enc.encode({"i": [1, 2, 3]}, 2)
