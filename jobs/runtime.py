"""What one key group runs, independent of Spark: time layer → [reference join] → operators.

The Spark adapter (:mod:`jobs.adapter`) restores a :class:`GroupRuntime` from the state store
(its header; keyed state chunks are read as the batch needs them), feeds it a micro-batch's
rows, advances it to the CTI, commits the chunks it touched and the header back, and encodes its
outputs. Keeping this pure lets the tests drive exactly what runs in Spark.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import pickle
import time
import zlib
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from jobs import rows
from jobs.config import JobConfig, State
from jobs.counters import key
from jobs.fields import check_fields
from jobs.recognize import derived_schemas, operator_of
from jobs.serde import default_store
from jobs.state.parts import StoredParts, is_chunk
from operators.columns import ColumnBuffer, ColumnTimeLayer, EventColumns, legacy_buffer, merged_events
from operators.errors import EventRejected, StateError
from operators.events import OutputBatch
from operators.operator import Output
from operators.passthrough import Passthrough  # noqa: F401 - re-exported (the identity operator)
from operators.reference import ReferenceJoin, ReferenceJoinSettings, enriched_event
from operators.time import (CTI_INFINITY, CTI_NONE, REASON_ADJUSTED, AdvanceTimeSettings, Event, PartitionCtis,
                            ViolationPolicy, combined_cti)


@dataclass(frozen=True)
class OperatorSpec:
    """A configured operator: how to build/restore it and where each output role goes."""

    name: str
    cls: type
    settings: Any
    topics: dict[str, str]  # role → topic

    def build(self, data: bytes | None = None):
        return self.cls(self.settings) if data is None else self.cls.restore(self.settings, data)


@dataclass(frozen=True)
class Plan:
    """Everything a group needs, derived once from the job configuration (picklable)."""

    streams: dict[str, AdvanceTimeSettings]
    fast: str
    reference: Any  # ReferenceJoinSettings | None
    operators: tuple[OperatorSpec, ...]
    late_topic: str
    dead_letter_topic: str
    enriched_topic: str | None = None
    #: The streams whose CTIs make the job's CTI (combined by min): the fast stream only with
    #: ``sync: import`` (the reference stream follows it), every stream otherwise.
    cti_streams: tuple[str, ...] = ()
    #: Each stream's ``cti.delay`` (ms): a partition's CTI is its largest start − delay.
    delays: dict[str, int] = field(default_factory=dict)
    #: stream → its Kafka topic (dead letters name the topic, whichever stage refused the record)
    topics: dict[str, str] = field(default_factory=dict)
    #: ``state.ttl`` (ms): a key's state goes once the CTI is this far past its latest event
    ttl: int | None = None
    #: ``spark.key_groups`` (the group is ``crc32(key) mod key_groups``) and ``state.chunk_keys``:
    #: each group's keyed state is kept in chunks of about that many keys
    key_groups: int = 1
    chunk_keys: int = State.model_fields["chunk_keys"].default
    #: ``state.cache_chunks``: decoded chunks a Python worker keeps between micro-batches
    cache_chunks: int = State.model_fields["cache_chunks"].default
    #: False when an operator must see every key in one state (a global count): one chunk
    chunked: bool = True
    #: record schemas the operators derive (name → Avro JSON): every process that encodes or
    #: decodes their topics adds them to its schema store (:func:`register_schemas`)
    schemas: dict[str, str] = field(default_factory=dict)

    @property
    def handles_adjust(self) -> bool:
        return all(op.cls.handles_adjust for op in self.operators)

    @property
    def fields_read(self) -> tuple[str, ...] | None:
        """The only record fields the operators read of an event on their common path (their
        classes' ``fields_read(settings)``); None when one may read any (it has no such method)."""
        names: list[str] = []
        for op in self.operators:
            got = op.cls.fields_read(op.settings)
            if got is None:
                return None
            names.extend(n for n in got if n not in names)
        return tuple(names)

    def needs_records(self, cols: EventColumns) -> bool:
        """Whether an operator may read all fields of a row of ``cols`` (its ``needs_records``:
        a refusal, a late record)."""
        return any(op.cls.needs_records(op.settings, cols) for op in self.operators)



def _time_settings(src) -> AdvanceTimeSettings:
    # In Spark the CTIs come from the watermark (jobs.adapter), so no generation here.
    return AdvanceTimeSettings(delay=src.cti.delay, frequency=None, flush_at_end=src.cti.flush_at_end,
                               policy=ViolationPolicy(src.cti.policy))


def operator_spec(op, cfg: JobConfig) -> OperatorSpec:
    """The pure operator behind one configured operator (the config class builds it)."""
    cls, settings = operator_of(op, cfg)
    return OperatorSpec(op.name, cls, settings, op.roles())


def plan(cfg: JobConfig) -> Plan:
    streams = {s.name: _time_settings(s) for s in cfg.sources}
    reference = None
    fast = cfg.sources[0].name
    if cfg.reference is not None:
        fast = cfg.reference.fast
        reference = ReferenceJoinSettings(fast_stream=fast, reference_stream=cfg.reference.source,
                                          missing=cfg.reference.missing, sync=cfg.reference.sync)
        streams = reference.time_settings(streams[fast], streams[cfg.reference.source])
    check_fields(cfg, f"job {cfg.job!r}")  # unknown schemas and fields fail here, before Spark starts
    schemas = derived_schemas(cfg)
    register_schemas(schemas)
    cti_streams = (fast,) if cfg.reference is not None and cfg.reference.sync == "import" else tuple(streams)
    return Plan(streams=streams, fast=fast, reference=reference,
                operators=tuple(operator_spec(op, cfg) for op in cfg.operators),
                late_topic=cfg.late_topic, dead_letter_topic=cfg.dead_letter_topic,
                enriched_topic=cfg.reference.output if cfg.reference else None,
                cti_streams=cti_streams, delays={s.name: s.cti.delay for s in cfg.sources},
                topics={s.name: s.topic for s in cfg.sources}, ttl=cfg.state.ttl,
                key_groups=cfg.key_groups, chunk_keys=cfg.state.chunk_keys, cache_chunks=cfg.state.cache_chunks,
                chunked=not any(op.needs_every_key for op in cfg.operators), schemas=schemas)


def register_schemas(schemas: dict[str, str]) -> None:
    """Add derived record schemas (name → Avro JSON) to this process's schema store."""
    store = default_store()
    for name, text in schemas.items():
        store.add(name, text)


def operator_dead_letter(e: Event, operator: str, exc: Exception, topic: str) -> dict:
    """An event an operator refused: its fields as JSON (the Avro bytes are not kept past the source)."""
    return rows.dead_letter(topic, e.partition, e.offset, e.key.encode(), json.dumps(e.fields, default=str).encode(),
                            f"operator {operator}: {exc}", stage="operator")


def enriched_record(r: dict) -> dict:
    """The join's output in the shape of ``schemas/enriched.avsc`` (nested records as JSON)."""
    return {"key": r["key"], "time": r["time"], "event_json": json.dumps(r["event"], default=str),
            "reference_json": None if r["reference"] is None else json.dumps(r["reference"], default=str),
            "reference_valid_from": r["reference_valid_from"], "reference_missing": r["reference_missing"]}


@dataclass
class Counters:
    """What one key group did in one call; the sink sums them per micro-batch (progress file).
    Every field is a counter of :data:`jobs.counters.TABLE` (a test keeps them the same).

    Balance, for every stream together: ``received = released + late + dead_letter + buffered``
    (``buffered``: admitted, waiting for a CTI; 0 after the final CTI)."""

    received: int = 0
    released: int = 0
    late: int = 0
    late_records: int = 0
    dead_letter: int = 0
    refused: int = 0
    outputs: int = 0
    expired_keys: int = 0
    cti: int = CTI_NONE     # after the call
    state_bytes: int = 0    # after the call (committed)
    live_keys: int = 0      # after the call
    state_written: int = 0
    chunks_loaded: int = 0
    chunks_cached: int = 0
    state_us: int = 0
    python_us: int = 0
    by_partition: dict = field(default_factory=dict)  # (stream, partition) → [received, late]
    #: gauges after the call: (stream, partition) → (its CTI: frontier − delay, idle 0/1); operator → (bytes, keys)
    partitions: dict = field(default_factory=dict)
    ops: dict = field(default_factory=dict)

    def count(self, stream: str, partition: int, late: bool) -> None:
        slot = self.by_partition.get((stream, partition))  # per event: no string built here
        if slot is None:
            slot = self.by_partition[(stream, partition)] = [0, 0]
        slot[0] += 1
        slot[1] += late

    def metrics(self) -> dict[str, int]:
        """Flat ``name → int`` (:mod:`jobs.counters`: what the sink adds up)."""
        out = {k: v for k, v in vars(self).items() if k not in ("by_partition", "partitions", "ops")}
        for (stream, partition), (received, late) in self.by_partition.items():
            out[key("received", stream, partition)] = received
            out[key("late", stream, partition)] = late
        for (stream, partition), (cti, idle) in self.partitions.items():
            out[key("cti", stream, partition)] = cti
            out[key("idle", stream, partition)] = idle
        for name, (size, keys) in self.ops.items():
            out[key("state_bytes", name)] = size
            out[key("live_keys", name)] = keys
        return out


@dataclass
class BatchResult:
    """What :meth:`GroupRuntime.run_batch` produced: result records ``(topic, Output |
    OutputBatch, Kafka key)`` in output order, the dead letters of undecodable input records,
    and the group's counters (``state_*`` complete once the runtime is committed)."""

    outputs: list
    dead: list[dict]
    counters: Counters


_STATE_FIX = ("the checkpoint was written by another version or configuration of this job, or is damaged; "
              "run the job with a new spark.checkpoint (it reprocesses its topics from startingOffsets), "
              "or run the ctiflow version and job file that wrote it")


@contextlib.contextmanager
def _restoring(what: str):
    """A snapshot that does not restore is a :class:`StateError` naming its owner and the fix."""
    try:
        yield
    except StateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to rebuild state from bytes means the same
        raise StateError(f"{what}: its state in the checkpoint does not restore ({type(exc).__name__}: {exc}); "
                         f"{_STATE_FIX}") from exc


_FIRST = itemgetter(0)
_STREAM = attrgetter("stream")

#: Snapshot layout (``GroupRuntime.snapshot``); bumped when the layout changes.
_LAYOUT = 2


def chunk_hash(key: str, groups: int) -> int:
    """What addresses ``key``'s chunk within its key group: ``crc32(key) mod groups`` picks the
    group, the quotient the chunk (:meth:`GroupRuntime.address`)."""
    return zlib.crc32(key.encode()) // groups


class Chunk:
    """The operators' state of the keys of one chunk of a key group (and their key-TTL clocks).

    ``cti`` is the CTI its operators were last advanced to: a chunk nothing was due in is left
    as bytes for as many micro-batches as it stays so, and is caught up (``advance_to`` the CTI
    the group's operators are at) before it next sees events. ``stored``: its size in the store
    when it was read, ``(bytes, keys, per operator (bytes, keys))`` (the header keeps the totals;
    the operators' part is ``()`` for a chunk not stored yet)."""

    __slots__ = ("ops", "last_seen", "cti", "stored")

    def __init__(self, ops: list, last_seen: dict[str, int], cti: int, stored: tuple = (0, 0, ())):
        self.ops = ops
        self.last_seen = last_seen
        self.cti = cti
        self.stored = stored

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


class GroupRuntime:
    """The state of one key group: a time layer, an optional reference join and the operators.

    **State layout.** The group-wide part — time layer and reorder buffer, per-partition CTI
    clocks, the reference join, the due CTI of each chunk that has one, the chunk count and the
    totals — is the *header* (:meth:`commit` returns it; a ``ValueState`` in Spark). The
    operators' per-key state is split into chunks of about ``plan.chunk_keys`` keys, addressed by
    linear hashing of the key (:meth:`address`): when the group's keys outgrow its chunks, the
    chunks with new descendants are split (``partition`` of each operator), so a chunk never
    holds many more keys than that, however many keys are live. Each non-empty chunk is one entry
    of ``chunks`` (a ``MapState`` in Spark; a dict here), stored as the operators' own snapshots. A
    micro-batch decodes and re-encodes only the chunks it has events for, whose due CTI it
    reaches, or all of them at the final CTI: untouched keys stay bytes, so the work per batch
    follows the touched keys, not the live ones (README, "State").

    ``data``: a whole :meth:`snapshot` (tests, tools); ``header`` + ``chunks``: the Spark layout.
    ``warm``: decoded chunks known to equal their bytes in ``chunks`` (the worker's cache,
    :class:`jobs.state.warm.WarmChunks`); a chunk found there is used instead of read and decoded.
    The runtime takes them over: they are mutated by the call, and :meth:`still_warm` says which
    chunks are current after :meth:`commit`. ``batched``: records an operator returns as an
    :class:`~operators.events.OutputBatch` stay one (the job's bulk encoder takes them); else
    they come one :class:`Output` each.
    """

    def __init__(self, plan: Plan, data: bytes | None = None, *, header: bytes | None = None, chunks=None,
                 warm: dict[int, Chunk] | None = None, batched: bool = False):
        self.plan = plan
        self.batched = batched
        self.counters = Counters()
        self.chunks = {} if chunks is None else chunks
        self.loaded: dict[int, Chunk] = {}
        self.warm: dict[int, Chunk] = {} if warm is None else warm
        #: chunks split only if every operator can partition its keys by the event's key
        self.grows = plan.chunked and all(spec.cls.partitionable(spec.settings) for spec in plan.operators)
        if data is not None:
            with _restoring("the key group's state"):
                layout, header, stored = pickle.loads(data)
                if layout != _LAYOUT:
                    raise StateError(f"the key group's state has layout {layout}, this ctiflow reads {_LAYOUT}: {_STATE_FIX}")
            for c, blob in stored.items():
                self.chunks[c] = blob
        if header is None:
            self.parts = StoredParts(self.chunks)
            self.layer = self._new_layer()
            self.join = self._new_join()
            self.enriched = ColumnBuffer(plan.fast, ViolationPolicy.DROP) if plan.reference else None
            self.ended: set[str] = set()
            self.clocks = {name: PartitionCtis(plan.delays.get(name, 0)) for name in plan.streams}
            self.ops_cti = CTI_NONE   # the CTI every chunk's operators are at (or will be caught up to)
            self.due: dict[int, int] = {}  # chunk → its due CTI (chunks that have one)
            self.level, self.split = 0, 0  # linear hashing: 2**level + split chunks
            self.stored_keys = self.stored_bytes = 0  # totals over the stored chunks
            self.op_totals = [[0, 0] for _ in plan.operators]  # per operator: [bytes, keys] over the stored chunks
            return
        started = time.perf_counter()
        with _restoring("the key group's time layer"):
            (layer, join, enriched, self.ended, clocks, self.ops_cti, self.due, (self.level, self.split),
             (self.stored_keys, self.stored_bytes, *op_totals), operators) = pickle.loads(header)
            self.op_totals = op_totals[0] if op_totals else [[0, 0] for _ in plan.operators]
            self.clocks = {name: PartitionCtis.restore(c) for name, c in clocks.items()}
            if isinstance(layer, bytes):  # before 2026-11-27: the buffer's rows in the header
                self.parts = StoredParts(self.chunks)
            else:
                layer, sizes = layer
                self.parts = StoredParts(self.chunks, sizes)
            self.layer = self._new_layer(layer)
        if operators != self._operator_names():
            raise StateError(f"the checkpoint holds the state of operators {operators}, the job configures "
                             f"{self._operator_names()}: {_STATE_FIX}")
        with _restoring("the reference join"):
            self.join = None if join is None else ReferenceJoin.restore(plan.reference, join)
            self.enriched = None if enriched is None else _enriched_buffer(plan.fast, enriched)
        self.counters.state_us += int((time.perf_counter() - started) * 1e6)

    def _new_layer(self, data: bytes | None = None) -> ColumnTimeLayer:
        """The time layer; without a join, its buffer keeps only the fields the operators read
        (the join reads and passes on every field)."""
        plan = self.plan
        keep = plan.fields_read if plan.reference is None else None
        if data is None:
            return ColumnTimeLayer(plan.streams, plan.handles_adjust, keep, plan.needs_records, self.parts.load)
        return ColumnTimeLayer.restore(plan.streams, data, plan.handles_adjust, keep, plan.needs_records,
                                       self.parts.load)

    def _operator_names(self) -> list[tuple[str, str]]:
        return [(spec.name, spec.cls.__name__) for spec in self.plan.operators]

    # -- chunks ------------------------------------------------------------------------
    @property
    def chunk_count(self) -> int:
        return (1 << self.level) + self.split

    def address(self, key: str) -> int:
        """``key``'s chunk: linear hashing over :func:`chunk_hash` (chunks below ``split`` are
        already split at this level, so they take one more bit)."""
        h = chunk_hash(key, self.plan.key_groups)
        c = h & ((1 << self.level) - 1)
        return h & ((2 << self.level) - 1) if c < self.split else c

    def chunk(self, c: int, blob: bytes | None = None) -> Chunk:
        """Chunk ``c``, decoded from the store on first use in this call (or new and empty)."""
        got = self.loaded.get(c)
        if got is not None:
            return got
        got = self.warm.pop(c, None)
        if got is not None:
            self.loaded[c] = got
            self.counters.chunks_loaded += 1
            self.counters.chunks_cached += 1
            return got
        started = time.perf_counter()
        if blob is None and self.stored_bytes:  # none stored (e.g. stateless operators): no store read
            blob = self.chunks.get(c)
        if blob is None:
            got = Chunk([spec.build() for spec in self.plan.operators], {}, CTI_NONE)
        else:
            with _restoring(f"state chunk {c}"):
                cti, blobs, last_seen, keys, *op_keys = pickle.loads(blob)
            ops = []
            for spec, op_blob in zip(self.plan.operators, blobs):
                with _restoring(f"operator {spec.name!r} ({spec.cls.__name__})"):
                    ops.append(spec.build(op_blob))
            got = Chunk(ops, last_seen, cti,
                        (len(blob), keys, tuple(zip(map(len, blobs), op_keys[0] if op_keys else [0] * len(blobs)))))
        self.loaded[c] = got
        self.counters.chunks_loaded += 1
        self.counters.state_us += int((time.perf_counter() - started) * 1e6)
        return got

    def _grow(self) -> None:
        """Split chunks until there are at least ``live keys / chunk_keys`` of them. Linear
        hashing: going from N to N' chunks, every new chunk d descends from one existing chunk,
        whose keys are partitioned by their new address in one pass; other chunks keep theirs."""
        want = -(-self.live_keys(join=False) // self.plan.chunk_keys)
        old = self.chunk_count
        if not self.grows or want <= old:
            return
        level, split = self.level, self.split
        new_level = want.bit_length() - 1
        new_split = want - (1 << new_level)
        sources = set()
        for d in range(old, want):
            a = d & ((1 << level) - 1)
            sources.add(d & ((2 << level) - 1) if a < split else a)
        self.level, self.split = new_level, new_split
        address = self.address
        for c in sorted(sources):
            chunk = self.chunk(c)
            parts = [op.partition(address) for op in chunk.ops]
            seen: dict[int, dict[str, int]] = {}
            for key, t in chunk.last_seen.items():
                seen.setdefault(address(key), {})[key] = t
            dests = {c}.union(*parts, seen)
            for d in dests:
                ops = []
                for spec, part in zip(self.plan.operators, parts):
                    op = part.get(d)
                    if op is None:
                        op = spec.build()
                        if chunk.cti > CTI_NONE and op.advance_to(chunk.cti):
                            raise RuntimeError(f"operator {spec.name!r}: an empty operator emitted on a CTI (a bug)")
                    ops.append(op)
                self.loaded[d] = Chunk(ops, seen.get(d, {}), chunk.cti, chunk.stored if d == c else (0, 0, ()))

    def commit(self) -> bytes:
        """Split chunks if the keys outgrew them, write the chunks this call decoded back to
        ``chunks`` (empty ones are removed) and return the header. The chunks stay decoded: the
        runtime can go on."""
        self._grow()
        started = time.perf_counter()
        ttl = self.plan.ttl
        for c, chunk in sorted(self.loaded.items()):
            sets = [op.live_keys() for op in chunk.ops]
            keys = len(set(chunk.last_seen).union(*sets))
            old_bytes, old_keys, old_ops = chunk.stored
            if keys == 0:
                if old_bytes:
                    del self.chunks[c]
                self.due.pop(c, None)
                size, ops = 0, ()
            else:
                snaps = [op.snapshot() for op in chunk.ops]
                blob = pickle.dumps((chunk.cti, snaps, chunk.last_seen, keys, [len(k) for k in sets]), protocol=5)
                self.chunks[c] = blob
                size = len(blob)
                ops = tuple((len(b), len(k)) for b, k in zip(snaps, sets))
                due = chunk.due(ttl)
                if due < CTI_INFINITY:
                    self.due[c] = due
                else:
                    self.due.pop(c, None)
                self.counters.state_written += size
            self.stored_bytes += size - old_bytes
            self.stored_keys += keys - old_keys
            for total, new, old in zip(self.op_totals, ops or [(0, 0)] * len(sets), old_ops or [(0, 0)] * len(sets)):
                total[0] += new[0] - old[0]
                total[1] += new[1] - old[1]
            chunk.stored = (size, keys, ops)
        self.counters.state_written += self.parts.commit(self.layer)
        header = pickle.dumps(((self.layer.index(), self.parts.sizes), None if self.join is None else self.join.snapshot(),
                               None if self.enriched is None else _buffer_state(self.enriched), self.ended,
                               {name: c.snapshot() for name, c in self.clocks.items()}, self.ops_cti, self.due,
                               (self.level, self.split), (self.stored_keys, self.stored_bytes, self.op_totals),
                               self._operator_names()), protocol=5)
        self.counters.state_bytes = len(header) + self.stored_bytes + self.parts.bytes
        self.counters.ops = {spec.name: tuple(t) for spec, t in zip(self.plan.operators, self.op_totals)}
        self.counters.state_written += len(header)
        self.counters.state_us += int((time.perf_counter() - started) * 1e6)
        return header

    def still_warm(self) -> dict[int, Chunk]:
        """After :meth:`commit`: every decoded chunk that equals its bytes in ``chunks`` — the
        chunks of ``warm`` this call did not use, then the chunks it committed (emptied chunks,
        removed from the store, are left out), least recently used first."""
        current = dict(self.warm)
        current.update((c, chunk) for c, chunk in self.loaded.items() if chunk.stored[1])
        return current

    def snapshot(self) -> bytes:
        """The whole state in one blob (header and every chunk), for tests and tools; in Spark
        :meth:`commit` writes the chunks to the state store and the header beside them."""
        header = self.commit()
        return pickle.dumps((_LAYOUT, header, dict(self.chunks.items())), protocol=5)

    def _new_join(self):
        if self.plan.reference is None:
            return None
        return ReferenceJoin(self.plan.reference)

    @property
    def cti(self) -> int:
        return self.layer.cti()

    def live_keys(self, join: bool = True) -> int:
        """Distinct keys any operator (or, with ``join``, the reference join) keeps state for:
        the stored totals, corrected by the chunks decoded in this call (chunks hold disjoint
        keys; the join's keys may repeat theirs)."""
        keys = self.stored_keys + sum(len(chunk.live_keys()) - chunk.stored[1] for chunk in self.loaded.values())
        if join and self.join is not None:
            keys += len(self.join.live_keys())
        return keys

    def keys(self) -> set[str]:
        """Every key an operator keeps state for (decodes every chunk: tests and tools)."""
        for c, blob in list(self.chunks.items()):
            if is_chunk(c):
                self.chunk(c, blob)
        keys: set[str] = set()
        for chunk in self.loaded.values():
            keys |= chunk.live_keys()
        return keys

    def end_of_input(self, stream: str) -> bool:
        """A bounded input's stream ended; True once every stream has (then flush to +∞:
        one stream's end must not finalise results another stream can still change)."""
        self.ended.add(stream)
        return self.ended >= set(self.plan.streams)

    # -- one micro-batch ---------------------------------------------------------------
    def run_batch(self, got: rows.GroupInput, final: bool = False) -> "BatchResult":
        """One micro-batch of the group, as the Spark adapter runs it (tests and benchmarks call
        it the same way): every partition's frontier and the streams' control rows; the
        undecodable records counted (their dead letters in the result); the events checked
        against the CTI the previous batch ended with; then this batch's CTI — +∞ once every
        stream of a bounded input has ended, or with ``final``. The caller then
        :meth:`commit` s the state."""
        for stream, partition, start in got.frontiers:
            self.observe(stream, partition, start)
        flush = final
        for stream, control in got.controls:
            self.assign(stream, control.partitions, control.idle)
            if control.flush and self.end_of_input(stream):
                flush = True
        topics = self.plan.topics
        dead = []
        for d in got.dead:
            self.dead_letter(d.stream, d.partition)
            dead.append(rows.dead_letter(topics.get(d.stream, d.stream), d.partition, d.offset, d.key, d.value,
                                         d.error, d.kafka_timestamp))
        out = []
        for stream, packs in itertools.groupby(got.columns, key=_STREAM):  # each stream's packs, as they are
            out.extend(self.offer_many(EventColumns.concat(list(packs))))
        out.extend(self.advance(CTI_INFINITY if flush else self.next_cti()))
        counters = self.counters
        counters.cti = self.cti
        counters.live_keys = self.live_keys()
        counters.partitions = self.partition_gauges()
        return BatchResult(out, dead, counters)

    # -- feeding ---------------------------------------------------------------------
    def offer(self, event: Event) -> list[tuple[str, Output, str | None]]:
        """An arriving event: buffered until the CTI passes it, or reported late now."""
        return self.offer_many((event,))

    def offer_many(self, events: EventColumns | list[Event]) -> list[tuple[str, Output, str | None]]:
        """:meth:`offer` for a micro-batch's events (in arrival order), in one call: each is
        checked against the CTI in effect (the one the previous micro-batch ended with).
        ``events``: :class:`EventColumns` of one stream, or :class:`Event` objects (tests, tools)."""
        if isinstance(events, EventColumns):
            return self._offer_columns(events)
        out: list[tuple[str, Output, str | None]] = []
        for _, run in itertools.groupby(events, key=_STREAM):
            out.extend(self._offer_columns(EventColumns.from_events(list(run))))
        return out

    def _offer_columns(self, cols: EventColumns) -> list[tuple[str, Output, str | None]]:
        out: list[tuple[str, Output, str | None]] = []
        topic, counters = self.plan.late_topic, self.counters
        late_by: dict[int, int] = {}
        late_count = 0
        for event, late in self.layer.offer_columns(cols):
            # An ADJUSTed event is still processed (its late record reports the dropped part).
            whole = any(o.record["reason"] != REASON_ADJUSTED for o in late)
            late_count += whole
            out.extend((topic, o, event.key) for o in late)
            if whole:
                late_by[event.partition] = late_by.get(event.partition, 0) + 1
        partitions, received = np.unique(cols.partition, return_counts=True)
        for partition, n in zip(partitions.tolist(), received.tolist()):
            slot = (cols.stream, partition)
            mine = counters.by_partition.get(slot)
            if mine is None:
                mine = counters.by_partition[slot] = [0, 0]
            mine[0] += n
            mine[1] += late_by.get(partition, 0)
        counters.received += len(cols)
        counters.late += late_count
        return out

    # -- CTIs ----------------------------------------------------------------------------
    def observe(self, stream: str, partition: int, start: int) -> None:
        """Records of ``stream``'s ``partition`` up to event time ``start`` were read (the
        source's frontier row: every key group learns every partition's progress)."""
        self.clocks[stream].observe(partition, start)

    def assign(self, stream: str, partitions, idle) -> None:
        """``stream``'s partitions and the idle ones, as the source planned this micro-batch."""
        self.clocks[stream].assign(partitions, idle)

    def partition_gauges(self) -> dict:
        """``(stream, partition) → (the partition's CTI, idle 0/1)`` (CTI: its frontier − the stream's delay)."""
        out = {}
        for stream, clock in self.clocks.items():
            for p in sorted(clock.partitions | set(clock.frontier)):
                frontier = clock.frontier.get(p)
                out[(stream, p)] = (CTI_NONE if frontier is None else frontier - clock.delay, int(p in clock.idle))
        return out

    def next_cti(self) -> int:
        """The CTI the micro-batch ends with: per stream the min over its non-idle partitions
        of ``largest start − delay``, then the min over :attr:`Plan.cti_streams`
        (:func:`operators.time.combined_cti`); never below the current CTI."""
        for name in self.plan.cti_streams:
            self.clocks[name].advance()
        return max(self.cti, combined_cti({n: self.clocks[n] for n in self.plan.cti_streams}))

    def dead_letter(self, stream: str = "", partition: int = 0) -> None:
        self.counters.received += 1
        self.counters.dead_letter += 1
        self.counters.count(stream, partition, False)

    def advance(self, cti: int) -> list[tuple[str, Output, str | None]]:
        """Apply a CTI (the watermark; :data:`CTI_INFINITY` flushes): release events in
        application-time order into the operators, then advance them."""
        out: list[tuple[str, Output, str | None]] = []
        if cti <= CTI_NONE:
            return out
        self.layer.enqueue(cti)
        if not self.layer.has_pending:
            return out
        cti, runs = self.layer.step()
        self.counters.released += sum(map(len, runs))
        if self.join is None:  # one stream
            self._feed(runs[0] if runs else None, cti, out)
            return out
        # The join converts at its edges: it takes events one by one, its results become columns.
        joined: list[Event] = []
        for e in merged_events(runs) if runs else ():
            self._route_join(self.join.process(e), joined, out)
        self._route_join(self.join.advance_to(cti), joined, out)
        if joined and self.enriched.offer(EventColumns.from_events(joined)):
            raise RuntimeError("the reference join emitted an event behind its own output CTI (a bug)")
        self._feed(self.enriched.advance(CTI_INFINITY if cti >= CTI_INFINITY else self.join.output_cti), cti, out)
        return out

    def _route_join(self, outputs: list[Output], joined: list[Event], out: list) -> None:
        for o in outputs:
            key = o.record.get("key")
            if o.role == "enriched":
                joined.append(enriched_event(o, stream=self.plan.fast))
                if self.plan.enriched_topic:
                    out.append((self.plan.enriched_topic, Output("enriched", enriched_record(o.record)), key))
            else:
                out.append((self.plan.late_topic if o.role == "late" else self.plan.dead_letter_topic, o, key))

    def _topic(self, spec: OperatorSpec, role: str) -> str:
        """Where an operator's output role goes: its configured topic, or the job's late topic
        for ``late`` (e.g. a bin's share that arrived after the bin was final). Any other role
        is a bug in ctiflow: it fails the batch, it is never written somewhere by default."""
        topic = spec.topics.get(role)
        if topic is not None:
            return topic
        if role == "late":
            return self.plan.late_topic
        raise RuntimeError(f"operator {spec.name!r} ({spec.cls.__name__}) emitted an output role {role!r} that has "
                           f"no topic (known: {', '.join(sorted(spec.topics))}, late): a bug in ctiflow")

    def _routed(self, spec: OperatorSpec, o: Output, event_key: str | None) -> tuple:
        """``(topic, record, Kafka key)`` of one operator output. Role ``dead_letter`` is a
        result the operator refused (a match whose measure failed on its rows): ``{"error",
        "value"}`` becomes a dead-letter record of the job's input stream (no one partition or
        offset: ``-1``), its value the rows as JSON."""
        if o.role != "dead_letter":
            return (self._topic(spec, o.role), o, _kafka_key(o, event_key))
        key = o.key if o.key is not None else event_key
        record = rows.dead_letter(self.plan.topics.get(self.plan.fast, self.plan.fast), -1, -1,
                                  None if key is None else str(key).encode(),
                                  json.dumps(o.record["value"], default=str).encode(),
                                  f"operator {spec.name}: {o.record['error']}", stage="operator")
        return (self.plan.dead_letter_topic, Output("dead_letter", record), key)

    def _feed(self, cols: EventColumns | None, cti: int | None, out: list) -> None:
        """Released events (in release order; None: none) into every operator of their key's
        chunk, then (unless ``cti`` is None) the CTI into every chunk that has events or is due at
        it (every chunk at +∞). Per key, events and results keep their order; the events' results
        follow release order, the CTI's chunk order."""
        before = len(out)
        plan = self.plan
        keys = [] if cols is None else cols.key.tolist()
        if self.chunk_count == 1:
            of = [0] * len(keys)
        else:
            address = self.address
            of_key = {k: address(k) for k in set(keys)}
            of = list(map(of_key.__getitem__, keys))
        touch = set(of)
        if cti is not None:
            if cti >= CTI_INFINITY:
                for c, blob in list(self.chunks.items()):  # the final CTI: every chunk
                    if is_chunk(c):
                        self.chunk(c, blob)
                touch.update(self.loaded)
            else:
                touch.update(c for c, due in self.due.items() if due <= cti and c not in self.loaded)
                # decoded earlier in this call and not committed since: their due entry is stale
                touch.update(c for c, chunk in self.loaded.items() if c not in touch and chunk.due(plan.ttl) <= cti)
        caught_up = self.ops_cti
        for c in sorted(touch):
            chunk = self.chunk(c)
            if chunk.cti < caught_up:  # skipped CTIs (nothing was due): catch up before its events
                for spec, op in zip(plan.operators, chunk.ops):
                    self._advance_op(spec, op, caught_up, out)
                chunk.cti = caught_up
        loaded = self.loaded
        # Events in release (application-time) order, each into its chunk's operator; then the CTI.
        for i, spec in enumerate(plan.operators):
            if keys:
                first = loaded[of[0]].ops[i]
                order = first.release_order(cols)
                mine, mine_of = (cols, of) if order is None else (cols.take(order), [of[j] for j in order])
                if spec.cls.stateless:  # one instance takes every chunk's rows
                    self._report(spec, mine, first.process_columns(mine), out)
                else:
                    self._feed_columns(i, spec, mine, mine_of, out)
            if cti is not None:
                for c in sorted(touch):
                    self._advance_op(spec, loaded[c].ops[i], cti, out)
        if cti is not None:
            seen: dict[int, list[tuple[str, int]]] = {}
            if plan.ttl is not None and keys:
                for key, start, c in zip(keys, cols.start.tolist(), of):
                    seen.setdefault(c, []).append((key, start))
            for c in touch:
                loaded[c].cti = cti
                if plan.ttl is not None:
                    self._expire_keys(loaded[c], seen.get(c, ()), cti)
            self.ops_cti = cti
        self.counters.outputs += sum(len(o) if type(o) is OutputBatch else 1 for _, o, _ in out[before:])

    def _advance_op(self, spec: OperatorSpec, op, cti: int, out: list) -> None:
        """The CTI into one operator; its records onto ``out``."""
        for item in op.advance_to(cti):
            if type(item) is OutputBatch:
                self._batch(spec, item, out)
            else:
                out.append(self._routed(spec, item, None))

    def _batch(self, spec: OperatorSpec, batch: OutputBatch, out: list) -> None:
        """An operator's :class:`OutputBatch` onto ``out``: as it is, ``(topic, batch, None)``,
        when the runtime is ``batched`` (the job encodes it in bulk), else one record each."""
        if self.batched:
            out.append((self._topic(spec, batch.role), batch, None))
        else:
            out.extend(self._routed(spec, o, None) for o in batch.outputs())

    def _refused(self, spec: OperatorSpec, e: Event, exc: EventRejected, out: list) -> None:
        """The operator refused this event's data (e.g. a measure it cannot prorate): it goes to
        dead-letter with the reason; the job keeps running. Any other exception is a bug in
        ctiflow and fails the micro-batch."""
        self.counters.refused += 1
        out.append((self.plan.dead_letter_topic, Output("dead_letter", operator_dead_letter(
            e, spec.name, exc, self.plan.topics.get(e.stream, e.stream))), e.key))

    def _feed_columns(self, i: int, spec: OperatorSpec, cols: EventColumns, of: list[int], out: list) -> None:
        """Operator ``i`` takes each chunk's rows in one ``process_columns`` call; what a row
        produced (records, or its refusal) is reported in release order."""
        if self.chunk_count == 1:
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
        self._report(spec, cols, results, out)

    def _report(self, spec: OperatorSpec, cols: EventColumns, results: list[tuple[int, Any]], out: list) -> None:
        """A ``process_columns`` result onto ``out``: records routed, refusals dead-lettered."""
        for j, r in results:
            if isinstance(r, EventRejected):
                self._refused(spec, cols.event(j), r, out)
            elif type(r) is OutputBatch:
                self._batch(spec, r, out)
            else:
                key = cols.key[j]
                out.extend(self._routed(spec, o, key) for o in r)

    def _expire_keys(self, chunk: Chunk, seen_now, cti: int) -> None:
        """The key TTL: a key is forgotten by every operator (``forget_keys``)
        once the application time the CTI makes final (``cti − 1``) is ``ttl`` past its latest
        event. In application time,
        so a replay expires the same keys; at the final CTI everything is flushed anyway."""
        seen = chunk.last_seen
        for key, start in seen_now:  # (key, start) of the chunk's events in this call
            if start > seen.get(key, start - 1):
                seen[key] = start
        if cti >= CTI_INFINITY:
            seen.clear()
            return
        horizon = cti - self.plan.ttl
        expired = [key for key, last in seen.items() if last < horizon]
        for key in expired:
            del seen[key]
        if expired:
            for op in chunk.ops:
                op.forget_keys(expired)
        self.counters.expired_keys += len(expired)


def _buffer_state(buffer: ColumnBuffer) -> tuple:
    """The join's output buffer in the header: its CTI and rows (held back by the join's
    output CTI only while a fast event waits for its reference version: a few rows)."""
    buffer.layer.commit()  # (its parts live in the header, not apart)
    return buffer.cti, [buffer.layer.cols(p) for p in buffer.parts]


def _enriched_buffer(stream: str, state) -> ColumnBuffer:
    """The join's output buffer from the header (before 2026-11-27: a row buffer's snapshot)."""
    buffer = ColumnBuffer(stream, ViolationPolicy.DROP)
    if isinstance(state, bytes):
        cti, held = legacy_buffer(state)
        runs = [held]
    else:
        cti, runs = state
    buffer.cti = cti
    buffer.parts = [buffer.layer.new_part(cols) for cols in runs if cols is not None and len(cols)]
    return buffer


def _kafka_key(o: Output, default: str | None) -> str | None:
    """A result record's Kafka key: the operator's (:attr:`Output.key`), its ``key`` field, or ``default``."""
    return o.key if o.key is not None else o.record.get("key", default)
