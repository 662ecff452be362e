"""The one configuration model: a job YAML, validated before any Spark job starts.

The CLI, the jobs and docker-compose all use it (docker-compose passes the same YAML and
overrides the connection through ``CTIFLOW_BOOTSTRAP`` / ``CTIFLOW_SCHEMA_REGISTRY_URL``).
Errors name the field and the fix (see :func:`load`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobs.kafka import check_topic_name
from operators.errors import ConfigError

_DURATION = re.compile(r"^\s*(-?\d+)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(value: Any) -> int:
    """Durations as ms: an int (ms) or a string like '5s', '10m', '1h', '-1ms'."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of ms or a string like '5s'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return int(m.group(1)) * _UNIT_MS[m.group(2)]
    raise ValueError(f"{value!r} is not a duration; use ms (e.g. 5000) or '5s', '10m', '1h'")


Duration = Annotated[int, Field(description="ms, or '5s' / '10m' / '1h'")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SchemaRegistry(Strict):
    url: str | None = None
    config: dict[str, str] = Field(default_factory=dict, description="basic.auth.user.info etc.")


class Kafka(Strict):
    bootstrap_servers: str = "127.0.0.1:19092"
    client: dict[str, str] = Field(default_factory=dict,
                                   description="any librdkafka setting, e.g. security.protocol, sasl.mechanism")
    schema_registry: SchemaRegistry = SchemaRegistry()
    framing: Literal["single_object", "confluent"] | None = None
    outage_timeout: Duration = Field(120_000, description="how long a job waits out a broker outage")

    _ot = field_validator("outage_timeout", mode="before")(lambda v: duration_ms(v))

    @property
    def effective_framing(self) -> str:
        return self.framing or ("confluent" if self.schema_registry.url else "single_object")

    @model_validator(mode="after")
    def _framing_needs_registry(self):
        if self.framing == "confluent" and not self.schema_registry.url:
            raise ValueError("framing 'confluent' needs kafka.schema_registry.url (or use framing: single_object)")
        return self


class Frequency(Strict):
    """How often a CTI is inserted: at every micro-batch boundary; ``events`` caps a batch."""

    events: int | None = Field(None, ge=1, description="at most this many records a micro-batch (a CTI after each)")
    time: Duration | None = Field(None, description="refused: the trigger interval (spark.trigger) sets it")

    _t = field_validator("time", mode="before")(lambda v: None if v is None else duration_ms(v))

    @field_validator("time")
    @classmethod
    def _no_time(cls, v):
        if v is not None:
            raise ValueError("frequency.time is not a separate mechanism here: a CTI is inserted at every "
                             "micro-batch boundary, so set spark.trigger (e.g. '5s') instead, and remove frequency.time")
        return v


class Cti(Strict):
    """StreamInsight AdvanceTimeSettings for one input stream. Each Kafka partition's CTI is its
    largest start − ``delay``; the stream's CTI is the minimum over its non-idle partitions."""

    delay: Duration = 0
    frequency: Frequency = Frequency()
    flush_at_end: bool = True
    policy: Literal["drop", "adjust"] = "drop"
    import_from: str | None = Field(None, description="refused: use reference.sync: import")
    idle_timeout: Duration = Field(60_000, description=(
        "processing time after which a partition with nothing to read stops holding the stream's CTI back "
        "(Flink's withIdleness); an empty partition is idle from the start. Its later events may then be late."))

    _d = field_validator("delay", mode="before")(lambda v: duration_ms(v))
    _i = field_validator("idle_timeout", mode="before")(lambda v: duration_ms(v))

    @field_validator("idle_timeout")
    @classmethod
    def _idle_positive(cls, v):
        if v <= 0:
            raise ValueError("idle_timeout must be positive, e.g. '60s' (how long a partition may have nothing "
                             "to read before it stops holding the CTI back)")
        return v


class Source(Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    topic: str
    schema_name: str = Field(alias="schema")
    key_field: str
    time_field: str
    end_field: str | None = None
    shape: Literal["point", "interval", "edge"] = "point"
    partitions: int = Field(2, ge=1, le=1024)
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = Field(None, ge=1)
    measures: list[str] = Field(default_factory=list, description="numeric fields that must be finite")
    cti: Cti = Cti()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    _topic = field_validator("topic")(lambda v: check_topic_name(v))

    @field_validator("starting_offsets")
    @classmethod
    def _offsets(cls, v: str) -> str:
        if v in ("earliest", "latest") or v.lstrip().startswith("{"):
            return v
        raise ValueError("use 'earliest', 'latest' or JSON like '{\"topic\": {\"0\": 42}}'")

    @model_validator(mode="after")
    def _shape(self):
        if self.shape == "interval" and not self.end_field:
            raise ValueError(f"source {self.name!r}: shape 'interval' needs end_field (the field with the event's end time)")
        if self.shape != "interval" and self.end_field:
            raise ValueError(f"source {self.name!r}: end_field is only for shape 'interval'")
        return self


class Window(Strict):
    events: int | None = Field(None, ge=1)
    time: Duration | None = None

    _t = field_validator("time", mode="before")(lambda v: None if v is None else duration_ms(v))

    @model_validator(mode="after")
    def _one(self):
        if (self.events is None) == (self.time is None):
            raise ValueError("give exactly one of window.events (last N events) or window.time (last T, e.g. '1h')")
        if self.time is not None and self.time <= 0:
            raise ValueError("window.time must be positive")
        return self


class CountOp(Strict):
    kind: Literal["count"]
    name: str
    window: Window
    epsilon: float = Field(0.01, gt=0, le=1)
    per_key: bool = True
    predicate: str | None = Field(None, description="expression over record fields, e.g. 'amount > 500'")
    value_field: str | None = None
    emit: Literal["per_event", "per_cti"] = "per_cti"
    output: str

    _o = field_validator("output")(lambda v: check_topic_name(v, "output"))


class BinsOp(Strict):
    kind: Literal["bins"]
    name: str
    bin_size: Duration
    origin: Duration = 0
    measures: list[str] = Field(min_length=1)
    outputs: dict[Literal["incremental", "updated", "final"], str] = Field(min_length=1)

    _b = field_validator("bin_size", "origin", mode="before")(lambda v: duration_ms(v))

    @field_validator("bin_size")
    @classmethod
    def _pos(cls, v):
        if v <= 0:
            raise ValueError("bin_size must be positive, e.g. '1m'")
        return v

    @field_validator("outputs")
    @classmethod
    def _topics(cls, v):
        for kind, topic in v.items():
            check_topic_name(topic, f"outputs.{kind}")
        return v


class MatchOp(Strict):
    kind: Literal["match"]
    name: str
    pattern: dict[str, Any]
    output: str
    timed_out: str | None = None

    _o = field_validator("output")(lambda v: check_topic_name(v, "output"))


class PassthroughOp(Strict):
    kind: Literal["passthrough"]
    name: str = "passthrough"
    output: str

    _o = field_validator("output")(lambda v: check_topic_name(v, "output"))


OperatorConfig = Annotated[Union[CountOp, BinsOp, MatchOp, PassthroughOp], Field(discriminator="kind")]


class Reference(Strict):
    """As-of join of the fast stream with a slow reference stream of edge events."""

    source: str
    fast: str
    join_field: str = Field(description="the field both sources are keyed by (their key_field): the join matches on it")
    sync: Literal["import", "min"] = "import"
    missing: Literal["emit", "hold"] = "emit"
    output: str | None = Field(None, description="topic of the enriched stream (optional)")


class Spark(Strict):
    master: str = "local[2]"
    shuffle_partitions: int = Field(2, ge=1, le=10000)
    key_groups: int = Field(8, ge=1, le=4096, description="hash(key) mod G: all keys of a group in one call")
    trigger: str = Field("1s", description="processing-time interval, or 'available_now' for a bounded run")
    checkpoint: str | None = None
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, v):
        if v != "available_now":
            duration_ms(v)
        return v

    @field_validator("conf")
    @classmethod
    def _conf(cls, v):
        if v.get("spark.speculation", "false").strip().lower() == "true":
            raise ValueError("spark.speculation must stay off: two attempts of one task would both write "
                             "their results, and the exactly-once sink cannot tell them apart; remove it")
        return v


class Outputs(Strict):
    late: str | None = None
    dead_letter: str | None = None
    partitions: int = Field(2, ge=1, le=1024)


class JobConfig(Strict):
    job: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")
    kafka: Kafka = Kafka()
    sources: list[Source] = Field(min_length=1)
    reference: Reference | None = None
    operators: list[OperatorConfig] = Field(min_length=1)
    outputs: Outputs = Outputs()
    spark: Spark = Spark()

    @model_validator(mode="after")
    def _cross(self):
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError("sources: names must be unique")
        for s in self.sources:
            if s.cti.import_from is not None:
                raise ValueError(f"sources.{s.name}.cti.import_from: CTI import is configured on the reference "
                                 "join: remove import_from and set reference.sync: import (the reference stream "
                                 "then follows the fast stream's CTIs)")
        if self.reference is not None:
            for f in ("source", "fast"):
                if getattr(self.reference, f) not in names:
                    raise ValueError(f"reference.{f}: no source named {getattr(self.reference, f)!r}")
            for f in ("source", "fast"):
                src = self.source(getattr(self.reference, f))
                if src.key_field != self.reference.join_field:
                    raise ValueError(f"reference.join_field is {self.reference.join_field!r} but source {src.name!r} "
                                     f"is keyed by {src.key_field!r}: the as-of join matches on the sources' key, so "
                                     f"set both sources' key_field and join_field to the same field")
        elif len(self.sources) > 1:
            raise ValueError("several sources need a `reference:` section saying how they are joined")
        ops = [o.name for o in self.operators]
        if len(set(ops)) != len(ops):
            raise ValueError("operators: names must be unique")
        return self

    # Derived names ---------------------------------------------------------------------
    @property
    def late_topic(self) -> str:
        return self.outputs.late or f"{self.job}.late"

    @property
    def dead_letter_topic(self) -> str:
        return self.outputs.dead_letter or f"{self.job}.dead-letter"

    @property
    def checkpoint_dir(self) -> str:
        from jobs.stack import home

        return self.spark.checkpoint or str(home() / "checkpoints" / self.job)

    def result_topics(self) -> dict[str, str]:
        """Every output topic → Avro schema name."""
        topics = {self.late_topic: "late", self.dead_letter_topic: "dead_letter"}
        for op in self.operators:
            if isinstance(op, CountOp):
                topics[op.output] = "count"
            elif isinstance(op, BinsOp):
                topics.update({t: "bin" for t in op.outputs.values()})
            elif isinstance(op, MatchOp):
                topics[op.output] = "match"
                if op.timed_out:
                    topics[op.timed_out] = "timed_out_match"
            elif isinstance(op, PassthroughOp):
                topics[op.output] = self.sources[0].schema_name
        if self.reference is not None and self.reference.output:
            topics[self.reference.output] = "enriched"
        return topics

    @property
    def key_groups(self) -> int:
        """Key groups actually used: 1 when an operator is global (it must see every event),
        else ``spark.key_groups``."""
        if any(isinstance(op, CountOp) and not op.per_key for op in self.operators):
            return 1
        return self.spark.key_groups

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)


ENV_OVERRIDES = {
    "CTIFLOW_BOOTSTRAP": ("kafka", "bootstrap_servers"),
    "CTIFLOW_SCHEMA_REGISTRY_URL": ("kafka", "schema_registry", "url"),
    "CTIFLOW_SPARK_MASTER": ("spark", "master"),
    "CTIFLOW_CHECKPOINT": ("spark", "checkpoint"),
}


def _apply_env(raw: dict) -> dict:
    for env, path in ENV_OVERRIDES.items():
        value = os.environ.get(env)
        if value:
            node = raw
            for part in path[:-1]:
                node = node.setdefault(part, {}) if isinstance(node.get(part), dict) or part not in node else node[part]
            node[path[-1]] = value
    # A password written in the file is moved to the environment: Spark options (visible in
    # plans and the UI) carry only public settings; every client adds the environment's
    # credentials itself (jobs.kafka.env_credentials).
    client = (raw.get("kafka") or {}).get("client") or {}
    if isinstance(client, dict) and client.get("sasl.password"):
        os.environ["CTIFLOW_SASL_PASSWORD"] = str(client.pop("sasl.password"))
        if client.get("sasl.username"):
            os.environ["CTIFLOW_SASL_USERNAME"] = str(client["sasl.username"])
    return raw


def _format(err: ValidationError, origin: str) -> str:
    lines = [f"{origin}: invalid job configuration"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see `ctiflow run --help` and examples/)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"  - {where}: {msg}")
    return "\n".join(lines)


def parse(raw: Any, origin: str = "<config>") -> JobConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: a job configuration must be a YAML mapping, got {type(raw).__name__}")
    try:
        return JobConfig.model_validate(_apply_env(raw))
    except ValidationError as err:
        raise ConfigError(_format(err, origin)) from None


def load(path: str | Path) -> JobConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such job configuration file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse(raw, str(path))
