"""``ctiflow rules test``: a candidate rule over a range of the job's history, judged as the live job
would have judged it, beside the version in effect then (docs/concepts/rules.md, "Trying a rule
before it goes live").

How (:func:`try_rule`): a bounded run of a job derived from the user's (:func:`trial_job`). Its
sources are read from the offsets Kafka gives for ``from − cti.delay`` up to those for
``to + the longest run + 2 × cti.delay`` (:func:`reading_range`: the range, not the topic). One copy
of the operator is fed only the candidate — put at ``from``, deleted at ``to``, runs in flight
drained — and one copy the rule's versions in effect over the range, deleted at ``to`` alike. Both
copies write to topics of the run's own, deleted afterwards, with a checkpoint of its own beside
the job's (``<checkpoint>.rules-test-<token>``: where the job's cluster reaches), deleted
afterwards: nothing is written to the job's topics, checkpoint or rules topic.

Exactness: a rule version judges the events at or after its effective time, runs started before a
deletion drain to their end, and the CTIs are the job's own, so the candidate's records are those
the live job emits for the same rule put at ``from`` and deleted at ``to``
(``integration_tests/test_rule_trial.py`` checks it against such a live run). What the range cannot
reproduce: an event the live job declared late because of micro-batch boundaries before ``from``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from ctiflow.jobs.driver.config import JobConfig, MatchOp
from ctiflow.jobs.driver.rules import (_operator, _warn, check_rule, effective_ms, iso_time, produce_rule,
                                       Written, judge, read_written)
from ctiflow.operators.cep.rules import Rule
from ctiflow.operators.errors import ConfigError

#: What a record says of its rule and operator rather than of what it matched (left out when the
#: candidate's records are compared with the version in effect's).
RULE_FIELDS = ("pattern", "match_id", "rule_id", "rule_version", "rule_effective_time")


class Decoded(Sequence):
    """Records read from a topic, kept as their bytes and decoded to dicts (``decode``) when first
    looked at: a rule's timed-out runs can be tens of thousands, and ``rules test`` shows only how
    many unless it writes them (``--out``); decoding them took most of the time reading the results
    back (docs/changelog.md, "The range's first fetch")."""

    def __init__(self, values: list[bytes | None], decode: Callable[[bytes | None], dict]) -> None:
        self._values, self._decode = values, decode

    @cached_property
    def _records(self) -> list[dict]:
        return [self._decode(v) for v in self._values]

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i):
        return self._records[i]

    def __iter__(self):
        return iter(self._records)


@dataclass
class RuleTrial:
    """A rule trial's records (``ctiflow rules test``): the candidate's matches and timed-out runs,
    the version in effect's
    (``against`` None: not compared), and the difference — records of the candidate not among
    the other's (``added``), the other way (``removed``), and how many are in both (``unchanged``),
    each compared by what it matched (:func:`matched`)."""

    rule_id: str
    operator: str
    start: int
    end: int
    against: str | None
    matches: Sequence[dict]
    timed_out: Sequence[dict]
    against_matches: Sequence[dict] = field(default_factory=list)
    against_timed_out: Sequence[dict] = field(default_factory=list)
    events_read: int = 0
    seconds: float = 0.0
    starts: dict = field(default_factory=dict)  # topic → partition → first offset read
    ends: dict = field(default_factory=dict)  # topic → partition → the offset after the last read

    @cached_property
    def added(self) -> list[dict]:
        return _minus(self.matches, self.against_matches)

    @cached_property
    def removed(self) -> list[dict]:
        return _minus(self.against_matches, self.matches)

    @property
    def unchanged(self) -> int:
        return len(self.matches) - len(self.added)

    def per_key(self, top: int) -> list[tuple[str, int]]:
        """The ``top`` keys by matches (ties by key)."""
        counts = Counter(str(r.get("key")) for r in self.matches)
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]

    @property
    def period(self) -> str:
        """``hour`` for a range of up to two days, else ``day``: :meth:`per_period`'s bins."""
        return "hour" if self.end - self.start <= 2 * 86_400_000 else "day"

    def per_period(self) -> list[tuple[int, int]]:
        """Matches by the hour (or day: :attr:`period`) of their last event, in time order;
        records without event times (a MATCH_RECOGNIZE query's measures) are not binned."""
        size = 3_600_000 if self.period == "hour" else 86_400_000
        counts = Counter(r["last_time"] // size * size for r in self.matches
                         if isinstance(r.get("last_time"), int))
        return sorted(counts.items())


def matched(record: dict) -> str:
    """What a record matched — its key, events and measures without :data:`RULE_FIELDS` — as one
    comparable text."""
    return json.dumps({k: v for k, v in record.items() if k not in RULE_FIELDS}, sort_keys=True, default=str)


def _minus(these: list[dict], those: list[dict]) -> list[dict]:
    """``these`` records not in ``those`` (as multisets, by :func:`matched`), in ``these``' order."""
    left = Counter(matched(r) for r in those)
    out = []
    for r in these:
        m = matched(r)
        if left[m]:
            left[m] -= 1
        else:
            out.append(r)
    return out


def against_rules(job: JobConfig, op: MatchOp, rule_id: str, against: str | None, start: int, end: int,
                  written: list[Written],
                  warn: Callable[[str], None] = _warn) -> tuple[list[Rule], str | None]:
    """The versions the comparison runs over [start, end) → ``(rules, label)``: ``current`` — the
    rule's versions in the job's rules topic as the job applied them, or will (:func:`judge`:
    refused ones left out, adjusted ones at the time they took effect), the one in
    effect at ``start`` put again at ``start``, those taking effect before ``end`` at their times —;
    ``ID@VERSION`` — that version put at ``start``; ``none`` — none. A deletion at ``end`` closes
    each (runs in flight drain). ``written``: the rules topic's records (:func:`read_written`). A
    :class:`ConfigError` names what is not there."""
    if against in (None, "none"):
        return [], None
    accepted = [j.in_effect for j in judge(job, op, warn, written)[1] if j.effective is not None]
    if against == "current":
        mine = [r for r in accepted if r.rule_id == rule_id]
        before = [r for r in mine if r.effective_time <= start]
        put_before = bool(before) and before[-1].action == "put"
        timeline = [replace(before[-1], effective_time=start)] if put_before else []
        timeline += [r for r in mine if start < r.effective_time < end]
        label = f"current ({rule_id}: {len(timeline)} version(s) over the range)"
    else:
        wanted_id, _, version = against.rpartition("@")
        if not wanted_id or not version.isdigit():
            raise ConfigError(f"--against {against!r}: give current, none or ID@VERSION (e.g. {rule_id}@2)")
        hit = [r for r in accepted
               if r.rule_id == wanted_id and r.version == int(version) and r.action == "put"]
        if not hit:
            known = ", ".join(f"{r.rule_id}@{r.version}" for r in accepted if r.action == "put") or "none"
            raise ConfigError(f"--against {against!r}: operator {op.name!r} has no such put version in "
                              f"{op.rules.topic!r} (those it has: {known})")
        timeline, label = [replace(hit[0], effective_time=start)], against
    if not timeline:
        return [], label
    last = max(r.version for r in timeline)
    return [*timeline, Rule(timeline[-1].rule_id, op.name, last + 1, end, "delete")], label


def candidate_rules(job: JobConfig, op: MatchOp, definition: str, rule_id: str, start: int, end: int,
                    written: list[Written]) -> list[Rule]:
    """The candidate as ``rules put`` would write it (the last version of ``rule_id`` in
    ``written``, the rules topic's records, + 1), effective at ``start``, and its deletion at
    ``end``; refused before anything runs if the job would refuse it (:func:`check_rule`, the job's
    reason)."""
    version = max((w.rule.version for w in written if w.rule.rule_id == rule_id), default=0) + 1
    rule = Rule(rule_id, op.name, version, start, "put", definition)
    check_rule(job, rule)
    return [rule, Rule(rule_id, op.name, version + 1, end, "delete")]


def reading_range(job: JobConfig, start: int, horizon: int | None) -> tuple[dict, dict]:
    """Per source topic → partition: the first offset to read — for ``start − cti.delay`` by the
    records' event time (Kafka's offsets for that time, checked against the records:
    :func:`ctiflow.jobs.datapath.kafka.offsets_for_times`); the reference stream from its own
    ``starting_offsets`` (the join needs its earlier versions) — and the offset to stop at (for
    ``horizon + 2 × cti.delay``; a topic left out, ``horizon`` None: each partition's end). A
    :class:`ConfigError` lists the partitions whose retention does not reach back that far.
    Each partition is searched by a consumer of its own, several at once: a search is a few fetches
    of one record, each a round trip."""
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import closing

    from ctiflow.jobs.avro.serde import AvroDeserializer, registry_client
    from ctiflow.jobs.datapath.kafka import (SchemaTopic, consumer, first_record_at, low_offset,
                                             offsets_for_times, topic_partitions, true_end_offset)
    from ctiflow.jobs.driver.recognize import job_schema_store

    bootstrap, client = job.kafka.bootstrap_servers, job.kafka.client_config()
    store, lookup = job_schema_store(job), SchemaTopic(bootstrap, client)
    registry = (registry_client(job.kafka.schema_registry.url, job.kafka.schema_registry.client_config())
                if job.kafka.schema_registry.url else None)
    reference = job.reference.source if job.reference is not None else None
    # (a search fetches one record at a time: small fetches, little read ahead; tansu answers a fetch
    # with up to fetch.max.bytes, which may not be below message.max.bytes)
    probe = {"group.id": "ctiflow-rules-test", "max.partition.fetch.bytes": 65536, "fetch.max.bytes": 65536,
             "message.max.bytes": 65536, "queued.min.messages": 10, "queued.max.messages.kbytes": 1024}

    def search(src, p: int, time_of) -> tuple[int | None, int | None, tuple | None]:
        """One partition's (end, start, (first offset, its time)); start and first None for the
        reference stream, end None without a horizon."""
        with closing(consumer(bootstrap, client, **probe)) as cons:
            seen: dict = {}  # the records the searches looked at (the second starts from them)
            end = (None if horizon is None else offsets_for_times(
                cons, src.topic, [p], horizon + 2 * src.cti.delay, time_of, seen=seen)[p])
            if src.name == reference:
                return end, None, None
            begin = offsets_for_times(cons, src.topic, [p], start - src.cti.delay, time_of, seen=seen)[p]
            low = low_offset(cons, src.topic, p)
            first = seen[(p, low)] if (p, low) in seen else first_record_at(
                cons, src.topic, p, low, true_end_offset(cons, src.topic, p, low))
            return end, begin, (low, None if first is None else time_of(first[1], first[2]))

    work = []
    for src in job.sources:
        decode = AvroDeserializer(src.schema_name, store=store, registry=registry,
                                  subject=f"{src.topic}-value", lookup=lookup)
        time_of = _event_time(decode, src.time_field)
        work += [(src, p, time_of) for p in topic_partitions(bootstrap, src.topic, client)]
    with ThreadPoolExecutor(max(1, min(8, len(work)))) as pool:
        found = list(pool.map(lambda w: search(*w), work))
    starts, ends, held = {}, {}, {}
    for (src, p, _), (end, begin, first) in zip(work, found):
        if end is not None:
            ends.setdefault(src.topic, {})[p] = end
        if begin is not None:
            starts.setdefault(src.topic, {})[p] = begin
            held.setdefault(src.topic, {})[p] = first
    short = [line for src in job.sources if src.topic in held
             for line in past_retention(src.topic, held[src.topic], start - src.cti.delay)]
    if short:
        raise ConfigError(f"--from {iso_time(start)}: the test reads each source from its cti.delay before "
                          "the range's start, and these partitions do not reach back that far", short)
    return starts, ends


def past_retention(topic: str, held: dict[int, tuple[int, int | None]], wanted: int) -> list[str]:
    """The partitions of ``topic`` that do not reach back to time ``wanted``, each as a line that
    says from when it holds records; ``held``: partition → (its first offset, that record's time).
    A partition whose first offset is 0 lost nothing to retention, whatever its first time."""
    return [f"{topic}[{p}] holds records from {iso_time(first)} on (offset {low}), not from "
            f"{iso_time(wanted)}: the earlier ones are past its retention"
            for p, (low, first) in sorted(held.items()) if low > 0 and first is not None and first > wanted]


def _event_time(decode, field: str) -> Callable[[bytes | None, int], int | None]:
    """A record's event time (``field`` of its value), None when it does not decode (a dead letter)."""
    def time_of(value: bytes | None, timestamp: int) -> int | None:
        try:
            t = decode(value)[field]
        except Exception:  # noqa: BLE001 - a record the job dead-letters has no time to search by
            return None
        return t if isinstance(t, int) else None

    return time_of


def trial_job(job: JobConfig, op: MatchOp, token: str, starts: dict, ends: dict, checkpoint: str,
             compare: bool) -> JobConfig:
    """The job the test runs: the user's sources, read over the range, and its reference join
    (without its output); the operator ``op`` twice without its own pattern — ``candidate`` and
    (``compare``) ``against`` — each with a rules topic and outputs of the run's own, named
    ``<job>.rules-test-<token>.…``; the job's state and Spark settings, a checkpoint of its own."""
    base = f"{job.job[:60]}.rules-test-{token}"
    spec = job.model_dump(mode="json", by_alias=True, exclude_unset=True)
    spec["job"] = base
    def offsets(topic: str, of: dict) -> str:
        return json.dumps({topic: {str(p): o for p, o in of[topic].items()}})

    for src in spec["sources"]:
        if src["topic"] in starts:
            src["starting_offsets"] = offsets(src["topic"], starts)
        if src["topic"] in ends:
            src["ending_offsets"] = offsets(src["topic"], ends)
    if spec.get("reference"):
        spec["reference"].pop("output", None)
    copy = op.model_dump(mode="json", by_alias=True, exclude_unset=True)
    language = op.language
    for drop in ("pattern", "sql", "timed_out"):
        copy.pop(drop, None)
    spec["operators"] = [
        {**copy, "name": f"{op.name}.{role}", "output": f"{base}.{role}",
         "timed_out": f"{base}.{role}-timed-out",
         "rules": {**copy["rules"], "topic": f"{base}.{role}-rules", "on_change": "drain",
                   "late_rules": "reject", "sync": "import", "language": language}}
        for role in (("candidate", "against") if compare else ("candidate",))]
    spec["outputs"] = {**spec.get("outputs", {}), "late": f"{base}.late",
                       "dead_letter": f"{base}.dead-letter"}
    spec["spark"] = {**spec.get("spark", {}), "checkpoint": checkpoint}
    spec.pop("metrics", None)
    return JobConfig.model_validate(spec)


def try_rule(job: JobConfig, definition: str, *, start: str | int, end: str | int,
              operator: str | None = None, rule_id: str = "candidate", against: str | None = "current",
              spark=None, warn: Callable[[str], None] = _warn) -> RuleTrial:
    """Run ``definition`` (a pattern's YAML or a ``MATCH_RECOGNIZE`` query, as ``rules put`` takes)
    as rule ``rule_id`` of ``operator`` over the job's events with event time in [start, end), as a
    bounded run of its own (module docstring), compared with ``against`` (``current``, ``none``,
    ``ID@VERSION``). Everything that can be refused is refused before Spark starts, with the
    job's reason; the run's topics and checkpoint are removed whatever happens."""
    from ctiflow.jobs.datapath.kafka import delete_topics, topic_decoder, topic_values
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.planner import rule_compiler
    from ctiflow.jobs.driver.recognize import job_schema_store
    from ctiflow.operators.cep.operator import longest_run_ms

    op = _operator(job, operator)
    t0, t1 = effective_ms(start, "--from"), effective_ms(end, "--to")
    if t0 >= t1:
        raise ConfigError(f"--from {iso_time(t0)} is not before --to {iso_time(t1)}: give a range [from, to)")
    written = read_written(job, op, warn)  # (read once: a record that does not decode is warned of once)
    candidate = candidate_rules(job, op, definition, rule_id, t0, t1, written)
    others, label = against_rules(job, op, rule_id, against, t0, t1, written, warn)
    compile = rule_compiler(op, job)
    spans = [longest_run_ms(compile(r)) for r in [*candidate, *others] if r.action == "put"]
    horizon = None if None in spans else t1 + max(spans)
    starts, ends = reading_range(job, t0, horizon)
    token = secrets.token_hex(4)
    # beside the job's checkpoint: where the job's cluster (its executors) reaches
    cfg = trial_job(job, op, token, starts, ends, f"{job.checkpoint_dir.rstrip('/')}.rules-test-{token}",
                    against not in (None, "none"))
    roles = {"candidate": [replace(r, operator=f"{op.name}.candidate") for r in candidate],
             "against": [replace(r, operator=f"{op.name}.against") for r in others]}
    rule_topics = [o.rules.topic for o in cfg.operators]
    bootstrap, client = cfg.kafka.bootstrap_servers, cfg.kafka.client_config()
    ran = False
    try:
        for o in cfg.operators:
            produce_rule(cfg, o, *roles[o.name.rsplit(".", 1)[1]], idempotent=False)
        began, ran = time.monotonic(), True
        summary = pipeline.run(cfg, until_end=True, spark=spark)
        registry, store, got = cfg.kafka.schema_registry, job_schema_store(cfg), {}
        for o in cfg.operators:
            for t in (o.output, o.timed_out):
                decode = topic_decoder(bootstrap, t, client, registry.url, registry.client_config(), store)
                got[t] = Decoded(topic_values(bootstrap, t, client),
                                 lambda v, decode=decode, o=o: _as_live(decode(v), o.name, op.name))
    finally:
        delete_topics(bootstrap, [*rule_topics, *cfg.written_topics()], client)
        if ran:
            _remove_checkpoint(cfg, spark)
    base = cfg.job
    return RuleTrial(
        rule_id, op.name, t0, t1, label, got[f"{base}.candidate"], got[f"{base}.candidate-timed-out"],
        got.get(f"{base}.against", []), got.get(f"{base}.against-timed-out", []),
        events_read=summary.records, seconds=time.monotonic() - began, starts=starts, ends=ends)


def _remove_checkpoint(cfg: JobConfig, spark) -> None:
    """The run's checkpoint, deleted through Hadoop (it may be on the cluster's store)."""
    from pyspark.sql import SparkSession

    from ctiflow.jobs.driver.checkpoint import CheckpointDir

    session = spark or SparkSession.getActiveSession()
    where = (CheckpointDir.for_job(cfg) if session is None
             else CheckpointDir.of(cfg.checkpoint_dir, spark=session))
    where.delete("")


def _as_live(record: dict, copy: str, name: str) -> dict:
    """A record of the operator's copy ``copy`` as the job's operator ``name`` writes it."""
    if record.get("pattern") == copy:
        record["pattern"] = name
    return record
