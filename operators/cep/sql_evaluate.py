"""``MATCH_RECOGNIZE`` expressions evaluated on rows: ``DEFINE`` conditions and ``MEASURES``.

SQL's semantics as Flink has them: three-valued logic (NULL compares as unknown; a condition holds
only when TRUE), Java's integer division and remainder, ``CAST`` failures and division by zero as
errors of the row (:class:`RowRefused`, dead-lettered by a job) or of the match
(:class:`MatchRefused`), never of the job. A ``DEFINE`` of column-against-literal comparisons also
gets its column form (:mod:`ctiflow.operators.cep.column_form`, the sql rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ctiflow.operators.cep.column_form import FLIPPED, AllOf, AnyOf, Compare, Const, Field, Node
from ctiflow.operators.cep.conditions import SimpleCondition
from ctiflow.operators.cep.sql import (AGGREGATES, CAST_TYPES, MATCH_FUNCTIONS, NAVIGATION, STAR, Expr, Row, SqlError,
                                       Timestamp, children_of, variables_of)
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


def current_row_only(expr: Expr, var: str) -> bool:
    """``expr`` reads the row being tested and nothing else of the match (a simple condition:
    the NFA need not build a context for it)."""
    if expr.kind == "call" and expr.value in (*NAVIGATION, *AGGREGATES, *MATCH_FUNCTIONS):
        return False
    if expr.kind == "column" and expr.value[0] not in (None, var):
        return False
    return all(current_row_only(sub, var) for sub in children_of(expr))


_SQL_COMPARE_OPS = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def column_form_of(expr: Expr) -> Node | None:
    """A DEFINE made of ``column <op> literal`` comparisons joined by AND / OR in the column form
    (:mod:`ctiflow.operators.cep.column_form`, the sql rule: what a start filter needs to skip
    rows in bulk), or None. No NOT: under SQL's three-valued logic NOT of unknown is not TRUE."""
    if expr.kind == "binary" and expr.value in ("AND", "OR"):
        left, right = column_form_of(expr.args[0]), column_form_of(expr.args[1])
        if left is None or right is None:
            return None
        return (AllOf if expr.value == "AND" else AnyOf)((left, right))
    if expr.kind != "binary" or expr.value not in _SQL_COMPARE_OPS:
        return None
    a, b = expr.args
    if a.kind == "literal" and b.kind == "column":
        a, b = b, a
        op = FLIPPED[_SQL_COMPARE_OPS[expr.value]]
    else:
        op = _SQL_COMPARE_OPS[expr.value]
    if a.kind != "column" or b.kind != "literal" or b.value is None or isinstance(b.value, bool):
        return None
    return Compare(op, Field(a.value[1]), Const(b.value), rule="sql")


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


def _guarded(evaluate: Callable[[Scope], Any], clause: str) -> Callable[[Scope], Any]:
    """``evaluate``, with a failure on the data raised as :class:`RowRefused` naming ``clause``."""

    def guarded(scope: Scope) -> Any:
        try:
            return evaluate(scope)
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise RowRefused(f"{clause}: {reason}") from None

    return guarded


def define_condition(expr: Expr, var: str, order: list[str]):
    """DEFINE ``var`` as a condition: simple when it reads only the current row, else iterative."""
    evaluate = _guarded(compile_expr(expr), f"DEFINE {var}")
    if current_row_only(expr, var):
        return SimpleCondition(lambda row: evaluate(Scope(None, row, var)) is True,
                               column_form=column_form_of(expr))

    def test(row: Row, ctx) -> bool:
        def rows_of(name: str) -> Sequence[Row]:
            if name == STAR:  # the rows of the match so far in time order, then this one
                return _Then(ctx.events_view(None), row)
            rows = ctx.events_view(name)
            return _Then(rows, row) if name == var else rows

        return evaluate(Scope(rows_of, row, var)) is True

    return test


class _Then(Sequence):
    """``rows`` followed by ``last``, without copying ``rows`` (a DEFINE reads the run's rows
    and the row being tested: O(1) per navigation however long the run)."""

    __slots__ = ("_rows", "_last", "_n")

    def __init__(self, rows: Sequence[Row], last: Row) -> None:
        self._rows, self._last, self._n = rows, last, len(rows)

    def __len__(self) -> int:
        return self._n + 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n + 1))]
        if index < 0:
            index += self._n + 1
        if index == self._n:
            return self._last
        if not 0 <= index < self._n:
            raise IndexError(index)
        return self._rows[index]

    def __iter__(self):
        yield from self._rows
        yield self._last


def measure(name: str, expr: Expr, order: list[str]):
    """MEASURES ``name``: ``value(match, at, number, emitted)``; a failure on the match's data
    raises :class:`MatchRefused`."""
    evaluate = compile_expr(expr)

    def value(match: dict[str, list[Row]], at: tuple[Row, str] | None, number: int, emitted: int) -> Any:
        def rows_of(name: str) -> list[Row]:
            if name == STAR:
                return [r for n in order for r in match.get(n, ())]  # pattern order: time order (Flink)
            return match.get(name, [])

        every = rows_of(STAR)
        completed = every[-1] if every else None
        classifier = at[1] if at is not None else next((n for n in order for r in match.get(n, ()) if r is completed),
                                                       None)
        try:
            got = _sql_value(evaluate(Scope(rows_of, None, None, classifier, number, emitted)))
            if type(got) is int and not -_LONG <= got < _LONG:  # (a literal beyond BIGINT)
                raise SqlError(f"{got} is beyond BIGINT", "", expr.pos)
            return got
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise MatchRefused(f"MEASURES {name}: {reason} (the match of {len(every)} rows is not emitted)") from None

    return value


def _sql_value(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def compile_expr(expr: Expr) -> Callable[[Scope], Any]:
    """A closure evaluating ``expr`` in a scope (three-valued logic: ``None`` is NULL)."""
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


_LONG = 2**63


def _long(v: Any) -> Any:
    """An integer result as Java's ``long`` arithmetic (Flink's BIGINT) has it: wrapped to 64 bits
    (so a product of large values is what Flink gives, and always fits the output's Avro ``long``)."""
    if type(v) is int and not -_LONG <= v < _LONG:
        return (v + _LONG) % (2 * _LONG) - _LONG
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
            raise SqlError(f"cannot apply {op} to {_type(a)} {a!r} and {_type(b)} {b!r}", "", expr.pos) from None
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
            if not -_LONG <= got < _LONG:
                raise ValueError("beyond BIGINT")
            return got
        return float(v)
    except (TypeError, ValueError, OverflowError):
        raise SqlError(f"CAST({_text(v) if isinstance(v, str) else v!r} AS {_CAST_NAMES[target]}) is not possible",
                       "", 0) from None


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
    "UPPER": lambda a: str(a).upper(), "LOWER": lambda a: str(a).lower(), "CHAR_LENGTH": lambda a: len(str(a)),
    "TRIM": lambda a: str(a).strip(" "),
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
            return _java_div(_long(total), len(values))  # AVG of integers is an integer (Flink; its sum wraps)
        return total / len(values)

    return aggregate


#: How each remaining kind of expression compiles (:func:`compile_expr`).
_BUILDERS: dict[str, Callable[[Expr], Callable[[Scope], Any]]] = {
    "column": _column, "binary": _binary, "between": _between, "in": _in, "like": _like, "case": _case,
    "call": _call,
}
