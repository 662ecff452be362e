"""After-match skip strategies: which partial matches survive once a match is emitted.

Each strategy computes a *pruning event id* from the emitted match and discards every partial
(and every not yet emitted completed) match whose first event is at or before it:

=====================  ===================================  =========================
strategy               pruning id                            prunes start ids
=====================  ===================================  =========================
no_skip                none                                  nothing
skip_to_next           the match's first event               ``<=`` pruning id
skip_past_last_event   the match's last event                ``<=`` pruning id
skip_to_first(name)    first event of stage ``name``         ``<`` pruning id
skip_to_last(name)     last event of stage ``name``          ``<`` pruning id
=====================  ===================================  =========================

Event ids are ``(timestamp, n)`` tuples (n counts events with the same timestamp), so the
comparisons follow application-time order, as Flink's ``EventId`` comparator does.

``skip_to_first/last(...).throw_exception_on_miss()`` raise :class:`SkipStrategyError` when
the match has no event for the stage, or when skipping to it would not skip anything (the
element is the match's first event) — Flink's ``FlinkRuntimeException`` at the same moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ctiflow.operators.errors import PatternError

if TYPE_CHECKING:
    from ctiflow.operators.cep.nfa.heap import BinaryHeap
    from ctiflow.operators.cep.nfa.shared_buffer import EventId, SharedBuffer

Match = dict[str, list["EventId"]]


class SkipStrategyError(PatternError):
    """A skip strategy with ``throw_exception_on_miss`` could not skip (raised while matching)."""


class AfterMatchSkipStrategy:
    """Base class; build instances with the static constructors."""

    __slots__ = ()

    kind = "no_skip"

    # -- constructors (Flink: AfterMatchSkipStrategy.noSkip() ...) -------------------------
    @staticmethod
    def no_skip() -> "AfterMatchSkipStrategy":
        return NoSkip()

    @staticmethod
    def skip_to_next() -> "AfterMatchSkipStrategy":
        return SkipToNext()

    @staticmethod
    def skip_past_last_event() -> "AfterMatchSkipStrategy":
        return SkipPastLastEvent()

    @staticmethod
    def skip_to_first(pattern_name: str) -> "SkipToFirst":
        return SkipToFirst(pattern_name)

    @staticmethod
    def skip_to_last(pattern_name: str) -> "SkipToLast":
        return SkipToLast(pattern_name)

    # -- behaviour --------------------------------------------------------------------------
    @property
    def is_skip_strategy(self) -> bool:
        return False

    @property
    def pattern_name(self) -> str | None:
        return None

    def pruning_id(self, matches: Sequence[Match]) -> "EventId | None":
        return None

    def should_prune(self, start_event_id: "EventId", pruning_id: "EventId") -> bool:
        return False

    def prune(
        self, matches_to_prune: "BinaryHeap[Any]", matched: Sequence[Match], buffer: "SharedBuffer"
    ) -> None:
        """Discard (and release in the buffer) every computation state the strategy skips."""
        pruning_id = self.pruning_id(matched)
        if pruning_id is None:
            return
        discard = []
        for state in matches_to_prune:
            start_id = state.start_event_id
            if start_id is not None and self.should_prune(start_id, pruning_id):
                buffer.release_node(state.previous_entry, state.version)
                discard.append(state)
        matches_to_prune.remove_all(discard)

    def describe(self) -> dict[str, Any]:
        """Plain-data description (used by the declarative form and in reports)."""
        return {"strategy": self.kind}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.describe() == self.describe()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.describe().items())))

    def __repr__(self) -> str:
        return f"AfterMatchSkipStrategy({self.describe()})"


class NoSkip(AfterMatchSkipStrategy):
    """Every possible match is emitted."""

    __slots__ = ()


class _SkipRelativeToWholeMatch(AfterMatchSkipStrategy):
    __slots__ = ()

    @property
    def is_skip_strategy(self) -> bool:
        return True

    def should_prune(self, start_event_id: "EventId", pruning_id: "EventId") -> bool:
        return start_event_id <= pruning_id


class SkipToNext(_SkipRelativeToWholeMatch):
    """Discards partial matches that started with the match's first event."""

    __slots__ = ()
    kind = "skip_to_next"

    def pruning_id(self, matches: Sequence[Match]) -> "EventId | None":
        pruning = None
        for match in matches:
            for ids in match.values():
                if pruning is None or ids[0] < pruning:
                    pruning = ids[0]
        return pruning


class SkipPastLastEvent(_SkipRelativeToWholeMatch):
    """Discards partial matches that started before the match ended."""

    __slots__ = ()
    kind = "skip_past_last_event"

    def pruning_id(self, matches: Sequence[Match]) -> "EventId | None":
        pruning = None
        for match in matches:
            for ids in match.values():
                if pruning is None or ids[-1] > pruning:
                    pruning = ids[-1]
        return pruning


class _SkipToElement(AfterMatchSkipStrategy):
    __slots__ = ("_pattern_name", "throws")

    def __init__(self, pattern_name: str, throws: bool = False) -> None:
        if not isinstance(pattern_name, str) or not pattern_name:
            raise PatternError(f"{self.kind}: the stage name must be a non-empty string")
        self._pattern_name = pattern_name
        self.throws = throws

    def _index(self, size: int) -> int:
        raise NotImplementedError

    def throw_exception_on_miss(self) -> "_SkipToElement":
        """Fail instead of falling back to no-skip when the match lacks the stage."""
        return type(self)(self._pattern_name, True)

    @property
    def is_skip_strategy(self) -> bool:
        return True

    @property
    def pattern_name(self) -> str | None:
        return self._pattern_name

    def should_prune(self, start_event_id: "EventId", pruning_id: "EventId") -> bool:
        return start_event_id < pruning_id

    def pruning_id(self, matches: Sequence[Match]) -> "EventId | None":
        pruning = None
        name = self._pattern_name
        for match in matches:
            ids = match.get(name)
            if not ids:
                if self.throws:
                    raise SkipStrategyError(
                        f"could not skip to {name!r}: the match has no event for that stage"
                    )
            else:
                candidate = ids[self._index(len(ids))]
                if pruning is None or candidate >= pruning:
                    pruning = candidate
            if self.throws:
                everything = [eid for stage_ids in match.values() for eid in stage_ids]
                if not everything:
                    raise SkipStrategyError("cannot prune based on an empty match")
                if pruning is not None and pruning == min(everything):
                    raise SkipStrategyError(
                        f"could not skip to the first element of a match (stage {name!r} "
                        "starts the match, so skipping to it would skip nothing)"
                    )
        return pruning

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.kind,
            "pattern_name": self._pattern_name,
            "throw_exception_on_miss": self.throws,
        }


class SkipToFirst(_SkipToElement):
    """Discards partial matches that started before the first event of stage ``name``."""

    __slots__ = ()
    kind = "skip_to_first"

    def _index(self, size: int) -> int:
        return 0


class SkipToLast(_SkipToElement):
    """Discards partial matches that started before the last event of stage ``name``."""

    __slots__ = ()
    kind = "skip_to_last"

    def _index(self, size: int) -> int:
        return size - 1
