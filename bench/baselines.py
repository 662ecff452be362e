"""What a Spark user writes without ctiflow, for the benchmarks' baselines only (``ctiflow bench
peers`` and the plumbing ladder): not part of the product, which reads packed rows and writes
exactly once.

* ``ctiflow_kafka_typed`` — ctiflow's Kafka source, but one typed row per record (the record's
  fields as columns, then the ``meta_`` columns; bad records as rows with ``meta_error``), for
  plain Spark SQL over the topic;
* ``ctiflow_kafka_batch_sink`` — ctiflow's sink with batch writes, for ``foreachBatch``: how a
  query in ``update`` mode reaches Kafka (Spark offers Python stream writers ``append`` mode
  only). **At-least-once**: replay markers identify a record by its position in the task's
  output, which only the adapter's sorted output keeps the same on a replay; an arbitrary
  query's rows (a shuffled aggregation) have no such order, so ``markers`` is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter

from ctiflow.jobs.core import rows
from ctiflow.jobs.avro.serde import default_store
from ctiflow.jobs.datapath.kafka import message_offsets
from ctiflow.jobs.datapath.sink import KafkaSink, KafkaStreamWriter, SinkCommit, SinkOptions
from ctiflow.jobs.datapath.source.decoder import Decoded, RecordDecoder, record_fields
from ctiflow.jobs.datapath.source.options import SourceOptions
from ctiflow.jobs.datapath.source.reader import KafkaSource, KafkaStreamReader


def typed_schema(avro_schema: dict) -> pa.Schema:
    """One row per record: its fields as typed columns (nested values as JSON strings), then the
    input rows' ``meta_`` columns (no pack)."""
    return pa.schema(record_fields(avro_schema) + [pa.field(n, t) for n, t in rows.META_FIELDS])


class TypedRecordDecoder(RecordDecoder):
    """A fetch as one typed row per record, good and bad in offset order (no packs, no control
    or frontier rows: a stateless query needs neither)."""

    def rows(self, msgs, values: list, got: Decoded) -> pa.RecordBatch:
        n_good = got.fields.num_rows
        offsets = message_offsets(msgs)
        kafka_ts = [m.timestamp()[1] for m in msgs]
        partitions = [m.partition() for m in msgs]
        good_cols = {name: got.fields.column(name) for name in got.fields.column_names}
        index = got.index
        good_cols.update(
            meta_stream=pa.array([self.stream] * n_good, pa.string()), meta_key=got.keys,
            meta_start=pa.array(got.starts, pa.int64()), meta_end=pa.array(got.ends, pa.int64()),
            meta_group=pa.array(self._group_of(got.keys), pa.int32()),
            meta_partition=pa.array([partitions[i] for i in index], pa.int32()),
            meta_offset=pa.array(offsets[index], pa.int64()),
            meta_kafka_ts=pa.array([kafka_ts[i] for i in index], pa.int64()),
            meta_value=pa.array([values[i] for i in index], pa.binary()))
        good = pa.table({name: good_cols.get(name, pa.nulls(n_good, self.arrow.field(name).type))
                         for name in self.arrow.names}, schema=self.arrow)
        dead_index = sorted(got.errors)
        groups = self.groups
        dead = pa.table({
            "meta_stream": [self.stream] * len(dead_index),
            "meta_group": [self.labels[partitions[i] % groups] for i in dead_index],
            "meta_partition": [partitions[i] for i in dead_index], "meta_offset": [int(offsets[i]) for i in dead_index],
            "meta_kafka_ts": [kafka_ts[i] for i in dead_index], "meta_error": [got.errors[i] for i in dead_index],
            "meta_value": [values[i] for i in dead_index], "meta_raw_key": [msgs[i].key() for i in dead_index],
        })
        dead = pa.table({name: dead.column(name) if name in dead.column_names else pa.nulls(len(dead_index), f.type)
                         for name, f in zip(self.arrow.names, self.arrow)}, schema=self.arrow)
        both = pa.concat_tables([good, dead])
        order = np.argsort(np.concatenate([index, np.array(dead_index, np.int64)]), kind="stable")
        return both.take(order).combine_chunks().to_batches()[0] if both.num_rows else pa.RecordBatch.from_pylist([], schema=self.arrow)



class TypedKafkaStreamReader(KafkaStreamReader):
    decoder_class = TypedRecordDecoder


class TypedKafkaSource(KafkaSource):
    """``spark.readStream.format("ctiflow_kafka_typed").options(**SourceOptions(...).to_options())``."""

    @classmethod
    def name(cls) -> str:
        return "ctiflow_kafka_typed"

    def _arrow(self) -> pa.Schema:
        opts = SourceOptions.from_options(self.options)
        return typed_schema(json.loads(default_store().get(opts.schema).text))

    def streamReader(self, schema) -> TypedKafkaStreamReader:
        return TypedKafkaStreamReader(SourceOptions.from_options(self.options), self._arrow())


class KafkaBatchWriter(DataSourceArrowWriter):
    """The stream writer's ``write`` for a batch job started inside ``foreachBatch`` (the
    micro-batch's query and batch ids are the task's local properties there too); at-least-once."""

    def __init__(self, options: SinkOptions):
        if options.markers:
            raise ValueError("ctiflow_kafka_batch_sink: batch writes (foreachBatch) are at-least-once and take no "
                             "markers; drop the option (exactly-once needs the streaming writer)")
        self.stream = KafkaStreamWriter(options)

    def write(self, iterator: Iterator) -> SinkCommit:
        return self.stream.write(iterator)

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


class BatchKafkaSink(KafkaSink):
    """``batch.write.format("ctiflow_kafka_batch_sink")`` inside ``foreachBatch``."""

    @classmethod
    def name(cls) -> str:
        return "ctiflow_kafka_batch_sink"

    def writer(self, schema, overwrite: bool) -> KafkaBatchWriter:
        return KafkaBatchWriter(SinkOptions.from_options(self.options))


def register(spark) -> None:
    """The baselines' source and sink in ``spark`` (beside ctiflow's own)."""
    spark.dataSource.register(TypedKafkaSource)
    spark.dataSource.register(BatchKafkaSink)
