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
    """The records of the rules topic: each version, when it takes effect, what the job did with
    it — applied, adjusted to the CTI, refused and why, as its progress, late and dead-letter
    topics say; one it has not read yet as it will judge it — and which is current at --at (the
    job's own CTI decides for a running job: `ctiflow status` shows it)."""
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.rules import effective_ms, list_rules

    now = effective_ms(at, "--at")
    for name, judged in list_rules(load(job), operator, warn=_warn).items():
        table = Table(title=f"operator {name}: rules at {_when(now)}", title_justify="left")
        for column in ("rule", "version", "effective", "action", "job", "state", "comment"):
            table.add_column(column)
        for i, j in enumerate(judged):
            r = j.rule
            later = next((n for n in judged[i + 1:]
                          if n.rule.rule_id == r.rule_id and n.effective is not None), None)
            state = ("refused" if j.effective is None else
                     "scheduled" if j.effective > now else
                     "replaced" if later is not None and later.effective <= now else
                     "deleted" if r.action == "delete" else "current")
            table.add_row(escape(r.rule_id), str(r.version), _when(r.effective_time), r.action, _verdict(j),
                          state, escape(r.comment or ""))
        out.print(table if judged else f"operator {name}: no rules yet (ctiflow rules put …)")


def _verdict(j) -> str:
    """What the job did with a record (:class:`ctiflow.jobs.driver.rules.Judged`), for the table."""
    return escape({"applied": "applied", "pending": "not read yet",
                   "adjusted": f"adjusted to {_when(j.effective or 0)}", "refused": f"refused: {j.reason}",
                   "refusable": f"not read yet; it will refuse it: {j.reason}"}[j.judged])


@app.command("test")
def test(definition: Annotated[Path, typer.Argument(help="RULE.yaml (a pattern as in a job file) or RULE.sql "
                                                         "(a MATCH_RECOGNIZE query)")],
         job: Job,
         start: Annotated[str, typer.Option(
             "--from", help="the range's start (event time): epoch ms or an ISO date-time (UTC unless it "
                            "says)")],
         end: Annotated[str, typer.Option("--to", help="the range's end, not included")],
         operator: Operator = None,
         rule_id: Annotated[Optional[str], typer.Option(
             "--id", help="the rule's id (default: the file's name without its suffix): --against current "
                          "compares with this id's versions")] = None,
         against: Annotated[str, typer.Option(
             help="compare with: current (the rule's versions in effect over the range), ID@VERSION, or none")
         ] = "current",
         out_file: Annotated[Optional[Path], typer.Option(
             "--out", help="write the candidate's records here as JSON lines (each with its diff: added or "
                           "unchanged), then the removed ones")] = None,
         show: Annotated[int, typer.Option(help="show the first N records and top N keys", min=0)] = 5):
    """Try a rule on history before it goes live: run it over the job's events with event time in
    [--from, --to) as the job would have (put at --from, deleted at --to, runs in flight drained), in a
    run of its own (nothing is written to the job's topics, checkpoint or rules topic), and compare its
    matches with the version in effect."""
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.rule_trial import try_rule

    trial = try_rule(load(job), read_text(definition), start=start, end=end, operator=operator,
                     rule_id=rule_id or definition.stem, against=against, warn=_warn)
    _show_trial(trial, show)
    if out_file is not None:
        _write_trial(trial, out_file)
        out.print(f"records written to {escape(str(out_file))}")


def _show_trial(trial, show: int) -> None:
    """The trial's tables (``ctiflow rules test``)."""
    out.print(f"rule {escape(trial.rule_id)!r} of operator {escape(trial.operator)!r} over "
              f"[{_when(trial.start)}, {_when(trial.end)}): {trial.events_read:,} records read in "
              f"{trial.seconds:.1f} s")
    summary = Table(title="what it would have alerted", title_justify="left")
    for column in ("", "matches", "timed-out runs"):
        summary.add_column(column, justify="right" if column else "left")
    summary.add_row("candidate", f"{len(trial.matches):,}", f"{len(trial.timed_out):,}")
    if trial.against is not None:
        summary.add_row(escape(f"against {trial.against}"), f"{len(trial.against_matches):,}",
                        f"{len(trial.against_timed_out):,}")
        summary.add_row("added (candidate only)", f"{len(trial.added):,}", "")
        summary.add_row("removed (against only)", f"{len(trial.removed):,}", "")
        summary.add_row("unchanged", f"{trial.unchanged:,}", "")
    out.print(summary)
    if show and trial.matches:
        keys = Table(title=f"top {show} keys", title_justify="left")
        keys.add_column("key")
        keys.add_column("matches", justify="right")
        for key, n in trial.per_key(show):
            keys.add_row(escape(key), f"{n:,}")
        out.print(keys)
    periods = trial.per_period()
    if periods:
        table = Table(title=f"matches per {trial.period} (of their last event)", title_justify="left")
        table.add_column(trial.period)
        table.add_column("matches", justify="right")
        for at, n in periods:
            table.add_row(_when(at), f"{n:,}")
        out.print(table)
    for title, records in (("first matches", trial.matches), ("added", trial.added if trial.against else []),
                           ("removed", trial.removed if trial.against else [])):
        if show and records:
            out.print(f"{title} (first {min(show, len(records))} of {len(records):,}):")
            for r in records[:show]:
                out.print(f"  {escape(_brief(r))}", highlight=False)


def _brief(record: dict) -> str:
    """A match record on one line: key, rule version, and its events' ids (or times) per stage — or
    its measures (the whole record: ``--out``)."""
    head = f"{record.get('key')} {record.get('rule_id')}@{record.get('rule_version')}"
    if "stages" in record:
        def named(e) -> str:
            return str(e.get("id", e.get("event_time"))) if isinstance(e, dict) else str(e)

        stages = " ".join(f"{s['stage']}=" + ",".join(map(named, s["events"])) for s in record["stages"])
        return f"{head} {_when(record['first_time'])} → {_when(record['last_time'])}  {stages}"
    return head + "  " + ", ".join(f"{m['name']}={m['value']}" for m in record.get("measures", []))


def _write_trial(trial, path: Path) -> None:
    """The candidate's records as JSON lines, each with ``diff`` (``added`` / ``unchanged``, None
    without a comparison; ``timed_out`` for its timed-out runs), then the ``removed`` ones."""
    import json

    added = {id(r) for r in trial.added}
    compared = trial.against is not None
    with path.open("w") as f:
        for r in trial.matches:
            diff = ("added" if id(r) in added else "unchanged") if compared else None
            f.write(json.dumps({**r, "diff": diff}, default=str) + "\n")
        for r in trial.timed_out:
            f.write(json.dumps({**r, "diff": "timed_out"}, default=str) + "\n")
        for r in trial.removed if compared else []:
            f.write(json.dumps({**r, "diff": "removed"}, default=str) + "\n")
