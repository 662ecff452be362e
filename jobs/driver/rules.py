"""Rules in jobs, on the driver: the rules topic read and written for ``ctiflow rules``, each record
checked as the job checks it (:func:`new_book`: the plan's own
:class:`ctiflow.jobs.core.definitions.RuleCompiler` and the operator's
:class:`ctiflow.operators.cep.rules.RuleBook`), and what the job did with each record read back
from the job's own topics (:func:`judge`).

The semantics (when a version judges which events) are the operator's:
:mod:`ctiflow.operators.cep.rules`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ctiflow.jobs.driver.config import JobConfig, MatchOp
from ctiflow.jobs.driver.planner import build_operator, rule_compiler
from ctiflow.operators.cep.rules import Rule, RuleBook, record_problem
from ctiflow.operators.errors import ConfigError, DecodeError
from ctiflow.operators.time import CTI_NONE

if TYPE_CHECKING:
    from ctiflow.jobs.datapath.kafka import Message

RULE_SCHEMA = "rule"


def ruled_operator(job: JobConfig, name: str) -> MatchOp:
    """The job's match operator ``name`` that takes rules (a :class:`ConfigError` naming the
    operators that do, otherwise)."""
    ruled = [o for o in job.operators if o.ruled]
    for op in ruled:
        if op.name == name:
            return op
    names = ", ".join(o.name for o in ruled) or "none"
    raise ConfigError(f"--operator {name!r}: job {job.job!r} has no match operator with rules by that name "
                      f"(those with a rules: section: {names}); add rules: {{topic: …}} to the operator")


def _warn(message: str) -> None:
    logging.getLogger(__name__).warning(message)


@dataclass(frozen=True)
class Judged:
    """A rule record and what became of it: ``applied``; ``adjusted`` (late: it takes effect at
    ``effective``, the CTI when the job read it, not at the time it asked for); ``refused``
    (``reason``) — as the job's own records say (:func:`job_verdicts`) —; or, for one the job has
    not read yet, ``pending`` (it will be applied, CTIs aside) or ``refusable`` (``reason``)."""

    written: Written
    judged: str
    effective: int | None  # when it takes effect (None: refused)
    reason: str = ""

    @property
    def rule(self) -> Rule:
        return self.written.rule

    @property
    def in_effect(self) -> Rule | None:
        """The rule as the job schedules it (its effective time the one it took effect at)."""
        return None if self.effective is None else replace(self.rule, effective_time=self.effective)


@dataclass(frozen=True)
class Verdicts:
    """What a job's own records say it did with its rules topic: how far it has read each
    partition (its progress topic's ``side_read``), the records it refused (its dead-letter
    topic: partition, offset → the reason) and those it moved to the CTI (its late topic:
    partition, offset → the time they took effect)."""

    read: dict[int, int]
    refused: dict[tuple[int, int], str]
    adjusted: dict[tuple[int, int], int]


def job_verdicts(job: JobConfig, op: MatchOp, warn: Callable[[str], None] = _warn) -> Verdicts | None:
    """:class:`Verdicts` of the job's latest query (None while its progress topic has read no
    record of the rules topic). The dead-letter and late topics are read whole, but a record is
    decoded only if its bytes hold the rules topic's (stream's) name; they keep what earlier
    queries (checkpoints) of the job wrote too, so a record refused by one and taken by a later
    one is listed as refused."""
    from ctiflow.jobs.core.counters import labelled
    from ctiflow.jobs.driver.checkpoint import ProgressLog, read_counters

    read = {int(p): n for (stream, p), n in labelled(read_counters(ProgressLog.of(job)), "side_read")
            if stream == op.rules_stream}
    if not read:
        return None
    topic, stream = op.rules.topic, op.rules_stream
    refused = {(d["partition"], d["offset"]): d["error"].removeprefix(f"{d['stage']} refused: ")
               for d in _records(job, job.dead_letter_topic, "dead_letter", topic, warn)
               if d["source_topic"] == topic}
    adjusted = {(r["partition"], r["offset"]): r["cti"]
                for r in _records(job, job.late_topic, "late", stream, warn)
                if r["stream"] == stream and r["policy"] == "adjust"}
    return Verdicts(read, refused, adjusted)


def _records(job: JobConfig, topic: str, schema: str, needle: str,
             warn: Callable[[str], None]) -> Iterator[dict]:
    """``topic``'s records whose bytes hold ``needle``, decoded as ``schema`` (one that does not
    decode is skipped with a warning)."""
    decode, mark = _decoder(job, schema, topic), needle.encode()
    for m in topic_messages(job, topic):
        if m.value is not None and mark in m.value:
            try:
                yield decode(m.value)
            except DecodeError as exc:
                warn(f"{topic} partition {m.partition} offset {m.offset}: not a {schema} record, skipped "
                     f"({exc})")


def judge(job: JobConfig, op: MatchOp, warn: Callable[[str], None] = _warn,
          written: list[Written] | None = None) -> tuple[RuleBook, list[Judged]]:
    """The operator's rules topic record by record with what the job did with each
    (:func:`job_verdicts`), those it has not read yet judged as it will judge them, CTIs aside →
    the book they make (the job's own decisions first, in topic order) and the records judged.
    ``written``: the topic's records as :func:`read_written` read them (None: read here)."""
    verdicts = job_verdicts(job, op, warn)
    book, compile = new_book(job, op)
    out = []
    for w in read_written(job, op, warn) if written is None else written:
        at = (w.partition, w.offset)
        if verdicts is not None and w.offset < verdicts.read.get(w.partition, 0):
            if at in verdicts.refused:
                out.append(Judged(w, "refused", None, verdicts.refused[at]))
                continue
            effective = verdicts.adjusted.get(at, w.rule.effective_time)
            book.offer(replace(w.rule, effective_time=effective), CTI_NONE, compile)
            out.append(Judged(w, "adjusted" if at in verdicts.adjusted else "applied", effective))
            continue
        decision = book.offer(w.rule, CTI_NONE, compile)
        out.append(Judged(w, "pending", w.rule.effective_time) if decision.outcome != "rejected"
                   else Judged(w, "refusable", None, decision.reason))
    return book, out


def new_book(job: JobConfig, op: MatchOp) -> tuple[RuleBook, Callable]:
    """An empty rule book of the operator as the job makes it, and the plan's own compile: the
    one acceptance check the CLI applies (:meth:`ctiflow.operators.cep.rules.RuleBook.offer`)."""
    return RuleBook(build_operator(op, job)[1].rules), rule_compiler(op, job)


def check_rule(job: JobConfig, rule: Rule) -> None:
    """A :class:`ConfigError` with the reason if the job would refuse ``rule`` as its rules
    topic's first record (the CTI aside): :func:`new_book` decides."""
    book, _ = new_book(job, ruled_operator(job, rule.operator))
    _accepted_by(book, job, rule)


def _accepted_by(book: RuleBook, job: JobConfig, rule: Rule) -> None:
    decision = book.offer(rule, CTI_NONE, rule_compiler(ruled_operator(job, rule.operator), job))
    if decision.outcome == "rejected":
        raise ConfigError(f"rule {rule.rule_id!r} version {rule.version}: the job would refuse it: "
                          f"{decision.reason}")


# -- the rules topic --------------------------------------------------------------------------
@dataclass(frozen=True)
class Written:
    """A rule record where it is in the rules topic."""

    rule: Rule
    partition: int
    offset: int


def rules_of(messages: Iterable[Message], decode: Callable[[bytes], dict], topic: str,
             warn: Callable[[str], None] = _warn) -> list[Written]:
    """The rule records among a rules topic's ``messages`` (in order), decoded with the rule
    schema as the reader's (``decode``), as the job decodes them; one that does not decode as a
    rule — bytes that are not Avro, a record of another schema — is skipped with a warning naming
    its partition and offset (the job dead-letters it)."""
    rules = []
    for m in messages:
        try:
            record = decode(m.value)
        except DecodeError as exc:
            warn(f"{topic} partition {m.partition} offset {m.offset}: not a rule record, skipped ({exc})")
            continue
        rules.append(Written(Rule.from_record(record), m.partition, m.offset))
    return rules


def _decoder(job: JobConfig, schema: str, topic: str):
    """How the job decodes ``topic``'s records: ``schema`` as the reader's, either framing."""
    from ctiflow.jobs.avro.serde import AvroDeserializer, registry_client

    registry = job.kafka.schema_registry
    return AvroDeserializer(schema, subject=f"{topic}-value", registry=registry_client(
        registry.url, registry.client_config()) if registry.url else None)


def read_written(job: JobConfig, op: MatchOp, warn: Callable[[str], None] = _warn) -> list[Written]:
    """Every rule record of the operator's rules topic, in topic order (:func:`rules_of`)."""
    topic = op.rules.topic
    return rules_of(topic_messages(job, topic), _decoder(job, RULE_SCHEMA, topic), topic, warn)


def read_rules(job: JobConfig, op: MatchOp, warn: Callable[[str], None] = _warn) -> list[Rule]:
    """:func:`read_written`'s rules."""
    return [w.rule for w in read_written(job, op, warn)]


def topic_messages(job: JobConfig, topic: str) -> Iterator[Message]:
    """``topic``'s records as they are now, partition by partition from the beginning (none if
    there is no such topic)."""
    from ctiflow.jobs.datapath.kafka import (consumer, list_topics, low_offset, read_range, topic_partitions,
                                             true_end_offset)

    bootstrap, client = job.kafka.bootstrap_servers, job.kafka.client_config()
    if topic not in list_topics(bootstrap, client):
        return  # (no rule yet)
    cons = consumer(bootstrap, client)
    try:
        for part in topic_partitions(bootstrap, topic, client):
            low = low_offset(cons, topic, part)
            with closing(read_range(cons, topic, part, low,
                                    true_end_offset(cons, topic, part, low))) as ranges:
                for msgs in ranges:
                    yield from msgs
    finally:
        cons.close()


def produce_rule(job: JobConfig, op: MatchOp, *rules: Rule, idempotent: bool = True) -> None:
    """Write rule records, in order, to the operator's rules topic (created if missing), keyed by
    their ids. ``idempotent=False``: without the idempotent producer's set-up (≈ 0.5 s a producer
    on the embedded broker), still in order (one request in flight); a retried record may be
    written twice, which the job refuses as not newer (a dead letter): for a topic of one's own."""
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath.kafka import create_topics, produce

    bootstrap, client = job.kafka.bootstrap_servers, job.kafka.client_config()
    create_topics(bootstrap, {op.rules.topic: 1}, client)
    registry = None
    if job.kafka.effective_framing == "confluent":
        from ctiflow.jobs.avro.serde import registry_client
        registry = registry_client(job.kafka.schema_registry.url, job.kafka.schema_registry.client_config())
    encode = AvroSerializer(RULE_SCHEMA, framing=job.kafka.effective_framing, registry=registry,
                            subject=f"{op.rules.topic}-value")
    records = [{f: getattr(rule, f) for f in Rule.__dataclass_fields__} for rule in rules]
    done = produce(bootstrap, op.rules.topic, records, encode, "rule_id", client, flush_timeout=30,
                   config=None if idempotent else {"enable.idempotence": False,
                                                   "max.in.flight.requests.per.connection": 1})
    if done.unflushed:
        raise ConfigError(f"the rule records were not written to {op.rules.topic!r} within 30 s (is the "
                          f"broker at {bootstrap} up?)")


# -- what `ctiflow rules` and the Python API do ------------------------------------------------------
def _operator(job: JobConfig, operator: str | None) -> MatchOp:
    if operator is not None:
        return ruled_operator(job, operator)
    ruled = [o for o in job.operators if o.ruled]
    if len(ruled) != 1:
        names = ", ".join(o.name for o in ruled) or "none"
        raise ConfigError(f"--operator: job {job.job!r} has {len(ruled)} match operators with rules "
                          f"({names}); name the one the rule is for")
    return ruled[0]


def iso_time(ms: int) -> str:
    """Application time ``ms`` as ISO 8601 UTC with milliseconds (as the CLI shows times)."""
    from datetime import datetime, timezone

    return (datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"))


def effective_ms(text: str | int | None, option: str = "--effective") -> int:
    """An effective time: epoch ms, an ISO 8601 date-time (UTC unless it says), or ``now``; an
    error names ``option`` (the command line's option that gave it)."""
    from datetime import datetime, timezone

    if text is None or text == "now":
        return int(time.time() * 1000)
    if isinstance(text, int) or str(text).lstrip("-").isdigit():
        return int(text)
    try:
        at = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{option} {text!r}: give epoch milliseconds, an ISO date-time such as "
                          "2026-11-28T09:00:00Z, or now") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return int(at.timestamp() * 1000)


def _write(job: JobConfig, op: MatchOp, rule: Rule, version: int | None, warn: Callable[[str], None]) -> Rule:
    """Write ``rule`` as its next version (``version``, or the topic's last for its id + 1) once
    the job would accept it after the topic's records: the record alone first (its size before
    the topic is read or the definition compiled), then the book of the topic's records as the job
    judged them (:func:`judge`)."""
    problem = record_problem(replace(rule, version=1 if version is None else version))
    if problem is not None:
        raise ConfigError(f"rule {rule.rule_id!r}: the job would refuse it: {problem}")
    book, judged = judge(job, op, warn)
    records = [j.rule for j in judged]
    if version is None:
        version = max((r.version for r in records if r.rule_id == rule.rule_id and r.operator == op.name),
                      default=0) + 1
    rule = replace(rule, version=version)
    _accepted_by(book, job, rule)
    produce_rule(job, op, rule)
    return rule


def put_rule(job: JobConfig, definition: str, *, rule_id: str, operator: str | None = None,
             effective: str | int | None = None, version: int | None = None, comment: str | None = None,
             warn: Callable[[str], None] = _warn) -> Rule:
    """Write a rule's definition as its next version, taking effect at ``effective`` (default:
    now), if the job would accept it (:func:`_write`) → the record written. ``warn``: told of each
    record of the topic that is not a rule (skipped)."""
    op = _operator(job, operator)
    rule = Rule(rule_id, op.name, 0, effective_ms(effective), "put", definition, comment)
    return _write(job, op, rule, version, warn)


def delete_rule(job: JobConfig, rule_id: str, *, effective: str | int | None = None,
                operator: str | None = None, comment: str | None = None,
                warn: Callable[[str], None] = _warn) -> Rule:
    """Write a ``delete`` version of a rule: from ``effective`` (default: now) it judges nothing."""
    op = _operator(job, operator)
    rule = Rule(rule_id, op.name, 0, effective_ms(effective), "delete", None, comment)
    return _write(job, op, rule, None, warn)


def list_rules(job: JobConfig, operator: str | None = None, warn: Callable[[str], None] = _warn
               ) -> dict[str, list[Judged]]:
    """Every operator's (or ``operator``'s) rule records and what the job did with each
    (:func:`judge`): operator → the records by rule id, each id's in topic order."""
    ops = [_operator(job, operator)] if operator else [o for o in job.operators if o.ruled]
    return {op.name: sorted(judge(job, op, warn)[1], key=lambda j: j.rule.rule_id) for op in ops}
