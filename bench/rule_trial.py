"""``ctiflow bench rules-test``: trying a rule on a range costs the range, not the topic.

A topic of ``10 × range`` transactions (3 partitions, 2,000 accounts, event time 10 ms apart); the
range is its fifth tenth. Two runs of the same match operator over the range's events, in one Spark
session, each twice in alternation (the better of each side counts, after an unmeasured round of
both):

* **rules test** — :func:`ctiflow.jobs.driver.rule_trial.try_rule` of the candidate over the range
  (``--against none``): finding the range's offsets in the long topic, the bounded run, reading
  its results back, removing its topics, and what ``ctiflow rules test`` prints (matches per key and hour);
* **the job over the range** — ``ctiflow run --until-end`` of a job (its match operator writes
  matches and timed-out runs, as the trial's does) whose topic holds only the
  events the trial reads (from the CTI delay before the range to its end plus the rule's ``within``
  and two delays: the runs it started drain), with the same rule put at the range's start and
  deleted at its end.

Rate = those events / wall seconds of the call (the trial) or of ``pipeline.run`` (the job);
both must give the same matches. Goal: the trial ≥ 0.9× the job's rate (issue 62). Two ranges
(:data:`SIZES`): what the trial adds beyond the bounded run is fixed (finding the range, reading
the results back), so the smaller range shows it and the larger one what a range costs."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from ctiflow.bench.spark_jobs import T0

DELAY, WITHIN = 2_000, 60_000  # the job's cti.delay and the rule's within (ms)
#: the ranges' sizes (events; each topic ten times as long): a fixed cost shows as the gap between them
SIZES = (50_000, 200_000)
RULE = """within: 60s
skip: skip_past_last_event
stages:
  - {name: first, where: "type == 'purchase' and amount > 1500"}
  - {name: large, contiguity: followed_by, where: "type == 'purchase' and amount > 1900"}
"""


def transactions(n: int, keys: int = 2_000):
    for i in range(n):
        yield {"id": str(i), "account": f"acct-{(i * 7) % keys:05d}", "event_time": T0 + i * 10,
               "type": "purchase" if i % 5 else "refund", "amount": float((i * 7919) % 2000),
               "currency": "EUR", "country": "DE", "merchant": None}


def job_spec(name: str, topic: str, rules: str, bootstrap: str, home: str) -> dict:
    return {"job": name, "kafka": {"bootstrap_servers": bootstrap},
            "sources": [{"name": "transactions", "topic": topic, "schema": "transaction", "key_field": "account",
                         "time_field": "event_time", "partitions": 3, "cti": {"delay": DELAY}}],
            "operators": [{"kind": "match", "name": "fraud", "output": f"{name}-matches",
                           "timed_out": f"{name}-timed-out", "rules": {"topic": rules, "language": "pattern"}}],
            "spark": {"checkpoint": f"{home}/ck-{name}", "key_groups": 4}}


def main(out: Console | None = None, events_n: int | None = None, record_figures: bool = False,
         sizes: tuple[int, ...] = SIZES) -> dict:
    """``events_n``: one range of that many events (the topic holds ten times as many); by default
    each of :data:`SIZES`, so the table shows what is fixed and what follows the range."""
    from ctiflow.bench.spark_jobs import bench_stack

    out = out or Console(width=200)
    sizes = (events_n,) if events_n else sizes
    t = Table(title="ctiflow bench rules-test: a range in a topic of ten times its events (3 partitions); best "
                    "of 2 alternating rounds after a warm-up")
    for col in ("range / topic", "run", "seconds (each round)", "events/s (best)", "vs the job"):
        t.add_column(col, justify="left" if col in ("run", "range / topic") else "right")
    got = {}
    with bench_stack() as (bootstrap, spark, home):
        for n in sizes:
            got[n] = _one_size(bootstrap, spark, home, n)
            runs, rate, ratio = got[n]["runs"], got[n]["rates"], got[n]["ratio"]
            where = f"{n:,} / {10 * n:,}"
            t.add_row(where, "rules test over the range (the long topic)",
                      " / ".join(f"{s:.1f}" for s, _ in runs["trial"]), f"{rate['trial']:,.0f}", f"{ratio:.2f}×")
            t.add_row(where, "ctiflow run --until-end (a topic of the range)",
                      " / ".join(f"{s:.1f}" for s, _ in runs["whole"]), f"{rate['whole']:,.0f}", "1.00×")
    out.print(t)
    for n in sizes:
        fixed = got[n]["best"]["trial"] - got[n]["best"]["whole"]
        out.print(f"{n:,} events: rules test / the job over the same events {got[n]['ratio']:.2f}× "
                  f"(goal ≥ 0.9×); the trial's time beyond the job's {fixed:.1f} s")
    big, small = max(sizes), min(sizes)
    if record_figures:
        from ctiflow.bench.figures import record, rows_of, thousands, verdict

        record("rules_test", {"ours": thousands(got[big]["rates"]["trial"]),
                              "base": thousands(got[big]["rates"]["whole"]), "ratio": f"{got[big]['ratio']:.2f}",
                              "events": f"{big:,}", "total": f"{10 * big:,}",
                              "small": f"{small:,}", "ratio_small": f"{got[small]['ratio']:.2f}",
                              "fixed": f"{got[small]['best']['trial'] - got[small]['best']['whole']:.1f}",
                              "met": verdict(got[big]["ratio"] >= 0.9)}, table=rows_of(t))
    return {n: {"ratio": g["ratio"], "rates": g["rates"]} for n, g in got.items()}


def _one_size(bootstrap: str, spark, home: str, events_n: int) -> dict:
    """One range of ``events_n`` events in a topic of ten times as many: both sides' rounds."""
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.recognize import job_schema_store
    from ctiflow.jobs.driver.rule_trial import try_rule
    from ctiflow.operators.cep.rules import Rule

    total = 10 * events_n
    start, end = T0 + 4 * events_n * 10, T0 + 5 * events_n * 10
    all_, range_, rules_ = f"trial-all-{events_n}", f"trial-range-{events_n}", f"trial-rules-{events_n}"
    serializer = AvroSerializer("transaction")
    kafka.create_topics(bootstrap, {all_: 3, range_: 3, rules_: 1})
    kafka.produce(bootstrap, all_, transactions(total), serializer, "account", partition_of=lambda i, _: i % 3)
    # what the trial reads: from the CTI delay before the range to its end + the rule's within + 2 delays
    first, last = start - DELAY, end + WITHIN + 2 * DELAY
    read = [r for r in transactions(total) if first <= r["event_time"] < last]
    kafka.produce(bootstrap, range_, read, serializer, "account", partition_of=lambda i, _: i % 3)
    job = parse(job_spec(f"trial{events_n}", all_, rules_, bootstrap, home), "trial")

    def trial(tag: str) -> tuple[float, int]:
        began = time.perf_counter()
        got = try_rule(job, RULE, start=start, end=end, rule_id="r", against="none", spark=spark)
        got.per_key(5), got.per_period()  # what `ctiflow rules test` prints beside the counts
        return time.perf_counter() - began, len(got.matches)

    def whole(tag: str) -> tuple[float, int]:
        rules = f"range-rules-{events_n}{tag}"
        kafka.create_topics(bootstrap, {rules: 1})
        kafka.produce(bootstrap, rules, [vars(Rule("r", "fraud", 1, start, "put", RULE)),
                                         vars(Rule("r", "fraud", 2, end, "delete"))],
                      AvroSerializer("rule"), "rule_id")
        cfg = parse(job_spec(f"range{events_n}{tag}", range_, rules, bootstrap, home), "range")
        began = time.perf_counter()
        pipeline.run(cfg, until_end=True, spark=spark)
        took = time.perf_counter() - began
        return took, len(kafka.read_topic(bootstrap, f"range{events_n}{tag}-matches", store=job_schema_store(cfg)))

    trial("-warm-up"), whole("-warm-up")
    runs = {"trial": [], "whole": []}
    for i in range(2):
        runs["trial"].append(trial(f"-{i}"))
        runs["whole"].append(whole(f"-{i}"))
    kafka.delete_topics(bootstrap, [all_, range_])
    matches = {side: {m for _, m in got} for side, got in runs.items()}
    if len(matches["trial"] | matches["whole"]) != 1:
        raise SystemExit(f"rules test and the job over the range disagree ({events_n:,} events): matches {matches}")
    best = {side: min(s for s, _ in got) for side, got in runs.items()}
    rate = {side: len(read) / s for side, s in best.items()}
    return {"runs": runs, "best": best, "rates": rate, "ratio": rate["trial"] / rate["whole"]}
