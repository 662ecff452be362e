"""``ctiflow``: the command line for everything a user does with the platform.

One module per group of commands, each command thin: it parses its parameters, calls the
library (:mod:`ctiflow.jobs.ops.stack`, :mod:`ctiflow.jobs.datapath.kafka`,
:mod:`ctiflow.jobs.driver.pipeline`, …) and prints. The root :data:`app` lists them in the order of
the help; :func:`main` is the ``ctiflow`` entry point.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

import typer
from rich.markup import escape

from ctiflow.jobs.cli import (bench, conformance, demo, plot, recognize, records, rules, run, schemas, stack,
                              status, topics)
from ctiflow.jobs.cli.consoles import console
from ctiflow.jobs.cli.parameters import not_utf8
from ctiflow.jobs.driver.config import home
from ctiflow.jobs.datapath.kafka import env_credentials, redact
from ctiflow.operators.errors import CtiflowError

app = typer.Typer(
    no_args_is_help=True, add_completion=False,
    help="Avro-typed Kafka topics → PySpark Structured Streaming with CTIs: counts, matches, bins.")
app.add_typer(stack.app)
app.add_typer(records.app)
app.add_typer(run.app)
app.add_typer(status.app)
app.add_typer(recognize.app)
app.add_typer(demo.app)
app.add_typer(bench.app)
app.add_typer(topics.app, name="topics")
app.add_typer(schemas.app, name="schemas")
app.add_typer(plot.app, name="plot")
app.add_typer(conformance.app, name="conformance")
app.add_typer(rules.app, name="rules")
app.add_typer(stack.users_app, name="users")


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def _message(exc: Exception) -> str:
    """An error of the input or the environment as one line: a file's, with its name first."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, UnicodeDecodeError):
        return not_utf8(exc)
    return str(exc)


def _bug_report(exc: Exception) -> Path:
    """The traceback of ``exc`` (secrets redacted) in ``$CTIFLOW_HOME/logs/ctiflow-bug-<time>-<pid>.log``."""
    logs = home() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"ctiflow-bug-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    text = "".join(traceback.format_exception(exc))
    path.write_text(f"ctiflow {' '.join(sys.argv[1:])}\n{redact(text, env_credentials())}")
    return path


def main() -> None:
    """Entry point of ``ctiflow``: :func:`guarded` runs the command line."""
    guarded(app)


def guarded(command) -> None:
    """Run ``command()`` as ``ctiflow`` runs a command (also the spark-submit entry point,
    :mod:`ctiflow.jobs.cli.entry`): one clear line for our errors and for a file or an endpoint that
    cannot be used (``OSError``: missing, a folder, not writable, refused; text that is not
    UTF-8), everything started is stopped on Ctrl-C. Anything else is a bug: its traceback stays."""
    signal.signal(signal.SIGTERM, _interrupt)  # `docker compose stop`, `kill`: as Ctrl-C
    try:
        command()
    except (CtiflowError, OSError, UnicodeDecodeError) as exc:
        console.print(f"[red]error:[/red] {escape(redact(_message(exc), env_credentials()))}",
                      highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("interrupted; stopped what this command started")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - a bug of ours: loud, its traceback kept in a file
        log = _bug_report(exc)
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        what = redact(f"a bug in ctiflow: {type(exc).__name__}: {first[:300]}", env_credentials())
        console.print(f"[red]error:[/red] {escape(what)} — the whole error and its traceback are in "
                      f"{escape(str(log))}; please report it", highlight=False)
        sys.exit(1)
