"""Broker-outage harness: a continuous job, the broker stopped for ≥ 30 s and started again.

tansu keeps everything in memory, so a restarted broker is empty: the harness re-creates the
topics and re-produces the input (same records, same offsets) — the stand-in for a real
broker's durable log — before the job's next poll. Output written before the outage is read
before the broker stops (it is lost with the broker's memory)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ctiflow.jobs.driver.checkpoint import ProgressLog, read_counters


@dataclass
class OutageReport:
    outage_seconds: float
    before: list[dict]
    after: list[dict]
    drained: list[dict]


def _wait_for(progress: ProgressLog, key: str, value: int, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while read_counters(progress).get(key, 0) < value:
        if proc.poll() is not None:
            raise RuntimeError(f"the job exited with {proc.returncode} while waiting for {key} ≥ {value}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key} stayed at {read_counters(progress).get(key, 0)} < {value}")
        time.sleep(1)


def outage_run(spec: dict, workdir: Path, port: int, inputs: list[tuple[str, str, list[dict], str]],
               second: list[tuple[str, str, list[dict], str]], outage: float = 32.0) -> OutageReport:
    """``inputs``/``second``: (topic, schema, records, key_field) produced before/after the outage."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.ops import stack
    from ctiflow.jobs.datapath.kafka import read_topic
    from ctiflow.jobs.driver.config import parse

    bootstrap = f"127.0.0.1:{port}"
    cfg = parse(spec, "outage job")
    topics = cfg.topics()

    def load(batches):
        from ctiflow.jobs.avro.serde import AvroSerializer

        for topic, schema, records, key in batches:
            kafka.produce(bootstrap, topic, records, AvroSerializer(schema), key)

    stack.up(port)
    kafka.create_topics(bootstrap, topics)
    load(inputs)
    config = workdir / "job.yaml"
    config.write_text(yaml.safe_dump(spec))
    progress = ProgressLog.of(cfg)
    log = open(workdir / "job.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "ctiflow.jobs.cli", "run", str(config)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        n1 = sum(len(b[2]) for b in inputs)
        _wait_for(progress, "received", n1, 240, proc)
        time.sleep(3)
        before = {t: read_topic(bootstrap, t) for t in cfg.result_topics()}
        stack.down(port)
        t0 = time.monotonic()
        time.sleep(outage)
        stack.up(port)
        down_for = time.monotonic() - t0
        kafka.create_topics(bootstrap, topics)
        load(inputs)      # the restarted (memory-only) broker gets the same input back …
        load(second)      # … and the stream goes on
        # the job's progress topic went with the memory-only broker too: counted anew from here
        _wait_for(progress, "received", sum(len(b[2]) for b in second), 240, proc)
        time.sleep(3)
        assert proc.poll() is None, "the job must have waited out the outage"
        os.kill(proc.pid, signal.SIGTERM)  # graceful: the CLI stops the query, then exits
        proc.wait(120)
        after = {t: read_topic(bootstrap, t) for t in cfg.result_topics()}
        drain = subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "drain", str(config)], stdout=log,
                               stderr=subprocess.STDOUT, timeout=600)
        assert drain.returncode == 0
        drained = {t: read_topic(bootstrap, t) for t in cfg.result_topics()}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        stack.down(port)
    return OutageReport(down_for, before, after, drained)
