"""Exponential histogram: an approximate count (or sum) over a sliding window.

Datar, Gionis, Indyk and Motwani, "Maintaining Stream Statistics over Sliding Windows", as
the seed article (seeds/approximate-counting-exponential-histogram.txt) implements it.

Structure. A *bucket* covers a run of consecutive interesting events and keeps the count and
the timestamp of its newest event. Counts are powers of two; ``k = ⌈1/ε⌉`` and
``cap = ⌈k/2⌉ + 1``. Level ``j`` holds the buckets of count ``2**j`` as a FIFO (oldest first);
levels are ordered in time: every bucket of level ``j + 1`` is older than every bucket of
level ``j``. Inserting an interesting event appends a 1-bucket to level 0; when a level holds
``cap + 1`` (the seed's ``⌈k/2⌉ + 2``) buckets, its two oldest merge into one bucket of the
next level carrying the newer timestamp, which may cascade. A bucket expires when its
timestamp ≤ now − window; expiry removes buckets from the oldest end only.

Invariants (I1–I3) and the error bound::

    I1  level j holds at most cap = ⌈k/2⌉ + 1 buckets.
    I2  every level below the top (highest non-empty) level holds at least ⌈k/2⌉ buckets:
        a level that carried once holds cap − 1 or cap afterwards, and expiry empties the top
        level(s) before it touches a lower one.
    I3  all buckets but the oldest lie wholly inside the window (each event of such a bucket
        is no older than the newest event of the next older bucket, which has not expired);
        the oldest bucket holds ≥ 1 event inside the window.

    Let the oldest bucket have count last = 2**L and let total be the sum of the counts.
    By I3, exact ∈ [total − last + 1, total]; ``estimate()`` returns the midpoint
    total − (last − 1)/2, so |estimate − exact| ≤ (last − 1)/2.
    L = 0: the interval is a single point, the estimate is exact.
    L ≥ 1: by I2 and I3, exact ≥ ⌈k/2⌉·(2**L − 1) + 1, and kε ≥ 1, hence
        ε·exact ≥ ε·(k/2)·(2**L − 1) + ε ≥ (2**L − 1)/2 + ε > |estimate − exact|.   ∎
    Space: exact ≥ 2**L, so bucket_count ≤ cap·(L + 1) ≤ cap·(log2(exact) + 1).

The seed's own estimate ⌈total − last/2⌉ (``seed_estimate()``) misses the bound when the
oldest bucket is small: ε = 0.05 (k = 20, cap = 11), ten 1-buckets and one 2-bucket wholly
in the window give 11 for an exact count of 12 (error 1 > 0.6).

Sums (the paper's sum extension). An item of integer weight v is v unit events with the same
timestamp. Adding them one by one would cost v steps; ``update`` adds them in closed form per
level (below), so an item costs O(cap · log v). The proof above never uses distinct
timestamps, so the same bound holds for sums: |estimate − exact sum| ≤ ε · exact sum, and
lower ≤ exact sum ≤ upper.

Closed form. Level j behaves like one digit of a counter: it fills up to cap, and from then on
every second arriving bucket carries one bucket up. With c buckets present and a arrivals
(a stream of timestamps, oldest first) and no expiry in between, the level carries
``out = 0`` if c + a ≤ cap, else ``1 + (a − (cap + 1 − c)) // 2`` buckets; writing the present
buckets followed by the arrivals as one sequence s, the carried timestamps are
s[1], s[3], …, s[2·out − 1], the level keeps s[2·out:], and carry r happens when arrival
number cap − c + 2r (0-based) comes in. ``update_many`` applies this level by level with
NumPy, and falls back to a step-by-step loop only for the buckets that can expire inside the
batch; the resulting state equals that of the same updates made one by one.
"""

from __future__ import annotations

import math
import operator
import struct
from array import array
from collections import deque
from fractions import Fraction
from functools import lru_cache
from itertools import repeat
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from ctiflow.operators.errors import ConfigError

#: Largest timestamp magnitude and window accepted: sums and differences stay within int64.
TIME_LIMIT = 2**62
#: Timestamp before any update (the histogram has no "now" yet).
NO_TIME = -(2**62)

_MAGIC = b"CTEH"
_VERSION = 1
_HEADER = struct.Struct("<4sBqd")  # magic, version, window, epsilon; then int64s (``_dump``)
#: An item heavier than this many units per event on average makes update_many fall back to
#: the per-item closed form instead of expanding items into unit events.
_EXPANSION_LIMIT = 4
#: Chunks shorter than this are cheaper one update at a time than through NumPy.
_SMALL_CHUNK = 48


class Bucket(NamedTuple):
    """One bucket: the timestamp of its newest event and the number of events it covers."""

    timestamp: int
    count: int


@lru_cache(maxsize=64)
def buckets_per_size(epsilon: float) -> int:
    """The cap ⌈k/2⌉ + 1 on buckets of one size, k = ⌈1/ε⌉ computed exactly (kε ≥ 1)."""
    k = math.ceil(1 / Fraction(epsilon))
    return -(-k // 2) + 1


class ExponentialHistogram:
    """Approximate count of interesting events (or sum of weights) over the last ``window``.

    Timestamps are integers in the window's unit and never decrease: sequence numbers for a
    count-based window of the last N events, application time (ms) for a time-based window of
    the last T ms. An event at timestamp t is inside the window at time ``now`` iff
    t > now − window. See the module docstring for the invariants and the proof that
    |estimate() − exact| ≤ ε · exact.
    """

    __slots__ = ("_window", "_epsilon", "_cap", "_levels", "_total", "_now")

    def __init__(self, window: int, epsilon: float) -> None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) \
                or not 0 < window < TIME_LIMIT:
            raise ConfigError(
                f"Invalid window: {window!r}. It must be a positive integer below 2**62 "
                "(N events for a count-based window, T ms for a time-based one)."
            )
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon <= 1:
            raise ConfigError(f"Invalid epsilon: {epsilon!r}. It must be a relative error in (0, 1], "
                              "e.g. 0.01.")
        self._window = int(window)
        self._epsilon = float(epsilon)
        self._cap = buckets_per_size(self._epsilon)
        #: level j = deque of bucket timestamps (count 2**j), oldest first; levels[-1] non-empty.
        self._levels: list[deque[int]] = []
        self._total = 0
        self._now = NO_TIME

    # -- description -------------------------------------------------------------------------

    @property
    def window(self) -> int:
        return self._window

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @property
    def k(self) -> int:
        """k = ⌈1/ε⌉."""
        return math.ceil(1 / Fraction(self._epsilon))

    @property
    def cap(self) -> int:
        """At most this many buckets (⌈k/2⌉ + 1) of each size."""
        return self._cap

    @property
    def now(self) -> int:
        """The latest timestamp given to ``update``/``advance`` (``NO_TIME`` before any)."""
        return self._now

    @property
    def total(self) -> int:
        """Sum of the bucket counts (an upper bound of the exact count)."""
        return self._total

    @property
    def bucket_count(self) -> int:
        return sum(map(len, self._levels))

    def newest(self) -> int | None:
        """The newest bucket's timestamp (None without buckets): ``advance`` to it + window or
        later leaves the histogram empty."""
        levels = self._levels
        return max(q[-1] for q in levels if q) if levels else None

    def buckets(self) -> list[Bucket]:
        """The buckets newest first, as the seed's Figure 3 lists them."""
        out = []
        for j in range(len(self._levels) - 1, -1, -1):
            out.extend(Bucket(t, 1 << j) for t in self._levels[j])
        out.reverse()
        return out

    def __repr__(self) -> str:
        return (
            f"ExponentialHistogram(window={self._window}, epsilon={self._epsilon}, now={self._now}, "
            f"total={self._total}, buckets={self.bucket_count})"
        )

    # -- queries -----------------------------------------------------------------------------

    def _last(self) -> int:
        return 1 << (len(self._levels) - 1) if self._levels else 0

    def estimate(self) -> float:
        """Midpoint of [lower, upper]: total − (last − 1)/2; within ε·exact (module docstring)."""
        levels = self._levels
        if not levels:
            return 0.0
        return self._total - ((1 << (len(levels) - 1)) - 1) / 2

    def seed_estimate(self) -> int:
        """The article's estimate ⌈total − last/2⌉ (can miss the ε bound; kept to reproduce it)."""
        return self._total - self._last() // 2

    def bounds(self) -> tuple[int, int]:
        """Guaranteed (lower, upper) of the exact count: (total − last + 1, total), or (0, 0)."""
        if not self._levels:
            return (0, 0)
        return (self._total - self._last() + 1, self._total)

    def summary(self) -> tuple[float, int, int, int, int]:
        """(estimate, lower, upper, seed_estimate, bucket_count) in one call."""
        levels = self._levels
        total = self._total
        if not levels:
            return (0.0, 0, 0, 0, 0)
        last = 1 << (len(levels) - 1)
        return (total - (last - 1) / 2, total - last + 1, total, total - last // 2, sum(map(len, levels)))

    # -- updates -----------------------------------------------------------------------------

    def advance(self, timestamp: int) -> None:
        """Move ``now`` to ``timestamp`` without an event: expire what left the window."""
        if timestamp < self._now:
            raise ValueError(f"timestamp {timestamp} is before the histogram's now {self._now}; timestamps "
                             "never decrease")
        self._now = timestamp
        levels = self._levels
        if levels and levels[-1][0] <= timestamp - self._window:
            self._expire(timestamp - self._window)

    def update(self, timestamp: int, value: int = 1) -> None:
        """Advance to ``timestamp`` and add an event of weight ``value`` (0/False: uninteresting).

        A weight v > 1 is v unit events at ``timestamp``, added in closed form. Timestamps lie
        within ±2**62. A rejected call leaves the histogram unchanged.
        """
        if timestamp < self._now:
            raise ValueError(f"timestamp {timestamp} is before the histogram's now {self._now}; timestamps "
                             "never decrease")
        weight = None
        if value is not True and value != 1 and value:
            weight = operator.index(value)
            if weight < 0:
                raise ValueError(f"value {value!r} is negative; weights are non-negative integers")
        self._now = timestamp
        levels = self._levels
        if levels and levels[-1][0] <= timestamp - self._window:
            self._expire(timestamp - self._window)
        if weight is not None:
            self._add_same(timestamp, weight)
            return
        if not value:
            return
        if not levels:
            levels.append(deque())
        q = levels[0]
        q.append(timestamp)
        self._total += 1
        cap = self._cap
        if len(q) > cap:
            j = 0
            while True:
                q.popleft()
                carried = q.popleft()
                j += 1
                if j == len(levels):
                    levels.append(deque())
                q = levels[j]
                q.append(carried)
                if len(q) <= cap:
                    break

    def _expire(self, limit: int) -> None:
        """Drop buckets with timestamp ≤ limit, oldest first."""
        levels = self._levels
        total = self._total
        while levels:
            q = levels[-1]
            size = 1 << (len(levels) - 1)
            while q and q[0] <= limit:
                q.popleft()
                total -= size
            if q:
                break
            levels.pop()
        self._total = total

    def _add_same(self, t: int, v: int) -> None:
        """Add v unit events at timestamp t (already expired to t) in closed form per level.

        Arrivals at a level are ``olds`` (timestamps carried from pre-existing buckets below)
        followed by ``run`` copies of t.
        """
        levels = self._levels
        cap = self._cap
        self._total += v
        olds: list[int] = []
        run = v
        j = 0
        while olds or run:
            if j == len(levels):
                levels.append(deque())
            q = levels[j]
            c = len(q)
            a = len(olds) + run
            if c + a <= cap:
                q.extend(olds)
                q.extend(repeat(t, run))
                return
            out = 1 + (a - (cap + 1 - c)) // 2
            prefix = list(q)
            prefix.extend(olds)
            p = len(prefix)
            hi = 2 * out
            new_olds = prefix[1:hi:2]
            new_run = hi // 2 - p // 2 if hi > p else 0
            q.clear()
            if hi < p:
                q.extend(prefix[hi:])
                q.extend(repeat(t, run))
            else:
                q.extend(repeat(t, c + a - hi))
            olds, run = new_olds, new_run
            j += 1

    # -- batched updates ---------------------------------------------------------------------

    def _checked_times(self, timestamps: Any) -> np.ndarray:
        """``timestamps`` as int64, refused unless one-dimensional integers, none before ``now``."""
        t = np.asarray(timestamps)
        if t.ndim != 1:
            raise ValueError("timestamps must be one-dimensional")
        if not len(t):
            return t
        if t.dtype.kind not in "iu":
            raise ValueError(f"timestamps must be integers, got dtype {t.dtype}")
        if t.dtype.kind == "u" and int(t[-1]) > TIME_LIMIT:
            raise ValueError("timestamps must lie within ±2**62")
        t = t.astype(np.int64, copy=False)
        if int(t[0]) < self._now:
            raise ValueError(f"timestamp {int(t[0])} is before the histogram's now {self._now}; timestamps "
                             "never decrease")
        return t

    def update_many(self, timestamps: Any, values: Any = None) -> None:
        """Apply ``update(t, v)`` for each pair, in order, in one vectorised pass.

        ``timestamps``: non-decreasing integers (NumPy array or sequence), none before ``now``.
        ``values``: None (all interesting), booleans, or non-negative integer weights.
        The resulting state is exactly that of the same updates made one by one.
        """
        t = self._checked_times(timestamps)
        n = len(t)
        if n == 0:
            return
        if n > 1 and bool(np.any(t[1:] < t[:-1])):
            raise ValueError("timestamps must be non-decreasing")
        if int(t[-1]) > TIME_LIMIT or int(t[0]) < -TIME_LIMIT:
            raise ValueError("timestamps must lie within ±2**62")
        if values is None:
            weights = None
        else:
            w = np.asarray(values)
            if w.shape != t.shape:
                raise ValueError(f"values has shape {w.shape}, timestamps {t.shape}; they must match")
            if w.dtype == np.bool_:
                weights = w
            elif w.dtype.kind in "iu":
                if w.dtype.kind == "i" and bool(np.any(w < 0)):
                    raise ValueError("values must be non-negative integer weights")
                if int(w.max()) <= 1:
                    weights = w.astype(np.bool_)
                else:
                    weights = w.astype(np.int64)
            else:
                raise ValueError(f"values must be booleans or integers, got dtype {w.dtype}")
        if weights is not None and weights.dtype != np.bool_:
            if float(weights.sum(dtype=np.float64)) > _EXPANSION_LIMIT * n + 4096:
                for ti, wi in zip(t.tolist(), weights.tolist()):
                    self.update(ti, wi)
                return
        window = self._window
        s = 0
        while s < n:
            # Chunk [s, e): every event of it lies inside the window of the chunk's last event,
            # so only buckets from before the chunk can expire inside it.
            e = int(np.searchsorted(t, t[s] + window, "left"))
            if e - s < _SMALL_CHUNK:
                e = min(n, s + _SMALL_CHUNK)
                if weights is None:
                    for ti in t[s:e].tolist():
                        self.update(ti)
                else:
                    for ti, wi in zip(t[s:e].tolist(), weights[s:e].tolist()):
                        self.update(ti, wi)
            else:
                self._apply_chunk(t[s:e], None if weights is None else weights[s:e])
            s = e

    def _apply_chunk(self, t: np.ndarray, weights: np.ndarray | None) -> None:
        """Apply one chunk level by level: level j's arrivals are level j−1's carries.

        ``ats``/``aidx`` are the arrivals at the current level (timestamps, oldest first) and
        the index of the update at which each arrives; expiry at update i (threshold
        tw[i] = t[i] − window) happens before that update's arrivals and merges.
        """
        if weights is None:
            ats = t
            aidx = np.arange(len(t), dtype=np.int64)
        elif weights.dtype == np.bool_:
            aidx = np.flatnonzero(weights)
            ats = t[aidx]
        else:
            aidx = np.repeat(np.arange(len(t), dtype=np.int64), weights)
            ats = t[aidx]
        tw = t - self._window
        last_tw = int(tw[-1])
        levels = self._levels
        cap = self._cap
        j = 0
        while len(ats):
            if j == len(levels):
                levels.append(deque())
            q = levels[j]
            stepped_ts: list[int] = []
            stepped_idx: list[int] = []
            if (q[0] if q else int(ats[0])) <= last_tw:
                r = self._step_with_expiry(q, ats, aidx, tw, last_tw, stepped_ts, stepped_idx)
                ats = ats[r:]
                aidx = aidx[r:]
            c = len(q)
            a = len(ats)
            if c + a <= cap:
                if a:
                    q.extend(ats.tolist())
                ats = ats[:0]
                aidx = aidx[:0]
            else:
                out = 1 + (a - (cap + 1 - c)) // 2
                hi = 2 * out
                comb = np.concatenate((np.fromiter(q, np.int64, c), ats)) if c else ats
                first = cap - c
                aidx = aidx[first : first + hi - 1 : 2]
                ats = comb[1:hi:2]
                q.clear()
                q.extend(comb[hi:].tolist())
            if stepped_ts:
                ats = np.concatenate((np.array(stepped_ts, dtype=np.int64), ats))
                aidx = np.concatenate((np.array(stepped_idx, dtype=np.int64), aidx))
            j += 1
        self._now = int(t[-1])
        self._expire(last_tw)
        while levels and not levels[-1]:
            levels.pop()
        self._total = sum(len(q) << j for j, q in enumerate(levels))

    def _step_with_expiry(
        self,
        q: deque,
        ats: np.ndarray,
        aidx: np.ndarray,
        tw: np.ndarray,
        last_tw: int,
        carried_ts: list[int],
        carried_idx: list[int],
    ) -> int:
        """Apply arrivals one by one while the level's oldest bucket can expire in this chunk.

        Appends the carries to ``carried_ts``/``carried_idx`` and returns how many arrivals it
        applied; the rest meet a level whose buckets all outlive the chunk (closed form).
        """
        cap = self._cap
        n = len(ats)
        r = 0
        block = 64
        while r < n:
            xs = ats[r : r + block].tolist()
            idx = aidx[r : r + block].tolist()
            ths = tw[aidx[r : r + block]].tolist()
            for x, i, th in zip(xs, idx, ths):
                while q and q[0] <= th:
                    q.popleft()
                q.append(x)
                r += 1
                if len(q) > cap:
                    q.popleft()
                    carried_ts.append(q.popleft())
                    carried_idx.append(i)
                if q[0] > last_tw:
                    return r
            block *= 4
        return r

    # -- state -------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Compact bytes: a small header and the bucket timestamps as little-endian int64s."""
        ints = array("q")
        self._dump(ints)
        return _HEADER.pack(_MAGIC, _VERSION, self._window, self._epsilon) + _le(ints).tobytes()

    @classmethod
    def restore(cls, data: bytes) -> "ExponentialHistogram":
        """Rebuild a histogram from ``snapshot()`` bytes."""
        if len(data) < _HEADER.size:
            raise ValueError("not an exponential histogram snapshot (too short)")
        magic, version, window, epsilon = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not an exponential histogram snapshot (magic {magic!r}, version {version})")
        cls(window, epsilon)  # validates the header's settings
        ints = _ints_from(data, _HEADER.size)
        h, pos = cls._load(window, epsilon, ints, 0)
        if pos != len(ints):
            raise ValueError("exponential histogram snapshot has trailing data")
        return h

    def _dump(self, ints: array) -> None:
        """Append now, the number of levels, each level's size, then all timestamps."""
        levels = self._levels
        ints.append(self._now)
        ints.append(len(levels))
        ints.extend(map(len, levels))
        for q in levels:
            ints.extend(q)

    @staticmethod
    def _dump_many(histograms: Iterable["ExponentialHistogram"], ints: array) -> tuple[list[int], list[int]]:
        """``_dump`` of each of ``histograms`` in turn into ``ints`` (one loop, as :meth:`_load_many`);
        → where each one's integers end, and its newest bucket's timestamp (``NO_TIME`` for one
        without buckets: a timestamp too, tell them apart by its level count)."""
        ends, newest = [], []
        append, extend = ints.append, ints.extend
        for h in histograms:
            levels = h._levels
            append(h._now)
            append(len(levels))
            if len(levels) == 1:  # (most keys)
                q = levels[0]
                append(len(q))
                extend(q)
                newest.append(q[-1])
            else:
                extend(map(len, levels))
                for q in levels:
                    extend(q)
                last = h.newest()
                newest.append(NO_TIME if last is None else last)
            ends.append(len(ints))
        return ends, newest

    @classmethod
    def _load(cls, window: int, epsilon: float, ints: Sequence[int],
              pos: int) -> tuple["ExponentialHistogram", int]:
        """Read what ``_dump`` wrote at ``pos``; window and epsilon come from a header the
        caller validated. Returns the histogram and the position after it."""
        (h,), pos = cls._load_many(window, epsilon, ints, pos, (None,))
        return h, pos

    @classmethod
    def _load_many(cls, window: int, epsilon: float, ints: Sequence[int], pos: int,
                   ends: Sequence[int | None]) -> tuple[list["ExponentialHistogram"], int]:
        """The histograms ``_dump`` wrote one after the other from ``pos``, the i-th ending at
        ``ends[i]`` (None: wherever it ends); one loop with its names bound once, for a sparse key's
        histogram is a few integers and a call a key was most of its decode. → them and the
        position after the last."""
        cap, new, size_of_all = buckets_per_size(epsilon), cls.__new__, len(ints)
        out = []
        try:
            for end in ends:
                h = new(cls)
                h._window, h._epsilon, h._cap, h._now = window, epsilon, cap, ints[pos]
                nlevels = ints[pos + 1]
                if nlevels == 1:  # (most keys: one size of bucket)
                    size = ints[pos + 2]
                    if not 0 < size <= cap:
                        raise ValueError(f"level of {size} buckets, more than the cap {cap}" if size > cap
                                         else "exponential histogram snapshot is truncated or malformed")
                    pos += 3
                    h._levels = [deque(ints[pos:pos + size])]
                    h._total = size
                    pos += size
                else:
                    sizes = ints[pos + 2:pos + 2 + nlevels]
                    if len(sizes) < nlevels:
                        raise IndexError
                    pos += 2 + nlevels
                    levels, total = [], 0
                    for j, size in enumerate(sizes):
                        if not 0 <= size <= cap:
                            raise ValueError(f"level of {size} buckets, more than the cap {cap}")
                        levels.append(deque(ints[pos:pos + size]))
                        total += size << j
                        pos += size
                    if levels and not levels[-1]:
                        raise ValueError("exponential histogram snapshot is truncated or malformed")
                    h._levels, h._total = levels, total
                if pos > size_of_all:
                    raise ValueError("exponential histogram snapshot is truncated or malformed")
                if end is not None and pos != end:
                    raise ValueError(f"row {len(out)} of {len(ends)} is not one histogram (damaged)")
                out.append(h)
        except IndexError:
            raise ValueError("exponential histogram snapshot is truncated") from None
        return out, pos


# -- histograms of one level of buckets, as columns ----------------------------------------------
# A sparse key's histogram is a few buckets of one size: a new event appends a bucket and moves
# ``now``, as long as the level stays within the cap and no bucket leaves the window. Many keys'
# rows (``_dump``'s integers) are read and appended to that way with a few array operations, the
# keys never becoming objects (count operator, ``CountOperator._take_small``).


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[i], …, starts[i] + lengths[i] − 1`` of every i, in order."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


class OneLevel(NamedTuple):
    """``_dump`` rows read as columns (:func:`one_level`); a row with ``ok`` false is not one of
    at most one level, or not well formed, and its other columns mean nothing."""

    ok: np.ndarray      # the row holds one level of buckets or none
    now: np.ndarray     # its ``now``
    size: np.ndarray    # its buckets (0: none)
    oldest: np.ndarray  # its oldest bucket's timestamp (``TIME_LIMIT`` without a bucket)
    newest: np.ndarray  # its newest bucket's timestamp (``NO_TIME`` without a bucket)


def one_level(ints: np.ndarray, starts: np.ndarray, lengths: np.ndarray, cap: int) -> OneLevel:
    """The rows ``ints[starts[i] : starts[i] + lengths[i]]`` (``_dump``'s integers: now, the number
    of levels, each level's size, the timestamps) as :class:`OneLevel` columns."""
    last = len(ints) - 1
    if last < 0:
        empty = np.zeros(0, np.int64)
        return OneLevel(np.zeros(0, np.bool_), empty, empty, empty, empty)

    def at(i: np.ndarray) -> np.ndarray:
        return ints[np.clip(i, 0, last)]

    levels = at(starts + 1)
    size = np.where(levels == 1, at(starts + 2), 0)
    ok = (lengths >= 2) & (((levels == 0) & (lengths == 2))
                           | ((levels == 1) & (size > 0) & (size <= cap) & (lengths == 3 + size)))
    size = np.where(ok, size, 0)
    some = size > 0
    return OneLevel(ok, at(starts), size, np.where(some, at(starts + 3), TIME_LIMIT),
                    np.where(some, at(starts + lengths - 1), NO_TIME))


def appended(ints: np.ndarray, starts: np.ndarray, size: np.ndarray, now: np.ndarray, added: np.ndarray,
             times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of at most one level (``starts`` in ``ints``, ``size`` buckets each; a row without
    buckets need not exist in ``ints``) with ``added[i]`` buckets of one event appended to row i
    and its ``now`` set to ``now[i]``: ``times`` holds the new buckets' timestamps row after row,
    oldest first. The caller has checked that ``update`` of each would neither carry (``size +
    added`` ≤ cap) nor expire a bucket. → the new rows' integers, one after the other, and each
    row's length."""
    total = size + added
    some = total > 0
    lengths = np.where(some, 3 + total, 2)
    at = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), np.int64)
    out[at] = now
    out[at + 1] = some
    out[at[some] + 2] = total[some]
    out[ranges(at + 3, size)] = ints[ranges(starts + 3, size)]
    out[ranges(at + 3 + size, added)] = times
    return out, lengths


def _le(ints: array) -> array:
    """``ints`` in little-endian byte order (snapshots are portable)."""
    if _BIG_ENDIAN:
        ints = array("q", ints)
        ints.byteswap()
    return ints


def _ints_from(data: bytes, offset: int) -> array:
    ints = array("q")
    body = memoryview(data)[offset:]
    if len(body) % 8:
        raise ValueError("snapshot body is not a whole number of int64s")
    ints.frombytes(body)
    if _BIG_ENDIAN:
        ints.byteswap()
    return ints


_BIG_ENDIAN = struct.pack("=q", 1) != struct.pack("<q", 1)
