"""``ctiflow bench latency``: end-to-end latency under a steady load, per operator and trigger.

For each job (the identity operator; a per-key count of the last hour, one record per touched
key per CTI) and each trigger interval:

1. the job's maximum: a bounded run over a backlog of transactions, 100k a micro-batch (events/s
   after the first batch, same session);
2. a producer thread sends transactions at **half that rate** for ``seconds``, event time = the
   wall clock at produce time, to a 3-partition topic, while the job runs with that trigger (a
   micro-batch may read three trigger intervals' worth: ``max_offsets_per_trigger``);
3. afterwards both topics are read back: an input record's produce time is its Kafka
   timestamp, a result's arrival its Kafka timestamp (the sink's produce). Identity: latency of
   each record (matched by ``id``). Count: for each event, the first count record of its key
   whose time (the CTI − 1) reaches the event's time.

A result can only leave once the CTI has passed its event, so at least ``cti.delay`` of wall
time: the table shows p50/p99 as measured and net of that delay. Events produced in the last
``delay + 2 triggers`` of the run are left out (no CTI passes them before the job stops).
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
import zlib

from rich.console import Console
from rich.table import Table

DELAY_MS = 1000
TRIGGERS = ("1s", "5s")
ACCOUNTS = 1000


def _transaction(i: int, now_ms: int) -> dict:
    return {"id": str(i), "account": f"acct-{i % ACCOUNTS:04d}", "event_time": now_ms, "type": "purchase",
            "amount": float((i * 7919) % 60), "currency": "EUR", "country": "DE", "merchant": None}


def _job(kind: str, topic: str, out_topic: str, trigger: str, limit: int | None) -> dict:
    source = {"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account",
              "time_field": "event_time", "cti": {"delay": f"{DELAY_MS}ms"}}
    if limit:
        source["max_offsets_per_trigger"] = limit
    if kind == "identity":
        op = {"kind": "passthrough", "output": out_topic}
    else:
        op = {"kind": "count", "name": "hot", "window": {"time": "1h"}, "epsilon": 0.01, "per_key": True,
              "predicate": "amount > 30", "emit": "per_cti", "output": out_topic}
    return {"job": f"latency-{kind}", "sources": [source], "operators": [op],
            "spark": {"key_groups": 8, "trigger": trigger}}


def _produce_steady(bootstrap: str, topic: str, rate: float, seconds: float, stop: threading.Event) -> int:
    """Transactions at ``rate`` a second for ``seconds`` (event time = now); → how many."""
    from ctiflow.jobs import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer

    def steady():
        start = time.monotonic()
        i = 0
        while not stop.is_set():
            elapsed = time.monotonic() - start
            if elapsed >= seconds:
                return
            due = int(elapsed * rate)
            now_ms = int(time.time() * 1000)
            while i < due:
                yield _transaction(i, now_ms)
                i += 1
            time.sleep(0.005)

    return kafka.produce(bootstrap, topic, steady(), AvroSerializer("transaction"), "account",
                         partition_of=lambda _, rec: zlib.crc32(rec["account"].encode()) % 3).sent


def _read(bootstrap: str, topic: str, schema: str) -> list[tuple[int, dict]]:
    """Every record of ``topic`` as ``(Kafka timestamp ms, decoded record)``."""
    from ctiflow.jobs import kafka
    from ctiflow.jobs.avro.serde import AvroDeserializer

    decode = AvroDeserializer(schema)
    cons = kafka.consumer(bootstrap, {}, **{"group.id": "bench-latency-read"})
    out = []
    try:
        for p in kafka.topic_partitions(bootstrap, topic):
            end = kafka.true_end_offset(cons, topic, p, 0, timeout=3.0)
            for msgs in kafka.read_range(cons, topic, p, 0, end):
                out.extend((m.timestamp, decode(m.value)) for m in msgs)
    finally:
        cons.close()
    return out


def _latencies(kind: str, inputs: list[tuple[int, dict]], outputs: list[tuple[int, dict]], cutoff: int) -> list[int]:
    if kind == "identity":
        produced = {rec["id"]: ts for ts, rec in inputs if ts <= cutoff}
        return [ts - produced[rec["id"]] for ts, rec in outputs if rec["id"] in produced]
    by_key: dict[str, list[tuple[int, int]]] = {}
    for ts, rec in outputs:
        by_key.setdefault(rec["key"], []).append((rec["time"], ts))
    times: dict[str, list[int]] = {}
    for key, records in by_key.items():
        records.sort()
        times[key] = [t for t, _ in records]
    got = []
    for ts, rec in inputs:
        mine = times.get(rec["account"])
        if ts > cutoff or mine is None:
            continue
        i = bisect.bisect_left(mine, rec["event_time"])  # the first count record that covers the event
        if i < len(mine):
            got.append(by_key[rec["account"]][i][1] - ts)
    return got


def _percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main(out: Console | None = None, *, seconds: float = 90.0, backlog: int = 500_000) -> list[dict]:
    from ctiflow.bench.spark_jobs import bench_stack, produce_transactions, run_job
    from ctiflow.jobs import kafka, pipeline
    from ctiflow.jobs.config import parse
    from ctiflow.operators.errors import CtiflowError

    out = out or Console(width=200)
    rows = []
    with bench_stack() as (bootstrap, spark, home):
        for kind in ("identity", "count"):
            produce_transactions(bootstrap, f"lat-max-{kind}", backlog, keys=ACCOUNTS, partitions=3)
            best = run_job(spark, _job(kind, f"lat-max-{kind}", f"lat-max-{kind}-out", "1s", 100_000), bootstrap,
                           home, f"lat-max-{kind}")
            if best.rate <= 0:  # the first batch is reported apart: one batch measures nothing
                raise CtiflowError(f"bench latency: the max-rate run read {backlog:,} events in {best.batches} "
                                   "micro-batch(es) of 100,000, too few to measure; use a backlog of 300,000 or more")
            rate = best.rate / 2
            for trigger in TRIGGERS:
                topic, out_topic = f"lat-{kind}-{trigger}", f"lat-{kind}-{trigger}-out"
                kafka.create_topics(bootstrap, {topic: 3})
                # A batch may read all that arrived in three trigger intervals: the default cap
                # (DEFAULT_BATCH_RECORDS, 200k) is below what a 5 s trigger brings at this rate,
                # and the job would fall behind by the difference every batch.
                cfg = _job(kind, topic, out_topic, trigger, int(3 * rate * int(trigger.rstrip("s"))))
                cfg = {**cfg, "kafka": {"bootstrap_servers": bootstrap},
                       "spark": {**cfg["spark"], "checkpoint": f"{home}/ck-{topic}"}}
                stop = threading.Event()
                sent: list[int] = []
                producer = threading.Thread(target=lambda: sent.append(
                    _produce_steady(bootstrap, topic, rate, seconds, stop)), daemon=True)
                started = int(time.time() * 1000)
                producer.start()
                try:
                    pipeline.run(parse(cfg, topic), until_end=False, spark=spark, timeout=seconds + 15)
                finally:
                    stop.set()
                    producer.join()
                trigger_ms = 1000 * int(trigger.rstrip("s"))
                cutoff = started + int(seconds * 1000) - DELAY_MS - 2 * trigger_ms
                inputs = _read(bootstrap, topic, "transaction")
                outputs = _read(bootstrap, out_topic, "transaction" if kind == "identity" else "count")
                lat = _latencies(kind, inputs, outputs, cutoff)
                rows.append({"operator": kind, "trigger": trigger, "max": best.rate, "rate": rate,
                             "sent": sent[0] if sent else 0, "measured": len(lat),
                             "p50": _percentile(lat, 50), "p99": _percentile(lat, 99)})
    t = Table(title=f"ctiflow bench latency: produce → result record, {seconds:.0f} s a run at half the job's maximum, "
                    f"3 partitions, {ACCOUNTS:,} accounts, cti.delay {DELAY_MS} ms")
    for col in ("operator", "trigger", "job max events/s", "produced events/s", "events measured",
                "p50 ms", "p99 ms", "p50 − delay ms", "p99 − delay ms"):
        t.add_column(col, justify="left" if col in ("operator", "trigger") else "right")
    for r in rows:
        t.add_row(r["operator"], r["trigger"], f"{r['max']:,.0f}", f"{r['rate']:,.0f}", f"{r['measured']:,}",
                  f"{r['p50']:,.0f}", f"{r['p99']:,.0f}", f"{r['p50'] - DELAY_MS:,.0f}", f"{r['p99'] - DELAY_MS:,.0f}")
    out.print(t)
    return rows
