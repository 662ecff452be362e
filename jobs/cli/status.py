"""``ctiflow status``: a live view of the running jobs, from their Prometheus metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ctiflow.jobs.cli.consoles import console, out
from ctiflow.jobs.driver.config import load

app = typer.Typer()

#: Where the compose stack publishes Prometheus (docker-compose.yml).
COMPOSE_PROMETHEUS = "http://127.0.0.1:9090"


@app.command()
def status(configs: Annotated[Optional[list[Path]], typer.Argument(
               help="job YAMLs with metrics.port set (read at 127.0.0.1:<port>)", show_default=False)] = None,
           url: Annotated[Optional[list[str]], typer.Option(
               "--url", help="a job's metrics endpoint, e.g. http://127.0.0.1:9464/metrics "
                             "(repeatable)")] = None,
           prometheus: Annotated[Optional[str], typer.Option(
               help=f"a Prometheus that scrapes the jobs (the compose stack's: {COMPOSE_PROMETHEUS}); the "
                    "default when no job or --url is given")] = None,
           once: Annotated[bool, typer.Option("--once", help="print the view once and exit")] = False,
           interval: Annotated[float, typer.Option(min=0.5, help="seconds between reads")] = 2.0):
    """A live view of the running jobs, from their metrics (or the compose stack's Prometheus).

    Per job and partition: CTI, event-time lag, records not read yet, input rate, late and
    dead-letter counts, state size, the last micro-batch and failed task attempts — redrawn every
    --interval seconds (Ctrl-C stops), one line per job when the terminal is narrow."""
    from rich.live import Live

    from ctiflow.jobs.ops.status import Watch, jobs_of, render

    urls = list(url or [])
    for path in configs or []:
        cfg = load(path)
        if cfg.metrics.port is None:
            raise typer.BadParameter(f"{path}: metrics.port is not set, so the job serves no metrics; set it "
                                     "(or CTIFLOW_METRICS_PORT) before `ctiflow run`", param_hint="CONFIGS")
        host = "127.0.0.1" if cfg.metrics.host in ("0.0.0.0", "::") else cfg.metrics.host
        urls.append(f"http://{host}:{cfg.metrics.port}/metrics")
    watch = Watch(urls, prometheus or (None if urls else COMPOSE_PROMETHEUS))
    source = ", ".join(urls + ([watch.prometheus] if watch.prometheus else []))

    def read(previous, last_at):
        samples, failed = watch.read()
        now = time.time()
        jobs = jobs_of(samples, previous, None if last_at is None else now - last_at, now)
        return jobs, failed, now

    jobs, failed, at = read(None, None)
    if failed and not jobs and len(failed) == len(urls) + (watch.prometheus is not None):
        for f in failed:
            console.print(f"[red]error:[/red] not answering: {f}", highlight=False)
        console.print("nothing to watch: run a job with metrics.port set (or CTIFLOW_METRICS_PORT) and give "
                      "its YAML or --url, or --prometheus for a Prometheus that scrapes the jobs",
                      highlight=False)
        raise typer.Exit(1)
    if once:
        for f in failed:
            console.print(f"[yellow]not answering[/]: {f}", highlight=False)
        out.print(render(jobs, out.width, at, source))
        raise typer.Exit(1 if failed and not jobs else 0)
    with Live(render(jobs, out.width, at, source), console=out, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval)
            jobs, failed, at = read(jobs, at)
            view = render(jobs, out.width, at, source)
            if failed:
                from rich.console import Group
                from rich.text import Text

                view = Group(view, *(Text(f"not answering: {f}", style="yellow") for f in failed))
            live.update(view)
