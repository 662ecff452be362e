"""Benchmarks: figures for people, printed as tables; every figure is compared in the same run
against a baseline. Tests never assert wall-clock times; they only smoke-test correctness.

:data:`REGISTRY` is the one table of them: a name, what it measures, and how it runs given the
command line's options (:class:`Options`). ``ctiflow bench`` (and ``./dev bench``) reads it.
A run at a benchmark's defaults (no ``--events``, no ``--trigger``) records its rows of
``bench/figures.yaml`` (:mod:`ctiflow.bench.figures`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console


#: Runs of the latency benchmark's whole protocol: its goal is stated "in each of three runs", and
#: a run's p99 moves by 0.1–0.2 s between runs on this machine (docs/changelog.md).
LATENCY_RUNS = 3


@dataclass(frozen=True)
class Options:
    """What ``ctiflow bench`` passes on: ``None`` means the benchmark's default."""

    out: Console
    events: int | None = None
    trigger: int | None = None
    minutes: float | None = None
    cti_delay: bool = False
    sparse: bool = False
    runs: int | None = None

    @property
    def record(self) -> bool:
        """A run at the defaults records its figures (``--runs`` given as latency's default included;
        the sparse-keys table records the median of however many runs)."""
        return self.events is None and self.trigger is None and (self.runs in (None, LATENCY_RUNS) or self.sparse)


def _call(module: str, function: str) -> Callable:
    """``module.function``, imported when the benchmark runs (each pulls in what it measures)."""
    return getattr(importlib.import_module(f"ctiflow.bench.{module}"), function)


def _soak(o: Options) -> None:
    result = _call("soak", "main")(o.out, minutes=30.0 if o.minutes is None else o.minutes,
                                   record_figures=o.record and o.minutes is None)
    if not result["ok"]:
        raise SystemExit("soak: the results do not match the oracle (see above)")


def _count(o: Options) -> None:
    _call("count_operator", "main")([] if o.events is None else ["--events", str(o.events)])
    _call("spark_jobs", "bench_count_e2e")(o.events or 500_000, o.out)


def _scale(o: Options) -> None:
    if not (o.cti_delay or o.sparse):
        _call("state_scale", "spark_main")(o.out, per_batch=o.trigger or 200_000, record_figures=o.record)
        _call("state_scale", "main")(o.out)
    if not o.cti_delay:
        _call("state_scale", "sparse_main")(o.out, record_figures=o.record)
        _call("state_scale", "spark_sparse_main")(o.out, per_batch=o.trigger or 200_000, record_figures=o.record,
                                                  runs=o.runs or 1)
    if not o.sparse:
        _call("state_scale", "delay_main")(o.out, record_figures=o.record)


@dataclass(frozen=True)
class Benchmark:
    name: str
    what: str
    run: Callable[[Options], None]
    #: part of ``all`` (the soak is not: it runs for ``--minutes``)
    in_all: bool = True


#: Every benchmark, in the order ``all`` runs them.
REGISTRY: tuple[Benchmark, ...] = (
    Benchmark("source", "Kafka → typed columns in one executor task",
              lambda o: _call("source", "main")(o.out, events=o.events or 1_000_000, record_figures=o.record)),
    Benchmark("adapter", "the stateful stage in Spark against an identity operator (12 batches, 6 measured)",
              lambda o: _call("spark_jobs", "bench_adapter")(o.events or 2_400_000, o.out, o.trigger or 200_000,
                                                             record_figures=o.record)),
    Benchmark("count", "the count operator against dgim, then end to end in Spark", _count),
    Benchmark("bins", "prorated bins in Spark",
              lambda o: _call("bins_spark", "bench_bins")(o.events or 200_000, o.out, o.trigger or 50_000)),
    Benchmark("match", "the match operator against Flink CEP's recorded figures",
              lambda o: _call("match_operator", "main")(o.events, record_figures=o.record)),
    Benchmark("rules", "N patterns from a rules topic against the same N in the job file",
              lambda o: _call("rules", "main")(o.out, events_n=o.events or 100_000, record_figures=o.record)),
    Benchmark("rules-test", "a rule tried on a range of a topic ten times as long against a run over the range",
              lambda o: _call("rule_trial", "main")(o.out, events_n=o.events, record_figures=o.record)),
    Benchmark("reliability", "exactly-once under kills and malformed records",
              lambda o: _call("reliability", "main")(o.out, events=o.events or 20_000)),
    Benchmark("scale", "keyed state as keys grow; --sparse: events spread over every key; --cti-delay: batch "
                       "time against cti.delay", _scale),
    Benchmark("peers", "ctiflow against plain Spark jobs of the same results",
              lambda o: _call("peers", "main")(o.out, events=o.events, trigger=o.trigger, record_figures=o.record,
                                               **({} if o.runs is None else {"runs": o.runs}))),
    Benchmark("latency", "produce → result record at a short trigger, with Spark's floors",
              lambda o: _call("latency", "main")(o.out, record_figures=o.record,
                                                 **({} if o.runs is None else {"runs": o.runs}))),
    Benchmark("soak", "a long run against its oracle (--minutes, 30 by default)", _soak, in_all=False),
)
BENCHMARKS = {b.name: b for b in REGISTRY}
BENCHES = tuple(b.name for b in REGISTRY if b.in_all)
#: Run only when named (not part of ``all``).
LONG_BENCHES = tuple(b.name for b in REGISTRY if not b.in_all)


def run_benchmarks(which: str, events: int | None = None, out: Console | None = None,
                   trigger: int | None = None, minutes: float | None = None, cti_delay: bool = False,
                   sparse: bool = False, runs: int | None = None) -> None:
    """Run ``which`` (a name of :data:`REGISTRY`, or ``all``)."""
    if which != "all" and which not in BENCHMARKS:
        raise SystemExit(f'Invalid benchmark "{which}". Valid choices are: all, {", ".join(BENCHMARKS)}.')
    options = Options(out or Console(width=200), events, trigger, minutes, cti_delay, sparse, runs)
    for name in BENCHES if which == "all" else (which,):
        BENCHMARKS[name].run(options)
