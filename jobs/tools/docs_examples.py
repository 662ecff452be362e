"""Worked examples for the docs, run through the real job runtime when the docs build
(``<!-- example: NAME -->`` in a page, ``mkdocs_hooks.py``), so a page's outputs cannot drift
from what ctiflow does.

An example is a job (the YAML a user writes, one source) and the records of a few
micro-batches, each a mapping partition → records in offset order. It runs as one key group
runs a micro-batch in Spark (:meth:`GroupRuntime.run_batch`: the partitions' frontiers, then
the CTI the slowest partition allows, then its outputs), and is rendered as the job file, the
input records with the CTI each batch reached, and every record the job wrote, in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import GroupInput
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.events import CTI_INFINITY, CTI_NONE, Event, OutputBatch

T0 = 0  # examples count application time in ms from 0: "12000" reads as 12 s


@dataclass(frozen=True)
class Example:
    """``job``: the job file (without ``kafka``); ``batches``: per micro-batch, partition →
    records; ``show``: per output topic the record fields the table shows (all when absent);
    the last batch ends the bounded input (its CTI is +∞, as ``ctiflow run --until-end`` gives)."""

    job: dict
    batches: list[dict[int, list[dict]]]
    show: dict[str, tuple[str, ...]] = field(default_factory=dict)
    flush: bool = True


def _ms(v: Any) -> str:
    if v == CTI_INFINITY:
        return "+∞"
    if v == CTI_NONE:
        return "none yet"
    return f"{v / 1000:g} s" if isinstance(v, int) else str(v)


def _streams(ex: Example, batch: dict) -> dict[str, dict[int, list[dict]]]:
    """A batch as stream → partition → records (a one-source example writes partition → records)."""
    if all(isinstance(k, int) for k in batch):
        return {ex.job["sources"][0]["name"]: batch}
    return batch


def run(ex: Example) -> list[tuple[int, int, list[tuple[str, dict]]]]:
    """→ per micro-batch: its number, the CTI it ended with and the records written (topic, record)."""
    cfg = parse({"job": "example", "kafka": {"bootstrap_servers": "localhost:9092"}, **ex.job}, "example")
    plan = plan_job(cfg)
    sources = {s.name: s for s in cfg.sources}
    rt = GroupRuntime(plan)
    offsets: dict[tuple[str, int], int] = {}
    done = []
    for b, batch in enumerate(ex.batches):
        last = b == len(ex.batches) - 1
        got = GroupInput([], [], [], [])
        for name, src in sources.items():
            read = {}
            for p, records in _streams(ex, batch).get(name, {}).items():
                events = []
                for r in records:
                    start = r[src.time_field]
                    end = (CTI_INFINITY if src.shape == "edge"
                           else r[src.end_field] if src.end_field else start)
                    off = offsets[name, p] = offsets.get((name, p), -1) + 1
                    events.append(Event(r[src.key_field], start, end, dict(r), p, off, name))
                read[p] = events
            part = GroupInput.of(name, read, list(range(src.partitions or 1)), flush=last and ex.flush)
            for mine, theirs in ((got.columns, part.columns), (got.frontiers, part.frontiers),
                                 (got.controls, part.controls)):
                mine.extend(theirs)
        result = rt.run_batch(got)
        out = []
        for topic, o, _key in result.outputs:
            for record in (o.records() if isinstance(o, OutputBatch) else [o.record]):
                out.append((topic, record))
        done.append((b + 1, rt.ops_cti, out))
        header = rt.commit()
        rt = GroupRuntime(plan, header=header, chunks=rt.chunks)  # as Spark runs the next batch
    return done


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if v == CTI_INFINITY:
        return "+∞"
    if isinstance(v, list) and v and isinstance(v[0], dict) and "stage" in v[0]:  # a match's stages
        return " · ".join(f"{s['stage']}: " + ", ".join(_event(e) for e in s["events"]) for s in v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return json.dumps(v, default=str, separators=(",", ":"))
    return str(v)


def _event(e: Any) -> str:
    """A matched event by its id (the record in a job; JSON text outside one)."""
    if isinstance(e, str):
        e = json.loads(e)
    return str(e.get("id", e))


def render(ex: Example) -> str:
    """The example in Markdown: the job file, the input by micro-batch, and the records written."""
    src = ex.job["sources"][0]
    job = {k: v for k, v in ex.job.items()}
    lines = ["The job file (with `kafka` left out):", "", "```yaml",
             yaml.safe_dump(job, sort_keys=False, width=100).rstrip(), "```", "",
             "The input, by micro-batch (times in ms of application time; each partition's CTI is "
             "its largest",
             f"start − `cti.delay` ({src.get('cti', {}).get('delay', 0)} ms), the job's the smallest "
             "of them):", ""]
    for name in [src["name"] for src in ex.job["sources"]]:
        rows = [(b, p, r) for b, batch in enumerate(ex.batches, 1)
                for p, records in sorted(_streams(ex, batch).get(name, {}).items())
                for r in records]
        if not rows:
            continue
        fields = list(rows[0][2])
        if len(ex.job["sources"]) > 1:
            lines += [f"Stream `{name}`:", ""]
        lines += ["| batch | partition | " + " | ".join(fields) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in fields) + " |"]
        lines += [f"| {b} | {p} | " + " | ".join(_value(r.get(f)) for f in fields) + " |" for b, p, r in rows]
        lines.append("")
    lines += ["What it writes, batch by batch (generated by running the job's operators when these docs "
              "were built; the last batch ends the bounded input, so its CTI is +∞; fractions shown "
              "to 4 digits):",
              ""]
    for b, cti, out in run(ex):
        end = " (the input ends: the final CTI)" if cti == CTI_INFINITY else ""
        lines.append(f"**Batch {b}** — CTI after it: {_ms(cti) if cti != CTI_INFINITY else '+∞'}{end}.")
        lines.append("")
        if not out:
            lines += ["Nothing written.", ""]
            continue
        by_topic: dict[str, list[dict]] = {}
        for topic, record in out:
            by_topic.setdefault(topic, []).append(record)
        for topic, records in by_topic.items():
            cols = list(ex.show.get(topic) or records[0])
            lines += [f"Topic `{topic}`:", "", "| " + " | ".join(cols) + " |",
                      "| " + " | ".join("---" for _ in cols) + " |"]
            lines += ["| " + " | ".join(_value(r.get(c)) for c in cols) + " |" for r in records]
            lines.append("")
    return "\n".join(lines)


def _tx(account: str, t: int, amount: float, kind: str = "purchase", country: str = "DE") -> dict:
    return {"id": f"t{t}", "account": account, "event_time": t, "amount": amount, "type": kind,
            "country": country}


def _account(account: str, t: int, threshold: float, home: str = "DE") -> dict:
    return {"account": account, "valid_from": t, "home_country": home, "risk_threshold": threshold,
            "tier": "standard"}


def _flow(fid: str, device: str, start: int, end: int, nbytes: float) -> dict:
    return {"id": fid, "device": device, "start_time": start, "end_time": end, "bytes": nbytes,
            "packets": 1.0}


EXAMPLES: dict[str, Example] = {
    "count": Example(
        job={"job": "example", "sources": [{"name": "tx", "topic": "transactions", "schema": "transaction",
                                             "key_field": "account", "time_field": "event_time",
                                             "partitions": 2, "cti": {"delay": 1000}}],
             "operators": [{"kind": "count", "name": "large_last_10s", "window": {"time": 10000},
                            "epsilon": 0.5, "predicate": "amount > 100", "emit": "per_cti",
                            "output": "counts"}]},
        batches=[{0: [_tx("a", 1000, 150.0), _tx("a", 2500, 20.0), _tx("a", 4000, 300.0)],
                  1: [_tx("b", 1500, 500.0), _tx("b", 3000, 700.0)]},
                 {0: [_tx("a", 9000, 120.0), _tx("a", 13500, 250.0)],
                  1: [_tx("b", 12000, 10.0), _tx("b", 14000, 900.0)]},
                 {0: [_tx("a", 16000, 99.0)], 1: [_tx("b", 15500, 110.0)]}],
        show={"counts": ("key", "time", "estimate", "lower", "upper", "bucket_count")}),
    "bins": Example(
        job={"job": "example", "sources": [{"name": "flows", "topic": "flows", "schema": "flow",
                                             "key_field": "device", "time_field": "start_time",
                                             "end_field": "end_time", "shape": "interval", "partitions": 1,
                                             "measures": ["bytes"], "cti": {"delay": 0}}],
             "operators": [{"kind": "bins", "name": "bytes_per_10s", "bin_size": 10000, "measures": ["bytes"],
                            "outputs": {"incremental": "bins-incremental", "updated": "bins-updated",
                                        "final": "bins-final"}}]},
        batches=[{0: [_flow("f1", "d1", 2000, 12000, 1000.0), _flow("f2", "d1", 5000, 8000, 300.0)]},
                 {0: [_flow("f3", "d1", 15000, 35000, 2000.0)]},
                 {0: [_flow("f4", "d1", 36000, 36000, 50.0)]}],
        show={t: ("key", "bin_start", "bin_end", "measures", "fraction_sum", "events", "revision", "final",
                  "cti")
              for t in ("bins-incremental", "bins-updated", "bins-final")}),
    "match": Example(
        job={"job": "example", "sources": [{"name": "tx", "topic": "transactions", "schema": "transaction",
                                             "key_field": "account", "time_field": "event_time",
                                             "partitions": 2, "cti": {"delay": 1000}}],
             "operators": [{"kind": "match", "name": "abroad_then_large", "output": "matches",
                            "timed_out": "matches-timed-out",
                            "pattern": {"within_ms": 10000, "skip": "skip_past_last_event", "stages": [
                                {"name": "abroad", "where": "country != 'DE'"},
                                {"name": "large", "contiguity": "followed_by", "where": "amount > 1000"}]}}]},
        batches=[{0: [_tx("a", 1000, 40.0, country="FR"), _tx("a", 3000, 20.0), _tx("a", 5000, 1500.0)],
                  1: [_tx("b", 2000, 60.0, country="US"), _tx("b", 4000, 30.0)]},
                 {0: [_tx("a", 8000, 10.0)], 1: [_tx("b", 9000, 80.0)]},
                 {0: [_tx("a", 14000, 10.0)], 1: [_tx("b", 15000, 2000.0)]}],
        show={"matches": ("pattern", "key", "first_time", "last_time", "stages"),
              "matches-timed-out": ("pattern", "key", "first_time", "timed_out_at", "stages")}),
    "reference": Example(
        job={"job": "example",
             "sources": [{"name": "tx", "topic": "transactions", "schema": "transaction",
                          "key_field": "account", "time_field": "event_time",
                          "partitions": 1, "cti": {"delay": 0}},
                         {"name": "accounts", "topic": "accounts", "schema": "account",
                          "key_field": "account", "time_field": "valid_from", "shape": "edge",
                          "partitions": 1, "cti": {"delay": 0, "policy": "adjust"}}],
             "reference": {"source": "accounts", "fast": "tx", "join_field": "account", "sync": "import",
                           "missing": "emit", "output": "enriched"},
             "operators": [{"kind": "count", "name": "over_threshold", "window": {"time": 60000},
                            "epsilon": 0.01, "predicate": "amount > coalesce(reference.risk_threshold, 1000)",
                            "emit": "per_event", "output": "counts"}]},
        batches=[{"accounts": {0: [_account("a", 0, 500.0)]},
                  "tx": {0: [_tx("a", 1000, 600.0), _tx("b", 2000, 600.0), _tx("a", 3000, 400.0)]}},
                 {"accounts": {0: [_account("a", 4000, 300.0)]},
                  "tx": {0: [_tx("a", 5000, 400.0), _tx("a", 6000, 200.0)]}}],
        show={"enriched": ("key", "time", "reference_valid_from", "reference_missing", "reference_json"),
              "counts": ("key", "time", "estimate")}),
    "recognize": Example(
        job={"job": "example", "sources": [{"name": "tx", "topic": "transactions", "schema": "transaction",
                                             "key_field": "account", "time_field": "event_time",
                                             "partitions": 1, "cti": {"delay": 0}}],
             "operators": [{"kind": "match", "name": "growing_withdrawals", "output": "matches", "sql": (
                 "SELECT * FROM tx MATCH_RECOGNIZE (\n"
                 "  PARTITION BY account ORDER BY event_time\n"
                 "  MEASURES FIRST(W.amount) AS first_amount, LAST(W.amount) AS last_amount, "
                 "COUNT(W.id) AS withdrawals\n"
                 "  AFTER MATCH SKIP PAST LAST ROW\n"
                 "  PATTERN (W{2,} E) WITHIN INTERVAL '10' SECOND\n"
                 "  DEFINE W AS W.type = 'withdrawal' AND (LAST(W.amount, 1) IS NULL OR "
                 "W.amount > LAST(W.amount, 1)),\n"
                 "         E AS E.type <> 'withdrawal')")}]},
        batches=[{0: [_tx("a", 1000, 100.0, "withdrawal"), _tx("a", 2000, 200.0, "withdrawal"),
                      _tx("b", 1500, 50.0, "withdrawal"), _tx("b", 2500, 30.0, "withdrawal"),
                      _tx("a", 3000, 400.0, "withdrawal")]},
                 {0: [_tx("a", 4000, 20.0, "purchase"), _tx("b", 5000, 80.0, "withdrawal")]},
                 {0: [_tx("b", 6000, 90.0, "withdrawal"), _tx("b", 7000, 15.0, "purchase")]}]),
    "time": Example(
        job={"job": "example", "sources": [{"name": "tx", "topic": "transactions", "schema": "transaction",
                                             "key_field": "account", "time_field": "event_time",
                                             "partitions": 2, "cti": {"delay": 1000}}],
             "operators": [{"kind": "count", "name": "all_last_3", "window": {"events": 3}, "per_key": False,
                            "emit": "per_event", "output": "counts"}]},
        batches=[{0: [_tx("a", 1000, 1.0), _tx("b", 5000, 1.0), _tx("c", 9000, 1.0)],
                  1: [_tx("d", 2000, 1.0)]},
                 {0: [_tx("e", 3500, 1.0)], 1: [_tx("f", 4000, 1.0), _tx("g", 7000, 1.0)]},
                 {0: [_tx("h", 4500, 1.0)], 1: [_tx("i", 9500, 1.0)]}],
        show={"counts": ("key", "time", "estimate"),
              "example.late": ("stream", "key", "start", "cti", "reason", "partition", "offset")}),
}


def example(name: str) -> str:
    """The Markdown of example ``name`` (:data:`EXAMPLES`)."""
    return render(EXAMPLES[name])


def bins_picture(path) -> None:
    """The bins example as a timeline: each flow a bar from its start to its end over the 10 s
    bins, each overlap labelled with its fraction, each bin with its final total (computed by
    running the example, like the page's tables)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ex = EXAMPLES["bins"]
    flows = [r for batch in ex.batches for records in batch.values() for r in records]
    finals = {r["bin_start"]: r["measures"]["bytes"]
              for _, _, out in run(ex) for t, r in out if t == "bins-final"}
    size = ex.job["operators"][0]["bin_size"]
    end = max(f["end_time"] for f in flows)
    fig = Figure(figsize=(9, 2.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for k in range(0, end // size + 1):
        ax.axvline(k * size / 1000, color="#999", lw=0.8, ls="--")
        total = finals.get(k * size)
        if total is not None:
            ax.text((k + 0.5) * size / 1000, len(flows) + 0.1, f"final {total:g} B", ha="center", fontsize=8)
    for i, f in enumerate(reversed(flows)):
        s, e, y = f["start_time"], f["end_time"], i + 0.5
        ax.plot([s / 1000, max(e, s + 150) / 1000], [y, y], lw=7, solid_capstyle="butt", color="#4a7ab5")
        ax.text(s / 1000, y + 0.28, f"{f['id']}: {f['bytes']:g} B", fontsize=8)
        for k in range(s // size, -(-e // size) if e > s else s // size + 1):
            lo, hi = max(s, k * size), min(e, (k + 1) * size)
            if e > s and hi > lo:
                ax.text((lo + hi) / 2000, y - 0.42, f"{(hi - lo) / (e - s):.2g}", ha="center", fontsize=7)
            elif e == s:
                ax.text(s / 1000, y - 0.42, "1", ha="center", fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel("application time (s); bins (k·10 s, (k+1)·10 s]; numbers under a bar: its fraction in "
                  "each bin")
    ax.set_ylim(0, len(flows) + 0.6)
    ax.set_xlim(-1, (end // size + 1) * size / 1000 + 1)
    fig.tight_layout()
    fig.savefig(path)


def histogram_picture(path) -> None:
    """An exponential histogram's buckets after 40 events (one a time unit) over a window of the
    last 25, ε = 0.5: each bucket spans the times since the bucket before it, labelled with its
    size; the window's start and the guaranteed interval of the count are marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    from ctiflow.operators.histogram import ExponentialHistogram

    window, n = 25, 40
    h = ExponentialHistogram(window, 0.5)
    for t in range(1, n + 1):
        h.update(t)
    buckets = sorted(h.buckets(), key=lambda b: b.timestamp)
    lower, upper = h.bounds()
    fig = Figure(figsize=(9, 2.4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    prev = buckets[0].timestamp - buckets[0].count
    for b in buckets:
        ax.add_patch(Rectangle((prev + 0.5, 0), b.timestamp - prev, 1, facecolor="#4a7ab5", edgecolor="white",
                               lw=2))
        ax.text((prev + b.timestamp) / 2 + 0.5, 0.5, str(b.count), ha="center", va="center", color="white",
                fontsize=9)
        prev = b.timestamp
    ax.axvline(n - window + 0.5, color="#c0392b", lw=1.5)
    ax.text(n - window + 0.7, 1.12, f"window start (last {window})", color="#c0392b", fontsize=8)
    ax.set_xlim(0, n + 1)
    ax.set_ylim(0, 1.35)
    ax.set_yticks([])
    ax.set_xlabel(f"event times 1…{n}; bucket sizes are powers of two, newest on the right; "
                  f"exact count {window}, the histogram's interval [{lower}, {upper}]")
    fig.tight_layout()
    fig.savefig(path)


def cti_picture(path) -> None:
    """The time example over its micro-batches: every event read so far as a dot on its
    partition's line, each partition's own CTI (largest start − delay) as a tick, the job's CTI
    (their minimum) as a red line; events read behind the job's CTI are late (crosses)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ex = EXAMPLES["time"]
    delay = ex.job["sources"][0]["cti"]["delay"]
    late = {(r["partition"], r["start"]) for _, _, out in run(ex) for t, r in out if t.endswith(".late")}
    fig = Figure(figsize=(9, 1.2 + 1.3 * len(ex.batches)), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(ex.batches), 1, sharex=True)
    seen: dict[int, list[int]] = {}
    cti = None
    colors = ("#4a7ab5", "#e08e2b")
    for b, batch in enumerate(ex.batches):
        ax, last = axes[b], b == len(ex.batches) - 1
        for p, records in batch.items():
            seen.setdefault(p, []).extend(r["event_time"] for r in records)
        own = {p: max(ts) - delay for p, ts in seen.items()}
        for p, ts in sorted(seen.items()):
            for t in ts:
                is_late = (p, t) in late and t in [r["event_time"] for r in batch.get(p, [])]
                ax.plot(t / 1000, p, "x" if is_late else "o", color=colors[p % 2], ms=7 if is_late else 5)
            ax.plot(own[p] / 1000, p, "|", color=colors[p % 2], ms=18, mew=2)
        if last:  # the input ends: its events are checked against the CTI before, then the CTI is +∞
            label = f"batch {b + 1}: checked against {cti / 1000:g} s (× late); the input ends, CTI +∞"
        else:
            cti = max(cti or 0, min(own.values()))
            label = f"batch {b + 1}: CTI {cti / 1000:g} s"
        ax.axvline(cti / 1000, color="#c0392b", lw=1.5)
        ax.text(cti / 1000 + 0.1, 1.35, label, color="#c0392b", fontsize=8)
        ax.set_yticks(sorted(seen), [f"partition {p}" for p in sorted(seen)], fontsize=8)
        ax.set_ylim(-0.6, 1.8)
    axes[-1].set_xlabel("application time (s); dots: events read so far; ticks: each partition's CTI "
                        f"(largest start − {delay / 1000:g} s); red: the job's CTI")
    fig.tight_layout()
    fig.savefig(path)
