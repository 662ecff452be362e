"""``ctiflow rules put | list | rm`` read the rules topic as the job does and refuse what the job
would refuse, with the job's own reason (:func:`ctiflow.jobs.driver.rules.judge`: the topic's records
offered to a :class:`RuleBook` as the job took them, then the new one), printed once; ``list``
shows what the job did with each record.

The topic here is a list of Kafka messages in memory (``topic_messages`` and ``produce_rule``
replaced) and what the job's own topics say is given (``job_verdicts`` replaced): these tests
need no broker. ``integration_tests/test_rules.py`` runs the commands against a job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctiflow.jobs.driver import rules as jobs_rules
from ctiflow.jobs.avro.serde import AvroDeserializer, AvroSerializer
from ctiflow.jobs.cli import app
from ctiflow.jobs.datapath.kafka import Message
from ctiflow.operators.cep.rules import MAX_DEFINITION_BYTES, Rule
from ctiflow.operators.errors import ConfigError, DecodeError

ROOT = Path(__file__).resolve().parent.parent
JOB = str(ROOT / "examples/demo-transactions.yaml")
OPERATOR = "large-after-abroad"
GOOD = "stages: [{name: a, where: \"type == 'purchase'\"}, {name: b, where: 'amount > 1000'}]\nwithin: 10m\n"
T0 = 1_767_225_600_000
runner = CliRunner()


class FakeTopic:
    """The rules topic as a list of messages: one partition, offsets in order."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.reads = 0
        self.verdicts: jobs_rules.Verdicts | None = None  # what the job's own topics say (None: it never ran)

    def add(self, value: bytes) -> None:
        self.messages.append(Message(0, len(self.messages), None, value, T0))

    def add_rule(self, rule: Rule) -> None:
        self.add(AvroSerializer("rule")({f: getattr(rule, f) for f in Rule.__dataclass_fields__}))

    def read(self, job, topic):
        self.reads += 1
        return iter(list(self.messages))

    def produce(self, job, op, rule: Rule) -> None:
        self.add_rule(rule)


@pytest.fixture
def topic(monkeypatch) -> FakeTopic:
    fake = FakeTopic()
    monkeypatch.setattr(jobs_rules, "topic_messages", fake.read)
    monkeypatch.setattr(jobs_rules, "produce_rule", fake.produce)
    monkeypatch.setattr(jobs_rules, "job_verdicts", lambda job, op, warn: fake.verdicts)
    return fake


def written(topic: FakeTopic) -> list[tuple]:
    """``(rule_id, version, action, effective_time)`` of each rule record on the topic."""
    decode, out = AvroDeserializer("rule"), []
    for m in topic.messages:
        try:
            r = decode(m.value)
        except DecodeError:  # (the foreign record)
            continue
        out.append((r["rule_id"], r["version"], r["action"], r["effective_time"]))
    return out


def cli(*args: str):
    return runner.invoke(app, ["rules", *args, "--job", JOB])


def definition_file(tmp_path: Path, text: str = GOOD) -> str:
    path = tmp_path / "rule.yaml"
    path.write_text(text)
    return str(path)


def test_a_foreign_record_on_the_rules_topic_is_skipped_with_a_warning_naming_partition_and_offset(
        topic, tmp_path):
    topic.add(AvroSerializer("transaction")({"id": "t1", "account": "a1", "event_time": T0, "type": "purchase",
                                             "amount": 5.0, "currency": "EUR", "country": "DE", "merchant": None}))
    topic.add_rule(Rule("big", OPERATOR, 1, T0, "put", GOOD))
    listed = cli("list", "--at", str(T0))
    assert listed.exit_code == 0, listed.output
    assert listed.output.count("partition 0 offset 0: not a rule record, skipped") == 1
    assert "big" in listed.output and "current" in listed.output
    assert cli("put", definition_file(tmp_path), "--id", "big", "--effective", str(T0 + 1)).exit_code == 0
    assert cli("rm", "--id", "big", "--effective", str(T0 + 2)).exit_code == 0
    assert written(topic) == [("big", 1, "put", T0), ("big", 2, "put", T0 + 1), ("big", 3, "delete", T0 + 2)]


def table_rows(output: str) -> dict[tuple[str, str], str]:
    """``(rule, version)`` → its row of a ``rules list`` table (one line at the tests' width)."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().split("│")[1:-1]]
        if len(cells) == 7 and cells[1].isdigit():
            rows[(cells[0], cells[1])] = line
    return rows


def test_list_shows_what_the_job_did_with_each_record_and_schedules_by_it(topic, tmp_path):
    """Read through offset 2: big's version 2 refused (dead letter), mid adjusted to T0 + 40 s
    (late topic); offsets 3 and 4 not read yet — the delete at T0 + 3 s will be taken, as it comes
    after version 1 (version 2, at T0 + 5 s, never took effect). At T0 + 2 s mid is scheduled
    (it asked for T0 + 10 s)."""
    topic.add_rule(Rule("big", OPERATOR, 1, T0, "put", GOOD))
    topic.add_rule(Rule("big", OPERATOR, 2, T0 + 5_000, "put", GOOD))
    topic.add_rule(Rule("mid", OPERATOR, 1, T0 + 10_000, "put", GOOD))
    topic.add_rule(Rule("big", OPERATOR, 3, T0 + 3_000, "delete"))  # (after v1, not after the refused v2)
    topic.add_rule(Rule("big", OPERATOR, 4, T0 + 120_000, "put", GOOD))
    topic.verdicts = jobs_rules.Verdicts({0: 3}, {(0, 1): "late: effective_time is behind the CTI"},
                                         {(0, 2): T0 + 40_000})
    listed = runner.invoke(app, ["rules", "list", "--job", JOB, "--at", str(T0 + 2_000)],
                           env={"COLUMNS": "220"})
    assert listed.exit_code == 0, listed.output
    rows = table_rows(listed.output)
    assert set(rows) == {("big", "1"), ("big", "2"), ("big", "3"), ("big", "4"), ("mid", "1")}, listed.output
    assert "applied" in rows[("big", "1")] and "current" in rows[("big", "1")]
    assert "refused: late: effective_time is behind the CTI" in rows[("big", "2")]
    assert "adjusted to 2026-01-01T00:00:40.000Z" in rows[("mid", "1")] and "scheduled" in rows[("mid", "1")]
    assert "not read yet" in rows[("big", "3")] and "will refuse" not in rows[("big", "3")]
    assert "scheduled" in rows[("big", "3")] and "not read yet" in rows[("big", "4")]
    later = runner.invoke(app, ["rules", "list", "--job", JOB, "--at", str(T0 + 50_000)], env={"COLUMNS": "220"})
    rows = table_rows(later.output)
    assert "current" in rows[("mid", "1")] and "deleted" in rows[("big", "3")] and "replaced" in rows[("big", "1")]


@pytest.mark.parametrize("args, reason", [
    (["--id", "", "--effective", str(T0)], "rule_id is empty"),
    (["--id", "big", "--effective", "-5"], "effective_time -5 is negative"),
    (["--id", "big", "--effective", str(T0), "--version", "0"], "versions start at 1"),
])
def test_put_refuses_what_the_job_refuses_with_the_books_reason_and_writes_nothing(topic, tmp_path, args, reason):
    done = cli("put", definition_file(tmp_path), *args)
    assert done.exit_code != 0 and isinstance(done.exception, ConfigError)
    assert reason in str(done.exception) and "the job would refuse it" in str(done.exception)
    assert written(topic) == []


def test_put_refuses_a_version_the_book_would_refuse_after_the_topics_records(topic, tmp_path):
    topic.add_rule(Rule("big", OPERATOR, 1, T0, "put", GOOD))
    topic.add_rule(Rule("big", OPERATOR, 2, T0 + 60_000, "put", GOOD))
    older = cli("put", definition_file(tmp_path), "--id", "big", "--effective", str(T0 + 90_000), "--version", "2")
    assert "is not newer than version 2" in str(older.exception)
    earlier = cli("put", definition_file(tmp_path), "--id", "big", "--effective", str(T0 + 30_000))
    assert "is before version 2's" in str(earlier.exception)
    gone = cli("rm", "--id", "nope", "--effective", str(T0 + 90_000))
    assert "rule 'nope' has no live version to delete" in str(gone.exception)
    assert len(written(topic)) == 2


def test_a_problem_of_the_definition_is_stated_once(topic, tmp_path):
    done = cli("put", definition_file(tmp_path, "stages: [{name: a, where: 'amount >> 3'}]"), "--id", "big",
               "--effective", str(T0))
    assert isinstance(done.exception, ConfigError)
    message = str(done.exception)
    assert message.count("amount >> 3") == 1, message
    assert written(topic) == []


def test_list_at_names_the_at_option_in_its_error(topic):
    done = cli("list", "--at", "yesterday")
    assert isinstance(done.exception, ConfigError) and str(done.exception).startswith("--at 'yesterday':")


def test_an_oversized_definition_is_refused_before_the_topic_is_read_or_it_compiles(topic, tmp_path):
    text = GOOD + "#" * (1_300_000)
    started = time.perf_counter()
    done = cli("put", definition_file(tmp_path, text), "--id", "big", "--effective", str(T0))
    assert f"more than {MAX_DEFINITION_BYTES:,}" in str(done.exception)
    assert topic.reads == 0 and time.perf_counter() - started < 1.0


def test_demo_rules_refuses_a_line_that_is_not_json_naming_it(topic, tmp_path):
    bad = tmp_path / "tx.jsonl"
    bad.write_text('{"event_time": 5}\nnot json\n')
    done = runner.invoke(app, ["demo-rules", "--job", JOB, "--transactions", str(bad)])
    assert done.exit_code != 0 and "line 2: not JSON" in str(done.exception)
    assert written(topic) == []
