"""The command line: every subcommand has --help; bad configs fail before Spark with the field named."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bench import BENCHES, LONG_BENCHES
from jobs.cli import app
from jobs.cli.bench import Benchmark
from jobs.cli.records import Framing
from jobs.serde import FRAMINGS

runner = CliRunner()

COMMANDS = [[], ["up"], ["down"], ["broker"], ["status"], ["doctor"], ["produce"], ["consume"], ["run"], ["drain"], ["check"], ["demo"],
            ["demo-data"], ["bench"], ["topics"], ["topics", "create"], ["topics", "list"], ["schemas"],
            ["schemas", "list"], ["schemas", "register"], ["schemas", "job"], ["schemas", "derived"], ["recognize"], ["plot"], ["plot", "counts"], ["plot", "bins"],
            ["conformance"], ["conformance", "cep"], ["users"], ["users", "create"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "ctiflow")
def test_every_subcommand_has_help(cmd):
    result = runner.invoke(app, [*cmd, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_closed_choices_are_the_librarys():
    assert [f.value for f in Framing] == list(FRAMINGS)
    assert {b.value for b in Benchmark} == {*BENCHES, *LONG_BENCHES, "all"}


def test_an_unknown_choice_is_refused_with_the_valid_ones():
    result = runner.invoke(app, ["bench", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of" in result.output and "'reliability'" in result.output


def _refused(tmp_path, job_yaml: str) -> str:
    """``ctiflow run`` on this job file: it must fail (before Spark); the error's message."""
    path = tmp_path / "job.yaml"
    path.write_text(job_yaml)
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code != 0
    return str(result.exception)


def test_a_bad_job_file_fails_with_the_field_and_the_fix(tmp_path):
    message = _refused(tmp_path, "job: x\nsources:\n  - {name: tx, topic: 'a b', schema: transaction, key_field: account,"
                       " time_field: event_time, cti: {policy: dropp}}\noperators:\n  - {kind: passthrough, output: o}\n")
    assert "sources.0.topic" in message and "valid Kafka topic name" in message
    assert "sources.0.cti.policy" in message and "'drop' or 'adjust'" in message


def test_drain_refuses_a_bad_job_file_as_run_does(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("job: x\nsources: []\noperators: []\n")
    drained, ran = runner.invoke(app, ["drain", str(path)]), runner.invoke(app, ["run", str(path)])
    assert drained.exit_code != 0 and "sources" in str(drained.exception)
    assert str(drained.exception) == str(ran.exception)


def test_an_unknown_schema_name_is_refused_before_spark(tmp_path):
    message = _refused(tmp_path, "job: x\nsources:\n  - {name: tx, topic: t, schema: nope, key_field: account, "
                       "time_field: event_time}\noperators:\n  - {kind: passthrough, output: o}\n")
    assert "unknown schema 'nope'" in message


def test_speculative_execution_is_refused(tmp_path):
    message = _refused(tmp_path, "job: x\nsources:\n  - {name: tx, topic: t, schema: transaction, key_field: account, "
                       "time_field: event_time}\noperators:\n  - {kind: passthrough, output: o}\n"
                       "spark: {conf: {spark.speculation: 'True'}}\n")
    assert "spark.conf" in message and "spark.speculation must stay off" in message


def test_a_bad_pattern_names_the_stage(tmp_path):
    message = _refused(tmp_path, "job: x\nsources:\n  - {name: tx, topic: t, schema: transaction, key_field: account, "
                       "time_field: event_time}\noperators:\n  - kind: match\n    name: m\n    output: o\n"
                       "    pattern:\n      stages:\n        - {name: a, where: 'amount >'}\n")
    assert "a" in message and "amount >" in message


def test_the_job_schema_documents_the_yaml_with_choices_and_overrides():
    import json

    result = runner.invoke(app, ["schemas", "job"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    defs = schema["$defs"]
    assert defs["Kafka"]["properties"]["bootstrap_servers"]["env"] == "CTIFLOW_BOOTSTRAP"
    assert defs["Spark"]["properties"]["checkpoint"]["env"] == "CTIFLOW_CHECKPOINT"
    assert set(defs["ViolationPolicy"]["enum"]) == {"drop", "adjust"}  # the operators' enum
    assert "schema" in defs["Source"]["properties"]  # the YAML's name, not the attribute's
    undocumented = [f"{model}.{name}" for model, d in defs.items() for name, p in d.get("properties", {}).items()
                    if "description" not in p and "$ref" not in p and "allOf" not in p
                    and name not in ("kind", "name", "output", "topic", "job", "late", "partitions")]
    assert undocumented == [], undocumented
    assert "sasl_password" in defs["Kafka"]["properties"] and "password" not in json.dumps(schema.get("default", {}))


def test_check_reports_every_error_of_a_job_file_at_once_without_kafka_or_spark(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "demo-transactions.yaml"
    text = (example.read_text().replace("amount > 1000", "amout > 1000").replace("times: 3}", "times: 3000}")
            .replace("output: matches\n    timed_out", "output: counts\n    timed_out"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "  conf: {spark.checkpoint.compress: true}\n")
    result = runner.invoke(app, ["check", str(example), str(bad)], env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"ok      {example}: job 'demo-transactions'")
    errors = [line.removeprefix(f"error   {bad}: ") for line in lines if line.startswith("error")]
    assert [e.split(":")[0] for e in errors] == [
        "operators.login-brute-force (match output)",  # a match into the counts topic
        "operators.high_value_last_10k.predicate",  # amout
        "operators.two-countries-then-large.pattern.stage 'large'.where",  # amout
        "operators.login-brute-force.pattern"]  # times 3000
    assert "has no field 'amout'; its fields: id, account" in errors[1]


def test_check_lists_every_invalid_field_of_the_model(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: x\nsources:\n  - {name: tx, topic: t, schema: transaction, key_field: account, "
                   "time_field: event_time, cti: {delay: soon, idle_timeout: 1ms}}\n"
                   "operators:\n  - {kind: count, name: c, window: {events: 0}, output: o}\n")
    result = runner.invoke(app, ["check", str(bad)], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    fields = [line.split(": ")[1] for line in result.output.splitlines() if line.startswith("error")]
    assert fields == ["sources.0.cti.delay", "sources.0.cti.idle_timeout", "operators.0.count.window.events"]


def test_check_refuses_string_formatting_whose_width_builds_a_huge_string(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("job: x\nsources:\n  - {name: tx, topic: t, schema: transaction, key_field: account, "
                   "time_field: event_time}\noperators:\n  - {kind: count, name: c, window: {events: 10}, output: o,"
                   " predicate: \"'%02000000d' % 1 != type\"}\n")
    result = runner.invoke(app, ["check", str(job)], env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    assert "operators.c.predicate" in result.output and "formatting a string with % is not allowed" in result.output
