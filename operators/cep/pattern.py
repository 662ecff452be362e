"""The Pattern API: Flink CEP's ``Pattern`` in snake_case.

A :class:`Pattern` is only a *description*: a linked list of stages (each points to its
``previous``), with a condition, a quantifier and windows per stage. :func:`compile_pattern`
(:mod:`ctiflow.operators.cep.nfa.compiler`) turns it into an NFA plan once; the plan is then run by
:class:`ctiflow.operators.cep.nfa.nfa.Nfa` against a separate, serialisable state.

    Pattern.begin("start").where(lambda e: e["name"] == "c") \\
        .followed_by("middle").where(lambda e: e["name"] == "a").one_or_more().optional() \\
        .followed_by("end").where(lambda e: e["name"] == "b") \\
        .within(10_000)

Contiguity between stages (how a stage attaches to the previous one):

* ``next``: strict — the very next event must match;
* ``followed_by``: relaxed — non-matching events in between are skipped, the *first* matching
  event is taken;
* ``followed_by_any``: non-deterministic relaxed — every later matching event starts a branch;
* ``not_next`` / ``not_followed_by``: the stage must not match right after / anywhere before
  the next stage (at the end of a pattern ``not_followed_by`` needs a window).

Looping and times stages have an inner contiguity between their own events: relaxed by default,
``consecutive()`` makes it strict, ``allow_combinations()`` non-deterministic.

Windows: ``within(ms)`` bounds first-to-last event time (``WithinType.FIRST_AND_LAST``; the
smallest ``within`` of all stages wins); ``within(ms, WithinType.PREVIOUS_AND_CURRENT)`` bounds
the gap between a stage's event and the previous accepted event; ``times(n, window)``,
``one_or_more(window)`` and ``times_or_more(n, window)`` bound the gap between consecutive
events of a loop. Durations are integers (milliseconds of application time) or
:class:`datetime.timedelta`.

Validation follows Flink: option misuse raises :class:`~ctiflow.operators.errors.PatternError` while
the pattern is built (where Flink throws ``MalformedPatternException`` or
``UnsupportedOperationException``); whole-pattern checks (unique names, skip target exists,
``not_followed_by`` at the end needs a window, loop windows within the pattern window) run at
compile time, like Flink's ``NFACompiler``.
"""

from __future__ import annotations

from datetime import timedelta
from enum import Enum
from typing import Any

from ctiflow.operators.cep.conditions import (
    TRUE,
    AndCondition,
    Condition,
    OrCondition,
    SubtypeCondition,
    as_condition,
)
from ctiflow.operators.cep.nfa.skip_strategy import AfterMatchSkipStrategy
from ctiflow.operators.errors import PatternError


class WithinType(str, Enum):
    """What a window measures: first-to-last event, or previous-to-current event."""

    FIRST_AND_LAST = "first_and_last"
    PREVIOUS_AND_CURRENT = "previous_and_current"


class ConsumingStrategy(str, Enum):
    """How a stage skips events (Flink's ``Quantifier.ConsumingStrategy``)."""

    STRICT = "strict"
    SKIP_TILL_NEXT = "skip_till_next"
    SKIP_TILL_ANY = "skip_till_any"
    NOT_FOLLOW = "not_follow"
    NOT_NEXT = "not_next"


class QuantifierProperty(str, Enum):
    SINGLE = "single"
    LOOPING = "looping"
    TIMES = "times"
    OPTIONAL = "optional"
    GREEDY = "greedy"


def to_millis(duration: int | float | timedelta | None, *, what: str) -> int | None:
    """A window length in ms from an int (ms) or a ``timedelta``; ``None`` stays ``None``."""
    if duration is None:
        return None
    if isinstance(duration, timedelta):
        return int(duration.total_seconds() * 1000)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise PatternError(
            f"{what}: a duration must be milliseconds (int) or a timedelta, got {duration!r}"
        )
    return int(duration)


class Quantifier:
    """Single / looping / times, plus optional and greedy, and the consuming strategies."""

    __slots__ = ("properties", "consuming_strategy", "inner_consuming_strategy", "_stage")

    def __init__(
        self, consuming_strategy: ConsumingStrategy, first: QuantifierProperty, stage: str
    ) -> None:
        self.properties: set[QuantifierProperty] = {first}
        self.consuming_strategy = consuming_strategy
        self.inner_consuming_strategy = ConsumingStrategy.SKIP_TILL_NEXT
        self._stage = stage

    def has(self, prop: QuantifierProperty) -> bool:
        return prop in self.properties

    def _check(self, ok: bool, message: str) -> None:
        if not ok:
            raise PatternError(f"stage {self._stage!r}: {message}")

    def combinations(self) -> None:
        self._check(
            not self.has(QuantifierProperty.SINGLE),
            "allow_combinations() applies to looping/times stages only",
        )
        self._check(
            self.inner_consuming_strategy is not ConsumingStrategy.STRICT,
            "you can apply either allow_combinations() or consecutive(), not both",
        )
        self._check(
            self.inner_consuming_strategy is not ConsumingStrategy.SKIP_TILL_ANY,
            "allow_combinations() already applied",
        )
        self.inner_consuming_strategy = ConsumingStrategy.SKIP_TILL_ANY

    def consecutive(self) -> None:
        self._check(
            self.has(QuantifierProperty.LOOPING) or self.has(QuantifierProperty.TIMES),
            "consecutive() applies to looping/times stages only",
        )
        self._check(
            self.inner_consuming_strategy is not ConsumingStrategy.SKIP_TILL_ANY,
            "you can apply either allow_combinations() or consecutive(), not both",
        )
        self._check(
            self.inner_consuming_strategy is not ConsumingStrategy.STRICT,
            "consecutive() already applied",
        )
        self.inner_consuming_strategy = ConsumingStrategy.STRICT

    def optional(self) -> None:
        self._check(not self.has(QuantifierProperty.OPTIONAL), "optional() already applied")
        self._check(
            self.consuming_strategy
            not in (ConsumingStrategy.NOT_NEXT, ConsumingStrategy.NOT_FOLLOW),
            "a NOT stage cannot be optional",
        )
        self.properties.add(QuantifierProperty.OPTIONAL)

    def greedy(self) -> None:
        self._check(
            self.inner_consuming_strategy is not ConsumingStrategy.SKIP_TILL_ANY,
            "greedy() does not apply to a stage with allow_combinations()",
        )
        self._check(
            not self.has(QuantifierProperty.SINGLE),
            "greedy() applies to looping/times stages only (not to a single event)",
        )
        self.properties.add(QuantifierProperty.GREEDY)

    def __repr__(self) -> str:
        props = ",".join(sorted(p.value for p in self.properties))
        return (
            f"Quantifier({props}; {self.consuming_strategy.value}; "
            f"inner {self.inner_consuming_strategy.value})"
        )


#: The largest number of repetitions a stage may name (``times``, ``times_or_more``).
MAX_TIMES = 1_000


class Times:
    """How often a times/looping stage occurs, and the optional per-loop window (ms)."""

    __slots__ = ("from_", "to", "window_ms")

    def __init__(self, from_: int, to: int, window_ms: int | None, stage: str) -> None:
        if not isinstance(from_, int) or from_ <= 0:
            raise PatternError(
                f"stage {stage!r}: the minimum number of times must be a positive integer, "
                f"got {from_!r}"
            )
        if not isinstance(to, int) or to < from_:
            raise PatternError(
                f"stage {stage!r}: the maximum number of times must be an integer >= the "
                f"minimum {from_}, got {to!r}"
            )
        if to > MAX_TIMES:
            raise PatternError(
                f"stage {stage!r}: times up to {to} is more than {MAX_TIMES} (each repetition is a "
                "state of the compiled pattern); count larger runs with one_or_more / times_or_more "
                "and a condition on count('stage')"
            )
        self.from_ = from_
        self.to = to
        self.window_ms = window_ms

    def __repr__(self) -> str:
        return f"Times({self.from_}, {self.to}, window_ms={self.window_ms})"


_NAME_DELIMITER = ":"


class Pattern:
    """One stage of a pattern sequence, linked to the stage before it.

    Build with :meth:`begin` and the contiguity methods; each returns the *new* stage, while
    the option methods (``where``, ``times``, ``optional``, …) modify and return this stage.
    """

    def __init__(
        self,
        name: str,
        previous: Pattern | None,
        consuming_strategy: ConsumingStrategy,
        skip_strategy: AfterMatchSkipStrategy | None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise PatternError(f"a stage name must be a non-empty string, got {name!r}")
        if _NAME_DELIMITER in name and not isinstance(self, GroupPattern):
            raise PatternError(
                f"stage {name!r}: a stage name must not contain {_NAME_DELIMITER!r} "
                "(it separates the copies of a stage inside the compiled NFA)"
            )
        if skip_strategy is not None and not isinstance(skip_strategy, AfterMatchSkipStrategy):
            raise PatternError(
                f"stage {name!r}: skip_strategy must be an AfterMatchSkipStrategy, "
                f"got {skip_strategy!r}"
            )
        self._name = name
        self._previous = previous
        self._condition: Condition | None = None
        self._until: Condition | None = None
        self._windows: dict[WithinType, int] = {}
        self._quantifier = Quantifier(consuming_strategy, QuantifierProperty.SINGLE, name)
        self._times: Times | None = None
        self._skip = (
            skip_strategy if skip_strategy is not None else AfterMatchSkipStrategy.no_skip()
        )

    # -- starting a sequence ----------------------------------------------------------------
    @staticmethod
    def begin(
        name_or_pattern: str | Pattern, skip_strategy: AfterMatchSkipStrategy | None = None
    ) -> Pattern:
        """Start a sequence with a stage named ``name`` or with a group (a whole pattern)."""
        if isinstance(name_or_pattern, Pattern):
            return GroupPattern(None, name_or_pattern, ConsumingStrategy.STRICT, skip_strategy)
        return Pattern(name_or_pattern, None, ConsumingStrategy.STRICT, skip_strategy)

    # -- read access --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def previous(self) -> Pattern | None:
        return self._previous

    @property
    def quantifier(self) -> Quantifier:
        return self._quantifier

    @property
    def times_range(self) -> Times | None:
        return self._times

    @property
    def until_condition(self) -> Condition | None:
        return self._until

    @property
    def skip_strategy(self) -> AfterMatchSkipStrategy:
        return self._skip

    @property
    def condition(self) -> Condition:
        """The stage's condition; ``TRUE`` when no ``where`` was given (as in Flink)."""
        return self._condition if self._condition is not None else TRUE

    def window(self, within_type: WithinType = WithinType.FIRST_AND_LAST) -> int | None:
        return self._windows.get(WithinType(within_type))

    def stages(self) -> list[Pattern]:
        """All stages of the sequence, first to last (groups count as one stage)."""
        chain: list[Pattern] = []
        node: Pattern | None = self
        while node is not None:
            chain.append(node)
            node = node._previous
        return chain[::-1]

    # -- conditions -----------------------------------------------------------------------------
    def where(self, condition: Any) -> Pattern:
        """AND a condition to the stage: ``cond(event)`` or ``cond(event, ctx)``."""
        cond = as_condition(condition, stage=self._name)
        self._condition = cond if self._condition is None else AndCondition(self._condition, cond)
        return self

    def or_(self, condition: Any) -> Pattern:
        """OR a condition to the stage's condition."""
        cond = as_condition(condition, stage=self._name)
        self._condition = cond if self._condition is None else OrCondition(self._condition, cond)
        return self

    def subtype(self, subtype: type | str | Any) -> Pattern:
        """Only events of this type match: a class (``isinstance``), a type name (the ``"type"``
        field of a mapping event, or a class name in the event's MRO), or a predicate."""
        if subtype is None:
            raise PatternError(f"stage {self._name!r}: the subtype cannot be None")
        if isinstance(subtype, (type, str)):
            cond: Condition = SubtypeCondition(subtype)
        else:
            cond = as_condition(subtype, stage=self._name, what="subtype predicate")
        self._condition = cond if self._condition is None else AndCondition(self._condition, cond)
        return self

    def until(self, condition: Any) -> Pattern:
        """Stop a looping stage at the first event satisfying ``condition`` (not taken)."""
        cond = as_condition(condition, stage=self._name, what="until condition")
        if self._until is not None:
            raise PatternError(f"stage {self._name!r}: only one until condition can be applied")
        if not self._quantifier.has(QuantifierProperty.LOOPING):
            raise PatternError(
                f"stage {self._name!r}: until() applies to looping stages only "
                "(one_or_more / times_or_more)"
            )
        self._until = cond
        return self

    # -- windows ----------------------------------------------------------------------------------
    def within(
        self,
        duration: int | timedelta | None,
        within_type: WithinType | str = WithinType.FIRST_AND_LAST,
    ) -> Pattern:
        """Bound the match in application time (ms or timedelta; ``None`` is ignored)."""
        ms = to_millis(duration, what=f"stage {self._name!r}: within")
        try:
            kind = WithinType(within_type)
        except ValueError:
            raise PatternError(
                f"stage {self._name!r}: invalid within_type {within_type!r}. Valid choices "
                f"are: {', '.join(t.value for t in WithinType)}."
            ) from None
        if ms is not None:
            self._windows[kind] = ms
        return self

    # -- appending stages -----------------------------------------------------------------------
    def next(self, name_or_pattern: str | Pattern) -> Pattern:
        """Append a stage with strict contiguity (the very next event)."""
        return self._append(name_or_pattern, ConsumingStrategy.STRICT)

    def followed_by(self, name_or_pattern: str | Pattern) -> Pattern:
        """Append a stage with relaxed contiguity (skip non-matching events)."""
        return self._append(name_or_pattern, ConsumingStrategy.SKIP_TILL_NEXT)

    def followed_by_any(self, name_or_pattern: str | Pattern) -> Pattern:
        """Append a stage with non-deterministic relaxed contiguity (every later match)."""
        return self._append(name_or_pattern, ConsumingStrategy.SKIP_TILL_ANY)

    def not_next(self, name: str) -> Pattern:
        """Append a stage that must not match the event right after this stage."""
        self._check_no_optional_before_not()
        return Pattern(name, self, ConsumingStrategy.NOT_NEXT, self._skip)

    def not_followed_by(self, name: str) -> Pattern:
        """Append a stage that must not match before the next stage (or before the window
        closes, when it ends the pattern)."""
        self._check_no_optional_before_not()
        return Pattern(name, self, ConsumingStrategy.NOT_FOLLOW, self._skip)

    def _append(self, name_or_pattern: str | Pattern, strategy: ConsumingStrategy) -> Pattern:
        if isinstance(name_or_pattern, Pattern):
            return GroupPattern(self, name_or_pattern, strategy, self._skip)
        return Pattern(name_or_pattern, self, strategy, self._skip)

    def _check_no_optional_before_not(self) -> None:
        if self._quantifier.has(QuantifierProperty.OPTIONAL):
            raise PatternError(
                f"stage {self._name!r}: a NOT stage cannot follow an optional stage (not "
                "supported, as in Flink); use two patterns, one with and one without the "
                "optional stage"
            )

    # -- quantifiers ----------------------------------------------------------------------------
    def optional(self) -> Pattern:
        """The stage may be absent from a match."""
        previous = self._previous
        if previous is not None and previous._quantifier.has(QuantifierProperty.GREEDY):
            raise PatternError(
                f"stage {self._name!r}: an optional stage cannot follow a greedy stage"
            )
        self._quantifier.optional()
        return self

    def one_or_more(self, window: int | timedelta | None = None) -> Pattern:
        """One or more events; ``window`` bounds the gap between consecutive events."""
        self._check_not_a_not_stage()
        self._check_no_quantifier_yet()
        self._quantifier = Quantifier(
            self._quantifier.consuming_strategy, QuantifierProperty.LOOPING, self._name
        )
        self._times = Times(1, 1, to_millis(window, what=f"stage {self._name!r}"), self._name)
        return self

    def times_or_more(self, times: int, window: int | timedelta | None = None) -> Pattern:
        """At least ``times`` events; ``window`` bounds the gap between consecutive events."""
        self._check_not_a_not_stage()
        self._check_no_quantifier_yet()
        self._quantifier = Quantifier(
            self._quantifier.consuming_strategy, QuantifierProperty.LOOPING, self._name
        )
        self._times = Times(times, times, to_millis(window, what=f"stage {self._name!r}"),
                            self._name)
        return self

    def times(
        self, times: int, to: int | timedelta | None = None, window: int | timedelta | None = None
    ) -> Pattern:
        """Exactly ``times`` events, or between ``times`` and ``to``.

        Flink's overloads: ``times(n)``, ``times(n, window)`` (a :class:`timedelta` as second
        argument is the window), ``times(n, m)``, ``times(n, m, window)``; ``window`` may also
        be given by keyword in ms. ``times(0, m)`` makes the stage optional, as in Flink.
        """
        self._check_not_a_not_stage()
        self._check_no_quantifier_yet()
        if isinstance(to, timedelta):
            if window is not None:
                raise PatternError(f"stage {self._name!r}: times() got two windows")
            to, window = None, to
        window_ms = to_millis(window, what=f"stage {self._name!r}")
        if to is None:
            if not isinstance(times, int) or times <= 0:
                raise PatternError(
                    f"stage {self._name!r}: times() needs a positive number, got {times!r}"
                )
            self._quantifier = Quantifier(
                self._quantifier.consuming_strategy, QuantifierProperty.TIMES, self._name
            )
            self._times = Times(times, times, window_ms, self._name)
            return self
        self._quantifier = Quantifier(
            self._quantifier.consuming_strategy, QuantifierProperty.TIMES, self._name
        )
        if times == 0:
            self._quantifier.optional()
            times = 1
        self._times = Times(times, to, window_ms, self._name)
        return self

    def greedy(self) -> Pattern:
        """A looping/times stage takes as many events as it can (before the next stage)."""
        self._check_not_a_not_stage()
        if isinstance(self, GroupPattern):
            raise PatternError(f"stage {self._name!r}: greedy() does not apply to a group")
        self._quantifier.greedy()
        return self

    def consecutive(self) -> Pattern:
        """Strict contiguity between the events of a looping/times stage."""
        self._quantifier.consecutive()
        return self

    def allow_combinations(self) -> Pattern:
        """Non-deterministic relaxed contiguity between the events of a looping/times stage."""
        self._quantifier.combinations()
        return self

    def _check_not_a_not_stage(self) -> None:
        if self._quantifier.consuming_strategy in (
            ConsumingStrategy.NOT_FOLLOW,
            ConsumingStrategy.NOT_NEXT,
        ):
            raise PatternError(f"stage {self._name!r}: option not applicable to a NOT stage")

    def _check_no_quantifier_yet(self) -> None:
        if not self._quantifier.has(QuantifierProperty.SINGLE):
            raise PatternError(
                f"stage {self._name!r}: a quantifier was already applied ({self._quantifier})"
            )

    def __repr__(self) -> str:
        parts = []
        for stage in self.stages():
            parts.append(f"{stage._name}[{stage._quantifier}]")
        return "Pattern(" + " -> ".join(parts) + ")"


class GroupPattern(Pattern):
    """A whole pattern used as one stage (``begin(p)``, ``next(p)``, ``followed_by(p)``, …)."""

    def __init__(
        self,
        previous: Pattern | None,
        group: Pattern,
        consuming_strategy: ConsumingStrategy,
        skip_strategy: AfterMatchSkipStrategy | None,
    ) -> None:
        if not isinstance(group, Pattern):
            raise PatternError(f"a group stage needs a Pattern, got {type(group).__name__}")
        super().__init__("GroupPattern", previous, consuming_strategy, skip_strategy)
        self._raw = group

    @property
    def raw_pattern(self) -> Pattern:
        """The last stage of the grouped pattern."""
        return self._raw

    def where(self, condition: Any) -> Pattern:
        raise PatternError("a group stage does not support where(); put it on its inner stages")

    def or_(self, condition: Any) -> Pattern:
        raise PatternError("a group stage does not support or_(); put it on its inner stages")

    def subtype(self, subtype: Any) -> Pattern:
        raise PatternError("a group stage does not support subtype(); put it on its inner stages")
