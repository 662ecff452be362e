"""The Python workers of ctiflow's Spark session fork from ``ctiflow.jobs.datapath.spark_daemon``: pandas,
pyarrow and ctiflow are imported and frozen out of the cyclic collector before the fork, so
their pages are shared, not copied into every worker."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_python_workers_fork_from_the_daemon_with_ctiflows_modules_imported(spark):
    def probe(batches):  # (nested: cloudpickle ships it by value)
        import gc
        import os
        import sys

        import pandas as pd

        for batch in batches:
            yield pd.DataFrame({"pid": [os.getpid()] * len(batch), "frozen": [gc.get_freeze_count()] * len(batch),
                                "preloaded": ["ctiflow.jobs.datapath.adapter" in sys.modules and "ctiflow.jobs.datapath.sink" in sys.modules] * len(batch)})

    rows = spark.range(8, numPartitions=4).mapInPandas(probe, "pid long, frozen long, preloaded boolean").collect()
    assert len(rows) == 8
    # gc.freeze() ran in the parent before the fork: only ctiflow.jobs.datapath.spark_daemon calls it (PySpark's daemon does not)
    assert all(r["frozen"] > 10_000 and r["preloaded"] for r in rows), rows[:2]
