"""``ctiflow bench scale``: per-batch cost against live keys, for count, match and bins.

Runs the exact per-micro-batch path of a key group in one process — restore the header from
bytes, offer the batch's events, advance to its CTI, commit the touched chunks and the header
to the store — with the store a dict of bytes (in Spark it is the ``MapState``; its per-call cost
is Spark's, the same for any layout). Live keys are built first (one event each, in batches);
then every measured batch has the same number of events over the same number of *active* keys
(the keys a batch touches; the rest stay live and untouched, as the cards or devices a job has
seen but that are quiet now). Baseline in the same run: the identity operator at 10k keys.

Per row: events/s of the measured batches, p50/p99 batch, live keys and state bytes, bytes
written per batch, the share of each batch spent on state (header and chunk decode + encode),
peak RSS of the process, and the restart time (header decode and the first batch after it).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from dataclasses import dataclass, replace

import psutil
from rich.console import Console
from rich.table import Table

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import Control, GroupInput, pack_events, unpack_columns
from ctiflow.jobs.core.runtime import open_group, seal_group
from ctiflow.operators.time import Event

T0 = 1_767_225_600_000
DAY = 86_400_000

OPERATORS = {
    "identity": {"kind": "passthrough", "output": "out"},
    "count": {"kind": "count", "name": "last_100", "window": {"events": 100}, "emit": "per_event", "output": "c"},
    "match": {"kind": "match", "name": "rare", "output": "m", "timed_out": "m-timed-out",
              "pattern": {"within_ms": 7 * DAY, "stages": [{"name": "big", "where": "amount > 1990"},
                                                             {"name": "abroad", "where": "country == 'XX'"}]}},
    "bins": {"kind": "bins", "name": "per_day", "bin_size": "1d", "measures": ["amount"], "outputs": {"final": "b"}},
}


@dataclass
class Row:
    """One row of either table (in one process, or end to end in Spark)."""

    operator: str
    live_keys: int
    events: int
    seconds: float
    p50_ms: float
    p99_ms: float
    state_ms: float        # mean per batch (Spark: summed over the key groups, decode + encode in the workers)
    state_share: float     # of the batches' wall time (Spark: 2 tasks run at once, a share of one core's time)
    written: float         # mean bytes written to the state store per batch
    state_bytes: int
    peak_rss_mb: float     # Spark: the job's process tree (JVM, Python workers), not the embedded broker (PSS)
    restart_s: float       # to the first completed batch after a restart
    chunks: float = 0.0    # Spark: mean chunks used (read or taken from the worker's cache) and written per batch
    cached: float = 0.0    # Spark: of those, mean taken decoded from the worker's cache (ctiflow.jobs.state.warm.WarmChunks)
    caught: float = 0.0    # Spark: of those, mean some commits behind, caught up with the frames written since
    store_ms: float = 0.0  # Spark: mean per batch in Spark's state store's calls (summed over the key groups)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def _plan(kind: str, chunk_keys: int | None, delta_share: float | None = None):
    """``kind``'s job as one key group; ``chunk_keys``/``delta_share`` None: the settings' defaults."""
    state = {k: v for k, v in (("chunk_keys", chunk_keys), ("delta_share", delta_share)) if v is not None}
    p = plan_job(parse({"job": "scale", "kafka": {"bootstrap_servers": "x:1"},
                         "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                                      "time_field": "event_time", "measures": ["amount"], "cti": {"delay": -1}}],
                         "operators": [OPERATORS[kind]], "state": state}, "scale"))
    return replace(p, key_groups=1)  # one key group: what one task of the stateful stage holds


def _event(key: str, t: int, i: int, rng: random.Random, amount: float | None = None) -> Event:
    amount = float(rng.randrange(2000)) if amount is None else amount
    return Event(key, t, t, {"account": key, "amount": amount, "country": "DE", "type": "purchase"}, 0, i, "tx")


def _shipped(events: list[Event]) -> tuple[bytes, int]:
    """``events`` as the source ships them to a key group: one pack (typed Arrow columns,
    :func:`~ctiflow.jobs.core.rows.pack_events`), and the largest start read (its frontier)."""
    pack = pack_events([(e.key, e.start, e.end, e.fields, e.offset, None) for e in events])
    return pack, max(e.start for e in events)


def _batch(plan, store, header, shipped: tuple[bytes, int], worker=None):
    """One micro-batch of one key group, as the adapter runs it: on what the source shipped
    (:func:`_shipped`; until 2026-12-04 columns built from ``Event`` objects, every field an object
    column, each measure checked value by value, which the job does not do), the CTI one past the
    latest event (``cti.delay`` −1), the cyclic garbage collector paused
    (:mod:`ctiflow.jobs.core.alloc`), an operator's result columns kept one batch (``batched``;
    until 2026-12-04 one ``Output`` a record), the group opened and stored as the adapter does
    (:func:`~ctiflow.jobs.core.runtime.open_group`, :func:`~ctiflow.jobs.core.runtime.seal_group`).
    ``worker``: the :class:`~ctiflow.jobs.state.warm.WarmChunks` of the Python worker that runs it;
    None: one that keeps nothing, so every chunk the batch touches is read from ``store`` and
    restored. → (header, seconds on state, written, state bytes, live keys, chunks used, of those
    taken from the worker's cache)."""
    from ctiflow.jobs.core.alloc import cyclic_gc_paused
    from ctiflow.jobs.state.warm import WarmChunks

    worker = WarmChunks() if worker is None else worker
    with cyclic_gc_paused():
        rt = open_group(plan, header, header, store, worker)
        pack, top = shipped
        rt.run_batch(GroupInput([unpack_columns(pack, "tx", 0)], [("tx", 0, top)],
                                [("tx", Control([0], [], False))], []))
        header, seal = seal_group(rt, worker)
        header = seal(header)
    c = rt.counters
    return header, c.state_us / 1e6, c.state_written, c.state_bytes, rt.live_keys(), c.chunks_loaded, c.chunks_cached


def measure(kind: str, live: int, per_batch: int, active: int, batches: int, chunk_keys: int | None, seed: int = 7,
            delta_share: float | None = None, workers: int = 0) -> Row:
    """``active`` None: the measured events spread uniformly over every live key (sparse keys).
    ``workers``: Python workers that take the batches in turn, each keeping the chunks it
    committed decoded (:class:`~ctiflow.jobs.state.warm.WarmChunks`; as Spark's two tasks swap
    their workers), the first ``workers`` batches not measured (each worker's first turn); 0:
    every batch restores the chunks it touches from the store, the first not measured."""
    from ctiflow.jobs.state.warm import WarmChunks

    plan = _plan(kind, chunk_keys, delta_share)
    pool = [WarmChunks() for _ in range(workers)]
    rng = random.Random(seed)
    store: dict = {}
    header = None
    t = T0 + 1  # inside the first day-bin (a point at T0 belongs to the bin ending there)
    i = 0
    # build the live keys: one event each (a first stage for match: every key has a run in
    # flight; one open bin each for bins), in batches of up to 1M
    for lo in range(0, live, 1_000_000):
        evs = []
        for k in range(lo, min(live, lo + 1_000_000)):
            evs.append(_event(f"k{k:08d}", t, i, rng, 1999.0))
            i += 1
            t += 1
        header, *_ = _batch(plan, store, header, _shipped(evs), pool[0] if pool else None)
    gc.collect()
    base_t = t + 10
    active_keys = [f"k{k:08d}" for k in (range(live) if active is None else rng.sample(range(live), min(active, live)))]
    times, state, written = [], [], []
    state_bytes = 0
    peak = 0
    me = psutil.Process()
    restart_ms = 0.0
    chunks: list[tuple[int, int]] = []
    for b in range(batches):
        evs = []
        for _ in range(per_batch):
            base_t += 1
            evs.append(_event(rng.choice(active_keys), base_t, i, rng))
            i += 1
        shipped = _shipped(evs)
        start = time.perf_counter()
        header, st, wr, state_bytes, live_now, used, cached = _batch(plan, store, header, shipped,
                                                                     pool[b % workers] if pool else None)
        took = time.perf_counter() - start
        if b == 0:
            restart_ms = took * 1000  # the first batch after a restart: header decoded, only touched chunks read
        if b < max(workers, 1):
            continue
        times.append(took)
        state.append(st)
        written.append(wr)
        chunks.append((used, cached))
        peak = max(peak, me.memory_info().rss)
    ordered = sorted(times)
    return Row(kind, live_now, per_batch * len(times), sum(times), statistics.median(ordered) * 1000,
               ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000,
               statistics.mean(state) * 1000, sum(state) / sum(times), statistics.mean(written), state_bytes,
               peak / 2**20, restart_ms / 1000, chunks=statistics.mean(u for u, _ in chunks),
               cached=statistics.mean(c for _, c in chunks))


def main(out: Console | None = None, sizes=(10_000, 100_000, 1_000_000, 3_000_000), per_batch: int = 20_000,
         active: int = 2_000, batches: int = 6, chunk_keys: int | None = None) -> list[Row]:
    """The one-process table at ``state.chunk_keys`` = ``chunk_keys`` (None: the setting's default)."""
    out = out or Console(width=200)
    rows = [measure("identity", 10_000, per_batch, active, batches, chunk_keys)]
    for kind in ("count", "match", "bins"):
        for live in sizes:
            rows.append(measure(kind, live, per_batch, active, batches, chunk_keys))
            gc.collect()
    table = Table(title=f"ctiflow bench scale: one key group, {per_batch:,} events a batch over {active:,} active keys, "
                        f"state.chunk_keys = {_plan('identity', chunk_keys).chunk_keys} "
                        "(baseline: identity operator at 10k keys)")
    for col in ("operator", "live keys", "events/s", "vs own 10k", "vs identity", "p50 batch ms", "p99 batch ms",
                "state ms/batch", "state share", "written/batch", "state bytes", "peak RSS MB", "restart ms"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    base = rows[0].rate
    first = {}
    for r in rows:
        first.setdefault(r.operator, r.rate)
        table.add_row(r.operator, f"{r.live_keys:,}", f"{r.rate:,.0f}", f"{r.rate / first[r.operator]:.2f}×",
                      f"{r.rate / base:.2f}×", f"{r.p50_ms:,.0f}", f"{r.p99_ms:,.0f}", f"{r.state_ms:,.0f}",
                      f"{100 * r.state_share:.0f} %", f"{r.written / 1024:,.0f} KiB", f"{r.state_bytes / 2**20:,.1f} MiB",
                      f"{r.peak_rss_mb:,.0f}", f"{r.restart_s * 1000:,.0f}")
    out.print(table)
    return rows


#: ``state.chunk_keys`` of the sparse-keys tables: what the setting's description advises for sparse keys
#: (measured end to end, 2026-12-01: at 1M and 3M keys count 0.80 / 0.58× of its 10k rate at 2048,
#: 0.96 / 0.94× at 16384; 2026-12-03, at 3M keys, 16384 → 65536 in one run: count 0.60 → 0.77×,
#: match 0.38 → 0.78×, bins 0.62 → 0.69× — a key group's chunks 4× fewer: fewer state calls and
#: per-chunk rounds, the same work a key)
SPARSE_CHUNK_KEYS = 65_536
#: ``state.delta_share`` of the sparse-keys tables: what the setting's description advises for sparse
#: keys (a batch changes a few per cent of every chunk's keys, a frame ≈ 13 % of a bins chunk's base at
#: 3M keys): a chunk is written whole every 8–23 batches, not every 2–6 as at the default 0.5, and the
#: worker that ran its group a few batches ago absorbs the frames since instead of reading it whole
#: (2026-12-04: one 1.5M-key bins group without Spark, 40 batches, state 213 → 153 ms a batch; end to
#: end at 3M keys, bytes written 5.2 → 3.0 MiB a batch, the state stored 18.7 → 24.8 MiB, and bins'
#: ratio to its 10k rate within its spread: 0.68× at 0.5, 0.48–0.92× in four runs at 2)
SPARSE_DELTA_SHARE = 2.0


def sparse_main(out: Console | None = None, sizes=(10_000, 1_000_000, 3_000_000), per_batch: int = 100_000,
                batches: int = 24, chunk_keys: int | None = None, shares=(SPARSE_DELTA_SHARE,), workers: int = 2,
                record_figures: bool = False) -> list[Row]:
    """Sparse keys: the same ``per_batch`` events a batch (one key group's share of the end-to-end
    rows' 200,000) spread uniformly over every live key (each event nearly always a key of its own,
    every chunk touched), for count, match and bins, in one process, with chunks written as deltas
    (``state.delta_share`` each of ``shares``, :data:`SPARSE_DELTA_SHARE` unless told; None: the
    default; 0.0: chunks written whole), ``batches`` measured after each of ``workers`` Python
    workers had a turn (:func:`measure`: they take the batches in turn, each keeping the chunks it
    committed decoded, as in Spark; 24, so that every chunk is written whole at least once in them,
    as it is every 8–23 batches).
    Baseline: each operator and share at its fewest keys. ``record_figures``: write the
    ``scale-sparse`` row of bench/figures.yaml."""
    from ctiflow.jobs.driver.config import StateConfig

    out = out or Console(width=200)
    chunk_keys = chunk_keys or SPARSE_CHUNK_KEYS
    rows: list[tuple[str, Row]] = []
    for kind in ("count", "match", "bins"):
        for share in shares:
            label = f"delta_share {StateConfig().delta_share if share is None else share}"
            for live in sizes:
                rows.append((label, measure(kind, live, per_batch, None, batches + max(workers, 1), chunk_keys,
                                            delta_share=share, workers=workers)))
                gc.collect()
                out.print(f"  {kind}, {label}, {live:,} keys: {rows[-1][1].rate:,.0f} events/s")
    table = Table(title=f"ctiflow bench scale, sparse keys: one key group, {per_batch:,} events a batch spread over "
                        f"every live key, state.chunk_keys = {chunk_keys}, {workers} workers in turn "
                        "(baseline: the row's own fewest keys)")
    for col in ("operator", "state", "live keys", "events/s", "vs own 10k", "p50 batch ms", "p99 batch ms",
                "state ms/batch", "state share", "chunks/batch", "cached/batch", "written/batch", "state bytes"):
        table.add_column(col, justify="left" if col in ("operator", "state") else "right")
    first: dict[tuple, float] = {}
    for label, r in rows:
        first.setdefault((r.operator, label), r.rate)
        table.add_row(r.operator, label, f"{r.live_keys:,}", f"{r.rate:,.0f}", f"{r.rate / first[r.operator, label]:.2f}×",
                      f"{r.p50_ms:,.0f}", f"{r.p99_ms:,.0f}", f"{r.state_ms:,.0f}", f"{100 * r.state_share:.0f} %",
                      f"{r.chunks:,.1f}", f"{r.cached:,.1f}", f"{r.written / 1024:,.0f} KiB",
                      f"{r.state_bytes / 2**20:,.1f} MiB")
    out.print(table)
    if record_figures:
        record_sparse([[r for label, r in rows if label == rows[0][0]]], table)
    return [r for _, r in rows]


def record_sparse(every: list[list[Row]], table: Table, row_id: str = "scale-sparse") -> None:
    """A sparse-keys row of bench/figures.yaml — ``scale-sparse`` (one process) or ``scale-sparse-spark``
    (end to end, its first row the identity's) — from one run's rows or several runs' (``every``):
    per operator its rate at the fewest keys and its ratio at each larger size, each the median
    over the runs; the target (≥ 0.8× at every one) met only when every run meets it."""
    from ctiflow.bench.figures import record, rows_of, thousands, verdict

    runs = [_ratios(rows) for rows in every]
    values, least = {}, []
    if "identity" in runs[0]:
        values["identity"] = thousands(statistics.median(run["identity"][0][1] for run in runs))
    for kind in ("count", "match", "bins"):
        values[f"{kind}_rate"] = thousands(statistics.median(run[kind][0][1] for run in runs))
        for i, name in enumerate(("1m", "3m"), 1):
            if i < len(runs[0][kind]):
                ratios = [run[kind][i][2] for run in runs]
                values[f"{kind}_{name}"] = f"{statistics.median(ratios):.2f}"
                least.append(min(ratios))
    values["met"] = verdict(bool(least) and min(least) >= 0.8)
    record(row_id, values, table=rows_of(table))


# -- the CTI delay: a batch's cost against how much the reorder buffer holds ---------------------------

@dataclass
class DelayRow:
    delay_s: int
    buffered: int          # events the reorder buffer held after the last measured batch
    p50_ms: float
    p99_ms: float
    written: float         # bytes written to the state store per batch (header compressed, parts, chunks)
    header: float          # the header's stored (compressed) bytes after a batch
    state_bytes: int


def measure_delay(delay_s: int, rate: int = 2_000, batch_s: int = 5, batches: int = 12, keys: int = 1_000,
                  seed: int = 7) -> DelayRow:
    """One key group at ``rate`` events/s of application time, a micro-batch every ``batch_s``
    seconds of it, ``cti.delay`` = ``delay_s``: the buffer is filled first (``delay_s / batch_s``
    batches), then ``batches`` are timed — restore the header, the batch, commit, the header
    compressed as the adapter stores it, with the cyclic GC paused as the adapter runs a key group.
    Events arrive up to 2 s out of order."""
    from ctiflow.jobs.core.alloc import cyclic_gc_paused
    from ctiflow.jobs.state.warm import WarmChunks

    plan = replace(plan_job(parse({
        "job": "delay", "kafka": {"bootstrap_servers": "x:1"},
        "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                     "time_field": "event_time", "cti": {"delay": f"{delay_s}s"}}],
        "operators": [{"kind": "count", "name": "per_account", "window": {"time": "1m"}, "output": "c"}]}, "delay")),
        key_groups=1)
    rng = random.Random(seed)
    per_batch = rate * batch_s
    fill = -(-delay_s // batch_s) + 1
    store: dict = {}
    stored = None
    cold = WarmChunks()  # a worker that never keeps a chunk decoded (nothing is sealed in it)
    times, written, headers = [], [], []
    i = 0
    for b in range(fill + batches):
        evs = []
        for _ in range(per_batch):
            t = T0 + i * 1000 // rate - rng.randrange(2000)
            evs.append(_event(f"k{rng.randrange(keys):05d}", t, i, rng))
            i += 1
        got = GroupInput.of("tx", {0: evs}, [0])
        with cyclic_gc_paused():
            started = time.perf_counter()
            rt = open_group(plan, stored, stored, store, cold)
            rt.run_batch(got)
            stored, _ = seal_group(rt, cold)
            took = time.perf_counter() - started
        if b >= fill:
            times.append(took)
            written.append(rt.counters.state_written)
            headers.append(len(stored))
    state_bytes = rt.counters.state_bytes
    buffered = rt.layer.buffered()
    ordered = sorted(times)
    return DelayRow(delay_s, buffered, statistics.median(ordered) * 1000,
                    ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000,
                    statistics.mean(written), statistics.mean(headers), state_bytes)


def delay_main(out: Console | None = None, delays=(10, 60, 180, 600), rate: int = 2_000,
               record_figures: bool = False) -> list[DelayRow]:
    """The ``--cti-delay`` table: one key group at a fixed rate, ``cti.delay`` from 10 s to 10
    minutes; the baseline is the 10 s row of the same run (target: p50 batch within 1.2× of it).
    ``record_figures``: write the ``scale-cti-delay`` row of bench/figures.yaml."""
    out = out or Console(width=200)
    rows = [measure_delay(d, rate) for d in delays]
    table = Table(title=f"ctiflow bench scale --cti-delay: one key group, {rate:,} events/s of application time, "
                        "a batch every 5 s of it, count per account (baseline: cti.delay 10 s)")
    for col in ("cti.delay", "buffered events", "p50 batch ms", "vs 10 s", "p99 batch ms", "written/batch",
                "header (stored)", "state bytes"):
        table.add_column(col, justify="right")
    base = rows[0].p50_ms
    for r in rows:
        table.add_row(f"{r.delay_s:,} s", f"{r.buffered:,}", f"{r.p50_ms:,.1f}", f"{r.p50_ms / base:.2f}×",
                      f"{r.p99_ms:,.1f}", f"{r.written / 1024:,.0f} KiB", f"{r.header / 1024:,.1f} KiB",
                      f"{r.state_bytes / 2**20:,.1f} MiB")
    out.print(table)
    if record_figures:
        record_delay(rows, table)
    return rows


def record_delay(rows: list[DelayRow], table: Table) -> None:
    """The ``scale-cti-delay`` row of bench/figures.yaml: the p50 batch at the shortest and the
    longest delay, their ratio, the buffer's size at each."""
    from ctiflow.bench.figures import record, rows_of, verdict

    base, last = rows[0], rows[-1]
    ratio = last.p50_ms / base.p50_ms
    record("scale-cti-delay", {"base": f"{base.p50_ms:,.1f}", "last": f"{last.p50_ms:,.1f}", "ratio": f"{ratio:.2f}",
                               "buffered_lo": f"{base.buffered / 1e3:,.0f}k",
                               "buffered_hi": f"{last.buffered / 1e6:,.1f}M", "met": verdict(ratio <= 1.2)},
           table=rows_of(table))


# -- end to end in Spark: the same rows through Kafka, the adapter and Spark's state store -----------

def _produce(bootstrap: str, topic: str, live: int) -> None:
    """``live`` keys with one event each (a first stage for match, an open bin for bins), 1 ms
    apart, over two partitions."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer

    kafka.create_topics(bootstrap, {topic: 2})
    records = ({"id": str(i), "account": f"k{i:08d}", "event_time": T0 + 1 + i, "type": "purchase", "amount": 1999.0,
                "currency": "EUR", "country": "DE", "merchant": None} for i in range(live))
    kafka.produce(bootstrap, topic, records, AvroSerializer("transaction"), "account",
                  partition_of=lambda i, _: i % 2, flush_timeout=120)


def _spark_row(spark, bootstrap: str, home: str, kind: str, live: int, measured: int, active: int,
               per_batch: int, conf: dict | None = None, tag: str = "", state: dict | None = None) -> Row:
    from ctiflow.bench.spark_jobs import PeakMemory, figures
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.checkpoint import ProgressLog, latest_query
    from ctiflow.jobs.driver.config import parse

    topic = f"scale-{kind}-{live}{tag}"
    _produce(bootstrap, topic, live)
    op = {**OPERATORS[kind], **({"output": f"{topic}-out"} if "output" in OPERATORS[kind] else {})}
    if kind == "bins":
        op["outputs"] = {"final": f"{topic}-out"}
    if kind == "match":
        op["timed_out"] = f"{topic}-timed-out"
    spec = {"job": f"scale-{kind}-{live}", "kafka": {"bootstrap_servers": bootstrap},
            "sources": [{"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account",
                         "time_field": "event_time", "measures": ["amount"], "max_offsets_per_trigger": per_batch,
                         "cti": {"delay": "5s", "flush_at_end": False}}],
            "operators": [op], "outputs": {"late": f"{topic}-late", "dead_letter": f"{topic}-dlq"},
            "spark": {"checkpoint": f"{home}/ck-{topic}"}, **({"state": state} if state else {})}
    cfg = parse(spec, topic)
    for k, v in (conf or {}).items():  # SQL confs, read when a query starts (e.g. RocksDB's)
        spark.conf.set(k, v)
    pipeline.run(cfg, until_end=True, spark=spark)                 # build the live keys
    _produce_more(bootstrap, topic, live, measured, active)
    spark.stop()  # a real restart: a new SparkContext, so new Python workers (CPython keeps its
    spark = pipeline.spark_session()  # high-water mark from the batches that built the keys)
    for k, v in (conf or {}).items():
        spark.conf.set(k, v)
    with PeakMemory(without_broker=True) as mem:
        summary = pipeline.run(cfg, until_end=True, spark=spark)   # restart: the measured batches
    f = figures(topic, summary.progress, mem.peak)
    mine = {p["batchId"] for p in summary.progress}
    per_batch_counters: dict[int, dict] = {}
    log = ProgressLog.of(cfg)
    for rec in latest_query(log.read()[0]):
        if rec["batch"] in mine:
            per_batch_counters[rec["batch"]] = rec
    recs = [per_batch_counters[b] for b in sorted(per_batch_counters)][1:] or list(per_batch_counters.values())
    state_s = sum(r.get("state_us", 0) for r in recs) / 1e6
    label = kind + "".join(f", {k} {v}" for k, v in (state or {}).items())
    row = Row(label, recs[-1].get("live_keys", 0) if recs else 0, f.events, f.seconds, f.p50_ms, f.p99_ms,
              1000 * state_s / max(len(recs), 1), state_s / f.seconds / 2 if f.seconds else 0.0,
              statistics.mean(r.get("state_written", 0) for r in recs) if recs else 0.0,
              recs[-1].get("state_bytes", 0) if recs else 0, f.peak_rss_mb, summary.first_batch_seconds or 0.0,
              chunks=statistics.mean(r.get("chunks_loaded", 0) for r in recs) if recs else 0.0,
              cached=statistics.mean(r.get("chunks_cached", 0) for r in recs) if recs else 0.0,
              caught=statistics.mean(r.get("chunks_caught_up", 0) for r in recs) if recs else 0.0,
              store_ms=statistics.mean(r.get("store_us", 0) for r in recs) / 1000 if recs else 0.0)
    kafka.delete_topics(bootstrap, [topic, *cfg.result_topics()])
    spark.stop()
    return row


def _produce_more(bootstrap: str, topic: str, live: int, measured: int, active: int | None, seed: int = 7) -> None:
    """``measured`` events after the live keys, over ``active`` of them (None: uniformly over every
    live key; amounts at random)."""
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer

    rng = random.Random(seed)
    hot = range(live) if active is None else rng.sample(range(live), min(active, live))
    records = ({"id": str(i), "account": f"k{hot[rng.randrange(len(hot))]:08d}", "event_time": T0 + 1 + i,
                "type": "purchase", "amount": float(rng.randrange(2000)), "currency": "EUR", "country": "DE",
                "merchant": None} for i in range(live, live + measured))
    kafka.produce(bootstrap, topic, records, AvroSerializer("transaction"), "account",
                  partition_of=lambda i, _: (live + i) % 2, flush_timeout=120)


def spark_main(out: Console | None = None, sizes=(10_000, 100_000, 1_000_000, 3_000_000), per_batch: int = 200_000,
               measured_batches: int = 5, active: int | None = 2_000, kinds=("count", "match", "bins"),
               conf: dict | None = None, tag: str = "", uncached=("bins",), record_figures: bool = False,
               state: dict | None = None) -> list[Row]:
    """Each row: a job builds ``live`` keys (one event each), stops, and is restarted (a new Spark
    session) on ``measured_batches`` batches of ``per_batch`` events over ``active`` of its keys
    (None: uniformly over every live key). ``conf``: SQL confs set on every session (e.g. RocksDB
    changelog checkpointing); ``state``: the jobs' ``state`` settings. ``uncached``: operators also
    run at the smallest and largest size with ``state.cache_chunks: 0`` (every touched chunk read
    from the state store and decoded, as without the worker's cache). ``record_figures``: write the
    ``scale`` row of bench/figures.yaml (needs count, match and bins)."""
    from ctiflow.bench.spark_jobs import bench_stack

    out = out or Console(width=200)
    rows = []
    from ctiflow.jobs.driver.pipeline import spark_session

    with bench_stack() as (bootstrap, spark, home):
        rows.append(_spark_row(spark, bootstrap, home, "identity", 10_000, per_batch * measured_batches, active,
                               per_batch))
        for kind in kinds:
            for live in sizes:
                rows.append(_spark_row(spark_session(), bootstrap, home, kind, live, per_batch * measured_batches,
                                       active, per_batch, conf, tag, state))
                out.print(f"  {kind} at {live:,} live keys: {rows[-1].rate:,.0f} events/s")
            if kind in uncached:
                for live in sorted({min(sizes), max(sizes)}):
                    rows.append(_spark_row(spark_session(), bootstrap, home, kind, live, per_batch * measured_batches,
                                           active, per_batch, conf, f"{tag}-uncached",
                                           {**(state or {}), "cache_chunks": 0}))
                    out.print(f"  {rows[-1].operator} at {live:,} live keys: {rows[-1].rate:,.0f} events/s")
    table = _spark_table(rows, per_batch, active)
    out.print(table)
    if record_figures:
        record_scale(rows, table)
    return rows


def _spark_table(rows: list[Row], per_batch: int, active: int | None) -> Table:
    over = "every live key" if active is None else f"{active:,} active keys"
    table = Table(title=f"ctiflow bench scale (Spark, end to end): {per_batch:,} events a micro-batch over {over} "
                        "after a restart (baseline: identity operator at 10k keys, same run)")
    for col in ("operator", "live keys", "events/s", "vs own 10k", "vs identity", "p50 batch ms", "p99 batch ms",
                "state ms/batch", "store ms/batch", "state share", "chunks/batch", "cached/batch", "caught up/batch", "written/batch",
                "state bytes", "peak PSS MB", "restart s"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    base = rows[0].rate
    first: dict[str, float] = {}
    for r in rows:
        first.setdefault(r.operator, r.rate)
        table.add_row(r.operator, f"{r.live_keys:,}", f"{r.rate:,.0f}", f"{r.rate / first[r.operator]:.2f}×",
                      f"{r.rate / base:.2f}×", f"{r.p50_ms:,.0f}", f"{r.p99_ms:,.0f}", f"{r.state_ms:,.0f}",
                      f"{r.store_ms:,.0f}", f"{100 * r.state_share:.0f} %", f"{r.chunks:,.0f}", f"{r.cached:,.0f}", f"{r.caught:,.0f}",
                      f"{r.written / 1024:,.0f} KiB",
                      f"{r.state_bytes / 2**20:,.1f} MiB", f"{r.peak_rss_mb:,.0f}", f"{r.restart_s:,.1f}")
    return table


#: micro-batches a sparse-keys row measures after its restart: its rate is over the second half
#: (:data:`ctiflow.bench.spark_jobs.WARM_UP`), 6 batches, after each of the two Python workers has
#: had a turn at each key group. Until 2026-12-02 it was 5 (a rate over 3 batches), in which a
#: worker's first turn at a group (its whole state read through Spark's state server) decided a row
#: by luck: rows moved 0.1–0.3× between runs.
SPARSE_MEASURED_BATCHES = 12


def spark_sparse_main(out: Console | None = None, sizes=(10_000, 1_000_000, 3_000_000), per_batch: int = 200_000,
                      chunk_keys: int | None = None, record_figures: bool = False, runs: int = 1) -> list[Row]:
    """Sparse keys end to end: :func:`spark_main` with every batch's events spread uniformly over
    every live key, at ``state.chunk_keys`` = ``chunk_keys`` and ``state.delta_share``
    :data:`SPARSE_DELTA_SHARE` (what the settings' descriptions advise for sparse keys),
    :data:`SPARSE_MEASURED_BATCHES` batches a row. ``runs``: the whole table that
    many times, then each row's ratio over the runs (:func:`spread_table`: a row moves by ±0.15×
    between runs here). ``record_figures``: write the ``scale-sparse-spark`` row of
    bench/figures.yaml (:func:`record_sparse`). → every run's rows, one run after another."""
    out = out or Console(width=200)
    every = [spark_main(out, sizes, per_batch, measured_batches=SPARSE_MEASURED_BATCHES, active=None, uncached=(),
                        state={"chunk_keys": chunk_keys or SPARSE_CHUNK_KEYS, "delta_share": SPARSE_DELTA_SHARE})
             for _ in range(runs)]
    table = spread_table(every) if runs > 1 else _spark_table(every[0], per_batch, None)
    if runs > 1:
        out.print(table)
    if record_figures:
        record_sparse(every, table, "scale-sparse-spark")
    return [r for rows in every for r in rows]


def _ratios(rows: list[Row]) -> dict[str, list[tuple[int, float, float]]]:
    """operator → its rows by live keys, each (live keys, events/s, ratio to its fewest keys)."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for r in sorted(rows, key=lambda r: r.live_keys):
        mine = out.setdefault(r.operator.split(",")[0], [])
        mine.append((r.live_keys, r.rate, r.rate / mine[0][1] if mine and mine[0][1] else 1.0))
    return out


def spread_table(every: list[list[Row]]) -> Table:
    """Each row of several runs of one table (the same rows each run): its events/s and ratio in
    each run (against its own fewest keys in that run), and the ratio's least, median and most."""
    runs = [_ratios(rows) for rows in every]
    table = Table(title=f"ctiflow bench scale --sparse over {len(every)} runs: each row's ratio to its own fewest "
                        "keys, in each run")
    for col in ("operator", "live keys", *(f"run {i + 1}" for i in range(len(every))), "least", "median", "most"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    for kind, mine in runs[0].items():
        for i, (live, _, _) in enumerate(mine):
            got = [run[kind][i][1:] for run in runs]
            ratios = [ratio for _, ratio in got]
            table.add_row(kind, f"{live:,}", *(f"{rate:,.0f} ({ratio:.2f}×)" for rate, ratio in got),
                          f"{min(ratios):.2f}×", f"{statistics.median(ratios):.2f}×", f"{max(ratios):.2f}×")
    return table


def record_scale(rows: list[Row], table: Table) -> None:
    """The ``scale`` row of bench/figures.yaml: each operator's rate at its fewest and most live
    keys (the cached rows), their ratio, and the state's share of a batch."""
    from ctiflow.bench.figures import record, rows_of, thousands, verdict

    values, ratios, shares = {}, [], {}
    for kind in ("count", "match", "bins"):
        mine = sorted((r for r in rows if r.operator == kind), key=lambda r: r.live_keys)
        lo, hi = mine[0], mine[-1]
        values.update({f"{kind}_lo": thousands(lo.rate), f"{kind}_hi": thousands(hi.rate),
                       f"{kind}_x": f"{hi.rate / lo.rate:.2f}"})
        ratios.append(hi.rate / lo.rate)
        shares[kind] = [r.state_share for r in mine]
    both = shares["count"] + shares["match"]
    values["share_cm"] = f"{100 * min(both):.0f}–{100 * max(both):.0f} %"
    values["share_bins"] = f"{100 * min(shares['bins']):.0f}–{100 * max(shares['bins']):.0f} %"
    values["met"] = verdict(min(ratios) >= 0.8)
    values["state_met"] = verdict(max(max(v) for v in shares.values()) <= 0.15)
    record("scale", values, table=rows_of(table))
