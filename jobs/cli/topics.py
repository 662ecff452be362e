"""``ctiflow topics create | list``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from jobs import kafka
from jobs.cli.consoles import out
from jobs.cli.parameters import Bootstrap, bootstrap_servers
from jobs.config import load

app = typer.Typer(no_args_is_help=True, help="Create and list Kafka topics.")


@app.command("create")
def create(names: Annotated[Optional[list[str]], typer.Argument(help="topic names")] = None,
           partitions: Annotated[int, typer.Option(min=1)] = 2,
           config: Annotated[Optional[Path], typer.Option("--config", "-c",
                                                          help="create every topic this job uses")] = None,
           bootstrap: Bootstrap = None):
    """Create topics (tansu cannot add partitions later: choose the count now)."""
    wanted = {n: partitions for n in names or []}
    client = None
    if config:
        cfg = load(config)
        bootstrap = bootstrap or cfg.kafka.bootstrap_servers
        client = cfg.kafka.client_config()
        wanted.update(cfg.topics())
    if not wanted:
        raise typer.BadParameter("name at least one topic or give --config JOB.yaml")
    for n in wanted:
        kafka.check_topic_name(n)
    bs = bootstrap_servers(bootstrap)
    kafka.wait_for_broker(bs, client)
    created = kafka.create_topics(bs, wanted, client)
    for n in wanted:
        out.print(f"{n}: {'created' if n in created else 'exists'} ({wanted[n]} partitions)")


@app.command("list")
def list_(bootstrap: Bootstrap = None):
    """List topics and their partition counts."""
    bs = bootstrap_servers(bootstrap)
    kafka.wait_for_broker(bs)
    table = Table("topic", "partitions")
    for name, partitions in sorted(kafka.list_topics(bs).items()):
        table.add_row(name, str(partitions))
    out.print(table)
