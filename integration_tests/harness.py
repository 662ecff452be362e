"""Small helpers the integration tests share: produce records, build and run a job, read topics."""

from __future__ import annotations

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
    from ctiflow.jobs.driver import pipeline

    return pipeline.run(cfg, until_end=kwargs.pop("until_end", True), spark=spark, **kwargs)


def read(stack, topic: str, store=None) -> list[dict]:
    """``topic``'s records; ``store``: a job's schema store (its derived schemas) to decode them with."""
    from ctiflow.jobs.datapath.kafka import read_topic

    return read_topic(stack.bootstrap, topic, registry_url=stack.registry_url, store=store)
