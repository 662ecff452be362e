"""What one key group runs, independent of Spark: time layer → [reference join] → operators.

The Spark adapter (:mod:`ctiflow.jobs.datapath.adapter`) restores a :class:`GroupRuntime` from the state store
(its header; keyed state chunks are read as the batch needs them), feeds it a micro-batch's
rows, advances it to the CTI, commits the chunks it touched and the header back, and encodes its
outputs. Keeping this pure lets the tests drive exactly what runs in Spark.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from ctiflow.jobs.core import rows
from ctiflow.jobs.core.broadcast import SharedStates
from ctiflow.jobs.core.counters import Counters
from ctiflow.jobs.core.plan import OperatorSpec, Plan
from ctiflow.jobs.state.chunks import STATE_FIX, Chunk, KeyedState, restoring
from ctiflow.jobs.state import compat
from ctiflow.jobs.state.codec import compressed, expanded
from ctiflow.jobs.state.header import GroupHeader, read_whole_state, whole_state
from ctiflow.jobs.state.parts import StoredParts
from ctiflow.operators.columns import ColumnBuffer, ColumnTimeLayer, EventColumns, merged_events
from ctiflow.operators.errors import EventRejected, StateError
from ctiflow.operators.events import OutputBatch
from ctiflow.operators.operator import Output
from ctiflow.operators.reference import ReferenceJoin, enriched_event
from ctiflow.operators.time import (CTI_INFINITY, CTI_NONE, REASON_ADJUSTED, Event, PartitionCtis,
                            ViolationPolicy, combined_cti)


def operator_dead_letter(e: Event, operator: str, exc: Exception, topic: str) -> dict:
    """An event an operator refused: its fields as JSON (the Avro bytes are not kept past the source)."""
    return rows.dead_letter(topic, e.partition, e.offset, e.key.encode(),
                            json.dumps(e.fields, default=str).encode(),
                            f"operator {operator}: {exc}", stage="operator")


def enriched_record(r: dict) -> dict:
    """The join's output in the shape of ``schemas/enriched.avsc`` (nested records as JSON)."""
    return {"key": r["key"], "time": r["time"], "event_json": json.dumps(r["event"], default=str),
            "reference_json": None if r["reference"] is None else json.dumps(r["reference"], default=str),
            "reference_valid_from": r["reference_valid_from"], "reference_missing": r["reference_missing"]}


@dataclass
class BatchResult:
    """What :meth:`GroupRuntime.run_batch` produced: result records ``(topic, Output |
    OutputBatch, Kafka key)`` in output order, the dead letters of undecodable input records,
    and the group's counters (``state_*`` complete once the runtime is committed)."""

    outputs: list
    dead: list[dict]
    counters: Counters


_STREAM = attrgetter("stream")


class Clocks:
    """Each stream's per-partition CTIs (:class:`ctiflow.operators.time.PartitionCtis`), as every key
    group learns them from the frontier and control rows."""

    def __init__(self, streams: dict[str, PartitionCtis]) -> None:
        self.streams = streams

    def snapshot(self) -> dict:
        return {name: c.snapshot() for name, c in self.streams.items()}

    def cti(self, streams: tuple[str, ...]) -> int:
        """Per stream the min over its non-idle partitions of ``largest start − delay``, then
        the min over ``streams`` (:func:`ctiflow.operators.time.combined_cti`)."""
        for name in streams:
            self.streams[name].advance()
        return combined_cti({n: self.streams[n] for n in streams})

    def gauges(self) -> dict:
        """``(stream, partition) → (the partition's CTI, idle 0/1)`` (CTI: its frontier − the stream's
        delay)."""
        out = {}
        for stream, clock in self.streams.items():
            for p in sorted(clock.partitions | set(clock.frontier)):
                frontier = clock.frontier.get(p)
                out[(stream, p)] = (CTI_NONE if frontier is None else frontier - clock.delay,
                                    int(p in clock.idle))
        return out


class Router:
    """Where each record goes: ``(topic, Output | OutputBatch, Kafka key)`` onto a call's output
    list. ``batched``: an operator's :class:`OutputBatch` stays one (the job's bulk encoder
    takes it), else it comes one :class:`Output` per record."""

    def __init__(self, plan: Plan, counters: Counters, batched: bool) -> None:
        self.plan, self.counters, self.batched = plan, counters, batched

    def topic(self, spec: OperatorSpec, role: str) -> str:
        """Where an operator's output role goes: its configured topic, or the job's late topic
        for ``late`` (e.g. a bin's share that arrived after the bin was final). Any other role
        is a bug in ctiflow: it fails the batch, it is never written somewhere by default."""
        topic = spec.role_topics.get(role)
        if topic is not None:
            return topic
        if role == "late":
            return self.plan.late_topic
        raise RuntimeError(f"operator {spec.name!r} ({spec.cls.__name__}) emitted an output role {role!r} "
                           f"that has no topic (known: {', '.join(sorted(spec.role_topics))}, late): a bug "
                           "in ctiflow")

    def record(self, spec: OperatorSpec, o: Output, event_key: str | None) -> tuple:
        """``(topic, record, Kafka key)`` of one operator output. Role ``dead_letter`` is a
        result the operator refused (a match whose measure failed on its rows): ``{"error",
        "value"}`` becomes a dead-letter record of the job's input stream (no one partition or
        offset: ``-1``), its value the rows as JSON."""
        if o.role != "dead_letter":
            return (self.topic(spec, o.role), o, _kafka_key(o, event_key))
        key = o.key if o.key is not None else event_key
        record = rows.dead_letter(self.plan.source_topics.get(self.plan.fast, self.plan.fast), -1, -1,
                                  None if key is None else str(key).encode(),
                                  json.dumps(o.record["value"], default=str).encode(),
                                  f"operator {spec.name}: {o.record['error']}", stage="operator")
        return (self.plan.dead_letter_topic, Output("dead_letter", record), key)

    def batch(self, spec: OperatorSpec, batch: OutputBatch, out: list) -> None:
        if self.batched:
            out.append((self.topic(spec, batch.role), batch, None))
        else:
            out.extend(self.record(spec, o, None) for o in batch.outputs())

    def advanced(self, spec: OperatorSpec, items: list, out: list) -> None:
        """What ``advance_to`` returned."""
        for item in items:
            if type(item) is OutputBatch:
                self.batch(spec, item, out)
            else:
                out.append(self.record(spec, item, None))

    def processed(self, spec: OperatorSpec, cols: EventColumns, results: list[tuple[int, Any]],
                  out: list) -> None:
        """A ``process_columns`` result: records routed; a refused event (e.g. a measure the
        binner cannot prorate) to the dead-letter topic with the reason, the job going on. Any
        other exception is a bug in ctiflow and fails the micro-batch."""
        for j, r in results:
            if isinstance(r, EventRejected):
                e = cols.event(j)
                self.counters.refused += 1
                out.append((self.plan.dead_letter_topic, Output("dead_letter", operator_dead_letter(
                    e, spec.name, r, self.plan.source_topics.get(e.stream, e.stream))), e.key))
            elif type(r) is OutputBatch:
                self.batch(spec, r, out)
            else:
                key = cols.key[j]
                out.extend(self.record(spec, o, key) for o in r)


class ReferenceStage:
    """The reference join between the time layer and the operators. It converts at its edges:
    it takes the released events of both streams one by one in application-time order; what it
    enriches waits in a :class:`ColumnBuffer` until the join's output CTI passes it."""

    def __init__(self, plan: Plan, join: ReferenceJoin, enriched: ColumnBuffer) -> None:
        self.plan, self.join, self.enriched = plan, join, enriched

    @classmethod
    def new(cls, plan: Plan) -> "ReferenceStage":
        return cls(plan, ReferenceJoin(plan.reference), ColumnBuffer(plan.fast, ViolationPolicy.DROP))

    @classmethod
    def restore(cls, plan: Plan, join: bytes, enriched) -> "ReferenceStage":
        with restoring("the reference join"):
            return cls(plan, ReferenceJoin.restore(plan.reference, join),
                       _enriched_buffer(plan.fast, enriched))

    def state(self) -> tuple:
        return self.join.snapshot(), _buffer_state(self.enriched)

    def step(self, runs: list[EventColumns], cti: int, out: list) -> EventColumns | None:
        """The released runs through the join to ``cti``; → the enriched events it releases."""
        joined: list[Event] = []
        for e in merged_events(runs) if runs else ():
            self._route(self.join.process(e), joined, out)
        self._route(self.join.advance_to(cti), joined, out)
        if joined and self.enriched.offer(EventColumns.from_events(joined)):
            raise RuntimeError("the reference join emitted an event behind its own output CTI (a bug)")
        return self.enriched.advance(CTI_INFINITY if cti >= CTI_INFINITY else self.join.output_cti)

    def _route(self, outputs: list[Output], joined: list[Event], out: list) -> None:
        plan = self.plan
        for o in outputs:
            key = o.record.get("key")
            if o.role == "enriched":
                joined.append(enriched_event(o, stream=plan.fast))
                if plan.enriched_topic:
                    out.append((plan.enriched_topic, Output("enriched", enriched_record(o.record)), key))
            else:
                out.append((plan.late_topic if o.role == "late" else plan.dead_letter_topic, o, key))


def time_layer(plan: Plan, chunks, data) -> tuple[ColumnTimeLayer, StoredParts]:
    """A group's time layer and its stored parts; without a join, the parts keep only the fields
    the operators read (the join reads and passes on every field). ``data``: None (new), the
    header's ``(index, part sizes)``, or (before 2026-11-27) the layer's bytes with its rows."""
    keep = plan.fields_read if plan.reference is None else None
    if data is None or isinstance(data, bytes):
        parts = StoredParts(chunks)
    else:
        data, sizes = data
        parts = StoredParts(chunks, sizes)
    args = (plan.handles_adjust, keep, plan.needs_records, parts.load)
    layer = (ColumnTimeLayer(plan.streams, *args) if data is None
             else compat.time_layer(plan.streams, data, *args))
    return layer, parts


class GroupRuntime:
    """The state of one key group: a time layer, an optional reference join and the operators'
    keyed state (:class:`ctiflow.jobs.state.chunks.KeyedState`).

    **State layout.** The group-wide part — the time layer's index (its rows are stored apart,
    :mod:`ctiflow.jobs.state.parts`), per-partition CTI clocks, the reference join, the chunks' index —
    is the *header* (:meth:`commit` returns it); the operators' keyed state and the time layer's
    parts are entries of ``chunks`` (a ``MapState`` in Spark; a dict here), read as the batch
    needs them.

    ``data``: a whole :meth:`snapshot` (tests, tools); ``header`` + ``chunks``: the Spark layout.
    ``warm``, ``read_token``, ``behind``: the worker's cache (:class:`ctiflow.jobs.state.warm.WarmChunks`,
    :class:`KeyedState`). ``batched``: see :class:`Router`; ``read_all``: :meth:`KeyedState.read_ahead`."""

    def __init__(self, plan: Plan, data: bytes | None = None, *, header: bytes | None = None, chunks=None,
                 warm: dict[int, Chunk] | None = None, batched: bool = False, reports_shared: bool = True,
                 read_all=None, read_token: bytes | None = None, behind=None):
        if plan.reference is None and len(plan.streams) != 1:
            raise ValueError("several input streams need a reference join (ctiflow.jobs.driver.config "
                             "refuses it)")
        self.plan = plan
        self.counters = Counters()
        self.route = Router(plan, self.counters, batched)
        self.chunks = {} if chunks is None else chunks
        if data is not None:
            with restoring("the key group's state"):
                header, stored = read_whole_state(data, STATE_FIX)
            self.chunks.update(stored)
        started = time.perf_counter()
        if header is None:
            h = GroupHeader(None, None, None, set(), {}, CTI_NONE, None, self.plan.operator_names)
        else:
            with restoring("the key group's time layer"):
                h = GroupHeader.from_bytes(header, bool(plan.side_inputs))
            if h.operators != self.plan.operator_names:
                raise StateError(f"the checkpoint holds the state of operators {h.operators}, the job "
                                 f"configures {self.plan.operator_names}: {STATE_FIX}")
        self.ended, self.ops_cti = h.ended, h.ops_cti  # (ops_cti: every chunk's operators are at or reach it)
        self.clocks = Clocks({name: PartitionCtis.restore(h.clocks[name]) if name in h.clocks
                              else PartitionCtis(plan.delays.get(name, 0)) for name in plan.clock_streams})
        #: the operators' broadcast state: every group offers the side inputs' records to its own
        #: copies (all alike); one reports them (``reports_shared``: the adapter's choice)
        self.shared = SharedStates(plan, h.shared, reports_shared)
        traits = [spec.traits for spec in plan.operators]
        grows = all(t.partitions for t in traits)
        #: operator index → the one key its state lives under (``Traits.home_key``: a global operator)
        self._homes = {i: t.home_key for i, t in enumerate(traits) if t.home_key is not None}
        self._traits = traits
        #: whether the events' own chunks hold state: an operator keyed by them, or the key TTL
        self._by_event_key = plan.ttl is not None or any(t.state == "keys" for t in traits)
        self.keyed = KeyedState(plan.operators, self.chunks, self.counters, key_groups=plan.key_groups,
                                chunk_keys=plan.chunk_keys, ttl=plan.ttl, grows=grows, warm=warm,
                                index=h.keyed, prepare=self.shared.prepare if self.shared else None,
                                delta_share=plan.delta_share, read_all=read_all, read_token=read_token,
                                behind=behind)
        with restoring("the key group's time layer"):
            self.layer, self.parts = time_layer(plan, self.chunks, h.layer)
        if plan.reference is None:
            self.reference = None
        else:
            self.reference = (ReferenceStage.new(plan) if h.join is None
                              else ReferenceStage.restore(plan, h.join, h.enriched))
        self.counters.state_us += int((time.perf_counter() - started) * 1e6)

    # -- state -------------------------------------------------------------------------
    def commit(self) -> bytes:
        """Write the chunks this call decoded and the time layer's new parts to ``chunks``,
        drop the released parts, and return the header. The runtime can go on."""
        started = time.perf_counter()
        keyed, counters = self.keyed, self.counters
        keyed.commit()
        counters.live_keys = keyed.stored_keys + self._join_keys()  # (every decoded chunk is stored now)
        counters.state_written += self.parts.commit(self.layer)
        reference = (None, None) if self.reference is None else self.reference.state()
        shared = self.shared.commit(self.ops_cti, keyed.op_tallies) if self.shared else None  # (after keyed)
        header = GroupHeader((self.layer.index(), self.parts.sizes), *reference, self.ended,
                             self.clocks.snapshot(), self.ops_cti, keyed.index(), self.plan.operator_names,
                             shared).to_bytes()
        counters.state_bytes = len(header) + keyed.stored_bytes + self.parts.bytes
        keyed.report(counters, [spec.name for spec in self.plan.operators])
        counters.state_written += len(header)
        counters.state_us += int((time.perf_counter() - started) * 1e6)
        return header

    def snapshot(self) -> bytes:
        """The whole state in one blob (header and every entry), for tests and tools; in Spark
        :meth:`commit` writes the entries to the state store and the header beside them."""
        return whole_state(self.commit(), dict(self.chunks.items()))

    @property
    def cti(self) -> int:
        return self.layer.cti()

    def live_keys(self) -> int:
        """Distinct keys any operator or the reference join keeps state for (the join's keys may
        repeat the operators')."""
        return self.keyed.live_keys() + self._join_keys()

    def _join_keys(self) -> int:
        return 0 if self.reference is None else len(self.reference.join.live_keys())

    def keys(self) -> set[str]:
        """Every key an operator keeps state for (decodes every chunk: tests and tools)."""
        return self.keyed.keys()

    # -- one micro-batch ---------------------------------------------------------------
    def run_batch(self, got: rows.GroupInput, final: bool = False) -> BatchResult:
        """One micro-batch of the group, as the Spark adapter runs it (tests and benchmarks call
        it the same way): every partition's frontier and the streams' control rows; the
        undecodable records counted (their dead letters in the result); the events checked
        against the CTI the previous batch ended with; then this batch's CTI — +∞ once every
        stream of a bounded input has ended, or with ``final``. The caller then
        :meth:`commit` s the state."""
        for stream, partition, start in got.frontiers:
            self.clocks.streams[stream].observe(partition, start)
        flush = final
        for stream, control in got.controls:
            self.clocks.streams[stream].assign(control.partitions, control.idle)
            if control.flush and self.end_of_input(stream):
                flush = True
        topics, counters = self.plan.source_topics, self.counters
        dead = []
        for d in got.dead:
            counters.received += 1
            counters.dead_letter += 1
            counters.count(d.stream, d.partition, False)
            dead.append(rows.dead_letter(topics.get(d.stream, d.stream), d.partition, d.offset, d.key,
                                         d.value, d.error, d.kafka_timestamp))
        out = []
        sides = self.shared.inputs
        for stream, packs in itertools.groupby(got.columns, key=_STREAM):  # each stream's packs, as they are
            cols = EventColumns.concat(list(packs))
            out.extend(self.shared.offer(sides[stream], cols, self.cti, counters) if stream in sides
                       else self.offer_many(cols))
        out.extend(self.advance(CTI_INFINITY if flush else self.next_cti()))
        counters.cti = self.cti
        counters.shared = self.shared.stats(self.cti)
        counters.partitions = self.clocks.gauges()
        return BatchResult(out, dead, counters)

    def end_of_input(self, stream: str) -> bool:
        """A bounded input's stream ended; True once every stream has (then flush to +∞:
        one stream's end must not finalise results another stream can still change)."""
        self.ended.add(stream)
        return self.ended >= set(self.plan.clock_streams)

    def offer_many(self, events: EventColumns | list[Event]) -> list[tuple[str, Output, str | None]]:
        """A micro-batch's events (in arrival order), each checked against the CTI in effect
        (the one the previous micro-batch ended with): buffered until the CTI passes it, or
        reported late now. ``events``: :class:`EventColumns` of one stream, or :class:`Event`
        objects (tests, tools)."""
        if not isinstance(events, EventColumns):
            return [r for _, run in itertools.groupby(events, key=_STREAM)
                    for r in self.offer_many(EventColumns.from_events(list(run)))]
        out: list[tuple[str, Output, str | None]] = []
        topic, counters = self.plan.late_topic, self.counters
        late_by: dict[int, int] = {}
        for event, late in self.layer.offer_columns(events):
            out.extend((topic, o, event.key) for o in late)
            # An ADJUSTed event is still processed (its late record reports the dropped part).
            if any(o.record["reason"] != REASON_ADJUSTED for o in late):
                late_by[event.partition] = late_by.get(event.partition, 0) + 1
        partitions, received = np.unique(events.partition, return_counts=True)
        for partition, n in zip(partitions.tolist(), received.tolist()):
            mine = counters.by_partition.setdefault((events.stream, partition), [0, 0])
            mine[0] += n
            mine[1] += late_by.get(partition, 0)
        counters.received += len(events)
        counters.late += sum(late_by.values())
        return out

    # -- CTIs ----------------------------------------------------------------------------
    def next_cti(self) -> int:
        """The CTI the micro-batch ends with (:meth:`Clocks.cti`), never below the current one."""
        return max(self.cti, self.clocks.cti(self.plan.cti_streams))

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
        if self.reference is None:  # one stream
            self._feed(runs[0] if runs else None, cti, out)
        else:
            self._feed(self.reference.step(runs, cti, out), cti, out)
        return out

    # -- operators -------------------------------------------------------------------
    def _feed(self, cols: EventColumns | None, cti: int, out: list) -> None:
        """Released events (in release order; None: none) into every operator of their key's
        chunk, then the CTI into every chunk that has events or is due at it (every chunk at
        +∞). Per key, events and results keep their order; the events' results follow release
        order, the CTI's chunk order."""
        before = len(out)
        keyed, plan = self.keyed, self.plan
        keys = [] if cols is None else cols.key.tolist()
        # a global operator's events go to its state key's chunk; the events' own chunks are
        # touched only for the operators (and key TTL) that keep state by the events' keys
        homes = self._homes
        if not keys:
            of, events_in = [], set()
        elif keyed.count == 1:
            of, events_in = [0] * len(keys), {0}
        else:
            of_array = keyed.addresses(keys)
            of = of_array.tolist()
            events_in = set(np.unique(of_array).tolist()) if self._by_event_key else set()
        if keys:
            events_in.update(keyed.address(k) for k in homes.values())
        touch = keyed.touched(events_in, cti)
        keyed.read_ahead(touch, self.parts.bytes)
        caught_up = self.ops_cti
        for c in touch:
            chunk = keyed.chunk(c)
            if chunk.cti < caught_up:  # skipped CTIs (nothing was due): catch up before its events
                for spec, op in zip(plan.operators, chunk.ops):
                    self.route.advanced(spec, op.advance_to(caught_up), out)
                chunk.cti = caught_up
        loaded = keyed.loaded
        for i, spec in enumerate(plan.operators):  # events in release order, each into its chunk; then
                                                   # the CTI
            if keys:
                home = homes.get(i)
                ties = self._traits[i].orders_ties
                if home is not None or self._traits[i].state == "none":  # one instance takes every row
                    first = keyed.chunk(of[0] if home is None else keyed.address(home)).ops[i]
                    order = first.release_order(cols) if ties else None
                    mine = cols if order is None else cols.take(order)
                    self.route.processed(spec, mine, first.process_columns(mine), out)
                else:
                    first = loaded[of[0]].ops[i]
                    order = first.release_order(cols) if ties else None
                    mine, mine_of = ((cols, of) if order is None
                                     else (cols.take(order), [of[j] for j in order]))
                    self.route.processed(spec, mine, keyed.process(i, mine, mine_of), out)
            for c in touch:
                self.route.advanced(spec, loaded[c].ops[i].advance_to(cti), out)
        by_key = keys if self._by_event_key else []
        self.counters.expired_keys += keyed.advanced(touch, by_key, None if cols is None else cols.start,
                                                     of if by_key else [], cti)
        self.ops_cti = cti
        self.counters.outputs += sum(len(o) if type(o) is OutputBatch else 1 for _, o, _ in out[before:])


def open_group(plan: Plan, stored: bytes | None, header: bytes | None, chunks, worker,
               read_all=None) -> GroupRuntime:
    """A key group's runtime as a Python worker opens it from Spark's state store: ``header`` the
    stored header (:func:`~ctiflow.jobs.state.codec.compressed`), ``stored`` the header's stored
    value (it ends with the token of the commit that wrote it), ``worker`` the worker's
    :class:`~ctiflow.jobs.state.warm.WarmChunks` (the chunks it kept decoded). The adapter and the
    benchmarks open a group only so; :func:`seal_group` is the other half."""
    started = time.perf_counter()
    raw = expanded(header)
    expanding = time.perf_counter() - started
    runtime = GroupRuntime(plan, header=raw, chunks=chunks, warm=worker.take(stored), batched=True,
                           read_all=read_all, read_token=worker.token(stored), behind=worker.take_token)
    runtime.counters.state_us += int(expanding * 1e6)
    return runtime


def seal_group(runtime: GroupRuntime, worker) -> tuple[bytes, Callable[[bytes], bytes]]:
    """:meth:`GroupRuntime.commit` as a worker stores it (:func:`open_group`): → (the header to
    store, :func:`~ctiflow.jobs.state.codec.compressed`; ``seal(value)`` → the header's stored value,
    the chunks still decoded filed in ``worker`` under the token it ends with). Counted as stored:
    the compressed header."""
    raw = runtime.commit()
    started = time.perf_counter()
    header = compressed(raw)
    counters = runtime.counters
    counters.state_us += int((time.perf_counter() - started) * 1e6)
    counters.state_written += len(header) - len(raw)
    counters.state_bytes += len(header) - len(raw)
    warm, limit = runtime.keyed.still_warm(), runtime.plan.cache_chunks
    return header, lambda value: worker.put(value, warm, limit)


def _buffer_state(buffer: ColumnBuffer) -> tuple:
    """The join's output buffer in the header: its CTI and rows (held back by the join's
    output CTI only while a fast event waits for its reference version: a few rows)."""
    buffer.layer.commit()  # (its parts live in the header, not apart)
    return buffer.cti, [buffer.layer.cols(p) for p in buffer.parts]


def _enriched_buffer(stream: str, state) -> ColumnBuffer:
    """The join's output buffer from the header (before 2026-11-27: a row buffer's snapshot)."""
    buffer = ColumnBuffer(stream, ViolationPolicy.DROP)
    if isinstance(state, bytes):
        cti, held = compat.legacy_buffer(state)
        runs = [held]
    else:
        cti, runs = state
    buffer.cti = cti
    buffer.parts = [buffer.layer.new_part(cols) for cols in runs if cols is not None and len(cols)]
    return buffer


def _kafka_key(o: Output, default: str | None) -> str | None:
    """A result record's Kafka key: the operator's (:attr:`Output.key`), its ``key`` field, or ``default``."""
    return o.key if o.key is not None else o.record.get("key", default)
