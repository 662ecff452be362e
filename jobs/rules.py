"""Rules in jobs: a rule record's definition checked as ``ctiflow check`` checks a job's pattern
or ``sql:`` (:class:`RuleCompiler`), and the rules topic read and written for ``ctiflow rules``.

The semantics (when a version judges which events) are the operator's:
:mod:`ctiflow.operators.cep.rules`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ctiflow.jobs.config import JobConfig, MatchOp, _pattern_durations, load_yaml
from ctiflow.operators.cep.declarative import check_nesting
from ctiflow.operators.cep.operator import MatchSettings
from ctiflow.operators.cep.rules import Rule
from ctiflow.operators.errors import ConfigError, CtiflowError, PatternError
from ctiflow.operators.reference import SyncMode

RULE_SCHEMA = "rule"


def ruled_operator(job: JobConfig, name: str) -> MatchOp:
    """The job's match operator ``name`` that takes rules (a :class:`ConfigError` naming the
    operators that do, otherwise)."""
    ruled = [o for o in job.operators if isinstance(o, MatchOp) and o.rules is not None]
    for op in ruled:
        if op.name == name:
            return op
    names = ", ".join(o.name for o in ruled) or "none"
    raise ConfigError(f"--operator {name!r}: job {job.job!r} has no match operator with rules by that name (those "
                      f"with a rules: section: {names}); add rules: {{topic: …}} to the operator")


@dataclass(frozen=True)
class RuleCompiler:
    """``rule → MatchSettings`` for one operator of a job, checking the definition as the job's
    own would be checked (fields against the source schema, the expression bounds, the SQL
    parser's errors): a :class:`ConfigError` with the problems. Picklable (the executors
    compile the rules they receive)."""

    job: JobConfig
    operator: str

    def __call__(self, rule: Rule) -> MatchSettings:
        from ctiflow.jobs.fields import field_errors
        from ctiflow.jobs.recognize import operator_of

        op = ruled_operator(self.job, self.operator)
        if op.language == "sql":
            trial = op.model_copy(update={"sql": rule.definition, "pattern": None, "rules": None})
        else:
            pattern = parse_pattern(rule.definition)
            try:  # (the shape first: the field checks below read every stage)
                check_nesting(pattern.get("stages"), unique_names=True)
            except PatternError as exc:
                raise ConfigError("the rule's definition", [str(exc)]) from None
            trial = op.model_copy(update={"pattern": pattern, "sql": None, "rules": None})
        job = self.job.model_copy(update={"operators": [trial]})
        errors = field_errors(job)
        if errors:
            raise ConfigError("the rule's definition does not fit the job", errors)
        try:
            _, settings = operator_of(trial, job)
        except ConfigError as exc:  # (its problems name operators.<name>.pattern/sql: the definition)
            raise ConfigError("the rule's definition", [p.split(": ", 1)[-1] for p in exc.problems or [str(exc)]])
        return settings


def rules_specs(cfg: JobConfig, spec: type) -> tuple:
    """The plan's :class:`ctiflow.jobs.runtime.RulesSpec` (``spec``) of each match operator with rules."""
    from ctiflow.jobs.recognize import operator_of

    return tuple(spec(op.rules_stream, i, operator_of(op, cfg)[1].rules, RuleCompiler(cfg, op.name),
                      SyncMode(op.rules.sync).value)
                 for i, op in enumerate(cfg.operators) if isinstance(op, MatchOp) and op.rules is not None)


def parse_pattern(text: str | None) -> dict[str, Any]:
    """A pattern definition: the job file's YAML form of one pattern (durations like ``10m``),
    read under the job file's bounds (:func:`ctiflow.jobs.config.load_yaml`: depth, aliases)."""
    spec = load_yaml(text or "", "the definition")
    if not isinstance(spec, dict):
        raise ConfigError("a pattern definition is a YAML mapping (stages: [...], within: ...)")
    try:
        return _pattern_durations(spec, "pattern")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_rule(job: JobConfig, rule: Rule) -> None:
    """Everything the job checks of a rule record before it could take effect (the CTI aside):
    the operator, the action, the definition (:class:`RuleCompiler`)."""
    op = ruled_operator(job, rule.operator)
    if rule.action == "put":
        try:
            RuleCompiler(job, op.name)(rule)
        except CtiflowError as exc:
            problems = getattr(exc, "problems", None) or []
            raise ConfigError(f"rule {rule.rule_id!r}: {exc}", problems) from None


# -- the rules topic --------------------------------------------------------------------------
def read_rules(job: JobConfig, op: MatchOp) -> list[Rule]:
    """Every record of the operator's rules topic, in topic order (an undecodable one is left
    out: the job dead-letters it with the reason)."""
    from ctiflow.jobs.kafka import holds_records, iter_topic, list_topics

    registry, client = job.kafka.schema_registry, job.kafka.client_config()
    if op.rules.topic not in list_topics(job.kafka.bootstrap_servers, client) or not holds_records(
            job.kafka.bootstrap_servers, op.rules.topic, client):
        return []  # (no rule yet)
    return [Rule.from_record(r) for r in iter_topic(job.kafka.bootstrap_servers, op.rules.topic, client,
                                                    registry_url=registry.url, registry_config=registry.client_config())
            if "_undecodable" not in r]


def timeline(rules: list[Rule]) -> dict[str, list[Rule]]:
    """The records as the job schedules them, CTIs aside (:meth:`ctiflow.operators.cep.rules.RuleBook.offer`):
    per rule id, each record newer than the last one kept that takes effect no earlier."""
    kept: dict[str, list[Rule]] = {}
    for rule in rules:
        mine = kept.setdefault(rule.rule_id, [])
        if mine and (rule.version <= mine[-1].version or rule.effective_time < mine[-1].effective_time):
            continue
        if rule.action == "delete" and (not mine or mine[-1].action == "delete"):
            continue
        mine.append(rule)
    return {k: v for k, v in kept.items() if v}


def produce_rule(job: JobConfig, op: MatchOp, rule: Rule) -> None:
    """Write one rule record to the operator's rules topic (created if missing), keyed by its id."""
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.kafka import create_topics, produce

    bootstrap, client = job.kafka.bootstrap_servers, job.kafka.client_config()
    create_topics(bootstrap, {op.rules.topic: 1}, client)
    registry = None
    if job.kafka.effective_framing == "confluent":
        from ctiflow.jobs.avro.serde import registry_client
        registry = registry_client(job.kafka.schema_registry.url, job.kafka.schema_registry.client_config())
    encode = AvroSerializer(RULE_SCHEMA, framing=job.kafka.effective_framing, registry=registry,
                            subject=f"{op.rules.topic}-value")
    record = {f: getattr(rule, f) for f in Rule.__dataclass_fields__}
    done = produce(bootstrap, op.rules.topic, [record], encode, "rule_id", client, flush_timeout=30)
    if done.unflushed:
        raise ConfigError(f"the rule record was not written to {op.rules.topic!r} within 30 s (is the broker at "
                          f"{bootstrap} up?)")


# -- what `ctiflow rules` and the Python API do ------------------------------------------------------
def _operator(job: JobConfig, operator: str | None) -> MatchOp:
    if operator is not None:
        return ruled_operator(job, operator)
    ruled = [o for o in job.operators if isinstance(o, MatchOp) and o.rules is not None]
    if len(ruled) != 1:
        names = ", ".join(o.name for o in ruled) or "none"
        raise ConfigError(f"--operator: job {job.job!r} has {len(ruled)} match operators with rules ({names}); "
                          "name the one the rule is for")
    return ruled[0]


def iso_time(ms: int) -> str:
    """Application time ``ms`` as ISO 8601 UTC with milliseconds (as the CLI shows times)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def effective_ms(text: str | int | None) -> int:
    """An effective time: epoch ms, an ISO 8601 date-time (UTC unless it says), or ``now``."""
    from datetime import datetime, timezone

    if text is None or text == "now":
        return int(time.time() * 1000)
    if isinstance(text, int) or str(text).lstrip("-").isdigit():
        return int(text)
    try:
        at = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--effective {text!r}: give epoch milliseconds, an ISO date-time such as "
                          "2026-11-28T09:00:00Z, or now") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return int(at.timestamp() * 1000)


def _next(job: JobConfig, op: MatchOp, rule_id: str, version: int | None, effective: int) -> int:
    """The version to write: the next after the topic's last for ``rule_id`` (or ``version``,
    refused unless newer); refused if it would take effect before that one."""
    mine = [r for r in read_rules(job, op) if r.rule_id == rule_id]
    last = max(mine, key=lambda r: r.version, default=None)
    if last is not None and version is not None and version <= last.version:
        raise ConfigError(f"--version {version}: rule {rule_id!r} is at version {last.version} already; a new "
                          f"version must be newer (leave --version out: {last.version + 1})")
    if last is not None and effective < last.effective_time:
        raise ConfigError(f"--effective {effective}: version {last.version} of rule {rule_id!r} takes effect at "
                          f"{last.effective_time}; a version takes effect after the one before it")
    return version if version is not None else (last.version + 1 if last is not None else 1)


def put_rule(job: JobConfig, definition: str, *, rule_id: str, operator: str | None = None,
             effective: str | int | None = None, version: int | None = None, comment: str | None = None) -> Rule:
    """Check a rule's definition against the job (as the job will) and write it as the rule's
    next version, taking effect at ``effective`` (default: now). → the record written."""
    op = _operator(job, operator)
    at = effective_ms(effective)
    rule = Rule(rule_id, op.name, 1, at, "put", definition, comment)
    check_rule(job, rule)
    rule = Rule(rule_id, op.name, _next(job, op, rule_id, version, at), at, "put", definition, comment)
    produce_rule(job, op, rule)
    return rule


def delete_rule(job: JobConfig, rule_id: str, *, effective: str | int | None = None, operator: str | None = None,
                comment: str | None = None) -> Rule:
    """Write a ``delete`` version of a rule: from ``effective`` (default: now) it judges nothing."""
    op = _operator(job, operator)
    at = effective_ms(effective)
    live = timeline(read_rules(job, op)).get(rule_id)
    if not live or live[-1].action == "delete":
        raise ConfigError(f"--id {rule_id!r}: operator {op.name!r} has no live rule by that id (see ctiflow rules list)")
    rule = Rule(rule_id, op.name, _next(job, op, rule_id, None, at), at, "delete", None, comment)
    produce_rule(job, op, rule)
    return rule


def list_rules(job: JobConfig, operator: str | None = None) -> dict[str, list[Rule]]:
    """Every operator's (or ``operator``'s) rules as the job schedules them: operator → the
    versions in effective-time order (CTIs aside: a late one the job refuses is listed)."""
    ops = [_operator(job, operator)] if operator else [o for o in job.operators
                                                        if isinstance(o, MatchOp) and o.rules is not None]
    return {op.name: [r for versions in timeline(read_rules(job, op)).values() for r in versions] for op in ops}
