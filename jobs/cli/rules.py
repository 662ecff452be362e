"""``ctiflow rules put | list | rm``: a match operator's rules, written to and read from its rules
topic (docs/concepts/rules.md). What they check and write: :mod:`ctiflow.jobs.driver.rules`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ctiflow.jobs.cli.consoles import console, out
from ctiflow.jobs.cli.parameters import read_text

app = typer.Typer(help="A match operator's rules: patterns that take effect at an application time, while "
                       "the job runs (docs/concepts/rules.md).", no_args_is_help=True)

Job = Annotated[Path, typer.Option("--job", "-j", help="the job's YAML (its operator has a rules: section)")]
Operator = Annotated[Optional[str], typer.Option(
    "--operator", "-o", help="the match operator (default: the job's one operator with rules)")]
RuleId = Annotated[str, typer.Option("--id", help="the rule's id: versions of one id replace each other")]
Effective = Annotated[Optional[str], typer.Option(
    "--effective", "-e", help="application time it takes effect: epoch ms, ISO date-time (UTC unless it "
                              "says), or now (the default)")]


def _when(ms: int) -> str:
    from ctiflow.jobs.driver.rules import iso_time

    return iso_time(ms)


def _warn(message: str) -> None:
    """A record of the rules topic that is not a rule (skipped, as the job dead-letters it)."""
    console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False)


@app.command("put")
def put(definition: Annotated[Path, typer.Argument(help="RULE.yaml (a pattern as in a job file) or RULE.sql "
                                                        "(a MATCH_RECOGNIZE query)")],
        job: Job, rule_id: RuleId, operator: Operator = None, effective: Effective = None,
        version: Annotated[Optional[int], typer.Option(help="the version (default: the topic's last + 1); "
                                                            "refused unless newer")] = None,
        comment: Annotated[Optional[str], typer.Option(help="why (kept with the version)")] = None):
    """Check a rule against the job as the job will, then write it as the rule's next version.

    From its effective time the version judges the events (a run starts only on an event at or
    after it); the version before it stops starting runs then (on_change: drain) or is cut."""
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.rules import put_rule

    rule = put_rule(load(job), read_text(definition), rule_id=rule_id, operator=operator, effective=effective,
                    version=version, comment=comment, warn=_warn)
    out.print(f"rule {escape(rule.rule_id)!r} version {rule.version} of operator {escape(rule.operator)!r}: "
              f"takes effect at {rule.effective_time} ({_when(rule.effective_time)})")


@app.command("rm")
def rm(job: Job, rule_id: RuleId, operator: Operator = None, effective: Effective = None,
       comment: Annotated[Optional[str], typer.Option(help="why")] = None):
    """Delete a rule from an application time on: a delete version (its runs in flight drain or are cut)."""
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.rules import delete_rule

    rule = delete_rule(load(job), rule_id, effective=effective, operator=operator, comment=comment,
                       warn=_warn)
    out.print(f"rule {escape(rule.rule_id)!r} deleted at {rule.effective_time} "
              f"({_when(rule.effective_time)}): version {rule.version}")


@app.command("list")
def list_(job: Job, operator: Operator = None,
          at: Annotated[Optional[str], typer.Option(
              help="which versions are current at this time (default: now)")] = None):
    """The rules in the rules topic: each version, when it takes effect, and which is current at
    --at (the job's own CTI decides for a running job: `ctiflow status` shows it)."""
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.rules import effective_ms, list_rules

    now = effective_ms(at, "--at")
    for name, rules in list_rules(load(job), operator, warn=_warn).items():
        table = Table(title=f"operator {name}: rules at {_when(now)}", title_justify="left")
        for column in ("rule", "version", "effective", "action", "state", "comment"):
            table.add_column(column)
        for i, r in enumerate(rules):
            later = next((n for n in rules[i + 1:] if n.rule_id == r.rule_id), None)
            state = ("scheduled" if r.effective_time > now else
                     "replaced" if later is not None and later.effective_time <= now else
                     "deleted" if r.action == "delete" else "current")
            table.add_row(escape(r.rule_id), str(r.version), _when(r.effective_time), r.action, state,
                          escape(r.comment or ""))
        out.print(table if rules else f"operator {name}: no rules yet (ctiflow rules put …)")
