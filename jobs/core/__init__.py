"""What one key group runs, without Spark or Kafka (the executors import this room; no
pydantic, no pyspark, no configuration model: ``tests/test_architecture.py``).

* :mod:`~ctiflow.jobs.core.plan` — the plan the driver builds and every executor reads (plain
  picklable values).
* :mod:`~ctiflow.jobs.core.runtime` — a key group's micro-batch: time layer → [reference join] →
  operators, with its state in :mod:`ctiflow.jobs.state`.
* :mod:`~ctiflow.jobs.core.broadcast` — broadcast state: side inputs every key group reads whole.
* :mod:`~ctiflow.jobs.core.definitions`, :mod:`~ctiflow.jobs.core.text_forms` — match definitions
  (patterns, SQL) as both sides read them (executors compile rule definitions).
* :mod:`~ctiflow.jobs.core.rows` — the wire format: the rows Spark moves between source, adapter
  and sink.
* :mod:`~ctiflow.jobs.core.counters` — the one table of what a job counts.
* :mod:`~ctiflow.jobs.core.secrets` — which Kafka client settings are secrets.
* :mod:`~ctiflow.jobs.core.alloc` — the cyclic collector paused around allocation-heavy work.
"""
