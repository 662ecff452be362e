"""SQL row pattern recognition: ``SELECT * FROM t MATCH_RECOGNIZE (…)`` parsed into a :class:`Query`.

The grammar is Flink's ``MATCH_RECOGNIZE`` (SQL:2016 row pattern recognition as Flink 2.x
accepts it) plus ``ALL ROWS PER MATCH`` and ``MATCH_NUMBER()`` from the standard. Hand-written
(a small recursive-descent parser) because what a user needs from it is an error that points at
the spot — line, column, a caret and what is supported instead — and because the ``PATTERN``
sub-language and ``WITHIN INTERVAL`` are not in the SQL parsers available here.

Errors are :class:`~ctiflow.operators.cep.expr.vocabulary.SqlError` (a
:class:`~ctiflow.operators.errors.PatternError`): ``message``, ``line``, ``column`` (1-based) and
:meth:`SqlError.render` for the caret display.
"""

from __future__ import annotations

import math
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

from ctiflow.operators.cep.expr.tree import BOUNDS, Expr
from ctiflow.operators.cep.expr.vocabulary import CAST_TYPES, SqlError


# -- tokens -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Token:
    kind: str  # "name", "quoted", "number", "string", "op", "end"
    text: str
    pos: int

    @property
    def upper(self) -> str:
        """A keyword or symbol as written upper-case; "" for literals and quoted names (a string
        ``'AND'`` is never the keyword)."""
        if self.kind == "name":
            return self.text.upper()
        return self.text if self.kind == "op" else ""

    @property
    def sym(self) -> str:
        """The symbol of an operator token; "" for every other kind (a string ``'-'`` is not minus)."""
        return self.text if self.kind == "op" else ""


_TOKEN = re.compile(r"""
    (?P<space>\s+|--[^\n]*|/\*.*?\*/)
  | (?P<number>\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<string>'(?:[^']|'')*')
  | (?P<op><>|!=|<=|>=|\|\||[-+*/%=<>(),.?{}|;^$])
""", re.VERBOSE | re.DOTALL)


def tokenize(text: str) -> list[Token]:
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            what = "an unterminated string" if text[pos] in "'`" else f"character {text[pos]!r}"
            raise SqlError(f"unexpected {what}", text, pos)
        kind = m.lastgroup
        if kind != "space":
            value = m.group()
            if kind == "quoted":
                value = value[1:-1].replace("``", "`")
            elif kind == "string":
                value = value[1:-1].replace("''", "'")
            tokens.append(Token(kind, value, pos))
        pos = m.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


@dataclass(frozen=True)
class PatternVar:
    name: str
    pos: int
    min: int | None = 1  # None: {,m} (no minimum given)
    max: int | None = 1  # None: unbounded
    greedy: bool = True
    quantified: bool = False


@dataclass(frozen=True)
class Measure:
    name: str
    expr: Expr
    running: bool  # RUNNING (default in ALL ROWS PER MATCH) or FINAL


@dataclass
class Query:
    text: str
    table: str
    partition_by: list[str]
    order_by: list[tuple[str, bool, int]]  # (column, ascending, pos)
    measures: list[Measure]
    all_rows: bool
    skip: tuple[str, str | None]  # ("to_next_row" | "past_last_row" | "to_first" | "to_last", variable)
    pattern: list[PatternVar]
    within_ms: int | None
    define: dict[str, Expr] = field(default_factory=dict)
    define_pos: dict[str, int] = field(default_factory=dict)
    alias: str | None = None


#: TIMESTAMPDIFF's units (Flink's, but the calendar ones: MONTH, QUARTER, YEAR) in milliseconds.
TIMESTAMPDIFF_UNITS = {"SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000,
                       "WEEK": 7 * 86_400_000}
_INTERVAL_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
_RESERVED = {"SELECT", "FROM", "MATCH_RECOGNIZE", "PARTITION", "ORDER", "BY", "MEASURES", "ONE", "ALL", "ROW",
             "ROWS", "PER", "MATCH", "AFTER", "SKIP", "PATTERN", "WITHIN", "DEFINE", "AS", "AND", "OR", "NOT",
             "CASE", "WHEN", "THEN", "ELSE", "END", "IS", "NULL", "TRUE", "FALSE", "IN", "BETWEEN",
             "INTERVAL", "RUNNING", "FINAL", "CAST", "SUBSET", "LIKE"}


#: Bounds that keep a hostile query from exhausting the stack or the CPU (as the YAML expressions'
#: ``ctiflow.operators.cep.expr.expression``): nesting levels of an expression or a pattern group, the length
#: of the query, the BIGINT range of an integer literal.
MAX_DEPTH = BOUNDS.depth
MAX_QUERY_LENGTH = BOUNDS.query_length
BIGINT_MAX = 2 ** 63 - 1


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    def nested(self, parse, *args):
        """``parse(*args)`` one nesting level deeper (an error past :data:`MAX_DEPTH`)."""
        if self.depth >= MAX_DEPTH:
            raise self.fail(f"nested more than {MAX_DEPTH} levels deep; write it flatter")
        self.depth += 1
        try:
            return parse(*args)
        finally:
            self.depth -= 1

    # -- helpers --------------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def fail(self, message: str, token: Token | None = None) -> SqlError:
        return SqlError(message, self.text, (token or self.tok).pos)

    def at(self, *words: str) -> bool:
        return all(self.peek(k).upper == w for k, w in enumerate(words))

    def accept(self, *words: str) -> bool:
        if self.at(*words):
            self.i += len(words)
            return True
        return False

    def expect(self, *words: str, hint: str = "") -> None:
        if not self.accept(*words):
            got = self.tok.text or "the end of the query"
            raise self.fail(f"expected {' '.join(words)}, found {got!r}" + (f" ({hint})" if hint else ""))

    def identifier(self, what: str) -> str:
        tok = self.tok
        if tok.kind == "quoted" or (tok.kind == "name" and tok.upper not in _RESERVED):
            self.i += 1
            return tok.text
        raise self.fail(f"expected {what}, found {tok.text or 'the end of the query'!r}")

    def integer(self, what: str) -> int:
        tok = self.tok
        if tok.kind != "number" or not tok.text.isdigit():
            raise self.fail(f"expected {what} (a non-negative integer), found {tok.text or 'the end'!r}")
        # (the length first: int() of thousands of digits is slow, and refused past 4,300)
        if len(tok.text.lstrip("0")) > 19 or int(tok.text) > BIGINT_MAX:
            shown = tok.text if len(tok.text) <= 20 else f"{tok.text[:20]}… ({len(tok.text):,} digits)"
            raise self.fail(f"{what} {shown} is out of the BIGINT range")
        self.i += 1
        return int(tok.text)

    # -- the statement --------------------------------------------------------------------------
    def query(self) -> Query:
        self.expect("SELECT", hint="a query is SELECT * FROM <table> MATCH_RECOGNIZE (...)")
        if not self.accept("*"):
            raise self.fail("only SELECT * is supported: list the output columns in MEASURES")
        self.expect("FROM")
        table = self.identifier("a table name")
        self.expect("MATCH_RECOGNIZE", hint="row pattern recognition is all this statement does")
        self.expect("(")
        partition_by = self.partition_by()
        order_by = self.order_by()
        measures = self.measures() if self.accept("MEASURES") else []
        all_rows = self.rows_per_match()
        skip = ("to_next_row", None)  # the default (SQL:2016, Calcite, Flink): AFTER MATCH SKIP TO NEXT ROW
        if self.accept("AFTER", "MATCH", "SKIP"):
            skip = self.skip()
        if self.at("SUBSET"):
            raise self.fail("SUBSET is not supported (Flink has no union variables); repeat the condition "
                            "instead")
        self.expect("PATTERN")
        pattern = self.pattern()
        within = None
        if self.accept("WITHIN"):
            within = self.interval()
        define, define_pos = self.define()
        self.expect(")", hint="the MATCH_RECOGNIZE clause ends here")
        alias = None
        if self.accept("AS"):
            alias = self.identifier("an alias")
        elif self.tok.kind in ("name", "quoted") and self.tok.upper not in _RESERVED:
            alias = self.identifier("an alias")
        self.accept(";")
        if self.tok.kind != "end":
            raise self.fail(f"unexpected {self.tok.text!r} after the query")
        return Query(self.text, table, partition_by, order_by, measures, all_rows, skip, pattern, within,
                     define, define_pos, alias)

    def partition_by(self) -> list[str]:
        columns: list[str] = []
        if self.accept("PARTITION", "BY"):
            columns.append(self.identifier("a partition column"))
            while self.accept(","):
                columns.append(self.identifier("a partition column"))
        return columns

    def order_by(self) -> list[tuple[str, bool, int]]:
        if not self.at("ORDER", "BY"):
            raise self.fail("MATCH_RECOGNIZE needs ORDER BY <time column> (rows are matched in time order)")
        self.expect("ORDER", "BY")
        order_by = []
        while True:
            pos = self.tok.pos
            column = self.identifier("an ORDER BY column")
            ascending = True
            if self.accept("DESC"):
                ascending = False
            else:
                self.accept("ASC")
            order_by.append((column, ascending, pos))
            if not self.accept(","):
                return order_by

    def rows_per_match(self) -> bool:
        """True for ALL ROWS PER MATCH (ONE ROW PER MATCH is the default)."""
        if self.accept("ONE", "ROW", "PER", "MATCH"):
            return False
        if not self.accept("ALL", "ROWS", "PER", "MATCH"):
            return False
        if self.at("SHOW") or self.at("OMIT") or self.at("WITH"):
            raise self.fail("ALL ROWS PER MATCH options (SHOW/OMIT EMPTY MATCHES, WITH UNMATCHED ROWS) are "
                            "not supported; write ALL ROWS PER MATCH alone")
        return True

    def define(self) -> tuple[dict[str, "Expr"], dict[str, int]]:
        define, define_pos = {}, {}
        if not self.at("DEFINE"):
            raise self.fail("expected DEFINE <variable> AS <condition>, … (required, as in SQL and Flink; "
                            "a variable left out matches every row)")
        self.expect("DEFINE")
        while True:
            pos = self.tok.pos
            name = self.identifier("a pattern variable")
            if name in define:
                raise self.fail(f"variable {name} is defined twice", self.tokens[self.i - 1])
            self.expect("AS")
            define[name], define_pos[name] = self.expression(), pos
            if not self.accept(","):
                return define, define_pos

    def measures(self) -> list[Measure]:
        out = []
        while True:
            running = None
            if self.accept("RUNNING"):
                running = True
            elif self.accept("FINAL"):
                running = False
            expr = self.expression()
            if not self.accept("AS"):
                raise self.fail("each measure needs a name: <expression> AS <name>")
            name = self.identifier("a measure name")
            out.append(Measure(name, expr, running if running is not None else True))
            if not self.accept(","):
                return out

    def skip(self) -> tuple[str, str | None]:
        if self.accept("TO", "NEXT", "ROW"):
            return ("to_next_row", None)
        if self.accept("PAST", "LAST", "ROW"):
            return ("past_last_row", None)
        if self.accept("TO", "FIRST"):
            return ("to_first", self.identifier("a pattern variable"))
        if self.accept("TO", "LAST"):
            return ("to_last", self.identifier("a pattern variable"))
        if self.accept("TO"):
            return ("to_last", self.identifier("a pattern variable"))  # SKIP TO v = SKIP TO LAST v
        raise self.fail("expected TO NEXT ROW, PAST LAST ROW, TO FIRST <variable> or TO LAST <variable>")

    def interval(self) -> int:
        start = self.tok
        self.expect("INTERVAL", hint="WITHIN takes INTERVAL '10' MINUTE")
        tok = self.tok
        if tok.kind == "string":
            amount_text = tok.text.strip()
        elif tok.kind == "number":
            amount_text = tok.text
        else:
            raise self.fail("expected the interval's amount as a string, e.g. INTERVAL '10' MINUTE")
        self.i += 1
        unit_tok = self.tok
        unit = unit_tok.upper.rstrip("S") if unit_tok.kind == "name" else ""
        if unit not in _INTERVAL_MS:
            raise self.fail(f"expected an interval unit ({', '.join(_INTERVAL_MS)}), found {unit_tok.text!r}")
        self.i += 1
        try:
            amount = float(amount_text)
        except ValueError:
            raise SqlError(f"interval amount {amount_text!r} is not a number", self.text, tok.pos) from None
        if not math.isfinite(amount) or not 0 <= amount * _INTERVAL_MS[unit] <= BIGINT_MAX:
            raise SqlError(f"interval amount {amount_text!r} is not a finite number of milliseconds in the "
                           "BIGINT range", self.text, tok.pos)
        ms = int(round(amount * _INTERVAL_MS[unit]))
        if ms <= 0:
            raise SqlError("WITHIN needs a positive interval", self.text, start.pos)
        return ms

    # -- PATTERN --------------------------------------------------------------------------------
    def pattern(self) -> list[PatternVar]:
        self.expect("(", hint="PATTERN (A B+ C)")
        out = self.pattern_seq()
        self.expect(")")
        if not out:
            raise self.fail("PATTERN needs at least one variable")
        return out

    def pattern_seq(self) -> list[PatternVar]:
        out: list[PatternVar] = []
        while True:
            tok = self.tok
            if tok.sym == "|":
                raise self.fail("alternation (|) is not supported (Flink's CEP has no branching patterns); "
                                "write one query per alternative, or one variable whose DEFINE has OR")
            if tok.upper == "PERMUTE":
                raise self.fail("PERMUTE is not supported (as in Flink); list the orders you need as queries")
            if tok.sym == "{" and self.peek().sym == "-":
                raise self.fail("exclusion {- -} is not supported (as in Flink)")
            if tok.sym == "^" or tok.sym == "$":
                raise self.fail("anchors ^ and $ are not supported (as in Flink)")
            if tok.sym == "(":
                self.i += 1
                inner = self.nested(self.pattern_seq)
                self.expect(")")
                if self.tok.sym in ("*", "+", "?", "{"):
                    if len(inner) != 1 or inner[0].quantified:  # Flink unwraps (A)+ to A+, nothing more
                        raise self.fail("a quantifier on a group of several variables (or of a quantified "
                                        "one) is not supported (Flink: group patterns are not supported "
                                        "yet); quantify single variables")
                    inner = [self.quantified(inner[0])]
                out.extend(inner)
                continue
            if tok.kind not in ("name", "quoted") or tok.sym == ")":
                return out
            self.i += 1
            out.append(self.quantified(PatternVar(tok.text, tok.pos)))

    def quantified(self, var: PatternVar) -> PatternVar:
        tok = self.tok
        lo, hi = 1, 1
        if tok.sym == "*":
            lo, hi = 0, None
        elif tok.sym == "+":
            lo, hi = 1, None
        elif tok.sym == "?":
            lo, hi = 0, 1
        elif tok.sym == "{":
            self.i += 1
            lo = None if self.tok.sym == "," else self.integer("the minimum repetitions")
            hi = lo
            if self.accept(","):
                hi = None if self.tok.sym == "}" else self.integer("the maximum repetitions")
            if self.tok.sym != "}":
                raise self.fail("expected } closing the quantifier, e.g. {2}, {2,}, {2,5} or {,5}")
            if hi is not None and lo is not None and hi < lo:
                raise self.fail(f"the quantifier's maximum {hi} is below its minimum {lo}")
        else:
            return var
        self.i += 1
        greedy = True
        if self.tok.sym == "?":
            greedy = False
            self.i += 1
        return PatternVar(var.name, var.pos, lo, hi, greedy, True)

    # -- expressions ----------------------------------------------------------------------------
    def expression(self) -> Expr:
        return self.nested(self.disjunction)

    def disjunction(self) -> Expr:
        left = self.conjunction()
        while self.at("OR"):
            pos = self.tok.pos
            self.i += 1
            left = Expr("binary", pos, "OR", (left, self.conjunction()))
        return left

    def conjunction(self) -> Expr:
        left = self.negation()
        while self.at("AND"):
            pos = self.tok.pos
            self.i += 1
            left = Expr("binary", pos, "AND", (left, self.negation()))
        return left

    def negation(self) -> Expr:
        if self.at("NOT"):
            pos = self.tok.pos
            self.i += 1
            return Expr("unary", pos, "NOT", (self.nested(self.negation),))
        return self.comparison()

    def comparison(self) -> Expr:
        left = self.additive()
        while True:
            tok = self.tok
            if tok.sym in ("=", "<>", "!=", "<", "<=", ">", ">="):
                self.i += 1
                op = "<>" if tok.text == "!=" else tok.text
                left = Expr("binary", tok.pos, op, (left, self.additive()))
            elif self.at("IS"):
                self.i += 1
                negated = self.accept("NOT")
                if self.accept("NULL"):
                    left = Expr("is_null", tok.pos, negated, (left,))
                elif self.at("TRUE") or self.at("FALSE"):
                    value = self.tok.upper == "TRUE"
                    self.i += 1
                    left = Expr("is_bool", tok.pos, (value, negated), (left,))
                else:
                    raise self.fail("expected NULL, TRUE or FALSE after IS")
            elif self.at("NOT", "BETWEEN") or self.at("BETWEEN"):
                negated = self.accept("NOT")
                self.expect("BETWEEN")
                low = self.additive()
                self.expect("AND")
                left = Expr("between", tok.pos, negated, (left, low, self.additive()))
            elif self.at("NOT", "IN") or self.at("IN"):
                negated = self.accept("NOT")
                self.expect("IN")
                self.expect("(")
                items = [self.expression()]
                while self.accept(","):
                    items.append(self.expression())
                self.expect(")")
                left = Expr("in", tok.pos, negated, (left, *items))
            elif self.at("NOT", "LIKE") or self.at("LIKE"):
                negated = self.accept("NOT")
                self.expect("LIKE")
                left = Expr("like", tok.pos, negated, (left, self.additive()))
            else:
                return left

    def additive(self) -> Expr:
        left = self.multiplicative()
        while self.tok.sym in ("+", "-", "||"):
            tok = self.tok
            self.i += 1
            left = Expr("binary", tok.pos, tok.text, (left, self.multiplicative()))
        return left

    def multiplicative(self) -> Expr:
        left = self.unary()
        while self.tok.sym in ("*", "/", "%"):
            tok = self.tok
            self.i += 1
            left = Expr("binary", tok.pos, tok.text, (left, self.unary()))
        return left

    def unary(self) -> Expr:
        tok = self.tok
        if tok.sym in ("-", "+"):
            self.i += 1
            return Expr("unary", tok.pos, tok.text, (self.nested(self.unary),))
        return self.primary()

    def primary(self) -> Expr:
        tok = self.tok
        if tok.kind == "number":
            self.i += 1
            if re.fullmatch(r"\d+", tok.text) is not None:
                if len(tok.text) > 19 or int(tok.text) > BIGINT_MAX:
                    raise self.fail(f"integer literal {tok.text[:30]}{'…' if len(tok.text) > 30 else ''} "
                                    "is out of the BIGINT range (as in Flink); write it as a DOUBLE, "
                                    "e.g. 1e30", tok)
                return Expr("literal", tok.pos, int(tok.text))
            value = float(tok.text)
            if value == float("inf"):
                raise self.fail(f"number {tok.text[:30]} is out of the DOUBLE range", tok)
            return Expr("literal", tok.pos, value)
        if tok.kind == "string":
            self.i += 1
            return Expr("literal", tok.pos, tok.text)
        if tok.sym == "(":
            self.i += 1
            inner = self.expression()
            self.expect(")")
            return inner
        if tok.kind == "name":
            word = tok.upper
            if word in ("TRUE", "FALSE"):
                self.i += 1
                return Expr("literal", tok.pos, word == "TRUE")
            if word == "NULL":
                self.i += 1
                return Expr("literal", tok.pos, None)
            if word == "CASE":
                return self.case()
            if word == "CAST":
                return self.cast()
            if word == "INTERVAL":
                return Expr("literal", tok.pos, self.interval())
            if self.peek().sym == "(":
                return self.call()
        if tok.kind in ("name", "quoted") and tok.upper not in _RESERVED:
            self.i += 1
            if self.tok.sym == ".":
                self.i += 1
                column = self.identifier("a column name")
                return Expr("column", tok.pos, (tok.text, column))
            return Expr("column", tok.pos, (None, tok.text))
        raise self.fail(f"expected an expression, found {tok.text or 'the end of the query'!r}")

    def call(self) -> Expr:
        tok = self.tok
        name = tok.upper
        self.i += 2
        if name == "COUNT" and self.tok.sym == "*":
            self.i += 1
            self.expect(")")
            return Expr("call", tok.pos, "COUNT", (Expr("star", tok.pos, None),))
        if name == "TIMESTAMPDIFF":  # TIMESTAMPDIFF(unit, earlier, later): the unit is a keyword
            unit_tok = self.tok
            unit = unit_tok.upper.rstrip("S") if unit_tok.kind == "name" else ""
            if unit not in TIMESTAMPDIFF_UNITS:
                raise self.fail(f"TIMESTAMPDIFF counts {', '.join(TIMESTAMPDIFF_UNITS)} (calendar units are "
                                "not supported), e.g. TIMESTAMPDIFF(SECOND, A.ts, B.ts)")
            self.i += 1
            self.expect(",")
            earlier = self.expression()
            self.expect(",")
            later = self.expression()
            self.expect(")", hint="TIMESTAMPDIFF(unit, earlier, later) ends here")
            return Expr("call", tok.pos, name, (Expr("literal", unit_tok.pos, TIMESTAMPDIFF_UNITS[unit]),
                                                earlier, later))
        if self.accept("DISTINCT"):
            raise self.fail("DISTINCT in an aggregate is not supported in MATCH_RECOGNIZE (as in Flink)")
        args: list[Expr] = []
        if self.tok.sym != ")":
            args.append(self.expression())
            while self.accept(","):
                args.append(self.expression())
        self.expect(")", hint=f"{name}(...) ends here")
        return Expr("call", tok.pos, name, tuple(args))

    def case(self) -> Expr:
        pos = self.tok.pos
        self.i += 1
        subject = None if self.at("WHEN") else self.expression()
        branches = []
        while self.accept("WHEN"):
            cond = self.expression()
            self.expect("THEN")
            branches.append((cond, self.expression()))
        if not branches:
            raise self.fail("CASE needs at least one WHEN … THEN …")
        otherwise = self.expression() if self.accept("ELSE") else Expr("literal", pos, None)
        self.expect("END", hint="CASE … END")
        return Expr("case", pos, subject, (tuple(branches), otherwise))

    def cast(self) -> Expr:
        pos = self.tok.pos
        self.i += 1
        self.expect("(")
        inner = self.expression()
        self.expect("AS")
        type_tok = self.tok
        type_name = self.identifier("a type name").upper()
        if self.accept("("):  # DECIMAL(10, 2), VARCHAR(20): precision is not kept
            while self.tok.sym != ")" and self.tok.kind != "end":
                self.i += 1
            self.expect(")")
        if type_name not in CAST_TYPES:
            raise SqlError(f"CAST to {type_name} is not supported; use one of "
                           f"{', '.join(sorted(CAST_TYPES))}", self.text, type_tok.pos)
        self.expect(")")
        return Expr("cast", pos, type_name, (inner,))


def parse(text: str) -> Query:
    """Parse one ``SELECT * FROM <table> MATCH_RECOGNIZE (…)`` statement."""
    if not isinstance(text, str) or not text.strip():
        raise SqlError("the query is empty", text or "", 0)
    if len(text) > MAX_QUERY_LENGTH:
        raise SqlError(f"the query is longer than {MAX_QUERY_LENGTH:,} characters", text, MAX_QUERY_LENGTH)
    with deep_enough():
        return _Parser(text).query()


@contextmanager
def deep_enough(frames: int = 20_000):
    """Python's recursion limit raised to ``frames`` for a while: a query nested
    :data:`MAX_DEPTH` levels deep takes ≈ 10 frames a level to parse, check and compile."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, frames))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)
