"""The identity operator: every released event comes out unchanged, in application-time order."""

from __future__ import annotations

from typing import Any

from ctiflow.operators.events import CTI_INFINITY, Event, Output, OutputBatch
from ctiflow.operators.operator import Operator, Traits, process_rows


class Passthrough(Operator):
    """Stateless: output role ``passthrough``, the event's fields and its original bytes
    (the sink writes those bytes as they are when the topic's schema matches)."""

    def __init__(self, settings: Any = None):
        super().__init__(settings)

    def process_columns(self, cols) -> list[tuple[int, Any]]:
        """Every row of ``cols``, in row order: one :class:`OutputBatch` of the rows' records and
        original bytes (at row 0), each keyed by its ``key`` field if the record has one, else by
        the event's key. Rows whose records differ in their fields (``cols.dicts``) come one
        :class:`Output` each."""
        if cols.dicts is not None:
            return process_rows(_passed, range(len(cols)), cols.events())
        if not len(cols):
            return []
        keys = cols.key
        if "key" in cols.fields:
            keys = [None if k is None else str(k) for k in cols.fields["key"].tolist()]
        return [(0, OutputBatch("passthrough", cols.fields, len(cols), raw=cols.raw, keys=keys))]

    def advance_to(self, cti: int) -> list[Output]:
        return []

    def next_due(self) -> int:
        return CTI_INFINITY  # stateless: only events make it emit

    def live_keys(self) -> set[str]:
        return set()

    @classmethod
    def traits(cls, settings: Any) -> Traits:
        return Traits(state="none", partitions=True)

    def partition(self, where) -> dict[int, "Passthrough"]:
        return {}  # no keys

    def snapshot(self) -> bytes:
        return b""

    @classmethod
    def restore(cls, settings: Any, data: bytes) -> "Passthrough":
        return cls(settings)


def _passed(event: Event) -> list[Output]:
    return [Output("passthrough", event.fields, event.raw)]
