"""The one configuration model: a job YAML, validated before any Spark job starts.

The CLI, the jobs and docker-compose all use it (docker-compose passes the same YAML and
overrides fields through ``CTIFLOW_*`` variables, each declared on its field: :func:`env_overrides`).
Errors name the field and the fix (see :func:`load`). A leaf: it imports only ``operators``
(the enums and settings it builds), never the Kafka, Spark or stack modules.

Each operator's config class builds its operator (:meth:`CountOp.operator` …) and names its
result topics and their schemas (:meth:`CountOp.result_topics`): adding an operator kind is one
config class here, one operator module and one schema.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, SecretStr, ValidationError, WithJsonSchema,
                      field_validator, model_validator)

from ctiflow.jobs.core.secrets import secret_keys
from ctiflow.jobs.core.text_forms import _DURATION, duration_ms, load_yaml, pattern_durations
from ctiflow.operators.count import Emit
from ctiflow.operators.errors import ConfigError
from ctiflow.operators.reference import MissingReference, SyncMode
from ctiflow.operators.time import Shape, ViolationPolicy

_TOPIC_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
def check_topic_name(name: str, field: str = "topic") -> str:
    """Kafka's topic name rules: 1–249 chars of [a-zA-Z0-9._-], not '.' or '..'."""
    if not name or len(name) > 249 or not set(name) <= _TOPIC_CHARS or name in (".", ".."):
        raise ValueError(f"{field}: {name!r} is not a valid Kafka topic name "
                         "(use 1–249 characters of a-z, A-Z, 0-9, '.', '_', '-')")
    return name


#: The most partitions ctiflow creates a topic with (a job's topics, ``ctiflow topics create``).
MAX_PARTITIONS = 1024


#: The embedded broker's port unless ``CTIFLOW_BROKER_PORT`` says otherwise.
EMBEDDED_PORT = 19092


def broker_port() -> int:
    """The embedded broker's port: ``CTIFLOW_BROKER_PORT``, else :data:`EMBEDDED_PORT`."""
    raw = os.environ.get("CTIFLOW_BROKER_PORT", "").strip()
    if not raw:
        return EMBEDDED_PORT
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ConfigError(f"CTIFLOW_BROKER_PORT={raw!r} is not a port: set it to a number from 1 to 65535, "
                          f"or unset it (default {EMBEDDED_PORT})")
    return int(raw)


def home(create: bool = True) -> Path:
    """Where ctiflow keeps its files by default (``CTIFLOW_HOME``, else ``./.ctiflow``): the
    embedded stack's pid files and logs, and checkpoints without a configured path. Created
    unless ``create`` is false (a path only: ``ctiflow check`` writes nothing)."""
    path = Path(os.environ.get("CTIFLOW_HOME", Path.cwd() / ".ctiflow"))
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def env(name: str) -> dict:
    """Field metadata: the environment variable ``name`` overrides this field (see :func:`env_overrides`)."""
    return {"json_schema_extra": {"env": name}}

#: A duration in the JSON schema: ms, or a string with a unit.
DURATION_JSON = {"anyOf": [{"type": "integer", "description": "ms"},
                           {"type": "string", "pattern": _DURATION.pattern,
                            "examples": ["500ms", "5s", "10m", "1h", "7d"]}]}
Duration = Annotated[int, WithJsonSchema(DURATION_JSON), Field(description="ms, or '5s' / '10m' / '1h'")]


def _settings_as_text(v: Any) -> Any:
    """Client and Spark settings are strings; an unquoted YAML number or boolean (``linger.ms: 5``,
    ``enable.idempotence: true``) is taken as its text (booleans lower-case, as both expect)."""
    if not isinstance(v, dict):
        return v
    out = {}
    for key, value in v.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)):
            value = str(value)
        elif not isinstance(value, str):
            raise ValueError(f"{key}: give a string, number or boolean, not {type(value).__name__}")
        out[key] = value
    return out


class Strict(BaseModel):
    # use_enum_values: choices are validated against the operators' enums; fields hold the values.
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)


#: Schema Registry client settings that are secrets (confluent-kafka's names).
REGISTRY_SECRET_KEYS = frozenset({"basic.auth.user.info", "bearer.auth.token", "bearer.auth.client.secret",
                                  "ssl.key.password", "ssl.key.location.password"})


def _without_userinfo(url: Any) -> tuple[Any, str | None]:
    """``(url without user:password@, "user:password")`` of each comma-separated URL (the
    last one's credentials win); ``(url, None)`` when it has none."""
    if not isinstance(url, str) or "@" not in url:
        return url, None
    kept, userinfo = [], None
    for one in url.split(","):
        parts = urlsplit(one.strip())
        if parts.username is None and parts.password is None:
            kept.append(one.strip())
            continue
        userinfo = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        kept.append(urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])))
    return ",".join(kept), userinfo


class SchemaRegistry(Strict):
    """A Confluent Schema Registry (optional; without one, records use Avro single-object encoding)."""

    url: str | None = Field(None, description="e.g. http://schema-registry:8081 (a user:password@ in it "
                            "moves to secrets as basic.auth.user.info)",
                            **env("CTIFLOW_SCHEMA_REGISTRY_URL"))
    config: dict[str, str] = Field(default_factory=dict, description=(
        "confluent-kafka (Python) registry client settings, e.g. ssl.ca.location, proxy; what that client "
        "refuses (e.g. the Java client's basic.auth.credentials.source) is refused before Spark starts; "
        "secrets written here (basic.auth.user.info, bearer.auth.token, ...) are kept apart like the Kafka "
        "client's"))
    secrets: dict[str, SecretStr] = Field(default_factory=dict, exclude=True, description=(
        "secret registry settings; those written in config move here (never printed, never in Spark "
        "options)"))

    _c = field_validator("config", mode="before")(lambda v: _settings_as_text(v))

    @model_validator(mode="before")
    @classmethod
    def _take_secrets(cls, data):
        """Secrets written in ``config`` move to ``secrets``; so does the userinfo of a ``url``
        (``https://user:pw@host``, which the registry client would use as basic auth): it
        becomes ``basic.auth.user.info`` and the url loses it. Nothing else is added: the Python
        client takes basic auth from ``basic.auth.user.info`` alone and refuses the Java client's
        ``basic.auth.credentials.source`` ("Unrecognized properties")."""
        if not isinstance(data, dict):
            return data
        config = dict(data["config"]) if isinstance(data.get("config"), dict) else {}
        moved = {k: str(config.pop(k)) for k in sorted(REGISTRY_SECRET_KEYS & set(config))}
        url, userinfo = _without_userinfo(data.get("url"))
        if userinfo is not None:
            moved.setdefault("basic.auth.user.info", userinfo)
            data = {**data, "url": url}
        if moved or "config" in data:
            data = {**data, "config": config, "secrets": {**moved, **(data.get("secrets") or {})}}
        return data

    def client_config(self) -> dict[str, str]:
        """Every registry client setting, secrets included: for this process's client only."""
        return {**self.config, **{k: v.get_secret_value() for k, v in self.secrets.items()}}


class Kafka(Strict):
    """The Kafka cluster: connection, client settings, credentials, framing."""

    bootstrap_servers: str = Field(default_factory=lambda: f"127.0.0.1:{broker_port()}", description=(
        "host:port[,host:port]; default: the embedded broker (127.0.0.1, port CTIFLOW_BROKER_PORT or 19092)"),
        **env("CTIFLOW_BOOTSTRAP"))
    client: dict[str, str] = Field(default_factory=dict, description=(
        "any librdkafka setting, e.g. security.protocol, sasl.mechanism; secrets written here (every "
        "property librdkafka itself redacts as sensitive: sasl.password, ssl.key.password, "
        "sasl.oauthbearer.assertion.private.key.passphrase, ...) are kept apart and never reach Spark "
        "options, logs or errors"))
    sasl_username: str | None = Field(None, description="SASL user (with sasl_password: SASL/SCRAM-SHA-256 "
                                      "unless client sets security.protocol / sasl.mechanism)",
                                      **env("CTIFLOW_SASL_USERNAME"))
    sasl_password: SecretStr | None = Field(None, exclude=True, description="SASL password (never printed)",
                                            **env("CTIFLOW_SASL_PASSWORD"))
    schema_registry: SchemaRegistry = SchemaRegistry()
    framing: Literal["single_object", "confluent"] | None = Field(
        None, description="how values are framed; default: confluent with a schema registry, else "
                          "single_object")
    outage_timeout: Duration = Field(120_000, description="how long a job waits out a broker outage")

    client_secrets: dict[str, SecretStr] = Field(default_factory=dict, exclude=True, description=(
        "secret librdkafka settings (ssl.key.password, ...); those written in client move here"))

    _ot = field_validator("outage_timeout", mode="before")(lambda v: duration_ms(v))
    _c = field_validator("client", mode="before")(_settings_as_text)

    @model_validator(mode="before")
    @classmethod
    def _take_secrets(cls, data):
        """Secrets written in ``client`` move out of it (to sasl_password / client_secrets):
        excluded from dumps, never in Spark options."""
        if isinstance(data, dict) and isinstance(data.get("client"), dict):
            client = dict(data["client"])
            secrets = {k: str(client.pop(k)) for k in sorted(secret_keys() & set(client))}
            data = {**data, "client": client}
            if "sasl.password" in secrets:
                data.setdefault("sasl_password", secrets.pop("sasl.password"))
                if "sasl.username" in secrets:  # librdkafka counts the user as sensitive too
                    data.setdefault("sasl_username", secrets.pop("sasl.username"))
            if secrets:
                data["client_secrets"] = {**secrets, **(data.get("client_secrets") or {})}
        return data

    @property
    def credentials(self) -> dict[str, str]:
        """The librdkafka settings that carry secrets (SASL from sasl_username/sasl_password)."""
        creds = {k: v.get_secret_value() for k, v in self.client_secrets.items()}
        if self.sasl_username and self.sasl_password:
            creds.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                          "sasl.username": self.sasl_username,
                          "sasl.password": self.sasl_password.get_secret_value()})
        return creds

    def client_config(self) -> dict[str, str]:
        """Every client setting, credentials included: pass it to this process's Kafka clients
        explicitly. Never put it in Spark options: those get :attr:`client` (public settings)."""
        return {**self.credentials, **self.client}

    @property
    def effective_framing(self) -> str:
        return self.framing or ("confluent" if self.schema_registry.url else "single_object")

    @model_validator(mode="after")
    def _framing_needs_registry(self):
        if self.framing == "confluent" and not self.schema_registry.url:
            raise ValueError("framing 'confluent' needs kafka.schema_registry.url (or use framing: "
                             "single_object)")
        return self


class FrequencyConfig(Strict):
    """How often a CTI is inserted: at every micro-batch boundary; ``events`` caps a batch."""

    events: int | None = Field(None, ge=1, description=(
        "at most this many records a micro-batch (a CTI after each)"))
    time: Duration | None = Field(None, description="refused: the trigger interval (spark.trigger) sets it")

    _t = field_validator("time", mode="before")(lambda v: None if v is None else duration_ms(v))

    @field_validator("time")
    @classmethod
    def _no_time(cls, v):
        if v is not None:
            raise ValueError("frequency.time is not a separate mechanism here: a CTI is inserted at every "
                             "micro-batch boundary, so set spark.trigger (e.g. '5s') instead, and remove "
                             "frequency.time")
        return v


class CtiConfig(Strict):
    """StreamInsight AdvanceTimeSettings for one input stream. Each Kafka partition's CTI is its
    largest start − ``delay``; the stream's CTI is the minimum over its non-idle partitions."""

    delay: Duration = Field(0, description=(
        "how far behind its partition's newest event an event may arrive, e.g. '5m'"))
    frequency: FrequencyConfig = FrequencyConfig()
    flush_at_end: bool = Field(True, description=(
        "a bounded run ends with the final CTI (+∞): every result final"))
    policy: ViolationPolicy = Field(ViolationPolicy.DROP, description=(
        "an event behind the CTI: drop (to the late topic), or adjust (an interval is clipped to the CTI)"))
    import_from: str | None = Field(None, description="refused: use reference.sync: import")
    idle_timeout: Duration = Field(60_000, description=(
        "processing time after which a partition with nothing to read stops holding the stream's CTI back "
        "(Flink's withIdleness); an empty partition is idle from the start. Its later events may then be "
        "late."))

    _d = field_validator("delay", mode="before")(lambda v: duration_ms(v))
    _i = field_validator("idle_timeout", mode="before")(lambda v: duration_ms(v))

    @field_validator("idle_timeout")
    @classmethod
    def _idle_positive(cls, v):
        if v < 1000:
            raise ValueError("idle_timeout must be at least '1s', e.g. '60s' (how long a partition may have "
                             "nothing to read before it stops holding the CTI back; shorter, a partition "
                             "turns idle between two reads and its next events are late)")
        return v


#: Records a micro-batch reads at most when neither max_offsets_per_trigger nor frequency.events says.
DEFAULT_BATCH_RECORDS = 200_000


class Source(Strict):
    """An input topic: its Avro schema, the entity key, the event time, and its CTI settings."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="the stream's name in the job")
    topic: str
    schema_name: str = Field(alias="schema", description=(
        "an Avro schema in schemas/ (file stem), e.g. transaction"))
    key_field: str = Field(description="the entity key: operators keep state per key, the join matches on it")
    time_field: str = Field(description="event time (ms since 1970); the start of an interval")
    end_field: str | None = Field(None, description="shape interval only: the field with the end time")
    shape: Shape = Field(Shape.POINT, description=(
        "point: one instant; interval: start–end; edge: valid until the next version of its key"))
    partitions: int = Field(2, ge=1, le=MAX_PARTITIONS, description=(
        "partitions when ctiflow creates the topic"))
    starting_offsets: str = Field("earliest", description=(
        "earliest, latest, or JSON {topic: {partition: offset}}"))
    ending_offsets: str = Field("latest", description=(
        "a bounded run's (--until-end) end: latest (each partition's end when the run starts) or JSON "
        "{topic: {partition: offset}}, the offset after the last record read (-1: latest); a partition "
        "left out is read to its end"))
    max_offsets_per_trigger: int | None = Field(None, ge=1, description=(
        f"at most this many records a micro-batch (default {DEFAULT_BATCH_RECORDS:,}: a backlog is read in "
        "batches of this size, not all at once)"))
    measures: list[str] = Field(default_factory=list, description="numeric fields that must be finite")
    cti: CtiConfig = CtiConfig()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    _topic = field_validator("topic")(lambda v: check_topic_name(v))

    @property
    def batch_records(self) -> int:
        """The most records one micro-batch reads from this source."""
        return self.max_offsets_per_trigger or self.cti.frequency.events or DEFAULT_BATCH_RECORDS

    @field_validator("starting_offsets", "ending_offsets")
    @classmethod
    def _offsets(cls, v: str, info) -> str:
        starting = info.field_name == "starting_offsets"
        if v in (("earliest", "latest") if starting else ("latest",)):
            return v
        example = (("use 'earliest', 'latest'" if starting else "use 'latest'")
                   + " or JSON like '{\"topic\": {\"0\": 42}}' (partition → offset; "
                   + ("-2 earliest, " if starting else "") + "-1 latest)")
        try:
            parsed = json.loads(v)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc}); {example}") from None
        if not isinstance(parsed, dict) or not all(isinstance(p, dict) for p in parsed.values()):
            raise ValueError(example)
        for parts in parsed.values():
            for part, offset in parts.items():
                if not part.lstrip("-").isdigit() or int(part) < 0:
                    raise ValueError(f"partition {part!r} is not a partition number; {example}")
                lowest = -2 if starting else -1
                if isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest:
                    raise ValueError(f"offset {offset!r} of partition {part} is not an offset; {example}")
        return v

    @model_validator(mode="after")
    def _offsets_topic(self):
        for name, given in (("starting_offsets", self.starting_offsets),
                            ("ending_offsets", self.ending_offsets)):
            if given not in ("earliest", "latest") and set(json.loads(given)) != {self.topic}:
                raise ValueError(f"source {self.name!r}: {name} names {sorted(json.loads(given))}, but "
                                 f"the source reads {self.topic!r}: give offsets for {self.topic!r} only")
        return self

    @model_validator(mode="after")
    def _shape(self):
        if self.shape == "interval" and not self.end_field:
            raise ValueError(f"source {self.name!r}: shape 'interval' needs end_field (the field with the "
                             "event's end time)")
        if self.shape != "interval" and self.end_field:
            raise ValueError(f"source {self.name!r}: end_field is only for shape 'interval'")
        return self


class Window(Strict):
    """The sliding window of a count: exactly one of the last ``events`` events or the last ``time``."""

    events: int | None = Field(None, ge=1, description=(
        "the last N events (never expire: bound them with a key TTL)"))
    time: Duration | None = Field(None, description="the last T of application time, e.g. '1h'")

    _t = field_validator("time", mode="before")(lambda v: None if v is None else duration_ms(v))

    @model_validator(mode="after")
    def _one(self):
        if (self.events is None) == (self.time is None):
            raise ValueError("give exactly one of window.events (last N events) or window.time (last T, "
                             "e.g. '1h')")
        if self.time is not None and self.time <= 0:
            raise ValueError("window.time must be positive")
        return self


class OperatorSettings(Strict):
    """What every operator's configuration declares besides its own settings (the planner,
    :mod:`ctiflow.jobs.driver.planner`, builds the operator from them)."""

    #: a global operator must see every event (then the job has one key group)
    needs_every_key: ClassVar[bool] = False
    #: the operator passes input records on unchanged: the source keeps every record's bytes
    passes_records: ClassVar[bool] = False
    #: something of the operator reads the records' fields in the stateful stage
    reads_fields: ClassVar[bool] = True

    @property
    def ruled(self) -> bool:
        """The operator takes rules from a rules topic (a match operator with ``rules:``)."""
        return False


class CountOp(OperatorSettings):
    """Approximate count (or sum) of interesting events in a sliding window: an exponential
    histogram with relative error ≤ ``epsilon`` (Datar et al.), per key or over all keys."""

    kind: Literal["count"]
    name: str
    window: Window
    epsilon: float = Field(0.01, gt=0, le=1, description="the largest relative error of an estimate")
    per_key: bool = Field(True, description="one count per key; false: one global count (one key group)")
    predicate: str | None = Field(None, description="expression over record fields, e.g. 'amount > 500'")
    value_field: str | None = Field(None, description=(
        "sum this non-negative integer field instead of counting"))
    emit: Emit = Field(Emit.PER_CTI, description=(
        "per_cti: the touched keys' counts at each CTI (final); per_event: one per event"))
    output: str

    _o = field_validator("output")(lambda v: check_topic_name(v, "output"))

    def roles(self) -> dict[str, str]:
        return {"count": self.output}

    def result_topics(self, job: "JobConfig") -> dict[str, str]:
        return {self.output: "count"}

    @property
    def needs_every_key(self) -> bool:
        return not self.per_key



class BinsOp(OperatorSettings):
    """Prorate each event's measures over fixed time bins by overlap (StreamInsight's proration)."""

    kind: Literal["bins"]
    name: str
    bin_size: Duration
    origin: Duration = Field(0, description="bins are (origin + k·bin_size, origin + (k+1)·bin_size]")
    measures: list[str] = Field(min_length=1, description="numeric fields to prorate")
    outputs: dict[Literal["incremental", "updated", "final"], str] = Field(min_length=1, description=(
        "result topics per kind: incremental (each event's share), updated (a bin's running total), "
        "final (once the CTI passes a bin's end)"))

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

    def roles(self) -> dict[str, str]:
        return {f"bin_{k}": t for k, t in self.outputs.items()}

    def result_topics(self, job: "JobConfig") -> dict[str, str]:
        return {t: "bin" for t in self.outputs.values()}




def _pattern_json_schema() -> dict:
    """The JSON schema of a declarative pattern (:mod:`ctiflow.operators.cep.declarative`), for editors
    and ``ctiflow schemas job`` (a group's inner stages are typed as objects: JSON schema
    recursion would need a ``$defs`` entry the model's generator does not know)."""
    from ctiflow.operators.cep.declarative import CONTIGUITY, NEGATION, SKIPS
    from ctiflow.operators.cep.pattern import WithinType

    within_types = {"enum": [t.value for t in WithinType]}
    count = {"type": "integer", "minimum": 0, "maximum": 1000}
    stage = {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "description": "one stage of a pattern (Flink's Pattern API, snake_case)",
        "properties": {
            "name": {"type": "string"}, "contiguity": {"enum": sorted(CONTIGUITY)},
            "negation": {"enum": sorted(NEGATION)},
            "where": {"type": "string", "description": "an expression over the record's fields"},
            "or": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "until": {"type": "string"}, "subtype": {"type": "string"},
            "quantifier": {"anyOf": [
                {"enum": ["one", "optional", "one_or_more", "zero_or_more"]},
                {"type": "object", "additionalProperties": False, "required": ["times"], "properties": {
                    "times": {"anyOf": [count, {"type": "array", "items": count, "minItems": 2,
                                                "maxItems": 2}]}}},
                {"type": "object", "additionalProperties": False, "required": ["times_or_more"],
                 "properties": {"times_or_more": count}}]},
            "greedy": {"type": "boolean"}, "consecutive": {"type": "boolean"},
            "allow_combinations": {"type": "boolean"}, "optional": {"type": "boolean"},
            "window": DURATION_JSON, "window_ms": {"type": "integer", "minimum": 0},
            "within": DURATION_JSON, "within_ms": {"type": "integer", "minimum": 0},
            "within_type": within_types,
            "group": {"type": "array", "minItems": 1,
                      "description": "the stages of a group (each as a stage)",
                      "items": {"type": "object"}},
        }}
    pattern = {
        "type": "object", "additionalProperties": False, "required": ["stages"],
        "properties": {
            "name": {"type": "string"}, "within": DURATION_JSON,
            "within_ms": {"type": "integer", "minimum": 0}, "within_type": within_types,
            "skip": {"anyOf": [{"enum": list(SKIPS)}, {"type": "object", "properties": {
                "skip_to_first": {"type": "string"}, "skip_to_last": {"type": "string"},
                "throw_on_miss": {"type": "boolean"}}}]},
            "stages": {"type": "array", "minItems": 1, "items": stage},
        }}
    return pattern


def _has_within(spec: Any) -> bool:
    """The pattern, or one of its stages, bounds its runs in time."""
    if not isinstance(spec, dict):
        return False
    return spec.get("within_ms") is not None or any(
        _has_within(stage) for key in ("stages", "group")
        for stage in (spec.get(key) if isinstance(spec.get(key), list) else []))


class RulesConfig(Strict):
    """Rules that change at a CTI (docs/concepts/rules.md): patterns put, replaced and deleted
    through a rules topic while the job runs, each version judging the events from its effective
    time on."""

    topic: str = Field(description=(
        "the rules topic (records of schemas/rule.avsc; `ctiflow rules put` writes them)"))
    on_change: Literal["drain", "cut"] = Field("drain", description=(
        "a version's runs in flight when the next version takes effect: drain (judged by it to their end) or "
        "cut (discarded at that time)"))
    late_rules: Literal["reject", "adjust"] = Field("reject", description=(
        "a rule whose effective_time the CTI has passed: reject (dead-letter topic, the previous version "
        "stays) or adjust (takes effect at the CTI; the records carry the time it took effect)"))
    sync: SyncMode = Field(SyncMode.IMPORT, description=(
        "import: the job never waits for the rules topic; min: events are not released past the rules "
        "stream's CTI (a deterministic backfill)"))
    language: Literal["pattern", "sql"] | None = Field(None, description=(
        "what the rules' definitions are: pattern (YAML of the Pattern API) or sql (MATCH_RECOGNIZE); "
        "default: the operator's own pattern or sql"))
    max_rules: int = Field(1000, ge=1, le=100_000, description="rule ids with a live version at once")
    idle_timeout: Duration = Field(60_000, description=(
        "with sync: min, how long the rules topic may have nothing new before it stops holding the CTI back"))

    _t = field_validator("topic")(lambda v: check_topic_name(v, "rules.topic"))
    _i = field_validator("idle_timeout", mode="before")(lambda v: duration_ms(v))


class MatchOp(OperatorSettings):
    """Complex-event pattern matching with Flink CEP's semantics, per key."""

    kind: Literal["match"]
    name: str
    pattern: Annotated[dict[str, Any] | None, WithJsonSchema(
        {"anyOf": [_pattern_json_schema(), {"type": "null"}]})] = Field(None, description=(
        "Flink's Pattern API as YAML (operators/cep/declarative.py); `within` / `window` take durations like "
        "'10m' (or ms as within_ms / window_ms). Give this or sql"))
    sql: str | None = Field(None, description=(
        "instead of pattern: SELECT * FROM <source> MATCH_RECOGNIZE (PARTITION BY <key field>[, …] "
        "ORDER BY <time field>[, …] MEASURES … PATTERN (…) DEFINE …), Flink's row pattern "
        "recognition; the output topic's records are the partition columns and the measures, typed "
        "(`ctiflow schemas derived JOB.yaml` prints the schema)"))
    output: str
    timed_out: str | None = Field(None, description=(
        "topic for partial matches whose `within` expired (optional)"))
    max_partial_matches: int | None = Field(10_000, ge=1, le=10_000_000, description=(
        "at most this many partial matches (runs in flight) per key; an event arriving while its key "
        "holds more goes to the dead-letter topic (counted as refused) instead of growing the state; "
        "null: no bound"))
    max_buffered_events: int | None = Field(100_000, ge=1, le=100_000_000, description=(
        "at most this many events kept per key for its partial matches (what the key's state bytes grow "
        "with); an event arriving while its key keeps more goes to the dead-letter topic likewise; null: "
        "no bound"))
    rules: RulesConfig | None = Field(None, description=(
        "patterns from a rules topic besides (or instead of) pattern / sql, each taking effect at an "
        "application time (docs/concepts/rules.md)"))

    _p = field_validator("pattern", mode="before")(lambda v: pattern_durations(v, "pattern"))

    _o = field_validator("output")(lambda v: check_topic_name(v, "output"))

    @model_validator(mode="after")
    def _one_form(self):
        if self.pattern is not None and self.sql is not None or (
                self.pattern is None and self.sql is None and self.rules is None):
            raise ValueError(f"operators.{self.name}: give exactly one of pattern (Flink's Pattern API "
                             "as YAML) or sql (a MATCH_RECOGNIZE query), or rules")
        if self.rules is not None and self.rules.language is not None and (
                (self.rules.language == "sql") != (self.sql is not None) and (self.pattern or self.sql)):
            raise ValueError(f"operators.{self.name}.rules.language: {self.rules.language!r} rules need the "
                             "operator's own definition in the same language "
                             f"({'sql' if self.rules.language == 'sql' else 'pattern'}): one operator writes "
                             "one record shape")
        return self

    @property
    def language(self) -> str:
        """``pattern`` or ``sql``: what the operator's definitions (its own and its rules') are."""
        if self.sql is not None:
            return "sql"
        if self.pattern is not None:
            return "pattern"
        return self.rules.language or "pattern"

    @property
    def rules_stream(self) -> str | None:
        """The job-internal stream name of the operator's rules topic."""
        return None if self.rules is None else "rules_" + re.sub(r"[^A-Za-z0-9_]", "_", self.name)

    @property
    def ruled(self) -> bool:
        return self.rules is not None

    def roles(self) -> dict[str, str]:
        return {"match": self.output, **({"timed_out": self.timed_out} if self.timed_out else {})}

    @property
    def bounded(self) -> bool:
        """The pattern bounds its runs in time (``within``, or the query's ``WITHIN``)."""
        if self.pattern is None and self.sql is None:
            return True  # rules only: each rule is checked as it arrives
        if self.pattern is not None:
            return _has_within(self.pattern)
        from ctiflow.operators.cep.expr.vocabulary import SqlError
        from ctiflow.operators.cep.sql.parse import parse

        try:
            return parse(self.sql).within_ms is not None
        except SqlError:
            return True  # the operator's own check reports the query

    @property
    def schema_name(self) -> str:
        """The output topic's record schema: ``match``, or one derived from the query's MEASURES."""
        if self.rules is not None and self.language == "sql":
            return "ruled_recognize"
        return "match" if self.sql is None else "recognize_" + re.sub(r"[^A-Za-z0-9_]", "_", self.name)

    def result_topics(self, job: "JobConfig") -> dict[str, str]:
        """With rules, records name their rule (``ruled_…`` schemas: the match record plus ``rule_id``,
        ``rule_version``, ``rule_effective_time``; a sql operator's measures as name/value pairs)."""
        ruled = "ruled_" if self.rules is not None else ""
        matches = self.schema_name if self.language == "sql" else ruled + matched_events_schema(job, "match")
        return {self.output: matches,
                **({self.timed_out: ruled + matched_events_schema(job, "timed_out_match")} if self.timed_out
                   else {})}




def matched_events_schema(job: "JobConfig", base: str) -> str:
    """The record schema of a job's match (``base`` = ``match``) or timed-out match
    (``timed_out_match``) records: ``schemas/<base>.avsc`` with each event typed as the matched
    stream's record — the source's, or with a reference join the enriched one — so it is named
    after that stream (every match operator of a job shares it; ``ctiflow.jobs.driver.recognize``
    derives it)."""
    stream = job.reference.fast if job.reference else job.sources[0].name
    return f"{base}_{re.sub(r'[^A-Za-z0-9_]', '_', stream)}" + ("_enriched" if job.reference else "")


class PassthroughOp(OperatorSettings):
    """Every event unchanged, in application-time order (records keep their Avro bytes)."""

    kind: Literal["passthrough"]
    name: str = "passthrough"
    output: str

    _o = field_validator("output")(lambda v: check_topic_name(v, "output"))

    def roles(self) -> dict[str, str]:
        return {"passthrough": self.output}

    def result_topics(self, job: "JobConfig") -> dict[str, str]:
        return {self.output: job.sources[0].schema_name}

    passes_records: ClassVar[bool] = True
    reads_fields: ClassVar[bool] = False  # (their fields: only for late records)



OperatorConfig = Annotated[Union[CountOp, BinsOp, MatchOp, PassthroughOp], Field(discriminator="kind")]


class Reference(Strict):
    """As-of join of the fast stream with a slow reference stream of edge events."""

    source: str = Field(description="the reference source (shape edge: each version valid until the next)")
    fast: str = Field(description="the event source it enriches")
    join_field: str = Field(description=(
        "the field both sources are keyed by (their key_field): the join matches on it"))
    sync: SyncMode = Field(SyncMode.IMPORT, description=(
        "import: the reference stream follows the fast stream's CTIs; min: the older of both "
        "(StreamInsight's join)"))
    missing: MissingReference = Field(MissingReference.EMIT, description=(
        "a fast event with no reference version: emit it unenriched, or hold it until one arrives"))
    output: str | None = Field(None, description="topic of the enriched stream (optional)")


#: The default master: two cores, and four attempts per task like a cluster's default
#: (``spark.task.maxFailures``; Spark's ``local[N]`` gives a task one). Why: a Python worker can
#: crash outside ctiflow's code — librdkafka dereferences a null topic name when a Fetch response
#: names a topic id the client does not know and carries a new leader (the embedded broker answers
#: so for a topic deleted and created again); the task's retry reads the markers its failed
#: attempt left and writes nothing twice. The crash is named in Spark's log
#: (:mod:`ctiflow.jobs.datapath.spark_daemon`).
LOCAL_MASTER = "local[2,4]"


class Spark(Strict):
    """Where and how the job runs in Spark."""

    master: str = Field(LOCAL_MASTER, description=(
        "local[N,F] (N cores; F attempts a task gets, as a cluster's spark.task.maxFailures, 4: a task "
        "whose Python worker crashed runs again and the sink's markers keep its records exactly once; "
        "local[N] gives one), or spark://host:7077 for a cluster"), **env("CTIFLOW_SPARK_MASTER"))
    shuffle_partitions: int | None = Field(None, ge=1, le=10000, description=(
        "tasks of the stateful stage: size it to the cluster's cores for the job (fixed for a checkpoint); "
        "default: 2, or 1 when an operator sees every key (the job then has one key group, and a second "
        "task would only be idle)"))
    key_groups: int | None = Field(None, ge=1, le=4096, description=(
        "crc32(key) mod G: the keys of a group are processed in one call and stored together; default: "
        "shuffle_partitions (one group per task of the stateful stage). More groups than partitions only "
        "spread work more evenly; fewer leave tasks idle. Fixed for a checkpoint (a change is refused)"))
    trigger: str = Field("1s", description="processing-time interval, or 'available_now' for a bounded run")
    checkpoint: str | None = Field(None, description="checkpoint directory (default: "
                                   "$CTIFLOW_HOME/checkpoints/<job>); shared by every executor in a cluster",
                                   **env("CTIFLOW_CHECKPOINT"))
    conf: dict[str, str] = Field(default_factory=dict, description="any Spark setting")

    _c = field_validator("conf", mode="before")(_settings_as_text)

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


class StateConfig(Strict):
    """What the job keeps per key."""

    ttl: Duration | None = Field(None, description=(
        "drop a key's state once the CTI is this far past the key's latest event (application time, e.g. "
        "'7d'); its next event starts afresh. The only bound on event-count windows (window.events) and on "
        "patterns without within_ms; time windows, finished bins and idle patterns are dropped without it"))

    chunk_keys: int = Field(8192, ge=1, le=1_000_000, description=(
        "keyed state is stored in chunks of about this many keys (split as keys grow); a micro-batch reads "
        "and writes only the chunks it has events for or whose next window, bin or timeout its CTI reaches, "
        "and writes of a chunk only the keys it changed (its delta). Each touched chunk costs a state-store "
        "call and a round of each operator, so larger chunks are cheaper while chunks stay decoded between "
        "batches (state.cache_chunks); smaller ones read less after a restart, when a chunk is read whole "
        "for any of its keys, and keep fewer quiet keys decoded in memory where few of many keys are active. "
        "Sparse keys (a batch's events nearly all of different keys) want 16384 to 65536 "
        "(docs/performance.md#keyed-state-with-sparse-keys-dev-bench-scale-sparse); may change between runs "
        "(chunks already stored keep their size until they split)"))

    delta_share: float = Field(0.5, ge=0, le=4, description=(
        "a state chunk a micro-batch changed is stored as the state of the keys that batch changed (a frame "
        "of its delta, after those of the batches since it was last written whole), until the frames would "
        "pass this share of the whole chunk's bytes (or number 32); then it is written whole again. Bytes "
        "written a batch follow the keys it changed, not the chunks it touched (sparse keys: "
        "docs/performance.md#latency); a larger share writes chunks whole less often and makes a chunk read "
        "from the store absorb more frames. Sparse keys (each batch changes a few per cent of every "
        "chunk's keys) want 1 to 2: a chunk written whole makes the Python worker that ran its key group a "
        "few batches ago read it whole, where a frame is absorbed "
        "(docs/performance.md#keyed-state-with-sparse-keys-dev-bench-scale-sparse); chunks under 4 KiB are "
        "always whole; 0 = always whole; may change between runs"))

    cache_chunks: int = Field(4096, ge=0, le=10_000_000, description=(
        "decoded state chunks each Python worker keeps between micro-batches (most recently used first), "
        "used instead of reading and decoding them again while the state store holds exactly what that "
        "worker committed (a token in the key group's header proves it; a replayed batch or another worker "
        "reads the store). Memory: up to this many chunks' decoded state per worker, each of up to about "
        "state.chunk_keys keys, the quiet keys of a touched chunk included (lower it where keys are many "
        "and a worker's memory is tight); 0 = none; may change between runs"))

    _t = field_validator("ttl", mode="before")(lambda v: None if v is None else duration_ms(v))

    @field_validator("ttl")
    @classmethod
    def _positive(cls, v):
        if v is not None and v <= 0:
            raise ValueError("state.ttl must be positive, e.g. '7d' (or leave it out: keys are kept)")
        return v


class Outputs(Strict):
    """The job's own topics, and the partitions of every result topic ctiflow creates."""

    late: str | None = Field(None, description="late events (default: <job>.late)")
    dead_letter: str | None = Field(None, description=(
        "records that did not decode, validate or process (default: <job>.dead-letter)"))
    partitions: int = Field(2, ge=1, le=MAX_PARTITIONS)


class Metrics(Strict):
    """Prometheus metrics of the running job (:mod:`ctiflow.jobs.driver.metrics`), served by its driver
    process."""

    port: int | None = Field(None, ge=0, le=65535, description=(
        "serve Prometheus metrics at http://<host>:<port>/metrics (0: any free port, printed at start); "
        "null: off (the embedded default; docker compose turns it on)"), **env("CTIFLOW_METRICS_PORT"))
    host: str = Field("127.0.0.1", description=(
        "the address the metrics endpoint listens on: 127.0.0.1 on a host, 0.0.0.0 in a container (for "
        "Prometheus on the compose network)"), **env("CTIFLOW_METRICS_HOST"))
    spark_ui_port: int | None = Field(None, ge=1, le=65535, description=(
        "also Spark's own metrics: the driver's UI on this port with Spark's Prometheus servlet "
        "(/metrics/prometheus, /metrics/executors/prometheus); null: Spark's UI stays off"),
        **env("CTIFLOW_SPARK_UI_PORT"))


def marker_topic(job: str) -> str:
    """A job's marker topic: where its sink's tasks leave their replay markers
    (:mod:`ctiflow.jobs.datapath.sink`)."""
    return f"{job}.ctiflow-markers"


def progress_topic(job: str) -> str:
    """A job's progress topic: a record of counters per micro-batch
    (:class:`ctiflow.jobs.driver.checkpoint.ProgressLog`)."""
    return f"{job}.ctiflow-progress"


class JobConfig(Strict):
    """A job: Kafka sources → CTIs → [reference join] → operators → result topics."""

    job: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")
    kafka: Kafka = Field(default_factory=Kafka)
    sources: list[Source] = Field(min_length=1)
    reference: Reference | None = None
    operators: list[OperatorConfig] = Field(min_length=1)
    outputs: Outputs = Outputs()
    state: StateConfig = StateConfig()
    spark: Spark = Spark()
    metrics: Metrics = Metrics()

    @model_validator(mode="after")
    def _cross(self):
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError("sources: names must be unique")
        for s in self.sources:
            if s.cti.import_from is not None:
                raise ValueError(f"sources.{s.name}.cti.import_from: CTI import is configured on the "
                                 "reference join: remove import_from and set reference.sync: import (the "
                                 "reference stream then follows the fast stream's CTIs)")
        if self.reference is not None:
            ends = {"source": self.reference.source, "fast": self.reference.fast}
            for f, name in ends.items():
                if name not in names:
                    raise ValueError(f"reference.{f}: no source named {name!r}")
            for name in ends.values():
                src = self.source(name)
                if src.key_field != self.reference.join_field:
                    raise ValueError(f"reference.join_field is {self.reference.join_field!r} but source "
                                     f"{src.name!r} is keyed by {src.key_field!r}: the as-of join matches "
                                     "on the sources' key, so set both sources' key_field and join_field to "
                                     "the same field")
        elif len(self.sources) > 1:
            raise ValueError("several sources need a `reference:` section saying how they are joined")
        ops = [o.name for o in self.operators]
        if len(set(ops)) != len(ops):
            raise ValueError("operators: names must be unique")
        ruled = [o for o in self.operators if o.ruled]
        topics = [o.rules.topic for o in ruled]
        if len(set(topics)) != len(topics):
            raise ValueError("operators.*.rules.topic: each operator with rules needs a rules topic of its "
                             "own")
        for o in ruled:
            if o.rules.topic in {s.topic for s in self.sources}:
                raise ValueError(f"operators.{o.name}.rules.topic: {o.rules.topic!r} is a source's topic; "
                                 "give the rules a topic of their own")
            if o.rules_stream in names:
                raise ValueError(f"sources: the name {o.rules_stream!r} is the stream of "
                                 f"operators.{o.name}'s rules; rename the source")
        return self

    @property
    def rule_sources(self) -> list["Source"]:
        """Each rules topic as a source the job reads (every key group gets every rule record)."""
        return [Source(name=o.rules_stream, topic=o.rules.topic, schema="rule", key_field="rule_id",
                       time_field="effective_time", partitions=1,
                       cti=CtiConfig(delay=0, idle_timeout=o.rules.idle_timeout))
                for o in self.operators if o.ruled]

    @property
    def read_sources(self) -> list["Source"]:
        """Every topic the job reads as a source: its sources, then its rules topics."""
        return [*self.sources, *self.rule_sources]

    def topic_errors(self) -> list[str]:
        """Outputs sharing a topic share its record schema (several counts or matches into one
        topic is fine: their records name their operator), and no output is an input: a topic
        with two record schemas (a batch that can never be written) or an output read back as
        input (a feedback loop) is refused here, before anything runs."""
        uses = [(self.late_topic, "late", "outputs.late"),
                (self.dead_letter_topic, "dead_letter", "outputs.dead_letter")]
        for op in self.operators:
            schemas = op.result_topics(self)
            uses += [(topic, schemas[topic], f"operators.{op.name} ({role} output)")
                     for role, topic in op.roles().items()]
        if self.reference is not None and self.reference.output:
            uses.append((self.reference.output, "enriched", "reference.output"))
        inputs = {s.topic: f"sources.{s.name}.topic" for s in self.sources}
        inputs.update({o.rules.topic: f"operators.{o.name}.rules.topic" for o in self.operators
                       if o.ruled})
        writers: dict[str, tuple[str, str]] = {}
        errors = []
        for topic, schema, where in uses:
            if topic in inputs:
                errors.append(f"{where}: topic {topic!r} is also the input {inputs[topic]}: the job would "
                              "read its own output back (a feedback loop); write to another topic")
                continue
            first = writers.setdefault(topic, (schema, where))
            if first[0] != schema:
                errors.append(f"{where}: topic {topic!r} already gets {first[0]!r} records from {first[1]}, "
                              f"this output writes {schema!r} records: one topic holds one record schema; "
                              "give this output a topic of its own")
        return errors

    def warnings(self) -> list[str]:
        """What is allowed but probably not meant (printed by ``run`` and ``check``)."""
        found = []
        if self.state.ttl is None:
            for op in self.operators:
                if isinstance(op, MatchOp) and not op.bounded:
                    found.append(f"operators.{op.name}: the pattern has no within and state.ttl is not set: "
                                 "a partial match that never completes stays in the state for ever (up to "
                                 "max_partial_matches per key); give the pattern a within "
                                 "(e.g. within: 10m) or set state.ttl")
        return found

    # Derived names ---------------------------------------------------------------------
    @property
    def marker_topic(self) -> str:
        return marker_topic(self.job)

    @property
    def progress_topic(self) -> str:
        return progress_topic(self.job)

    @property
    def late_topic(self) -> str:
        return self.outputs.late or f"{self.job}.late"

    @property
    def dead_letter_topic(self) -> str:
        return self.outputs.dead_letter or f"{self.job}.dead-letter"

    @property
    def checkpoint_dir(self) -> str:
        return self.spark.checkpoint or str(home(create=False) / "checkpoints" / self.job)

    def result_topics(self) -> dict[str, str]:
        """Every output topic → Avro schema name."""
        topics = {self.late_topic: "late", self.dead_letter_topic: "dead_letter"}
        for op in self.operators:
            topics.update(op.result_topics(self))
        if self.reference is not None and self.reference.output:
            topics[self.reference.output] = "enriched"
        return topics

    def topics(self) -> dict[str, int]:
        """Every topic the job reads or writes → the partitions ctiflow creates it with."""
        return {s.topic: s.partitions for s in self.read_sources} | self.written_topics()

    def written_topics(self) -> dict[str, int]:
        """The topics the job writes — its results, its sink's marker topic (a partition per task
        of the stateful stage) and its progress topic — → the partitions ctiflow creates them with."""
        return ({t: self.outputs.partitions for t in self.result_topics()}
                | {marker_topic(self.job): self.shuffle_partitions, progress_topic(self.job): 1})

    @property
    def global_operator(self) -> bool:
        """An operator is global: it must see every event, so the job has one key group."""
        return any(op.needs_every_key for op in self.operators)

    @property
    def shuffle_partitions(self) -> int:
        """The stateful stage's tasks: ``spark.shuffle_partitions``, by default 2, or 1 for a job
        with one key group (a second task would only be idle)."""
        if self.spark.shuffle_partitions is not None:
            return self.spark.shuffle_partitions
        return 1 if self.global_operator else 2

    @property
    def key_groups(self) -> int:
        """Key groups actually used: 1 when an operator is global (it must see every event),
        else ``spark.key_groups`` (default: :attr:`shuffle_partitions`)."""
        if self.global_operator:
            return 1
        return self.spark.key_groups or self.shuffle_partitions

    @property
    def passes_records(self) -> bool:
        """An operator passes input records on unchanged (the source keeps their bytes)."""
        return any(op.passes_records for op in self.operators)

    @property
    def reads_fields(self) -> bool:
        """Something reads the records' fields in the stateful stage (an operator, a reference
        join): the source packs them. Else the records' bytes travel alone and are decoded there
        only for what needs them (a late record; a result topic whose schema is another)."""
        return (self.reference is not None or len(self.sources) > 1
                or any(op.reads_fields for op in self.operators))

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)


def env_overrides(model: type[BaseModel] = None, path: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """``CTIFLOW_*`` variable → the field path it overrides, read from the fields' declarations
    (``Field(..., **env("CTIFLOW_…"))``)."""
    model = model or JobConfig
    found: dict[str, tuple[str, ...]] = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if "env" in extra:
            found[extra["env"]] = (*path, name)
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            found.update(env_overrides(sub, (*path, name)))
    return found


def _apply_env(raw: dict) -> dict:
    """The declared ``CTIFLOW_*`` variables that are set override the file (a copy of ``raw``)."""
    raw = copy.deepcopy(raw)
    for var, path in ENV_OVERRIDES.items():
        value = os.environ.get(var)
        if value:
            node = raw
            for part in path[:-1]:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            node[path[-1]] = value
    return raw


def _problems(err: ValidationError) -> list[str]:
    """Each of pydantic's errors as ``field: what is wrong`` (the fix where it is known)."""
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see `ctiflow run --help` and examples/)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{where}: {msg}")
    return lines


def parse(raw: Any, origin: str = "<config>") -> JobConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: a job configuration must be a YAML mapping, got {type(raw).__name__}")
    try:
        return JobConfig.model_validate(_apply_env(raw))
    except ValidationError as err:
        raise ConfigError(f"{origin}: invalid job configuration", _problems(err)) from None


#: Every ``CTIFLOW_*`` variable the configuration reads → the field it overrides.
ENV_OVERRIDES = env_overrides()


def load(path: str | Path) -> JobConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such job configuration file")
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a byte-order mark is skipped
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at position "
                          f"{exc.start + 1}: {exc.reason}); save the job file as UTF-8") from None
    return parse(load_yaml(text, str(path)), str(path))
