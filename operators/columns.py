"""Events as columns: what the Spark path hands the time layer and the operators, instead of
one :class:`~ctiflow.operators.events.Event` (and one record dict) per input record.

:class:`EventColumns` holds one stream's events as NumPy arrays — key, start, end, partition,
offset, the record's fields (numeric fields typed, others as object arrays), the original bytes
and, for events the ADJUST policy moved, their original start. Operators that can work on whole
columns take it (``process_columns``); the others get :meth:`EventColumns.events`, built once.

:class:`ColumnTimeLayer` is the job's time layer: a reorder buffer per input stream kept as
columns (:class:`ColumnBuffer`), CTIs given by the caller: the CTI check is one comparison over
the column, a release is one stable ``lexsort`` and a cut. Its released sequence, late records
and CTIs are those of the row time layer (``ctiflow.jobs.testing.time_layer``, StreamInsight's model
event by event) for the same arrivals and CTIs — a property test holds it so; only late events
become Python objects (their late record needs the event's fields).
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Callable, Collection, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from ctiflow.operators import snapshots
from ctiflow.operators.errors import ConfigError
from ctiflow.operators.events import CTI_NONE, Event, Output, record_maker
from ctiflow.operators.time import (REASON_ADJUSTED, REASON_BEFORE_CTI, REASON_DROPPED, AdvanceTimeSettings,
                            ViolationPolicy, late_record)

__all__ = ["ColumnBuffer", "ColumnTimeLayer", "EventColumns", "LazyFields", "merged_events", "record_maker"]

_FIRST = itemgetter(0)


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array of ``values`` as they are (``np.array`` would make lists into rows)."""
    return np.fromiter(values, object, count=len(values))


class LazyFields(Mapping):
    """Field columns (a field name → NumPy array mapping) that make a column only when it is
    read, and stay lazy through :meth:`take` and :meth:`concat`: the protocol
    :class:`EventColumns` relies on to move rows without touching the fields no operator reads.
    A subclass gives ``names`` (the fields, in record order), ``__getitem__``, ``take`` and,
    where its parts can be joined lazily, ``concat``."""

    __slots__ = ()

    names: Collection[str]

    def __contains__(self, name) -> bool:
        return name in self.names

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def take(self, index, raw: np.ndarray | None) -> "LazyFields":
        """The rows ``index`` (a slice, or an integer or boolean array), in that order, whose
        records' bytes are ``raw`` (the taken bytes column, shared; None: none kept)."""
        raise NotImplementedError

    @staticmethod
    def concat(parts: Sequence["LazyFields"], raw: np.ndarray | None) -> Mapping[str, np.ndarray]:
        """The rows of ``parts`` (all of this type, the same fields) one after the other; by
        default every column concatenated now."""
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def project(self, names: Collection[str]) -> "LazyFields":
        """Only the fields ``names`` (others dropped), where this type can drop fields; by
        default all of them, unchanged. A type that drops fields must concatenate with parts
        that kept them (their rows then have no value for the dropped fields)."""
        return self


class TakenFields(LazyFields):
    """The field columns of the rows ``index`` of ``source`` (a field name → array mapping),
    each column taken on first use: an operator that reads two fields of a wide record copies
    two columns, not all of them. Pickles as the plain dict of every column taken."""

    __slots__ = ("_source", "_index", "_taken")

    def __init__(self, source: Mapping[str, np.ndarray], index) -> None:
        if isinstance(source, TakenFields):  # rows of rows: one index into the original columns
            first = source._index
            if isinstance(first, slice):
                first = np.arange(len(next(iter(source._source.values()))))[first]
            source, index = source._source, first[index]
        self._source, self._index = source, index
        self._taken: dict[str, np.ndarray] = {}

    @property
    def names(self) -> Collection[str]:
        return self._source.keys()

    def __getitem__(self, name: str) -> np.ndarray:
        column = self._taken.get(name)
        if column is None:
            column = self._taken[name] = self._source[name][self._index]
        return column

    def take(self, index, raw: np.ndarray | None = None) -> "TakenFields":
        return TakenFields(self, index)

    def __reduce__(self):
        return dict, (dict(self.items()),)


class EventColumns:
    """Events of one stream as columns, row ``i`` being one event; no end edges (a stream with
    end edges exists only in the row model, ``ctiflow.jobs.testing.time_layer``).

    ``fields``: field name → array, in the record's field order; ``adjusted`` (None: no row
    is) marks the rows whose start the ADJUST policy moved to the CTI, ``original_start`` their
    start before that. ``dicts`` (None for columns read from a topic): each row's record as it
    was given, for events whose records do not all have the same fields (:meth:`from_events`);
    :meth:`records` and :meth:`event` return those. ``origin`` (None unless the source keeps
    it: a broadcast stream's records, whose refusal is decided after decoding): per row, the
    record's key bytes as read and its timestamp (epoch ms or None), for a dead letter that
    carries the record as it came. Treat as immutable; :meth:`take` and :meth:`concat` copy."""

    __slots__ = ("stream", "key", "start", "end", "partition", "offset", "fields", "raw", "adjusted",
                 "original_start", "dicts", "origin", "_events", "_codes")

    def __init__(self, stream: str, key: np.ndarray, start: np.ndarray, end: np.ndarray,
                 partition: np.ndarray, offset: np.ndarray, fields: dict[str, np.ndarray],
                 raw: np.ndarray | None = None, adjusted: np.ndarray | None = None,
                 original_start: np.ndarray | None = None, dicts: list[dict] | None = None,
                 origin: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.stream = stream
        self.key = key
        self.start = start
        self.end = end
        self.partition = partition
        self.offset = offset
        self.fields = fields
        self.raw = raw
        self.adjusted = adjusted
        self.original_start = original_start
        self.dicts = dicts
        self.origin = origin
        self._events: list[Event] | None = None
        self._codes: tuple[np.ndarray, dict[str, int]] | None = None

    def __len__(self) -> int:
        return len(self.start)

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__[:-2])

    def __setstate__(self, state) -> None:
        self.origin = None  # (not in states pickled before it was)
        for name, value in zip(self.__slots__[:-2], state):
            setattr(self, name, value)
        self._events = None
        self._codes = None

    def key_codes(self) -> tuple[np.ndarray, dict[str, int]]:
        """Each row's key as a small integer, and key → code: computed once per columns object
        (several operators that filter the same rows by key share it)."""
        if self._codes is None:
            index: dict[str, int] = {}
            setdefault = index.setdefault
            codes = np.fromiter((setdefault(k, len(index)) for k in self.key.tolist()), np.int64,
                                len(self.key))
            self._codes = (codes, index)
        return self._codes

    @classmethod
    def from_events(cls, events: Sequence[Event], names: Sequence[str] | None = None) -> "EventColumns":
        """Columns of ``events`` (one stream, no end edges: ``ValueError`` otherwise). Field
        columns are object arrays of the values as they are, for the fields of the first event
        (or ``names``); an event without one of them has ``None`` there, and the records are
        kept as given (``dicts``) unless every event has exactly those fields."""
        if not events:
            raise ValueError("no events")
        stream = events[0].stream
        if any(e.stream != stream or e.edge_end for e in events):
            raise ValueError("EventColumns holds one stream's events without end edges")
        names = list(events[0].fields) if names is None else list(names)
        dicts = [e.fields for e in events]
        same = all(list(d) == names for d in dicts)
        adjusted = np.array([e.original_start is not None for e in events])
        return cls(stream, object_array([e.key for e in events]),
                   np.array([e.start for e in events], np.int64), np.array([e.end for e in events], np.int64),
                   np.array([e.partition for e in events], np.int64),
                   np.array([e.offset for e in events], np.int64),
                   {n: object_array([e.fields.get(n) for e in events]) for n in names},
                   object_array([e.raw for e in events]),
                   adjusted if adjusted.any() else None,
                   np.array([e.start if e.original_start is None else e.original_start for e in events],
                            np.int64)
                   if adjusted.any() else None, None if same else dicts)

    def take(self, index: np.ndarray) -> "EventColumns":
        """The rows ``index`` (an integer or boolean array), in that order."""
        raw = None if self.raw is None else self.raw[index]
        return EventColumns(self.stream, self.key[index], self.start[index], self.end[index],
                            self.partition[index], self.offset[index], self._taken_fields(index, raw), raw,
                            None if self.adjusted is None else self.adjusted[index],
                            None if self.original_start is None else self.original_start[index],
                            None if self.dicts is None
                            else [self.dicts[i] for i in np.arange(len(self))[index].tolist()],
                            None if self.origin is None else (self.origin[0][index], self.origin[1][index]))

    def project(self, names: Collection[str]) -> "EventColumns":
        """These rows with only the fields ``names`` that the fields' type can drop
        (:meth:`LazyFields.project`); every other column as it is. For a buffer whose rows no
        reader asks other fields of (:class:`ColumnTimeLayer`'s ``keep_fields``)."""
        fields = self.fields
        if self.dicts is not None or not isinstance(fields, LazyFields):
            return self
        kept = fields.project(names)
        if kept is fields:
            return self
        return EventColumns(self.stream, self.key, self.start, self.end, self.partition, self.offset, kept,
                            self.raw, self.adjusted, self.original_start, None, self.origin)

    def _taken_fields(self, index, raw) -> Mapping[str, np.ndarray]:
        fields = self.fields
        if not fields:
            return {}
        return fields.take(index, raw) if isinstance(fields, LazyFields) else TakenFields(fields, index)

    @staticmethod
    def concat(parts: Sequence["EventColumns"]) -> "EventColumns":
        """The rows of ``parts`` one after the other (one stream, the same fields)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        cat = np.concatenate
        raw = None if all(p.raw is None for p in parts) else cat(
            [p.raw if p.raw is not None else np.full(len(p), None, object) for p in parts])
        adjusted = original = None
        if any(p.adjusted is not None for p in parts):
            adjusted = cat([p.adjusted if p.adjusted is not None else np.zeros(len(p), bool) for p in parts])
            original = cat([p.original_start if p.original_start is not None else p.start for p in parts])
        dicts = None if all(p.dicts is None for p in parts) else [d for p in parts for d in p.records()]
        lazy = type(first.fields)
        if issubclass(lazy, LazyFields) and all(type(p.fields) is lazy for p in parts):
            fields = lazy.concat([p.fields for p in parts], raw)
        else:
            fields = {n: cat([p.fields[n] for p in parts]) for n in first.fields}
        origin = None
        if any(p.origin is not None for p in parts):
            none = [np.full(len(p), None, object) for p in parts]
            origin = (cat([p.origin[0] if p.origin is not None else n for p, n in zip(parts, none)]),
                      cat([p.origin[1] if p.origin is not None else n for p, n in zip(parts, none)]))
        return EventColumns(first.stream, cat([p.key for p in parts]), cat([p.start for p in parts]),
                            cat([p.end for p in parts]), cat([p.partition for p in parts]),
                            cat([p.offset for p in parts]), fields, raw, adjusted, original, dicts, origin)

    def records(self) -> list[dict[str, Any]]:
        """Each row's fields as a dict (in field order), as :attr:`Event.fields` holds them."""
        if self.dicts is not None:
            return self.dicts
        names = tuple(self.fields)
        if not names:
            return [{} for _ in range(len(self))]
        return list(map(record_maker(names), *(c.tolist() for c in self.fields.values())))

    def events(self) -> list[Event]:
        """The rows as :class:`Event` objects (built once, then cached)."""
        if self._events is None:
            n = len(self)
            original = [None] * n
            if self.adjusted is not None:
                for i in np.flatnonzero(self.adjusted).tolist():
                    original[i] = int(self.original_start[i])
            self._events = list(map(Event, self.key.tolist(), self.start.tolist(), self.end.tolist(),
                                    self.records(), self.partition.tolist(), self.offset.tolist(),
                                    [self.stream] * n, original,
                                    [False] * n, [None] * n if self.raw is None else self.raw.tolist()))
        return self._events

    def event(self, i: int) -> Event:
        """Row ``i`` as an :class:`Event`."""
        if self._events is not None:
            return self._events[i]
        record = self.dicts[i] if self.dicts is not None else dict(zip(
            self.fields, (c[i].item() if isinstance(c[i], np.generic) else c[i]
                          for c in self.fields.values())))
        return Event(self.key[i], int(self.start[i]), int(self.end[i]), record,
                     int(self.partition[i]), int(self.offset[i]), self.stream,
                     int(self.original_start[i]) if self.adjusted is not None and self.adjusted[i] else None,
                     False, None if self.raw is None else self.raw[i])

    def release_order(self) -> np.ndarray:
        """The permutation that puts the rows in application-time order: start, partition,
        offset, then (only with duplicated offsets) key, end; ties stay in row order."""
        order = np.lexsort((self.offset, self.partition, self.start))
        if len(order) > 1:
            s, p, o = self.start[order], self.partition[order], self.offset[order]
            if ((s[1:] == s[:-1]) & (p[1:] == p[:-1]) & (o[1:] == o[:-1])).any():
                _, key_rank = np.unique(self.key.astype(str), return_inverse=True)
                order = np.lexsort((self.end, key_rank.reshape(-1), self.offset, self.partition, self.start))
        return order


class Part:
    """Rows a buffer admitted together (one offer, or what a release left of a part), in
    arrival order: ``lo`` is the smallest start among them, ``cols`` the rows or None while
    they are only in the state store (the time layer's ``load`` reads them when a release
    reaches ``lo``). Never changed once made: a release replaces a part by its remainder."""

    __slots__ = ("id", "lo", "rows", "cols")

    def __init__(self, id: int, lo: int, rows: int, cols: EventColumns | None) -> None:
        self.id, self.lo, self.rows, self.cols = id, lo, rows, cols


class ColumnBuffer:
    """One stream's reorder buffer over columns: admitted rows wait until the CTI passes them,
    then leave in application-time order (:meth:`EventColumns.release_order`).

    ``offer`` checks rows against the CTI in effect — sync time ``>= c`` admitted; behind it,
    the stream's ``policy``: DROP → a late record (:data:`REASON_DROPPED`); ADJUST → a lifetime
    reaching past ``c`` starts at ``c`` (``original_start`` keeps the old start; unless
    ``handles_adjust``, a late record :data:`REASON_ADJUSTED` reports the dropped share),
    one wholly before ``c`` → a late record (:data:`REASON_BEFORE_CTI`). ``advance`` releases the
    rows before the CTI. Invariants: released + late = offered; releases concatenate in
    application-time order. Only late rows become :class:`Event` objects (their late record
    carries the event's fields).

    The rows are kept in :class:`Part` s: a release touches only the parts that hold rows before
    the CTI, so its cost follows what it releases, not what the buffer holds (a long
    ``cti.delay`` holds minutes of input)."""

    __slots__ = ("stream", "policy", "handles_adjust", "cti", "parts", "layer")

    def __init__(self, stream: str, policy: ViolationPolicy | str, handles_adjust: bool = False,
                 layer: "ColumnTimeLayer | None" = None) -> None:
        self.stream = stream
        self.policy = ViolationPolicy(policy)
        self.handles_adjust = handles_adjust
        self.cti = CTI_NONE
        self.parts: list[Part] = []
        self.layer = layer if layer is not None else ColumnTimeLayer({})

    def __len__(self) -> int:
        return sum(p.rows for p in self.parts)

    def offer(self, cols: EventColumns) -> list[tuple[Event, list[Output]]]:
        """Admit the rows at or after the CTI; → ``(event, late records)`` for each row that
        has late records, in row order (an ADJUSTed row is also admitted, from the CTI on)."""
        cti = self.cti
        if not len(cols):
            return []
        behind = cols.start < cti
        if not behind.any():
            self._admit(cols)
            return []
        out: list[tuple[Event, list[Output]]] = []
        keep = ~behind
        moved: list[int] = []
        policy = self.policy
        for i in np.flatnonzero(behind).tolist():
            event = cols.event(i)
            if policy is ViolationPolicy.DROP:
                out.append((event, [late_record(event, cti, REASON_DROPPED, policy)]))
            elif max(event.end, event.start + 1) <= cti:
                out.append((event, [late_record(event, cti, REASON_BEFORE_CTI, policy)]))
            else:
                moved.append(i)
                keep[i] = True
                if not self.handles_adjust:
                    out.append((event, [late_record(event, cti, REASON_ADJUSTED, policy)]))
        if moved:
            cols = _adjusted(cols, moved, cti)
        if keep.any():
            self._admit(cols.take(np.flatnonzero(keep)))
        return out

    def _admit(self, cols: EventColumns) -> None:
        self.parts.append(self.layer.new_part(cols))

    def advance(self, cti: int) -> EventColumns | None:
        """Set the CTI (never back) and release the rows before it, in order (None: none)."""
        self.cti = max(self.cti, cti)
        cti = self.cti
        if all(p.lo >= cti for p in self.parts):
            return None
        kept, out, layer = [], [], self.layer
        for part in self.parts:  # in arrival order: rows of equal order keys stay in it
            if part.lo >= cti:
                kept.append(part)
                continue
            cols = layer.cols(part)
            layer.dropped.append(part.id)
            before = cols.start < cti
            if before.all():
                out.append(cols)
                continue
            out.append(cols.take(np.flatnonzero(before)))
            kept.append(layer.new_part(cols.take(np.flatnonzero(~before))))
        self.parts = kept
        released = EventColumns.concat(out)
        return released.take(released.release_order())


def _adjusted(cols: EventColumns, rows: list[int], cti: int) -> EventColumns:
    """``cols`` with the start of ``rows`` moved to ``cti`` (ADJUST; the first original start kept)."""
    adjusted = np.zeros(len(cols), bool) if cols.adjusted is None else cols.adjusted.copy()
    original = cols.start.copy() if cols.original_start is None else cols.original_start.copy()
    start = cols.start.copy()
    for i in rows:
        if not adjusted[i]:
            original[i] = start[i]
        adjusted[i] = True
        start[i] = cti
    return EventColumns(cols.stream, cols.key, start, cols.end, cols.partition, cols.offset, cols.fields,
                        cols.raw, adjusted, original, cols.dicts)


def merged_events(runs: Sequence[EventColumns]) -> list[Event]:
    """The rows of several streams' releases (each in application-time order, in the streams'
    order) as one sequence of events in application-time order across streams: sync time, then
    the stream's place in ``runs``, partition, offset (key, start, end for duplicated offsets)."""
    if len(runs) == 1:
        return runs[0].events()
    keyed = [[((e.start, rank, e.partition, e.offset, e.key, e.start, e.end), e) for e in cols.events()]
             for rank, cols in enumerate(runs)]
    return [e for _, e in heapq.merge(*keyed, key=_FIRST)]


class ColumnTimeLayer:
    """The time layer of a key group: a :class:`ColumnBuffer` per input stream (each with its
    stream's violation policy), one CTI for all of them — the runtime computes the job's CTI from
    the partitions' frontiers (:func:`ctiflow.operators.time.combined_cti`) and every stream is checked
    against it and released up to it.

    ``offer_columns`` admits one stream's rows; ``enqueue``/``step`` apply a CTI and release →
    ``(cti, runs)``: each stream's released rows in application-time order (streams in the order
    of ``settings``; :func:`merged_events` interleaves them).

    **State.** :meth:`index` is the small part (CTIs, each buffer's parts by id, ``lo`` and row
    count); each part's rows are stored apart (:meth:`stored`, ``load``): a caller that keeps
    them so (:mod:`ctiflow.jobs.state`) writes the parts made since the last commit (:meth:`commit`
    lists them, and the parts released since) and reads a part only when a release reaches it.
    :meth:`snapshot` is everything in one blob (tests, tools). ``keep_fields`` /
    ``needs_records``: what a stored part keeps of its rows (:meth:`stored`)."""

    def __init__(self, settings: Mapping[str, AdvanceTimeSettings], handles_adjust: bool = False,
                 keep_fields: Collection[str] | None = None,
                 needs_records: Callable[["EventColumns"], bool] | None = None,
                 load: Callable[[int], EventColumns] | None = None) -> None:
        if any(s.frequency is not None for s in settings.values()):
            raise ConfigError("ColumnTimeLayer takes its CTIs from the caller: no frequency")
        self.settings = dict(settings)
        self.handles_adjust = handles_adjust
        #: the only fields anything reads of a released event (None: any field may be read)
        self.keep_fields = None if keep_fields is None else tuple(keep_fields)
        self.needs_records = needs_records
        self.load = load
        self.buffers = {name: ColumnBuffer(name, s.policy, handles_adjust, self)
                        for name, s in self.settings.items()}
        self._cti = CTI_NONE
        self._pending = CTI_NONE
        self.next_id = 0
        self.created: list[Part] = []  # parts made since the last commit
        self.dropped: list[int] = []   # ids of parts released since the last commit

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(self.settings)

    def cti(self) -> int:
        return self._cti

    def buffered(self) -> int:
        return sum(len(b) for b in self.buffers.values())

    def new_part(self, cols: EventColumns) -> Part:
        part = Part(self.next_id, int(cols.start.min()), len(cols), cols)
        self.next_id += 1
        self.created.append(part)
        return part

    def cols(self, part: Part) -> EventColumns:
        """A part's rows (read from the store the first time they are needed)."""
        if part.cols is None:
            if self.load is None:
                raise RuntimeError(f"part {part.id} of the time layer is not loaded and there is no store "
                                   "(a bug)")
            part.cols = self.load(part.id)
        return part.cols

    def offer_columns(self, cols: EventColumns) -> list[tuple[Event, list[Output]]]:
        """One stream's arriving rows (:meth:`ColumnBuffer.offer`)."""
        buffer = self.buffers.get(cols.stream)
        if buffer is None:
            raise ConfigError(f"events of stream {cols.stream!r} offered to the time layer of "
                              f"{sorted(self.buffers)}")
        return buffer.offer(cols)

    def enqueue(self, cti: int) -> None:
        """A CTI, applied by the next :meth:`step` (one not above the current is ignored)."""
        self._pending = max(self._pending, cti)

    @property
    def has_pending(self) -> bool:
        return self._pending > self._cti

    def step(self) -> tuple[int, list[EventColumns]]:
        """Apply the pending CTI; → ``(cti, each stream's released rows, in order)``."""
        self._cti = max(self._cti, self._pending)
        runs = []
        for buffer in self.buffers.values():
            got = buffer.advance(self._cti)
            if got is not None:
                runs.append(got)
        return self._cti, runs

    # -- state ------------------------------------------------------------------------------
    def commit(self) -> tuple[list[Part], list[int]]:
        """→ (the parts made since the last commit that are still held, the ids of stored parts
        released since); both lists start again empty."""
        held = {p.id for b in self.buffers.values() for p in b.parts}
        made = [p for p in self.created if p.id in held]
        made_ids = {p.id for p in self.created}
        gone = [i for i in self.dropped if i not in made_ids]
        self.created, self.dropped = [], []
        return made, gone

    def stored(self, part: Part) -> EventColumns:
        """A part's rows as stored. With ``keep_fields``, only those fields (where their type can
        drop fields, :meth:`EventColumns.project`) — unless a row may have all its fields read:
        ``needs_records`` says so (an operator's refusal or late record — e.g. the binner's share
        of an ADJUSTed event — carries the whole record). The buffer is most of a long CTI
        delay's state; what is not stored is not copied through Spark's state server, store and
        changelog."""
        cols = self.cols(part)
        if self.keep_fields is None or (self.needs_records is not None and self.needs_records(cols)):
            return cols
        return cols.project(self.keep_fields)

    def index(self) -> tuple:
        """The layer without its parts' rows (they are stored apart)."""
        return ("columns", 3, self._cti, self._pending, self.next_id,
                {name: (b.cti, [(p.id, p.lo, p.rows) for p in b.parts]) for name, b in self.buffers.items()})

    def snapshot(self) -> bytes:
        """The whole layer as bytes, parts' rows included (as :meth:`stored` keeps them)."""
        parts = {p.id: self.stored(p) for b in self.buffers.values() for p in b.parts}
        return pickle.dumps((self.index(), parts), protocol=5)

    @classmethod
    def restore(cls, settings: Mapping[str, AdvanceTimeSettings], data, handles_adjust: bool = False,
                keep_fields: Collection[str] | None = None,
                needs_records: Callable[["EventColumns"], bool] | None = None,
                load: Callable[[int], EventColumns] | None = None) -> "ColumnTimeLayer":
        """From an :meth:`index` (parts read with ``load`` when needed) or a :meth:`snapshot`
        (layout 3; earlier layouts are read by :mod:`ctiflow.jobs.state.compat`)."""
        layer = cls(settings, handles_adjust, keep_fields, needs_records, load)
        got = snapshots.loads(data) if isinstance(data, bytes) else data
        parts: dict[int, EventColumns] = {}
        if len(got) == 2 and isinstance(got[0], tuple):  # a snapshot: (index, parts)
            got, parts = got
        if tuple(got[:2]) != ("columns", 3):
            raise ValueError(f"a time layer of layout {tuple(got[:2])!r}: earlier layouts are "
                             "ctiflow.jobs.state.compat's to read")
        _, _, layer._cti, layer._pending, layer.next_id, buffers = got
        for name, (cti, index) in buffers.items():
            buffer = layer.buffers[name]
            buffer.cti = cti
            buffer.parts = [Part(i, lo, rows, parts.get(i)) for i, lo, rows in index]
        return layer

    @classmethod
    def of_runs(cls, settings: Mapping[str, AdvanceTimeSettings], cti: int, pending: int,
                runs: Mapping[str, tuple[int, list]], handles_adjust: bool = False,
                keep_fields: Collection[str] | None = None,
                needs_records: Callable[["EventColumns"], bool] | None = None,
                load: Callable[[int], EventColumns] | None = None) -> "ColumnTimeLayer":
        """A layer at ``cti`` (``pending``: the CTI the next release takes effect at) whose streams
        hold ``runs`` (stream → its CTI and its rows, each a part made now: the next commit lists
        them to be stored)."""
        layer = cls(settings, handles_adjust, keep_fields, needs_records, load)
        layer._cti, layer._pending = cti, pending
        for name, (buffer_cti, cols_runs) in runs.items():
            buffer = layer.buffers[name]
            buffer.cti = buffer_cti
            buffer.parts = [layer.new_part(cols) for cols in cols_runs if cols is not None and len(cols)]
        return layer
