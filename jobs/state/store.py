"""A key group's state in Spark's state store: the layouts (one table, :data:`LAYOUTS`), the
header's compression and its parts.

A group's state is entries of numbers → bytes: keyed-state chunks from 0
(:mod:`ctiflow.jobs.core.runtime`), the time layer's parts from :data:`ctiflow.jobs.state.parts.PART_KEYS`,
the header under :attr:`GroupState.HEADER` and its parts below it.
"""

from __future__ import annotations

import struct
import time

#: How a key group's state is laid out in Spark's state store, the layout new checkpoints get
#: (:class:`GroupState`); a checkpoint keeps the layout it was started with.
STATE_LAYOUT = 3


def _schemas():
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    return StructType([StructField("chunk", IntegerType())]), StructType([StructField("blob", BinaryType())])


class StoreClock:
    """The µs a key group's calls spent in Spark's state store (each a round trip to the state
    server, its iterators' fetches included) since :meth:`take`: a state variable goes through
    :meth:`timed`. Summed in ns (an item an iterator serves from a page already fetched takes
    less than a µs). ``now``: the clock, ns (tests give their own). Why by hand: PySpark's state
    API has no such figure."""

    def __init__(self, now=time.perf_counter_ns) -> None:
        self.ns, self.now = 0, now

    @property
    def us(self) -> int:
        return self.ns // 1000

    def take(self) -> int:
        """The µs since the last take (what is left below a µs is dropped with the rest)."""
        us, self.ns = self.ns // 1000, 0
        return us

    def timed(self, var, iterating: tuple[str, ...] = ()):
        """``var`` with its calls timed; those named in ``iterating`` return iterators, timed as
        they are iterated (``MapState.iterator``, ``ListState.get``)."""
        return _Timed(var, self, iterating)

    def add(self, started: int) -> None:
        self.ns += self.now() - started


class _Timed:
    """``var`` (a state variable) with each call's time added to ``clock`` (:meth:`StoreClock.timed`);
    its other attributes as they are."""

    def __init__(self, var, clock: StoreClock, iterating: tuple[str, ...]) -> None:
        self._var, self._clock, self._iterating = var, clock, iterating

    def __getattr__(self, name: str):
        call, clock = getattr(self._var, name), self._clock
        if not callable(call):
            return call
        iterates = name in self._iterating

        def timed(*args, **kwargs):
            started = clock.now()
            got = call(*args, **kwargs)
            clock.add(started)
            return _timed_iter(got, clock) if iterates else got

        return timed


def _timed_iter(items, clock: StoreClock):
    items, now = iter(items), clock.now
    while True:
        started = now()
        try:
            item = next(items)
        except StopIteration:
            clock.add(started)
            return
        clock.add(started)
        yield item


class ChunkStore:
    """A key group's state entries in Spark's state store (``MapState``: entry number ≥ 0 →
    bytes: chunks and parts), shaped like the dict :class:`~ctiflow.jobs.core.runtime.GroupRuntime` keeps
    them in elsewhere; entries under negative numbers are the header's (:class:`GroupState`).
    One state call per entry read or written, entries nobody asks for never read — unless the
    call reads them all at once (:meth:`read_all`); :meth:`reset` starts every call (Spark
    scopes the map to the key group of the call, and one object serves a task's key groups)."""

    def __init__(self, state):
        self.state = state
        #: every entry of the call's key group, when :meth:`read_all` read them; kept current by
        #: the call's writes
        self._all: dict[int, bytes] | None = None

    def reset(self) -> None:
        """Forget what :meth:`read_all` read (a new call: another key group, another batch)."""
        self._all = None

    def read_all(self) -> None:
        """Read every entry in one pass of the map's iterator — a few state calls for all of them
        (Spark sends up to thousands of entries a reply), where a read an entry is a call each
        (a round trip to the state server, ≈ 1–2 ms inside a running query:
        docs/changelog.md#packed-rows-appended-the-sparse-keys-table-2026-11-30); later reads are
        answered from it."""
        self._all = dict(self._entries())

    def get(self, chunk: int) -> bytes | None:
        if self._all is not None:
            return self._all.get(chunk)
        row = self.state.getValue((chunk,))
        return None if row is None else row[0]

    def __setitem__(self, chunk: int, blob: bytes) -> None:
        self.state.updateValue((chunk,), (blob,))
        if self._all is not None:
            self._all[chunk] = blob

    def __delitem__(self, chunk: int) -> None:
        self.state.removeKey((chunk,))
        if self._all is not None:
            self._all.pop(chunk, None)

    def items(self):
        return iter(list(self._all.items())) if self._all is not None else self._entries()

    def _entries(self):
        return ((k[0], v[0]) for k, v in self.state.iterator() if k[0] >= 0)


class GroupState:
    """A key group's state in Spark's state store, layout 3 (:data:`STATE_LAYOUT`):
    one ``MapState`` ("state") holds the chunks under their numbers (:class:`ChunkStore`), the
    header's stored value under :data:`HEADER` and, when that value is
    :data:`HEADER_IN_PARTS` + the count (uint32, little-endian), the header's parts under
    ``HEADER − 1``, ``HEADER − 2``, ….

    One state variable, not three: Spark's state server registers every state variable in every
    task of every micro-batch (codegen'd encoders, a column family lookup) — measured ≈ 15 ms of
    a key group's call a micro-batch for the two this layout drops
    (docs/changelog.md#one-state-variable-and-no-process-starts)."""

    HEADER = -1
    NAME = "state"

    def __init__(self, handle):
        #: the µs the calls spent in the state store (the adapter's ``store_us``)
        self.clock = StoreClock()
        self.map = self.clock.timed(handle.getMapState(self.NAME, *_schemas()), ("iterator",))
        self.chunks = ChunkStore(self.map)

    def read(self) -> tuple[bytes | None, bytes | None]:
        """→ (the header's stored value, the stored header: its parts joined when in parts).
        Every call starts here: the entries' store is :meth:`ChunkStore.reset` for it."""
        self.chunks.reset()
        row = self.map.getValue((self.HEADER,))
        stored = None if row is None else row[0]
        count = self._parts(stored)
        if not count:
            return stored, stored
        return stored, b"".join(self.map.getValue((self.HEADER - 1 - i,))[0] for i in range(count))

    def write(self, stored: bytes | None, header: bytes, seal) -> None:
        """Store ``header`` (whole, or in parts of :data:`ctiflow.jobs.core.rows.PACK_BYTES`; parts of a
        larger earlier header are removed) and ``seal(value)`` as the header's value."""
        from ctiflow.jobs.core import rows  # (pyspark: not when the driver only reads the layout table)

        size = rows.PACK_BYTES
        count = 0
        if len(header) > size:
            for count, at in enumerate(range(0, len(header), size), 1):
                self.map.updateValue((self.HEADER - count,), (header[at:at + size],))
            header = HEADER_IN_PARTS + _COUNT.pack(count)
        for stale in range(count, self._parts(stored)):
            self.map.removeKey((self.HEADER - 1 - stale,))
        self.map.updateValue((self.HEADER,), (seal(header),))
        self.chunks.reset()  # (the call is done: what it read at once is not kept)

    @staticmethod
    def _parts(stored: bytes | None) -> int:
        if stored is None or not stored.startswith(HEADER_IN_PARTS):
            return 0
        return _COUNT.unpack_from(stored, len(HEADER_IN_PARTS))[0]


class LegacyGroupState:
    """Layout 2 (checkpoints written before 2026-11-26): the header's value in a ``ValueState``
    ("header"), its parts in a ``ListState`` ("header_parts", the value then just
    :data:`HEADER_IN_PARTS`), the chunks in a ``MapState`` ("chunks"). Such a checkpoint keeps
    its layout: Spark's checkpoint records its state variables."""

    def __init__(self, handle):
        key, value = _schemas()
        self.clock = StoreClock()
        self.value = self.clock.timed(handle.getValueState("header", value))
        self.parts = self.clock.timed(handle.getListState("header_parts", value), ("get",))
        self.chunks = ChunkStore(self.clock.timed(handle.getMapState("chunks", key, value), ("iterator",)))

    def read(self) -> tuple[bytes | None, bytes | None]:
        """(:meth:`GroupState.read`)"""
        self.chunks.reset()
        row = self.value.get()  # None before the group's first batch (one state call, not two)
        stored = None if row is None else row[0]
        if stored is not None and stored.startswith(HEADER_IN_PARTS):
            return stored, b"".join(part for (part,) in self.parts.get())
        return stored, stored

    def write(self, stored: bytes | None, header: bytes, seal) -> None:
        """(:meth:`GroupState.write`)"""
        from ctiflow.jobs.core import rows  # (pyspark: not when the driver only reads the layout table)

        size = rows.PACK_BYTES
        if len(header) > size:
            self.parts.put([(header[at:at + size],) for at in range(0, len(header), size)])
            header = HEADER_IN_PARTS
        elif stored is not None and stored.startswith(HEADER_IN_PARTS):
            self.parts.clear()
        self.value.update((seal(header),))
        self.chunks.reset()


#: The state layouts this version reads (:data:`STATE_LAYOUT` is the one it writes): 3 is one
#: ``MapState`` holding the header, the key chunks and the time layer's parts; 2 a header
#: ``ValueState``, its parts' ``ListState`` and a ``MapState`` of the other entries; before 2
#: (no entry in ``ctiflow-groups.json``), one blob (refused, :mod:`ctiflow.jobs.driver.checkpoint`).
LAYOUTS = {2: LegacyGroupState, 3: GroupState}


#: the header value when the header is stored in parts (:class:`GroupState`; a pickled or
#: compressed header never starts with this); the token follows, as after any header
HEADER_IN_PARTS = b"ctiflow:header-in-parts"
_COUNT = struct.Struct("<I")
