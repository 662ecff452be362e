"""The one interface every operator implements, so the runtime (:mod:`ctiflow.jobs.core.runtime`) is written
once and probes nothing (in the manner of bytewax's ``StatefulLogic``).

An operator instance owns the state of *many* keys (a chunk of a key group): the runtime hands
it the released events of those keys as columns, in application-time order, and advances it
with CTIs. Results are :class:`Output` records, or :class:`OutputBatch` columns of records,
tagged with the role of the result topic they belong to.

Contract (what the runtime relies on):

* ``process_columns(cols)`` is called only with events the CTI has already passed, in
  application-time order (ties: partition, then offset; an operator may ask for another order
  of equal times with :meth:`Operator.release_order`). → ``(row, records)`` for rows that
  produced records (a list of :class:`Output` or one :class:`OutputBatch`), ``(row,
  EventRejected)`` for rows whose data the operator refuses (state unchanged by them; records
  emitted before the refusal are in ``EventRejected.outputs``), ordered by row.
* ``advance_to(cti)`` is called after the events of a CTI step; ``cti`` never decreases;
  ``cti == CTI_INFINITY`` flushes everything (final bins, last counts, timed-out matches).
* ``snapshot()`` returns bytes from which ``restore(settings, data)`` rebuilds an operator
  that behaves identically; it is called once per micro-batch per chunk the batch touched.
* Outputs are plain dicts shaped like the Avro schema of their role (see ``schemas/``).
* Deltas (optional, :meth:`Operator.changed_keys` not None): a chunk's state is stored as its last
  whole snapshot and, a frame a commit, the state of the keys that commit changed with those of
  them it no longer holds (:meth:`Operator.delta`); it is read back as ``restore(base)`` then
  :meth:`Operator.absorb` of ``restore(frame)`` and those keys, frame by frame, and must then
  behave as the operator it was taken of.

Row-minded operators (a pattern's NFA steps one event at a time) implement ``process_columns``
with :func:`process_rows`; tests and tools feed single events with :meth:`Operator.process`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ctiflow.operators.columns import EventColumns
from ctiflow.operators.errors import EventRejected
from ctiflow.operators.events import CTI_NONE, Event, Output, OutputBatch, outputs_of

__all__ = ["Operator", "Output", "OutputBatch", "outputs_of", "process_rows"]


def process_rows(process: Callable[[Event], list[Output]], rows: Iterable[int],
                 events: Iterable[Event]) -> list[tuple[int, Any]]:
    """``process`` each event, in order: → ``(row, outputs)`` for each row that produced records
    and ``(row, EventRejected)`` for each refused one (a ``process_columns`` result), after
    ``(row, outputs)`` when the refusal carries records emitted before it."""
    got: list[tuple[int, Any]] = []
    for row, event in zip(rows, events):
        try:
            produced = process(event)
        except EventRejected as exc:
            if exc.outputs:
                got.append((row, exc.outputs))
            got.append((row, exc))
            continue
        if produced:
            got.append((row, produced))
    return got


@dataclass(frozen=True)
class Traits:
    """What the runtime needs to know of an operator besides its calls, declared once per
    operator from its settings (:meth:`Operator.traits`) rather than found by probing it.

    ``state``: where its state lives — ``"keys"`` (under each event's key, the default),
    ``"one key"`` (under :attr:`home_key` whatever the event's key: a global count; the runtime
    routes its events to that key's chunk, so it does not keep the other operators' keys from
    being chunked) or ``"none"`` (stateless: one instance takes the rows of every chunk).
    ``partitions``: :meth:`Operator.partition` splits its state by key (then a key group's chunks
    split as its keys grow). ``fields_read``: the only record fields it reads of an event on its
    common path (the reorder buffer keeps just those; :meth:`Operator.needs_records` names the
    rows it may read whole); None: any. ``handles_adjust``: it accounts for the dropped share of
    ADJUSTed events itself (the binner); otherwise the time layer writes a late record for it.
    ``orders_ties``: it takes rows of equal time in an order of its own (:meth:`Operator.release_order`)."""

    state: str = "keys"
    home_key: str | None = None
    partitions: bool = False
    fields_read: tuple[str, ...] | None = None
    handles_adjust: bool = False
    orders_ties: bool = False

    def __post_init__(self) -> None:
        if self.state not in ("keys", "one key", "none") \
                or (self.state == "one key") != (self.home_key is not None):
            raise ValueError(f"state {self.state!r} with home_key {self.home_key!r}")


#: The first item of an operator's tally key that names a part of its :class:`SharedState` a
#: chunk holds (``(HELD, *ref)``): summed over the chunks, what :meth:`SharedState.forget` keeps.
HELD = "held"


@dataclass(frozen=True)
class Decision:
    """What a :class:`SharedState` did with a side input's record: ``applied``; ``adjusted`` —
    taken, but at ``effective`` rather than the time it asked for (it came behind the CTI: a
    record of the late topic says so); or ``rejected`` (``reason``; nothing changed: a dead letter)."""

    outcome: str
    reason: str = ""
    effective: int | None = None


class SharedState(ABC):
    """State that one operator's instances share across the chunks of a key group, fed by a side
    input every key group reads whole: Flink's broadcast state. The runtime keeps it in the
    group's header, offers it the side input's records in topic order, each against the CTI in
    effect (as an event is judged), and hands it to every instance (:meth:`Operator.use_shared`)
    before any other call of a micro-batch. Every group's copy sees the same records at the same
    CTIs, so all decide alike; only one group reports what was refused. Restored by the plan's
    side input (its ``shared.restore(bytes)``)."""

    #: the counters' family of :meth:`stats` (``<family>_<figure>``, labelled by the operator)
    family: ClassVar[str] = "shared"

    @abstractmethod
    def offer_record(self, record: Mapping[str, Any], cti: int) -> Decision:
        """The side input's next record, judged against ``cti``: the :class:`Decision`."""

    @abstractmethod
    def snapshot(self) -> bytes:
        """The state as bytes."""

    def stats(self, cti: int) -> dict[str, int]:
        """Figures for the metrics (gauges and running totals), by name."""
        return {}

    def forget(self, cti: int, held: set) -> None:
        """Drop what no later record or event can need and no chunk holds (``held``: the refs the
        chunks' tallies name with :data:`HELD`). By default nothing."""


class Operator(ABC):
    """Base of every operator. Required: :meth:`process_columns`, :meth:`advance_to`,
    :meth:`snapshot`, :meth:`restore`, :meth:`live_keys`; declared: :meth:`traits`. Every other
    member has a default that is correct for any operator and may be overridden to do less work."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    # -- required ------------------------------------------------------------------------
    @abstractmethod
    def process_columns(self, cols: EventColumns) -> list[tuple[int, Any]]:
        """The rows of ``cols`` (module docstring)."""

    @abstractmethod
    def advance_to(self, cti: int) -> list[Output | OutputBatch]:
        """The CTI: what it makes final or due, as records in output order."""

    @abstractmethod
    def snapshot(self) -> bytes:
        """The whole state as bytes (:meth:`restore` rebuilds it)."""

    @classmethod
    @abstractmethod
    def restore(cls, settings: Any, data: bytes) -> "Operator":
        """The operator a :meth:`snapshot` was taken of."""

    @abstractmethod
    def live_keys(self) -> set[str]:
        """The event keys the operator keeps state for (progress reports them; chunks split by them)."""

    def key_count(self) -> int:
        """``len(self.live_keys())``, which an operator may count without building the set."""
        return len(self.live_keys())

    # -- declared ------------------------------------------------------------------------
    @classmethod
    def traits(cls, settings: Any) -> Traits:
        """The operator's :class:`Traits` for ``settings`` (by default: keyed by the events' keys,
        not partitioned, reads any field, leaves ADJUST's dropped share to the time layer)."""
        return Traits()

    # -- optional, with defaults ------------------------------------------------------------
    def next_due(self) -> int:
        """The smallest CTI at which :meth:`advance_to` could emit or change state that matters
        (a window closing, a bin becoming final, a run timing out); until then the runtime may
        skip ``advance_to`` and leave the operator as bytes in the state store. Never later than
        the first CTI that would change an output; :data:`~ctiflow.operators.events.CTI_INFINITY` means
        "only events change me". By default: due at every CTI."""
        return CTI_NONE

    def partition(self, where: Callable[[str], int]) -> dict[int, "Operator"]:
        """The keys split by ``where(key)`` into operators of the same settings (operator-wide
        clocks copied), each with exactly its keys' state; ``self`` is not used afterwards.
        Called only when its traits say it ``partitions``."""
        raise NotImplementedError(f"{type(self).__name__} does not partition its keys")

    def changed_keys(self) -> Collection[str] | None:
        """The keys whose state may have changed since the last call (or since it was built or
        restored) — by events, CTIs and :meth:`forget_keys`, dropped keys included — in the
        operator's own terms (what :meth:`delta` and :meth:`absorb` take), each once: a collection
        the runtime only counts (``len``) and hands to :meth:`delta` (an operator may answer with
        its own form of them, e.g. ids into its key table); a change no later call can observe (a
        lazily applied expiry) need not count. None (the default): not tracked, so the runtime
        stores the whole :meth:`snapshot` of a chunk it touched."""
        return None

    def delta(self, keys: Collection[str]) -> tuple[bytes, list[str]]:
        """A chunk's frame: a :meth:`snapshot` (``restore`` reads it) of the operator-wide state and
        the state of ``keys`` (at least: an operator may add keys it needs to stay exact), and
        those of ``keys`` it holds no state for (the keys it dropped), sorted. ``keys``: what
        :meth:`changed_keys` returned, asked before anything else changes the operator. Asked
        only of an operator whose :meth:`changed_keys` is not None."""
        raise NotImplementedError(f"{type(self).__name__} keeps no deltas")

    def absorb(self, part: "Operator", keys: set[str]) -> None:
        """The state of ``keys`` dropped (the keys a delta dropped; in a delta before 2026-12-02
        every key it changed), then every key ``part`` (a restored :meth:`delta`'s snapshot) holds
        taken over in place of the key's state, and its operator-wide state (clocks) where later.
        Asked only of an operator whose :meth:`changed_keys` is not None."""
        raise NotImplementedError(f"{type(self).__name__} keeps no deltas")

    def forget_keys(self, keys: Iterable[str]) -> None:
        """Drop everything kept for ``keys`` (the job's key TTL, ``state.ttl``: a key with no
        event for that long in application time). By default nothing: an operator whose state
        the CTI bounds anyway (bins) need not forget."""

    @classmethod
    def needs_records(cls, settings: Any, cols: EventColumns) -> bool:
        """True when a row of ``cols`` may be refused or otherwise have its whole record read (a
        refusal's dead letter and a late record carry every field): the buffer then keeps it
        whole. Asked only of an operator whose traits name the ``fields_read``."""
        return True

    def tallies(self) -> dict[str, int]:
        """Figures about the state besides its bytes and keys, by name, that add up over chunks
        and key groups (the ruled match operator: partial matches per rule). By default none."""
        return {}

    def use_shared(self, state: SharedState) -> None:
        """An operator with a side input (:class:`ctiflow.operators.cep.rules.RuledMatchOperator`: its
        rules) gets its key group's :class:`SharedState` before any other call of a micro-batch;
        others have none (the default does nothing)."""

    def release_order(self, cols: EventColumns) -> np.ndarray | None:
        """The order in which to take released rows when it is not the release order (e.g. a
        ``MATCH_RECOGNIZE ... ORDER BY t, c``: equal times sorted by ``c``); None (the default):
        the release order. Asked only of an operator whose traits say it ``orders_ties``."""
        return None

    # -- tests and tools -------------------------------------------------------------------
    def process(self, event: Event) -> list[Output]:
        """One event through :meth:`process_columns`: its records (batches expanded); raises
        its refusal. For tests and tools; the runtime feeds columns."""
        out: list[Output] = []
        for _, got in self.process_columns(EventColumns.from_events([event])):
            if isinstance(got, EventRejected):
                raise got
            out.extend(outputs_of(got) if isinstance(got, list) else got.outputs())
        return out
