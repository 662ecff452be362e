"""Benchmark: a match operator with N rules from its rules topic against the same N patterns
written statically in the job file (N match operators), same events, same run.

What runs is what one key group runs in a Spark micro-batch (:class:`~ctiflow.jobs.core.runtime.GroupRuntime`,
without Spark or Kafka): per micro-batch of ``per_batch`` events the group is restored from its
committed header with its decoded chunks kept warm (as the adapter's worker cache keeps them),
the events offered, the CTI applied, the state committed. The rules variant's rule records
arrive in the first micro-batch through the rules stream (validated and compiled there: timed).

Workload: card transactions of 1,000 accounts over 10,000 merchants, one event per ms. Rule
``i`` is selective: a purchase at merchant ``m<i>``, then within 5 s a purchase over 3,000 —
so the start filter (:func:`ctiflow.operators.cep.operator.start_filter`) skips most events for
most rules. Both variants must produce the same matches (checked, counted).

Targets (issue 43): rules ≥ 0.9× the static job at every N; 100 rules within 3× the cost of one.

    python -m ctiflow.bench.rules [--events 200000] [--sizes 1,10,100,1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

from rich.console import Console
from rich.table import Table

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import Control, GroupInput
from ctiflow.jobs.core.plan import Plan
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.cep.rules import Rule
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.time import Event

T0 = 1_767_225_600_000
MERCHANTS = 10_000


def pattern(i: int) -> dict:
    return {"within": "5s", "skip": "skip_past_last_event",
            "stages": [{"name": "first", "where": f"type == 'purchase' and merchant == 'm{i}'"},
                       {"name": "large", "contiguity": "followed_by", "where": "type == 'purchase' and amount > 3000"}]}


def events(n: int, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        account = f"a{rng.randrange(1000)}"
        f = {"id": f"t{i}", "account": account, "event_time": T0 + i, "type": rng.choice(("purchase",) * 3 + ("refund",)),
             "amount": float(rng.randrange(1, 100) * 50), "currency": "EUR", "country": "DE",
             "merchant": f"m{rng.randrange(MERCHANTS)}"}
        out.append(Event(account, T0 + i, T0 + i, f, 0, i, "transactions"))
    return out


def job(n: int, ruled: bool):
    source = {"name": "transactions", "topic": "tx", "schema": "transaction", "key_field": "account",
              "time_field": "event_time", "partitions": 1}
    if ruled:
        ops = [{"kind": "match", "name": "fraud", "output": "matches", "rules": {"topic": "rules", "max_rules": 10_000}}]
    else:
        ops = [{"kind": "match", "name": f"r{i}", "output": "matches", "pattern": pattern(i)} for i in range(n)]
    return parse({"job": "bench-rules", "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "sources": [source],
                  "operators": ops, "state": {"ttl": "10m"}, "spark": {"key_groups": 1}}, "bench")


def run(plan: Plan, batches: list[list[Event]], rules: list[Rule]) -> tuple[float, list]:
    """→ (seconds, match records as comparable tuples)."""
    header, chunks, warm = None, {}, None
    found = []
    started = time.perf_counter()
    for i, evs in enumerate(batches):
        rt = GroupRuntime(plan, header=header, chunks=chunks, warm=warm)
        got = GroupInput([EventColumns.from_events(evs)], [("transactions", 0, evs[-1].start)],
                         [("transactions", Control([0], [], False))], [])
        if i == 0 and rules:
            fields = [{f: getattr(r, f) for f in Rule.__dataclass_fields__} for r in rules]
            got.columns.insert(0, EventColumns.from_events(
                [Event(r.rule_id, r.effective_time, r.effective_time, f, 0, j, "rules_fraud")
                 for j, (r, f) in enumerate(zip(rules, fields))]))
            got.controls.append(("rules_fraud", Control([0], [], False)))
        result = rt.run_batch(got, final=i == len(batches) - 1)
        header = rt.commit()
        warm = rt.keyed.still_warm()
        for _, o, _ in result.outputs:
            r = o.record
            if "match_id" in r:
                pat = r["rule_id"] if r.get("rule_id") else r["pattern"]
                found.append((pat, r["match_id"].split("/", 1)[-1]))
    return time.perf_counter() - started, found


def main(out: Console | None = None, events_n: int = 200_000, sizes=(1, 10, 100, 1000), per_batch: int = 20_000,
         rounds: int = 2, record_figures: bool = False) -> dict:
    """``record_figures``: write the ``rules`` row of bench/figures.yaml (needs 1, 10, 100 and 1,000 rules)."""
    out = out or Console(width=200)
    evs = events(events_n)
    batches = [evs[i:i + per_batch] for i in range(0, len(evs), per_batch)]
    gc.freeze()
    table = Table(title=f"rules by topic vs the same patterns in the job file: {events_n:,} events, "
                        f"{per_batch:,} a micro-batch, one key group (best of {rounds}, alternating)")
    for col in ("patterns", "static events/s", "rules events/s", "rules / static", "matches"):
        table.add_column(col, justify="right")
    figures = {}
    for n in sizes:
        static_plan = plan_job(job(n, False))
        ruled_plan = plan_job(job(n, True))
        rules = [Rule(f"r{i}", "fraud", 1, T0, "put", json.dumps(pattern(i))) for i in range(n)]
        best = {"static": float("inf"), "rules": float("inf")}
        matches = {}
        for _ in range(rounds):
            for name, plan, rs in (("static", static_plan, []), ("rules", ruled_plan, rules)):
                seconds, found = run(plan, batches, rs)
                best[name] = min(best[name], seconds)
                matches[name] = sorted(found)
        if matches["static"] != matches["rules"]:
            raise SystemExit(f"{n} patterns: the rules' matches differ from the static job's")
        figures[n] = {k: events_n / v for k, v in best.items()}
        table.add_row(f"{n:,}", f"{figures[n]['static']:,.0f}", f"{figures[n]['rules']:,.0f}",
                      f"{figures[n]['rules'] / figures[n]['static']:.2f}×", f"{len(matches['rules']):,}")
    out.print(table)
    if 1 in figures and 100 in figures:
        out.print(f"100 selective rules cost {figures[1]['rules'] / figures[100]['rules']:.2f}× one rule "
                  "(target ≤ 3×)")
    if record_figures:
        record_rules(figures, table)
    return figures


def record_rules(figures: dict[int, dict[str, float]], table: Table) -> None:
    """The ``rules`` row of bench/figures.yaml: rates and ratios at 1, 10, 100 and 1,000 rules."""
    from ctiflow.bench.figures import record, rows_of, verdict

    values = {}
    for n in (1, 10, 100, 1000):
        values[f"r{n}"] = f"{figures[n]['rules'] / 1e3:,.1f}k"
        values[f"x{n}"] = f"{figures[n]['rules'] / figures[n]['static']:.2f}"
    cost = figures[1]["rules"] / figures[100]["rules"]
    record("rules", {**values, "cost": f"{cost:.2f}",
                     "met_static": verdict(all(f["rules"] >= 0.9 * f["static"] for f in figures.values())),
                     "met_cost": verdict(cost <= 3.0)}, table=rows_of(table))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--sizes", default="1,10,100,1000")
    args = ap.parse_args()
    main(events_n=args.events, sizes=tuple(int(s) for s in args.sizes.split(",")))
