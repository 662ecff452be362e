"""``ctiflow topics create | list``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.cli.consoles import out
from ctiflow.jobs.cli.parameters import Bootstrap, InputError, JobFile, connection
from ctiflow.jobs.driver.config import MAX_PARTITIONS, check_topic_name, load

app = typer.Typer(no_args_is_help=True, help="Create and list Kafka topics.")


@app.command("create")
def create(names: Annotated[Optional[list[str]], typer.Argument(help="topic names")] = None,
           partitions: Annotated[int, typer.Option(min=1, max=MAX_PARTITIONS)] = 2,
           config: Annotated[Optional[Path], typer.Option("--config", "-c",
                                                          help="create every topic this job uses")] = None,
           bootstrap: Bootstrap = None):
    """Create topics (tansu cannot add partitions later: choose the count now)."""
    wanted = {n: partitions for n in names or []}
    if config:
        wanted.update(load(config).topics())
    if not wanted:
        raise typer.BadParameter("name at least one topic or give --config JOB.yaml")
    for n in wanted:
        try:
            check_topic_name(n)
        except ValueError as exc:  # (the rule is also a validator of the job model's fields)
            raise InputError(str(exc)) from None
    conn = connection(bootstrap, None, config)
    kafka.wait_for_broker(conn.bootstrap, conn.client)
    created = kafka.create_topics(conn.bootstrap, wanted, conn.client)
    for n in wanted:
        out.print(f"{n}: {'created' if n in created else 'exists'} ({wanted[n]} partitions)")


@app.command("list")
def list_(bootstrap: Bootstrap = None, config: JobFile = None):
    """List topics and their partition counts."""
    conn = connection(bootstrap, None, config)
    kafka.wait_for_broker(conn.bootstrap, conn.client)
    table = Table("topic", "partitions")
    for name, partitions in sorted(kafka.list_topics(conn.bootstrap, conn.client).items()):
        table.add_row(name, str(partitions))
    out.print(table)
