"""The Kafka source's options, typed and parsed once: what the driver plans with and each
executor's reader and decoder are built from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, typed and parsed once (Spark passes options as a case-insensitive
    string map: :meth:`to_options` writes it, :meth:`from_options` reads it back)."""

    bootstrap: str
    topic: str
    schema: str = ""  # name in schemas/ (the executors' decoder needs it; planning does not)
    key_field: str = ""
    time_field: str = ""
    stream: str = ""  # the job's source name (default: the topic)
    end_field: str | None = None
    shape: str = "point"
    key_groups: int = 1
    group_labels: tuple[int, ...] | None = None  # key group → the label Spark shuffles on
    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"  # a bounded run's end (JSON {topic: {partition: offset}} or latest)
    max_offsets_per_trigger: int | None = None
    measures: tuple[str, ...] = ()
    client: dict = field(default_factory=dict)  # public librdkafka settings (no credentials)
    schema_registry: dict | None = None  # {url, config}
    outage_timeout: float = 120.0  # seconds
    idle_timeout: float = 60.0  # seconds
    flush_at_end: bool = True
    start_offsets: dict | None = None  # the first batch's start (partition → offset), kept with the
                                       # checkpoint
    keep_values: bool = True  # values=all: every row keeps its Avro bytes (else only failed rows)
    pack_fields: bool = True  # fields=packed: packs carry field columns (else only names:
                              # ctiflow.jobs.core.rows.BytesFields)
    broadcast: bool = False  # every record to every key group (a rules topic), not by its key

    def __post_init__(self):
        if not self.stream:
            object.__setattr__(self, "stream", self.topic)
        if not self.pack_fields and not self.keep_values:
            raise ValueError("packs without field columns need every record's bytes (values=all)")

    def to_options(self) -> dict[str, str]:
        opts = {"bootstrap": self.bootstrap, "topic": self.topic, "schema": self.schema,
                "stream": self.stream, "key_field": self.key_field, "time_field": self.time_field,
                "end_field": self.end_field or "", "shape": self.shape, "key_groups": str(self.key_groups),
                "startingOffsets": self.starting_offsets, "endingOffsets": self.ending_offsets,
                "measures": json.dumps(list(self.measures)), "client": json.dumps(self.client),
                "outage_timeout": str(self.outage_timeout), "idle_timeout": str(self.idle_timeout),
                "flush_at_end": "true" if self.flush_at_end else "false",
                "values": "all" if self.keep_values else "errors",
                "fields": "packed" if self.pack_fields else "bytes",
                "broadcast": "true" if self.broadcast else "false"}
        if self.group_labels is not None:
            opts["group_labels"] = json.dumps(list(self.group_labels))
        if self.max_offsets_per_trigger:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.schema_registry:
            opts["schema_registry"] = json.dumps(self.schema_registry)
        if self.start_offsets is not None:
            opts["start_offsets"] = json.dumps(self.start_offsets)
        return opts

    @classmethod
    def from_options(cls, options) -> "SourceOptions":
        o = {k.lower(): v for k, v in options.items()}
        labels = json.loads(o.get("group_labels") or "null")
        return cls(bootstrap=o.get("bootstrap", ""), topic=o["topic"], schema=o.get("schema", ""),
                   key_field=o.get("key_field", ""), time_field=o.get("time_field", ""),
                   stream=o.get("stream", ""), end_field=o.get("end_field") or None,
                   shape=o.get("shape", "point"), key_groups=int(o.get("key_groups", "1")),
                   group_labels=tuple(labels) if labels else None,
                   starting_offsets=o.get("startingoffsets", "earliest"),
                   ending_offsets=o.get("endingoffsets", "latest"),
                   max_offsets_per_trigger=(int(o["maxoffsetspertrigger"]) if o.get("maxoffsetspertrigger")
                                            else None),
                   measures=tuple(json.loads(o.get("measures", "[]"))),
                   client=json.loads(o.get("client", "{}")),
                   schema_registry=json.loads(o["schema_registry"]) if o.get("schema_registry") else None,
                   outage_timeout=float(o.get("outage_timeout", "120")),
                   idle_timeout=float(o.get("idle_timeout", "60")),
                   flush_at_end=o.get("flush_at_end", "true") == "true",
                   start_offsets=json.loads(o["start_offsets"]) if o.get("start_offsets") else None,
                   keep_values=o.get("values", "all") == "all",
                   pack_fields=o.get("fields", "packed") != "bytes", broadcast=o.get("broadcast") == "true")

    @staticmethod
    def parsed(options) -> "SourceOptions":
        return options if isinstance(options, SourceOptions) else SourceOptions.from_options(options)
