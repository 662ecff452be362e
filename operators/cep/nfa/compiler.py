"""Pattern -> NFA plan: states with TAKE / IGNORE / PROCEED edges (Flink's ``NFACompiler``).

The compiler walks the pattern from its last stage back to the first, creating for each stage
the states that accept its events and wiring them to the states of the following stage:

* **TAKE** — the event satisfies the edge's condition and is accepted: it is stored in the
  shared buffer under the edge's *source* stage and the run moves to the target;
* **IGNORE** — the event is skipped; the run stays (or, after a PROCEED, moves) without
  storing it. Strict contiguity has no IGNORE edge, relaxed ignores non-matching events,
  non-deterministic relaxed ignores every event;
* **PROCEED** — an epsilon move evaluated on the same event (leaving an optional stage or a
  loop, or checking a NOT stage).

Special states: the **final** state ``$endState$``; **stop** states (a NOT stage matched: the
run dies); a **pending** state for ``not_followed_by`` at the end of a pattern: the run is
complete once the window closes without the forbidden event.

Stage copies get internal names ``name:0``, ``name:1``, … (``times(3)`` needs three states); the
shared buffer and the matches use the original names. The plan is immutable after compilation
and shared by all keys; the per-key mutable part lives in :class:`ctiflow.operators.cep.nfa.nfa.NfaState`.

This is a faithful port: the order in which states and edges are created decides the Dewey
versions and therefore the matches, so it follows ``NFACompiler.NFAFactoryCompiler`` step by
step (including its quirks). One deliberate difference: where Flink compiles a PROCEED edge to
``null`` (a greedy optional looping stage with ``until`` after a NOT stage, see
:meth:`_Compiler._original_state`), the edge goes to the state Flink meant: the matches are
Flink's wherever Flink's NFA does not throw.

Every pattern that cannot be compiled raises :class:`~ctiflow.operators.errors.PatternError` naming
the stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ctiflow.operators.cep.conditions import TRUE, AndCondition, Condition, NotCondition, fast_predicate
from ctiflow.operators.cep.pattern import (
    ConsumingStrategy,
    GroupPattern,
    Pattern,
    QuantifierProperty,
    Times,
    WithinType,
)
from ctiflow.operators.cep.nfa.skip_strategy import AfterMatchSkipStrategy
from ctiflow.operators.errors import PatternError

ENDING_STATE_NAME = "$endState$"
STATE_NAME_DELIMITER = ":"

LOOPING = QuantifierProperty.LOOPING
TIMES = QuantifierProperty.TIMES
OPTIONAL = QuantifierProperty.OPTIONAL
GREEDY = QuantifierProperty.GREEDY
STRICT = ConsumingStrategy.STRICT
SKIP_TILL_NEXT = ConsumingStrategy.SKIP_TILL_NEXT
SKIP_TILL_ANY = ConsumingStrategy.SKIP_TILL_ANY
NOT_FOLLOW = ConsumingStrategy.NOT_FOLLOW
NOT_NEXT = ConsumingStrategy.NOT_NEXT


class Action(str, Enum):
    TAKE = "take"
    IGNORE = "ignore"
    PROCEED = "proceed"


class StateType(str, Enum):
    START = "start"
    NORMAL = "normal"
    FINAL = "final"
    STOP = "stop"
    PENDING = "pending"


TAKE = Action.TAKE
IGNORE = Action.IGNORE
PROCEED = Action.PROCEED


class Transition:
    """An edge ``source --action[condition]--> target``; ``condition`` ``None`` means true.

    ``predicate`` is set once compilation is complete (conditions may still be rewritten
    until then, by greedy stages): ``ALWAYS``, a one-argument function, or ``None`` when the
    condition is iterative and must be called with the match context.
    """

    __slots__ = ("source", "action", "target", "condition", "predicate")

    def __init__(
        self, source: "State", action: Action, target: "State", condition: Condition | None
    ) -> None:
        self.source = source
        self.action = action
        self.target = target
        self.condition = condition
        self.predicate: Any = None

    def __repr__(self) -> str:
        return f"{self.action.value}->{self.target.name} [{self.condition!r}]"


class State:
    """An NFA state; ``name`` is unique in the plan, ``stage`` the user's stage name.

    The ``is_*`` flags are plain attributes (read on the NFA's hot path), kept in step with
    ``type`` by :meth:`make_start`, the only change of type after creation.
    """

    __slots__ = ("name", "stage", "type", "transitions",
                 "is_start", "is_final", "is_stop", "is_pending")

    def __init__(self, name: str, state_type: StateType) -> None:
        self.name = name
        self.stage = original_name(name)
        self.transitions: list[Transition] = []
        self._set_type(state_type)

    def _set_type(self, state_type: StateType) -> None:
        self.type = state_type
        self.is_start = state_type is StateType.START
        self.is_final = state_type is StateType.FINAL
        self.is_stop = state_type is StateType.STOP
        self.is_pending = state_type is StateType.PENDING

    def make_start(self) -> None:
        self._set_type(StateType.START)

    def add(self, action: Action, target: "State", condition: Condition | None) -> None:
        self.transitions.append(Transition(self, action, target, condition))

    def add_take(self, target: "State", condition: Condition | None) -> None:
        self.add(TAKE, target, condition)

    def add_self_take(self, condition: Condition | None) -> None:
        self.add(TAKE, self, condition)

    def add_ignore(self, target: "State", condition: Condition | None) -> None:
        self.add(IGNORE, target, condition)

    def add_self_ignore(self, condition: Condition | None) -> None:
        self.add(IGNORE, self, condition)

    def add_proceed(self, target: "State", condition: Condition | None) -> None:
        self.add(PROCEED, target, condition)

    def __repr__(self) -> str:
        return f"State({self.name}, {self.type.value}, {self.transitions})"


def original_name(internal_name: str) -> str:
    """The user's stage name of an internal state name (``"middle:2"`` -> ``"middle"``)."""
    return internal_name.split(STATE_NAME_DELIMITER, 1)[0]


@dataclass(frozen=True)
class NfaPlan:
    """The compiled, immutable NFA shared by every key.

    ``window_ms`` is the first-and-last window (0: none); ``state_windows_ms`` maps internal
    state names to previous-and-current windows.
    """

    states: dict[str, State]
    start_state: str
    window_ms: int
    state_windows_ms: dict[str, int]
    skip_strategy: AfterMatchSkipStrategy
    timeout_handling: bool
    has_iterative_conditions: bool
    stage_names: tuple[str, ...] = field(default=())
    #: No state but the start ignores an event: every run takes a contiguous range of events
    #: (:mod:`ctiflow.operators.cep.nfa.contiguous_buffer` holds the runs)
    contiguous: bool = False

    @property
    def has_windows(self) -> bool:
        return self.window_ms > 0 or any(ms > 0 for ms in self.state_windows_ms.values())


class _StateNames:
    """Unique internal names: ``name``, then ``name:0``, ``name:1``, …"""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def check_unique(self, name: str) -> None:
        if name in self.used:
            raise PatternError(f"duplicate stage name {name!r}: stage names must be unique")
        self.used.add(name)

    def unique(self, base: str) -> str:
        counter = 0
        candidate = base
        while candidate in self.used:
            candidate = f"{base}{STATE_NAME_DELIMITER}{counter}"
            counter += 1
        self.used.add(candidate)
        return candidate


class _Compiler:
    """Flink's ``NFAFactoryCompiler``: mutable compilation context for one pattern."""

    def __init__(self, pattern: Pattern) -> None:
        self.names = _StateNames()
        self.stop_states: dict[str, State] = {}
        self.states: list[State] = []
        self.window_times: dict[str, int] = {}
        self.window_time: int | None = None
        self.current_group: GroupPattern | None = None
        self.first_of_loop: dict[int, bool] = {}
        self.current: Pattern = pattern
        self.following: Pattern | None = None
        self.skip = pattern.skip_strategy
        self.original_state_map: dict[str, State] = {}

    # -- driver ---------------------------------------------------------------------------------
    def compile(self) -> State:
        last_pattern = self.current
        self._check_name_uniqueness()
        self._check_skip_strategy()
        sink = self._create_ending_state()
        sink = self._create_middle_states(sink)
        start = self._create_start_state(sink)
        self._check_window_times()
        if (
            last_pattern.quantifier.consuming_strategy is NOT_FOLLOW
            and self.window_times.get(last_pattern.name, 0) <= 0
            and self.get_window_time() == 0
        ):
            raise PatternError(
                f"stage {last_pattern.name!r}: not_followed_by() at the end of a pattern needs "
                "a window: add within(...) (first-and-last or previous-and-current)"
            )
        return start

    def stage_label(self) -> str:
        """``stage 'name'`` of the stage being compiled (and of its group, if any); safe to
        call on a half-built, tampered pattern."""
        label = f"stage {getattr(self.current, 'name', self.current)!r}"
        if self.current_group is not None:
            first: Pattern | None = self.current_group.raw_pattern
            while isinstance(first, Pattern) and first.previous is not None:
                first = first.previous
            label += f" (in the group starting at stage {getattr(first, 'name', first)!r})"
        return label

    def get_window_time(self) -> int:
        return self.window_time if self.window_time is not None else 0

    def _check_window_times(self) -> None:
        if self.window_time is not None:
            for state_name, ms in self.window_times.items():
                if ms > self.window_time:
                    raise PatternError(
                        f"stage {original_name(state_name)!r}: its previous-and-current window "
                        f"({ms} ms) cannot be larger than the pattern's first-and-last window "
                        f"({self.window_time} ms)"
                    )

    def _check_skip_strategy(self) -> None:
        name = self.skip.pattern_name
        if name is None:
            return
        pattern = self.current
        while pattern.previous is not None and pattern.name != name:
            pattern = pattern.previous
        if pattern.name != name:
            raise PatternError(
                f"the skip strategy {self.skip.kind} refers to stage {name!r}, which is not a "
                "stage of the pattern"
            )

    def _check_name_uniqueness(self) -> None:
        self.names.check_unique(ENDING_STATE_NAME)
        pattern: Pattern | None = self.current
        while pattern is not None:
            self._check_pattern_name(pattern)
            pattern = pattern.previous
        self.names.used.clear()

    def _check_pattern_name(self, pattern: Pattern) -> None:
        if isinstance(pattern, GroupPattern):
            inner: Pattern | None = pattern.raw_pattern
            while inner is not None:
                self._check_pattern_name(inner)
                inner = inner.previous
        else:
            self.names.check_unique(pattern.name)

    # -- NOT conditions ---------------------------------------------------------------------------
    def _current_not_conditions(self) -> list[tuple[Condition, str]]:
        """NOT_FOLLOW stages reachable backwards through optional / NOT_FOLLOW stages."""
        result = []
        previous = self.current
        while previous.previous is not None and (
            previous.previous.quantifier.has(OPTIONAL)
            or previous.previous.quantifier.consuming_strategy is NOT_FOLLOW
        ):
            previous = previous.previous
            if previous.quantifier.consuming_strategy is NOT_FOLLOW:
                result.append((self._take_condition(previous), previous.name))
        return result

    # -- states -----------------------------------------------------------------------------------
    def _create_ending_state(self) -> State:
        end = self._create_named_state(ENDING_STATE_NAME, StateType.FINAL)
        self.window_time = self.current.window(WithinType.FIRST_AND_LAST)
        return end

    def _create_middle_states(self, sink: State) -> State:
        last_sink = sink
        while self.current.previous is not None:
            current = self.current
            strategy = current.quantifier.consuming_strategy
            if strategy is NOT_FOLLOW:
                if (
                    current.window(WithinType.PREVIOUS_AND_CURRENT) is not None
                    or self.get_window_time() > 0
                ) and last_sink.is_final:
                    not_follow = self._create_state(StateType.PENDING, True)
                    not_condition = self._take_condition(current)
                    stop = self._create_stop_state(not_condition, current.name)
                    not_follow.add_proceed(stop, not_condition)
                    not_follow.add_self_ignore(NotCondition(not_condition))
                    last_sink = not_follow
            elif strategy is NOT_NEXT:
                not_next = self._create_state(StateType.NORMAL, True)
                not_condition = self._take_condition(current)
                stop = self._create_stop_state(not_condition, current.name)
                if last_sink.is_final:
                    not_next.add_ignore(last_sink, NotCondition(not_condition))
                else:
                    not_next.add_proceed(last_sink, NotCondition(not_condition))
                not_next.add_proceed(stop, not_condition)
                last_sink = not_next
            else:
                last_sink = self._convert_pattern(last_sink)

            self.following = current
            self.current = current.previous  # type: ignore[assignment]
            window = self.current.window(WithinType.FIRST_AND_LAST)
            if window is not None and window < (
                self.window_time if self.window_time is not None else float("inf")
            ):
                self.window_time = window
        return last_sink

    def _create_start_state(self, sink: State) -> State:
        start = self._convert_pattern(sink)
        start.make_start()
        return start

    def _convert_pattern(self, sink: State) -> State:
        quantifier = self.current.quantifier
        if quantifier.has(LOOPING):
            self._set_first_of_loop(False)
            sink_without_nots = self._copy_without_transitive_nots(sink)
            looping = self._create_looping(sink_without_nots)
            self._set_first_of_loop(True)
            last_sink = self._create_times_state(looping, sink, self.current.times_range)
        elif quantifier.has(TIMES):
            last_sink = self._create_times_state(sink, sink, self.current.times_range)
        else:
            last_sink = self._create_singleton_state(sink)
        self._add_stop_states(last_sink)
        return last_sink

    def _create_state(self, state_type: StateType, is_take: bool) -> State:
        state = self._create_named_state(self.current.name, state_type)
        if is_take:
            times = self.current.times_range
            if times is None:
                window = self.current.window(WithinType.PREVIOUS_AND_CURRENT)
                if window is not None:
                    self.window_times[state.name] = window
            elif STATE_NAME_DELIMITER in state.name:
                if times.window_ms is not None:
                    self.window_times[state.name] = times.window_ms
        return state

    def _create_named_state(self, name: str, state_type: StateType) -> State:
        state = State(self.names.unique(name), state_type)
        self.states.append(state)
        return state

    def _create_stop_state(self, not_condition: Condition, name: str) -> State:
        stop = self.stop_states.get(name)
        if stop is None:
            stop = self._create_named_state(name, StateType.STOP)
            stop.add_self_take(not_condition)
            self.stop_states[name] = stop
        return stop

    def _copy_without_transitive_nots(self, sink: State) -> State:
        """An optional stage must not inherit the NOT checks of the stages it can skip:
        ``a.not_followed_by(b).followed_by_any(c).optional().followed_by_any(d)`` accepts
        ``a c b d`` but not ``a b d``."""
        not_conditions = self._current_not_conditions()
        if not not_conditions or not self.current.quantifier.has(OPTIONAL):
            return sink
        copy = self._create_named_state(sink.name, sink.type)
        for transition in sink.transitions:
            if transition.action is PROCEED:
                target = transition.target
                remove = False
                if target.is_stop:
                    for _condition, name in not_conditions:
                        if target.name == name:
                            remove = True
                else:
                    target = self._copy_without_transitive_nots(transition.target)
                if not remove:
                    copy.add(transition.action, target, transition.condition)
            else:
                target = copy if transition.target is transition.source else transition.target
                copy.add(transition.action, target, transition.condition)
        return copy

    def _original_state(self, proceed: State) -> State:
        """``proceed`` as it was before a greedy loop added ``not take`` to its edges: the
        target of a greedy optional stage's PROCEED when its ``until`` condition holds.

        Flink looks the copy up by ``proceed``'s name and finds none when a NOT stage applies
        to the optional stage: the loop was built on (and rewrote) a copy of ``proceed``
        without the NOT checks, named ``name:N``. Flink then adds a PROCEED edge to ``null``:
        its NFA throws ``NullPointerException`` on an event meeting ``until`` while a run
        waits at the stage's first state, and its compiler throws if an earlier optional stage
        copies that state. ``proceed`` itself is unmodified in that case, so it is its own
        original: the edge goes where the ``not until`` PROCEED goes, and ``until`` does not
        end a loop that has not started.
        """
        return self.original_state_map.get(proceed.name, proceed)

    def _copy(self, state: State) -> State:
        copy = self._create_named_state(original_name(state.name), state.type)
        for transition in state.transitions:
            target = copy if transition.target is transition.source else transition.target
            copy.add(transition.action, target, transition.condition)
        return copy

    def _add_stop_states(self, state: State) -> None:
        for condition, name in self._current_not_conditions():
            stop = self._create_stop_state(condition, name)
            state.add_proceed(stop, condition)

    def _add_stop_state_to_looping(self, looping: State) -> None:
        following = self.following
        if following is not None and following.quantifier.consuming_strategy is NOT_FOLLOW:
            condition = self._take_condition(following)
            stop = self._create_stop_state(condition, following.name)
            looping.add_proceed(stop, condition)

    def _create_times_state(self, sink: State, proceed: State, times: Times | None) -> State:
        if times is None:
            raise PatternError(
                f"{self.stage_label()}: a looping/times stage has no times range "
                "(build it with one_or_more(), times() or times_or_more())"
            )
        last_sink = sink
        self._set_first_of_loop(False)
        until = self.current.until_condition
        inner_ignore = self._extend_with_until(
            self._inner_ignore_condition(self.current), until, False
        )
        take = self._extend_with_until(self._take_condition(self.current), until, True)
        if self.current.quantifier.has(GREEDY) and times.from_ != times.to:
            if until is not None:
                self.original_state_map[sink.name] = self._copy(sink)
            self._update_with_greedy_condition(sink, take)
        for _ in range(times.from_, times.to):
            last_sink = self._create_singleton(last_sink, proceed, take, inner_ignore, True)
            self._add_stop_state_to_looping(last_sink)
        for _ in range(times.from_ - 1):
            last_sink = self._create_singleton(last_sink, None, take, inner_ignore, False)
            self._add_stop_state_to_looping(last_sink)
        self._set_first_of_loop(True)
        return self._create_singleton(
            last_sink,
            proceed,
            take,
            self._ignore_condition(self.current),
            self.current.quantifier.has(OPTIONAL),
        )

    def _set_first_of_loop(self, first: bool) -> None:
        if isinstance(self.current, GroupPattern):
            self.first_of_loop[id(self.current)] = first

    def _is_current_group_first_of_loop(self) -> bool:
        if self.current_group is None:
            return True
        return self.first_of_loop.get(id(self.current_group), True)

    def _head_of_group(self, pattern: Pattern) -> bool:
        return self.current_group is not None and pattern.previous is None

    def _is_head_of_optional_group(self, pattern: Pattern) -> bool:
        if not self._head_of_group(pattern):
            return False
        assert self.current_group is not None
        return self._is_current_group_first_of_loop() and self.current_group.quantifier.has(
            OPTIONAL
        )

    def _create_singleton_state(self, sink: State) -> State:
        return self._create_singleton(
            sink,
            sink,
            self._take_condition(self.current),
            self._ignore_condition(self.current),
            self.current.quantifier.has(OPTIONAL),
        )

    def _create_singleton(
        self,
        sink: State,
        proceed: State | None,
        take: Condition | None,
        ignore: Condition | None,
        is_optional: bool,
    ) -> State:
        if isinstance(self.current, GroupPattern):
            return self._create_group_pattern_state(self.current, sink, proceed, is_optional)
        singleton = self._create_state(StateType.NORMAL, True)
        sink_without_nots = self._copy_without_transitive_nots(sink)
        singleton.add_take(sink_without_nots, take)
        proceed_condition = self._true_function()
        if is_optional:
            assert proceed is not None
            if self.current.quantifier.has(GREEDY):
                until = self.current.until_condition
                if until is not None:
                    singleton.add_proceed(
                        self._original_state(proceed),
                        AndCondition(proceed_condition, until),
                    )
                singleton.add_proceed(
                    proceed,
                    AndCondition(proceed_condition, NotCondition(until))
                    if until is not None
                    else proceed_condition,
                )
            else:
                singleton.add_proceed(proceed, proceed_condition)
        if ignore is not None:
            if is_optional or self._is_head_of_optional_group(self.current):
                ignore_state = self._create_state(StateType.NORMAL, False)
                ignore_state.add_take(sink_without_nots, take)
                ignore_state.add_self_ignore(ignore)
                self._add_stop_states(ignore_state)
            else:
                ignore_state = singleton
            singleton.add_ignore(ignore_state, ignore)
        return singleton

    def _create_group_pattern_state(
        self, group: GroupPattern, sink: State, proceed: State | None, is_optional: bool
    ) -> State:
        proceed_condition = self._true_function()
        saved = (self.current, self.following, self.current_group)
        self.current_group = group
        self.current = group.raw_pattern
        last_sink = self._create_middle_states(sink)
        last_sink = self._convert_pattern(last_sink)
        if is_optional:
            assert proceed is not None
            last_sink.add_proceed(proceed, proceed_condition)
        self.current, self.following, self.current_group = saved
        return last_sink

    def _create_looping_group_pattern_state(self, group: GroupPattern, sink: State) -> State:
        proceed_condition = self._true_function()
        saved = (self.current, self.following, self.current_group)
        dummy = self._create_state(StateType.NORMAL, True)
        self.current_group = group
        self.current = group.raw_pattern
        last_sink = self._create_middle_states(dummy)
        last_sink = self._convert_pattern(last_sink)
        last_sink.add_proceed(sink, proceed_condition)
        dummy.add_proceed(last_sink, proceed_condition)
        self.current, self.following, self.current_group = saved
        return last_sink

    def _create_looping(self, sink: State) -> State:
        if isinstance(self.current, GroupPattern):
            return self._create_looping_group_pattern_state(self.current, sink)
        until = self.current.until_condition
        ignore = self._extend_with_until(self._inner_ignore_condition(self.current), until, False)
        take = self._extend_with_until(self._take_condition(self.current), until, True)
        proceed_condition = self._true_function()
        looping = self._create_state(StateType.NORMAL, True)
        if self.current.quantifier.has(GREEDY):
            if until is not None:
                sink_copy = self._copy(sink)
                looping.add_proceed(sink_copy, AndCondition(proceed_condition, until))
                self.original_state_map[sink.name] = sink_copy
            looping.add_proceed(
                sink,
                AndCondition(proceed_condition, NotCondition(until))
                if until is not None
                else proceed_condition,
            )
            self._update_with_greedy_condition(sink, self._take_condition(self.current))
        else:
            looping.add_proceed(sink, proceed_condition)
        looping.add_self_take(take)
        self._add_stop_state_to_looping(looping)
        if ignore is not None:
            ignore_state = self._create_state(StateType.NORMAL, False)
            ignore_state.add_take(looping, take)
            ignore_state.add_self_ignore(ignore)
            looping.add_ignore(ignore_state, ignore)
            self._add_stop_state_to_looping(ignore_state)
        return looping

    # -- conditions -------------------------------------------------------------------------------
    @staticmethod
    def _extend_with_until(
        condition: Condition | None, until: Condition | None, is_take: bool
    ) -> Condition | None:
        if until is not None and condition is not None:
            return AndCondition(NotCondition(until), condition)
        if until is not None and is_take:
            return NotCondition(until)
        return condition

    def _strategy_condition(
        self, pattern: Pattern, strategy: ConsumingStrategy
    ) -> Condition | None:
        if strategy is SKIP_TILL_NEXT:
            condition: Condition | None = NotCondition(pattern.condition)
        elif strategy is SKIP_TILL_ANY:
            condition = TRUE
        else:
            condition = None
        group = self.current_group
        if group is not None and group.until_condition is not None:
            condition = self._extend_with_until(condition, group.until_condition, False)
        return condition

    def _inner_ignore_condition(self, pattern: Pattern) -> Condition | None:
        strategy = pattern.quantifier.inner_consuming_strategy
        if self._head_of_group(pattern):
            assert self.current_group is not None
            strategy = self.current_group.quantifier.inner_consuming_strategy
        return self._strategy_condition(pattern, strategy)

    def _ignore_condition(self, pattern: Pattern) -> Condition | None:
        strategy = pattern.quantifier.consuming_strategy
        if self._head_of_group(pattern):
            assert self.current_group is not None
            if self._is_current_group_first_of_loop():
                strategy = self.current_group.quantifier.consuming_strategy
            else:
                strategy = self.current_group.quantifier.inner_consuming_strategy
        return self._strategy_condition(pattern, strategy)

    def _with_group_until(self, condition: Condition) -> Condition:
        """Inside a group with ``until``, every take/proceed also requires ``not until``."""
        group = self.current_group
        if group is not None and group.until_condition is not None:
            return AndCondition(NotCondition(group.until_condition), condition)
        return condition

    def _take_condition(self, pattern: Pattern) -> Condition:
        return self._with_group_until(pattern.condition)

    def _true_function(self) -> Condition:
        return self._with_group_until(TRUE)

    @staticmethod
    def _update_with_greedy_condition(state: State, take: Condition | None) -> None:
        for transition in state.transitions:
            transition.condition = AndCondition(
                transition.condition if transition.condition is not None else TRUE,
                NotCondition(take if take is not None else TRUE),
            )


def compile_pattern(pattern: Pattern, timeout_handling: bool = False) -> NfaPlan:
    """Compile ``pattern`` (its *last* stage) into an :class:`NfaPlan`.

    ``timeout_handling``: report partial matches whose window expired (Flink's
    ``withTimeoutHandling``); otherwise they are dropped silently. Every pattern that cannot be
    compiled raises :class:`PatternError` naming the stage, never another exception.
    """
    if not isinstance(pattern, Pattern):
        raise PatternError(f"compile_pattern expects a Pattern, got {type(pattern).__name__}")
    compiler = _Compiler(pattern)
    try:
        start = compiler.compile()
    except PatternError:
        raise
    except Exception as exc:  # any other failure is a malformed pattern (or a compiler bug)
        raise PatternError(
            f"{compiler.stage_label()}: cannot be compiled ({type(exc).__name__}: {exc}); "
            "build patterns with the Pattern API only (if it was, this is a ctiflow bug)"
        ) from exc
    states = {state.name: state for state in compiler.states}
    conditions = [t.condition for state in compiler.states for t in state.transitions]
    for state in compiler.states:
        for transition in state.transitions:
            try:
                transition.predicate = fast_predicate(transition.condition)
            except Exception as exc:
                raise PatternError(
                    f"stage {state.stage!r}: invalid condition {transition.condition!r} "
                    f"({type(exc).__name__}: {exc}); use where(), or_(), subtype() or until()"
                ) from exc
    return NfaPlan(
        states=states,
        start_state=start.name,
        window_ms=compiler.get_window_time(),
        state_windows_ms=dict(compiler.window_times),
        skip_strategy=pattern.skip_strategy,
        timeout_handling=timeout_handling,
        has_iterative_conditions=any(c is not None and c.iterative for c in conditions),
        stage_names=tuple(_stage_names(pattern)),
        contiguous=all(t.action is not IGNORE
                       for s in states.values() if not s.is_start for t in s.transitions),
    )


def _stage_names(pattern: Pattern) -> list[str]:
    names: list[str] = []
    for stage in pattern.stages():
        if isinstance(stage, GroupPattern):
            names.extend(_stage_names(stage.raw_pattern))
        else:
            names.append(stage.name)
    return names


def proceed_closure(starts) -> list:
    """The states reachable from ``starts`` through PROCEED edges alone, ``starts`` included,
    each once (depth first)."""
    seen: set[str] = set()
    out = []
    stack = list(starts)
    while stack:
        state = stack.pop()
        if state.name in seen:
            continue
        seen.add(state.name)
        out.append(state)
        stack.extend(t.target for t in state.transitions if t.action is PROCEED)
    return out


def can_produce_empty_matches(pattern: Pattern) -> bool:
    """True if the start state reaches the final state by PROCEED edges alone (e.g. ``a*``)."""
    plan = compile_pattern(pattern)
    return any(t.action is PROCEED and t.target.is_final
               for state in proceed_closure([plan.states[plan.start_state]]) for t in state.transitions)
