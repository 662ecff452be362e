"""The one generic Spark adapter: any pure operator inside ``transformWithStateInPandas``.

Why it is fast enough: rows are grouped by **key group** (``crc32(key) mod G``, computed in the
source and carried as a label that Spark's partitioner spreads evenly, see
:func:`ctiflow.jobs.driver.checkpoint.group_labels`), not by entity key. Spark calls the processor
once per group per micro-batch with all
of the group's rows. The spike measured that per-key state calls, not RocksDB, dominate a keyed
Python operator, so state is stored per group, not per key: the group-wide part (time layer,
reorder buffer, CTI clocks, reference join, chunk index) is one value (the "header"; a large
one in parts: :meth:`OperatorProcessor._store`), and the operators' keyed state is in chunks of
about ``state.chunk_keys`` keys, of which a batch reads and writes only those it touches
(:class:`ctiflow.jobs.core.runtime.GroupRuntime`); both live in the group's one ``MapState``
(:class:`ctiflow.jobs.state.store.GroupState`). Chunks this worker committed and still holds decoded are
used without a read (:class:`ctiflow.jobs.state.warm.WarmChunks`).

**Packed rows.** Spark's per-row costs (shuffle, Arrow to and from the Python worker, the
sink's hand-off) are paid per *row*, ours per event; so the source ships one row per key group
of each Kafka fetch (``meta_pack``: the group's decoded, validated records as Arrow columns)
plus one row per failed record, and the adapter answers with one row per result topic
(``kind = "pack"``: ``(key, value, role)`` columns, Avro-encoded, ≤ :data:`PACK_SIZE`), which
the sink unpacks. A micro-batch of 100k events is a few dozen rows for Spark. The rows and
the packs' layout: :mod:`ctiflow.jobs.core.rows`.

Contract (PySpark's ``StatefulProcessor``): the processor object is pickled on the driver and
``init`` runs on an executor's Python worker, so it holds only the picklable :class:`Plan`; all
operators are built in the worker. Records passed on unchanged keep their Avro bytes.

**CTIs** are ours, not Spark's watermark (one global ``max − delay`` that declares a slower
partition's in-order events late): every key group gets, each micro-batch, a frontier row per
offset range read and a control row per stream (:mod:`ctiflow.jobs.datapath.source.reader`), so every
group computes
the same per-partition CTI (:meth:`GroupRuntime.next_cti`) and keeps it in its state — in the
checkpoint, so a replayed batch sees the same CTI. A micro-batch's events are checked against
the CTI the previous batch ended with; the batch then ends by advancing to its own CTI (or to
+∞ once every stream of a bounded input has ended). No timers: the control rows call every
group every batch.
"""

from __future__ import annotations

import json

import time
from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from ctiflow.jobs.core import rows
from ctiflow.jobs.core.alloc import cyclic_gc_paused
from ctiflow.jobs.core.counters import Counters
from ctiflow.jobs.core.plan import Plan
from ctiflow.jobs.core.runtime import GroupRuntime, open_group, seal_group
from ctiflow.jobs.datapath import group_host
from ctiflow.jobs.avro.serde import AvroSerializer, registry_client
from ctiflow.jobs.state.store import LAYOUTS, STATE_LAYOUT
from ctiflow.jobs.state.warm import WARM

#: The adapter's output rows as Spark types: :data:`ctiflow.jobs.core.rows.OUTPUT_DDL` (the sink reads that).
OUTPUT_SCHEMA = StructType([
    StructField("topic", StringType()), StructField("key", BinaryType()),
    StructField("value", BinaryType()), StructField("kind", StringType()),
])


def _field_decoder(options: dict[str, str]):
    """``list of Avro bytes → field columns`` (an Arrow table) with the source's own decoder,
    built on first use (:class:`ctiflow.jobs.core.rows.BytesFields`)."""
    decoder = None

    def decode(values: list) -> "pa.Table":
        nonlocal decoder
        if decoder is None:
            from ctiflow.jobs.datapath.source.decoder import RecordDecoder

            decoder = RecordDecoder(options, None)
        got = decoder.decoded(values)
        if got.errors:
            raise RuntimeError("records the source decoded fail to decode again: "
                               f"{list(got.errors.values())[:3]} (a bug in ctiflow)")
        return got.fields

    return decode


def _count_forwarding(frame: pd.DataFrame, call_us: int) -> None:
    """A hosted call's output ``frame`` (:func:`~ctiflow.jobs.core.rows.output_frame`: its metrics row
    last) with ``forward_us``: the worker's ``call_us`` beyond the host's ``python_us``."""
    at = (len(frame) - 1, frame.columns.get_loc("value"))
    metrics = json.loads(frame.iat[at])
    metrics["forward_us"] = max(0, call_us - metrics["python_us"])
    frame.iat[at] = json.dumps(metrics).encode()


class OperatorProcessor(StatefulProcessor):
    def __init__(self, plan: Plan, topic_schemas: dict[str, str], framing: str, registry: dict | None,
                 sources: dict[str, dict[str, str]] | None = None, state_layout: int = STATE_LAYOUT):
        if state_layout not in LAYOUTS:
            raise ValueError(f"state layout {state_layout}: this ctiflow reads {sorted(LAYOUTS)}")
        self.plan = plan
        self.state_layout = state_layout     # the checkpoint's (ctiflow.jobs.driver.checkpoint.state_layout)
        self.topic_schemas = topic_schemas   # topic → schema name
        self.framing = framing
        self.registry = registry
        self.sources = sources or {}         # stream → its source's options
                                             # (ctiflow.jobs.datapath.source.options.SourceOptions)
        labels = [json.loads(o["group_labels"]) for o in self.sources.values() if o.get("group_labels")]
        #: the key group that counts the side inputs' records and writes the dead letters of those
        #: refused (every group judges them alike: :mod:`ctiflow.jobs.core.broadcast`)
        self.reporting_group = min(labels[0]) if labels else 0

    #: what the processor is before ``init``: all Spark pickles, and all a key group's host receives
    FIELDS = ("plan", "state_layout", "topic_schemas", "framing", "registry", "sources", "reporting_group")

    def __getstate__(self) -> dict:
        return {name: vars(self)[name] for name in self.FIELDS}

    # -- lifecycle -------------------------------------------------------------------
    def init(self, handle: StatefulProcessorHandle) -> None:
        #: where the key groups' calls run: their hosts (:mod:`~ctiflow.jobs.datapath.group_host`),
        #: this processor as they receive it; None: here (no host server, or no keyed state for a
        #: host to keep decoded: the call's rows would travel there and back for nothing)
        hosts = group_host.SERVER is not None and self.plan.keeps_keys
        self.hosted = group_host.shipped(self) if hosts else None
        if self.hosted is not None:
            handle = group_host.RecordingHandle(handle)  # (a host's state calls reach its variables)
        self.handle = handle
        #: sends a host's queued state writes to the store (:func:`group_host.writes_sender`)
        self.send_writes = group_host.writes_sender(handle)
        self.group = LAYOUTS[self.state_layout](handle)
        reg = registry_client(self.registry["url"], self.registry.get("config")) if self.registry else None
        store = self.plan.schema_store()  # an executor's store has only the files: the derived ones besides
        self.encoders = {topic: AvroSerializer(schema, store=store, framing=self.framing, registry=reg,
                                               subject=f"{topic}-value")
                         for topic, schema in self.topic_schemas.items()}
        self.results = rows.ResultEncoder(self.encoders, self.plan.late_topic, self.plan.dead_letter_topic)
        for stream, options in self.sources.items():  # packs that carry only bytes decode with these
            rows.FIELD_DECODERS[stream] = _field_decoder(options)

    def close(self) -> None:
        pass

    # -- the two entry points --------------------------------------------------------
    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        try:
            group, reports = key[0], key[0] == self.reporting_group
            if self.hosted is not None:
                started = time.perf_counter()
                out = group_host.run(group_host.SERVER, *self.hosted, group, list(rows), reports, self.handle)
                _count_forwarding(out[-1], int((time.perf_counter() - started) * 1e6))
            else:
                with cyclic_gc_paused():  # (see ctiflow.jobs.core.alloc) the output is one small frame
                    out = list(self._batch(rows, reports))
            yield from out
        except Exception as exc:
            # A bug (data faults were dead-lettered already): the micro-batch fails, and says where.
            exc.add_note(f"ctiflow: key group {key[0]!r} failed on a bug, not on bad data (bad data is "
                         "dead-lettered); the micro-batch is replayed from the checkpoint once it is fixed")
            raise

    def _batch(self, frames: Iterator[pd.DataFrame], reports: bool = True) -> Iterator[pd.DataFrame]:
        """Load the group's state → :meth:`GroupRuntime.run_batch` → store it → encode."""
        frames = list(frames)  # (Spark's Arrow batches arrive as this is iterated)
        started = time.perf_counter()
        stored, runtime = self._load()
        runtime.shared.reports = reports
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        got = runtime.run_batch(rows.read_input(frame))
        self._store(stored, runtime)
        yield from self._encode(got.outputs, got.dead, got.counters, started)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        return iter(())  # no timers: every group gets control rows every micro-batch

    # -- internals -------------------------------------------------------------------
    def _load(self) -> tuple[bytes | None, GroupRuntime]:
        """→ the stored header value and the group's runtime, from the header's bytes
        (:meth:`GroupState.read`, :func:`~ctiflow.jobs.core.runtime.open_group`)."""
        self.group.clock.take()  # (what a failed call before spent is not this call's)
        stored, header = self.group.read()  # (None, None) before the group's first batch
        chunks = self.group.chunks
        return stored, open_group(self.plan, stored, header, chunks, WARM, read_all=chunks.read_all)

    def _store(self, stored: bytes | None, runtime: GroupRuntime) -> None:
        """Commit ``runtime`` (:func:`~ctiflow.jobs.core.runtime.seal_group`). A header of more than
        :data:`ctiflow.jobs.core.rows.PACK_BYTES` (a long reorder buffer) is stored in parts of that size
        (:meth:`GroupState.write`): one large value is several G1 "humongous" copies in the state
        server's JVM each write and read (measured: docs/changelog.md#memory)."""
        self.group.write(stored, *seal_group(runtime, WARM))
        started = self.group.clock.now()
        self.send_writes()  # (in a host: the call's writes, queued, reach the store inside its store_us)
        self.group.clock.add(started)

    def _encode(self, out: list, dead: list, counters: Counters,
                started: float | None = None) -> Iterator[pd.DataFrame]:
        """Result records, Avro-encoded (:class:`ctiflow.jobs.core.rows.ResultEncoder`) and packed per
        topic (:func:`ctiflow.jobs.core.rows.output_frame`, ≤ :data:`~ctiflow.jobs.core.rows.PACK_SIZE`
        each) in output order, then one metrics row: like the input, few rows for Spark to move.
        ``started``: the call's ``perf_counter`` at its start (→ ``python_us``)."""
        packs = self.results.packs(out, dead, counters)
        counters.store_us = self.group.clock.take()
        if started is not None:
            counters.python_us = int((time.perf_counter() - started) * 1e6)
        yield rows.output_frame(packs.order, counters.metrics())
