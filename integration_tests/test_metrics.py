"""A running job's Prometheus endpoint, scraped over HTTP after every micro-batch of a real job on
the embedded stack: the series are there, with the values the input implies (records per
partition as produced, late records as the oracle finds them, dead letters as injected, result
records as read back from each topic, each partition's CTI from its own largest event time)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from integration_tests.harness import job, produce, read, run
from integration_tests.test_operators import BATCH, PARTITIONS, checked_input, partition_of_key, spread_keys, tx_source
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.ops.stack import free_port
from ctiflow.jobs.testing import oracle, workload


pytestmark = [pytest.mark.integration, pytest.mark.spark]


def samples(text: str) -> dict[tuple, float]:
    """``(name, sorted labels) → value`` of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_metrics_endpoint_reports_what_the_job_did(stack, spark, tmp_path):
    records = workload.transactions(1500, accounts=20, seed=11, disorder_ms=1500, late_fraction=0.02,
                                    late_by_ms=60_000)
    src = stack.topic("metrics-in")
    outs = {"count": stack.topic("metrics-count"), "late": stack.topic("metrics-late"),
            "dlq": stack.topic("metrics-dlq")}
    kafka.create_topics(stack.bootstrap, {src: PARTITIONS})
    malformed = [b"\x00not avro", b"\xc3\x01" + b"\x00" * 8 + b"unknown fingerprint"]
    produce(stack.bootstrap, src, "transaction", records, "account", partition_of=spread_keys("account"),
            raw=malformed)
    port = free_port()
    cfg = job(stack, tmp_path, job="metrics", sources=[tx_source(src, "10s")],
              operators=[{"kind": "count", "name": "per_account", "window": {"time": "1h"}, "output": outs["count"]}],
              outputs={"late": outs["late"], "dead_letter": outs["dlq"]}, metrics={"port": port})
    scrapes: list[dict] = []
    views: dict[int, str] = {}

    def scrape(progress, counters):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            scrapes.append(samples(r.read().decode()))
        if len(scrapes) == 2:  # `ctiflow status` against the running job (its metrics stay put until we return)
            for width in (200, 80):
                done = subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "status", "--once", "--url",
                                       f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True,
                                      timeout=60, env={**os.environ, "COLUMNS": str(width)})
                assert done.returncode == 0, done.stderr
                views[width] = done.stdout

    summary = run(cfg, spark, on_progress=scrape)
    assert len(scrapes) == summary.batches > 2
    last = scrapes[-1]
    j = ("job", "metrics")

    def value(name, **labels):
        return last.get((name, tuple(sorted({"job": "metrics", **labels}.items()))))

    produced = Counter(partition_of_key(r["account"]) for r in records)
    malformed_partitions = Counter()
    for p in range(PARTITIONS):  # the malformed records went where the producer put them (no key)
        got = value("ctiflow_records_received_total", stream="tx", partition=str(p)) or 0
        malformed_partitions[p] = got - produced[p]
    assert all(n >= 0 for n in malformed_partitions.values()) and sum(malformed_partitions.values()) == len(malformed)
    assert value("ctiflow_records_dead_letter_total") == len(malformed)

    checked = checked_input(records, "account", "event_time", None, 10_000, BATCH)
    late = Counter(c.event.partition for c in checked if c.status == oracle.LATE)
    assert sum(late.values()) > 0, "the workload must have late records"
    for p in range(PARTITIONS):
        assert value("ctiflow_records_late_total", stream="tx", partition=str(p)) == late[p]
        frontier = max(r["event_time"] for r in records if partition_of_key(r["account"]) == p)
        assert value("ctiflow_partition_cti_timestamp_seconds", stream="tx", partition=str(p)) == \
            pytest.approx((frontier - 10_000) / 1000)
        assert value("ctiflow_partition_offsets_behind", stream="tx", partition=str(p)) == 0
        assert value("ctiflow_partition_event_time_lag_seconds", stream="tx", partition=str(p)) > 0
    assert value("ctiflow_records_released_total") == len(records) - sum(late.values())
    for topic in outs.values():
        assert value("ctiflow_records_written_total", topic=topic) == len(read(stack, topic)), topic
    assert value("ctiflow_batches_total") == summary.batches
    assert value("ctiflow_task_attempts_failed_total") == sum(p.get("failedTaskAttempts", 0) for p in summary.progress)
    assert value("ctiflow_batch_duration_seconds_count") == summary.batches
    assert value("ctiflow_last_batch_duration_seconds", stage="triggerExecution") > 0
    assert value("ctiflow_state_keys", operator="per_account") is not None
    op = tuple(sorted((j, ("operator", "per_account"))))
    keys, size = max((s.get(("ctiflow_state_keys", op), 0), s.get(("ctiflow_state_bytes", op), 0)) for s in scrapes)
    assert 0 < keys <= 20 and size > 0  # during the run: the accounts' histograms
    assert any(name == "ctiflow_info" and dict(labels)["job"] == "metrics" for name, labels in last)

    # The status view showed the figures of that moment: a table per job, a line per partition.
    second = scrapes[1]
    wide = views[200].splitlines()
    assert any(line.startswith("metrics ") or " metrics " in line for line in wide[:3]), views[200]
    assert "failed task attempts" in views[200], views[200]
    for p in range(PARTITIONS):
        received = second[("ctiflow_records_received_total", (("job", "metrics"), ("partition", str(p)),
                                                             ("stream", "tx")))]
        row = next(line for line in wide if re.match(rf"[^a-z]*tx\s*[│|]\s*{p}\s", line))
        assert f"{received:,.0f}" in row, (row, received)
    narrow = views[80].strip().splitlines()
    failed = second.get(("ctiflow_task_attempts_failed_total", (("job", "metrics"),)))
    assert failed is not None  # (0 in a run whose tasks all ran once: then the line says nothing of them)
    lead = f"metrics: failed task attempts {failed:,.0f} CTI " if failed else "metrics: CTI "
    assert len(narrow) == 1 and narrow[0].startswith(lead), views[80]
    dead = second[("ctiflow_records_dead_letter_total", (("job", "metrics"),))]
    assert f"dead-letter {dead:,.0f}" in narrow[0]


@pytest.mark.parametrize("where", ["port in use", "host unknown"])
def test_a_metrics_port_in_use_or_a_host_it_cannot_listen_on_is_one_error_before_spark(stack, tmp_path, where):
    """Two jobs with the tour's CTIFLOW_METRICS_PORT, or ``metrics.host: nosuch.invalid``: one
    ``error:`` line naming the field and the fix, and Spark is never started."""
    import socket

    import yaml

    from integration_tests.test_stack_cli import job_file, transactions_topic

    path = job_file(tmp_path, transactions_topic(stack, f"metrics-{where.split()[0]}", 10))
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    env = {**os.environ, "CTIFLOW_METRICS_PORT": str(held.getsockname()[1])}
    if where == "host unknown":
        spec = yaml.safe_load(open(path))
        spec["metrics"] = {"host": "nosuch.invalid", "port": 0}
        open(path, "w").write(yaml.safe_dump(spec))
        env.pop("CTIFLOW_METRICS_PORT")
    try:
        result = subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "run", path, "--until-end"], capture_output=True,
                                text=True, timeout=120, env={**env, "CTIFLOW_BOOTSTRAP": stack.bootstrap})
    finally:
        held.close()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "spark" not in result.stderr.lower()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    field = "metrics.port" if where == "port in use" else "metrics.host"
    assert len(errors) == 1 and field in errors[0], result.stderr
