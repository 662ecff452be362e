"""Safe expressions over record fields: ``amount > 100 and country != 'DE'``.

Used for CEP stage conditions in job files, and reusable by any operator that needs a
predicate or a value over a record: :func:`compile_expression` parses the text once with
:mod:`ast`, checks every node against a whitelist and lowers it to the tree both expression
languages share (:mod:`ctiflow.operators.cep.expr.tree`), which the one row evaluator
(:func:`ctiflow.operators.cep.expr.evaluate.compile_expr`) and the column form
(:func:`~ctiflow.operators.cep.expr.evaluate.column_form`) take from there. Nothing is ever passed to
``eval``/``exec``; attribute names starting with ``_`` are rejected, so the expression cannot
reach Python internals.

Language (a subset of Python expressions):

* literals: numbers, strings, ``True/False/None`` (also ``true/false/null``), lists/tuples/sets;
* a bare name is a field of the record (``amount``); a missing field is ``None``;
  ``a.b`` / ``a['b']`` read nested fields, ``xs[0]`` an element (missing: ``None``);
* ``and or not``, ``== != < <= > >=`` (chains allowed), ``in``, ``not in``, ``is None``,
  ``is not None``, ``+ - * / // % **`` (``%`` is the remainder of numbers, never string
  formatting), ``x if c else y``;
* ordering comparisons with ``None`` are false (a missing field never satisfies ``> 100``);
* functions: ``abs len lower upper strip min max round int float str bool startswith
  endswith contains coalesce``; string methods ``.lower() .upper() .strip()
  .startswith(s) .endswith(s)``.

With ``match_functions=True`` (CEP stage conditions) the expression may also look at the
events already matched: ``first('a')``, ``last('a')`` (alias ``prev('a')``) give an event of
stage ``a`` (or ``None``), ``count('a')`` the number of events, ``sum_of('a', 'amount')``,
``avg_of``, ``min_of``, ``max_of`` aggregate a field over them. Such an expression is
*iterative* (:attr:`CompiledExpression.uses_match_context`).

Errors are :class:`ExpressionError`, a :class:`~ctiflow.operators.errors.ConfigError`: the message
quotes the expression, says what is not allowed and where (column), and lists what is.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from ctiflow.operators.cep.expr.column_form import ColumnTruth, Node, evaluator
from ctiflow.operators.cep.expr.evaluate import (PY_FUNCTIONS, PY_MATCH_FUNCTIONS, PY_STRING_METHODS,
                                            column_form, compile_expr, field_of)
from ctiflow.operators.cep.expr.tree import BOUNDS, Expr
from ctiflow.operators.errors import ConfigError, EventRejected

__all__ = ["CompiledExpression", "ExpressionError", "ExpressionFailed", "column_node", "column_truth",
           "compile_expression", "field_of"]

MAX_LENGTH = BOUNDS.length
MAX_NODES = BOUNDS.nodes
MAX_DEPTH = BOUNDS.depth

Env = tuple[Any, Any]  # (record, match context or None)
Evaluator = Callable[[Env], Any]
FUNCTIONS = PY_FUNCTIONS
STRING_METHODS = PY_STRING_METHODS
MATCH_FUNCTIONS = PY_MATCH_FUNCTIONS
CONSTANT_NAMES = {"true": True, "True": True, "false": False, "False": False,
                  "null": None, "None": None}


class ExpressionError(ConfigError):
    """An expression cannot be parsed, uses something not allowed, or fails on a record."""


class ExpressionFailed(ExpressionError, EventRejected):
    """An expression failed on one record (e.g. compares a missing field): the record is
    refused (dead-lettered), the expression itself is fine."""


_COMPARE_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
                ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_ARITH_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
              ast.Pow: "**"}


class CompiledExpression:
    """A parsed, checked expression; call it with a record (and a CEP match context)."""

    __slots__ = ("text", "tree", "uses_match_context", "stage_references", "field_paths", "_evaluate")

    def __init__(self, text: str, tree: Expr, stage_references: frozenset[str],
                 field_paths: frozenset[tuple[str, ...]] = frozenset()) -> None:
        self.text = text
        #: The expression in the form both languages share (:mod:`ctiflow.operators.cep.expr.tree`).
        self.tree = tree
        self._evaluate = compile_expr(tree)
        self.stage_references = stage_references
        #: The record fields the expression reads: ``("amount",)`` for a bare name,
        #: ``("reference", "risk_threshold")`` for ``name.attr``, ``("country",)`` for
        #: ``first('a').country`` (a field of a matched event). What a config check compares
        #: with the stream's schema.
        self.field_paths = field_paths
        self.uses_match_context = bool(stage_references)

    def __call__(self, record: Any, ctx: Any = None) -> Any:
        try:
            return self._evaluate((record, ctx))
        except ExpressionError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported with the expression and cause
            raise ExpressionFailed(
                f"expression {self.text!r} failed on record {record!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"CompiledExpression({self.text!r})"


def compile_expression(text: str, *, match_functions: bool = False) -> CompiledExpression:
    """Parse and check ``text`` once; the result evaluates it over a record mapping.

    ``match_functions`` enables ``first('a')``, ``count('a')``, … (CEP stage conditions only).
    Raises :class:`ExpressionError` (a ``ConfigError``) naming the problem.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"an expression must be a string, got {type(text).__name__}")
    source = text.strip()
    if not source:
        raise ExpressionError("an expression must not be empty")
    if len(source) > MAX_LENGTH:
        raise ExpressionError(f"expression is longer than {MAX_LENGTH} characters")
    try:
        parsed = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(
            f"invalid expression {source!r}: {exc.msg} at column {exc.offset}"
        ) from None
    except (RecursionError, MemoryError):
        raise ExpressionError(f"expression {source[:60]!r}… is nested too deeply (at most {MAX_DEPTH} "
                              "levels)") from None
    nodes = sum(1 for _ in ast.walk(parsed))
    if nodes > MAX_NODES:
        raise ExpressionError(f"expression {source!r} is too complex ({nodes} nodes)")
    if _depth(parsed.body) > MAX_DEPTH:
        raise ExpressionError(f"expression {source[:60]!r}… is nested too deeply (at most {MAX_DEPTH} "
                              "levels)")
    lower = _Lowering(source, match_functions)
    tree = lower.lower(parsed.body)
    return CompiledExpression(source, tree, frozenset(lower.stage_references), frozenset(lower.field_paths))


def _depth(node: ast.AST) -> int:
    """How deeply ``node`` nests (iteratively: a deep tree must not exhaust the stack here)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _constant(node: ast.AST) -> bool:
    """``node`` reads no field and calls nothing: its value is known when it is compiled."""
    return not any(isinstance(n, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)) for n in ast.walk(node))


class _Lowering:
    """Python's :mod:`ast` → the shared tree, checking every node against the whitelist (the
    error names the column and what is allowed); constant arithmetic is folded here, so an error
    in it is a configuration error, not a record's."""

    def __init__(self, text: str, match_functions: bool) -> None:
        self.text = text
        self.match_functions = match_functions
        self.stage_references: set[str] = set()
        self.field_paths: set[tuple[str, ...]] = set()

    def fail(self, node: ast.AST, message: str) -> ExpressionError:
        column = getattr(node, "col_offset", None)
        where = f" at column {column + 1}" if column is not None else ""
        return ExpressionError(f"invalid expression {self.text!r}{where}: {message}")

    def lower(self, node: ast.AST) -> Expr:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.fail(
                node,
                f"{type(node).__name__} is not allowed (use fields, literals, comparisons, "
                "and/or/not, arithmetic, 'in', 'x if c else y' and the listed functions)",
            )
        return method(node)

    @staticmethod
    def _node(node: ast.AST, kind: str, value: Any = None, args: tuple = ()) -> Expr:
        return Expr(kind, getattr(node, "col_offset", 0), value, args)

    def _folded(self, node: ast.AST, tree: Expr, errors: tuple) -> Expr:
        """``tree`` evaluated now if ``node`` is constant (an error in it: the expression's)."""
        if not _constant(node):
            return tree
        try:
            return self._node(node, "literal", compile_expr(tree)(None))
        except errors as exc:
            raise self.fail(node, f"{type(exc).__name__}: {exc}") from None

    # -- leaves ---------------------------------------------------------------------------------
    def _Constant(self, node: ast.Constant) -> Expr:
        if not isinstance(node.value, (int, float, str, bool, type(None))):
            raise self.fail(node, f"constant {node.value!r} is not allowed")
        return self._node(node, "literal", node.value)

    def _Name(self, node: ast.Name) -> Expr:
        name = node.id
        if name in CONSTANT_NAMES:
            return self._node(node, "literal", CONSTANT_NAMES[name])
        if name.startswith("_"):
            raise self.fail(node, f"field names starting with '_' are not allowed ({name})")
        self.field_paths.add((name,))
        return self._node(node, "py_field", name)

    def _Attribute(self, node: ast.Attribute) -> Expr:
        if node.attr.startswith("_"):
            raise self.fail(node, f"attributes starting with '_' are not allowed ({node.attr})")
        inner = self.lower(node.value)
        base = node.value
        if isinstance(base, ast.Name) and (base.id,) in self.field_paths:
            self.field_paths.add((base.id, node.attr))
        elif (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
              and base.func.id in ("first", "last", "prev")):
            self.field_paths.add((node.attr,))
        return self._node(node, "py_attr", node.attr, (inner,))

    def _Subscript(self, node: ast.Subscript) -> Expr:
        if isinstance(node.slice, ast.Slice):
            raise self.fail(node, "slices are not allowed")
        return self._node(node, "py_item", None, (self.lower(node.value), self.lower(node.slice)))

    def _List(self, node: ast.List) -> Expr:
        return self._node(node, "py_tuple", None, tuple(self.lower(e) for e in node.elts))

    _Tuple = _List

    def _Set(self, node: ast.Set) -> Expr:
        return self._node(node, "py_set", None, tuple(self.lower(e) for e in node.elts))

    # -- operators ------------------------------------------------------------------------------
    def _BoolOp(self, node: ast.BoolOp) -> Expr:
        return self._node(node, "py_logic", "and" if isinstance(node.op, ast.And) else "or",
                          tuple(self.lower(v) for v in node.values))

    def _UnaryOp(self, node: ast.UnaryOp) -> Expr:
        operand = self.lower(node.operand)
        if isinstance(node.op, ast.Not):
            return self._node(node, "py_not", None, (operand,))
        if isinstance(node.op, ast.USub):
            return self._folded(node, self._node(node, "py_neg", None, (operand,)), (TypeError,))
        if isinstance(node.op, ast.UAdd):
            return self._node(node, "py_pos", None, (operand,))
        raise self.fail(node, f"unary operator {type(node.op).__name__} is not allowed")

    def _BinOp(self, node: ast.BinOp) -> Expr:
        op = _ARITH_OPS.get(type(node.op))
        if op is None:
            raise self.fail(
                node,
                f"operator {type(node.op).__name__} is not allowed (allowed: + - * / // % **)",
            )
        tree = self._node(node, "py_arith", op, (self.lower(node.left), self.lower(node.right)))
        return self._folded(node, tree, (ArithmeticError, TypeError, ValueError))

    def _Compare(self, node: ast.Compare) -> Expr:
        operands = (self.lower(node.left), *(self.lower(c) for c in node.comparators))
        for op, comparator in zip(node.ops, node.comparators):
            if isinstance(op, (ast.Is, ast.IsNot)) and not (
                isinstance(comparator, ast.Constant) and comparator.value is None
            ):
                raise self.fail(node, "'is' / 'is not' may only compare with None")
        return self._node(node, "py_compare", tuple(_COMPARE_OPS[type(op)] for op in node.ops), operands)

    def _IfExp(self, node: ast.IfExp) -> Expr:
        return self._node(node, "py_if", None, (self.lower(node.test), self.lower(node.body),
                                                self.lower(node.orelse)))

    # -- calls ----------------------------------------------------------------------------------
    def _Call(self, node: ast.Call) -> Expr:
        if node.keywords:
            raise self.fail(node, "keyword arguments are not allowed")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self.fail(node, "*arguments are not allowed")
        args = tuple(self.lower(a) for a in node.args)
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr not in STRING_METHODS:
                raise self.fail(
                    node,
                    f"method {func.attr}() is not allowed (allowed string methods: "
                    f"{', '.join(sorted(STRING_METHODS))})",
                )
            return self._node(node, "py_method", func.attr, (self.lower(func.value), *args))
        if not isinstance(func, ast.Name):
            raise self.fail(node, "only named functions can be called")
        name = func.id
        if name in MATCH_FUNCTIONS:
            return self._match_function(node, name, args)
        if name not in FUNCTIONS:
            allowed = sorted(FUNCTIONS) + (sorted(MATCH_FUNCTIONS) if self.match_functions else [])
            raise self.fail(
                node, f"function {name}() is not allowed (allowed: {', '.join(allowed)})"
            )
        return self._node(node, "py_call", name, args)

    def _match_function(self, node: ast.Call, name: str, args: tuple) -> Expr:
        if not self.match_functions:
            raise self.fail(
                node, f"{name}() looks at matched CEP events and is only allowed in stage "
                "conditions of a match pattern",
            )
        expected = 2 if name.endswith("_of") else 1
        if len(node.args) != expected:
            raise self.fail(node, f"{name}() takes {expected} argument(s)")
        stage_node = node.args[0]
        if not (isinstance(stage_node, ast.Constant) and isinstance(stage_node.value, str)):
            raise self.fail(node, f"the stage of {name}() must be a string literal")
        self.stage_references.add(stage_node.value)
        if expected == 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            self.field_paths.add((node.args[1].value,))
        return self._node(node, "py_match", name, args)


# -- column at a time ---------------------------------------------------------------------------
def column_truth(expression: CompiledExpression | str) -> ColumnTruth | None:
    """The truthiness of an expression over whole columns (:func:`column_node` evaluated), or None."""
    node = column_node(expression)
    return None if node is None else evaluator(node)


def column_node(expression: CompiledExpression | str) -> Node | None:
    """The expression in the column form (:func:`ctiflow.operators.cep.expr.evaluate.column_form`, the
    python rule), or None where it needs a record at a time (arithmetic, functions, ``in``,
    match functions)."""
    if isinstance(expression, str):
        try:
            expression = compile_expression(expression, match_functions=True)
        except ExpressionError:
            return None
    if expression.uses_match_context:
        return None
    return column_form(expression.tree)
