"""The one table of what a job counts: each counter's name, how it adds up, its labels, its
Prometheus family and its help text. Key groups report counters as a flat ``name → int`` dict
(:meth:`Counters.metrics`), the sink adds what it wrote, the progress file keeps one
line per micro-batch; :func:`merge` adds them up, progress lines and warnings read them
(:mod:`ctiflow.jobs.driver.progress`), :mod:`ctiflow.jobs.driver.metrics` exposes them, ``ctiflow status``
reads them back and the alert rules (``deploy/prometheus/alerts.yml``) name them — all from this
table (a test checks that every ``ctiflow_*`` name the status command and the alert rules use is one
of its families).

A labelled counter's key is ``name@label/label`` (e.g. ``received@transactions/3``): the
form the progress file has always had, so old progress files keep reading; only :func:`key`
builds it and only :func:`split` takes it apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ctiflow.operators.events import CTI_NONE


class Kind(str, Enum):
    """How a counter adds up over the key groups of a batch, and over batches."""

    COUNT = "count"    # work done: summed over key groups and batches
    GAUGE = "gauge"    # the state after a batch: summed over key groups; over batches the last batch's
    SHARED = "shared"  # the same in every key group: the maximum within a batch; over batches the last's
    MAX = "max"        # the maximum within a batch and over batches (the job's CTI never goes back)


PARTITION = ("stream", "partition")


@dataclass(frozen=True)
class Counter:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    #: the Prometheus family it is exposed as (labels ``job`` + :attr:`labels`), or None
    metric: str | None = None
    #: the value is application time in ms: exposed as epoch seconds, and wall clock − it as ``lag``
    timestamp: bool = False
    lag: str | None = None


C, G, S = Kind.COUNT, Kind.GAUGE, Kind.SHARED
TABLE: tuple[Counter, ...] = (
    Counter("received", C, "input records of every stream: events, reference versions, rule records, "
            "undecodable records"),
    Counter("received", C, "input records read (events, reference versions, undecodable records)", PARTITION,
            "ctiflow_records_received_total"),
    Counter("released", C, "events released to the operators in application-time order, and rule records "
            "applied", (), "ctiflow_records_released_total"),
    Counter("late", C, "events behind the CTI (with ADJUST: those wholly behind it)"),
    Counter("late", C, "input records behind the CTI (to the late topic)", PARTITION,
            "ctiflow_records_late_total"),
    Counter("late_records", C, "records written to the late topic (ADJUST: one per dropped share)", (),
            "ctiflow_late_records_written_total"),
    Counter("dead_letter", C, "input records that did not decode or validate, and rule records refused (to "
            "the dead-letter topic)", (),
            "ctiflow_records_dead_letter_total"),
    Counter("refused", C, "released events an operator refused (to the dead-letter topic)", (),
            "ctiflow_records_refused_total"),
    Counter("outputs", C, "result records the operators produced"),
    Counter("expired_keys", C, "keys whose state the key TTL dropped", (), "ctiflow_keys_expired_total"),
    Counter("written", C, "result records the sink wrote"),
    Counter("written", C, "result records in the topic, per topic (a replayed batch counts those an earlier "
            "attempt wrote: exact after kills)", ("topic",), "ctiflow_records_written_total"),
    Counter("replay_skipped", C, "result records a replayed batch had written already (not written again)"),
    Counter("cti", Kind.MAX, "the job's CTI (application time, epoch s): every stream's CTI combined by min",
            (), "ctiflow_cti_timestamp_seconds", timestamp=True, lag="ctiflow_event_time_lag_seconds"),
    Counter("cti", S, "a partition's CTI: the largest event time read from it − the stream's delay "
            "(epoch s)", PARTITION, "ctiflow_partition_cti_timestamp_seconds", timestamp=True,
            lag="ctiflow_partition_event_time_lag_seconds"),
    Counter("side_read", Kind.MAX, "a side input's partition (a rules topic): the offset after the last "
            "record the job read from it (`ctiflow rules list`: what the job has judged)", PARTITION),
    Counter("idle", S, "1 while the source counts the partition idle (left out of the stream's CTI)",
            PARTITION, "ctiflow_partition_idle"),
    Counter("state_bytes", G, "keyed state after the last batch as stored, compressed (operator \"\": all of "
            "it, time layer included)", (), "ctiflow_state_bytes"),
    Counter("state_bytes", G, "keyed state after the last batch, per operator: its snapshots before "
            "compression", ("operator",), "ctiflow_state_bytes"),
    Counter("live_keys", G, "keys with state after the last batch", (), "ctiflow_state_keys"),
    Counter("live_keys", G, "keys with state after the last batch, per operator", ("operator",),
            "ctiflow_state_keys"),
    Counter("state_written", C, "bytes written to the state store (chunks used, and the header)"),
    Counter("chunks_loaded", C, "state chunks used (decoded, or taken from the worker's cache) and written "
            "back unless unchanged"),
    Counter("chunks_cached", C, "of those, taken decoded from the worker's cache"),
    Counter("chunks_caught_up", C, "of those cached, some commits behind and brought up to date with the "
            "delta frames the workers that ran the group since wrote"),
    Counter("chunks_unchanged", C, "of those, not written back: no key of theirs changed (the store holds "
            "them)"),
    Counter("chunk_deltas", C, "of those, written as a delta frame (the keys the batch changed)"),
    Counter("state_read_all", C, "key groups that read their whole state at once (most of it to read, "
            "little from the worker's cache)"),
    Counter("rules_active", S, "rules with a version in effect at the CTI", ("operator",),
            "ctiflow_rules_active"),
    Counter("rules_versions", S, "rule versions in the operator's timeline", ("operator",),
            "ctiflow_rules_versions"),
    Counter("rules_scheduled", S, "rule versions that take effect after the CTI", ("operator",),
            "ctiflow_rules_scheduled"),
    Counter("rules_applied", S, "rule records applied (adjusted ones included) since the job began",
            ("operator",), "ctiflow_rules_applied"),
    Counter("rules_adjusted", S, "late rule records moved to take effect at the CTI", ("operator",),
            "ctiflow_rules_adjusted"),
    Counter("rules_rejected", S, "rule records refused (to the dead-letter topic)", ("operator",),
            "ctiflow_rules_rejected"),
    Counter("rule_partial_matches", G, "partial matches in flight per rule after the last batch (rule \"\": "
            "the operator's own pattern)", ("operator", "rule"), "ctiflow_rule_partial_matches"),
    Counter("state_us", C, "time spent on state: the chunks' reads, decoding, encoding and writes (their "
            "state-store calls, store_us, within it; the header's not), µs"),
    Counter("store_us", C, "time in Spark's state store (the key groups' reads and writes through its state "
            "server; the chunks' within state_us), µs"),
    Counter("python_us", C, "the key groups' calls in the Python workers (a hosted call's in its host), µs"),
    Counter("forward_us", C, "of the key groups' calls run in their hosts, the worker's wait beyond the "
            "host's python_us: the call's rows to the host and its results back, µs"),
)

#: Families the driver exposes from what only it knows (Spark's progress, the broker's end
#: offsets), not from the key groups' counters: name → help.
DRIVER_METRICS: dict[str, str] = {
    "ctiflow": "the job and ctiflow's version",
    "ctiflow_partition_offsets_behind": "records not read yet: the partition's end offset − the offset "
                                        "after the last batch",
    "ctiflow_batches_total": "micro-batches this process completed",
    "ctiflow_task_attempts_failed_total": "task attempts of this process's micro-batches that failed and "
                                          "ran again (a Python worker that died: Spark's log says why)",
    "ctiflow_batch_duration_seconds": "a micro-batch's whole duration (Spark's triggerExecution)",
    "ctiflow_last_batch_duration_seconds": "the last micro-batch's stages (Spark's durationMs: "
                                           "triggerExecution is the whole)",
    "ctiflow_last_batch_records": "Kafka records the last micro-batch read",
    "ctiflow_last_batch_timestamp_seconds": "when the last micro-batch completed (epoch s)",
}

_BY_NAME: dict[tuple[str, int], Counter] = {(c.name, len(c.labels)): c for c in TABLE}
_KINDS: dict[str, Kind] = {c.name: c.kind for c in TABLE if not c.labels}


def key(name: str, *labels: object) -> str:
    """The flat key of counter ``name`` with ``labels`` (``received@transactions/3``)."""
    return name if not labels else f"{name}@{'/'.join(map(str, labels))}"


def split(flat: str) -> tuple[str, tuple[str, ...]]:
    """``key``'s inverse: ``(name, labels)``; the first labels may not hold ``/``, the last may."""
    name, at, rest = flat.partition("@")
    if not at:
        return name, ()
    width = max((n for (c, n) in _BY_NAME if c == name and n), default=1)
    return name, tuple(rest.rsplit("/", width - 1)) if width > 1 else (rest,)


def counter(flat: str) -> Counter | None:
    """The table's entry of a flat key (None: not a counter of this table)."""
    name, labels = split(flat)
    return _BY_NAME.get((name, len(labels)))


def kind(flat: str) -> Kind:
    """How a flat key adds up (a name the table does not know counts: written by another version)."""
    entry = counter(flat)
    if entry is not None:
        return entry.kind
    return _KINDS.get(split(flat)[0], Kind.COUNT)


def is_gauge(flat: str) -> bool:
    """A per-batch state value (the last batch's counts), not a count to add up over batches."""
    return kind(flat) in (Kind.GAUGE, Kind.SHARED)


def merge(totals: dict[str, int], more: Mapping[str, int]) -> None:
    """Add ``more`` (one key group's, or one batch's counters) into ``totals``: counts and gauges
    add up; :attr:`Kind.SHARED` and :attr:`Kind.MAX` take the maximum."""
    for name, n in more.items():
        if kind(name) in (Kind.SHARED, Kind.MAX):
            totals[name] = max(totals.get(name, n), n)
        else:
            totals[name] = totals.get(name, 0) + n


def labelled(counters: Mapping[str, int], name: str) -> Iterator[tuple[tuple[str, ...], int]]:
    """``(labels, value)`` of every labelled key of counter ``name`` in ``counters``, in key order."""
    prefix = f"{name}@"
    for flat, value in sorted(counters.items()):
        if flat.startswith(prefix):
            yield split(flat)[1], value


def metric(name: str, labels: tuple[str, ...] = ()) -> str:
    """The Prometheus family of counter ``name`` with ``labels``."""
    entry = _BY_NAME.get((name, len(labels)))
    if entry is None or entry.metric is None or entry.labels != labels:
        raise KeyError(f"no exposed counter {name!r} with labels {labels}")
    return entry.metric


def families() -> dict[str, list[Counter]]:
    """Prometheus family → the counters it is made of (one with no labels: its label ``""``)."""
    out: dict[str, list[Counter]] = {}
    for c in TABLE:
        if c.metric is not None:
            out.setdefault(c.metric, []).append(c)
    return out


def all_metric_names() -> set[str]:
    """Every family name a job exposes: the counters', their lag families, the driver's."""
    names = set(DRIVER_METRICS)
    for c in TABLE:
        names.update(n for n in (c.metric, c.lag) if n is not None)
    return names


@dataclass
class Counters:
    """What one key group did in one call; the sink sums them per micro-batch (progress file).
    Every field is a counter of :data:`TABLE` (a test keeps them the same).

    Balance, for every stream together: ``received = released + late + dead_letter + buffered``
    (``buffered``: admitted, waiting for a CTI; 0 after the final CTI)."""

    received: int = 0
    released: int = 0
    late: int = 0
    late_records: int = 0
    dead_letter: int = 0
    refused: int = 0
    outputs: int = 0
    expired_keys: int = 0
    cti: int = CTI_NONE     # after the call
    state_bytes: int = 0    # after the call (committed)
    live_keys: int = 0      # after the call's commit
    state_written: int = 0
    chunks_loaded: int = 0
    chunks_cached: int = 0
    chunks_caught_up: int = 0
    chunks_unchanged: int = 0
    chunk_deltas: int = 0
    state_read_all: int = 0
    state_us: int = 0
    store_us: int = 0
    python_us: int = 0
    forward_us: int = 0  # (set by the worker that forwarded the call: ctiflow.jobs.datapath.adapter)
    by_partition: dict = field(default_factory=dict)  # (stream, partition) → [received, late]
    #: gauges after the call: (stream, partition) → (its CTI: frontier − delay, idle 0/1); operator →
    #: (bytes, keys)
    partitions: dict = field(default_factory=dict)
    ops: dict = field(default_factory=dict)
    #: (stream, partition) of a side input → the offset after the last record read from it
    side_read: dict = field(default_factory=dict)
    #: operator → its shared state's figures (``<family>_<figure>``:
    #: :class:`ctiflow.jobs.core.broadcast.SharedStates`)
    shared: dict = field(default_factory=dict)
    #: (operator, name) → an operator's tallies over the group's chunks (partial matches per rule)
    tallies: dict = field(default_factory=dict)

    def count(self, stream: str, partition: int, late: bool) -> None:
        slot = self.by_partition.get((stream, partition))  # per event: no string built here
        if slot is None:
            slot = self.by_partition[(stream, partition)] = [0, 0]
        slot[0] += 1
        slot[1] += late

    def metrics(self) -> dict[str, int]:
        """Flat ``name → int`` (what the sink adds up: :func:`merge`)."""
        out = {k: v for k, v in vars(self).items()
               if k not in ("by_partition", "partitions", "ops", "shared", "tallies", "side_read")}
        for (name, rule), n in self.tallies.items():
            out[key("rule_partial_matches", name, rule)] = n
        for name, stats in self.shared.items():
            for figure, n in stats.items():
                out[key(figure, name)] = n
        for (stream, partition), (received, late) in self.by_partition.items():
            out[key("received", stream, partition)] = received
            out[key("late", stream, partition)] = late
        for (stream, partition), (cti, idle) in self.partitions.items():
            out[key("cti", stream, partition)] = cti
            out[key("idle", stream, partition)] = idle
        for (stream, partition), offset in self.side_read.items():
            out[key("side_read", stream, partition)] = offset
        for name, (size, keys) in self.ops.items():
            out[key("state_bytes", name)] = size
            out[key("live_keys", name)] = keys
        return out
