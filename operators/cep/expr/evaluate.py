"""The one row evaluator of both expression languages, and their one lowering to the column form.

:func:`compile_expr` turns an :class:`~ctiflow.operators.cep.expr.tree.Expr` tree — a ``MATCH_RECOGNIZE``
expression or a job file's Python-subset expression — into a closure over a row, one builder per
node kind (:data:`_BUILDERS`); :func:`column_form` lowers the part of either that NumPy can
answer exactly to :mod:`ctiflow.operators.cep.expr.column_form`. Bounds come from one table
(:data:`ctiflow.operators.cep.expr.tree.BOUNDS`). A failure on the data is the record's, never the
job's: an :class:`~ctiflow.operators.errors.EventRejected` — :class:`RowRefused` /
:class:`MatchRefused` here (DEFINE, MEASURES), ``ExpressionFailed`` for a Python-subset
expression (:mod:`ctiflow.operators.cep.expr.expression`) — which a job dead-letters with the reason.

SQL's semantics as Flink has them: three-valued logic (NULL compares as unknown; a condition holds
only when TRUE), Java's integer division and remainder, BIGINT arithmetic wrapping at 64 bits.
The Python subset's as Python has them, except that ``None`` never orders, ``%`` never formats a
string and integers, strings and lists are bounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ctiflow.operators.cep.expr.column_form import (FLIPPED, AllOf, AnyOf, Compare, Const, Field, Node, Not,
                                               NotVectorizable, Operand, Truth)
from ctiflow.operators.cep.expr.vocabulary import (AGGREGATES, CAST_TYPES, NAVIGATION, STAR, Row, SqlError,
                                                   Timestamp)
from ctiflow.operators.cep.expr.tree import BOUNDS, Expr, variables_of
from ctiflow.operators.errors import EventRejected


class Scope:
    """What a column reference and a navigation see: rows per variable, in time order."""

    __slots__ = ("rows_of", "current", "define", "classifier", "number", "emitted")

    def __init__(self, rows_of: Callable[[str], list[Row]], current: Row | None, define: str | None,
                 classifier: str | None = None, number: int = 0, emitted: int | None = None) -> None:
        self.rows_of = rows_of
        self.current = current
        self.define = define
        self.classifier = classifier
        self.number = number
        self.emitted = emitted


class RowRefused(EventRejected):
    """A ``DEFINE`` failed on a row's data (a CAST of ``'DE'`` to INT, an integer division by
    zero, …): the row is refused — a job writes it to the dead-letter topic with this reason and
    matches the rest as if it had not come (:meth:`Nfa.process_with_ids` is all or nothing)."""


class MatchRefused(EventRejected):
    """A ``MEASURES`` expression failed on a match's rows: the match is not emitted; a job
    writes it to the dead-letter topic with this reason."""


#: What evaluating an expression raises when the *data* is the problem (never a bug of ours:
#: the evaluator turns Python's own errors on values into these).
DATA_ERRORS = (SqlError, ArithmeticError, ValueError)


def guarded(evaluate: Callable[[Scope], Any], clause: str) -> Callable[[Scope], Any]:
    """``evaluate``, with a failure on the data raised as :class:`RowRefused` naming ``clause``."""

    def guarded(scope: Scope) -> Any:
        try:
            return evaluate(scope)
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise RowRefused(f"{clause}: {reason}") from None

    return guarded


def compile_expr(expr: Expr) -> Callable[[Any], Any]:
    """The row evaluator of either language: a closure evaluating ``expr`` — a SQL tree in a
    :class:`Scope` (three-valued logic: ``None`` is NULL), a Python-subset tree in ``(record,
    match context)``."""
    kind = expr.kind
    if kind == "literal":
        value = expr.value
        return lambda s: value
    if kind == "unary":
        inner = compile_expr(expr.args[0])
        if expr.value == "NOT":
            return lambda s: (lambda v: None if v is None else not v)(inner(s))
        if expr.value == "-":
            return lambda s: _negate(inner(s), expr.pos)
        return inner
    if kind == "is_null":
        inner, negated = compile_expr(expr.args[0]), expr.value
        return lambda s: (inner(s) is None) != negated
    if kind == "is_bool":
        inner, (value, negated) = compile_expr(expr.args[0]), expr.value
        return lambda s: (inner(s) is value) != negated
    if kind == "cast":
        inner, target = compile_expr(expr.args[0]), CAST_TYPES[expr.value]
        return lambda s: _cast(inner(s), target)
    build = _BUILDERS.get(kind)
    if build is None:
        raise SqlError(f"{kind} is not supported here", "", expr.pos)
    return build(expr)


def _column(expr: Expr) -> Callable[[Scope], Any]:
    var, column = expr.value

    def column_value(s: Scope) -> Any:
        if s.define is not None and (var is None or var == s.define):
            return s.current.get(column)
        rows = s.rows_of(var if var is not None else STAR)
        return rows[-1].get(column) if rows else None

    return column_value


def _between(expr: Expr) -> Callable[[Scope], Any]:
    v, lo, hi = (compile_expr(a) for a in expr.args)
    negated = expr.value

    def between(s: Scope) -> Any:
        x, a, b = v(s), lo(s), hi(s)
        result = _and(_cmp(">=", x, a), _cmp("<=", x, b))
        return None if result is None else result != negated

    return between


def _in(expr: Expr) -> Callable[[Scope], Any]:
    v, *items = (compile_expr(a) for a in expr.args)
    negated = expr.value

    def in_(s: Scope) -> Any:
        x = v(s)
        result: Any = False
        for item in items:
            eq = _cmp("=", x, item(s))
            if eq is True:
                result = True
                break
            if eq is None:
                result = None
        return None if result is None else result != negated

    return in_


def _like(expr: Expr) -> Callable[[Scope], Any]:
    v, pattern = (compile_expr(a) for a in expr.args)
    negated = expr.value

    def like(s: Scope) -> Any:
        x, p = v(s), pattern(s)
        if x is None or p is None:
            return None
        return like_match(str(x), str(p)) != negated

    return like


def like_match(text: str, pattern: str) -> bool:
    """SQL ``LIKE``: ``%`` any run of characters, ``_`` any one, the rest itself; the whole text.

    By hand, not a regular expression: a backtracking regex takes time exponential in the
    ``%`` s (``'%a%a%a%a%b'`` against a long run of ``a`` s never returns), so one record could
    stall a job. Greedy with one backtrack point, the last ``%``: at most ``len(text) ×
    len(pattern)`` steps."""
    t = p = 0
    star, mark = -1, 0
    n, m = len(text), len(pattern)
    while t < n:
        if p < m and pattern[p] == "%":
            star, mark = p, t
            p += 1
        elif p < m and (pattern[p] == "_" or pattern[p] == text[t]):
            t += 1
            p += 1
        elif star >= 0:  # let the last % take one more character
            mark += 1
            t, p = mark, star + 1
        else:
            return False
    while p < m and pattern[p] == "%":
        p += 1
    return p == m


def _negate(v: Any, pos: int) -> Any:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SqlError(f"cannot negate {_type(v)} {v!r}", "", pos)
    return _long(-v)


LONG = 2 ** (BOUNDS.long_bits - 1)


def _long(v: Any) -> Any:
    """An integer result as Java's ``long`` arithmetic (Flink's BIGINT) has it: wrapped to 64 bits
    (so a product of large values is what Flink gives, and always fits the output's Avro ``long``)."""
    if type(v) is int and not -LONG <= v < LONG:
        return (v + LONG) % (2 * LONG) - LONG
    return v


def _kleene(a: Any, b: Any, dominant: bool) -> Any:
    """SQL's three-valued AND (``dominant`` False) and OR (True): the dominant value wins, else
    NULL if either side is NULL."""
    if a is dominant or b is dominant:
        return dominant
    if a is None or b is None:
        return None
    return not dominant


def _and(a: Any, b: Any) -> Any:
    return _kleene(a, b, False)


def _or(a: Any, b: Any) -> Any:
    return _kleene(a, b, True)


COMPARE = {"=": lambda a, b: a == b, "<>": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _cmp(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    try:
        return COMPARE[op](a, b)
    except TypeError:
        raise SqlError(f"cannot compare {_type(a)} {a!r} with {_type(b)} {b!r} ({op})", "", 0) from None


def _type(v: Any) -> str:
    return {bool: "BOOLEAN", int: "BIGINT", float: "DOUBLE", str: "STRING", Timestamp: "TIMESTAMP"}.get(
        type(v), type(v).__name__)


def _java_div(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        if b == 0:
            raise SqlError("division by zero", "", 0)
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b if b != 0 else (math.copysign(math.inf, a) if a else math.nan)


def _java_mod(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise SqlError("division by zero", "", 0)
        r = abs(a) % abs(b)  # Java's %: the sign of the dividend (exact for any size)
        return r if a >= 0 else -r
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan  # Java: x % 0.0 is NaN
    return math.fmod(a, b)


_ARITH = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": _java_div,
          "%": _java_mod, "||": lambda a, b: f"{a}{b}"}


def _binary(expr: Expr) -> Callable[[Scope], Any]:
    op = expr.value
    left, right = compile_expr(expr.args[0]), compile_expr(expr.args[1])
    if op == "AND":
        return lambda s: (lambda a: False if a is False else _and(a, right(s)))(left(s))
    if op == "OR":
        return lambda s: (lambda a: True if a is True else _or(a, right(s)))(left(s))
    if op in COMPARE:
        return lambda s: _cmp(op, left(s), right(s))
    arith = _ARITH[op]

    def arithmetic(s: Scope) -> Any:
        a, b = left(s), right(s)
        if a is None or b is None:
            return None
        if op == "||":
            return arith(_text(a), _text(b))
        try:
            result = _long(arith(a, b))
        except TypeError:
            raise SqlError(f"cannot apply {op} to {_type(a)} {a!r} and {_type(b)} {b!r}", "",
                           expr.pos) from None
        if isinstance(a, Timestamp) and not isinstance(b, Timestamp) and op in "+-":
            return Timestamp(result)
        return result

    return arithmetic


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    return str(v)


def _case(expr: Expr) -> Callable[[Scope], Any]:
    branches, otherwise = expr.args
    subject = compile_expr(expr.value) if expr.value is not None else None
    compiled = [(compile_expr(c), compile_expr(v)) for c, v in branches]
    fallback = compile_expr(otherwise)

    def case(s: Scope) -> Any:
        x = subject(s) if subject is not None else None
        for cond, value in compiled:
            hit = _cmp("=", x, cond(s)) if subject is not None else cond(s)
            if hit is True:
                return value(s)
        return fallback(s)

    return case


def _cast(v: Any, target: str) -> Any:
    if v is None:
        return None
    if target == "str":
        return _text(v)
    if target == "bool":
        return v if isinstance(v, bool) else str(v).strip().lower() == "true"
    try:
        if target == "int":
            got = int(float(v)) if isinstance(v, str) else int(v)
            if not -LONG <= got < LONG:
                raise ValueError("beyond BIGINT")
            return got
        return float(v)
    except (TypeError, ValueError, OverflowError):
        raise SqlError(f"CAST({_text(v) if isinstance(v, str) else v!r} AS {_CAST_NAMES[target]}) is not "
                       "possible", "", 0) from None


_CAST_NAMES = {"int": "BIGINT", "float": "DOUBLE"}


def _power(a: Any, b: Any) -> float:
    """Java's ``Math.pow`` (Flink's POWER): NaN where there is no real result, ±Infinity on
    overflow — never an exception."""
    try:
        return math.pow(a, b)
    except OverflowError:
        odd = float(b).is_integer() and abs(b) < 2 ** 53 and int(b) % 2 == 1
        return -math.inf if a < 0 and odd else math.inf
    except ValueError:
        if a == 0 and b < 0:
            return math.inf
        return math.nan


def _sqrt(a: Any) -> float:
    """Java's ``Math.sqrt``: NaN below zero."""
    a = float(a)
    return math.sqrt(a) if a >= 0 else math.nan


def _call(expr: Expr) -> Callable[[Scope], Any]:
    name = expr.value
    if name in NAVIGATION:
        return _navigation(expr)
    if name in AGGREGATES:
        return _aggregate(expr)
    if name == "MATCH_ROWTIME":
        return lambda s: None if s.emitted is None else Timestamp(s.emitted)
    if name == "CLASSIFIER":
        return lambda s: s.classifier
    if name == "MATCH_NUMBER":
        return lambda s: s.number
    args = [compile_expr(a) for a in expr.args]
    if name == "COALESCE":
        return lambda s: next((v for v in (a(s) for a in args) if v is not None), None)
    if name == "IF":
        cond, then, other = args
        return lambda s: then(s) if cond(s) is True else other(s)
    if name == "NULLIF":
        a, b = args
        return lambda s: (lambda x, y: None if _cmp("=", x, y) is True else x)(a(s), b(s))
    if name == "CONCAT":
        return lambda s: (lambda vs: None if any(v is None for v in vs) else "".join(map(_text, vs)))(
            [a(s) for a in args])
    if name == "TIMESTAMPDIFF":  # whole units from earlier to later, truncated toward zero (Flink's INT)
        unit, earlier, later = expr.args[0].value, args[1], args[2]
        return lambda s: (lambda a, b: None if a is None or b is None else _java_div(int(b) - int(a), unit))(
            earlier(s), later(s))
    function = _SCALARS[name]

    def call(s: Scope) -> Any:
        values = [a(s) for a in args]
        if any(v is None for v in values):
            return None
        try:
            return function(*values)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise SqlError(f"{name}({', '.join(map(repr, values))}): {exc}", "", expr.pos) from None

    return call


_SCALARS: dict[str, Callable[..., Any]] = {
    "ABS": lambda a: _long(abs(a)), "MOD": _java_mod, "POWER": _power, "SQRT": _sqrt,
    "FLOOR": lambda a: math.floor(a) if isinstance(a, float) else a,
    "CEIL": lambda a: math.ceil(a) if isinstance(a, float) else a,
    "UPPER": lambda a: str(a).upper(), "LOWER": lambda a: str(a).lower(),
    "CHAR_LENGTH": lambda a: len(str(a)), "TRIM": lambda a: str(a).strip(" "),
}
_SCALARS["CEILING"] = _SCALARS["CEIL"]
_SCALARS["CHARACTER_LENGTH"] = _SCALARS["CHAR_LENGTH"]


def _navigation(expr: Expr) -> Callable[[Scope], Any]:
    name = expr.value
    inner = compile_expr(expr.args[0])
    offset = expr.args[1].value if len(expr.args) == 2 else (1 if name in ("PREV", "NEXT") else 0)
    variables = variables_of(expr.args[0])
    var = next(iter(variables)) if variables else STAR
    first = name == "FIRST"

    def navigate(s: Scope) -> Any:
        if name == "PREV" and var == s.define:  # PREV(X.col, 0): the current row
            rows = s.rows_of(var)
        else:
            rows = s.rows_of(var)
            if s.define is not None and name == "PREV":  # PREV(Y.col, n) is LAST(Y.col, n)
                pass
        if len(rows) <= offset:
            return None
        row = rows[offset] if first else rows[len(rows) - offset - 1]
        return inner(Scope(lambda n: [row], row, None, s.classifier, s.number, s.emitted))

    return navigate


def _aggregate(expr: Expr) -> Callable[[Scope], Any]:
    name = expr.value
    arg = expr.args[0]
    if arg.kind == "star":
        return lambda s: len(s.rows_of(STAR))
    inner = compile_expr(arg)
    variables = variables_of(arg)
    var = next(iter(variables)) if variables else STAR
    separator = expr.args[1].value if len(expr.args) == 2 else ","

    def aggregate(s: Scope) -> Any:
        values = []
        for row in s.rows_of(var):
            v = inner(Scope(lambda n, row=row: [row], row, None, s.classifier, s.number, s.emitted))
            if v is not None:
                values.append(v)
        if name == "COUNT":
            return len(values)
        if not values:
            return None
        if name == "LISTAGG":  # Flink's: the non-NULL values in row order, joined
            return separator.join(map(_text, values))
        if name == "SUM":
            return _long(sum(values))
        if name == "MIN":
            return min(values)
        if name == "MAX":
            return max(values)
        total = sum(values)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return _java_div(_long(total), len(values))  # AVG of integers is an integer (Flink; its sum
                                                         # wraps)
        return total / len(values)

    return aggregate


# -- the Python subset (job files' expressions): env is (record, match context or None) ------------
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


#: The Python subset's functions (``py_call``).
PY_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "len": _len, "lower": _lower, "upper": _upper, "strip": _strip, "min": min, "max": max,
    "round": round, "int": int, "float": float, "str": str, "bool": bool, "startswith": _startswith,
    "endswith": _endswith, "contains": _contains, "coalesce": _coalesce,
}
PY_STRING_METHODS = {"lower", "upper", "strip", "startswith", "endswith"}
PY_MATCH_FUNCTIONS = {"first", "last", "prev", "count", "sum_of", "avg_of", "min_of", "max_of"}


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


_PY_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": _ordering(lambda a, b: a < b), "<=": _ordering(lambda a, b: a <= b),
    ">": _ordering(lambda a, b: a > b), ">=": _ordering(lambda a, b: a >= b),
    "in": lambda a, b: _contains(b, a), "not in": lambda a, b: not _contains(b, a),
    "is": lambda a, b: a is b, "is not": lambda a, b: a is not b,
}


def _py_power(base: Any, exponent: Any) -> Any:
    if isinstance(exponent, (int, float)) and abs(exponent) > BOUNDS.exponent:
        raise ArithmeticError(f"exponent {exponent} is larger than {BOUNDS.exponent}")
    if (type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1
            and (abs(base).bit_length() - 1) * exponent > BOUNDS.int_bits):
        raise ArithmeticError(f"the result of ** would have more than {BOUNDS.int_bits} bits")
    return base**exponent


def _bounded(value: Any) -> Any:
    """``value`` if it is within :data:`BOUNDS` (an int of at most ``int_bits`` bits), else
    :class:`ArithmeticError`."""
    if type(value) is int and value.bit_length() > BOUNDS.int_bits:
        raise ArithmeticError(f"an integer result has more than {BOUNDS.int_bits} bits")
    return value


def _py_multiply(a: Any, b: Any) -> Any:
    for seq, times in ((a, b), (b, a)):
        if isinstance(seq, (str, tuple)) and isinstance(times, int) and len(seq) * times > BOUNDS.sequence:
            raise ArithmeticError(f"a repeated string or list would have more than {BOUNDS.sequence} items")
    return _bounded(a * b)


def _py_remainder(a: Any, b: Any) -> Any:
    """``a % b`` of numbers; a string (or bytes) on the left is refused: Python formats it, and a
    width in its format (``'%0300000000d'``, ``'%0*d'``) builds a string of any size."""
    if isinstance(a, (str, bytes)):
        raise TypeError("% is the remainder of numbers; formatting a string with % is not allowed "
                        "(use str() and +)")
    return a % b


def _py_add(a: Any, b: Any) -> Any:
    if isinstance(a, (str, tuple)) and isinstance(b, (str, tuple)) and len(a) + len(b) > BOUNDS.sequence:
        raise ArithmeticError(f"a joined string or list would have more than {BOUNDS.sequence} items")
    return _bounded(a + b)


#: The Python subset's arithmetic (``py_arith``), bounded.
PY_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": _py_add, "-": lambda a, b: a - b, "*": _py_multiply, "/": lambda a, b: a / b,
    "//": lambda a, b: a // b, "%": _py_remainder, "**": _py_power,
}


def _py_field(expr: Expr) -> Callable:
    name = expr.value

    def field(env) -> Any:
        record = env[0]
        if type(record) is dict or isinstance(record, Mapping):
            return record.get(name)
        return field_of(record, name)

    return field


def _py_attr(expr: Expr) -> Callable:
    inner, attr = compile_expr(expr.args[0]), expr.value
    return lambda env: field_of(inner(env), attr)


def _py_item(expr: Expr) -> Callable:
    inner, key = compile_expr(expr.args[0]), compile_expr(expr.args[1])
    return lambda env: field_of(inner(env), key(env))


def _py_tuple(expr: Expr) -> Callable:
    parts = [compile_expr(a) for a in expr.args]
    if expr.kind == "py_set":
        return lambda env: frozenset(p(env) for p in parts)
    return lambda env: tuple(p(env) for p in parts)


def _py_logic(expr: Expr) -> Callable:
    """Python's ``and``/``or``: the first operand that decides, itself (not a bool)."""
    parts = [compile_expr(a) for a in expr.args]
    if expr.value == "and":
        def both(env) -> Any:
            value: Any = True
            for part in parts:
                value = part(env)
                if not value:
                    return value
            return value

        return both

    def either(env) -> Any:
        value: Any = False
        for part in parts:
            value = part(env)
            if value:
                return value
        return value

    return either


def _py_unary(expr: Expr) -> Callable:
    operand = compile_expr(expr.args[0])
    if expr.kind == "py_not":
        return lambda env: not operand(env)
    if expr.kind == "py_neg":
        return lambda env: -operand(env)
    return lambda env: +operand(env)


def _py_arith(expr: Expr) -> Callable:
    op, left, right = PY_ARITHMETIC[expr.value], compile_expr(expr.args[0]), compile_expr(expr.args[1])
    return lambda env: op(left(env), right(env))


def _py_compare(expr: Expr) -> Callable:
    operands = [compile_expr(a) for a in expr.args]
    ops = [_PY_COMPARE[op] for op in expr.value]
    if len(ops) == 1:
        compare, left, right = ops[0], operands[0], operands[1]
        if expr.value[0] in ("==", "!=") and expr.args[1].kind == "literal":
            value = expr.args[1].value
            if expr.value[0] == "==":
                return lambda env: left(env) == value
            return lambda env: left(env) != value
        return lambda env: compare(left(env), right(env))

    def chain(env) -> bool:
        left = operands[0](env)
        for compare, operand in zip(ops, operands[1:]):
            right = operand(env)
            if not compare(left, right):
                return False
            left = right
        return True

    return chain


def _py_if(expr: Expr) -> Callable:
    test, body, orelse = (compile_expr(a) for a in expr.args)
    return lambda env: body(env) if test(env) else orelse(env)


def _py_call(expr: Expr) -> Callable:
    function, args = PY_FUNCTIONS[expr.value], [compile_expr(a) for a in expr.args]
    return lambda env: function(*(a(env) for a in args))


def _py_method(expr: Expr) -> Callable:
    target, *args = (compile_expr(a) for a in expr.args)
    name = expr.value

    def call_method(env) -> Any:
        value = target(env)
        if not isinstance(value, str):
            return False if name in ("startswith", "endswith") else value
        return getattr(value, name)(*(a(env) for a in args))

    return call_method


def _py_match(expr: Expr) -> Callable:
    """``first('a')`` … ``max_of('a', 'amount')``: the events a CEP run matched to a stage."""
    name, stage = expr.value, expr.args[0].value

    def events(env) -> list[Any]:
        ctx = env[1]
        return list(ctx.get_events_for_pattern(stage)) if ctx is not None else []

    if name == "first":
        return lambda env: (lambda es: es[0] if es else None)(events(env))
    if name in ("last", "prev"):
        return lambda env: (lambda es: es[-1] if es else None)(events(env))
    if name == "count":
        return lambda env: len(events(env))
    field_arg = compile_expr(expr.args[1])

    def values(env) -> list[Any]:
        key = field_arg(env)
        return [v for v in (field_of(e, key) for e in events(env)) if v is not None]

    if name == "sum_of":
        return lambda env: sum(values(env))
    if name == "avg_of":
        return lambda env: (lambda vs: math.fsum(vs) / len(vs) if vs else None)(values(env))
    if name == "min_of":
        return lambda env: (lambda vs: min(vs) if vs else None)(values(env))
    return lambda env: (lambda vs: max(vs) if vs else None)(values(env))


# -- the column form of either language -----------------------------------------------------------
_SQL_COMPARE_OPS = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_PY_ORDERINGS = ("==", "!=", "<", "<=", ">", ">=")


def column_form(expr: Expr) -> Node | None:
    """``expr`` in the column form (:mod:`ctiflow.operators.cep.expr.column_form`), or None where it
    is more than logic over comparisons of fields with constants (arithmetic, functions, match
    context: per record).

    Python (the ``python`` rule): ``and``/``or``/``not`` of comparisons (chains too) and bare
    boolean fields — ``and``/``or`` return operands, but only their truthiness matters to a
    predicate, which is what the column form computes. SQL (the ``sql`` rule): ``column <op>
    literal`` joined by ``AND``/``OR``, no ``NOT`` (under three-valued logic NOT of unknown is
    not TRUE)."""
    try:
        return _column_form(expr)
    except NotVectorizable:
        return None


def _column_form(expr: Expr) -> Node:
    kind = expr.kind
    if kind == "py_logic":
        return (AllOf if expr.value == "and" else AnyOf)(tuple(_column_form(a) for a in expr.args))
    if kind == "py_not":
        return Not(_column_form(expr.args[0]))
    if kind == "py_compare":
        if any(op not in _PY_ORDERINGS for op in expr.value):
            raise NotVectorizable("comparison")
        operands = [_py_operand(a) for a in expr.args]
        pairs = tuple(Compare(op, left, right) for op, left, right in zip(expr.value, operands, operands[1:]))
        return pairs[0] if len(pairs) == 1 else AllOf(pairs)
    if kind == "py_field":
        return Truth(expr.value)
    if kind == "binary" and expr.value in ("AND", "OR"):
        return (AllOf if expr.value == "AND" else AnyOf)((_column_form(expr.args[0]),
                                                          _column_form(expr.args[1])))
    if kind == "binary" and expr.value in _SQL_COMPARE_OPS:
        a, b = expr.args
        op = _SQL_COMPARE_OPS[expr.value]
        if a.kind == "literal" and b.kind == "column":
            a, b, op = b, a, FLIPPED[op]
        if a.kind != "column" or b.kind != "literal" or b.value is None or isinstance(b.value, bool):
            raise NotVectorizable("comparison")
        return Compare(op, Field(a.value[1]), Const(b.value), rule="sql")
    raise NotVectorizable(kind)


def _py_operand(expr: Expr) -> Operand:
    if expr.kind == "literal" and isinstance(expr.value, (int, float, str, bool, type(None))):
        return Const(expr.value)
    if expr.kind == "py_field":
        return Field(expr.value)
    raise NotVectorizable(expr.kind)


#: How each kind of node compiles (:func:`compile_expr`); the ``py_`` kinds take ``env`` =
#: (record, match context), the SQL kinds a :class:`Scope`; ``literal`` either.
_BUILDERS: dict[str, Callable[[Expr], Callable[[Any], Any]]] = {
    "column": _column, "binary": _binary, "between": _between, "in": _in, "like": _like, "case": _case,
    "call": _call, "py_field": _py_field, "py_attr": _py_attr, "py_item": _py_item, "py_tuple": _py_tuple,
    "py_set": _py_tuple, "py_logic": _py_logic, "py_not": _py_unary, "py_neg": _py_unary, "py_pos": _py_unary,
    "py_arith": _py_arith, "py_compare": _py_compare, "py_if": _py_if, "py_call": _py_call,
    "py_method": _py_method, "py_match": _py_match,
}
