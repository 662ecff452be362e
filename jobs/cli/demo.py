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


@app.command()
def demo(port: Port = DEFAULT_PORT,
         keep: Annotated[bool, typer.Option(help="leave the broker running")] = False):
    """The whole pipeline end to end on the embedded stack: broker, topics, sample data, jobs, results."""
    from ctiflow.jobs.ops.demo import run_demo  # here: the demo runs jobs (pyspark, pandas) and plots
                                                # (matplotlib)

    run_demo(port=port, keep_broker=keep, console=console, out=out)
