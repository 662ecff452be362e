"""Brute-force oracles for tests: what a job's results must be, computed the slow, obvious way.

Nothing here reuses the operators' algorithms (no reorder buffer, no exponential histogram,
no binner): late events are found by recomputing the watermark batch by batch, sliding counts
by rescanning each key's history, bins by scanning every candidate bin with exact
``fractions.Fraction`` arithmetic. Everything is O(n²)-ish and meant for test-sized inputs.

The Spark semantics modelled (one watermarked input stream, as ``ctiflow.jobs.driver.pipeline`` sets it up):

* **Micro-batches.** ``cuts`` are the arrival indices at which a new micro-batch begins (as in
  ``ctiflow.jobs.testing.time_layer.TimeLayer.run``); index 0 always begins batch 0, so ``cuts=()`` is one
  batch. Or ``batches``: each arrival's batch number.
* **CTI per partition, combined by min.** After batch ``i`` partition ``p``'s CTI is
  ``max(start of p's events in batches ≤ i) − delay`` (events that turn out late included; dead
  letters have no event time), and the stream's CTI is the minimum over its partitions — no
  CTI until every partition has been read from. It never decreases. (Idle partitions are not
  modelled: tests give every partition records to read until its input ends.)
  ``batches`` gives each event's micro-batch directly; :func:`spread_batches` computes it for
  a multi-partition topic read ``budget`` records a batch.
* **Late check.** The events of batch ``i`` are checked against the watermark in effect during
  batch ``i``, i.e. the one computed at the end of batch ``i − 1`` (Spark's watermark for late
  events); batch 0 has none. With the ``drop`` policy an event is late iff ``start < CTI``
  (an event *at* the CTI is on time). With ``adjust``, an event whose lifetime ends at or
  before the CTI (a point event ``[t, t+1)``, an interval with ``max(end, start + 1) ≤ CTI``) is
  late; an interval reaching past the CTI is admitted with its start moved to the CTI (its
  original start is kept for proration).
* **Processing order.** Admitted events reach order-dependent operators in application-time
  order: ``(start, partition, offset)`` with the (possibly adjusted) start. A bounded run
  ends with a final CTI at +∞, so every admitted event is processed and every bin is final.

Events are any objects with ``key``, ``start``, ``end``, ``fields``, ``partition`` and
``offset`` attributes (``ctiflow.operators.time.Event`` works); :func:`to_events` turns workload
records into such objects.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ctiflow.jobs.driver.config import CountOp, JobConfig
from ctiflow.operators.cep.expr.expression import compile_expression
from ctiflow.operators.errors import ConfigError, invalid_choice

ADMITTED, ADJUSTED, LATE = "admitted", "adjusted", "late"
POLICIES = ("drop", "adjust")


@dataclass(frozen=True)
class OracleEvent:
    """An input event as the oracle sees it (what :func:`to_events` builds)."""

    key: str
    start: int
    end: int
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    partition: int = 0
    offset: int = 0


def to_events(records: Iterable[Mapping[str, Any]], key_field: str, time_field: str,
              end_field: str | None = None,
              partition_of: Callable[[str], int] | None = None) -> list[OracleEvent]:
    """Workload records (arrival order) → events. ``partition_of(key)`` gives the Kafka
    partition (default: all in partition 0); offsets count up per partition in arrival order."""
    next_offset: dict[int, int] = defaultdict(int)
    out = []
    for rec in records:
        key = str(rec[key_field])
        part = partition_of(key) if partition_of else 0
        start = rec[time_field]
        out.append(OracleEvent(key, start, rec[end_field] if end_field else start, dict(rec), part,
                               next_offset[part]))
        next_offset[part] += 1
    return out


def even_cuts(n: int, batch_size: int) -> list[int]:
    """Cuts of ``n`` arrivals into micro-batches of ``batch_size`` (the last may be shorter)."""
    if batch_size < 1:
        raise ConfigError(f'Invalid "batch_size" value: {batch_size!r}. It must be >= 1.')
    return list(range(batch_size, n, batch_size))


@dataclass(frozen=True)
class Checked:
    """One arrival and the oracle's verdict on it.

    ``cti`` is the CTI the event was checked against (None: no CTI yet); ``status`` is
    ``admitted``, ``adjusted`` (admitted with ``start`` moved to ``cti``) or ``late``;
    ``start`` is the start the operators see, ``event.start`` the original one."""

    event: Any
    index: int
    batch: int
    cti: int | None
    status: str
    start: int

    @property
    def key(self) -> str:
        return self.event.key

    @property
    def end(self) -> int:
        return self.event.end

    @property
    def fields(self) -> Mapping[str, Any]:
        return self.event.fields

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.start, self.event.partition, self.event.offset)


def batch_numbers(n: int, cuts: Iterable[int] = ()) -> list[int]:
    """The micro-batch of each of ``n`` arrivals."""
    starts = set(cuts)
    out, batch = [], 0
    for i in range(n):
        if i in starts and i > 0:
            batch += 1
        out.append(batch)
    return out


def spread_batches(events: Sequence[Any], budget: int) -> list[int]:
    """The micro-batch of each event of a multi-partition topic (``events`` in arrival order,
    ``partition`` and ``offset`` set) when every batch reads at most ``budget`` records, as
    the source's ``maxOffsetsPerTrigger`` does: each batch gives each partition its share of the
    budget in proportion to the records it has left (whole records, rounded down), then one more
    record to each partition in partition order while the budget lasts (as Spark's Kafka source
    prorates it)."""
    if budget < 1:
        raise ConfigError(f'Invalid "budget" value: {budget!r}. It must be >= 1.')
    queues: dict[int, list[int]] = defaultdict(list)
    for i, e in sorted(enumerate(events), key=lambda x: (x[1].partition, x[1].offset)):
        queues[e.partition].append(i)
    out = [0] * len(events)
    batch = 0
    while any(queues.values()):
        remaining = {p: len(q) for p, q in queues.items()}
        total = sum(remaining.values())
        if total <= budget:
            shares = remaining
        else:
            shares = {p: int(Fraction(budget * n, total)) for p, n in remaining.items()}
            spare = budget - sum(shares.values())
            for p in sorted(shares):
                if spare and shares[p] < remaining[p]:
                    shares[p] += 1
                    spare -= 1
        for p, n in shares.items():
            for i in queues[p][:n]:
                out[i] = batch
            del queues[p][:n]
        batch += 1
    return out


def batch_ctis(events: Sequence[Any], delay: int, cuts: Iterable[int] = (),
               batches: Sequence[int] | None = None) -> list[int | None]:
    """The CTI in effect during each micro-batch: None for batch 0 (and until every partition
    has had a batch), then ``min over partitions of max(start in earlier batches) − delay``,
    never decreasing."""
    batches = list(batches) if batches is not None else batch_numbers(len(events), cuts)
    count = max(batches) + 1 if batches else 0
    partitions = {getattr(e, "partition", 0) for e in events}
    latest: list[dict[int, int]] = [{} for _ in range(count)]
    for e, b in zip(events, batches):
        p = getattr(e, "partition", 0)
        if e.start > latest[b].get(p, e.start - 1):
            latest[b][p] = e.start
    out: list[int | None] = []
    seen: dict[int, int] = {}
    cti: int | None = None
    for b in range(count):
        if seen.keys() >= partitions and partitions:
            candidate = min(seen[p] for p in partitions) - delay
            cti = candidate if cti is None else max(cti, candidate)
        out.append(cti)
        for p, t in latest[b].items():
            seen[p] = max(seen.get(p, t), t)
    return out


def check(events: Sequence[Any], delay: int, cuts: Iterable[int] = (), policy: str = "drop",
          batches: Sequence[int] | None = None) -> list[Checked]:
    """Every arrival with its verdict (arrival order); see the module docstring."""
    if policy not in POLICIES:
        raise invalid_choice("policy", policy, POLICIES)
    batches = list(batches) if batches is not None else batch_numbers(len(events), list(cuts))
    ctis = batch_ctis(events, delay, batches=batches)
    out = []
    for i, (e, b) in enumerate(zip(events, batches)):
        cti = ctis[b]
        if cti is None or e.start >= cti:
            out.append(Checked(e, i, b, cti, ADMITTED, e.start))
        elif policy == "drop" or max(e.end, e.start + 1) <= cti:
            out.append(Checked(e, i, b, cti, LATE, e.start))
        else:
            out.append(Checked(e, i, b, cti, ADJUSTED, cti))
    return out


def late_indices(events: Sequence[Any], delay: int, cuts: Iterable[int] = (), policy: str = "drop",
                 batches: Sequence[int] | None = None) -> set[int]:
    """Arrival indices of the events that do not enter the operators (the late set)."""
    return {c.index for c in check(events, delay, cuts, policy, batches) if c.status == LATE}


def admitted(checked: Iterable[Checked]) -> list[Checked]:
    """The admitted (and adjusted) events in processing order ``(start, partition, offset)``."""
    return sorted((c for c in checked if c.status != LATE), key=lambda c: c.order)


# ---------------------------------------------------------------------------------------------
# counts
# ---------------------------------------------------------------------------------------------

GLOBAL_KEY = "*"


def _weight(c: Checked, predicate: Callable[[Mapping[str, Any]], Any] | None, value_field: str | None) -> int:
    if predicate is not None and not predicate(c.fields):
        return 0
    if value_field is None:
        return 1
    v = c.fields.get(value_field)
    return 0 if v is None else int(v)


def sliding_counts(events: Iterable[Checked], window_kind: str, window: int,
                   predicate: Callable[[Mapping[str, Any]], Any] | None = None, per_key: bool = True,
                   value_field: str | None = None) -> list[dict[str, Any]]:
    """Exact count of interesting events (or sum of ``value_field``) at each admitted event, the
    event included, as the ``per_event`` count operator must approximate it.

    ``window_kind="events"``: over the key's last ``window`` events (interesting or not);
    ``"time"``: over the key's events processed so far with ``start > t − window``, where ``t``
    is the current event's start. One dict per event in processing order:
    ``{"key", "time", "partition", "offset", "exact"}`` (key ``"*"`` when not ``per_key``)."""
    if window_kind not in ("events", "time"):
        raise invalid_choice("window_kind", window_kind, ("events", "time"))
    history: dict[str, list[Checked]] = defaultdict(list)
    out = []
    for c in admitted(events):
        key = c.key if per_key else GLOBAL_KEY
        past = history[key]
        past.append(c)
        if window_kind == "events":
            inside = past[-window:]
        else:
            inside = [p for p in past if p.start > c.start - window]
        out.append({"key": key, "time": c.start, "partition": c.event.partition, "offset": c.event.offset,
                    "exact": sum(_weight(p, predicate, value_field) for p in inside)})
    return out


def count_at(events: Iterable[Checked], key: str, time: int, window_kind: str, window: int,
             predicate: Callable[[Mapping[str, Any]], Any] | None = None, per_key: bool = True,
             value_field: str | None = None) -> int:
    """Exact count for ``key`` at application time ``time`` over the admitted events starting at
    or before ``time`` (what a ``per_cti`` record at ``time = cti − 1`` must approximate)."""
    mine = [c for c in admitted(events) if (c.key if per_key else GLOBAL_KEY) == key and c.start <= time]
    if window_kind == "events":
        inside = mine[-window:]
    elif window_kind == "time":
        inside = [c for c in mine if c.start > time - window]
    else:
        raise invalid_choice("window_kind", window_kind, ("events", "time"))
    return sum(_weight(c, predicate, value_field) for c in inside)


def exact_counts(cfg: JobConfig, records: Iterable[Mapping[str, Any]],
                 read_topic: Callable[[str], list[dict]]) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """Exact counts at the time of every count record in ``records`` (a job's count results):
    ``(counter, key) → [(time, exact count)]``, the reference line of ``ctiflow plot counts``.

    The input is what the job read, as ``read_topic(topic)`` returns it (decoded records, see
    :func:`ctiflow.jobs.datapath.kafka.read_topic`): the fast stream's topic, or the enriched topic when the
    job writes one (predicates may use the reference version). Every decodable record with a key and
    an integer time counts, late ones included; the CTI is not modelled (delay 0, one batch)."""
    src = cfg.source(cfg.reference.fast) if cfg.reference else cfg.sources[0]
    if cfg.reference is not None and cfg.reference.output:
        inputs = [{**json.loads(r["event_json"]), "reference": json.loads(r["reference_json"] or "null")}
                  for r in read_topic(cfg.reference.output) if "_undecodable" not in r]
    else:
        inputs = read_topic(src.topic)
    inputs = [r for r in inputs if "_undecodable" not in r
              and r.get(src.key_field) is not None and isinstance(r.get(src.time_field), int)]
    checked = check(to_events(inputs, src.key_field, src.time_field), 0)
    by_key: dict[str, list[Checked]] = defaultdict(list)
    for c in checked:
        by_key[c.key].append(c)
    exact: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    ops = {op.name: op for op in cfg.operators if isinstance(op, CountOp)}
    for r in records:
        op = ops.get(r.get("counter"))
        if op is None:
            continue
        kind, window = ("events", op.window.events) if op.window.events else ("time", op.window.time)
        predicate = compile_expression(op.predicate) if op.predicate else None
        pool = checked if not op.per_key else by_key.get(r["key"], [])
        exact[(r["counter"], r["key"])].append(
            (r["time"], count_at(pool, r["key"], r["time"], kind, window, predicate, op.per_key,
                                 op.value_field)))
    return exact


# ---------------------------------------------------------------------------------------------
# bins
# ---------------------------------------------------------------------------------------------


@dataclass
class ExactBin:
    """A final bin ``(bin_start, bin_end]`` of one key, in exact arithmetic."""

    key: str
    bin_start: int
    bin_end: int
    measures: dict[str, Fraction]
    fraction_sum: Fraction = Fraction(0)
    events: int = 0


def bin_shares(start: int, end: int, bin_size: int, origin: int = 0) -> dict[int, Fraction]:
    """``bin_start → fraction`` of ``(start, end]`` in each bin ``(b, b + bin_size]``, found by
    scanning every bin from one surely before ``start`` to one surely after ``end``. A
    zero-length event has fraction 1 in the bin with ``b < start ≤ b + bin_size``."""
    if end < start:
        raise ValueError(f"end < start: {end} < {start}")
    b = origin + math.floor(Fraction(start - origin, bin_size)) * bin_size - bin_size
    shares: dict[int, Fraction] = {}
    while b <= end:
        lo, hi = b, b + bin_size
        if end == start:
            if lo < start <= hi:
                shares[b] = Fraction(1)
        else:
            overlap = min(end, hi) - max(start, lo)
            if overlap > 0:
                shares[b] = Fraction(overlap, end - start)
        b += bin_size
    return shares


def _values(c: Checked, measures: Sequence[str]) -> dict[str, Fraction]:
    return {m: Fraction(c.fields[m]) for m in measures}


def _split_shares(c: Checked, bin_size: int, origin: int) -> tuple[dict[int, Fraction], dict[int, Fraction]]:
    """(applied, late) shares of one checked event: an adjusted event is prorated over its
    original lifetime and loses the bins that were final at its CTI (``bin_end < cti``)."""
    shares = bin_shares(c.event.start, c.event.end, bin_size, origin)
    if c.status == LATE:
        return {}, shares
    if c.status == ADMITTED:
        return shares, {}
    applied = {b: f for b, f in shares.items() if b + bin_size >= c.cti}
    return applied, {b: f for b, f in shares.items() if b not in applied}


def final_bins(checked: Iterable[Checked], bin_size: int, origin: int = 0,
               measures: Sequence[str] = ()) -> dict[tuple[str, int], ExactBin]:
    """Every final bin after the run (``(key, bin_start) → ExactBin``) from the checked arrivals
    (:func:`check`): admitted events whole, adjusted events minus their late share, late events
    not at all. ``events`` counts the events with a positive share in the bin."""
    bins: dict[tuple[str, int], ExactBin] = {}
    for c in checked:
        applied, _ = _split_shares(c, bin_size, origin)
        if not applied:
            continue
        vals = _values(c, measures)
        for b, f in applied.items():
            slot = bins.get((c.key, b))
            if slot is None:
                slot = bins[(c.key, b)] = ExactBin(c.key, b, b + bin_size, {m: Fraction(0) for m in measures})
            for m, v in vals.items():
                slot.measures[m] += v * f
            slot.fraction_sum += f
            slot.events += 1
    return dict(sorted(bins.items()))


def late_shares(checked: Iterable[Checked], bin_size: int, origin: int = 0,
                measures: Sequence[str] = ()) -> list[tuple[Checked, Fraction, dict[str, Fraction]]]:
    """What goes to ``late`` per event: ``(checked, fraction, measures)`` for every late event
    (fraction 1) and every adjusted event with a share of final bins. Together with
    :func:`final_bins` it conserves every measure."""
    out = []
    for c in checked:
        _, lost = _split_shares(c, bin_size, origin)
        if not lost:
            continue
        frac = sum(lost.values(), Fraction(0))
        vals = _values(c, measures)
        out.append((c, frac, {m: v * frac for m, v in vals.items()}))
    return out
