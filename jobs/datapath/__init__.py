"""A micro-batch through Spark and Kafka, in the order data flows (the Avro codec each way is a
room of its own, :mod:`ctiflow.jobs.avro`, which the core uses too).

* :mod:`~ctiflow.jobs.datapath.source` — offset ranges planned on the driver; records read,
  decoded and checked on executors, per key group.
* :mod:`~ctiflow.jobs.datapath.adapter` — any pure operator inside ``transformWithStateInPandas``
  (through :mod:`ctiflow.jobs.core.runtime`).
* :mod:`~ctiflow.jobs.datapath.sink` — result topics, exactly once.
* :mod:`~ctiflow.jobs.datapath.kafka` — the Kafka clients, configured in one place;
  :mod:`~ctiflow.jobs.datapath.librdkafka` what librdkafka says of its properties.
* :mod:`~ctiflow.jobs.datapath.own_topics` — the topics ctiflow writes for itself and reads back.
* :mod:`~ctiflow.jobs.datapath.spark_daemon` — Python workers forked with the data path imported.
"""
