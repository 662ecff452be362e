"""``MATCH_RECOGNIZE`` on the CEP engine: a parsed :class:`~ctiflow.operators.cep.sql.parse.Query` becomes a
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

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctiflow.operators.cep.nfa.compiler import can_produce_empty_matches, compile_pattern
from ctiflow.operators.cep.conditions import IterativeCondition, SimpleCondition
from ctiflow.operators.cep.nfa.nfa import Nfa, NfaState
from ctiflow.operators.cep.pattern import Pattern, QuantifierProperty
from ctiflow.operators.cep.nfa.skip_strategy import AfterMatchSkipStrategy
from ctiflow.operators.cep.expr.vocabulary import (AGGREGATES, MATCH_FUNCTIONS, NAVIGATION, STAR, Row,
                                                   SqlError, Timestamp, to_millis)
from ctiflow.operators.cep.sql.parse import Query, parse
from ctiflow.operators.cep.expr.evaluate import (DATA_ERRORS, LONG, MatchRefused, RowRefused, Scope,
                                                 column_form, compile_expr, guarded)
from ctiflow.operators.cep.sql.check import Checker, Types, fold
from ctiflow.operators.cep.expr.tree import Expr, children_of
from ctiflow.operators.errors import PatternError

END_OF_TIME = 2 ** 63 - 1  # Flink's final watermark (Long.MAX_VALUE)

# -- DEFINE and MEASURES on the Pattern API --------------------------------------------------
def current_row_only(expr: Expr, var: str) -> bool:
    """``expr`` reads the row being tested and nothing else of the match (a simple condition:
    the NFA need not build a context for it)."""
    if expr.kind == "call" and expr.value in (*NAVIGATION, *AGGREGATES, *MATCH_FUNCTIONS):
        return False
    if expr.kind == "column" and expr.value[0] not in (None, var):
        return False
    return all(current_row_only(sub, var) for sub in children_of(expr))


def define_condition(expr: Expr, var: str, order: list[str]):
    """DEFINE ``var`` as a condition: simple when it reads only the current row, else iterative."""
    evaluate = guarded(compile_expr(expr), f"DEFINE {var}")
    if current_row_only(expr, var):
        return SimpleCondition(lambda row: evaluate(Scope(None, row, var)) is True,
                               column_form=column_form(expr))

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
        classifier = at[1] if at is not None else next((n for n in order for r in match.get(n, ())
                                                        if r is completed), None)
        try:
            got = _sql_value(evaluate(Scope(rows_of, None, None, classifier, number, emitted)))
            if type(got) is int and not -LONG <= got < LONG:  # (a literal beyond BIGINT)
                raise SqlError(f"{got} is beyond BIGINT", "", expr.pos)
            return got
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise MatchRefused(f"MEASURES {name}: {reason} (the match of {len(every)} rows is not "
                               "emitted)") from None

    return value


def _sql_value(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


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
                raise SqlError(f"row {seq + 1}: ORDER BY column {self.time_column!r} must be epoch "
                               f"milliseconds or an ISO timestamp, got {raw.get(self.time_column)!r} "
                               f"({exc})", q.text, q.order_by[0][2]) from None
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

    def one_row(self, base: dict[str, Any], match: dict[str, list], number: int,
                emitted: int) -> dict[str, Any]:
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
        ordered = sorted(((row, var) for var, rows in match.items() for row in rows),
                         key=lambda rv: rv[0].seq)
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
    return (expr.kind == "call" and expr.value == name) or any(_calls(sub, name) for sub in children_of(expr))


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
    checker = Checker(q, fail, names, known)
    time_family = families.get(time_column)
    timestamp = time_family in (None, "timestamp", "string")  # ISO text is a TIMESTAMP; a BIGINT stays one
    types = None
    if families:
        families[time_column] = "timestamp" if timestamp else time_family
        types = Types(families, fail)
    found: list[SqlError] = []  # every DEFINE and measure checked: all their errors at once
    for clause, expr, define in ([(f"DEFINE {n}", e, n) for n, e in q.define.items()]
                                 + [(f"MEASURES {m.name}", m.expr, None) for m in q.measures]):
        try:
            checker.check(expr, define=define)
            if types is not None:
                types.of(expr, clause)
                if define is not None:
                    types.condition(expr, clause)
            fold(expr, clause, fail)
        except SqlError as exc:
            found.append(exc)
    if found:
        found[0].others = found[1:]
        raise found[0]
    pattern = _translate(q, fail, names)
    measures = [(m.name, measure(m.name, m.expr, names)) for m in q.measures]
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
        raise fail(f"AFTER MATCH SKIP TO {var}: {var} is not a variable of the PATTERN",
                   q.text.upper().find("SKIP"))
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
        pattern = (Pattern.begin(var.name, _skip(q, fail, names)) if pattern is None
                   else pattern.next(var.name))
        expr = q.define.get(var.name)
        if expr is None:  # a variable without DEFINE matches every row
            pattern.where(lambda row: True)
        else:
            condition = define_condition(expr, var.name, names)
            pattern.where(condition if isinstance(condition, SimpleCondition)
                          else IterativeCondition(condition))
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
            raise fail("a reluctant optional variable (A?? or A{0,1}?) is not supported (as in Flink): "
                       "write A?", var.pos)
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
                kinds.add("boolean" if isinstance(value, bool)
                          else "number" if isinstance(value, (int, float))
                          else "string" if isinstance(value, str) else "other")
    return {c: next(iter(k)) if len(k) == 1 and k != {"other"} else None for c, k in seen.items()}
