"""``ctiflow bench``: the benchmarks of :mod:`bench`."""

from __future__ import annotations

import importlib
from typing import Annotated, Optional

import typer
from rich.console import Console

from ctiflow.operators.errors import CtiflowError

app = typer.Typer()


def registry():
    """The benchmarks (:mod:`ctiflow.bench`, loaded by name: the product never imports them;
    the wheel carries them)."""
    try:
        return importlib.import_module("ctiflow.bench")
    except ModuleNotFoundError:
        raise CtiflowError("the benchmarks are not installed: run them from a checkout of the repository "
                           "(./dev bench …), where bench/ is") from None


@app.command()
def bench(which: Annotated[str, typer.Argument(help="the benchmark to run (adapter, source, count, bins, "
                                               "match, rules, rules-test, reliability, scale, peers, "
                                               "latency, soak), or all")] = "all",
          events: Annotated[Optional[int], typer.Option(
              help="events per run (default per benchmark)")] = None,
          trigger: Annotated[Optional[int], typer.Option(
              min=1000, help="events per micro-batch for every Spark variant of adapter, bins, scale and "
                             "peers (default: 200000, 50000, 200000 and 100000)")] = None,
          minutes: Annotated[Optional[float], typer.Option(
              min=0.5, help="how long the soak runs (default 30; soak is not part of all)")] = None,
          cti_delay: Annotated[bool, typer.Option(
              "--cti-delay", help="scale: only the table of batch time against cti.delay (10 s to 10 minutes "
                                  "at a fixed rate, in one process)")] = False,
          sparse: Annotated[bool, typer.Option(
              "--sparse", help="scale: only the tables of events spread over every key (10k to 3M keys, in "
                               "one process and end to end in Spark)")] = False,
          runs: Annotated[Optional[int], typer.Option(
              min=1, help="latency: how many times the whole protocol runs (default 3: its goal is judged "
                          "in each run; a run takes ≈ 13 minutes); scale --sparse: how many times the "
                          "end-to-end table runs (default 1; ≈ 20 minutes a run): each ratio's spread, the "
                          "median recorded; peers: rounds of each comparison, ours and the peer's queries "
                          "alternating (default 3): each ratio the median of its rounds")] = None):
    """Benchmarks: print figures (events/s, latency percentiles, memory) against a baseline in the same
    run."""
    benches = registry()
    valid = ("all", *benches.BENCHES, *benches.LONG_BENCHES)
    if which not in valid:
        raise typer.BadParameter(f"{which!r} is not one of {', '.join(map(repr, valid))}", param_hint="WHICH")
    for name, given in (("--cti-delay", cti_delay), ("--sparse", sparse)):
        if given and which != "scale":
            raise typer.BadParameter(f"{name} is an option of the scale benchmark: ctiflow bench scale "
                                     f"{name}")
    if runs is not None and which not in ("latency", "peers") and not (which == "scale" and sparse):
        raise typer.BadParameter("--runs is an option of the latency and peers benchmarks and of the "
                                 "sparse-keys table: ctiflow bench latency --runs N, ctiflow bench peers "
                                 "--runs N, ctiflow bench scale --sparse --runs N")
    if cti_delay and sparse:
        raise typer.BadParameter("--cti-delay and --sparse are two tables of the scale benchmark: give one")
    benches.run_benchmarks(which, events=events, out=Console(width=200), trigger=trigger, minutes=minutes,
                           cti_delay=cti_delay, sparse=sparse, runs=runs)
