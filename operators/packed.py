"""Keys' states held as bytes between micro-batches, packed in columns.

An operator decodes only the keys a micro-batch touches (an event, or a due CTI); every other key
stays as its bytes (the match operator: a pickled NFA state; the count operator: a histogram's
integers). :class:`PackedStates` holds those keys as columns — the keys, their due CTIs, a count
per key its owner keeps (the match operator's runs in flight), one blob with offsets — so that
restoring a chunk, snapshotting it and finding its due keys cost a few array operations a chunk
instead of Python work a key (a dict of tuples was unpickled, scanned and pickled again whole every
batch; ``docs/performance.md#latency``). Hand-written because no library keeps a keyed table of
byte strings that can hand out one row, forget it, and be re-packed with new rows cheaply; numpy
does the column work.

Invariants: ``index`` maps each key still held to its row, and ``alive`` is True exactly at those
rows; a key taken (:meth:`take`) or dropped (:meth:`drop`) leaves the index but keeps its row (dead)
until a re-pack drops it; rows are never changed in place (the arrays may be read-only views of a
snapshot's bytes). :meth:`packed` appends new rows after the dead ones until the dead outnumber the
held, so a call that touched a few keys of a large chunk costs those keys (and a copy of the bytes),
not a dict and a list built anew for every key; a snapshot (:meth:`to_plain`) holds no dead rows.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

#: ``runs`` of a key whose runs in flight were not counted (snapshots of version 2)
RUNS_UNKNOWN = -1


class PackedStates:
    """Keys → (due CTI, state bytes, runs in flight or another count), in columns (module docstring)."""

    __slots__ = ("_keys", "dues", "runs", "offsets", "blob", "index", "alive")

    def __init__(self, keys: list[str] | None = None, dues: np.ndarray | None = None,
                 runs: np.ndarray | None = None, offsets: np.ndarray | None = None,
                 blob: bytes = b"") -> None:
        self._keys: list[str] = [] if keys is None else keys
        n = len(self._keys)
        self.dues = np.zeros(n, np.int64) if dues is None else dues
        self.runs = np.zeros(n, np.int64) if runs is None else runs
        self.offsets = np.zeros(n + 1, np.int64) if offsets is None else offsets
        self.blob = blob
        self.index: dict[str, int] = dict(zip(self._keys, range(n)))
        #: per row: its key is held (:attr:`index` names it)
        self.alive = np.ones(n, np.bool_)

    # -- as a snapshot holds it --------------------------------------------------------------------
    def to_plain(self) -> tuple:
        """The held keys as ``(keys, dues, runs, offsets, blob)`` of plain bytes (re-packed first
        when keys were taken or dropped)."""
        packed = self.packed(())
        return (packed._keys, packed.dues.tobytes(), packed.runs.tobytes(), packed.offsets.tobytes(),
                packed.blob)

    @classmethod
    def from_plain(cls, plain: tuple) -> "PackedStates":
        keys, dues, runs, offsets, blob = plain
        return cls(keys, np.frombuffer(dues, np.int64), np.frombuffer(runs, np.int64),
                   np.frombuffer(offsets, np.int64), blob)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, int, bytes, int]]) -> "PackedStates":
        """From ``(key, due, pickled state, runs)`` rows (keys distinct)."""
        return cls().packed(rows)

    # -- the held keys ---------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self.index

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def keys(self):
        """The held keys, a set-like view."""
        return self.index.keys()

    def take(self, key: str) -> bytes:
        """``key``'s pickled state; the key is no longer held (its caller holds it decoded)."""
        i = self.index.pop(key)
        self.alive[i] = False
        offsets = self.offsets
        return self.blob[offsets[i]:offsets[i + 1]]

    def drop(self, key: str) -> None:
        """Forget ``key`` if held."""
        i = self.index.pop(key, None)
        if i is not None:
            self.alive[i] = False

    def _held(self) -> np.ndarray:
        """The held keys' rows, ascending."""
        if len(self.index) == len(self._keys):
            return np.arange(len(self._keys))
        return np.flatnonzero(self.alive)

    def due_keys(self, cti: int) -> list[str]:
        """The held keys due at ``cti`` (due CTI ≤ ``cti``)."""
        rows = np.flatnonzero((self.dues <= cti) & self.alive)
        return list(map(self._keys.__getitem__, rows.tolist())) if len(rows) else []

    def next_due(self, default: int) -> int:
        """The smallest due CTI of the held keys (``default`` when none is held)."""
        if not self.index:
            return default
        dues = self.dues if len(self.index) == len(self._keys) else self.dues[self._held()]
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
        unknown = rows[runs == RUNS_UNKNOWN]
        return int(runs[runs != RUNS_UNKNOWN].sum()), [self._keys[i] for i in unknown.tolist()]

    def rows(self) -> Iterator[tuple[str, int, bytes, int]]:
        """The held keys as ``(key, due, pickled state, runs)`` rows (what :meth:`packed` takes)."""
        keys, dues, runs, offsets, blob = self._keys, self.dues, self.runs, self.offsets, self.blob
        for i in self._held().tolist():
            yield keys[i], int(dues[i]), blob[offsets[i]:offsets[i + 1]], int(runs[i])

    def subset(self, keys: Iterable[str]) -> "PackedStates":
        """The held keys among ``keys``, as a new instance."""
        index = self.index
        rows = np.fromiter((index[k] for k in keys if k in index), np.int64)
        rows.sort()
        return self.select(rows)

    # -- re-packing ------------------------------------------------------------------------------
    def packed(self, new: Iterable[tuple[str, int, bytes, int]]) -> "PackedStates":
        """The held keys plus ``new`` rows ``(key, due, pickled state, runs)`` (keys not held):
        ``self`` when nothing was taken, dropped or added; ``self`` with the rows appended while
        the dead rows are at most as many as the held ones (``self`` is then changed: callers
        replace what they held by the result); else a new instance of the held rows and the new
        ones, the held keys' bytes copied a contiguous run of rows at a time."""
        added = list(new)
        held = len(self.index)
        if not added and held == len(self._keys):
            return self
        if 2 * held < len(self._keys) or not added:
            return self.select(self._held(), added)
        new_keys, new_dues, blobs, new_runs = zip(*added)
        n = len(self._keys)
        self._keys.extend(new_keys)
        self.index.update(zip(new_keys, range(n, n + len(new_keys))))
        self.dues = np.concatenate([self.dues, np.array(new_dues, np.int64)])
        self.runs = np.concatenate([self.runs, np.array(new_runs, np.int64)])
        lengths = np.fromiter(map(len, blobs), np.int64, len(blobs))
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(lengths)])
        self.blob = b"".join((self.blob, *blobs))
        self.alive = np.concatenate([self.alive, np.ones(len(new_keys), np.bool_)])
        return self

    def select(self, rows: np.ndarray, new: Iterable[tuple[str, int, bytes, int]] = ()) -> "PackedStates":
        """Rows ``rows`` (ascending) plus ``new`` rows, as a new instance."""
        offsets = self.offsets
        parts: list = []
        lengths = [np.diff(offsets)[rows]] if len(rows) else []
        if len(rows):
            cut = np.flatnonzero(np.diff(rows) != 1) + 1
            first = rows[np.r_[0, cut]]
            last = rows[np.r_[cut - 1, len(rows) - 1]] + 1
            view = memoryview(self.blob)
            parts = [view[a:b] for a, b in zip(offsets[first].tolist(), offsets[last].tolist())]
        keys = list(map(self._keys.__getitem__, rows.tolist()))
        dues, runs = [self.dues[rows]], [self.runs[rows]]
        added = list(new)
        if added:
            new_keys, new_dues, blobs, new_runs = zip(*added)
            keys.extend(new_keys)
            parts.extend(blobs)
            dues.append(np.array(new_dues, np.int64))
            runs.append(np.array(new_runs, np.int64))
            lengths.append(np.fromiter(map(len, blobs), np.int64, len(blobs)))
        offsets = np.zeros(len(keys) + 1, np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return PackedStates(keys, np.concatenate(dues), np.concatenate(runs), offsets, b"".join(parts))

    def split(self, where) -> dict[int, "PackedStates"]:
        """The held keys split by ``where(key)``."""
        rows = self._held()
        keys = self._keys
        parts: dict[int, list[int]] = {}
        for i in rows.tolist():
            parts.setdefault(where(keys[i]), []).append(i)
        return {d: self.select(np.asarray(r, np.int64)) for d, r in parts.items()}
