"""A match operator's definition — a pattern or a ``MATCH_RECOGNIZE`` query — checked against the
record schema it reads and made into its settings.

Pure (no configuration model, no Spark): the planner (:mod:`ctiflow.jobs.driver.planner`) builds a job's
match operators with it on the driver, and a rule's compiler (:class:`ctiflow.jobs.driver.rules.RuleCompiler`)
builds each rule version with it on the executors — so both refuse the same definitions in the
same words. :class:`MatchTarget` is what a definition is built against: the operator's settings
besides its definition and the schema of the records it matches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ctiflow.jobs.avro.serde import SchemaStore, default_store
from ctiflow.jobs.core.text_forms import load_yaml, pattern_durations
from ctiflow.operators.cep.declarative import check_nesting
from ctiflow.operators.cep.expr.expression import compile_expression
from ctiflow.operators.cep.operator import MatchSettings
from ctiflow.operators.cep.expr.vocabulary import SqlError
from ctiflow.operators.cep.sql.parse import parse
from ctiflow.operators.errors import ConfigError, CtiflowError, PatternError

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


def family(avro_type: Any) -> str | None:
    """The type family (:func:`ctiflow.operators.cep.sql.translate.compile_query`) of an Avro field type."""
    if _logical(avro_type) in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis"):
        return "timestamp"  # a plain long stays a BIGINT (epoch ms you can subtract)
    kinds = base_types(avro_type) - {"null"}
    if kinds and kinds <= {"int", "long", "float", "double"}:
        return "number"
    if kinds == {"string"} or kinds <= {"string", "enum"}:
        return "string"
    if kinds == {"boolean"}:
        return "boolean"
    return None


def _logical(avro_type: Any) -> str | None:
    """The logical type of a field type (of its one non-null branch in a union)."""
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        return _logical(others[0]) if len(others) == 1 else None
    return avro_type.get("logicalType") if isinstance(avro_type, dict) else None


def stage_expressions(stages: Any, label: str) -> Iterator[tuple[str, str]]:
    """``(path, expression)`` for every where / or / until of a pattern's stages."""
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
        yield from stage_expressions(stage.get("group"), here)


def missing_field(where: str, schema: str, fields: Mapping[str, set[str]] | None, field: str) -> str | None:
    """The problem of a field ``schema`` does not have (None: it has it, or the schema's fields
    are unknown — its own error says so)."""
    if fields is None or field in fields:
        return None
    return f"{where}: schema {schema!r} has no field {field!r}; its fields: {', '.join(fields)}"


def expression_field_errors(where: str, text: str, fields: Mapping[str, set[str]], schema: str,
                            reference: tuple[str, Mapping[str, set[str]] | None] | None = None,
                            match_functions: bool = True) -> list[str]:
    """The fields an expression names that its record lacks: a top-level field of ``schema``, or
    with a reference join (``reference``: its schema and fields) ``reference.<field>`` of that one.
    An expression that does not compile has none here (its operator's compile says why)."""
    try:
        paths = compile_expression(text, match_functions=match_functions).field_paths
    except CtiflowError:
        return []
    errors = []
    for path in sorted(paths):
        if len(path) > 1 and (path[0],) in paths and path[0] != "reference":
            continue  # a nested field: its record is checked as path[0]
        if reference is not None and path[0] in JOINED:
            if path[0] == "reference" and len(path) > 1:
                errors.append(missing_field(where, reference[0], reference[1], path[1]))
            continue
        if len(path) == 1:
            errors.append(missing_field(where, schema, fields, path[0]))
    return [e for e in errors if e is not None]


@dataclass(frozen=True)
class MatchTarget:
    """What a match operator's definition is built against: the operator's name and settings
    besides its definition, and the record it matches — ``schema`` (the matched stream's, its
    ``key_field`` and ``time_field``) and, with a reference join, ``reference_schema``. A picklable
    value: a rule's compiler carries it to the executors."""

    name: str
    schema: str
    key_field: str
    time_field: str
    emit_timed_out: bool = False
    max_partial_matches: int | None = None
    max_buffered_events: int | None = None
    reference_schema: str | None = None

    def types(self, store: SchemaStore | None = None) -> dict[str, Any]:
        """The matched record's fields → their Avro types."""
        return {f["name"]: f["type"] for f in (store or default_store()).get(self.schema).parsed["fields"]}

    def field_errors(self, stages: Any, label: str, store: SchemaStore | None = None) -> list[str]:
        """Every field an expression of ``stages`` names that the matched record lacks."""
        store = store or default_store()
        fields = record_fields(store, self.schema)
        reference = None if self.reference_schema is None else (self.reference_schema,
                                                                record_fields(store, self.reference_schema))
        return [e for where, text in stage_expressions(stages, label)
                for e in expression_field_errors(where, text, fields, self.schema, reference)]


def pattern_settings(target: MatchTarget, pattern: dict, where: str) -> MatchSettings:
    """A Pattern API definition's settings, its pattern compiled (a :class:`ConfigError` whose
    problems start with ``where``)."""
    settings = MatchSettings(pattern=pattern, name=target.name, emit_timed_out=target.emit_timed_out,
                             max_partial_matches=target.max_partial_matches,
                             max_buffered_events=target.max_buffered_events, structured_events=True)
    try:
        settings.pattern_object()
    except CtiflowError as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        raise ConfigError(problems=[f"{where}: {problem}" for problem in problems]) from None
    return settings


def sql_settings(target: MatchTarget, sql: str, where: str,
                 store: SchemaStore | None = None) -> tuple[MatchSettings, dict[str, Any]]:
    """A ``MATCH_RECOGNIZE`` definition's settings and the matched record's field types; the query
    is checked against the job: PARTITION BY includes its key field, ORDER BY starts with its time
    field, columns of the record's schema (a :class:`ConfigError` with the query's caret display,
    each line starting with ``where``)."""
    types = target.types(store)
    columns = tuple((name, family(t)) for name, t in types.items())
    try:
        q = parse(sql)  # compiled (columns and types checked) once, by settings.pattern_object() below
        if target.key_field not in q.partition_by:
            raise SqlError(f"PARTITION BY must include the job's key field {target.key_field!r} (the job "
                           f"keeps state, chunks and TTL per key): write PARTITION BY "
                           f"{', '.join([target.key_field, *q.partition_by])}", q.text,
                           q.text.upper().find("PARTITION"))
        if q.order_by[0][0] != target.time_field:
            raise SqlError(f"ORDER BY must start with the source's time field {target.time_field!r} (the job "
                           f"orders events by it): write ORDER BY {target.time_field}", q.text,
                           q.order_by[0][2])
        settings = MatchSettings(None, name=target.name, emit_timed_out=target.emit_timed_out,
                                 max_partial_matches=target.max_partial_matches,
                                 max_buffered_events=target.max_buffered_events, sql=sql, columns=columns,
                                 structured_events=True,
                                 partition_columns=tuple(c for c in q.partition_by if c != target.key_field))
        settings.pattern_object()
    except SqlError as exc:
        raise ConfigError(problems=[f"{where}: {text}" for text in exc.render_all()]) from None
    except CtiflowError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return settings, types


def parse_pattern(text: str | None) -> dict[str, Any]:
    """A pattern definition: the job file's YAML form of one pattern (durations like ``10m``),
    read under the job file's bounds (:func:`ctiflow.jobs.core.text_forms.load_yaml`: depth, aliases)."""
    spec = load_yaml(text or "", "the definition")
    if not isinstance(spec, dict):
        raise ConfigError("a pattern definition is a YAML mapping (stages: [...], within: ...)")
    try:
        return pattern_durations(spec, "pattern")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def pattern_shape_errors(pattern: dict) -> list[str]:
    """A rule's pattern checked for shape before anything reads its stages: groups nested too
    deep, a stage name given twice (:func:`ctiflow.operators.cep.declarative.check_nesting`)."""
    try:
        check_nesting(pattern.get("stages"), unique_names=True)
    except PatternError as exc:
        return [str(exc)]
    return []


@dataclass(frozen=True)
class RuleCompiler:
    """``rule → MatchSettings`` for one operator that takes rules, checking the definition as the
    job's own definition is checked (fields against the matched record's schema, the expression
    bounds, the SQL parser's errors): a :class:`ConfigError` with the problems, the refusal a rule
    record's dead letter carries. A value the planner makes
    (:func:`ctiflow.jobs.driver.planner.rule_compiler`): the executors compile the rules they receive with
    it, without the job's configuration."""

    target: MatchTarget
    language: str  # "pattern" or "sql"

    def __call__(self, rule) -> MatchSettings:
        if self.language == "sql":
            try:
                return sql_settings(self.target, rule.definition, "sql")[0]
            except ConfigError as exc:
                raise ConfigError("the rule's definition", _unplaced(exc)) from None
        pattern = parse_pattern(rule.definition)
        shape = pattern_shape_errors(pattern)  # (the shape first: the field checks below read every stage)
        if shape:
            raise ConfigError("the rule's definition", shape)
        errors = self.target.field_errors(pattern.get("stages"), "pattern")
        if errors:
            raise ConfigError("the rule's definition does not fit the job", errors)
        try:
            return pattern_settings(self.target, pattern, "pattern")
        except ConfigError as exc:
            raise ConfigError("the rule's definition", _unplaced(exc)) from None


def _unplaced(exc: ConfigError) -> list[str]:
    """A definition's problems without the ``where: `` they start with (a rule's is its definition)."""
    return [p.split(": ", 1)[-1] for p in exc.problems or [str(exc)]]
