"""Pure-Python streaming operators: no Spark, no Kafka.

Every operator is a state machine with the same shape (see :mod:`ctiflow.operators.operator`):
construct from settings, ``process(event)``, ``advance_to(cti)``, ``snapshot()`` /
``restore()``. The Spark adapter in ``jobs/`` is written once against that shape.
"""
