"""The job file reference (docs/reference/job.md) as Markdown, generated from the configuration
model's JSON schema — the same schema ``ctiflow schemas job`` prints and editors validate
against — so the reference cannot drift from the model: every section, field, type, default,
environment override and description comes from :class:`ctiflow.jobs.driver.config.JobConfig`."""

from __future__ import annotations

import json
from typing import Any

#: The order sections appear in (the rest follow alphabetically).
ORDER = ("JobConfig", "Kafka", "SchemaRegistry", "Source", "CtiConfig", "FrequencyConfig", "Reference",
         "CountOp", "Window", "BinsOp", "MatchOp", "PassthroughOp", "Outputs", "StateConfig", "Spark",
         "Metrics")


def _type(prop: dict[str, Any]) -> str:
    """A field's type for people: ``integer``, ``duration``, ``list of Source``, ``a | b``, …"""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "enum" in prop:
        return " | ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    options = prop.get("anyOf") or prop.get("oneOf")
    if options:
        kinds = []
        for o in options:
            if o.get("pattern", "").endswith("(ms|s|m|min|h|d)?\\s*$"):
                kinds.append("duration (`'500ms'`, `'10m'`, `'7d'`)")
            elif o.get("description") == "ms":
                kinds.append("ms")
            else:
                kinds.append(_type(o))
        return " | ".join(dict.fromkeys(kinds))
    kind = prop.get("type")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"map of {_type(values)}" if isinstance(values, dict) and values else "mapping"
    return kind or "any"


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in prop:
        return ""
    value = prop["default"]
    if isinstance(value, (dict, list)) and len(json.dumps(value)) > 40:
        return "(see the section)"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def job_reference() -> str:
    """Every model of the job file as a Markdown section with a table of its fields."""
    from ctiflow.jobs.driver.config import JobConfig

    schema = JobConfig.model_json_schema(by_alias=True)
    models = {"JobConfig": {k: v for k, v in schema.items() if k != "$defs"}, **schema["$defs"]}
    names = [n for n in ORDER if n in models] + sorted(set(models) - set(ORDER))
    out = []
    for name in names:
        model = models[name]
        out.append(f"## {name}\n")
        if model.get("description"):
            out.append(_cell(model["description"]) + "\n")
        props = model.get("properties")
        if not props:
            if "enum" in model:
                out.append("One of " + ", ".join(f"`{json.dumps(v)}`" for v in model["enum"]) + ".\n")
            continue
        required = set(model.get("required", ()))
        out.append("| field | type | default | environment | description |")
        out.append("| --- | --- | --- | --- | --- |")
        for field, prop in props.items():
            env = prop.get("env")
            out.append(f"| `{field}` | {_cell(_type(prop))} | {_cell(_default(prop, field in required))} | "
                       f"{f'`{env}`' if env else ''} | {_cell(prop.get('description', ''))} |")
        out.append("")
    return "\n".join(out)
