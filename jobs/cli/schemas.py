"""``ctiflow schemas list | register | job``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ctiflow.jobs.cli.consoles import out
from ctiflow.jobs.cli.parameters import Registry
from ctiflow.jobs.driver.config import JobConfig, load
from ctiflow.jobs.driver.recognize import derived_schemas, job_schema_store
from ctiflow.jobs.avro.serde import default_store, registry_client
from ctiflow.operators.errors import CtiflowError

app = typer.Typer(no_args_is_help=True, help="Avro schemas: list, register in a Schema Registry; the job "
                                             "YAML's JSON schema.")


@app.command("list")
def list_():
    """The Avro schemas in schemas/ with their CRC-64-AVRO fingerprints."""
    store = default_store()
    table = Table("schema", "fingerprint (single-object)")
    for name in store.names():
        table.add_row(name, store.get(name).fingerprint.hex())
    out.print(table)


@app.command("register")
def register(config: Annotated[Path, typer.Option("--config", "-c", help="the job's YAML")],
             registry: Registry = None):
    """Register every schema a job uses (subject ``<topic>-value``) in the Schema Registry."""
    from confluent_kafka.schema_registry import Schema  # here: the registry client (httpx) is slow to import

    cfg = load(config)
    store = job_schema_store(cfg)
    url = registry or cfg.kafka.schema_registry.url
    if not url:
        raise CtiflowError("no Schema Registry configured: "
                           "set kafka.schema_registry.url or CTIFLOW_SCHEMA_REGISTRY_URL")
    client = registry_client(url, cfg.kafka.schema_registry.client_config())
    topics = {s.topic: s.schema_name for s in cfg.sources} | cfg.result_topics()
    for topic, schema in topics.items():
        schema_id = client.register_schema(f"{topic}-value", Schema(store.get(schema).text, "AVRO"))
        out.print(f"{topic}-value → {schema} (id {schema_id})")


@app.command("job")
def job():
    """The job YAML's JSON schema: every field, its type, default, choices, description and the
    ``CTIFLOW_*`` variable that overrides it (``env``). Editors validate YAML against it."""
    print(json.dumps(JobConfig.model_json_schema(by_alias=True), indent=2))


@app.command("derived")
def derived(config: Annotated[Path, typer.Argument(help="the job's YAML")]):
    """The record schemas a job derives: a MATCH_RECOGNIZE operator's output (partition column and
    measures, typed), as Avro JSON — what its output topic holds and a consumer reads."""
    cfg = load(config)
    schemas = derived_schemas(cfg)
    if not schemas:
        out.print(f"{config}: no derived schemas (match operators derive their records' schemas)")
    for topic, schema in cfg.result_topics().items():
        if schema in schemas:
            print(f"# {topic}-value")
            print(json.dumps(json.loads(schemas[schema]), indent=2))
