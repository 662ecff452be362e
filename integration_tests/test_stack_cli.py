"""The embedded stack's lifecycle and the produce/consume commands (no Spark)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from jobs import kafka, stack
from operators.errors import StackError

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
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], input=stdin, capture_output=True, text=True,
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
