"""The one interface every operator implements, so the Spark adapter is written once.

An operator instance owns the state of *many* keys (a key group): the adapter hands it all
events of the group in application-time order and advances it with CTIs. Results are
``Output`` records tagged with the role of the result topic they belong to.

Contract (what the adapter relies on):

* ``process(event)`` is called only for events the CTI has already passed, in
  application-time order (ties: partition, then offset) — the reorder buffer in
  :mod:`operators.time` guarantees that.
* ``advance_to(cti)`` is called after the events of a CTI step; ``cti`` never decreases;
  ``cti == CTI_INFINITY`` flushes everything (final bins, last counts, timed-out matches).
* ``snapshot()`` returns bytes from which ``restore(settings, data)`` rebuilds an operator
  that behaves identically; it is called once per micro-batch per key group.
* Outputs are plain dicts shaped like the Avro schema of their role (see ``schemas/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from operators.errors import EventRejected
from operators.events import Event, Output  # noqa: F401 - Output is re-exported here


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


@runtime_checkable
class Operator(Protocol):
    #: True when the operator itself accounts for the dropped share of ADJUSTed events
    #: (the binner does); otherwise the time layer writes a late record for them.
    handles_adjust: bool

    def process(self, event: Event) -> list[Output]: ...

    def advance_to(self, cti: int) -> list[Output]: ...

    def snapshot(self) -> bytes: ...

    @classmethod
    def restore(cls, settings: Any, data: bytes) -> "Operator": ...

    # Optional: ``live_keys()`` → the keys the operator keeps state for (progress reports them).
    # Optional: ``next_due()`` → the smallest CTI at which ``advance_to`` could emit or change
    # state that matters (a window closing, a bin becoming final, a run timing out); until
    # then the runtime may skip ``advance_to`` and leave the operator as bytes in the state store
    # (:mod:`jobs.runtime`). It must never be later than the first CTI that would change an
    # output; :data:`~operators.events.CTI_INFINITY` means "only events change me". An operator
    # without it is advanced every micro-batch.
    # Optional: ``partition(where)`` → ``{part: operator}``: the keys split by ``where(key)`` into
    # operators of the same settings (operator-wide clocks copied), each with exactly its keys'
    # state; the runtime splits a state chunk with it when chunks grow. Without it, an operator's
    # keys all stay in one chunk.
    # Optional: ``fields_read(settings)`` (a classmethod) → the only record fields the operator
    # reads of an event (``Event.fields`` / the field columns); the reorder buffer then stores
    # just those of the events it holds (:class:`operators.columns.ColumnTimeLayer`). Without
    # it, any field may be read and all are kept. An operator with it must also have
    # ``needs_records(settings, columns)`` (a classmethod) → True when a row of ``columns`` may
    # be refused or otherwise have its whole record read (a refusal's dead letter and a late
    # record carry every field): the buffer is then stored whole.
    # Optional: ``forget(key)`` drops everything the operator keeps for ``key`` (the job's key
    # TTL, ``state.ttl``: a key with no event for that long in application time). Operators
    # whose state the CTI bounds anyway (bins) need not implement it.
