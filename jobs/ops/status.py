"""``ctiflow status``: the running jobs of a stack, read from their Prometheus metrics.

Where the figures come from: each job's own endpoint (``metrics.port``, :mod:`ctiflow.jobs.driver.metrics`;
the embedded stack) or the compose stack's Prometheus (its HTTP API: the latest value of every
``ctiflow_*`` series). Either way the same samples are turned into one :class:`JobStatus` per
job and drawn with rich: per partition the CTI, event-time lag, records not read yet, input rate,
late and dead-letter counts; per job the state size, the last batch and its failed task attempts.
Rates are the change between two reads divided by the time between them (the first read has none).
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from ctiflow.jobs.core import counters
from ctiflow.jobs.driver.progress import format_cti

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


#: The most a metrics answer may be (a job's ``/metrics`` is a few kB per partition).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
#: The input rate over this window, where Prometheus answers (one read has no rate of its own).
RATE_WINDOW = "1m"
_RATE = "ctiflow_records_received_rate"  # this module's series: rate(received) over RATE_WINDOW
                                         # (from_prometheus)


def fetch(url: str, timeout: float = 5.0, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """The body at ``url``, read within ``timeout`` seconds in all (a server that trickles bytes
    does not hold ``status`` up) and at most ``limit`` bytes; an ``OSError`` saying which."""
    deadline = time.monotonic() + timeout
    chunks, size = [], 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            while True:
                if time.monotonic() > deadline:
                    raise OSError(f"no whole answer within {timeout:g} s")
                chunk = r.read1(65536)
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > limit:
                    raise OSError(f"the answer is larger than {limit // (1024 * 1024)} MiB")
                chunks.append(chunk)
    except http.client.HTTPException as exc:  # not an HTTP answer at all
        raise OSError(f"not an HTTP answer ({type(exc).__name__}: {exc})") from None


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """One job endpoint's samples (``/metrics`` text)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = fetch(url, timeout).decode("utf-8", "replace")
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def from_prometheus(base: str, timeout: float = 5.0) -> Samples:
    """The latest value of every ``ctiflow_*`` series Prometheus holds (``/api/v1/query``), and
    each partition's input rate over :data:`RATE_WINDOW` (``ctiflow_records_received_rate``).
    An answer of another shape is a ``ValueError`` saying so."""
    out: Samples = {}
    for query, name in (('{__name__=~"ctiflow_.*"}', None),
                        (f"rate({counters.metric('received', counters.PARTITION)}[{RATE_WINDOW}])", _RATE)):
        url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        body = json.loads(fetch(url, timeout))
        if not isinstance(body, dict) or body.get("status") != "success":
            raise OSError(f"Prometheus at {base}: "
                          f"{body.get('error', body) if isinstance(body, dict) else body}")
        try:
            for row in body["data"]["result"]:
                labels = {str(k): str(v) for k, v in dict(row["metric"]).items()}
                series = name or labels.pop("__name__")
                labels.pop("__name__", None)
                labels.pop("instance", None)
                out[(series, tuple(sorted(labels.items())))] = float(row["value"][1])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            raise ValueError(f"Prometheus at {base} answered {query!r} with something that is not an instant "
                             "vector (is it a Prometheus?)") from None
    return out


@dataclass
class PartitionStatus:
    stream: str
    partition: str
    cti: float | None = None  # epoch s
    lag: float | None = None  # s
    idle: bool = False
    behind: float | None = None
    received: float = 0
    late: float = 0
    rate: float | None = None  # records/s since the previous read


@dataclass
class JobStatus:
    job: str
    cti: float | None = None
    lag: float | None = None
    partitions: list[PartitionStatus] = field(default_factory=list)
    dead_letter: float = 0
    refused: float = 0
    written: float = 0
    state_bytes: float | None = None
    state_keys: float | None = None
    last_batch_at: float | None = None
    last_batch_seconds: float | None = None
    batches: float = 0
    #: task attempts of its micro-batches that failed and ran again (a Python worker that died)
    failed_attempts: float = 0
    rate: float | None = None  # input records/s since the previous read
    #: operator → its rules' figures (active, versions, scheduled, applied, adjusted, rejected)
    rules: dict[str, dict[str, float]] = field(default_factory=dict)


#: partition series → :class:`PartitionStatus` field
_PARTITION_FIELDS = {counters.metric("cti", counters.PARTITION): "cti",
                     counters.metric("idle", counters.PARTITION): "idle",
                     "ctiflow_partition_offsets_behind": "behind",
                     counters.metric("received", counters.PARTITION): "received",
                     counters.metric("late", counters.PARTITION): "late", _RATE: "rate"}
#: job series → (:class:`JobStatus` field, the (label, value) a sample must have, or None); written: summed
#: over topics
_JOB_FIELDS = {counters.metric("cti"): ("cti", None),
               counters.metric("dead_letter"): ("dead_letter", None),
               counters.metric("refused"): ("refused", None),
               counters.metric("written", ("topic",)): ("written", None),
               counters.metric("state_bytes"): ("state_bytes", ("operator", "")),
               counters.metric("live_keys"): ("state_keys", ("operator", "")),
               "ctiflow_last_batch_timestamp_seconds": ("last_batch_at", None),
               "ctiflow_last_batch_duration_seconds": ("last_batch_seconds", ("stage", "triggerExecution")),
               "ctiflow_batches_total": ("batches", None),
               "ctiflow_task_attempts_failed_total": ("failed_attempts", None)}


#: rule series → the figure it is (labelled by operator)
_RULE_FIELDS = {counters.metric(f"rules_{f}", ("operator",)): f
                for f in ("active", "versions", "scheduled", "applied", "adjusted", "rejected")}


_RULE_RUNS = counters.metric("rule_partial_matches", ("operator", "rule"))


def jobs_of(samples: Samples, previous: dict[str, JobStatus] | None = None, elapsed: float | None = None,
            now: float | None = None) -> dict[str, JobStatus]:
    """The samples (of any number of jobs) as one :class:`JobStatus` each; with the previous
    read and the seconds since, the input rates."""
    now = time.time() if now is None else now
    jobs: dict[str, JobStatus] = {}

    def job(labels: dict) -> JobStatus:
        name = labels.get("job", "?")
        return jobs.setdefault(name, JobStatus(name))

    parts: dict[tuple[str, str, str], PartitionStatus] = {}
    for (name, labels), value in samples.items():
        if math.isnan(value) or math.isinf(value):
            continue  # a gauge with no value yet (NaN) says nothing
        lab = dict(labels)
        j = job(lab)
        if "partition" in lab:
            key = (j.job, lab.get("stream", ""), lab["partition"])
            p = parts.get(key)
            if p is None:
                p = parts[key] = PartitionStatus(key[1], key[2])
                j.partitions.append(p)
            attr = _PARTITION_FIELDS.get(name)
            if attr is not None:
                setattr(p, attr, value >= 1 if attr == "idle" else value)
            continue
        if name in _RULE_FIELDS and lab.get("operator"):
            j.rules.setdefault(lab["operator"], {})[_RULE_FIELDS[name]] = value
            continue
        if name == _RULE_RUNS and lab.get("operator"):  # summed over the operator's rules
            figures = j.rules.setdefault(lab["operator"], {})
            figures["partial_matches"] = figures.get("partial_matches", 0) + value
            continue
        attr, want = _JOB_FIELDS.get(name, (None, None))
        # Prometheus drops a label whose value is empty: operator="" (the total) arrives without it
        if attr is None or (want is not None and lab.get(want[0], "") != want[1]):
            continue
        setattr(j, attr, getattr(j, attr) + value if attr == "written" else value)
    jobs.pop("?", None)
    for j in jobs.values():
        # The lag as of now (a Prometheus value may be a scrape old): wall clock − CTI.
        if j.cti is not None:
            j.lag = now - j.cti
        for p in j.partitions:
            if p.cti is not None:
                p.lag = now - p.cti
        j.partitions.sort(key=lambda p: (p.stream,
                                         int(p.partition) if p.partition.isdigit() else p.partition))
        before = (previous or {}).get(j.job)
        if before is not None and elapsed:
            old = {(p.stream, p.partition): p.received for p in before.partitions}
            for p in j.partitions:
                if (p.stream, p.partition) in old:
                    p.rate = max(0.0, p.received - old[(p.stream, p.partition)]) / elapsed
        if any(p.rate is not None for p in j.partitions):
            j.rate = sum(p.rate or 0 for p in j.partitions)
    return dict(sorted(jobs.items()))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = abs(seconds)
    text = f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h" \
        if s < 172800 else f"{s / 86400:.1f} d"
    return ("-" if seconds < 0 else "") + text


def _count(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f}"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:,.0f}/s"


def one_line(j: JobStatus, now: float) -> str:
    """A job in one line (narrow terminals)."""
    since = None if j.last_batch_at is None else now - j.last_batch_at
    # (failed attempts first: a narrow terminal cuts the line's end)
    failed = f"failed task attempts {_count(j.failed_attempts)} " if j.failed_attempts else ""
    cti = format_cti(None if j.cti is None else int(j.cti * 1000))
    return (f"{j.job}: {failed}CTI {cti} lag {_duration(j.lag)} "
            f"in {_rate(j.rate)} late {_count(sum(p.late for p in j.partitions))} "
            f"dead-letter {_count(j.dead_letter + j.refused)} state {_bytes(j.state_bytes)} "
            f"batch {_duration(since)} ago"
            + "".join(f" rules {op} {_count(r.get('active'))}" for op, r in sorted(j.rules.items())))


def rules_lines(j: JobStatus) -> list[str]:
    """One line per operator with rules: what is in effect and what its rules topic brought."""
    return [f"rules of {op}: {_count(r.get('active'))} active, {_count(r.get('versions'))} versions "
            f"({_count(r.get('scheduled'))} scheduled); records applied {_count(r.get('applied'))}, adjusted "
            f"{_count(r.get('adjusted'))}, rejected {_count(r.get('rejected'))}; partial matches "
            f"{_count(r.get('partial_matches', 0))}"
            for op, r in sorted(j.rules.items())]


def render(jobs: dict[str, JobStatus], width: int, now: float | None = None, source: str = ""):
    """A rich renderable of every job: a table per job (partition rows), or one line per job
    when the terminal is narrower than 100 columns."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    now = time.time() if now is None else now
    if not jobs:
        return Text(f"no ctiflow job reports metrics{f' at {source}' if source else ''} yet")
    if width < 100:
        return Group(*(Text(one_line(j, now), no_wrap=True, overflow="ellipsis") for j in jobs.values()))
    tables = []
    for j in jobs.values():
        since = None if j.last_batch_at is None else now - j.last_batch_at
        title = (f"[b]{escape(j.job)}[/b]  CTI {format_cti(None if j.cti is None else int(j.cti * 1000))}  "
                 f"lag {_duration(j.lag)}  written {_count(j.written)}  dead-letter {_count(j.dead_letter)}"
                 f" (refused {_count(j.refused)})  state {_bytes(j.state_bytes)}, {_count(j.state_keys)} "
                 f"keys  batches {_count(j.batches)}, last {_duration(j.last_batch_seconds)}, "
                 f"{_duration(since)} ago  failed task attempts "
                 + (f"[yellow]{_count(j.failed_attempts)}[/]" if j.failed_attempts else "0"))
        t = Table(expand=False)
        for col in ("stream", "partition", "CTI", "lag", "behind", "in/s", "received", "late", "idle"):
            t.add_column(col, justify="left" if col in ("stream", "CTI") else "right")
        for p in j.partitions:
            t.add_row(Text(p.stream), Text(p.partition),
                      format_cti(None if p.cti is None else int(p.cti * 1000)),
                      _duration(p.lag), _count(p.behind), _rate(p.rate), _count(p.received), _count(p.late),
                      "idle" if p.idle else "")
        tables += [Text.from_markup(title), *map(Text, rules_lines(j)), t]
    return Group(*tables)


@dataclass
class Watch:
    """Where ``ctiflow status`` reads: job endpoints and/or a Prometheus."""

    urls: list[str]
    prometheus: str | None = None

    def read(self) -> tuple[Samples, list[str]]:
        """Every source's samples merged; → (samples, the sources that did not answer)."""
        samples: Samples = {}
        failed = []
        for url in self.urls:
            try:
                samples.update(scrape(url))
            except (OSError, ValueError) as exc:
                failed.append(f"{url} ({exc})")
        if self.prometheus:
            try:
                samples.update(from_prometheus(self.prometheus))
            except (OSError, ValueError) as exc:
                failed.append(f"{self.prometheus} ({exc})")
        return samples, failed
