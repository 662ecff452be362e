"""The record schemas a job's match operators derive: a ``sql`` operator's from its MEASURES,
match and timed-out records with their events typed as the input's records, the ruled forms —
and what a match operator's definitions are built against (:func:`match_target`).

Here, not in :mod:`ctiflow.jobs.driver.config` (which stays a leaf of ``operators``), because it reads the
schema store (:mod:`ctiflow.jobs.avro.serde`). Operators are built by :mod:`ctiflow.jobs.driver.planner`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ctiflow.jobs.avro.serde import SchemaStore, default_store
from ctiflow.jobs.driver.config import JobConfig, MatchOp
from ctiflow.jobs.core.definitions import MatchTarget, sql_settings
from ctiflow.operators.cep.sql.translate import Recognizer
from ctiflow.operators.cep.expr.vocabulary import CAST_TYPES, NAVIGATION
from ctiflow.operators.cep.expr.tree import Expr


def fast_source(job: JobConfig):
    """The source whose events the operators see (the reference join's fast stream)."""
    return job.source(job.reference.fast) if job.reference else job.sources[0]


def match_target(op: MatchOp, job: JobConfig) -> MatchTarget:
    """What a match operator's definitions (its own, and its rules') are built against."""
    src = fast_source(job)
    return MatchTarget(op.name, src.schema_name, src.key_field, src.time_field,
                       emit_timed_out=op.timed_out is not None, max_partial_matches=op.max_partial_matches,
                       max_buffered_events=op.max_buffered_events,
                       reference_schema=(job.source(job.reference.source).schema_name if job.reference
                                         else None))


def job_schema_store(job: JobConfig) -> SchemaStore:
    """The schema store a process that reads or writes the job's topics uses: this process's
    schemas and the job's derived ones (:func:`derived_schemas`)."""
    return default_store().with_schemas(derived_schemas(job))


def derived_schemas(job: JobConfig) -> dict[str, str]:
    """Record schemas the job's operators derive (name → Avro JSON): a ``sql`` match operator's
    output, from its MEASURES (:func:`output_schema`); match and
    timed-out match records with their events typed as the input's records
    (:func:`matched_events_record`)."""
    found = {}
    for op in job.operators:
        if not isinstance(op, MatchOp):
            continue
        if op.rules is not None and op.language == "sql":
            found[op.schema_name] = json.dumps(RULED_RECOGNIZE)
        elif op.sql is not None:
            settings, types = sql_settings(match_target(op, job), op.sql, f"operators.{op.name}.sql")
            found[op.schema_name] = json.dumps(output_schema(settings.recognizer(), types, op.schema_name))
        for role, base in (("match", "match"), ("timed_out", "timed_out_match")):
            topic = op.roles().get(role)
            name = op.result_topics(job).get(topic) if topic else None
            ruled = name is not None and name.startswith("ruled_" + base + "_")
            if name and (name.startswith(base + "_") or ruled) and name not in found:
                record = matched_events_record(job, base, name.removeprefix("ruled_"))
                if ruled:
                    record["name"] = "Ruled" + record["name"]
                    record["fields"] = record["fields"] + RULE_FIELDS
                found[name] = json.dumps(record)
    return found


#: What a record of an operator with rules says of its rule (None: the operator's own pattern).
RULE_FIELDS = [
    {"name": "rule_id", "type": ["null", "string"], "default": None},
    {"name": "rule_version", "type": ["null", "long"], "default": None},
    {"name": "rule_effective_time", "type": ["null", "long"], "default": None,
     "doc": "when the version took effect (later than asked when a late rule was adjusted)"}]

#: A sql operator with rules: every query's partition columns and measures as name/value pairs,
#: so the topic keeps one schema whatever queries later rules bring.
RULED_RECOGNIZE = {
    "type": "record", "name": "RuledRecognize", "namespace": "ctiflow.recognize",
    "doc": "MATCH_RECOGNIZE output of a rule: the partition columns and measures of its query, in order",
    "fields": [{"name": "key", "type": ["null", "string"], "default": None}, *RULE_FIELDS,
               {"name": "measures", "type": {"type": "array", "items": {
                   "type": "record", "name": "Measure", "fields": [
                       {"name": "name", "type": "string"},
                       {"name": "value", "type": ["null", "boolean", "long", "double", "string"]}]}}}]}


#: fields a reference join adds to each fast event (they win over same-named event fields)
REFERENCE_FIELDS = ("reference", "reference_valid_from", "reference_missing")


def matched_events_record(job: JobConfig, base: str, name: str) -> dict:
    """``schemas/<base>.avsc`` under ``name``, each stage's events typed as the matched stream's
    record (:func:`ctiflow.jobs.driver.config.matched_events_schema`)."""
    store = default_store()
    schema = json.loads(store.get(base).text)
    fast = job.source(job.reference.fast) if job.reference else job.sources[0]
    event = json.loads(store.get(fast.schema_name).text)
    if job.reference:
        reference = json.loads(store.get(job.source(job.reference.source).schema_name).text)
        event = {"type": "record", "name": event["name"] + "Enriched", "namespace": "ctiflow.result",
                 "doc": "the fast event with the reference version valid at its time",
                 "fields": [f for f in event["fields"] if f["name"] not in REFERENCE_FIELDS] + [
                     {"name": "reference", "type": ["null", reference], "default": None},
                     {"name": "reference_valid_from", "type": ["null", "long"], "default": None},
                     {"name": "reference_missing", "type": "boolean"}]}
    schema["name"] = "".join(part.capitalize() for part in name.split("_"))
    schema["doc"] = f"{schema['doc'].split(':')[0]}: the events per stage, each a {event['name']} record."
    for field in schema["fields"]:
        if field["name"] == "stages":
            stage = field["type"]["items"]
            stage["name"] = schema["name"] + "Stage"
            for f in stage["fields"]:
                if f["name"] == "events":
                    f["type"] = {"type": "array", "items": event}
    return schema


# -- the output's Avro schema -------------------------------------------------------------------
TIMESTAMP = {"type": "long", "logicalType": "timestamp-millis"}


def output_schema(recognizer: Recognizer, column_types: Mapping[str, Any], name: str) -> dict:
    """The Avro record schema of the output rows (:meth:`Recognizer.outputs`): the partition
    columns with their types, then each measure typed from its expression (``column_types``: the
    input's Avro field types; the ORDER BY time column is a ``timestamp-millis``); ALL ROWS PER
    MATCH adds the ORDER BY columns before the measures and the input's other columns after
    them, as the input types them. A measure is nullable unless it cannot be NULL (``COUNT``,
    ``MATCH_ROWTIME()``, ``MATCH_NUMBER()``, ``CLASSIFIER()``); columns are nullable."""
    q = recognizer.query
    types = {c: _base(t) for c, t in column_types.items()}
    fields: dict[str, dict] = {}

    def column(c: str, avro: Any) -> None:
        fields.setdefault(c, {"name": c, "type": _nullable(avro), "default": None})

    for c in q.partition_by:
        column(c, types.get(c, "string"))
    if q.all_rows:
        for c, _, _ in q.order_by:
            column(c, types.get(c, "string"))
    for m in q.measures:
        avro, nullable = _typeof(m.expr, types)
        fields[m.name] = {"name": m.name, "type": ["null", avro] if nullable else avro,
                          **({"default": None} if nullable else {})}
    if q.all_rows:
        for c, t in column_types.items():
            column(c, t)
    return {"type": "record", "name": name, "namespace": "ctiflow.recognize",
            "doc": "MATCH_RECOGNIZE output: partition columns, then measures",
            "fields": list(fields.values())}


def _nullable(avro: Any) -> list:
    """``avro`` as a union with ``null`` first (a union's own branches kept)."""
    branches = avro if isinstance(avro, list) else [avro]
    return ["null", *(b for b in branches if b != "null")]


def _base(avro_type: Any) -> Any:
    """A field's type without its null branch (the first other branch of a union)."""
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        return _base(others[0]) if others else "string"
    if isinstance(avro_type, Mapping) and avro_type.get("logicalType") == "timestamp-millis":
        return TIMESTAMP
    if isinstance(avro_type, Mapping):
        return _base(avro_type.get("type"))
    return {"int": "long", "float": "double"}.get(avro_type, avro_type)


def _numeric(*types: Any) -> Any:
    return "double" if "double" in types else "long"


def _typeof(expr: Expr, types: Mapping[str, Any]) -> tuple[Any, bool]:
    """``(Avro type, nullable)`` of ``expr``'s values."""
    kind = expr.kind
    if kind == "literal":
        v = expr.value
        return ({bool: "boolean", int: "long", float: "double", str: "string"}.get(type(v), "string"),
                v is None)
    if kind == "column":
        return types.get(expr.value[1], "string"), True
    if kind in ("is_null", "is_bool"):
        return "boolean", False
    if kind in ("between", "in", "like", "unary") and (kind != "unary" or expr.value == "NOT"):
        return "boolean", True
    if kind == "unary":
        return _typeof(expr.args[0], types)
    if kind == "binary":
        if expr.value in ("AND", "OR", "=", "<>", "<", "<=", ">", ">="):
            return "boolean", True
        if expr.value == "||":
            return "string", True
        left, right = _typeof(expr.args[0], types)[0], _typeof(expr.args[1], types)[0]
        if left == TIMESTAMP and expr.value in "+-" and right != TIMESTAMP:
            return TIMESTAMP, True
        return _numeric(left, right), True
    if kind == "case":
        branches, otherwise = expr.args
        for _, value in branches:
            t, _ = _typeof(value, types)
            if not (value.kind == "literal" and value.value is None):
                return t, True
        return _typeof(otherwise, types)[0], True
    if kind == "cast":
        return {"int": "long", "float": "double", "str": "string",
                "bool": "boolean"}[CAST_TYPES[expr.value]], True
    if kind == "call":
        name = expr.value
        if name == "COUNT":
            return "long", False
        if name == "MATCH_NUMBER":
            return "long", False
        if name == "MATCH_ROWTIME":
            return TIMESTAMP, False
        if name == "CLASSIFIER":
            return "string", False
        inner = _typeof(expr.args[0], types)[0] if expr.args and expr.args[0].kind != "star" else "long"
        if name in NAVIGATION or name in ("MIN", "MAX", "COALESCE", "NULLIF", "ABS", "FLOOR", "CEIL",
                                          "CEILING"):
            return inner, True
        if name in ("SUM", "AVG", "MOD"):
            return _numeric(inner), True
        if name == "LISTAGG":
            return "string", True
        if name in ("POWER", "SQRT"):
            return "double", True
        if name in ("CHAR_LENGTH", "CHARACTER_LENGTH", "TIMESTAMPDIFF"):
            return "long", True
        if name == "IF":
            return _typeof(expr.args[1], types)[0], True
        return "string", True
    return "string", True
