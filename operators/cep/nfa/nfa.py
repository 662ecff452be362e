"""The NFA runtime: runs an :class:`~ctiflow.operators.cep.nfa.compiler.NfaPlan` over one key's events.

The mutable part is :class:`NfaState` — the *computation states* (one per partial match,
plus the start state), the completed matches a skip strategy holds back, and the
:class:`~ctiflow.operators.cep.nfa.shared_buffer.SharedBuffer`. It is plain data, so it snapshots to bytes
and restores (:meth:`Nfa.snapshot`, :meth:`Nfa.restore`). The plan is compiled once and
shared; :class:`Nfa` binds a plan to a state.

Per event (Flink's ``NFA.process``): every computation state follows the edges whose
conditions hold (PROCEED edges are followed on the same event), forks runs with new Dewey
versions, stores taken events in the shared buffer, and either reaches the final state (a
match), a stop state (a NOT stage matched: the run dies) or waits for the next event. Per
time advance (``NFA.advanceTime``): runs whose window expired are dropped (reported as timed
out if the plan handles timeouts) and runs waiting in a *pending* state (``not_followed_by``
at the end) complete as matches.

Processing order is Flink's: computation states are visited in the array order of a
Java-compatible heap ordered by their first event (:mod:`ctiflow.operators.cep.nfa.heap`), which decides
the order of edges in shared-buffer nodes and, with skip strategies, which match wins.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, NamedTuple

from ctiflow.operators import snapshots
from ctiflow.operators.cep.nfa.compiler import IGNORE, PROCEED, NfaPlan, State
from ctiflow.operators.cep.conditions import ALWAYS
from ctiflow.operators.cep.nfa.heap import BinaryHeap
from ctiflow.operators.cep.nfa.contiguous_buffer import PLAIN_TAG, ContiguousBuffer, revive_path
from ctiflow.operators.cep.nfa.shared_buffer import EventId, NodeId, SharedBuffer

_MAX_KEY = (2**63 - 1, 2**31 - 1)
_SNAPSHOT_VERSION = 1

Match = dict[str, list[Any]]
TimedOut = tuple[Match, int]
MatchIds = dict[str, list[EventId]]
#: A match with the buffer ids of its events (ids give times and a stable identity).
IdentifiedMatch = tuple[Match, MatchIds]
#: A timed-out partial match, its ids and the time its window closed.
IdentifiedTimeout = tuple[Match, MatchIds, int]


class ComputationState(NamedTuple):
    """One run: where it is, the last node it accepted, its version and when it started."""

    state: str
    previous_entry: NodeId | None
    version: tuple[int, ...]
    start_timestamp: int
    previous_timestamp: int
    start_event_id: EventId | None


def _order_key(cs: ComputationState) -> tuple[int, int]:
    """Flink's ``COMPUTATION_STATE_COMPARATOR``: by first event; runs not started yet last."""
    start = cs.start_event_id
    return start if start is not None else _MAX_KEY


def _start_state(name: str, version: tuple[int, ...] = (1,)) -> ComputationState:
    return ComputationState(name, None, version, -1, -1, None)


class NfaState:
    """Per-key mutable state: partial matches, held-back completed matches, and the buffer of
    their events — a :class:`SharedBuffer`, or for a strictly contiguous plan a
    :class:`ContiguousBuffer` (where ``previous_entry`` is a run's path, not a node)."""

    __slots__ = ("partial_matches", "completed_matches", "buffer")

    def __init__(
        self,
        partial_matches: BinaryHeap[ComputationState],
        completed_matches: BinaryHeap[ComputationState],
        buffer: SharedBuffer | ContiguousBuffer,
    ) -> None:
        self.partial_matches = partial_matches
        self.completed_matches = completed_matches
        self.buffer = buffer

    @classmethod
    def initial(cls, plan: NfaPlan) -> "NfaState":
        return cls(
            BinaryHeap(_order_key, [_start_state(plan.start_state)]),
            BinaryHeap(_order_key),
            ContiguousBuffer() if plan.contiguous else SharedBuffer(),
        )

    def is_idle(self) -> bool:
        """Nothing but the start state: equivalent to a fresh state (safe to drop)."""
        partial = self.partial_matches
        return (
            len(partial) == 1
            and partial.peek().start_event_id is None  # type: ignore[union-attr]
            and not self.completed_matches
            and not self.buffer.events
            and not self.buffer.events_count
        )

    def to_plain(self) -> tuple[Any, ...]:
        return (
            [tuple(cs) for cs in self.partial_matches.items()],
            [tuple(cs) for cs in self.completed_matches.items()],
            self.buffer.to_plain(),
        )

    @classmethod
    def from_plain(cls, data: tuple[Any, ...]) -> "NfaState":
        partial, completed, buffer = data
        contiguous = buffer[0] == PLAIN_TAG

        def revive(raw: Any) -> ComputationState:
            state, entry, version, start_ts, prev_ts, start_id = raw
            if entry is not None:
                entry = revive_path(entry) if contiguous else (tuple(entry[0]), entry[1])
            return ComputationState(
                state,
                entry,
                tuple(version),
                start_ts,
                prev_ts,
                tuple(start_id) if start_id is not None else None,
            )

        # Offering in array order rebuilds the identical array (each element is >= its parent).
        return cls(
            BinaryHeap(_order_key, [revive(r) for r in partial]),
            BinaryHeap(_order_key, [revive(r) for r in completed]),
            ContiguousBuffer.from_plain(buffer) if contiguous else SharedBuffer.from_plain(buffer),
        )

    def snapshot(self) -> bytes:
        return pickle.dumps((_SNAPSHOT_VERSION, self.to_plain()), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def restore(cls, data: bytes) -> "NfaState":
        version, plain = snapshots.loads(data)
        if version != _SNAPSHOT_VERSION:
            raise ValueError(f"unsupported NFA state snapshot version {version}")
        return cls.from_plain(plain)


class _Context:
    """What an iterative condition sees: the partial match of one computation state."""

    __slots__ = ("_buffer", "_state", "_timestamp", "_matched")

    def __init__(self, buffer: SharedBuffer | ContiguousBuffer, state: ComputationState,
                 timestamp: int) -> None:
        self._buffer = buffer
        self._state = state
        self._timestamp = timestamp
        self._matched: Match | None = None

    def get_events_for_pattern(self, name: str) -> list[Any]:
        return list(self.events_view(name))

    def events_view(self, name: str | None) -> Sequence[Any]:
        """The events of stage ``name`` (None: every stage's, in order) in this partial match,
        oldest first, read-only: a view without copying where the buffer has one."""
        buffer = self._buffer
        if isinstance(buffer, ContiguousBuffer):
            return buffer.stage_view(self._state.previous_entry, name)
        if self._matched is None:
            self._matched = buffer.materialize(_extract_current_matches(buffer, self._state))
        if name is None:
            return [event for events in self._matched.values() for event in events]
        return self._matched.get(name, ())

    @property
    def timestamp(self) -> int:
        return self._timestamp


def _extract_current_matches(
    buffer: SharedBuffer | ContiguousBuffer, state: ComputationState
) -> dict[str, list[EventId]]:
    if state.previous_entry is None:
        return {}
    paths = buffer.extract_patterns(state.previous_entry, state.version)
    return paths[0] if paths else {}


class _EventHandle:
    """Registers the event in the buffer on its first TAKE only (Flink's ``EventWrapper``)."""

    __slots__ = ("event", "timestamp", "event_id", "_buffer")

    def __init__(self, event: Any, timestamp: int, buffer: SharedBuffer | ContiguousBuffer) -> None:
        self.event = event
        self.timestamp = timestamp
        self.event_id: EventId | None = None
        self._buffer = buffer

    def get_id(self) -> EventId:
        if self.event_id is None:
            self.event_id = self._buffer.register_event(self.event, self.timestamp)
        return self.event_id

    def close(self) -> None:
        if self.event_id is not None:
            self._buffer.release_event(self.event_id)

    def undo(self) -> None:
        """The event was not processed after all: no trace of it stays in the buffer (its id
        is given to the next event of its time)."""
        if self.event_id is not None:
            self._buffer.unregister_event(self.event_id)
            self.event_id = None


def _self_increase(ignore_branches: int, take_branches: int) -> int:
    if take_branches == 0 and ignore_branches == 0:
        return 0
    return ignore_branches + max(1, take_branches)


def _increase(version: tuple[int, ...], times: int) -> tuple[int, ...]:
    """Dewey ``increase``: a sibling version (plain tuples on the hot path)."""
    return version[:-1] + (version[-1] + times,)


class Nfa:
    """Runs a plan on one :class:`NfaState` (``state`` may be swapped between keys)."""

    __slots__ = ("plan", "state", "_states", "_window", "_state_windows", "_skip",
                 "_timeouts", "_iterative")

    def __init__(self, plan: NfaPlan, state: NfaState | None = None) -> None:
        self.plan = plan
        self.state = state if state is not None else NfaState.initial(plan)
        self._states: dict[str, State] = plan.states
        self._window = plan.window_ms
        self._state_windows = plan.state_windows_ms
        self._skip = plan.skip_strategy
        self._timeouts = plan.timeout_handling
        self._iterative = plan.has_iterative_conditions

    # -- snapshot ---------------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        return self.state.snapshot()

    @classmethod
    def restore(cls, plan: NfaPlan, data: bytes) -> "Nfa":
        return cls(plan, NfaState.restore(data))

    # -- time -------------------------------------------------------------------------------------
    def advance_time(self, timestamp: int) -> tuple[list[Match], list[TimedOut]]:
        """No event before ``timestamp`` will come: expire windows, complete pending runs.

        Returns the matches completed by pending ``not_followed_by`` runs and, if the plan
        handles timeouts, the timed-out partial matches with the time their window closed.
        """
        matches, timed_out = self.advance_time_with_ids(timestamp)
        return [m for m, _ in matches], [(m, at) for m, _, at in timed_out]

    def process(self, event: Any, timestamp: int) -> list[Match]:
        """Feed one event (application time ``timestamp``); return the completed matches."""
        return [m for m, _ in self.process_with_ids(event, timestamp)]

    def advance_time_with_ids(
        self, timestamp: int
    ) -> tuple[list[IdentifiedMatch], list[IdentifiedTimeout]]:
        """:meth:`advance_time`, with the buffer ids of every matched event."""
        nfa_state = self.state
        buffer = nfa_state.buffer
        matches: list[IdentifiedMatch] = []
        timed_out: list[IdentifiedTimeout] = []
        expired: list[ComputationState] = []
        if self._window > 0 or self._state_windows:
            partial = nfa_state.partial_matches
            states = self._states
            window = self._window
            state_windows = self._state_windows
            for cs in partial.view():
                if states[cs.state].is_start:
                    continue
                state_window = state_windows.get(cs.state)
                if (state_window is not None and state_window > 0
                        and timestamp - cs.previous_timestamp >= state_window) or (
                        window > 0 and timestamp - cs.start_timestamp >= window):
                    expired.append(cs)
            if expired:
                matches, timed_out = self._expire(timestamp, expired)
        if not expired and nfa_state.completed_matches:
            empty: BinaryHeap[ComputationState] = BinaryHeap(_order_key)
            self._emit_matches(empty, nfa_state.partial_matches, matches)
        buffer.advance_time(timestamp)
        return matches, timed_out

    def release_held(self) -> list[IdentifiedMatch]:
        """The completed matches a skip strategy holds back while earlier runs are open,
        released as if no run were open (the caller discards the open runs: a rule version
        cut), in Flink's order, each emitted match pruning what it skips."""
        matches: list[IdentifiedMatch] = []
        if self.state.completed_matches:
            self._emit_matches(BinaryHeap(_order_key), BinaryHeap(_order_key), matches)
        return matches

    def _expire(
        self, timestamp: int, expired: list[ComputationState]
    ) -> tuple[list[IdentifiedMatch], list[IdentifiedTimeout]]:
        nfa_state = self.state
        buffer = nfa_state.buffer
        states = self._states
        window = self._window
        state_windows = self._state_windows
        expired_set = set(expired)
        new_partial: BinaryHeap[ComputationState] = BinaryHeap(_order_key)
        potential: BinaryHeap[ComputationState] = BinaryHeap(_order_key)
        timed_out: list[IdentifiedTimeout] = []
        for cs in nfa_state.partial_matches.view():
            if cs not in expired_set:
                new_partial.offer(cs)
                continue
            if states[cs.state].is_pending:
                potential.offer(cs)
                continue
            if self._timeouts:
                ids = _extract_current_matches(buffer, cs)
                pattern = buffer.materialize(ids)
                state_window = state_windows.get(cs.state)
                if (state_window is not None and state_window > 0
                        and timestamp - cs.previous_timestamp >= state_window):
                    at = cs.previous_timestamp + state_window
                else:
                    at = cs.start_timestamp + window
                timed_out.append((pattern, ids, at))
            buffer.release_node(cs.previous_entry, cs.version)
        matches: list[IdentifiedMatch] = []
        self._emit_matches(potential, new_partial, matches)
        nfa_state.partial_matches = new_partial
        return matches, timed_out

    # -- events -----------------------------------------------------------------------------------
    def process_with_ids(self, event: Any, timestamp: int) -> list[IdentifiedMatch]:
        """:meth:`process`, with the buffer ids of every matched event.

        All or nothing: when a condition raises on this event, every run it had started or moved
        is released again and the exception propagates with the state as it was before the event
        (the runs' own releases wait until every run has been computed)."""
        nfa_state = self.state
        buffer = nfa_state.buffer
        handle = _EventHandle(event, timestamp, buffer)
        try:
            new_partial: BinaryHeap[ComputationState] = BinaryHeap(_order_key)
            potential: BinaryHeap[ComputationState] = BinaryHeap(_order_key)
            states = self._states
            runs = nfa_state.partial_matches.view()
            produced: list[list[ComputationState]] = []  # per run, what it became (locks held)
            try:
                for cs in runs:
                    produced.append([])
                    self._compute_next_states(cs, handle, produced[-1])
            except BaseException:
                for next_states in produced:
                    for ns in next_states:
                        buffer.release_node(ns.previous_entry, ns.version)
                handle.undo()
                raise
            for next_states in produced:
                retain = []
                discard = False
                for ns in next_states:
                    target = states[ns.state]
                    if target.is_final:
                        potential.offer(ns)
                    elif target.is_stop:
                        discard = True
                        buffer.release_node(ns.previous_entry, ns.version)
                    else:
                        retain.append(ns)
                for ns in retain:
                    if discard:
                        buffer.release_node(ns.previous_entry, ns.version)
                    else:
                        new_partial.offer(ns)
            for cs in runs:
                if cs.previous_entry is not None:
                    buffer.release_node(cs.previous_entry, cs.version)
            matches: list[IdentifiedMatch] = []
            self._emit_matches(potential, new_partial, matches)
            nfa_state.partial_matches = new_partial
            return matches
        finally:
            handle.close()

    def _emit_matches(
        self,
        potential: BinaryHeap[ComputationState],
        partial: BinaryHeap[ComputationState],
        result: list[IdentifiedMatch],
    ) -> None:
        """Flink's ``processMatchesAccordingToSkipStrategy``: emit completed matches in order
        of their first event; with a skip strategy, hold a match back while an earlier partial
        match is still running (it might win), and prune what the emitted match skips."""
        completed = self.state.completed_matches
        buffer = self.state.buffer
        skip = self._skip
        skipping = skip.is_skip_strategy
        completed.add_all(potential)
        while True:
            earliest = completed.peek()
            if earliest is None:
                break
            if skipping:
                earliest_partial = partial.peek()
                if earliest_partial is not None and _order_key(earliest) > _order_key(
                    earliest_partial
                ):
                    break
            completed.poll()
            matched = buffer.extract_patterns(earliest.previous_entry, earliest.version)
            if skipping:
                skip.prune(partial, matched, buffer)
                skip.prune(completed, matched, buffer)
            result.append((buffer.materialize(matched[0]), matched[0]))
            buffer.release_node(earliest.previous_entry, earliest.version)

    def _compute_next_states(
        self, cs: ComputationState, handle: _EventHandle, result: list[ComputationState]
    ) -> None:
        """Flink's ``computeNextStates``: the runs ``cs`` becomes on this event, appended to
        ``result`` as each takes its locks (the caller releases ``cs`` itself). One long function
        on purpose: it follows Flink's branch for branch, so the two can be read side by side."""
        buffer = self.state.buffer
        states = self._states
        state = states[cs.state]
        event = handle.event
        ctx = _Context(buffer, cs, handle.timestamp) if self._iterative else None
        contiguous = isinstance(buffer, ContiguousBuffer)

        # Decision graph: follow PROCEED edges on this event, collect TAKE / IGNORE edges.
        edges = []
        ignore_branches = 0
        take_branches = 0
        stack = [state]
        while stack:
            current = stack.pop()
            for transition in current.transitions:
                predicate = transition.predicate
                if predicate is ALWAYS or (
                    predicate(event) if predicate is not None
                    else transition.condition.test(event, ctx)
                ):
                    action = transition.action
                    if action is PROCEED:
                        stack.append(transition.target)
                    else:
                        if not (action is IGNORE and transition.target.name == state.name):
                            if action is IGNORE:
                                ignore_branches += 1
                            else:
                                take_branches += 1
                        edges.append(transition)

        take_to_visit = max(0, take_branches - 1)
        ignore_to_visit = ignore_branches
        total_take_to_skip = take_to_visit
        version = cs.version
        is_start = state.is_start
        for edge in edges:
            if edge.action is IGNORE:
                if is_start:
                    continue
                if edge.target.name == state.name:
                    new_version = _increase(
                        version, _self_increase(ignore_branches, take_branches)
                    )
                else:
                    new_version = _increase(version, total_take_to_skip + ignore_to_visit) + (0,)
                    ignore_to_visit -= 1
                new = ComputationState(
                    edge.target.name, cs.previous_entry, new_version,
                    cs.start_timestamp, cs.previous_timestamp, cs.start_event_id,
                )
                result.append(new)
                buffer.lock_node(cs.previous_entry, new_version)
            else:  # TAKE
                next_state = edge.target
                current_version = _increase(version, take_to_visit)
                # A run's version grows a digit per event taken (Flink's Dewey numbers label the
                # shared buffer's edges); a contiguous buffer's path is the run, so it need not.
                next_version = current_version if contiguous else current_version + (0,)
                take_to_visit -= 1
                event_id = handle.get_id()
                new_entry = buffer.put(edge.source.stage, event_id, cs.previous_entry,
                                       current_version)
                if is_start:
                    start_ts, start_id = handle.timestamp, event_id
                else:
                    start_ts, start_id = cs.start_timestamp, cs.start_event_id
                new = ComputationState(next_state.name, new_entry, next_version, start_ts,
                                       handle.timestamp, start_id)
                result.append(new)
                buffer.lock_node(new_entry, next_version)
                final_state = self._final_state_after_proceed(next_state, event, ctx)
                if final_state is not None:
                    result.append(ComputationState(final_state.name, new_entry, next_version,
                                                   start_ts, handle.timestamp, start_id))
                    buffer.lock_node(new_entry, next_version)

        if is_start:
            start_version = _increase(version, _self_increase(ignore_branches, take_branches))
            result.append(_start_state(cs.state, start_version))

    @staticmethod
    def _final_state_after_proceed(state: State, event: Any, ctx: Any) -> State | None:
        stack = [state]
        while stack:
            current = stack.pop()
            for transition in current.transitions:
                if transition.action is PROCEED:
                    predicate = transition.predicate
                    if predicate is ALWAYS or (
                        predicate(event) if predicate is not None
                        else transition.condition.test(event, ctx)
                    ):
                        if transition.target.is_final:
                            return transition.target
                        stack.append(transition.target)
        return None
