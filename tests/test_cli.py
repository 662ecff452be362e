"""The command line: every subcommand has --help; bad configs fail before Spark with the field named."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jobs.cli import app

runner = CliRunner()

COMMANDS = [[], ["up"], ["down"], ["status"], ["doctor"], ["produce"], ["consume"], ["run"], ["drain"], ["demo"],
            ["demo-data"], ["bench"], ["topics"], ["topics", "create"], ["topics", "list"], ["schemas"],
            ["schemas", "list"], ["schemas", "register"], ["plot"], ["plot", "counts"], ["plot", "bins"],
            ["conformance"], ["conformance", "cep"], ["users"], ["users", "create"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "ctiflow")
def test_every_subcommand_has_help(cmd):
    result = runner.invoke(app, [*cmd, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


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
