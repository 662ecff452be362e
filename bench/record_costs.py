"""Where a record's time goes in the adapter, stage by stage, in one process (no Spark).

Each stage runs the code the job runs, on the same records, and is timed alone:

* **Avro decode** — :meth:`ctiflow.jobs.datapath.source.decoder.RecordDecoder.decoded` (bulk decode + validation on the
  columns), one call per fetch of :data:`FETCH` records as the source makes them;
* **packs** — :func:`ctiflow.jobs.core.rows.pack_columns` per key group → bytes → :func:`ctiflow.jobs.core.rows.unpack_columns`
  (source worker → stateful worker; Arrow columns, then the NumPy columns the time layer takes);
* **time layer + operator** — :meth:`ctiflow.jobs.core.runtime.GroupRuntime.run_batch`,
  one runtime per key group and micro-batch, as the adapter drives it; of that,
* **result columns** — the operator's record-building method (bins ``Binner._build``, count
  ``CountOperator._emit_touched``: :class:`~ctiflow.operators.events.OutputBatch` columns), timed by
  wrapping it;
* **state round trip** — ``GroupRuntime`` load from header + chunks and ``commit()``;
* **Avro encode** — :class:`ctiflow.jobs.core.rows.ResultEncoder` as the adapter calls it (bulk for
  the operators' column batches, one :class:`ctiflow.jobs.avro.serde.AvroSerializer` call per other result);
* **result packs** — the ``(key, value, role)`` packs as Arrow IPC (:func:`ctiflow.jobs.core.rows.output_frame`)
  and read back in the sink;
* **Kafka produce** — one ``Producer.produce`` call per result, with the sink's headers, to the
  broker, then ``flush`` (only with a broker).

Figures are µs per *input* event (a stage that runs per result is multiplied out), so they add
up to the adapter's Python time per event.
"""

from __future__ import annotations

from ctiflow.jobs.driver.planner import plan_job

import time
import zlib
from collections import defaultdict
from contextlib import contextmanager, nullcontext

BATCH = 100_000
#: Records per Kafka fetch (what one ``consume`` call returns at most: ``ctiflow.jobs.datapath.kafka.read_range``).
FETCH = 10_000


@contextmanager
def timed(cls, name: str, into: list[float]):
    """Wrap ``cls.name`` so its calls' time is added to ``into[0]``."""
    original = getattr(cls, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[0] += time.perf_counter() - t

    setattr(cls, name, wrapper)
    try:
        yield
    finally:
        setattr(cls, name, original)


def measure(job: dict, records: list[dict], *, batch: int = BATCH, bootstrap: str | None = None,
            gc_paused: bool = True) -> dict:
    """µs per input event of each stage (module docstring) for ``job`` (a job spec with one
    source and its operators) over ``records`` (the source's records, in arrival order).
    ``gc_paused``: as the job runs (:mod:`ctiflow.jobs.core.alloc`); ``False`` shows what that saves."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.core.alloc import cyclic_gc_paused
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.pipeline import source_options
    import numpy as np
    import pyarrow as pa

    from ctiflow.jobs.core.rows import ResultEncoder
    from ctiflow.jobs.core.rows import Control, GroupInput, output_frame, output_records, pack_columns, unpack_columns
    from ctiflow.jobs.core.counters import Counters
    from ctiflow.jobs.core.runtime import GroupRuntime
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath.sink import H_BATCH, H_QUERY, H_SEQ, H_TASK
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder
    from ctiflow.operators.bins import Binner
    from ctiflow.operators.columns import EventColumns
    from ctiflow.operators.count import CountOperator

    cfg = parse({**job, "kafka": {"bootstrap_servers": bootstrap or "127.0.0.1:9"}})
    src = cfg.sources[0]
    plan = plan_job(cfg)
    groups = cfg.key_groups
    opts = source_options(cfg, src, False, list(range(groups)))
    decoder = RecordDecoder(opts)
    payloads = [AvroSerializer(src.schema_name)(r) for r in records]
    store = plan.schema_store()  # (one copy of the store for every result topic)
    encoders = ResultEncoder({t: AvroSerializer(s, store=store)
                              for t, s in cfg.result_topics().items()},
                             plan.late_topic, plan.dead_letter_topic)  # as the adapter
    t: dict[str, float] = defaultdict(float)
    built = [0.0]
    n = len(payloads)
    results = 0
    headers_of: dict[int, bytes] = {}
    chunks: dict[int, dict] = {g: {} for g in range(groups)}
    prod = kafka.producer(bootstrap) if bootstrap else None
    parts: dict[str, int] = {}
    if prod is not None:
        kafka.create_topics(bootstrap, {topic: 3 for topic in cfg.result_topics()})
        parts = {topic: len(kafka.topic_partitions(bootstrap, topic)) for topic in cfg.result_topics()}
    with timed(Binner, "_build", built), timed(CountOperator, "_emit_touched", built), \
            (cyclic_gc_paused() if gc_paused else nullcontext()):
        for lo in range(0, n, batch):
            chunk = payloads[lo:lo + batch]
            c0 = time.perf_counter()
            fetches = [(f, decoder.decoded(chunk[f:f + FETCH])) for f in range(0, len(chunk), FETCH)]
            t["Avro decode + validate"] += time.perf_counter() - c0
            c0 = time.perf_counter()
            blobs: dict[int, list[bytes]] = defaultdict(list)
            top: dict[int, int] = {}
            for f, got in fetches:
                group = decoder._group_of(got.keys)
                for g in np.unique(group):
                    sel = np.nonzero(group == g)[0]
                    take = pa.array(sel)
                    blobs[int(g)].append(pack_columns(got.fields.take(take), got.keys.take(take), got.starts[sel],
                                                      got.ends[sel], got.index[sel] + lo + f,
                                                      pa.nulls(len(sel), pa.binary())))
                    top[int(g)] = max(top.get(int(g), 0), int(got.starts[sel].max()))
            events = {g: EventColumns.concat([unpack_columns(b, src.name, 0) for b in bs]) for g, bs in blobs.items()}
            t["packs (source → stateful worker)"] += time.perf_counter() - c0
            flush = lo + batch >= n
            for g in range(groups):
                c0 = time.perf_counter()
                runtime = GroupRuntime(plan, header=headers_of.get(g), chunks=chunks[g], batched=True)
                t["state round trip (load + commit)"] += time.perf_counter() - c0
                c0 = time.perf_counter()
                got = GroupInput([events[g]] if g in events else [], [(src.name, 0, top[g])] if g in top else [],
                                 [(src.name, Control([0], [], flush))], [])
                out = runtime.run_batch(got).outputs
                t["time layer + operator"] += time.perf_counter() - c0
                c0 = time.perf_counter()
                headers_of[g] = runtime.commit()
                t["state round trip (load + commit)"] += time.perf_counter() - c0
                c0 = time.perf_counter()
                packs = encoders.packs(out, [], Counters())
                t["Avro encode"] += time.perf_counter() - c0
                c0 = time.perf_counter()
                frame = output_frame(packs.order, {})
                unpacked = list(output_records([pa.RecordBatch.from_pandas(frame)], {}))
                t["result packs (Arrow IPC, read in the sink)"] += time.perf_counter() - c0
                results += len(unpacked)
                if prod is not None:
                    c0 = time.perf_counter()
                    hq, hb, ht = b"bench", str(lo).encode(), str(g).encode()
                    seq = 0
                    for topic, k, v in unpacked:
                        prod.produce(topic, v, k, partition=zlib.crc32(k or v) % parts[topic],
                                     headers=[(H_QUERY, hq), (H_BATCH, hb), (H_TASK, ht), (H_SEQ, str(seq).encode())])
                        seq += 1
                        if seq % 10000 == 0:
                            prod.poll(0)
                    t["Kafka produce (one call a result) + flush"] += time.perf_counter() - c0
        if prod is not None:
            c0 = time.perf_counter()
            prod.flush(60)
            t["Kafka produce (one call a result) + flush"] += time.perf_counter() - c0
    t["  of which: result columns (operator builds records)"] = built[0]
    return {"events": n, "results": results, "us_per_event": {k: v / n * 1e6 for k, v in t.items()}}

