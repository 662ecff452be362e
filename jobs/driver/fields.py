"""Every field a job names, checked against the Avro schemas of its sources, before Spark starts.

A misspelt ``key_field`` or predicate field, or a string used as a measure, would otherwise be
accepted and then dead-letter every record or keep a count at 0 without a word. This module
reads the reader schemas (:mod:`ctiflow.jobs.avro.serde`) and the expressions' field paths
(:attr:`ctiflow.operators.cep.expr.expression.CompiledExpression.field_paths`) and returns *every* problem,
each naming the config field, what is wrong and the schema's real fields.
"""

from __future__ import annotations

from ctiflow.jobs.avro.serde import SchemaStore, default_store
from ctiflow.jobs.driver.config import BinsOp, CountOp, JobConfig, MatchOp
from ctiflow.jobs.core.definitions import (INTEGER, NUMERIC, expression_field_errors, record_fields,
                                           stage_expressions)
from ctiflow.operators.errors import ConfigError, CtiflowError

def field_errors(cfg: JobConfig, store: SchemaStore | None = None) -> list[str]:
    """Every field of ``cfg`` that its schema does not have or has with an unusable type, after
    the topics that collide or loop (:meth:`JobConfig.topic_errors`)."""
    check = _FieldCheck(cfg, store or default_store())
    check.sources()
    check.operators()
    return check.errors


class _FieldCheck:
    """The fields a job names, checked against its sources' record schemas; ``errors`` collects."""

    def __init__(self, cfg: JobConfig, store: SchemaStore) -> None:
        self.cfg = cfg
        self.errors: list[str] = cfg.topic_errors()
        self.schemas: dict[str, dict[str, set[str]]] = {}
        for s in cfg.sources:
            try:
                self.schemas[s.name] = record_fields(store, s.schema_name)
            except CtiflowError as exc:
                self.errors.append(f"sources.{s.name}.schema: {exc}")
        self.fast = cfg.reference.fast if cfg.reference else cfg.sources[0].name
        self.joined = cfg.reference is not None

    def need(self, where: str, stream: str, field: str, types: frozenset[str] | None = None,
             what: str = "") -> None:
        fields = self.schemas.get(stream)
        if fields is None:
            return
        schema = self.cfg.source(stream).schema_name
        if field not in fields:
            self.errors.append(f"{where}: schema {schema!r} has no field {field!r}; its fields: "
                               f"{', '.join(fields)}")
        elif types is not None and not (fields[field] - {"null"}) <= types:
            fitting = [n for n, t in fields.items() if t - {"null"} and t - {"null"} <= types]
            self.errors.append(f"{where}: field {field!r} of schema {schema!r} is "
                               f"{'/'.join(sorted(fields[field]))}, {what} must be "
                               f"{'/'.join(sorted(types))}; fields that are: {', '.join(fitting) or 'none'}")

    def sources(self) -> None:
        cfg, need = self.cfg, self.need
        for s in cfg.sources:
            need(f"sources.{s.name}.key_field", s.name, s.key_field)
            need(f"sources.{s.name}.time_field", s.name, s.time_field, INTEGER,
                 "an event time (ms since 1970)")
            if s.end_field:
                need(f"sources.{s.name}.end_field", s.name, s.end_field, INTEGER,
                     "an event time (ms since 1970)")
            for m in s.measures:
                need(f"sources.{s.name}.measures", s.name, m, NUMERIC, "a measure")
        if self.joined:
            need("reference.join_field", cfg.reference.source, cfg.reference.join_field)
            need("reference.join_field", cfg.reference.fast, cfg.reference.join_field)

    def expression(self, where: str, text: str, match: bool) -> None:
        fast = self.schemas.get(self.fast)
        if fast is None:
            return
        reference = None
        if self.joined:
            source = self.cfg.reference.source
            reference = (self.cfg.source(source).schema_name, self.schemas.get(source))
        self.errors += expression_field_errors(where, text, fast, self.cfg.source(self.fast).schema_name,
                                               reference, match_functions=match)

    def operators(self) -> None:
        fast = self.fast
        for op in self.cfg.operators:
            label = f"operators.{op.name}"
            if isinstance(op, CountOp):
                if op.predicate:
                    self.expression(f"{label}.predicate", op.predicate, False)
                if op.value_field:
                    self.need(f"{label}.value_field", fast, op.value_field, INTEGER, "a summed value")
            elif isinstance(op, BinsOp):
                for m in op.measures:
                    self.need(f"{label}.measures", fast, m, NUMERIC, "a prorated measure")
            elif isinstance(op, MatchOp) and op.pattern is not None:  # a query's columns: its own check
                for where, text in stage_expressions(op.pattern.get("stages"), f"{label}.pattern"):
                    self.expression(where, text, True)


def check_fields(cfg: JobConfig, origin: str = "<config>", store: SchemaStore | None = None) -> None:
    """Raise one :class:`ConfigError` listing every field error of ``cfg`` (none: return)."""
    errors = field_errors(cfg, store)
    if len(errors) == 1:
        raise ConfigError(f"{origin}: {errors[0]}")
    if errors:
        raise ConfigError(f"{origin}: fields and topics that do not fit", errors)
