"""The vocabulary the expression evaluator knows, whichever language an expression was written
in, and the error it raises at a place in an expression's text: the names of SQL's navigation,
aggregate and other functions, the types ``CAST`` takes, the values rows and times are
(:class:`Row`, :class:`Timestamp`). The SQL parser (:mod:`ctiflow.operators.cep.sql.parse`), its
check and translation and the evaluator (:mod:`ctiflow.operators.cep.expr.evaluate`) share it."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from ctiflow.operators.errors import PatternError


class SqlError(PatternError):
    """A query that does not parse, or uses something unsupported, at ``line``:``column``."""

    def __init__(self, message: str, text: str = "", pos: int = 0) -> None:
        self.message = message
        self.text = text
        self.pos = pos
        #: further errors of the same query, found in the same check (``ctiflow check`` shows all)
        self.others: list[SqlError] = []
        self.line = text.count("\n", 0, pos) + 1
        self.column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        super().__init__(f"line {self.line}, column {self.column}: {message}")

    def render(self) -> str:
        """The message, the query line and a caret under the spot."""
        start = self.text.rfind("\n", 0, self.pos) + 1
        end = self.text.find("\n", self.pos)
        source = self.text[start:end if end >= 0 else len(self.text)]
        return f"{self}\n  {source}\n  {' ' * (self.column - 1)}^"

    def render_all(self) -> list[str]:
        """:meth:`render` of this error and of :attr:`others`."""
        return [error.render() for error in (self, *self.others)]


#: Types CAST accepts, by what the value becomes.
CAST_TYPES = {"INT": "int", "INTEGER": "int", "BIGINT": "int", "SMALLINT": "int", "TINYINT": "int",
              "DOUBLE": "float", "FLOAT": "float", "REAL": "float", "DECIMAL": "float",
              "STRING": "str", "VARCHAR": "str", "CHAR": "str", "BOOLEAN": "bool"}


# -- the language's vocabulary (shared by checking, evaluating and translating) ------------------
STAR = "*"  # the universal pattern variable: every row of the match
NAVIGATION = ("FIRST", "LAST", "PREV", "NEXT")
AGGREGATES = ("SUM", "AVG", "MIN", "MAX", "COUNT", "LISTAGG")
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "ABS": (1, 1), "MOD": (2, 2), "POWER": (2, 2), "SQRT": (1, 1), "FLOOR": (1, 1), "CEIL": (1, 1),
    "CEILING": (1, 1), "UPPER": (1, 1), "LOWER": (1, 1), "CHAR_LENGTH": (1, 1), "CHARACTER_LENGTH": (1, 1),
    "TRIM": (1, 1), "CONCAT": (1, None), "COALESCE": (1, None), "NULLIF": (2, 2), "IF": (3, 3),
    "TIMESTAMPDIFF": (3, 3),
}
MATCH_FUNCTIONS = ("MATCH_ROWTIME", "CLASSIFIER", "MATCH_NUMBER")




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
