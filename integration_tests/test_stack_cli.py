"""The embedded stack's lifecycle and the produce/consume commands (no Spark)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.ops import stack
from ctiflow.operators.errors import StackError

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def test_up_refuses_a_second_start_and_down_stops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CTIFLOW_HOME", str(tmp_path))
    port = stack.free_port()
    proc = stack.up(port)
    try:
        assert proc.running and stack.broker_ready(proc.bootstrap)
        assert (tmp_path / f"tansu-{port}.pid").read_text() == str(proc.pid)
        with pytest.raises(StackError, match="already running"):
            stack.up(port)
    finally:
        assert stack.down(port)
    assert not stack.status(port).running
    assert not stack.down(port)


def test_up_on_a_taken_port_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CTIFLOW_HOME", str(tmp_path))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(StackError, match="taken"):
            stack.up(busy.getsockname()[1])


def test_a_broker_that_is_not_there_is_a_clear_error_after_a_bounded_wait():
    with pytest.raises(StackError, match="no Kafka broker answered"):
        kafka.wait_for_broker(f"127.0.0.1:{stack.free_port()}", timeout=2)


def ctiflow(*args, stdin: str | None = None, env_bootstrap: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CTIFLOW_BOOTSTRAP": env_bootstrap})


def test_produce_then_consume_round_trips_json_lines_through_avro(stack):
    topic = stack.topic("cli-rt")
    records = [{"id": f"t{i}", "account": f"a{i % 3}", "event_time": 1_767_225_600_000 + i, "type": "purchase",
                "amount": i * 1.5, "currency": "EUR", "country": "DE", "merchant": None} for i in range(50)]
    assert ctiflow("topics", "create", topic, "--partitions", "2", env_bootstrap=stack.bootstrap).returncode == 0
    lines = "\n".join(json.dumps(r) for r in records) + "\n" + '{"id": "broken"}\n'
    produced = ctiflow("produce", "--topic", topic, "--schema", "transaction", "--key-field", "account", "-",
                       stdin=lines, env_bootstrap=stack.bootstrap)
    assert produced.returncode == 1  # one line was rejected, and it says so
    assert "produced 50 records" in produced.stdout and "1 lines rejected" in produced.stdout
    consumed = ctiflow("consume", "--topic", topic, env_bootstrap=stack.bootstrap)
    assert consumed.returncode == 0
    got = [json.loads(line) for line in consumed.stdout.splitlines() if line.strip()]
    assert sorted(got, key=lambda r: r["id"]) == sorted(records, key=lambda r: r["id"])


def test_an_unknown_topic_is_a_clear_error(stack):
    result = ctiflow("consume", "--topic", stack.topic("missing"), env_bootstrap=stack.bootstrap)
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert "ctiflow topics create" in result.stderr and "--create-topics" not in result.stderr


def tx_line(i: int, **extra) -> bytes:
    return json.dumps({"id": f"t{i}", "account": "a1", "event_time": 1_767_225_600_000 + i, "type": "purchase",
                       "amount": 1.0, "currency": "EUR", "country": "DE", "merchant": None, **extra}).encode() + b"\n"


def produce_file(stack, tmp_path, name: str, data: bytes) -> tuple[str, Path, subprocess.CompletedProcess]:
    """``ctiflow produce`` of ``data`` (a JSON-lines file) to a new 1-partition topic."""
    topic = stack.topic(name)
    assert ctiflow("topics", "create", topic, "--partitions", "1", env_bootstrap=stack.bootstrap).returncode == 0
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(data)
    produced = ctiflow("produce", "--topic", topic, "--schema", "transaction", "--key-field", "account", str(path),
                       env_bootstrap=stack.bootstrap)
    assert "Traceback" not in produced.stderr, produced.stderr[-2000:]
    return topic, path, produced


def consumed_ids(stack, topic: str) -> list[str]:
    consumed = ctiflow("consume", "--topic", topic, env_bootstrap=stack.bootstrap)
    return [json.loads(line)["id"] for line in consumed.stdout.splitlines()]


def test_produce_skips_an_oversized_line_with_its_reason_and_sends_the_rest(stack, tmp_path):
    topic, path, produced = produce_file(stack, tmp_path, "cli-big",
                                         tx_line(0) + tx_line(1, merchant="m" * 20_000_000) + tx_line(2))
    assert produced.returncode == 1 and produced.stdout.strip() == f"produced 2 records to {topic}, 1 lines rejected"
    said = [line for line in produced.stderr.splitlines() if line.startswith("skipped")]
    assert len(said) == 1 and said[0].startswith(f"skipped {path}:2: 20,000,") and "message.max.bytes" in said[0]
    assert consumed_ids(stack, topic) == ["t0", "t2"]


def test_produce_skips_a_line_that_is_not_utf8_and_warns_once_per_unknown_field(stack, tmp_path):
    topic, path, produced = produce_file(stack, tmp_path, "cli-skip", tx_line(0, note="a") + b'{"id": "caf\xe9"}\n'
                                         + tx_line(2, note="b", extra=1) + tx_line(3, note="c"))
    assert produced.returncode == 1 and produced.stdout.strip() == f"produced 3 records to {topic}, 1 lines rejected"
    said = [line for line in produced.stderr.splitlines() if line.startswith(("skipped", "warning"))]
    where = [f"warning: {path}:1: field 'note' is not in schema 'transaction'", f"skipped {path}:2: not UTF-8 text",
             f"warning: {path}:3: field 'extra' is not in schema 'transaction'"]
    assert len(said) == len(where) and all(line.startswith(w) for line, w in zip(said, where)), said
    assert consumed_ids(stack, topic) == ["t0", "t2", "t3"]


def test_consume_follow_prints_an_undecodable_record_and_goes_on(stack):
    from ctiflow.jobs.avro.serde import AvroSerializer

    topic = stack.topic("cli-follow")
    kafka.create_topics(stack.bootstrap, {topic: 1})
    record = json.loads(tx_line(0))
    kafka.produce(stack.bootstrap, topic, [b"not avro", record], AvroSerializer("transaction"), "account")
    followed = ctiflow("consume", "--topic", topic, "--follow", "--max", "2", env_bootstrap=stack.bootstrap)
    assert followed.returncode == 0, followed.stderr[-2000:]
    first, second = map(json.loads, followed.stdout.splitlines())
    assert first["_bytes"] == b"not avro".hex() and first["_undecodable"] and second == record


def test_plot_counts_of_a_topic_without_count_records_is_refused_and_draws_nothing(stack, tmp_path):
    topic = transactions_topic(stack, "cli-plot", 5)
    result = ctiflow("plot", "counts", "--topic", topic, "--out", str(tmp_path / "c.png"),
                     env_bootstrap=stack.bootstrap)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: topic {topic}: no count records among its 5")
    assert not (tmp_path / "c.png").exists()


def job_file(tmp_path, topic: str, predicate: str | None = None) -> str:
    import yaml

    op = {"kind": "count", "name": "big", "window": {"events": 100}, "per_key": True, "emit": "per_cti",
          "output": topic + "-counts"}
    if predicate:
        op["predicate"] = predicate
    spec = {"job": "cli-json", "sources": [{"name": "tx", "topic": topic, "schema": "transaction",
                                            "key_field": "account", "time_field": "event_time",
                                            "max_offsets_per_trigger": 100, "cti": {"delay": "1s"}}],
            "operators": [op], "spark": {"checkpoint": str(tmp_path / "cp"), "key_groups": 2}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_a_bad_predicate_is_refused_in_one_line_before_spark_starts(stack, tmp_path):
    result = ctiflow("run", job_file(tmp_path, "whatever", "amount >> 200"), "--until-end", env_bootstrap=stack.bootstrap)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "operators.big.predicate" in result.stderr
    assert "RShift" in result.stderr and not (tmp_path / "cp").exists()  # refused before Spark or Kafka


def transactions_topic(stack, name: str, n: int, raw: list[bytes] = ()) -> str:
    """A 2-partition topic with ``n`` transactions of 5 accounts, one a second (then ``raw`` values)."""
    from integration_tests.harness import produce

    topic = stack.topic(name)
    kafka.create_topics(stack.bootstrap, {topic: 2})
    records = [{"id": f"t{i}", "account": f"a{i % 5}", "event_time": 1_767_225_600_000 + i * 1000, "type": "purchase",
                "amount": 1.0, "currency": "EUR", "country": "DE", "merchant": None} for i in range(n)]
    produce(stack.bootstrap, topic, "transaction", records, "account", raw=list(raw))
    return topic


@pytest.mark.spark
def test_run_json_summary_counts_every_input_record_once(stack, tmp_path):
    topic = transactions_topic(stack, "cli-json", 300, raw=[b"not avro", b"\x00"])
    result = ctiflow("run", job_file(tmp_path, topic), "--until-end", "--json", env_bootstrap=stack.bootstrap)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)  # stdout is the one JSON object, nothing else
    c = summary["counters"]
    assert summary["records"] == c["received"] == 302
    assert c["received"] == c["released"] + c["late"] + c["dead_letter"] and c["dead_letter"] == 2
    assert summary["cti"] == 2**62  # flushed
    assert 0 < summary["first_batch_seconds"] <= summary["seconds"] + 60  # Spark's start-up included
    assert c["live_keys"] == 0 and c["state_bytes"] > 0  # flushed: nothing kept per key
    assert (tmp_path / "cp" / "ctiflow-groups.json").exists()  # beside Spark's checkpoint; the counters in Kafka
    assert_console_is_ctiflows_own(result.stderr)


def assert_console_is_ctiflows_own(stderr: str) -> None:
    """Spark's log path once, then ctiflow's progress lines; Spark's and its Python workers'
    chatter is in the log file."""
    lines = stderr.splitlines()
    assert lines[0].startswith("Spark's own log: ") and os.path.exists(lines[0].split(": ", 1)[1])
    assert sum("Spark's own log" in line for line in lines) == 1
    noise = [line for line in lines[1:] if line and not line.startswith(("batch ", "warning: ", "stopped on "))]
    assert noise == [], noise[:5]


@pytest.mark.spark
def test_sigterm_stops_a_running_job_cleanly_and_the_next_run_continues(stack, tmp_path):
    topic = transactions_topic(stack, "cli-term", 1000)
    job = job_file(tmp_path, topic)
    proc = subprocess.Popen([sys.executable, "-m", "ctiflow.jobs.cli", "run", job], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "CTIFLOW_BOOTSTRAP": stack.bootstrap})
    lines = []
    for line in proc.stderr:  # unbounded run: stop it after its second batch, as `docker compose stop` would
        lines.append(line)
        if line.startswith("batch    1 "):
            proc.send_signal(signal.SIGTERM)
            break
    stdout, rest = proc.communicate(timeout=120)
    stderr = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr and "stopped on SIGTERM" in stderr
    assert_console_is_ctiflows_own(stderr)
    assert stdout.startswith("cli-json: ")  # the summary line
    rest = ctiflow("run", job, "--until-end", "--json", env_bootstrap=stack.bootstrap)
    assert rest.returncode == 0, rest.stderr[-2000:]
    counters = json.loads(rest.stdout)["counters"]  # over every run of the checkpoint
    assert counters["received"] == 1000 and counters["released"] + counters["late"] == 1000


@pytest.mark.spark
def test_the_readme_python_api_example_runs_as_written(stack, tmp_path):
    """examples/python_api.py, shown verbatim in the docs (Jobs and the command line), run against the embedded broker:
    the operator alone finds acct-1's brute force; the job (Kafka → Spark → Kafka) both accounts'."""
    example = ROOT / "examples" / "python_api.py"
    page = (ROOT / "docs" / "guide" / "jobs.md").read_text()
    body = example.read_text().split('"""', 2)[2].strip()
    assert body in page, "docs/guide/jobs.md's Python API section must show examples/python_api.py as it is"
    env = {**os.environ, "CTIFLOW_BROKER_PORT": str(stack.port), "CTIFLOW_HOME": str(tmp_path / "home")}
    env.pop("CTIFLOW_BOOTSTRAP", None)
    result = subprocess.run([sys.executable, str(example)], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "operator: [('acct-1', 'brute-force')]"
    assert lines[-1] == "job: 8 records in, matches for ['acct-1', 'acct-2']"


def test_the_docs_dead_letter_replay_snippet_sends_the_original_bytes_back(stack):
    """docs/operations/dead-letters.md's snippet, run as written (the broker's address and the
    topic names substituted): the dead letters it selects go back to their source topic, byte
    for byte and with their keys; the others do not."""
    import re

    from ctiflow.jobs.avro.serde import AvroSerializer

    page = (ROOT / "docs" / "operations" / "dead-letters.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    source, dead_topic = stack.topic("replay-in"), stack.topic("replay-dlq")
    kafka.create_topics(stack.bootstrap, {source: 1, dead_topic: 1})
    ser = AvroSerializer("dead_letter")
    fixed = [(b"acct-1", b"\xc3\x01" + bytes(8) + b"one"), (b"acct-2", b"\xc3\x01" + bytes(8) + b"two")]
    prod = kafka.producer(stack.bootstrap)
    for i, (key, value) in enumerate(fixed):
        prod.produce(dead_topic, value=ser({"source_topic": source, "partition": 0, "offset": i, "key": key,
                                            "value": value, "error": "decode: unknown schema fingerprint 00",
                                            "stage": "decode", "kafka_timestamp": None}))
    prod.produce(dead_topic, value=ser({"source_topic": source, "partition": 0, "offset": 2, "key": None,
                                        "value": b"x", "error": "validate: absurd event time", "stage": "validate",
                                        "kafka_timestamp": None}))
    assert prod.flush(30) == 0
    code = snippet.replace("127.0.0.1:19092", stack.bootstrap).replace("demo-transactions.dead-letter", dead_topic)
    exec(compile(code, "dead-letters.md", "exec"), {})  # noqa: S102 - the documentation's own example
    cons = kafka.consumer(stack.bootstrap, {}, **{"group.id": "replay-check"})
    try:
        end = kafka.true_end_offset(cons, source, 0, 0, timeout=5.0)
        got = [(m.key, m.value) for msgs in kafka.read_range(cons, source, 0, 0, end) for m in msgs]
    finally:
        cons.close()
    assert got == fixed


def test_produce_if_empty_sends_a_file_once_however_often_it_is_run(stack):
    """The compose demo producer runs again on every `up` (e.g. to scale the workers): with
    --if-empty its second run sends nothing, so the demo input is not duplicated (all late)."""
    topic = stack.topic("cli-once")
    assert ctiflow("topics", "create", topic, "--partitions", "3", env_bootstrap=stack.bootstrap).returncode == 0
    lines = "\n".join(json.dumps({"id": f"t{i}", "account": f"a{i % 4}", "event_time": 1_767_225_600_000 + i,
                                  "type": "purchase", "amount": 1.0, "currency": "EUR", "country": "DE",
                                  "merchant": None}) for i in range(40)) + "\n"
    args = ("produce", "--if-empty", "--topic", topic, "--schema", "transaction", "--key-field", "account", "-")
    first = ctiflow(*args, stdin=lines, env_bootstrap=stack.bootstrap)
    assert first.returncode == 0 and "produced 40 records" in first.stdout, first.stderr
    again = ctiflow(*args, stdin=lines, env_bootstrap=stack.bootstrap)
    assert again.returncode == 0 and "already holds records: nothing produced" in again.stdout, again.stderr
    consumed = ctiflow("consume", "--topic", topic, env_bootstrap=stack.bootstrap)
    assert len([line for line in consumed.stdout.splitlines() if line.strip()]) == 40
