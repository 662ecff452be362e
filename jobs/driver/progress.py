"""A running job's progress for people: one line per micro-batch, warnings, the run's summary."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass

from ctiflow.jobs.core import counters as counters_
from ctiflow.operators.events import CTI_INFINITY, CTI_NONE


@dataclass
class RunSummary:
    batches: int
    records: int  # input records of this run's batches (good and dead-lettered, every stream)
    seconds: float
    counters: dict  # the job's counters over every run of this checkpoint (ctiflow.jobs.core.counters)
    cti: int | None  # the job's CTI after the last batch (None: no CTI yet)
    progress: list[dict]  # one entry per micro-batch, in order
    stopped_by: int | None = None  # the signal (SIGINT/SIGTERM) that stopped an unbounded run
    #: seconds from the run's start (Spark, state restore) to its first completed batch (±0.5 s)
    first_batch_seconds: float | None = None


#: The key ctiflow adds to a micro-batch's progress (Spark's JSON has none like it): task attempts
#: of the query's Spark jobs that ended since the batch before and failed — Spark ran each again
#: (:class:`ctiflow.jobs.driver.pipeline.FailedAttempts`).
FAILED_ATTEMPTS = "failedTaskAttempts"


def failed_attempts_warning(progress: dict) -> str | None:
    """A warning for a micro-batch some of whose task attempts failed (None if none did)."""
    n = progress.get(FAILED_ATTEMPTS, 0)
    if not n:
        return None
    return (f"warning: batch {progress['batchId']}: {n} task attempt(s) failed and ran again (a Python "
            f"worker that died, or an error Spark retried); the results stay exactly once. Spark's log "
            f"says why (\"ctiflow's Python daemon: worker … ended by signal …\", \"Lost task\")")


def records_read(progress: dict) -> int | None:
    """Kafka records a micro-batch read, from its source offsets (``numInputRows`` counts
    Spark rows, and the operator pipeline's rows are packs of records); ``None`` for a query's
    first batch, whose progress has no start offset."""
    def offsets(value) -> dict | None:
        value = json.loads(value) if isinstance(value, str) else value
        # partitions only: an offset also carries the ``flushed`` and ``idle`` markers
        # (ctiflow.jobs.datapath.source.reader)
        return None if value is None else {p: int(v) for p, v in value.items() if p.isdigit()}

    total = 0
    for src in progress.get("sources", []):
        start, end = offsets(src.get("startOffset")), offsets(src.get("endOffset"))
        if start is None:
            return None
        total += sum(max(0, v - start.get(p, 0)) for p, v in (end or {}).items())
    return total


def format_cti(cti: int | None) -> str:
    """A CTI for people: UTC time to the millisecond, ``-`` before the first, ``+∞`` after the final one."""
    if cti is None or cti <= CTI_NONE:
        return "-"
    if cti >= CTI_INFINITY:
        return "+∞"
    return (dt.datetime.fromtimestamp(cti / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"))


def progress_line(p: dict, counters: dict) -> str:
    """One micro-batch for people: batch, records/s, CTI and the job's counters so far."""
    records = records_read(p)
    secs = p["durationMs"].get("triggerExecution", 0) / 1000
    rate = f"{records / secs:>9.0f}" if records is not None and secs else f"{'-':>9}"
    return (f"batch {p['batchId']:>4}  records {'-' if records is None else records:>7}  {rate} records/s  "
            f"CTI {format_cti(counters.get('cti'))}  in {counters.get('received', 0)} "
            f"released {counters.get('released', 0)} late {counters.get('late', 0)} "
            f"dead-letter {counters.get('dead_letter', 0)} out {counters.get('written', 0)}  "
            f"state {counters.get('state_bytes', 0) / 2**20:.1f} MiB, {counters.get('live_keys', 0)} keys")


def summary_line(job: str, summary: "RunSummary") -> str:
    """A run for people: batches, records, seconds, the final CTI and the counters' balance."""
    c = summary.counters
    received, released, late, dead = (c.get(k, 0) for k in ("received", "released", "late", "dead_letter"))
    return (f"{job}: {summary.batches} batches, {summary.records} input records in {summary.seconds:.1f} s; "
            f"CTI {format_cti(summary.cti)}; in {received} = released {released} + late {late} + dead-letter "
            f"{dead} + buffered {received - released - late - dead}; out {c.get('written', 0)} records "
            f"(late topic {c.get('late_records', 0)})"
            + (f"; first batch after {summary.first_batch_seconds:.1f} s" if summary.first_batch_seconds
               else ""))


#: A stream partition that sends more than this share of its records to the late topic is warned about.
LATE_WARNING_SHARE = 0.01


def late_warnings(counters: dict, already: set[str]) -> list[str]:
    """Warnings for stream partitions whose late share exceeds :data:`LATE_WARNING_SHARE`
    (each once: ``already`` collects the ones warned about)."""
    out = []
    for (stream, partition), late in counters_.labelled(counters, "late"):
        name = counters_.key("late", stream, partition)
        if name in already:
            continue
        received = counters.get(counters_.key("received", stream, partition), 0)
        if late and received and late > LATE_WARNING_SHARE * received:
            already.add(name)
            out.append(f"warning: stream {stream!r} partition {partition}: {late} of {received} records "
                       f"({late / received:.1%}) went to the late topic; if they were not really late, raise "
                       f"the stream's cti.delay (or its idle_timeout, if that partition was idle)")
    return out


def printer(console, indent: str = "") -> Callable[[dict, dict], None]:
    """An ``on_progress`` callback for :func:`ctiflow.jobs.driver.pipeline.run`: prints each micro-batch's
    :func:`progress_line` and, once each, its :func:`late_warnings` and a batch's
    :func:`failed_attempts_warning` (in yellow) to ``console``
    (a :class:`rich.console.Console`), every line after ``indent``."""
    warned: set[str] = set()

    def show(progress: dict, counters: dict) -> None:
        console.print(indent + progress_line(progress, counters), soft_wrap=True, highlight=False)
        failed = failed_attempts_warning(progress)
        for warning in [*late_warnings(counters, warned), *([failed] if failed else [])]:
            console.print(f"{indent}[yellow]{warning}[/yellow]", soft_wrap=True, highlight=False)
    return show
