"""``ctiflow run`` and ``ctiflow drain``: a job described by a YAML file, on Spark."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ctiflow.jobs.driver import progress
from ctiflow.jobs.cli.consoles import console, out
from ctiflow.jobs.driver.config import load

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
    code = run_job(load(config), until_end=until_end, timeout=timeout, as_json=as_json)
    if code:
        raise typer.Exit(code)


def run_job(cfg, *, until_end: bool, timeout: float | None, as_json: bool, session=None) -> int:
    """What ``ctiflow run`` does with a loaded job (also the spark-submit entry point's,
    :mod:`ctiflow.jobs.cli.entry`): its errors refused before anything connects, the run, its summary;
    returns the exit code. ``session``: makes the Spark session (default: the job's own)."""
    # here: the job's modules import pyspark, pandas and pyarrow; the other commands do without
    from ctiflow.jobs.driver import pipeline

    pipeline.refuse_errors(cfg)  # every field, pattern and predicate error before anything connects
    for warning in cfg.warnings():
        console.print(f"[yellow]warning[/]: {warning}", highlight=False)
    try:
        spark = session(cfg) if session else None
        summary = pipeline.run(cfg, until_end=until_end, on_progress=progress.printer(console),
                               timeout=timeout, spark=spark)
    finally:
        pipeline.stop_session()
    stopped_by = signal.Signals(summary.stopped_by).name if summary.stopped_by else None
    code = 128 + summary.stopped_by if summary.stopped_by else 0
    if as_json:
        print(json.dumps({"job": cfg.job, "batches": summary.batches, "records": summary.records,
                          "seconds": round(summary.seconds, 3), "cti": summary.cti,
                          "counters": summary.counters, "stopped_by": stopped_by,
                          "first_batch_seconds": summary.first_batch_seconds}))
        return code
    out.print(progress.summary_line(cfg.job, summary), highlight=False)
    if summary.stopped_by:
        console.print(f"stopped on {stopped_by}; the next run continues from the checkpoint", highlight=False)
    return code


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(ctx: typer.Context, config: JobFile,
           master: Annotated[str, typer.Option(
               help="the cluster: spark://host:7077, yarn, k8s://https://host:443")],
           deploy_mode: Annotated[str, typer.Option(
               help="client: the driver runs here; cluster: in the cluster (YARN, Kubernetes)")] = "client",
           until_end: Annotated[bool, typer.Option(
               "--until-end", help="bounded: process what is there, flush (final CTI +∞), stop")] = False,
           timeout: Annotated[Optional[float], typer.Option(help="stop after this many seconds")] = None,
           print_command: Annotated[bool, typer.Option(
               "--print-command", help="build the environment archive, print the spark-submit command, run "
                                       "nothing")] = False):
    """Run a job on a Spark cluster whose workers have only Spark and a Python of this minor version.

    ctiflow and its dependencies travel in an environment archive (built once, kept in $CTIFLOW_HOME/submit);
    options ctiflow does not know go to spark-submit unchanged (--conf k=v, --executor-memory 4g, --jars …).
    See docs/operations/deploying.md."""
    from ctiflow.jobs.driver import submit as submitting

    cmd = submitting.command(config, master=master, deploy_mode=deploy_mode, spark_args=list(ctx.args),
                             until_end=until_end, timeout=timeout, reach_master=not print_command)
    if print_command:
        import shlex

        print(shlex.join(cmd))
        for path in submitting.secrets_files_of(cmd):
            console.print(f"the job's secret Spark settings are in {path} (readable by you alone), which the "
                          "command reads: remove it once the job has started", highlight=False,
                          soft_wrap=True)
        return
    code = submitting.run(cmd)
    if code:
        raise typer.Exit(code)


@app.command()
def drain(config: JobFile):
    """Process everything left and flush all operator state (final CTI at +∞), then stop.

    Stop the running job first; ``drain`` continues from its checkpoint."""
    run(config, until_end=True)


@app.command()
def check(configs: Annotated[list[Path], typer.Argument(help="job YAML files")]):
    """Check job files without Kafka or Spark: every configuration, schema-field, predicate and
    pattern error at once, each with its file, field and fix; warnings too. Exit 1 on an error."""
    from ctiflow.jobs.driver.check import check_job

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
