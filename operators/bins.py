"""Proration of interval events into fixed time bins (seeds/spark-pr-2633-event-proration.txt).

Bins of size ``B`` from an ``origin``: bin ``k`` covers the half-open interval
``(k·B + origin, (k+1)·B + origin]`` (the PR's convention: "binStart is not inclusive").
An event with start ``s`` and end ``e > s`` contributes to every bin it overlaps with
fraction ``(min(e, bin_end) − max(s, bin_start)) / (e − s)``; an event with ``e == s``
contributes fraction 1 to the one bin with ``bin_start < s ≤ bin_end``. The fractions of an
event sum to 1, so measures are conserved: Σ final bins + Σ late shares = Σ events.

The :class:`Binner` turns a stream of such events into three result streams (PR cases 1–3):

* ``bin_incremental`` — at each CTI, per touched bin, the contribution of the events
  processed since the previous CTI (downstream adds them up);
* ``bin_updated`` — at each CTI, per touched bin, the cumulative value and a revision
  number 1, 2, … (downstream overwrites);
* ``bin_final`` — each bin exactly once, when the CTI has passed its end.

**When is a bin final?** A CTI ``c`` promises that no later event starts before ``c``. An
interval event starting at ``c`` does not touch a bin ending at ``c`` (it covers ``(c, e]``),
but a *zero-length* event at ``s == c`` does: it belongs to the bin ``(c − B, c]``. So a bin
is final when ``bin_end < cti``, not ``≤``; a CTI exactly on a bin edge finalises that bin at
the next CTI. ``CTI_INFINITY`` finalises every bin.

**Determinism.** Every contribution is added to its bin's cumulative sums one at a time, in
processing order (application-time order, as the reorder buffer delivers it). For events
that arrive within the delay, that order — hence every cumulative and final value, bit for
bit — does not depend on arrival order, on how events are cut into CTI steps, on
how the events are cut into ``process_columns`` calls, nor on snapshots in between.

**Late events.** With ``ViolationPolicy.ADJUST`` the time layer moves the start of an
interval event that reaches past the CTI to the CTI and keeps the real start in
``original_start``. The binner prorates over the *original* lifetime, applies the shares of
bins still open and returns the share of already-final bins as one ``late`` record
(:func:`late_share` builds it). ``Binner.handles_adjust`` is therefore True.

Hot path: ``process`` only validates the event and appends its columns to a buffer; the
buffer is prorated in bulk with numpy at the next CTI (or every ``_FLUSH_AT`` events). Bin
state lives in preallocated column arrays, one slot per open (key, bin) — no Python object
per bin or per (event, bin) contribution; the only per-bin objects are the output records.
"""

from __future__ import annotations

import json
import math
import numbers
import struct
from dataclasses import dataclass, replace
from collections.abc import Collection, Iterator
from typing import Any, Iterable, NamedTuple

import numpy as np

from ctiflow.operators.errors import ConfigError, EventRejected, invalid_choice
from ctiflow.operators.events import MapColumn, OutputBatch
from ctiflow.operators.operator import Operator, Output, Traits
from ctiflow.operators.packed import names_of, rows_in, rows_of_names
from ctiflow.operators.time import (
    CTI_INFINITY,
    CTI_NONE,
    REASON_BEFORE_CTI,
    REASON_DROPPED,
    Event,
    ViolationPolicy,
    late_record,
)

__all__ = [
    "OUTPUT_KINDS",
    "REASON_FINAL_BINS",
    "BinShare",
    "BinSettings",
    "Binner",
    "prorate",
    "late_share",
]

#: The selectable result streams; the role of a record is ``"bin_" + kind``.
OUTPUT_KINDS = frozenset({"incremental", "updated", "final"})

#: Largest accepted |origin|: keeps every bin index of an in-range time inside int64.
_MAX_ORIGIN = 2**61
#: Times within ±2**52 keep every bin edge and every event length ≤ 2**53, where int→float
#: is exact; numpy then computes the very same fractions as Python's exact ``int / int``.
_FAST_LIMIT = 2**52
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
#: Buffered events are prorated once this many are waiting (bounds memory between CTIs).
_FLUSH_AT = 1 << 16
#: :meth:`Binner._find` sorts live and wanted (key, bin) pairs together above this many, else uses a dict
_FIND_BY_DICT = 256
#: The key table is renumbered when it holds more keys than this and than twice the open bins.
_FORGET_KEYS_ABOVE = 1024
#: At most this many (event, bin) contributions are materialised at once (~100 bytes each).
_MAX_CONTRIBUTIONS = 1 << 20

_SNAPSHOT_MAGIC = b"CTIFLOW-BINS\x03"
#: snapshots of version 2 (before 2026-12-01): the keys a JSON list in the header
_SNAPSHOT_MAGIC_2 = b"CTIFLOW-BINS\x02"

#: Reason of the late record of an ADJUSTed event: its share of bins already emitted final.
REASON_FINAL_BINS = "adjust: share of final bins"


class BinShare(NamedTuple):
    """One event's share of one bin ``(bin_start, bin_end]``."""

    bin_start: int
    bin_end: int
    fraction: float


def _bin_range(start: int, end: int, bin_size: int, origin: int) -> tuple[int, int]:
    """Indices of the first and last bin an event touches (the PR's ``filter``).

    A bin ``(b, b + B]`` is touched by an interval ``(s, e]`` when ``s < b + B`` and ``e > b``;
    by a zero-length event when ``b < s ≤ b + B``.
    """
    if end == start:
        k = (start - origin - 1) // bin_size
        return k, k
    return (start - origin) // bin_size, (end - origin - 1) // bin_size


def prorate(start: int, end: int, bin_size: int, origin: int = 0) -> list[BinShare]:
    """The bins an event touches and its fraction of each, in bin order.

    Each fraction is computed exactly as the formula says — ``(min(e, bin_end) −
    max(s, bin_start)) / (e − s)``, a correctly rounded quotient of two integers — so the
    fractions sum to 1 up to rounding (≈ n·2⁻⁵³ for n bins). Raises ``ValueError`` when
    ``end < start`` (the job dead-letters such an event) or ``bin_size < 1``.
    """
    if not isinstance(bin_size, int) or bin_size < 1:
        raise ValueError(f"bin_size must be a positive integer (ms), got {bin_size!r}")
    if end < start:
        raise ValueError(f"event ends before it starts: start={start}, end={end}")
    k0, k1 = _bin_range(start, end, bin_size, origin)
    length = end - start
    if length == 0:
        bin_start = k0 * bin_size + origin
        return [BinShare(bin_start, bin_start + bin_size, 1.0)]
    shares = []
    for k in range(k0, k1 + 1):
        bin_start = k * bin_size + origin
        bin_end = bin_start + bin_size
        shares.append(BinShare(bin_start, bin_end, (min(end, bin_end) - max(start, bin_start)) / length))
    return shares


def _check_choice(name: str, value: Any, valid: Iterable[str]) -> None:
    valid = sorted(valid)
    if value not in valid:
        raise invalid_choice(name, value, valid)


@dataclass(frozen=True)
class BinSettings:
    """What a binner computes: bins of ``bin_size`` ms from ``origin``, summing ``measures``.

    ``measures`` are numeric record fields (``Event.fields``); ``outputs`` selects the
    result streams among ``incremental``, ``updated``, ``final``; ``policy`` is the
    stream's violation policy (decides what a late event contributes). An event touching
    more than ``max_bins_per_event`` bins is rejected (``ValueError`` → dead-letter) instead
    of exhausting memory.
    """

    name: str
    bin_size: int
    origin: int = 0
    measures: tuple[str, ...] = ()
    outputs: frozenset[str] = OUTPUT_KINDS
    policy: ViolationPolicy = ViolationPolicy.DROP
    max_bins_per_event: int = 1_000_000

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f'Invalid "name" value: {self.name!r}. Give the binner a non-empty name.')
        for fname, value, low, high in (
            ("bin_size", self.bin_size, 1, 2**62),
            ("origin", self.origin, -_MAX_ORIGIN, _MAX_ORIGIN),
            ("max_bins_per_event", self.max_bins_per_event, 1, 2**62),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(
                    f'Invalid "{fname}" value: {value!r}. Use an integer (ms) in [{low}, {high}].'
                )
        measures = (self.measures,) if isinstance(self.measures, str) else tuple(self.measures)
        for m in measures:
            if not isinstance(m, str) or not m:
                raise ConfigError(f'Invalid "measures" entry: {m!r}. Name a numeric record field.')
        if len(set(measures)) != len(measures):
            raise ConfigError(f'Invalid "measures" value: {list(measures)}. Each field may appear once.')
        object.__setattr__(self, "measures", measures)
        outputs = frozenset((self.outputs,) if isinstance(self.outputs, str) else self.outputs)
        if not outputs:
            raise ConfigError('Invalid "outputs" value: empty. Choose at least one of: final, incremental, '
                              'updated.')
        for kind in outputs:
            _check_choice("outputs", kind, OUTPUT_KINDS)
        object.__setattr__(self, "outputs", outputs)
        if not isinstance(self.policy, ViolationPolicy):
            _check_choice("policy", self.policy, [p.value for p in ViolationPolicy])
            object.__setattr__(self, "policy", ViolationPolicy(self.policy))


def _measure_values(event: Event, measures: tuple[str, ...]) -> list[Any]:
    """The event's measure values, checked: present, real numbers (bools count as 0/1), finite."""
    fields = event.fields
    try:
        values = [fields[m] for m in measures]
    except (KeyError, TypeError):
        missing = [m for m in measures if not isinstance(fields, dict) or m not in fields]
        raise EventRejected(
            f"event of key {event.key!r} (partition {event.partition}, offset {event.offset}) "
            f"lacks measure field(s) {missing}"
        ) from None
    for m, v in zip(measures, values):
        if not isinstance(v, numbers.Real):
            raise EventRejected(f"measure {m!r} of key {event.key!r} is not a number: {v!r}")
        try:
            if not math.isfinite(float(v)):
                raise OverflowError
        except OverflowError:
            raise EventRejected(f"measure {m!r} of key {event.key!r} is not a finite number: {v!r}") from None
    return values


def _check_times(event: Event, settings: BinSettings) -> None:
    start, end = event.start, event.end
    real = start if event.original_start is None else event.original_start
    if end < real or end < start:
        raise EventRejected(f"event of key {event.key!r} ends before it starts: start={real}, end={end}")
    if real <= CTI_NONE or end >= CTI_INFINITY:
        raise EventRejected(
            f"event of key {event.key!r} has times outside ({CTI_NONE}, {CTI_INFINITY}): "
            f"start={real}, end={end}; open-ended (edge) events cannot be prorated"
        )
    k0, k1 = _bin_range(real, end, settings.bin_size, settings.origin)
    if k1 - k0 >= settings.max_bins_per_event:
        raise EventRejected(
            f"event of key {event.key!r} spans {k1 - k0 + 1} bins of {settings.bin_size} ms, "
            f"more than max_bins_per_event={settings.max_bins_per_event}"
        )


def _last_final_bin(cti: int, settings: BinSettings) -> int:
    """Index of the newest bin that is final at ``cti`` (``bin_end < cti``)."""
    if cti >= CTI_INFINITY:
        return _INT64_MAX
    return (cti - settings.origin - 1) // settings.bin_size - 1


def _split(event: Event, cti: int, settings: BinSettings,
           values: list[Any]) -> tuple[dict | None, int | None]:
    """Split an event that may be late at ``cti`` into its late record and the first bin still applied.

    Returns ``(late record or None, index of the first bin to apply or None)``; None as the
    second item means nothing of the event is applied. The late record is the time layer's
    (:func:`ctiflow.operators.time.late_record`, the event as it arrived) plus ``fraction`` and
    ``measures``: the dropped share.
    """
    real = event.start if event.original_start is None else event.original_start
    end = event.end
    applied_from: int | None = None
    if real >= cti:
        return None, _bin_range(real, end, settings.bin_size, settings.origin)[0]
    if settings.policy is ViolationPolicy.DROP:
        reason = REASON_DROPPED
    elif end <= cti:
        reason = REASON_BEFORE_CTI
    else:
        reason = REASON_FINAL_BINS
        applied_from = _last_final_bin(cti, settings) + 1
    if applied_from is None:
        fraction = 1.0
        measures = {m: float(v) for m, v in zip(settings.measures, values)}
    else:
        fraction = 0.0
        sums = [0.0] * len(values)
        first = _bin_range(real, end, settings.bin_size, settings.origin)[0]
        if first >= applied_from:
            return None, applied_from
        for k, share in enumerate(prorate(real, end, settings.bin_size, settings.origin), start=first):
            if k >= applied_from:
                break
            fraction += share.fraction
            for i, v in enumerate(values):
                sums[i] += v * share.fraction
        measures = dict(zip(settings.measures, sums))
    arrived = event if event.original_start is None else replace(event, start=real, original_start=None)
    record = late_record(arrived, cti, reason, settings.policy).record
    record["fraction"] = fraction
    record["measures"] = measures
    return record, applied_from


def late_share(event: Event, cti: int, settings: BinSettings) -> dict[str, Any] | None:
    """The ``late`` record for the part of ``event`` the policy keeps out of the bins at ``cti``.

    ``None`` when nothing is dropped (the event is not late, or — with ADJUST — it touches
    no final bin). DROP, or an ADJUST event wholly before the CTI (``end <= cti``): the whole
    event, fraction 1. ADJUST, event reaching past the CTI: prorated over its *original*
    lifetime (``original_start`` if set), the shares of the bins with ``bin_end < cti``.

    The record is :func:`ctiflow.operators.time.late_record`'s (``stream, key, start, end, cti,
    reason, policy, partition, offset, fields_json``; ``start`` is the original start) plus
    ``fraction`` (the dropped share of the event) and ``measures`` (the dropped measure
    values). :class:`Binner` returns it for an ADJUSTed event; for DROP it describes what the
    time layer drops (the time layer's own record has no ``fraction``/``measures``).
    """
    _check_times(event, settings)
    return _split(event, cti, settings, _measure_values(event, settings.measures))[0]


def _expand(s: np.ndarray, e: np.ndarray, k0: np.ndarray, nb: np.ndarray, bin_size: int,
            origin: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`prorate` of many events at once: (row, bin index, fraction) per contribution.

    Rows in order, bins ascending within a row. Only for times within ±2**52: then every
    operand of the division is an exactly representable integer, and the quotient is the
    same correctly rounded double as Python's ``int / int`` in :func:`prorate`.
    """
    n = len(s)
    total = int(nb.sum())
    if total == n:
        return np.arange(n), k0, np.ones(n)
    rows = np.repeat(np.arange(n), nb)
    first = np.cumsum(nb) - nb
    k = k0[rows] + (np.arange(total) - first[rows])
    bin_start = k * bin_size + origin
    sr, er = s[rows], e[rows]
    num = np.minimum(er, bin_start + bin_size) - np.maximum(sr, bin_start)
    den = er - sr
    single = den == 0
    if single.any():
        num[single] = 1
        den[single] = 1
    return rows, k, num / den


class _Keys:
    """A binner's key ids and keys: the keys of the snapshot it was restored from as a sorted
    UTF-8 column (:func:`ctiflow.operators.packed.names_of`; ids ``0 … n−1`` in that order), the
    keys added since in a list (ids from ``n``) and ``ids``, a dict of them. A lookup is one
    binary search of the column for all its keys (:func:`~ctiflow.operators.packed.rows_in`),
    then ``ids`` for those not in it: no key of the column becomes a string until one is asked
    for by id (:meth:`keys_of`). Until 2026-12-04 ``ids`` also remembered every key looked up,
    and a lookup of more than an eighth of the column made every key of it a string — with sparse
    keys, every chunk a worker read from the store (10–25 ms a 65,536-key chunk)."""

    __slots__ = ("names", "added", "ids")

    def __init__(self, names: np.ndarray | None = None, added: list[str] | None = None) -> None:
        self.names = np.zeros(0, "S1") if names is None else names
        self.added: list[str] = added or []
        n = len(self.names)
        self.ids: dict[str, int] = dict(zip(self.added, range(n, n + len(self.added))))

    def __len__(self) -> int:
        return len(self.names) + len(self.added)

    def find(self, keys: list[str]) -> np.ndarray:
        """Each key's id, −1 for a key not held."""
        got = rows_in(self.names, keys)
        if self.ids:
            miss = np.flatnonzero(got < 0)
            if len(miss):
                ids = self.ids
                got[miss] = np.fromiter((ids.get(keys[i], -1) for i in miss.tolist()), np.int64, len(miss))
        return got

    def ids_of(self, keys: list[str]) -> np.ndarray:
        """Each key's id, keys not held added (in order of first appearance)."""
        got = self.find(keys)
        miss = np.flatnonzero(got < 0)
        if len(miss):
            ids, added, base = self.ids, self.added, len(self.names)
            new = [keys[i] for i in miss.tolist()]
            for k in dict.fromkeys(new):
                ids[k] = base + len(added)
                added.append(k)
            got[miss] = np.fromiter(map(ids.__getitem__, new), np.int64, len(new))
        return got

    def ids_of_table(self, other: "_Keys") -> np.ndarray:
        """The id here of each of ``other``'s keys (in its id order), keys not here added: its
        sorted names found in these by binary search, no key made a string but those not found
        (keys added since this table's restore, or new here)."""
        got = rows_of_names(self.names, other.names)
        miss = np.flatnonzero(got < 0)
        rest = other.keys_of(miss) + other.added
        if rest:
            got = np.concatenate([got[:len(other.names)], np.zeros(len(other.added), np.int64)])
            got[np.r_[miss, np.arange(len(other.names), len(other))]] = self.ids_of(rest)
        return got

    def keys_of(self, kids) -> list[str]:
        """The keys of ids ``kids``."""
        kids = np.asarray(kids, np.int64)
        m, added = len(self.names), self.added
        if not added or not len(kids) or kids.max() < m:
            return [name[:-1].decode() for name in self.names[kids].tolist()]
        got = np.empty(len(kids), object)
        low = kids < m
        got[low] = [name[:-1].decode() for name in self.names[kids[low]].tolist()]
        got[~low] = [added[i] for i in (kids[~low] - m).tolist()]
        return got.tolist()

    def sorted_of(self, used: np.ndarray) -> tuple["_Keys", np.ndarray]:
        """A table of the keys of ids ``used`` (ascending, distinct), sorted; → it and each used
        id's new id (in ``used``'s order)."""
        m = len(self.names)
        old = used[used < m]
        names = self.names[old]
        if len(old) < len(used):  # (the sorted ones stay sorted: the added ones merged in)
            more = names_of(self.keys_of(used[len(old):]))
            names = np.concatenate([names.astype(np.result_type(names, more), copy=False), more])
            order = np.argsort(names, kind="stable")
            new_id = np.empty(len(used), np.int64)
            new_id[order] = np.arange(len(used))
            return _Keys(names[order]), new_id
        return _Keys(names), np.arange(len(used))


class _Changed(Collection):
    """A binner's changed keys (:meth:`Binner.changed_keys`): ids into its key table ``table``
    (distinct), and keys it no longer holds by name (``gone``, sorted). The runtime counts them and
    hands them back to :meth:`Binner.delta`; iterating (or ``in``) makes the keys strings."""

    __slots__ = ("table", "ids", "gone")

    def __init__(self, table: _Keys, ids: np.ndarray, gone: list[str]) -> None:
        self.table, self.ids, self.gone = table, ids, gone

    def __len__(self) -> int:
        return len(self.ids) + len(self.gone)

    def __iter__(self) -> Iterator[str]:
        yield from self.table.keys_of(self.ids)
        yield from self.gone

    def __contains__(self, key: object) -> bool:
        return key in self.gone or key in self.table.keys_of(self.ids)


class Binner(Operator):
    """Prorates the events of many keys into bins (:class:`ctiflow.operators.operator.Operator`).

    State: one *slot* per open (key, bin) in column arrays — cumulative and incremental
    measure sums, fraction sums and event counts, revision — plus a dict (key id, bin
    index) → slot. Slots of final bins are recycled. A revision is counted for each CTI at
    which the bin was touched; the final record carries the last revision.
    """

    @classmethod
    def traits(cls, settings: BinSettings) -> Traits:
        """Partitioned by key; it reads the measures of an event on its common path (see
        :meth:`needs_records`) and accounts for ADJUST's dropped share itself."""
        return Traits(partitions=True, fields_read=tuple(settings.measures), handles_adjust=True)

    @classmethod
    def needs_records(cls, settings: BinSettings, cols) -> bool:
        """Whether a row of ``cols`` (:class:`ctiflow.operators.columns.EventColumns`) may take the exact
        path of :meth:`process_columns` — ADJUSTed, odd times, too many bins, measures that are
        not finite numbers — where its late record or its refusal carries all its fields."""
        if not len(cols):
            return False
        if cols.adjusted is not None and cols.adjusted.any():
            return True
        s, e = cols.start, cols.end
        span = settings.bin_size * (settings.max_bins_per_event - 1)  # as Binner._span_check
        common = (e >= s) & (s >= -_FAST_LIMIT) & (e <= _FAST_LIMIT) & ((e - s) < span)
        if not common.all():
            return True
        for name in settings.measures:
            col = cols.fields.get(name)
            if col is None or col.dtype.kind not in "iubf" or (
                    col.dtype.kind == "f" and not np.isfinite(col).all()):
                return True
        return False

    def __init__(self, settings: BinSettings) -> None:
        if not isinstance(settings, BinSettings):
            raise ConfigError(f"Binner needs BinSettings, got {type(settings).__name__}")
        self.settings = settings
        self._m = len(settings.measures)
        self._incremental = "incremental" in settings.outputs
        self._updated = "updated" in settings.outputs
        self._final = "final" in settings.outputs
        #: events at least this long may exceed max_bins_per_event and get the exact check
        self._span_check = settings.bin_size * (settings.max_bins_per_event - 1)
        self._cti = CTI_NONE
        self._keys = _Keys()
        #: slots below ``_hi`` not live, to be used again (:attr:`_live` marks the slots in use)
        self._free: list[int] = []
        self._hi = 0
        #: keys whose bins changed since the last :meth:`changed_keys`: these, and the ids noted since
        self._changed: set[str] = set()
        self._changed_ids: list[np.ndarray] = []
        self._alloc(64)
        self._clear_buffer()

    # ---- state arrays -------------------------------------------------------------

    def _alloc(self, cap: int) -> None:
        m = self._m
        self._cap = cap
        self._kid = np.zeros(cap, np.int64)
        self._k = np.zeros(cap, np.int64)
        self._live = np.zeros(cap, np.bool_)
        self._touched = np.zeros(cap, np.bool_)
        self._rev = np.zeros(cap, np.int64)
        self._cev = np.zeros(cap, np.int64)
        self._iev = np.zeros(cap, np.int64)
        self._cfrac = np.zeros(cap, np.float64)
        self._ifrac = np.zeros(cap, np.float64)
        self._cum = np.zeros((m, cap), np.float64)
        self._inc = np.zeros((m, cap), np.float64)

    def _grow(self, need: int) -> None:
        cap = self._cap
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        old = (self._kid, self._k, self._live, self._touched, self._rev, self._cev, self._iev,
               self._cfrac, self._ifrac, self._cum, self._inc)
        self._alloc(cap)
        new = (self._kid, self._k, self._live, self._touched, self._rev, self._cev, self._iev,
               self._cfrac, self._ifrac, self._cum, self._inc)
        for a, b in zip(old, new):
            b[..., : a.shape[-1]] = a

    def _clear_buffer(self) -> None:
        #: buffered events: sealed column parts (start, end, key id, values n×m, lowest bin or
        #: None), then the rows the exact path appended since, as lists
        self._b_parts: list[tuple] = []
        self._b_start: list[int] = []
        self._b_end: list[int] = []
        self._b_kid: list[int] = []
        self._b_val: list[Any] = []
        self._b_cut: dict[int, int] = {}

    def _key_id(self, key: str) -> int:
        return int(self._keys.ids_of([key])[0])

    @property
    def cti(self) -> int:
        """The last CTI this binner was advanced to."""
        return self._cti

    @property
    def open_bins(self) -> int:
        """Number of (key, bin) pairs holding state (not yet final)."""
        self._flush()
        return int(np.count_nonzero(self._live[: self._hi]))

    # ---- events ---------------------------------------------------------------------

    def _process_slow(self, event: Event) -> list[Output]:
        settings = self.settings
        _check_times(event, settings)
        values = _measure_values(event, settings.measures)
        record, applied_from = _split(event, self._cti, settings, values)
        if applied_from is not None:
            real = event.start if event.original_start is None else event.original_start
            if _bin_range(real, event.end, settings.bin_size, settings.origin)[1] >= applied_from:
                kid = self._key_id(event.key)
                row = len(self._b_start)
                self._b_start.append(real)
                self._b_end.append(event.end)
                self._b_kid.append(kid)
                self._b_val.extend(values)
                self._b_cut[row] = applied_from
        return [] if record is None else [Output("late", record)]

    def process_columns(self, cols) -> list[tuple[int, Any]]:
        """The rows of an :class:`ctiflow.operators.columns.EventColumns` (in release order); the state
        does not depend on how rows are cut into calls. → ``(row, late outputs)`` for each row
        that produced some (an ADJUSTed or late event touching final bins) and ``(row,
        EventRejected)`` for each row refused (``end < start``, a missing or non-numeric measure,
        open-ended or absurd times; state unchanged by it), in row order. The common rows — on
        time, finite numeric measures, times within ±2**52 — are buffered as whole columns; the
        rest take the exact path one by one, in their place in the order. Bins are emitted by
        :meth:`advance_to`."""
        n = len(cols)
        if not n:
            return []
        s, e = cols.start, cols.end
        fast = ((s >= self._cti) & (e >= s) & (s >= -_FAST_LIMIT) & (e <= _FAST_LIMIT)
                & ((e - s) < self._span_check))
        if cols.adjusted is not None:
            fast &= ~cols.adjusted
        values = self._measure_values(cols, fast)
        keys = cols.key.tolist()
        out: list[tuple[int, Any]] = []
        lo = 0
        for i in np.flatnonzero(~fast).tolist() + [n]:
            if i > lo:  # keys get their ids in the order process() would give them
                kid = self._keys.ids_of(keys[lo:i])
                self._seal()
                self._b_parts.append((s[lo:i], e[lo:i], kid, values[lo:i], None))
            if i < n:
                try:
                    got = self._process_slow(cols.event(i))
                except EventRejected as exc:
                    out.append((i, exc))
                else:
                    if got:
                        out.append((i, got))
            lo = i + 1
        if self._buffered() >= _FLUSH_AT:
            self._flush()
        return out

    def _measure_values(self, cols, fast: np.ndarray) -> np.ndarray:
        """The rows' measures (n × m floats); ``fast`` loses the rows whose measures are not
        finite numbers (they take the exact path, which refuses them)."""
        n = len(cols)
        values = np.empty((n, self._m), np.float64)
        for j, name in enumerate(self.settings.measures):
            col = cols.fields.get(name)
            if col is None:
                fast[:] = False
                break
            if col.dtype.kind in "iub":
                values[:, j] = col
            elif col.dtype.kind == "f":
                values[:, j] = col
                fast &= np.isfinite(col)
            else:  # an object column (nulls, or values as given): checked value by value
                ok = np.zeros(n, bool)
                for i, v in enumerate(col.tolist()):
                    if isinstance(v, numbers.Real):
                        try:
                            f = float(v)
                        except OverflowError:
                            continue
                        if math.isfinite(f):
                            values[i, j] = f
                            ok[i] = True
                fast &= ok
        return values

    def _seal(self) -> None:
        """The rows appended as lists become a column part (keeps the buffer's order)."""
        if not self._b_start:
            return
        n, cut = len(self._b_start), self._b_cut
        lowest = None
        if cut:
            lowest = np.full(n, _INT64_MIN, np.int64)
            lowest[list(cut)] = list(cut.values())
        self._b_parts.append((np.array(self._b_start, np.int64), np.array(self._b_end, np.int64),
                              np.array(self._b_kid, np.int64),
                              np.array(self._b_val, np.float64).reshape(n, self._m), lowest))
        self._b_start, self._b_end, self._b_kid, self._b_val, self._b_cut = [], [], [], [], {}

    def _buffered(self) -> int:
        return len(self._b_start) + sum(len(p[0]) for p in self._b_parts)

    # ---- proration in bulk ----------------------------------------------------------

    def _flush(self) -> None:
        """Prorate the buffered events and add every contribution to its bin.

        Cumulative sums (measures, fraction) are added one contribution at a time in
        processing order (``np.add.at`` is unbuffered and sequential), which makes them
        independent of where the buffer was cut. Incremental sums and event counts are
        summed per bin first (``bincount``); counts are exact anyway. At most
        ``_MAX_CONTRIBUTIONS`` (event, bin) pairs are materialised at a time.
        """
        self._seal()
        parts = self._b_parts
        if not parts:
            return
        self._clear_buffer()
        if len(parts) == 1:
            s, e, kid, values, lowest = parts[0]
        else:
            s, e, kid, values = (np.concatenate([p[i] for p in parts]) for i in range(4))
            lowest = None
            if any(p[4] is not None for p in parts):
                lowest = np.concatenate([np.full(len(p[0]), _INT64_MIN, np.int64) if p[4] is None else p[4]
                                         for p in parts])
        n = len(s)
        B, o = self.settings.bin_size, self.settings.origin
        if (-_FAST_LIMIT <= int(s.min()) and int(e.max()) <= _FAST_LIMIT
                and B <= _FAST_LIMIT and -_FAST_LIMIT <= o <= _FAST_LIMIT):
            k0 = (s - o - (e == s)) // B
            nb = (e - o - 1) // B - k0 + 1
            ends_at = np.cumsum(nb)
            lo = 0
            while lo < n:
                base = int(ends_at[lo - 1]) if lo else 0
                hi = max(int(np.searchsorted(ends_at, base + _MAX_CONTRIBUTIONS, side="right")), lo + 1)
                rows, k, frac = _expand(s[lo:hi], e[lo:hi], k0[lo:hi], nb[lo:hi], B, o)
                self._apply(rows + lo, k, frac, kid, values, lowest)
                lo = hi
            return
        rows_l: list[int] = []
        k_l: list[int] = []
        f_l: list[float] = []
        for row, (s_, e_) in enumerate(zip(s.tolist(), e.tolist())):
            k0_ = _bin_range(s_, e_, B, o)[0]
            for j, share in enumerate(prorate(s_, e_, B, o)):
                rows_l.append(row)
                k_l.append(k0_ + j)
                f_l.append(share.fraction)
            if len(rows_l) >= _MAX_CONTRIBUTIONS or row == n - 1:
                self._apply(np.array(rows_l, np.int64), np.array(k_l, np.int64), np.array(f_l, np.float64),
                            kid, values, lowest)
                rows_l, k_l, f_l = [], [], []

    def _apply(self, rows: np.ndarray, k: np.ndarray, frac: np.ndarray, kid: np.ndarray,
               values: np.ndarray, lowest: np.ndarray | None) -> None:
        """Add contributions (buffered row, bin index, fraction), in order, to their bins' state."""
        if lowest is not None:
            keep = k >= lowest[rows]
            rows, k, frac = rows[keep], k[keep], frac[keep]
        if len(rows) == 0:
            return
        u_slots, inverse = self._slots(kid[rows], k)
        slots = u_slots[inverse]
        self._note_changed(self._kid[u_slots])
        incremental = self._incremental
        for j in range(self._m):
            contrib = values[rows, j] * frac
            np.add.at(self._cum[j], slots, contrib)
            if incremental:
                self._inc[j, u_slots] += np.bincount(inverse, weights=contrib, minlength=len(u_slots))
        np.add.at(self._cfrac, slots, frac)
        counts = np.bincount(inverse, minlength=len(u_slots))
        self._cev[u_slots] += counts
        if incremental:
            self._ifrac[u_slots] += np.bincount(inverse, weights=frac, minlength=len(u_slots))
            self._iev[u_slots] += counts
        self._touched[u_slots] = True

    def _slots(self, kid: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct state slots of the (key id, bin index) pairs, and each pair's position among them.

        New pairs get a slot (recycled or appended). Pairs are coded as ``kid·span + k − kmin``;
        when that code space is small, a dense table replaces the sort of ``np.unique``.
        """
        kmin = int(k.min())
        span = int(k.max()) - kmin + 1
        size = span * len(self._keys)
        if size <= max(4 * len(k), 1 << 16):
            code = kid * span + (k - kmin)
            present = np.zeros(size, np.bool_)
            present[code] = True
            uniq = np.flatnonzero(present)
            position = np.empty(size, np.int64)
            position[uniq] = np.arange(len(uniq))
            inverse = position[code]
            u_kid, u_k = np.divmod(uniq, span)
            u_k += kmin
        elif size < 2**62:
            code = kid * span + (k - kmin)
            uniq, inverse = np.unique(code, return_inverse=True)
            u_kid, u_k = np.divmod(uniq, span)
            u_k += kmin
        else:
            pairs, inverse = np.unique(np.stack([kid, k], axis=1), axis=0, return_inverse=True)
            u_kid, u_k = pairs[:, 0], pairs[:, 1]
        inverse = inverse.reshape(-1)
        u_slots = self._find(u_kid, u_k)
        new = np.flatnonzero(u_slots < 0)
        if len(new):
            u_slots[new] = self._new_slots(u_kid[new], u_k[new])
        return u_slots, inverse

    def _new_slots(self, kid: np.ndarray, k: np.ndarray) -> np.ndarray:
        """A slot for each (key id, bin index) pair (distinct, none live), recycled or appended."""
        free, n = self._free, len(kid)
        reuse = min(n, len(free))
        fresh = np.empty(n, np.int64)
        if reuse:
            fresh[:reuse] = free[len(free) - reuse:][::-1]
            del free[len(free) - reuse:]
        if n > reuse:
            self._grow(self._hi + n - reuse)
            fresh[reuse:] = np.arange(self._hi, self._hi + n - reuse)
            self._hi += n - reuse
        self._kid[fresh] = kid
        self._k[fresh] = k
        self._live[fresh] = True
        return fresh

    def _find(self, kid: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The live slot of each (key id, bin index) pair (pairs distinct), −1 where none: the
        live pairs of the keys asked (with sparse keys a few of a chunk's) and these sorted
        together, a live pair and an equal one adjacent (live pairs are distinct too). Array work
        over the live slots instead of a dict of pairs, which a restore would build for every open
        bin of a chunk however few a batch touches (up to :data:`_FIND_BY_DICT` pairs in all, a
        dict of the live ones costs less)."""
        found = np.full(len(kid), -1, np.int64)
        live = np.flatnonzero(self._live[: self._hi])
        if not len(live) or not len(kid):
            return found
        asked = np.zeros(len(self._keys), np.bool_)
        asked[kid] = True
        live = live[asked[self._kid[live]]]
        if len(live) + len(kid) <= _FIND_BY_DICT:
            slot_of = dict(zip(zip(self._kid[live].tolist(), self._k[live].tolist()), live.tolist()))
            return np.fromiter((slot_of.get(pair, -1) for pair in zip(kid.tolist(), k.tolist())), np.int64,
                               len(kid))
        live_k = self._k[live]
        near = (live_k >= k.min()) & (live_k <= k.max())
        live, live_k = live[near], live_k[near]
        both_k = np.concatenate([live_k, k])
        both_kid = np.concatenate([self._kid[live], kid])
        order = np.lexsort((both_k, both_kid))  # (stable: a live pair before its equal)
        same = np.flatnonzero((both_k[order[1:]] == both_k[order[:-1]])
                              & (both_kid[order[1:]] == both_kid[order[:-1]]))
        found[order[same + 1] - len(live)] = live[order[same]]
        return found

    # ---- CTIs -----------------------------------------------------------------------

    def advance_to(self, cti: int) -> list[OutputBatch]:
        """Emit the bins touched since the previous CTI and the bins that became final, each
        role's records as one :class:`OutputBatch`.

        Order: the ``bin_incremental`` records, then ``bin_updated``, then ``bin_final`` (each
        only if selected), each group sorted by key, then bin_start. ``final`` is True on the
        incremental/updated record of a bin's last revision. Final bins leave the state.
        """
        if cti < self._cti:
            raise ValueError(f"CTI went back from {self._cti} to {cti}; CTIs never decrease")
        self._flush()
        self._cti = cti
        hi = self._hi
        kfin = max(min(_last_final_bin(cti, self.settings), _INT64_MAX), _INT64_MIN)
        touched = np.flatnonzero(self._touched[:hi])
        final = np.flatnonzero(self._live[:hi] & (self._k[:hi] <= kfin))
        if len(touched) == 0 and len(final) == 0:
            return []
        self._rev[touched] += 1
        emit = np.union1d(touched, final) if self._incremental or self._updated else final
        out: list[OutputBatch] = []
        if len(emit):  # (final only, touched bins that stay open: nothing to order)
            kids = self._kid[emit]
            uniq_kids, inv = np.unique(kids, return_inverse=True)
            names = self._keys.keys_of(uniq_kids)
            rank = np.empty(len(names), np.int64)
            rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
            emit = emit[np.lexsort((self._k[emit], rank[inv.reshape(-1)]))]
            out = self._records(emit, kfin, cti)

        self._note_changed(self._kid[touched])
        self._note_changed(self._kid[final])
        self._touched[touched] = False
        if self._incremental:
            self._inc[:, touched] = 0.0
            self._ifrac[touched] = 0.0
            self._iev[touched] = 0
        if len(final):
            self._drop_slots(final)
            if len(self._keys) > max(_FORGET_KEYS_ABOVE, 2 * self.open_bins):
                self._forget_keys()
        return out

    def next_due(self) -> int:
        """The first CTI that makes an open bin final (bin ``k`` is final once
        ``cti ≥ origin + (k + 1) · bin_size + 1``); due now while events wait to be applied or
        bins were touched since the last CTI (their incremental/updated records)."""
        hi = self._hi
        if self._b_start or self._b_parts or (hi and self._touched[:hi].any()):
            return CTI_NONE
        live = self._live[:hi]
        if not hi or not live.any():
            return CTI_INFINITY
        k = int(self._k[:hi][live].min())
        return self.settings.origin + (k + 1) * self.settings.bin_size + 1

    def live_keys(self) -> set[str]:
        """Keys with an open bin."""
        return set(self._keys.keys_of(np.unique(self._live_kids())))

    def key_count(self) -> int:
        """(:meth:`Operator.key_count`)"""
        kids = self._live_kids()
        return int(np.count_nonzero(np.bincount(kids))) if len(kids) else 0

    def _live_kids(self) -> np.ndarray:
        """The key id of each open bin, the buffered events applied first."""
        self._flush()
        hi = self._hi
        return self._kid[:hi][self._live[:hi]]

    def _forget_keys(self) -> None:
        """Renumber the keys that still have open bins and forget the rest (keys come and go;
        the key table must not grow without bound). Called with an empty buffer."""
        self._changed_by_name()
        live = np.flatnonzero(self._live[: self._hi])
        used, new_kid = np.unique(self._kid[live], return_inverse=True)
        self._keys, ids = self._keys.sorted_of(used)
        self._kid[live] = ids[new_kid.reshape(-1)]

    def _records(self, emit: np.ndarray, kfin: int, cti: int) -> list[OutputBatch]:
        """Records of the sorted slots ``emit``: all incremental, then updated, then final."""
        out: list[OutputBatch] = []
        touched = self._touched[emit]
        if self._incremental or self._updated:
            sel = emit[touched]
            if self._incremental:
                out += self._build("bin_incremental", "incremental", sel, kfin, cti,
                                   self._inc[:, sel], self._ifrac[sel], self._iev[sel])
            if self._updated:
                out += self._build("bin_updated", "updated", sel, kfin, cti,
                                   self._cum[:, sel], self._cfrac[sel], self._cev[sel])
        if self._final:
            sel = emit[self._k[emit] <= kfin]
            out += self._build("bin_final", "final", sel, kfin, cti,
                               self._cum[:, sel], self._cfrac[sel], self._cev[sel])
        return out

    def _build(self, role: str, kind: str, sel: np.ndarray, kfin: int, cti: int,
               measures: np.ndarray, fraction: np.ndarray, events: np.ndarray) -> list[OutputBatch]:
        if len(sel) == 0:
            return []
        B, o = self.settings.bin_size, self.settings.origin
        k = self._k[sel]
        if max(abs(int(k.min())), abs(int(k.max()))) * B + abs(o) + B < 2**62:
            bin_starts = k * B + o
            bin_ends = bin_starts + B
        else:  # beyond int64 on the way: Python ints
            bin_starts = [x * B + o for x in k.tolist()]
            bin_ends = [x + B for x in bin_starts]
        return [OutputBatch(role, {
            "binner": self.settings.name, "key": self._keys.keys_of(self._kid[sel]),
            "bin_start": bin_starts, "bin_end": bin_ends,
            "measures": MapColumn(self.settings.measures, measures), "fraction_sum": fraction,
            "events": events, "revision": self._rev[sel], "final": k <= kfin, "cti": cti,
            "kind": kind}, len(sel))]

    # ---- snapshot -------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Compact bytes of the whole state (open bins, pending increments, CTI).

        Layout: magic, 4-byte header length, JSON header (settings that give the state its
        meaning, CTI, counts), the keys as a sorted UTF-8 column (:class:`_Keys`; a slot's key id
        is its row), then little-endian column arrays of the live slots in key order — about 56 bytes per
        open bin with two measures; the increments since the last CTI (touched flags,
        incremental sums) only when there are any, i.e. not right after ``advance_to``.
        """
        self._flush()
        live = np.flatnonzero(self._live[: self._hi])
        kids = self._kid[live]
        present = np.zeros(len(self._keys), np.bool_)  # key ids are < len(_keys): no sort needed
        present[kids] = True
        used = np.flatnonzero(present)
        keys, ids = self._keys.sorted_of(used)
        kid = ids[(np.cumsum(present) - 1)[kids]]  # each slot's key id among the used ones, sorted
        if len(kid) > 1 and (kid[1:] < kid[:-1]).any():  # slots in key order: the ids compress to little
            order = np.argsort(kid, kind="stable")
            live, kid = live[order], kid[order]
        pending = bool(self._touched[live].any())
        header = {
            "bin_size": self.settings.bin_size,
            "origin": self.settings.origin,
            "measures": list(self.settings.measures),
            "cti": self._cti,
            "slots": len(live),
            "pending": pending,
            "keys": len(used),
            "width": keys.names.dtype.itemsize,
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        arrays = [kid.reshape(-1), self._k[live], self._rev[live], self._cev[live], self._cfrac[live],
                  self._cum[:, live]]
        if pending:
            arrays += [self._touched[live].astype(np.uint8), self._iev[live], self._ifrac[live],
                       self._inc[:, live]]
        parts = [_SNAPSHOT_MAGIC, struct.pack("<I", len(head)), head, keys.names.tobytes()]
        parts += [np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes() for a in arrays]
        return b"".join(parts)

    def partition(self, where) -> dict[int, "Binner"]:
        """This binner's keys split by ``where(key)`` into binners of the same settings and CTI,
        each holding exactly its keys' open bins (and pending increments); ``self`` is not used
        afterwards. The runtime splits a state chunk with it when the chunks grow."""
        self._flush()
        live = np.flatnonzero(self._live[: self._hi])
        used, inv = np.unique(self._kid[live], return_inverse=True)
        dest_of_key = np.array([where(k) for k in self._keys.keys_of(used)], np.int64)
        dest = dest_of_key[inv.reshape(-1)] if len(live) else np.zeros(0, np.int64)
        order = np.argsort(dest, kind="stable")  # (each part's slots ascending)
        cut = np.flatnonzero(np.diff(dest[order])) + 1
        return {int(dest[idx[0]]): self._part(live[idx]) for idx in np.split(order, cut) if len(idx)}

    def _part(self, slots: np.ndarray) -> "Binner":
        """A binner of the same settings and CTI holding exactly the live ``slots`` (ascending),
        its keys numbered in the order of their ids here."""
        part = Binner(self.settings)
        part._cti = self._cti
        used, inv = np.unique(self._kid[slots], return_inverse=True)
        part._keys, ids = self._keys.sorted_of(used)
        n = len(slots)
        part._grow(max(n, 1))
        part._hi = n
        part._kid[:n] = ids[inv.reshape(-1)]
        for name in ("_k", "_rev", "_cev", "_cfrac", "_touched", "_iev", "_ifrac"):
            getattr(part, name)[:n] = getattr(self, name)[slots]
        part._cum[:, :n] = self._cum[:, slots]
        part._inc[:, :n] = self._inc[:, slots]
        part._live[:n] = True
        return part

    # ---- deltas (a chunk stored as its last snapshot and the keys changed since) --------

    def changed_keys(self) -> "_Changed":
        """(:meth:`Operator.changed_keys`): keys whose bins took a contribution, were emitted (the
        touched flags and increments a CTI resets) or became final — as ids into the key table
        (no key made a string: with sparse keys a commit changes thousands of a chunk's keys), and
        by name those noted before the table was renumbered that it no longer holds."""
        self._flush()
        kids = np.unique(np.concatenate(self._changed_ids)) if self._changed_ids else np.zeros(0, np.int64)
        gone = sorted(self._changed)
        if gone:  # (noted before a renumbering: those still held by their new ids)
            found = self._keys.find(gone)
            kids = np.union1d(kids, found[found >= 0])
            gone = [key for key, kid in zip(gone, found.tolist()) if kid < 0]
        self._changed_ids, self._changed = [], set()
        return _Changed(self._keys, kids, gone)

    def delta(self, keys: _Changed) -> tuple[bytes, list[str]]:
        """(:meth:`Operator.delta`): the open bins of ``keys`` and the CTI, found by key id."""
        self._flush()
        if keys.table is not self._keys:
            raise RuntimeError("Binner.delta: the key ids of changed_keys were renumbered since (a bug)")
        live = np.flatnonzero(self._live[: self._hi])
        asked = np.zeros(len(self._keys), np.bool_)
        asked[keys.ids] = True
        slots = live[asked[self._kid[live]]]
        asked[self._kid[slots]] = False  # (those left: asked, no open bin)
        return self._part(slots).snapshot(), sorted(self._keys.keys_of(np.flatnonzero(asked)) + keys.gone)

    def absorb(self, part: "Binner", keys) -> None:
        """(:meth:`Operator.absorb`)"""
        self._flush()
        part._flush()
        theirs = self._keys.ids_of_table(part._keys)  # (the frame's keys found as names: none made a string)
        listed = self._keys.find(list(keys)) if keys else theirs[:0]
        drop = np.zeros(len(self._keys), np.bool_)  # (a mask by key id: one pass, no sort)
        drop[theirs] = True
        drop[listed[listed >= 0]] = True
        live = np.flatnonzero(self._live[: self._hi])
        self._drop_slots(live[drop[self._kid[live]]])
        rows = np.flatnonzero(part._live[: part._hi])
        if len(rows):  # (their keys' bins were all dropped: none is live, and theirs are distinct)
            slots = self._new_slots(theirs[part._kid[rows]], part._k[rows])
            for name in ("_rev", "_cev", "_cfrac", "_touched", "_iev", "_ifrac"):
                getattr(self, name)[slots] = getattr(part, name)[rows]
            self._cum[:, slots] = part._cum[:, rows]
            self._inc[:, slots] = part._inc[:, rows]
        self._cti = max(self._cti, part._cti)

    def _drop_slots(self, slots: np.ndarray) -> None:
        """Free ``slots`` (live): their bins leave the state."""
        if not len(slots):
            return
        for arr in (self._live, self._rev, self._cev, self._cfrac, self._touched, self._iev, self._ifrac):
            arr[slots] = 0
        self._cum[:, slots] = 0.0
        self._inc[:, slots] = 0.0
        self._free.extend(slots.tolist())
        if not self._live[: self._hi].any():
            self._free.clear()
            self._hi = 0

    def _note_changed(self, kids: np.ndarray) -> None:
        if len(kids):
            self._changed_ids.append(kids)

    def _changed_by_name(self) -> None:
        """The key ids noted changed into :attr:`_changed` as keys (before ids are renumbered)."""
        if self._changed_ids:
            self._changed.update(self._keys.keys_of(np.unique(np.concatenate(self._changed_ids))))
            self._changed_ids = []

    @classmethod
    def restore(cls, settings: BinSettings, data: bytes) -> "Binner":
        """Rebuild a binner from :meth:`snapshot` bytes; it behaves exactly as the original.

        Raises ``ConfigError`` when the snapshot was written with a different bin size,
        origin or measure list (its sums would mean something else); ``outputs`` and
        ``policy`` may change (switch ``incremental`` on at a CTI boundary: the increments
        pending in a snapshot are those the old settings tracked).
        """
        version = 3 if data.startswith(_SNAPSHOT_MAGIC) else 2 if data.startswith(_SNAPSHOT_MAGIC_2) else None
        if version is None:
            raise ValueError("not a binner snapshot (bad magic bytes)")
        pos = len(_SNAPSHOT_MAGIC)
        (hlen,) = struct.unpack_from("<I", data, pos)
        pos += 4
        header = json.loads(data[pos: pos + hlen])
        pos += hlen
        for fname in ("bin_size", "origin", "measures"):
            theirs = header[fname]
            ours = list(getattr(settings, fname)) if fname == "measures" else getattr(settings, fname)
            if theirs != ours:
                raise ConfigError(
                    f'Snapshot of binner {settings.name!r} was written with "{fname}" = {theirs!r}, '
                    f"but the settings say {ours!r}; restart from empty state or restore the old settings."
                )
        binner = cls(settings)
        n, m = header["slots"], binner._m
        binner._cti = header["cti"]
        if version == 2:  # the keys a list in the header, ids in its order
            keys = header["keys"]
            binner._keys = _Keys(added=keys)
            if len(binner._keys.ids) != len(keys):
                raise ValueError("not a binner snapshot (a key listed twice)")
        else:  # distinct and sorted: each used key id's key once, in order
            count, width = header["keys"], header["width"]
            names = np.frombuffer(data, f"S{width}", count, pos)
            pos += names.nbytes
            if count > 1 and not (names[1:] > names[:-1]).all():
                raise ValueError("not a binner snapshot (its keys are not sorted, or a key is listed twice)")
            binner._keys = _Keys(names)

        def take(dtype: str, count: int) -> np.ndarray:
            nonlocal pos
            arr = np.frombuffer(data, dtype=dtype, count=count, offset=pos)
            pos += arr.nbytes
            return arr

        if n:
            binner._grow(n)
        binner._hi = n
        binner._kid[:n] = take("<i8", n)
        binner._k[:n] = take("<i8", n)
        binner._rev[:n] = take("<i8", n)
        binner._cev[:n] = take("<i8", n)
        binner._cfrac[:n] = take("<f8", n)
        binner._cum[:, :n] = take("<f8", m * n).reshape(m, n)
        if header["pending"]:
            binner._touched[:n] = take("u1", n).astype(bool)
            binner._iev[:n] = take("<i8", n)
            binner._ifrac[:n] = take("<f8", n)
            binner._inc[:, :n] = take("<f8", m * n).reshape(m, n)
        binner._live[:n] = True
        return binner
