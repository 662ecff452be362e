"""Running and watching jobs.

* :mod:`~ctiflow.jobs.ops.stack` — the embedded stack (a local Kafka-protocol broker).
* :mod:`~ctiflow.jobs.ops.demo` — the README's first command, end to end.
* :mod:`~ctiflow.jobs.ops.status` — ``ctiflow status``: the running jobs of a stack, from their
  metrics (:mod:`ctiflow.jobs.driver.metrics`).
* :mod:`~ctiflow.jobs.ops.plot` — PNG renderings of count and bin records.
"""
