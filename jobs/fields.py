"""Every field a job names, checked against the Avro schemas of its sources, before Spark starts.

A misspelt ``key_field`` or predicate field, or a string used as a measure, would otherwise be
accepted and then dead-letter every record or keep a count at 0 without a word. This module
reads the reader schemas (:mod:`ctiflow.jobs.avro.serde`) and the expressions' field paths
(:attr:`ctiflow.operators.cep.expression.CompiledExpression.field_paths`) and returns *every* problem,
each naming the config field, what is wrong and the schema's real fields.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ctiflow.jobs.config import BinsOp, CountOp, JobConfig, MatchOp
from ctiflow.jobs.avro.serde import SchemaStore, default_store
from ctiflow.operators.cep.expression import compile_expression
from ctiflow.operators.errors import ConfigError, CtiflowError

NUMERIC = frozenset({"int", "long", "float", "double"})
INTEGER = frozenset({"int", "long"})
#: Fields a joined event carries besides the fast stream's own (ctiflow.operators.reference.enriched_event).
JOINED = ("reference", "reference_valid_from", "reference_missing")


def base_types(avro_type: Any) -> set[str]:
    """The primitive (or named complex) types a field's value can have, ``null`` included."""
    if isinstance(avro_type, list):
        return set().union(*(base_types(t) for t in avro_type))
    if isinstance(avro_type, Mapping):
        kind = avro_type.get("type")
        return base_types(kind) if isinstance(kind, (list, Mapping)) else {kind}
    return {avro_type}


def record_fields(store: SchemaStore, schema: str) -> dict[str, set[str]]:
    """A record schema's top-level field → its value types."""
    return {f["name"]: base_types(f["type"]) for f in store.get(schema).parsed["fields"]}


def _stage_expressions(stages: Any, label: str) -> Iterator[tuple[str, str]]:
    """``(config path, expression)`` for every where / or / until of a pattern's stages."""
    if not isinstance(stages, list):
        return
    for stage in stages:
        if not isinstance(stage, Mapping):
            continue
        here = f"{label}.stage {stage.get('name')!r}"
        for key in ("where", "until"):
            if isinstance(stage.get(key), str):
                yield f"{here}.{key}", stage[key]
        alternatives = stage.get("or")
        for text in [alternatives] if isinstance(alternatives, str) else alternatives if isinstance(
                alternatives, list) else []:  # (anything else: the pattern's own check says what is wrong)
            if isinstance(text, str):
                yield f"{here}.or", text
        if "subtype" in stage:
            yield f"{here}.subtype", "type"
        yield from _stage_expressions(stage.get("group"), here)


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

    def need(self, where: str, stream: str, field: str, types: frozenset[str] | None = None, what: str = "") -> None:
        fields = self.schemas.get(stream)
        if fields is None:
            return
        schema = self.cfg.source(stream).schema_name
        if field not in fields:
            self.errors.append(f"{where}: schema {schema!r} has no field {field!r}; its fields: {', '.join(fields)}")
        elif types is not None and not (fields[field] - {"null"}) <= types:
            fitting = [n for n, t in fields.items() if t - {"null"} and t - {"null"} <= types]
            self.errors.append(f"{where}: field {field!r} of schema {schema!r} is {'/'.join(sorted(fields[field]))}, "
                               f"{what} must be {'/'.join(sorted(types))}; fields that are: "
                               f"{', '.join(fitting) or 'none'}")

    def sources(self) -> None:
        cfg, need = self.cfg, self.need
        for s in cfg.sources:
            need(f"sources.{s.name}.key_field", s.name, s.key_field)
            need(f"sources.{s.name}.time_field", s.name, s.time_field, INTEGER, "an event time (ms since 1970)")
            if s.end_field:
                need(f"sources.{s.name}.end_field", s.name, s.end_field, INTEGER, "an event time (ms since 1970)")
            for m in s.measures:
                need(f"sources.{s.name}.measures", s.name, m, NUMERIC, "a measure")
        if self.joined:
            need("reference.join_field", cfg.reference.source, cfg.reference.join_field)
            need("reference.join_field", cfg.reference.fast, cfg.reference.join_field)

    def expression(self, where: str, text: str, match: bool) -> None:
        try:
            paths = compile_expression(text, match_functions=match).field_paths
        except CtiflowError:
            return  # the operator's own compile reports it, with its context
        for path in sorted(paths):
            if len(path) > 1 and (path[0],) in paths and path[0] != "reference":
                continue  # a nested field: its record is checked as path[0]
            if self.joined and path[0] in JOINED:
                if path[0] == "reference" and len(path) > 1:
                    self.need(where, self.cfg.reference.source, path[1])
                continue
            if len(path) == 1:
                self.need(where, self.fast, path[0])

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
                for where, text in _stage_expressions(op.pattern.get("stages"), f"{label}.pattern"):
                    self.expression(where, text, True)


def check_fields(cfg: JobConfig, origin: str = "<config>", store: SchemaStore | None = None) -> None:
    """Raise one :class:`ConfigError` listing every field error of ``cfg`` (none: return)."""
    errors = field_errors(cfg, store)
    if len(errors) == 1:
        raise ConfigError(f"{origin}: {errors[0]}")
    if errors:
        raise ConfigError(f"{origin}: fields and topics that do not fit", errors)
