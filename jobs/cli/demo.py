"""``ctiflow demo`` (the whole pipeline on the embedded stack) and ``ctiflow demo-data``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ctiflow.jobs.cli.consoles import console, out
from ctiflow.jobs.cli.parameters import DEFAULT_PORT, Port
from ctiflow.jobs.testing import workload

app = typer.Typer()


@app.command("demo-data")
def demo_data(out_dir: Annotated[Path, typer.Option("--out")] = Path(".ctiflow/demo"),
              transactions: int = 20000, flows: int = 3000, seed: int = 7):
    """Write the sample workloads (JSON lines) the demo produces."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tx = workload.transactions(transactions, accounts=500, seed=seed, late_fraction=0.002)
    workload.write_jsonl(tx, out_dir / "transactions.jsonl")
    accounts = workload.accounts(accounts=500, seed=seed, start_ms=min(t["event_time"] for t in tx) - 60_000)
    workload.write_jsonl(accounts, out_dir / "accounts.jsonl")
    workload.write_jsonl(workload.flows(flows, devices=20, seed=seed, rate_per_s=2.0, late_fraction=0.02),
                         out_dir / "flows.jsonl")
    out.print(f"wrote {out_dir}/transactions.jsonl, accounts.jsonl, flows.jsonl")


@app.command("demo-rules")
def demo_rules(job: Annotated[Path, typer.Option("--job", "-j", help="the demo's transactions job")],
               transactions: Annotated[Path, typer.Option(help="the workload demo-data wrote (its times "
                                                                    "place the versions)")]):
    """Put the demo's rule 'large' — two versions, the threshold lowered mid-stream
    (docs/concepts/rules.md) — unless the job's rules topic holds it already (the compose demo)."""
    import json

    from ctiflow.jobs.cli.parameters import InputError, decode_line, not_utf8, open_lines
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.ops.demo import put_demo_rules

    name, lines = open_lines(str(transactions))
    tx = []
    with lines:
        for number, raw in enumerate(lines, 1):
            try:
                text = decode_line(raw, number)
                if text.strip():
                    tx.append(json.loads(text))
            except UnicodeDecodeError as exc:
                raise InputError(f"--transactions {name}, line {number}: {not_utf8(exc)}") from None
            except json.JSONDecodeError as exc:
                raise InputError(f"--transactions {name}, line {number}: not JSON ({exc.msg}); give the "
                                 "file `ctiflow demo-data` wrote") from None
    put_demo_rules(load(job), tx, out, if_absent=True)


@app.command()
def demo(port: Port = DEFAULT_PORT,
         keep: Annotated[bool, typer.Option(help="leave the broker running")] = False):
    """The whole pipeline end to end on the embedded stack: broker, topics, sample data, jobs, results."""
    from ctiflow.jobs.ops.demo import run_demo  # here: the demo runs jobs (pyspark, pandas) and plots
                                                # (matplotlib)

    run_demo(port=port, keep_broker=keep, console=console, out=out)
