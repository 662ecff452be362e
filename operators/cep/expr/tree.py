"""The one intermediate form of both expression languages, and their one set of bounds.

A job file's Python-subset expression (:mod:`ctiflow.operators.cep.expr.expression`, parsed with
:mod:`ast`) and a ``MATCH_RECOGNIZE`` query's expressions (:mod:`ctiflow.operators.cep.sql.parse`) are
both lowered to :class:`Expr` trees; :func:`ctiflow.operators.cep.expr.evaluate.compile_expr` turns a
tree into the one row evaluator and :func:`ctiflow.operators.cep.expr.evaluate.column_form` into the
column form. The two languages share the tree, the builder, the bounds and the column form;
their node kinds differ where their semantics do: SQL's ``binary`` ``AND`` is three-valued and
its ``/`` is Java's, Python's ``py_logic`` ``and`` returns an operand, its ``py_compare`` never
orders ``None`` and its arithmetic is exact but bounded. Kinds:

* both — ``literal`` (value);
* SQL — ``column`` (value ``(variable or None, name)``), ``call unary binary case is_null
  is_bool between in like cast interval star``;
* Python — ``py_field`` (value a field name), ``py_attr`` (``a.b``), ``py_item`` (``a[k]``),
  ``py_tuple``, ``py_set``,
  ``py_logic`` (``and``/``or``), ``py_not``, ``py_neg``, ``py_pos``, ``py_arith`` (value the
  operator), ``py_compare`` (value the chain's operators, args its operands), ``py_if``,
  ``py_call`` (value a function name), ``py_method`` (value a string method; first arg the
  target), ``py_match`` (value ``first``/``count``/…, first arg the stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bounds:
    """What one expression may cost, whatever its language: checked when it is compiled (size,
    depth) or when it runs on a record (numbers, strings), so no record or rule can make an
    evaluator take unbounded time or memory."""

    length: int = 10_000          # characters of a Python-subset expression
    query_length: int = 100_000   # characters of a MATCH_RECOGNIZE query
    nodes: int = 2_000            # nodes of one expression
    depth: int = 100              # nesting levels (builders recurse once per level)
    exponent: int = 1_000         # |exponent| of Python's **
    int_bits: int = 4_096         # an integer result of Python arithmetic larger than this is refused
    sequence: int = 1_000_000     # characters or items a repeated or joined string/list may have
    long_bits: int = 64           # SQL integer arithmetic wraps here (Flink's BIGINT)


BOUNDS = Bounds()


@dataclass(frozen=True)
class Expr:
    """An expression node: ``kind`` (see the module) and its parts; ``pos`` for errors (a
    character offset into the expression's text)."""

    kind: str
    pos: int
    value: Any = None
    args: tuple = ()


def children_of(expr: Expr) -> list[Expr]:
    if expr.kind == "case":
        branches, otherwise = expr.args
        out = [p for branch in branches for p in branch] + [otherwise]
        return out + ([expr.value] if expr.value is not None else [])
    return [a for a in expr.args if isinstance(a, Expr)]


def variables_of(expr: Expr) -> set[str]:
    """The pattern variables a SQL expression names (``A.price`` → ``A``)."""
    found = set()
    if expr.kind == "column" and expr.value[0] is not None:
        found.add(expr.value[0])
    for sub in children_of(expr):
        found |= variables_of(sub)
    return found


def reads_columns(expr: Expr) -> bool:
    return expr.kind == "column" or any(reads_columns(sub) for sub in children_of(expr))
