"""Count operator: approximate counts (or sums) of interesting events over sliding windows.

One :class:`~ctiflow.operators.histogram.ExponentialHistogram` per key (or one global histogram under
key ``"*"``). A count-based window covers the key's last N events: the histogram's timestamp
is the key's sequence number in application-time order (1, 2, …), counting uninteresting
events too. A time-based window covers the last T ms of application time: the timestamp is
``event.start``, and an event at t is inside the window at time τ iff t > τ − T.

Emission (``CountSettings.emit``):

* ``per_event`` — as the seed's operator: one count record per input event, at the event's
  start, the event included.
* ``per_cti`` — ``advance_to(cti)`` emits one record per key touched since the previous CTI,
  at time τ = cti − 1: the last application time the CTI has made final (events starting at
  ``cti`` itself may still come), so every emitted count is final. The final CTI
  (``CTI_INFINITY``) emits each touched key at that key's latest event start (not the
  operator's: which keys share an operator instance is the job's key grouping, and results must
  not depend on it) and then drops all state, as nothing can follow it.

For time-based windows every CTI also expires all keys at τ and forgets keys whose window
became empty, so the state of quiet keys does not linger. A record is a plain dict shaped like
``schemas/count.avsc``.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from enum import Enum
from itertools import count as naturals, repeat
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ctiflow.operators import snapshots
from ctiflow.operators.errors import ConfigError, CtiflowError, EventRejected, invalid_choice
from ctiflow.operators.histogram import (NO_TIME, TIME_LIMIT, Bucket, ExponentialHistogram, _le, appended,
                                         buckets_per_size, one_level, ranges)
from ctiflow.operators.events import OutputBatch
from ctiflow.operators.operator import Operator, Traits
from ctiflow.operators.packed import NewRows, PackedStates
from ctiflow.operators.time import CTI_INFINITY, CTI_NONE

__all__ = ["Bucket", "CountOperator", "CountSettings", "ExponentialHistogram", "GLOBAL_KEY"]

#: The key of the single histogram when ``per_key`` is False.
GLOBAL_KEY = "*"
WINDOW_KINDS = ("events", "time")


class Emit(str, Enum):
    """When a count is emitted (module docstring)."""

    PER_EVENT = "per_event"
    PER_CTI = "per_cti"


EMIT_MODES = tuple(e.value for e in Emit)

Predicate = Callable[[Mapping[str, Any]], Any]


def _choices(field: str, value: Any, valid: tuple[str, ...]) -> ConfigError:
    return invalid_choice(field, value, valid)


@dataclass(frozen=True, slots=True)
class CountSettings:
    """What a count operator counts.

    ``predicate`` decides which events are interesting: a callable on the record's fields, or
    a string — an expression over the fields (``"amount > 500"``) compiled by
    ``ctiflow.operators.cep.expr.expression.compile_expression`` or, where that module is absent, the name
    of a field whose truthiness decides — or None (every event is interesting).
    ``value_field`` turns the count into a sum: an interesting event weighs the field's
    non-negative integer value (null counts as 0).
    """

    name: str
    window_kind: str
    window: int
    epsilon: float = 0.01
    per_key: bool = True
    predicate: Predicate | str | None = None
    value_field: str | None = None
    emit: str = "per_cti"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f'Invalid "name" value: {self.name!r}. Give the counter a non-empty name.')
        if self.window_kind not in WINDOW_KINDS:
            raise _choices("window_kind", self.window_kind, WINDOW_KINDS)
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0:
            unit = "N events" if self.window_kind == "events" else "T milliseconds"
            raise ConfigError(f'Invalid "window" value: {self.window!r}. It must be a positive integer '
                              f'({unit}).')
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) \
                or not 0 < self.epsilon <= 1:
            raise ConfigError(f'Invalid "epsilon" value: {self.epsilon!r}. It must be in (0, 1], e.g. 0.01 '
                              'for 1%.')
        if self.predicate is not None and not (callable(self.predicate) or isinstance(self.predicate, str)):
            raise ConfigError(
                f'Invalid "predicate" value: {self.predicate!r}. Give an expression string, a field name, '
                "a callable on the record fields, or None (every event is interesting)."
            )
        if isinstance(self.predicate, str) and not self.predicate.strip():
            raise ConfigError('Invalid "predicate" value: empty string. Give an expression or leave it '
                              'unset.')
        if self.value_field is not None and (not isinstance(self.value_field, str) or not self.value_field):
            raise ConfigError(f'Invalid "value_field" value: {self.value_field!r}. Give a field name or '
                              'None.')
        if self.emit not in EMIT_MODES:
            raise _choices("emit", self.emit, EMIT_MODES)


def compile_predicate(predicate: Predicate | str | None) -> Predicate | None:
    """The callable deciding "interesting" (None: every event is)."""
    if predicate is None or callable(predicate):
        return predicate
    text = predicate.strip()
    compile_expression = _expression_compiler()
    if compile_expression is not None:
        try:
            return compile_expression(text)
        except CtiflowError:
            raise
        except Exception as exc:
            raise ConfigError(f'Invalid "predicate" value: {text!r}: {exc}') from exc
    if not text.isidentifier():
        raise ConfigError(
            f'Invalid "predicate" value: {text!r}. Expressions need ctiflow.operators.cep.expr.expression, '
            "which is not available; give a field name (its truthiness decides) or a callable."
        )
    return lambda fields: fields.get(text)


_PREDICATES: dict[int, tuple[CountSettings, Predicate | None, Callable | None]] = {}


def _compiled_predicate(settings: CountSettings) -> tuple[Predicate | None, Callable | None]:
    """:func:`compile_predicate` once per settings object (the runtime builds an operator per
    state chunk it loads; an expression compiles in ≈ 25 µs), with its column form
    (:func:`ctiflow.operators.cep.expr.expression.column_truth`, or None). A few dozen entries at most."""
    hit = _PREDICATES.get(id(settings))
    if hit is not None and hit[0] is settings:
        return hit[1], hit[2]
    predicate = compile_predicate(settings.predicate)
    truth = None
    if isinstance(settings.predicate, str) and predicate is not None \
            and hasattr(predicate, "uses_match_context"):
        from ctiflow.operators.cep.expr.expression import column_truth

        truth = column_truth(predicate)
    if len(_PREDICATES) >= 64:
        _PREDICATES.clear()
    _PREDICATES[id(settings)] = (settings, predicate, truth)
    return predicate, truth


def _expression_compiler() -> Callable[[str], Predicate] | None:
    """``ctiflow.operators.cep.expr.expression.compile_expression`` if that module exists, else None."""
    try:
        from ctiflow.operators.cep.expr.expression import compile_expression
    except ModuleNotFoundError as exc:
        if exc.name in ("ctiflow.operators.cep.expr.expression", "ctiflow.operators.cep"):
            return None
        raise
    return compile_expression


def _empty_at(h: ExponentialHistogram) -> int:
    """The first clock at which a time-window count drops ``h``'s key: its newest bucket out of
    the window (one past its ``now`` without a bucket)."""
    newest = h.newest()
    return h.now + 1 if newest is None else newest + h.window


def _others(rows: np.ndarray, n: int) -> np.ndarray:
    """The rows of ``range(n)`` not in ``rows``, ascending."""
    keep = np.ones(n, np.bool_)
    keep[rows] = False
    return np.flatnonzero(keep)


#: the due CTI of a key that no CTI drops (an event-count window)
_NEVER = 1 << 62


def _due(h: ExponentialHistogram, by_time: bool) -> int:
    """The first clock (cti − 1) at which a CTI drops ``h``'s key: its window empty and the
    clock past its ``now``; never for an event-count window."""
    return max(_empty_at(h), h.now + 1) if by_time else _NEVER


def _rows_of(histograms: dict[str, ExponentialHistogram], by_time: bool, window: int) -> NewRows:
    """Histograms as rows of :class:`~ctiflow.operators.packed.PackedStates`: each one's integers
    (``_dump``), little-endian, in one buffer, and its due clock (:func:`_due`, as columns)."""
    ints = array("q")
    ends, newest = ExponentialHistogram._dump_many(histograms.values(), ints)
    ends = np.array(ends, np.int64)
    if by_time:
        starts = ends - np.diff(ends, prepend=0)
        held = np.frombuffer(ints, np.int64)
        nows, empty = held[starts], held[starts + 1] == 0  # (a row: now, its number of levels, …)
        dues = np.maximum(np.where(empty, nows + 1, np.array(newest, np.int64) + window), nows + 1)
    else:
        dues = np.full(len(ends), _NEVER, np.int64)
    lengths = np.diff(ends, prepend=0) * 8
    return NewRows(list(histograms), dues, _le(ints).tobytes(), lengths, np.zeros(len(ends), np.int64))


_STATE_MAGIC = b"CTCO"
_STATE_VERSION = 3
# magic, version, window kind (0 events, 1 time), window, epsilon, clock, keys, the names' width
# in bytes (formats 1–2: the keys' UTF-8 bytes)
_STATE_HEADER = struct.Struct("<4sBBqdqII")


def pack_state(by_time: bool, window: int, epsilon: float, clock: int, plain: tuple,
               touched: np.ndarray) -> bytes:
    """A count operator snapshot of the current format: the header, the keys' names (as
    :meth:`PackedStates.to_plain` gives them: UTF-8, sorted, of one width), then little-endian
    int64s — the touched keys' count and rows, each key's due clock, its row's offsets — then the
    rows' bytes. ``touched``: the touched keys' rows in ``plain``, in their order."""
    names, width, dues, _runs, offsets, rows = plain
    head = np.array([len(touched), *touched.tolist()], "<i8")
    header = _STATE_HEADER.pack(_STATE_MAGIC, _STATE_VERSION, int(by_time), window, float(epsilon), clock,
                                len(offsets) // 8 - 1, width)
    return b"".join((header, names, head.tobytes(), dues, offsets, rows))


class CountOperator(Operator):
    """Keyed approximate counts (:class:`ctiflow.operators.operator.Operator`).

    Owns one histogram per key of its key group. Events must come in
    application-time order (the time layer guarantees it); for count-based windows that order
    defines the sequence numbers. A count-based key keeps its histogram for good (the last N
    events of a key never expire by time); a time-based key is forgotten once its window is
    empty at a CTI.
    """

    def __init__(self, settings: CountSettings) -> None:
        if not isinstance(settings, CountSettings):
            raise ConfigError(f"CountOperator needs CountSettings, got {type(settings).__name__}")
        super().__init__(settings)
        self._name = settings.name
        self._window_kind = settings.window_kind
        self._window = settings.window
        self._epsilon = float(settings.epsilon)
        self._per_key = settings.per_key
        self._predicate, self._truth = _compiled_predicate(settings)
        self._value_field = settings.value_field
        self._by_time = settings.window_kind == "time"
        self._per_event = settings.emit == "per_event"
        #: keys decoded since the last snapshot (touched by an event or a count); every other
        #: key stays bytes in :attr:`_rows`, due (column ``dues``) when a CTI would drop it
        self._histograms: dict[str, ExponentialHistogram] = {}
        self._rows = PackedStates()
        #: keys touched since the last CTI, in first-touch order → the key's latest start (None
        #: after a restore: snapshots keep the keys only, and the runtime never snapshots between
        #: an event and the CTI that follows it)
        self._touched: dict[str, int | None] = {}
        #: latest application time the operator has reached (event starts, cti − 1)
        self._clock = NO_TIME
        #: keys whose state changed since :meth:`changed_keys` last said (a histogram's lazy
        #: expiry by a CTI aside: every update expires first, so it is invisible)
        self._changed: set[str] = set()

    # -- the Operator contract ---------------------------------------------------------------

    def process_columns(self, cols) -> list[tuple[int, Any]]:
        """The rows of an :class:`ctiflow.operators.columns.EventColumns`, in application-time order:
        weights row by row (or as a column), then each key's histogram takes its rows in one
        ``update_many`` — the state of taking them one by one; the keys of one level of buckets
        before and after as columns, never decoded (:meth:`_take_small`). → ``(row, EventRejected)``
        per refused row (with ``emit: per_event``, also one ``(row, OutputBatch)``: :meth:`_each`), in
        row order. Record dicts are built only when a predicate or ``value_field`` reads them."""
        n = len(cols)
        mask = self._column_weights(cols, n)
        small = None
        if self._per_key and mask is not False:
            small = self._take_small(cols, mask)
        elif self._per_key and len(self._rows):  # the packed keys of these rows decoded at once
            self._load_many(cols.key_codes()[1])
        if self._per_event:
            return self._each(cols, mask, small)
        if mask is not False:
            rest = slice(None) if small is None else _others(small[0], n)
            return self._take_columns(cols.key[rest], cols.start[rest], None if mask is None else mask[rest])
        keys, starts = cols.key.tolist(), cols.start.tolist()
        records = cols.records()
        return self._take(range(n), keys, starts, records)

    def _take_small(self, cols, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The rows of the keys whose histogram is at most one level of buckets before and after
        them, no bucket leaving the window (a sparse key's usual state: a few buckets), taken as
        columns: each key's new buckets appended to its row of integers
        (:func:`~ctiflow.operators.histogram.appended`), the key never decoded; the state equals
        ``update`` of each row in turn. Every other key of the rows held as bytes is decoded
        (:meth:`_load_many`) for the histograms to take its rows. ``mask``: the rows' weights as
        booleans (None: 1 each). → the rows taken so, ascending, and each one's count after it
        (exact with one level of buckets of one event)."""
        codes, index = cols.key_codes()
        keys, n = list(index), len(codes)
        k, histograms, window = len(keys), self._histograms, self._window
        free = [key not in histograms for key in keys] if histograms else None
        asked = keys if free is None else [key for key, f in zip(keys, free) if f]
        taken, blob, ends = ([], b"", np.zeros(0, np.int64)) if not len(self._rows) else \
            self._rows.take_many(asked)
        ints = np.frombuffer(blob, "<i8").astype(np.int64, copy=False)
        lengths = np.diff(ends, prepend=0) // 8
        starts = ends // 8 - lengths
        held = one_level(ints, starts, lengths, buckets_per_size(self._epsilon))
        # per key (by its code): its state as columns; a new key has no bucket and no time yet
        at = np.fromiter(map(index.__getitem__, taken), np.int64, len(taken))
        ok = np.ones(k, np.bool_) if free is None else np.array(free, np.bool_)
        now, size, oldest, newest, begin = (np.full(k, v, np.int64)
                                            for v in (NO_TIME, 0, TIME_LIMIT, NO_TIME, 0))
        for column, values in zip((ok, now, size, oldest, newest, begin), (*held, starts)):
            column[at] = values
        # per row, grouped by key (a key's rows in their order)
        order = np.argsort(codes, kind="stable")
        per_key = np.bincount(codes, minlength=k)
        first = np.cumsum(per_key) - per_key
        last = first + per_key - 1
        grouped = codes[order]
        if self._by_time:
            times = cols.start[order].astype(np.int64)
            back = np.flatnonzero((np.diff(times) < 0) & (grouped[1:] == grouped[:-1]))
            ok[grouped[back + 1]] = False  # (a key's rows out of order: ``update`` refuses them)
            ok &= (now <= times[first]) & (np.abs(times[last]) <= TIME_LIMIT) \
                & (np.abs(times[first]) <= TIME_LIMIT)
        else:  # a count-based window's timestamps: the key's sequence numbers
            times = np.maximum(now, 0)[grouped] + (np.arange(n) - np.repeat(first, per_key)) + 1
        w = np.ones(n, np.int64) if mask is None else mask[order].astype(np.int64)
        counted = np.cumsum(w)
        within = counted - np.repeat(counted[first] - w[first], per_key)  # buckets added up to a row
        added = within[last]
        adds = w > 0
        add_codes, add_times = grouped[adds], times[adds]
        if len(add_codes):
            cut = np.flatnonzero(add_codes[1:] != add_codes[:-1])
            lead, tail = np.r_[0, cut + 1], np.r_[cut, len(add_codes) - 1]
            oldest[add_codes[lead]] = np.where(size[add_codes[lead]] > 0, oldest[add_codes[lead]],
                                               add_times[lead])
            newest[add_codes[tail]] = add_times[tail]
        ok &= (size + added <= buckets_per_size(self._epsilon)) & (oldest > times[last] - window)
        # the others decoded
        hard = np.flatnonzero(~ok[at])
        if len(hard) == len(taken):
            self._decode(taken, ints, ends // 8)
        elif len(hard):
            self._decode([taken[i] for i in hard.tolist()], ints[ranges(starts[hard], lengths[hard])],
                         np.cumsum(lengths[hard]))
        simple = np.flatnonzero(ok)
        self._changed.update(keys)
        if not self._per_event:  # (first-touch order: every key of the rows, the others' as theirs will be)
            touched = self._touched
            for key, latest in zip(keys, cols.start[order[last]].tolist()):
                seen = touched.get(key)
                if seen is None or latest > seen:
                    touched[key] = latest
        if not len(simple):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        mine = ok[grouped]
        state, lengths = appended(ints, begin[simple], size[simple], times[last][simple], added[simple],
                                  times[mine & adds])
        total = size[simple] + added[simple]
        if self._by_time:
            after = times[last][simple] + 1
            dues = np.where(total > 0, np.maximum(newest[simple] + window, after), after)
        else:
            dues = np.full(len(simple), _NEVER, np.int64)
        self._rows = self._rows.packed(NewRows([keys[i] for i in simple.tolist()], dues,
                                               state.astype("<i8", copy=False).tobytes(), lengths * 8,
                                               np.zeros(len(simple), np.int64)))
        rows = order[mine]
        clock = int(cols.start[rows].max())
        if clock > self._clock:
            self._clock = clock
        counts = (size[grouped] + within)[mine]
        ascending = np.argsort(rows)
        return rows[ascending], counts[ascending]

    def _take_columns(self, keys: np.ndarray, starts: np.ndarray, mask: np.ndarray | None) -> list:
        """:meth:`_take` for rows whose weights are known as a column (``mask``; None: 1 each):
        rows grouped by key with NumPy (a stable sort by the row of each key's first appearance), then one
        ``update_many`` per key in first-appearance order, as :meth:`_take` does. Refuses nothing."""
        n = len(keys)
        if n == 0:
            return []
        if self._per_key:  # a row's id: the row where its key first appears
            first: dict[str, int] = {}
            ids = np.fromiter(map(first.setdefault, keys.tolist(), naturals()), np.int64, n)
        else:
            ids = np.zeros(n, np.int64)
        order = np.argsort(ids, kind="stable")
        cuts = np.flatnonzero(np.diff(ids[order])) + 1
        starts = np.asarray(starts, np.int64)
        histograms, clock, changed = self._histograms, self._clock, self._changed
        for rows in np.split(order, cuts) if len(cuts) else (order,):
            key = keys[rows[0]] if self._per_key else GLOBAL_KEY
            changed.add(key)
            h = self._get(key)
            if h is None:
                h = histograms[key] = ExponentialHistogram(self._window, self._epsilon)
            clock = self._update_key(key, h, starts[rows], None if mask is None else mask[rows], clock)
        self._clock = clock
        return []

    def _each(self, cols, weights: np.ndarray | None | bool,
              small: tuple[np.ndarray, np.ndarray] | None) -> list[tuple[int, Any]]:
        """``emit: per_event``: the rows one by one into their keys' histograms, each row's count
        record the state after it (at the event's start, the event included); every record in one
        :class:`OutputBatch` in row order (at the last row taken), with the rows :meth:`_take_small`
        took (``small``: their rows and counts). ``weights``: as :meth:`_column_weights` gives them.
        A row whose weight is refused leaves the state unchanged (its key's histogram exists, as it
        would before its weight were known)."""
        n = len(cols)
        refused: list[tuple[int, Any]] = []
        rows = list(range(n)) if small is None else _others(small[0], n).tolist()
        if weights is False:
            weights, weigh = [0] * n, self._weight
            for j, fields in enumerate(cols.records()):
                try:
                    weights[j] = weigh(fields)
                except EventRejected as exc:
                    refused.append((j, exc))
        elif weights is not None:
            weights = weights[rows].tolist()
        skip = {j for j, _ in refused}
        keys = cols.key[rows].tolist() if self._per_key else [GLOBAL_KEY] * len(rows)
        starts, by_time, histograms = cols.start[rows].tolist(), self._by_time, self._histograms
        taken: list[int] = []
        summaries: list[tuple] = []
        for j, key, start, w in zip(rows, keys, starts, repeat(1) if weights is None else weights):
            h = histograms.get(key) or self._get(key)
            if h is None:
                h = histograms[key] = ExponentialHistogram(self._window, self._epsilon)
            if j in skip:
                continue
            h.update(start if by_time else h.now + 1 if h.now > 0 else 1, w)
            summaries.append(h.summary())
            taken.append(j)
        self._changed.update(keys)
        columns = [np.array(c) for c in zip(*summaries)] if summaries else \
            [np.zeros(0, float), *[np.zeros(0, np.int64)] * 4]
        done = np.array(taken, np.int64)
        if small is not None and len(small[0]):
            done = np.concatenate((done, small[0]))
            counts = small[1]
            columns = [np.concatenate((c, counts.astype(c.dtype))) for c in columns]
            order = np.argsort(done, kind="stable")
            done, columns = done[order], [c[order] for c in columns]
        if not len(done):
            return refused
        clock = int(cols.start[done].max())
        if clock > self._clock:
            self._clock = clock
        keys = cols.key[done] if self._per_key else GLOBAL_KEY
        batch = self._records(keys, cols.start[done], columns, len(done))
        return sorted([*refused, (int(done[-1]), batch)], key=lambda r: r[0])

    def _column_weights(self, cols, n: int) -> np.ndarray | None | bool:
        """The rows' weights known without reading records: None (1 each: no predicate, no
        ``value_field``), the predicate on whole columns where exact (a boolean column), or False:
        weigh row by row."""
        if self._value_field is not None:
            return False
        if self._predicate is None:
            return None
        mask = self._truth(cols.fields, n) if self._truth is not None else None
        return False if mask is None else np.asarray(mask, np.bool_)

    def _update_key(self, key: str, h: ExponentialHistogram, starts, weights, clock: int) -> int:
        """One key's events (their starts, in application-time order, and weights) into its
        histogram, the key marked touched at its latest start; → ``clock`` advanced to it."""
        if self._by_time:
            h.update_many(starts, weights)
        else:
            base = h.now if h.now > 0 else 0
            h.update_many(np.arange(base + 1, base + 1 + len(starts), dtype=np.int64), weights)
        last = int(starts[-1])  # application-time order: a key's latest start is its last
        seen = self._touched.get(key)
        if seen is None or last > seen:
            self._touched[key] = last
        return last if last > clock else clock

    def _take(self, rows=(), keys=(), starts=(), records=None,
              weights=None) -> list[tuple[int, EventRejected]]:
        """Events ``rows`` (their keys, starts and records; ``records`` None: weight 1 each, or
        the given ``weights``) in application-time order into their keys' histograms, one
        ``update_many`` per key."""
        weight, per_key, histograms = self._weight, self._per_key, self._histograms
        by_key: dict[str, tuple[list[int], list[int]]] = {}
        order: list[str] = []  # keys by their first event taken (the order process() touches them)
        refused: list[tuple[int, EventRejected]] = []
        given = iter(weights) if weights is not None else None
        for j, key, start, fields in zip(rows, keys, starts,
                                         records if records is not None else repeat(None)):
            if not per_key:
                key = GLOBAL_KEY
            mine = by_key.get(key)
            if mine is None:
                mine = by_key[key] = ([], [])
                self._changed.add(key)
                # as process: the key's histogram exists before its weight is known
                if key not in histograms and self._get(key) is None:
                    histograms[key] = ExponentialHistogram(self._window, self._epsilon)
            if given is not None:
                w = next(given)
            elif fields is None:
                w = 1
            else:
                try:
                    w = weight(fields)
                except EventRejected as exc:
                    refused.append((j, exc))
                    continue
            if not mine[0]:
                order.append(key)
            mine[0].append(start)
            mine[1].append(w)
        clock = self._clock
        for key in order:
            starts, weights = by_key[key]
            clock = self._update_key(key, histograms[key], starts, weights, clock)
        self._clock = clock
        return refused

    def advance_to(self, cti: int) -> list[OutputBatch]:
        """The touched keys' counts at the CTI (module docstring), as one :class:`OutputBatch`."""
        changed = self._changed
        changed.update(self._touched)  # (emitted: no longer touched)
        if cti >= CTI_INFINITY:
            out = self._emit_touched(None)
            changed.update(self._histograms)
            changed.update(self._rows)
            self._histograms.clear()
            self._rows = PackedStates()
            return out
        tau = cti - 1
        if tau > self._clock:
            self._clock = tau
        out = self._emit_touched(self._clock)
        if self._by_time:
            self._drop_empty(self._clock)
        return out

    def _drop_empty(self, clock: int) -> None:
        """Forget the keys whose time window is empty at ``clock`` (and that ``clock`` is past):
        the decoded ones checked, the others found by their due column. Their buckets are not
        advanced here: they expire at the key's next update or count, which is invisible."""
        histograms, changed = self._histograms, self._changed
        empty = [key for key, h in histograms.items() if _due(h, True) <= clock]
        for key in empty:
            del histograms[key]
        changed.update(empty)
        raw = self._rows
        gone = raw.due_keys(clock)
        for key in gone:
            raw.drop(key)
        changed.update(gone)

    def _get(self, key: str) -> ExponentialHistogram | None:
        """``key``'s histogram, decoded from its bytes on first use since the last snapshot."""
        h = self._histograms.get(key)
        if h is None and key in self._rows:
            self._load_many([key])
            h = self._histograms[key]
        return h

    def _load_many(self, keys: Sequence[str]) -> None:
        """The histograms of those of ``keys`` (distinct) held as bytes, decoded at once: one
        search and one copy of their rows, one list of their integers (with sparse keys nearly
        every key of a batch is held as bytes; one by one a key cost ≈ 3 µs more)."""
        histograms = self._histograms
        taken, blob, ends = self._rows.take_many([key for key in keys if key not in histograms])
        self._decode(taken, np.frombuffer(blob, "<i8"), ends // 8)

    def _decode(self, keys: list[str], ints: np.ndarray, ends: np.ndarray) -> None:
        """``keys``' histograms from their rows of integers (``_dump``'s, one after the other, each
        ending at ``ends``), into :attr:`_histograms`."""
        try:
            loaded, _ = ExponentialHistogram._load_many(self._window, self._epsilon, ints.tolist(), 0,
                                                        ends.tolist())
        except ValueError as exc:
            raise ValueError(f"count operator state: {exc}") from None
        self._histograms.update(zip(keys, loaded))

    def _pack(self) -> None:
        """Every decoded key back to its bytes in :attr:`_rows`."""
        if self._histograms:
            self._rows = self._rows.packed(_rows_of(self._histograms, self._by_time, self._window))
        self._histograms = {}

    def snapshot(self) -> bytes:
        """Every key as a row of :class:`~ctiflow.operators.packed.PackedStates` (its histogram's
        integers, its due clock), in one buffer (:func:`pack_state`)."""
        self._pack()
        packed = self._rows = self._rows.packed(())
        touched = packed.find(list(self._touched))
        if (touched < 0).any():
            raise RuntimeError("count operator: a touched key has no state")  # (a bug: never stored)
        return pack_state(self._by_time, self._window, self._epsilon, self._clock, packed.to_plain(), touched)

    @classmethod
    def restore(cls, settings: CountSettings, data: bytes) -> "CountOperator":
        op = cls(settings)
        if len(data) < _STATE_HEADER.size:
            raise ValueError("not a count operator snapshot (too short)")
        magic, version, by_time, window, epsilon, clock, nkeys, width = _STATE_HEADER.unpack_from(data)
        if magic != _STATE_MAGIC:
            raise ValueError(f"not a count operator snapshot (magic {magic!r})")
        snapshots.check_format("count operator", version, _STATE_VERSION)
        if (bool(by_time), window, epsilon) != (op._by_time, settings.window, float(settings.epsilon)):
            kind = "time" if by_time else "events"
            raise ConfigError(
                f"count state of {settings.name!r} was written with window_kind={kind}, window={window}, "
                f"epsilon={epsilon}; restore it with those settings or start from an empty checkpoint"
            )
        pos = _STATE_HEADER.size
        names_len = width * nkeys
        if not width or len(data) < pos + names_len + 8:
            raise ValueError("count operator snapshot is truncated or malformed")
        names = np.frombuffer(data, f"S{width}", nkeys, pos) if nkeys else None
        pos += names_len
        (ntouched,) = struct.unpack_from("<q", data, pos)
        if not 0 <= ntouched <= nkeys:
            raise ValueError("count operator snapshot is truncated or malformed")
        pos += 8
        columns = np.frombuffer(data, "<i8", ntouched + 2 * nkeys + 1, pos).astype(np.int64, copy=False)
        touched, dues, offsets = np.split(columns, [ntouched, ntouched + nkeys])
        rows = data[pos + 8 * len(columns):]
        if offsets[0] != 0 or offsets[-1] != len(rows) or (nkeys and np.diff(offsets).min() <= 0) \
                or (ntouched and not (0 <= touched.min() and touched.max() < nkeys)):
            raise ValueError("count operator snapshot is truncated or malformed")
        op._rows = PackedStates(names, dues, None, offsets, rows)
        op._touched = dict.fromkeys(op._rows.keys_of(touched))
        op._clock = clock
        return op

    def live_keys(self) -> set[str]:
        """Keys with state."""
        return set(self._histograms).union(self._rows)

    def key_count(self) -> int:
        """(:meth:`Operator.key_count`: a key is decoded or packed, never both)"""
        return len(self._histograms) + len(self._rows)

    def next_due(self) -> int:
        """Keys touched since the last CTI emit at the next one (due now); otherwise only a
        time window that becomes empty changes state: a key is empty once τ = cti − 1 ≥ its newest
        bucket + window (the expiry heap's earliest entry is at or before that). Buckets expiring
        earlier need no CTI: every update expires first, so skipped advances are invisible.
        Event-count windows never expire."""
        if self._touched and not self._per_event:
            return CTI_NONE
        if not self._by_time:
            return CTI_INFINITY
        due = min((_due(h, True) for h in self._histograms.values()), default=CTI_INFINITY)
        due = min(due, self._rows.next_due(CTI_INFINITY))
        return due + 1 if due < CTI_INFINITY else CTI_INFINITY

    def partition(self, where) -> dict[int, "CountOperator"]:
        """This operator's keys split by ``where(key)`` into operators of the same settings and
        clock, each holding exactly its keys' histograms; ``self`` is not used afterwards."""
        self._pack()
        parts: dict[int, CountOperator] = {}
        for d, raw in self._rows.split(where).items():
            part = parts[d] = CountOperator(self.settings)
            part._clock = self._clock
            part._rows = raw
        for key, last in self._touched.items():
            parts[where(key)]._touched[key] = last
        return parts

    @classmethod
    def traits(cls, settings: CountSettings) -> Traits:
        """A global count (``per_key`` false) keeps one histogram under :data:`GLOBAL_KEY`."""
        return Traits(partitions=True) if settings.per_key else Traits("one key", GLOBAL_KEY, partitions=True)

    def forget_keys(self, keys) -> None:
        """Drop the keys' counts (the key TTL): a key's next event starts a new window."""
        keys = list(keys)
        self._rows.drop_many(keys)
        for key in keys:
            self._histograms.pop(key, None)
            self._touched.pop(key, None)
            self._changed.add(key)

    def changed_keys(self) -> set[str]:
        """(:meth:`Operator.changed_keys`)"""
        changed, self._changed = self._changed, set()
        return changed

    def delta(self, keys) -> tuple[bytes, list[str]]:
        """(:meth:`Operator.delta`): the touched keys always in, so their order survives
        :meth:`absorb`."""
        self._pack()
        part = CountOperator(self.settings)
        part._clock = self._clock
        part._rows = self._rows.subset(sorted({*keys, *self._touched}))
        part._touched = dict(self._touched)
        return part.snapshot(), self._rows.absent(keys, self._histograms)

    def absorb(self, part: "CountOperator", keys) -> None:
        """(:meth:`Operator.absorb`)"""
        histograms, raw = self._histograms, self._rows
        part._pack()
        new = part._rows.columns()
        gone = set(keys).union(new.keys)  # (its keys are mostly among ``keys``: each found once)
        raw.drop_many(gone)
        for key in gone:
            histograms.pop(key, None)
        self._rows = raw.packed(new)
        self._touched = dict(part._touched)
        if part._clock > self._clock:
            self._clock = part._clock

    # -- queries (tests, tools) --------------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        return [*self._histograms, *self._rows]

    def histogram(self, key: str) -> ExponentialHistogram | None:
        return self._get(key)

    # -- internals ---------------------------------------------------------------------------

    def _weight(self, fields: Mapping[str, Any]) -> int:
        predicate = self._predicate
        if predicate is not None and not predicate(fields):
            return 0
        name = self._value_field
        if name is None:
            return 1
        value = fields.get(name)
        if value is None:
            return 0
        if type(value) is not int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            elif isinstance(value, int):
                value = int(value)
            else:
                raise EventRejected(
                    f"counter {self.settings.name!r}: value_field {name!r} is {value!r}; "
                    "sums need non-negative integers"
                )
        if value < 0:
            raise EventRejected(
                f"counter {self.settings.name!r}: value_field {name!r} is {value}; sums need non-negative "
                "integers"
            )
        return value

    def _emit_touched(self, at: int | None) -> list[OutputBatch]:
        """A record per touched key (first-touch order) at ``at``; ``None`` (the final CTI): at
        the key's latest start. A key held as a row of one level of buckets is counted in its row
        (:meth:`_count_small`); any other is decoded (all at once) and its histogram asked."""
        if self._per_event or not self._touched:
            self._touched.clear()
            return []
        by_time, clock, touched = self._by_time, self._clock, self._touched
        keys = list(touched)
        times = [at if at is not None else (last if last is not None else clock) for last in touched.values()]
        touched.clear()
        counts = np.full(len(keys), -1, np.int64)
        if self._per_key and len(self._rows):
            counts = self._count_small(keys, np.array(times, np.int64))
        rest = np.flatnonzero(counts < 0).tolist()
        if len(self._rows) and rest:  # (the others held as bytes decoded at once)
            self._load_many([keys[i] for i in rest])
        columns = [counts.astype(float), counts, counts.copy(), counts.copy(), counts.copy()]
        for i in rest:
            h, time = self._get(keys[i]), times[i]
            if by_time and time > h.now:
                h.advance(time)
            for column, value in zip(columns, h.summary()):
                column[i] = value
        return [self._records(keys, times, columns, len(keys))]

    def _records(self, keys, times, columns, n: int) -> OutputBatch:
        """``n`` count records (``schemas/count.avsc``) of ``keys`` (a column, or one key for all)
        at ``times``; ``columns``: the summaries' columns (estimate, lower, upper, seed estimate,
        bucket count)."""
        estimate, lower, upper, seed_estimate, bucket_count = columns
        return OutputBatch("count", {
            "counter": self._name, "key": keys, "time": times, "window_kind": self._window_kind,
            "window": self._window, "epsilon": self._epsilon, "estimate": estimate, "lower": lower,
            "upper": upper, "seed_estimate": seed_estimate, "bucket_count": bucket_count,
            "exact": None}, n)

    def _count_small(self, keys: list[str], times: np.ndarray) -> np.ndarray:
        """The counts at ``times`` of those of ``keys`` held as a row of at most one level of
        buckets (:func:`~ctiflow.operators.histogram.one_level`), −1 for the others: the row's
        buckets, for a time window those after ``time − window``, the row then moved to ``time``
        with the others dropped, as ``advance`` does (the state of its histogram counted so)."""
        rows, window = self._rows, self._window
        at = rows.find(keys)
        counts = np.full(len(keys), -1, np.int64)
        mine = np.flatnonzero(at >= 0)
        if not len(mine):
            return counts
        ints = np.frombuffer(rows.blob, "<i8").astype(np.int64, copy=False)
        offsets = rows.offsets
        starts, lengths = offsets[at[mine]] // 8, (offsets[at[mine] + 1] - offsets[at[mine]]) // 8
        held = one_level(ints, starts, lengths, buckets_per_size(self._epsilon))
        size = held.size
        if not self._by_time:  # (a count-based window moves with events only)
            counts[mine[held.ok]] = size[held.ok]
            return counts
        times = times[mine]
        stamps = ints[ranges(starts + 3, size)]
        kept = np.bincount(np.repeat(np.arange(len(mine)), size), minlength=len(mine),
                           weights=stamps > np.repeat(times - window, size)).astype(np.int64)
        move = held.ok & (times > held.now)
        counts[mine[held.ok]] = np.where(move, kept, size)[held.ok]
        moved = np.flatnonzero(move)
        if len(moved):
            names = [keys[i] for i in mine[moved].tolist()]
            rows.drop_many(names)
            left, when = kept[moved], times[moved]
            state, lengths = appended(ints, starts[moved] + size[moved] - left, left, when,
                                      np.zeros(len(moved), np.int64), np.zeros(0, np.int64))
            dues = np.where(left > 0, np.maximum(held.newest[moved] + window, when + 1), when + 1)
            self._rows = rows.packed(NewRows(names, dues, state.astype("<i8", copy=False).tobytes(),
                                             lengths * 8, np.zeros(len(moved), np.int64)))
        return counts


_BIG_ENDIAN = struct.pack("=q", 1) != struct.pack("<q", 1)
