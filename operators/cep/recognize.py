"""``MATCH_RECOGNIZE`` on the CEP engine: a parsed :class:`~ctiflow.operators.cep.sql.Query` becomes a
:class:`~ctiflow.operators.cep.pattern.Pattern` (the same NFA the Pattern API and YAML stages use) whose
conditions evaluate ``DEFINE``, and ``MEASURES`` are computed from each match.

Semantics are Flink's (flink-table-planner ``CommonExecMatch`` / ``MatchCodeGenerator``):

* variables are concatenated with strict contiguity (``next``); ``A*`` → one_or_more, optional,
  consecutive, greedy; ``A+`` → one_or_more, consecutive, greedy; ``A?`` → optional;
  ``A{n}`` → times(n); ``A{n,m}`` / ``A{n,}`` → times / times_or_more, consecutive, greedy;
  a trailing ``?`` makes a quantifier reluctant (not greedy); ``WITHIN`` bounds the match;
* in ``DEFINE X``, ``X.col`` and a bare ``col`` are the current row, ``Y.col`` is ``Y``'s last
  row so far; ``FIRST``/``LAST(X.col, n)`` and aggregates over ``X`` see ``X``'s rows plus the
  current row, over a bare column all rows of the match so far plus the current row;
  ``PREV(Y.col, n)`` is ``LAST(Y.col, n)`` (own variable: only offset 0);
* ``MEASURES`` are final (evaluated on the whole match): ``X.col`` is ``X``'s last row, a bare
  column the match's last row; a variable with no rows gives NULL (``COUNT`` 0);
  ``MATCH_ROWTIME()`` is the time at which the NFA released the match (the row it was
  processing: a match held back behind an earlier partial match comes out with a later row);
* rows are matched in ``ORDER BY`` order (time first, ascending; ties by the other columns, then
  in arrival order), per ``PARTITION BY`` value; at the end of input every ``WITHIN`` closes and
  unfinished partial matches are dropped.

Beyond Flink (SQL:2016): ``ALL ROWS PER MATCH`` (one row per matched row: partition columns,
order columns, measures — ``RUNNING`` by default — then the other columns), ``CLASSIFIER()``
and ``MATCH_NUMBER()``. Values follow SQL's three-valued logic: NULL compares as unknown, and a
condition holds only when it is TRUE.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctiflow.operators.cep.column_form import FLIPPED, AllOf, AnyOf, Compare, Const, Field, Node
from ctiflow.operators.cep.compiler import can_produce_empty_matches, compile_pattern
from ctiflow.operators.cep.conditions import IterativeCondition, SimpleCondition
from ctiflow.operators.cep.nfa import Nfa, NfaState
from ctiflow.operators.cep.pattern import Pattern, QuantifierProperty
from ctiflow.operators.cep.skip_strategy import AfterMatchSkipStrategy
from ctiflow.operators.cep.sql import CAST_TYPES, Expr, Query, SqlError, parse
from ctiflow.operators.errors import EventRejected, PatternError

STAR = "*"  # the universal pattern variable: every row of the match
NAVIGATION = ("FIRST", "LAST", "PREV", "NEXT")
AGGREGATES = ("SUM", "AVG", "MIN", "MAX", "COUNT", "LISTAGG")
END_OF_TIME = 2 ** 63 - 1  # Flink's final watermark (Long.MAX_VALUE)


class Timestamp(int):
    """Epoch milliseconds that print as an SQL ``TIMESTAMP(3)`` (UTC): the ORDER BY column and
    ``MATCH_ROWTIME()``."""

    def __str__(self) -> str:
        moment = _dt.datetime(1970, 1, 1) + _dt.timedelta(milliseconds=int(self))
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"

    __repr__ = __str__


def to_millis(value: Any) -> int:
    """An ORDER BY time value: epoch ms, or an ISO-8601 timestamp (UTC unless it says otherwise)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{value!r} is not a time")
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip().replace(" ", "T", 1)
    moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    return int(round(moment.timestamp() * 1000))


# -- rows ---------------------------------------------------------------------------------------
class Row(dict):
    """An input row: its columns, plus its time and its place in the input (ties keep it)."""

    __slots__ = ("time", "seq", "number")


# -- the compiled query -------------------------------------------------------------------------
@dataclass
class Recognizer:
    """A query compiled once: its pattern, its condition and measure evaluators."""

    query: Query
    pattern: Pattern
    variables: list[str]
    time_column: str
    measures: list[tuple[str, Callable[[dict, tuple | None, int, int], Any]]]
    #: The time column is a TIMESTAMP(3) (declared so, ISO text, or of unknown type); else a
    #: BIGINT of epoch milliseconds, which keeps its type (arithmetic, measures as numbers)
    timestamp: bool = True

    def run(self, rows: Iterable[Mapping[str, Any]], refused: list | None = None) -> list[dict[str, Any]]:
        """Every output row for ``rows`` (a bounded input), in emission order; see :meth:`rows`."""
        return list(self.rows(rows, refused))

    def rows(self, rows: Iterable[Mapping[str, Any]], refused: list | None = None):
        """The output rows, in emission order. A row a DEFINE fails on (:class:`RowRefused`) or
        a match a measure fails on (:class:`MatchRefused`) is left out as if it had not come,
        and ``(row number from 1, reason)`` appended to ``refused`` (the match's: its last
        row's); without the list, the refusal is raised."""
        q = self.query
        prepared = []
        for seq, raw in enumerate(rows):
            if not isinstance(raw, Mapping):
                raise SqlError(f"row {seq + 1}: a row must be an object of columns, got {type(raw).__name__}",
                               q.text, 0)
            row = Row(raw)
            try:
                row.time = to_millis(raw.get(self.time_column))
            except (TypeError, ValueError, OverflowError) as exc:
                raise SqlError(f"row {seq + 1}: ORDER BY column {self.time_column!r} must be epoch milliseconds "
                               f"or an ISO timestamp, got {raw.get(self.time_column)!r} ({exc})",
                               q.text, q.order_by[0][2]) from None
            if self.timestamp:
                row[self.time_column] = Timestamp(row.time)
            row.seq = row.number = seq + 1
            prepared.append(row)
        ties = self.tie_key()
        prepared.sort(key=lambda row: (row.time, *(ties(row) if ties else ()), row.seq))
        for position, row in enumerate(prepared):  # from here on, seq is the place in matching order
            row.seq = position
        plan = compile_pattern(self.pattern)
        nfa = Nfa(plan)
        states: dict[tuple, NfaState] = {}
        numbers: dict[tuple, int] = {}
        last_time: dict[tuple, int] = {}
        for row in prepared:
            key = tuple(row.get(c) for c in q.partition_by)
            if any(isinstance(v, (dict, list)) for v in key):
                column = next(c for c in q.partition_by if isinstance(row.get(c), (dict, list)))
                raise SqlError(f"row {row.number}: PARTITION BY column {column!r} holds a "
                               f"{'record' if isinstance(row.get(column), dict) else 'list'}; partition by "
                               "columns of plain values", q.text, q.text.upper().find("PARTITION"))
            state = states.get(key)
            if state is None:
                state = states[key] = NfaState.initial(plan)
            nfa.state = state
            if last_time.get(key) != row.time:  # Flink: advanceTime once per timestamp, then its rows
                last_time[key] = row.time
                matches, _ = nfa.advance_time_with_ids(row.time)
                yield from self._emit(key, matches, numbers, row.time, refused)
            try:
                matches = nfa.process_with_ids(row, row.time)
            except RowRefused as exc:
                if refused is None:
                    raise
                refused.append((row.number, str(exc)))
                continue
            yield from self._emit(key, matches, numbers, row.time, refused)
        for key, state in states.items():  # the end of input: every WITHIN closes
            nfa.state = state
            matches, _ = nfa.advance_time_with_ids(END_OF_TIME)
            yield from self._emit(key, matches, numbers, END_OF_TIME, refused)

    def one_row(self, base: dict[str, Any], match: dict[str, list], number: int, emitted: int) -> dict[str, Any]:
        """ONE ROW PER MATCH: ``base`` (the partition columns) and the measures, final."""
        out = dict(base)
        for name, measure in self.measures:
            out[name] = measure(match, None, number, emitted)
        return out

    def partition_values(self, match: dict[str, list]) -> dict[str, Any]:
        """The partition columns of a match, from its first row (as Flink takes them)."""
        first = next((rows[0] for rows in match.values() if rows), {})
        return {c: first.get(c) for c in self.query.partition_by}

    def _emit(self, key: tuple, matches, numbers: dict, emitted: int, refused: list | None) -> Iterable[dict]:
        """Output rows for ``matches``, which the NFA released at time ``emitted`` (the row it was
        processing, or the end of input): ``MATCH_ROWTIME()`` is that time, as in Flink, where a
        match held back behind an earlier partial match comes out with a later row."""
        for match, _ids in matches:
            numbers[key] = number = numbers.get(key, 0) + 1
            match = {name: match.get(name, []) for name in self.variables}
            try:
                out = list(self.outputs(dict(zip(self.query.partition_by, key)), match, number, emitted))
            except MatchRefused as exc:
                if refused is None:
                    raise
                refused.append((max(r.number for rows in match.values() for r in rows), str(exc)))
                continue
            yield from out

    def outputs(self, base: dict[str, Any], match: dict[str, list], number: int,
                emitted: int) -> Iterable[dict[str, Any]]:
        """The output rows of one match (``match``: variable → its rows, each a :class:`Row`
        whose ``seq`` orders the rows of the partition): ONE ROW PER MATCH → the partition
        columns ``base`` and the final measures; ALL ROWS PER MATCH → per matched row in order:
        ``base``, the ORDER BY columns, the measures (RUNNING ones over the rows up to it) and
        the row's other columns."""
        q = self.query
        if not q.all_rows:
            yield self.one_row(base, match, number, emitted)
            return
        ordered = sorted(((row, var) for var, rows in match.items() for row in rows), key=lambda rv: rv[0].seq)
        for row, var in ordered:
            running = {name: [r for r in rows if r.seq <= row.seq] for name, rows in match.items()}
            out = dict(base)
            for column, _, _ in q.order_by:
                out.setdefault(column, row.get(column))
            for name, measure in self.measures:
                out[name] = measure(running, (row, var), number, emitted) if _running(q, name) else \
                    measure(match, (row, var), number, emitted)
            for column, value in row.items():
                out.setdefault(column, value)
            yield out

    @property
    def numbered(self) -> bool:
        """A measure reads ``MATCH_NUMBER()`` (a job then keeps each partition's count of matches)."""
        return any(_calls(m.expr, "MATCH_NUMBER") for m in self.query.measures)

    def tie_key(self):
        """``(start, fields) → sort key`` ordering rows of one time by the further ORDER BY
        columns (NULLs last, then arrival); None when the query orders by time alone."""
        ties = self.query.order_by[1:]
        if not ties:
            return None

        def key(fields: Mapping[str, Any]) -> tuple:
            return tuple((fields.get(c) is None, _Asc(fields.get(c)) if asc else _Desc(fields.get(c)))
                         for c, asc, _ in ties)

        return key


def _calls(expr: Expr, name: str) -> bool:
    return (expr.kind == "call" and expr.value == name) or any(_calls(sub, name) for sub in _children(expr))


def _running(q: Query, name: str) -> bool:
    return next(m.running for m in q.measures if m.name == name)


class _Asc:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    def __lt__(self, other):
        return self.v is not None and other.v is not None and self.v < other.v

    def __eq__(self, other):
        return self.v == other.v


class _Desc(_Asc):
    def __lt__(self, other):
        return self.v is not None and other.v is not None and self.v > other.v


# -- compiling ----------------------------------------------------------------------------------
def compile_query(query: Query | str, columns: Iterable[str] | Mapping[str, str] | None = None) -> Recognizer:
    """Validate ``query`` as Flink does and build its :class:`Recognizer`. ``columns``: the
    input's columns when known (a reference to another one is an error naming it); as a
    mapping column → type family (``number``, ``string``, ``boolean``), also the types: an
    operation on incompatible types is an error naming the variable and the column."""
    q = parse(query) if isinstance(query, str) else query
    known = None if columns is None else set(columns)
    families = dict(columns) if isinstance(columns, Mapping) else {}
    fail = _Failer(q.text)
    names = [v.name for v in q.pattern]
    for var in q.pattern:
        if names.count(var.name) > 1:
            raise fail("Pattern variables must be unique (as in Flink): rename the second "
                       f"{var.name}", _positions(q, var.name)[1])
    for name in q.define:
        if name not in names:
            raise fail(f"DEFINE {name}: {name} is not a variable of the PATTERN ({', '.join(names)})",
                       q.define_pos[name])
    time_column, ascending, time_pos = q.order_by[0]
    if not ascending:
        raise fail("the first ORDER BY column is the time and must be ascending", time_pos)
    for column, _, pos in q.order_by + [(c, True, q.text.find(c)) for c in q.partition_by]:
        if known is not None and column not in known:
            raise fail(f"column {column!r} is not in the input ({', '.join(sorted(known))})", max(pos, 0))
    partition = set(q.partition_by)
    for m in q.measures:
        if m.name in partition:
            raise fail(f"measure {m.name} has the name of a PARTITION BY column (Flink: columns ambiguously "
                       "defined); rename the measure", m.expr.pos)
    checker = _Checker(q, fail, names, known)
    time_family = families.get(time_column)
    timestamp = time_family in (None, "timestamp", "string")  # ISO text is a TIMESTAMP; a BIGINT stays one
    types = None
    if families:
        families[time_column] = "timestamp" if timestamp else time_family
        types = _Types(families, fail)
    found: list[SqlError] = []  # every DEFINE and measure checked: all their errors at once
    for clause, expr, define in ([(f"DEFINE {n}", e, n) for n, e in q.define.items()]
                                 + [(f"MEASURES {m.name}", m.expr, None) for m in q.measures]):
        try:
            checker.check(expr, define=define)
            if types is not None:
                types.of(expr, clause)
                if define is not None:
                    types.condition(expr, clause)
            _fold(expr, clause, fail)
        except SqlError as exc:
            found.append(exc)
    if found:
        found[0].others = found[1:]
        raise found[0]
    pattern = _translate(q, fail, names)
    measures = [(m.name, _measure(m.name, m.expr, names)) for m in q.measures]
    return Recognizer(q, pattern, names, time_column, measures, timestamp)


def _positions(q: Query, name: str) -> list[int]:
    return [v.pos for v in q.pattern if v.name == name]


class _Failer:
    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, message: str, pos: int) -> SqlError:
        return SqlError(message, self.text, pos)


def _skip(q: Query, fail, names: list[str]) -> AfterMatchSkipStrategy:
    kind, var = q.skip
    if kind == "to_next_row":
        return AfterMatchSkipStrategy.skip_to_next()
    if kind == "past_last_row":
        return AfterMatchSkipStrategy.skip_past_last_event()
    if var not in names:
        raise fail(f"AFTER MATCH SKIP TO {var}: {var} is not a variable of the PATTERN", q.text.upper().find("SKIP"))
    strategy = AfterMatchSkipStrategy.skip_to_first(var) if kind == "to_first" else \
        AfterMatchSkipStrategy.skip_to_last(var)
    return strategy.throw_exception_on_miss()


def _translate(q: Query, fail, names: list[str]) -> Pattern:
    """The Pattern Flink's ``PatternVisitor`` builds (see the module docstring); an error the
    Pattern API raises (as Flink's would) points at the variable it concerns."""
    current = q.pattern[0].pos
    try:
        return _build(q, fail, names)
    except SqlError:
        raise
    except PatternError as exc:
        for var in q.pattern:  # which variable: the first whose prefix of the pattern fails
            try:
                _build(Query(**{**vars(q), "pattern": q.pattern[:q.pattern.index(var) + 1]}), fail, names,
                       partial=True)
            except PatternError:
                current = var.pos
                break
        raise fail(str(exc), current) from None


def _build(q: Query, fail, names: list[str], partial: bool = False) -> Pattern:
    pattern: Pattern | None = None
    for var in q.pattern:
        if var.min is None:  # {,m}: Calcite's minimum -1, which CEP's times() refuses
            raise fail("{,m} is not supported (Flink: the from should be a positive number greater than 0); "
                       "write {0,m}", var.pos)
        pattern = Pattern.begin(var.name, _skip(q, fail, names)) if pattern is None else pattern.next(var.name)
        expr = q.define.get(var.name)
        if expr is None:  # a variable without DEFINE matches every row
            pattern.where(lambda row: True)
        else:
            condition = _condition(expr, var.name, names)
            pattern.where(condition if isinstance(condition, SimpleCondition) else IterativeCondition(condition))
        lo, hi, greedy = var.min, var.max, var.greedy
        optional = lo == 0 and hi == 1
        if lo == 0 and hi is None:
            pattern.one_or_more().optional().consecutive()
        elif lo == 1 and hi is None:
            pattern.one_or_more().consecutive()
        elif optional:
            pattern.optional()
        elif hi is not None:
            pattern.times(lo, hi)  # {0,m}: CEP's times(0, m) makes the stage optional
            if (lo, hi) != (1, 1):
                pattern.consecutive()
        else:
            pattern.times_or_more(lo).consecutive()
        if not greedy and optional:
            raise fail("a reluctant optional variable (A?? or A{0,1}?) is not supported (as in Flink): write A?",
                       var.pos)
        if greedy and not (optional or lo == hi):
            pattern.greedy()
    assert pattern is not None
    if partial:
        return pattern
    if q.within_ms is not None:
        pattern.within(q.within_ms)
    if can_produce_empty_matches(pattern):
        raise fail("the pattern can match no row at all (every variable is optional); make one variable "
                   "mandatory (as Flink requires)", q.pattern[0].pos)
    if pattern.quantifier.has(QuantifierProperty.GREEDY):
        raise fail(f"a greedy quantifier on the last variable ({q.pattern[-1].name}) is not supported (as in "
                   "Flink): end the pattern with a single variable or a reluctant quantifier (+?, *?)",
                   q.pattern[-1].pos)
    compile_pattern(pattern)  # every error the CEP compiler raises, now
    return pattern


# -- checking -----------------------------------------------------------------------------------
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "ABS": (1, 1), "MOD": (2, 2), "POWER": (2, 2), "SQRT": (1, 1), "FLOOR": (1, 1), "CEIL": (1, 1),
    "CEILING": (1, 1), "UPPER": (1, 1), "LOWER": (1, 1), "CHAR_LENGTH": (1, 1), "CHARACTER_LENGTH": (1, 1),
    "TRIM": (1, 1), "CONCAT": (1, None), "COALESCE": (1, None), "NULLIF": (2, 2), "IF": (3, 3),
    "TIMESTAMPDIFF": (3, 3),
}
MATCH_FUNCTIONS = ("MATCH_ROWTIME", "CLASSIFIER", "MATCH_NUMBER")


class _Checker:
    """What Flink's validator refuses, with the spot: unknown variables and columns, navigation
    and aggregates mixing variables, nested navigation, PREV on the variable being defined."""

    def __init__(self, q: Query, fail, names: list[str], known: set[str] | None) -> None:
        self.q, self.fail, self.names, self.known = q, fail, set(names), known

    def check(self, expr: Expr, define: str | None, inside: str | None = None) -> None:
        kind = expr.kind
        if kind == "column":
            var, column = expr.value
            if var is not None and var not in self.names:
                raise self.fail(f"{var}.{column}: {var} is not a variable of the PATTERN", expr.pos)
            if self.known is not None and column not in self.known:
                where = f"DEFINE {define}" if define else "MEASURES"
                raise self.fail(f"{where}: column {column!r} is not in the input ({', '.join(sorted(self.known))})",
                                expr.pos)
            return
        if kind == "call":
            name = expr.value
            if name in NAVIGATION:
                if inside is not None:
                    raise self.fail(f"{name} inside {inside}: navigation cannot be nested or aggregated", expr.pos)
                if not 1 <= len(expr.args) <= 2:
                    raise self.fail(f"{name} takes a column and an optional offset", expr.pos)
                if len(expr.args) == 2 and not (expr.args[1].kind == "literal" and isinstance(expr.args[1].value, int)
                                                and expr.args[1].value >= 0):
                    raise self.fail(f"the offset of {name} must be a non-negative integer literal", expr.args[1].pos)
                variables = _variables(expr.args[0])
                if len(variables) > 1:
                    raise self.fail(f"{name} over several pattern variables ({', '.join(sorted(variables))})",
                                    expr.pos)
                if name in ("PREV", "NEXT"):
                    if define is None:
                        raise self.fail(f"{name} cannot be used in MEASURES (use FIRST or LAST)", expr.pos)
                    offset = expr.args[1].value if len(expr.args) == 2 else 1
                    if name == "NEXT" or (offset != 0 and (variables or {define}) == {define}
                                          and variables != set()):
                        raise self.fail(f"{name} on the variable being defined needs physical offsets, which "
                                        "Flink does not support within a partition: use LAST(" 
                                        f"{define}.col, n) for the n-th previous row of {define}", expr.pos)
                self.check(expr.args[0], define, inside=name)
                return
            if name in AGGREGATES:
                if inside is not None:
                    raise self.fail(f"{name} inside {inside}: aggregates cannot be nested or navigated", expr.pos)
                if name == "LISTAGG":
                    if len(expr.args) not in (1, 2):
                        raise self.fail("LISTAGG takes a column and an optional separator", expr.pos)
                    if len(expr.args) == 2 and not (expr.args[1].kind == "literal" and isinstance(expr.args[1].value, str)):
                        raise self.fail("the separator of LISTAGG must be a string literal", expr.args[1].pos)
                elif len(expr.args) != 1:
                    raise self.fail(f"{name} takes one argument", expr.pos)
                if expr.args[0].kind == "star":
                    if name != "COUNT":
                        raise self.fail(f"{name}(*) is not valid; only COUNT(*)", expr.pos)
                    return
                variables = _variables(expr.args[0])
                if len(variables) > 1:
                    raise self.fail(f"{name} over several pattern variables ({', '.join(sorted(variables))}): an "
                                    "aggregate must be applied to a single pattern variable", expr.pos)
                if not variables and not _columns(expr.args[0]):
                    raise self.fail(f"{name}: no pattern variable or column specified in the aggregate", expr.pos)
                self.check(expr.args[0], define, inside=name)
                return
            if name in MATCH_FUNCTIONS:
                if define is not None:
                    raise self.fail(f"{name}() can only be used in MEASURES", expr.pos)
                if name != "MATCH_ROWTIME" and expr.args:
                    raise self.fail(f"{name}() takes no arguments", expr.pos)
                return
            if name in ("RUNNING", "FINAL"):
                raise self.fail(f"{name} is a keyword before a measure", expr.pos)
            arity = FUNCTIONS.get(name)
            if arity is None:
                raise self.fail(f"function {name} is not supported; supported: "
                                f"{', '.join(sorted([*FUNCTIONS, *NAVIGATION[:3], *AGGREGATES, *MATCH_FUNCTIONS]))}",
                                expr.pos)
            lo, hi = arity
            if len(expr.args) < lo or (hi is not None and len(expr.args) > hi):
                raise self.fail(f"{name} takes {lo}{'' if hi == lo else ' or more' if hi is None else f' to {hi}'} "
                                "argument(s)", expr.pos)
        if kind == "case":
            branches, otherwise = expr.args
            parts = [p for branch in branches for p in branch] + [otherwise]
            if expr.value is not None:
                parts.append(expr.value)
            for part in parts:
                self.check(part, define, inside)
            return
        for arg in expr.args:
            if isinstance(arg, Expr):
                self.check(arg, define, inside)


class _Types:
    """Type families of expressions (``number``, ``string``, ``boolean``, ``timestamp``; None:
    unknown, e.g. NULL or a column of mixed values): what Flink's validator refuses as a type
    error — comparing or computing with values of different families — refused with the spot,
    the clause and the column."""

    def __init__(self, families: Mapping[str, str], fail) -> None:
        self.families, self.fail = families, fail

    def _describe(self, expr: Expr, family: str | None) -> str:
        if expr.kind == "column":
            var, column = expr.value
            return f"{var + '.' if var else ''}{column} ({(family or 'unknown').upper()})"
        if expr.kind == "literal":
            return f"{expr.value!r} ({(family or 'NULL').upper()})"
        return f"an expression of type {(family or 'unknown').upper()}"

    def _same(self, op: str, a: Expr, b: Expr, where: str, pos: int) -> None:
        fa, fb = self.of(a, where), self.of(b, where)
        if fa and fb and fa != fb:
            raise self.fail(f"{where}: {self._describe(a, fa)} {op} {self._describe(b, fb)}: the types do not "
                            "match (CAST one side, or compare like with like)", pos)

    def condition(self, expr: Expr, where: str) -> None:
        family = self.of(expr, where)
        if family not in (None, "boolean"):
            raise self.fail(f"{where}: the condition is {self._describe(expr, family)}, not a BOOLEAN", expr.pos)

    def of(self, expr: Expr, where: str) -> str | None:
        kind = expr.kind
        if kind == "literal":
            v = expr.value
            return None if v is None else "boolean" if isinstance(v, bool) else \
                "number" if isinstance(v, (int, float)) else "string"
        if kind == "column":
            return self.families.get(expr.value[1])
        if kind in ("is_null", "is_bool"):
            for arg in expr.args:
                self.of(arg, where)
            return "boolean"
        if kind == "unary":
            inner = self.of(expr.args[0], where)
            if expr.value == "NOT":
                if inner not in (None, "boolean"):
                    raise self.fail(f"{where}: NOT of {self._describe(expr.args[0], inner)}", expr.pos)
                return "boolean"
            if inner not in (None, "number"):
                raise self.fail(f"{where}: {expr.value} of {self._describe(expr.args[0], inner)}", expr.pos)
            return inner
        if kind == "binary":
            op = expr.value
            a, b = expr.args
            if op in ("AND", "OR"):
                for side in (a, b):
                    family = self.of(side, where)
                    if family not in (None, "boolean"):
                        raise self.fail(f"{where}: {op} of {self._describe(side, family)}", side.pos)
                return "boolean"
            if op in _COMPARE:
                self._same(op, a, b, where, expr.pos)
                return "boolean"
            if op == "||":
                self.of(a, where), self.of(b, where)
                return "string"
            fa, fb = self.of(a, where), self.of(b, where)
            if fa == "timestamp" and fb in (None, "number") and op in "+-":
                return "timestamp"
            if fa == fb == "timestamp" and op == "-":
                raise self.fail(f"{where}: {self._describe(a, fa)} - {self._describe(b, fb)}: the difference of two "
                                "TIMESTAMPs is TIMESTAMPDIFF(SECOND, earlier, later) (as in Flink)", expr.pos)
            for side, family in ((a, fa), (b, fb)):
                if family not in (None, "number"):
                    raise self.fail(f"{where}: {op} needs numbers, {self._describe(side, family)} is not one", expr.pos)
            return "number"
        if kind == "between":
            self._same("BETWEEN", expr.args[0], expr.args[1], where, expr.pos)
            self._same("BETWEEN", expr.args[0], expr.args[2], where, expr.pos)
            return "boolean"
        if kind == "in":
            for item in expr.args[1:]:
                self._same("IN", expr.args[0], item, where, expr.pos)
            return "boolean"
        if kind == "like":
            for side in expr.args:
                family = self.of(side, where)
                if family not in (None, "string"):
                    raise self.fail(f"{where}: LIKE needs strings, {self._describe(side, family)} is not one", expr.pos)
            return "boolean"
        if kind == "case":
            branches, otherwise = expr.args
            for cond, _ in branches:
                if expr.value is None:
                    self.condition(cond, where)
            found = [f for f in (self.of(v, where) for _, v in branches) if f] + [self.of(otherwise, where)]
            return next((f for f in found if f), None)
        if kind == "cast":
            self.of(expr.args[0], where)
            return {"int": "number", "float": "number", "str": "string", "bool": "boolean"}[CAST_TYPES[expr.value]]
        if kind == "call":
            name = expr.value
            args = [a for a in expr.args if a.kind != "star"]
            inner = [self.of(a, where) for a in args]
            if name == "TIMESTAMPDIFF":
                for arg, family in zip(args[1:], inner[1:]):
                    if family not in (None, "timestamp"):
                        raise self.fail(f"{where}: TIMESTAMPDIFF needs TIMESTAMPs, {self._describe(arg, family)} is "
                                        "not one (a BIGINT of epoch ms: subtract, B.t - A.t)", expr.pos)
                return "number"
            if name == "LISTAGG" and inner and inner[0] not in (None, "string"):
                raise self.fail(f"{where}: LISTAGG needs strings, {self._describe(args[0], inner[0])} is not one (CAST "
                                "it AS STRING)", expr.pos)
            if name in ("SUM", "AVG") and inner and inner[0] not in (None, "number"):
                raise self.fail(f"{where}: {name} needs numbers, {self._describe(args[0], inner[0])} is not one",
                                expr.pos)
            if name in ("COUNT", "MATCH_NUMBER", "CHAR_LENGTH", "CHARACTER_LENGTH", "SUM", "AVG", "ABS", "MOD",
                        "POWER", "SQRT", "FLOOR", "CEIL", "CEILING"):
                return "number"
            if name in ("UPPER", "LOWER", "TRIM", "CONCAT", "CLASSIFIER", "LISTAGG"):
                return "string"
            if name == "MATCH_ROWTIME":
                return "timestamp"
            if name == "IF":
                return inner[1] or inner[2]
            return inner[0] if inner else None  # FIRST LAST PREV MIN MAX COALESCE NULLIF
        return None


def _constant(expr: Expr) -> bool:
    """``expr`` reads no row, no match and no time: its value is known when the query compiles."""
    if expr.kind in ("column", "star") or (expr.kind == "call" and expr.value in (*NAVIGATION, *AGGREGATES,
                                                                                    *MATCH_FUNCTIONS)):
        return False
    return all(_constant(sub) for sub in _children(expr))


def _fold(expr: Expr, clause: str, fail) -> None:
    """Evaluate every largest constant part of ``expr`` now (constant folding at check time): a
    part that fails on every row — ``1 / 0``, ``CAST('x' AS INT)`` — is an error of the query,
    with its spot, not a dead letter per row."""
    if expr.kind == "literal":
        return
    if _constant(expr):
        try:
            _compile(expr)(_Scope(lambda name: [], None, None))
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise fail(f"{clause}: {reason} (a constant: it would fail on every row)", expr.pos) from None
        return
    for sub in _children(expr):
        _fold(sub, clause, fail)


def _variables(expr: Expr) -> set[str]:
    found = set()
    if expr.kind == "column" and expr.value[0] is not None:
        found.add(expr.value[0])
    for sub in _children(expr):
        found |= _variables(sub)
    return found


def _columns(expr: Expr) -> bool:
    return expr.kind == "column" or any(_columns(sub) for sub in _children(expr))


def _children(expr: Expr) -> list[Expr]:
    if expr.kind == "case":
        branches, otherwise = expr.args
        out = [p for branch in branches for p in branch] + [otherwise]
        return out + ([expr.value] if expr.value is not None else [])
    return [a for a in expr.args if isinstance(a, Expr)]


# -- evaluating ---------------------------------------------------------------------------------
class _Scope:
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


def _current_row_only(expr: Expr, var: str) -> bool:
    """``expr`` reads the row being tested and nothing else of the match (a simple condition:
    the NFA need not build a context for it)."""
    if expr.kind == "call" and expr.value in (*NAVIGATION, *AGGREGATES, *MATCH_FUNCTIONS):
        return False
    if expr.kind == "column" and expr.value[0] not in (None, var):
        return False
    return all(_current_row_only(sub, var) for sub in _children(expr))


_SQL_COMPARE_OPS = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _column_form(expr: Expr) -> Node | None:
    """A DEFINE made of ``column <op> literal`` comparisons joined by AND / OR in the column form
    (:mod:`ctiflow.operators.cep.column_form`, the sql rule: what a start filter needs to skip
    rows in bulk), or None. No NOT: under SQL's three-valued logic NOT of unknown is not TRUE."""
    if expr.kind == "binary" and expr.value in ("AND", "OR"):
        left, right = _column_form(expr.args[0]), _column_form(expr.args[1])
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


def _guarded(evaluate: Callable[[_Scope], Any], clause: str) -> Callable[[_Scope], Any]:
    """``evaluate``, with a failure on the data raised as :class:`RowRefused` naming ``clause``."""

    def guarded(scope: _Scope) -> Any:
        try:
            return evaluate(scope)
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise RowRefused(f"{clause}: {reason}") from None

    return guarded


def _condition(expr: Expr, var: str, order: list[str]):
    """DEFINE ``var`` as a condition: simple when it reads only the current row, else iterative."""
    evaluate = _guarded(_compile(expr), f"DEFINE {var}")
    if _current_row_only(expr, var):
        return SimpleCondition(lambda row: evaluate(_Scope(None, row, var)) is True,
                               column_form=_column_form(expr))

    def test(row: Row, ctx) -> bool:
        def rows_of(name: str) -> Sequence[Row]:
            if name == STAR:  # the rows of the match so far in time order, then this one
                return _Then(ctx.events_view(None), row)
            rows = ctx.events_view(name)
            return _Then(rows, row) if name == var else rows

        return evaluate(_Scope(rows_of, row, var)) is True

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


def _measure(name: str, expr: Expr, order: list[str]):
    """MEASURES ``name``: ``value(match, at, number, emitted)``; a failure on the match's data
    raises :class:`MatchRefused`."""
    evaluate = _compile(expr)

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
            return _sql_value(evaluate(_Scope(rows_of, None, None, classifier, number, emitted)))
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise MatchRefused(f"MEASURES {name}: {reason} (the match of {len(every)} rows is not emitted)") from None

    return value


def _sql_value(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def _compile(expr: Expr) -> Callable[[_Scope], Any]:
    """A closure evaluating ``expr`` in a scope (three-valued logic: ``None`` is NULL)."""
    kind = expr.kind
    if kind == "literal":
        value = expr.value
        return lambda s: value
    if kind == "column":
        var, column = expr.value

        def column_value(s: _Scope) -> Any:
            if s.define is not None and (var is None or var == s.define):
                return s.current.get(column)
            rows = s.rows_of(var if var is not None else STAR)
            return rows[-1].get(column) if rows else None

        return column_value
    if kind == "unary":
        inner = _compile(expr.args[0])
        if expr.value == "NOT":
            return lambda s: (lambda v: None if v is None else not v)(inner(s))
        if expr.value == "-":
            return lambda s: _negate(inner(s), expr.pos)
        return inner
    if kind == "binary":
        return _binary(expr)
    if kind == "is_null":
        inner, negated = _compile(expr.args[0]), expr.value
        return lambda s: (inner(s) is None) != negated
    if kind == "is_bool":
        inner, (value, negated) = _compile(expr.args[0]), expr.value
        return lambda s: (inner(s) is value) != negated
    if kind == "between":
        v, lo, hi = (_compile(a) for a in expr.args)
        negated = expr.value

        def between(s: _Scope) -> Any:
            x, a, b = v(s), lo(s), hi(s)
            result = _and(_cmp(">=", x, a), _cmp("<=", x, b))
            return None if result is None else result != negated

        return between
    if kind == "in":
        v, *items = (_compile(a) for a in expr.args)
        negated = expr.value

        def in_(s: _Scope) -> Any:
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
    if kind == "like":
        v, pattern = (_compile(a) for a in expr.args)
        negated = expr.value

        def like(s: _Scope) -> Any:
            x, p = v(s), pattern(s)
            if x is None or p is None:
                return None
            regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in str(p))
            return (re.fullmatch(regex, str(x), re.DOTALL) is not None) != negated

        return like
    if kind == "case":
        return _case(expr)
    if kind == "cast":
        inner, target = _compile(expr.args[0]), CAST_TYPES[expr.value]
        return lambda s: _cast(inner(s), target)
    if kind == "call":
        return _call(expr)
    raise SqlError(f"{kind} is not supported here", "", expr.pos)


def _negate(v: Any, pos: int) -> Any:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SqlError(f"cannot negate {_type(v)} {v!r}", "", pos)
    return -v


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


_COMPARE = {"=": lambda a, b: a == b, "<>": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _cmp(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    try:
        return _COMPARE[op](a, b)
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


def _binary(expr: Expr) -> Callable[[_Scope], Any]:
    op = expr.value
    left, right = _compile(expr.args[0]), _compile(expr.args[1])
    if op == "AND":
        return lambda s: (lambda a: False if a is False else _and(a, right(s)))(left(s))
    if op == "OR":
        return lambda s: (lambda a: True if a is True else _or(a, right(s)))(left(s))
    if op in _COMPARE:
        return lambda s: _cmp(op, left(s), right(s))
    arith = _ARITH[op]

    def arithmetic(s: _Scope) -> Any:
        a, b = left(s), right(s)
        if a is None or b is None:
            return None
        if op == "||":
            return arith(_text(a), _text(b))
        try:
            result = arith(a, b)
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


def _case(expr: Expr) -> Callable[[_Scope], Any]:
    branches, otherwise = expr.args
    subject = _compile(expr.value) if expr.value is not None else None
    compiled = [(_compile(c), _compile(v)) for c, v in branches]
    fallback = _compile(otherwise)

    def case(s: _Scope) -> Any:
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
            return int(float(v)) if isinstance(v, str) else int(v)
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


def _call(expr: Expr) -> Callable[[_Scope], Any]:
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
    args = [_compile(a) for a in expr.args]
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

    def call(s: _Scope) -> Any:
        values = [a(s) for a in args]
        if any(v is None for v in values):
            return None
        try:
            return function(*values)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise SqlError(f"{name}({', '.join(map(repr, values))}): {exc}", "", expr.pos) from None

    return call


_SCALARS: dict[str, Callable[..., Any]] = {
    "ABS": abs, "MOD": _java_mod, "POWER": _power, "SQRT": _sqrt,
    "FLOOR": lambda a: math.floor(a) if isinstance(a, float) else a,
    "CEIL": lambda a: math.ceil(a) if isinstance(a, float) else a,
    "UPPER": lambda a: str(a).upper(), "LOWER": lambda a: str(a).lower(), "CHAR_LENGTH": lambda a: len(str(a)),
    "TRIM": lambda a: str(a).strip(" "),
}
_SCALARS["CEILING"] = _SCALARS["CEIL"]
_SCALARS["CHARACTER_LENGTH"] = _SCALARS["CHAR_LENGTH"]


def _navigation(expr: Expr) -> Callable[[_Scope], Any]:
    name = expr.value
    inner = _compile(expr.args[0])
    offset = expr.args[1].value if len(expr.args) == 2 else (1 if name in ("PREV", "NEXT") else 0)
    variables = _variables(expr.args[0])
    var = next(iter(variables)) if variables else STAR
    first = name == "FIRST"

    def navigate(s: _Scope) -> Any:
        if name == "PREV" and var == s.define:  # PREV(X.col, 0): the current row
            rows = s.rows_of(var)
        else:
            rows = s.rows_of(var)
            if s.define is not None and name == "PREV":  # PREV(Y.col, n) is LAST(Y.col, n)
                pass
        if len(rows) <= offset:
            return None
        row = rows[offset] if first else rows[len(rows) - offset - 1]
        return inner(_Scope(lambda n: [row], row, None, s.classifier, s.number, s.emitted))

    return navigate


def _aggregate(expr: Expr) -> Callable[[_Scope], Any]:
    name = expr.value
    arg = expr.args[0]
    if arg.kind == "star":
        return lambda s: len(s.rows_of(STAR))
    inner = _compile(arg)
    variables = _variables(arg)
    var = next(iter(variables)) if variables else STAR
    separator = expr.args[1].value if len(expr.args) == 2 else ","

    def aggregate(s: _Scope) -> Any:
        values = []
        for row in s.rows_of(var):
            v = inner(_Scope(lambda n, row=row: [row], row, None, s.classifier, s.number, s.emitted))
            if v is not None:
                values.append(v)
        if name == "COUNT":
            return len(values)
        if not values:
            return None
        if name == "LISTAGG":  # Flink's: the non-NULL values in row order, joined
            return separator.join(map(_text, values))
        if name == "SUM":
            return sum(values)
        if name == "MIN":
            return min(values)
        if name == "MAX":
            return max(values)
        total = sum(values)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return _java_div(total, len(values))  # AVG of integers is an integer (Flink)
        return total / len(values)

    return aggregate


def recognize(query: str, rows: Iterable[Mapping[str, Any]], refused: list | None = None,
              types: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``query`` over ``rows`` (a bounded input): the output rows in emission order
    (``refused``: see :meth:`Recognizer.rows`). Column types are the values' (an integer is a
    BIGINT, text a STRING — an ORDER BY time column of ISO text a TIMESTAMP); ``types`` declares
    others, e.g. ``{"ts": "timestamp"}`` for epoch milliseconds that are a TIMESTAMP(3)."""
    rows = list(rows)
    families = column_families(rows) if rows else ({} if types else None)
    if types:
        families.update(types)
    return compile_query(query, families).run(rows, refused)


def column_families(rows: Iterable[Mapping[str, Any]]) -> dict[str, str | None]:
    """Each column's type family from the values it holds (None: only NULLs, or mixed)."""
    seen: dict[str, set[str]] = {}
    for row in rows:
        for column, value in row.items():
            kinds = seen.setdefault(column, set())
            if value is not None:
                kinds.add("boolean" if isinstance(value, bool) else "number" if isinstance(value, (int, float))
                          else "string" if isinstance(value, str) else "other")
    return {c: next(iter(k)) if len(k) == 1 and k != {"other"} else None for c, k in seen.items()}


# -- the output's Avro schema -------------------------------------------------------------------
TIMESTAMP = {"type": "long", "logicalType": "timestamp-millis"}


def output_schema(recognizer: Recognizer, column_types: Mapping[str, Any], name: str) -> dict:
    """The Avro record schema of the output rows (:meth:`Recognizer.outputs`): the partition
    columns with their types, then each measure typed from its expression (``column_types``: the
    input's Avro field types; the ORDER BY time column is a ``timestamp-millis``); ALL ROWS PER
    MATCH adds the ORDER BY columns before the measures and the input's other columns after
    them, as the input types them. A measure is nullable unless it cannot be NULL (``COUNT``,
    ``MATCH_ROWTIME()``, ``MATCH_NUMBER()``, ``CLASSIFIER()``); columns are nullable."""
    q = recognizer.query
    types = {c: _base(t) for c, t in column_types.items()}
    fields: dict[str, dict] = {}

    def column(c: str, avro: Any) -> None:
        fields.setdefault(c, {"name": c, "type": _nullable(avro), "default": None})

    for c in q.partition_by:
        column(c, types.get(c, "string"))
    if q.all_rows:
        for c, _, _ in q.order_by:
            column(c, types.get(c, "string"))
    for m in q.measures:
        avro, nullable = _typeof(m.expr, types)
        fields[m.name] = {"name": m.name, "type": ["null", avro] if nullable else avro,
                          **({"default": None} if nullable else {})}
    if q.all_rows:
        for c, t in column_types.items():
            column(c, t)
    return {"type": "record", "name": name, "namespace": "ctiflow.recognize",
            "doc": "MATCH_RECOGNIZE output: partition columns, then measures", "fields": list(fields.values())}


def _nullable(avro: Any) -> list:
    """``avro`` as a union with ``null`` first (a union's own branches kept)."""
    branches = avro if isinstance(avro, list) else [avro]
    return ["null", *(b for b in branches if b != "null")]


def _base(avro_type: Any) -> Any:
    """A field's type without its null branch (the first other branch of a union)."""
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        return _base(others[0]) if others else "string"
    if isinstance(avro_type, Mapping) and avro_type.get("logicalType") == "timestamp-millis":
        return TIMESTAMP
    if isinstance(avro_type, Mapping):
        return _base(avro_type.get("type"))
    return {"int": "long", "float": "double"}.get(avro_type, avro_type)


def _numeric(*types: Any) -> Any:
    return "double" if "double" in types else "long"


def _typeof(expr: Expr, types: Mapping[str, Any]) -> tuple[Any, bool]:
    """``(Avro type, nullable)`` of ``expr``'s values."""
    kind = expr.kind
    if kind == "literal":
        v = expr.value
        return ({bool: "boolean", int: "long", float: "double", str: "string"}.get(type(v), "string"), v is None)
    if kind == "column":
        return types.get(expr.value[1], "string"), True
    if kind in ("is_null", "is_bool"):
        return "boolean", False
    if kind in ("between", "in", "like", "unary") and (kind != "unary" or expr.value == "NOT"):
        return "boolean", True
    if kind == "unary":
        return _typeof(expr.args[0], types)
    if kind == "binary":
        if expr.value in ("AND", "OR", "=", "<>", "<", "<=", ">", ">="):
            return "boolean", True
        if expr.value == "||":
            return "string", True
        left, right = _typeof(expr.args[0], types)[0], _typeof(expr.args[1], types)[0]
        if left == TIMESTAMP and expr.value in "+-" and right != TIMESTAMP:
            return TIMESTAMP, True
        return _numeric(left, right), True
    if kind == "case":
        branches, otherwise = expr.args
        for _, value in branches:
            t, _ = _typeof(value, types)
            if not (value.kind == "literal" and value.value is None):
                return t, True
        return _typeof(otherwise, types)[0], True
    if kind == "cast":
        return {"int": "long", "float": "double", "str": "string", "bool": "boolean"}[CAST_TYPES[expr.value]], True
    if kind == "call":
        name = expr.value
        if name == "COUNT":
            return "long", False
        if name == "MATCH_NUMBER":
            return "long", False
        if name == "MATCH_ROWTIME":
            return TIMESTAMP, False
        if name == "CLASSIFIER":
            return "string", False
        inner = _typeof(expr.args[0], types)[0] if expr.args and expr.args[0].kind != "star" else "long"
        if name in NAVIGATION or name in ("MIN", "MAX", "COALESCE", "NULLIF", "ABS", "FLOOR", "CEIL", "CEILING"):
            return inner, True
        if name in ("SUM", "AVG", "MOD"):
            return _numeric(inner), True
        if name == "LISTAGG":
            return "string", True
        if name in ("POWER", "SQRT"):
            return "double", True
        if name in ("CHAR_LENGTH", "CHARACTER_LENGTH", "TIMESTAMPDIFF"):
            return "long", True
        if name == "IF":
            return _typeof(expr.args[1], types)[0], True
        return "string", True
    return "string", True
