"""Application time: CTIs, event shapes, violation policies, per-partition CTIs and how CTIs combine.

StreamInsight's time model (seeds/streaminsight-application-time-advance.de.txt): a CTI with
timestamp ``t`` promises that no later event of the stream starts before ``t``. Results are
final only for the part of the timeline before the CTI. Only event timestamps matter, never
the host's clock. Times are integers (milliseconds of application time); StreamInsight's
"tick" is one unit here, so its ``TimeSpan.FromTicks(-1)`` delay is ``delay=-1``.

The pieces:

* :class:`AdvanceTimeSettings` (with :class:`Frequency`) — per input stream: how CTIs are
  generated (``delay``, ``frequency``, ``flush_at_end``), whether they are imported from
  another stream (``import_from``) and what happens to an event behind the CTI (``policy``).
* :class:`PartitionCtis` / :func:`combined_cti` — a Kafka stream's CTI from its partitions'.
* :func:`late_record` — the one shape of the late topic's records.
* :func:`merge_ctis` / :func:`imported_cti` / :func:`effective_ctis` — how CTIs combine:
  joins and unions release at the *older* CTI of their inputs; a stream that imports takes
  the CTIs of the stream it names.

The job's reorder buffers are columns (:mod:`ctiflow.operators.columns`); StreamInsight's model event
by event (CTI generation, the row reorder buffer and time layer) is the reference they are
tested against, in ``jobs/testing/time_layer.py``.

Event time of an event ("sync time"): its ``start``, except for an *end edge*
(``edge_end=True``), which takes effect at its ``end``. A CTI ``c`` is violated by an event
whose sync time is ``< c`` (seed: point, interval and edge-start events must start at or after
the CTI; edge-end events must end at or after it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ctiflow.operators.errors import ConfigError, invalid_choice
from ctiflow.operators.events import (CTI_INFINITY, CTI_NONE, Cti, Event, Output,  # noqa: F401 - re-exported
                                      outputs_of)

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


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Frequency:
    """How often a CTI is generated: after every ``events`` events and/or every ``duration`` of
    application time (ms). Either condition generates a CTI and restarts both counts.

    Only events that take effect at their start count: end edges count neither as events nor
    as application time (seed: "only start edges are considered, for a count and for a
    duration")."""

    events: int | None = None
    duration: int | None = None

    def __post_init__(self) -> None:
        if self.events is None and self.duration is None:
            raise ConfigError(
                "frequency: neither events nor duration is set; give events (a CTI after every "
                "N events, N >= 1) and/or duration (a CTI after every T ms of application time)"
            )
        if self.events is not None and (not _is_int(self.events) or self.events < 1):
            raise ConfigError(
                f"frequency.events must be an integer >= 1 (got {self.events!r}); "
                "use 1 for a CTI after each event"
            )
        if self.duration is not None and (not _is_int(self.duration) or self.duration < 1):
            raise ConfigError(
                f"frequency.duration must be an integer number of ms >= 1 (got {self.duration!r}); "
                "omit it to generate CTIs by event count only"
            )


@dataclass(frozen=True, slots=True)
class AdvanceTimeSettings:
    """How one input stream's application time advances (StreamInsight's
    ``AdvanceTimeSettings`` = ``AdvanceTimeGenerationSettings`` + ``AdvanceTimeImportSettings``
    + ``AdvanceTimePolicy``).

    * ``delay``: a generated CTI is ``latest start seen − delay`` — the grace period for
      out-of-order events. Negative is allowed: ``-1`` commits the latest event at once.
    * ``frequency``: when CTIs are generated; ``None`` = no generation (CTIs are imported or
      enqueued explicitly as :class:`Cti`, e.g. from the Spark watermark).
    * ``flush_at_end``: a final CTI at +∞ (:data:`CTI_INFINITY`) when the input ends.
    * ``policy``: what happens to an event behind the stream's CTI.
    * ``import_from``: take the CTIs of the named stream as well (StreamInsight's
      ``AdvanceTimeImportSettings``); with a ``frequency`` too, the stream's CTI is the newer
      of its own and the imported one. Its own events behind the imported CTI are violations:
      the ``policy`` applies (ADJUST on an edge = the version takes effect from the CTI on).
    """

    delay: int = 0
    frequency: Frequency | None = Frequency(events=1)
    flush_at_end: bool = True
    policy: ViolationPolicy = ViolationPolicy.DROP
    import_from: str | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.delay) or abs(self.delay) >= CTI_INFINITY:
            raise ConfigError(
                f"delay must be an integer number of ms (got {self.delay!r}); "
                "e.g. 5000 for a 5 s grace period, -1 to commit each event at once"
            )
        if self.frequency is not None and not isinstance(self.frequency, Frequency):
            raise ConfigError(
                f"frequency must be a Frequency or None (got {self.frequency!r}); "
                "e.g. Frequency(events=10) or Frequency(duration=5000)"
            )
        if not isinstance(self.flush_at_end, bool):
            raise ConfigError(f"flush_at_end must be true or false (got {self.flush_at_end!r})")
        try:
            policy = ViolationPolicy(self.policy)
        except ValueError:
            raise invalid_choice("policy", self.policy, (p.value for p in ViolationPolicy)) from None
        object.__setattr__(self, "policy", policy)
        if self.import_from is not None and (
            not isinstance(self.import_from, str) or not self.import_from
        ):
            raise ConfigError(
                f"import_from must be the name of another input stream or None "
                f"(got {self.import_from!r})"
            )

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "AdvanceTimeSettings":
        """Build from a configuration mapping, e.g. ``{"delay": 5000, "frequency": {"events":
        10}, "flush_at_end": true, "policy": "adjust", "import_from": null}``; unknown keys are
        errors. ``frequency: null`` disables generation."""
        known = {"delay", "frequency", "flush_at_end", "policy", "import_from"}
        unknown = set(config) - known
        if unknown:
            raise ConfigError(
                f"unknown advance-time setting(s) {sorted(unknown)}; valid keys are {sorted(known)}"
            )
        kwargs: dict[str, Any] = {k: v for k, v in config.items() if k != "frequency"}
        if "frequency" in config:
            freq = config["frequency"]
            if freq is None or isinstance(freq, Frequency):
                kwargs["frequency"] = freq
            elif isinstance(freq, Mapping):
                bad = set(freq) - {"events", "duration"}
                if bad:
                    raise ConfigError(
                        f"unknown frequency setting(s) {sorted(bad)}; valid keys are "
                        "['duration', 'events']"
                    )
                kwargs["frequency"] = Frequency(**freq)
            else:
                raise ConfigError(
                    f"frequency must be a mapping like {{events: 10}} or {{duration: 5000}} "
                    f"(got {freq!r})"
                )
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Per-partition CTIs
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class PartitionCtis:
    """One input stream's CTI from the CTIs of its Kafka partitions, combined by **min**.

    Each partition ``p`` has its own CTI ``frontier[p] − delay`` (``frontier[p]``: the largest
    start read from ``p`` so far); the stream's CTI is the minimum over the partitions that are
    not idle, and never goes back. So an event that is within the delay of the events before
    it *in its own partition* is never behind the stream's CTI, whatever the partitions'
    relative rates, lag, read order or micro-batch cut — one global ``max(start) − delay`` (a
    single Spark watermark) declares the slower partition's in-order events late.

    Flink's Kafka source does the same (per-split watermarks combined by min; ``withIdleness``
    drops an idle split from the min). StreamInsight has no partitions: its CTI is this
    stream's CTI.

    * ``partitions``: the stream's partitions; ``idle``: those the source declared idle (no new
      records for ``idle_timeout`` of processing time, or none at all yet: an empty partition
      is idle from the start). Both come with each micro-batch (:meth:`assign`).
    * A non-idle partition with no frontier yet holds the CTI back (its records are coming).
    * If every partition is idle the CTI stays where it is.

    Invariant: :attr:`cti` is monotone and ``≤ frontier[p] − delay`` for every partition that
    was not idle when the CTI was computed.
    """

    delay: int
    frontier: dict[int, int] = field(default_factory=dict)
    partitions: frozenset[int] = frozenset()
    idle: frozenset[int] = frozenset()
    cti: int = CTI_NONE

    def observe(self, partition: int, start: int) -> None:
        """Records of ``partition`` up to event time ``start`` were read."""
        if start > self.frontier.get(partition, CTI_NONE):
            self.frontier[partition] = start

    def assign(self, partitions: Iterable[int], idle: Iterable[int]) -> None:
        """The stream's partitions and which of them are idle, as of this micro-batch."""
        self.partitions = frozenset(partitions)
        self.idle = frozenset(idle)

    @property
    def all_idle(self) -> bool:
        return not (self.partitions - self.idle)

    def advance(self) -> int:
        """Recompute the CTI from the frontiers of the non-idle partitions; returns it."""
        active = self.partitions - self.idle
        if active and all(p in self.frontier for p in active):
            self.cti = max(self.cti, min(self.frontier[p] for p in active) - self.delay)
        return self.cti

    def snapshot(self) -> tuple:
        return (self.delay, dict(self.frontier), sorted(self.partitions), sorted(self.idle), self.cti)

    @classmethod
    def restore(cls, data: tuple) -> "PartitionCtis":
        delay, frontier, partitions, idle, cti = data
        return cls(delay, dict(frontier), frozenset(partitions), frozenset(idle), cti)


def combined_cti(streams: Mapping[str, PartitionCtis]) -> int:
    """The CTI of several watermarked streams: the **min** of their CTIs (a join releases at
    the older CTI). A stream that has no CTI yet holds it back, unless every one of its
    partitions is idle (it has never had data: like Spark, it does not hold back the others)."""
    ctis = [s.cti for s in streams.values() if not (s.cti <= CTI_NONE and s.all_idle)]
    return min(ctis) if ctis else CTI_NONE


# ---------------------------------------------------------------------------------------------
# Late records and the reorder buffer
# ---------------------------------------------------------------------------------------------

#: Reasons written into late records (``record["reason"]``).
REASON_DROPPED = "drop: start before CTI"
REASON_BEFORE_CTI = "adjust: lifetime ends before CTI"
REASON_ADJUSTED = "adjust: start moved to CTI"
REASON_EDGE_END = "edge end before CTI"


def late_record(event: Event, cti: int, reason: str, policy: ViolationPolicy | str) -> "Output":
    """The record for the job's ``late`` topic: the event as it arrived, the CTI it violated
    and why. Every operator that drops (a share of) an event builds it with this function, so
    the topic has one shape."""
    return Output(
        role="late",
        record={
            "stream": event.stream,
            "key": event.key,
            "start": event.start,
            "end": event.end,
            "cti": cti,
            "reason": reason,
            "policy": ViolationPolicy(policy).value,
            "partition": event.partition,
            "offset": event.offset,
            "fields_json": json.dumps(event.fields, default=str, sort_keys=True),
        },
    )


def event_tuple(e: Event) -> tuple:
    """An event as a plain tuple (``Event(*t)`` rebuilds it): compact to pickle in snapshots."""
    return (e.key, e.start, e.end, e.fields, e.partition, e.offset, e.stream, e.original_start,
            e.edge_end, e.raw)


# ---------------------------------------------------------------------------------------------
# Combining CTIs: joins, unions, import
# ---------------------------------------------------------------------------------------------


def merge_ctis(ctis: Mapping[str, int]) -> int:
    """The CTI of a join or union of the given inputs: the *older* (minimum) of their CTIs —
    the result is final only where every input is. No inputs: :data:`CTI_NONE`."""
    return min(ctis.values(), default=CTI_NONE)


def imported_cti(stream: str, settings: Mapping[str, AdvanceTimeSettings],
                 own_ctis: Mapping[str, int]) -> int:
    """The effective CTI of ``stream``: its own CTI (generated or enqueued), raised to the
    effective CTI of the stream it imports from (``import_from``, followed transitively).

    A stream that imports treats its own events behind the imported CTI as violations: its
    ``policy`` applies — DROP sends them to ``late``; ADJUST lets an edge or interval that
    still reaches past the CTI take effect from the CTI on (plus a late record for the cut
    share). That is what makes a silent reference stream advance with the fast stream."""
    seen: list[str] = []
    best = CTI_NONE
    current: str | None = stream
    while current is not None:
        if current in seen:
            raise ConfigError(
                f"import_from forms a cycle: {' -> '.join(seen + [current])}; "
                "at least one stream must generate its own CTIs"
            )
        if current not in settings:
            raise ConfigError(
                f"stream {seen[-1]!r} imports CTIs from unknown stream {current!r}; "
                f"import_from must be one of {sorted(settings)}"
            )
        seen.append(current)
        best = max(best, own_ctis.get(current, CTI_NONE))
        current = settings[current].import_from
    return best


def effective_ctis(settings: Mapping[str, AdvanceTimeSettings],
                   own_ctis: Mapping[str, int]) -> dict[str, int]:
    """:func:`imported_cti` for every stream."""
    return {s: imported_cti(s, settings, own_ctis) for s in settings}
