"""The buffer of a strictly contiguous pattern: events stored once, a run as a few segments.

Where no state of a plan ignores events (every stage ``next`` and every loop ``consecutive``:
every ``MATCH_RECOGNIZE`` query, and Pattern API patterns written that way), a run takes every
event from its first to its last, so its events are a *contiguous range* of the key's taken
events, labelled stage by stage in pattern order. A run is then a :data:`Path` — its first
event's place in that sequence and ``(stage, count)`` segments — instead of a chain of
versioned nodes. Why not the :class:`~ctiflow.operators.cep.nfa.shared_buffer.SharedBuffer` here: with a
loop (``A+``, ``X*?``) every run starting at another event adds an edge, labelled with a Dewey
version one digit longer per event taken, to every node it passes, so N overlapping runs of
length L cost O(N·L) edges of O(L) digits, and each take walks O(N) edges (Flink's own
``MATCH_RECOGNIZE`` has the same cost). Here a take is O(stages), the state is the events
buffered plus O(stages) per run, and a condition reads a stage's rows as a view (O(1)).

Interface: the subset of :class:`~ctiflow.operators.cep.nfa.shared_buffer.SharedBuffer` the NFA calls
(``register_event``, ``release_event``, ``advance_time``, ``put``, ``lock_node``,
``release_node``, ``extract_patterns``, ``materialize``, ``to_plain``), with a :data:`Path`
where the shared buffer has a node id; versions are accepted and ignored (a path *is* one
run). Invariants: events are kept from the first event of the oldest locked path to the newest
one (nothing else is kept); a path's events are ``sequence[start : start + length]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctiflow.operators.cep.nfa.shared_buffer import EventBook, EventId

#: ``(first event's place in the sequence, events, ((stage, count), …))``.
Path = tuple[int, int, tuple[tuple[str, int], ...]]

#: What :meth:`ContiguousBuffer.to_plain` starts with (tells the two buffers' states apart).
PLAIN_TAG = "contiguous"


class ContiguousBuffer(EventBook):
    """Events and runs of one key for a strictly contiguous plan (see the module docstring)."""

    __slots__ = ("events", "events_count", "_ids", "_first", "_locks")

    def __init__(self) -> None:
        #: ``EventId -> [event, place]``: what is kept (``len``/truthiness as in the shared buffer)
        self.events: dict[EventId, list[Any]] = {}
        self.events_count: dict[int, int] = {}
        self._ids: list[EventId] = []  # the kept events in order; _ids[i] has place _first + i
        self._first = 0
        self._locks: dict[int, int] = {}  # first place of a path -> locks held on paths from it

    # -- events -------------------------------------------------------------------------------
    def register_event(self, event: Any, timestamp: int) -> EventId:
        event_id = self._next_id(timestamp)
        self.events[event_id] = [event, self._first + len(self._ids)]
        self._ids.append(event_id)
        return event_id

    def release_event(self, event_id: EventId) -> None:
        """The event is no longer being processed: drop what no locked path reaches."""
        self._trim()

    def unregister_event(self, event_id: EventId) -> None:
        """Undo :meth:`register_event` of the newest event (no path holds it any more)."""
        if self._ids and self._ids[-1] == event_id:
            self._ids.pop()
            del self.events[event_id]
        self._forget_id(event_id)
        self._trim()

    # -- runs -----------------------------------------------------------------------------------
    def put(self, stage: str, event_id: EventId, previous: Path | None, version: Any = None) -> Path:
        """The run ``previous`` (None: a new run) with the event appended as ``stage``."""
        place = self.events[event_id][1]
        if previous is None:
            return (place, 1, ((stage, 1),))
        start, length, segments = previous
        if start + length != place:
            raise AssertionError(f"a strictly contiguous run ends at {start + length - 1}, "
                                 f"the event taken is at {place}")
        last_stage, count = segments[-1]
        if last_stage == stage:
            return (start, length + 1, segments[:-1] + ((stage, count + 1),))
        return (start, length + 1, segments + ((stage, 1),))

    def lock_node(self, path: Path | None, version: Any = None) -> None:
        if path is not None:
            locks = self._locks
            locks[path[0]] = locks.get(path[0], 0) + 1

    def release_node(self, path: Path | None, version: Any = None) -> None:
        if path is None:
            return
        locks = self._locks
        held = locks.get(path[0], 0)
        if held <= 1:
            locks.pop(path[0], None)
            self._trim()
        else:
            locks[path[0]] = held - 1

    def _trim(self) -> None:
        ids, locks, events = self._ids, self._locks, self.events
        drop = 0
        first = self._first
        while drop < len(ids) and first + drop not in locks:
            drop += 1
        if drop:
            for event_id in ids[:drop]:
                del events[event_id]
            del ids[:drop]
            self._first = first + drop

    # -- reading runs ---------------------------------------------------------------------------
    def extract_patterns(self, path: Path | None, version: Any = None) -> list[dict[str, list[EventId]]]:
        """The run's events by stage, stages in order, events oldest first (one path)."""
        if path is None:
            return []
        ids = self._ids
        at = path[0] - self._first
        out: dict[str, list[EventId]] = {}
        for stage, count in path[2]:
            out.setdefault(stage, []).extend(ids[at:at + count])
            at += count
        return [out]

    def stage_view(self, path: Path | None, stage: str | None) -> Sequence[Any]:
        """The events ``stage`` took in the run (``None``: all of them), oldest first, as a
        read-only view: indexing and ``len`` are O(1)."""
        if path is None:
            return ()
        at = path[0] - self._first
        if stage is None:
            return _View(self._ids, self.events, at, path[1])
        found: list[_View] = []
        for name, count in path[2]:
            if name == stage:
                found.append(_View(self._ids, self.events, at, count))
            at += count
        if len(found) == 1:
            return found[0]
        return [event for view in found for event in view]  # a stage of a looping group

    # -- inspection and serialisation -------------------------------------------------------------
    def to_plain(self) -> tuple[Any, ...]:
        events = self.events
        return (PLAIN_TAG, self._first, [(eid, events[eid][0]) for eid in self._ids],
                list(self._locks.items()), list(self.events_count.items()))

    @classmethod
    def from_plain(cls, data: tuple[Any, ...]) -> "ContiguousBuffer":
        buffer = cls()
        _tag, first, events, locks, counts = data
        buffer._first = first
        for place, (eid, event) in enumerate(events, start=first):
            event_id = tuple(eid)
            buffer._ids.append(event_id)  # type: ignore[arg-type]
            buffer.events[event_id] = [event, place]  # type: ignore[index]
        buffer._locks = dict(locks)
        buffer.events_count = dict(counts)
        return buffer


def revive_path(raw: Any) -> Path:
    """A :data:`Path` from its plain (possibly list-typed) form."""
    start, length, segments = raw
    return (start, length, tuple((stage, count) for stage, count in segments))


class _View(Sequence):
    """``count`` kept events from index ``at`` of the buffer's sequence, without copying."""

    __slots__ = ("_ids", "_events", "_at", "_n")

    def __init__(self, ids: list[EventId], events: dict[EventId, list[Any]], at: int, n: int) -> None:
        self._ids, self._events, self._at, self._n = ids, events, at, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(index)
        return self._events[self._ids[self._at + index]][0]
