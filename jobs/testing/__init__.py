"""Independent references, shipped with the package: an oracle that computes a job's results the
slow, obvious way and must not reuse the code it checks (:mod:`ctiflow.jobs.testing.oracle`), the replay
of Flink CEP's recorded test cases through the public Pattern API (:mod:`ctiflow.jobs.testing.conformance`),
and a seeded workload generator (:mod:`ctiflow.jobs.testing.workload`). Tests, benchmarks, the demo and
the CLI use them; the data path never does.
"""
