"""The versioned shared buffer: every event stored once, partial matches as versioned paths.

Overlapping partial matches share their common prefix (seeds/flink-cep-internals.zh.txt: three
runs over ``e1 … e5`` need one buffer, not three). The buffer holds:

* **events** — ``EventId -> [event, refcount]``; an :data:`EventId` is ``(timestamp, n)`` where
  ``n`` counts the events registered with the same timestamp, so ids sort in arrival order;
* **nodes** — ``NodeId -> [refcount, edges]`` with ``NodeId = (EventId, stage name)``: the
  event as accepted by a stage. Each edge ``[previous NodeId | None, version, refcount]`` points
  back to the node accepted just before it in some run, labelled with that run's
  :class:`DeweyNumber`.

A run's version ``v`` may follow an edge labelled ``v'`` iff ``v`` is *compatible* with
``v'``: ``v'`` is a prefix of ``v``, or they differ only in the last digit and ``v``'s is not
smaller. Walking back from a node along compatible edges reconstructs exactly the events of one
run (:meth:`SharedBuffer.extract_patterns`).

Reference counting (Flink's ``Lockable``) frees memory: a computation state locks the node it
points at and the compatible edges; releasing the last lock on an edge drops it and walks on to
its target; a node without locks is removed and releases its event. Invariant: once no
partial or completed match references an event, the event is gone from the buffer.
"""

from __future__ import annotations

from typing import Any

#: ``(timestamp, n)``: n-th event registered with this timestamp.
EventId = tuple[int, int]
#: ``(EventId, stage name)``.
NodeId = tuple[EventId, str]


class DeweyNumber(tuple):
    """A Dewey decimal version ``d1.d2.….dn`` (an immutable tuple of ints): the NFA raises the
    last digit for a sibling run and appends a 0 for a run that took an event (on plain tuples,
    :func:`ctiflow.operators.cep.nfa.nfa._increase`); this class parses and prints them."""

    __slots__ = ()

    def __new__(cls, digits: Any = (1,)) -> "DeweyNumber":
        if isinstance(digits, int):
            digits = (digits,)
        return super().__new__(cls, digits)

    @classmethod
    def from_string(cls, text: str) -> "DeweyNumber":
        return cls(tuple(int(part) for part in text.split(".")))

    def is_compatible_with(self, other: tuple[int, ...]) -> bool:
        return is_compatible(self, other)

    @property
    def run(self) -> int:
        return self[0]

    def __str__(self) -> str:
        return ".".join(str(d) for d in self)

    def __repr__(self) -> str:
        return f"DeweyNumber({self})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeweyNumber, (tuple(self),))


def is_compatible(version: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """``version`` may follow an edge labelled ``other`` (see the module docstring)."""
    n, m = len(version), len(other)
    if n > m:
        return version[:m] == other
    if n == m:
        last = n - 1
        return version[:last] == other[:last] and version[last] >= other[last]
    return False


class EventBook:
    """What every run buffer keeps of its events: ``events`` (``EventId → [event, …]``) and the
    per-timestamp counters that number them (``events_count``), forgotten as time advances."""

    __slots__ = ()

    def _next_id(self, timestamp: int) -> EventId:
        counts = self.events_count
        n = counts.get(timestamp, 0)
        counts[timestamp] = n + 1
        return (timestamp, n)

    def _forget_id(self, event_id: EventId) -> None:
        """Give the newest event's id back (its processing was undone)."""
        timestamp, n = event_id
        if self.events_count.get(timestamp) == n + 1:
            if n:
                self.events_count[timestamp] = n
            else:
                del self.events_count[timestamp]

    def advance_time(self, timestamp: int) -> None:
        """No event before ``timestamp`` will come: forget the per-timestamp counters."""
        counts = self.events_count
        if counts:
            for ts in [t for t in counts if t < timestamp]:
                del counts[ts]

    def materialize(self, match: dict[str, list[EventId]]) -> dict[str, list[Any]]:
        events = self.events
        return {stage: [events[eid][0] for eid in ids] for stage, ids in match.items()}

    def is_empty(self) -> bool:
        return not self.events


class SharedBuffer(EventBook):
    """Events and versioned nodes of all runs of one key (see the module docstring).

    The methods mirror Flink's ``SharedBuffer`` + ``SharedBufferAccessor``; their call order
    (and so the order of edges in a node) follows the NFA exactly, because extraction takes the
    first complete path it finds.
    """

    __slots__ = ("events", "nodes", "events_count")

    def __init__(self) -> None:
        self.events: dict[EventId, list[Any]] = {}
        self.nodes: dict[NodeId, list[Any]] = {}
        self.events_count: dict[int, int] = {}

    # -- events -------------------------------------------------------------------------------
    def register_event(self, event: Any, timestamp: int) -> EventId:
        """Store ``event`` once; it starts with one lock (held while it is being processed)."""
        event_id = self._next_id(timestamp)
        self.events[event_id] = [event, 1]
        return event_id

    def release_event(self, event_id: EventId) -> None:
        wrapper = self.events.get(event_id)
        if wrapper is not None:
            if wrapper[1] <= 1:
                del self.events[event_id]
            else:
                wrapper[1] -= 1

    def unregister_event(self, event_id: EventId) -> None:
        """Undo :meth:`register_event` of the newest event (no node holds it any more)."""
        self.release_event(event_id)
        self._forget_id(event_id)

    # -- nodes ----------------------------------------------------------------------------------
    def put(
        self,
        stage: str,
        event_id: EventId,
        previous: NodeId | None,
        version: tuple[int, ...],
    ) -> NodeId:
        """Record that ``stage`` accepted the event after ``previous`` in run ``version``."""
        if previous is not None:
            self.lock_node(previous, version)
        node_id = (event_id, stage)
        node = self.nodes.get(node_id)
        if node is None:
            node = [0, []]
            self.nodes[node_id] = node
            self.events[event_id][1] += 1
        node[1].append([previous, version, 0])
        return node_id

    def lock_node(self, node_id: NodeId | None, version: tuple[int, ...]) -> None:
        if node_id is None:
            return
        node = self.nodes.get(node_id)
        if node is not None:
            node[0] += 1
            n = len(version)
            head, last = version[:-1], version[-1]
            for edge in node[1]:
                other = edge[1]
                m = len(other)
                if m == n:
                    if other[-1] <= last and other[:-1] == head:
                        edge[2] += 1
                elif m < n and version[:m] == other:
                    edge[2] += 1

    def release_node(self, node_id: NodeId | None, version: tuple[int, ...]) -> None:
        """Drop one lock of run ``version`` on ``node_id`` and on everything only it held."""
        nodes = self.nodes
        stack: list[tuple[NodeId | None, tuple[int, ...]]] = [(node_id, version)]
        while stack:
            current, current_version = stack.pop()
            node = nodes.get(current) if current is not None else None
            if node is None:
                break  # as in Flink: an already released node ends the walk
            edges = node[1]
            kept = []
            n = len(current_version)
            head, last = current_version[:-1], current_version[-1]
            for edge in edges:
                other = edge[1]
                m = len(other)
                if (m == n and other[-1] <= last and other[:-1] == head) or (
                    m < n and current_version[:m] == other
                ):
                    if edge[2] <= 1:
                        edge[2] = 0
                        target = edge[0]
                        if target is not None:
                            stack.append((target, edge[1]))
                        continue
                    edge[2] -= 1
                kept.append(edge)
            if len(kept) != len(edges):
                node[1] = kept
            if node[0] <= 1:
                del nodes[current]
                self.release_event(current[0])
            else:
                node[0] -= 1

    # -- extraction -----------------------------------------------------------------------------
    def extract_patterns(
        self, node_id: NodeId | None, version: tuple[int, ...]
    ) -> list[dict[str, list[EventId]]]:
        """All runs compatible with ``version`` ending at ``node_id``: stage -> event ids,
        stages in order of their first event, events oldest first."""
        result: list[dict[str, list[EventId]]] = []
        nodes = self.nodes
        node = nodes.get(node_id) if node_id is not None else None
        if node is None:
            return result
        stack: list[tuple[NodeId | None, Any, tuple[int, ...], list[NodeId]]] = [
            (node_id, node, version, [])
        ]
        while stack:
            current, current_node, current_version, path = stack.pop()
            if current_node is None:
                complete: dict[str, list[EventId]] = {}
                while path:
                    event_id, stage = path.pop()
                    ids = complete.get(stage)
                    if ids is None:
                        complete[stage] = [event_id]
                    else:
                        ids.append(event_id)
                result.append(complete)
                continue
            path.append(current)  # type: ignore[arg-type]
            first = True
            n = len(current_version)
            head, last = current_version[:-1], current_version[-1]
            for target, edge_version, _locks in current_node[1]:
                m = len(edge_version)
                if (m == n and edge_version[-1] <= last and edge_version[:-1] == head) or (
                    m < n and current_version[:m] == edge_version
                ):
                    if first:
                        new_path = path
                        first = False
                    else:
                        new_path = list(path)
                    stack.append(
                        (
                            target,
                            nodes[target] if target is not None else None,
                            edge_version,
                            new_path,
                        )
                    )
        return result

    # -- inspection and serialisation -------------------------------------------------------------
    def to_plain(self) -> tuple[Any, ...]:
        return (
            [(eid, wrapper[0], wrapper[1]) for eid, wrapper in self.events.items()],
            [
                (nid, node[0], [(e[0], tuple(e[1]), e[2]) for e in node[1]])
                for nid, node in self.nodes.items()
            ],
            list(self.events_count.items()),
        )

    @classmethod
    def from_plain(cls, data: tuple[Any, ...]) -> "SharedBuffer":
        buffer = cls()
        events, nodes, counts = data
        buffer.events = {tuple(eid): [event, refs] for eid, event, refs in events}
        buffer.nodes = {
            _node_id(nid): [refs, [[_node_id(t) if t is not None else None, tuple(v), locks]
                                   for t, v, locks in edges]]
            for nid, refs, edges in nodes
        }
        buffer.events_count = dict(counts)
        return buffer


def _node_id(raw: Any) -> NodeId:
    event_id, stage = raw
    return (tuple(event_id), stage)  # type: ignore[return-value]
