"""The driver: a job file checked and planned before Spark starts, and the query around it.

* :mod:`~ctiflow.jobs.driver.config` — the one configuration model (CLI, jobs, docker-compose).
* :mod:`~ctiflow.jobs.driver.check`, :mod:`~ctiflow.jobs.driver.fields`,
  :mod:`~ctiflow.jobs.driver.recognize` — every error a job file has, at once; the record
  schemas match operators derive.
* :mod:`~ctiflow.jobs.driver.planner` — the one planner: configuration →
  :class:`~ctiflow.jobs.core.plan.Plan`.
* :mod:`~ctiflow.jobs.driver.pipeline` — the Spark session and the query; :mod:`~ctiflow.jobs.driver.jvm`
  and :mod:`~ctiflow.jobs.driver.masters` the JVM and the cluster it talks to.
* :mod:`~ctiflow.jobs.driver.checkpoint` — ctiflow's files beside Spark's checkpoint, the
  progress topic read back; :mod:`~ctiflow.jobs.driver.progress` — progress for people;
  :mod:`~ctiflow.jobs.driver.metrics` — the running job's Prometheus metrics.
* :mod:`~ctiflow.jobs.driver.rules` — the rules topic for ``ctiflow rules``;
  :mod:`~ctiflow.jobs.driver.rule_trial` — ``ctiflow rules test``, a rule tried on history.
* :mod:`~ctiflow.jobs.driver.submit` — ``ctiflow submit``: a job on a user's cluster.
"""
