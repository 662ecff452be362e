"""ColumnEncoder and record_writer against fastavro's schemaless_writer: the same bytes for every record.

The oracle is fastavro (an independent encoder); the inputs are random columns of every
column-wise type, given as lists, NumPy arrays, Arrow arrays and one scalar per column, and
random schemas (nested records, arrays, maps, unions of several types) with random values."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import numpy as np
from fastavro import _validation_py, _write_py
import pyarrow as pa
import pytest
from hypothesis import given, reject, settings
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


def _avro_array(datum, schema, named_schemas, parent_ns, raise_errors, options):
    """Apache Avro's rule for an array value (Java's ``GenericData.validate``: a collection), where
    fastavro takes any ``Sequence`` but a string — so a ``bytes`` value is to it an array of ints,
    and may win a union's branch from a later ``bytes``, ``fixed`` or record. ctiflow follows Avro
    (``record_writer`` refuses bytes for an array); everything else is fastavro's own."""
    return not isinstance(datum, (bytes, bytearray)) and _FASTAVRO_ARRAY(
        datum, schema, named_schemas, parent_ns, raise_errors, options)


_FASTAVRO_ARRAY = _validation_py.VALIDATORS["array"]


def _oracle(schema: dict, header: bytes, records: list[dict]) -> list[bytes]:
    """fastavro's ``schemaless_writer`` (its pure-Python one, the reference of its compiled one),
    with Avro's array rule (:func:`_avro_array`) for the time of the call."""
    parsed = fastavro.parse_schema(schema)
    out = []
    before = _validation_py.VALIDATORS["array"], _write_py._validate
    _validation_py.VALIDATORS["array"], _write_py._validate = _avro_array, _validation_py._validate
    try:
        for r in records:
            buf = io.BytesIO()
            buf.write(header)
            _write_py.schemaless_writer(buf, parsed, r)
            out.append(buf.getvalue())
    finally:
        _validation_py.VALIDATORS["array"], _write_py._validate = before
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
    else:  # a nullable map of some nulls: a list of dicts, written value by value
        cols["om"] = [r["om"] for r in rows]
    return cols


@settings(max_examples=150, deadline=None)
@given(batches())
def test_columns_encode_as_fastavro_does(batch):
    rows, keys, okeys, om_vals, nulls, form = batch
    header = b"\xc3\x01" + bytes(range(8))
    enc = ColumnEncoder(ALL_KINDS, header)
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


def test_bad_columns_are_refused():
    enc = ColumnEncoder({"type": "record", "name": "R", "fields": [{"name": "i", "type": "int"}]})
    with pytest.raises(ValueError, match="outside 32 bits"):
        enc.encode({"i": np.array([2**31])}, 1)
    with pytest.raises(ValueError, match="no column"):
        enc.encode({}, 1)
    with pytest.raises(ValueError, match="values for 2 records"):
        enc.encode({"i": [1, 2, 3]}, 2)


# -- nested and union fields: value by value, as fastavro writes them ----------------------------
_PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "string", "bytes"]
_VALUES = {
    "null": st.none(), "boolean": st.booleans(), "int": st.integers(-(2**31), 2**31 - 1), "long": INT64,
    "float": st.floats(width=32), "double": st.floats(), "string": TEXT, "bytes": st.binary(max_size=5),
}


@st.composite
def schema_and_values(draw):
    """A random record schema (nested records, arrays, maps, enums, fixed, unions of several
    types in any order) and records of it, drawn per branch so every branch is taken."""
    names = iter(f"N{i}" for i in range(1000))

    def schema(depth):
        kinds = ["prim", "union"] + (["record", "array", "map", "enum", "fixed"] if depth < 3 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "prim":
            return draw(st.sampled_from(_PRIMITIVES[1:]))
        if kind == "enum":
            return {"type": "enum", "name": next(names), "symbols": ["A", "B", "C"]}
        if kind == "fixed":
            return {"type": "fixed", "name": next(names), "size": draw(st.integers(0, 4))}
        if kind == "array":
            return {"type": "array", "items": schema(depth + 1)}
        if kind == "map":
            return {"type": "map", "values": schema(depth + 1)}
        if kind == "record":
            return record(depth + 1)
        prims = draw(st.lists(st.sampled_from(_PRIMITIVES), min_size=1, max_size=4, unique=True))
        extra = [record(depth + 1) for _ in range(draw(st.integers(0, 2 if depth < 3 else 0)))]
        return draw(st.permutations(prims + extra))

    def record(depth):
        fields = [{"name": f"f{i}", "type": schema(depth)} for i in range(draw(st.integers(0, 4)))]
        return {"type": "record", "name": next(names), "fields": fields}

    def value(s):
        if isinstance(s, str):
            return draw(_VALUES[s])
        if isinstance(s, list):
            return value(draw(st.sampled_from(s)))
        kind = s["type"]
        if kind == "record":
            return {f["name"]: value(f["type"]) for f in s["fields"]}
        if kind == "enum":
            return draw(st.sampled_from(s["symbols"]))
        if kind == "fixed":
            return draw(st.binary(min_size=s["size"], max_size=s["size"]))
        if kind == "array":
            return [value(s["items"]) for _ in range(draw(st.integers(0, 3)))]
        return {draw(TEXT): value(s["values"]) for _ in range(draw(st.integers(0, 3)))}

    root = record(0)
    return root, [value(root) for _ in range(draw(st.integers(1, 6)))]


@settings(max_examples=300, deadline=None)
@given(schema_and_values())
def test_nested_and_union_fields_write_as_fastavro_does(case):
    from ctiflow.jobs.avro.decode import compile_schema
    from ctiflow.jobs.avro.encode import record_writer

    schema, records = case
    try:
        want = _oracle(schema, b"", records)
    except OverflowError:  # fastavro put a double past float32's range in an earlier float branch
        reject()           # of a union (its validator takes any float there): no oracle for it
    write = record_writer(compile_schema(schema))
    got = []
    for r in records:
        out = bytearray()
        write(r, out)
        got.append(bytes(out))
    assert got == want
    columns = {f["name"]: [r[f["name"]] for r in records] for f in schema["fields"]}
    assert ColumnEncoder(schema, b"\x01").encode(columns, len(records)).to_pylist() == [b"\x01" + w for w in want]


def test_union_branches_follow_fastavro():
    """The branch rules a reader of the code might get wrong, each against fastavro."""
    cases = [
        (["int", "long"], [5, 2**40]),                       # the first that fits
        (["float", "double"], [1.5, 3]),                     # a float gives way to a later double
        (["int", "float", "string"], [7, 0.5, "x"]),
        (["string", "bytes", "null"], ["s", b"b", None]),
        ([{"type": "record", "name": "A", "fields": [{"name": "x", "type": "long"}]},
          {"type": "record", "name": "B", "fields": [{"name": "x", "type": "long"},
                                                     {"name": "y", "type": ["null", "long"], "default": None}]}],
         [{"x": 1}, {"x": 1, "y": 2}]),                      # the record sharing the most fields
        ([{"type": "enum", "name": "E", "symbols": ["A"]}, "string"], ["A", "B"]),
        # bytes are not an array (Avro's rule; fastavro alone would take b"\x01" as [1]): found by
        # the random schemas below, a map of unions whose record branches differ in f0
        ([{"type": "array", "items": "int"}, "bytes"], [b"\x01", [1], b""]),
        ([{"type": "record", "name": "A", "fields": [{"name": "f0", "type": {"type": "array", "items": "boolean"}}]},
          {"type": "record", "name": "B", "fields": [{"name": "f0", "type": {"type": "fixed", "name": "F", "size": 0}}]}],
         [{"f0": b""}, {"f0": []}]),
    ]
    from ctiflow.jobs.avro.decode import compile_schema
    from ctiflow.jobs.avro.encode import record_writer

    for union, values in cases:
        schema = {"type": "record", "name": "R", "fields": [{"name": "u", "type": union}]}
        write = record_writer(compile_schema(schema))
        for v in values:
            out = bytearray()
            write({"u": v}, out)
            assert bytes(out) == _oracle(schema, b"", [{"u": v}])[0], (union, v)


def test_match_records_encode_from_columns():
    schema = json.loads((SCHEMAS / "match.avsc").read_text())
    from ctiflow.jobs.avro.decode import compile_schema

    fields = [name for name, _, _, _ in compile_schema(schema).fields]
    records = []
    for i in range(5):
        records.append(_a_record_of(schema, i))
    got = ColumnEncoder(schema).encode({f: [r[f] for r in records] for f in fields}, 5).to_pylist()
    assert got == _oracle(schema, b"", records)


def _a_record_of(schema: dict, i: int):
    """A record of ``schema`` with values varying by ``i`` (nulls in every other nullable field)."""
    def value(s, depth=0):
        if isinstance(s, list):
            return None if "null" in s and i % 2 else value(next(b for b in s if b != "null"), depth)
        if isinstance(s, str):
            return {"boolean": i % 2 == 0, "int": i, "long": i * 10**12, "float": 0.5 * i, "double": i / 3,
                    "string": f"é{i}", "bytes": bytes([i]), "null": None}[s]
        kind = s["type"]
        if kind == "record":
            return {f["name"]: value(f["type"], depth + 1) for f in s["fields"]}
        if kind == "array":
            return [value(s["items"], depth + 1) for _ in range(i % 3 + 1)]
        if kind == "map":
            return {f"k{j}": value(s["values"], depth + 1) for j in range(i % 2 + 1)}
        if kind == "enum":
            return s["symbols"][i % len(s["symbols"])]
        return value(kind, depth)
    return value(schema)


def test_a_record_that_does_not_fit_names_the_field():
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.operators.errors import SchemaError

    ser = AvroSerializer("transaction")
    good = {"id": "1", "account": "a", "type": "purchase", "amount": 1.0, "country": "DE", "event_time": 1}
    assert ser(good)
    with pytest.raises(SchemaError, match="event_time: expected long, got str .soon."):
        ser({**good, "event_time": "soon"})
    with pytest.raises(SchemaError, match="account: no value and no default"):
        ser({k: v for k, v in good.items() if k != "account"})
    with pytest.raises(SchemaError, match="amount: expected double, got str"):
        ser({**good, "amount": "1"})
    enc = ColumnEncoder(json.loads((SCHEMAS / "match.avsc").read_text()))
    columns = {"pattern": "p", "key": "k", "match_id": "m", "first_time": 1, "last_time": 2,
               "stages": [[{"stage": "a", "events": ["{}", 7]}]]}
    with pytest.raises(ValueError, match=r"stages\[0\]\.events\[1\]: expected string, got int 7 \(record 0 of 1\)"):
        enc.encode(columns, 1)
