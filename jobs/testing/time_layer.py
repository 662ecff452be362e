"""StreamInsight's application time event by event: the row model of the time layer, kept as
the reference the job's column time layer (:class:`ctiflow.operators.columns.ColumnTimeLayer`) is tested
against (a property test: the same releases and late records for the same arrivals and CTIs),
and as the pure driver the oracles and docs examples use (:meth:`TimeLayer.run`). Never imported
by the data path.

* :class:`CtiGenerator` — turns the arrival sequence of one stream into CTIs (``frequency``).
* :class:`ReorderBuffer` — checks each event against the stream's CTI (the violation policy;
  late events become :func:`ctiflow.operators.time.late_record` outputs) and releases admitted events in
  application-time order once the CTI has passed them; end edges take effect at their ``end``.
* :class:`TimeLayer` — all of the above for the input streams of one job, CTIs combined by
  :func:`ctiflow.operators.time.imported_cti` and :func:`ctiflow.operators.time.merge_ctis`.
* :func:`run_reference_sync` — a reference-sync job's pure model: the time layer feeding a
  :class:`ctiflow.operators.reference.ReferenceJoin`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from ctiflow.operators import snapshots
from ctiflow.operators.errors import ConfigError
from ctiflow.operators.events import CTI_INFINITY, CTI_NONE, Cti, Event, Output, outputs_of
from ctiflow.operators.reference import ReferenceJoin, ReferenceJoinSettings
from ctiflow.operators.time import (REASON_ADJUSTED, REASON_BEFORE_CTI, REASON_DROPPED, REASON_EDGE_END,
                            AdvanceTimeSettings, ViolationPolicy, effective_ctis, event_tuple, imported_cti,
                            late_record, merge_ctis)


# ---------------------------------------------------------------------------------------------
# CTI generation
# ---------------------------------------------------------------------------------------------


def _clamp(t: int) -> int:
    return max(CTI_NONE, min(CTI_INFINITY, t))


class CtiGenerator:
    """Generates one stream's CTIs from its arrival sequence, as StreamInsight's
    ``AdvanceTimeGenerationSettings`` do.

    After every ``frequency.events`` events, or once the latest start seen has advanced by
    ``frequency.duration`` since the previous CTI (since the first event for the first CTI),
    a CTI is *due*; its timestamp is ``latest start seen − delay`` (the latest = the maximum,
    so an out-of-order arrival never pulls it back). A due CTI is emitted only if it is newer
    than the previous one: CTIs never decrease. End edges are ignored entirely. Every observed
    event counts, also one that turns out to be late.

    Invariant: ``observe`` returns strictly increasing values; ``flush`` returns
    :data:`CTI_INFINITY` once (if ``flush_at_end``)."""

    __slots__ = ("settings", "_count", "_anchor", "_latest", "_last")

    def __init__(self, settings: AdvanceTimeSettings) -> None:
        if settings.frequency is None:
            raise ConfigError(
                "CtiGenerator needs settings.frequency; set frequency (e.g. {events: 1}) or "
                "import CTIs with import_from"
            )
        self.settings = settings
        self._count = 0
        self._anchor: int | None = None
        self._latest: int | None = None
        self._last = CTI_NONE

    @property
    def last_cti(self) -> int:
        """The newest CTI emitted so far (:data:`CTI_NONE` before the first)."""
        return self._last

    def observe(self, event: Event) -> int | None:
        """Count one arriving event; return the new CTI if one is due after it (the event
        itself is enqueued *before* that CTI)."""
        if event.edge_end:
            return None
        freq = self.settings.frequency
        assert freq is not None
        self._count += 1
        if self._latest is None or event.start > self._latest:
            self._latest = event.start
        if self._anchor is None:
            self._anchor = event.start
        due = (freq.events is not None and self._count >= freq.events) or (
            freq.duration is not None and self._latest - self._anchor >= freq.duration
        )
        if not due:
            return None
        self._count = 0
        self._anchor = self._latest
        candidate = _clamp(self._latest - self.settings.delay)
        if candidate <= self._last:
            return None
        self._last = candidate
        return candidate

    def flush(self) -> int | None:
        """The final CTI when the input ends: :data:`CTI_INFINITY` if ``flush_at_end``."""
        if not self.settings.flush_at_end or self._last >= CTI_INFINITY:
            return None
        self._last = CTI_INFINITY
        return CTI_INFINITY

    def snapshot(self) -> bytes:
        return pickle.dumps((self._count, self._anchor, self._latest, self._last), protocol=5)

    @classmethod
    def restore(cls, settings: AdvanceTimeSettings, data: bytes) -> "CtiGenerator":
        gen = cls(settings)
        gen._count, gen._anchor, gen._latest, gen._last = snapshots.loads(data)
        return gen



def _lifetime_end(event: Event) -> int:
    """Exclusive end of an event's lifetime: a point lives [t, t+1)."""
    return max(event.end, event.start + 1)


def _order_key(event: Event) -> tuple:
    """Application-time order: sync time, partition, offset; ties beyond those — only possible
    with duplicated offsets — by key, start and end, then arrival (the sort is stable)."""
    return (event.end if event.edge_end else event.start, event.partition, event.offset, event.key,
            event.start, event.end)



class ReorderBuffer:
    """Holds one stream's admitted events until the CTI passes them, then releases them in
    application-time order (sync time, partition, offset).

    ``offer`` applies the violation policy against the current CTI ``c``:

    * sync time ``>= c``: admitted (buffered), no output;
    * DROP, sync time ``< c``: a late record (:data:`REASON_DROPPED`);
    * ADJUST, lifetime reaching past ``c`` (an interval with ``end > c``, an edge start):
      ``start := c`` (``original_start`` keeps the old one) and admitted; unless
      ``handles_adjust``, a late record (:data:`REASON_ADJUSTED`) also reports the dropped
      share ``[start, c)``. Wholly before ``c`` (a point at ``t < c`` lives ``[t, t+1)``,
      so always): a late record (:data:`REASON_BEFORE_CTI`);
    * an end edge with ``end < c``: a late record under both policies
      (:data:`REASON_EDGE_END`) — its lifetime lies wholly before the CTI.

    ``advance(c)`` releases every buffered event with sync time ``< c``: an event *at* ``c``
    waits, since an event with the same time and a lower partition/offset may still arrive.

    Invariant: everything released has sync time ``<`` the CTI, everything buffered has sync
    time ``>=`` the CTI it was admitted under, so the concatenation of all releases is in
    application-time order and ``released + late = offered``.

    Layout: admitted events are appended to ``_arrived``; a release sorts them into ``_held``
    (kept sorted: one stable sort of a sorted run plus the new arrivals, which Python's sort
    merges in linear time) and cuts ``_held`` at the limit. A micro-batch admits many events and
    releases once, so this beats a heap push and pop per event."""

    __slots__ = ("policy", "handles_adjust", "_cti", "_held", "_arrived")

    def __init__(self, policy: ViolationPolicy | str = ViolationPolicy.DROP,
                 handles_adjust: bool = False) -> None:
        self.policy = ViolationPolicy(policy)
        self.handles_adjust = handles_adjust
        self._cti = CTI_NONE
        self._held: list[Event] = []     # sorted by _order_key
        self._arrived: list[Event] = []  # admitted since the last sort, in arrival order

    @property
    def cti(self) -> int:
        return self._cti

    def __len__(self) -> int:
        return len(self._held) + len(self._arrived)

    def _sorted(self) -> list[Event]:
        if self._arrived:
            self._held.extend(self._arrived)
            self._arrived = []
            self._held.sort(key=_order_key)
        return self._held

    def earliest(self) -> int | None:
        """Sync time of the oldest buffered event, or None when empty."""
        held = self._sorted()
        return held[0].sync_time if held else None

    def offer(self, event: Event) -> list["Output"]:
        """Admit ``event`` or report it late (see the class docstring)."""
        cti = self._cti
        if (event.end if event.edge_end else event.start) >= cti:  # the common case
            self._arrived.append(event)
            return []
        return self._late(event, cti)

    def offer_many(self, events: list[Event]) -> list[tuple[Event, list["Output"]]]:
        """:meth:`offer` for many events (in arrival order); → ``(event, late records)`` for
        each event that has late records, in arrival order."""
        cti = self._cti
        if all((e.end if e.edge_end else e.start) >= cti for e in events):
            self._arrived.extend(events)
            return []
        out = []
        for e in events:
            late = self.offer(e)
            if late:
                out.append((e, late))
        return out

    def _late(self, event: Event, cti: int) -> list["Output"]:
        if event.edge_end:
            return [late_record(event, cti, REASON_EDGE_END, self.policy)]
        if self.policy is ViolationPolicy.DROP:
            return [late_record(event, cti, REASON_DROPPED, self.policy)]
        if _lifetime_end(event) <= cti:
            return [late_record(event, cti, REASON_BEFORE_CTI, self.policy)]
        original = event.original_start if event.original_start is not None else event.start
        self._arrived.append(replace(event, start=cti, original_start=original))
        if self.handles_adjust:
            return []
        return [late_record(event, cti, REASON_ADJUSTED, self.policy)]

    def advance(self, cti: int, release_upto: int | None = None) -> list[Event]:
        """Set the CTI (a value not above the current one is ignored) and release, in order,
        the buffered events with sync time below ``min(cti, release_upto)``.
        ``release_upto`` lets a caller that merges several streams (joins, unions) check
        violations against this stream's CTI but release only up to the merged one.
        ``CTI_INFINITY`` releases everything."""
        if cti > self._cti:
            self._cti = cti
        return self.release_before(self._cti if release_upto is None else min(self._cti, release_upto))

    def release_before(self, limit: int) -> list[Event]:
        """Release, in order, the buffered events with sync time below ``limit`` without
        moving the CTI. Precondition (the caller's promise): the next CTI will be at least
        ``limit`` — then every event admitted later has sync time ``>= limit`` and the
        release order stays application-time order. ``CTI_INFINITY`` releases everything."""
        held = self._sorted()
        if limit >= CTI_INFINITY:
            self._held = []
            return held
        cut = bisect.bisect_left(held, limit, key=_sync_time)
        if cut == 0:
            return []
        out = held[:cut]
        del held[:cut]
        return out

    def snapshot(self) -> bytes:
        """Compact state: the CTI and the buffered events as plain tuples — those already in
        order, then those admitted since (nothing is sorted to take a snapshot)."""
        return pickle.dumps((self._cti, [event_tuple(e) for e in self._held],
                             [event_tuple(e) for e in self._arrived]), protocol=5)

    @classmethod
    def restore(cls, policy: ViolationPolicy | str, data: bytes,
                handles_adjust: bool = False) -> "ReorderBuffer":
        buf = cls(policy, handles_adjust)
        cti, *events = snapshots.loads(data)
        buf._cti = cti
        if len(events) == 2:
            buf._held = [Event(*t) for t in events[0]]
            buf._arrived = [Event(*t) for t in events[1]]
        else:  # a snapshot of the heap layout: in heap order, sorted by the next release
            buf._arrived = [Event(*t) for t in events[0]]
        return buf


def _sync_time(event: Event) -> int:
    return event.end if event.edge_end else event.start


# ---------------------------------------------------------------------------------------------
# The time layer: all input streams of one job
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CtiStep:
    """One advance of the merged CTI: the events it released (application-time order across
    streams) and, when the driver feeds an operator, that operator's outputs."""

    cti: int
    released: tuple[Event, ...] = ()
    outputs: tuple["Output", ...] = ()


@dataclass(slots=True)
class TimeLayerRun:
    """What :meth:`TimeLayer.run` produced."""

    steps: list[CtiStep]
    late: list["Output"]

    @property
    def released(self) -> list[Event]:
        return [e for s in self.steps for e in s.released]

    @property
    def outputs(self) -> list["Output"]:
        return [o for s in self.steps for o in s.outputs]

    @property
    def ctis(self) -> list[int]:
        return [s.cti for s in self.steps]


_stream_of = attrgetter("stream")


def _merge_key(e: Event, rank: int) -> tuple:
    return (e.sync_time, rank, e.partition, e.offset, e.key, e.start, e.end)


class TimeLayer:
    """Per input stream a :class:`ReorderBuffer` with the stream's policy and, if it has a
    ``frequency``, a :class:`CtiGenerator`; CTIs combine by :func:`imported_cti` per stream and
    :func:`merge_ctis` across streams.

    Use: ``offer`` each arriving event (returns late records; a generated CTI becomes
    *pending*), ``enqueue_cti`` explicit CTIs (pending too), ``step()`` to apply the pending
    CTIs and release, ``flush()`` at the end of input. Events are checked against their
    stream's *effective* CTI as of the last ``step`` and released at the *merged* CTI, in
    application-time order across streams (ties at equal sync time: streams in the order of
    ``settings``, then partition, then offset).

    StreamInsight applies a CTI at once (``step`` after every arrival); Spark applies the
    watermark at micro-batch boundaries (``step`` once per batch). For events that arrive
    within the delay the released sequence is the same either way."""

    def __init__(self, settings: Mapping[str, AdvanceTimeSettings],
                 handles_adjust: bool = False) -> None:
        if not settings:
            raise ConfigError("TimeLayer needs at least one input stream's AdvanceTimeSettings")
        self.settings: dict[str, AdvanceTimeSettings] = dict(settings)
        self.handles_adjust = handles_adjust
        for name in self.settings:
            imported_cti(name, self.settings, {})  # validates import_from (unknown, cycles)
        self._rank = {name: i for i, name in enumerate(self.settings)}
        self._buffers = {n: ReorderBuffer(s.policy, handles_adjust) for n, s in self.settings.items()}
        self._generators = {
            n: CtiGenerator(s) for n, s in self.settings.items() if s.frequency is not None
        }
        self._own = {n: CTI_NONE for n in self.settings}  # applied
        self._pending: dict[str, int] = {}  # generated/enqueued, not yet applied
        self._effective = {n: CTI_NONE for n in self.settings}
        self._merged = CTI_NONE

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(self.settings)

    def cti(self, stream: str | None = None) -> int:
        """The effective CTI of ``stream``, or the merged CTI of the layer."""
        return self._merged if stream is None else self._effective[self._check(stream)]

    def buffered(self) -> int:
        """Number of events held back (state size)."""
        return sum(len(b) for b in self._buffers.values())

    def _check(self, stream: str) -> str:
        if stream not in self.settings:
            raise ConfigError(
                f"event or CTI for unknown stream {stream!r}; configured input streams are "
                f"{sorted(self.settings)} (Event.stream must name one of them)"
            )
        return stream

    def _propose(self, stream: str, cti: int) -> None:
        if cti > max(self._own[stream], self._pending.get(stream, CTI_NONE)):
            self._pending[stream] = cti

    def offer(self, event: Event) -> list["Output"]:
        """Check ``event`` against its stream's effective CTI, buffer it or report it late;
        then count it for CTI generation (a generated CTI is pending until ``step``)."""
        stream = self._check(event.stream)
        late = self._buffers[stream].offer(event)
        gen = self._generators.get(stream)
        if gen is not None:
            cti = gen.observe(event)
            if cti is not None:
                self._propose(stream, cti)
        return late

    def offer_many(self, events: list[Event]) -> list[tuple[Event, list["Output"]]]:
        """:meth:`offer` for many events (in arrival order); → ``(event, late records)`` for
        each event that has late records, in arrival order."""
        out: list[tuple[Event, list[Output]]] = []
        if self._generators:  # CTI generation counts event by event
            for e in events:
                late = self.offer(e)
                if late:
                    out.append((e, late))
            return out
        for stream, run in itertools.groupby(events, key=_stream_of):
            out.extend(self._buffers[self._check(stream)].offer_many(list(run)))
        return out

    def enqueue_cti(self, cti: Cti) -> None:
        """An explicit CTI for one stream (pending until ``step``; a non-advancing one is
        ignored)."""
        self._propose(self._check(cti.stream), cti.time)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def step(self) -> CtiStep:
        """Apply the pending CTIs and release what the merged CTI has passed."""
        for stream, cti in self._pending.items():
            self._own[stream] = max(self._own[stream], cti)
        self._pending.clear()
        self._effective = effective_ctis(self.settings, self._own)
        self._merged = max(self._merged, merge_ctis(self._effective))
        runs = []
        for stream, buf in self._buffers.items():
            released = buf.advance(self._effective[stream], release_upto=self._merged)
            if released:
                runs.append((self._rank[stream], released))
        if not runs:
            merged: tuple[Event, ...] = ()
        elif len(runs) == 1:
            merged = tuple(runs[0][1])
        else:
            keyed = [[(_merge_key(e, rank), e) for e in released] for rank, released in runs]
            merged = tuple(e for _, e in heapq.merge(*keyed, key=lambda pair: pair[0]))
        return CtiStep(self._merged, merged)

    def flush(self) -> CtiStep:
        """End of input: :data:`CTI_INFINITY` for every stream with ``flush_at_end``, then
        ``step``."""
        for name, s in self.settings.items():
            if s.flush_at_end:
                gen = self._generators.get(name)
                if gen is not None:
                    gen.flush()
                self._propose(name, CTI_INFINITY)
        return self.step()

    def run(self, arrivals: Iterable[Event | Cti], cuts: Sequence[int] | None = None,
            operator: Any = None, flush: bool = True) -> TimeLayerRun:
        """Pure driver: feed ``arrivals`` (events and explicit CTIs, in arrival order).

        ``cuts=None``: every CTI takes effect right after the arrival that produced it
        (StreamInsight). Otherwise ``cuts`` are the arrival indices at which a new micro-batch
        begins, and the CTIs of a batch take effect at its end (Spark). With ``flush`` the
        input ends with :meth:`flush`. With an ``operator``, each step's released events go to
        ``operator.process`` and the new CTI to ``operator.advance_to``; their outputs are in
        the step. Steps that do not advance the merged CTI are left out."""
        adjust = None if operator is None else operator.traits(operator.settings).handles_adjust
        if operator is not None and adjust != self.handles_adjust:
            for buf in self._buffers.values():
                buf.handles_adjust = adjust
            self.handles_adjust = adjust
        cut_set = set(cuts) if cuts is not None else None
        steps: list[CtiStep] = []
        late: list[Output] = []

        def take(step: CtiStep) -> None:
            if steps and step.cti == steps[-1].cti and not step.released:
                return
            if not steps and step.cti == CTI_NONE and not step.released:
                return
            if operator is not None:
                outs: list[Output] = []
                for e in step.released:
                    outs.extend(operator.process(e))
                outs.extend(outputs_of(operator.advance_to(step.cti)))
                step = CtiStep(step.cti, step.released, tuple(outs))
            steps.append(step)

        for i, item in enumerate(arrivals):
            if cut_set is not None and i in cut_set and self.has_pending:
                take(self.step())
            if isinstance(item, Cti):
                self.enqueue_cti(item)
            else:
                late.extend(self.offer(item))
            if cut_set is None and self.has_pending:
                take(self.step())
        if self.has_pending:
            take(self.step())
        if flush:
            take(self.flush())
        return TimeLayerRun(steps, late)

    def snapshot(self) -> bytes:
        return pickle.dumps(
            (
                {n: b.snapshot() for n, b in self._buffers.items()},
                {n: g.snapshot() for n, g in self._generators.items()},
                self._own,
                self._pending,
                self._merged,
            ),
            protocol=5,
        )

    @classmethod
    def restore(cls, settings: Mapping[str, AdvanceTimeSettings], data: bytes,
                handles_adjust: bool = False) -> "TimeLayer":
        layer = cls(settings, handles_adjust)
        buffers, generators, own, pending, merged = snapshots.loads(data)
        layer._buffers = {
            n: ReorderBuffer.restore(layer.settings[n].policy, b, handles_adjust)
            for n, b in buffers.items()
        }
        layer._generators = {
            n: CtiGenerator.restore(layer.settings[n], g) for n, g in generators.items()
        }
        layer._own = own
        layer._pending = pending
        layer._effective = effective_ctis(layer.settings, own)
        layer._merged = merged
        return layer


def run_reference_sync(settings: ReferenceJoinSettings, fast: AdvanceTimeSettings,
                       reference: AdvanceTimeSettings, arrivals: Iterable[Event | Cti],
                       cuts: Sequence[int] | None = None) -> TimeLayerRun:
    """Pure model of a reference-sync job: a :class:`TimeLayer` with the two streams' settings
    for ``settings.sync`` feeding a :class:`ReferenceJoin`. The result's steps carry the join
    CTI and the enriched outputs released at it; ``late`` the violations."""
    layer = TimeLayer(settings.time_settings(fast, reference))
    return layer.run(arrivals, cuts=cuts, operator=ReferenceJoin(settings))
