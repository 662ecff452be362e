"""PySpark's Python worker daemon (``pyspark.daemon``) with the modules every ctiflow worker
imports already imported, and frozen out of the cyclic collector, before it forks its workers.

Why: Spark forks one Python process per concurrent task (the source's readers, the stateful
workers, the sink's writers: 15–17 processes in a 2-core job), and each imported pandas,
pyarrow, NumPy, PySpark's worker and ctiflow after the fork — ≈ 50 MB of private heap apiece.
Imported before the fork, those pages are shared copy-on-write; ``gc.freeze`` keeps the
collector from writing to them. Measured: docs/changelog.md#memory.
``ctiflow.jobs.driver.pipeline.spark_session`` sets ``spark.python.daemon.module`` to this module.

Contract: nothing here starts a thread or opens a client (a fork copies neither); a job's own
state is built in the forked worker, as before."""

from __future__ import annotations

import gc


def preload() -> None:
    """Import what a ctiflow worker imports (each import a no-op in the worker after the fork)."""
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401
    import pyspark.sql.pandas.serializers  # noqa: F401
    import pyspark.worker  # noqa: F401

    import ctiflow.jobs.datapath.adapter  # noqa: F401 - the stateful workers (runtime, operators, encoders)
    import ctiflow.jobs.datapath.sink  # noqa: F401 - the sink's writers
    import ctiflow.jobs.datapath.source.reader  # noqa: F401 - the source's readers (decoders, Kafka clients)


if __name__ == "__main__":
    from pyspark import daemon

    try:
        preload()
    except ImportError:  # e.g. an environment archive of another Python (ctiflow submit): the
        pass             # daemon still serves, and the task that needs the module reports it
    gc.freeze()
    daemon.manager()
