"""``ctiflow bench soak --minutes N``: the example flows job (``examples/demo-flows.yaml``: bins
per device and minute, incremental, updated and final) under a steady producer for N minutes.

A producer thread sends network flows at a steady rate to a 3-partition topic, event time = the
wall clock (a flow is produced when it ends; it started up to 5 minutes before), each partition
in order, so with the job's 6-minute ``cti.delay`` nothing is late. The job runs unbounded in
this process with its own trigger; every minute a row: the process tree's memory (PSS), the
state's bytes and keys, the last minute's batches (count, p50, p99), records not read yet
(the partitions' high watermarks − the offsets the job has read), the CTI's lag behind the wall
clock. At the end the producer stops, the job is drained from its checkpoint (the final CTI),
and every result topic is checked against the oracle (``ctiflow.jobs.testing.oracle.final_bins``,
exact fractions): each final bin exactly once with its exact measures, the incremental records
of each bin adding up to it — nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import zlib
from pathlib import Path

from rich.console import Console
from rich.table import Table

PARTITIONS = 3
DEVICES = 2000
MAX_FLOW_MS = 300_000


def _partition(device: str) -> int:
    return zlib.crc32(device.encode()) % PARTITIONS


def _produce(bootstrap: str, topic: str, rate: float, stop: threading.Event, sent: list[int]) -> None:
    """Flows at ``rate`` a second until ``stop``; each ends now and started up to 5 minutes ago
    (a seeded mix of lengths); → ``sent[0]``: how many. Nothing is kept here (the oracle reads
    the topic back at the end: this process's memory is what the soak measures)."""
    import random

    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer

    ser = AvroSerializer("flow")
    # Records leave in producer batches of ≈ 0.5 s (≈ 80 a partition), as a producer that favours
    # throughput sends them: the embedded broker (tansu 0.6, memory storage) slows down with the
    # number of batches a partition holds — reading the last 1,000 records took 21 ms at 10,000
    # batches, 844 ms at 20,000, and no fetch returned within 60 s at 40,000 (5-record batches,
    # measured 2026-11-26) — which a producer sending every record at once reaches in minutes.
    rng = random.Random(7)
    last = [0] * PARTITIONS  # each partition's starts never go back by more than 5 minutes: never late

    def steady():
        start = time.monotonic()
        i = 0
        while not stop.is_set():
            due = int((time.monotonic() - start) * rate)
            now = int(time.time() * 1000)
            while i < due:
                device = f"dev-{rng.randrange(DEVICES):04d}"
                r = rng.random()
                length = 0 if r < 0.1 else rng.randrange(1, 60_000) if r < 0.8 else rng.randrange(60_000, MAX_FLOW_MS)
                p = _partition(device)
                end = max(now, last[p])
                last[p] = end
                packets = float(rng.randrange(1, 200))
                yield {"id": f"f{i}", "device": device, "start_time": end - length, "end_time": end,
                       "bytes": packets * rng.randrange(60, 1500), "packets": packets, "protocol": "tcp"}
                i += 1
            time.sleep(0.01)

    done = kafka.produce(bootstrap, topic, steady(), ser, "device", config={"linger.ms": 500},
                         partition_of=lambda _, rec: _partition(rec["device"]))
    sent.append(done.sent)


def _tree_pss_mb() -> float:
    import psutil

    from ctiflow.bench.spark_jobs import _pss

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            if p.name() != "tansu":
                total += _pss(p)
        except psutil.Error:
            pass
    return total / 2**20


def _job(bootstrap: str, home: str, topic: str, trigger: str) -> dict:
    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "demo-flows.yaml").read_text())
    source = spec["sources"][0]
    source.update(topic=topic, partitions=PARTITIONS)
    source.pop("max_offsets_per_trigger", None)
    outputs = spec["operators"][0]["outputs"]
    for kind in outputs:
        outputs[kind] = f"{topic}-{kind}"
    spec["kafka"] = {"bootstrap_servers": bootstrap}
    spec["outputs"] = {"late": f"{topic}-late", "dead_letter": f"{topic}-dlq"}
    spec["spark"] = {**spec["spark"], "trigger": trigger, "checkpoint": f"{home}/soak-checkpoint"}
    return spec


def main(out: Console | None = None, *, minutes: float = 30.0, rate: float = 500.0, trigger: str = "2s",
         record_figures: bool = False) -> dict:
    """``record_figures``: write the ``soak`` row of bench/figures.yaml (its minute-by-minute table)."""
    from ctiflow.bench.spark_jobs import bench_stack
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.metrics import kafka_ends
    from ctiflow.jobs.driver.progress import format_cti
    from ctiflow.jobs.testing import oracle

    out = out or Console(width=200)
    topic = "soak-flows"
    rows: list[dict] = []
    with bench_stack() as (bootstrap, spark, home):
        kafka.create_topics(bootstrap, {topic: PARTITIONS})
        cfg = parse(_job(bootstrap, home, topic, trigger), "soak")
        ends = kafka_ends(cfg)
        sent: list[int] = []
        stop = threading.Event()
        producer = threading.Thread(target=_produce, args=(bootstrap, topic, rate, stop, sent), daemon=True)
        began = time.monotonic()
        minute: list[float] = []  # this minute's batch durations (s)
        state = {"next": began + 60}

        def on_progress(p: dict, counters: dict) -> None:
            minute.append(p["durationMs"].get("triggerExecution", 0) / 1000)
            now = time.monotonic()
            if now < state["next"]:
                return
            state["next"] += 60
            read = {}
            for src in p.get("sources", []):
                end = src.get("endOffset")
                end = json.loads(end) if isinstance(end, str) else end
                read.update({int(k): int(v) for k, v in (end or {}).items() if str(k).isdigit()})
            try:
                high = ends(topic, sorted(read))
                behind = sum(max(0, high[k] - v) for k, v in read.items())
            except Exception:  # noqa: BLE001 - a missed probe leaves the cell empty
                behind = None
            cti = counters.get("cti")
            ordered = sorted(minute)
            rows.append({"minute": round((now - began) / 60), "pss_mb": _tree_pss_mb(),
                         "state_mb": counters.get("state_bytes", 0) / 2**20, "keys": counters.get("live_keys", 0),
                         "batches": len(minute), "p50": statistics.median(ordered) if ordered else 0,
                         "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0,
                         "behind": behind, "received": counters.get("received", 0),
                         "cti_lag": None if not cti or cti <= 0 else time.time() - cti / 1000})
            minute.clear()
            r = rows[-1]
            out.print(f"minute {r['minute']:>3}: PSS {r['pss_mb']:,.0f} MB, state {r['state_mb']:.1f} MiB / "
                      f"{r['keys']:,} keys, {r['batches']} batches p50 {r['p50']:.2f} s p99 {r['p99']:.2f} s, "
                      f"behind {r['behind']}, received {r['received']:,}, CTI {format_cti(cti)}", highlight=False)

        producer.start()
        try:
            pipeline.run(cfg, until_end=False, spark=spark, on_progress=on_progress, timeout=minutes * 60)
        finally:
            stop.set()
            producer.join()
            getattr(ends, "close", lambda: None)()
        drained = pipeline.run(cfg, until_end=True, spark=spark)  # the rest, then the final CTI
        records = kafka.read_topic(bootstrap, topic)
        assert len(records) == sent[0], f"produced {sent[0]}, the topic holds {len(records)}"
        checked = oracle.check(oracle.to_events(records, "device", "start_time", "end_time",
                                                partition_of=_partition), 360_000, policy="adjust")
        late = sum(c.status != oracle.ADMITTED for c in checked)
        expected = oracle.final_bins(checked, 60_000, 0, ["bytes", "packets"])
        final = kafka.read_topic(bootstrap, f"{topic}-final")
        incremental = kafka.read_topic(bootstrap, f"{topic}-incremental")
        seen: dict[tuple[str, int], int] = {}
        for r in final:
            seen[(r["key"], r["bin_start"])] = seen.get((r["key"], r["bin_start"]), 0) + 1
        twice = sum(n - 1 for n in seen.values() if n > 1)
        lost = len(set(expected) - set(seen))
        extra = len(set(seen) - set(expected))
        wrong = sum(1 for r in final if (r["key"], r["bin_start"]) in expected and not all(
            abs(r["measures"][m] - float(expected[(r["key"], r["bin_start"])].measures[m]))
            <= 1e-6 * max(1.0, float(expected[(r["key"], r["bin_start"])].measures[m])) for m in ("bytes", "packets")))
        added: dict[tuple[str, int], float] = {}
        for r in incremental:
            added[(r["key"], r["bin_start"])] = added.get((r["key"], r["bin_start"]), 0.0) + r["measures"]["bytes"]
        uneven = sum(1 for k, e in expected.items()
                     if abs(added.get(k, 0.0) - float(e.measures["bytes"])) > 1e-6 * max(1.0, float(e.measures["bytes"])))
    t = Table(title=f"ctiflow bench soak: examples/demo-flows.yaml for {minutes:g} min, {rate:,.0f} flows/s to "
                    f"{PARTITIONS} partitions, {DEVICES:,} devices, trigger {trigger}, event time = wall clock")
    for col in ("minute", "PSS MB", "state MiB", "state keys", "batches", "p50 s", "p99 s", "records behind",
                "received", "CTI lag s"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["minute"]), f"{r['pss_mb']:,.0f}", f"{r['state_mb']:.1f}", f"{r['keys']:,}", str(r["batches"]),
                  f"{r['p50']:.2f}", f"{r['p99']:.2f}", "-" if r["behind"] is None else f"{r['behind']:,}",
                  f"{r['received']:,}", "-" if r["cti_lag"] is None else f"{r['cti_lag']:.0f}")
    out.print(t)
    verdict = {"produced": len(records), "late": late, "final_bins": len(final), "expected_bins": len(expected),
               "lost": lost, "twice": twice, "extra": extra, "wrong_values": wrong, "incremental_not_adding_up": uneven,
               "drain_batches": drained.batches}
    ok = not (lost or twice or extra or wrong or uneven or late)
    out.print(f"checked against the oracle: {verdict} → {'nothing lost, nothing twice' if ok else 'MISMATCH'}",
              highlight=False)
    if record_figures:
        record_soak(rows, verdict, ok, t)
    return {"rows": rows, "verdict": verdict, "ok": ok}


def record_soak(rows: list[dict], verdict: dict, ok: bool, table: Table) -> None:
    """The ``soak`` row of bench/figures.yaml: from the minute the state stops growing (within 2 %
    of the last minute's), the batches' p50 range and p99 maximum; memory over the run's second half."""
    from ctiflow.bench.figures import record, rows_of, verdict as met

    last = rows[-1]["state_mb"]
    flat = next(i for i in range(len(rows)) if all(abs(r["state_mb"] - last) <= 0.02 * last for r in rows[i:]))
    steady, half = rows[flat:], rows[len(rows) // 2:]
    pss = [r["pss_mb"] / 1e3 for r in half]
    record("soak", {"flows": f"{verdict['produced']:,}", "state": f"{last:.1f}", "flat_from": str(rows[flat]["minute"]),
                    "p50": f"{min(r['p50'] for r in steady):.2f}–{max(r['p50'] for r in steady):.2f}",
                    "p99": f"{max(r['p99'] for r in steady):.2f}", "pss": f"{min(pss):.2f}–{max(pss):.2f}",
                    "minutes": str(len(half)), "bins": f"{verdict['final_bins']:,}",
                    "checked": "nothing lost, nothing twice" if ok else "**a mismatch** (see the run's output)",
                    "met": met(ok and flat <= len(rows) // 2 and max(pss) <= 1.1 * min(pss))}, table=rows_of(table))
