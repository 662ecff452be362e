"""``MATCH_RECOGNIZE`` checked before it runs: what Flink's validator refuses (unknown variables and
columns, misplaced navigation and aggregates, type errors), with the spot; constant parts folded
now, so a part that would fail on every row is an error of the query, not a dead letter per row."""

from __future__ import annotations

from collections.abc import Mapping

from ctiflow.operators.cep.expr.vocabulary import (AGGREGATES, CAST_TYPES, FUNCTIONS, MATCH_FUNCTIONS,
                                                   NAVIGATION, SqlError)

from ctiflow.operators.cep.sql.parse import Query
from ctiflow.operators.cep.expr.tree import Expr, children_of, reads_columns, variables_of
from ctiflow.operators.cep.expr.evaluate import COMPARE, DATA_ERRORS, Scope, compile_expr

class Checker:
    """What Flink's validator refuses, with the spot: unknown variables and columns, navigation
    and aggregates mixing variables, nested navigation, PREV on the variable being defined."""

    def __init__(self, q: Query, fail, names: list[str], known: set[str] | None) -> None:
        self.q, self.fail, self.names, self.known = q, fail, set(names), known

    def check(self, expr: Expr, define: str | None, inside: str | None = None) -> None:
        kind = expr.kind
        if kind == "column":
            return self._column(expr, define)
        if kind == "call":
            name = expr.value
            if name in NAVIGATION:
                return self._navigation(expr, define, inside)
            if name in AGGREGATES:
                return self._aggregate(expr, define, inside)
            if name in MATCH_FUNCTIONS:
                return self._match_function(expr, define)
            self._function(expr)
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

    def _column(self, expr: Expr, define: str | None) -> None:
        var, column = expr.value
        if var is not None and var not in self.names:
            raise self.fail(f"{var}.{column}: {var} is not a variable of the PATTERN", expr.pos)
        if self.known is not None and column not in self.known:
            where = f"DEFINE {define}" if define else "MEASURES"
            raise self.fail(f"{where}: column {column!r} is not in the input "
                            f"({', '.join(sorted(self.known))})", expr.pos)

    def _navigation(self, expr: Expr, define: str | None, inside: str | None) -> None:
        name = expr.value
        if inside is not None:
            raise self.fail(f"{name} inside {inside}: navigation cannot be nested or aggregated", expr.pos)
        if not 1 <= len(expr.args) <= 2:
            raise self.fail(f"{name} takes a column and an optional offset", expr.pos)
        if len(expr.args) == 2 and not (expr.args[1].kind == "literal" and isinstance(expr.args[1].value, int)
                                        and expr.args[1].value >= 0):
            raise self.fail(f"the offset of {name} must be a non-negative integer literal", expr.args[1].pos)
        variables = variables_of(expr.args[0])
        if len(variables) > 1:
            raise self.fail(f"{name} over several pattern variables ({', '.join(sorted(variables))})",
                            expr.pos)
        if name in ("PREV", "NEXT"):
            if define is None:
                raise self.fail(f"{name} cannot be used in MEASURES (use FIRST or LAST)", expr.pos)
            offset = expr.args[1].value if len(expr.args) == 2 else 1
            if name == "NEXT" or (offset != 0 and (variables or {define}) == {define} and variables != set()):
                raise self.fail(f"{name} on the variable being defined needs physical offsets, which "
                                "Flink does not support within a partition: use LAST("
                                f"{define}.col, n) for the n-th previous row of {define}", expr.pos)
        self.check(expr.args[0], define, inside=name)

    def _aggregate(self, expr: Expr, define: str | None, inside: str | None) -> None:
        name = expr.value
        if inside is not None:
            raise self.fail(f"{name} inside {inside}: aggregates cannot be nested or navigated", expr.pos)
        if name == "LISTAGG":
            if len(expr.args) not in (1, 2):
                raise self.fail("LISTAGG takes a column and an optional separator", expr.pos)
            if len(expr.args) == 2 and not (
                    expr.args[1].kind == "literal" and isinstance(expr.args[1].value, str)):
                raise self.fail("the separator of LISTAGG must be a string literal", expr.args[1].pos)
        elif len(expr.args) != 1:
            raise self.fail(f"{name} takes one argument", expr.pos)
        if expr.args[0].kind == "star":
            if name != "COUNT":
                raise self.fail(f"{name}(*) is not valid; only COUNT(*)", expr.pos)
            return
        variables = variables_of(expr.args[0])
        if len(variables) > 1:
            raise self.fail(f"{name} over several pattern variables ({', '.join(sorted(variables))}): an "
                            "aggregate must be applied to a single pattern variable", expr.pos)
        if not variables and not reads_columns(expr.args[0]):
            raise self.fail(f"{name}: no pattern variable or column specified in the aggregate", expr.pos)
        self.check(expr.args[0], define, inside=name)

    def _match_function(self, expr: Expr, define: str | None) -> None:
        name = expr.value
        if define is not None:
            raise self.fail(f"{name}() can only be used in MEASURES", expr.pos)
        if name != "MATCH_ROWTIME" and expr.args:
            raise self.fail(f"{name}() takes no arguments", expr.pos)

    def _function(self, expr: Expr) -> None:
        name = expr.value
        if name in ("RUNNING", "FINAL"):
            raise self.fail(f"{name} is a keyword before a measure", expr.pos)
        arity = FUNCTIONS.get(name)
        if arity is None:
            raise self.fail(
                f"function {name} is not supported; supported: "
                f"{', '.join(sorted([*FUNCTIONS, *NAVIGATION[:3], *AGGREGATES, *MATCH_FUNCTIONS]))}",
                expr.pos)
        lo, hi = arity
        if len(expr.args) < lo or (hi is not None and len(expr.args) > hi):
            raise self.fail(f"{name} takes {lo}"
                            f"{'' if hi == lo else ' or more' if hi is None else f' to {hi}'} "
                            "argument(s)", expr.pos)


class Types:
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
            raise self.fail(f"{where}: {self._describe(a, fa)} {op} {self._describe(b, fb)}: the types do "
                            "not match (CAST one side, or compare like with like)", pos)

    def condition(self, expr: Expr, where: str) -> None:
        family = self.of(expr, where)
        if family not in (None, "boolean"):
            raise self.fail(f"{where}: the condition is {self._describe(expr, family)}, not a BOOLEAN",
                            expr.pos)

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
        if kind == "between":
            self._same("BETWEEN", expr.args[0], expr.args[1], where, expr.pos)
            self._same("BETWEEN", expr.args[0], expr.args[2], where, expr.pos)
            return "boolean"
        if kind == "in":
            for item in expr.args[1:]:
                self._same("IN", expr.args[0], item, where, expr.pos)
            return "boolean"
        if kind == "cast":
            self.of(expr.args[0], where)
            return {"int": "number", "float": "number", "str": "string",
                    "bool": "boolean"}[CAST_TYPES[expr.value]]
        family = {"unary": self._unary, "binary": self._binary, "like": self._like, "case": self._case,
                  "call": self._call}.get(kind)
        return None if family is None else family(expr, where)

    def _unary(self, expr: Expr, where: str) -> str | None:
        inner = self.of(expr.args[0], where)
        if expr.value == "NOT":
            if inner not in (None, "boolean"):
                raise self.fail(f"{where}: NOT of {self._describe(expr.args[0], inner)}", expr.pos)
            return "boolean"
        if inner not in (None, "number"):
            raise self.fail(f"{where}: {expr.value} of {self._describe(expr.args[0], inner)}", expr.pos)
        return inner

    def _binary(self, expr: Expr, where: str) -> str | None:
        op = expr.value
        a, b = expr.args
        if op in ("AND", "OR"):
            for side in (a, b):
                family = self.of(side, where)
                if family not in (None, "boolean"):
                    raise self.fail(f"{where}: {op} of {self._describe(side, family)}", side.pos)
            return "boolean"
        if op in COMPARE:
            self._same(op, a, b, where, expr.pos)
            return "boolean"
        if op == "||":
            self.of(a, where), self.of(b, where)
            return "string"
        fa, fb = self.of(a, where), self.of(b, where)
        if fa == "timestamp" and fb in (None, "number") and op in "+-":
            return "timestamp"
        if fa == fb == "timestamp" and op == "-":
            raise self.fail(f"{where}: {self._describe(a, fa)} - {self._describe(b, fb)}: the difference of "
                            "two TIMESTAMPs is TIMESTAMPDIFF(SECOND, earlier, later) (as in Flink)",
                            expr.pos)
        for side, family in ((a, fa), (b, fb)):
            if family not in (None, "number"):
                raise self.fail(f"{where}: {op} needs numbers, {self._describe(side, family)} is not one",
                                expr.pos)
        return "number"

    def _like(self, expr: Expr, where: str) -> str:
        for side in expr.args:
            family = self.of(side, where)
            if family not in (None, "string"):
                raise self.fail(f"{where}: LIKE needs strings, {self._describe(side, family)} is not one",
                                expr.pos)
        return "boolean"

    def _case(self, expr: Expr, where: str) -> str | None:
        branches, otherwise = expr.args
        for cond, _ in branches:
            if expr.value is None:
                self.condition(cond, where)
        found = [f for f in (self.of(v, where) for _, v in branches) if f] + [self.of(otherwise, where)]
        return next((f for f in found if f), None)

    def _call(self, expr: Expr, where: str) -> str | None:
        name = expr.value
        args = [a for a in expr.args if a.kind != "star"]
        inner = [self.of(a, where) for a in args]
        if name == "TIMESTAMPDIFF":
            for arg, family in zip(args[1:], inner[1:]):
                if family not in (None, "timestamp"):
                    raise self.fail(f"{where}: TIMESTAMPDIFF needs TIMESTAMPs, {self._describe(arg, family)} "
                                    "is not one (a BIGINT of epoch ms: subtract, B.t - A.t)", expr.pos)
            return "number"
        if name == "LISTAGG" and inner and inner[0] not in (None, "string"):
            raise self.fail(f"{where}: LISTAGG needs strings, {self._describe(args[0], inner[0])} is not one "
                            "(CAST it AS STRING)", expr.pos)
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


def is_constant(expr: Expr) -> bool:
    """``expr`` reads no row, no match and no time: its value is known when the query compiles."""
    if expr.kind in ("column", "star") or (expr.kind == "call" and expr.value in (*NAVIGATION, *AGGREGATES,
                                                                                    *MATCH_FUNCTIONS)):
        return False
    return all(is_constant(sub) for sub in children_of(expr))


def fold(expr: Expr, clause: str, fail) -> None:
    """Evaluate every largest constant part of ``expr`` now (constant folding at check time): a
    part that fails on every row — ``1 / 0``, ``CAST('x' AS INT)`` — is an error of the query,
    with its spot, not a dead letter per row."""
    if expr.kind == "literal":
        return
    if is_constant(expr):
        try:
            compile_expr(expr)(Scope(lambda name: [], None, None))
        except DATA_ERRORS as exc:
            reason = exc.message if isinstance(exc, SqlError) else f"{type(exc).__name__}: {exc}"
            raise fail(f"{clause}: {reason} (a constant: it would fail on every row)", expr.pos) from None
        return
    for sub in children_of(expr):
        fold(sub, clause, fail)
