"""``ctiflow bench rules-test``: trying a rule on a range costs the range, not the topic.

A topic of ``10 × range`` transactions (3 partitions, 2,000 accounts, event time 10 ms apart); the
range is its fifth tenth. Two runs of the same match operator over the range's events, in one Spark
session, each twice in alternation (the better of each side counts, after an unmeasured round of
both):

* **rules test** — :func:`ctiflow.jobs.driver.rule_trial.try_rule` of the candidate over the range
  (``--against none``): finding the range's offsets in the long topic, the bounded run, reading
  its results back, removing its topics;
* **the job over the range** — ``ctiflow run --until-end`` of a job whose topic holds only the
  events the trial reads (from the CTI delay before the range to its end plus the rule's ``within``
  and two delays: the runs it started drain), with the same rule put at the range's start and
  deleted at its end.

Rate = those events / wall seconds of the call (the trial) or of ``pipeline.run`` (the job);
both must give the same matches. Goal: the trial ≥ 0.9× the job's rate (issue 62)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from ctiflow.bench.spark_jobs import T0, bench_stack

DELAY, WITHIN = 2_000, 60_000  # the job's cti.delay and the rule's within (ms)
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
                           "rules": {"topic": rules, "language": "pattern"}}],
            "spark": {"checkpoint": f"{home}/ck-{name}", "key_groups": 4}}


def main(out: Console | None = None, events_n: int = 50_000, record_figures: bool = False) -> dict:
    """``events_n``: the range's events (the topic holds ten times as many)."""
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.recognize import job_schema_store
    from ctiflow.jobs.driver.rule_trial import try_rule
    from ctiflow.operators.cep.rules import Rule

    out = out or Console(width=200)
    total = 10 * events_n
    start, end = T0 + 4 * events_n * 10, T0 + 5 * events_n * 10
    with bench_stack() as (bootstrap, spark, home):
        serializer = AvroSerializer("transaction")
        kafka.create_topics(bootstrap, {"trial-all": 3, "trial-range": 3, "trial-rules": 1})
        kafka.produce(bootstrap, "trial-all", transactions(total), serializer, "account",
                      partition_of=lambda i, _: i % 3)
        # what the trial reads: from the CTI delay before the range to its end + the rule's within + 2 delays
        first, last = start - DELAY, end + WITHIN + 2 * DELAY
        read = [r for r in transactions(total) if first <= r["event_time"] < last]
        kafka.produce(bootstrap, "trial-range", read, serializer, "account", partition_of=lambda i, _: i % 3)
        job = parse(job_spec("trial", "trial-all", "trial-rules", bootstrap, home), "trial")

        def trial(tag: str) -> tuple[float, int]:
            began = time.perf_counter()
            got = try_rule(job, RULE, start=start, end=end, rule_id="r", against="none", spark=spark)
            return time.perf_counter() - began, len(got.matches)

        def whole(tag: str) -> tuple[float, int]:
            rules = f"range-rules{tag}"
            kafka.create_topics(bootstrap, {rules: 1})
            kafka.produce(bootstrap, rules, [vars(Rule("r", "fraud", 1, start, "put", RULE)),
                                             vars(Rule("r", "fraud", 2, end, "delete"))],
                          AvroSerializer("rule"), "rule_id")
            cfg = parse(job_spec(f"range{tag}", "trial-range", rules, bootstrap, home), "range")
            began = time.perf_counter()
            pipeline.run(cfg, until_end=True, spark=spark)
            took = time.perf_counter() - began
            return took, len(kafka.read_topic(bootstrap, f"range{tag}-matches", store=job_schema_store(cfg)))

        trial("-warm-up"), whole("-warm-up")
        runs = {"trial": [], "whole": []}
        for i in range(2):
            runs["trial"].append(trial(f"-{i}"))
            runs["whole"].append(whole(f"-{i}"))
    matches = {side: {m for _, m in got} for side, got in runs.items()}
    if len(matches["trial"] | matches["whole"]) != 1:
        raise SystemExit(f"rules test and the job over the range disagree: matches {matches}")
    best = {side: min(s for s, _ in got) for side, got in runs.items()}
    rate = {side: len(read) / s for side, s in best.items()}
    ratio = rate["trial"] / rate["whole"]
    t = Table(title=f"ctiflow bench rules-test: a range of {events_n:,} events in a topic of {total:,} "
                    f"(3 partitions); best of 2 alternating rounds after a warm-up; {matches['trial'].pop():,} matches")
    for col in ("run", "seconds (each round)", "events/s (best)", "vs the job"):
        t.add_column(col, justify="left" if col == "run" else "right")
    t.add_row("rules test over the range (the long topic)", " / ".join(f"{s:.1f}" for s, _ in runs["trial"]),
              f"{rate['trial']:,.0f}", f"{ratio:.2f}×")
    t.add_row("ctiflow run --until-end (a topic of the range)", " / ".join(f"{s:.1f}" for s, _ in runs["whole"]),
              f"{rate['whole']:,.0f}", "1.00×")
    out.print(t)
    out.print(f"rules test / the job over the same events: {ratio:.2f}× (goal ≥ 0.9×)")
    if record_figures:
        from ctiflow.bench.figures import record, rows_of, thousands, verdict

        record("rules_test", {"ours": thousands(rate["trial"]), "base": thousands(rate["whole"]),
                              "ratio": f"{ratio:.2f}", "events": f"{events_n:,}", "total": f"{total:,}",
                              "met": verdict(ratio >= 0.9)}, table=rows_of(t))
    return {"ratio": ratio, "rates": rate}
