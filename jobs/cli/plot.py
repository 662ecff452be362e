"""``ctiflow plot counts | bins``: result topics as PNG (:mod:`ctiflow.jobs.ops.plot`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ctiflow.jobs.cli.consoles import out
from ctiflow.jobs.cli.parameters import Bootstrap, InputError, JobFile, connection
from ctiflow.jobs.driver.config import load
from ctiflow.jobs.datapath.kafka import read_topic
from ctiflow.jobs.testing.oracle import exact_counts

app = typer.Typer(no_args_is_help=True, help="Render count or bin result topics as PNG.")


def _only(records: list[dict], topics: list[str], kind: str, fields: tuple[str, ...]) -> list[dict]:
    """The records of ``topics`` that are ``kind`` results (they have its ``fields``); none: an
    InputError (an image of nothing would look like a result)."""
    chosen = [r for r in records if all(f in r for f in fields)]
    if not chosen:
        raise InputError(f"topic {' + '.join(topics)}: no {kind} records among its {len(records)}: name a "
                         f"{kind} operator's output with --topic")
    return chosen


@app.command("counts")
def counts(topic: Annotated[str, typer.Option("--topic", "-t")] = "counts",
           out_png: Annotated[Path, typer.Option("--out")] = Path("counts.png"),
           config: Annotated[Optional[Path], typer.Option(
               "--config", "-c", help="the job's YAML: also draw the exact count from its input topic",
           )] = None,
           bootstrap: Bootstrap = None):
    """Estimate with its guaranteed bounds over application time (and the exact count with --config)."""
    from ctiflow.jobs.ops.plot import plot_counts  # here: matplotlib is slow to import

    conn = connection(bootstrap, None, config)

    def read(name: str) -> list[dict]:
        return read_topic(conn.bootstrap, name, conn.client, registry_url=conn.registry_url,
                          registry_config=conn.registry_config, store=conn.store)

    records = _only(read(topic), [topic], "count", ("counter", "key", "time", "estimate", "lower", "upper"))
    exact = exact_counts(load(config), records, read) if config else None
    out.print(f"wrote {plot_counts(records, str(out_png), exact=exact)} from {len(records)} records")


@app.command("bins")
def bins(topic: Annotated[str, typer.Option("--topic", "-t")] = "bins-updated",
         final_topic: Annotated[Optional[str], typer.Option("--final-topic")] = None,
         out_png: Annotated[Path, typer.Option("--out")] = Path("bins.png"),
         bootstrap: Bootstrap = None,
         config: JobFile = None):
    """Bins per key over time; updated revisions converge on the final value."""
    from ctiflow.jobs.ops.plot import plot_bins  # here: matplotlib is slow to import

    conn = connection(bootstrap, None, config)
    topics = [name for name in (topic, final_topic) if name]
    records = _only([r for name in topics for r in read_topic(conn.bootstrap, name, conn.client,
                                                              registry_url=conn.registry_url,
                                                              registry_config=conn.registry_config,
                                                              store=conn.store)],
                    topics, "bin", ("binner", "key", "bin_start", "bin_end"))
    out.print(f"wrote {plot_bins(records, str(out_png))} from {len(records)} records")
