"""The identity operator: every released event comes out unchanged, in application-time order."""

from __future__ import annotations

from typing import Any

from operators.events import CTI_INFINITY, Event, Output, OutputBatch


class Passthrough:
    """Stateless: output role ``passthrough``, the event's fields and its original bytes
    (the sink writes those bytes as they are when the topic's schema matches)."""

    handles_adjust = False

    def __init__(self, settings: Any = None):
        self.settings = settings

    def process(self, event: Event) -> list[Output]:
        return [Output("passthrough", event.fields, event.raw)]

    def pass_columns(self, cols) -> OutputBatch:
        """:meth:`process` for every row of ``cols`` (:class:`operators.columns.EventColumns`
        with one record layout, no ``dicts``) at once, in row order: the rows' records and
        original bytes, each keyed as ``process``'s record would be (its ``key`` field if the
        record has one, else the event's key). Stateless, so one call serves every chunk."""
        keys = cols.key
        if "key" in cols.fields:
            keys = [None if k is None else str(k) for k in cols.fields["key"].tolist()]
        return OutputBatch("passthrough", cols.fields, len(cols), raw=cols.raw, keys=keys)

    def advance_to(self, cti: int) -> list[Output]:
        return []

    def next_due(self) -> int:
        return CTI_INFINITY  # stateless: only events make it emit

    def live_keys(self) -> set[str]:
        return set()

    def partition(self, where) -> dict[int, "Passthrough"]:
        return {}  # no keys

    def snapshot(self) -> bytes:
        return b""

    @classmethod
    def restore(cls, settings: Any, data: bytes) -> "Passthrough":
        return cls(settings)
