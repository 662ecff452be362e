"""Keys' states held as bytes between micro-batches, packed in columns.

An operator decodes only the keys a micro-batch touches (an event, or a due CTI); every other key
stays as its bytes (the match operator: a pickled NFA state; the count operator: a histogram's
integers). :class:`PackedStates` holds those keys as columns — the keys themselves as a
fixed-width UTF-8 column sorted by key, their due CTIs, a count per key its owner keeps (the
match operator's runs in flight), the states as one blob with offsets — so that restoring a chunk,
snapshotting it and finding its due keys cost a few array operations a chunk, and no key becomes a
Python string until something asks for it: a restore is ``np.frombuffer`` of its columns; a
micro-batch's keys are found all at once by binary search (:meth:`find`, NumPy's
``searchsorted`` over the sorted column). Before, a restore unpickled every key into a list and a
dict (≈ 0.13 ms of a 2,048-key match chunk's ≈ 0.25 ms, docs/performance.md, "Keyed state with
sparse keys"). Hand-written because no library keeps a keyed table of byte strings that can hand
out one row, forget it, and be re-packed with new rows cheaply; numpy does the column work.

Invariants: :attr:`names` holds each row's key, UTF-8, followed by :data:`END` (a fixed-width
bytes column drops trailing NULs; so no name ends in one, and two keys are two names), as wide as
the longest; rows ``[0, ordered)`` are sorted by name; the rows after them, appended since, are
all in :attr:`_found`; ``alive`` is True exactly at the held keys' rows, one row per held key,
``held`` counts them; :attr:`_found` maps keys to their alive rows for the keys looked up or
appended (every held key once :attr:`_complete`), and, until then, keys looked up and not held to −1; a key
taken (:meth:`take`) or dropped (:meth:`drop`) keeps its row (dead) until a re-pack drops it;
rows are never changed in place (the arrays may be read-only views of a snapshot's bytes).
:meth:`packed` appends new rows after the dead ones until the dead outnumber the held, so a call
that touched a few keys of a large chunk costs those keys; a re-pack (:meth:`select`) merges the
appended rows into the sorted ones, and a snapshot (:meth:`to_plain`) holds no dead or unsorted
row.
"""
from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Sequence
from itertools import repeat
from typing import NamedTuple

import numpy as np

#: ``runs`` of a key whose runs in flight were not counted (snapshots of version 2)
RUNS_UNKNOWN = -1
#: after every key in :attr:`PackedStates.names`
END = b"\x01"
_END_TEXT = END.decode()
#: :meth:`PackedStates.find`'s mark of a key it has no answer for yet (rows are ≥ 0, not held −1)
_UNASKED = -2


def names_of(keys: Sequence[str]) -> np.ndarray:
    """``keys`` as :attr:`PackedStates.names` holds them: each UTF-8 followed by :data:`END`, a
    fixed-width bytes column. Keys of one length in bytes (ids such as ``acct-000123``: the usual
    sparse keys) are joined and encoded once and the bytes viewed as the column (no bytes object
    a key): it is theirs when the joined bytes hold :data:`END` exactly at the ends of
    equal rows and nowhere else; any other keys one by one."""
    n = len(keys)
    if not n:
        return np.zeros(0, "S1")
    if len(keys[0]) == len(keys[n // 2]) == len(keys[-1]):  # (else not of one length)
        joined = (_END_TEXT.join(keys) + _END_TEXT).encode()
        width = len(keys[0].encode()) + 1
        if len(joined) == n * width and joined.count(END) == n:
            ends = np.frombuffer(joined, np.uint8)[width - 1::width]
            if (ends == END[0]).all():
                return np.frombuffer(joined, f"S{width}")
    return np.array([k.encode() + END for k in keys], dtype=bytes)


def rows_in(names: np.ndarray, keys: Sequence[str]) -> np.ndarray:
    """Each of ``keys``' row in ``names`` (a :func:`names_of` column sorted by name), −1 for a key
    not in it: one binary search of the column for all of them."""
    if not len(names) or not len(keys):
        return np.full(len(keys), -1, np.int64)
    return rows_of_names(names, names_of(keys))


def rows_of_names(names: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Each of ``probe``'s row in ``names`` (both :func:`names_of` columns, ``names`` sorted, of
    any widths), −1 for a name not in it: :func:`rows_in` for keys that are names already."""
    m = len(names)
    if not m or not len(probe):
        return np.full(len(probe), -1, np.int64)
    at = np.minimum(np.searchsorted(names, probe), m - 1)
    return np.where(names[at] == probe, at, -1)


def _joined(src: bytes, starts: np.ndarray, ends: np.ndarray) -> bytes:
    """The byte ranges ``[starts, ends)`` of ``src``, in order, joined (a contiguous run at a time)."""
    if not len(starts):
        return b""
    cut = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    view = memoryview(src)
    return b"".join([view[a:b] for a, b in zip(starts[np.r_[0, cut]].tolist(),
                                                ends[np.r_[cut - 1, len(ends) - 1]].tolist())])


def _extended(blob: bytes | bytearray, more: bytes) -> bytearray:
    """``blob`` with ``more`` after it: a ``bytearray`` appended to in place (a warm chunk's rows
    appended to every micro-batch copy what they add, not the chunk's every state: with sparse keys
    a 65,536-key match chunk's states are megabytes, copied twice a batch until 2026-12-04); a
    ``bytes`` blob (a restore's) copied into one once. Where a NumPy view of it is alive (it cannot
    grow then), a new one."""
    if type(blob) is not bytearray:
        blob = bytearray(blob)
    try:
        blob += more
    except BufferError:
        blob = blob + more
    return blob


class NewRows(NamedTuple):
    """Rows for :meth:`PackedStates.packed` as columns: ``keys`` (not held), each one's due CTI,
    state bytes (``blob``: every row's joined, ``lengths`` each one's) and runs (int64 arrays);
    ``names``: the keys as :func:`names_of` makes them, when the rows come from a column that
    holds them so (:meth:`PackedStates.columns`: not encoded again)."""

    keys: list[str]
    dues: np.ndarray
    blob: bytes
    lengths: np.ndarray
    runs: np.ndarray
    names: np.ndarray | None = None

    @classmethod
    def of(cls, new: "Iterable[tuple[str, int, bytes, int]] | NewRows | None") -> "NewRows | None":
        """``new`` as columns (rows ``(key, due, pickled state, runs)`` or columns already); None
        for no rows."""
        if new is None or isinstance(new, NewRows):
            return new if new is not None and new.keys else None
        rows = list(new)
        if not rows:
            return None
        keys, dues, blobs, runs = zip(*rows)
        return cls(list(keys), np.array(dues, np.int64), b"".join(blobs),
                   np.fromiter(map(len, blobs), np.int64, len(blobs)), np.array(runs, np.int64))

    def names_column(self) -> np.ndarray:
        """The keys as :func:`names_of` makes them."""
        return names_of(self.keys) if self.names is None else self.names


class PackedStates:
    """Keys → (due CTI, state bytes, runs in flight or another count), in columns (module docstring)."""

    __slots__ = ("names", "dues", "runs", "offsets", "blob", "alive", "held", "ordered", "_found",
                 "_complete")

    def __init__(self, names: np.ndarray | None = None, dues: np.ndarray | None = None,
                 runs: np.ndarray | None = None, offsets: np.ndarray | None = None, blob: bytes = b"",
                 ordered: int | None = None) -> None:
        """``ordered``: rows sorted by name from the first (all of them: None)."""
        self.names = np.zeros(0, "S1") if names is None else names
        n = len(self.names)
        self.dues = np.zeros(n, np.int64) if dues is None else dues
        self.runs = np.zeros(n, np.int64) if runs is None else runs
        self.offsets = np.zeros(n + 1, np.int64) if offsets is None else offsets
        self.blob = blob
        if not (len(self.dues) == len(self.runs) == n == len(self.offsets) - 1) \
                or self.offsets[-1] != len(blob):
            raise ValueError("packed key states whose columns do not line up (truncated or damaged)")
        #: per row: its key is held
        self.alive = np.ones(n, np.bool_)
        self.held = n
        self.ordered = n if ordered is None else ordered
        self._found: dict[str, int] = {}  # key → row (module docstring)
        self._complete = n == 0
        if self.ordered < n:
            tail = np.arange(self.ordered, n)
            self._found.update(zip(self.keys_of(tail), tail.tolist()))

    # -- as a snapshot holds it --------------------------------------------------------------------
    def to_plain(self) -> tuple:
        """The held keys as ``(names, their width, dues, runs, offsets, blob)``: the names sorted,
        each key's UTF-8 followed by :data:`END` and NULs to the width; the columns int64
        (re-packed first when keys were taken, dropped or appended)."""
        p = self.packed(())
        return (p.names.tobytes(), p.names.dtype.itemsize, p.dues.tobytes(), p.runs.tobytes(),
                p.offsets.tobytes(), bytes(p.blob))

    @classmethod
    def from_plain(cls, plain: tuple) -> "PackedStates":
        names, width, dues, runs, offsets, blob = plain
        columns = (np.frombuffer(b, np.int64) for b in (dues, runs, offsets))
        return cls(np.frombuffer(names, f"S{width}"), *columns, blob)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, int, bytes, int]]) -> "PackedStates":
        """From ``(key, due, pickled state, runs)`` rows (keys distinct)."""
        return cls().select(np.zeros(0, np.int64), rows)

    # -- the held keys ---------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._row(key) >= 0

    def __len__(self) -> int:
        return self.held

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.keys()))

    def keys(self):
        """The held keys, a set-like view (every key made a string and indexed)."""
        if not self._complete:
            rows = self._held()
            self._found = dict(zip(self.keys_of(rows), rows.tolist()))
            self._complete = True
        return self._found.keys()

    def keys_of(self, rows: np.ndarray) -> list[str]:
        """The keys of ``rows``, as strings."""
        return [name[:-1].decode() for name in self.names[rows].tolist()]

    def find(self, keys: Sequence[str]) -> np.ndarray:
        """Each of ``keys``' row, −1 for a key not held; the answers are remembered (a later
        :meth:`find`, :meth:`take`, :meth:`drop` or ``in`` of them is a dict lookup: with sparse keys
        a batch asks for the keys it changed several times — to snapshot them, whether still held).
        Only the keys without an answer are searched for, in the sorted rows (the rows appended
        since are all answered)."""
        found = self._found
        n = len(keys)
        got = np.fromiter(map(found.get, keys, repeat(_UNASKED, n)), np.int64, n)
        ask = np.flatnonzero(got == _UNASKED)
        if not len(ask):
            return got
        m = self.ordered
        if self._complete or not self.held or not m:
            got[ask] = -1
            if not self._complete:  # (complete: every key it holds is a held one, :meth:`keys`)
                found.update(zip(map(keys.__getitem__, ask.tolist()), repeat(-1)))
            return got
        asked = [keys[i] for i in ask.tolist()]
        at = rows_in(self.names[:m], asked)
        hit = at >= 0
        hit[hit] = self.alive[at[hit]]
        at = np.where(hit, at, -1)
        got[ask] = at
        found.update(zip(asked, at.tolist()))
        return got

    def _row(self, key: str) -> int:
        """``key``'s row, −1 if not held."""
        row = self._found.get(key)
        if row is not None:
            return row
        return -1 if self._complete else int(self.find([key])[0])

    def take(self, key: str) -> bytes:
        """``key``'s pickled state; the key is no longer held (its caller holds it decoded)."""
        i = self._row(key)
        if i < 0:
            raise KeyError(key)
        self._forget(key, i)
        offsets = self.offsets
        return bytes(memoryview(self.blob)[offsets[i]:offsets[i + 1]])  # (a bytearray's slice: a copy)

    def take_many(self, keys: Sequence[str]) -> tuple[list[str], bytes, np.ndarray]:
        """:meth:`take` of every held key among ``keys`` (distinct) at once: → those keys, in the
        order of ``keys``, their states' bytes joined in that order (one search, one copy), and
        where each one's ends in them."""
        rows = self.find(keys) if keys else np.zeros(0, np.int64)
        hit = np.flatnonzero(rows >= 0)
        if not len(hit):
            return [], b"", np.zeros(0, np.int64)
        at = rows[hit]
        taken = [keys[i] for i in hit.tolist()]
        found = self._found
        for key in taken:
            found.pop(key, None)
        self.alive[at] = False
        self.held -= len(at)
        starts, ends = self.offsets[at], self.offsets[at + 1]
        return taken, _joined(self.blob, starts, ends), np.cumsum(ends - starts)

    def drop(self, key: str) -> None:
        """Forget ``key`` if held."""
        i = self._row(key)
        if i >= 0:
            self._forget(key, i)

    def drop_many(self, keys: Iterable[str]) -> None:
        """Forget those of ``keys`` held (found and dropped all at once)."""
        keys = list(keys)
        if not keys:
            return
        rows = self.find(keys)
        rows = np.unique(rows[rows >= 0])  # (a key listed twice)
        self.alive[rows] = False
        self.held -= len(rows)
        found = self._found
        for key in keys:
            found.pop(key, None)

    def _forget(self, key: str, i: int) -> None:
        self._found.pop(key, None)
        self.alive[i] = False
        self.held -= 1

    def _held(self) -> np.ndarray:
        """The held keys' rows, ascending."""
        if self.held == len(self.alive):
            return np.arange(self.held)
        return np.flatnonzero(self.alive)

    def due_keys(self, cti: int) -> list[str]:
        """The held keys due at ``cti`` (due CTI ≤ ``cti``)."""
        rows = np.flatnonzero((self.dues <= cti) & self.alive)
        if not len(rows):
            return []
        keys = self.keys_of(rows)
        self._found.update(zip(keys, rows.tolist()))
        return keys

    def next_due(self, default: int) -> int:
        """The smallest due CTI of the held keys (``default`` when none is held)."""
        if not self.held:
            return default
        dues = self.dues if self.held == len(self.alive) else self.dues[self._held()]
        return int(dues.min())

    def all_due(self, due: int) -> "PackedStates":
        """The held keys, each due at ``due``, as a new instance."""
        packed = self.select(self._held())
        packed.dues = np.full(len(packed), due, np.int64)
        return packed

    def runs_total(self) -> tuple[int, list[str]]:
        """Runs in flight over the held keys that counted them, and the keys that did not."""
        rows = self._held()
        runs = self.runs[rows]
        return int(runs[runs != RUNS_UNKNOWN].sum()), self.keys_of(rows[runs == RUNS_UNKNOWN])

    def columns(self) -> NewRows:
        """The held keys as :class:`NewRows` (what :meth:`packed` takes), their rows copied at once."""
        p = self.packed(())
        return NewRows(p.keys_of(np.arange(len(p.names))), p.dues, bytes(p.blob), np.diff(p.offsets), p.runs,
                       p.names)

    def absent(self, keys: Iterable[str], *decoded: Container[str]) -> list[str]:
        """Those of ``keys`` neither held here nor in any of ``decoded`` (the owner's keys it holds
        decoded), sorted, found in one search: the keys a frame of them names dropped."""
        keys = list(keys)
        rows = self.find(keys).tolist() if keys else []
        gone = [key for key, row in zip(keys, rows) if row < 0]
        for held in decoded:
            gone = [key for key in gone if key not in held]
        return sorted(gone)

    def subset(self, keys: Iterable[str]) -> "PackedStates":
        """The held keys among ``keys``, as a new instance."""
        keys = list(keys)
        rows = self.find(keys) if keys else np.zeros(0, np.int64)
        return self.select(np.unique(rows[rows >= 0]))

    # -- re-packing ------------------------------------------------------------------------------
    def packed(self, new: "Iterable[tuple[str, int, bytes, int]] | NewRows") -> "PackedStates":
        """The held keys plus ``new`` rows ``(key, due, pickled state, runs)`` (keys not held; or
        those rows as columns, :class:`NewRows`): ``self`` when nothing was taken, dropped,
        appended or added; ``self`` with the rows appended while the dead rows are at most as many
        as the held ones (``self`` is then changed: callers replace what they held by the result);
        else a new instance of the held rows and the new ones, sorted (:meth:`select`)."""
        added = NewRows.of(new)
        held, n = self.held, len(self.names)
        if added is None and held == n == self.ordered:
            return self
        if 2 * held < n or added is None:
            return self.select(self._held(), added)
        k = len(added.keys)
        self.names = np.concatenate([self.names, added.names_column()])
        self._found.update(zip(added.keys, range(n, n + k)))
        self.dues = np.concatenate([self.dues, added.dues])
        self.runs = np.concatenate([self.runs, added.runs])
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(added.lengths)])
        self.blob = _extended(self.blob, added.blob)
        self.alive = np.concatenate([self.alive, np.ones(k, np.bool_)])
        self.held += k
        return self

    def select(self, rows: np.ndarray, new: "Iterable[tuple[str, int, bytes, int]] | NewRows | None" = ()
               ) -> "PackedStates":
        """Rows ``rows`` (ascending) plus ``new`` rows (as :meth:`packed` takes them), as a new
        instance sorted by name: the rows appended since the last sort and the new ones sorted,
        then merged into the sorted ones (their bytes copied a contiguous run of rows at a time)."""
        rows = np.asarray(rows, np.int64)
        m, offsets, blob = self.ordered, self.offsets, self.blob
        base, tail = rows[rows < m], rows[rows >= m]
        names, dues, runs = self.names[base], self.dues[base], self.runs[base]
        starts, ends = offsets[base], offsets[base + 1]
        added = NewRows.of(new)
        if len(tail) or added is not None:
            more = ([self.names[tail]], [self.dues[tail]], [self.runs[tail]], [offsets[tail]],
                    [offsets[tail + 1]])
            if added is not None:
                at = np.zeros(len(added.keys) + 1, np.int64)
                np.cumsum(added.lengths, out=at[1:])
                at += len(blob)
                blob = b"".join((blob, added.blob))
                columns = (added.names_column(), added.dues, added.runs, at[:-1], at[1:])
                for column, values in zip(more, columns):
                    column.append(values)
            more_names, more_dues, more_runs, more_starts, more_ends = (np.concatenate(c) for c in more)
            order = np.argsort(more_names, kind="stable")
            more_names = more_names[order]
            where = np.searchsorted(names, more_names)
            names = np.insert(names.astype(np.result_type(names, more_names), copy=False), where, more_names)
            dues = np.insert(dues, where, more_dues[order])
            runs = np.insert(runs, where, more_runs[order])
            starts = np.insert(starts, where, more_starts[order])
            ends = np.insert(ends, where, more_ends[order])
        sizes = np.zeros(len(names) + 1, np.int64)
        np.cumsum(ends - starts, out=sizes[1:])
        return PackedStates(names, dues, runs, sizes, _joined(blob, starts, ends))

    def split(self, where) -> dict[int, "PackedStates"]:
        """The held keys split by ``where(key)``."""
        rows = self._held()
        parts: dict[int, list[int]] = {}
        for key, i in zip(self.keys_of(rows), rows.tolist()):
            parts.setdefault(where(key), []).append(i)
        return {d: self.select(np.asarray(r, np.int64)) for d, r in parts.items()}
