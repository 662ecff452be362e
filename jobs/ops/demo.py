"""The README's first command: the whole pipeline end to end on the embedded stack.

Starts the broker (unless one runs), creates the topics, produces a realistic workload
(transactions with a few malformed records, account reference data, network flows with late
arrivals), runs both demo jobs as bounded runs on local Spark (count + match + reference sync;
prorated bins), prints what came out of every result topic and stops what it started.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.driver import pipeline, progress
from ctiflow.jobs.ops import stack
from ctiflow.jobs.driver.config import load
from ctiflow.jobs.avro.serde import bundled_dir
from ctiflow.jobs.ops.plot import plot_bins, plot_counts
from ctiflow.jobs.testing.oracle import exact_counts
from ctiflow.jobs.avro.serde import AvroSerializer
from ctiflow.jobs.testing import workload

EXAMPLES = bundled_dir("examples")
JOBS = ("demo-transactions.yaml", "demo-flows.yaml")


def _produce(bootstrap: str, topic: str, schema: str, records: list[dict], key_field: str,
             extra_values: list[bytes] = ()) -> int:
    return kafka.produce(bootstrap, topic, [*records, *extra_values], AvroSerializer(schema), key_field).sent


def run_demo(port: int, keep_broker: bool, console: Console, out: Console, transactions: int = 20000,
             flows: int = 3000) -> dict[str, list[dict]]:
    bootstrap = f"127.0.0.1:{port}"
    started = False
    if not stack.status(port).running:
        console.print(f"starting the embedded broker on {bootstrap} …")
        stack.up(port)
        started = True
    spark = None
    os.environ["CTIFLOW_BOOTSTRAP"] = bootstrap
    work = stack.home() / "demo"
    try:
        cfgs = []
        for name in JOBS:
            os.environ["CTIFLOW_CHECKPOINT"] = str(work / "checkpoints" / name.removesuffix(".yaml"))
            cfgs.append(load(EXAMPLES / name))
        shutil.rmtree(work / "checkpoints", ignore_errors=True)
        topics = {}
        for cfg in cfgs:
            topics.update(cfg.topics())
        kafka.delete_topics(bootstrap, [t for t in topics if t in kafka.list_topics(bootstrap)])
        kafka.create_topics(bootstrap, topics)

        console.print("generating and producing the sample workload …")
        tx = workload.transactions(transactions, accounts=500, seed=7, late_fraction=0.002)
        accts = workload.accounts(accounts=500, seed=7, start_ms=min(t["event_time"] for t in tx) - 60_000)
        fl = workload.flows(flows, devices=20, seed=7, rate_per_s=2.0, late_fraction=0.02)
        bad = [value for _, value in workload.bad_records(25, seed=7)]
        produced = {
            "transactions": _produce(bootstrap, "transactions", "transaction", tx, "account", bad),
            "accounts": _produce(bootstrap, "accounts", "account", accts, "account"),
            "flows": _produce(bootstrap, "flows", "flow", fl, "device"),
        }
        out.print(f"produced: {produced} (incl. {len(bad)} malformed transactions)")
        changes = put_demo_rules(cfgs[0], tx, out)

        spark = pipeline.spark_session(cfgs[0])
        results: dict[str, list[dict]] = {}
        for cfg in cfgs:
            per_batch = min(src.batch_records for src in cfg.sources)
            console.print(f"running job [bold]{cfg.job}[/bold] (bounded, flush at end) in micro-batches of "
                          f"at most {per_batch:,} records per source (a CTI each) — small on purpose, so "
                          "the records/s below are the demo's pacing, not ctiflow's speed (`./dev bench`, "
                          "docs/performance.md) …")
            summary = pipeline.run(cfg, until_end=True, spark=spark,
                                   on_progress=progress.printer(console, "  "))
            out.print(progress.summary_line(cfg.job, summary), soft_wrap=True, highlight=False)
            for topic in cfg.result_topics():
                results[topic] = kafka.read_topic(bootstrap, topic)  # (pipeline.run registered derived
                                                                     # schemas)
        _report(results, out)
        if changes:
            _rule_report(results.get("rule-matches") or [], changes, out)
        counting = next((c for c in cfgs if "counts" in c.result_topics()), None)
        exact = (exact_counts(counting, results["counts"], lambda name: results.get(name) or kafka.read_topic(
            bootstrap, name)) if counting is not None and results.get("counts") else None)
        _plots(results, work, out, exact)
        return results
    finally:
        if spark is not None:
            pipeline.stop_session()
        if started and not keep_broker:
            stack.down(port)
            console.print("embedded broker stopped")


#: The demo's rule ``large`` (docs/concepts/rules.md): a purchase, one abroad, then one over 1,000
#: within 10 minutes; its threshold is changed mid-stream (:func:`put_demo_rules`).
RULE = (EXAMPLES / "rules" / "large.yaml").read_text()


def put_demo_rules(cfg, tx: list[dict], out: Console, if_absent: bool = False) -> list[tuple[int, int, int]]:
    """The demo's rule changed mid-stream: version 1 (over 1,000) from the first transaction,
    version 2 (over 500) from the middle of the workload's time; → ``(version, threshold, effective)``.
    ``if_absent``: put nothing when the rules topic holds rule ``large`` already (the compose
    stack's demo producer: ``up`` again must not put the demo's versions twice)."""
    from ctiflow.jobs.driver.rules import put_rule, read_rules

    ruled = [op for op in cfg.operators if op.ruled]
    if not ruled:
        return []
    if if_absent and any(r.rule_id == "large" for r in read_rules(cfg, ruled[0])):
        out.print(f"{ruled[0].rules.topic}: rule 'large' is there already; not put again")
        return []
    times = sorted(t["event_time"] for t in tx if t.get("event_time") is not None)
    middle = times[len(times) // 2] // 60_000 * 60_000  # a whole minute
    changes = []
    for threshold, effective in ((1000, times[0]), (500, middle)):
        rule = put_rule(cfg, RULE.replace("amount > 1000", f"amount > {threshold}"), rule_id="large",
                        effective=effective, comment=f"large means over {threshold}")
        changes.append((rule.version, threshold, rule.effective_time))
        out.print(f"rule 'large' version {rule.version} (amount > {threshold}) takes effect at "
                  f"{_iso(rule.effective_time)}")
    return changes


def _iso(ms: int) -> str:
    from ctiflow.jobs.driver.rules import iso_time

    return iso_time(ms)


def _rule_report(matches: list[dict], changes: list[tuple[int, int, int]], out: Console) -> None:
    """The matches of each version of the demo's rule: before and after the change."""
    per = Counter(r.get("rule_version") for r in matches)
    for version, threshold, effective in changes:
        mine = [r for r in matches if r.get("rule_version") == version]
        lowest = min((r["stages"][-1]["events"][-1]["amount"] for r in mine), default=None)
        out.print(f"rule-matches: version {version} (amount > {threshold}, from {_iso(effective)}): "
                  f"{per[version]} matches"
                  + (f", the smallest large purchase {lowest:,.2f}" if lowest is not None else ""))


def _report(results: dict[str, list[dict]], out: Console) -> None:
    table = Table("result topic", "records", "what is in it")
    for topic, recs in results.items():
        what = ""
        if recs and "counter" in recs[0]:
            what = ", ".join(f"{k}: {v}" for k, v in Counter(r["counter"] for r in recs).items())
        elif recs and "pattern" in recs[0]:
            what = ", ".join(f"{k}: {v}" for k, v in Counter(r["pattern"] for r in recs).items())
        elif recs and "binner" in recs[0]:
            what = f"{len({r['key'] for r in recs})} devices, {len({r['bin_start'] for r in recs})} bins"
        elif recs and "reason" in recs[0]:
            what = ", ".join(f"{k}: {v}" for k, v in Counter(r["reason"].split(":")[0] for r in recs).items())
        elif recs and "error" in recs[0]:
            what = ", ".join(f"{k} ×{v}"
                             for k, v in Counter(reason_code(r["error"]) for r in recs).most_common())
        elif recs and "reference_missing" in recs[0]:
            what = f"{sum(1 for r in recs if not r['reference_missing'])} enriched with a reference version"
        table.add_row(topic, str(len(recs)), what)
    out.print(table)
    for topic, recs in results.items():
        if recs and "error" in recs[0] and "stage" in recs[0]:
            out.print(f"[bold]{topic}[/bold]: one whole example of each reason")
            examples = {}
            for r in recs:
                examples.setdefault(reason_code(r["error"]), r)
            for code, r in examples.items():
                out.print(f"  {code}: partition {r['partition']} offset {r['offset']}: {r['error']}",
                          highlight=False, soft_wrap=True)
    for topic in ("counts", "matches", "bins-final"):
        recs = results.get(topic) or []
        if recs:
            out.print(f"[bold]{topic}[/bold] (last 3):")
            for r in recs[-3:]:
                out.print(_short(r))


def reason_code(error: str) -> str:
    """A dead letter's reason in a few whole words, to group by: its stage and the first part of
    the message that says something once its details (quoted names, ``name=value``, numbers,
    parentheses) are taken out — ``decode: Avro body does not decode with schema``,
    ``validate: missing key field``, ``validate: absurd event time``."""
    stage, _, rest = error.partition(": ")
    for part in re.split(r"[:;]", re.sub(r"\(.*", "", rest)):
        words = re.sub(r"'[^']*'|\"[^\"]*\"|\S+=\S*|\d[\w.]*", " ", part)
        words = " ".join(words.split()).replace(" ,", ",").strip(" ,.")
        if words:
            return f"{stage}: {words}"
    return stage


def _short(rec: dict) -> str:
    keep = {k: v for k, v in rec.items() if k not in ("stages",)}
    if "stages" in rec:
        keep["stages"] = {s["stage"]: len(s["events"]) for s in rec["stages"]}
    return "  " + ", ".join(f"{k}={v}" for k, v in keep.items())


def _plots(results: dict[str, list[dict]], work: Path, out: Console, exact=None) -> None:
    if results.get("counts"):
        out.print(f"plot: {plot_counts(results['counts'], str(work / 'counts.png'), exact=exact)}")
    bins = (results.get("bins-updated") or []) + (results.get("bins-final") or [])
    if bins:
        out.print(f"plot: {plot_bins(bins, str(work / 'bins.png'))}")
