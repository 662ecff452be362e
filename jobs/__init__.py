"""Spark and Kafka adapters for the pure operators (:mod:`ctiflow.operators`), in the order data flows.

Configuration, before Spark starts:
    :mod:`~ctiflow.jobs.config` (the one model) → :mod:`~ctiflow.jobs.check` / :mod:`~ctiflow.jobs.fields` /
    :mod:`~ctiflow.jobs.recognize` (every error at once) → :mod:`~ctiflow.jobs.pipeline` (the query)
A micro-batch, on executors:
    :mod:`~ctiflow.jobs.source` (offset ranges → records → typed columns, per key group) →
    :mod:`~ctiflow.jobs.avro` (strict bulk decode) → :mod:`~ctiflow.jobs.rows` (the wire format) →
    :mod:`~ctiflow.jobs.adapter` (transformWithStateInPandas) → :mod:`~ctiflow.jobs.runtime` (time layer →
    reference join → operators) with :mod:`~ctiflow.jobs.state` (the store) → :mod:`~ctiflow.jobs.avro`
    (bulk encode) → :mod:`~ctiflow.jobs.sink` (Kafka, exactly once)
Around it, on the driver:
    :mod:`~ctiflow.jobs.checkpoint` (ctiflow's files beside Spark's), :mod:`~ctiflow.jobs.counters` →
    :mod:`~ctiflow.jobs.progress` / :mod:`~ctiflow.jobs.metrics` / :mod:`~ctiflow.jobs.status`
Tools: :mod:`~ctiflow.jobs.kafka` (clients), :mod:`~ctiflow.jobs.stack` (embedded broker),
:mod:`~ctiflow.jobs.demo`, :mod:`~ctiflow.jobs.plot`, :mod:`~ctiflow.jobs.cli` (the command line),
:mod:`~ctiflow.jobs.testing` (independent references; the data path never imports them).
"""
