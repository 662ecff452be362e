"""``ctiflow check``: everything a job file gets wrong, found at once, without Kafka or Spark.

Runs what ``ctiflow run`` runs before Spark starts — YAML, the configuration model, the fields
against the Avro schemas (:mod:`ctiflow.jobs.driver.fields`), every operator's predicate and pattern, the
checkpoint directory — but collects every error instead of stopping at the first, each prefixed
with the file and the config field, and adds the warnings (:meth:`JobConfig.warnings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ctiflow.jobs.avro.serde import registry_settings_error
from ctiflow.jobs.driver.checkpoint import CheckpointDir, check_checkpoint_dir, check_key_groups
from ctiflow.jobs.driver.config import JobConfig, load
from ctiflow.jobs.driver.fields import field_errors
from ctiflow.jobs.driver.masters import endpoints
from ctiflow.jobs.driver.planner import build_operator
from ctiflow.operators.errors import ConfigError, CtiflowError


@dataclass
class Report:
    """One job file's findings: ``errors`` (the job would be refused) and ``warnings``."""

    path: Path
    config: JobConfig | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _lines(exc: CtiflowError, path: Path) -> list[str]:
    """An error as one entry per problem (its ``problems``), without the file prefix (a query's
    caret display stays with its message)."""
    problems = getattr(exc, "problems", None)
    if problems:
        return [problem.removeprefix(f"{path}: ") for problem in problems]
    text = str(exc)
    for prefix in (f"{path}: ", "<config>: "):
        text = text.removeprefix(prefix)
    return [text]


def check_job(path: str | Path) -> Report:
    """Every error and warning of the job file at ``path``."""
    path = Path(path)
    report = Report(path)
    try:
        cfg = load(path)
    except ConfigError as exc:
        report.errors += _lines(exc, path)
        return report
    report.config = cfg
    report.errors += config_errors(cfg, path)
    report.warnings += cfg.warnings()
    return report


def registry_errors(cfg: JobConfig) -> list[str]:
    """The registry settings confluent-kafka's client refuses (:func:`registry_settings_error`):
    found here, not on an executor after Spark has started."""
    registry = cfg.kafka.schema_registry
    refused = registry.url and registry_settings_error(registry.url, registry.client_config())
    if not refused:
        return []
    return [f"kafka.schema_registry: confluent-kafka's registry client refuses these settings: {refused}. "
            "Remove what it does not take from kafka.schema_registry.config: basic auth is "
            "basic.auth.user.info (user:password) or user:password@ in the url, and the Java client's "
            "basic.auth.credentials.source has no counterpart"]


def config_errors(cfg: JobConfig, path: str | Path = "<config>", checkpoint: "CheckpointDir | None" = None,
                  *, checkpoint_too: bool = True) -> list[str]:
    """Every error of a parsed configuration: topics, fields, predicates, patterns, checkpoint
    (``checkpoint``: the job's, already open; else opened through a JVM of this process's own,
    :class:`ctiflow.jobs.driver.checkpoint.CheckpointDir`; not at all without ``checkpoint_too``)."""
    errors = field_errors(cfg) + registry_errors(cfg)
    try:
        endpoints(cfg.spark.master, "spark.master")  # its form; whether it answers: pipeline.prepare
    except ConfigError as exc:
        errors.append(str(exc))
    for op in cfg.operators:
        try:
            build_operator(op, cfg)
        except CtiflowError as exc:
            errors += _lines(exc, Path(path))
    if not checkpoint_too:
        return errors
    checkpoint = checkpoint or CheckpointDir.for_job(cfg)
    for probe in (check_checkpoint_dir, lambda p: check_key_groups(cfg.key_groups, p)):
        try:
            probe(checkpoint)
        except ConfigError as exc:
            errors += _lines(exc, Path(path))
    return errors
