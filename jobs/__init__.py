"""Spark and Kafka around the pure operators (:mod:`ctiflow.operators`), in rooms by role:

:mod:`~ctiflow.jobs.driver` — before Spark starts and around the query, on the driver:
    the one configuration model (:mod:`~ctiflow.jobs.driver.config`) → every error at once
    (:mod:`~ctiflow.jobs.driver.check`, :mod:`~ctiflow.jobs.driver.fields`,
    :mod:`~ctiflow.jobs.driver.recognize`) → the one planner (:mod:`~ctiflow.jobs.driver.planner`:
    a :class:`~ctiflow.jobs.core.plan.Plan`) → the query (:mod:`~ctiflow.jobs.driver.pipeline`),
    ctiflow's files beside Spark's checkpoint, progress lines, metrics, rules, ``ctiflow submit``.
:mod:`~ctiflow.jobs.core` — what a key group runs, without Spark or Kafka: the plan the driver
    hands the executors, the runtime (time layer → reference join → operators), broadcast
    state, the wire rows, the counters.
:mod:`~ctiflow.jobs.state` — a key group's state between micro-batches (chunks, parts, header,
    the formats earlier versions wrote).
:mod:`~ctiflow.jobs.avro` — the Avro codec, one each way: bulk decode to columns, bulk encode.
:mod:`~ctiflow.jobs.datapath` — a micro-batch through Spark and Kafka: the source (offset ranges
    → records → typed columns), the adapter (``transformWithStateInPandas``), the sink
    (Kafka, exactly once), the Kafka clients and the job's own topics.
:mod:`~ctiflow.jobs.ops` — running and watching: the embedded stack, the demo, ``ctiflow status``,
    plots.
:mod:`~ctiflow.jobs.cli` (the command line), :mod:`~ctiflow.jobs.tools` (the docs' generated
parts), :mod:`~ctiflow.jobs.testing` (independent references; the data path never imports them).

Dependencies point one way — ``ops`` → ``driver`` → ``datapath`` → ``core`` / ``state`` →
``avro`` — and no room reaches a tool (``tests/test_architecture.py``).
"""
