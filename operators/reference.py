"""Reference sync: a fast event stream joined as-of with a slow reference stream (SPEC §4.4).

Each fast event is enriched with the reference version of its key valid at the event's time:
the version with the latest start ``<= event.start``. Reference versions are edge events keyed
by the join key (``Event.key`` on both streams): a version is valid from its start until the
next version of the key, or until an end edge (``edge_end=True``) closes it. The ``end`` of a
version (normally :data:`CTI_INFINITY`) is otherwise ignored.

Time synchronisation (StreamInsight's CTI import, seeds/streaminsight-application-time-advance):

* ``SyncMode.IMPORT`` — the reference stream imports the fast stream's CTIs, so the join's CTI
  is the fast stream's CTI: output flows while the reference stream is silent, with the fast
  stream's latency. A reference version that arrives behind the imported CTI is a violation:
  its stream's policy applies — DROP sends it to ``late``; ADJUST makes it valid from the CTI
  on (earlier fast events keep the version they were enriched with; a late record reports the
  moved start).
* ``SyncMode.MIN`` — both streams keep their own CTIs and the join releases at the older one
  (:func:`ctiflow.operators.time.merge_ctis`): no reference version is ever late, but the join stalls
  while the reference stream is silent.

:meth:`ReferenceJoinSettings.time_settings` builds the two streams' ``AdvanceTimeSettings`` for
the chosen mode; ``ctiflow.jobs.testing.time_layer.run_reference_sync`` is the pure model (time layer +
join) the tests and docs use.
"""

from __future__ import annotations

import heapq
import pickle
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ctiflow.operators import snapshots
from ctiflow.operators.errors import ConfigError, invalid_choice
from ctiflow.operators.operator import Output
from ctiflow.operators.time import CTI_INFINITY, CTI_NONE, AdvanceTimeSettings, Event, event_tuple
from ctiflow.operators.operator import Traits


class MissingReference(str, Enum):
    """What happens to a fast event whose key has no reference version at its time.

    * ``EMIT``: enriched at once with ``reference = None`` and ``reference_missing = True``.
    * ``HOLD``: held until the *first* later version of its key arrives, as long as that
      version starts within ``hold_for`` of the event (``version.start <= event.start +
      hold_for``; any later version if ``hold_for`` is None) — then it is enriched with that
      version (``reference_valid_from > time`` shows the late binding). Once the join's CTI
      passes ``event.start + hold_for`` without such a version (or at :data:`CTI_INFINITY`),
      it is emitted with ``reference_missing = True``. Held events delay the join's
      :attr:`ReferenceJoin.output_cti`.
    """

    EMIT = "emit"
    HOLD = "hold"


class SyncMode(str, Enum):
    """How the reference stream's application time follows the fast stream (module docs)."""

    IMPORT = "import"
    MIN = "min"


def _choice(enum: type[Enum], name: str, value: object) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise invalid_choice(name, value, (m.value for m in enum)) from None  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class ReferenceJoinSettings:
    """Configuration of a :class:`ReferenceJoin`, validated at construction."""

    fast_stream: str = "events"
    reference_stream: str = "reference"
    missing: MissingReference = MissingReference.EMIT
    hold_for: int | None = None
    sync: SyncMode = SyncMode.IMPORT
    output_stream: str = "enriched"

    def __post_init__(self) -> None:
        for name in ("fast_stream", "reference_stream", "output_stream"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty stream name (got {value!r})")
        if self.fast_stream == self.reference_stream:
            raise ConfigError(
                f"fast_stream and reference_stream are both {self.fast_stream!r}; "
                "the reference stream must be a separate input stream"
            )
        object.__setattr__(self, "missing", _choice(MissingReference, "missing", self.missing))
        object.__setattr__(self, "sync", _choice(SyncMode, "sync", self.sync))
        if self.hold_for is not None:
            if self.missing is not MissingReference.HOLD:
                raise ConfigError(
                    'hold_for is only meaningful with missing: "hold"; remove hold_for or set '
                    'missing to "hold"'
                )
            if isinstance(self.hold_for, bool) or not isinstance(self.hold_for, int) or self.hold_for < 0:
                raise ConfigError(
                    f"hold_for must be an integer number of ms >= 0 or null (wait until the end "
                    f"of input) (got {self.hold_for!r})"
                )

    def time_settings(self, fast: AdvanceTimeSettings,
                      reference: AdvanceTimeSettings) -> dict[str, AdvanceTimeSettings]:
        """The two input streams' settings for this sync mode: with IMPORT the reference stream
        imports the fast stream's CTIs (its own generation, if any, still counts); with MIN
        each keeps its own. The reference stream comes first, so at equal times the time layer
        releases reference versions before fast events (the join does not depend on it)."""
        if self.sync is SyncMode.IMPORT:
            reference = replace(reference, import_from=self.fast_stream)
        elif reference.import_from is not None or fast.import_from is not None:
            raise ConfigError(
                'sync: "min" keeps each stream\'s own CTIs; remove import_from from the '
                'advance-time settings or use sync: "import"'
            )
        return {self.reference_stream: reference, self.fast_stream: fast}


def join_cti(sync: SyncMode | str, fast_cti: int, reference_cti: int) -> int:
    """The join's CTI given the two streams' own CTIs: the fast one under IMPORT (the
    reference's effective CTI is ``max(own, fast)``, and the older of that and the fast one
    is the fast one), the older of both under MIN."""
    if SyncMode(sync) is SyncMode.IMPORT:
        return min(fast_cti, max(reference_cti, fast_cti))
    return min(fast_cti, reference_cti)


class ReferenceJoin:
    """Temporal as-of join of the fast stream with the reference stream (Operator contract).

    Input: both streams' events, each in application-time order, interleaved by time (what
    the time layer releases). Order at equal times: a reference version with ``start == t``
    applies to fast events at ``t`` whatever the interleaving, because fast events at ``t``
    are enriched only once the join has moved past ``t`` (a later event or a CTI above ``t``).
    Among versions of one key with the same start, the last processed (highest partition,
    offset) wins.

    State: per key only the current version (start, fields); the fast events of the current
    instant; held events (``missing = hold``).

    Output ``Output("enriched", record)`` with ``record = {"key", "time" (= event.start),
    "end", "partition", "offset", "event" (fields), "reference" (version fields or None),
    "reference_valid_from" (int or None), "reference_missing" (bool)}``; ``end``,
    ``partition`` and ``offset`` let :func:`enriched_event` rebuild the event for a downstream
    operator. Records come in application-time order, except released held events; use
    :attr:`output_cti` as the enriched stream's CTI."""

    @classmethod
    def traits(cls, settings: ReferenceJoinSettings) -> Traits:
        """As an operator's (the time layer's reference takes it as one): ADJUST's dropped share
        is the time layer's to report."""
        return Traits()

    def __init__(self, settings: ReferenceJoinSettings) -> None:
        self.settings = settings
        self._versions: dict[str, tuple[int, int | None, dict[str, Any]]] = {}
        self._time = CTI_NONE
        self._cti = CTI_NONE
        self._pending: list[Event] = []
        self._held: dict[str, dict[int, Event]] = {}
        self._deadlines: list[tuple[int, int, str]] = []
        self._seq = 0

    @property
    def cti(self) -> int:
        return self._cti

    @property
    def output_cti(self) -> int:
        """CTI of the enriched stream: the join's CTI, held back to the oldest fast event not
        yet emitted."""
        oldest = [e.start for e in self._pending]
        oldest += [e.start for held in self._held.values() for e in held.values()]
        return min([self._cti, *oldest])

    def versions(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """The current version (start, fields) per key."""
        return {k: (v[0], v[2]) for k, v in self._versions.items()}

    def process(self, event: Event) -> list[Output]:
        s = self.settings
        if event.stream not in (s.fast_stream, s.reference_stream):
            raise ValueError(
                f"ReferenceJoin got an event of stream {event.stream!r}; expected "
                f"{s.fast_stream!r} (fast) or {s.reference_stream!r} (reference)"
            )
        t = event.sync_time
        if t < self._time:
            raise ValueError(
                f"ReferenceJoin got an event at {t} after one at {self._time}: input must be in "
                "application-time order (feed it through the time layer)"
            )
        out: list[Output] = []
        if t > self._time:
            out += self._resolve_pending()
            self._time = t
            out += self._expire(t)
        if event.stream == s.fast_stream:
            self._pending.append(event)
        elif event.edge_end:
            current = self._versions.get(event.key)
            if current is not None and event.start in (current[0], current[1]):
                del self._versions[event.key]
        else:
            self._versions[event.key] = (event.start, event.original_start, event.fields)
            held = self._held.pop(event.key, None)
            if held:
                out += [self._enriched(e) for e in held.values()]
        return out

    def advance_to(self, cti: int) -> list[Output]:
        out: list[Output] = []
        if cti > self._time:
            out += self._resolve_pending()
        self._cti = max(self._cti, cti)
        out += self._expire(cti)
        return out

    def _resolve_pending(self) -> list[Output]:
        out: list[Output] = []
        hold = self.settings.missing is MissingReference.HOLD
        for e in self._pending:
            if e.key in self._versions or not hold:
                out.append(self._enriched(e))
                continue
            hold_for = self.settings.hold_for
            deadline = CTI_INFINITY if hold_for is None else e.start + hold_for
            self._held.setdefault(e.key, {})[self._seq] = e
            heapq.heappush(self._deadlines, (deadline, self._seq, e.key))
            self._seq += 1
        self._pending = []
        return out

    def _expire(self, now: int) -> list[Output]:
        """Emit, as missing, held events whose hold window ends before ``now`` (all at +∞)."""
        out: list[Output] = []
        dl = self._deadlines
        while dl and (dl[0][0] < now or now >= CTI_INFINITY):
            _, seq, key = heapq.heappop(dl)
            held = self._held.get(key)
            if held is None or seq not in held:
                continue  # already enriched by a version
            out.append(self._enriched(held.pop(seq)))
            if not held:
                del self._held[key]
        return out

    def _enriched(self, e: Event) -> Output:
        version = self._versions.get(e.key)
        return Output(
            role="enriched",
            record={
                "key": e.key,
                "time": e.start,
                "end": e.end,
                "partition": e.partition,
                "offset": e.offset,
                "event": e.fields,
                "reference": None if version is None else version[2],
                "reference_valid_from": None if version is None else version[0],
                "reference_missing": version is None,
            },
        )

    def live_keys(self) -> set[str]:
        """Keys with a current reference version or held events."""
        return set(self._versions) | set(self._held)

    def snapshot(self) -> bytes:
        held = [(seq, event_tuple(e)) for h in self._held.values() for seq, e in h.items()]
        return pickle.dumps(
            (self._time, self._cti, self._versions, [event_tuple(e) for e in self._pending],
             sorted(held), self._seq),
            protocol=5,
        )

    @classmethod
    def restore(cls, settings: ReferenceJoinSettings, data: bytes) -> "ReferenceJoin":
        join = cls(settings)
        time, cti, versions, pending, held, seq = snapshots.loads(data)
        join._time, join._cti, join._versions, join._seq = time, cti, versions, seq
        join._pending = [Event(*t) for t in pending]
        hold_for = settings.hold_for
        for s, t in held:
            e = Event(*t)
            join._held.setdefault(e.key, {})[s] = e
            deadline = CTI_INFINITY if hold_for is None else e.start + hold_for
            join._deadlines.append((deadline, s, e.key))
        heapq.heapify(join._deadlines)
        return join


def enriched_event(output: Output, stream: str = "enriched") -> Event:
    """The enriched record as an :class:`Event` for another operator in the same job: the fast
    event's fields plus ``reference``, ``reference_valid_from`` and ``reference_missing``
    (these three names win over same-named event fields)."""
    r = output.record
    fields = dict(r["event"] or {})
    fields["reference"] = r["reference"]
    fields["reference_valid_from"] = r["reference_valid_from"]
    fields["reference_missing"] = r["reference_missing"]
    return Event(
        key=r["key"],
        start=r["time"],
        end=r.get("end", r["time"]),
        fields=fields,
        partition=r.get("partition", 0),
        offset=r.get("offset", 0),
        stream=stream,
    )
