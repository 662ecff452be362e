"""What one key group runs, independent of Spark: time layer → [reference join] → operators.

The Spark adapter (:mod:`jobs.adapter`) restores a :class:`GroupRuntime` from the state store,
feeds it a micro-batch's rows, advances it to the watermark (the CTI), snapshots it back and
encodes its outputs. Keeping this pure lets the tests drive exactly what runs in Spark.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from dataclasses import dataclass, field
from typing import Any

from jobs import rows
from jobs.config import JobConfig
from jobs.serde import default_store
from operators.errors import EventRejected, StateError
from operators.operator import Output
from operators.passthrough import Passthrough  # noqa: F401 - re-exported (the identity operator)
from operators.reference import ReferenceJoin, ReferenceJoinSettings, enriched_event
from operators.time import (CTI_INFINITY, CTI_NONE, AdvanceTimeSettings, Cti, Event, PartitionCtis, ReorderBuffer,
                            REASON_ADJUSTED, TimeLayer, ViolationPolicy, combined_cti)


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

    @property
    def handles_adjust(self) -> bool:
        return all(getattr(op.cls, "handles_adjust", False) for op in self.operators)


def _time_settings(src) -> AdvanceTimeSettings:
    # In Spark the CTIs come from the watermark (jobs.adapter), so no generation here.
    return AdvanceTimeSettings(delay=src.cti.delay, frequency=None, flush_at_end=src.cti.flush_at_end,
                               policy=ViolationPolicy(src.cti.policy))


def operator_spec(op, cfg: JobConfig) -> OperatorSpec:
    """The pure operator behind one configured operator (the config class builds it)."""
    cls, settings = op.operator(cfg)
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
    for s in cfg.sources:
        default_store().get(s.schema_name)  # an unknown schema fails here, before Spark starts
    cti_streams = (fast,) if cfg.reference is not None and cfg.reference.sync == "import" else tuple(streams)
    return Plan(streams=streams, fast=fast, reference=reference,
                operators=tuple(operator_spec(op, cfg) for op in cfg.operators),
                late_topic=cfg.late_topic, dead_letter_topic=cfg.dead_letter_topic,
                enriched_topic=cfg.reference.output if cfg.reference else None,
                cti_streams=cti_streams, delays={s.name: s.cti.delay for s in cfg.sources},
                topics={s.name: s.topic for s in cfg.sources}, ttl=cfg.state.ttl)


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

    Balance, for every stream together: ``received = released + late + dead_letter + buffered``
    (``buffered``: admitted, waiting for a CTI; 0 after the final CTI)."""

    received: int = 0      # input records of every stream: events, reference versions, undecodable records
    released: int = 0      # events released in application-time order (to the operators, or to the join)
    late: int = 0          # events behind the CTI (with ADJUST: those wholly behind it)
    late_records: int = 0  # records written to the late topic (ADJUST: one per dropped share)
    dead_letter: int = 0   # input records that could not be decoded or validated
    refused: int = 0       # released events an operator refused (written to the dead-letter topic too)
    outputs: int = 0
    expired_keys: int = 0  # keys whose state the key TTL dropped
    cti: int = CTI_NONE    # the group's CTI after the call (not summed: the same in every group)
    state_bytes: int = 0   # the group's state after the call (a gauge: summed over groups, the last batch's kept)
    live_keys: int = 0     # keys with state in an operator or the reference join after the call (a gauge)
    by_partition: dict = field(default_factory=dict)  # (stream, partition) → [received, late]

    def count(self, stream: str, partition: int, late: bool) -> None:
        slot = self.by_partition.get((stream, partition))  # per event: no string built here
        if slot is None:
            slot = self.by_partition[(stream, partition)] = [0, 0]
        slot[0] += 1
        slot[1] += late

    def metrics(self) -> dict[str, int]:
        """Flat ``name → int`` (what the sink sums; ``cti`` it takes the maximum of)."""
        out = {k: v for k, v in vars(self).items() if k != "by_partition"}
        for (stream, partition), (received, late) in self.by_partition.items():
            out[f"received@{stream}/{partition}"] = received
            out[f"late@{stream}/{partition}"] = late
        return out


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


class GroupRuntime:
    """The state of one key group: a time layer, an optional reference join and the operators."""

    def __init__(self, plan: Plan, data: bytes | None = None):
        self.plan = plan
        self.counters = Counters()
        if data is None:
            self.layer = TimeLayer(plan.streams, handles_adjust=plan.handles_adjust)
            self.join = self._new_join()
            self.enriched = ReorderBuffer(ViolationPolicy.DROP) if plan.reference else None
            self.ops = [spec.build() for spec in plan.operators]
            self.ended: set[str] = set()
            self.clocks = {name: PartitionCtis(plan.delays.get(name, 0)) for name in plan.streams}
            self.last_seen: dict[str, int] = {}  # key → its latest released start (key TTL only)
        else:
            with _restoring("the key group's time layer"):
                layer, join, enriched, ops, self.ended, clocks, *rest = pickle.loads(data)
                self.last_seen = rest[0] if rest else {}  # snapshots before the key TTL had 6 parts
                self.clocks = {name: PartitionCtis.restore(c) for name, c in clocks.items()}
                self.layer = TimeLayer.restore(plan.streams, layer, handles_adjust=plan.handles_adjust)
            with _restoring("the reference join"):
                self.join = None if join is None else ReferenceJoin.restore(plan.reference, join)
                self.enriched = None if enriched is None else ReorderBuffer.restore(ViolationPolicy.DROP, enriched)
            if len(ops) != len(plan.operators):
                raise StateError(f"the checkpoint holds {len(ops)} operators' state, the job configures "
                                 f"{len(plan.operators)}: {_STATE_FIX}")
            self.ops = []
            for spec, blob in zip(plan.operators, ops):
                with _restoring(f"operator {spec.name!r} ({spec.cls.__name__})"):
                    self.ops.append(spec.build(blob))

    def _new_join(self):
        if self.plan.reference is None:
            return None
        return ReferenceJoin(self.plan.reference)

    @property
    def cti(self) -> int:
        return self.layer.cti()

    def live_keys(self) -> int:
        """Distinct keys any operator (or the reference join) keeps state for."""
        keys: set[str] = set()
        for part in (*self.ops, self.join):
            if part is not None and hasattr(part, "live_keys"):
                keys |= part.live_keys()
        return len(keys)

    def end_of_input(self, stream: str) -> bool:
        """A bounded input's stream ended; True once every stream has (then flush to +∞:
        one stream's end must not finalise results another stream can still change)."""
        self.ended.add(stream)
        return self.ended >= set(self.plan.streams)

    def snapshot(self) -> bytes:
        return pickle.dumps((self.layer.snapshot(), None if self.join is None else self.join.snapshot(),
                             None if self.enriched is None else self.enriched.snapshot(),
                             [op.snapshot() for op in self.ops], self.ended,
                             {name: c.snapshot() for name, c in self.clocks.items()}, self.last_seen), protocol=5)

    # -- feeding ---------------------------------------------------------------------
    def offer(self, event: Event) -> list[tuple[str, Output, str | None]]:
        """An arriving event: buffered until the CTI passes it, or reported late now."""
        return self.offer_many((event,))

    def offer_many(self, events) -> list[tuple[str, Output, str | None]]:
        """:meth:`offer` for a micro-batch's events (in arrival order), in one call: each is
        checked against the CTI in effect (the one the previous micro-batch ended with)."""
        out: list[tuple[str, Output, str | None]] = []
        offer, topic, count = self.layer.offer, self.plan.late_topic, self.counters.count
        late_count = received = 0
        for event in events:
            received += 1
            late = offer(event)
            if late:
                # An ADJUSTed event is still processed (its late record reports the dropped part).
                whole = any(o.record["reason"] != REASON_ADJUSTED for o in late)
                late_count += whole
                out.extend((topic, o, event.key) for o in late)
                count(event.stream, event.partition, whole)
            else:
                count(event.stream, event.partition, False)
        self.counters.received += received
        self.counters.late += late_count
        return out

    # -- CTIs ----------------------------------------------------------------------------
    def observe(self, stream: str, partition: int, start: int) -> None:
        """Records of ``stream``'s ``partition`` up to event time ``start`` were read (the
        source's frontier row: every key group learns every partition's progress)."""
        self.clocks[stream].observe(partition, start)

    def assign(self, stream: str, partitions, idle) -> None:
        """``stream``'s partitions and the idle ones, as the source planned this micro-batch."""
        self.clocks[stream].assign(partitions, idle)

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
        for stream in self.layer.streams:
            self.layer.enqueue_cti(Cti(cti, stream))
        if not self.layer.has_pending:
            return out
        step = self.layer.step()
        self.counters.released += len(step.released)
        if self.join is None:
            self._feed(step.released, step.cti, out)
            return out
        joined: list[Event] = []
        for e in step.released:
            self._route_join(self.join.process(e), joined, out)
        self._route_join(self.join.advance_to(step.cti), joined, out)
        for e in joined:
            self.enriched.offer(e)
        released = self.enriched.advance(CTI_INFINITY if step.cti >= CTI_INFINITY else self.join.output_cti)
        self._feed(released, step.cti, out)
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

    def _feed(self, events, cti: int | None, out: list) -> None:
        """Released events into every operator, then (unless ``cti`` is None) the CTI."""
        before = len(out)
        for spec, op in zip(self.plan.operators, self.ops):
            for e in events:
                try:
                    produced = op.process(e)
                except EventRejected as exc:
                    # The operator refused this event's data (e.g. a measure it cannot prorate):
                    # it goes to dead-letter with the reason; the job keeps running. Any other
                    # exception is a bug in ctiflow and fails the micro-batch.
                    self.counters.refused += 1
                    out.append((self.plan.dead_letter_topic, Output("dead_letter", operator_dead_letter(
                        e, spec.name, exc, self.plan.topics.get(e.stream, e.stream))),
                                e.key))
                    continue
                for o in produced:
                    out.append((self._topic(spec, o.role), o, o.record.get("key", e.key)))
            if cti is not None:
                for o in op.advance_to(cti):
                    out.append((self._topic(spec, o.role), o, o.record.get("key")))
        self.counters.outputs += len(out) - before
        if self.plan.ttl is not None and cti is not None:
            self._expire_keys(events, cti)

    def _expire_keys(self, events, cti: int) -> None:
        """The key TTL: a key is forgotten by every operator that keeps per-key state (``forget``)
        once the application time the CTI makes final (``cti − 1``) is ``ttl`` past its latest
        event. In application time,
        so a replay expires the same keys; at the final CTI everything is flushed anyway."""
        seen = self.last_seen
        for e in events:
            if e.start > seen.get(e.key, e.start - 1):
                seen[e.key] = e.start
        if cti >= CTI_INFINITY:
            seen.clear()
            return
        horizon = cti - self.plan.ttl
        expired = [key for key, last in seen.items() if last < horizon]
        forgets = [op.forget for op in self.ops if hasattr(op, "forget")]
        for key in expired:
            del seen[key]
            for forget in forgets:
                forget(key)
        self.counters.expired_keys += len(expired)
