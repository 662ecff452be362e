"""``MATCH_RECOGNIZE`` in jobs: a ``sql`` match operator checked against its job and its input's
Avro schema, its settings, and the record schema its MEASURES derive.

Here, not in :mod:`jobs.config` (which stays a leaf of ``operators``), because it reads the
schema store (:mod:`jobs.serde`). :func:`operator_of` is how the runtime and ``ctiflow check``
build every configured operator.
"""

from __future__ import annotations

import json
from typing import Any

from jobs.config import JobConfig, MatchOp
from jobs.fields import base_types
from jobs.serde import default_store
from operators.cep.operator import MatchOperator, MatchSettings
from operators.cep.recognize import compile_query, output_schema
from operators.cep.sql import SqlError
from operators.errors import ConfigError, CtiflowError


def operator_of(op, job: JobConfig) -> tuple[type, Any]:
    """``(operator class, settings)`` of a configured operator (``sql`` ones checked here)."""
    if isinstance(op, MatchOp) and op.sql is not None:
        return MatchOperator, sql_settings(op, job)[0]
    return op.operator(job)


def sql_settings(op: MatchOp, job: JobConfig) -> tuple[MatchSettings, dict[str, Any]]:
    """The settings of a ``sql`` operator and its input's field types; the query is checked
    against the job: PARTITION BY includes its key field, ORDER BY starts with its time field,
    columns of the source's schema (a :class:`ConfigError` with the query's caret display)."""
    src = job.source(job.reference.fast) if job.reference else job.sources[0]
    types = {f["name"]: f["type"] for f in default_store().get(src.schema_name).parsed["fields"]}
    columns = tuple((name, family(t)) for name, t in types.items())
    try:
        q = compile_query(op.sql, dict(columns)).query
        if src.key_field not in q.partition_by:
            raise SqlError(f"PARTITION BY must include the job's key field {src.key_field!r} (the job keeps state, "
                           f"chunks and TTL per key): write PARTITION BY {', '.join([src.key_field, *q.partition_by])}",
                           q.text, q.text.upper().find("PARTITION"))
        if q.order_by[0][0] != src.time_field:
            raise SqlError(f"ORDER BY must start with the source's time field {src.time_field!r} (the job orders "
                           f"events by it): write ORDER BY {src.time_field}", q.text, q.order_by[0][2])
        settings = MatchSettings(None, name=op.name, emit_timed_out=op.timed_out is not None,
                                 max_partial_matches=op.max_partial_matches,
                                 max_buffered_events=op.max_buffered_events, sql=op.sql, columns=columns,
                                 partition_columns=tuple(c for c in q.partition_by if c != src.key_field))
        settings.pattern_object()
    except SqlError as exc:
        raise ConfigError(f"operators.{op.name}.sql: {exc.render()}") from None
    except CtiflowError as exc:
        raise ConfigError(f"operators.{op.name}.sql: {exc}") from None
    return settings, types


def family(avro_type: Any) -> str | None:
    """The type family (:func:`operators.cep.recognize.compile_query`) of an Avro field type."""
    kinds = base_types(avro_type) - {"null"}
    if kinds and kinds <= {"int", "long", "float", "double"}:
        return "number"
    if kinds == {"string"} or kinds <= {"string", "enum"}:
        return "string"
    if kinds == {"boolean"}:
        return "boolean"
    return None


def derived_schemas(job: JobConfig) -> dict[str, str]:
    """Record schemas the job's operators derive (name → Avro JSON): a ``sql`` match operator's
    output, from its MEASURES (:func:`operators.cep.recognize.output_schema`)."""
    found = {}
    for op in job.operators:
        if isinstance(op, MatchOp) and op.sql is not None:
            settings, types = sql_settings(op, job)
            found[op.schema_name] = json.dumps(output_schema(settings.recognizer(), types, op.schema_name))
    return found
