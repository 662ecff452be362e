"""ctiflow's Python API: what the ``ctiflow`` command does, from your own code.

Jobs (Kafka → Spark → Kafka), configured as in a job YAML::

    import ctiflow

    job = ctiflow.load("job.yaml")              # or ctiflow.parse({...}): a validated JobConfig
    report = ctiflow.check("job.yaml")          # every error and warning, no Kafka, no Spark
    errors = ctiflow.check_config(job)          # the same for a parsed config (a list, [] if none)
    summary = ctiflow.run(job, until_end=True)  # a bounded run on its own Spark session
    ctiflow.put_rule(job, "stages: …", rule_id="big", effective="2026-11-28T09:00:00Z")  # rules at a CTI
    query = ctiflow.stream(spark, job).start()  # or: the job's query in *your* SparkSession

The operators themselves are plain Python state machines (no Spark, no Kafka): feed them
:class:`Event` objects, move time on with ``advance_to(cti)``, read their :class:`Output`
records; ``snapshot()`` / ``restore()`` keep their state. See docs/guide/jobs.md, "Python API".

The Spark parts (:func:`run`, :func:`stream`, :func:`spark_session`) import PySpark when first
used; ``import ctiflow`` alone does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctiflow.jobs.driver.config import JobConfig

#: Public name → (module, name there). Imported when first used (PEP 562), so importing one of
#: ctiflow's subpackages — what a Spark worker does — does not load the configuration model,
#: the serdes and every operator with it.
_EXPORTS = {
    "Report": ("ctiflow.jobs.driver.check", "Report"),
    "check": ("ctiflow.jobs.driver.check", "check_job"),
    "check_config": ("ctiflow.jobs.driver.check", "config_errors"),
    "JobConfig": ("ctiflow.jobs.driver.config", "JobConfig"),
    "load": ("ctiflow.jobs.driver.config", "load"),
    "parse": ("ctiflow.jobs.driver.config", "parse"),
    "put_rule": ("ctiflow.jobs.driver.rules", "put_rule"),
    "delete_rule": ("ctiflow.jobs.driver.rules", "delete_rule"),
    "list_rules": ("ctiflow.jobs.driver.rules", "list_rules"),
    "try_rule": ("ctiflow.jobs.driver.rule_trial", "try_rule"),
    "RuleTrial": ("ctiflow.jobs.driver.rule_trial", "RuleTrial"),
    "Rule": ("ctiflow.operators.cep.rules", "Rule"),
    "AvroDeserializer": ("ctiflow.jobs.avro.serde", "AvroDeserializer"),
    "AvroSerializer": ("ctiflow.jobs.avro.serde", "AvroSerializer"),
    "SchemaStore": ("ctiflow.jobs.avro.serde", "SchemaStore"),
    "default_store": ("ctiflow.jobs.avro.serde", "default_store"),
    "Binner": ("ctiflow.operators.bins", "Binner"),
    "BinSettings": ("ctiflow.operators.bins", "BinSettings"),
    "MatchOperator": ("ctiflow.operators.cep.operator", "MatchOperator"),
    "MatchSettings": ("ctiflow.operators.cep.operator", "MatchSettings"),
    "Pattern": ("ctiflow.operators.cep.pattern", "Pattern"),
    "CountOperator": ("ctiflow.operators.count", "CountOperator"),
    "CountSettings": ("ctiflow.operators.count", "CountSettings"),
    "ConfigError": ("ctiflow.operators.errors", "ConfigError"),
    "CtiflowError": ("ctiflow.operators.errors", "CtiflowError"),
    "Output": ("ctiflow.operators.operator", "Output"),
    "CTI_INFINITY": ("ctiflow.operators.time", "CTI_INFINITY"),
    "Event": ("ctiflow.operators.time", "Event"),
}

__all__ = sorted([*_EXPORTS, "run", "spark_session", "stream"])


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'ctiflow' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def run(job: JobConfig, *, until_end: bool = False, spark: Any = None, timeout: float | None = None):
    """Run ``job`` as ``ctiflow run`` does (``until_end``: as ``ctiflow drain``) and return its
    :class:`ctiflow.jobs.driver.progress.RunSummary`. Without ``spark``, on a session of its own, stopped after."""
    from ctiflow.jobs.driver import pipeline

    own = spark is None
    try:
        return pipeline.run(job, until_end=until_end, spark=spark, timeout=timeout)
    finally:
        if own:
            pipeline.stop_session()


def stream(spark: Any, job: JobConfig, *, until_end: bool = False):
    """The job's streaming query in ``spark`` (a ``DataStreamWriter``: call ``.start()``), after
    the checks ``ctiflow run`` makes before Spark (broker, topics, checkpoint, fields, pattern).
    ctiflow's Kafka source and sink are registered in ``spark``; the session should carry the
    settings of :func:`spark_session` (RocksDB state store, Arrow batch sizes)."""
    from ctiflow.jobs.driver import pipeline

    checkpoint = pipeline.prepare(job)
    pipeline.register_data_sources(spark)
    return pipeline.build_query(spark, job, until_end=until_end, progress=job.progress_topic, checkpoint=checkpoint)


def spark_session(job: JobConfig | None = None, app: str = "ctiflow"):
    """A SparkSession configured as ctiflow's jobs run (state store, Arrow, the data sources)."""
    from ctiflow.jobs.driver import pipeline

    return pipeline.spark_session(job, app)
