"""Small helpers the integration tests share: produce records, build and run a job, read topics."""

from __future__ import annotations

import re
from pathlib import Path

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.driver.config import JobConfig, parse
from ctiflow.jobs.avro.serde import AvroSerializer


def produce(bootstrap: str, topic: str, schema: str, records: list[dict], key_field: str | None,
            partition_of=None, raw: list[bytes] = ()) -> None:
    """``records`` (keyed by ``key_field``; ``partition_of(index, record)`` picks partitions), then
    the ``raw`` values unkeyed."""
    done = kafka.produce(bootstrap, topic, records, AvroSerializer(schema), key_field, partition_of=partition_of)
    assert done.unflushed == 0 and done.sent == len(records)
    if raw:
        assert kafka.produce(bootstrap, topic, list(raw), AvroSerializer(schema)).unflushed == 0


def job(stack, tmp_path: Path, **spec) -> JobConfig:
    """A job config against the test stack with a private checkpoint."""
    spec.setdefault("kafka", {})["bootstrap_servers"] = stack.bootstrap
    spark = spec.setdefault("spark", {})
    spark.setdefault("checkpoint", str(tmp_path / "checkpoint"))
    spark.setdefault("key_groups", 4)
    return parse(spec, "test job")


def run(cfg: JobConfig, spark, **kwargs):
    """``pipeline.run`` until the end; a query that failed because a Python worker died fails the
    test with what Spark's log says about its workers and daemons (the log is the session's file,
    gone with a CI run's checkout)."""
    from ctiflow.jobs.driver import pipeline

    try:
        return pipeline.run(cfg, until_end=kwargs.pop("until_end", True), spark=spark, **kwargs)
    except Exception as exc:
        if "exited unexpectedly" not in str(exc):
            raise
        raise AssertionError(f"a Python worker died: {str(exc)[:3000]}\n--- Spark's log on its Python "
                             f"workers ---\n{python_worker_lines(spark)}") from exc


#: Spark's log lines that tell why a Python worker ended: warnings and errors (Spark's restart of a
#: daemon among them), Python tracebacks and faulthandler dumps the JVM copied from the workers.
WORKER_LINES = re.compile(r" (WARN|ERROR) |Traceback|Fatal Python|Thread 0x|Current thread|File \"|Error:|Python daemon")


def python_worker_lines(spark, last: int = 80) -> str:
    path = spark.sparkContext._jvm.java.lang.System.getProperty("ctiflow.spark.log")
    if not path or not Path(path).exists():
        return f"(no Spark log: {path})"
    lines = [line for line in Path(path).read_text(errors="replace").splitlines()
             if WORKER_LINES.search(line) and "Python daemon module in PySpark is set to" not in line]
    return "\n".join(lines[-last:]) or f"(nothing about Python workers in {path})"


def read(stack, topic: str, store=None) -> list[dict]:
    """``topic``'s records; ``store``: a job's schema store (its derived schemas) to decode them with."""
    from ctiflow.jobs.datapath.kafka import read_topic

    return read_topic(stack.bootstrap, topic, registry_url=stack.registry_url, store=store)
