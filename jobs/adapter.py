"""The one generic Spark adapter: any pure operator inside ``transformWithState`` (Row API).

Why it is fast enough: rows are grouped by **key group** (``crc32(key) mod G``, computed in the
source), not by entity key. Spark calls the processor once per group per micro-batch with all
of the group's rows; the group's whole state (time layer, reorder buffer, every key's operator
state) is **one** ``ValueState`` blob. The spike measured that per-key state calls, not RocksDB,
dominate a keyed Python operator; with G groups a batch costs G state reads and writes.

Contract (PySpark's ``StatefulProcessor``): the processor object is pickled on the driver and
``init`` runs on an executor's Python worker, so it holds only the picklable :class:`Plan`; all
operators are built in the worker. ``handleInputRows`` receives the group's rows (``Row``s keep
exact Python types; pandas would turn nullable longs into floats) and the watermark (our CTI) in ``timerValues``; ``handleExpiredTimer`` advances a group
that had no rows when the watermark moved. Outputs are already Avro-encoded:
``(topic, key, value, kind)`` rows for the Kafka sink.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from jobs.runtime import Counters, GroupRuntime, Plan
from operators.time import CTI_INFINITY, CTI_NONE, Event

OUTPUT_SCHEMA = StructType([
    StructField("topic", StringType()), StructField("key", BinaryType()),
    StructField("value", BinaryType()), StructField("kind", StringType()),
])
_STATE = StructType([StructField("blob", BinaryType())])


def dead_letter_record(row: dict) -> dict:
    error = row["meta_error"] or "unknown error"
    return {"source_topic": row.get("meta_topic") or row["meta_stream"], "partition": int(row["meta_partition"]),
            "offset": int(row["meta_offset"]), "key": row.get("meta_raw_key"), "value": row.get("meta_raw"),
            "error": error, "stage": error.split(":", 1)[0],
            "kafka_timestamp": row.get("meta_kafka_ts")}


def _cti(timerValues) -> int:
    wm = timerValues.getCurrentWatermarkInMs()
    return wm if wm > 0 else CTI_NONE


class OperatorProcessor(StatefulProcessor):
    def __init__(self, plan: Plan, topics: dict[str, str], framing: str, registry: dict | None,
                 topic_names: dict[str, str]):
        self.plan = plan
        self.topic_schemas = topics          # topic → schema name
        self.framing = framing
        self.registry = registry
        self.topic_names = topic_names       # stream → source topic (for dead letters)

    # -- lifecycle -------------------------------------------------------------------
    def init(self, handle: StatefulProcessorHandle) -> None:
        from jobs.serde import AvroSerializer, registry_client

        self.handle = handle
        self.state = handle.getValueState("group", _STATE)
        reg = registry_client(self.registry["url"], self.registry.get("config")) if self.registry else None
        self.encoders = {topic: AvroSerializer(schema, framing=self.framing, registry=reg,
                                               subject=f"{topic}-value", validate=False)
                         for topic, schema in self.topic_schemas.items()}
        self.meta_cols = None

    def close(self) -> None:
        pass

    # -- the two entry points --------------------------------------------------------
    def handleInputRows(self, key, rows: Iterator[Row], timerValues) -> Iterator[Row]:
        runtime = self._load()
        # The watermark is the CTI inserted at this micro-batch's start: apply it first, so the
        # batch's events are checked against it (late) and released by a later CTI.
        out: list = runtime.advance(_cti(timerValues))
        dead: list[dict] = []
        flush = False
        fields = self.plan.fields
        for row in rows:
            row = row.asDict()
            if row["meta_flush"]:
                flush = True
                continue
            if row["meta_error"] is not None:
                runtime.dead_letter()
                row["meta_topic"] = self.topic_names.get(row["meta_stream"])
                dead.append(dead_letter_record(row))
                continue
            stream = row["meta_stream"]
            names = fields.get(stream)
            rec = {n: row[n] for n in names} if names else {k: v for k, v in row.items() if not k.startswith("meta_")}
            out.extend(runtime.offer(Event(key=row["meta_key"], start=row["meta_start"], end=row["meta_end"],
                                           fields=rec, partition=row["meta_partition"], offset=row["meta_offset"],
                                           stream=stream)))
        if flush:
            out.extend(runtime.advance(CTI_INFINITY))
        yield from self._finish(runtime, timerValues, out, dead)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        runtime = self._load()
        yield from self._finish(runtime, timerValues, runtime.advance(_cti(timerValues)), [])

    # -- internals -------------------------------------------------------------------
    def _load(self) -> GroupRuntime:
        if self.state.exists():
            return GroupRuntime(self.plan, self.state.get()[0])
        return GroupRuntime(self.plan)

    def _finish(self, runtime: GroupRuntime, timerValues, out: list, dead: list):
        wm = timerValues.getCurrentWatermarkInMs()
        self.state.update((runtime.snapshot(),))
        # Wake this group when the watermark moves even if no rows arrive for it: time-driven
        # output (final bins, timeouts, time-window counts) must not wait for the next event.
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        if runtime.cti < CTI_INFINITY:
            self.handle.registerTimer(max(wm, 0) + 1)
        yield from self._encode(out, dead, runtime.counters)

    def _encode(self, out: list, dead: list, counters: Counters) -> Iterator[Row]:
        enc = self.encoders
        for topic, o, k in out:
            yield Row(topic=topic, key=None if k is None else str(k).encode(), value=enc[topic](o.record), kind=o.role)
        dlq = self.plan.dead_letter_topic
        for rec in dead:
            yield Row(topic=dlq, key=rec["key"], value=enc[dlq](rec), kind="dead_letter")
        yield Row(topic=None, key=None, value=json.dumps(vars(counters)).encode(), kind="metrics")
