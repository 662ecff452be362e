"""The operators' keyed state of one key group, in chunks of about ``state.chunk_keys`` keys.

Each non-empty chunk is one entry of the group's state (a ``MapState`` in Spark; a dict elsewhere):
the operators' own snapshots pickled together and zstd-compressed (:mod:`ctiflow.jobs.state.codec`;
chunks stored uncompressed by earlier versions read as they are), as ``("chunk", CHUNK_FORMAT, cti,
snapshots, last seen, keys, keys per operator, tallies per operator)`` (earlier formats:
:func:`ctiflow.jobs.state.compat.chunk_fields`) — its *base*. When its operators track the keys
they change (:meth:`ctiflow.operators.operator.Operator.changed_keys`), a micro-batch that touched
a chunk writes only the state of the keys that commit changed, as the next *frame* of its delta (a
log since its base; frame ``n`` is entry :func:`~ctiflow.jobs.state.parts.frame_entry` ``(c, n)``):
``("delta", DELTA_FORMAT, cti, keys dropped per operator, snapshots of the keys changed, last seen of
the keys whose clock changed, keys, keys per operator, tallies per operator, keys changed)``, read
back by absorbing the frames in order (a key named once: the snapshots name the keys they hold, the
frame those the batch dropped; format 1, until 2026-12-02, named every key changed a second time, a
third of a frame's bytes; a delta before 2026-12-02 held every key changed since the base: one frame);
once the frames would pass ``state.delta_share`` of the base's bytes (times a factor in [0.5, 1.5)
per chunk and base, so that chunks whose deltas grow alike are not all compacted in one batch) or
:data:`~ctiflow.jobs.state.parts.MAX_FRAMES` of them, the chunk is written whole again and its
frames removed (compaction). The header lists each chunk's frames; every entry commits with the
micro-batch's state version, so a replayed batch reads what it wrote or what was before it, never
a mix. Chunks are addressed by linear hashing of the key
(:meth:`KeyedState.address`): when the group's keys outgrow its chunks, the chunks with new
descendants are split (``partition`` of each operator), so a chunk never holds many more keys than
that, however many keys are live. A micro-batch decodes and re-encodes only the chunks it has events
for, whose due CTI it reaches, or all of them at the final CTI: untouched keys stay bytes, so the
work per batch follows the touched chunks, not the live keys (README, "State"); with sparse keys a
batch with more events than the group has chunks touches nearly every chunk, and the deltas keep
what it writes to the keys it changed (docs/performance.md#latency).
"""

from __future__ import annotations

import contextlib
import pickle
import time
import zlib
from collections.abc import Callable, MutableMapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ctiflow.jobs.state import compat
from ctiflow.jobs.state.codec import compressed, expanded
from ctiflow.jobs.state.keyhash import crc32_column
from ctiflow.jobs.state.parts import FRAME_STRIDE, MAX_FRAMES, frame_entry, is_chunk
from ctiflow.operators import snapshots
from ctiflow.operators.errors import StateError
from ctiflow.operators.events import CTI_INFINITY, CTI_NONE

_FIRST = itemgetter(0)
#: A stored chunk's format and its delta's (the module docstring)
CHUNK_FORMAT = 3
DELTA_FORMAT = 2
#: the fewest bytes a chunk's base must have before its changes are written as a delta (below it
#: the delta's own costs, a second entry to write and read and a snapshot per operator, outweigh
#: what it saves)
DELTA_FROM = 4096
#: a delta's bytes a key against its base's, for a first frame after a base until the state has
#: built one (measured 1.4–6× while a frame named its keys twice, ≈ 2–3× since: the most for small
#: deltas and for keys built alike, a frame having fewer neighbours to compress against); each frame
#: built sets the next one's (:attr:`KeyedState.frame_ratio`)
DELTA_PER_KEY = 2.0
#: a frame's bytes that do not grow with its keys (the pickled tuple, each operator's snapshot
#: header, the compression frame; measured 150–310 for count, match and bins, the fewest taken: a
#: frame foretold too small is built and thrown away, one foretold too large is never built): the
#: part of a first frame's estimate that is not a share of its base
FRAME_FIXED = 128
#: the most a learnt :attr:`KeyedState.frame_ratio` is taken as (measured at most ≈ 6): one odd frame
#: cannot keep the chunks after it from building frames that would fit
FRAME_RATIO_MOST = 16.0
#: the fewest reads of chunks a call must need before :meth:`KeyedState.read_ahead` reads every
#: entry at once (below it, the reads cost less than the pass)
READ_ALL_FROM = 8
#: the commits a header names what they wrote (newest first): a worker that holds the state one of
#: them read catches up with what they all wrote (:meth:`KeyedState._caught_up`). 8 (4 until
#: 2026-12-04): two tasks on two Python workers keep a group on one worker for k batches in a row
#: about once in 2^k gaps, and at 4 the other worker then read every chunk whole
HISTORY = 8

STATE_FIX = ("the checkpoint was written by another version or configuration of this job, or is damaged; "
             "run the job with a new spark.checkpoint (it reprocesses its topics from startingOffsets), "
             "or run the ctiflow version and job file that wrote it")


@contextlib.contextmanager
def restoring(what: str):
    """A snapshot that does not restore is a :class:`StateError` naming its owner and the fix."""
    try:
        yield
    except StateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to rebuild state from bytes means the same
        raise StateError(f"{what}: its state in the checkpoint does not restore "
                         f"({type(exc).__name__}: {exc}); {STATE_FIX}") from exc


def chunk_hash(key: str, groups: int) -> int:
    """What addresses ``key``'s chunk within its key group: ``crc32(key) mod groups`` picks the
    group, the quotient the chunk (:meth:`KeyedState.address`)."""
    return zlib.crc32(key.encode()) // groups


class Log(NamedTuple):
    """A chunk's delta as stored: its frames' bytes (in order), the keys they name, and each
    operator's snapshot bytes in them (summed over the frames)."""

    frames: tuple[int, ...]
    keys: int
    op_bytes: tuple[int, ...]

    @classmethod
    def empty(cls, operators: int) -> "Log":
        return cls((), 0, (0,) * operators)

    def add(self, size: int, keys: int, op_sizes) -> "Log":
        return Log((*self.frames, size), self.keys + keys, tuple(map(sum, zip(self.op_bytes, op_sizes))))

    @property
    def bytes(self) -> int:
        return sum(self.frames)


class Chunk:
    """The operators' state of the keys of one chunk of a key group (and their key-TTL clocks).

    ``cti`` is the CTI its operators were last advanced to: a chunk nothing was due in is left
    as bytes for as many micro-batches as it stays so, and is caught up (``advance_to`` the CTI
    the group's operators are at) before it next sees events. ``stored``: its size in the store
    when it was read, ``(bytes, keys, per operator (bytes, keys))`` (base and delta; the header
    keeps the totals; the operators' part is ``()`` for a chunk not stored yet). ``base``: its
    base's ``(bytes, per operator bytes)``; ``log``: its delta's frames since the base
    (:class:`Log`), or None when the next commit writes it whole (no base, an operator without
    deltas, a split); ``seen_since``: keys whose ``last_seen`` changed since it was last written."""

    __slots__ = ("ops", "last_seen", "cti", "stored", "base", "log", "seen_since")

    def __init__(self, ops: list, last_seen: dict[str, int], cti: int, stored: tuple = (0, 0, ()),
                 base: tuple = (0, ()), log: Log | None = None, seen_since: set | None = None):
        self.ops = ops
        self.last_seen = last_seen
        self.cti = cti
        self.stored = stored
        self.base = base
        self.log = log
        self.seen_since = set() if seen_since is None else seen_since

    def due(self, ttl: int | None) -> int:
        """The smallest CTI that would change it (``next_due`` of its operators, the key TTL)."""
        due = min(op.next_due() for op in self.ops)
        if ttl is not None and self.last_seen:
            due = min(due, min(self.last_seen.values()) + ttl + 1)
        return due

    def live_keys(self) -> set[str]:
        keys = set(self.last_seen)
        for op in self.ops:
            keys |= op.live_keys()
        return keys


class KeyedState:
    """The chunks of one key group (module docstring). ``specs``: the operators (each with
    ``build(data=None)``); ``store``: the group's state entries; ``warm``: decoded chunks known to
    equal their bytes in ``store`` (the worker's cache, :class:`ctiflow.jobs.state.warm.WarmChunks`), used
    instead of a read and taken over; ``index``: what the header kept (:meth:`index`), None for
    a new group; ``counters``: the call's :class:`ctiflow.jobs.core.counters.Counters`;
    ``delta_share``: a chunk is written whole once its delta would pass this share of its base's
    bytes (0: always whole); ``read_all``: see :meth:`read_ahead`."""

    def __init__(self, specs: Sequence[Any], store: MutableMapping, counters, *, key_groups: int,
                 chunk_keys: int, ttl: int | None, grows: bool, warm: dict | None = None,
                 index: tuple | None = None, prepare=None, delta_share: float = 0.0,
                 read_all: Callable[[], None] | None = None, read_token: bytes | None = None,
                 behind: Callable[[bytes], dict] | None = None) -> None:
        self.specs = specs
        #: has ``store`` read every entry at once (:meth:`read_ahead`); None: a store without it
        self.read_all = read_all
        #: ``prepare(i, op)`` for each operator of a chunk as the call first uses it (shared
        #: states: :mod:`ctiflow.jobs.core.broadcast`)
        self.prepare = prepare
        self.store = store
        self.counters = counters
        self.key_groups, self.chunk_keys, self.ttl, self.grows = key_groups, chunk_keys, ttl, grows
        self.delta_share = delta_share
        #: a first frame's bytes a key against its base's, as the last frame this state built had them
        #: (:data:`DELTA_PER_KEY` before one, at most :data:`FRAME_RATIO_MOST`; :func:`_pays`)
        self.frame_ratio = DELTA_PER_KEY
        self.warm: dict[int, Chunk] = {} if warm is None else warm
        self.loaded: dict[int, Chunk] = {}
        #: decoded chunks some commits behind the store (:meth:`_caught_up`)
        self.behind: dict[int, Chunk] = {}
        #: the chunks the commits since :attr:`behind` wrote as a frame of their delta, and whole or removed
        self.last_wrote: tuple[set[int], set[int]] = (set(), set())
        #: what this call's commits read and wrote: (the worker's token of the state the call read
        #: (:class:`~ctiflow.jobs.state.warm.WarmChunks`), chunks written as a frame, whole or removed)
        self.committed: tuple = (read_token, set(), set())
        #: the commits before (:meth:`index`), newest first
        self.history: tuple = ()
        if index is None:
            self.due: dict[int, int] = {}  # chunk → its due CTI (chunks that have one)
            self.level, self.split = 0, 0  # linear hashing: 2**level + split chunks
            self.stored_keys = self.stored_bytes = 0  # totals over the stored chunks
            self.op_totals = [[0, 0] for _ in specs]  # per operator: [bytes, keys] over the stored chunks
            self.op_tallies: list[dict[str, int]] = [{} for _ in specs]  # per operator: its tallies, summed
            #: chunk → its delta's frames' bytes (the chunks that have one)
            self.deltas: dict[int, tuple[int, ...]] = {}
            return
        with restoring("the key group's index of its state chunks (in its header)"):
            self.due, (self.level, self.split), (self.stored_keys, self.stored_bytes, self.op_totals,
                                                 self.op_tallies), self.deltas, self.history = index
            commits = [(token, *(np.frombuffer(ids, np.int64).tolist() for ids in (delta, whole)))
                       for token, delta, whole in self.history]
        if behind is not None:
            self._find_behind(behind, commits)

    def _find_behind(self, behind: Callable[[bytes], dict], commits: list) -> None:
        """Take this worker's chunks of the states the last :data:`HISTORY` commits read (``behind``:
        :meth:`~ctiflow.jobs.state.warm.WarmChunks.take_token`; all of them: older states are of no
        use once the group moved on) and, unless the call has the current state (:attr:`warm`), keep
        the newest as :attr:`behind`, with what the commits since wrote (:attr:`last_wrote`).
        ``commits``: :attr:`history` read, each (token, chunks written as a frame, written whole)."""
        delta: set[int] = set()
        whole: set[int] = set()
        for token, wrote_delta, wrote_whole in commits:
            delta.update(wrote_delta)
            whole.update(wrote_whole)
            got = {} if token is None else behind(token)
            if got and not self.warm and not self.behind:
                self.behind, self.last_wrote = got, (delta - whole, set(whole))

    def report(self, counters, names: list[str]) -> None:
        """The stored chunks' totals into ``counters``: each operator's (bytes, keys), and its
        tallies by ``(operator, name)`` (those naming a shared state's ref ``HELD`` aside)."""
        counters.ops = {name: tuple(t) for name, t in zip(names, self.op_totals)}
        counters.tallies = {(name, k): n for name, t in zip(names, self.op_tallies)
                            for k, n in t.items() if isinstance(k, str)}

    def index(self) -> tuple:
        """What the header keeps: due CTIs, the linear hashing's level and split, the totals, the
        deltas' frames' bytes, and the last :data:`HISTORY` commits, newest first: each the
        worker's token of the state it read, the chunks it wrote as a frame, those it wrote whole
        or removed (int64 bytes each)."""
        token, *wrote = self.committed
        delta, whole = (np.array(sorted(s), np.int64).tobytes() for s in wrote)
        return self.due, (self.level, self.split), (self.stored_keys, self.stored_bytes, self.op_totals,
                                                     self.op_tallies), self.deltas, \
            ((token, delta, whole), *self.history)[:HISTORY]

    @property
    def count(self) -> int:
        return (1 << self.level) + self.split

    def address(self, key: str) -> int:
        """``key``'s chunk: linear hashing over :func:`chunk_hash` (chunks below ``split`` are
        already split at this level, so they take one more bit)."""
        h = chunk_hash(key, self.key_groups)
        c = h & ((1 << self.level) - 1)
        return h & ((2 << self.level) - 1) if c < self.split else c

    def addresses(self, keys) -> np.ndarray:
        """Each key's chunk (:meth:`address`), all at once: ``keys`` an Arrow string column or
        anything ``pa.array`` makes one of (a micro-batch's keys; with sparse keys nearly each a
        key of its own, and :meth:`address` a key cost ≈ 0.8 µs, profiled in Spark's workers)."""
        if not isinstance(keys, (pa.Array, pa.ChunkedArray)):
            keys = pa.array(keys, pa.string())
        h = crc32_column(keys).astype(np.int64) // self.key_groups
        c = h & ((1 << self.level) - 1)
        return np.where(c < self.split, h & ((2 << self.level) - 1), c)

    def chunk(self, c: int, blob: bytes | None = None) -> Chunk:
        """Chunk ``c``, decoded from the store on first use in this call (or new and empty)."""
        got = self.loaded.get(c)
        if got is not None:
            return got
        got = self.warm.pop(c, None)
        started = time.perf_counter()
        if got is None and c in self.behind:
            got = self._caught_up(c, self.behind.pop(c))
        if got is not None:
            self._prepare(got.ops)
            self.loaded[c] = got
            self.counters.chunks_loaded += 1
            self.counters.chunks_cached += 1
            self.counters.state_us += int((time.perf_counter() - started) * 1e6)
            return got
        if blob is None and self.stored_bytes:  # none stored (e.g. stateless operators): no store read
            blob = self.store.get(c)
        got = (Chunk([spec.build() for spec in self.specs], {}, CTI_NONE) if blob is None
               else self._decoded(c, blob))
        self._prepare(got.ops)
        self.loaded[c] = got
        self.counters.chunks_loaded += 1
        self.counters.state_us += int((time.perf_counter() - started) * 1e6)
        return got

    def _prepare(self, ops: list) -> None:
        if self.prepare is not None:
            for i, op in enumerate(ops):
                self.prepare(i, op)

    def _decoded(self, c: int, blob: bytes) -> Chunk:
        """Chunk ``c`` from its base ``blob`` and its delta, if it has one."""
        with restoring(f"state chunk {c}"):
            got = snapshots.loads(expanded(blob))
            if got[0] == "chunk":
                snapshots.check_format("state chunk", got[1], CHUNK_FORMAT)
                _, _, cti, blobs, last_seen, keys, op_keys, tallies = got
            else:
                cti, blobs, last_seen, keys, op_keys, tallies = compat.chunk_fields(got)
        ops = []
        for spec, op_blob in zip(self.specs, blobs):
            with restoring(f"operator {spec.name!r} ({spec.cls.__name__})"):
                ops.append(compat.restored(spec.build, op_blob))
        base = (len(blob), tuple(map(len, blobs)))
        log = Log.empty(len(ops)) if self._tracks(ops) else None
        if c not in self.deltas:
            return Chunk(ops, last_seen, cti, (len(blob), keys, tuple(zip(base[1], op_keys, tallies))), base,
                         log)
        return self._absorbed(c, Chunk(ops, last_seen, cti, base=base, log=log or Log.empty(len(ops))), 0)

    def _caught_up(self, c: int, chunk: Chunk) -> Chunk | None:
        """Chunk ``c`` as this worker committed it some commits ago (:attr:`behind`), brought up to
        the store: as it is if none of those commits wrote it, with the frames they added to its
        delta absorbed (each read what the one before left: frames are only appended until the
        chunk is written whole), None if one of them wrote it whole or removed it (then it is read)."""
        delta, whole = self.last_wrote
        if c in whole:
            return None
        if c not in delta:
            return chunk
        frames = len(self.deltas[c])
        left = None if chunk.log is None else len(chunk.log.frames)
        if left is None or left >= frames:
            raise RuntimeError(f"state chunk {c}: the commits since added frames to a delta of {frames} "
                               f"frames, this worker left it with {left} (a bug)")
        self.counters.chunks_caught_up += 1
        return self._absorbed(c, chunk, left)

    def _absorbed(self, c: int, chunk: Chunk, first: int) -> Chunk:
        """``chunk`` (its base and frames before ``first`` absorbed, :attr:`Chunk.log` naming them)
        with frames ``first`` on of its delta in the store absorbed, in order."""
        ops, last_seen, log = chunk.ops, chunk.last_seen, chunk.log
        for n in range(first, len(self.deltas[c])):
            frame = self.store.get(frame_entry(c, n))
            if frame is None:
                raise StateError(f"state chunk {c}: frame {n} of its delta is missing from the state store; "
                                 f"{STATE_FIX}")
            with restoring(f"frame {n} of the delta of state chunk {c}"):
                got = snapshots.loads(expanded(frame))
                if got[1] == 1:  # (format 1: every key changed named; their number from them)
                    _, _, cti, dropped, blobs, seen, keys, op_keys, tallies = got
                    named = sum(map(len, dropped)) + len(seen)
                else:
                    snapshots.check_format("state chunk delta", got[1], DELTA_FORMAT)
                    _, _, cti, dropped, blobs, seen, keys, op_keys, tallies, named = got
            for spec, op, part, keys_of in zip(self.specs, ops, blobs, dropped):
                with restoring(f"operator {spec.name!r} ({spec.cls.__name__}), a delta"):
                    op.absorb(compat.restored(spec.build, part), set(keys_of))  # (compat: earlier formats)
            for key, t in seen.items():
                if t is None:
                    last_seen.pop(key, None)
                else:
                    last_seen[key] = t
            log = log.add(len(frame), named, map(len, blobs))
        base_bytes, base_ops = chunk.base
        return Chunk(ops, last_seen, cti, (base_bytes + log.bytes, keys,
                                           tuple(zip((b + d for b, d in zip(base_ops, log.op_bytes)), op_keys,
                                                     tallies))), chunk.base, log)

    @staticmethod
    def _tracks(ops: list) -> bool:
        """Whether every operator of a chunk tracks the keys it changes (then the chunk keeps
        deltas); asks each, which starts its tracking afresh."""
        return all([op.changed_keys() is not None for op in ops])

    def read_ahead(self, touch: list[int], other_bytes: int = 0) -> None:
        """Have ``store`` read every entry at once (:attr:`read_all`: Spark's store) when the
        chunks ``touch`` names that are neither decoded nor in the worker's cache need at least
        :data:`READ_ALL_FROM` reads and about half the bytes the group stores (its chunks and
        ``other_bytes``: the time layer's parts): then one pass costs a few state calls for at
        most about twice the bytes the reads would fetch. With sparse keys a batch touches
        nearly every chunk, so this is every batch a worker is not the one that ran the group
        last; a long reorder buffer's parts keep it from reading them all for a few chunks."""
        read_all = self.read_all
        if read_all is None or not self.stored_bytes:
            return
        cold = [c for c in touch if c not in self.loaded and c not in self.warm
                and (c not in self.behind or c in self.last_wrote[1])]
        reads = len(cold) + sum(len(self.deltas.get(c, ())) for c in cold)
        fetched = len(cold) * self.stored_bytes // max(1, self.count)  # (chunks' mean size)
        if reads >= READ_ALL_FROM and 2 * fetched >= self.stored_bytes + other_bytes:
            started = time.perf_counter()
            read_all()
            self.counters.state_read_all += 1
            self.counters.state_us += int((time.perf_counter() - started) * 1e6)

    def load_all(self) -> None:
        """Decode every stored chunk (the final CTI; tests and tools)."""
        for c, blob in list(self.store.items()):
            if is_chunk(c):
                self.chunk(c, blob)

    def touched(self, events_in: set[int], cti: int | None) -> list[int]:
        """The chunks a call must decode: those with events, and with a CTI those due at it
        (every chunk at +∞), in chunk order."""
        touch = set(events_in)
        if cti is not None:
            if cti >= CTI_INFINITY:
                self.load_all()
                touch.update(self.loaded)
            else:
                touch.update(c for c, due in self.due.items() if due <= cti and c not in self.loaded)
                # decoded earlier in this call and not committed since: their due entry is stale
                touch.update(c for c, chunk in self.loaded.items()
                             if c not in touch and chunk.due(self.ttl) <= cti)
        return sorted(touch)

    def live_keys(self) -> int:
        """Distinct keys the operators keep state for: the stored totals, corrected by the chunks
        decoded in this call (chunks hold disjoint keys)."""
        return self.stored_keys + sum(self._key_counts(chunk)[1] - chunk.stored[1]
                                      for chunk in self.loaded.values())

    def keys(self) -> set[str]:
        """Every key an operator keeps state for (decodes every chunk: tests and tools)."""
        self.load_all()
        keys: set[str] = set()
        for chunk in self.loaded.values():
            keys |= chunk.live_keys()
        return keys

    def grow(self, live: int) -> set[int]:
        """Split chunks until there are at least ``live / chunk_keys`` of them (``live``: the
        group's live keys, as :meth:`commit` counts them); → the chunks split or made. Linear hashing:
        going from N to N' chunks, every new chunk d descends from one existing chunk, whose keys are
        partitioned by their new address in one pass; other chunks keep theirs."""
        if not self.grows:
            return set()
        want = -(-live // self.chunk_keys)
        old = self.count
        if want <= old:
            return set()
        level, split = self.level, self.split
        sources = set()
        for d in range(old, want):
            a = d & ((1 << level) - 1)
            sources.add(d & ((2 << level) - 1) if a < split else a)
        self.level = want.bit_length() - 1
        self.split = want - (1 << self.level)
        return set().union(*(self._split(c) for c in sorted(sources)))

    def _split(self, c: int) -> set[int]:
        """Chunk ``c``'s keys to the chunks their addresses now name; → those chunks."""
        address = self.address
        chunk = self.chunk(c)
        parts = [op.partition(address) for op in chunk.ops]
        seen: dict[int, dict[str, int]] = {}
        for key, t in chunk.last_seen.items():
            seen.setdefault(address(key), {})[key] = t
        made = {c}.union(*parts, seen)
        for d in made:
            ops = []
            for i, (spec, part) in enumerate(zip(self.specs, parts)):
                op = part.get(d)
                if op is None:
                    op = spec.build()
                    if self.prepare is not None:
                        self.prepare(i, op)
                    if chunk.cti > CTI_NONE and op.advance_to(chunk.cti):
                        raise RuntimeError(f"operator {spec.name!r}: an empty operator emitted on a CTI "
                                           "(a bug)")
                ops.append(op)
            self.loaded[d] = Chunk(ops, seen.get(d, {}), chunk.cti, chunk.stored if d == c else (0, 0, ()),
                                   chunk.base if d == c else (0, ()))  # (written whole: log None)
        return made

    def commit(self) -> None:
        """Split chunks if the keys outgrew them and write the chunks this call decoded back to
        the store (empty ones are removed). The chunks stay decoded: the runtime can go on.
        Afterwards :attr:`stored_keys` is the group's live keys. Each chunk's keys are counted
        once: for the split's count and the chunk's entry alike."""
        sets = {c: self._key_counts(chunk) for c, chunk in self.loaded.items()}
        live = self.stored_keys + sum(keys - self.loaded[c].stored[1] for c, (_, keys) in sets.items())
        for c in self.grow(live):
            sets[c] = self._key_counts(self.loaded[c])
        # (a second commit of this call adds to the first's: a worker that holds the state the call read
        # catches up with both)
        for c, chunk in sorted(self.loaded.items()):
            op_keys, keys = sets[c]
            old_bytes, old_keys, old_ops = chunk.stored
            changes = [op.changed_keys() for op in chunk.ops]  # (every call: each starts afresh)
            if keys == 0:
                if chunk.base[0]:
                    del self.store[c]
                self._drop_delta(c)
                self.due.pop(c, None)
                size, ops = 0, ()
                chunk.base, chunk.log, chunk.seen_since = (0, ()), None, set()
                self.committed[2].add(c)
            else:
                if self._unchanged(chunk, changes):  # the store holds it already (up to its CTI)
                    size, ops = chunk.stored[0], chunk.stored[2]
                    self.counters.chunks_unchanged += 1
                else:
                    size, ops = self._write(c, chunk, changes, op_keys, keys)
                    self.committed[1 if c in self.deltas else 2].add(c)
                due = chunk.due(self.ttl)
                if due < CTI_INFINITY:
                    self.due[c] = due
                else:
                    self.due.pop(c, None)
            self.stored_bytes += size - old_bytes
            self.stored_keys += keys - old_keys
            none = [(0, 0, {})] * len(op_keys)
            for total, tally, new, old in zip(self.op_totals, self.op_tallies, ops or none, old_ops or none):
                total[0] += new[0] - old[0]
                total[1] += new[1] - old[1]
                _add(tally, new[2], 1)
                _add(tally, old[2] if len(old) > 2 else {}, -1)
            chunk.stored = (size, keys, ops)

    def _unchanged(self, chunk: Chunk, changes: list) -> bool:
        """Whether a decoded chunk is as the store holds it, but for its CTI: it has a base and
        its operators track their changes and changed no key in this call (with no key TTL,
        whose clocks are not tracked a call). Such a chunk is not written: its stored CTI stays
        behind, as an untouched chunk's does, and the next call that decodes it advances it
        first (its operators' state is the same at either CTI, for nothing of it was due)."""
        return (chunk.log is not None and chunk.base[0] > 0 and self.ttl is None
                and all(changed is not None and not changed for changed in changes))

    def _write(self, c: int, chunk: Chunk, changes: list, op_keys: list[int], keys: int) -> tuple[int, tuple]:
        """Chunk ``c`` into the store: the next frame of its delta (the keys this commit changed),
        or whole (no base yet, an operator without deltas, a split, :data:`MAX_FRAMES` frames, or
        the frames past ``delta_share`` of the base's bytes); → its bytes in the store and per
        operator (bytes, keys, tallies)."""
        tallies = [op.tallies() for op in chunk.ops]
        log = chunk.log
        if (log is not None and None not in changes and self.delta_share and c < FRAME_STRIDE
                and len(log.frames) < MAX_FRAMES):
            base_bytes, base_ops = chunk.base
            limit = self.delta_share * base_bytes * _spread(c, base_bytes)
            share = _share(base_bytes, base_ops, changes, op_keys, len(chunk.seen_since))
            if _pays(limit, base_bytes, share, changes, len(chunk.seen_since), keys, log, self.frame_ratio):
                snaps, dropped = map(list, zip(*[op.delta(s) for op, s in zip(chunk.ops, changes)]))
                seen = {k: chunk.last_seen.get(k) for k in chunk.seen_since}
                named = sum(map(len, changes)) + len(seen)
                blob = compressed(pickle.dumps(("delta", DELTA_FORMAT, chunk.cti, dropped, snaps, seen, keys,
                                                op_keys, tallies, named), protocol=5))
                if len(blob) > 2 * FRAME_FIXED and share:  # (fewer bytes: mostly the fixed ones)
                    self.frame_ratio = min((len(blob) - FRAME_FIXED) / share, FRAME_RATIO_MOST)
                if log.bytes + len(blob) <= limit:
                    self.store[frame_entry(c, len(log.frames))] = blob
                    chunk.log = log = log.add(len(blob), named, map(len, snaps))
                    self.deltas[c] = log.frames
                    self.counters.state_written += len(blob)
                    self.counters.chunk_deltas += 1
                    chunk.seen_since = set()
                    return base_bytes + log.bytes, tuple((b + d, k, t) for b, d, k, t in
                                                         zip(base_ops, log.op_bytes, op_keys, tallies))
        snaps = [op.snapshot() for op in chunk.ops]
        blob = compressed(pickle.dumps(("chunk", CHUNK_FORMAT, chunk.cti, snaps, chunk.last_seen,
                                        keys, op_keys, tallies), protocol=5))
        self.store[c] = blob
        self._drop_delta(c)
        self.counters.state_written += len(blob)
        chunk.base = (len(blob), tuple(map(len, snaps)))
        chunk.log = None if None in changes else Log.empty(len(changes))
        chunk.seen_since = set()
        return len(blob), tuple((len(b), k, t) for b, k, t in zip(snaps, op_keys, tallies))

    def _drop_delta(self, c: int) -> None:
        """Chunk ``c``'s frames out of the store (a state call each: a chunk written whole has
        no delta left behind)."""
        for n in range(len(self.deltas.pop(c, ()))):
            del self.store[frame_entry(c, n)]

    @staticmethod
    def _key_counts(chunk: Chunk) -> tuple[list[int], int]:
        """Each operator's keys in ``chunk``, and the chunk's distinct keys (with the TTL's): the
        operators' :meth:`~ctiflow.operators.operator.Operator.key_count` when one operator is
        all the chunk holds (no key sets built: with sparse keys every chunk is touched every
        batch), else the union of their key sets."""
        if len(chunk.ops) == 1 and not chunk.last_seen:
            n = chunk.ops[0].key_count()
            return [n], n
        sets = [op.live_keys() for op in chunk.ops]
        return list(map(len, sets)), len(set(chunk.last_seen).union(*sets))

    def process(self, i: int, cols, of: list[int]) -> list[tuple[int, Any]]:
        """Operator ``i`` of each chunk takes its rows of ``cols`` (``of``: each row's chunk) in
        one ``process_columns`` call; → the results by row (release order)."""
        if self.count == 1:
            parts = [(of[0], None)]
        else:
            chunk_of = np.array(of)
            order = np.argsort(chunk_of, kind="stable")
            cut = np.flatnonzero(np.diff(chunk_of[order])) + 1
            parts = [(int(chunk_of[idx[0]]), idx) for idx in np.split(order, cut)]
            if len(parts) == 1:
                parts = [(parts[0][0], None)]
        results: list[tuple[int, Any]] = []
        for c, index in parts:
            got = self.loaded[c].ops[i].process_columns(cols if index is None else cols.take(index))
            results.extend(got if index is None else ((int(index[j]), r) for j, r in got))
        if len(parts) > 1:
            results.sort(key=_FIRST)
        return results

    def advanced(self, touch: list[int], keys: list[str], starts, of: list[int], cti: int) -> int:
        """The chunks ``touch`` were advanced to ``cti`` (``keys``, ``starts``, ``of``: the
        call's events, their starts and chunks); the key TTL: a key is forgotten by every
        operator (``forget_keys``) once the application time the CTI makes final (``cti − 1``)
        is ``ttl`` past its latest event — in application time, so a replay expires the same
        keys; at the final CTI everything is flushed anyway. → the keys expired."""
        ttl, expired_keys = self.ttl, 0
        seen_now: dict[int, list[tuple[str, int]]] = {}
        if ttl is not None and keys:
            for key, start, c in zip(keys, starts.tolist(), of):
                seen_now.setdefault(c, []).append((key, start))
        for c in touch:
            chunk = self.loaded[c]
            chunk.cti = cti
            if ttl is None:
                continue
            seen, seen_since = chunk.last_seen, chunk.seen_since
            for key, start in seen_now.get(c, ()):
                if start > seen.get(key, start - 1):
                    seen[key] = start
                    seen_since.add(key)
            if cti >= CTI_INFINITY:
                seen_since.update(seen)
                seen.clear()
                continue
            expired = [key for key, last in seen.items() if last < cti - ttl]
            seen_since.update(expired)
            for key in expired:
                del seen[key]
            if expired:
                for op in chunk.ops:
                    op.forget_keys(expired)
            expired_keys += len(expired)
        return expired_keys

    def still_warm(self) -> dict[int, Chunk]:
        """After :meth:`commit`: every decoded chunk that equals its bytes in the store — the
        chunks of ``warm`` this call did not use, then the chunks it committed (emptied chunks,
        removed from the store, are left out), least recently used first."""
        current = dict(self.warm)
        current.update((c, chunk) for c, chunk in self.loaded.items() if chunk.stored[1])
        return current


def _share(base_bytes: int, base_ops: tuple, changes: list[set], op_keys: list[int], seen: int) -> float:
    """The base's bytes that the keys in ``changes`` hold (each operator's snapshot bytes × its
    share of keys changed, as a share of the base's compressed bytes), grown by the ``seen`` keys
    whose TTL clocks a frame carries too (as many more keys changed)."""
    whole = sum(base_ops) or 1
    changed = sum(map(len, changes))
    held = base_bytes * sum(b * len(s) / max(n, 1) for b, s, n in zip(base_ops, changes, op_keys)) / whole
    return held * (changed + seen) / changed if changed else 0.0


def _pays(limit: float, base_bytes: int, share: float, changes: list[set], seen: int, keys: int, log: Log,
          ratio: float) -> bool:
    """Whether a frame is worth building: the base is at least :data:`DELTA_FROM` bytes, and the
    delta's bytes with the frame stay within ``limit`` — the frame's estimated from the chunk's
    frames when it has some (their bytes a key), else :data:`FRAME_FIXED` + ``ratio`` × the base's
    bytes its keys hold (``share``, :func:`_share`; ``ratio``: as the state's last frame had it);
    never a frame of as many keys as the chunk (e.g. after the TTL dropped most). A frame past the
    limit is built for nothing (a snapshot of its keys per operator, a pickle and a compression,
    then thrown away)."""
    changed = sum(map(len, changes)) + seen
    if base_bytes < DELTA_FROM or changed > keys:
        return False
    if log.keys:
        return log.bytes * (1 + changed / log.keys) <= limit
    return log.bytes + FRAME_FIXED + ratio * share <= limit


def _spread(c: int, base_bytes: int) -> float:
    """A factor in [0.5, 1.5) of chunk ``c``'s compaction threshold, fixed by its number and its
    base's size (so a replay compacts alike): with sparse keys every chunk's delta grows alike, and
    without it they would all be written whole in the same micro-batch (a latency spike)."""
    return 0.5 + ((c * 2654435761 + base_bytes * 40503) % 1024) / 1024


def _add(total: dict[str, int], more: dict[str, int], sign: int) -> None:
    """``total += sign × more``, names whose total is 0 dropped."""
    for name, n in more.items():
        left = total.get(name, 0) + sign * n
        if left:
            total[name] = left
        else:
            total.pop(name, None)
