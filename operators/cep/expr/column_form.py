"""The column form of a condition: the one intermediate form both expression languages lower
their column-at-a-time subset to, and the one evaluator for it.

A job file's Python-subset expression (:mod:`ctiflow.operators.cep.expr.expression`) and a
``MATCH_RECOGNIZE`` ``DEFINE`` (:mod:`ctiflow.operators.cep.sql.translate`) each compile once; where
a condition is ``and``/``or``/``not`` of comparisons between fields and constants, its compiler
also lowers it to these nodes, and :func:`evaluator` turns them into ``truth(columns, n)`` →
a bool array over whole NumPy columns (``columns``: field name → array of ``n`` values), which
the count operator's predicate and the match operator's start filter use to skip rows in bulk.

Exactness is the contract: the array is, row by row, the truth the language's own per-record
evaluation gives. Where NumPy could differ (a column of mixed Python types, an int beyond 2^53
against a float, a field missing from the columns in Python's semantics, …) ``truth`` returns
None and the caller evaluates per record. The languages' comparisons differ, so each
:class:`Compare` names its rule:

* ``python``: ``None`` never satisfies an ordering, ``==``/``!=`` compare as Python does, ints
  and floats compare exactly (int64 against a non-integral float too);
* ``sql``: a comparison with NULL (a missing column, ``None``, a float NaN) is unknown, and only
  a known TRUE counts; numbers compare as Java does (BIGINT against DOUBLE in double).

The logic nodes combine exact truth arrays, so they are the same for both: ``AND``/``OR`` of
SQL comparisons are TRUE exactly when both / one of them are (SQL lowers no ``NOT``: NOT of
unknown is unknown, not TRUE).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

ORDERINGS = ("<", "<=", ">", ">=")
FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PYTHON = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge}
_UFUNCS = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
           ">=": np.greater_equal}
_EXACT_FLOAT = 2**53  # ints up to this compare with a float64 exactly
_NUMERIC = (np.int64, np.float64, np.bool_)  # (python-rule columns are normalised to these or object)


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class Field:
    name: str


@dataclass(frozen=True)
class Compare:
    """``left op right`` (op one of ``== != < <= > >=``) under ``rule`` (``python`` or ``sql``)."""

    op: str
    left: "Operand"
    right: "Operand"
    rule: str = "python"


@dataclass(frozen=True)
class AllOf:
    parts: tuple["Node", ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple["Node", ...]


@dataclass(frozen=True)
class Not:
    part: "Node"


@dataclass(frozen=True)
class Truth:
    """A bare boolean field (Python's truthiness of it)."""

    name: str


Operand = Union[Const, Field]
Node = Union[Compare, AllOf, AnyOf, Not, Truth, Const]
ColumnTruth = Callable[[Mapping[str, Any], int], Any]


class NotVectorizable(Exception):
    """This node (or, at run time, a column's type) needs per-record evaluation."""


def evaluator(node: Node) -> ColumnTruth:
    """``truth(columns, n)`` → bool array of ``n``, or None where only per-record evaluation is
    exact for these columns."""
    evaluate = _build(node)

    def truth(columns: Mapping[str, Any], n: int):
        try:
            value = evaluate(columns, n)
        except NotVectorizable:
            return None
        return value if isinstance(value, np.ndarray) else np.full(n, bool(value))

    return truth


def _build(node: Node) -> Callable[[Mapping[str, Any], int], Any]:
    if isinstance(node, (AllOf, AnyOf)):
        parts = [_build(p) for p in node.parts]
        combine = np.logical_and if isinstance(node, AllOf) else np.logical_or

        def logic(cols, n):
            out = _truth_of(parts[0](cols, n))
            for part in parts[1:]:
                out = combine(out, _truth_of(part(cols, n)))
            return out

        return logic
    if isinstance(node, Not):
        inner = _build(node.part)
        return lambda cols, n: np.logical_not(_truth_of(inner(cols, n)))
    if isinstance(node, Truth):
        return lambda cols, n: _bare(_python_column(cols, node.name, n))
    if isinstance(node, Const):
        return lambda cols, n: node.value
    if isinstance(node, Compare):
        kernel = _python_compare if node.rule == "python" else _sql_compare
        return lambda cols, n: kernel(node.op, node.left, node.right, cols, n)
    raise TypeError(f"not a column-form node: {node!r}")


def _truth_of(value):
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_:
            return value
        raise NotVectorizable("non-boolean column")
    return bool(value)


def _bare(col):
    if col.dtype != np.bool_:
        raise NotVectorizable("truthiness of a non-boolean column")
    return col


# -- the python rule ------------------------------------------------------------------------------
def _python_column(cols: Mapping[str, Any], name: str, n: int):
    """The column as the values Python compares: int64 / float64 / bool, or object."""
    col = cols.get(name)
    if col is None or not isinstance(col, np.ndarray) or len(col) != n:
        raise NotVectorizable(name)
    kind = col.dtype.kind
    if kind == "f":  # (a float32 value compares as the Python float it becomes)
        return col.astype(np.float64, copy=False)
    if kind in "iu" and not (kind == "u" and col.itemsize == 8):
        return col.astype(np.int64, copy=False)
    if col.dtype == object:
        return _typed(col)
    if kind != "b":
        raise NotVectorizable(str(col.dtype))
    return col


def _typed(col):
    """An object column of Python numbers of one type as int64 / float64 / bool (what it holds,
    exactly), else as it is."""
    kinds = set(map(type, col.tolist()))
    if len(kinds) != 1:
        return col
    (kind,) = kinds
    if kind is float:
        return col.astype(np.float64)
    if kind is bool:
        return col.astype(np.bool_)
    if kind is int:
        try:
            return np.array(col.tolist(), np.int64)
        except OverflowError:
            return col
    return col


def _python_compare(op: str, left: Operand, right: Operand, cols, n):
    """``left op right`` elementwise, as Python compares each pair; raises where not exact."""
    if isinstance(left, Const) and isinstance(right, Const):
        try:
            return _PYTHON[op](left.value, right.value)
        except Exception as exc:  # (refused per record, with the reason)
            raise NotVectorizable("constants") from exc
    if isinstance(left, Const):
        op, left, right = FLIPPED[op], right, left
    lv = _python_column(cols, left.name, n)
    if isinstance(right, Field):
        return _python_columns(op, lv, _python_column(cols, right.name, n))
    rv = right.value
    if lv.dtype == object:
        if op in ORDERINGS or isinstance(rv, float):
            raise NotVectorizable("object column")
        got = np.equal(lv, rv) if op == "==" else np.not_equal(lv, rv)  # (each pair as Python compares it)
        return got.astype(np.bool_, copy=False)
    if lv.dtype.type not in _NUMERIC:
        raise NotVectorizable(str(lv.dtype))
    if rv is None or isinstance(rv, str):
        if op in ORDERINGS:
            if rv is None:
                return np.zeros(len(lv), bool)  # an ordering with None is false
            raise NotVectorizable("str")
        return np.full(len(lv), op == "!=")
    if lv.dtype.kind == "f":
        if isinstance(rv, int) and abs(rv) > _EXACT_FLOAT:
            raise NotVectorizable("big int")
        return _UFUNCS[op](lv, float(rv))
    return _int_against(op, lv, rv)


def _python_columns(op: str, lv, rv):
    if lv.dtype == object:
        if rv.dtype != object or op in ORDERINGS:
            raise NotVectorizable("object column")
        return np.fromiter((a == b if op == "==" else a != b for a, b in zip(lv.tolist(), rv.tolist())),
                           np.bool_, count=len(lv))
    if rv.dtype.type not in _NUMERIC or lv.dtype.type not in _NUMERIC \
            or (lv.dtype.kind == "f") != (rv.dtype.kind == "f"):
        raise NotVectorizable("mixed columns")
    return _UFUNCS[op](lv, rv)


def _int_against(op: str, lv, rv):
    """An int64 (or bool) column against a number, exactly."""
    if isinstance(rv, float):
        if math.isnan(rv):
            return np.full(len(lv), op == "!=")
        if math.isinf(rv):
            below = rv > 0  # every int is below +inf, above -inf
            result = {"==": False, "!=": True, "<": below, "<=": below, ">": not below, ">=": not below}[op]
            return np.full(len(lv), result)
        if not rv.is_integer():  # exact: compare with the integers around it
            if op in ("==", "!="):
                return np.full(len(lv), op == "!=")
            floor = math.floor(rv)
            op, rv = {"<": ("<=", floor), "<=": ("<=", floor), ">": (">", floor), ">=": (">", floor)}[op]
        rv = int(rv)
    if not -(2**63) <= rv < 2**63:
        raise NotVectorizable("beyond int64")
    return _UFUNCS[op](lv.astype(np.int64, copy=False), np.int64(rv))


# -- the sql rule ---------------------------------------------------------------------------------
def _sql_compare(op: str, left: Operand, right: Operand, cols, n):
    """``column op literal`` is TRUE (NULL, a NaN or an absent column: unknown, so not TRUE)."""
    if isinstance(left, Const):
        op, left, right = FLIPPED[op], right, left
    if not isinstance(left, Field) or not isinstance(right, Const):
        raise NotVectorizable("sql: column against literal only")
    values, literal = cols.get(left.name), right.value
    if values is None:
        return np.zeros(n, bool)  # the column is absent: NULL everywhere
    if values.dtype.kind in "if" and isinstance(literal, (int, float)) and not isinstance(literal, bool):
        known = _UFUNCS[op](values, literal)
        return known & ~np.isnan(values) if values.dtype.kind == "f" else known
    if values.dtype.kind == "O" and isinstance(literal, str):
        items = values.tolist()
        if not all(v is None or type(v) is str for v in items):
            raise NotVectorizable("sql: mixed object column")
        compare = _PYTHON[op]
        return np.fromiter((v is not None and compare(v, literal) for v in items), bool, n)
    raise NotVectorizable("sql: another mix of types")
