"""``ctiflow run`` and ``ctiflow drain``: a job described by a YAML file, on Spark."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ctiflow.jobs import progress
from ctiflow.jobs.cli.consoles import console, out
from ctiflow.jobs.config import load

app = typer.Typer()

JobFile = Annotated[Path, typer.Argument(help="job YAML")]


@app.command()
def run(config: JobFile,
        until_end: Annotated[bool, typer.Option(
            "--until-end", help="bounded: process what is there, flush (final CTI +∞), stop")] = False,
        timeout: Annotated[Optional[float], typer.Option(help="stop after this many seconds")] = None,
        as_json: Annotated[bool, typer.Option(
            "--json", help="print the run's summary as one JSON object on stdout")] = False):
    """Run a job (Spark Structured Streaming) described by a YAML file.

    The YAML's fields: `ctiflow schemas job` (JSON schema, every field described) and examples/."""
    # here: the job's modules import pyspark, pandas and pyarrow; the other commands do without
    from ctiflow.jobs import pipeline

    cfg = load(config)
    pipeline.refuse_errors(cfg)  # every field, pattern and predicate error before anything connects
    for warning in cfg.warnings():
        console.print(f"[yellow]warning[/]: {warning}", highlight=False)
    try:
        summary = pipeline.run(cfg, until_end=until_end, on_progress=progress.printer(console), timeout=timeout)
    finally:
        pipeline.stop_session()
    stopped_by = signal.Signals(summary.stopped_by).name if summary.stopped_by else None
    if as_json:
        print(json.dumps({"job": cfg.job, "batches": summary.batches, "records": summary.records,
                          "seconds": round(summary.seconds, 3), "cti": summary.cti,
                          "counters": summary.counters, "stopped_by": stopped_by,
                          "first_batch_seconds": summary.first_batch_seconds}))
        raise typer.Exit(128 + summary.stopped_by if summary.stopped_by else 0)
    out.print(progress.summary_line(cfg.job, summary), highlight=False)
    if summary.stopped_by:
        console.print(f"stopped on {stopped_by}; the next run continues from the checkpoint", highlight=False)
        raise typer.Exit(128 + summary.stopped_by)


@app.command()
def drain(config: JobFile):
    """Process everything left and flush all operator state (final CTI at +∞), then stop.

    Stop the running job first; ``drain`` continues from its checkpoint."""
    run(config, until_end=True)


@app.command()
def check(configs: Annotated[list[Path], typer.Argument(help="job YAML files")]):
    """Check job files without Kafka or Spark: every configuration, schema-field, predicate and
    pattern error at once, each with its file, field and fix; warnings too. Exit 1 on an error."""
    from ctiflow.jobs.check import check_job

    failed = False
    for path in configs:
        report = check_job(path)
        for error in report.errors:
            out.print(f"[red]error[/]   {escape(f'{path}: {error}')}", highlight=False, soft_wrap=True)
        for warning in report.warnings:
            out.print(f"[yellow]warning[/] {escape(f'{path}: {warning}')}", highlight=False, soft_wrap=True)
        if report.ok:
            cfg = report.config
            out.print(f"[green]ok[/]      {path}: job {cfg.job!r}, {len(cfg.sources)} source(s), "
                      f"{len(cfg.operators)} operator(s), writes {', '.join(sorted(cfg.result_topics()))}",
                      highlight=False, soft_wrap=True)
        failed |= not report.ok
    if failed:
        raise typer.Exit(1)
