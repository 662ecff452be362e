"""The match operator: a CEP pattern over the events of many keys (the Operator contract).

One :class:`~ctiflow.operators.cep.nfa.compiler.NfaPlan` is compiled from the settings and shared; each key
with something in flight has its own :class:`~ctiflow.operators.cep.nfa.nfa.NfaState`. As Flink's CEP
operator does, every event first advances its key's time to the event's start (expiring
windows, completing pending ``not_followed_by`` runs) and is then processed; ``advance_to(cti)``
advances every key with state. Keys whose state is back to the initial one are dropped, so
state size follows the partial matches in flight, not the number of keys ever seen.

Records (see ``schemas/match.avsc`` and ``schemas/timed_out_match.avsc``)::

    {"pattern": "...", "key": "...", "match_id": "...", "first_time": t0, "last_time": t1,
     "stages": [{"stage": "a", "events": ["{...json of the fields...}", ...]}, ...]}

(with ``structured_events``, as in jobs, each event is its fields' mapping instead of JSON text:
the job derives the record schema from its input's, :func:`ctiflow.jobs.driver.recognize.derived_schemas`)

plus ``"timed_out_at"`` for a timed-out partial match. ``match_id`` is
``key:first.n-last.n:digest`` built from the buffer ids ``(time, n-th event at that time)`` of
all matched events, so it is a function of the input alone (two matches with the same first and
last event but different middle events get different digests).

``advance_to(CTI_INFINITY)`` flushes: every window expires (timed-out records, pending
``not_followed_by`` matches), then all state is dropped; partial matches without a window can
never complete or time out and are dropped silently.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle

import numpy as np
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctiflow.operators import snapshots
from ctiflow.operators.cep.nfa.compiler import (IGNORE, PROCEED, NfaPlan, can_produce_empty_matches,
                                                compile_pattern, proceed_closure)
from ctiflow.operators.cep.declarative import pattern_from_dict, pattern_name
from ctiflow.operators.cep.nfa.heap import BinaryHeap
from ctiflow.operators.cep.nfa.nfa import (IdentifiedMatch, IdentifiedTimeout, MatchIds, Nfa, NfaState,
                                           _order_key)
from ctiflow.operators.packed import PackedStates
from ctiflow.operators.cep.pattern import Pattern
from ctiflow.operators.errors import EventRejected, PatternError
from ctiflow.operators.operator import Operator, Output, Traits, process_rows
from ctiflow.operators.events import record_maker
from ctiflow.operators.time import CTI_INFINITY, CTI_NONE, Event

#: The snapshot's format (earlier ones are rewritten in it by ``ctiflow.jobs.state.compat``):
#: the keys in columns (:class:`~ctiflow.operators.packed.PackedStates`, since 6 the keys
#: themselves a sorted string column), and the caps their due CTIs were computed under
#: (:meth:`MatchOperator._state_due`)
SNAPSHOT_FORMAT = 6
_PART = "\x00"  # between the key and the JSON of the further PARTITION BY values (which never hold it)


def _read(data: bytes) -> tuple:
    """``(format, fingerprint, packed keys, MATCH_NUMBER counts, caps)`` of a snapshot in the
    current format."""
    got = snapshots.loads(data)
    snapshots.check_format("match operator", got[0], SNAPSHOT_FORMAT)
    return got


def _job_key(key: str) -> str:
    """The event key of a partition key (:meth:`MatchOperator._key`)."""
    return key.rpartition(_PART)[0]


@dataclass(frozen=True)
class MatchSettings:
    """What the match operator needs.

    ``pattern``: a :class:`Pattern` (its last stage) or a declarative dict
    (:mod:`ctiflow.operators.cep.declarative`). ``name``: the pattern name in the records (default: the
    dict's ``name``, else ``"pattern"``). ``key_field``: key by this field of the event instead
    of ``Event.key`` (``None``). ``emit_timed_out``: report partial matches whose window
    expired (role ``timed_out``).
    """

    pattern: Pattern | Mapping[str, Any] | None
    name: str | None = None
    key_field: str | None = None
    emit_timed_out: bool = True
    #: At most this many runs in flight per key (the waiting start included); an event arriving
    #: while its key holds more is refused (:class:`PartialMatchLimit`: a dead letter) instead of
    #: growing the state further. ``None``: no bound (Flink's behaviour).
    max_partial_matches: int | None = None
    #: At most this many events kept per key for its runs (the shared buffer, what the key's state
    #: bytes grow with); an event arriving while its key keeps more is refused likewise.
    max_buffered_events: int | None = None
    #: ``MATCH_RECOGNIZE`` instead of ``pattern`` (:mod:`ctiflow.operators.cep.sql.translate`): its PATTERN
    #: and DEFINE make the pattern, its MEASURES the records; ``columns``: the input's columns as
    #: ``(name, type family)`` pairs (``number``, ``string``, ``boolean``; None: unknown).
    sql: str | None = None
    columns: tuple[tuple[str, str | None], ...] | None = None
    #: the records' events as their field mappings (a job's derived schema types them: the input's
    #: record) instead of JSON text (``schemas/match.avsc``)
    structured_events: bool = False
    #: PARTITION BY columns besides the event's key (a ``sql`` job): runs are kept per key and
    #: these columns' values, addressed (chunks, TTL) by the key alone
    partition_columns: tuple[str, ...] = ()

    def recognizer(self):
        """The compiled ``sql`` (None without one), once per settings object."""
        if self.sql is None:
            return None
        from ctiflow.operators.cep.sql.translate import compile_query

        cached = _RECOGNIZERS.get(id(self))
        if cached is None or cached[0] is not self:
            columns = None if self.columns is None else dict(self.columns)
            cached = _RECOGNIZERS[id(self)] = (self, compile_query(self.sql, columns))
        return cached[1]

    def pattern_object(self) -> Pattern:
        """The pattern, fully validated: built (declarative form) and compiled once, so every
        error Flink would raise at build or compile time surfaces here, before a job starts."""
        if self.sql is not None:
            return self.recognizer().pattern
        if isinstance(self.pattern, Pattern):
            pattern = self.pattern
        elif isinstance(self.pattern, Mapping):
            pattern = pattern_from_dict(self.pattern)
        else:
            raise PatternError(
                "MatchSettings.pattern must be a Pattern or a mapping, got "
                f"{type(self.pattern).__name__}"
            )
        compile_pattern(pattern)
        if can_produce_empty_matches(pattern):
            raise PatternError(
                "the pattern can match without any event (every stage is optional); make at "
                "least one stage mandatory"
            )
        return pattern

    def pattern_label(self) -> str:
        if self.name is not None:
            return self.name
        if isinstance(self.pattern, Mapping):
            return pattern_name(self.pattern)
        return "pattern"


def fields_json(fields: Any) -> str:
    """One matched event as the JSON string the result records carry (non-JSON values such
    as datetimes or bytes become strings)."""
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False, default=str)


_COMPILED: dict[int, tuple[MatchSettings, NfaPlan, str, Any]] = {}
_RECOGNIZERS: dict[int, tuple[MatchSettings, Any]] = {}


def longest_run_ms(settings: MatchSettings) -> int | None:
    """How long after its first event a run of ``settings`` can still match or time out: its
    ``within`` (None: no ``within``, runs are unbounded in time)."""
    window = _compiled(settings)[0].window_ms
    return window if window > 0 else None


def _compiled(settings: MatchSettings) -> tuple[NfaPlan, str, Any, Any]:
    """The NFA plan, label, start filter (:func:`start_filter`) and inert filter
    (:func:`inert_filter`) of ``settings``, compiled
    once per settings object: the runtime builds an operator per state chunk it loads, and
    compiling costs ≈ 0.1 ms. The plan is immutable (per-key state lives in
    :class:`NfaState`); a few dozen entries at most."""
    hit = _COMPILED.get(id(settings))
    if hit is not None and hit[0] is settings:
        return hit[1:]
    plan = compile_pattern(settings.pattern_object(), timeout_handling=settings.emit_timed_out)
    if len(_COMPILED) >= 4096:  # (rules: a plan per rule version)
        _COMPILED.clear()
    skip, inert = (start_filter(plan), inert_filter(plan)) if settings.key_field is None else (None, None)
    hit = _COMPILED[id(settings)] = (settings, plan, settings.pattern_label(), skip, inert)
    return hit[1:]


def start_filter(plan: NfaPlan):
    """``idle(columns, n) → bool array``: the events on which a key with nothing in flight
    stays as it is — every TAKE and IGNORE edge of the start state(s) and of every state
    reachable from them through PROCEED edges (whatever their conditions) is surely false,
    so the NFA would take nothing, fork nothing and change no version, and the key would be
    dropped as idle at the next CTI. None (or None from the call) when some TAKE or IGNORE
    edge is always true or has no column form that can tell it false
    (:func:`ctiflow.operators.cep.conditions.surely`: exact, or the leading side of an ``and``).
    The edges' forms make one column-form tree, ``NOT e1 AND NOT e2 …``, evaluated as one."""
    from ctiflow.operators.cep.expr.column_form import AllOf, evaluator

    nodes = _start_nodes(plan)
    return evaluator(AllOf(tuple(nodes))) if nodes else None


def inert_filter(plan: NfaPlan):
    """``inert(columns, n) → bool array``: the events that leave a key's runs as they are,
    whatever states its runs are in — :func:`start_filter` 's idle events on which, besides,
    every state a run can wait in (not a start, final or stop state) keeps its run unchanged: its
    own IGNORE edge (a relaxed contiguity's wait) is true, and every TAKE edge and every IGNORE
    edge to another state, of it and of the states its PROCEED edges reach, is false. On such an
    event the NFA returns each run with its version, its buffer entry and its times (no TAKE
    branch and no other IGNORE branch: ``_self_increase(0, 0)`` is 0), so only time passing can
    change the key — nothing does while its due CTI is after the event
    (:meth:`MatchOperator.rows_to_take`). None when :func:`start_filter` is, or some waiting
    state has strict contiguity (no IGNORE edge of its own: its run ends on any other event),
    more than one edge back to itself, or an edge whose truth no column form can tell
    (:func:`ctiflow.operators.cep.conditions.surely`)."""
    from ctiflow.operators.cep.expr.column_form import AllOf, evaluator
    from ctiflow.operators.cep.conditions import TRUE, surely

    nodes = _start_nodes(plan)
    if not nodes:
        return None
    for state in plan.states.values():
        if state.is_start or state.is_final or state.is_stop:
            continue
        own = [t for t in state.transitions if t.action is IGNORE and t.target.name == state.name]
        if len(own) != 1:
            return None
        for reached in proceed_closure([state]):
            for t in reached.transitions:
                if t.action is PROCEED:
                    continue
                always = t.condition is None or t.condition is TRUE
                if t is own[0]:  # must hold: the run waits
                    if not always:
                        node = surely(t.condition, True)
                        if node is None:
                            return None
                        nodes.append(node)
                    continue
                node = None if always or t.target.name == state.name else surely(t.condition, False)
                if node is None:
                    return None  # (an edge back to the state from a PROCEED target: not worth the case)
                nodes.append(node)
    return evaluator(AllOf(tuple(nodes)))


def _start_nodes(plan: NfaPlan) -> list | None:
    """``e`` surely false, for every TAKE and IGNORE edge ``e`` of the start state(s) and the states
    their PROCEED edges reach (:func:`start_filter`); None when one has no such form."""
    from ctiflow.operators.cep.conditions import TRUE, surely

    nodes = []
    for state in proceed_closure(s for s in plan.states.values() if s.is_start):
        for t in state.transitions:
            if t.action is PROCEED:  # follows on to the target's edges, changes nothing itself
                continue
            if t.condition is None or t.condition is TRUE:
                return None
            node = surely(t.condition, False)
            if node is None:
                return None
            nodes.append(node)
    return nodes


def start_keys(plan: NfaPlan) -> tuple[tuple[str, frozenset], ...]:
    """``((field, values), …)``: the pattern's start can move on an event only if its ``field``
    equals one of ``values`` — every TAKE and IGNORE edge of the start (as :func:`start_filter`
    reads them) has a conjunct ``field == value`` over the same field (both languages' equality:
    a missing field or NULL equals no value); each such field. Empty when there is none. Lets many
    patterns share one index of a column instead of each testing every row
    (:class:`ctiflow.operators.cep.rules.RuledMatchOperator`)."""
    from ctiflow.operators.cep.expr.column_form import AllOf, Compare, Const, Field
    from ctiflow.operators.cep.conditions import TRUE, condition_node

    cached = _START_KEYS.get(id(plan))
    if cached is not None and cached[0] is plan:
        return cached[1]
    found: dict[str, set] = {}
    edges = 0
    for state in proceed_closure(s for s in plan.states.values() if s.is_start):
        for t in state.transitions:
            if t.action is PROCEED:
                continue
            edges += 1
            node = None if t.condition is None or t.condition is TRUE else condition_node(t.condition)
            parts = node.parts if isinstance(node, AllOf) else (node,)
            for part in parts:
                if isinstance(part, Compare) and part.op == "==":
                    field, const = ((part.left, part.right) if isinstance(part.left, Field)
                                    else (part.right, part.left))
                    if isinstance(field, Field) and isinstance(const, Const) and const.value is not None:
                        found.setdefault(field.name, set()).add((edges, const.value))
    # each field every edge constrains: its values
    result = []
    for name, pairs in found.items():
        if edges and {e for e, _ in pairs} == set(range(1, edges + 1)):
            try:
                result.append((name, frozenset(v for _, v in pairs)))
            except TypeError:  # an unhashable constant
                continue
    _START_KEYS[id(plan)] = (plan, tuple(result))
    return tuple(result)


_START_KEYS: dict[int, tuple] = {}


class PartialMatchLimit(EventRejected):
    """An event refused because its key already holds ``max_partial_matches`` runs."""


class MatchOperator(Operator):
    """Flink-CEP matching per key; see the module docstring for records and flushing."""

    def __init__(self, settings: MatchSettings) -> None:
        if not isinstance(settings, MatchSettings):
            raise PatternError(f"MatchOperator needs MatchSettings, got {type(settings).__name__}")
        super().__init__(settings)
        self.plan, self.name, self._start_filter, self._inert_filter = _compiled(settings)
        self._has_windows = self.plan.has_windows
        self._states: dict[str, NfaState] = {}
        self._sql = settings.recognizer()
        #: MATCH_NUMBER() of the partition's last match, kept (and snapshotted) when a measure reads it
        self._numbers: dict[str, int] = {}
        self._numbered = self._sql is not None and self._sql.numbered
        #: MATCH_RECOGNIZE ``ORDER BY t, c…``: the sort key of a record among rows of equal time
        self._ties = self._sql.tie_key() if self._sql is not None and settings.sql is not None else None
        self._composite = bool(settings.partition_columns)
        #: keys restored but not touched since (due CTI, pickled plain state, runs in flight), decoded
        #: on first use (a batch decodes the keys it has events for or that are due, not the others)
        self._raw = PackedStates()
        #: :meth:`close`: no run starts any more, only the runs in flight go on
        self.closed = False
        #: caps shared with other operators, for the next event (:meth:`process_event`)
        self._shared: tuple | None = None
        #: keys decoded, forgotten or numbered since :meth:`changed_keys` last said (the keys
        #: in :attr:`_states` are changed too)
        self._changed: set[str] = set()

    @functools.cached_property
    def _nfa(self) -> Nfa:
        """The NFA over :attr:`plan`, built when first used (a restored chunk whose keys all stay
        packed never is)."""
        return Nfa(self.plan)

    # -- the Operator contract -------------------------------------------------------------------
    def _process_event(self, event: Event) -> list[Output]:
        """One event into its key's NFA: the matches and timeouts it (and time passing up to
        it) completes; raises :class:`EventRejected` with the key's runs as before it."""
        key = self._key(event)
        state = self._states.get(key)
        if state is None and key in self._raw:
            state = self._decode(key)
        fresh = state is None
        if fresh:
            if self.closed:  # no run of this key in flight, and none may start
                return []
            state = NfaState.initial(self.plan)
            self._states[key] = state
        try:
            return self._step(key, state, event)
        finally:
            if (fresh and state.is_idle()) or (self.closed and _drained(state)):
                del self._states[key]  # nothing started (or left): the key stays as if never seen

    def _step(self, key: str, state: NfaState, event: Event) -> list[Output]:
        """:meth:`_process_event` for the key's state."""
        shared = self._shared
        if shared is None:
            limit, kept, runs_elsewhere, kept_elsewhere, where = (self.settings.max_partial_matches,
                                                                  self.settings.max_buffered_events, 0, 0, "")
        else:
            limit, kept, (runs_elsewhere, kept_elsewhere) = shared
            where = " over all its rules"
        runs = len(state.partial_matches) + runs_elsewhere
        if limit is not None and runs > limit:
            # Counted before this event's time prunes expired runs: the CTI prunes them every
            # micro-batch, so the count is at most one batch stale. Checked before any output is
            # built: refusing loses nothing of what the key emitted.
            raise PartialMatchLimit(
                f"key {key!r} holds {runs} partial matches{where}, more than "
                f"max_partial_matches {limit}: event refused (bound the pattern with within, "
                "or raise the limit)")
        events = len(state.buffer.events) + kept_elsewhere
        if kept is not None and events > kept:
            raise PartialMatchLimit(
                f"key {key!r} keeps {events} events for its partial matches{where}, more than "
                f"max_buffered_events {kept}: event refused (bound the pattern with within, or "
                "raise the limit)")
        nfa = self._nfa
        nfa.state = state
        timestamp = event.start
        outputs: list[Output] = []
        if self._has_windows or state.completed_matches:
            matches, timed_out = nfa.advance_time_with_ids(timestamp)
            self._emit(key, matches, timed_out, outputs, timestamp)
        else:
            state.buffer.advance_time(timestamp)
        try:
            matches = nfa.process_with_ids(event.fields, timestamp)
        except EventRejected as exc:  # a condition failed on the event: the runs are as before it
            exc.outputs = outputs  # what time passing emitted before it is not lost
            raise
        if matches:
            self._emit(key, matches, (), outputs, timestamp)
        return outputs

    def process_columns(self, cols) -> list[tuple[int, Any]]:
        """The rows of an :class:`ctiflow.operators.columns.EventColumns`, one event at a time in row
        order → ``(row, outputs)`` for rows that produced records, ``(row, EventRejected)``
        for refused rows. Only the rows :meth:`rows_to_take` names become :class:`Event` s."""
        rows = self.rows_to_take(cols)
        if not len(rows):
            return []
        events = cols.events() if len(rows) == len(cols) else cols.take(np.asarray(rows, np.int64)).events()
        return process_rows(self._process_event, rows, events)

    def rows_to_take(self, cols, inert: bool = True) -> "list[int] | range":
        """The rows of ``cols`` that could change a key, ascending. A row is left out when it
        leaves its key as it is and no earlier row of the key in the call was taken (a taken
        row decodes the key): the key has nothing in flight and the pattern's start cannot move
        on the row (:func:`start_filter`, on whole columns); or, with ``inert``, the key's state is
        still packed (not decoded since the last snapshot or restore), the row's time is before
        its due CTI (no window of it closes, no match is held back, no cap is reached:
        :meth:`_state_due`) and none of its runs can move on the row (:func:`inert_filter`; the
        start's filter for a key with no run in flight). Once :meth:`close` d, only the rows of
        keys with runs in flight. ``inert`` False: every row of a key with state is taken (the
        caps counted over several operators, :class:`ctiflow.operators.cep.rules.RuledMatchOperator`)."""
        n = len(cols)
        if self.closed:
            codes, index = cols.key_codes()
            live = [index[k] for k in self.keys_held() & index.keys()]
            return np.flatnonzero(np.isin(codes, live)).tolist()
        raw, found = self._raw, None
        if len(raw) and not self._composite:  # per key: its packed row or −1 (a row taken then finds it so)
            codes, index = cols.key_codes()
            found = raw.find(list(index))
        idle = self._start_filter(cols.fields, n) if self._start_filter is not None and cols.dicts is None \
            and not self._composite else None
        if idle is None or not idle.any():
            return range(n)
        codes, index = cols.key_codes()
        first = np.full(len(index), n, np.int64)  # per key: its first row taken
        at = np.zeros(0, np.int64) if found is None else np.flatnonzero(found >= 0)
        stays = idle  # per row: leaves its key as it is
        if len(at) and inert:
            rows = found[at]
            due = np.full(len(index), CTI_NONE, np.int64)
            due[at] = raw.dues[rows]
            busy = np.ones(len(index), np.bool_)  # runs in flight (or not counted)
            busy[at] = raw.runs[rows] != 0
            waits = self._inert_filter(cols.fields, n) if self._inert_filter is not None else None
            can = ~busy[codes] if waits is None else ~busy[codes] | waits  # no run moves
            quiet = due[codes] > cols.start  # nothing of the key falls due by the row's time
            is_packed = np.zeros(len(index), np.bool_)
            is_packed[at] = True
            stays = idle & (~is_packed[codes] | (quiet & can))
        else:
            first[at] = -1
        moving = np.flatnonzero(~stays)
        np.minimum.at(first, codes[moving], moving)
        for key in self._states.keys() & index.keys():
            first[index[key]] = -1
        return np.flatnonzero(np.arange(n) >= first[codes]).tolist()

    def process_event(self, event: Event, shared: tuple | None = None) -> list[Output]:
        """One event (a row :meth:`rows_to_take` named) → its records; raises :class:`EventRejected`.
        ``shared``: caps this operator shares with others for the event's key —
        ``(max_partial_matches, max_buffered_events, (runs, events kept) of the others)``:
        the key's runs and kept events here *plus* the others' are held to the caps (instead
        of this operator's own settings)."""
        self._shared = shared
        try:
            return self._process_event(event)
        finally:
            self._shared = None

    # -- one key ---------------------------------------------------------------------------------
    def keys_held(self) -> set[str]:
        """The keys with state here (decoded or not)."""
        return self._states.keys() | self._raw.keys()

    def load_of(self, key: str) -> tuple[int, int]:
        """``(partial matches, events kept)`` of ``key`` now (``(0, 0)`` without state); decodes it."""
        state = self._states.get(key)
        if state is None:
            if key not in self._raw:
                return 0, 0
            state = self._decode(key)
        return len(state.partial_matches), len(state.buffer.events)

    def release_order(self, cols) -> np.ndarray | None:
        """A ``MATCH_RECOGNIZE ... ORDER BY t, c…`` takes the released rows with the rows of each
        time sorted by ``c…`` (None: that is the release order). A release holds every event of
        each time it covers (those of a later arrival are late), so sorting within it is the
        query's order."""
        ties = self._ties
        starts = cols.start
        if ties is None or len(starts) < 2 or not (starts[1:] == starts[:-1]).any():
            return None
        if cols.dicts is None:
            names = tuple(c for c, _, _ in self._sql.query.order_by[1:])
            fields = list(map(record_maker(names), *(cols.fields[c].tolist() for c in names)))
        else:
            fields = cols.dicts
        at = starts.tolist()
        return np.asarray(sorted(range(len(fields)), key=lambda j: (at[j], ties(fields[j]), j)), np.int64)

    def advance_to(self, cti: int) -> list[Output]:
        outputs: list[Output] = []
        nfa = self._nfa
        flush = cti >= CTI_INFINITY
        for key in self._raw.due_keys(cti):
            self._decode(key)
        for key in sorted(self._states):
            state = self._states[key]
            nfa.state = state
            matches, timed_out = nfa.advance_time_with_ids(cti)
            self._emit(key, matches, timed_out, outputs, cti)
            if flush or state.is_idle() or (self.closed and _drained(state)):
                del self._states[key]
        return outputs

    def cut(self, time: int) -> list[Output]:
        """The end of this operator at ``time`` (a rule version cut): :meth:`advance_to` ``time``,
        then every run still open is discarded and the matches held back for it (a skip strategy
        holds a completed match while an earlier run might still win) are released, as they
        would be had those runs ended. Nothing is left to snapshot afterwards."""
        outputs = self.advance_to(time)
        self._decode_all()
        nfa = self._nfa
        for key in sorted(self._states):
            nfa.state = self._states[key]
            self._emit(key, nfa.release_held(), (), outputs, time)
        self._states = {}
        return outputs

    def close(self) -> None:
        """From now on no run starts (each key's waiting start is withdrawn, Flink's start
        computation state): the runs in flight go on to their end, keys whose runs are all over
        are dropped, and a key with nothing in flight is never taken up again. Idempotent."""
        self._decode_all()
        states = self.plan.states
        for key in list(self._states):
            state = self._states[key]
            waiting = [cs for cs in state.partial_matches.view()
                       if cs.start_event_id is None and states[cs.state].is_start]
            if waiting:
                kept = BinaryHeap(_order_key)
                for cs in state.partial_matches.view():
                    if cs not in waiting:
                        kept.offer(cs)
                state.partial_matches = kept
            if _drained(state):
                del self._states[key]
        self.closed = True

    def snapshot(self) -> bytes:
        """Each key's state pickled on its own, with its due CTI and its runs in flight: keys not
        touched since the last snapshot (or the restore) keep their bytes (:attr:`_raw`).

        Every decoded key goes back to its bytes here, so an operator kept across micro-batches
        decodes, advances and pickles only the keys a batch touches (an event, or a due CTI), not
        every key it ever held: a batch costs what it touches, not what is live (measured over
        200k accounts: 756 ms a 1,000-event batch before, ``docs/performance.md#latency``)."""
        self._pack()
        return pickle.dumps((SNAPSHOT_FORMAT, self._fingerprint(), self._raw.to_plain(), self._numbers,
                             self._caps()), protocol=pickle.HIGHEST_PROTOCOL)

    def _caps(self) -> tuple[int | None, int | None]:
        return self.settings.max_partial_matches, self.settings.max_buffered_events

    def _pack(self) -> None:
        """Every decoded key back to its bytes in :attr:`_raw`."""
        dumps, protocol, due = pickle.dumps, pickle.HIGHEST_PROTOCOL, self._state_due
        self._raw = self._raw.packed([(key, due(state), dumps(state.to_plain(), protocol=protocol),
                                       _runs(state))
                                      for key, state in self._states.items()])
        self._states = {}

    def changed_keys(self) -> set[str]:
        """(:meth:`Operator.changed_keys`) Keys of the operator's own (with ``PARTITION BY``
        columns, a key and its columns' values)."""
        changed = self._changed
        changed.update(self._states)
        self._changed = set()
        return changed

    def delta(self, keys) -> tuple[bytes, list[str]]:
        """(:meth:`Operator.delta`) Every decoded key goes back to its bytes, as in :meth:`snapshot`."""
        self._pack()
        part = MatchOperator(self.settings)
        part.closed = self.closed
        part._raw = self._raw.subset(keys)
        numbers = self._numbers
        part._numbers = {k: numbers[k] for k in keys if k in numbers}
        return part.snapshot(), self._raw.absent(keys, self._states, numbers)

    def absorb(self, part: "MatchOperator", keys) -> None:
        """(:meth:`Operator.absorb`)"""
        raw, states, numbers = self._raw, self._states, self._numbers
        theirs = part._raw.columns()
        gone = set(keys).union(theirs.keys)
        raw.drop_many(gone)
        for key in gone:
            states.pop(key, None)
            numbers.pop(key, None)
        self._raw = raw.packed(theirs)
        numbers.update(part._numbers)
        self.closed = part.closed

    @classmethod
    def restore(cls, settings: MatchSettings, data: bytes) -> "MatchOperator":
        operator = cls(settings)
        version, fingerprint, keyed, numbers, caps = _read(data)
        if fingerprint != operator._fingerprint():
            raise PatternError(
                f"the snapshot of pattern {operator.name!r} was taken with a different pattern "
                "(its NFA states differ); start from empty state after changing a pattern"
            )
        operator._raw = PackedStates.from_plain(keyed)
        if caps != operator._caps():  # (other caps, or none known): a key past a cap must be due at once
            operator._raw = operator._raw.all_due(CTI_NONE)
        operator._numbers = numbers
        return operator

    @staticmethod
    def snapshot_summary(data: bytes) -> tuple[set[str], int]:
        """The event keys a snapshot holds state for and the runs in flight it counted, read
        without restoring it (no settings needed: a ruled operator's versions waiting for theirs)."""
        _, _, keyed, numbers, _ = _read(data)
        packed = PackedStates.from_plain(keyed)
        keys = set(packed) | set(numbers)
        return {_job_key(k) if _PART in k else k for k in keys}, packed.runs_total()[0]

    def _decode(self, key: str) -> NfaState:
        state = self._states[key] = NfaState.from_plain(snapshots.loads(self._raw.take(key)))
        self._changed.add(key)
        return state

    def _decode_all(self) -> None:
        for key in list(self._raw):
            self._decode(key)

    def _fingerprint(self) -> tuple[object, ...]:
        """What a snapshot's computation states depend on: the NFA's state names and types."""
        return tuple(sorted((s.name, s.type.value) for s in self.plan.states.values()))

    def live_keys(self) -> set[str]:
        """Event keys with a partial match in flight (or a MATCH_NUMBER count kept)."""
        keys = set(self._states) | set(self._raw) | set(self._numbers)
        return {_job_key(k) for k in keys} if self._composite else keys

    def key_count(self) -> int:
        """(:meth:`Operator.key_count`: a key is decoded or packed, never both)"""
        if self._composite or self._numbers:
            return len(self.live_keys())
        return len(self._states) + len(self._raw)

    def next_due(self) -> int:
        """The earliest CTI that times a run out (``within`` from its first event, or a stage's
        window from its previous event), completes a held-back match, or leaves a key idle (at
        once for a key past a cap: :meth:`_state_due`); :data:`CTI_INFINITY` without windows
        and held matches (then only events change state)."""
        due = self._raw.next_due(CTI_INFINITY)
        for state in self._states.values():
            due = min(due, self._state_due(state))
        return due

    def _state_due(self, state: NfaState) -> int:
        """:meth:`next_due` of one key's state: at once (:data:`CTI_NONE`) while it holds a match
        back or has passed a cap (its next event is refused: :meth:`rows_to_take` skips none of
        its rows)."""
        runs, kept = self.settings.max_partial_matches, self.settings.max_buffered_events
        if state.completed_matches or (runs is not None and len(state.partial_matches) > runs) or (
                kept is not None and len(state.buffer.events) > kept):
            return CTI_NONE
        due = CTI_INFINITY
        counts = state.buffer.events_count
        if counts:
            due = min(counts) + 1
        if not self._has_windows:
            return due
        plan = self.plan
        window = plan.window_ms
        state_windows = plan.state_windows_ms
        states = plan.states
        for cs in state.partial_matches.view():
            if states[cs.state].is_start:
                continue
            if window > 0:
                due = min(due, cs.start_timestamp + window)
            state_window = state_windows.get(cs.state)
            if state_window:
                due = min(due, cs.previous_timestamp + state_window)
        return due

    def partition(self, where) -> dict[int, "MatchOperator"]:
        """This operator's keys split by ``where(key)`` into operators of the same settings, each
        holding exactly its keys' partial matches; ``self`` is not used afterwards."""
        parts: dict[int, MatchOperator] = {}
        for d, raw in self._raw.split((lambda k: where(_job_key(k))) if self._composite else where).items():
            part = parts[d] = MatchOperator(self.settings)
            part.closed = self.closed
            part._raw = raw
        for held in ("_states", "_numbers"):
            for key, value in getattr(self, held).items():
                d = where(_job_key(key) if self._composite else key)
                part = parts.get(d)
                if part is None:
                    part = parts[d] = MatchOperator(self.settings)
                    part.closed = self.closed
                getattr(part, held)[key] = value
        return parts

    @classmethod
    def traits(cls, settings: MatchSettings) -> Traits:
        """Partitioned by the event's key, unless the runs are keyed by a field (``key_field``); a
        ``MATCH_RECOGNIZE ... ORDER BY t, c…`` takes rows of equal time in its own order."""
        return Traits(partitions=settings.key_field is None, orders_ties=settings.sql is not None)

    def forget_keys(self, keys) -> None:
        """Drop the event keys' partial matches (the key TTL; without ``within`` they never
        expire) and their MATCH_NUMBER counts (numbering starts again at 1 after it); one pass
        over the partitions with further PARTITION BY columns."""
        held = (self._states, self._numbers)
        keys = list(keys)
        if self._composite:
            keys = set(keys)
            keys = [k for d in (*held, self._raw) for k in d if _job_key(k) in keys]
        self._raw.drop_many(keys)
        for key in keys:
            for d in held:
                d.pop(key, None)
        self._changed.update(keys)

    # -- inspection -------------------------------------------------------------------------------
    @property
    def keys_in_flight(self) -> int:
        return len(self._states) + len(self._raw)

    def partial_match_count(self) -> int:
        """Partial matches in flight over all keys (start states not counted)."""
        self._decode_all()
        return sum(
            sum(1 for cs in state.partial_matches if cs.start_event_id is not None)
            for state in self._states.values()
        )

    def runs_in_flight(self) -> int:
        """:meth:`partial_match_count` without decoding the keys a snapshot counted already."""
        count, unknown = self._raw.runs_total()
        return count + sum(map(_runs, self._states.values())) + sum(_runs(self._decode(k)) for k in unknown)

    def buffered_event_count(self) -> int:
        self._decode_all()
        return sum(len(state.buffer.events) for state in self._states.values())

    # -- records ----------------------------------------------------------------------------------
    def _key(self, event: Event) -> str:
        """The partition an event's runs belong to: its key (or ``key_field``), and with further
        PARTITION BY columns ``key + NUL + JSON of their values`` (JSON escapes NUL, so the key is
        everything before the last NUL)."""
        if self._composite:
            fields = event.fields
            values = [fields.get(c) for c in self.settings.partition_columns]
            return event.key + _PART + json.dumps(values, separators=(",", ":"), default=str)
        field = self.settings.key_field
        if field is None:
            return event.key
        value = event.fields.get(field) if isinstance(event.fields, Mapping) else None
        return "" if value is None else str(value)

    def _emit(
        self,
        key: str,
        matches: Any,
        timed_out: Any,
        outputs: list[Output],
        emitted: int = 0,
    ) -> None:
        match: IdentifiedMatch
        sql = self._sql
        if sql is not None:
            job_key = _job_key(key) if self._composite else key
            all_rows = sql.query.all_rows
            for events, ids in matches:
                number = 0
                if self._numbered:
                    self._numbers[key] = number = self._numbers.get(key, 0) + 1
                    self._changed.add(key)
                rows = {name: events.get(name, []) for name in sql.variables}
                if all_rows:
                    rows = _ranked(rows, ids)
                try:
                    records = list(sql.outputs(sql.partition_values(rows), rows, number, emitted))
                except EventRejected as exc:  # a measure failed on the match's rows: the match is refused
                    every = [dict(r) for _, r in sorted(((i, r) for name, rs in events.items()
                                                         for i, r in zip(ids.get(name, ()), rs)), key=_FIRST)]
                    outputs.append(Output("dead_letter", {"error": str(exc), "value": every}, key=job_key))
                    continue
                outputs.extend(Output("match", record, key=job_key) for record in records)
        else:
            for match in matches:
                outputs.append(Output("match", self._record(key, match[0], match[1])))
        timeout: IdentifiedTimeout
        for timeout in timed_out:
            record = self._record(key, timeout[0], timeout[1])
            record["timed_out_at"] = timeout[2]
            outputs.append(Output("timed_out", record))

    def _record(self, key: str, events: Mapping[str, list[Any]], ids: MatchIds) -> dict[str, Any]:
        every_id = sorted(eid for stage_ids in ids.values() for eid in stage_ids)
        first, last = every_id[0], every_id[-1]
        identity = repr([(stage, stage_ids) for stage, stage_ids in ids.items()])
        if self._composite:  # event ids count per partition: the partition's values tell them apart
            identity += key
        digest = hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()
        if self._composite:
            key = _job_key(key)
        structured = self.settings.structured_events
        return {
            "pattern": self.name,
            "key": key,
            "match_id": f"{key}:{first[0]}.{first[1]}-{last[0]}.{last[1]}:{digest}",
            "first_time": first[0],
            "last_time": last[0],
            "stages": [
                {"stage": stage, "events": [dict(e) if structured else fields_json(e) for e in stage_events]}
                for stage, stage_events in events.items()
            ],
        }


def _runs(state: NfaState) -> int:
    """A key's partial matches in flight (its waiting start not counted)."""
    return sum(1 for cs in state.partial_matches.view() if cs.start_event_id is not None)


def _drained(state: NfaState) -> bool:
    """A closed key's state with no run left (:meth:`MatchOperator.close`)."""
    return not state.partial_matches and not state.completed_matches


def _FIRST(pair: tuple) -> Any:
    return pair[0]


def _ranked(rows: dict[str, list[Any]], ids: MatchIds) -> dict[str, list[Any]]:
    """A match's rows as :class:`ctiflow.operators.cep.sql.parse.Row` s whose ``seq`` is their place in
    the partition's order (the buffer ids ``(time, n-th at that time)`` sort as the rows were
    processed), for ALL ROWS PER MATCH."""
    from ctiflow.operators.cep.expr.vocabulary import Row

    ranked: dict[str, list[Any]] = {}
    for name, fields in rows.items():
        out = ranked[name] = []
        for f, (time, n) in zip(fields, ids.get(name, ())):
            row = Row(f)
            row.time, row.seq = time, (time, n)
            out.append(row)
    return ranked
