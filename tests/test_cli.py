"""The command line: every subcommand has --help; bad configs fail before Spark with the field named."""

from __future__ import annotations

import codecs
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctiflow.bench import BENCHES, LONG_BENCHES
from ctiflow.jobs.cli import app
from ctiflow.jobs.driver.config import MAX_PARTITIONS
from ctiflow.jobs.ops.stack import free_port
from ctiflow.jobs.cli.records import Framing
from ctiflow.jobs.avro.serde import FRAMINGS

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
    help_text = " ".join(runner.invoke(app, ["bench", "--help"]).output.split())
    assert all(name in help_text for name in (*BENCHES, *LONG_BENCHES)), help_text


def test_an_unknown_choice_is_refused_with_the_valid_ones():
    result = runner.invoke(app, ["bench", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of" in result.output and "'reliability'" in result.output


@pytest.mark.parametrize("args", [["latency", "--sparse"], ["count", "--cti-delay"], ["scale", "--sparse", "--cti-delay"]])
def test_the_scale_tables_are_options_of_scale_alone_and_one_at_a_time(args):
    result = runner.invoke(app, ["bench", *args])
    said = re.sub(r"[│╭╮╰╯─\s]+", " ", result.output)  # (rich's box, wrapped)
    assert result.exit_code == 2 and "of the scale benchmark" in said, result.output


@pytest.mark.parametrize("args", [["scale", "--runs", "2"], ["scale", "--cti-delay", "--runs", "2"],
                                  ["adapter", "--runs", "2"]])
def test_runs_is_an_option_of_the_latency_and_peers_benchmarks_and_the_sparse_keys_table_alone(args):
    result = runner.invoke(app, ["bench", *args])
    said = re.sub(r"[│╭╮╰╯─\s]+", " ", result.output)
    assert result.exit_code == 2 and "of the latency and peers benchmarks and of the sparse-keys table" in said, \
        result.output


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


# -- every mistake is one line, before anything connects (issue 40) ------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def ctiflow(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The ``ctiflow`` entry point in a process of its own (its error handling is the CLI's
    boundary), pointed at a port where no broker listens."""
    env = {**os.environ, "CTIFLOW_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    return subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def one_error(result: subprocess.CompletedProcess) -> str:
    """The one line a refused command prints (exit 2, nothing else on either stream)."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and result.stdout == "", result.stderr
    return lines[0].removeprefix("error: ")


def test_a_missing_file_or_a_folder_given_to_produce_or_recognize_is_one_error_line(tmp_path):
    query = EXAMPLES / "recognize" / "brute-force.sql"
    (tmp_path / "e.jsonl").write_text("{}\n")
    assert one_error(ctiflow("produce", "-t", "tx", "-s", "transaction", str(tmp_path / "nope.jsonl"))) == \
        f"{tmp_path / 'nope.jsonl'}: No such file or directory"
    assert one_error(ctiflow("produce", "-t", "tx", "-s", "transaction", str(tmp_path))) == f"{tmp_path}: Is a directory"
    assert one_error(ctiflow("recognize", "-q", str(tmp_path / "q.sql"), "-e", str(tmp_path / "e.jsonl"))) == \
        f"{tmp_path / 'q.sql'}: No such file or directory"
    assert one_error(ctiflow("recognize", "-q", str(query), "-e", str(tmp_path))) == f"{tmp_path}: Is a directory"


def test_a_file_that_is_not_utf8_is_one_error_line_naming_it_and_a_byte_order_mark_is_skipped(tmp_path):
    query = (EXAMPLES / "recognize" / "brute-force.sql").read_bytes()
    rows = [{"id": str(i), "account": "a", "event_time": i * 1000, "type": "login_failed", "country": "DE"}
            for i in range(3)] + [{"id": "3", "account": "a", "event_time": 3000, "type": "login_ok", "country": "FR"}]
    events = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "latin1.sql").write_bytes(query.replace(b"Three", b"Dr\xe9i"))
    (tmp_path / "bom.sql").write_bytes(codecs.BOM_UTF8 + query)
    (tmp_path / "bom.jsonl").write_bytes(codecs.BOM_UTF8 + events)
    (tmp_path / "latin1.jsonl").write_bytes(events + b'{"id": "caf\xe9"}\n')
    message = one_error(ctiflow("recognize", "-q", str(tmp_path / "latin1.sql"), "-e", str(tmp_path / "bom.jsonl")))
    assert message.startswith(f"{tmp_path / 'latin1.sql'}: not UTF-8 text (byte 0xe9 at position 6: invalid continuation byte)")
    message = one_error(ctiflow("recognize", "-q", str(tmp_path / "bom.sql"), "-e", str(tmp_path / "latin1.jsonl")))
    assert message.startswith(f"{tmp_path / 'latin1.jsonl'}:5: not UTF-8 text (byte 0xe9")
    result = runner.invoke(app, ["recognize", "-q", str(tmp_path / "bom.sql"), "-e", str(tmp_path / "bom.jsonl")])
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"account": "a", "first_failure": 0, "login_time": 3000, "failures": 3, "login_country": "FR"}]


def test_a_bad_topic_name_an_unwritable_folder_and_an_unknown_key_field_are_one_error_line(tmp_path):
    assert one_error(ctiflow("topics", "create", "bad name")).startswith(
        "topic: 'bad name' is not a valid Kafka topic name")
    (tmp_path / "file").write_text("")
    assert one_error(ctiflow("demo-data", "--out", str(tmp_path / "file" / "demo"))) == \
        f"{tmp_path / 'file' / 'demo'}: Not a directory"
    (tmp_path / "tx.jsonl").write_text("{}\n")
    assert one_error(ctiflow("produce", "-t", "tx", "-s", "transaction", "--key-field", "acount",
                             str(tmp_path / "tx.jsonl"))) == (
        "--key-field: 'acount' is not a field of schema 'transaction' "
        "(its fields: id, account, event_time, type, amount, currency, country, merchant)")


@pytest.mark.parametrize("args, option, bound", [
    (["consume", "-t", "tx", "--max", "0"], "'--max'", "greater than or equal to 1"),
    (["topics", "create", "tx", "--partitions", "100000"], "'--partitions'", f"less than or equal to {MAX_PARTITIONS}"),
])
def test_a_count_outside_its_range_is_refused_before_anything_connects(args, option, bound):
    result = runner.invoke(app, args, env={"CTIFLOW_BOOTSTRAP": f"127.0.0.1:{free_port()}"})
    assert result.exit_code == 2 and f"Invalid value for {option}" in result.output and bound in result.output


def test_check_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CTIFLOW_HOME", raising=False)
    result = runner.invoke(app, ["check", str(EXAMPLES / "demo-transactions.yaml")])
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == []


def test_a_bug_is_one_loud_line_and_its_traceback_goes_to_a_log_file(tmp_path, monkeypatch, capsys):
    """A bug of ctiflow's own (here a KeyError from deep inside `check`) still fails — exit 1,
    not the 2 of a user's mistake — with one line naming it and the file holding its traceback."""
    import sys

    import ctiflow.jobs.driver.check
    import ctiflow.jobs.cli

    def boom(*args, **kwargs):
        raise KeyError("deliberate")

    monkeypatch.setattr(ctiflow.jobs.driver.check, "check_job", boom)
    monkeypatch.setenv("CTIFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "argv", ["ctiflow", "check", "examples/demo-flows.yaml"])
    with pytest.raises(SystemExit) as exited:
        ctiflow.jobs.cli.main()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "a bug in ctiflow: KeyError: 'deliberate'" in err
    log, = (tmp_path / "home" / "logs").glob("ctiflow-bug-*.log")
    assert "Traceback" in log.read_text() and "in boom" in log.read_text() and str(log) in err.replace("\n", "")


def test_a_job_file_that_is_not_utf8_is_one_error_naming_it_and_a_bom_is_fine(tmp_path):
    from typer.testing import CliRunner

    from ctiflow.jobs.cli import app

    good = Path("examples/demo-flows.yaml").read_bytes()
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(good.replace(b"# ", "# caf\u00e9 ".encode("latin-1"), 1))
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbf" + good)
    result = CliRunner().invoke(app, ["check", str(latin)])
    assert result.exit_code != 0 and f"{latin}: not UTF-8 text (byte 0xe9" in result.output.replace("\n", "")
    assert CliRunner().invoke(app, ["check", str(bom)]).exit_code == 0
