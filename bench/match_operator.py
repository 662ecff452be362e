"""Benchmark: the CEP match operator on four patterns, against Flink SQL ``MATCH_RECOGNIZE``.

Workload (:func:`make_records`): card transactions of ``keys`` accounts (1,000 by default), one
event per millisecond of application time over all accounts (so ≈ 1 event/s per account), in
event-time order, seeded and deterministic. Fields: ``account`` (the key), ``event_time``,
``type`` (purchase 55 %, withdrawal 15 %, refund 5 %, login_failed 15 %, login_ok 10 %),
``amount`` — the shape of ``schemas/transaction.avsc``.

The four patterns (:data:`PATTERNS`) are declarative dicts, defined once here: the operator
compiles them, and ``bench/match_flink.py`` renders the same dicts as ``MATCH_RECOGNIZE``:

* ``strict_sequence`` — two ``login_failed`` then a ``login_ok``, all strict (``next``);
* ``relaxed_one_or_more`` — a refund, ``followed_by`` one or more purchases over 100, then
  ``followed_by`` a withdrawal over 500; ``skip_to_next``, no window (each refund runs
  until a withdrawal completes it);
* ``followed_by_any`` — a purchase over 100 → ``followed_by_any`` another purchase over 100
  → ``followed_by_any`` a withdrawal of 1000 within 30 s, no skip: every such triple is a
  match, and every pair of large purchases is a partial match of its own — with n large
  purchases of an account in the window, ≈ n²/2 overlapping runs over n shared events;
* ``within`` — ``login_failed`` → ``followed_by`` ``login_ok`` → ``followed_by`` a
  withdrawal over 500, within 30 s, ``skip_past_last_event``.

Per pattern, over the same events:

* **operator alone** — each CTI step's events as typed columns, built before the clock starts,
  into :meth:`MatchOperator.process_columns`, ``advance_to`` after every ``cti_every`` events (as CTIs
  would), a final ``advance_to(+∞)``. Timed: exactly those calls (building every match record
  included). The input is frozen out of the cyclic GC (``gc.freeze``), as in the other
  operator benchmarks. Every ``sample_every`` events, untimed, the state is measured: bytes of
  ``snapshot()``, partial matches in flight, events stored in the shared buffers, and what
  a store without sharing would hold (the events of every partial match added up);
* **end to end, in process** — what one Spark micro-batch does in ``jobs/datapath/adapter.py``, without
  Spark or Kafka: the records Avro-encoded up front (the producer's work, untimed), then per
  micro-batch of ``cti_every`` records and per key group (``crc32(key) mod G``): restore the
  group's :class:`~ctiflow.jobs.core.runtime.GroupRuntime` from its snapshot, apply the CTI (the watermark
  of the previous batches), decode and offer the records, snapshot, Avro-encode the outputs;
  a final flush to +∞. Matches must equal the operator's;
* **Flink** — ``bench/match_flink.py`` run with the PyFlink venv (``bench/setup_flink.sh``)
  on the same events written to a CSV file; see that file for what its timing includes.

Wall-clock figures are for people; the smoke test looks only at matches and state figures.

    python -m ctiflow.bench.match_operator                   # 1M events, with Flink if installed
    python -m ctiflow.bench.match_operator --events 200000 --no-flink
"""

from __future__ import annotations

from ctiflow.jobs.driver.planner import plan_job

import argparse
import csv
import gc
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
import zlib
from bisect import bisect
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FLINK_SCRIPT = Path(__file__).resolve().parent / "match_flink.py"
DEFAULT_FLINK_PYTHON = REPO / ".venv-flink" / "bin" / "python"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

TYPES = ("purchase", "withdrawal", "refund", "login_failed", "login_ok")
_CUMULATIVE = (0.55, 0.70, 0.75, 0.90, 1.0)

#: The patterns, once, as declarative dicts (``ctiflow.operators.cep.declarative``). Keep them literals:
#: ``bench/match_flink.py`` reads this assignment with ``ast.literal_eval`` (the Flink venv has
#: neither this project nor its dependencies installed).
PATTERNS = {
    "strict_sequence": {
        "name": "strict_sequence",
        "skip": "skip_past_last_event",
        "stages": [
            {"name": "a", "where": "type == 'login_failed'"},
            {"name": "b", "contiguity": "next", "where": "type == 'login_failed'"},
            {"name": "c", "contiguity": "next", "where": "type == 'login_ok'"},
        ],
    },
    "relaxed_one_or_more": {
        "name": "relaxed_one_or_more",
        "skip": "skip_to_next",
        "stages": [
            {"name": "a", "where": "type == 'refund'"},
            {"name": "b", "contiguity": "followed_by", "where": "type == 'purchase' and amount > 100",
             "quantifier": "one_or_more"},
            {"name": "c", "contiguity": "followed_by", "where": "type == 'withdrawal' and amount > 500"},
        ],
    },
    "followed_by_any": {
        "name": "followed_by_any",
        "within_ms": 30_000,
        "stages": [
            {"name": "a", "where": "type == 'purchase' and amount > 100"},
            {"name": "b", "contiguity": "followed_by_any", "where": "type == 'purchase' and amount > 100"},
            {"name": "c", "contiguity": "followed_by_any", "where": "type == 'withdrawal' and amount >= 1000"},
        ],
    },
    "within": {
        "name": "within",
        "within_ms": 30_000,
        "skip": "skip_past_last_event",
        "stages": [
            {"name": "a", "where": "type == 'login_failed'"},
            {"name": "b", "contiguity": "followed_by", "where": "type == 'login_ok'"},
            {"name": "c", "contiguity": "followed_by", "where": "type == 'withdrawal' and amount > 500"},
        ],
    },
}


#: Patterns whose MATCH_RECOGNIZE form is the same NFA (Flink's translation: strict contiguity;
#: the relaxed ones have no exact SQL form), run as ``sql`` operators beside their Pattern API form.
SQL_FORMS = {
    "strict_sequence": """SELECT * FROM events MATCH_RECOGNIZE (
  PARTITION BY account ORDER BY event_time
  MEASURES FIRST(A.event_time) AS first_time, LAST(C.event_time) AS last_time
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A B C)
  DEFINE A AS A.type = 'login_failed', B AS B.type = 'login_failed', C AS C.type = 'login_ok'
)""",
}


#: The hot key: ``examples/recognize/two-countries.sql`` (a purchase, one in another country, any
#: rows, a large purchase, within ten minutes) on one account whose purchases (100 ms apart,
#: countries alternating, none large) each start a run that waits the whole window.
HOT_KEY_SQL_FILE = REPO / "examples" / "recognize" / "two-countries.sql"
#: Its Pattern API form: ``X*?`` (any rows) before LARGE is relaxed contiguity. A literal: see PATTERNS.
HOT_KEY_PATTERN = {
    "name": "two_countries", "skip": "skip_past_last_event", "within_ms": 600_000,
    "stages": [
        {"name": "HOME", "where": "type == 'purchase'"},
        {"name": "ABROAD", "contiguity": "next", "where": "type == 'purchase' and country != last('HOME').country"},
        {"name": "LARGE", "contiguity": "followed_by", "where": "type == 'purchase' and amount > 1000"},
    ],
}
HOT_KEY_EVENTS = (200, 600, 1_800)


# ---------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------


def make_records(events: int, keys: int = 1_000, seed: int = 7, start_ms: int = T0,
                 step_ms: int = 1) -> list[dict[str, Any]]:
    """Transactions in event-time order (one every ``step_ms``), shaped like the
    ``transaction`` schema; the same arguments always give the same records."""
    rng = random.Random(seed)
    accounts = [f"acct-{i:04d}" for i in range(keys)]
    rand, randrange, lognorm = rng.random, rng.randrange, rng.lognormvariate
    out = []
    for i in range(events):
        kind = TYPES[bisect(_CUMULATIVE, rand())]
        if kind == "purchase":
            amount = round(lognorm(4.0, 1.3), 2)  # median ≈ 55, ≈ 25 % over 100
        elif kind == "withdrawal":
            amount = float(20 * (1 + randrange(50)))  # 20 … 1000, ≈ 50 % over 500
        elif kind == "refund":
            amount = round(lognorm(3.5, 1.0), 2)
        else:
            amount = 0.0
        out.append({"id": f"t{i:08d}", "account": accounts[randrange(keys)],
                    "event_time": start_ms + i * step_ms, "type": kind, "amount": amount,
                    "currency": "EUR", "country": "DE", "merchant": None})
    return out


def hot_key_records(n: int, start_ms: int = T0) -> list[dict[str, Any]]:
    """One account's ``n`` purchases of 10.00, 100 ms apart, countries alternating FR / DE."""
    return [{"id": f"h{i:06d}", "account": "acct-hot", "event_time": start_ms + 100 * i, "type": "purchase",
             "amount": 10.0, "currency": "EUR", "country": "DE" if i % 2 else "FR", "merchant": None}
            for i in range(n)]


def to_events(records: list[dict[str, Any]]) -> list[Any]:
    from ctiflow.operators.time import Event

    return [Event(key=r["account"], start=r["event_time"], end=r["event_time"], fields=r,
                  partition=0, offset=i, stream="transactions") for i, r in enumerate(records)]


def write_csv(records: list[dict[str, Any]], path: str | Path, country: bool = False) -> Path:
    """The columns Flink reads: account, ts (ms), type, amount (``repr`` keeps doubles exact)
    and with ``country`` the country (the hot key's query reads it)."""
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        for r in records:
            w.writerow((r["account"], r["event_time"], r["type"], repr(r["amount"]),
                        *((r["country"],) if country else ())))
    return path


# ---------------------------------------------------------------------------------------------
# The operator alone
# ---------------------------------------------------------------------------------------------


def state_figures(op: Any) -> dict[str, int]:
    """What the operator holds now: snapshot bytes, partial matches, stored events and nodes of
    the shared buffers, and the events a store without sharing would hold (every partial match
    with its own copy of its events)."""
    from ctiflow.operators.cep.nfa.contiguous_buffer import ContiguousBuffer

    partial = held = stored = nodes = copies = 0
    event_bytes = run_bytes = 0
    dumps = pickle.dumps
    op._decode_all()  # restored keys are decoded on first use
    for state in op._states.values():  # inspection only (the operator exposes counts, not paths)
        buffer = state.buffer
        stored += len(buffer.events)
        held += len(state.completed_matches)
        runs = ([tuple(cs) for cs in state.partial_matches.items()],
                [tuple(cs) for cs in state.completed_matches.items()])
        if isinstance(buffer, ContiguousBuffer):  # runs are paths: no nodes
            _tag, _first, plain_events, _locks, _counts = buffer.to_plain()
            plain_nodes = []
        else:
            plain_events, plain_nodes, _counts = buffer.to_plain()
        nodes += len(plain_nodes)
        event_bytes += len(dumps(plain_events, protocol=pickle.HIGHEST_PROTOCOL))
        run_bytes += len(dumps((plain_nodes, *runs), protocol=pickle.HIGHEST_PROTOCOL))
        for cs in state.partial_matches.items():
            if cs.start_event_id is None:
                continue
            partial += 1
            paths = buffer.extract_patterns(cs.previous_entry, cs.version)
            if paths:
                copies += sum(len(ids) for ids in paths[0].values())
    return {"snapshot_bytes": len(op.snapshot()), "partial_matches": partial,
            "completed_held": held, "shared_events": stored, "buffer_nodes": nodes,
            "unshared_events": copies, "keys_in_flight": op.keys_in_flight,
            "event_bytes": event_bytes, "run_bytes": run_bytes}


def typed_columns(events: list[Any]):
    """``events`` as :class:`~ctiflow.operators.columns.EventColumns` with typed NumPy columns, as the
    job's packs give them (Arrow → NumPy: doubles as float64, longs as int64, strings as objects)."""
    import numpy as np

    from ctiflow.operators.columns import EventColumns

    cols = EventColumns.from_events(events)
    for name, values in list(cols.fields.items()):
        kinds = set(map(type, values.tolist()))
        if kinds == {float}:
            cols.fields[name] = values.astype(np.float64)
        elif kinds == {int}:
            cols.fields[name] = values.astype(np.int64)
    return cols


def run_operator(spec: dict[str, Any] | None, events: list[Any], *, cti_every: int = 10_000,
                 sample_every: int = 100_000, sql: str | None = None) -> dict[str, Any]:
    """Feed ``events`` through one :class:`MatchOperator` as the job does — each CTI's events
    as typed columns (:func:`typed_columns`, built before the clock starts, as the job's packs
    arrive) into ``process_columns``, which builds the :class:`Event` s of the rows it keeps —
    and time only its calls."""
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
    from ctiflow.operators.time import CTI_INFINITY

    op = MatchOperator(MatchSettings(pattern=spec, emit_timed_out=False, sql=sql))
    process, advance = op.process_columns, op.advance_to
    counts = {"match": 0, "timed_out": 0}
    peak: dict[str, int] = {}
    at_peak: dict[str, int] = {}  # the whole sample with the largest snapshot
    samples = 0
    next_sample = sample_every
    elapsed = 0.0
    n = len(events)
    gc.collect()
    gc.freeze()
    try:
        for lo in range(0, n, cti_every):
            chunk = events[lo: lo + cti_every]
            columns = typed_columns(chunk)
            produced = 0
            t0 = time.perf_counter()
            for _row, out in process(columns):
                produced += len(out)
            out = advance(chunk[-1].start)
            elapsed += time.perf_counter() - t0
            counts["match"] += produced
            for o in out:
                counts[o.role] = counts.get(o.role, 0) + 1
            if lo + len(chunk) >= next_sample or lo + len(chunk) >= n:
                next_sample += sample_every
                samples += 1
                figures = state_figures(op)
                for k, v in figures.items():
                    if v > peak.get(k, -1):
                        peak[k] = v
                if figures["snapshot_bytes"] >= at_peak.get("snapshot_bytes", -1):
                    at_peak = figures
        t0 = time.perf_counter()
        out = advance(CTI_INFINITY)
        elapsed += time.perf_counter() - t0
        for o in out:
            counts[o.role] = counts.get(o.role, 0) + 1
    finally:
        gc.unfreeze()
    return {"events": n, "seconds": elapsed, "events_per_s": n / elapsed if elapsed else 0.0,
            "matches": counts["match"], "timed_out": counts.get("timed_out", 0),
            "state_samples": samples, "peak": peak, "at_peak": at_peak,
            "final_state_bytes": len(op.snapshot())}


def run_hot_key(sizes: tuple[int, ...] = HOT_KEY_EVENTS, *, flink: bool = True,
                flink_timeout: float = 600) -> list[dict[str, Any]]:
    """Per size: the hot key through the SQL operator and the Pattern API operator (the rows as one
    release into ``process_columns``, timed; the state = the key's snapshot bytes after it) and, with
    PyFlink installed, Flink's MATCH_RECOGNIZE on the same rows (net of reading them; after a
    size that fails or times out, larger ones are not tried)."""
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings

    sql = HOT_KEY_SQL_FILE.read_text()
    python = flink_python() if flink else None
    out = []
    for n in sizes:
        records = hot_key_records(n)
        columns = typed_columns(to_events(records))
        row: dict[str, Any] = {"events": n}
        for form, settings in (("sql", MatchSettings(pattern=None, sql=sql, emit_timed_out=False)),
                               ("pattern_api", MatchSettings(pattern=HOT_KEY_PATTERN, emit_timed_out=False))):
            op = MatchOperator(settings)
            gc.collect()
            t0 = time.perf_counter()
            op.process_columns(columns)
            seconds = time.perf_counter() - t0
            row[form] = {"seconds": seconds, "state_bytes": len(op.snapshot()),
                         "partial_matches": op.partial_match_count(), "buffered": op.buffered_event_count()}
        if python is not None and not any("error" in (r.get("flink") or {}) for r in out):
            with tempfile.TemporaryDirectory(prefix="ctiflow-bench-hot-") as tmp:
                path = write_csv(records, Path(tmp) / "hot.csv", country=True)
                row["flink"] = run_flink(python, path, "hot_key", timeout=flink_timeout)
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------
# End to end, in process (what the Spark adapter does per micro-batch, without Spark/Kafka)
# ---------------------------------------------------------------------------------------------


def job_config(name: str, spec: dict[str, Any], key_groups: int) -> dict[str, Any]:
    return {
        "job": f"bench-match-{name}".replace("_", "-"),
        "sources": [{"name": "transactions", "topic": "bench-transactions", "schema": "transaction",
                     "key_field": "account", "time_field": "event_time", "cti": {"delay": 0}}],
        "operators": [{"kind": "match", "name": name, "pattern": spec, "output": "bench-matches"}],
        "spark": {"key_groups": key_groups},
    }


def encode_records(records: list[dict[str, Any]]) -> list[bytes]:
    from ctiflow.jobs.avro.serde import AvroSerializer

    encode = AvroSerializer("transaction")
    return [encode(r) for r in records]


def run_end_to_end(name: str, spec: dict[str, Any], records: list[dict[str, Any]],
                   payloads: list[bytes], *, cti_every: int = 10_000,
                   key_groups: int = 8) -> dict[str, Any]:
    """Decode → time layer → operator → snapshot → encode, per micro-batch and key group."""
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.core.rows import Control, GroupInput
    from ctiflow.jobs.core.runtime import GroupRuntime
    from ctiflow.jobs.avro.serde import AvroDeserializer, AvroSerializer
    from ctiflow.operators.columns import EventColumns
    from ctiflow.operators.time import Event

    cfg = parse(job_config(name, spec, key_groups))
    plan = plan_job(cfg)
    store = plan.schema_store()
    encoders = {topic: AvroSerializer(schema, store=store)
                for topic, schema in cfg.result_topics().items()}
    decode = AvroDeserializer("transaction")
    keys = [r["account"] for r in records]
    times = [r["event_time"] for r in records]
    group_of = {k: zlib.crc32(k.encode()) % key_groups for k in set(keys)}
    blobs: dict[int, bytes] = {}
    sizes: dict[int, int] = {}
    peak_state = 0
    roles: dict[str, int] = {}
    out_bytes = 0

    def step(group: int, rows: list[int], top: int, flush: bool) -> None:
        nonlocal out_bytes
        blob = blobs.get(group)
        runtime = GroupRuntime(plan) if blob is None else GroupRuntime(plan, blob)
        events = [Event(keys[i], times[i], times[i], decode(payloads[i]), 0, i, "transactions") for i in rows]
        got = GroupInput([EventColumns.from_events(events)] if events else [], [("transactions", 0, top)],
                         [("transactions", Control([0], [], flush))], [])
        out = runtime.run_batch(got).outputs
        blob = blobs[group] = runtime.snapshot()
        sizes[group] = len(blob)
        for topic, o, _k in out:
            out_bytes += len(encoders[topic](o.record))
            roles[o.role] = roles.get(o.role, 0) + 1

    n = len(records)
    gc.collect()
    gc.freeze()
    try:
        t0 = time.perf_counter()
        for lo in range(0, n, cti_every):
            hi = min(n, lo + cti_every)
            by_group: dict[int, list[int]] = {g: [] for g in range(key_groups)}
            for i in range(lo, hi):
                by_group[group_of[keys[i]]].append(i)
            top = max(times[lo:hi])
            for g, rows in by_group.items():  # every group, every batch: as the control rows call them
                step(g, rows, top, hi == n)
            peak_state = max(peak_state, sum(sizes.values()))
        elapsed = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    return {"events": n, "seconds": elapsed, "events_per_s": n / elapsed if elapsed else 0.0,
            "matches": roles.get("match", 0), "late": roles.get("late", 0), "roles": roles,
            "output_bytes": out_bytes, "key_groups": key_groups,
            "peak_state_bytes": peak_state}


# ---------------------------------------------------------------------------------------------
# Flink (a subprocess in the PyFlink venv)
# ---------------------------------------------------------------------------------------------


def flink_python() -> Path | None:
    """The PyFlink venv's interpreter (``$CTIFLOW_FLINK_PYTHON`` or ``.venv-flink``), if any."""
    configured = os.environ.get("CTIFLOW_FLINK_PYTHON")
    candidate = Path(configured) if configured else DEFAULT_FLINK_PYTHON
    if not candidate.exists():
        return None
    probe = subprocess.run([str(candidate), "-c", "import pyflink"], capture_output=True)
    return candidate if probe.returncode == 0 else None


def run_flink(python: Path, events_file: Path, name: str, *, parallelism: int = 1,
              timeout: float = 1800) -> dict[str, Any]:
    cmd = [str(python), str(FLINK_SCRIPT), "--events-file", str(events_file), "--pattern", name,
           "--parallelism", str(parallelism)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# The whole benchmark
# ---------------------------------------------------------------------------------------------


def run(events: int = 1_000_000, *, keys: int = 1_000, step_ms: int = 1, cti_every: int = 10_000,
        sample_every: int | None = None, key_groups: int = 8, seed: int = 7,
        patterns: list[str] | None = None, flink: bool = True, end_to_end: bool = True,
        flink_parallelism: int = 1, hot_key: tuple[int, ...] | None = HOT_KEY_EVENTS) -> dict[str, Any]:
    """Every pattern through the operator alone, end to end and (if installed) Flink; then the
    hot key (:func:`run_hot_key`)."""
    names = list(PATTERNS) if patterns is None else patterns
    unknown = [p for p in names if p not in PATTERNS]
    if unknown:
        raise SystemExit(f"Unknown pattern(s) {', '.join(unknown)}. Valid choices are: "
                         f"{', '.join(PATTERNS)}.")
    if sample_every is None:  # about 10 samples, on CTI boundaries
        sample_every = max(cti_every, (events // 10 // cti_every) * cti_every)
    records = make_records(events, keys=keys, seed=seed, step_ms=step_ms)
    evs = to_events(records)
    result: dict[str, Any] = {"events": events, "keys": keys, "step_ms": step_ms,
                              "cti_every": cti_every,
                              "sample_every": sample_every, "key_groups": key_groups,
                              "patterns": {}, "flink": None}
    python = flink_python() if flink else None
    if flink:
        result["flink"] = {"installed": python is not None, "python": str(python) if python else None,
                           "parallelism": flink_parallelism}
    payloads = encode_records(records) if end_to_end else []
    tmp = tempfile.TemporaryDirectory(prefix="ctiflow-bench-match-") if python else None
    try:
        events_file = write_csv(records, Path(tmp.name) / "events.csv") if tmp else None
        for name in names:
            spec = PATTERNS[name]
            row: dict[str, Any] = {"operator": run_operator(spec, evs, cti_every=cti_every,
                                                            sample_every=sample_every)}
            if name in SQL_FORMS:  # the same NFA from MATCH_RECOGNIZE
                row["sql"] = run_operator(None, evs, cti_every=cti_every, sample_every=sample_every,
                                          sql=SQL_FORMS[name])
            if end_to_end:
                row["end_to_end"] = run_end_to_end(name, spec, records, payloads,
                                                   cti_every=cti_every, key_groups=key_groups)
            if python is not None and events_file is not None:
                row["flink"] = run_flink(python, events_file, name, parallelism=flink_parallelism)
            result["patterns"][name] = row
    finally:
        if tmp is not None:
            tmp.cleanup()
    if hot_key:
        result["hot_key"] = run_hot_key(hot_key, flink=flink)
    return result


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------


def _rate(x: float | None) -> str:
    return "-" if not x else f"{x:,.0f}"


def _flink_cells(f: dict[str, Any] | None, installed: bool) -> tuple[str, str, float | None, str]:
    """(events/s, events/s net of the scan, the rate the ratio uses, matches)."""
    if not installed:
        return "not installed", "-", None, "-"
    if f is None:
        return "-", "-", None, "-"
    if "error" in f:
        return "error", "-", None, "-"
    if not f.get("expressible", True):
        return "n/a", "n/a", None, "n/a"
    net = f.get("net_events_per_s")
    return _rate(f.get("events_per_s")), _rate(net), net or f.get("events_per_s"), f"{f['matches']:,}"


def tables(r: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    flink = r.get("flink")
    installed = bool(flink and flink["installed"])
    t = Table(title=f"ctiflow bench match: {r['events']:,} events, {r['keys']:,} keys, "
                    f"a CTI every {r['cti_every']:,} events")
    for col in ("pattern", "events", "ctiflow ev/s (operator)", "same as SQL (ev/s, matches)",
                "ctiflow ev/s (end to end)", "Flink ev/s", "Flink ev/s (net of scan)", "ratio ctiflow/Flink",
                "matches ctiflow / Flink", "peak state bytes", "shared events / partial matches"):
        t.add_column(col, justify="left" if col == "pattern" else "right")
    for name, row in r["patterns"].items():
        op = row["operator"]
        e2e = row.get("end_to_end")
        f_rate, f_net, f_ratio_base, f_matches = _flink_cells(row.get("flink"), installed)
        if flink is None:
            f_rate = f_net = f_matches = "skipped"
        ratio = f"{op['events_per_s'] / f_ratio_base:.2f}×" if f_ratio_base else "-"
        p = op["at_peak"]
        sql = row.get("sql")
        t.add_row(name, f"{op['events']:,}", _rate(op["events_per_s"]),
                  f"{_rate(sql['events_per_s'])} ({sql['events_per_s'] / op['events_per_s']:.2f}×), "
                  f"{sql['matches']:,}" if sql else "no exact SQL form",
                  _rate(e2e["events_per_s"]) if e2e else "-", f_rate, f_net, ratio,
                  f"{op['matches']:,} / {f_matches}", f"{op['peak'].get('snapshot_bytes', 0):,}",
                  f"{p.get('shared_events', 0):,} / {p.get('partial_matches', 0):,}")
    s = Table(title="state of the operator at its largest snapshot (sampled every "
                    f"{r['sample_every']:,} events)")
    for col in ("pattern", "snapshot bytes", "shared events stored", "partial matches",
                "partial matches / shared event", "events if unshared",
                "event bytes (stored once)", "run bytes (nodes, states)", "run bytes / partial match",
                "end-to-end peak state bytes"):
        s.add_column(col, justify="left" if col == "pattern" else "right")
    for name, row in r["patterns"].items():
        p = row["operator"]["at_peak"]
        shared, partial = p.get("shared_events", 0), p.get("partial_matches", 0)
        e2e = row.get("end_to_end")
        s.add_row(name, f"{p.get('snapshot_bytes', 0):,}", f"{shared:,}", f"{partial:,}",
                  f"{partial / shared:.1f}" if shared else "-",
                  f"{p.get('unshared_events', 0):,}", f"{p.get('event_bytes', 0):,}",
                  f"{p.get('run_bytes', 0):,}",
                  f"{p['run_bytes'] / partial:,.0f}" if partial else "-",
                  f"{e2e['peak_state_bytes']:,}" if e2e else "-")
    tables_ = [t, s]
    if r.get("hot_key"):
        tables_.append(hot_key_table(r["hot_key"], installed if flink is not None else None))
    return tables_


def hot_key_table(rows: list[dict[str, Any]], flink_installed: bool | None) -> Any:
    """One row per size: time and state of the SQL form, the Pattern API form, their ratio, Flink."""
    from rich.table import Table

    t = Table(title="hot key: one account, a purchase every 100 ms, countries alternating, no large purchase "
                    "(examples/recognize/two-countries.sql)")
    for col in ("events", "SQL s", "SQL state bytes", "SQL partial matches", "Pattern API s",
                "Pattern API state bytes", "SQL / Pattern API (time, state)", "Flink s (net of scan)"):
        t.add_column(col, justify="right")
    for row in rows:
        q, p = row["sql"], row["pattern_api"]
        f = row.get("flink")
        if flink_installed is None:
            flink_cell = "skipped"
        elif not flink_installed:
            flink_cell = "not installed"
        elif f is None:
            flink_cell = "not tried (a smaller size failed)"
        elif "error" in f:
            flink_cell = f["error"][:40]
        else:
            flink_cell = f"{f['seconds'] - f['scan_seconds']:.1f}"
        t.add_row(f"{row['events']:,}", f"{q['seconds']:.2f}", f"{q['state_bytes']:,}", f"{q['partial_matches']:,}",
                  f"{p['seconds']:.2f}", f"{p['state_bytes']:,}",
                  f"{q['seconds'] / p['seconds']:.2f}× / {q['state_bytes'] / p['state_bytes']:.2f}×", flink_cell)
    return t


def notes(r: dict[str, Any]) -> list[str]:
    out = []
    flink = r.get("flink")
    if flink is None:
        out.append("Flink: skipped (--no-flink)")
    elif not flink["installed"]:
        out.append("Flink: not installed — run bench/setup_flink.sh")
    else:
        out.append(f"Flink: PyFlink MATCH_RECOGNIZE, streaming mode, parallelism "
                   f"{flink['parallelism']}, CSV file source. 'Flink events/s' = events / "
                   "(query submitted → last result row: planning, job start, CSV parsing, "
                   "watermark sorting and matching; JVM start-up excluded); 'net of scan' "
                   "subtracts the same job reading and counting the CSV file. The ratio uses "
                   "the net figure. Relaxed contiguity is emulated (see bench/match_flink.py).")
        for name, row in r["patterns"].items():
            f = row.get("flink") or {}
            if "error" in f:
                out.append(f"Flink {name}: {f['error']}")
            elif not f.get("expressible", True):
                out.append(f"Flink {name}: n/a — {f.get('reason')}")
    for name, row in r["patterns"].items():
        e2e = row.get("end_to_end")
        if e2e and e2e["matches"] != row["operator"]["matches"]:
            out.append(f"{name}: end to end found {e2e['matches']:,} matches, the operator "
                       f"{row['operator']['matches']:,}")
    out.append("End to end = the adapter's per-micro-batch work without Spark/Kafka: Avro decode, "
               f"time layer, operator, snapshot/restore of {r['key_groups']} key groups, "
               "Avro encode of the results. Its state includes the reorder buffer, which holds a "
               "micro-batch of events until the next CTI releases them.")
    out.append("State: 'shared events' are stored once per key however many partial matches use "
               "them; a partial match costs only its computation state and buffer edges ('run "
               "bytes / partial match'); 'events if unshared' is what one copy per partial match "
               "would store.")
    return out


def record_match(r: dict[str, Any]) -> None:
    """The ``match-*`` rows of bench/figures.yaml from a full run with Flink (every pattern, the
    SQL form, the hot key): rates, ratios to Flink and to the Pattern API form, the hot key's state."""
    from ctiflow.bench.figures import record, thousands, verdict

    rates = {name: row["operator"]["events_per_s"] for name, row in r["patterns"].items()}
    ratios = {name: rates[name] / base for name, row in r["patterns"].items()
              if (base := _flink_cells(row.get("flink"), True)[2])}
    record("match-patterns", {"lo": thousands(min(rates.values())), "hi": thousands(max(rates.values())),
                              "ratio_lo": f"{min(ratios.values()):.2f}", "ratio_hi": f"{max(ratios.values()):.2f}",
                              "strict": f"{ratios['strict_sequence']:.2f}",
                              "met": verdict(min(ratios.values()) >= 1.0)})
    name, sql = next((n, row["sql"]) for n, row in r["patterns"].items() if row.get("sql"))
    ratio = sql["events_per_s"] / rates[name]
    record("match-sql", {"sql": thousands(sql["events_per_s"]), "api": thousands(rates[name]),
                         "ratio": f"{ratio:.2f}", "met": verdict(ratio >= 0.9)})
    big = r["hot_key"][-1]
    q, p = big["sql"], big["pattern_api"]

    def flink(row: dict[str, Any]) -> str:
        f = row.get("flink")
        if f is None:
            return f"{row['events']:,} not tried"
        if "error" in f:
            return f"{row['events']:,} not done"
        return f"{row['events']:,} rows in {f['seconds'] - f['scan_seconds']:,.0f} s (ours {row['sql']['seconds']:.2f} s)"

    record("match-hot-key", {"events": f"{big['events']:,}", "sql_s": f"{q['seconds']:.2f}",
                             "sql_kb": f"{q['state_bytes'] / 1e3:,.0f}", "api_s": f"{p['seconds']:.2f}",
                             "api_kb": f"{p['state_bytes'] / 1e3:,.0f}",
                             "time_x": f"{q['seconds'] / p['seconds']:.2f}",
                             "state_x": f"{q['state_bytes'] / p['state_bytes']:.2f}",
                             "flink": ", ".join(flink(row) for row in r["hot_key"]),
                             "met": verdict(q["seconds"] <= 2 * p["seconds"])})


def main(argv: list[str] | int | None = None, *, record_figures: bool = False) -> dict[str, Any]:
    """``record_figures``: write the ``match-*`` rows of bench/figures.yaml when Flink ran beside
    every pattern and the hot key (``bash bench/setup_flink.sh``); otherwise they are left as they are."""
    # ``bench.run_benchmarks`` passes the --events figure itself (an int or None).
    if argv is None or isinstance(argv, int):
        argv = [] if argv is None else ["--events", str(argv)]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--step-ms", type=int, default=1, help="ms of application time between events")
    parser.add_argument("--cti-every", type=int, default=10_000)
    parser.add_argument("--key-groups", type=int, default=8)
    parser.add_argument("--pattern", action="append", choices=list(PATTERNS),
                        help="only this pattern (repeatable)")
    parser.add_argument("--no-flink", action="store_true", help="skip the Flink comparison")
    parser.add_argument("--no-end-to-end", action="store_true", help="operator alone only")
    parser.add_argument("--flink-parallelism", type=int, default=1)
    parser.add_argument("--no-hot-key", action="store_true", help="skip the hot-key rows")
    parser.add_argument("--json", type=Path, help="also write the raw figures to this file")
    args = parser.parse_args(argv)
    r = run(args.events, keys=args.keys, step_ms=args.step_ms, cti_every=args.cti_every, key_groups=args.key_groups,
            patterns=args.pattern, flink=not args.no_flink, end_to_end=not args.no_end_to_end,
            flink_parallelism=args.flink_parallelism, hot_key=None if args.no_hot_key else HOT_KEY_EVENTS)
    from rich.console import Console

    console = Console(width=200)
    for table in tables(r):
        console.print(table)
    for line in notes(r):
        console.print(line)
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    if record_figures and (r.get("flink") or {}).get("installed") and r.get("hot_key") and not args.pattern:
        record_match(r)
    elif record_figures:
        console.print("bench/figures.yaml: the match rows are left as they are (they need Flink beside every "
                      "pattern and the hot key: bash bench/setup_flink.sh)")
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
