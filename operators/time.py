"""Application time: CTIs, event shapes, violation policies, CTI generation and the reorder buffer.

StreamInsight's time model (seeds/streaminsight-application-time-advance.de.txt): a CTI with
timestamp ``t`` promises that no later event of the stream starts before ``t``. Results are
final only for the part of the timeline before the CTI. Only event timestamps matter, never
the host's clock. Times are integers (milliseconds of application time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

#: The final CTI of a bounded input ("+∞"): flushes every operator. Fits an Avro long.
CTI_INFINITY = 2**62
#: Before any CTI: nothing is late yet.
CTI_NONE = -(2**62)


class Shape(str, Enum):
    """Event shapes. A point lives for one tick [t, t+1); an edge lives from its start until
    the next version of its key (its end is unknown, i.e. +∞, while it is current)."""

    POINT = "point"
    INTERVAL = "interval"
    EDGE = "edge"


class ViolationPolicy(str, Enum):
    """What happens to an event older than the stream's current CTI (StreamInsight's
    ``AdvanceTimePolicy``)."""

    DROP = "drop"
    ADJUST = "adjust"


@dataclass(frozen=True, slots=True)
class Event:
    """One input event as the operators see it.

    ``start``/``end`` are application time (ms); a point event has ``end == start``; an edge
    event has ``end == CTI_INFINITY``. ``partition``/``offset`` break ties between events with
    the same start so the processing order is a function of the input alone.
    ``original_start`` is set when the ADJUST policy moved ``start`` to the CTI.
    """

    key: str
    start: int
    end: int
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    partition: int = 0
    offset: int = 0
    stream: str = "events"
    original_start: int | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        """Application-time order: start, then partition, then offset."""
        return (self.start, self.partition, self.offset)
