"""Safe expressions over record fields: ``amount > 100 and country != 'DE'``.

Used for CEP stage conditions in job files, and reusable by any operator that needs a
predicate or a value over a record: :func:`compile_expression` parses the text once with
:mod:`ast`, checks every node against a whitelist and builds a tree of closures. Nothing is
ever passed to ``eval``/``exec``; attribute names starting with ``_`` are rejected, so the
expression cannot reach Python internals.

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
import math
from collections.abc import Callable, Mapping
from typing import Any

from ctiflow.operators.cep.column_form import (AllOf, AnyOf, ColumnTruth, Compare, Const, Field, Node, Not,
                                               NotVectorizable, Operand, Truth, evaluator)
from ctiflow.operators.errors import ConfigError, EventRejected

MAX_LENGTH = 10_000
MAX_NODES = 2_000
MAX_DEPTH = 100  # nesting levels (the builder recurses once per level)
MAX_EXPONENT = 1_000
MAX_INT_BITS = 4_096  # an integer result larger than this is an error, not minutes of arithmetic
MAX_SEQUENCE = 1_000_000  # characters (or items) a repeated or joined string/list may have

Env = tuple[Any, Any]  # (record, match context or None)
Evaluator = Callable[[Env], Any]


class ExpressionError(ConfigError):
    """An expression cannot be parsed, uses something not allowed, or fails on a record."""


class ExpressionFailed(ExpressionError, EventRejected):
    """An expression failed on one record (e.g. compares a missing field): the record is
    refused (dead-lettered), the expression itself is fine."""


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _startswith(value: Any, prefix: Any) -> bool:
    return isinstance(value, str) and isinstance(prefix, str) and value.startswith(prefix)


def _endswith(value: Any, suffix: Any) -> bool:
    return isinstance(value, str) and isinstance(suffix, str) and value.endswith(suffix)


def _contains(container: Any, item: Any) -> bool:
    if container is None or item is None:
        return False
    try:
        return item in container
    except TypeError:
        return False


def _coalesce(*values: Any) -> Any:
    for value in values:
        if value is not None:
            return value
    return None


def _len(value: Any) -> Any:
    return None if value is None else len(value)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "len": _len,
    "lower": _lower,
    "upper": _upper,
    "strip": _strip,
    "min": min,
    "max": max,
    "round": round,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "startswith": _startswith,
    "endswith": _endswith,
    "contains": _contains,
    "coalesce": _coalesce,
}

STRING_METHODS = {"lower", "upper", "strip", "startswith", "endswith"}
MATCH_FUNCTIONS = {"first", "last", "prev", "count", "sum_of", "avg_of", "min_of", "max_of"}
CONSTANT_NAMES = {"true": True, "True": True, "false": False, "False": False,
                  "null": None, "None": None}


def field_of(value: Any, name: Any) -> Any:
    """``value[name]`` for mappings, ``value[index]`` for sequences; ``None`` if absent."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value.get(name)
    if isinstance(name, int) and isinstance(value, (list, tuple, str)):
        try:
            return value[name]
        except IndexError:
            return None
    if isinstance(name, str) and not name.startswith("_"):
        return getattr(value, name, None)
    return None


def _ordering(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(left: Any, right: Any) -> bool:
        if left is None or right is None:
            return False
        return op(left, right)

    return compare


_COMPARISONS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: _ordering(lambda a, b: a < b),
    ast.LtE: _ordering(lambda a, b: a <= b),
    ast.Gt: _ordering(lambda a, b: a > b),
    ast.GtE: _ordering(lambda a, b: a >= b),
    ast.In: lambda a, b: _contains(b, a),
    ast.NotIn: lambda a, b: not _contains(b, a),
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


def _power(base: Any, exponent: Any) -> Any:
    if isinstance(exponent, (int, float)) and abs(exponent) > MAX_EXPONENT:
        raise ArithmeticError(f"exponent {exponent} is larger than {MAX_EXPONENT}")
    if (type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1
            and (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS):
        raise ArithmeticError(f"the result of ** would have more than {MAX_INT_BITS} bits")
    return base**exponent


def _bounded(value: Any) -> Any:
    """``value`` if it is within the size limits (an int of at most :data:`MAX_INT_BITS` bits, a
    string or tuple of at most :data:`MAX_SEQUENCE` items), else :class:`ArithmeticError`."""
    if type(value) is int and value.bit_length() > MAX_INT_BITS:
        raise ArithmeticError(f"an integer result has more than {MAX_INT_BITS} bits")
    return value


def _multiply(a: Any, b: Any) -> Any:
    for seq, times in ((a, b), (b, a)):
        if isinstance(seq, (str, tuple)) and isinstance(times, int) and len(seq) * times > MAX_SEQUENCE:
            raise ArithmeticError(f"a repeated string or list would have more than {MAX_SEQUENCE} items")
    return _bounded(a * b)


def _remainder(a: Any, b: Any) -> Any:
    """``a % b`` of numbers; a string (or bytes) on the left is refused: Python formats it, and a
    width in its format (``'%0300000000d'``, ``'%0*d'``) builds a string of any size."""
    if isinstance(a, (str, bytes)):
        raise TypeError("% is the remainder of numbers; formatting a string with % is not allowed "
                        "(use str() and +)")
    return a % b


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, (str, tuple)) and isinstance(b, (str, tuple)) and len(a) + len(b) > MAX_SEQUENCE:
        raise ArithmeticError(f"a joined string or list would have more than {MAX_SEQUENCE} items")
    return _bounded(a + b)


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: _add,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: _multiply,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: _remainder,
    ast.Pow: _power,
}

_OPERATOR_NAMES = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
    ast.GtE: ">=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}


class CompiledExpression:
    """A parsed, checked expression; call it with a record (and a CEP match context)."""

    __slots__ = ("text", "uses_match_context", "stage_references", "field_paths", "_evaluate")

    def __init__(self, text: str, evaluate: Evaluator, stage_references: frozenset[str],
                 field_paths: frozenset[tuple[str, ...]] = frozenset()) -> None:
        self.text = text
        self._evaluate = evaluate
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
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(
            f"invalid expression {source!r}: {exc.msg} at column {exc.offset}"
        ) from None
    except (RecursionError, MemoryError):
        raise ExpressionError(f"expression {source[:60]!r}… is nested too deeply (at most {MAX_DEPTH} levels)") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise ExpressionError(f"expression {source!r} is too complex ({nodes} nodes)")
    if _depth(tree.body) > MAX_DEPTH:
        raise ExpressionError(f"expression {source[:60]!r}… is nested too deeply (at most {MAX_DEPTH} levels)")
    builder = _Builder(source, match_functions)
    evaluate = builder.build(tree.body)
    return CompiledExpression(source, evaluate, frozenset(builder.stage_references), frozenset(builder.field_paths))


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


class _Builder:
    def __init__(self, text: str, match_functions: bool) -> None:
        self.text = text
        self.match_functions = match_functions
        self.stage_references: set[str] = set()
        self.field_paths: set[tuple[str, ...]] = set()

    def fail(self, node: ast.AST, message: str) -> ExpressionError:
        column = getattr(node, "col_offset", None)
        where = f" at column {column + 1}" if column is not None else ""
        return ExpressionError(f"invalid expression {self.text!r}{where}: {message}")

    def build(self, node: ast.AST) -> Evaluator:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.fail(
                node,
                f"{type(node).__name__} is not allowed (use fields, literals, comparisons, "
                "and/or/not, arithmetic, 'in', 'x if c else y' and the listed functions)",
            )
        return method(node)

    # -- leaves ---------------------------------------------------------------------------------
    def _Constant(self, node: ast.Constant) -> Evaluator:
        value = node.value
        if not isinstance(value, (int, float, str, bool, type(None))):
            raise self.fail(node, f"constant {value!r} is not allowed")
        return lambda env: value

    def _Name(self, node: ast.Name) -> Evaluator:
        name = node.id
        if name in CONSTANT_NAMES:
            constant = CONSTANT_NAMES[name]
            return lambda env: constant
        if name.startswith("_"):
            raise self.fail(node, f"field names starting with '_' are not allowed ({name})")
        self.field_paths.add((name,))

        def field(env: Env) -> Any:
            record = env[0]
            if type(record) is dict or isinstance(record, Mapping):
                return record.get(name)
            return field_of(record, name)

        return field

    def _Attribute(self, node: ast.Attribute) -> Evaluator:
        if node.attr.startswith("_"):
            raise self.fail(node, f"attributes starting with '_' are not allowed ({node.attr})")
        inner = self.build(node.value)
        attr = node.attr
        base = node.value
        if isinstance(base, ast.Name) and (base.id,) in self.field_paths:
            self.field_paths.add((base.id, attr))
        elif (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
              and base.func.id in ("first", "last", "prev")):
            self.field_paths.add((attr,))
        return lambda env: field_of(inner(env), attr)

    def _Subscript(self, node: ast.Subscript) -> Evaluator:
        if isinstance(node.slice, ast.Slice):
            raise self.fail(node, "slices are not allowed")
        inner = self.build(node.value)
        key = self.build(node.slice)
        return lambda env: field_of(inner(env), key(env))

    def _List(self, node: ast.List) -> Evaluator:
        parts = [self.build(e) for e in node.elts]
        return lambda env: tuple(p(env) for p in parts)

    _Tuple = _List

    def _Set(self, node: ast.Set) -> Evaluator:
        parts = [self.build(e) for e in node.elts]
        return lambda env: frozenset(p(env) for p in parts)

    # -- operators ------------------------------------------------------------------------------
    def _BoolOp(self, node: ast.BoolOp) -> Evaluator:
        parts = [self.build(v) for v in node.values]
        if isinstance(node.op, ast.And):
            def both(env: Env) -> Any:
                value: Any = True
                for part in parts:
                    value = part(env)
                    if not value:
                        return value
                return value

            return both

        def either(env: Env) -> Any:
            value: Any = False
            for part in parts:
                value = part(env)
                if value:
                    return value
            return value

        return either

    def _UnaryOp(self, node: ast.UnaryOp) -> Evaluator:
        operand = self.build(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        if isinstance(node.op, ast.USub):
            if _constant(node):
                try:
                    value = -operand(None)
                except TypeError as exc:
                    raise self.fail(node, f"TypeError: {exc}") from None
                return lambda env: value
            return lambda env: -operand(env)
        if isinstance(node.op, ast.UAdd):
            return lambda env: +operand(env)
        raise self.fail(node, f"unary operator {type(node.op).__name__} is not allowed")

    def _BinOp(self, node: ast.BinOp) -> Evaluator:
        op = _BINARY.get(type(node.op))
        if op is None:
            raise self.fail(
                node,
                f"operator {type(node.op).__name__} is not allowed (allowed: + - * / // % **)",
            )
        left, right = self.build(node.left), self.build(node.right)
        if _constant(node):  # folded now: an error in constant arithmetic is a config error
            try:
                value = op(left(None), right(None))
            except (ArithmeticError, TypeError, ValueError) as exc:
                raise self.fail(node, f"{type(exc).__name__}: {exc}") from None
            return lambda env: value
        return lambda env: op(left(env), right(env))

    def _Compare(self, node: ast.Compare) -> Evaluator:
        operands = [self.build(node.left)] + [self.build(c) for c in node.comparators]
        ops = []
        for op, comparator in zip(node.ops, node.comparators):
            if isinstance(op, (ast.Is, ast.IsNot)) and not (
                isinstance(comparator, ast.Constant) and comparator.value is None
            ):
                raise self.fail(node, "'is' / 'is not' may only compare with None")
            ops.append(_COMPARISONS[type(op)])
        if len(ops) == 1:
            compare, left, right = ops[0], operands[0], operands[1]
            op_type = type(node.ops[0])
            comparator = node.comparators[0]
            if op_type in (ast.Eq, ast.NotEq) and isinstance(comparator, ast.Constant):
                value = comparator.value
                if op_type is ast.Eq:
                    return lambda env: left(env) == value
                return lambda env: left(env) != value
            return lambda env: compare(left(env), right(env))

        def chain(env: Env) -> bool:
            left = operands[0](env)
            for compare, operand in zip(ops, operands[1:]):
                right = operand(env)
                if not compare(left, right):
                    return False
                left = right
            return True

        return chain

    def _IfExp(self, node: ast.IfExp) -> Evaluator:
        test, body, orelse = self.build(node.test), self.build(node.body), self.build(node.orelse)
        return lambda env: body(env) if test(env) else orelse(env)

    # -- calls ----------------------------------------------------------------------------------
    def _Call(self, node: ast.Call) -> Evaluator:
        if node.keywords:
            raise self.fail(node, "keyword arguments are not allowed")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self.fail(node, "*arguments are not allowed")
        args = [self.build(a) for a in node.args]
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr not in STRING_METHODS:
                raise self.fail(
                    node,
                    f"method {func.attr}() is not allowed (allowed string methods: "
                    f"{', '.join(sorted(STRING_METHODS))})",
                )
            target = self.build(func.value)
            method_name = func.attr

            def call_method(env: Env) -> Any:
                value = target(env)
                if not isinstance(value, str):
                    return False if method_name in ("startswith", "endswith") else value
                return getattr(value, method_name)(*(a(env) for a in args))

            return call_method
        if not isinstance(func, ast.Name):
            raise self.fail(node, "only named functions can be called")
        name = func.id
        if name in MATCH_FUNCTIONS:
            return self._match_function(node, name, args)
        function = FUNCTIONS.get(name)
        if function is None:
            allowed = sorted(FUNCTIONS) + (sorted(MATCH_FUNCTIONS) if self.match_functions else [])
            raise self.fail(
                node, f"function {name}() is not allowed (allowed: {', '.join(allowed)})"
            )
        return lambda env: function(*(a(env) for a in args))

    def _match_function(self, node: ast.Call, name: str, args: list[Evaluator]) -> Evaluator:
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
        stage = stage_node.value
        self.stage_references.add(stage)

        def events(env: Env) -> list[Any]:
            ctx = env[1]
            return list(ctx.get_events_for_pattern(stage)) if ctx is not None else []

        if name == "first":
            return lambda env: (lambda es: es[0] if es else None)(events(env))
        if name in ("last", "prev"):
            return lambda env: (lambda es: es[-1] if es else None)(events(env))
        if name == "count":
            return lambda env: len(events(env))
        field_arg = args[1]
        if isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            self.field_paths.add((node.args[1].value,))

        def values(env: Env) -> list[Any]:
            key = field_arg(env)
            return [v for v in (field_of(e, key) for e in events(env)) if v is not None]

        if name == "sum_of":
            return lambda env: sum(values(env))
        if name == "avg_of":
            return lambda env: (lambda vs: math.fsum(vs) / len(vs) if vs else None)(values(env))
        if name == "min_of":
            return lambda env: (lambda vs: min(vs) if vs else None)(values(env))
        return lambda env: (lambda vs: max(vs) if vs else None)(values(env))


# -- column at a time ---------------------------------------------------------------------------
_COMPARE_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def column_truth(expression: CompiledExpression | str) -> ColumnTruth | None:
    """The truthiness of an expression over whole columns (:func:`column_node` evaluated), or None."""
    node = column_node(expression)
    return None if node is None else evaluator(node)


def column_node(expression: CompiledExpression | str) -> Node | None:
    """The expression in the column form (:mod:`ctiflow.operators.cep.column_form`, the python
    rule), or None if it has anything beyond ``and``/``or``/``not`` of comparisons (``== != < <=
    > >=``, chains too) between fields and constants and bare boolean fields (arithmetic,
    functions, ``in``, match functions: per record). Python's ``and``/``or`` return operands, but
    only their truthiness matters to a predicate, which is what the column form computes."""
    text = expression.text if isinstance(expression, CompiledExpression) else expression
    if getattr(expression, "uses_match_context", False):
        return None
    try:
        return _lowered(ast.parse(text.strip(), mode="eval").body)
    except (NotVectorizable, SyntaxError):
        return None


def _lowered(node: ast.AST) -> Node:
    """``node`` in the column form, or :class:`NotVectorizable`."""
    if isinstance(node, ast.BoolOp):
        parts = tuple(_lowered(v) for v in node.values)
        return AllOf(parts) if isinstance(node.op, ast.And) else AnyOf(parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return Not(_lowered(node.operand))
    if isinstance(node, ast.Compare):
        if any(type(op) not in _COMPARE_OPS for op in node.ops):
            raise NotVectorizable("comparison")
        operands = [_operand(node.left)] + [_operand(c) for c in node.comparators]
        pairs = tuple(Compare(_COMPARE_OPS[type(op)], left, right)
                      for op, left, right in zip(node.ops, operands, operands[1:]))
        return pairs[0] if len(pairs) == 1 else AllOf(pairs)
    if isinstance(node, ast.Name) and node.id not in CONSTANT_NAMES:
        return Truth(node.id)
    raise NotVectorizable(type(node).__name__)


def _operand(node: ast.AST) -> Operand:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
        return Const(node.value)
    if isinstance(node, ast.Name):
        return Const(CONSTANT_NAMES[node.id]) if node.id in CONSTANT_NAMES else Field(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float):
        return Const(-node.operand.value)
    raise NotVectorizable(type(node).__name__)
