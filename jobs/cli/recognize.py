"""``ctiflow recognize``: a ``MATCH_RECOGNIZE`` query over a JSON-lines file, before deploying it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ctiflow.jobs.cli.consoles import console
from ctiflow.jobs.cli.parameters import InputError, decode_line, not_utf8, open_lines, read_text

app = typer.Typer()


def to_json(row: dict) -> str:
    """One output row as JSON: timestamps as SQL TIMESTAMP(3) text, columns in output order."""
    from ctiflow.operators.cep.expr.vocabulary import Timestamp

    return json.dumps({k: str(v) if isinstance(v, Timestamp) else v for k, v in row.items()},
                      ensure_ascii=False)


@app.command()
def recognize(query: Annotated[Path, typer.Option(
                  "--query", "-q", help="a file with SELECT * FROM t MATCH_RECOGNIZE (…)")],
              events: Annotated[Path, typer.Option(
                  "--events", "-e", help="JSON lines: one row per line, fields = columns")],
              timestamp: Annotated[Optional[list[str]], typer.Option(
                  "--timestamp", help="a column of epoch milliseconds that is a TIMESTAMP(3) (repeatable; "
                                      "otherwise an integer column is a BIGINT)")] = None):
    """Run a MATCH_RECOGNIZE query over a JSON-lines file and print one JSON object per output row.

    Rows are ordered by the ORDER BY columns (the first is the time: epoch milliseconds, a BIGINT
    unless --timestamp names it, or ISO timestamps, a TIMESTAMP), ties in file order; the end of the
    file closes every WITHIN. The output rows are the partition columns and the measures, in
    emission order. A row a DEFINE fails on is refused (listed on standard error) and the others
    matched as if it had not come."""
    from ctiflow.operators.cep.sql.translate import recognize as run
    from ctiflow.operators.cep.expr.vocabulary import SqlError

    text = read_text(query)
    rows, lines = [], []
    name, stream = open_lines(str(events))
    with stream:
        for number, raw in enumerate(stream, 1):
            try:
                line = decode_line(raw, number)
            except UnicodeDecodeError as exc:
                raise InputError(f"{name}:{number}: {not_utf8(exc)}") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{name}:{number}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise InputError(f"{name}:{number}: a row must be a JSON object")
            rows.append(row)
            lines.append(number)
    refused: list[tuple[int, str]] = []
    try:
        out = run(text, rows, refused, types={c: "timestamp" for c in timestamp or ()})
    except SqlError as exc:
        console.print(f"[red]error:[/red] {escape(f'{query}: {exc.render() if exc.text else exc}')}",
                      highlight=False)
        raise typer.Exit(2) from None
    for row in out:
        print(to_json(row))
    sys.stdout.flush()  # the results before the messages about them
    for number, reason in refused:  # as a job dead-letters them: the rest is matched without them
        console.print(f"[yellow]refused:[/yellow] {escape(f'{events}:{lines[number - 1]}: {reason}')}",
                      highlight=False)
    if refused:
        console.print(f"{len(refused)} row(s) refused; the others were matched as if they had not come",
                      highlight=False)
