"""ctiflow's Python API: what the ``ctiflow`` command does, from your own code.

Jobs (Kafka → Spark → Kafka), configured as in a job YAML::

    import ctiflow

    job = ctiflow.load("job.yaml")              # or ctiflow.parse({...}): a validated JobConfig
    report = ctiflow.check("job.yaml")          # every error and warning, no Kafka, no Spark
    errors = ctiflow.check_config(job)          # the same for a parsed config (a list, [] if none)
    summary = ctiflow.run(job, until_end=True)  # a bounded run on its own Spark session
    query = ctiflow.stream(spark, job).start()  # or: the job's query in *your* SparkSession

The operators themselves are plain Python state machines (no Spark, no Kafka): feed them
:class:`Event` objects, move time on with ``advance_to(cti)``, read their :class:`Output`
records; ``snapshot()`` / ``restore()`` keep their state. See docs/guide/jobs.md, "Python API".

The Spark parts (:func:`run`, :func:`stream`, :func:`spark_session`) import PySpark when first
used; ``import ctiflow`` alone does not.
"""

from __future__ import annotations

from typing import Any

from jobs.check import Report, check_job as check, config_errors as check_config
from jobs.config import JobConfig, load, parse
from jobs.serde import AvroDeserializer, AvroSerializer, SchemaStore, default_store
from operators.bins import Binner, BinSettings
from operators.cep.operator import MatchOperator, MatchSettings
from operators.cep.pattern import Pattern
from operators.count import CountOperator, CountSettings
from operators.errors import ConfigError, CtiflowError
from operators.operator import Output
from operators.time import CTI_INFINITY, Event

__all__ = ["AvroDeserializer", "AvroSerializer", "Binner", "BinSettings", "CTI_INFINITY", "ConfigError",
           "CountOperator", "CountSettings", "CtiflowError", "Event", "JobConfig", "MatchOperator", "MatchSettings",
           "Output", "Pattern", "Report", "SchemaStore", "check", "check_config", "default_store", "load", "parse", "run",
           "spark_session", "stream"]


def run(job: JobConfig, *, until_end: bool = False, spark: Any = None, timeout: float | None = None):
    """Run ``job`` as ``ctiflow run`` does (``until_end``: as ``ctiflow drain``) and return its
    :class:`jobs.progress.RunSummary`. Without ``spark``, on a session of its own, stopped after."""
    from jobs import pipeline

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
    from jobs import pipeline

    pipeline.prepare(job)
    pipeline.register_data_sources(spark)
    return pipeline.build_query(spark, job, until_end=until_end)


def spark_session(job: JobConfig | None = None, app: str = "ctiflow"):
    """A SparkSession configured as ctiflow's jobs run (state store, Arrow, the data sources)."""
    from jobs import pipeline

    return pipeline.spark_session(job, app)
