"""column_truth against the per-record evaluator: the same truth for every record, or no
column form at all (never a different answer, never a lost refusal)."""

from __future__ import annotations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from ctiflow.operators.cep.expr.expression import ExpressionFailed, column_truth, compile_expression
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.count import CountOperator, CountSettings
from ctiflow.operators.events import outputs_of
from ctiflow.operators.time import Event

FIELDS = {
    "i": st.integers(-(2**62), 2**62),
    "small": st.integers(-3, 3),
    "f": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3).map(float)),
    "f32": st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), st.just(0.1)),
    "i32": st.integers(-(2**31), 2**31 - 1),
    "b": st.booleans(),
    "s": st.one_of(st.none(), st.sampled_from(["a", "b", "DE", ""])),
    "maybe": st.one_of(st.none(), st.integers(-3, 3)),
}
DTYPES = {"i": np.int64, "small": np.int64, "f": np.float64, "f32": np.float32, "i32": np.int32, "b": np.bool_,
          "s": object, "maybe": object}
CONSTANTS = st.one_of(
    st.integers(-4, 4), st.integers(-(2**64), 2**64), st.sampled_from([0.5, -2.5, 2.0, 0.1, 1e300, 2.0**53 + 1]),
    st.sampled_from(["1e999", "-1e999"]),  # ±inf as literals
    st.sampled_from(["'a'", "'DE'", "None", "null", "true", "False"]),
).map(str)
OPS = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])


@st.composite
def expressions(draw, depth=0):
    kind = draw(st.integers(0, 3 if depth < 3 else 1))
    if kind == 0:
        left = draw(st.one_of(st.sampled_from(sorted(FIELDS)), CONSTANTS))
        right = draw(st.one_of(st.sampled_from(sorted(FIELDS)), CONSTANTS))
        text = f"{left} {draw(OPS)} {right}"
        if draw(st.booleans()):
            text += f" {draw(OPS)} {draw(st.one_of(st.sampled_from(sorted(FIELDS)), CONSTANTS))}"
        return text
    if kind == 1:
        return draw(st.sampled_from(["b", "not b", "s", "i"]))
    if kind == 2:
        return f"not ({draw(expressions(depth + 1))})"
    parts = draw(st.lists(expressions(depth + 1), min_size=2, max_size=3))
    return "(" + f" {draw(st.sampled_from(['and', 'or']))} ".join(f"({p})" for p in parts) + ")"


@st.composite
def tables(draw):
    n = draw(st.integers(1, 12))
    rows = [{name: draw(strategy) for name, strategy in FIELDS.items()} for _ in range(n)]
    columns = {}
    for name, dtype in DTYPES.items():
        values = [r[name] for r in rows]
        columns[name] = np.array(values, dtype) if dtype is not object else np.array(values + [None], object)[:-1]
    records = [{name: columns[name][i].item() if columns[name].dtype != object else columns[name][i]
                for name in FIELDS} for i in range(n)]
    return columns, records


def _per_record(text: str, records: list[dict]):
    """Each record's truth, or None if any record is refused."""
    expr = compile_expression(text)
    out = []
    for r in records:
        try:
            out.append(bool(expr(r)))
        except ExpressionFailed:
            return None
    return out


@settings(max_examples=600, deadline=None)
@given(expressions(), tables())
def test_column_truth_is_the_per_record_truth_or_nothing(text, table):
    columns, records = table
    truth = column_truth(text)
    if truth is None:
        event("no column form")
        return
    mask = truth(columns, len(records))
    if mask is None:
        event("per record at run time")
        return
    event("compared")
    assert mask.dtype == np.bool_ and mask.shape == (len(records),)
    assert _per_record(text, records) == mask.tolist(), text


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(FIELDS)), OPS, CONSTANTS, st.booleans(), tables())
def test_one_comparison_of_a_field_and_a_constant(name, op, constant, flipped, table):
    """The boundary cases of one comparison: ints against non-integral floats, ±inf, huge ints,
    None and strings against numbers, float32 against doubles."""
    columns, records = table
    text = f"{constant} {op} {name}" if flipped else f"{name} {op} {constant}"
    truth = column_truth(text)
    assert truth is not None, text  # every field-constant comparison has a column form
    mask = truth(columns, len(records))
    if mask is not None:
        assert _per_record(text, records) == mask.tolist(), text
    else:
        event("per record at run time")


def test_boundaries_compare_as_python_does():
    """Hand-picked cases where a plain NumPy comparison would answer differently."""
    cases = [
        (np.array([0.1, 0.2], np.float32), ["x > 0.1", "x == 0.1", "x <= 0.1", "0.1 < x"]),  # float32 vs double
        (np.array([0, 1, 2, -3, -2], np.int64), ["x > 0.5", "x >= 0.5", "x < 0.5", "x <= -2.5", "x == 1.0",
                                                  "x != 0.5", "-2.5 > x", "x < 1e999", "x > -1e999"]),
        (np.array([2**53, 2**53 + 1], np.int64), ["x > 9007199254740992.0", "x == 9007199254740992.0"]),
        (np.array([True, False]), ["x > 0.5", "x == 1", "not x"]),
        (np.array([3, 4], np.int32), ["x > 3.5", "1 < x < 4"]),
    ]
    for column, texts in cases:
        records = [{"x": v} for v in column.tolist()]
        for text in texts:
            mask = column_truth(text)({"x": column}, len(column))
            assert mask is not None, text
            assert mask.tolist() == _per_record(text, records), text


def test_common_predicates_have_a_column_form():
    columns = {"amount": np.array([5.0, 150.0, 100.0]), "kind": np.array(["a", "b", None], object),
               "n": np.array([1, 2, 3], np.int32), "ok": np.array([True, False, True])}
    for text, want in [("amount > 100", [False, True, False]), ("kind == 'a' or amount >= 100", [True, True, True]),
                       ("not ok and n < 2.5", [False, True, False]), ("0 < n <= 2", [True, True, False]),
                       ("kind != 'b' and ok", [True, False, True]), ("amount > 99.5", [False, True, True])]:
        truth = column_truth(text)
        assert truth is not None, text
        assert truth(columns, 3).tolist() == want, text
    assert column_truth("amount * 2 > 100") is None  # arithmetic: per record
    assert column_truth("startswith(kind, 'a')") is None
    assert column_truth("kind > 'a'")(columns, 3) is None  # ordering of objects: per record (None refuses)


def test_count_with_a_column_predicate_counts_as_per_record():
    """The operator's column path (predicate on columns) and its per-event path agree."""
    rng = np.random.default_rng(3)
    events = [Event(f"k{rng.integers(0, 5)}", 1000 + i, 1000 + i,
                    {"amount": float(rng.integers(0, 300)), "kind": str(rng.choice(["a", "b"]))}, 0, i, "s")
              for i in range(400)]
    s = CountSettings(name="c", window=50, window_kind="time", epsilon=0.1,
                      predicate="amount > 100 and kind == 'a'")
    by_columns, by_event = CountOperator(s), CountOperator(s)
    assert by_columns._truth is not None
    for lo in range(0, 400, 97):
        chunk = events[lo:lo + 97]
        assert by_columns.process_columns(EventColumns.from_events(chunk)) == []
        for e in chunk:
            by_event.process(e)
        assert outputs_of(by_columns.advance_to(chunk[-1].start + 1)) == outputs_of(by_event.advance_to(chunk[-1].start + 1))
    assert by_columns.snapshot() == by_event.snapshot()
