"""``ctiflow bench latency``: produce → result record, under a steady load, against Spark's floor.

For each trigger interval (:data:`TRIGGERS`), in one Spark session, at :data:`RATE` transactions
a second (event time = the wall clock at produce time) into a 3-partition topic, for
``seconds``:

1. **the floor**: a stateless pass-through query — the source → the Kafka sink, each record's
   bytes as they came, no shuffle, no state, no CTI: what Spark's micro-batches cost a record;
2. **the stateful floor**: the same records through Spark's stateful operator with none of ours —
   the source's packed key groups → ``transformWithStateInPandas`` forwarding each group's record
   bytes, one state update a group → the Kafka sink (:func:`ctiflow.bench.spark_jobs.forwarded`):
   the part of a job's latency that any Python stateful operator in Spark pays;
3. **the transactions job**: the demo's (``examples/demo-transactions.yaml``) without its
   reference stream and rules — two counts (the last 10,000 events; per account over the last
   hour) and two patterns per account (a login brute force; a purchase, one abroad, then one over
   1,000) — on the demo's mix of transactions, with ``cti.delay`` :data:`DELAY_MS`.

Afterwards the topics are read back: an input record's produce time is its Kafka timestamp, a
result's arrival its Kafka timestamp (the sink's produce). Floors: each record's latency
(matched by ``id``). Counts: for each event, the first count record of its key whose time (the
CTI − 1) reaches the event's time. Matches: arrival − the match's ``last_time`` (the event time
of its last event: its produce time).

A result can only leave once the CTI has passed its event, so at least ``cti.delay`` of wall
time: the job's rows are shown net of that delay. Events produced in the last
``delay + 2 triggers`` of a run are left out (no CTI passes them before the job stops).
"""

from __future__ import annotations

import bisect
import json
import statistics
import threading
import time
import zlib

from rich.console import Console
from rich.table import Table

from ctiflow.bench import LATENCY_RUNS

DELAY_MS = 1000
TRIGGERS = ("100ms", "250ms", "1s")
#: Transactions a second, for both queries. The demo's job sustains ≈ 9,600 a second on this
#: 2-core machine in a bounded run of 50k-event batches (its stateful stage: ≈ 100 µs an event
#: over 200k live accounts), and at 5,000 a second its 250 ms batches already take 2 s
#: (measured 2026-11-28): a rate well inside its capacity, so that latency is latency, not backlog.
RATE = 2_000
#: The first part of a run is left out: the query's first micro-batches (its Python workers
#: starting, the JIT) build a backlog the later ones work off.
WARM_UP_MS = 20_000
#: Accounts: 0.01 transactions a second each at :data:`RATE` (the demo's own mix: ≈ 0.09). With
#: 1,000 accounts (20 a second each) "a purchase, then one abroad, then one over 1,000 within
#: 10 minutes" keeps every purchase's run for up to 10 minutes (3 % of purchases are abroad):
#: thousands of runs a key, 1k events/s — a property of the pattern at that rate, not latency.
ACCOUNTS = 200_000
POOL = 400_000  # transactions generated once and cycled


def _trigger_ms(trigger: str) -> int:
    from ctiflow.jobs.driver.config import duration_ms

    return duration_ms(trigger)


_POOL: list[dict] = []


def _transaction(i: int, now_ms: int) -> dict:
    """The ``i``-th transaction of the steady load: the demo's mix (:func:`ctiflow.jobs.testing.workload.transactions`:
    purchases, withdrawals, logins, login bursts, country hops over :data:`ACCOUNTS` accounts),
    cycled, with event time = now."""
    if not _POOL:
        from ctiflow.jobs.testing import workload

        _POOL.extend(workload.transactions(POOL, accounts=ACCOUNTS, seed="latency", rate_per_s=RATE))
    return {**_POOL[i % len(_POOL)], "id": str(i), "event_time": now_ms}


def _source(topic: str) -> dict:
    return {"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account",
            "time_field": "event_time", "cti": {"delay": f"{DELAY_MS}ms"}}


#: ``state.chunk_keys`` of the job: its keys are sparse (nearly every event an account of its own), so a
#: batch touches about one chunk per event; larger chunks mean fewer of them, each a state-store
#: round trip (≈ 0.3–0.6 ms a call inside a loaded micro-batch). Measured at a 250 ms trigger, p99 net
#: of the delay, one run each: 32 (the default) 2.97 s, 512 1.99 s, 2048 1.75 s (2026-11-28); with the
#: match operator's keys packed in columns, 512 1.27 s, 2048 1.04 s, 8192 1.03 s (2026-11-29). With every
#: chunk from the worker's cache (a batch only writes), fewer chunks are fewer writes and fewer
#: per-chunk snapshots: 2048 → 8192, job / plumbing p99 1.04 / 0.88 → 0.95 / 0.86 s, our Python
#: 161 → 110 ms a batch (one pair of runs, job and plumbing only, 2026-11-30); the key group without
#: Spark: commit 33–57 → 25–40 ms, 27 → 7 state writes a batch.
CHUNK_KEYS = 8192

#: The floors, by kind: what Spark's micro-batches cost a record without any state (the floor the
#: latency goal is stated against), and with Spark's stateful operator in the path but none of
#: ours — the same key groups, Python worker and Arrow hand-offs, one state update a group
#: (:func:`ctiflow.bench.spark_jobs.forwarded`): the part of the job's latency that is Spark's.
FLOORS = {"floor": "stateless pass-through (the floor)",
          "stateful": "stateful pass-through (Spark's stateful plumbing, no operator)"}


def _job(topic: str, trigger: str, home: str, bootstrap: str) -> dict:
    """The demo's transactions job (examples/demo-transactions.yaml) without its reference
    stream and its rules: two counts and two patterns (module docstring), chunks of
    :data:`CHUNK_KEYS` keys."""
    return {"job": f"latency-{topic}", "sources": [_source(topic)],
            "kafka": {"bootstrap_servers": bootstrap},
            "operators": [
                {"kind": "count", "name": "high_value_last_10k", "window": {"events": 10000}, "epsilon": 0.01,
                 "per_key": False, "predicate": "amount > 1000", "emit": "per_cti", "output": f"{topic}-counts"},
                {"kind": "count", "name": "over_threshold_per_account_1h", "window": {"time": "1h"}, "epsilon": 0.05,
                 "per_key": True, "predicate": "amount > 1000", "emit": "per_cti", "output": f"{topic}-counts"},
                {"kind": "match", "name": "login-brute-force", "output": f"{topic}-matches",
                 "pattern": {"within_ms": 300000, "skip": "skip_past_last_event", "stages": [
                     {"name": "failures", "where": "type == 'login_failed'", "quantifier": {"times": 3},
                      "consecutive": True},
                     {"name": "success", "contiguity": "next", "where": "type == 'login_ok'"}]}},
                {"kind": "match", "name": "two-countries-then-large", "output": f"{topic}-matches",
                 "pattern": {"within_ms": 600000, "skip": "skip_past_last_event", "stages": [
                     {"name": "first", "where": "type == 'purchase'"},
                     {"name": "abroad", "contiguity": "followed_by",
                      "where": "type == 'purchase' and country != first('first').country"},
                     {"name": "large", "contiguity": "followed_by", "where": "type == 'purchase' and amount > 1000"}]}}],
            "state": {"chunk_keys": CHUNK_KEYS},
            "spark": {"key_groups": 8, "trigger": trigger, "checkpoint": f"{home}/ck-{topic}"}}


def _floor(spark, bootstrap: str, topic: str, trigger: str, seconds: float, home: str,
           stateful: bool = False) -> list[dict]:
    """A floor (module docstring) — the stateless pass-through, or with ``stateful`` the stateful one
    — running for ``seconds``; its records go to ``<topic>-out``."""
    from pyspark.sql import functions as F

    from ctiflow.bench.spark_jobs import _source as source_frame, forwarded
    from ctiflow.jobs.datapath import kafka

    out_topic = f"{topic}-out"
    kafka.create_topics(bootstrap, {out_topic: 3})
    if stateful:
        df = forwarded(spark, bootstrap, _source(topic), out_topic)
    else:
        df = source_frame(spark, bootstrap, _source(topic), "all").select(
            F.lit(out_topic).alias("topic"), F.col("meta_key").cast("binary").alias("key"),
            F.col("meta_value").alias("value"), F.lit("passthrough").alias("kind"))
    q = (df.writeStream.format("ctiflow_kafka_sink").option("bootstrap", bootstrap)
         .option("topics", json.dumps([out_topic])).option("checkpointLocation", f"{home}/ck-{topic}")
         .trigger(processingTime=f"{_trigger_ms(trigger)} milliseconds").start())
    progress: dict[int, dict] = {}
    deadline = time.monotonic() + seconds + 5
    try:
        while time.monotonic() < deadline:  # (recentProgress keeps the last 100 batches only)
            progress.update((p["batchId"], p) for p in q.recentProgress)
            time.sleep(2)
    finally:
        progress.update((p["batchId"], p) for p in q.recentProgress)
        q.stop()
    return [progress[b] for b in sorted(progress)]


def _produce_steady(bootstrap: str, topic: str, rate: float, seconds: float, stop: threading.Event) -> int:
    """Transactions at ``rate`` a second for ``seconds`` (event time = now); → how many."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer

    _transaction(0, 0)  # the pool made before the clock starts

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


def _read(bootstrap: str, topic: str) -> list[tuple[int, dict]]:
    """Every record of ``topic`` as ``(Kafka timestamp ms, decoded record)``."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroDeserializer

    decode = AvroDeserializer(None, lookup=kafka.SchemaTopic(bootstrap, None))  # (derived schemas too)
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


def _latencies(kind: str, inputs: list[tuple[int, dict]], outputs: list[tuple[int, dict]], since: int,
               cutoff: int) -> list[int]:
    """Milliseconds from produce to result (module docstring), for inputs produced in [since, cutoff]."""
    if kind == "floor":
        produced = {rec["id"]: ts for ts, rec in inputs if since <= ts <= cutoff}
        return [ts - produced[rec["id"]] for ts, rec in outputs if rec["id"] in produced]
    if kind == "matches":
        return [ts - rec["last_time"] for ts, rec in outputs if since <= rec["last_time"] <= cutoff]
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
        if not since <= ts <= cutoff or mine is None:
            continue
        i = bisect.bisect_left(mine, rec["event_time"])  # the first count record that covers the event
        if i < len(mine):
            got.append(by_key[rec["account"]][i][1] - ts)
    return got


def _percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def _run(spark, bootstrap: str, home: str, kind: str, trigger: str, seconds: float, repeat: int = 0) -> dict:
    """One run under the steady load (the ``repeat``-th of the benchmark's runs) → its topic, events
    sent, the measured window and the micro-batches' durations."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.checkpoint import ProgressLog, latest_query
    from ctiflow.jobs.driver.config import parse

    topic = f"lat-{kind}-{trigger}-{repeat}"
    kafka.create_topics(bootstrap, {topic: 3})
    stop = threading.Event()
    sent: list[int] = []
    producer = threading.Thread(target=lambda: sent.append(_produce_steady(bootstrap, topic, RATE, seconds, stop)),
                                daemon=True)
    started = int(time.time() * 1000)
    counted: dict[int, dict] = {}  # batch → the job's counters of that batch (its progress log)
    producer.start()
    try:
        if kind in FLOORS:
            progress = _floor(spark, bootstrap, topic, trigger, seconds, home, stateful=kind == "stateful")
        else:
            cfg = parse(_job(topic, trigger, home, bootstrap), topic)
            progress = pipeline.run(cfg, until_end=False, spark=spark, timeout=seconds + 5).progress
            counted = {rec["batch"]: rec for rec in latest_query(ProgressLog.of(cfg).read(0)[0])}  # (last attempt)
    finally:
        stop.set()
        producer.join()
    since = _iso(started + WARM_UP_MS)
    durations = sorted(p["durationMs"]["triggerExecution"] for p in progress
                       if p["numInputRows"] and p["timestamp"] >= since)
    return {"topic": topic, "sent": sent[0] if sent else 0, "since": started + WARM_UP_MS,
            "cutoff": started + int(seconds * 1000) - DELAY_MS - 2 * _trigger_ms(trigger),
            "batch_p50": _percentile(durations, 50), "batch_p99": _percentile(durations, 99),
            **_stages(progress, counted, since)}


def _stages(progress: list[dict], counted: dict[int, dict], since: str) -> dict:
    """Where a job's micro-batch goes, medians over the measured batches: Spark's stateful operator
    (``allUpdatesTimeMs``), the key groups' Python calls within it (``python_us``), a hosted call's
    wait beyond its host's Python time (``forward_us``), the calls' state decode/encode
    (``state_us``), the state written (``state_written``); and over all of them the
    share of the state chunks used that came decoded from the worker's cache (``chunks_cached`` /
    ``chunks_loaded``)."""
    rows = []
    for p in progress:
        got = counted.get(p["batchId"])
        if got is None or p["timestamp"] < since or not p["numInputRows"] or not p.get("stateOperators"):
            continue
        rows.append({"stateful_ms": p["stateOperators"][0].get("allUpdatesTimeMs", 0),
                     "python_ms": got.get("python_us", 0) / 1000, "forward_ms": got.get("forward_us", 0) / 1000,
                     "state_ms": got.get("state_us", 0) / 1000,
                     "written_mb": got.get("state_written", 0) / 1e6,
                     "cached": got.get("chunks_cached", 0), "loaded": got.get("chunks_loaded", 0)})
    if not rows:
        return {}
    return {**{name: _percentile([r[name] for r in rows], 50) for name in
               ("stateful_ms", "python_ms", "forward_ms", "state_ms", "written_mb")},
            "cached": sum(r["cached"] for r in rows) / max(1, sum(r["loaded"] for r in rows))}


#: the stage columns (:func:`_stages`), as printed
WHERE = ("stateful operator ms", "Python ms", "forwarding ms", "state ms", "state written MB", "chunks from the cache")


def _where(at: dict) -> dict[str, str]:
    """A job run's stages (:func:`_stages`) as the cells of :data:`WHERE` — the one formatting of
    them, for the printed table and the recorded one."""
    return dict(zip(WHERE, (f"{at['stateful_ms']:,.0f}", f"{at['python_ms']:,.0f}", f"{at['forward_ms']:,.0f}",
                            f"{at['state_ms']:,.0f}",
                            f"{at['written_mb']:,.2f}", f"{at['cached']:.0%}")))


def _iso(ms: int) -> str:
    """Spark's progress timestamp format (UTC), for comparing with its ``timestamp``."""
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


#: Runs of the whole protocol in one benchmark (:data:`ctiflow.bench.LATENCY_RUNS`)
RUNS = LATENCY_RUNS


def main(out: Console | None = None, *, seconds: float = 75.0, triggers: tuple[str, ...] = TRIGGERS,
         runs: int = RUNS, record_figures: bool = False) -> list[dict]:
    """The runs (module docstring), ``runs`` times over, and their tables; ``record_figures``: write
    the row ``latency`` of bench/figures.yaml (``ctiflow bench latency`` at its defaults: every
    trigger, 75 s a run, :data:`RUNS` runs)."""
    from ctiflow.bench.spark_jobs import bench_stack

    out = out or Console(width=200)
    rows, stages = [], []
    with bench_stack() as (bootstrap, spark, home):
        for repeat in range(runs):
            for trigger in triggers:
                for kind in (*FLOORS, "job"):
                    run = _run(spark, bootstrap, home, kind, trigger, seconds, repeat)
                    rows.extend(_measured(bootstrap, run, kind, trigger, repeat))
                    if kind == "job":
                        stages.append({"trigger": trigger, "run": repeat, **run})
    t = Table(title=f"ctiflow bench latency: produce → result record, {seconds:.0f} s a run at {RATE:,} transactions/s, "
                    f"3 partitions, {ACCOUNTS:,} accounts; the job's rows net of its cti.delay ({DELAY_MS} ms), "
                    f"the first {WARM_UP_MS / 1000:.0f} s left out; {runs} run(s)")
    for col in ("run", "query", "trigger", "events sent", "latencies measured", "p50 ms", "p95 ms", "p99 ms",
                "p99 / floor's", "batch p50 ms", "batch p99 ms"):
        t.add_column(col, justify="left" if col in ("query", "trigger") else "right")
    floors = {(r["run"], r["trigger"]): r["p99"] for r in rows if r["kind"] == "floor"}
    for r in rows:
        floor = floors.get((r["run"], r["trigger"]))
        t.add_row(str(r["run"] + 1), r["query"], r["trigger"], f"{r['sent']:,}", f"{r['measured']:,}",
                  f"{r['p50']:,.0f}", f"{r['p95']:,.0f}", f"{r['p99']:,.0f}", f"{r['p99'] / floor:.2f}×" if floor else "",
                  f"{r['batch_p50']:,.0f}", f"{r['batch_p99']:,.0f}")
    out.print(t)
    parts = Table(title="where the job's micro-batch goes (medians over the measured batches): Spark's stateful "
                        "operator, our key groups' Python calls within it and their state decode/encode, the state "
                        "written a batch; the share of the chunks used that came decoded from the Python worker's "
                        "cache, over all those batches")
    for col in ("run", "trigger", "batch ms", *WHERE):
        parts.add_column(col, justify="left" if col == "trigger" else "right")
    for r in stages:
        if "stateful_ms" in r:
            parts.add_row(str(r["run"] + 1), r["trigger"], f"{r['batch_p50']:,.0f}", *_where(r).values())
    out.print(parts)
    if record_figures:
        _record(rows, stages)
    return rows


def _measured(bootstrap: str, run: dict, kind: str, trigger: str, repeat: int) -> list[dict]:
    """A run's rows: its latencies read back from the topics (module docstring), one row a result kind."""
    topic = run["topic"]
    inputs = _read(bootstrap, topic)
    results = ([(kind, _read(bootstrap, f"{topic}-out"))] if kind in FLOORS else
               [("counts", _read(bootstrap, f"{topic}-counts")), ("matches", _read(bootstrap, f"{topic}-matches"))])
    rows = []
    for what, outputs in results:
        lat = _latencies("floor" if what in FLOORS else what, inputs, outputs, run["since"], run["cutoff"])
        net = 0 if what in FLOORS else DELAY_MS
        rows.append({"run": repeat, "query": FLOORS.get(what, f"transactions job: {what}"), "kind": what,
                     "trigger": trigger, "sent": run["sent"], "measured": len(lat),
                     **{f"p{q}": _percentile(lat, q) - net for q in (50, 95, 99)},
                     "batch_p50": run["batch_p50"], "batch_p99": run["batch_p99"]})
    return rows


def _record(rows: list[dict], stages: list[dict]) -> None:
    """The figures row ``latency`` (bench/figures.yaml): per trigger the job's worse p99 of its
    counts and matches against the floor's, and the stateful floor's against the floor's, in
    seconds, and at 250 ms where the job's batch goes (:func:`_stages`) — of the last run, with
    each run's p99s beside (``…_runs``: "a / b / c") and the goal judged in every run; skipped
    unless every trigger ran."""
    from ctiflow.bench.figures import record, verdict

    runs = sorted({r.get("run", 0) for r in rows})
    last = runs[-1]

    def worst(trigger: str, what: str, kind: str = "job", run: int = last) -> float:
        """The worse of the job's counts and matches (``kind`` "job"), or a floor's figure, in ``run``."""
        got = [r[what] for r in rows if r["trigger"] == trigger and r.get("run", 0) == run
               and (r["kind"] == kind if kind in FLOORS else r["kind"] not in FLOORS)]
        return max(got)

    def each(figure) -> str:
        return " / ".join(figure(run) for run in runs)

    if not all(any(r["trigger"] == t and r.get("run", 0) == run for r in rows) for t in TRIGGERS for run in runs):
        return
    values = {}
    for t, name in zip(TRIGGERS, ("100", "250", "1000")):
        values[f"p99_{name}"] = f"{worst(t, 'p99') / 1000:.2f}"
        values[f"p50_{name}"] = f"{worst(t, 'p50') / 1000:.2f}"
        values[f"p95_{name}"] = f"{worst(t, 'p95') / 1000:.2f}"
        values[f"floor_{name}"] = f"{worst(t, 'p99', 'floor') / 1000:.2f}"
        values[f"ratio_{name}"] = f"{worst(t, 'p99') / worst(t, 'p99', 'floor'):.2f}"
        values[f"batch_{name}"] = f"{worst(t, 'batch_p50'):,.0f}"
        values[f"floor_batch_{name}"] = f"{worst(t, 'batch_p50', 'floor'):,.0f}"
        values[f"plumbing_{name}"] = f"{worst(t, 'p99', 'stateful') / 1000:.2f}"
        values[f"plumbing_batch_{name}"] = f"{worst(t, 'batch_p50', 'stateful'):,.0f}"
        values[f"plumbing_ratio_{name}"] = f"{worst(t, 'p99', 'stateful') / worst(t, 'p99', 'floor'):.2f}"
        values[f"job_plumbing_{name}"] = f"{worst(t, 'p99') / worst(t, 'p99', 'stateful'):.2f}"
        values[f"p99_{name}_runs"] = each(lambda run: f"{worst(t, 'p99', run=run) / 1000:.2f}")
        values[f"plumbing_{name}_runs"] = each(lambda run: f"{worst(t, 'p99', 'stateful', run) / 1000:.2f}")
        values[f"job_plumbing_{name}_runs"] = each(
            lambda run: f"{worst(t, 'p99', run=run) / worst(t, 'p99', 'stateful', run):.2f}")
        values[f"batch_{name}_runs"] = each(lambda run: f"{worst(t, 'batch_p50', run=run):,.0f}")
        values[f"plumbing_batch_{name}_runs"] = each(lambda run: f"{worst(t, 'batch_p50', 'stateful', run):,.0f}")
    met = [worst("250ms", "p99", run=run) <= min(1.5 * worst("250ms", "p99", "stateful", run), 850) for run in runs]
    values["met_250"] = verdict(all(met))
    values["runs"] = str(len(runs))
    values["met_runs_250"] = f"{sum(met)} of {len(runs)}"
    at = next((r for r in stages if r["trigger"] == "250ms" and r.get("run", 0) == last and "stateful_ms" in r), None)
    if at is not None:
        values.update(zip(("stateful_250", "python_250", "forward_250", "state_250", "written_250", "cached_250"),
                          _where(at).values()))
    by_trigger = {r["trigger"]: r for r in stages if "stateful_ms" in r and r.get("run", 0) == last}

    def where(r: dict) -> dict:
        at = by_trigger.get(r["trigger"])
        if at is None or r["kind"] in FLOORS:
            return dict.fromkeys(("stateful / Python / forwarding / state ms", "state written MB",
                                  "chunks from the cache"), "")
        cells = _where(at)
        return {"stateful / Python / forwarding / state ms": " / ".join(cells[c] for c in WHERE[:4]),
                "state written MB": cells["state written MB"], "chunks from the cache": cells["chunks from the cache"]}

    def p99_each(r: dict) -> str:
        return each(lambda run: next(f"{o['p99']:,.0f}" for o in rows if o.get("run", 0) == run
                                     and o["trigger"] == r["trigger"] and o["kind"] == r["kind"]))

    record("latency", values, table=[
        {"query": r["query"], "trigger": r["trigger"], "p50 ms": f"{r['p50']:,.0f}", "p95 ms": f"{r['p95']:,.0f}",
         "p99 ms": f"{r['p99']:,.0f}", "p99 ms, each run": p99_each(r),
         "p99 / the floor's": f"{r['p99'] / worst(r['trigger'], 'p99', 'floor'):.2f}×",
         "batch p50 / p99 ms": f"{r['batch_p50']:,.0f} / {r['batch_p99']:,.0f}", **where(r)}
        for r in rows if r.get("run", 0) == last])
