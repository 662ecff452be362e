"""``ctiflow produce`` (JSON lines → Avro records) and ``ctiflow consume`` (records → JSON lines)."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.progress import Progress

from jobs import kafka
from jobs.cli.consoles import console, out
from jobs.cli.parameters import Bootstrap, JobFile, Registry, connection
from jobs.serde import AvroSerializer

app = typer.Typer()


class Framing(str, Enum):
    """How a produced value is framed (:mod:`jobs.serde`)."""

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
            registry: Registry = None,
            bootstrap: Bootstrap = None,
            config: JobFile = None):
    """Produce JSON lines to a topic as Avro (validated against the schema)."""
    conn = connection(bootstrap, registry, config)
    confluent = framing is Framing.CONFLUENT
    serializer = AvroSerializer(schema, framing=framing.value, subject=f"{topic}-value",
                                registry=conn.registry() if confluent else None)
    bs = conn.bootstrap
    kafka.wait_for_broker(bs, conn.client)
    kafka.topic_partitions(bs, topic, conn.client)

    def rejected(line: int, error: Exception) -> None:
        console.print(f"[yellow]line {line} skipped:[/yellow] {error}")

    lines = sys.stdin if file == "-" else open(file)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing to {topic}", total=None)
        done = kafka.produce(bs, topic, lines, serializer, key_field, conn.client, on_rejected=rejected,
                             on_progress=lambda sent: progress.update(task, completed=sent))
    out.print(f"produced {done.sent - done.unflushed} records to {topic}"
              + (f", {done.rejected} lines rejected" if done.rejected else ""))
    if done.unflushed or done.rejected:
        raise typer.Exit(1)


def _json(record: dict) -> str:
    return json.dumps(record, default=lambda b: b.hex() if isinstance(b, bytes) else str(b))


@app.command()
def consume(topic: Topic,
            from_beginning: Annotated[bool, typer.Option("--from-beginning/--new-only")] = True,
            max_records: Annotated[Optional[int], typer.Option("--max", help="stop after N records")] = None,
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
            console.print("[yellow]hint[/]: a record's schema is neither among the schema files nor in the schemas "
                          "topic (a job publishes the schemas it derives there when it starts) — add --config "
                          "JOB.yaml to derive them here", highlight=False)

    if not follow and from_beginning:
        for record in kafka.iter_topic(bs, topic, conn.client, max_records=max_records, registry_url=conn.registry_url,
                                       registry_config=conn.registry_config):
            hint(record)
            out.print_json(_json(record)) if sys.stdout.isatty() else print(_json(record))
        return
    try:
        for record in kafka.follow_topic(bs, topic, conn.client, from_beginning=from_beginning,
                                         max_records=max_records, registry_url=conn.registry_url,
                                         registry_config=conn.registry_config):
            hint(record)
            print(json.dumps(record, default=str), flush=True)
    except KeyboardInterrupt:
        pass
