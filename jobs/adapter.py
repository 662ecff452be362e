"""The one generic Spark adapter: any pure operator inside ``transformWithStateInPandas``.

Why it is fast enough: rows are grouped by **key group** (``crc32(key) mod G``, computed in the
source and carried as a label that Spark's partitioner spreads evenly, see
:func:`jobs.pipeline.group_labels`), not by entity key. Spark calls the processor once per group per micro-batch with all
of the group's rows. The spike measured that per-key state calls, not RocksDB, dominate a keyed
Python operator, so state is stored per group, not per key: the group-wide part (time layer,
reorder buffer, CTI clocks, reference join, chunk index) is one value (the "header"; a large
one in parts: :meth:`OperatorProcessor._store`), and the operators' keyed state is in chunks of
about ``state.chunk_keys`` keys, of which a batch reads and writes only those it touches
(:class:`jobs.runtime.GroupRuntime`); both live in the group's one ``MapState``
(:class:`GroupState`). Chunks this worker committed and still holds decoded are used without a
read (:class:`WarmChunks`).

**Packed rows.** Spark's per-row costs (shuffle, Arrow to and from the Python worker, the
sink's hand-off) are paid per *row*, ours per event; so the source ships one row per key group
of each Kafka fetch (``meta_pack``: the group's decoded, validated records as Arrow columns)
plus one row per failed record, and the adapter answers with one row per result topic
(``kind = "pack"``: ``(key, value, role)`` columns, Avro-encoded, ≤ :data:`PACK_SIZE`), which
the sink unpacks. A micro-batch of 100k events is a few dozen rows for Spark. The rows and
the packs' layout: :mod:`jobs.rows`.

Contract (PySpark's ``StatefulProcessor``): the processor object is pickled on the driver and
``init`` runs on an executor's Python worker, so it holds only the picklable :class:`Plan`; all
operators are built in the worker. Records passed on unchanged keep their Avro bytes.

**CTIs** are ours, not Spark's watermark (one global ``max − delay`` that declares a slower
partition's in-order events late): every key group gets, each micro-batch, a frontier row per
offset range read and a control row per stream (:mod:`jobs.source`), so every group computes
the same per-partition CTI (:meth:`GroupRuntime.next_cti`) and keeps it in its state — in the
checkpoint, so a replayed batch sees the same CTI. A micro-batch's events are checked against
the CTI the previous batch ended with; the batch then ends by advancing to its own CTI (or to
+∞ once every stream of a bounded input has ended). No timers: the control rows call every
group every batch.
"""

from __future__ import annotations

import os
import struct
import time
from collections import OrderedDict
from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from jobs import rows
from jobs.alloc import cyclic_gc_paused
from jobs.avro_encode import ResultEncoder
from jobs.checkpoint import STATE_LAYOUT
from jobs.rows import INPUT_COLUMNS, OUTPUT_SCHEMA, PACK_SIZE  # noqa: F401 - re-exported (the wire format's)
from jobs.runtime import Counters, GroupRuntime, Plan, register_schemas
from jobs.serde import AvroSerializer, registry_client

_STATE = StructType([StructField("blob", BinaryType())])
_CHUNK = StructType([StructField("chunk", IntegerType())])


class ChunkStore:
    """A key group's state chunks in Spark's state store (``MapState``: chunk number ≥ 0 →
    bytes), shaped like the dict :class:`~jobs.runtime.GroupRuntime` keeps them in elsewhere. One
    state call per chunk read or written; chunks nobody asks for are never read; entries under
    negative numbers are not chunks (:class:`GroupState`)."""

    def __init__(self, state):
        self.state = state

    def get(self, chunk: int) -> bytes | None:
        row = self.state.getValue((chunk,))
        return None if row is None else row[0]

    def __setitem__(self, chunk: int, blob: bytes) -> None:
        self.state.updateValue((chunk,), (blob,))

    def __delitem__(self, chunk: int) -> None:
        self.state.removeKey((chunk,))

    def items(self):
        return ((k[0], v[0]) for k, v in self.state.iterator() if k[0] >= 0)


class GroupState:
    """A key group's state in Spark's state store, layout 3 (:data:`jobs.checkpoint.STATE_LAYOUT`):
    one ``MapState`` ("state") holds the chunks under their numbers (:class:`ChunkStore`), the
    header's stored value under :data:`HEADER` and, when that value is
    :data:`HEADER_IN_PARTS` + the count (uint32, little-endian), the header's parts under
    ``HEADER − 1``, ``HEADER − 2``, ….

    One state variable, not three: Spark's state server registers every state variable in every
    task of every micro-batch (codegen'd encoders, a column family lookup) — measured ≈ 15 ms of
    a key group's call a micro-batch for the two this layout drops (docs/performance.md, "One
    state variable and no process starts")."""

    HEADER = -1
    NAME = "state"

    def __init__(self, handle: StatefulProcessorHandle):
        self.map = handle.getMapState(self.NAME, _CHUNK, _STATE)
        self.chunks = ChunkStore(self.map)

    def read(self) -> tuple[bytes | None, bytes | None]:
        """→ (the header's stored value, the stored header: its parts joined when in parts)."""
        row = self.map.getValue((self.HEADER,))
        stored = None if row is None else row[0]
        count = self._parts(stored)
        if not count:
            return stored, stored
        return stored, b"".join(self.map.getValue((self.HEADER - 1 - i,))[0] for i in range(count))

    def write(self, stored: bytes | None, header: bytes, seal) -> None:
        """Store ``header`` (whole, or in parts of :data:`jobs.rows.PACK_BYTES`; parts of a
        larger earlier header are removed) and ``seal(value)`` as the header's value."""
        size = rows.PACK_BYTES
        count = 0
        if len(header) > size:
            for count, at in enumerate(range(0, len(header), size), 1):
                self.map.updateValue((self.HEADER - count,), (header[at:at + size],))
            header = HEADER_IN_PARTS + _COUNT.pack(count)
        for stale in range(count, self._parts(stored)):
            self.map.removeKey((self.HEADER - 1 - stale,))
        self.map.updateValue((self.HEADER,), (seal(header),))

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

    def __init__(self, handle: StatefulProcessorHandle):
        self.value = handle.getValueState("header", _STATE)
        self.parts = handle.getListState("header_parts", _STATE)
        self.chunks = ChunkStore(handle.getMapState("chunks", _CHUNK, _STATE))

    def read(self) -> tuple[bytes | None, bytes | None]:
        """(:meth:`GroupState.read`)"""
        row = self.value.get()  # None before the group's first batch (one state call, not two)
        stored = None if row is None else row[0]
        if stored is not None and stored.startswith(HEADER_IN_PARTS):
            return stored, b"".join(part for (part,) in self.parts.get())
        return stored, stored

    def write(self, stored: bytes | None, header: bytes, seal) -> None:
        """(:meth:`GroupState.write`)"""
        size = rows.PACK_BYTES
        if len(header) > size:
            self.parts.put([(header[at:at + size],) for at in range(0, len(header), size)])
            header = HEADER_IN_PARTS
        elif stored is not None and stored.startswith(HEADER_IN_PARTS):
            self.parts.clear()
        self.value.update((seal(header),))


#: the state layouts this version reads (:data:`jobs.checkpoint.STATE_LAYOUT` is the one it writes)
GROUP_STATES = {2: LegacyGroupState, 3: GroupState}


class WarmChunks:
    """Decoded state chunks kept in this Python worker between micro-batches, each entry proven
    current by the header it was committed with.

    Why by hand: no library caches objects against the version of Spark's state store. Every
    commit appends a fresh random token to the header (:data:`TOKEN_BYTES`; ``pickle`` ignores
    bytes after its stop opcode, so the header still loads as before); the chunks the call left
    decoded are filed under that token. A later call whose header ends with the same token reads
    the very state this worker committed — the store's chunks are those decoded objects' bytes —
    so it uses them instead of reading and decoding them. Any other header (a replayed batch
    restores the previous version; another worker ran the group since; another query) matches no
    entry. An entry is taken out when used: a call that fails after mutating chunks leaves
    nothing behind, and its retry reads the store. At most ``limit`` chunks are kept in the
    process, least recently used go first: memory follows the limit, not the live keys."""

    TOKEN_BYTES = 16

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, dict] = OrderedDict()

    def take(self, header: bytes | None) -> dict:
        """The decoded chunks committed with ``header`` (an empty dict if none are)."""
        if header is None or len(header) <= self.TOKEN_BYTES:
            return {}
        return self.entries.pop(header[-self.TOKEN_BYTES:], {})

    def put(self, header: bytes, chunks: dict, limit: int) -> bytes:
        """File ``chunks`` (least recently used first) under a new token; → the header to store."""
        token = os.urandom(self.TOKEN_BYTES)
        if limit > 0 and chunks:
            while len(chunks) > limit:
                del chunks[next(iter(chunks))]
            self.entries[token] = chunks
            total = sum(len(c) for c in self.entries.values())
            while total > limit:
                _, oldest = self.entries.popitem(last=False)
                total -= len(oldest)
        return header + token


#: this worker's (one per Python process; Spark reuses workers across micro-batches)
_WARM = WarmChunks()
#: the header value when the header is stored in parts (:class:`GroupState`; a pickled or
#: compressed header never starts with this); the token follows, as after any header
HEADER_IN_PARTS = b"ctiflow:header-in-parts"
_COUNT = struct.Struct("<I")
#: a compressed header starts with this, then its size and the zstd frame's (little-endian
#: uint64 each), then the frame (the token follows, as after any header)
HEADER_ZSTD = b"ctiflow:zstd"
_SIZES = struct.Struct("<QQ")
#: zstd level 3: a bins header (the reorder buffer: pickled NumPy columns and strings) shrinks
#: 5-7x in a few ms a MB; every byte not stored is not copied by the state server, the state
#: store's write batch, its changelog and memtable (measured: "After the compressed header",
#: docs/performance.md)
_ZSTD = pa.Codec("zstd", compression_level=3)


def compressed(header: bytes) -> bytes:
    """``header`` as the state store holds it: :data:`HEADER_ZSTD`, the sizes, a zstd frame."""
    frame = _ZSTD.compress(header, asbytes=True)
    return HEADER_ZSTD + _SIZES.pack(len(header), len(frame)) + frame


def expanded(stored: bytes | None) -> bytes | None:
    """The header of a stored value (:func:`compressed`, or a pickled header as written before
    2026-11-26, returned as it is); bytes after the frame (the token) are ignored."""
    if stored is None or not stored.startswith(HEADER_ZSTD):
        return stored
    at = len(HEADER_ZSTD) + _SIZES.size
    size, length = _SIZES.unpack_from(stored, len(HEADER_ZSTD))
    return _ZSTD.decompress(memoryview(stored)[at:at + length], decompressed_size=size, asbytes=True)


def _field_decoder(options: dict[str, str]):
    """``list of Avro bytes → field columns`` (an Arrow table) with the source's own decoder,
    built on first use (:class:`jobs.rows.BytesFields`)."""
    decoder = None

    def decode(values: list) -> "pa.Table":
        nonlocal decoder
        if decoder is None:
            from jobs.source import RecordDecoder

            decoder = RecordDecoder(options, None)
        got = decoder.decoded(values)
        if got.errors:
            raise RuntimeError(f"records the source decoded fail to decode again: {list(got.errors.values())[:3]} "
                               "(a bug in ctiflow)")
        return got.fields

    return decode


class OperatorProcessor(StatefulProcessor):
    def __init__(self, plan: Plan, topics: dict[str, str], framing: str, registry: dict | None,
                 sources: dict[str, dict[str, str]] | None = None, state_layout: int = STATE_LAYOUT):
        if state_layout not in GROUP_STATES:
            raise ValueError(f"state layout {state_layout}: this ctiflow reads {sorted(GROUP_STATES)}")
        self.plan = plan
        self.state_layout = state_layout     # the checkpoint's (jobs.checkpoint.state_layout)
        self.topic_schemas = topics          # topic → schema name
        self.framing = framing
        self.registry = registry
        self.sources = sources or {}         # stream → its source's options (jobs.source.SourceOptions)

    # -- lifecycle -------------------------------------------------------------------
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.group = GROUP_STATES[self.state_layout](handle)
        reg = registry_client(self.registry["url"], self.registry.get("config")) if self.registry else None
        register_schemas(self.plan.schemas)  # an executor's store has only the files: add the derived ones
        self.encoders = {topic: AvroSerializer(schema, framing=self.framing, registry=reg,
                                               subject=f"{topic}-value", validate=False)
                         for topic, schema in self.topic_schemas.items()}
        self.results = ResultEncoder(self.encoders, self.plan.late_topic, self.plan.dead_letter_topic)
        for stream, options in self.sources.items():  # packs that carry only bytes decode with these
            rows.FIELD_DECODERS[stream] = _field_decoder(options)

    def close(self) -> None:
        pass

    # -- the two entry points --------------------------------------------------------
    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        try:
            with cyclic_gc_paused():  # (see jobs.alloc) the batch's output is one small frame
                out = list(self._batch(rows))
            yield from out
        except Exception as exc:
            # A bug (data faults were dead-lettered already): the micro-batch fails, and says where.
            exc.add_note(f"ctiflow: key group {key[0]!r} failed on a bug, not on bad data (bad data is "
                         "dead-lettered); the micro-batch is replayed from the checkpoint once it is fixed")
            raise

    def _batch(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """Load the group's state → :meth:`GroupRuntime.run_batch` → store it → encode."""
        frames = list(frames)  # (Spark's Arrow batches arrive as this is iterated)
        started = time.perf_counter()
        stored, runtime = self._load()
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        got = runtime.run_batch(rows.read_input(frame))
        self._store(stored, runtime)
        yield from self._encode(got.outputs, got.dead, got.counters, started)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        return iter(())  # no timers: every group gets control rows every micro-batch

    # -- internals -------------------------------------------------------------------
    def _load(self) -> tuple[bytes | None, GroupRuntime]:
        """→ the stored header value and the group's runtime, from the header's bytes
        (:meth:`GroupState.read`)."""
        stored, header = self.group.read()  # (None, None) before the group's first batch
        started = time.perf_counter()
        header = expanded(header)
        expanding = time.perf_counter() - started
        runtime = GroupRuntime(self.plan, header=header, chunks=self.group.chunks, warm=_WARM.take(stored), batched=True)
        runtime.counters.state_us += int(expanding * 1e6)
        return stored, runtime

    def _store(self, stored: bytes | None, runtime: GroupRuntime) -> None:
        """Commit ``runtime``; the header is stored :func:`compressed`. One of more than
        :data:`jobs.rows.PACK_BYTES` (a long reorder buffer) is stored in parts of that size
        (:meth:`GroupState.write`): one large value is several G1 "humongous" copies in the state
        server's JVM each write and read (measured under "Memory", docs/performance.md)."""
        raw = runtime.commit()
        started = time.perf_counter()
        header = compressed(raw)
        counters = runtime.counters  # what the store holds: the compressed header
        counters.state_us += int((time.perf_counter() - started) * 1e6)
        counters.state_written += len(header) - len(raw)
        counters.state_bytes += len(header) - len(raw)
        warm = runtime.still_warm()
        self.group.write(stored, header, lambda value: _WARM.put(value, warm, self.plan.cache_chunks))

    def _encode(self, out: list, dead: list, counters: Counters, started: float | None = None) -> Iterator[pd.DataFrame]:
        """Result records, Avro-encoded (:class:`jobs.avro_encode.ResultEncoder`) and packed per
        topic (:func:`jobs.rows.output_frame`, ≤ :data:`~jobs.rows.PACK_SIZE` each) in output
        order, then one metrics row: like the input, few rows for Spark to move. ``started``: the
        call's ``perf_counter`` at its start (→ ``python_us``)."""
        packs = self.results.packs(out, dead, counters)
        if started is not None:
            counters.python_us = int((time.perf_counter() - started) * 1e6)
        yield rows.output_frame(packs.order, counters.metrics())
