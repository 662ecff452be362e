"""``ctiflow produce`` (JSON lines → Avro records) and ``ctiflow consume`` (records → JSON lines)."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import Progress

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.cli.consoles import console, out
from ctiflow.jobs.cli.parameters import (Bootstrap, InputError, JobFile, Registry, connection, decode_line,
                                         not_utf8, open_lines)
from ctiflow.jobs.avro.serde import AvroSerializer, default_store

app = typer.Typer()


class Framing(str, Enum):
    """How a produced value is framed (:mod:`ctiflow.jobs.avro.serde`)."""

    SINGLE_OBJECT = "single_object"  # Avro single-object encoding: the schema's fingerprint, no registry
    CONFLUENT = "confluent"  # Confluent's: the schema's id in a Schema Registry


Topic = Annotated[str, typer.Option("--topic", "-t")]


@app.command()
def produce(topic: Topic,
            schema: Annotated[str, typer.Option(
                "--schema", "-s", help="schema name in schemas/ (e.g. transaction)")],
            file: Annotated[str, typer.Argument(help="JSON-lines file, or - for stdin")] = "-",
            key_field: Annotated[Optional[str], typer.Option(
                help="record field used as the Kafka key (entity key)")] = None,
            framing: Annotated[Framing, typer.Option(
                help="single-object encoding (no registry) or Confluent (needs --registry)",
            )] = Framing.SINGLE_OBJECT,
            if_empty: Annotated[bool, typer.Option(
                "--if-empty", help="produce only into a topic that holds no record yet (a one-shot loader "
                                   "run again, e.g. the compose demo producer, then sends nothing "
                                   "twice)")] = False,
            registry: Registry = None,
            bootstrap: Bootstrap = None,
            config: JobFile = None):
    """Produce JSON lines to a topic as Avro (validated against the schema).

    A line that is not UTF-8, not JSON, not valid for the schema or larger than a message may be
    is skipped with the reason (file:line on standard error); the others are sent, and the summary
    says how many of each. A field the schema does not have is dropped, with a warning the
    first time each such name appears."""
    name, stream = open_lines(file)  # a missing file or a folder: refused before anything connects
    conn = connection(bootstrap, registry, config)
    fields = [f["name"] for f in default_store().get(schema).parsed.get("fields", ())]
    if key_field is not None and key_field not in fields:
        raise InputError(f"--key-field: {key_field!r} is not a field of schema {schema!r} "
                         f"(its fields: {', '.join(fields)})")
    confluent = framing is Framing.CONFLUENT
    serializer = AvroSerializer(schema, framing=framing.value, subject=f"{topic}-value",
                                registry=conn.registry() if confluent else None)
    bs = conn.bootstrap
    kafka.wait_for_broker(bs, conn.client)
    kafka.topic_partitions(bs, topic, conn.client)
    if if_empty and kafka.holds_records(bs, topic, conn.client):
        out.print(f"{topic} already holds records: nothing produced (--if-empty)")
        return

    lines = _Lines(name, stream, schema, fields, serializer)
    with stream, Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing to {topic}", total=None)
        done = kafka.produce(bs, topic, lines, lines.encode, key_field, conn.client,
                             on_rejected=lines.rejected,
                             on_progress=lambda sent: progress.update(task, completed=sent))
    skipped = done.rejected + lines.undecodable
    out.print(f"produced {done.sent - done.unflushed} records to {topic}"
              + (f", {skipped} lines rejected" if skipped else ""))
    if done.unflushed or skipped:
        raise typer.Exit(1)


class _Lines:
    """The lines of a JSON-lines file as :func:`ctiflow.jobs.datapath.kafka.produce` takes them: each decoded
    (one that is not UTF-8 is reported and skipped, the next keeps its number), and each record
    encoded with its unknown fields warned about once (they are dropped)."""

    def __init__(self, name: str, stream, schema: str, fields: list[str], serializer) -> None:
        self.name, self.stream, self.schema, self.serializer = name, stream, schema, serializer
        self.number = self.undecodable = 0  # the line being produced; lines that are not UTF-8
        self.known: set[str] = set(fields)  # the schema's fields, then each unknown one once warned about

    def rejected(self, line: int, error: Exception) -> None:
        console.print(f"[yellow]skipped[/yellow] {escape(f'{self.name}:{line}: {error}')}", highlight=False)

    def __iter__(self):
        for self.number, raw in enumerate(self.stream, 1):
            try:
                yield decode_line(raw, self.number)
            except UnicodeDecodeError as exc:
                self.undecodable += 1
                self.rejected(self.number, InputError(not_utf8(exc)))
                yield ""  # (a blank line: skipped, and the next keeps its number)

    def encode(self, record) -> bytes:
        for field in (record.keys() - self.known if isinstance(record, dict) else ()):
            self.known.add(field)
            warning = (f"{self.name}:{self.number}: field {field!r} is not in schema {self.schema!r}: "
                       "dropped (here and wherever it is)")
            console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        return self.serializer(record)


def _json(record: dict) -> str:
    return json.dumps(record, default=lambda b: b.hex() if isinstance(b, bytes) else str(b))


@app.command()
def consume(topic: Topic,
            from_beginning: Annotated[bool, typer.Option("--from-beginning/--new-only")] = True,
            max_records: Annotated[Optional[int], typer.Option(
                "--max", min=1, help="stop after N records")] = None,
            follow: Annotated[bool, typer.Option(
                "--follow", "-f", help="keep waiting for new records")] = False,
            registry: Registry = None,
            bootstrap: Bootstrap = None,
            config: JobFile = None):
    """Print a topic's records as JSON lines (any ctiflow schema, either framing)."""
    conn = connection(bootstrap, registry, config)
    bs = conn.bootstrap
    kafka.wait_for_broker(bs, conn.client)
    hinted = config is not None

    def hint(record: dict) -> None:
        nonlocal hinted
        if not hinted and "unknown schema fingerprint" in str(record.get("_undecodable", "")):
            hinted = True
            console.print("[yellow]hint[/]: a record's schema is neither among the schema files nor in the "
                          "schemas topic (a job publishes the schemas it derives there when it starts) — "
                          "add --config JOB.yaml to derive them here", highlight=False)

    if not follow and from_beginning:
        for record in kafka.iter_topic(bs, topic, conn.client, max_records=max_records,
                                       registry_url=conn.registry_url,
                                       registry_config=conn.registry_config, store=conn.store):
            hint(record)
            out.print_json(_json(record)) if sys.stdout.isatty() else print(_json(record))
        return
    try:
        for record in kafka.follow_topic(bs, topic, conn.client, from_beginning=from_beginning,
                                         max_records=max_records, registry_url=conn.registry_url,
                                         registry_config=conn.registry_config, store=conn.store):
            hint(record)
            print(json.dumps(record, default=str), flush=True)
    except KeyboardInterrupt:
        pass
