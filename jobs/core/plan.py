"""The plan: what the driver hands every executor, as plain picklable values (operator classes
and their settings, streams, topics, side inputs). The driver builds it from a job file
(:func:`ctiflow.jobs.driver.planner.plan_job`); a key group's runtime (:mod:`ctiflow.jobs.core.runtime`)
reads it. Nothing here imports the configuration model, pydantic or PySpark (an architecture
test imports the executor side in a fresh interpreter and checks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctiflow.jobs.avro.serde import SchemaStore, default_store
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.operator import Traits
from ctiflow.operators.time import AdvanceTimeSettings


@dataclass(frozen=True)
class OperatorSpec:
    """A configured operator: how to build/restore it and where each output role goes."""

    name: str
    cls: type
    settings: Any
    role_topics: dict[str, str]  # role → topic

    def build(self, data: bytes | None = None):
        return self.cls(self.settings) if data is None else self.cls.restore(self.settings, data)

    @property
    def traits(self) -> Traits:
        """The operator's declared :class:`ctiflow.operators.operator.Traits`."""
        return self.cls.traits(self.settings)


@dataclass(frozen=True)
class Plan:
    """Everything a key group needs, derived once on the driver from the job's configuration
    (:func:`ctiflow.jobs.driver.planner.plan_job`) and read by every executor: plain picklable values.
    The settings have no defaults here: theirs are the configuration's (:mod:`ctiflow.jobs.driver.config`),
    and a test or tool that wants others replaces them in a planned job's plan."""

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
    source_topics: dict[str, str] = field(default_factory=dict)
    #: ``state.ttl`` (ms): a key's state goes once the CTI is this far past its latest event
    ttl: int | None = None
    #: ``spark.key_groups`` (the group is ``crc32(key) mod key_groups``) and ``state.chunk_keys``:
    #: each group's keyed state is kept in chunks of about that many keys
    key_groups: int = field(kw_only=True)
    chunk_keys: int = field(kw_only=True)
    #: ``state.delta_share``: a chunk is written whole once its delta would pass this share of its bytes
    delta_share: float = field(kw_only=True)
    #: ``state.cache_chunks``: decoded chunks a Python worker keeps between micro-batches
    cache_chunks: int = field(kw_only=True)
    #: record schemas the operators derive (name → Avro JSON): a process that encodes or decodes
    #: their topics uses :meth:`schema_store`
    schemas: dict[str, str] = field(default_factory=dict)
    #: the operators' side inputs, each feeding a shared state (:class:`SideInput`)
    side_inputs: tuple["SideInput", ...] = ()

    @property
    def clock_streams(self) -> tuple[str, ...]:
        """Every stream whose partitions' CTIs the group tracks: the event streams and the side inputs."""
        return (*self.streams, *(s.stream for s in self.side_inputs))

    def schema_store(self) -> SchemaStore:
        """This process's schemas with the job's derived ones besides (the process's own store is
        left as it is)."""
        return default_store().with_schemas(self.schemas)

    @property
    def operator_names(self) -> list[tuple[str, str]]:
        """``(name, class name)`` of each operator: what a group's header says its chunks hold."""
        return [(spec.name, spec.cls.__name__) for spec in self.operators]

    @property
    def keeps_keys(self) -> bool:
        """Whether a group keeps state under its events' keys (an operator's, or the key TTL's): the
        chunks a process keeps decoded between micro-batches (:mod:`~ctiflow.jobs.state.warm`);
        without, a group's state is its header alone, read whole every micro-batch."""
        return self.ttl is not None or any(op.traits.state != "none" for op in self.operators)

    @property
    def handles_adjust(self) -> bool:
        return all(op.traits.handles_adjust for op in self.operators)

    @property
    def fields_read(self) -> tuple[str, ...] | None:
        """The only record fields the operators read of an event on their common path (their
        traits' ``fields_read``); None when one may read any."""
        names: list[str] = []
        for op in self.operators:
            got = op.traits.fields_read
            if got is None:
                return None
            names.extend(n for n in got if n not in names)
        return tuple(names)

    def needs_records(self, cols: EventColumns) -> bool:
        """Whether an operator may read all fields of a row of ``cols`` (its ``needs_records``:
        a refusal, a late record)."""
        return any(op.cls.needs_records(op.settings, cols) for op in self.operators)


@dataclass(frozen=True)
class SideInput:
    """An operator's side input (:mod:`ctiflow.jobs.core.broadcast`): the stream every key group reads
    whole, the operator's place in the plan, how a group makes and restores its shared state
    (``shared``: ``new()`` / ``restore(bytes)``, e.g. :class:`ctiflow.operators.cep.rules.RuleBookSpec`),
    how the stream's CTIs count (``sync``: ``min`` holds events back for it) and the stage its
    refused records' dead letters name."""

    stream: str
    operator: int
    shared: Any
    sync: str = "import"
    stage: str = "rule"
