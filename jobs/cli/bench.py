"""``ctiflow bench``: the benchmarks of :mod:`bench`."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console

from bench import run_benchmarks

app = typer.Typer()


class Benchmark(str, Enum):
    """What ``ctiflow bench`` runs: one of :data:`bench.BENCHES`, or all of them."""

    ADAPTER = "adapter"
    SOURCE = "source"
    COUNT = "count"
    BINS = "bins"
    MATCH = "match"
    RELIABILITY = "reliability"
    SCALE = "scale"
    PEERS = "peers"
    LATENCY = "latency"
    SOAK = "soak"
    ALL = "all"


@app.command()
def bench(which: Annotated[Benchmark, typer.Argument(help="the benchmark to run, or all")] = Benchmark.ALL,
          events: Annotated[Optional[int], typer.Option(help="events per run (default per benchmark)")] = None,
          trigger: Annotated[Optional[int], typer.Option(
              min=1000, help="events per micro-batch for every Spark variant of adapter, bins, scale and peers "
                             "(default: 200000, 50000, 200000 and 100000)")] = None,
          minutes: Annotated[Optional[float], typer.Option(
              min=0.5, help="how long the soak runs (default 30; soak is not part of all)")] = None,
          cti_delay: Annotated[bool, typer.Option(
              "--cti-delay", help="scale: only the table of batch time against cti.delay (10 s to 10 minutes at a "
                                  "fixed rate, in one process)")] = False):
    """Benchmarks: print figures (events/s, latency percentiles, memory) against a baseline in the same run."""
    if cti_delay and which is not Benchmark.SCALE:
        raise typer.BadParameter("--cti-delay is an option of the scale benchmark: ctiflow bench scale --cti-delay")
    run_benchmarks(which.value, events=events, out=Console(width=200), trigger=trigger, minutes=minutes,
                   cti_delay=cti_delay)
