"""Rules in jobs, on the driver: the rules topic read and written for ``ctiflow rules``, each record
checked as the job checks it (:func:`replay`: the plan's own
:class:`ctiflow.jobs.core.definitions.RuleCompiler` and the operator's
:class:`ctiflow.operators.cep.rules.RuleBook`).

The semantics (when a version judges which events) are the operator's:
:mod:`ctiflow.operators.cep.rules`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import replace
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


def replay(job: JobConfig, op: MatchOp, rules: Iterable[Rule]) -> tuple[RuleBook, list[Rule]]:
    """The operator's book after ``rules`` were offered in order, as the job offers them but
    CTIs aside (each at :data:`CTI_NONE`: none is late), with the plan's own compile → the book
    and the records it accepted, in order. The one acceptance check the CLI applies is this one
    (:meth:`ctiflow.operators.cep.rules.RuleBook.offer`)."""
    book, compile = RuleBook(build_operator(op, job)[1].rules), rule_compiler(op, job)
    return book, [r for r in rules if book.offer(r, CTI_NONE, compile).outcome != "rejected"]


def check_rule(job: JobConfig, rule: Rule) -> None:
    """A :class:`ConfigError` with the reason if the job would refuse ``rule`` as its rules
    topic's first record (the CTI aside): :func:`replay`'s book decides."""
    book, _ = replay(job, ruled_operator(job, rule.operator), [])
    _accepted_by(book, job, rule)


def _accepted_by(book: RuleBook, job: JobConfig, rule: Rule) -> None:
    decision = book.offer(rule, CTI_NONE, rule_compiler(ruled_operator(job, rule.operator), job))
    if decision.outcome == "rejected":
        raise ConfigError(f"rule {rule.rule_id!r} version {rule.version}: the job would refuse it: "
                          f"{decision.reason}")


# -- the rules topic --------------------------------------------------------------------------
def _warn(message: str) -> None:
    logging.getLogger(__name__).warning(message)


def rules_of(messages: Iterable[Message], decode: Callable[[bytes], dict], topic: str,
             warn: Callable[[str], None] = _warn) -> list[Rule]:
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
        rules.append(Rule.from_record(record))
    return rules


def read_rules(job: JobConfig, op: MatchOp, warn: Callable[[str], None] = _warn) -> list[Rule]:
    """Every rule record of the operator's rules topic, in topic order (:func:`rules_of`)."""
    from ctiflow.jobs.avro.serde import AvroDeserializer, registry_client

    topic, registry = op.rules.topic, job.kafka.schema_registry
    decode = AvroDeserializer(RULE_SCHEMA, subject=f"{topic}-value", registry=registry_client(
        registry.url, registry.client_config()) if registry.url else None)
    return rules_of(topic_messages(job, topic), decode, topic, warn)


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


def produce_rule(job: JobConfig, op: MatchOp, *rules: Rule) -> None:
    """Write rule records, in order, to the operator's rules topic (created if missing), keyed by
    their ids."""
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
    done = produce(bootstrap, op.rules.topic, records, encode, "rule_id", client, flush_timeout=30)
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
    the topic is read or the definition compiled), then :func:`replay`'s book."""
    problem = record_problem(replace(rule, version=1 if version is None else version))
    if problem is not None:
        raise ConfigError(f"rule {rule.rule_id!r}: the job would refuse it: {problem}")
    records = read_rules(job, op, warn)
    book, _ = replay(job, op, records)
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
               ) -> dict[str, list[Rule]]:
    """Every operator's (or ``operator``'s) rules as the job schedules them: operator → the
    versions the job accepts (:func:`replay`), per rule id in effective-time order (CTIs aside: a
    late one the job refuses is listed)."""
    ops = [_operator(job, operator)] if operator else [o for o in job.operators
                                                        if o.ruled]
    listed = {}
    for op in ops:
        _, accepted = replay(job, op, read_rules(job, op, warn))
        listed[op.name] = sorted(accepted, key=lambda r: r.rule_id)  # (stable: each id's in topic order)
    return listed
